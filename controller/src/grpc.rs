//! The controller side of the snapshot channel: a [`Hub`] that holds the current sealed
//! snapshot in a `tokio::sync::watch`, serves it to every dataplane stream (on connect and on
//! every change) and records what each dataplane acknowledged or rejected.
//!
//! ```text
//! rebuild loop ──publish──▶ Hub { watch<Published> } ──▶ stream 1 ──▶ dataplane a ──ACK v7──┐
//!                                 │                  └─▶ stream 2 ──▶ dataplane b ──NACK v7─┤
//!                                 └── dataplanes: id, sent, acked, nacked ◀──────────────────┘
//! ```
//!
//! A slow dataplane only ever gets the newest snapshot: the watch channel coalesces versions
//! it had no time to receive.
//!
//! Every controller replica runs a hub and serves any dataplane (translation is
//! deterministic, so replicas that saw the same cluster offer the same content hash). The
//! hub also remembers which content hash it published under which version (for the status
//! writer, which compares what dataplanes serve by hash), and keeps version numbers roughly
//! comparable across replicas with a Lamport clock: see [`Hub::next_version`].

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use futures::Stream;
use sluice_proto::v1::snapshot_service_server::{SnapshotService, SnapshotServiceServer};
use sluice_proto::v1::{self, dataplane_message};
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

use crate::metrics::Metrics;

/// How often the server pings an idle stream, so a dataplane that vanished without closing
/// its connection is dropped within about `KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT`.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long the server waits for a ping answer before dropping the connection.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// A snapshot as offered to dataplanes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Published {
    /// The sealed snapshot (`version` and `hash` set).
    pub snapshot: v1::Snapshot,
    /// Objects left out of it, with their reasons (shown by the dataplanes' `/snapshot`).
    pub rejected_objects: Vec<String>,
}

/// How many published (hash, version) pairs a hub remembers for [`Hub::version_of`].
pub const HISTORY: usize = 4096;

/// A version a dataplane answered for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Answer {
    /// Snapshot version.
    pub version: u64,
    /// Snapshot content hash.
    pub hash: String,
}

/// What the controller knows about one connected dataplane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataplaneInfo {
    /// Connection number, unique within this process.
    pub conn: u64,
    /// The id from the dataplane's `Hello` (e.g. its pod name); the peer address until then.
    pub id: String,
    /// Whether the dataplane sent its `Hello` (until then `id` is only the peer address).
    pub said_hello: bool,
    /// Remote address of the stream.
    pub peer: Option<SocketAddr>,
    /// When the stream opened.
    pub connected_at: SystemTime,
    /// What the dataplane said it served when it connected (`Hello.version`, `Hello.hash`).
    pub serving_at_connect: Option<Answer>,
    /// The last snapshot sent on this stream.
    pub sent: Option<Answer>,
    /// The last snapshot the dataplane acknowledged (it serves this one).
    pub acked: Option<Answer>,
    /// The last snapshot the dataplane rejected, with its reasons; cleared by a later ACK.
    pub nacked: Option<(Answer, Vec<String>)>,
}

/// Shared state of the snapshot channel: the current snapshot and the connected dataplanes.
#[derive(Debug)]
pub struct Hub {
    current: watch::Sender<Option<Arc<Published>>>,
    dataplanes: Mutex<BTreeMap<u64, DataplaneInfo>>,
    next_conn: AtomicU64,
    changes: watch::Sender<u64>,
    serving: watch::Sender<bool>,
    /// Refuse streams while no snapshot was published (see [`Hub::refuse_until_published`]).
    gated: AtomicBool,
    history: Mutex<History>,
    clock: Mutex<Clock>,
    metrics: Metrics,
}

/// The (hash, version) pairs this hub published, newest [`HISTORY`] of them.
#[derive(Debug, Default)]
struct History {
    by_version: BTreeMap<u64, String>,
    by_hash: HashMap<String, u64>,
}

impl History {
    fn insert(&mut self, hash: &str, version: u64) {
        if let Some(old) = self.by_hash.insert(hash.to_owned(), version) {
            self.by_version.remove(&old);
        }
        self.by_version.insert(version, hash.to_owned());
        while self.by_version.len() > HISTORY {
            let Some((v, h)) = self.by_version.pop_first() else {
                break;
            };
            if self.by_hash.get(&h) == Some(&v) {
                self.by_hash.remove(&h);
            }
        }
    }
}

