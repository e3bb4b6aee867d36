//! The plugin chain: a [`Plugin`] trait with explicit phases, APISIX priorities, a
//! per-request [`PluginCtx`], and chains compiled per route when a snapshot compiles.
//!
//! ```text
//!            request
//!               │
//!  ┌────────────▼─────────────┐  global rules first (ApisixGlobalRule), then the route's
//!  │ rewrite   (high → low)   │  plugins; in each, higher priority first. Auth plugins
//!  │ access    (high → low)   │  (key-auth 2500 ...) identify the consumer in rewrite;
//!  └────────────┬─────────────┘  the consumer's plugins then merge into the route's.
//!               │ any phase may answer (short-circuit) ─────────────────┐
//!  ┌────────────▼─────────────┐                                         │
//!  │ before_proxy             │  on the upstream request head           │
//!  └────────────┬─────────────┘                                         │
//!   upstream: traffic-split's choice (access, 966), else the route's     │
//!   weighted backends; then an endpoint (or an error: 502/503/504)       │
//!  ┌────────────▼─────────────┐                                         │
//!  │ response_headers         │◀────────────────────────────────────────┘
//!  │ body_filter (streaming)  │  per chunk, never buffering unless a plugin must
//!  │ log                      │  when the body has been sent (or dropped)
//!  └──────────────────────────┘
//! ```
//!
//! A route without plugins (and no global rules) has no chain at all: the request path
//! checks one `Option` and pays nothing else.
//!
//! # Adding a plugin
//!
//! 1. Its typed config: `lib/plugin-config/src/<plugin>.rs` + one line in
//!    `sluice_plugin_config::REGISTRY` (translate then validates it too).
//! 2. Its behaviour: one file `src/plugins/<plugin>.rs` with a type implementing
//!    [`Plugin`] (override only the phases it needs) and
//!    `pub fn build(config_json: &str, cx: &BuildCtx) -> Result<Arc<dyn Plugin>, ConfigError>`
//!    that parses with `sluice_plugin_config::parse_json::<Config>` — once, at compile time.
//! 3. One line in [`BUILDERS`] below (and `mod <plugin>;`).
//!
//! State that must survive snapshot reloads (rate-limit counters, metrics, Redis clients)
//! lives in [`PluginState`], which the [`crate::config::store::Store`] keeps for the process.

pub mod api_breaker;
pub mod basic_auth;
pub mod client_control;
pub mod consumer;
pub mod consumer_restriction;
pub mod cors;
pub mod csrf;
pub mod fasthash;
pub mod fault_injection;
pub mod file_logger;
pub mod forward_auth;
pub mod gzip;
pub mod hmac_auth;
pub mod http_logger;
pub mod ip_restriction;
pub mod jwt_auth;
pub mod key_auth;
pub mod limit_conn;
pub mod limit_count;
pub mod limit_req;
pub mod log;
pub mod openid_connect;
pub mod opentelemetry;
pub mod post;
pub mod prometheus;
pub mod proxy_mirror;
pub mod proxy_rewrite;
pub mod real_ip;
pub mod redirect;
pub mod redis;
pub mod request_id;
pub mod request_validation;
pub mod response_rewrite;
pub mod rewrite;
pub mod state;
pub mod traffic_split;
pub mod ua_restriction;
pub mod uri_blocker;
pub mod vars;

use std::any::Any;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode, request, response};
use http_body::{Body, Frame};
use sluice_plugin_config::ConfigError;
use sluice_proto::v1;

use crate::upstream::body::ProxyBody;
use crate::upstream::h1::H1Error;
use crate::upstream::request_body::RequestBody;

pub use consumer::{Consumer, ConsumerTable};
pub use state::PluginState;

/// The outcome of a request phase that may have to wait (e.g. for Redis).
pub type PhaseResult = Result<(), Box<Response<ProxyBody>>>;

/// What a request phase decided.
pub enum Flow<'a> {
    /// Go on with the next plugin.
    Continue,
    /// Answer the client with this response; later request phases and the upstream are
    /// skipped (response phases and log still run).
    Respond(Box<Response<ProxyBody>>),
    /// The decision needs I/O; await it. Only plugins that really wait allocate this.
    Pending(Pin<Box<dyn Future<Output = PhaseResult> + Send + 'a>>),
}

impl Flow<'_> {
    /// Answers the client with `resp`.
    pub fn respond(resp: Response<ProxyBody>) -> Self {
        Flow::Respond(Box::new(resp))
    }
}

impl std::fmt::Debug for Flow<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Flow::Continue => f.write_str("Continue"),
            Flow::Respond(r) => write!(f, "Respond({})", r.status()),
            Flow::Pending(_) => f.write_str("Pending"),
        }
    }
}

/// The request phases a plugin implements (see [`Plugin::phases`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phases(u8);

impl Phases {
    /// No request phase (e.g. a plugin that only logs).
    pub const NONE: Phases = Phases(0);
    /// [`Plugin::rewrite`].
    pub const REWRITE: Phases = Phases(1);
    /// [`Plugin::access`].
    pub const ACCESS: Phases = Phases(2);
    /// [`Plugin::before_proxy`].
    pub const BEFORE_PROXY: Phases = Phases(4);
    /// Every request phase.
    pub const ALL: Phases = Phases(7);

    /// Both sets.
    pub const fn with(self, other: Phases) -> Phases {
        Phases(self.0 | other.0)
    }

    /// Whether every phase of `other` is in `self`.
    pub const fn has(self, other: Phases) -> bool {
        self.0 & other.0 == other.0
    }
}

