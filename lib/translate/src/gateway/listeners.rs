//! The listeners of one Gateway: `Accepted`, `Conflicted`, `ResolvedRefs` and `Programmed`
//! per listener (see the [module docs](super) for the rules), their certificates
//! ([`super::certificate`]) and, with per-Gateway ports, the ports they open.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use sluice_crds::gateway::{GATEWAY_GROUP, Gateway, Listener, RouteGroupKind};
use sluice_proto::v1;

use super::certificate::listener_certificate;
use super::frontend;
use super::{
    ACCEPTED, CONFLICTED, GatewayOptions, GatewayStatus, ListenerStatus, MAX_PORTS_PER_GATEWAY,
    Output, PROGRAMMED, RESOLVED_REFS, RouteKind, Slot, cond, hostname, reason,
};
use crate::status::{Condition, ConditionStatus};
use crate::{ClusterState, Index, Options};

/// Which namespaces a listener admits routes from.
#[derive(Clone)]
pub(super) enum From {
    Same,
    All,
    Selector(LabelSelector),
}

/// One per-Gateway port while its listeners are read.
#[derive(Default)]
pub(super) struct PortBuild {
    /// Rank of its Gateway, oldest first (allocation order).
    age: usize,
    tls: bool,
    /// `v1::ListenerProtocol`.
    protocol: i32,
    certificates: Vec<v1::TlsCertificate>,
    default_certificate: Option<v1::TlsCertificate>,
    /// Host → the listener certificate serving it on this port.
    claimed: BTreeMap<String, String>,
    /// Frontend client-certificate validation of its HTTPS listeners.
    client_validation: Option<v1::FrontendValidation>,
    /// The Gateway's PROXY protocol setting ([`super::gateways::proxy_protocol`]): peers
    /// trusted to send the header (empty: any), `None` when off.
    proxy_protocol: Option<Vec<String>>,
}

/// A listener as routes see it.
pub(crate) struct ListenerInfo {
    /// The Gateway it serves on (the parent Gateway of a ListenerSet's listener).
    pub(super) gateway: (String, String),
    /// The ListenerSet it comes from, `None` for the Gateway's own listeners.
    pub(super) set: Option<(String, String)>,
    /// Namespace of its owner (Gateway or ListenerSet): `allowedRoutes` `from: Same`.
    pub(super) namespace: String,
    /// Its `ListenerSection` name on a per-Gateway port: the listener name, and
    /// `<ns>/<set>/<name>` for a ListenerSet's (names are unique only within their owner).
    pub(super) section: String,
    pub(super) slot: Slot,
    /// Index in its owner's `spec.listeners`.
    pub(super) index: usize,
    pub(super) name: String,
    pub(super) hostname: Option<String>,
    pub(super) port: i32,
    /// Accepted and not conflicted: routes attach to it (and count in `attachedRoutes`),
    /// even while its references do not resolve.
    pub(super) attachable: bool,
    /// Attachable and its certificate usable: its routes are served.
    pub(super) usable: bool,
    pub(super) kinds: Vec<RouteKind>,
    pub(super) from: From,
    pub(super) attached: BTreeSet<(RouteKind, String, String)>,
}

/// What every Gateway's listeners read.
pub(super) struct Inputs<'s, 'a> {
    pub(super) gopts: &'s GatewayOptions,
    pub(super) state: &'s ClusterState,
    pub(super) idx: &'s Index<'a>,
    pub(super) opts: &'s Options,
}

/// What the listeners of all Gateways share as they are read, oldest Gateway first.
pub(super) struct Served<'o> {
    /// Host → holder of its certificate on the shared HTTPS port (ApisixTls and Ingress
    /// certificates first).
    pub(super) claimed: BTreeMap<String, String>,
    /// Per-Gateway ports by id `<ns>/<gateway>/<port>`.
    pub(super) ports: BTreeMap<String, PortBuild>,
    pub(super) out: &'o mut Output,
}

