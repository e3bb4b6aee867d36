//! Measurements, not tests of record (the issue's controller targets):
//!
//! - `kubectl apply` of a route → the first 200 through a dataplane, repeated N times
//!   (default 100, `SLUICE_APPLY_ROUNDS`), reporting p50/p99/max, on top of
//!   `SLUICE_APPLY_BACKGROUND` existing routes (default 0; issue 43 measures 1,000 and 5,000),
//!   with the controller's and dataplane's CPU time per round;
//! - an EndpointSlice change → traffic on the new endpoint (default 50 flips,
//!   `SLUICE_SLICE_ROUNDS`);
//! - 2,000 ApisixRoutes applied at once → all `Programmed` (`SLUICE_BULK_ROUTES`), and the
//!   controller's RSS with them (run with `SLUICE_BULK_ROUTES=10000` for the 10k figure).
//!
//! ```sh
//! cargo test --release -p sluice-e2e --features measure --test apply_latency -- --nocapture --test-threads 1
//! ```
//! They assert nothing about time (timing belongs to benchmarks); they fail only if traffic
//! never arrives.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use sluice_e2e::{Pipeline, Wait, eventually, http_get};

fn rounds(var: &str, default: usize) -> usize {
    rounds_of(var, default).max(1)
}

fn rounds_of(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let pct =
        |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
    println!(
        "{what} over {} rounds: p50 {:?}, p99 {:?}, max {:?}",
        samples.len(),
        pct(0.50),
        pct(0.99),
        samples[samples.len() - 1]
    );
}

/// User plus system CPU time of process `pid` so far (`/proc/<pid>/stat`, clock ticks of
/// 10 ms).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // NB: fields after the `(comm)`, which may hold spaces: utime and stime are the 12th and
    // 13th after it.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<u64> = after
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Applies `n` ApisixRoutes (hosts `bg-0.e2e` .. `bg-499.e2e`, one rule each, to Service
/// `echo`) with parallel server-side applies, and waits until every one is `Programmed`, so
/// the controller's status writes for them are over before the measured rounds start.
fn apply_background(p: &Pipeline, n: usize) {
    let parallel = 8;
    let mut files = Vec::new();
    for chunk in 0..parallel {
        let mut yaml = String::new();
        for i in (chunk..n).step_by(parallel) {
            yaml.push_str(&format!(
                "apiVersion: apisix.apache.org/v2\nkind: ApisixRoute\nmetadata: {{name: bg-{i}, namespace: {ns}}}\nspec:\n  ingressClassName: apisix\n  http:\n    - name: r1\n      match:\n        hosts: [bg-{h}.e2e]\n        paths: [\"/bg/{i}*\"]\n      backends:\n        - serviceName: echo\n          servicePort: 80\n---\n",
                ns = p.namespace,
                h = i % 500
            ));
        }
        let file = p.cluster.dir().join(format!("background-{chunk}.yaml"));
        std::fs::write(&file, yaml).unwrap();
        files.push(file);
    }
    let start = Instant::now();
    std::thread::scope(|s| {
        for file in &files {
            let cluster = &p.cluster;
            s.spawn(move || {
                cluster
                    .kubectl_ok(&["apply", "--server-side", "-f", &file.to_string_lossy()])
                    .unwrap();
            });
        }
    });
    let ns = p.namespace.clone();
    eventually(
        Wait::up_to(Duration::from_secs(900)).every(Duration::from_secs(2)),
        || {
            let out = p
                .cluster
                .kubectl_ok(&["get", "ar", "-n", &ns, "-o", "json"])
                .ok()?;
            let v: serde_json::Value = serde_json::from_str(&out).ok()?;
            let programmed = v["items"]
                .as_array()?
                .iter()
                .filter(|o| {
                    o["status"]["conditions"].as_array().is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Programmed" && c["status"] == "True")
                    })
                })
                .count();
            (programmed >= n).then_some(())
        },
    )
    .expect("background routes Programmed");
    let last = n - 1;
    let host = format!("bg-{}.e2e", last % 500);
    let path = format!("/bg/{last}/x");
    eventually(Duration::from_secs(60), || {
        http_get(p.http, &host, &path)
            .ok()
            .filter(|r| r.status == 200)
    })
    .expect("the last background route serves");
    println!(
        "{n} background ApisixRoutes applied, served and Programmed in {:?}",
        start.elapsed()
    );
}

