//! traffic-split end to end: ApisixRoute YAML → translate → dataplane, with three real
//! origins (stable = the route's backend, canary = a Service named by `upstream_id`, edge =
//! inline `upstream.nodes`). What a client observes: which origin answered.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use common::*;
use http::StatusCode;
use serde_json::json;
use sluice_testkit::EchoServer;
use sluice_translate::{ClusterState, ConditionStatus, Options, translate};

/// Service `name` (port 80) whose EndpointSlice holds `addr` (standalone YAML accepts
/// loopback endpoints).
fn service(name: &str, addr: SocketAddr) -> String {
    format!(
        r#"
---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: shop}}
spec:
  ports: [{{port: 80}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: shop
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports: [{{port: {port}}}]
endpoints:
  - addresses: ["{ip}"]
"#,
        port = addr.port(),
        ip = addr.ip()
    )
}

/// Translates `yaml` and serves the snapshot; panics if any object is rejected.
fn apply_yaml(dp: &Dataplane, version: u64, yaml: &str) {
    let mut state = ClusterState::default();
    state.load_yaml("test.yaml", yaml).unwrap();
    let t = translate(&state, &Options::default());
    for o in &t.status.objects {
        for c in &o.conditions {
            assert_eq!(
                c.status,
                ConditionStatus::True,
                "{} {}/{}: {}",
                c.type_,
                o.namespace,
                o.name,
                c.message
            );
        }
    }
    dp.store
        .apply(sluice_proto::seal(t.snapshot, version), vec![])
        .unwrap();
}

/// Which origin served `path` (with `headers`), counted over `n` requests.
async fn served_by(
    dp: &Dataplane,
    path: &str,
    headers: &[(&str, &str)],
    n: usize,
) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for _ in 0..n {
        let r = get_with(dp.addr, path, headers).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        *out.entry(r.json()["server"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    out
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[tokio::test]
async fn weighted_split_match_rules_and_fallback_to_the_route_upstream() {
    let stable = EchoServer::start("stable", any()).await.unwrap();
    let canary = EchoServer::start("canary", any()).await.unwrap();
    let edge = EchoServer::start("edge", any()).await.unwrap();
    let yaml = format!(
        r#"
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: app, namespace: shop}}
spec:
  http:
    - name: split
      match: {{paths: ["/split*"]}}
      backends: [{{serviceName: stable, servicePort: 80}}]
      plugins:
        - name: traffic-split
          config:
            rules:
              - match:
                  - vars: [["http_x-canary", "==", "1"]]
                  - vars: [["arg_beta", "==", "yes"], ["arg_region", "~~", "^eu-"]]
                weighted_upstreams: [{{upstream_id: "canary:80"}}]
              - match:
                  - vars: [["arg_edge", "==", "1"]]
                weighted_upstreams:
                  - upstream: {{nodes: {{"{edge}": 1}}}}
              - weighted_upstreams:
                  - {{upstream_id: canary, weight: 3}}
                  - {{weight: 1}}
    - name: gated
      match: {{paths: ["/gated*"]}}
      backends: [{{serviceName: stable, servicePort: 80}}]
      plugins:
        - name: traffic-split
          config:
            rules:
              - match: [{{vars: [["http_x-canary", "==", "1"]]}}]
                weighted_upstreams: [{{upstream_id: "canary:80", weight: 1}}]
{stable}{canary}"#,
        edge = edge.addr,
        stable = service("stable", stable.addr),
        canary = service("canary", canary.addr),
    );
    let dp = dataplane().await;
    apply_yaml(&dp, 1, &yaml);

    // No rule matches the match-only route: the route's own upstream.
    assert_eq!(
        served_by(&dp, "/gated", &[], 20).await,
        counts(&[("stable", 20)])
    );
    // Its rule matches on a header: the canary.
    assert_eq!(
        served_by(&dp, "/gated", &[("x-canary", "1")], 20).await,
        counts(&[("canary", 20)])
    );
    assert_eq!(
        served_by(&dp, "/gated", &[("x-canary", "0")], 5).await,
        counts(&[("stable", 5)])
    );

    // The catch-all rule: 3:1 between the canary Service and the route's own upstream,
    // exact over 400 requests (smooth weighted round robin).
    assert_eq!(
        served_by(&dp, "/split", &[], 400).await,
        counts(&[("canary", 300), ("stable", 100)])
    );
    // The first rule: a header, or query args (both vars of the second match must hold).
    assert_eq!(
        served_by(&dp, "/split", &[("x-canary", "1")], 10).await,
        counts(&[("canary", 10)])
    );
    assert_eq!(
        served_by(&dp, "/split?beta=yes&region=eu-west", &[], 10).await,
        counts(&[("canary", 10)])
    );
    // Only one of the two vars: falls through to the 3:1 rule (8 requests = 2 cycles).
    assert_eq!(
        served_by(&dp, "/split?beta=yes&region=us-east", &[], 8).await,
        counts(&[("canary", 6), ("stable", 2)])
    );
    // The second rule: an inline upstream of loopback nodes.
    assert_eq!(
        served_by(&dp, "/split?edge=1", &[], 10).await,
        counts(&[("edge", 10)])
    );
    // The canary upstream path keeps the request as the client sent it.
    let r = get_with(dp.addr, "/split/x?edge=1", &[]).await;
    assert_eq!(r.json()["path"], "/split/x", "{}", r.text());
}

#[tokio::test]
async fn a_split_upstream_without_endpoints_is_503_and_the_rest_keeps_serving() {
    let stable = EchoServer::start("stable", any()).await.unwrap();
    let dp = dataplane().await;
    let r = route_with(
        "default/r/p",
        &["/*"],
        "stable",
        vec![plugin(
            "traffic-split",
            json!({"rules": [{"match": [{"vars": [["http_x-canary", "==", "1"]]}],
                              "weighted_upstreams": [{"upstream_id": "empty"}]}]}),
        )],
    );
    dp.store
        .apply(
            snapshot(
                1,
                vec![r],
                vec![
                    upstream("stable", &[(stable.addr, 1)]),
                    upstream("empty", &[]),
                ],
            ),
            vec![],
        )
        .unwrap();
    let resp = get_with(dp.addr, "/", &[("x-canary", "1")]).await;
    assert_eq!(resp.status, StatusCode::SERVICE_UNAVAILABLE);
    let resp = get_with(dp.addr, "/", &[]).await;
    assert_eq!(resp.status, StatusCode::OK);
    assert_eq!(resp.json()["server"], "stable");

    // A snapshot naming an upstream it does not carry is rejected; the last one keeps
    // serving.
    let err = dp
        .store
        .apply(
            snapshot(
                2,
                vec![route_with(
                    "default/r/p",
                    &["/*"],
                    "stable",
                    vec![plugin(
                        "traffic-split",
                        json!({"rules": [{"weighted_upstreams": [{"weight": 1}, {"upstream_id": "gone", "weight": 1}]}]}),
                    )],
                )],
                vec![upstream("stable", &[(stable.addr, 1)])],
            ),
            vec![],
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "route default/r/p: plugin \"traffic-split\": rules[0].weighted_upstreams[1].upstream_id: unknown upstream `gone`"
        ),
        "{err}"
    );
    let resp = get_with(dp.addr, "/", &[("x-canary", "1")]).await;
    assert_eq!(resp.status, StatusCode::SERVICE_UNAVAILABLE);
}
