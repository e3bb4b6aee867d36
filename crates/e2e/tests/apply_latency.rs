//! Measurement, not a test of record: `kubectl apply` of a route → the first 200 through a
//! dataplane, repeated N times (default 100, `SLUICE_APPLY_ROUNDS`), reporting p50/p99/max.
//!
//! ```sh
//! cargo test --release -p sluice-e2e --test apply_latency -- --ignored --nocapture
//! ```
//! It asserts nothing about time (timing belongs to benchmarks); it fails only if a route
//! never serves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use sluice_e2e::{Pipeline, eventually, http_get};

#[test]
#[ignore = "measurement; run with --ignored --nocapture"]
fn apply_to_first_200_latency() {
    let rounds: usize = std::env::var("SLUICE_APPLY_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let p = Pipeline::start().unwrap();
    // Warm the pipeline once.
    p.cluster.apply(&p.route_yaml("warm", "/warm")).unwrap();
    eventually(Duration::from_secs(30), || {
        http_get(p.http, "demo.e2e", "/warm")
            .ok()
            .filter(|r| r.status == 200)
    })
    .expect("warm-up route never served");

    let mut samples = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let path = format!("/r{i}");
        let yaml = p.route_yaml(&format!("r{i}"), &path);
        let start = Instant::now();
        p.cluster.apply(&yaml).unwrap();
        eventually(Duration::from_secs(30), || {
            http_get(p.http, "demo.e2e", &path)
                .ok()
                .filter(|r| r.status == 200)
        })
        .unwrap_or_else(|| panic!("route {path} never served"));
        samples.push(start.elapsed());
    }
    samples.sort();
    let pct =
        |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
    println!(
        "apply -> first 200 over {rounds} applies (kubectl apply included): p50 {:?}, p99 {:?}, max {:?}",
        pct(0.50),
        pct(0.99),
        samples[samples.len() - 1]
    );
}
