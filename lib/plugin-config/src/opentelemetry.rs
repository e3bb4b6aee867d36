//! `opentelemetry`: a server span per request, W3C trace context in and out, spans sent to
//! an OpenTelemetry collector over OTLP/HTTP (protobuf).
//!
//! Two parts, as in APISIX:
//! - [`Opentelemetry`], the route's config: the sampler and extra span attributes;
//! - [`OpentelemetryMetadata`], the plugin metadata (APISIX's
//!   `plugin_metadata/opentelemetry`): the collector, the batch span processor, the
//!   resource and where trace ids come from. Process-wide: Sluice reads it from the
//!   dataplane's `--plugin-metadata` file (see `docs/plugins.md`).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::{FieldError, PluginSchema};

/// A sampling strategy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SamplerName {
    /// Sample every trace.
    AlwaysOn,
    /// Sample no trace; the default.
    #[default]
    AlwaysOff,
    /// Sample a `fraction` of traces, decided by the trace id.
    TraceIdRatio,
    /// Follow the parent's sampled flag (a client's `traceparent`); the `root` sampler
    /// decides for a request without one.
    ParentBase,
}

/// Options of a root sampler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
pub struct RootSamplerOptions {
    /// `trace_id_ratio`'s fraction, 0 to 1; default 0.
    #[serde(default)]
    pub fraction: f64,
}

/// The root sampler of `parent_base`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
pub struct RootSampler {
    /// `always_on`, `always_off` (default) or `trace_id_ratio`.
    #[serde(default)]
    pub name: SamplerName,
    /// Its options.
    #[serde(default)]
    pub options: RootSamplerOptions,
}

/// Options of the sampler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
pub struct SamplerOptions {
    /// `trace_id_ratio`'s fraction, 0 to 1; default 0.
    #[serde(default)]
    pub fraction: f64,
    /// `parent_base`'s root sampler; default `always_off`.
    #[serde(default)]
    pub root: Option<RootSampler>,
}

/// The sampler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
pub struct Sampler {
    /// The strategy; default `always_off`.
    #[serde(default)]
    pub name: SamplerName,
    /// Its options.
    #[serde(default)]
    pub options: SamplerOptions,
}

/// Configuration of `opentelemetry` on a route (APISIX's schema and defaults).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Opentelemetry {
    /// The sampler; default `always_off` (as APISIX: nothing is traced until sampled).
    #[serde(default)]
    pub sampler: Sampler,
    /// Variables whose values become span attributes under their own name (`remote_addr`,
    /// `http_x_user`, `arg_id`, ...); default none.
    #[serde(default)]
    pub additional_attributes: Vec<String>,
    /// Request headers that become span attributes under their own (lower-case) name; a
    /// trailing `*` takes every header with that prefix (`x-my-*`); default none.
    #[serde(default)]
    pub additional_header_prefix_attributes: Vec<String>,
}

fn check_fraction(field: &str, f: f64) -> Result<(), FieldError> {
    if !(0.0..=1.0).contains(&f) {
        return Err(FieldError::new(field, "must be between 0 and 1"));
    }
    Ok(())
}

impl PluginSchema for Opentelemetry {
    const NAME: &'static str = "opentelemetry";
    const PRIORITY: i32 = 12009;

    fn check(&self) -> Result<(), FieldError> {
        check_fraction("sampler.options.fraction", self.sampler.options.fraction)?;
        if let Some(root) = &self.sampler.options.root {
            if root.name == SamplerName::ParentBase {
                return Err(FieldError::new(
                    "sampler.options.root.name",
                    "must be always_on, always_off or trace_id_ratio",
                ));
            }
            check_fraction(
                "sampler.options.root.options.fraction",
                root.options.fraction,
            )?;
        }
        for (field, list) in [
            ("additional_attributes", &self.additional_attributes),
            (
                "additional_header_prefix_attributes",
                &self.additional_header_prefix_attributes,
            ),
        ] {
            // NB: bounds the work per request (APISIX has no bound).
            if list.len() > 64 {
                return Err(FieldError::new(field, "must have at most 64 items"));
            }
            for (i, a) in list.iter().enumerate() {
                if a.is_empty() {
                    return Err(FieldError::new(
                        format!("{field}[{i}]"),
                        "must not be empty",
                    ));
                }
            }
        }
        for (i, a) in self.additional_attributes.iter().enumerate() {
            if crate::vars::Var::parse(a).is_none() {
                return Err(FieldError::new(
                    format!("additional_attributes[{i}]"),
                    format!("{a:?} is not a variable Sluice knows"),
                ));
            }
        }
        for (i, h) in self.additional_header_prefix_attributes.iter().enumerate() {
            let name = h.strip_suffix('*').unwrap_or(h);
            if !name.is_empty() && http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(FieldError::new(
                    format!("additional_header_prefix_attributes[{i}]"),
                    format!("{h:?} is not a header name"),
                ));
            }
        }
        Ok(())
    }
}

