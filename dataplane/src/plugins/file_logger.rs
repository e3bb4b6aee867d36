//! `file-logger` (priority 399, log phase): APISIX's access-log entry appended to a file,
//! one JSON object per line.
//!
//! The request path only queues the entry ([`super::support::batch`]); a task writes what is queued
//! on a blocking thread, as soon as it arrives (no batching delay), each batch with one
//! `write` on a file opened with `O_APPEND` (created `0640` when missing). Before each
//! write the path is checked: when the file was moved or removed (log rotation), it is
//! opened again, so `logrotate` without `copytruncate` works. A failed write drops its
//! entries and counts them (`sluice_log_entries_dropped_total{reason="send_failed"}`).
//!
//! `path` must be `/dev/stdout`, `/dev/stderr`, or a file under one of the dataplane's
//! `--file-logger-dir` directories (default `/var/log/sluice`, an emptyDir in the chart):
//! a route's configuration cannot write into the state directory (`snapshot.pb`), fill
//! another volume or reach a file the dataplane can write for other reasons. Another path
//! is a plugin error naming the field (the route is refused, the rest keeps serving).

use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::time::Duration;

use bytes::Bytes;
use sluice_plugin_config::file_logger::FileLogger as Config;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::support::batch::{Batcher, Policy, Sink};
use super::support::log::Logger;
use super::{BuildCtx, Builtin, Hooks};

/// The plugin: a [`Logger`] appending to a file.
pub type FileLogger = Logger<Config>;

impl Builtin for FileLogger {
    type Config = Config;
    const HOOKS: Hooks = Logger::<Config>::HOOKS;

    fn hooks(&self) -> Hooks {
        Logger::hooks(self)
    }

    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        if !sluice_plugin_config::file_logger::DEV_ALLOWED.contains(&conf.path.as_str()) {
            cx.state
                .file_log_allowed(&conf.path)
                .map_err(|reason| ConfigError::Field {
                    plugin: Config::NAME.into(),
                    field: "path".into(),
                    reason,
                })?;
        }
        let format = conf.format().map_err(|e| ConfigError::Field {
            plugin: Config::NAME.into(),
            field: e.field,
            reason: e.reason,
        })?;
        let key = format!("file-logger:{}:{json}", cx.owner);
        let (owner, metrics) = (cx.owner, &cx.state.log_metrics);
        let batcher = cx.state.shared(&key, || {
            let policy = Policy {
                max_size: 1000,
                inactive: None,
                buffer_duration: Duration::from_secs(1),
                max_retries: 0,
                retry_delay: Duration::ZERO,
            };
            let sink = FileSink {
                path: conf.path.clone(),
                file: None,
            };
            Batcher::start(Config::NAME, owner, policy, sink, metrics)
        });
        Ok(Logger::new(
            format,
            (
                conf.include_req_body.then_some(conf.max_req_body_bytes),
                conf.include_resp_body.then_some(conf.max_resp_body_bytes),
            ),
            batcher,
        ))
    }
}

/// An open log file with the identity (device, inode) it had when opened.
struct Open {
    file: File,
    id: Option<(u64, u64)>,
}

/// Appends batches to one file.
struct FileSink {
    path: String,
    file: Option<Open>,
}

fn open(path: &str) -> Result<Open, String> {
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .open(path)
        .map_err(|e| format!("open {path}: {e}"))?;
    let id = file.metadata().ok().map(|m| (m.dev(), m.ino()));
    Ok(Open { file, id })
}

/// Writes `text` to the file of `path`, reopening it when the path now names another file
/// (rotated) or none (removed).
fn write(path: &str, kept: Option<Open>, text: &[u8]) -> (Option<Open>, Result<(), String>) {
    let current = std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
    let mut f = match kept {
        // NB: character devices (/dev/stdout) keep their identity; a regular file moved
        // away or removed does not.
        Some(o) if current.is_some() && o.id == current => o,
        _ => match open(path) {
            Ok(o) => o,
            Err(e) => return (None, Err(e)),
        },
    };
    match f.file.write_all(text) {
        Ok(()) => (Some(f), Ok(())),
        Err(e) => (None, Err(format!("write {path}: {e}"))),
    }
}

impl Sink for FileSink {
    type Payload = Bytes;

    fn encode(&mut self, batch: Vec<String>) -> Bytes {
        let mut text = Vec::with_capacity(batch.iter().map(|e| e.len() + 1).sum());
        for e in batch {
            text.extend_from_slice(e.as_bytes());
            text.push(b'\n');
        }
        Bytes::from(text)
    }

    async fn send(&mut self, text: &Bytes) -> Result<(), String> {
        let text = text.clone();
        let path = self.path.clone();
        let kept = self.file.take();
        // NB: file I/O blocks (a full pipe behind /dev/stdout, a slow disk): on the
        // blocking pool, never on a runtime thread.
        match tokio::task::spawn_blocking(move || write(&path, kept, &text)).await {
            Ok((file, result)) => {
                self.file = file;
                result
            }
            Err(e) => Err(format!("writer: {e}")),
        }
    }
}
