//! Fields shared by the logger plugins (`http-logger`, `file-logger`): the custom
//! `log_format` and the body options.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::FieldError;
use crate::vars::Var;

/// APISIX's default `max_req_body_bytes` / `max_resp_body_bytes`: 512 KiB.
pub const MAX_BODY_BYTES: u64 = 524_288;

/// Deepest nesting of objects in a `log_format` (APISIX truncates deeper ones; Sluice
/// rejects them).
pub const MAX_LOG_FORMAT_DEPTH: usize = 5;

/// A variable a `log_format` may reference: the request variables of [`Var`], plus the
/// ones only known once the response is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogVar {
    /// A request variable (`$remote_addr`, `$http_user_agent`, `$request_uri`, ...).
    Request(Var),
    /// `status`: the response status.
    Status,
    /// `request_time`: seconds from the first byte read to the last byte sent (ms precision).
    RequestTime,
    /// `upstream_addr`: the endpoint (`ip:port`) of the last upstream attempt.
    UpstreamAddr,
    /// `upstream_response_time`: seconds spent on the upstream (ms precision).
    UpstreamResponseTime,
    /// `bytes_sent`: response head and body bytes.
    BytesSent,
    /// `body_bytes_sent`: response body bytes.
    BodyBytesSent,
    /// `request_length`: request bytes (head, approximate).
    RequestLength,
    /// `time_iso8601`: when the request started, `2024-01-02T03:04:05+00:00`.
    TimeIso8601,
    /// `msec`: the log time in seconds with millisecond precision.
    Msec,
    /// `hostname`: the dataplane's host name.
    Hostname,
    /// `sent_http_<name>`: a response header (name lower-case, `_` as `-`).
    SentHeader(String),
    /// `opentelemetry_trace_id`: the trace id of the request's span (opentelemetry plugin),
    /// 32 hex digits; none without that plugin.
    OpentelemetryTraceId,
    /// `opentelemetry_span_id`: the id of the request's span, 16 hex digits.
    OpentelemetrySpanId,
    /// `opentelemetry_context_traceparent`: the `traceparent` sent upstream.
    OpentelemetryTraceparent,
}

impl LogVar {
    /// Parses a variable name (without `$`); `None` when unknown.
    pub fn parse(name: &str) -> Option<LogVar> {
        Some(match name {
            "status" => LogVar::Status,
            "request_time" => LogVar::RequestTime,
            "upstream_addr" => LogVar::UpstreamAddr,
            "upstream_response_time" => LogVar::UpstreamResponseTime,
            "bytes_sent" => LogVar::BytesSent,
            "body_bytes_sent" => LogVar::BodyBytesSent,
            "request_length" => LogVar::RequestLength,
            "time_iso8601" => LogVar::TimeIso8601,
            "msec" => LogVar::Msec,
            "hostname" => LogVar::Hostname,
            "opentelemetry_trace_id" => LogVar::OpentelemetryTraceId,
            "opentelemetry_span_id" => LogVar::OpentelemetrySpanId,
            "opentelemetry_context_traceparent" => LogVar::OpentelemetryTraceparent,
            _ => match name.strip_prefix("sent_http_").filter(|h| !h.is_empty()) {
                Some(h) => LogVar::SentHeader(h.to_ascii_lowercase().replace('_', "-")),
                None => LogVar::Request(Var::parse(name)?),
            },
        })
    }
}

/// One field of a [`LogFormat`].
#[derive(Debug, Clone, PartialEq)]
pub enum LogField {
    /// `"$name"`: the variable's value (JSON `null` when it has none).
    Var(LogVar),
    /// Any other value, logged as it is.
    Literal(Value),
    /// A nested object.
    Nested(LogFormat),
}

/// A custom log entry (APISIX `log_format`): each key maps to `"$variable"`, a literal, or
/// a nested object. `route_id` and `service_id` are added to every entry, as in APISIX.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LogFormat {
    /// The fields, by key.
    pub fields: BTreeMap<String, LogField>,
}

