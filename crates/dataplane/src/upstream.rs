//! Compiled upstreams: endpoints, smooth weighted round robin, and per-endpoint keep-alive
//! connection pools that survive snapshot swaps.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use crate::error::ProxyError;
use crate::h1::Conn;

/// Most entries a precomputed weighted sequence may have; larger weight sums are scaled.
const MAX_SEQUENCE: u64 = 4096;

/// A precomputed smooth weighted round-robin order (the nginx algorithm), walked with one
/// atomic counter so that picking is lock-free and shared by all workers.
#[derive(Debug)]
pub struct WeightedSequence {
    order: Vec<u32>,
    next: AtomicUsize,
}

impl WeightedSequence {
    /// Builds the order for `weights`; zero weights never get picked. `None` when every
    /// weight is zero.
    pub fn new(weights: &[u32]) -> Option<Self> {
        let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
        if total == 0 {
            return None;
        }
        let g = weights.iter().fold(0u64, |g, w| gcd(g, u64::from(*w)));
        let len = (total / g).min(MAX_SEQUENCE) as usize;
        let mut current = vec![0i64; weights.len()];
        let mut order = Vec::with_capacity(len);
        for _ in 0..len {
            let mut best = 0usize;
            for (i, w) in weights.iter().enumerate() {
                current[i] += i64::from(*w);
                if current[i] > current[best] || weights[best] == 0 {
                    best = i;
                }
            }
            current[best] -= total as i64;
            order.push(best as u32);
        }
        Some(WeightedSequence {
            order,
            next: AtomicUsize::new(0),
        })
    }

    /// The next index in weighted order.
    #[inline]
    pub fn next(&self) -> usize {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.order[n % self.order.len()] as usize
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Timeouts that apply to one upstream exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Time to establish the TCP connection.
    pub connect: Duration,
    /// Time to write the request (applied together with `read` to the response head).
    pub send: Duration,
    /// Time to wait for the response head after the request was sent.
    pub read: Duration,
}

impl Default for Timeouts {
    /// 60 s each, as APISIX.
    fn default() -> Self {
        let d = Duration::from_secs(60);
        Timeouts {
            connect: d,
            send: d,
            read: d,
        }
    }
}

/// One endpoint of an upstream with its connection pool.
#[derive(Debug)]
pub struct Endpoint {
    /// `host:port` as configured.
    pub address: String,
    /// Relative weight.
    pub weight: u32,
    /// Keep-alive connections to this endpoint.
    pub pool: Arc<Pool>,
}

/// A compiled upstream.
#[derive(Debug)]
pub struct Upstream {
    /// Stable id from the snapshot.
    pub id: String,
    /// Endpoints with a non-zero weight.
    pub endpoints: Vec<Endpoint>,
    /// Upstream-level timeouts, overriding the route's when set.
    pub timeouts: Option<Timeouts>,
    /// How to speak to the endpoints when the scheme is not plain `http` (see
    /// [`crate::h2up`]); `None` = HTTP/1.1 over TCP.
    pub protocol: Option<Arc<crate::h2up::UpstreamProtocol>>,
    order: Option<WeightedSequence>,
}

impl Upstream {
    /// Builds an upstream; pools come from `pools` so that connections survive swaps.
    pub fn new(
        id: String,
        endpoints: Vec<(String, u32)>,
        timeouts: Option<Timeouts>,
        pools: &PoolRegistry,
    ) -> Self {
        let endpoints: Vec<Endpoint> = endpoints
            .into_iter()
            .filter(|(_, w)| *w > 0)
            .map(|(address, weight)| Endpoint {
                pool: pools.get(&address),
                address,
                weight,
            })
            .collect();
        let weights: Vec<u32> = endpoints.iter().map(|e| e.weight).collect();
        Upstream {
            id,
            order: WeightedSequence::new(&weights),
            endpoints,
            timeouts,
            protocol: None,
        }
    }

    /// The upstream with its non-HTTP/1.1 protocol settings.
    pub fn with_protocol(mut self, protocol: Option<crate::h2up::UpstreamProtocol>) -> Self {
        self.protocol = protocol.map(Arc::new);
        self
    }

    /// The next endpoint in smooth weighted round-robin order.
    #[inline]
    pub fn pick(&self) -> Option<&Endpoint> {
        let order = self.order.as_ref()?;
        self.endpoints.get(order.next())
    }
}

/// Keeps one pool per endpoint address alive across snapshots (weakly: a pool that no
/// snapshot uses any more is dropped with its connections).
#[derive(Debug, Default)]
pub struct PoolRegistry {
    pools: Mutex<HashMap<String, Weak<Pool>>>,
    /// Pools of HTTP/2 and TLS upstream connections ([`crate::h2up`]).
    pub hyper: crate::h2up::HyperRegistry,
}

impl PoolRegistry {
    /// The pool of `address`, shared with earlier snapshots when it still exists.
    pub fn get(&self, address: &str) -> Arc<Pool> {
        let mut pools = match self.pools.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(pool) = pools.get(address).and_then(Weak::upgrade) {
            return pool;
        }
        let pool = Arc::new(Pool::new(address.to_owned()));
        pools.insert(address.to_owned(), Arc::downgrade(&pool));
        pool
    }

