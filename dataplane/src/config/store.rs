//! The live routing table, swapped atomically, plus what the admin endpoints report.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::Serialize;
use sluice_proto::v1;

use crate::config::metrics::Metrics;
use crate::config::table::{InvalidSnapshot, RouteTable};
use crate::plugins::PluginState;
use crate::upstream::{PoolConfig, PoolRegistry};
use sluice_io::lock;

/// What `/snapshot` reports.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SnapshotState {
    /// Version being served (0 = none yet).
    pub version: u64,
    /// Content hash being served.
    pub hash: String,
    /// Number of routes being served.
    pub routes: usize,
    /// Number of upstreams being served.
    pub upstreams: usize,
    /// The last error of a load: a rejected snapshot, or a source that could not be read.
    pub last_error: Option<String>,
    /// Objects left out of the snapshot being served, each with its reason.
    pub rejected_objects: Vec<String>,
}

/// Shared dataplane state: the current table, connection pools, status and metrics.
#[derive(Debug)]
pub struct Store {
    table: ArcSwap<RouteTable>,
    snapshot: Mutex<Option<Arc<v1::Snapshot>>>,
    state: Mutex<SnapshotState>,
    pools: PoolRegistry,
    metrics: Metrics,
    plugin_state: PluginState,
    draining: std::sync::atomic::AtomicBool,
    /// Signalled when a new table is served (the per-Gateway listener manager waits on it).
    changed: tokio::sync::Notify,
}

impl Store {
    /// A store serving nothing yet, with default upstream pool settings.
    pub fn new() -> anyhow::Result<Self> {
        Self::with_pool_config(PoolConfig::default())
    }

    /// A store serving nothing yet whose upstream pools use `pool`.
    pub fn with_pool_config(pool: PoolConfig) -> anyhow::Result<Self> {
        let pools = PoolRegistry::with_config(pool);
        let metrics = Metrics::new()?;
        metrics.register(pools.health.metrics.collectors())?;
        let plugin_state = PluginState::default();
        metrics.register(plugin_state.log_metrics.collectors())?;
        metrics.register(plugin_state.otel.collectors())?;
        Ok(Store {
            table: ArcSwap::from_pointee(RouteTable::empty()?),
            snapshot: Mutex::new(None),
            state: Mutex::new(SnapshotState::default()),
            pools,
            metrics,
            draining: std::sync::atomic::AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
            plugin_state,
        })
    }

    /// Connection pools and endpoint health that outlive snapshots.
    pub fn pools(&self) -> &PoolRegistry {
        &self.pools
    }

    /// The table to serve one request with.
    #[inline]
    pub fn table(&self) -> Arc<RouteTable> {
        self.table.load_full()
    }

    /// The current table for a short look (no reference count taken: cheaper than
    /// [`Store::table`] for a check before the request is served). Do not hold it across an
    /// await.
    pub fn peek_table(&self) -> arc_swap::Guard<Arc<RouteTable>> {
        self.table.load()
    }

    /// Plugin state that outlives snapshots.
    pub fn plugin_state(&self) -> &PluginState {
        &self.plugin_state
    }

    /// Metrics of this process.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The Prometheus exposition of `/metrics`: Sluice's own families plus APISIX's.
    pub fn render_metrics(&self) -> String {
        let mut out = self.metrics.render();
        self.plugin_state.apisix.render(&mut out);
        self.plugin_state.mirror.render(&mut out);
        crate::plugins::prometheus::render_upstream_status(&self.table().upstreams, &mut out);
        out
    }

