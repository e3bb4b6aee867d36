//! Pure, deterministic translation from cluster state to a route snapshot plus status.
//!
//! ```text
//! ClusterState (ApisixRoute, ApisixUpstream, Service, EndpointSlice, Secret, ...)
//!     │  translate(&state, &Options)
//!     ▼
//! Translation { snapshot: sluice_proto::v1::Snapshot, status: StatusReport }
//! ```
//!
//! [`translate`] does no I/O and its output does not depend on the order of objects in the
//! [`ClusterState`]: routes and upstreams are sorted by id, so the same input gives the same
//! bytes (and hash) on every controller replica. The snapshot comes out with `version = 0`
//! and an empty `hash`; the caller seals it with [`sluice_proto::seal`].
//!
//! Standalone mode and tests fill a [`ClusterState`] from YAML with
//! [`ClusterState::load_yaml`].
//!
//! # Semantics
//!
//! - Each ApisixRoute `spec.http[]` rule becomes one route with id `<ns>/<name>/<rule>`.
//!   An invalid rule (see the messages in `route.rs`; everything the dataplane router would
//!   reject is rejected here) makes the whole object `Accepted=False` (`InvalidSpec`) and
//!   none of its rules enter the snapshot, as APISIX does; other objects are unaffected.
//! - `backends[]` become upstreams `<ns>/<service>:<port>[@service][#subset]` (port = the
//!   Service port number); `src/upstream.rs` documents how endpoints are resolved
//!   (EndpointSlices, ClusterIP, headless and ExternalName Services, subsets by Pod labels).
//!   A missing Service or port keeps the route (with an upstream
//!   without endpoints, so requests get 503) and sets `ResolvedRefs=False`
//!   (`BackendNotFound`).
//! - `upstreams[]` reference ApisixUpstreams with `externalNodes`: upstream `<ns>/<name>`.
//! - An ApisixUpstream named after a Service applies its load balancer, scheme, retries and
//!   timeouts (with `portLevelSettings`) to that Service's upstreams. An invalid one is
//!   `Accepted=False` and ignored.
//! - Plugins (`src/plugins.rs`): every config is validated by `sluice-plugin-config`
//!   (unknown plugin, wrong type or out-of-range value ⇒ `Accepted=False` naming the plugin
//!   and field). A rule's plugins = its ApisixPluginConfig, overridden by its `plugins`, then
//!   by the plugin `authentication` implies (keyAuth/basicAuth/jwtAuth/hmacAuth). ApisixConsumers
//!   become snapshot consumers `<ns>_<name>` (credentials inline or from a Secret, plus
//!   consumer plugins); ApisixGlobalRules become global rules `<ns>/<name>`.
//! - `traffic-split` (`src/traffic_split.rs`): each weighted upstream resolves in the
//!   route's namespace (`<service>:<port>`, a single-port Service, an ApisixUpstream with
//!   externalNodes, or inline nodes → `<route id>/traffic-split/<rule>/<entry>`) into a
//!   snapshot upstream, and the plugin config is rewritten to carry snapshot upstream ids;
//!   an id that names nothing rejects the rule naming the `upstream_id` field.
//! - Fail closed: unsupported authentication types, missing ApisixPluginConfigs,
//!   `filter_func`, Body exprs and plugin `secretRef`s to missing Secrets reject the rule
//!   instead of serving it with less protection than written. Plugin `secretRef`s are merged
//!   (dotted keys nest).
//! - With `Options::ingress_class = Some(c)`, only objects whose `spec.ingressClassName` is
//!   `c` or unset are translated; others get no status at all (another controller owns them).
//! - Each Ingress `spec.rules[i].http.paths[j]` becomes one route with id
//!   `<ns>/<name>/ingress-r<i>-p<j>`, `spec.defaultBackend` a host-less `/*` route
//!   `<ns>/<name>/ingress-default` with the lowest priority; `src/ingress.rs` documents path
//!   types and annotations. Backends resolve like ApisixRoute backends. An Ingress counts for
//!   class `c` when `spec.ingressClassName` or the legacy `kubernetes.io/ingress.class`
//!   annotation is `c`, or neither is set and IngressClass `c` is the cluster default (unlike
//!   ApisixRoute, an unclassed Ingress is not ours otherwise). Ingress verdicts are in
//!   [`Translation::ingresses`], not in the status report.
//! - ApisixTls objects and Ingress `spec.tls[]` entries become `tls_certificates`; `src/tls.rs`
//!   documents the checks (Secret present, PEM, key matches, validity at [`Options::now`]) and
//!   how two claims of one host are settled, the default certificate and fallback SNI
//!   ([`Options::default_certificate`], [`Options::fallback_sni`]) and when certificate
//!   verdicts change with time ([`Translation::certificates_change_at`]).
//! - Gateway API (GatewayClass, Gateway, HTTPRoute, GRPCRoute, ReferenceGrant) of the
//!   GatewayClasses whose `controllerName` is [`Options::gateway`]'s: see [`gateway`] for
//!   listeners, attachment, route ids (`<ns>/<name>/httproute-r<i>-m<j>`), precedence against
//!   Apisix and Ingress routes, and what is reported unsupported. Its status is
//!   [`StatusReport::gateway`].
//!
//! # Golden tests
//!
//! `testdata/<family>/<case>.in.yaml` holds objects as a user writes them; `<case>.out.yaml`
//! the snapshot (canonical protobuf JSON mapping, as YAML) and the status report. [`golden`]
//! documents the layout, the families and the `# options:` line. Regenerate the expected
//! files after an intended change with
//!
//! ```text
//! SLUICE_UPDATE_GOLDEN=1 cargo test -p sluice-translate --test golden
//! ```
//!
//! and review the diff.
#![forbid(unsafe_code)]

