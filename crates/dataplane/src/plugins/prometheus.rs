//! `prometheus` (priority 500): APISIX's metric families, so APISIX dashboards work.
//!
//! Families (names, labels and buckets as APISIX 3.x):
//! - `apisix_http_status{code,route,matched_uri,matched_host,service,consumer,node}`
//! - `apisix_http_latency_bucket{type=request|upstream|apisix,route,service,consumer,node,le}`
//!   in milliseconds, buckets 1 … 60000
//! - `apisix_bandwidth{type=ingress|egress,route,service,consumer,node}` in bytes
//! - `apisix_http_requests_total` (every request the process served)
//! - `apisix_nginx_http_current_connections{state=active|reading|writing|waiting|accepted|handled}`
//! - `apisix_node_info{hostname}`
//! - `apisix_upstream_status{name,ip,port}`: 1 healthy, 0 unhealthy, for the endpoints of
//!   upstreams with health checks ([`render_upstream_status`])
//!
//! Label values are bounded: the route id, the route's path *pattern* (never the raw
//! path), its first host pattern, the consumer name and the upstream IP. `service` is
//! always empty (Sluice has no APISIX services).
//!
//! Cost per request: one read-locked map lookup keyed by (status, consumer pointer,
//! upstream pointer) in a cache owned by the route's plugin instance, then relaxed atomic
//! adds. Label strings are only built the first time a combination is seen.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};

use super::fasthash::MixBuildHasher;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use sluice_plugin_config::prometheus::Prometheus as Config;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{BuildCtx, Consumer, Plugin, PluginCtx};
use crate::upstream::{Pool, Upstream};

/// APISIX's latency buckets, milliseconds.
pub const BUCKETS_MS: [u64; 15] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000,
];

#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; 15],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let ms = us.div_ceil(1000);
        if let Some(i) = BUCKETS_MS.iter().position(|b| ms <= *b)
            && let Some(b) = self.buckets.get(i)
        {
            b.fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }
}

/// Labels of one series (strings built once per combination).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Labels {
    route: Arc<str>,
    matched_uri: Arc<str>,
    matched_host: Arc<str>,
    consumer: Arc<str>,
    node: Arc<str>,
    code: u16,
}

#[derive(Debug, Default)]
struct Series {
    status: AtomicU64,
    request: Histogram,
    upstream: Histogram,
    apisix: Histogram,
    ingress: AtomicU64,
    egress: AtomicU64,
}

/// The APISIX metric families of one process, rendered on `/metrics` and
/// `/apisix/prometheus/metrics`.
#[derive(Debug, Default)]
pub struct ApisixMetrics {
    series: Mutex<HashMap<Labels, Arc<Series>>>,
    requests: AtomicU64,
    in_flight: AtomicI64,
    accepted: AtomicU64,
    active: AtomicI64,
}

impl ApisixMetrics {
    fn series(&self, labels: Labels) -> Arc<Series> {
        let mut map = match self.series.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        Arc::clone(map.entry(labels).or_default())
    }

    /// A request arrived (every request, with or without the plugin).
    #[inline]
    pub fn request_started(&self) {
        self.requests.fetch_add(1, Relaxed);
        self.in_flight.fetch_add(1, Relaxed);
    }

    /// A request's response head was produced.
    #[inline]
    pub fn request_finished(&self) {
        self.in_flight.fetch_sub(1, Relaxed);
    }

    /// A downstream connection was accepted.
    pub fn connection_opened(&self) {
        self.accepted.fetch_add(1, Relaxed);
        self.active.fetch_add(1, Relaxed);
    }

    /// A downstream connection closed.
    pub fn connection_closed(&self) {
        self.active.fetch_sub(1, Relaxed);
    }

