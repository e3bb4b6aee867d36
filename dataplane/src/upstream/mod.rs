//! Upstreams: what a request is sent to once its route is known, and how.
//!
//! ```text
//! request path ─┬─ h1_client::H1Forward (http) ───┐
//!               ├─ protocol::proxy (https, grpc,  ├─▶ attempt::run: endpoint choice, retries,
//!               │   grpcs)                        │   budget and deadline, passive health
//!               └─ websocket::upgrade ────────────┘
//! one attempt:  http  ─▶ Pool ─▶ h1_client (sluice_io::h1 over TCP)
//!               https ─▶ TCP + TLS ─ALPN─┬─ http/1.1 ─▶ Pool<TlsIo> ─▶ h1_client (over TLS)
//!                                        └─ h2 ─▶ h2 (hyper)
//!               grpc, grpcs ─▶ h2 (hyper);   upgrade ─▶ websocket (own connection, spliced)
//! ```
//!
//! - This file: compiled upstreams (endpoints, smooth weighted round robin) and the
//!   per-endpoint keep-alive HTTP/1.1 connection pools (plain, or TLS) that survive
//!   snapshot swaps.
//! - [`attempt`]: the one attempt loop of every protocol: endpoint choice, retries, the
//!   retry budget and deadline, passive health.
//! - [`h1_client`]: the HTTP/1.1 client over [`h1`] (the `sluice-io` crate's codec and
//!   connection), plain or TLS, and the plain `http` path.
//! - [`protocol`]: upstreams that are not plain `http` (`https`, `grpc`, `grpcs`): their
//!   endpoint connections, the connect phase (TLS, ALPN) and their attempts; [`h2`]:
//!   hyper's HTTP/2 client; [`websocket`]: upgrades.
//! - [`balancer`]: load-balancing policies (round robin, consistent hash, least_conn, ewma).
//! - [`health`]: active and passive health checks.
//! - [`tls`]: TLS and mTLS to upstreams; [`dns`]: endpoints named by host name.
//! - [`body`]: the response body type that streams downstream; [`error`]: what can stop a
//!   request from being proxied.
//!
//! Nothing here imports the router, the plugins, the configuration or the request path.

pub mod attempt;
pub mod balancer;
pub mod body;
pub mod dns;
pub mod error;
/// The in-task HTTP/1.1 codec and connection, `sluice_io::h1` (also named by this path in
/// the plugins).
pub use sluice_io::h1;
pub mod h1_client;
pub mod h2;
pub mod health;
pub mod protocol;
pub mod request_body;
pub mod tls;
pub mod websocket;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use http::HeaderValue;
use prometheus::IntCounter;
use sluice_proto::v1;
use tokio::net::TcpStream;

use crate::upstream::balancer::{HashSource, Policy, Tried};
use crate::upstream::error::ProxyError;
use crate::upstream::health::{
    Checker, EndpointState, HealthConfig, HealthRegistry, InFlight, Outcome, Rules,
};
use sluice_io::h1::{Conn, Transport};
use sluice_io::wbatch::BatchedStream;

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

    /// Length of one full cycle.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether the cycle is empty (never: `new` returns `None` instead).
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
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

/// The connect timeout of an upstream that sets none: 5 s, as Envoy and Istio (APISIX: 60
/// s, so a request to a pod that was just deleted, whose address no longer answers, waited
/// a minute before its retry).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl Default for Timeouts {
    /// Send and read 60 s, as APISIX; connect [`DEFAULT_CONNECT_TIMEOUT`].
    fn default() -> Self {
        let d = Duration::from_secs(60);
        Timeouts {
            connect: DEFAULT_CONNECT_TIMEOUT,
            send: d,
            read: d,
        }
    }
}

/// One endpoint of an upstream with its connection pool and health state.
#[derive(Debug)]
pub struct Endpoint {
    /// `host:port` as configured.
    pub address: String,
    /// Relative weight.
    pub weight: u32,
    /// Keep-alive connections to this endpoint.
    pub pool: Arc<Pool>,
    /// Health, in-flight count and latency, shared across snapshots.
    pub state: Arc<EndpointState>,
    /// Host header for `pass_host: node`.
    node_host: Option<HeaderValue>,
}

