//! The mTLS skip rule (`skip_mtls_uri_regex`, `dataplane/src/listener/mtls.rs`), issue 39:
//! a path skips the client certificate only where routing sees it under the skipped prefix.
//!
//! From the input: a path (after a leading `/`).
//!
//! Properties, with `skip_mtls_uri_regex: ^/public/` and routes `/public/*` ("public") and
//! `/*` ("private"):
//! - `skip_allows` never panics.
//! - A path that skips is valid (the normaliser accepts it), its normalised form (what the
//!   router matches) is routed to "public", and it has no segment an upstream could read as
//!   a dot segment (`..;`) and no backslash.
//! - The verdict is the same for the path as forwarded upstream (normalised, encoded again).
#![no_main]

use std::net::SocketAddr;
use std::sync::OnceLock;

use http::{HeaderMap, Method};
use regex::RegexSet;
use sluice_dataplane::http::path::normalize;
use sluice_dataplane::listener::mtls::skip_allows;
use sluice_dataplane::router::{RequestInfo, Router};
use sluice_proto::v1;

fn world() -> &'static (RegexSet, Router) {
    static WORLD: OnceLock<(RegexSet, Router)> = OnceLock::new();
    WORLD.get_or_init(|| {
        let route = |id: &str, path: &str| v1::Route {
            id: id.into(),
            paths: vec![path.into()],
            ..Default::default()
        };
        let routes = [route("public", "/public/*"), route("private", "/*")];
        (
            RegexSet::new(["^/public/"]).expect("a regex"),
            Router::new(&routes).expect("valid routes"),
        )
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let path = format!("/{raw}");
    let (skip, router) = world();
    let allowed = skip_allows(skip, &path);
    let Ok(normal) = normalize(&path) else {
        assert!(!allowed, "{path:?}: an invalid path skips");
        return;
    };
    let (decoded, encoded) = match normal {
        None => (path.clone(), path.clone()),
        Some(n) => (n.decoded, n.encoded),
    };
    assert_eq!(
        skip_allows(skip, &encoded),
        allowed,
        "{path:?} and its forwarded form {encoded:?} disagree"
    );
    if !allowed {
        return;
    }
    let headers = HeaderMap::new();
    let addr: SocketAddr = "192.0.2.1:1".parse().expect("an address");
    let info = RequestInfo {
        method: &Method::GET,
        host: None,
        path: &decoded,
        query: None,
        headers: &headers,
        remote_addr: addr,
        local_addr: addr,
        scheme: "https",
    };
    assert_eq!(
        router.lookup(&info),
        Some(0),
        "{path:?} skips but routes as {decoded:?}"
    );
    assert!(!decoded.contains('\\'), "{path:?}");
    assert!(
        !decoded
            .split('/')
            .any(|s| matches!(s.split(';').next(), Some("." | ".."))),
        "{path:?} -> {decoded:?}"
    );
});
