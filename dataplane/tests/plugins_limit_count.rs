//! limit-count through the dataplane against a real origin: what a client observes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use http::StatusCode;
use serde_json::json;
use sluice_testkit::EchoServer;

fn hdr<'a>(r: &'a Resp, name: &str) -> &'a str {
    r.headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header in {:?}", r.headers))
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn counts_then_rejects_with_apisix_headers() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let lc = plugin("limit-count", json!({"count": 2, "time_window": 60}));
    dp.store
        .apply(
            snapshot(
                1,
                vec![
                    route_with("default/r/limited", &["/limited"], "u", vec![lc]),
                    route("default/r/free", &["/free"], "u"),
                ],
                vec![upstream("u", &[(echo.addr, 1)])],
            ),
            vec![],
        )
        .unwrap();

    let r1 = get(dp.addr, "example.com", "/limited").await;
    assert_eq!(r1.status, StatusCode::OK);
    assert_eq!(hdr(&r1, "x-ratelimit-limit"), "2");
    assert_eq!(hdr(&r1, "x-ratelimit-remaining"), "1");
    let reset: u64 = hdr(&r1, "x-ratelimit-reset").parse().unwrap();
    assert!((59..=60).contains(&reset), "reset {reset}");
    assert_eq!(r1.json()["path"], "/limited", "the origin answered");

    let r2 = get(dp.addr, "example.com", "/limited").await;
    assert_eq!(r2.status, StatusCode::OK);
    assert_eq!(hdr(&r2, "x-ratelimit-remaining"), "0");

    let r3 = get(dp.addr, "example.com", "/limited").await;
    assert_eq!(r3.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(hdr(&r3, "x-ratelimit-limit"), "2");
    assert_eq!(hdr(&r3, "x-ratelimit-remaining"), "0");
    assert!(
        r3.body.is_empty(),
        "no rejected_msg: empty body, got {:?}",
        r3.text()
    );
    assert!(
        r3.headers.get("x-echo-server").is_none(),
        "the origin was not asked"
    );

    // A route without the plugin is unaffected and carries no rate-limit headers.
    let free = get(dp.addr, "example.com", "/free").await;
    assert_eq!(free.status, StatusCode::OK);
    assert!(free.headers.get("x-ratelimit-limit").is_none());
}

#[tokio::test]
async fn rejected_code_and_msg_and_keys_by_header() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let lc = plugin(
        "limit-count",
        json!({"count": 1, "time_window": 30, "key": "http_x_user", "rejected_code": 429,
               "rejected_msg": "slow down", "show_limit_quota_header": false}),
    );
    dp.store
        .apply(
            snapshot(
                1,
                vec![route_with("default/r/r1", &["/*"], "u", vec![lc])],
                vec![upstream("u", &[(echo.addr, 1)])],
            ),
            vec![],
        )
        .unwrap();
    let a1 = get_with(dp.addr, "/", &[("x-user", "alice")]).await;
    assert_eq!(a1.status, StatusCode::OK);
    assert!(a1.headers.get("x-ratelimit-limit").is_none());
    let a2 = get_with(dp.addr, "/", &[("x-user", "alice")]).await;
    assert_eq!(a2.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a2.json(), json!({"error_msg": "slow down"}));
    // Bob has a budget of his own.
    let b1 = get_with(dp.addr, "/", &[("x-user", "bob")]).await;
    assert_eq!(b1.status, StatusCode::OK);
}

#[tokio::test]
async fn budget_survives_an_unchanged_reload_and_resets_on_change() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let snap = |v: u64, count: u64| {
        snapshot(
            v,
            vec![route_with(
                "default/r/r1",
                &["/*"],
                "u",
                vec![plugin(
                    "limit-count",
                    json!({"count": count, "time_window": 60}),
                )],
            )],
            vec![upstream("u", &[(echo.addr, 1)])],
        )
    };
    dp.store.apply(snap(1, 1), vec![]).unwrap();
    assert_eq!(get(dp.addr, "h", "/").await.status, StatusCode::OK);
    assert_eq!(
        get(dp.addr, "h", "/").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    dp.store.apply(snap(2, 1), vec![]).unwrap();
    assert_eq!(
        get(dp.addr, "h", "/").await.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "same config after a reload: same budget"
    );
    dp.store.apply(snap(3, 2), vec![]).unwrap();
    let r = get(dp.addr, "h", "/").await;
    assert_eq!(r.status, StatusCode::OK, "a changed config starts afresh");
    assert_eq!(hdr(&r, "x-ratelimit-remaining"), "1");
}

#[tokio::test]
async fn bad_plugin_config_is_rejected_and_the_last_good_snapshot_serves() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane_to("/*", echo.addr).await;
    for (p, want) in [
        (
            plugin("no-such-plugin", json!({})),
            "plugin \"no-such-plugin\" is unknown",
        ),
        (
            plugin("limit-count", json!({"count": "lots", "time_window": 60})),
            "plugin \"limit-count\": count: invalid type: string \"lots\"",
        ),
        (
            plugin("limit-count", json!({"count": 5, "time_window": 0})),
            "plugin \"limit-count\": time_window: must be at least 1",
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
        assert!(err.contains(want), "{err}");
        let r = get(dp.addr, "h", "/x").await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "the previous snapshot keeps serving"
        );
        assert!(r.headers.get("x-ratelimit-limit").is_none());
    }
}

#[tokio::test]
async fn the_route_limit_sets_the_headers_after_a_global_one() {
    // Both limits count the request; as in APISIX (`core.response.set_header`), the
    // route's limit-count, which runs last, sets the headers: one of each, not two.
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let mut snap = snapshot(
        1,
        vec![
            route_with(
                "default/r/limited",
                &["/limited"],
                "u",
                vec![plugin(
                    "limit-count",
                    json!({"count": 2, "time_window": 60}),
                )],
            ),
            route("default/r/plain", &["/plain"], "u"),
        ],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    snap.global_rules = vec![sluice_proto::v1::GlobalRule {
        id: "default/g".into(),
        plugins: vec![plugin(
            "limit-count",
            json!({"count": 10, "time_window": 60, "key_type": "constant", "key": "all"}),
        )],
    }];
    dp.store.apply(snap, vec![]).unwrap();

    let r = get(dp.addr, "example.com", "/limited").await;
    assert_eq!(r.status, StatusCode::OK);
    for name in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        assert_eq!(r.headers.get_all(name).iter().count(), 1, "{name}");
    }
    assert_eq!(hdr(&r, "x-ratelimit-limit"), "2");
    assert_eq!(hdr(&r, "x-ratelimit-remaining"), "1");

    // The global budget counted that request too.
    let r = get(dp.addr, "example.com", "/plain").await;
    assert_eq!(hdr(&r, "x-ratelimit-limit"), "10");
    assert_eq!(hdr(&r, "x-ratelimit-remaining"), "8");
}
