//! The proxy against real in-process HTTP origins: what a client observes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::rt::TokioIo;
use sluice_testkit::EchoServer;

#[tokio::test]
async fn proxies_with_forwarding_headers_and_client_host() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane_to("/hello*", echo.addr).await;
    let resp = get(dp.addr, "demo.example.com:9080", "/hello/world?x=1").await;
    assert_eq!(resp.status, StatusCode::OK);
    let j = resp.json();
    assert_eq!(j["path"], "/hello/world");
    assert_eq!(j["query"], "x=1");
    assert_eq!(j["headers"]["host"], "demo.example.com:9080");
    assert_eq!(j["headers"]["x-forwarded-for"], "127.0.0.1");
    assert_eq!(j["headers"]["x-real-ip"], "127.0.0.1");
    assert_eq!(j["headers"]["x-forwarded-proto"], "http");
    assert_eq!(j["headers"]["x-forwarded-host"], "demo.example.com:9080");
    assert_eq!(resp.headers["x-echo-server"], "a");
}

#[tokio::test]
async fn appends_to_an_existing_forwarded_for() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane_to("/*", echo.addr).await;
    let req = Request::get("/x")
        .header("host", "h")
        .header("x-forwarded-for", "203.0.113.7")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let j = send(dp.addr, req).await.json();
    assert_eq!(j["headers"]["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
}

#[tokio::test]
async fn no_route_is_404_with_a_short_body() {
    let dp = dataplane().await;
    let resp = get(dp.addr, "h", "/nothing").await;
    assert_eq!(resp.status, StatusCode::NOT_FOUND);
    assert_eq!(resp.text(), "{\"error_msg\":\"404 Route Not Found\"}\n");
    // As APISIX (nginx's default_type): clients that parse application/json bodies must not
    // choke on a body-less HEAD answer (the Gateway API suite's client does).
    assert_eq!(h(&resp, "content-type"), Some("text/plain; charset=utf-8"));
}

#[tokio::test]
async fn refused_upstream_is_502() {
    let closed = closed_port();
    let dp = dataplane_to("/*", closed).await;
    let resp = get(dp.addr, "h", "/x").await;
    assert_eq!(resp.status, StatusCode::BAD_GATEWAY);
    assert!(resp.text().contains("502"));
}

#[tokio::test]
async fn slow_upstream_is_504_after_the_route_read_timeout() {
    let echo = EchoServer::start("slow", any()).await.unwrap();
    let dp = dataplane().await;
    let mut r = route("default/r/r1", &["/*"], "u");
    r.timeout = Some(sluice_proto::v1::Timeouts {
        connect_ms: 1000,
        send_ms: 1000,
        read_ms: 200,
        ..Default::default()
    });
    dp.store
        .apply(
            snapshot(1, vec![r], vec![upstream("u", &[(echo.addr, 1)])]),
            vec![],
        )
        .unwrap();
    let resp = get(dp.addr, "h", "/delay/3000").await;
    assert_eq!(resp.status, StatusCode::GATEWAY_TIMEOUT);
    // A fast request on the same route still works.
    assert_eq!(get(dp.addr, "h", "/delay/0").await.status, StatusCode::OK);
}

#[tokio::test]
async fn upstream_with_no_endpoints_is_503() {
    let dp = dataplane().await;
    dp.store
        .apply(
            snapshot(
                1,
                vec![route("default/r/r1", &["/*"], "u")],
                vec![upstream("u", &[])],
            ),
            vec![],
        )
        .unwrap();
    let resp = get(dp.addr, "h", "/x").await;
    assert_eq!(resp.status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn weighted_round_robin_over_endpoints_and_split_over_backends() {
    let a = EchoServer::start("a", any()).await.unwrap();
    let b = EchoServer::start("b", any()).await.unwrap();
    let c = EchoServer::start("c", any()).await.unwrap();
    let dp = dataplane().await;
    let mut r = route("default/r/r1", &["/*"], "ab");
    r.backends = vec![
        sluice_proto::v1::Backend {
            upstream_id: "ab".into(),
            weight: 75,
            plugins: Vec::new(),
        },
        sluice_proto::v1::Backend {
            upstream_id: "c".into(),
            weight: 25,
            plugins: Vec::new(),
        },
    ];
    dp.store
        .apply(
            snapshot(
                1,
                vec![r],
                vec![
                    upstream("ab", &[(a.addr, 2), (b.addr, 1)]),
                    upstream("c", &[(c.addr, 1)]),
                ],
            ),
            vec![],
        )
        .unwrap();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for _ in 0..120 {
        let resp = get(dp.addr, "h", "/x").await;
        *counts
            .entry(resp.headers["x-echo-server"].to_str().unwrap().to_owned())
            .or_default() += 1;
    }
    // 75% to {a,b} split 2:1, 25% to c: exact over whole cycles.
    assert_eq!(counts["c"], 30, "{counts:?}");
    assert_eq!(counts["a"], 60, "{counts:?}");
    assert_eq!(counts["b"], 30, "{counts:?}");
}

#[tokio::test]
async fn request_and_response_bodies_stream_both_ways() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane_to("/upload", echo.addr).await;
    // A chunked request body of 4 MiB, produced incrementally.
    let chunks = (0..64).map(|_| {
        Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(Bytes::from(vec![
            b'x';
            64 * 1024
        ])))
    });
    let body = StreamBody::new(futures_util_stream(chunks));
    let stream = tokio::net::TcpStream::connect(dp.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::post("/upload")
        .header("host", "h")
        .body(body)
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let j: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(j["body_len"], 64 * 64 * 1024);
    assert_eq!(j["headers"]["transfer-encoding"], "chunked");
}

fn futures_util_stream<I: Iterator + Send + 'static>(
    it: I,
) -> impl futures_core_stream::Stream<Item = I::Item> {
    futures_core_stream::iter(it)
}

mod futures_core_stream {
    pub use futures::stream::{Stream, iter};
}

#[tokio::test]
async fn keep_alive_connections_are_reused() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane_to("/*", echo.addr).await;
    for _ in 0..5 {
        assert_eq!(get(dp.addr, "h", "/x").await.status, StatusCode::OK);
    }
    let table = dp.store.table();
    let pool = &table.routes[0].backends[0].endpoints[0].pool;
    assert_eq!(
        pool.idle_count(),
        1,
        "sequential requests share one upstream connection"
    );
}

