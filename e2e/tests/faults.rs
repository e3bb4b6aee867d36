//! Faults on real processes, with traffic flowing (issue 16, "Faults"):
//!
//! - kube-apiserver (and etcd) SIGKILLed under the controller and started again on the same
//!   data: every request is answered throughout, the dataplane keeps its snapshot while the
//!   controller's watches fail, the controller publishes nothing until something really
//!   changed (no empty or shrunken snapshot after the re-list), and afterwards a created
//!   route is served (the watches resumed) and a deleted one goes 404 (deletes are seen).
//!   Once briefly (the controller stays leader and its stream to the dataplane stays up, so
//!   a bad push would reach it at once), once for longer than the Lease (the leader steps
//!   down from writing status but, as every replica does, keeps serving its dataplane the
//!   last state it knows; then everything comes back).
//! - The leader of two controller replicas SIGKILLed under load, with the dataplane on it:
//!   no request fails, the dataplane moves to the standby at once and a route applied after
//!   the kill reaches it, and the standby takes the Lease over.
//!
//! Run with `--nocapture` to see the measured times.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_e2e::{Component, Load, LoadReport, Pipeline, eventually, http_get, metric};

/// Routes that exist before the fault and must keep serving through it: `(name, host, path
/// prefix)`. Two hosts, several paths, one of them an Ingress rather than an ApisixRoute.
const FLEET: &[(&str, &str, &str)] = &[
    ("r0", "a.faults.e2e", "/r0"),
    ("r1", "a.faults.e2e", "/r1"),
    ("r2", "b.faults.e2e", "/r2"),
    ("r3", "b.faults.e2e", "/r3"),
    ("ing", "c.faults.e2e", "/ing"),
];

/// A route that exists before the fault and is deleted after it.
const DOOMED: (&str, &str, &str) = ("doomed", "d.faults.e2e", "/doomed");

/// A route created after the fault.
const FRESH: (&str, &str, &str) = ("fresh", "d.faults.e2e", "/fresh");

/// How long the controller may take to see a change once the API server is ready again.
///
/// NB: every watch that failed during the outage retries 250 ms doubling to 5 s (±25 %;
/// `controller/src/watch.rs`), and against the restarted API server it may fail once or
/// twice more (403 while RBAC fills, 410 for an old resource version) before it re-lists:
/// about 3 × 6 s at worst, then the re-list. With kube-runtime's default backoff (to 30 s,
/// up to ×2) this took 7–68 s.
const WATCH_RESUME_LIMIT: Duration = Duration::from_secs(30);

/// What the load requests: one path under every route of [`FLEET`].
fn load_targets() -> Vec<(String, String)> {
    FLEET
        .iter()
        .map(|(_, host, path)| ((*host).to_owned(), format!("{path}/x")))
        .collect()
}

fn apisix_route(ns: &str, (name, host, path): (&str, &str, &str)) -> String {
    format!(
        r#"apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: {name}, namespace: {ns}}}
spec:
  ingressClassName: apisix
  http:
    - name: rule
      match:
        hosts: [{host}]
        paths: ["{path}*"]
      backends:
        - serviceName: echo
          servicePort: 80
"#
    )
}

fn ingress(ns: &str, (name, host, path): (&str, &str, &str)) -> String {
    format!(
        r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: {name}, namespace: {ns}}}
spec:
  ingressClassName: apisix
  rules:
    - host: {host}
      http:
        paths:
          - path: {path}
            pathType: Prefix
            backend: {{service: {{name: echo, port: {{number: 80}}}}}}
"#
    )
}

/// The fleet and the doomed route, as one `kubectl apply`.
fn fleet_yaml(ns: &str) -> String {
    let mut docs: Vec<String> = FLEET
        .iter()
        .map(|&route| {
            if route.0 == "ing" {
                ingress(ns, route)
            } else {
                apisix_route(ns, route)
            }
        })
        .collect();
    docs.push(apisix_route(ns, DOOMED));
    docs.join("---\n")
}

/// Whether `host` + `path/x` is answered by the echo backend.
fn serves(http: SocketAddr, (_, host, path): (&str, &str, &str)) -> bool {
    http_get(http, host, &format!("{path}/x"))
        .is_ok_and(|r| r.status == 200 && r.header("x-echo-server") == Some("e2e-echo"))
}

fn status_of(http: SocketAddr, (_, host, path): (&str, &str, &str)) -> Option<u16> {
    http_get(http, host, &format!("{path}/x"))
        .ok()
        .map(|r| r.status)
}

fn wait_serving(http: SocketAddr, route: (&str, &str, &str), limit: Duration) {
    eventually(limit, || serves(http, route).then_some(()))
        .unwrap_or_else(|| panic!("{} was not served within {limit:?}", route.0));
}

