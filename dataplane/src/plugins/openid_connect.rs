//! `openid-connect` (priority 2599, rewrite phase): validates OAuth 2.0 bearer tokens issued
//! by an OpenID Connect provider, as APISIX's bearer flow (`bearer_only: true`) does. The
//! browser authorization-code flow is not supported (the config is refused).
//!
//! The token is the `Authorization: Bearer <token>` header's (scheme case-insensitive), or,
//! without an `Authorization` header, the client's `X-Access-Token`. The client's
//! `X-Access-Token`, `X-Userinfo`, `X-ID-Token`, `X-Refresh-Token` and `X-Raw-ID-Token` never
//! reach the upstream. It is checked, in APISIX's order of preference, against:
//!
//! - `public_key` (PEM): its signature;
//! - `use_jwks`: its signature, with the key of its `kid` from the provider's JWKS (the
//!   discovery document's `jwks_uri`);
//! - else RFC 7662 introspection at `introspection_endpoint` (default: the discovery
//!   document's), authenticated with `client_id`/`client_secret`; `active: true` passes.
//!
//! Signed tokens must use an asymmetric algorithm (RS/PS 256-512, ES256/384, EdDSA; only
//! `token_signing_alg_values_expected` when set), carry `exp` (checked with `iat_slack`
//! seconds of leeway, as `nbf`), and an `iss` among `claim_validator.issuer.valid_issuers`
//! (default: the discovery document's `issuer`).
//!
//! Answers: no token → 401 `WWW-Authenticate: Bearer realm="<realm>"`; a malformed
//! `Authorization` header → 400; a bad token → 401 with
//! `error="invalid_token", error_description="..."`; missing `required_scopes` or a failed
//! `claim_validator.audience` check → 403 `{"error": ...}`. A valid token goes upstream in
//! `X-Access-Token` (or `Authorization: Bearer` with `access_token_in_authorization_header`)
//! with its claims (or the introspection answer) as base64 JSON in `X-Userinfo`.
//!
//! The discovery document and the keys are cached per provider, shared by routes and kept
//! across snapshots, for `jwk_expires_in` seconds; once stale they are refreshed in the
//! background while the cached ones keep serving, and a failed fetch keeps the last good
//! ones. A token whose `kid` is unknown makes one re-fetch of the JWKS at most every
//! [`UNKNOWN_KID_REFETCH`]. Every fetch is bounded by `timeout` and [`MAX_DOCUMENT`] bytes.
//! Tokens and `client_secret` are never logged.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};
use serde_json::{Value, json};
use sluice_plugin_config::openid_connect::{
    IntrospectionAuth, Mode, OpenidConnect as Config, Target,
};
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx, json_response, rejection};
use crate::upstream::tls::{Alpn, UpstreamTlsClient};

/// Most bytes of a discovery document, JWKS or introspection answer.
pub const MAX_DOCUMENT: usize = 256 * 1024;
/// Most keys kept from a JWKS (the rest are ignored).
pub const MAX_KEYS: usize = 64;
/// Least time between two JWKS re-fetches caused by tokens with an unknown `kid`.
pub const UNKNOWN_KID_REFETCH: Duration = Duration::from_secs(10);
/// Least time between a failed fetch and the next attempt (requests meanwhile use the cached
/// document and keys, or are refused when there are none).
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);
/// Most keys tried for a token without `kid`.
const MAX_TRIED: usize = 8;

const RSA_ALGS: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];
const ALL_ALGS: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// Client headers removed before the upstream sees the request (the plugin sets them).
const STRIPPED: [&str; 5] = [
    "x-access-token",
    "x-userinfo",
    "x-id-token",
    "x-refresh-token",
    "x-raw-id-token",
];

/// One verification key.
struct Key {
    kid: Option<String>,
    /// Algorithms this key may verify.
    algs: Vec<Algorithm>,
    key: DecodingKey,
}

/// The keys tokens are checked against.
#[derive(Default)]
struct KeySet {
    keys: Vec<Key>,
}

