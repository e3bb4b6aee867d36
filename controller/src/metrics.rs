//! Controller metrics, served in the Prometheus text format on `--metrics-listen`.

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// A metric could not be registered (a programming error: duplicate name or bad label).
#[derive(Debug, thiserror::Error)]
#[error("registering controller metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

/// Every controller metric, registered in one registry.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// `sluice_controller_rebuilds_total{outcome}`: rebuilds of the snapshot;
    /// `outcome` is `published` (content changed, new version) or `unchanged`.
    pub rebuilds: IntCounterVec,
    /// `sluice_controller_rebuild_duration_seconds`: time to assemble, translate and seal.
    pub rebuild_duration: Histogram,
    /// `sluice_controller_snapshot_version`: version of the snapshot being offered.
    pub snapshot_version: IntGauge,
    /// `sluice_controller_connected_dataplanes`: open snapshot streams.
    pub connected_dataplanes: IntGauge,
    /// `sluice_controller_acks_total`: snapshots dataplanes acknowledged.
    pub acks: IntCounter,
    /// `sluice_controller_nacks_total`: snapshots dataplanes rejected.
    pub nacks: IntCounter,
    /// `sluice_controller_reconcile_errors_total{source}`: failures of `watch` (API server
    /// watches), `status` (status writes), `lease` (leader election) and `record` (this
    /// replica's record of its dataplanes).
    pub reconcile_errors: IntCounterVec,
    /// `sluice_controller_watch_events_total{kind,outcome}`: watch events per kind;
    /// `outcome` is `applied` (may change the output, triggers a rebuild) or `skipped`
    /// (status-only or metadata-only change, resync).
    pub watch_events: IntCounterVec,
    /// `sluice_controller_status_writes_total`: object statuses written.
    pub status_writes: IntCounter,
    /// `sluice_controller_events_total`: Warning events published for rejected objects.
    pub events: IntCounter,
    /// `sluice_controller_ingress_status_writes_total`: Ingress `status.loadBalancer` writes.
    pub ingress_status_writes: IntCounter,
    /// `sluice_controller_leader`: 1 while this replica holds the leader Lease.
    pub leader: IntGauge,
    /// `sluice_controller_expected_dataplanes`: dataplanes the leader's `Programmed` counts
    /// (the ready endpoints of `--dataplane-service`, else the connected dataplanes); set
    /// by the status writer.
    pub expected_dataplanes: IntGauge,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let rebuilds = IntCounterVec::new(
            Opts::new(
                "sluice_controller_rebuilds_total",
                "Snapshot rebuilds by outcome (published: new version; unchanged: same content)",
            ),
            &["outcome"],
        )?;
        let rebuild_duration = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_controller_rebuild_duration_seconds",
                "Time to assemble the cluster state, translate it and seal the snapshot",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
        )?;
        let snapshot_version = IntGauge::new(
            "sluice_controller_snapshot_version",
            "Version of the snapshot offered to dataplanes (0 = none yet)",
        )?;
        let connected_dataplanes = IntGauge::new(
            "sluice_controller_connected_dataplanes",
            "Dataplanes holding a snapshot stream",
        )?;
        let acks = IntCounter::new(
            "sluice_controller_acks_total",
            "Snapshots acknowledged by dataplanes",
        )?;
        let nacks = IntCounter::new(
            "sluice_controller_nacks_total",
            "Snapshots rejected by dataplanes",
        )?;
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "sluice_controller_reconcile_errors_total",
                "Errors by source: watch, status, lease, record",
            ),
            &["source"],
        )?;
        let watch_events = IntCounterVec::new(
            Opts::new(
                "sluice_controller_watch_events_total",
                "Watch events by kind and outcome (applied: may change the snapshot; skipped)",
            ),
            &["kind", "outcome"],
        )?;
        let status_writes = IntCounter::new(
            "sluice_controller_status_writes_total",
            "Object statuses written with server-side apply",
        )?;
        let events = IntCounter::new(
            "sluice_controller_events_total",
            "Warning events published for rejected objects",
        )?;
        let ingress_status_writes = IntCounter::new(
            "sluice_controller_ingress_status_writes_total",
            "Ingress status.loadBalancer writes",
        )?;
        let leader = IntGauge::new(
            "sluice_controller_leader",
            "1 while this replica is the leader (writes status)",
        )?;
        let expected_dataplanes = IntGauge::new(
            "sluice_controller_expected_dataplanes",
            "Dataplanes that should serve, as Programmed counts them (set while leading)",
        )?;
        registry.register(Box::new(expected_dataplanes.clone()))?;
        registry.register(Box::new(rebuilds.clone()))?;
        registry.register(Box::new(rebuild_duration.clone()))?;
        registry.register(Box::new(snapshot_version.clone()))?;
        registry.register(Box::new(connected_dataplanes.clone()))?;
        registry.register(Box::new(acks.clone()))?;
        registry.register(Box::new(nacks.clone()))?;
        registry.register(Box::new(reconcile_errors.clone()))?;
        registry.register(Box::new(watch_events.clone()))?;
        registry.register(Box::new(status_writes.clone()))?;
        registry.register(Box::new(events.clone()))?;
        registry.register(Box::new(ingress_status_writes.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        Ok(Self {
            registry,
            rebuilds,
            rebuild_duration,
            snapshot_version,
            connected_dataplanes,
            acks,
            nacks,
            reconcile_errors,
            watch_events,
            status_writes,
            events,
            ingress_status_writes,
            leader,
            expected_dataplanes,
        })
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // NB: encoding into a Vec only fails on invalid metric families, which `new` rules out.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_by_name() {
        let m = Metrics::new().unwrap();
        m.acks.inc();
        m.nacks.inc();
        m.nacks.inc();
        m.reconcile_errors.with_label_values(&["watch"]).inc();
        let text = m.render();
        assert!(text.contains("sluice_controller_acks_total 1"), "{text}");
        assert!(text.contains("sluice_controller_nacks_total 2"), "{text}");
        assert!(
            text.contains("sluice_controller_reconcile_errors_total{source=\"watch\"} 1"),
            "{text}"
        );
    }
}
