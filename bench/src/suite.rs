//! `sluice-bench suite --scenario NAME`: the scenarios of issue 21, "performance as users
//! deploy it", each with Sluice, nginx and HAProxy in the same run, one worker each (two in
//! `workers2`), in both topologies: the origin on the proxy's core, and off it.
//!
//! ```text
//!   load CPU (1)                                   proxy CPU (0)
//!   wrk / TLS clients in this process ──────────▶  proxy under test ──keep-alive──▶ nginx origin :1980
//!   (idle connections: this process)              (nginx | haproxy | sluice)        (CPU 0: "origin on proxy core",
//!                                                                                    CPU 1: "origin off proxy core")
//! ```
//!
//! | scenario | cases | load |
//! |---|---|---|
//! | `keepalive` | `GET /hello`, Sluice with `--write-batching send`, `auto`, `off` | wrk -t1 -c64 |
//! | `churn` | a new connection per request: plain, TLS 1.3 full handshake ECDSA P-256 / RSA 2048, TLS 1.3 resumed (ECDSA) | wrk -c64 `Connection: close`; 32 rustls clients in this process |
//! | `large` | 1 MiB and 64 MiB downloads, 10 MiB uploads | wrk (`--timeout 30s`; a Lua body for uploads) |
//! | `idle` | `GET /hello` keep-alive, without and then with 10,000 idle keep-alive connections | wrk -t1 -c64; idle ones opened by this process |
//! | `workers2` | `GET /hello`, two workers per proxy, nothing pinned | wrk -t2 -c128 |
//!
//! Per case and proxy: a fresh proxy process, a warm-up, then the measured run; the
//! proxy's CPU time (its process tree, `/proc/<pid>/stat`), requests per CPU-second,
//! p50/p99 latency, peak RSS (`VmHWM`) and the highest `VmRSS` sampled every 50 ms during the
//! run against the value before it (does RSS stay flat while 64 MiB bodies stream?). The
//! machine's 1-minute load average is recorded before each run, as are the CPU seconds
//! used by anything other than the proxy, origin and load generator ("other").

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::BenchError;
use crate::haproxy::{self, HaproxyConf};
use crate::machine::{self, MachineInfo};
use crate::nginx::{self, SuiteProxy};
use crate::process::{ProcessGuard, TempDir};
use crate::runner::{PATH, UPSTREAM_PORT, allowed_cpus, pick_cpus, pinned, require};
use crate::{conns, perf, probe, procfs, sluice, tls, wrk};

/// Version of the suite's JSON layout.
pub const SCHEMA_VERSION: u32 = 1;
/// The keep-alive connections of wrk (as in the APISIX benchmark).
const CONNECTIONS: u32 = 64;
/// Concurrent TLS handshake clients (as `sluice-bench tls`).
const TLS_CLIENTS: usize = 32;

/// The scenarios of issue 21.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Keep-alive `GET /hello`; Sluice with each write-batching mode.
    Keepalive,
    /// A new connection per request, plain and TLS.
    Churn,
    /// 1 MiB and 64 MiB responses, 10 MiB uploads.
    Large,
    /// 10,000 idle keep-alive connections beside a steady load.
    Idle,
    /// Two workers per proxy on two cores.
    Workers2,
}

impl Scenario {
    /// The name on the command line and in file names.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Keepalive => "keepalive",
            Scenario::Churn => "churn",
            Scenario::Large => "large",
            Scenario::Idle => "idle",
            Scenario::Workers2 => "workers2",
        }
    }
}

/// Where the origin runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// The origin shares the proxy's core (APISIX's 2-core setup).
    OriginOnProxyCore,
    /// The origin runs on the load generator's core; the proxy has its core to itself.
    OriginOffProxyCore,
    /// Nothing pinned (`workers2`: the proxies' two workers need both cores).
    Unpinned,
}

impl Topology {
    /// Short label for tables.
    pub fn label(self) -> &'static str {
        match self {
            Topology::OriginOnProxyCore => "origin on the proxy's core",
            Topology::OriginOffProxyCore => "origin off the proxy's core",
            Topology::Unpinned => "unpinned, 2 workers",
        }
    }
}

/// Sluice's `--write-batching` mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batching {
    /// io_uring where allowed.
    Auto,
    /// One send(2) per connection per turn, no io_uring (what pods get under the default
    /// seccomp profile).
    Send,
    /// Every write at once.
    Off,
}

impl Batching {
    fn flag(self) -> &'static str {
        match self {
            Batching::Auto => "auto",
            Batching::Send => "send",
            Batching::Off => "off",
        }
    }
}

/// A proxy under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyKind {
    /// Debian's nginx.
    Nginx,
    /// Debian's HAProxy.
    Haproxy,
    /// sluice-dataplane with a write-batching mode.
    Sluice(Batching),
}

impl ProxyKind {
    /// The row name: `nginx`, `haproxy`, `sluice (send)`.
    pub fn label(self) -> String {
        match self {
            ProxyKind::Nginx => "nginx".into(),
            ProxyKind::Haproxy => "haproxy".into(),
            ProxyKind::Sluice(b) => format!("sluice ({})", b.flag()),
        }
    }
}

/// The Sluice row the targets are about: the mode pods run in.
pub const SLUICE_OF_RECORD: &str = "sluice (send)";

/// How a case loads the proxy.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadSpec {
    /// wrk against `path`.
    Wrk {
        /// `-t`.
        threads: u32,
        /// `-c`.
        connections: u32,
        /// Request path.
        path: &'static str,
        /// Send `Connection: close`: wrk opens a new connection for every request.
        close: bool,
        /// POST a body of this many bytes (a Lua script sets it).
        upload_bytes: Option<usize>,
        /// Bytes of each response body (for throughput), when it is not hello.
        body_bytes: Option<u64>,
        /// wrk `--timeout` in seconds (default 2 s; large bodies take longer).
        timeout_s: Option<u32>,
    },
    /// New TLS connections with one `GET /hello` each, from this process.
    Tls {
        /// Offer the last session's ticket (TLS 1.3 resumption).
        resume: bool,
    },
}

/// One case of a scenario: what is loaded, and how the proxies are set up for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// Row label, e.g. `download 64 MiB`.
    pub name: &'static str,
    /// The load.
    pub load: LoadSpec,
    /// TLS certificate type on the proxy, if any.
    pub tls: Option<tls::Key>,
    /// Stream bodies (nginx `proxy_buffering off` etc.).
    pub stream_bodies: bool,
}

fn wrk_case(name: &'static str, path: &'static str) -> Case {
    Case {
        name,
        load: LoadSpec::Wrk {
            threads: 1,
            connections: CONNECTIONS,
            path,
            close: false,
            upload_bytes: None,
            body_bytes: None,
            timeout_s: None,
        },
        tls: None,
        stream_bodies: false,
    }
}

/// The cases of `scenario` whose name contains `filter` (all without one); an error names
/// the cases when none matches.
pub fn selected_cases(scenario: Scenario, filter: Option<&str>) -> Result<Vec<Case>, BenchError> {
    let all = cases(scenario);
    let Some(f) = filter else { return Ok(all) };
    let names: Vec<&str> = all.iter().map(|c| c.name).collect();
    let picked: Vec<Case> = all.iter().filter(|c| c.name.contains(f)).cloned().collect();
    if picked.is_empty() {
        return Err(BenchError::Usage(format!(
            "--case {f:?} matches no case of {}; its cases: {}",
            scenario.name(),
            names.join(", ")
        )));
    }
    Ok(picked)
}

