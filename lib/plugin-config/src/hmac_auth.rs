//! `hmac-auth` (APISIX 3.x): a consumer is identified by an HTTP signature,
//! `Authorization: Signature keyId="...",algorithm="...",headers="...",signature="..."`.

use serde::Deserialize;

use crate::key_auth::http_token;
use crate::{ConsumerSchema, FieldError, PluginSchema, common};

/// An HMAC algorithm of `hmac-auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum HmacAlgorithm {
    /// HMAC-SHA1.
    #[serde(rename = "hmac-sha1")]
    Sha1,
    /// HMAC-SHA256.
    #[serde(rename = "hmac-sha256")]
    Sha256,
    /// HMAC-SHA512.
    #[serde(rename = "hmac-sha512")]
    Sha512,
}

impl HmacAlgorithm {
    /// The name clients send (`hmac-sha256`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha1 => "hmac-sha1",
            Self::Sha256 => "hmac-sha256",
            Self::Sha512 => "hmac-sha512",
        }
    }
}

/// Route configuration of `hmac-auth`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct HmacAuth {
    /// Algorithms a client may use; default all three.
    #[serde(default = "all_algorithms")]
    pub allowed_algorithms: Vec<HmacAlgorithm>,
    /// Largest difference in seconds between the `Date` header and now; default 300.
    #[serde(default = "default_clock_skew")]
    pub clock_skew: u64,
    /// Headers every signature must cover; default `["date"]`.
    #[serde(default = "default_signed_headers")]
    pub signed_headers: Vec<String>,
    /// Check the `Digest: SHA-256=<base64>` header against the request body (after the
    /// signature); default false.
    #[serde(default)]
    pub validate_request_body: bool,
    /// Largest body read for `validate_request_body`, bytes, 1..=64 MiB; a larger one is
    /// answered 413. Default 64 MiB (APISIX's).
    #[serde(default = "common::default_max_req_body_size")]
    pub max_req_body_size: u64,
    /// Remove `Authorization` before proxying; default false.
    #[serde(default)]
    pub hide_credentials: bool,
    /// Realm of the `WWW-Authenticate: hmac realm="<realm>"` challenge; default `hmac`.
    #[serde(default = "default_realm")]
    pub realm: String,
    /// APISIX's anonymous consumer (rejected: not supported yet).
    #[serde(default)]
    pub anonymous_consumer: Option<String>,
}

fn all_algorithms() -> Vec<HmacAlgorithm> {
    vec![
        HmacAlgorithm::Sha1,
        HmacAlgorithm::Sha256,
        HmacAlgorithm::Sha512,
    ]
}
fn default_clock_skew() -> u64 {
    300
}
fn default_signed_headers() -> Vec<String> {
    vec!["date".into()]
}
fn default_realm() -> String {
    "hmac".into()
}

impl PluginSchema for HmacAuth {
    const NAME: &'static str = "hmac-auth";
    const PRIORITY: i32 = 2530;

    fn check(&self) -> Result<(), FieldError> {
        if self.allowed_algorithms.is_empty() {
            return Err(FieldError::new("allowed_algorithms", "must not be empty"));
        }
        if self.clock_skew == 0 {
            return Err(FieldError::new("clock_skew", "must be at least 1"));
        }
        for (i, h) in self.signed_headers.iter().enumerate() {
            let ok = h.len() <= 50 && (h == "@request-target" || http_token(h));
            if !ok {
                return Err(FieldError::new(
                    format!("signed_headers[{i}]"),
                    "must be a header name (or @request-target) of 1..=50 characters",
                ));
            }
        }
        if self.validate_request_body {
            common::check_body_size("max_req_body_size", self.max_req_body_size)?;
        } else if self.max_req_body_size == 0 {
            // NB: unused without validate_request_body; only APISIX's minimum applies.
            return Err(FieldError::new("max_req_body_size", "must be at least 1"));
        }
        if self.anonymous_consumer.is_some() {
            return Err(FieldError::new("anonymous_consumer", "not supported yet"));
        }
        let realm_ok = !self.realm.is_empty()
            && self
                .realm
                .bytes()
                .all(|b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\');
        if !realm_ok {
            return Err(FieldError::new(
                "realm",
                "must be printable ASCII without '\"' or '\\'",
            ));
        }
        Ok(())
    }
}

/// A consumer's `hmac-auth` credential (APISIX 3.x: `key_id`, `secret_key`).
///
/// The fields APISIX 2.x kept on the consumer (`access_key`, `algorithm`, `clock_skew`,
/// `signed_headers`, `keep_headers`, `encode_uri_params`, `validate_request_body`,
/// `max_req_body`) are accepted, as ApisixConsumer still has them: `access_key` stands for
/// `key_id` when that is unset; the others are ignored (the route's config decides).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct HmacAuthConsumer {
    /// Key id the client sends as `keyId`; 1..=256 characters. Required (or `access_key`).
    #[serde(default)]
    pub key_id: Option<String>,
    /// Shared secret; 1..=256 characters. Required.
    pub secret_key: String,
    /// APISIX 2.x name of `key_id`.
    #[serde(default)]
    pub access_key: Option<String>,
}

