//! `http-logger`: send batches of access-log entries to an HTTP(S) server.

use serde::Deserialize;
use serde_json::Value;

use crate::forward_auth::Target;
use crate::logger::{LogFormat, check_bodies, default_max_body};
use crate::{FieldError, PluginSchema, common};

/// How the entries of a batch are joined into one request body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConcatMethod {
    /// A JSON array of entries (`Content-Type: application/json`); the default. With
    /// `batch_max_size: 1`, the single entry's object, as APISIX.
    #[default]
    Json,
    /// One JSON entry per line, joined by `\n` (`Content-Type: text/plain`).
    NewLine,
}

/// Configuration of `http-logger` (APISIX 3.x schema, batch-processor fields and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpLogger {
    /// URL of the log server (`http://` or `https://`). Required.
    pub uri: String,
    /// Value of the `Authorization` header sent with each batch; default none. Never
    /// logged by Sluice.
    #[serde(default)]
    pub auth_header: Option<String>,
    /// Timeout of one send (connect, TLS, request, answer) in seconds, at least 1; default 3.
    #[serde(default = "default_timeout")]
    pub timeout: u64,
    /// A custom entry instead of APISIX's full one (see [`LogFormat`]); default none.
    #[serde(default)]
    pub log_format: Option<Value>,
    /// Log the request body, its first `max_req_body_bytes` (copied as it streams
    /// upstream); default false.
    #[serde(default)]
    pub include_req_body: bool,
    /// Refused: not supported yet.
    #[serde(default)]
    pub include_req_body_expr: Option<Value>,
    /// Log the response body, at most `max_resp_body_bytes` of it; default false.
    #[serde(default)]
    pub include_resp_body: bool,
    /// Refused: not supported yet.
    #[serde(default)]
    pub include_resp_body_expr: Option<Value>,
    /// Most request-body bytes logged, at least 1; default 524288.
    #[serde(default = "default_max_body")]
    pub max_req_body_bytes: u64,
    /// Most response-body bytes logged, at least 1; default 524288.
    #[serde(default = "default_max_body")]
    pub max_resp_body_bytes: u64,
    /// `json` (default) or `new_line`.
    #[serde(default)]
    pub concat_method: ConcatMethod,
    /// Verify the log server's TLS certificate; default false (as APISIX).
    #[serde(default)]
    pub ssl_verify: bool,
    /// Name of the batch processor (in Sluice's own logs); default `http logger`.
    #[serde(default = "default_name")]
    pub name: String,
    /// Most entries in one batch, at least 1; default 1000.
    #[serde(default = "default_batch_max_size")]
    pub batch_max_size: u64,
    /// Seconds without a new entry after which a partial batch is sent, at least 1;
    /// default 5.
    #[serde(default = "default_inactive_timeout")]
    pub inactive_timeout: u64,
    /// Most seconds the oldest entry of a batch waits before the batch is sent, at least
    /// 1; default 60.
    #[serde(default = "default_buffer_duration")]
    pub buffer_duration: u64,
    /// Times a failed batch is sent again before it is dropped; default 0.
    #[serde(default)]
    pub max_retry_count: u64,
    /// Seconds between attempts; default 1.
    #[serde(default = "default_retry_delay")]
    pub retry_delay: u64,
}

fn default_timeout() -> u64 {
    3
}
fn default_name() -> String {
    "http logger".into()
}
fn default_batch_max_size() -> u64 {
    1000
}
fn default_inactive_timeout() -> u64 {
    5
}
fn default_buffer_duration() -> u64 {
    60
}
fn default_retry_delay() -> u64 {
    1
}

impl HttpLogger {
    /// The parsed [`HttpLogger::uri`].
    pub fn target(&self) -> Result<Target, FieldError> {
        common::parse_http_url("uri", &self.uri)
    }

    /// The compiled [`HttpLogger::log_format`].
    pub fn format(&self) -> Result<Option<LogFormat>, FieldError> {
        self.log_format
            .as_ref()
            .map(|v| LogFormat::compile("log_format", v))
            .transpose()
    }
}

impl PluginSchema for HttpLogger {
    const NAME: &'static str = "http-logger";
    const PRIORITY: i32 = 410;