/// The cases of a scenario, in run order.
pub fn cases(scenario: Scenario) -> Vec<Case> {
    const MIB: u64 = 1024 * 1024;
    let large = |name, path, connections, body: Option<u64>, upload: Option<usize>| Case {
        name,
        load: LoadSpec::Wrk {
            threads: 1,
            connections,
            path,
            close: false,
            upload_bytes: upload,
            body_bytes: body,
            timeout_s: Some(30),
        },
        tls: None,
        stream_bodies: true,
    };
    let tls_case = |name, key, resume| Case {
        name,
        load: LoadSpec::Tls { resume },
        tls: Some(key),
        stream_bodies: false,
    };
    match scenario {
        Scenario::Keepalive => vec![wrk_case("keep-alive GET /hello", PATH)],
        Scenario::Churn => vec![
            Case {
                name: "plain, new connection per request",
                load: LoadSpec::Wrk {
                    threads: 1,
                    connections: CONNECTIONS,
                    path: PATH,
                    close: true,
                    upload_bytes: None,
                    body_bytes: None,
                    timeout_s: None,
                },
                tls: None,
                stream_bodies: false,
            },
            tls_case(
                "TLS 1.3 full handshake, ECDSA P-256",
                tls::Key::Ecdsa,
                false,
            ),
            tls_case("TLS 1.3 full handshake, RSA 2048", tls::Key::Rsa, false),
            tls_case(
                "TLS 1.3 resumed (ticket), ECDSA P-256",
                tls::Key::Ecdsa,
                true,
            ),
        ],
        Scenario::Large => vec![
            large("download 1 MiB", "/files/1m", 16, Some(MIB), None),
            large("download 64 MiB", "/files/64m", 4, Some(64 * MIB), None),
            large("upload 10 MiB", "/upload", 8, None, Some(10 * 1024 * 1024)),
        ],
        Scenario::Idle => vec![wrk_case("keep-alive GET /hello", PATH)],
        Scenario::Workers2 => vec![Case {
            name: "keep-alive GET /hello, 2 workers",
            load: LoadSpec::Wrk {
                threads: 2,
                connections: 2 * CONNECTIONS,
                path: PATH,
                close: false,
                upload_bytes: None,
                body_bytes: None,
                timeout_s: None,
            },
            tls: None,
            stream_bodies: false,
        }],
    }
}

/// The proxies of a scenario, in run order (reversed in even rounds).
pub fn proxies(scenario: Scenario) -> Vec<ProxyKind> {
    let mut v = vec![ProxyKind::Nginx, ProxyKind::Haproxy];
    match scenario {
        Scenario::Keepalive => v.extend([
            ProxyKind::Sluice(Batching::Send),
            ProxyKind::Sluice(Batching::Auto),
            ProxyKind::Sluice(Batching::Off),
        ]),
        _ => v.push(ProxyKind::Sluice(Batching::Send)),
    }
    v
}

/// Options of `sluice-bench suite`.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// Which scenario.
    pub scenario: Scenario,
    /// Topologies to run (ignored by `workers2`, which is unpinned).
    pub topologies: Vec<Topology>,
    /// Measured run length.
    pub duration: Duration,
    /// Warm-up before each measured run.
    pub warmup: Duration,
    /// Rounds; the order of the proxies alternates.
    pub repeat: u32,
    /// Idle connections of the `idle` scenario.
    pub idle_count: u32,
    /// A prebuilt dataplane; `None` builds it.
    pub sluice_bin: Option<PathBuf>,
    /// The workspace (bench/config, git).
    pub workspace: PathBuf,
    /// Where result files go: history outside the clone, `latest-*` copies in
    /// `bench/results` ([`crate::results`]).
    pub results: crate::results::ResultsDirs,
    /// How long a proxy may take to serve.
    pub ready_timeout: Duration,
    /// Only the cases whose name contains this (`None`: every case).
    pub case_filter: Option<String>,
    /// Record a `perf` profile of each proxy's measured runs into this directory (the
    /// figures of a profiled run are perturbed by the sampling; not figures of record).
    pub perf_dir: Option<PathBuf>,
}

/// One measured run of one proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Round number, from 1.
    pub round: u32,
    /// Topology.
    pub topology: Topology,
    /// Case name.
    pub case: String,
    /// Proxy row name.
    pub proxy: String,
    /// Idle keep-alive connections held open by the harness during the run.
    pub idle_connections: u64,
    /// Completed requests (or connections, for TLS churn).
    pub requests: u64,
    /// Failed requests or connections, bad statuses included.
    pub errors: u64,
    /// TLS churn: connections that were resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<u64>,
    /// Wall-clock length of the run.
    pub wall_s: f64,
    /// CPU time of the proxy's process tree in the run.
    pub proxy_cpu_s: f64,
    /// CPU time of the origin.
    pub origin_cpu_s: f64,
    /// CPU time of the load generator (wrk, or this process for TLS and idle clients).
    pub load_cpu_s: f64,
    /// Machine-wide busy CPU time minus the three above.
    pub other_cpu_s: f64,
    /// requests ÷ wall.
    pub req_per_s: f64,
    /// requests ÷ proxy CPU.
    pub req_per_cpu_s: f64,
    /// MiB of bodies per proxy CPU-second (large bodies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mib_per_cpu_s: Option<f64>,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// `VmHWM` summed over the proxy's processes at the end, KiB.
    pub peak_rss_kib: u64,
    /// `VmRSS` of the proxy tree just before the run, KiB.
    pub rss_before_kib: u64,
    /// Highest `VmRSS` sampled during the run, KiB.
    pub rss_max_kib: u64,
    /// 1-minute load average just before the run.
    pub loadavg_1m: f64,
    /// Other activity above 10% of one core during the run.
    pub noisy: bool,
}

/// A target of issue 21 and whether this run met it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Target {
    /// What is compared, e.g. `keep-alive, origin off the proxy's core: sluice (send) ÷ nginx req/CPU-s`.
    pub what: String,
    /// The measured value.
    pub value: f64,
    /// The goal, e.g. `≥ 1.20`.
    pub goal: String,
    /// Met or not.
    pub met: bool,
}

/// A whole `suite` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteResult {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The scenario.
    pub scenario: Scenario,
    /// UTC start time, `YYYYMMDDTHHMMSSZ`.
    pub timestamp: String,
    /// Machine and nginx/wrk versions.
    pub machine: MachineInfo,
    /// `HAProxy 2.6.12-…`.
    pub haproxy_version: String,
    /// `/proc/loadavg` when the run started.
    pub loadavg_start: String,
    /// Measured run length, s.
    pub duration_s: f64,
    /// Warm-up length, s.
    pub warmup_s: f64,
    /// Rounds.
    pub rounds: u32,
    /// Proxy and load CPUs (none when unpinned).
    pub proxy_cpu: Option<usize>,
    /// The load generator's CPU.
    pub load_cpu: Option<usize>,
    /// Every measurement.
    pub measurements: Vec<Measurement>,
    /// Issue 21's targets against the medians.
    pub targets: Vec<Target>,
    /// The proxies ran under `perf record` (`--perf`): the figures are perturbed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub profiled: bool,
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> BenchError + 'a {
    move |e| BenchError::io(what, path, e)
}

fn loadavg() -> (String, f64) {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let one = text
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN);
    (text.trim().to_owned(), one)
}

/// utime + stime of this whole process (all threads), ticks.
fn own_ticks() -> u64 {
    std::fs::read_to_string(format!("/proc/{}/stat", std::process::id()))
        .ok()
        .and_then(|s| procfs::parse_stat(&s).ok())
        .map_or(0, |s| s.utime + s.stime)
}

/// Samples the highest VmRSS of a process tree every 50 ms until dropped.
struct RssSampler {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicU64::new(procfs::tree_rss_kib(pid)));
        let (s, m) = (Arc::clone(&stop), Arc::clone(&max));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                m.fetch_max(procfs::tree_rss_kib(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Self {
            stop,
            max,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.max.load(Ordering::Relaxed)
    }
}

/// A started proxy.
struct Running {
    guard: ProcessGuard,
    port: u16,
    _dir: TempDir,
}

/// The wrk Lua script that POSTs a body of `bytes` bytes.
pub fn upload_script(bytes: usize) -> String {
    format!(
        "wrk.method = \"POST\"\nwrk.body = string.rep(\"x\", {bytes})\nwrk.headers[\"Content-Type\"] = \"application/octet-stream\"\n"
    )
}

/// wrk's arguments for a [`LoadSpec::Wrk`].
pub fn wrk_args(
    load: &LoadSpec,
    port: u16,
    duration: Duration,
    script: Option<&Path>,
) -> Vec<String> {
    let LoadSpec::Wrk {
        threads,
        connections,
        path,
        close,
        timeout_s,
        ..
    } = load
    else {
        return Vec::new();
    };
    let mut a = vec![
        format!("-t{threads}"),
        format!("-c{connections}"),
        format!("-d{}", crate::duration::wrk_duration_arg(duration)),
        "--latency".into(),
    ];
    if let Some(t) = timeout_s {
        a.push(format!("--timeout={t}s"));
    }
    if *close {
        a.push("-H".into());
        a.push("Connection: close".into());
    }
    if let Some(s) = script {
        a.push("-s".into());
        a.push(s.display().to_string());
    }
    a.push(format!("http://127.0.0.1:{port}{path}"));
    a
}

/// Everything fixed during one run.
struct Ctx<'a> {
    opts: &'a SuiteOptions,
    nginx: PathBuf,
    haproxy: PathBuf,
    wrk: PathBuf,
    sluice: PathBuf,
    proxy_cpu: Option<usize>,
    load_cpu: Option<usize>,
    clk_tck: u64,
    files: &'a Path,
    certs: &'a Path,
    suite_yaml: String,
    haproxy_maxconn: u32,
}

