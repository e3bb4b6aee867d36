//! `traffic-split`: the schema is checked so mistakes are named, then the plugin is
//! rejected: Sluice splits traffic natively by the route's weighted backends (ApisixRoute
//! `backends[].weight`, which is what the APISIX ingress controller turns into
//! traffic-split), and upstreams referenced from inside a plugin are not supported.

use serde::Deserialize;
use serde_json::Value;

use crate::{FieldError, PluginSchema};

/// One weighted upstream.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightedUpstream {
    /// An upstream by id.
    #[serde(default)]
    pub upstream_id: Option<Value>,
    /// An inline upstream.
    #[serde(default)]
    pub upstream: Option<Value>,
    /// Weight; default 1.
    #[serde(default)]
    pub weight: Option<u32>,
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Conditions.
    #[serde(default, rename = "match")]
    pub match_: Option<Vec<Value>>,
    /// Upstreams and weights.
    pub weighted_upstreams: Vec<WeightedUpstream>,
}

/// Configuration of `traffic-split` (APISIX schema).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficSplit {
    /// Rules.
    #[serde(default)]
    pub rules: Vec<Rule>,
}

impl PluginSchema for TrafficSplit {
    const NAME: &'static str = "traffic-split";
    const PRIORITY: i32 = 966;

    fn check(&self) -> Result<(), FieldError> {
        for (i, r) in self.rules.iter().enumerate() {
            for (j, u) in r.weighted_upstreams.iter().enumerate() {
                let field = if u.upstream_id.is_some() {
                    "upstream_id"
                } else if u.upstream.is_some() {
                    "upstream"
                } else {
                    continue;
                };
                return Err(FieldError::new(
                    format!("rules[{i}].weighted_upstreams[{j}].{field}"),
                    "upstreams referenced by a plugin are not supported; give the route \
                     several backends with weights (ApisixRoute http[].backends[].weight), \
                     which Sluice splits natively",
                ));
            }
        }
        Err(FieldError::new(
            "rules",
            "traffic-split is not supported; give the route several backends with weights \
             (ApisixRoute http[].backends[].weight), which Sluice splits natively",
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::validate;
    use serde_json::json;

    #[test]
    fn always_refused_with_the_field_named() {
        let e = validate("traffic-split", &json!({"rules": [{"weighted_upstreams": [{"weight": 1}, {"upstream": {"nodes": {}}}]}]})).unwrap_err();
        assert!(
            e.to_string()
                .contains("rules[0].weighted_upstreams[1].upstream: upstreams referenced"),
            "{e}"
        );
        let e = validate("traffic-split", &json!({"rules": [{"match": []}]})).unwrap_err();
        assert!(
            e.to_string().contains("missing field `weighted_upstreams`"),
            "{e}"
        );
    }
}