#[test]
fn apply_to_first_200_latency() {
    let rounds = rounds("SLUICE_APPLY_ROUNDS", 100);
    let background = rounds_of("SLUICE_APPLY_BACKGROUND", 0);
    let p = Pipeline::start().unwrap();
    // Warm the pipeline once.
    p.cluster.apply(&p.route_yaml("warm", "/warm")).unwrap();
    eventually(Duration::from_secs(30), || {
        http_get(p.http, "demo.e2e", "/warm")
            .ok()
            .filter(|r| r.status == 200)
    })
    .expect("warm-up route never served");
    if background > 0 {
        apply_background(&p, background);
    }
    let controller = p.controller.as_ref().unwrap().pid();
    let dataplane = p.dataplane.as_ref().unwrap().pid();
    let cpu = (cpu_time(controller), cpu_time(dataplane));

    let mut samples = Vec::with_capacity(rounds);
    let mut after_apply = Vec::with_capacity(rounds);
    // NB: probe every 2 ms (a fresh connection each), so the probe adds at most 2 ms.
    let wait = Wait::up_to(Duration::from_secs(60)).every(Duration::from_millis(2));
    for i in 0..rounds {
        let path = format!("/r{i}");
        let yaml = p.route_yaml(&format!("r{i}"), &path);
        let start = Instant::now();
        p.cluster.apply(&yaml).unwrap();
        let applied = Instant::now();
        eventually(wait, || {
            http_get(p.http, "demo.e2e", &path)
                .ok()
                .filter(|r| r.status == 200)
        })
        .unwrap_or_else(|| panic!("route {path} never served"));
        samples.push(start.elapsed());
        after_apply.push(applied.elapsed());
    }
    let per_round = |before: Duration, pid: u32| (cpu_time(pid) - before) / rounds as u32;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("existing routes: {background}; load average after the rounds: {load}");
    report("apply -> first 200 (kubectl apply included)", samples);
    report("kubectl apply returned -> first 200", after_apply);
    println!(
        "CPU per round: controller {:?}, dataplane {:?} (10 ms ticks)",
        per_round(cpu.0, controller),
        per_round(cpu.1, dataplane)
    );
}

#[test]
fn endpointslice_change_to_traffic_latency() {
    let rounds = rounds("SLUICE_SLICE_ROUNDS", 50);
    let mut p = Pipeline::start().unwrap();
    let addr1 = p.net.addr();
    let addr2 = p.net.add_address().unwrap();
    let _echo2 = p.net.spawn_echo("e2e-echo-2", addr2, 8080).unwrap();
    p.cluster.apply(&p.route_yaml("demo", "/hello*")).unwrap();
    let served_by = |name: &str| {
        eventually(Duration::from_secs(30), || {
            http_get(p.http, "demo.e2e", "/hello")
                .ok()
                .filter(|r| r.header("x-echo-server") == Some(name))
        })
        .unwrap_or_else(|| panic!("never served by {name}"));
    };
    served_by("e2e-echo");
    let mut samples = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let (addr, name) = if i % 2 == 0 {
            (addr2, "e2e-echo-2")
        } else {
            (addr1, "e2e-echo")
        };
        let patch = format!(
            r#"{{"endpoints":[{{"addresses":["{addr}"],"conditions":{{"ready":true}}}}]}}"#
        );
        let start = Instant::now();
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
        served_by(name);
        samples.push(start.elapsed());
    }
    report(
        "EndpointSlice patch -> traffic on the new endpoint (kubectl patch included)",
        samples,
    );
}

#[test]
fn bulk_apply_to_programmed_and_controller_rss() {
    let n = rounds("SLUICE_BULK_ROUTES", 2000);
    let p = Pipeline::start().unwrap();
    // kubectl applies one object per request; several at once get closer to "at once".
    let parallel = rounds("SLUICE_BULK_PARALLEL", 8).max(1);
    let mut files = Vec::new();
    for chunk in 0..parallel {
        let mut yaml = String::new();
        for i in (chunk..n).step_by(parallel) {
            yaml.push_str(&p.route_yaml(&format!("bulk-{i}"), &format!("/bulk/{i}")));
            yaml.push_str("---\n");
        }
        let file = p.cluster.dir().join(format!("bulk-{chunk}.yaml"));
        std::fs::write(&file, yaml).unwrap();
        files.push(file);
    }
    let start = Instant::now();
    std::thread::scope(|s| {
        for file in &files {
            let cluster = &p.cluster;
            s.spawn(move || {
                cluster
                    .kubectl_ok(&["apply", "--server-side", "-f", &file.to_string_lossy()])
                    .unwrap();
            });
        }
    });
    let applied = start.elapsed();
    let ns = p.namespace.clone();
    eventually(Duration::from_secs(300), || {
        let out = p
            .cluster
            .kubectl_ok(&["get", "ar", "-n", &ns, "-o", "json"])
            .ok()?;
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        let items = v["items"].as_array()?;
        let programmed = items
            .iter()
            .filter(|o| {
                o["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Programmed" && c["status"] == "True")
                })
            })
            .count();
        (programmed == n).then_some(())
    })
    .expect("all routes Programmed");
    let all = start.elapsed();
    let pid = p.controller.as_ref().unwrap().pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap_or("VmRSS: ?")
        .to_owned();
    println!(
        "{n} ApisixRoutes: kubectl apply took {applied:?}; all Programmed {all:?} after the apply started ({:?} after it returned); controller {rss}",
        all - applied
    );
}
