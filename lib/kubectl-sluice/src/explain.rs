//! `explain`: which route serves a request and why, with the dataplane's own router
//! ([`Router::explain`](sluice_dataplane::router::Router::explain), which walks candidates in
//! the order [`Router::lookup`](sluice_dataplane::router::Router::lookup) does) and the
//! plugin chains of the compiled [`RouteTable`].

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use serde::Serialize;
use sluice_dataplane::config::redact::redacted;
use sluice_dataplane::config::table::RouteTable;
use sluice_dataplane::router::{Candidate, HostClass, Mismatch, PathKind, RequestInfo};
use sluice_proto::v1;

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
    /// Headers set by proxy-rewrite (`name: value`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<String>,
}

/// The result of `explain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
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
fn plugin_note(name: &str, config: &serde_json::Value) -> Option<String> {
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
        | "consumer-restriction" => Some(config.to_string()),
        _ => None,
    }
}

fn plugin_config(list: &[v1::Plugin], name: &str) -> serde_json::Value {
    list.iter()
        .find(|p| p.name == name)
        .and_then(|p| serde_json::from_str(&p.config_json).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// Explains `req` against a compiled table and the snapshot it was compiled from.
pub fn explain(table: &RouteTable, snapshot: &v1::Snapshot, req: &Request) -> Explanation {
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
                let checked = up.health_check.is_some();
                upstreams.push(UpstreamView {
                    id: up.id.clone(),
                    weight: b.weight,
                    endpoints: up
                        .endpoints
                        .iter()
                        .map(|e| EndpointView {
                            address: if e.host.contains(':') {
                                format!("[{}]:{}", e.host, e.port)
                            } else {
                                format!("{}:{}", e.host, e.port)
                            },
                            weight: e.weight,
                            health: if checked {
                                "health-checked (state known only to a running dataplane)".into()
                            } else {
                                "healthy (no health checks)".into()
                            },
                        })
                        .collect(),
                });
            }
            upstream_request = Some(upstreamed(route, snapshot, req));
        }
    }
    let query = req
        .query
        .as_deref()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let certificate = req.sni.as_deref().and_then(|sni| {
        table
            .tls
            .select(Some(sni))
            .map(|e| e.id.clone())
            .or_else(|| Some(format!("none for {sni:?}: handshake refused")))
    });
    Explanation {
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

/// The Host and path the upstream receives: the upstream's `pass_host`, then proxy-rewrite.
fn upstreamed(route: &v1::Route, snapshot: &v1::Snapshot, req: &Request) -> Upstreamed {
    let up = route
        .backends
        .first()
        .and_then(|b| snapshot.upstreams.iter().find(|u| u.id == b.upstream_id));
    let mut host = req.host.clone().unwrap_or_default();
    if let Some(up) = up {
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
            Ok(v1::UpstreamPassHost::Rewrite) => host = up.upstream_host.clone(),
            _ => {}
        }
    }
    let query = req
        .query
        .as_deref()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let mut path = format!("{}{query}", req.path);
    let mut headers = Vec::new();
    let rewrite = plugin_config(&route.plugins, "proxy-rewrite");
    if let Some(h) = field(&rewrite, "host") {
        host = h;
    }
    if let Some(uri) = field(&rewrite, "uri") {
        path = uri;
    } else if let Some(re) = rewrite.get("regex_uri") {
        path = format!("{path} (rewritten by regex_uri {re})");
    }
    if let Some(serde_json::Value::Object(h)) = rewrite.get("headers") {
        // Both the flat form and the `set`/`add` form.
        for (k, v) in h {
            match v {
                serde_json::Value::Object(inner) => {
                    for (k2, v2) in inner {
                        headers.push(format!("{k2}: {} ({k})", v2.as_str().unwrap_or_default()));
                    }
                }
                other => headers.push(format!("{k}: {}", other.as_str().unwrap_or_default())),
            }
        }
    }
    Upstreamed {
        host,
        path,
        headers,
    }
}

impl Explanation {
    /// Text for a terminal.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Request:  {}", self.request);
        if let Some(c) = &self.certificate {
            let _ = writeln!(out, "TLS:      certificate {c}");
        }
        match &self.matched {
            Some(m) => {
                let _ = writeln!(out, "Route:    {} ({})", m.id, m.source);
                let _ = writeln!(
                    out,
                    "  why:    {}, {}, priority {}; first candidate whose methods, \
                     remoteAddrs and exprs all match",
                    m.host, m.path, m.priority
                );
            }
            None => {
                let _ = writeln!(out, "Route:    none: the dataplane answers 404");
            }
        }
        if !self.not_matched.is_empty() {
            let _ = writeln!(out, "Checked before, did not match:");
            for c in self.not_matched.iter().take(MAX_CANDIDATES) {
                let _ = writeln!(
                    out,
                    "  {} ({}, {}, priority {})",
                    c.id, c.host, c.path, c.priority
                );
                let _ = writeln!(out, "    {}", c.failed.as_deref().unwrap_or_default());
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
                    let _ = writeln!(
                        out,
                        "  {}. {} ({}, priority {})",
                        n + 1,
                        p.name,
                        p.scope,
                        p.priority
                    );
                    if let Some(note) = &p.note {
                        let _ = writeln!(out, "     {note}");
                    }
                }
            }
            for u in &self.upstreams {
                let _ = writeln!(out, "Upstream: {} (weight {})", u.id, u.weight);
                if u.endpoints.is_empty() {
                    let _ = writeln!(out, "  no endpoints: the dataplane answers 503");
                }
                for e in &u.endpoints {
                    let _ = writeln!(out, "  {} weight {}: {}", e.address, e.weight, e.health);
                }
            }
            if let Some(u) = &self.upstream_request {
                let _ = writeln!(out, "Sent upstream: Host {}, path {}", u.host, u.path);
                for h in &u.headers {
                    let _ = writeln!(out, "  {h}");
                }
            }
        }
        out
    }
}
