//! `sluice-bench conns`: resource bounds under many open connections (issue 16).
//!
//! ```text
//!   CPU 1                                   CPU 0
//!   sluice-bench: N sockets, 64 opening  ──▶  proxy (nginx | sluice), one worker  ──▶  nginx origin :1980
//!   at a time, then held open                  RSS and open fds read from /proc
//! ```
//!
//! For nginx and then sluice, in the same run, two proxy processes each:
//!
//! - **idle keep-alive**: N connections that each completed one `GET /hello` and then sit
//!   idle in keep-alive. The keep-alive timeout is long (`--keepalive-timeout`, 300 s), so
//!   none is closed while they are counted.
//! - **half-sent heads**: N connections that each sent [`HALF_HEAD`], a request head
//!   without its last line end, and nothing more. The header timeout is short
//!   (`--header-timeout`, 5 s); after it (plus [`GRACE`]) every connection must have been
//!   closed by the proxy.
//!
//! NB: two processes, because Sluice has one timeout for both: hyper's header-read timer
//! (`--header-timeout`) also runs while an HTTP/1.1 connection waits for its next request,
//! so a short header timeout closes idle keep-alive connections too. Each process gets one
//! value on both sides: nginx `client_header_timeout` and `keepalive_timeout`, Sluice
//! `--header-timeout`.
//!
//! Per process: RSS at start (baseline), with the N connections open, after they are closed
//! (and, for the heads, after the header timeout); `--rounds` times in the same process, so
//! that memory an allocator keeps after a round and reuses in the next can be told from
//! memory that grows round after round. Then [`TRAFFIC`] of ordinary keep-alive requests,
//! and RSS once more: memory kept only because the worker went quiet is given back then.
//! Bounded means: round N's figures no higher than round 1's, and final − baseline small
//! after that traffic.

/// Wait after the close before RSS is read (a sluice worker trims its heap within ~11 s).
const AFTER_CLOSE: Duration = Duration::from_secs(12);

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{ErrorKind, Read};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::BenchError;
use crate::machine::{self, MachineInfo};
use crate::process::{ProcessGuard, TempDir};
use crate::procfs::{self, ProcMemory};
use crate::runner::{Only, PATH, UPSTREAM_PORT, allowed_cpus, pick_cpus, pinned, require};
use crate::{nginx, probe, sluice};

/// Version of the JSON layout of [`ConnsResult`]; bump on incompatible changes.
pub const SCHEMA_VERSION: u32 = 1;

/// The request each idle keep-alive connection completes before it goes idle.
pub const REQUEST: &[u8] = b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

/// What each half-sent connection sends: a request head cut inside a header value, without
/// the line end and the empty line that would complete it.
pub const HALF_HEAD: &[u8] = b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: ";

/// Time after the header timeout by which every half-sent connection must be closed (Sluice's
/// timer fires up to 100 ms late, both proxies need a moment to close 10,000 sockets).
pub const GRACE: Duration = Duration::from_secs(2);

/// Length of the traffic after the last round (see [`Phase::after_traffic`]).
pub const TRAFFIC: Duration = Duration::from_secs(3);
/// Keep-alive clients of that traffic (as many as wrk's in the proxy benchmark).
pub const TRAFFIC_CLIENTS: u32 = 64;

/// Descriptors kept beyond the N connections, for the bench, the proxy's upstream
/// connections, listeners and logs.
const FD_MARGIN: u32 = 1024;

/// Options of `sluice-bench conns`.
#[derive(Debug, Clone)]
pub struct ConnsOptions {
    /// Connections held open at once (N).
    pub count: u32,
    /// Connections being opened at the same time.
    pub concurrency: u32,
    /// The short timeout of the half-sent-heads process (nginx `client_header_timeout` and
    /// `keepalive_timeout`, Sluice `--header-timeout`).
    pub header_timeout: Duration,
    /// The long timeout of the idle keep-alive process (the same three settings).
    pub keepalive_timeout: Duration,
    /// Open-measure-close rounds in each process.
    pub rounds: u32,
    /// A prebuilt dataplane binary; `None` builds it with cargo.
    pub sluice_bin: Option<PathBuf>,
    /// The workspace root (scenario YAML, git, build).
    pub workspace: PathBuf,
    /// Where result files go: history outside the clone, `latest-*` copies in
    /// `bench/results` ([`crate::results`]).
    pub results: crate::results::ResultsDirs,
    /// How long a proxy may take to serve its first correct response.
    pub ready_timeout: Duration,
    /// Measure only one proxy.
    pub only: Option<Only>,
    /// Extra dataplane flags, after the command's own.
    pub sluice_args: Vec<String>,
}

/// Which kind of connection a phase holds open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Load {
    /// One complete request and response, then idle in keep-alive.
    IdleKeepAlive,
    /// [`HALF_HEAD`] sent, nothing more.
    HalfHead,
}

impl Load {
    fn title(self) -> &'static str {
        match self {
            Load::IdleKeepAlive => "idle keep-alive connections",
            Load::HalfHead => "half-sent request heads",
        }
    }
}

/// Memory and descriptors of a proxy's process tree at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the proxy answered its first request.
    pub at_s: f64,
    /// `VmRSS` summed over the tree (nginx: master + worker), KiB.
    pub rss_kib: u64,
    /// `VmHWM` summed over the tree, KiB.
    pub hwm_kib: u64,
    /// Open descriptors summed over the tree.
    pub fds: u64,
    /// Each process of the tree, root first.
    pub processes: Vec<ProcMemory>,
}

impl Sample {
    /// Sums the processes of a tree.
    pub fn from_processes(at_s: f64, processes: Vec<ProcMemory>) -> Self {
        Sample {
            at_s,
            rss_kib: processes.iter().map(|p| p.rss_kib).sum(),
            hwm_kib: processes.iter().map(|p| p.hwm_kib).sum(),
            fds: processes.iter().map(|p| p.fds).sum(),
            processes,
        }
    }
}

/// The state of the half-sent connections some time after the last head was sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimeoutCheck {
    /// Seconds after the last head was sent.
    pub waited_s: f64,
    /// Connections the proxy had closed (end of stream or reset).
    pub closed: u64,
    /// Connections still open.
    pub still_open: u64,
    /// Status codes of the responses the proxy sent before closing (e.g. 408), by count.
    pub statuses: BTreeMap<u16, u64>,
    /// The proxy at that moment.
    pub sample: Sample,
}

/// One round: open N connections, measure, (wait for the header timeout,) close them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Round {
    /// Connections that completed their opening (request and response, or head sent).
    pub opened: u64,
    /// Connections that could not be opened (connect, write or response failed).
    pub failed: u64,
    /// The first failure, if any.
    pub first_error: Option<String>,
    /// Seconds it took to open them.
    pub open_s: f64,
    /// The proxy with the connections open.
    pub loaded: Sample,
    /// Of `opened`, the connections still open just after `loaded` was taken.
    pub open_at_sample: u64,
    /// Half-sent heads: after the header timeout plus [`GRACE`], and once more a header
    /// timeout later if some were still open then.
    pub timeout_checks: Vec<TimeoutCheck>,
    /// Whether the proxy's open descriptors came back to where they were before the round
    /// within 30 s of the connections being closed.
    pub fds_settled: bool,
    /// The proxy after the connections were closed, its descriptors had come back, it had
    /// served one `GET /hello` and one more second had passed.
    pub after_close: Sample,
}

