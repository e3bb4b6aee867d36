//! What the logger plugins (`http-logger`, `file-logger`) share: APISIX's log entry, the
//! custom `log_format`, the request- and response-body tees, and [`Logger`], the plugin
//! both are: its log phase builds the entry and queues it on a [`Batcher`] (never waiting
//! on the request path).

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, request};
use serde_json::{Map, Value};
use sluice_plugin_config::logger::{LogField, LogFormat, LogVar};

use super::batch::Batcher;
use super::trace::TraceContext;
use super::vars;
use crate::plugins::{BodyFilter, Hooks, Plugin, PluginCtx};

/// What a logger puts in its entries, besides APISIX's fixed fields.
#[derive(Debug, Clone)]
pub struct EntryOptions {
    /// A custom entry (`log_format`) instead of the full one.
    pub format: Option<LogFormat>,
    /// Most response-body bytes logged, when `include_resp_body`.
    pub resp_body: Option<usize>,
    /// Most request-body bytes logged, when `include_req_body`.
    pub req_body: Option<usize>,
}

/// A logger plugin on one route (http-logger, file-logger, by their config `C`): the log
/// phase builds the entry and queues it on the logger's [`Batcher`]; the response head and
/// (with `include_resp_body`) a capped copy of the body are kept for it.
pub struct Logger<C> {
    opts: EntryOptions,
    batcher: Arc<Batcher>,
    config: PhantomData<fn() -> C>,
}

impl<C> std::fmt::Debug for Logger<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logger")
            .field("opts", &self.opts)
            .field("batcher", &self.batcher)
            .finish()
    }
}

impl<C> Logger<C> {
    /// The hooks of every logger ([`crate::plugins::Builtin::HOOKS`] of both).
    pub const HOOKS: Hooks = Hooks::BEFORE_PROXY
        .with(Hooks::RESPONSE_HEADERS)
        .with(Hooks::BODY_FILTER)
        .with(Hooks::LOG)
        .with(Hooks::REQUEST_HEAD);

    /// A logger logging to `batcher`. `bodies`: the most request- and response-body bytes
    /// logged (`include_req_body` with `max_req_body_bytes`, `include_resp_body` with
    /// `max_resp_body_bytes`).
    pub fn new(
        format: Option<LogFormat>,
        bodies: (Option<u64>, Option<u64>),
        batcher: Arc<Batcher>,
    ) -> Self {
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Logger {
            opts: EntryOptions {
                format,
                req_body: bodies.0.map(size),
                resp_body: bodies.1.map(size),
            },
            batcher,
            config: PhantomData,
        }
    }

    /// This logger's hooks: [`Logger::HOOKS`], without `before_proxy` (the request-body
    /// tap) unless `include_req_body`.
    pub fn hooks(&self) -> Hooks {
        if self.opts.req_body.is_some() {
            Self::HOOKS
        } else {
            Self::HOOKS.without(Hooks::BEFORE_PROXY)
        }
    }
}

impl<C: 'static> Plugin for Logger<C> {
    fn before_proxy(&self, req: &mut request::Parts, ctx: &mut PluginCtx) {
        if let Some(cap) = self.opts.req_body {
            tee_request_body(cap, req, ctx);
        }
    }

    fn response_headers(&self, resp: &mut http::response::Parts, ctx: &mut PluginCtx) {
        keep_response_head(&resp.headers, ctx);
    }

    fn body_filter(&self, ctx: &mut PluginCtx) -> Option<Box<dyn BodyFilter>> {
        tee_response_body(self.opts.resp_body?, ctx)
    }

    fn log(&self, ctx: &mut PluginCtx) {
        if self.opts.req_body.is_some() {
            resolve_request_body(ctx);
        }
        self.batcher.push(entry(ctx, &self.opts));
    }
}

/// The response head as the response phases made it, kept for the log phase.
#[derive(Debug, Clone)]
pub struct ResponseHead(pub HeaderMap);

/// Keeps a copy of the response headers for the log phase (once per request).
pub fn keep_response_head(headers: &HeaderMap, ctx: &mut PluginCtx) {
    if ctx.extensions.get::<ResponseHead>().is_none() {
        ctx.extensions.insert(ResponseHead(headers.clone()));
    }
}

/// The first bytes of the response body, copied as it streams (the longest cap of the
/// request's loggers).
#[derive(Debug, Clone, Default)]
pub struct ResponseBody {
    buf: Vec<u8>,
    cap: usize,
}

