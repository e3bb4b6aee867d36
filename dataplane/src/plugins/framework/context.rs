//! The per-request context the plugins of one request share ([`PluginCtx`]): addresses,
//! timings, the consumer, what request phases hand to response phases, and the request body
//! lent to the plugins that read it.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode, request};
use http_body::Body;

use super::chain::PluginChain;
use super::consumer::Consumer;
use super::plugin::Instance;
use super::respond::rejection;
use crate::plugins::limit_count::Quota;
use crate::plugins::support::trace::TraceContext;
use crate::upstream::body::ProxyBody;
use crate::upstream::request_body::RequestBody;

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
    /// [`super::Hooks::READS_BODY`]), or was read already and found too large.
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
    /// The plugins of the backend the weighted split picked (`Backend.plugins`), whose
    /// response phases run before the route's.
    pub backend_plugins: Option<Arc<[Instance]>>,
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
    pub quota: Option<Quota>,
    /// The request's trace context, set by opentelemetry's rewrite (a field, not an
    /// extension: no allocation per traced request).
    pub trace: Option<TraceContext>,
    /// The route's plugins merged with the consumer's, when the consumer has plugins.
    pub(super) merged: Option<Arc<[Instance]>>,
    /// Values kept until the request ends (e.g. a limit-conn slot released on drop).
    pub(super) keep: Vec<Box<dyn Any + Send>>,
    /// Typed per-request values plugins hand from request to response phases (e.g. the
    /// request's `Origin` for cors, a copy of the request head).
    pub extensions: http::Extensions,
    /// The request head as it arrived, for the log phase; only when a plugin of the chain
    /// or a consumer's asks for it ([`super::Hooks::REQUEST_HEAD`]).
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
            backend_plugins: None,
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
