//! `explain`: which route serves a request and why, with the dataplane's own router
//! ([`Router::explain`](sluice_dataplane::router::Router::explain), which walks candidates in
//! the order [`Router::lookup`](sluice_dataplane::router::Router::lookup) does) and the
//! plugin chains of the compiled [`RouteTable`].

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use serde::Serialize;
use sluice_dataplane::config::certs::SniIndex;
use sluice_dataplane::config::redact::redacted;
use sluice_dataplane::config::table::RouteTable;
use sluice_dataplane::plugins::{PluginChain, PluginCtx};
use sluice_dataplane::router::{Candidate, HostClass, Mismatch, PathKind, RequestInfo};
use sluice_proto::v1;

use crate::admin::Health;
use crate::table::{WIDTH, wrap};

/// How many non-matching candidates the text output lists.
pub const MAX_CANDIDATES: usize = 5;

/// A request to explain.
#[derive(Debug, Clone)]
pub struct Request {
    /// Request method.
    pub method: Method,
    /// `http` or `https`.
    pub scheme: String,
    /// Host header (from the URL unless `-H Host:` overrides it); `None` for none.
    pub host: Option<String>,
    /// Path without the query.
    pub path: String,
    /// Query without `?`.
    pub query: Option<String>,
    /// Request headers.
    pub headers: HeaderMap,
    /// Client address; default 192.0.2.1 (TEST-NET-1).
    pub client_ip: IpAddr,
    /// TLS server name; defaults to the host for https.
    pub sni: Option<String>,
}

/// Why a request could not be built from the command line.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The URL does not parse.
    #[error("invalid URL {0:?}: {1}")]
    Url(String, String),
    /// A `-H` is not `name: value`.
    #[error("invalid header {0:?}: expected 'name: value'")]
    Header(String),
    /// `-X` is not a method token.
    #[error("invalid method {0:?}")]
    Method(String),
}

impl Request {
    /// Builds a request from `explain`'s arguments. A URL without a scheme is `http://`.
    pub fn parse(
        url: &str,
        method: &str,
        headers: &[String],
        client_ip: IpAddr,
        sni: Option<String>,
    ) -> Result<Self, RequestError> {
        let full = if url.contains("://") || url.starts_with('/') {
            url.to_owned()
        } else {
            format!("http://{url}")
        };
        let uri: http::Uri = full
            .parse()
            .map_err(|e: http::uri::InvalidUri| RequestError::Url(url.into(), e.to_string()))?;
        let method = Method::from_bytes(method.as_bytes())
            .map_err(|_| RequestError::Method(method.into()))?;
        let mut map = HeaderMap::new();
        for h in headers {
            let (name, value) = h
                .split_once(':')
                .ok_or_else(|| RequestError::Header(h.clone()))?;
            let name = HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| RequestError::Header(h.clone()))?;
            let value =
                HeaderValue::from_str(value.trim()).map_err(|_| RequestError::Header(h.clone()))?;
            map.append(name, value);
        }
        let host = map
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or_else(|| uri.authority().map(|a| a.as_str().to_owned()));
        let scheme = uri.scheme_str().unwrap_or("http").to_owned();
        let sni = sni.or_else(|| {
            (scheme == "https")
                .then(|| uri.host().map(str::to_owned))
                .flatten()
        });
        Ok(Request {
            method,
            scheme,
            host,
            path: uri.path().to_owned(),
            query: uri.query().map(str::to_owned),
            headers: map,
            client_ip,
            sni,
        })
    }

    fn info(&self) -> RequestInfo<'_> {
        let port = if self.scheme == "https" { 443 } else { 80 };
        RequestInfo {
            method: &self.method,
            host: self.host.as_deref(),
            path: &self.path,
            query: self.query.as_deref(),
            headers: &self.headers,
            remote_addr: SocketAddr::new(self.client_ip, 50000),
            local_addr: SocketAddr::new(IpAddr::from([0, 0, 0, 0]), port),
            scheme: if self.scheme == "https" {
                "https"
            } else {
                "http"
            },
        }
    }
}

