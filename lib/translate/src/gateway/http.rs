//! HTTPRoute and GRPCRoute rules → snapshot routes.
//!
//! - Matches. `path`: `Exact` → the path; `PathPrefix` (default `/`) → element-wise prefix
//!   (`/foo` and `/foo/` → `["/foo", "/foo/*"]`, `/` → `["/*"]`); `RegularExpression` →
//!   `/*` plus a Path expr. `headers` / `queryParams`: `Exact` → `==`, `RegularExpression`
//!   → `~~`; only the first match of a name counts, as the spec says. `method` → `methods`.
//!   Every regex is anchored (`^(?:re)$`: the whole value must match, as in Envoy-based
//!   implementations). GRPCRoute `method` → `POST /<service>/<method>` (exact), service only →
//!   prefix `/<service>/*`, method only or `RegularExpression` → `/*` plus a Path regex; every
//!   GRPCRoute match also requires a `content-type: application/grpc[+...]` header, so an
//!   HTTPRoute on the same host and path keeps the non-gRPC requests.
//! - Filters. `RequestHeaderModifier` and `URLRewrite` → one `proxy-rewrite` (`headers`
//!   set/add/remove, `host`, `uri` for `ReplaceFullPath`, `regex_uri` for
//!   `ReplacePrefixMatch`); `ResponseHeaderModifier` → `response-rewrite` headers;
//!   `RequestRedirect` → `redirect` (`uri` built from scheme, hostname, port and path, the
//!   request's `$scheme`/`$host`/`$uri` where unset, query string kept; 302 by default);
//!   `RequestMirror` → `proxy-mirror` to the backend Service's ClusterIP and port, with
//!   `percent` / `fraction` as `sample_ratio` (one mirror per rule).
//!   Header values are literal (`$` is escaped for the plugins' templates).
//! - Unsupported, reported with `UnsupportedValue` and the rule left out of the snapshot
//!   (`PartiallyInvalid=True`, or `Accepted=False` when no rule is left): a second
//!   `RequestMirror`, `CORS`, `ExtensionRef`, filters on a single backendRef,
//!   and `timeouts` (the snapshot has connect/send/read timeouts only, no request deadline).
//! - Backends. A `Service` (group `""`) with a port, resolved like an ApisixRoute backend
//!   (upstream `<ns>/<svc>:<port>`, `@grpc` with scheme grpc for GRPCRoute: HTTP/2 prior
//!   knowledge); weight default 1, 0 = no traffic. Another kind → `InvalidKind`; another
//!   namespace without a ReferenceGrant → `RefNotPermitted`; missing Service or port →
//!   `BackendNotFound`. Such backends are invalid: a rule whose backends are all invalid (or
//!   that has none, or only weight 0) answers 500 (`fault-injection` abort). NB: when only
//!   some are invalid, their share of the traffic goes to an upstream without endpoints and
//!   gets 503, not the 500 the spec asks for (the snapshot cannot answer 500 per backend).
//! - A Service port with `appProtocol: kubernetes.io/h2c` is spoken to in HTTP/2 with prior
//!   knowledge (upstream `<ns>/<svc>:<port>@h2c`).
//! - A Service port with `appProtocol: kubernetes.io/ws` makes the rule's routes accept
//!   WebSocket upgrades. A backend Service targeted by a BackendTLSPolicy is invalid
//!   (`ResolvedRefs=False`, `UnsupportedProtocol`): TLS to backends is not implemented yet,
//!   and plain text is not sent where TLS was asked for.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};
use sluice_crds::gateway::{
    BackendObjectReference, BackendTLSPolicy, GRPCRoute, GrpcRouteRule, HTTPRoute,
    HttpHeaderFilter, HttpPathModifier, HttpRequestMirrorFilter, HttpRequestRedirectFilter,
    HttpRouteRule, HttpUrlRewriteFilter, ParentReference, ReferenceGrant,
};
use sluice_proto::v1;

use super::{RESOLVED_REFS, RouteKind, Slot, cond, granted, reason};
use crate::Index;
use crate::problems::Problems;
use crate::status::Condition;
use crate::upstream::{self, BackendRef, UpstreamObject};

/// Path precedence among routes on the same router path entry. NB: a regex sits on the
/// `/*` entry, where it competes only with `PathPrefix /` (and other regexes): ranking it
/// above the prefix keeps a catch-all from shadowing it. A longer prefix still wins over a
/// regex, through the router's longest-prefix order.
const RANK_EXACT: u8 = 3;
const RANK_REGEX: u8 = 2;
const RANK_PREFIX: u8 = 1;

/// Methods the router knows.
const METHODS: &[&str] = &[
    "CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE",
];

/// The parts of an HTTPRoute or GRPCRoute translation needs.
pub(crate) struct RouteInput<'a> {
    pub(crate) kind: RouteKind,
    pub(crate) ns: &'a str,
    pub(crate) name: &'a str,
    pub(crate) meta: &'a ObjectMeta,
    pub(crate) parent_refs: &'a [ParentReference],
    pub(crate) hostnames: &'a [String],
    rules: Rules<'a>,
}

enum Rules<'a> {
    Http(&'a [HttpRouteRule]),
    Grpc(&'a [GrpcRouteRule]),
}

impl<'a> RouteInput<'a> {
    pub(crate) fn http(r: &'a HTTPRoute) -> Self {
        let (ns, name) = crate::key(&r.metadata);
        Self {
            kind: RouteKind::HttpRoute,
            ns,
            name,
            meta: &r.metadata,
            parent_refs: &r.spec.parent_refs,
            hostnames: &r.spec.hostnames,
            rules: Rules::Http(&r.spec.rules),
        }
    }

    pub(crate) fn grpc(r: &'a GRPCRoute) -> Self {
        let (ns, name) = crate::key(&r.metadata);
        Self {
            kind: RouteKind::GrpcRoute,
            ns,
            name,
            meta: &r.metadata,
            parent_refs: &r.spec.parent_refs,
            hostnames: &r.spec.hostnames,
            rules: Rules::Grpc(&r.spec.rules),
        }
    }

    fn id_prefix(&self) -> &'static str {
        match self.kind {
            RouteKind::HttpRoute => "httproute",
            RouteKind::GrpcRoute => "grpcroute",
        }
    }
}