/// One Gateway while its listeners are read.
pub(super) struct GatewayRef<'g> {
    pub(super) gw: &'g Gateway,
    pub(super) ns: &'g str,
    pub(super) name: &'g str,
    /// Rank, oldest first.
    pub(super) age: usize,
    /// Whether its certificates are served (and claim hosts): not for a Gateway that cannot
    /// be accepted.
    pub(super) serve: bool,
}

/// Whose listener it is: the Gateway's own, or a ListenerSet's attached to it.
pub(super) struct Owner<'g> {
    /// `Gateway` or `ListenerSet` (the `from` kind of ReferenceGrants).
    pub(super) kind: &'static str,
    pub(super) ns: &'g str,
    pub(super) name: &'g str,
    pub(super) meta: &'g ObjectMeta,
}

impl Owner<'_> {
    fn is_set(&self) -> bool {
        self.kind == "ListenerSet"
    }

    /// Snapshot certificate id of its listener `listener`: `<ns>/<gateway>/<listener>`, and
    /// `<ns>/ListenerSet/<set>/<listener>` for a ListenerSet's (a Gateway of the same name
    /// may have a listener of the same name).
    pub(super) fn certificate_id(&self, listener: &str) -> String {
        if self.is_set() {
            format!("{}/ListenerSet/{}/{listener}", self.ns, self.name)
        } else {
            format!("{}/{}/{listener}", self.ns, self.name)
        }
    }
}

/// The listeners of one Gateway's ListenerSets while they are read, in precedence order
/// (the Gateway's own first, then sets oldest first, then by namespace/name).
pub(super) struct SetContext {
    /// Listeners a further listener conflicts with: the Gateway's, then every accepted set
    /// listener so far.
    earlier: Vec<Listener>,
    /// Distinct ports the Gateway serves so far (at most [`MAX_PORTS_PER_GATEWAY`]).
    ports: Vec<i32>,
}

impl SetContext {
    /// After the Gateway's own listeners.
    pub(super) fn new(gw: &Gateway) -> Self {
        let ports = gw
            .spec
            .listeners
            .iter()
            .filter(|l| within_port_cap(gw, l))
            .map(|l| l.port)
            .fold(Vec::new(), |mut v, p| {
                if !v.contains(&p) {
                    v.push(p);
                }
                v
            });
        Self {
            earlier: gw.spec.listeners.clone(),
            ports,
        }
    }

    /// Whether `port` fits under the Gateway's port cap, taking it if so.
    fn take_port(&mut self, port: i32) -> bool {
        if self.ports.contains(&port) {
            return true;
        }
        if self.ports.len() < MAX_PORTS_PER_GATEWAY {
            self.ports.push(port);
            return true;
        }
        false
    }
}

/// Validates the listeners of one Gateway, fills `st.listeners` and adds their
/// certificates to `served`.
pub(super) fn listeners_of(
    g: &GatewayRef<'_>,
    inputs: &Inputs<'_, '_>,
    served: &mut Served<'_>,
    st: &mut GatewayStatus,
) -> Vec<ListenerInfo> {
    let owner = Owner {
        kind: "Gateway",
        ns: g.ns,
        name: g.name,
        meta: &g.gw.metadata,
    };
    let ls = &g.gw.spec.listeners;
    let mut infos = Vec::new();
    for (i, l) in ls.iter().enumerate() {
        let (status, info) = listener(g, &owner, None, i, l, inputs, served, st);
        st.listeners.push(status);
        infos.push(info);
    }
    infos
}

