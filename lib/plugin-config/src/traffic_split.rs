//! `traffic-split` (priority 966): APISIX's schema. The first rule whose `match` passes
//! (or a rule without `match`) picks one of its `weighted_upstreams` by weight; an entry
//! with neither `upstream_id` nor `upstream` means the route's own upstream.
//!
//! What `upstream_id` names in Kubernetes terms is decided by translate (see
//! `docs/plugins.md`); translate then rewrites every entry to `upstream_id` = a snapshot
//! upstream id (inline `upstream`s become snapshot upstreams too), so the dataplane only
//! ever looks ids up in the snapshot.

use serde::Deserialize;
use serde_json::Value;

use crate::expr::{self, Expr};
use crate::{FieldError, PluginSchema};

/// Most weighted upstreams in one rule (APISIX `maxItems`).
pub const MAX_WEIGHTED_UPSTREAMS: usize = 20;

/// One weighted upstream.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightedUpstream {
    /// An upstream by id (a string; APISIX also allows an integer).
    #[serde(default)]
    pub upstream_id: Option<Value>,
    /// An inline upstream.
    #[serde(default)]
    pub upstream: Option<InlineUpstream>,
    /// Weight, at least 0; default 1.
    #[serde(default)]
    pub weight: Option<u32>,
}

impl WeightedUpstream {
    /// The weight (default 1).
    pub fn weight(&self) -> u32 {
        self.weight.unwrap_or(1)
    }

    /// `upstream_id` as text (an integer id is written as its digits).
    pub fn upstream_id(&self) -> Option<String> {
        match self.upstream_id.as_ref()? {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }
}

/// `timeout` of an inline upstream, in seconds (APISIX).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InlineTimeout {
    /// Connect timeout, seconds.
    #[serde(default)]
    pub connect: Option<f64>,
    /// Send timeout, seconds.
    #[serde(default)]
    pub send: Option<f64>,
    /// Read timeout, seconds.
    #[serde(default)]
    pub read: Option<f64>,
}

/// An inline upstream (the part of APISIX's upstream schema Sluice carries).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InlineUpstream {
    /// `roundrobin` (default), `chash`, `ewma` or `least_conn`.
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    /// `{"host:port": weight, ...}` or `[{host, port, weight}, ...]`. Required.
    pub nodes: Value,
    /// For `chash`: `vars` (default), `header`, `cookie`, `consumer`, `vars_combinations`.
    #[serde(default)]
    pub hash_on: Option<String>,
    /// For `chash`: the variable, header or cookie name, or the template.
    #[serde(default)]
    pub key: Option<String>,
    /// `http` (default), `https`, `grpc`, `grpcs`.
    #[serde(default)]
    pub scheme: Option<String>,
    /// Retries to other nodes; default nodes - 1.
    #[serde(default)]
    pub retries: Option<u32>,
    /// Timeouts in seconds.
    #[serde(default)]
    pub timeout: Option<InlineTimeout>,
    /// `pass` (default), `node` or `rewrite`.
    #[serde(default)]
    pub pass_host: Option<String>,
    /// Host header for `pass_host: rewrite`.
    #[serde(default)]
    pub upstream_host: Option<String>,
    /// Health checks: refused (give them to an ApisixUpstream and reference it).
    #[serde(default)]
    pub checks: Option<Value>,
    /// Name (informational).
    #[serde(default)]
    pub name: Option<String>,
    /// Description (informational).
    #[serde(default)]
    pub desc: Option<String>,
}

/// One node of an inline upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// IP address or host name.
    pub host: String,
    /// Port, 1-65535.
    pub port: u16,
    /// Weight.
    pub weight: u32,
}

fn split_host_port(addr: &str) -> Option<(&str, &str)> {
    if let Some(rest) = addr.strip_prefix('[') {
        let (host, port) = rest.split_once("]:")?;
        return Some((host, port));
    }
    addr.rsplit_once(':')
}

