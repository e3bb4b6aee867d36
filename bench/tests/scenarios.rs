//! The scenario YAML files say what the brief and the harness expect:
//! route, Service and EndpointSlice agree on port 1980, and scenario 2 is
//! scenario 1 plus exactly the two APISIX benchmark plugins.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde::Deserialize;
use serde_json::{Value, json};
use sluice_bench::runner::{PATH, UPSTREAM_PORT};
use sluice_bench::sluice::scenario_config;

/// This crate's directory, read when the test runs (cargo sets `CARGO_MANIFEST_DIR` for test
/// processes). NB: not `env!` alone: CI keeps the build cache outside the clone, and a test
/// binary another clone built would look for files in that clone.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
}

fn docs(scenario: u8) -> Vec<Value> {
    let manifest = manifest_dir();
    let root = manifest.parent().unwrap();
    let text = std::fs::read_to_string(scenario_config(root, scenario)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .collect()
}

fn by_kind<'a>(docs: &'a [Value], api: &str, kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["apiVersion"] == api && d["kind"] == kind)
        .collect();
    assert_eq!(found.len(), 1, "expected one {api} {kind}");
    found[0]
}

fn check_common(docs: &[Value]) {
    assert_eq!(docs.len(), 3);
    for d in docs {
        assert_eq!(d["metadata"]["namespace"], "default", "{d}");
    }
    let route = by_kind(docs, "apisix.apache.org/v2", "ApisixRoute");
    assert_eq!(route["metadata"]["name"], "hello");
    let rules = route["spec"]["http"].as_array().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["name"], "r1");
    assert_eq!(rules[0]["match"]["paths"], json!([PATH]));
    assert_eq!(
        rules[0]["backends"],
        json!([{"serviceName": "upstream", "servicePort": UPSTREAM_PORT}])
    );

    let svc = by_kind(docs, "v1", "Service");
    assert_eq!(svc["metadata"]["name"], "upstream");
    let port = &svc["spec"]["ports"][0];
    assert_eq!(port["port"], UPSTREAM_PORT);
    assert_eq!(port["targetPort"], UPSTREAM_PORT);

    let slice = by_kind(docs, "discovery.k8s.io/v1", "EndpointSlice");
    assert_eq!(
        slice["metadata"]["labels"]["kubernetes.io/service-name"],
        "upstream"
    );
    assert_eq!(slice["endpoints"][0]["addresses"], json!(["127.0.0.1"]));
    assert_eq!(slice["endpoints"][0]["conditions"]["ready"], true);
    assert_eq!(slice["ports"][0]["port"], UPSTREAM_PORT);
    // Service and slice port names must match for the port to resolve.
    assert_eq!(slice["ports"][0]["name"], port["name"]);
}

#[test]
fn scenario1_is_a_plain_route() {
    let d = docs(1);
    check_common(&d);
    let route = by_kind(&d, "apisix.apache.org/v2", "ApisixRoute");
    assert!(route["spec"]["http"][0].get("plugins").is_none());
}

#[test]
fn scenario2_adds_limit_count_and_prometheus() {
    let d = docs(2);
    check_common(&d);
    let route = by_kind(&d, "apisix.apache.org/v2", "ApisixRoute");
    let plugins = &route["spec"]["http"][0]["plugins"];
    assert_eq!(
        *plugins,
        json!([
            {"name": "limit-count", "enable": true, "config": {
                "count": 2_000_000_000_000_u64, "time_window": 60,
                "rejected_code": 503, "key": "remote_addr"}},
            {"name": "prometheus", "enable": true}
        ])
    );
    // Everything but the plugins is identical to scenario 1.
    let mut without = d.clone();
    for doc in &mut without {
        if doc["kind"] == "ApisixRoute" {
            doc["spec"]["http"][0]
                .as_object_mut()
                .unwrap()
                .remove("plugins");
        }
    }
    assert_eq!(without, docs(1));
}

