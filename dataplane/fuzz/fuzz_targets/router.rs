//! The router against a brute-force reference written here from its documented semantics
//! (`dataplane/src/router/mod.rs`, `expr.rs`, `host.rs`; request hosts as
//! `dataplane/src/http/host.rs` canonicalises them, `host_oracle.rs`).
//!
//! From the input: one request, then up to six routes aimed at it (exact and `*` prefix
//! paths, exact, wildcard and IPv6 hosts, methods, remote addresses, exprs with every scope
//! and operator; regexes from a list, of at most 24 bytes of the input, or a value of the
//! request escaped). Mostly well-formed, sometimes not.
//!
//! Properties:
//! - `Router::new` never panics; it refuses exactly the tables in which the reference finds
//!   an invalid route, and names the first such route.
//! - `lookup` is deterministic: the same answer twice, and from a second router built from
//!   the same routes (the indexes are hash maps).
//! - The route `lookup` returns is the reference's: of every (route, host, path) whose host
//!   and path match the request and whose methods, remote addresses and exprs all hold, the
//!   first in the order host class (exact, then wildcards by longest suffix, then routes
//!   without hosts), then path (exact, then prefixes by length, longest first), then higher
//!   `priority`, then route id, then position. `None` exactly when there is no such route.
#![no_main]

#[path = "host_oracle.rs"]
mod host_oracle;

use std::net::{IpAddr, SocketAddr};

use arbitrary::{Result, Unstructured};
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use regex::bytes::{Regex, RegexBuilder};
use sluice_dataplane::router::{RequestInfo, Router};
use sluice_proto::v1::{Expr, Route};

const MAX_ROUTES: usize = 6;
/// Longest regex tried, so that compiling one stays cheap.
const MAX_REGEX: usize = 24;
/// The router's size limit for one compiled regex (`expr.rs`).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok((routes, req)) = generate(&mut u) else {
        return;
    };
    let models: Vec<Option<Model>> = routes.iter().map(model).collect();
    let first_invalid = models.iter().position(Option::is_none);
    let router = match (Router::new(&routes), first_invalid) {
        (Ok(router), None) => router,
        (Err(e), Some(i)) => {
            assert_eq!(e.route_id, routes[i].id, "another route blamed: {e}");
            return;
        }
        (Ok(_), Some(i)) => panic!("invalid route {i} accepted: {:?}", routes[i]),
        (Err(e), None) => panic!("valid table refused: {e}"),
    };
    assert_eq!(router.len(), routes.len());
    let models: Vec<Model> = models.into_iter().flatten().collect();

    let headers: HeaderMap = req.headers.iter().cloned().collect();
    let info = RequestInfo {
        method: &req.method,
        host: req.host.as_deref(),
        path: &req.path,
        query: req.query.as_deref(),
        headers: &headers,
        remote_addr: req.remote,
        local_addr: req.local,
        scheme: req.scheme,
    };
    let found = router.lookup(&info);
    assert_eq!(router.lookup(&info), found, "lookup is not deterministic");
    let again = Router::new(&routes).expect("valid the first time");
    assert_eq!(again.lookup(&info), found, "another router, another route");

    let expected = reference_lookup(&routes, &models, &req);
    assert_eq!(found, expected, "routes {routes:#?}\nrequest {req:#?}");
});

// ---- generation -------------------------------------------------------------------------------