/// One route the router considered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteView {
    /// Route id (`<ns>/<name>/<rule>`).
    pub id: String,
    /// The object that produced it (`ApisixRoute default/httpbin`).
    pub source: String,
    /// Host class it was found in (`exact host a.com`, `wildcard *.a.com`, `any host`).
    pub host: String,
    /// The path pattern that matched and its kind (`prefix /api*`, `exact /ip`).
    pub path: String,
    /// Route priority.
    pub priority: i32,
    /// Why it did not match (the first failing condition); `None` for the winner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// One plugin of the chain, in execution order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginView {
    /// Plugin name.
    pub name: String,
    /// `global` (from a global rule, runs first) or `route`.
    pub scope: String,
    /// Priority (higher runs first within a scope).
    pub priority: i32,
    /// What can be known offline (credentials needed, rate-limit key), if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// An endpoint of an upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndpointView {
    /// `host:port`.
    pub address: String,
    /// Balancer weight.
    pub weight: u32,
    /// Health as far as known offline.
    pub health: String,
}

/// An upstream of the winning route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UpstreamView {
    /// Upstream id.
    pub id: String,
    /// Weight in the route's split.
    pub weight: u32,
    /// Endpoints; empty = requests get 503.
    pub endpoints: Vec<EndpointView>,
}

/// The request as the dataplane sends it upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Upstreamed {
    /// Host header sent upstream.
    pub host: String,
    /// Path (and query) sent upstream.
    pub path: String,
    /// Headers proxy-rewrite added, changed (`name: value`) or removed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<String>,
    /// The method, when proxy-rewrite changes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// The result of `explain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// What was explained: files, a dataplane's snapshot, or the cluster's objects.
    pub source: String,
    /// `GET http://host/path?query from client-ip`.
    pub request: String,
    /// Certificate id served for the TLS server name, for https.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
    /// The winning route; `None`: 404.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matched: Option<RouteView>,
    /// Candidates checked before the winner (or all, on a 404), in order.
    pub not_matched: Vec<RouteView>,
    /// Plugins in execution order.
    pub plugins: Vec<PluginView>,
    /// Upstreams of the winning route.
    pub upstreams: Vec<UpstreamView>,
    /// The request as sent upstream (for the first upstream's first endpoint).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_request: Option<Upstreamed>,
}

fn host_text(class: &HostClass, host: Option<&str>) -> String {
    match class {
        HostClass::Exact => format!("exact host {}", host.unwrap_or_default()),
        HostClass::Wildcard(suffix) => format!("wildcard *{suffix}"),
        HostClass::Any => "any host".into(),
    }
}

/// The pattern of `route` that matched `path` as `kind`: exact equal, or the longest prefix.
fn path_text(route: &v1::Route, kind: PathKind, path: &str) -> String {
    match kind {
        PathKind::Exact => format!("exact {path}"),
        PathKind::Prefix => route
            .paths
            .iter()
            .filter_map(|p| p.strip_suffix('*').map(|pre| (p, pre)))
            .filter(|(_, pre)| path.starts_with(pre))
            .max_by_key(|(_, pre)| pre.len())
            .map(|(p, _)| format!("prefix {p}"))
            .unwrap_or_else(|| "prefix".into()),
    }
}

fn expr_text(e: &v1::Expr) -> String {
    let scope = v1::ExprScope::try_from(e.scope)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("EXPR_SCOPE_")
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    let op = v1::ExprOp::try_from(e.op)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("EXPR_OP_")
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    let value = if e.set.is_empty() {
        format!("{:?}", e.value)
    } else {
        format!("{:?}", e.set)
    };
    format!("{scope} {} {op} {value}", e.name)
}

fn failed_text(route: &v1::Route, m: Mismatch, req: &Request) -> String {
    match m {
        Mismatch::Method => format!(
            "match.methods: {} not in [{}]",
            req.method,
            route.methods.join(", ")
        ),
        Mismatch::RemoteAddr => format!(
            "match.remoteAddrs: client {} not in [{}]",
            req.client_ip,
            route.remote_addrs.join(", ")
        ),
        Mismatch::Expr(j) => format!(
            "match.exprs[{j}] is false: {}",
            route.exprs.get(j).map(expr_text).unwrap_or_default()
        ),
    }
}

