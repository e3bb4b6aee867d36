//! proxy-rewrite, redirect and response-rewrite through the dataplane against a real
//! origin: what the upstream receives and what the client sees.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::{Value, json};
use sluice_testkit::EchoServer;

#[tokio::test]
async fn proxy_rewrite_regex_uri_host_method_and_headers() {
    let (_echo, dp) = with_plugins(vec![plugin(
        "proxy-rewrite",
        json!({
            "regex_uri": ["^/api/v1/(.*)/(.*)", "/v2/$2/$1", "^/old/(.*)", "/new/$1"],
            "host": "backend.internal",
            "method": "POST",
            "headers": {
                "add": {"X-Added": "a-$1"},
                "set": {"X-User": "from-$arg_user", "X-Multi": ["1", "2"]},
                "remove": ["X-Secret"]
            }
        }),
    )])
    .await;
    let r = request(
        dp.addr,
        "GET",
        "/api/v1/users/42?user=bob&x=1",
        &[("x-secret", "s"), ("x-user", "client"), ("x-added", "orig")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let j = r.json();
    assert_eq!(j["path"], "/v2/42/users");
    assert_eq!(j["query"], "user=bob&x=1", "the query string is kept");
    assert_eq!(j["method"], "POST");
    assert_eq!(j["headers"]["host"], "backend.internal");
    assert_eq!(
        j["headers"]["x-forwarded-host"], "example.com",
        "X-Forwarded-Host keeps the client's Host"
    );
    assert_eq!(j["headers"]["x-user"], "from-bob");
    // The echo shows the last line of a repeated header; the raw head shows them all.
    assert_eq!(j["headers"]["x-multi"], "2");
    assert_eq!(j["headers"]["x-added"], "a-users");
    assert!(j["headers"].get("x-secret").is_none());

    // The second pair; a path matching no pattern is forwarded unchanged.
    let r = request(dp.addr, "GET", "/old/thing", &[]).await;
    assert_eq!(r.json()["path"], "/new/thing");
    let r = request(dp.addr, "GET", "/other/thing?q=1", &[]).await;
    assert_eq!(r.json()["path"], "/other/thing");
    assert_eq!(r.json()["query"], "q=1");

    // Routes without the plugin are untouched.
    let r = request(dp.addr, "GET", "/free", &[]).await;
    assert_eq!(r.json()["method"], "GET");
    assert_eq!(r.json()["headers"]["host"], "example.com");
}

/// An origin that answers with the request head it received, byte for byte.
async fn raw_head_origin() -> SocketAddr {
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
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    buf.len()
                );
                s.write_all(head.as_bytes()).await.unwrap();
                s.write_all(&buf).await.unwrap();
            });
        }
    });
    addr
}

#[tokio::test]
async fn proxy_rewrite_repeated_headers_reach_the_upstream_as_lines() {
    let origin = raw_head_origin().await;
    let dp = dataplane().await;
    let pr = plugin(
        "proxy-rewrite",
        json!({"headers": {"add": {"X-Added": "new"}, "set": {"X-Multi": ["1", "2"]}}}),
    );
    dp.store
        .apply(
            snapshot(
                1,
                vec![route_with("default/r/p", &["/*"], "u", vec![pr])],
                vec![upstream("u", &[(origin, 1)])],
            ),
            vec![],
        )
        .unwrap();
    let r = request(
        dp.addr,
        "GET",
        "/",
        &[("x-added", "orig"), ("x-multi", "0")],
    )
    .await;
    let head = r.text();
    assert!(head.contains("x-added: orig\r\nx-added: new\r\n"), "{head}");
    assert!(head.contains("x-multi: 1\r\nx-multi: 2\r\n"), "{head}");
    assert!(!head.contains("x-multi: 0"), "{head}");
}