/// The dataplane's `/snapshot`: version, hash, routes.
fn snapshot(admin: SocketAddr) -> Value {
    let r = http_get(admin, "localhost", "/snapshot").unwrap();
    serde_json::from_str(&r.body).unwrap()
}

/// The `Programmed` condition of ApisixRoute `name`.
fn programmed(p: &Pipeline, name: &str) -> Option<Value> {
    let out = p
        .cluster
        .kubectl(&["get", "ar", name, "-n", &p.namespace, "-o", "json"])
        .ok()?;
    let obj: Value = serde_json::from_str(&out.stdout).ok()?;
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Programmed")
        .cloned()
}

/// Starts the load on the fleet and waits until it has had some answers.
fn start_load(http: SocketAddr) -> Load {
    let targets = load_targets();
    let targets: Vec<(&str, &str)> = targets
        .iter()
        .map(|(h, p)| (h.as_str(), p.as_str()))
        .collect();
    let load = Load::start(http, &targets, Duration::from_millis(1));
    eventually(Duration::from_secs(10), || (load.ok() >= 50).then_some(()))
        .unwrap_or_else(|| panic!("the load got no answers: {} failed", load.failed()));
    load
}

/// Lets the load run for `more` further answers (traffic after the fault), then stops it.
fn finish_load(load: Load, more: u64) -> LoadReport {
    let target = load.ok() + more;
    eventually(Duration::from_secs(20), || {
        (load.ok() >= target).then_some(())
    });
    load.stop()
}

fn assert_no_failures(report: &LoadReport) {
    eprintln!(
        "load: {} requests answered, {} failed, over {:?} on {} connection(s) ({} retried after an idle close)",
        report.ok, report.failed, report.elapsed, report.connections, report.retried
    );
    assert_eq!(
        report.failed, 0,
        "requests failed during the fault: {:#?}",
        report.failures
    );
    assert!(report.ok > 0, "the load sent nothing");
}

/// The dataplane serves exactly the snapshot it had before the fault, and the doomed route
/// too (the load covers the fleet).
fn assert_unchanged(p: &Pipeline, admin: SocketAddr, before: &Value, when: &str) {
    let now = snapshot(admin);
    assert_eq!(
        (&now["version"], &now["hash"], &now["routes"]),
        (&before["version"], &before["hash"], &before["routes"]),
        "{when}: the dataplane's snapshot changed: {now:#} (before: {before:#})"
    );
    assert_eq!(
        status_of(p.http, DOOMED),
        Some(200),
        "{when}: {} is no longer served",
        DOOMED.0
    );
}