fn view(routes: &[v1::Route], c: &Candidate, req: &Request) -> Option<RouteView> {
    let r = routes.get(c.route)?;
    Some(RouteView {
        id: r.id.clone(),
        source: r.source.clone(),
        host: host_text(&c.host, req.host.as_deref()),
        path: path_text(r, c.path, &req.path),
        priority: r.priority,
        failed: c.mismatch.map(|m| failed_text(r, m, req)),
    })
}

/// Reads a string or number field of a plugin config.
fn field(config: &serde_json::Value, name: &str) -> Option<String> {
    match config.get(name)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Null => None,
        v => Some(v.to_string()),
    }
}

/// What can be said of a plugin's decision without a live request.
pub(crate) fn plugin_note(name: &str, config: &serde_json::Value) -> Option<String> {
    let key = || field(config, "key").unwrap_or_else(|| "remote_addr".into());
    match name {
        "key-auth" => Some(format!(
            "needs a consumer key in header {:?} (or query {:?})",
            field(config, "header").unwrap_or_else(|| "apikey".into()),
            field(config, "query").unwrap_or_else(|| "apikey".into())
        )),
        "basic-auth" => Some("needs Authorization: Basic credentials of a consumer".into()),
        "jwt-auth" => {
            Some("needs a JWT of a consumer (Authorization header, jwt query or cookie)".into())
        }
        "hmac-auth" => Some(
            "needs an `Authorization: Signature keyId=...` of a consumer, signed with its \
             secret_key over the signed headers"
                .into(),
        ),
        "csrf" => Some(format!(
            "POST, PUT, DELETE... need header {:?} matching the cookie of the same name \
             (GET, HEAD, OPTIONS pass and get the cookie)",
            field(config, "name").unwrap_or_else(|| "apisix-csrf-token".into())
        )),
        "client-control" => field(config, "max_body_size")
            .map(|n| format!("413 when Content-Length is over {n} bytes")),
        "api-breaker" => Some(format!(
            "answers {} while the upstream is failing (circuit open)",
            field(config, "break_response_code").unwrap_or_default()
        )),
        "limit-count" => Some(format!(
            "{} requests per {}s, keyed by {}",
            field(config, "count").unwrap_or_default(),
            field(config, "time_window").unwrap_or_default(),
            key()
        )),
        "limit-req" => Some(format!(
            "{} req/s, burst {}, keyed by {}",
            field(config, "rate").unwrap_or_default(),
            field(config, "burst").unwrap_or_default(),
            key()
        )),
        "limit-conn" => Some(format!(
            "{} connections, burst {}, keyed by {}",
            field(config, "conn").unwrap_or_default(),
            field(config, "burst").unwrap_or_default(),
            key()
        )),
        "redirect"
        | "fault-injection"
        | "ip-restriction"
        | "proxy-rewrite"
        | "cors"
        | "response-rewrite"
        | "consumer-restriction"
        | "ua-restriction"
        | "uri-blocker" => Some(masked_headers(config).to_string()),
        _ => None,
    }
}