impl KeySet {
    /// Parses a JWKS document; keys that are not for signatures, symmetric, or of a kind
    /// Sluice cannot use are skipped.
    fn from_jwks(body: &[u8]) -> Result<KeySet, String> {
        let doc: Value = serde_json::from_slice(body).map_err(|e| format!("JWKS: {e}"))?;
        let Some(list) = doc.get("keys").and_then(Value::as_array) else {
            return Err("JWKS: no `keys` array".into());
        };
        let mut keys = Vec::new();
        for v in list {
            if keys.len() == MAX_KEYS {
                break;
            }
            if v.get("use")
                .and_then(Value::as_str)
                .is_some_and(|u| u != "sig")
            {
                continue;
            }
            // NB: one key at a time: a key of an unknown kind must not spoil the others.
            let Ok(jwk) = serde_json::from_value::<Jwk>(v.clone()) else {
                continue;
            };
            let fits: Vec<Algorithm> = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => RSA_ALGS.to_vec(),
                AlgorithmParameters::EllipticCurve(p) => match p.curve {
                    EllipticCurve::P256 => vec![Algorithm::ES256],
                    EllipticCurve::P384 => vec![Algorithm::ES384],
                    _ => continue,
                },
                AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                    vec![Algorithm::EdDSA]
                }
                // Symmetric keys are never accepted from a JWKS.
                _ => continue,
            };
            let algs = match jwk.common.key_algorithm.map(signing_algorithm) {
                None => fits,
                Some(Some(a)) if fits.contains(&a) => vec![a],
                Some(_) => continue,
            };
            let Ok(key) = DecodingKey::from_jwk(&jwk) else {
                continue;
            };
            keys.push(Key {
                kid: jwk.common.key_id.clone(),
                algs,
                key,
            });
        }
        Ok(KeySet { keys })
    }

    /// The one key of a PEM public key.
    fn from_pem(pem: &str) -> Result<KeySet, String> {
        let b = pem.as_bytes();
        let (key, algs) = if let Ok(k) = DecodingKey::from_rsa_pem(b) {
            (k, RSA_ALGS.to_vec())
        } else if let Ok(k) = DecodingKey::from_ec_pem(b) {
            (k, vec![Algorithm::ES256, Algorithm::ES384])
        } else if let Ok(k) = DecodingKey::from_ed_pem(b) {
            (k, vec![Algorithm::EdDSA])
        } else {
            return Err("is not an RSA, EC or Ed25519 public key in PEM".into());
        };
        Ok(KeySet {
            keys: vec![Key {
                kid: None,
                algs,
                key,
            }],
        })
    }

    fn has_kid(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }
}

/// The signature algorithm a JWK's `alg` names (`None` for encryption algorithms).
fn signing_algorithm(a: KeyAlgorithm) -> Option<Algorithm> {
    Some(match a {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        // HMAC (never from a JWKS) and encryption algorithms.
        _ => return None,
    })
}

/// The fields of the discovery document Sluice reads.
#[derive(Debug, Default)]
struct Discovery {
    issuer: Option<String>,
    jwks_uri: Option<String>,
    introspection_endpoint: Option<String>,
}

#[derive(Default)]
struct Cache {
    doc: Option<(Arc<Discovery>, Instant)>,
    keys: Option<(Arc<KeySet>, Instant)>,
    last_kid_refetch: Option<Instant>,
    last_failure: Option<Instant>,
    refreshing: bool,
}

/// One provider (discovery URL and connection settings): its cached document and keys.
struct Provider {
    discovery: Target,
    http: SideHttp,
    ttl: Duration,
    cache: Mutex<Cache>,
    /// One fetch at a time per provider.
    fetch: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("discovery", &self.discovery.authority)
            .finish_non_exhaustive()
    }
}

impl Provider {
    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn recently_failed(c: &Cache) -> bool {
        c.last_failure
            .is_some_and(|t| t.elapsed() < RETRY_AFTER_FAILURE)
    }

    fn failed(&self, what: &str, error: &str) {
        self.lock().last_failure = Some(Instant::now());
        tracing::warn!(
            provider = %self.discovery.authority,
            error,
            "openid-connect: fetching the {what} failed; the last good one (if any) is kept"
        );
    }