pub mod files;
pub mod gateway;
pub mod golden;
mod ingress;
mod json;
mod plugins;
mod problems;
mod route;
pub mod state;
pub mod status;
mod tls;
mod traffic_split;
pub use tls::{
    DEFAULT_CERTIFICATE_FLAG, DEFAULT_CERTIFICATE_ID, FALLBACK_SNI_FLAG, parse_fallback_sni,
    parse_secret_ref,
};
mod upstream;
mod upstream_health;
mod validate;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sluice_crds::{
    ApisixConsumer, ApisixGlobalRule, ApisixPluginConfig, ApisixRoute, ApisixTls, ApisixUpstream,
};
use sluice_proto::v1;

pub use state::{ClusterState, DocumentError, LoadFileError, LoadReport, YamlError};
pub use status::{
    Condition, ConditionStatus, IngressStatus, ObjectKind, ObjectStatus, StatusReport,
};

use problems::Problems;

/// Label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// How to translate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// `None` (the default, used by standalone mode): translate every object. `Some(class)`:
    /// only objects whose `spec.ingressClassName` is `class` or unset (for Ingresses: see the
    /// crate docs).
    pub ingress_class: Option<String>,
    /// The time certificates must be valid at (the controller and standalone mode pass the
    /// current time). `None` (the default): validity periods are not checked.
    pub now: Option<std::time::SystemTime>,
    /// (namespace, name) of the kubernetes.io/tls Secret served to handshakes without SNI or
    /// for a host no certificate covers (`--default-ssl-certificate NS/NAME`, as in
    /// ingress-nginx). `None` (the default): those handshakes are refused.
    pub default_certificate: Option<(String, String)>,
    /// A ClientHello without SNI gets the certificate of this host (APISIX
    /// `apisix.ssl.fallback_sni`; `--fallback-sni`). `None` (the default): not set.
    pub fallback_sni: Option<String>,
    /// Gateway API settings (controller name, served ports); see [`gateway`].
    pub gateway: gateway::GatewayOptions,
}

/// The result of [`translate`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Translation {
    /// Routes and upstreams sorted by id; `version = 0`, `hash` empty (seal it with
    /// [`sluice_proto::seal`]).
    pub snapshot: v1::Snapshot,
    /// Conditions per object.
    pub status: StatusReport,
    /// Conditions per Ingress of this controller's class, sorted by namespace and name (see
    /// [`IngressStatus`] for why they are not in `status`).
    pub ingresses: Vec<IngressStatus>,
    /// Problems with the settings in [`Options`] (a bad `--default-ssl-certificate` Secret,
    /// a `--fallback-sni` no certificate covers), one line each naming the flag. Empty when
    /// all is well.
    pub settings: Vec<String>,
    /// With [`Options::now`]: the next time a certificate's validity verdict changes (one
    /// second past the earliest `notAfter` of a checked certificate, or the earliest future
    /// `notBefore`). Translate again then so an expired certificate stops being served and
    /// its object gets `Accepted=False`. `None`: nothing changes with time.
    pub certificates_change_at: Option<std::time::SystemTime>,
}

