//! The Gateway API status writer (leader only): translation's [`GatewayStatusReport`] plus
//! what the dataplanes serve, written with server-side apply under the field manager
//! [`FIELD_MANAGER`].
//!
//! - `GatewayClass.status`: `Accepted`, `supportedFeatures[].name`.
//! - `Gateway.status`: `Accepted`, `Programmed`, `listeners[]` (name, supportedKinds,
//!   attachedRoutes, conditions), `attachedListenerSets` and, with `--ingress-status-address` or
//!   `--ingress-publish-service`, `addresses[]` (the same address Ingresses get).
//! - `ListenerSet.status`: `Accepted`, `Programmed` (its Gateway's verdict: its listeners
//!   serve on the Gateway's ports), `listeners[]` as a Gateway's.
//! - `HTTPRoute` / `GRPCRoute` / `TLSRoute` / `TCPRoute` / `UDPRoute` `status.parents[]`: the entries whose `controllerName` is ours
//!   (`--gateway-controller-name`). Entries of other controllers are kept as they are: the
//!   list is atomic, so the write carries them unchanged, with the route's
//!   `resourceVersion` so a concurrent write by another controller is never overwritten
//!   (the write is retried). A route that no longer has a parent of ours loses our entries.
//!
//! - `BackendTLSPolicy` `status.ancestors[]`: our entries (one per Gateway whose routes use
//!   the policy's targets), other controllers' kept, with the same `resourceVersion` guard
//!   as routes; a policy no longer used by our routes loses our entries.
//!
//! `Programmed` of a Gateway and of its listeners: see [`super::programmed`]. Every condition carries `observedGeneration`;
//! `lastTransitionTime` is kept while a condition's status does not change; an object whose
//! status already says what we would write is not patched.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::IngressLoadBalancerIngress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use serde::Serialize;
use serde_json::json;
use sluice_crds::gateway::{
    BackendTLSPolicy, GRPCRoute, Gateway, GatewayClass, GatewayStatusAddress, HTTPRoute,
    ListenerSet, ListenerStatus, PolicyAncestorStatus, PolicyStatus, RouteParentStatus,
    SupportedFeature, TCPRoute, TLSRoute, UDPRoute,
};
use sluice_translate::gateway::{
    self as gw, BackendTlsPolicyStatus, GatewayClassStatus, GatewayStatus, GatewayStatusReport,
    ListenerSetStatus, RouteKind, RouteStatus,
};
use sluice_translate::status::ConditionStatus;

use super::address::{Publish, published};
use super::programmed::{self, Dataplanes};
use super::writer::{Family, Key};
use super::{Desired, conditions_to_write, from_translation};
use crate::context::Context;
use crate::metrics::Metrics;
use crate::rebuild::Rebuilt;
use crate::watch::Stores;

/// Field manager of the Gateway API status writes.
pub const FIELD_MANAGER: &str = "sluice-gateway-controller";
/// API version of the Gateway API kinds written.
const API_VERSION: &str = "gateway.networking.k8s.io/v1";

/// `GatewayClass.status` to write.
pub fn gateway_class_status(
    want: &GatewayClassStatus,
    existing: Option<&sluice_crds::gateway::GatewayClassStatus>,
    now: Timestamp,
) -> sluice_crds::gateway::GatewayClassStatus {
    let desired: Vec<Desired> = want.conditions.iter().map(from_translation).collect();
    let old = existing
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    sluice_crds::gateway::GatewayClassStatus {
        conditions: conditions_to_write(&desired, want.generation, old, now),
        supported_features: want
            .supported_features
            .iter()
            .map(|name| SupportedFeature { name: name.clone() })
            .collect(),
    }
}

/// `Gateway.status` to write; `since` is the first version serving the Gateway as it is.
pub fn gateway_status(
    want: &GatewayStatus,
    since: u64,
    dataplanes: &Dataplanes,
    addresses: &[GatewayStatusAddress],
    existing: Option<&sluice_crds::gateway::GatewayStatus>,
    now: Timestamp,
) -> sluice_crds::gateway::GatewayStatus {
    let fleet = programmed::gateway(since, dataplanes);
    let old = existing
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let old_listeners = existing.map(|s| s.listeners.as_slice()).unwrap_or_default();
    let listeners =
        listeners_to_write(&want.listeners, want.generation, &fleet, old_listeners, now);
    let accepted = want
        .conditions
        .iter()
        .any(|c| c.type_ == gw::ACCEPTED && c.status == ConditionStatus::True);
    let mut conditions = programmed::gateway_conditions(&want.conditions, &fleet);
    if let Some(m) = missing_static_address(&want.static_addresses, addresses) {
        for c in conditions.iter_mut().filter(|c| c.type_ == gw::PROGRAMMED) {
            *c = Desired {
                type_: gw::PROGRAMMED.into(),
                status: "False",
                reason: gw::reason::ADDRESS_NOT_USABLE.into(),
                message: super::truncate(m.clone()),
            };
        }
    }
    sluice_crds::gateway::GatewayStatus {
        addresses: if accepted {
            addresses.to_vec()
        } else {
            Vec::new()
        },
        conditions: conditions_to_write(&conditions, want.generation, old, now),
        listeners,
        attached_listener_sets: want.attached_listener_sets,
    }
}

