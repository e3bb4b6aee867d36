//! The dataplane fleet as the status writer sees it: which dataplanes should serve (the
//! expected set) and what each of them serves (observations that every replica shares).
//!
//! ```text
//! replica A: hub ─▶ Record{A: published, dataplanes} ─▶ Lease <lease>-<A> ─┐ watch
//! replica B: hub ─▶ Record{B: published, dataplanes} ─▶ Lease <lease>-<B> ─┤
//!                                                                          ▼
//! leader: merge (per dataplane, the observation of its newest stream wins) ─▶ Fleet
//! dataplane Service ─▶ EndpointSlices ─▶ expected ids (ready, not terminating) ─┘
//! ```
//!
//! Every replica serves dataplanes, so no replica sees them all; each one publishes a
//! [`Record`] of the dataplanes it served (see `records.rs`) and the leader merges them.
//! A dataplane changes what it serves only over a stream, so the observation from its
//! newest stream says what it serves, even after that stream ended: a dataplane keeps
//! serving its last good snapshot while it is away from every controller.
//!
//! This module is the pure part: types, merging, the expected set. No I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::{Deserialize, Serialize};

use crate::grpc::{Answer, DataplaneInfo};

/// A snapshot a dataplane rejected (NACK), with its reasons.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// Version of the rejected snapshot (the numbering of the replica that sent it).
    pub version: u64,
    /// Content hash of the rejected snapshot.
    pub hash: String,
    /// Why, one line per problem.
    pub reasons: Vec<String>,
}

/// One dataplane as one replica saw it on its latest stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    /// The dataplane's id (`--dataplane-id`, by default its pod name).
    pub id: String,
    /// Whether that stream is still open.
    pub connected: bool,
    /// When that stream opened, in milliseconds since the Unix epoch. Of several
    /// observations of one dataplane, the newest stream's is what it serves now.
    pub connected_at_ms: u64,
    /// What the dataplane serves: the last snapshot it acknowledged on that stream, else what
    /// it said it served when the stream opened (`Hello`). `None`: nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<Answer>,
    /// The last snapshot it rejected on that stream, unless it acknowledged a later one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<Rejection>,
}

/// What one controller replica publishes and which dataplanes it served.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The replica's identity (`--identity`, by default its pod name).
    pub replica: String,
    /// The snapshot it offers now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<Answer>,
    /// The dataplanes it served, sorted by id: those connected now, and those whose stream
    /// ended in the last [`RETAIN_DEPARTED`](crate::records::RETAIN_DEPARTED).
    #[serde(default)]
    pub dataplanes: Vec<Observation>,
}

/// Milliseconds since the Unix epoch of `t` (0 before it).
pub fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The observations of a hub's open streams: one per dataplane id (its newest stream), only
/// of streams whose dataplane said `Hello` (before that the id is only a peer address).
pub fn observe(streams: &[DataplaneInfo]) -> BTreeMap<String, Observation> {
    let mut out: BTreeMap<String, Observation> = BTreeMap::new();
    for s in streams.iter().filter(|s| s.said_hello) {
        let obs = Observation {
            id: s.id.clone(),
            connected: true,
            connected_at_ms: epoch_ms(s.connected_at),
            serving: s.acked.clone().or_else(|| s.serving_at_connect.clone()),
            rejected: s.nacked.as_ref().map(|(n, reasons)| Rejection {
                version: n.version,
                hash: n.hash.clone(),
                reasons: reasons.clone(),
            }),
        };
        match out.get(&s.id) {
            Some(seen) if seen.connected_at_ms > obs.connected_at_ms => {}
            _ => {
                out.insert(s.id.clone(), obs);
            }
        }
    }
    out
}

/// Whether `a` is a newer observation of a dataplane than `b`: a later stream, or the same
/// instant and still open.
fn newer(a: &Observation, b: &Observation) -> bool {
    (a.connected_at_ms, a.connected) > (b.connected_at_ms, b.connected)
}