/// Where the trace id of a new trace (no parent) comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum TraceIdSource {
    /// Random; the default.
    #[default]
    #[serde(rename = "random")]
    Random,
    /// The request's `X-Request-Id` when it makes a trace id (32 hex digits, or a UUID
    /// such as `request-id` sets, its dashes removed), else random.
    #[serde(rename = "x-request-id")]
    XRequestId,
}

/// The collector spans are sent to.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Collector {
    /// `host:port` (plain HTTP), or an `http://` / `https://` URL without a path; spans go
    /// to `POST /v1/traces` there. Default `127.0.0.1:4318`.
    #[serde(default = "default_address")]
    pub address: String,
    /// Seconds one export may take (connect, send, answer), at least 1; default 3.
    #[serde(default = "default_request_timeout")]
    pub request_timeout: u64,
    /// Headers sent with each export (e.g. `Authorization`); values may be strings,
    /// numbers or booleans. Never logged by Sluice.
    #[serde(default)]
    pub request_headers: BTreeMap<String, Value>,
}

impl Default for Collector {
    fn default() -> Self {
        Collector {
            address: default_address(),
            request_timeout: default_request_timeout(),
            request_headers: BTreeMap::new(),
        }
    }
}

fn default_address() -> String {
    "127.0.0.1:4318".into()
}
fn default_request_timeout() -> u64 {
    3
}

/// The batch span processor: how finished spans wait for export.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpanProcessor {
    /// Drop a span when the queue is full; default true. `false` is accepted and treated
    /// as `true`: a request never waits for the collector (see docs).
    #[serde(default = "yes")]
    pub drop_on_queue_full: bool,
    /// Most spans waiting for export, 1 to 1048576; default 2048 (opentelemetry-lua's).
    #[serde(default = "default_max_queue_size")]
    pub max_queue_size: u64,
    /// Most seconds a partial batch waits before it is sent; default 5.
    #[serde(default = "default_batch_timeout")]
    pub batch_timeout: f64,
    /// Seconds without a new span after which a partial batch is sent; default 2.
    #[serde(default = "default_inactive_timeout")]
    pub inactive_timeout: f64,
    /// Most spans in one export, 1 to `max_queue_size`; default 256.
    #[serde(default = "default_max_export_batch_size")]
    pub max_export_batch_size: u64,
}

impl Default for BatchSpanProcessor {
    fn default() -> Self {
        BatchSpanProcessor {
            drop_on_queue_full: true,
            max_queue_size: default_max_queue_size(),
            batch_timeout: default_batch_timeout(),
            inactive_timeout: default_inactive_timeout(),
            max_export_batch_size: default_max_export_batch_size(),
        }
    }
}

fn yes() -> bool {
    true
}
fn default_max_queue_size() -> u64 {
    2048
}
fn default_batch_timeout() -> f64 {
    5.0
}
fn default_inactive_timeout() -> f64 {
    2.0
}
fn default_max_export_batch_size() -> u64 {
    256
}

/// The plugin metadata of `opentelemetry` (APISIX's `metadata_schema`), process-wide.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpentelemetryMetadata {
    /// Where a new trace's id comes from; default `random`.
    #[serde(default)]
    pub trace_id_source: TraceIdSource,
    /// Resource attributes (strings, numbers, booleans) besides `hostname` and
    /// `service.name` (default `APISIX`, as APISIX); default none.
    #[serde(default)]
    pub resource: BTreeMap<String, Value>,
    /// The collector.
    #[serde(default)]
    pub collector: Collector,
    /// The batch span processor.
    #[serde(default)]
    pub batch_span_processor: BatchSpanProcessor,
    /// APISIX sets the `opentelemetry_*` nginx variables only when true; Sluice's loggers
    /// always have them (see docs), so this is accepted and has no effect. Default false.
    #[serde(default)]
    pub set_ngx_var: bool,
}

