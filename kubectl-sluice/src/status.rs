//! `status`: the cluster view of `Programmed`. Which dataplanes serve which snapshot (from
//! the controller replicas' records), and which objects are not `Accepted` or not
//! `Programmed` (from their status, or for Ingresses, which have no conditions, from
//! translating what the controller reads).
//!
//! ```text
//! Leases labelled sluice.dev/replica-of ─▶ records (annotation sluice.dev/dataplanes)
//!        ─▶ newest observation per dataplane ─▶ DATAPLANE / REPLICA / SERVES / STATE
//! Apisix objects' .status.conditions ─┐
//! Ingresses ─▶ translate ─────────────┴─▶ objects not Accepted / not Programmed
//! ```
//!
//! This module is the pure part (records in, report out); `cluster.rs` reads the cluster.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::table::{Table, wrap};

pub use sluice_controller::fleet::{Observation, Record, Rejection};
pub use sluice_controller::grpc::Answer;
pub use sluice_controller::records::{RECORD_ANNOTATION, RECORD_LABEL};

/// A record not renewed for this long is stale (the controller's `records::TTL`).
pub const RECORD_TTL_SECS: i64 = {
    #[allow(clippy::cast_possible_wrap)]
    let secs = sluice_controller::records::TTL.as_secs() as i64;
    secs
};
/// Characters of a snapshot hash shown in text output (JSON/YAML carry the whole hash).
pub const SHORT_HASH: usize = 12;

/// One controller replica, from its record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replica {
    /// Its identity.
    pub name: String,
    /// Where its record lives (`namespace/lease`).
    pub record: String,
    /// The snapshot it publishes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published: Option<Answer>,
    /// Seconds since it last renewed its record; `None` when the record has no renew time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renewed_seconds_ago: Option<i64>,
    /// Not renewed for [`RECORD_TTL_SECS`]: the replica is gone or cut off.
    pub stale: bool,
}

/// ACK or NACK, as a dataplane last answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Answered {
    /// It serves the snapshot its replica publishes.
    #[serde(rename = "ACK")]
    Ack,
    /// It acknowledged an older snapshot than its replica publishes now.
    #[serde(rename = "Behind")]
    Behind,
    /// It rejected the latest snapshot it was sent.
    #[serde(rename = "NACK")]
    Nack,
    /// It has not acknowledged any snapshot.
    #[serde(rename = "None")]
    Nothing,
}

/// One dataplane: its newest observation among every replica's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Dataplane {
    /// Its id (pod name).
    pub name: String,
    /// The replica whose record holds its newest stream.
    pub replica: String,
    /// Whether that stream is open.
    pub connected: bool,
    /// What it serves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serving: Option<Answer>,
    /// Its last answer.
    pub answer: Answered,
    /// The rejected snapshot and why, for a NACK.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected: Option<Rejection>,
}

/// A condition of an object that is not `True` (or missing, or about an older generation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// Kind (`ApisixRoute`, `Ingress`, ...).
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Condition type (`Accepted`, `Programmed`).
    pub condition: String,
    /// `False`, `Unknown`, or `Missing` when the controller wrote none.
    pub status: String,
    /// CamelCase reason.
    pub reason: String,
    /// The condition's message.
    pub message: String,
}

/// An object as `status` checks it: its conditions and generations.
#[derive(Debug, Clone, Default)]
pub struct ObjectConditions {
    /// Kind.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Its conditions (from `.status`, or from translation for an Ingress).
    pub conditions: Vec<Condition>,
    /// The conditions it must have `True`: `Accepted` and `Programmed` for Apisix objects,
    /// `Accepted` for Ingresses (the controller writes no conditions on them).
    pub required: &'static [&'static str],
}

/// Conditions required of an Apisix object.
pub const APISIX_REQUIRED: &[&str] = &["Accepted", "Programmed"];
/// Conditions required of an Ingress (computed by translation; Ingress has no conditions).
pub const INGRESS_REQUIRED: &[&str] = &["Accepted"];

/// The result of `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Controller replicas, by name.
    pub replicas: Vec<Replica>,
    /// Dataplanes, by name.
    pub dataplanes: Vec<Dataplane>,
    /// Objects checked.
    pub objects: usize,
    /// Conditions not `True`, by kind, namespace, name, condition.
    pub problems: Vec<Problem>,
    /// Things `status` could not read (e.g. no RBAC to list Leases); empty normally.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// The record in a Lease with its renew time; `None` without one (or unreadable): the
