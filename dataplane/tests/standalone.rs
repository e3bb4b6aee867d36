//! The real `sluice-dataplane` binary in standalone mode: YAML files in, real traffic out,
//! hot reload, and bad input that never takes down what works.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Wait, eventually_async, free_port, get, listening};
use http::StatusCode;
use sluice_testkit::EchoServer;

struct Proc {
    child: Child,
    http: SocketAddr,
    admin: SocketAddr,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn admin_json(p: &Proc, path: &str) -> serde_json::Value {
    get(p.admin, "admin", path).await.json()
}

/// Waits (bounded) until `cond` holds on /snapshot; returns the last document.
async fn wait_snapshot(
    p: &Proc,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let cond = &cond;
    eventually_async(
        Wait::up_to(Duration::from_secs(10)).every(Duration::from_millis(50)),
        || async move {
            let s = admin_json(p, "/snapshot").await;
            if cond(&s) { Ok(s) } else { Err(s) }
        },
    )
    .await
    .unwrap_or_else(|s| panic!("timed out waiting for {what}; /snapshot = {s:#}"))
}

async fn start(config: &Path) -> Proc {
    let http = free_port();
    let admin = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_sluice-dataplane"))
        .arg("--standalone")
        .arg(config)
        .args([
            "--listen-http",
            &http.to_string(),
            // Loopback only; this test does not use HTTPS.
            "--listen-https",
            "127.0.0.1:0",
            "--admin",
            &admin.to_string(),
            "--workers",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let p = Proc { child, http, admin };
    assert!(
        listening(admin, Duration::from_secs(10)).await,
        "dataplane did not start"
    );
    p
}

fn backend_yaml(service: &str, port: u16) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: {service}, namespace: default}}
spec:
  ports: [{{name: http, port: 80, targetPort: {port}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {service}-1
  namespace: default
  labels: {{kubernetes.io/service-name: {service}}}
addressType: IPv4
endpoints:
  - addresses: ["127.0.0.1"]
    conditions: {{ready: true}}
ports: [{{name: http, port: {port}}}]
"#
    )
}

fn route_yaml(name: &str, path: &str, service: &str) -> String {
    format!(
        r#"apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: {name}, namespace: default}}
spec:
  http:
    - name: r1
      match:
        paths: ["{path}"]
      backends:
        - serviceName: {service}
          servicePort: 80
"#
    )
}

#[tokio::test]
async fn serves_a_directory_and_reloads_on_change() {
    let a = EchoServer::start("a", "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let b = EchoServer::start("b", "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("backends.yaml"),
        backend_yaml("svc-a", a.addr.port()) + "---\n" + &backend_yaml("svc-b", b.addr.port()),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("route.yaml"),
        route_yaml("web", "/app*", "svc-a"),
    )
    .unwrap();
    let p = start(dir.path()).await;
    wait_snapshot(&p, "first snapshot", |s| s["version"].as_u64() >= Some(1)).await;

    let resp = get(p.http, "h", "/app/x").await;
    assert_eq!(resp.status, StatusCode::OK);
    assert_eq!(resp.headers["x-echo-server"], "a");

    // Point the route at the other service: traffic follows without a restart.
    std::fs::write(
        dir.path().join("route.yaml"),
        route_yaml("web", "/app*", "svc-b"),
    )
    .unwrap();
    wait_snapshot(&p, "reload", |s| s["version"].as_u64() >= Some(2)).await;
    assert_eq!(
        get(p.http, "h", "/app/x").await.headers["x-echo-server"],
        "b"
    );

    // Delete the route file: 404.
    std::fs::remove_file(dir.path().join("route.yaml")).unwrap();
    wait_snapshot(&p, "route removed", |s| s["routes"].as_u64() == Some(0)).await;
    assert_eq!(
        get(p.http, "h", "/app/x").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn a_file_that_is_not_yaml_keeps_the_last_good_config() {
    let a = EchoServer::start("a", "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("all.yaml"),
        backend_yaml("svc-a", a.addr.port()) + "---\n" + &route_yaml("web", "/*", "svc-a"),
    )
    .unwrap();
    let p = start(dir.path()).await;
    let before = wait_snapshot(&p, "first snapshot", |s| s["routes"].as_u64() == Some(1)).await;

    std::fs::write(
        dir.path().join("broken.yaml"),
        "apiVersion: v1\nkind: [unclosed\n  - {",
    )
    .unwrap();
    let after = wait_snapshot(&p, "error reported", |s| !s["last_error"].is_null()).await;
    let err = after["last_error"].as_str().unwrap();
    assert!(err.contains("broken.yaml"), "error names the file: {err}");
    assert_eq!(
        after["version"], before["version"],
        "the last good snapshot stays live"
    );
    assert_eq!(get(p.http, "h", "/x").await.status, StatusCode::OK);

    // Fixing the file clears the error.
    std::fs::remove_file(dir.path().join("broken.yaml")).unwrap();
    wait_snapshot(&p, "error cleared", |s| s["last_error"].is_null()).await;
}

#[tokio::test]
async fn an_invalid_object_is_left_out_and_the_others_keep_serving() {
    let a = EchoServer::start("a", "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bad_op = r#"apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {name: bad-op, namespace: default}
spec:
  http:
    - name: r1
      match:
        paths: ["/bad-op"]
        exprs:
          - subject: {scope: Header, name: X-A}
            op: Bogus
            value: "1"
      backends: [{serviceName: svc-a, servicePort: 80}]
"#;
    let bad_cidr = r#"apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {name: bad-cidr, namespace: default}
spec:
  http:
    - name: r1
      match:
        paths: ["/bad-cidr"]
        remoteAddrs: ["10.0.0.300/8"]
      backends: [{serviceName: svc-a, servicePort: 80}]
"#;
    let yaml = [
        backend_yaml("svc-a", a.addr.port()),
        route_yaml("good", "/good", "svc-a"),
        bad_op.to_owned(),
        bad_cidr.to_owned(),
    ]
    .join("---\n");
    std::fs::write(dir.path().join("all.yaml"), yaml).unwrap();
    let p = start(dir.path()).await;
    let s = wait_snapshot(&p, "first snapshot", |s| s["version"].as_u64() >= Some(1)).await;

    assert_eq!(get(p.http, "h", "/good").await.status, StatusCode::OK);
    assert_eq!(
        get(p.http, "h", "/bad-op").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(p.http, "h", "/bad-cidr").await.status,
        StatusCode::NOT_FOUND
    );
    let rejected: Vec<String> = s["rejected_objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let all = rejected.join("\n");
    assert!(
        all.contains("bad-op") && all.contains("exprs[0].op") && all.contains("Bogus"),
        "{all}"
    );
    assert!(
        all.contains("bad-cidr") && all.contains("remoteAddrs[0]") && all.contains("10.0.0.300/8"),
        "{all}"
    );
}

#[test]
fn help_documents_the_cli_contract() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-dataplane"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--standalone",
        "--controller",
        "--listen-http",
        "--listen-https",
        "--admin",
        "--workers",
        "--log-format",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
}
