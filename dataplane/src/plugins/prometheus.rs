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
//! Cost per request: one lookup keyed by (plugin instance, status, consumer pointer,
//! upstream pointer) in a cache of the worker thread, then plain loads and stores into
//! that thread's own series (no lock, no atomic read-modify-write; a scrape sums the
//! threads' series). Label strings are only built the first time a thread sees a
//! combination.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;

use super::support::fasthash::MixBuildHasher;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_plugin_config::ConfigError;
use sluice_plugin_config::prometheus::Prometheus as Config;

use super::{BuildCtx, Builtin, Hooks, Plugin, PluginCtx};
use crate::upstream::Upstream;

/// APISIX's latency buckets, milliseconds.
pub const BUCKETS_MS: [u64; 15] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000,
];

/// Observations per bucket (not cumulative); the last counts those above every bound.
/// NB: the count is their sum, so an observation costs two atomic adds, not three.
#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS_MS.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    /// Observes `us` microseconds.
    fn observe(&self, us: u64) {
        let ms = us.div_ceil(1000);
        let i = BUCKETS_MS
            .iter()
            .position(|b| ms <= *b)
            .unwrap_or(BUCKETS_MS.len());
        if let Some(b) = self.buckets.get(i) {
            bump(b, 1);
        }
        bump(&self.sum_us, us);
    }

    /// Observations in total.
    fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Relaxed)).sum()
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

/// Adds `n` to a counter that only the calling thread writes (see [`Series`]): a load and
/// a store, where `fetch_add` would be a locked read-modify-write (~20 cycles each, seven
/// per request).
fn bump(a: &AtomicU64, n: u64) {
    a.store(a.load(Relaxed).wrapping_add(n), Relaxed);
}

/// The counters of one label combination, written by one thread only: each thread that
/// logs requests has its own series per combination (see [`thread_series`]), and rendering
/// sums them. The `apisix_http_status` count is the request histogram's count (every
/// logged request is observed there once).
#[derive(Debug, Default)]
struct Series {
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
    /// Per label combination and thread (see [`thread_index`]).
    series: Mutex<HashMap<(Labels, u32), Arc<Series>>>,
    requests: AtomicU64,
    in_flight: AtomicI64,
    accepted: AtomicU64,
    active: AtomicI64,
}

impl ApisixMetrics {
    /// The calling thread's series for `labels`.
    fn series(&self, labels: Labels) -> Arc<Series> {
        let mut map = match self.series.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        Arc::clone(map.entry((labels, thread_index())).or_default())
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
        // One entry per label combination with every thread's series of it.
        let mut all: Vec<(Labels, Vec<Arc<Series>>)> = Vec::new();
        {
            let map = match self.series.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            let mut flat: Vec<(&Labels, &Arc<Series>)> =
                map.iter().map(|((l, _), s)| (l, s)).collect();
            flat.sort_by(|a, b| a.0.cmp(b.0));
            for (l, s) in flat {
                match all.last_mut() {
                    Some((last, v)) if last == l => v.push(Arc::clone(s)),
                    _ => all.push((l.clone(), vec![Arc::clone(s)])),
                }
            }
        }
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
            escape(&super::support::vars::hostname())
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
                s.iter().map(|s| s.request.count()).sum::<u64>()
            );
        }

        // Latency and bandwidth have no code/matched_* labels: sum the series that differ
        // only in those.
        type Short = (Arc<str>, Arc<str>, Arc<str>);
        let mut short: Vec<(Short, Vec<&Series>)> = Vec::new();
        for (l, list) in &all {
            let k = (
                Arc::clone(&l.route),
                Arc::clone(&l.consumer),
                Arc::clone(&l.node),
            );
            let series = list.iter().map(|s| &**s);
            match short.iter_mut().find(|(sk, _)| *sk == k) {
                Some((_, v)) => v.extend(series),
                None => short.push((k, series.collect())),
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
                let count: u64 = list.iter().map(|s| pick(s).count()).sum();
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

/// (prometheus instance, status, consumer address, upstream pool address; 0 for none).
/// NB: while an instance lives, so does the snapshot it was built for, and with it every
/// consumer and pool it can see: the addresses are unambiguous.
type CacheKey = (u64, u16, usize, usize);

fn addr<T>(a: &Option<Arc<T>>) -> usize {
    a.as_ref()
        .map_or(0, |a| Arc::as_ptr(a) as *const u8 as usize)
}

/// Entries a thread's series cache holds before it is emptied (entries of instances of
/// old snapshots are dead; emptying only costs fresh lookups).
const CACHE_LIMIT: usize = 4096;

/// A thread's series by [`CacheKey`], with the last one used in front (a route's requests
/// mostly log the same combination; comparing is cheaper than hashing).
#[derive(Default)]
struct ThreadSeries {
    last: Option<(CacheKey, Arc<Series>)>,
    all: HashMap<CacheKey, Arc<Series>, MixBuildHasher>,
}

thread_local! {
    /// This thread's series. NB: found without locks or atomic operations.
    static CACHE: RefCell<ThreadSeries> = RefCell::new(ThreadSeries::default());
}

/// A small number naming the calling thread (its series are its own).
fn thread_index() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    thread_local! {
        static INDEX: u32 = NEXT.fetch_add(1, Relaxed);
    }
    INDEX.with(|i| *i)
}

/// The plugin on one route.
#[derive(Debug)]
pub struct Prometheus {
    metrics: Arc<ApisixMetrics>,
    /// Unique per instance, for the thread caches' keys.
    id: u64,
}

impl Builtin for Prometheus {
    type Config = Config;
    const HOOKS: Hooks = Hooks::LOG;

    /// Builds `prometheus`.
    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let _conf: Config = sluice_plugin_config::parse_json(json)?;
        Ok(Prometheus {
            metrics: Arc::clone(&cx.state.apisix),
            id: NEXT_ID.fetch_add(1, Relaxed),
        })
    }
}