impl Ctx<'_> {
    fn cpu_s(&self, ticks: u64) -> f64 {
        ticks as f64 / self.clk_tck as f64
    }

    fn cert(&self, key: tls::Key) -> (PathBuf, PathBuf, PathBuf) {
        let n = match key {
            tls::Key::Ecdsa => "ecdsa",
            tls::Key::Rsa => "rsa",
        };
        (
            self.certs.join(format!("{n}.crt")),
            self.certs.join(format!("{n}.key")),
            self.certs.join(format!("{n}.pem")),
        )
    }

    /// Starts `kind` for `case` and waits until it serves.
    fn start(&self, kind: ProxyKind, case: &Case, workers: u32) -> Result<Running, BenchError> {
        let dir = TempDir::new(&format!(
            "suite-{}",
            kind.label().replace([' ', '(', ')'], "")
        ))?;
        let port = probe::free_port().map_err(|e| BenchError::io("bind", "127.0.0.1:0", e))?;
        let idle = self.opts.scenario == Scenario::Idle;
        let clients = idle.then_some(self.opts.idle_count.saturating_add(2 * CONNECTIONS));
        let client_timeout = idle.then_some(Duration::from_secs(300));
        let cpu = self.proxy_cpu;
        let mut guard = match kind {
            ProxyKind::Nginx => {
                let conf = SuiteProxy {
                    workers,
                    listen_port: port,
                    upstream_port: UPSTREAM_PORT,
                    clients,
                    client_timeout,
                    stream_bodies: case.stream_bodies,
                    tls: case.tls.map(|k| {
                        let (c, key, _) = self.cert(k);
                        (c, key)
                    }),
                }
                .render(dir.path());
                let path = dir.path().join("nginx.conf");
                std::fs::write(&path, conf).map_err(io("write", &path))?;
                ProcessGuard::spawn(
                    "nginx",
                    pinned(cpu, &self.nginx, &nginx::args(dir.path())),
                    &dir.path().join("stdout.log"),
                )?
            }
            ProxyKind::Haproxy => {
                let mut conf = HaproxyConf::new(port, UPSTREAM_PORT);
                conf.threads = workers;
                conf.maxconn = self.haproxy_maxconn;
                if let Some(t) = client_timeout {
                    conf.client_timeout = t;
                }
                conf.tls_pem = case.tls.map(|k| self.cert(k).2);
                let path = dir.path().join("haproxy.cfg");
                std::fs::write(&path, conf.render()?).map_err(io("write", &path))?;
                ProcessGuard::spawn(
                    "haproxy",
                    pinned(cpu, &self.haproxy, &haproxy::args(&path)),
                    &dir.path().join("stdout.log"),
                )?
            }
            ProxyKind::Sluice(batching) => {
                let yaml = dir.path().join("sluice.yaml");
                let text = match case.tls {
                    Some(k) => {
                        let (c, key, _) = self.cert(k);
                        tls::sluice_yaml(&self.suite_yaml, &c, &key)?
                    }
                    None => self.suite_yaml.clone(),
                };
                std::fs::write(&yaml, text).map_err(io("write", &yaml))?;
                let admin =
                    probe::free_port().map_err(|e| BenchError::io("bind", "127.0.0.1:0", e))?;
                let (http, https) = if case.tls.is_some() {
                    let h =
                        probe::free_port().map_err(|e| BenchError::io("bind", "127.0.0.1:0", e))?;
                    (h, port)
                } else {
                    (port, 0)
                };
                let args = sluice_args(&yaml, http, https, admin, workers, batching, clients);
                ProcessGuard::spawn(
                    "sluice",
                    pinned(cpu, &self.sluice, &args),
                    &dir.path().join("stdout.log"),
                )?
            }
        };
        if case.tls.is_some() {
            tls::wait_ready(
                std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                &mut guard,
            )?;
        } else {
            probe::wait_for_hello(port, PATH, self.opts.ready_timeout, || {
                match guard.try_exit_status() {
                    Some(s) => Err(format!("exited with {s}")),
                    None => Ok(()),
                }
            })
            .map_err(|detail| BenchError::NotReady {
                what: kind.label(),
                detail: format!("{detail}; {}", guard.log_tail(8)),
            })?;
        }
        Ok(Running {
            guard,
            port,
            _dir: dir,
        })
    }

    /// One run of `case`'s load against `p`; `None` duration runs the warm-up.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        p: &Running,
        origin: &ProcessGuard,
        case: &Case,
        duration: Duration,
        round: u32,
        topology: Topology,
        proxy: &str,
        idle_connections: u64,
        measured: bool,
    ) -> Result<Measurement, BenchError> {
        let perf = match (&self.opts.perf_dir, measured) {
            (Some(dir), true) => Some(perf::Recording::start(
                dir,
                &perf::file_stem(
                    self.opts.scenario.name(),
                    topology,
                    case.name,
                    proxy,
                    idle_connections,
                ),
                p.guard.pid(),
            )?),
            _ => None,
        };
        let (_, load1) = loadavg();
        let rss_before = procfs::tree_rss_kib(p.guard.pid());
        let sampler = RssSampler::start(p.guard.pid());
        let machine_before = procfs::system_cpu();
        let wrk_before = procfs::own_reaped_children_ticks();
        let own_before = own_ticks();
        let proxy_before = procfs::tree_cpu_ticks(p.guard.pid());
        let origin_before = procfs::tree_cpu_ticks(origin.pid());
        let started = Instant::now();
        let out = match &case.load {
            LoadSpec::Wrk {
                upload_bytes,
                body_bytes,
                ..
            } => {
                let dir = TempDir::new("suite-wrk")?;
                let script = match upload_bytes {
                    Some(n) => {
                        let s = dir.path().join("upload.lua");
                        std::fs::write(&s, upload_script(*n)).map_err(io("write", &s))?;
                        Some(s)
                    }
                    None => None,
                };
                let args = wrk_args(&case.load, p.port, duration, script.as_deref());
                let mut g = ProcessGuard::spawn(
                    "wrk",
                    pinned(self.load_cpu, &self.wrk, &args),
                    &dir.path().join("wrk.log"),
                )?;
                let status = g
                    .wait_timeout(duration + Duration::from_secs(60))
                    .ok_or_else(|| BenchError::Wrk("wrk did not finish in time".into()))?;
                if !status.success() {
                    return Err(BenchError::Wrk(format!(
                        "wrk exited with {status}: {}",
                        g.log_tail(5)
                    )));
                }
                let r = wrk::parse_wrk_output(&g.log_text())?;
                let bytes = body_bytes.or(upload_bytes.map(|n| n as u64));
                LoadOut {
                    requests: r.requests,
                    errors: r.non_2xx_3xx + r.socket_errors.total(),
                    resumed: None,
                    p50_ms: r.p50_ms,
                    p99_ms: r.p99_ms,
                    bytes_per_request: bytes,
                }
            }
            LoadSpec::Tls { resume } => tls_load(p.port, duration, *resume)?,
        };
        let wall_s = started.elapsed().as_secs_f64();
        let proxy_after = procfs::tree_cpu_ticks(p.guard.pid());
        let origin_after = procfs::tree_cpu_ticks(origin.pid());
        let own_after = own_ticks();
        let wrk_after = procfs::own_reaped_children_ticks();
        let machine_after = procfs::system_cpu();
        let rss_max = sampler.finish();
        if let Some(rec) = perf {
            let written = rec.finish()?;
            eprintln!("  perf: {}", written.display());
        }
        let d = |a: u64, b: u64| self.cpu_s(b.saturating_sub(a));
        let proxy_cpu_s = d(proxy_before, proxy_after);
        let origin_cpu_s = d(origin_before, origin_after);
        let load_cpu_s = d(wrk_before, wrk_after) + d(own_before, own_after);
        let other_cpu_s =
            (d(machine_before.busy, machine_after.busy) - proxy_cpu_s - origin_cpu_s - load_cpu_s)
                .max(0.0);
        let per_cpu = out.requests as f64 / proxy_cpu_s.max(1e-9);
        Ok(Measurement {
            round,
            topology,
            case: case.name.into(),
            proxy: proxy.into(),
            idle_connections,
            requests: out.requests,
            errors: out.errors,
            resumed: out.resumed,
            wall_s,
            proxy_cpu_s,
            origin_cpu_s,
            load_cpu_s,
            other_cpu_s,
            req_per_s: out.requests as f64 / wall_s.max(1e-9),
            req_per_cpu_s: per_cpu,
            mib_per_cpu_s: out
                .bytes_per_request
                .map(|b| per_cpu * b as f64 / (1024.0 * 1024.0)),
            p50_ms: out.p50_ms,
            p99_ms: out.p99_ms,
            peak_rss_kib: procfs::tree_peak_rss_kib(p.guard.pid()),
            rss_before_kib: rss_before,
            rss_max_kib: rss_max,
            loadavg_1m: load1,
            noisy: other_cpu_s > 0.1 * wall_s,
        })
    }
}

