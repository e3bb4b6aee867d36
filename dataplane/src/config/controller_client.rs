//! Controller mode: the dataplane side of the snapshot channel.
//!
//! The dataplane dials the controller and holds one bidirectional gRPC stream. It sends a
//! `Hello` (its id and the snapshot it serves), then for every snapshot the controller sends
//! it compiles and swaps it in with [`Store::apply`] and answers `Ack(version)`, or keeps
//! the last good table and answers `Nack(version, reasons)`. Traffic keeps being served
//! while the stream is down.
//!
//! Every controller replica serves snapshots, so a stream that ends because its replica went
//! away is redialed at once (through the controller Service, that reaches another replica),
//! and redials stay within a second for [`QUICK_REDIAL_FOR`] after that, and for as long as
//! this dataplane serves nothing; only a controller that stays unreachable longer than that
//! is redialed with exponential backoff (with jitter), up to [`Backoff::max`].
//!
//! With a state directory, every snapshot that went live is written to
//! `<state-dir>/snapshot.pb` (protobuf, written to a temporary file and renamed), and
//! [`restore`] serves it at start, so a restarted dataplane serves its last good routes even
//! when no controller is reachable.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prost::Message;
use sluice_proto::v1::snapshot_service_client::SnapshotServiceClient;
use sluice_proto::v1::{self, dataplane_message};
use tokio::sync::mpsc;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::config::store::Store;

/// File name of the persisted snapshot inside the state directory.
pub const SNAPSHOT_FILE: &str = "snapshot.pb";

/// Why the client could not be set up, or why one connection ended.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The controller URL is not valid.
    #[error("--controller {url}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// `--insecure` with a controller that is not on this machine.
    #[error(
        "--insecure refused: {0} is not a loopback address; snapshots carry TLS keys, so \
         plaintext is allowed only to localhost"
    )]
    NotLoopback(String),
    /// Neither certificates nor `--insecure`.
    #[error(
        "controller mode needs --tls-cert, --tls-key and --tls-ca (mutual TLS); --insecure \
         is allowed only for a loopback controller"
    )]
    TlsMissing,
    /// A certificate or key file could not be read.
    #[error("{path}: cannot read: {source}")]
    ReadTls {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Dialing the controller failed.
    #[error("connecting to the controller: {0}")]
    Connect(#[source] tonic::transport::Error),
    /// The controller refused or broke the stream.
    #[error("snapshot stream: {0}")]
    Stream(#[from] tonic::Status),
    /// The controller closed the stream.
    #[error("the controller closed the snapshot stream")]
    Closed,
    /// The persisted snapshot could not be read or decoded.
    #[error("{path}: {reason}")]
    Persisted {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Certificates for mutual TLS with the controller, as PEM bytes.
#[derive(Clone)]
pub struct ClientTls {
    /// CA bundle that the controller's certificate must chain to.
    pub ca: Vec<u8>,
    /// This dataplane's certificate chain.
    pub cert: Vec<u8>,
    /// This dataplane's private key.
    pub key: Vec<u8>,
    /// Name to verify the controller's certificate against; default: the URL's host.
    pub server_name: Option<String>,
    /// Files (CA, certificate, key) the PEM came from; when set they are read again before
    /// every dial, so rotated certificates (e.g. by cert-manager) are used without a restart.
    pub files: Option<[PathBuf; 3]>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // NB: never print the key.
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Reads the three PEM files (and remembers them for re-reading before every dial).
    pub fn from_files(
        ca: &Path,
        cert: &Path,
        key: &Path,
        server_name: Option<String>,
    ) -> Result<Self, ClientError> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|source| ClientError::ReadTls {
                path: p.to_path_buf(),
                source,
            })
        };
        Ok(Self {
            ca: read(ca)?,
            cert: read(cert)?,
            key: read(key)?,
            server_name,
            files: Some([ca.to_path_buf(), cert.to_path_buf(), key.to_path_buf()]),
        })
    }

    /// The current PEM: re-read from the files when there are any.
    fn fresh(&self) -> Result<Self, ClientError> {
        match &self.files {
            Some([ca, cert, key]) => Self::from_files(ca, cert, key, self.server_name.clone()),
            None => Ok(self.clone()),
        }
    }
}

/// Redial delays after failed attempts: `initial`, doubled after every failed attempt up to
/// `max`, each with up to 25% random jitter so a fleet of dataplanes does not redial in
/// lockstep. See [`run`] for when the delay is capped at a second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// First delay (default 100 ms).
    pub initial: Duration,
    /// Largest delay (default 10 s).
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
        }
    }
}

