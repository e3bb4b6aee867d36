//! Router behaviour as a client observes it: which route serves which request.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use sluice_proto::v1::{Expr, ExprOp, ExprScope, Route};

use super::*;

// ---- fixtures -------------------------------------------------------------------------------

/// Route builder: `route("id").host("a.com").path("/x*")`.
#[derive(Clone)]
struct R(Route);

fn route(id: &str) -> R {
    R(Route {
        id: id.into(),
        ..Route::default()
    })
}

impl R {
    fn host(mut self, h: &str) -> Self {
        self.0.hosts.push(h.into());
        self
    }
    fn path(mut self, p: &str) -> Self {
        self.0.paths.push(p.into());
        self
    }
    fn priority(mut self, p: i32) -> Self {
        self.0.priority = p;
        self
    }
    fn method(mut self, m: &str) -> Self {
        self.0.methods.push(m.into());
        self
    }
    fn remote(mut self, a: &str) -> Self {
        self.0.remote_addrs.push(a.into());
        self
    }
    fn expr(mut self, scope: ExprScope, name: &str, op: ExprOp, value: &str) -> Self {
        self.0.exprs.push(Expr {
            scope: scope as i32,
            name: name.into(),
            op: op as i32,
            value: value.into(),
            set: vec![],
        });
        self
    }
    fn expr_set(mut self, scope: ExprScope, name: &str, op: ExprOp, set: &[&str]) -> Self {
        self.0.exprs.push(Expr {
            scope: scope as i32,
            name: name.into(),
            op: op as i32,
            value: String::new(),
            set: set.iter().map(|s| s.to_string()).collect(),
        });
        self
    }
}

/// Request builder; defaults: `GET http://<no host>/`, client 192.0.2.10:50000, server
/// 10.0.0.1:9080.
#[derive(Clone)]
struct Req {
    method: Method,
    host: Option<String>,
    path: String,
    query: Option<String>,
    headers: HeaderMap,
    remote: SocketAddr,
    local: SocketAddr,
    scheme: &'static str,
}

fn req(path_and_query: &str) -> Req {
    let (path, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p.to_string(), Some(q.to_string())),
        None => (path_and_query.to_string(), None),
    };
    Req {
        method: Method::GET,
        host: None,
        path,
        query,
        headers: HeaderMap::new(),
        remote: "192.0.2.10:50000".parse().unwrap(),
        local: "10.0.0.1:9080".parse().unwrap(),
        scheme: "http",
    }
}

impl Req {
    fn host(mut self, h: &str) -> Self {
        self.host = Some(h.into());
        self
    }
    fn method(mut self, m: &str) -> Self {
        self.method = Method::from_bytes(m.as_bytes()).unwrap();
        self
    }
    fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
        self
    }
    fn from(mut self, addr: &str) -> Self {
        self.remote = addr.parse().unwrap();
        self
    }
    fn https(mut self) -> Self {
        self.scheme = "https";
        self
    }
}

/// Routing table under test.
struct Table {
    routes: Vec<Route>,
    router: Router,
}

fn table(routes: &[R]) -> Table {
    let routes: Vec<Route> = routes.iter().map(|r| r.0.clone()).collect();
    let router = Router::new(&routes).unwrap_or_else(|e| panic!("valid table rejected: {e}"));
    Table { routes, router }
}

impl Table {
    /// Id of the route that serves `r`, or `None` (404).
    fn get(&self, r: &Req) -> Option<&str> {
        let info = RequestInfo {
            method: &r.method,
            host: r.host.as_deref(),
            path: &r.path,
            query: r.query.as_deref(),
            headers: &r.headers,
            remote_addr: r.remote,
            local_addr: r.local,
            scheme: r.scheme,
        };
        let found = self.router.lookup(&info);
        // Every case of this table also checks that `explain` (what `kubectl sluice
        // explain` shows) agrees with `lookup`: its last candidate is the winner, and only
        // the last one matched.
        let explained = self.router.explain(&info);
        let winner = explained
            .last()
            .filter(|c| c.mismatch.is_none())
            .map(|c| c.route);
        assert_eq!(
            winner, found,
            "explain disagrees with lookup: {explained:?}"
        );
        assert!(
            explained.iter().rev().skip(1).all(|c| c.mismatch.is_some()),
            "a candidate before the last matched: {explained:?}"
        );
        found.map(|i| self.routes[i].id.as_str())
    }
}