/// One proxy process and the rounds it went through.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// The kind of connection held open.
    pub load: Load,
    /// The proxy's timeout settings in this process, as configured.
    pub settings: String,
    /// The proxy once it served its first request, before any load.
    pub baseline: Sample,
    /// The rounds, in order.
    pub rounds: Vec<Round>,
    /// The proxy after the rounds, after [`TRAFFIC`] of keep-alive requests from
    /// [`TRAFFIC_CLIENTS`] clients and one second more: whether memory kept after the close is
    /// given back once the worker is busy again.
    pub after_traffic: Option<Sample>,
    /// Requests answered 200 during that traffic.
    pub traffic_requests: u64,
}

impl Phase {
    /// Memory per held connection in the first round: (RSS with them − baseline) ÷ opened,
    /// in bytes.
    pub fn bytes_per_connection(&self) -> Option<f64> {
        let r = self.rounds.first()?;
        (r.opened > 0).then(|| {
            (r.loaded.rss_kib as f64 - self.baseline.rss_kib as f64) * 1024.0 / r.opened as f64
        })
    }

    /// The proxy after the last round.
    pub fn final_sample(&self) -> Option<&Sample> {
        self.rounds.last().map(|r| &r.after_close)
    }

    /// Final − baseline RSS in KiB: what the proxy kept after everything was closed.
    pub fn retained_kib(&self) -> Option<i64> {
        self.final_sample()
            .map(|f| f.rss_kib as i64 - self.baseline.rss_kib as i64)
    }

    /// RSS after the traffic − baseline, in KiB.
    pub fn after_traffic_kib(&self) -> Option<i64> {
        self.after_traffic
            .as_ref()
            .map(|f| f.rss_kib as i64 - self.baseline.rss_kib as i64)
    }

    /// Warnings a reader must see: connections that did not stay open while they were
    /// counted, half-sent connections the proxy did not close, failures to open, descriptors
    /// that did not come back.
    pub fn warnings(&self, count: u32) -> Vec<String> {
        let mut w = Vec::new();
        for (i, r) in self.rounds.iter().enumerate() {
            let round = i + 1;
            if r.opened < u64::from(count) {
                w.push(format!(
                    "round {round}: only {} of {count} connections opened ({} failed; first: {})",
                    r.opened,
                    r.failed,
                    r.first_error.as_deref().unwrap_or("-")
                ));
            }
            if r.open_at_sample < r.opened {
                w.push(format!(
                    "round {round}: {} of {} connections were already closed by the proxy when \
                     its RSS was read",
                    r.opened - r.open_at_sample,
                    r.opened
                ));
            }
            if let Some(last) = r.timeout_checks.last()
                && last.still_open > 0
            {
                w.push(format!(
                    "round {round}: UNBOUNDED: {} half-sent connections still open {:.1} s after \
                     the last head (header timeout not enforced)",
                    last.still_open, last.waited_s
                ));
            }
            if !r.fds_settled {
                w.push(format!(
                    "round {round}: the proxy's open descriptors did not come back within 30 s \
                     of the close ({} after, {} before the round)",
                    r.after_close.fds,
                    if i == 0 {
                        self.baseline.fds
                    } else {
                        self.rounds[i - 1].after_close.fds
                    }
                ));
            }
        }
        w
    }
}

/// One proxy's two processes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnsRun {
    /// `nginx` or `sluice`.
    pub proxy: String,
    /// Why the proxy (or one of its phases) was not measured.
    pub skipped: Vec<String>,
    /// The idle keep-alive process.
    pub idle: Option<Phase>,
    /// The half-sent heads process.
    pub heads: Option<Phase>,
}

impl ConnsRun {
    fn phase(&self, load: Load) -> Option<&Phase> {
        match load {
            Load::IdleKeepAlive => self.idle.as_ref(),
            Load::HalfHead => self.heads.as_ref(),
        }
    }
}

/// How the connections were made and the proxies configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnsParams {
    /// Connections held open at once (N).
    pub count: u32,
    /// Connections opened at the same time.
    pub concurrency: u32,
    /// Rounds per process.
    pub rounds: u32,
    /// The heads process's timeout, seconds.
    pub header_timeout_s: f64,
    /// The idle process's timeout, seconds.
    pub keepalive_timeout_s: f64,
    /// [`GRACE`], seconds.
    pub grace_s: f64,
    /// CPU of the proxies and the origin.
    pub proxy_cpu: Option<usize>,
    /// CPU of sluice-bench (the clients).
    pub client_cpu: Option<usize>,
    /// sluice-bench's (and so sluice's) soft RLIMIT_NOFILE during the run.
    pub nofile: u64,
    /// Every dataplane flag after the standalone config and listeners, as in the heads
    /// process (the idle process has `--header-timeout` = `keepalive_timeout_s`).
    pub sluice_flags: Vec<String>,
    /// Extra flags given with `--sluice-arg` (then no `latest-*` copy is written).
    pub sluice_args: Vec<String>,
}

/// One `sluice-bench conns` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnsResult {
    /// [`SCHEMA_VERSION`] at the time of writing.
    pub schema_version: u32,
    /// Start of the run, UTC, `YYYYMMDDTHHMMSSZ`.
    pub timestamp: String,
    /// Where it ran (`wrk_version` is not used by this command).
    pub machine: MachineInfo,
    /// `sluice-dataplane --version`.
    pub sluice_version: String,
    /// How it ran.
    pub params: ConnsParams,
    /// nginx, then sluice.
    pub runs: Vec<ConnsRun>,
}

/// Whether `buf` holds a whole HTTP/1.1 response: `None` while it is incomplete, else its
/// status, or why it cannot be used on a keep-alive connection.
pub fn complete_response(buf: &[u8]) -> Option<Result<u16, String>> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = match status_line.split_whitespace().nth(1).map(str::parse::<u16>) {
        Some(Ok(s)) if status_line.starts_with("HTTP/1.") => s,
        _ => return Some(Err(format!("bad status line {status_line:?}"))),
    };
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse::<usize>().ok();
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return buf[end + 4..].ends_with(b"0\r\n\r\n").then_some(Ok(status));
        } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close") {
            return Some(Err(format!("{status} with Connection: close")));
        }
    }
    match length {
        Some(n) => (buf.len() >= end + 4 + n).then_some(Ok(status)),
        None => Some(Err(format!("{status} without Content-Length"))),
    }
}

/// The status code of a response that starts `bytes`, if it does.
pub fn status_of(bytes: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(bytes.get(..bytes.len().min(16))?).ok()?;
    let rest = text.strip_prefix("HTTP/1.")?;
    rest.get(2..5)?.parse().ok()
}

/// What a held connection looks like from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    /// Nothing received, not closed.
    Open,
    /// The proxy sent something (a response starting with this status, if any) and has not
    /// closed yet.
    Answered(Option<u16>),
    /// The proxy closed (end of stream or reset), after sending a response with this status,
    /// if any.
    Closed(Option<u16>),
}

