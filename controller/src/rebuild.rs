//! The one rebuild loop: waits for the caches to sync, then for change signals, and rebuilds
//! the snapshot — assemble the [`Inputs`] of our class, translate, and seal and publish a new
//! version only when the content hash changed.
//!
//! ```text
//! watch events ──(skip no-op events)──▶ trigger ──leading edge, ≥ 10 ms apart──▶ rebuild
//!                                                                                  │
//!                         hub.publish(v+1) ◀── hash changed? ◀── translate ◀── assemble
//!                         status side output (per object: conditions, since-version)
//! ```
//!
//! The batching is leading-edge: a change that finds the loop idle is rebuilt at once (no
//! quiet period to wait out, so a new route is not delayed by a fixed floor); changes that
//! arrive while a rebuild runs, or less than [`Debounce::min_interval`] after the last one
//! started, coalesce into the one next rebuild. A burst of N changes therefore costs at most
//! one rebuild per rebuild duration (or per minimum interval), never N.
//!
//! Certificates are checked against the time of each rebuild. Translation also says when
//! a certificate verdict next changes (an expiry, or a `notBefore` reached); the loop
//! rebuilds then without any object changing, so an expired certificate gets
//! `Accepted=False` ("... expired at ...") and leaves the snapshot: dataplanes stop serving
//! it (a handshake for its hosts gets the default certificate if one is configured, else
//! it is refused). Unlike nginx/APISIX, which keep serving an expired certificate, a
//! client sees a clear failure and the object's status says why. The wait is capped at
//! [`MAX_CERTIFICATE_WAIT`] so a wall-clock jump cannot postpone the check for long.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use sluice_proto::v1;
use sluice_translate::gateway::{GatewayOptions, GatewayStatusReport};
use sluice_translate::status::{ConditionStatus, IngressStatus};
use sluice_translate::{CrossNamespaceRefs, ObjectKind, ObjectStatus, Options, translate};
use tokio::sync::watch;

use crate::cluster::{Inputs, assemble_with};
use crate::grpc::{Hub, Published};
use crate::metrics::Metrics;

/// How the loop batches changes (leading-edge: see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Debounce {
    /// Least time from the start of one rebuild to the start of the next (default 10 ms,
    /// `--rebuild-min-interval`). A change that arrives later than this after the last
    /// rebuild started, with no rebuild running, is rebuilt at once; the others wait for the
    /// next rebuild and share it.
    pub min_interval: Duration,
}

/// The default of [`Debounce::min_interval`].
pub const DEFAULT_MIN_INTERVAL: Duration = Duration::from_millis(10);

impl Default for Debounce {
    fn default() -> Self {
        Self {
            min_interval: DEFAULT_MIN_INTERVAL,
        }
    }
}

/// One object's verdict, with the first snapshot version that contains its current content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectVerdict {
    /// Translation's conditions, generation and routes.
    pub status: ObjectStatus,
    /// First published version containing this object as it is now (same generation and
    /// routes); a dataplane that ACKed this version or a later one serves it. 0 when no
    /// snapshot was published yet.
    pub since_version: u64,
}

/// The status side output of one rebuild.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// Version offered to dataplanes after this rebuild (0 = none yet).
    pub version: u64,
    /// Every object of our class that translation looked at, sorted.
    pub objects: Vec<ObjectVerdict>,
    /// Every Ingress of our class, sorted (Ingress has no conditions in its status; these
    /// feed Events and `status.loadBalancer`).
    pub ingresses: Vec<IngressStatus>,
    /// The Gateway API status side output.
    pub gateway: GatewayRebuilt,
}

/// The Gateway API part of [`Rebuilt`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GatewayRebuilt {
    /// Translation's Gateway API status.
    pub report: GatewayStatusReport,
    /// Per Gateway `(namespace, name)`: the first published version whose routes and
    /// certificates of that Gateway are the ones in the snapshot now (a dataplane at this
    /// version or later serves the Gateway as it is). 0 when nothing was published yet.
    pub since: BTreeMap<(String, String), u64>,
    /// The per-Gateway ports of the snapshot (id, port, kind: `http`, `https`, `tls`, `tcp`
    /// or `udp`, see [`crate::status::gateway_services::port_kind`]), without certificates:
    /// what the Gateway Services target.
    pub listeners: Vec<(String, u16, &'static str)>,
}