pub(crate) struct Ctx<'c, 'a> {
    pub(crate) idx: &'c Index<'a>,
    pub(crate) aus: &'c BTreeMap<(&'a str, &'a str), Result<UpstreamObject, ()>>,
    pub(crate) grants: &'c [ReferenceGrant],
    pub(crate) tls_policies: &'c [BackendTLSPolicy],
}

/// Precedence of a snapshot route among Gateway API routes; greater wins.
/// (path kind, method, headers, query params, Reverse(created, ns, name, rule, match, id)).
pub(crate) type Rank = (
    u8,
    bool,
    usize,
    usize,
    Reverse<(Option<i64>, String, String, usize, usize, String)>,
);

/// One snapshot route with its precedence.
pub(crate) struct Entry {
    pub(crate) rank: Rank,
    pub(crate) route: v1::Route,
}

/// The translation of one route's rules.
pub(crate) struct Translated {
    pub(crate) entries: Vec<Entry>,
    pub(crate) upstreams: Vec<v1::Upstream>,
    pub(crate) resolved_refs: Condition,
    /// `; `-joined reasons rules were left out; empty when none was.
    pub(crate) rule_problems: String,
    pub(crate) valid_rules: usize,
    pub(crate) rule_count: usize,
}

/// One match, before hosts and schemes are applied.
struct Match {
    paths: Vec<String>,
    methods: Vec<String>,
    exprs: Vec<v1::Expr>,
    /// `PathPrefix` value (trailing `/` trimmed) for `ReplacePrefixMatch`.
    prefix: Option<String>,
    rank_path: u8,
    headers: usize,
    queries: usize,
}

/// A rule's filters, validated.
#[derive(Default)]
struct Filters<'a> {
    request_headers: Option<&'a HttpHeaderFilter>,
    response_headers: Option<&'a HttpHeaderFilter>,
    redirect: Option<&'a HttpRequestRedirectFilter>,
    rewrite: Option<&'a HttpUrlRewriteFilter>,
    mirror: Option<&'a HttpRequestMirrorFilter>,
}

fn expr(scope: v1::ExprScope, name: &str, regex: bool, value: &str) -> v1::Expr {
    let (op, value) = if regex {
        (v1::ExprOp::RegexMatch, format!("^(?:{value})$"))
    } else {
        (v1::ExprOp::Equal, value.to_owned())
    };
    v1::Expr {
        scope: scope as i32,
        name: name.to_owned(),
        op: op as i32,
        value,
        set: Vec::new(),
    }
}

/// `Exact` (default) or `RegularExpression`: whether it is a regex.
fn match_type(t: Option<&str>, field: &str) -> Result<bool, String> {
    match t.unwrap_or("Exact") {
        "Exact" => Ok(false),
        "RegularExpression" => Ok(true),
        other => Err(format!(
            "{field}.type: {other} is not supported (Exact, RegularExpression)"
        )),
    }
}

/// Checks an expr the way the dataplane router would (header names, variables, regexes).
fn check_expr(e: &v1::Expr, field: &str) -> Result<(), String> {
    use sluice_crds::{ExprOp, ExprScope};
    let scope = match v1::ExprScope::try_from(e.scope) {
        Ok(v1::ExprScope::Header) => Some(ExprScope::Header),
        Ok(v1::ExprScope::Query) => Some(ExprScope::Query),
        Ok(v1::ExprScope::Variable) => Some(ExprScope::Variable),
        _ => None,
    };
    if let Some(scope) = scope {
        crate::validate::expr_subject(scope, &e.name).map_err(|m| format!("{field}.name: {m}"))?;
    }
    if e.op == v1::ExprOp::RegexMatch as i32 {
        crate::validate::regex(ExprOp::RegexMatch, &e.value)
            .map_err(|m| format!("{field}.value: {m}"))?;
    }
    Ok(())
}

/// Header matches (first of each case-insensitive name).
fn header_exprs<'h>(
    headers: impl Iterator<Item = (Option<&'h str>, &'h str, &'h str)>,
    field: &str,
) -> Result<Vec<v1::Expr>, String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (k, (t, name, value)) in headers.enumerate() {
        let f = format!("{field}.headers[{k}]");
        if !seen.insert(name.to_ascii_lowercase()) {
            continue;
        }
        let e = expr(v1::ExprScope::Header, name, match_type(t, &f)?, value);
        check_expr(&e, &f)?;
        out.push(e);
    }
    Ok(out)
}

fn http_match(m: &sluice_crds::gateway::HttpRouteMatch, field: &str) -> Result<Match, String> {
    let path_type = m
        .path
        .as_ref()
        .and_then(|p| p.type_.as_deref())
        .unwrap_or("PathPrefix");
    let value = m
        .path
        .as_ref()
        .and_then(|p| p.value.as_deref())
        .unwrap_or("/");
    let pf = format!("{field}.path");
    let HttpPath {
        paths,
        rank_path,
        prefix,
        mut exprs,
    } = http_path(path_type, value, &pf)?;
    for p in &paths {
        crate::validate::path(p).map_err(|m| format!("{pf}.value: {m}"))?;
    }
    let headers = header_exprs(
        m.headers
            .iter()
            .map(|h| (h.type_.as_deref(), h.name.as_str(), h.value.as_str())),
        field,
    )?;
    let n_headers = headers.len();
    exprs.extend(headers);
    let queries = query_exprs(m, field)?;
    let n_queries = queries.len();
    exprs.extend(queries);
    let methods = match m.method.as_deref() {
        None => Vec::new(),
        Some(mth) if METHODS.contains(&mth) => vec![mth.to_owned()],
        Some(mth) => return Err(format!("{field}.method: {mth} is not supported")),
    };
    Ok(Match {
        paths,
        methods,
        exprs,
        prefix,
        rank_path,
        headers: n_headers,
        queries: n_queries,
    })
}