/// A streaming transformation of the response body, made per request by
/// [`Plugin::body_filter`].
pub trait BodyFilter: Send {
    /// Transforms one chunk (may return an empty chunk to hold data back).
    fn data(&mut self, chunk: Bytes, ctx: &mut PluginCtx) -> Bytes;
    /// The body ended: anything still held back. Default: nothing.
    fn end(&mut self, _ctx: &mut PluginCtx) -> Option<Bytes> {
        None
    }

    /// Whether the filter forwards every byte unchanged (a tee): the response then keeps
    /// its `Content-Length`. Default false.
    fn keeps_length(&self) -> bool {
        false
    }
}

/// A plugin instance, built from its typed config when a snapshot compiles and shared by
/// every request of the route. Every phase has a no-op default.
pub trait Plugin: Send + Sync + std::fmt::Debug {
    /// APISIX name, e.g. `limit-count`.
    fn name(&self) -> &'static str;

    /// APISIX priority: within a phase, higher runs first.
    fn priority(&self) -> i32;

    /// Rewrite phase: change the request, identify the consumer (auth plugins).
    fn rewrite<'a>(&'a self, _req: &'a mut request::Parts, _ctx: &'a mut PluginCtx) -> Flow<'a> {
        Flow::Continue
    }

    /// Access phase: allow, deny or delay (limits, restrictions).
    fn access<'a>(&'a self, _req: &'a mut request::Parts, _ctx: &'a mut PluginCtx) -> Flow<'a> {
        Flow::Continue
    }

    /// The request phases this plugin implements; a chain calls only these. Default: all.
    /// NB: each call through `dyn Plugin` is an indirect branch and ~12 instructions; a
    /// route with limit-count and prometheus made five calls that did nothing (issue 4).
    fn phases(&self) -> Phases {
        Phases::ALL
    }

    /// Before proxy: last changes to the request head that goes upstream.
    fn before_proxy(&self, _req: &mut request::Parts, _ctx: &mut PluginCtx) {}

    /// Response headers phase: the response head (upstream's, an error's, or a plugin's).
    fn response_headers(&self, _resp: &mut response::Parts, _ctx: &mut PluginCtx) {}

    /// A streaming body filter for this response, if the plugin transforms bodies.
    fn body_filter(&self, _ctx: &mut PluginCtx) -> Option<Box<dyn BodyFilter>> {
        None
    }

    /// Whether the plugin encodes the response (gzip): its response phases then run after
    /// every other plugin's, so it sees the final headers and body (as nginx's gzip filter
    /// runs after the Lua filters). Default false.
    fn encodes_body(&self) -> bool {
        false
    }

    /// Whether [`Plugin::log`] does anything; the body is only wrapped when some plugin
    /// logs or filters.
    fn wants_log(&self) -> bool {
        false
    }

    /// Whether [`Plugin::response_headers`], [`Plugin::body_filter`] or
    /// [`Plugin::encodes_body`] may do anything. `false` lets a chain whose plugins all say
    /// so skip the response phases (three virtual calls per plugin and pass). Default true.
    fn has_response_phases(&self) -> bool {
        true
    }

    /// Log phase: after the response body was sent (or the client went away).
    fn log(&self, _ctx: &mut PluginCtx) {}

    /// Whether the log phase needs the request head as it arrived
    /// ([`PluginCtx::request_head`]): a chain with such a plugin copies it before the
    /// request phases. Default false (the copy costs an allocation per request).
    fn wants_request_head(&self) -> bool {
        false
    }

    /// Whether a request phase reads the request body ([`PluginCtx::read_body`]): the
    /// request path then lends the body to the phases of the routes with this plugin.
    /// Default false: plugins see the head only and the body streams upstream.
    fn reads_body(&self) -> bool {
        false
    }
}

/// What a plugin's `build` gets besides its config.
#[derive(Debug)]
pub struct BuildCtx<'a> {
    /// Id of the route (or `global-rule:<id>`, `consumer:<name>`) the plugin is built for.
    pub owner: &'a str,
    /// Process-wide state that outlives snapshots.
    pub state: &'a PluginState,
    /// The snapshot's consumers.
    pub consumers: &'a Arc<ConsumerTable>,
    /// The snapshot's upstreams by id, for plugins that pick one (traffic-split); `None`
    /// where there is no route to pick for (global rules, consumers).
    pub upstreams: Option<&'a UpstreamMap<'a>>,
}

/// A snapshot's compiled upstreams by id.
pub type UpstreamMap<'a> = std::collections::HashMap<&'a str, Arc<crate::upstream::Upstream>>;

