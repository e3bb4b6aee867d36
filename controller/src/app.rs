//! The controller's parts wired together against a Kubernetes client: watches, the rebuild
//! loop, leader election, the records of what dataplanes serve and the status writer. The
//! binary adds the listeners; tests run the same wiring in-process.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use sluice_translate::gateway::GatewayOptions;

use crate::events;
use crate::gateway_status;
use crate::grpc::Hub;
use crate::ingress_status::{self, Publish};
use crate::leader::{self, LeaseConfig};
use crate::metrics::Metrics;
use crate::rebuild::{self, Debounce, Rebuilder, TlsSettings};
use crate::records::{self, FleetView, RecordConfig};
use crate::status;
use crate::watch::{Scope, Stores, Trigger};

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Our ingress class (`--ingress-class`).
    pub ingress_class: String,
    /// Namespaces to watch (`--watch-namespace`).
    pub scope: Scope,
    /// Batching of changes.
    pub debounce: Debounce,
    /// Leader election (`--leader-elect`); `None` = this replica always leads. With it,
    /// replicas also share what their dataplanes serve through records next to the Lease.
    pub lease: Option<LeaseConfig>,
    /// Where Ingress `status.loadBalancer` comes from; `None` = not written.
    pub publish: Option<Publish>,
    /// This replica's name in the Events it publishes (`reportingInstance`).
    pub instance: Option<String>,
    /// Default certificate and fallback SNI (`--default-ssl-certificate`, `--fallback-sni`).
    pub tls: TlsSettings,
    /// The dataplane Service `(namespace, name)` whose ready endpoints are the dataplanes
    /// that should serve (`--dataplane-service`); `None` = `Programmed` counts the connected
    /// dataplanes.
    pub dataplane_service: Option<(String, String)>,
    /// Gateway API settings: our `controllerName`, the fleet's HTTP/HTTPS ports
    /// (`--gateway-controller-name`, `--gateway-http-port`, `--gateway-https-port`).
    pub gateway: GatewayOptions,
    /// One Service per Gateway (`--gateway-service-namespace` and friends); `None`: every
    /// Gateway shares the dataplane Service's address.
    pub gateway_services: Option<crate::gateway_services::GatewayServices>,
}

