//! Per-request helpers of the scenario-1 proxy path (issue 2): hop-by-hop header removal on
//! a typical request and response, and the upstream request head encoding.
//!
//! Whole-path figures (instructions and system calls per request) come from
//! `bench/profile.sh`; these isolate the functions it pointed at.
//!
//! Run: `cargo bench -p sluice-dataplane --bench hotpath -- --quick`

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue, Method};
use sluice_io::h1::{Framing, encode_request_head};
use sluice_io::headers::ProxyHeaders;
use sluice_io::headers::strip_hop_by_hop;

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        h.append(*n, HeaderValue::from_static(v));
    }
    h
}

/// What wrk sends.
fn request() -> HeaderMap {
    headers(&[("host", "127.0.0.1:9080")])
}

/// What the nginx origin answers.
fn response() -> HeaderMap {
    headers(&[
        ("server", "nginx/1.22.1"),
        ("date", "Sun, 29 Nov 2026 23:59:59 GMT"),
        ("content-type", "text/plain"),
        ("content-length", "12"),
        ("connection", "keep-alive"),
    ])
}

fn bench(c: &mut Criterion) {
    let req = request();
    let resp = response();
    let browser = headers(&[
        ("host", "example.com"),
        ("user-agent", "Mozilla/5.0 (X11; Linux x86_64)"),
        ("accept", "text/html,application/xhtml+xml"),
        ("accept-language", "en-US,en;q=0.5"),
        ("accept-encoding", "gzip, deflate, br"),
        ("cookie", "session=abc"),
        ("upgrade-insecure-requests", "1"),
    ]);
    let mut g = c.benchmark_group("strip_hop_by_hop");
    for (name, h) in [
        ("request", &req),
        ("response", &resp),
        ("browser", &browser),
    ] {
        g.bench_function(name, |b| {
            b.iter_batched_ref(
                || h.clone(),
                |h| strip_hop_by_hop(black_box(h)),
                criterion::BatchSize::SmallInput,
            )
        });
    }
    g.finish();

    let proxy = ProxyHeaders {
        client_ip: b"127.0.0.1",
        proto: "http",
        host: Some(b"127.0.0.1:9080"),
    };
    let mut out = Vec::with_capacity(512);
    c.bench_function("encode_request_head", |b| {
        b.iter(|| {
            out.clear();
            encode_request_head(
                &mut out,
                &Method::GET,
                "/hello",
                black_box(&req),
                Framing::Empty,
                Some(proxy),
            );
            black_box(out.len())
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
