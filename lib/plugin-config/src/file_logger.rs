//! `file-logger`: append access-log entries, one JSON object per line, to a file.

use serde::Deserialize;
use serde_json::Value;

use crate::logger::{LogFormat, check_bodies, default_max_body};
use crate::{FieldError, PluginSchema};

/// Configuration of `file-logger` (APISIX 3.x schema and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLogger {
    /// Absolute path of the file, opened for appending (created when missing). Required:
    /// Sluice has no plugin metadata to take a default from.
    pub path: String,
    /// A custom entry instead of APISIX's full one; default none.
    #[serde(default)]
    pub log_format: Option<Value>,
    /// Log the request body, its first `max_req_body_bytes` (copied as it streams
    /// upstream); default false.
    #[serde(default)]
    pub include_req_body: bool,
    /// Refused: not supported yet.
    #[serde(default)]
    pub include_req_body_expr: Option<Value>,
    /// Log the response body, at most `max_resp_body_bytes` of it; default false.
    #[serde(default)]
    pub include_resp_body: bool,
    /// Refused: not supported yet.
    #[serde(default)]
    pub include_resp_body_expr: Option<Value>,
    /// Most request-body bytes logged, at least 1; default 524288.
    #[serde(default = "default_max_body")]
    pub max_req_body_bytes: u64,
    /// Most response-body bytes logged, at least 1; default 524288.
    #[serde(default = "default_max_body")]
    pub max_resp_body_bytes: u64,
    /// Refused: conditions on logging are not supported yet.
    #[serde(default, rename = "match")]
    pub match_: Option<Value>,
}

/// Directories a `path` may not point into (kernel interfaces), except [`DEV_ALLOWED`].
const FORBIDDEN_DIRS: [&str; 3] = ["/proc", "/sys", "/dev"];

/// Files under `/dev` a `path` may name: the dataplane's own output streams.
pub const DEV_ALLOWED: [&str; 2] = ["/dev/stdout", "/dev/stderr"];

impl FileLogger {
    /// The compiled [`FileLogger::log_format`].
    pub fn format(&self) -> Result<Option<LogFormat>, FieldError> {
        self.log_format
            .as_ref()
            .map(|v| LogFormat::compile("log_format", v))
            .transpose()
    }
}

/// Checks a log file path: absolute, no NUL, no `.`/`..` segments, not a directory
/// name, not under `/proc`, `/sys` or `/dev` (except `/dev/stdout` and `/dev/stderr`).
pub fn check_path(path: &str) -> Result<(), FieldError> {
    let bad = |why: &str| Err(FieldError::new("path", format!("{path:?} {why}")));
    if path.contains('\0') {
        return Err(FieldError::new("path", "must not contain NUL"));
    }
    if !path.starts_with('/') {
        return bad("is not absolute");
    }
    if path.ends_with('/') {
        return bad("names a directory");
    }
    if path.split('/').any(|s| s == "." || s == "..") {
        return bad("has `.` or `..` segments");
    }
    if DEV_ALLOWED.contains(&path) {
        return Ok(());
    }
    let norm = path.trim_start_matches('/');
    for dir in FORBIDDEN_DIRS {
        let d = &dir[1..];
        if norm == d || norm.strip_prefix(d).is_some_and(|r| r.starts_with('/')) {
            return bad(&format!(
                "is under {dir} (only /dev/stdout and /dev/stderr are allowed there)"
            ));
        }
    }
    Ok(())
}

impl PluginSchema for FileLogger {
    const NAME: &'static str = "file-logger";
    const PRIORITY: i32 = 399;

    fn check(&self) -> Result<(), FieldError> {
        check_path(&self.path)?;
        self.format()?;
        if self.match_.is_some() {
            return Err(FieldError::new("match", "is not supported by Sluice yet"));
        }
        check_bodies(
            self.include_req_body_expr.as_ref(),
            self.include_resp_body_expr.as_ref(),
            self.max_req_body_bytes,
            self.max_resp_body_bytes,
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::{parse, validate};
    use serde_json::json;

    #[test]
    fn defaults_and_paths() {
        let c: FileLogger = parse(&json!({"path": "/var/log/sluice/access.log"})).unwrap();
        assert!(!c.include_resp_body && !c.include_req_body);
        assert_eq!(c.max_resp_body_bytes, 524_288);
        assert_eq!(FileLogger::PRIORITY, 399);
        for ok in ["/dev/stdout", "/dev/stderr", "/tmp/a.log", "/devices/x.log"] {
            validate("file-logger", &json!({ "path": ok })).unwrap();
        }
        for (path, want) in [
            ("logs/a.log", "\"logs/a.log\" is not absolute"),
            ("/var/log/", "\"/var/log/\" names a directory"),
            ("/var/log/../../etc/x", "has `.` or `..` segments"),
            ("/proc/self/fd/1", "is under /proc"),
            ("/dev/sda", "is under /dev"),
            ("/sys", "is under /sys"),
            ("/tmp/a\u{0}b", "must not contain NUL"),
        ] {
            let e = validate("file-logger", &json!({ "path": path }))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("plugin \"file-logger\": path: ") && e.contains(want),
                "{path}: {e}"
            );
        }
        let e = validate("file-logger", &json!({})).unwrap_err().to_string();
        assert_eq!(e, "plugin \"file-logger\": missing field `path`");
        let e = validate("file-logger", &json!({"path": "/tmp/a", "match": [["a"]]}))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "plugin \"file-logger\": match: is not supported by Sluice yet"
        );
    }
}