/// A fingerprint of the snapshot entries a Gateway contributes (its routes, certificates,
/// per-Gateway ports).
fn gateway_content(
    snapshot: &v1::Snapshot,
    gateway: (&str, &str),
    routes: &[String],
    certificates: &[String],
    accepted: bool,
) -> String {
    let prefix = format!("{}/{}/", gateway.0, gateway.1);
    let source = format!("Gateway {}/{}", gateway.0, gateway.1);
    let part = v1::Snapshot {
        // NB: ids are `<ns>/<gw>/<port>` and `<ns>/<gw>/<port>/udp`; the source keeps out a
        // stream port `stream/tcp/9100` when a Gateway is named `stream/tcp`.
        listeners: snapshot
            .listeners
            .iter()
            .filter(|l| {
                l.source == source
                    && l.id.strip_prefix(&prefix).is_some_and(|rest| {
                        let port = rest.strip_suffix("/udp").unwrap_or(rest);
                        !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
                    })
            })
            .cloned()
            .collect(),
        stream_routes: snapshot
            .stream_routes
            .iter()
            .filter(|r| routes.binary_search(&r.id).is_ok())
            .cloned()
            .collect(),
        routes: snapshot
            .routes
            .iter()
            .filter(|r| routes.binary_search(&r.id).is_ok())
            .cloned()
            .collect(),
        tls_certificates: snapshot
            .tls_certificates
            .iter()
            .filter(|c| certificates.binary_search(&c.id).is_ok())
            .cloned()
            .collect(),
        default_certificate: snapshot
            .default_certificate
            .clone()
            .filter(|c| certificates.binary_search(&c.id).is_ok()),
        ..Default::default()
    };
    format!("{accepted}/{}", sluice_proto::content_hash(&part))
}

/// What one rebuild did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The content changed: a new version was published.
    Published(u64),
    /// Same content as the current version: nothing sent to dataplanes.
    Unchanged(u64),
}

type ObjectKey = (ObjectKind, String, String);

/// Longest wait for a certificate verdict change before translating again anyway.
pub const MAX_CERTIFICATE_WAIT: Duration = Duration::from_secs(3600);

/// Server-certificate settings that are not Kubernetes objects (controller flags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// `--default-ssl-certificate NS/NAME`: (namespace, name) of the kubernetes.io/tls Secret
    /// served to handshakes without SNI or for a host no certificate covers. Default: none
    /// (such handshakes are refused).
    pub default_certificate: Option<(String, String)>,
    /// `--fallback-sni HOST`: a handshake without SNI gets this host's certificate.
    pub fallback_sni: Option<String>,
}

/// Translates and publishes; keeps the last version and hash. Versions grow with every new
/// content, following the replicas' clock ([`Hub::next_version`]).
#[derive(Debug)]
pub struct Rebuilder {
    hub: Arc<Hub>,
    metrics: Metrics,
    ingress_class: String,
    version: u64,
    hash: Option<String>,
    since: HashMap<ObjectKey, (Option<i64>, Vec<String>, bool, u64)>,
    status: watch::Sender<Option<Arc<Rebuilt>>>,
    tls: TlsSettings,
    certificates_change_at: Option<SystemTime>,
    settings_problems: Vec<String>,
    gateway: GatewayOptions,
    gateway_since: HashMap<(String, String), (String, u64)>,
    cross_namespace_refs: CrossNamespaceRefs,
    stream_ports: Vec<sluice_translate::StreamPort>,
    nginx_classes: Vec<String>,
    nginx_config: std::collections::BTreeMap<String, String>,
}

impl Rebuilder {
    /// A rebuilder publishing to `hub`, for objects of `ingress_class`. Versions start at 1.
    pub fn new(hub: Arc<Hub>, metrics: Metrics, ingress_class: &str) -> Self {
        Self {
            hub,
            metrics,
            ingress_class: ingress_class.to_owned(),
            version: 0,
            hash: None,
            since: HashMap::new(),
            status: watch::Sender::new(None),
            tls: TlsSettings::default(),
            certificates_change_at: None,
            settings_problems: Vec::new(),
            gateway: GatewayOptions::default(),
            gateway_since: HashMap::new(),
            cross_namespace_refs: CrossNamespaceRefs::default(),
            stream_ports: Vec::new(),
            nginx_classes: Vec::new(),
            nginx_config: Default::default(),
        }
    }

    /// Uses these Gateway API settings (controller name, fleet ports) from the next rebuild.
    pub fn with_gateway(mut self, gateway: GatewayOptions) -> Self {
        self.gateway = gateway;
        self
    }

    /// Honours these cross-namespace references of the APISIX kinds from the next rebuild
    /// on (`--allow-cross-namespace-refs`).
    pub fn with_cross_namespace_refs(mut self, refs: CrossNamespaceRefs) -> Self {
        self.cross_namespace_refs = refs;
        self
    }

    /// Serves ApisixRoute `spec.stream` rules on these ports (`--stream-ports`) from the next
    /// rebuild on.
    /// Serves the Ingresses of these classes in ingress-nginx's place, with its annotations
    /// (`--ingress-nginx-class`).
    pub fn with_nginx_classes(
        mut self,
        classes: Vec<String>,
        config: std::collections::BTreeMap<String, String>,
    ) -> Self {
        self.nginx_classes = classes;
        self.nginx_config = config;
        self
    }