/// Why a Gateway is not `Programmed` for its addresses: a static address (`spec.addresses`)
/// its Service does not have (yet: the API server refused it, or a load balancer has not
/// assigned it).
fn missing_static_address(wanted: &[String], published: &[GatewayStatusAddress]) -> Option<String> {
    let same =
        |a: &str, b: &str| match (a.parse::<std::net::IpAddr>(), b.parse::<std::net::IpAddr>()) {
            (Ok(a), Ok(b)) => a == b,
            _ => a == b,
        };
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|w| !published.iter().any(|p| same(w, &p.value)))
        .map(String::as_str)
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "spec.addresses {}: not an address of the Gateway's Service (the API server \
             refused it, or the load balancer has not assigned it; see the controller's log)",
            missing.join(", ")
        )
    })
}

/// `listeners[]` of a Gateway or ListenerSet: translation's, with `Programmed=True` replaced
/// by the dataplanes' verdict `fleet`.
fn listeners_to_write(
    want: &[gw::ListenerStatus],
    generation: Option<i64>,
    fleet: &super::Desired,
    existing: &[ListenerStatus],
    now: Timestamp,
) -> Vec<ListenerStatus> {
    want.iter()
        .map(|l| {
            let old_listener = existing
                .iter()
                .find(|o| o.name == l.name)
                .map(|o| o.conditions.as_slice())
                .unwrap_or_default();
            ListenerStatus {
                name: l.name.clone(),
                supported_kinds: l.supported_kinds.clone(),
                attached_routes: l.attached_routes,
                conditions: conditions_to_write(
                    &programmed::gateway_conditions(&l.conditions, fleet),
                    generation,
                    old_listener,
                    now,
                ),
            }
        })
        .collect()
}

/// `ListenerSet.status` to write; `since` is the first version serving its Gateway as it is
/// (the set's listeners and certificates are part of it).
pub fn listener_set_status(
    want: &ListenerSetStatus,
    since: u64,
    dataplanes: &Dataplanes,
    existing: Option<&sluice_crds::gateway::ListenerSetStatus>,
    now: Timestamp,
) -> sluice_crds::gateway::ListenerSetStatus {
    let fleet = programmed::gateway(since, dataplanes);
    let old = existing
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let old_listeners = existing.map(|s| s.listeners.as_slice()).unwrap_or_default();
    sluice_crds::gateway::ListenerSetStatus {
        conditions: conditions_to_write(
            &programmed::gateway_conditions(&want.conditions, &fleet),
            want.generation,
            old,
            now,
        ),
        listeners: listeners_to_write(&want.listeners, want.generation, &fleet, old_listeners, now),
    }
}

/// `status.parents[]` to write: other controllers' entries as they are (in their order),
/// then ours in spec order.
pub fn route_parents(
    want: &RouteStatus,
    controller_name: &str,
    existing: &[RouteParentStatus],
    now: Timestamp,
) -> Vec<RouteParentStatus> {
    let mut out: Vec<RouteParentStatus> = existing
        .iter()
        .filter(|p| p.controller_name != controller_name)
        .cloned()
        .collect();
    for p in &want.parents {
        let desired: Vec<Desired> = p.conditions.iter().map(from_translation).collect();
        let old = existing
            .iter()
            .find(|e| e.controller_name == controller_name && e.parent_ref == p.parent_ref)
            .map(|e| e.conditions.as_slice())
            .unwrap_or_default();
        out.push(RouteParentStatus {
            parent_ref: p.parent_ref.clone(),
            controller_name: controller_name.to_owned(),
            conditions: conditions_to_write(&desired, want.generation, old, now),
        });
    }
    out
}

/// `status.ancestors[]` of a BackendTLSPolicy: other controllers' entries as they are, then
/// ours by Gateway.
pub fn policy_ancestors(
    want: &BackendTlsPolicyStatus,
    existing: &[PolicyAncestorStatus],
    now: Timestamp,
) -> Vec<PolicyAncestorStatus> {
    let ours = &want.controller_name;
    let mut out: Vec<PolicyAncestorStatus> = existing
        .iter()
        .filter(|a| &a.controller_name != ours)
        .cloned()
        .collect();
    for a in &want.ancestors {
        let desired: Vec<Desired> = a.conditions.iter().map(from_translation).collect();
        let old = existing
            .iter()
            .find(|e| &e.controller_name == ours && e.ancestor_ref == a.ancestor_ref)
            .map(|e| e.conditions.as_slice())
            .unwrap_or_default();
        out.push(PolicyAncestorStatus {
            ancestor_ref: a.ancestor_ref.clone(),
            controller_name: ours.clone(),
            conditions: conditions_to_write(&desired, want.generation, old, now),
        });
    }
    out
}

/// Gateway addresses from the Ingress publish setting: IPs as `IPAddress`, names as
/// `Hostname`.
pub fn addresses(points: &[IngressLoadBalancerIngress]) -> Vec<GatewayStatusAddress> {
    points
        .iter()
        .filter_map(|p| match (&p.ip, &p.hostname) {
            (Some(ip), _) => Some(GatewayStatusAddress {
                type_: Some("IPAddress".to_owned()),
                value: ip.clone(),
            }),
            (None, Some(h)) => Some(GatewayStatusAddress {
                type_: Some("Hostname".to_owned()),
                value: h.clone(),
            }),
            (None, None) => None,
        })
        .collect()
}

