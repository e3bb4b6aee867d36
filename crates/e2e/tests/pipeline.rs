//! The whole pipeline with real processes: `kubectl apply` on a real kube-apiserver →
//! the `sluice-controller` binary → gRPC → the `sluice-dataplane` binary → a real backend in a
//! network namespace. Then the failure cases users care about: a deleted route, a lost
//! controller, and a dataplane restarted while the controller is away.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_e2e::{Backend, Cluster, Netns, http_get, repo_root, workspace_bin};

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Polls `probe` until it returns `Some`, for at most `limit`; panics with `what` otherwise.
fn eventually<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

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

fn route_yaml(ns: &str) -> String {
    format!(
        r#"apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: demo, namespace: {ns}}}
spec:
  ingressClassName: apisix
  http:
    - name: hello
      match:
        hosts: [demo.e2e]
        paths: ["/hello*"]
      backends:
        - serviceName: echo
          servicePort: 80
"#
    )
}

fn start_dataplane(
    grpc: SocketAddr,
    state: &std::path::Path,
    http: SocketAddr,
    admin: SocketAddr,
) -> Backend {
    let mut cmd = Command::new(workspace_bin("sluice-dataplane", "sluice-dataplane").unwrap());
    cmd.args([
        "--controller",
        &format!("http://{grpc}"),
        "--insecure",
        "--workers",
        "1",
    ])
    .arg("--state-dir")
    .arg(state)
    .args([
        "--listen-http",
        &http.to_string(),
        "--admin",
        &admin.to_string(),
    ]);
    Backend::spawn(cmd, admin, Duration::from_secs(30)).unwrap()
}

#[test]
fn apply_serve_delete_and_survive_the_controller_going_away() {
    let cluster = Cluster::start();
    let crds = repo_root().join("charts/sluice/crds/apisix-crds.yaml");
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", crds.to_str().unwrap()])
        .unwrap();
    cluster
        .kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/apisixroutes.apisix.apache.org",
        ])
        .unwrap();
    let ns = cluster.create_namespace("pipeline").unwrap();

    // A real backend at a private address inside a network namespace.
    let net = Netns::create();
    let _echo = net.spawn_echo("e2e-echo", net.addr(), 8080).unwrap();
    cluster
        .apply(&format!(
            r#"apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: {ns}}}
spec:
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-1
  namespace: {ns}
  labels: {{kubernetes.io/service-name: echo}}
addressType: IPv4
endpoints:
  - addresses: ["{addr}"]
    conditions: {{ready: true}}
ports: [{{name: http, port: 8080}}]
"#,
            addr = net.addr()
        ))
        .unwrap();
    cluster.apply(&route_yaml(&ns)).unwrap();

    // The real controller binary and the real dataplane binary.
    let grpc = free_port();
    let metrics = free_port();
    let mut cmd = Command::new(workspace_bin("sluice-controller", "sluice-controller").unwrap());
    cmd.arg("--kubeconfig").arg(cluster.kubeconfig()).args([
        "--insecure",
        "--grpc-listen",
        &grpc.to_string(),
        "--metrics-listen",
        &metrics.to_string(),
    ]);
    let controller = Backend::spawn(cmd, grpc, Duration::from_secs(30)).unwrap();
    let state = tempdir();
    let (http, admin) = (free_port(), free_port());
    let dataplane = start_dataplane(grpc, &state, http, admin);

    // kubectl apply → traffic through the dataplane to the backend.
    let resp = eventually("the route to serve", Duration::from_secs(30), || {
        http_get(http, "demo.e2e", "/hello")
            .ok()
            .filter(|r| r.status == 200)
    });
    assert_eq!(resp.header("x-echo-server"), Some("e2e-echo"));
    assert!(
        resp.body.contains("\"x-forwarded-host\":\"demo.e2e\""),
        "{}",
        resp.body
    );

    // Status tells the truth: accepted, and programmed on the one dataplane.
    eventually("Accepted=True", Duration::from_secs(20), || {
        status_of(&cluster, &ns, "Accepted").filter(|(s, _)| s == "True")
    });
    let (_, programmed) = eventually("Programmed=True", Duration::from_secs(20), || {
        status_of(&cluster, &ns, "Programmed").filter(|(s, _)| s == "True")
    });
    assert!(
        programmed.contains("1/1"),
        "Programmed message: {programmed}"
    );

    // Route deleted → 404.
    cluster
        .kubectl_ok(&["delete", "ar", "demo", "-n", &ns])
        .unwrap();
    eventually("404 after delete", Duration::from_secs(20), || {
        http_get(http, "demo.e2e", "/hello")
            .ok()
            .filter(|r| r.status == 404)
    });

    // Re-applied, then the controller dies: the dataplane keeps serving what it has.
    cluster.apply(&route_yaml(&ns)).unwrap();
    eventually("the route to serve again", Duration::from_secs(30), || {
        http_get(http, "demo.e2e", "/hello")
            .ok()
            .filter(|r| r.status == 200)
    });
    drop(controller);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(http_get(http, "demo.e2e", "/hello").unwrap().status, 200);

    // A dataplane restarted while the controller is away serves its persisted snapshot.
    drop(dataplane);
    let (http2, admin2) = (free_port(), free_port());
    let _restarted = start_dataplane(grpc, &state, http2, admin2);
    let resp = eventually(
        "the restarted dataplane to serve",
        Duration::from_secs(20),
        || {
            http_get(http2, "demo.e2e", "/hello")
                .ok()
                .filter(|r| r.status == 200)
        },
    );
    assert_eq!(resp.header("x-echo-server"), Some("e2e-echo"));
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sluice-e2e-state-{}-{}",
        std::process::id(),
        free_port().port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