/// What an HTTPRoute path match becomes.
struct HttpPath {
    paths: Vec<String>,
    rank_path: u8,
    /// The prefix of a `PathPrefix` match, without a trailing `/`.
    prefix: Option<String>,
    /// The path regex of a `RegularExpression` match.
    exprs: Vec<v1::Expr>,
}

/// The router paths of a path match of `path_type` and `value` (`pf`: its field).
fn http_path(path_type: &str, value: &str, pf: &str) -> Result<HttpPath, String> {
    let mut out = HttpPath {
        paths: vec!["/*".to_owned()],
        rank_path: RANK_PREFIX,
        prefix: None,
        exprs: Vec::new(),
    };
    match path_type {
        "Exact" => {
            if value.contains('*') {
                return Err(format!("{pf}.value: `*` in an Exact path is not supported"));
            }
            out.paths = vec![value.to_owned()];
            out.rank_path = RANK_EXACT;
        }
        "PathPrefix" => {
            if value.contains('*') {
                return Err(format!("{pf}.value: `*` in a PathPrefix is not supported"));
            }
            let base = value.trim_end_matches('/');
            out.prefix = Some(base.to_owned());
            if !base.is_empty() {
                out.paths = vec![base.to_owned(), format!("{base}/*")];
            }
        }
        "RegularExpression" => {
            let e = expr(v1::ExprScope::Path, "", true, value);
            check_expr(&e, pf)?;
            out.exprs.push(e);
            out.rank_path = RANK_REGEX;
        }
        other => {
            return Err(format!(
                "{pf}.type: {other} is not supported (Exact, PathPrefix, RegularExpression)"
            ));
        }
    }
    Ok(out)
}

/// The exprs of `queryParams` (the first of each name).
fn query_exprs(
    m: &sluice_crds::gateway::HttpRouteMatch,
    field: &str,
) -> Result<Vec<v1::Expr>, String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (k, q) in m.query_params.iter().enumerate() {
        let f = format!("{field}.queryParams[{k}]");
        if !seen.insert(q.name.as_str()) {
            continue;
        }
        let e = expr(
            v1::ExprScope::Query,
            &q.name,
            match_type(q.type_.as_deref(), &f)?,
            &q.value,
        );
        check_expr(&e, &f)?;
        out.push(e);
    }
    Ok(out)
}

fn grpc_match(m: &sluice_crds::gateway::GrpcRouteMatch, field: &str) -> Result<Match, String> {
    let mf = format!("{field}.method");
    let (paths, mut exprs, rank_path) = match &m.method {
        None => (vec!["/*".to_owned()], Vec::new(), RANK_PREFIX),
        Some(method) => {
            let regex = match_type(method.type_.as_deref(), &mf)?;
            let (s, me) = (method.service.as_deref(), method.method.as_deref());
            for (what, v) in [("service", s), ("method", me)] {
                if !regex && v.is_some_and(|v| v.is_empty() || v.contains(['/', '*'])) {
                    return Err(format!(
                        "{mf}.{what}: {:?} is not a gRPC name",
                        v.unwrap_or("")
                    ));
                }
            }
            match (regex, s, me) {
                (false, Some(s), Some(me)) => (vec![format!("/{s}/{me}")], Vec::new(), RANK_EXACT),
                (false, Some(s), None) => (vec![format!("/{s}/*")], Vec::new(), RANK_PREFIX),
                (false, None, None) => (vec!["/*".to_owned()], Vec::new(), RANK_PREFIX),
                (false, None, Some(me)) => (
                    vec!["/*".to_owned()],
                    vec![expr(
                        v1::ExprScope::Path,
                        "",
                        true,
                        &format!("/[^/]+/{}", regex::escape(me)),
                    )],
                    RANK_REGEX,
                ),
                (true, s, me) => (
                    vec!["/*".to_owned()],
                    vec![expr(
                        v1::ExprScope::Path,
                        "",
                        true,
                        &format!(
                            "/(?:{})/(?:{})",
                            s.unwrap_or("[^/]+"),
                            me.unwrap_or("[^/]+")
                        ),
                    )],
                    RANK_REGEX,
                ),
            }
        }
    };
    for e in &exprs {
        check_expr(e, &mf)?;
    }
    for p in &paths {
        crate::validate::path(p).map_err(|m| format!("{mf}: {m}"))?;
    }
    let headers = header_exprs(
        m.headers
            .iter()
            .map(|h| (h.type_.as_deref(), h.name.as_str(), h.value.as_str())),
        field,
    )?;
    let n = headers.len();
    exprs.extend(headers);
    // NB: only gRPC requests: an HTTPRoute on the same host and path keeps the rest.
    exprs.push(expr(
        v1::ExprScope::Header,
        "content-type",
        true,
        "application/grpc([+;].*)?",
    ));
    Ok(Match {
        paths,
        methods: vec!["POST".to_owned()],
        exprs,
        prefix: None,
        rank_path,
        headers: n,
        queries: 0,
    })
}

/// `$` is a variable in plugin templates; header values and paths are literal.
fn literal(s: &str) -> String {
    s.replace('$', "\\$")
}