/// Builds one plugin from its canonical JSON config.
pub type BuildFn = fn(&str, &BuildCtx<'_>) -> Result<Arc<dyn Plugin>, ConfigError>;

/// Every plugin the dataplane can run. Adding a plugin = one line here.
pub const BUILDERS: &[(&str, BuildFn)] = &[
    ("limit-count", limit_count::build),
    ("prometheus", prometheus::build),
    ("key-auth", key_auth::build),
    ("basic-auth", basic_auth::build),
    ("jwt-auth", jwt_auth::build),
    ("consumer-restriction", consumer_restriction::build),
    ("limit-req", limit_req::build),
    ("limit-conn", limit_conn::build),
    ("proxy-rewrite", proxy_rewrite::build),
    ("cors", cors::build),
    ("redirect", redirect::build),
    ("ip-restriction", ip_restriction::build),
    ("real-ip", real_ip::build),
    ("request-id", request_id::build),
    ("response-rewrite", response_rewrite::build),
    ("fault-injection", fault_injection::build),
    ("gzip", gzip::build),
    ("traffic-split", traffic_split::build),
    ("ua-restriction", ua_restriction::build),
    ("uri-blocker", uri_blocker::build),
    ("client-control", client_control::build),
    ("csrf", csrf::build),
    ("hmac-auth", hmac_auth::build),
    ("api-breaker", api_breaker::build),
    ("forward-auth", forward_auth::build),
    ("openid-connect", openid_connect::build),
    ("opentelemetry", opentelemetry::build),
    ("http-logger", http_logger::build),
    ("file-logger", file_logger::build),
    ("proxy-mirror", proxy_mirror::build),
    ("request-validation", request_validation::build),
];

/// Builds plugin `p` for `cx.owner`.
pub fn build(p: &v1::Plugin, cx: &BuildCtx<'_>) -> Result<Arc<dyn Plugin>, ConfigError> {
    let Some((_, f)) = BUILDERS.iter().find(|(n, _)| *n == p.name) else {
        return Err(sluice_plugin_config::not_found(&p.name));
    };
    if !cx.state.is_enabled(&p.name) {
        return Err(ConfigError::NotEnabled(p.name.clone()));
    }
    f(&p.config_json, cx)
}

/// Builds `plugins` and sorts them by priority (higher first; equal priorities keep their
/// order).
pub fn build_sorted(
    plugins: &[v1::Plugin],
    cx: &BuildCtx<'_>,
) -> Result<Vec<Arc<dyn Plugin>>, ConfigError> {
    let mut out = Vec::with_capacity(plugins.len());
    for p in plugins {
        out.push(build(p, cx)?);
    }
    out.sort_by_key(|p| std::cmp::Reverse(p.priority()));
    Ok(out)
}

/// A priority-sorted list of plugins split by phase: each phase's list holds the plugins
/// that implement it ([`Plugin::phases`], [`Plugin::wants_log`]), in order.
#[derive(Debug, Default)]
struct ByPhase {
    rewrite: Box<[Arc<dyn Plugin>]>,
    access: Box<[Arc<dyn Plugin>]>,
    before_proxy: Box<[Arc<dyn Plugin>]>,
    log: Box<[Arc<dyn Plugin>]>,
}

impl ByPhase {
    fn new(plugins: &[Arc<dyn Plugin>]) -> Self {
        let with = |phase: Phases| -> Box<[Arc<dyn Plugin>]> {
            plugins
                .iter()
                .filter(|p| p.phases().has(phase))
                .cloned()
                .collect()
        };
        ByPhase {
            rewrite: with(Phases::REWRITE),
            access: with(Phases::ACCESS),
            before_proxy: with(Phases::BEFORE_PROXY),
            log: plugins.iter().filter(|p| p.wants_log()).cloned().collect(),
        }
    }
}

/// The plugins of one route: global rules' and the route's own, each sorted by priority.
#[derive(Debug)]
pub struct PluginChain {
    /// The route id (metrics label, `route_id` variable).
    pub route_id: Arc<str>,
    /// The route's first path pattern (`matched_uri` label).
    pub matched_uri: Arc<str>,
    /// The route's first host pattern (`matched_host` label), empty for any host.
    pub matched_host: Arc<str>,
    /// Plugins of global rules (run first).
    pub global: Vec<Arc<dyn Plugin>>,
    /// The route's plugins.
    pub route: Arc<[Arc<dyn Plugin>]>,
    /// The snapshot's consumers (consumer plugins merge into `route`).
    pub consumers: Arc<ConsumerTable>,
    wrap_body: bool,
    /// Whether a plugin of `global`, `route` or a consumer reads the request body.
    reads_body: bool,
    /// Whether a plugin of `global` or `route` has response phases.
    response_phases: bool,
    /// Whether a plugin of `global` or `route` wants [`PluginCtx::request_head`].
    capture_head: bool,
    /// `global` by phase.
    global_by: ByPhase,
    /// `route` by phase.
    route_by: ByPhase,
}

impl PluginChain {
    /// A chain; `None` when there is nothing to run.
    pub fn new(
        route: &v1::Route,
        global: Vec<Arc<dyn Plugin>>,
        plugins: Vec<Arc<dyn Plugin>>,
        consumers: Arc<ConsumerTable>,
    ) -> Option<Arc<Self>> {
        if global.is_empty() && plugins.is_empty() {
            return None;
        }
        let wrap_body =
            consumers.any_wants_log() || global.iter().chain(plugins.iter()).any(|p| p.wants_log());
        let response_phases = global
            .iter()
            .chain(plugins.iter())
            .any(|p| p.has_response_phases());
        let capture_head = consumers.any_wants_request_head()
            || global
                .iter()
                .chain(plugins.iter())
                .any(|p| p.wants_request_head());
        let reads_body = consumers.any_reads_body()
            || global.iter().chain(plugins.iter()).any(|p| p.reads_body());
        let global_by = ByPhase::new(&global);
        let route_by = ByPhase::new(&plugins);
        Some(Arc::new(PluginChain {
            route_id: Arc::from(route.id.as_str()),
            matched_uri: Arc::from(route.paths.first().map(String::as_str).unwrap_or("")),
            matched_host: Arc::from(route.hosts.first().map(String::as_str).unwrap_or("")),
            global,
            route: Arc::from(plugins),
            consumers,
            wrap_body,
            reads_body,
            response_phases,
            capture_head,
            global_by,
            route_by,
        }))
    }
}

impl PluginChain {
    /// Whether a plugin of the chain (or of a consumer) reads the request body: the request
    /// path then lends it to the request phases ([`PluginCtx::read_body`]).
    #[inline]
    pub fn reads_body(&self) -> bool {
        self.reads_body
    }
}

/// Why [`PluginCtx::read_body`] has no body to give.
#[derive(Debug)]
pub enum ReadBodyError {
    /// The body is larger than the cap (bytes).
    TooLarge(u64),
    /// The client paused longer than its body timeout between two pieces.
    Timeout,
    /// The client's body broke off (connection closed, bad framing).
    Broken(hyper::Error),
    /// The body was not lent to the phases (a bug: the plugin does not say
    /// [`Plugin::reads_body`]), or was read already and found too large.
    NotLent,
}

/// Per-request state shared by the plugins of one request.
///
/// NB: the clock is read twice per request with plugins (arrival, upstream attempt) and
/// once more by a plugin that measures (prometheus, at the end): each read costs ~30 ns.
pub struct PluginCtx {
    /// The route's chain.
    pub chain: Arc<PluginChain>,
    /// Client address.
    pub remote_addr: SocketAddr,
    /// Local address the request arrived on.
    pub local_addr: SocketAddr,
    /// `http` or `https`.
    pub scheme: &'static str,
    /// When the request arrived.
    pub started: Instant,
    /// The authenticated consumer, set by an auth plugin in rewrite.
    pub consumer: Option<Arc<Consumer>>,
    /// The upstream endpoint's pool, once picked (its address is the `node` label).
    pub upstream: Option<Arc<crate::upstream::Pool>>,
    /// When the (last) upstream attempt started. The upstream's time runs from here to the
    /// end of the response (the log phase), as nginx's `$upstream_response_time` runs to
    /// the end of the upstream's body.
    pub upstream_started: Option<Instant>,
    /// When the response ended, set before the log phase when the proxy read the clock for
    /// it already (see [`PluginCtx::end_time`]).
    pub ended: Option<Instant>,
    /// The upstream traffic-split chose for this request instead of the route's backends.
    pub split_upstream: Option<Arc<crate::upstream::Upstream>>,
    /// Response status (set before the response phases).
    pub status: StatusCode,
    /// Request head + body bytes received (approximate head size).
    pub request_bytes: u64,
    /// Response body bytes sent.
    pub response_body_bytes: u64,
    /// Response head bytes (approximate).
    pub response_head_bytes: u64,
    /// Headers request phases want on the response.
    pub response_headers: Vec<(HeaderName, HeaderValue)>,
    /// The `X-RateLimit-*` headers limit-count wants on the response.
    pub quota: Option<limit_count::Quota>,
    /// The request's trace context, set by opentelemetry's rewrite (a field, not an
    /// extension: no allocation per traced request).
    pub trace: Option<opentelemetry::TraceContext>,
    /// The route's plugins merged with the consumer's, when the consumer has plugins.
    merged: Option<Arc<[Arc<dyn Plugin>]>>,
    /// Values kept until the request ends (e.g. a limit-conn slot released on drop).
    keep: Vec<Box<dyn Any + Send>>,
    /// Typed per-request values plugins hand from request to response phases (e.g. the
    /// request's `Origin` for cors, a copy of the request head).
    pub extensions: http::Extensions,
    /// The request head as it arrived, for the log phase; only when a plugin of the chain
    /// or a consumer's asks for it ([`Plugin::wants_request_head`]).
    pub request_head: Option<Box<request::Parts>>,
    /// The request body lent to the request phases (when [`PluginChain::reads_body`]),
    /// with the client's body timeout (longest pause between two pieces).
    lent_body: Option<Box<(RequestBody, std::time::Duration)>>,
}

impl std::fmt::Debug for PluginCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginCtx")
            .field("route", &self.chain.route_id)
            .field("consumer", &self.consumer.as_ref().map(|c| &c.name))
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl PluginCtx {
    /// A context for one request on `chain`.
    #[inline(always)]
    pub fn new(
        chain: Arc<PluginChain>,
        remote_addr: SocketAddr,
        local_addr: SocketAddr,
        scheme: &'static str,
        started: Instant,
    ) -> Self {
        PluginCtx {
            chain,
            remote_addr,
            local_addr,
            scheme,
            started,
            consumer: None,
            upstream: None,
            upstream_started: None,
            ended: None,
            split_upstream: None,
            status: StatusCode::OK,
            request_bytes: 0,
            response_body_bytes: 0,
            response_head_bytes: 0,
            response_headers: Vec::new(),
            quota: None,
            trace: None,
            merged: None,
            keep: Vec::new(),
            extensions: http::Extensions::new(),
            request_head: None,
            lent_body: None,
        }
    }

    /// Lends the request body to the request phases; read the whole of it with
    /// [`PluginCtx::read_body`]. `read_timeout` bounds each pause of the client.
    pub fn lend_body(&mut self, body: RequestBody, read_timeout: std::time::Duration) {
        self.lent_body = Some(Box::new((body, read_timeout)));
    }

    /// The lent body back, read (whole) or not.
    pub fn take_body(&mut self) -> Option<RequestBody> {
        self.lent_body.take().map(|b| b.0)
    }

    /// The whole request body, at most `cap` bytes, read once and kept (the upstream then
    /// gets these bytes, or those [`PluginCtx::replace_body`] puts instead). A body
    /// announced larger than `cap` (`Content-Length`) is not read at all.
    pub async fn read_body(&mut self, cap: u64) -> Result<Bytes, ReadBodyError> {
        use http_body_util::BodyExt as _;
        let Some(lent) = self.lent_body.as_mut() else {
            return Err(ReadBodyError::NotLent);
        };
        let (body, timeout) = &mut **lent;
        if let RequestBody::Full(data) = body {
            let data = data.clone().unwrap_or_default();
            if data.len() as u64 > cap {
                return Err(ReadBodyError::TooLarge(cap));
            }
            return Ok(data);
        }
        if body.size_hint().lower() > cap {
            return Err(ReadBodyError::TooLarge(cap));
        }
        let mut buf = bytes::BytesMut::new();
        loop {
            let next = match tokio::time::timeout(*timeout, body.frame()).await {
                Err(_) => return Err(ReadBodyError::Timeout),
                Ok(next) => next,
            };
            let Some(frame) = next else { break };
            let frame = frame.map_err(ReadBodyError::Broken)?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if (buf.len() + data.len()) as u64 > cap {
                // NB: the rest stays unread: the request is answered (rejected) without it,
                // and hyper then closes or drains the client connection.
                return Err(ReadBodyError::TooLarge(cap));
            }
            buf.extend_from_slice(&data);
        }
        let data = buf.freeze();
        *body = RequestBody::Full(Some(data.clone()));
        Ok(data)
    }

    /// Replaces the (read) request body that goes upstream; the caller fixes
    /// `Content-Length`.
    pub fn replace_body(&mut self, data: Bytes) {
        if let Some(lent) = self.lent_body.as_mut() {
            lent.0 = RequestBody::Full(Some(data));
        }
    }

    /// Keeps `value` alive until the request ends (after the log phase).
    pub fn keep(&mut self, value: Box<dyn Any + Send>) {
        self.keep.push(value);
    }

    /// Adds a header to the response (from a request phase).
    pub fn add_response_header(&mut self, name: HeaderName, value: HeaderValue) {
        self.response_headers.push((name, value));
    }

    /// When the response ended: [`PluginCtx::ended`], else now (for the log phase).
    pub fn end_time(&self) -> Instant {
        self.ended.unwrap_or_else(Instant::now)
    }

    /// The consumer's name, if authenticated.
    pub fn consumer_name(&self) -> Option<&str> {
        self.consumer.as_ref().map(|c| &*c.name)
    }
}

/// Runs one request phase of one plugin: returns from the calling function with the
/// plugin's response, awaits a pending decision. NB: a macro rather than an `async fn`, so
/// that a phase that decides at once (nearly all) costs no future.
macro_rules! phase {
    ($flow:expr) => {
        match $flow {
            Flow::Continue => {}
            Flow::Respond(r) => return Err(r),
            Flow::Pending(f) => f.await?,
        }
    };
}

/// Runs the request phases (rewrite, access, before_proxy) of `chain`, the chain of
/// `ctx`. `Err` carries the response a plugin answered with.
///
/// NB: `chain` is passed besides `ctx` (which plugins borrow mutably) so that walking it
/// needs no `Arc` clone.
pub async fn request_phases(
    chain: &PluginChain,
    req: &mut request::Parts,
    ctx: &mut PluginCtx,
) -> PhaseResult {
    debug_assert!(std::ptr::eq(chain, &*ctx.chain));
    ctx.request_bytes = approx_request_head(req);
    if chain.capture_head {
        ctx.request_head = Some(Box::new(log::copy_head(req)));
    }
    for p in &chain.global_by.rewrite {
        phase!(p.rewrite(req, ctx));
    }
    for p in &chain.global_by.access {
        phase!(p.access(req, ctx));
    }
    for p in &chain.route_by.rewrite {
        phase!(p.rewrite(req, ctx));
    }
    // The consumer's plugins override the route's of the same name (APISIX merge).
    if let Some(c) = ctx.consumer.as_ref().filter(|c| !c.plugins.is_empty()) {
        let mut merged: Vec<Arc<dyn Plugin>> = chain
            .route
            .iter()
            .filter(|p| !c.plugins.iter().any(|q| q.name() == p.name()))
            .cloned()
            .collect();
        merged.extend(c.plugins.iter().cloned());
        merged.sort_by_key(|p| std::cmp::Reverse(p.priority()));
        ctx.merged = Some(Arc::from(merged));
    }
    match ctx.merged.clone() {
        // NB: cloned only when a consumer's plugins were merged in.
        Some(merged) => {
            for p in merged.iter() {
                phase!(p.access(req, ctx));
            }
            for p in chain.global_by.before_proxy.iter().chain(merged.iter()) {
                p.before_proxy(req, ctx);
            }
        }
        None => {
            for p in &chain.route_by.access {
                phase!(p.access(req, ctx));
            }
            let before = &chain.route_by.before_proxy;
            for p in chain.global_by.before_proxy.iter().chain(before.iter()) {
                p.before_proxy(req, ctx);
            }
        }
    }
    Ok(())
}

/// A request's plugin state and its route's chain, from the request phases to the response
/// phases. The state is boxed: a request's future keeps room for the slot whether or not
/// its route has plugins, and a streaming response body takes the box as it is.
pub type PluginSlot<'c> = Option<(Box<PluginBody>, &'c PluginChain)>;

