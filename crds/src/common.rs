//! Types shared by several kinds: status, plugins, secret references, timeouts.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use crate::duration::{DURATION_PATTERN, DurationError, parse_duration};

/// Condition type set by the controller once it has translated an object
/// (`True`: valid and included in the snapshot).
pub const CONDITION_ACCEPTED: &str = "Accepted";
/// Condition type set once connected dataplanes acknowledged a snapshot containing the object.
pub const CONDITION_PROGRAMMED: &str = "Programmed";
/// `Accepted` reason when the object is valid.
pub const REASON_ACCEPTED: &str = "Accepted";
/// `Accepted` reason when the object's spec is invalid (the message names the field).
pub const REASON_INVALID_SPEC: &str = "InvalidSpec";
/// `Accepted` reason when the object is valid but could not be synced.
pub const REASON_SYNC_FAILED: &str = "SyncFailed";

/// Timeout used for `connect`, `send` and `read` when not set (APISIX: 60s).
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(60);
/// Weight of a backend, upstream reference or external node when not set (APISIX: 100).
pub const DEFAULT_WEIGHT: i32 = 100;

/// Status shared by every `apisix.apache.org/v2` kind.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixStatus {
    /// `Accepted` (translation verdict) and `Programmed` (dataplanes serve it) conditions.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A plugin attached to a route, plugin config, consumer or global rule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixRoutePlugin {
    /// Plugin name, e.g. `limit-count`.
    pub name: String,
    /// Whether the plugin is in use. Default `true`.
    #[serde(default = "default_true")]
    pub enable: bool,
    /// Free-form plugin configuration, exactly as APISIX expects it. Default: empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::preserve_unknown_object")]
    pub config: Option<serde_json::Map<String, serde_json::Value>>,
    /// Name of a Secret (same namespace) whose keys override `config`; dotted keys set nested
    /// fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<String>,
}

fn default_true() -> bool {
    true
}

/// Reference to a Secret by name and namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixSecret {
    /// Secret name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Secret namespace.
    #[schemars(length(min = 1))]
    pub namespace: String,
}

/// Reference to a Secret in the object's own namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalSecretReference {
    /// Secret name.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// Upstream timeouts; each is a duration string such as `30s`, `500ms` or `1m30s`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamTimeout {
    /// Timeout for establishing a connection. Default `60s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DURATION_PATTERN))]
    pub connect: Option<String>,
    /// Timeout between two writes to the upstream. Default `60s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DURATION_PATTERN))]
    pub send: Option<String>,
    /// Timeout between two reads from the upstream. Default `60s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DURATION_PATTERN))]
    pub read: Option<String>,
}

/// [`UpstreamTimeout`] with the strings parsed and defaults applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolvedTimeout {
    /// Connect timeout.
    pub connect: Duration,
    /// Send timeout.
    pub send: Duration,
    /// Read timeout.
    pub read: Duration,
}

/// A timeout field that failed to parse, named for status messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("timeout.{field}: {source}")]
pub struct TimeoutError {
    /// `connect`, `send` or `read`.
    pub field: &'static str,
    /// The parse failure.
    #[source]
    pub source: DurationError,
}

impl UpstreamTimeout {
    /// Parses all three timeouts, using [`DEFAULT_UPSTREAM_TIMEOUT`] for unset ones.
    pub fn resolve(&self) -> Result<ResolvedTimeout, TimeoutError> {
        let one = |field: &'static str, v: &Option<String>| match v {
            None => Ok(DEFAULT_UPSTREAM_TIMEOUT),
            Some(s) => parse_duration(s).map_err(|source| TimeoutError { field, source }),
        };
        Ok(ResolvedTimeout {
            connect: one("connect", &self.connect)?,
            send: one("send", &self.send)?,
            read: one("read", &self.read)?,
        })
    }
}

/// Deserializes an explicit `null` as the type's default, as the API server does when it prunes
/// nulls from non-nullable fields (so `hosts:` with no value means "no hosts").
pub(crate) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Option::unwrap_or_default)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn timeout_defaults_and_errors_name_the_field() {
        let t = UpstreamTimeout {
            connect: Some("5s".into()),
            send: None,
            read: Some("1m30s".into()),
        };
        assert_eq!(
            t.resolve().unwrap(),
            ResolvedTimeout {
                connect: Duration::from_secs(5),
                send: Duration::from_secs(60),
                read: Duration::from_secs(90),
            }
        );
        let bad = UpstreamTimeout {
            read: Some("10".into()),
            ..Default::default()
        };
        let e = bad.resolve().unwrap_err();
        assert_eq!(e.field, "read");
        assert!(e.to_string().starts_with("timeout.read: "), "{e}");
    }

    #[test]
    fn plugin_enable_defaults_to_true_and_config_is_free_form() {
        let p: ApisixRoutePlugin = serde_yaml::from_str(
            "name: limit-count\nconfig:\n  count: 2\n  nested: {a: [1, \"x\"]}\n",
        )
        .unwrap();
        assert!(p.enable);
        let cfg = p.config.unwrap();
        assert_eq!(cfg["count"], serde_json::json!(2));
        assert_eq!(cfg["nested"]["a"][1], serde_json::json!("x"));
        let p: ApisixRoutePlugin = serde_yaml::from_str("name: cors\nenable: false\n").unwrap();
        assert!(!p.enable);
        assert_eq!(p.config, None);
    }
}