/// Reads what a non-blocking socket has without waiting, to tell an open connection from one
/// the proxy closed.
pub fn peer_state(stream: &mut impl Read) -> PeerState {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return PeerState::Closed(status_of(&got)),
            Ok(n) => {
                if got.len() < 4096 {
                    got.extend_from_slice(&buf[..n]);
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                return if got.is_empty() {
                    PeerState::Open
                } else {
                    PeerState::Answered(status_of(&got))
                };
            }
            // Reset by the proxy.
            Err(_) => return PeerState::Closed(status_of(&got)),
        }
    }
}

/// Connections that completed their opening, and what happened to the others.
pub(crate) struct Opened {
    pub(crate) streams: Vec<std::net::TcpStream>,
    pub(crate) failed: u64,
    pub(crate) first_error: Option<String>,
    pub(crate) secs: f64,
    /// When the last one finished opening.
    done: Instant,
}

/// Connects to `addr` and does `load`'s opening; the stream comes back as a non-blocking
/// std socket, out of tokio's reactor.
async fn open_one(addr: SocketAddr, load: Load) -> std::io::Result<std::net::TcpStream> {
    let mut attempt = 0u32;
    let mut stream = loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(s) => break s,
            // NB: a full accept queue or a momentary lack of ports; try again shortly.
            Err(_) if attempt < 3 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
            }
            Err(e) => return Err(e),
        }
    };
    match load {
        Load::HalfHead => stream.write_all(HALF_HEAD).await?,
        Load::IdleKeepAlive => {
            stream.write_all(REQUEST).await?;
            let mut buf = Vec::with_capacity(512);
            loop {
                if stream.read_buf(&mut buf).await? == 0 {
                    return Err(std::io::Error::other("closed before a full response"));
                }
                match complete_response(&buf) {
                    None => continue,
                    Some(Ok(200)) => break,
                    Some(Ok(status)) => {
                        return Err(std::io::Error::other(format!("answered {status}")));
                    }
                    Some(Err(e)) => return Err(std::io::Error::other(e)),
                }
            }
        }
    }
    stream.into_std()
}

/// Opens `count` connections of kind `load`, `concurrency` at a time.
pub(crate) fn open_all(
    addr: SocketAddr,
    load: Load,
    count: u32,
    concurrency: u32,
) -> Result<Opened, BenchError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::Usage(format!("tokio runtime: {e}")))?;
    let started = Instant::now();
    let next = Arc::new(AtomicU32::new(0));
    let results = rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..concurrency.min(count).max(1) {
            let next = Arc::clone(&next);
            tasks.push(tokio::spawn(async move {
                let (mut streams, mut failed, mut first_error) = (Vec::new(), 0u64, None);
                while next.fetch_add(1, Ordering::Relaxed) < count {
                    match tokio::time::timeout(Duration::from_secs(10), open_one(addr, load)).await
                    {
                        Ok(Ok(s)) => streams.push(s),
                        Ok(Err(e)) => {
                            failed += 1;
                            first_error.get_or_insert_with(|| e.to_string());
                        }
                        Err(_) => {
                            failed += 1;
                            first_error.get_or_insert_with(|| "no answer in 10 s".to_owned());
                        }
                    }
                }
                (streams, failed, first_error)
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.push(t.await);
        }
        all
    });
    let mut opened = Opened {
        streams: Vec::with_capacity(count as usize),
        failed: 0,
        first_error: None,
        secs: started.elapsed().as_secs_f64(),
        done: Instant::now(),
    };
    for r in results {
        let (streams, failed, first_error) =
            r.map_err(|e| BenchError::Usage(format!("client task failed: {e}")))?;
        opened.streams.extend(streams);
        opened.failed += failed;
        if opened.first_error.is_none() {
            opened.first_error = first_error;
        }
    }
    Ok(opened)
}

/// Keep-alive `GET /hello` from `clients` connections for `duration`, one request at a time
/// on each; returns the requests answered 200. A connection that fails is opened again.
fn traffic(addr: SocketAddr, clients: u32, duration: Duration) -> Result<u64, BenchError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::Usage(format!("tokio runtime: {e}")))?;
    let deadline = tokio::time::Instant::now() + duration;
    let done = rt.block_on(async move {
        let mut tasks = Vec::new();
        for _ in 0..clients {
            tasks.push(tokio::spawn(async move {
                let mut ok = 0u64;
                while tokio::time::Instant::now() < deadline {
                    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let mut buf = Vec::with_capacity(512);
                    'requests: while tokio::time::Instant::now() < deadline {
                        if stream.write_all(REQUEST).await.is_err() {
                            break;
                        }
                        buf.clear();
                        loop {
                            match stream.read_buf(&mut buf).await {
                                Ok(n) if n > 0 => {}
                                _ => break 'requests,
                            }
                            match complete_response(&buf) {
                                None => continue,
                                Some(Ok(200)) => {
                                    ok += 1;
                                    break;
                                }
                                Some(_) => break 'requests,
                            }
                        }
                    }
                }
                ok
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap_or(0);
        }
        total
    });
    Ok(done)
}

/// Counts the held connections by [`PeerState`]: (open, closed, statuses seen).
fn census(streams: &mut [std::net::TcpStream]) -> (u64, u64, BTreeMap<u16, u64>) {
    let (mut open, mut closed, mut statuses) = (0, 0, BTreeMap::new());
    for s in streams.iter_mut() {
        let status = match peer_state(s) {
            PeerState::Open => {
                open += 1;
                None
            }
            PeerState::Answered(status) => {
                open += 1;
                status
            }
            PeerState::Closed(status) => {
                closed += 1;
                status
            }
        };
        if let Some(code) = status {
            *statuses.entry(code).or_insert(0) += 1;
        }
    }
    (open, closed, statuses)
}

/// A proxy under measurement: its process, port and start time.
struct Proxy {
    guard: ProcessGuard,
    port: u16,
    ready_at: Instant,
}

impl Proxy {
    fn sample(&self) -> Sample {
        Sample::from_processes(
            self.ready_at.elapsed().as_secs_f64(),
            procfs::tree_memory(self.guard.pid()),
        )
    }

    fn fds(&self) -> u64 {
        procfs::tree_memory(self.guard.pid())
            .iter()
            .map(|p| p.fds)
            .sum()
    }
}

/// Everything fixed for the whole run.
struct Ctx<'a> {
    opts: &'a ConnsOptions,
    nginx: PathBuf,
    proxy_cpu: Option<usize>,
}