/// What this replica knows of other replicas' versions.
#[derive(Debug, Default)]
struct Clock {
    /// The highest version seen anywhere: published by a replica, or served by a dataplane.
    max_seen: u64,
    /// The snapshot each other replica publishes now: hash -> version.
    others: HashMap<String, u64>,
}

impl Hub {
    /// A hub with no snapshot yet: dataplanes that connect now wait for the first one.
    pub fn new(metrics: Metrics) -> Arc<Self> {
        Arc::new(Self {
            current: watch::Sender::new(None),
            dataplanes: Mutex::new(BTreeMap::new()),
            next_conn: AtomicU64::new(1),
            changes: watch::Sender::new(0),
            serving: watch::Sender::new(true),
            gated: AtomicBool::new(false),
            history: Mutex::new(History::default()),
            clock: Mutex::new(Clock::default()),
            metrics,
        })
    }

    /// Refuses streams with UNAVAILABLE until the first snapshot is published, instead of
    /// holding them open until then: a replica whose caches have not synced yet sends a
    /// dataplane on to another replica (the controller does this; a bare hub holds them).
    pub fn refuse_until_published(&self) {
        self.gated.store(true, Ordering::Relaxed);
    }

    /// The version to seal new content `hash` with, after this replica's last version
    /// `last`: a Lamport clock over the replicas. If another replica publishes the same
    /// content under a higher version, that version (so the same content carries the same
    /// number on every replica); else one more than the highest version seen anywhere (so a
    /// dataplane that moves to another replica sees its version grow, not jump back).
    /// Never `last` or below.
    pub fn next_version(&self, hash: &str, last: u64) -> u64 {
        let clock = lock(&self.clock);
        match clock.others.get(hash) {
            Some(&v) if v > last => v,
            _ => clock.max_seen.max(last).saturating_add(1),
        }
    }

    /// Records the snapshots other replicas publish now, as `(hash, version)` pairs (from
    /// their records), for [`Hub::next_version`].
    pub fn observe_replicas(&self, published: impl IntoIterator<Item = (String, u64)>) {
        let mut clock = lock(&self.clock);
        clock.others = published.into_iter().collect();
        let top = clock.others.values().copied().max().unwrap_or(0);
        clock.max_seen = clock.max_seen.max(top);
    }

    /// Records a version seen elsewhere (e.g. what a dataplane serves), for
    /// [`Hub::next_version`].
    pub fn observe_version(&self, version: u64) {
        let mut clock = lock(&self.clock);
        clock.max_seen = clock.max_seen.max(version);
    }

    /// The version under which this hub last published content `hash`, if it did among its
    /// last [`HISTORY`] publications. A dataplane serving `hash` serves exactly what this
    /// replica published as that version.
    pub fn version_of(&self, hash: &str) -> Option<u64> {
        lock(&self.history).by_hash.get(hash).copied()
    }

    /// Makes `published` the current snapshot and sends it to every connected dataplane.
    pub fn publish(&self, published: Published) {
        self.metrics
            .snapshot_version
            .set(i64::try_from(published.snapshot.version).unwrap_or(i64::MAX));
        tracing::info!(
            version = published.snapshot.version,
            hash = %published.snapshot.hash,
            routes = published.snapshot.routes.len(),
            upstreams = published.snapshot.upstreams.len(),
            "snapshot published"
        );
        lock(&self.history).insert(&published.snapshot.hash, published.snapshot.version);
        self.observe_version(published.snapshot.version);
        self.current.send_replace(Some(Arc::new(published)));
    }

    /// The current snapshot, if one was published.
    pub fn current(&self) -> Option<Arc<Published>> {
        self.current.borrow().clone()
    }

    /// A receiver of the current snapshot, changed on every publish.
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<Published>>> {
        self.current.subscribe()
    }

    /// Ends every snapshot stream (dataplanes redial, e.g. to another replica) and refuses
    /// new ones. [`serve`] calls it when shutting down.
    pub fn close(&self) {
        self.set_serving(false);
    }

    /// Whether dataplane streams are accepted (default: yes). `false` ends every open stream
    /// and refuses new ones with UNAVAILABLE, so dataplanes redial to another replica (the
    /// controller does this when it shuts down).
    pub fn set_serving(&self, serving: bool) {
        self.serving
            .send_if_modified(|s| std::mem::replace(s, serving) != serving);
    }

    /// The connected dataplanes, by connection number.
    pub fn dataplanes(&self) -> Vec<DataplaneInfo> {
        self.lock().values().cloned().collect()
    }

