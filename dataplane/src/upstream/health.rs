//! Endpoint health: passive checks fed by the outcomes of real requests, active probes run
//! as tokio tasks, and a registry that keeps each endpoint's state across snapshot swaps.
//!
//! State is keyed by `(upstream id, endpoint address)`, held weakly like the connection
//! pools: an endpoint that stays in the next snapshot keeps its health, counters, in-flight
//! count and latency average; one that leaves is forgotten. Active probes of an upstream run
//! in one task owned by a [`Checker`]; a new snapshot with the same check configuration and
//! the same endpoints keeps the running checker, anything else retires it and starts another.
//!
//! The thresholds follow APISIX (lua-resty-healthcheck): consecutive successes make an
//! unhealthy endpoint healthy, consecutive HTTP failures, TCP failures or timeouts make a
//! healthy one unhealthy, and a threshold of 0 never fires.
//!
//! Probes are a TCP connect (`tcp`) or an HTTP/1.1 `GET` (`http`), over TLS for `https`:
//! verified against the upstream's TLS settings (CA, client certificate) unless
//! `https_verify_certificate` is false, with the probe's `host` as SNI when set. A failed
//! handshake is a TCP failure.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts};
use sluice_proto::v1;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::upstream::tls::{Alpn, UpstreamTlsClient};
use sluice_io::lock;

/// What one request (or probe) to an endpoint came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A response head with this status arrived.
    Status(u16),
    /// The connection could not be made, or broke before a response.
    TcpFailure,
    /// The endpoint did not answer in time.
    Timeout,
}

/// One side of the thresholds, compiled.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Thresholds {
    /// Status codes that count on this side.
    pub codes: Vec<u16>,
    /// Consecutive successes to become healthy (0 = never).
    pub successes: u32,
    /// Consecutive HTTP failures to become unhealthy (0 = never).
    pub http_failures: u32,
    /// Consecutive TCP failures to become unhealthy (0 = never).
    pub tcp_failures: u32,
    /// Consecutive timeouts to become unhealthy (0 = never).
    pub timeouts: u32,
    /// Probe interval in this state (active checks).
    pub interval: Duration,
}

impl Thresholds {
    fn from_proto(t: Option<&v1::UpstreamHealthThresholds>) -> Self {
        let Some(t) = t else {
            return Thresholds::default();
        };
        Thresholds {
            codes: t
                .http_codes
                .iter()
                .filter_map(|c| u16::try_from(*c).ok())
                .collect(),
            successes: t.successes,
            http_failures: t.http_failures,
            tcp_failures: t.tcp_failures,
            timeouts: t.timeouts,
            interval: Duration::from_millis(t.interval_ms.max(1000)),
        }
    }
}

/// The healthy and unhealthy rules of one check (active or passive).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rules {
    /// When an endpoint becomes healthy.
    pub healthy: Thresholds,
    /// When an endpoint becomes unhealthy.
    pub unhealthy: Thresholds,
    /// Only TCP failures and timeouts count (`type: tcp`), not status codes.
    pub tcp_only: bool,
}

/// How active probes are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeKind {
    /// A TCP connect.
    Tcp,
    /// An HTTP/1.1 `GET` whose status is judged.
    Http {
        /// Request path.
        path: String,
        /// Host header; `None` = the endpoint's address.
        host: Option<String>,
        /// Extra request headers.
        headers: Vec<(String, String)>,
        /// TLS for `type: https` probes; `None` = plain HTTP.
        tls: Option<Box<ProbeTls>>,
    },
}

/// The TLS client of HTTPS probes, built once per snapshot from the upstream's TLS settings.
#[derive(Debug, Clone)]
pub struct ProbeTls {
    /// The client (CA, client certificate, SNI, verification as configured).
    pub client: Arc<UpstreamTlsClient>,
    /// What the client was built from, so that an unchanged configuration keeps its checker.
    settings: (Option<v1::UpstreamTls>, Option<String>, bool),
}

impl PartialEq for ProbeTls {
    fn eq(&self, other: &Self) -> bool {
        self.settings == other.settings
    }
}

impl Eq for ProbeTls {}

