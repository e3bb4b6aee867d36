//! Synthetic configuration for the speed measurements of `validate` (the benchmark
//! `benches/validate.rs` and `tests/library.rs`): `objects` ApisixRoutes of `rules` rules,
//! each rule with two hosts (one wildcard), a prefix and an exact path and two methods, and
//! each route's Service with an EndpointSlice; spread over ten namespaces.

use std::fmt::Write as _;

/// The YAML of `objects × rules` routes with their Services and EndpointSlices.
pub fn routes_yaml(objects: usize, rules: usize) -> String {
    let mut yaml = String::new();
    for i in 0..objects {
        let ns = i % 10;
        let _ = write!(
            yaml,
            "apiVersion: apisix.apache.org/v2\nkind: ApisixRoute\n\
             metadata: {{name: r{i}, namespace: ns{ns}}}\n\
             spec:\n  ingressClassName: apisix\n  http:\n"
        );
        for j in 0..rules {
            let _ = write!(
                yaml,
                "    - name: rule{j}\n      priority: {j}\n      match:\n\
                 \x20       hosts: [h{i}.example.com, \"*.w{i}.example.com\"]\n\
                 \x20       paths: [\"/api/{j}/*\", /exact/{j}]\n\
                 \x20       methods: [GET, POST]\n\
                 \x20     backends: [{{serviceName: svc{i}, servicePort: 80}}]\n"
            );
        }
        let _ = write!(
            yaml,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc{i}, namespace: ns{ns}}}\n\
             spec:\n  ports: [{{port: 80, targetPort: 8080}}]\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n\
             \x20 name: svc{i}-a\n  namespace: ns{ns}\n\
             \x20 labels: {{kubernetes.io/service-name: svc{i}}}\n\
             addressType: IPv4\nports: [{{port: 8080}}]\nendpoints:\n\
             \x20 - addresses: [\"10.1.{}.{}\"]\n    conditions: {{ready: true}}\n---\n",
            i / 250,
            i % 250 + 1
        );
    }
    yaml
}