/// A body filter copying the first `cap` bytes into [`ResponseBody`]; it forwards every
/// chunk as it is (the length does not change).
#[derive(Debug)]
struct Tee;

impl BodyFilter for Tee {
    fn data(&mut self, chunk: Bytes, ctx: &mut PluginCtx) -> Bytes {
        if let Some(b) = ctx.extensions.get_mut::<ResponseBody>() {
            let room = b.cap.saturating_sub(b.buf.len());
            if room > 0 {
                b.buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
        }
        chunk
    }

    fn keeps_length(&self) -> bool {
        true
    }
}

/// The tee of a logger with `include_resp_body` (one per request, whichever logger asks
/// first; later ones raise its cap).
pub fn tee_response_body(cap: usize, ctx: &mut PluginCtx) -> Option<Box<dyn BodyFilter>> {
    if let Some(b) = ctx.extensions.get_mut::<ResponseBody>() {
        b.cap = b.cap.max(cap);
        return None;
    }
    ctx.extensions.insert(ResponseBody {
        buf: Vec::new(),
        cap,
    });
    Some(Box::new(Tee))
}

/// The copy of the request body the loggers of a request share (the first logger with
/// `include_req_body` asks for it, with its cap): waiting for the body to end, then its
/// first bytes, or none (the body did not end, or the request never went upstream).
#[derive(Debug, Clone)]
enum RequestBodyCopy {
    Waiting(Arc<std::sync::Mutex<Option<TapReceiver>>>),
    Done(Option<Bytes>),
}

type TapReceiver = tokio::sync::oneshot::Receiver<crate::upstream::request_body::TapResult>;

/// Asks for the first `cap` bytes of the request body as it streams upstream (once per
/// request).
fn tee_request_body(cap: usize, req: &mut request::Parts, ctx: &mut PluginCtx) {
    if ctx.extensions.get::<RequestBodyCopy>().is_some() {
        return;
    }
    let (tap, rx) = crate::upstream::request_body::BodyTap::truncating(cap);
    tap.attach(&mut req.extensions);
    ctx.extensions
        .insert(RequestBodyCopy::Waiting(Arc::new(std::sync::Mutex::new(
            Some(rx),
        ))));
}

/// The log phase: the body's copy, if the body has ended (an empty body is none, as
/// APISIX logs no `request.body` without one).
fn resolve_request_body(ctx: &mut PluginCtx) {
    let Some(RequestBodyCopy::Waiting(rx)) = ctx.extensions.get::<RequestBodyCopy>() else {
        return;
    };
    let rx = match rx.lock() {
        Ok(mut g) => g.take(),
        Err(p) => p.into_inner().take(),
    };
    let body = rx
        .and_then(|mut rx| rx.try_recv().ok())
        .and_then(Result::ok)
        .filter(|b| !b.is_empty());
    ctx.extensions.insert(RequestBodyCopy::Done(body));
}

/// The log entry of the request of `ctx`, as JSON text.
pub fn entry(ctx: &PluginCtx, opts: &EntryOptions) -> String {
    let end = ctx.end_time();
    if opts.format.is_none() {
        // NB: written straight from the request's own data, without a `Value` tree (whose
        // map of every header cost more than the rest of the request: issue 19's budget).
        // NB: sized for a typical entry at once, instead of growing from 128 bytes.
        let mut out = Vec::with_capacity(1024);
        if serde_json::to_writer(&mut out, &full(ctx, opts, end)).is_err() {
            return String::new();
        }
        // NB: serde_json writes valid UTF-8 only.
        return String::from_utf8(out).unwrap_or_default();
    }
    let value = match &opts.format {
        Some(f) => {
            let mut m = custom(f, ctx, end);
            m.insert("route_id".into(), Value::from(&*ctx.chain.route_id));
            m.insert("service_id".into(), Value::from(""));
            Value::Object(m)
        }
        None => Value::Null,
    };
    value.to_string()
}

fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

fn text(v: &http::HeaderValue) -> Value {
    Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// Headers as `ngx.req.get_headers()` gives them: lower-case names in order, a list for
/// a repeated header; serialised from the map itself.
struct Headers<'a>(&'a HeaderMap);

impl serde::Serialize for Headers<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut names: Vec<&http::HeaderName> = self.0.keys().collect();
        names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
        let mut m = s.serialize_map(Some(names.len()))?;
        for name in names {
            let all = self.0.get_all(name);
            let mut it = all.iter();
            match (it.next(), it.next()) {
                (Some(one), None) => m.serialize_entry(name.as_str(), &Lossy(one.as_bytes()))?,
                _ => m.serialize_entry(
                    name.as_str(),
                    &all.iter().map(|v| Lossy(v.as_bytes())).collect::<Vec<_>>(),
                )?,
            }
        }
        m.end()
    }
}

