//! Typed plugin configurations with APISIX's defaults and ranges.
//!
//! One crate shared by both sides so they can never disagree:
//! - translate calls [`validate`] / [`validate_consumer`] to reject a bad object with a
//!   message naming the plugin and field (a validating step never runs dataplane code);
//! - the dataplane calls [`parse`] with the plugin's type when a snapshot compiles and builds
//!   its plugin instance from the typed value (never per request).
//!
//! # Adding a plugin's config
//!
//! 1. A file `src/<plugin>.rs` with a `Deserialize` struct implementing [`PluginSchema`]
//!    (`NAME`, `PRIORITY` from APISIX, `check()` for ranges serde cannot express).
//! 2. One line in [`REGISTRY`]: `entry::<my_plugin::MyPlugin>()`, or
//!    `entry_with_consumer::<P, C>()` when consumers carry a config for it (credentials).
//!
//! Numbers and booleans given as strings (as Secret values always are) are accepted where a
//! number or boolean is expected, and numbers where a string is expected.
#![forbid(unsafe_code)]

pub mod api_breaker;
pub mod basic_auth;
pub mod client_control;
pub mod common;
pub mod consumer_restriction;
pub mod cors;
pub mod csrf;
pub mod expr;
pub mod fault_injection;
pub mod file_logger;
pub mod forward_auth;
pub mod gzip;
pub mod hmac_auth;
pub mod http_logger;
pub mod ip_restriction;
pub mod jwt_auth;
pub mod key_auth;
pub mod limit_conn;
pub mod limit_count;
pub mod limit_req;
pub mod logger;
pub mod openid_connect;
pub mod opentelemetry;
pub mod prometheus;
pub mod proxy_mirror;
pub mod proxy_rewrite;
pub mod real_ip;
pub mod redirect;
pub mod request_id;
pub mod request_validation;
pub mod response_rewrite;
pub mod rewrite;
pub mod traffic_split;
pub mod ua_restriction;
pub mod uri_blocker;
pub mod vars;

use serde::de::DeserializeOwned;
use serde_json::Value;