fn invalid(r: R) -> InvalidRoute {
    match Router::new(&[route("ok/r/a").path("/ok").0, r.0]) {
        Ok(_) => panic!("invalid route accepted"),
        Err(e) => e,
    }
}

use ExprOp as O;
use ExprScope as S;

// ---- hosts ----------------------------------------------------------------------------------

#[test]
fn exact_host_is_case_insensitive_and_ignores_the_port() {
    let t = table(&[route("h").host("API.example.com").path("/")]);
    assert_eq!(t.get(&req("/").host("api.example.com")), Some("h"));
    assert_eq!(t.get(&req("/").host("Api.Example.Com:8080")), Some("h"));
    assert_eq!(t.get(&req("/").host("api.example.org")), None);
    assert_eq!(
        t.get(&req("/")),
        None,
        "a route with hosts needs a Host header"
    );
}

/// The canonical host of `crate::http::host` (issue 39): one trailing dot is the same host,
/// as the mTLS guard sees it; a host it refuses matches only host-less routes.
#[test]
fn exact_host_ignores_one_trailing_dot_and_refused_hosts_match_no_host() {
    let t = table(&[
        route("h").host("api.example.com").path("/"),
        route("w").host("*.example.com").path("/"),
        route("any").path("/"),
    ]);
    assert_eq!(t.get(&req("/").host("api.example.com.")), Some("h"));
    assert_eq!(t.get(&req("/").host("API.example.com.:443")), Some("h"));
    assert_eq!(t.get(&req("/").host("a.b.example.com.")), Some("w"));
    for refused in [
        "api.example.com..",
        "api..example.com",
        "a@api.example.com",
        "api.example.com:x",
        "",
    ] {
        assert_eq!(t.get(&req("/").host(refused)), Some("any"), "{refused:?}");
    }
}

#[test]
fn ipv6_literal_hosts() {
    let t = table(&[
        route("v6").host("[2001:db8::1]").path("/"),
        route("bare").host("::1").path("/"),
    ]);
    assert_eq!(t.get(&req("/").host("[2001:db8::1]:9080")), Some("v6"));
    assert_eq!(t.get(&req("/").host("[2001:DB8::1]")), Some("v6"));
    assert_eq!(t.get(&req("/").host("[::1]:80")), Some("bare"));
    assert_eq!(t.get(&req("/").host("[::2]:80")), None);
    // Written another way, the same address.
    assert_eq!(t.get(&req("/").host("[2001:db8:0:0::1]")), Some("v6"));
    assert_eq!(t.get(&req("/").host("[0:0::1]:80")), Some("bare"));
}

#[test]
fn wildcard_matches_any_depth_but_not_the_bare_suffix() {
    let t = table(&[route("w").host("*.example.com").path("/")]);
    assert_eq!(t.get(&req("/").host("a.example.com")), Some("w"));
    assert_eq!(t.get(&req("/").host("a.b.c.EXAMPLE.com:443")), Some("w"));
    assert_eq!(t.get(&req("/").host("example.com")), None);
    assert_eq!(t.get(&req("/").host(".example.com")), None);
    assert_eq!(t.get(&req("/").host("aexample.com")), None);
    assert_eq!(t.get(&req("/").host("a.example.com.evil")), None);
}

#[test]
fn exact_host_beats_wildcard_beats_hostless() {
    let t = table(&[
        route("any").path("/*").priority(100),
        route("wild").host("*.example.com").path("/*").priority(50),
        route("exact").host("api.example.com").path("/*"),
    ]);
    assert_eq!(t.get(&req("/x").host("api.example.com")), Some("exact"));
    assert_eq!(t.get(&req("/x").host("www.example.com")), Some("wild"));
    assert_eq!(t.get(&req("/x").host("other.org")), Some("any"));
    assert_eq!(t.get(&req("/x")), Some("any"));
}

#[test]
fn host_class_beats_path_specificity() {
    // An exact-host prefix route wins over a host-less exact path (APISIX radixtree_host_uri).
    let t = table(&[
        route("any").path("/a/b/c"),
        route("exact").host("a.com").path("/*"),
    ]);
    assert_eq!(t.get(&req("/a/b/c").host("a.com")), Some("exact"));
    assert_eq!(t.get(&req("/a/b/c").host("b.com")), Some("any"));
}

