//! kube-runtime reflectors for every input kind, and the change trigger of the rebuild loop.
//!
//! One watcher per kind (and per namespace with `--watch-namespace`) feeds a reflector
//! store. Events that cannot change the output do not trigger a rebuild: an object is
//! fingerprinted without `status`, `metadata.resourceVersion`, `metadata.managedFields` and
//! the `kubectl.kubernetes.io/last-applied-configuration` annotation, so status writes (our
//! own included), resyncs and re-lists of unchanged objects are skipped.
//!
//! To keep memory low, `managedFields` and the last-applied annotation are dropped before
//! objects enter the stores, EndpointSlices are watched only when they belong to a Service,
//! and Helm release Secrets are not watched. Pods (whose labels select ApisixUpstream
//! `subsets`) are watched as metadata only (`Api<PartialObjectMeta<Pod>>`, metadata-only requests), slimmed to name, namespace
//! and labels, and only a label change (or a Pod appearing or going away) triggers a
//! rebuild: status and annotation churn of Pods is skipped.
//!
//! The Gateway API kinds (GatewayClass, Gateway, ListenerSet, HTTPRoute, GRPCRoute, TLSRoute,
//! TCPRoute, UDPRoute, ReferenceGrant,
//! BackendTLSPolicy, plus Namespaces as metadata for `allowedRoutes` selectors) are watched
//! only when API discovery finds them: a cluster without the Gateway API CRDs logs that
//! once at INFO and serves the Apisix kinds and Ingress as before. Discovery is repeated
//! every [`GATEWAY_DISCOVERY_INTERVAL`] until the CRDs appear; their watches start then.
//! They are not filtered by ingress class: a Gateway is ours by its GatewayClass's
//! `controllerName`, which translation decides. ConfigMaps (CA bundles of BackendTLSPolicy
//! and of Gateway frontend client-certificate validation) are watched only when Gateways are
//! served.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sluice_crds::gateway::{
    BackendTLSPolicy, GRPCRoute, Gateway, GatewayClass, HTTPRoute, ListenerSet, ReferenceGrant,
    RouteStatus, TCPRoute, TLSRoute, UDPRoute,
};
use sluice_crds::{
    ApisixConsumer, ApisixGlobalRule, ApisixPluginConfig, ApisixRoute, ApisixStatus, ApisixTls,
    ApisixUpstream,
};
use sluice_translate::ObjectKind;
use tokio::sync::watch;

use crate::cluster::Inputs;
use crate::metrics::Metrics;

/// Annotation `kubectl apply` writes: a copy of the spec, dropped from the stores.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Which namespaces to watch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Scope {
    /// Every namespace (the default).
    #[default]
    All,
    /// Only these namespaces (`--watch-namespace`). IngressClasses, which are cluster-wide,
    /// are still watched everywhere.
    Namespaces(Vec<String>),
}

/// A fingerprint of what translation can see of an object.
pub fn fingerprint<K: Serialize>(obj: &K) -> u64 {
    let mut value = match serde_json::to_value(obj) {
        Ok(v) => v,
        // NB: k8s types always serialize; if one did not, treat it as always changed.
        Err(_) => return rand_like(),
    };
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
        if let Some(meta) = map.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            meta.remove("resourceVersion");
            meta.remove("managedFields");
            if let Some(ann) = meta.get_mut("annotations").and_then(|a| a.as_object_mut()) {
                ann.remove(LAST_APPLIED_ANNOTATION);
            }
        }
    }
    let mut h = DefaultHasher::new();
    value.to_string().hash(&mut h);
    h.finish()
}

fn rand_like() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Per-kind memory of fingerprints: decides whether an event may change the output.
#[derive(Debug, Default)]
pub struct Fingerprints {
    current: HashMap<(String, String), u64>,
    relisting: Option<HashMap<(String, String), u64>>,
}

impl Fingerprints {
    /// Records `event`; returns whether it may change the output (then a rebuild is due).
    pub fn observe<K: Resource + Serialize>(&mut self, event: &Event<K>) -> bool {
        self.observe_by(event, fingerprint)
    }

    /// [`Fingerprints::observe`] with `fp` as the fingerprint of what translation sees.
    pub fn observe_by<K: Resource>(&mut self, event: &Event<K>, fp: impl Fn(&K) -> u64) -> bool {
        let key = |o: &K| {
            (
                o.meta().namespace.clone().unwrap_or_default(),
                o.meta().name.clone().unwrap_or_default(),
            )
        };
        match event {
            Event::Apply(o) => {
                let f = fp(o);
                self.current.insert(key(o), f) != Some(f)
            }
            Event::Delete(o) => {
                self.current.remove(&key(o));
                true
            }
            Event::Init => {
                self.relisting = Some(HashMap::new());
                false
            }
            Event::InitApply(o) => {
                self.relisting
                    .get_or_insert_with(HashMap::new)
                    .insert(key(o), fp(o));
                false
            }
            Event::InitDone => {
                let listed = self.relisting.take().unwrap_or_default();
                let changed = listed != self.current;
                self.current = listed;
                changed
            }
        }
    }
}

