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

/// Waits until the dataplane serves route `good` (`/hello*` on demo.e2e).
fn wait_served(p: &Pipeline) {
    eventually(Duration::from_secs(30), || {
        http_get(p.http, "demo.e2e", "/hello")
            .ok()
            .filter(|r| r.status == 200)
    })
    .expect("good is served");
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
    wait_served(&p);

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
        // NB: bad's condition is written by the status writer, apart from the records.
        let bad_written = v["problems"]
            .as_array()?
            .iter()
            .any(|p| p["name"] == "bad" && p["condition"] == "Accepted" && p["status"] == "False");
        (programmed
            && bad_written
            && dp["serving"]["hash"] == served["hash"]
            && dp["answer"] == "ACK")
            .then_some((v, served))
    })
    .expect("status shows the dataplane ACKing what it serves, good Programmed, bad refused");
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

/// Runs `kubectl-sluice args` through a real kubectl, as a plugin on `PATH`.
fn kubectl_plugin(dir: &std::path::Path, args: &[&str]) -> (String, i32) {
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(sluice_e2e::kubectl_path())
        .args(args)
        .env("PATH", path)
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.status.code().unwrap_or(-1),
    )
}

/// `explain` against the cluster (the objects the controller reads, translated as it does)
/// and against the running dataplane (`--admin`: its redacted snapshot and live endpoint
/// health) names the same route, upstream and endpoint; `diff --against` the dataplane shows
/// a route the files would add; and all of it works as `kubectl sluice`, with
/// `kubectl sluice <TAB>` answered through `kubectl_complete-sluice`.
#[test]
fn explain_and_diff_against_the_cluster_and_the_running_dataplane() {
    let p = Pipeline::start().unwrap();
    let good = p.route_yaml("good", "/hello*");
    p.cluster.apply(&good).unwrap();
    wait_served(&p);
    let kubeconfig = p.cluster.kubeconfig().display().to_string();
    let ns = p.namespace.clone();
    let admin = format!("http://{}", p.dataplane.as_ref().unwrap().addr());
    let endpoint = format!("{}:8080", p.net.addr());
    let route_id = format!("{ns}/good/r1");

    // The cluster, every namespace, as the controller reads it.
    let (out, code) = kubectl_sluice(&[
        "explain",
        "http://demo.e2e/hello/world",
        "--kubeconfig",
        &kubeconfig,
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{out}");
    let cluster: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(cluster["matched"]["id"], route_id.as_str(), "{cluster:#}");
    assert_eq!(
        cluster["matched"]["source"],
        format!("ApisixRoute {ns}/good").as_str()
    );
    assert!(
        cluster["source"].as_str().unwrap().starts_with("cluster ("),
        "{cluster:#}"
    );
    assert_eq!(
        cluster["upstreams"][0]["endpoints"][0]["address"],
        endpoint.as_str(),
        "{cluster:#}"
    );

    // The running dataplane: the same route and endpoint, its version, live health.
    let (out, code) = kubectl_sluice(&[
        "explain",
        "http://demo.e2e/hello/world",
        "--admin",
        &admin,
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{out}");
    let live: Value = serde_json::from_str(&out).unwrap();
    let served: Value = serde_json::from_str(
        &http_get(
            p.dataplane.as_ref().unwrap().addr(),
            "localhost",
            "/snapshot",
        )
        .unwrap()
        .body,
    )
    .unwrap();
    assert_eq!(live["matched"]["id"], route_id.as_str(), "{live:#}");
    assert!(
        live["source"].as_str().unwrap().contains(&format!(
            "snapshot {} (hash {})",
            served["version"],
            served["hash"].as_str().unwrap()
        )),
        "{live:#}"
    );
    let ep = &live["upstreams"][0]["endpoints"][0];
    assert_eq!(ep["address"], endpoint.as_str(), "{live:#}");
    assert_eq!(
        ep["health"], "healthy (in the dataplane's rotation)",
        "{live:#}"
    );
    assert_eq!(live["upstreamRequest"], cluster["upstreamRequest"]);

    // What a user reads (printed for the README's real run).
    let (text, _) = kubectl_sluice(&["explain", "http://demo.e2e/hello/world", "--admin", &admin]);
    println!("$ kubectl sluice explain http://demo.e2e/hello/world --admin {admin}\n{text}");

    // A request no route takes: both say 404, and so does the dataplane.
    for source in [
        ["--kubeconfig", kubeconfig.as_str()],
        ["--admin", admin.as_str()],
    ] {
        let (out, _) =
            kubectl_sluice(&["explain", "http://demo.e2e/nothing", source[0], source[1]]);
        assert!(
            out.contains("Route:    none: the dataplane answers 404"),
            "{out}"
        );
    }
    assert_eq!(
        http_get(p.http, "demo.e2e", "/nothing").unwrap().status,
        404
    );

    // diff: the files add a route to what the dataplane serves.
    let dir = p.cluster.dir().join("kubectl-sluice-explain");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("routes.yaml");
    std::fs::write(
        &file,
        format!("{good}---\n{}", p.route_yaml("extra", "/extra*")),
    )
    .unwrap();
    let (out, code) = kubectl_sluice(&[
        "diff",
        "-f",
        &file.display().to_string(),
        "--against",
        &admin,
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.lines().any(|l| l == format!("+ route {ns}/extra/r1")),
        "{out}"
    );
    assert!(!out.contains(&format!("- route {ns}/good/r1")), "{out}");
    println!("$ kubectl sluice diff -f routes.yaml --against {admin}\n{out}");

    // The same through kubectl, as a plugin on PATH, and its completion.
    let bin = workspace_bin("sluice-kubectl", "kubectl-sluice").unwrap();
    std::fs::copy(&bin, dir.join("kubectl-sluice")).unwrap();
    std::os::unix::fs::symlink(
        dir.join("kubectl-sluice"),
        dir.join("kubectl_complete-sluice"),
    )
    .unwrap();
    let (text, code) = kubectl_plugin(
        &dir,
        &[
            "sluice",
            "explain",
            "http://demo.e2e/hello",
            "--kubeconfig",
            &kubeconfig,
        ],
    );
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(&format!("Route:    {route_id} (ApisixRoute {ns}/good)")),
        "{text}"
    );
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "{line:?} is wider than 80");
    }
    println!("$ kubectl sluice explain http://demo.e2e/hello --kubeconfig ...\n{text}");
    let (completions, _) = kubectl_plugin(&dir, &["__complete", "sluice", "ex"]);
    assert!(
        completions.lines().any(|l| l.starts_with("explain\t")),
        "{completions}"
    );
}
