//! `cors`: Cross-Origin Resource Sharing headers and preflight answers.

use regex::Regex;
use serde::Deserialize;

use crate::{FieldError, PluginSchema};

/// Configuration of `cors` (APISIX 3.x schema and defaults).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cors {
    /// Comma-separated origins (`scheme://host[:port]`), `*` (any; not with
    /// `allow_credential`) or `**` (any, echoing the request's Origin); default `*`.
    #[serde(default = "star")]
    pub allow_origins: String,
    /// Comma-separated methods, `*` or `**`; default `*`.
    #[serde(default = "star")]
    pub allow_methods: String,
    /// Comma-separated request headers, `*` or `**` (echo `Access-Control-Request-Headers`);
    /// default `*`.
    #[serde(default = "star")]
    pub allow_headers: String,
    /// Comma-separated response headers exposed, `*` or `**`; default: none sent.
    #[serde(default)]
    pub expose_headers: Option<String>,
    /// Seconds a preflight result may be cached (`-1` disables); default 5.
    #[serde(default = "default_max_age")]
    pub max_age: i64,
    /// Allow credentials (cookies); then `*` is not allowed in the other fields. Default
    /// false.
    #[serde(default)]
    pub allow_credential: bool,
    /// Origins allowed by regex; when set, `allow_origins` is ignored.
    #[serde(default)]
    pub allow_origins_by_regex: Option<Vec<String>>,
    /// Plugin metadata is not supported by Sluice (rejected).
    #[serde(default)]
    pub allow_origins_by_metadata: Option<serde_json::Value>,
    /// Origins given `Timing-Allow-Origin` (same forms as `allow_origins`); default none.
    #[serde(default)]
    pub timing_allow_origins: Option<String>,
    /// Origins given `Timing-Allow-Origin` by regex; replaces `timing_allow_origins`.
    #[serde(default)]
    pub timing_allow_origins_by_regex: Option<Vec<String>>,
    /// Sluice extension (the Gateway API CORS filter): `Access-Control-Allow-Methods` is the
    /// request's `Access-Control-Request-Method` (left out without one) instead of
    /// `allow_methods`, which is then ignored. Default false.
    #[serde(default)]
    pub echo_request_method: bool,
    /// Sluice extension (the Gateway API CORS filter): only preflight requests (`OPTIONS`
    /// with `Origin` and `Access-Control-Request-Method`) are answered by the plugin; any
    /// other `OPTIONS` request goes upstream. Default false: every `OPTIONS` request is
    /// answered, as APISIX does.
    #[serde(default)]
    pub preflight_only: bool,
}

fn star() -> String {
    "*".into()
}

fn default_max_age() -> i64 {
    5
}

impl Cors {
    /// The compiled `allow_origins_by_regex`.
    pub fn origin_regexes(&self) -> Result<Vec<Regex>, FieldError> {
        compile_regexes(
            "allow_origins_by_regex",
            self.allow_origins_by_regex.as_ref(),
        )
    }

    /// The compiled `timing_allow_origins_by_regex`.
    pub fn timing_regexes(&self) -> Result<Vec<Regex>, FieldError> {
        compile_regexes(
            "timing_allow_origins_by_regex",
            self.timing_allow_origins_by_regex.as_ref(),
        )
    }
}

fn compile_regexes(field: &str, list: Option<&Vec<String>>) -> Result<Vec<Regex>, FieldError> {
    if list.is_some_and(Vec::is_empty) {
        return Err(FieldError::new(field, "must not be empty"));
    }
    list.into_iter()
        .flatten()
        .enumerate()
        .map(|(i, p)| {
            // NB: a search, not a whole match, as APISIX (`ngx.re.find`): anchor the pattern
            // (`^https://.*\.example\.com$`) to match whole origins.
            Regex::new(p)
                .map_err(|e| FieldError::new(format!("{field}[{i}]"), format!("bad regex: {e}")))
        })
        .collect()
}

impl PluginSchema for Cors {
    const NAME: &'static str = "cors";
    const PRIORITY: i32 = 4000;

    fn check(&self) -> Result<(), FieldError> {
        if self.allow_credential {
            for (field, v) in [
                ("allow_origins", Some(&self.allow_origins)),
                (
                    "allow_methods",
                    Some(&self.allow_methods).filter(|_| !self.echo_request_method),
                ),
                ("allow_headers", Some(&self.allow_headers)),
                ("expose_headers", self.expose_headers.as_ref()),
            ] {
                if v.is_some_and(|v| v == "*") {
                    return Err(FieldError::new(
                        field,
                        "\"*\" is not allowed when allow_credential is true (use \"**\" to \
                         allow any value anyway, or list the values)",
                    ));
                }
            }
        }
        if self.max_age < -1 {
            return Err(FieldError::new("max_age", "must be -1 or more"));
        }
        if self.allow_origins_by_metadata.is_some() {
            return Err(FieldError::new(
                "allow_origins_by_metadata",
                "is not supported by Sluice (no plugin metadata); list the origins in \
                 allow_origins or allow_origins_by_regex",
            ));
        }
        if let Some(t) = &self.timing_allow_origins
            && (t.trim().is_empty() || http::HeaderValue::from_str(t).is_err())
        {
            return Err(FieldError::new(
                "timing_allow_origins",
                "must be non-empty printable ASCII",
            ));
        }
        self.timing_regexes()?;
        for (field, v) in [
            ("allow_origins", &self.allow_origins),
            ("allow_methods", &self.allow_methods),
            ("allow_headers", &self.allow_headers),
        ] {
            if v.trim().is_empty() {
                return Err(FieldError::new(field, "must not be empty"));
            }
            if http::HeaderValue::from_str(v).is_err() {
                return Err(FieldError::new(field, "must be printable ASCII"));
            }
        }
        if let Some(v) = &self.expose_headers
            && http::HeaderValue::from_str(v).is_err()
        {
            return Err(FieldError::new("expose_headers", "must be printable ASCII"));
        }
        self.origin_regexes().map(|_| ())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::validate;
    use serde_json::json;

    #[test]
    fn checks() {
        validate("cors", &json!({})).unwrap();
        validate("cors", &json!({"allow_origins": "**", "allow_credential": true, "allow_methods": "**", "allow_headers": "**"})).unwrap();
        let e = validate("cors", &json!({"allow_credential": true, "allow_origins": "https://a", "allow_methods": "GET", "allow_headers": "x", "expose_headers": "*"})).unwrap_err();
        assert!(
            e.to_string()
                .contains("expose_headers: \"*\" is not allowed"),
            "{e}"
        );
        // The method is echoed: `*` is not sent, so it is allowed with credentials.
        validate("cors", &json!({"allow_origins": "**", "allow_credential": true, "allow_methods": "*", "allow_headers": "**", "echo_request_method": true, "preflight_only": true})).unwrap();
        let e = validate("cors", &json!({"max_age": -2})).unwrap_err();
        assert!(e.to_string().contains("max_age: must be -1 or more"), "{e}");
        let e = validate("cors", &json!({"allow_origins_by_metadata": ["x"]})).unwrap_err();
        assert!(
            e.to_string()
                .contains("allow_origins_by_metadata: is not supported"),
            "{e}"
        );
        let e = validate("cors", &json!({"timing_allow_origins_by_regex": []})).unwrap_err();
        assert!(
            e.to_string()
                .contains("timing_allow_origins_by_regex: must not be empty"),
            "{e}"
        );
        let e = validate("cors", &json!({"allow_origin": "*"})).unwrap_err();
        assert!(
            e.to_string().contains("unknown field `allow_origin`"),
            "{e}"
        );
    }
}
