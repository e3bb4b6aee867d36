//! Load balancing against real origins: smooth weighted round robin, consistent hashing
//! (stickiness and how many keys move when an endpoint joins), least_conn, ewma, passHost
//! and the keep-alive pool knobs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::Full;
use sluice_dataplane::config::store::Store;
use sluice_dataplane::upstream::PoolConfig;
use sluice_proto::v1;

fn apply(dp: &Dataplane, version: u64, up: v1::Upstream) {
    dp.store
        .apply(
            snapshot(
                version,
                vec![route("default/r/r1", &["/*"], &up.id)],
                vec![up],
            ),
            vec![],
        )
        .unwrap();
}

async fn get_with(dp: &Dataplane, path: &str, headers: &[(&str, &str)]) -> Resp {
    let mut b = Request::get(path).header("host", "app.example.com");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(dp.addr, b.body(Full::new(Bytes::new())).unwrap()).await
}

fn origin_of(r: &Resp) -> String {
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    r.headers["x-origin"].to_str().unwrap().to_owned()
}

#[tokio::test]
async fn round_robin_is_smooth_and_weighted() {
    let (a, b) = (Origin::start("a"), Origin::start("b"));
    let dp = dataplane().await;
    let mut up = upstream_of("u", &[a.addr, b.addr]);
    up.endpoints[0].weight = 300;
    apply(&dp, 1, up);
    let mut seq = String::new();
    for _ in 0..8 {
        seq.push_str(&origin_of(&get_with(&dp, "/x", &[]).await));
    }
    // 3:1, interleaved (never four a's in a row within a cycle).
    assert_eq!(seq.matches('a').count(), 6, "{seq}");
    assert!(!seq.contains("aaaa"), "{seq}");
}

#[tokio::test]
async fn chash_on_a_header_is_sticky_and_a_new_endpoint_takes_only_its_share() {
    let origins: Vec<Origin> = ["a", "b", "c", "d", "e"]
        .into_iter()
        .map(Origin::start)
        .collect();
    let dp = dataplane().await;
    let mut up = upstream_of(
        "u",
        &origins[..4].iter().map(|o| o.addr).collect::<Vec<_>>(),
    );
    up.load_balancer = v1::LoadBalancer::Chash as i32;
    up.hash_on = v1::UpstreamHashOn::Header as i32;
    up.hash_key = "x-user".into();
    apply(&dp, 1, up.clone());

    let keys = 400;
    let mut before = HashMap::new();
    for k in 0..keys {
        let user = format!("user-{k}");
        let o = origin_of(&get_with(&dp, "/x", &[("x-user", &user)]).await);
        // Sticky: the same key lands on the same endpoint again.
        assert_eq!(
            origin_of(&get_with(&dp, "/y", &[("x-user", &user)]).await),
            o
        );
        before.insert(user, o);
    }
    let used: std::collections::HashSet<&String> = before.values().collect();
    assert_eq!(used.len(), 4, "keys spread over all four endpoints");

    let mut up5 = upstream_of("u", &origins.iter().map(|o| o.addr).collect::<Vec<_>>());
    up5.load_balancer = up.load_balancer;
    up5.hash_on = up.hash_on;
    up5.hash_key = up.hash_key.clone();
    apply(&dp, 2, up5);
    let mut moved = 0;
    for (user, o) in &before {
        let now = origin_of(&get_with(&dp, "/x", &[("x-user", user)]).await);
        if &now != o {
            moved += 1;
            assert_eq!(now, "e", "a key moved between two old endpoints");
        }
    }
    let share = moved as f64 / keys as f64;
    println!(
        "chash: {moved} of {keys} keys moved ({:.1}%) when a 5th endpoint joined",
        share * 100.0
    );
    assert!((0.05..=0.30).contains(&share), "moved {share}");
}

#[tokio::test]
async fn chash_on_a_cookie_and_on_vars_combinations() {
    let origins: Vec<Origin> = ["a", "b", "c"].into_iter().map(Origin::start).collect();
    let addrs: Vec<_> = origins.iter().map(|o| o.addr).collect();
    let dp = dataplane().await;
    let mut up = upstream_of("u", &addrs);
    up.load_balancer = v1::LoadBalancer::Chash as i32;
    up.hash_on = v1::UpstreamHashOn::Cookie as i32;
    up.hash_key = "session".into();
    apply(&dp, 1, up.clone());
    let mut seen = std::collections::HashSet::new();
    for k in 0..30 {
        let c = format!("session=s{k}; other=1");
        let o = origin_of(&get_with(&dp, "/x", &[("cookie", &c)]).await);
        for _ in 0..3 {
            assert_eq!(origin_of(&get_with(&dp, "/x", &[("cookie", &c)]).await), o);
        }
        seen.insert(o);
    }
    assert!(seen.len() > 1, "cookie keys spread");

    up.hash_on = v1::UpstreamHashOn::VarsCombinations as i32;
    up.hash_key = "$arg_user-$uri".into();
    apply(&dp, 2, up);
    let mut seen = std::collections::HashSet::new();
    for k in 0..30 {
        let path = format!("/p?user=u{k}");
        let o = origin_of(&get_with(&dp, &path, &[]).await);
        for _ in 0..3 {
            assert_eq!(origin_of(&get_with(&dp, &path, &[]).await), o);
        }
        seen.insert(o);
    }
    assert!(seen.len() > 1, "template keys spread");
}

