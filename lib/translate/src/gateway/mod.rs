//! Gateway API (GatewayClass, Gateway, HTTPRoute, GRPCRoute, ReferenceGrant) → snapshot
//! routes, upstreams and certificates, plus the Gateway API status ([`GatewayStatusReport`]).
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
//! HTTPS listeners terminate TLS with their first `certificateRefs` entry, checked exactly as
//! an ApisixTls Secret is (`tls.rs`: present, PEM, key matches the leaf, valid at
//! `Options::now`); a Secret in another namespace needs a ReferenceGrant (`RefNotPermitted`).
//! The certificate is served for the listener's hostname, or, for a listener without one,
//! for the DNS names of the certificate. A host that an ApisixTls, an Ingress or an older
//! listener already serves is not taken over: the listener is `Conflicted`
//! (`HostnameConflict`) naming the holder. Certificate ids: `<ns>/<gateway>/<listener>`.
//! `Passthrough` and `spec.tls` (frontend client validation) are `UnsupportedValue`.
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

mod http;
mod status;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use sluice_crds::ApisixTls;
use sluice_crds::gateway::{
    GATEWAY_GROUP, Gateway, GatewayClass, Listener, ParentReference, ReferenceGrant, RouteGroupKind,
};
use sluice_proto::v1;

pub use status::*;

use crate::status::{Condition, ConditionStatus};
use crate::upstream::UpstreamObject;
use crate::{ClusterState, Index, Options};

/// Highest `priority` of a Gateway API route; see the module docs.
pub const PRIORITY_TOP: i32 = -1_000_000;
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
}

impl Default for GatewayOptions {
    fn default() -> Self {
        Self {
            controller_name: DEFAULT_CONTROLLER_NAME.to_owned(),
            http_port: 80,
            https_port: 443,
            listener_ports: None,
        }
    }
}

/// Features listed in `GatewayClass.status.supportedFeatures` (conformance names).
const SUPPORTED_FEATURES: &[&str] = &[
    "GRPCRoute",
    "GRPCRouteNamedRouteRule",
    "Gateway",
    "HTTPRoute",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteSchemeRedirect",
    "ReferenceGrant",
];

/// Features that need each Gateway on ports of its own (`GatewayOptions::listener_ports`).
const PER_GATEWAY_FEATURES: &[&str] = &["GatewayPort8080", "HTTPRouteParentRefPort"];

/// `supportedFeatures`, sorted: per-Gateway ones only with per-Gateway ports.
fn supported_features(gopts: &GatewayOptions) -> Vec<String> {
    let mut out: Vec<String> = SUPPORTED_FEATURES.iter().map(|s| (*s).to_owned()).collect();
    if gopts.listener_ports.is_some() {
        out.extend(PER_GATEWAY_FEATURES.iter().map(|s| (*s).to_owned()));
    }
    out.sort();
    out
}

/// What the Gateway API adds to a translation.
#[derive(Default)]
pub(crate) struct Output {
    pub(crate) routes: Vec<v1::Route>,
    pub(crate) upstreams: Vec<v1::Upstream>,
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

/// Which namespaces a listener admits routes from.
#[derive(Clone)]
enum From {
    Same,
    All,
    Selector(LabelSelector),
}

/// Where a route attached: a scheme of the shared ports, or one Gateway's own port
/// (`Snapshot.listeners` id).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Slot {
    /// The dataplanes' own plain-HTTP (`false`) or HTTPS (`true`) port.
    Scheme(bool),
    /// A per-Gateway port: its id, the Gateway's port number, whether it is HTTPS.
    Listener(String, u16, bool),
}

/// One per-Gateway port while its listeners are read.
#[derive(Default)]
struct PortBuild {
    /// Rank of its Gateway, oldest first (allocation order).
    age: usize,
    tls: bool,
    certificates: Vec<v1::TlsCertificate>,
    default_certificate: Option<v1::TlsCertificate>,
    /// Host → the listener certificate serving it on this port.
    claimed: BTreeMap<String, String>,
}

/// A listener as routes see it.
pub(crate) struct ListenerInfo {
    gateway: (String, String),
    slot: Slot,
    /// Index in `spec.listeners`.
    index: usize,
    name: String,
    hostname: Option<String>,
    port: i32,
    /// Accepted and not conflicted: routes attach to it (and count in `attachedRoutes`),
    /// even while its references do not resolve.
    attachable: bool,
    /// Attachable and its certificate usable: its routes are served.
    usable: bool,
    kinds: Vec<RouteKind>,
    from: From,
    attached: BTreeSet<(RouteKind, String, String)>,
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
    grants.iter().any(|g| {
        crate::key(&g.metadata).0 == to_ns
            && g.spec
                .from
                .iter()
                .any(|f| f.group == GATEWAY_GROUP && f.kind == from_kind && f.namespace == from_ns)
            && g.spec.to.iter().any(|t| {
                t.group == to_group
                    && t.kind == to_kind
                    && t.name.as_deref().is_none_or(|n| n == to_name)
            })
    })
}

/// Lower-cased listener/route hostname, validated (no IPs, one leading `*.` at most).
fn hostname(raw: &str) -> Result<String, String> {
    if raw.parse::<std::net::IpAddr>().is_ok() {
        return Err(format!("{raw:?}: an IP address is not a hostname"));
    }
    crate::validate::host(raw)?;
    Ok(raw.to_ascii_lowercase())
}