    fn check(&self) -> Result<(), FieldError> {
        self.target()?;
        if let Some(h) = &self.auth_header
            && http::HeaderValue::from_str(h).is_err()
        {
            // NB: the value itself is a secret: not quoted.
            return Err(FieldError::new(
                "auth_header",
                "is not a valid header value",
            ));
        }
        if !(1..=3600).contains(&self.timeout) {
            return Err(FieldError::new("timeout", "must be between 1 and 3600"));
        }
        self.format()?;
        check_bodies(
            self.include_req_body_expr.as_ref(),
            self.include_resp_body_expr.as_ref(),
            self.max_req_body_bytes,
            self.max_resp_body_bytes,
        )?;
        if self.batch_max_size < 1 {
            return Err(FieldError::new("batch_max_size", "must be at least 1"));
        }
        // NB: bounds the memory a batch holds (APISIX has no upper bound).
        if self.batch_max_size > 100_000 {
            return Err(FieldError::new("batch_max_size", "must be at most 100000"));
        }
        if self.inactive_timeout < 1 {
            return Err(FieldError::new("inactive_timeout", "must be at least 1"));
        }
        if self.buffer_duration < 1 {
            return Err(FieldError::new("buffer_duration", "must be at least 1"));
        }
        if self.max_retry_count > 1000 {
            return Err(FieldError::new("max_retry_count", "must be at most 1000"));
        }
        if self.retry_delay > 3600 {
            return Err(FieldError::new("retry_delay", "must be at most 3600"));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::{parse, validate};
    use serde_json::json;

    #[test]
    fn defaults_as_apisix() {
        let c: HttpLogger = parse(&json!({"uri": "http://logs.default:8080/ingest?k=1"})).unwrap();
        assert_eq!(
            (
                c.timeout,
                c.batch_max_size,
                c.inactive_timeout,
                c.buffer_duration,
                c.max_retry_count,
                c.retry_delay,
                c.max_req_body_bytes,
                c.max_resp_body_bytes
            ),
            (3, 1000, 5, 60, 0, 1, 524_288, 524_288)
        );
        assert_eq!(c.name, "http logger");
        assert_eq!(c.concat_method, ConcatMethod::Json);
        assert!(!c.ssl_verify && !c.include_req_body && !c.include_resp_body);
        assert_eq!(c.auth_header, None);
        let t = c.target().unwrap();
        assert_eq!((t.tls, t.port), (false, 8080));
        assert_eq!(t.path_and_query, "/ingest?k=1");
        let c: HttpLogger =
            parse(&json!({"uri": "https://logs.example.com", "concat_method": "new_line"}))
                .unwrap();
        assert_eq!(c.concat_method, ConcatMethod::NewLine);
        assert_eq!(c.target().unwrap().port, 443);
        assert_eq!(HttpLogger::PRIORITY, 410);
    }

    #[test]
    fn checks_name_plugin_and_field() {
        for (conf, want) in [
            (json!({}), "plugin \"http-logger\": missing field `uri`"),
            (
                json!({"uri": "tcp://a/"}),
                "plugin \"http-logger\": uri: must start with http:// or https://",
            ),
            (
                json!({"uri": "http://a/", "batch_max_size": 0}),
                "plugin \"http-logger\": batch_max_size: must be at least 1",
            ),
            (
                json!({"uri": "http://a/", "inactive_timeout": 0}),
                "plugin \"http-logger\": inactive_timeout: must be at least 1",
            ),
            (
                json!({"uri": "http://a/", "buffer_duration": 0}),
                "plugin \"http-logger\": buffer_duration: must be at least 1",
            ),
            (
                json!({"uri": "http://a/", "timeout": 0}),
                "plugin \"http-logger\": timeout: must be between 1 and 3600",
            ),
            (
                json!({"uri": "http://a/", "max_retry_count": -1}),
                "plugin \"http-logger\": max_retry_count: invalid value: integer `-1`, expected u64",
            ),
            (
                json!({"uri": "http://a/", "concat_method": "csv"}),
                "plugin \"http-logger\": concat_method: unknown variant `csv`, expected `json` or `new_line`",
            ),
            (
                json!({"uri": "http://a/", "auth_header": "Bearer x\nInjected: 1"}),
                "plugin \"http-logger\": auth_header: is not a valid header value",
            ),
            (
                json!({"uri": "http://a/", "max_resp_body_bytes": 0}),
                "plugin \"http-logger\": max_resp_body_bytes: must be at least 1",
            ),
            (
                json!({"uri": "http://a/", "log_format": {"h": "$nope"}}),
                "plugin \"http-logger\": log_format.h: unknown variable \"$nope\"",
            ),
            (
                json!({"uri": "http://a/", "log_format": "$host"}),
                "plugin \"http-logger\": log_format: must be an object",
            ),
        ] {
            assert_eq!(
                validate("http-logger", &conf).unwrap_err().to_string(),
                want,
                "{conf}"
            );
        }
        validate(
            "http-logger",
            &json!({"uri": "http://a/", "include_req_body": true, "max_req_body_bytes": 16}),
        )
        .unwrap();
        let e = validate(
            "http-logger",
            &json!({"uri": "http://a/", "include_req_body": true, "include_req_body_expr": [["arg_a", "==", "1"]]}),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("plugin \"http-logger\": include_req_body_expr: is not supported"),
            "{e}"
        );
        let e = validate("http-logger", &json!({"uri": "http://a/", "bogus": 1}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `bogus`"), "{e}");
        // Secret values are strings.
        validate(
            "http-logger",
            &json!({"uri": "http://a/", "batch_max_size": "10", "include_resp_body": "true",
                    "auth_header": "Basic c2VjcmV0"}),
        )
        .unwrap();
    }
}