impl ProbeTls {
    /// The client for probes of an upstream with `tls` settings; `host` is the probe's Host
    /// (its name, without a port, is the SNI when set).
    fn new(
        tls: Option<&v1::UpstreamTls>,
        host: Option<&str>,
        verify: bool,
    ) -> Result<Self, InvalidHealthCheck> {
        let sni = host.map(|h| {
            let name = match h.rsplit_once(':') {
                // `[v6]:port` or `name:port`; a bare IPv6 address has several colons.
                Some((n, p)) if p.bytes().all(|b| b.is_ascii_digit()) && !n.ends_with(':') => n,
                _ => h,
            };
            name.trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned()
        });
        let client = UpstreamTlsClient::for_probes(tls, sni.as_deref(), verify).map_err(|e| {
            InvalidHealthCheck {
                field: "health_check.active.type",
                reason: format!("https probes cannot use the upstream's TLS settings: {e}"),
            }
        })?;
        Ok(ProbeTls {
            client: Arc::new(client),
            settings: (tls.cloned(), sni, verify),
        })
    }
}

/// Active check configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveConfig {
    /// Probe kind.
    pub kind: ProbeKind,
    /// Probe timeout.
    pub timeout: Duration,
    /// Most endpoints probed at once.
    pub concurrency: usize,
    /// Port to probe instead of the endpoint's.
    pub port: Option<u16>,
    /// Thresholds.
    pub rules: Rules,
}

/// A compiled `healthCheck`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    /// Active probes.
    pub active: Option<ActiveConfig>,
    /// Passive checks on real traffic.
    pub passive: Option<Rules>,
}

/// Why a health check configuration cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidHealthCheck {
    /// Field under `health_check`.
    pub field: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl HealthConfig {
    /// Compiles the snapshot form; `tls` is the upstream's TLS settings, used by `https`
    /// probes.
    pub fn from_proto(
        hc: &v1::UpstreamHealthCheck,
        tls: Option<&v1::UpstreamTls>,
    ) -> Result<Self, InvalidHealthCheck> {
        let active = match &hc.active {
            None => None,
            Some(a) => {
                let tcp = a.r#type() == v1::UpstreamHealthCheckType::Tcp;
                let https = a.r#type() == v1::UpstreamHealthCheckType::Https;
                let kind = if tcp {
                    ProbeKind::Tcp
                } else {
                    let path = if a.http_path.is_empty() {
                        "/".to_owned()
                    } else {
                        a.http_path.clone()
                    };
                    if !path.starts_with('/') || path.bytes().any(|b| b <= b' ') {
                        return Err(InvalidHealthCheck {
                            field: "health_check.active.http_path",
                            reason: format!("{path:?} is not a path"),
                        });
                    }
                    let host = (!a.host.is_empty()).then(|| a.host.clone());
                    let tls = if https {
                        Some(Box::new(ProbeTls::new(
                            tls,
                            host.as_deref(),
                            a.https_verify_certificate.unwrap_or(true),
                        )?))
                    } else {
                        None
                    };
                    ProbeKind::Http {
                        path,
                        host,
                        headers: a
                            .request_headers
                            .iter()
                            .map(|h| (h.name.clone(), h.value.clone()))
                            .collect(),
                        tls,
                    }
                };
                Some(ActiveConfig {
                    kind,
                    timeout: Duration::from_millis(a.timeout_ms.max(1)),
                    concurrency: (a.concurrency as usize).max(1),
                    port: u16::try_from(a.port).ok().filter(|p| *p != 0),
                    rules: Rules {
                        healthy: Thresholds::from_proto(a.healthy.as_ref()),
                        unhealthy: Thresholds::from_proto(a.unhealthy.as_ref()),
                        tcp_only: tcp,
                    },
                })
            }
        };
        let passive = hc.passive.as_ref().map(|p| Rules {
            healthy: Thresholds::from_proto(p.healthy.as_ref()),
            unhealthy: Thresholds::from_proto(p.unhealthy.as_ref()),
            tcp_only: p.r#type() == v1::UpstreamHealthCheckType::Tcp,
        });
        Ok(HealthConfig { active, passive })
    }
}

#[derive(Debug, Default)]
struct Counters {
    successes: u32,
    http_failures: u32,
    tcp_failures: u32,
    timeouts: u32,
}