/// One status write (the object is named by its [`Key`]). Compared with the last write by
/// its status alone.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Write {
    /// `GatewayClass.status`.
    Class(sluice_crds::gateway::GatewayClassStatus),
    /// `Gateway.status`.
    Gateway(sluice_crds::gateway::GatewayStatus),
    /// `ListenerSet.status`.
    ListenerSet(sluice_crds::gateway::ListenerSetStatus),
    /// A route's `status.parents`.
    Route {
        /// The route's kind.
        #[serde(skip)]
        kind: RouteKind,
        /// The route's `resourceVersion` the write is based on.
        #[serde(skip)]
        resource_version: Option<String>,
        /// The whole `status`.
        status: sluice_crds::gateway::RouteStatus,
    },
    /// A BackendTLSPolicy's `status.ancestors`.
    Policy {
        /// The policy's `resourceVersion` the write is based on.
        #[serde(skip)]
        resource_version: Option<String>,
        /// The whole `status`.
        status: PolicyStatus,
    },
}

impl Write {
    async fn apply(&self, client: &kube::Client, key: &Key) -> Result<(), kube::Error> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let (namespace, name) = (&key.namespace, &key.name);
        match self {
            Write::Class(status) => {
                let patch =
                    json!({"apiVersion": API_VERSION, "kind": "GatewayClass", "status": status});
                kube::Api::<GatewayClass>::all(client.clone())
                    .patch_status(name, &params, &Patch::Apply(&patch))
                    .await?;
            }
            Write::Gateway(status) => {
                let patch = json!({"apiVersion": API_VERSION, "kind": "Gateway", "status": status});
                kube::Api::<Gateway>::namespaced(client.clone(), namespace)
                    .patch_status(name, &params, &Patch::Apply(&patch))
                    .await?;
            }
            Write::ListenerSet(status) => {
                let patch =
                    json!({"apiVersion": API_VERSION, "kind": "ListenerSet", "status": status});
                kube::Api::<ListenerSet>::namespaced(client.clone(), namespace)
                    .patch_status(name, &params, &Patch::Apply(&patch))
                    .await?;
            }
            Write::Route {
                kind,
                resource_version,
                status,
            } => {
                // NB: `parents` is an atomic list holding other controllers' entries too:
                // the resourceVersion makes a concurrent change fail (409) instead of
                // being overwritten.
                let patch = json!({
                    "apiVersion": API_VERSION,
                    "kind": kind.as_str(),
                    "metadata": {"resourceVersion": resource_version},
                    // NB: `parents` is required: written even when empty (our last entry
                    // gone), which `RouteStatus` would leave out.
                    "status": {"parents": status.parents},
                });
                match kind {
                    RouteKind::HttpRoute => {
                        kube::Api::<HTTPRoute>::namespaced(client.clone(), namespace)
                            .patch_status(name, &params, &Patch::Apply(&patch))
                            .await?;
                    }
                    RouteKind::GrpcRoute => {
                        kube::Api::<GRPCRoute>::namespaced(client.clone(), namespace)
                            .patch_status(name, &params, &Patch::Apply(&patch))
                            .await?;
                    }
                    RouteKind::TlsRoute => {
                        kube::Api::<TLSRoute>::namespaced(client.clone(), namespace)
                            .patch_status(name, &params, &Patch::Apply(&patch))
                            .await?;
                    }
                    RouteKind::TcpRoute => {
                        kube::Api::<TCPRoute>::namespaced(client.clone(), namespace)
                            .patch_status(name, &params, &Patch::Apply(&patch))
                            .await?;
                    }
                    RouteKind::UdpRoute => {
                        kube::Api::<UDPRoute>::namespaced(client.clone(), namespace)
                            .patch_status(name, &params, &Patch::Apply(&patch))
                            .await?;
                    }
                }
            }
            Write::Policy {
                resource_version,
                status,
            } => {
                // NB: `ancestors` is atomic and shared with other controllers, as a route's
                // `parents` are.
                let patch = json!({
                    "apiVersion": API_VERSION,
                    "kind": "BackendTLSPolicy",
                    "metadata": {"resourceVersion": resource_version},
                    "status": {"ancestors": status.ancestors},
                });
                kube::Api::<BackendTLSPolicy>::namespaced(client.clone(), namespace)
                    .patch_status(name, &params, &Patch::Apply(&patch))
                    .await?;
            }
        }
        Ok(())
    }
}