    /// Starts a background refresh when the cache is stale (never more than one).
    fn refresh_if_stale(self: &Arc<Self>, fetched: Instant, with_keys: bool) {
        if fetched.elapsed() < self.ttl {
            return;
        }
        {
            let mut c = self.lock();
            if c.refreshing || Self::recently_failed(&c) {
                return;
            }
            c.refreshing = true;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            {
                let _one = me.fetch.lock().await;
                if me.fetch_document().await.is_ok() && with_keys {
                    let _ = me.fetch_keys().await;
                }
            }
            me.lock().refreshing = false;
        });
    }

    async fn fetch_document(&self) -> Result<Arc<Discovery>, String> {
        let r = async {
            let a = self.http.get(&self.discovery).await?;
            if a.status != StatusCode::OK {
                return Err(format!("status {}", a.status.as_u16()));
            }
            let v: Value = serde_json::from_slice(&a.body).map_err(|e| e.to_string())?;
            let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
            Ok(Arc::new(Discovery {
                issuer: s("issuer"),
                jwks_uri: s("jwks_uri"),
                introspection_endpoint: s("introspection_endpoint"),
            }))
        }
        .await;
        match r {
            Ok(d) => {
                self.lock().doc = Some((Arc::clone(&d), Instant::now()));
                Ok(d)
            }
            Err(e) => {
                self.failed("discovery document", &e);
                Err(e)
            }
        }
    }

    async fn fetch_keys(&self) -> Result<Arc<KeySet>, String> {
        let cached = self.lock().doc.clone();
        let doc = match cached {
            Some((d, _)) => d,
            None => self.fetch_document().await?,
        };
        let r = async {
            let Some(uri) = doc.jwks_uri.as_deref() else {
                return Err("the discovery document has no jwks_uri".to_owned());
            };
            let target = sluice_plugin_config::common::parse_http_url("jwks_uri", uri)
                .map_err(|e| e.to_string())?;
            let a = self.http.get(&target).await?;
            if a.status != StatusCode::OK {
                return Err(format!("status {}", a.status.as_u16()));
            }
            KeySet::from_jwks(&a.body).map(Arc::new)
        }
        .await;
        match r {
            Ok(k) => {
                self.lock().keys = Some((Arc::clone(&k), Instant::now()));
                Ok(k)
            }
            Err(e) => {
                self.failed("JWKS", &e);
                Err(e)
            }
        }
    }

    /// The discovery document: the cached one (refreshed in the background when stale), or
    /// fetched now when there is none.
    async fn document(self: &Arc<Self>) -> Result<Arc<Discovery>, String> {
        let cached = self.lock().doc.clone();
        if let Some((d, at)) = cached {
            self.refresh_if_stale(at, false);
            return Ok(d);
        }
        let _one = self.fetch.lock().await;
        {
            let c = self.lock();
            if let Some((d, _)) = &c.doc {
                return Ok(Arc::clone(d));
            }
            if Self::recently_failed(&c) {
                return Err("the provider failed recently".into());
            }
        }
        self.fetch_document().await
    }

    /// The signing keys, as [`Provider::document`].
    async fn keys(self: &Arc<Self>) -> Result<Arc<KeySet>, String> {
        let cached = self.lock().keys.clone();
        if let Some((k, at)) = cached {
            self.refresh_if_stale(at, true);
            return Ok(k);
        }
        let _one = self.fetch.lock().await;
        {
            let c = self.lock();
            if let Some((k, _)) = &c.keys {
                return Ok(Arc::clone(k));
            }
            if Self::recently_failed(&c) {
                return Err("the provider failed recently".into());
            }
        }
        self.fetch_keys().await
    }

    /// Re-fetches the JWKS for a token whose `kid` is not in `seen`, unless one such
    /// re-fetch happened in the last [`UNKNOWN_KID_REFETCH`].
    async fn keys_with(self: &Arc<Self>, kid: &str, seen: &Arc<KeySet>) -> Option<Arc<KeySet>> {
        let _one = self.fetch.lock().await;
        {
            let mut c = self.lock();
            // Another request may have fetched meanwhile.
            if let Some((k, _)) = &c.keys
                && !Arc::ptr_eq(k, seen)
                && k.has_kid(kid)
            {
                return Some(Arc::clone(k));
            }
            if c.last_kid_refetch
                .is_some_and(|t| t.elapsed() < UNKNOWN_KID_REFETCH)
            {
                return None;
            }
            c.last_kid_refetch = Some(Instant::now());
        }
        // NB: the document too: a provider that moved its jwks_uri is followed.
        let _ = self.fetch_document().await;
        self.fetch_keys().await.ok()
    }
}