pub(crate) fn plugin_config(list: &[v1::Plugin], name: &str) -> serde_json::Value {
    list.iter()
        .find(|p| p.name == name)
        .and_then(|p| serde_json::from_str(&p.config_json).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// Where the configuration explained comes from, and what is known of its endpoints.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// `files`, `dataplane http://...: snapshot 12 (hash ...)`, `cluster (context ...)`.
    pub source: String,
    /// Live endpoint health, when read from a running dataplane.
    pub health: Option<Health>,
}

/// Explains `req` against a compiled table and the snapshot it was compiled from.
pub fn explain(
    table: &RouteTable,
    snapshot: &v1::Snapshot,
    req: &Request,
    cx: &Context,
) -> Explanation {
    // NB: plugin configs are shown from a redacted copy: never print credentials.
    let shown = redacted(snapshot);
    let info = req.info();
    let candidates = table.router.explain(&info);
    let winner = candidates
        .last()
        .filter(|c| c.mismatch.is_none())
        .map(|c| c.route);
    let mut not_matched = Vec::new();
    let mut matched = None;
    for c in &candidates {
        match view(&snapshot.routes, c, req) {
            Some(v) if v.failed.is_none() => matched = Some(v),
            Some(v) => not_matched.push(v),
            None => {}
        }
    }
    let mut plugins = Vec::new();
    let mut upstreams = Vec::new();
    let mut upstream_request = None;
    if let (Some(i), Some(compiled)) = (winner, winner.and_then(|i| table.routes.get(i))) {
        let route = shown.routes.get(i);
        if let Some(chain) = &compiled.plugins {
            let global_configs: Vec<v1::Plugin> = shown
                .global_rules
                .iter()
                .flat_map(|g| g.plugins.iter().cloned())
                .collect();
            for p in &chain.global {
                let config = plugin_config(&global_configs, p.name());
                plugins.push(PluginView {
                    name: p.name().into(),
                    scope: "global".into(),
                    priority: p.priority(),
                    note: plugin_note(p.name(), &config),
                });
            }
            for p in chain.route.iter() {
                let config = plugin_config(route.map(|r| &r.plugins[..]).unwrap_or(&[]), p.name());
                plugins.push(PluginView {
                    name: p.name().into(),
                    scope: "route".into(),
                    priority: p.priority(),
                    note: plugin_note(p.name(), &config),
                });
            }
        }
        if let Some(route) = route {
            for b in &route.backends {
                let Some(up) = snapshot.upstreams.iter().find(|u| u.id == b.upstream_id) else {
                    continue;
                };
                upstreams.push(UpstreamView {
                    id: up.id.clone(),
                    weight: b.weight,
                    endpoints: endpoint_views(up, cx),
                });
            }
            upstream_request = Some(upstreamed(route, compiled.plugins.as_ref(), snapshot, req));
        }
    }
    let query = req
        .query
        .as_deref()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    // NB: chosen by the dataplane's own SNI index over certificate ids, which reads no key
    // (a dataplane's snapshot comes redacted).
    let certificate = req.sni.as_deref().map(|sni| match SniIndex::ids(snapshot) {
        Ok(index) => index
            .select(Some(sni))
            .cloned()
            .unwrap_or_else(|| format!("none for {sni:?}: handshake refused")),
        Err(e) => format!("none: the certificates do not compile: {e}"),
    });
    Explanation {
        source: cx.source.clone(),
        request: format!(
            "{} {}://{}{}{} from {}",
            req.method,
            req.scheme,
            req.host.as_deref().unwrap_or(""),
            req.path,
            query,
            req.client_ip
        ),
        certificate,
        matched,
        not_matched,
        plugins,
        upstreams,
        upstream_request,
    }
}

/// The endpoints of `up` with what is known of their health: live, from a running
/// dataplane's metrics, else whether health checks decide it.
pub(crate) fn endpoint_views(up: &v1::Upstream, cx: &Context) -> Vec<EndpointView> {
    let checked = up.health_check.is_some();
    let health = |address: &str| match cx.health.as_ref() {
        Some(h) => match h.get(&(up.id.clone(), address.to_owned())) {
            Some(true) => "healthy (in the dataplane's rotation)".to_owned(),
            Some(false) => "UNHEALTHY (ejected by a health check)".to_owned(),
            None => "unknown (not in the dataplane's metrics)".to_owned(),
        },
        None if checked => "health-checked (state known only to a running dataplane)".into(),
        None => "healthy (no health checks)".into(),
    };
    up.endpoints
        .iter()
        .map(|e| {
            let address = if e.host.contains(':') {
                format!("[{}]:{}", e.host, e.port)
            } else {
                format!("{}:{}", e.host, e.port)
            };
            EndpointView {
                health: health(&address),
                address,
                weight: e.weight,
            }
        })
        .collect()
}

/// The Host, path and headers the upstream receives: the route's own proxy-rewrite plugin
/// (the dataplane's code, run on this request), then the upstream's `pass_host` unless
/// proxy-rewrite set the Host.
fn upstreamed(
    route: &v1::Route,
    chain: Option<&Arc<PluginChain>>,
    snapshot: &v1::Snapshot,
    req: &Request,
) -> Upstreamed {
    let query = req
        .query
        .as_deref()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let mut builder = http::Request::builder()
        .method(req.method.clone())
        .uri(format!("{}{query}", req.path));
    for (name, value) in &req.headers {
        builder = builder.header(name, value);
    }
    if let Some(host) = &req.host
        && !req.headers.contains_key(http::header::HOST)
    {
        builder = builder.header(http::header::HOST, host.as_str());
    }
    let Ok(request) = builder.body(()) else {
        return Upstreamed {
            host: req.host.clone().unwrap_or_default(),
            path: format!("{}{query}", req.path),
            headers: Vec::new(),
            method: None,
        };
    };
    let (mut parts, ()) = request.into_parts();
    let before = parts.headers.clone();
    if let Some(chain) = chain {
        let info = req.info();
        let mut ctx = PluginCtx::new(
            Arc::clone(chain),
            info.remote_addr,
            info.local_addr,
            if req.scheme == "https" {
                "https"
            } else {
                "http"
            },
            Instant::now(),
        );
        // NB: only proxy-rewrite: it changes the request and nothing else (no counters,
        // no I/O); other rewrite-phase plugins (auth, request-id) are described, not run.
        for p in chain.route.iter().filter(|p| p.name() == "proxy-rewrite") {
            let _ = p.rewrite(&mut parts, &mut ctx);
        }
    }
    let rewrote_host = parts.headers.get(http::header::HOST) != before.get(http::header::HOST);
    let mut host = parts
        .headers
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let up = route
        .backends
        .first()
        .and_then(|b| snapshot.upstreams.iter().find(|u| u.id == b.upstream_id));
    if let (Some(up), false) = (up, rewrote_host) {
        match v1::UpstreamPassHost::try_from(up.pass_host) {
            Ok(v1::UpstreamPassHost::Node) => {
                if let Some(e) = up.endpoints.first() {
                    host = if e.port == 80 {
                        e.host.clone()
                    } else {
                        format!("{}:{}", e.host, e.port)
                    };
                }
            }
            Ok(v1::UpstreamPassHost::Rewrite) => host.clone_from(&up.upstream_host),
            _ => {}
        }
    }
    let mut headers = Vec::new();
    for name in parts.headers.keys() {
        if name == http::header::HOST {
            continue;
        }
        let after: Vec<&HeaderValue> = parts.headers.get_all(name).iter().collect();
        let was: Vec<&HeaderValue> = before.get_all(name).iter().collect();
        if after != was {
            for v in after {
                headers.push(shown_header(&format!(
                    "{name}: {}",
                    String::from_utf8_lossy(v.as_bytes())
                )));
            }
        }
    }
    for name in before.keys() {
        if !parts.headers.contains_key(name) {
            headers.push(format!("{name}: (removed)"));
        }
    }
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
    let method = (parts.method != req.method).then(|| parts.method.to_string());
    Upstreamed {
        host,
        path,
        headers,
        method,
    }
}

/// Whether a header's value is a credential: shown as `<redacted>`, like the snapshot's
/// secret fields.
fn secret_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    matches!(
        n.as_str(),
        "authorization" | "proxy-authorization" | "cookie" | "set-cookie"
    ) || [
        "token", "secret", "password", "api-key", "apikey", "session",
    ]
    .iter()
    .any(|w| n.contains(w))
}