impl Backoff {
    /// The delay after `failures` consecutive failed attempts (1 = the first failure),
    /// without jitter.
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 1u32 << failures.saturating_sub(1).min(16);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// How to reach the controller.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The controller's gRPC URL, e.g. `https://sluice-controller.sluice.svc:18000`
    /// (`http://` only with `tls = None`). Several replicas' URLs may be given separated by
    /// commas: each redial tries the next one (every replica serves snapshots).
    pub url: String,
    /// Mutual TLS settings; `None` = plaintext, allowed only for a loopback controller
    /// (checked by [`ClientConfig::validate`]).
    pub tls: Option<ClientTls>,
    /// This dataplane's name in the controller's bookkeeping and status (e.g. pod name).
    pub dataplane_id: String,
    /// Where the last good snapshot is persisted; `None` = nowhere.
    pub state_dir: Option<PathBuf>,
    /// Redial delays.
    pub backoff: Backoff,
}

/// The host of an `http(s)://host:port` URL.
fn url_host(url: &str) -> Result<String, ClientError> {
    let invalid = |reason: &str| ClientError::InvalidUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: http::Uri = url.parse().map_err(|_| invalid("not a URL"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(invalid("the scheme must be http:// or https://")),
    }
    let host = uri.host().ok_or_else(|| invalid("no host"))?;
    if uri.port_u16().is_none() {
        return Err(invalid("no port"));
    }
    Ok(host.to_owned())
}

impl ClientConfig {
    /// Checks the URL and the security settings: plaintext only to a loopback controller.
    pub fn validate(&self) -> Result<(), ClientError> {
        if self.urls().is_empty() {
            return Err(ClientError::InvalidUrl {
                url: self.url.clone(),
                reason: "no URL".to_owned(),
            });
        }
        for one in self.split() {
            let host = url_host(&one.url)?;
            if one.tls.is_none() && !sluice_proto::is_loopback_host(&host) {
                return Err(ClientError::NotLoopback(host));
            }
        }
        Ok(())
    }

    /// The controller URLs (`url` split at commas).
    pub fn urls(&self) -> Vec<&str> {
        self.url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect()
    }

    /// One configuration per controller URL.
    fn split(&self) -> Vec<ClientConfig> {
        self.urls()
            .into_iter()
            .map(|u| ClientConfig {
                url: u.to_owned(),
                ..self.clone()
            })
            .collect()
    }

    fn endpoint(&self) -> Result<Endpoint, ClientError> {
        let host = url_host(&self.url)?;
        // With TLS the scheme must be https for tonic to wrap the connection.
        let url = match (&self.tls, self.url.strip_prefix("http://")) {
            (Some(_), Some(rest)) => format!("https://{rest}"),
            _ => self.url.clone(),
        };
        let mut endpoint = Endpoint::from_shared(url)
            .map_err(|e| ClientError::InvalidUrl {
                url: self.url.clone(),
                reason: e.to_string(),
            })?
            // NB: in-cluster, a TCP connect that takes a second is a SYN to a pod IP that is
            // gone (kube-proxy not updated yet): give up and redial, likely to a live replica.
            .connect_timeout(CONNECT_TIMEOUT)
            // A controller that vanished without closing (its node died) is noticed within
            // about 10 s.
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        if let Some(tls) = &self.tls {
            let tls = tls.fresh()?;
            let server_name = tls
                .server_name
                .clone()
                .unwrap_or_else(|| host.trim_matches(['[', ']']).to_owned());
            let config = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&tls.ca))
                .identity(Identity::from_pem(&tls.cert, &tls.key))
                .domain_name(server_name);
            endpoint = endpoint.tls_config(config).map_err(ClientError::Connect)?;
        }
        Ok(endpoint)
    }
}

