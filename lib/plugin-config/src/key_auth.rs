//! `key-auth`: a consumer is identified by an API key in a header or query argument.

use serde::Deserialize;

use crate::{ConsumerSchema, FieldError, PluginSchema};

/// Route configuration of `key-auth`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct KeyAuth {
    /// Header carrying the key; default `apikey`.
    #[serde(default = "apikey")]
    pub header: String,
    /// Query argument carrying the key (the header wins); default `apikey`.
    #[serde(default = "apikey")]
    pub query: String,
    /// Remove the key before proxying; default false.
    #[serde(default)]
    pub hide_credentials: bool,
}

fn apikey() -> String {
    "apikey".into()
}

impl PluginSchema for KeyAuth {
    const NAME: &'static str = "key-auth";
    const PRIORITY: i32 = 2500;

    fn check(&self) -> Result<(), FieldError> {
        if http_token(&self.header) {
            Ok(())
        } else {
            Err(FieldError::new("header", "must be a valid header name"))
        }
    }
}

/// A consumer's `key-auth` credential.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct KeyAuthConsumer {
    /// The API key. Required, not empty.
    pub key: String,
}

impl ConsumerSchema for KeyAuthConsumer {
    fn check(&self) -> Result<(), FieldError> {
        if self.key.is_empty() {
            return Err(FieldError::new("key", "must not be empty"));
        }
        Ok(())
    }
}

pub(crate) fn http_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}
