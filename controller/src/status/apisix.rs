//! `.status` of the Apisix kinds (ApisixRoute, ApisixUpstream, ApisixTls,
//! ApisixPluginConfig, ApisixConsumer, ApisixGlobalRule), written with server-side apply
//! under [`FIELD_MANAGER`]: `Accepted` (and `ResolvedRefs` where relevant) exactly as
//! translation reported them, then `Programmed` (see [`super::programmed`]).

use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde::Serialize;
use sluice_crds::{
    ApisixConsumer, ApisixGlobalRule, ApisixPluginConfig, ApisixRoute, ApisixStatus, ApisixTls,
    ApisixUpstream,
};
use sluice_translate::ObjectKind;

use super::programmed::{Dataplanes, programmed};
use super::writer::{Family, Key};
use super::{Desired, FIELD_MANAGER, conditions_to_write, from_translation};
use crate::context::Context;
use crate::metrics::Metrics;
use crate::rebuild::{ObjectVerdict, Rebuilt};

/// Every condition of one object: translation's, then `Programmed`.
pub fn conditions(verdict: &ObjectVerdict, dataplanes: &Dataplanes) -> Vec<Desired> {
    let mut out: Vec<Desired> = verdict
        .status
        .conditions
        .iter()
        .map(from_translation)
        .collect();
    out.push(programmed(verdict, dataplanes));
    out
}

/// The status to write: `desired` with transition times kept from `existing` where the
/// condition's status did not change. `None` when `existing` already says exactly this.
pub fn status_to_write(
    desired: &[Desired],
    generation: Option<i64>,
    existing: Option<&ApisixStatus>,
    now: Timestamp,
) -> Option<ApisixStatus> {
    let conditions = conditions_to_write(
        desired,
        generation,
        existing
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default(),
        now,
    );
    let status = ApisixStatus {
        conditions,
        observed_generation: generation,
    };
    if existing == Some(&status) {
        None
    } else {
        Some(status)
    }
}

/// One status write.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Write {
    /// The object's kind.
    pub kind: ObjectKind,
    /// Its whole status.
    pub status: ApisixStatus,
}

/// Every status write that would change an object of `rebuilt` now; `existing` reads an
/// object's current status (from the stores).
pub fn desired(
    rebuilt: &Rebuilt,
    dataplanes: &Dataplanes,
    existing: impl Fn(ObjectKind, &str, &str) -> Option<ApisixStatus>,
    now: Timestamp,
) -> Vec<(Key, Write)> {
    rebuilt
        .objects
        .iter()
        .filter_map(|verdict| {
            let s = &verdict.status;
            let want = conditions(verdict, dataplanes);
            let current = existing(s.kind, &s.namespace, &s.name);
            let status = status_to_write(&want, s.generation, current.as_ref(), now)?;
            let key = Key::new(s.kind.as_str(), &s.namespace, &s.name);
            Some((
                key,
                Write {
                    kind: s.kind,
                    status,
                },
            ))
        })
        .collect()
}

/// The API resource of a kind.
fn api_resource(kind: ObjectKind) -> ApiResource {
    match kind {
        ObjectKind::ApisixRoute => ApiResource::erase::<ApisixRoute>(&()),
        ObjectKind::ApisixUpstream => ApiResource::erase::<ApisixUpstream>(&()),
        ObjectKind::ApisixTls => ApiResource::erase::<ApisixTls>(&()),
        ObjectKind::ApisixPluginConfig => ApiResource::erase::<ApisixPluginConfig>(&()),
        ObjectKind::ApisixConsumer => ApiResource::erase::<ApisixConsumer>(&()),
        ObjectKind::ApisixGlobalRule => ApiResource::erase::<ApisixGlobalRule>(&()),
    }
}

/// Writes one object's status with server-side apply.
async fn write(
    client: &Client,
    kind: ObjectKind,
    namespace: &str,
    name: &str,
    status: &ApisixStatus,
) -> Result<(), kube::Error> {
    let ar = api_resource(kind);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
    let patch = serde_json::json!({
        "apiVersion": ar.api_version,
        "kind": ar.kind,
        "status": status,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(name, &params, &Patch::Apply(&patch))
        .await
        .map(|_| ())
}

/// The Apisix status family of the writer.
#[derive(Debug, Default)]
pub struct Apisix;

impl Family for Apisix {
    type Write = Write;
    const NAME: &'static str = "apisix";
    const FLEET: bool = true;

    async fn plan(
        &self,
        ctx: &Context,
        rebuilt: &Rebuilt,
    ) -> Result<Vec<(Key, Write)>, kube::Error> {
        let dataplanes = Dataplanes::now(ctx);
        let existing = |kind, ns: &str, name: &str| ctx.stores.status_of(kind, ns, name);
        Ok(desired(rebuilt, &dataplanes, existing, Timestamp::now()))
    }

    async fn apply(&self, ctx: &Context, key: &Key, w: &Write) -> Result<(), kube::Error> {
        write(&ctx.client, w.kind, &key.namespace, &key.name, &w.status).await
    }

    fn count(&self, metrics: &Metrics) {
        metrics.status_writes.inc();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::status::programmed::tests::{dp, fleet, verdict};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn transition_time_is_kept_while_the_status_holds_and_no_op_writes_are_skipped() {
        let t0 = Timestamp::from_second(1_700_000_000).unwrap();
        let t1 = Timestamp::from_second(1_700_000_100).unwrap();
        let v = verdict(true, 1);
        let pending = conditions(&v, &fleet(vec![dp("a", None, None)]));
        let first = status_to_write(&pending, Some(3), None, t0).unwrap();
        assert_eq!(first.observed_generation, Some(3));
        assert_eq!(first.conditions.len(), 2);
        assert!(
            first
                .conditions
                .iter()
                .all(|c| c.observed_generation == Some(3))
        );
        assert!(
            first
                .conditions
                .iter()
                .all(|c| c.last_transition_time == Time(t0))
        );

        // Same verdict later: nothing to write.
        assert!(status_to_write(&pending, Some(3), Some(&first), t1).is_none());

        // Programmed flips to True: only its transition time moves.
        let done = conditions(&v, &fleet(vec![dp("a", Some(1), None)]));
        let second = status_to_write(&done, Some(3), Some(&first), t1).unwrap();
        let by_type = |s: &ApisixStatus, t: &str| {
            s.conditions.iter().find(|c| c.type_ == t).cloned().unwrap()
        };
        assert_eq!(by_type(&second, "Accepted").last_transition_time, Time(t0));
        let p = by_type(&second, "Programmed");
        assert_eq!(
            (p.status.as_str(), p.last_transition_time),
            ("True", Time(t1))
        );
    }

    #[test]
    fn only_objects_whose_status_would_change_are_written() {
        let t0 = Timestamp::from_second(1_700_000_000).unwrap();
        let rebuilt = Rebuilt {
            objects: vec![verdict(true, 1)],
            ..Default::default()
        };
        let dataplanes = fleet(vec![dp("a", Some(1), None)]);
        let writes = desired(&rebuilt, &dataplanes, |_, _, _| None, t0);
        assert_eq!(writes.len(), 1);
        let (key, w) = &writes[0];
        assert_eq!(*key, Key::new("ApisixRoute", "default", "r"));
        assert_eq!(w.kind, ObjectKind::ApisixRoute);
        let written = w.status.clone();
        let later = Timestamp::from_second(1_700_000_100).unwrap();
        let again = desired(
            &rebuilt,
            &dataplanes,
            |_, _, _| Some(written.clone()),
            later,
        );
        assert!(again.is_empty(), "{again:?}");
    }
}
