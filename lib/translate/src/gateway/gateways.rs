//! GatewayClasses and Gateways: which are Sluice's, their `Accepted` and `Programmed`
//! conditions, their listeners ([`super::listeners`]), the ListenerSets attached to them
//! and per-Gateway ports.
//!
//! # ListenerSets
//!
//! A ListenerSet adds listeners to the Gateway its `parentRef` names, when that Gateway is
//! one of Sluice's and its `spec.allowedListeners.namespaces` admits the set's namespace
//! (`Same`, `All`, `Selector`; default `None`: no set). Else the set is `Accepted=False`
//! (`NotAllowed`, or `ParentNotAccepted` when the Gateway is not accepted). The listeners of
//! an attached set are checked as the Gateway's own are and serve on the Gateway's address
//! (its per-Gateway ports, or the shared ones), after the Gateway's own listeners and those
//! of older sets (creation time, then namespace/name): a listener that conflicts with an
//! earlier one is `Accepted=False` and `Conflicted=True` (`HostnameConflict`,
//! `ProtocolConflict`) and the earlier one keeps serving. A set with no accepted listener is
//! `Accepted=False` (`ListenersNotValid`). Routes attach to a set's listeners only with a
//! `parentRef` of kind `ListenerSet`; a `parentRef` to the Gateway attaches to the Gateway's
//! own listeners. A set's certificate Secret in another namespace needs a ReferenceGrant
//! from `ListenerSet` (a Gateway's grant does not count). The Gateway's
//! `status.attachedListenerSets` counts the accepted sets.

use std::collections::BTreeMap;

use sluice_crds::gateway::{Gateway, GatewayClass, ListenerSet};

use super::attach::selects;
use super::listeners::{
    GatewayRef, Inputs, ListenerInfo, Owner, Served, SetContext, allocate_ports, listeners_of,
    set_listeners,
};
use super::{
    ACCEPTED, CONFLICTED, GATEWAY_GROUP, GatewayClassStatus, GatewayOptions, GatewayStatus,
    ListenerSetStatus, ListenerStatus, Output, PROGRAMMED, RESOLVED_REFS, Slot, cond, created,
    reason, supported_features,
};
use crate::ClusterState;
use crate::status::{Condition, ConditionStatus};

/// The GatewayClasses of Sluice's controller name by name: whether each is accepted.
/// Their status goes into `out`.
pub(super) fn classes<'s>(
    state: &'s ClusterState,
    gopts: &GatewayOptions,
    out: &mut Output,
) -> BTreeMap<&'s str, bool> {
    let mut classes = BTreeMap::new();
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
    classes
}

/// The Gateways of Sluice's classes as routes see them.
#[derive(Default)]
pub(super) struct Gateways {
    /// The listeners of every Gateway, oldest Gateway first.
    pub(super) listeners: Vec<ListenerInfo>,
    /// Status by (namespace, name).
    pub(super) status: BTreeMap<(String, String), GatewayStatus>,
    /// Whether each is accepted, by (namespace, name).
    pub(super) accepted: BTreeMap<(String, String), bool>,
    /// ListenerSets whose parent is one of these Gateways, by (namespace, name): the
    /// Gateway and whether the set is accepted.
    pub(super) sets: super::attach::Sets,
    /// Their status, by (namespace, name).
    pub(super) set_status: BTreeMap<(String, String), ListenerSetStatus>,
}

impl Gateways {
    /// The listener counts into the Gateway statuses, which go into `out`.
    pub(super) fn finish(mut self, out: &mut Output) {
        for l in &self.listeners {
            let listeners = match &l.set {
                None => self.status.get_mut(&l.gateway).map(|s| &mut s.listeners),
                Some(set) => self.set_status.get_mut(set).map(|s| &mut s.listeners),
            };
            if let Some(ls) = listeners.and_then(|ls| ls.get_mut(l.index)) {
                ls.attached_routes = i32::try_from(l.attached.len()).unwrap_or(i32::MAX);
            }
        }
        out.status.listener_sets = self.set_status.into_values().collect();
        out.status.gateways = self
            .status
            .into_values()
            .map(|mut g| {
                g.routes.sort();
                g.routes.dedup();
                g.certificates.sort();
                g
            })
            .collect();
    }
}