fn header_ops(f: &HttpHeaderFilter) -> Option<Value> {
    let mut ops = serde_json::Map::new();
    let mut set = serde_json::Map::new();
    for h in &f.set {
        set.insert(h.name.clone(), Value::String(literal(&h.value)));
    }
    let mut add: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for h in &f.add {
        add.entry(h.name.as_str())
            .or_default()
            .push(literal(&h.value));
    }
    if !set.is_empty() {
        ops.insert("set".into(), Value::Object(set));
    }
    if !add.is_empty() {
        let add: serde_json::Map<String, Value> = add
            .into_iter()
            .map(|(k, v)| (k.to_owned(), json!(v)))
            .collect();
        ops.insert("add".into(), Value::Object(add));
    }
    if !f.remove.is_empty() {
        ops.insert("remove".into(), json!(f.remove));
    }
    (!ops.is_empty()).then_some(Value::Object(ops))
}

fn plugin(name: &str, config: &Value, field: &str) -> Result<v1::Plugin, String> {
    sluice_plugin_config::validate(name, config).map_err(|e| format!("{field}: {e}"))?;
    Ok(v1::Plugin {
        name: name.to_owned(),
        config_json: crate::json::canonical(config),
    })
}

/// Plugins of one match of a rule.
/// The plugins of one match's filters. `listener_port`: the Gateway listener port (and
/// whether it is HTTPS) the copy is served on, with per-Gateway ports: a redirect without
/// scheme and port keeps it.
fn plugins(
    f: &Filters<'_>,
    m: &Match,
    field: &str,
    listener_port: Option<(u16, bool)>,
) -> Result<Vec<v1::Plugin>, String> {
    let mut out = Vec::new();
    let rewrite = proxy_rewrite(f, m, field)?;
    if !rewrite.is_empty() {
        out.push(plugin("proxy-rewrite", &Value::Object(rewrite), field)?);
    }
    if let Some(h) = f.response_headers.and_then(header_ops) {
        out.push(plugin("response-rewrite", &json!({ "headers": h }), field)?);
    }
    if let Some(r) = f.redirect {
        let config = redirect(r, m, field, listener_port)?;
        out.push(plugin("redirect", &config, field)?);
    }
    Ok(out)
}

/// For a path modifier of `what` (`urlRewrite`, `requestRedirect`): `None` for
/// `ReplaceFullPath`, the escaped prefix of the match and its replacement for
/// `ReplacePrefixMatch`.
fn prefix_pairs(
    m: &Match,
    field: &str,
    p: &HttpPathModifier,
    what: &str,
) -> Result<Option<(String, String)>, String> {
    match p.type_.as_str() {
        "ReplaceFullPath" => Ok(None),
        "ReplacePrefixMatch" => {
            let Some(prefix) = &m.prefix else {
                return Err(format!(
                    "{field}.{what}.path: ReplacePrefixMatch needs a PathPrefix match"
                ));
            };
            let to = p.replace_prefix_match.as_deref().unwrap_or("/");
            Ok(Some((
                regex::escape(prefix),
                to.trim_end_matches('/').to_owned(),
            )))
        }
        other => Err(format!(
            "{field}.{what}.path.type: {other} is not supported"
        )),
    }
}

/// The `proxy-rewrite` config of the request header modifier and the URL rewrite; empty
/// when there is none.
fn proxy_rewrite(
    f: &Filters<'_>,
    m: &Match,
    field: &str,
) -> Result<serde_json::Map<String, Value>, String> {
    let mut rewrite = serde_json::Map::new();
    if let Some(h) = f.request_headers.and_then(header_ops) {
        rewrite.insert("headers".into(), h);
    }
    let Some(rw) = f.rewrite else {
        return Ok(rewrite);
    };
    if let Some(h) = &rw.hostname {
        rewrite.insert("host".into(), json!(h));
    }
    if let Some(p) = &rw.path {
        match prefix_pairs(m, field, p, "urlRewrite")? {
            None => {
                let full = p.replace_full_path.as_deref().unwrap_or("/");
                rewrite.insert("uri".into(), json!(literal(full)));
            }
            Some((prefix, to)) => {
                let to = literal(&to);
                let exact_to = if to.is_empty() {
                    "/".to_owned()
                } else {
                    to.clone()
                };
                rewrite.insert(
                    "regex_uri".into(),
                    json!([
                        format!("^{prefix}$"),
                        exact_to,
                        format!("^{prefix}(/.*)$"),
                        format!("{to}$1"),
                    ]),
                );
            }
        }
    }
    Ok(rewrite)
}

/// The `redirect` config of a request redirect.
fn redirect(
    r: &HttpRequestRedirectFilter,
    m: &Match,
    field: &str,
    listener_port: Option<(u16, bool)>,
) -> Result<Value, String> {
    let code = r.status_code.unwrap_or(302);
    let scheme = r.scheme.as_deref();
    let mut target = match scheme {
        Some(s @ ("http" | "https")) => format!("{s}://"),
        Some(other) => {
            return Err(format!(
                "{field}.requestRedirect.scheme: {other} is not supported (http, https)"
            ));
        }
        None => "$scheme://".to_owned(),
    };
    target.push_str(&r.hostname.as_deref().map_or("$host".to_owned(), literal));
    // The port: dropped when it is the scheme's well-known one. Without port and scheme,
    // the listener's port (on shared ports always the well-known one of its scheme).
    let port = match (r.port, scheme, listener_port) {
        (Some(p), _, _) => Some((p, scheme.map(|s| s == "https"))),
        (None, None, Some((p, https))) => Some((i32::from(p), Some(https))),
        _ => None,
    };
    if let Some((port, https)) = port {
        let well_known = matches!((https, port), (Some(false), 80) | (Some(true), 443));
        if !well_known {
            target.push_str(&format!(":{port}"));
        }
    }
    let config = match &r.path {
        None => {
            json!({"uri": format!("{target}$uri"), "ret_code": code, "append_query_string": true})
        }
        Some(p) => match prefix_pairs(m, field, p, "requestRedirect")? {
            None => json!({
                "uri": format!("{target}{}", literal(p.replace_full_path.as_deref().unwrap_or("/"))),
                "ret_code": code,
                "append_query_string": true,
            }),
            Some((prefix, to)) => json!({
                "regex_uri": [format!("^{prefix}(/.*)?$"), format!("{target}{}$1", literal(&to))],
                "ret_code": code,
                "append_query_string": true,
            }),
        },
    };
    Ok(config)
}