/// Why a token is refused (an `error_description`, never the token).
#[derive(Debug)]
enum Denial {
    /// 401 invalid_token.
    Invalid(String),
    /// The token names a key the JWKS does not have.
    UnknownKid(String),
}

/// The plugin on one route.
#[derive(Debug)]
pub struct OpenidConnect {
    mode: Mode,
    client_id: String,
    client_secret: String,
    realm: String,
    provider: Arc<Provider>,
    public_key: Option<Arc<KeySet>>,
    algorithms: Vec<Algorithm>,
    valid_issuers: Option<Vec<String>>,
    leeway: u64,
    introspection: Option<Target>,
    introspection_auth: IntrospectionAuth,
    addon_headers: Vec<HeaderName>,
    required_scopes: Vec<String>,
    audience: Option<sluice_plugin_config::openid_connect::AudienceValidator>,
    set_access_token_header: bool,
    access_token_in_authorization_header: bool,
    set_userinfo_header: bool,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeySet({} keys)", self.keys.len())
    }
}

impl Builtin for OpenidConnect {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE.with(Hooks::ACCESS);

    /// Builds `openid-connect`.
    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let field = |field: &str, reason: String| ConfigError::Field {
            plugin: Config::NAME.into(),
            field: field.into(),
            reason,
        };
        let discovery = conf
            .discovery_target()
            .map_err(|e| field(&e.field, e.reason))?;
        let introspection = conf
            .introspection_target()
            .map_err(|e| field(&e.field, e.reason))?;
        let public_key = match &conf.public_key {
            Some(pem) => Some(Arc::new(
                KeySet::from_pem(pem).map_err(|e| field("public_key", e))?,
            )),
            None => None,
        };
        // A TLS client can be made (checked now, so that a bad trust store fails the build).
        if conf.ssl_verify {
            UpstreamTlsClient::for_probes(None, None, true)
                .map_err(|e| field("ssl_verify", e.to_string()))?;
        }
        let algorithms = match &conf.token_signing_alg_values_expected {
            Some(a) => ALL_ALGS
                .iter()
                .copied()
                .filter(|x| format!("{x:?}") == *a)
                .collect(),
            None => ALL_ALGS.to_vec(),
        };
        let key = format!(
            "openid-connect:{}:{}:{}:{}",
            conf.discovery, conf.ssl_verify, conf.timeout, conf.jwk_expires_in
        );
        let provider = cx.state.shared(&key, || Provider {
            discovery,
            http: SideHttp {
                ssl_verify: conf.ssl_verify,
                timeout: Duration::from_secs(conf.timeout),
                origins: Mutex::new(HashMap::new()),
            },
            ttl: Duration::from_secs(conf.jwk_expires_in),
            cache: Mutex::new(Cache::default()),
            fetch: tokio::sync::Mutex::new(()),
        });
        let cv = conf.claim_validator.clone().unwrap_or_default();
        Ok(OpenidConnect {
            mode: conf.mode(),
            client_id: conf.client_id.clone(),
            client_secret: conf.client_secret.clone().unwrap_or_default(),
            realm: conf.realm.clone(),
            provider,
            public_key,
            algorithms,
            valid_issuers: cv.issuer.and_then(|i| i.valid_issuers),
            leeway: conf.iat_slack,
            introspection,
            introspection_auth: conf.introspection_endpoint_auth_method,
            addon_headers: conf
                .introspection_addon_headers
                .iter()
                .flatten()
                .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
                .collect(),
            required_scopes: conf.required_scopes.clone().unwrap_or_default(),
            audience: cv.audience,
            set_access_token_header: conf.set_access_token_header,
            access_token_in_authorization_header: conf.access_token_in_authorization_header,
            set_userinfo_header: conf.set_userinfo_header,
        })
    }
}

/// Marks a request whose rewrite phase ran the plugin (the access phase then does nothing).
#[derive(Debug, Clone, Copy)]
struct Processed;

fn describe(e: &jsonwebtoken::errors::Error) -> String {
    match e.kind() {
        ErrorKind::ExpiredSignature => "JWT expired".into(),
        ErrorKind::ImmatureSignature => "JWT not valid yet (nbf)".into(),
        ErrorKind::InvalidIssuer => "invalid issuer".into(),
        ErrorKind::InvalidSignature => "invalid signature".into(),
        ErrorKind::MissingRequiredClaim(c) => format!("missing claim {c}"),
        ErrorKind::InvalidAlgorithm => "unexpected signing algorithm".into(),
        _ => "invalid token".into(),
    }
}

