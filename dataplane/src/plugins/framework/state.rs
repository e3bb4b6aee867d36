//! Plugin state that outlives snapshots: rate-limit counters, so that a reload does not
//! hand out a fresh budget, and anything else a plugin shares across routes.

use sluice_io::lock;
use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use sluice_plugin_config::ConfigError;
use sluice_plugin_config::opentelemetry::OpentelemetryMetadata;

type Shared = Arc<dyn Any + Send + Sync>;

/// Process-wide plugin state, kept by the store.
#[derive(Debug, Default)]
pub struct PluginState {
    shared: Mutex<HashMap<String, Shared>>,
    /// APISIX metric families (prometheus plugin, connection and request counts).
    pub apisix: Arc<crate::plugins::prometheus::ApisixMetrics>,
    /// The logger plugins' counters (registered in the store's registry).
    pub log_metrics: crate::plugins::support::batch::LogMetrics,
    /// proxy-mirror's counts (`sluice_mirror_*`).
    pub mirror: Arc<crate::plugins::proxy_mirror::MirrorMetrics>,
    /// opentelemetry's counts (`sluice_opentelemetry_spans_*`).
    pub otel: crate::plugins::opentelemetry::OtelMetrics,
    /// Plugins this dataplane runs (`--plugins`); `None` = every built-in plugin.
    enabled: std::sync::RwLock<Option<std::collections::HashSet<String>>>,
    /// The plugin metadata (`--plugin-metadata`), checked.
    metadata: std::sync::RwLock<PluginMetadata>,
    /// Directories file-logger may write into (`--file-logger-dir`); `None` = anywhere
    /// (the library's default; the dataplane binary always sets it).
    file_log_dirs: std::sync::RwLock<Option<Vec<std::path::PathBuf>>>,
}

/// Plugin metadata: APISIX's `plugin_metadata`, process-wide settings of a plugin shared by
/// every route that uses it (for opentelemetry: the collector). Sluice reads it from the
/// dataplane's `--plugin-metadata` file, a YAML or JSON mapping of plugin name to its
/// metadata object.
#[derive(Debug, Clone, Default)]
pub struct PluginMetadata {
    /// `opentelemetry`'s; `None` = its defaults.
    pub opentelemetry: Option<Arc<OpentelemetryMetadata>>,
}

impl PluginMetadata {
    /// Parses and checks the text of a `--plugin-metadata` file: a mapping of plugin name to
    /// metadata. A plugin without metadata in Sluice, or a bad field, is an error naming
    /// the plugin and field.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let whole = |reason: String| ConfigError::Field {
            plugin: "plugin metadata".into(),
            field: String::new(),
            reason,
        };
        let map: BTreeMap<String, Value> = if text.trim().is_empty() {
            BTreeMap::new()
        } else {
            serde_yaml::from_str(text)
                .map_err(|e| whole(format!("not a mapping of plugin name to metadata: {e}")))?
        };
        let mut out = PluginMetadata::default();
        for (name, value) in map {
            match name.as_str() {
                "opentelemetry" => {
                    out.opentelemetry = Some(Arc::new(OpentelemetryMetadata::parse(&value)?));
                }
                _ if sluice_plugin_config::lookup(&name).is_some() => {
                    return Err(ConfigError::Field {
                        plugin: name,
                        field: "metadata".into(),
                        reason: "Sluice takes no plugin metadata for this plugin".into(),
                    });
                }
                _ => return Err(sluice_plugin_config::not_found(&name)),
            }
        }
        Ok(out)
    }
}

impl PluginState {
    /// Restricts the plugins this dataplane runs, as APISIX's `plugins:` list does: a
    /// snapshot with a route using any other plugin is rejected (NACKed). `None` = all.
    pub fn set_enabled(&self, names: Option<Vec<String>>) {
        let set = names.map(|n| n.into_iter().collect());
        match self.enabled.write() {
            Ok(mut g) => *g = set,
            Err(poisoned) => *poisoned.into_inner() = set,
        }
    }

    /// Sets the plugin metadata (`--plugin-metadata`); plugins built afterwards use it.
    pub fn set_metadata(&self, metadata: PluginMetadata) {
        match self.metadata.write() {
            Ok(mut g) => *g = metadata,
            Err(poisoned) => *poisoned.into_inner() = metadata,
        }
    }

    /// Confines file-logger to `dirs` (`--file-logger-dir`); `None` = anywhere.
    pub fn set_file_log_dirs(&self, dirs: Option<Vec<std::path::PathBuf>>) {
        match self.file_log_dirs.write() {
            Ok(mut g) => *g = dirs,
            Err(poisoned) => *poisoned.into_inner() = dirs,
        }
    }

    /// Whether file-logger may write `path` (absolute, without `.`/`..` segments: the
    /// schema checked): `Err` names the directories it may write into.
    pub fn file_log_allowed(&self, path: &str) -> Result<(), String> {
        let check = |g: &Option<Vec<std::path::PathBuf>>| match g {
            None => Ok(()),
            Some(dirs)
                if dirs
                    .iter()
                    .any(|d| std::path::Path::new(path).starts_with(d)) =>
            {
                Ok(())
            }
            Some(dirs) => Err(format!(
                "{path:?} is outside the dataplane's file-logger directories ({}; \
                 --file-logger-dir), /dev/stdout and /dev/stderr",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        };
        match self.file_log_dirs.read() {
            Ok(g) => check(&g),
            Err(poisoned) => check(&poisoned.into_inner()),
        }
    }

    /// The plugin metadata.
    pub fn metadata(&self) -> PluginMetadata {
        match self.metadata.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Whether plugin `name` may run here.
    pub fn is_enabled(&self, name: &str) -> bool {
        let check = |g: &Option<std::collections::HashSet<String>>| {
            g.as_ref().is_none_or(|set| set.contains(name))
        };
        match self.enabled.read() {
            Ok(g) => check(&g),
            Err(poisoned) => check(&poisoned.into_inner()),
        }
    }

    /// The value registered under `key`, made by `make` if there is none (or it has another
    /// type). Plugins use keys like `limit-count:<route>:<config>` so that an unchanged
    /// config keeps its counters across snapshots and a changed one starts afresh.
    pub fn shared<T: Any + Send + Sync>(&self, key: &str, make: impl FnOnce() -> T) -> Arc<T> {
        let mut map = lock(&self.shared);
        if let Some(v) = map.get(key)
            && let Ok(t) = Arc::clone(v).downcast::<T>()
        {
            return t;
        }
        let t = Arc::new(make());
        map.insert(key.to_owned(), Arc::clone(&t) as Shared);
        t
    }

    /// Drops values no compiled table uses any more. Called after each snapshot swap.
    pub fn prune(&self) {
        lock(&self.shared).retain(|_, v| Arc::strong_count(v) > 1);
    }

    /// Number of shared values (for tests).
    pub fn len(&self) -> usize {
        lock(&self.shared).len()
    }

    /// Whether nothing is shared.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
