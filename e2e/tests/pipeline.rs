//! The whole pipeline with real processes: `kubectl apply` on a real kube-apiserver →
//! the `sluice-controller` binary → gRPC → the `sluice-dataplane` binary → a real backend in a
//! network namespace. Then the failure cases users care about: a deleted route, a lost
//! controller, and a dataplane restarted while the controller is away.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::Value;
use sluice_e2e::{Cluster, Pipeline, eventually, http_get};

fn status_of(cluster: &Cluster, ns: &str, ty: &str) -> Option<(String, String)> {
    let out = cluster
        .kubectl(&["get", "ar", "demo", "-n", ns, "-o", "json"])
        .ok()?;
    let obj: Value = serde_json::from_str(&out.stdout).ok()?;
    let c = obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)?;
    Some((
        c["status"].as_str()?.to_owned(),
        c["message"].as_str().unwrap_or("").to_owned(),
    ))
}

fn wait_status(p: &Pipeline, what: &str, want: u16) -> sluice_e2e::HttpResponse {
    eventually(Duration::from_secs(30), || {
        http_get(p.http, "demo.e2e", "/hello")
            .ok()
            .filter(|r| r.status == want)
    })
    .unwrap_or_else(|| panic!("timed out waiting for {what} ({want})"))
}

#[test]
fn apply_serve_delete_and_survive_the_controller_going_away() {
    let mut p = Pipeline::start().unwrap();
    p.cluster.apply(&p.route_yaml("demo", "/hello*")).unwrap();

    // kubectl apply → traffic through the dataplane to the backend.
    let resp = wait_status(&p, "the route to serve", 200);
    assert_eq!(resp.header("x-echo-server"), Some("e2e-echo"));
    assert!(
        resp.body.contains("\"x-forwarded-host\":\"demo.e2e\""),
        "{}",
        resp.body
    );

    // Status tells the truth: accepted, and programmed on the one dataplane.
    let ns = p.namespace.clone();
    eventually(Duration::from_secs(20), || {
        status_of(&p.cluster, &ns, "Accepted").filter(|(s, _)| s == "True")
    })
    .expect("Accepted=True");
    let (_, programmed) = eventually(Duration::from_secs(20), || {
        status_of(&p.cluster, &ns, "Programmed").filter(|(s, _)| s == "True")
    })
    .expect("Programmed=True");
    assert!(
        programmed.contains("1/1"),
        "Programmed message: {programmed}"
    );

    // Route deleted → 404.
    p.cluster
        .kubectl_ok(&["delete", "ar", "demo", "-n", &ns])
        .unwrap();
    wait_status(&p, "404 after delete", 404);

    // Re-applied, then the controller dies: the dataplane keeps serving what it has.
    p.cluster.apply(&p.route_yaml("demo", "/hello*")).unwrap();
    wait_status(&p, "the route to serve again", 200);
    p.controller = None;
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(http_get(p.http, "demo.e2e", "/hello").unwrap().status, 200);

    // A dataplane restarted while the controller is away serves its persisted snapshot.
    p.restart_dataplane().unwrap();
    let resp = wait_status(&p, "the restarted dataplane to serve", 200);
    assert_eq!(resp.header("x-echo-server"), Some("e2e-echo"));
}
