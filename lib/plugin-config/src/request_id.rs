//! `request-id`: a unique id per request in a header, upstream and back to the client.

use serde::Deserialize;

use crate::{FieldError, PluginSchema};

/// How ids are made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// A random UUID v4 (the default).
    #[default]
    Uuid,
    /// A random id of `range_id.length` characters from `range_id.char_set`.
    RangeId,
    /// nanoid (21 characters of `A-Za-z0-9_-`).
    Nanoid,
    /// KSUID: 27 base62 characters, ordered by time (seconds).
    Ksuid,
    /// UUID v7: ordered by time (milliseconds).
    Uuidv7,
}

/// `range_id` settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RangeId {
    /// Characters to draw from; default `abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789`.
    #[serde(default = "default_charset")]
    pub char_set: String,
    /// Length, at least 6; default 16.
    #[serde(default = "default_length")]
    pub length: usize,
}

impl Default for RangeId {
    fn default() -> Self {
        RangeId {
            char_set: default_charset(),
            length: default_length(),
        }
    }
}

fn default_charset() -> String {
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789".into()
}

fn default_length() -> usize {
    16
}

/// Configuration of `request-id` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestId {
    /// Header carrying the id; default `X-Request-Id`.
    #[serde(default = "default_header")]
    pub header_name: String,
    /// Send the id back on the response; default true.
    #[serde(default = "crate::common::yes")]
    pub include_in_response: bool,
    /// How ids are made; default `uuid`.
    #[serde(default)]
    pub algorithm: Algorithm,
    /// Settings of `range_id`.
    #[serde(default)]
    pub range_id: RangeId,
}

fn default_header() -> String {
    "X-Request-Id".into()
}

impl PluginSchema for RequestId {
    const NAME: &'static str = "request-id";
    const PRIORITY: i32 = 12015;

    fn check(&self) -> Result<(), FieldError> {
        if http::HeaderName::from_bytes(self.header_name.to_ascii_lowercase().as_bytes()).is_err() {
            return Err(FieldError::new("header_name", "not a valid header name"));
        }
        if self.range_id.length < 6 {
            return Err(FieldError::new("range_id.length", "must be at least 6"));
        }
        if self.range_id.char_set.chars().count() < 6
            || !self.range_id.char_set.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(FieldError::new(
                "range_id.char_set",
                "must hold at least 6 printable ASCII characters",
            ));
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
    fn checks() {
        let c: RequestId = crate::parse(&json!({})).unwrap();
        assert_eq!(c.header_name, "X-Request-Id");
        assert!(c.include_in_response);
        assert_eq!(c.algorithm, Algorithm::Uuid);
        let e = validate("request-id", &json!({"header_name": "bad header"})).unwrap_err();
        assert!(
            e.to_string()
                .contains("header_name: not a valid header name"),
            "{e}"
        );
        let e = validate("request-id", &json!({"range_id": {"char_set": "abc"}})).unwrap_err();
        assert!(e.to_string().contains("range_id.char_set"), "{e}");
    }
}
