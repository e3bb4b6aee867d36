//! Gateway API (GatewayClass, Gateway, ListenerSet, HTTPRoute, GRPCRoute, TLSRoute, TCPRoute,
//! UDPRoute, ReferenceGrant) → snapshot routes, stream routes, upstreams and certificates, plus the Gateway API status ([`GatewayStatusReport`]).
//!
//! # What is ours
//!
//! - A GatewayClass is Sluice's when `spec.controllerName` is
//!   [`GatewayOptions::controller_name`] (default `sluice.dev/gateway-controller`). Gateways of
//!   other classes, and routes whose parents are all such Gateways, get no status at all.
//! - The Gateway API is independent of `Options::ingress_class`.
//!
//! # Listeners
//!
//! One dataplane fleet serves every Gateway of Sluice's classes: one plain-HTTP port and one
//! HTTPS port ([`GatewayOptions::http_port`] / [`GatewayOptions::https_port`], the ports of
//! the dataplane Service, default 80 and 443). A listener is `Accepted` when its protocol is
//! `HTTP` or `HTTPS` (else `UnsupportedProtocol`) on the matching port (else
//! `PortUnavailable`); two listeners of one Gateway on the same port with different
//! protocols are `Conflicted` (`ProtocolConflict`), with the same protocol and hostname
//! (`HostnameConflict`). Listeners of different Gateways share the ports, as the Gateway API
//! allows ("merging").
//!
//! `TLS` (modes `Passthrough` and `Terminate`), `TCP` and `UDP` listeners need per-Gateway
//! ports (below); on the shared ports they are `UnsupportedProtocol`. Each takes only its
//! kind of route (`supportedKinds`: TLSRoute, TCPRoute, UDPRoute; another kind in
//! `allowedRoutes.kinds` is `InvalidRouteKinds`). TLS listeners of both modes share a port
//! (SNI tells them apart); a UDP listener shares its port number with a TCP-based one; on one
//! transport and port, other protocols conflict (`ProtocolConflict`), and two TCP or two UDP
//! listeners too (`HostnameConflict`: they have no hostname). A `Terminate` listener's
//! certificate is read as an HTTPS listener's. [`stream`] translates their routes.
//!
//! HTTPS listeners terminate TLS with their first `certificateRefs` entry, checked exactly as
//! an ApisixTls Secret is (`tls.rs`: present, PEM, key matches the leaf, valid at
//! `Options::now`); a Secret in another namespace needs a ReferenceGrant (`RefNotPermitted`).
//! The certificate is served for the listener's hostname, or, for a listener without one,
//! for the DNS names of the certificate. A host that an ApisixTls, an Ingress or an older
//! listener already serves is not taken over: the listener is `Conflicted`
//! (`HostnameConflict`) naming the holder. Certificate ids: `<ns>/<gateway>/<listener>`.
//! HTTPS `Passthrough` is `UnsupportedValue` (use a TLS listener); `spec.tls` (frontend
//! client-certificate validation) is served with per-Gateway ports only (`frontend.rs`).
//!
//! # ListenerSets
//!
//! A ListenerSet's listeners join its Gateway's when the Gateway's `allowedListeners`
//! admits it, after the Gateway's own (see `gateways.rs` for admission, precedence and
//! status); they serve on the Gateway's ports like its own listeners, and routes reach them
//! with a `kind: ListenerSet` parentRef (`attach.rs`).
//!
//! # Per-Gateway ports
//!
//! With [`GatewayOptions::listener_ports`] (the controller's `--gateway-service-namespace`)
//! each Gateway gets an address of its own: every distinct port of its listeners becomes a
//! dataplane port taken from that range (`Snapshot.listeners`, id `<ns>/<gateway>/<port>`,
//! `<ns>/<gateway>/<port>/udp` for UDP, with the port's protocol: HTTP, TLS, TCP or UDP)
//! and a port of the Gateway's own Service, which the controller keeps (one Service per
//! Gateway, of `--gateway-service-type`, e.g. `LoadBalancer`). A Gateway uses at most
//! [`MAX_PORTS_PER_GATEWAY`] distinct ports, so one Gateway cannot take a large share of
//! the range, nor make a cloud load balancer with dozens of ports: listeners on further
//! ports (in `spec.listeners` order) are `Accepted=False` (`PortUnavailable`), saying so,
//! and the Gateway's other listeners keep serving. A port the range has no room left for
//! serves nothing (its listeners are not `Programmed`).
//!
//! Each port lists its Gateway listeners and their routes (`Listener.sections`): a request
//! is served only by the routes of the listener its host matches most specifically
//! (listener isolation), and on an HTTPS port a request whose host matches another listener
//! than its TLS server name did gets 421 (misdirected request).
//!
//! # Routes
//!
//! Each HTTPRoute `spec.rules[i].matches[j]` becomes one snapshot route
//! `<ns>/<name>/httproute-r<i>-m<j>` (`grpcroute-` for GRPCRoute). Its hosts are the
//! intersection of the route's hostnames with the hostnames of every listener it attached
//! to. A route attached only to HTTP (or only to HTTPS) listeners carries an expr on the
//! `scheme` variable, so a route of an HTTPS listener is never served in plain text; one
//! attached to both with different hosts per scheme is split into `...-http` and
//! `...-https`.
//! `http.rs` documents matches, filters and backends.
//!
//! # Precedence
//!
//! The dataplane router ranks by host class (exact host, then the longest wildcard, then no
//! host), then path (exact, then longest prefix), then `priority`. Host and path order
//! already are the Gateway API's. Among Gateway API routes with the same path entry the
//! `priority` encodes the remaining rules: `Exact` before `RegularExpression` before
//! `PathPrefix` (a regex sits on the router's `/*` entry, where only `PathPrefix /` competes
//! with it; a longer prefix still wins over a regex), then a method match, then more header matches, then more query
//! matches, then the older route (`creationTimestamp`), then namespace/name, then rule and
//! match index. Gateway API routes take priorities at and below [`PRIORITY_TOP`]
//! (-1,000,000): on the same host class and path, every ApisixRoute and Ingress route with a
//! priority above that (all by default) wins over a Gateway API route, so adding a Gateway
//! API route never takes traffic away from an existing Apisix or Ingress route.

