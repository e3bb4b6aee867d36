//! `proxy-rewrite`: rewrite the request Sluice forwards upstream (URI, method, Host,
//! headers).

use serde::Deserialize;
use serde_json::Value;

use crate::rewrite::{self, HeaderOps, RegexUri, ValueTemplate};
use crate::{FieldError, PluginSchema};

/// Methods APISIX accepts for `method`.
pub const METHODS: &[&str] = &[
    "GET", "POST", "PUT", "HEAD", "DELETE", "OPTIONS", "MKCOL", "COPY", "MOVE", "PROPFIND", "LOCK",
    "UNLOCK", "PATCH", "TRACE",
];

/// Configuration of `proxy-rewrite` (APISIX schema).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyRewrite {
    /// New upstream path (may hold `$var`s); wins over `regex_uri`. The query string of the
    /// request is appended.
    #[serde(default)]
    pub uri: Option<String>,
    /// `[pattern, replacement, ...]`: the first pattern matching the path rewrites it
    /// (`$1`... captures); no match keeps the path.
    #[serde(default)]
    pub regex_uri: Option<Vec<String>>,
    /// New `Host` header sent upstream.
    #[serde(default)]
    pub host: Option<String>,
    /// New request method.
    #[serde(default)]
    pub method: Option<String>,
    /// `{add, set, remove}` or a flat map (set; an empty value removes).
    #[serde(default)]
    pub headers: Option<Value>,
    /// Forward the request URI exactly as received (no normalisation); default false.
    #[serde(default)]
    pub use_real_request_uri_unsafe: bool,
    /// Deprecated in APISIX (upstream scheme); only `http` is accepted here.
    #[serde(default)]
    pub scheme: Option<String>,
}

/// A compiled `proxy-rewrite`.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// `uri`.
    pub uri: Option<ValueTemplate>,
    /// `regex_uri` pairs.
    pub regex_uri: Vec<RegexUri>,
    /// `host`.
    pub host: Option<http::HeaderValue>,
    /// `method`.
    pub method: Option<http::Method>,
    /// `headers`.
    pub headers: HeaderOps,
}

impl ProxyRewrite {
    /// Compiles the config.
    pub fn compile(&self) -> Result<Compiled, FieldError> {
        let uri = match &self.uri {
            Some(u) if !u.starts_with('/') && !u.starts_with('$') => {
                return Err(FieldError::new("uri", "must start with / (or a variable)"));
            }
            Some(u) => Some(ValueTemplate::parse(u).map_err(|r| FieldError::new("uri", r))?),
            None => None,
        };
        let regex_uri = match &self.regex_uri {
            Some(l) => rewrite::compile_regex_uri(l, 64)?,
            None => Vec::new(),
        };
        let host = match &self.host {
            Some(h) if h.is_empty() => return Err(FieldError::new("host", "must not be empty")),
            Some(h) => Some(
                http::HeaderValue::from_str(h)
                    .map_err(|_| FieldError::new("host", "not a valid Host value"))?,
            ),
            None => None,
        };
        let method = match &self.method {
            Some(m) if METHODS.contains(&m.as_str()) => http::Method::from_bytes(m.as_bytes()).ok(),
            Some(m) => {
                return Err(FieldError::new(
                    "method",
                    format!("{m:?} is not one of {}", METHODS.join(", ")),
                ));
            }
            None => None,
        };
        let headers = match &self.headers {
            Some(h) => rewrite::compile_header_ops("headers", h)?,
            None => HeaderOps::default(),
        };
        if let Some(s) = &self.scheme
            && s != "http"
        {
            return Err(FieldError::new(
                "scheme",
                "only http is supported here; set the upstream's scheme instead (ApisixUpstream scheme)",
            ));
        }
        Ok(Compiled {
            uri,
            regex_uri,
            host,
            method,
            headers,
        })
    }
}

impl PluginSchema for ProxyRewrite {
    const NAME: &'static str = "proxy-rewrite";
    const PRIORITY: i32 = 1008;

    fn check(&self) -> Result<(), FieldError> {
        self.compile().map(|_| ())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::validate;
    use serde_json::json;

    #[test]
    fn checks() {
        let e = validate("proxy-rewrite", &json!({"uri": ["/x"]})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "plugin \"proxy-rewrite\": uri: invalid type: sequence, expected a string"
        );
        let e = validate("proxy-rewrite", &json!({"uri": "no-slash"})).unwrap_err();
        assert!(e.to_string().contains("uri: must start with /"), "{e}");
        let e = validate("proxy-rewrite", &json!({"host": ""})).unwrap_err();
        assert!(e.to_string().contains("host: must not be empty"), "{e}");
        let e = validate("proxy-rewrite", &json!({"scheme": "https"})).unwrap_err();
        assert!(e.to_string().contains("scheme: only http"), "{e}");
        let e = validate("proxy-rewrite", &json!({"hots": "x"})).unwrap_err();
        assert!(e.to_string().contains("unknown field `hots`"), "{e}");
        validate(
            "proxy-rewrite",
            &json!({"uri": "/$arg_x", "method": "PUT", "use_real_request_uri_unsafe": "true"}),
        )
        .unwrap();
    }
}