    /// Forgets pools that no snapshot holds any more.
    pub fn prune(&self) {
        if let Ok(mut pools) = self.pools.lock() {
            pools.retain(|_, p| p.strong_count() > 0);
        }
        self.hyper.prune();
    }
}

/// How long an idle upstream connection is kept (below the 60 s keep-alive timeout that
/// most servers use, so that Sluice closes first).
const IDLE_TIMEOUT: Duration = Duration::from_secs(50);
/// Most idle connections kept per endpoint.
const MAX_IDLE: usize = 1024;

/// Idle keep-alive HTTP/1.1 connections to one endpoint.
#[derive(Debug)]
pub struct Pool {
    address: String,
    idle: Mutex<Vec<(Conn, Instant)>>,
}

impl Pool {
    fn new(address: String) -> Self {
        Pool {
            address,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The endpoint address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Number of idle connections (for metrics and tests).
    pub fn idle_count(&self) -> usize {
        self.idle.lock().map(|i| i.len()).unwrap_or(0)
    }

    fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().ok()?;
        while let Some((conn, since)) = idle.pop() {
            if since.elapsed() < IDLE_TIMEOUT {
                return Some(conn);
            }
        }
        None
    }

    fn put_idle(&self, conn: Conn) {
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE
        {
            idle.push((conn, Instant::now()));
        }
    }

    /// A connection for one request: the most recently used idle one, or a new one.
    ///
    /// With `check_idle`, an idle connection the upstream has closed is skipped; without it
    /// the caller must be ready to retry on a fresh connection (see
    /// [`crate::h1::H1Error::is_stale_connection`]).
    pub async fn checkout(
        self: &Arc<Self>,
        connect_timeout: Duration,
        check_idle: bool,
    ) -> Result<PooledConn, ProxyError> {
        while let Some(mut conn) = self.take_idle() {
            if !check_idle || conn.idle_is_usable() {
                return Ok(PooledConn {
                    conn,
                    pool: Arc::clone(self),
                    reused: true,
                });
            }
        }
        self.connect(connect_timeout).await
    }

    /// A new connection.
    pub async fn connect(
        self: &Arc<Self>,
        connect_timeout: Duration,
    ) -> Result<PooledConn, ProxyError> {
        let addr = self.address.clone();
        let stream = match tokio::time::timeout(connect_timeout, connect_tcp(&addr)).await {
            Err(_) => return Err(ProxyError::ConnectTimeout(addr)),
            Ok(Err(source)) => return Err(ProxyError::Connect { addr, source }),
            Ok(Ok(s)) => s,
        };
        let _ = stream.set_nodelay(true);
        Ok(PooledConn {
            conn: Conn::new(stream),
            pool: Arc::clone(self),
            reused: false,
        })
    }
}

async fn connect_tcp(addr: &str) -> std::io::Result<TcpStream> {
    match addr.parse::<SocketAddr>() {
        Ok(sa) => TcpStream::connect(sa).await,
        Err(_) => TcpStream::connect(addr).await,
    }
}

/// A connection checked out of a pool for one request.
#[derive(Debug)]
pub struct PooledConn {
    /// The connection.
    pub conn: Conn,
    pool: Arc<Pool>,
    /// Whether it served a request before (and so may have been closed by the upstream).
    pub reused: bool,
}

impl PooledConn {
    /// Hands the connection back for reuse (after its response was read to the end).
    pub fn release(self) {
        self.pool.put_idle(self.conn);
    }

    /// The endpoint address.
    pub fn address(&self) -> &str {
        &self.pool.address
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn counts(weights: &[u32], n: usize) -> Vec<usize> {
        let seq = WeightedSequence::new(weights).unwrap();
        let mut c = vec![0; weights.len()];
        for _ in 0..n {
            c[seq.next()] += 1;
        }
        c
    }

    #[test]
    fn smooth_weighted_round_robin_is_exact_over_a_cycle() {
        assert_eq!(counts(&[5, 1, 1], 7), vec![5, 1, 1]);
        assert_eq!(counts(&[100, 100], 10), vec![5, 5]);
        assert_eq!(counts(&[3, 0, 1], 400), vec![300, 0, 100]);
    }

    #[test]
    fn smooth_order_interleaves() {
        let seq = WeightedSequence::new(&[5, 1, 1]).unwrap();
        let order: Vec<usize> = (0..7).map(|_| seq.next()).collect();
        // nginx's smooth WRR: a a b a c a a — never five in a row.
        assert_eq!(order, vec![0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn all_zero_weights_pick_nothing() {
        assert!(WeightedSequence::new(&[0, 0]).is_none());
        let up = Upstream::new(
            "u".into(),
            vec![("127.0.0.1:1".into(), 0)],
            None,
            &PoolRegistry::default(),
        );
        assert!(up.pick().is_none());
    }

    #[test]
    fn pools_are_shared_by_address_across_snapshots() {
        let reg = PoolRegistry::default();
        let a = reg.get("127.0.0.1:80");
        let b = reg.get("127.0.0.1:80");
        assert!(Arc::ptr_eq(&a, &b));
        drop((a, b));
        reg.prune();
        assert!(reg.pools.lock().unwrap().is_empty());
    }
}
