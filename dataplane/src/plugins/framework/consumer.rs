//! Consumers of one snapshot: credentials for the auth plugins and consumer plugins.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sluice_plugin_config::ConfigError;
use sluice_proto::v1;

use super::plugin::{Hooks, Instance};
use super::registry::{self, BuildCtx};
use super::state::PluginState;

/// One consumer (ApisixConsumer `<namespace>_<name>`).
#[derive(Debug)]
pub struct Consumer {
    /// Name, as labels and `consumer-restriction` see it.
    pub name: Arc<str>,
    /// Credentials by auth plugin name: the consumer config as canonical JSON.
    pub credentials: Vec<(String, String)>,
    /// Plugins applied to this consumer's requests (merged into the route's).
    pub plugins: Vec<Instance>,
}

impl Consumer {
    /// The consumer's credential config for `plugin`, if any.
    pub fn credential(&self, plugin: &str) -> Option<&str> {
        self.credentials
            .iter()
            .find(|(p, _)| p == plugin)
            .map(|(_, c)| c.as_str())
    }
}

/// Why the consumers could not be compiled.
#[derive(Debug, thiserror::Error)]
#[error("consumer {consumer}: {error}")]
pub struct InvalidConsumer {
    /// Consumer name.
    pub consumer: String,
    /// What is wrong.
    pub error: ConfigError,
}

type Index = Arc<dyn Any + Send + Sync>;

/// The consumers of a snapshot, with per-auth-plugin indexes built once on first use.
#[derive(Debug, Default)]
pub struct ConsumerTable {
    consumers: Vec<Arc<Consumer>>,
    indexes: Mutex<HashMap<&'static str, Index>>,
    /// The hooks of every consumer's plugins.
    hooks: Hooks,
}

impl ConsumerTable {
    /// Compiles the snapshot's consumers.
    pub fn build(
        consumers: &[v1::Consumer],
        state: &PluginState,
    ) -> Result<Arc<Self>, InvalidConsumer> {
        let empty = Arc::new(ConsumerTable::default());
        let mut out = Vec::with_capacity(consumers.len());
        let mut hooks = Hooks::NONE;
        for c in consumers {
            let owner = format!("consumer:{}", c.name);
            let cx = BuildCtx {
                owner: &owner,
                state,
                consumers: &empty,
                upstreams: None,
            };
            let mut credentials = Vec::new();
            let mut plugins = Vec::new();
            for p in &c.plugins {
                let err = |error| InvalidConsumer {
                    consumer: c.name.clone(),
                    error,
                };
                if sluice_plugin_config::is_auth(&p.name) {
                    let v: serde_json::Value =
                        serde_json::from_str(&p.config_json).unwrap_or(serde_json::Value::Null);
                    sluice_plugin_config::validate_consumer(&p.name, &v).map_err(err)?;
                    credentials.push((p.name.clone(), p.config_json.clone()));
                } else {
                    let built = registry::build(p, &cx).map_err(err)?;
                    hooks = hooks.with(built.hooks);
                    plugins.push(built);
                }
            }
            plugins.sort_by_key(|p| std::cmp::Reverse(p.priority));
            out.push(Arc::new(Consumer {
                name: Arc::from(c.name.as_str()),
                credentials,
                plugins,
            }));
        }
        Ok(Arc::new(ConsumerTable {
            consumers: out,
            indexes: Mutex::new(HashMap::new()),
            hooks,
        }))
    }

    /// All consumers, sorted by name.
    pub fn all(&self) -> &[Arc<Consumer>] {
        &self.consumers
    }

    /// The hooks of every consumer's plugins: whether one logs (so bodies must be
    /// wrapped), wants the request head as received (a logger: every chain of the snapshot
    /// then copies it) or reads the request body.
    pub fn hooks(&self) -> Hooks {
        self.hooks
    }

    /// The index `plugin` keeps over the consumers (e.g. key → consumer), built by `make`
    /// the first time a route with that plugin compiles, then shared by every route.
    pub fn index<T: Any + Send + Sync>(
        &self,
        plugin: &'static str,
        make: impl FnOnce(&[Arc<Consumer>]) -> Result<T, ConfigError>,
    ) -> Result<Arc<T>, ConfigError> {
        let mut map = match self.indexes.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some(ix) = map.get(plugin)
            && let Ok(t) = Arc::clone(ix).downcast::<T>()
        {
            return Ok(t);
        }
        let t = Arc::new(make(&self.consumers)?);
        map.insert(plugin, Arc::clone(&t) as Index);
        Ok(t)
    }
}
