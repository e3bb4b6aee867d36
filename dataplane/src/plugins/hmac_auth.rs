//! `hmac-auth` (priority 2530, rewrite phase), APISIX 3.x: the consumer whose `key_id` is
//! the `keyId` of an HTTP signature,
//! `Authorization: Signature keyId="<id>",algorithm="hmac-sha256",headers="@request-target date",signature="<base64>"`.
//!
//! The signed text is the `keyId`, then per name of `headers` a line `<name>: <value>`
//! (`@request-target` is `<METHOD> <target as sent>`; a listed header the request lacks
//! adds nothing; a repeated header's values are joined by `, `, in order, so every copy
//! is signed), each line ending in `\n`. Checks, in APISIX's order: the algorithm is in
//! `allowed_algorithms`; `Date` is within `clock_skew` seconds of now; every name of the
//! route's `signed_headers` is in `headers`; the signature matches (constant time).
//!
//! With `validate_request_body` (APISIX 3.x), a request whose signature passed must then
//! carry `Digest: SHA-256=<base64 of the SHA-256 of the body>` (compared as text, as
//! APISIX): the header is looked at first, then the body is read whole (at most
//! `max_req_body_size` bytes, or client-control's `max_body_size` when smaller) and the
//! upstream gets it unchanged. A missing or wrong `Digest` fails as a bad signature does;
//! a body over `max_req_body_size` is 413 `{"message":"request size <n> is greater than
//! the maximum size <max> allowed"}` (no challenge).
//!
//! Failures are 401 with `WWW-Authenticate: hmac realm="<realm>"` and, as APISIX,
//! `{"message":"client request can't be validated: <why>"}` when the `Authorization`
//! header is missing or not a signature, else `{"message":"client request can't be
//! validated"}` (the reason is only logged, at debug level).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_LENGTH, HeaderName, HeaderValue, WWW_AUTHENTICATE};
use http::{Response, StatusCode, request};
use ring::{digest, hmac};
use serde_json::json;
use sluice_plugin_config::hmac_auth::{HmacAlgorithm, HmacAuth as Config, HmacAuthConsumer};
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{
    BodyRefusal, BuildCtx, Builtin, Consumer, Flow, Hooks, Plugin, PluginCtx, json_response,
    read_whole_body,
};
use crate::http::path::RequestTarget;
use crate::upstream::body::ProxyBody;

/// The header carrying the body's digest.
const DIGEST: HeaderName = HeaderName::from_static("digest");

/// A consumer's keys, one per algorithm.
struct Keys {
    consumer: Arc<Consumer>,
    sha1: hmac::Key,
    sha256: hmac::Key,
    sha512: hmac::Key,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // NB: never the secret.
        f.debug_struct("Keys")
            .field("consumer", &self.consumer.name)
            .finish_non_exhaustive()
    }
}

impl Keys {
    fn key(&self, alg: HmacAlgorithm) -> &hmac::Key {
        match alg {
            HmacAlgorithm::Sha1 => &self.sha1,
            HmacAlgorithm::Sha256 => &self.sha256,
            HmacAlgorithm::Sha512 => &self.sha512,
        }
    }
}

type ById = HashMap<String, Keys>;

/// The plugin on one route.
#[derive(Debug)]
pub struct HmacAuth {
    allowed: Vec<HmacAlgorithm>,
    clock_skew: u64,
    signed_headers: Vec<String>,
    hide_credentials: bool,
    /// `max_req_body_size` when `validate_request_body` is on.
    body_cap: Option<u64>,
    challenge: HeaderValue,
    by_id: Arc<ById>,
}

impl Builtin for HmacAuth {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE.with(Hooks::READS_BODY);

    /// Builds `hmac-auth`; the consumers' keys are indexed once per snapshot.
    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let challenge =
            HeaderValue::from_str(&format!("hmac realm=\"{}\"", conf.realm)).map_err(|_| {
                ConfigError::Field {
                    plugin: Config::NAME.into(),
                    field: "realm".into(),
                    reason: "not a valid header value".into(),
                }
            })?;
        let by_id = cx.consumers.index(Config::NAME, |consumers| {
            let mut by_id = ById::new();
            for c in consumers {
                if let Some(cred) = c.credential(Config::NAME) {
                    let k: HmacAuthConsumer =
                        sluice_plugin_config::parse_consumer_json::<Config, _>(cred)?;
                    let secret = k.secret_key.as_bytes();
                    by_id.insert(
                        k.key_id().to_owned(),
                        Keys {
                            consumer: Arc::clone(c),
                            sha1: hmac::Key::new(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, secret),
                            sha256: hmac::Key::new(hmac::HMAC_SHA256, secret),
                            sha512: hmac::Key::new(hmac::HMAC_SHA512, secret),
                        },
                    );
                }
            }
            Ok(by_id)
        })?;
        Ok(HmacAuth {
            allowed: conf.allowed_algorithms,
            clock_skew: conf.clock_skew,
            signed_headers: conf.signed_headers,
            hide_credentials: conf.hide_credentials,
            body_cap: conf.validate_request_body.then_some(conf.max_req_body_size),
            challenge,
            by_id,
        })
    }

    fn hooks(&self) -> Hooks {
        if self.body_cap.is_some() {
            Self::HOOKS
        } else {
            Self::HOOKS.without(Hooks::READS_BODY)
        }
    }
}