fn node_host(field: &str, host: &str) -> Result<String, FieldError> {
    if host.is_empty() || host.bytes().any(|b| b <= b' ' || b == b'/' || b == b'@') {
        return Err(FieldError::new(
            field,
            format!("{host:?} is not an IP address or host name"),
        ));
    }
    Ok(host.to_owned())
}

fn port(field: &str, v: Option<i64>) -> Result<u16, FieldError> {
    v.and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .ok_or_else(|| FieldError::new(field, "needs a port number (1-65535)"))
}

fn weight(field: &str, v: &Value) -> Result<u32, FieldError> {
    let n = v
        .as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()));
    n.and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| FieldError::new(field, "weight must be an integer >= 0"))
}

impl InlineUpstream {
    /// The nodes, checked (field paths relative to the upstream).
    pub fn nodes(&self) -> Result<Vec<Node>, FieldError> {
        let mut out = Vec::new();
        match &self.nodes {
            Value::Object(m) => {
                for (addr, w) in m {
                    let field = format!("nodes.{addr}");
                    let (host, p) = split_host_port(addr)
                        .ok_or_else(|| FieldError::new(&field, "the key must be `host:port`"))?;
                    out.push(Node {
                        host: node_host(&field, host)?,
                        port: port(&field, p.parse().ok())?,
                        weight: weight(&field, w)?,
                    });
                }
            }
            Value::Array(list) => {
                for (i, n) in list.iter().enumerate() {
                    let field = format!("nodes[{i}]");
                    let Value::Object(m) = n else {
                        return Err(FieldError::new(field, "must be {host, port, weight}"));
                    };
                    if let Some(k) = m
                        .keys()
                        .find(|k| !matches!(k.as_str(), "host" | "port" | "weight" | "priority"))
                    {
                        return Err(FieldError::new(
                            format!("{field}.{k}"),
                            "unknown field (expected host, port, weight)",
                        ));
                    }
                    if m.get("priority").is_some_and(|p| p.as_i64() != Some(0)) {
                        return Err(FieldError::new(
                            format!("{field}.priority"),
                            "node priorities are not supported",
                        ));
                    }
                    let host = m.get("host").and_then(Value::as_str).unwrap_or("");
                    let p = m
                        .get("port")
                        .and_then(|p| p.as_i64().or_else(|| p.as_str()?.parse().ok()));
                    out.push(Node {
                        host: node_host(&format!("{field}.host"), host)?,
                        port: port(&format!("{field}.port"), p)?,
                        weight: weight(
                            &format!("{field}.weight"),
                            m.get("weight").unwrap_or(&Value::from(1)),
                        )?,
                    });
                }
            }
            _ => {
                return Err(FieldError::new(
                    "nodes",
                    "must be {\"host:port\": weight} or [{host, port, weight}]",
                ));
            }
        }
        if out.is_empty() {
            return Err(FieldError::new("nodes", "at least one node is required"));
        }
        Ok(out)
    }