/// Exponentially weighted moving average of response latency, decaying with time.
#[derive(Debug)]
struct Ewma {
    value_us: f64,
    stamp: Option<Instant>,
}

/// Time constant of the latency average.
const EWMA_TAU: Duration = Duration::from_secs(10);

/// Live state of one endpoint of one upstream, shared by every snapshot that has it.
#[derive(Debug)]
pub struct EndpointState {
    upstream: String,
    address: String,
    healthy: AtomicBool,
    /// Out of the rotation after failed connects until this instant (milliseconds since
    /// [`epoch`]); 0 = not ejected. See [`EndpointState::connect_failed`].
    ejected_until: AtomicU64,
    /// Connect failures in a row (each doubles the ejection).
    connect_failures: AtomicU32,
    counters: Mutex<Counters>,
    ewma: Mutex<Ewma>,
    /// Requests in flight to this endpoint (for `least_conn`, `ewma` and the metric).
    inflight: IntGauge,
    healthy_gauge: IntGauge,
    metrics: UpstreamMetrics,
}

impl Drop for EndpointState {
    fn drop(&mut self) {
        let labels = [self.upstream.as_str(), self.address.as_str()];
        let _ = self.metrics.endpoint_healthy.remove_label_values(&labels);
        let _ = self.metrics.in_flight.remove_label_values(&labels);
    }
}

/// First ejection after a failed connect; each failure in a row doubles it, up to
/// [`MAX_EJECTION`].
pub const EJECTION: Duration = Duration::from_secs(5);
/// Longest ejection after failed connects.
pub const MAX_EJECTION: Duration = Duration::from_secs(160);

/// The clock of ejections: a process-wide start.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl EndpointState {
    /// Whether the endpoint is in the rotation (its health checks).
    #[inline]
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Whether the balancer should pick it: healthy and not ejected after a failed
    /// connect. (When no endpoint is, the balancer picks among all: see
    /// `balancer::Policy::pick`.)
    #[inline]
    pub fn is_available(&self) -> bool {
        self.is_healthy() && {
            let until = self.ejected_until.load(Ordering::Relaxed);
            until == 0 || now_ms() >= until
        }
    }

    /// A connect to the endpoint failed (refused, unreachable, timed out): it leaves the
    /// rotation at once, with or without health checks, for [`EJECTION`], doubled for each
    /// failure in a row (a deleted pod whose address no longer answers costs one request
    /// one connect timeout, not every request until its EndpointSlice changes).
    pub fn connect_failed(&self) {
        let n = self.connect_failures.fetch_add(1, Ordering::Relaxed).min(5);
        let ejection = (EJECTION * (1u32 << n)).min(MAX_EJECTION);
        let until = now_ms().saturating_add(u64::try_from(ejection.as_millis()).unwrap_or(0));
        self.ejected_until.store(until.max(1), Ordering::Relaxed);
        tracing::info!(
            upstream = %self.upstream,
            endpoint = %self.address,
            seconds = ejection.as_secs(),
            "endpoint ejected after a failed connect"
        );
    }

    /// The endpoint answered (a request, or an active probe): its connect failures are
    /// forgotten and it is back in the rotation.
    #[inline]
    pub fn connected(&self) {
        if self.connect_failures.load(Ordering::Relaxed) != 0 {
            self.connect_failures.store(0, Ordering::Relaxed);
            self.ejected_until.store(0, Ordering::Relaxed);
        }
    }

    /// Requests in flight.
    #[inline]
    pub fn in_flight(&self) -> u64 {
        u64::try_from(self.inflight.get()).unwrap_or(0)
    }

    /// The latency average in microseconds (0 = nothing measured yet), decayed to now.
    pub fn ewma_us(&self) -> f64 {
        let e = lock(&self.ewma);
        match e.stamp {
            None => 0.0,
            Some(t) => e.value_us * decay(t.elapsed()),
        }
    }

    /// Counts a request as in flight until the guard drops.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.inflight.inc();
        InFlight(Arc::clone(self))
    }

    /// Records a response latency for `ewma`.
    pub fn observe_latency(&self, latency: Duration) {
        let sample = latency.as_secs_f64() * 1e6;
        let mut e = lock(&self.ewma);
        let now = Instant::now();
        e.value_us = match e.stamp {
            None => sample,
            Some(t) => {
                let w = decay(now.saturating_duration_since(t));
                e.value_us * w + sample * (1.0 - w)
            }
        };
        e.stamp = Some(now);
    }

    fn set_healthy(&self, healthy: bool) {
        if self.healthy.swap(healthy, Ordering::Relaxed) != healthy {
            self.healthy_gauge.set(i64::from(healthy));
            tracing::warn!(
                upstream = %self.upstream,
                endpoint = %self.address,
                healthy,
                "endpoint health changed"
            );
        }
    }

    /// Applies one outcome under `rules`; returns whether the endpoint is healthy after it.
    pub fn report(&self, rules: &Rules, outcome: Outcome) -> bool {
        let mut c = lock(&self.counters);
        let healthy = self.is_healthy();
        let trip = |n: u32, limit: u32| limit > 0 && n >= limit;
        match outcome {
            Outcome::Status(code) if !rules.tcp_only => {
                if rules.unhealthy.codes.contains(&code) {
                    c.successes = 0;
                    c.http_failures = c.http_failures.saturating_add(1);
                    if healthy && trip(c.http_failures, rules.unhealthy.http_failures) {
                        self.set_healthy(false);
                    }
                } else if rules.healthy.codes.contains(&code) {
                    success(&mut c);
                    self.connected();
                    if !healthy && trip(c.successes, rules.healthy.successes) {
                        self.set_healthy(true);
                    }
                }
            }
            Outcome::Status(_) => {
                success(&mut c);
                self.connected();
                if !healthy && trip(c.successes, rules.healthy.successes) {
                    self.set_healthy(true);
                }
            }
            Outcome::TcpFailure => {
                c.successes = 0;
                c.tcp_failures = c.tcp_failures.saturating_add(1);
                if healthy && trip(c.tcp_failures, rules.unhealthy.tcp_failures) {
                    self.set_healthy(false);
                }
            }
            Outcome::Timeout => {
                c.successes = 0;
                c.timeouts = c.timeouts.saturating_add(1);
                if healthy && trip(c.timeouts, rules.unhealthy.timeouts) {
                    self.set_healthy(false);
                }
            }
        }
        self.is_healthy()
    }
}