#[test]
fn longer_wildcard_suffix_wins() {
    let t = table(&[
        route("short").host("*.com").path("/"),
        route("long").host("*.api.example.com").path("/"),
        route("mid").host("*.example.com").path("/"),
    ]);
    assert_eq!(t.get(&req("/").host("x.api.example.com")), Some("long"));
    assert_eq!(t.get(&req("/").host("api.example.com")), Some("mid"));
    assert_eq!(t.get(&req("/").host("x.other.com")), Some("short"));
}

#[test]
fn falls_through_host_classes_when_the_rest_does_not_match() {
    let t = table(&[
        route("exact").host("a.example.com").path("/api"),
        route("wild-long")
            .host("*.a.example.com")
            .path("/api")
            .method("POST"),
        route("wild").host("*.example.com").path("/api*"),
        route("any").path("/*"),
    ]);
    // Exact host class has no route for /api/x; the wildcard class has.
    assert_eq!(t.get(&req("/api/x").host("a.example.com")), Some("wild"));
    assert_eq!(t.get(&req("/api").host("a.example.com")), Some("exact"));
    // Longer wildcard needs POST; a GET falls to the shorter wildcard.
    assert_eq!(t.get(&req("/api").host("b.a.example.com")), Some("wild"));
    assert_eq!(
        t.get(&req("/api").host("b.a.example.com").method("POST")),
        Some("wild-long")
    );
    // Nothing host-specific matches /other: the host-less route does.
    assert_eq!(t.get(&req("/other").host("a.example.com")), Some("any"));
}

#[test]
fn route_with_several_hosts_and_paths() {
    let t = table(&[route("multi")
        .host("a.com")
        .host("*.b.com")
        .path("/x")
        .path("/y*")]);
    assert_eq!(t.get(&req("/x").host("a.com")), Some("multi"));
    assert_eq!(t.get(&req("/y/1").host("c.b.com")), Some("multi"));
    assert_eq!(t.get(&req("/z").host("a.com")), None);
    assert_eq!(t.get(&req("/x").host("c.com")), None);
}

// ---- paths ----------------------------------------------------------------------------------

#[test]
fn exact_path_matches_only_itself() {
    let t = table(&[route("e").path("/foo")]);
    assert_eq!(t.get(&req("/foo")), Some("e"));
    assert_eq!(
        t.get(&req("/foo?x=1")),
        Some("e"),
        "the query string is not part of the path"
    );
    assert_eq!(t.get(&req("/foo/")), None);
    assert_eq!(t.get(&req("/foobar")), None);
    assert_eq!(t.get(&req("/fo")), None);
}

#[test]
fn prefix_path_matches_itself_and_anything_longer() {
    let t = table(&[route("p").path("/foo*")]);
    for hit in ["/foo", "/foobar", "/foo/x/y"] {
        assert_eq!(t.get(&req(hit)), Some("p"), "{hit}");
    }
    assert_eq!(t.get(&req("/fo")), None);
    assert_eq!(t.get(&req("/bar/foo")), None);
}

#[test]
fn exact_beats_prefix_regardless_of_priority() {
    let t = table(&[
        route("prefix").path("/foo*").priority(1000),
        route("exact").path("/foo"),
    ]);
    assert_eq!(t.get(&req("/foo")), Some("exact"));
    assert_eq!(t.get(&req("/foo/1")), Some("prefix"));
}

#[test]
fn longer_prefix_beats_shorter_regardless_of_priority() {
    let t = table(&[
        route("root").path("/*").priority(10),
        route("api").path("/api/*").priority(5),
        route("v1").path("/api/v1/*"),
    ]);
    assert_eq!(t.get(&req("/api/v1/users")), Some("v1"));
    assert_eq!(t.get(&req("/api/v2/users")), Some("api"));
    assert_eq!(t.get(&req("/web")), Some("root"));
    assert_eq!(
        t.get(&req("/api")),
        Some("root"),
        "`/api/*` needs the slash"
    );
}

#[test]
fn priority_breaks_ties_then_route_id() {
    let t = table(&[
        route("b").path("/x"),
        route("c").path("/x").priority(1),
        route("a").path("/x"),
    ]);
    assert_eq!(t.get(&req("/x")), Some("c"));
    let t = table(&[route("b").path("/x*"), route("a").path("/x*")]);
    assert_eq!(
        t.get(&req("/x")),
        Some("a"),
        "equal priority: lowest route id"
    );
    let t = table(&[
        route("z").path("/x").priority(-1),
        route("y").path("/x").priority(-2),
    ]);
    assert_eq!(
        t.get(&req("/x")),
        Some("z"),
        "negative priorities order too"
    );
}