/// Runs the response phases on `resp` with the request's plugin state `run` and its chain
/// in `slot` (`None` for a route without plugins: `resp` is returned as it is). `run` was
/// made by [`PluginBody::start`] before the request phases; when a plugin logs or filters
/// a body that is still streaming, `run` leaves `slot` and becomes the response body, so
/// that body filters and the log phase run as it streams. The chain is `run.ctx.chain`,
/// kept apart so that walking it needs no `Arc` clone.
pub fn response_phases(
    resp: Response<ProxyBody>,
    slot: &mut PluginSlot<'_>,
) -> Response<ProxyBody> {
    let Some((run, chain)) = slot.as_mut() else {
        return resp;
    };
    let chain: &PluginChain = chain;
    debug_assert!(std::ptr::eq(chain, &*run.ctx.chain));
    let (mut parts, body) = resp.into_parts();
    let ctx = &mut run.ctx;
    ctx.status = parts.status;
    // The head size: the upstream's when known (set by the proxy), else measured below.
    let mut head_bytes = ctx.response_head_bytes;
    if let Some(quota) = ctx.quota.take() {
        head_bytes += quota.append_to(&mut parts.headers);
    }
    if !ctx.response_headers.is_empty() {
        // NB: one reservation instead of a rehash while appending several.
        parts.headers.reserve(ctx.response_headers.len());
        for (name, value) in ctx.response_headers.drain(..) {
            head_bytes += (name.as_str().len() + value.len() + 4) as u64;
            parts.headers.append(name, value);
        }
    }
    let merged = ctx.merged.clone();
    let plugins: &[Arc<dyn Plugin>] = merged.as_deref().unwrap_or(&chain.route);
    let mut filters = Vec::new();
    // Encoders (gzip) last: they see the headers and body every other plugin made.
    // NB: skipped when no plugin of the chain has response phases (a consumer's merged
    // plugins may have).
    let passes: &[bool] = if chain.response_phases || merged.is_some() {
        &[false, true]
    } else {
        &[]
    };
    for &last in passes {
        for p in plugins.iter().chain(chain.global.iter()) {
            if p.encodes_body() != last {
                continue;
            }
            p.response_headers(&mut parts, ctx);
            if let Some(f) = p.body_filter(ctx) {
                filters.push(f);
            }
        }
    }
    // An upgraded session: its log phase and what the request phases kept (limit-conn's
    // slot) wait for the session's end, as nginx logs a WebSocket when it closes.
    if let Some(session) = parts
        .extensions
        .remove::<crate::upstream::websocket::SessionEnd>()
    {
        let head_bytes = approx_response_head(&parts);
        if let Some((mut run, _)) = slot.take() {
            run.ctx.response_head_bytes = head_bytes;
            run.wrapped = true;
            tokio::spawn(async move {
                session.ended.cancelled().await;
                let bytes = &session.bytes;
                run.ctx.request_bytes += bytes.up.load(std::sync::atomic::Ordering::Relaxed);
                run.ctx.response_body_bytes +=
                    bytes.down.load(std::sync::atomic::Ordering::Relaxed);
                run.finish();
            });
        }
        return Response::from_parts(parts, body);
    }
    // NB: values kept by request phases (limit-conn slots) live until the body is sent.
    if filters.is_empty() && !chain.wrap_body && ctx.keep.is_empty() {
        return Response::from_parts(parts, body);
    }
    if filters.iter().any(|f| !f.keeps_length()) {
        // The length changes under a filter.
        parts.headers.remove(http::header::CONTENT_LENGTH);
    }
    ctx.response_head_bytes = if ctx.response_head_bytes == 0 {
        approx_response_head(&parts)
    } else {
        head_bytes
    };
    let mut body = body;
    // A body that is complete already (a small upstream body that came with its head,
    // Sluice's own answers) is not wrapped: the log phase runs now, its size known, and
    // the plugin state is freed before hyper writes the response. NB: saves a body layer
    // per request (issue 4); the latency then runs to the response's hand-over.
    if filters.is_empty()
        && ctx.keep.is_empty()
        && let Some(data) = body.take_complete()
    {
        ctx.response_body_bytes = data.len() as u64;
        ctx.ended = body.ended();
        run.wrapped = true;
        run.finish();
        let body = if data.is_empty() {
            ProxyBody::empty()
        } else {
            ProxyBody::Full(Some(data))
        };
        return Response::from_parts(parts, body);
    }
    // The plugin state becomes the body, in the box it has lived in since the request began.
    let Some((mut run, _)) = slot.take() else {
        return Response::from_parts(parts, body);
    };
    run.inner = body;
    run.filters = filters;
    run.wrapped = true;
    Response::from_parts(parts, ProxyBody::Plugin(run))
}

