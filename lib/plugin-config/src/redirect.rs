//! `redirect`: answer with a redirect (`http_to_https`, `uri`, `regex_uri`).

use serde::Deserialize;

use crate::rewrite::{self, RegexUri, ValueTemplate};
use crate::{FieldError, PluginSchema};

/// Configuration of `redirect` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Redirect {
    /// Redirect plain-HTTP requests to `https://$host$request_uri` (301 for GET/HEAD, 308
    /// otherwise); requests already on HTTPS (or with `X-Forwarded-Proto: https`) pass.
    #[serde(default)]
    pub http_to_https: bool,
    /// Target of the redirect (may hold `$var`s; absent variables are empty).
    #[serde(default)]
    pub uri: Option<String>,
    /// `[pattern, replacement]`: redirect when the path matches; otherwise the request is
    /// proxied.
    #[serde(default)]
    pub regex_uri: Option<Vec<String>>,
    /// Status of the redirect (with `uri` / `regex_uri`), at least 200; default 302.
    #[serde(default = "default_ret_code")]
    pub ret_code: u16,
    /// Percent-encode the `Location` path (RFC 3986); default false.
    #[serde(default)]
    pub encode_uri: bool,
    /// Append the request's query string to `Location`; default false.
    #[serde(default)]
    pub append_query_string: bool,
}

fn default_ret_code() -> u16 {
    302
}

/// What a compiled `redirect` does.
#[derive(Debug, Clone)]
pub enum Target {
    /// `http_to_https`.
    HttpToHttps,
    /// `uri`.
    Uri(ValueTemplate),
    /// `regex_uri`.
    Regex(RegexUri),
}

impl Redirect {
    /// The compiled target.
    pub fn target(&self) -> Result<Target, FieldError> {
        let set = usize::from(self.http_to_https)
            + usize::from(self.uri.is_some())
            + usize::from(self.regex_uri.is_some());
        if set != 1 {
            return Err(FieldError::new(
                "",
                "exactly one of http_to_https, uri and regex_uri is required",
            ));
        }
        if self.http_to_https && self.append_query_string {
            return Err(FieldError::new(
                "append_query_string",
                "cannot be used with http_to_https (the query string is kept already)",
            ));
        }
        if let Some(u) = &self.uri {
            if u.is_empty() {
                return Err(FieldError::new("uri", "must not be empty"));
            }
            return ValueTemplate::parse(u)
                .map(Target::Uri)
                .map_err(|r| FieldError::new("uri", r));
        }
        if let Some(l) = &self.regex_uri {
            let mut pairs = rewrite::compile_regex_uri(l, 1)?;
            if let Some(p) = pairs.pop() {
                return Ok(Target::Regex(p));
            }
        }
        Ok(Target::HttpToHttps)
    }
}

impl PluginSchema for Redirect {
    const NAME: &'static str = "redirect";
    const PRIORITY: i32 = 900;

    fn check(&self) -> Result<(), FieldError> {
        if !(200..=599).contains(&self.ret_code) {
            return Err(FieldError::new(
                "ret_code",
                format!("{} is out of range 200..=599", self.ret_code),
            ));
        }
        self.target().map(|_| ())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::validate;
    use serde_json::json;

    #[test]
    fn checks() {
        validate("redirect", &json!({"http_to_https": "true"})).unwrap();
        let e = validate("redirect", &json!({})).unwrap_err();
        assert!(e.to_string().contains("exactly one of"), "{e}");
        let e = validate(
            "redirect",
            &json!({"http_to_https": true, "append_query_string": true}),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("append_query_string: cannot be used"),
            "{e}"
        );
        let e = validate("redirect", &json!({"regex_uri": ["a", "b", "c", "d"]})).unwrap_err();
        assert!(e.to_string().contains("regex_uri: at most 1"), "{e}");
    }
}
