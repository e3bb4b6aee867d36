//! The controller's promises with real processes on a real kube-apiserver: traffic follows
//! EndpointSlice changes with no stale endpoint; an invalid route is rejected with its
//! field named (condition and Event) while others keep serving; a controller that comes back
//! brings the dataplanes up to date; two replicas elect one leader that alone writes status,
//! every dataplane converges to the same hash, and the follower takes over when the leader
//! dies.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_e2e::{
    Backend, Pipeline, Wait, eventually, free_port, http_get, spawn_controller, spawn_dataplane,
};
use sluice_testkit::metrics::sample;

fn serving(http: std::net::SocketAddr, path: &str) -> Option<String> {
    http_get(http, "demo.e2e", path)
        .ok()
        .filter(|r| r.status == 200)
        .and_then(|r| r.header("x-echo-server").map(str::to_owned))
}

fn wait_served_by(p: &Pipeline, path: &str, server: &str) {
    eventually(Duration::from_secs(30), || {
        serving(p.http, path).filter(|s| s == server)
    })
    .unwrap_or_else(|| panic!("timed out waiting for {path} to be served by {server}"));
}

fn snapshot_state(admin: std::net::SocketAddr) -> Value {
    let r = http_get(admin, "localhost", "/snapshot").unwrap();
    serde_json::from_str(&r.body).unwrap()
}

/// A sample of `/metrics`, 0 when absent.
fn metric(addr: std::net::SocketAddr, name: &str) -> f64 {
    let body = http_get(addr, "localhost", "/metrics").unwrap().body;
    sample(&body, name).unwrap_or(0.0)
}

