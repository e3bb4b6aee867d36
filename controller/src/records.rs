//! How replicas share what their dataplanes serve: each replica writes one small Lease, its
//! *record*, and every replica watches all of them; the leader merges them into the
//! [`Fleet`] that `Programmed` is computed from.
//!
//! ```text
//! hub ─(connect, Hello, ACK, NACK, disconnect)─▶ track_local ─▶ local Record ─┬─▶ write ─▶ Lease <lease>-<identity>
//!                                                                             │             labels {sluice.dev/replica-of: <lease>}
//!                                                                             │             annotations {sluice.dev/dataplanes: JSON}
//! watch Leases labelled sluice.dev/replica-of=<lease> ─▶ other replicas' Records ┴─▶ FleetView::fleet() ─▶ status writer
//! watch EndpointSlices of --dataplane-service ─▶ expected ids ─────────────────────┘
//! ```
//!
//! Why Leases written by each replica, rather than forwarding ACKs to the leader or having
//! dataplanes report to every replica: the records outlive any one replica (a new leader
//! knows at once what every dataplane serves, with no round of reconnects), they need no
//! replica-to-replica channel (no extra certificates, nothing to discover), a dataplane
//! keeps dialling one Service, and they are `kubectl get lease` away when debugging. A
//! record is written 100 ms after a change and renewed every [`HEARTBEAT`]; it is small
//! (one line per dataplane the replica served, capped at [`MAX_DATAPLANES`]).
//!
//! A record is never deleted when its replica stops: what it says of a dataplane stays true
//! until that dataplane opens a newer stream elsewhere (it serves its last snapshot while
//! away from every controller). The leader deletes records not renewed for [`GC_AFTER`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::fleet::{self, Expected, Fleet, Observation, Record};
use crate::grpc::{Answer, Hub};
use crate::metrics::Metrics;
use crate::status::FIELD_MANAGER;
use crate::watch::{Trigger, spawn_watch_by};

/// Label on every record: the name of the leader-election Lease the replicas share.
pub const RECORD_LABEL: &str = "sluice.dev/replica-of";
/// Annotation holding a record's JSON ([`Record`]).
pub const RECORD_ANNOTATION: &str = "sluice.dev/dataplanes";
/// How often a replica renews its record without a change.
pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// A record not renewed for this long is stale: its replica is gone or cut off. Without
/// `--dataplane-service` the dataplanes of stale records are no longer counted.
pub const TTL: Duration = Duration::from_secs(15);
/// The leader deletes records not renewed for this long.
pub const GC_AFTER: Duration = Duration::from_secs(600);
/// How long a replica keeps reporting a dataplane after its stream ended.
pub const RETAIN_DEPARTED: Duration = Duration::from_secs(600);
/// Most dataplanes in one record (connected ones first); keeps the annotation far below
/// the API server's 256 KiB limit.
pub const MAX_DATAPLANES: usize = 500;
/// Longest NACK reason kept in a record, in characters (at most 4 reasons).
pub const MAX_REASON_CHARS: usize = 256;
/// Longest wait for the fleet's watches before the status writer starts anyway.
pub const SYNC_LIMIT: Duration = Duration::from_secs(10);
/// Wait after a change before writing, so a burst of ACKs makes one write.
const WRITE_DEBOUNCE: Duration = Duration::from_millis(100);

/// Where a replica's record lives and whose it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordConfig {
    /// Namespace of the records (the leader-election Lease's).
    pub namespace: String,
    /// Name of the leader-election Lease; records are labelled with it.
    pub lease_name: String,
    /// This replica's identity.
    pub identity: String,
}

impl RecordConfig {
    /// The name of this replica's record: `<lease>-<identity>`, made a valid object name.
    pub fn record_name(&self) -> String {
        let raw = format!("{}-{}", self.lease_name, self.identity).to_ascii_lowercase();
        let mut name: String = raw
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '-'
                }
            })
            .take(253)
            .collect();
        while name.ends_with(['-', '.']) {
            name.pop();
        }
        name
    }
}