impl Ctx<'_> {
    fn wait_ready(&self, mut guard: ProcessGuard, port: u16) -> Result<Proxy, String> {
        let ready = probe::wait_for_hello(port, PATH, self.opts.ready_timeout, || {
            match guard.try_exit_status() {
                Some(status) => Err(format!("exited with {status}")),
                None => Ok(()),
            }
        });
        match ready {
            Ok(()) => Ok(Proxy {
                guard,
                port,
                ready_at: Instant::now(),
            }),
            Err(detail) => Err(format!(
                "{} not ready: {detail}; last log lines: {}",
                guard.name(),
                guard.log_tail(8).replace('\n', " ⏎ ")
            )),
        }
    }

    fn start_nginx(&self, dir: &TempDir, timeout: Duration) -> Result<Proxy, String> {
        let port = probe::free_port().map_err(|e| format!("no free port: {e}"))?;
        let conf = nginx::conns_proxy_conf(
            dir.path(),
            port,
            UPSTREAM_PORT,
            self.opts.count,
            timeout,
            timeout,
        );
        std::fs::write(dir.path().join("nginx.conf"), conf).map_err(|e| e.to_string())?;
        let cmd = pinned(self.proxy_cpu, &self.nginx, &nginx::args(dir.path()));
        let guard = ProcessGuard::spawn("proxy nginx", cmd, &dir.path().join("stdout.log"))
            .map_err(|e| e.to_string())?;
        self.wait_ready(guard, port)
    }

    fn start_sluice(&self, bin: &Path, dir: &TempDir, timeout: Duration) -> Result<Proxy, String> {
        let port = probe::free_port().map_err(|e| format!("no free port: {e}"))?;
        let admin = probe::free_port().map_err(|e| format!("no free port: {e}"))?;
        let config = sluice::scenario_config(&self.opts.workspace, 1);
        let mut args = sluice::args(&config, port, admin);
        args.extend(sluice_flags(self.opts, timeout));
        let cmd = pinned(self.proxy_cpu, bin, &args);
        let guard = ProcessGuard::spawn("sluice", cmd, &dir.path().join("sluice.log"))
            .map_err(|e| e.to_string())?;
        self.wait_ready(guard, port)
    }

    /// Baseline, then the rounds, on a proxy just started.
    fn measure(&self, proxy: &Proxy, load: Load, settings: String) -> Result<Phase, BenchError> {
        let opts = self.opts;
        let name = proxy.guard.name().to_owned();
        std::thread::sleep(Duration::from_secs(1));
        let baseline = proxy.sample();
        let mut rounds: Vec<Round> = Vec::new();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, proxy.port));
        for round in 1..=opts.rounds {
            let fds_before = proxy.fds();
            eprintln!(
                "sluice-bench conns: {name}: round {round}: opening {} {}",
                opts.count,
                load.title()
            );
            let mut opened = open_all(addr, load, opts.count, opts.concurrency)?;
            // Let the proxy read what was sent last, and Sluice park the idle connections
            // (2 s quiet after their request) and trim its heap (checked once a second).
            std::thread::sleep(Duration::from_millis(3500));
            let loaded = proxy.sample();
            let (open_at_sample, _, _) = census(&mut opened.streams);
            eprintln!(
                "sluice-bench conns: {name}: {} open ({} failed) in {:.1} s, RSS {} KiB (baseline {} KiB), {open_at_sample} still open",
                opened.streams.len(),
                opened.failed,
                opened.secs,
                loaded.rss_kib,
                baseline.rss_kib
            );
            let mut timeout_checks = Vec::new();
            if load == Load::HalfHead {
                for wait in [opts.header_timeout + GRACE, opts.header_timeout * 2 + GRACE] {
                    let until = opened.done + wait;
                    std::thread::sleep(until.saturating_duration_since(Instant::now()));
                    let sample = proxy.sample();
                    let (still_open, closed, statuses) = census(&mut opened.streams);
                    eprintln!(
                        "sluice-bench conns: {name}: {:.1} s after the last head: {closed} closed by the proxy, {still_open} open, RSS {} KiB",
                        opened.done.elapsed().as_secs_f64(),
                        sample.rss_kib
                    );
                    timeout_checks.push(TimeoutCheck {
                        waited_s: opened.done.elapsed().as_secs_f64(),
                        closed,
                        still_open,
                        statuses,
                        sample,
                    });
                    if still_open == 0 {
                        break;
                    }
                }
            }
            let held = opened.streams.len() as u64;
            drop(std::mem::take(&mut opened.streams));
            let fds_settled = settle_fds(proxy, fds_before + u64::from(opts.concurrency) + 16);
            // NB: one request, as live traffic would make, so a worker whose allocator frees
            // lazily on its next allocation gets the chance to.
            let _ = probe::http_get(proxy.port, PATH, Duration::from_secs(2));
            // NB: a sluice worker returns freed memory to the OS within about 11 s of its
            // connections falling (listener/server.rs `spawn_idle_trim`); nginx frees at once.
            std::thread::sleep(AFTER_CLOSE);
            let after_close = proxy.sample();
            eprintln!(
                "sluice-bench conns: {name}: closed; RSS {} KiB, {} fds",
                after_close.rss_kib, after_close.fds
            );
            rounds.push(Round {
                opened: held,
                failed: opened.failed,
                first_error: opened.first_error,
                open_s: opened.secs,
                loaded,
                open_at_sample,
                timeout_checks,
                fds_settled,
                after_close,
            });
        }
        eprintln!("sluice-bench conns: {name}: {TRAFFIC:?} of traffic");
        let traffic_requests = traffic(addr, TRAFFIC_CLIENTS, TRAFFIC)?;
        std::thread::sleep(Duration::from_secs(1));
        let after_traffic = proxy.sample();
        eprintln!(
            "sluice-bench conns: {name}: after {traffic_requests} requests: RSS {} KiB",
            after_traffic.rss_kib
        );
        Ok(Phase {
            load,
            settings,
            baseline,
            rounds,
            after_traffic: Some(after_traffic),
            traffic_requests,
        })
    }
}

/// Waits up to 30 s for the proxy's open descriptors to fall to `target` or below; false
/// if they did not.
fn settle_fds(proxy: &Proxy, target: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if proxy.fds() <= target {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// The dataplane flags of this command after the standalone config and listeners: room for
/// N connections, the phase's timeout, and no io_uring.
pub fn sluice_flags(opts: &ConnsOptions, timeout: Duration) -> Vec<String> {
    let mut flags = vec![
        "--max-connections".to_owned(),
        (opts.count + FD_MARGIN).to_string(),
        "--header-timeout".to_owned(),
        format!("{}ms", timeout.as_millis()),
    ];
    // NB: epoll only, as nginx: batched writes with one send(2) each instead of an io_uring
    // submission, so no ring's memory is in the figures; unless the extra flags choose.
    if !opts
        .sluice_args
        .iter()
        .any(|a| a == "--write-batching" || a.starts_with("--write-batching="))
    {
        flags.extend(["--write-batching".to_owned(), "send".to_owned()]);
    }
    flags.extend(opts.sluice_args.iter().cloned());
    flags
}

/// Raises this process's soft RLIMIT_NOFILE (inherited by sluice) so that `need` descriptors
/// fit: to the hard limit, or both to `need` if the hard limit is lower (root only).
/// Returns the soft limit in force.
pub(crate) fn raise_nofile(need: u64) -> Result<u64, BenchError> {
    let read = || {
        std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|s| procfs::parse_nofile_limits(&s))
    };
    let (soft, hard) = read().ok_or_else(|| {
        BenchError::ProcFormat("no `Max open files` line in /proc/self/limits".into())
    })?;
    if soft >= need {
        return Ok(soft);
    }
    let target = if hard >= need {
        format!("{}:{}", as_limit(hard), as_limit(hard))
    } else {
        format!("{need}:{need}")
    };
    // NB: std has no setrlimit and this crate has no unsafe code; prlimit(1) sets it on our
    // pid from outside, which is the same system call.
    let _ = Command::new(require("prlimit")?)
        .args(["--pid", &std::process::id().to_string()])
        .arg(format!("--nofile={target}"))
        .status();
    match read() {
        Some((soft, _)) if soft >= need => Ok(soft),
        _ => Err(BenchError::Usage(format!(
            "RLIMIT_NOFILE is {soft} (hard {hard}) and could not be raised to {need}; \
             run `ulimit -n {need}` (as root to raise the hard limit) first"
        ))),
    }
}

fn as_limit(n: u64) -> String {
    if n == u64::MAX {
        "unlimited".into()
    } else {
        n.to_string()
    }
}

/// Pins this process (the clients) to `cpu`.
fn pin_self(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        let _ = Command::new("taskset")
            .args(["-a", "-p", "-c", &cpu.to_string()])
            .arg(std::process::id().to_string())
            .output();
    }
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s} s")
    }
}