/// Validates the listeners of a ListenerSet attached to `g`: their statuses, in
/// `spec.listeners` order, and what routes see. Certificates go to `served` and their ids
/// into the Gateway's `st`; a listener that conflicts with an earlier one (`set`) is not
/// accepted.
pub(super) fn set_listeners(
    g: &GatewayRef<'_>,
    owner: &Owner<'_>,
    listeners: &[Listener],
    set: &mut SetContext,
    inputs: &Inputs<'_, '_>,
    served: &mut Served<'_>,
    st: &mut GatewayStatus,
) -> (Vec<ListenerStatus>, Vec<ListenerInfo>) {
    let mut statuses = Vec::new();
    let mut infos = Vec::new();
    for (i, l) in listeners.iter().enumerate() {
        let (status, info) = listener(g, owner, Some(&mut *set), i, l, inputs, served, st);
        if info.attachable {
            set.earlier.push(l.clone());
        }
        statuses.push(status);
        infos.push(info);
    }
    (statuses, infos)
}

/// One listener of `owner` (the Gateway `g` or one of its ListenerSets, with `set`): its
/// status, and its certificate into `served` (the id into `st`).
#[allow(clippy::too_many_arguments)]
fn listener(
    g: &GatewayRef<'_>,
    owner: &Owner<'_>,
    set: Option<&mut SetContext>,
    i: usize,
    l: &Listener,
    inputs: &Inputs<'_, '_>,
    served: &mut Served<'_>,
    st: &mut GatewayStatus,
) -> (ListenerStatus, ListenerInfo) {
    let gopts = inputs.gopts;
    let per_gateway = gopts.listener_ports.is_some();
    let field = format!("spec.listeners[{i}]");
    let https = l.protocol == "HTTPS";
    let stream = stream_kind(l);
    let want_port = match l.protocol.as_str() {
        // NB: with per-Gateway ports every port is the Gateway's own.
        "HTTP" | "HTTPS" | "TLS" | "TCP" | "UDP" if per_gateway => u16::try_from(l.port).ok(),
        "HTTP" => Some(gopts.http_port),
        "HTTPS" => Some(gopts.https_port),
        _ => None,
    };
    // NB: TCP and UDP listeners ignore `hostname` (the Gateway API says so).
    let host = if matches!(l.protocol.as_str(), "TCP" | "UDP") {
        None
    } else {
        l.hostname.as_deref().map(hostname)
    };
    let mut accepted = accepted(g.gw, l, &field, want_port, host.as_ref(), per_gateway);
    let mut conflicted = match set.as_deref() {
        None => conflicted(&g.gw.spec.listeners, i, l, want_port),
        Some(s) => conflict_among(s.earlier.iter(), l, want_port),
    };
    // NB: a ListenerSet's listener that conflicts with an earlier one (the Gateway's, an
    // older set's) is not accepted; the earlier one keeps serving (GEP-1713).
    let set_conflict = set.is_some()
        && accepted.status == ConditionStatus::True
        && conflicted.status == ConditionStatus::True;
    if set_conflict {
        accepted = cond(
            ACCEPTED,
            false,
            &conflicted.reason,
            conflicted.message.clone(),
        );
    }
    let cap_ok = match set {
        None => within_port_cap(g.gw, l),
        Some(s) => {
            accepted.status != ConditionStatus::True
                || !is_served(&l.protocol)
                || s.take_port(l.port)
        }
    };
    if per_gateway && accepted.status == ConditionStatus::True && !cap_ok {
        accepted = cond(
            ACCEPTED,
            false,
            reason::PORT_UNAVAILABLE,
            format!(
                "{field}.port: {} is past the {MAX_PORTS_PER_GATEWAY} ports a Gateway may \
                 use (the first {MAX_PORTS_PER_GATEWAY} distinct ports in spec.listeners order \
                 are served, then those of its ListenerSets; each is a dataplane port and a \
                 port of the Gateway's Service)",
                l.port
            ),
        );
    }
    // ResolvedRefs: route kinds, then certificates.
    let (kinds, supported, bad_kinds) = route_kinds(l);
    let mut resolved = kinds_resolved(&field, &bad_kinds);
    let mut validation = None;
    if https && per_gateway && accepted.status == ConditionStatus::True {
        match frontend::for_port(g, l.port, inputs) {
            Ok(None) => {}
            Ok(Some(v)) => {
                if let Some((r, m)) = v.partly {
                    resolved = cond(RESOLVED_REFS, false, r, m);
                }
                validation = Some(v.validation);
            }
            Err((r, m)) => {
                resolved = cond(RESOLVED_REFS, false, r, m.clone());
                accepted = cond(ACCEPTED, false, reason::NO_VALID_CA_CERTIFICATE, m);
            }
        }
    }
    let usable_so_far =
        accepted.status == ConditionStatus::True && conflicted.status == ConditionStatus::False;
    let port_id = port_id(g.ns, g.name, l);
    // TLS is terminated here with the listener's certificate: HTTPS, and TLS in Terminate mode.
    let terminate = https || stream == Some(v1::StreamTls::Terminate);
    if per_gateway && usable_so_far && g.serve {
        let port = served.ports.entry(port_id.clone()).or_default();
        port.age = g.age;
        port.tls |= terminate;
        port.protocol = listener_protocol(&l.protocol) as i32;
        if validation.is_some() {
            port.client_validation = validation;
        }
        // NB: a UDP port takes no PROXY header (the dataplane refuses one there).
        if port.protocol != v1::ListenerProtocol::Udp as i32 {
            port.proxy_protocol = super::gateways::proxy_protocol(g.gw).ok().flatten();
        }
    }
    let mut cert_ok = true;
    if terminate && usable_so_far && g.serve {
        let cert = listener_certificate(owner, i, l, inputs, served.out);
        let port = &port_id;
        if let Err(c) = serve_certificate(cert, l, per_gateway.then_some(port), served, st) {
            cert_ok = false;
            if c.type_ == CONFLICTED {
                conflicted = c;
            } else {
                resolved = c;
            }
        }
    }
    let usable = usable_so_far && cert_ok;
    let programmed = if set_conflict {
        cond(
            PROGRAMMED,
            false,
            &conflicted.reason,
            "The listener conflicts with an earlier one",
        )
    } else {
        programmed(usable)
    };
    let status = ListenerStatus {
        name: l.name.clone(),
        supported_kinds: supported,
        attached_routes: 0,
        conditions: vec![accepted, conflicted, resolved, programmed],
    };
    let slot = match stream {
        Some(tls) => Slot::Stream(port_id, tls as i32),
        None if per_gateway => {
            Slot::Listener(port_id, u16::try_from(l.port).unwrap_or_default(), https)
        }
        None => Slot::Scheme(https),
    };
    let info = ListenerInfo {
        gateway: (g.ns.to_owned(), g.name.to_owned()),
        set: owner
            .is_set()
            .then(|| (owner.ns.to_owned(), owner.name.to_owned())),
        namespace: owner.ns.to_owned(),
        section: if owner.is_set() {
            format!("{}/{}/{}", owner.ns, owner.name, l.name)
        } else {
            l.name.clone()
        },
        slot,
        index: i,
        name: l.name.clone(),
        hostname: host.and_then(Result::ok),
        port: l.port,
        attachable: usable_so_far,
        usable,
        kinds,
        from: allowed_from(l),
        attached: BTreeSet::new(),
    };
    (status, info)
}

