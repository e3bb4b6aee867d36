//! `opentelemetry` (priority 12009, rewrite and log phases): a server span per request,
//! W3C trace context from the client and to the upstream, spans exported in batches over
//! OTLP/HTTP (protobuf) to the collector of the plugin metadata.
//!
//! # Per request
//!
//! - rewrite: the client's `traceparent` is parsed strictly (W3C Trace Context level 1: one
//!   header, lower-case hex, version not `ff`, ids not all zero, exact length for version
//!   `00`); a malformed one is ignored, never an error: the request starts a new trace,
//!   and its `tracestate` is dropped with it. The sampler decides (`parent_base` follows
//!   the parent's sampled flag, its `root` sampler decides without a parent); a new span id
//!   is drawn and `traceparent: 00-<trace>-<span>-<flags>` (and the client's `tracestate`)
//!   replaces the client's on the upstream request, sampled or not, so the upstream
//!   continues the trace. The attributes are read from the request as it arrived.
//! - log: a sampled request's span (kind SERVER, from arrival to the end of the response,
//!   status ERROR when the status is 500 or above) is queued for export without waiting.
//!
//! The trace context stays in the request's [`PluginCtx::extensions`] as
//! [`TraceContext`], which the loggers' `log_format` reads as `$opentelemetry_trace_id`,
//! `$opentelemetry_span_id` and `$opentelemetry_context_traceparent`.
//!
//! # Export, never on the request path
//!
//! One exporter per process (all routes share it): a [`Batcher`] of bounded size
//! (`batch_span_processor.max_queue_size`) whose task, on the logger thread, sends up to
//! `max_export_batch_size` spans per `POST /v1/traces` (`application/x-protobuf`), a partial
//! batch after `inactive_timeout` seconds without a new span or `batch_timeout` seconds
//! after its first. A full queue drops the span; a batch that fails three retries (one
//! second apart) is dropped; both are counted in
//! `sluice_opentelemetry_spans_dropped_total{reason="queue_full"|"send_failed"}`, delivered
//! spans in `sluice_opentelemetry_spans_exported_total`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::request;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    ResourceSpans, ScopeSpans, Span, Status, span, status,
};
use prometheus::{IntCounterVec, Opts};
use prost::Message as _;
use serde_json::Value;
use sluice_plugin_config::opentelemetry::{
    Opentelemetry as Config, OpentelemetryMetadata, Sampler, SamplerName, TraceIdSource,
};
use sluice_plugin_config::vars::Var;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::support::batch::{Batcher, Counters, Item, Policy, Sink};
use super::support::post::HttpPost;
use super::support::trace::{Parent, TraceContext, parse_traceparent, unhex};
use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx, support::vars};
use crate::upstream::tls::UpstreamTlsClient;

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Most attributes one request's headers add (`additional_header_prefix_attributes`).
const MAX_HEADER_ATTRIBUTES: usize = 128;

/// Most bytes of one attribute value taken from the request (longer ones are cut).
const MAX_ATTRIBUTE_VALUE: usize = 4096;

/// opentelemetry's counters, registered in the dataplane's registry.
#[derive(Debug, Clone)]
pub struct OtelMetrics {
    /// `sluice_opentelemetry_spans_exported_total`.
    pub exported: IntCounterVec,
    /// `sluice_opentelemetry_spans_dropped_total{reason}`.
    pub dropped: IntCounterVec,
}

impl Default for OtelMetrics {
    fn default() -> Self {
        // NB: constant names and labels: construction cannot fail; the fallback only
        // satisfies the types.
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).unwrap_or_else(|_| fallback())
        };
        OtelMetrics {
            exported: counter(
                "sluice_opentelemetry_spans_exported_total",
                "Spans of the opentelemetry plugin the collector accepted",
                &[],
            ),
            dropped: counter(
                "sluice_opentelemetry_spans_dropped_total",
                "Spans of the opentelemetry plugin dropped: the queue was full (queue_full) \
                 or their batch failed every retry (send_failed)",
                &["reason"],
            ),
        }
    }
}