/// Runs both proxies through both phases and writes the result files; returns the result
/// and the paths written.
pub fn run_conns_bench(opts: &ConnsOptions) -> Result<(ConnsResult, Vec<PathBuf>), BenchError> {
    if opts.count == 0 || opts.concurrency == 0 || opts.rounds == 0 {
        return Err(BenchError::Usage(
            "--count, --concurrency and --rounds must be at least 1".into(),
        ));
    }
    let nginx_bin = require("nginx")?;
    require("kill")?;
    let cpus = pick_cpus(&allowed_cpus());
    if cpus.is_some() {
        require("taskset")?;
    }
    let (proxy_cpu, client_cpu) = (cpus.map(|c| c.0), cpus.map(|c| c.1));
    if probe::port_in_use(UPSTREAM_PORT) {
        return Err(BenchError::PortInUse {
            port: UPSTREAM_PORT,
        });
    }
    let nofile = raise_nofile(u64::from(opts.count) + u64::from(FD_MARGIN))?;
    let started = SystemTime::now();
    let sluice_bin = match opts.only {
        Some(Only::Nginx) => None,
        _ => Some(match &opts.sluice_bin {
            Some(p) => sluice::check_given_binary(p),
            None => sluice::build_release(&opts.workspace),
        }),
    };
    // NB: before pinning, which would make this process see one CPU.
    let machine = machine::collect(
        &opts.workspace,
        nginx::version(&nginx_bin).unwrap_or_else(|| "unknown".into()),
        "not used".into(),
        None,
    );
    pin_self(client_cpu);
    let ctx = Ctx {
        opts,
        nginx: nginx_bin,
        proxy_cpu,
    };

    let upstream_dir = TempDir::new("upstream")?;
    std::fs::write(
        upstream_dir.path().join("nginx.conf"),
        nginx::upstream_conf(upstream_dir.path(), UPSTREAM_PORT),
    )
    .map_err(|e| BenchError::io("write", upstream_dir.path(), e))?;
    let _upstream = ProcessGuard::spawn(
        "upstream nginx",
        pinned(proxy_cpu, &ctx.nginx, &nginx::args(upstream_dir.path())),
        &upstream_dir.path().join("stdout.log"),
    )?;
    probe::wait_for_hello(UPSTREAM_PORT, PATH, opts.ready_timeout, || Ok(())).map_err(|d| {
        BenchError::NotReady {
            what: "upstream nginx".into(),
            detail: d,
        }
    })?;

    let phases = [
        (Load::IdleKeepAlive, opts.keepalive_timeout),
        (Load::HalfHead, opts.header_timeout),
    ];
    let mut runs = Vec::new();
    if opts.only != Some(Only::Sluice) {
        let mut run = ConnsRun {
            proxy: "nginx".into(),
            skipped: Vec::new(),
            idle: None,
            heads: None,
        };
        for (load, timeout) in phases {
            let dir = TempDir::new("conns-nginx")?;
            let settings = format!(
                "client_header_timeout {t}, keepalive_timeout {t}",
                t = secs(timeout)
            );
            match ctx.start_nginx(&dir, timeout) {
                Ok(proxy) => {
                    let phase = ctx.measure(&proxy, load, settings)?;
                    match load {
                        Load::IdleKeepAlive => run.idle = Some(phase),
                        Load::HalfHead => run.heads = Some(phase),
                    }
                }
                Err(reason) => run.skipped.push(reason),
            }
        }
        runs.push(run);
    }
    let mut sluice_version = String::from("not measured");
    if let Some(bin) = sluice_bin {
        let mut run = ConnsRun {
            proxy: "sluice".into(),
            skipped: Vec::new(),
            idle: None,
            heads: None,
        };
        match bin {
            Err(e) => run.skipped.push(e.to_string()),
            Ok(bin) => {
                sluice_version = machine::run_trimmed(Command::new(&bin).arg("--version"))
                    .unwrap_or_else(|| "unknown".into());
                for (load, timeout) in phases {
                    let dir = TempDir::new("conns-sluice")?;
                    let settings = format!("--header-timeout {}", secs(timeout));
                    match ctx.start_sluice(&bin, &dir, timeout) {
                        Ok(proxy) => {
                            let phase = ctx.measure(&proxy, load, settings)?;
                            match load {
                                Load::IdleKeepAlive => run.idle = Some(phase),
                                Load::HalfHead => run.heads = Some(phase),
                            }
                        }
                        Err(reason) => run.skipped.push(reason),
                    }
                }
            }
        }
        runs.push(run);
    }
    for run in &runs {
        for reason in &run.skipped {
            eprintln!("sluice-bench conns: {}: SKIPPED: {reason}", run.proxy);
        }
    }

    let result = ConnsResult {
        schema_version: SCHEMA_VERSION,
        timestamp: machine::timestamp_utc(started),
        machine,
        sluice_version,
        params: ConnsParams {
            count: opts.count,
            concurrency: opts.concurrency,
            rounds: opts.rounds,
            header_timeout_s: opts.header_timeout.as_secs_f64(),
            keepalive_timeout_s: opts.keepalive_timeout.as_secs_f64(),
            grace_s: GRACE.as_secs_f64(),
            proxy_cpu,
            client_cpu,
            nofile,
            sluice_flags: sluice_flags(opts, opts.header_timeout),
            sluice_args: opts.sluice_args.clone(),
        },
        runs,
    };
    let written = write_results(&result, &opts.results)?;
    Ok((result, written))
}

/// Writes `conns-<arch>-<timestamp>.{json,md}` to the history and, without extra dataplane
/// flags, the `latest-conns-<arch>.{json,md}` copies. Returns the timestamped paths.
pub fn write_results(
    result: &ConnsResult,
    dirs: &crate::results::ResultsDirs,
) -> Result<Vec<PathBuf>, BenchError> {
    let arch = result.machine.file_arch();
    let json = serde_json::to_string_pretty(result).map_err(|e| BenchError::Json {
        path: dirs.history.clone(),
        source: e,
    })? + "\n";
    let md = render_markdown(result);
    let stem = format!("conns-{arch}-{}", result.timestamp);
    let written = vec![
        dirs.write_history(&format!("{stem}.json"), &json)?,
        dirs.write_history(&format!("{stem}.md"), &md)?,
    ];
    if result.params.sluice_args.is_empty() {
        dirs.write_latest(&format!("latest-conns-{arch}.json"), &json)?;
        dirs.write_latest(&format!("latest-conns-{arch}.md"), &md)?;
    }
    Ok(written)
}