/// The `Snapshot.listeners` id of a listener's port: `<ns>/<gateway>/<port>`, and
/// `<ns>/<gateway>/<port>/udp` for UDP, which may share the port number with a TCP-based
/// listener. NB: every UDP port carries the suffix, so its id (and the dataplane port the
/// range gives it) does not change when a TCP listener joins its port number.
fn port_id(ns: &str, name: &str, l: &Listener) -> String {
    if l.protocol == "UDP" {
        format!("{ns}/{name}/{}/udp", l.port)
    } else {
        format!("{ns}/{name}/{}", l.port)
    }
}

/// How a TLS, TCP or UDP listener treats TLS; `None` for HTTP and HTTPS (and protocols
/// Sluice does not serve).
fn stream_kind(l: &Listener) -> Option<v1::StreamTls> {
    match l.protocol.as_str() {
        "TCP" | "UDP" => Some(v1::StreamTls::None),
        "TLS" => match tls_mode(l) {
            "Passthrough" => Some(v1::StreamTls::Passthrough),
            _ => Some(v1::StreamTls::Terminate),
        },
        _ => None,
    }
}

/// `tls.mode`, default `Terminate`.
fn tls_mode(l: &Listener) -> &str {
    l.tls
        .as_ref()
        .and_then(|t| t.mode.as_deref())
        .unwrap_or("Terminate")
}

