//! The metrics listener (`--metrics-listen`): `/metrics`, `/healthz`, `/readyz`.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::metrics::Metrics;

/// Answers `/readyz`: `Ok(())` when ready, else why not.
pub type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    resp
}

/// Answers one request.
pub fn respond<B>(req: &Request<B>, metrics: &Metrics, ready: &Readiness) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "method not allowed\n".into(),
        );
    }
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => match ready() {
            Ok(()) => text(StatusCode::OK, "text/plain", "ready\n".into()),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("{why}\n"),
            ),
        },
        "/metrics" => text(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            metrics.render(),
        ),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

/// Serves the metrics listener forever.
pub async fn serve(listener: TcpListener, metrics: Metrics, ready: Readiness) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        let ready = Arc::clone(&ready);
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let resp = respond(&req, &metrics, &ready);
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn get(path: &str, metrics: &Metrics, ready: &Readiness) -> Response<Full<Bytes>> {
        respond(&Request::get(path).body(()).unwrap(), metrics, ready)
    }

    #[test]
    fn readyz_follows_readiness_and_metrics_render() {
        let metrics = Metrics::new().unwrap();
        metrics.snapshot_version.set(42);
        let not_ready: Readiness = Arc::new(|| Err("caches not synced yet".into()));
        let ready: Readiness = Arc::new(|| Ok(()));
        assert_eq!(
            get("/readyz", &metrics, &not_ready).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(get("/readyz", &metrics, &ready).status(), StatusCode::OK);
        assert_eq!(
            get("/healthz", &metrics, &not_ready).status(),
            StatusCode::OK
        );
        let m = get("/metrics", &metrics, &ready);
        assert_eq!(m.status(), StatusCode::OK);
        assert_eq!(
            get("/nope", &metrics, &ready).status(),
            StatusCode::NOT_FOUND
        );
    }
}
