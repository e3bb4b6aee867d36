//! ApisixUpstream `subsets` with real processes on a real kube-apiserver: two echo backends
//! in a network namespace behind one Service, their Pods labelled `version: v1` and `v2`
//! (Pods stay Pending: the test cluster has no kubelet; only their labels matter); the route
//! to subset `v1` reaches only the v1 backend, and follows a relabeling.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_e2e::{Pipeline, eventually, http_get};

fn served_by(p: &Pipeline, path: &str) -> Option<String> {
    http_get(p.http, "demo.e2e", path)
        .ok()
        .filter(|r| r.status == 200)
        .and_then(|r| r.header("x-echo-server").map(str::to_owned))
}

fn label(p: &Pipeline, pod: &str, version: &str) {
    p.cluster
        .kubectl_ok(&[
            "label",
            "pod",
            pod,
            "-n",
            &p.namespace,
            "--overwrite",
            &format!("version={version}"),
        ])
        .unwrap();
}

#[test]
fn a_subset_route_reaches_only_the_pods_with_its_labels() {
    let mut p = Pipeline::start().unwrap();
    let ns = p.namespace.clone();
    let v1_addr = p.net.addr();
    let v2_addr = p.net.add_address().unwrap();
    let _v2 = p.net.spawn_echo("e2e-echo-v2", v2_addr, 8080).unwrap();
    let pod = |name: &str, version: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {{app: echo, version: {version}}}}}\nspec:\n  automountServiceAccountToken: false\n  containers: [{{name: echo, image: example.invalid/echo:1}}]\n---\n"
        )
    };
    p.cluster
        .apply(&format!(
            r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: default, namespace: {ns}}}
---
{}{}apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-1
  namespace: {ns}
  labels: {{kubernetes.io/service-name: echo}}
addressType: IPv4
endpoints:
  - addresses: ["{v1_addr}"]
    conditions: {{ready: true}}
    targetRef: {{kind: Pod, name: echo-v1, namespace: {ns}}}
  - addresses: ["{v2_addr}"]
    conditions: {{ready: true}}
    targetRef: {{kind: Pod, name: echo-v2, namespace: {ns}}}
ports: [{{name: http, port: 8080}}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixUpstream
metadata: {{name: echo, namespace: {ns}}}
spec:
  ingressClassName: apisix
  subsets:
    - name: stable
      labels: {{version: v1}}
---
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: split, namespace: {ns}}}
spec:
  ingressClassName: apisix
  http:
    - name: stable
      match: {{hosts: [demo.e2e], paths: ["/stable"]}}
      backends: [{{serviceName: echo, servicePort: 80, subset: stable}}]
    - name: all
      match: {{hosts: [demo.e2e], paths: ["/all"]}}
      backends: [{{serviceName: echo, servicePort: 80}}]
"#,
            pod("echo-v1", "v1"),
            pod("echo-v2", "v2"),
        ))
        .unwrap();

    // The whole Service reaches both backends (so both are really up).
    let mut seen = std::collections::BTreeSet::new();
    eventually(Duration::from_secs(30), || {
        seen.extend(served_by(&p, "/all"));
        (seen.len() == 2).then_some(())
    })
    .unwrap_or_else(|| panic!("/all never reached both backends: {seen:?}"));

    // The subset reaches only the v1 Pod's backend.
    eventually(Duration::from_secs(30), || {
        served_by(&p, "/stable").filter(|s| s == "e2e-echo")
    })
    .expect("/stable served");
    for _ in 0..40 {
        assert_eq!(served_by(&p, "/stable").as_deref(), Some("e2e-echo"));
    }

    // Relabel: v2 becomes stable, v1 leaves; the subset moves with the labels.
    label(&p, "echo-v2", "v1");
    label(&p, "echo-v1", "v0");
    eventually(Duration::from_secs(30), || {
        served_by(&p, "/stable").filter(|s| s == "e2e-echo-v2")
    })
    .expect("/stable moved to the relabelled Pod");
    eventually(Duration::from_secs(30), || {
        (0..20)
            .all(|_| served_by(&p, "/stable").as_deref() == Some("e2e-echo-v2"))
            .then_some(())
    })
    .expect("only e2e-echo-v2 serves /stable");

    // No Pod with the labels: 503, not a hang.
    label(&p, "echo-v2", "v2");
    eventually(Duration::from_secs(30), || {
        http_get(p.http, "demo.e2e", "/stable")
            .ok()
            .filter(|r| r.status == 503)
    })
    .expect("503 for an empty subset");
    p.echo.kill();
}