/// A record as written: reasons cut to [`MAX_REASON_CHARS`], at most [`MAX_DATAPLANES`]
/// dataplanes (connected ones, then the most recent).
pub fn bounded(record: &Record) -> Record {
    let mut dataplanes = record.dataplanes.clone();
    if dataplanes.len() > MAX_DATAPLANES {
        dataplanes.sort_by_key(|o| std::cmp::Reverse((o.connected, o.connected_at_ms)));
        dataplanes.truncate(MAX_DATAPLANES);
        dataplanes.sort_by(|a, b| a.id.cmp(&b.id));
    }
    for o in &mut dataplanes {
        if let Some(r) = o.rejected.as_mut() {
            r.reasons.truncate(4);
            for reason in &mut r.reasons {
                if reason.chars().count() > MAX_REASON_CHARS {
                    *reason = reason.chars().take(MAX_REASON_CHARS - 1).collect();
                    reason.push('…');
                }
            }
        }
    }
    Record {
        dataplanes,
        ..record.clone()
    }
}

/// The record in a Lease, with the Lease's renew time; `None` if it carries none.
pub fn parse(lease: &Lease) -> Option<(Record, Option<Timestamp>)> {
    let json = lease
        .metadata
        .annotations
        .as_ref()?
        .get(RECORD_ANNOTATION)?;
    let record: Record = serde_json::from_str(json).ok()?;
    let renewed = lease
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0);
    Some((record, renewed))
}

/// Whether a record renewed at `renewed` is older than `age` at `now`.
fn older_than(renewed: Option<Timestamp>, age: Duration, now: Timestamp) -> bool {
    let age = SignedDuration::try_from(age).unwrap_or(SignedDuration::MAX);
    renewed.is_none_or(|t| t.saturating_add(age).is_ok_and(|end| end < now))
}

/// The memory of one replica's dataplanes: its open streams, plus streams that ended in
/// the last [`RETAIN_DEPARTED`] (what those dataplanes serve until they open a newer one).
#[derive(Debug, Default)]
pub struct Tracker {
    seen: BTreeMap<String, (Observation, Option<Instant>)>,
}

impl Tracker {
    /// Seeds the memory with a record this replica wrote before it restarted: its
    /// dataplanes, as departed now (they redial; until then they serve what it says).
    pub fn seed(&mut self, previous: &Record, now: Instant) {
        for o in &previous.dataplanes {
            let departed = Observation {
                connected: false,
                ..o.clone()
            };
            self.seen.insert(o.id.clone(), (departed, Some(now)));
        }
    }

    /// Updates the memory with the hub's open streams at `now`; returns every dataplane to
    /// report, sorted by id.
    pub fn update(
        &mut self,
        open: BTreeMap<String, Observation>,
        now: Instant,
    ) -> Vec<Observation> {
        for (id, (obs, departed)) in &mut self.seen {
            if obs.connected && !open.contains_key(id) {
                obs.connected = false;
                *departed = Some(now);
            }
        }
        for (id, obs) in open {
            self.seen.insert(id, (obs, None));
        }
        self.seen.retain(|_, (_, departed)| {
            departed.is_none_or(|t| now.saturating_duration_since(t) < RETAIN_DEPARTED)
        });
        self.seen.values().map(|(o, _)| o.clone()).collect()
    }
}

/// Keeps `local` up to date with what this replica's hub publishes and serves, firing
/// `changed` on every change. With `previous` (the records store and where this replica's
/// record lives), it first seeds the memory from the record this replica wrote before a
/// restart. `local` stays `None` until then.
pub async fn track_local(
    hub: Arc<Hub>,
    identity: String,
    previous: Option<(Store<Lease>, RecordConfig)>,
    local: watch::Sender<Option<Arc<Record>>>,
    changed: Trigger,
) {
    let mut tracker = Tracker::default();
    if let Some((store, cfg)) = previous {
        // NB: bounded: a replica that cannot list its records still serves and reports.
        let _ = tokio::time::timeout(Duration::from_secs(5), store.wait_until_ready()).await;
        let key = ObjectRef::new(&cfg.record_name()).within(&cfg.namespace);
        if let Some(lease) = store.get(&key)
            && let Some((record, _)) = parse(&lease)
        {
            tracing::info!(
                dataplanes = record.dataplanes.len(),
                "resuming this replica's record of dataplanes"
            );
            tracker.seed(&record, Instant::now());
        }
    }
    let mut streams = hub.subscribe_dataplanes();
    let mut published = hub.subscribe();
    let mut prune = tokio::time::interval(Duration::from_secs(30));
    prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        streams.borrow_and_update();
        published.borrow_and_update();
        let record = Record {
            replica: identity.clone(),
            published: hub.current().map(|p| Answer {
                version: p.snapshot.version,
                hash: p.snapshot.hash.clone(),
            }),
            dataplanes: tracker.update(fleet::observe(&hub.dataplanes()), Instant::now()),
        };
        let modified = local.send_if_modified(|cur| {
            if cur.as_deref() == Some(&record) {
                false
            } else {
                *cur = Some(Arc::new(record));
                true
            }
        });
        if modified {
            changed.fire();
        }
        tokio::select! {
            r = streams.changed() => if r.is_err() { return },
            r = published.changed() => if r.is_err() { return },
            _ = prune.tick() => {}
        }
    }
}

