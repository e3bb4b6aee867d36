//! The error type of the e2e harness.

use std::path::PathBuf;
use std::time::Duration;

/// Why a harness step failed. The messages say what to run or look at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A program could not be started at all (missing, not executable).
    #[error("could not run `{command}`: {source}{hint}")]
    Spawn {
        /// The command line.
        command: String,
        /// What the OS said.
        source: std::io::Error,
        /// What to do about it (may be empty).
        hint: String,
    },
    /// A program ran and exited unsuccessfully.
    #[error("`{command}` failed ({status}):\n{stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// Its standard error (and output, when that says more).
        stderr: String,
    },
    /// The test cluster did not start; `log` carries the script's explanation.
    #[error("the test cluster did not start:\n{log}")]
    ClusterStart {
        /// What `scripts/cluster/testcluster.sh start` printed.
        log: String,
    },
    /// `DIR/cluster.env` lacked a key or had a malformed value.
    #[error("{path}: missing or malformed {key}")]
    ClusterEnv {
        /// The file.
        path: PathBuf,
        /// The key.
        key: &'static str,
    },
    /// Killing or restarting a control-plane process failed.
    #[error("test cluster control plane: {what}")]
    ControlPlane {
        /// What went wrong.
        what: String,
    },
    /// Network namespaces need CAP_NET_ADMIN.
    #[error("network namespaces need root (CAP_NET_ADMIN); run the e2e tests as root (CI does)")]
    NotRoot,
    /// All private subnets for test namespaces are in use.
    #[error("no free /28 left in {0} for a test network namespace")]
    NoSubnet(&'static str),
    /// A namespace already holds the maximum number of addresses.
    #[error("network namespace {0} has no free address left in its /28")]
    NoAddress(String),
    /// A backend never accepted connections.
    #[error("backend `{command}` did not accept connections on {addr} within {timeout:?}{log}")]
    BackendNotReady {
        /// The command line.
        command: String,
        /// Where it should listen.
        addr: std::net::SocketAddr,
        /// How long we waited.
        timeout: Duration,
        /// Its exit status and output, when it died.
        log: String,
    },
    /// A binary of the workspace could not be built or found.
    #[error("binary `{name}` not found at {path}: {why}")]
    MissingBinary {
        /// The binary's name.
        name: String,
        /// Where it was expected.
        path: PathBuf,
        /// What went wrong and the command that builds it.
        why: String,
    },
    /// An HTTP exchange with a test backend failed or made no sense.
    #[error("HTTP to {addr}: {why}")]
    Http {
        /// The peer.
        addr: std::net::SocketAddr,
        /// What went wrong.
        why: String,
    },
    /// File system or other I/O failure.
    #[error("{what}: {source}")]
    Io {
        /// What we were doing.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}
