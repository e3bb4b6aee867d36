//! The status writer: one writer (the leader) turns translation's verdicts plus what the
//! dataplanes serve into `.status` of each object, with server-side apply.
//!
//! Conditions written:
//!
//! - `Accepted` (and `ResolvedRefs` where relevant) exactly as translation reported them.
//! - `Programmed`: how many of the dataplanes that should serve (the expected set, see
//!   [`crate::fleet`]) serve a snapshot that contains the object as it is now, e.g. `True` /
//!   `AllDataplanesProgrammed` / `3/3 dataplanes at v42`, or `False` / `Pending` /
//!   `1/3 dataplanes at v42, waiting for: dp-b (at v41), dp-c (not connected)`, `False` /
//!   `Rejected` naming the dataplane and its NACK reason, `False` / `NoDataplanes`, `False` /
//!   `Invalid` when the object is not accepted. `v42` is the first version that contains
//!   the object as it is now (a dataplane at v42 or later serves it), not the latest
//!   version: so the message of an unchanged object stays the same while other objects
//!   change, and its status is not rewritten on every snapshot.
//!
//! Dataplanes are served by every replica, so they are compared by content hash, which is
//! the same on every replica for the same content: a dataplane serves the object when the
//! hash it serves is one this replica published as v42 or later. A hash this replica never
//! published (another replica saw an intermediate state this one skipped) proves nothing,
//! so that dataplane counts as waiting until it serves content this replica knows: status
//! may lag, it never claims more than it can show.
//!
//! Every condition carries `observedGeneration`; `lastTransitionTime` is kept from the
//! object's current status while a condition's status does not change. An object whose
//! status already says what we would write is not patched.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use sluice_crds::{
    ApisixConsumer, ApisixGlobalRule, ApisixPluginConfig, ApisixRoute, ApisixStatus, ApisixTls,
    ApisixUpstream, CONDITION_PROGRAMMED,
};
use sluice_translate::{ConditionStatus, ObjectKind};
use tokio::sync::watch;

use crate::fleet::Counted;
use crate::grpc::Hub;
use crate::metrics::Metrics;
use crate::rebuild::{ObjectVerdict, Rebuilt};
use crate::records::FleetView;

/// Field manager of the status writes.
pub const FIELD_MANAGER: &str = "sluice-controller";
/// `Programmed` reason when every expected dataplane serves the object.
pub const REASON_PROGRAMMED: &str = "AllDataplanesProgrammed";
/// `Programmed` reason while some expected dataplanes do not serve it yet.
pub const REASON_PENDING: &str = "Pending";
/// `Programmed` reason when a dataplane that does not serve the object rejected a snapshot.
pub const REASON_REJECTED: &str = "Rejected";
/// `Programmed` reason when no dataplane is expected (or, without an expected set, none
/// is connected).
pub const REASON_NO_DATAPLANES: &str = "NoDataplanes";
/// Most dataplanes named in a `Programmed` message; the rest are counted.
pub const MAX_NAMED: usize = 8;
/// `Programmed` reason when the object is not accepted.
pub const REASON_INVALID: &str = "Invalid";
/// How often the writer re-checks every object even without a change (retries failures).
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(30);
/// Longest condition message written; longer ones are cut (status objects stay small).
pub const MAX_MESSAGE_CHARS: usize = 1024;

/// A condition without its transition time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// Condition type.
    pub type_: String,
    /// `True` or `False`.
    pub status: &'static str,
    /// CamelCase reason.
    pub reason: String,
    /// Message (at most [`MAX_MESSAGE_CHARS`]).
    pub message: String,
}

fn truncate(mut s: String) -> String {
    if s.chars().count() > MAX_MESSAGE_CHARS {
        s = s.chars().take(MAX_MESSAGE_CHARS - 1).collect();
        s.push('…');
    }
    s
}

/// The counted dataplanes at one moment, as [`programmed`] needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataplanes {
    /// The dataplanes that should serve, resolved against this replica's versions.
    pub counted: Vec<Counted>,
    /// Why none is counted, when none is.
    pub why_none: String,
}

/// How one waiting dataplane is doing, for the `Programmed` message.
fn waiting_note(d: &Counted) -> String {
    match (&d.rejected, d.reported, d.seen) {
        (Some(r), _, _) => format!("{} (rejected v{})", d.id, r.version),
        (None, Some(v), _) => format!("{} (at v{v})", d.id),
        (None, None, true) => format!("{} (serves nothing yet)", d.id),
        (None, None, false) => format!("{} (not connected)", d.id),
    }
}

