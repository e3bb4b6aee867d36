//! `response-rewrite`: change the status, headers or body of responses.

use base64::Engine as _;
use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

use crate::expr::{self, Expr};
use crate::rewrite::{self, HeaderOps};
use crate::{FieldError, PluginSchema};

/// Scope of a body filter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The first match only (the default).
    #[default]
    Once,
    /// Every match.
    Global,
}

/// One `filters` entry: a regex replaced in the body.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    /// The pattern.
    pub regex: String,
    /// `once` (default) or `global`.
    #[serde(default)]
    pub scope: Scope,
    /// The replacement (`$1`... captures).
    pub replace: String,
    /// PCRE options; `jo` (the default) and `i` are understood.
    #[serde(default = "default_options")]
    pub options: String,
}

fn default_options() -> String {
    "jo".into()
}

/// Configuration of `response-rewrite` (APISIX schema).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseRewrite {
    /// New status, 200..=598.
    #[serde(default)]
    pub status_code: Option<u16>,
    /// New body (replaces the upstream's).
    #[serde(default)]
    pub body: Option<String>,
    /// `body` is base64 (decoded once); default false.
    #[serde(default)]
    pub body_base64: bool,
    /// `{add, set, remove}` or a flat map (set).
    #[serde(default)]
    pub headers: Option<Value>,
    /// Condition (lua-resty-expr subset) for the whole rewrite; default always.
    #[serde(default)]
    pub vars: Option<Value>,
    /// Regex replacements in the body (not with `body`).
    #[serde(default)]
    pub filters: Option<Vec<Filter>>,
    /// Largest body `filters` buffer, in bytes; a longer body passes unfiltered. Default
    /// 64 MiB.
    #[serde(default = "default_max_body")]
    pub max_resp_body_size: u64,
}

fn default_max_body() -> u64 {
    67_108_864
}

/// A compiled body filter.
#[derive(Debug, Clone)]
pub struct CompiledFilter {
    /// The pattern.
    pub regex: Regex,
    /// Replace every match.
    pub global: bool,
    /// The replacement in `regex` crate syntax.
    pub replace: String,
}

/// A compiled `response-rewrite`.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// New status.
    pub status: Option<u16>,
    /// New body.
    pub body: Option<Vec<u8>>,
    /// Header operations.
    pub headers: HeaderOps,
    /// Condition.
    pub vars: Option<Expr>,
    /// Body filters.
    pub filters: Vec<CompiledFilter>,
    /// `max_resp_body_size`.
    pub max_body: usize,
}

/// Turns `$1` / `${1}` into the `regex` crate's `${1}`.
fn replacement(s: &str) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' {
            let digits = s[i + 1..].bytes().take_while(u8::is_ascii_digit).count();
            if digits > 0 {
                out.push_str("${");
                out.push_str(&s[i + 1..i + 1 + digits]);
                out.push('}');
                i += 1 + digits;
                continue;
            }
            if s[i + 1..].starts_with('{') {
                out.push('$');
                i += 1;
                continue;
            }
            out.push_str("$$");
            i += 1;
            continue;
        }
        let ch_len = s[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&s[i..i + ch_len]);
        i += ch_len;
    }
    out
}

impl ResponseRewrite {
    /// Compiles the config.
    pub fn compile(&self) -> Result<Compiled, FieldError> {
        if self.max_resp_body_size == 0 {
            return Err(FieldError::new("max_resp_body_size", "must be at least 1"));
        }
        if let Some(s) = self.status_code
            && !(200..=598).contains(&s)
        {
            return Err(FieldError::new(
                "status_code",
                format!("{s} is out of range 200..=598"),
            ));
        }
        let body = match &self.body {
            Some(b) if self.body_base64 => Some(
                base64::engine::general_purpose::STANDARD
                    .decode(b.trim())
                    .map_err(|e| FieldError::new("body", format!("not base64: {e}")))?,
            ),
            Some(b) => Some(b.clone().into_bytes()),
            None if self.body_base64 => {
                return Err(FieldError::new("body_base64", "needs body"));
            }
            None => None,
        };
        if body.is_some() && self.filters.is_some() {
            return Err(FieldError::new("filters", "cannot be used with body"));
        }
        let headers = match &self.headers {
            Some(h) => rewrite::compile_header_ops("headers", h)?,
            None => HeaderOps::default(),
        };
        let vars = match &self.vars {
            Some(v) => Some(expr::compile("vars", v)?),
            None => None,
        };
        let mut filters = Vec::new();
        for (i, f) in self.filters.iter().flatten().enumerate() {
            if f.regex.is_empty() {
                return Err(FieldError::new(
                    format!("filters[{i}].regex"),
                    "must not be empty",
                ));
            }
            let ci = f.options.contains('i');
            if let Some(c) = f.options.chars().find(|c| !"joi".contains(*c)) {
                return Err(FieldError::new(
                    format!("filters[{i}].options"),
                    format!("option {c:?} is not supported (supported: j, o, i)"),
                ));
            }
            let regex = regex::RegexBuilder::new(&f.regex)
                .case_insensitive(ci)
                .build()
                .map_err(|e| {
                    FieldError::new(format!("filters[{i}].regex"), format!("bad regex: {e}"))
                })?;
            filters.push(CompiledFilter {
                regex,
                global: f.scope == Scope::Global,
                replace: replacement(&f.replace),
            });
        }
        if let Some(f) = &self.filters
            && f.is_empty()
        {
            return Err(FieldError::new("filters", "must not be empty"));
        }
        Ok(Compiled {
            status: self.status_code,
            body,
            headers,
            vars,
            filters,
            max_body: usize::try_from(self.max_resp_body_size).unwrap_or(usize::MAX),
        })
    }
}

impl PluginSchema for ResponseRewrite {
    const NAME: &'static str = "response-rewrite";
    const PRIORITY: i32 = 899;

    fn check(&self) -> Result<(), FieldError> {
        self.compile().map(|_| ())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn replacements() {
        assert_eq!(replacement("a$1b${2}c$x"), "a${1}b${2}c$$x");
    }

    #[test]
    fn checks() {
        crate::validate(
            "response-rewrite",
            &serde_json::json!({"status_code": "404", "vars": [["status", "==", 200]]}),
        )
        .unwrap();
        let e = crate::validate(
            "response-rewrite",
            &serde_json::json!({"body": "x", "filters": [{"regex": "a", "replace": "b"}]}),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("filters: cannot be used with body"),
            "{e}"
        );
        let e = crate::validate(
            "response-rewrite",
            &serde_json::json!({"filters": [{"regex": "a", "replace": "b", "options": "jx"}]}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("filters[0].options"), "{e}");
        let e = crate::validate(
            "response-rewrite",
            &serde_json::json!({"filters": [{"regex": "a", "replace": "b", "scope": "all"}]}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown variant `all`"), "{e}");
    }
}