/// The Gateway API objects as they are now (the stores; a fake in tests).
pub trait Current {
    /// A GatewayClass.
    fn gateway_class(&self, name: &str) -> Option<Arc<GatewayClass>>;
    /// A Gateway.
    fn gateway(&self, namespace: &str, name: &str) -> Option<Arc<Gateway>>;
    /// A ListenerSet. Default: none.
    fn listener_set(&self, _namespace: &str, _name: &str) -> Option<Arc<ListenerSet>> {
        None
    }
    /// An HTTPRoute.
    fn http_route(&self, namespace: &str, name: &str) -> Option<Arc<HTTPRoute>>;
    /// A GRPCRoute.
    fn grpc_route(&self, namespace: &str, name: &str) -> Option<Arc<GRPCRoute>>;
    /// Every HTTPRoute.
    fn http_routes(&self) -> Vec<Arc<HTTPRoute>>;
    /// Every GRPCRoute.
    fn grpc_routes(&self) -> Vec<Arc<GRPCRoute>>;
    /// A BackendTLSPolicy.
    fn backend_tls_policy(&self, _namespace: &str, _name: &str) -> Option<Arc<BackendTLSPolicy>> {
        None
    }
    /// Every BackendTLSPolicy.
    fn backend_tls_policies(&self) -> Vec<Arc<BackendTLSPolicy>> {
        Vec::new()
    }
    /// Every TLSRoute, TCPRoute or UDPRoute of `kind`: metadata and status. Default: none.
    fn stream_routes(
        &self,
        _kind: RouteKind,
    ) -> Vec<(ObjectMeta, Option<sluice_crds::gateway::RouteStatus>)> {
        Vec::new()
    }
}

impl Current for Stores {
    fn gateway_class(&self, name: &str) -> Option<Arc<GatewayClass>> {
        Stores::gateway_class(self, name)
    }
    fn gateway(&self, namespace: &str, name: &str) -> Option<Arc<Gateway>> {
        Stores::gateway(self, namespace, name)
    }
    fn listener_set(&self, namespace: &str, name: &str) -> Option<Arc<ListenerSet>> {
        Stores::listener_set(self, namespace, name)
    }
    fn http_route(&self, namespace: &str, name: &str) -> Option<Arc<HTTPRoute>> {
        Stores::http_route(self, namespace, name)
    }
    fn grpc_route(&self, namespace: &str, name: &str) -> Option<Arc<GRPCRoute>> {
        Stores::grpc_route(self, namespace, name)
    }
    fn http_routes(&self) -> Vec<Arc<HTTPRoute>> {
        Stores::http_routes(self)
    }
    fn grpc_routes(&self) -> Vec<Arc<GRPCRoute>> {
        Stores::grpc_routes(self)
    }
    fn backend_tls_policy(&self, namespace: &str, name: &str) -> Option<Arc<BackendTLSPolicy>> {
        Stores::backend_tls_policy(self, namespace, name)
    }
    fn backend_tls_policies(&self) -> Vec<Arc<BackendTLSPolicy>> {
        Stores::backend_tls_policies(self)
    }
    fn stream_routes(
        &self,
        kind: RouteKind,
    ) -> Vec<(ObjectMeta, Option<sluice_crds::gateway::RouteStatus>)> {
        Stores::stream_routes(self, kind.as_str())
    }
}

/// A TLSRoute, TCPRoute or UDPRoute as `stores` have it: (status, resourceVersion).
fn stream_route(
    stores: &impl Current,
    kind: RouteKind,
    namespace: &str,
    name: &str,
) -> Option<(Option<sluice_crds::gateway::RouteStatus>, Option<String>)> {
    stores
        .stream_routes(kind)
        .into_iter()
        .find(|(m, _)| m.namespace.as_deref() == Some(namespace) && m.name.as_deref() == Some(name))
        .map(|(m, s)| (s, m.resource_version))
}

/// Every write that would change an object's status now; `since` per Gateway is the first
/// version serving it as it is, `addrs` its published addresses.
pub fn desired(
    report: &GatewayStatusReport,
    since: &BTreeMap<(String, String), u64>,
    dataplanes: &Dataplanes,
    addrs: &HashMap<(String, String), Vec<GatewayStatusAddress>>,
    stores: &impl Current,
    now: Timestamp,
) -> Vec<(Key, Write)> {
    let mut out = Vec::new();
    for c in &report.gateway_classes {
        let Some(obj) = stores.gateway_class(&c.name) else {
            continue;
        };
        let want = gateway_class_status(c, obj.status.as_ref(), now);
        if obj.status.as_ref() != Some(&want) {
            out.push((Key::new("GatewayClass", "", &c.name), Write::Class(want)));
        }
    }
    for g in &report.gateways {
        let Some(obj) = stores.gateway(&g.namespace, &g.name) else {
            continue;
        };
        let key = (g.namespace.clone(), g.name.clone());
        let v = since.get(&key).copied().unwrap_or_default();
        let a = addrs.get(&key).map(Vec::as_slice).unwrap_or_default();
        let want = gateway_status(g, v, dataplanes, a, obj.status.as_ref(), now);
        if obj.status.as_ref() != Some(&want) {
            out.push((
                Key::new("Gateway", &g.namespace, &g.name),
                Write::Gateway(want),
            ));
        }
    }
    for s in &report.listener_sets {
        let Some(obj) = stores.listener_set(&s.namespace, &s.name) else {
            continue;
        };
        let key = (s.gateway_namespace.clone(), s.gateway_name.clone());
        let v = since.get(&key).copied().unwrap_or_default();
        let want = listener_set_status(s, v, dataplanes, obj.status.as_ref(), now);
        if obj.status.as_ref() != Some(&want) {
            out.push((
                Key::new("ListenerSet", &s.namespace, &s.name),
                Write::ListenerSet(want),
            ));
        }
    }
    out.extend(
        report
            .routes
            .iter()
            .filter_map(|r| route_write(r, &report.controller_name, stores, now)),
    );
    out.extend(stale_routes(report, stores));
    out.extend(policy_writes(report, stores, now));
    out
}

