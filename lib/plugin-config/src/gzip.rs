//! `gzip`: compress responses for clients that accept gzip.

use serde::Deserialize;
use serde_json::Value;

use crate::{FieldError, PluginSchema};

/// Configuration of `gzip` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gzip {
    /// Content types compressed (`["*"]` or `"*"` for any); default `["text/html"]`.
    #[serde(default = "default_types")]
    pub types: Value,
    /// Smallest `Content-Length` compressed; default 20.
    #[serde(default = "default_min_length")]
    pub min_length: u64,
    /// Compression level 1..=9; default 1.
    #[serde(default = "default_level")]
    pub comp_level: u32,
    /// Lowest HTTP version compressed, 1.1 or 1.0; default 1.1.
    #[serde(default = "default_version")]
    pub http_version: f64,
    /// nginx buffers (accepted and ignored: Sluice compresses as it streams).
    #[serde(default)]
    pub buffers: Option<Value>,
    /// Add `Vary: Accept-Encoding`; default false.
    #[serde(default)]
    pub vary: bool,
}

fn default_types() -> Value {
    Value::Array(vec![Value::String("text/html".into())])
}

fn default_min_length() -> u64 {
    20
}

fn default_level() -> u32 {
    1
}

fn default_version() -> f64 {
    1.1
}

impl Gzip {
    /// The content types (lower-case, without parameters); `None` means any.
    pub fn type_list(&self) -> Result<Option<Vec<String>>, FieldError> {
        match &self.types {
            Value::String(s) if s == "*" => Ok(None),
            Value::Array(a) if a.iter().any(|v| v.as_str() == Some("*")) => Ok(None),
            Value::Array(a) if !a.is_empty() => a
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str()
                        .filter(|s| !s.is_empty())
                        .map(|s| s.trim().to_ascii_lowercase())
                        .ok_or_else(|| {
                            FieldError::new(format!("types[{i}]"), "must be a non-empty string")
                        })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            _ => Err(FieldError::new(
                "types",
                "must be \"*\" or a non-empty array of content types",
            )),
        }
    }
}

impl PluginSchema for Gzip {
    const NAME: &'static str = "gzip";
    const PRIORITY: i32 = 995;

    fn check(&self) -> Result<(), FieldError> {
        if !(1..=9).contains(&self.comp_level) {
            return Err(FieldError::new("comp_level", "must be 1..=9"));
        }
        if self.http_version != 1.1 && self.http_version != 1.0 {
            return Err(FieldError::new("http_version", "must be 1.1 or 1.0"));
        }
        if self.min_length == 0 {
            return Err(FieldError::new("min_length", "must be at least 1"));
        }
        self.type_list().map(|_| ())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::validate;
    use serde_json::json;

    #[test]
    fn checks() {
        let g: Gzip = crate::parse(&json!({})).unwrap();
        assert_eq!(g.type_list().unwrap(), Some(vec!["text/html".to_owned()]));
        assert_eq!(g.min_length, 20);
        assert_eq!(g.comp_level, 1);
        let g: Gzip = crate::parse(&json!({"types": "*"})).unwrap();
        assert_eq!(g.type_list().unwrap(), None);
        let e = validate("gzip", &json!({"http_version": 2})).unwrap_err();
        assert!(
            e.to_string().contains("http_version: must be 1.1 or 1.0"),
            "{e}"
        );
        let e = validate("gzip", &json!({"types": "text/html"})).unwrap_err();
        assert!(e.to_string().contains("types: must be"), "{e}");
    }
}
