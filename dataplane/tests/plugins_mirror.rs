//! proxy-mirror against real in-process servers: an echo origin and a mirror that records
//! what it got (or never answers); what the client observes, what each side received.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
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

/// What the mirror received of one request.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    headers: HeaderMap,
    body: Bytes,
}

/// A mirror service that records each request; with `answer: false` it reads the request
/// and then never answers (holding the connection open).
struct Mirror {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Mirror {
    async fn start(answer: bool) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let s = Arc::clone(&s);
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let s = Arc::clone(&s);
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body.collect().await.unwrap().to_bytes();
                            s.lock().unwrap().push(Seen {
                                method: parts.method.to_string(),
                                target: parts.uri.to_string(),
                                headers: parts.headers,
                                body,
                            });
                            if !answer {
                                std::future::pending::<()>().await;
                            }
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                                b"mirror answer, ignored",
                            ))))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Mirror { addr, seen, task }
    }

    fn host(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Waits (bounded) until the mirror has received `n` requests, and returns them.
    async fn wait_for(&self, n: usize) -> Vec<Seen> {
        eventually(Duration::from_secs(5), || self.count() >= n).await;
        let seen = self.seen.lock().unwrap().clone();
        assert!(
            seen.len() >= n,
            "the mirror got {} of {n} requests",
            seen.len()
        );
        seen
    }
}

/// A dataplane with route `/*` (proxy-mirror `conf`) to an echo origin.
async fn serve(conf: serde_json::Value) -> (Dataplane, EchoServer) {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let snap = snapshot(
        1,
        vec![route_with(
            "default/r/p",
            &["/*"],
            "u",
            vec![plugin("proxy-mirror", conf)],
        )],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    dp.store.apply(snap, vec![]).unwrap();
    (dp, echo)
}

fn post(path: &str, body: &'static [u8], headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::post(path).header("host", "example.com");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::from_static(body))).unwrap()
}

/// `sluice_mirror_*` sample `series` (name with labels) on `/metrics`.
fn mirror_metric(dp: &Dataplane, series: &str) -> f64 {
    sample(&dp.store.render_metrics(), series).unwrap_or_else(|| panic!("no {series}"))
}

/// The sample `series` once it reaches `at_least`, or after 5 s whatever it is.
async fn wait_metric(dp: &Dataplane, series: &str, at_least: f64) -> f64 {
    eventually(Duration::from_secs(5), || {
        mirror_metric(dp, series) >= at_least
    })
    .await;
    mirror_metric(dp, series)
}

#[tokio::test]
async fn the_mirror_gets_a_copy_of_method_target_headers_and_body() {
    let mirror = Mirror::start(true).await;
    let (dp, _echo) = serve(json!({"host": mirror.host()})).await;
    let r = send(
        dp.addr,
        post(
            "/api/items?id=3",
            b"{\"name\":\"x\"}",
            &[("content-type", "application/json"), ("x-trace", "t1")],
        ),
    )
    .await;
    // The client's request reached the origin unchanged.
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let origin = r.json();
    assert_eq!(origin["body"], "{\"name\":\"x\"}");
    assert_eq!(origin["path"], "/api/items");

    let seen = mirror.wait_for(1).await;
    let m = &seen[0];
    assert_eq!(m.method, "POST");
    assert_eq!(m.target, "/api/items?id=3");
    assert_eq!(m.body, "{\"name\":\"x\"}");
    assert_eq!(m.headers["host"], "example.com");
    assert_eq!(m.headers["x-trace"], "t1");
    assert_eq!(m.headers["content-type"], "application/json");
    assert_eq!(m.headers["content-length"], "12");

    // A bodiless GET too.
    let r = get_with(dp.addr, "/plain", &[("x-trace", "t2")]).await;
    assert_eq!(r.status, StatusCode::OK);
    let seen = mirror.wait_for(2).await;
    assert_eq!(seen[1].method, "GET");
    assert_eq!(seen[1].target, "/plain");
    assert!(seen[1].body.is_empty());
    assert_eq!(
        wait_metric(&dp, "sluice_mirror_requests_total{result=\"ok\"}", 2.0).await,
        2.0
    );
}

#[tokio::test]
async fn path_replaces_or_prefixes_the_request_path() {
    let mirror = Mirror::start(true).await;
    let (dp, _echo) = serve(json!({"host": mirror.host(), "path": "/shadow"})).await;
    get_with(dp.addr, "/api?q=1", &[]).await;
    assert_eq!(mirror.wait_for(1).await[0].target, "/shadow?q=1");

    let mirror = Mirror::start(true).await;
    let (dp, _echo) = serve(json!({
        "host": mirror.host(), "path": "/shadow", "path_concat_mode": "prefix"
    }))
    .await;
    get_with(dp.addr, "/api?q=1", &[]).await;
    assert_eq!(mirror.wait_for(1).await[0].target, "/shadow/api?q=1");
}

type Chunks =
    StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// Sends a chunked POST of `n` chunks of `size` bytes over HTTP/1.1.
async fn send_chunked(addr: SocketAddr, path: &str, n: usize, size: usize) -> Resp {
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = (0..n)
        .map(|i| Ok(Frame::data(Bytes::from(vec![b'a' + (i % 26) as u8; size]))))
        .collect();
    let req = Request::post(path)
        .header("host", "example.com")
        .body(StreamBody::new(futures::stream::iter(frames)))
        .unwrap();
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake::<_, Chunks>(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = tx.send_request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    Resp {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

#[tokio::test]
async fn a_streamed_body_is_copied_up_to_the_cap_and_always_reaches_the_upstream_whole() {
    let mirror = Mirror::start(true).await;
    let (dp, _echo) = serve(json!({"host": mirror.host()})).await;

    // Chunked, within the 1 MiB cap: the mirror gets the same bytes, with a length.
    let r = send_chunked(dp.addr, "/up", 4, 1000).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["body_len"], 4000);
    let m = &mirror.wait_for(1).await[0];
    assert_eq!(m.body.len(), 4000);
    assert_eq!(&m.body[..1000], &[b'a'; 1000][..]);
    assert_eq!(&m.body[3000..], &[b'd'; 1000][..]);
    assert_eq!(m.headers["content-length"], "4000");
    assert!(m.headers.get("transfer-encoding").is_none());

    // Chunked past the cap: the upstream gets all of it, the mirror nothing.
    let r = send_chunked(dp.addr, "/big", 20, 64 * 1024).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["body_len"], 20 * 64 * 1024);
    // Announced past the cap (Content-Length): not copied at all.
    static BIG: [u8; 1024 * 1024 + 1] = [b'z'; 1024 * 1024 + 1];
    let r = send(dp.addr, post("/big2", &BIG, &[])).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["body_len"], BIG.len());
    assert_eq!(
        wait_metric(
            &dp,
            "sluice_mirror_dropped_total{reason=\"body_too_large\"}",
            2.0
        )
        .await,
        2.0
    );
    // A later small request is still mirrored; the big ones never were.
    get_with(dp.addr, "/after", &[]).await;
    let seen = mirror.wait_for(2).await;
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].target, "/after");
}

