//! The Gateway API status writer (leader only): translation's [`GatewayStatusReport`] plus
//! what the dataplanes serve, written with server-side apply under the field manager
//! [`FIELD_MANAGER`].
//!
//! - `GatewayClass.status`: `Accepted`, `supportedFeatures[].name`.
//! - `Gateway.status`: `Accepted`, `Programmed`, `listeners[]` (name, supportedKinds,
//!   attachedRoutes, conditions) and, with `--ingress-status-address` or
//!   `--ingress-publish-service`, `addresses[]` (the same address Ingresses get).
//! - `HTTPRoute` / `GRPCRoute` `status.parents[]`: the entries whose `controllerName` is ours
//!   (`--gateway-controller-name`). Entries of other controllers are kept as they are: the
//!   list is atomic, so the write carries them unchanged, with the route's
//!   `resourceVersion` so a concurrent write by another controller is never overwritten
//!   (the write is retried). A route that no longer has a parent of ours loses our entries.
//!
//! `Programmed` of a Gateway and of its listeners is `True` only when every dataplane that
//! should serve (see [`crate::status`]) serves a snapshot that contains the Gateway's routes
//! and certificates as they are now; until then `False` / `Pending` with the count of
//! dataplanes in the message. Every condition carries `observedGeneration`;
//! `lastTransitionTime` is kept while a condition's status does not change; an object whose
//! status already says what we would write is not patched.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::networking::v1::IngressLoadBalancerIngress;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use sluice_crds::gateway::{
    GRPCRoute, Gateway, GatewayClass, GatewayStatusAddress, HTTPRoute, ListenerStatus,
    RouteParentStatus, SupportedFeature,
};
use sluice_translate::gateway::{
    self as gw, GatewayClassStatus, GatewayStatus, GatewayStatusReport, RouteKind, RouteStatus,
};
use sluice_translate::status::ConditionStatus;
use tokio::sync::watch;

use crate::grpc::Hub;
use crate::ingress_status::{Publish, published};
use crate::metrics::Metrics;
use crate::rebuild::Rebuilt;
use crate::records::FleetView;
use crate::status::{
    Dataplanes, Desired, RESYNC_INTERVAL, conditions_to_write, from_translation, programmed_since,
};
use crate::watch::Stores;

/// Field manager of the Gateway API status writes.
pub const FIELD_MANAGER: &str = "sluice-gateway-controller";
/// API version of the Gateway API kinds written.
const API_VERSION: &str = "gateway.networking.k8s.io/v1";

/// The `Programmed` condition of an accepted Gateway (or listener) first served at `since`:
/// `True` / `Programmed` once every expected dataplane serves it, else `False` / `Pending`
/// (the Gateway API's reasons; the message says which dataplanes are waited for).
pub fn programmed(since: u64, dataplanes: &Dataplanes) -> Desired {
    let mut d = programmed_since(since, dataplanes);
    d.reason = if d.status == "True" {
        gw::reason::PROGRAMMED
    } else {
        gw::reason::PENDING
    }
    .to_owned();
    d
}