fn listener_protocol(protocol: &str) -> v1::ListenerProtocol {
    match protocol {
        "TLS" => v1::ListenerProtocol::Tls,
        "TCP" => v1::ListenerProtocol::Tcp,
        "UDP" => v1::ListenerProtocol::Udp,
        _ => v1::ListenerProtocol::Http,
    }
}

/// `Accepted`: a protocol Sluice serves on the port it serves it on, a valid hostname, TLS
/// termination.
fn accepted(
    gw: &Gateway,
    l: &Listener,
    field: &str,
    want_port: Option<u16>,
    host: Option<&Result<String, String>>,
    per_gateway: bool,
) -> Condition {
    // NB: checked first: a TLS verdict wins over the port and hostname ones.
    if l.protocol == "TLS" && !matches!(tls_mode(l), "Terminate" | "Passthrough") {
        return cond(
            ACCEPTED,
            false,
            reason::UNSUPPORTED_VALUE,
            format!(
                "{field}.tls.mode: {} is not a TLS mode (Terminate, Passthrough)",
                tls_mode(l)
            ),
        );
    }
    if l.protocol == "HTTPS" {
        let mode = tls_mode(l);
        if mode != "Terminate" {
            return cond(
                ACCEPTED,
                false,
                reason::UNSUPPORTED_VALUE,
                format!("{field}.tls.mode: {mode} is not supported for HTTPS (Terminate)"),
            );
        } else if !per_gateway
            && gw
                .spec
                .tls
                .as_ref()
                .is_some_and(|t| t.get("frontend").is_some())
        {
            return cond(
                ACCEPTED,
                false,
                reason::UNSUPPORTED_VALUE,
                "spec.tls: frontend client-certificate validation needs per-Gateway ports \
                 (the shared HTTPS port's certificates serve every Gateway)",
            );
        }
    }
    match (want_port, host) {
        (None, _) if is_served(&l.protocol) => {
            return cond(
                ACCEPTED,
                false,
                reason::UNSUPPORTED_PROTOCOL,
                format!(
                    "{field}.protocol: {} needs a port of the Gateway's own (per-Gateway \
                     ports, --gateway-service-namespace); the shared dataplane ports serve \
                     HTTP and HTTPS",
                    l.protocol
                ),
            );
        }
        (None, _) => {
            return cond(
                ACCEPTED,
                false,
                reason::UNSUPPORTED_PROTOCOL,
                format!(
                    "{field}.protocol: {} is not supported (HTTP, HTTPS, TLS, TCP, UDP)",
                    l.protocol
                ),
            );
        }
        (Some(p), _) if i32::from(p) != l.port => {
            return cond(
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
            return cond(
                ACCEPTED,
                false,
                reason::UNSUPPORTED_VALUE,
                format!("{field}.hostname: {e}"),
            );
        }
        _ => {}
    }
    cond(ACCEPTED, true, reason::ACCEPTED, "Accepted")
}

/// Whether `l`'s port is among the first [`MAX_PORTS_PER_GATEWAY`] distinct port numbers of
/// the listeners of `gw` Sluice serves, in `spec.listeners` order.
fn within_port_cap(gw: &Gateway, l: &Listener) -> bool {
    let mut ports = Vec::with_capacity(MAX_PORTS_PER_GATEWAY);
    for o in gw.spec.listeners.iter().filter(|o| is_served(&o.protocol)) {
        if !ports.contains(&o.port) {
            if ports.len() == MAX_PORTS_PER_GATEWAY {
                break;
            }
            ports.push(o.port);
        }
    }
    ports.contains(&l.port)
}

/// `Conflicted`: same port and transport (UDP, or TCP for the others), other protocol; or
/// same port, protocol and hostname. TLS listeners of both modes share a port (SNI tells
/// them apart), and so do a UDP listener and a TCP-based one.
fn conflicted(ls: &[Listener], i: usize, l: &Listener, want_port: Option<u16>) -> Condition {
    let others = ls
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != i)
        .map(|(_, o)| o);
    conflict_among(others, l, want_port)
}

