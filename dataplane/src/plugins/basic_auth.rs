//! `basic-auth` (priority 2520): the consumer named by HTTP Basic credentials.
//!
//! 401 with `WWW-Authenticate: Basic realm='.'` and
//! `{"message":"Missing authorization in request"}` without credentials;
//! `"Invalid authorization in request"` when they cannot be decoded;
//! `"Invalid user authorization"` for an unknown user or a wrong password (as APISIX 3.x).

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use http::header::{self, HeaderValue};
use http::{StatusCode, request};
use serde_json::json;
use sluice_plugin_config::basic_auth::{BasicAuth as Config, BasicAuthConsumer};
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{BuildCtx, Builtin, Consumer, Flow, Hooks, Plugin, PluginCtx, json_response};

type Users = HashMap<String, (String, Arc<Consumer>)>;

/// The plugin on one route.
#[derive(Debug)]
pub struct BasicAuth {
    hide_credentials: bool,
    users: Arc<Users>,
}

impl Builtin for BasicAuth {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE;

    /// Builds `basic-auth`.
    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let users = cx.consumers.index(Config::NAME, |consumers| {
            let mut users = Users::new();
            for c in consumers {
                if let Some(cred) = c.credential(Config::NAME) {
                    let u: BasicAuthConsumer =
                        sluice_plugin_config::parse_consumer_json::<Config, _>(cred)?;
                    users.insert(u.username, (u.password, Arc::clone(c)));
                }
            }
            Ok(users)
        })?;
        Ok(BasicAuth {
            hide_credentials: conf.hide_credentials,
            users,
        })
    }
}

fn unauthorized(msg: &str, challenge: bool) -> Flow<'static> {
    let mut resp = json_response(StatusCode::UNAUTHORIZED, &json!({ "message": msg }));
    if challenge {
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm='.'"),
        );
    }
    Flow::respond(resp)
}

/// (user, password) from `Basic <base64>`, whitespace removed as APISIX does.
fn credentials(value: &str) -> Option<(String, String)> {
    let b64 = value
        .strip_prefix("Basic")
        .filter(|r| r.starts_with(char::is_whitespace))?
        .trim();
    let raw = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (u, p) = text.split_once(':')?;
    let strip = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    Some((strip(u), strip(p)))
}

impl Plugin for BasicAuth {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        let Some(value) = req.headers.get(header::AUTHORIZATION) else {
            return unauthorized("Missing authorization in request", true);
        };
        let Some((user, password)) = value.to_str().ok().and_then(credentials) else {
            return unauthorized("Invalid authorization in request", false);
        };
        match self.users.get(&user) {
            Some((want, consumer)) if *want == password => {
                ctx.consumer = Some(Arc::clone(consumer));
            }
            _ => return unauthorized("Invalid user authorization", false),
        }
        if self.hide_credentials {
            req.headers.remove(header::AUTHORIZATION);
        }
        Flow::Continue
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_basic() {
        assert_eq!(
            credentials("Basic dXNlcjpwYXNz"),
            Some(("user".into(), "pass".into()))
        );
        assert_eq!(credentials("Bearer x"), None);
        assert_eq!(credentials("Basic !!!"), None);
    }
}