/// What a load run returns.
struct LoadOut {
    requests: u64,
    errors: u64,
    resumed: Option<u64>,
    p50_ms: f64,
    p99_ms: f64,
    bytes_per_request: Option<u64>,
}

/// HAProxy's `maxconn`: `want`, or less when RLIMIT_NOFILE `nofile` cannot hold two
/// descriptors per connection plus a margin (HAProxy refuses to start otherwise).
pub fn haproxy_maxconn(want: u32, nofile: u64) -> u32 {
    let fits = nofile.saturating_sub(256) / 2;
    want.min(u32::try_from(fits).unwrap_or(u32::MAX)).max(1)
}

/// sluice-dataplane's arguments in the suite.
pub fn sluice_args(
    yaml: &Path,
    http: u16,
    https: u16,
    admin: u16,
    workers: u32,
    batching: Batching,
    clients: Option<u32>,
) -> Vec<String> {
    let mut a = sluice::args(yaml, http, admin);
    if let Some(i) = a.iter().position(|x| x == "--workers") {
        a[i + 1] = workers.to_string();
    }
    if https != 0
        && let Some(i) = a.iter().position(|x| x == "--listen-https")
    {
        a[i + 1] = format!("127.0.0.1:{https}");
    }
    a.push(format!("--write-batching={}", batching.flag()));
    if let Some(n) = clients {
        // NB: hyper's header timer also runs while an HTTP/1.1 keep-alive connection waits
        // for its next request, so it is the keep-alive timeout here (as in `conns`).
        a.push(format!("--max-connections={}", n.saturating_add(1024)));
        a.push("--header-timeout=300s".into());
    }
    a
}

/// The `p`-th percentile (0–100) of sorted microsecond latencies, in ms.
pub fn percentile_ms(sorted_us: &[u32], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted_us.len() as f64).ceil() as usize;
    f64::from(sorted_us[rank.clamp(1, sorted_us.len()) - 1]) / 1000.0
}

/// One TLS connection, one request; returns (200?, resumed?).
async fn tls_once(
    addr: std::net::SocketAddr,
    connector: &tokio_rustls::TlsConnector,
) -> std::io::Result<(bool, bool)> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let _ = tcp.set_nodelay(true);
    let name = rustls::pki_types::ServerName::try_from(tls::HOST).map_err(std::io::Error::other)?;
    let mut s = connector.connect(name, tcp).await?;
    let resumed = s.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
    let req = format!(
        "GET {PATH} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        tls::HOST
    );
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::with_capacity(512);
    // NB: a peer closing without close_notify is an error for rustls; the response is in.
    let _ = s.read_to_end(&mut buf).await;
    Ok((buf.starts_with(b"HTTP/1.1 200"), resumed))
}

/// [`TLS_CLIENTS`] clients opening connections for `duration`.
fn tls_load(port: u16, duration: Duration, resume: bool) -> Result<LoadOut, BenchError> {
    let rt = tls::runtime()?;
    let connector = tokio_rustls::TlsConnector::from(tls::client_config_with(resume)?);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = tokio::time::Instant::now() + duration;
    let per_task = rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..TLS_CLIENTS {
            let connector = connector.clone();
            tasks.push(tokio::spawn(async move {
                let (mut lat, mut failed, mut resumed) = (Vec::new(), 0u64, 0u64);
                while tokio::time::Instant::now() < deadline {
                    let t = Instant::now();
                    match tls_once(addr, &connector).await {
                        Ok((true, r)) => {
                            lat.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
                            resumed += u64::from(r);
                        }
                        _ => failed += 1,
                    }
                }
                (lat, failed, resumed)
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            if let Ok(x) = t.await {
                all.push(x);
            }
        }
        all
    });
    let mut lat: Vec<u32> = Vec::new();
    let (mut failed, mut resumed) = (0, 0);
    for (l, f, r) in per_task {
        lat.extend(l);
        failed += f;
        resumed += r;
    }
    lat.sort_unstable();
    Ok(LoadOut {
        requests: lat.len() as u64,
        errors: failed,
        resumed: Some(resumed),
        p50_ms: percentile_ms(&lat, 50.0),
        p99_ms: percentile_ms(&lat, 99.0),
        bytes_per_request: None,
    })
}

/// Pins this process (TLS and idle clients) to `cpu`.
fn pin_self(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        let _ = Command::new("taskset")
            .args(["-a", "-p", "-c", &cpu.to_string()])
            .arg(std::process::id().to_string())
            .output();
    }
}

/// The Sluice routes of the suite: `bench/config/suite.yaml`.
pub fn suite_config(workspace: &Path) -> PathBuf {
    workspace.join("bench").join("config").join("suite.yaml")
}