/// The writes of BackendTLSPolicy statuses: reported ones when they would change, and our
/// entries removed from policies no longer reported.
fn policy_writes(
    report: &GatewayStatusReport,
    stores: &impl Current,
    now: Timestamp,
) -> Vec<(Key, Write)> {
    let mut out = Vec::new();
    for p in &report.backend_tls_policies {
        let Some(obj) = stores.backend_tls_policy(&p.namespace, &p.name) else {
            continue;
        };
        let existing = obj
            .status
            .as_ref()
            .map(|s| s.ancestors.as_slice())
            .unwrap_or_default();
        let want = PolicyStatus {
            ancestors: policy_ancestors(p, existing, now),
        };
        if obj.status.as_ref() != Some(&want) {
            out.push((
                Key::new("BackendTLSPolicy", &p.namespace, &p.name),
                Write::Policy {
                    resource_version: obj.metadata.resource_version.clone(),
                    status: want,
                },
            ));
        }
    }
    for obj in stores.backend_tls_policies() {
        let namespace = obj.metadata.namespace.clone().unwrap_or_default();
        let name = obj.metadata.name.clone().unwrap_or_default();
        let ancestors = obj
            .status
            .as_ref()
            .map(|s| s.ancestors.as_slice())
            .unwrap_or_default();
        let ours = |a: &PolicyAncestorStatus| a.controller_name == report.controller_name;
        let reported = report
            .backend_tls_policies
            .iter()
            .any(|p| p.namespace == namespace && p.name == name);
        if reported || !ancestors.iter().any(ours) {
            continue;
        }
        let kept = ancestors.iter().filter(|a| !ours(a)).cloned().collect();
        out.push((
            Key::new("BackendTLSPolicy", &namespace, &name),
            Write::Policy {
                resource_version: obj.metadata.resource_version.clone(),
                status: PolicyStatus { ancestors: kept },
            },
        ));
    }
    out
}

/// The write of a reported route's `status.parents`, when it would change them.
fn route_write(
    r: &RouteStatus,
    controller_name: &str,
    stores: &impl Current,
    now: Timestamp,
) -> Option<(Key, Write)> {
    let (current, resource_version) = match r.kind {
        RouteKind::HttpRoute => stores
            .http_route(&r.namespace, &r.name)
            .map(|o| (o.status.clone(), o.metadata.resource_version.clone()))?,
        RouteKind::GrpcRoute => stores
            .grpc_route(&r.namespace, &r.name)
            .map(|o| (o.status.clone(), o.metadata.resource_version.clone()))?,
        RouteKind::TlsRoute | RouteKind::TcpRoute | RouteKind::UdpRoute => {
            stream_route(stores, r.kind, &r.namespace, &r.name)?
        }
    };
    let existing = current
        .as_ref()
        .map(|s| s.parents.as_slice())
        .unwrap_or_default();
    let want = sluice_crds::gateway::RouteStatus {
        parents: route_parents(r, controller_name, existing, now),
    };
    (current.as_ref() != Some(&want)).then(|| {
        (
            Key::new(r.kind.as_str(), &r.namespace, &r.name),
            Write::Route {
                kind: r.kind,
                resource_version,
                status: want,
            },
        )
    })
}

/// Routes with none of our parents left (parentRef removed, Gateway deleted or of another
/// class): our old entries go, other controllers' stay.
fn stale_routes(report: &GatewayStatusReport, stores: &impl Current) -> Vec<(Key, Write)> {
    let ours = |s: &Option<sluice_crds::gateway::RouteStatus>| {
        s.as_ref().is_some_and(|s| {
            s.parents
                .iter()
                .any(|p| p.controller_name == report.controller_name)
        })
    };
    let stale = stores
        .http_routes()
        .into_iter()
        .filter(|r| ours(&r.status))
        .map(|r| (RouteKind::HttpRoute, r.metadata.clone(), r.status.clone()))
        .chain(
            stores
                .grpc_routes()
                .into_iter()
                .filter(|r| ours(&r.status))
                .map(|r| (RouteKind::GrpcRoute, r.metadata.clone(), r.status.clone())),
        )
        .chain(
            [
                RouteKind::TlsRoute,
                RouteKind::TcpRoute,
                RouteKind::UdpRoute,
            ]
            .into_iter()
            .flat_map(|kind| {
                stores
                    .stream_routes(kind)
                    .into_iter()
                    .filter(|(_, s)| ours(s))
                    .map(move |(m, s)| (kind, m, s))
            }),
        );
    let mut out = Vec::new();
    for (kind, meta, status) in stale {
        let namespace = meta.namespace.unwrap_or_default();
        let name = meta.name.unwrap_or_default();
        let reported = report
            .routes
            .iter()
            .any(|r| r.kind == kind && r.namespace == namespace && r.name == name);
        if reported {
            continue;
        }
        let parents = status
            .map(|s| s.parents)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.controller_name != report.controller_name)
            .collect();
        out.push((
            Key::new(kind.as_str(), &namespace, &name),
            Write::Route {
                kind,
                resource_version: meta.resource_version,
                status: sluice_crds::gateway::RouteStatus { parents },
            },
        ));
    }
    out
}

