//! `ua-restriction` (priority 2999, access phase): only a `User-Agent` matching an
//! `allowlist` regex passes, or one matching a `denylist` regex is refused, with 403
//! `{"message":"Not allowed"}` (or `message`). A request without `User-Agent` is refused
//! unless `bypass_missing`. With several `User-Agent` headers, an allowlist passes when any
//! matches and a denylist refuses when any matches, as APISIX. Values are trimmed.

use http::{StatusCode, request};
use regex::RegexSet;
use serde_json::json;
use sluice_plugin_config::ua_restriction::UaRestriction as Config;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx, json_response};

/// The plugin.
#[derive(Debug)]
pub struct UaRestriction {
    rules: RegexSet,
    allow: bool,
    bypass_missing: bool,
    message: serde_json::Value,
}

impl Builtin for UaRestriction {
    type Config = Config;
    const HOOKS: Hooks = Hooks::ACCESS;

    /// Builds `ua-restriction`; the regexes compile here, once.
    fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let (rules, allow) = conf.rules().map_err(|e| ConfigError::Field {
            plugin: Config::NAME.into(),
            field: e.field,
            reason: e.reason,
        })?;
        Ok(UaRestriction {
            rules,
            allow,
            bypass_missing: conf.bypass_missing,
            message: json!({ "message": conf.message }),
        })
    }
}

impl UaRestriction {
    fn refuse(&self) -> Flow<'static> {
        Flow::respond(json_response(StatusCode::FORBIDDEN, &self.message))
    }
}

impl Plugin for UaRestriction {
    fn access<'a>(&'a self, req: &'a mut request::Parts, _ctx: &'a mut PluginCtx) -> Flow<'a> {
        let mut values = req
            .headers
            .get_all(http::header::USER_AGENT)
            .iter()
            .peekable();
        if values.peek().is_none() {
            return if self.bypass_missing {
                Flow::Continue
            } else {
                self.refuse()
            };
        }
        let any_match = values.any(|v| {
            let ua = String::from_utf8_lossy(v.as_bytes());
            self.rules.is_match(ua.trim())
        });
        if any_match == self.allow {
            Flow::Continue
        } else {
            self.refuse()
        }
    }
}