/// The fields of a `Signature` authorization.
#[derive(Debug, Default)]
struct Params<'a> {
    key_id: Option<&'a str>,
    algorithm: Option<&'a str>,
    signature: Option<&'a str>,
    headers: Vec<&'a str>,
}

/// Parses `Signature keyId="..",algorithm="..",headers="..",signature=".."` as APISIX does:
/// comma-separated `name="value"` pairs; other names and malformed pairs are ignored.
fn parse(auth: &str) -> Result<Params<'_>, &'static str> {
    let Some(rest) = auth.strip_prefix("Signature") else {
        return Err("Authorization header does not start with 'Signature'");
    };
    let mut p = Params::default();
    for field in rest.split(',') {
        let field = field.trim_start();
        let Some((key, value)) = field.split_once('=') else {
            continue;
        };
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            continue;
        }
        let Some(value) = value.strip_prefix('"') else {
            continue;
        };
        let Some(end) = value.find('"') else {
            continue;
        };
        let value = &value[..end];
        match key {
            "keyId" => p.key_id = Some(value),
            "algorithm" => p.algorithm = Some(value),
            "signature" => p.signature = Some(value),
            "headers" => p.headers = value.split(' ').filter(|h| !h.is_empty()).collect(),
            _ => {}
        }
    }
    Ok(p)
}

impl HmacAuth {
    fn unauthorized_response(&self, msg: &str) -> Box<Response<ProxyBody>> {
        let mut resp = json_response(StatusCode::UNAUTHORIZED, &json!({ "message": msg }));
        resp.headers_mut()
            .insert(WWW_AUTHENTICATE, self.challenge.clone());
        Box::new(resp)
    }

    fn unauthorized(&self, msg: &str) -> Flow<'static> {
        Flow::Respond(self.unauthorized_response(msg))
    }

    /// A request whose signature passed goes on as `consumer`.
    fn pass(&self, req: &mut request::Parts, ctx: &mut PluginCtx, consumer: Arc<Consumer>) {
        ctx.consumer = Some(consumer);
        if self.hide_credentials {
            req.headers.remove(AUTHORIZATION);
        }
    }

    /// `validate_request_body`: the body's digest against `digest` (the client's `Digest`),
    /// then the request goes on as `consumer`.
    async fn check_body(
        &self,
        req: &mut request::Parts,
        ctx: &mut PluginCtx,
        consumer: Arc<Consumer>,
        digest: HeaderValue,
        cap: u64,
    ) -> super::PhaseResult {
        let body = match read_whole_body(req, ctx, cap, Config::NAME).await {
            Ok(body) => body,
            Err(BodyRefusal::Answer(resp)) => return Err(resp),
            Err(BodyRefusal::TooLarge) => {
                let msg = too_large(req, cap);
                tracing::debug!(reason = %msg, "hmac-auth: request body too large");
                return Err(Box::new(json_response(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &json!({ "message": msg }),
                )));
            }
        };
        if digest.as_bytes() != body_digest(&body).as_bytes() {
            tracing::debug!(
                reason = "Invalid digest",
                "hmac-auth: client request can't be validated"
            );
            return Err(self.unauthorized_response("client request can't be validated"));
        }
        self.pass(req, ctx, consumer);
        Ok(())
    }

    /// The consumer the signature of `p` proves, or why not.
    fn validate(&self, req: &request::Parts, p: &Params<'_>) -> Result<&Keys, &'static str> {
        let (Some(key_id), Some(signature)) = (p.key_id, p.signature) else {
            return Err("keyId or signature missing");
        };
        let Some(algorithm) = p.algorithm else {
            return Err("algorithm missing");
        };
        let keys = self.by_id.get(key_id).ok_or("Invalid key_id")?;
        let alg = self
            .allowed
            .iter()
            .copied()
            .find(|a| a.name() == algorithm)
            .ok_or("Invalid algorithm")?;
        let date = req
            .headers
            .get(http::header::DATE)
            .ok_or("Date header missing. failed to validate clock skew")?;
        let date = date
            .to_str()
            .ok()
            .and_then(|d| httpdate::parse_http_date(d).ok())
            .ok_or("Invalid GMT format time")?;
        let now = SystemTime::now();
        let skew = now
            .duration_since(date)
            .or_else(|_| date.duration_since(now))
            .map_or(u64::MAX, |d| d.as_secs());
        if skew > self.clock_skew {
            return Err("Clock skew exceeded");
        }
        if let Some(h) = self
            .signed_headers
            .iter()
            .find(|h| !p.headers.contains(&h.as_str()))
        {
            tracing::debug!(header = %h, "hmac-auth: expected header missing in signing");
            return Err("expected header missing in signing");
        }
        let Ok(tag) = base64::engine::general_purpose::STANDARD.decode(signature) else {
            return Err("Invalid signature");
        };
        let text = signing_text(req, key_id, &p.headers);
        hmac::verify(keys.key(alg), text.as_bytes(), &tag).map_err(|_| "Invalid signature")?;
        Ok(keys)
    }
}