fn fallback() -> IntCounterVec {
    IntCounterVec::new(Opts::new("sluice_invalid", "invalid"), &[]).unwrap_or_else(|_| fallback())
}

impl OtelMetrics {
    /// Both families, for registration.
    pub fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.exported.clone()),
            Box::new(self.dropped.clone()),
        ]
    }
}

/// The client's trace context: its one valid `traceparent` and its `tracestate` (several
/// headers joined by `,`); `None` when absent or malformed (then `tracestate` is ignored).
fn extract(headers: &http::HeaderMap) -> Option<(Parent, Option<HeaderValue>)> {
    let mut all = headers.get_all(TRACEPARENT).iter();
    let first = all.next()?;
    if all.next().is_some() {
        return None;
    }
    let parent = parse_traceparent(first.as_bytes())?;
    let mut states = headers.get_all(TRACESTATE).iter();
    let state = match (states.next(), states.next()) {
        (None, _) => None,
        (Some(one), None) => Some(one.clone()),
        (Some(_), Some(_)) => {
            let joined: Vec<&[u8]> = headers
                .get_all(TRACESTATE)
                .iter()
                .map(HeaderValue::as_bytes)
                .collect();
            HeaderValue::from_bytes(&joined.join(&b","[..])).ok()
        }
    };
    Some((parent, state))
}

/// `trace_id_ratio`: whether `trace_id` falls in `fraction` of the id space (its last 8
/// bytes, as the OpenTelemetry SDKs compare them).
fn ratio(trace_id: &[u8; 16], fraction: f64) -> bool {
    if fraction >= 1.0 {
        return true;
    }
    if fraction <= 0.0 {
        return false;
    }
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    let x = u64::from_be_bytes(low) >> 1;
    let bound = (fraction * (1u64 << 63) as f64) as u64;
    x < bound
}

/// The sampler's decision for a span of `trace_id` under `parent`.
pub fn sample(sampler: &Sampler, parent: Option<&Parent>, trace_id: &[u8; 16]) -> bool {
    let decide = |name: SamplerName, fraction: f64| match name {
        SamplerName::AlwaysOn => true,
        SamplerName::AlwaysOff | SamplerName::ParentBase => false,
        SamplerName::TraceIdRatio => ratio(trace_id, fraction),
    };
    match sampler.name {
        SamplerName::ParentBase => match parent {
            Some(p) => p.sampled,
            None => sampler
                .options
                .root
                .as_ref()
                .is_some_and(|r| decide(r.name, r.options.fraction)),
        },
        name => decide(name, sampler.options.fraction),
    }
}

fn random_trace_id() -> [u8; 16] {
    loop {
        let id = fastrand::u128(..).to_be_bytes();
        if id != [0; 16] {
            return id;
        }
    }
}

fn random_span_id() -> [u8; 8] {
    loop {
        let id = fastrand::u64(..).to_be_bytes();
        if id != [0; 8] {
            return id;
        }
    }
}

/// A trace id from `X-Request-Id` (`trace_id_source: x-request-id`): 32 hex digits, or a
/// UUID without its dashes; `None` otherwise.
fn trace_id_from_request_id(headers: &http::HeaderMap) -> Option<[u8; 16]> {
    let v = headers.get("x-request-id")?.as_bytes();
    if v.len() > 36 {
        return None;
    }
    let digits: Vec<u8> = v
        .iter()
        .filter(|&&c| c != b'-')
        .map(u8::to_ascii_lowercase)
        .collect();
    unhex::<16>(&digits).filter(|id| *id != [0; 16])
}

/// A span's start as the request phases saw it: kept in the request's extensions until the
/// log phase.
#[derive(Debug, Clone)]
struct Started {
    /// Wall-clock time the request arrived, in nanoseconds since the epoch.
    start_unix_nano: u64,
    /// Its name (`<method> <route path>`) and string attributes.
    attrs: Attrs,
}