/// Whether pattern `p` (exact or `*.suffix`, any depth) matches host `h` (exact or wildcard).
fn host_matches(p: &str, h: &str) -> bool {
    match p.strip_prefix('*') {
        None => p == h,
        // "*.example.com" matches "a.example.com", "a.b.example.com" and "*.b.example.com",
        // never "example.com".
        Some(dot_suffix) => h.len() > dot_suffix.len() && h.ends_with(dot_suffix),
    }
}

/// Hosts a route serves through a listener: `None` = every host; `Some(empty)` = none.
fn intersect(listener: Option<&str>, route: &[String]) -> Option<Vec<String>> {
    match (listener, route.is_empty()) {
        (None, true) => None,
        (None, false) => Some(route.to_vec()),
        (Some(l), true) => Some(vec![l.to_owned()]),
        (Some(l), false) => Some(
            route
                .iter()
                .filter_map(|r| {
                    if host_matches(l, r) {
                        Some(r.clone())
                    } else if host_matches(r, l) {
                        Some(l.to_owned())
                    } else {
                        None
                    }
                })
                .collect(),
        ),
    }
}

/// Whether a label selector matches `labels` (matchLabels and matchExpressions).
fn selects(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let have = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => have.is_some_and(|v| values.contains(v)),
            "NotIn" => have.is_none_or(|v| !values.contains(v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

fn created(meta: &ObjectMeta) -> Option<i64> {
    meta.creation_timestamp.as_ref().map(|t| t.0.as_second())
}

/// Translates the Gateway API objects of `state`.
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

    // GatewayClasses.
    let mut classes: BTreeMap<&str, bool> = BTreeMap::new();
    let mut sorted: Vec<&GatewayClass> = state
        .gateway_classes
        .iter()
        .filter(|c| c.spec.controller_name == gopts.controller_name)
        .collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for gc in sorted {
        let name = gc.metadata.name.as_deref().unwrap_or_default();
        let ok = gc.spec.parameters_ref.is_none();
        let condition = if ok {
            cond(ACCEPTED, true, reason::ACCEPTED, "Accepted")
        } else {
            cond(
                ACCEPTED,
                false,
                reason::INVALID_PARAMETERS,
                "spec.parametersRef: Sluice takes no parameters",
            )
        };
        classes.insert(name, ok);
        out.status.gateway_classes.push(GatewayClassStatus {
            name: name.to_owned(),
            generation: gc.metadata.generation,
            conditions: vec![condition],
            supported_features: supported_features(gopts),
        });
    }

    // Gateways, oldest first so an older listener keeps a contested TLS host.
    let mut gateways: Vec<&Gateway> = state
        .gateways
        .iter()
        .filter(|g| classes.contains_key(g.spec.gateway_class_name.as_str()))
        .collect();
    gateways.sort_by(|a, b| {
        (created(&a.metadata), crate::key(&a.metadata))
            .cmp(&(created(&b.metadata), crate::key(&b.metadata)))
    });
    let mut listeners: Vec<ListenerInfo> = Vec::new();
    let mut gw_status: BTreeMap<(String, String), GatewayStatus> = BTreeMap::new();
    let mut gw_accepted: BTreeMap<(String, String), bool> = BTreeMap::new();
    let mut claimed: BTreeMap<String, String> = served_certificates
        .iter()
        .flat_map(|c| c.hosts.iter().map(|h| (h.clone(), c.source.clone())))
        .collect();
    let mut ports: BTreeMap<String, PortBuild> = BTreeMap::new();
    for (age, gw) in gateways.into_iter().enumerate() {
        let (ns, name) = crate::key(&gw.metadata);
        let class_ok = classes
            .get(gw.spec.gateway_class_name.as_str())
            .copied()
            .unwrap_or(false);
        let mut st = GatewayStatus {
            namespace: ns.to_owned(),
            name: name.to_owned(),
            generation: gw.metadata.generation,
            conditions: Vec::new(),
            listeners: Vec::new(),
            routes: Vec::new(),
            certificates: Vec::new(),
        };
        let mut infos = listeners_of(
            gw,
            ns,
            name,
            gopts,
            state,
            idx,
            opts,
            &mut claimed,
            &mut ports,
            age,
            &mut st,
            &mut out,
            // NB: a Gateway that cannot be accepted serves no certificate (nor claims hosts).
            class_ok && gw.spec.addresses.is_empty(),
        );
        let any_usable = infos.iter().any(|l| l.usable);
        let (accepted, programmed) = if !class_ok {
            let m = format!(
                "GatewayClass {} is not accepted",
                gw.spec.gateway_class_name
            );
            (
                cond(ACCEPTED, false, reason::INVALID_PARAMETERS, m.clone()),
                cond(PROGRAMMED, false, reason::INVALID, m),
            )
        } else if !gw.spec.addresses.is_empty() {
            let m =
                "spec.addresses: Sluice does not assign addresses (the dataplane Service has them)";
            (
                cond(ACCEPTED, false, reason::UNSUPPORTED_ADDRESS, m),
                cond(PROGRAMMED, false, reason::INVALID, m),
            )
        } else {
            // Accepted when some listener is; reason ListenersNotValid when any listener is
            // not accepted, conflicted or has unresolved references. Programmed when some
            // listener can serve.
            let has = |ls: &ListenerStatus, type_: &str, status: ConditionStatus| {
                ls.conditions
                    .iter()
                    .any(|c| c.type_ == type_ && c.status == status)
            };
            let any_accepted = st
                .listeners
                .iter()
                .any(|ls| has(ls, ACCEPTED, ConditionStatus::True));
            let invalid: Vec<&str> = st
                .listeners
                .iter()
                .filter(|ls| {
                    has(ls, ACCEPTED, ConditionStatus::False)
                        || has(ls, CONFLICTED, ConditionStatus::True)
                        || has(ls, RESOLVED_REFS, ConditionStatus::False)
                })
                .map(|ls| ls.name.as_str())
                .collect();
            let accepted = if !any_accepted {
                cond(
                    ACCEPTED,
                    false,
                    reason::LISTENERS_NOT_VALID,
                    "no listener is valid",
                )
            } else if invalid.is_empty() {
                cond(ACCEPTED, true, reason::ACCEPTED, "Accepted")
            } else {
                cond(
                    ACCEPTED,
                    true,
                    reason::LISTENERS_NOT_VALID,
                    format!("listeners not valid: {}", invalid.join(", ")),
                )
            };
            let programmed = if any_usable {
                cond(PROGRAMMED, true, reason::PROGRAMMED, "Programmed")
            } else {
                cond(PROGRAMMED, false, reason::INVALID, "no listener can serve")
            };
            (accepted, programmed)
        };
        let ok = accepted.status == ConditionStatus::True;
        if !ok {
            for l in &mut infos {
                l.usable = false;
                l.attachable = false;
            }
            for ls in &mut st.listeners {
                for c in &mut ls.conditions {
                    if c.type_ == PROGRAMMED {
                        *c = cond(
                            PROGRAMMED,
                            false,
                            reason::INVALID,
                            "The Gateway is not accepted",
                        );
                    }
                }
            }
        }
        st.conditions = vec![accepted, programmed];
        gw_accepted.insert((ns.to_owned(), name.to_owned()), ok);
        gw_status.insert((ns.to_owned(), name.to_owned()), st);
        if !ok {
            let prefix = format!("{ns}/{name}/");
            ports.retain(|id, _| !id.starts_with(&prefix) || id[prefix.len()..].contains('/'));
        }
        listeners.extend(infos);
    }
    if let Some(range) = &gopts.listener_ports {
        out.listeners = allocate_ports(range, ports);
        // NB: a port the range had no room for serves nothing; its listeners cannot serve.
        for l in &mut listeners {
            if let Slot::Listener(id, ..) = &l.slot
                && !out.listeners.iter().any(|p| p.id == *id)
            {
                l.usable = false;
            }
        }
    }

    // Routes.
    let namespaces: BTreeMap<&str, BTreeMap<String, String>> = state
        .namespaces
        .iter()
        .map(|n| {
            (
                n.metadata.name.as_deref().unwrap_or_default(),
                n.metadata.labels.clone().unwrap_or_default(),
            )
        })
        .collect();
    let ctx = http::Ctx {
        idx,
        aus,
        grants: &state.reference_grants,
        tls_policies: &state.backend_tls_policies,
    };
    let mut entries: Vec<http::Entry> = Vec::new();
    let mut route_status: Vec<RouteStatus> = Vec::new();
    let mut inputs: Vec<http::RouteInput<'_>> = Vec::new();
    for r in &state.http_routes {
        inputs.push(http::RouteInput::http(r));
    }
    for r in &state.grpc_routes {
        inputs.push(http::RouteInput::grpc(r));
    }
    inputs.sort_by(|a, b| (a.kind, a.ns, a.name).cmp(&(b.kind, b.ns, b.name)));
    for input in &inputs {
        let Some(att) = attach(input, &mut listeners, &gw_accepted, &namespaces) else {
            continue;
        };
        let mut rs = RouteStatus {
            kind: input.kind,
            namespace: input.ns.to_owned(),
            name: input.name.to_owned(),
            generation: input.meta.generation,
            parents: Vec::new(),
            routes: Vec::new(),
        };
        let mut translated = http::translate_rules(input, &att.schemes, &ctx);
        // An ApisixRoute or Ingress holding one of the ids keeps it; this route is refused.
        let clashes: Vec<String> = translated
            .entries
            .iter()
            .filter_map(|e| {
                taken
                    .get(&e.route.id)
                    .map(|o| format!("route id {} is already used by {}", e.route.id, o.source))
            })
            .collect();
        if !clashes.is_empty() {
            translated.entries.clear();
            translated.valid_rules = 0;
            translated.rule_problems = http::join_capped(&clashes);
        }
        for (parent_ref, accepted) in att.parents {
            let mut conditions = vec![accepted];
            if conditions[0].status == ConditionStatus::True {
                if translated.valid_rules == 0 && translated.rule_count > 0 {
                    conditions[0] = cond(
                        ACCEPTED,
                        false,
                        reason::UNSUPPORTED_VALUE,
                        translated.rule_problems.clone(),
                    );
                } else if !translated.rule_problems.is_empty() {
                    conditions.push(cond(
                        PARTIALLY_INVALID,
                        true,
                        reason::UNSUPPORTED_VALUE,
                        translated.rule_problems.clone(),
                    ));
                }
            }
            conditions.insert(1, translated.resolved_refs.clone());
            rs.parents.push(RouteParentStatus {
                parent_ref,
                conditions,
            });
        }
        if att.any_attached {
            for e in translated.entries {
                rs.routes.push(e.route.id.clone());
                for (ns, name) in &att.gateways {
                    if let Some(st) = gw_status.get_mut(&(ns.clone(), name.clone())) {
                        st.routes.push(e.route.id.clone());
                    }
                }
                entries.push(e);
            }
            out.upstreams.extend(translated.upstreams);
        }
        rs.routes.sort();
        route_status.push(rs);
    }

    // Priorities: best first.
    entries.sort_by(|a, b| b.rank.cmp(&a.rank));
    for (i, mut e) in entries.into_iter().enumerate() {
        let rank = i32::try_from(i).unwrap_or(i32::MAX);
        e.route.priority = PRIORITY_TOP.saturating_sub(rank);
        out.routes.push(e.route);
    }

    // Listener counts into the Gateway status.
    for l in &listeners {
        if let Some(st) = gw_status.get_mut(&l.gateway)
            && let Some(ls) = st.listeners.get_mut(l.index)
        {
            ls.attached_routes = i32::try_from(l.attached.len()).unwrap_or(i32::MAX);
        }
    }
    out.status.gateways = gw_status
        .into_values()
        .map(|mut g| {
            g.routes.sort();
            g.routes.dedup();
            g.certificates.sort();
            g
        })
        .collect();
    out.status.routes = route_status;
    out
}

/// Attachment of one route.
struct Attachment {
    /// One `(parentRef, Accepted)` per parent Sluice owns, in spec order.
    parents: Vec<(ParentReference, Condition)>,
    /// Hosts per slot (scheme or per-Gateway port): `None` in the map = every host.
    schemes: BTreeMap<Slot, Option<BTreeSet<String>>>,
    any_attached: bool,
    gateways: BTreeSet<(String, String)>,
}

/// Attaches `input` to the listeners its parentRefs select. `None` when no parentRef names
/// a Gateway of Sluice's classes.
fn attach(
    input: &http::RouteInput<'_>,
    listeners: &mut [ListenerInfo],
    gw_accepted: &BTreeMap<(String, String), bool>,
    namespaces: &BTreeMap<&str, BTreeMap<String, String>>,
) -> Option<Attachment> {
    let mut att = Attachment {
        parents: Vec::new(),
        schemes: BTreeMap::new(),
        any_attached: false,
        gateways: BTreeSet::new(),
    };
    // Invalid route hostnames are dropped (the API server's validation rejects them anyway).
    let route_hosts: Vec<String> = input
        .hostnames
        .iter()
        .filter_map(|h| hostname(h).ok())
        .collect();
    for p in input.parent_refs {
        let group = p.group.as_deref().unwrap_or(GATEWAY_GROUP);
        let kind = p.kind.as_deref().unwrap_or("Gateway");
        if group != GATEWAY_GROUP || kind != "Gateway" {
            continue;
        }
        let gw_ns = p.namespace.as_deref().unwrap_or(input.ns).to_owned();
        let gw_key = (gw_ns, p.name.clone());
        let Some(&gw_ok) = gw_accepted.get(&gw_key) else {
            continue; // Not a Gateway of Sluice's classes.
        };
        let accepted = 'verdict: {
            if !gw_ok {
                break 'verdict cond(
                    ACCEPTED,
                    false,
                    reason::NO_MATCHING_PARENT,
                    format!("Gateway {}/{} is not accepted", gw_key.0, gw_key.1),
                );
            }
            let candidates: Vec<usize> = listeners
                .iter()
                .enumerate()
                .filter(|(_, l)| {
                    l.gateway == gw_key
                        && p.section_name.as_deref().is_none_or(|s| s == l.name)
                        && p.port.is_none_or(|port| port == l.port)
                })
                .map(|(i, _)| i)
                .collect();
            if candidates.is_empty() {
                break 'verdict cond(
                    ACCEPTED,
                    false,
                    reason::NO_MATCHING_PARENT,
                    "no listener matches the parentRef's sectionName and port",
                );
            }
            let (valid, invalid): (Vec<usize>, Vec<usize>) = candidates
                .into_iter()
                .partition(|&i| listeners[i].attachable);
            if valid.is_empty() {
                let names: Vec<&str> = invalid
                    .iter()
                    .map(|&i| listeners[i].name.as_str())
                    .collect();
                break 'verdict cond(
                    ACCEPTED,
                    false,
                    reason::NOT_ALLOWED_BY_LISTENERS,
                    format!(
                        "listener(s) {} of Gateway {}/{} are not valid",
                        names.join(", "),
                        gw_key.0,
                        gw_key.1
                    ),
                );
            }
            let allowed: Vec<usize> = valid
                .into_iter()
                .filter(|&i| {
                    let l = &listeners[i];
                    l.kinds.contains(&input.kind)
                        && match &l.from {
                            From::All => true,
                            From::Same => l.gateway.0 == input.ns,
                            From::Selector(sel) => namespaces
                                .get(input.ns)
                                .is_some_and(|labels| selects(sel, labels)),
                        }
                })
                .collect();
            if allowed.is_empty() {
                break 'verdict cond(
                    ACCEPTED,
                    false,
                    reason::NOT_ALLOWED_BY_LISTENERS,
                    format!(
                        "no listener of Gateway {}/{} allows {} from namespace {}",
                        gw_key.0,
                        gw_key.1,
                        input.kind.as_str(),
                        input.ns
                    ),
                );
            }
            let mut matched = false;
            for i in allowed {
                let l = &mut listeners[i];
                // `None`: every host.
                let hosts = intersect(l.hostname.as_deref(), &route_hosts);
                if hosts.as_ref().is_some_and(Vec::is_empty) {
                    continue;
                }
                matched = true;
                l.attached
                    .insert((input.kind, input.ns.to_owned(), input.name.to_owned()));
                if !l.usable {
                    // NB: attached (and counted), but the listener serves nothing yet.
                    continue;
                }
                let slot = att
                    .schemes
                    .entry(l.slot.clone())
                    .or_insert_with(|| Some(BTreeSet::new()));
                match (slot.as_mut(), hosts) {
                    (_, None) => *slot = None,
                    (Some(set), Some(h)) => set.extend(h),
                    (None, Some(_)) => {}
                }
            }
            if !matched {
                break 'verdict cond(
                    ACCEPTED,
                    false,
                    reason::NO_MATCHING_LISTENER_HOSTNAME,
                    "no listener hostname intersects the route's hostnames",
                );
            }
            att.any_attached = true;
            att.gateways.insert(gw_key.clone());
            cond(ACCEPTED, true, reason::ACCEPTED, "Accepted")
        };
        att.parents.push((p.clone(), accepted));
    }
    (!att.parents.is_empty()).then_some(att)
}

