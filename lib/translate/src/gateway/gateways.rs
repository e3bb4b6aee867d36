//! GatewayClasses and Gateways: which are Sluice's, their `Accepted` and `Programmed`
//! conditions, their listeners ([`super::listeners`]) and per-Gateway ports.

use std::collections::BTreeMap;

use sluice_crds::gateway::{Gateway, GatewayClass};

use super::listeners::{GatewayRef, Inputs, ListenerInfo, Served, allocate_ports, listeners_of};
use super::{
    ACCEPTED, CONFLICTED, GatewayClassStatus, GatewayOptions, GatewayStatus, ListenerStatus,
    Output, PROGRAMMED, RESOLVED_REFS, Slot, cond, created, reason, supported_features,
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
}

impl Gateways {
    /// The listener counts into the Gateway statuses, which go into `out`.
    pub(super) fn finish(mut self, out: &mut Output) {
        for l in &self.listeners {
            if let Some(st) = self.status.get_mut(&l.gateway)
                && let Some(ls) = st.listeners.get_mut(l.index)
            {
                ls.attached_routes = i32::try_from(l.attached.len()).unwrap_or(i32::MAX);
            }
        }
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
    for (age, gw) in sorted.into_iter().enumerate() {
        gateway(gw, age, inputs, classes, &mut served, &mut gws);
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
                name: l.name.clone(),
                hostname: l.hostname.clone().unwrap_or_default(),
                routes: Vec::new(),
            });
        }
    }
    for p in ports {
        p.sections.sort_by(|a, b| a.name.cmp(&b.name));
    }
}

/// One Gateway: its listeners, conditions and status into `gws`.
fn gateway(
    gw: &Gateway,
    age: usize,
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
    };
    let g = GatewayRef {
        gw,
        ns,
        name,
        age,
        // NB: a Gateway that cannot be accepted serves no certificate (nor claims hosts).
        serve: class_ok && gw.spec.addresses.is_empty(),
    };
    let mut infos = listeners_of(&g, inputs, served, &mut st);
    let any_usable = infos.iter().any(|l| l.usable);
    let (accepted, programmed) = conditions(gw, class_ok, &st, any_usable);
    let ok = accepted.status == ConditionStatus::True;
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
    gws.status.insert((ns.to_owned(), name.to_owned()), st);
    gws.listeners.extend(infos);
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

/// A Gateway's `Accepted` and `Programmed`.
fn conditions(
    gw: &Gateway,
    class_ok: bool,
    st: &GatewayStatus,
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
    if !gw.spec.addresses.is_empty() {
        let m = "spec.addresses: Sluice does not assign addresses (the dataplane Service has them)";
        return (
            cond(ACCEPTED, false, reason::UNSUPPORTED_ADDRESS, m),
            cond(PROGRAMMED, false, reason::INVALID, m),
        );
    }
    let programmed = if any_usable {
        cond(PROGRAMMED, true, reason::PROGRAMMED, "Programmed")
    } else {
        cond(PROGRAMMED, false, reason::INVALID, "no listener can serve")
    };
    (listeners_accepted(st), programmed)
}

/// `Accepted` of a Gateway by its listeners: accepted when some listener is; reason
/// ListenersNotValid when any listener is not accepted, conflicted or has unresolved
/// references.
fn listeners_accepted(st: &GatewayStatus) -> Condition {
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
