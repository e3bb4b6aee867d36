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

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// A version a dataplane answered for.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    metrics: Metrics,
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
            metrics,
        })
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

    /// Whether dataplane streams are accepted (default: yes). With leader election only the
    /// leader serves: `false` ends every open stream and refuses new ones with UNAVAILABLE,
    /// so dataplanes redial until they reach the leader.
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
        match self.dataplanes.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
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
                self.update(conn, |i| {
                    if !h.dataplane_id.is_empty() {
                        i.id = h.dataplane_id;
                    }
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
                "this controller replica does not serve snapshots (not the leader, or shutting down)",
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
