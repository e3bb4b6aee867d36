//! cors, ip-restriction and real-ip through the dataplane against a real origin.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use http::StatusCode;
use serde_json::json;
use sluice_testkit::EchoServer;

#[tokio::test]
async fn cors_defaults_allow_any_origin_and_answer_preflight() {
    let (_echo, dp) = with_plugins(vec![plugin("cors", json!({}))]).await;
    let pre = request(
        dp.addr,
        "OPTIONS",
        "/api",
        &[
            ("origin", "https://app.example"),
            ("access-control-request-method", "PUT"),
        ],
    )
    .await;
    assert_eq!(pre.status, StatusCode::OK);
    assert!(pre.body.is_empty());
    assert!(h(&pre, "x-echo-server").is_none(), "answered by the plugin");
    assert_eq!(h(&pre, "access-control-allow-origin"), Some("*"));
    assert_eq!(h(&pre, "access-control-allow-methods"), Some("*"));
    assert_eq!(h(&pre, "access-control-allow-headers"), Some("*"));
    assert_eq!(h(&pre, "access-control-max-age"), Some("5"));
    assert!(h(&pre, "access-control-allow-credentials").is_none());
    assert!(h(&pre, "access-control-expose-headers").is_none());
    assert!(h(&pre, "vary").is_none());

    let r = request(dp.addr, "GET", "/api", &[("origin", "https://app.example")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["path"], "/api");
    assert_eq!(h(&r, "access-control-allow-origin"), Some("*"));

    let free = request(
        dp.addr,
        "GET",
        "/free",
        &[("origin", "https://app.example")],
    )
    .await;
    assert!(h(&free, "access-control-allow-origin").is_none());
}

#[tokio::test]
async fn cors_listed_origins_with_credentials() {
    let (_echo, dp) = with_plugins(vec![plugin(
        "cors",
        json!({
            "allow_origins": "https://a.example,https://b.example:8443",
            "allow_methods": "GET,POST",
            "allow_headers": "**",
            "expose_headers": "X-Total",
            "max_age": 600,
            "allow_credential": true
        }),
    )])
    .await;
    let r = request(
        dp.addr,
        "OPTIONS",
        "/",
        &[
            ("origin", "https://b.example:8443"),
            ("access-control-request-headers", "x-token,content-type"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        h(&r, "access-control-allow-origin"),
        Some("https://b.example:8443")
    );
    assert_eq!(h(&r, "vary"), Some("Origin"));
    assert_eq!(h(&r, "access-control-allow-methods"), Some("GET,POST"));
    assert_eq!(
        h(&r, "access-control-allow-headers"),
        Some("x-token,content-type"),
        "** echoes the requested headers"
    );
    assert_eq!(h(&r, "access-control-expose-headers"), Some("X-Total"));
    assert_eq!(h(&r, "access-control-max-age"), Some("600"));
    assert_eq!(h(&r, "access-control-allow-credentials"), Some("true"));

    // An origin not listed gets no CORS headers (the browser then blocks it).
    let r = request(dp.addr, "GET", "/", &[("origin", "https://evil.example")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(h(&r, "access-control-allow-origin").is_none());
    assert!(h(&r, "access-control-allow-credentials").is_none());
    assert_eq!(
        h(&r, "vary"),
        Some("Origin"),
        "caches must still key on Origin"
    );
}

#[tokio::test]
async fn cors_single_origin_is_always_sent_and_timing_allow_origin() {
    let (_echo, dp) = with_plugins(vec![plugin(
        "cors",
        json!({"allow_origins": "https://app.example",
               "timing_allow_origins": "https://app.example,https://perf.example"}),
    )])
    .await;
    // As APISIX: one configured origin is sent whatever the request's Origin is.
    let r = request(dp.addr, "GET", "/", &[("origin", "https://other.example")]).await;
    assert_eq!(
        h(&r, "access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(h(&r, "vary"), Some("Origin"));
    assert!(h(&r, "timing-allow-origin").is_none());
    let r = request(dp.addr, "GET", "/", &[("origin", "https://perf.example")]).await;
    assert_eq!(h(&r, "timing-allow-origin"), Some("https://perf.example"));
}

#[tokio::test]
async fn cors_origins_by_regex_and_echo() {
    let (_echo, dp) = with_plugins(vec![plugin(
        "cors",
        json!({"allow_origins_by_regex": ["^https://.*\\.test\\.com$", "partner"],
               "allow_origins": "https://ignored.example"}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/", &[("origin", "https://api.test.com")]).await;
    assert_eq!(
        h(&r, "access-control-allow-origin"),
        Some("https://api.test.com")
    );
    assert_eq!(h(&r, "vary"), Some("Origin"));
    let r = request(
        dp.addr,
        "GET",
        "/",
        &[("origin", "https://api.test.com.evil")],
    )
    .await;
    assert!(
        h(&r, "access-control-allow-origin").is_none(),
        "anchored pattern"
    );
    // NB: a search, as ngx.re.find: an unanchored pattern matches anywhere.
    let r = request(
        dp.addr,
        "GET",
        "/",
        &[("origin", "https://partner.example")],
    )
    .await;
    assert_eq!(
        h(&r, "access-control-allow-origin"),
        Some("https://partner.example")
    );
    let r = request(
        dp.addr,
        "GET",
        "/",
        &[("origin", "https://ignored.example")],
    )
    .await;
    assert!(
        h(&r, "access-control-allow-origin").is_none(),
        "regexes replace the list"
    );
    let r = request(dp.addr, "GET", "/", &[]).await;
    assert!(h(&r, "access-control-allow-origin").is_none(), "no Origin");

    let (_echo, dp) = with_plugins(vec![plugin(
        "cors",
        json!({"allow_origins": "**", "allow_methods": "**", "allow_headers": "x-a", "allow_credential": true}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/", &[("origin", "https://any.example")]).await;
    assert_eq!(
        h(&r, "access-control-allow-origin"),
        Some("https://any.example")
    );
    assert_eq!(
        h(&r, "access-control-allow-methods"),
        Some("GET,POST,PUT,DELETE,PATCH,HEAD,OPTIONS,CONNECT,TRACE")
    );
}

#[tokio::test]
async fn ip_restriction_whitelist_and_blacklist() {
    let (_echo, dp) = with_plugins(vec![plugin(
        "ip-restriction",
        json!({"blacklist": ["127.0.0.0/24", "10.0.0.1"]}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/", &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        r.json(),
        json!({"message": "Your IP address is not allowed"})
    );
    assert!(h(&r, "x-echo-server").is_none());
    assert_eq!(
        request(dp.addr, "GET", "/free", &[]).await.status,
        StatusCode::OK
    );

    let (_echo, dp) = with_plugins(vec![plugin(
        "ip-restriction",
        json!({"whitelist": ["10.0.0.0/8", "::1"], "message": "go away", "response_code": 404}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/", &[]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json(), json!({"message": "go away"}));

    let (_echo, dp) = with_plugins(vec![plugin(
        "ip-restriction",
        json!({"whitelist": ["127.0.0.1"]}),
    )])
    .await;
    assert_eq!(
        request(dp.addr, "GET", "/", &[]).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn real_ip_feeds_ip_restriction_limit_count_and_the_upstream() {
    let (_echo, dp) = with_plugins(vec![
        plugin(
            "real-ip",
            json!({"source": "http_x_forwarded_for", "trusted_addresses": ["127.0.0.1", "10.0.0.0/8"], "recursive": true}),
        ),
        plugin("ip-restriction", json!({"blacklist": ["203.0.113.7"]})),
        plugin("limit-count", json!({"count": 1, "time_window": 60})),
    ])
    .await;
    // The rightmost untrusted address is the client.
    let r = request(
        dp.addr,
        "GET",
        "/",
        &[("x-forwarded-for", "198.51.100.1, 198.51.100.9, 10.1.1.1")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let j = r.json();
    assert_eq!(j["headers"]["x-real-ip"], "198.51.100.9");
    assert_eq!(
        j["headers"]["x-forwarded-for"],
        "198.51.100.1, 198.51.100.9, 10.1.1.1, 198.51.100.9"
    );
    // limit-count keys on the real address: another client still has its budget...
    let r = request(dp.addr, "GET", "/", &[("x-forwarded-for", "198.51.100.2")]).await;
    assert_eq!(r.status, StatusCode::OK);
    // ... and the first one has used its own.
    let r = request(dp.addr, "GET", "/", &[("x-forwarded-for", "198.51.100.9")]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    // ip-restriction sees the real address.
    let r = request(dp.addr, "GET", "/", &[("x-forwarded-for", "203.0.113.7")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // Garbage changes nothing: the connection's address is used (a budget of its own).
    let r = request(dp.addr, "GET", "/", &[("x-forwarded-for", "not-an-ip")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["headers"]["x-real-ip"], "127.0.0.1");
}

#[tokio::test]
async fn real_ip_ignores_untrusted_peers_and_reads_other_sources() {
    let (_echo, dp) = with_plugins(vec![plugin(
        "real-ip",
        json!({"source": "http_x_forwarded_for", "trusted_addresses": ["192.0.2.0/24"]}),
    )])
    .await;
    let r = request(dp.addr, "GET", "/", &[("x-forwarded-for", "198.51.100.1")]).await;
    assert_eq!(
        r.json()["headers"]["x-real-ip"],
        "127.0.0.1",
        "peer not trusted"
    );

    let (_echo, dp) = with_plugins(vec![plugin("real-ip", json!({"source": "arg_realip"}))]).await;
    let r = request(dp.addr, "GET", "/?realip=192.0.2.44:1234", &[]).await;
    assert_eq!(r.json()["headers"]["x-real-ip"], "192.0.2.44");
    let r = request(dp.addr, "GET", "/", &[("x-forwarded-for", "198.51.100.1")]).await;
    assert_eq!(r.json()["headers"]["x-real-ip"], "127.0.0.1");
}

#[tokio::test]
async fn bad_configs_are_rejected_naming_plugin_and_field() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane_to("/*", echo.addr).await;
    for (p, want) in [
        (
            plugin("cors", json!({"allow_credential": true})),
            "plugin \"cors\": allow_origins: \"*\" is not allowed when allow_credential is true",
        ),
        (
            plugin("cors", json!({"allow_origins_by_regex": ["(unclosed"]})),
            "plugin \"cors\": allow_origins_by_regex[0]: bad regex",
        ),
        (
            plugin("cors", json!({"max_age": "soon"})),
            "plugin \"cors\": max_age: invalid type",
        ),
        (
            plugin("ip-restriction", json!({"whitelist": ["10.0.0.0/33"]})),
            "plugin \"ip-restriction\": whitelist[0]: \"10.0.0.0/33\" is not an IP address or CIDR",
        ),
        (
            plugin(
                "ip-restriction",
                json!({"whitelist": ["1.1.1.1"], "blacklist": ["2.2.2.2"]}),
            ),
            "plugin \"ip-restriction\": exactly one of whitelist and blacklist",
        ),
        (
            plugin("real-ip", json!({"source": "nope"})),
            "plugin \"real-ip\": source: unknown variable \"nope\"",
        ),
        (
            plugin("real-ip", json!({})),
            "plugin \"real-ip\": missing field `source`",
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
