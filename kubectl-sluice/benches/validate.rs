//! Speed of `kubectl sluice validate` on 10,000 routes (1,000 ApisixRoutes of 10 rules with
//! their Services and EndpointSlices, 2.7 MiB of YAML; [`sluice_kubectl::synthetic`]), by
//! stage: reading and parsing the YAML, translating and compiling the snapshot with the
//! controller's and the dataplane's code, the checks and warnings, and all of it.
//!
//! `cargo bench -p sluice-kubectl --bench validate`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_kubectl::offline::{Offline, controller_options};
use sluice_kubectl::synthetic::routes_yaml;
use sluice_kubectl::validate::validate;
use sluice_translate::files::Loaded;

fn load(yaml: &str) -> Loaded {
    let mut loaded = Loaded::default();
    loaded.load_text("routes.yaml", yaml).expect("YAML");
    loaded
}

fn bench(c: &mut Criterion) {
    let yaml = routes_yaml(1000, 10);
    let opts = controller_options("apisix");
    let mut g = c.benchmark_group("validate_10k_routes");
    g.sample_size(10);
    g.bench_function("parse_yaml", |b| b.iter(|| load(&yaml)));
    g.bench_function("translate_and_compile", |b| {
        b.iter_batched(
            || load(&yaml),
            |loaded| Offline::build(loaded, &opts),
            criterion::BatchSize::LargeInput,
        )
    });
    let built = Offline::build(load(&yaml), &opts);
    assert_eq!(validate(&built, "apisix").routes, 10_000);
    g.bench_function("checks", |b| b.iter(|| validate(&built, "apisix")));
    g.bench_function("whole", |b| {
        b.iter(|| validate(&Offline::build(load(&yaml), &opts), "apisix"))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