impl Ctx<'_, '_> {
    /// A backend's upstream; `None` (with the reason in `unresolved`) when it is invalid.
    fn backend(
        &self,
        b: &BackendObjectReference,
        route: &RouteInput<'_>,
        field: &str,
        unresolved: &mut Vec<(&'static str, String)>,
        websocket: &mut bool,
    ) -> Option<v1::Upstream> {
        let (ns, port) = match self.backend_ref(b, route, field) {
            Ok(found) => found,
            Err(refused) => {
                unresolved.push(refused);
                return None;
            }
        };
        let port = IntOrString::Int(port);
        let r = BackendRef {
            namespace: ns,
            service: &b.name,
            port: &port,
            granularity: Default::default(),
            subset: None,
            field,
            field_names: ("name", "port"),
        };
        let mut problems = Problems::default();
        let up = upstream::service_upstream(&r, self.idx, self.aus, &mut problems);
        if !problems.is_valid() || !problems.unresolved.is_empty() {
            let errors = problems.errors.into_iter();
            let unresolved_refs = problems.unresolved.into_iter().map(|(_, m)| m);
            unresolved.extend(
                errors
                    .chain(unresolved_refs)
                    .map(|m| (reason::BACKEND_NOT_FOUND, m)),
            );
            return None;
        }
        let mut up = up?;
        let svc_port = self
            .idx
            .services
            .get(&(ns, b.name.as_str()))
            .and_then(|svc| upstream::find_port(svc, &port));
        let port_name = svc_port.and_then(|p| p.name.as_deref());
        if let Some(refused) = self.tls_policy(ns, b, port_name, field) {
            unresolved.push(refused);
            return None;
        }
        let app_protocol = svc_port.and_then(|p| p.app_protocol.as_deref());
        *websocket |= app_protocol == Some("kubernetes.io/ws");
        if app_protocol == Some("kubernetes.io/h2c") && route.kind == RouteKind::HttpRoute {
            // HTTP/2 with prior knowledge, in clear text (the scheme gRPC upstreams use).
            up.id.push_str("@h2c");
            up.scheme = v1::Scheme::Grpc as i32;
        }
        if route.kind == RouteKind::GrpcRoute {
            up.id.push_str("@grpc");
            up.scheme = match v1::Scheme::try_from(up.scheme) {
                Ok(v1::Scheme::Https | v1::Scheme::Grpcs) => v1::Scheme::Grpcs as i32,
                _ => v1::Scheme::Grpc as i32,
            };
        }
        Some(up)
    }

    /// The namespace and port of a backendRef to a core Service the route may refer to;
    /// `Err` is (reason, message) for `ResolvedRefs`.
    fn backend_ref<'b>(
        &self,
        b: &'b BackendObjectReference,
        route: &RouteInput<'b>,
        field: &str,
    ) -> Result<(&'b str, i32), (&'static str, String)> {
        let group = b.group.as_deref().unwrap_or("");
        let kind = b.kind.as_deref().unwrap_or("Service");
        if !group.is_empty() || kind != "Service" {
            return Err((
                reason::INVALID_KIND,
                format!("{field}: {group}/{kind} is not a supported backend kind (core Service)"),
            ));
        }
        let ns = b.namespace.as_deref().unwrap_or(route.ns);
        let kind = route.kind.as_str();
        if ns != route.ns && !granted(self.grants, kind, route.ns, "", "Service", ns, &b.name) {
            return Err((
                reason::REF_NOT_PERMITTED,
                format!(
                    "{field}: Service {ns}/{} is in another namespace and no ReferenceGrant there \
                     allows it",
                    b.name
                ),
            ));
        }
        let Some(port) = b.port else {
            return Err((
                reason::BACKEND_NOT_FOUND,
                format!("{field}.port: required for a Service"),
            ));
        };
        Ok((ns, port))
    }

    /// Why a BackendTLSPolicy for the Service port refuses the backend, if one does.
    // NB: fail closed: TLS to the backend is not implemented yet, and sending plain text
    // where a BackendTLSPolicy asks for TLS would expose the traffic.
    fn tls_policy(
        &self,
        ns: &str,
        b: &BackendObjectReference,
        port_name: Option<&str>,
        field: &str,
    ) -> Option<(&'static str, String)> {
        let policy = self.tls_policies.iter().find(|p| {
            crate::key(&p.metadata).0 == ns
                && p.spec.target_refs.iter().any(|t| {
                    t.group.is_empty()
                        && t.kind == "Service"
                        && t.name == b.name
                        && t.section_name
                            .as_deref()
                            .is_none_or(|s| Some(s) == port_name)
                })
        })?;
        Some((
            reason::UNSUPPORTED_PROTOCOL,
            format!(
                "{field}: BackendTLSPolicy {ns}/{} asks for TLS to Service {ns}/{}, which \
                 Sluice does not support yet (the backend is not used)",
                policy.metadata.name.as_deref().unwrap_or_default(),
                b.name
            ),
        ))
    }
}