#[test]
fn falls_through_paths_when_methods_do_not_match() {
    let t = table(&[
        route("exact-post").path("/api/items").method("POST"),
        route("long-put")
            .path("/api/*")
            .method("PUT")
            .method("PATCH"),
        route("short").path("/*"),
    ]);
    assert_eq!(t.get(&req("/api/items").method("POST")), Some("exact-post"));
    assert_eq!(t.get(&req("/api/items").method("PATCH")), Some("long-put"));
    assert_eq!(t.get(&req("/api/items")), Some("short"));
    assert_eq!(
        t.get(&req("/api/items").method("PURGE")),
        Some("short"),
        "extension method"
    );
}

#[test]
fn falls_through_priorities_when_exprs_do_not_match() {
    let t = table(&[
        route("canary")
            .path("/*")
            .priority(10)
            .expr(S::Header, "x-canary", O::Equal, "1"),
        route("stable").path("/*"),
    ]);
    assert_eq!(t.get(&req("/").header("X-Canary", "1")), Some("canary"));
    assert_eq!(t.get(&req("/").header("X-Canary", "0")), Some("stable"));
    assert_eq!(t.get(&req("/")), Some("stable"));
}

#[test]
fn no_route_no_match() {
    let t = table(&[]);
    assert!(t.router.is_empty());
    assert_eq!(t.get(&req("/")), None);
}

// ---- methods and remote addresses -------------------------------------------------------------

#[test]
fn methods_restrict_the_route() {
    let t = table(&[route("m").path("/").method("GET").method("HEAD")]);
    assert_eq!(t.get(&req("/")), Some("m"));
    assert_eq!(t.get(&req("/").method("HEAD")), Some("m"));
    assert_eq!(t.get(&req("/").method("POST")), None);
}

#[test]
fn remote_addrs_v4_and_v6_cidrs() {
    let t = table(&[route("r")
        .path("/")
        .remote("10.0.0.0/8")
        .remote("192.0.2.7")
        .remote("2001:db8::/32")]);
    assert_eq!(t.get(&req("/").from("10.20.30.40:1")), Some("r"));
    assert_eq!(t.get(&req("/").from("192.0.2.7:1")), Some("r"));
    assert_eq!(t.get(&req("/").from("192.0.2.8:1")), None);
    assert_eq!(t.get(&req("/").from("11.0.0.1:1")), None);
    assert_eq!(t.get(&req("/").from("[2001:db8:1::5]:1")), Some("r"));
    assert_eq!(t.get(&req("/").from("[2001:db9::5]:1")), None);
    // An IPv4 client seen through a dual-stack socket.
    assert_eq!(t.get(&req("/").from("[::ffff:10.1.2.3]:1")), Some("r"));
}

// ---- exprs: scopes ----------------------------------------------------------------------------

#[test]
fn header_scope_name_is_case_insensitive() {
    let t = table(&[route("h")
        .path("/")
        .expr(S::Header, "X-Env", O::Equal, "prod")]);
    assert_eq!(t.get(&req("/").header("x-env", "prod")), Some("h"));
    assert_eq!(
        t.get(&req("/").header("X-ENV", "Prod")),
        None,
        "values are case-sensitive"
    );
    // First value of a repeated header.
    assert_eq!(
        t.get(&req("/").header("x-env", "prod").header("x-env", "dev")),
        Some("h")
    );
    assert_eq!(
        t.get(&req("/").header("x-env", "dev").header("x-env", "prod")),
        None
    );
}

#[test]
fn query_scope_uses_first_decoded_value() {
    let t = table(&[route("q")
        .path("/")
        .expr(S::Query, "name", O::Equal, "a b/c")]);
    assert_eq!(t.get(&req("/?name=a%20b%2Fc")), Some("q"));
    assert_eq!(t.get(&req("/?x=1&name=a+b%2fc&name=zzz")), Some("q"));
    assert_eq!(t.get(&req("/?name=zzz&name=a%20b%2Fc")), None);
    assert_eq!(t.get(&req("/?names=a%20b%2Fc")), None);
    assert_eq!(t.get(&req("/")), None);
}