impl OpenidConnect {
    fn unauthorized(
        &self,
        description: Option<&str>,
    ) -> Box<Response<crate::upstream::body::ProxyBody>> {
        let mut resp = rejection(StatusCode::UNAUTHORIZED, None);
        let value = match description {
            None => format!("Bearer realm=\"{}\"", self.realm),
            Some(d) => format!(
                "Bearer realm=\"{}\", error=\"invalid_token\", error_description=\"{}\"",
                self.realm,
                d.replace(['"', '\\'], "'")
            ),
        };
        if let Ok(v) = HeaderValue::from_str(&value) {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
        Box::new(resp)
    }

    fn forbidden(error: &str) -> Box<Response<crate::upstream::body::ProxyBody>> {
        Box::new(json_response(
            StatusCode::FORBIDDEN,
            &json!({ "error": error }),
        ))
    }

    /// The issuers a token may come from.
    async fn issuers(&self) -> Result<Vec<String>, String> {
        if let Some(v) = &self.valid_issuers {
            return Ok(v.clone());
        }
        let doc = self.provider.document().await?;
        doc.issuer
            .clone()
            .map(|i| vec![i])
            .ok_or_else(|| "the discovery document has no issuer".into())
    }

    /// Checks `token`'s signature and claims against `keys`.
    fn verify(&self, token: &str, keys: &KeySet, issuers: &[String]) -> Result<Value, Denial> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| Denial::Invalid("malformed token".into()))?;
        if !self.algorithms.contains(&header.alg) {
            return Err(Denial::Invalid("unexpected signing algorithm".into()));
        }
        if let Some(kid) = &header.kid
            && self.public_key.is_none()
            && !keys.has_kid(kid)
        {
            return Err(Denial::UnknownKid(kid.clone()));
        }
        let mut validation = Validation::new(header.alg);
        validation.algorithms = vec![header.alg];
        validation.leeway = self.leeway;
        validation.validate_nbf = true;
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["exp", "iss"]);
        validation.set_issuer(issuers);
        let mut last = Denial::Invalid("no key fits the token's algorithm".into());
        let candidates = keys
            .keys
            .iter()
            .filter(|k| {
                self.public_key.is_some()
                    || header.kid.is_none()
                    || k.kid.as_deref() == header.kid.as_deref()
            })
            .filter(|k| k.algs.contains(&header.alg))
            .take(MAX_TRIED);
        for k in candidates {
            match jsonwebtoken::decode::<Value>(token, &k.key, &validation) {
                Ok(data) => return Ok(data.claims),
                Err(e) if matches!(e.kind(), ErrorKind::InvalidSignature) => {
                    last = Denial::Invalid(describe(&e));
                }
                Err(e) => return Err(Denial::Invalid(describe(&e))),
            }
        }
        Err(last)
    }

    async fn verify_signed(&self, token: &str) -> Result<Value, Denial> {
        let issuers = self
            .issuers()
            .await
            .map_err(|_| Denial::Invalid("issuer validation unavailable".into()))?;
        if let Some(keys) = &self.public_key {
            return self.verify(token, keys, &issuers);
        }
        let keys = self
            .provider
            .keys()
            .await
            .map_err(|_| Denial::Invalid("signing keys unavailable".into()))?;
        match self.verify(token, &keys, &issuers) {
            Err(Denial::UnknownKid(kid)) => match self.provider.keys_with(&kid, &keys).await {
                Some(fresh) => match self.verify(token, &fresh, &issuers) {
                    Err(Denial::UnknownKid(_)) => Err(Denial::Invalid("unknown key id".into())),
                    r => r,
                },
                None => Err(Denial::Invalid("unknown key id".into())),
            },
            r => r,
        }
    }

    async fn introspect(&self, token: &str, req: &request::Parts) -> Result<Value, Denial> {
        let unavailable = || Denial::Invalid("introspection unavailable".into());
        let target = match &self.introspection {
            Some(t) => t.clone(),
            None => {
                let doc = self.provider.document().await.map_err(|_| unavailable())?;
                let uri = doc
                    .introspection_endpoint
                    .as_deref()
                    .ok_or_else(unavailable)?;
                sluice_plugin_config::common::parse_http_url("introspection_endpoint", uri)
                    .map_err(|_| unavailable())?
            }
        };
        let mut body = String::from("token=");
        form_encode(token, &mut body);
        let mut headers = http::HeaderMap::new();
        for name in &self.addon_headers {
            if let Some(v) = req.headers.get(name) {
                headers.insert(name.clone(), v.clone());
            }
        }
        match self.introspection_auth {
            IntrospectionAuth::ClientSecretPost => {
                body.push_str("&client_id=");
                form_encode(&self.client_id, &mut body);
                body.push_str("&client_secret=");
                form_encode(&self.client_secret, &mut body);
            }
            _ => {
                let mut cred = String::new();
                form_encode(&self.client_id, &mut cred);
                cred.push(':');
                form_encode(&self.client_secret, &mut cred);
                let b = base64::engine::general_purpose::STANDARD.encode(cred);
                if let Ok(v) = HeaderValue::from_str(&format!("Basic {b}")) {
                    headers.insert(header::AUTHORIZATION, v);
                }
            }
        }
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        let answer = self
            .provider
            .http
            .call(&target, Method::POST, headers, Bytes::from(body))
            .await
            .map_err(|e| {
                tracing::warn!(
                    endpoint = %target.authority,
                    error = %e,
                    "openid-connect: token introspection failed"
                );
                unavailable()
            })?;
        if answer.status != StatusCode::OK {
            tracing::warn!(
                endpoint = %target.authority,
                status = answer.status.as_u16(),
                "openid-connect: the introspection endpoint refused the request"
            );
            return Err(Denial::Invalid("introspection failed".into()));
        }
        let v: Value = serde_json::from_slice(&answer.body)
            .map_err(|_| Denial::Invalid("introspection answer is not JSON".into()))?;
        if v.get("active") == Some(&Value::Bool(true)) {
            Ok(v)
        } else {
            Err(Denial::Invalid("invalid token".into()))
        }
    }

    /// `required_scopes` and `claim_validator.audience`, as APISIX checks them (403).
    fn authorize(&self, claims: &Value) -> Result<(), &'static str> {
        if !self.required_scopes.is_empty() {
            let granted: Vec<&str> = claims
                .get("scope")
                .and_then(Value::as_str)
                .map(|s| s.split_whitespace().collect())
                .unwrap_or_default();
            if !self
                .required_scopes
                .iter()
                .all(|s| granted.contains(&s.as_str()))
            {
                return Err("scopes");
            }
        }
        if let Some(aud) = &self.audience {
            let value = claims.get(&aud.claim).filter(|v| !v.is_null());
            if (aud.required || aud.match_with_client_id) && value.is_none() {
                return Err("required audience claim not present");
            }
            if aud.match_with_client_id {
                let ok = match value {
                    Some(Value::Array(list)) => list.iter().any(|v| v == &self.client_id),
                    Some(Value::String(s)) => *s == self.client_id,
                    _ => false,
                };
                if !ok {
                    return Err("mismatched audience");
                }
            }
        }
        Ok(())
    }

    fn check<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        ctx.extensions.insert(Processed);
        let client_access_token = req.headers.get("x-access-token").cloned();
        for name in STRIPPED {
            req.headers.remove(name);
        }
        let token = match req.headers.get(header::AUTHORIZATION) {
            None => client_access_token.and_then(|v| v.to_str().ok().map(str::to_owned)),
            Some(v) => {
                let Some((scheme, rest)) = v.to_str().ok().and_then(|s| s.split_once(' ')) else {
                    return Flow::respond(rejection(StatusCode::BAD_REQUEST, None));
                };
                scheme
                    .eq_ignore_ascii_case("bearer")
                    .then(|| rest.to_owned())
            }
        };
        let Some(token) = token else {
            return Flow::Respond(self.unauthorized(None));
        };
        Flow::Pending(Box::pin(async move {
            let checked = match self.mode {
                Mode::Introspection => self.introspect(&token, req).await,
                _ => self.verify_signed(&token).await,
            };
            let claims = match checked {
                Ok(c) => c,
                Err(Denial::Invalid(d) | Denial::UnknownKid(d)) => {
                    tracing::debug!(route = %ctx.chain.route_id, reason = %d, "openid-connect: token refused");
                    return Err(self.unauthorized(Some(&d)));
                }
            };
            match self.authorize(&claims) {
                Ok(()) => {}
                Err("scopes") => {
                    return Err(Self::forbidden(&format!(
                        "required scopes {} not present",
                        self.required_scopes.join(", ")
                    )));
                }
                Err(e) => return Err(Self::forbidden(e)),
            }
            if self.set_access_token_header {
                if self.access_token_in_authorization_header {
                    if let Ok(v) = HeaderValue::from_str(&format!("Bearer {token}")) {
                        req.headers.insert(header::AUTHORIZATION, v);
                    }
                } else if let Ok(v) = HeaderValue::from_str(&token) {
                    req.headers
                        .insert(HeaderName::from_static("x-access-token"), v);
                }
            }
            if self.set_userinfo_header {
                let text = claims.to_string();
                let b = base64::engine::general_purpose::STANDARD.encode(text);
                if let Ok(v) = HeaderValue::from_str(&b) {
                    req.headers.insert(HeaderName::from_static("x-userinfo"), v);
                }
            }
            Ok(())
        }))
    }
}

