//! Controller HA that users never notice, and a `Programmed` condition that never lies
//! (issue 22), on real processes against a real kube-apiserver: two controller replicas
//! sharing a Lease, and a fleet of dataplanes listed in the EndpointSlice of the dataplane
//! Service (`Pipeline::start_fleet`; what stands in for pods is in `e2e/src/pipeline.rs`).
//!
//! Through the whole test a sampler reads, every 100 ms, the status of every route and asks
//! every expected dataplane for it; a sample where a route is `Programmed=True` while an
//! expected dataplane does not serve it is a lie, and the test fails on any. Meanwhile:
//!
//! 1. The leader is SIGKILLed (`SLUICE_HA_KILLS` times, default 2; each time the killed
//!    replica is started again as the standby) and a route is applied at once, during the
//!    election: every dataplane must serve it within 2 s (the standby serves them; no
//!    dataplane waits for the election), and it becomes `Programmed` 2/2 once the standby
//!    leads.
//! 2. One dataplane is cut off from every controller (a network partition): a route applied
//!    now is `Programmed=False`, waiting for that dataplane by name; when its pod goes away
//!    (it leaves the EndpointSlice) the route is `Programmed` 1/1; when it comes back it
//!    catches up and counts again.
//! 3. A third dataplane runs only one plugin (APISIX's `plugins:` list) and NACKs a route
//!    using another: `Programmed=False`, `Rejected`, naming it and its reason.
//!
//! Run with `--nocapture` to see the measured reconfiguration times and status windows.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_e2e::{Cluster, Pipeline, eventually, http_get, kubectl_path, metric};

/// How often the sampler reads status and traffic.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// A route applied during an election is served by every dataplane within this.
const RECONFIGURE_LIMIT: Duration = Duration::from_secs(2);
/// Host of every route of this test.
const HOST: &str = "ha.e2e";

fn route_yaml(ns: &str, name: &str, plugins: &str) -> String {
    format!(
        r#"apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: {name}, namespace: {ns}}}
spec:
  ingressClassName: apisix
  http:
    - name: rule
      match:
        hosts: [{HOST}]
        paths: ["/{name}*"]
{plugins}      backends:
        - serviceName: echo
          servicePort: 80
"#
    )
}

/// Whether the dataplane at `http` serves route `name` (the echo backend answers).
fn serves(http: SocketAddr, name: &str) -> bool {
    http_get(http, HOST, &format!("/{name}/x"))
        .is_ok_and(|r| r.status == 200 && r.header("x-echo-server") == Some("e2e-echo"))
}

/// How to run kubectl as the cluster's admin from another thread (the pipeline, which owns
/// the cluster, stays with the test).
#[derive(Debug, Clone)]
struct Kubectl {
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    fn of(cluster: &Cluster) -> Self {
        Self {
            kubeconfig: cluster.kubeconfig().to_owned(),
            cache: cluster.dir().join("kube-cache"),
        }
    }

