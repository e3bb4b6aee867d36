//! `jwt-auth` (priority 2510): the consumer whose `key` is in the token's key claim, after
//! the token's signature (HS256/384/512, RS256/384/512, PS256/384/512, ES256/384, EdDSA)
//! and `exp`/`nbf` (with the consumer's `lifetime_grace_period` as leeway) verify.
//!
//! The token comes from the `header` (`Bearer ` prefix optional), else the `query`
//! argument, else the `cookie`. Failures are 401 with APISIX 3.x's messages:
//! `Missing JWT token in request`, `JWT token invalid`, `missing user key in JWT token`,
//! `Invalid user key in JWT token`, `failed to verify jwt`.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use http::header::HeaderName;
use http::{StatusCode, request};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Value, json};
use sluice_plugin_config::jwt_auth::{JwtAlgorithm, JwtAuth as Config, JwtAuthConsumer};
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{
    BuildCtx, Builtin, Consumer, Flow, Hooks, Plugin, PluginCtx, json_response, support::vars,
};

struct Verifier {
    key: DecodingKey,
    validation: Validation,
    consumer: Arc<Consumer>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("consumer", &self.consumer.name)
            .finish_non_exhaustive()
    }
}

type Keys = HashMap<String, Verifier>;

/// The plugin on one route.
#[derive(Debug)]
pub struct JwtAuth {
    conf: Config,
    header: HeaderName,
    keys: Arc<Keys>,
}

fn algorithm(a: JwtAlgorithm) -> Algorithm {
    match a {
        JwtAlgorithm::HS256 => Algorithm::HS256,
        JwtAlgorithm::HS384 => Algorithm::HS384,
        JwtAlgorithm::HS512 => Algorithm::HS512,
        JwtAlgorithm::RS256 => Algorithm::RS256,
        JwtAlgorithm::RS384 => Algorithm::RS384,
        JwtAlgorithm::RS512 => Algorithm::RS512,
        JwtAlgorithm::ES256 => Algorithm::ES256,
        JwtAlgorithm::ES384 => Algorithm::ES384,
        JwtAlgorithm::PS256 => Algorithm::PS256,
        JwtAlgorithm::PS384 => Algorithm::PS384,
        JwtAlgorithm::PS512 => Algorithm::PS512,
        JwtAlgorithm::EdDSA => Algorithm::EdDSA,
    }
}

impl Builtin for JwtAuth {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE;

    /// Builds `jwt-auth`.
    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let header =
            HeaderName::from_bytes(conf.header.to_ascii_lowercase().as_bytes()).map_err(|_| {
                ConfigError::Field {
                    plugin: Config::NAME.into(),
                    field: "header".into(),
                    reason: "not a valid header name".into(),
                }
            })?;
        let keys = cx.consumers.index(Config::NAME, |consumers| {
            let mut keys = Keys::new();
            for c in consumers {
                let Some(cred) = c.credential(Config::NAME) else {
                    continue;
                };
                let j: JwtAuthConsumer = sluice_plugin_config::parse_consumer_json::<Config, _>(cred)?;
                // NB: translation rejects a consumer whose key does not parse (same code); should
                // a snapshot carry one anyway, only that consumer is disabled (its requests get
                // 401), rather than every route of the snapshot rejected.
                let key = match j.decoding_key() {
                    Ok(k) => k,
                    Err(e) => {
                        tracing::warn!(consumer = %c.name, error = %e, "jwt-auth credential unusable");
                        continue;
                    }
                };
                let mut validation = Validation::new(algorithm(j.algorithm));
                validation.required_spec_claims.clear();
                validation.leeway = j.lifetime_grace_period;
                validation.validate_exp = true;
                validation.validate_nbf = true;
                validation.validate_aud = false;
                keys.insert(
                    j.key,
                    Verifier {
                        key,
                        validation,
                        consumer: Arc::clone(c),
                    },
                );
            }
            Ok(keys)
        })?;
        Ok(JwtAuth { conf, header, keys })
    }
}

fn unauthorized(msg: &str) -> Flow<'static> {
    Flow::respond(json_response(
        StatusCode::UNAUTHORIZED,
        &json!({ "message": msg }),
    ))
}

enum Source {
    Header,
    Query,
    Cookie,
}

/// The payload of a compact JWS without verifying it.
fn unverified_payload(token: &str) -> Option<Value> {
    let mut parts = token.split('.');
    let (_h, p, _s) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(p.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&raw).ok()
}

impl JwtAuth {
    fn token(&self, req: &request::Parts) -> Option<(String, Source)> {
        if let Some(v) = req.headers.get(&self.header).and_then(|v| v.to_str().ok()) {
            let t = v
                .strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
                .unwrap_or(v);
            return Some((t.trim().to_owned(), Source::Header));
        }
        if let Some(t) = req
            .uri
            .query()
            .and_then(|q| vars::query_arg(q, &self.conf.query))
        {
            return Some((t.into_owned(), Source::Query));
        }
        vars::cookie(&req.headers, &self.conf.cookie).map(|t| (t.to_owned(), Source::Cookie))
    }
}

impl Plugin for JwtAuth {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        let Some((token, source)) = self.token(req) else {
            return unauthorized("Missing JWT token in request");
        };
        let Some(payload) = unverified_payload(&token) else {
            return unauthorized("JWT token invalid");
        };
        let Some(key) = payload
            .get(&self.conf.key_claim_name)
            .and_then(Value::as_str)
        else {
            return unauthorized("missing user key in JWT token");
        };
        let Some(v) = self.keys.get(key) else {
            return unauthorized("Invalid user key in JWT token");
        };
        if jsonwebtoken::decode::<Value>(&token, &v.key, &v.validation).is_err() {
            return unauthorized("failed to verify jwt");
        }
        ctx.consumer = Some(Arc::clone(&v.consumer));
        if self.conf.hide_credentials {
            match source {
                Source::Header => {
                    req.headers.remove(&self.header);
                }
                Source::Query => super::support::rewrite::remove_query_arg(req, &self.conf.query),
                // NB: the cookie header may carry other cookies; it is left as it is.
                Source::Cookie => {}
            }
        }
        Flow::Continue
    }
}