/// A plugin configuration is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// No plugin of that name exists.
    #[error("plugin {0:?} is unknown (known plugins: {known})", known = known_names())]
    UnknownPlugin(String),
    /// An APISIX plugin Sluice refuses by design: it carries code (Lua, or calls to an
    /// external plugin runner) that a Rust dataplane cannot run. See [`REFUSED`].
    #[error("plugin {0:?} {why}; Sluice cannot run it", why = refused_why(.0))]
    Refused(String),
    /// The plugin exists but this dataplane does not run it (`sluice-dataplane --plugins`).
    #[error("plugin {0:?} is not enabled on this dataplane (its --plugins list)")]
    NotEnabled(String),
    /// The plugin takes no consumer configuration.
    #[error("plugin {0:?} takes no consumer configuration")]
    NoConsumerConfig(String),
    /// A field has the wrong type, is missing, or is out of range.
    #[error("plugin {plugin:?}: {}{reason}", if field.is_empty() { String::new() } else { format!("{field}: ") })]
    Field {
        /// Plugin name.
        plugin: String,
        /// Dotted path of the field (`redis.port`, `whitelist[2]`), empty for the whole config.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

/// A field of a config is out of range (returned by [`PluginSchema::check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path of the field.
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

impl FieldError {
    /// An error on `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

/// The typed configuration of one plugin.
pub trait PluginSchema: DeserializeOwned {
    /// The plugin's name, as in APISIX (`limit-count`).
    const NAME: &'static str;
    /// APISIX's priority: a higher one runs first within a phase.
    const PRIORITY: i32;
    /// Checks that serde cannot express (ranges, one-of). Default: none.
    fn check(&self) -> Result<(), FieldError> {
        Ok(())
    }
}

/// The typed configuration a consumer carries for a plugin (credentials).
pub trait ConsumerSchema: DeserializeOwned {
    /// Checks beyond the types. Default: none.
    fn check(&self) -> Result<(), FieldError> {
        Ok(())
    }
}

type ValidateFn = fn(&Value) -> Result<(), ConfigError>;

/// One known plugin.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Name.
    pub name: &'static str,
    /// APISIX priority.
    pub priority: i32,
    validate: ValidateFn,
    validate_consumer: Option<ValidateFn>,
}

const fn entry<P: PluginSchema>() -> Entry {
    Entry {
        name: P::NAME,
        priority: P::PRIORITY,
        validate: validate_as::<P>,
        validate_consumer: None,
    }
}

const fn entry_with_consumer<P: PluginSchema, C: ConsumerSchema>() -> Entry {
    Entry {
        name: P::NAME,
        priority: P::PRIORITY,
        validate: validate_as::<P>,
        validate_consumer: Some(validate_consumer_as::<P, C>),
    }
}

/// Every plugin Sluice knows, in no particular order. Adding a plugin = one line here.
pub const REGISTRY: &[Entry] = &[
    entry::<limit_count::LimitCount>(),
    entry::<limit_req::LimitReq>(),
    entry::<limit_conn::LimitConn>(),
    entry::<prometheus::Prometheus>(),
    entry_with_consumer::<key_auth::KeyAuth, key_auth::KeyAuthConsumer>(),
    entry_with_consumer::<basic_auth::BasicAuth, basic_auth::BasicAuthConsumer>(),
    entry_with_consumer::<jwt_auth::JwtAuth, jwt_auth::JwtAuthConsumer>(),
    entry::<consumer_restriction::ConsumerRestriction>(),
    entry::<proxy_rewrite::ProxyRewrite>(),
    entry::<cors::Cors>(),
    entry::<redirect::Redirect>(),
    entry::<ip_restriction::IpRestriction>(),
    entry::<real_ip::RealIp>(),
    entry::<request_id::RequestId>(),
    entry::<response_rewrite::ResponseRewrite>(),
    entry::<fault_injection::FaultInjection>(),
    entry::<gzip::Gzip>(),
    entry::<traffic_split::TrafficSplit>(),
    entry::<ua_restriction::UaRestriction>(),
    entry::<uri_blocker::UriBlocker>(),
    entry::<client_control::ClientControl>(),
    entry::<csrf::Csrf>(),
    entry_with_consumer::<hmac_auth::HmacAuth, hmac_auth::HmacAuthConsumer>(),
    entry::<api_breaker::ApiBreaker>(),
    entry::<forward_auth::ForwardAuth>(),
    entry::<openid_connect::OpenidConnect>(),
    entry::<opentelemetry::Opentelemetry>(),
    entry::<http_logger::HttpLogger>(),
    entry::<file_logger::FileLogger>(),
    entry::<proxy_mirror::ProxyMirror>(),
    entry::<request_validation::RequestValidation>(),
];

/// APISIX plugins that carry code a Rust dataplane cannot run, with why: they are refused
/// with [`ConfigError::Refused`] rather than reported as unknown.
pub const REFUSED: &[(&str, &str)] = &[
    ("serverless-pre-function", "runs Lua code (its `functions`)"),
    (
        "serverless-post-function",
        "runs Lua code (its `functions`)",
    ),
    ("exit-transformer", "runs Lua code (its `functions`)"),
    (
        "body-transformer",
        "runs Lua code (its templates are lua-resty-template, which embeds Lua)",
    ),
    (
        "ext-plugin-pre-req",
        "runs code in an external APISIX plugin runner (Go/Java/Python) over APISIX's RPC",
    ),
    (
        "ext-plugin-post-req",
        "runs code in an external APISIX plugin runner (Go/Java/Python) over APISIX's RPC",
    ),
    (
        "ext-plugin-post-resp",
        "runs code in an external APISIX plugin runner (Go/Java/Python) over APISIX's RPC",
    ),
];

fn refused_why(name: &str) -> &'static str {
    REFUSED
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("runs code", |(_, why)| why)
}

