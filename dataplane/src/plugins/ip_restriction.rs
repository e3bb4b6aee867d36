//! `ip-restriction` (priority 3000, access phase): only `whitelist` addresses pass, or
//! `blacklist` addresses are refused, with `response_code` (403) and
//! `{"message":"Your IP address is not allowed"}` (or `message`). The client address is
//! the one `real-ip` set, if it ran.

use http::request;
use ipnet::IpNet;
use serde_json::json;
use sluice_plugin_config::ip_restriction::IpRestriction as Config;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx, json_response};

/// The plugin.
#[derive(Debug)]
pub struct IpRestriction {
    nets: Vec<IpNet>,
    whitelist: bool,
    message: serde_json::Value,
    code: http::StatusCode,
}

impl Builtin for IpRestriction {
    type Config = Config;
    const HOOKS: Hooks = Hooks::ACCESS;

    /// Builds `ip-restriction`.
    fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let (nets, whitelist) = conf.nets().map_err(|e| ConfigError::Field {
            plugin: Config::NAME.into(),
            field: e.field,
            reason: e.reason,
        })?;
        Ok(IpRestriction {
            nets,
            whitelist,
            message: json!({ "message": conf.message }),
            code: super::status(conf.response_code),
        })
    }
}

impl Plugin for IpRestriction {
    fn access<'a>(&'a self, _req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        let ip = ctx.remote_addr.ip().to_canonical();
        let listed = self.nets.iter().any(|n| n.contains(&ip));
        if listed == self.whitelist {
            Flow::Continue
        } else {
            Flow::Respond(Box::new(json_response(self.code, &self.message)))
        }
    }
}