/// `Conflicted` of `l` against `others`, by the rules of [`conflicted`].
fn conflict_among<'a>(
    others: impl Iterator<Item = &'a Listener>,
    l: &Listener,
    want_port: Option<u16>,
) -> Condition {
    let udp = |p: &str| p == "UDP";
    for o in others {
        // NB: only listeners Sluice can serve conflict; an SCTP listener is just unsupported.
        if o.port != l.port
            || want_port.is_none()
            || !is_served(&o.protocol)
            || udp(&o.protocol) != udp(&l.protocol)
        {
            continue;
        }
        if o.protocol != l.protocol {
            return cond(
                CONFLICTED,
                true,
                reason::PROTOCOL_CONFLICT,
                format!(
                    "listener {} uses port {} with protocol {}",
                    o.name, o.port, o.protocol
                ),
            );
        }
        // NB: TCP and UDP listeners ignore hostnames: one per port.
        let norm = |h: Option<&str>| h.map(str::to_ascii_lowercase);
        let same_host = matches!(l.protocol.as_str(), "TCP" | "UDP")
            || norm(o.hostname.as_deref()) == norm(l.hostname.as_deref());
        if same_host {
            return cond(
                CONFLICTED,
                true,
                reason::HOSTNAME_CONFLICT,
                format!(
                    "listener {} has the same port, protocol and hostname",
                    o.name
                ),
            );
        }
    }
    cond(CONFLICTED, false, reason::NO_CONFLICTS, "No conflicts")
}

/// `ResolvedRefs` as far as the route kinds go.
fn kinds_resolved(field: &str, bad_kinds: &[String]) -> Condition {
    if bad_kinds.is_empty() {
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
    }
}

fn programmed(usable: bool) -> Condition {
    if usable {
        cond(PROGRAMMED, true, reason::PROGRAMMED, "Programmed")
    } else {
        cond(
            PROGRAMMED,
            false,
            reason::INVALID,
            "The listener is not valid",
        )
    }
}

/// Serves the certificate of an HTTPS listener where it belongs: this Gateway's own port
/// (`port`, with per-Gateway ports), or the shared HTTPS port. `Err` is the condition that
/// says why it is not served: `ResolvedRefs` (no usable certificate) or `Conflicted` (a host
/// or the catch-all certificate is held already).
fn serve_certificate(
    cert: Result<v1::TlsCertificate, (&'static str, String)>,
    l: &Listener,
    port: Option<&String>,
    served: &mut Served<'_>,
    st: &mut GatewayStatus,
) -> Result<(), Condition> {
    let cert = cert.map_err(|(r, m)| cond(RESOLVED_REFS, false, r, m))?;
    let (claimed, default_certificate, certificates) =
        match port.and_then(|id| served.ports.get_mut(id)) {
            Some(p) => (
                &mut p.claimed,
                &mut p.default_certificate,
                &mut p.certificates,
            ),
            None => (
                &mut served.claimed,
                &mut served.out.default_certificate,
                &mut served.out.certificates,
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
        return Err(cond(
            CONFLICTED,
            true,
            reason::HOSTNAME_CONFLICT,
            format!("the certificate for hosts no listener names is already served by {holder}"),
        ));
    }
    if let Some((h, holder)) = cert
        .hosts
        .iter()
        .find_map(|h| claimed.get(h).map(|o| (h, o)))
    {
        return Err(cond(
            CONFLICTED,
            true,
            reason::HOSTNAME_CONFLICT,
            format!("host {h} is already served by {holder}"),
        ));
    }
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
    Ok(())
}

/// `allowedRoutes.namespaces`.
fn allowed_from(l: &Listener) -> From {
    let Some(n) = l
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
    else {
        return From::Same;
    };
    match (n.from.as_deref().unwrap_or("Same"), &n.selector) {
        ("All", _) => From::All,
        ("Selector", Some(sel)) => From::Selector(sel.clone()),
        // NB: `Selector` without a selector admits nothing (fail closed).
        ("Selector", None) => From::Selector(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "sluice.dev/never".into(),
                operator: "In".into(),
                values: Some(Vec::new()),
            }]),
            match_labels: None,
        }),
        _ => From::Same,
    }
}

