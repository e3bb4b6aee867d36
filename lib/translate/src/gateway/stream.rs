//! TLSRoutes, TCPRoutes and UDPRoutes → snapshot stream routes on per-Gateway ports.
//!
//! - They attach ([`super::attach`]) to TLS, TCP and UDP listeners (the only kinds those
//!   listeners take), which need per-Gateway ports ([`super::GatewayOptions::listener_ports`]).
//!   A TLSRoute's SNI hosts are the intersection of its hostnames with the listener's; none
//!   is `NoMatchingListenerHostname`.
//! - Each rule becomes one stream route `<ns>/<name>/{tls,tcp,udp}route-r<i>` (suffix `-l<k>`
//!   when the listeners it attached to differ in hosts or TLS mode) on those listeners, with
//!   the mode of its listener: Passthrough (SNI routing, bytes untouched) or Terminate (the
//!   listener's certificate), plain for TCP and UDP.
//! - backendRefs resolve as for HTTPRoute (core Services; another namespace needs a
//!   ReferenceGrant). Weights pick the backend per connection (UDP: per session); weight 0
//!   takes none. The share of an invalid backend, or every connection when none is valid,
//!   goes to `<ns>/<name>/<kind>-no-backend`, an upstream without endpoints: those
//!   connections are closed, as the Gateway API asks.
//! - One TCP or UDP listener serves one route: the oldest (creationTimestamp, then
//!   namespace/name) is bound; the others are `Accepted` and counted in `attachedRoutes`
//!   too, but get no traffic. On a TLS listener the oldest route keeps each SNI host.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sluice_crds::gateway::{ParentReference, StreamRouteRule};
use sluice_proto::v1;

use super::attach::attach;
use super::gateways::Gateways;
use super::http::{self, RouteInput, Translated};
use super::{Output, RESOLVED_REFS, RouteKind, RouteStatus, Slot, cond, created, reason};
use crate::ClusterState;

/// A TLSRoute, TCPRoute or UDPRoute.
struct Input<'a> {
    kind: RouteKind,
    meta: &'a ObjectMeta,
    parent_refs: &'a [ParentReference],
    hostnames: &'a [String],
    rules: &'a [StreamRouteRule],
}

/// Translates every TLSRoute, TCPRoute and UDPRoute attached to a Gateway of `gws`, oldest
/// first; their stream routes, upstreams and status go into `out`.
pub(super) fn routes(
    state: &ClusterState,
    ctx: &http::Ctx<'_, '_>,
    gws: &mut Gateways,
    out: &mut Output,
) {
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
    let mut inputs: Vec<Input<'_>> = Vec::new();
    for r in &state.tls_routes {
        inputs.push(Input {
            kind: RouteKind::TlsRoute,
            meta: &r.metadata,
            parent_refs: &r.spec.parent_refs,
            hostnames: &r.spec.hostnames,
            rules: &r.spec.rules,
        });
    }
    for r in &state.tcp_routes {
        inputs.push(Input {
            kind: RouteKind::TcpRoute,
            meta: &r.metadata,
            parent_refs: &r.spec.parent_refs,
            hostnames: &[],
            rules: &r.spec.rules,
        });
    }
    for r in &state.udp_routes {
        inputs.push(Input {
            kind: RouteKind::UdpRoute,
            meta: &r.metadata,
            parent_refs: &r.spec.parent_refs,
            hostnames: &[],
            rules: &r.spec.rules,
        });
    }
    inputs.sort_by(|a, b| {
        (created(a.meta), crate::key(a.meta), a.kind).cmp(&(
            created(b.meta),
            crate::key(b.meta),
            b.kind,
        ))
    });
    // (listener id, SNI host or "") → the route bound there.
    let mut bound: BTreeSet<(String, String)> = BTreeSet::new();
    let mut statuses = Vec::new();
    for input in &inputs {
        let route = RouteInput::stream(input.kind, input.meta, input.parent_refs, input.hostnames);
        let Some(att) = attach(
            &route,
            &mut gws.listeners,
            &gws.accepted,
            &gws.sets,
            &namespaces,
        ) else {
            continue;
        };
        let slots = claim(&att.schemes, &mut bound);
        let translated = translate(input, &route, &slots, ctx, out);
        let mut rs = RouteStatus {
            kind: input.kind,
            namespace: route.ns.to_owned(),
            name: route.name.to_owned(),
            generation: input.meta.generation,
            parents: Vec::new(),
            routes: Vec::new(),
        };
        for (parent_ref, accepted) in att.parents {
            rs.parents.push(super::routes::parent_status(
                parent_ref,
                accepted,
                &translated.status,
            ));
        }
        if att.any_attached {
            for r in &out.stream_routes[translated.first_route..] {
                rs.routes.push(r.id.clone());
                for gw in &att.gateways {
                    if let Some(st) = gws.status.get_mut(gw) {
                        st.routes.push(r.id.clone());
                    }
                }
            }
            // NB: a route bound nowhere (an older one holds its listeners) adds no upstream.
            if out.stream_routes.len() > translated.first_route {
                out.upstreams.extend(translated.upstreams);
            }
        } else {
            out.stream_routes.truncate(translated.first_route);
        }
        rs.routes.sort();
        statuses.push(rs);
    }
    out.status.routes.extend(statuses);
    out.status
        .routes
        .sort_by(|a, b| (a.kind, &a.namespace, &a.name).cmp(&(b.kind, &b.namespace, &b.name)));
}