#[tokio::test]
async fn proxy_rewrite_regex_uri_replaces_only_the_match_and_header_order() {
    let (_echo, dp) = with_plugins(vec![plugin(
        "proxy-rewrite",
        json!({"regex_uri": ["^/api", "/v2"],
               "headers": {"set": {"X-Both": "set"}, "remove": ["X-Both"], "add": {"X-Kept": "1"}}}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/api/users/7?a=1", &[("x-both", "client")]).await;
    let j = r.json();
    assert_eq!(
        j["path"], "/v2/users/7",
        "ngx.re.sub: the rest of the path is kept"
    );
    assert_eq!(j["query"], "a=1");
    assert!(
        j["headers"].get("x-both").is_none(),
        "add, set, then remove"
    );
    assert_eq!(j["headers"]["x-kept"], "1");
}

#[tokio::test]
async fn proxy_rewrite_variable_cannot_start_a_query() {
    let (_echo, dp) =
        with_plugins(vec![plugin("proxy-rewrite", json!({"uri": "/p/$arg_x"}))]).await;
    let r = request(dp.addr, "GET", "/any?x=a%3Fb", &[]).await;
    let j = r.json();
    assert_eq!(j["path"], "/p/a%3Fb");
    assert_eq!(j["query"], "x=a%3Fb");
}

#[tokio::test]
async fn proxy_rewrite_real_request_uri_unsafe() {
    let (_echo, dp) = with_plugins(vec![plugin(
        "proxy-rewrite",
        json!({"use_real_request_uri_unsafe": true, "regex_uri": ["^/old(.*)", "/new$1"]}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/old/a%2Fb?y=1", &[]).await;
    assert_eq!(
        r.json()["path"],
        "/new/a%2Fb",
        "matched against path and query"
    );
    assert_eq!(r.json()["query"], "y=1");
    let r = request(dp.addr, "GET", "/keep/a%2Fb?y=1", &[]).await;
    assert_eq!(r.json()["path"], "/keep/a%2Fb");

    let (_echo, dp) = with_plugins(vec![plugin(
        "proxy-rewrite",
        json!({"use_real_request_uri_unsafe": true, "uri": "/fixed?from=$arg_u"}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/x?u=me", &[]).await;
    assert_eq!(r.json()["path"], "/fixed");
    assert_eq!(r.json()["query"], "from=me&u=me");
}

#[tokio::test]
async fn proxy_rewrite_uri_with_variables_and_legacy_headers() {
    let (_echo, dp) = with_plugins(vec![plugin(
        "proxy-rewrite",
        json!({"uri": "/fixed/$arg_id/a b", "headers": {"X-Api": "v2", "X-Drop": ""}}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/anything?id=7", &[("x-drop", "1")]).await;
    let j = r.json();
    assert_eq!(j["path"], "/fixed/7/a%20b", "unsafe characters are escaped");
    assert_eq!(j["query"], "id=7");
    assert_eq!(j["headers"]["x-api"], "v2");
    assert!(
        j["headers"].get("x-drop").is_none(),
        "an empty value removes"
    );
}

#[tokio::test]
async fn redirect_http_to_https() {
    let (_echo, dp) = with_plugins(vec![plugin("redirect", json!({"http_to_https": true}))]).await;
    let r = request(dp.addr, "GET", "/a/b?x=1&y=2", &[]).await;
    assert_eq!(r.status, StatusCode::MOVED_PERMANENTLY);
    assert_eq!(h(&r, "location"), Some("https://example.com/a/b?x=1&y=2"));
    assert!(h(&r, "x-echo-server").is_none(), "the origin was not asked");
    let r = request(dp.addr, "HEAD", "/a", &[]).await;
    assert_eq!(r.status, StatusCode::MOVED_PERMANENTLY);
    let r = request(dp.addr, "POST", "/a", &[]).await;
    assert_eq!(
        r.status,
        StatusCode::PERMANENT_REDIRECT,
        "keeps method and body"
    );
    assert_eq!(h(&r, "location"), Some("https://example.com/a"));
    // Anything but https is redirected, as APISIX.
    let r = request(dp.addr, "GET", "/a", &[("x-forwarded-proto", "ws")]).await;
    assert_eq!(r.status, StatusCode::MOVED_PERMANENTLY);
    // Behind a TLS-terminating proxy the request is already HTTPS.
    let r = request(dp.addr, "GET", "/a", &[("x-forwarded-proto", "HTTPS")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["path"], "/a");
    // A Host with a port: APISIX's $host has none.
    let req = Request::get("/p")
        .header("host", "shop.example:8080")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let r = send(dp.addr, req).await;
    assert_eq!(h(&r, "location"), Some("https://shop.example/p"));
}

#[tokio::test]
async fn redirect_uri_and_regex_uri() {
    let (_echo, dp) = with_plugins(vec![plugin(
        "redirect",
        json!({"uri": "/new$uri?from=$arg_src", "ret_code": 307, "append_query_string": true}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/x?src=mail", &[]).await;
    assert_eq!(r.status, StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(h(&r, "location"), Some("/new/x?from=mail&src=mail"));

    let (_echo, dp) = with_plugins(vec![plugin(
        "redirect",
        json!({"regex_uri": ["^/blog/(.*)", "https://blog.example/$1 x"], "encode_uri": true}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/blog/post-1", &[]).await;
    assert_eq!(r.status, StatusCode::FOUND);
    assert_eq!(h(&r, "location"), Some("https://blog.example/post-1%20x"));
    let r = request(dp.addr, "GET", "/shop", &[]).await;
    assert_eq!(r.status, StatusCode::OK, "no match: proxied");
    assert_eq!(r.json()["path"], "/shop");

    let (_echo, dp) = with_plugins(vec![plugin(
        "redirect",
        json!({"regex_uri": ["^/old", "/new"]}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/old/page", &[]).await;
    assert_eq!(r.status, StatusCode::FOUND);
    assert_eq!(
        h(&r, "location"),
        Some("/new/page"),
        "the match is replaced"
    );
}

#[tokio::test]
async fn response_rewrite_status_headers_and_body() {
    let (_echo, dp) = with_plugins(vec![plugin(
        "response-rewrite",
        json!({
            "status_code": 202,
            "body": "{\"replaced\":true}",
            "headers": {"set": {"X-Server": "sluice", "X-Client": "$remote_addr"},
                        "remove": ["X-Echo-Server"], "add": {"X-Extra": "1"}}
        }),
    )])
    .await;
    let r = request(dp.addr, "GET", "/x", &[]).await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert_eq!(r.json(), json!({"replaced": true}));
    assert_eq!(h(&r, "x-server"), Some("sluice"));
    assert_eq!(h(&r, "x-client"), Some("127.0.0.1"));
    assert_eq!(h(&r, "x-extra"), Some("1"));
    assert!(h(&r, "x-echo-server").is_none());
    assert_eq!(h(&r, "content-type"), Some("application/json"));
}

#[tokio::test]
async fn response_rewrite_base64_body_and_vars_on_status() {
    // "hello" in base64, only for upstream 5xx answers to ?debug=1.
    let (_echo, dp) = with_plugins(vec![plugin(
        "response-rewrite",
        json!({
            "body": "aGVsbG8=", "body_base64": true, "status_code": 200,
            "vars": [["status", ">=", 500], ["arg_debug", "==", "1"]]
        }),
    )])
    .await;
    let r = request(dp.addr, "GET", "/status/503?debug=1", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "hello");
    let r = request(dp.addr, "GET", "/status/503", &[]).await;
    assert_eq!(
        r.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "vars do not hold"
    );
    assert_eq!(r.json()["path"], "/status/503");
    let r = request(dp.addr, "GET", "/status/200?debug=1", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["path"], "/status/200");
}

#[tokio::test]
async fn response_rewrite_filters() {
    let (_echo, dp) = with_plugins(vec![plugin(
        "response-rewrite",
        json!({"filters": [
            {"regex": "\"server\":\"(\\w+)\"", "replace": "\"server\":\"hidden-$1\""},
            {"regex": "/path-(\\d)", "scope": "global", "replace": "/P$1"}
        ]}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/path-1/path-2", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let j: Value = r.json();
    assert_eq!(j["server"], "hidden-a");
    assert_eq!(j["path"], "/P1/P2");
    assert!(h(&r, "content-length").is_none());
}

/// An origin that answers every request with `body` gzip-compressed.
async fn gzip_origin(body: &'static str) -> SocketAddr {
    use std::io::Write as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(body.as_bytes()).unwrap();
    let gz = enc.finish().unwrap();
    let l = tokio::net::TcpListener::bind(any()).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            let gz = gz.clone();
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
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-encoding: gzip\r\n\
                     etag: \"v1\"\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    gz.len()
                );
                s.write_all(head.as_bytes()).await.unwrap();
                s.write_all(&gz).await.unwrap();
            });
        }
    });
    addr
}

#[tokio::test]
async fn response_rewrite_filters_decode_gzip_and_respect_max_body() {
    let origin = gzip_origin("hello world, hello moon").await;
    let dp = dataplane().await;
    let rr = |max: u64| {
        plugin(
            "response-rewrite",
            json!({"filters": [{"regex": "hello", "scope": "global", "replace": "bye"}],
                   "max_resp_body_size": max}),
        )
    };
    dp.store
        .apply(
            snapshot(
                1,
                vec![
                    route_with("default/r/big", &["/big"], "u", vec![rr(1 << 20)]),
                    route_with("default/r/small", &["/small"], "u", vec![rr(5)]),
                ],
                vec![upstream("u", &[(origin, 1)])],
            ),
            vec![],
        )
        .unwrap();
    let r = request(dp.addr, "GET", "/big", &[]).await;
    assert_eq!(r.text(), "bye world, bye moon");
    assert!(h(&r, "content-encoding").is_none(), "sent decoded");
    assert!(h(&r, "etag").is_none());
    let r = request(dp.addr, "GET", "/small", &[]).await;
    assert_eq!(
        r.text(),
        "hello world, hello moon",
        "over max_resp_body_size: unfiltered"
    );
    assert!(h(&r, "content-encoding").is_none());
}

#[tokio::test]
async fn bad_configs_are_rejected_naming_plugin_and_field() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane_to("/*", echo.addr).await;
    for (p, want) in [
        (
            plugin("proxy-rewrite", json!({"regex_uri": ["^/(.*"]})),
            "plugin \"proxy-rewrite\": regex_uri: must hold pairs",
        ),
        (
            plugin("proxy-rewrite", json!({"regex_uri": ["^/(.*", "/$1"]})),
            "plugin \"proxy-rewrite\": regex_uri[0]: bad regex",
        ),
        (
            plugin("proxy-rewrite", json!({"method": "FETCH"})),
            "plugin \"proxy-rewrite\": method: \"FETCH\" is not one of",
        ),
        (
            plugin("proxy-rewrite", json!({"uri": "/$nope"})),
            "plugin \"proxy-rewrite\": uri: unknown variable $nope",
        ),
        (
            plugin("proxy-rewrite", json!({"urii": "/x"})),
            "unknown field `urii`",
        ),
        (
            plugin("redirect", json!({"http_to_https": true, "uri": "/x"})),
            "plugin \"redirect\": exactly one of http_to_https, uri and regex_uri",
        ),
        (
            plugin("redirect", json!({"uri": "/x", "ret_code": 99})),
            "plugin \"redirect\": ret_code: 99 is out of range",
        ),
        (
            plugin("response-rewrite", json!({"status_code": 600})),
            "plugin \"response-rewrite\": status_code: 600 is out of range",
        ),
        (
            plugin(
                "response-rewrite",
                json!({"vars": [["arg_a", "like", "b"]]}),
            ),
            "plugin \"response-rewrite\": vars[0]: operator \"like\" is not supported",
        ),
        (
            plugin(
                "response-rewrite",
                json!({"body": "!!", "body_base64": true}),
            ),
            "plugin \"response-rewrite\": body: not base64",
        ),
        (
            plugin(
                "response-rewrite",
                json!({"headers": {"set": {"X-A": {"no": 1}}}}),
            ),
            "plugin \"response-rewrite\": headers.set.X-A: must be a string",
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