/// Objects of the state indexed by (namespace, name), in sorted order.
pub(crate) struct Index<'a> {
    pub(crate) routes: BTreeMap<(&'a str, &'a str), &'a ApisixRoute>,
    /// Ingresses of this controller's class.
    pub(crate) ingresses: BTreeMap<(&'a str, &'a str), &'a Ingress>,
    pub(crate) upstreams: BTreeMap<(&'a str, &'a str), &'a ApisixUpstream>,
    pub(crate) services: BTreeMap<(&'a str, &'a str), &'a Service>,
    /// Keyed by (namespace, Service name from the label); slices sorted by name.
    pub(crate) slices: BTreeMap<(&'a str, &'a str), Vec<&'a EndpointSlice>>,
    pub(crate) secrets: BTreeMap<(&'a str, &'a str), &'a Secret>,
    pub(crate) plugin_configs: BTreeMap<(&'a str, &'a str), &'a ApisixPluginConfig>,
    pub(crate) consumers: BTreeMap<(&'a str, &'a str), &'a ApisixConsumer>,
    pub(crate) global_rules: BTreeMap<(&'a str, &'a str), &'a ApisixGlobalRule>,
    pub(crate) tlses: BTreeMap<(&'a str, &'a str), &'a ApisixTls>,
    /// Pod labels, keyed by (namespace, Pod name); for subsets.
    pub(crate) pod_labels: BTreeMap<(&'a str, &'a str), Option<&'a BTreeMap<String, String>>>,
}

/// (namespace, name) of an object; the namespace defaults to `default`.
fn key(meta: &ObjectMeta) -> (&str, &str) {
    (
        meta.namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(state::DEFAULT_NAMESPACE),
        meta.name.as_deref().unwrap_or_default(),
    )
}

fn class_selected(class: Option<&str>, opts: &Options) -> bool {
    match (&opts.ingress_class, class.filter(|c| !c.is_empty())) {
        (None, _) | (Some(_), None) => true,
        (Some(want), Some(have)) => want == have,
    }
}

impl<'a> Index<'a> {
    fn build(state: &'a ClusterState, opts: &Options) -> Self {
        // NB: with duplicate (namespace, name) entries the later one wins, like the loader.
        let routes = state
            .apisix_routes
            .iter()
            .filter(|o| class_selected(o.spec.ingress_class_name.as_deref(), opts))
            .map(|o| (key(&o.metadata), o))
            .collect();
        let ingresses = state
            .ingresses
            .iter()
            .filter(|o| ingress::selected(o, &state.ingress_classes, opts))
            .map(|o| (key(&o.metadata), o))
            .collect();
        let upstreams = state
            .apisix_upstreams
            .iter()
            .filter(|o| class_selected(o.spec.ingress_class_name.as_deref(), opts))
            .map(|o| (key(&o.metadata), o))
            .collect();
        let services = state
            .services
            .iter()
            .map(|o| (key(&o.metadata), o))
            .collect();
        let secrets = state
            .secrets
            .iter()
            .map(|o| (key(&o.metadata), o))
            .collect();
        let tlses = state
            .apisix_tlses
            .iter()
            .filter(|o| class_selected(o.spec.ingress_class_name.as_deref(), opts))
            .map(|o| (key(&o.metadata), o))
            .collect();
        let mut slices: BTreeMap<(&str, &str), Vec<&EndpointSlice>> = BTreeMap::new();
        for s in &state.endpoint_slices {
            let svc = s
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL));
            if let Some(svc) = svc {
                slices
                    .entry((key(&s.metadata).0, svc.as_str()))
                    .or_default()
                    .push(s);
            }
        }
        let pod_labels = state
            .pods
            .iter()
            .map(|p| (key(&p.metadata), p.metadata.labels.as_ref()))
            .collect();
        for list in slices.values_mut() {
            list.sort_by(|a, b| key(&a.metadata).cmp(&key(&b.metadata)));
            list.dedup_by(|a, b| key(&a.metadata) == key(&b.metadata));
        }
        let plugin_configs = state
            .apisix_plugin_configs
            .iter()
            .filter(|o| class_selected(o.spec.ingress_class_name.as_deref(), opts))
            .map(|o| (key(&o.metadata), o))
            .collect();
        let consumers = state
            .apisix_consumers
            .iter()
            .filter(|o| class_selected(o.spec.ingress_class_name.as_deref(), opts))
            .map(|o| (key(&o.metadata), o))
            .collect();
        let global_rules = state
            .apisix_global_rules
            .iter()
            .filter(|o| class_selected(o.spec.ingress_class_name.as_deref(), opts))
            .map(|o| (key(&o.metadata), o))
            .collect();
        Self {
            routes,
            ingresses,
            upstreams,
            services,
            slices,
            secrets,
            plugin_configs,
            consumers,
            global_rules,
            tlses,
            pod_labels,
        }
    }
}