/// Which Host header the upstream receives.
#[derive(Debug, Clone)]
enum HostHeader {
    /// The client's.
    Pass,
    /// The endpoint's address.
    Node,
    /// A fixed value.
    Rewrite(HeaderValue),
}

/// Why an upstream of a snapshot cannot be compiled.
#[derive(Debug, thiserror::Error)]
#[error("upstream {upstream}: {field}: {reason}")]
pub struct InvalidUpstream {
    /// Upstream id.
    pub upstream: String,
    /// Offending field.
    pub field: String,
    /// What is wrong.
    pub reason: String,
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
    /// Retries to other endpoints; `None` = number of endpoints - 1.
    pub retries: Option<u32>,
    /// APISIX `retry_timeout`: no retry starts later than this after the first attempt
    /// started; `None` = connect + read timeout counted from the first failure.
    pub retry_timeout: Option<Duration>,
    policy: Policy,
    weights: Vec<u32>,
    states: Vec<Arc<EndpointState>>,
    host: HostHeader,
    passive: Option<Rules>,
    /// Keeps the active checker running while this upstream is served.
    _checker: Option<Arc<Checker>>,
    retries_total: prometheus::IntCounterVec,
    /// How to speak to the endpoints when the scheme is not plain `http` (see
    /// [`crate::upstream::protocol`]); `None` = HTTP/1.1 over TCP.
    pub protocol: Option<Arc<crate::upstream::protocol::UpstreamProtocol>>,
}

impl Upstream {
    /// Builds a round-robin upstream without health checks; pools come from `reg` so that
    /// connections survive swaps.
    pub fn new(
        id: String,
        endpoints: Vec<(String, u32)>,
        timeouts: Option<Timeouts>,
        reg: &PoolRegistry,
    ) -> Self {
        let up = v1::Upstream {
            id: id.clone(),
            ..Default::default()
        };
        Self::build(&up, endpoints, timeouts, None, reg)
    }

    fn build(
        up: &v1::Upstream,
        endpoints: Vec<(String, u32)>,
        timeouts: Option<Timeouts>,
        checks: Option<(HealthConfig, Option<HashSource>)>,
        reg: &PoolRegistry,
    ) -> Self {
        let id = up.id.clone();
        let host = match up.pass_host() {
            v1::UpstreamPassHost::Pass => HostHeader::Pass,
            v1::UpstreamPassHost::Node => HostHeader::Node,
            v1::UpstreamPassHost::Rewrite => match HeaderValue::from_str(&up.upstream_host) {
                Ok(v) => HostHeader::Rewrite(v),
                Err(_) => HostHeader::Pass,
            },
        };
        let endpoints: Vec<Endpoint> = endpoints
            .into_iter()
            .filter(|(_, w)| *w > 0)
            .map(|(address, weight)| Endpoint {
                pool: reg.get(&address),
                state: reg.health.state(&id, &address),
                node_host: node_host(&address),
                address,
                weight,
            })
            .collect();
        let weights: Vec<u32> = endpoints.iter().map(|e| e.weight).collect();
        let states: Vec<Arc<EndpointState>> =
            endpoints.iter().map(|e| Arc::clone(&e.state)).collect();
        let (health, source) = match checks {
            Some((h, s)) => (Some(h), s),
            None => (None, None),
        };
        let pairs: Vec<(&str, u32)> = endpoints
            .iter()
            .map(|e| (e.address.as_str(), e.weight))
            .collect();
        let policy = Policy::new(up.load_balancer(), source, &pairs);
        let checker = health.as_ref().and_then(|h| h.active.as_ref()).map(|a| {
            let eps = endpoints
                .iter()
                .map(|e| (e.address.clone(), Arc::clone(&e.state)))
                .collect();
            reg.health.checker(&id, a, eps)
        });
        Upstream {
            retries_total: reg.health.metrics.retries.clone(),
            id,
            endpoints,
            timeouts,
            retries: up.retries,
            retry_timeout: up
                .timeout
                .as_ref()
                .filter(|t| t.retry_timeout_ms > 0)
                .map(|t| Duration::from_millis(t.retry_timeout_ms)),
            policy,
            weights,
            states,
            host,
            passive: health.and_then(|h| h.passive),
            _checker: checker,
            protocol: None,
        }
    }

