//! HTTPRoutes and GRPCRoutes: attached ([`super::attach`]), translated ([`super::http`]),
//! their status per parent, then ranked into priorities.

use std::collections::{BTreeMap, BTreeSet};

use sluice_crds::gateway::ParentReference;
use sluice_proto::v1;

use super::attach::attach;
use super::gateways::Gateways;
use super::http::{self, Entry, RouteInput, Translated};
use super::{
    ACCEPTED, Output, PARTIALLY_INVALID, PRIORITY_TOP, RouteParentStatus, RouteStatus, Slot, cond,
    reason,
};
use crate::ClusterState;
use crate::status::{Condition, ConditionStatus};

/// Translates every route attached to a Gateway of `gws`; their status goes into `out`,
/// their upstreams too; returns the routes, to be ranked by [`prioritise`].
pub(super) fn routes(
    state: &ClusterState,
    ctx: &http::Ctx<'_, '_>,
    taken: &BTreeMap<String, v1::Route>,
    gws: &mut Gateways,
    out: &mut Output,
) -> Vec<Entry> {
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
    let mut inputs: Vec<RouteInput<'_>> = Vec::new();
    for r in &state.http_routes {
        inputs.push(RouteInput::http(r));
    }
    for r in &state.grpc_routes {
        inputs.push(RouteInput::grpc(r));
    }
    inputs.sort_by(|a, b| (a.kind, a.ns, a.name).cmp(&(b.kind, b.ns, b.name)));
    let mut entries: Vec<Entry> = Vec::new();
    for input in &inputs {
        let Some(att) = attach(
            input,
            &mut gws.listeners,
            &gws.accepted,
            &gws.sets,
            &namespaces,
        ) else {
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
        ctx.tls_policies.start_route(&att.gateways);
        let mut translated = http::translate_rules(input, &att.schemes, ctx);
        ctx.tls_policies.end_route(att.any_attached);
        refuse_taken(&mut translated, taken);
        for (parent_ref, accepted) in att.parents {
            rs.parents
                .push(parent_status(parent_ref, accepted, &translated));
        }
        if att.any_attached {
            for e in translated.entries {
                add_to_sections(&e.route, &att.sections, &mut out.listeners);
                rs.routes.push(e.route.id.clone());
                for (ns, name) in &att.gateways {
                    if let Some(st) = gws.status.get_mut(&(ns.clone(), name.clone())) {
                        st.routes.push(e.route.id.clone());
                    }
                }
                entries.push(e);
            }
            out.upstreams.extend(translated.upstreams);
        }
        rs.routes.sort();
        out.status.routes.push(rs);
    }
    for l in &mut out.listeners {
        for s in &mut l.sections {
            s.routes.sort();
            s.routes.dedup();
        }
    }
    entries
}

/// Lists `route` in the `ListenerSection`s of the Gateway listeners it attached to, on each
/// per-Gateway port it names.
fn add_to_sections(
    route: &v1::Route,
    sections: &BTreeMap<Slot, BTreeSet<String>>,
    listeners: &mut [v1::Listener],
) {
    for (slot, names) in sections {
        let Slot::Listener(id, ..) = slot else {
            continue;
        };
        if !route.listeners.contains(id) {
            continue;
        }
        let Some(l) = listeners.iter_mut().find(|l| l.id == *id) else {
            continue;
        };
        for s in &mut l.sections {
            if names.contains(&s.name) {
                s.routes.push(route.id.clone());
            }
        }
    }
}

/// An ApisixRoute or Ingress holding one of the ids keeps it; the whole route is refused.
fn refuse_taken(translated: &mut Translated, taken: &BTreeMap<String, v1::Route>) {
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
}

/// The status of a route for one parent: its attachment verdict, unless no rule is valid
/// (`Accepted=False`) or some are not (`PartiallyInvalid`), then `ResolvedRefs`.
pub(super) fn parent_status(
    parent_ref: ParentReference,
    accepted: Condition,
    translated: &Translated,
) -> RouteParentStatus {
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
    RouteParentStatus {
        parent_ref,
        conditions,
    }
}

/// Priorities, best first, from [`PRIORITY_TOP`] down; the routes go into `out`.
pub(super) fn prioritise(mut entries: Vec<Entry>, out: &mut Output) {
    entries.sort_by(|a, b| b.rank.cmp(&a.rank));
    for (i, mut e) in entries.into_iter().enumerate() {
        let rank = i32::try_from(i).unwrap_or(i32::MAX);
        e.route.priority = PRIORITY_TOP.saturating_sub(rank);
        out.routes.push(e.route);
    }
}