/// Writes this replica's record (server-side apply) 100 ms after each change of `local`
/// and every [`HEARTBEAT`]. A failed write is logged and retried at the next one.
pub async fn write(
    client: Client,
    cfg: RecordConfig,
    mut local: watch::Receiver<Option<Arc<Record>>>,
    metrics: Metrics,
) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let name = cfg.record_name();
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            r = local.changed() => {
                if r.is_err() { return }
                tokio::time::sleep(WRITE_DEBOUNCE).await;
            }
            _ = heartbeat.tick() => {}
        }
        let Some(record) = local.borrow_and_update().clone() else {
            continue;
        };
        let json = match serde_json::to_string(&bounded(&record)) {
            Ok(j) => j,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode this replica's record");
                continue;
            }
        };
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(cfg.namespace.clone()),
                labels: Some([(RECORD_LABEL.to_owned(), cfg.lease_name.clone())].into()),
                annotations: Some([(RECORD_ANNOTATION.to_owned(), json)].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(i32::try_from(TTL.as_secs()).unwrap_or(15)),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..Default::default()
            }),
        };
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match api.patch(&name, &params, &Patch::Apply(&lease)).await {
            Ok(_) => {
                if failing {
                    tracing::info!(record = %name, "writing this replica's record works again");
                }
                failing = false;
            }
            Err(e) => {
                metrics
                    .reconcile_errors
                    .with_label_values(&["record"])
                    .inc();
                if !failing {
                    tracing::warn!(record = %name, error = %e, "cannot write this replica's record of dataplanes; retrying");
                }
                failing = true;
            }
        }
    }
}

/// Fingerprint of a record for change detection: its content, not its renew time (a
/// heartbeat changes nothing the status writer sees).
fn record_fingerprint(lease: &Lease) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RECORD_ANNOTATION))
        .hash(&mut h);
    h.finish()
}

/// Watches every replica's record (Leases labelled [`RECORD_LABEL`]`=<lease>`).
pub fn watch_records(
    client: &Client,
    cfg: &RecordConfig,
    changed: &Trigger,
    metrics: &Metrics,
) -> Store<Lease> {
    spawn_watch_by(
        Api::namespaced(client.clone(), &cfg.namespace),
        watcher::Config::default().labels(&format!("{RECORD_LABEL}={}", cfg.lease_name)),
        "ReplicaRecord",
        record_fingerprint,
        changed.clone(),
        metrics.clone(),
    )
}

/// Watches the EndpointSlices of the dataplane Service `namespace/name`.
pub fn watch_dataplane_service(
    client: &Client,
    namespace: &str,
    name: &str,
    changed: &Trigger,
    metrics: &Metrics,
) -> Store<EndpointSlice> {
    spawn_watch_by(
        Api::namespaced(client.clone(), namespace),
        watcher::Config::default()
            .labels(&format!("{}={name}", sluice_translate::SERVICE_NAME_LABEL)),
        "DataplaneEndpointSlice",
        crate::watch::fingerprint::<EndpointSlice>,
        changed.clone(),
        metrics.clone(),
    )
}

/// Deletes, while this replica leads, the records not renewed for [`GC_AFTER`].
pub async fn collect_garbage(
    client: Client,
    cfg: RecordConfig,
    records: Store<Lease>,
    mut leader: watch::Receiver<bool>,
    metrics: Metrics,
) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !*leader.borrow_and_update() {
            continue;
        }
        let now = Timestamp::now();
        for lease in records.state() {
            let renewed = lease
                .spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0);
            let Some(name) = lease.metadata.name.as_deref() else {
                continue;
            };
            if !older_than(renewed, GC_AFTER, now) || name == cfg.record_name() {
                continue;
            }
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {
                    tracing::info!(record = %name, "deleted the record of a replica gone for good")
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    metrics
                        .reconcile_errors
                        .with_label_values(&["record"])
                        .inc();
                    tracing::warn!(record = %name, error = %e, "cannot delete a stale record");
                }
            }
        }
    }
}

