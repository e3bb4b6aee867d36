//! `traffic-split` (priority 966): not run by Sluice. Its config is checked so that a
//! mistake is named, then refused with a message pointing at weighted backends
//! (ApisixRoute `backends[].weight`), which Sluice splits natively — that is what the
//! APISIX ingress controller turns into traffic-split.

use std::sync::Arc;

use sluice_plugin_config::traffic_split::TrafficSplit as Config;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{BuildCtx, Plugin};

/// Refuses `traffic-split` with the reason from its config check.
pub fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Arc<dyn Plugin>, ConfigError> {
    // NB: the check always refuses; this only makes sure of it.
    let _conf: Config = sluice_plugin_config::parse_json(json)?;
    Err(ConfigError::Field {
        plugin: Config::NAME.into(),
        field: "rules".into(),
        reason: "traffic-split is not supported".into(),
    })
}
