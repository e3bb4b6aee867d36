//! The `Programmed` condition, the one place it is decided: how many of the dataplanes
//! that should serve an object (the expected set, see [`crate::fleet`]) serve a snapshot
//! that contains the object as it is now.
//!
//! - Apisix kinds: e.g. `True` / `AllDataplanesProgrammed` / `3/3 dataplanes at v42`, or
//!   `False` / `Pending` / `1/3 dataplanes at v42, waiting for: dp-b (at v41), dp-c (not
//!   connected)`, `False` / `Rejected` naming the dataplane and its NACK reason, `False` /
//!   `NoDataplanes`, `False` / `Invalid` when the object is not accepted.
//! - Gateways and their listeners: translation's `Programmed=True` (valid and in the
//!   snapshot) becomes `True` / `Programmed` only once every expected dataplane serves the
//!   Gateway's routes and certificates as they are now; until then `False` / `Pending`
//!   with the same message.
//!
//! `v42` is the first version that contains the object as it is now (a dataplane at v42 or
//! later serves it), not the latest version: so the message of an unchanged object stays
//! the same while other objects change, and its status is not rewritten on every snapshot.
//!
//! Dataplanes are served by every replica, so they are compared by content hash, which is
//! the same on every replica for the same content: a dataplane serves the object when the
//! hash it serves is one this replica published as v42 or later. A hash this replica never
//! published (another replica saw an intermediate state this one skipped) proves nothing,
//! so that dataplane counts as waiting until it serves content this replica knows: status
//! may lag, it never claims more than it can show.

use sluice_crds::CONDITION_PROGRAMMED;
use sluice_translate::gateway as gw;
use sluice_translate::status::ConditionStatus;

use super::{Desired, from_translation, truncate};
use crate::context::Context;
use crate::fleet::Counted;
use crate::rebuild::ObjectVerdict;

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

/// The counted dataplanes at one moment, as [`programmed`] needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataplanes {
    /// The dataplanes that should serve, resolved against this replica's versions.
    pub counted: Vec<Counted>,
    /// Why none is counted, when none is.
    pub why_none: String,
}

impl Dataplanes {
    /// The expected dataplanes now, resolved against this replica's versions; sets the
    /// `expected_dataplanes` metric.
    pub fn now(ctx: &Context) -> Self {
        let fleet = ctx.fleet.fleet();
        let counted = fleet.resolve(|hash| ctx.hub.version_of(hash));
        ctx.metrics
            .expected_dataplanes
            .set(i64::try_from(counted.len()).unwrap_or(i64::MAX));
        Self {
            counted,
            why_none: fleet.why_none(),
        }
    }
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

/// The `Programmed` condition of an accepted Gateway (or listener) first served at `since`:
/// `True` / `Programmed` once every expected dataplane serves it, else `False` / `Pending`
/// (the Gateway API's reasons; the message says which dataplanes are waited for).
pub fn gateway(since: u64, dataplanes: &Dataplanes) -> Desired {
    let mut d = programmed_since(since, dataplanes);
    d.reason = if d.status == "True" {
        gw::reason::PROGRAMMED
    } else {
        gw::reason::PENDING
    }
    .to_owned();
    d
}

/// Translation's conditions of a Gateway or listener, with a `Programmed=True` (valid and
/// in the snapshot) replaced by the dataplanes' verdict `fleet`.
pub fn gateway_conditions(
    conditions: &[sluice_translate::Condition],
    fleet: &Desired,
) -> Vec<Desired> {
    conditions
        .iter()
        .map(|c| {
            if c.type_ == gw::PROGRAMMED && c.status == ConditionStatus::True {
                fleet.clone()
            } else {
                from_translation(c)
            }
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;
    use crate::fleet::Rejection;
    use crate::status::MAX_MESSAGE_CHARS;
    use sluice_translate::{ObjectKind, ObjectStatus, status};

    pub(crate) fn verdict(accepted: bool, since: u64) -> ObjectVerdict {
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
    pub(crate) fn dp(id: &str, serving: Option<u64>, nacked: Option<(u64, &str)>) -> Counted {
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

    pub(crate) fn fleet(counted: Vec<Counted>) -> Dataplanes {
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
}