impl Ctx<'_, '_> {
    /// The `proxy-mirror` plugin of a `RequestMirror` filter: requests copied to the
    /// backend Service's ClusterIP and port (kube-proxy picks the endpoint), a share
    /// `percent` / `fraction` of them. `Ok(None)` when the share is zero or the backend is
    /// invalid (its reason then in `unresolved`, as for backends); `Err` for what Sluice
    /// cannot mirror to.
    fn mirror_plugin(
        &self,
        mf: &HttpRequestMirrorFilter,
        route: &RouteInput<'_>,
        field: &str,
        unresolved: &mut Vec<(&'static str, String)>,
    ) -> Result<Option<v1::Plugin>, String> {
        let mut websocket = false;
        if self
            .backend(&mf.backend_ref, route, field, unresolved, &mut websocket)
            .is_none()
        {
            return Ok(None);
        }
        let b = &mf.backend_ref;
        let ns = b.namespace.as_deref().unwrap_or(route.ns);
        let ip = self
            .idx
            .services
            .get(&(ns, b.name.as_str()))
            .and_then(|s| s.spec.as_ref())
            .and_then(|s| s.cluster_ip.as_deref())
            .filter(|ip| !ip.is_empty() && *ip != "None")
            .ok_or_else(|| {
                format!(
                    "{field}: Service {ns}/{} has no ClusterIP (a headless Service cannot be \
                     mirrored to yet)",
                    b.name
                )
            })?;
        let port = b
            .port
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| format!("{field}.port: required"))?;
        let share = match (&mf.percent, &mf.fraction) {
            (Some(p), _) => Some(f64::from(*p) / 100.0),
            (None, Some(f)) => {
                let d = f.denominator.unwrap_or(100);
                if d <= 0 || f.numerator < 0 || f.numerator > d {
                    return Err(format!(
                        "{field}: fraction {}/{d} is not a share between 0 and 1",
                        f.numerator
                    ));
                }
                Some(f64::from(f.numerator) / f64::from(d))
            }
            (None, None) => None,
        };
        let Some(m) = sluice_plugin_config::proxy_mirror::ProxyMirror::to_endpoint(ip, port, share)
        else {
            return Ok(None);
        };
        plugin(
            "proxy-mirror",
            &json!({"host": m.host, "sample_ratio": m.sample_ratio}),
            field,
        )
        .map(Some)
    }
}

/// `a; b; c (and 4 more)`: condition messages stay small for routes with many rules.
pub(crate) fn join_capped(items: &[String]) -> String {
    const MAX_LISTED: usize = 5;
    let mut out = items
        .iter()
        .take(MAX_LISTED)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if items.len() > MAX_LISTED {
        out.push_str(&format!(" (and {} more)", items.len() - MAX_LISTED));
    }
    out
}

/// Translates the rules of `route` for the hosts per slot (scheme or per-Gateway port) it
/// attached with.
pub(crate) fn translate_rules(
    route: &RouteInput<'_>,
    schemes: &BTreeMap<Slot, Option<BTreeSet<String>>>,
    ctx: &Ctx<'_, '_>,
) -> Translated {
    let (ns, name) = (route.ns, route.name);
    let mut b = RulesBuild {
        route,
        ctx,
        variants: variants(schemes),
        no_backend_id: format!("{ns}/{name}/{}-no-backend", route.id_prefix()),
        no_backend_used: false,
        created: route
            .meta
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second()),
        entries: Vec::new(),
        upstreams: Vec::new(),
        unresolved: Vec::new(),
        rule_problems: Vec::new(),
        valid_rules: 0,
    };
    let rule_count = match route.rules {
        Rules::Http(r) => r.len(),
        Rules::Grpc(r) => r.len(),
    };
    for i in 0..rule_count {
        b.rule(i);
    }
    b.finish(rule_count)
}

/// The parts of one rule, read from an HTTPRoute or a GRPCRoute rule.
#[derive(Default)]
struct RuleParts<'r> {
    filters: Filters<'r>,
    matches: Vec<Result<Match, String>>,
    /// (backend, weight, whether it has filters of its own).
    backend_refs: Vec<(&'r BackendObjectReference, i32, bool)>,
}

/// The parts of HTTPRoute rule `rule` (`field`); unsupported settings go into `problems`.
fn http_rule_parts<'r>(
    rule: &'r HttpRouteRule,
    field: &str,
    problems: &mut Vec<String>,
) -> RuleParts<'r> {
    let mut parts = RuleParts::default();
    let filters = &mut parts.filters;
    for (k, f) in rule.filters.iter().enumerate() {
        let ff = format!("{field}.filters[{k}]");
        match f.type_.as_str() {
            "RequestHeaderModifier" => filters.request_headers = f.request_header_modifier.as_ref(),
            "ResponseHeaderModifier" => {
                filters.response_headers = f.response_header_modifier.as_ref()
            }
            "RequestRedirect" => filters.redirect = f.request_redirect.as_ref(),
            "URLRewrite" => filters.rewrite = f.url_rewrite.as_ref(),
            "RequestMirror" if filters.mirror.is_some() => problems.push(format!(
                "{ff}: only one RequestMirror per rule is supported"
            )),
            "RequestMirror" => filters.mirror = f.request_mirror.as_ref(),
            other => problems.push(format!("{ff}: {other} filters are not supported")),
        }
    }
    if rule.timeouts.is_some() {
        problems.push(format!(
            "{field}.timeouts: not supported (the snapshot has no request deadline)"
        ));
    }
    if rule.matches.is_empty() {
        parts.matches.push(http_match(
            &Default::default(),
            &format!("{field}.matches[0]"),
        ));
    }
    for (j, m) in rule.matches.iter().enumerate() {
        parts
            .matches
            .push(http_match(m, &format!("{field}.matches[{j}]")));
    }
    for b in &rule.backend_refs {
        let entry = (&b.backend, b.weight.unwrap_or(1), !b.filters.is_empty());
        parts.backend_refs.push(entry);
    }
    parts
}