    /// The upstream with its non-HTTP/1.1 protocol settings.
    pub fn with_protocol(
        mut self,
        protocol: Option<crate::upstream::protocol::UpstreamProtocol>,
    ) -> Self {
        self.protocol = protocol.map(Arc::new);
        self
    }

    /// Compiles a snapshot upstream whose endpoints are already formatted as addresses.
    pub fn compile(
        up: &v1::Upstream,
        endpoints: Vec<(String, u32)>,
        timeouts: Option<Timeouts>,
        reg: &PoolRegistry,
    ) -> Result<Self, InvalidUpstream> {
        let invalid = |field: &str, reason: String| InvalidUpstream {
            upstream: up.id.clone(),
            field: field.to_owned(),
            reason,
        };
        let health = match &up.health_check {
            None => HealthConfig {
                active: None,
                passive: None,
            },
            Some(hc) => HealthConfig::from_proto(hc, up.tls.as_ref())
                .map_err(|e| invalid(e.field, e.reason))?,
        };
        let source = if up.load_balancer() == v1::LoadBalancer::Chash {
            Some(
                HashSource::from_proto(up.hash_on(), &up.hash_key)
                    .map_err(|r| invalid("hash_key", r))?,
            )
        } else {
            None
        };
        if up.pass_host() == v1::UpstreamPassHost::Rewrite
            && HeaderValue::from_str(&up.upstream_host)
                .ok()
                .filter(|v| !v.is_empty())
                .is_none()
        {
            return Err(invalid(
                "upstream_host",
                format!("{:?} is not a Host header value", up.upstream_host),
            ));
        }
        Ok(Self::build(
            up,
            endpoints,
            timeouts,
            Some((health, source)),
            reg,
        ))
    }

    /// What `chash` hashes on, if this upstream uses it.
    pub fn hash_source(&self) -> Option<&HashSource> {
        match &self.policy {
            Policy::Chash { source, .. } => Some(source),
            _ => None,
        }
    }

    /// The next endpoint for a request: healthy and not in `tried` first, then any untried
    /// one (all-unhealthy fallback).
    #[inline]
    pub fn pick_index(&self, hash: u64, tried: &Tried) -> Option<usize> {
        if self.endpoints.is_empty() {
            return None;
        }
        self.policy.pick(&self.states, &self.weights, hash, tried)
    }

    /// The next endpoint in the upstream's order, ignoring request hashes.
    #[inline]
    pub fn pick(&self) -> Option<&Endpoint> {
        let i = self.pick_index(0, &Tried::default())?;
        self.endpoints.get(i)
    }

    /// Whether the balancer uses response latencies (`ewma`).
    #[inline]
    pub fn measures_latency(&self) -> bool {
        matches!(self.policy, Policy::Ewma(_))
    }

    /// Whether the upstream has an active or passive health check (only those report
    /// `apisix_upstream_status`, as in APISIX).
    pub fn health_checked(&self) -> bool {
        self.passive.is_some() || self._checker.is_some()
    }

    /// Whether health checks have taken every endpoint out of the rotation.
    pub fn all_unhealthy(&self) -> bool {
        !self.states.is_empty() && self.states.iter().all(|s| !s.is_healthy())
    }

    /// How many other endpoints a failed request may be sent to.
    pub fn retry_budget(&self) -> usize {
        match self.retries {
            Some(r) => r as usize,
            None => self.endpoints.len().saturating_sub(1),
        }
    }