/// Reads every Gateway of `classes`, oldest first so an older listener keeps a contested
/// TLS host; `served_certificates` (ApisixTls, Ingress) hold their hosts already.
pub(super) fn gateways(
    inputs: &Inputs<'_, '_>,
    classes: &BTreeMap<&str, bool>,
    served_certificates: &[sluice_proto::v1::TlsCertificate],
    out: &mut Output,
) -> Gateways {
    let mut sorted: Vec<&Gateway> = inputs
        .state
        .gateways
        .iter()
        .filter(|g| classes.contains_key(g.spec.gateway_class_name.as_str()))
        .collect();
    sorted.sort_by(|a, b| {
        (created(&a.metadata), crate::key(&a.metadata))
            .cmp(&(created(&b.metadata), crate::key(&b.metadata)))
    });
    let mut gws = Gateways::default();
    let mut served = Served {
        claimed: served_certificates
            .iter()
            .flat_map(|c| c.hosts.iter().map(|h| (h.clone(), c.source.clone())))
            .collect(),
        ports: BTreeMap::new(),
        out,
    };
    let sets = sets_by_gateway(inputs.state);
    for (age, gw) in sorted.into_iter().enumerate() {
        let key = crate::key(&gw.metadata);
        let none = Vec::new();
        let its_sets = sets.get(&key).unwrap_or(&none);
        gateway(gw, age, its_sets, inputs, classes, &mut served, &mut gws);
    }
    let Served { ports, out, .. } = served;
    if let Some(range) = &inputs.gopts.listener_ports {
        out.listeners = allocate_ports(range, ports);
        // NB: a port the range had no room for serves nothing; its listeners cannot serve.
        for l in &mut gws.listeners {
            if let Slot::Listener(id, ..) = &l.slot
                && !out.listeners.iter().any(|p| p.id == *id)
            {
                l.usable = false;
            }
        }
        add_sections(&gws.listeners, &mut out.listeners);
    }
    gws
}

/// The Gateway listeners serving on each per-Gateway port (`Listener.sections`), routes
/// still to be added, sorted by name.
fn add_sections(infos: &[ListenerInfo], ports: &mut [sluice_proto::v1::Listener]) {
    for l in infos.iter().filter(|l| l.usable) {
        let Slot::Listener(id, ..) = &l.slot else {
            continue;
        };
        if let Some(p) = ports.iter_mut().find(|p| p.id == *id) {
            p.sections.push(sluice_proto::v1::ListenerSection {
                name: l.section.clone(),
                hostname: l.hostname.clone().unwrap_or_default(),
                routes: Vec::new(),
            });
        }
    }
    for p in ports {
        p.sections.sort_by(|a, b| a.name.cmp(&b.name));
    }
}

/// The ListenerSets of `state` by the (namespace, name) of the Gateway their `parentRef`
/// names, each list in precedence order: oldest first, then by namespace/name.
fn sets_by_gateway(state: &crate::ClusterState) -> BTreeMap<(&str, &str), Vec<&ListenerSet>> {
    let mut by: BTreeMap<(&str, &str), Vec<&ListenerSet>> = BTreeMap::new();
    for s in &state.listener_sets {
        let p = &s.spec.parent_ref;
        if p.group.as_deref().unwrap_or(GATEWAY_GROUP) != GATEWAY_GROUP
            || p.kind.as_deref().unwrap_or("Gateway") != "Gateway"
        {
            continue;
        }
        let (ns, _) = crate::key(&s.metadata);
        let gw_ns = p.namespace.as_deref().unwrap_or(ns);
        by.entry((gw_ns, p.name.as_str())).or_default().push(s);
    }
    for list in by.values_mut() {
        list.sort_by(|a, b| {
            (created(&a.metadata), crate::key(&a.metadata))
                .cmp(&(created(&b.metadata), crate::key(&b.metadata)))
        });
    }
    by
}