const IDS: &[&str] = &["a", "b", "ns/r/1", "ns/r/2", "B"];
const LABELS: &[&str] = &["a", "b", "api", "www", "x-1", "_s", "A", "Api", "10"];
const TLDS: &[&str] = &["com", "org", "COM"];
const ODD_HOSTS: &[&str] = &[
    "::1",
    "[::1]",
    "2001:db8::1",
    "[2001:DB8:0::1]",
    "10.0.0.1",
    "",
    "*",
    "*.",
    "*.*.a",
    "a.*.com",
    "*a.com",
    "a..com",
    "a.com:80",
    "a b.com",
    "[::1",
    "é.com",
];
const SEGMENTS: &[&str] = &["", "a", "b", "api", "v1", "x", "A", "%2F", "..", "é"];
const ODD_PATHS: &[&str] = &["x", "", "/a*b", "/a**", "/a b", "/a?b=1", "/#", "/\t"];
const METHODS: &[&str] = &[
    "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "CONNECT", "TRACE",
];
const ODD_METHODS: &[&str] = &["get", "PURGE", "FETCH"];
/// Remote addresses with the network the router makes of each (`None`: invalid).
const NETS: &[(&str, Option<(&str, u8)>)] = &[
    ("10.0.0.0/8", Some(("10.0.0.0", 8))),
    ("10.1.2.3/8", Some(("10.0.0.0", 8))),
    (" 192.0.2.10 ", Some(("192.0.2.10", 32))),
    ("192.0.2.7", Some(("192.0.2.7", 32))),
    ("0.0.0.0/0", Some(("0.0.0.0", 0))),
    ("2001:db8::/32", Some(("2001:db8::", 32))),
    ("::1", Some(("::1", 128))),
    ("::/0", Some(("::", 0))),
    ("::ffff:10.0.0.0/104", Some(("::ffff:10.0.0.0", 104))),
    ("10.0.0.0/33", None),
    ("10.0.0", None),
    ("10.0.0.1/", None),
    ("host.example.com", None),
    ("fe80::/129", None),
];
const REMOTES: &[&str] = &[
    "192.0.2.10:50000",
    "10.1.2.3:1",
    "[::ffff:10.1.2.3]:1",
    "[2001:db8::5]:1",
    "[::1]:2",
    "198.51.100.2:4242",
];
const LOCALS: &[&str] = &["10.0.0.1:9080", "[::1]:443"];
const HEADER_NAMES: &[&str] = &["x-v", "X-V", "cookie", "host", "Host", "x-forwarded-proto"];
const EXPR_HEADERS: &[&str] = &["x-v", "X-V", "host", "cookie", "x_v"];
const ARGS: &[&str] = &["a", "b", "a b", "%61", "a+b"];
const COOKIES: &[&str] = &["s", "S", "a", "a b"];
/// Names that are invalid in some scope.
const ODD_NAMES: &[&str] = &[
    "",
    "bad header",
    "http_",
    "arg_",
    "cookie_",
    "HTTP_x_v",
    "no_such_var",
    "x v",
];
const VARIABLES: &[&str] = &[
    "remote_addr",
    "remote_port",
    "server_addr",
    "server_port",
    "host",
    "uri",
    "request_uri",
    "request_method",
    "scheme",
    "query_string",
    "args",
    "http_x_v",
    "http_host",
    "http_cookie",
    "arg_a",
    "arg_a_b",
    "cookie_s",
];
const VALUES: &[&str] = &[
    "", "1", "10", "0x0A", " 5 ", "1e3", "-2.5", ".5", "1.", "+1", "--1", "0x", "inf", "nan", "a",
    "A", "a b", "/a", "/a/b", "prod", "GET", "http", "10.1.2.3", "50000", "a.com", "x=1", "\u{b}5",
];
const REGEXES: &[&str] = &[
    "^/a",
    "a+",
    "(?i)x",
    "^v[0-9]+$",
    ".*",
    "",
    "^$",
    "(unclosed",
    "a(?=b)",
    "[",
    "\\d{1,3}",
    "(?:a{100}){100}",
    "(?:a{1000}){1000}",
    "\\bx\\b",
    "(?-u:\\xff)",
    "^[a-z]+\\.com$",
];
const QUERIES: &[&str] = &[
    "a=1",
    "a=1&b=2&a=3",
    "b&a",
    "a",
    "a=",
    "a%20b=1",
    "a+b=x",
    "%61=1",
    "a=%zz%4",
    "a=a+b%2Fc",
    "&&a=1&",
    "s=1",
    "",
];
const HEADER_VALUES: &[&str] = &[
    "1",
    "10",
    "a",
    "prod",
    "a.com:8080",
    "A.COM",
    "s=1; a=2",
    " s = x ;S=y",
    "a=",
    "s",
    "",
    "x\tv",
];