/// The `Programmed` condition of one object.
pub fn programmed(verdict: &ObjectVerdict, dataplanes: &Dataplanes) -> Desired {
    let cond = |status, reason: &str, message: String| Desired {
        type_: CONDITION_PROGRAMMED.to_owned(),
        status,
        reason: reason.to_owned(),
        message: truncate(message),
    };
    if !verdict.status.is_accepted() {
        return cond(
            "False",
            REASON_INVALID,
            "not accepted; see the Accepted condition".into(),
        );
    }
    programmed_since(verdict.since_version, dataplanes)
}

/// The `Programmed` condition of an accepted object first contained in version `since`.
pub fn programmed_since(since: u64, dataplanes: &Dataplanes) -> Desired {
    let cond = |status, reason: &str, message: String| Desired {
        type_: CONDITION_PROGRAMMED.to_owned(),
        status,
        reason: reason.to_owned(),
        message: truncate(message),
    };
    let total = dataplanes.counted.len();
    if total == 0 {
        return cond(
            "False",
            REASON_NO_DATAPLANES,
            format!("0/0 dataplanes at v{since}: {}", dataplanes.why_none),
        );
    }
    let (serving, waiting): (Vec<&Counted>, Vec<&Counted>) = dataplanes
        .counted
        .iter()
        .partition(|d| d.serving.is_some_and(|v| v >= since));
    let summary = format!("{}/{total} dataplanes at v{since}", serving.len());
    if waiting.is_empty() {
        return cond("True", REASON_PROGRAMMED, summary);
    }
    let mut names: Vec<String> = waiting
        .iter()
        .take(MAX_NAMED)
        .map(|d| waiting_note(d))
        .collect();
    if waiting.len() > MAX_NAMED {
        names.push(format!("and {} more", waiting.len() - MAX_NAMED));
    }
    let summary = format!("{summary}, waiting for: {}", names.join(", "));
    match waiting
        .iter()
        .find_map(|d| d.rejected.as_ref().map(|r| (d, r)))
    {
        Some((d, r)) => cond(
            "False",
            REASON_REJECTED,
            format!(
                "{summary}; dataplane {} rejected v{}: {}",
                d.id,
                r.version,
                r.reasons.join("; ")
            ),
        ),
        None => cond("False", REASON_PENDING, summary),
    }
}

/// A translation condition as it is written (message cut to [`MAX_MESSAGE_CHARS`]).
pub fn from_translation(c: &sluice_translate::Condition) -> Desired {
    Desired {
        type_: c.type_.clone(),
        status: match c.status {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
        },
        reason: c.reason.clone(),
        message: truncate(c.message.clone()),
    }
}

