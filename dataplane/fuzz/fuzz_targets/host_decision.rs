//! The request-target / Host / `:authority` decision (`dataplane/src/http/host.rs`) and the
//! mTLS guard built on it (`dataplane/src/listener/mtls.rs`), issue 39.
//!
//! From the input: an HTTP version, a request target (origin form, or absolute form with a
//! scheme, sometimes userinfo, a host from a list of tricky spellings or the input, sometimes
//! a port) and zero to two `Host` headers.
//!
//! Properties:
//! - `effective_host` never panics and agrees with a reference written here from the
//!   documented rules (`host_oracle.rs` and the source choice below): same refusal, same host.
//! - A decided host is canonical: lower case, no port, no trailing dot, no empty label, and
//!   canonicalising it again changes nothing.
//! - The guard and the router decide on the same host: with routes and certificates for an
//!   mTLS host, an mTLS wildcard and a public host, a request the router sends to an mTLS
//!   host's route is refused by the guard over plain HTTP (403) and over a TLS connection
//!   made for the public host (421); a request the guard lets through on such a connection is
//!   routed to a public route or none.
#![no_main]

#[path = "host_oracle.rs"]
mod host_oracle;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use arbitrary::{Result, Unstructured};
use http::{HeaderMap, Request, Version};
use sluice_dataplane::config::certs::{ClientAuth, SniIndex};
use sluice_dataplane::http::host::{HostName, effective_host, request_host};
use sluice_dataplane::listener::mtls::{Conn, Verdict, verdict};
use sluice_dataplane::router::{RequestInfo, Router};
use sluice_proto::v1;

const HOSTS: &[&str] = &[
    "mtls.test",
    "MTLS.test",
    "mtls.test.",
    "mtls.test..",
    ".mtls.test",
    "mtls..test",
    "a.wild.test",
    "A.B.Wild.Test.",
    "wild.test",
    "public.test",
    "public.test.",
    "[::1]",
    "[0:0::1]",
    "[::1",
    "[]",
    "[::ffff:127.0.0.1]",
    "[v1.x]",
    "10.0.0.1",
    "",
    ".",
    "a@mtls.test",
    "public.test@mtls.test",
    "mtls.test%2f",
    "m%74ls.test",
    "mtls.test/x",
    "mtls.test:x",
];
const PORTS: &[&str] = &["", ":443", ":8443", ":", ":123456", ":0", "::1"];
const SCHEMES: &[&str] = &["http", "https", "HTTPS"];

struct Case {
    version: Version,
    target: String,
    hosts: Vec<Vec<u8>>,
}

fn host_text(u: &mut Unstructured<'_>) -> Result<String> {
    let mut h = if u.ratio(1, 5)? {
        let len = u.int_in_range(0..=12)?;
        String::from_utf8_lossy(u.bytes(len.min(u.len()))?).into_owned()
    } else {
        u.choose(HOSTS)?.to_string()
    };
    h.push_str(u.choose(PORTS)?);
    Ok(h)
}

fn case(u: &mut Unstructured<'_>) -> Result<Case> {
    let version = *u.choose(&[Version::HTTP_10, Version::HTTP_11, Version::HTTP_2])?;
    let path = *u.choose(&["/", "/private", "/public/x", "/public/../private"])?;
    let target = if u.ratio(1, 2)? {
        path.to_owned()
    } else {
        let userinfo = if u.ratio(1, 6)? { "u@" } else { "" };
        format!("{}://{userinfo}{}{path}", u.choose(SCHEMES)?, host_text(u)?)
    };
    let mut hosts = Vec::new();
    for _ in 0..u.int_in_range(0..=2)? {
        hosts.push(host_text(u)?.into_bytes());
    }
    Ok(Case {
        version,
        target,
        hosts,
    })
}

/// The host the documented rules choose: `Err` when the request is refused.
fn reference(req: &Request<()>) -> std::result::Result<Option<String>, ()> {
    let hosts: Vec<&[u8]> = req
        .headers()
        .get_all("host")
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    if hosts.len() > 1 {
        return Err(());
    }
    let host = hosts.first().copied();
    let authority = req.uri().authority().map(|a| a.as_str().as_bytes());
    let raw = if req.version() == Version::HTTP_2 {
        if let (Some(a), Some(h)) = (authority, host)
            && !a.eq_ignore_ascii_case(h)
        {
            return Err(());
        }
        authority.or(host)
    } else {
        match authority.or(host) {
            None if req.version() == Version::HTTP_11 => return Err(()),
            r => r,
        }
    };
    let Some(raw) = raw else { return Ok(None) };
    let raw = std::str::from_utf8(raw).map_err(|_| ())?;
    host_oracle::canonical(raw).map(Some).ok_or(())
}