fn success(c: &mut Counters) {
    c.successes = c.successes.saturating_add(1);
    c.http_failures = 0;
    c.tcp_failures = 0;
    c.timeouts = 0;
}

fn decay(elapsed: Duration) -> f64 {
    (-elapsed.as_secs_f64() / EWMA_TAU.as_secs_f64()).exp()
}

/// Keeps an endpoint counted as in flight while alive.
#[derive(Debug)]
pub struct InFlight(Arc<EndpointState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.dec();
    }
}

/// Metric families of upstreams, with bounded labels (upstream id, endpoint address).
#[derive(Debug, Clone)]
pub struct UpstreamMetrics {
    /// `sluice_upstream_endpoint_healthy{upstream, endpoint}`: 1 healthy, 0 not.
    pub endpoint_healthy: IntGaugeVec,
    /// `sluice_upstream_requests_in_flight{upstream, endpoint}`.
    pub in_flight: IntGaugeVec,
    /// `sluice_upstream_connections_total{endpoint, reused}`: connections used for a
    /// request, new (`false`) or taken from the keep-alive pool (`true`).
    pub connections: IntCounterVec,
    /// `sluice_upstream_retries_total{upstream, reason}`: requests sent again after a failed
    /// attempt, by why it failed: `connect` (nothing was sent), `connection_error` (reset
    /// before any response byte), `timeout` (the attempt's deadline or read timeout),
    /// `status` (a status code the route's retry policy lists).
    pub retries: IntCounterVec,
}

