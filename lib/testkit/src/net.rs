//! Loopback addresses for tests.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;

/// `127.0.0.1:0`: any free loopback port.
pub fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// An address on which nothing listens (a port bound and released at once).
pub fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A loopback port free to listen on, for a process the test is about to start (panics
/// when [`try_free_port`] finds none).
pub fn free_port() -> SocketAddr {
    try_free_port().unwrap()
}

/// A free loopback port for a process the test is about to start.
///
/// NB: the port comes from 21000-32767, below the kernel's ephemeral range (32768-60999),
/// not from binding port 0: a port handed out by the kernel and released again can be taken
/// by any outgoing connection before the process binds it. `scripts/cluster/testcluster.sh`
/// uses 10000-20999, so the two never race for one port.
pub fn try_free_port() -> std::io::Result<SocketAddr> {
    use std::hash::{BuildHasher, Hasher};
    const LOW: u64 = 21_000;
    const SPAN: u64 = 32_768 - LOW;
    let mut last = None;
    for attempt in 0..200u64 {
        // A fresh RandomState per call is seeded differently: enough randomness for ports.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(attempt ^ u64::from(std::process::id()));
        let port = u16::try_from(LOW + h.finish() % SPAN).unwrap_or(21_000);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        match std::net::TcpListener::bind(addr) {
            Ok(_) => return Ok(addr),
            Err(e) => last = Some(e),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("no free port in 21000-32767: {last:?}"),
    ))
}

/// Waits up to `limit` until something accepts connections on `addr` (a process the test
/// started is serving); whether it does.
pub async fn listening(addr: SocketAddr, limit: std::time::Duration) -> bool {
    crate::eventually_async(limit, || async move {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await
}

/// Waits up to `limit` until `addr` refuses connections (a listener closed, a drain
/// started); whether it does.
pub async fn refused(addr: SocketAddr, limit: std::time::Duration) -> bool {
    crate::eventually_async(limit, || async move {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await
}

/// [`listening`] for a thread outside any runtime.
pub fn listening_blocking(addr: SocketAddr, limit: std::time::Duration) -> bool {
    crate::eventually_blocking(limit, || std::net::TcpStream::connect(addr).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_is_below_the_ephemeral_range_and_can_be_bound() {
        let addr = free_port();
        assert!((21_000..32_768).contains(&addr.port()), "{addr}");
        std::net::TcpListener::bind(addr).unwrap();
        assert!(std::net::TcpStream::connect(closed_port()).is_err());
    }

    #[tokio::test]
    async fn listening_sees_a_listener_and_not_a_closed_port() {
        let l = tokio::net::TcpListener::bind(any()).await.unwrap();
        let short = std::time::Duration::from_millis(50);
        assert!(listening(l.local_addr().unwrap(), short).await);
        assert!(!listening(closed_port(), short).await);
        assert!(!listening_blocking(closed_port(), short));
        assert!(!refused(l.local_addr().unwrap(), short).await);
        assert!(refused(closed_port(), short).await);
    }
}