    pub fn with_stream_ports(mut self, ports: Vec<sluice_translate::StreamPort>) -> Self {
        self.stream_ports = ports;
        self
    }

    /// Uses these certificate settings from the next rebuild on.
    pub fn with_tls(mut self, tls: TlsSettings) -> Self {
        self.tls = tls;
        self
    }

    /// When a certificate verdict of the last rebuild changes with time: rebuild then.
    pub fn certificates_change_at(&self) -> Option<SystemTime> {
        self.certificates_change_at
    }

    /// The status side output, updated after every rebuild.
    pub fn subscribe_status(&self) -> watch::Receiver<Option<Arc<Rebuilt>>> {
        self.status.subscribe()
    }

    /// Rebuilds from `inputs` now.
    pub fn rebuild(&mut self, inputs: &Inputs) -> Outcome {
        let started = Instant::now();
        let state = assemble_with(inputs, &self.ingress_class, &self.nginx_classes);
        // NB: `assemble` already kept only our class, so translate everything it got.
        // NB: certificate validity is checked against the time of the rebuild; `run`
        // rebuilds again at `certificates_change_at`.
        let opts = Options {
            now: Some(SystemTime::now()),
            default_certificate: self.tls.default_certificate.clone(),
            fallback_sni: self.tls.fallback_sni.clone(),
            gateway: self.gateway.clone(),
            cross_namespace_refs: self.cross_namespace_refs,
            stream_ports: self.stream_ports.clone(),
            nginx_classes: self.nginx_classes.clone(),
            nginx_config: self.nginx_config.clone(),
            ..Options::default()
        };
        let translation = translate(&state, &opts);
        self.certificates_change_at = translation.certificates_change_at;
        if translation.settings != self.settings_problems {
            for p in &translation.settings {
                tracing::error!(problem = %p, "TLS setting not applied");
            }
            self.settings_problems = translation.settings.clone();
        }
        let hash = sluice_proto::content_hash(&translation.snapshot);
        let gateway_contents: Vec<((String, String), String)> = translation
            .status
            .gateway
            .gateways
            .iter()
            .map(|g| {
                let accepted = g.conditions.iter().any(|c| {
                    c.type_ == sluice_translate::gateway::PROGRAMMED
                        && c.status == ConditionStatus::True
                });
                (
                    (g.namespace.clone(), g.name.clone()),
                    gateway_content(
                        &translation.snapshot,
                        (&g.namespace, &g.name),
                        &g.routes,
                        &g.certificates,
                        accepted,
                    ),
                )
            })
            .collect();
        // NB: the stream ports of --stream-ports are the dataplane Service's, not a Gateway's.
        let listener_ports: Vec<(String, u16, &'static str)> = translation
            .snapshot
            .listeners
            .iter()
            .filter(|l| l.source.starts_with("Gateway "))
            .filter_map(|l| {
                let kind = crate::status::gateway_services::port_kind(l);
                Some((l.id.clone(), u16::try_from(l.port).ok()?, kind))
            })
            .collect();
        let outcome = if self.hash.as_deref() == Some(hash.as_str()) {
            Outcome::Unchanged(self.version)
        } else {
            // NB: not `+ 1`: versions follow the replicas' Lamport clock (`Hub::next_version`).
            self.version = self.hub.next_version(&hash, self.version);
            let mut rejected_objects = translation.settings.clone();
            rejected_objects.extend(rejected_lines(&translation.status.objects));
            self.hub.publish(Published {
                // NB: `hash` is this content's: hashing it again costs as much as translating.
                snapshot: sluice_proto::seal_with_hash(
                    translation.snapshot,
                    self.version,
                    hash.clone(),
                ),
                rejected_objects,
            });
            self.hash = Some(hash);
            Outcome::Published(self.version)
        };
        let label = match outcome {
            Outcome::Published(_) => "published",
            Outcome::Unchanged(_) => "unchanged",
        };
        self.metrics.rebuilds.with_label_values(&[label]).inc();
        self.metrics
            .rebuild_duration
            .observe(started.elapsed().as_secs_f64());

        let mut since = HashMap::with_capacity(translation.status.objects.len());
        let mut objects = Vec::with_capacity(translation.status.objects.len());
        for status in translation.status.objects {
            let key = (status.kind, status.namespace.clone(), status.name.clone());
            // NB: the verdict counts too: a certificate that expires (or becomes valid)
            // leaves (or enters) the snapshot without a new generation.
            let accepted = status.is_accepted();
            let since_version = match self.since.get(&key) {
                Some((generation, routes, was_accepted, v))
                    if *generation == status.generation
                        && *routes == status.routes
                        && *was_accepted == accepted =>
                {
                    *v
                }
                _ => self.version,
            };
            since.insert(
                key,
                (
                    status.generation,
                    status.routes.clone(),
                    accepted,
                    since_version,
                ),
            );
            objects.push(ObjectVerdict {
                status,
                since_version,
            });
        }
        self.since = since;
        let mut gateway_since = HashMap::with_capacity(gateway_contents.len());
        let mut gateway = GatewayRebuilt {
            report: translation.status.gateway,
            since: BTreeMap::new(),
            listeners: listener_ports,
        };
        for (key, content) in gateway_contents {
            let v = match self.gateway_since.get(&key) {
                Some((c, v)) if *c == content => *v,
                _ => self.version,
            };
            gateway.since.insert(key.clone(), v);
            gateway_since.insert(key, (content, v));
        }
        self.gateway_since = gateway_since;
        self.status.send_replace(Some(Arc::new(Rebuilt {
            version: self.version,
            objects,
            ingresses: translation.ingresses,
            gateway,
        })));
        outcome
    }
}

/// One line per object left out of the snapshot, as the dataplane's `/snapshot` shows them.
fn rejected_lines(objects: &[ObjectStatus]) -> Vec<String> {
    let mut lines = Vec::new();
    for o in objects.iter().filter(|o| !o.is_accepted()) {
        for c in o
            .conditions
            .iter()
            .filter(|c| c.status == ConditionStatus::False)
        {
            lines.push(format!(
                "{} {}/{}: {}: {}",
                o.kind, o.namespace, o.name, c.reason, c.message
            ));
        }
    }
    lines
}

/// Waits for the next batch of changes after a rebuild that started at `last_start`: returns
/// as soon as a change is pending (at once if one arrived during that rebuild) and at least
/// `debounce.min_interval` passed since `last_start`; every change seen until then belongs
/// to the batch. `false` when the sender is gone and nothing is pending.
pub async fn next_batch(
    trigger: &mut watch::Receiver<u64>,
    debounce: Debounce,
    last_start: tokio::time::Instant,
) -> bool {
    if trigger.changed().await.is_err() {
        return false;
    }
    // NB: a rebuild that starts later than this takes in whatever arrived meanwhile, so a
    // burst becomes one rebuild per interval rather than one per change.
    tokio::time::sleep_until(last_start + debounce.min_interval).await;
    trigger.borrow_and_update();
    true
}

/// Runs the loop: waits for `synced`, rebuilds once, then once per batch of changes until
/// the trigger's sender is dropped. `inputs` reads the stores.
pub async fn run<F>(
    mut rebuilder: Rebuilder,
    inputs: F,
    mut trigger: watch::Receiver<u64>,
    debounce: Debounce,
    synced: impl Future<Output = ()>,
) where
    F: Fn() -> Inputs + Send + Sync + 'static,
{
    synced.await;
    tracing::info!("caches synced; building the first snapshot");
    let inputs = Arc::new(inputs);
    // Changes seen while syncing are part of the first build.
    trigger.borrow_and_update();
    loop {
        let started = tokio::time::Instant::now();
        let read = Arc::clone(&inputs);
        // Translation of a large cluster takes milliseconds to seconds; keep it off the reactor.
        let done = tokio::task::spawn_blocking(move || {
            let outcome = rebuilder.rebuild(&read());
            (rebuilder, outcome)
        })
        .await;
        match done {
            Ok((r, outcome)) => {
                rebuilder = r;
                tracing::debug!(?outcome, "rebuild done");
            }
            Err(e) => {
                tracing::error!(error = %e, "rebuild panicked; the rebuild loop stops");
                return;
            }
        }
        let recheck = rebuilder.certificates_change_at().map(wait_until);
        tokio::select! {
            more = next_batch(&mut trigger, debounce, started) => {
                if !more {
                    return;
                }
            }
            _ = sleep_opt(recheck) => {
                tracing::info!("a certificate's validity changes now; rebuilding");
            }
        }
    }
}

/// How long to wait from now until `at` (wall clock), at most [`MAX_CERTIFICATE_WAIT`].
fn wait_until(at: SystemTime) -> Duration {
    at.duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO)
        .min(MAX_CERTIFICATE_WAIT)
}

