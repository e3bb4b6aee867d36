//! `basic-auth`: a consumer is identified by HTTP Basic credentials.

use serde::Deserialize;

use crate::{ConsumerSchema, FieldError, PluginSchema};

/// Route configuration of `basic-auth`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct BasicAuth {
    /// Remove the `Authorization` header before proxying; default false.
    #[serde(default)]
    pub hide_credentials: bool,
}

impl PluginSchema for BasicAuth {
    const NAME: &'static str = "basic-auth";
    const PRIORITY: i32 = 2520;
}

/// A consumer's `basic-auth` credential.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BasicAuthConsumer {
    /// User name. Required, not empty, no `:`.
    pub username: String,
    /// Password. Required.
    pub password: String,
}

impl ConsumerSchema for BasicAuthConsumer {
    fn check(&self) -> Result<(), FieldError> {
        if self.username.is_empty() {
            return Err(FieldError::new("username", "must not be empty"));
        }
        if self.username.contains(':') {
            return Err(FieldError::new("username", "must not contain ':'"));
        }
        Ok(())
    }
}
