//! The admin listener: `/healthz`, `/readyz`, `/snapshot` and `/metrics`.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::config::store::Store;

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
pub fn respond(req: &Request<Incoming>, store: &Store) -> Response<Full<Bytes>> {
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
        "/snapshot" => {
            let full = req
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "full=1" || kv == "full=true"));
            let mut doc = serde_json::to_value(store.state()).unwrap_or_default();
            if full && let (Some(snap), Some(obj)) = (store.snapshot(), doc.as_object_mut()) {
                obj.insert(
                    "snapshot".into(),
                    serde_json::to_value(&*snap).unwrap_or_default(),
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

/// Serves the admin endpoints on `listener`.
pub async fn serve(listener: TcpListener, store: Arc<Store>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let resp = respond(&req, &store);
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