    fn stdout(&self, args: &[&str]) -> Option<String> {
        let out = Command::new(kubectl_path())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .env_remove("KUBECONFIG")
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// `(status, reason, message)` of the `Programmed` condition of every ApisixRoute in `ns`;
/// the status is `Stale` when the condition is about an older generation.
fn programmed_all(
    kubectl: &Kubectl,
    ns: &str,
) -> Option<BTreeMap<String, (String, String, String)>> {
    let out = kubectl.stdout(&["get", "ar", "-n", ns, "-o", "json"])?;
    let list: Value = serde_json::from_str(&out).ok()?;
    let mut all = BTreeMap::new();
    for item in list["items"].as_array()? {
        let name = item["metadata"]["name"].as_str()?.to_owned();
        let generation = &item["metadata"]["generation"];
        let cond = item["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Programmed"));
        if let Some(c) = cond {
            // NB: a condition about an older generation says nothing about this one.
            let status = if &c["observedGeneration"] == generation {
                c["status"].as_str().unwrap_or_default().to_owned()
            } else {
                "Stale".to_owned()
            };
            all.insert(
                name,
                (
                    status,
                    c["reason"].as_str().unwrap_or_default().to_owned(),
                    c["message"].as_str().unwrap_or_default().to_owned(),
                ),
            );
        }
    }
    Some(all)
}

fn programmed(p: &Pipeline, name: &str) -> Option<(String, String, String)> {
    programmed_all(&Kubectl::of(&p.cluster), &p.namespace)?.remove(name)
}

/// What the sampler checks: the routes, and the dataplanes that should serve them (kept in
/// step with the EndpointSlice by the test: added after it lists one, removed before).
#[derive(Default)]
struct Watched {
    routes: Vec<String>,
    dataplanes: Vec<(String, SocketAddr)>,
}

/// One disagreement: a route said `Programmed=True` while expected dataplanes did not serve
/// it.
#[derive(Debug, Clone)]
struct Lie {
    at: Duration,
    route: String,
    message: String,
    lacking: Vec<String>,
}

#[derive(Debug, Default)]
struct Samples {
    count: u64,
    longest_gap: Duration,
    lies: Vec<Lie>,
    /// Per route: when every expected dataplane first served it, and when it was first
    /// seen `Programmed=True` (the status lag, not a lie).
    first_served: BTreeMap<String, Duration>,
    first_programmed: BTreeMap<String, Duration>,
}

struct Sampler {
    watched: Arc<Mutex<Watched>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Samples>>,
}

impl Sampler {
    fn start(kubectl: Kubectl, ns: String, watched: Arc<Mutex<Watched>>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (stop_t, watched_t) = (Arc::clone(&stop), Arc::clone(&watched));
        let thread = std::thread::spawn(move || {
            let begin = Instant::now();
            let mut s = Samples::default();
            let mut last = Instant::now();
            while !stop_t.load(Ordering::Relaxed) {
                let tick = Instant::now();
                s.longest_gap = s.longest_gap.max(tick - last);
                last = tick;
                let (routes, dataplanes) = {
                    let w = watched_t.lock().unwrap();
                    (w.routes.clone(), w.dataplanes.clone())
                };
                // Status first, then traffic: a route True in this status must be served now.
                let Some(status) = programmed_all(&kubectl, &ns) else {
                    std::thread::sleep(SAMPLE_EVERY);
                    continue;
                };
                let at = tick - begin;
                for route in &routes {
                    let lacking: Vec<String> = dataplanes
                        .iter()
                        .filter(|(_, http)| !serves(*http, route))
                        .map(|(id, _)| id.clone())
                        .collect();
                    if lacking.is_empty() {
                        s.first_served.entry(route.clone()).or_insert(at);
                    }
                    let Some((st, _, message)) = status.get(route) else {
                        continue;
                    };
                    if st == "True" {
                        s.first_programmed.entry(route.clone()).or_insert(at);
                        if !lacking.is_empty() {
                            s.lies.push(Lie {
                                at,
                                route: route.clone(),
                                message: message.clone(),
                                lacking,
                            });
                        }
                    }
                }
                s.count += 1;
                let spent = tick.elapsed();
                if spent < SAMPLE_EVERY {
                    std::thread::sleep(SAMPLE_EVERY - spent);
                }
            }
            s
        });
        Self {
            watched,
            stop,
            thread: Some(thread),
        }
    }

    fn watch_route(&self, name: &str) {
        self.watched.lock().unwrap().routes.push(name.to_owned());
    }

    fn set_dataplanes(&self, dataplanes: Vec<(String, SocketAddr)>) {
        self.watched.lock().unwrap().dataplanes = dataplanes;
    }