/// Runs one scenario and writes `suite-<scenario>-<arch>-<time>.{json,md,svg}`.
pub fn run_suite(opts: &SuiteOptions) -> Result<(SuiteResult, Vec<PathBuf>), BenchError> {
    let started = SystemTime::now();
    let (loadavg_start, _) = loadavg();
    let nginx_bin = require("nginx")?;
    let haproxy_bin = require("haproxy")?;
    let wrk_bin = require("wrk")?;
    require("kill")?;
    if opts.perf_dir.is_some() {
        require("perf")?;
    }
    let selected = selected_cases(opts.scenario, opts.case_filter.as_deref())?;
    if probe::port_in_use(UPSTREAM_PORT) {
        return Err(BenchError::PortInUse {
            port: UPSTREAM_PORT,
        });
    }
    let sluice_bin = match &opts.sluice_bin {
        Some(p) => sluice::check_given_binary(p)?,
        None => sluice::build_release(&opts.workspace)?,
    };
    let yaml_path = suite_config(&opts.workspace);
    let suite_yaml = std::fs::read_to_string(&yaml_path).map_err(io("read", &yaml_path))?;
    let unpinned = opts.scenario == Scenario::Workers2;
    let cpus = if unpinned {
        None
    } else {
        require("taskset")?;
        pick_cpus(&allowed_cpus())
    };
    let (proxy_cpu, load_cpu) = (cpus.map(|c| c.0), cpus.map(|c| c.1));
    let topologies = if unpinned {
        vec![Topology::Unpinned]
    } else {
        opts.topologies.clone()
    };
    let workers = if unpinned { 2 } else { 1 };
    // NB: HAProxy sizes its descriptor table from maxconn (about 2 per connection) and
    // refuses to start when it cannot raise RLIMIT_NOFILE that far; it, nginx and sluice
    // inherit ours.
    let clients = if opts.scenario == Scenario::Idle {
        opts.idle_count.saturating_add(2 * CONNECTIONS)
    } else {
        10_240
    };
    let hard = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| procfs::parse_nofile_limits(&s))
        .map_or(u64::MAX, |(_, hard)| hard);
    let nofile = conns::raise_nofile((u64::from(clients) * 2 + 8192).min(hard))?;
    let haproxy_maxconn = haproxy_maxconn(clients.saturating_add(1024), nofile);
    if haproxy_maxconn < clients {
        eprintln!(
            "sluice-bench suite: WARNING: RLIMIT_NOFILE {nofile} lets HAProxy hold only \
             {haproxy_maxconn} connections (it reserves two descriptors per connection); \
             use a smaller --idle-count or raise the hard limit"
        );
    }
    pin_self(load_cpu);

    // Bodies for the downloads, certificates for TLS.
    let files_root = TempDir::new("suite-files")?;
    if opts.scenario == Scenario::Large {
        let dir = files_root.path().join("files");
        std::fs::create_dir_all(&dir).map_err(io("create dir", &dir))?;
        for (name, mib) in [("1m", 1usize), ("64m", 64)] {
            let path = dir.join(name);
            std::fs::write(&path, vec![b'x'; mib * 1024 * 1024]).map_err(io("write", &path))?;
        }
    }
    let certs = TempDir::new("suite-certs")?;
    if opts.scenario == Scenario::Churn {
        require("openssl")?;
        for key in [tls::Key::Ecdsa, tls::Key::Rsa] {
            let (crt, k) = tls::make_cert(certs.path(), key)?;
            let pem = crt.with_extension("pem");
            let read = |p: &Path| std::fs::read_to_string(p).map_err(io("read", p));
            let text = format!("{}{}", read(&crt)?, read(&k)?);
            std::fs::write(&pem, text).map_err(io("write", &pem))?;
        }
    }
    let ctx = Ctx {
        opts,
        nginx: nginx_bin,
        haproxy: haproxy_bin,
        wrk: wrk_bin,
        sluice: sluice_bin,
        proxy_cpu,
        load_cpu,
        clk_tck: procfs::clock_ticks_per_sec(),
        files: files_root.path(),
        certs: certs.path(),
        suite_yaml,
        haproxy_maxconn,
    };

    let mut measurements = Vec::new();
    for &topology in &topologies {
        let origin_cpu = match topology {
            Topology::OriginOnProxyCore => proxy_cpu,
            Topology::OriginOffProxyCore => load_cpu,
            Topology::Unpinned => None,
        };
        let odir = TempDir::new("suite-origin")?;
        let conf = nginx::origin_conf(odir.path(), UPSTREAM_PORT, workers, ctx.files);
        let cpath = odir.path().join("nginx.conf");
        std::fs::write(&cpath, conf).map_err(io("write", &cpath))?;
        let origin = ProcessGuard::spawn(
            "origin nginx",
            pinned(origin_cpu, &ctx.nginx, &nginx::args(odir.path())),
            &odir.path().join("stdout.log"),
        )?;
        probe::wait_for_hello(UPSTREAM_PORT, PATH, opts.ready_timeout, || Ok(())).map_err(
            |detail| BenchError::NotReady {
                what: "origin nginx".into(),
                detail,
            },
        )?;
        for round in 1..=opts.repeat {
            for case in selected.iter().cloned() {
                let mut order = proxies(opts.scenario);
                if round % 2 == 0 {
                    order.reverse();
                }
                for kind in order {
                    let label = kind.label();
                    eprintln!(
                        "sluice-bench suite {}: round {round}, {}, {}, {label}",
                        opts.scenario.name(),
                        topology.label(),
                        case.name
                    );
                    match measure_proxy(&ctx, kind, &case, workers, &origin, round, topology) {
                        Ok(ms) => {
                            for m in &ms {
                                eprintln!(
                                    "  {} idle: {:.0} req/s, {:.0} req/CPU-s, p99 {:.2} ms, errors {}, RSS {:.1}→{:.1} MiB, other {:.2} CPU-s, load {:.2}",
                                    m.idle_connections,
                                    m.req_per_s,
                                    m.req_per_cpu_s,
                                    m.p99_ms,
                                    m.errors,
                                    m.rss_before_kib as f64 / 1024.0,
                                    m.rss_max_kib as f64 / 1024.0,
                                    m.other_cpu_s,
                                    m.loadavg_1m
                                );
                            }
                            measurements.extend(ms);
                        }
                        Err(e) => eprintln!("sluice-bench suite: {label} failed: {e}"),
                    }
                }
            }
        }
        drop(origin);
    }

    let mut result = SuiteResult {
        schema_version: SCHEMA_VERSION,
        scenario: opts.scenario,
        timestamp: machine::timestamp_utc(started),
        machine: machine::collect(
            &opts.workspace,
            nginx::version(&ctx.nginx).unwrap_or_else(|| "unknown".into()),
            machine::wrk_version(&ctx.wrk),
            None,
        ),
        haproxy_version: haproxy::version(&ctx.haproxy).unwrap_or_else(|| "unknown".into()),
        loadavg_start,
        duration_s: opts.duration.as_secs_f64().ceil(),
        warmup_s: opts.warmup.as_secs_f64().ceil(),
        rounds: opts.repeat,
        proxy_cpu,
        load_cpu,
        measurements,
        targets: Vec::new(),
        profiled: opts.perf_dir.is_some(),
    };
    result.targets = targets(&result);
    let written = write_results(&result, &opts.results, opts.case_filter.is_none())?;
    Ok((result, written))
}

/// Starts one proxy, warms it up and measures it (twice in `idle`: without, then with the
/// idle connections).
fn measure_proxy(
    ctx: &Ctx<'_>,
    kind: ProxyKind,
    case: &Case,
    workers: u32,
    origin: &ProcessGuard,
    round: u32,
    topology: Topology,
) -> Result<Vec<Measurement>, BenchError> {
    let p = ctx.start(kind, case, workers)?;
    let label = kind.label();
    if !ctx.opts.warmup.is_zero() {
        ctx.run(
            &p,
            origin,
            case,
            ctx.opts.warmup,
            round,
            topology,
            &label,
            0,
            false,
        )?;
    }
    let mut out = vec![ctx.run(
        &p,
        origin,
        case,
        ctx.opts.duration,
        round,
        topology,
        &label,
        0,
        true,
    )?];
    if ctx.opts.scenario == Scenario::Idle {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], p.port));
        let opened = conns::open_all(addr, conns::Load::IdleKeepAlive, ctx.opts.idle_count, 64)?;
        if opened.failed > 0 {
            eprintln!(
                "sluice-bench suite: {label}: {} idle connections failed to open ({})",
                opened.failed,
                opened.first_error.as_deref().unwrap_or("?")
            );
        }
        let held = opened.streams.len() as u64;
        // Sluice parks an idle connection 250-350 ms after its request and trims its heap
        // within a second of that; 3.5 s is the wait of older runs, kept so that results
        // stay comparable (the same wait for every proxy).
        std::thread::sleep(Duration::from_millis(3500));
        let m = ctx.run(
            &p,
            origin,
            case,
            ctx.opts.duration,
            round,
            topology,
            &label,
            held,
            true,
        )?;
        // NB: still open at the end? The proxy must not have dropped them under load.
        drop(opened);
        out.push(m);
    }
    drop(p);
    Ok(out)
}

/// The median of finite values; NaN when none.
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Rows of one (topology, case, idle) group: per proxy, the medians over rounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Proxy row name.
    pub proxy: String,
    /// Median req/s.
    pub req_per_s: f64,
    /// Median req/CPU-s.
    pub req_per_cpu_s: f64,
    /// Median MiB/CPU-s.
    pub mib_per_cpu_s: Option<f64>,
    /// Median p50.
    pub p50_ms: f64,
    /// Median p99.
    pub p99_ms: f64,
    /// Highest peak RSS, KiB.
    pub peak_rss_kib: u64,
    /// Largest rise of VmRSS during a run over the value before it, KiB.
    pub rss_rise_kib: i64,
    /// Highest VmRSS during the runs, KiB.
    pub rss_max_kib: u64,
    /// Errors, summed.
    pub errors: u64,
    /// Resumed TLS connections ÷ connections (TLS churn).
    pub resumed_share: Option<f64>,
    /// Rounds in which it was noisy.
    pub noisy_rounds: usize,
    /// Rounds measured.
    pub rounds: usize,
}

/// A group: one table in the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// Topology.
    pub topology: Topology,
    /// Case.
    pub case: String,
    /// Idle connections held (0 or the idle count).
    pub idle: bool,
    /// Per proxy, in first-seen order.
    pub rows: Vec<Row>,
    /// Per sluice row: (name, median of per-round ÷ nginx, median of per-round ÷ haproxy)
    /// of req/CPU-s.
    pub ratios: Vec<(String, f64, f64)>,
}

