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
        registry.register(Box::new(snapshot_version.clone()))?;
        registry.register(Box::new(write_batching.clone()))?;
        registry.register(Box::new(snapshot_loads.clone()))?;
        registry.register(Box::new(by_class))?;
        Ok(Metrics {
            registry,
            snapshot_version,
            snapshot_loads,
            responses,
            write_batching,
        })
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
        for mode in crate::net::wbatch::modes_in_use() {
            self.write_batching.with_label_values(&[mode]).set(1);
        }
        let mut buf = Vec::new();
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}
