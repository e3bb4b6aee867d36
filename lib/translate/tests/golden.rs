//! The golden harness: every `testdata/<family>/<case>.in.yaml` is loaded and translated, and
//! the result rendered by [`sluice_translate::golden::render`] must equal
//! `testdata/<family>/<case>.out.yaml` byte for byte. `sluice_translate::golden` documents
//! the layout, the `# options:` line and the two views (`gateway`, everything else).
//!
//! Regenerate after an intended change, then review the diff:
//!
//! ```text
//! SLUICE_UPDATE_GOLDEN=1 cargo test -p sluice-translate --test golden
//! git diff lib/translate/testdata
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use sluice_translate::golden::{self, Case};
use sluice_translate::{ClusterState, translate};

/// NB: `CARGO_MANIFEST_DIR` read when the test runs, not `env!` alone: CI keeps the build
/// cache outside the clone, and a test binary another clone built would read its testdata.
fn testdata() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).to_owned())
        .join("testdata")
}

fn cases() -> Vec<Case> {
    let cases = golden::cases(&testdata()).unwrap();
    let count = |family: &str| cases.iter().filter(|c| c.family == family).count();
    assert!(
        count("apisix") >= 14 && count("ingress") >= 5 && count("gateway") >= 8,
        "expected the golden cases in {:?}",
        testdata()
    );
    cases
}

fn input(case: &Case) -> String {
    std::fs::read_to_string(&case.input).unwrap()
}

#[test]
fn golden() {
    let update = std::env::var_os("SLUICE_UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let mut failures = Vec::new();
    for case in cases() {
        let actual = golden::render(&case, &input(&case)).unwrap();
        if update {
            std::fs::write(&case.output, &actual).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&case.output).unwrap_or_default();
        if expected != actual {
            let id = case.id();
            failures.push(format!(
                "--- {id}: expected ({})\n{expected}\n+++ {id}: actual\n{actual}",
                case.output.display()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden case(s) differ (set SLUICE_UPDATE_GOLDEN=1 to accept):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The same objects in any order give the same snapshot bytes and status.
#[test]
fn output_does_not_depend_on_input_order() {
    for case in cases() {
        let input = input(&case);
        let id = case.id();
        let opts = golden::options(&input).unwrap();
        let mut docs: Vec<&str> = input.split("\n---\n").collect();
        let reference = {
            let mut s = ClusterState::new();
            s.load_yaml(&id, &input).unwrap();
            translate(&s, &opts)
        };
        let n = docs.len();
        for round in 0..4 {
            // Deterministic permutations: reverse, then rotations of the reversed list.
            if round == 0 {
                docs.reverse();
            } else {
                docs.rotate_left(round % n.max(1));
            }
            let shuffled = docs.join("\n---\n");
            let mut s = ClusterState::new();
            s.load_yaml(&id, &shuffled).unwrap();
            let t = translate(&s, &opts);
            assert_eq!(
                prost::Message::encode_to_vec(&t.snapshot),
                prost::Message::encode_to_vec(&reference.snapshot),
                "{id}: snapshot differs for order {round}"
            );
            assert_eq!(
                sluice_proto::content_hash(&t.snapshot),
                sluice_proto::content_hash(&reference.snapshot)
            );
            assert_eq!(
                t.status, reference.status,
                "{id}: status differs for order {round}"
            );
            assert_eq!(
                t.ingresses, reference.ingresses,
                "{id}: Ingress status differs for order {round}"
            );
        }
    }
}

/// Sorted and unique.
fn assert_ids(id: &str, what: &str, v: &[&str]) {
    let mut sorted = v.to_vec();
    sorted.sort();
    sorted.dedup();
    assert_eq!(v, sorted, "{id}: {what} ids sorted and unique");
}

/// What the dataplane checks when it compiles a snapshot (besides the match rules, which
/// translate validates with the same rules): a snapshot that breaks one of these is NACKed
/// whole, so translation must never produce one.
#[test]
fn snapshots_satisfy_the_dataplane_invariants() {
    for case in cases() {
        let input = input(&case);
        let id = case.id();
        let mut s = ClusterState::new();
        s.load_yaml(&id, &input).unwrap();
        let snap = translate(&s, &golden::options(&input).unwrap()).snapshot;

        let route_ids: Vec<&str> = snap.routes.iter().map(|r| r.id.as_str()).collect();
        assert_ids(&id, "route", &route_ids);
        let up_ids: Vec<&str> = snap.upstreams.iter().map(|u| u.id.as_str()).collect();
        assert_ids(&id, "upstream", &up_ids);
        let cert_ids: Vec<&str> = snap
            .tls_certificates
            .iter()
            .map(|c| c.id.as_str())
            .collect();
        assert_ids(&id, "certificate", &cert_ids);

        for r in &snap.routes {
            assert!(!r.paths.is_empty(), "{id}: {} has no paths", r.id);
            assert!(
                r.backends.iter().any(|b| b.weight > 0),
                "{id}: {} has no backend with a positive weight",
                r.id
            );
            for b in &r.backends {
                assert!(
                    up_ids.binary_search(&b.upstream_id.as_str()).is_ok(),
                    "{id}: {} names missing upstream {}",
                    r.id,
                    b.upstream_id
                );
            }
            for p in &r.plugins {
                let config: serde_json::Value = serde_json::from_str(&p.config_json).unwrap();
                sluice_plugin_config::validate(&p.name, &config)
                    .unwrap_or_else(|e| panic!("{id}: {}: {e}", r.id));
            }
        }
        for u in &snap.upstreams {
            for e in &u.endpoints {
                assert!(
                    !e.host.is_empty() && (1..=65535).contains(&e.port),
                    "{id}: {} has endpoint {}:{}",
                    u.id,
                    e.host,
                    e.port
                );
            }
        }
    }
}