/// Bytes as a JSON string, invalid UTF-8 replaced.
struct Lossy<'a>(&'a [u8]);

impl serde::Serialize for Lossy<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&String::from_utf8_lossy(self.0))
    }
}

/// Query arguments as `ngx.req.get_uri_args()`: decoded, `true` for an argument without
/// `=`, a list for a repeated one.
fn query(q: Option<&str>) -> Value {
    let mut m = Map::new();
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = match pair.split_once('=') {
            Some((k, v)) => (k, Value::String(vars::percent_decode(v).into_owned())),
            None => (pair, Value::Bool(true)),
        };
        let k = vars::percent_decode(k).into_owned();
        match m.get_mut(&k) {
            Some(Value::Array(a)) => a.push(v),
            Some(old) => *old = Value::Array(vec![old.take(), v]),
            None => {
                m.insert(k, v);
            }
        }
    }
    Value::Object(m)
}

fn epoch_ms(at: Instant) -> f64 {
    let ago = Instant::now().saturating_duration_since(at);
    let t = SystemTime::now()
        .checked_sub(ago)
        .unwrap_or(SystemTime::now())
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    t.as_millis() as f64
}

/// APISIX's full entry (`log-util.get_full_log`). Fields in name order, as a JSON object
/// map writes them.
#[derive(serde::Serialize)]
struct Full<'a> {
    apisix_latency: f64,
    client_ip: Text<std::net::IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    consumer: Option<Consumer<'a>>,
    latency: f64,
    request: Req<'a>,
    response: Resp<'a>,
    route_id: &'a str,
    server: Server,
    service_id: &'static str,
    start_time: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_latency: Option<f64>,
}

#[derive(serde::Serialize)]
struct Consumer<'a> {
    username: &'a str,
}

#[derive(serde::Serialize)]
struct Req<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<Lossy<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    headers: Option<Headers<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    querystring: Option<Value>,
    size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    uri: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<Url<'a>>,
}

/// A value written as its `Display` text, straight into the entry.
struct Text<T>(T);

impl<T: std::fmt::Display> serde::Serialize for Text<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

/// `request.url` as APISIX writes it: `<scheme>://<host>:<port><target>`.
struct Url<'a> {
    scheme: &'a str,
    host: Option<Cow<'a, str>>,
    port: u16,
    target: &'a str,
}

impl std::fmt::Display for Url<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let host = self.host.as_deref().unwrap_or("");
        write!(f, "{}://{host}:{}{}", self.scheme, self.port, self.target)
    }
}

impl serde::Serialize for Url<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[derive(serde::Serialize)]
struct Resp<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<Lossy<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    headers: Option<Headers<'a>>,
    size: u64,
    status: u16,
}

#[derive(serde::Serialize)]
struct Server {
    hostname: &'static str,
    version: &'static str,
}

fn full<'a>(ctx: &'a PluginCtx, opts: &EntryOptions, end: Instant) -> Full<'a> {
    let head = ctx.request_head.as_deref();
    let target = head.map(|req| req.uri.path_and_query().map_or("/", |p| p.as_str()));
    let url = head.map(|req| Url {
        scheme: ctx.scheme,
        host: vars::get(&sluice_plugin_config::vars::Var::Host, req, ctx),
        port: ctx.local_addr.port(),
        target: target.unwrap_or("/"),
    });
    let body = match (opts.resp_body, ctx.extensions.get::<ResponseBody>()) {
        (Some(cap), Some(b)) => Some(Lossy(&b.buf[..b.buf.len().min(cap)])),
        _ => None,
    };
    let latency = end.saturating_duration_since(ctx.started);
    let upstream_latency = ctx
        .upstream_started
        .map(|up| end.saturating_duration_since(up));
    let apisix = upstream_latency.map_or(latency, |up| latency.saturating_sub(up));
    Full {
        apisix_latency: ms(apisix),
        client_ip: Text(ctx.remote_addr.ip().to_canonical()),
        consumer: ctx.consumer_name().map(|username| Consumer { username }),
        latency: ms(latency),
        request: Req {
            body: match (opts.req_body, ctx.extensions.get::<RequestBodyCopy>()) {
                (Some(cap), Some(RequestBodyCopy::Done(Some(b)))) => {
                    Some(Lossy(&b[..b.len().min(cap)]))
                }
                _ => None,
            },
            headers: head.map(|req| Headers(&req.headers)),
            method: head.map(|req| req.method.as_str()),
            querystring: head.map(|req| query(req.uri.query())),
            size: ctx.request_bytes,
            uri: target,
            url,
        },
        response: Resp {
            body,
            headers: ctx.extensions.get::<ResponseHead>().map(|h| Headers(&h.0)),
            size: ctx.response_head_bytes + ctx.response_body_bytes,
            status: ctx.status.as_u16(),
        },
        route_id: &ctx.chain.route_id,
        server: Server {
            hostname: hostname(),
            version: env!("CARGO_PKG_VERSION"),
        },
        service_id: "",
        start_time: epoch_ms(ctx.started),
        upstream: ctx.upstream.as_ref().map(|p| p.address()),
        upstream_latency: upstream_latency.map(ms),
    }
}