/// Whether `gw`'s `spec.allowedListeners` admits ListenerSets from namespace `ns`.
fn allows_set(gw: &Gateway, gw_ns: &str, ns: &str, inputs: &Inputs<'_, '_>) -> bool {
    let Some(n) = gw
        .spec
        .allowed_listeners
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
    else {
        return false;
    };
    match n.from.as_deref().unwrap_or("None") {
        "All" => true,
        "Same" => ns == gw_ns,
        // NB: `Selector` without a selector admits nothing (fail closed).
        "Selector" => n.selector.as_ref().is_some_and(|sel| {
            inputs
                .state
                .namespaces
                .iter()
                .find(|o| o.metadata.name.as_deref() == Some(ns))
                .is_some_and(|o| {
                    selects(sel, o.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()))
                })
        }),
        _ => false,
    }
}

/// Whether `gw` admits any ListenerSet at all (`allowedListeners` other than `None`).
fn admits_sets(gw: &Gateway) -> bool {
    gw.spec
        .allowed_listeners
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
        .and_then(|n| n.from.as_deref())
        .is_some_and(|f| f != "None")
}

/// The ListenerSets of Gateway `g` (`ok`: whether it is accepted), in precedence order: their
/// listeners into `gws.listeners`, their status into `gws`, certificates into `served` (ids
/// into `st`); the Gateway's `attachedListenerSets` into `st`.
fn listener_sets(
    g: &GatewayRef<'_>,
    ok: bool,
    sets: &[&ListenerSet],
    inputs: &Inputs<'_, '_>,
    served: &mut Served<'_>,
    st: &mut GatewayStatus,
    gws: &mut Gateways,
) {
    let mut ctx = SetContext::new(g.gw);
    let mut attached = 0;
    for set in sets {
        let (ns, name) = crate::key(&set.metadata);
        let key = (ns.to_owned(), name.to_owned());
        let mut ls = ListenerSetStatus {
            namespace: ns.to_owned(),
            name: name.to_owned(),
            generation: set.metadata.generation,
            gateway_namespace: g.ns.to_owned(),
            gateway_name: g.name.to_owned(),
            conditions: Vec::new(),
            listeners: Vec::new(),
        };
        let refused = if !ok {
            Some((
                reason::PARENT_NOT_ACCEPTED,
                format!("Gateway {}/{} is not accepted", g.ns, g.name),
            ))
        } else if !allows_set(g.gw, g.ns, ns, inputs) {
            Some((
                reason::NOT_ALLOWED,
                format!(
                    "Gateway {}/{}: spec.allowedListeners does not admit ListenerSets from \
                     namespace {ns}",
                    g.ns, g.name
                ),
            ))
        } else {
            None
        };
        if let Some((r, m)) = refused {
            ls.conditions = vec![
                cond(ACCEPTED, false, r, m.clone()),
                cond(PROGRAMMED, false, r, m),
            ];
            gws.sets
                .insert(key.clone(), ((g.ns.to_owned(), g.name.to_owned()), false));
            gws.set_status.insert(key, ls);
            continue;
        }
        let owner = Owner {
            kind: "ListenerSet",
            ns,
            name,
            meta: &set.metadata,
        };
        let (statuses, infos) =
            set_listeners(g, &owner, &set.spec.listeners, &mut ctx, inputs, served, st);
        ls.listeners = statuses;
        let any_usable = infos.iter().any(|l| l.usable);
        let accepted = listeners_accepted(&ls.listeners);
        // Unlike a Gateway, a set none of whose listeners can serve (e.g. each one's
        // certificate is refused) is not accepted: `Accepted` and `Programmed` False,
        // `ListenersNotValid` (conformance `ListenerSetReferenceGrant`).
        let set_ok = accepted.status == ConditionStatus::True && any_usable;
        ls.conditions = if set_ok {
            vec![
                accepted,
                cond(PROGRAMMED, true, reason::PROGRAMMED, "Programmed"),
            ]
        } else {
            let m = "no listener is valid";
            vec![
                cond(ACCEPTED, false, reason::LISTENERS_NOT_VALID, m),
                cond(PROGRAMMED, false, reason::LISTENERS_NOT_VALID, m),
            ]
        };
        if set_ok {
            attached += 1;
        }
        gws.sets
            .insert(key.clone(), ((g.ns.to_owned(), g.name.to_owned()), set_ok));
        gws.set_status.insert(key, ls);
        gws.listeners.extend(infos);
    }
    if ok && (attached > 0 || admits_sets(g.gw)) {
        st.attached_listener_sets = Some(attached);
    }
}