fn approx_request_head(req: &request::Parts) -> u64 {
    let target = req.uri.path_and_query().map_or(1, |pq| pq.as_str().len());
    let mut n = req.method.as_str().len() + target + 12;
    for (k, v) in &req.headers {
        n += k.as_str().len() + v.len() + 4;
    }
    n as u64
}

fn approx_response_head(resp: &response::Parts) -> u64 {
    let mut n = 17;
    for (k, v) in &resp.headers {
        n += k.as_str().len() + v.len() + 4;
    }
    n as u64
}

/// The plugin state of one request: its [`PluginCtx`] through the request phases, then
/// the response body that runs body filters per chunk and the log phase at its end.
///
/// NB: boxed from the request's start ([`PluginSlot`]): inline, its 600 bytes made every
/// request's future larger, with plugins or without, and hyper moves that future with each
/// request. A streaming response body takes the box as it is.
pub struct PluginBody {
    /// The request's context.
    pub ctx: PluginCtx,
    inner: ProxyBody,
    filters: Vec<Box<dyn BodyFilter>>,
    /// Whether [`response_phases`] made this the response body (then the log phase runs at
    /// its end).
    wrapped: bool,
    done: bool,
}

impl std::fmt::Debug for PluginBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginBody")
            .field("inner", &self.inner)
            .field("filters", &self.filters.len())
            .finish_non_exhaustive()
    }
}