impl LogFormat {
    /// Compiles a `log_format` object; the error names `field.<key>`.
    pub fn compile(field: &str, value: &Value) -> Result<LogFormat, FieldError> {
        compile_at(field, value, 1)
    }
}

fn compile_at(field: &str, value: &Value, depth: usize) -> Result<LogFormat, FieldError> {
    let Value::Object(map) = value else {
        return Err(FieldError::new(field, "must be an object"));
    };
    let mut fields = BTreeMap::new();
    for (k, v) in map {
        let path = format!("{field}.{k}");
        let f = match v {
            Value::String(s) if s.starts_with('$') => {
                let name = &s[1..];
                LogVar::parse(name)
                    .map(LogField::Var)
                    .ok_or_else(|| FieldError::new(&path, format!("unknown variable {s:?}")))?
            }
            Value::Object(_) => {
                if depth >= MAX_LOG_FORMAT_DEPTH {
                    return Err(FieldError::new(
                        path,
                        format!("nests deeper than {MAX_LOG_FORMAT_DEPTH} levels"),
                    ));
                }
                LogField::Nested(compile_at(&path, v, depth + 1)?)
            }
            other => LogField::Literal(other.clone()),
        };
        fields.insert(k.clone(), f);
    }
    Ok(LogFormat { fields })
}

/// Checks the body options shared by the loggers.
pub fn check_bodies(
    include_req_body_expr: Option<&Value>,
    include_resp_body_expr: Option<&Value>,
    max_req_body_bytes: u64,
    max_resp_body_bytes: u64,
) -> Result<(), FieldError> {
    if include_req_body_expr.is_some() {
        return Err(FieldError::new(
            "include_req_body_expr",
            "is not supported by Sluice yet; include_req_body logs every request's body",
        ));
    }
    if include_resp_body_expr.is_some() {
        return Err(FieldError::new(
            "include_resp_body_expr",
            "is not supported by Sluice yet; include_resp_body logs every response's body",
        ));
    }
    if max_req_body_bytes < 1 {
        return Err(FieldError::new("max_req_body_bytes", "must be at least 1"));
    }
    if max_resp_body_bytes < 1 {
        return Err(FieldError::new("max_resp_body_bytes", "must be at least 1"));
    }
    Ok(())
}

pub(crate) fn default_max_body() -> u64 {
    MAX_BODY_BYTES
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn log_formats_compile_variables_literals_and_nesting() {
        let f = LogFormat::compile(
            "log_format",
            &json!({"host": "$host", "ua": "$http_user_agent", "n": 1, "s": "text",
                    "resp": {"status": "$status", "ct": "$sent_http_content_type"}}),
        )
        .unwrap();
        assert_eq!(f.fields["host"], LogField::Var(LogVar::Request(Var::Host)));
        assert_eq!(
            f.fields["ua"],
            LogField::Var(LogVar::Request(Var::Header("user-agent".into())))
        );
        assert_eq!(f.fields["n"], LogField::Literal(json!(1)));
        assert_eq!(f.fields["s"], LogField::Literal(json!("text")));
        let LogField::Nested(n) = &f.fields["resp"] else {
            panic!("nested")
        };
        assert_eq!(n.fields["status"], LogField::Var(LogVar::Status));
        assert_eq!(
            n.fields["ct"],
            LogField::Var(LogVar::SentHeader("content-type".into()))
        );
        let e = LogFormat::compile("log_format", &json!({"a": {"b": "$nope"}})).unwrap_err();
        assert_eq!(e.to_string(), "log_format.a.b: unknown variable \"$nope\"");
        let deep = json!({"a": {"b": {"c": {"d": {"e": {"f": 1}}}}}});
        let e = LogFormat::compile("log_format", &deep).unwrap_err();
        assert_eq!(
            e.to_string(),
            "log_format.a.b.c.d.e: nests deeper than 5 levels"
        );
    }
}