/// controller's own parser.
pub fn parse_record(lease: &Lease) -> Option<(Record, Option<Timestamp>)> {
    sluice_controller::records::parse(lease)
}

/// Builds the report from the replicas' record Leases and the objects' conditions at `now`.
pub fn report(leases: &[Lease], objects: &[ObjectConditions], now: Timestamp) -> Report {
    let mut replicas = Vec::new();
    // Per dataplane, the newest stream among all records (as the controller's leader
    // merges them): a later stream wins, and at the same instant an open one.
    let mut newest: BTreeMap<String, (Observation, String, Option<Answer>)> = BTreeMap::new();
    for lease in leases {
        let Some((record, renewed)) = parse_record(lease) else {
            continue;
        };
        let ago = renewed.map(|t| now.duration_since(t).as_secs());
        replicas.push(Replica {
            name: record.replica.clone(),
            record: format!(
                "{}/{}",
                lease.metadata.namespace.as_deref().unwrap_or_default(),
                lease.metadata.name.as_deref().unwrap_or_default()
            ),
            published: record.published.clone(),
            renewed_seconds_ago: ago,
            stale: ago.is_none_or(|s| s > RECORD_TTL_SECS),
        });
        for obs in record.dataplanes {
            let newer = newest.get(&obs.id).is_none_or(|(seen, _, _)| {
                (obs.connected_at_ms, obs.connected) > (seen.connected_at_ms, seen.connected)
            });
            if newer {
                newest.insert(
                    obs.id.clone(),
                    (obs, record.replica.clone(), record.published.clone()),
                );
            }
        }
    }
    replicas.sort_by(|a, b| a.name.cmp(&b.name).then(a.record.cmp(&b.record)));
    let dataplanes = newest
        .into_values()
        .map(|(obs, replica, published)| {
            let answer = match (&obs.rejected, &obs.serving) {
                (Some(_), _) => Answered::Nack,
                (None, None) => Answered::Nothing,
                (None, Some(s)) if published.as_ref().is_some_and(|p| p.hash != s.hash) => {
                    Answered::Behind
                }
                (None, Some(_)) => Answered::Ack,
            };
            Dataplane {
                name: obs.id,
                replica,
                connected: obs.connected,
                serving: obs.serving,
                answer,
                rejected: obs.rejected,
            }
        })
        .collect();

    let mut problems = Vec::new();
    for o in objects {
        for &required in o.required {
            let problem = |status: &str, reason: &str, message: String| Problem {
                kind: o.kind.clone(),
                namespace: o.namespace.clone(),
                name: o.name.clone(),
                condition: required.to_owned(),
                status: status.to_owned(),
                reason: reason.to_owned(),
                message,
            };
            match o.conditions.iter().find(|c| c.type_ == required) {
                None => problems.push(problem(
                    "Missing",
                    "NoStatus",
                    "the controller has not written this condition (not running, no \
                     leader, or it does not serve this object's ingress class)"
                        .to_owned(),
                )),
                Some(c) if c.status != "True" => {
                    problems.push(problem(&c.status, &c.reason, c.message.clone()))
                }
                Some(c) => {
                    if let (Some(seen), Some(now)) = (c.observed_generation, o.generation)
                        && seen < now
                    {
                        problems.push(problem(
                            "True",
                            "Outdated",
                            format!(
                                "True for generation {seen}, but the object is at generation \
                                 {now}: the controller has not caught up"
                            ),
                        ));
                    }
                }
            }
        }
    }
    problems.sort_by(|a, b| {
        (&a.kind, &a.namespace, &a.name, &a.condition).cmp(&(
            &b.kind,
            &b.namespace,
            &b.name,
            &b.condition,
        ))
    });
    Report {
        replicas,
        dataplanes,
        objects: objects.len(),
        problems,
        notes: Vec::new(),
    }
}

/// `v42 0123456789ab`, or `-`.
fn short(answer: Option<&Answer>) -> String {
    match answer {
        Some(a) => format!(
            "v{} {}",
            a.version,
            a.hash.chars().take(SHORT_HASH).collect::<String>()
        ),
        None => "-".to_owned(),
    }
}

