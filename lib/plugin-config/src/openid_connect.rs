//! `openid-connect`: validate OAuth 2.0 bearer tokens issued by an OpenID Connect provider
//! (APISIX's field names and defaults). Only the bearer flow (`bearer_only: true`) is
//! supported; the browser authorization-code flow (redirects, session cookies) is refused.

use serde::Deserialize;
use serde_json::Value;

use crate::{FieldError, PluginSchema, common};

/// What happens to a request without a token (APISIX `unauth_action`).
///
/// NB: in the bearer flow APISIX answers 401 to a request without a token whatever this
/// says (the choice only steers the browser flow); Sluice does the same, so `pass` never
/// opens a bearer-only route.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnauthAction {
    /// Redirect to the provider (browser flow). The default.
    #[default]
    Auth,
    /// Answer 401.
    Deny,
    /// Let the request through (browser flow only).
    Pass,
}

/// How the plugin authenticates to the introspection endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntrospectionAuth {
    /// `Authorization: Basic base64(urlencode(client_id):urlencode(client_secret))`. The
    /// default.
    #[default]
    ClientSecretBasic,
    /// `client_id` and `client_secret` in the form body.
    ClientSecretPost,
    /// A JWT signed with `client_rsa_private_key` (refused: not supported yet).
    PrivateKeyJwt,
    /// A JWT signed with `client_secret` (refused: not supported yet).
    ClientSecretJwt,
}

/// `claim_validator.issuer`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerValidator {
    /// Issuers a token may come from; default: the discovery document's `issuer`.
    #[serde(default)]
    pub valid_issuers: Option<Vec<String>>,
}

/// `claim_validator.audience`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AudienceValidator {
    /// Name of the claim holding the audience; default `aud`.
    #[serde(default = "default_aud")]
    pub claim: String,
    /// The claim must be present; default false.
    #[serde(default)]
    pub required: bool,
    /// The claim must be, or contain, `client_id`; default false.
    #[serde(default)]
    pub match_with_client_id: bool,
}

fn default_aud() -> String {
    "aud".into()
}

/// `claim_validator`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimValidator {
    /// Issuer check.
    #[serde(default)]
    pub issuer: Option<IssuerValidator>,
    /// Audience check; none by default (as APISIX).
    #[serde(default)]
    pub audience: Option<AudienceValidator>,
}

