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
//!   `percent` / `fraction` as `sample_ratio` (one plugin per mirror, several per rule);
//!   `CORS` → `cors` (see [`super::filters::cors`]: preflights answered without the
//!   backend). Header values are literal (`$` is escaped for the plugins' templates).
//! - `timeouts` and `retry`: see `timeouts.rs` (invalid values leave the rule out).
//! - Filters on one backendRef: `RequestHeaderModifier` / `ResponseHeaderModifier` →
//!   `Backend.plugins` (`proxy-rewrite` / `response-rewrite` headers), run for the requests
//!   the weighted split sends to that backend only, after the rule's own filters.
//! - Unsupported, reported with `UnsupportedValue` and the rule left out of the snapshot
//!   (`PartiallyInvalid=True`, or `Accepted=False` when no rule is left): `ExtensionRef`,
//!   other filters on a backendRef (and any on a GRPCRoute backendRef).
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
//!   WebSocket upgrades. A backend Service port targeted by a BackendTLSPolicy is spoken to
//!   over verified TLS (`backend_tls.rs`); a mirror to one is refused (mirrors are plain
//!   text).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;
use sluice_crds::gateway::{
    BackendObjectReference, GRPCRoute, GrpcRouteRule, HTTPRoute, HttpRouteRule, ParentReference,
    ReferenceGrant,
};
use sluice_proto::v1;

use super::filters::{Filters, backend_plugins, plugins};
use super::matches::{Match, expr, grpc_match, http_match};
use super::{RESOLVED_REFS, RouteKind, Slot, cond, reason};
use crate::Index;
use crate::status::Condition;
use crate::upstream::UpstreamObject;

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
    /// A TLSRoute, TCPRoute or UDPRoute: its rules are translated by [`super::stream`].
    Stream,
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

    /// A TLSRoute, TCPRoute or UDPRoute, for attachment.
    pub(crate) fn stream(
        kind: RouteKind,
        meta: &'a ObjectMeta,
        parent_refs: &'a [ParentReference],
        hostnames: &'a [String],
    ) -> Self {
        let (ns, name) = crate::key(meta);
        Self {
            kind,
            ns,
            name,
            meta,
            parent_refs,
            hostnames,
            rules: Rules::Stream,
        }
    }

    pub(crate) fn id_prefix(&self) -> &'static str {
        match self.kind {
            RouteKind::HttpRoute => "httproute",
            RouteKind::GrpcRoute => "grpcroute",
            RouteKind::TlsRoute => "tlsroute",
            RouteKind::TcpRoute => "tcproute",
            RouteKind::UdpRoute => "udproute",
        }
    }
}

pub(crate) struct Ctx<'c, 'a> {
    pub(crate) idx: &'c Index<'a>,
    pub(crate) aus: &'c BTreeMap<(&'a str, &'a str), Result<UpstreamObject, ()>>,
    pub(crate) grants: &'c [ReferenceGrant],
    pub(crate) tls_policies: &'c super::backend_tls::Policies<'a>,
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
        Rules::Stream => 0,
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
    /// (backend, weight, the plugins of its own filters).
    backend_refs: Vec<(&'r BackendObjectReference, i32, Vec<v1::Plugin>)>,
    /// `timeouts` (HTTPRoute).
    timeout: Option<v1::Timeouts>,
    /// `retry` (HTTPRoute).
    retry: Option<v1::RetryPolicy>,
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
            "RequestMirror" => match &f.request_mirror {
                Some(m) => filters.mirrors.push((k, m)),
                None => problems.push(format!("{ff}: requestMirror is required")),
            },
            "CORS" => match &f.cors {
                Some(c) => filters.cors = Some(c),
                None => problems.push(format!("{ff}: cors is required")),
            },
            other => problems.push(format!("{ff}: {other} filters are not supported")),
        }
    }
    parts.timeout = rule
        .timeouts
        .as_ref()
        .and_then(|t| super::timeouts::route_timeouts(t, &format!("{field}.timeouts"), problems));
    parts.retry = rule
        .retry
        .as_ref()
        .and_then(|r| super::timeouts::retry_policy(r, &format!("{field}.retry"), problems));
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
    for (k, b) in rule.backend_refs.iter().enumerate() {
        let plugins = backend_plugins(&b.filters, &format!("{field}.backendRefs[{k}]"))
            .unwrap_or_else(|e| {
                problems.push(e);
                Vec::new()
            });
        parts
            .backend_refs
            .push((&b.backend, b.weight.unwrap_or(1), plugins));
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
    for (k, b) in rule.backend_refs.iter().enumerate() {
        if !b.filters.is_empty() {
            problems.push(format!(
                "{field}.backendRefs[{k}].filters: filters on one backendRef of a GRPCRoute \
                 are not supported"
            ));
        }
        parts
            .backend_refs
            .push((&b.backend, b.weight.unwrap_or(1), Vec::new()));
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
            Rules::Stream => return,
        };
        // Backends (resolved even for a rule left out, so ResolvedRefs tells the whole story).
        let (backends, websocket) = self.backends(&parts, &field);
        let extra_plugins = self.extra_plugins(&parts.filters, &backends, &field, &mut problems);
        let backends = self.with_no_backend(backends);
        let rule = Rule {
            i,
            field: &field,
            filters: &parts.filters,
            backends: &backends,
            extra_plugins: &extra_plugins,
            websocket,
            timeout: parts.timeout.as_ref(),
            retry: parts.retry.as_ref(),
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
    fn backends(&mut self, parts: &RuleParts<'_>, field: &str) -> ((Vec<v1::Backend>, u32), bool) {
        let mut backends = Vec::new();
        let mut invalid_weight: u32 = 0;
        let mut websocket = false;
        for (k, (b, weight, plugins)) in parts.backend_refs.iter().enumerate() {
            let bf = format!("{field}.backendRefs[{k}]");
            let up = self
                .ctx
                .backend(b, self.route, &bf, &mut self.unresolved, &mut websocket);
            let weight = u32::try_from(*weight).unwrap_or(0);
            match up {
                Some(up) if weight > 0 => {
                    backends.push(v1::Backend {
                        upstream_id: up.id.clone(),
                        weight,
                        plugins: plugins.clone(),
                    });
                    self.upstreams.push(up);
                }
                Some(_) => {}
                None => invalid_weight = invalid_weight.saturating_add(weight),
            }
        }
        ((backends, invalid_weight), websocket)
    }

    /// The mirror plugins, and the fault-injection plugin answering 500 when there is nothing
    /// to proxy to and no redirect answers by itself.
    fn extra_plugins(
        &mut self,
        filters: &Filters<'_>,
        (backends, _): &(Vec<v1::Backend>, u32),
        field: &str,
        problems: &mut Vec<String>,
    ) -> Vec<v1::Plugin> {
        let mut extra_plugins = Vec::new();
        for &(k, mf) in &filters.mirrors {
            let mfield = format!("{field}.filters[{k}].requestMirror.backendRef");
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
            plugins: Vec::new(),
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
                    timeout: rule.timeout.cloned(),
                    retry: rule.retry.cloned(),
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
    timeout: Option<&'a v1::Timeouts>,
    retry: Option<&'a v1::RetryPolicy>,
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
