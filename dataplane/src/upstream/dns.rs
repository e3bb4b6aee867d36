//! Host-name endpoints (externalNodes of type Domain, ExternalName Services): resolved in the
//! background and re-resolved every `dns_refresh`, so a request never waits for DNS once the
//! first resolution is done, and address changes are picked up without a new snapshot.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The current addresses of one `host:port` endpoint.
#[derive(Debug)]
pub struct DomainAddrs {
    /// `host:port` as configured.
    target: String,
    addrs: Mutex<Arc<Vec<SocketAddr>>>,
    next: AtomicUsize,
}

impl DomainAddrs {
    /// `Some` for a `host:port` whose host is a name, not an IP address.
    pub fn for_address(address: &str) -> Option<Arc<Self>> {
        if address.parse::<SocketAddr>().is_ok() {
            return None;
        }
        Some(Arc::new(DomainAddrs {
            target: address.to_owned(),
            addrs: Mutex::new(Arc::new(Vec::new())),
            next: AtomicUsize::new(0),
        }))
    }

    /// The next address to connect to (rotating over all of them); `None` before the first
    /// resolution succeeded.
    pub fn next(&self) -> Option<SocketAddr> {
        let addrs = self.current();
        if addrs.is_empty() {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        addrs.get(i % addrs.len()).copied()
    }

    /// The addresses known now.
    pub fn current(&self) -> Arc<Vec<SocketAddr>> {
        match self.addrs.lock() {
            Ok(a) => Arc::clone(&a),
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }

    async fn resolve(&self) {
        match tokio::net::lookup_host(self.target.as_str()).await {
            Ok(found) => {
                let mut v: Vec<SocketAddr> = found.collect();
                v.sort_unstable();
                v.dedup();
                if v.is_empty() {
                    tracing::warn!(endpoint = %self.target, "DNS returned no address; keeping the previous ones");
                    return;
                }
                let mut cur = match self.addrs.lock() {
                    Ok(a) => a,
                    Err(p) => p.into_inner(),
                };
                if **cur != v {
                    tracing::info!(endpoint = %self.target, addrs = ?v, "endpoint resolved");
                    *cur = Arc::new(v);
                }
            }
            // NB: a failed lookup keeps the last good addresses.
            Err(e) => tracing::warn!(endpoint = %self.target, error = %e, "DNS lookup failed"),
        }
    }
}

/// Resolves `addrs` now and then every `every`, until nothing holds it any more.
pub async fn refresh(addrs: Weak<DomainAddrs>, every: Duration) {
    loop {
        let Some(a) = addrs.upgrade() else {
            return;
        };
        a.resolve().await;
        drop(a);
        // Check back at least every second so a dropped pool ends its task promptly.
        let mut left = every.max(Duration::from_millis(100));
        while !left.is_zero() {
            let step = left.min(Duration::from_secs(1));
            tokio::time::sleep(step).await;
            left -= step;
            if addrs.strong_count() == 0 {
                return;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn localhost_resolves_in_the_background() {
        assert!(DomainAddrs::for_address("127.0.0.1:80").is_none());
        let d = DomainAddrs::for_address("localhost:8080").unwrap();
        assert!(d.next().is_none());
        d.resolve().await;
        let a = d.next().unwrap();
        assert!(a.ip().is_loopback());
        assert_eq!(a.port(), 8080);
    }
}
