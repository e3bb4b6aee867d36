//! request-id, fault-injection and gzip through the dataplane against a real origin.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use serde_json::json;
use sluice_testkit::EchoServer;

fn gunzip(b: &[u8]) -> String {
    let mut out = String::new();
    flate2::read::GzDecoder::new(b)
        .read_to_string(&mut out)
        .unwrap();
    out
}

#[tokio::test]
async fn request_id_generated_kept_and_returned() {
    let (_echo, dp) = with_plugins(vec![plugin("request-id", json!({}))]).await;
    let r = request(dp.addr, "GET", "/", &[]).await;
    let id = h(&r, "x-request-id").unwrap().to_owned();
    assert_eq!(id.len(), 36, "uuid: {id}");
    assert_eq!(&id[14..15], "4", "uuid v4: {id}");
    assert_eq!(
        r.json()["headers"]["x-request-id"],
        id.as_str(),
        "the upstream saw it"
    );
    let r2 = request(dp.addr, "GET", "/", &[]).await;
    assert_ne!(h(&r2, "x-request-id").unwrap(), id, "one per request");
    let r = request(dp.addr, "GET", "/", &[("x-request-id", "client-id-1")]).await;
    assert_eq!(h(&r, "x-request-id"), Some("client-id-1"));
    assert_eq!(r.json()["headers"]["x-request-id"], "client-id-1");

    let (_echo, dp) = with_plugins(vec![plugin(
        "request-id",
        json!({"header_name": "X-Trace", "include_in_response": false, "algorithm": "range_id",
               "range_id": {"char_set": "abcdef", "length": 10}}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/", &[]).await;
    assert!(h(&r, "x-trace").is_none());
    let id = r.json()["headers"]["x-trace"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 10);
    assert!(id.chars().all(|c| "abcdef".contains(c)), "{id}");

    let (_echo, dp) =
        with_plugins(vec![plugin("request-id", json!({"algorithm": "nanoid"}))]).await;
    let r = request(dp.addr, "GET", "/", &[]).await;
    assert_eq!(h(&r, "x-request-id").unwrap().len(), 21);
}

/// An origin that answers with a fixed head and `ok`.
async fn fixed_origin(extra_headers: &'static str) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind(any()).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut chunk).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\n{extra_headers}content-length: 2\r\nconnection: close\r\n\r\nok"
                );
                s.write_all(head.as_bytes()).await.unwrap();
            });
        }
    });
    addr
}

#[tokio::test]
async fn request_id_empty_is_replaced_and_the_upstreams_is_kept() {
    let (_echo, dp) =
        with_plugins(vec![plugin("request-id", json!({"algorithm": "uuidv7"}))]).await;
    let r = request(dp.addr, "GET", "/", &[("x-request-id", "")]).await;
    let id = h(&r, "x-request-id").unwrap().to_owned();
    assert_eq!(id.len(), 36, "an empty id is replaced: {id:?}");
    assert_eq!(&id[14..15], "7", "uuid v7: {id}");
    assert_eq!(r.json()["headers"]["x-request-id"], id.as_str());

    let origin = fixed_origin("x-request-id: from-upstream\r\n").await;
    let dp = dataplane().await;
    dp.store
        .apply(
            snapshot(
                1,
                vec![route_with(
                    "default/r/p",
                    &["/*"],
                    "u",
                    vec![plugin("request-id", json!({"algorithm": "ksuid"}))],
                )],
                vec![upstream("u", &[(origin, 1)])],
            ),
            vec![],
        )
        .unwrap();
    let r = request(dp.addr, "GET", "/", &[]).await;
    assert_eq!(h(&r, "x-request-id"), Some("from-upstream"));
    assert_eq!(r.headers.get_all("x-request-id").iter().count(), 1);
}