/// A span's name and string attributes, as text in one buffer: the request path makes two
/// allocations for them, not two per attribute, and the exporter's thread (which frees
/// them) builds the OTLP structures.
#[derive(Debug, Clone, Default)]
struct Attrs {
    text: String,
    /// Each attribute's key and value: `text[a..b]` and `text[b..c]`.
    items: Vec<(u32, u32, u32)>,
    /// The span's name: `text[..name]`.
    name: u32,
}

impl Attrs {
    fn with_name(name: &[&str], items: usize) -> Self {
        let mut text = String::with_capacity(256);
        for part in name {
            text.push_str(part);
        }
        Attrs {
            name: offset(&text),
            text,
            items: Vec::with_capacity(items),
        }
    }

    fn push(&mut self, key: &str, value: &str) {
        let a = offset(&self.text);
        self.text.push_str(key);
        let b = offset(&self.text);
        self.text.push_str(value);
        self.items.push((a, b, offset(&self.text)));
    }

    fn name(&self) -> &str {
        self.text.get(..self.name as usize).unwrap_or("")
    }

    fn key_values(&self) -> impl Iterator<Item = KeyValue> + '_ {
        self.items.iter().map(|&(a, b, c)| {
            let (a, b, c) = (a as usize, b as usize, c as usize);
            attr(
                self.text.get(a..b).unwrap_or(""),
                self.text.get(b..c).unwrap_or(""),
            )
        })
    }
}

/// A length as the `u32` offsets of [`Attrs`] (every value is capped well below 4 GiB).
fn offset(s: &str) -> u32 {
    u32::try_from(s.len()).unwrap_or(u32::MAX)
}