/// Configuration of `openid-connect` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenidConnect {
    /// OAuth client id. Required.
    pub client_id: String,
    /// OAuth client secret; required for introspection (never logged, redacted in
    /// `/snapshot`).
    #[serde(default)]
    pub client_secret: Option<String>,
    /// URL of the provider's `.well-known/openid-configuration`. Required.
    pub discovery: String,
    /// Scopes asked for in the browser flow; default `openid` (unused by the bearer flow).
    #[serde(default = "default_scope")]
    pub scope: String,
    /// Scopes the token must carry (its `scope` claim); missing ones answer 403.
    #[serde(default)]
    pub required_scopes: Option<Vec<String>>,
    /// Realm of `WWW-Authenticate` on a 401; default `apisix`.
    #[serde(default = "default_realm")]
    pub realm: String,
    /// Require a bearer token; default false (the browser flow), which Sluice refuses.
    #[serde(default)]
    pub bearer_only: bool,
    /// Verify the provider's TLS certificates; default true.
    #[serde(default = "common::yes")]
    pub ssl_verify: bool,
    /// Timeout of each request to the provider, seconds (at least 1); default 3.
    #[serde(default = "default_timeout")]
    pub timeout: u64,
    /// RFC 7662 token introspection endpoint; default: the discovery document's.
    #[serde(default)]
    pub introspection_endpoint: Option<String>,
    /// How to authenticate to the introspection endpoint; default `client_secret_basic`.
    #[serde(default)]
    pub introspection_endpoint_auth_method: IntrospectionAuth,
    /// Client request headers copied into the introspection request; default none.
    #[serde(default)]
    pub introspection_addon_headers: Option<Vec<String>>,
    /// PEM public key that signs the tokens (instead of JWKS or introspection).
    #[serde(default)]
    pub public_key: Option<String>,
    /// Verify tokens against the keys of the discovery document's `jwks_uri`; default false.
    #[serde(default)]
    pub use_jwks: bool,
    /// The one algorithm tokens must be signed with (`RS256` ...); default: any asymmetric
    /// algorithm that fits the key.
    #[serde(default)]
    pub token_signing_alg_values_expected: Option<String>,
    /// Set the token on the upstream request; default true.
    #[serde(default = "common::yes")]
    pub set_access_token_header: bool,
    /// ... in `Authorization: Bearer` instead of `X-Access-Token`; default false.
    #[serde(default)]
    pub access_token_in_authorization_header: bool,
    /// `X-ID-Token` (browser flow only); default true.
    #[serde(default = "common::yes")]
    pub set_id_token_header: bool,
    /// `X-Userinfo`: base64 of the token's claims as JSON; default true.
    #[serde(default = "common::yes")]
    pub set_userinfo_header: bool,
    /// `X-Raw-ID-Token` (browser flow only); default false.
    #[serde(default)]
    pub set_raw_id_token_header: bool,
    /// `X-Refresh-Token` (browser flow only); default false.
    #[serde(default)]
    pub set_refresh_token_header: bool,
    /// What a request without a token gets; see [`UnauthAction`]. Default `auth`.
    #[serde(default)]
    pub unauth_action: UnauthAction,
    /// Issuer and audience checks.
    #[serde(default)]
    pub claim_validator: Option<ClaimValidator>,
    /// Seconds the discovery document and signing keys are cached; default 86400.
    #[serde(default = "default_jwk_expires_in")]
    pub jwk_expires_in: u64,
    /// Clock skew allowed on `exp` and `nbf`, seconds; default 120.
    #[serde(default = "default_iat_slack")]
    pub iat_slack: u64,
    /// Introspection cache TTL (accepted; Sluice does not cache introspection results).
    #[serde(default)]
    pub introspection_interval: Option<u64>,
    /// Expiry claim for the introspection cache (accepted; no cache).
    #[serde(default)]
    pub introspection_expiry_claim: Option<String>,
    /// Re-verify cached tokens (accepted; Sluice verifies every request).
    #[serde(default)]
    pub jwt_verification_cache_ignore: Option<bool>,
    /// Cache segment name (accepted; no cache).
    #[serde(default)]
    pub cache_segment: Option<String>,
    /// Token endpoint authentication (browser flow; ignored).
    #[serde(default)]
    pub token_endpoint_auth_method: Option<String>,
    /// Refused: JSON-schema validation of claims is not supported yet.
    #[serde(default)]
    pub claim_schema: Option<Value>,
    /// Refused: an HTTP proxy to the provider is not supported yet.
    #[serde(default)]
    pub proxy_opts: Option<Value>,
    /// Refused with `introspection_endpoint_auth_method: private_key_jwt` (unsupported).
    #[serde(default)]
    pub client_rsa_private_key: Option<String>,
    // Browser-flow and client-assertion settings: accepted so that APISIX configurations
    // load, and ignored by the bearer flow (as APISIX ignores them there).
    #[serde(default)]
    #[doc(hidden)]
    pub session: Option<Value>,
    #[serde(default)]
    #[doc(hidden)]
    pub session_contents: Option<Value>,
    #[serde(default)]
    #[doc(hidden)]
    pub logout_path: Option<String>,
    #[serde(default)]
    #[doc(hidden)]
    pub redirect_uri: Option<String>,
    #[serde(default)]
    #[doc(hidden)]
    pub post_logout_redirect_uri: Option<String>,
    #[serde(default)]
    #[doc(hidden)]
    pub use_pkce: Option<bool>,
    #[serde(default)]
    #[doc(hidden)]
    pub par: Option<Value>,
    #[serde(default)]
    #[doc(hidden)]
    pub dpop: Option<Value>,
    #[serde(default)]
    #[doc(hidden)]
    pub authorization_params: Option<Value>,
    #[serde(default)]
    #[doc(hidden)]
    pub client_rsa_private_key_id: Option<String>,
    #[serde(default)]
    #[doc(hidden)]
    pub client_jwt_assertion_expires_in: Option<u64>,
    #[serde(default)]
    #[doc(hidden)]
    pub client_jwt_assertion_alg: Option<String>,
    #[serde(default)]
    #[doc(hidden)]
    pub client_jwt_assertion_audience: Option<String>,
    #[serde(default)]
    #[doc(hidden)]
    pub renew_access_token_on_expiry: Option<bool>,
    #[serde(default)]
    #[doc(hidden)]
    pub access_token_expires_in: Option<u64>,
    #[serde(default)]
    #[doc(hidden)]
    pub refresh_session_interval: Option<u64>,
    #[serde(default)]
    #[doc(hidden)]
    pub accept_none_alg: Option<bool>,
    #[serde(default)]
    #[doc(hidden)]
    pub accept_unsupported_alg: Option<bool>,
    #[serde(default)]
    #[doc(hidden)]
    pub access_token_expires_leeway: Option<u64>,
    #[serde(default)]
    #[doc(hidden)]
    pub force_reauthorize: Option<bool>,
    #[serde(default)]
    #[doc(hidden)]
    pub use_nonce: Option<bool>,
    #[serde(default)]
    #[doc(hidden)]
    pub revoke_tokens_on_logout: Option<bool>,
}