#[tokio::test]
async fn fault_injection_abort_with_vars_and_headers() {
    let (_echo, dp) = with_plugins(vec![plugin(
        "fault-injection",
        json!({"abort": {"http_status": 418, "body": "no tea for $arg_name\n",
                         "headers": {"X-Fault": "yes"},
                         "vars": [[["arg_name", "~~", "^b"]], [["http_x_vip", "==", "1"]]]}}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/?name=bob", &[]).await;
    assert_eq!(r.status, StatusCode::IM_A_TEAPOT);
    assert_eq!(r.text(), "no tea for bob\n");
    assert_eq!(h(&r, "x-fault"), Some("yes"));
    assert!(h(&r, "x-echo-server").is_none());
    let r = request(dp.addr, "GET", "/?name=alice", &[]).await;
    assert_eq!(r.status, StatusCode::OK, "vars do not hold");
    assert_eq!(r.json()["query"], "name=alice");
    let r = request(dp.addr, "GET", "/?name=alice", &[("x-vip", "1")]).await;
    assert_eq!(
        r.status,
        StatusCode::IM_A_TEAPOT,
        "one expression of vars is enough"
    );

    let (_echo, dp) = with_plugins(vec![plugin(
        "fault-injection",
        json!({"abort": {"http_status": 500, "percentage": 0}}),
    )])
    .await;
    for _ in 0..20 {
        assert_eq!(
            request(dp.addr, "GET", "/", &[]).await.status,
            StatusCode::OK
        );
    }
}

#[tokio::test]
async fn fault_injection_delay_then_abort() {
    let (_echo, dp) = with_plugins(vec![plugin(
        "fault-injection",
        json!({"delay": {"duration": 0.3},
               "abort": {"http_status": 503, "vars": [[["http_x_fail", "==", "1"]]]}}),
    )])
    .await;
    let t = Instant::now();
    let r = request(dp.addr, "GET", "/", &[]).await;
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "the request waited"
    );
    assert_eq!(r.status, StatusCode::OK);
    let t = Instant::now();
    let r = request(dp.addr, "GET", "/", &[("x-fail", "1")]).await;
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "delay comes before abort"
    );
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.body.is_empty());
}

#[tokio::test]
async fn gzip_compresses_what_the_client_accepts() {
    let (_echo, dp) = with_plugins(vec![plugin(
        "gzip",
        json!({"types": ["application/json"], "comp_level": 6, "vary": true,
               "buffers": {"number": 32, "size": 4096}}),
    )])
    .await;
    let r = request(
        dp.addr,
        "GET",
        "/some/path",
        &[("accept-encoding", "br, gzip;q=0.8")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(h(&r, "content-encoding"), Some("gzip"));
    assert_eq!(h(&r, "vary"), Some("Accept-Encoding"));
    assert!(h(&r, "content-length").is_none());
    let text = gunzip(&r.body);
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(j["path"], "/some/path");
    assert_eq!(
        j["headers"]["accept-encoding"], "br, gzip;q=0.8",
        "the upstream is asked as the client asked"
    );

    // Not accepted (q=0, absent), HEAD, or not on the route: as the upstream sent it.
    for headers in [&[("accept-encoding", "gzip;q=0")][..], &[][..]] {
        let r = request(dp.addr, "GET", "/", headers).await;
        assert!(h(&r, "content-encoding").is_none());
        assert_eq!(r.json()["path"], "/");
    }
    let r = request(dp.addr, "GET", "/free", &[("accept-encoding", "gzip")]).await;
    assert!(h(&r, "content-encoding").is_none());
}

#[tokio::test]
async fn gzip_skips_other_types_and_short_bodies() {
    // Default types: text/html only; the echo answers application/json.
    let (_echo, dp) = with_plugins(vec![plugin("gzip", json!({}))]).await;
    let r = request(dp.addr, "GET", "/", &[("accept-encoding", "gzip")]).await;
    assert!(h(&r, "content-encoding").is_none());
    assert_eq!(r.json()["path"], "/");

    let (_echo, dp) = with_plugins(vec![plugin(
        "gzip",
        json!({"types": "*", "min_length": 100000}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/", &[("accept-encoding", "gzip")]).await;
    assert!(
        h(&r, "content-encoding").is_none(),
        "shorter than min_length"
    );
}

#[tokio::test]
async fn gzip_needs_a_content_type_even_for_any_type() {
    let origin = fixed_origin("").await;
    let dp = dataplane().await;
    dp.store
        .apply(
            snapshot(
                1,
                vec![route_with(
                    "default/r/p",
                    &["/*"],
                    "u",
                    vec![plugin("gzip", json!({"types": "*", "min_length": 1}))],
                )],
                vec![upstream("u", &[(origin, 1)])],
            ),
            vec![],
        )
        .unwrap();
    let r = request(dp.addr, "GET", "/", &[("accept-encoding", "gzip")]).await;
    assert!(h(&r, "content-encoding").is_none(), "as nginx");
    assert_eq!(r.text(), "ok");
}

#[tokio::test]
async fn gzip_compresses_the_body_response_rewrite_made() {
    let (_echo, dp) = with_plugins(vec![
        plugin("gzip", json!({"types": "*", "min_length": 1})),
        plugin("response-rewrite", json!({"body": "rewritten body\n"})),
    ])
    .await;
    let r = request(dp.addr, "GET", "/", &[("accept-encoding", "gzip")]).await;
    assert_eq!(h(&r, "content-encoding"), Some("gzip"));
    assert_eq!(gunzip(&r.body), "rewritten body\n");
}

#[tokio::test]
async fn bad_configs_are_rejected_naming_plugin_and_field() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane_to("/*", echo.addr).await;
    for (p, want) in [
        (
            plugin("request-id", json!({"algorithm": "snowflake"})),
            "plugin \"request-id\": algorithm: unknown variant `snowflake`",
        ),
        (
            plugin("request-id", json!({"range_id": {"length": 2}})),
            "plugin \"request-id\": range_id.length: must be at least 6",
        ),
        (
            plugin("fault-injection", json!({})),
            "plugin \"fault-injection\": at least one of abort and delay",
        ),
        (
            plugin(
                "fault-injection",
                json!({"abort": {"http_status": 500, "percentage": 101}}),
            ),
            "plugin \"fault-injection\": abort.percentage: must be 0..=100",
        ),
        (
            plugin(
                "fault-injection",
                json!({"delay": {"duration": 1, "vars": [[["status", "==", 200]]]}}),
            ),
            "plugin \"fault-injection\": delay.vars: `status` is not known",
        ),
        (
            plugin(
                "fault-injection",
                json!({"abort": {"http_status": 500, "vars": [["arg_a", "==", "1"]]}}),
            ),
            "plugin \"fault-injection\": abort.vars[0]: a rule must be wrapped inside brackets",
        ),
        (
            plugin("gzip", json!({"comp_level": 10})),
            "plugin \"gzip\": comp_level: must be 1..=9",
        ),
        (
            plugin("gzip", json!({"types": []})),
            "plugin \"gzip\": types: must be",
        ),
        (
            plugin(
                "traffic-split",
                json!({"rules": [{"weighted_upstreams": [{"upstream_id": "u2", "weight": 1}]}]}),
            ),
            "plugin \"traffic-split\": rules[0].weighted_upstreams[0].upstream_id: unknown upstream `u2`",
        ),
        (
            plugin(
                "traffic-split",
                json!({"rules": [{"weighted_upstreams": [{"weight": 0}]}]}),
            ),
            "plugin \"traffic-split\": rules[0].weighted_upstreams: every weight is 0",
        ),
    ] {
        let err = dp
            .store
            .apply(
                snapshot(
                    2,
                    vec![route_with("default/r/bad", &["/*"], "u", vec![p])],
                    vec![upstream("u", &[(echo.addr, 1)])],
                ),
                vec![],
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("route default/r/bad"), "{err}");
        assert!(err.contains(want), "want {want:?} in {err}");
        assert_eq!(get(dp.addr, "h", "/x").await.status, StatusCode::OK);
    }
}