fn key_value(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn attr(key: &str, value: impl Into<String>) -> KeyValue {
    key_value(key, any_value::Value::StringValue(value.into()))
}

fn int_attr(key: &str, value: i64) -> KeyValue {
    key_value(key, any_value::Value::IntValue(value))
}

fn capped(s: &str) -> &str {
    if s.len() <= MAX_ATTRIBUTE_VALUE {
        return s;
    }
    let mut end = MAX_ATTRIBUTE_VALUE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// One span as the request path hands it to the exporter.
#[derive(Debug)]
pub struct QueuedSpan {
    tc: TraceContext,
    start_unix_nano: u64,
    end_unix_nano: u64,
    status: u16,
    attrs: Attrs,
}

impl Item for QueuedSpan {
    fn size(&self) -> usize {
        96 + self.attrs.text.len() + 12 * self.attrs.items.len()
    }
}

impl QueuedSpan {
    /// The OTLP span.
    fn into_span(self) -> Span {
        let QueuedSpan {
            tc,
            start_unix_nano,
            end_unix_nano,
            status: code,
            attrs,
        } = self;
        let mut attributes = Vec::with_capacity(attrs.items.len() + 2);
        attributes.extend(attrs.key_values());
        attributes.push(int_attr("http.status_code", i64::from(code)));
        attributes.push(int_attr("http.response.status_code", i64::from(code)));
        let status = if code >= 500 {
            Status {
                code: status::StatusCode::Error as i32,
                message: format!("upstream response status: {code}"),
            }
        } else {
            Status::default()
        };
        Span {
            trace_id: tc.trace_id.to_vec(),
            span_id: tc.span_id.to_vec(),
            parent_span_id: tc.parent_span_id.map_or_else(Vec::new, |p| p.to_vec()),
            // Sampled; and whether the parent is remote is known (0x100): it is when the
            // client sent one (0x200).
            flags: 1
                | 0x100
                | if tc.parent_span_id.is_some() {
                    0x200
                } else {
                    0
                },
            name: attrs.name().to_owned(),
            kind: span::SpanKind::Server as i32,
            start_time_unix_nano: start_unix_nano,
            end_time_unix_nano: end_unix_nano,
            attributes,
            status: Some(status),
            ..Default::default()
        }
    }
}

/// Sends batches of spans to the collector.
struct OtlpSink {
    post: HttpPost,
    resource: Resource,
}

impl Sink<QueuedSpan> for OtlpSink {
    fn name(&self) -> &str {
        "opentelemetry"
    }

    type Payload = Bytes;

    fn encode(&mut self, batch: Vec<QueuedSpan>) -> Bytes {
        let req = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "sluice".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    spans: batch.into_iter().map(QueuedSpan::into_span).collect(),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        Bytes::from(req.encode_to_vec())
    }

    async fn send(&mut self, body: &Bytes) -> Result<(), String> {
        self.post.post(body.clone(), "application/x-protobuf").await
    }
}

/// The process's exporter: the queue every route's spans go to.
#[derive(Debug)]
pub struct Exporter {
    batcher: Batcher<QueuedSpan>,
    trace_id_source: TraceIdSource,
}

impl Exporter {
    /// Starts the exporter of `md`, counting in `metrics`.
    pub fn start(md: &OpentelemetryMetadata, metrics: &OtelMetrics) -> Result<Self, String> {
        let target = md.target().map_err(|e| e.to_string())?;
        let tls = if target.tls {
            Some(UpstreamTlsClient::for_probes(None, None, true).map_err(|e| e.to_string())?)
        } else {
            None
        };
        let mut headers = Vec::new();
        for (k, v) in md.headers().map_err(|e| e.to_string())? {
            let name = HeaderName::from_bytes(k.as_bytes()).map_err(|e| e.to_string())?;
            // NB: the value may be a secret: not quoted.
            let value = HeaderValue::from_str(&v)
                .map_err(|_| format!("collector.request_headers.{k}: bad value"))?;
            headers.push((name, value));
        }
        let post = HttpPost::new(
            &target.host,
            target.port,
            &target.authority,
            "/v1/traces",
            tls,
            headers,
            Duration::from_secs(md.collector.request_timeout),
        )?;
        let resource = resource(md);
        let b = &md.batch_span_processor;
        let policy = Policy {
            max_size: usize::try_from(b.max_export_batch_size).unwrap_or(usize::MAX),
            inactive: Some(Duration::from_secs_f64(b.inactive_timeout)),
            buffer_duration: Duration::from_secs_f64(b.batch_timeout),
            max_retries: 3,
            retry_delay: Duration::from_secs(1),
        };
        let counters = Counters {
            sent: metrics.exported.with_label_values::<&str>(&[]),
            dropped_full: metrics.dropped.with_label_values(&["queue_full"]),
            dropped_failed: metrics.dropped.with_label_values(&["send_failed"]),
        };
        let batcher = Batcher::start_with(
            Config::NAME,
            &target.authority,
            policy,
            usize::try_from(b.max_queue_size).unwrap_or(usize::MAX),
            OtlpSink { post, resource },
            counters,
        );
        Ok(Exporter {
            batcher,
            trace_id_source: md.trace_id_source,
        })
    }
}

/// The resource of every span: `hostname`, `service.name` (default `APISIX`) and the
/// metadata's `resource`.
fn resource(md: &OpentelemetryMetadata) -> Resource {
    let mut attributes = vec![attr("hostname", super::support::vars::hostname())];
    if !md.resource.contains_key("service.name") {
        attributes.push(attr("service.name", "APISIX"));
    }
    for (k, v) in &md.resource {
        let value = match v {
            Value::String(s) => any_value::Value::StringValue(s.clone()),
            Value::Bool(b) => any_value::Value::BoolValue(*b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => any_value::Value::IntValue(i),
                None => any_value::Value::DoubleValue(n.as_f64().unwrap_or(0.0)),
            },
            _ => continue,
        };
        attributes.push(key_value(k, value));
    }
    Resource {
        attributes,
        ..Default::default()
    }
}

/// A header (or header prefix) whose values become attributes.
#[derive(Debug, Clone)]
enum HeaderAttr {
    Exact(HeaderName),
    Prefix(String),
}

/// `opentelemetry` on one route.
#[derive(Debug)]
pub struct Opentelemetry {
    sampler: Sampler,
    vars: Vec<(String, Var)>,
    headers: Vec<HeaderAttr>,
    /// The process's exporter (`Some`: checked when built).
    exporter: Arc<Option<Exporter>>,
}

impl Builtin for Opentelemetry {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE.with(Hooks::LOG);

    /// Builds `opentelemetry`.
    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let field = |field: &str, reason: String| ConfigError::Field {
            plugin: Config::NAME.into(),
            field: field.into(),
            reason,
        };
        let mut vars_ = Vec::new();
        for (i, a) in conf.additional_attributes.iter().enumerate() {
            let v = Var::parse(a).ok_or_else(|| {
                field(
                    &format!("additional_attributes[{i}]"),
                    "unknown variable".into(),
                )
            })?;
            vars_.push((a.clone(), v));
        }
        let mut headers = Vec::new();
        for (i, h) in conf.additional_header_prefix_attributes.iter().enumerate() {
            let h = h.to_ascii_lowercase();
            // As APISIX: a trailing `*` makes a prefix when something stands before it.
            match h.strip_suffix('*').filter(|p| !p.is_empty()) {
                Some(prefix) => headers.push(HeaderAttr::Prefix(prefix.to_owned())),
                None => headers.push(HeaderAttr::Exact(
                    HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                        field(
                            &format!("additional_header_prefix_attributes[{i}]"),
                            "is not a header name".into(),
                        )
                    })?,
                )),
            }
        }
        // NB: one exporter for the process, made from the metadata when a route first needs it.
        let md = cx.state.metadata().opentelemetry.unwrap_or_default();
        let metrics = &cx.state.otel;
        let mut failed = None;
        let exporter = cx.state.shared("opentelemetry:exporter", || {
            Exporter::start(&md, metrics)
                .map_err(|e| failed = Some(e))
                .ok()
        });
        if exporter.is_none() {
            let why = failed.unwrap_or_else(|| "the exporter did not start".into());
            return Err(field("metadata", why));
        }
        Ok(Opentelemetry {
            sampler: conf.sampler,
            vars: vars_,
            headers,
            exporter,
        })
    }

    fn hooks(&self) -> Hooks {
        // NB: a sampler that never samples exports nothing: no log phase (and no wrapped
        // response body) for it, which is most of what tracing costs with sampling off.
        if matches!(self.sampler.name, SamplerName::AlwaysOff) {
            Self::HOOKS.without(Hooks::LOG)
        } else {
            Self::HOOKS
        }
    }
}