/// Everything the status writer needs to know about the fleet, kept current by watches:
/// this replica's own record, the other replicas' records and the dataplane Service's
/// EndpointSlices.
#[derive(Clone)]
pub struct FleetView {
    identity: Option<String>,
    local: watch::Receiver<Option<Arc<Record>>>,
    records: Option<Store<Lease>>,
    service: Option<(String, String, Store<EndpointSlice>)>,
    changes: watch::Receiver<u64>,
}

impl std::fmt::Debug for FleetView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetView")
            .field("identity", &self.identity)
            .field("service", &self.service.as_ref().map(|(ns, n, _)| (ns, n)))
            .finish_non_exhaustive()
    }
}

impl FleetView {
    /// A view of this replica's `local` record plus, when given, the other replicas'
    /// `records` (this replica's own, under `identity`, is skipped) and the dataplane
    /// Service `(namespace, name, slices)`. `changes` fires when any of them changes.
    pub fn new(
        identity: Option<String>,
        local: watch::Receiver<Option<Arc<Record>>>,
        records: Option<Store<Lease>>,
        service: Option<(String, String, Store<EndpointSlice>)>,
        changes: watch::Receiver<u64>,
    ) -> Self {
        Self {
            identity,
            local,
            records,
            service,
            changes,
        }
    }

    /// A receiver that changes whenever the fleet may have changed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// Resolves once this replica's record exists and the watches have listed once, or
    /// after [`SYNC_LIMIT`] (then a watch that cannot list, e.g. for lack of RBAC, is
    /// logged; the status writer goes on with what it has, which can only make it wait for
    /// dataplanes it does not see, never count ones it does not know).
    pub async fn synced(&self) {
        let mut local = self.local.clone();
        let _ = local.wait_for(Option::is_some).await;
        if let Some(records) = &self.records
            && tokio::time::timeout(SYNC_LIMIT, records.wait_until_ready())
                .await
                .is_err()
        {
            tracing::warn!(
                "the other replicas' records are not listed yet (RBAC: list/watch on leases?); Programmed waits for their dataplanes"
            );
        }
        if let Some((ns, name, slices)) = &self.service
            && tokio::time::timeout(SYNC_LIMIT, slices.wait_until_ready())
                .await
                .is_err()
        {
            tracing::warn!(service = %format!("{ns}/{name}"), "the dataplane Service's EndpointSlices are not listed yet; Programmed counts no dataplane until they are");
        }
    }

    /// The other replicas' records with their renew times.
    pub fn other_records(&self) -> Vec<(Record, Option<Timestamp>)> {
        let Some(store) = &self.records else {
            return Vec::new();
        };
        let mut out: Vec<(Record, Option<Timestamp>)> = store
            .state()
            .iter()
            .filter(|l| {
                l.spec.as_ref().and_then(|s| s.holder_identity.as_deref())
                    != self.identity.as_deref()
            })
            .filter_map(|l| parse(l))
            .collect();
        out.sort_by(|a, b| a.0.replica.cmp(&b.0.replica));
        out
    }

    /// The fleet now.
    pub fn fleet(&self) -> Fleet {
        let now = Timestamp::now();
        let expected = match &self.service {
            Some((ns, name, slices)) => Expected::Service {
                service: format!("{ns}/{name}"),
                ids: fleet::expected_ids(&slices.state()),
            },
            None => Expected::Connected,
        };
        let mut records: Vec<Record> = self
            .other_records()
            .into_iter()
            // NB: with an expected set, a stale record still says what its dataplanes serve
            // (until a newer stream says otherwise); without one, only live replicas'
            // dataplanes count as connected.
            .filter(|(_, renewed)| {
                matches!(expected, Expected::Service { .. }) || !older_than(*renewed, TTL, now)
            })
            .map(|(r, _)| r)
            .collect();
        if let Some(local) = self.local.borrow().as_deref() {
            records.push(local.clone());
        }
        Fleet {
            expected,
            dataplanes: fleet::merge(&records),
        }
    }
}