    /// Counts one retry, by why the attempt before it failed (`connect`, `connection_error`,
    /// `timeout`, `status`).
    pub fn count_retry(&self, reason: &str) {
        self.retries_total
            .with_label_values(&[self.id.as_str(), reason])
            .inc();
    }

    /// Feeds the outcome of a real request to the passive health check, if any.
    pub fn report(&self, endpoint: &Endpoint, outcome: Outcome) {
        if let Some(rules) = &self.passive {
            endpoint.state.report(rules, outcome);
        }
    }

    /// The Host header `endpoint` must receive, or `None` to pass the client's.
    #[inline]
    pub fn host_header<'a>(&'a self, endpoint: &'a Endpoint) -> Option<&'a HeaderValue> {
        match &self.host {
            HostHeader::Pass => None,
            HostHeader::Node => endpoint.node_host.as_ref(),
            HostHeader::Rewrite(v) => Some(v),
        }
    }
}

/// `host[:port]` of an address for `pass_host: node`; the port is left out when it is 80
/// or 443, as a browser would write the Host header.
fn node_host(address: &str) -> Option<HeaderValue> {
    let v = match address.rsplit_once(':') {
        Some((h, "80" | "443")) => h,
        _ => address,
    };
    HeaderValue::from_str(v).ok()
}

/// Keep-alive pool settings (APISIX's upstream `keepalive_pool`, which the ApisixUpstream
/// CRD does not carry: set per dataplane with flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Most idle connections kept per endpoint and worker. Default 320 (APISIX's
    /// `keepalive_pool.size`, which nginx also counts per worker).
    pub max_idle: usize,
    /// How long an idle connection is kept. Default 50 s: below the 60 s keep-alive timeout
    /// most servers use, so that Sluice closes first (APISIX: 60 s).
    pub idle_timeout: Duration,
    /// Most requests per connection before it is closed; 0 = unlimited. Default 1000
    /// (APISIX's `keepalive_pool.requests`).
    pub max_requests: u32,
    /// How often endpoint host names (externalNodes of type Domain, ExternalName Services)
    /// are resolved again. Default 30 s.
    pub dns_refresh: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_idle: 320,
            idle_timeout: Duration::from_secs(50),
            max_requests: 1000,
            dns_refresh: Duration::from_secs(30),
        }
    }
}

/// What outlives one snapshot: one pool per endpoint address (weakly held, so a pool that no
/// snapshot uses any more is dropped with its connections) and the endpoints' health state.
#[derive(Debug, Default)]
pub struct PoolRegistry {
    pools: Mutex<HashMap<String, Weak<Pool>>>,
    config: PoolConfig,
    /// Health state, active checkers and the upstream metric families.
    pub health: HealthRegistry,
    /// Connections of the endpoints of `https`, `grpc` and `grpcs` upstreams
    /// ([`crate::upstream::protocol`]).
    pub protocols: crate::upstream::protocol::ProtocolRegistry,
}

impl PoolRegistry {
    /// A registry whose pools use `config`.
    pub fn with_config(config: PoolConfig) -> Self {
        PoolRegistry {
            config,
            ..Default::default()
        }
    }

    /// The pool settings.
    pub fn config(&self) -> PoolConfig {
        self.config
    }

    /// The pool of `address`, shared with earlier snapshots when it still exists.
    pub fn get(&self, address: &str) -> Arc<Pool> {
        let mut pools = match self.pools.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(pool) = pools.get(address).and_then(Weak::upgrade) {
            return pool;
        }
        let m = &self.health.metrics.connections;
        let pool = Arc::new(Pool {
            address: address.to_owned(),
            idle: Mutex::new(Vec::new()),
            config: self.config,
            counters: Some((
                m.with_label_values(&[address, "true"]),
                m.with_label_values(&[address, "false"]),
                m.clone(),
            )),
            dns: dns::DomainAddrs::for_address(address),
        });
        if let Some(d) = &pool.dns
            && let Some(rt) = self.health.background()
        {
            rt.spawn(dns::refresh(Arc::downgrade(d), self.config.dns_refresh));
        }
        pools.insert(address.to_owned(), Arc::downgrade(&pool));
        pool
    }