/// Drops fields translation never reads, before the object enters a store.
fn slim<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(ann) = meta.annotations.as_mut() {
        ann.remove(LAST_APPLIED_ANNOTATION);
    }
}

/// The fingerprint of a Pod for translation: its labels only.
pub fn pod_fingerprint(pod: &PartialObjectMeta<Pod>) -> u64 {
    meta_fingerprint(pod)
}

/// The fingerprint of a metadata-only object (Pod, Namespace) for translation: its labels.
fn meta_fingerprint<K>(obj: &PartialObjectMeta<K>) -> u64 {
    let mut h = DefaultHasher::new();
    obj.metadata.labels.hash(&mut h);
    h.finish()
}

/// Keeps only what subsets need of a Pod: name, namespace and labels.
#[cfg(test)]
fn slim_pod(pod: &mut PartialObjectMeta<Pod>) {
    slim_meta(pod)
}

/// Keeps only what translation needs of a metadata-only object: name, namespace, labels.
fn slim_meta<K>(obj: &mut PartialObjectMeta<K>) {
    let m = &mut obj.metadata;
    *m = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: m.name.take(),
        namespace: m.namespace.take(),
        labels: m.labels.take(),
        uid: m.uid.take(),
        resource_version: m.resource_version.take(),
        ..Default::default()
    };
}

/// The change signal of the rebuild loop: bumped by every event that may change the output.
#[derive(Debug, Clone)]
pub struct Trigger(Arc<watch::Sender<u64>>);

impl Trigger {
    /// A trigger and the receiver the rebuild loop waits on.
    pub fn new() -> (Self, watch::Receiver<u64>) {
        let (tx, rx) = watch::channel(0);
        (Self(Arc::new(tx)), rx)
    }

    /// Signals a change.
    pub fn fire(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }
}

fn spawn_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: &'static str,
    trigger: Trigger,
    metrics: Metrics,
) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    spawn_watch_by(api, config, kind, fingerprint::<K>, trigger, metrics)
}

/// A reflector store of `api` (filtered by `config`), firing `trigger` whenever `fp` of an
/// object changes (or one appears or goes away); retries with [`WatchBackoff`].
/// `kind` labels the `watch_events` metric.
pub(crate) fn spawn_watch_by<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: &'static str,
    fp: fn(&K) -> u64,
    trigger: Trigger,
    metrics: Metrics,
) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher::watcher(api, config)
        .backoff(WatchBackoff::default())
        .modify(slim::<K>)
        .reflect(writer);
    drive(stream, kind, fp, trigger, metrics);
    reader
}

/// Delays between retries of a failed list or watch: 250 ms doubling to 5 s, each within
/// ±25 %, back to 250 ms after the first event that succeeds.
///
/// NB: not kube-runtime's `default_backoff` (800 ms doubling to 30 s, up to ×2 each): after
/// a kube-apiserver restart a watch fails once or twice more on its way back (403 while the
/// new server's RBAC cache fills, then 410 for a resource version its watch cache lacks),
/// and with that backoff changes took 7–52 s after the server was ready to reach the
/// dataplanes. A dozen watches retrying every 5 s is no load for a recovering server.
#[derive(Debug, Clone)]
struct WatchBackoff {
    next: std::time::Duration,
}

impl WatchBackoff {
    const FIRST: std::time::Duration = std::time::Duration::from_millis(250);
    const MAX: std::time::Duration = std::time::Duration::from_secs(5);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff { next: Self::FIRST }
    }
}

