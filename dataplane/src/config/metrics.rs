//! Dataplane metrics, served on the admin listener's `/metrics`.

use http::StatusCode;
use prometheus::{
    Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Counters and gauges of one dataplane process.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// Version of the snapshot being served.
    pub snapshot_version: IntGauge,
    /// Snapshot loads by result (`ok`, `rejected`).
    pub snapshot_loads: IntCounterVec,
    responses: [IntCounter; 5],
    write_batching: IntGaugeVec,
    /// APISIX's `apisix_etcd_reachable`, standing in for the configuration source: 1 while
    /// the controller stream is up (controller mode) or the last read of the files worked
    /// (standalone mode), else 0.
    source_reachable: IntGauge,
    /// APISIX's `apisix_etcd_modify_indexes{key}`, standing in for etcd's modify indexes:
    /// per kind of object, the version of the last snapshot that changed that kind;
    /// `max_modify_index` is the version being served.
    modify_indexes: IntGaugeVec,
    /// APISIX's `apisix_nginx_metric_errors_total`: scrapes whose Sluice families could not
    /// be encoded (the metric library's own errors, as in APISIX).
    metric_errors: IntCounter,
    /// Idle HTTP/1.1 keep-alive connections parked without their buffers
    /// (`crate::listener::idle`).
    pub parked_connections: IntGauge,
    /// Layer-4 connections, bytes and UDP sessions.
    pub stream: StreamMetrics,
    /// `sluice_proxy_protocol_refused_total{reason}`: HTTP/HTTPS connections closed for
    /// their PROXY header (`crate::listener::proxy_protocol`).
    proxy_protocol_refused: IntCounterVec,
}

/// Metric families of the stream proxy (`crate::config::stream`).
#[derive(Debug, Clone)]
pub struct StreamMetrics {
    /// `sluice_stream_connections_total{listener,route,outcome}`: connections (UDP sessions)
    /// by how they ended: `ok`, `no_route`, `denied`, `upstream_failed`, `client_hello`,
    /// `proxy_header`, `tls_failed`, `drained`, `idle`, `session_limit` (UDP caps). `route` is
    /// empty before routing.
    pub connections: IntCounterVec,
    /// `sluice_stream_bytes_total{direction}`: `upstream` (client to upstream) and
    /// `downstream` (upstream to client).
    pub bytes: IntCounterVec,
    /// `sluice_stream_active_connections`: TCP/TLS connections open now.
    pub active: IntGauge,
    /// `sluice_udp_sessions`: UDP sessions open now.
    pub udp_sessions: IntGauge,
}

impl StreamMetrics {
    fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let connections = IntCounterVec::new(
            Opts::new(
                "sluice_stream_connections_total",
                "Layer-4 connections and UDP sessions by listener, route and outcome",
            ),
            &["listener", "route", "outcome"],
        )?;
        let bytes = IntCounterVec::new(
            Opts::new(
                "sluice_stream_bytes_total",
                "Bytes copied by the stream proxy, by direction (upstream: client to upstream)",
            ),
            &["direction"],
        )?;
        let active = IntGauge::new(
            "sluice_stream_active_connections",
            "Layer-4 TCP connections open now",
        )?;
        let udp_sessions = IntGauge::new("sluice_udp_sessions", "UDP sessions open now")?;
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(bytes.clone()))?;
        registry.register(Box::new(active.clone()))?;
        registry.register(Box::new(udp_sessions.clone()))?;
        Ok(StreamMetrics {
            connections,
            bytes,
            active,
            udp_sessions,
        })
    }
}