    /// Forgets pools and health state that no snapshot holds any more.
    pub fn prune(&self) {
        if let Ok(mut pools) = self.pools.lock() {
            pools.retain(|_, p| p.strong_count() > 0);
        }
        self.protocols.prune();
        self.health.prune();
    }
}

/// One worker's idle connections to an endpoint, the most recently used last.
type IdleConns<S> = Vec<(Conn<S>, Instant, u32)>;

/// The stream of an HTTPS upstream connection that speaks HTTP/1.1: TLS over TCP, boxed so
/// that a connection (moved with every response body) stays small.
pub type TlsIo = Box<tokio_rustls::client::TlsStream<TcpStream>>;

/// Idle keep-alive HTTP/1.1 connections to one endpoint: over plain TCP (the default; made
/// by [`PoolRegistry::get`], which also dials them), or over TLS (`Pool<TlsIo>`, kept by
/// [`crate::upstream::protocol`] beside the endpoint's HTTP/2 connection, dialed there
/// because ALPN decides which of the two a new connection is).
#[derive(Debug)]
pub struct Pool<S = BatchedStream> {
    address: String,
    /// Idle connections per worker thread, with when they went idle and how many requests
    /// they served.
    ///
    /// NB: per worker, as nginx's `keepalive` is: a socket belongs to the reactor of the
    /// worker runtime that opened it. Handed to another worker it would be woken through
    /// that thread and fail once that worker has drained and stopped (a 502 during a
    /// graceful shutdown).
    idle: Mutex<Vec<(ThreadId, IdleConns<S>)>>,
    config: PoolConfig,
    /// `sluice_upstream_connections` of this address, reused and new, and the family to
    /// remove them from when the pool goes (plain pools only: the TLS pool of an address
    /// would share, and remove, the plain pool's series).
    counters: Option<(IntCounter, IntCounter, prometheus::IntCounterVec)>,
    /// Addresses of a host name endpoint, re-resolved in the background.
    dns: Option<Arc<dns::DomainAddrs>>,
}

impl<S> Drop for Pool<S> {
    fn drop(&mut self) {
        if let Some((_, _, metrics)) = &self.counters {
            let _ = metrics.remove_label_values(&[self.address.as_str(), "true"]);
            let _ = metrics.remove_label_values(&[self.address.as_str(), "false"]);
        }
    }
}

impl Pool<TlsIo> {
    /// An empty pool of TLS connections to `address`, which the caller dials.
    pub fn tls(address: &str, config: PoolConfig) -> Self {
        Pool {
            address: address.to_owned(),
            idle: Mutex::new(Vec::new()),
            config,
            counters: None,
            dns: None,
        }
    }
}