/// Validates the listeners of one Gateway, fills `st.listeners` and adds their
/// certificates to `out`.
#[allow(clippy::too_many_arguments)]
fn listeners_of(
    gw: &Gateway,
    ns: &str,
    name: &str,
    gopts: &GatewayOptions,
    state: &ClusterState,
    idx: &Index<'_>,
    opts: &Options,
    claimed: &mut BTreeMap<String, String>,
    ports: &mut BTreeMap<String, PortBuild>,
    age: usize,
    st: &mut GatewayStatus,
    out: &mut Output,
    serve: bool,
) -> Vec<ListenerInfo> {
    let per_gateway = gopts.listener_ports.is_some();
    let ls = &gw.spec.listeners;
    let mut infos = Vec::new();
    for (i, l) in ls.iter().enumerate() {
        let field = format!("spec.listeners[{i}]");
        let https = l.protocol == "HTTPS";
        // Accepted.
        let mut accepted = cond(ACCEPTED, true, reason::ACCEPTED, "Accepted");
        let want_port = match l.protocol.as_str() {
            // NB: with per-Gateway ports every port is the Gateway's own.
            "HTTP" | "HTTPS" if per_gateway => u16::try_from(l.port).ok(),
            "HTTP" => Some(gopts.http_port),
            "HTTPS" => Some(gopts.https_port),
            _ => None,
        };
        let host = l.hostname.as_deref().map(hostname);
        match (want_port, &host) {
            (None, _) => {
                accepted = cond(
                    ACCEPTED,
                    false,
                    reason::UNSUPPORTED_PROTOCOL,
                    format!(
                        "{field}.protocol: {} is not supported (HTTP, HTTPS)",
                        l.protocol
                    ),
                );
            }
            (Some(p), _) if i32::from(p) != l.port => {
                accepted = cond(
                    ACCEPTED,
                    false,
                    reason::PORT_UNAVAILABLE,
                    format!(
                        "{field}.port: the dataplanes serve {} on port {p}, not {}",
                        l.protocol, l.port
                    ),
                );
            }
            (_, Some(Err(e))) => {
                accepted = cond(
                    ACCEPTED,
                    false,
                    reason::UNSUPPORTED_VALUE,
                    format!("{field}.hostname: {e}"),
                );
            }
            _ => {}
        }
        if https {
            let mode = l
                .tls
                .as_ref()
                .and_then(|t| t.mode.as_deref())
                .unwrap_or("Terminate");
            if mode != "Terminate" {
                accepted = cond(
                    ACCEPTED,
                    false,
                    reason::UNSUPPORTED_VALUE,
                    format!("{field}.tls.mode: {mode} is not supported for HTTPS (Terminate)"),
                );
            } else if gw.spec.tls.is_some() {
                accepted = cond(
                    ACCEPTED,
                    false,
                    reason::UNSUPPORTED_VALUE,
                    "spec.tls: frontend client-certificate validation is not supported yet",
                );
            }
        }
        // Conflicted: same port, other protocol; or same port, protocol and hostname.
        let mut conflicted = cond(CONFLICTED, false, reason::NO_CONFLICTS, "No conflicts");
        for (j, o) in ls.iter().enumerate() {
            // NB: only listeners Sluice can serve conflict; a TCP listener is just unsupported.
            if j == i || o.port != l.port || want_port.is_none() || !is_http(&o.protocol) {
                continue;
            }
            if o.protocol != l.protocol {
                conflicted = cond(
                    CONFLICTED,
                    true,
                    reason::PROTOCOL_CONFLICT,
                    format!(
                        "listener {} uses port {} with protocol {}",
                        o.name, o.port, o.protocol
                    ),
                );
                break;
            }
            let norm = |h: Option<&str>| h.map(str::to_ascii_lowercase);
            if norm(o.hostname.as_deref()) == norm(l.hostname.as_deref()) {
                conflicted = cond(
                    CONFLICTED,
                    true,
                    reason::HOSTNAME_CONFLICT,
                    format!(
                        "listener {} has the same port, protocol and hostname",
                        o.name
                    ),
                );
                break;
            }
        }
        // ResolvedRefs: route kinds, then certificates.
        let (kinds, supported, bad_kinds) = route_kinds(l);
        let mut resolved = if bad_kinds.is_empty() {
            cond(
                RESOLVED_REFS,
                true,
                reason::RESOLVED_REFS,
                "All references resolved",
            )
        } else {
            cond(
                RESOLVED_REFS,
                false,
                reason::INVALID_ROUTE_KINDS,
                format!(
                    "{field}.allowedRoutes.kinds: not supported: {}",
                    bad_kinds.join(", ")
                ),
            )
        };
        let usable_so_far =
            accepted.status == ConditionStatus::True && conflicted.status == ConditionStatus::False;
        let port_id = format!("{ns}/{name}/{}", l.port);
        if per_gateway && usable_so_far && serve {
            let port = ports.entry(port_id.clone()).or_default();
            port.age = age;
            port.tls = https;
        }
        let mut cert_ok = true;
        if https && usable_so_far && serve {
            match listener_certificate(gw, ns, name, i, l, state, idx, opts, out) {
                Ok(cert) => {
                    // Where the certificate is served: this Gateway's own port, or the
                    // shared HTTPS port.
                    let (claimed, default_certificate, certificates) =
                        match ports.get_mut(&port_id).filter(|_| per_gateway) {
                            Some(p) => (
                                &mut p.claimed,
                                &mut p.default_certificate,
                                &mut p.certificates,
                            ),
                            None => (
                                &mut *claimed,
                                &mut out.default_certificate,
                                &mut out.certificates,
                            ),
                        };
                    // NB: hostless listeners sharing one Secret share the default.
                    let catch_all_holder = if l.hostname.is_none() {
                        default_certificate
                            .as_ref()
                            .filter(|c| c.cert_chain_pem != cert.cert_chain_pem)
                            .map(|c| c.source.clone())
                    } else {
                        None
                    };
                    if let Some(holder) = catch_all_holder {
                        cert_ok = false;
                        conflicted = cond(
                            CONFLICTED,
                            true,
                            reason::HOSTNAME_CONFLICT,
                            format!(
                                "the certificate for hosts no listener names is already \
                                 served by {holder}"
                            ),
                        );
                    } else if let Some((h, holder)) = cert
                        .hosts
                        .iter()
                        .find_map(|h| claimed.get(h).map(|o| (h, o)))
                    {
                        cert_ok = false;
                        conflicted = cond(
                            CONFLICTED,
                            true,
                            reason::HOSTNAME_CONFLICT,
                            format!("host {h} is already served by {holder}"),
                        );
                    } else {
                        for h in &cert.hosts {
                            claimed.insert(h.clone(), cert.source.clone());
                        }
                        st.certificates.push(cert.id.clone());
                        if l.hostname.is_none() && default_certificate.is_none() {
                            *default_certificate = Some(cert.clone());
                        }
                        // NB: a certificate without DNS names serves only as the default.
                        if !cert.hosts.is_empty() {
                            certificates.push(cert);
                        }
                    }
                }
                Err((r, m)) => {
                    cert_ok = false;
                    resolved = cond(RESOLVED_REFS, false, r, m);
                }
            }
        }
        let usable = usable_so_far && cert_ok;
        let programmed = if usable {
            cond(PROGRAMMED, true, reason::PROGRAMMED, "Programmed")
        } else {
            cond(
                PROGRAMMED,
                false,
                reason::INVALID,
                "The listener is not valid",
            )
        };
        st.listeners.push(ListenerStatus {
            name: l.name.clone(),
            supported_kinds: supported,
            attached_routes: 0,
            conditions: vec![accepted, conflicted, resolved, programmed],
        });
        let from = match l
            .allowed_routes
            .as_ref()
            .and_then(|a| a.namespaces.as_ref())
        {
            None => From::Same,
            Some(n) => match (n.from.as_deref().unwrap_or("Same"), &n.selector) {
                ("All", _) => From::All,
                ("Selector", Some(sel)) => From::Selector(sel.clone()),
                // NB: `Selector` without a selector admits nothing (fail closed).
                ("Selector", None) => From::Selector(LabelSelector {
                    match_expressions: Some(vec![
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                            key: "sluice.dev/never".into(),
                            operator: "In".into(),
                            values: Some(Vec::new()),
                        },
                    ]),
                    match_labels: None,
                }),
                _ => From::Same,
            },
        };
        infos.push(ListenerInfo {
            gateway: (ns.to_owned(), name.to_owned()),
            slot: if per_gateway {
                Slot::Listener(port_id, u16::try_from(l.port).unwrap_or_default(), https)
            } else {
                Slot::Scheme(https)
            },
            index: i,
            name: l.name.clone(),
            hostname: host.and_then(Result::ok),
            port: l.port,
            attachable: usable_so_far,
            usable,
            kinds,
            from,
            attached: BTreeSet::new(),
        });
    }
    infos
}