#[test]
fn cookie_scope_reads_the_cookie_header() {
    let t = table(&[route("c")
        .path("/")
        .expr(S::Cookie, "session", O::Equal, "abc")]);
    assert_eq!(
        t.get(&req("/").header("cookie", "theme=dark; session=abc")),
        Some("c")
    );
    assert_eq!(
        t.get(
            &req("/")
                .header("cookie", "a=1")
                .header("cookie", "session=abc")
        ),
        Some("c")
    );
    assert_eq!(
        t.get(&req("/").header("cookie", "Session=abc")),
        None,
        "names are case-sensitive"
    );
    assert_eq!(t.get(&req("/").header("x-session", "abc")), None);
}

#[test]
fn path_scope_ignores_name_and_query() {
    let t = table(&[route("p")
        .path("/*")
        .expr(S::Path, "", O::RegexMatch, "^/v[0-9]+/")]);
    assert_eq!(t.get(&req("/v2/users?a=/v1/")), Some("p"));
    assert_eq!(t.get(&req("/users?a=/v1/")), None);
}

#[test]
fn variable_scope_connection_variables() {
    let r = |var: &str, value: &str| {
        route(var)
            .path("/*")
            .expr(S::Variable, var, O::Equal, value)
    };
    let t = |var: &str, value: &str| table(&[r(var, value)]);
    let base = req("/a/b?x=1&y=%20")
        .host("WWW.Example.com:8443")
        .from("[::ffff:198.51.100.2]:4242");

    assert_eq!(
        t("remote_addr", "198.51.100.2").get(&base),
        Some("remote_addr")
    );
    assert_eq!(t("remote_addr", "198.51.100.3").get(&base), None);
    assert_eq!(t("remote_port", "4242").get(&base), Some("remote_port"));
    assert_eq!(t("server_addr", "10.0.0.1").get(&base), Some("server_addr"));
    assert_eq!(t("server_port", "9080").get(&base), Some("server_port"));
    assert_eq!(t("host", "www.example.com").get(&base), Some("host"));
    assert_eq!(t("uri", "/a/b").get(&base), Some("uri"));
    assert_eq!(
        t("request_uri", "/a/b?x=1&y=%20").get(&base),
        Some("request_uri")
    );
    assert_eq!(
        t("request_uri", "/a/b").get(&req("/a/b")),
        Some("request_uri")
    );
    assert_eq!(
        t("request_method", "POST").get(&base.clone().method("POST")),
        Some("request_method")
    );
    assert_eq!(t("request_method", "POST").get(&base), None);
    assert_eq!(
        t("scheme", "https").get(&base.clone().https()),
        Some("scheme")
    );
    assert_eq!(t("scheme", "https").get(&base), None);
    assert_eq!(
        t("query_string", "x=1&y=%20").get(&base),
        Some("query_string")
    );
    assert_eq!(t("args", "x=1&y=%20").get(&base), Some("args"));
}

#[test]
fn variable_scope_prefixed_variables() {
    let r = |var: &str, value: &str| route(var).path("/").expr(S::Variable, var, O::Equal, value);
    let t = |var: &str, value: &str| table(&[r(var, value)]);
    let base = req("/?user_id=7")
        .header("X-Forwarded-Proto", "https")
        .header("cookie", "lang=en");

    assert_eq!(
        t("http_x_forwarded_proto", "https").get(&base),
        Some("http_x_forwarded_proto")
    );
    assert_eq!(t("arg_user_id", "7").get(&base), Some("arg_user_id"));
    assert_eq!(t("cookie_lang", "en").get(&base), Some("cookie_lang"));
    assert_eq!(t("cookie_lang", "fr").get(&base), None);
    // The raw Host header, port included, also for HTTP/2 where only :authority exists.
    assert_eq!(
        t("http_host", "a.com:8080").get(&req("/").host("a.com:8080")),
        Some("http_host")
    );
}

// ---- exprs: operators -------------------------------------------------------------------------

/// One route with one Header `x-v` expr; `get(value)` says whether a request with that
/// header value (or without the header, `None`) is routed to it.
fn header_op(op: ExprOp, value: &str) -> impl Fn(Option<&str>) -> bool {
    let t = table(&[route("r").path("/").expr(S::Header, "x-v", op, value)]);
    move |v| {
        let r = match v {
            Some(v) => req("/").header("x-v", v),
            None => req("/"),
        };
        t.get(&r) == Some("r")
    }
}