impl Opentelemetry {
    fn exporter(&self) -> Option<&Exporter> {
        (*self.exporter).as_ref()
    }

    /// The name and attributes APISIX sets when the span starts, read from the request as
    /// it arrived.
    fn attributes(&self, req: &request::Parts, ctx: &PluginCtx) -> Attrs {
        let route = &*ctx.chain.matched_uri;
        let mut out = if route.is_empty() {
            Attrs::with_name(&[req.method.as_str()], 8 + self.vars.len())
        } else {
            Attrs::with_name(&[req.method.as_str(), " ", route], 8 + self.vars.len())
        };
        if let Some(host) = vars::get(&Var::Host, req, ctx) {
            out.push("net.host.name", capped(&host));
        }
        out.push("http.method", req.method.as_str());
        out.push("http.scheme", ctx.scheme);
        out.push(
            "http.target",
            capped(req.uri.path_and_query().map_or("/", |p| p.as_str())),
        );
        if let Some(ua) = req
            .headers
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
        {
            out.push("http.user_agent", capped(ua));
        }
        out.push("apisix.route_id", &ctx.chain.route_id);
        // NB: Sluice's routes have no name apart from their id (namespace/name/rule).
        out.push("apisix.route_name", &ctx.chain.route_id);
        out.push("http.route", route);
        for (name, var) in &self.vars {
            if let Some(v) = vars::get(var, req, ctx) {
                out.push(name, capped(&v));
            }
        }
        if !self.headers.is_empty() {
            let mut added = 0;
            for (name, value) in &req.headers {
                if added >= MAX_HEADER_ATTRIBUTES {
                    break;
                }
                let wanted = self.headers.iter().any(|h| match h {
                    HeaderAttr::Exact(n) => n == name,
                    HeaderAttr::Prefix(p) => name.as_str().starts_with(p.as_str()),
                });
                if wanted {
                    out.push(
                        name.as_str(),
                        capped(&String::from_utf8_lossy(value.as_bytes())),
                    );
                    added += 1;
                }
            }
        }
        out
    }
}

