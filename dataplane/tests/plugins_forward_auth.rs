//! forward-auth against a real in-process authorization service: what the service
//! receives, what the origin receives, what the client observes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use sluice_testkit::EchoServer;

/// What the authorization service saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    headers: HeaderMap,
}

/// An authorization service: `Authorization: Bearer good` → 200 with `X-User-ID: alice`
/// and `X-Internal: yes`; `Bearer slow` → the same after 2 s; `Bearer big` → 403 with a
/// 100 KiB body; anything else → 401 `denied` with `Location`, `WWW-Authenticate` and
/// `X-Internal`.
struct AuthServer {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AuthServer {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (s, c) = (Arc::clone(&seen), Arc::clone(&connections));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                c.fetch_add(1, Ordering::SeqCst);
                let s = Arc::clone(&s);
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let s = Arc::clone(&s);
                        async move { Ok::<_, Infallible>(answer(req, &s).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        AuthServer {
            addr,
            seen,
            connections,
            task,
        }
    }

    fn uri(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn last(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("the service was asked")
    }

    fn asked(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

async fn answer(
    req: Request<hyper::body::Incoming>,
    seen: &Mutex<Vec<Seen>>,
) -> Response<Full<Bytes>> {
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    seen.lock().unwrap().push(Seen {
        method: req.method().to_string(),
        target: req.uri().to_string(),
        headers: req.headers().clone(),
    });
    let allow = || {
        Response::builder()
            .status(200)
            .header("x-user-id", "alice")
            .header("x-internal", "yes")
            .body(Full::new(Bytes::from_static(b"ok")))
            .unwrap()
    };
    match auth.as_str() {
        "Bearer good" => allow(),
        "Bearer slow" => {
            tokio::time::sleep(Duration::from_secs(2)).await;
            allow()
        }
        "Bearer big" => Response::builder()
            .status(403)
            .body(Full::new(Bytes::from(vec![b'x'; 100 * 1024])))
            .unwrap(),
        _ => Response::builder()
            .status(401)
            .header("location", "https://login.example.com/")
            .header("www-authenticate", "Bearer realm=\"x\"")
            .header("x-internal", "secret")
            .body(Full::new(Bytes::from_static(b"denied")))
            .unwrap(),
    }
}

/// A dataplane with route `/*` to an echo origin, forward-auth configured as `conf`.
async fn serve(conf: serde_json::Value) -> (Dataplane, EchoServer) {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let snap = snapshot(
        1,
        vec![route_with(
            "default/r/p",
            &["/*"],
            "u",
            vec![plugin("forward-auth", conf)],
        )],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    dp.store.apply(snap, vec![]).unwrap();
    (dp, echo)
}

fn from_origin(r: &Resp) -> bool {
    serde_json::from_slice::<serde_json::Value>(&r.body).is_ok_and(|v| v.get("path").is_some())
}

fn hv<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn allowed_request_carries_the_services_headers_upstream() {
    let auth = AuthServer::start().await;
    let (dp, _echo) = serve(json!({
        "uri": auth.uri("/verify?check=1"),
        "request_headers": ["Authorization", "X-Forwarded-Host"],
        "upstream_headers": ["X-User-ID", "X-Missing"],
    }))
    .await;
    let r = request(
        dp.addr,
        "DELETE",
        "/api/items?id=3",
        &[
            ("authorization", "Bearer good"),
            ("x-user-id", "mallory"),
            ("x-missing", "injected"),
            ("x-forwarded-host", "evil.example"),
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-uri", "/admin"),
            ("cookie", "session=1"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(from_origin(&r), "{}", r.text());
    let origin = r.json();
    let h = &origin["headers"];
    assert_eq!(origin["method"], "DELETE");
    assert_eq!(
        h["x-user-id"], "alice",
        "the service's value replaces the client's"
    );
    assert!(
        h.get("x-missing").is_none(),
        "absent in the answer → removed: {h}"
    );
    assert!(
        h.get("x-internal").is_none(),
        "not listed → not copied: {h}"
    );
    assert_eq!(h["authorization"], "Bearer good");

    // What the service received: Sluice's X-Forwarded-* (the client cannot forge them,
    // even when listed), the listed headers, nothing else of the client's.
    let seen = auth.last();
    assert_eq!(seen.method, "GET");
    assert_eq!(seen.target, "/verify?check=1");
    let s = &seen.headers;
    assert_eq!(hv(s, "host"), Some(auth.addr.to_string().as_str()));
    assert_eq!(hv(s, "x-forwarded-proto"), Some("http"));
    assert_eq!(hv(s, "x-forwarded-method"), Some("DELETE"));
    assert_eq!(hv(s, "x-forwarded-host"), Some("example.com"));
    assert_eq!(hv(s, "x-forwarded-uri"), Some("/api/items?id=3"));
    assert_eq!(hv(s, "x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(s.get_all("x-forwarded-host").iter().count(), 1);
    assert_eq!(hv(s, "authorization"), Some("Bearer good"));
    assert!(s.get("cookie").is_none(), "{s:?}");
    assert!(s.get("x-user-id").is_none(), "{s:?}");
}

#[tokio::test]
async fn denied_request_gets_the_services_status_body_and_client_headers() {
    let auth = AuthServer::start().await;
    let (dp, _echo) = serve(json!({
        "uri": auth.uri("/verify"),
        "request_headers": ["Authorization"],
        "client_headers": ["Location", "WWW-Authenticate"],
    }))
    .await;
    let r = get_with(dp.addr, "/private", &[("authorization", "Bearer wrong")]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.text(), "denied");
    assert_eq!(h(&r, "location"), Some("https://login.example.com/"));
    assert_eq!(h(&r, "www-authenticate"), Some("Bearer realm=\"x\""));
    assert_eq!(h(&r, "x-internal"), None, "not in client_headers");
    assert_eq!(auth.asked(), 1);

    // A large denial body is cut at 64 KiB.
    let r = get_with(dp.addr, "/private", &[("authorization", "Bearer big")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.body.len(), 64 * 1024);
    // ... and the next request still works (that connection was not reused).
    let r = get_with(dp.addr, "/private", &[("authorization", "Bearer good")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(from_origin(&r));
}

#[tokio::test]
async fn a_slow_service_is_an_error_after_the_timeout() {
    let auth = AuthServer::start().await;
    let (dp, _echo) = serve(json!({
        "uri": auth.uri("/verify"),
        "request_headers": ["Authorization"],
        "timeout": 200,
    }))
    .await;
    let started = std::time::Instant::now();
    let r = get_with(dp.addr, "/x", &[("authorization", "Bearer slow")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(r.body.is_empty(), "{}", r.text());
    assert!(started.elapsed() < Duration::from_millis(1900));

    let (dp, _echo) = serve(json!({
        "uri": auth.uri("/verify"),
        "request_headers": ["Authorization"],
        "timeout": 200,
        "status_on_error": 503,
    }))
    .await;
    let r = get_with(dp.addr, "/x", &[("authorization", "Bearer slow")]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);

    let (dp, _echo) = serve(json!({
        "uri": auth.uri("/verify"),
        "request_headers": ["Authorization"],
        "timeout": 200,
        "allow_degradation": true,
    }))
    .await;
    let r = get_with(dp.addr, "/x", &[("authorization", "Bearer slow")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(from_origin(&r));
}

#[tokio::test]
async fn an_unreachable_service_denies_or_degrades() {
    let down = closed_port();
    let (dp, _echo) = serve(json!({"uri": format!("http://{down}/verify")})).await;
    let r = get(dp.addr, "example.com", "/x").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(!from_origin(&r));

    let (dp, _echo) = serve(json!({
        "uri": format!("http://{down}/verify"),
        "allow_degradation": true,
        "upstream_headers": ["X-User-ID"],
    }))
    .await;
    let r = get_with(dp.addr, "/x", &[("x-user-id", "mallory")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(from_origin(&r));
}

#[tokio::test]
async fn connections_to_the_service_are_kept_alive() {
    let auth = AuthServer::start().await;
    let (dp, _echo) = serve(json!({
        "uri": auth.uri("/verify"),
        "request_headers": ["Authorization"],
    }))
    .await;
    for _ in 0..3 {
        let r = get_with(dp.addr, "/x", &[("authorization", "Bearer good")]).await;
        assert_eq!(r.status, StatusCode::OK);
        let r = get_with(dp.addr, "/x", &[("authorization", "nope")]).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(auth.asked(), 6);
    assert_eq!(auth.connections.load(Ordering::SeqCst), 1);

    let auth = AuthServer::start().await;
    let (dp, _echo) = serve(json!({
        "uri": auth.uri("/verify"),
        "request_headers": ["Authorization"],
        "keepalive": false,
    }))
    .await;
    for _ in 0..3 {
        let r = get_with(dp.addr, "/x", &[("authorization", "Bearer good")]).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    assert_eq!(auth.connections.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn post_to_the_service_is_refused_when_the_snapshot_compiles() {
    let dp = dataplane().await;
    let snap = snapshot(
        1,
        vec![route_with(
            "default/r/p",
            &["/*"],
            "u",
            vec![plugin(
                "forward-auth",
                json!({"uri": "http://127.0.0.1:1/", "request_method": "POST"}),
            )],
        )],
        vec![upstream("u", &[("127.0.0.1:9".parse().unwrap(), 1)])],
    );
    let e = dp.store.apply(snap, vec![]).unwrap_err().to_string();
    assert!(e.contains("request_method: POST"), "{e}");
}