impl Iterator for WatchBackoff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<std::time::Duration> {
        use std::hash::BuildHasher as _;
        let delay = self.next;
        self.next = (delay * 2).min(Self::MAX);
        // NB: a fresh RandomState is seeded differently each time: enough for jitter.
        let r = std::collections::hash_map::RandomState::new().hash_one(0u8) % 1000;
        Some(delay.mul_f64(0.75 + r as f64 / 2000.0))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// Watches Pods as metadata only (see the module doc).
fn spawn_pod_watch(
    api: Api<PartialObjectMeta<Pod>>,
    config: watcher::Config,
    trigger: Trigger,
    metrics: Metrics,
) -> Store<PartialObjectMeta<Pod>> {
    spawn_meta_watch(api, config, "Pod", trigger, metrics)
}

/// Watches a kind as metadata only, keeping name, namespace and labels, and firing
/// `trigger` only when labels change (or an object appears or goes away).
fn spawn_meta_watch<K>(
    api: Api<PartialObjectMeta<K>>,
    config: watcher::Config,
    kind: &'static str,
    trigger: Trigger,
    metrics: Metrics,
) -> Store<PartialObjectMeta<K>>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    PartialObjectMeta<K>: Resource<DynamicType = ()> + DeserializeOwned + Clone,
{
    let (reader, writer) = reflector::store();
    // `Api<PartialObjectMeta<_>>` makes metadata-only list/watch requests.
    let stream = watcher::watcher(api, config)
        .backoff(WatchBackoff::default())
        .modify(slim_meta::<K>)
        .reflect(writer);
    drive(stream, kind, meta_fingerprint::<K>, trigger, metrics);
    reader
}

/// Runs a reflected watch stream, firing `trigger` when an event may change the output.
fn drive<K, S>(stream: S, kind: &'static str, fp: fn(&K) -> u64, trigger: Trigger, metrics: Metrics)
where
    K: Resource + Send + 'static,
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    tokio::spawn(async move {
        let mut fingerprints = Fingerprints::default();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    let applied = fingerprints.observe_by(&event, fp);
                    if let Event::Apply(o) | Event::Delete(o) = &event {
                        tracing::trace!(kind, name = %o.meta().name.as_deref().unwrap_or_default(), applied, "watch event");
                    }
                    if matches!(event, Event::Init | Event::InitApply(_)) {
                        continue;
                    }
                    let outcome = if applied { "applied" } else { "skipped" };
                    metrics
                        .watch_events
                        .with_label_values(&[kind, outcome])
                        .inc();
                    if applied {
                        trigger.fire();
                    }
                }
                Err(e) => {
                    metrics.reconcile_errors.with_label_values(&["watch"]).inc();
                    tracing::warn!(kind, error = %e, "watch failed; retrying with backoff");
                }
            }
        }
        tracing::error!(kind, "watch stream ended");
    });
}

fn watch_kind<K>(
    client: &Client,
    scope: &Scope,
    config: &watcher::Config,
    kind: &'static str,
    trigger: &Trigger,
    metrics: &Metrics,
) -> Vec<Store<K>>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    match scope {
        Scope::All => vec![spawn_watch(
            Api::<K>::all(client.clone()),
            config.clone(),
            kind,
            trigger.clone(),
            metrics.clone(),
        )],
        Scope::Namespaces(namespaces) => namespaces
            .iter()
            .map(|ns| {
                spawn_watch(
                    Api::<K>::namespaced(client.clone(), ns),
                    config.clone(),
                    kind,
                    trigger.clone(),
                    metrics.clone(),
                )
            })
            .collect(),
    }
}

/// How often discovery looks for the Gateway API CRDs while they are not installed.
pub const GATEWAY_DISCOVERY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// API group of the Gateway API.
pub const GATEWAY_API_GROUP: &str = "gateway.networking.k8s.io";

/// Which Gateway API kinds the API server serves, at the versions Sluice reads
/// (`v1`, ReferenceGrant `v1beta1`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GatewayKinds {
    /// `gatewayclasses` (v1).
    pub gateway_classes: bool,
    /// `gateways` (v1).
    pub gateways: bool,
    /// `listenersets` (v1).
    pub listener_sets: bool,
    /// `httproutes` (v1).
    pub http_routes: bool,
    /// `grpcroutes` (v1).
    pub grpc_routes: bool,
    /// `tlsroutes` (v1).
    pub tls_routes: bool,
    /// `tcproutes` (v1).
    pub tcp_routes: bool,
    /// `udproutes` (v1).
    pub udp_routes: bool,
    /// `referencegrants` (v1beta1).
    pub reference_grants: bool,
    /// `backendtlspolicies` (v1).
    pub backend_tls_policies: bool,
}

impl GatewayKinds {
    /// From the resource names served at `v1` and `v1beta1` of the group.
    pub fn from_served(v1: &[String], v1beta1: &[String]) -> Self {
        let has = |list: &[String], plural: &str| list.iter().any(|r| r == plural);
        Self {
            gateway_classes: has(v1, "gatewayclasses"),
            gateways: has(v1, "gateways"),
            listener_sets: has(v1, "listenersets"),
            http_routes: has(v1, "httproutes"),
            grpc_routes: has(v1, "grpcroutes"),
            tls_routes: has(v1, "tlsroutes"),
            tcp_routes: has(v1, "tcproutes"),
            udp_routes: has(v1, "udproutes"),
            reference_grants: has(v1beta1, "referencegrants"),
            backend_tls_policies: has(v1, "backendtlspolicies"),
        }
    }

    /// Whether there is anything to serve: GatewayClasses and Gateways are both served.
    pub fn usable(&self) -> bool {
        self.gateway_classes && self.gateways
    }

    /// Kinds not served (not watched).
    pub fn missing(&self) -> Vec<&'static str> {
        [
            (self.gateway_classes, "GatewayClass"),
            (self.gateways, "Gateway"),
            (self.listener_sets, "ListenerSet"),
            (self.http_routes, "HTTPRoute"),
            (self.grpc_routes, "GRPCRoute"),
            (self.tls_routes, "TLSRoute"),
            (self.tcp_routes, "TCPRoute"),
            (self.udp_routes, "UDPRoute"),
            (self.reference_grants, "ReferenceGrant"),
            (self.backend_tls_policies, "BackendTLSPolicy"),
        ]
        .into_iter()
        .filter(|(served, _)| !served)
        .map(|(_, kind)| kind)
        .collect()
    }
}