/// Every dataplane's newest observation among `records`.
pub fn merge<'a>(records: impl IntoIterator<Item = &'a Record>) -> BTreeMap<String, Observation> {
    let mut out: BTreeMap<String, Observation> = BTreeMap::new();
    for record in records {
        for obs in &record.dataplanes {
            match out.get(&obs.id) {
                Some(seen) if !newer(obs, seen) => {}
                _ => {
                    out.insert(obs.id.clone(), obs.clone());
                }
            }
        }
    }
    out
}

/// The dataplane id of each endpoint of `slices` that should serve: ready (unset counts as
/// ready, as the API defines it) and not terminating. The id is the endpoint's `targetRef`
/// name (the pod name, which the chart passes to the dataplane as `--dataplane-id`), else
/// its `hostname`, else its first address.
pub fn expected_ids(slices: &[Arc<EndpointSlice>]) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for slice in slices {
        for ep in &slice.endpoints {
            let conditions = ep.conditions.as_ref();
            let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
            let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
            if !ready || terminating {
                continue;
            }
            let id = ep
                .target_ref
                .as_ref()
                .and_then(|r| r.name.clone())
                .or_else(|| ep.hostname.clone())
                .or_else(|| ep.addresses.first().cloned());
            if let Some(id) = id.filter(|i| !i.is_empty()) {
                ids.insert(id);
            }
        }
    }
    ids
}

/// Where the set of dataplanes that should serve comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// The ready, not terminating endpoints of the dataplane Service
    /// (`--dataplane-service`), by id.
    Service {
        /// `namespace/name` of the Service.
        service: String,
        /// The ids of its endpoints that should serve.
        ids: BTreeSet<String>,
    },
    /// No Service given: the dataplanes connected to some replica now (a dataplane that is
    /// away from every replica is not counted).
    Connected,
}

/// A dataplane the status writer counts, resolved against this replica's versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    /// Its id.
    pub id: String,
    /// The version, in this replica's numbering, of the content it serves; `None` when it
    /// serves nothing, or content this replica never published (then whether it contains
    /// an object cannot be told, so it counts as not containing any).
    pub serving: Option<u64>,
    /// The version it reported serving (the numbering of the replica that sent it).
    pub reported: Option<u64>,
    /// Whether we know of a stream to it (open or not); `false` = never seen.
    pub seen: bool,
    /// The snapshot it rejected last, if any.
    pub rejected: Option<Rejection>,
}

/// The fleet at one moment: the expected set and the newest observation of each dataplane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fleet {
    /// Where the expected set comes from.
    pub expected: Expected,
    /// The newest observation of every dataplane any replica reported.
    pub dataplanes: BTreeMap<String, Observation>,
}

impl Fleet {
    /// The dataplanes to count, sorted by id, with what each serves as a version of this
    /// replica (`version_of` maps a content hash to the version under which this replica
    /// published it).
    pub fn resolve(&self, version_of: impl Fn(&str) -> Option<u64>) -> Vec<Counted> {
        let ids: Vec<&String> = match &self.expected {
            Expected::Service { ids, .. } => ids.iter().collect(),
            Expected::Connected => self
                .dataplanes
                .values()
                .filter(|o| o.connected)
                .map(|o| &o.id)
                .collect(),
        };
        ids.into_iter()
            .map(|id| {
                let obs = self.dataplanes.get(id);
                let serving = obs.and_then(|o| o.serving.as_ref());
                Counted {
                    id: id.clone(),
                    serving: serving.and_then(|a| version_of(&a.hash)),
                    reported: serving.map(|a| a.version),
                    seen: obs.is_some(),
                    rejected: obs.and_then(|o| o.rejected.clone()),
                }
            })
            .collect()
    }