mod attach;
mod backend_tls;
mod backends;
mod certificate;
mod filters;
mod frontend;
mod gateways;
mod http;
mod listeners;
mod matches;
mod routes;
mod status;
mod stream;
mod timeouts;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sluice_crds::gateway::{GATEWAY_GROUP, ReferenceGrant};
use sluice_proto::v1;

pub use backend_tls::{BackendTlsPolicyStatus, PolicyAncestor, policy_reason};
pub use status::*;

use crate::status::{Condition, ConditionStatus};
use crate::upstream::UpstreamObject;
use crate::{ClusterState, Index, Options};

/// Highest `priority` of a Gateway API route; see the module docs.
pub const PRIORITY_TOP: i32 = -1_000_000;
/// With per-Gateway ports, the most distinct listener ports one Gateway gets (each is a
/// dataplane port and a port of the Gateway's Service); listeners on further ports are
/// `PortUnavailable`.
pub const MAX_PORTS_PER_GATEWAY: usize = 16;
/// Default [`GatewayOptions::controller_name`].
pub const DEFAULT_CONTROLLER_NAME: &str = "sluice.dev/gateway-controller";

/// Gateway API settings of [`Options`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayOptions {
    /// GatewayClasses with this `spec.controllerName` are Sluice's. Default
    /// [`DEFAULT_CONTROLLER_NAME`].
    pub controller_name: String,
    /// Port clients reach the dataplanes' plain-HTTP listener on (the dataplane Service
    /// port). HTTP listeners on other ports are `PortUnavailable`. Default 80.
    pub http_port: u16,
    /// Port of the HTTPS listener, likewise. Default 443.
    pub https_port: u16,
    /// Per-Gateway addresses: the dataplanes open a port of their own for each port of each
    /// Gateway, taken from this range (see "Per-Gateway ports" above), and listeners may use
    /// any port. `None` (default): every Gateway shares `http_port` and `https_port`.
    pub listener_ports: Option<std::ops::RangeInclusive<u16>>,
    /// The Gateway API CRDs installed are the experimental channel's: features whose fields
    /// only that channel has (HTTPRoute `retry`) are claimed too. Default false.
    pub experimental_channel: bool,
    /// Each Gateway's Service is in the Gateway's own namespace (the controller's
    /// `--gateway-service-placement=gateway`), where its `spec.infrastructure` labels and
    /// annotations are found: `GatewayInfrastructure` is claimed. Default false.
    pub services_in_gateway_namespace: bool,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        Self {
            controller_name: DEFAULT_CONTROLLER_NAME.to_owned(),
            http_port: 80,
            https_port: 443,
            listener_ports: None,
            experimental_channel: false,
            services_in_gateway_namespace: false,
        }
    }
}

