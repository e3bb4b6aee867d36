//! Standalone mode: the same translate pipeline as the controller, fed from YAML files
//! (a file or a directory of `*.yaml`/`*.yml`), reloaded when they change.
//!
//! - A file that is not YAML leaves the last good configuration live.
//! - A document that is YAML but not a valid object is left out; the others load.
//! - An object that translation rejects is left out with a message naming its field.
//!
//! Changes are found by polling file metadata every 250 ms, which also works for editors that
//! replace files and for ConfigMap volumes that swap symlinks.
//!
//! - Certificates are checked against the time of each reload, and the files are translated
//!   again when a certificate's verdict changes with time
//!   ([`sluice_translate::Translation::certificates_change_at`]): an expired certificate
//!   stops being served without any file changing.
//! - TLS settings that are not objects (`--default-ssl-certificate NS/NAME` naming a Secret
//!   in the files, `--fallback-sni HOST`) come in through [`Options`]; a problem with them
//!   is listed with the rejected objects.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sluice_translate::status::ConditionStatus;
use sluice_translate::{ClusterState, Options, translate};

use crate::config::store::Store;

/// How often the source is checked for changes.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

pub use sluice_translate::files::{SourceError, list_files};

/// The outcome of reading the configuration files once.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Objects read.
    pub state: ClusterState,
    /// Documents left out, each with file, object, field and reason.
    pub rejected: Vec<String>,
}

/// Reads every file of `path` into a [`ClusterState`] with the loader `kubectl sluice`
/// shares ([`sluice_translate::files`]), logging its notes.
pub fn load(path: &Path) -> Result<Loaded, SourceError> {
    let loaded = sluice_translate::files::load(path)?;
    for note in &loaded.notes {
        tracing::info!(note = %note, "configuration note");
    }
    Ok(Loaded {
        state: loaded.state,
        rejected: loaded.errors.into_iter().map(|e| e.to_string()).collect(),
    })
}

/// A fingerprint of the files' metadata; a change means a reload.
fn fingerprint(path: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let files = list_files(path).unwrap_or_default();
    files
        .into_iter()
        .map(|f| {
            let meta = std::fs::metadata(&f).ok();
            let len = meta.as_ref().map(|m| m.len()).unwrap_or(0);
            let mtime = meta.and_then(|m| m.modified().ok());
            (f, len, mtime)
        })
        .collect()
}

/// Loads `path` once and applies it to `store` if it differs from what is served.
/// Returns whether a new snapshot went live.
pub fn reload(path: &Path, store: &Store, next_version: &mut u64) -> bool {
    reload_with(path, store, next_version, &Options::default()).live
}

/// What one reload did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// A new snapshot went live.
    pub live: bool,
    /// When to translate again because a certificate's validity verdict changes then.
    pub certificates_change_at: Option<SystemTime>,
}

/// Like [`reload`], translating with `base` (its `now` is replaced by the current time).
pub fn reload_with(path: &Path, store: &Store, next_version: &mut u64, base: &Options) -> Reloaded {
    let loaded = match load(path) {
        Ok(l) => {
            store.set_source_reachable(true);
            l
        }
        Err(e) => {
            store.set_source_reachable(false);
            store.record_error(e.to_string());
            return Reloaded::default();
        }
    };
    let opts = Options {
        now: Some(std::time::SystemTime::now()),
        ..base.clone()
    };
    let translation = translate(&loaded.state, &opts);
    let changes_at = translation.certificates_change_at;
    let mut rejected = loaded.rejected;
    rejected.extend(translation.settings.iter().cloned());
    for object in &translation.status.objects {
        for c in object
            .conditions
            .iter()
            .filter(|c| c.status == ConditionStatus::False)
        {
            let line = format!(
                "{} {}/{}: {}: {}",
                object.kind.as_str(),
                object.namespace,
                object.name,
                c.reason,
                c.message
            );
            if object.is_accepted() {
                tracing::warn!(problem = %line, "object served with a problem");
            } else {
                rejected.push(line);
            }
        }
    }
    for r in &rejected {
        tracing::warn!(rejected = %r, "object left out of the snapshot");
    }
    let hash = sluice_proto::content_hash(&translation.snapshot);
    let live = if store.state().hash == hash {
        store.confirm_current(rejected);
        false
    } else {
        let snapshot = sluice_proto::seal(translation.snapshot, *next_version);
        match store.apply(snapshot, rejected) {
            Ok(()) => {
                tracing::info!(version = *next_version, %hash, "snapshot live");
                *next_version += 1;
                true
            }
            Err(_) => false,
        }
    };
    Reloaded {
        live,
        certificates_change_at: changes_at,
    }
}

/// Watches `path` and reloads on change, forever. `version` is the next snapshot version;
/// `after_reload` runs on the thread that did the reload (the binary uses it to hand the
/// parse's transient memory back to the OS).
pub async fn watch(path: PathBuf, store: Arc<Store>, version: u64, after_reload: fn()) {
    watch_with(path, store, version, after_reload, Options::default(), None).await;
}

/// Like [`watch`], translating with `base` (see [`reload_with`]); `recheck_at` is the
/// [`Reloaded::certificates_change_at`] of the first load, if it was done by the caller.
pub async fn watch_with(
    path: PathBuf,
    store: Arc<Store>,
    mut version: u64,
    after_reload: fn(),
    base: Options,
    mut recheck_at: Option<SystemTime>,
) {
    let mut seen = fingerprint(&path);
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let base = Arc::new(base);
    loop {
        tick.tick().await;
        let now = fingerprint(&path);
        let expired = recheck_at.is_some_and(|t| SystemTime::now() >= t);
        if now != seen || expired {
            if expired {
                tracing::info!("a certificate's validity changed; translating again");
            }
            seen = now;
            let path = path.clone();
            let store = Arc::clone(&store);
            let base = Arc::clone(&base);
            // Translation and compilation run off the runtime's reactor thread.
            let mut v = version;
            let result = tokio::task::spawn_blocking(move || {
                let r = reload_with(&path, &store, &mut v, &base);
                after_reload();
                (v, r)
            })
            .await;
            if let Ok((v, r)) = result {
                version = v;
                recheck_at = r.certificates_change_at;
            }
        }
    }
}