/// The request first, then routes aimed at it: their hosts, paths and expr values are often
/// the request's, so that lookups get past the index into the tie-breaking rules.
fn generate(u: &mut Unstructured<'_>) -> Result<(Vec<Route>, Req)> {
    let req = request(u)?;
    let n = u.int_in_range(0..=MAX_ROUTES)?;
    let routes = (0..n).map(|_| route(u, &req)).collect::<Result<Vec<_>>>()?;
    Ok((routes, req))
}

/// True once in `n` times. NB: false once the input is used up (`Unstructured::ratio` is
/// true then), so that short inputs make well-formed routes.
fn rare(u: &mut Unstructured<'_>, n: u8) -> Result<bool> {
    Ok(!u.ratio(n - 1, n)?)
}

/// Up to `max` bytes of the input as text.
fn short_text(u: &mut Unstructured<'_>, max: usize) -> Result<String> {
    let len = u.int_in_range(0..=max)?.min(u.len());
    Ok(String::from_utf8_lossy(u.bytes(len)?).into_owned())
}

/// Mostly a word of `vocab`, sometimes a few bytes of the input.
fn word(u: &mut Unstructured<'_>, vocab: &[&str], max: usize) -> Result<String> {
    if rare(u, 16)? {
        short_text(u, max)
    } else {
        Ok(u.choose(vocab)?.to_string())
    }
}

/// One to three labels, mixed case.
fn dns_host(u: &mut Unstructured<'_>) -> Result<String> {
    let mut host = String::new();
    for _ in 0..u.int_in_range(0..=2)? {
        host.push_str(u.choose(LABELS)?);
        host.push('.');
    }
    host.push_str(u.choose(TLDS)?);
    Ok(host)
}

/// A `match.hosts[]` entry, often the request's host or a wildcard of it.
fn route_host(u: &mut Unstructured<'_>, req: &Req) -> Result<String> {
    let host = normal_host(req.host.as_deref());
    Ok(match u.int_in_range(0..=31)? {
        0..=9 if host.is_some() => {
            let host = host.unwrap_or_default();
            // The host itself or a wildcard of one of its suffixes.
            let dots: Vec<usize> = host.match_indices('.').map(|(i, _)| i).collect();
            match u.choose(&dots) {
                Ok(&i) if u.ratio(1, 2)? => format!("*{}", &host[i..]),
                _ => host,
            }
        }
        0..=19 => dns_host(u)?,
        20..=29 => format!("*.{}", dns_host(u)?),
        30 => u.choose(ODD_HOSTS)?.to_string(),
        _ => short_text(u, 12)?,
    })
}

/// One to three segments.
fn path(u: &mut Unstructured<'_>) -> Result<String> {
    let mut p = String::new();
    for _ in 0..u.int_in_range(1..=3)? {
        p.push('/');
        p.push_str(u.choose(SEGMENTS)?);
    }
    Ok(p)
}

/// A `match.paths[]` entry, often the request's path or a prefix of it.
fn route_path(u: &mut Unstructured<'_>, req: &Req) -> Result<String> {
    Ok(match u.int_in_range(0..=31)? {
        0..=5 => req.path.clone(),
        6..=10 => {
            // A prefix of the request's path.
            let ends: Vec<usize> = req
                .path
                .char_indices()
                .map(|(i, c)| i + c.len_utf8())
                .collect();
            let end = u.choose(&ends).copied().unwrap_or(0);
            format!("{}*", &req.path[..end])
        }
        11..=14 => path(u)?,
        15..=29 => path(u)? + "*",
        30 => u.choose(ODD_PATHS)?.to_string(),
        _ => short_text(u, 8)?,
    })
}

