//! `traffic-split` (priority 966, access phase): the first rule whose `match` holds (or a
//! rule without `match`) picks one of its weighted upstreams by smooth weighted round robin
//! — exact ratios over each cycle, like APISIX's roundrobin — and the request goes there
//! instead of to the route's backends. An entry without `upstream_id` is the route's own
//! upstream (the request keeps the route's backends). No rule matching: the route's own.
//!
//! Translate has already turned every reference and inline upstream into a snapshot
//! upstream, so `upstream_id` here is a snapshot upstream id, looked up once when the
//! snapshot compiles; an unknown one rejects the snapshot.

use std::sync::Arc;

use http::request;
use sluice_plugin_config::expr::{Expr, ExprVar};
use sluice_plugin_config::traffic_split::TrafficSplit as Config;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx, support::vars};
use crate::upstream::{Upstream, WeightedSequence};

#[derive(Debug)]
struct Rule {
    /// `None`: always applies; else one of these must hold.
    matches: Option<Vec<Expr>>,
    /// Upstreams with a positive weight; `None` = the route's own.
    choices: Vec<Option<Arc<Upstream>>>,
    order: WeightedSequence,
}

/// The plugin on one route.
#[derive(Debug)]
pub struct TrafficSplit {
    rules: Vec<Rule>,
}

fn field(field: String, reason: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        plugin: Config::NAME.into(),
        field,
        reason: reason.into(),
    }
}

impl Builtin for TrafficSplit {
    type Config = Config;
    const HOOKS: Hooks = Hooks::ACCESS;

    /// Builds `traffic-split` for a route, resolving `upstream_id`s in the snapshot.
    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let Some(upstreams) = cx.upstreams else {
            return Err(field(
                String::new(),
                "traffic-split picks a route's upstream; it only works on routes",
            ));
        };
        let mut rules = Vec::with_capacity(conf.rules.len());
        for (j, r) in conf.rules.iter().enumerate() {
            let matches = r
                .compile_match(&format!("rules[{j}]"))
                .map_err(|e| field(e.field, e.reason))?;
            let mut choices = Vec::new();
            let mut weights = Vec::new();
            for (k, wu) in r.weighted_upstreams().iter().enumerate() {
                let at = format!("rules[{j}].weighted_upstreams[{k}]");
                if wu.upstream.is_some() {
                    return Err(field(
                        format!("{at}.upstream"),
                        "inline upstreams are turned into snapshot upstreams by the translator; \
                         reference one by upstream_id",
                    ));
                }
                let up = match wu.upstream_id() {
                    None => None,
                    Some(id) => Some(Arc::clone(upstreams.get(id.as_str()).ok_or_else(|| {
                        field(
                            format!("{at}.upstream_id"),
                            format!("unknown upstream `{id}`"),
                        )
                    })?)),
                };
                if wu.weight() > 0 {
                    choices.push(up);
                    weights.push(wu.weight());
                }
            }
            let order = WeightedSequence::new(&weights).ok_or_else(|| {
                field(
                    format!("rules[{j}].weighted_upstreams"),
                    "every weight is 0; at least one must be positive",
                )
            })?;
            rules.push(Rule {
                matches,
                choices,
                order,
            });
        }
        Ok(TrafficSplit { rules })
    }
}

impl Plugin for TrafficSplit {
    fn access<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        for rule in &self.rules {
            let applies = match &rule.matches {
                None => true,
                Some(list) => list.iter().any(|e| {
                    e.eval(&mut |v| match v {
                        ExprVar::Req(v) => vars::get(v, req, ctx),
                        ExprVar::Status => None,
                    })
                }),
            };
            if applies {
                ctx.split_upstream = rule.choices.get(rule.order.next()).cloned().flatten();
                return Flow::Continue;
            }
        }
        Flow::Continue
    }
}