/// The slots a route is bound on (listener id → (TLS mode, SNI hosts; empty = any)): those
/// of `schemes` whose listener, or SNI host on a TLS listener, no older route holds.
fn claim(
    schemes: &BTreeMap<Slot, Option<BTreeSet<String>>>,
    bound: &mut BTreeSet<(String, String)>,
) -> BTreeMap<String, (i32, Vec<String>)> {
    let mut out = BTreeMap::new();
    for (slot, hosts) in schemes {
        let Slot::Stream(id, tls) = slot else {
            continue;
        };
        let wanted: Vec<String> = match hosts {
            None => vec![String::new()],
            Some(h) => h.iter().cloned().collect(),
        };
        let free: Vec<String> = wanted
            .into_iter()
            .filter(|h| bound.insert((id.clone(), h.clone())))
            .collect();
        if free.is_empty() {
            continue;
        }
        let hosts = free.into_iter().filter(|h| !h.is_empty()).collect();
        out.insert(id.clone(), (*tls, hosts));
    }
    out
}

/// What a route's rules produced: its stream routes are `out.stream_routes[first_route..]`.
struct StreamTranslated {
    first_route: usize,
    upstreams: Vec<v1::Upstream>,
    status: Translated,
}

/// The stream routes of `input`'s rules on `slots`, pushed to `out.stream_routes`.
fn translate(
    input: &Input<'_>,
    route: &RouteInput<'_>,
    slots: &BTreeMap<String, (i32, Vec<String>)>,
    ctx: &http::Ctx<'_, '_>,
    out: &mut Output,
) -> StreamTranslated {
    let (ns, name) = (route.ns, route.name);
    let prefix = route.id_prefix();
    let no_backend_id = format!("{ns}/{name}/{prefix}-no-backend");
    let first_route = out.stream_routes.len();
    let mut upstreams = Vec::new();
    let mut unresolved: Vec<(&'static str, String)> = Vec::new();
    let mut no_backend_used = false;
    // Listeners grouped by (TLS mode, hosts).
    let mut groups: BTreeMap<(i32, &Vec<String>), Vec<String>> = BTreeMap::new();
    for (id, (tls, hosts)) in slots {
        groups.entry((*tls, hosts)).or_default().push(id.clone());
    }
    for (i, rule) in input.rules.iter().enumerate() {
        let field = format!("spec.rules[{i}]");
        let mut backends = Vec::new();
        let mut invalid_weight: u32 = 0;
        for (k, b) in rule.backend_refs.iter().enumerate() {
            let bf = format!("{field}.backendRefs[{k}]");
            let mut websocket = false;
            let up = ctx.backend(&b.backend, route, &bf, &mut unresolved, &mut websocket);
            let weight = u32::try_from(b.weight.unwrap_or(1)).unwrap_or(0);
            match up {
                Some(up) if weight > 0 => {
                    backends.push(v1::Backend {
                        upstream_id: up.id.clone(),
                        weight,
                        plugins: Vec::new(),
                    });
                    upstreams.push(up);
                }
                Some(_) => {}
                None => invalid_weight = invalid_weight.saturating_add(weight),
            }
        }
        let share = match (backends.is_empty(), invalid_weight) {
            (true, _) => Some(1),
            (false, 0) => None,
            (false, w) => Some(w),
        };
        if let Some(weight) = share {
            backends.push(v1::Backend {
                upstream_id: no_backend_id.clone(),
                weight,
                plugins: Vec::new(),
            });
            no_backend_used = true;
        }
        let many = groups.len() > 1;
        for (k, ((tls, hosts), listeners)) in groups.iter().enumerate() {
            let suffix = if many {
                format!("-l{k}")
            } else {
                String::new()
            };
            out.stream_routes.push(v1::StreamRoute {
                id: format!("{ns}/{name}/{prefix}-r{i}{suffix}"),
                source: format!("{} {ns}/{name}", input.kind.as_str()),
                listeners: listeners.clone(),
                hosts: (*hosts).clone(),
                tls: *tls,
                backends: backends.clone(),
                ..Default::default()
            });
        }
    }
    if no_backend_used {
        upstreams.push(v1::Upstream {
            id: no_backend_id,
            ..Default::default()
        });
    }
    let resolved_refs = match unresolved.first() {
        None => cond(
            RESOLVED_REFS,
            true,
            reason::RESOLVED_REFS,
            "All references resolved",
        ),
        Some((r, _)) => {
            let messages: Vec<String> = unresolved.iter().map(|(_, m)| m.clone()).collect();
            cond(RESOLVED_REFS, false, r, http::join_capped(&messages))
        }
    };
    StreamTranslated {
        first_route,
        upstreams,
        status: Translated {
            entries: Vec::new(),
            upstreams: Vec::new(),
            resolved_refs,
            rule_problems: String::new(),
            valid_rules: input.rules.len(),
            rule_count: input.rules.len(),
        },
    }
}