fn route(u: &mut Unstructured<'_>, req: &Req) -> Result<Route> {
    let mut r = Route {
        id: if rare(u, 64)? {
            String::new()
        } else {
            u.choose(IDS)?.to_string()
        },
        priority: match u.int_in_range(0u8..=7)? {
            0 => i32::MIN,
            1 => i32::MAX,
            n => i32::from(n) - 4,
        },
        ..Route::default()
    };
    for _ in 0..u.int_in_range(0..=2)? {
        r.hosts.push(route_host(u, req)?);
    }
    // Rarely none, which is invalid.
    let paths = if rare(u, 64)? {
        0
    } else {
        u.int_in_range(1..=3)?
    };
    for _ in 0..paths {
        r.paths.push(route_path(u, req)?);
    }
    if u.ratio(1, 3)? {
        for _ in 0..u.int_in_range(1..=3)? {
            let m = match u.int_in_range(0..=15)? {
                0..=5 => req.method.as_str(),
                15 => u.choose(ODD_METHODS)?,
                _ => u.choose(METHODS)?,
            };
            r.methods.push(m.to_string());
        }
    }
    if u.ratio(1, 4)? {
        for _ in 0..u.int_in_range(1..=2)? {
            r.remote_addrs.push(u.choose(NETS)?.0.to_string());
        }
    }
    for _ in 0..*u.choose(&[0, 0, 1, 1, 2, 3])? {
        r.exprs.push(expr(u, req)?);
    }
    Ok(r)
}

/// A `match.exprs[]` entry, its value or set often what the request has there.
fn expr(u: &mut Unstructured<'_>, req: &Req) -> Result<Expr> {
    let scope = if rare(u, 32)? {
        *u.choose(&[0, 6, 99])?
    } else {
        u.int_in_range(1..=5)?
    };
    let op = if rare(u, 32)? {
        *u.choose(&[0, 13, 99])?
    } else {
        u.int_in_range(1..=12)?
    };
    let name = match scope {
        _ if rare(u, 32)? => u.choose(ODD_NAMES)?.to_string(),
        1 => word(u, EXPR_HEADERS, 8)?,
        2 => word(u, ARGS, 4)?,
        3 => word(u, COOKIES, 4)?,
        4 => String::new(),
        5 => word(u, VARIABLES, 12)?,
        _ => "a".to_string(),
    };
    // What the request has there, if anything.
    let subject = match scope {
        1 => header_subject(&name),
        2 => Some(Subject::Arg(name.as_bytes().to_vec())),
        3 => Some(Subject::Cookie(name.as_bytes().to_vec())),
        4 => Some(Subject::Path),
        5 => variable(&name),
        _ => None,
    };
    let actual = subject
        .and_then(|s| subject_value(&s, req, normal_host(req.host.as_deref()).as_deref()))
        .and_then(|v| String::from_utf8(v).ok());
    let pick = |u: &mut Unstructured<'_>| -> Result<String> {
        match &actual {
            Some(a) if u.ratio(1, 2)? => Ok(a.clone()),
            _ => word(u, VALUES, 8),
        }
    };
    let regex_op = (7..=10).contains(&op);
    let set_op = op == 11 || op == 12;
    let value = if regex_op {
        match &actual {
            Some(a) if u.ratio(1, 3)? => regex::escape(a),
            _ => word(u, REGEXES, MAX_REGEX)?,
        }
    } else if set_op && !rare(u, 16)? {
        String::new()
    } else {
        pick(u)?
    };
    let mut set = Vec::new();
    // Rarely a set where none belongs, or none where one does: both invalid.
    if set_op != rare(u, 16)? {
        let n = if rare(u, 16)? {
            0
        } else {
            u.int_in_range(1..=3)?
        };
        for _ in 0..n {
            set.push(pick(u)?);
        }
    }
    Ok(Expr {
        scope,
        name,
        op,
        value,
        set,
    })
}

/// A request, with its headers in order (the reference reads them from this list, the router
/// from a `HeaderMap` built from it).
#[derive(Debug)]
struct Req {
    method: Method,
    host: Option<String>,
    path: String,
    query: Option<String>,
    headers: Vec<(HeaderName, HeaderValue)>,
    remote: SocketAddr,
    local: SocketAddr,
    scheme: &'static str,
}