/// Loads `<state_dir>/snapshot.pb` and serves it. Returns the version served, or `None`
/// when there is no persisted snapshot. A file that cannot be decoded, fails its hash check
/// or does not compile is an error (and nothing is served from it).
pub fn restore(store: &Store, state_dir: &Path) -> Result<Option<u64>, ClientError> {
    let path = state_dir.join(SNAPSHOT_FILE);
    let bad = |reason: String| ClientError::Persisted {
        path: path.clone(),
        reason,
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad(e.to_string())),
    };
    let mut snapshot =
        v1::Snapshot::decode(bytes.as_slice()).map_err(|e| bad(format!("not a snapshot: {e}")))?;
    verify_hash(&mut snapshot).map_err(bad)?;
    let version = snapshot.version;
    store
        .apply(snapshot, Vec::new())
        .map_err(|e| bad(format!("does not compile: {e}")))?;
    tracing::info!(version, path = %path.display(), "serving the persisted snapshot until the controller answers");
    Ok(Some(version))
}

/// Writes `snapshot` to `<state_dir>/snapshot.pb` atomically (temporary file, fsync, rename,
/// fsync of the directory).
pub fn persist(state_dir: &Path, snapshot: &v1::Snapshot) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(state_dir)?;
    let tmp = state_dir.join(format!(".{SNAPSHOT_FILE}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(&snapshot.encode_to_vec())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, state_dir.join(SNAPSHOT_FILE))?;
    // NB: the rename is durable (past a power loss, not only a crash) once the directory is.
    std::fs::File::open(state_dir)?.sync_all()
}

fn verify_hash(snapshot: &mut v1::Snapshot) -> Result<(), String> {
    let actual = sluice_proto::content_hash_of_sealed(snapshot);
    if actual == snapshot.hash {
        Ok(())
    } else {
        Err(format!(
            "hash mismatch: the snapshot says {} but its content hashes to {actual}",
            snapshot.hash
        ))
    }
}

/// The answer to one snapshot message.
fn handle(
    store: &Store,
    state_dir: Option<&Path>,
    msg: v1::ControllerMessage,
) -> dataplane_message::Kind {
    let Some(mut snapshot) = msg.snapshot else {
        return dataplane_message::Kind::Nack(v1::Nack {
            version: 0,
            hash: String::new(),
            reasons: vec!["message carries no snapshot".into()],
            reason: v1::NackReason::Invalid as i32,
        });
    };
    let (version, hash) = (snapshot.version, snapshot.hash.clone());
    let nack = |reasons: Vec<String>| {
        tracing::warn!(version, reasons = ?reasons, "snapshot rejected (NACK); the last good one keeps serving");
        dataplane_message::Kind::Nack(v1::Nack {
            version,
            hash: hash.clone(),
            reasons,
            reason: v1::NackReason::Invalid as i32,
        })
    };
    if let Err(reason) = verify_hash(&mut snapshot) {
        store.record_error(format!("snapshot v{version} rejected: {reason}"));
        return nack(vec![reason]);
    }
    if let Err(e) = store.apply(snapshot, msg.rejected_objects) {
        return nack(vec![e.to_string()]);
    }
    tracing::info!(version, %hash, "snapshot live");
    // NB: persisted from the store's copy, after the swap: no clone of the whole snapshot
    // before it is live.
    if let (Some(dir), Some(snapshot)) = (state_dir, store.snapshot())
        && let Err(e) = persist(dir, &snapshot)
    {
        // NB: still an ACK: the snapshot is being served; only a restart would lose it.
        tracing::warn!(dir = %dir.display(), error = %e, "cannot persist the snapshot");
    }
    dataplane_message::Kind::Ack(v1::Ack { version, hash })
}

/// Holds one stream until it ends. Returns whether at least one snapshot arrived (which
/// resets the redial backoff), with the error that ended the stream.
pub async fn run_once(
    config: &ClientConfig,
    store: &Arc<Store>,
    after_apply: fn(),
) -> (bool, ClientError) {
    let mut received = false;
    let err = match stream(config, store, after_apply, &mut received).await {
        Ok(()) => ClientError::Closed,
        Err(e) => e,
    };
    (received, err)
}

async fn stream(
    config: &ClientConfig,
    store: &Arc<Store>,
    after_apply: fn(),
    received: &mut bool,
) -> Result<(), ClientError> {
    let channel = config
        .endpoint()?
        .connect()
        .await
        .map_err(ClientError::Connect)?;
    let mut client = SnapshotServiceClient::new(channel)
        .max_decoding_message_size(sluice_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(sluice_proto::MAX_MESSAGE_BYTES);

    let (tx, mut rx) = mpsc::channel::<v1::DataplaneMessage>(4);
    let serving = store.state();
    let hello = dataplane_message::Kind::Hello(v1::Hello {
        dataplane_id: config.dataplane_id.clone(),
        version: serving.version,
        hash: serving.hash,
        // NB: deltas are not wired in yet (issue 43): full snapshots only.
        protocol: 0,
    });
    // NB: the channel was just created with room for 4; this cannot fail.
    let _ = tx.try_send(v1::DataplaneMessage { kind: Some(hello) });
    let outbound = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let mut inbound = client.stream(outbound).await?.into_inner();
    tracing::info!(url = %config.url, "connected to the controller");
    store.set_source_reachable(true);

    while let Some(msg) = inbound.message().await? {
        *received = true;
        let store = Arc::clone(store);
        let dir = config.state_dir.clone();
        // Compiling a large snapshot takes milliseconds; keep it off the reactor.
        let answer = tokio::task::spawn_blocking(move || {
            let answer = handle(&store, dir.as_deref(), msg);
            after_apply();
            answer
        })
        .await
        .map_err(|e| tonic::Status::internal(format!("applying the snapshot: {e}")))?;
        if tx
            .send(v1::DataplaneMessage { kind: Some(answer) })
            .await
            .is_err()
        {
            return Err(ClientError::Closed);
        }
    }
    Ok(())
}

/// `err` with its sources, e.g. `connecting to the controller: transport error: tcp
/// connect error: Connection refused (os error 111)`.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// A pseudo-random fraction in `[0, 1)` for jitter; needs no randomness source.
fn jitter_fraction() -> f64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    // NB: a multiplicative hash spreads the low-entropy nanos over the range.
    f64::from(nanos.wrapping_mul(2_654_435_761) % 1_000_000) / 1_000_000.0
}

/// How long a TCP connect to the controller may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest redial delay while quick redials apply (see [`run`]).
pub const QUICK_REDIAL_MAX: Duration = Duration::from_secs(1);
/// How long after the last stream that delivered a snapshot redials stay quick.
pub const QUICK_REDIAL_FOR: Duration = Duration::from_secs(10);
/// A stream that lasted this long after delivering a snapshot worked: when it ends (its
/// replica went away), the next dial follows at once.
const WORKING_STREAM: Duration = Duration::from_secs(1);
/// Largest random delay before redialing at once, so a fleet does not redial in lockstep.
const IMMEDIATE_JITTER: Duration = Duration::from_millis(50);

/// What to wait before the next dial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redial {
    /// Consecutive failed attempts (0 after a working stream).
    pub failures: u32,
    /// The delay, without jitter.
    pub delay: Duration,
}