/// Whether dataplane flags leave io_uring on (`--write-batching auto`, its default).
pub fn may_use_io_uring(flags: &[String]) -> bool {
    let joined = format!(" {} ", flags.join(" "));
    !joined.contains(" --write-batching ") && !joined.contains(" --write-batching=")
        || joined.contains(" --write-batching auto ")
        || joined.contains(" --write-batching=auto ")
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn signed_mib(kib: i64) -> String {
    format!("{:+.1} MiB", kib as f64 / 1024.0)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(n), Some(s)) if n > 0.0 && s.is_finite() => format!("{:.2}×", s / n),
        _ => "-".into(),
    }
}

/// One table row: a label, a cell and a number (for the ratio) per proxy.
type Cell = (String, Option<f64>);

fn row(out: &mut String, label: &str, nginx: Option<Cell>, sluice: Option<Cell>, with_ratio: bool) {
    let text = |c: &Option<Cell>| c.as_ref().map_or_else(|| "-".to_owned(), |c| c.0.clone());
    let r = if with_ratio {
        ratio(
            nginx.as_ref().and_then(|c| c.1),
            sluice.as_ref().and_then(|c| c.1),
        )
    } else {
        String::new()
    };
    let r = if r.is_empty() { r } else { format!(" {r}") };
    let _ = writeln!(
        out,
        "| {label} | {} | {} |{r} |",
        text(&nginx),
        text(&sluice)
    );
}

fn rss_cell(s: &Sample) -> Cell {
    (mib(s.rss_kib), Some(s.rss_kib as f64))
}

