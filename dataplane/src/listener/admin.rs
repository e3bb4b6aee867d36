//! The admin listeners.
//!
//! - `--admin` (default `127.0.0.1:9091`, loopback): `/healthz`, `/readyz`, `/metrics`
//!   and the debug endpoint `/snapshot` (version and hash; `?full=1` adds the snapshot with
//!   every key and credential redacted, [`crate::config::redact`]).
//! - `--status` (off by default; the chart sets it to the pod address for kubelet and
//!   Prometheus): `/healthz`, `/readyz` and `/metrics` only.
//!
//! Both are bounded like the traffic listeners: a request head must arrive within
//! [`HEADER_TIMEOUT`], at most [`MAX_CONNECTIONS`] are open at once, and a failing `accept`
//! (EMFILE) backs off instead of spinning. A connection past the limit is not left waiting
//! behind idle ones: the oldest connection not serving a request is closed to make room
//! (only when every one is serving does the newcomer wait in the backlog), so that clients
//! holding idle or silent connections cannot starve kubelet's probes and the dataplane is
//! not restarted for it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::rt::TokioTimer;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};

use crate::config::redact::redacted;
use crate::config::store::Store;

/// Time a client of an admin listener may take to send a request head, on a new or an idle
/// keep-alive connection.
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Most connections an admin listener serves at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Longest life of an admin connection (a keep-alive scraper reconnects).
const MAX_CONNECTION_AGE: std::time::Duration = std::time::Duration::from_secs(300);

/// Which endpoints a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoints {
    /// Probes, metrics and the debug endpoint `/snapshot` (`--admin`).
    All,
    /// Probes and metrics only (`--status`).
    Status,
}

fn text(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    resp
}

/// Answers one admin request.
pub fn respond(
    req: &Request<Incoming>,
    store: &Store,
    endpoints: Endpoints,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "method not allowed\n",
        );
    }
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" => {
            if store.draining() {
                text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining\n")
            } else if store.ready() {
                text(StatusCode::OK, "text/plain", "ready\n")
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "no snapshot loaded yet\n",
                )
            }
        }
        "/snapshot" if endpoints == Endpoints::All => {
            let full = req
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "full=1" || kv == "full=true"));
            let mut doc = serde_json::to_value(store.state()).unwrap_or_default();
            if full && let (Some(snap), Some(obj)) = (store.snapshot(), doc.as_object_mut()) {
                obj.insert(
                    "snapshot".into(),
                    serde_json::to_value(redacted(&snap)).unwrap_or_default(),
                );
            }
            let body = serde_json::to_vec_pretty(&doc).unwrap_or_default();
            text(StatusCode::OK, "application/json", body)
        }
        "/metrics" | "/apisix/prometheus/metrics" => text(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            store.render_metrics(),
        ),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

/// Serves `endpoints` on `listener` until the runtime stops.
pub async fn serve(listener: TcpListener, store: Arc<Store>, endpoints: Endpoints) {
    serve_limited(listener, store, endpoints, HEADER_TIMEOUT, MAX_CONNECTIONS).await;
}

/// One open admin connection, as the listener sees it.
struct Slot {
    /// A request is being answered.
    busy: Arc<AtomicBool>,
    /// Closes the connection.
    close: Arc<Notify>,
}

/// The open connections by age (ids increase), so that the oldest idle one can be closed.
#[derive(Default)]
struct Slots {
    next: u64,
    open: BTreeMap<u64, Slot>,
}

impl Slots {
    /// Closes the oldest connection not serving a request; false when every one is.
    fn evict_idle(&mut self) -> bool {
        let oldest = self
            .open
            .iter()
            .find(|(_, s)| !s.busy.load(Ordering::Acquire))
            .map(|(id, _)| *id);
        match oldest.and_then(|id| self.open.remove(&id)) {
            Some(slot) => {
                slot.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// An answer's body that marks its connection idle again once sent (dropped).
struct Sent {
    body: Full<Bytes>,
    busy: Arc<AtomicBool>,
}

impl Drop for Sent {
    fn drop(&mut self) {
        self.busy.store(false, Ordering::Release);
    }
}

impl http_body::Body for Sent {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Frees its slot when the connection's task ends, however it ends.
struct Release(Arc<Mutex<Slots>>, u64);

impl Drop for Release {
    fn drop(&mut self) {
        sluice_io::lock(&self.0).open.remove(&self.1);
    }
}

/// [`serve`] with other bounds: the time a request head may take, and how many connections
/// are served at once.
pub async fn serve_limited(
    listener: TcpListener,
    store: Arc<Store>,
    endpoints: Endpoints,
    header_timeout: std::time::Duration,
    max_connections: usize,
) {
    let permits = Arc::new(Semaphore::new(max_connections));
    let slots = Arc::new(Mutex::new(Slots::default()));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let permit = match Arc::clone(&permits).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // NB: full: make room by closing the oldest idle connection (its task ends
                // and returns its permit); wait only when every connection is answering.
                sluice_io::lock(&slots).evict_idle();
                let Ok(p) = Arc::clone(&permits).acquire_owned().await else {
                    return;
                };
                p
            }
        };
        let busy = Arc::new(AtomicBool::new(false));
        let close = Arc::new(Notify::new());
        let release = {
            let mut g = sluice_io::lock(&slots);
            let id = g.next;
            g.next += 1;
            g.open.insert(
                id,
                Slot {
                    busy: Arc::clone(&busy),
                    close: Arc::clone(&close),
                },
            );
            Release(Arc::clone(&slots), id)
        };
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                // NB: busy from the head's arrival until the answer's body is sent whole
                // (hyper drops the body then): a large /metrics is never cut by an eviction.
                busy.store(true, Ordering::Release);
                let resp = respond(&req, &store, endpoints).map(|body| Sent {
                    body,
                    busy: Arc::clone(&busy),
                });
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .max_buf_size(16 * 1024)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = tokio::time::timeout(MAX_CONNECTION_AGE, conn) => {}
                () = close.notified() => {}
            }
            drop(release);
            drop(permit);
        });
    }
}