/// The delay before the next dial, after an attempt that `received` a snapshot (or not) and
/// lasted `lasted`, with `failures` failed attempts before it, `since_working` since the
/// last stream that delivered a snapshot (or since the start), and whether this dataplane
/// serves anything (`serving`).
///
/// - A working stream ended (its replica went away or stepped down): redial at once; every
///   replica serves, so through the controller Service the next dial reaches another one.
/// - Failed attempts back off exponentially, but by at most [`QUICK_REDIAL_MAX`] within
///   [`QUICK_REDIAL_FOR`] of the last working stream (a replica is expected back within a
///   second: the Service stops sending dials to a dead pod, a restarted one syncs) and for
///   as long as the dataplane serves nothing (a new dataplane is ready within a second of
///   a controller becoming reachable).
/// - Only then, a controller unreachable for longer, the full backoff up to [`Backoff::max`].
pub fn next_redial(
    backoff: &Backoff,
    received: bool,
    lasted: Duration,
    failures: u32,
    since_working: Duration,
    serving: bool,
) -> Redial {
    if received && lasted >= WORKING_STREAM {
        return Redial {
            failures: 0,
            delay: Duration::ZERO,
        };
    }
    let failures = if received {
        1
    } else {
        failures.saturating_add(1)
    };
    let mut delay = backoff.delay(failures);
    if !serving || since_working < QUICK_REDIAL_FOR {
        delay = delay.min(QUICK_REDIAL_MAX);
    }
    Redial { failures, delay }
}