fn request(u: &mut Unstructured<'_>) -> Result<Req> {
    let method = if rare(u, 8)? {
        u.choose(ODD_METHODS)?
    } else {
        u.choose(METHODS)?
    };
    let method = Method::from_bytes(method.as_bytes()).expect("a method token");
    let host = match u.int_in_range(0..=9)? {
        0 => None,
        1..=6 => {
            let mut h = dns_host(u)?;
            if u.ratio(1, 2)? {
                h.make_ascii_lowercase();
            }
            Some(h + u.choose(&["", "", ":80", ":", ":x", ":8080:1"])?)
        }
        7 => {
            let h = u.choose(ODD_HOSTS)?.to_string();
            Some(h + u.choose(&["", ":443", "]:1"])?)
        }
        8 => Some(format!(
            "{}.{}",
            "a".repeat(u.int_in_range(240..=260)?),
            "com"
        )),
        _ => Some(short_text(u, 16)?),
    };
    let path = if rare(u, 16)? {
        short_text(u, 16)?
    } else {
        path(u)? + u.choose(&["", "", "/", "/x/y"])?
    };
    let query = match u.int_in_range(0..=3)? {
        0 => None,
        1 => Some(word(u, QUERIES, 12)?),
        2 => {
            let a = u.choose(QUERIES)?;
            let b = u.choose(QUERIES)?;
            Some(format!("{a}&{b}"))
        }
        _ => {
            let (name, value) = (u.choose(ARGS)?, u.choose(VALUES)?);
            Some(format!("{name}={value}&{}", u.choose(QUERIES)?))
        }
    };
    let mut headers = Vec::new();
    for _ in 0..u.int_in_range(0..=4)? {
        let name = HeaderName::from_bytes(u.choose(HEADER_NAMES)?.as_bytes()).expect("a name");
        let value = match u.int_in_range(0..=7)? {
            0..=3 => u.choose(HEADER_VALUES)?.as_bytes().to_vec(),
            4..=6 => u.choose(VALUES)?.as_bytes().to_vec(),
            _ => {
                let len = u.int_in_range(0..=8)?.min(u.len());
                u.bytes(len)?.to_vec()
            }
        };
        if let Ok(value) = HeaderValue::from_bytes(&value) {
            headers.push((name, value));
        }
    }
    let addr = |s: &str| s.parse::<SocketAddr>().expect("an address");
    Ok(Req {
        method,
        host,
        path,
        query,
        headers,
        remote: addr(u.choose(REMOTES)?),
        local: addr(u.choose(LOCALS)?),
        scheme: u.choose(&["http", "https"])?,
    })
}

// ---- the reference ----------------------------------------------------------------------------

/// A route as the reference understands it.
struct Model {
    hosts: Vec<HostPat>,
    paths: Vec<PathPat>,
    methods: Vec<String>,
    nets: Vec<(IpAddr, u8)>,
    exprs: Vec<ExprModel>,
}

enum HostPat {
    /// Lower-case name; IPv6 literals in canonical form, in brackets.
    Exact(String),
    /// Lower-case suffix with its leading dot.
    Wildcard(String),
}

enum PathPat {
    Exact(String),
    Prefix(String),
}

struct ExprModel {
    subject: Subject,
    op: Op,
}

enum Subject {
    /// A lower-case header name other than `host`.
    Header(String),
    RawHost,
    Arg(Vec<u8>),
    Cookie(Vec<u8>),
    Path,
    RequestUri,
    Host,
    RemoteAddr,
    RemotePort,
    ServerAddr,
    ServerPort,
    Method,
    Scheme,
    QueryString,
}

enum Op {
    Equal(Vec<u8>, bool),
    /// `>`, `>=`, `<`, `<=` as 3 to 6, as in the proto.
    Compare(i32, Option<f64>),
    Regex(Regex, bool),
    In(Vec<Vec<u8>>, bool),
}

