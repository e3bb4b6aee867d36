//! limit-req and limit-conn (local policy) through the dataplane.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use serde_json::json;
use sluice_testkit::EchoServer;

#[tokio::test]
async fn limit_req_delays_within_burst_and_rejects_beyond() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    dp.store
        .apply(
            snapshot(
                1,
                vec![
                    route_with(
                        "default/r/delay",
                        &["/delay-me"],
                        "u",
                        vec![plugin(
                            "limit-req",
                            json!({"rate": 5, "burst": 1, "key": "remote_addr"}),
                        )],
                    ),
                    route_with(
                        "default/r/nodelay",
                        &["/nodelay"],
                        "u",
                        vec![plugin(
                            "limit-req",
                            json!({"rate": 0.5, "burst": 0, "key": "remote_addr", "nodelay": true,
                                   "rejected_code": 429, "rejected_msg": "too fast"}),
                        )],
                    ),
                ],
                vec![upstream("u", &[(echo.addr, 1)])],
            ),
            vec![],
        )
        .unwrap();
    assert_eq!(get(dp.addr, "h", "/delay-me").await.status, StatusCode::OK);
    // rate 5/s: the second request in a row waits ~200 ms (excess 1 ≤ burst 1).
    let t = Instant::now();
    assert_eq!(get(dp.addr, "h", "/delay-me").await.status, StatusCode::OK);
    assert!(
        t.elapsed() >= Duration::from_millis(100),
        "was delayed: {:?}",
        t.elapsed()
    );

    assert_eq!(get(dp.addr, "h", "/nodelay").await.status, StatusCode::OK);
    let r = get(dp.addr, "h", "/nodelay").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json(), json!({"error_msg": "too fast"}));
}

#[tokio::test]
async fn limit_conn_counts_requests_in_flight() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    dp.store
        .apply(
            snapshot(
                1,
                vec![route_with(
                    "default/r/c",
                    &["/*"],
                    "u",
                    vec![plugin(
                        "limit-conn",
                        json!({"conn": 1, "burst": 0, "default_conn_delay": 0.1, "key": "remote_addr",
                               "rejected_msg": "busy"}),
                    )],
                )],
                vec![upstream("u", &[(echo.addr, 1)])],
            ),
            vec![],
        )
        .unwrap();
    let addr = dp.addr;
    let slow = tokio::spawn(async move { get(addr, "h", "/delay/500").await.status });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = get(dp.addr, "h", "/x").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.json(), json!({"error_msg": "busy"}));
    assert_eq!(slow.await.unwrap(), StatusCode::OK);
    assert_eq!(
        get(dp.addr, "h", "/x").await.status,
        StatusCode::OK,
        "slot released"
    );
}