impl PluginBody {
    /// The state of a request on `ctx.chain`, before its request phases.
    ///
    /// NB: inlined with [`PluginCtx::new`], so that the context is written once, in place;
    /// built apart and moved in, it was copied twice (~140 instructions per request,
    /// issue 4).
    #[inline(always)]
    pub fn start(ctx: PluginCtx) -> Self {
        PluginBody {
            ctx,
            inner: ProxyBody::empty(),
            filters: Vec::new(),
            wrapped: false,
            done: false,
        }
    }

    fn finish(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        if self.wrapped {
            // NB: the upstream body's end was timed when its connection went back to the
            // pool; the log phase reuses that reading.
            if self.ctx.ended.is_none() {
                self.ctx.ended = self.inner.ended();
            }
            let chain = Arc::clone(&self.ctx.chain);
            let merged = self.ctx.merged.clone();
            let ctx = &mut self.ctx;
            match merged.as_deref() {
                Some(merged) => {
                    for p in merged.iter().chain(chain.global.iter()) {
                        p.log(ctx);
                    }
                }
                None => {
                    for p in chain.route_by.log.iter().chain(chain.global_by.log.iter()) {
                        p.log(ctx);
                    }
                }
            }
        }
    }

    /// Whether the body is still being sent.
    pub fn is_end_stream(&self) -> bool {
        self.done || (self.filters.is_empty() && self.inner.is_end_stream())
    }