impl HmacAuthConsumer {
    /// The key id: `key_id`, else `access_key`.
    pub fn key_id(&self) -> &str {
        self.key_id
            .as_deref()
            .or(self.access_key.as_deref())
            .unwrap_or_default()
    }
}

impl ConsumerSchema for HmacAuthConsumer {
    fn check(&self) -> Result<(), FieldError> {
        let id = self.key_id();
        if id.is_empty() {
            return Err(FieldError::new("key_id", "required, not empty"));
        }
        if id.chars().count() > 256 {
            return Err(FieldError::new("key_id", "must be at most 256 characters"));
        }
        let n = self.secret_key.chars().count();
        if n == 0 || n > 256 {
            return Err(FieldError::new("secret_key", "must be 1..=256 characters"));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::{validate, validate_consumer};
    use serde_json::json;

    #[test]
    fn route_checks() {
        validate("hmac-auth", &json!({})).unwrap();
        validate("hmac-auth", &json!({"signed_headers": ["@request-target", "x-a"], "allowed_algorithms": ["hmac-sha512"]})).unwrap();
        for (conf, want) in [
            (
                json!({"allowed_algorithms": []}),
                "plugin \"hmac-auth\": allowed_algorithms: must not be empty",
            ),
            (
                json!({"clock_skew": 0}),
                "plugin \"hmac-auth\": clock_skew: must be at least 1",
            ),
            (
                json!({"signed_headers": ["date", "bad header"]}),
                "plugin \"hmac-auth\": signed_headers[1]: must be a header name (or @request-target) of 1..=50 characters",
            ),
            (
                json!({"realm": "a\"b"}),
                "plugin \"hmac-auth\": realm: must be printable ASCII without '\"' or '\\'",
            ),
            (
                json!({"anonymous_consumer": "anon"}),
                "plugin \"hmac-auth\": anonymous_consumer: not supported yet",
            ),
        ] {
            assert_eq!(validate("hmac-auth", &conf).unwrap_err().to_string(), want);
        }
        let e = validate("hmac-auth", &json!({"allowed_algorithms": ["hmac-md5"]})).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "plugin \"hmac-auth\": allowed_algorithms[0]: unknown variant `hmac-md5`"
            ),
            "{e}"
        );
        validate(
            "hmac-auth",
            &json!({"validate_request_body": true, "max_req_body_size": 1024}),
        )
        .unwrap();
        let e = validate(
            "hmac-auth",
            &json!({"validate_request_body": true, "max_req_body_size": (64 << 20) + 1}),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "plugin \"hmac-auth\": max_req_body_size: 67108865 is out of range 1..=67108864 \
             (Sluice holds the body in memory)"
        );
        let e = validate("hmac-auth", &json!({"max_req_body_size": 0})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "plugin \"hmac-auth\": max_req_body_size: must be at least 1"
        );
    }

    #[test]
    fn consumer_checks() {
        validate_consumer("hmac-auth", &json!({"key_id": "a", "secret_key": "s"})).unwrap();
        validate_consumer("hmac-auth", &json!({"access_key": "a", "secret_key": "s", "algorithm": "hmac-sha256", "clock_skew": 10})).unwrap();
        for (conf, want) in [
            (
                json!({"secret_key": "s"}),
                "plugin \"hmac-auth\": key_id: required, not empty",
            ),
            (
                json!({"key_id": "a"}),
                "plugin \"hmac-auth\": missing field `secret_key`",
            ),
            (
                json!({"key_id": "a", "secret_key": ""}),
                "plugin \"hmac-auth\": secret_key: must be 1..=256 characters",
            ),
        ] {
            assert_eq!(
                validate_consumer("hmac-auth", &conf)
                    .unwrap_err()
                    .to_string(),
                want
            );
        }
    }
}