fn header_set_op(op: ExprOp, set: &[&str]) -> impl Fn(Option<&str>) -> bool {
    let t = table(&[route("r").path("/").expr_set(S::Header, "x-v", op, set)]);
    move |v| {
        let r = match v {
            Some(v) => req("/").header("x-v", v),
            None => req("/"),
        };
        t.get(&r) == Some("r")
    }
}

#[test]
fn op_equal_and_not_equal() {
    let eq = header_op(O::Equal, "a");
    assert!(eq(Some("a")));
    assert!(!eq(Some("A")));
    assert!(!eq(None), "missing subject: Equal is false");
    let ne = header_op(O::NotEqual, "a");
    assert!(!ne(Some("a")));
    assert!(ne(Some("b")));
    assert!(ne(None), "missing subject: NotEqual is true (nil ~= value)");
}

#[test]
fn op_numeric_comparisons() {
    let gt = header_op(O::GreaterThan, "10");
    assert!(gt(Some("11")));
    assert!(gt(Some("10.5")));
    assert!(!gt(Some("10")));
    assert!(!gt(Some("9")), "numeric, not lexicographic");
    assert!(gt(Some("100")), "numeric, not lexicographic");
    assert!(!gt(Some("abc")), "non-numeric subject");
    assert!(!gt(None), "missing subject");

    let ge = header_op(O::GreaterThanEqual, "10");
    assert!(ge(Some("10")) && ge(Some("11")) && !ge(Some("9.99")) && !ge(None));
    let lt = header_op(O::LessThan, "10");
    assert!(lt(Some("9")) && lt(Some("-1")) && !lt(Some("10")) && !lt(Some("x")) && !lt(None));
    let le = header_op(O::LessThanEqual, "10");
    assert!(le(Some("10")) && le(Some("0x0A")) && !le(Some("11")) && !le(None));

    let not_a_number = header_op(O::LessThan, "ten");
    assert!(!not_a_number(Some("1")), "non-numeric value never matches");
}

#[test]
fn op_regex_is_a_search() {
    let m = header_op(O::RegexMatch, "b+c");
    assert!(m(Some("abbbcd")), "unanchored search, like PCRE ~~");
    assert!(!m(Some("ABC")));
    assert!(!m(Some("ac")));
    assert!(!m(None), "missing subject: RegexMatch is false");

    let anchored = header_op(O::RegexMatch, "^v[0-9]+$");
    assert!(anchored(Some("v12")) && !anchored(Some("xv12")));

    let not = header_op(O::RegexNotMatch, "b+c");
    assert!(!not(Some("abc")));
    assert!(not(Some("ABC")));
    assert!(not(None), "missing subject: RegexNotMatch is true");
}

#[test]
fn op_regex_case_insensitive() {
    let m = header_op(O::RegexMatchCaseInsensitive, "^mobile");
    assert!(m(Some("MOBILE Safari")));
    assert!(m(Some("mobile")));
    assert!(!m(Some("desktop")));
    assert!(!m(None));

    let not = header_op(O::RegexNotMatchCaseInsensitive, "^mobile");
    assert!(!not(Some("Mobile")));
    assert!(not(Some("desktop")));
    assert!(
        not(None),
        "missing subject: RegexNotMatchCaseInsensitive is true"
    );
}

#[test]
fn op_in_and_not_in() {
    let is_in = header_set_op(O::In, &["a", "b"]);
    assert!(is_in(Some("a")) && is_in(Some("b")));
    assert!(!is_in(Some("c")) && !is_in(Some("A")));
    assert!(!is_in(None), "missing subject: In is false");

    let not_in = header_set_op(O::NotIn, &["a", "b"]);
    assert!(!not_in(Some("a")));
    assert!(not_in(Some("c")));
    assert!(not_in(None), "missing subject: NotIn is true");
}

#[test]
fn missing_subjects_in_other_scopes() {
    let t = table(&[
        route("q").path("/q").expr(S::Query, "a", O::NotEqual, "1"),
        route("c").path("/c").expr(S::Cookie, "a", O::Equal, ""),
        route("v")
            .path("/v")
            .expr(S::Variable, "query_string", O::RegexNotMatch, "x"),
        route("h")
            .path("/h")
            .expr(S::Variable, "host", O::In, "")
            .expr_set_fix(),
    ]);
    assert_eq!(
        t.get(&req("/q")),
        Some("q"),
        "no query at all: NotEqual holds"
    );
    assert_eq!(t.get(&req("/q?a=1")), None);
    assert_eq!(
        t.get(&req("/c").header("cookie", "b=")),
        None,
        "missing cookie is not empty"
    );
    assert_eq!(t.get(&req("/c").header("cookie", "a=")), Some("c"));
    assert_eq!(t.get(&req("/v")), Some("v"), "no `?`: query_string missing");
    assert_eq!(t.get(&req("/v?x")), None);
    assert_eq!(
        t.get(&req("/h")),
        None,
        "no Host: host missing, In is false"
    );
    assert_eq!(t.get(&req("/h").host("a.com")), Some("h"));
}

