//! `uri-blocker` (priority 2900, rewrite phase): a request whose URI matches one of
//! `block_rules` is answered `rejected_code` (403), with `{"error_msg":"<rejected_msg>"}`
//! when `rejected_msg` is set, else an empty body.
//!
//! As APISIX, rules match the request URI *with its query string* (`$request_uri`): a rule
//! `root\.exe` blocks `/x?f=root.exe`, and a rule `\.php$` does not block `/a.php?x=1`.
//! NB: APISIX matches the target only as the client sent it, so `/root%2Eexe` or
//! `/a/../root.exe` get past a `root\.exe` rule there; Sluice also matches the normalised,
//! decoded path (the one routes match and the upstream receives) followed by the query, so
//! an encoding cannot get around a rule. The rules are compiled into one set when the
//! snapshot compiles and matched in one pass.

use http::request;
use regex::RegexSet;
use sluice_plugin_config::uri_blocker::UriBlocker as Config;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx, rejection};
use crate::http::path::{self, RequestTarget};

/// The plugin.
#[derive(Debug)]
pub struct UriBlocker {
    rules: RegexSet,
    code: http::StatusCode,
    msg: Option<String>,
}

impl Builtin for UriBlocker {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE;

    /// Builds `uri-blocker`; the rules compile here, once.
    fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let rules = conf.rules().map_err(|e| ConfigError::Field {
            plugin: Config::NAME.into(),
            field: e.field,
            reason: e.reason,
        })?;
        Ok(UriBlocker {
            rules,
            code: super::status(conf.rejected_code),
            msg: conf.rejected_msg,
        })
    }
}

impl UriBlocker {
    fn blocked(&self, req: &request::Parts) -> bool {
        // The target as the client sent it (APISIX's `$request_uri`). NB: the request path
        // keeps it apart only when normalising changed the path; otherwise the target is
        // already the normalised, decoded path and one match does.
        let Some(sent) = req.extensions.get::<RequestTarget>() else {
            let target = req.uri.path_and_query().map_or("/", |pq| pq.as_str());
            return self.rules.is_match(target);
        };
        if self.rules.is_match(sent.0.as_str()) {
            return true;
        }
        // The normalised path, decoded, with the query.
        let normal = req.uri.path();
        let decoded = match path::normalize(normal) {
            Ok(Some(n)) => n.decoded,
            _ => normal.to_owned(),
        };
        let subject = match req.uri.query() {
            Some(q) => format!("{decoded}?{q}"),
            None => decoded,
        };
        self.rules.is_match(&subject)
    }
}

impl Plugin for UriBlocker {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, _ctx: &'a mut PluginCtx) -> Flow<'a> {
        if self.blocked(req) {
            Flow::respond(rejection(self.code, self.msg.as_deref()))
        } else {
            Flow::Continue
        }
    }
}
