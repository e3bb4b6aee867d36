//! `status.loadBalancer` of the Ingresses we serve, so `kubectl get ingress` shows the
//! address clients should use (and tools such as external-dns can publish it).
//!
//! The address comes from [`Publish`] (see [`super::address`]). An accepted Ingress of our
//! class gets the address; a rejected one gets none. Written with server-side apply (field
//! manager `sluice-controller`), only when the status would change.

use k8s_openapi::api::networking::v1::{Ingress, IngressLoadBalancerIngress};
use kube::Api;
use kube::api::{Patch, PatchParams};
use sluice_translate::status::{CONDITION_ACCEPTED, ConditionStatus, IngressStatus};

use super::FIELD_MANAGER;
use super::address::{Publish, published};
use super::writer::{Family, Key};
use crate::context::Context;
use crate::metrics::Metrics;
use crate::rebuild::Rebuilt;

/// What `status.loadBalancer.ingress` of an Ingress should say.
pub fn desired(
    ingress: &IngressStatus,
    published: &[IngressLoadBalancerIngress],
) -> Vec<IngressLoadBalancerIngress> {
    let accepted = ingress
        .conditions
        .iter()
        .any(|c| c.type_ == CONDITION_ACCEPTED && c.status == ConditionStatus::True);
    if accepted {
        published.to_vec()
    } else {
        Vec::new()
    }
}

fn current(ing: &Ingress) -> Vec<IngressLoadBalancerIngress> {
    ing.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.clone())
        .unwrap_or_default()
}

/// Every `status.loadBalancer.ingress` write that would change an Ingress of `rebuilt` now,
/// given the `published` address; `existing` finds an Ingress as it is now (the stores).
pub fn desired_writes(
    rebuilt: &Rebuilt,
    published: &[IngressLoadBalancerIngress],
    existing: impl Fn(&str, &str) -> Option<std::sync::Arc<Ingress>>,
) -> Vec<(Key, Vec<IngressLoadBalancerIngress>)> {
    rebuilt
        .ingresses
        .iter()
        .filter_map(|ing| {
            let want = desired(ing, published);
            let current = existing(&ing.namespace, &ing.name)?;
            (self::current(&current) != want)
                .then(|| (Key::new("Ingress", &ing.namespace, &ing.name), want))
        })
        .collect()
}

/// The Ingress status family of the writer.
#[derive(Debug, Clone)]
pub struct IngressAddress {
    /// Where the address comes from.
    pub publish: Publish,
}

impl Family for IngressAddress {
    type Write = Vec<IngressLoadBalancerIngress>;
    const NAME: &'static str = "ingress";

    async fn plan(
        &self,
        ctx: &Context,
        rebuilt: &Rebuilt,
    ) -> Result<Vec<(Key, Self::Write)>, kube::Error> {
        if rebuilt.ingresses.is_empty() {
            return Ok(Vec::new());
        }
        // NB: an unreadable publish Service is logged there; nothing is written then.
        let Some(addrs) = published(&ctx.client, &self.publish, &ctx.stores).await else {
            return Ok(Vec::new());
        };
        Ok(desired_writes(rebuilt, &addrs, |ns, name| {
            ctx.stores.ingress(ns, name)
        }))
    }

    async fn apply(&self, ctx: &Context, key: &Key, want: &Self::Write) -> Result<(), kube::Error> {
        let patch = serde_json::json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "status": { "loadBalancer": { "ingress": want } },
        });
        let api: Api<Ingress> = Api::namespaced(ctx.client.clone(), &key.namespace);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        api.patch_status(&key.name, &params, &Patch::Apply(&patch))
            .await
            .map(|_| ())
    }

    fn count(&self, metrics: &Metrics) {
        metrics.ingress_status_writes.inc();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::status::address::from_addresses;
    use sluice_translate::status::Condition;

    #[test]
    fn only_accepted_ingresses_get_the_address() {
        let ing = |status| IngressStatus {
            namespace: "ns".into(),
            name: "i".into(),
            generation: Some(1),
            conditions: vec![Condition {
                type_: CONDITION_ACCEPTED.into(),
                status,
                reason: "x".into(),
                message: String::new(),
            }],
            routes: vec![],
        };
        let addrs = from_addresses(&["192.0.2.1".into()]);
        assert_eq!(desired(&ing(ConditionStatus::True), &addrs), addrs);
        assert!(desired(&ing(ConditionStatus::False), &addrs).is_empty());
    }

    #[test]
    fn ingresses_are_written_only_when_their_address_would_change() {
        let ing = IngressStatus {
            namespace: "ns".into(),
            name: "i".into(),
            generation: Some(1),
            conditions: vec![Condition {
                type_: CONDITION_ACCEPTED.into(),
                status: ConditionStatus::True,
                reason: "x".into(),
                message: String::new(),
            }],
            routes: vec![],
        };
        let rebuilt = Rebuilt {
            ingresses: vec![ing],
            ..Default::default()
        };
        let addrs = from_addresses(&["192.0.2.1".into()]);
        let bare = std::sync::Arc::new(Ingress::default());
        let writes = desired_writes(&rebuilt, &addrs, |_, _| Some(bare.clone()));
        assert_eq!(
            writes,
            vec![(Key::new("Ingress", "ns", "i"), addrs.clone())]
        );

        let done = std::sync::Arc::new(Ingress {
            status: Some(k8s_openapi::api::networking::v1::IngressStatus {
                load_balancer: Some(
                    k8s_openapi::api::networking::v1::IngressLoadBalancerStatus {
                        ingress: Some(addrs.clone()),
                    },
                ),
            }),
            ..Default::default()
        });
        assert!(desired_writes(&rebuilt, &addrs, |_, _| Some(done.clone())).is_empty());
        assert!(
            desired_writes(&rebuilt, &addrs, |_, _| None).is_empty(),
            "not in the stores"
        );
    }
}