impl Default for UpstreamMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl UpstreamMetrics {
    /// Creates the families (not registered anywhere yet).
    pub fn new() -> Self {
        // NB: the names and label sets are constants, so construction cannot fail; the
        // fallbacks only satisfy the types.
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            IntGaugeVec::new(Opts::new(name, help), labels).unwrap_or_else(|_| unreachable_vec())
        };
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels)
                .unwrap_or_else(|_| unreachable_counter())
        };
        UpstreamMetrics {
            endpoint_healthy: gauge(
                "sluice_upstream_endpoint_healthy",
                "Whether an upstream endpoint is in the rotation (1) or ejected by a health check (0)",
                &["upstream", "endpoint"],
            ),
            in_flight: gauge(
                "sluice_upstream_requests_in_flight",
                "Requests in flight to an upstream endpoint (active upstream connections)",
                &["upstream", "endpoint"],
            ),
            connections: counter(
                "sluice_upstream_connections_total",
                "Upstream connections used for a request, by whether they were reused from the keep-alive pool",
                &["endpoint", "reused"],
            ),
            retries: counter(
                "sluice_upstream_retries_total",
                "Requests sent again after a failed attempt, by why it failed",
                &["upstream", "reason"],
            ),
        }
    }

    /// Every family, for registration.
    pub fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.endpoint_healthy.clone()),
            Box::new(self.in_flight.clone()),
            Box::new(self.connections.clone()),
            Box::new(self.retries.clone()),
        ]
    }
}

fn unreachable_vec() -> IntGaugeVec {
    IntGaugeVec::new(Opts::new("sluice_invalid", "invalid"), &[""; 0][..])
        .unwrap_or_else(|_| unreachable_vec())
}

fn unreachable_counter() -> IntCounterVec {
    IntCounterVec::new(Opts::new("sluice_invalid", "invalid"), &[""; 0][..])
        .unwrap_or_else(|_| unreachable_counter())
}

/// Runs the active probes of one upstream while it is alive and not retired.
#[derive(Debug)]
pub struct Checker {
    upstream: String,
    config: ActiveConfig,
    endpoints: Vec<(String, Arc<EndpointState>)>,
    retired: AtomicBool,
}

/// Health state and checkers that outlive one snapshot.
#[derive(Debug, Default)]
pub struct HealthRegistry {
    states: Mutex<HashMap<(String, String), Weak<EndpointState>>>,
    checkers: Mutex<HashMap<String, Weak<Checker>>>,
    runtime: OnceLock<Option<tokio::runtime::Handle>>,
    /// Metric families.
    pub metrics: UpstreamMetrics,
}

impl HealthRegistry {
    /// The state of `address` in `upstream`, shared with earlier snapshots when it exists.
    pub fn state(&self, upstream: &str, address: &str) -> Arc<EndpointState> {
        let mut states = lock(&self.states);
        let key = (upstream.to_owned(), address.to_owned());
        if let Some(s) = states.get(&key).and_then(Weak::upgrade) {
            return s;
        }
        let labels = [upstream, address];
        let healthy_gauge = self.metrics.endpoint_healthy.with_label_values(&labels);
        healthy_gauge.set(1);
        let state = Arc::new(EndpointState {
            upstream: upstream.to_owned(),
            address: address.to_owned(),
            healthy: AtomicBool::new(true),
            ejected_until: AtomicU64::new(0),
            connect_failures: AtomicU32::new(0),
            counters: Mutex::new(Counters::default()),
            ewma: Mutex::new(Ewma {
                value_us: 0.0,
                stamp: None,
            }),
            inflight: self.metrics.in_flight.with_label_values(&labels),
            healthy_gauge,
            metrics: self.metrics.clone(),
        });
        states.insert(key, Arc::downgrade(&state));
        state
    }

    /// The checker of `upstream`: the running one when its configuration and endpoints are
    /// unchanged, else a new one (the old one stops at its next round).
    pub fn checker(
        &self,
        upstream: &str,
        config: &ActiveConfig,
        endpoints: Vec<(String, Arc<EndpointState>)>,
    ) -> Arc<Checker> {
        let mut checkers = lock(&self.checkers);
        if let Some(c) = checkers.get(upstream).and_then(Weak::upgrade) {
            let same = c.config == *config
                && c.endpoints.len() == endpoints.len()
                && c.endpoints
                    .iter()
                    .zip(&endpoints)
                    .all(|(a, b)| a.0 == b.0 && Arc::ptr_eq(&a.1, &b.1));
            if same {
                return c;
            }
            c.retired.store(true, Ordering::Relaxed);
        }
        let checker = Arc::new(Checker {
            upstream: upstream.to_owned(),
            config: config.clone(),
            endpoints,
            retired: AtomicBool::new(false),
        });
        checkers.insert(upstream.to_owned(), Arc::downgrade(&checker));
        match self.background() {
            Some(rt) => {
                rt.spawn(run_checker(Arc::downgrade(&checker)));
            }
            None => tracing::error!(upstream, "no runtime for active health checks"),
        }
        checker
    }