/// The error for a plugin name that is not in [`REGISTRY`]: [`ConfigError::Refused`] for
/// the plugins of [`REFUSED`], else [`ConfigError::UnknownPlugin`].
pub fn not_found(name: &str) -> ConfigError {
    if REFUSED.iter().any(|(n, _)| *n == name) {
        ConfigError::Refused(name.to_owned())
    } else {
        ConfigError::UnknownPlugin(name.to_owned())
    }
}

fn known_names() -> String {
    let mut names: Vec<&str> = REGISTRY.iter().map(|e| e.name).collect();
    names.sort_unstable();
    names.join(", ")
}

/// The registry entry of `name`.
pub fn lookup(name: &str) -> Option<&'static Entry> {
    REGISTRY.iter().find(|e| e.name == name)
}

/// APISIX priority of `name`, if the plugin is known.
pub fn priority(name: &str) -> Option<i32> {
    lookup(name).map(|e| e.priority)
}

/// Checks a route / plugin-config / global-rule configuration of plugin `name`.
pub fn validate(name: &str, config: &Value) -> Result<(), ConfigError> {
    let e = lookup(name).ok_or_else(|| not_found(name))?;
    (e.validate)(config)
}

/// Checks a consumer's configuration of plugin `name` (e.g. `key-auth: {key}`).
pub fn validate_consumer(name: &str, config: &Value) -> Result<(), ConfigError> {
    let e = lookup(name).ok_or_else(|| not_found(name))?;
    match e.validate_consumer {
        Some(f) => f(config),
        None => (e.validate)(config),
    }
}

/// Whether consumers carry credentials for `name` (an authentication plugin).
pub fn is_auth(name: &str) -> bool {
    lookup(name).is_some_and(|e| e.validate_consumer.is_some())
}

fn validate_as<P: PluginSchema>(config: &Value) -> Result<(), ConfigError> {
    parse::<P>(config).map(|_| ())
}

fn validate_consumer_as<P: PluginSchema, C: ConsumerSchema>(
    config: &Value,
) -> Result<(), ConfigError> {
    parse_consumer::<P, C>(config).map(|_| ())
}

/// Parses and checks the configuration of plugin `P`.
pub fn parse<P: PluginSchema>(config: &Value) -> Result<P, ConfigError> {
    let p: P = deserialize_lenient(P::NAME, config)?;
    p.check().map_err(|e| field_error(P::NAME, e))?;
    Ok(p)
}

/// Parses and checks a consumer's configuration `C` of plugin `P`.
pub fn parse_consumer<P: PluginSchema, C: ConsumerSchema>(
    config: &Value,
) -> Result<C, ConfigError> {
    let c: C = deserialize_lenient(P::NAME, config)?;
    c.check().map_err(|e| field_error(P::NAME, e))?;
    Ok(c)
}

/// Parses canonical JSON text (as carried in the snapshot) as plugin `P`'s configuration.
pub fn parse_json<P: PluginSchema>(json: &str) -> Result<P, ConfigError> {
    let v = parse_value(P::NAME, json)?;
    parse::<P>(&v)
}

/// Parses canonical JSON text as a consumer's configuration of plugin `P`.
pub fn parse_consumer_json<P: PluginSchema, C: ConsumerSchema>(
    json: &str,
) -> Result<C, ConfigError> {
    let v = parse_value(P::NAME, json)?;
    parse_consumer::<P, C>(&v)
}

fn parse_value(plugin: &str, json: &str) -> Result<Value, ConfigError> {
    if json.trim().is_empty() {
        return Ok(Value::Object(serde_json::Map::new()));
    }
    serde_json::from_str(json).map_err(|e| ConfigError::Field {
        plugin: plugin.to_owned(),
        field: String::new(),
        reason: format!("config is not JSON: {e}"),
    })
}

fn field_error(plugin: &str, e: FieldError) -> ConfigError {
    ConfigError::Field {
        plugin: plugin.to_owned(),
        field: e.field,
        reason: e.reason,
    }
}