    /// Why no dataplane is counted, for the `Programmed` message.
    pub fn why_none(&self) -> String {
        match &self.expected {
            Expected::Service { service, .. } => {
                format!("no ready endpoint of Service {service} names a dataplane")
            }
            Expected::Connected => "no dataplane is connected".to_owned(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};

    use super::*;

    fn answer(version: u64, hash: &str) -> Answer {
        Answer {
            version,
            hash: hash.into(),
        }
    }

    fn obs(id: &str, at: u64, connected: bool, hash: Option<&str>) -> Observation {
        Observation {
            id: id.into(),
            connected,
            connected_at_ms: at,
            serving: hash.map(|h| answer(1, h)),
            rejected: None,
        }
    }

    fn stream(id: &str, at_ms: u64, hello: bool, acked: Option<&str>) -> DataplaneInfo {
        DataplaneInfo {
            conn: at_ms,
            id: id.into(),
            said_hello: hello,
            peer: None,
            connected_at: UNIX_EPOCH + Duration::from_millis(at_ms),
            serving_at_connect: Some(answer(3, "hello")),
            sent: None,
            acked: acked.map(|h| answer(4, h)),
            nacked: None,
        }
    }

    #[test]
    fn a_hub_reports_the_newest_stream_of_each_named_dataplane() {
        let seen = observe(&[
            stream("a", 10, true, Some("h1")),
            stream("a", 20, true, None),
            stream("127.0.0.1:5000", 30, false, None),
        ]);
        assert_eq!(seen.len(), 1, "{seen:?}");
        let a = &seen["a"];
        assert_eq!(a.connected_at_ms, 20);
        assert_eq!(
            a.serving,
            Some(answer(3, "hello")),
            "before its first ACK on a stream, a dataplane serves what its Hello said"
        );
    }

    #[test]
    fn the_newest_stream_wins_across_replicas_even_when_it_ended() {
        let a = Record {
            replica: "ctl-a".into(),
            published: None,
            dataplanes: vec![
                obs("dp-0", 100, true, Some("old")),
                obs("dp-1", 50, true, None),
            ],
        };
        let b = Record {
            replica: "ctl-b".into(),
            published: None,
            dataplanes: vec![obs("dp-0", 200, false, Some("new"))],
        };
        let merged = merge([&a, &b]);
        assert_eq!(merged["dp-0"].serving.as_ref().unwrap().hash, "new");
        assert_eq!(merged["dp-1"].connected_at_ms, 50);
        assert_eq!(merge([&b, &a]), merged, "order does not matter");
    }

    fn endpoint(name: &str, ready: Option<bool>, terminating: Option<bool>) -> Endpoint {
        Endpoint {
            addresses: vec!["192.0.2.1".into()],
            conditions: Some(EndpointConditions {
                ready,
                serving: ready,
                terminating,
            }),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                name: Some(name.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn expected_dataplanes_are_the_ready_endpoints_that_are_not_terminating() {
        let slice = EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: vec![
                endpoint("dp-ready", Some(true), Some(false)),
                endpoint("dp-unset", None, None),
                endpoint("dp-starting", Some(false), None),
                endpoint("dp-leaving", Some(false), Some(true)),
            ],
            ..Default::default()
        };
        let ids = expected_ids(&[Arc::new(slice)]);
        assert_eq!(
            ids.into_iter().collect::<Vec<_>>(),
            ["dp-ready", "dp-unset"]
        );
    }

    #[test]
    fn resolution_maps_hashes_to_our_versions_and_names_the_unseen() {
        let fleet = Fleet {
            expected: Expected::Service {
                service: "ns/dp".into(),
                ids: ["dp-0", "dp-1", "dp-2"].map(String::from).into(),
            },
            dataplanes: [
                ("dp-0".to_owned(), obs("dp-0", 1, true, Some("ours"))),
                ("dp-1".to_owned(), obs("dp-1", 1, false, Some("theirs"))),
                ("dp-9".to_owned(), obs("dp-9", 1, true, Some("ours"))),
            ]
            .into(),
        };
        let counted = fleet.resolve(|h| (h == "ours").then_some(7));
        let brief: Vec<(&str, Option<u64>, bool)> = counted
            .iter()
            .map(|c| (c.id.as_str(), c.serving, c.seen))
            .collect();
        assert_eq!(
            brief,
            [
                ("dp-0", Some(7), true),
                ("dp-1", None, true),
                ("dp-2", None, false)
            ]
        );

        let connected = Fleet {
            expected: Expected::Connected,
            ..fleet
        };
        let ids: Vec<String> = connected
            .resolve(|_| None)
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(ids, ["dp-0", "dp-9"]);
    }
}
