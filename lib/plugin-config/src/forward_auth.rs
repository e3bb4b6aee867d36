//! `forward-auth`: ask an external HTTP service whether a request may pass.

use serde::Deserialize;

use crate::{FieldError, PluginSchema, common};

/// The method of the request to the authorization service.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum RequestMethod {
    /// `GET` (default): no body.
    #[default]
    #[serde(rename = "GET")]
    Get,
    /// `POST`: the client's body (at most [`ForwardAuth::max_req_body_size`] bytes) goes
    /// along, with the client's `Content-Encoding`.
    #[serde(rename = "POST")]
    Post,
}

/// Configuration of `forward-auth` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardAuth {
    /// URL of the authorization service (`http://` or `https://`). Required.
    pub uri: String,
    /// Verify the service's TLS certificate; default true.
    #[serde(default = "common::yes")]
    pub ssl_verify: bool,
    /// `GET` (default) or `POST` (the client's body goes along).
    #[serde(default)]
    pub request_method: RequestMethod,
    /// With `POST`, the largest client body read and sent to the service, bytes,
    /// 1..=64 MiB; a larger one is answered 413. Default 64 MiB (APISIX's).
    #[serde(default = "common::default_max_req_body_size")]
    pub max_req_body_size: u64,
    /// Client request headers sent to the service; default none (only the
    /// `X-Forwarded-*` headers Sluice sets).
    #[serde(default)]
    pub request_headers: Vec<String>,
    /// Headers of a 2xx answer copied into the upstream request (a header the answer lacks
    /// is removed from the upstream request); default none.
    #[serde(default)]
    pub upstream_headers: Vec<String>,
    /// Headers of a denying answer passed to the client; default none.
    #[serde(default)]
    pub client_headers: Vec<String>,
    /// Timeout of the whole exchange in milliseconds, 1..=60000; default 3000.
    #[serde(default = "default_timeout")]
    pub timeout: u64,
    /// Keep connections to the service open; default true.
    #[serde(default = "common::yes")]
    pub keepalive: bool,
    /// Idle time after which a kept connection closes, milliseconds (at least 1000);
    /// default 60000.
    #[serde(default = "default_keepalive_timeout")]
    pub keepalive_timeout: u64,
    /// Most idle connections kept (at least 1); default 5.
    #[serde(default = "default_keepalive_pool")]
    pub keepalive_pool: u64,
    /// Let requests through when the service cannot be reached; default false.
    #[serde(default)]
    pub allow_degradation: bool,
    /// Status answered when the service cannot be reached, 200..=599; default 403.
    #[serde(default = "default_status_on_error")]
    pub status_on_error: u16,
}

fn default_timeout() -> u64 {
    3000
}
fn default_keepalive_timeout() -> u64 {
    60_000
}
fn default_keepalive_pool() -> u64 {
    5
}
fn default_status_on_error() -> u16 {
    403
}

pub use crate::common::Target;

impl ForwardAuth {
    /// The parsed [`ForwardAuth::uri`].
    pub fn target(&self) -> Result<Target, FieldError> {
        common::parse_http_url("uri", &self.uri)
    }
}

fn check_names(field: &str, names: &[String]) -> Result<(), FieldError> {
    for (i, n) in names.iter().enumerate() {
        if http::HeaderName::from_bytes(n.as_bytes()).is_err() {
            return Err(FieldError::new(
                format!("{field}[{i}]"),
                format!("{n:?} is not a valid header name"),
            ));
        }
    }
    Ok(())
}

impl PluginSchema for ForwardAuth {
    const NAME: &'static str = "forward-auth";
    const PRIORITY: i32 = 2002;

