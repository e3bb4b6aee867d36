//! The admin listeners.
//!
//! - `--admin` (default `127.0.0.1:9091`, loopback): `/healthz`, `/readyz`, `/metrics`
//!   and the debug endpoint `/snapshot` (version and hash; `?full=1` adds the snapshot with
//!   every key and credential redacted, [`crate::config::redact`]).
//! - `--status` (off by default; the chart sets it to the pod address for kubelet and
//!   Prometheus): `/healthz`, `/readyz` and `/metrics` only.
//!
//! Both are bounded like the traffic listeners: a request head must arrive within
//! [`HEADER_TIMEOUT`], at most [`MAX_CONNECTIONS`] are open at once (more wait in the
//! kernel's backlog), and a failing `accept` (EMFILE) backs off instead of spinning.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::rt::TokioTimer;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

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
    loop {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let resp = respond(&req, &store, endpoints);
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .max_buf_size(16 * 1024)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(MAX_CONNECTION_AGE, conn).await;
            drop(permit);
        });
    }
}