/// A running controller; its tasks stop when it is dropped.
#[derive(Debug)]
pub struct Running {
    /// The snapshot channel: serve it with [`crate::grpc::serve`]. Every replica serves.
    pub hub: Arc<Hub>,
    /// Metrics of this controller.
    pub metrics: Metrics,
    /// Whether this replica leads (writes status and events).
    pub leader: watch::Receiver<bool>,
    /// What this replica knows of the dataplane fleet.
    pub fleet: FleetView,
    tasks: Vec<JoinHandle<()>>,
    _fixed_leader: Option<watch::Sender<bool>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts the watches, the rebuild loop, leader election (if configured), the records of
/// what dataplanes serve and the status writer. Must be called within a tokio runtime.
pub fn start(client: Client, settings: Settings, metrics: Metrics) -> Running {
    let hub = Hub::new(metrics.clone());
    // NB: every replica serves dataplanes, leader or not; one that has nothing to offer yet
    // sends them on to another replica rather than holding them.
    hub.refuse_until_published();
    let (trigger, trigger_rx) = Trigger::new();
    let stores = Stores::watch(&client, &settings.scope, &trigger, &metrics);
    let mut tasks = Vec::new();

    // The fleet: this replica's record, the other replicas' records, the expected set.
    let (fleet_trigger, fleet_changes) = Trigger::new();
    let record_cfg = settings.lease.as_ref().map(|l| RecordConfig {
        namespace: l.namespace.clone(),
        lease_name: l.name.clone(),
        identity: l.identity.clone(),
    });
    let record_store = record_cfg
        .as_ref()
        .map(|cfg| records::watch_records(&client, cfg, &fleet_trigger, &metrics));
    let service = settings.dataplane_service.as_ref().map(|(ns, name)| {
        let slices = records::watch_dataplane_service(&client, ns, name, &fleet_trigger, &metrics);
        (ns.clone(), name.clone(), slices)
    });
    let identity = record_cfg
        .as_ref()
        .map(|c| c.identity.clone())
        .or_else(|| settings.instance.clone());
    let (local_tx, local_rx) = watch::channel(None);
    tasks.push(tokio::spawn(records::track_local(
        Arc::clone(&hub),
        identity
            .clone()
            .unwrap_or_else(|| "sluice-controller".to_owned()),
        record_store.clone().zip(record_cfg.clone()),
        local_tx,
        fleet_trigger,
    )));
    let fleet = FleetView::new(
        identity,
        local_rx.clone(),
        record_store.clone(),
        service,
        fleet_changes,
    );
    if let Some(cfg) = record_cfg.clone() {
        tasks.push(tokio::spawn(records::write(
            client.clone(),
            cfg,
            local_rx,
            metrics.clone(),
        )));
    }
    tasks.push(tokio::spawn(records::feed_clock(
        Arc::clone(&hub),
        fleet.clone(),
    )));

    let rebuilder = Rebuilder::new(Arc::clone(&hub), metrics.clone(), &settings.ingress_class)
        .with_tls(settings.tls.clone())
        .with_gateway(settings.gateway.clone());
    let status_rx = rebuilder.subscribe_status();
    let (for_inputs, for_sync) = (stores.clone(), stores.clone());
    let (clock_hub, clock_fleet, clock_records) =
        (Arc::clone(&hub), fleet.clone(), record_store.clone());
    tasks.push(tokio::spawn(rebuild::run(
        rebuilder,
        move || for_inputs.inputs(),
        trigger_rx,
        settings.debounce,
        async move {
            for_sync.synced().await;
            // NB: the first version follows the other replicas' (their records), so a
            // replica that restarts does not start over at v1. Bounded: records that
            // cannot be listed must not keep the snapshot from being built.
            if let Some(records) = clock_records {
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), records.wait_until_ready()).await;
            }
            clock_hub.observe_replicas(
                clock_fleet
                    .other_records()
                    .into_iter()
                    .filter_map(|(r, _)| r.published.map(|a| (a.hash, a.version))),
            );
        },
    )));

    let (leader_tx, leader_rx) = watch::channel(settings.lease.is_none());
    metrics.leader.set(i64::from(settings.lease.is_none()));
    let fixed_leader = match settings.lease {
        Some(cfg) => {
            tasks.push(tokio::spawn(leader::run(
                client.clone(),
                cfg,
                leader_tx,
                metrics.clone(),
            )));
            None
        }
        // NB: kept in `Running` so the status writer sees a live channel.
        None => Some(leader_tx),
    };
    if let (Some(cfg), Some(store)) = (record_cfg, record_store) {
        tasks.push(tokio::spawn(records::collect_garbage(
            client.clone(),
            cfg,
            store,
            leader_rx.clone(),
            metrics.clone(),
        )));
    }

    let for_uids = stores.clone();
    tasks.push(tokio::spawn(events::run(
        client.clone(),
        settings.instance.clone(),
        status_rx.clone(),
        leader_rx.clone(),
        Arc::new(move |kind: &str, ns: &str, name: &str| for_uids.uid_of(kind, ns, name)),
        metrics.clone(),
    )));
    if let Some(publish) = settings.publish.clone() {
        tasks.push(tokio::spawn(ingress_status::run(
            client.clone(),
            publish,
            status_rx.clone(),
            leader_rx.clone(),
            stores.clone(),
            metrics.clone(),
        )));
    }

    if let Some(cfg) = settings.gateway_services.clone() {
        tasks.push(tokio::spawn(crate::gateway_services::run(
            client.clone(),
            cfg,
            status_rx.clone(),
            leader_rx.clone(),
            metrics.clone(),
        )));
    }
    tasks.push(tokio::spawn(gateway_status::run(
        client.clone(),
        Arc::clone(&hub),
        fleet.clone(),
        status_rx.clone(),
        leader_rx.clone(),
        stores.clone(),
        settings.publish.clone(),
        settings.gateway_services.clone(),
        metrics.clone(),
    )));
    tasks.push(tokio::spawn(status::run(
        client,
        Arc::clone(&hub),
        fleet.clone(),
        status_rx,
        leader_rx.clone(),
        Arc::new(move |kind, ns: &str, name: &str| stores.status_of(kind, ns, name)),
        metrics.clone(),
    )));

    Running {
        hub,
        metrics,
        leader: leader_rx,
        fleet,
        tasks,
        _fixed_leader: fixed_leader,
    }
}