#[tokio::test]
async fn a_mirror_that_never_answers_does_not_hold_the_client() {
    let mirror = Mirror::start(false).await;
    let (dp, _echo) = serve(json!({"host": mirror.host()})).await;
    for i in 0..3 {
        let r = send(dp.addr, post(&format!("/req/{i}"), b"payload", &[])).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.json()["body"], "payload");
    }
    // The mirror did receive them, and is still sitting on every one: the client's
    // responses above came while the mirror requests were in flight.
    let seen = mirror.wait_for(3).await;
    assert!(seen.iter().all(|s| s.body == "payload"));
    assert_eq!(
        mirror_metric(&dp, "sluice_mirror_requests_total{result=\"ok\"}"),
        0.0
    );
}

#[tokio::test]
async fn an_unreachable_mirror_changes_nothing_for_the_client() {
    let (dp, _echo) = serve(json!({"host": format!("http://{}", closed_port())})).await;
    for _ in 0..3 {
        let r = send(dp.addr, post("/x", b"abc", &[])).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.json()["body"], "abc");
    }
    assert_eq!(
        wait_metric(&dp, "sluice_mirror_requests_total{result=\"error\"}", 3.0).await,
        3.0
    );
}

#[tokio::test]
async fn mirror_requests_in_flight_are_bounded_and_the_rest_are_dropped_and_counted() {
    let mirror = Mirror::start(false).await;
    let (dp, _echo) = serve(json!({"host": mirror.host()})).await;
    // 64 mirror requests hang at the mirror; the ones after them find no room.
    for _ in 0..70 {
        let r = get_with(dp.addr, "/q", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    mirror.wait_for(64).await;
    assert_eq!(
        mirror_metric(&dp, "sluice_mirror_dropped_total{reason=\"queue_full\"}"),
        6.0
    );
    assert_eq!(mirror.count(), 64);
}

#[tokio::test]
async fn a_request_a_plugin_answers_is_not_mirrored() {
    let mirror = Mirror::start(true).await;
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let snap = snapshot(
        1,
        vec![route_with(
            "default/r/p",
            &["/*"],
            "u",
            vec![
                plugin("proxy-mirror", json!({"host": mirror.host()})),
                plugin("ip-restriction", json!({"blacklist": ["127.0.0.1"]})),
            ],
        )],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    dp.store.apply(snap, vec![]).unwrap();
    let r = get_with(dp.addr, "/denied", &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // Give a (wrong) mirror request every chance to arrive.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(mirror.count(), 0);
}

#[tokio::test]
async fn a_bad_config_is_refused_with_the_field_named() {
    let dp = dataplane().await;
    let snap = snapshot(
        1,
        vec![route_with(
            "default/r/p",
            &["/*"],
            "u",
            vec![plugin(
                "proxy-mirror",
                json!({"host": "http://m/with/path"}),
            )],
        )],
        vec![upstream("u", &[(closed_port(), 1)])],
    );
    let e = dp.store.apply(snap, vec![]).unwrap_err().to_string();
    assert!(
        e.contains("plugin \"proxy-mirror\": host: \"http://m/with/path\" must be scheme://host[:port] only"),
        "{e}"
    );
}