impl Report {
    /// 0 when every object is `Accepted` and `Programmed` and no dataplane's last answer is
    /// a NACK; 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        let nack = self.dataplanes.iter().any(|d| d.answer == Answered::Nack);
        i32::from(!self.problems.is_empty() || nack)
    }

    /// Text for a terminal: tables that fit 80 columns, details wrapped under their row.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        if self.replicas.is_empty() {
            let text = "No controller records (Leases labelled sluice.dev/replica-of): is the \
                        controller running, with --leader-elect?";
            for line in wrap(text, 80, "") {
                let _ = writeln!(out, "{line}");
            }
        } else {
            let mut t = Table::new(&["REPLICA", "PUBLISHES", "RENEWED"]);
            for r in &self.replicas {
                let renewed = match (r.renewed_seconds_ago, r.stale) {
                    (Some(s), false) => format!("{s}s ago"),
                    (Some(s), true) => format!("{s}s ago (stale)"),
                    (None, _) => "never (stale)".to_owned(),
                };
                t.row(vec![r.name.clone(), short(r.published.as_ref()), renewed]);
            }
            out.push_str(&t.render());
        }
        out.push('\n');
        if self.dataplanes.is_empty() {
            out.push_str("No dataplanes in the records.\n");
        } else {
            let mut t = Table::new(&["DATAPLANE", "REPLICA", "SERVES", "ANSWER"]);
            for d in &self.dataplanes {
                let mut answer = match d.answer {
                    Answered::Ack => "ACK".to_owned(),
                    Answered::Behind => "ACK (behind)".to_owned(),
                    Answered::Nack => match &d.rejected {
                        Some(r) => format!("NACK v{}", r.version),
                        None => "NACK".to_owned(),
                    },
                    Answered::Nothing => "none".to_owned(),
                };
                if !d.connected {
                    answer.push_str(", away");
                }
                let mut details = Vec::new();
                if let Some(r) = &d.rejected {
                    details.extend(r.reasons.iter().cloned());
                }
                t.row_with(
                    vec![
                        d.name.clone(),
                        d.replica.clone(),
                        short(d.serving.as_ref()),
                        answer,
                    ],
                    details,
                );
            }
            out.push_str(&t.render());
        }
        out.push('\n');
        if self.problems.is_empty() {
            let _ = writeln!(
                out,
                "All {} objects are Accepted and Programmed.",
                self.objects
            );
        } else {
            let mut t = Table::new(&["OBJECT", "CONDITION", "REASON"]);
            for p in &self.problems {
                t.row_with(
                    vec![
                        format!("{} {}/{}", p.kind, p.namespace, p.name),
                        format!("{}={}", p.condition, p.status),
                        p.reason.clone(),
                    ],
                    vec![p.message.clone()],
                );
            }
            out.push_str(&t.render());
            let objects: std::collections::BTreeSet<_> = self
                .problems
                .iter()
                .map(|p| (&p.kind, &p.namespace, &p.name))
                .collect();
            let _ = writeln!(
                out,
                "{} of {} objects not Accepted or not Programmed",
                objects.len(),
                self.objects
            );
        }
        for note in &self.notes {
            for line in wrap(&format!("note: {note}"), 80, "  ") {
                let _ = writeln!(out, "{line}");
            }
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};

    fn lease(name: &str, record: &Record, renewed: Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("sluice".into()),
                annotations: Some(
                    [(
                        RECORD_ANNOTATION.to_owned(),
                        serde_json::to_string(record).unwrap(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(renewed)),
                ..Default::default()
            }),
        }
    }

    fn answer(version: u64, hash: &str) -> Option<Answer> {
        Some(Answer {
            version,
            hash: hash.into(),
        })
    }

    fn obs(id: &str, at: u64, serving: Option<Answer>) -> Observation {
        Observation {
            id: id.into(),
            connected: true,
            connected_at_ms: at,
            serving,
            rejected: None,
        }
    }

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: Some(1),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }
    }

    /// A record as the controller writes it (`fleet::Record`'s JSON) parses.
    #[test]
    fn reads_the_controllers_record_format() {
        let json = r#"{"replica":"ctl-0","published":{"version":4,"hash":"abc"},
            "dataplanes":[{"id":"dp-a","connected":true,"connectedAtMs":5,
            "serving":{"version":4,"hash":"abc"}},{"id":"dp-b","connected":false,
            "connectedAtMs":6,"serving":{"version":3,"hash":"old"},
            "rejected":{"version":4,"hash":"abc","reasons":["route x: bad regex"]}}]}"#;
        let record: Record = serde_json::from_str(json).unwrap();
        assert_eq!(record.dataplanes.len(), 2);
        assert_eq!(
            record.dataplanes[1]
                .rejected
                .as_ref()
                .unwrap()
                .reasons
                .len(),
            1
        );
    }

    #[test]
    fn newest_stream_wins_and_answers_are_classified() {
        let now = Timestamp::from_second(1_700_000_100).unwrap();
        let a = Record {
            replica: "ctl-a".into(),
            published: answer(7, "h7"),
            dataplanes: vec![obs("dp-1", 10, answer(6, "h6")), obs("dp-2", 10, None)],
        };
        let mut nacked = obs("dp-1", 20, answer(7, "h7"));
        nacked.rejected = Some(Rejection {
            version: 8,
            hash: "h8".into(),
            reasons: vec!["upstream u: no endpoints".into()],
        });
        let b = Record {
            replica: "ctl-b".into(),
            published: answer(8, "h8"),
            dataplanes: vec![nacked, obs("dp-3", 1, answer(8, "h8"))],
        };
        let leases = [
            lease(
                "sluice-controller-ctl-a",
                &a,
                Timestamp::from_second(1_700_000_000).unwrap(),
            ),
            lease(
                "sluice-controller-ctl-b",
                &b,
                Timestamp::from_second(1_700_000_098).unwrap(),
            ),
        ];
        let r = report(&leases, &[], now);
        let by: BTreeMap<_, _> = r.dataplanes.iter().map(|d| (d.name.as_str(), d)).collect();
        assert_eq!(by["dp-1"].replica, "ctl-b", "the later stream wins");
        assert_eq!(by["dp-1"].answer, Answered::Nack);
        assert_eq!(by["dp-2"].answer, Answered::Nothing);
        assert_eq!(by["dp-3"].answer, Answered::Ack);
        assert!(r.replicas[0].stale && !r.replicas[1].stale);
        assert_eq!(r.exit_code(), 1, "a NACK is not programmed");
        let text = r.render_text();
        assert!(text.contains("NACK v8"), "{text}");
        assert!(text.contains("upstream u: no endpoints"), "{text}");
        assert!(text.contains("v8 h8"), "{text}");
        for line in text.lines() {
            assert!(line.chars().count() <= 80, "{line:?} is wider than 80");
        }
    }

    #[test]
    fn objects_not_accepted_or_not_programmed_are_problems() {
        let objects = [
            ObjectConditions {
                kind: "ApisixRoute".into(),
                namespace: "shop".into(),
                name: "good".into(),
                generation: Some(1),
                conditions: vec![
                    condition("Accepted", "True", "Accepted", ""),
                    condition("Programmed", "True", "AllDataplanesProgrammed", "1/1"),
                ],
                required: APISIX_REQUIRED,
            },
            ObjectConditions {
                kind: "ApisixRoute".into(),
                namespace: "shop".into(),
                name: "broken-with-a-rather-long-name-that-does-not-fit".into(),
                generation: Some(1),
                conditions: vec![
                    condition(
                        "Accepted",
                        "False",
                        "InvalidSpec",
                        "spec.http[0].match.paths[0]: \"static\" must start with \"/\"; \
                         and a long tail so the message has to wrap onto a second line",
                    ),
                    condition("Programmed", "False", "Invalid", "not accepted"),
                ],
                required: APISIX_REQUIRED,
            },
            ObjectConditions {
                kind: "ApisixRoute".into(),
                namespace: "shop".into(),
                name: "new".into(),
                generation: Some(2),
                conditions: vec![condition("Accepted", "True", "Accepted", "")],
                required: APISIX_REQUIRED,
            },
        ];
        let r = report(&[], &objects, Timestamp::UNIX_EPOCH);
        let got: Vec<_> = r
            .problems
            .iter()
            .map(|p| {
                format!(
                    "{}/{} {}={} {}",
                    p.namespace, p.name, p.condition, p.status, p.reason
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                "shop/broken-with-a-rather-long-name-that-does-not-fit Accepted=False InvalidSpec",
                "shop/broken-with-a-rather-long-name-that-does-not-fit Programmed=False Invalid",
                "shop/new Accepted=True Outdated",
                "shop/new Programmed=Missing NoStatus",
            ]
        );
        assert_eq!(r.exit_code(), 1);
        let text = r.render_text();
        assert!(text.contains("must start with"), "{text}");
        assert!(text.contains("2 of 3 objects"), "{text}");
        for line in text.lines() {
            assert!(line.chars().count() <= 80, "{line:?} is wider than 80");
        }
        let ok = report(&[], &objects[..1], Timestamp::UNIX_EPOCH);
        assert_eq!(ok.exit_code(), 0);
        assert!(
            ok.render_text()
                .contains("All 1 objects are Accepted and Programmed.")
        );
    }
}
