//! traffic-split with real processes on a real kube-apiserver: a route to Service `echo`
//! whose traffic-split sends requests with `x-canary: 1` to Service `canary` (a second
//! echo backend in the network namespace) and splits the rest 1:1 between the two; a route
//! whose `upstream_id` names nothing is Accepted=False naming the field.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use sluice_e2e::{Pipeline, eventually, http_get_with};

fn served_by(p: &Pipeline, path: &str, headers: &[(&str, &str)]) -> Option<String> {
    http_get_with(p.http, "split.e2e", path, headers)
        .ok()
        .filter(|r| r.status == 200)
        .and_then(|r| r.header("x-echo-server").map(str::to_owned))
}

fn accepted(p: &Pipeline, name: &str) -> Option<Value> {
    let out = p
        .cluster
        .kubectl(&["get", "ar", name, "-n", &p.namespace, "-o", "json"])
        .ok()?;
    let obj: Value = serde_json::from_str(&out.stdout).ok()?;
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Accepted")
        .cloned()
}

#[test]
fn traffic_split_sends_the_canary_share_to_another_service() {
    let mut p = Pipeline::start().unwrap();
    let ns = p.namespace.clone();
    let canary_addr = p.net.add_address().unwrap();
    let _canary = p
        .net
        .spawn_echo("e2e-echo-canary", canary_addr, 8080)
        .unwrap();
    p.cluster
        .apply(&format!(
            r#"apiVersion: v1
kind: Service
metadata: {{name: canary, namespace: {ns}}}
spec:
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: canary-1
  namespace: {ns}
  labels: {{kubernetes.io/service-name: canary}}
addressType: IPv4
endpoints:
  - addresses: ["{canary_addr}"]
    conditions: {{ready: true}}
ports: [{{name: http, port: 8080}}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: split, namespace: {ns}}}
spec:
  ingressClassName: apisix
  http:
    - name: r
      match: {{hosts: [split.e2e], paths: ["/*"]}}
      backends: [{{serviceName: echo, servicePort: 80}}]
      plugins:
        - name: traffic-split
          config:
            rules:
              - match: [{{vars: [["http_x-canary", "==", "1"]]}}]
                weighted_upstreams: [{{upstream_id: "canary:80"}}]
              - weighted_upstreams: [{{upstream_id: canary, weight: 1}}, {{weight: 1}}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: bad, namespace: {ns}}}
spec:
  ingressClassName: apisix
  http:
    - name: r
      match: {{hosts: [bad.e2e], paths: ["/*"]}}
      backends: [{{serviceName: echo, servicePort: 80}}]
      plugins:
        - name: traffic-split
          config:
            rules: [{{weighted_upstreams: [{{upstream_id: "nothing:80"}}]}}]
"#
        ))
        .unwrap();

    // The header rule: only the canary Service's backend.
    eventually(Duration::from_secs(30), || {
        served_by(&p, "/x", &[("x-canary", "1")]).filter(|s| s == "e2e-echo-canary")
    })
    .expect("x-canary: 1 reaches the canary");
    for _ in 0..20 {
        assert_eq!(
            served_by(&p, "/x", &[("x-canary", "1")]).as_deref(),
            Some("e2e-echo-canary")
        );
    }
    // Everything else: 1:1 between the canary and the route's own Service, exactly.
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..20 {
        let s = served_by(&p, "/y", &[]).expect("served");
        *seen.entry(s).or_default() += 1;
    }
    assert_eq!(
        seen,
        BTreeMap::from([
            ("e2e-echo".to_owned(), 10),
            ("e2e-echo-canary".to_owned(), 10)
        ])
    );

    // An upstream_id that names nothing: the route is rejected with the field named.
    let c = eventually(Duration::from_secs(30), || {
        accepted(&p, "bad").filter(|c| c["status"] == "False")
    })
    .expect("bad: Accepted=False");
    let msg = c["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains(
            "spec.http[0].plugins[0].config.rules[0].weighted_upstreams[0].upstream_id: Service"
        ) && msg.contains("/nothing not found"),
        "{c}"
    );
    assert_eq!(
        http_get_with(p.http, "bad.e2e", "/x", &[]).unwrap().status,
        404
    );
    p.echo.kill();
}