#[tokio::test]
async fn least_conn_sends_new_requests_away_from_the_busy_endpoint() {
    let (a, b) = (Origin::start("a"), Origin::start("b"));
    let dp = dataplane().await;
    let mut up = upstream_of("u", &[a.addr, b.addr]);
    up.load_balancer = v1::LoadBalancer::LeastConn as i32;
    apply(&dp, 1, up);
    let addr = dp.addr;
    let slow = tokio::spawn(async move { get(addr, "h", "/delay/1500").await });
    // Wait until the slow request is in flight at one origin.
    assert!(
        eventually(Duration::from_secs(2), || {
            a.state.requests.load(Ordering::SeqCst) + b.state.requests.load(Ordering::SeqCst) == 1
        })
        .await
    );
    let busy = if a.state.requests.load(Ordering::SeqCst) == 1 {
        "a"
    } else {
        "b"
    };
    for _ in 0..6 {
        let o = origin_of(&get_with(&dp, "/x", &[]).await);
        assert_ne!(
            o, busy,
            "least_conn picked the endpoint with a request in flight"
        );
    }
    assert_eq!(slow.await.unwrap().status, StatusCode::OK);
    let text = dp.store.metrics().render();
    let in_flight = metric(
        &text,
        "sluice_upstream_requests_in_flight",
        &["upstream=\"u\""],
    );
    assert_eq!(in_flight, Some(0.0), "{text}");
}

#[tokio::test]
async fn ewma_prefers_the_faster_endpoint() {
    let (fast, slow) = (Origin::start("fast"), Origin::start("slow"));
    slow.state.delay_ms.store(30, Ordering::SeqCst);
    let dp = dataplane().await;
    let mut up = upstream_of("u", &[fast.addr, slow.addr]);
    up.load_balancer = v1::LoadBalancer::Ewma as i32;
    apply(&dp, 1, up);
    let mut counts: HashMap<String, usize> = HashMap::new();
    for _ in 0..30 {
        *counts
            .entry(origin_of(&get_with(&dp, "/x", &[]).await))
            .or_default() += 1;
    }
    println!("ewma picks over 30 requests: {counts:?}");
    // Each endpoint is measured once; then the lower latency average wins.
    assert!(counts.get("fast").copied().unwrap_or(0) >= 27, "{counts:?}");
    assert!(counts.get("slow").copied().unwrap_or(0) >= 1, "{counts:?}");
}

#[tokio::test]
async fn pass_host_node_and_rewrite_set_the_upstream_host() {
    let a = Origin::start("a");
    let dp = dataplane().await;
    let mut up = upstream_of("u", &[a.addr]);

    // pass (default): the client's Host.
    apply(&dp, 1, up.clone());
    let r = get_with(&dp, "/x", &[]).await;
    assert_eq!(r.headers["x-seen-host"], "app.example.com");

    up.pass_host = v1::UpstreamPassHost::Node as i32;
    apply(&dp, 2, up.clone());
    let r = get_with(&dp, "/x", &[]).await;
    assert_eq!(
        r.headers["x-seen-host"].to_str().unwrap(),
        a.addr.to_string()
    );

    up.pass_host = v1::UpstreamPassHost::Rewrite as i32;
    up.upstream_host = "internal.example.com".into();
    apply(&dp, 3, up.clone());
    let r = get_with(&dp, "/x", &[]).await;
    assert_eq!(r.headers["x-seen-host"], "internal.example.com");

    // Rewrite without a host is refused and the last good snapshot keeps serving.
    up.upstream_host = String::new();
    let err = dp
        .store
        .apply(
            snapshot(4, vec![route("default/r/r1", &["/*"], "u")], vec![up]),
            vec![],
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("upstream u: upstream_host"),
        "{err}"
    );
    let r = get_with(&dp, "/x", &[]).await;
    assert_eq!(r.headers["x-seen-host"], "internal.example.com");
}

#[tokio::test]
async fn keepalive_pool_reuses_connections_up_to_the_request_limit() {
    let a = Origin::start("a");
    let store = Arc::new(
        Store::with_pool_config(PoolConfig {
            max_requests: 3,
            ..Default::default()
        })
        .unwrap(),
    );
    let dp = dataplane_with(store).await;
    apply(&dp, 1, upstream_of("u", &[a.addr]));
    for _ in 0..9 {
        assert_eq!(get_with(&dp, "/x", &[]).await.status, StatusCode::OK);
    }
    // 9 requests, 3 per connection.
    assert_eq!(a.state.connections.load(Ordering::SeqCst), 3);
    let text = dp.store.metrics().render();
    let ep = format!("endpoint=\"{}\"", a.addr);
    assert_eq!(
        metric(
            &text,
            "sluice_upstream_connections_total",
            &[&ep, "reused=\"false\""]
        ),
        Some(3.0)
    );
    assert_eq!(
        metric(
            &text,
            "sluice_upstream_connections_total",
            &[&ep, "reused=\"true\""]
        ),
        Some(6.0)
    );
}

#[tokio::test]
async fn domain_endpoints_are_resolved_off_the_request_path() {
    let a = Origin::start("a");
    let dp = dataplane().await;
    let up = v1::Upstream {
        id: "u".into(),
        endpoints: vec![v1::Endpoint {
            host: "localhost".into(),
            port: a.addr.port().into(),
            weight: 100,
        }],
        ..Default::default()
    };
    apply(&dp, 1, up);
    for _ in 0..3 {
        assert_eq!(origin_of(&get_with(&dp, "/x", &[]).await), "a");
    }
}