    fn check(&self) -> Result<(), FieldError> {
        self.nodes()?;
        let one_of = |field: &str, v: &Option<String>, allowed: &[&str]| match v {
            Some(s) if !allowed.contains(&s.as_str()) => Err(FieldError::new(
                field,
                format!("{s:?} is not one of {}", allowed.join(", ")),
            )),
            _ => Ok(()),
        };
        one_of(
            "type",
            &self.type_,
            &["roundrobin", "chash", "ewma", "least_conn"],
        )?;
        one_of(
            "hash_on",
            &self.hash_on,
            &["vars", "header", "cookie", "consumer", "vars_combinations"],
        )?;
        one_of("scheme", &self.scheme, &["http", "https", "grpc", "grpcs"])?;
        one_of("pass_host", &self.pass_host, &["pass", "node", "rewrite"])?;
        if self.type_.as_deref() == Some("chash")
            && self.hash_on.as_deref() != Some("consumer")
            && self.key.as_deref().is_none_or(str::is_empty)
        {
            return Err(FieldError::new("key", "required with type chash"));
        }
        if self.pass_host.as_deref() == Some("rewrite")
            && self.upstream_host.as_deref().is_none_or(str::is_empty)
        {
            return Err(FieldError::new(
                "upstream_host",
                "required with pass_host rewrite",
            ));
        }
        if let Some(t) = &self.timeout {
            for (name, v) in [("connect", t.connect), ("send", t.send), ("read", t.read)] {
                if v.is_some_and(|s| !(s > 0.0 && s.is_finite())) {
                    return Err(FieldError::new(
                        format!("timeout.{name}"),
                        "must be a number of seconds > 0",
                    ));
                }
            }
        }
        if self.checks.is_some() {
            return Err(FieldError::new(
                "checks",
                "health checks of an inline upstream are not supported; give them to an \
                 ApisixUpstream (healthCheck) and reference it by upstream_id",
            ));
        }
        Ok(())
    }
}

/// One `match` entry: its `vars` must all hold (lua-resty-expr).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// The expression; unset or empty always holds.
    #[serde(default)]
    pub vars: Option<Value>,
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Conditions, one of which must hold; unset = the rule always applies.
    #[serde(default, rename = "match")]
    pub match_: Option<Vec<Match>>,
    /// Upstreams and weights; unset = `[{weight: 1}]` (the route's own upstream).
    #[serde(default)]
    pub weighted_upstreams: Option<Vec<WeightedUpstream>>,
}

impl Rule {
    /// The weighted upstreams (APISIX's default: the route's own upstream, weight 1).
    pub fn weighted_upstreams(&self) -> Vec<WeightedUpstream> {
        self.weighted_upstreams.clone().unwrap_or_else(|| {
            vec![WeightedUpstream {
                upstream_id: None,
                upstream: None,
                weight: Some(1),
            }]
        })
    }

    /// The compiled `match` (field paths under `rules[i]`): `None` = always applies; else
    /// one of the expressions must hold (an empty list never applies, as in APISIX).
    pub fn compile_match(&self, field: &str) -> Result<Option<Vec<Expr>>, FieldError> {
        let Some(list) = &self.match_ else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(list.len());
        for (k, m) in list.iter().enumerate() {
            let f = format!("{field}.match[{k}].vars");
            let e = match &m.vars {
                None => Expr::All(Vec::new()),
                Some(v) => expr::compile(&f, v)?,
            };
            if e.uses_status() {
                return Err(FieldError::new(
                    f,
                    "`status` is not known before the upstream answers",
                ));
            }
            out.push(e);
        }
        Ok(Some(out))
    }
}

/// Configuration of `traffic-split` (APISIX schema).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficSplit {
    /// Rules, tried in order.
    #[serde(default)]
    pub rules: Vec<Rule>,
}

impl PluginSchema for TrafficSplit {
    const NAME: &'static str = "traffic-split";
    const PRIORITY: i32 = 966;