/// kube-apiserver (and etcd with `etcd`) SIGKILLed for `outage`, then started again on the
/// same data. Returns the pipeline and what the controller's metrics said at the end of the
/// outage: `(sluice_controller_leader, sluice_controller_connected_dataplanes)`.
fn control_plane_restart(etcd: bool, outage: Duration) -> (Pipeline, (Option<f64>, Option<f64>)) {
    let started = Instant::now();
    let mut p = Pipeline::start().unwrap();
    let ns = p.namespace.clone();
    p.cluster.apply(&fleet_yaml(&ns)).unwrap();
    for &route in FLEET.iter().chain([&DOOMED]) {
        wait_serving(p.http, route, Duration::from_secs(30));
    }
    let admin = p.dataplane.as_ref().unwrap().addr();
    let before = snapshot(admin);
    let routes_before = before["routes"].as_u64().unwrap();
    assert!(routes_before >= 6, "{before:#}");
    let published_before = metric(p.metrics, "sluice_controller_snapshot_version").unwrap();
    let watch_errors_before = metric(
        p.metrics,
        r#"sluice_controller_reconcile_errors_total{source="watch"}"#,
    )
    .unwrap_or(0.0);
    let load = start_load(p.http);

    // The fault. NB: the API server goes first, as when its node dies; etcd after it.
    let mut components = vec![Component::ApiServer];
    if etcd {
        components.push(Component::Etcd);
    }
    let killed = Instant::now();
    for &c in &components {
        p.cluster.kill(c).unwrap();
    }
    assert!(
        !p.cluster
            .kubectl(&["get", "--raw", "/readyz"])
            .unwrap()
            .success,
        "the API server still answers after SIGKILL"
    );
    // Throughout the outage the dataplane keeps exactly what it had, and the controller
    // publishes nothing (its stores keep the last listed state while the watches fail).
    let mut samples = 0;
    while killed.elapsed() < outage {
        assert_unchanged(&p, admin, &before, "during the outage");
        assert_eq!(
            metric(p.metrics, "sluice_controller_snapshot_version"),
            Some(published_before),
            "the controller published a snapshot while the API server was down"
        );
        samples += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let at_restart = (
        metric(p.metrics, "sluice_controller_leader"),
        metric(p.metrics, "sluice_controller_connected_dataplanes"),
    );
    eprintln!(
        "outage of {:?} ({components:?}): {samples} samples, snapshot v{} unchanged, {} requests answered so far, controller (leader, connected dataplanes) = {at_restart:?}",
        killed.elapsed(),
        before["version"],
        load.ok()
    );
    assert!(
        metric(
            p.metrics,
            r#"sluice_controller_reconcile_errors_total{source="watch"}"#
        )
        .unwrap_or(0.0)
            > watch_errors_before,
        "the controller's watches never failed: the fault did not reach it"
    );

    // Back on the same data, ports and certificates.
    for &c in components.iter().rev() {
        p.cluster.start_again(c).unwrap();
    }
    let ready_in = p.cluster.wait_ready(Duration::from_secs(60)).unwrap();
    let restarted = Instant::now();
    eprintln!(
        "kube-apiserver ready {ready_in:?} after the restart ({:?} after the kill)",
        killed.elapsed()
    );

    // A route created now is served: the watches resumed. Until it is, the dataplane
    // keeps serving what it had: the re-list deleted nothing.
    // NB: retried: the first writes after a restart may meet an API server still settling.
    eventually(Duration::from_secs(30), || {
        p.cluster.apply(&apisix_route(&ns, FRESH)).ok()
    })
    .expect("kubectl apply after the restart");
    eventually(WATCH_RESUME_LIMIT, || {
        let now = snapshot(admin);
        assert!(
            now["routes"].as_u64().unwrap() >= routes_before,
            "after the restart the dataplane got a shrunken snapshot: {now:#} (before: {before:#})"
        );
        assert_eq!(
            status_of(p.http, DOOMED),
            Some(200),
            "after the restart {} is no longer served",
            DOOMED.0
        );
        serves(p.http, FRESH).then_some(())
    })
    .expect("a route created after the restart was never served: the watches did not resume");
    eprintln!(
        "a route created after the restart served {:?} after the API server was ready",
        restarted.elapsed()
    );
    let after = snapshot(admin);
    assert_eq!(
        after["routes"].as_u64().unwrap(),
        routes_before + 1,
        "{after:#}"
    );
    // Exactly one snapshot was published since the fault: the one with the new route. An
    // extra version would be a snapshot built from a partial re-list, since corrected.
    assert_eq!(
        metric(p.metrics, "sluice_controller_snapshot_version"),
        Some(published_before + 1.0),
        "the controller published more than the new route since the fault"
    );

    // A route deleted now goes 404: deletes are seen too, and nothing else goes with it.
    p.cluster
        .kubectl_ok(&["delete", "ar", DOOMED.0, "-n", &ns])
        .unwrap();
    eventually(Duration::from_secs(30), || {
        (status_of(p.http, DOOMED) == Some(404)).then_some(())
    })
    .expect("a route deleted after the restart kept serving");
    assert!(serves(p.http, FRESH));
    assert_eq!(
        snapshot(admin)["routes"].as_u64().unwrap(),
        routes_before,
        "after deleting one route"
    );

    // The status writer is back: the new route is Programmed on the one dataplane.
    let condition = eventually(Duration::from_secs(30), || {
        programmed(&p, FRESH.0).filter(|c| c["status"] == "True")
    })
    .unwrap_or_else(|| panic!("fresh never Programmed: {:?}", programmed(&p, FRESH.0)));
    assert!(
        condition["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("1/1")),
        "{condition:#}"
    );

    assert_no_failures(&finish_load(load, 200));
    eprintln!("test wall time: {:?}", started.elapsed());
    (p, at_restart)
}

/// A short API-server crash: the controller stays leader with its dataplane stream open, so
/// anything it published from failing or partial watches would reach the dataplane at once.
#[test]
fn apiserver_sigkilled_and_restarted_under_the_controller() {
    let (_p, at_restart) = control_plane_restart(false, Duration::from_secs(5));
    assert_eq!(
        at_restart,
        (Some(1.0), Some(1.0)),
        "(leader, connected dataplanes) at the end of the outage: the premise of this test is \
         a leader that could push to the dataplane throughout"
    );
}

/// etcd and kube-apiserver down for longer than the Lease (15 s): the leader cannot renew
/// and steps down (it writes no status), but keeps its dataplane stream, as every replica
/// serves dataplanes whether it leads or not; after the restart the same replica leads
/// again and everything converges.
#[test]
fn etcd_and_apiserver_sigkilled_for_longer_than_the_lease() {
    let (p, at_restart) = control_plane_restart(true, Duration::from_secs(18));
    assert_eq!(
        at_restart,
        (Some(0.0), Some(1.0)),
        "(leader, connected dataplanes) at the end of the outage: a leader that cannot renew \
         must step down, and keep serving its dataplane"
    );
    assert_eq!(p.lease_holder().as_deref(), Some("e2e-controller-0"));
    assert_eq!(metric(p.metrics, "sluice_controller_leader"), Some(1.0));
}

/// Two controller replicas behind one Service address, as the chart runs them: the leader,
/// which serves the dataplane, is SIGKILLed under load.
#[test]
fn the_leader_sigkilled_under_load_the_standby_takes_over() {
    let started = Instant::now();
    let mut p = Pipeline::start_replicated(2).unwrap();
    let ns = p.namespace.clone();
    p.cluster.apply(&fleet_yaml(&ns)).unwrap();
    for &route in FLEET.iter().chain([&DOOMED]) {
        wait_serving(p.http, route, Duration::from_secs(30));
    }

    let leader = eventually(Duration::from_secs(30), || p.lease_holder()).expect("a leader");
    // NB: every replica serves; the worst case is the dataplane's own replica dying, so
    // redial it (the Service spreads connections round robin) until it is on the leader.
    let leader_metrics = p.controller_metrics(&leader).unwrap();
    for _ in 0..6 {
        let on_leader = eventually(Duration::from_secs(5), || {
            (metric(leader_metrics, "sluice_controller_connected_dataplanes") == Some(1.0))
                .then_some(())
        });
        if on_leader.is_some() {
            break;
        }
        p.restart_dataplane().unwrap();
        for &route in FLEET.iter().chain([&DOOMED]) {
            wait_serving(p.http, route, Duration::from_secs(30));
        }
    }
    let admin = p.dataplane.as_ref().unwrap().addr();
    let routes_before = snapshot(admin)["routes"].as_u64().unwrap();
    let identities: Vec<String> = std::iter::once(p.controller_identity.clone())
        .chain(p.replicas.iter().map(|r| r.identity.clone()))
        .collect();
    let metrics_of = |p: &Pipeline, id: &str| {
        if id == p.controller_identity {
            p.metrics
        } else {
            p.replicas
                .iter()
                .find(|r| r.identity == id)
                .unwrap()
                .metrics
        }
    };
    let standby = identities.iter().find(|id| **id != leader).unwrap().clone();
    assert_eq!(
        metric(
            metrics_of(&p, &leader),
            "sluice_controller_connected_dataplanes"
        ),
        Some(1.0),
        "the dataplane is not connected to the leader {leader}"
    );
    assert_eq!(
        metric(metrics_of(&p, &standby), "sluice_controller_leader"),
        Some(0.0)
    );

    let load = start_load(p.http);
    let killed = Instant::now();
    assert!(p.kill_controller(&leader), "{leader} was not running");
    // A change made right after the kill: the standby serves it before it leads.
    p.cluster.apply(&apisix_route(&ns, FRESH)).unwrap();

    let mut took_over = None;
    let mut converged = None;
    eventually(Duration::from_secs(60), || {
        if took_over.is_none() && p.lease_holder().as_deref() == Some(standby.as_str()) {
            took_over = Some(killed.elapsed());
        }
        if converged.is_none() && serves(p.http, FRESH) {
            converged = Some(killed.elapsed());
        }
        // The old routes are served meanwhile (the load covers the fleet).
        assert_eq!(status_of(p.http, DOOMED), Some(200), "{} lost", DOOMED.0);
        (took_over.is_some() && converged.is_some()).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "after the leader's SIGKILL: Lease taken over after {took_over:?}, new route served after {converged:?} (holder now {:?})",
            p.lease_holder()
        )
    });
    let (took_over, converged) = (took_over.unwrap(), converged.unwrap());
    assert!(
        converged < took_over,
        "the route applied after the kill waited for the election: served after {converged:?}, Lease taken over after {took_over:?}"
    );
    eprintln!(
        "leader {leader} SIGKILLed: {standby} holds the Lease after {took_over:?}; the route applied after the kill is served after {converged:?}"
    );
    assert_eq!(
        metric(metrics_of(&p, &standby), "sluice_controller_leader"),
        Some(1.0)
    );
    let after = snapshot(admin);
    assert_eq!(
        after["routes"].as_u64().unwrap(),
        routes_before + 1,
        "{after:#}"
    );
    for &route in FLEET.iter().chain([&DOOMED, &FRESH]) {
        assert!(
            serves(p.http, route),
            "{} not served after failover",
            route.0
        );
    }
    // The new leader writes status, counting the one dataplane now connected to it.
    eventually(Duration::from_secs(30), || {
        programmed(&p, FRESH.0).filter(|c| {
            c["status"] == "True" && c["message"].as_str().is_some_and(|m| m.starts_with("1/1"))
        })
    })
    .unwrap_or_else(|| panic!("fresh never Programmed 1/1: {:?}", programmed(&p, FRESH.0)));

    assert_no_failures(&finish_load(load, 200));
    eprintln!("test wall time: {:?}", started.elapsed());
}