#[tokio::test]
async fn h2c_prior_knowledge_downstream() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane_to("/h2", echo.addr).await;
    let stream = tokio::net::TcpStream::connect(dp.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = Request::get("http://h2.example.com/h2")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let j: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        j["headers"]["host"], "h2.example.com",
        "the :authority becomes the upstream Host"
    );
    assert_eq!(j["version"], "HTTP/1.1");
}

#[tokio::test]
async fn snapshot_swap_is_atomic_and_a_bad_snapshot_keeps_the_last_good_one() {
    let a = EchoServer::start("a", any()).await.unwrap();
    let b = EchoServer::start("b", any()).await.unwrap();
    let dp = dataplane().await;
    dp.store
        .apply(
            snapshot(
                1,
                vec![route("default/r/r1", &["/*"], "a")],
                vec![upstream("a", &[(a.addr, 1)])],
            ),
            vec![],
        )
        .unwrap();
    assert_eq!(get(dp.addr, "h", "/x").await.headers["x-echo-server"], "a");
    dp.store
        .apply(
            snapshot(
                2,
                vec![route("default/r/r1", &["/*"], "b")],
                vec![upstream("b", &[(b.addr, 1)])],
            ),
            vec![],
        )
        .unwrap();
    assert_eq!(get(dp.addr, "h", "/x").await.headers["x-echo-server"], "b");
    // Route names an upstream that is not in the snapshot: rejected whole.
    let err = dp
        .store
        .apply(
            snapshot(3, vec![route("default/r/r1", &["/*"], "missing")], vec![]),
            vec![],
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("route default/r/r1: backends[0].upstream_id: unknown upstream `missing`"),
        "{err}"
    );
    assert_eq!(get(dp.addr, "h", "/x").await.headers["x-echo-server"], "b");
    let st = dp.store.state();
    assert_eq!(st.version, 2);
    assert!(st.last_error.unwrap().contains("snapshot v3 rejected"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_keep_succeeding_while_large_snapshots_are_swapped_in() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let echo_addr = echo.addr;
    let big = move |version: u64| {
        let mut routes: Vec<_> = (0..10_000)
            .map(|i| {
                route(
                    &format!("default/r{i}/r1"),
                    &[&format!("/filler/{i}*")],
                    "u",
                )
            })
            .collect();
        routes.push(route("default/live/r1", &["/live"], "u"));
        snapshot(version, routes, vec![upstream("u", &[(echo_addr, 1)])])
    };
    dp.store.apply(big(1), vec![]).unwrap();
    let store = std::sync::Arc::clone(&dp.store);
    let swapper = std::thread::spawn(move || {
        for v in 2..12 {
            store.apply(big(v), vec![]).unwrap();
        }
    });
    let mut served = 0;
    while !swapper.is_finished() || served < 50 {
        assert_eq!(
            get(dp.addr, "h", "/live").await.status,
            StatusCode::OK,
            "request {served} failed during a swap"
        );
        served += 1;
    }
    swapper.join().unwrap();
    assert_eq!(dp.store.state().version, 11);
    assert!(served >= 50);
}

/// An upstream that answers one request per connection with keep-alive advertised, then
/// closes the connection anyway: the next request finds a stale pooled connection.
async fn one_shot_upstream() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind(any()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let conns = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&conns);
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
                // Give the proxy time to pool the connection, then close it.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            });
        }
    });
    (addr, conns)
}

#[tokio::test]
async fn a_stale_pooled_connection_is_retried_on_a_fresh_one_for_requests_without_body() {
    let (addr, conns) = one_shot_upstream().await;
    let dp = dataplane_to("/*", addr).await;
    for i in 0..3 {
        let resp = get(dp.addr, "h", "/x").await;
        assert_eq!(resp.status, StatusCode::OK, "request {i}");
        assert_eq!(resp.text(), "ok");
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    }
    assert_eq!(
        conns.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "each request needed a new upstream connection"
    );
}

#[tokio::test]
async fn a_post_checks_its_pooled_connection_before_using_it() {
    let (addr, _conns) = one_shot_upstream().await;
    let dp = dataplane_to("/*", addr).await;
    for i in 0..3 {
        let req = Request::post("/x")
            .header("host", "h")
            .body(Full::new(Bytes::from_static(b"payload")))
            .unwrap();
        let resp = send(dp.addr, req).await;
        assert_eq!(resp.status, StatusCode::OK, "request {i}");
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    }
}