/// Dials the controller and holds the stream, redialing forever as [`next_redial`] says.
/// `after_apply` runs on the thread that applied each snapshot (the binary returns the
/// compile's transient memory to the OS there).
pub async fn run(config: ClientConfig, store: Arc<Store>, after_apply: fn()) {
    let replicas = config.split();
    let mut failures: u32 = 0;
    let mut last_working = Instant::now();
    for attempt in 0usize.. {
        let Some(config) = replicas.get(attempt % replicas.len().max(1)) else {
            tracing::error!(url = %config.url, "no controller URL");
            return;
        };
        let started = Instant::now();
        let (received, err) = run_once(config, &store, after_apply).await;
        store.set_source_reachable(false);
        if received {
            last_working = Instant::now();
        }
        let next = next_redial(
            &config.backoff,
            received,
            started.elapsed(),
            failures,
            last_working.elapsed(),
            store.ready(),
        );
        failures = next.failures;
        let delay = if next.delay.is_zero() {
            IMMEDIATE_JITTER.mul_f64(jitter_fraction())
        } else {
            next.delay.mul_f64(1.0 + 0.25 * jitter_fraction())
        };
        if next.failures == 0 {
            tracing::info!(error = %error_chain(&err), retry_in = ?delay, "controller stream ended; redialing (another replica serves)");
        } else {
            tracing::warn!(error = %error_chain(&err), retry_in = ?delay, failures = next.failures, "controller stream down; serving the last good snapshot");
        }
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn snapshot(version: u64, upstream: &str) -> v1::Snapshot {
        sluice_proto::seal(
            v1::Snapshot {
                routes: vec![v1::Route {
                    id: "default/r/rule1".into(),
                    paths: vec!["/a".into()],
                    backends: vec![v1::Backend {
                        upstream_id: upstream.into(),
                        weight: 100,
                        plugins: Vec::new(),
                    }],
                    ..Default::default()
                }],
                upstreams: vec![v1::Upstream {
                    id: "default/svc:80".into(),
                    endpoints: vec![v1::Endpoint {
                        host: "127.0.0.1".into(),
                        port: 1,
                        weight: 1,
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            },
            version,
        )
    }

    fn config(url: &str, tls: bool) -> ClientConfig {
        ClientConfig {
            url: url.into(),
            tls: tls.then(|| ClientTls {
                ca: Vec::new(),
                cert: Vec::new(),
                key: Vec::new(),
                server_name: None,
                files: None,
            }),
            dataplane_id: "dp".into(),
            state_dir: None,
            backoff: Backoff::default(),
        }
    }

    #[test]
    fn plaintext_only_to_loopback() {
        assert!(config("http://127.0.0.1:18000", false).validate().is_ok());
        assert!(config("http://localhost:18000", false).validate().is_ok());
        assert!(config("http://[::1]:18000", false).validate().is_ok());
        let err = config("http://10.0.0.5:18000", false)
            .validate()
            .unwrap_err();
        assert!(
            err.to_string().contains("10.0.0.5 is not a loopback"),
            "{err}"
        );
        assert!(
            config("https://ctl.sluice.svc:18000", true)
                .validate()
                .is_ok()
        );
        let err = config("ctl:18000", true).validate().unwrap_err();
        assert!(err.to_string().contains("--controller ctl:18000"), "{err}");
        let err = config("https://ctl", true).validate().unwrap_err();
        assert!(err.to_string().contains("no port"), "{err}");
    }

    #[test]
    fn several_replicas_are_each_checked() {
        let c = config("http://127.0.0.1:1, http://127.0.0.1:2", false);
        assert!(c.validate().is_ok());
        assert_eq!(c.urls(), ["http://127.0.0.1:1", "http://127.0.0.1:2"]);
        let err = config("http://127.0.0.1:1,http://10.0.0.5:2", false)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("10.0.0.5"), "{err}");
        assert!(config(",", false).validate().is_err());
    }

    #[test]
    fn redials_are_immediate_after_a_working_stream_and_quick_while_a_replica_is_expected() {
        let b = Backoff::default();
        let secs = Duration::from_secs;
        // A stream that served for a while ended: the next dial follows at once.
        let r = next_redial(&b, true, secs(60), 7, secs(0), true);
        assert_eq!(
            r,
            Redial {
                failures: 0,
                delay: Duration::ZERO
            }
        );
        // Then failures: 100 ms doubling, capped at a second while quick redials apply.
        let delays: Vec<Duration> = (0..8)
            .scan(0, |failures, _| {
                let r = next_redial(&b, false, Duration::ZERO, *failures, secs(2), true);
                *failures = r.failures;
                Some(r.delay)
            })
            .collect();
        assert_eq!(
            delays,
            [100, 200, 400, 800, 1000, 1000, 1000, 1000].map(Duration::from_millis)
        );
        // Unreachable for longer: the full backoff, unless the dataplane serves nothing.
        let r = next_redial(&b, false, Duration::ZERO, 7, QUICK_REDIAL_FOR, true);
        assert_eq!(r.delay, secs(10));
        let r = next_redial(&b, false, Duration::ZERO, 7, secs(3600), false);
        assert_eq!(
            r.delay, QUICK_REDIAL_MAX,
            "a dataplane that serves nothing keeps trying"
        );
        // A stream that delivered a snapshot and ended at once is a failure, not a loop.
        let r = next_redial(&b, true, Duration::from_millis(5), 3, Duration::ZERO, true);
        assert_eq!(
            r,
            Redial {
                failures: 1,
                delay: Duration::from_millis(100)
            }
        );
    }

    #[test]
    fn backoff_doubles_up_to_max() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(200));
        assert_eq!(b.delay(4), Duration::from_millis(800));
        assert_eq!(b.delay(5), Duration::from_secs(1));
        assert_eq!(b.delay(500), Duration::from_secs(1));
        let j = jitter_fraction();
        assert!((0.0..1.0).contains(&j));
    }

    #[test]
    fn good_snapshot_is_acked_persisted_and_restored() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new().unwrap();
        let msg = v1::ControllerMessage {
            snapshot: Some(snapshot(7, "default/svc:80")),
            rejected_objects: vec!["ApisixRoute default/bad: InvalidSpec".into()],
            delta: None,
        };
        let answer = handle(&store, Some(dir.path()), msg);
        assert!(
            matches!(&answer, dataplane_message::Kind::Ack(a) if a.version == 7),
            "{answer:?}"
        );
        assert_eq!(store.state().version, 7);
        assert_eq!(store.state().rejected_objects.len(), 1);

        let fresh = Store::new().unwrap();
        assert_eq!(restore(&fresh, dir.path()).unwrap(), Some(7));
        assert_eq!(fresh.state().version, 7);
        assert_eq!(fresh.state().routes, 1);
    }

    #[test]
    fn bad_snapshot_is_nacked_and_not_persisted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new().unwrap();
        let good = v1::ControllerMessage {
            snapshot: Some(snapshot(1, "default/svc:80")),
            rejected_objects: Vec::new(),
            delta: None,
        };
        assert!(matches!(
            handle(&store, Some(dir.path()), good),
            dataplane_message::Kind::Ack(_)
        ));
        let bad = v1::ControllerMessage {
            snapshot: Some(snapshot(2, "default/missing:80")),
            rejected_objects: Vec::new(),
            delta: None,
        };
        let answer = handle(&store, Some(dir.path()), bad);
        let dataplane_message::Kind::Nack(nack) = answer else {
            panic!("expected a NACK, got {answer:?}");
        };
        assert_eq!(nack.version, 2);
        assert!(
            nack.reasons[0].contains("unknown upstream `default/missing:80`"),
            "{:?}",
            nack.reasons
        );
        // The last good snapshot keeps serving and stays on disk.
        assert_eq!(store.state().version, 1);
        let fresh = Store::new().unwrap();
        assert_eq!(restore(&fresh, dir.path()).unwrap(), Some(1));
    }

    #[test]
    fn tampered_snapshot_is_nacked() {
        let store = Store::new().unwrap();
        let mut snap = snapshot(3, "default/svc:80");
        snap.routes[0].paths = vec!["/other".into()];
        let answer = handle(
            &store,
            None,
            v1::ControllerMessage {
                snapshot: Some(snap),
                rejected_objects: Vec::new(),
                delta: None,
            },
        );
        let dataplane_message::Kind::Nack(nack) = answer else {
            panic!("expected a NACK, got {answer:?}");
        };
        assert!(
            nack.reasons[0].contains("hash mismatch"),
            "{:?}",
            nack.reasons
        );
        assert_eq!(store.state().version, 0);
    }

    #[test]
    fn restore_without_file_serves_nothing_and_garbage_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new().unwrap();
        assert_eq!(restore(&store, dir.path()).unwrap(), None);
        std::fs::write(dir.path().join(SNAPSHOT_FILE), b"\xff\xff\xff garbage").unwrap();
        let err = restore(&store, dir.path()).unwrap_err();
        assert!(
            err.to_string().contains("snapshot.pb: not a snapshot"),
            "{err}"
        );
        assert!(!store.ready());
    }
}
