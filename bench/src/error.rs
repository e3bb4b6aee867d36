//! The harness's error type.

use std::path::PathBuf;

/// Everything that can go wrong while preparing, running or reporting a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A duration flag such as `--duration` could not be parsed.
    #[error("invalid duration {input:?}: {reason}")]
    InvalidDuration {
        /// The text the user gave.
        input: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// wrk's output did not contain a figure the harness needs.
    #[error("could not parse wrk output: {0}")]
    WrkOutput(String),
    /// A `/proc/<pid>/stat` or `/proc/<pid>/status` line did not have the expected shape.
    #[error("could not parse /proc data: {0}")]
    ProcFormat(String),
    /// A required external program (nginx, wrk, taskset) is not installed.
    #[error("`{program}` not found on PATH; run scripts/install/bench-deps.sh (as root) first")]
    MissingTool {
        /// The program that was looked for.
        program: &'static str,
    },
    /// A child process could not be started.
    #[error("failed to start {what}: {source}")]
    Spawn {
        /// Which process (e.g. "upstream nginx").
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A process exited or never answered correctly while the harness waited for it.
    #[error("{what} is not ready: {detail}")]
    NotReady {
        /// Which process.
        what: String,
        /// What was observed (exit status, last log lines, last response).
        detail: String,
    },
    /// wrk failed or reported nothing.
    #[error("wrk failed: {0}")]
    Wrk(String),
    /// The sluice dataplane binary could not be built or found.
    #[error("sluice dataplane unavailable: {0}")]
    SluiceUnavailable(String),
    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done ("write", "read", "create dir").
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A result file could not be (de)serialized.
    #[error("result file {path}: {source}")]
    Json {
        /// The file involved.
        path: PathBuf,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// The port the scenario needs is already taken by another process.
    #[error("port {port} on 127.0.0.1 is already in use; stop whatever listens there")]
    PortInUse {
        /// The busy port.
        port: u16,
    },
    /// A bad combination of command-line options.
    #[error("{0}")]
    Usage(String),
    /// The run was interrupted by a signal.
    #[error("interrupted")]
    Interrupted,
}

impl BenchError {
    /// Shorthand for an [`BenchError::Io`] error.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