/// One Gateway and its ListenerSets: listeners, conditions and status into `gws`.
fn gateway(
    gw: &Gateway,
    age: usize,
    sets: &[&ListenerSet],
    inputs: &Inputs<'_, '_>,
    classes: &BTreeMap<&str, bool>,
    served: &mut Served<'_>,
    gws: &mut Gateways,
) {
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
        attached_listener_sets: None,
        static_addresses: Vec::new(),
        infrastructure_labels: BTreeMap::new(),
        infrastructure_annotations: BTreeMap::new(),
    };
    let own_services = inputs.gopts.listener_ports.is_some();
    let spec_ok = spec_refusal(gw, own_services).is_none();
    let g = GatewayRef {
        gw,
        ns,
        name,
        age,
        // NB: a Gateway that cannot be accepted serves no certificate (nor claims hosts).
        serve: class_ok && spec_ok,
    };
    let mut infos = listeners_of(&g, inputs, served, &mut st);
    let any_usable = infos.iter().any(|l| l.usable);
    let (accepted, programmed) = conditions(gw, class_ok, own_services, &st.listeners, any_usable);
    let ok = accepted.status == ConditionStatus::True;
    if ok {
        st.static_addresses = static_addresses(gw).unwrap_or_default();
        if let Some(infra) = &gw.spec.infrastructure {
            st.infrastructure_labels = infra.labels.clone();
            st.infrastructure_annotations = infra.annotations.clone();
        }
    }
    if !ok {
        not_accepted(&mut infos, &mut st);
        let prefix = format!("{ns}/{name}/");
        // NB: every id under the prefix is this Gateway's (`<port>` or `<port>/udp`).
        served.ports.retain(|id, _| !id.starts_with(&prefix));
    }
    st.conditions = vec![accepted, programmed];
    if ok && inputs.gopts.listener_ports.is_some() && super::frontend::insecure_fallback(&g) {
        st.conditions.push(cond(
            "InsecureFrontendValidationMode",
            true,
            reason::CONFIGURATION_CHANGED,
            "spec.tls.frontend: AllowInsecureFallback serves clients without a valid certificate",
        ));
    }
    gws.accepted.insert((ns.to_owned(), name.to_owned()), ok);
    gws.listeners.extend(infos);
    listener_sets(&g, ok, sets, inputs, served, &mut st, gws);
    gws.status.insert((ns.to_owned(), name.to_owned()), st);
}