    /// Size hint: the inner one unless a filter changes lengths.
    pub fn size_hint(&self) -> http_body::SizeHint {
        if self.filters.iter().all(|f| f.keeps_length()) {
            self.inner.size_hint()
        } else {
            http_body::SizeHint::default()
        }
    }

    /// Polls the next frame through the filters.
    pub fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(frame))) => {
                let frame = match frame.into_data() {
                    Ok(mut data) => {
                        for f in &mut self.filters {
                            data = f.data(data, &mut self.ctx);
                        }
                        self.ctx.response_body_bytes += data.len() as u64;
                        Frame::data(data)
                    }
                    Err(frame) => frame,
                };
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                let mut tail: Option<Bytes> = None;
                let ctx = &mut self.ctx;
                for f in &mut self.filters {
                    let mut chunk = match tail.take() {
                        Some(t) => f.data(t, ctx),
                        None => Bytes::new(),
                    };
                    if let Some(rest) = f.end(ctx) {
                        let mut v = Vec::with_capacity(chunk.len() + rest.len());
                        v.extend_from_slice(&chunk);
                        v.extend_from_slice(&rest);
                        chunk = Bytes::from(v);
                    }
                    if !chunk.is_empty() {
                        tail = Some(chunk);
                    }
                }
                if let Some(t) = &tail {
                    ctx.response_body_bytes += t.len() as u64;
                }
                // Log once the last frame has been handed over.
                match tail {
                    Some(t) => {
                        self.filters.clear();
                        self.inner = ProxyBody::empty();
                        Poll::Ready(Some(Ok(Frame::data(t))))
                    }
                    None => {
                        self.finish();
                        Poll::Ready(None)
                    }
                }
            }
            Poll::Ready(Some(Err(e))) => {
                self.finish();
                Poll::Ready(Some(Err(e)))
            }
        }
    }
}

// NB: the response body type ([`ProxyBody::Plugin`]) holds this behind `dyn FilteredBody`,
// so that the upstream layer, which defines it, does not import the plugins.
impl http_body::Body for PluginBody {
    type Data = Bytes;
    type Error = H1Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        PluginBody::poll_frame(self.get_mut(), cx)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        PluginBody::is_end_stream(self)
    }

    #[inline]
    fn size_hint(&self) -> http_body::SizeHint {
        PluginBody::size_hint(self)
    }
}