/// Translation's conditions, with a `Programmed=True` (valid and in the snapshot) replaced by
/// the dataplanes' verdict.
fn with_fleet(conditions: &[sluice_translate::Condition], fleet: &Option<Desired>) -> Vec<Desired> {
    conditions
        .iter()
        .map(|c| match fleet {
            Some(p) if c.type_ == gw::PROGRAMMED && c.status == ConditionStatus::True => p.clone(),
            _ => from_translation(c),
        })
        .collect()
}

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
    let fleet = Some(programmed(since, dataplanes));
    let old = existing
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let listeners = want
        .listeners
        .iter()
        .map(|l| {
            let old_listener = existing
                .and_then(|s| s.listeners.iter().find(|o| o.name == l.name))
                .map(|o| o.conditions.as_slice())
                .unwrap_or_default();
            ListenerStatus {
                name: l.name.clone(),
                supported_kinds: l.supported_kinds.clone(),
                attached_routes: l.attached_routes,
                conditions: conditions_to_write(
                    &with_fleet(&l.conditions, &fleet),
                    want.generation,
                    old_listener,
                    now,
                ),
            }
        })
        .collect();
    let accepted = want
        .conditions
        .iter()
        .any(|c| c.type_ == gw::ACCEPTED && c.status == ConditionStatus::True);
    sluice_crds::gateway::GatewayStatus {
        addresses: if accepted {
            addresses.to_vec()
        } else {
            Vec::new()
        },
        conditions: conditions_to_write(
            &with_fleet(&want.conditions, &fleet),
            want.generation,
            old,
            now,
        ),
        listeners,
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

/// One status write.
#[derive(Debug, Clone, PartialEq)]
enum Write {
    Class(String, sluice_crds::gateway::GatewayClassStatus),
    Gateway(String, String, sluice_crds::gateway::GatewayStatus),
    Route {
        kind: RouteKind,
        namespace: String,
        name: String,
        resource_version: Option<String>,
        status: sluice_crds::gateway::RouteStatus,
    },
}

type Key = (&'static str, String, String);

impl Write {
    fn key(&self) -> Key {
        match self {
            Write::Class(n, _) => ("GatewayClass", String::new(), n.clone()),
            Write::Gateway(ns, n, _) => ("Gateway", ns.clone(), n.clone()),
            Write::Route {
                kind,
                namespace,
                name,
                ..
            } => (kind.as_str(), namespace.clone(), name.clone()),
        }
    }

    /// The status body without transition times, to compare with what was written last
    /// (a condition written a moment ago that the stores do not show yet would get a new
    /// time on every pass).
    fn body(&self) -> serde_json::Value {
        fn strip(v: &mut serde_json::Value) {
            match v {
                serde_json::Value::Object(map) => {
                    map.remove("lastTransitionTime");
                    map.values_mut().for_each(strip);
                }
                serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
                _ => {}
            }
        }
        let mut v = match self {
            Write::Class(_, s) => json!(s),
            Write::Gateway(_, _, s) => json!(s),
            Write::Route { status, .. } => json!(status),
        };
        strip(&mut v);
        v
    }

    async fn apply(&self, client: &Client) -> Result<(), kube::Error> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match self {
            Write::Class(name, status) => {
                let patch =
                    json!({"apiVersion": API_VERSION, "kind": "GatewayClass", "status": status});
                Api::<GatewayClass>::all(client.clone())
                    .patch_status(name, &params, &Patch::Apply(&patch))
                    .await?;
            }
            Write::Gateway(ns, name, status) => {
                let patch = json!({"apiVersion": API_VERSION, "kind": "Gateway", "status": status});
                Api::<Gateway>::namespaced(client.clone(), ns)
                    .patch_status(name, &params, &Patch::Apply(&patch))
                    .await?;
            }
            Write::Route {
                kind,
                namespace,
                name,
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
                        Api::<HTTPRoute>::namespaced(client.clone(), namespace)
                            .patch_status(name, &params, &Patch::Apply(&patch))
                            .await?;
                    }
                    RouteKind::GrpcRoute => {
                        Api::<GRPCRoute>::namespaced(client.clone(), namespace)
                            .patch_status(name, &params, &Patch::Apply(&patch))
                            .await?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Every write that would change an object's status now.
fn writes(
    report: &GatewayStatusReport,
    since: &std::collections::BTreeMap<(String, String), u64>,
    dataplanes: &Dataplanes,
    addrs: &HashMap<(String, String), Vec<GatewayStatusAddress>>,
    stores: &Stores,
    now: Timestamp,
) -> Vec<Write> {
    let mut out = Vec::new();
    for c in &report.gateway_classes {
        let Some(obj) = stores.gateway_class(&c.name) else {
            continue;
        };
        let want = gateway_class_status(c, obj.status.as_ref(), now);
        if obj.status.as_ref() != Some(&want) {
            out.push(Write::Class(c.name.clone(), want));
        }
    }
    for g in &report.gateways {
        let Some(obj) = stores.gateway(&g.namespace, &g.name) else {
            continue;
        };
        let v = since
            .get(&(g.namespace.clone(), g.name.clone()))
            .copied()
            .unwrap_or_default();
        let a = addrs
            .get(&(g.namespace.clone(), g.name.clone()))
            .map(Vec::as_slice)
            .unwrap_or_default();
        let want = gateway_status(g, v, dataplanes, a, obj.status.as_ref(), now);
        if obj.status.as_ref() != Some(&want) {
            out.push(Write::Gateway(g.namespace.clone(), g.name.clone(), want));
        }
    }
    for r in &report.routes {
        let (current, resource_version) = match r.kind {
            RouteKind::HttpRoute => match stores.http_route(&r.namespace, &r.name) {
                Some(o) => (o.status.clone(), o.metadata.resource_version.clone()),
                None => continue,
            },
            RouteKind::GrpcRoute => match stores.grpc_route(&r.namespace, &r.name) {
                Some(o) => (o.status.clone(), o.metadata.resource_version.clone()),
                None => continue,
            },
        };
        let existing = current
            .as_ref()
            .map(|s| s.parents.as_slice())
            .unwrap_or_default();
        let want = sluice_crds::gateway::RouteStatus {
            parents: route_parents(r, &report.controller_name, existing, now),
        };
        if current.as_ref() != Some(&want) {
            out.push(Write::Route {
                kind: r.kind,
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                resource_version,
                status: want,
            });
        }
    }
    // Routes with none of our parents left (parentRef removed, Gateway deleted or of
    // another class): our old entries go, other controllers' stay.
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
        );
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
        out.push(Write::Route {
            kind,
            namespace,
            name,
            resource_version: meta.resource_version,
            status: sluice_crds::gateway::RouteStatus { parents },
        });
    }
    out
}

/// Writes Gateway API status while `leader` is true, whenever translation or the fleet
/// change what it should say. Runs until the rebuild output's sender is dropped.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    hub: Arc<Hub>,
    fleet: FleetView,
    mut rebuilt: watch::Receiver<Option<Arc<Rebuilt>>>,
    mut leader: watch::Receiver<bool>,
    stores: Stores,
    publish: Option<Publish>,
    services: Option<crate::gateway_services::GatewayServices>,
    metrics: Metrics,
) {
    fleet.synced().await;
    let mut dataplanes = fleet.subscribe();
    // What we wrote last, so a write is not repeated before the watch shows it.
    let mut written: HashMap<Key, serde_json::Value> = HashMap::new();
    let mut resync = tokio::time::interval(RESYNC_INTERVAL);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut retry_soon = false;
    loop {
        let retry = async {
            if retry_soon {
                tokio::time::sleep(Duration::from_secs(1)).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = resync.tick() => written.clear(),
            _ = retry => {},
            r = rebuilt.changed() => if r.is_err() { return },
            r = dataplanes.changed() => if r.is_err() { return },
            r = leader.changed() => {
                if r.is_err() { return }
                written.clear();
            },
        }
        retry_soon = false;
        // Batch bursts of ACKs (one per dataplane per snapshot).
        tokio::time::sleep(Duration::from_millis(250)).await;
        dataplanes.borrow_and_update();
        let out = rebuilt.borrow_and_update().clone();
        if !*leader.borrow_and_update() {
            continue;
        }
        let Some(out) = out else { continue };
        let report = &out.gateway.report;
        if !stores.gateway_api() {
            continue;
        }
        let now_fleet = fleet.fleet();
        let counted = Dataplanes {
            counted: now_fleet.resolve(|hash| hub.version_of(hash)),
            why_none: now_fleet.why_none(),
        };
        let mut addrs: HashMap<(String, String), Vec<GatewayStatusAddress>> = HashMap::new();
        if let Some(cfg) = &services {
            // Each Gateway's own Service.
            for g in &report.gateways {
                let svc = crate::gateway_services::service_name(&g.namespace, &g.name);
                let p = Publish::Service {
                    namespace: cfg.namespace.clone(),
                    name: svc,
                };
                let a = addresses(&published(&client, &p, &stores).await.unwrap_or_default());
                addrs.insert((g.namespace.clone(), g.name.clone()), a);
            }
        } else if let Some(p) = &publish
            && !report.gateways.is_empty()
        {
            let a = addresses(&published(&client, p, &stores).await.unwrap_or_default());
            for g in &report.gateways {
                addrs.insert((g.namespace.clone(), g.name.clone()), a.clone());
            }
        }
        let todo: Vec<Write> = writes(
            report,
            &out.gateway.since,
            &counted,
            &addrs,
            &stores,
            Timestamp::now(),
        )
        .into_iter()
        .filter(|w| written.get(&w.key()) != Some(&w.body()))
        .collect();
        if todo.is_empty() {
            continue;
        }
        tracing::debug!(
            objects = todo.len(),
            version = out.version,
            "writing Gateway API status"
        );
        let results: Vec<(Write, Result<(), kube::Error>)> =
            futures::stream::iter(todo.into_iter().map(|w| {
                let client = client.clone();
                async move {
                    let r = w.apply(&client).await;
                    (w, r)
                }
            }))
            .buffer_unordered(8)
            .collect()
            .await;
        for (w, result) in results {
            let key = w.key();
            match result {
                Ok(()) => {
                    metrics.status_writes.inc();
                    written.insert(key, w.body());
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                // Changed meanwhile (another controller, or our store lags): again soon.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    tracing::debug!(kind = key.0, namespace = %key.1, name = %key.2, "status changed meanwhile; retrying");
                    retry_soon = true;
                }
                Err(e) => {
                    metrics
                        .reconcile_errors
                        .with_label_values(&["status"])
                        .inc();
                    tracing::warn!(kind = key.0, namespace = %key.1, name = %key.2, error = %e, "Gateway API status write failed");
                    retry_soon = true;
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
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
}