impl Plugin for OpenidConnect {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        self.check(req, ctx)
    }

    /// Only when the rewrite phase did not run (the plugin came with a consumer's plugins).
    fn access<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        if ctx.extensions.get::<Processed>().is_some() {
            return Flow::Continue;
        }
        self.check(req, ctx)
    }
}

/// `application/x-www-form-urlencoded` encoding of `s` (space as `%20`), appended to `out`.
fn form_encode(s: &str, out: &mut String) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

/// An answer of the provider: status and at most [`MAX_DOCUMENT`] bytes of body.
struct Answer {
    status: StatusCode,
    body: Bytes,
}

type Conn = SendRequest<Full<Bytes>>;

/// Kept HTTP/1.1 connections to one origin of the provider.
struct Origin {
    dial: String,
    tls: Option<UpstreamTlsClient>,
    idle: Mutex<Vec<(Conn, Instant)>>,
}

/// Most idle connections kept per origin, and for how long.
const POOL_MAX: usize = 4;
const POOL_IDLE: Duration = Duration::from_secs(60);
/// Most origins (discovery, JWKS, introspection hosts) kept per provider.
const MAX_ORIGINS: usize = 8;

/// HTTP/1.1 client for the provider's endpoints: pooled keep-alive connections per origin,
/// each exchange bounded by `timeout` and [`MAX_DOCUMENT`].
struct SideHttp {
    ssl_verify: bool,
    timeout: Duration,
    origins: Mutex<HashMap<(bool, String), Arc<Origin>>>,
}