/// Conditions to write: `desired` with `observedGeneration = generation` and
/// `lastTransitionTime` kept from `existing` where the condition's status did not change.
pub fn conditions_to_write(
    desired: &[Desired],
    generation: Option<i64>,
    existing: &[Condition],
    now: Timestamp,
) -> Vec<Condition> {
    desired
        .iter()
        .map(|d| {
            let last_transition_time = existing
                .iter()
                .find(|c| c.type_ == d.type_ && c.status == d.status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or(Time(now));
            Condition {
                type_: d.type_.clone(),
                status: d.status.to_owned(),
                reason: d.reason.clone(),
                message: d.message.clone(),
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
}

/// Every condition of one object: translation's, then `Programmed`.
pub fn desired(verdict: &ObjectVerdict, dataplanes: &Dataplanes) -> Vec<Desired> {
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

/// Reads an object's current status (from the reflector stores).
pub type ExistingStatus = Arc<dyn Fn(ObjectKind, &str, &str) -> Option<ApisixStatus> + Send + Sync>;

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

type Key = (ObjectKind, String, String);

/// Writes status while `leader` is true, whenever translation or the fleet (what the
/// dataplanes serve, which of them should) change what an object's status should say.
/// Waits for the fleet's watches to list once first, so a new leader never writes from a
/// partial view. Runs until the rebuild output's sender is dropped.
pub async fn run(
    client: Client,
    hub: Arc<Hub>,
    fleet: FleetView,
    mut rebuilt: watch::Receiver<Option<Arc<Rebuilt>>>,
    mut leader: watch::Receiver<bool>,
    existing: ExistingStatus,
    metrics: Metrics,
) {
    fleet.synced().await;
    let mut dataplanes = fleet.subscribe();
    // What we wrote last, so a write is not repeated before the watch shows it.
    let mut written: HashMap<Key, ApisixStatus> = HashMap::new();
    // Re-checks now and then, so a failed write is retried even when nothing changes.
    let mut resync = tokio::time::interval(RESYNC_INTERVAL);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // The stores have caught up by now: compare with them only.
            _ = resync.tick() => written.clear(),
            r = rebuilt.changed() => if r.is_err() { return },
            r = dataplanes.changed() => if r.is_err() { return },
            r = leader.changed() => {
                if r.is_err() { return }
                written.clear();
            },
        }
        // Batch bursts of ACKs (one per dataplane per snapshot).
        tokio::time::sleep(Duration::from_millis(250)).await;
        // NB: mark every input seen, or `changed()` would fire again at once.
        dataplanes.borrow_and_update();
        let out = rebuilt.borrow_and_update().clone();
        if !*leader.borrow_and_update() {
            continue;
        }
        let Some(out) = out else {
            continue;
        };
        let now_fleet = fleet.fleet();
        let counted = Dataplanes {
            counted: now_fleet.resolve(|hash| hub.version_of(hash)),
            why_none: now_fleet.why_none(),
        };
        metrics
            .expected_dataplanes
            .set(i64::try_from(counted.counted.len()).unwrap_or(i64::MAX));
        let now = Timestamp::now();
        let mut todo = Vec::new();
        for verdict in &out.objects {
            let s = &verdict.status;
            let key = (s.kind, s.namespace.clone(), s.name.clone());
            let want = desired(verdict, &counted);
            let current = existing(s.kind, &s.namespace, &s.name);
            let Some(status) = status_to_write(&want, s.generation, current.as_ref(), now) else {
                continue;
            };
            let same_as_written = written
                .get(&key)
                .is_some_and(|w| status_to_write(&want, s.generation, Some(w), now).is_none());
            if !same_as_written {
                todo.push((key, status));
            }
        }
        if todo.is_empty() {
            continue;
        }
        tracing::debug!(
            objects = todo.len(),
            version = out.version,
            "writing status"
        );
        let results: Vec<(Key, ApisixStatus, Result<(), kube::Error>)> =
            futures::stream::iter(todo.into_iter().map(|(key, status)| {
                let client = client.clone();
                async move {
                    let r = write(&client, key.0, &key.1, &key.2, &status).await;
                    (key, status, r)
                }
            }))
            .buffer_unordered(8)
            .collect()
            .await;
        for (key, status, result) in results {
            match result {
                Ok(()) => {
                    metrics.status_writes.inc();
                    written.insert(key, status);
                }
                // Deleted meanwhile: nothing to report on.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    metrics
                        .reconcile_errors
                        .with_label_values(&["status"])
                        .inc();
                    tracing::warn!(kind = %key.0, namespace = %key.1, name = %key.2, error = %e, "status write failed");
                }
            }
        }
        // Objects that are gone no longer need remembering.
        written.retain(|k, _| {
            out.objects
                .iter()
                .any(|v| v.status.kind == k.0 && v.status.namespace == k.1 && v.status.name == k.2)
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::fleet::Rejection;
    use sluice_translate::{ObjectStatus, status};

    fn verdict(accepted: bool, since: u64) -> ObjectVerdict {
        let c = if accepted {
            sluice_translate::Condition {
                type_: status::CONDITION_ACCEPTED.into(),
                status: ConditionStatus::True,
                reason: status::REASON_ACCEPTED.into(),
                message: "ok".into(),
            }
        } else {
            sluice_translate::Condition {
                type_: status::CONDITION_ACCEPTED.into(),
                status: ConditionStatus::False,
                reason: status::REASON_INVALID_SPEC.into(),
                message: "spec.http[0].match.paths[0]: bad".into(),
            }
        };
        ObjectVerdict {
            status: ObjectStatus {
                kind: ObjectKind::ApisixRoute,
                namespace: "default".into(),
                name: "r".into(),
                generation: Some(3),
                conditions: vec![c],
                routes: vec!["default/r/a".into()],
            },
            since_version: since,
        }
    }

    /// A dataplane serving our version `serving` (reported as the same number), or none.
    fn dp(id: &str, serving: Option<u64>, nacked: Option<(u64, &str)>) -> Counted {
        Counted {
            id: id.into(),
            serving,
            reported: serving,
            seen: true,
            rejected: nacked.map(|(v, r)| Rejection {
                version: v,
                hash: "h".into(),
                reasons: vec![r.to_string()],
            }),
        }
    }

    fn fleet(counted: Vec<Counted>) -> Dataplanes {
        Dataplanes {
            counted,
            why_none: "no ready endpoint of Service ns/dp names a dataplane".into(),
        }
    }

    #[test]
    fn programmed_counts_dataplanes_that_serve_the_object() {
        let v = verdict(true, 40);
        let all = fleet(vec![
            dp("a", Some(42), None),
            dp("b", Some(40), None),
            dp("c", Some(41), None),
        ]);
        let p = programmed(&v, &all);
        assert_eq!((p.status, p.reason.as_str()), ("True", REASON_PROGRAMMED));
        assert_eq!(p.message, "3/3 dataplanes at v40");

        let unseen = Counted {
            seen: false,
            ..dp("c", None, None)
        };
        let some = fleet(vec![
            dp("a", Some(42), None),
            dp("b", Some(39), None),
            unseen,
        ]);
        let p = programmed(&v, &some);
        assert_eq!((p.status, p.reason.as_str()), ("False", REASON_PENDING));
        assert_eq!(
            p.message,
            "1/3 dataplanes at v40, waiting for: b (at v39), c (not connected)"
        );

        let nack = fleet(vec![
            dp("a", Some(42), None),
            dp("b", Some(39), Some((42, "route x: bad"))),
        ]);
        let p = programmed(&v, &nack);
        assert_eq!(p.reason, REASON_REJECTED);
        assert_eq!(
            p.message,
            "1/2 dataplanes at v40, waiting for: b (rejected v42); dataplane b rejected v42: route x: bad"
        );

        let p = programmed(&v, &fleet(vec![]));
        assert_eq!(
            (p.status, p.reason.as_str()),
            ("False", REASON_NO_DATAPLANES)
        );
        assert_eq!(
            p.message,
            "0/0 dataplanes at v40: no ready endpoint of Service ns/dp names a dataplane"
        );

        let p = programmed(&verdict(false, 42), &all);
        assert_eq!((p.status, p.reason.as_str()), ("False", REASON_INVALID));
    }

    #[test]
    fn content_this_replica_never_published_proves_nothing() {
        // The dataplane reports v45 (another replica's number) for a hash we never
        // published: it may or may not contain the object, so it is waited for.
        let unknown = Counted {
            serving: None,
            reported: Some(45),
            ..dp("b", None, None)
        };
        let p = programmed(
            &verdict(true, 40),
            &fleet(vec![dp("a", Some(41), None), unknown]),
        );
        assert_eq!((p.status, p.reason.as_str()), ("False", REASON_PENDING));
        assert_eq!(p.message, "1/2 dataplanes at v40, waiting for: b (at v45)");
    }

    #[test]
    fn a_long_wait_names_the_first_dataplanes_and_counts_the_rest() {
        let waiting: Vec<Counted> = (0..11)
            .map(|i| dp(&format!("dp-{i:02}"), None, None))
            .collect();
        let p = programmed(&verdict(true, 1), &fleet(waiting));
        assert!(
            p.message
                .starts_with("0/11 dataplanes at v1, waiting for: dp-00 (serves nothing yet), "),
            "{}",
            p.message
        );
        assert!(
            p.message
                .ends_with("dp-07 (serves nothing yet), and 3 more"),
            "{}",
            p.message
        );
    }

    #[test]
    fn the_message_of_an_unchanged_object_does_not_move_with_newer_snapshots() {
        let v = verdict(true, 5);
        let before = programmed(&v, &fleet(vec![dp("a", Some(5), None)]));
        let after = programmed(&v, &fleet(vec![dp("a", Some(90), None)]));
        assert_eq!(before, after);
    }

    #[test]
    fn long_messages_are_cut() {
        let long = "x".repeat(5000);
        let nack = fleet(vec![dp("a", None, Some((1, &long)))]);
        let p = programmed(&verdict(true, 1), &nack);
        assert_eq!(p.message.chars().count(), MAX_MESSAGE_CHARS);
        assert!(p.message.ends_with('…'));
    }

    #[test]
    fn transition_time_is_kept_while_the_status_holds_and_no_op_writes_are_skipped() {
        let t0 = Timestamp::from_second(1_700_000_000).unwrap();
        let t1 = Timestamp::from_second(1_700_000_100).unwrap();
        let v = verdict(true, 1);
        let pending = desired(&v, &fleet(vec![dp("a", None, None)]));
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
        let done = desired(&v, &fleet(vec![dp("a", Some(1), None)]));
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
}
