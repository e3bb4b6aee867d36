//! `prometheus`: per-route APISIX metrics.

use serde::Deserialize;

use crate::PluginSchema;

/// Configuration of `prometheus`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Prometheus {
    /// Label routes by name instead of id. Sluice's route ids are already names
    /// (`namespace/name/rule`), so both label the same; default false.
    #[serde(default)]
    pub prefer_name: bool,
}

impl PluginSchema for Prometheus {
    const NAME: &'static str = "prometheus";
    const PRIORITY: i32 = 500;
}