    fn check(&self) -> Result<(), FieldError> {
        self.target()?;
        if self.request_method == RequestMethod::Post {
            common::check_body_size("max_req_body_size", self.max_req_body_size)?;
        } else if self.max_req_body_size == 0 {
            // NB: unused with GET; only APISIX's minimum applies.
            return Err(FieldError::new("max_req_body_size", "must be at least 1"));
        }
        check_names("request_headers", &self.request_headers)?;
        check_names("upstream_headers", &self.upstream_headers)?;
        check_names("client_headers", &self.client_headers)?;
        if !(1..=60_000).contains(&self.timeout) {
            return Err(FieldError::new("timeout", "must be between 1 and 60000"));
        }
        if self.keepalive_timeout < 1000 {
            return Err(FieldError::new(
                "keepalive_timeout",
                "must be at least 1000",
            ));
        }
        if self.keepalive_pool < 1 {
            return Err(FieldError::new("keepalive_pool", "must be at least 1"));
        }
        common::check_status("status_on_error", self.status_on_error)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::common::MAX_BODY_LIMIT;
    use crate::{parse, validate};
    use serde_json::json;

    #[test]
    fn defaults_as_apisix() {
        let c: ForwardAuth = parse(&json!({"uri": "http://auth.default:8080/verify?x=1"})).unwrap();
        assert!(c.ssl_verify && c.keepalive && !c.allow_degradation);
        assert_eq!(c.request_method, RequestMethod::Get);
        assert_eq!(c.max_req_body_size, 64 << 20);
        assert_eq!(
            (
                c.timeout,
                c.keepalive_timeout,
                c.keepalive_pool,
                c.status_on_error
            ),
            (3000, 60_000, 5, 403)
        );
        let t = c.target().unwrap();
        assert_eq!(
            t,
            Target {
                tls: false,
                host: "auth.default".into(),
                port: 8080,
                authority: "auth.default:8080".into(),
                path_and_query: "/verify?x=1".into(),
            }
        );
        let t = parse::<ForwardAuth>(&json!({"uri": "https://[::1]"}))
            .unwrap()
            .target()
            .unwrap();
        assert_eq!((t.tls, t.host.as_str(), t.port), (true, "::1", 443));
        assert_eq!(t.path_and_query, "/");
    }

    #[test]
    fn checks() {
        for (conf, want) in [
            (json!({}), "plugin \"forward-auth\": missing field `uri`"),
            (
                json!({"uri": "ftp://a/"}),
                "plugin \"forward-auth\": uri: must start with http:// or https://",
            ),
            (
                json!({"uri": "/auth"}),
                "plugin \"forward-auth\": uri: must start with http:// or https://",
            ),
            (
                json!({"uri": "http://a/", "timeout": 0}),
                "plugin \"forward-auth\": timeout: must be between 1 and 60000",
            ),
            (
                json!({"uri": "http://a/", "timeout": 60001}),
                "plugin \"forward-auth\": timeout: must be between 1 and 60000",
            ),
            (
                json!({"uri": "http://a/", "keepalive_timeout": 999}),
                "plugin \"forward-auth\": keepalive_timeout: must be at least 1000",
            ),
            (
                json!({"uri": "http://a/", "keepalive_pool": 0}),
                "plugin \"forward-auth\": keepalive_pool: must be at least 1",
            ),
            (
                json!({"uri": "http://a/", "status_on_error": 600}),
                "plugin \"forward-auth\": status_on_error: 600 is out of range 200..=599",
            ),
            (
                json!({"uri": "http://a/", "request_headers": ["ok", "bad name"]}),
                "plugin \"forward-auth\": request_headers[1]: \"bad name\" is not a valid header name",
            ),
        ] {
            assert_eq!(
                validate("forward-auth", &conf).unwrap_err().to_string(),
                want,
                "{conf}"
            );
        }
        let c: ForwardAuth =
            parse(&json!({"uri": "http://a/", "request_method": "POST", "max_req_body_size": 10}))
                .unwrap();
        assert_eq!(
            (c.request_method, c.max_req_body_size),
            (RequestMethod::Post, 10)
        );
        for n in [0, MAX_BODY_LIMIT + 1] {
            let e = validate(
                "forward-auth",
                &json!({"uri": "http://a/", "request_method": "POST", "max_req_body_size": n}),
            )
            .unwrap_err()
            .to_string();
            assert_eq!(
                e,
                format!(
                    "plugin \"forward-auth\": max_req_body_size: {n} is out of range \
                     1..=67108864 (Sluice holds the body in memory)"
                )
            );
        }
        // With GET the body is not read: only APISIX's minimum applies.
        validate(
            "forward-auth",
            &json!({"uri": "http://a/", "max_req_body_size": MAX_BODY_LIMIT + 1}),
        )
        .unwrap();
        let e = validate(
            "forward-auth",
            &json!({"uri": "http://a/", "request_method": "PUT"}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("request_method: unknown variant `PUT`"), "{e}");
        // Secret values are strings.
        validate(
            "forward-auth",
            &json!({"uri": "http://a/", "timeout": "500", "allow_degradation": "true"}),
        )
        .unwrap();
    }
}
