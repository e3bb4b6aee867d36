//! The test cluster itself: kubectl access, RBAC-bound ServiceAccount clients, cleanup.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sluice_e2e::{Cluster, Wait, eventually, repo_root};

/// Whether `pid` is a live (not zombie) process.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

#[test]
fn admin_kubeconfig_works_with_plain_kubectl() {
    let cluster = Cluster::shared();
    // Exactly what a developer would type.
    let out = Command::new(sluice_e2e::kubectl_path())
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .args(["get", "ns", "-o", "name"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for ns in [
        "namespace/default",
        "namespace/kube-system",
        "namespace/kube-public",
    ] {
        assert!(stdout.lines().any(|l| l == ns), "{ns} missing:\n{stdout}");
    }
    let version: serde_json::Value =
        serde_json::from_str(&cluster.kubectl_ok(&["version", "-o", "json"]).unwrap()).unwrap();
    assert_eq!(
        version["serverVersion"]["gitVersion"],
        cluster.kube_version()
    );
    assert!(cluster.server_url().starts_with("https://127.0.0.1:"));
}

#[test]
fn service_account_kubeconfig_has_exactly_the_rights_rbac_grants() {
    let cluster = Cluster::shared();
    let ns = cluster.create_namespace("rbac").unwrap();
    let kubeconfig = cluster.service_account_kubeconfig(&ns, "reader").unwrap();
    let get = |what: &str| {
        cluster
            .kubectl_as(&kubeconfig, &["get", what, "-n", &ns], None)
            .unwrap()
    };

    let before = get("configmaps");
    assert!(!before.success);
    assert!(
        before
            .stderr
            .contains(&format!("system:serviceaccount:{ns}:reader"))
            && before.stderr.contains("forbidden"),
        "{}",
        before.stderr
    );

    cluster
        .apply(&format!(
            r#"apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: configmap-reader, namespace: {ns}}}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: reader, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: configmap-reader}}
subjects:
- {{kind: ServiceAccount, name: reader, namespace: {ns}}}
"#
        ))
        .unwrap();
    // The RBAC authorizer learns about new bindings through a watch: give it a moment.
    assert!(
        eventually(
            Wait::up_to(Duration::from_secs(10)).every(Duration::from_millis(100)),
            || get("configmaps").success
        ),
        "timed out after 10s waiting for the RoleBinding to take effect"
    );
    let secrets = get("secrets");
    assert!(
        !secrets.success && secrets.stderr.contains("forbidden"),
        "{}",
        secrets.stderr
    );
    let other_ns = cluster
        .kubectl_as(&kubeconfig, &["get", "configmaps", "-n", "default"], None)
        .unwrap();
    assert!(
        !other_ns.success,
        "a Role must not grant access to other namespaces"
    );
}

#[test]
fn dropping_a_cluster_stops_its_processes_and_deletes_its_directory() {
    let cluster = Cluster::start();
    let (apiserver, etcd) = cluster.pids();
    let dir = cluster.dir().to_owned();
    assert!(running(apiserver) && running(etcd));
    assert!(dir.join("kubeconfig").is_file());
    drop(cluster);
    assert!(
        !running(apiserver),
        "kube-apiserver {apiserver} still running"
    );
    assert!(!running(etcd), "etcd {etcd} still running");
    assert!(!dir.exists(), "{} still exists", dir.display());
}

#[test]
fn the_watchdog_cleans_up_when_the_owning_process_dies() {
    // Stand-in for a test binary that gets killed: the cluster is owned by a `sleep`.
    let mut owner = Command::new("sleep").arg("600").spawn().unwrap();
    let dir = std::env::temp_dir().join(format!("sluice-e2e-watchdog-{}", std::process::id()));
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/cluster/testcluster.sh"))
        .arg("start")
        .arg(&dir)
        .args(["--owner-pid", &owner.id().to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = std::fs::read_to_string(dir.join("cluster.env")).unwrap();
    let pid = |key: &str| -> u32 {
        env.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .unwrap()
            .parse()
            .unwrap()
    };
    let (apiserver, etcd) = (pid("APISERVER_PID"), pid("ETCD_PID"));
    assert!(running(apiserver) && running(etcd));

    owner.kill().unwrap();
    owner.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(20), || !running(apiserver)
            && !running(etcd)
            && !Path::new(&dir).exists()),
        "timed out after 20s waiting for the watchdog to stop the cluster"
    );
}

#[test]
fn a_missing_binary_is_an_error_that_names_the_install_command() {
    let empty = std::env::temp_dir().join(format!("sluice-e2e-nocache-{}", std::process::id()));
    let dir = std::env::temp_dir().join(format!("sluice-e2e-nocluster-{}", std::process::id()));
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/cluster/testcluster.sh"))
        .arg("start")
        .arg(&dir)
        .env("SLUICE_CACHE", &empty)
        .env_remove("SLUICE_KUBE_APISERVER")
        .env_remove("SLUICE_ETCD")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("kube-apiserver v1.34.4"), "{stderr}");
    assert!(
        stderr.contains("run: scripts/cluster/testcluster.sh install"),
        "{stderr}"
    );
    assert!(!dir.join("cluster.env").exists());
}