/// Routes: `mtls` for `mtls.test`, `wild` for `*.wild.test`, `public` for `public.test` and
/// `[::1]`; certificates: `mtls.test` and `*.wild.test` require client certificates,
/// `public.test` does not.
struct World {
    router: Router,
    routes: Vec<v1::Route>,
    certs: SniIndex<Arc<(String, ClientAuth)>>,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let route = |id: &str, hosts: &[&str]| v1::Route {
            id: id.into(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            paths: vec!["/*".into()],
            ..Default::default()
        };
        let routes = vec![
            route("mtls", &["mtls.test"]),
            route("wild", &["*.wild.test"]),
            route("public", &["public.test", "[::1]"]),
        ];
        let cert = |id: &str, host: &str, mtls: bool| v1::TlsCertificate {
            id: id.into(),
            hosts: vec![host.into()],
            client_auth: mtls.then(v1::TlsClientAuth::default),
            ..Default::default()
        };
        let certs = SniIndex::build(
            &[
                cert("mtls", "mtls.test", true),
                cert("wild", "*.wild.test", true),
                cert("public", "public.test", false),
            ],
            None,
            "",
            |c| {
                let auth = match c.client_auth {
                    Some(_) => ClientAuth::Required,
                    None => ClientAuth::None,
                };
                Ok(Arc::new((c.id.clone(), auth)))
            },
        )
        .expect("valid certificates");
        World {
            router: Router::new(&routes).expect("valid routes"),
            routes,
            certs,
        }
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(case) = case(&mut u) else { return };
    let mut builder = Request::get(case.target.as_str()).version(case.version);
    for h in &case.hosts {
        builder = builder.header("host", h.as_slice());
    }
    let Ok(req) = builder.body(()) else { return };

    let decided = effective_host(&req);
    let expected = reference(&req);
    let got = decided
        .as_ref()
        .map(|h| h.as_ref().map(|h| h.as_str().to_owned()))
        .map_err(|_| ());
    assert_eq!(
        got, expected,
        "{:?} {} hosts {:?}",
        case.version, case.target, case.hosts
    );
    let Ok(host) = decided else { return };
    if let Some(h) = &host {
        let s = h.as_str();
        assert!(!s.bytes().any(|b| b.is_ascii_uppercase()), "{s:?}");
        assert!(!s.ends_with('.') && !s.is_empty(), "{s:?}");
        assert!(s.starts_with('[') || !s.contains(':'), "{s:?} has a port");
        let again = HostName::parse(s.as_bytes()).expect("canonical is valid");
        assert_eq!(again.as_str(), s, "not idempotent");
    }

    // The guard and the router on the same request.
    let w = world();
    let raw = request_host(&req).expect("decided above");
    let raw = raw.as_ref().and_then(|h| h.to_str().ok());
    let headers = HeaderMap::new();
    let addr: SocketAddr = "192.0.2.1:1".parse().expect("an address");
    let info = RequestInfo {
        method: req.method(),
        host: raw,
        path: req.uri().path(),
        query: None,
        headers: &headers,
        remote_addr: addr,
        local_addr: addr,
        scheme: "https",
    };
    let routed = w.router.lookup(&info).map(|i| w.routes[i].id.as_str());
    let name = host.as_ref().map(HostName::as_str);
    let covering = |h: &str| w.certs.covering(h).map(|e| (e.0.as_str(), &e.1));
    let plain = verdict(Ok(name), req.uri().path(), Conn::Plain, covering);
    let none = ClientAuth::None;
    let public = Conn::Tls {
        cert_id: "public",
        client_auth: &none,
        client_cert: false,
    };
    let over_public = verdict(Ok(name), req.uri().path(), public, covering);
    let to_mtls = matches!(routed, Some("mtls" | "wild"));
    assert_eq!(
        plain == Verdict::PlainHttp,
        to_mtls,
        "plain HTTP: guard {plain:?}, router {routed:?}, host {name:?}"
    );
    assert_eq!(
        over_public == Verdict::Misdirected,
        to_mtls,
        "TLS for public.test: guard {over_public:?}, router {routed:?}, host {name:?}"
    );
    // The router's host class is the canonical host's.
    let expected_route = name.and_then(|n| match n {
        "mtls.test" => Some("mtls"),
        "public.test" | "[::1]" => Some("public"),
        n if n.ends_with(".wild.test") => Some("wild"),
        _ => None,
    });
    assert_eq!(routed, expected_route, "host {name:?}");
});