/// Deserializes `T`, coercing scalars given as strings (Secret values) where the type wants
/// a number or boolean, and numbers/booleans where it wants a string.
fn deserialize_lenient<T: DeserializeOwned>(
    plugin: &str,
    config: &Value,
) -> Result<T, ConfigError> {
    let mut value = if config.is_null() {
        Value::Object(serde_json::Map::new())
    } else {
        config.clone()
    };
    // Each round fixes one field; a config has far fewer fields than this.
    for _ in 0..64 {
        let err = match serde_path_to_error::deserialize::<_, T>(&value) {
            Ok(t) => return Ok(t),
            Err(e) => e,
        };
        let segments: Vec<String> = err
            .path()
            .iter()
            .map(|s| match s {
                serde_path_to_error::Segment::Map { key } => key.clone(),
                serde_path_to_error::Segment::Seq { index } => format!("[{index}]"),
                _ => String::new(),
            })
            .collect();
        let reason = err.inner().to_string();
        if coerce(&mut value, &segments, &reason) {
            continue;
        }
        // NB: `#[serde(flatten)]` fields lose their path; find the offending top-level
        // field by the value the error quotes.
        if let Some(key) = flattened_culprit(&value, &reason) {
            if coerce(&mut value, std::slice::from_ref(&key), &reason) {
                continue;
            }
            return Err(ConfigError::Field {
                plugin: plugin.to_owned(),
                field: key,
                reason,
            });
        }
        let mut field = String::new();
        for s in &segments {
            if s.is_empty() {
                continue;
            }
            if !field.is_empty() && !s.starts_with('[') {
                field.push('.');
            }
            field.push_str(s);
        }
        return Err(ConfigError::Field {
            plugin: plugin.to_owned(),
            field,
            reason,
        });
    }
    Err(ConfigError::Field {
        plugin: plugin.to_owned(),
        field: String::new(),
        reason: "too many fields of the wrong type".into(),
    })
}

fn flattened_culprit(value: &Value, reason: &str) -> Option<String> {
    let Value::Object(map) = value else {
        return None;
    };
    let quoted = reason.strip_prefix("invalid type: ")?;
    let quoted = quoted.rsplit_once(", expected")?.0;
    map.iter()
        .find(|(_, v)| {
            let shown = match v {
                Value::String(s) => format!("string {s:?}"),
                Value::Bool(b) => format!("boolean `{b}`"),
                Value::Number(n) if n.is_f64() => format!("floating point `{n}`"),
                Value::Number(n) => format!("integer `{n}`"),
                _ => return false,
            };
            shown == quoted
        })
        .map(|(k, _)| k.clone())
}

