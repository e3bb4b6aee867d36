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
//!   An invalid rule (see the messages in `src/apisix/route.rs`; everything the dataplane router would
//!   reject is rejected here) makes the whole object `Accepted=False` (`InvalidSpec`) and
//!   none of its rules enter the snapshot, as APISIX does; other objects are unaffected.
//! - `backends[]` become upstreams `<ns>/<service>:<port>[@service][#subset]` (port = the
//!   Service port number); `src/upstream/mod.rs` documents how endpoints are resolved
//!   (EndpointSlices, ClusterIP, headless and ExternalName Services, subsets by Pod labels).
//!   A missing Service or port keeps the route (with an upstream
//!   without endpoints, so requests get 503) and sets `ResolvedRefs=False`
//!   (`BackendNotFound`).
//! - `upstreams[]` reference ApisixUpstreams with `externalNodes`: upstream `<ns>/<name>`.
//! - An ApisixUpstream named after a Service applies its load balancer, scheme, retries and
//!   timeouts (with `portLevelSettings`) to that Service's upstreams. An invalid one is
//!   `Accepted=False` and ignored.
//! - Plugins (`src/apisix/plugins.rs`): every config is validated by `sluice-plugin-config`
//!   (unknown plugin, wrong type or out-of-range value ⇒ `Accepted=False` naming the plugin
//!   and field). A rule's plugins = its ApisixPluginConfig, overridden by its `plugins`, then
//!   by the plugin `authentication` implies (keyAuth/basicAuth/jwtAuth/hmacAuth). ApisixConsumers
//!   become snapshot consumers `<ns>_<name>` (credentials inline or from a Secret, plus
//!   consumer plugins); ApisixGlobalRules become global rules `<ns>/<name>`.
//! - `traffic-split` (`src/apisix/traffic_split.rs`): each weighted upstream resolves in the
//!   route's namespace (`<service>:<port>`, a single-port Service, an ApisixUpstream with
//!   externalNodes, or inline nodes → `<route id>/traffic-split/<rule>/<entry>`) into a
//!   snapshot upstream, and the plugin config is rewritten to carry snapshot upstream ids;
//!   an id that names nothing rejects the rule naming the `upstream_id` field.
//! - Fail closed: unsupported authentication types, missing ApisixPluginConfigs,
//!   `filter_func`, Body exprs and plugin `secretRef`s to missing Secrets reject the rule
//!   instead of serving it with less protection than written. Plugin `secretRef`s are merged
//!   (dotted keys nest).
//! - Cross-namespace references (ApisixUpstream `tlsSecret`, ApisixTls `secret` and
//!   `client.caSecret`, ApisixRoute `plugin_config_namespace`) need a ReferenceGrant in the
//!   target's namespace unless [`Options::cross_namespace_refs`] allows them all; a refused
//!   one is treated like a missing target, with reason `RefNotPermitted` ([`refs`]).
//! - With `Options::ingress_class = Some(c)`, only objects whose `spec.ingressClassName` is
//!   `c` or unset are translated; others get no status at all (another controller owns them).
//! - Each Ingress `spec.rules[i].http.paths[j]` becomes one route with id
//!   `<ns>/<name>/ingress-r<i>-p<j>`, `spec.defaultBackend` a host-less `/*` route
//!   `<ns>/<name>/ingress-default` with the lowest priority; `src/ingress/mod.rs` documents path
//!   types and annotations. Backends resolve like ApisixRoute backends. An Ingress counts for
//!   class `c` when `spec.ingressClassName` or the legacy `kubernetes.io/ingress.class`
//!   annotation is `c`, or neither is set and IngressClass `c` is the cluster default (unlike
//!   ApisixRoute, an unclassed Ingress is not ours otherwise). Ingress verdicts are in
//!   [`Translation::ingresses`], not in the status report.
//! - Each ApisixRoute `spec.stream[]` rule becomes one stream route
//!   `<ns>/<name>/stream/<rule>` on a declared stream port ([`Options::stream_ports`], listener
//!   `stream/<tcp|udp|tls>/<port>`); `src/apisix/stream.rs` documents ports, SNI, backends,
//!   plugins and who keeps a contested (port, host).
//! - ApisixTls objects and Ingress `spec.tls[]` entries become `tls_certificates`; `src/tls.rs`
//!   documents the checks (Secret present, PEM, key matches, validity at [`Options::now`]) and
//!   how two claims of one host are settled, the default certificate and fallback SNI
//!   ([`Options::default_certificate`], [`Options::fallback_sni`]) and when certificate
//!   verdicts change with time ([`Translation::certificates_change_at`]).
//! - Gateway API (GatewayClass, Gateway, HTTPRoute, GRPCRoute, TLSRoute, TCPRoute, UDPRoute,
//!   ReferenceGrant) of the
//!   GatewayClasses whose `controllerName` is [`Options::gateway`]'s: see [`gateway`] for
//!   listeners, attachment, route ids (`<ns>/<name>/httproute-r<i>-m<j>`, stream routes
//!   `<ns>/<name>/tcproute-r<i>`), precedence against
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

mod apisix;
mod builder;
pub mod files;
pub mod gateway;
pub mod golden;
mod index;
pub(crate) mod ingress;
mod json;
mod options;
mod problems;
pub mod refs;
pub mod state;
pub mod status;
mod tls;
mod upstream;
mod validate;

pub use builder::Translation;
pub use index::SERVICE_NAME_LABEL;
pub use ingress::nginx;
pub use options::{Options, STREAM_PORTS_FLAG, StreamPort, StreamPortProtocol, parse_stream_ports};
pub use refs::CrossNamespaceRefs;
pub use state::{ClusterState, DocumentError, LoadFileError, LoadReport, YamlError};
pub use status::{
    Condition, ConditionStatus, IngressStatus, ObjectKind, ObjectStatus, StatusReport,
};
pub use tls::{
    DEFAULT_CERTIFICATE_FLAG, DEFAULT_CERTIFICATE_ID, FALLBACK_SNI_FLAG, parse_fallback_sni,
    parse_secret_ref,
};

pub(crate) use index::{Index, key};

/// Translates the cluster state into a snapshot and a status report. Pure and deterministic.
///
/// The processors run in this order, each adding its family's part to one
/// [`builder::Builder`]: ApisixUpstreams first (every family's Service backends take their
/// settings), ApisixPluginConfigs (routes merge them), ApisixConsumers, ApisixGlobalRules,
/// ApisixRoutes, certificates (ApisixTls and Ingress `spec.tls[]`, settled together),
/// Ingresses (an id an ApisixRoute holds rejects the Ingress), and the Gateway API last (its
/// routes rank below the others and never take an id or a TLS host already held).
pub fn translate(state: &ClusterState, opts: &Options) -> Translation {
    let idx = Index::build(state, opts);
    let mut out = builder::Builder::default();
    let aus = apisix::upstreams(&idx, &mut out);
    let pcs = apisix::plugin_configs(&idx, &mut out);
    apisix::consumers(&idx, &mut out);
    apisix::global_rules(&idx, &mut out);
    apisix::routes(&idx, &aus, &pcs, &opts.stream_ports, &mut out);
    let ingress_tls = out.tls(tls::translate(&idx, opts));
    out.stream_listeners(&opts.stream_ports);
    ingress::translate(&idx, &aus, ingress_tls, &mut out);
    let gw = gateway::translate(state, &idx, &aus, opts, &out.routes, out.certificates());
    out.gateway(gw);
    out.finish()
}
