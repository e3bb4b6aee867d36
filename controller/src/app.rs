//! The controller's parts wired together against a Kubernetes client: watches, the rebuild
//! loop, leader election, the records of what dataplanes serve and the status writer. The
//! binary adds the listeners; tests run the same wiring in-process.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use sluice_translate::CrossNamespaceRefs;
use sluice_translate::gateway::GatewayOptions;

use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::Store;

use crate::context::Context;
use crate::fleet::Record;
use crate::grpc::Hub;
use crate::leader::{self, LeaseConfig};
use crate::metrics::Metrics;
use crate::rebuild::{self, Debounce, Rebuilder, TlsSettings};
use crate::records::{self, FleetView, RecordConfig};
use crate::status::apisix::Apisix;
use crate::status::events::Events;
use crate::status::gateway::GatewayApi;
use crate::status::ingress::IngressAddress;
use crate::status::{GatewayServices, Publish, writer};
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
    pub gateway_services: Option<GatewayServices>,
    /// Which cross-namespace references of the APISIX kinds are honoured
    /// (`--allow-cross-namespace-refs`); default: only those a ReferenceGrant allows.
    pub cross_namespace_refs: CrossNamespaceRefs,
    /// The fleet-wide stream ports ApisixRoute `spec.stream` rules may use
    /// (`--stream-ports`); empty: none.
    pub stream_ports: Vec<sluice_translate::StreamPort>,
    /// Ingress classes served in ingress-nginx's place (`--ingress-nginx-class`).
    pub nginx_classes: Vec<String>,
    /// ingress-nginx's ConfigMap settings for them (`--ingress-nginx-config`).
    pub nginx_config: std::collections::BTreeMap<String, String>,
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
    let fleet = Fleet::watch(&client, &settings, &metrics);
    let rebuilder = Rebuilder::new(Arc::clone(&hub), metrics.clone(), &settings.ingress_class)
        .with_tls(settings.tls.clone())
        .with_gateway(settings.gateway.clone())
        .with_cross_namespace_refs(settings.cross_namespace_refs)
        .with_stream_ports(settings.stream_ports.clone())
        .with_nginx_classes(
            settings.nginx_classes.clone(),
            settings.nginx_config.clone(),
        );
    let (leader_tx, leader_rx) = watch::channel(settings.lease.is_none());
    metrics.leader.set(i64::from(settings.lease.is_none()));
    let ctx = Context {
        client,
        metrics,
        hub,
        fleet: fleet.view.clone(),
        stores,
        rebuilt: rebuilder.subscribe_status(),
        leader: leader_rx,
    };
    let mut tasks = Vec::new();
    let records = fleet.spawn(&ctx, &mut tasks);
    spawn_rebuild(
        &ctx,
        rebuilder,
        trigger_rx,
        settings.debounce,
        records.clone(),
        &mut tasks,
    );
    let fixed_leader = spawn_leader(&ctx, settings.lease.clone(), leader_tx, &mut tasks);
    if let (Some(cfg), Some(store)) = (fleet.cfg, records) {
        tasks.push(tokio::spawn(records::collect_garbage(
            ctx.client.clone(),
            cfg,
            store,
            ctx.leader.clone(),
            ctx.metrics.clone(),
        )));
    }
    spawn_writers(&ctx, &settings, &mut tasks);
    Running {
        hub: ctx.hub,
        metrics: ctx.metrics,
        leader: ctx.leader,
        fleet: ctx.fleet,
        tasks,
        _fixed_leader: fixed_leader,
    }
}

/// The fleet's watches (this replica's record, the other replicas' records, the expected
/// set) before its tasks run.
struct Fleet {
    view: FleetView,
    cfg: Option<RecordConfig>,
    records: Option<Store<Lease>>,
    identity: Option<String>,
    local: watch::Sender<Option<Arc<Record>>>,
    local_rx: watch::Receiver<Option<Arc<Record>>>,
    trigger: Trigger,
}