/// `config` with the values of credential headers (`headers`, flat or `set`/`add`) hidden.
fn masked_headers(config: &serde_json::Value) -> serde_json::Value {
    fn mask(map: &mut serde_json::Map<String, serde_json::Value>) {
        for (name, value) in map.iter_mut() {
            match value {
                serde_json::Value::Object(inner) => mask(inner),
                v if secret_header(name) && !v.is_null() => {
                    *v = sluice_dataplane::config::redact::REDACTED.into();
                }
                _ => {}
            }
        }
    }
    let mut c = config.clone();
    if let Some(serde_json::Value::Object(h)) = c.get_mut("headers") {
        mask(h);
    }
    c
}

/// `name: value` with a credential's value hidden.
fn shown_header(line: &str) -> String {
    match line.split_once(": ") {
        Some((name, value)) if secret_header(name) && value != "(removed)" => {
            format!("{name}: {}", sluice_dataplane::config::redact::REDACTED)
        }
        _ => line.to_owned(),
    }
}

/// Appends `text` to `out` as lines of at most [`WIDTH`] columns: the first starts with
/// `first` (a label), the others with as many spaces.
pub(crate) fn para(out: &mut String, first: &str, text: &str) {
    let indent = " ".repeat(first.chars().count());
    let lines = wrap(text, WIDTH, &indent);
    for (i, line) in lines.iter().enumerate() {
        if i == 0 {
            let _ = writeln!(out, "{first}{}", &line[indent.len()..]);
        } else {
            let _ = writeln!(out, "{line}");
        }
    }
    if lines.is_empty() {
        let _ = writeln!(out, "{}", first.trim_end());
    }
}

