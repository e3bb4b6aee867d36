//! `key-auth` (priority 2500): the consumer whose `key` is in the `header` (default
//! `apikey`) or, failing that, the `query` argument.
//!
//! 401 `{"message":"Missing API key in request"}` without a key,
//! 401 `{"message":"Invalid API key in request"}` with an unknown one.

use std::collections::HashMap;
use std::sync::Arc;

use http::header::HeaderName;
use http::{StatusCode, request};
use serde_json::json;
use sluice_plugin_config::key_auth::{KeyAuth as Config, KeyAuthConsumer};
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{
    BuildCtx, Builtin, Consumer, Flow, Hooks, Plugin, PluginCtx, json_response, support::vars,
};

type Keys = HashMap<String, Arc<Consumer>>;

/// The plugin on one route.
#[derive(Debug)]
pub struct KeyAuth {
    header: HeaderName,
    query: String,
    hide_credentials: bool,
    keys: Arc<Keys>,
}

impl Builtin for KeyAuth {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE;

    /// Builds `key-auth`.
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
                if let Some(cred) = c.credential(Config::NAME) {
                    let k: KeyAuthConsumer =
                        sluice_plugin_config::parse_consumer_json::<Config, _>(cred)?;
                    keys.insert(k.key, Arc::clone(c));
                }
            }
            Ok(keys)
        })?;
        Ok(KeyAuth {
            header,
            query: conf.query,
            hide_credentials: conf.hide_credentials,
            keys,
        })
    }
}

fn unauthorized(msg: &str) -> Flow<'static> {
    Flow::respond(json_response(
        StatusCode::UNAUTHORIZED,
        &json!({ "message": msg }),
    ))
}

impl Plugin for KeyAuth {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        let from_header = req.headers.get(&self.header).and_then(|v| v.to_str().ok());
        let (key, in_header) = match from_header {
            Some(k) => (Some(k.to_owned()), true),
            None => (
                req.uri
                    .query()
                    .and_then(|q| vars::query_arg(q, &self.query))
                    .map(|k| k.into_owned()),
                false,
            ),
        };
        let Some(key) = key else {
            return unauthorized("Missing API key in request");
        };
        let Some(consumer) = self.keys.get(&key) else {
            return unauthorized("Invalid API key in request");
        };
        ctx.consumer = Some(Arc::clone(consumer));
        if self.hide_credentials {
            if in_header {
                req.headers.remove(&self.header);
            } else {
                super::support::rewrite::remove_query_arg(req, &self.query);
            }
        }
        Flow::Continue
    }
}