/// Gives each per-Gateway port a port of `range`: where a hash of its id points, else the
/// next free one, oldest Gateway first, so a port keeps its number while Gateways come and
/// go (unless two hash alike and the older one goes). Ports the range has no room for are
/// left out.
fn allocate_ports(
    range: &std::ops::RangeInclusive<u16>,
    ports: BTreeMap<String, PortBuild>,
) -> Vec<v1::Listener> {
    let (first, last) = (u32::from(*range.start()), u32::from(*range.end()));
    let size = (last + 1).saturating_sub(first);
    let mut order: Vec<(String, PortBuild)> = ports.into_iter().collect();
    order.sort_by(|a, b| (a.1.age, &a.0).cmp(&(b.1.age, &b.0)));
    let mut used = BTreeSet::new();
    let mut out = Vec::new();
    for (id, p) in order {
        // FNV-1a: stable across Rust versions and processes, unlike std's hasher.
        let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let start = u32::try_from(hash % u64::from(size.max(1))).unwrap_or(0);
        let Some(port) = (0..size)
            .map(|k| first + (start + k) % size)
            .find(|p| !used.contains(p))
        else {
            continue;
        };
        used.insert(port);
        let source = id.rsplit_once('/').map(|x| x.0).unwrap_or_default();
        let mut certificates = p.certificates;
        certificates.sort_by(|a, b| a.id.cmp(&b.id));
        out.push(v1::Listener {
            id: id.clone(),
            source: format!("Gateway {source}"),
            port,
            tls: p.tls,
            tls_certificates: certificates,
            default_certificate: p.default_certificate,
        });
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

fn is_http(protocol: &str) -> bool {
    matches!(protocol, "HTTP" | "HTTPS")
}

/// (kinds routes may be, supportedKinds for the status, names of unsupported kinds).
fn route_kinds(l: &Listener) -> (Vec<RouteKind>, Vec<RouteGroupKind>, Vec<String>) {
    let gk = |kind: &str| RouteGroupKind {
        group: Some(GATEWAY_GROUP.to_owned()),
        kind: kind.to_owned(),
    };
    if !is_http(&l.protocol) {
        return (Vec::new(), Vec::new(), Vec::new());
    }
    let wanted = l
        .allowed_routes
        .as_ref()
        .map(|a| &a.kinds)
        .filter(|k| !k.is_empty());
    let Some(wanted) = wanted else {
        return (
            vec![RouteKind::HttpRoute, RouteKind::GrpcRoute],
            vec![gk("HTTPRoute"), gk("GRPCRoute")],
            Vec::new(),
        );
    };
    let mut kinds = Vec::new();
    let mut supported = Vec::new();
    let mut bad = Vec::new();
    for k in wanted {
        let group = k.group.as_deref().unwrap_or(GATEWAY_GROUP);
        match (group, k.kind.as_str()) {
            (GATEWAY_GROUP, "HTTPRoute") => kinds.push(RouteKind::HttpRoute),
            (GATEWAY_GROUP, "GRPCRoute") => kinds.push(RouteKind::GrpcRoute),
            _ => {
                bad.push(format!("{group}/{}", k.kind));
                continue;
            }
        }
        supported.push(gk(&k.kind));
    }
    (kinds, supported, bad)
}

/// The certificate of an HTTPS listener, checked by the ApisixTls code path (`tls.rs`).
/// `Err` is (reason, message) for the listener's `ResolvedRefs`.
#[allow(clippy::too_many_arguments)]
fn listener_certificate(
    gw: &Gateway,
    ns: &str,
    name: &str,
    i: usize,
    l: &Listener,
    state: &ClusterState,
    idx: &Index<'_>,
    opts: &Options,
    out: &mut Output,
) -> Result<v1::TlsCertificate, (&'static str, String)> {
    let field = format!("spec.listeners[{i}].tls.certificateRefs");
    let refs = l
        .tls
        .as_ref()
        .map(|t| t.certificate_refs.as_slice())
        .unwrap_or_default();
    let Some(r) = refs.first() else {
        return Err((
            reason::INVALID_CERTIFICATE_REF,
            format!("{field}: an HTTPS listener needs a certificate"),
        ));
    };
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Secret");
    if !group.is_empty() || kind != "Secret" {
        return Err((
            reason::INVALID_CERTIFICATE_REF,
            format!("{field}[0]: {group}/{kind} is not supported (core Secret)"),
        ));
    }
    let secret_ns = r.namespace.as_deref().unwrap_or(ns);
    if secret_ns != ns
        && !granted(
            &state.reference_grants,
            "Gateway",
            ns,
            "",
            "Secret",
            secret_ns,
            &r.name,
        )
    {
        return Err((
            reason::REF_NOT_PERMITTED,
            format!(
                "{field}[0]: Secret {secret_ns}/{} is in another namespace and no ReferenceGrant \
                 there allows it",
                r.name
            ),
        ));
    }
    let Some(hostname) = l.hostname.as_deref() else {
        // A listener without a hostname serves its certificate to every host no other
        // listener names: the default certificate, checked like every other one. It claims
        // no host, so listeners with hostnames keep theirs.
        let ((cert_chain_pem, private_key_pem), at) =
            crate::tls::any_host_certificate(idx, secret_ns, &r.name, opts.now)
                .map_err(|m| (reason::INVALID_CERTIFICATE_REF, format!("{field}[0]: {m}")))?;
        if let Some(at) = at {
            out.changes_at = Some(out.changes_at.map_or(at, |n| n.min(at)));
        }
        return Ok(v1::TlsCertificate {
            id: format!("{ns}/{name}/{}", l.name),
            source: format!("Gateway {ns}/{name} listener {}", l.name),
            hosts: Vec::new(),
            cert_chain_pem,
            private_key_pem,
            client_auth: None,
        });
    };
    let hosts = vec![hostname.to_ascii_lowercase()];
    // NB: run the ApisixTls checks on a stand-in ApisixTls, so both kinds can never disagree
    // on what a usable certificate is.
    let stand_in = ApisixTls {
        metadata: ObjectMeta {
            name: Some(format!("{name}/{}", l.name)),
            namespace: Some(ns.to_owned()),
            creation_timestamp: gw.metadata.creation_timestamp.clone(),
            ..Default::default()
        },
        spec: sluice_crds::ApisixTlsSpec {
            hosts,
            secret: sluice_crds::ApisixSecret {
                name: r.name.clone(),
                namespace: secret_ns.to_owned(),
            },
            ..Default::default()
        },
        status: None,
    };
    let mut tlses = BTreeMap::new();
    tlses.insert(crate::key(&stand_in.metadata), &stand_in);
    let mini = Index {
        routes: BTreeMap::new(),
        ingresses: BTreeMap::new(),
        upstreams: BTreeMap::new(),
        services: BTreeMap::new(),
        slices: BTreeMap::new(),
        secrets: idx.secrets.clone(),
        plugin_configs: BTreeMap::new(),
        consumers: BTreeMap::new(),
        global_rules: BTreeMap::new(),
        tlses,
        pod_labels: BTreeMap::new(),
    };
    let tls_opts = Options {
        now: opts.now,
        ..Options::default()
    };
    let mut t = crate::tls::translate(&mini, &tls_opts);
    if let Some(at) = t.changes_at {
        out.changes_at = Some(out.changes_at.map_or(at, |n| n.min(at)));
    }
    match t.certificates.pop() {
        Some(mut cert) => {
            cert.source = format!("Gateway {ns}/{name} listener {}", l.name);
            Ok(cert)
        }
        None => {
            let message = t
                .apisix
                .first()
                .and_then(|s| s.conditions.first())
                .map(|c| c.message.replacen("spec.secret", &format!("{field}[0]"), 1))
                .unwrap_or_else(|| format!("{field}[0]: not usable"));
            Err((reason::INVALID_CERTIFICATE_REF, message))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn namespace_selectors() {
        let sel: LabelSelector = serde_yaml::from_str(
            "matchLabels: {team: a}\nmatchExpressions:\n\
             - {key: env, operator: In, values: [prod, staging]}\n\
             - {key: blocked, operator: DoesNotExist}\n",
        )
        .unwrap();
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        assert!(selects(&sel, &labels(&[("team", "a"), ("env", "prod")])));
        assert!(!selects(&sel, &labels(&[("team", "a"), ("env", "dev")])));
        assert!(!selects(&sel, &labels(&[("team", "b"), ("env", "prod")])));
        assert!(!selects(
            &sel,
            &labels(&[("team", "a"), ("env", "prod"), ("blocked", "")])
        ));
        let unknown_op: LabelSelector =
            serde_yaml::from_str("matchExpressions: [{key: a, operator: Gt, values: ['1']}]")
                .unwrap();
        assert!(!selects(&unknown_op, &labels(&[("a", "2")])), "fail closed");
    }

    #[test]
    fn wildcards_match_any_depth_but_not_the_bare_suffix() {
        assert!(host_matches("*.example.com", "a.example.com"));
        assert!(host_matches("*.example.com", "a.b.example.com"));
        assert!(host_matches("*.example.com", "*.b.example.com"));
        assert!(!host_matches("*.example.com", "example.com"));
        assert!(!host_matches("*.example.com", "aexample.com"));
        assert!(!host_matches("a.example.com", "*.example.com"));
    }

    #[test]
    fn hostname_intersection() {
        let v = |s: &[&str]| s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(intersect(None, &[]), None);
        assert_eq!(intersect(Some("a.com"), &[]), Some(v(&["a.com"])));
        assert_eq!(intersect(None, &v(&["a.com"])), Some(v(&["a.com"])));
        assert_eq!(
            intersect(
                Some("*.example.com"),
                &v(&["a.example.com", "example.com", "x.b.example.com"])
            ),
            Some(v(&["a.example.com", "x.b.example.com"]))
        );
        assert_eq!(
            intersect(Some("a.example.com"), &v(&["*.example.com", "other.com"])),
            Some(v(&["a.example.com"]))
        );
        assert_eq!(
            intersect(Some("*.example.com"), &v(&["*.a.example.com"])),
            Some(v(&["*.a.example.com"]))
        );
        assert_eq!(intersect(Some("a.com"), &v(&["b.com"])), Some(Vec::new()));
    }
}