/// The text a client signs (see the module docs).
fn signing_text(req: &request::Parts, key_id: &str, headers: &[&str]) -> String {
    let mut text = String::with_capacity(128);
    text.push_str(key_id);
    text.push('\n');
    for h in headers {
        let mut values = req.headers.get_all(*h).iter();
        match values.next() {
            Some(first) => {
                // NB: every value of a repeated header, joined by `, ` in the order sent
                // (the HTTP signatures draft): an unsigned second copy must not pass.
                text.push_str(h);
                text.push_str(": ");
                text.push_str(&String::from_utf8_lossy(first.as_bytes()));
                for v in values {
                    text.push_str(", ");
                    text.push_str(&String::from_utf8_lossy(v.as_bytes()));
                }
                text.push('\n');
            }
            None if *h == "@request-target" => {
                let target = match req.extensions.get::<RequestTarget>() {
                    Some(t) => t.0.as_str(),
                    None => req.uri.path_and_query().map_or("/", |pq| pq.as_str()),
                };
                text.push_str(req.method.as_str());
                text.push(' ');
                text.push_str(target);
                text.push('\n');
            }
            None => {}
        }
    }
    text
}

/// `SHA-256=<base64>` of `body`, the `Digest` a client sends.
fn body_digest(body: &Bytes) -> String {
    let sum = digest::digest(&digest::SHA256, body);
    format!(
        "SHA-256={}",
        base64::engine::general_purpose::STANDARD.encode(sum.as_ref())
    )
}

/// APISIX's message for a body over `cap`; the size is the announced `Content-Length`
/// (a body of unannounced length is not read past the cap, so its size is not known).
fn too_large(req: &request::Parts, cap: u64) -> String {
    let announced = req
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&n| n > cap);
    match announced {
        Some(n) => format!("request size {n} is greater than the maximum size {cap} allowed"),
        None => format!("request size is greater than the maximum size {cap} allowed"),
    }
}

impl Plugin for HmacAuth {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        let Some(auth) = req.headers.get(AUTHORIZATION) else {
            return self
                .unauthorized("client request can't be validated: missing Authorization header");
        };
        let auth = String::from_utf8_lossy(auth.as_bytes()).into_owned();
        let params = match parse(&auth) {
            Ok(p) => p,
            Err(why) => {
                return self.unauthorized(&format!("client request can't be validated: {why}"));
            }
        };
        let consumer = match self.validate(req, &params) {
            Ok(keys) => Arc::clone(&keys.consumer),
            Err(why) => {
                tracing::debug!(reason = why, "hmac-auth: client request can't be validated");
                return self.unauthorized("client request can't be validated");
            }
        };
        let Some(cap) = self.body_cap else {
            self.pass(req, ctx, consumer);
            return Flow::Continue;
        };
        // NB: as APISIX, the header is looked at before the body is read: only a client
        // whose signature passed makes Sluice read a body.
        let Some(digest) = req.headers.get(DIGEST).cloned() else {
            tracing::debug!(
                reason = "Invalid digest",
                "hmac-auth: client request can't be validated"
            );
            return self.unauthorized("client request can't be validated");
        };
        Flow::Pending(Box::pin(self.check_body(req, ctx, consumer, digest, cap)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_apisix_signature_headers() {
        let p = parse(r#"Signature keyId="k1",algorithm="hmac-sha256",headers="@request-target date x-a",signature="c2ln""#).unwrap();
        assert_eq!(p.key_id, Some("k1"));
        assert_eq!(p.algorithm, Some("hmac-sha256"));
        assert_eq!(p.signature, Some("c2ln"));
        assert_eq!(p.headers, vec!["@request-target", "date", "x-a"]);
        let p = parse(r#"Signature keyId=k1, algorithm="a", bogus, signature="""#).unwrap();
        assert_eq!(p.key_id, None, "unquoted values are ignored");
        assert_eq!(p.algorithm, Some("a"));
        assert_eq!(p.signature, Some(""));
        assert!(parse("Basic Zm9vOmJhcg==").is_err());
    }

    #[test]
    fn body_digest_is_apisix_docs_example() {
        // From APISIX's hmac-auth docs (validate_request_body example).
        assert_eq!(
            body_digest(&Bytes::from_static(br#"{"name": "world"}"#)),
            "SHA-256=78qzJuLwSpZ8HacsTdFCQJWxzPMOf8bYctRk2ySLpS8="
        );
    }
}
