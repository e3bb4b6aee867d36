//! Writes N ApisixRoutes (one rule each, mixed hosts, exact and prefix paths) plus the
//! Services and EndpointSlices they use, for memory and reload measurements:
//!
//! ```sh
//! cargo run -p sluice-bench --example gen_routes -- 10000 > /tmp/routes-10k.yaml
//! sluice-dataplane --standalone /tmp/routes-10k.yaml --workers 1
//! grep VmRSS /proc/$(pgrep -f routes-10k)/status
//! ```
use std::fmt::Write as _;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let services = 100;
    let mut out = String::new();
    for s in 0..services {
        let _ = write!(
            out,
            "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: default}}\nspec:\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-{s}-1\n  namespace: default\n  labels: {{kubernetes.io/service-name: svc-{s}}}\n\
             addressType: IPv4\nendpoints:\n  - addresses: [\"127.0.0.{}\"]\n    conditions: {{ready: true}}\n  - addresses: [\"127.0.1.{}\"]\n    conditions: {{ready: true}}\n\
             ports: [{{name: http, port: 8080}}]\n---\n",
            s % 250 + 1,
            s % 250 + 1
        );
    }
    for i in 0..n {
        let path = if i % 2 == 0 {
            format!("/api/v{}/items/{i}*", i % 7)
        } else {
            format!("/exact/{i}")
        };
        let _ = write!(
            out,
            "apiVersion: apisix.apache.org/v2\nkind: ApisixRoute\nmetadata: {{name: route-{i}, namespace: default}}\nspec:\n  http:\n    - name: r1\n      priority: {}\n      match:\n        hosts: [\"host-{}.example.com\"]\n        paths: [\"{path}\"]\n      backends:\n        - serviceName: svc-{}\n          servicePort: 80\n---\n",
            i % 5,
            i % 500,
            i % services
        );
    }
    print!("{out}");
}