/// The Gateway API status family of the writer.
#[derive(Debug, Clone, Default)]
pub struct GatewayApi {
    /// Where Gateway addresses come from without Gateway Services (the Ingress setting).
    pub publish: Option<Publish>,
    /// One Service per Gateway: each Gateway's address is its own Service's.
    pub services: Option<super::gateway_services::GatewayServices>,
}

impl GatewayApi {
    /// Each reported Gateway's published addresses.
    async fn addresses(
        &self,
        ctx: &Context,
        report: &GatewayStatusReport,
    ) -> HashMap<(String, String), Vec<GatewayStatusAddress>> {
        let mut addrs = HashMap::new();
        if let Some(cfg) = &self.services {
            // Each Gateway's own Service.
            for g in &report.gateways {
                let svc = super::gateway_services::service_name(&g.namespace, &g.name);
                let p = Publish::Service {
                    namespace: cfg.service_namespace(&g.namespace).to_owned(),
                    name: svc,
                };
                let a = published(&ctx.client, &p, &ctx.stores).await;
                addrs.insert(
                    (g.namespace.clone(), g.name.clone()),
                    addresses(&a.unwrap_or_default()),
                );
            }
        } else if let Some(p) = &self.publish
            && !report.gateways.is_empty()
        {
            let a = published(&ctx.client, p, &ctx.stores).await;
            let a = addresses(&a.unwrap_or_default());
            for g in &report.gateways {
                addrs.insert((g.namespace.clone(), g.name.clone()), a.clone());
            }
        }
        addrs
    }
}

impl Family for GatewayApi {
    type Write = Write;
    const NAME: &'static str = "gateway-api";
    const FLEET: bool = true;

    async fn plan(
        &self,
        ctx: &Context,
        rebuilt: &Rebuilt,
    ) -> Result<Vec<(Key, Write)>, kube::Error> {
        if !ctx.stores.gateway_api() {
            return Ok(Vec::new());
        }
        let report = &rebuilt.gateway.report;
        let dataplanes = Dataplanes::now(ctx);
        let addrs = self.addresses(ctx, report).await;
        let since = &rebuilt.gateway.since;
        Ok(desired(
            report,
            since,
            &dataplanes,
            &addrs,
            &ctx.stores,
            Timestamp::now(),
        ))
    }

    async fn apply(&self, ctx: &Context, key: &Key, w: &Write) -> Result<(), kube::Error> {
        w.apply(&ctx.client, key).await
    }

    fn count(&self, metrics: &Metrics) {
        metrics.status_writes.inc();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A Gateway with static addresses is Programmed only once its Service has each of
    /// them (compared as IPs, so `fd00::c9` and `fd00:0::c9` are one).
    #[test]
    fn static_addresses_must_be_the_services() {
        let a = |v: &str| GatewayStatusAddress {
            type_: Some("IPAddress".into()),
            value: v.into(),
        };
        let want = vec!["10.96.0.200".to_owned(), "fd00::c9".to_owned()];
        assert_eq!(missing_static_address(&[], &[a("10.0.0.1")]), None);
        assert_eq!(
            missing_static_address(&want, &[a("10.96.0.200"), a("fd00:0::c9")]),
            None
        );
        let m = missing_static_address(&want, &[a("10.96.0.17")]).unwrap();
        assert!(m.contains("10.96.0.200, fd00::c9"), "{m}");
        assert!(missing_static_address(&want, &[]).is_some());
    }
    use crate::fleet::Counted;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use sluice_crds::gateway::ParentReference;
    use sluice_translate::gateway::RouteParentStatus as WantParent;

    fn tc(type_: &str, ok: bool, reason: &str) -> sluice_translate::Condition {
        sluice_translate::Condition {
            type_: type_.into(),
            status: if ok {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            },
            reason: reason.into(),
            message: String::new(),
        }
    }

    fn dp(serving: Option<u64>) -> Dataplanes {
        Dataplanes {
            counted: vec![Counted {
                id: "dp-a".into(),
                serving,
                reported: serving,
                seen: true,
                rejected: None,
            }],
            why_none: String::new(),
        }
    }

    fn gateway(accepted: bool) -> GatewayStatus {
        GatewayStatus {
            namespace: "ns".into(),
            name: "gw".into(),
            generation: Some(4),
            conditions: vec![
                tc(gw::ACCEPTED, accepted, "Accepted"),
                tc(gw::PROGRAMMED, accepted, "Programmed"),
            ],
            listeners: vec![gw::ListenerStatus {
                name: "http".into(),
                supported_kinds: vec![],
                attached_routes: 1,
                conditions: vec![
                    tc(gw::ACCEPTED, true, "Accepted"),
                    tc(gw::PROGRAMMED, true, "Programmed"),
                ],
            }],
            routes: vec!["ns/r/httproute-r0-m0".into()],
            certificates: vec![],
            attached_listener_sets: None,
            static_addresses: vec![],
            infrastructure_labels: BTreeMap::new(),
            infrastructure_annotations: BTreeMap::new(),
        }
    }

    fn cond<'a>(c: &'a [Condition], t: &str) -> &'a Condition {
        c.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn gateway_is_programmed_only_once_the_dataplanes_serve_its_version() {
        let t0 = Timestamp::from_second(1_700_000_000).unwrap();
        let t1 = Timestamp::from_second(1_700_000_100).unwrap();
        let g = gateway(true);
        let pending = gateway_status(&g, 7, &dp(Some(6)), &[], None, t0);
        let p = cond(&pending.conditions, gw::PROGRAMMED);
        assert_eq!((p.status.as_str(), p.reason.as_str()), ("False", "Pending"));
        assert_eq!(p.observed_generation, Some(4));
        let lp = cond(&pending.listeners[0].conditions, gw::PROGRAMMED);
        assert_eq!(lp.reason, "Pending");
        assert_eq!(pending.listeners[0].attached_routes, 1);

        let done = gateway_status(&g, 7, &dp(Some(7)), &[], Some(&pending), t1);
        let p = cond(&done.conditions, gw::PROGRAMMED);
        assert_eq!(
            (p.status.as_str(), p.reason.as_str()),
            ("True", "Programmed")
        );
        assert_eq!(p.last_transition_time, Time(t1));
        let a = cond(&done.conditions, gw::ACCEPTED);
        assert_eq!(a.last_transition_time, Time(t0), "Accepted did not change");
        // The same again: nothing changes, so nothing is written.
        assert_eq!(
            gateway_status(&g, 7, &dp(Some(9)), &[], Some(&done), t1),
            done
        );
    }