    fn check(&self) -> Result<(), FieldError> {
        for (i, r) in self.rules.iter().enumerate() {
            let field = format!("rules[{i}]");
            r.compile_match(&field)?;
            let ups = r.weighted_upstreams();
            if ups.is_empty() {
                return Err(FieldError::new(
                    format!("{field}.weighted_upstreams"),
                    "at least one weighted upstream is required",
                ));
            }
            if ups.len() > MAX_WEIGHTED_UPSTREAMS {
                return Err(FieldError::new(
                    format!("{field}.weighted_upstreams"),
                    format!("at most {MAX_WEIGHTED_UPSTREAMS} weighted upstreams"),
                ));
            }
            if ups.iter().all(|u| u.weight() == 0) {
                return Err(FieldError::new(
                    format!("{field}.weighted_upstreams"),
                    "every weight is 0; at least one must be positive",
                ));
            }
            for (j, u) in ups.iter().enumerate() {
                let f = format!("{field}.weighted_upstreams[{j}]");
                if u.upstream_id.is_some() && u.upstream.is_some() {
                    return Err(FieldError::new(
                        f,
                        "set either upstream_id or upstream, not both",
                    ));
                }
                if u.upstream_id.is_some() && u.upstream_id().is_none_or(|s| s.is_empty()) {
                    return Err(FieldError::new(
                        format!("{f}.upstream_id"),
                        "must be a non-empty string",
                    ));
                }
                if let Some(up) = &u.upstream {
                    up.check().map_err(|e| {
                        FieldError::new(format!("{f}.upstream.{}", e.field), e.reason)
                    })?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::validate;
    use serde_json::json;

    #[test]
    fn accepts_apisix_examples() {
        validate(
            "traffic-split",
            &json!({"rules": [{"match": [{"vars": [["arg_name", "==", "jack"], ["http_user-id", ">", "23"]]}],
                "weighted_upstreams": [{"upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1981": 10}, "timeout": {"connect": 15, "send": 15, "read": 15}}, "weight": 3}, {"weight": 1}]}]}),
        )
        .unwrap();
        validate(
            "traffic-split",
            &json!({"rules": [{"weighted_upstreams": [{"upstream_id": "canary:80", "weight": 1}, {"weight": 1}]}, {}]}),
        )
        .unwrap();
        let c: TrafficSplit = crate::parse(&json!({"rules": [{"weighted_upstreams": [{"upstream": {"nodes": [{"host": "::1", "port": 80, "weight": 2}]}}]}]})).unwrap();
        let n = c.rules[0].weighted_upstreams()[0]
            .upstream
            .as_ref()
            .unwrap()
            .nodes()
            .unwrap();
        assert_eq!(
            n,
            vec![Node {
                host: "::1".into(),
                port: 80,
                weight: 2
            }]
        );
    }

    #[test]
    fn errors_name_the_field() {
        for (conf, want) in [
            (
                json!({"rules": [{"weighted_upstreams": [{"weight": 1}, {"upstream": {"nodes": {}}}]}]}),
                "rules[0].weighted_upstreams[1].upstream.nodes: at least one node is required",
            ),
            (
                json!({"rules": [{"weighted_upstreams": [{"upstream": {"nodes": {"127.0.0.1": 1}}}]}]}),
                "rules[0].weighted_upstreams[0].upstream.nodes.127.0.0.1: the key must be `host:port`",
            ),
            (
                json!({"rules": [{"weighted_upstreams": [{"weight": 0}]}]}),
                "rules[0].weighted_upstreams: every weight is 0",
            ),
            (
                json!({"rules": [{"weighted_upstreams": []}]}),
                "rules[0].weighted_upstreams: at least one weighted upstream is required",
            ),
            (
                json!({"rules": [{}, {"match": [{"vars": [["arg_a", "like", "x"]]}]}]}),
                "rules[1].match[0].vars[0]: operator \"like\" is not supported",
            ),
            (
                json!({"rules": [{"weighted_upstreams": [{"upstream_id": "a", "upstream": {"nodes": {"a:1": 1}}}]}]}),
                "rules[0].weighted_upstreams[0]: set either upstream_id or upstream, not both",
            ),
            (
                json!({"rules": [{"weighted_upstreams": [{"upstream": {"nodes": {"a:1": 1}, "checks": {}}}]}]}),
                "rules[0].weighted_upstreams[0].upstream.checks: health checks of an inline upstream are not supported",
            ),
            (
                json!({"rules": [{"weighted_upstreams": [{"upstream": {"nodes": {"a:1": 1}, "type": "chash"}}]}]}),
                "rules[0].weighted_upstreams[0].upstream.key: required with type chash",
            ),
        ] {
            let e = validate("traffic-split", &conf).unwrap_err().to_string();
            assert!(e.contains(want), "{e}\nwanted: {want}");
        }
    }
}