/// `sluice-bench suite` serves scenario 1's route with the large-body paths added, on the
/// same Service and EndpointSlice.
#[test]
fn suite_is_scenario_1_plus_the_large_body_paths() {
    let manifest = manifest_dir();
    let root = manifest.parent().unwrap();
    let text = std::fs::read_to_string(sluice_bench::suite::suite_config(root)).unwrap();
    let mut suite: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .collect();
    let route = by_kind(&suite, "apisix.apache.org/v2", "ApisixRoute");
    assert_eq!(
        route["spec"]["http"][0]["match"]["paths"],
        json!([PATH, "/files/*", "/upload"])
    );
    // Everything but the two extra paths is identical to scenario 1.
    for doc in &mut suite {
        if doc["kind"] == "ApisixRoute" {
            doc["spec"]["http"][0]["match"]["paths"] = json!([PATH]);
        }
    }
    check_common(&suite);
    assert_eq!(suite, docs(1));
}

/// Scenarios 3 and 4: one HTTPRoute, the same but for rule 0's `timeouts` and `retry`; the
/// translation of 3 carries them into the route and 4's has none, so the side-by-side cost
/// (`--scenario 3 --baseline-scenario 4`) is theirs alone.
#[test]
fn scenario3_is_scenario4_plus_timeouts_and_a_retry_policy() {
    let (mut with, without) = (docs(3), docs(4));
    let rule = with[2]["spec"]["rules"][0].as_object_mut().unwrap();
    assert_eq!(
        rule["timeouts"],
        json!({"request": "30s", "backendRequest": "10s"})
    );
    assert!(rule.remove("timeouts").is_some() && rule.remove("retry").is_some());
    assert_eq!(with, without);

    let route = |scenario: u8| {
        let manifest = manifest_dir();
        let path = scenario_config(manifest.parent().unwrap(), scenario);
        let mut state = sluice_translate::ClusterState::new();
        state
            .load_yaml("scenario", &std::fs::read_to_string(path).unwrap())
            .unwrap();
        let t = sluice_translate::translate(&state, &sluice_translate::Options::default());
        assert_eq!(t.snapshot.routes.len(), 1, "scenario {scenario}");
        t.snapshot.routes[0].clone()
    };
    let (r3, r4) = (route(3), route(4));
    let retry = r3
        .retry
        .as_ref()
        .expect("scenario 3's route has a retry policy");
    assert_eq!(
        (retry.attempts, retry.codes.clone()),
        (2, vec![502, 503, 504])
    );
    let t = r3
        .timeout
        .as_ref()
        .expect("scenario 3's route has timeouts");
    assert_eq!((t.request_ms, t.attempt_ms), (30_000, 10_000));
    assert!(r4.retry.is_none());
    assert!(
        r4.timeout
            .as_ref()
            .is_none_or(|t| t.request_ms == 0 && t.attempt_ms == 0)
    );
}

/// Scenarios 5 and 6: the ingress-nginx Ingress (translated with class `nginx` served in
/// ingress-nginx's place) and the hand-written ApisixRoute become the same route: the same
/// paths, timeouts and plugins with the same configurations. So `--scenario 5
/// --baseline-scenario 6` measures the annotation path against the plugin chain itself.
#[test]
fn scenario5_ingress_nginx_translates_to_scenario6s_apisix_route() {
    let route = |scenario: u8| {
        let manifest = manifest_dir();
        let path = scenario_config(manifest.parent().unwrap(), scenario);
        let mut state = sluice_translate::ClusterState::new();
        state
            .load_yaml("scenario", &std::fs::read_to_string(path).unwrap())
            .unwrap();
        let opts = sluice_translate::Options {
            nginx_classes: vec!["nginx".into()],
            ..sluice_translate::Options::default()
        };
        let t = sluice_translate::translate(&state, &opts);
        assert_eq!(t.snapshot.routes.len(), 1, "scenario {scenario}");
        t.snapshot.routes[0].clone()
    };
    let (r5, r6) = (route(5), route(6));
    assert_eq!(r5.paths, r6.paths);
    assert_eq!(r5.timeout, r6.timeout);
    let mut plugins: Vec<Vec<(String, Value)>> = [&r5, &r6]
        .iter()
        .map(|r| {
            let mut p: Vec<(String, Value)> = r
                .plugins
                .iter()
                .map(|p| {
                    (
                        p.name.clone(),
                        serde_json::from_str(&p.config_json).unwrap(),
                    )
                })
                .collect();
            p.sort_by(|a, b| a.0.cmp(&b.0));
            p
        })
        .collect();
    let p6 = plugins.pop().unwrap();
    let p5 = plugins.pop().unwrap();
    assert_eq!(p5, p6);
    assert_eq!(p5.len(), 4, "{p5:?}");
}