    /// Forgets state no snapshot holds any more.
    pub fn prune(&self) {
        lock(&self.states).retain(|_, s| s.strong_count() > 0);
        lock(&self.checkers).retain(|_, c| c.strong_count() > 0);
    }

    /// A runtime on a thread of its own for the probes, started on first use, so probing
    /// never competes with a worker's requests and works whoever compiles the snapshot.
    pub(crate) fn background(&self) -> Option<&tokio::runtime::Handle> {
        self.runtime
            .get_or_init(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                let handle = rt.handle().clone();
                std::thread::Builder::new()
                    .name("sluice-health".into())
                    .spawn(move || rt.block_on(std::future::pending::<()>()))
                    .ok()?;
                Some(handle)
            })
            .as_ref()
    }
}

async fn run_checker(checker: Weak<Checker>) {
    if let Some(c) = checker.upgrade() {
        tracing::debug!(upstream = %c.upstream, endpoints = c.endpoints.len(), "active health checks started");
    }
    let mut next: HashMap<String, tokio::time::Instant> = HashMap::new();
    loop {
        let Some(c) = checker.upgrade() else {
            return;
        };
        if c.retired.load(Ordering::Relaxed) {
            return;
        }
        let now = tokio::time::Instant::now();
        let due: Vec<Arc<EndpointState>> = c
            .endpoints
            .iter()
            .filter(|(addr, _)| next.get(addr).is_none_or(|t| *t <= now))
            .map(|(_, s)| Arc::clone(s))
            .collect();
        let config = c.config.clone();
        drop(c);
        futures::stream::iter(due)
            .map(|state| {
                let config = &config;
                async move {
                    let outcome = probe(config, &state.address).await;
                    tracing::debug!(upstream = %state.upstream, endpoint = %state.address, ?outcome, "health probe");
                    state.report(&config.rules, outcome);
                    state
                }
            })
            .buffer_unordered(config.concurrency)
            .for_each(|state| {
                let interval = if state.is_healthy() {
                    config.rules.healthy.interval
                } else {
                    config.rules.unhealthy.interval
                };
                next.insert(state.address.clone(), tokio::time::Instant::now() + interval);
                async {}
            })
            .await;
        let wake = next
            .values()
            .min()
            .copied()
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(1));
        // NB: wake at least once a second so a retired or dropped checker ends promptly.
        let cap = tokio::time::Instant::now() + Duration::from_secs(1);
        tokio::time::sleep_until(wake.min(cap)).await;
    }
}

/// The address to probe: the endpoint's host with the configured port, if any.
fn probe_address(address: &str, port: Option<u16>) -> String {
    match (port, address.rsplit_once(':')) {
        (Some(p), Some((host, _))) => format!("{host}:{p}"),
        _ => address.to_owned(),
    }
}