/// The listeners of a Gateway that is not accepted serve nothing and take no routes.
fn not_accepted(infos: &mut [ListenerInfo], st: &mut GatewayStatus) {
    for l in infos {
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

/// Gateway annotation: `"true"` makes every TCP port of the Gateway (per-Gateway ports)
/// require a PROXY protocol v1/v2 header, whose address is the client's.
pub const PROXY_PROTOCOL_ANNOTATION: &str = "gateway.sluice.dev/proxy-protocol";
/// Gateway annotation: comma-separated IPs or CIDRs allowed to send that header (default:
/// any peer); a connection from another peer is closed.
pub const PROXY_PROTOCOL_TRUSTED_ANNOTATION: &str = "gateway.sluice.dev/proxy-protocol-trusted";

/// The Gateway's PROXY protocol setting from its annotations: `Some(trusted peers)` when on
/// (empty: any peer), `None` when off; `Err` names the annotation and what is wrong.
pub(super) fn proxy_protocol(gw: &Gateway) -> Result<Option<Vec<String>>, String> {
    let get = |k: &str| {
        gw.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .map(String::as_str)
    };
    let trusted = get(PROXY_PROTOCOL_TRUSTED_ANNOTATION);
    match get(PROXY_PROTOCOL_ANNOTATION).map(str::trim) {
        None | Some("false") => {
            if trusted.is_some() {
                return Err(format!(
                    "metadata.annotations[{PROXY_PROTOCOL_TRUSTED_ANNOTATION}]: set without \
                     {PROXY_PROTOCOL_ANNOTATION}: \"true\""
                ));
            }
            Ok(None)
        }
        Some("true") => trusted
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| {
                crate::validate::remote_addr(t).map_err(|e| {
                    format!("metadata.annotations[{PROXY_PROTOCOL_TRUSTED_ANNOTATION}]: {e}")
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(format!(
            "metadata.annotations[{PROXY_PROTOCOL_ANNOTATION}] {other:?}: expected \"true\" \
             or \"false\""
        )),
    }
}

/// Why a Gateway's spec cannot be accepted as a whole (reason, message), if it cannot:
/// `spec.infrastructure.parametersRef` (Sluice takes no parameters) or an address Sluice
/// cannot give (a type other than `IPAddress`, or static IPs without per-Gateway Services).
fn spec_refusal(gw: &Gateway, own_services: bool) -> Option<(&'static str, String)> {
    if let Some(p) = gw
        .spec
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref())
    {
        let field = |k: &str| p.get(k).and_then(|v| v.as_str()).unwrap_or_default();
        return Some((
            reason::INVALID_PARAMETERS,
            format!(
                "spec.infrastructure.parametersRef: Sluice takes no Gateway parameters \
                 ({}.{} {:?} is not a kind it reads)",
                field("kind"),
                field("group"),
                field("name")
            ),
        ));
    }
    match proxy_protocol(gw) {
        Err(m) => return Some((reason::INVALID_PARAMETERS, m)),
        Ok(Some(_)) if !own_services => {
            return Some((
                reason::INVALID_PARAMETERS,
                format!(
                    "metadata.annotations[{PROXY_PROTOCOL_ANNOTATION}]: a Gateway's own PROXY \
                     protocol setting needs its own ports (chart value \
                     controller.gatewayServices.enabled); on the shared ports the dataplane's \
                     --proxy-protocol applies"
                ),
            ));
        }
        Ok(_) => {}
    }
    for (i, a) in gw.spec.addresses.iter().enumerate() {
        let type_ = a.type_.as_deref().unwrap_or("IPAddress");
        if type_ != "IPAddress" {
            return Some((
                reason::UNSUPPORTED_ADDRESS,
                format!(
                    "spec.addresses[{i}].type {type_:?}: Sluice gives a Gateway IP addresses \
                     only (its Service's)"
                ),
            ));
        }
        match a.value.as_deref().filter(|v| !v.is_empty()) {
            None => {}
            Some(v) if v.parse::<std::net::IpAddr>().is_err() => {
                return Some((
                    reason::UNSUPPORTED_ADDRESS,
                    format!("spec.addresses[{i}].value {v:?}: not an IP address"),
                ));
            }
            Some(v) if !own_services => {
                return Some((
                    reason::UNSUPPORTED_ADDRESS,
                    format!(
                        "spec.addresses[{i}].value {v}: a static address needs the Gateway's \
                         own Service (chart value controller.gatewayServices.enabled); every \
                         Gateway now shares the dataplane Service's address"
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    None
}

/// The static IPs of `spec.addresses` (values, normalised), if a Service can carry them:
/// at most one per family (`clusterIPs`, and one `loadBalancerIP` on a load balancer).
fn static_addresses(gw: &Gateway) -> Result<Vec<String>, String> {
    let ips: Vec<std::net::IpAddr> = gw
        .spec
        .addresses
        .iter()
        .filter_map(|a| a.value.as_deref()?.parse().ok())
        .collect();
    let v4 = ips.iter().filter(|ip| ip.is_ipv4()).count();
    let v6 = ips.len() - v4;
    if v4 > 1 || v6 > 1 {
        let all: Vec<String> = ips.iter().map(ToString::to_string).collect();
        return Err(format!(
            "spec.addresses {}: a Service takes at most one IPv4 and one IPv6 address",
            all.join(", ")
        ));
    }
    Ok(ips.iter().map(ToString::to_string).collect())
}

/// A Gateway's `Accepted` and `Programmed`.
fn conditions(
    gw: &Gateway,
    class_ok: bool,
    own_services: bool,
    listeners: &[ListenerStatus],
    any_usable: bool,
) -> (Condition, Condition) {
    if !class_ok {
        let m = format!(
            "GatewayClass {} is not accepted",
            gw.spec.gateway_class_name
        );
        return (
            cond(ACCEPTED, false, reason::INVALID_PARAMETERS, m.clone()),
            cond(PROGRAMMED, false, reason::INVALID, m),
        );
    }
    if let Some((r, m)) = spec_refusal(gw, own_services) {
        return (
            cond(ACCEPTED, false, r, m.clone()),
            cond(PROGRAMMED, false, reason::INVALID, m),
        );
    }
    let accepted = listeners_accepted(listeners);
    if let Err(m) = static_addresses(gw) {
        return (
            accepted,
            cond(PROGRAMMED, false, reason::ADDRESS_NOT_USABLE, m),
        );
    }
    let programmed = if any_usable {
        cond(PROGRAMMED, true, reason::PROGRAMMED, "Programmed")
    } else {
        cond(PROGRAMMED, false, reason::INVALID, "no listener can serve")
    };
    (accepted, programmed)
}

/// `Accepted` of a Gateway (or ListenerSet) by its listeners: accepted when some listener
/// is; reason ListenersNotValid when any listener is not accepted, conflicted or has
/// unresolved references.
fn listeners_accepted(listeners: &[ListenerStatus]) -> Condition {
    let has = |ls: &ListenerStatus, type_: &str, status: ConditionStatus| {
        ls.conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == status)
    };
    let any_accepted = listeners
        .iter()
        .any(|ls| has(ls, ACCEPTED, ConditionStatus::True));
    let invalid: Vec<&str> = listeners
        .iter()
        .filter(|ls| {
            has(ls, ACCEPTED, ConditionStatus::False)
                || has(ls, CONFLICTED, ConditionStatus::True)
                || has(ls, RESOLVED_REFS, ConditionStatus::False)
        })
        .map(|ls| ls.name.as_str())
        .collect();
    if !any_accepted {
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
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::{ClusterState, Options};

    const SETUP: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: sluice}
spec: {controllerName: sluice.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: infra}
spec:
  gatewayClassName: sluice
  allowedListeners: {namespaces: {from: All}}
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
# As cert-manager's gateway-shim sees it: the Secret named here is created later.
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata:
  name: app
  namespace: team-a
  annotations: {cert-manager.io/cluster-issuer: letsencrypt}
spec:
  parentRef: {name: gw, namespace: infra}
  listeners:
    - name: https
      port: 443
      protocol: HTTPS
      hostname: app.example.com
      tls: {certificateRefs: [{name: app-tls}]}
"#;

    const SECRET: &str = r#"apiVersion: v1
kind: Secret
metadata: {name: app-tls, namespace: team-a}
type: kubernetes.io/tls
stringData:
  tls.crt: |
    -----BEGIN CERTIFICATE-----
    MIIBqzCCAVCgAwIBAgIUTXAZK2lhPuv9Jgzush+TjN6R7PQwCgYIKoZIzj0EAwIw
    FjEUMBIGA1UEAwwLZXhhbXBsZS5jb20wIBcNMjYxMjAyMDIzMjI3WhgPMjEyNjEx
    MDgwMjMyMjdaMBYxFDASBgNVBAMMC2V4YW1wbGUuY29tMFkwEwYHKoZIzj0CAQYI
    KoZIzj0DAQcDQgAE6uT3n5/SY4goXLAskId7zX45btqEOtWQ2M9smbAEMLra5QB+
    /MJdAYBaGEG8dFH1oXQsiw1lcVJDUKPEJkmQQ6N6MHgwHQYDVR0OBBYEFFCquWAy
    4ZujmK8aRodrS/OS9i4cMB8GA1UdIwQYMBaAFFCquWAy4ZujmK8aRodrS/OS9i4c
    MA8GA1UdEwEB/wQFMAMBAf8wJQYDVR0RBB4wHIILZXhhbXBsZS5jb22CDSouZXhh
    bXBsZS5jb20wCgYIKoZIzj0EAwIDSQAwRgIhAMZJybiHx6gkpZgDgh1KuHxhEkia
    gD+a3gb20s5oSnylAiEAsyWZgyfvZxAzZWWTBBZ5Cwh5y1/K8jKxDe8McafyO6A=
    -----END CERTIFICATE-----
  tls.key: |
    -----BEGIN PRIVATE KEY-----
    MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgtQh3N1CWNJhQgfG0
    v9NcURzqFJxh+5DfHAVqVc4krDWhRANCAATq5Pefn9JjiChcsCyQh3vNfjlu2oQ6
    1ZDYz2yZsAQwutrlAH78wl0BgFoYQbx0UfWhdCyLDWVxUkNQo8QmSZBD
    -----END PRIVATE KEY-----
"#;

    fn translate(yaml: &str) -> crate::Translation {
        let mut state = ClusterState::new();
        let report = state.load_yaml("t.yaml", yaml).unwrap();
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        let mut opts = Options::default();
        opts.gateway.listener_ports = Some(20000..=20099);
        crate::translate(&state, &opts)
    }

    fn condition(t: &crate::Translation, listener: &str, type_: &str) -> String {
        let set = &t.status.gateway.listener_sets[0];
        let l = set.listeners.iter().find(|l| l.name == listener).unwrap();
        let c = l.conditions.iter().find(|c| c.type_ == type_).unwrap();
        format!("{:?} {}", c.status, c.reason)
    }

    /// cert-manager creates the Secret a ListenerSet listener names after the set: the
    /// listener serves it from the next translation on, with no other change.
    #[test]
    fn a_listener_set_certificate_created_later_is_served() {
        let before = translate(SETUP);
        assert_eq!(
            condition(&before, "https", "ResolvedRefs"),
            "False InvalidCertificateRef"
        );
        let port = before
            .snapshot
            .listeners
            .iter()
            .find(|l| l.id == "infra/gw/443");
        assert!(
            port.is_none_or(|p| p.tls_certificates.is_empty()),
            "{port:?}"
        );

        let after = translate(&format!("{SETUP}---\n{SECRET}"));
        assert_eq!(
            condition(&after, "https", "ResolvedRefs"),
            "True ResolvedRefs"
        );
        assert_eq!(condition(&after, "https", "Programmed"), "True Programmed");
        let port = after
            .snapshot
            .listeners
            .iter()
            .find(|l| l.id == "infra/gw/443")
            .expect("the Gateway's port 443");
        let ids: Vec<&str> = port
            .tls_certificates
            .iter()
            .map(|c| c.id.as_str())
            .collect();
        assert_eq!(ids, ["team-a/ListenerSet/app/https"]);
        assert_eq!(port.tls_certificates[0].hosts, ["app.example.com"]);
        let gw = &after.status.gateway.gateways[0];
        assert_eq!(gw.certificates, ["team-a/ListenerSet/app/https"]);
        assert_eq!(gw.attached_listener_sets, Some(1));
    }

    /// A set none of whose listeners can serve (its only certificate is missing, or refused
    /// for want of a ReferenceGrant) is not accepted and not attached; once the listener can
    /// serve, it is.
    #[test]
    fn a_listener_set_with_no_listener_that_can_serve_is_not_accepted() {
        let set_conditions = |t: &crate::Translation| -> Vec<String> {
            t.status.gateway.listener_sets[0]
                .conditions
                .iter()
                .map(|c| format!("{} {:?} {}", c.type_, c.status, c.reason))
                .collect()
        };
        let before = translate(SETUP);
        assert_eq!(
            set_conditions(&before),
            [
                "Accepted False ListenersNotValid",
                "Programmed False ListenersNotValid"
            ]
        );
        assert_eq!(
            before.status.gateway.gateways[0].attached_listener_sets,
            Some(0)
        );
        let after = translate(&format!("{SETUP}---\n{SECRET}"));
        assert_eq!(
            set_conditions(&after),
            ["Accepted True Accepted", "Programmed True Programmed"]
        );
    }
}