fn condition(p: &Pipeline, name: &str, type_: &str) -> Option<Value> {
    let out = p
        .cluster
        .kubectl(&["get", "ar", name, "-n", &p.namespace, "-o", "json"])
        .ok()?;
    let obj: Value = serde_json::from_str(&out.stdout).ok()?;
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

/// How long a status condition may take to say what a test waits for.
const STATUS_WAIT: Duration = Duration::from_secs(60);

/// Waits up to [`STATUS_WAIT`] for `name`'s condition `type_` to satisfy `want`, reading it every
/// 200 ms (each read runs kubectl; a tighter loop starves the processes under test on two
/// cores). On timeout, panics with `what` and the condition last seen.
fn wait_condition(
    p: &Pipeline,
    name: &str,
    type_: &str,
    what: &str,
    want: impl Fn(&Value) -> bool,
) -> Value {
    let mut last = None;
    let wait = Wait::up_to(STATUS_WAIT).every(Duration::from_millis(200));
    eventually(wait, || {
        let c = condition(p, name, type_)?;
        if want(&c) {
            return Some(c);
        }
        last = Some(c);
        None
    })
    .unwrap_or_else(|| {
        panic!("timed out after {STATUS_WAIT:?} waiting for {what}; last seen: {last:?}")
    })
}

fn set_endpoints(p: &Pipeline, addrs: &[std::net::Ipv4Addr]) {
    let endpoints: Vec<String> = addrs
        .iter()
        .map(|a| format!(r#"{{"addresses":["{a}"],"conditions":{{"ready":true}}}}"#))
        .collect();
    let patch = format!(r#"{{"endpoints":[{}]}}"#, endpoints.join(","));
    p.cluster
        .kubectl_ok(&[
            "patch",
            "endpointslice",
            "echo-1",
            "-n",
            &p.namespace,
            "--type",
            "merge",
            "-p",
            &patch,
        ])
        .unwrap();
}

#[test]
fn traffic_follows_endpointslice_changes_with_no_stale_endpoint() {
    let mut p = Pipeline::start().unwrap();
    p.cluster.apply(&p.route_yaml("demo", "/hello*")).unwrap();
    wait_served_by(&p, "/hello", "e2e-echo");

    // A new pod comes up; the slice moves to it (scale-out then scale-in of the old one).
    let addr2 = p.net.add_address().unwrap();
    let _echo2: Backend = p.net.spawn_echo("e2e-echo-2", addr2, 8080).unwrap();
    let started = Instant::now();
    set_endpoints(&p, &[addr2]);
    wait_served_by(&p, "/hello", "e2e-echo-2");
    eprintln!(
        "EndpointSlice patch → traffic on the new endpoint: {:?} (kubectl included)",
        started.elapsed()
    );
    // No stale endpoint: every request now goes to the new pod, also after the old one dies.
    for _ in 0..30 {
        assert_eq!(serving(p.http, "/hello").as_deref(), Some("e2e-echo-2"));
    }
    p.echo.kill();
    for _ in 0..30 {
        assert_eq!(serving(p.http, "/hello").as_deref(), Some("e2e-echo-2"));
    }

    // No endpoints at all: 503, not a hang; traffic returns with the endpoint.
    set_endpoints(&p, &[]);
    eventually(Duration::from_secs(30), || {
        http_get(p.http, "demo.e2e", "/hello")
            .ok()
            .filter(|r| r.status == 503)
    })
    .expect("503 without endpoints");
    set_endpoints(&p, &[addr2]);
    wait_served_by(&p, "/hello", "e2e-echo-2");
}

#[test]
fn an_invalid_route_is_rejected_with_its_field_and_the_others_keep_serving() {
    let mut p = Pipeline::start().unwrap();
    p.cluster.apply(&p.route_yaml("demo", "/hello*")).unwrap();
    wait_served_by(&p, "/hello", "e2e-echo");

    // CRD validation cannot see that the regex is broken; translation can.
    let bad = p.route_yaml("bad", "/bad*").replace(
        "        paths: [\"/bad*\"]\n",
        "        paths: [\"/bad*\"]\n        exprs:\n          - subject: {scope: Header, name: x-v}\n            op: RegexMatch\n            value: \"(\"\n",
    );
    p.cluster.apply(&bad).unwrap();
    let accepted = wait_condition(&p, "bad", "Accepted", "bad: Accepted=False", |c| {
        c["status"] == "False"
    });
    assert_eq!(accepted["reason"], "InvalidSpec");
    let msg = accepted["message"].as_str().unwrap();
    assert!(msg.contains("spec.http[0].match.exprs[0].value"), "{msg}");
    let programmed = wait_condition(
        &p,
        "bad",
        "Programmed",
        "bad: Programmed=False Invalid",
        |c| c["reason"] == "Invalid",
    );
    assert_eq!(programmed["status"], "False");

    // The same verdict as a Warning event, for `kubectl describe`.
    let ns = p.namespace.clone();
    let event = eventually(Duration::from_secs(30), || {
        let out = p
            .cluster
            .kubectl_ok(&[
                "get",
                "events",
                "-n",
                &ns,
                "--field-selector",
                "involvedObject.name=bad,type=Warning",
                "-o",
                "json",
            ])
            .ok()?;
        let v: Value = serde_json::from_str(&out).ok()?;
        let first = v["items"].as_array()?.first().cloned();
        if first.is_none() {
            // NB: each read runs kubectl; see `wait_condition`.
            std::thread::sleep(Duration::from_millis(200));
        }
        first
    })
    .expect("a Warning event for bad");
    assert_eq!(event["reason"], "InvalidSpec");
    assert!(
        event["message"]
            .as_str()
            .unwrap()
            .contains("spec.http[0].match.exprs[0].value"),
        "{event:#}"
    );

    // Nothing else is disturbed; the bad route serves nothing.
    for _ in 0..20 {
        assert_eq!(serving(p.http, "/hello").as_deref(), Some("e2e-echo"));
    }
    assert_eq!(http_get(p.http, "demo.e2e", "/bad").unwrap().status, 404);

    // The controller goes away; a change made meanwhile reaches the dataplane once a
    // controller is back (the dataplane keeps serving throughout).
    p.controller = None;
    p.cluster.apply(&p.route_yaml("later", "/later*")).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(serving(p.http, "/hello").as_deref(), Some("e2e-echo"));
    assert_eq!(http_get(p.http, "demo.e2e", "/later").unwrap().status, 404);
    p.restart_controller().unwrap();
    wait_served_by(&p, "/later", "e2e-echo");
}

#[test]
fn two_replicas_elect_one_status_writer_and_every_dataplane_converges() {
    let lease = |id: &str| {
        vec![
            // NB: no --lease-namespace: the Lease goes to the controller's own namespace
            // (its ServiceAccount's), the only one where the chart's Role allows Leases.
            "--leader-elect".to_owned(),
            "--lease-name".to_owned(),
            format!("sluice-e2e-{id}"),
        ]
    };
    // Replica A (started by the pipeline) and replica B share one Lease.
    let lease_name = format!("{}", std::process::id());
    let mut args_a = lease(&lease_name);
    args_a.extend(["--identity".to_owned(), "replica-a".to_owned()]);
    let a: Vec<&str> = args_a.iter().map(String::as_str).collect();
    let mut p = Pipeline::start_with(&a).unwrap();
    let (grpc_b, metrics_b) = (free_port().unwrap(), free_port().unwrap());
    let mut args_b = lease(&lease_name);
    args_b.extend(["--identity".to_owned(), "replica-b".to_owned()]);
    let b: Vec<&str> = args_b.iter().map(String::as_str).collect();
    let mut replica_b =
        Some(spawn_controller(&p.controller_kubeconfig, grpc_b, metrics_b, &b).unwrap());

    // A second dataplane knows both replicas and finds the leader.
    let urls = format!("http://{},http://{grpc_b}", p.grpc);
    let state_b = p.cluster.dir().join("dataplane-b-state");
    std::fs::create_dir_all(&state_b).unwrap();
    let http_b = free_port().unwrap();
    let dp_b = spawn_dataplane(&urls, &state_b, http_b).unwrap();
    // The pipeline's own dataplane also learns both replicas.
    p.dataplane = None;
    p.dataplane = Some(spawn_dataplane(&urls, &p.state_dir, p.http).unwrap());

    p.cluster.apply(&p.route_yaml("demo", "/hello*")).unwrap();
    wait_served_by(&p, "/hello", "e2e-echo");
    eventually(Duration::from_secs(30), || serving(http_b, "/hello")).expect("dp b serves");

    // Exactly one leader, and only it writes status.
    let leader_a = metric(p.metrics, "sluice_controller_leader");
    let leader_b = metric(metrics_b, "sluice_controller_leader");
    assert_eq!(leader_a + leader_b, 1.0, "a={leader_a} b={leader_b}");
    // Both dataplanes serve /hello, so both ACKed the leader; its status write may still
    // show the first ACK alone ("1/1"), written before the second dataplane connected.
    let two_of_two = |c: &Value| {
        c["status"] == "True"
            && c["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("2/2 dataplanes"))
    };
    wait_condition(&p, "demo", "Programmed", "demo Programmed 2/2", two_of_two);
    let (leader_metrics, follower_metrics) = if leader_a == 1.0 {
        (p.metrics, metrics_b)
    } else {
        (metrics_b, p.metrics)
    };
    assert!(metric(leader_metrics, "sluice_controller_status_writes_total") >= 1.0);
    assert_eq!(
        metric(follower_metrics, "sluice_controller_status_writes_total"),
        0.0
    );

    // Same snapshot hash on both dataplanes.
    let dp_a_admin = p.dataplane.as_ref().unwrap().addr();
    let same_hash = || {
        let (sa, sb) = (snapshot_state(dp_a_admin), snapshot_state(dp_b.addr()));
        (sa["hash"] == sb["hash"] && sa["hash"] != "").then(|| sa["hash"].clone())
    };
    eventually(Duration::from_secs(30), same_hash).expect("same hash on both dataplanes");

    // The leader dies: the follower takes over, and a change made afterwards reaches both
    // dataplanes with one hash.
    if leader_a == 1.0 {
        p.controller = None;
    } else {
        replica_b = None;
    }
    let survivor = follower_metrics;
    eventually(Duration::from_secs(40), || {
        (metric(survivor, "sluice_controller_leader") == 1.0).then_some(())
    })
    .expect("the follower takes over");
    p.cluster.apply(&p.route_yaml("after", "/after*")).unwrap();
    wait_served_by(&p, "/after", "e2e-echo");
    eventually(Duration::from_secs(30), || serving(http_b, "/after"))
        .expect("dp b serves the change");
    eventually(Duration::from_secs(30), same_hash).expect("same hash after failover");
    drop(replica_b);
}

#[test]
fn a_snapshot_a_dataplane_cannot_compile_is_nacked_and_shown_in_programmed() {
    let p = Pipeline::start().unwrap();
    // A second dataplane that runs only the prometheus plugin (APISIX's `plugins:` list).
    let state = p.cluster.dir().join("dataplane-strict-state");
    std::fs::create_dir_all(&state).unwrap();
    let http_strict = free_port().unwrap();
    let _strict = sluice_e2e::spawn_dataplane_with(
        &format!("http://{}", p.grpc),
        &state,
        http_strict,
        free_port().unwrap(),
        &["--plugins", "prometheus"],
    )
    .unwrap();
    p.cluster.apply(&p.route_yaml("demo", "/hello*")).unwrap();
    wait_served_by(&p, "/hello", "e2e-echo");
    eventually(Duration::from_secs(30), || serving(http_strict, "/hello"))
        .expect("the strict dataplane serves demo");
    wait_condition(&p, "demo", "Programmed", "demo Programmed 2/2", |c| {
        c["status"] == "True" && c["message"].as_str().is_some_and(|m| m.starts_with("2/2"))
    });

    // A route with limit-count: translation accepts it, the strict dataplane cannot run it.
    let limited = p.route_yaml("limited", "/limited*").replace(
        "      backends:\n",
        "      plugins:\n        - name: limit-count\n          enable: true\n          config: {count: 100, time_window: 60}\n      backends:\n",
    );
    p.cluster.apply(&limited).unwrap();
    wait_served_by(&p, "/limited", "e2e-echo");
    // Waits for both verdicts: a write made between the NACK and the other dataplane's
    // ACK says 0/2.
    let programmed = wait_condition(
        &p,
        "limited",
        "Programmed",
        "limited: Programmed=False Rejected, 1/2",
        |c| {
            c["reason"] == "Rejected"
                && c["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("1/2 dataplanes"))
        },
    );
    assert_eq!(programmed["status"], "False");
    let msg = programmed["message"].as_str().unwrap();
    assert!(msg.contains("1/2 dataplanes"), "{msg}");
    assert!(
        msg.contains("plugin \"limit-count\" is not enabled on this dataplane"),
        "{msg}"
    );
    // The strict dataplane keeps serving its last good snapshot.
    for _ in 0..10 {
        assert_eq!(serving(http_strict, "/hello").as_deref(), Some("e2e-echo"));
    }
    assert_eq!(
        http_get(http_strict, "demo.e2e", "/limited")
            .unwrap()
            .status,
        404
    );
}