fn custom(f: &LogFormat, ctx: &PluginCtx, end: Instant) -> Map<String, Value> {
    let mut m = Map::new();
    for (k, field) in &f.fields {
        let v = match field {
            LogField::Literal(v) => v.clone(),
            LogField::Nested(n) => Value::Object(custom(n, ctx, end)),
            LogField::Var(var) => log_var(var, ctx, end),
        };
        m.insert(k.clone(), v);
    }
    m
}

fn secs(d: Duration) -> Value {
    Value::String(format!("{:.3}", d.as_secs_f64()))
}

fn log_var(var: &LogVar, ctx: &PluginCtx, end: Instant) -> Value {
    let s = |c: Option<Cow<'_, str>>| c.map_or(Value::Null, |c| Value::String(c.into_owned()));
    match var {
        LogVar::Request(v) => match ctx.request_head.as_deref() {
            Some(req) => s(vars::get(v, req, ctx)),
            None => Value::Null,
        },
        LogVar::Status => Value::from(ctx.status.as_u16()),
        LogVar::RequestTime => secs(end.saturating_duration_since(ctx.started)),
        LogVar::UpstreamAddr => ctx
            .upstream
            .as_ref()
            .map_or(Value::Null, |p| Value::from(p.address())),
        LogVar::UpstreamResponseTime => ctx
            .upstream_started
            .map_or(Value::Null, |u| secs(end.saturating_duration_since(u))),
        LogVar::BytesSent => Value::from(ctx.response_head_bytes + ctx.response_body_bytes),
        LogVar::BodyBytesSent => Value::from(ctx.response_body_bytes),
        LogVar::RequestLength => Value::from(ctx.request_bytes),
        LogVar::TimeIso8601 => Value::String(iso8601(epoch_ms(ctx.started) as u64 / 1000)),
        LogVar::Msec => Value::String(format!("{:.3}", epoch_ms(Instant::now()) / 1000.0)),
        LogVar::Hostname => Value::String(hostname().to_owned()),
        LogVar::SentHeader(name) => ctx
            .extensions
            .get::<ResponseHead>()
            .and_then(|h| h.0.get(name.as_str()))
            .map_or(Value::Null, text),
        LogVar::OpentelemetryTraceId => trace(ctx, |t| t.trace_id_hex()),
        LogVar::OpentelemetrySpanId => trace(ctx, |t| t.span_id_hex()),
        LogVar::OpentelemetryTraceparent => trace(ctx, |t| t.traceparent()),
    }
}

/// A value of the request's trace context (opentelemetry plugin), `null` without one.
fn trace(ctx: &PluginCtx, f: impl Fn(&TraceContext) -> String) -> Value {
    ctx.trace
        .as_ref()
        .map_or(Value::Null, |t| Value::String(f(t)))
}

fn hostname() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(super::vars::hostname)
}

/// `secs` since the epoch as `YYYY-MM-DDTHH:MM:SS+00:00` (UTC).
fn iso8601(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}+00:00",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn iso_dates() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00+00:00");
        assert_eq!(iso8601(1_709_251_199), "2024-02-29T23:59:59+00:00");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00+00:00");
    }

    #[test]
    fn query_args_as_nginx() {
        assert_eq!(
            query(Some("a=1&b&a=x%20y&c=")),
            serde_json::json!({"a": ["1", "x y"], "b": true, "c": ""})
        );
        assert_eq!(query(None), serde_json::json!({}));
    }
}