    /// A receiver that changes whenever a dataplane connects, disconnects, ACKs or NACKs.
    pub fn subscribe_dataplanes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The tonic service to add to a server.
    pub fn service(self: &Arc<Self>) -> SnapshotServiceServer<SnapshotServer> {
        SnapshotServiceServer::new(SnapshotServer {
            hub: Arc::clone(self),
        })
        .max_decoding_message_size(sluice_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(sluice_proto::MAX_MESSAGE_BYTES)
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, DataplaneInfo>> {
        lock(&self.dataplanes)
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn connect(self: &Arc<Self>, peer: Option<SocketAddr>) -> Connection {
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let id = peer.map_or_else(|| format!("conn-{conn}"), |p| p.to_string());
        self.lock().insert(
            conn,
            DataplaneInfo {
                conn,
                id,
                said_hello: false,
                peer,
                connected_at: SystemTime::now(),
                serving_at_connect: None,
                sent: None,
                acked: None,
                nacked: None,
            },
        );
        self.metrics.connected_dataplanes.inc();
        tracing::info!(conn, peer = ?peer, "dataplane connected");
        self.changed();
        Connection {
            hub: Arc::clone(self),
            conn,
        }
    }

    fn update(&self, conn: u64, f: impl FnOnce(&mut DataplaneInfo)) {
        if let Some(info) = self.lock().get_mut(&conn) {
            f(info);
        }
        self.changed();
    }

    fn on_message(&self, conn: u64, msg: v1::DataplaneMessage) {
        match msg.kind {
            Some(dataplane_message::Kind::Hello(h)) => {
                tracing::info!(conn, id = %h.dataplane_id, version = h.version, hash = %h.hash, "dataplane hello");
                self.observe_version(h.version);
                self.update(conn, |i| {
                    if !h.dataplane_id.is_empty() {
                        i.id = h.dataplane_id;
                    }
                    i.said_hello = true;
                    i.serving_at_connect =
                        (h.version != 0 || !h.hash.is_empty()).then_some(Answer {
                            version: h.version,
                            hash: h.hash,
                        });
                });
            }
            Some(dataplane_message::Kind::Ack(a)) => {
                self.metrics.acks.inc();
                tracing::debug!(conn, version = a.version, "dataplane ACK");
                self.update(conn, |i| {
                    if i.nacked
                        .as_ref()
                        .is_some_and(|(n, _)| n.version <= a.version)
                    {
                        i.nacked = None;
                    }
                    i.acked = Some(Answer {
                        version: a.version,
                        hash: a.hash,
                    });
                });
            }
            Some(dataplane_message::Kind::Nack(n)) => {
                self.metrics.nacks.inc();
                tracing::warn!(conn, version = n.version, reasons = ?n.reasons, "dataplane rejected a snapshot (NACK)");
                self.update(conn, |i| {
                    i.nacked = Some((
                        Answer {
                            version: n.version,
                            hash: n.hash,
                        },
                        n.reasons,
                    ));
                });
            }
            None => tracing::debug!(conn, "empty message from a dataplane ignored"),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Unregisters a dataplane when its stream ends.
struct Connection {
    hub: Arc<Hub>,
    conn: u64,
}

impl Drop for Connection {
    fn drop(&mut self) {
        let info = self.hub.lock().remove(&self.conn);
        self.hub.metrics.connected_dataplanes.dec();
        if let Some(info) = info {
            tracing::info!(conn = self.conn, id = %info.id, "dataplane disconnected");
        }
        self.hub.changed();
    }
}

/// The gRPC service implementation; create it with [`Hub::service`].
#[derive(Debug)]
pub struct SnapshotServer {
    hub: Arc<Hub>,
}

/// The stream of snapshots sent to one dataplane.
pub type SnapshotStream = Pin<Box<dyn Stream<Item = Result<v1::ControllerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl SnapshotService for SnapshotServer {
    type StreamStream = SnapshotStream;

    async fn stream(
        &self,
        request: Request<Streaming<v1::DataplaneMessage>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        if !*self.hub.serving.borrow() {
            return Err(Status::unavailable(
                "this controller replica is shutting down",
            ));
        }
        if self.hub.gated.load(Ordering::Relaxed) && self.hub.current.borrow().is_none() {
            return Err(Status::unavailable(
                "this controller replica has no snapshot yet (its caches have not synced)",
            ));
        }
        let peer = request.remote_addr();
        let mut inbound = request.into_inner();
        let connection = Arc::new(self.hub.connect(peer));
        let conn = connection.conn;

        let hub = Arc::clone(&self.hub);
        let guard = Arc::clone(&connection);
        tokio::spawn(async move {
            // NB: the guard lives as long as the dataplane's half of the stream; when it
            // ends (disconnect, reset, keepalive timeout) the dataplane is unregistered.
            let _guard = guard;
            loop {
                match inbound.message().await {
                    Ok(Some(msg)) => hub.on_message(conn, msg),
                    Ok(None) => break,
                    Err(status) => {
                        tracing::info!(conn, error = %status, "dataplane stream ended");
                        break;
                    }
                }
            }
        });

        let rx = self.hub.current.subscribe();
        let serving = self.hub.serving.subscribe();
        let hub = Arc::clone(&self.hub);
        let outbound = futures::stream::unfold(
            (rx, serving, true, connection),
            move |(mut rx, mut serving, first, connection)| {
                let hub = Arc::clone(&hub);
                async move {
                    // The first item is whatever is current (if any); then every change.
                    let mut check_now = first;
                    loop {
                        if !check_now {
                            tokio::select! {
                                changed = rx.changed() => if changed.is_err() {
                                    return None;
                                },
                                // No longer serving (or the hub gone): end the stream.
                                _ = serving.wait_for(|s| !*s) => return None,
                            }
                        }
                        if !*serving.borrow() {
                            return None;
                        }
                        check_now = false;
                        let current = rx.borrow_and_update().clone();
                        if let Some(p) = current {
                            let version = p.snapshot.version;
                            let hash = p.snapshot.hash.clone();
                            hub.update(connection.conn, |i| {
                                i.sent = Some(Answer { version, hash });
                            });
                            let msg = v1::ControllerMessage {
                                snapshot: Some(p.snapshot.clone()),
                                rejected_objects: p.rejected_objects.clone(),
                                delta: None,
                            };
                            return Some((Ok(msg), (rx, serving, false, connection)));
                        }
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(outbound)))
    }
}

/// Why the gRPC server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The TLS configuration was refused.
    #[error("gRPC TLS configuration: {0}")]
    Tls(#[source] tonic::transport::Error),
    /// The server failed.
    #[error("gRPC server: {0}")]
    Serve(#[source] tonic::transport::Error),
}

/// Serves the snapshot channel on `listener` until `shutdown` completes, then ends every
/// stream ([`Hub::close`]) and waits for the connections to close. With `tls`, every client
/// must present a certificate signed by the configured CA (mutual TLS).
pub async fn serve(
    hub: Arc<Hub>,
    listener: tokio::net::TcpListener,
    tls: Option<ServerTlsConfig>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let mut builder = Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .tcp_nodelay(true);
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).map_err(ServeError::Tls)?;
    }
    builder
        .add_service(hub.service())
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), async move {
            shutdown.await;
            hub.close();
        })
        .await
        .map_err(ServeError::Serve)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn published(version: u64, hash: &str) -> Published {
        Published {
            snapshot: v1::Snapshot {
                version,
                hash: hash.into(),
                ..Default::default()
            },
            rejected_objects: Vec::new(),
        }
    }

    #[test]
    fn versions_follow_the_other_replicas_and_never_go_back() {
        let hub = Hub::new(Metrics::new().unwrap());
        assert_eq!(hub.next_version("a", 0), 1, "alone: 1, 2, 3...");
        hub.observe_replicas([("b".to_owned(), 7)]);
        assert_eq!(
            hub.next_version("b", 1),
            7,
            "content another replica publishes keeps its number"
        );
        assert_eq!(
            hub.next_version("c", 1),
            8,
            "new content: above every version seen"
        );
        assert_eq!(
            hub.next_version("b", 9),
            10,
            "never at or below our own last version"
        );
        hub.observe_version(40);
        assert_eq!(
            hub.next_version("d", 10),
            41,
            "what a dataplane serves counts too"
        );
    }

    #[test]
    fn published_hashes_map_to_their_latest_version_within_the_history() {
        let hub = Hub::new(Metrics::new().unwrap());
        hub.publish(published(1, "a"));
        hub.publish(published(2, "b"));
        hub.publish(published(3, "a"));
        assert_eq!(hub.version_of("a"), Some(3));
        assert_eq!(hub.version_of("b"), Some(2));
        assert_eq!(hub.version_of("never"), None);
        for v in 4..(4 + HISTORY as u64) {
            hub.publish(published(v, &format!("h{v}")));
        }
        assert_eq!(
            hub.version_of("b"),
            None,
            "forgotten after {HISTORY} publications"
        );
        assert_eq!(hub.next_version("x", 0), 4 + HISTORY as u64);
    }
}