impl R {
    /// Turns the last expr's value into a one-element set (for In/NotIn on `a.com`).
    fn expr_set_fix(mut self) -> Self {
        if let Some(e) = self.0.exprs.last_mut() {
            e.value.clear();
            e.set = vec!["a.com".into()];
        }
        self
    }
}

#[test]
fn all_exprs_must_match() {
    let t = table(&[route("both")
        .path("/")
        .expr(S::Header, "a", O::Equal, "1")
        .expr(S::Query, "b", O::Equal, "2")]);
    assert_eq!(t.get(&req("/?b=2").header("a", "1")), Some("both"));
    assert_eq!(t.get(&req("/?b=3").header("a", "1")), None);
    assert_eq!(t.get(&req("/?b=2")), None);
}

// ---- invalid input ----------------------------------------------------------------------------

#[test]
fn invalid_regex_names_route_and_field() {
    let e = invalid(route("default/r/rule1").path("/").expr(
        S::Header,
        "a",
        O::RegexMatch,
        "(unclosed",
    ));
    assert_eq!(e.route_id, "default/r/rule1");
    assert_eq!(e.field, "match.exprs[0].value");
    assert!(matches!(e.reason, InvalidReason::Regex(_)));
    let msg = e.to_string();
    assert!(
        msg.starts_with("route default/r/rule1: match.exprs[0].value: invalid regex"),
        "{msg}"
    );
    // Look-around is not supported by the regex crate: say so instead of never matching.
    let e = invalid(route("x").path("/").expr(
        S::Path,
        "",
        O::RegexNotMatchCaseInsensitive,
        "a(?=b)",
    ));
    assert_eq!(e.field, "match.exprs[0].value");
}

#[test]
fn invalid_paths() {
    let e = invalid(route("x"));
    assert_eq!(
        (
            e.field.as_str(),
            e.to_string().contains("at least one path")
        ),
        ("match.paths", true)
    );
    for bad in ["foo", "", "/a*b", "/a**", "/a b", "/a?b=1"] {
        let e = invalid(route("x").path("/ok").path(bad));
        assert_eq!(e.field, "match.paths[1]", "{bad:?}");
        assert!(matches!(e.reason, InvalidReason::BadPath { .. }), "{bad:?}");
    }
}

#[test]
fn invalid_hosts() {
    for bad in ["*", "*.", "a.*.com", "*a.com", "a.com:80", "", "a..com"] {
        let e = invalid(route("x").path("/").host("ok.com").host(bad));
        assert_eq!(e.field, "match.hosts[1]", "{bad:?}");
        assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
    }
}

#[test]
fn invalid_methods_and_remote_addrs() {
    let e = invalid(route("x").path("/").method("GET").method("get"));
    assert_eq!(e.field, "match.methods[1]");
    let e = invalid(route("x").path("/").method("FETCH"));
    assert!(e.to_string().contains("unknown method \"FETCH\""), "{e}");

    for bad in [
        "10.0.0.0/33",
        "10.0.0",
        "fe80::/129",
        "host.example.com",
        "10.0.0.1/",
    ] {
        let e = invalid(route("x").path("/").remote("10.0.0.1").remote(bad));
        assert_eq!(e.field, "match.remoteAddrs[1]", "{bad:?}");
        assert!(matches!(e.reason, InvalidReason::BadRemoteAddr { .. }));
    }
}