/// Groups the measurements and takes medians over rounds.
pub fn groups(ms: &[Measurement]) -> Vec<Group> {
    let mut keys: Vec<(Topology, String, bool)> = Vec::new();
    for m in ms {
        let k = (m.topology, m.case.clone(), m.idle_connections > 0);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|(topology, case, idle)| {
            let in_group: Vec<&Measurement> = ms
                .iter()
                .filter(|m| {
                    m.topology == topology && m.case == case && (m.idle_connections > 0) == idle
                })
                .collect();
            let mut names: Vec<String> = Vec::new();
            for m in &in_group {
                if !names.contains(&m.proxy) {
                    names.push(m.proxy.clone());
                }
            }
            let rows: Vec<Row> = names
                .iter()
                .map(|name| {
                    let v: Vec<&&Measurement> =
                        in_group.iter().filter(|m| &m.proxy == name).collect();
                    let requests: u64 = v.iter().map(|m| m.requests).sum();
                    Row {
                        proxy: name.clone(),
                        req_per_s: median(v.iter().map(|m| m.req_per_s)),
                        req_per_cpu_s: median(v.iter().map(|m| m.req_per_cpu_s)),
                        mib_per_cpu_s: v
                            .iter()
                            .any(|m| m.mib_per_cpu_s.is_some())
                            .then(|| median(v.iter().filter_map(|m| m.mib_per_cpu_s))),
                        p50_ms: median(v.iter().map(|m| m.p50_ms)),
                        p99_ms: median(v.iter().map(|m| m.p99_ms)),
                        peak_rss_kib: v.iter().map(|m| m.peak_rss_kib).max().unwrap_or(0),
                        rss_rise_kib: v
                            .iter()
                            .map(|m| m.rss_max_kib as i64 - m.rss_before_kib as i64)
                            .max()
                            .unwrap_or(0),
                        rss_max_kib: v.iter().map(|m| m.rss_max_kib).max().unwrap_or(0),
                        errors: v.iter().map(|m| m.errors).sum(),
                        resumed_share: v.iter().any(|m| m.resumed.is_some()).then(|| {
                            v.iter().filter_map(|m| m.resumed).sum::<u64>() as f64
                                / requests.max(1) as f64
                        }),
                        noisy_rounds: v.iter().filter(|m| m.noisy).count(),
                        rounds: v.len(),
                    }
                })
                .collect();
            let per_round = |name: &str, base: &str| {
                median(in_group.iter().filter(|m| m.proxy == name).filter_map(|m| {
                    in_group
                        .iter()
                        .find(|b| b.proxy == base && b.round == m.round)
                        .map(|b| m.req_per_cpu_s / b.req_per_cpu_s)
                }))
            };
            let ratios = names
                .iter()
                .filter(|n| n.starts_with("sluice"))
                .map(|n| (n.clone(), per_round(n, "nginx"), per_round(n, "haproxy")))
                .collect();
            Group {
                topology,
                case,
                idle,
                rows,
                ratios,
            }
        })
        .collect()
}

fn row<'a>(g: &'a Group, proxy: &str) -> Option<&'a Row> {
    g.rows.iter().find(|r| r.proxy == proxy)
}

fn ratio_of(g: &Group, sluice: &str, vs_haproxy: bool) -> Option<f64> {
    g.ratios
        .iter()
        .find(|(n, _, _)| n == sluice)
        .map(|(_, a, b)| if vs_haproxy { *b } else { *a })
        .filter(|x| x.is_finite())
}

/// Issue 21's targets, checked against the medians of a result.
pub fn targets(r: &SuiteResult) -> Vec<Target> {
    let gs = groups(&r.measurements);
    let mut out = Vec::new();
    let mut push = |what: String, value: Option<f64>, goal: &str, met: &dyn Fn(f64) -> bool| {
        if let Some(v) = value {
            out.push(Target {
                what,
                value: v,
                goal: goal.into(),
                met: met(v),
            });
        }
    };
    for g in &gs {
        let at = format!("{}, {}", g.case, g.topology.label());
        match r.scenario {
            Scenario::Keepalive => {
                push(
                    format!("{at}: {SLUICE_OF_RECORD} ÷ nginx req/CPU-s"),
                    ratio_of(g, SLUICE_OF_RECORD, false),
                    "≥ 1.20",
                    &|v| v >= 1.2,
                );
                push(
                    format!("{at}: {SLUICE_OF_RECORD} ÷ haproxy req/CPU-s"),
                    ratio_of(g, SLUICE_OF_RECORD, true),
                    "≥ 1.15",
                    &|v| v >= 1.15,
                );
            }
            Scenario::Churn => push(
                format!("{at}: sluice ÷ nginx req/CPU-s"),
                ratio_of(g, SLUICE_OF_RECORD, false),
                "≥ 1.10",
                &|v| v >= 1.1,
            ),
            Scenario::Large => {
                push(
                    format!("{at}: sluice ÷ nginx per CPU-s"),
                    ratio_of(g, SLUICE_OF_RECORD, false),
                    "≥ 1.00",
                    &|v| v >= 1.0,
                );
                if let Some(s) = row(g, SLUICE_OF_RECORD) {
                    push(
                        format!("{at}: sluice RSS rise during the run (MiB)"),
                        Some(s.rss_rise_kib as f64 / 1024.0),
                        "≤ 16 (flat)",
                        &|v| v <= 16.0,
                    );
                }
            }
            Scenario::Idle if g.idle => {
                if let (Some(s), Some(n)) = (row(g, SLUICE_OF_RECORD), row(g, "nginx")) {
                    push(
                        format!("{at}: sluice ÷ nginx RSS with the idle connections"),
                        Some(s.rss_max_kib as f64 / n.rss_max_kib.max(1) as f64),
                        "≤ 1.50",
                        &|v| v <= 1.5,
                    );
                }
                let without = gs
                    .iter()
                    .find(|h| !h.idle && h.topology == g.topology && h.case == g.case);
                if let (Some(s), Some(w)) = (
                    row(g, SLUICE_OF_RECORD),
                    without.and_then(|w| row(w, SLUICE_OF_RECORD)),
                ) {
                    push(
                        format!("{at}: sluice loaded p99 with ÷ without the idle connections"),
                        Some(s.p99_ms / w.p99_ms),
                        "≤ 1.20",
                        &|v| v <= 1.2,
                    );
                }
            }
            Scenario::Idle | Scenario::Workers2 => {}
        }
    }
    out
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

fn fmt_ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}×")
    } else {
        "-".into()
    }
}