/// Where [`Collector::address`] points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectorTarget {
    /// Whether to use TLS.
    pub tls: bool,
    /// Host name or IP (without brackets).
    pub host: String,
    /// Port.
    pub port: u16,
    /// `host:port` as written (the `Host` header).
    pub authority: String,
}

impl OpentelemetryMetadata {
    /// Parses and checks the metadata (JSON or YAML turned into a value).
    pub fn parse(value: &Value) -> Result<Self, crate::ConfigError> {
        let m: OpentelemetryMetadata = crate::deserialize_lenient(Opentelemetry::NAME, value)?;
        m.check().map_err(|e| crate::ConfigError::Field {
            plugin: Opentelemetry::NAME.into(),
            field: format!("metadata.{}", e.field),
            reason: e.reason,
        })?;
        Ok(m)
    }

    /// The parsed [`Collector::address`].
    pub fn target(&self) -> Result<CollectorTarget, FieldError> {
        let a = self.collector.address.trim();
        let (tls, rest) = if let Some(r) = a.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = a.strip_prefix("http://") {
            (false, r)
        } else {
            (false, a)
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let bad = |why: &str| FieldError::new("collector.address", format!("{a:?} {why}"));
        if rest.contains('/') || rest.contains('?') || rest.contains('@') {
            return Err(bad("must be host:port or a URL without a path"));
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("has no closing ]"))?;
            match after.strip_prefix(':') {
                Some(p) => (h, p.parse().map_err(|_| bad("has a bad port"))?),
                None if after.is_empty() => (h, default_port),
                None => return Err(bad("is not host:port")),
            }
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h, p.parse().map_err(|_| bad("has a bad port"))?),
                None => (rest, default_port),
            }
        };
        if host.is_empty() || port == 0 {
            return Err(bad("has no host or port"));
        }
        Ok(CollectorTarget {
            tls,
            host: host.to_owned(),
            port,
            authority: rest.to_owned(),
        })
    }

    /// The collector's extra headers, as text.
    pub fn headers(&self) -> Result<Vec<(String, String)>, FieldError> {
        let mut out = Vec::new();
        for (k, v) in &self.collector.request_headers {
            let field = || format!("collector.request_headers.{k}");
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => {
                    return Err(FieldError::new(
                        field(),
                        "must be a string, number or boolean",
                    ));
                }
            };
            if http::HeaderName::from_bytes(k.as_bytes()).is_err() {
                return Err(FieldError::new(field(), "is not a header name"));
            }
            if http::HeaderValue::from_str(&text).is_err() {
                // NB: the value may be a secret: not quoted.
                return Err(FieldError::new(field(), "is not a valid header value"));
            }
            out.push((k.clone(), text));
        }
        Ok(out)
    }

    fn check(&self) -> Result<(), FieldError> {
        self.target()?;
        self.headers()?;
        if !(1..=60).contains(&self.collector.request_timeout) {
            return Err(FieldError::new(
                "collector.request_timeout",
                "must be between 1 and 60",
            ));
        }
        for (k, v) in &self.resource {
            if !matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_)) {
                return Err(FieldError::new(
                    format!("resource.{k}"),
                    "must be a string, number or boolean",
                ));
            }
        }
        let b = &self.batch_span_processor;
        if !(1..=1_048_576).contains(&b.max_queue_size) {
            return Err(FieldError::new(
                "batch_span_processor.max_queue_size",
                "must be between 1 and 1048576",
            ));
        }
        if b.max_export_batch_size < 1 || b.max_export_batch_size > b.max_queue_size {
            return Err(FieldError::new(
                "batch_span_processor.max_export_batch_size",
                "must be between 1 and max_queue_size",
            ));
        }
        for (field, secs) in [
            ("batch_span_processor.batch_timeout", b.batch_timeout),
            ("batch_span_processor.inactive_timeout", b.inactive_timeout),
        ] {
            if !(secs > 0.0 && secs <= 3600.0) {
                return Err(FieldError::new(field, "must be above 0 and at most 3600"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::validate;
    use serde_json::json;

    #[test]
    fn defaults_are_apisix_s() {
        let c: Opentelemetry = crate::parse(&json!({})).unwrap();
        assert_eq!(c.sampler.name, SamplerName::AlwaysOff);
        assert_eq!(c.sampler.options.fraction, 0.0);
        assert!(c.sampler.options.root.is_none());
        let m = OpentelemetryMetadata::parse(&json!({})).unwrap();
        assert_eq!(m.collector.address, "127.0.0.1:4318");
        assert_eq!(m.collector.request_timeout, 3);
        assert_eq!(m.trace_id_source, TraceIdSource::Random);
        assert_eq!(m.batch_span_processor.max_queue_size, 2048);
        assert_eq!(m.batch_span_processor.max_export_batch_size, 256);
        assert_eq!(
            m.target().unwrap(),
            CollectorTarget {
                tls: false,
                host: "127.0.0.1".into(),
                port: 4318,
                authority: "127.0.0.1:4318".into()
            }
        );
    }

    #[test]
    fn full_config() {
        let c: Opentelemetry = crate::parse(&json!({
            "sampler": {"name": "parent_base", "options": {"root": {"name": "trace_id_ratio", "options": {"fraction": "0.5"}}}},
            "additional_attributes": ["remote_addr", "http_x_user"],
            "additional_header_prefix_attributes": ["x-my-*", "x-one"],
        }))
        .unwrap();
        assert_eq!(c.sampler.name, SamplerName::ParentBase);
        let root = c.sampler.options.root.unwrap();
        assert_eq!(root.name, SamplerName::TraceIdRatio);
        assert_eq!(root.options.fraction, 0.5);
    }

    #[test]
    fn bad_configs_name_the_field() {
        let e = |v: Value| validate("opentelemetry", &v).unwrap_err().to_string();
        assert!(
            e(json!({"sampler": {"name": "sometimes"}})).contains("sampler.name"),
            "{}",
            e(json!({"sampler": {"name": "sometimes"}}))
        );
        assert!(
            e(json!({"sampler": {"name": "trace_id_ratio", "options": {"fraction": 2}}}))
                .contains("sampler.options.fraction: must be between 0 and 1")
        );
        assert!(
            e(json!({"sampler": {"name": "parent_base", "options": {"root": {"name": "parent_base"}}}}))
                .contains("sampler.options.root.name")
        );
        assert!(e(json!({"additional_attributes": [""]})).contains("additional_attributes[0]"));
        assert!(
            e(json!({"additional_attributes": ["no_such_var"]}))
                .contains("additional_attributes[0]: \"no_such_var\" is not a variable")
        );
        assert!(
            e(json!({"additional_header_prefix_attributes": ["bad header*"]}))
                .contains("additional_header_prefix_attributes[0]")
        );
        assert!(e(json!({"samplr": {}})).contains("samplr"));
    }

    #[test]
    fn metadata_checks() {
        let e = |v: Value| OpentelemetryMetadata::parse(&v).unwrap_err().to_string();
        assert!(
            e(json!({"collector": {"address": "http://c:4318/v1/traces"}}))
                .contains("metadata.collector.address")
        );
        assert!(
            e(json!({"collector": {"address": "c:port"}})).contains("collector.address"),
            "{}",
            e(json!({"collector": {"address": "c:port"}}))
        );
        assert!(
            e(json!({"batch_span_processor": {"max_queue_size": 10, "max_export_batch_size": 11}}))
                .contains("metadata.batch_span_processor.max_export_batch_size")
        );
        assert!(e(json!({"resource": {"a": [1]}})).contains("metadata.resource.a"));
        assert!(e(json!({"trace_id_source": "uuid"})).contains("trace_id_source"));
        let m = OpentelemetryMetadata::parse(&json!({
            "collector": {"address": "https://[::1]:4318", "request_headers": {"authorization": "Bearer x", "x-n": 1}},
            "batch_span_processor": {"max_queue_size": "16", "max_export_batch_size": 8, "batch_timeout": 0.5},
            "trace_id_source": "x-request-id",
        }))
        .unwrap();
        let t = m.target().unwrap();
        assert!(t.tls);
        assert_eq!((t.host.as_str(), t.port), ("::1", 4318));
        assert_eq!(m.headers().unwrap()[1], ("x-n".to_owned(), "1".to_owned()));
        assert_eq!(m.batch_span_processor.max_queue_size, 16);
    }
}