    /// Appends the exposition text of the APISIX families to `out`.
    pub fn render(&self, out: &mut String) {
        let mut all: Vec<(Labels, Arc<Series>)> = {
            let map = match self.series.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            map.iter()
                .map(|(k, v)| (k.clone(), Arc::clone(v)))
                .collect()
        };
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let active = self.active.load(Relaxed).max(0);
        let writing = self.in_flight.load(Relaxed).clamp(0, active);
        let accepted = self.accepted.load(Relaxed);
        out.push_str("# HELP apisix_nginx_http_current_connections Number of HTTP connections\n");
        out.push_str("# TYPE apisix_nginx_http_current_connections gauge\n");
        for (state, v) in [
            ("accepted", accepted as i64),
            ("active", active),
            ("handled", accepted as i64),
            ("reading", 0),
            ("waiting", active - writing),
            ("writing", writing),
        ] {
            let _ = writeln!(
                out,
                "apisix_nginx_http_current_connections{{state=\"{state}\"}} {v}"
            );
        }
        out.push_str("# HELP apisix_http_requests_total The total number of client requests since APISIX started\n");
        out.push_str("# TYPE apisix_http_requests_total gauge\n");
        let _ = writeln!(
            out,
            "apisix_http_requests_total {}",
            self.requests.load(Relaxed)
        );
        out.push_str("# HELP apisix_node_info Info of APISIX node\n");
        out.push_str("# TYPE apisix_node_info gauge\n");
        let _ = writeln!(
            out,
            "apisix_node_info{{hostname=\"{}\"}} 1",
            escape(&hostname())
        );

        out.push_str("# HELP apisix_http_status HTTP status codes per service in APISIX\n");
        out.push_str("# TYPE apisix_http_status counter\n");
        for (l, s) in &all {
            let _ = writeln!(
                out,
                "apisix_http_status{{code=\"{}\",route=\"{}\",matched_uri=\"{}\",matched_host=\"{}\",service=\"\",consumer=\"{}\",node=\"{}\"}} {}",
                l.code,
                escape(&l.route),
                escape(&l.matched_uri),
                escape(&l.matched_host),
                escape(&l.consumer),
                escape(&l.node),
                s.status.load(Relaxed)
            );
        }

        // Latency and bandwidth have no code/matched_* labels: sum the series that differ
        // only in those.
        type Short = (Arc<str>, Arc<str>, Arc<str>);
        let mut short: Vec<(Short, Vec<&Series>)> = Vec::new();
        for (l, s) in &all {
            let k = (
                Arc::clone(&l.route),
                Arc::clone(&l.consumer),
                Arc::clone(&l.node),
            );
            match short.iter_mut().find(|(sk, _)| *sk == k) {
                Some((_, v)) => v.push(s),
                None => short.push((k, vec![s])),
            }
        }
        short.sort_by(|a, b| a.0.cmp(&b.0));
        out.push_str("# HELP apisix_http_latency HTTP request latency in milliseconds per service in APISIX\n");
        out.push_str("# TYPE apisix_http_latency histogram\n");
        for ((route, consumer, node), list) in &short {
            let labels = format!(
                "route=\"{}\",service=\"\",consumer=\"{}\",node=\"{}\"",
                escape(route),
                escape(consumer),
                escape(node)
            );
            for (ty, pick) in [
                (
                    "apisix",
                    (|s: &Series| &s.apisix) as fn(&Series) -> &Histogram,
                ),
                ("request", |s: &Series| &s.request),
                ("upstream", |s: &Series| &s.upstream),
            ] {
                let mut cum = 0u64;
                for (i, b) in BUCKETS_MS.iter().enumerate() {
                    cum += list
                        .iter()
                        .map(|s| pick(s).buckets.get(i).map_or(0, |a| a.load(Relaxed)))
                        .sum::<u64>();
                    let _ = writeln!(
                        out,
                        "apisix_http_latency_bucket{{type=\"{ty}\",{labels},le=\"{b}\"}} {cum}"
                    );
                }
                let count: u64 = list.iter().map(|s| pick(s).count.load(Relaxed)).sum();
                let sum_us: u64 = list.iter().map(|s| pick(s).sum_us.load(Relaxed)).sum();
                let _ = writeln!(
                    out,
                    "apisix_http_latency_bucket{{type=\"{ty}\",{labels},le=\"+Inf\"}} {count}"
                );
                let _ = writeln!(
                    out,
                    "apisix_http_latency_sum{{type=\"{ty}\",{labels}}} {}",
                    sum_us as f64 / 1000.0
                );
                let _ = writeln!(
                    out,
                    "apisix_http_latency_count{{type=\"{ty}\",{labels}}} {count}"
                );
            }
        }
        out.push_str(
            "# HELP apisix_bandwidth Total bandwidth in bytes consumed per service in APISIX\n",
        );
        out.push_str("# TYPE apisix_bandwidth counter\n");
        for ((route, consumer, node), list) in &short {
            for ty in ["egress", "ingress"] {
                let v: u64 = list
                    .iter()
                    .map(|s| {
                        if ty == "egress" {
                            &s.egress
                        } else {
                            &s.ingress
                        }
                        .load(Relaxed)
                    })
                    .sum();
                let _ = writeln!(
                    out,
                    "apisix_bandwidth{{type=\"{ty}\",route=\"{}\",service=\"\",consumer=\"{}\",node=\"{}\"}} {v}",
                    escape(route),
                    escape(consumer),
                    escape(node)
                );
            }
        }
    }
}

/// Appends `apisix_upstream_status{name,ip,port}` (1 healthy, 0 unhealthy) for every
/// endpoint of the upstreams that have an active or passive health check, as APISIX
/// reports its health checkers. `name` is the Sluice upstream id (e.g.
/// `default/httpbin:80`), where APISIX puts the upstream's resource key. Read from the
/// table being served at scrape time, so an upstream that leaves the snapshot leaves the
/// metric with it.
pub fn render_upstream_status(upstreams: &[Arc<Upstream>], out: &mut String) {
    out.push_str("# HELP apisix_upstream_status Upstream status from health check\n");
    out.push_str("# TYPE apisix_upstream_status gauge\n");
    for up in upstreams.iter().filter(|u| u.health_checked()) {
        for ep in &up.endpoints {
            let (ip, port) = split_address(&ep.address);
            let _ = writeln!(
                out,
                "apisix_upstream_status{{name=\"{}\",ip=\"{}\",port=\"{}\"}} {}",
                escape(&up.id),
                escape(ip),
                escape(port),
                u8::from(ep.state.is_healthy())
            );
        }
    }
}

