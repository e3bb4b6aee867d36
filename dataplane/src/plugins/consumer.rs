//! Consumers of one snapshot: credentials for the auth plugins and consumer plugins.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sluice_plugin_config::ConfigError;
use sluice_proto::v1;

use super::{BuildCtx, Plugin, PluginState};

/// One consumer (ApisixConsumer `<namespace>_<name>`).
#[derive(Debug)]
pub struct Consumer {
    /// Name, as labels and `consumer-restriction` see it.
    pub name: Arc<str>,
    /// Credentials by auth plugin name: the consumer config as canonical JSON.
    pub credentials: Vec<(String, String)>,
    /// Plugins applied to this consumer's requests (merged into the route's).
    pub plugins: Vec<Arc<dyn Plugin>>,
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
    wants_log: bool,
    wants_request_head: bool,
    reads_body: bool,
}

impl ConsumerTable {
    /// Compiles the snapshot's consumers.
    pub fn build(
        consumers: &[v1::Consumer],
        state: &PluginState,
    ) -> Result<Arc<Self>, InvalidConsumer> {
        let empty = Arc::new(ConsumerTable::default());
        let mut out = Vec::with_capacity(consumers.len());
        let mut wants_log = false;
        let mut wants_request_head = false;
        let mut reads_body = false;
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
                    let built = super::build(p, &cx).map_err(err)?;
                    wants_log |= built.wants_log();
                    wants_request_head |= built.wants_request_head();
                    reads_body |= built.reads_body();
                    plugins.push(built);
                }
            }
            plugins.sort_by_key(|p| std::cmp::Reverse(p.priority()));
            out.push(Arc::new(Consumer {
                name: Arc::from(c.name.as_str()),
                credentials,
                plugins,
            }));
        }
        Ok(Arc::new(ConsumerTable {
            consumers: out,
            indexes: Mutex::new(HashMap::new()),
            wants_log,
            wants_request_head,
            reads_body,
        }))
    }

    /// All consumers, sorted by name.
    pub fn all(&self) -> &[Arc<Consumer>] {
        &self.consumers
    }

    /// Whether some consumer plugin logs (so bodies must be wrapped).
    pub fn any_wants_log(&self) -> bool {
        self.wants_log
    }

    /// Whether some consumer plugin wants the request head as received (a logger): every
    /// chain of the snapshot then copies it.
    pub fn any_wants_request_head(&self) -> bool {
        self.wants_request_head
    }

    /// Whether a consumer's plugin reads the request body ([`super::Plugin::reads_body`]).
    pub fn any_reads_body(&self) -> bool {
        self.reads_body
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