/// The markdown report.
pub fn render_markdown(r: &SuiteResult) -> String {
    let m = &r.machine;
    let mut out = format!(
        "# sluice-bench suite: {scenario} ({ts})\n\n\
         - machine: {arch}, {nproc} CPUs, {cpu}, kernel {kernel}\n\
         - versions: {nginx}, {haproxy}, {wrk}; sluice at {commit}{dirty}\n\
         - load average at the start: `{load}` (the machine is shared; see the `other CPU-s` and `load` columns)\n\
         - {dur} s measured after a {warm} s warm-up, {rounds} round(s), medians over rounds; proxy CPU {pcpu}, load generator CPU {lcpu}\n\n",
        scenario = r.scenario.name(),
        ts = r.timestamp,
        arch = m.arch,
        nproc = m.nproc,
        cpu = m.cpu_model,
        kernel = m.kernel,
        nginx = m.nginx_version,
        haproxy = r.haproxy_version,
        wrk = m.wrk_version,
        commit = m.git_commit.get(..12).unwrap_or(&m.git_commit),
        dirty = if m.git_dirty { " (dirty)" } else { "" },
        load = r.loadavg_start,
        dur = r.duration_s,
        warm = r.warmup_s,
        rounds = r.rounds,
        pcpu = r
            .proxy_cpu
            .map_or_else(|| "unpinned".into(), |c| c.to_string()),
        lcpu = r
            .load_cpu
            .map_or_else(|| "unpinned".into(), |c| c.to_string()),
    );
    if r.profiled {
        out.push_str(
            "**Profiled run** (`--perf`): every proxy ran under `perf record`; the sampling \
             perturbs these figures, which are not figures of record.\n\n",
        );
    }
    let large = r.scenario == Scenario::Large;
    for g in groups(&r.measurements) {
        out.push_str(&format!(
            "## {}{} — {}\n\n| proxy | req/s | req/CPU-s |{} p50 ms | p99 ms | peak RSS MiB | RSS max in run MiB | RSS rise in run MiB | errors |{} noisy rounds |\n|---|---:|---:|{}---:|---:|---:|---:|---:|---:|{}---:|\n",
            g.case,
            if g.idle {
                " + idle keep-alive connections"
            } else {
                ""
            },
            g.topology.label(),
            if large { " MiB/CPU-s |" } else { "" },
            if r.scenario == Scenario::Churn { " resumed |" } else { "" },
            if large { "---:|" } else { "" },
            if r.scenario == Scenario::Churn { "---:|" } else { "" },
        ));
        for row in &g.rows {
            out.push_str(&format!(
                "| {} | {:.0} | {:.0} |{} {:.2} | {:.2} | {} | {} | {:.1} | {} |{} {}/{} |\n",
                row.proxy,
                row.req_per_s,
                row.req_per_cpu_s,
                row.mib_per_cpu_s
                    .map_or_else(String::new, |x| format!(" {x:.0} |")),
                row.p50_ms,
                row.p99_ms,
                mib(row.peak_rss_kib),
                mib(row.rss_max_kib),
                row.rss_rise_kib as f64 / 1024.0,
                if row.errors > 0 {
                    format!("**{}**", row.errors)
                } else {
                    "0".into()
                },
                row.resumed_share
                    .map_or_else(String::new, |x| format!(" {:.0}% |", x * 100.0)),
                row.noisy_rounds,
                row.rounds,
            ));
        }
        out.push('\n');
        for (name, n, h) in &g.ratios {
            out.push_str(&format!(
                "- {name} ÷ nginx req/CPU-s: **{}**; ÷ haproxy: **{}**",
                fmt_ratio(*n),
                fmt_ratio(*h)
            ));
            if let (Some(s), Some(nx), Some(hx)) =
                (row(&g, name), row(&g, "nginx"), row(&g, "haproxy"))
            {
                out.push_str(&format!(
                    "; p99 ÷ nginx {}, ÷ haproxy {}; peak RSS ÷ nginx {}",
                    fmt_ratio(s.p99_ms / nx.p99_ms),
                    fmt_ratio(s.p99_ms / hx.p99_ms),
                    fmt_ratio(s.peak_rss_kib as f64 / nx.peak_rss_kib.max(1) as f64)
                ));
            }
            out.push('\n');
        }
        out.push('\n');
    }
    if !r.targets.is_empty() {
        out.push_str(
            "## Targets (issue 21)\n\n| what | measured | target | met |\n|---|---:|---|---|\n",
        );
        for t in &r.targets {
            out.push_str(&format!(
                "| {} | {:.2} | {} | {} |\n",
                t.what,
                t.value,
                t.goal,
                if t.met { "yes" } else { "**no**" }
            ));
        }
        out.push('\n');
    }
    out.push_str("## Runs\n\n| round | topology | case | proxy | idle | req | req/CPU-s | p99 ms | proxy CPU-s | origin CPU-s | load CPU-s | other CPU-s | load 1m |\n|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for x in &r.measurements {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}{} | {:.2} |\n",
            x.round,
            x.topology.label(),
            x.case,
            x.proxy,
            x.idle_connections,
            x.requests,
            x.req_per_cpu_s,
            x.p99_ms,
            x.proxy_cpu_s,
            x.origin_cpu_s,
            x.load_cpu_s,
            x.other_cpu_s,
            if x.noisy { " NOISY" } else { "" },
            x.loadavg_1m
        ));
    }
    out
}

/// The chart: per group, each proxy's req/CPU-s ÷ nginx's (nginx = 1.0).
pub fn render_svg(r: &SuiteResult) -> String {
    let gs = groups(&r.measurements);
    let mut names: Vec<String> = Vec::new();
    for g in &gs {
        for row in &g.rows {
            if !names.contains(&row.proxy) {
                names.push(row.proxy.clone());
            }
        }
    }
    let bars: Vec<crate::chart::SeriesGroup> = gs
        .iter()
        .map(|g| crate::chart::SeriesGroup {
            name: format!(
                "{}{} ({})",
                g.case,
                if g.idle { " + idle" } else { "" },
                match g.topology {
                    Topology::OriginOnProxyCore => "origin on",
                    Topology::OriginOffProxyCore => "origin off",
                    Topology::Unpinned => "2 workers",
                }
            ),
            values: names
                .iter()
                .map(|n| {
                    let base = row(g, "nginx").map(|x| x.req_per_cpu_s);
                    row(g, n)
                        .zip(base)
                        .map(|(x, b)| x.req_per_cpu_s / b)
                        .filter(|x| x.is_finite())
                })
                .collect(),
        })
        .collect();
    crate::chart::render_series_svg(
        &format!(
            "sluice-bench suite {}: requests per proxy CPU-second ÷ nginx's ({}, {})",
            r.scenario.name(),
            r.machine.arch,
            r.timestamp
        ),
        &names,
        &bars,
    )
}

