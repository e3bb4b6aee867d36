//! `consumer-restriction` (priority 2400): allow or deny by consumer name (or, on a
//! consumer, by route id).
//!
//! Without an authenticated consumer: 401 `{"message":"Missing authentication or identity
//! verification."}`. Denied: `rejected_code` (403) with `{"message":"<rejected_msg>"}`, by
//! default `The consumer_name is forbidden.` / `The route_id is forbidden.`

use http::{StatusCode, request};
use serde_json::json;
use sluice_plugin_config::ConfigError;
use sluice_plugin_config::consumer_restriction::{ConsumerRestriction as Config, RestrictionType};

use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx, json_response};

/// The plugin.
#[derive(Debug)]
pub struct ConsumerRestriction {
    conf: Config,
    message: String,
}

impl Builtin for ConsumerRestriction {
    type Config = Config;
    const HOOKS: Hooks = Hooks::ACCESS;

    /// Builds `consumer-restriction`.
    fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let ty = match conf.type_ {
            RestrictionType::RouteId => "route_id",
            RestrictionType::ServiceId => "service_id",
            RestrictionType::ConsumerGroupId => "consumer_group_id",
            RestrictionType::ConsumerName => "consumer_name",
        };
        let message = conf
            .rejected_msg
            .clone()
            .unwrap_or_else(|| format!("The {ty} is forbidden."));
        Ok(ConsumerRestriction { conf, message })
    }
}

impl ConsumerRestriction {
    fn reject(&self) -> Flow<'static> {
        Flow::respond(json_response(
            super::status(self.conf.rejected_code),
            &json!({ "message": self.message }),
        ))
    }
}

impl Plugin for ConsumerRestriction {
    fn access<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        let value: &str = match self.conf.type_ {
            RestrictionType::RouteId => &ctx.chain.route_id,
            _ => match ctx.consumer_name() {
                Some(n) => n,
                None => {
                    return Flow::respond(json_response(
                        StatusCode::UNAUTHORIZED,
                        &json!({"message": "Missing authentication or identity verification."}),
                    ));
                }
            },
        };
        if let Some(list) = &self.conf.whitelist
            && !list.iter().any(|v| v == value)
        {
            return self.reject();
        }
        if let Some(list) = &self.conf.blacklist
            && list.iter().any(|v| v == value)
        {
            return self.reject();
        }
        if let Some(rules) = &self.conf.allowed_by_methods
            && let Some(rule) = rules.iter().find(|r| r.user == value)
            && !rule
                .methods
                .iter()
                .any(|m| m.eq_ignore_ascii_case(req.method.as_str()))
        {
            return self.reject();
        }
        Flow::Continue
    }
}