    fn finish(mut self) -> Samples {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

/// The worst windows in which consecutive samples found a lie, per route.
fn lie_windows(lies: &[Lie]) -> Vec<(String, Duration, Duration)> {
    let mut by_route: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    for l in lies {
        by_route.entry(&l.route).or_default().push(l.at);
    }
    let mut out = Vec::new();
    for (route, ats) in by_route {
        let mut start = ats[0];
        let mut prev = ats[0];
        for &at in &ats[1..] {
            // NB: samples are 100 ms apart when kubectl is quick, up to about 0.5 s when
            // it is not; a longer gap between two lies starts a new window.
            if at - prev > Duration::from_secs(1) {
                out.push((route.to_owned(), start, prev - start + SAMPLE_EVERY));
                start = at;
            }
            prev = at;
        }
        out.push((route.to_owned(), start, prev - start + SAMPLE_EVERY));
    }
    out
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ready(addr: SocketAddr) -> bool {
    http_get(addr, "localhost", "/readyz").is_ok_and(|r| r.status == 200)
}

/// Waits until route `name` is `Programmed` with a message starting with `prefix`.
fn wait_programmed(p: &Pipeline, name: &str, prefix: &str, findings: &mut Vec<String>) {
    let got = eventually(Duration::from_secs(40), || {
        programmed(p, name).filter(|(s, _, m)| s == "True" && m.starts_with(prefix))
    });
    if got.is_none() {
        findings.push(format!(
            "{name} never Programmed {prefix}: {:?}",
            programmed(p, name)
        ));
    }
}

#[test]
fn the_leader_killed_every_dataplane_gets_new_routes_at_once_and_programmed_never_lies() {
    let started = Instant::now();
    let kills: usize = std::env::var("SLUICE_HA_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let mut p = Pipeline::start_fleet(2, 2).unwrap();
    let ns = p.namespace.clone();
    let mut findings: Vec<String> = Vec::new();
    let fleet = |p: &Pipeline, ids: &[usize]| -> Vec<(String, SocketAddr)> {
        ids.iter()
            .map(|&i| (p.fleet[i].id.clone(), p.fleet[i].http))
            .collect()
    };

    // Two routes before any fault, served and Programmed 2/2.
    for name in ["base-a", "base-b"] {
        p.cluster.apply(&route_yaml(&ns, name, "")).unwrap();
    }
    for name in ["base-a", "base-b"] {
        for dp in &p.fleet {
            eventually(Duration::from_secs(30), || {
                serves(dp.http, name).then_some(())
            })
            .unwrap_or_else(|| panic!("{} never served {name}", dp.id));
        }
        wait_programmed(&p, name, "2/2 dataplanes", &mut findings);
    }
    let sampler = Sampler::start(Kubectl::of(&p.cluster), ns.clone(), Arc::default());
    sampler.set_dataplanes(fleet(&p, &[0, 1]));
    for name in ["base-a", "base-b"] {
        sampler.watch_route(name);
    }
    let spread: Vec<(String, Option<f64>)> = std::iter::once(p.controller_identity.clone())
        .chain(p.replicas.iter().map(|r| r.identity.clone()))
        .map(|id| {
            let m = p.controller_metrics(&id).unwrap();
            (id, metric(m, "sluice_controller_connected_dataplanes"))
        })
        .collect();
    eprintln!("dataplanes per replica before the first kill: {spread:?}");

    // 1. The leader SIGKILLed, a route applied during the election.
    let mut reconfigured = Vec::new();
    for k in 0..kills {
        let leader = eventually(Duration::from_secs(30), || p.lease_holder()).expect("a leader");
        let name = format!("during-{k}");
        sampler.watch_route(&name);
        assert!(p.kill_controller(&leader), "{leader} was not running");
        let applied = Instant::now();
        p.cluster.apply(&route_yaml(&ns, &name, "")).unwrap();
        let served = eventually(Duration::from_secs(30), || {
            p.fleet
                .iter()
                .all(|dp| serves(dp.http, &name))
                .then(|| applied.elapsed())
        });
        let Some(served) = served else {
            findings.push(format!(
                "{name} (applied after killing {leader}) not served by every dataplane within 30 s"
            ));
            continue;
        };
        reconfigured.push(served);
        if served > RECONFIGURE_LIMIT {
            findings.push(format!("{name}: served by every dataplane {served:?} after the apply (limit {RECONFIGURE_LIMIT:?})"));
        }
        let standby = eventually(Duration::from_secs(40), || {
            p.lease_holder().filter(|h| *h != leader)
        });
        let took_over = applied.elapsed();
        let Some(standby) = standby else {
            findings.push(format!("nobody took the Lease over from {leader}"));
            break;
        };
        wait_programmed(&p, &name, "2/2 dataplanes", &mut findings);
        eprintln!(
            "kill {k}: leader {leader} SIGKILLed; {name} served by both dataplanes {served:?} after the apply; {standby} leads {took_over:?} after it; Programmed 2/2 {:?} after it",
            applied.elapsed()
        );
        // The killed replica comes back as the standby.
        assert!(p.restart_controller_replica(&leader).unwrap());
        let m = p.controller_metrics(&leader).unwrap();
        eventually(Duration::from_secs(30), || ready(m).then_some(()))
            .unwrap_or_else(|| panic!("{leader} not ready after its restart"));
    }

    // 2. A dataplane cut off from every controller.
    p.fleet[1].link.cut();
    sampler.watch_route("partitioned");
    p.cluster
        .apply(&route_yaml(&ns, "partitioned", ""))
        .unwrap();
    eventually(Duration::from_secs(30), || {
        serves(p.fleet[0].http, "partitioned").then_some(())
    })
    .expect("dataplane 0 serves the route applied during the partition");
    let waiting = eventually(Duration::from_secs(30), || {
        programmed(&p, "partitioned").filter(|(s, _, m)| {
            s == "False"
                && m.contains("1/2 dataplanes")
                && m.contains("waiting for: sluice-dataplane-1")
        })
    });
    match &waiting {
        Some((_, reason, message)) => eprintln!("partition: Programmed=False {reason}: {message}"),
        None => findings.push(format!(
            "during the partition, partitioned is not Programmed=False waiting for sluice-dataplane-1: {:?}",
            programmed(&p, "partitioned")
        )),
    }
    assert!(
        !serves(p.fleet[1].http, "partitioned"),
        "the partitioned dataplane got the route"
    );
    std::thread::sleep(Duration::from_secs(1));
    // Its pod goes away: it leaves the expected set.
    sampler.set_dataplanes(fleet(&p, &[0]));
    p.set_expected_dataplanes(&["sluice-dataplane-0"]).unwrap();
    wait_programmed(&p, "partitioned", "1/1 dataplanes", &mut findings);
    // It comes back (reconnects, catches up) and is listed again once it serves.
    let restored = Instant::now();
    p.fleet[1].link.restore();
    let caught_up = eventually(Duration::from_secs(30), || {
        serves(p.fleet[1].http, "partitioned").then(|| restored.elapsed())
    });
    eprintln!("the partitioned dataplane caught up {caught_up:?} after its path came back");
    if caught_up.is_none_or(|t| t > RECONFIGURE_LIMIT) {
        findings.push(format!(
            "the partitioned dataplane caught up after {caught_up:?}"
        ));
    }
    p.set_expected_dataplanes(&["sluice-dataplane-0", "sluice-dataplane-1"])
        .unwrap();
    sampler.set_dataplanes(fleet(&p, &[0, 1]));
    wait_programmed(&p, "partitioned", "2/2 dataplanes", &mut findings);

    // 3. A dataplane that NACKs shows up by name.
    let strict = p
        .add_fleet_dataplane("sluice-dataplane-strict", &["--plugins", "prometheus"])
        .unwrap();
    let strict_http = p.fleet[strict].http;
    let new_ready = Instant::now();
    eventually(Duration::from_secs(30), || {
        serves(strict_http, "partitioned").then_some(())
    })
    .expect("the strict dataplane serves");
    eprintln!(
        "a new dataplane served every route {:?} after it started",
        new_ready.elapsed()
    );
    p.set_expected_dataplanes(&[
        "sluice-dataplane-0",
        "sluice-dataplane-1",
        "sluice-dataplane-strict",
    ])
    .unwrap();
    sampler.set_dataplanes(fleet(&p, &[0, 1, strict]));
    wait_programmed(&p, "base-a", "3/3 dataplanes", &mut findings);
    sampler.watch_route("limited");
    let limit_count = "      plugins:\n        - name: limit-count\n          enable: true\n          config: {count: 100, time_window: 60}\n";
    p.cluster
        .apply(&route_yaml(&ns, "limited", limit_count))
        .unwrap();
    let rejected = eventually(Duration::from_secs(30), || {
        programmed(&p, "limited").filter(|(s, reason, m)| {
            s == "False" && reason == "Rejected" && m.contains("2/3 dataplanes")
        })
    });
    match rejected {
        Some((_, _, m)) => {
            eprintln!("NACK: Programmed=False Rejected: {m}");
            for want in [
                "waiting for: sluice-dataplane-strict (rejected v",
                "dataplane sluice-dataplane-strict rejected v",
                "plugin \"limit-count\" is not enabled on this dataplane",
            ] {
                if !m.contains(want) {
                    findings.push(format!("the NACK message lacks {want:?}: {m}"));
                }
            }
        }
        None => findings.push(format!(
            "limited is not Programmed=False Rejected 2/3: {:?}",
            programmed(&p, "limited")
        )),
    }
    assert!(serves(p.fleet[0].http, "limited") && serves(p.fleet[1].http, "limited"));
    assert!(!serves(strict_http, "limited"));
    std::thread::sleep(Duration::from_secs(1));

    let samples = sampler.finish();
    let windows = lie_windows(&samples.lies);
    let mut lag: Vec<(String, Duration)> = samples
        .first_programmed
        .iter()
        .filter_map(|(r, &prog)| {
            let served = samples.first_served.get(r)?;
            Some((r.clone(), prog.saturating_sub(*served)))
        })
        .collect();
    lag.sort_by_key(|(_, d)| std::cmp::Reverse(*d));
    let mut sorted = reconfigured.clone();
    sorted.sort();
    if !sorted.is_empty() {
        eprintln!(
            "reconfiguration after a leader kill (apply -> every dataplane serves), {} kills: p50 {:?}, max {:?}, all {:?}",
            sorted.len(),
            percentile(&sorted, 0.5),
            sorted[sorted.len() - 1],
            reconfigured
        );
    }
    eprintln!(
        "sampler: {} samples (status + traffic), longest gap between samples {:?}; windows where Programmed=True but an expected dataplane lacked the route: {windows:?}; status lag behind traffic (served by all -> Programmed=True), worst first: {:?}",
        samples.count,
        samples.longest_gap,
        &lag[..lag.len().min(4)]
    );
    eprintln!("test wall time: {:?}", started.elapsed());
    if !samples.lies.is_empty() {
        findings.push(format!(
            "Programmed=True while an expected dataplane lacked the route, windows {windows:?}; first samples: {:#?}",
            samples.lies[..samples.lies.len().min(5)]
                .iter()
                .map(|l| format!("at {:?}: {} said {:?} while {:?} did not serve it", l.at, l.route, l.message, l.lacking))
                .collect::<Vec<_>>()
        ));
    }
    assert!(findings.is_empty(), "{findings:#?}");
}