    /// A Gateway with a static address is `Programmed` only once its Service has it, even
    /// when the dataplanes serve its version; `status.addresses` are the Service's.
    #[test]
    fn a_static_address_gates_programmed() {
        let t0 = Timestamp::from_second(1_700_000_000).unwrap();
        let mut g = gateway(true);
        g.static_addresses = vec!["10.96.0.200".into()];
        let addr = |v: &str| GatewayStatusAddress {
            type_: Some("IPAddress".into()),
            value: v.into(),
        };
        let other = gateway_status(&g, 7, &dp(Some(7)), &[addr("10.96.0.17")], None, t0);
        let p = cond(&other.conditions, gw::PROGRAMMED);
        assert_eq!(
            (p.status.as_str(), p.reason.as_str()),
            ("False", "AddressNotUsable")
        );
        assert!(p.message.contains("10.96.0.200"), "{}", p.message);
        let done = gateway_status(&g, 7, &dp(Some(7)), &[addr("10.96.0.200")], None, t0);
        let p = cond(&done.conditions, gw::PROGRAMMED);
        assert_eq!(p.status, "True");
        assert_eq!(done.addresses, vec![addr("10.96.0.200")]);
    }

    /// A ListenerSet is programmed when its Gateway's version is served (its listeners are
    /// the Gateway's); a refused set keeps translation's verdict; the Gateway's count is
    /// written.
    #[test]
    fn a_listener_set_follows_its_gateways_programmed_verdict() {
        let t0 = Timestamp::from_second(1_700_000_000).unwrap();
        let set = |accepted: bool, reason: &str| ListenerSetStatus {
            namespace: "team".into(),
            name: "apps".into(),
            generation: Some(2),
            gateway_namespace: "ns".into(),
            gateway_name: "gw".into(),
            conditions: vec![
                tc(gw::ACCEPTED, accepted, reason),
                tc(gw::PROGRAMMED, accepted, reason),
            ],
            listeners: vec![gw::ListenerStatus {
                name: "http".into(),
                supported_kinds: vec![],
                attached_routes: 1,
                conditions: vec![
                    tc(gw::ACCEPTED, true, "Accepted"),
                    tc(gw::PROGRAMMED, true, "Programmed"),
                ],
            }],
        };
        let ok = set(true, "Accepted");
        let pending = listener_set_status(&ok, 7, &dp(Some(6)), None, t0);
        let p = cond(&pending.conditions, gw::PROGRAMMED);
        assert_eq!((p.status.as_str(), p.reason.as_str()), ("False", "Pending"));
        assert_eq!(p.observed_generation, Some(2));
        let done = listener_set_status(&ok, 7, &dp(Some(7)), Some(&pending), t0);
        let p = cond(&done.conditions, gw::PROGRAMMED);
        assert_eq!(
            (p.status.as_str(), p.reason.as_str()),
            ("True", "Programmed")
        );
        let lp = cond(&done.listeners[0].conditions, gw::PROGRAMMED);
        assert_eq!(lp.status, "True");
        assert_eq!(done.listeners[0].attached_routes, 1);

        let refused = listener_set_status(&set(false, "NotAllowed"), 7, &dp(Some(7)), None, t0);
        let p = cond(&refused.conditions, gw::PROGRAMMED);
        assert_eq!(
            (p.status.as_str(), p.reason.as_str()),
            ("False", "NotAllowed")
        );

        let mut g = gateway(true);
        g.attached_listener_sets = Some(1);
        let s = gateway_status(&g, 7, &dp(Some(7)), &[], None, t0);
        assert_eq!(s.attached_listener_sets, Some(1));
    }