impl SideHttp {
    fn origin(&self, t: &Target) -> Result<Arc<Origin>, String> {
        let mut map = self.origins.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(o) = map.get(&(t.tls, t.authority.clone())) {
            return Ok(Arc::clone(o));
        }
        let tls = if t.tls {
            Some(
                UpstreamTlsClient::for_probes(None, None, self.ssl_verify)
                    .map_err(|e| format!("TLS: {e}"))?,
            )
        } else {
            None
        };
        let o = Arc::new(Origin {
            dial: if t.host.contains(':') {
                format!("[{}]:{}", t.host, t.port)
            } else {
                format!("{}:{}", t.host, t.port)
            },
            tls,
            idle: Mutex::new(Vec::new()),
        });
        if map.len() >= MAX_ORIGINS {
            map.clear();
        }
        map.insert((t.tls, t.authority.clone()), Arc::clone(&o));
        Ok(o)
    }

    async fn get(&self, t: &Target) -> Result<Answer, String> {
        let mut h = http::HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        self.call(t, Method::GET, h, Bytes::new()).await
    }

    async fn call(
        &self,
        t: &Target,
        method: Method,
        headers: http::HeaderMap,
        body: Bytes,
    ) -> Result<Answer, String> {
        let origin = self.origin(t)?;
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = method;
        *req.uri_mut() = t
            .path_and_query
            .parse()
            .map_err(|_| "bad path".to_owned())?;
        *req.headers_mut() = headers;
        let host = HeaderValue::from_str(&t.authority).map_err(|_| "bad host".to_owned())?;
        req.headers_mut().insert(header::HOST, host);
        tokio::time::timeout(self.timeout, origin.call(req))
            .await
            .map_err(|_| "timed out".to_owned())?
    }
}