#[test]
fn invalid_exprs() {
    let cases: Vec<(R, &str)> = vec![
        (
            route("x")
                .path("/")
                .expr(S::Unspecified, "a", O::Equal, "1"),
            "match.exprs[0].subject.scope",
        ),
        (
            route("x")
                .path("/")
                .expr(S::Header, "a", O::Unspecified, "1"),
            "match.exprs[0].op",
        ),
        (
            route("x").path("/").expr(S::Header, "", O::Equal, "1"),
            "match.exprs[0].subject.name",
        ),
        (
            route("x")
                .path("/")
                .expr(S::Header, "bad header", O::Equal, "1"),
            "match.exprs[0].subject.name",
        ),
        (
            route("x")
                .path("/")
                .expr(S::Variable, "no_such_var", O::Equal, "1"),
            "match.exprs[0].subject.name",
        ),
        (
            route("x")
                .path("/")
                .expr(S::Variable, "http_", O::Equal, "1"),
            "match.exprs[0].subject.name",
        ),
        (
            route("x")
                .path("/")
                .expr(S::Query, "a", O::Equal, "1")
                .expr(S::Query, "a", O::In, ""),
            "match.exprs[1].set",
        ),
        (
            route("x").path("/").expr(S::Query, "a", O::NotIn, ""),
            "match.exprs[0].set",
        ),
        (
            route("x")
                .path("/")
                .expr_set(S::Query, "a", O::Equal, &["1"]),
            "match.exprs[0].set",
        ),
    ];
    for (r, field) in cases {
        let e = invalid(r);
        assert_eq!(e.field, field, "{e}");
    }
    // Raw enum values from a newer producer.
    let mut r = route("x").path("/").expr(S::Header, "a", O::Equal, "1");
    r.0.exprs[0].op = 99;
    assert!(matches!(
        invalid(r).reason,
        InvalidReason::UnspecifiedOp(99)
    ));
    let e = invalid(
        route("x")
            .path("/")
            .expr(S::Variable, "no_such_var", O::Equal, "1"),
    );
    assert!(
        e.to_string().contains("unknown variable \"no_such_var\""),
        "{e}"
    );
}

#[test]
fn invalid_empty_id() {
    let e = invalid(route("").path("/"));
    assert_eq!(e.field, "id");
}

#[test]
fn a_valid_route_after_errors_is_not_needed_to_fail() {
    // The first error wins and names the offending route, not its neighbours.
    let routes = [
        route("good").path("/").0,
        route("bad/r/1").path("x").0,
        route("bad/r/2").path("y").0,
    ];
    let e = Router::new(&routes).err().unwrap();
    assert_eq!(e.route_id, "bad/r/1");
}

// ---- scale ------------------------------------------------------------------------------------

#[test]
fn many_routes_each_reachable() {
    let mut routes = Vec::new();
    for i in 0..2000 {
        routes.push(
            route(&format!("ns/r{i}/exact"))
                .host(&format!("h{}.example.com", i % 97))
                .path(&format!("/svc/{i}")),
        );
        routes.push(
            route(&format!("ns/r{i}/prefix"))
                .host(&format!("*.w{}.example.com", i % 13))
                .path(&format!("/p/{i}/*")),
        );
    }
    routes.push(route("ns/fallback/any").path("/*"));
    let t = table(&routes);
    assert_eq!(t.router.len(), 4001);
    for i in (0..2000).step_by(7) {
        let host = format!("h{}.example.com", i % 97);
        assert_eq!(
            t.get(&req(&format!("/svc/{i}")).host(&host)),
            Some(format!("ns/r{i}/exact").as_str())
        );
        let wild = format!("x.y.w{}.example.com", i % 13);
        assert_eq!(
            t.get(&req(&format!("/p/{i}/deep/path")).host(&wild)),
            Some(format!("ns/r{i}/prefix").as_str())
        );
        // Right path, wrong host shard: the host-less fallback answers.
        let other = format!("h{}.example.com", (i + 1) % 97);
        assert_eq!(
            t.get(&req(&format!("/svc/{i}")).host(&other)),
            Some("ns/fallback/any")
        );
    }
}

#[test]
fn router_can_be_shared_across_worker_threads() {
    fn shared<T: Send + Sync + 'static>(_: &T) {}
    let t = table(&[route("a").path("/")]);
    shared(&t.router);
    let router = std::sync::Arc::new(t.router);
    let r2 = std::sync::Arc::clone(&router);
    let found = std::thread::spawn(move || {
        let (m, h) = (Method::GET, HeaderMap::new());
        r2.lookup(&RequestInfo {
            method: &m,
            host: None,
            path: "/",
            query: None,
            headers: &h,
            remote_addr: "127.0.0.1:1".parse().unwrap(),
            local_addr: "127.0.0.1:2".parse().unwrap(),
            scheme: "http",
        })
    })
    .join()
    .unwrap();
    assert_eq!(found, Some(0));
}
