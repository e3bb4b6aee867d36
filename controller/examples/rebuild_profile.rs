//! Where one rebuild's time goes at N existing ApisixRoutes (issue 43): assemble, translate,
//! content hash, the whole `Rebuilder::rebuild` (which also seals, publishes and computes
//! the status side output), and what each dataplane stream costs (the deep clone of the
//! snapshot into its message, and the encode).
//!
//! ```sh
//! cargo run -p sluice-controller --example rebuild_profile -- 5000
//! ```
//! Debug or release as built; the figures are medians of 5 runs of a one-route change.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message as _;
use sluice_controller::cluster::{Inputs, assemble};
use sluice_controller::grpc::Hub;
use sluice_controller::metrics::Metrics;
use sluice_controller::rebuild::Rebuilder;
use sluice_proto::v1;
use sluice_translate::{ClusterState, Options, translate};

fn yaml(n: usize) -> String {
    let services = 100;
    let mut out = String::new();
    for s in 0..services {
        let _ = write!(
            out,
            "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: default}}\nspec:\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-{s}-1\n  namespace: default\n  labels: {{kubernetes.io/service-name: svc-{s}}}\n\
             addressType: IPv4\nendpoints:\n  - addresses: [\"127.0.0.{}\"]\n    conditions: {{ready: true}}\n\
             ports: [{{name: http, port: 8080}}]\n---\n",
            s % 250 + 1
        );
    }
    for i in 0..n {
        let _ = write!(
            out,
            "apiVersion: apisix.apache.org/v2\nkind: ApisixRoute\nmetadata: {{name: route-{i}, namespace: default, generation: 1}}\nspec:\n  ingressClassName: apisix\n  http:\n    - name: r1\n      match:\n        hosts: [\"host-{}.example.com\"]\n        paths: [\"/api/{i}*\"]\n      backends:\n        - serviceName: svc-{}\n          servicePort: 80\n---\n",
            i % 500,
            i % services
        );
    }
    out
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> Duration {
    median(
        (0..runs)
            .map(|_| {
                let start = Instant::now();
                std::hint::black_box(f());
                start.elapsed()
            })
            .collect(),
    )
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5000);
    let runs = 5;
    let mut state = ClusterState::default();
    let report = state.load_yaml("profile.yaml", &yaml(n)).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let base: Inputs = state.into();
    // One more route: the change a rebuild handles.
    let mut extra = ClusterState::default();
    extra
        .load_yaml("extra.yaml", &yaml(1).replace("route-0", "route-new"))
        .unwrap();
    let mut changed = base.clone();
    let extra: Inputs = extra.into();
    changed.apisix_routes.extend(extra.apisix_routes);

    let assembled = time(runs, || assemble(&changed, "apisix"));
    let state = assemble(&changed, "apisix");
    let opts = Options::default();
    let translated = time(runs, || translate(&state, &opts));
    let snapshot = translate(&state, &opts).snapshot;
    let hashed = time(runs, || sluice_proto::content_hash(&snapshot));
    let cloned = time(runs, || snapshot.clone());
    let msg = v1::ControllerMessage {
        snapshot: Some(snapshot.clone()),
        rejected_objects: Vec::new(),
        delta: None,
    };
    let encoded = time(runs, || msg.encode_to_vec());
    let bytes = msg.encode_to_vec().len();

    let metrics = Metrics::new().unwrap();
    let hub = Hub::new(metrics.clone());
    let mut rb = Rebuilder::new(Arc::clone(&hub), metrics, "apisix");
    let mut rebuilds = Vec::new();
    for _ in 0..runs {
        rb.rebuild(&base);
        let start = Instant::now();
        rb.rebuild(&changed);
        rebuilds.push(start.elapsed());
    }
    let rebuilt = median(rebuilds);
    println!(
        "{n} ApisixRoutes, {} snapshot routes, {bytes} bytes encoded ({} build)",
        snapshot.routes.len(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    println!("assemble          {assembled:?}");
    println!("translate         {translated:?}");
    println!("content_hash      {hashed:?}");
    println!("Rebuilder::rebuild (one route added) {rebuilt:?}");
    println!("per dataplane stream: snapshot clone {cloned:?}, encode {encoded:?}");
}