fn coerce(value: &mut Value, path: &[String], reason: &str) -> bool {
    let mut cur = value;
    for seg in path {
        if seg.is_empty() {
            return false;
        }
        cur = match (cur, seg.strip_prefix('[').and_then(|s| s.strip_suffix(']'))) {
            (Value::Array(a), Some(i)) => {
                match i.parse::<usize>().ok().and_then(|i| a.get_mut(i)) {
                    Some(v) => v,
                    None => return false,
                }
            }
            (Value::Object(m), None) => match m.get_mut(seg) {
                Some(v) => v,
                None => return false,
            },
            _ => return false,
        };
    }
    let wants_string = reason.contains("expected a string");
    match cur {
        Value::String(s) if !wants_string => {
            let t = s.trim();
            let new = if t == "true" || t == "false" {
                Value::Bool(t == "true")
            } else if let Ok(n) = t.parse::<i64>() {
                Value::from(n)
            } else if let Ok(n) = t.parse::<u64>() {
                Value::from(n)
            } else if let Some(n) = t.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
                Value::Number(n)
            } else {
                return false;
            };
            *cur = new;
            true
        }
        Value::Number(n) if wants_string => {
            *cur = Value::String(n.to_string());
            true
        }
        Value::Bool(b) if wants_string => {
            *cur = Value::String(b.to_string());
            true
        }
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_plugin_is_named() {
        let e = validate("no-such", &json!({})).unwrap_err();
        assert!(e.to_string().contains("\"no-such\" is unknown"), "{e}");
    }

    #[test]
    fn wrong_type_names_plugin_and_field() {
        let e = validate("limit-count", &json!({"count": "many", "time_window": 60})).unwrap_err();
        assert_eq!(
            e,
            ConfigError::Field {
                plugin: "limit-count".into(),
                field: "count".into(),
                reason: "invalid type: string \"many\", expected u64".into()
            }
        );
        let e = validate("limit-count", &json!({"time_window": 60})).unwrap_err();
        assert!(e.to_string().contains("missing field `count`"), "{e}");
    }

    #[test]
    fn strings_from_secrets_are_coerced() {
        let c: limit_count::LimitCount = parse(&json!({
            "count": "10", "time_window": 60, "policy": "redis", "redis_host": "h",
            "redis_port": "6380", "allow_degradation": "true"
        }))
        .unwrap();
        assert_eq!(c.count, 10);
        assert_eq!(c.redis.redis_port, 6380);
        assert!(c.allow_degradation);
    }

    #[test]
    fn a_redis_host_must_be_an_address_or_a_host_name() {
        for host in [
            "redis.default",
            "redis-master.cache.svc.cluster.local.",
            "localhost",
            "10.0.0.1",
            "::1",
            "[fd00::1]",
        ] {
            let conf =
                json!({"count": 1, "time_window": 60, "policy": "redis", "redis_host": host});
            assert!(validate("limit-count", &conf).is_ok(), "{host}");
        }
        for (host, why) in [
            (
                "a b\r\n",
                "is neither an IP address nor a host name: invalid character ' ' in host name",
            ),
            (
                "999.0.0.1/33",
                "is neither an IP address nor a host name: invalid character '/' in host name",
            ),
            (
                "redis..default",
                "is neither an IP address nor a host name: empty label (leading, trailing or double dot)",
            ),
            ("999.0.0.1", "is not a valid IPv4 address"),
        ] {
            let conf =
                json!({"count": 1, "time_window": 60, "policy": "redis", "redis_host": host});
            let e = validate("limit-count", &conf).unwrap_err().to_string();
            assert!(
                e.starts_with("plugin \"limit-count\": redis_host: ") && e.ends_with(why),
                "{host}: {e}"
            );
        }
    }

    #[test]
    fn out_of_range_is_rejected() {
        let e = validate("limit-count", &json!({"count": 0, "time_window": 60})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "plugin \"limit-count\": count: must be at least 1"
        );
        let e = validate(
            "limit-count",
            &json!({"count": 1, "time_window": 60, "rejected_code": 99}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("rejected_code"), "{e}");
    }

    #[test]
    fn code_carrying_plugins_are_refused_with_why() {
        for name in [
            "serverless-pre-function",
            "serverless-post-function",
            "exit-transformer",
        ] {
            let e = validate(name, &json!({"functions": ["return function() end"]})).unwrap_err();
            assert_eq!(e, ConfigError::Refused(name.into()));
            assert_eq!(
                e.to_string(),
                format!("plugin {name:?} runs Lua code (its `functions`); Sluice cannot run it")
            );
        }
        for name in [
            "ext-plugin-pre-req",
            "ext-plugin-post-req",
            "ext-plugin-post-resp",
        ] {
            let e = validate(name, &json!({"conf": []}))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("external APISIX plugin runner") && e.ends_with("Sluice cannot run it"),
                "{e}"
            );
        }
        // Consumers' plugin lists too; and an unknown name is still "unknown".
        let e = validate_consumer("serverless-pre-function", &json!({})).unwrap_err();
        assert!(matches!(e, ConfigError::Refused(_)), "{e}");
        let e = validate("serverless-pre-functions", &json!({})).unwrap_err();
        assert!(matches!(e, ConfigError::UnknownPlugin(_)), "{e}");
        for (n, _) in REFUSED {
            assert!(lookup(n).is_none(), "{n} is both refused and registered");
        }
    }

    #[test]
    fn registry_names_are_unique() {
        let mut names: Vec<_> = REGISTRY.iter().map(|e| e.name).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(n, names.len());
    }
}