impl<S: Transport> Pool<S> {
    /// The endpoint address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Number of idle connections (for metrics and tests).
    pub fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .map(|i| i.iter().map(|(_, conns)| conns.len()).sum())
            .unwrap_or(0)
    }

    /// Drops every idle connection (graceful drain).
    pub fn close_idle(&self) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.clear();
        }
    }

    /// The most recently used idle connection of this worker, if it has not been idle for
    /// too long at `now` (read here when `None`).
    fn take_idle(&self, now: Option<Instant>) -> Option<(Conn<S>, u32)> {
        let me = std::thread::current().id();
        let mut idle = self.idle.lock().ok()?;
        let (_, idle) = idle.iter_mut().find(|(t, _)| *t == me)?;
        if idle.is_empty() {
            return None;
        }
        let now = now.unwrap_or_else(Instant::now);
        while let Some((conn, since, uses)) = idle.pop() {
            if now.saturating_duration_since(since) < self.config.idle_timeout {
                return Some((conn, uses));
            }
        }
        None
    }

    /// Keeps `conn` for reuse; returns when it went idle (`None`: it was closed instead).
    fn put_idle(&self, conn: Conn<S>, uses: u32) -> Option<Instant> {
        if self.config.max_requests > 0 && uses >= self.config.max_requests {
            return None;
        }
        let me = std::thread::current().id();
        let Ok(mut idle) = self.idle.lock() else {
            return None;
        };
        let at = match idle.iter().position(|(t, _)| *t == me) {
            Some(i) => i,
            None => {
                idle.push((me, Vec::new()));
                idle.len() - 1
            }
        };
        let (_, mine) = &mut idle[at];
        if mine.len() >= self.config.max_idle {
            return None;
        }
        let now = Instant::now();
        mine.push((conn, now, uses));
        Some(now)
    }

    /// The most recently used idle connection that passes the reuse guard, if any.
    ///
    /// An idle connection is used only when nothing is waiting to be read on it: no byte in
    /// its buffer and its stream not readable (the upstream closed it, or sent bytes no
    /// request asked for, which would otherwise be read as the next client's response).
    /// Such a connection is closed. The check costs no system call unless the reactor saw
    /// the socket become readable, as nginx's keepalive cache closes a connection on any
    /// read event while it is idle ([`Conn::idle_is_usable`]; over TLS, records that carry
    /// nothing for the connection, such as session tickets, are read and leave it usable).
    /// A connection the upstream closes between the check and the request stays possible:
    /// the caller retries a replayable request on a fresh connection (see
    /// [`sluice_io::h1::H1Error::is_stale_connection`]). `now`, when the caller has read the
    /// clock already, saves reading it again for the idle timeout.
    #[inline]
    pub fn checkout_idle(self: &Arc<Self>, now: Option<Instant>) -> Option<PooledConn<S>> {
        while let Some((mut conn, uses)) = self.take_idle(now) {
            if conn.idle_is_usable() {
                if let Some((reused, _, _)) = &self.counters {
                    reused.inc();
                }
                return Some(PooledConn {
                    conn,
                    pool: Arc::clone(self),
                    reused: true,
                    uses: uses + 1,
                    in_flight: None,
                });
            }
        }
        None
    }

    /// A connection the caller just made (for TLS: after its handshake).
    pub fn adopt(self: &Arc<Self>, conn: Conn<S>) -> PooledConn<S> {
        if let Some((_, new, _)) = &self.counters {
            new.inc();
        }
        PooledConn {
            conn,
            pool: Arc::clone(self),
            reused: false,
            uses: 1,
            in_flight: None,
        }
    }
}

impl Pool {
    /// A connection for one request: the most recently used idle one that passes the reuse
    /// guard ([`Pool::checkout_idle`]), or a new one.
    pub async fn checkout(
        self: &Arc<Self>,
        connect_timeout: Duration,
        now: Option<Instant>,
    ) -> Result<PooledConn, ProxyError> {
        if let Some(pooled) = self.checkout_idle(now) {
            return Ok(pooled);
        }
        self.connect(connect_timeout).await
    }

    /// A new connection.
    pub async fn connect(
        self: &Arc<Self>,
        connect_timeout: Duration,
    ) -> Result<PooledConn, ProxyError> {
        let addr = self.address.clone();
        let stream = match tokio::time::timeout(connect_timeout, self.connect_tcp()).await {
            Err(_) => return Err(ProxyError::ConnectTimeout(addr)),
            Ok(Err(source)) => return Err(ProxyError::Connect { addr, source }),
            Ok(Ok(s)) => s,
        };
        let _ = stream.set_nodelay(true);
        Ok(self.adopt(Conn::new(stream)))
    }

    /// A new TCP connection to this endpoint, not pooled (a stream route's), within
    /// `connect_timeout`.
    pub async fn connect_stream(&self, connect_timeout: Duration) -> Result<TcpStream, ProxyError> {
        let addr = self.address.clone();
        match tokio::time::timeout(connect_timeout, self.connect_tcp()).await {
            Err(_) => Err(ProxyError::ConnectTimeout(addr)),
            Ok(Err(source)) => Err(ProxyError::Connect { addr, source }),
            Ok(Ok(s)) => Ok(s),
        }
    }