impl Plugin for Opentelemetry {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        let incoming = extract(&req.headers);
        let parent = incoming.as_ref().map(|(p, _)| *p);
        let trace_id = match &parent {
            Some(p) => p.trace_id,
            None => match self.exporter().map(|e| e.trace_id_source) {
                Some(TraceIdSource::XRequestId) => {
                    trace_id_from_request_id(&req.headers).unwrap_or_else(random_trace_id)
                }
                _ => random_trace_id(),
            },
        };
        let sampled = sample(&self.sampler, parent.as_ref(), &trace_id);
        let tc = TraceContext {
            trace_id,
            span_id: random_span_id(),
            parent_span_id: parent.map(|p| p.span_id),
            sampled,
        };
        if sampled {
            let started_ago = ctx.started.elapsed();
            let start = SystemTime::now()
                .checked_sub(started_ago)
                .unwrap_or_else(SystemTime::now);
            let attrs = self.attributes(req, ctx);
            ctx.extensions.insert(Started {
                start_unix_nano: unix_nanos(start),
                attrs,
            });
        }
        // The upstream continues the trace; a client's malformed context is not passed on.
        if let Ok(v) = HeaderValue::from_bytes(&tc.traceparent_bytes()) {
            req.headers.insert(TRACEPARENT, v);
        }
        match incoming.and_then(|(_, state)| state) {
            Some(state) => {
                req.headers.insert(TRACESTATE, state);
            }
            None => {
                req.headers.remove(TRACESTATE);
            }
        }
        ctx.trace = Some(tc);
        Flow::Continue
    }

    fn log(&self, ctx: &mut PluginCtx) {
        // NB: the span's start is taken, not copied: this is its last use.
        let Some(started) = ctx.extensions.remove::<Started>() else {
            return;
        };
        let (Some(tc), Some(exporter)) = (ctx.trace.as_ref(), self.exporter()) else {
            return;
        };
        let took = ctx.end_time().saturating_duration_since(ctx.started);
        let end = started
            .start_unix_nano
            .saturating_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
        exporter.batcher.push(QueuedSpan {
            tc: *tc,
            start_unix_nano: started.start_unix_nano,
            end_unix_nano: end,
            status: ctx.status.as_u16(),
            attrs: started.attrs,
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::plugins::support::trace::hex;
    use sluice_plugin_config::opentelemetry::{RootSampler, RootSamplerOptions, SamplerOptions};

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_parsing_is_strict() {
        let p = parse_traceparent(TP.as_bytes()).unwrap();
        assert_eq!(hex(&p.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&p.span_id), "00f067aa0ba902b7");
        assert!(p.sampled);
        let unsampled = TP.replace("-01", "-00");
        assert!(!parse_traceparent(unsampled.as_bytes()).unwrap().sampled);
        // A later version may carry more fields after a dash.
        let v1 = TP.replacen("00", "01", 1) + "-more";
        assert!(parse_traceparent(v1.as_bytes()).is_some());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            &TP.to_uppercase(),
            &TP.replacen("00", "ff", 1),
            &format!("{TP}-x"),
            &(TP.replacen("00", "01", 1) + "x"),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
        ] {
            assert_eq!(parse_traceparent(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn two_traceparents_are_malformed_and_tracestates_join() {
        let mut h = http::HeaderMap::new();
        h.append(TRACEPARENT, HeaderValue::from_static(TP));
        h.append(TRACESTATE, HeaderValue::from_static("a=1"));
        h.append(TRACESTATE, HeaderValue::from_static("b=2"));
        let (_, state) = extract(&h).unwrap();
        assert_eq!(state.unwrap(), "a=1,b=2");
        h.append(TRACEPARENT, HeaderValue::from_static(TP));
        assert!(extract(&h).is_none());
    }

    fn sampler(name: SamplerName, fraction: f64, root: Option<RootSampler>) -> Sampler {
        Sampler {
            name,
            options: SamplerOptions { fraction, root },
        }
    }

    #[test]
    fn samplers() {
        let id = [0x11; 16];
        let parent = |sampled| Parent {
            trace_id: id,
            span_id: [1; 8],
            sampled,
        };
        assert!(sample(
            &sampler(SamplerName::AlwaysOn, 0.0, None),
            None,
            &id
        ));
        assert!(!sample(
            &sampler(SamplerName::AlwaysOff, 0.0, None),
            Some(&parent(true)),
            &id
        ));
        let pb = sampler(SamplerName::ParentBase, 0.0, None);
        assert!(sample(&pb, Some(&parent(true)), &id));
        assert!(!sample(&pb, Some(&parent(false)), &id));
        assert!(!sample(&pb, None, &id), "root defaults to always_off");
        let on = RootSampler {
            name: SamplerName::AlwaysOn,
            options: RootSamplerOptions::default(),
        };
        let pb_on = sampler(SamplerName::ParentBase, 0.0, Some(on));
        assert!(sample(&pb_on, None, &id));
        assert!(!sample(&pb_on, Some(&parent(false)), &id));
        // trace_id_ratio: by the id's low 8 bytes; 0 and 1 are never and always.
        let r = |f| sample(&sampler(SamplerName::TraceIdRatio, f, None), None, &id);
        assert!(!r(0.0));
        assert!(r(1.0));
        let low = [0u8; 16];
        let mut high = [0u8; 16];
        high[8] = 0xff;
        let half = sampler(SamplerName::TraceIdRatio, 0.5, None);
        assert!(sample(&half, None, &low));
        assert!(!sample(&half, None, &high));
        let sampled = (0..10_000)
            .filter(|_| sample(&half, None, &random_trace_id()))
            .count();
        assert!((4_000..6_000).contains(&sampled), "{sampled}");
    }

    #[test]
    fn request_id_as_trace_id() {
        let mut h = http::HeaderMap::new();
        h.insert(
            "x-request-id",
            HeaderValue::from_static("6F9619FF-8B86-D011-B42D-00C04FC964FF"),
        );
        assert_eq!(
            hex(&trace_id_from_request_id(&h).unwrap()),
            "6f9619ff8b86d011b42d00c04fc964ff"
        );
        h.insert("x-request-id", HeaderValue::from_static("not-an-id"));
        assert_eq!(trace_id_from_request_id(&h), None);
    }

    #[test]
    fn traceparent_out() {
        let tc = TraceContext {
            trace_id: [0xab; 16],
            span_id: [0x01; 8],
            parent_span_id: None,
            sampled: false,
        };
        assert_eq!(
            tc.traceparent(),
            "00-abababababababababababababababab-0101010101010101-00"
        );
        let tc = TraceContext {
            trace_id: std::array::from_fn(|i| i as u8),
            span_id: std::array::from_fn(|i| 0xf0 + i as u8),
            parent_span_id: None,
            sampled: true,
        };
        assert_eq!(
            tc.traceparent(),
            "00-000102030405060708090a0b0c0d0e0f-f0f1f2f3f4f5f6f7-01"
        );
        assert_eq!(tc.trace_id_hex(), "000102030405060708090a0b0c0d0e0f");
        assert_eq!(tc.span_id_hex(), "f0f1f2f3f4f5f6f7");
    }
}
