//! `csrf` (priority 2980): double-submit cookie protection, as APISIX.
//!
//! - Every response (access phase answers too) gets a fresh token cookie,
//!   `Set-Cookie: <name>=<token>;path=/;SameSite=Lax;Expires=<now + expires>`.
//! - A request with an unsafe method (anything but GET, HEAD, OPTIONS) must repeat the
//!   cookie's token in the `<name>` header; otherwise 401 with APISIX's messages:
//!   `{"error_msg":"no csrf token in headers"}`, `"no csrf cookie"`,
//!   `"csrf token mismatch"`, `"Failed to verify the csrf token signature"` (a bad or
//!   expired token).
//!
//! The token is base64 of `{"random":<n>,"expires":<issued at, unix s>,"sign":"<hex>"}`
//! as APISIX's. NB: APISIX signs with a plain SHA-256 over a string holding the key;
//! Sluice signs with HMAC-SHA256 (keyed by `key`, checked in constant time), so tokens
//! are not interchangeable between the two.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use http::header::{HeaderName, HeaderValue, SET_COOKIE};
use http::{Method, StatusCode, request, response};
use ring::hmac;
use sluice_plugin_config::csrf::Csrf as Config;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx, rejection, support::vars};

/// The plugin.
#[derive(Debug)]
pub struct Csrf {
    key: hmac::Key,
    expires: i64,
    name: String,
    header: HeaderName,
}

impl Builtin for Csrf {
    type Config = Config;
    const HOOKS: Hooks = Hooks::ACCESS.with(Hooks::RESPONSE_HEADERS);

    /// Builds `csrf`.
    fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let header =
            HeaderName::from_bytes(conf.name.to_ascii_lowercase().as_bytes()).map_err(|_| {
                ConfigError::Field {
                    plugin: Config::NAME.into(),
                    field: "name".into(),
                    reason: "must be a valid header and cookie name".into(),
                }
            })?;
        Ok(Csrf {
            key: hmac::Key::new(hmac::HMAC_SHA256, conf.key.as_bytes()),
            expires: conf.expires,
            name: conf.name,
            header,
        })
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn signed_text(random: &str, issued: i64) -> String {
    format!("{{expires:{issued},random:{random}}}")
}

fn unauthorized(msg: &str) -> Flow<'static> {
    Flow::respond(rejection(StatusCode::UNAUTHORIZED, Some(msg)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

impl Csrf {
    /// A new token issued now.
    fn token(&self) -> String {
        // NB: 53 bits, so that the number survives any JSON parser unchanged.
        let random = (fastrand::u64(..) >> 11).to_string();
        let issued = now();
        let sign = hmac::sign(&self.key, signed_text(&random, issued).as_bytes());
        let json = format!(
            "{{\"random\":{random},\"expires\":{issued},\"sign\":\"{}\"}}",
            hex(sign.as_ref())
        );
        base64::engine::general_purpose::STANDARD.encode(json)
    }

    /// Whether `token` was signed with our key and has not expired.
    fn verify(&self, token: &str) -> bool {
        let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(token) else {
            return false;
        };
        let Ok(serde_json::Value::Object(t)) = serde_json::from_slice(&raw) else {
            return false;
        };
        let (Some(random), Some(issued), Some(sign)) = (
            t.get("random").filter(|v| v.is_number()),
            t.get("expires").and_then(serde_json::Value::as_i64),
            t.get("sign").and_then(serde_json::Value::as_str),
        ) else {
            return false;
        };
        if self.expires > 0 && now().saturating_sub(issued) > self.expires {
            return false;
        }
        let Some(tag) = unhex(sign) else {
            return false;
        };
        let text = signed_text(&random.to_string(), issued);
        hmac::verify(&self.key, text.as_bytes(), &tag).is_ok()
    }
}

impl Plugin for Csrf {
    fn access<'a>(&'a self, req: &'a mut request::Parts, _ctx: &'a mut PluginCtx) -> Flow<'a> {
        if matches!(req.method, Method::GET | Method::HEAD | Method::OPTIONS) {
            return Flow::Continue;
        }
        let header = req
            .headers
            .get(&self.header)
            .map(HeaderValue::as_bytes)
            .filter(|v| !v.is_empty());
        let Some(header) = header else {
            return unauthorized("no csrf token in headers");
        };
        let Some(cookie) = vars::cookie(&req.headers, &self.name) else {
            return unauthorized("no csrf cookie");
        };
        if header != cookie.as_bytes() {
            return unauthorized("csrf token mismatch");
        }
        if !self.verify(cookie) {
            return unauthorized("Failed to verify the csrf token signature");
        }
        Flow::Continue
    }

    fn response_headers(&self, resp: &mut response::Parts, _ctx: &mut PluginCtx) {
        let expires = SystemTime::now() + Duration::from_secs(self.expires.max(0) as u64);
        let cookie = format!(
            "{}={};path=/;SameSite=Lax;Expires={}",
            self.name,
            self.token(),
            httpdate::fmt_http_date(expires)
        );
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            resp.headers.append(SET_COOKIE, v);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn csrf(key: &str, expires: i64) -> Csrf {
        Csrf {
            key: hmac::Key::new(hmac::HMAC_SHA256, key.as_bytes()),
            expires,
            name: "apisix-csrf-token".into(),
            header: HeaderName::from_static("apisix-csrf-token"),
        }
    }

    fn forge(key: &str, random: &str, issued: i64) -> String {
        let k = hmac::Key::new(hmac::HMAC_SHA256, key.as_bytes());
        let sign = hex(hmac::sign(&k, signed_text(random, issued).as_bytes()).as_ref());
        let json = format!("{{\"random\":{random},\"expires\":{issued},\"sign\":\"{sign}\"}}");
        base64::engine::general_purpose::STANDARD.encode(json)
    }

    #[test]
    fn tokens_verify_only_with_the_key_and_in_time() {
        let c = csrf("k", 60);
        assert!(c.verify(&c.token()));
        assert!(!csrf("other", 60).verify(&c.token()), "another key");
        assert!(c.verify(&forge("k", "12", now() - 30)));
        assert!(!c.verify(&forge("k", "12", now() - 61)), "expired");
        assert!(
            csrf("k", 0).verify(&forge("k", "12", now() - 100_000)),
            "expires 0: never"
        );
        assert!(!c.verify("not base64!"));
        assert!(!c.verify(&base64::engine::general_purpose::STANDARD.encode("{}")));
        // A changed field breaks the signature.
        let t = forge("k", "12", now());
        let raw = String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(&t)
                .unwrap(),
        )
        .unwrap();
        let changed = base64::engine::general_purpose::STANDARD.encode(raw.replace(":12,", ":13,"));
        assert!(!c.verify(&changed));
    }
}