fn default_scope() -> String {
    "openid".into()
}
fn default_realm() -> String {
    "apisix".into()
}
fn default_timeout() -> u64 {
    3
}
fn default_jwk_expires_in() -> u64 {
    86_400
}
fn default_iat_slack() -> u64 {
    120
}

/// Signature algorithms accepted for bearer tokens: asymmetric only (`none` and the HMAC
/// family are refused: a provider's public keys must never act as shared secrets).
pub const ALGORITHMS: &[&str] = &[
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];

/// How a token is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Signature against `public_key`.
    PublicKey,
    /// Signature against the provider's JWKS.
    Jwks,
    /// RFC 7662 introspection.
    Introspection,
}

pub use crate::common::Target;

impl OpenidConnect {
    /// How tokens are checked: `public_key` first, then `use_jwks`, else introspection
    /// (APISIX's order).
    pub fn mode(&self) -> Mode {
        if self.public_key.is_some() {
            Mode::PublicKey
        } else if self.use_jwks {
            Mode::Jwks
        } else {
            Mode::Introspection
        }
    }

    /// The parsed [`OpenidConnect::discovery`].
    pub fn discovery_target(&self) -> Result<Target, FieldError> {
        common::parse_http_url("discovery", &self.discovery)
    }

    /// The parsed [`OpenidConnect::introspection_endpoint`], if set.
    pub fn introspection_target(&self) -> Result<Option<Target>, FieldError> {
        self.introspection_endpoint
            .as_deref()
            .map(|u| common::parse_http_url("introspection_endpoint", u))
            .transpose()
    }
}

impl PluginSchema for OpenidConnect {
    const NAME: &'static str = "openid-connect";
    const PRIORITY: i32 = 2599;