/// The parts of GRPCRoute rule `rule` (`field`); unsupported settings go into `problems`.
fn grpc_rule_parts<'r>(
    rule: &'r GrpcRouteRule,
    field: &str,
    problems: &mut Vec<String>,
) -> RuleParts<'r> {
    let mut parts = RuleParts::default();
    let filters = &mut parts.filters;
    for (k, f) in rule.filters.iter().enumerate() {
        let ff = format!("{field}.filters[{k}]");
        match f.type_.as_str() {
            "RequestHeaderModifier" => filters.request_headers = f.request_header_modifier.as_ref(),
            "ResponseHeaderModifier" => {
                filters.response_headers = f.response_header_modifier.as_ref()
            }
            "RequestMirror" => problems.push(format!(
                "{ff}: RequestMirror is not supported on a GRPCRoute (mirrors speak HTTP/1.1)"
            )),
            other => problems.push(format!("{ff}: {other} filters are not supported")),
        }
    }
    if rule.matches.is_empty() {
        parts.matches.push(grpc_match(
            &Default::default(),
            &format!("{field}.matches[0]"),
        ));
    }
    for (j, m) in rule.matches.iter().enumerate() {
        parts
            .matches
            .push(grpc_match(m, &format!("{field}.matches[{j}]")));
    }
    for b in &rule.backend_refs {
        let entry = (&b.backend, b.weight.unwrap_or(1), !b.filters.is_empty());
        parts.backend_refs.push(entry);
    }
    parts
}

/// The rules of one route while they are translated.
struct RulesBuild<'b, 'r> {
    route: &'b RouteInput<'r>,
    ctx: &'b Ctx<'b, 'b>,
    variants: Vec<Variant>,
    /// The upstream without endpoints the routes of rules without a valid backend use.
    no_backend_id: String,
    no_backend_used: bool,
    /// The route's `creationTimestamp` in seconds.
    created: Option<i64>,
    entries: Vec<Entry>,
    upstreams: Vec<v1::Upstream>,
    unresolved: Vec<(&'static str, String)>,
    rule_problems: Vec<String>,
    valid_rules: usize,
}

impl RulesBuild<'_, '_> {
    /// Rule `i`: its entries when it has no problem, else its problems.
    fn rule(&mut self, i: usize) {
        let field = format!("spec.rules[{i}]");
        let mut problems: Vec<String> = Vec::new();
        let parts = match self.route.rules {
            Rules::Http(rules) => http_rule_parts(&rules[i], &field, &mut problems),
            Rules::Grpc(rules) => grpc_rule_parts(&rules[i], &field, &mut problems),
        };
        // Backends (resolved even for a rule left out, so ResolvedRefs tells the whole story).
        let (backends, websocket) = self.backends(&parts, &field, &mut problems);
        let extra_plugins = self.extra_plugins(&parts.filters, &backends, &field, &mut problems);
        let backends = self.with_no_backend(backends);
        let rule = Rule {
            i,
            field: &field,
            filters: &parts.filters,
            backends: &backends,
            extra_plugins: &extra_plugins,
            websocket,
        };
        let mut rule_entries = Vec::new();
        for (j, m) in parts.matches.into_iter().enumerate() {
            match m.and_then(|m| self.match_entries(&rule, j, &m)) {
                Ok(entries) => rule_entries.extend(entries),
                Err(e) => problems.push(e),
            }
        }
        if problems.is_empty() {
            self.valid_rules += 1;
            self.entries.extend(rule_entries);
        } else {
            self.rule_problems.extend(problems);
        }
    }

    /// The weighted backends of a rule (the upstreams into `self`), the weight of those that
    /// are invalid, and whether one speaks WebSocket.
    fn backends(
        &mut self,
        parts: &RuleParts<'_>,
        field: &str,
        problems: &mut Vec<String>,
    ) -> ((Vec<v1::Backend>, u32), bool) {
        let mut backends = Vec::new();
        let mut invalid_weight: u32 = 0;
        let mut websocket = false;
        for (k, (b, weight, has_filters)) in parts.backend_refs.iter().enumerate() {
            let bf = format!("{field}.backendRefs[{k}]");
            if *has_filters {
                problems.push(format!(
                    "{bf}.filters: filters on one backendRef are not supported"
                ));
            }
            let up = self
                .ctx
                .backend(b, self.route, &bf, &mut self.unresolved, &mut websocket);
            let weight = u32::try_from(*weight).unwrap_or(0);
            match up {
                Some(up) if weight > 0 => {
                    backends.push(v1::Backend {
                        upstream_id: up.id.clone(),
                        weight,
                    });
                    self.upstreams.push(up);
                }
                Some(_) => {}
                None => invalid_weight = invalid_weight.saturating_add(weight),
            }
        }
        ((backends, invalid_weight), websocket)
    }

    /// The mirror plugin, and the fault-injection plugin answering 500 when there is nothing
    /// to proxy to and no redirect answers by itself.
    fn extra_plugins(
        &mut self,
        filters: &Filters<'_>,
        (backends, _): &(Vec<v1::Backend>, u32),
        field: &str,
        problems: &mut Vec<String>,
    ) -> Vec<v1::Plugin> {
        let mut extra_plugins = Vec::new();
        if let Some(mf) = filters.mirror {
            let mfield = format!("{field}.filters.requestMirror.backendRef");
            match self
                .ctx
                .mirror_plugin(mf, self.route, &mfield, &mut self.unresolved)
            {
                Ok(Some(p)) => extra_plugins.push(p),
                Ok(None) => {}
                Err(e) => problems.push(e),
            }
        }
        if backends.is_empty() && filters.redirect.is_none() {
            extra_plugins.push(v1::Plugin {
                name: "fault-injection".into(),
                config_json: crate::json::canonical(&json!({"abort": {
                    "http_status": 500,
                    "body": "no valid backend for this route\n",
                }})),
            });
        }
        extra_plugins
    }

    /// `backends`, plus the no-backend upstream when there is none, or for the weight of
    /// the invalid ones.
    fn with_no_backend(
        &mut self,
        (mut backends, invalid_weight): (Vec<v1::Backend>, u32),
    ) -> Vec<v1::Backend> {
        let weight = match (backends.is_empty(), invalid_weight) {
            (true, _) => 1,
            (false, 0) => return backends,
            (false, w) => w,
        };
        backends.push(v1::Backend {
            upstream_id: self.no_backend_id.clone(),
            weight,
        });
        self.no_backend_used = true;
        backends
    }