    /// Compiles `snapshot` and swaps it in. On error the current table keeps serving and the
    /// error is recorded for `/snapshot`.
    pub fn apply(
        &self,
        snapshot: v1::Snapshot,
        rejected_objects: Vec<String>,
    ) -> Result<(), InvalidSnapshot> {
        let previous = self.table.load_full();
        match RouteTable::compile_after(&snapshot, &self.pools, &self.plugin_state, Some(&previous))
        {
            Ok(table) => {
                let routes = table.routes.len();
                let upstreams = table.upstream_count;
                // NB: the state's lock is held across the swap, so `/snapshot` never reports an
                // older version than the one serving: a reader that was served by the new
                // table waits here for the new state (the e2e fault test once read 7 routes
                // after a deleted route had already gone 404).
                let mut st = lock(&self.state);
                let table = Arc::new(table);
                self.table.store(Arc::clone(&table));
                previous.cancel_removed_streams(&table);
                // NB: before `prune`, which only drops plugin state no table holds any more
                // (a removed logger sends what it held then).
                drop(previous);
                self.changed.notify_one();
                self.plugin_state.prune();
                self.metrics
                    .snapshot_version
                    .set(i64::try_from(snapshot.version).unwrap_or(i64::MAX));
                self.metrics.snapshot_loads.with_label_values(&["ok"]).inc();
                self.record_modify_indexes(&snapshot);
                st.version = snapshot.version;
                st.hash = snapshot.hash.clone();
                st.routes = routes;
                st.upstreams = upstreams;
                st.last_error = None;
                st.rejected_objects = rejected_objects;
                *lock(&self.snapshot) = Some(Arc::new(snapshot));
                Ok(())
            }
            Err(e) => {
                self.metrics
                    .snapshot_loads
                    .with_label_values(&["rejected"])
                    .inc();
                self.record_error(format!("snapshot v{} rejected: {e}", snapshot.version));
                Err(e)
            }
        }
    }

    /// Resolves once a table is served after the last call (one waiter).
    pub async fn table_changed(&self) {
        self.changed.notified().await;
    }

    /// Sets `apisix_etcd_modify_indexes`: each kind of object that `snapshot` changes from
    /// the one served before (all of them for the first) gets its version.
    fn record_modify_indexes(&self, snapshot: &v1::Snapshot) {
        let prev = lock(&self.snapshot).clone();
        let v = snapshot.version;
        let changed = |same: fn(&v1::Snapshot, &v1::Snapshot) -> bool| {
            prev.as_deref().is_none_or(|p| !same(p, snapshot))
        };
        for (key, same) in [
            (
                "consumers",
                (|a: &v1::Snapshot, b: &v1::Snapshot| a.consumers == b.consumers)
                    as fn(&v1::Snapshot, &v1::Snapshot) -> bool,
            ),
            ("global_rules", |a, b| a.global_rules == b.global_rules),
            ("routes", |a, b| a.routes == b.routes),
            ("ssls", |a, b| {
                a.tls_certificates == b.tls_certificates
                    && a.default_certificate == b.default_certificate
                    && a.fallback_sni == b.fallback_sni
                    && a.listeners == b.listeners
            }),
            ("upstreams", |a, b| a.upstreams == b.upstreams),
        ] {
            if changed(same) {
                self.metrics.set_modify_index(key, v);
            }
        }
        self.metrics.set_modify_index("max_modify_index", v);
    }

    /// Sets `apisix_etcd_reachable`: whether the configuration source (the controller
    /// stream, or the files in standalone mode) answers.
    pub fn set_source_reachable(&self, reachable: bool) {
        self.metrics.set_source_reachable(reachable);
    }

    /// Notes that a load produced exactly the snapshot being served: clears the last error.
    pub fn confirm_current(&self, rejected_objects: Vec<String>) {
        let mut st = lock(&self.state);
        st.last_error = None;
        st.rejected_objects = rejected_objects;
    }

    /// Records a load failure that left the current table in place.
    pub fn record_error(&self, message: String) {
        tracing::error!(error = %message, "configuration not applied; the last good snapshot keeps serving");
        lock(&self.state).last_error = Some(message);
    }

    /// What `/snapshot` reports.
    pub fn state(&self) -> SnapshotState {
        lock(&self.state).clone()
    }

    /// The snapshot being served, if any.
    pub fn snapshot(&self) -> Option<Arc<v1::Snapshot>> {
        lock(&self.snapshot).clone()
    }

    /// Marks the process as draining (shutting down): `/readyz` answers 503 from now on.
    pub fn start_draining(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the process is draining.
    pub fn draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a snapshot has been loaded.
    pub fn ready(&self) -> bool {
        lock(&self.snapshot).is_some()
    }
}