/// Translates the cluster state into a snapshot and a status report. Pure and deterministic.
pub fn translate(state: &ClusterState, opts: &Options) -> Translation {
    let idx = Index::build(state, opts);
    let mut status = StatusReport::default();

    // ApisixUpstreams first: routes need their verdicts.
    let mut aus = BTreeMap::new();
    for (&(ns, name), au) in &idx.upstreams {
        let mut problems = Problems::default();
        let verdict = upstream::validate_object(au, ns, &idx, &mut problems);
        let mut conditions = vec![problems.accepted()];
        let has_service_nodes = au
            .spec
            .external_nodes
            .iter()
            .any(|n| n.type_ == Some(sluice_crds::ExternalNodeType::Service));
        if verdict.is_ok() && has_service_nodes {
            conditions.push(problems.resolved_refs());
        }
        status.objects.push(ObjectStatus {
            kind: ObjectKind::ApisixUpstream,
            namespace: ns.to_owned(),
            name: name.to_owned(),
            generation: au.metadata.generation,
            conditions,
            routes: Vec::new(),
        });
        aus.insert((ns, name), verdict);
    }

    // ApisixPluginConfigs next: routes merge them.
    let mut pcs: route::PluginConfigs<'_> = BTreeMap::new();
    for (&(ns, name), pc) in &idx.plugin_configs {
        let mut problems = Problems::default();
        let list = plugins::plugin_list(
            &pc.spec.plugins,
            ns,
            "spec.plugins",
            &idx.secrets,
            plugins::Owner::Route,
            &mut problems,
        );
        status.objects.push(simple_status(
            ObjectKind::ApisixPluginConfig,
            ns,
            name,
            pc.metadata.generation,
            &problems,
        ));
        pcs.insert(
            (ns, name),
            if problems.is_valid() {
                Ok(list)
            } else {
                Err(())
            },
        );
    }
    let mut consumers = Vec::new();
    // A credential (key-auth key, basic-auth username, jwt-auth key) names one consumer:
    // a later consumer (by namespace/name) reusing one is rejected.
    let mut credentials: BTreeMap<(String, String), String> = BTreeMap::new();
    for (&(ns, name), ac) in &idx.consumers {
        let mut problems = Problems::default();
        let c = plugins::consumer(ac, ns, name, &idx.secrets, &mut problems).filter(|c| {
            let ids = plugins::credential_ids(c);
            for (plugin, id) in &ids {
                if let Some(owner) = credentials.get(&(plugin.clone(), id.clone())) {
                    problems.error(
                        "spec.authParameter",
                        format!("the {plugin} credential is already used by consumer {owner}"),
                    );
                    return false;
                }
            }
            for id in ids {
                credentials.insert(id, c.name.clone());
            }
            true
        });
        status.objects.push(simple_status(
            ObjectKind::ApisixConsumer,
            ns,
            name,
            ac.metadata.generation,
            &problems,
        ));
        consumers.extend(c);
    }
    consumers.sort_by(|a: &v1::Consumer, b| a.name.cmp(&b.name));
    let mut global_rules = Vec::new();
    for (&(ns, name), gr) in &idx.global_rules {
        let mut problems = Problems::default();
        let list = plugins::plugin_list(
            &gr.spec.plugins,
            ns,
            "spec.plugins",
            &idx.secrets,
            plugins::Owner::GlobalRule,
            &mut problems,
        );
        status.objects.push(simple_status(
            ObjectKind::ApisixGlobalRule,
            ns,
            name,
            gr.metadata.generation,
            &problems,
        ));
        if problems.is_valid() {
            global_rules.push(v1::GlobalRule {
                id: format!("{ns}/{name}"),
                plugins: list,
            });
        }
    }

    let mut routes: BTreeMap<String, v1::Route> = BTreeMap::new();
    let mut upstreams: BTreeMap<String, v1::Upstream> = BTreeMap::new();
    for (&(ns, name), ar) in &idx.routes {
        let mut problems = Problems::default();
        let out = route::translate_object(ar, ns, name, &idx, &aus, &pcs, &mut problems);
        let mut conditions = vec![problems.accepted()];
        let mut ids = Vec::new();
        if problems.is_valid() {
            conditions.push(problems.resolved_refs());
            for r in out.routes {
                ids.push(r.id.clone());
                routes.insert(r.id.clone(), r);
            }
            for u in out.upstreams {
                // The same id always resolves to the same content, so the first one stays.
                upstreams.entry(u.id.clone()).or_insert(u);
            }
        }
        ids.sort();
        status.objects.push(ObjectStatus {
            kind: ObjectKind::ApisixRoute,
            namespace: ns.to_owned(),
            name: name.to_owned(),
            generation: ar.metadata.generation,
            conditions,
            routes: ids,
        });
    }
    let mut tls = tls::translate(&idx, opts);
    status.objects.append(&mut tls.apisix);
    let mut ingresses = Vec::new();
    for (&(ns, name), ing) in &idx.ingresses {
        let mut problems = Problems::default();
        let out = ingress::translate_object(ing, ns, name, &idx, &aus, &mut problems);
        if let Some(list) = tls.ingress.remove(&(ns.to_owned(), name.to_owned())) {
            for (reason, field, message) in list {
                problems.unresolved(reason, field, message);
            }
        }
        let mut ids = Vec::new();
        // An ApisixRoute of the same name with a rule named like `ingress-r0-p0` would take
        // the same id: reject the Ingress rather than silently replace that route.
        for r in &out.routes {
            if let Some(other) = routes.get(&r.id) {
                problems.error(
                    "metadata.name",
                    format!("route id {} is already used by {}", r.id, other.source),
                );
            }
        }
        let mut conditions = vec![problems.accepted()];
        if problems.is_valid() {
            conditions.push(problems.resolved_refs());
            for r in out.routes {
                ids.push(r.id.clone());
                routes.insert(r.id.clone(), r);
            }
            for u in out.upstreams {
                upstreams.entry(u.id.clone()).or_insert(u);
            }
        }
        ids.sort();
        ingresses.push(IngressStatus {
            namespace: ns.to_owned(),
            name: name.to_owned(),
            generation: ing.metadata.generation,
            conditions,
            routes: ids,
        });
    }
    // Gateway API last: its routes rank below Apisix and Ingress routes (see `gateway`).
    let mut gw = gateway::translate(state, &idx, &aus, opts, &routes, &tls.certificates);
    for r in gw.routes {
        routes.entry(r.id.clone()).or_insert(r);
    }
    for u in gw.upstreams {
        upstreams.entry(u.id.clone()).or_insert(u);
    }
    tls.certificates.append(&mut gw.certificates);
    tls.certificates.sort_by(|a, b| a.id.cmp(&b.id));
    if let Some(at) = gw.changes_at {
        tls.changes_at = Some(tls.changes_at.map_or(at, |n| n.min(at)));
    }
    status.gateway = gw.status;
    status.sort();

    Translation {
        snapshot: v1::Snapshot {
            version: 0,
            hash: String::new(),
            routes: routes.into_values().collect(),
            upstreams: upstreams.into_values().collect(),
            consumers,
            global_rules,
            tls_certificates: tls.certificates,
            // NB: the operator's --default-ssl-certificate wins over a Gateway's.
            default_certificate: tls.default_certificate.or(gw.default_certificate),
            fallback_sni: tls.fallback_sni,
            listeners: gw.listeners,
        },
        status,
        ingresses,
        settings: tls.settings,
        certificates_change_at: tls
            .changes_at
            .and_then(|s| u64::try_from(s).ok())
            .map(|s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s)),
    }
}

/// The status of an object that only has an `Accepted` condition.
fn simple_status(
    kind: ObjectKind,
    ns: &str,
    name: &str,
    generation: Option<i64>,
    problems: &Problems,
) -> ObjectStatus {
    ObjectStatus {
        kind,
        namespace: ns.to_owned(),
        name: name.to_owned(),
        generation,
        conditions: vec![problems.accepted()],
        routes: Vec::new(),
    }
}
