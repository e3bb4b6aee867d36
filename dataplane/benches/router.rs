//! Router lookup and compile cost at 1, 1k, 10k and 50k routes.
//!
//! The tables mix what a real cluster has: 70% routes on exact hosts (four routes per host),
//! 15% on wildcard hosts, 15% host-less; half exact paths, half prefixes; some with methods
//! and a header expr. `lookup_hit/N` asks for one route deep in an N-route table;
//! `lookup_hit/1` asks for the same kind of route alone in a table, so the ratio
//! `lookup_hit/10000 / lookup_hit/1` is the cost of scale (budget: 1.2x).
//!
//! Run: `cargo bench -p sluice-dataplane --bench router -- --quick`

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::net::SocketAddr;

// NB: the allocator of the `sluice-dataplane` binary, so that the figures are the binary's
// (with glibc malloc, malloc/free were about 45% of compile-and-swap).
#[global_allocator]
static GLOBAL: sluice_io::allocator::Mimalloc = sluice_io::allocator::Mimalloc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use http::{HeaderMap, Method};
use sluice_dataplane::router::{RequestInfo, Router};
use sluice_proto::v1::{Backend, Expr, ExprOp, ExprScope, Route};

const SIZES: [usize; 4] = [1, 1_000, 10_000, 50_000];

/// Route number `i` of a generated table.
fn route(i: usize) -> Route {
    let ns = i % 20;
    let mut r = Route {
        id: format!("ns{ns}/app{i}/rule1"),
        priority: (i % 3) as i32,
        backends: vec![Backend {
            upstream_id: format!("ns{ns}/svc{i}:80"),
            weight: 100,
            plugins: Vec::new(),
        }],
        ..Route::default()
    };
    match ns {
        0..=13 => r.hosts.push(format!("app{}.ns{ns}.example.com", i / 4)),
        14..=16 => r.hosts.push(format!("*.tenant{}.example.net", i % 500)),
        _ => {}
    }
    r.paths.push(if i.is_multiple_of(2) {
        format!("/api/v1/items/{i}")
    } else {
        format!("/svc{i}/*")
    });
    if i.is_multiple_of(7) {
        r.methods = vec!["GET".into(), "POST".into()];
    }
    if i % 20 == 3 {
        r.exprs.push(Expr {
            scope: ExprScope::Header as i32,
            name: "x-canary".into(),
            op: ExprOp::Equal as i32,
            value: "1".into(),
            set: vec![],
        });
    }
    r
}

/// The target of `lookup_hit` in an `n`-route table: the last route that is on an exact
/// host with a prefix path and no methods/exprs (i % 20 == 5).
fn target(n: usize) -> usize {
    let t = (n.saturating_sub(1) / 20) * 20 + 5;
    if t < n { t } else { t.saturating_sub(20) }
}

fn table(n: usize) -> (Vec<Route>, usize) {
    if n == 1 {
        // One route of the same kind as the deep target of the 10k table.
        return (vec![route(target(10_000))], target(10_000));
    }
    ((0..n).map(route).collect(), target(n))
}

struct Req {
    method: Method,
    host: String,
    path: String,
    query: Option<String>,
    headers: HeaderMap,
    remote: SocketAddr,
    local: SocketAddr,
}

impl Req {
    fn info(&self) -> RequestInfo<'_> {
        RequestInfo {
            method: &self.method,
            host: Some(&self.host),
            path: &self.path,
            query: self.query.as_deref(),
            headers: &self.headers,
            remote_addr: self.remote,
            local_addr: self.local,
            scheme: "http",
        }
    }
}

fn request(host: String, path: String) -> Req {
    let mut headers = HeaderMap::new();
    headers.insert("user-agent", "bench/1.0".parse().unwrap());
    headers.insert("accept", "*/*".parse().unwrap());
    Req {
        method: Method::GET,
        host,
        path,
        query: Some("page=2".into()),
        headers,
        remote: "192.0.2.10:50000".parse().unwrap(),
        local: "10.0.0.1:9080".parse().unwrap(),
    }
}

/// A request served by route `i` (an exact-host prefix route).
fn hit(i: usize) -> Req {
    request(
        format!("app{}.ns{}.example.com:9080", i / 4, i % 20),
        format!("/svc{i}/orders/42"),
    )
}

fn miss() -> Req {
    request("unknown.example.org".into(), "/nothing/here".into())
}

fn lookups(c: &mut Criterion) {
    let mut hits = c.benchmark_group("lookup_hit");
    for n in SIZES {
        let (routes, t) = table(n);
        let router = Router::new(&routes).unwrap();
        let req = hit(t);
        let want = routes.iter().position(|r| r.id == route(t).id);
        assert_eq!(
            router.lookup(&req.info()),
            want,
            "hit request must hit route {t}"
        );
        hits.bench_with_input(BenchmarkId::from_parameter(n), &req, |b, req| {
            b.iter(|| router.lookup(black_box(&req.info())))
        });
    }
    hits.finish();

    let mut misses = c.benchmark_group("lookup_miss");
    for n in SIZES {
        let (routes, _) = table(n);
        let router = Router::new(&routes).unwrap();
        let req = miss();
        assert_eq!(router.lookup(&req.info()), None);
        misses.bench_with_input(BenchmarkId::from_parameter(n), &req, |b, req| {
            b.iter(|| router.lookup(black_box(&req.info())))
        });
    }
    misses.finish();

    // A wildcard-host hit walks the exact-host miss and the suffix lookups first.
    let mut wild = c.benchmark_group("lookup_wildcard_hit");
    {
        let n = 10_000;
        let (routes, _) = table(n);
        let router = Router::new(&routes).unwrap();
        let i = n - 5; // i % 20 == 15: wildcard host, prefix path
        let req = request(
            format!("a.b.tenant{}.example.net", i % 500),
            format!("/svc{i}/x"),
        );
        let found = router.lookup(&req.info()).map(|k| routes[k].id.clone());
        assert_eq!(
            found,
            Some(route(i).id),
            "wildcard request must hit route {i}"
        );
        wild.bench_with_input(BenchmarkId::from_parameter(n), &req, |b, req| {
            b.iter(|| router.lookup(black_box(&req.info())))
        });
    }
    wild.finish();
}

fn compile(c: &mut Criterion) {
    let (routes, _) = table(10_000);
    let mut g = c.benchmark_group("compile");
    g.sample_size(10);
    g.bench_function("10000", |b| {
        b.iter(|| Router::new(black_box(&routes)).unwrap())
    });
    g.finish();
}

criterion_group!(benches, lookups, compile);
criterion_main!(benches);