/// Sleeps for `d`, or forever when `None`.
async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use sluice_translate::ClusterState;

    fn inputs(yaml: &str) -> Inputs {
        let mut state = ClusterState::default();
        state.load_yaml("t.yaml", yaml).unwrap();
        state.into()
    }

    fn route(name: &str, path: &str, generation: i64) -> String {
        format!(
            "apiVersion: apisix.apache.org/v2\nkind: ApisixRoute\nmetadata: {{name: {name}, generation: {generation}}}\nspec:\n  ingressClassName: apisix\n  http:\n  - name: r\n    match: {{paths: [\"{path}\"]}}\n    backends: [{{serviceName: svc, servicePort: 80}}]\n---\n"
        )
    }

    const SVC: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: svc}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}\n---\n";

    fn rebuilder() -> (Rebuilder, Arc<Hub>, Metrics) {
        let metrics = Metrics::new().unwrap();
        let hub = Hub::new(metrics.clone());
        (
            Rebuilder::new(Arc::clone(&hub), metrics.clone(), "apisix"),
            hub,
            metrics,
        )
    }

    #[test]
    fn a_gateways_content_has_its_udp_ports_and_stream_routes_but_no_fleet_stream_port() {
        let l = |id: &str, source: &str, port| v1::Listener {
            id: id.into(),
            source: source.into(),
            port,
            ..Default::default()
        };
        // NB: a Gateway named `tcp` in namespace `stream` shares the fleet ports' prefix.
        let gw = ("stream", "tcp");
        let mut snap = v1::Snapshot {
            listeners: vec![
                l("stream/tcp/53/udp", "Gateway stream/tcp", 20001),
                l("stream/tcp/9100", "--stream-ports tcp", 9100),
            ],
            ..Default::default()
        };
        let routes = vec!["stream/r/udproute-r0".to_owned()];
        let content = |s: &v1::Snapshot| gateway_content(s, gw, &routes, &[], true);
        let before = content(&snap);
        snap.listeners[0].port = 20002;
        let moved = content(&snap);
        assert_ne!(moved, before, "the Gateway's UDP port is part of it");
        snap.listeners[1].port = 9101;
        assert_eq!(content(&snap), moved, "a --stream-ports port is not");
        snap.stream_routes.push(v1::StreamRoute {
            id: "stream/r/udproute-r0".into(),
            ..Default::default()
        });
        assert_ne!(content(&snap), moved, "its stream routes are");
    }

    #[test]
    fn new_version_only_when_the_content_changes() {
        let (mut rb, hub, metrics) = rebuilder();
        let a = inputs(&format!("{SVC}{}", route("a", "/a", 1)));
        assert_eq!(rb.rebuild(&a), Outcome::Published(1));
        let published = hub.current().unwrap();
        assert_eq!(published.snapshot.version, 1);
        assert_eq!(published.snapshot.routes[0].id, "default/a/r");
        assert_eq!(
            published.snapshot.hash,
            sluice_proto::content_hash(&published.snapshot)
        );

        // Same objects again (e.g. a resync): no new version.
        assert_eq!(rb.rebuild(&a), Outcome::Unchanged(1));
        // A route of another class changes nothing either.
        let other = format!(
            "{SVC}{}{}",
            route("a", "/a", 1),
            route("b", "/b", 1).replace("ingressClassName: apisix", "ingressClassName: nginx")
        );
        assert_eq!(rb.rebuild(&inputs(&other)), Outcome::Unchanged(1));
        let ab = inputs(&format!(
            "{SVC}{}{}",
            route("a", "/a", 1),
            route("b", "/b", 1)
        ));
        assert_eq!(rb.rebuild(&ab), Outcome::Published(2));
        assert_eq!(hub.current().unwrap().snapshot.routes.len(), 2);
        assert_eq!(metrics.snapshot_version.get(), 2);
        assert_eq!(metrics.rebuilds.with_label_values(&["published"]).get(), 2);
        assert_eq!(metrics.rebuilds.with_label_values(&["unchanged"]).get(), 2);
    }

    #[test]
    fn since_version_moves_only_for_changed_objects() {
        let (mut rb, _hub, _) = rebuilder();
        let status = rb.subscribe_status();
        rb.rebuild(&inputs(&format!(
            "{SVC}{}{}",
            route("a", "/a", 1),
            route("b", "/b", 1)
        )));
        rb.rebuild(&inputs(&format!(
            "{SVC}{}{}",
            route("a", "/a", 1),
            route("b", "/b2", 2)
        )));
        let out = status.borrow().clone().unwrap();
        assert_eq!(out.version, 2);
        let since: Vec<(&str, u64)> = out
            .objects
            .iter()
            .map(|o| (o.status.name.as_str(), o.since_version))
            .collect();
        assert_eq!(since, [("a", 1), ("b", 2)]);
    }

    #[test]
    fn rejected_objects_are_listed_for_the_dataplanes() {
        let (mut rb, hub, _) = rebuilder();
        let yaml = format!(
            "{SVC}{}{}",
            route("a", "/a", 1),
            route("bad", "no-slash", 1)
        );
        rb.rebuild(&inputs(&yaml));
        let p = hub.current().unwrap();
        assert_eq!(p.snapshot.routes.len(), 1);
        assert_eq!(p.rejected_objects.len(), 1, "{:?}", p.rejected_objects);
        let line = &p.rejected_objects[0];
        assert!(
            line.starts_with("ApisixRoute default/bad: InvalidSpec: ")
                && line.contains("must start with"),
            "{line}"
        );
    }

    /// The rebuild loop over `state`, with a record of the (virtual) time of every read of
    /// the inputs, that is of every rebuild. `during` runs inside each rebuild (its argument
    /// is the rebuild's number, from 0) with the trigger in hand.
    struct Looped {
        hub: Arc<Hub>,
        state: Arc<std::sync::Mutex<Inputs>>,
        trigger: Arc<watch::Sender<u64>>,
        reads: Arc<std::sync::Mutex<Vec<tokio::time::Instant>>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Looped {
        fn start(yaml: &str, during: fn(usize, &watch::Sender<u64>)) -> Looped {
            let (_, hub, _) = rebuilder();
            let rb = Rebuilder::new(Arc::clone(&hub), Metrics::new().unwrap(), "apisix");
            let state = Arc::new(std::sync::Mutex::new(inputs(yaml)));
            let (trigger, rx) = watch::channel(0u64);
            let trigger = Arc::new(trigger);
            let reads = Arc::new(std::sync::Mutex::new(Vec::new()));
            let (read_state, read_trigger, read_reads) =
                (Arc::clone(&state), Arc::clone(&trigger), Arc::clone(&reads));
            let task = tokio::spawn(run(
                rb,
                move || {
                    let n = {
                        let mut reads = read_reads.lock().unwrap();
                        reads.push(tokio::time::Instant::now());
                        reads.len() - 1
                    };
                    during(n, &read_trigger);
                    read_state.lock().unwrap().clone()
                },
                rx,
                Debounce::default(),
                async {},
            ));
            Looped {
                hub,
                state,
                trigger,
                reads,
                task,
            }
        }

        async fn wait_version(&self, version: u64) {
            self.hub
                .subscribe()
                .wait_for(|p| p.as_ref().is_some_and(|p| p.snapshot.version >= version))
                .await
                .unwrap();
        }

        fn reads(&self) -> Vec<tokio::time::Instant> {
            self.reads.lock().unwrap().clone()
        }
    }

    /// A change that finds the loop idle is rebuilt without waiting for a quiet period (the
    /// old 100 ms debounce published it 100 ms later).
    #[tokio::test(start_paused = true)]
    async fn an_idle_change_is_rebuilt_at_once() {
        let l = Looped::start(&format!("{SVC}{}", route("a", "/a", 1)), |_, _| {});
        l.wait_version(1).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        *l.state.lock().unwrap() = inputs(&format!(
            "{SVC}{}{}",
            route("a", "/a", 1),
            route("b", "/b", 1)
        ));
        let changed = tokio::time::Instant::now();
        l.trigger.send_replace(1);
        l.wait_version(2).await;
        let waited = changed.elapsed();
        assert!(
            waited < Debounce::default().min_interval,
            "published {waited:?} after an idle change"
        );
        assert_eq!(l.reads().len(), 2);
        assert_eq!(l.hub.current().unwrap().snapshot.routes.len(), 2);
        l.task.abort();
    }

    /// 1,000 changes 1 ms apart: the first is rebuilt at once, the rest share rebuilds at
    /// most one per minimum interval (not one per change), and the last content is published.
    #[tokio::test(start_paused = true)]
    async fn a_burst_is_coalesced_and_its_first_change_is_rebuilt_at_once() {
        let l = Looped::start(&format!("{SVC}{}", route("a", "/a", 1)), |_, _| {});
        l.wait_version(1).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        *l.state.lock().unwrap() = inputs(&format!(
            "{SVC}{}{}",
            route("a", "/a", 1),
            route("b", "/b", 1)
        ));
        let burst = tokio::time::Instant::now();
        let trigger = Arc::clone(&l.trigger);
        let sender = tokio::spawn(async move {
            for i in 1..=1000u64 {
                trigger.send_replace(i);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        l.wait_version(2).await;
        assert!(
            burst.elapsed() < Debounce::default().min_interval,
            "the first change of the burst waited {:?}",
            burst.elapsed()
        );
        sender.await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rebuilds = l.reads().len() - 1;
        let bound = 1000 / Debounce::default().min_interval.as_millis() as usize + 2;
        assert!(
            (2..=bound).contains(&rebuilds),
            "{rebuilds} rebuilds for 1,000 changes over 1 s (at most {bound})"
        );
        let current = l.hub.current().unwrap();
        assert_eq!(current.snapshot.version, 2, "one new content, one version");
        assert_eq!(current.snapshot.routes.len(), 2);
        l.task.abort();
    }

    /// Changes that arrive while a rebuild runs cause exactly one more rebuild, started as
    /// soon as the minimum interval allows (the old debounce waited 100 ms of quiet first).
    #[tokio::test(start_paused = true)]
    async fn changes_during_a_rebuild_cause_exactly_one_more() {
        let l = Looped::start(&format!("{SVC}{}", route("a", "/a", 1)), |n, trigger| {
            if n == 1 {
                for i in 100..105 {
                    trigger.send_replace(i);
                }
            }
        });
        l.wait_version(1).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        l.trigger.send_replace(1);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let reads = l.reads();
        assert_eq!(reads.len(), 3, "the first build, the change, one more");
        let gap = reads[2] - reads[1];
        assert!(
            gap <= Debounce::default().min_interval,
            "the rebuild for the changes during a rebuild started {gap:?} after it"
        );
        l.task.abort();
    }

    /// A self-signed certificate for `host` valid until `not_after`: (cert PEM, key PEM).
    fn certificate(host: &str, not_after: SystemTime) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![host.to_owned()]).unwrap();
        params.not_before = time::OffsetDateTime::now_utc() - Duration::from_secs(3600);
        params.not_after = time::OffsetDateTime::from(not_after);
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A kubernetes.io/tls Secret `<name>-cert` and an ApisixTls `<name>` for `host`.
    fn tls_objects(name: &str, host: &str, not_after: SystemTime) -> String {
        let (crt, key) = certificate(host, not_after);
        let indent = |t: &str| t.lines().map(|l| format!("    {l}\n")).collect::<String>();
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}-cert}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}---\napiVersion: apisix.apache.org/v2\nkind: ApisixTls\nmetadata: {{name: {name}, generation: 1}}\nspec:\n  ingressClassName: apisix\n  hosts: [{host}]\n  secret: {{name: {name}-cert, namespace: default}}\n---\n",
            indent(&crt),
            indent(&key)
        )
    }

    fn tls_status(rebuilt: &Rebuilt, name: &str) -> sluice_translate::Condition {
        rebuilt
            .objects
            .iter()
            .find(|o| o.status.kind == ObjectKind::ApisixTls && o.status.name == name)
            .unwrap()
            .status
            .conditions[0]
            .clone()
    }

    /// Nothing changes in the cluster, yet the certificate that expires is dropped from the
    /// snapshot and its ApisixTls turns `Accepted=False` once it has expired.
    #[tokio::test]
    async fn an_expired_certificate_leaves_the_snapshot_on_time_without_any_change() {
        let (_, hub, _) = rebuilder();
        let rb = Rebuilder::new(Arc::clone(&hub), Metrics::new().unwrap(), "apisix");
        let mut status = rb.subscribe_status();
        let soon = SystemTime::now() + Duration::from_secs(2);
        let later = SystemTime::now() + Duration::from_secs(86_400);
        let state = inputs(&format!(
            "{}{}",
            tls_objects("soon", "soon.example.com", soon),
            tls_objects("later", "later.example.com", later)
        ));
        let (trigger, rx) = watch::channel(0u64);
        let task = tokio::spawn(run(
            rb,
            move || state.clone(),
            rx,
            Debounce::default(),
            async {},
        ));
        let mut version = hub.subscribe();
        version.wait_for(|p| p.is_some()).await.unwrap();
        let first = hub.current().unwrap();
        assert_eq!(first.snapshot.version, 1);
        let ids: Vec<&str> = first
            .snapshot
            .tls_certificates
            .iter()
            .map(|c| c.id.as_str())
            .collect();
        assert_eq!(ids, ["default/later", "default/soon"]);
        // NB: the status side output follows the publication; wait for it.
        let rebuilt = status
            .wait_for(|r| r.as_ref().is_some_and(|r| r.version == 1))
            .await
            .unwrap()
            .clone()
            .unwrap();
        let accepted = tls_status(&rebuilt, "soon");
        assert_eq!(accepted.status, ConditionStatus::True);

        // No trigger: only the expiry timer can cause version 2.
        tokio::time::timeout(
            Duration::from_secs(10),
            version.wait_for(|p| p.as_ref().is_some_and(|p| p.snapshot.version == 2)),
        )
        .await
        .expect("rebuilt when the certificate expired")
        .unwrap();
        assert!(SystemTime::now() > soon, "not rebuilt before the expiry");
        let second = hub.current().unwrap();
        let ids: Vec<&str> = second
            .snapshot
            .tls_certificates
            .iter()
            .map(|c| c.id.as_str())
            .collect();
        assert_eq!(ids, ["default/later"]);
        let rebuilt = status
            .wait_for(|r| r.as_ref().is_some_and(|r| r.version == 2))
            .await
            .unwrap()
            .clone()
            .unwrap();
        let accepted = tls_status(&rebuilt, "soon");
        assert_eq!(accepted.status, ConditionStatus::False);
        assert_eq!(accepted.reason, "InvalidCertificateRef");
        assert!(
            accepted.message.contains("Secret default/soon-cert")
                && accepted.message.contains("expired at"),
            "{}",
            accepted.message
        );
        assert!(
            second
                .rejected_objects
                .iter()
                .any(|l| l.contains("ApisixTls default/soon")),
            "{:?}",
            second.rejected_objects
        );
        // The verdict changed, so the object's since-version moved with it.
        let soon_verdict = rebuilt
            .objects
            .iter()
            .find(|o| o.status.name == "soon")
            .unwrap();
        assert_eq!(soon_verdict.since_version, 2);
        drop(trigger);
        task.abort();
    }

    #[test]
    fn the_default_certificate_flag_names_its_secret_when_it_is_bad() {
        let (rb, hub, _) = rebuilder();
        let mut rb = rb.with_tls(TlsSettings {
            default_certificate: Some(("default".into(), "missing".into())),
            fallback_sni: None,
        });
        let later = SystemTime::now() + Duration::from_secs(86_400);
        rb.rebuild(&inputs(&tls_objects("a", "a.example.com", later)));
        let p = hub.current().unwrap();
        assert!(p.snapshot.default_certificate.is_none());
        assert_eq!(
            p.snapshot.tls_certificates.len(),
            1,
            "other certificates serve"
        );
        assert!(
            p.rejected_objects.iter().any(|l| l.starts_with(
                "--default-ssl-certificate default/missing: Secret default/missing not found"
            )),
            "{:?}",
            p.rejected_objects
        );

        let mut rb = rb.with_tls(TlsSettings {
            default_certificate: Some(("default".into(), "a-cert".into())),
            fallback_sni: Some("a.example.com".into()),
        });
        rb.rebuild(&inputs(&tls_objects("a", "a.example.com", later)));
        let p = hub.current().unwrap();
        let default = p.snapshot.default_certificate.as_ref().unwrap();
        assert_eq!(default.id, "default-certificate");
        assert_eq!(p.snapshot.fallback_sni, "a.example.com");
        assert!(p.rejected_objects.is_empty(), "{:?}", p.rejected_objects);
    }

    /// `--allow-cross-namespace-refs` reaches translation: without it an ApisixTls of
    /// namespace shop cannot serve Secret default/a-cert (no ReferenceGrant), with it it can.
    #[test]
    fn cross_namespace_references_need_a_grant_unless_the_flag_allows_them() {
        let (rb, hub, _) = rebuilder();
        let later = SystemTime::now() + Duration::from_secs(86_400);
        let yaml = format!(
            "{}apiVersion: apisix.apache.org/v2\nkind: ApisixTls\nmetadata: {{name: b, namespace: shop, generation: 1}}\nspec:\n  ingressClassName: apisix\n  hosts: [b.example.com]\n  secret: {{name: a-cert, namespace: default}}\n---\n",
            tls_objects("a", "a.example.com", later)
        );
        let ids = || -> Vec<String> {
            let p = hub.current().unwrap();
            p.snapshot
                .tls_certificates
                .iter()
                .map(|c| c.id.clone())
                .collect()
        };
        let mut rb = rb;
        rb.rebuild(&inputs(&yaml));
        assert_eq!(ids(), ["default/a"]);
        let p = hub.current().unwrap();
        assert!(
            p.rejected_objects.iter().any(|l| l.starts_with(
                "ApisixTls shop/b: RefNotPermitted: spec.secret: Secret default/a-cert is in another namespace"
            )),
            "{:?}",
            p.rejected_objects
        );

        let mut rb = rb.with_cross_namespace_refs(CrossNamespaceRefs::Allow);
        rb.rebuild(&inputs(&yaml));
        assert_eq!(ids(), ["default/a", "shop/b"]);
        assert!(hub.current().unwrap().rejected_objects.is_empty());
    }

    #[tokio::test]
    async fn loop_waits_for_sync_then_rebuilds_per_batch() {
        let (_rb, hub, _) = rebuilder();
        let metrics = Metrics::new().unwrap();
        let rb = Rebuilder::new(Arc::clone(&hub), metrics, "apisix");
        let state = Arc::new(std::sync::Mutex::new(inputs(&format!(
            "{SVC}{}",
            route("a", "/a", 1)
        ))));
        let (trigger, rx) = watch::channel(0u64);
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel::<()>();
        let read = Arc::clone(&state);
        let task = tokio::spawn(run(
            rb,
            move || read.lock().unwrap().clone(),
            rx,
            Debounce::default(),
            async move {
                let _ = synced_rx.await;
            },
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            hub.current().is_none(),
            "nothing published before the caches sync"
        );
        synced_tx.send(()).unwrap();
        let mut version = hub.subscribe();
        version.wait_for(|p| p.is_some()).await.unwrap();
        assert_eq!(hub.current().unwrap().snapshot.version, 1);

        *state.lock().unwrap() = inputs(&format!(
            "{SVC}{}{}",
            route("a", "/a", 1),
            route("b", "/b", 1)
        ));
        trigger.send_replace(1);
        version
            .wait_for(|p| p.as_ref().is_some_and(|p| p.snapshot.version == 2))
            .await
            .unwrap();
        drop(trigger);
        task.await.unwrap();
    }
}
