//! The controller's parts wired together against a Kubernetes client: watches, the rebuild
//! loop, leader election and the status writer. The binary adds the listeners; tests run
//! the same wiring in-process.

use std::sync::Arc;

use kube::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::events;
use crate::grpc::Hub;
use crate::ingress_status::{self, Publish};
use crate::leader::{self, LeaseConfig};
use crate::metrics::Metrics;
use crate::rebuild::{self, Debounce, Rebuilder, TlsSettings};
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
    /// Leader election (`--leader-elect`); `None` = this replica always leads.
    pub lease: Option<LeaseConfig>,
    /// Where Ingress `status.loadBalancer` comes from; `None` = not written.
    pub publish: Option<Publish>,
    /// This replica's name in the Events it publishes (`reportingInstance`).
    pub instance: Option<String>,
    /// Default certificate and fallback SNI (`--default-ssl-certificate`, `--fallback-sni`).
    pub tls: TlsSettings,
}

/// A running controller; its tasks stop when it is dropped.
#[derive(Debug)]
pub struct Running {
    /// The snapshot channel: serve it with [`crate::grpc::serve`].
    pub hub: Arc<Hub>,
    /// Metrics of this controller.
    pub metrics: Metrics,
    /// Whether this replica leads (writes status, serves dataplanes).
    pub leader: watch::Receiver<bool>,
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

/// Starts the watches, the rebuild loop, leader election (if configured) and the status
/// writer. Must be called within a tokio runtime.
pub fn start(client: Client, settings: Settings, metrics: Metrics) -> Running {
    let hub = Hub::new(metrics.clone());
    let (trigger, trigger_rx) = Trigger::new();
    let stores = Stores::watch(&client, &settings.scope, &trigger, &metrics);
    let mut tasks = Vec::new();

    let rebuilder = Rebuilder::new(Arc::clone(&hub), metrics.clone(), &settings.ingress_class)
        .with_tls(settings.tls.clone());
    let status_rx = rebuilder.subscribe_status();
    let (for_inputs, for_sync) = (stores.clone(), stores.clone());
    tasks.push(tokio::spawn(rebuild::run(
        rebuilder,
        move || for_inputs.inputs(),
        trigger_rx,
        settings.debounce,
        async move { for_sync.synced().await },
    )));

    let (leader_tx, leader_rx) = watch::channel(settings.lease.is_none());
    metrics.leader.set(i64::from(settings.lease.is_none()));
    let fixed_leader = match settings.lease {
        Some(cfg) => {
            // Only the leader serves dataplanes, so `Programmed` counts every one of them.
            hub.set_serving(false);
            tasks.push(tokio::spawn(leader::run(
                client.clone(),
                cfg,
                leader_tx,
                metrics.clone(),
            )));
            let mut leading = leader_rx.clone();
            let hub = Arc::clone(&hub);
            tasks.push(tokio::spawn(async move {
                while leading.changed().await.is_ok() {
                    let is_leader = *leading.borrow_and_update();
                    hub.set_serving(is_leader);
                }
            }));
            None
        }
        // NB: kept in `Running` so the status writer sees a live channel.
        None => Some(leader_tx),
    };

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

    tasks.push(tokio::spawn(status::run(
        client,
        Arc::clone(&hub),
        status_rx,
        leader_rx.clone(),
        Arc::new(move |kind, ns: &str, name: &str| stores.status_of(kind, ns, name)),
        metrics.clone(),
    )));

    Running {
        hub,
        metrics,
        leader: leader_rx,
        tasks,
        _fixed_leader: fixed_leader,
    }
}