impl Fleet {
    fn watch(client: &Client, settings: &Settings, metrics: &Metrics) -> Self {
        let (trigger, changes) = Trigger::new();
        let cfg = settings.lease.as_ref().map(|l| RecordConfig {
            namespace: l.namespace.clone(),
            lease_name: l.name.clone(),
            identity: l.identity.clone(),
        });
        let records = cfg
            .as_ref()
            .map(|cfg| records::watch_records(client, cfg, &trigger, metrics));
        let service = settings.dataplane_service.as_ref().map(|(ns, name)| {
            let slices = records::watch_dataplane_service(client, ns, name, &trigger, metrics);
            (ns.clone(), name.clone(), slices)
        });
        let identity = cfg
            .as_ref()
            .map(|c| c.identity.clone())
            .or_else(|| settings.instance.clone());
        let (local, local_rx) = watch::channel(None);
        let view = FleetView::new(
            identity.clone(),
            local_rx.clone(),
            records.clone(),
            service,
            changes,
        );
        Self {
            view,
            cfg,
            records,
            identity,
            local,
            local_rx,
            trigger,
        }
    }

    /// Spawns the tasks that keep this replica's record and the version clock; returns the
    /// store of the other replicas' records.
    fn spawn(&self, ctx: &Context, tasks: &mut Vec<JoinHandle<()>>) -> Option<Store<Lease>> {
        let identity = self.identity.clone();
        tasks.push(tokio::spawn(records::track_local(
            Arc::clone(&ctx.hub),
            identity.unwrap_or_else(|| "sluice-controller".to_owned()),
            self.records.clone().zip(self.cfg.clone()),
            self.local.clone(),
            self.trigger.clone(),
        )));
        if let Some(cfg) = self.cfg.clone() {
            tasks.push(tokio::spawn(records::write(
                ctx.client.clone(),
                cfg,
                self.local_rx.clone(),
                ctx.metrics.clone(),
            )));
        }
        tasks.push(tokio::spawn(records::feed_clock(
            Arc::clone(&ctx.hub),
            ctx.fleet.clone(),
        )));
        self.records.clone()
    }
}

/// Spawns the rebuild loop: it starts once the stores have listed, at a version that
/// follows the other replicas' (their `records`).
fn spawn_rebuild(
    ctx: &Context,
    rebuilder: Rebuilder,
    trigger: watch::Receiver<u64>,
    debounce: Debounce,
    records: Option<Store<Lease>>,
    tasks: &mut Vec<JoinHandle<()>>,
) {
    let (for_inputs, for_sync) = (ctx.stores.clone(), ctx.stores.clone());
    let (hub, fleet) = (Arc::clone(&ctx.hub), ctx.fleet.clone());
    tasks.push(tokio::spawn(rebuild::run(
        rebuilder,
        move || for_inputs.inputs(),
        trigger,
        debounce,
        async move {
            for_sync.synced().await;
            // NB: the first version follows the other replicas' (their records), so a
            // replica that restarts does not start over at v1. Bounded: records that
            // cannot be listed must not keep the snapshot from being built.
            if let Some(records) = records {
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), records.wait_until_ready()).await;
            }
            hub.observe_replicas(
                fleet
                    .other_records()
                    .into_iter()
                    .filter_map(|(r, _)| r.published.map(|a| (a.hash, a.version))),
            );
        },
    )));
}

/// Spawns leader election when configured; without it, returns the sender that keeps the
/// (always true) leader channel alive.
fn spawn_leader(
    ctx: &Context,
    lease: Option<LeaseConfig>,
    leader: watch::Sender<bool>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Option<watch::Sender<bool>> {
    match lease {
        Some(cfg) => {
            tasks.push(tokio::spawn(leader::run(
                ctx.client.clone(),
                cfg,
                leader,
                ctx.metrics.clone(),
            )));
            None
        }
        // NB: kept in `Running` so the status writer sees a live channel.
        None => Some(leader),
    }
}

/// Spawns the status writer: one loop per family of writes (see [`crate::status`]).
fn spawn_writers(ctx: &Context, settings: &Settings, tasks: &mut Vec<JoinHandle<()>>) {
    let events = Events::new(ctx.client.clone(), settings.instance.clone());
    tasks.push(tokio::spawn(writer::run(events, ctx.clone())));
    if let Some(publish) = settings.publish.clone() {
        let ingress = IngressAddress { publish };
        tasks.push(tokio::spawn(writer::run(ingress, ctx.clone())));
    }
    if let Some(services) = settings.gateway_services.clone() {
        tasks.push(tokio::spawn(writer::run(services, ctx.clone())));
    }
    let gateway = GatewayApi {
        publish: settings.publish.clone(),
        services: settings.gateway_services.clone(),
    };
    tasks.push(tokio::spawn(writer::run(gateway, ctx.clone())));
    tasks.push(tokio::spawn(writer::run(Apisix, ctx.clone())));
}