impl Metrics {
    /// Registers every metric in a fresh registry.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let snapshot_version = IntGauge::new(
            "sluice_snapshot_version",
            "Version of the snapshot being served",
        )?;
        let snapshot_loads = IntCounterVec::new(
            Opts::new("sluice_snapshot_loads_total", "Snapshot loads by result"),
            &["result"],
        )?;
        let by_class = IntCounterVec::new(
            Opts::new(
                "sluice_http_responses_total",
                "Responses sent downstream by status class",
            ),
            &["class"],
        )?;
        let responses = [
            by_class.with_label_values(&["1xx"]),
            by_class.with_label_values(&["2xx"]),
            by_class.with_label_values(&["3xx"]),
            by_class.with_label_values(&["4xx"]),
            by_class.with_label_values(&["5xx"]),
        ];
        let write_batching = IntGaugeVec::new(
            Opts::new(
                "sluice_dataplane_write_batching",
                "Write-batching mode the workers use (--write-batching): 1 for io_uring, \
                 send or off",
            ),
            &["mode"],
        )?;
        let source_reachable = IntGauge::new(
            "apisix_etcd_reachable",
            "Config source reachable from the dataplane, 0 is unreachable (Sluice: the \
             controller stream in controller mode, the config files in standalone mode)",
        )?;
        let modify_indexes = IntGaugeVec::new(
            Opts::new(
                "apisix_etcd_modify_indexes",
                "Version of the last snapshot that changed each kind of object (Sluice's \
                 stand-in for etcd modify indexes); max_modify_index is the version served",
            ),
            &["key"],
        )?;
        let metric_errors = IntCounter::new(
            "apisix_nginx_metric_errors_total",
            "Number of errors encoding the metrics (Sluice: failed scrapes of its own families)",
        )?;
        let parked_connections = IntGauge::new(
            "sluice_dataplane_parked_connections",
            "Idle HTTP/1.1 keep-alive connections waiting for their next request with their \
             buffers released",
        )?;
        registry.register(Box::new(parked_connections.clone()))?;
        registry.register(Box::new(source_reachable.clone()))?;
        registry.register(Box::new(modify_indexes.clone()))?;
        registry.register(Box::new(metric_errors.clone()))?;
        registry.register(Box::new(snapshot_version.clone()))?;
        registry.register(Box::new(write_batching.clone()))?;
        registry.register(Box::new(snapshot_loads.clone()))?;
        registry.register(Box::new(by_class))?;
        let stream = StreamMetrics::new(&registry)?;
        let proxy_protocol_refused = IntCounterVec::new(
            Opts::new(
                "sluice_proxy_protocol_refused_total",
                "HTTP and HTTPS connections closed on a listener that requires the PROXY \
                 protocol, by reason (missing, invalid, too_long, timeout, closed, untrusted)",
            ),
            &["reason"],
        )?;
        registry.register(Box::new(proxy_protocol_refused.clone()))?;
        Ok(Metrics {
            stream,
            proxy_protocol_refused,
            registry,
            snapshot_version,
            snapshot_loads,
            responses,
            write_batching,
            source_reachable,
            modify_indexes,
            metric_errors,
            parked_connections,
        })
    }

    /// Sets `apisix_etcd_reachable`: whether the configuration source answers.
    pub fn set_source_reachable(&self, reachable: bool) {
        self.source_reachable.set(i64::from(reachable));
    }

    /// Sets `apisix_etcd_modify_indexes{key}` to `version`. Keys are named as APISIX's etcd
    /// directories (`consumers`, `global_rules`, `routes`, `ssls`, `upstreams`; Sluice has
    /// no `services`, `protos` or `stream_routes`), plus `max_modify_index`.
    pub fn set_modify_index(&self, key: &str, version: u64) {
        self.modify_indexes
            .with_label_values(&[key])
            .set(i64::try_from(version).unwrap_or(i64::MAX));
    }

    /// Counts one connection closed for its PROXY header: `reason` is `missing`, `invalid`,
    /// `too_long`, `timeout`, `closed` or `untrusted`.
    pub fn proxy_protocol_refused(&self, reason: &str) {
        self.proxy_protocol_refused
            .with_label_values(&[reason])
            .inc();
    }

    /// Registers more collectors (e.g. the upstream families) in this registry.
    pub fn register(
        &self,
        collectors: Vec<Box<dyn prometheus::core::Collector>>,
    ) -> Result<(), prometheus::Error> {
        for c in collectors {
            self.registry.register(c)?;
        }
        Ok(())
    }

    /// Counts one response.
    #[inline]
    pub fn observe_status(&self, status: StatusCode) {
        let class = (status.as_u16() / 100).clamp(1, 5) as usize - 1;
        if let Some(c) = self.responses.get(class) {
            c.inc();
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        // NB: the workers choose their mode once, at start, after this registry exists.
        for mode in sluice_io::wbatch::modes_in_use() {
            self.write_batching.with_label_values(&[mode]).set(1);
        }
        let mut buf = Vec::new();
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .is_err()
        {
            self.metric_errors.inc();
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}