/// Resource names served at `group_version`; empty when the API server does not serve it.
async fn served(client: &Client, group_version: &str) -> Result<Vec<String>, kube::Error> {
    match client.list_api_group_resources(group_version).await {
        Ok(list) => Ok(list.resources.into_iter().map(|r| r.name).collect()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Asks the API server (discovery) which Gateway API kinds it serves.
pub async fn discover_gateway_api(client: &Client) -> Result<GatewayKinds, kube::Error> {
    let v1 = served(client, &format!("{GATEWAY_API_GROUP}/v1")).await?;
    let v1beta1 = served(client, &format!("{GATEWAY_API_GROUP}/v1beta1")).await?;
    Ok(GatewayKinds::from_served(&v1, &v1beta1))
}

/// The reflector stores of the Gateway API kinds (empty for a kind that is not served).
#[derive(Clone, Default)]
struct GatewayStores {
    namespaces: Vec<Store<PartialObjectMeta<Namespace>>>,
    gateway_classes: Vec<Store<GatewayClass>>,
    gateways: Vec<Store<Gateway>>,
    listener_sets: Vec<Store<ListenerSet>>,
    http_routes: Vec<Store<HTTPRoute>>,
    grpc_routes: Vec<Store<GRPCRoute>>,
    tls_routes: Vec<Store<TLSRoute>>,
    tcp_routes: Vec<Store<TCPRoute>>,
    udp_routes: Vec<Store<UDPRoute>>,
    reference_grants: Vec<Store<ReferenceGrant>>,
    backend_tls_policies: Vec<Store<BackendTLSPolicy>>,
    config_maps: Vec<Store<ConfigMap>>,
}

impl GatewayStores {
    fn watch(
        client: &Client,
        scope: &Scope,
        kinds: GatewayKinds,
        trigger: &Trigger,
        metrics: &Metrics,
    ) -> Self {
        let any = watcher::Config::default();
        let (t, m) = (trigger, metrics);
        // NB: with --watch-namespace only the watched namespaces themselves are needed
        // (their labels, for `allowedRoutes.namespaces.selector`).
        let namespaces = match scope {
            Scope::All => vec![spawn_meta_watch(
                Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                any.clone(),
                "Namespace",
                t.clone(),
                m.clone(),
            )],
            Scope::Namespaces(list) => list
                .iter()
                .map(|ns| {
                    spawn_meta_watch(
                        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                        watcher::Config::default().fields(&format!("metadata.name={ns}")),
                        "Namespace",
                        t.clone(),
                        m.clone(),
                    )
                })
                .collect(),
        };
        fn when<T>(served: bool, f: impl FnOnce() -> Vec<T>) -> Vec<T> {
            if served { f() } else { Vec::new() }
        }
        Self {
            namespaces,
            gateway_classes: when(kinds.gateway_classes, || {
                vec![spawn_watch(
                    Api::<GatewayClass>::all(client.clone()),
                    any.clone(),
                    "GatewayClass",
                    t.clone(),
                    m.clone(),
                )]
            }),
            gateways: when(kinds.gateways, || {
                watch_kind(client, scope, &any, "Gateway", t, m)
            }),
            listener_sets: when(kinds.listener_sets, || {
                watch_kind(client, scope, &any, "ListenerSet", t, m)
            }),
            http_routes: when(kinds.http_routes, || {
                watch_kind(client, scope, &any, "HTTPRoute", t, m)
            }),
            grpc_routes: when(kinds.grpc_routes, || {
                watch_kind(client, scope, &any, "GRPCRoute", t, m)
            }),
            tls_routes: when(kinds.tls_routes, || {
                watch_kind(client, scope, &any, "TLSRoute", t, m)
            }),
            tcp_routes: when(kinds.tcp_routes, || {
                watch_kind(client, scope, &any, "TCPRoute", t, m)
            }),
            udp_routes: when(kinds.udp_routes, || {
                watch_kind(client, scope, &any, "UDPRoute", t, m)
            }),
            reference_grants: when(kinds.reference_grants, || {
                watch_kind(client, scope, &any, "ReferenceGrant", t, m)
            }),
            backend_tls_policies: when(kinds.backend_tls_policies, || {
                watch_kind(client, scope, &any, "BackendTLSPolicy", t, m)
            }),
            // NB: CA bundles of BackendTLSPolicy and of Gateway frontend validation.
            config_maps: when(kinds.gateways, || {
                watch_kind(client, scope, &any, "ConfigMap", t, m)
            }),
        }
    }

    async fn synced(&self) {
        wait_ready(&self.namespaces).await;
        wait_ready(&self.gateway_classes).await;
        wait_ready(&self.gateways).await;
        wait_ready(&self.listener_sets).await;
        wait_ready(&self.http_routes).await;
        wait_ready(&self.grpc_routes).await;
        wait_ready(&self.tls_routes).await;
        wait_ready(&self.tcp_routes).await;
        wait_ready(&self.udp_routes).await;
        wait_ready(&self.reference_grants).await;
        wait_ready(&self.backend_tls_policies).await;
        wait_ready(&self.config_maps).await;
    }
}

/// Discovers the Gateway API and starts its watches once it is served (see the module doc).
/// `done` turns true once the first discovery answered (or failed three times), so the
/// first snapshot waits for the Gateway API stores when they exist, and never for ever.
async fn discover_and_watch(
    client: Client,
    scope: Scope,
    trigger: Trigger,
    metrics: Metrics,
    cell: Arc<std::sync::OnceLock<GatewayStores>>,
    done: watch::Sender<bool>,
) {
    let mut told_absent = false;
    let mut failures = 0u32;
    loop {
        match discover_gateway_api(&client).await {
            Ok(kinds) if kinds.usable() => {
                let missing = kinds.missing();
                if missing.is_empty() {
                    tracing::info!("Gateway API found; watching its kinds");
                } else {
                    tracing::info!(
                        not_served = ?missing,
                        "Gateway API found; watching its kinds except those not served"
                    );
                }
                let stores = GatewayStores::watch(&client, &scope, kinds, &trigger, &metrics);
                let _ = cell.set(stores);
                done.send_replace(true);
                return;
            }
            Ok(_) => {
                if !told_absent {
                    tracing::info!(
                        group = GATEWAY_API_GROUP,
                        "Gateway API CRDs not installed: Gateway API support is off (checked again every {} s)",
                        GATEWAY_DISCOVERY_INTERVAL.as_secs()
                    );
                    told_absent = true;
                }
                failures = 0;
                done.send_replace(true);
                tokio::time::sleep(GATEWAY_DISCOVERY_INTERVAL).await;
            }
            Err(e) => {
                failures += 1;
                metrics
                    .reconcile_errors
                    .with_label_values(&["discovery"])
                    .inc();
                if failures == 1 {
                    tracing::warn!(error = %e, "Gateway API discovery failed; retrying");
                } else {
                    tracing::debug!(error = %e, failures, "Gateway API discovery failed");
                }
                if failures >= 3 {
                    done.send_replace(true);
                }
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        }
    }
}

/// Generates [`Kinds`] from the table of kinds below it: the stores, their watches, the
/// wait for their first lists, their part of [`Inputs`] and uid lookups.
macro_rules! kinds_table {
    ($($field:ident: $kind:ident, $config:ident;)*) => {
        /// The stores of the namespaced kinds watched whole (see `kinds_table!`).
        #[derive(Clone)]
        struct Kinds {
            $($field: Vec<Store<$kind>>,)*
        }

        impl Kinds {
            fn watch(client: &Client, scope: &Scope, trigger: &Trigger, metrics: &Metrics) -> Self {
                Self {
                    $($field: watch_kind(
                        client,
                        scope,
                        &$config(),
                        stringify!($kind),
                        trigger,
                        metrics,
                    ),)*
                }
            }

            async fn synced(&self) {
                $(wait_ready(&self.$field).await;)*
            }

            /// `inputs` with these kinds' objects.
            fn inputs(&self, inputs: Inputs) -> Inputs {
                Inputs {
                    $($field: read(&self.$field),)*
                    ..inputs
                }
            }

            fn uid_of(&self, kind: &str, namespace: &str, name: &str) -> Option<String> {
                match kind {
                    $(stringify!($kind) => find(&self.$field, namespace, name)?.metadata.uid.clone(),)*
                    _ => None,
                }
            }
        }
    };
}

// The namespaced input kinds watched whole, one line each: the field of `Inputs` (and of
// `Kinds`), the type (its name labels the `watch_events` metric) and the function giving
// its watch configuration. Adding such a kind is adding a line here and the field to
// `Inputs`.
kinds_table! {
    apisix_routes: ApisixRoute, every_object;
    apisix_upstreams: ApisixUpstream, every_object;
    apisix_tlses: ApisixTls, every_object;
    apisix_plugin_configs: ApisixPluginConfig, every_object;
    apisix_consumers: ApisixConsumer, every_object;
    apisix_global_rules: ApisixGlobalRule, every_object;
    services: Service, every_object;
    endpoint_slices: EndpointSlice, service_slices;
    secrets: Secret, not_helm_releases;
    ingresses: Ingress, every_object;
}

fn every_object() -> watcher::Config {
    watcher::Config::default()
}

/// Only slices that belong to a Service can back a route.
fn service_slices() -> watcher::Config {
    watcher::Config::default().labels(sluice_translate::SERVICE_NAME_LABEL)
}

/// Helm keeps every release revision in a Secret; they are large and never ours.
fn not_helm_releases() -> watcher::Config {
    watcher::Config::default().fields("type!=helm.sh/release.v1")
}

/// Resolves once every store of `stores` has completed its first list.
async fn wait_ready<K: Resource<DynamicType = ()> + Clone>(stores: &[Store<K>]) {
    for s in stores {
        // NB: Err means the watcher task is gone; nothing to wait for then.
        let _ = s.wait_until_ready().await;
    }
}

/// The reflector stores of every input kind.
#[derive(Clone)]
pub struct Stores {
    /// The kinds of the table (`kinds_table!`).
    kinds: Kinds,
    pods: Vec<Store<PartialObjectMeta<Pod>>>,
    ingress_classes: Store<IngressClass>,
    /// Set once discovery finds the Gateway API.
    gateway: Arc<std::sync::OnceLock<GatewayStores>>,
    /// True once the first Gateway API discovery is done.
    gateway_discovered: watch::Receiver<bool>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores").finish_non_exhaustive()
    }
}

fn find<K: Resource<DynamicType = ()> + Clone>(
    stores: &[Store<K>],
    namespace: &str,
    name: &str,
) -> Option<Arc<K>> {
    let key = reflector::ObjectRef::new(name).within(namespace);
    stores.iter().find_map(|s| s.get(&key))
}

fn read<K: Resource<DynamicType = ()> + Clone>(stores: &[Store<K>]) -> Vec<Arc<K>> {
    stores.iter().flat_map(Store::state).collect()
}

/// The metadata and route status of every object of `stores`.
fn meta_status<K: Resource<DynamicType = ()> + Clone>(
    stores: &[Store<K>],
    parts: impl Fn(&K) -> (&ObjectMeta, &Option<RouteStatus>),
) -> Vec<(ObjectMeta, Option<RouteStatus>)> {
    read(stores)
        .iter()
        .map(|o| {
            let (m, s) = parts(o);
            (m.clone(), s.clone())
        })
        .collect()
}

fn find_cluster<K: Resource<DynamicType = ()> + Clone>(
    stores: &[Store<K>],
    name: &str,
) -> Option<Arc<K>> {
    let key = reflector::ObjectRef::new(name);
    stores.iter().find_map(|s| s.get(&key))
}

impl Stores {
    /// Starts a watcher for every kind in `scope` (IngressClasses cluster-wide), firing
    /// `trigger` on every event that may change the output.
    pub fn watch(client: &Client, scope: &Scope, trigger: &Trigger, metrics: &Metrics) -> Self {
        let any = every_object();
        let (t, m) = (trigger, metrics);
        let gateway = Arc::new(std::sync::OnceLock::new());
        let (discovered_tx, gateway_discovered) = watch::channel(false);
        tokio::spawn(discover_and_watch(
            client.clone(),
            scope.clone(),
            trigger.clone(),
            metrics.clone(),
            Arc::clone(&gateway),
            discovered_tx,
        ));
        Self {
            kinds: Kinds::watch(client, scope, t, m),
            pods: match scope {
                Scope::All => vec![spawn_pod_watch(
                    Api::all(client.clone()),
                    any.clone(),
                    t.clone(),
                    m.clone(),
                )],
                Scope::Namespaces(namespaces) => namespaces
                    .iter()
                    .map(|ns| {
                        spawn_pod_watch(
                            Api::namespaced(client.clone(), ns),
                            any.clone(),
                            t.clone(),
                            m.clone(),
                        )
                    })
                    .collect(),
            },
            ingress_classes: spawn_watch(
                Api::<IngressClass>::all(client.clone()),
                any,
                "IngressClass",
                trigger.clone(),
                metrics.clone(),
            ),
            gateway,
            gateway_discovered,
        }
    }

    /// Resolves once every store has completed its first list.
    pub async fn synced(&self) {
        self.kinds.synced().await;
        wait_ready(&self.pods).await;
        wait_ready(std::slice::from_ref(&self.ingress_classes)).await;
        let mut discovered = self.gateway_discovered.clone();
        // NB: Err means the discovery task is gone; it set the stores first if it could.
        let _ = discovered.wait_for(|d| *d).await;
        if let Some(g) = self.gateway.get() {
            g.synced().await;
        }
    }

    /// Whether the Gateway API kinds are watched (discovery found them).
    pub fn gateway_api(&self) -> bool {
        self.gateway.get().is_some()
    }

    /// Everything the stores hold now.
    pub fn inputs(&self) -> Inputs {
        self.kinds.inputs(Inputs {
            pods: read(&self.pods),
            ingress_classes: self.ingress_classes.state(),
            ..self.gateway_inputs()
        })
    }

    fn gateway_inputs(&self) -> Inputs {
        let Some(g) = self.gateway.get() else {
            return Inputs::default();
        };
        Inputs {
            namespaces: read(&g.namespaces),
            gateway_classes: read(&g.gateway_classes),
            gateways: read(&g.gateways),
            listener_sets: read(&g.listener_sets),
            http_routes: read(&g.http_routes),
            grpc_routes: read(&g.grpc_routes),
            tls_routes: read(&g.tls_routes),
            tcp_routes: read(&g.tcp_routes),
            udp_routes: read(&g.udp_routes),
            reference_grants: read(&g.reference_grants),
            backend_tls_policies: read(&g.backend_tls_policies),
            config_maps: read(&g.config_maps),
            ..Inputs::default()
        }
    }

    /// A GatewayClass as the stores have it.
    pub fn gateway_class(&self, name: &str) -> Option<Arc<GatewayClass>> {
        find_cluster(&self.gateway.get()?.gateway_classes, name)
    }

    /// A Gateway as the stores have it.
    pub fn gateway(&self, namespace: &str, name: &str) -> Option<Arc<Gateway>> {
        find(&self.gateway.get()?.gateways, namespace, name)
    }

    /// A ListenerSet as the stores have it.
    pub fn listener_set(&self, namespace: &str, name: &str) -> Option<Arc<ListenerSet>> {
        find(&self.gateway.get()?.listener_sets, namespace, name)
    }

    /// An HTTPRoute as the stores have it.
    pub fn http_route(&self, namespace: &str, name: &str) -> Option<Arc<HTTPRoute>> {
        find(&self.gateway.get()?.http_routes, namespace, name)
    }

    /// Every HTTPRoute the stores hold.
    pub fn http_routes(&self) -> Vec<Arc<HTTPRoute>> {
        self.gateway
            .get()
            .map(|g| read(&g.http_routes))
            .unwrap_or_default()
    }

    /// Every GRPCRoute the stores hold.
    pub fn grpc_routes(&self) -> Vec<Arc<GRPCRoute>> {
        self.gateway
            .get()
            .map(|g| read(&g.grpc_routes))
            .unwrap_or_default()
    }

    /// A BackendTLSPolicy as the stores have it.
    pub fn backend_tls_policy(&self, namespace: &str, name: &str) -> Option<Arc<BackendTLSPolicy>> {
        find(&self.gateway.get()?.backend_tls_policies, namespace, name)
    }

    /// Every BackendTLSPolicy the stores hold.
    pub fn backend_tls_policies(&self) -> Vec<Arc<BackendTLSPolicy>> {
        self.gateway
            .get()
            .map(|g| read(&g.backend_tls_policies))
            .unwrap_or_default()
    }

    /// A GRPCRoute as the stores have it.
    pub fn grpc_route(&self, namespace: &str, name: &str) -> Option<Arc<GRPCRoute>> {
        find(&self.gateway.get()?.grpc_routes, namespace, name)
    }

    /// Every TLSRoute, TCPRoute or UDPRoute (by `kind`) the stores hold: metadata and status.
    pub fn stream_routes(&self, kind: &str) -> Vec<(ObjectMeta, Option<RouteStatus>)> {
        let Some(g) = self.gateway.get() else {
            return Vec::new();
        };
        match kind {
            "TLSRoute" => meta_status(&g.tls_routes, |o| (&o.metadata, &o.status)),
            "TCPRoute" => meta_status(&g.tcp_routes, |o| (&o.metadata, &o.status)),
            "UDPRoute" => meta_status(&g.udp_routes, |o| (&o.metadata, &o.status)),
            _ => Vec::new(),
        }
    }

    /// The uid of an object by its Kubernetes kind (the kinds of `kinds_table!`).
    pub fn uid_of(&self, kind: &str, namespace: &str, name: &str) -> Option<String> {
        self.kinds.uid_of(kind, namespace, name)
    }

    /// An Ingress as the stores have it.
    pub fn ingress(&self, namespace: &str, name: &str) -> Option<Arc<Ingress>> {
        find(&self.kinds.ingresses, namespace, name)
    }

    /// A Service as the stores have it.
    pub fn service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        find(&self.kinds.services, namespace, name)
    }

    /// The current `.status` of an Apisix object, as the stores have it.
    pub fn status_of(&self, kind: ObjectKind, namespace: &str, name: &str) -> Option<ApisixStatus> {
        let (k, ns, n) = (&self.kinds, namespace, name);
        match kind {
            ObjectKind::ApisixRoute => find(&k.apisix_routes, ns, n)?.status.clone(),
            ObjectKind::ApisixUpstream => find(&k.apisix_upstreams, ns, n)?.status.clone(),
            ObjectKind::ApisixTls => find(&k.apisix_tlses, ns, n)?.status.clone(),
            ObjectKind::ApisixPluginConfig => find(&k.apisix_plugin_configs, ns, n)?.status.clone(),
            ObjectKind::ApisixConsumer => find(&k.apisix_consumers, ns, n)?.status.clone(),
            ObjectKind::ApisixGlobalRule => find(&k.apisix_global_rules, ns, n)?.status.clone(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn watch_retries_back_off_from_a_quarter_second_to_five_seconds_and_reset() {
        use kube::runtime::utils::Backoff as _;
        let mut b = WatchBackoff::default();
        let delays: Vec<_> = b.by_ref().take(8).collect();
        let ms = |d: &std::time::Duration| d.as_millis();
        assert!((187..=313).contains(&ms(&delays[0])), "{delays:?}");
        assert!((375..=625).contains(&ms(&delays[1])), "{delays:?}");
        for d in &delays[5..] {
            assert!(
                (3750..=6250).contains(&ms(d)),
                "capped near 5 s: {delays:?}"
            );
        }
        b.reset();
        assert!(ms(&b.next().unwrap()) <= 313);
    }
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    fn route(path: &str) -> ApisixRoute {
        let mut state = sluice_translate::ClusterState::default();
        state
            .load_yaml(
                "t.yaml",
                &format!(
                    "apiVersion: apisix.apache.org/v2\nkind: ApisixRoute\nmetadata: {{name: r, namespace: ns, resourceVersion: \"1\", generation: 1}}\nspec:\n  http:\n  - name: a\n    match: {{paths: [\"{path}\"]}}\n    backends: [{{serviceName: s, servicePort: 80}}]\n"
                ),
            )
            .unwrap();
        state.apisix_routes.remove(0)
    }

    #[test]
    fn status_and_bookkeeping_changes_are_skipped() {
        let mut fp = Fingerprints::default();
        let r = route("/a");
        assert!(
            fp.observe(&Event::Apply(r.clone())),
            "first sight of an object"
        );
        assert!(!fp.observe(&Event::Apply(r.clone())), "same object again");

        let mut status_only = r.clone();
        status_only.metadata.resource_version = Some("2".into());
        status_only.status = Some(ApisixStatus {
            observed_generation: Some(1),
            ..Default::default()
        });
        status_only.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        assert!(
            !fp.observe(&Event::Apply(status_only)),
            "our own status write"
        );

        let mut relabeled = r.clone();
        relabeled
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("team".into(), "a".into());
        assert!(
            fp.observe(&Event::Apply(relabeled)),
            "labels are visible to translation"
        );
        assert!(fp.observe(&Event::Apply(route("/b"))), "spec change");
        assert!(fp.observe(&Event::Delete(route("/b"))));
    }

    #[test]
    fn a_relist_triggers_only_when_something_changed_meanwhile() {
        let mut fp = Fingerprints::default();
        let r = route("/a");
        fp.observe(&Event::<ApisixRoute>::Init);
        fp.observe(&Event::InitApply(r.clone()));
        assert!(fp.observe(&Event::<ApisixRoute>::InitDone), "first list");

        fp.observe(&Event::<ApisixRoute>::Init);
        fp.observe(&Event::InitApply(r.clone()));
        assert!(
            !fp.observe(&Event::<ApisixRoute>::InitDone),
            "same objects re-listed"
        );

        // Deleted while the watch was down: the re-list no longer has it.
        fp.observe(&Event::<ApisixRoute>::Init);
        assert!(fp.observe(&Event::<ApisixRoute>::InitDone));
    }

    #[test]
    fn slim_drops_managed_fields_and_last_applied() {
        let mut r = route("/a");
        r.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        r.metadata.annotations = Some(
            [
                (LAST_APPLIED_ANNOTATION.to_string(), "{...}".to_string()),
                ("keep".to_string(), "me".to_string()),
            ]
            .into(),
        );
        slim(&mut r);
        assert!(r.metadata.managed_fields.is_none());
        let ann = r.metadata.annotations.unwrap();
        assert_eq!(ann.len(), 1);
        assert_eq!(ann["keep"], "me");
    }

    fn pod(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> PartialObjectMeta<Pod> {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        PartialObjectMeta {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("web-a".into()),
                namespace: Some("ns".into()),
                labels: map(labels),
                annotations: map(annotations),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn only_pod_label_changes_trigger() {
        let mut fp = Fingerprints::default();
        let seen = |fp: &mut Fingerprints, p: PartialObjectMeta<Pod>| {
            fp.observe_by(&Event::Apply(p), pod_fingerprint)
        };
        assert!(seen(&mut fp, pod(&[("version", "v1")], &[])), "new Pod");
        let mut churn = pod(&[("version", "v1")], &[("note", "x")]);
        churn.metadata.resource_version = Some("8".into());
        assert!(!seen(&mut fp, churn), "annotation/resourceVersion churn");
        assert!(seen(&mut fp, pod(&[("version", "v2")], &[])), "relabel");
        assert!(fp.observe_by(
            &Event::Delete(pod(&[("version", "v2")], &[])),
            pod_fingerprint
        ));
    }

    #[test]
    fn slim_pod_keeps_name_namespace_and_labels_only() {
        let mut p = pod(&[("version", "v1")], &[("big", "annotation")]);
        p.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        slim_pod(&mut p);
        assert_eq!(p.metadata.name.as_deref(), Some("web-a"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(p.metadata.labels.unwrap()["version"], "v1");
        assert!(p.metadata.annotations.is_none());
        assert!(p.metadata.managed_fields.is_none());
    }
}