/// Writes `suite-<scenario>-<arch>-<timestamp>.{json,md,svg}` to the history and, for a run
/// of every case (no `--case`), the `latest-suite-<scenario>-<arch>.*` copies.
pub fn write_results(
    r: &SuiteResult,
    dirs: &crate::results::ResultsDirs,
    publish: bool,
) -> Result<Vec<PathBuf>, BenchError> {
    let arch = r.machine.file_arch();
    let name = r.scenario.name();
    let json = serde_json::to_string_pretty(r).map_err(|e| BenchError::Json {
        path: dirs.history.clone(),
        source: e,
    })? + "\n";
    let files = [
        ("json", json),
        ("md", render_markdown(r)),
        ("svg", render_svg(r)),
    ];
    let mut written = Vec::new();
    for (ext, text) in &files {
        written
            .push(dirs.write_history(&format!("suite-{name}-{arch}-{}.{ext}", r.timestamp), text)?);
        if publish {
            dirs.write_latest(&format!("latest-suite-{name}-{arch}.{ext}"), text)?;
        }
    }
    Ok(written)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_has_cases_and_all_three_proxies() {
        for s in [
            Scenario::Keepalive,
            Scenario::Churn,
            Scenario::Large,
            Scenario::Idle,
            Scenario::Workers2,
        ] {
            assert!(!cases(s).is_empty(), "{s:?}");
            let p: Vec<String> = proxies(s).into_iter().map(ProxyKind::label).collect();
            assert!(p.contains(&"nginx".to_owned()));
            assert!(p.contains(&"haproxy".to_owned()));
            assert!(p.contains(&SLUICE_OF_RECORD.to_owned()), "{s:?}: {p:?}");
        }
        let k: Vec<String> = proxies(Scenario::Keepalive)
            .into_iter()
            .map(ProxyKind::label)
            .collect();
        assert!(k.contains(&"sluice (auto)".to_owned()) && k.contains(&"sluice (off)".to_owned()));
        let churn = cases(Scenario::Churn);
        assert_eq!(
            churn
                .iter()
                .filter(|c| c.load == LoadSpec::Tls { resume: true })
                .count(),
            1
        );
        assert!(churn.iter().any(|c| c.tls == Some(tls::Key::Rsa)));
        assert!(cases(Scenario::Large).iter().all(|c| c.stream_bodies));
    }

    #[test]
    fn wrk_arguments() {
        let churn = &cases(Scenario::Churn)[0];
        let a = wrk_args(&churn.load, 9081, Duration::from_secs(5), None);
        assert_eq!(
            a,
            [
                "-t1",
                "-c64",
                "-d5s",
                "--latency",
                "-H",
                "Connection: close",
                "http://127.0.0.1:9081/hello"
            ]
        );
        let up = cases(Scenario::Large)
            .into_iter()
            .find(|c| c.name.starts_with("upload"))
            .unwrap();
        let a = wrk_args(
            &up.load,
            1,
            Duration::from_secs(5),
            Some(Path::new("/t/u.lua")),
        );
        assert!(a.contains(&"--timeout=30s".to_owned()), "{a:?}");
        assert!(a.ends_with(&[
            "-s".into(),
            "/t/u.lua".into(),
            "http://127.0.0.1:1/upload".into()
        ]));
        let s = upload_script(10);
        assert!(s.contains("wrk.method = \"POST\""));
        assert!(s.contains("string.rep(\"x\", 10)"));
        assert!(
            wrk_args(
                &LoadSpec::Tls { resume: false },
                1,
                Duration::from_secs(1),
                None
            )
            .is_empty()
        );
    }

    #[test]
    fn dataplane_flags() {
        let a = sluice_args(Path::new("/c.yaml"), 1, 0, 2, 1, Batching::Send, None);
        assert!(a.contains(&"--write-batching=send".to_owned()));
        let w = a.iter().position(|x| x == "--workers").unwrap();
        assert_eq!(a[w + 1], "1");
        let h = a.iter().position(|x| x == "--listen-https").unwrap();
        assert_eq!(a[h + 1], "127.0.0.1:0");
        assert!(!a.iter().any(|x| x.starts_with("--max-connections")));
        let a = sluice_args(
            Path::new("/c.yaml"),
            1,
            8443,
            2,
            2,
            Batching::Off,
            Some(10_128),
        );
        assert_eq!(a[a.iter().position(|x| x == "--workers").unwrap() + 1], "2");
        assert_eq!(
            a[a.iter().position(|x| x == "--listen-https").unwrap() + 1],
            "127.0.0.1:8443"
        );
        for f in [
            "--write-batching=off",
            "--max-connections=11152",
            "--header-timeout=300s",
        ] {
            assert!(a.contains(&f.to_owned()), "{f} in {a:?}");
        }
    }

    #[test]
    fn haproxy_connections_fit_the_descriptor_limit() {
        assert_eq!(haproxy_maxconn(11_264, 100_000), 11_264);
        assert_eq!(haproxy_maxconn(11_264, 20_000), 9_872);
        assert_eq!(haproxy_maxconn(11_264, u64::MAX), 11_264);
        assert_eq!(haproxy_maxconn(5, 0), 1);
    }

    #[test]
    fn percentiles() {
        let v: Vec<u32> = (1..=100).map(|x| x * 1000).collect();
        assert_eq!(percentile_ms(&v, 50.0), 50.0);
        assert_eq!(percentile_ms(&v, 99.0), 99.0);
        assert_eq!(percentile_ms(&[7000], 99.0), 7.0);
        assert!(percentile_ms(&[], 50.0).is_nan());
    }

    fn m(
        round: u32,
        topology: Topology,
        proxy: &str,
        per_cpu: f64,
        idle: u64,
        p99: f64,
    ) -> Measurement {
        Measurement {
            round,
            topology,
            case: "keep-alive GET /hello".into(),
            proxy: proxy.into(),
            idle_connections: idle,
            requests: 1000,
            errors: 0,
            resumed: None,
            wall_s: 5.0,
            proxy_cpu_s: 1000.0 / per_cpu,
            origin_cpu_s: 1.0,
            load_cpu_s: 1.0,
            other_cpu_s: 0.0,
            req_per_s: 200.0,
            req_per_cpu_s: per_cpu,
            mib_per_cpu_s: None,
            p50_ms: 0.5,
            p99_ms: p99,
            peak_rss_kib: 10_240,
            rss_before_kib: 8192,
            rss_max_kib: if idle > 0 { 40_960 } else { 9216 },
            loadavg_1m: 1.0,
            noisy: false,
        }
    }

    fn result(scenario: Scenario, measurements: Vec<Measurement>) -> SuiteResult {
        SuiteResult {
            schema_version: SCHEMA_VERSION,
            scenario,
            timestamp: "20260101T000000Z".into(),
            machine: MachineInfo {
                arch: "x86_64".into(),
                nproc: 2,
                kernel: "6".into(),
                cpu_model: "cpu".into(),
                nginx_version: "nginx/1.22.1".into(),
                wrk_version: "wrk 4.1.0".into(),
                git_commit: "0123456789abcdef".into(),
                git_dirty: false,
                emulation: None,
            },
            haproxy_version: "HAProxy 2.6.12".into(),
            loadavg_start: "1.00 1.00 1.00 1/100 1".into(),
            duration_s: 5.0,
            warmup_s: 2.0,
            rounds: 2,
            proxy_cpu: Some(0),
            load_cpu: Some(1),
            measurements,
            targets: Vec::new(),
            profiled: false,
        }
    }

    #[test]
    fn a_case_filter_picks_by_name_and_names_the_cases_when_none_matches() {
        let picked = selected_cases(Scenario::Large, Some("upload")).unwrap();
        assert_eq!(
            picked.iter().map(|c| c.name).collect::<Vec<_>>(),
            ["upload 10 MiB"]
        );
        assert_eq!(
            selected_cases(Scenario::Churn, None).unwrap().len(),
            cases(Scenario::Churn).len()
        );
        let err = selected_cases(Scenario::Large, Some("nothing")).unwrap_err();
        assert!(err.to_string().contains("download 1 MiB"), "{err}");
    }

    #[test]
    fn medians_ratios_and_targets_per_topology() {
        let off = Topology::OriginOffProxyCore;
        let on = Topology::OriginOnProxyCore;
        let ms = vec![
            m(1, off, "nginx", 100.0, 0, 1.0),
            m(1, off, "haproxy", 110.0, 0, 1.0),
            m(1, off, SLUICE_OF_RECORD, 130.0, 0, 1.0),
            m(2, off, "nginx", 200.0, 0, 1.0),
            m(2, off, "haproxy", 200.0, 0, 1.0),
            m(2, off, SLUICE_OF_RECORD, 260.0, 0, 1.0),
            m(1, on, "nginx", 100.0, 0, 1.0),
            m(1, on, "haproxy", 100.0, 0, 1.0),
            m(1, on, SLUICE_OF_RECORD, 110.0, 0, 1.0),
        ];
        let gs = groups(&ms);
        assert_eq!(gs.len(), 2);
        let g = &gs[0];
        assert_eq!(g.topology, off);
        assert_eq!(row(g, "nginx").unwrap().req_per_cpu_s, 150.0);
        // Per-round ratios: 1.30 and 1.30 vs nginx; 130/110 and 1.30 vs haproxy.
        let (_, n, h) = &g.ratios[0];
        assert!((n - 1.3).abs() < 1e-9, "{n}");
        assert!((h - (130.0 / 110.0 + 1.3) / 2.0).abs() < 1e-9, "{h}");
        let mut r = result(Scenario::Keepalive, ms);
        r.targets = targets(&r);
        assert_eq!(r.targets.len(), 4);
        assert!(r.targets[0].met && r.targets[1].met, "{:?}", r.targets);
        assert!(!r.targets[2].met && !r.targets[3].met, "{:?}", r.targets);
        let md = render_markdown(&r);
        assert!(
            md.contains("## keep-alive GET /hello — origin off the proxy's core"),
            "{md}"
        );
        assert!(
            md.contains("sluice (send) ÷ nginx req/CPU-s: **1.30×**"),
            "{md}"
        );
        assert!(md.contains("| no |") || md.contains("**no**"), "{md}");
        assert!(md.contains("HAProxy 2.6.12"));
        assert!(md.contains("1.00 1.00 1.00"), "load average is recorded");
        let svg = render_svg(&r);
        assert!(svg.contains(">1.30<"), "{svg}");
        // JSON round trip.
        let back: SuiteResult = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn idle_targets_compare_rss_with_nginx_and_p99_with_the_quiet_run() {
        let off = Topology::OriginOffProxyCore;
        let ms = vec![
            m(1, off, "nginx", 100.0, 0, 1.0),
            m(1, off, "nginx", 100.0, 10_000, 1.1),
            m(1, off, "haproxy", 100.0, 0, 1.0),
            m(1, off, SLUICE_OF_RECORD, 100.0, 0, 1.0),
            m(1, off, SLUICE_OF_RECORD, 100.0, 10_000, 1.5),
        ];
        let r = result(Scenario::Idle, ms);
        let t = targets(&r);
        assert_eq!(t.len(), 2, "{t:?}");
        assert!(t[0].what.contains("RSS") && t[0].met, "{t:?}");
        assert!(t[1].what.contains("p99") && !t[1].met && (t[1].value - 1.5).abs() < 1e-9);
        assert!(render_markdown(&r).contains("+ idle keep-alive connections"));
    }
}
