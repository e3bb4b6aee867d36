//! `kubectl sluice migrate` on a corpus of Ingresses written for ingress-nginx
//! (`tests/fixtures/ingress-nginx/`): every Ingress of the taken-over classes is reported
//! with a verdict per annotation, the verdicts are the controller's (an Ingress with a
//! snippet or an access-control annotation not served yet is refused; one whose only
//! annotations are served is served), and the exit code says whether all would be served.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use sluice_kubectl::migrate::migrate;
use sluice_kubectl::offline::load_sources;

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ingress-nginx");

#[test]
fn the_corpus_gets_a_verdict_per_ingress_and_annotation() {
    let loaded = load_sources(&[CORPUS.to_owned()]).unwrap();
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let all = loaded.state.ingresses.len();
    let report = migrate(&loaded, &["nginx".to_owned(), "nginx-internal".to_owned()]);
    assert!(
        report.ingresses.len() >= 30,
        "{} of {all}",
        report.ingresses.len()
    );
    let annotations: usize = report.ingresses.iter().map(|i| i.annotations.len()).sum();
    assert!(annotations >= 60, "{annotations}");
    for i in &report.ingresses {
        let refused_here = i.annotations.iter().any(|a| a.verdict == "refused");
        // An Ingress with a refused annotation is never served; one that is refused says why.
        if refused_here {
            assert!(!i.served, "{}/{}: {:?}", i.namespace, i.name, i.annotations);
        }
        if !i.served {
            assert!(!i.messages.is_empty(), "{}/{}", i.namespace, i.name);
        }
        for a in &i.annotations {
            if a.annotation.ends_with("-snippet") {
                assert_eq!(a.verdict, "refused", "{}/{}", i.namespace, i.name);
                assert!(a.detail.contains("no text configuration"), "{}", a.detail);
            }
        }
    }
    // At least one of each verdict in a realistic corpus, and the misspelling is caught.
    for v in [
        "served",
        "served differently",
        "refused",
        "ignored",
        "unknown",
    ] {
        assert!(
            report
                .ingresses
                .iter()
                .flat_map(|i| &i.annotations)
                .any(|a| a.verdict == v),
            "no {v:?}"
        );
    }
    assert!(
        report
            .ingresses
            .iter()
            .any(|i| i.served && i.annotations.is_empty())
    );
    assert!(
        report
            .ingresses
            .iter()
            .any(|i| i.served && !i.annotations.is_empty())
    );
    assert_eq!(report.exit_code(), 1);
    // Only the named classes.
    let only = migrate(&loaded, &["nginx-internal".to_owned()]);
    assert!(!only.ingresses.is_empty() && only.ingresses.len() < report.ingresses.len());
}

#[test]
fn the_command_prints_the_table_and_exits_1_when_one_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-sluice"))
        .args(["migrate", "-f", CORPUS, "--class", "nginx,nginx-internal"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.starts_with("INGRESS"), "{text}");
    assert!(text.contains("configuration-snippet"), "{text}");
    assert!(text.contains("(REFUSED)"), "{text}");
    assert!(
        text.contains(" Ingresses of class nginx, nginx-internal: "),
        "{text}"
    );
    let json = Command::new(env!("CARGO_BIN_EXE_kubectl-sluice"))
        .args(["migrate", "-f", CORPUS, "-o", "json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(v["ingresses"].as_array().unwrap().len() >= 25);
    // A file whose Ingresses would all be served exits 0.
    let dir = std::env::temp_dir().join(format!("sluice-migrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("ok.yaml"),
        "apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: ok
  namespace: web
  annotations: {nginx.ingress.kubernetes.io/proxy-body-size: 8m}
spec:
  ingressClassName: nginx
  rules: [{host: ok.example.com, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}}]
",
    )
    .unwrap();
    let ok = Command::new(env!("CARGO_BIN_EXE_kubectl-sluice"))
        .args(["migrate", "-f", dir.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&ok.stdout);
    assert_eq!(ok.status.code(), Some(0), "{text}");
    assert!(text.contains("proxy-body-size  served"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}
