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
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
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
    body: Bytes,
}

/// An authorization service: a body naming `"tenant":"blocked"` → 403 `tenant blocked`;
/// else `Authorization: Bearer good` → 200 with `X-User-ID: alice` and `X-Internal:
/// yes`; `Bearer slow` → the same after 2 s; `Bearer big` → 403 with a 100 KiB body;
/// anything else → 401 `denied` with `Location`, `WWW-Authenticate` and `X-Internal`.
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
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let blocked = body
        .windows(br#""tenant":"blocked""#.len())
        .any(|w| w == br#""tenant":"blocked""#);
    seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        target: parts.uri.to_string(),
        headers: parts.headers,
        body,
    });
    if blocked {
        return Response::builder()
            .status(403)
            .body(Full::new(Bytes::from_static(b"tenant blocked")))
            .unwrap();
    }
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
    // NB: the slow service allows after 2 s, so the 403 itself says the timeout fired.
    let r = get_with(dp.addr, "/x", &[("authorization", "Bearer slow")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(r.body.is_empty(), "{}", r.text());

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

    // Degraded by the timeout: the client's copies of the service's headers are dropped.
    let (dp, _echo) = serve(json!({
        "uri": auth.uri("/verify"),
        "request_headers": ["Authorization"],
        "upstream_headers": ["X-User-ID", "X-Roles"],
        "timeout": 200,
        "allow_degradation": true,
    }))
    .await;
    let r = get_with(
        dp.addr,
        "/x",
        &[
            ("authorization", "Bearer slow"),
            ("x-user-id", "mallory"),
            ("X-Roles", "admin"),
            ("x-roles", "root"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let h = &r.json()["headers"];
    assert!(h.get("x-user-id").is_none(), "{h}");
    assert!(h.get("x-roles").is_none(), "{h}");
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
    let r = get_with(
        dp.addr,
        "/x",
        &[("x-user-id", "mallory"), ("x-other", "kept")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(from_origin(&r));
    let h = &r.json()["headers"];
    assert!(
        h.get("x-user-id").is_none(),
        "a client-sent upstream header passed while degraded: {h}"
    );
    assert_eq!(h["x-other"], "kept", "only the listed headers are dropped");
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

// ------------------------------------------------------------ request_method: POST

/// Sends `req` (any body: a chunked one has no `content-length`) over HTTP/1.1 on a new
/// connection.
async fn send_any<B>(addr: SocketAddr, req: Request<B>) -> Resp
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let (parts, body) = tx.send_request(req).await.unwrap().into_parts();
    Resp {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// A body of unannounced length (sent chunked).
type Chunked =
    StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// A body of unannounced length (sent chunked) made of `pieces`.
fn chunked(pieces: &[&'static str]) -> Chunked {
    let frames: Vec<_> = pieces
        .iter()
        .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
        .collect();
    StreamBody::new(futures::stream::iter(frames))
}

fn post_req<B>(path: &str, headers: &[(&str, &str)], body: B) -> Request<B> {
    let mut b = Request::post(path).header("host", "example.com");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(body).unwrap()
}

#[tokio::test]
async fn post_sends_the_clients_body_to_the_service_and_the_same_body_upstream() {
    let auth = AuthServer::start().await;
    let (dp, _echo) = serve(json!({
        "uri": auth.uri("/verify"),
        "request_method": "POST",
        "request_headers": ["Authorization", "Content-Type", "Content-Length"],
        "upstream_headers": ["X-User-ID"],
    }))
    .await;
    let body = r#"{"tenant":"acme","items":[1,2,3]}"#;
    let headers = [
        ("authorization", "Bearer good"),
        ("content-type", "application/json"),
        ("content-encoding", "identity"),
    ];
    let r = send_any(
        dp.addr,
        post_req(
            "/orders?x=1",
            &headers,
            Full::new(Bytes::from_static(body.as_bytes())),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let origin = r.json();
    assert_eq!(origin["method"], "POST");
    assert_eq!(origin["body"], body, "the upstream gets the body unchanged");
    assert_eq!(origin["headers"]["content-length"], body.len().to_string());
    assert_eq!(origin["headers"]["x-user-id"], "alice");

    let seen = auth.last();
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.target, "/verify");
    assert_eq!(
        seen.body,
        body.as_bytes(),
        "the service gets the client's body"
    );
    let s = &seen.headers;
    assert_eq!(
        hv(s, "content-length"),
        Some(body.len().to_string().as_str())
    );
    assert_eq!(hv(s, "content-type"), Some("application/json"));
    assert_eq!(hv(s, "content-encoding"), Some("identity"));
    assert_eq!(hv(s, "x-forwarded-method"), Some("POST"));
    assert_eq!(hv(s, "x-forwarded-uri"), Some("/orders?x=1"));
    assert_eq!(hv(s, "authorization"), Some("Bearer good"));

    // A chunked body (no content-length) reaches the service re-framed with its length,
    // and the upstream whole.
    let r = send_any(
        dp.addr,
        post_req(
            "/orders",
            &[("authorization", "Bearer good")],
            chunked(&[r#"{"tenant":"#, r#""acme","#, r#""n":2}"#]),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["body"], r#"{"tenant":"acme","n":2}"#);
    let seen = auth.last();
    assert_eq!(seen.body, r#"{"tenant":"acme","n":2}"#.as_bytes());
    assert_eq!(hv(&seen.headers, "content-length"), Some("23"));
    assert_eq!(hv(&seen.headers, "transfer-encoding"), None);

    // The service decides on the body: its denial goes to the client, the upstream is not
    // reached.
    let r = send_any(
        dp.addr,
        post_req(
            "/orders",
            &[("authorization", "Bearer good")],
            Full::new(Bytes::from_static(br#"{"tenant":"blocked"}"#)),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.text(), "tenant blocked");

    // A request without a body: the service still gets a POST, without one.
    let r = get_with(dp.addr, "/orders", &[("authorization", "Bearer good")]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let seen = auth.last();
    assert_eq!(seen.method, "POST");
    assert!(seen.body.is_empty());
    assert_eq!(auth.asked(), 4);
}

#[tokio::test]
async fn post_body_over_the_cap_is_413_and_the_service_is_not_asked() {
    let auth = AuthServer::start().await;
    let (dp, _echo) = serve(json!({
        "uri": auth.uri("/verify"),
        "request_method": "POST",
        "request_headers": ["Authorization"],
        "max_req_body_size": 16,
    }))
    .await;
    let too_large = |r: &Resp| {
        assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.text());
        assert_eq!(
            r.json(),
            json!({"error_msg": "413 Request Entity Too Large"})
        );
    };
    let good = [("authorization", "Bearer good")];
    // Announced (content-length) and unannounced (chunked) lengths.
    let r = send_any(
        dp.addr,
        post_req("/x", &good, Full::new(Bytes::from_static(&[b'a'; 17]))),
    )
    .await;
    too_large(&r);
    let r = send_any(
        dp.addr,
        post_req("/x", &good, chunked(&["0123456789", "0123456789"])),
    )
    .await;
    too_large(&r);
    assert_eq!(auth.asked(), 0);
    // At the cap, it goes through.
    let r = send_any(
        dp.addr,
        post_req("/x", &good, chunked(&["01234567", "89abcdef"])),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["body"], "0123456789abcdef");
    assert_eq!(auth.last().body, "0123456789abcdef".as_bytes());
}

/// A body whose pieces the test releases one by one (chunked).
fn gated() -> (
    futures::channel::mpsc::UnboundedSender<Bytes>,
    impl http_body::Body<Data = Bytes, Error = Infallible> + Send + 'static,
) {
    use futures::StreamExt as _;
    let (tx, rx) = futures::channel::mpsc::unbounded::<Bytes>();
    (
        tx,
        StreamBody::new(rx.map(|b| Ok::<_, Infallible>(Frame::data(b)))),
    )
}

/// Waits until the service has been asked `n` times (at most 5 s).
async fn asked(auth: &AuthServer, n: usize) {
    assert!(
        eventually(Duration::from_secs(5), || auth.asked() >= n).await,
        "the service was asked {} times, not {n}",
        auth.asked()
    );
}

#[tokio::test]
async fn get_neither_reads_nor_forwards_the_body_but_post_waits_for_it() {
    // GET (with a cap that would refuse this body if it applied): the service is asked while
    // the client's body is still coming, gets no body, and the upstream gets all of it.
    let auth = AuthServer::start().await;
    let (dp, _echo) = serve(json!({
        "uri": auth.uri("/verify"),
        "request_headers": ["Authorization"],
        "max_req_body_size": 4,
    }))
    .await;
    let (tx, body) = gated();
    let client = spawn_post_up(dp.addr, body);
    tx.unbounded_send(Bytes::from_static(b"first piece, "))
        .unwrap();
    asked(&auth, 1).await;
    let seen = auth.last();
    assert_eq!(seen.method, "GET");
    assert!(seen.body.is_empty(), "{:?}", seen.body);
    assert_eq!(hv(&seen.headers, "content-length"), None);
    assert_eq!(hv(&seen.headers, "transfer-encoding"), None);
    tx.unbounded_send(Bytes::from_static(b"second piece"))
        .unwrap();
    drop(tx);
    let r = client.await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["body"], "first piece, second piece");

    // POST: the service is asked only once the whole body is in.
    let auth = AuthServer::start().await;
    let (dp, _echo) = serve(json!({
        "uri": auth.uri("/verify"),
        "request_method": "POST",
        "request_headers": ["Authorization"],
    }))
    .await;
    let (tx, body) = gated();
    let client = spawn_post_up(dp.addr, body);
    tx.unbounded_send(Bytes::from_static(b"first piece, "))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(auth.asked(), 0, "asked before the body was in");
    tx.unbounded_send(Bytes::from_static(b"second piece"))
        .unwrap();
    drop(tx);
    let r = client.await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["body"], "first piece, second piece");
    assert_eq!(auth.last().body, "first piece, second piece".as_bytes());
}

/// An authorized `POST /up` with `body`, sent from a task of its own (the test feeds the
/// body piece by piece meanwhile).
fn spawn_post_up<B>(addr: SocketAddr, body: B) -> tokio::task::JoinHandle<Resp>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::spawn(async move {
        send_any(
            addr,
            post_req("/up", &[("authorization", "Bearer good")], body),
        )
        .await
    })
}