impl Origin {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Conn, Instant)>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn checkout(&self) -> Option<Conn> {
        let mut idle = self.lock();
        while let Some((tx, since)) = idle.pop() {
            if !tx.is_closed() && since.elapsed() < POOL_IDLE {
                return Some(tx);
            }
        }
        None
    }

    fn checkin(&self, tx: Conn) {
        if tx.is_closed() {
            return;
        }
        let mut idle = self.lock();
        if idle.len() >= POOL_MAX {
            idle.remove(0);
        }
        idle.push((tx, Instant::now()));
    }

    async fn connect(&self) -> Result<Conn, String> {
        let tcp = tokio::net::TcpStream::connect(self.dial.as_str())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let tx = match &self.tls {
            Some(tls) => {
                let stream = tls
                    .connect(tcp, &self.dial, Alpn::Http11)
                    .await
                    .map_err(|e| format!("TLS: {e}"))?;
                let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(|e| format!("handshake: {e}"))?;
                tokio::spawn(conn);
                tx
            }
            None => {
                let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                    .await
                    .map_err(|e| format!("handshake: {e}"))?;
                tokio::spawn(conn);
                tx
            }
        };
        Ok(tx)
    }

    /// Sends `req` on a kept connection (retried once on a new one when the kept one was
    /// closed meanwhile), or a new one.
    async fn call(&self, req: Request<Full<Bytes>>) -> Result<Answer, String> {
        if let Some(mut tx) = self.checkout() {
            let (parts, body) = req.into_parts();
            let retry = Request::from_parts(parts.clone(), body.clone());
            if tx.ready().await.is_ok() {
                match tx.send_request(Request::from_parts(parts, body)).await {
                    Ok(resp) => return self.read(tx, resp).await,
                    Err(e) if !e.is_canceled() && !e.is_incomplete_message() => {
                        return Err(format!("request: {e}"));
                    }
                    Err(_) => {}
                }
            }
            return self.call_new(retry).await;
        }
        self.call_new(req).await
    }

    async fn call_new(&self, req: Request<Full<Bytes>>) -> Result<Answer, String> {
        let mut tx = self.connect().await?;
        tx.ready().await.map_err(|e| format!("connection: {e}"))?;
        let resp = tx
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        self.read(tx, resp).await
    }

    async fn read(
        &self,
        tx: Conn,
        resp: Response<hyper::body::Incoming>,
    ) -> Result<Answer, String> {
        let (parts, mut body) = resp.into_parts();
        let mut kept = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("answer body: {e}"))?;
            if let Ok(data) = frame.into_data() {
                if kept.len() + data.len() > MAX_DOCUMENT {
                    return Err(format!("answer larger than {MAX_DOCUMENT} bytes"));
                }
                kept.extend_from_slice(&data);
            }
        }
        self.checkin(tx);
        Ok(Answer {
            status: parts.status,
            body: kept.freeze(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn jwks_parsing_skips_what_cannot_sign() {
        let doc = json!({"keys": [
            {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
            {"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB", "kid": "enc"},
            {"kty": "RSA", "alg": "RSA-OAEP", "n": "AQAB", "e": "AQAB", "kid": "oaep"},
            {"kty": "EC", "crv": "P-521", "x": "AA", "y": "AA", "kid": "p521"},
            {"kty": "XYZ", "kid": "odd"},
            {"kty": "RSA", "n": "AQAB", "e": "AQAB", "kid": "rsa"},
            {"kty": "RSA", "alg": "PS256", "n": "AQAB", "e": "AQAB", "kid": "ps"},
        ]});
        let set = KeySet::from_jwks(doc.to_string().as_bytes()).unwrap();
        let kids: Vec<_> = set.keys.iter().map(|k| k.kid.clone().unwrap()).collect();
        assert_eq!(kids, ["rsa", "ps"]);
        assert_eq!(set.keys[1].algs, [Algorithm::PS256]);
        assert!(KeySet::from_jwks(b"{}").is_err());
        assert!(KeySet::from_jwks(b"not json").is_err());
    }

    #[test]
    fn form_encoding() {
        let mut s = String::new();
        form_encode("a b+c/d=é~", &mut s);
        assert_eq!(s, "a%20b%2Bc%2Fd%3D%C3%A9~");
    }
}
