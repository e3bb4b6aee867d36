//! Rate limits with `policy: redis` against a real `redis-server` (Debian package, started
//! here on a free loopback port): two dataplane processes share one budget, and a Redis that
//! is down (never started, or SIGKILLed under traffic and started again) makes
//! `allow_degradation` decide between passing and 500.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use serde_json::json;
use sluice_testkit::EchoServer;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A real Redis on a loopback port, without persistence.
async fn redis() -> (Killed, SocketAddr) {
    redis_on(free_port()).await
}

/// A real Redis on `addr` (a restart of one that was killed).
async fn redis_on(addr: SocketAddr) -> (Killed, SocketAddr) {
    let child = Command::new("redis-server")
        .args([
            "--port",
            &addr.port().to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (scripts/install/test-deps.sh installs it)");
    assert!(
        listening(addr, Duration::from_secs(10)).await,
        "redis-server did not start"
    );
    (Killed(child), addr)
}

fn yaml(echo: SocketAddr, redis: SocketAddr) -> String {
    format!(
        r#"apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: shared, namespace: default}}
spec:
  http:
    - name: r1
      match: {{paths: ["/*"]}}
      backends: [{{serviceName: echo, servicePort: 80}}]
      plugins:
        - name: limit-count
          config:
            count: 5
            time_window: 60
            key_type: constant
            key: everyone
            policy: redis
            redis_host: "127.0.0.1"
            redis_port: {rport}
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: default}}
spec:
  ports: [{{name: http, port: 80, targetPort: {eport}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-1
  namespace: default
  labels: {{kubernetes.io/service-name: echo}}
addressType: IPv4
endpoints:
  - addresses: ["127.0.0.1"]
    conditions: {{ready: true}}
ports: [{{name: http, port: {eport}}}]
"#,
        rport = redis.port(),
        eport = echo.port()
    )
}

async fn start_dataplane(config: &std::path::Path) -> (Killed, SocketAddr) {
    let http = free_port();
    let admin = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_sluice-dataplane"))
        .arg("--standalone")
        .arg(config)
        .args([
            "--listen-http",
            &http.to_string(),
            "--admin",
            &admin.to_string(),
            "--workers",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let p = Killed(child);
    assert!(
        eventually_async(
            Wait::up_to(Duration::from_secs(10)).every(Duration::from_millis(20)),
            || async move {
                tokio::net::TcpStream::connect(admin).await.is_ok()
                    && get(admin, "admin", "/readyz").await.status == StatusCode::OK
            }
        )
        .await,
        "dataplane did not become ready"
    );
    (p, http)
}

#[tokio::test]
#[ignore = "system tier: a real redis-server (scripts/install/test-deps.sh installs it; scripts/test.sh runs this)"]
async fn two_dataplane_processes_share_one_budget() {
    let (_redis, raddr) = redis().await;
    let echo = EchoServer::start("a", "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("routes.yaml");
    std::fs::write(&cfg, yaml(echo.addr, raddr)).unwrap();
    let (_a, a) = start_dataplane(&cfg).await;
    let (_b, b) = start_dataplane(&cfg).await;

    let mut seen = Vec::new();
    for i in 0..8 {
        let addr = if i % 2 == 0 { a } else { b };
        let r = get(addr, "h", "/x").await;
        seen.push((
            r.status.as_u16(),
            r.headers["x-ratelimit-remaining"]
                .to_str()
                .unwrap()
                .to_owned(),
        ));
    }
    let want: Vec<(u16, String)> = [
        (200, "4"),
        (200, "3"),
        (200, "2"),
        (200, "1"),
        (200, "0"),
        (503, "0"),
        (503, "0"),
        (503, "0"),
    ]
    .iter()
    .map(|(s, r)| (*s, r.to_string()))
    .collect();
    assert_eq!(seen, want, "one budget of 5 across both processes");
    let reset: u64 = get(a, "h", "/x").await.headers["x-ratelimit-reset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&reset), "reset {reset}");
}

fn limited(policy_cfg: serde_json::Value) -> Vec<sluice_proto::v1::Route> {
    vec![route_with(
        "default/r/r1",
        &["/*"],
        "u",
        vec![plugin("limit-count", policy_cfg)],
    )]
}

#[tokio::test]
#[ignore = "system tier: a real redis-server (scripts/install/test-deps.sh installs it; scripts/test.sh runs this)"]
async fn redis_down_degrades_or_fails_by_allow_degradation() {
    let echo = EchoServer::start("a", "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dead = free_port(); // nothing listens here
    for (allow, want) in [
        (true, StatusCode::OK),
        (false, StatusCode::INTERNAL_SERVER_ERROR),
    ] {
        let dp = dataplane().await;
        let cfg = json!({"count": 1, "time_window": 60, "policy": "redis",
            "redis_host": "127.0.0.1", "redis_port": dead.port(), "redis_timeout": 500,
            "allow_degradation": allow});
        dp.store
            .apply(
                snapshot(1, limited(cfg), vec![upstream("u", &[(echo.addr, 1)])]),
                vec![],
            )
            .unwrap();
        for _ in 0..2 {
            let r = get(dp.addr, "h", "/").await;
            assert_eq!(r.status, want, "allow_degradation {allow}");
            if !allow {
                assert_eq!(r.json(), json!({"error_msg": "failed to limit count"}));
            } else {
                assert!(r.headers.get("x-ratelimit-remaining").is_none());
            }
        }
    }
}

#[tokio::test]
#[ignore = "system tier: a real redis-server (scripts/install/test-deps.sh installs it; scripts/test.sh runs this)"]
async fn limit_req_and_limit_conn_share_state_through_redis() {
    let (_redis, raddr) = redis().await;
    let echo = EchoServer::start("a", "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let redis_cfg = |mut v: serde_json::Value| {
        v["policy"] = json!("redis");
        v["redis_host"] = json!("127.0.0.1");
        v["redis_port"] = json!(raddr.port());
        v
    };
    let routes = vec![
        route_with(
            "default/r/req",
            &["/req"],
            "u",
            vec![plugin(
                "limit-req",
                redis_cfg(
                    json!({"rate": 0.1, "burst": 0, "key": "remote_addr", "rejected_code": 429}),
                ),
            )],
        ),
        route_with(
            "default/r/conn",
            &["/conn", "/delay/*"],
            "u",
            vec![plugin(
                "limit-conn",
                redis_cfg(
                    json!({"conn": 1, "burst": 0, "default_conn_delay": 0.1, "key": "remote_addr"}),
                ),
            )],
        ),
    ];
    // Two in-process dataplanes with separate stores (separate counters) and one Redis.
    let dp1 = dataplane().await;
    let dp2 = dataplane().await;
    for dp in [&dp1, &dp2] {
        dp.store
            .apply(
                snapshot(1, routes.clone(), vec![upstream("u", &[(echo.addr, 1)])]),
                vec![],
            )
            .unwrap();
    }
    assert_eq!(get(dp1.addr, "h", "/req").await.status, StatusCode::OK);
    assert_eq!(
        get(dp2.addr, "h", "/req").await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the other replica sees the same bucket"
    );

    // One slow request in flight on dp1 holds the only slot; dp2 is refused meanwhile.
    let slow = tokio::spawn(async move { get(dp1.addr, "h", "/delay/600").await.status });
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        get(dp2.addr, "h", "/conn").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(slow.await.unwrap(), StatusCode::OK);
    // Released when the slow one finished (a task decrements; give it a moment).
    let addr = dp2.addr;
    let s = eventually_async(
        Wait::up_to(Duration::from_secs(5)).every(Duration::from_millis(50)),
        || async move {
            let s = get(addr, "h", "/conn").await.status;
            if s == StatusCode::OK { Ok(s) } else { Err(s) }
        },
    )
    .await;
    assert!(s.is_ok(), "slot never released: {s:?}");
}

#[tokio::test]
#[ignore = "system tier: a real redis-server (scripts/install/test-deps.sh installs it; scripts/test.sh runs this)"]
async fn redis_killed_under_traffic_then_restarted() {
    let echo = EchoServer::start("a", "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    for allow in [true, false] {
        let (mut redis, raddr) = redis().await;
        let dp = dataplane().await;
        let cfg = json!({"count": 100_000, "time_window": 60, "policy": "redis",
            "redis_host": "127.0.0.1", "redis_port": raddr.port(), "redis_timeout": 300,
            "allow_degradation": allow});
        dp.store
            .apply(
                snapshot(1, limited(cfg), vec![upstream("u", &[(echo.addr, 1)])]),
                vec![],
            )
            .unwrap();
        // One request: its status, and whether Redis counted it (the rate-limit headers).
        let one = || async {
            let r = tokio::time::timeout(Duration::from_secs(5), get(dp.addr, "h", "/"))
                .await
                .expect("a request hung while Redis was down");
            let counted = r.headers.contains_key("x-ratelimit-remaining");
            (r.status, counted, r.json())
        };
        let phase = |name: &'static str, got: (StatusCode, bool, serde_json::Value)| {
            let want_down = if allow {
                StatusCode::OK
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            match name {
                "up" => assert_eq!(
                    (got.0, got.1),
                    (StatusCode::OK, true),
                    "allow {allow}: Redis up"
                ),
                _ => {
                    assert_eq!(got.0, want_down, "allow {allow}: Redis down: {}", got.2);
                    assert!(!got.1, "allow {allow}: counted without Redis");
                    if !allow {
                        assert_eq!(got.2, json!({"error_msg": "failed to limit count"}));
                    }
                }
            }
        };
        for _ in 0..20 {
            phase("up", one().await);
        }
        // SIGKILL under traffic: from the next request on, Redis is gone (connections reset).
        redis.0.kill().unwrap();
        redis.0.wait().unwrap();
        let down = Instant::now();
        while down.elapsed() < Duration::from_millis(1500) {
            phase("down", one().await);
        }
        // Back on the same address: counting resumes without a restart of the dataplane.
        let (_redis, _) = redis_on(raddr).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = one().await;
            if got.1 {
                break;
            }
            phase("down", got);
            assert!(
                Instant::now() < deadline,
                "allow {allow}: counting never resumed"
            );
        }
        for _ in 0..20 {
            phase("up", one().await);
        }
    }
}