/// Features listed in `GatewayClass.status.supportedFeatures` (conformance names), each
/// claimed once its tests of the upstream suite pass (conformance/README.md).
const SUPPORTED_FEATURES: &[&str] = &[
    "BackendTLSPolicy",
    "BackendTLSPolicySANValidation",
    "GRPCRoute",
    "GRPCRouteNamedRouteRule",
    "Gateway",
    "GatewayAddressEmpty",
    "GatewayBackendClientCertificate",
    "HTTPRoute",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteBackendTimeout",
    "HTTPRouteCORS",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteSchemeRedirect",
    "ReferenceGrant",
];

/// Features that need each Gateway on ports of its own (`GatewayOptions::listener_ports`):
/// a listener on any port, per-port TLS settings, Layer 4 listeners, static addresses (its
/// own Service's).
const PER_GATEWAY_FEATURES: &[&str] = &[
    "GatewayFrontendClientCertificateValidation",
    "GatewayFrontendClientCertificateValidationInsecureFallback",
    "GatewayHTTPListenerIsolation",
    "GatewayHTTPSListenerDetectMisdirectedRequests",
    "GatewayPort8080",
    "GatewayStaticAddresses",
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteParentRefPort",
    "ListenerSet",
    "TCPRoute",
    "TLSRoute",
    "TLSRouteModeMixed",
    "TLSRouteModeTerminate",
    "UDPRoute",
];

/// Features whose fields only the experimental channel's CRDs have
/// (`GatewayOptions::experimental_channel`): with the standard CRDs a route cannot ask for them.
const EXPERIMENTAL_CHANNEL_FEATURES: &[&str] = &[
    "HTTPRouteRetry",
    "HTTPRouteRetryBackendTimeout",
    "HTTPRouteRetryConnectionError",
];

/// `supportedFeatures`, sorted: per-Gateway ones only with per-Gateway ports.
fn supported_features(gopts: &GatewayOptions) -> Vec<String> {
    let mut out: Vec<String> = SUPPORTED_FEATURES.iter().map(|s| (*s).to_owned()).collect();
    if gopts.listener_ports.is_some() {
        out.extend(PER_GATEWAY_FEATURES.iter().map(|s| (*s).to_owned()));
    }
    if gopts.listener_ports.is_some() && gopts.services_in_gateway_namespace {
        out.push("GatewayInfrastructure".to_owned());
    }
    if gopts.experimental_channel {
        out.extend(
            EXPERIMENTAL_CHANNEL_FEATURES
                .iter()
                .map(|s| (*s).to_owned()),
        );
    }
    out.sort();
    out
}

/// What the Gateway API adds to a translation.
#[derive(Default)]
pub(crate) struct Output {
    pub(crate) routes: Vec<v1::Route>,
    pub(crate) upstreams: Vec<v1::Upstream>,
    /// TLSRoutes, TCPRoutes and UDPRoutes.
    pub(crate) stream_routes: Vec<v1::StreamRoute>,
    pub(crate) certificates: Vec<v1::TlsCertificate>,
    /// The certificate of the first HTTPS listener without a hostname (oldest Gateway
    /// first): served to handshakes without SNI or for a host no certificate covers, unless
    /// `--default-ssl-certificate` names one.
    pub(crate) default_certificate: Option<v1::TlsCertificate>,
    /// Per-Gateway ports (with `GatewayOptions::listener_ports`), sorted by id.
    pub(crate) listeners: Vec<v1::Listener>,
    pub(crate) status: GatewayStatusReport,
    /// Next unix second a listener certificate verdict changes.
    pub(crate) changes_at: Option<i64>,
}

pub(crate) fn cond(type_: &str, ok: bool, reason: &str, message: impl Into<String>) -> Condition {
    let status = if ok {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    };
    Condition::new(type_, status, reason, message.into())
}

/// Where a route attached: a scheme of the shared ports, or one Gateway's own port
/// (`Snapshot.listeners` id).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Slot {
    /// The dataplanes' own plain-HTTP (`false`) or HTTPS (`true`) port.
    Scheme(bool),
    /// A per-Gateway port: its id, the Gateway's port number, whether it is HTTPS.
    Listener(String, u16, bool),
    /// A per-Gateway TLS, TCP or UDP port: its id and how the listener treats TLS
    /// (`v1::StreamTls`: none, passthrough or terminate).
    Stream(String, i32),
}