impl Prometheus {
    /// This thread's series of a combination not in its cache yet.
    fn new_series(&self, ctx: &PluginCtx) -> Arc<Series> {
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
        self.metrics.series(labels)
    }
}

/// `d` in whole microseconds. NB: in u64 (`as_micros` is u128 arithmetic).
fn micros(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(d.subsec_micros()))
}

fn record(s: &Series, ctx: &PluginCtx) {
    let now = ctx.end_time();
    let request = micros(now.saturating_duration_since(ctx.started));
    s.request.observe(request);
    // NB: as APISIX: upstream = `$upstream_response_time` (to the end of the upstream's
    // response, which streams to the client as it arrives), apisix = request - upstream.
    if let Some(start) = ctx.upstream_started {
        let up = micros(now.saturating_duration_since(start));
        s.upstream.observe(up);
        s.apisix.observe(request.saturating_sub(up));
    } else {
        s.apisix.observe(request);
    }
    bump(&s.ingress, ctx.request_bytes);
    bump(&s.egress, ctx.response_head_bytes + ctx.response_body_bytes);
}

/// The IP of an endpoint address `ip:port` / `[v6]:port` / `name:port`.
fn node_ip(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(ip, _)| ip);
    }
    addr.rsplit_once(':').map_or(addr, |(h, _)| h)
}

impl Plugin for Prometheus {
    fn log(&self, ctx: &mut PluginCtx) {
        // NB: the thread's own series, from its cache: no lock, no `Arc` clone, and plain
        // stores into counters only this thread writes.
        let key = (
            self.id,
            ctx.status.as_u16(),
            addr(&ctx.consumer),
            addr(&ctx.upstream),
        );
        let cached = CACHE.with(|c| {
            let Ok(mut c) = c.try_borrow_mut() else {
                return false;
            };
            if let Some((k, s)) = &c.last
                && *k == key
            {
                record(s, ctx);
                return true;
            }
            let Some(s) = c.all.get(&key).cloned() else {
                return false;
            };
            record(&s, ctx);
            c.last = Some((key, s));
            true
        });
        if cached {
            return;
        }
        let s = self.new_series(ctx);
        record(&s, ctx);
        CACHE.with(|c| {
            if let Ok(mut c) = c.try_borrow_mut() {
                if c.all.len() >= CACHE_LIMIT {
                    c.all.clear();
                }
                c.all.insert(key, Arc::clone(&s));
                c.last = Some((key, s));
            }
        });
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
    fn threads_count_in_their_own_series_and_a_scrape_sums_them() {
        let metrics = Arc::new(ApisixMetrics::default());
        let labels = Labels {
            route: Arc::from("r1"),
            matched_uri: Arc::from("/hello"),
            matched_host: Arc::from(""),
            consumer: Arc::from(""),
            node: Arc::from("10.0.0.1"),
            code: 200,
        };
        let per_thread: Vec<Arc<Series>> = (0..3)
            .map(|n| {
                let (metrics, labels) = (Arc::clone(&metrics), labels.clone());
                std::thread::spawn(move || {
                    let s = metrics.series(labels.clone());
                    // The same thread gets the same series again.
                    assert!(Arc::ptr_eq(&s, &metrics.series(labels)));
                    for _ in 0..=n {
                        s.request.observe(300);
                        bump(&s.egress, 100);
                    }
                    s
                })
                .join()
                .unwrap()
            })
            .collect();
        assert!(!Arc::ptr_eq(&per_thread[0], &per_thread[1]));
        let mut out = String::new();
        metrics.render(&mut out);
        // 1 + 2 + 3 requests, one status line for the combination.
        let status: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("apisix_http_status{"))
            .collect();
        assert_eq!(status.len(), 1, "{out}");
        assert!(status[0].ends_with("} 6"), "{out}");
        assert!(
            out.contains("apisix_bandwidth{type=\"egress\",route=\"r1\",service=\"\",consumer=\"\",node=\"10.0.0.1\"} 600"),
            "{out}"
        );
        assert!(
            out.contains("apisix_http_latency_count{type=\"request\",route=\"r1\",service=\"\",consumer=\"\",node=\"10.0.0.1\"} 6"),
            "{out}"
        );
    }

    #[test]
    fn buckets() {
        let h = Histogram::default();
        h.observe(1500);
        h.observe(70_000_000);
        assert_eq!(h.buckets[1].load(Relaxed), 1);
        assert_eq!(h.buckets[15].load(Relaxed), 1);
        assert_eq!(h.count(), 2);
    }
}