impl Explanation {
    /// Text for an 80-column terminal.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        if !self.source.is_empty() {
            para(&mut out, "Source:   ", &self.source);
        }
        para(&mut out, "Request:  ", &self.request);
        if let Some(c) = &self.certificate {
            para(&mut out, "TLS:      ", &format!("certificate {c}"));
        }
        match &self.matched {
            Some(m) => {
                para(&mut out, "Route:    ", &format!("{} ({})", m.id, m.source));
                para(
                    &mut out,
                    "  why:    ",
                    &format!(
                        "{}, {}, priority {}; the first candidate whose methods, \
                         remoteAddrs and exprs all match",
                        m.host, m.path, m.priority
                    ),
                );
            }
            None => para(&mut out, "Route:    ", "none: the dataplane answers 404"),
        }
        if !self.not_matched.is_empty() {
            let _ = writeln!(out, "Checked before, did not match:");
            for c in self.not_matched.iter().take(MAX_CANDIDATES) {
                para(
                    &mut out,
                    "  ",
                    &format!("{} ({}, {}, priority {})", c.id, c.host, c.path, c.priority),
                );
                para(&mut out, "    ", c.failed.as_deref().unwrap_or_default());
            }
            if self.not_matched.len() > MAX_CANDIDATES {
                let _ = writeln!(
                    out,
                    "  ... and {} more (-o yaml lists all)",
                    self.not_matched.len() - MAX_CANDIDATES
                );
            }
        }
        if self.matched.is_some() {
            if self.plugins.is_empty() {
                let _ = writeln!(out, "Plugins:  none");
            } else {
                let _ = writeln!(out, "Plugins (in execution order):");
                for (n, p) in self.plugins.iter().enumerate() {
                    para(
                        &mut out,
                        "  ",
                        &format!(
                            "{}. {} ({}, priority {})",
                            n + 1,
                            p.name,
                            p.scope,
                            p.priority
                        ),
                    );
                    if let Some(note) = &p.note {
                        para(&mut out, "     ", note);
                    }
                }
            }
            for u in &self.upstreams {
                para(
                    &mut out,
                    "Upstream: ",
                    &format!("{} (weight {})", u.id, u.weight),
                );
                if u.endpoints.is_empty() {
                    let _ = writeln!(out, "  no endpoints: the dataplane answers 503");
                }
                for e in &u.endpoints {
                    para(
                        &mut out,
                        "  ",
                        &format!("{} weight {}: {}", e.address, e.weight, e.health),
                    );
                }
            }
            if let Some(u) = &self.upstream_request {
                let method = u
                    .method
                    .as_deref()
                    .map(|m| format!("method {m}, "))
                    .unwrap_or_default();
                para(
                    &mut out,
                    "Sent upstream: ",
                    &format!("{method}Host {}, path {}", u.host, u.path),
                );
                for h in &u.headers {
                    para(&mut out, "  ", h);
                }
            }
        }
        out
    }
}