    /// The entries of match `j` of a rule: one per variant.
    fn match_entries(&self, rule: &Rule<'_>, j: usize, m: &Match) -> Result<Vec<Entry>, String> {
        let filters_field = format!("{}.filters", rule.field);
        // NB: checked once; the copies per Gateway port differ only in a redirect's port.
        plugins(rule.filters, m, &filters_field, None)?;
        let (ns, name) = (self.route.ns, self.route.name);
        let i = rule.i;
        let mut out = Vec::new();
        for v in &self.variants {
            let Ok(mut plugins) = plugins(rule.filters, m, &filters_field, v.listener_port) else {
                continue;
            };
            plugins.extend(rule.extra_plugins.iter().cloned());
            let (hosts, suffix) = (&v.hosts, &v.suffix);
            let id = format!("{ns}/{name}/{}-r{i}-m{j}{suffix}", self.route.id_prefix());
            let mut exprs = m.exprs.clone();
            exprs.extend(v.scheme.clone());
            out.push(Entry {
                rank: (
                    m.rank_path,
                    !m.methods.is_empty(),
                    m.headers,
                    m.queries,
                    Reverse((
                        self.created,
                        ns.to_owned(),
                        name.to_owned(),
                        i,
                        j,
                        id.clone(),
                    )),
                ),
                route: v1::Route {
                    id,
                    source: format!("{} {ns}/{name}", self.route.kind.as_str()),
                    priority: 0,
                    hosts: hosts.clone(),
                    paths: m.paths.clone(),
                    methods: m.methods.clone(),
                    exprs,
                    backends: rule.backends.to_vec(),
                    plugins,
                    websocket: rule.websocket,
                    listeners: v.listeners.clone(),
                    ..Default::default()
                },
            });
        }
        Ok(out)
    }

    fn finish(mut self, rule_count: usize) -> Translated {
        if self.no_backend_used {
            self.upstreams.push(v1::Upstream {
                id: self.no_backend_id,
                ..Default::default()
            });
        }
        let resolved_refs = match self.unresolved.first() {
            None => cond(
                RESOLVED_REFS,
                true,
                reason::RESOLVED_REFS,
                "All references resolved",
            ),
            Some((r, _)) => {
                let messages: Vec<String> =
                    self.unresolved.iter().map(|(_, m)| m.clone()).collect();
                cond(RESOLVED_REFS, false, r, join_capped(&messages))
            }
        };
        Translated {
            entries: self.entries,
            upstreams: self.upstreams,
            resolved_refs,
            rule_problems: join_capped(&self.rule_problems),
            valid_rules: self.valid_rules,
            rule_count,
        }
    }
}

/// What every match of one rule shares.
struct Rule<'a> {
    i: usize,
    /// `spec.rules[i]`.
    field: &'a str,
    filters: &'a Filters<'a>,
    backends: &'a [v1::Backend],
    extra_plugins: &'a [v1::Plugin],
    websocket: bool,
}

/// One copy of a route's matches: the hosts, scheme and per-Gateway ports it serves.
#[derive(Debug)]
struct Variant {
    hosts: Vec<String>,
    /// On the shared ports: an expr on `scheme` when the route attached to one scheme only.
    scheme: Option<v1::Expr>,
    /// Per-Gateway ports (`Route.listeners`).
    listeners: Vec<String>,
    /// The Gateway listener port and whether it is HTTPS, for per-Gateway ports.
    listener_port: Option<(u16, bool)>,
    /// Appended to the route id when there is more than one variant.
    suffix: String,
}

/// The copies `schemes` (hosts per slot) asks for: on the shared ports, one per scheme
/// unless both schemes have the same hosts; on per-Gateway ports, one per distinct host
/// set, each naming its ports.
fn variants(schemes: &BTreeMap<Slot, Option<BTreeSet<String>>>) -> Vec<Variant> {
    let host_list = |h: &Option<BTreeSet<String>>| -> Vec<String> {
        h.as_ref()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    };
    let scheme_expr = |https: bool| {
        let s = if https { "https" } else { "http" };
        Some(expr(v1::ExprScope::Variable, "scheme", false, s))
    };
    let shared = |https: bool, hosts: &Option<BTreeSet<String>>, suffix: &str| Variant {
        hosts: host_list(hosts),
        scheme: scheme_expr(https),
        listeners: Vec::new(),
        listener_port: None,
        suffix: suffix.to_owned(),
    };
    let mut out = Vec::new();
    match (
        schemes.get(&Slot::Scheme(false)),
        schemes.get(&Slot::Scheme(true)),
    ) {
        (Some(a), Some(b)) if a == b => out.push(Variant {
            scheme: None,
            ..shared(false, a, "")
        }),
        (Some(a), None) => out.push(shared(false, a, "")),
        (None, Some(b)) => out.push(shared(true, b, "")),
        (Some(a), Some(b)) => {
            out.push(shared(false, a, "-http"));
            out.push(shared(true, b, "-https"));
        }
        (None, None) => {}
    }
    // NB: one copy per host set and Gateway port (a redirect keeps the port).
    type Key<'a> = (&'a Option<BTreeSet<String>>, u16, bool);
    let mut by_hosts: BTreeMap<Key<'_>, Vec<String>> = BTreeMap::new();
    for (slot, hosts) in schemes {
        if let Slot::Listener(id, port, https) = slot {
            by_hosts
                .entry((hosts, *port, *https))
                .or_default()
                .push(id.clone());
        }
    }
    let many = by_hosts.len() > 1;
    for (k, ((hosts, port, https), listeners)) in by_hosts.into_iter().enumerate() {
        out.push(Variant {
            hosts: host_list(hosts),
            scheme: None,
            listeners,
            listener_port: Some((port, https)),
            suffix: if many {
                format!("-l{k}")
            } else {
                String::new()
            },
        });
    }
    out
}