/// Gives each per-Gateway port a port of `range`: where a hash of its id points, else the
/// next free one, oldest Gateway first, so a port keeps its number while Gateways come and
/// go (unless two hash alike and the older one goes). Ports the range has no room for are
/// left out.
pub(super) fn allocate_ports(
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
        // `<ns>/<gateway>` of `<ns>/<gateway>/<port>[/udp]`.
        let source = id.splitn(3, '/').take(2).collect::<Vec<_>>().join("/");
        let mut certificates = p.certificates;
        certificates.sort_by(|a, b| a.id.cmp(&b.id));
        out.push(v1::Listener {
            id: id.clone(),
            source: format!("Gateway {source}"),
            port,
            tls: p.tls,
            protocol: p.protocol,
            tls_certificates: certificates,
            default_certificate: p.default_certificate,
            client_validation: p.client_validation,
            accept_proxy_protocol: p.proxy_protocol.is_some(),
            proxy_protocol_trusted: p.proxy_protocol.unwrap_or_default(),
            ..Default::default()
        });
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

/// Protocols Sluice serves on listeners.
fn is_served(protocol: &str) -> bool {
    matches!(protocol, "HTTP" | "HTTPS" | "TLS" | "TCP" | "UDP")
}

/// The route kinds a listener of `protocol` takes.
fn kinds_for(protocol: &str) -> &'static [RouteKind] {
    match protocol {
        "HTTP" | "HTTPS" => &[RouteKind::HttpRoute, RouteKind::GrpcRoute],
        "TLS" => &[RouteKind::TlsRoute],
        "TCP" => &[RouteKind::TcpRoute],
        "UDP" => &[RouteKind::UdpRoute],
        _ => &[],
    }
}

/// (kinds routes may be, supportedKinds for the status, names of unsupported kinds).
fn route_kinds(l: &Listener) -> (Vec<RouteKind>, Vec<RouteGroupKind>, Vec<String>) {
    let gk = |kind: RouteKind| RouteGroupKind {
        group: Some(GATEWAY_GROUP.to_owned()),
        kind: kind.as_str().to_owned(),
    };
    let allowed = kinds_for(&l.protocol);
    if allowed.is_empty() {
        return (Vec::new(), Vec::new(), Vec::new());
    }
    let wanted = l
        .allowed_routes
        .as_ref()
        .map(|a| &a.kinds)
        .filter(|k| !k.is_empty());
    let Some(wanted) = wanted else {
        return (
            allowed.to_vec(),
            allowed.iter().map(|k| gk(*k)).collect(),
            Vec::new(),
        );
    };
    let mut kinds = Vec::new();
    let mut supported = Vec::new();
    let mut bad = Vec::new();
    for k in wanted {
        let group = k.group.as_deref().unwrap_or(GATEWAY_GROUP);
        let kind = allowed
            .iter()
            .find(|a| group == GATEWAY_GROUP && a.as_str() == k.kind);
        match kind {
            Some(kind) => {
                kinds.push(*kind);
                supported.push(gk(*kind));
            }
            None => bad.push(format!("{group}/{}", k.kind)),
        }
    }
    (kinds, supported, bad)
}