    #[test]
    fn an_invalid_gateway_keeps_translations_verdict_and_gets_no_address() {
        let addr = addresses(&[IngressLoadBalancerIngress {
            ip: Some("192.0.2.1".into()),
            ..Default::default()
        }]);
        let s = gateway_status(
            &gateway(false),
            1,
            &dp(Some(1)),
            &addr,
            None,
            Timestamp::now(),
        );
        assert_eq!(cond(&s.conditions, gw::PROGRAMMED).status, "False");
        assert!(s.addresses.is_empty());
        let s = gateway_status(
            &gateway(true),
            1,
            &dp(Some(1)),
            &addr,
            None,
            Timestamp::now(),
        );
        assert_eq!(s.addresses[0].type_.as_deref(), Some("IPAddress"));
        assert_eq!(s.addresses[0].value, "192.0.2.1");
    }

    #[test]
    fn other_controllers_parent_entries_are_kept() {
        let parent = |name: &str| ParentReference {
            name: name.into(),
            ..Default::default()
        };
        let theirs = RouteParentStatus {
            parent_ref: parent("other"),
            controller_name: "example.com/other".into(),
            conditions: vec![],
        };
        let want = RouteStatus {
            kind: RouteKind::HttpRoute,
            namespace: "ns".into(),
            name: "r".into(),
            generation: Some(2),
            parents: vec![WantParent {
                parent_ref: parent("gw"),
                conditions: vec![tc(gw::ACCEPTED, true, "Accepted")],
            }],
            routes: vec![],
        };
        let stale_ours = RouteParentStatus {
            parent_ref: parent("gone"),
            controller_name: "sluice.dev/gateway-controller".into(),
            conditions: vec![],
        };
        let out = route_parents(
            &want,
            "sluice.dev/gateway-controller",
            &[theirs.clone(), stale_ours],
            Timestamp::now(),
        );
        assert_eq!(out.len(), 2);
        assert_eq!(out[0], theirs);
        assert_eq!(out[1].parent_ref.name, "gw");
        assert_eq!(out[1].conditions[0].observed_generation, Some(2));
    }

    /// The stores, as far as `desired` reads them.
    #[derive(Default)]
    struct Fake {
        http_routes: Vec<Arc<HTTPRoute>>,
    }

    impl Current for Fake {
        fn gateway_class(&self, _: &str) -> Option<Arc<GatewayClass>> {
            None
        }
        fn gateway(&self, _: &str, _: &str) -> Option<Arc<Gateway>> {
            None
        }
        fn http_route(&self, namespace: &str, name: &str) -> Option<Arc<HTTPRoute>> {
            self.http_routes
                .iter()
                .find(|r| {
                    r.metadata.namespace.as_deref() == Some(namespace)
                        && r.metadata.name.as_deref() == Some(name)
                })
                .cloned()
        }
        fn grpc_route(&self, _: &str, _: &str) -> Option<Arc<GRPCRoute>> {
            None
        }
        fn http_routes(&self) -> Vec<Arc<HTTPRoute>> {
            self.http_routes.clone()
        }
        fn grpc_routes(&self) -> Vec<Arc<GRPCRoute>> {
            Vec::new()
        }
    }

    #[test]
    fn a_route_no_longer_ours_loses_only_our_parent_entries() {
        let parent = |name: &str, controller: &str| RouteParentStatus {
            parent_ref: ParentReference {
                name: name.into(),
                ..Default::default()
            },
            controller_name: controller.into(),
            conditions: vec![],
        };
        let theirs = parent("other", "example.com/other");
        let mut route: HTTPRoute = serde_json::from_value(json!({
            "apiVersion": API_VERSION,
            "kind": "HTTPRoute",
            "metadata": {"namespace": "ns", "name": "r", "resourceVersion": "7"},
            "spec": {},
        }))
        .unwrap();
        route.status = Some(sluice_crds::gateway::RouteStatus {
            parents: vec![
                theirs.clone(),
                parent("gw", "sluice.dev/gateway-controller"),
            ],
        });
        let stores = Fake {
            http_routes: vec![Arc::new(route)],
        };
        let report = GatewayStatusReport {
            controller_name: "sluice.dev/gateway-controller".into(),
            ..Default::default()
        };
        let writes = desired(
            &report,
            &BTreeMap::new(),
            &dp(None),
            &HashMap::new(),
            &stores,
            Timestamp::now(),
        );
        assert_eq!(writes.len(), 1, "{writes:?}");
        assert_eq!(writes[0].0, Key::new("HTTPRoute", "ns", "r"));
        let Write::Route {
            kind,
            resource_version,
            status,
        } = &writes[0].1
        else {
            panic!("{writes:?}")
        };
        assert_eq!(*kind, RouteKind::HttpRoute);
        assert_eq!(resource_version.as_deref(), Some("7"));
        assert_eq!(status.parents, vec![theirs]);
    }
}