    fn check(&self) -> Result<(), FieldError> {
        if !self.bearer_only {
            return Err(FieldError::new(
                "bearer_only",
                "the browser authorization-code flow (bearer_only: false: redirects to the \
                 provider, session cookies) is not supported by Sluice yet; set \
                 bearer_only: true to validate bearer tokens",
            ));
        }
        if self.client_id.is_empty() {
            return Err(FieldError::new("client_id", "must not be empty"));
        }
        self.discovery_target()?;
        self.introspection_target()?;
        if self.timeout < 1 {
            return Err(FieldError::new("timeout", "must be at least 1 (seconds)"));
        }
        if self.jwk_expires_in < 1 {
            return Err(FieldError::new("jwk_expires_in", "must be at least 1"));
        }
        if self
            .realm
            .chars()
            .any(|c| c == '"' || c == '\\' || c.is_control())
        {
            return Err(FieldError::new(
                "realm",
                "must not contain quotes, backslashes or control characters",
            ));
        }
        if let Some(alg) = &self.token_signing_alg_values_expected
            && !ALGORITHMS.contains(&alg.as_str())
        {
            return Err(FieldError::new(
                "token_signing_alg_values_expected",
                format!(
                    "{alg:?} is not supported (one of {}; `none` and HMAC are refused)",
                    ALGORITHMS.join(", ")
                ),
            ));
        }
        if let Some(pem) = &self.public_key
            && !pem.contains("-----BEGIN")
        {
            return Err(FieldError::new("public_key", "must be a PEM public key"));
        }
        if self.mode() == Mode::Introspection {
            match self.introspection_endpoint_auth_method {
                IntrospectionAuth::ClientSecretBasic | IntrospectionAuth::ClientSecretPost => {}
                _ => {
                    return Err(FieldError::new(
                        "introspection_endpoint_auth_method",
                        "only client_secret_basic and client_secret_post are supported yet",
                    ));
                }
            }
            if self.client_secret.as_deref().is_none_or(str::is_empty) {
                return Err(FieldError::new(
                    "client_secret",
                    "required for token introspection (without public_key or use_jwks)",
                ));
            }
        }
        for (i, n) in self
            .introspection_addon_headers
            .iter()
            .flatten()
            .enumerate()
        {
            if http::HeaderName::from_bytes(n.as_bytes()).is_err() {
                return Err(FieldError::new(
                    format!("introspection_addon_headers[{i}]"),
                    format!("{n:?} is not a valid header name"),
                ));
            }
        }
        if self.claim_schema.is_some() {
            return Err(FieldError::new(
                "claim_schema",
                "JSON-schema validation of claims is not supported by Sluice yet",
            ));
        }
        if self.proxy_opts.is_some() {
            return Err(FieldError::new(
                "proxy_opts",
                "reaching the provider through an HTTP proxy is not supported by Sluice yet",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::{parse, validate};
    use serde_json::json;

    const D: &str = "https://idp.example.com/.well-known/openid-configuration";

    #[test]
    fn defaults_as_apisix() {
        let c: OpenidConnect = parse(&json!({
            "client_id": "api", "client_secret": "s", "discovery": D, "bearer_only": true
        }))
        .unwrap();
        assert_eq!(c.mode(), Mode::Introspection);
        assert_eq!(
            (c.realm.as_str(), c.scope.as_str(), c.timeout),
            ("apisix", "openid", 3)
        );
        assert!(c.ssl_verify && c.set_access_token_header && c.set_userinfo_header);
        assert!(c.set_id_token_header && !c.access_token_in_authorization_header);
        assert_eq!(
            c.introspection_endpoint_auth_method,
            IntrospectionAuth::ClientSecretBasic
        );
        assert_eq!(c.unauth_action, UnauthAction::Auth);
        assert_eq!((c.jwk_expires_in, c.iat_slack), (86_400, 120));
        let c: OpenidConnect = parse(&json!({
            "client_id": "api", "discovery": D, "bearer_only": "true", "use_jwks": "true",
            "session": {"secret": "0123456789abcdef"}, "logout_path": "/out",
            "claim_validator": {"audience": {"match_with_client_id": true}}
        }))
        .unwrap();
        assert_eq!(c.mode(), Mode::Jwks);
        let aud = c.claim_validator.unwrap().audience.unwrap();
        assert_eq!(
            (aud.claim.as_str(), aud.required, aud.match_with_client_id),
            ("aud", false, true)
        );
    }

    #[test]
    fn checks() {
        let base =
            json!({"client_id": "api", "discovery": D, "bearer_only": true, "use_jwks": true});
        let with = |extra: Value| {
            let mut v = base.clone();
            for (k, x) in extra.as_object().unwrap() {
                v[k] = x.clone();
            }
            validate("openid-connect", &v).map_err(|e| e.to_string())
        };
        with(json!({})).unwrap();
        for (extra, want) in [
            (
                json!({"bearer_only": false}),
                "plugin \"openid-connect\": bearer_only: the browser authorization-code flow",
            ),
            (
                json!({"discovery": "ftp://idp/.well-known"}),
                "plugin \"openid-connect\": discovery: must start with http:// or https://",
            ),
            (
                json!({"token_signing_alg_values_expected": "HS256"}),
                "plugin \"openid-connect\": token_signing_alg_values_expected: \"HS256\" is not supported",
            ),
            (
                json!({"token_signing_alg_values_expected": "none"}),
                "plugin \"openid-connect\": token_signing_alg_values_expected: \"none\" is not supported",
            ),
            (
                json!({"use_jwks": false}),
                "plugin \"openid-connect\": client_secret: required for token introspection",
            ),
            (
                json!({"use_jwks": false, "client_secret": "s", "introspection_endpoint_auth_method": "private_key_jwt"}),
                "plugin \"openid-connect\": introspection_endpoint_auth_method: only client_secret_basic",
            ),
            (
                json!({"timeout": 0}),
                "plugin \"openid-connect\": timeout: must be at least 1",
            ),
            (
                json!({"realm": "a\"b"}),
                "plugin \"openid-connect\": realm: must not contain quotes",
            ),
            (
                json!({"claim_schema": {"type": "object"}}),
                "plugin \"openid-connect\": claim_schema: JSON-schema validation",
            ),
            (
                json!({"public_key": "abc"}),
                "plugin \"openid-connect\": public_key: must be a PEM public key",
            ),
            (
                json!({"unauth_action": "redirect"}),
                "plugin \"openid-connect\": unauth_action: unknown variant `redirect`",
            ),
            (
                json!({"introspection_addon_headers": ["bad name"]}),
                "plugin \"openid-connect\": introspection_addon_headers[0]: \"bad name\" is not",
            ),
        ] {
            let e = with(extra.clone()).unwrap_err();
            assert!(e.starts_with(want), "{extra}: {e}");
        }
        let e = validate(
            "openid-connect",
            &json!({"discovery": D, "bearer_only": true}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("missing field `client_id`"), "{e}");
        let e = with(json!({"unknown_field": 1})).unwrap_err();
        assert!(e.contains("unknown_field"), "{e}");
    }
}
