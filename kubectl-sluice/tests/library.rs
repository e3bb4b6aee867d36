//! Library-level tests: `explain` picks the route the dataplane's router picks, and the
//! speed of `validate` on 10,000 routes (printed, never asserted).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::path::Path;
use std::time::Instant;

use http::HeaderMap;
use sluice_dataplane::config::redact::redacted;
use sluice_dataplane::config::table::RouteTable;
use sluice_dataplane::router::RequestInfo;
use sluice_dataplane::upstream::PoolRegistry;
use sluice_kubectl::explain::{Context, Request, explain};
use sluice_kubectl::offline::{Offline, compile_redacted, load_sources};
use sluice_kubectl::validate::validate;
use sluice_translate::Options;

/// Requests that reach every route of a snapshot: each host (wildcards filled in, plus no
/// host) × each path (prefixes extended) × a few methods and clients.
fn probes(snapshot: &sluice_proto::v1::Snapshot) -> Vec<(String, String, String, IpAddr)> {
    let mut out = Vec::new();
    for r in &snapshot.routes {
        let mut hosts: Vec<String> = r.hosts.iter().map(|h| h.replace('*', "x")).collect();
        hosts.push(String::new());
        for h in &hosts {
            for p in &r.paths {
                let path = match p.strip_suffix('*') {
                    Some(prefix) => format!("{prefix}deeper/x"),
                    None => p.clone(),
                };
                for m in ["GET", "POST", "DELETE"] {
                    for ip in ["192.0.2.1", "10.0.0.7"] {
                        out.push((h.clone(), path.clone(), m.to_owned(), ip.parse().unwrap()));
                    }
                }
            }
        }
    }
    out
}

/// This crate's shop fixture and the golden inputs of the translate crate (its harness's
/// layout, `sluice_translate::golden`), Gateway API cases aside.
fn fixture_sources() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = vec![root.join("tests/fixtures/shop.yaml").display().to_string()];
    let cases = sluice_translate::golden::cases(&root.join("../lib/translate/testdata")).unwrap();
    sources.extend(
        cases
            .iter()
            .filter(|c| c.family != sluice_translate::golden::GATEWAY_FAMILY)
            .map(|c| c.input.display().to_string()),
    );
    sources.sort();
    sources
}

/// `explain` agrees with the router of an independently compiled table on every probe of
/// every fixture (the router's own test table checks `Router::explain` against
/// `Router::lookup` case by case: see `dataplane/src/router/tests.rs`).
#[test]
fn explain_agrees_with_the_dataplane_router() {
    let sources = fixture_sources();
    let mut checked = 0;
    for source in &sources {
        let off = Offline::from_sources(std::slice::from_ref(source), &Options::default()).unwrap();
        let Ok(table) = &off.table else { continue };
        let snapshot = &off.translation.snapshot;
        let reference = RouteTable::compile(snapshot, &PoolRegistry::default()).unwrap();
        for (host, path, method, ip) in probes(snapshot) {
            let url = if host.is_empty() {
                path.clone()
            } else {
                format!("http://{host}{path}")
            };
            let req = Request::parse(&url, &method, &[], ip, None).unwrap();
            let got = explain(table, snapshot, &req, &Context::default())
                .matched
                .map(|m| m.id);
            let headers = HeaderMap::new();
            let info = RequestInfo {
                method: &req.method,
                host: (!host.is_empty()).then_some(host.as_str()),
                path: &path,
                query: None,
                headers: &headers,
                remote_addr: std::net::SocketAddr::new(ip, 50000),
                local_addr: "0.0.0.0:80".parse().unwrap(),
                scheme: "http",
            };
            let want = reference
                .router
                .lookup(&info)
                .map(|i| snapshot.routes[i].id.clone());
            assert_eq!(got, want, "{source}: {method} {url} from {ip}");
            checked += 1;
        }
    }
    assert!(checked > 500, "only {checked} probes");
}

/// 10,000 routes (1,000 ApisixRoutes × 10 rules, each with its Service and EndpointSlice):
/// load, translate, compile and validate. Prints the time; `cargo test` builds without
/// optimisation for the workspace crates, so a release build is faster.
#[test]
fn validate_10k_routes_speed() {
    let yaml = sluice_kubectl::synthetic::routes_yaml(1000, 10);
    let dir = std::env::temp_dir().join(format!("sluice-10k-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("routes.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let source = vec![file.display().to_string()];
    let opts = sluice_kubectl::offline::controller_options("apisix");

    let start = Instant::now();
    let loaded = load_sources(&source).unwrap();
    let loaded_at = start.elapsed();
    let off = Offline::build(loaded, &opts);
    let built_at = start.elapsed();
    let report = validate(&off, "apisix");
    let total = start.elapsed();
    std::fs::remove_dir_all(&dir).ok();

    assert_eq!(report.routes, 10_000);
    assert!(report.rejected.is_empty(), "{:?}", report.rejected.first());
    assert!(off.table.is_ok());
    println!(
        "validate 10,000 routes ({} KiB of YAML): load {:?}, translate+compile {:?}, \
         checks {:?}, total {:?} ({} warnings)",
        yaml.len() / 1024,
        loaded_at,
        built_at - loaded_at,
        total - built_at,
        total,
        report.warnings.len()
    );
}

/// `explain --admin` works on the snapshot a dataplane serves, which comes redacted (no
/// private keys, no credentials): compiled with `compile_redacted`, it gives the same
/// explanation as the full snapshot for every probe of every fixture, over http and over
/// https with the host as SNI (certificates chosen by the dataplane's SNI index over ids).
#[test]
fn explain_on_a_redacted_snapshot_agrees_with_the_full_one() {
    let sources = fixture_sources();
    let (mut checked, mut with_cert) = (0, 0);
    for source in &sources {
        let off = Offline::from_sources(std::slice::from_ref(source), &Options::default()).unwrap();
        let Ok(table) = &off.table else { continue };
        let full = &off.translation.snapshot;
        let shown = redacted(full);
        let redacted_table = compile_redacted(&shown)
            .unwrap_or_else(|e| panic!("{source}: the redacted snapshot does not compile: {e}"));
        let mut seen = std::collections::BTreeSet::new();
        let mut all = probes(full);
        // Every certificate's hosts, and one no certificate covers (the default's).
        let cert_hosts = full
            .tls_certificates
            .iter()
            .flat_map(|c| c.hosts.iter())
            .map(|h| h.replace('*', "sni"))
            .chain(["uncovered.example".to_owned()]);
        for h in cert_hosts {
            all.push((h, "/".into(), "GET".into(), "192.0.2.1".parse().unwrap()));
        }
        for (host, path, method, ip) in all {
            for scheme in ["http", "https"] {
                if host.is_empty() && scheme == "https" {
                    continue;
                }
                let url = if host.is_empty() {
                    path.clone()
                } else {
                    format!("{scheme}://{host}{path}")
                };
                if !seen.insert((url.clone(), method.clone(), ip)) {
                    continue;
                }
                let req = Request::parse(&url, &method, &[], ip, None).unwrap();
                let want = explain(table, full, &req, &Context::default());
                let got = explain(&redacted_table, &shown, &req, &Context::default());
                assert_eq!(got, want, "{source}: {method} {url} from {ip}");
                checked += 1;
                with_cert += usize::from(
                    want.certificate
                        .as_deref()
                        .is_some_and(|c| !c.starts_with("none")),
                );
            }
        }
    }
    println!("{checked} probes, {with_cert} with a certificate");
    assert!(checked > 500, "only {checked} probes");
    assert!(
        with_cert > 10,
        "only {with_cert} probes chose a certificate"
    );
}