/// Whether `grants` in namespace `to_ns` let a `from_kind` in `from_ns` refer to the
/// `to_group`/`to_kind` object `to_name`.
pub(crate) fn granted(
    grants: &[ReferenceGrant],
    from_kind: &str,
    from_ns: &str,
    to_group: &str,
    to_kind: &str,
    to_ns: &str,
    to_name: &str,
) -> bool {
    let to = crate::refs::Target {
        group: to_group,
        kind: to_kind,
        ns: to_ns,
        name: to_name,
    };
    crate::refs::granted(grants, GATEWAY_GROUP, from_kind, from_ns, to)
}

/// Lower-cased listener/route hostname, validated (no IPs, one leading `*.` at most).
fn hostname(raw: &str) -> Result<String, String> {
    if raw.parse::<std::net::IpAddr>().is_ok() {
        return Err(format!("{raw:?}: an IP address is not a hostname"));
    }
    crate::validate::host(raw)?;
    Ok(raw.to_ascii_lowercase())
}

fn created(meta: &ObjectMeta) -> Option<i64> {
    meta.creation_timestamp.as_ref().map(|t| t.0.as_second())
}

/// Translates the Gateway API objects of `state`: GatewayClasses, then Gateways (oldest
/// first) with their listeners, then HTTPRoutes and GRPCRoutes attached to them. `taken`
/// holds the routes of the other families (their ids are not given away) and
/// `served_certificates` their certificates (their hosts are not taken over).
pub(crate) fn translate(
    state: &ClusterState,
    idx: &Index<'_>,
    aus: &BTreeMap<(&str, &str), Result<UpstreamObject, ()>>,
    opts: &Options,
    taken: &BTreeMap<String, v1::Route>,
    served_certificates: &[v1::TlsCertificate],
) -> Output {
    let gopts = &opts.gateway;
    let mut out = Output::default();
    out.status.controller_name = gopts.controller_name.clone();
    let classes = gateways::classes(state, gopts, &mut out);
    let inputs = listeners::Inputs {
        gopts,
        state,
        idx,
        opts,
    };
    let mut gws = gateways::gateways(&inputs, &classes, served_certificates, &mut out);
    let tls_policies = backend_tls::Policies::new(state, idx);
    let ctx = http::Ctx {
        idx,
        aus,
        grants: &state.reference_grants,
        tls_policies: &tls_policies,
    };
    let entries = routes::routes(state, &ctx, taken, &mut gws, &mut out);
    out.status.backend_tls_policies = tls_policies.status(&gopts.controller_name);
    routes::prioritise(entries, &mut out);
    stream::routes(state, &ctx, &mut gws, &mut out);
    gws.finish(&mut out);
    // A Gateway's backend client certificate: `ResolvedRefs` on the Gateway, False when
    // unusable (its TLS backends are then reached without one).
    for g in &mut out.status.gateways {
        match tls_policies.client_certificate_verdict(&g.namespace, &g.name) {
            Some(Ok(())) => g.conditions.push(cond(
                RESOLVED_REFS,
                true,
                reason::RESOLVED_REFS,
                "spec.tls.backend.clientCertificateRef resolved",
            )),
            Some(Err((reason, m))) => g.conditions.push(cond(RESOLVED_REFS, false, reason, m)),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_follow_the_ports_and_the_channel() {
        let shared = supported_features(&GatewayOptions::default());
        assert!(shared.contains(&"HTTPRouteCORS".to_owned()));
        assert!(!shared.contains(&"GatewayPort8080".to_owned()));
        assert!(!shared.contains(&"HTTPRouteRetry".to_owned()));
        let experimental = supported_features(&GatewayOptions {
            listener_ports: Some(20000..=29999),
            experimental_channel: true,
            ..GatewayOptions::default()
        });
        for f in ["GatewayPort8080", "TLSRoute", "HTTPRouteRetry"] {
            assert!(experimental.contains(&f.to_owned()), "{f}");
        }
        let mut sorted = experimental.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, experimental, "sorted, each once");
        // Infrastructure metadata is where the Gateway API looks only with the Services in
        // the Gateways' namespaces.
        assert!(!experimental.contains(&"GatewayInfrastructure".to_owned()));
        let own = supported_features(&GatewayOptions {
            listener_ports: Some(20000..=29999),
            services_in_gateway_namespace: true,
            ..GatewayOptions::default()
        });
        assert!(own.contains(&"GatewayInfrastructure".to_owned()));
        let mut sorted = own.clone();
        sorted.sort();
        assert_eq!(sorted, own, "sorted");
    }
}