/// (host, port) of an endpoint address `ip:port` / `[v6]:port` / `name:port`.
fn split_address(addr: &str) -> (&str, &str) {
    if let Some(rest) = addr.strip_prefix('[')
        && let Some((ip, port)) = rest.split_once(']')
    {
        return (ip, port.strip_prefix(':').unwrap_or(""));
    }
    addr.rsplit_once(':').unwrap_or((addr, ""))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn escape(s: &str) -> std::borrow::Cow<'_, str> {
    if s.bytes().any(|b| b == b'\\' || b == b'"' || b == b'\n') {
        std::borrow::Cow::Owned(
            s.replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n"),
        )
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// An `Arc` compared and hashed by address (the cache holds it, so the address cannot be
/// reused while cached).
#[derive(Debug, Clone)]
struct ByPtr<T>(Option<Arc<T>>);

impl<T> PartialEq for ByPtr<T> {
    fn eq(&self, o: &Self) -> bool {
        match (&self.0, &o.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}
impl<T> Eq for ByPtr<T> {}
impl<T> Hash for ByPtr<T> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0
            .as_ref()
            .map(|a| Arc::as_ptr(a) as *const u8 as usize)
            .hash(h);
    }
}

type CacheKey = (u16, ByPtr<Consumer>, ByPtr<Pool>);

/// The plugin on one route.
#[derive(Debug)]
pub struct Prometheus {
    metrics: Arc<ApisixMetrics>,
    /// NB: keyed by status and pointers, nothing a client chooses: [`MixBuildHasher`].
    cache: RwLock<HashMap<CacheKey, Arc<Series>, MixBuildHasher>>,
}

/// Builds `prometheus`.
pub fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Arc<dyn Plugin>, ConfigError> {
    let _conf: Config = sluice_plugin_config::parse_json(json)?;
    Ok(Arc::new(Prometheus {
        metrics: Arc::clone(&cx.state.apisix),
        cache: RwLock::new(HashMap::default()),
    }))
}

impl Prometheus {
    fn series_for(&self, ctx: &PluginCtx) -> Arc<Series> {
        let key: CacheKey = (
            ctx.status.as_u16(),
            ByPtr(ctx.consumer.clone()),
            ByPtr(ctx.upstream.clone()),
        );
        if let Ok(c) = self.cache.read()
            && let Some(s) = c.get(&key)
        {
            return Arc::clone(s);
        }
        let node: Arc<str> = match &ctx.upstream {
            Some(p) => Arc::from(node_ip(p.address())),
            None => Arc::from(""),
        };
        let labels = Labels {
            route: Arc::clone(&ctx.chain.route_id),
            matched_uri: Arc::clone(&ctx.chain.matched_uri),
            matched_host: Arc::clone(&ctx.chain.matched_host),
            consumer: ctx
                .consumer
                .as_ref()
                .map_or_else(|| Arc::from(""), |c| Arc::clone(&c.name)),
            node,
            code: ctx.status.as_u16(),
        };
        let s = self.metrics.series(labels);
        if let Ok(mut c) = self.cache.write() {
            // NB: bounded by codes × consumers × endpoints of this route.
            c.insert(key, Arc::clone(&s));
        }
        s
    }
}

/// The IP of an endpoint address `ip:port` / `[v6]:port` / `name:port`.
fn node_ip(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(ip, _)| ip);
    }
    addr.rsplit_once(':').map_or(addr, |(h, _)| h)
}

impl Plugin for Prometheus {
    fn name(&self) -> &'static str {
        Config::NAME
    }

    fn priority(&self) -> i32 {
        Config::PRIORITY
    }

    fn wants_log(&self) -> bool {
        true
    }

    fn log(&self, ctx: &PluginCtx) {
        let s = self.series_for(ctx);
        let now = Instant::now();
        s.status.fetch_add(1, Relaxed);
        let request = now.saturating_duration_since(ctx.started);
        s.request.observe(request);
        if let (Some(start), Some(done)) = (ctx.upstream_started, ctx.upstream_done) {
            let up = done.saturating_duration_since(start);
            s.upstream.observe(up);
            s.apisix.observe(request.saturating_sub(up));
        } else {
            s.apisix.observe(request);
        }
        s.ingress.fetch_add(ctx.request_bytes, Relaxed);
        s.egress
            .fetch_add(ctx.response_head_bytes + ctx.response_body_bytes, Relaxed);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn node_ips() {
        assert_eq!(node_ip("10.0.0.1:80"), "10.0.0.1");
        assert_eq!(node_ip("[::1]:80"), "::1");
        assert_eq!(split_address("10.0.0.1:80"), ("10.0.0.1", "80"));
        assert_eq!(split_address("[::1]:8080"), ("::1", "8080"));
        assert_eq!(split_address("svc.example:443"), ("svc.example", "443"));
    }

    #[test]
    fn buckets() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(1500));
        h.observe(Duration::from_millis(70_000));
        assert_eq!(h.buckets[1].load(Relaxed), 1);
        assert_eq!(h.count.load(Relaxed), 2);
    }
}
