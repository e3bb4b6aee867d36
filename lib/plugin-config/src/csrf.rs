//! `csrf`: double-submit cookie protection of unsafe methods.

use serde::Deserialize;

use crate::key_auth::http_token;
use crate::{FieldError, PluginSchema};

/// Configuration of `csrf` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Csrf {
    /// Secret that signs the tokens. Required, not empty.
    pub key: String,
    /// Lifetime of a token in seconds (0 = tokens never expire); default 7200.
    #[serde(default = "default_expires")]
    pub expires: i64,
    /// Name of the token's cookie and of the header that must repeat it; default
    /// `apisix-csrf-token`.
    #[serde(default = "default_name")]
    pub name: String,
}

fn default_expires() -> i64 {
    7200
}

fn default_name() -> String {
    "apisix-csrf-token".into()
}

impl PluginSchema for Csrf {
    const NAME: &'static str = "csrf";
    const PRIORITY: i32 = 2980;

    fn check(&self) -> Result<(), FieldError> {
        // NB: APISIX accepts an empty key; tokens signed with it can be forged by anyone.
        if self.key.is_empty() {
            return Err(FieldError::new("key", "must not be empty"));
        }
        if self.expires < 0 {
            return Err(FieldError::new("expires", "must not be negative"));
        }
        if !http_token(&self.name) {
            return Err(FieldError::new(
                "name",
                "must be a valid header and cookie name",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::validate;
    use serde_json::json;

    #[test]
    fn checks() {
        validate("csrf", &json!({"key": "k"})).unwrap();
        for (conf, want) in [
            (json!({}), "plugin \"csrf\": missing field `key`"),
            (
                json!({"key": ""}),
                "plugin \"csrf\": key: must not be empty",
            ),
            (
                json!({"key": "k", "expires": -1}),
                "plugin \"csrf\": expires: must not be negative",
            ),
            (
                json!({"key": "k", "name": "a b"}),
                "plugin \"csrf\": name: must be a valid header and cookie name",
            ),
        ] {
            assert_eq!(validate("csrf", &conf).unwrap_err().to_string(), want);
        }
    }
}
