//! One route change at 50,000 routes (and 5,000 upstreams): diff, chunk, apply and the v2
//! hash, the work of one delta end to end without the network.
//!
//! - `independent`: the next state comes from a whole new snapshot (every resource a new
//!   allocation, as the controller's translate gives today), so `diff` compares every
//!   resource by value;
//! - `shared`: the next state shares every unchanged resource with the previous one (as a
//!   state reached by `apply`, or an incremental translate), so `diff` skips them by pointer;
//! - `apply`: the dataplane's side alone, the delta applied and its hash checked;
//! - `endpoints_only_shared`: like `shared`, for one upstream whose endpoints changed;
//! - `from_snapshot`: building a state (and its hash) from a whole snapshot, for scale;
//! - `v1_content_hash`: today's hash of the same whole snapshot, for comparison.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use sluice_proto::state::{SnapshotState, chunks, diff};
use sluice_proto::v1;

const ROUTES: usize = 50_000;
const UPSTREAMS: usize = 5_000;

fn snapshot(version: u64, changed: Option<usize>) -> v1::Snapshot {
    let mut s = v1::Snapshot {
        version,
        ..Default::default()
    };
    for u in 0..UPSTREAMS {
        s.upstreams.push(v1::Upstream {
            id: format!("ns{}/svc{u}:80", u % 100),
            endpoints: (0..3)
                .map(|e| v1::Endpoint {
                    host: format!("10.{}.{}.{e}", u / 256, u % 256),
                    port: 8080,
                    weight: 100,
                })
                .collect(),
            ..Default::default()
        });
    }
    s.upstreams.sort_by(|a, b| a.id.cmp(&b.id));
    for i in 0..ROUTES {
        let u = i % UPSTREAMS;
        s.routes.push(v1::Route {
            id: format!("ns{}/route{i}/rule0", i % 100),
            source: format!("ApisixRoute ns{}/route{i}", i % 100),
            hosts: vec![format!("host{i}.example.com")],
            paths: vec![if changed == Some(i) {
                "/changed*".to_owned()
            } else {
                format!("/api/v1/{i}*")
            }],
            methods: vec!["GET".into(), "POST".into()],
            backends: vec![v1::Backend {
                upstream_id: format!("ns{}/svc{u}:80", u % 100),
                weight: 100,
                plugins: Vec::new(),
            }],
            plugins: vec![v1::Plugin {
                name: "proxy-rewrite".into(),
                config_json: format!("{{\"uri\":\"/internal/{i}\"}}"),
            }],
            ..Default::default()
        });
    }
    s.routes.sort_by(|a, b| a.id.cmp(&b.id));
    s
}

fn bench(c: &mut Criterion) {
    let Ok(a) = SnapshotState::from_snapshot(snapshot(1, None)) else {
        return;
    };
    let Ok(b) = SnapshotState::from_snapshot(snapshot(2, Some(ROUTES / 2))) else {
        return;
    };
    let one = chunks(&diff(&a, &b), 4 << 20);
    let Ok(b_shared) = a.apply_chunks(&one) else {
        return;
    };
    // One upstream's endpoints, as pods scale.
    let mut s = a.to_snapshot();
    s.version = 3;
    if let Some(up) = s.upstreams.get_mut(UPSTREAMS / 2) {
        up.endpoints.truncate(2);
    }
    let Ok(c_endpoints) = SnapshotState::from_snapshot(s) else {
        return;
    };
    let Ok(c_shared) = a.apply_chunks(&chunks(&diff(&a, &c_endpoints), 4 << 20)) else {
        return;
    };
    let mut g = c.benchmark_group("one_route_change_at_50k");
    g.sample_size(10);
    g.bench_function("independent", |bn| {
        bn.iter(|| {
            let deltas = chunks(&diff(black_box(&a), black_box(&b)), 4 << 20);
            black_box(a.apply_chunks(&deltas).map(|s| s.hash().len()))
        })
    });
    g.bench_function("shared", |bn| {
        bn.iter(|| {
            let deltas = chunks(&diff(black_box(&a), black_box(&b_shared)), 4 << 20);
            black_box(a.apply_chunks(&deltas).map(|s| s.hash().len()))
        })
    });
    g.bench_function("apply", |bn| {
        bn.iter(|| black_box(a.apply_chunks(black_box(&one)).map(|s| s.hash().len())))
    });
    g.bench_function("endpoints_only_shared", |bn| {
        bn.iter(|| {
            let deltas = chunks(&diff(black_box(&a), black_box(&c_shared)), 4 << 20);
            black_box(a.apply_chunks(&deltas).map(|s| s.hash().len()))
        })
    });
    g.bench_function("from_snapshot", |bn| {
        bn.iter_batched(
            || snapshot(2, Some(ROUTES / 2)),
            |s| black_box(SnapshotState::from_snapshot(s).map(|s| s.hash().len())),
            BatchSize::LargeInput,
        )
    });
    let whole = snapshot(2, Some(ROUTES / 2));
    g.bench_function("v1_content_hash", |bn| {
        bn.iter(|| black_box(sluice_proto::content_hash(black_box(&whole)).len()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