/// One probe.
pub async fn probe(config: &ActiveConfig, address: &str) -> Outcome {
    let target = probe_address(address, config.port);
    let run = async {
        let stream = match tokio::net::TcpStream::connect(&target).await {
            Ok(s) => s,
            Err(_) => return Outcome::TcpFailure,
        };
        let ProbeKind::Http {
            path,
            host,
            headers,
            tls,
        } = &config.kind
        else {
            return Outcome::Status(200);
        };
        let mut req = format!(
            "GET {path} HTTP/1.1\r\nhost: {}\r\nuser-agent: sluice-health-check\r\nconnection: close\r\n",
            host.as_deref().unwrap_or(&target)
        );
        for (n, v) in headers {
            req.push_str(n);
            req.push_str(": ");
            req.push_str(v);
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        match tls {
            None => http_probe(stream, req.as_bytes()).await,
            // NB: a handshake that fails (certificate not verified, no TLS spoken) counts as
            // a TCP failure, as in lua-resty-healthcheck.
            Some(tls) => match tls.client.connect(stream, &target, Alpn::Http11).await {
                Ok(stream) => http_probe(stream, req.as_bytes()).await,
                Err(e) => {
                    tracing::debug!(endpoint = %target, error = %e, "https probe handshake failed");
                    Outcome::TcpFailure
                }
            },
        }
    };
    match tokio::time::timeout(config.timeout, run).await {
        Ok(o) => o,
        Err(_) => Outcome::Timeout,
    }
}

/// Sends the probe request `req` on `stream` and judges the status line of the answer.
async fn http_probe<S>(mut stream: S, req: &[u8]) -> Outcome
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if stream.write_all(req).await.is_err() {
        return Outcome::TcpFailure;
    }
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < 4096 {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return Outcome::TcpFailure,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    // `HTTP/1.1 200 OK`
    let status = buf
        .get(9..12)
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.parse::<u16>().ok());
    match status {
        Some(s) if buf.starts_with(b"HTTP/1.") => Outcome::Status(s),
        _ => Outcome::TcpFailure,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules {
            healthy: Thresholds {
                codes: vec![200],
                successes: 2,
                ..Default::default()
            },
            unhealthy: Thresholds {
                codes: vec![500],
                http_failures: 3,
                tcp_failures: 1,
                timeouts: 2,
                ..Default::default()
            },
            tcp_only: false,
        }
    }

    #[test]
    fn thresholds_eject_and_restore() {
        let reg = HealthRegistry::default();
        let s = reg.state("u", "a:1");
        let r = rules();
        assert!(s.report(&r, Outcome::Status(500)));
        assert!(s.report(&r, Outcome::Status(500)));
        // A success in between resets the failure count.
        assert!(s.report(&r, Outcome::Status(200)));
        assert!(s.report(&r, Outcome::Status(500)));
        assert!(s.report(&r, Outcome::Status(500)));
        assert!(!s.report(&r, Outcome::Status(500)));
        assert!(!s.report(&r, Outcome::Status(200)));
        assert!(s.report(&r, Outcome::Status(200)));
        assert!(!s.report(&r, Outcome::TcpFailure));
        assert_eq!(
            reg.metrics
                .endpoint_healthy
                .with_label_values(&["u", "a:1"])
                .get(),
            0
        );
    }

    /// A failed connect takes the endpoint out of the balancer's picks at once (its health
    /// is untouched), each failure in a row for twice as long, up to the cap; an answer
    /// brings it back.
    #[test]
    fn a_failed_connect_ejects_for_a_doubling_time_and_an_answer_restores() {
        let reg = HealthRegistry::default();
        let s = reg.state("u", "a:1");
        assert!(s.is_available());
        let ejected_for = |s: &EndpointState| {
            let until = s.ejected_until.load(Ordering::Relaxed);
            Duration::from_millis(until.saturating_sub(now_ms()))
        };
        let mut last = Duration::ZERO;
        for _ in 0..8 {
            s.connect_failed();
            assert!(!s.is_available());
            assert!(s.is_healthy(), "ejection is not the health checks' state");
            let d = ejected_for(&s);
            assert!(
                d > last || d > MAX_EJECTION - Duration::from_secs(1),
                "{d:?}"
            );
            assert!(d <= MAX_EJECTION, "{d:?}");
            last = d;
        }
        assert!(last > MAX_EJECTION - Duration::from_secs(1), "{last:?}");
        s.connected();
        assert!(s.is_available());
        s.connect_failed();
        let d = ejected_for(&s);
        assert!(
            d <= EJECTION && d > EJECTION - Duration::from_secs(1),
            "{d:?}"
        );
    }

    #[test]
    fn state_survives_while_held_and_is_pruned_after() {
        let reg = HealthRegistry::default();
        let a = reg.state("u", "a:1");
        a.report(&rules(), Outcome::TcpFailure);
        let b = reg.state("u", "a:1");
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!b.is_healthy());
        // Same address in another upstream: separate state.
        assert!(reg.state("v", "a:1").is_healthy());
        drop((a, b));
        reg.prune();
        assert!(reg.state("u", "a:1").is_healthy());
    }

    #[test]
    fn ewma_moves_towards_samples() {
        let reg = HealthRegistry::default();
        let s = reg.state("u", "a:1");
        assert_eq!(s.ewma_us(), 0.0);
        s.observe_latency(Duration::from_millis(10));
        assert!((s.ewma_us() - 10_000.0).abs() < 100.0);
    }
}