/// The markdown report: setup, then a nginx | sluice | sluice ÷ nginx table per phase, then
/// warnings.
pub fn render_markdown(r: &ConnsResult) -> String {
    let m = &r.machine;
    let p = &r.params;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Resource bounds: {} connections, nginx and Sluice, {}, {}\n",
        p.count,
        m.arch_label(),
        r.timestamp
    );
    let _ = writeln!(
        s,
        "- machine: {} × {} CPUs, kernel {}; {}; {}",
        m.cpu_model, m.nproc, m.kernel, m.nginx_version, r.sluice_version
    );
    let _ = writeln!(
        s,
        "- commit: {}{}",
        m.git_commit,
        if m.git_dirty {
            " (dirty work tree)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        s,
        "- event loop: epoll on both sides (nginx's default on Linux; Sluice's tokio), {}; one \
         worker each (nginx `worker_processes 1`, Sluice `--workers 1`), the scenario-1 route \
         `/hello` to the nginx origin on 127.0.0.1:{UPSTREAM_PORT}; Sluice's flags after its \
         listeners (heads process; the idle one has `--header-timeout {}s`): `{}`",
        if may_use_io_uring(&p.sluice_flags) {
            "Sluice's writes through io_uring where the kernel allows it"
        } else {
            "no io_uring (Sluice writes with one send(2) per connection)"
        },
        p.keepalive_timeout_s,
        p.sluice_flags.join(" ")
    );
    let _ = writeln!(
        s,
        "- pinning: {}; clients: plain sockets in sluice-bench, {} opening at a time over loopback; \
         RLIMIT_NOFILE {} (Sluice inherits it; nginx `worker_rlimit_nofile {}`, \
         `worker_connections {}`; Sluice `--max-connections {}`)",
        match (p.proxy_cpu, p.client_cpu) {
            (Some(x), Some(c)) => format!("proxy and origin on CPU {x}, clients on CPU {c}"),
            _ => "none (fewer than 2 CPUs)".into(),
        },
        p.concurrency,
        if p.nofile == u64::MAX {
            "unlimited".into()
        } else {
            p.nofile.to_string()
        },
        (p.count + FD_MARGIN) * 2,
        p.count + FD_MARGIN,
        p.count + FD_MARGIN
    );
    if !p.sluice_args.is_empty() {
        let _ = writeln!(s, "- extra sluice flags: `{}`", p.sluice_args.join(" "));
    }
    let _ = writeln!(
        s,
        "- RSS: `VmRSS` of `/proc/<pid>/status`, summed over the process tree: nginx = master + \
         worker (the master alone is on the last line of each table), Sluice = its one process. \
         Per connection = (RSS with the N open − baseline) ÷ N, first round. \"after close\": the \
         proxy's open descriptors are back, it served one `GET /hello`, 12 s later. {} round(s) \
         per process.\n",
        p.rounds
    );
    let get = |name: &str| r.runs.iter().find(|x| x.proxy == name);
    let (nginx, sluice) = (get("nginx"), get("sluice"));
    for load in [Load::IdleKeepAlive, Load::HalfHead] {
        let (n, sl) = (
            nginx.and_then(|x| x.phase(load)),
            sluice.and_then(|x| x.phase(load)),
        );
        let timeout = match load {
            Load::IdleKeepAlive => p.keepalive_timeout_s,
            Load::HalfHead => p.header_timeout_s,
        };
        let _ = writeln!(s, "### {} {}\n", p.count, load.title());
        let _ = match load {
            Load::IdleKeepAlive => writeln!(
                s,
                "Each connection sent `GET /hello HTTP/1.1` and read the 200, then stayed idle. \
                 Timeouts of this process: nginx `keepalive_timeout` and `client_header_timeout` \
                 {timeout} s, Sluice `--header-timeout {timeout}s` (it also bounds the wait for \
                 the next request on a keep-alive connection).\n"
            ),
            Load::HalfHead => writeln!(
                s,
                "Each connection sent `GET /hello HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nX-A: ` (no \
                 line end after it) and nothing more. Timeouts of this process: nginx \
                 `client_header_timeout` and `keepalive_timeout` {timeout} s, Sluice \
                 `--header-timeout {timeout}s`; checked {} s after the last head was sent.\n",
                timeout + p.grace_s
            ),
        };
        let _ = writeln!(
            s,
            "| | nginx | sluice | sluice ÷ nginx |\n|---|---:|---:|---:|"
        );
        let cell = |ph: Option<&Phase>, f: &dyn Fn(&Phase) -> Option<Cell>| ph.and_then(f);
        let both =
            |s: &mut String, label: &str, f: &dyn Fn(&Phase) -> Option<Cell>, ratio: bool| {
                row(s, label, cell(n, f), cell(sl, f), ratio);
            };
        both(
            &mut s,
            "baseline RSS",
            &|ph| Some(rss_cell(&ph.baseline)),
            true,
        );
        let rounds = n
            .map_or(0, |x| x.rounds.len())
            .max(sl.map_or(0, |x| x.rounds.len()));
        for i in 0..rounds {
            let tag = if rounds > 1 {
                format!("round {}: ", i + 1)
            } else {
                String::new()
            };
            let rd = |ph: &Phase| ph.rounds.get(i).cloned();
            both(
                &mut s,
                &format!("{tag}RSS with the {} open", p.count),
                &|ph| rd(ph).map(|r| rss_cell(&r.loaded)),
                true,
            );
            if i == 0 {
                both(
                    &mut s,
                    "**bytes per connection**",
                    &|ph| {
                        ph.bytes_per_connection()
                            .map(|b| (format!("**{b:.0}**"), Some(b)))
                    },
                    true,
                );
            }
            both(
                &mut s,
                &format!("{tag}open when measured (of opened; failed)"),
                &|ph| {
                    rd(ph).map(|r| {
                        (
                            format!("{} of {}; {}", r.open_at_sample, r.opened, r.failed),
                            None,
                        )
                    })
                },
                false,
            );
            if load == Load::HalfHead {
                both(
                    &mut s,
                    &format!("{tag}closed by the proxy after the timeout"),
                    &|ph| {
                        let r = rd(ph)?;
                        let c = r.timeout_checks.first()?;
                        let statuses = if c.statuses.is_empty() {
                            "no response".to_owned()
                        } else {
                            c.statuses
                                .iter()
                                .map(|(k, v)| format!("{v}× {k}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        };
                        Some((
                            format!(
                                "{} of {} at {:.1} s ({statuses})",
                                c.closed,
                                c.closed + c.still_open,
                                c.waited_s
                            ),
                            None,
                        ))
                    },
                    false,
                );
                both(
                    &mut s,
                    &format!("{tag}RSS after the timeout"),
                    &|ph| {
                        rd(ph).and_then(|r| r.timeout_checks.first().map(|c| rss_cell(&c.sample)))
                    },
                    true,
                );
            }
            both(
                &mut s,
                &format!("{tag}RSS after close"),
                &|ph| rd(ph).map(|r| rss_cell(&r.after_close)),
                true,
            );
        }
        both(
            &mut s,
            "**final − baseline**",
            &|ph| {
                ph.retained_kib()
                    .map(|k| (format!("**{}**", signed_mib(k)), None))
            },
            false,
        );
        both(
            &mut s,
            &format!(
                "RSS after {} s of traffic, {TRAFFIC_CLIENTS} keep-alive clients",
                TRAFFIC.as_secs()
            ),
            &|ph| ph.after_traffic.as_ref().map(rss_cell),
            true,
        );
        both(
            &mut s,
            "**after traffic − baseline**",
            &|ph| {
                ph.after_traffic_kib()
                    .map(|k| (format!("**{}**", signed_mib(k)), None))
            },
            false,
        );
        both(
            &mut s,
            "peak RSS (VmHWM)",
            &|ph| {
                ph.final_sample()
                    .map(|f| (mib(f.hwm_kib), Some(f.hwm_kib as f64)))
            },
            true,
        );
        both(
            &mut s,
            "open fds: baseline / loaded / final",
            &|ph| {
                let r = ph.rounds.first()?;
                let f = ph.final_sample()?;
                Some((
                    format!("{} / {} / {}", ph.baseline.fds, r.loaded.fds, f.fds),
                    None,
                ))
            },
            false,
        );
        both(
            &mut s,
            "time to open them",
            &|ph| {
                ph.rounds
                    .first()
                    .map(|r| (format!("{:.1} s", r.open_s), None))
            },
            false,
        );
        both(
            &mut s,
            "nginx master alone: baseline / final",
            &|ph| {
                if ph.baseline.processes.len() < 2 {
                    return None;
                }
                let f = ph.final_sample()?;
                Some((
                    format!(
                        "{} / {}",
                        mib(ph.baseline.processes[0].rss_kib),
                        mib(f.processes.first()?.rss_kib)
                    ),
                    None,
                ))
            },
            false,
        );
        let _ = writeln!(s);
        for (name, ph) in [("nginx", n), ("sluice", sl)] {
            for w in ph.map(|x| x.warnings(p.count)).unwrap_or_default() {
                let _ = writeln!(s, "- **{name}**: {w}");
            }
        }
        let _ = writeln!(s);
    }
    for run in &r.runs {
        for reason in &run.skipped {
            let _ = writeln!(s, "- **{} skipped**: {reason}", run.proxy);
        }
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    #[test]
    fn responses_are_complete_only_with_their_body() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nhello world\n";
        assert_eq!(complete_response(ok), Some(Ok(200)));
        assert_eq!(complete_response(&ok[..ok.len() - 1]), None);
        assert_eq!(complete_response(&ok[..20]), None);
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nc\r\nhello world\n\r\n0\r\n\r\n";
        assert_eq!(complete_response(chunked), Some(Ok(200)));
        assert_eq!(complete_response(&chunked[..chunked.len() - 2]), None);
        let close = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
        assert!(complete_response(close).unwrap().is_err());
        assert!(
            complete_response(b"HTTP/1.1 200 OK\r\n\r\nhello")
                .unwrap()
                .is_err()
        );
        assert!(complete_response(b"SSH-2.0\r\n\r\n").unwrap().is_err());
        assert_eq!(
            complete_response(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"),
            Some(Ok(404))
        );
    }

    #[test]
    fn status_codes() {
        assert_eq!(status_of(b"HTTP/1.1 408 Request Timeout\r\n"), Some(408));
        assert_eq!(status_of(b"HTTP/1.0 400"), Some(400));
        assert_eq!(status_of(b"HTTP/1.1 4"), None);
        assert_eq!(status_of(b""), None);
        assert_eq!(status_of(b"garbage"), None);
    }

    /// Three held connections over loopback: one the server leaves open, one it answers
    /// 408 and closes, one it closes without a word.
    #[test]
    fn peer_states_over_loopback() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut clients: Vec<std::net::TcpStream> = (0..3)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let mut served: Vec<std::net::TcpStream> =
            (0..3).map(|_| listener.accept().unwrap().0).collect();
        // accept order follows connect order on loopback.
        served[1]
            .write_all(b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n")
            .unwrap();
        let quiet = served.remove(2);
        let answered = served.remove(1);
        drop((quiet, answered));
        std::thread::sleep(Duration::from_millis(100));
        for c in &clients {
            c.set_nonblocking(true).unwrap();
        }
        assert_eq!(peer_state(&mut clients[0]), PeerState::Open);
        assert_eq!(peer_state(&mut clients[1]), PeerState::Closed(Some(408)));
        assert_eq!(peer_state(&mut clients[2]), PeerState::Closed(None));
        let (open, closed, statuses) = census(&mut clients);
        // The two closed ones stay closed; the 408 was read by the first look.
        assert_eq!((open, closed), (1, 2));
        assert!(statuses.is_empty(), "{statuses:?}");
        // Something sent but no close yet.
        served[0].write_all(b"HTTP/1.1 408 x\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(peer_state(&mut clients[0]), PeerState::Answered(Some(408)));
    }

    fn sample(rss_kib: u64, fds: u64) -> Sample {
        Sample::from_processes(
            0.0,
            vec![ProcMemory {
                pid: 1,
                comm: "p".into(),
                rss_kib,
                hwm_kib: rss_kib,
                fds,
            }],
        )
    }

    fn round(opened: u64, loaded_kib: u64, after_kib: u64) -> Round {
        Round {
            opened,
            failed: 0,
            first_error: None,
            open_s: 1.0,
            loaded: sample(loaded_kib, opened + 10),
            open_at_sample: opened,
            timeout_checks: Vec::new(),
            fds_settled: true,
            after_close: sample(after_kib, 10),
        }
    }

    fn phase(load: Load, rounds: Vec<Round>) -> Phase {
        Phase {
            load,
            settings: String::new(),
            baseline: sample(4096, 10),
            rounds,
            after_traffic: Some(sample(4096 + 512, 10)),
            traffic_requests: 1000,
        }
    }

    #[test]
    fn per_connection_and_retained_memory() {
        // 10,000 connections took 20,000 KiB more: 2048 bytes each.
        let p = phase(
            Load::IdleKeepAlive,
            vec![round(10_000, 24_096, 5_000), round(10_000, 24_000, 5_120)],
        );
        assert_eq!(p.bytes_per_connection(), Some(2048.0));
        assert_eq!(p.retained_kib(), Some(1024));
        assert_eq!(p.after_traffic_kib(), Some(512));
        assert!(p.warnings(10_000).is_empty(), "{:?}", p.warnings(10_000));
        assert_eq!(
            phase(Load::HalfHead, Vec::new()).bytes_per_connection(),
            None
        );
        assert_eq!(
            phase(Load::HalfHead, vec![round(0, 1, 1)]).bytes_per_connection(),
            None
        );
    }

    #[test]
    fn warnings_name_what_went_wrong() {
        let mut r = round(9_990, 10_000, 4_096);
        r.failed = 10;
        r.first_error = Some("Connection refused".into());
        r.open_at_sample = 9_000;
        r.fds_settled = false;
        r.timeout_checks.push(TimeoutCheck {
            waited_s: 7.0,
            closed: 9_000,
            still_open: 990,
            statuses: BTreeMap::new(),
            sample: sample(9_000, 1_000),
        });
        let w = phase(Load::HalfHead, vec![r]).warnings(10_000);
        assert_eq!(w.len(), 4, "{w:?}");
        assert!(w[0].contains("9990 of 10000") && w[0].contains("Connection refused"));
        assert!(w[1].contains("990 of 9990"));
        assert!(w[2].contains("UNBOUNDED") && w[2].contains("990 half-sent"));
        assert!(w[3].contains("descriptors"));
    }

    fn result() -> ConnsResult {
        let mut heads = round(10_000, 44_096, 4_500);
        heads.timeout_checks.push(TimeoutCheck {
            waited_s: 7.1,
            closed: 10_000,
            still_open: 0,
            statuses: BTreeMap::from([(408, 10_000)]),
            sample: sample(8_000, 12),
        });
        let nginx = ConnsRun {
            proxy: "nginx".into(),
            skipped: Vec::new(),
            idle: Some(phase(
                Load::IdleKeepAlive,
                vec![round(10_000, 14_096, 4_096)],
            )),
            heads: Some(phase(Load::HalfHead, vec![round(10_000, 14_096, 4_096)])),
        };
        let sluice = ConnsRun {
            proxy: "sluice".into(),
            skipped: vec!["heads: something".into()],
            idle: Some(phase(
                Load::IdleKeepAlive,
                vec![round(10_000, 24_096, 5_120)],
            )),
            heads: Some(phase(Load::HalfHead, vec![heads])),
        };
        ConnsResult {
            schema_version: SCHEMA_VERSION,
            timestamp: "20260101T000000Z".into(),
            machine: MachineInfo {
                arch: "x86_64".into(),
                nproc: 2,
                kernel: "6.1.0".into(),
                cpu_model: "Test CPU".into(),
                nginx_version: "nginx/1.22.1".into(),
                wrk_version: "not used".into(),
                git_commit: "abc1234".into(),
                git_dirty: false,
                emulation: None,
            },
            sluice_version: "sluice-dataplane 0.1.0".into(),
            params: ConnsParams {
                count: 10_000,
                concurrency: 64,
                rounds: 1,
                header_timeout_s: 5.0,
                keepalive_timeout_s: 300.0,
                grace_s: 2.0,
                proxy_cpu: Some(0),
                client_cpu: Some(1),
                nofile: 20_000,
                sluice_flags: ["--header-timeout", "5000ms", "--write-batching", "send"]
                    .map(String::from)
                    .to_vec(),
                sluice_args: Vec::new(),
            },
            runs: vec![nginx, sluice],
        }
    }

    #[test]
    fn report_puts_the_proxies_side_by_side() {
        let md = render_markdown(&result());
        // Idle: nginx 10,000 KiB over 10,000 connections = 1024 B, sluice 2048 B: 2.00×.
        assert!(
            md.contains("| **bytes per connection** | **1024** | **2048** | 2.00× |"),
            "{md}"
        );
        // Heads: sluice 40,000 KiB = 4096 B each, 4.00× nginx.
        assert!(
            md.contains("| **bytes per connection** | **1024** | **4096** | 4.00× |"),
            "{md}"
        );
        assert!(
            md.contains("| closed by the proxy after the timeout | - | 10000 of 10000 at 7.1 s (10000× 408) | |"),
            "{md}"
        );
        assert!(
            md.contains("| **final − baseline** | **+0.0 MiB** | **+1.0 MiB** | |"),
            "{md}"
        );
        assert!(
            md.contains("| **after traffic − baseline** | **+0.5 MiB** | **+0.5 MiB** | |"),
            "{md}"
        );
        assert!(
            md.contains("no io_uring (Sluice writes with one send(2) per connection)"),
            "{md}"
        );
        assert!(md.contains("**sluice skipped**: heads: something"), "{md}");
        assert_eq!(md.matches("### 10000 ").count(), 2, "{md}");
    }

    #[test]
    fn result_round_trips_through_json() {
        let r = result();
        let json = serde_json::to_string(&r).unwrap();
        let back: ConnsResult = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
        assert!(json.contains("\"load\":\"half-head\""), "{json}");
    }

    #[test]
    fn dataplane_flags_leave_room_and_skip_io_uring() {
        let opts = ConnsOptions {
            count: 10_000,
            concurrency: 64,
            header_timeout: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(300),
            rounds: 2,
            sluice_bin: None,
            workspace: PathBuf::from("/w"),
            results: crate::results::ResultsDirs::new(Some("/c".into()), Path::new("/w")),
            ready_timeout: Duration::from_secs(20),
            only: None,
            sluice_args: vec!["--log-format=json".into()],
        };
        assert_eq!(
            sluice_flags(&opts, Duration::from_millis(5_500)).join(" "),
            "--max-connections 11024 --header-timeout 5500ms --write-batching send --log-format=json"
        );
        assert!(!may_use_io_uring(&sluice_flags(
            &opts,
            Duration::from_secs(5)
        )));
        assert!(may_use_io_uring(&["--workers".into(), "1".into()]));
        assert!(may_use_io_uring(&[
            "--write-batching".into(),
            "auto".into()
        ]));
        // The dataplane refuses a flag given twice: the user's choice replaces ours.
        let opts = ConnsOptions {
            sluice_args: vec!["--write-batching=off".into()],
            ..opts
        };
        assert_eq!(
            sluice_flags(&opts, Duration::from_secs(5)).join(" "),
            "--max-connections 11024 --header-timeout 5000ms --write-batching=off"
        );
    }
}