/// The route as the reference reads it; `None` when it is invalid.
fn model(r: &Route) -> Option<Model> {
    if r.id.is_empty() || r.paths.is_empty() {
        return None;
    }
    let paths = r
        .paths
        .iter()
        .map(|p| {
            let ok = p.starts_with('/')
                && !p.bytes().any(|b| b.is_ascii_control() || b == b' ')
                && !p.contains(['?', '#']);
            match p.find('*') {
                _ if !ok => None,
                None => Some(PathPat::Exact(p.clone())),
                Some(i) if i == p.len() - 1 => Some(PathPat::Prefix(p[..i].to_string())),
                Some(_) => None,
            }
        })
        .collect::<Option<Vec<_>>>()?;
    let hosts = r
        .hosts
        .iter()
        .map(|h| host_pattern(h))
        .collect::<Option<Vec<_>>>()?;
    if !r.methods.iter().all(|m| METHODS.contains(&m.as_str())) {
        return None;
    }
    let nets = r
        .remote_addrs
        .iter()
        .map(|a| {
            let (_, net) = NETS.iter().find(|(s, _)| s == a)?;
            let (ip, len) = (*net)?;
            Some((ip.parse().ok()?, len))
        })
        .collect::<Option<Vec<_>>>()?;
    let exprs = r.exprs.iter().map(expr_model).collect::<Option<Vec<_>>>()?;
    Some(Model {
        hosts,
        paths,
        methods: r.methods.clone(),
        nets,
        exprs,
    })
}

/// Letters, digits, `-` and `_` in non-empty labels between dots, at most 255 bytes.
fn is_dns_name(s: &str) -> bool {
    s.len() <= host_oracle::MAX_HOST_LEN
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

fn host_pattern(h: &str) -> Option<HostPat> {
    if let Some(suffix) = h.strip_prefix("*.") {
        return is_dns_name(suffix)
            .then(|| HostPat::Wildcard(format!(".{}", suffix.to_ascii_lowercase())));
    }
    if h.contains('*') || h.is_empty() {
        return None;
    }
    let inner = h
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(h);
    if inner.contains(':') {
        let ip: std::net::Ipv6Addr = inner.parse().ok()?;
        return Some(HostPat::Exact(format!("[{ip}]")));
    }
    is_dns_name(h).then(|| HostPat::Exact(h.to_ascii_lowercase()))
}

/// RFC 9110 token characters.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn header_subject(name: &str) -> Option<Subject> {
    if !is_token(name) {
        return None;
    }
    let name = name.to_ascii_lowercase();
    Some(if name == "host" {
        Subject::RawHost
    } else {
        Subject::Header(name)
    })
}

fn expr_model(e: &Expr) -> Option<ExprModel> {
    if !(1..=5).contains(&e.scope) || !(1..=12).contains(&e.op) {
        return None;
    }
    if e.scope != 4 && e.name.is_empty() {
        return None;
    }
    let subject = match e.scope {
        1 => header_subject(&e.name)?,
        2 => Subject::Arg(e.name.as_bytes().to_vec()),
        3 => Subject::Cookie(e.name.as_bytes().to_vec()),
        4 => Subject::Path,
        _ => variable(&e.name)?,
    };
    let set_op = e.op == 11 || e.op == 12;
    if set_op != !e.set.is_empty() || (set_op && !e.value.is_empty()) {
        return None;
    }
    let value = e.value.as_bytes().to_vec();
    let op = match e.op {
        1 => Op::Equal(value, false),
        2 => Op::Equal(value, true),
        3..=6 => Op::Compare(e.op, lua_tonumber(&value)),
        7..=10 => {
            let re = RegexBuilder::new(&e.value)
                .case_insensitive(e.op >= 9)
                .size_limit(REGEX_SIZE_LIMIT)
                .build()
                .ok()?;
            Op::Regex(re, e.op == 8 || e.op == 10)
        }
        _ => Op::In(
            e.set.iter().map(|s| s.as_bytes().to_vec()).collect(),
            e.op == 12,
        ),
    };
    Some(ExprModel { subject, op })
}

