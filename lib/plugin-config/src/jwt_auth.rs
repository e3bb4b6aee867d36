//! `jwt-auth`: a consumer is identified by a signed JSON Web Token.

use base64::Engine as _;
use jsonwebtoken::DecodingKey;
use serde::Deserialize;

use crate::key_auth::http_token;
use crate::{ConsumerSchema, FieldError, PluginSchema};

/// Route configuration of `jwt-auth`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct JwtAuth {
    /// Header carrying `Bearer <token>` (or the bare token); default `authorization`.
    #[serde(default = "authorization")]
    pub header: String,
    /// Query argument carrying the token; default `jwt`.
    #[serde(default = "jwt")]
    pub query: String,
    /// Cookie carrying the token; default `jwt`.
    #[serde(default = "jwt")]
    pub cookie: String,
    /// Remove the token before proxying; default false.
    #[serde(default)]
    pub hide_credentials: bool,
    /// Claim naming the consumer's `key`; default `key`.
    #[serde(default = "key")]
    pub key_claim_name: String,
}

fn authorization() -> String {
    "authorization".into()
}
fn jwt() -> String {
    "jwt".into()
}
fn key() -> String {
    "key".into()
}

impl PluginSchema for JwtAuth {
    const NAME: &'static str = "jwt-auth";
    const PRIORITY: i32 = 2510;

    fn check(&self) -> Result<(), FieldError> {
        if !http_token(&self.header) {
            return Err(FieldError::new("header", "must be a valid header name"));
        }
        if self.key_claim_name.is_empty() {
            return Err(FieldError::new("key_claim_name", "must not be empty"));
        }
        Ok(())
    }
}

/// Signature algorithms of `jwt-auth`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[allow(missing_docs)]
pub enum JwtAlgorithm {
    #[default]
    HS256,
    HS384,
    HS512,
    RS256,
    RS384,
    RS512,
    ES256,
    ES384,
    PS256,
    PS384,
    PS512,
    EdDSA,
}

impl JwtAlgorithm {
    /// Whether the algorithm uses a shared secret (HS*), not a public key.
    pub fn is_hmac(self) -> bool {
        matches!(self, Self::HS256 | Self::HS384 | Self::HS512)
    }
}

/// A consumer's `jwt-auth` credential.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct JwtAuthConsumer {
    /// The value of the token's key claim that selects this consumer. Required.
    pub key: String,
    /// HMAC secret (HS*). Required for HS* algorithms.
    #[serde(default)]
    pub secret: Option<String>,
    /// PEM public key (RS*, ES*, PS*, EdDSA). Required for those.
    #[serde(default)]
    pub public_key: Option<String>,
    /// PEM private key; accepted and ignored (Sluice only verifies tokens).
    #[serde(default)]
    pub private_key: Option<String>,
    /// Algorithm; default HS256.
    #[serde(default)]
    pub algorithm: JwtAlgorithm,
    /// Lifetime of tokens APISIX would sign, seconds; default 86400 (not used to verify).
    #[serde(default = "default_exp")]
    pub exp: u64,
    /// `secret` is base64; default false.
    #[serde(default)]
    pub base64_secret: bool,
    /// Clock leeway in seconds for `exp`/`nbf`; default 0.
    #[serde(default)]
    pub lifetime_grace_period: u64,
}

fn default_exp() -> u64 {
    86400
}

impl ConsumerSchema for JwtAuthConsumer {
    fn check(&self) -> Result<(), FieldError> {
        if self.key.is_empty() {
            return Err(FieldError::new("key", "must not be empty"));
        }
        if self.exp == 0 {
            return Err(FieldError::new("exp", "must be at least 1"));
        }
        if self.algorithm.is_hmac() {
            if self.secret.as_deref().is_none_or(str::is_empty) {
                return Err(FieldError::new(
                    "secret",
                    format!("required for algorithm {:?}", self.algorithm),
                ));
            }
        } else if self.public_key.as_deref().is_none_or(str::is_empty) {
            return Err(FieldError::new(
                "public_key",
                format!("required for algorithm {:?}", self.algorithm),
            ));
        }
        // NB: the key is parsed here, as the dataplane parses it, so a key it could not use
        // rejects the consumer with the field named, rather than being Accepted and then
        // answering every token with 401.
        self.decoding_key().map(drop)
    }
}

impl JwtAuthConsumer {
    /// The key that verifies this consumer's tokens: `secret` (decoded when
    /// `base64_secret`) for HS*, else `public_key` as PEM for the algorithm's key type.
    pub fn decoding_key(&self) -> Result<DecodingKey, FieldError> {
        let pem = || self.public_key.as_deref().unwrap_or_default().as_bytes();
        let secret = self.secret.as_deref().unwrap_or_default();
        let key = match self.algorithm {
            a if a.is_hmac() => {
                if !self.base64_secret {
                    return Ok(DecodingKey::from_secret(secret.as_bytes()));
                }
                return base64::engine::general_purpose::STANDARD
                    .decode(secret.trim())
                    .map(|raw| DecodingKey::from_secret(&raw))
                    .map_err(|e| {
                        FieldError::new(
                            "secret",
                            format!("not base64 (base64_secret is true): {e}"),
                        )
                    });
            }
            JwtAlgorithm::ES256 | JwtAlgorithm::ES384 => DecodingKey::from_ec_pem(pem()),
            JwtAlgorithm::EdDSA => DecodingKey::from_ed_pem(pem()),
            _ => DecodingKey::from_rsa_pem(pem()),
        };
        key.map_err(|e| {
            FieldError::new(
                "public_key",
                format!("not a PEM public key for {:?}: {e}", self.algorithm),
            )
        })
    }
}
