//! prometheus: APISIX metric names and labels on the admin listener.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;

use common::*;
use http::StatusCode;
use serde_json::json;
use sluice_testkit::EchoServer;

#[tokio::test]
async fn apisix_families_with_bounded_labels() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let mut r = route_with(
        "default/hello/r1",
        &["/hello*"],
        "u",
        vec![
            plugin("prometheus", json!({})),
            plugin("limit-count", json!({"count": 3, "time_window": 60})),
        ],
    );
    r.hosts = vec!["*.example.com".into()];
    dp.store
        .apply(
            snapshot(
                1,
                vec![r, route("default/plain/r1", &["/plain"], "u")],
                vec![upstream("u", &[(echo.addr, 1)])],
            ),
            vec![],
        )
        .unwrap();
    let admin = admin(&dp.store).await;

    for path in ["/hello/a", "/hello/b?x=1", "/hello/c", "/hello/d"] {
        get(dp.addr, "www.example.com", path).await;
    }
    get(dp.addr, "www.example.com", "/plain").await;
    get(dp.addr, "www.example.com", "/hello/status/404").await; // limit reached: 503

    for path in ["/metrics", "/apisix/prometheus/metrics"] {
        let m = get(admin, "localhost", path).await;
        assert_eq!(m.status, StatusCode::OK);
        let text = m.text();
        let node = echo.addr.ip().to_string();
        let ok = format!(
            "apisix_http_status{{code=\"200\",route=\"default/hello/r1\",matched_uri=\"/hello*\",matched_host=\"*.example.com\",service=\"\",consumer=\"\",node=\"{node}\"}}"
        );
        assert_eq!(sample(&text, &ok), Some(3.0), "{text}");
        let rejected = "apisix_http_status{code=\"503\",route=\"default/hello/r1\",matched_uri=\"/hello*\",matched_host=\"*.example.com\",service=\"\",consumer=\"\",node=\"\"}";
        assert_eq!(sample(&text, rejected), Some(2.0), "{text}");
        assert!(!text.contains("/hello/a"), "raw paths never become labels");
        assert!(
            !text.contains("default/plain"),
            "routes without the plugin are not labelled"
        );
        let lat = format!(
            "apisix_http_latency_count{{type=\"request\",route=\"default/hello/r1\",service=\"\",consumer=\"\",node=\"{node}\"}}"
        );
        assert_eq!(sample(&text, &lat), Some(3.0), "{text}");
        let inf = format!(
            "apisix_http_latency_bucket{{type=\"upstream\",route=\"default/hello/r1\",service=\"\",consumer=\"\",node=\"{node}\",le=\"+Inf\"}}"
        );
        assert_eq!(sample(&text, &inf), Some(3.0), "{text}");
        let egress = format!(
            "apisix_bandwidth{{type=\"egress\",route=\"default/hello/r1\",service=\"\",consumer=\"\",node=\"{node}\"}}"
        );
        assert!(sample(&text, &egress).unwrap() > 100.0, "{text}");
        assert_eq!(
            sample(&text, "apisix_http_requests_total"),
            Some(6.0),
            "{text}"
        );
        assert!(text.contains("# TYPE apisix_http_latency histogram"));
        assert!(text.contains("apisix_nginx_http_current_connections{state=\"accepted\"}"));
    }
}

#[tokio::test]
async fn global_rule_applies_to_every_route() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let mut snap = snapshot(
        1,
        vec![
            route("default/a/r1", &["/a"], "u"),
            route_with(
                "default/b/r1",
                &["/b"],
                "u",
                vec![plugin(
                    "limit-count",
                    json!({"count": 5, "time_window": 60}),
                )],
            ),
        ],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    snap.global_rules = vec![sluice_proto::v1::GlobalRule {
        id: "default/g".into(),
        plugins: vec![
            plugin("prometheus", json!({})),
            plugin(
                "limit-count",
                json!({"count": 1, "time_window": 60, "key_type": "constant", "key": "all"}),
            ),
        ],
    }];
    dp.store.apply(snap, vec![]).unwrap();
    let admin = admin(&dp.store).await;
    let r = get(dp.addr, "h", "/a").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.headers["x-ratelimit-limit"], "1",
        "the global limit runs on a plain route"
    );
    // The global budget (one request for everyone) is spent: /b is rejected by the global
    // rule before its own plugins run.
    let r = get(dp.addr, "h", "/b").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let text = get(admin, "localhost", "/metrics").await.text();
    let node = echo.addr.ip().to_string();
    let a = format!(
        "apisix_http_status{{code=\"200\",route=\"default/a/r1\",matched_uri=\"/a\",matched_host=\"\",service=\"\",consumer=\"\",node=\"{node}\"}}"
    );
    assert_eq!(sample(&text, &a), Some(1.0), "{text}");
    let b = "apisix_http_status{code=\"503\",route=\"default/b/r1\",matched_uri=\"/b\",matched_host=\"\",service=\"\",consumer=\"\",node=\"\"}";
    assert_eq!(sample(&text, b), Some(1.0), "{text}");
}

/// An origin that answers every request with a chunked body in two parts, 100 ms apart,
/// so that the body is still arriving when the response head goes to the client.
async fn slow_chunked_origin() -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind(any()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    let Ok(n) = sock.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    head.extend_from_slice(&buf[..n]);
                }
                let first = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n";
                if sock.write_all(first).await.is_err() {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                let _ = sock.write_all(b"6\r\n world\r\n0\r\n\r\n").await;
                let _ = sock.read(&mut buf).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_streamed_body_is_logged_once_when_it_ends() {
    // The body is not complete when the response phases run: the plugin state becomes
    // the response body and the log phase runs at its end, with the whole body counted.
    let origin = slow_chunked_origin().await;
    let dp = dataplane().await;
    dp.store
        .apply(
            snapshot(
                1,
                vec![route_with(
                    "default/slow/r1",
                    &["/slow"],
                    "u",
                    vec![plugin("prometheus", json!({}))],
                )],
                vec![upstream("u", &[(origin, 1)])],
            ),
            vec![],
        )
        .unwrap();
    let admin = admin(&dp.store).await;

    let r = get(dp.addr, "h", "/slow").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "hello world");

    let text = get(admin, "localhost", "/metrics").await.text();
    let node = origin.ip().to_string();
    let status = format!(
        "apisix_http_status{{code=\"200\",route=\"default/slow/r1\",matched_uri=\"/slow\",matched_host=\"\",service=\"\",consumer=\"\",node=\"{node}\"}}"
    );
    assert_eq!(sample(&text, &status), Some(1.0), "logged once: {text}");
    // The upstream's time runs to the end of its body, 100 ms after the head.
    let upstream_sum = format!(
        "apisix_http_latency_sum{{type=\"upstream\",route=\"default/slow/r1\",service=\"\",consumer=\"\",node=\"{node}\"}}"
    );
    let ms = sample(&text, &upstream_sum).unwrap();
    assert!(ms >= 100.0, "upstream latency {ms} ms: {text}");
    let egress = format!(
        "apisix_bandwidth{{type=\"egress\",route=\"default/slow/r1\",service=\"\",consumer=\"\",node=\"{node}\"}}"
    );
    assert!(
        sample(&text, &egress).unwrap() >= 11.0,
        "the whole body: {text}"
    );
}