impl Drop for PluginBody {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A JSON response made by a plugin, e.g. `{"message":"Missing API key in request"}`.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<ProxyBody> {
    let mut text = body.to_string();
    text.push('\n');
    let mut resp = Response::new(ProxyBody::full(text));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// A rejection as APISIX sends it: `{"error_msg":"<msg>"}` with a message, else an empty
/// body.
pub fn rejection(code: StatusCode, msg: Option<&str>) -> Response<ProxyBody> {
    match msg {
        Some(m) => json_response(code, &serde_json::json!({ "error_msg": m })),
        None => {
            let mut resp = Response::new(ProxyBody::empty());
            *resp.status_mut() = code;
            resp
        }
    }
}

/// Why [`read_whole_body`] gives no body.
#[derive(Debug)]
pub enum BodyRefusal {
    /// Larger than the plugin's own cap: the plugin answers in its own words (APISIX's
    /// plugins differ).
    TooLarge,
    /// The answer is decided already: client-control's 413 when its smaller
    /// `max_body_size` was crossed, 408 when the client paused longer than its body
    /// timeout, 400 when the body broke off, 500 when it was not lent (a bug).
    Answer(Box<Response<ProxyBody>>),
}

/// The whole request body for a plugin that reads at most `cap` bytes of it
/// ([`PluginCtx::read_body`]; the upstream then gets the same bytes). client-control's
/// limit on a body of unannounced length applies when smaller, answered as client-control
/// answers it (413). `plugin` names the plugin in the log.
pub async fn read_whole_body(
    req: &request::Parts,
    ctx: &mut PluginCtx,
    cap: u64,
    plugin: &'static str,
) -> Result<Bytes, BodyRefusal> {
    let outer = req
        .extensions
        .get::<crate::upstream::body::BodyLimit>()
        .map(|l| l.0);
    let answer = |r: Response<ProxyBody>| Err(BodyRefusal::Answer(Box::new(r)));
    match ctx.read_body(outer.map_or(cap, |o| o.min(cap))).await {
        Ok(body) => Ok(body),
        Err(ReadBodyError::TooLarge(_)) if outer.is_some_and(|o| o <= cap) => answer(rejection(
            StatusCode::PAYLOAD_TOO_LARGE,
            Some("413 Request Entity Too Large"),
        )),
        Err(ReadBodyError::TooLarge(_)) => Err(BodyRefusal::TooLarge),
        Err(ReadBodyError::Timeout) => answer(rejection(StatusCode::REQUEST_TIMEOUT, None)),
        Err(ReadBodyError::Broken(e)) => {
            tracing::debug!(plugin, error = %e, "the request body broke off");
            answer(rejection(StatusCode::BAD_REQUEST, None))
        }
        Err(ReadBodyError::NotLent) => {
            tracing::error!(plugin, "bug: the request body was not lent to the plugin");
            answer(rejection(StatusCode::INTERNAL_SERVER_ERROR, None))
        }
    }
}

/// Removes query argument `name` from the request URI (for `hide_credentials`).
pub fn remove_query_arg(req: &mut request::Parts, name: &str) {
    let Some(q) = req.uri.query() else {
        return;
    };
    let kept: Vec<&str> = q
        .split('&')
        .filter(|kv| kv.split_once('=').map_or(*kv, |(k, _)| k) != name)
        .collect();
    let mut pq = req.uri.path().to_owned();
    if !kept.is_empty() {
        pq.push('?');
        pq.push_str(&kept.join("&"));
    }
    let mut parts = req.uri.clone().into_parts();
    if let Ok(v) = pq.parse() {
        parts.path_and_query = Some(v);
        if let Ok(uri) = http::Uri::from_parts(parts) {
            req.uri = uri;
        }
    }
}

/// What a rate limit does when its Redis fails: let the request through
/// (`allow_degradation: true`) or answer 500 `{"error_msg":"<msg>"}`.
pub fn degrade(allow: bool, msg: &str) -> PhaseResult {
    if allow {
        Ok(())
    } else {
        Err(Box::new(rejection(
            StatusCode::INTERNAL_SERVER_ERROR,
            Some(msg),
        )))
    }
}

/// A status code from a validated config (200..=599).
pub fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Records the response body size each log phase saw.
    #[derive(Debug, Default)]
    struct LogSizes(std::sync::Mutex<Vec<u64>>);

    impl Plugin for LogSizes {
        fn name(&self) -> &'static str {
            "log-sizes"
        }

        fn priority(&self) -> i32 {
            0
        }

        fn has_response_phases(&self) -> bool {
            false
        }

        fn wants_log(&self) -> bool {
            true
        }

        fn log(&self, ctx: &mut PluginCtx) {
            self.0.lock().unwrap().push(ctx.response_body_bytes);
        }
    }

    #[test]
    fn a_complete_body_is_logged_at_once_and_not_wrapped() {
        let logs = Arc::new(LogSizes::default());
        let route = v1::Route {
            id: "r".into(),
            ..Default::default()
        };
        let plugin: Arc<dyn Plugin> = logs.clone();
        let chain = PluginChain::new(
            &route,
            Vec::new(),
            vec![plugin],
            Arc::new(ConsumerTable::default()),
        )
        .unwrap();
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let run = PluginBody::start(PluginCtx::new(
            Arc::clone(&chain),
            addr,
            addr,
            "http",
            Instant::now(),
        ));
        let mut slot = Some((Box::new(run), &*chain));
        let resp = response_phases(Response::new(ProxyBody::full("hello")), &mut slot);
        // Logged before the response is written, with the body's size; the body is the
        // plain one, not a plugin layer.
        assert_eq!(*logs.0.lock().unwrap(), vec![5]);
        assert!(
            matches!(resp.body(), ProxyBody::Full(Some(b)) if b == "hello"),
            "{:?}",
            resp.body()
        );
        drop(resp);
        assert_eq!(logs.0.lock().unwrap().len(), 1, "logged once");
    }

    #[test]
    fn every_known_plugin_has_a_builder_with_its_priority() {
        let state = PluginState::default();
        let consumers = Arc::new(ConsumerTable::default());
        let cx = BuildCtx {
            owner: "t",
            state: &state,
            consumers: &consumers,
            upstreams: None,
        };
        for e in sluice_plugin_config::REGISTRY {
            assert!(
                BUILDERS.iter().any(|(n, _)| *n == e.name),
                "{} validates in translate but the dataplane cannot build it",
                e.name
            );
        }
        let p = build(
            &v1::Plugin {
                name: "limit-count".into(),
                config_json: r#"{"count":1,"time_window":1}"#.into(),
            },
            &cx,
        )
        .unwrap();
        assert_eq!(p.priority(), 1002);
    }
}
