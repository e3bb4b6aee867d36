//! Compiling and swapping a 10k-route snapshot (the budget is 50 ms), measured on the same
//! path a reload takes: `Store::apply` = validate + compile router + upstreams + atomic swap.

use std::hint::black_box;

// NB: the allocator of the `sluice-dataplane` binary, so that the figures are the binary's
// (with glibc malloc, malloc/free were about 45% of compile-and-swap).
#[global_allocator]
static GLOBAL: sluice_io::allocator::Mimalloc = sluice_io::allocator::Mimalloc;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use sluice_dataplane::config::store::Store;
use sluice_proto::v1;

fn snapshot(routes: usize, version: u64) -> v1::Snapshot {
    let mut s = v1::Snapshot::default();
    for u in 0..100 {
        s.upstreams.push(v1::Upstream {
            id: format!("ns{u}/svc:80"),
            endpoints: (0..3)
                .map(|e| v1::Endpoint {
                    host: format!("10.{u}.0.{e}"),
                    port: 8080,
                    weight: 100,
                })
                .collect(),
            ..Default::default()
        });
    }
    for i in 0..routes {
        s.routes.push(v1::Route {
            id: format!("ns{}/route-{i}/r1", i % 100),
            hosts: vec![format!("host-{}.example.com", i % 500)],
            paths: vec![format!("/api/v{}/items/{i}*", i % 7), format!("/exact/{i}")],
            methods: if i % 3 == 0 {
                vec!["GET".into(), "POST".into()]
            } else {
                vec![]
            },
            priority: (i % 5) as i32,
            backends: vec![v1::Backend {
                upstream_id: format!("ns{}/svc:80", i % 100),
                weight: 100,
                plugins: Vec::new(),
            }],
            ..Default::default()
        });
    }
    sluice_proto::seal(s, version)
}

fn bench(c: &mut Criterion) {
    let store = Store::new().unwrap_or_else(|e| panic!("store: {e}"));
    let snaps = [snapshot(10_000, 1), snapshot(10_000, 2)];
    let mut i = 0usize;
    c.bench_function("compile_and_swap_10k_routes", |b| {
        // NB: the copy of the received snapshot is made outside the measurement: a reload
        // gets its snapshot decoded, not cloned.
        b.iter_batched(
            || {
                i += 1;
                snaps[i % 2].clone()
            },
            |s| black_box(store.apply(s, Vec::new()).is_ok()),
            BatchSize::PerIteration,
        )
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench
}
criterion_main!(benches);