/// Feeds the other replicas' published versions into `hub`'s version clock whenever the
/// records change (see [`Hub::next_version`]).
pub async fn feed_clock(hub: Arc<Hub>, view: FleetView) {
    let mut changes = view.subscribe();
    loop {
        let records = view.other_records();
        let max_served = records
            .iter()
            .flat_map(|(r, _)| r.dataplanes.iter())
            .filter_map(|o| o.serving.as_ref().map(|a| a.version))
            .max()
            .unwrap_or(0);
        hub.observe_version(max_served);
        hub.observe_replicas(
            records
                .into_iter()
                .filter_map(|(r, _)| r.published.map(|a| (a.hash, a.version))),
        );
        if changes.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::fleet::Rejection;

    fn obs(id: &str, at: u64, connected: bool) -> Observation {
        Observation {
            id: id.into(),
            connected,
            connected_at_ms: at,
            serving: Some(Answer {
                version: 1,
                hash: "h".into(),
            }),
            rejected: None,
        }
    }

    #[test]
    fn record_names_are_valid_object_names() {
        let cfg = RecordConfig {
            namespace: "ns".into(),
            lease_name: "sluice-controller".into(),
            identity: "Ctl_0.".into(),
        };
        assert_eq!(cfg.record_name(), "sluice-controller-ctl-0");
    }

    #[test]
    fn departed_dataplanes_are_reported_as_away_then_forgotten() {
        let t0 = Instant::now();
        let mut tracker = Tracker::default();
        let open = |ids: &[&str]| -> BTreeMap<String, Observation> {
            ids.iter()
                .map(|id| ((*id).to_owned(), obs(id, 1, true)))
                .collect()
        };
        let all = tracker.update(open(&["a", "b"]), t0);
        assert!(all.iter().all(|o| o.connected));
        let all = tracker.update(open(&["b"]), t0 + Duration::from_secs(1));
        assert_eq!(all.len(), 2);
        assert!(!all[0].connected && all[0].id == "a", "{all:?}");
        assert_eq!(
            all[0].serving,
            obs("a", 1, true).serving,
            "a departed dataplane still serves what it served"
        );
        let later = t0 + RETAIN_DEPARTED + Duration::from_secs(2);
        let all = tracker.update(open(&["b"]), later);
        assert_eq!(all.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn a_restarted_replica_resumes_its_record_as_departed() {
        let mut tracker = Tracker::default();
        let previous = Record {
            replica: "ctl-0".into(),
            published: None,
            dataplanes: vec![obs("a", 5, true)],
        };
        let now = Instant::now();
        tracker.seed(&previous, now);
        let all = tracker.update(BTreeMap::new(), now);
        assert_eq!(all.len(), 1);
        assert!(!all[0].connected);
        // It reconnects: the new stream replaces the old observation.
        let all = tracker.update([("a".to_owned(), obs("a", 9, true))].into(), now);
        assert_eq!((all[0].connected, all[0].connected_at_ms), (true, 9));
    }

    #[test]
    fn records_are_bounded() {
        let mut many: Vec<Observation> = (0..MAX_DATAPLANES + 10)
            .map(|i| obs(&format!("dp-{i:04}"), i as u64, i % 2 == 0))
            .collect();
        many[0].rejected = Some(Rejection {
            version: 2,
            hash: "x".into(),
            reasons: vec!["é".repeat(1000); 9],
        });
        let record = bounded(&Record {
            replica: "r".into(),
            published: None,
            dataplanes: many,
        });
        assert_eq!(record.dataplanes.len(), MAX_DATAPLANES);
        let connected = record.dataplanes.iter().filter(|o| o.connected).count();
        assert_eq!(
            connected,
            (MAX_DATAPLANES + 10).div_ceil(2),
            "connected ones kept"
        );
        let reasons = &record.dataplanes[0].rejected.as_ref().unwrap().reasons;
        assert_eq!(reasons.len(), 4);
        assert_eq!(reasons[0].chars().count(), MAX_REASON_CHARS);
        let json = serde_json::to_string(&record).unwrap();
        assert!(json.len() < 200 * 1024, "{} bytes", json.len());
    }

    #[test]
    fn a_record_round_trips_through_a_lease() {
        let record = Record {
            replica: "ctl-0".into(),
            published: Some(Answer {
                version: 4,
                hash: "abc".into(),
            }),
            dataplanes: vec![obs("a", 5, true)],
        };
        let lease = Lease {
            metadata: ObjectMeta {
                annotations: Some(
                    [(
                        RECORD_ANNOTATION.to_owned(),
                        serde_json::to_string(&record).unwrap(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(Timestamp::from_second(1_700_000_000).unwrap())),
                ..Default::default()
            }),
        };
        let (back, renewed) = parse(&lease).unwrap();
        assert_eq!(back, record);
        let renewed = renewed.unwrap();
        let now = Timestamp::from_second(1_700_000_010).unwrap();
        assert!(!older_than(Some(renewed), TTL, now));
        assert!(older_than(Some(renewed), Duration::from_secs(5), now));
        assert!(older_than(None, TTL, now));
    }
}