fn variable(name: &str) -> Option<Subject> {
    let prefixed = |p: &str| name.strip_prefix(p).filter(|rest| !rest.is_empty());
    if let Some(h) = prefixed("http_") {
        return header_subject(&h.replace('_', "-"));
    }
    if let Some(a) = prefixed("arg_") {
        return Some(Subject::Arg(a.as_bytes().to_vec()));
    }
    if let Some(c) = prefixed("cookie_") {
        return Some(Subject::Cookie(c.as_bytes().to_vec()));
    }
    Some(match name {
        "remote_addr" => Subject::RemoteAddr,
        "remote_port" => Subject::RemotePort,
        "server_addr" => Subject::ServerAddr,
        "server_port" => Subject::ServerPort,
        "host" => Subject::Host,
        "uri" => Subject::Path,
        "request_uri" => Subject::RequestUri,
        "request_method" => Subject::Method,
        "scheme" => Subject::Scheme,
        "query_string" | "args" => Subject::QueryString,
        _ => return None,
    })
}

/// Lua's `tonumber` as `expr.rs` documents it: optional sign, then `0x` and hex digits, or
/// decimal digits with an optional fraction and exponent; surrounding whitespace allowed.
fn lua_tonumber(raw: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(raw).ok()?.trim_ascii();
    let (negative, body) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let magnitude = if let Some(hex) = body.strip_prefix("0x").or(body.strip_prefix("0X")) {
        if hex.is_empty() {
            return None;
        }
        hex.chars()
            .try_fold(0f64, |acc, c| Some(acc * 16.0 + f64::from(c.to_digit(16)?)))?
    } else {
        let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
        let int = digits(body);
        let mut rest = &body[int..];
        let mut frac = "";
        if let Some(r) = rest.strip_prefix('.') {
            frac = &r[..digits(r)];
            rest = &r[frac.len()..];
        }
        if int == 0 && frac.is_empty() {
            return None;
        }
        let mut exp = "0";
        if let Some(r) = rest.strip_prefix(['e', 'E']) {
            let sign = usize::from(r.starts_with(['+', '-']));
            let n = digits(&r[sign..]);
            if n == 0 {
                return None;
            }
            exp = &r[..sign + n];
            rest = &r[sign + n..];
        }
        if !rest.is_empty() {
            return None;
        }
        let int = if int == 0 { "0" } else { &body[..int] };
        let frac = if frac.is_empty() { "0" } else { frac };
        format!("{int}.{frac}e{exp}").parse().ok()?
    };
    Some(if negative { -magnitude } else { magnitude })
}

/// The request host as routes see it: its canonical form (`host_oracle`); `None` when
/// absent or refused (then only routes without hosts match).
fn normal_host(raw: Option<&str>) -> Option<String> {
    host_oracle::canonical(raw?)
}

fn net_contains((net, len): (IpAddr, u8), ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// Percent-decoding with `+` as a space; a malformed escape stays as it is.
fn form_decode(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = |b: Option<&u8>| b.and_then(|&b| (b as char).to_digit(16));
        match raw[i] {
            b'+' => out.push(b' '),
            b'%' => match (hex(raw.get(i + 1)), hex(raw.get(i + 2))) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    out
}

fn subject_value(s: &Subject, req: &Req, host: Option<&str>) -> Option<Vec<u8>> {
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, v)| v.as_bytes().to_vec())
    };
    match s {
        Subject::Header(name) => header(name),
        Subject::RawHost => req
            .host
            .as_ref()
            .map(|h| h.as_bytes().to_vec())
            .or_else(|| header("host")),
        Subject::Arg(name) => req.query.as_ref().and_then(|q| {
            q.as_bytes().split(|&b| b == b'&').find_map(|pair| {
                let (key, value) = match pair.iter().position(|&b| b == b'=') {
                    Some(i) => (&pair[..i], &pair[i + 1..]),
                    None => (pair, &[][..]),
                };
                (form_decode(key) == *name).then(|| form_decode(value))
            })
        }),
        Subject::Cookie(name) => req
            .headers
            .iter()
            .filter(|(n, _)| n == http::header::COOKIE)
            .flat_map(|(_, v)| v.as_bytes().split(|&b| b == b';'))
            .find_map(|pair| {
                let i = pair.iter().position(|&b| b == b'=')?;
                (pair[..i].trim_ascii() == name.as_slice())
                    .then(|| pair[i + 1..].trim_ascii().to_vec())
            }),
        Subject::Path => Some(req.path.as_bytes().to_vec()),
        Subject::RequestUri => Some(match &req.query {
            Some(q) => format!("{}?{q}", req.path).into_bytes(),
            None => req.path.as_bytes().to_vec(),
        }),
        Subject::Host => host.map(|h| h.as_bytes().to_vec()),
        Subject::RemoteAddr => Some(req.remote.ip().to_canonical().to_string().into_bytes()),
        Subject::RemotePort => Some(req.remote.port().to_string().into_bytes()),
        Subject::ServerAddr => Some(req.local.ip().to_canonical().to_string().into_bytes()),
        Subject::ServerPort => Some(req.local.port().to_string().into_bytes()),
        Subject::Method => Some(req.method.as_str().as_bytes().to_vec()),
        Subject::Scheme => Some(req.scheme.as_bytes().to_vec()),
        Subject::QueryString => req.query.as_ref().map(|q| q.as_bytes().to_vec()),
    }
}

