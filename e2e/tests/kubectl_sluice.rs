//! `kubectl-sluice` against a real kube-apiserver with a real controller and dataplane:
//! `status` names the dataplane with the snapshot version and hash it serves (read from the
//! controller's record) and the invalid route with its reason; `validate` gives the same
//! verdict offline on the same manifests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use sluice_e2e::{Pipeline, eventually, http_get, workspace_bin};

/// Runs `kubectl-sluice args`; returns stdout and the exit code.
fn kubectl_sluice(args: &[&str]) -> (String, i32) {
    let bin = workspace_bin("sluice-kubectl", "kubectl-sluice").unwrap();
    let out = Command::new(bin).args(args).output().unwrap();
    assert!(
        out.status.code() != Some(2),
        "kubectl-sluice {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8(out.stdout).unwrap(),
        out.status.code().unwrap_or(-1),
    )
}

#[test]
fn status_names_the_dataplane_and_the_invalid_route_and_validate_agrees() {
    let p = Pipeline::start().unwrap();
    let good = p.route_yaml("good", "/hello*");
    // CRD validation cannot see that the regex is broken; translation can.
    let bad = p.route_yaml("bad", "/bad*").replace(
        "        paths: [\"/bad*\"]\n",
        "        paths: [\"/bad*\"]\n        exprs:\n          - subject: {scope: Header, name: x-v}\n            op: RegexMatch\n            value: \"(\"\n",
    );
    p.cluster.apply(&good).unwrap();
    p.cluster.apply(&bad).unwrap();
    eventually(Duration::from_secs(30), || {
        http_get(p.http, "demo.e2e", "/hello")
            .ok()
            .filter(|r| r.status == 200)
    })
    .expect("good is served");

    let kubeconfig = p.cluster.kubeconfig().display().to_string();
    let ns = p.namespace.clone();
    let dataplane_id = format!("e2e-dataplane-{}", p.http.port());
    let admin = p.dataplane.as_ref().unwrap().addr();

    // Wait until good is Programmed and the record says what the dataplane serves now
    // (records are written 100 ms after a change).
    let (json, served) = eventually(Duration::from_secs(30), || {
        let served: Value =
            serde_json::from_str(&http_get(admin, "localhost", "/snapshot").ok()?.body).ok()?;
        let (out, code) = kubectl_sluice(&[
            "status",
            "--kubeconfig",
            &kubeconfig,
            "-n",
            &ns,
            "-o",
            "json",
        ]);
        assert_eq!(code, 1, "bad is not Accepted: exit 1\n{out}");
        let v: Value = serde_json::from_str(&out).unwrap();
        let dp = v["dataplanes"]
            .as_array()?
            .iter()
            .find(|d| d["name"] == dataplane_id.as_str())?
            .clone();
        let programmed = !v["problems"]
            .as_array()?
            .iter()
            .any(|p| p["name"] == "good");
        (programmed && dp["serving"]["hash"] == served["hash"] && dp["answer"] == "ACK")
            .then_some((v, served))
    })
    .expect("status shows the dataplane ACKing what it serves, and good Programmed");
    let dp = json["dataplanes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == dataplane_id.as_str())
        .unwrap();
    assert_eq!(dp["replica"], p.controller_identity.as_str());
    assert_eq!(dp["serving"]["version"], served["version"]);
    assert_eq!(dp["connected"], true);
    let accepted = json["problems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "bad" && p["condition"] == "Accepted")
        .unwrap_or_else(|| panic!("bad is reported: {json:#}"));
    assert_eq!(accepted["kind"], "ApisixRoute");
    assert_eq!(accepted["status"], "False");
    assert_eq!(accepted["reason"], "InvalidSpec");
    let message = accepted["message"].as_str().unwrap();
    assert!(
        message.contains("spec.http[0].match.exprs[0].value"),
        "{message}"
    );

    // The text a user reads: the dataplane with its version, the bad route with its
    // reason, no line wider than 80 columns.
    let (text, code) = kubectl_sluice(&["status", "--kubeconfig", &kubeconfig, "-n", &ns]);
    assert_eq!(code, 1, "{text}");
    let version = format!("v{}", served["version"]);
    assert!(
        text.lines()
            .any(|l| l.starts_with(&dataplane_id) && l.contains(&version) && l.contains("ACK")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("ApisixRoute {ns}/bad"))
                && l.contains("Accepted=False")
                && l.contains("InvalidSpec")),
        "{text}"
    );
    assert!(
        !text.contains(&format!("{ns}/good")),
        "good is Accepted and Programmed: {text}"
    );
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "{line:?} is wider than 80");
    }
    println!("{text}");

    // Without the bad route, everything is Accepted and Programmed: exit 0.
    p.cluster
        .kubectl_ok(&["delete", "apisixroute", "bad", "-n", &ns])
        .unwrap();
    let clean = eventually(Duration::from_secs(30), || {
        let (out, code) = kubectl_sluice(&["status", "--kubeconfig", &kubeconfig, "-n", &ns]);
        (code == 0).then_some(out)
    })
    .expect("status exits 0 once every object is Accepted and Programmed");
    assert!(
        clean.contains("All 1 objects are Accepted and Programmed."),
        "{clean}"
    );

    // validate, offline, on the same manifests: the same object, field and reason.
    let dir = p.cluster.dir().join("kubectl-sluice");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("routes.yaml");
    std::fs::write(&file, format!("{good}---\n{bad}")).unwrap();
    let (out, code) = kubectl_sluice(&["validate", "-f", &file.display().to_string()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("REJECTED ApisixRoute {ns}/bad")),
        "{out}"
    );
    assert!(out.contains("spec.http[0].match.exprs[0].value"), "{out}");
    assert!(out.contains("InvalidSpec"), "{out}");
    assert!(
        !out.contains(&format!("REJECTED ApisixRoute {ns}/good")),
        "{out}"
    );
}