    async fn connect_tcp(&self) -> std::io::Result<TcpStream> {
        if let Ok(sa) = self.address.parse::<SocketAddr>() {
            return TcpStream::connect(sa).await;
        }
        match self.dns.as_ref().and_then(|d| d.next()) {
            Some(sa) => TcpStream::connect(sa).await,
            // NB: only until the first background resolution has finished.
            None => TcpStream::connect(self.address.as_str()).await,
        }
    }
}

/// A connection checked out of a pool for one request.
#[derive(Debug)]
pub struct PooledConn<S = BatchedStream> {
    /// The connection.
    pub conn: Conn<S>,
    pool: Arc<Pool<S>>,
    /// Whether it served a request before (and so may have been closed by the upstream).
    pub reused: bool,
    /// Requests this connection carried, this one included.
    uses: u32,
    /// Keeps the endpoint's in-flight count up until the response has been read.
    in_flight: Option<InFlight>,
}

impl<S: Transport> PooledConn<S> {
    /// Hands the connection back for reuse (after its response was read to the end).
    /// Returns the time it did (`None`: the connection was closed instead, the clock not
    /// read), which serves the caller as the time the response ended.
    ///
    /// NB: a connection with bytes left in its buffer after the response's end (a second
    /// response, a body after HEAD/204/304, bytes after the last chunk) is closed: those
    /// bytes answer no request, and reused they would be read as another client's response.
    pub fn release(self) -> Option<Instant> {
        if self.conn.has_buffered() {
            return None;
        }
        self.pool.put_idle(self.conn, self.uses)
    }

    /// The endpoint address.
    pub fn address(&self) -> &str {
        &self.pool.address
    }

    /// Counts the request as in flight to its endpoint until the response is read.
    pub fn hold(&mut self, in_flight: InFlight) {
        self.in_flight = Some(in_flight);
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

    /// The address of a server that accepts and keeps every connection open.
    fn holding_server() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let mut open = Vec::new();
            for s in listener.incoming() {
                open.push(s);
            }
        });
        addr
    }

    #[test]
    fn idle_connections_are_reused_only_by_the_worker_that_opened_them() {
        let reg = PoolRegistry::default();
        let pool = reg.get(&holding_server());
        // One current-thread runtime per worker, as `sluice-dataplane --workers 2` runs.
        let worker = |pool: Arc<Pool>| {
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let first = pool.checkout(Duration::from_secs(5), None).await.unwrap();
                    let reused_first = first.reused;
                    first.release();
                    let second = pool.checkout(Duration::from_secs(5), None).await.unwrap();
                    let reused_second = second.reused;
                    second.release();
                    (reused_first, reused_second)
                })
            })
            .join()
            .unwrap()
        };
        assert_eq!(worker(Arc::clone(&pool)), (false, true));
        assert_eq!(pool.idle_count(), 1);
        // Another worker does not get the first one's connection (its runtime is gone).
        assert_eq!(worker(Arc::clone(&pool)), (false, true));
        assert_eq!(pool.idle_count(), 2);
    }

    #[test]
    fn the_callers_clock_reading_decides_the_idle_timeout() {
        let reg = PoolRegistry::default();
        let pool = reg.get(&holding_server());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let connect = Duration::from_secs(5);
            let first = pool.checkout(connect, None).await.unwrap();
            // The time it went idle comes back (the response's end for the log phase).
            let idle_at = first.release().expect("kept for reuse");
            // A reading past the idle timeout finds it expired: a new connection.
            let late = idle_at + pool.config.idle_timeout + Duration::from_millis(1);
            let second = pool.checkout(connect, Some(late)).await.unwrap();
            assert!(!second.reused);
            let idle_at = second.release().expect("kept for reuse");
            // One within the timeout reuses it.
            let third = pool.checkout(connect, Some(idle_at)).await.unwrap();
            assert!(third.reused);
        });
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