/// lua-resty-expr: a missing subject satisfies only the negative operators.
fn expr_holds(e: &ExprModel, req: &Req, host: Option<&str>) -> bool {
    let Some(v) = subject_value(&e.subject, req, host) else {
        return match &e.op {
            Op::Equal(_, negate) | Op::Regex(_, negate) | Op::In(_, negate) => *negate,
            Op::Compare(..) => false,
        };
    };
    match &e.op {
        Op::Equal(want, negate) => (v == *want) != *negate,
        Op::Compare(op, want) => match (lua_tonumber(&v), want) {
            (Some(l), Some(r)) => match op {
                3 => l > *r,
                4 => l >= *r,
                5 => l < *r,
                _ => l <= *r,
            },
            _ => false,
        },
        Op::Regex(re, negate) => re.is_match(&v) != *negate,
        Op::In(set, negate) => set.contains(&v) != *negate,
    }
}

fn route_conditions_hold(m: &Model, req: &Req, host: Option<&str>) -> bool {
    (m.methods.is_empty() || m.methods.iter().any(|x| x == req.method.as_str()))
        && (m.nets.is_empty()
            || m.nets
                .iter()
                .any(|&n| net_contains(n, req.remote.ip().to_canonical())))
        && m.exprs.iter().all(|e| expr_holds(e, req, host))
}

/// The winning route, by brute force over every (route, host, path).
fn reference_lookup(routes: &[Route], models: &[Model], req: &Req) -> Option<usize> {
    let host = normal_host(req.host.as_deref());
    let mut best = None;
    for (i, (r, m)) in routes.iter().zip(models).enumerate() {
        if !route_conditions_hold(m, req, host.as_deref()) {
            continue;
        }
        // Host class: 0 exact, 1 wildcard (longer suffix first), 2 without hosts.
        let mut classes: Vec<(u8, usize)> = Vec::new();
        if m.hosts.is_empty() {
            classes.push((2, 0));
        }
        if let Some(h) = &host {
            for p in &m.hosts {
                match p {
                    HostPat::Exact(name) if name == h => classes.push((0, 0)),
                    HostPat::Wildcard(s) if h.len() > s.len() && h.ends_with(s.as_str()) => {
                        classes.push((1, usize::MAX - s.len()))
                    }
                    _ => {}
                }
            }
        }
        // Path: 0 exact, 1 prefix (longer first).
        let paths: Vec<(u8, usize)> = m
            .paths
            .iter()
            .filter_map(|p| match p {
                PathPat::Exact(e) => (*e == req.path).then_some((0, 0)),
                PathPat::Prefix(pre) => req
                    .path
                    .starts_with(pre.as_str())
                    .then_some((1, usize::MAX - pre.len())),
            })
            .collect();
        for &c in &classes {
            for &p in &paths {
                let key = (c, p, std::cmp::Reverse(r.priority), r.id.as_str(), i);
                if best.as_ref().is_none_or(|b| key < *b) {
                    best = Some(key);
                }
            }
        }
    }
    best.map(|(.., i)| i)
}
