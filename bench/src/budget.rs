//! `sluice-bench suite --scenario logger|forward-auth`: issue 19's plugin budgets, each
//! measured side by side in the same seconds.
//!
//! ```text
//!   load CPU (1)                                     proxy CPU (0)
//!   wrk A (32 conns) ──────────────────────────────▶ proxy with the plugins ─┐
//!   wrk B (32 conns) ──────────────────────────────▶ proxy without them ─────┼─▶ nginx origin :1980
//!   log sink (this process) ◀── http-logger batches                          └─▶ auth service (nginx)
//! ```
//!
//! - `logger`: two instances of the same sluice-dataplane, one with the plugin list of
//!   `bench/config/budget.yaml` (`logger.plugins`: http-logger to a log sink inside this
//!   process, APISIX's batch defaults) on scenario 1's route, one without; requests per
//!   CPU-second of each and their ratio against the budget. The sink counts the entries it
//!   receives; a run where it got none is reported as INVALID.
//! - `forward-auth`: Sluice with forward-auth beside Sluice without it, then nginx with
//!   `auth_request` beside nginx without it, both proxies asking the same auth service (an
//!   nginx answering `200` with `X-User`, or `403` when the request carries `X-Deny`); p50
//!   and p99 of each and the latency auth adds, per proxy. Before measuring, a request with
//!   `X-Deny` must get 403 through both auth proxies and 200 through both plain ones.
//!
//! Each pair is loaded by two wrk processes with half the connections each, after a warm-up
//! done the same way; the start order alternates between rounds. CPU time: the dataplane's
//! threads' scheduler time (`/proc/<pid>/task/*/schedstat`), nginx's process tree in ticks.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::BenchError;
use crate::machine::{self, MachineInfo};
use crate::nginx::{self, SuiteProxy};
use crate::process::{ProcessGuard, TempDir};
use crate::runner::{PATH, UPSTREAM_PORT, allowed_cpus, pick_cpus, pinned, require};
use crate::{probe, procfs, sluice, wrk};

/// Version of the JSON layout.
pub const SCHEMA_VERSION: u32 = 1;
/// wrk connections per proxy of a pair (half the benchmark's 64).
pub const CONNECTIONS_EACH: u32 = 32;
/// Largest request head the log sink reads.
const SINK_MAX_HEAD: usize = 64 * 1024;
/// Largest batch the log sink reads.
const SINK_MAX_BODY: usize = 256 * 1024 * 1024;

/// The plugin-budget scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BudgetScenario {
    /// http-logger and opentelemetry (always_on) on the route, with and without.
    Logger,
    /// opentelemetry with sampling off on the route, with and without.
    TracingOff,
    /// forward-auth against nginx's auth_request.
    ForwardAuth,
}

impl BudgetScenario {
    /// The name on the command line, in budget.yaml and in file names.
    pub fn name(self) -> &'static str {
        match self {
            BudgetScenario::Logger => "logger",
            BudgetScenario::TracingOff => "tracing-off",
            BudgetScenario::ForwardAuth => "forward-auth",
        }
    }
}

/// One plugin of a scenario's list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginSpec {
    /// APISIX plugin name.
    pub name: String,
    /// Its configuration (placeholders allowed).
    #[serde(default)]
    pub config: serde_json::Value,
}

/// One scenario of `bench/config/budget.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioConf {
    /// Lowest acceptable with ÷ without requests per CPU-second.
    #[serde(default)]
    pub budget: Option<f64>,
    /// What the budget covers.
    #[serde(default)]
    pub budget_note: Option<String>,
    /// The plugins put on the route.
    pub plugins: Vec<PluginSpec>,
    /// Plugin metadata (`--plugin-metadata`) given to both instances, placeholders
    /// allowed; none when absent.
    #[serde(default)]
    pub plugin_metadata: Option<serde_json::Value>,
}

/// `bench/config/budget.yaml`.
pub fn budget_config(workspace: &Path) -> PathBuf {
    workspace.join("bench").join("config").join("budget.yaml")
}

/// Reads a scenario from the text of `budget.yaml`.
pub fn parse_scenario_conf(text: &str, scenario: BudgetScenario) -> Result<ScenarioConf, String> {
    let all: BTreeMap<String, ScenarioConf> =
        serde_yaml::from_str(text).map_err(|e| format!("budget.yaml: {e}"))?;
    let conf = all
        .get(scenario.name())
        .cloned()
        .ok_or_else(|| format!("budget.yaml: no scenario {:?}", scenario.name()))?;
    if conf.plugins.is_empty() {
        return Err(format!(
            "budget.yaml: {}.plugins: is empty, nothing to measure",
            scenario.name()
        ));
    }
    Ok(conf)
}

/// The plugin list with `${NAME}` placeholders replaced by `vars`; an unknown one left in
/// is an error.
pub fn substitute(
    plugins: &[PluginSpec],
    vars: &[(&str, String)],
) -> Result<Vec<PluginSpec>, String> {
    let mut text = serde_json::to_string(plugins).map_err(|e| e.to_string())?;
    for (k, v) in vars {
        text = text.replace(&format!("${{{k}}}"), v);
    }
    if let Some(i) = text.find("${") {
        let rest: String = text[i..].chars().take(40).collect();
        return Err(format!("budget.yaml: unknown placeholder at {rest:?}"));
    }
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

/// `value` with `${NAME}` placeholders replaced by `vars`; an unknown one left in is an
/// error.
pub fn substitute_value(
    value: &serde_json::Value,
    vars: &[(&str, String)],
) -> Result<serde_json::Value, String> {
    let spec = PluginSpec {
        name: String::new(),
        config: value.clone(),
    };
    let mut out = substitute(&[spec], vars)?;
    Ok(out.pop().map(|p| p.config).unwrap_or_default())
}

/// Scenario 1's Sluice config (`base`, multi-document YAML) with `plugins` on the first rule
/// of its ApisixRoute; `base` unchanged (re-serialised) when `plugins` is empty.
pub fn route_yaml(base: &str, plugins: &[PluginSpec]) -> Result<String, String> {
    let mut out = Vec::new();
    let mut found = false;
    for doc in serde_yaml::Deserializer::from_str(base) {
        let mut v = serde_yaml::Value::deserialize(doc).map_err(|e| e.to_string())?;
        if v.get("kind").and_then(|k| k.as_str()) == Some("ApisixRoute") && !found {
            found = true;
            if !plugins.is_empty() {
                let list: Vec<serde_json::Value> = plugins
                    .iter()
                    .map(|p| {
                        let mut m = serde_json::Map::new();
                        m.insert("name".into(), p.name.clone().into());
                        m.insert("enable".into(), true.into());
                        if !p.config.is_null() {
                            m.insert("config".into(), p.config.clone());
                        }
                        serde_json::Value::Object(m)
                    })
                    .collect();
                let list = serde_yaml::to_value(list).map_err(|e| e.to_string())?;
                let rule = v
                    .get_mut("spec")
                    .and_then(|s| s.get_mut("http"))
                    .and_then(|h| h.get_mut(0))
                    .and_then(|r| r.as_mapping_mut())
                    .ok_or("ApisixRoute has no spec.http[0]")?;
                rule.insert("plugins".into(), list);
            }
        }
        out.push(serde_yaml::to_string(&v).map_err(|e| e.to_string())?);
    }
    if !found {
        return Err("no ApisixRoute in the base config".into());
    }
    Ok(out.join("---\n"))
}

/// The auth service: `200` with `X-User: bench` (empty body), or `403` when the request
/// carries `X-Deny`, on 127.0.0.1:`port`.
pub fn auth_service_conf(prefix: &Path, port: u16) -> String {
    // NB: the origin's config with another server block: same head, no access log.
    nginx::upstream_conf(prefix, port).replace(
        "        location / {\n            return 200 \"hello world\\n\";\n        }",
        "        location / {\n            if ($http_x_deny) {\n                return 403;\n            }\n            add_header X-User bench;\n            return 200;\n        }",
    )
}

/// The benchmark's nginx proxy with `auth_request` to the auth service on `auth_port`
/// (kept-alive connections, as to the origin); `X-User` from the answer goes upstream.
pub fn auth_proxy_conf(
    prefix: &Path,
    listen_port: u16,
    upstream_port: u16,
    auth_port: u16,
) -> String {
    SuiteProxy::new(listen_port, upstream_port)
        .render(prefix)
        .replace(
            "    server {\n",
            &format!(
                "    upstream auth {{\n        server 127.0.0.1:{auth_port};\n        keepalive 320;\n    }}\n\n    server {{\n"
            ),
        )
        .replace(
            "        location / {\n            proxy_pass http://backend;\n            proxy_http_version 1.1;\n            proxy_set_header Connection \"\";\n        }\n",
            "        location / {\n            auth_request /_auth;\n            auth_request_set $auth_user $upstream_http_x_user;\n            proxy_pass http://backend;\n            proxy_http_version 1.1;\n            proxy_set_header Connection \"\";\n            proxy_set_header X-User $auth_user;\n        }\n\n        location = /_auth {\n            internal;\n            proxy_pass http://auth/auth;\n            proxy_http_version 1.1;\n            proxy_set_header Connection \"\";\n            proxy_pass_request_body off;\n            proxy_set_header Content-Length \"\";\n            proxy_set_header X-Original-URI $request_uri;\n        }\n",
        )
}

/// How many log entries a batch body holds: a JSON array's elements, else the number of
/// JSON values in it (one object, or one per line); `None` if it is not JSON.
pub fn count_entries(body: &[u8]) -> Option<u64> {
    let trimmed = body.trim_ascii_start();
    if trimmed.first() == Some(&b'[') {
        return serde_json::from_slice::<Vec<serde::de::IgnoredAny>>(trimmed)
            .ok()
            .map(|v| v.len() as u64);
    }
    let mut n = 0;
    for v in serde_json::Deserializer::from_slice(trimmed).into_iter::<serde::de::IgnoredAny>() {
        v.ok()?;
        n += 1;
    }
    (n > 0).then_some(n)
}

/// The `Content-Length` of a request head (`None`: absent, chunked or malformed).
pub fn content_length(head: &str) -> Option<usize> {
    let mut len = None;
    for line in head.split("\r\n").skip(1).take_while(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':')?;
        let name = name.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            return None;
        }
        if name.eq_ignore_ascii_case("content-length") {
            len = Some(value.trim().parse().ok()?);
        }
    }
    len
}

/// Counters of the log sink.
#[derive(Debug, Default)]
pub struct SinkStats {
    /// Entries received.
    pub entries: AtomicU64,
    /// Batches (POSTs) received.
    pub batches: AtomicU64,
    /// Requests that were not a readable batch.
    pub bad: AtomicU64,
}

/// The log sink: an HTTP/1.1 server on 127.0.0.1 that answers every request `200` and
/// counts the entries of each batch. Runs on its own thread until the process ends.
pub struct LogSink {
    /// Its port.
    pub port: u16,
    /// Its counters.
    pub stats: Arc<SinkStats>,
}

impl LogSink {
    /// Binds and starts serving.
    pub fn start() -> Result<Self, BenchError> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| BenchError::io("bind", "127.0.0.1:0", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| BenchError::io("set non-blocking", "log sink", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| BenchError::io("local address of", "log sink", e))?
            .port();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| BenchError::io("start runtime for", "log sink", e))?;
        let stats = Arc::new(SinkStats::default());
        let st = Arc::clone(&stats);
        std::thread::spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                loop {
                    let Ok((s, _)) = listener.accept().await else {
                        continue;
                    };
                    let st = Arc::clone(&st);
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(
                            Duration::from_secs(3600),
                            serve_sink_conn(s, &st),
                        )
                        .await;
                    });
                }
            });
        });
        Ok(Self { port, stats })
    }

    /// Entries received so far.
    pub fn entries(&self) -> u64 {
        self.stats.entries.load(Ordering::Relaxed)
    }
}

async fn read_more(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    buf.reserve(64 * 1024);
    match tokio::time::timeout(Duration::from_secs(120), s.read_buf(buf)).await {
        Ok(r) => r,
        Err(_) => Ok(0),
    }
}

async fn serve_sink_conn(mut s: tokio::net::TcpStream, st: &SinkStats) -> std::io::Result<()> {
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if buf.len() > SINK_MAX_HEAD || read_more(&mut s, &mut buf).await? == 0 {
                return Ok(());
            }
        };
        let len = std::str::from_utf8(&buf[..head_end])
            .ok()
            .and_then(content_length);
        let Some(len) = len.filter(|&n| n <= SINK_MAX_BODY) else {
            st.bad.fetch_add(1, Ordering::Relaxed);
            s.write_all(
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            )
            .await?;
            return Ok(());
        };
        while buf.len() < head_end + len {
            if read_more(&mut s, &mut buf).await? == 0 {
                return Ok(());
            }
        }
        match count_entries(&buf[head_end..head_end + len]) {
            Some(n) => {
                st.entries.fetch_add(n, Ordering::Relaxed);
                st.batches.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                st.bad.fetch_add(1, Ordering::Relaxed);
            }
        }
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .await?;
        buf.drain(..head_end + len);
    }
}

/// Sends `GET /hello` with `extra` header lines to 127.0.0.1:`port`; returns the status.
pub fn get_status(port: u16, extra: &str) -> Result<(u16, Vec<u8>), String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let t = Duration::from_secs(5);
    let mut s = TcpStream::connect_timeout(&addr, t).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(t)).map_err(|e| e.to_string())?;
    let req = format!(
        "GET {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}Connection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    let r = probe::parse_response(&raw)?;
    Ok((r.status, r.body))
}

/// Sums the samples of one counter in a Prometheus text page.
pub fn counter_sum(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Options of a budget scenario.
#[derive(Debug, Clone)]
pub struct BudgetOptions {
    /// Which scenario.
    pub scenario: BudgetScenario,
    /// Measured run length.
    pub duration: Duration,
    /// Warm-up before each measured run.
    pub warmup: Duration,
    /// Rounds; the start order alternates.
    pub repeat: u32,
    /// A prebuilt dataplane; `None` builds it.
    pub sluice_bin: Option<PathBuf>,
    /// The workspace (bench/config, git).
    pub workspace: PathBuf,
    /// Where result files go: history outside the clone, `latest-*` copies in
    /// `bench/results` ([`crate::results`]).
    pub results: crate::results::ResultsDirs,
    /// How long a proxy may take to serve.
    pub ready_timeout: Duration,
}

/// One proxy's share of one side-by-side run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Round, from 1.
    pub round: u32,
    /// `sluice` or `nginx`.
    pub proxy: String,
    /// With the plugins (auth) or without.
    pub with_plugins: bool,
    /// This one was started (and loaded) first.
    pub started_first: bool,
    /// Completed requests.
    pub requests: u64,
    /// Non-2xx/3xx responses plus socket errors.
    pub errors: u64,
    /// The proxy's CPU time, s.
    pub cpu_s: f64,
    /// requests ÷ wrk's run length.
    pub req_per_s: f64,
    /// requests ÷ CPU time.
    pub req_per_cpu_s: f64,
    /// wrk p50, ms.
    pub p50_ms: f64,
    /// wrk p99, ms.
    pub p99_ms: f64,
    /// 1-minute load average before the run.
    pub loadavg_1m: f64,
    /// Busy CPU of the machine minus both proxies, origin, auth service and wrk, s.
    pub other_cpu_s: f64,
    /// Other activity above 10% of one core.
    pub noisy: bool,
}

/// One round of the log sink check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SinkRound {
    /// Round.
    pub round: u32,
    /// Requests the instance with the logger answered (warm-up and measured run).
    pub requests: u64,
    /// Entries the sink received from it, after the batch timeout.
    pub entries_received: u64,
    /// `sluice_log_entries_sent_total` of the instance.
    pub entries_sent: u64,
    /// `sluice_log_entries_dropped_total` of the instance.
    pub entries_dropped: u64,
    /// `sluice_opentelemetry_spans_exported_total` of the instance (spans the OTLP sink
    /// answered 200).
    #[serde(default)]
    pub spans_exported: u64,
    /// OTLP export requests the OTLP sink received in the round.
    #[serde(default)]
    pub otlp_exports: u64,
}

/// A check that the plugins really ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// What was checked.
    pub what: String,
    /// Passed.
    pub ok: bool,
    /// What was seen.
    pub detail: String,
}

/// A whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetResult {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The scenario.
    pub scenario: BudgetScenario,
    /// UTC start, `YYYYMMDDTHHMMSSZ`.
    pub timestamp: String,
    /// Machine, nginx and wrk.
    pub machine: MachineInfo,
    /// `/proc/loadavg` at the start.
    pub loadavg_start: String,
    /// `/proc/loadavg` at the end.
    pub loadavg_end: String,
    /// Measured run length, s.
    pub duration_s: f64,
    /// Warm-up, s.
    pub warmup_s: f64,
    /// Rounds.
    pub rounds: u32,
    /// wrk connections per proxy.
    pub connections_each: u32,
    /// The plugin list measured (placeholders filled).
    pub plugins: Vec<PluginSpec>,
    /// The budget on with ÷ without req/CPU-s, if any.
    pub budget: Option<f64>,
    /// What the budget covers.
    pub budget_note: Option<String>,
    /// Checks that the plugins ran.
    pub checks: Vec<Check>,
    /// The log sink per round (logger).
    pub sink: Vec<SinkRound>,
    /// Every share.
    pub measurements: Vec<Measurement>,
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

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> BenchError + 'a {
    move |e| BenchError::io(what, path, e)
}

fn free_port() -> Result<u16, BenchError> {
    probe::free_port().map_err(|e| BenchError::io("bind", "127.0.0.1:0", e))
}

/// A started proxy.
struct Proxy {
    guard: ProcessGuard,
    port: u16,
    admin: Option<u16>,
    sluice: bool,
    dir: TempDir,
}

struct Ctx<'a> {
    opts: &'a BudgetOptions,
    nginx: PathBuf,
    wrk: PathBuf,
    sluice: PathBuf,
    proxy_cpu: Option<usize>,
    load_cpu: Option<usize>,
    clk_tck: u64,
}

impl Ctx<'_> {
    fn wait_ready(
        &self,
        what: &str,
        guard: &mut ProcessGuard,
        port: u16,
    ) -> Result<(), BenchError> {
        probe::wait_for_hello(port, PATH, self.opts.ready_timeout, || {
            match guard.try_exit_status() {
                Some(s) => Err(format!("exited with {s}")),
                None => Ok(()),
            }
        })
        .map_err(|detail| BenchError::NotReady {
            what: what.into(),
            detail: format!("{detail}; {}", guard.log_tail(8)),
        })
    }

    fn start_sluice(
        &self,
        label: &str,
        yaml: &str,
        metadata: Option<&serde_json::Value>,
    ) -> Result<Proxy, BenchError> {
        let dir = TempDir::new(&format!("budget-{label}"))?;
        let path = dir.path().join("sluice.yaml");
        std::fs::write(&path, yaml).map_err(io("write", &path))?;
        let (port, admin) = (free_port()?, free_port()?);
        let mut args = sluice_args(&path, port, admin);
        if let Some(md) = metadata {
            let mpath = dir.path().join("plugin-metadata.json");
            std::fs::write(&mpath, md.to_string()).map_err(io("write", &mpath))?;
            args.push(format!("--plugin-metadata={}", mpath.display()));
        }
        let mut guard = ProcessGuard::spawn(
            label,
            pinned(self.proxy_cpu, &self.sluice, &args),
            &dir.path().join("stdout.log"),
        )?;
        self.wait_ready(label, &mut guard, port)?;
        Ok(Proxy {
            guard,
            port,
            admin: Some(admin),
            sluice: true,
            dir,
        })
    }

    fn start_nginx(
        &self,
        label: &str,
        conf: impl FnOnce(&Path, u16) -> String,
    ) -> Result<Proxy, BenchError> {
        let dir = TempDir::new(&format!("budget-{}", label.replace(' ', "-")))?;
        let port = free_port()?;
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf(dir.path(), port)).map_err(io("write", &path))?;
        let mut guard = ProcessGuard::spawn(
            label,
            pinned(self.proxy_cpu, &self.nginx, &nginx::args(dir.path())),
            &dir.path().join("stdout.log"),
        )?;
        self.wait_ready(label, &mut guard, port)?;
        Ok(Proxy {
            guard,
            port,
            admin: None,
            sluice: false,
            dir,
        })
    }

    fn cpu_s(&self, p: &Proxy) -> (Option<u64>, f64) {
        (
            p.sluice
                .then(|| procfs::process_cpu_ns(p.guard.pid()))
                .flatten(),
            procfs::tree_cpu_ticks(p.guard.pid()) as f64 / self.clk_tck as f64,
        )
    }

    fn spawn_wrk(
        &self,
        p: &Proxy,
        duration: Duration,
        label: &str,
    ) -> Result<ProcessGuard, BenchError> {
        let args = vec![
            "-t1".into(),
            format!("-c{CONNECTIONS_EACH}"),
            format!("-d{}", crate::duration::wrk_duration_arg(duration)),
            "--latency".into(),
            format!("http://127.0.0.1:{}{PATH}", p.port),
        ];
        ProcessGuard::spawn(
            &format!("wrk ({label})"),
            pinned(self.load_cpu, &self.wrk, &args),
            &p.dir.path().join(format!("wrk-{label}.log")),
        )
    }

    fn finish_wrk(mut g: ProcessGuard, duration: Duration) -> Result<wrk::WrkReport, BenchError> {
        let status = g
            .wait_timeout(duration + Duration::from_secs(60))
            .ok_or_else(|| BenchError::Wrk(format!("{}: did not finish in time", g.name())))?;
        if !status.success() {
            return Err(BenchError::Wrk(format!(
                "{} exited with {status}: {}",
                g.name(),
                g.log_tail(5)
            )));
        }
        wrk::parse_wrk_output(&g.log_text())
    }

    /// Loads `first` and `second` at once (each with its own wrk), warm-up then measured.
    /// Returns the measured shares of `first` and `second` and the requests each answered
    /// in both runs.
    #[allow(clippy::too_many_arguments)]
    fn pair(
        &self,
        round: u32,
        proxy: &str,
        first: (&Proxy, bool),
        second: (&Proxy, bool),
        others: &[&ProcessGuard],
    ) -> Result<(Measurement, Measurement, u64, u64), BenchError> {
        let d = self.opts.duration;
        let mut warm = (0, 0);
        if !self.opts.warmup.is_zero() {
            let a = self.spawn_wrk(first.0, self.opts.warmup, "warmup")?;
            let b = self.spawn_wrk(second.0, self.opts.warmup, "warmup")?;
            let a = Self::finish_wrk(a, self.opts.warmup)?;
            let b = Self::finish_wrk(b, self.opts.warmup)?;
            warm = (a.requests, b.requests);
        }
        let (_, load1) = loadavg();
        let machine_before = procfs::system_cpu();
        let wrk_before = procfs::own_reaped_children_ticks();
        let own_before = own_ticks();
        let others_before: u64 = others.iter().map(|g| procfs::tree_cpu_ticks(g.pid())).sum();
        let a_before = self.cpu_s(first.0);
        let b_before = self.cpu_s(second.0);
        let a = self.spawn_wrk(first.0, d, "measure")?;
        let b = self.spawn_wrk(second.0, d, "measure")?;
        let a = Self::finish_wrk(a, d)?;
        let b = Self::finish_wrk(b, d)?;
        let a_after = self.cpu_s(first.0);
        let b_after = self.cpu_s(second.0);
        let others_after: u64 = others.iter().map(|g| procfs::tree_cpu_ticks(g.pid())).sum();
        let own_after = own_ticks();
        let wrk_after = procfs::own_reaped_children_ticks();
        let machine_after = procfs::system_cpu();
        let secs = |before: (Option<u64>, f64), after: (Option<u64>, f64)| match (before, after) {
            ((Some(x), _), (Some(y), _)) => y.saturating_sub(x) as f64 / 1e9,
            ((_, x), (_, y)) => (y - x).max(0.0),
        };
        let ticks = |a: u64, b: u64| b.saturating_sub(a) as f64 / self.clk_tck as f64;
        let (ca, cb) = (secs(a_before, a_after), secs(b_before, b_after));
        let other = (ticks(machine_before.busy, machine_after.busy)
            - ca
            - cb
            - ticks(others_before, others_after)
            - ticks(wrk_before, wrk_after)
            - ticks(own_before, own_after))
        .max(0.0);
        let wall = a.duration_s.max(b.duration_s).max(1e-9);
        let m = |r: &wrk::WrkReport, cpu: f64, with: bool, first: bool| Measurement {
            round,
            proxy: proxy.into(),
            with_plugins: with,
            started_first: first,
            requests: r.requests,
            errors: r.non_2xx_3xx + r.socket_errors.total(),
            cpu_s: cpu,
            req_per_s: r.requests_per_sec,
            req_per_cpu_s: r.requests as f64 / cpu.max(1e-9),
            p50_ms: r.p50_ms,
            p99_ms: r.p99_ms,
            loadavg_1m: load1,
            other_cpu_s: other,
            noisy: other > 0.1 * wall,
        };
        Ok((
            m(&a, ca, first.1, true),
            m(&b, cb, second.1, false),
            warm.0 + a.requests,
            warm.1 + b.requests,
        ))
    }
}

/// The dataplane's flags: `sluice-bench proxy`'s, with `--write-batching send` as the suite's
/// Sluice of record (no io_uring: what pods get under the default seccomp profile).
pub fn sluice_args(yaml: &Path, http: u16, admin: u16) -> Vec<String> {
    let mut a = sluice::args(yaml, http, admin);
    a.push("--write-batching=send".into());
    a
}

/// utime + stime of this process (the log sink's thread included), ticks.
fn own_ticks() -> u64 {
    std::fs::read_to_string(format!("/proc/{}/stat", std::process::id()))
        .ok()
        .and_then(|s| procfs::parse_stat(&s).ok())
        .map_or(0, |s| s.utime + s.stime)
}

fn pin_self(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        let _ = std::process::Command::new("taskset")
            .args(["-a", "-p", "-c", &cpu.to_string()])
            .arg(std::process::id().to_string())
            .output();
    }
}

fn log_eprint(m: &Measurement) {
    eprintln!(
        "  round {} {}{}: {} req, {:.0} req/s, {:.0} req/CPU-s, p50 {:.2} ms, p99 {:.2} ms, errors {}, other {:.2} CPU-s{}, load {:.2}",
        m.round,
        m.proxy,
        if m.with_plugins { " + plugins" } else { "" },
        m.requests,
        m.req_per_s,
        m.req_per_cpu_s,
        m.p50_ms,
        m.p99_ms,
        m.errors,
        m.other_cpu_s,
        if m.noisy { " NOISY" } else { "" },
        m.loadavg_1m
    );
}

/// The largest `inactive_timeout` of the plugin list (APISIX's default 5 s otherwise).
pub fn flush_wait(plugins: &[PluginSpec]) -> Duration {
    let s = plugins
        .iter()
        .filter_map(|p| p.config.get("inactive_timeout")?.as_u64())
        .max()
        .unwrap_or(5);
    Duration::from_secs(s) + Duration::from_millis(1500)
}

/// Runs a budget scenario and writes `suite-<scenario>-<arch>-<time>.{json,md}`.
pub fn run_budget(opts: &BudgetOptions) -> Result<(BudgetResult, Vec<PathBuf>), BenchError> {
    let started = SystemTime::now();
    let (loadavg_start, _) = loadavg();
    let nginx_bin = require("nginx")?;
    let wrk_bin = require("wrk")?;
    require("kill")?;
    if probe::port_in_use(UPSTREAM_PORT) {
        return Err(BenchError::PortInUse {
            port: UPSTREAM_PORT,
        });
    }
    let conf_path = budget_config(&opts.workspace);
    let conf_text = std::fs::read_to_string(&conf_path).map_err(io("read", &conf_path))?;
    let conf = parse_scenario_conf(&conf_text, opts.scenario).map_err(BenchError::Usage)?;
    let base_path = sluice::scenario_config(&opts.workspace, 1);
    let base = std::fs::read_to_string(&base_path).map_err(io("read", &base_path))?;
    let sluice_bin = match &opts.sluice_bin {
        Some(p) => sluice::check_given_binary(p)?,
        None => sluice::build_release(&opts.workspace)?,
    };
    require("taskset")?;
    // NB: before this process pins itself, which would make nproc say 1.
    let machine_info = machine::collect(
        &opts.workspace,
        nginx::version(&nginx_bin).unwrap_or_else(|| "unknown".into()),
        machine::wrk_version(&wrk_bin),
        None,
    );
    let cpus = pick_cpus(&allowed_cpus());
    let (proxy_cpu, load_cpu) = (cpus.map(|c| c.0), cpus.map(|c| c.1));
    pin_self(load_cpu);
    let ctx = Ctx {
        opts,
        nginx: nginx_bin,
        wrk: wrk_bin,
        sluice: sluice_bin,
        proxy_cpu,
        load_cpu,
        clk_tck: procfs::clock_ticks_per_sec(),
    };

    // The origin, on the proxy's core (APISIX's 2-core setup).
    let odir = TempDir::new("budget-origin")?;
    let cpath = odir.path().join("nginx.conf");
    std::fs::write(&cpath, nginx::upstream_conf(odir.path(), UPSTREAM_PORT))
        .map_err(io("write", &cpath))?;
    let origin = ProcessGuard::spawn(
        "origin nginx",
        pinned(proxy_cpu, &ctx.nginx, &nginx::args(odir.path())),
        &odir.path().join("stdout.log"),
    )?;
    probe::wait_for_hello(UPSTREAM_PORT, PATH, opts.ready_timeout, || Ok(())).map_err(
        |detail| BenchError::NotReady {
            what: "origin nginx".into(),
            detail,
        },
    )?;

    let mut checks = Vec::new();
    let mut sink_rounds = Vec::new();
    let mut measurements = Vec::new();
    let plugins;
    match opts.scenario {
        BudgetScenario::Logger | BudgetScenario::TracingOff => {
            let sink = LogSink::start()?;
            // NB: the opentelemetry plugin's collector: a second sink, which answers every
            // OTLP export 200 (its bodies are protobuf, counted as unreadable batches).
            let otlp = LogSink::start()?;
            let vars = [
                ("LOG_SINK", format!("127.0.0.1:{}", sink.port)),
                ("OTLP_SINK", format!("127.0.0.1:{}", otlp.port)),
            ];
            plugins = substitute(&conf.plugins, &vars).map_err(BenchError::Usage)?;
            let metadata = conf
                .plugin_metadata
                .as_ref()
                .map(|m| substitute_value(m, &vars))
                .transpose()
                .map_err(BenchError::Usage)?;
            let with_yaml = route_yaml(&base, &plugins).map_err(BenchError::Usage)?;
            let without_yaml = route_yaml(&base, &[]).map_err(BenchError::Usage)?;
            let wait = flush_wait(&plugins);
            for round in 1..=opts.repeat {
                eprintln!("sluice-bench suite {}: round {round}", opts.scenario.name());
                let with_first = round % 2 == 1;
                let md = metadata.as_ref();
                let (with, without) = if with_first {
                    let w = ctx.start_sluice("sluice-plugins", &with_yaml, md)?;
                    (w, ctx.start_sluice("sluice-plain", &without_yaml, md)?)
                } else {
                    let wo = ctx.start_sluice("sluice-plain", &without_yaml, md)?;
                    (ctx.start_sluice("sluice-plugins", &with_yaml, md)?, wo)
                };
                let before = sink.entries();
                let otlp_before = otlp.stats.bad.load(Ordering::Relaxed);
                let (first, second) = if with_first {
                    ((&with, true), (&without, false))
                } else {
                    ((&without, false), (&with, true))
                };
                let (a, b, na, nb) = ctx.pair(round, "sluice", first, second, &[&origin])?;
                log_eprint(&a);
                log_eprint(&b);
                let served = if with_first { na } else { nb };
                std::thread::sleep(wait);
                let metrics = with
                    .admin
                    .and_then(|p| probe::http_get(p, "/metrics", Duration::from_secs(5)).ok())
                    .map(|r| String::from_utf8_lossy(&r.body).into_owned())
                    .unwrap_or_default();
                let s = SinkRound {
                    round,
                    requests: served,
                    entries_received: sink.entries().saturating_sub(before),
                    entries_sent: counter_sum(&metrics, "sluice_log_entries_sent_total"),
                    entries_dropped: counter_sum(&metrics, "sluice_log_entries_dropped_total"),
                    spans_exported: counter_sum(
                        &metrics,
                        "sluice_opentelemetry_spans_exported_total",
                    ),
                    otlp_exports: otlp
                        .stats
                        .bad
                        .load(Ordering::Relaxed)
                        .saturating_sub(otlp_before),
                };
                eprintln!(
                    "  log sink: {} entries for {} requests (sent {}, dropped {}); OTLP sink: {} exports, {} spans exported",
                    s.entries_received,
                    s.requests,
                    s.entries_sent,
                    s.entries_dropped,
                    s.otlp_exports,
                    s.spans_exported
                );
                sink_rounds.push(s);
                measurements.extend([a, b]);
            }
            let total: u64 = sink_rounds.iter().map(|s| s.entries_received).sum();
            let served: u64 = sink_rounds.iter().map(|s| s.requests).sum();
            let dropped: u64 = sink_rounds.iter().map(|s| s.entries_dropped).sum();
            let spans: u64 = sink_rounds.iter().map(|s| s.spans_exported).sum();
            let exports: u64 = sink_rounds.iter().map(|s| s.otlp_exports).sum();
            if let Some(sampler) = plugins
                .iter()
                .find(|p| p.name == "opentelemetry")
                .map(|p| p.config["sampler"]["name"].as_str().unwrap_or("always_off"))
            {
                let (ok, want) = match sampler {
                    "always_on" => (
                        spans as f64 >= 0.99 * served as f64 && exports > 0,
                        "a span per request",
                    ),
                    "always_off" => (spans == 0 && exports == 0, "no span (sampling off)"),
                    _ => (true, "spans as sampled"),
                };
                checks.push(Check {
                    what: format!("the collector received {want}"),
                    ok,
                    detail: format!(
                        "{spans} spans exported in {exports} OTLP exports for {served} requests (sampler {sampler})"
                    ),
                });
            }
            if !plugins.iter().any(|p| p.name.ends_with("-logger")) {
                // NB: no logger on the route (tracing-off): nothing for the log sink.
            } else {
                checks.push(Check {
                what: "the log sink received the entries".into(),
                ok: total > 0 && total as f64 >= 0.99 * served as f64 && dropped == 0,
                detail: format!(
                    "{total} entries received for {served} requests answered by the instance with the logger; {dropped} dropped; {} unreadable batches",
                    sink.stats.bad.load(Ordering::Relaxed)
                ),
            });
            }
        }
        BudgetScenario::ForwardAuth => {
            let adir = TempDir::new("budget-auth")?;
            let auth_port = free_port()?;
            let apath = adir.path().join("nginx.conf");
            std::fs::write(&apath, auth_service_conf(adir.path(), auth_port))
                .map_err(io("write", &apath))?;
            let auth = ProcessGuard::spawn(
                "auth service nginx",
                pinned(proxy_cpu, &ctx.nginx, &nginx::args(adir.path())),
                &adir.path().join("stdout.log"),
            )?;
            plugins = substitute(
                &conf.plugins,
                &[("AUTH_SERVICE", format!("127.0.0.1:{auth_port}"))],
            )
            .map_err(BenchError::Usage)?;
            let with_yaml = route_yaml(&base, &plugins).map_err(BenchError::Usage)?;
            let without_yaml = route_yaml(&base, &[]).map_err(BenchError::Usage)?;
            let others = [&origin, &auth];
            for round in 1..=opts.repeat {
                let mut families = ["sluice", "nginx"];
                if round % 2 == 0 {
                    families.reverse();
                }
                for family in families {
                    eprintln!("sluice-bench suite forward-auth: round {round}, {family}");
                    let with_first = round % 2 == 1;
                    let start = |with: bool| -> Result<Proxy, BenchError> {
                        match (family, with) {
                            ("sluice", true) => ctx.start_sluice("sluice-auth", &with_yaml, None),
                            ("sluice", false) => {
                                ctx.start_sluice("sluice-plain", &without_yaml, None)
                            }
                            (_, true) => ctx.start_nginx("nginx auth_request", |p, port| {
                                auth_proxy_conf(p, port, UPSTREAM_PORT, auth_port)
                            }),
                            (_, false) => ctx.start_nginx("nginx plain", |p, port| {
                                SuiteProxy::new(port, UPSTREAM_PORT).render(p)
                            }),
                        }
                    };
                    let (with, without) = if with_first {
                        let w = start(true)?;
                        (w, start(false)?)
                    } else {
                        let wo = start(false)?;
                        (start(true)?, wo)
                    };
                    if round == 1 {
                        checks.extend(deny_checks(family, &with, &without));
                        if checks.iter().any(|c| !c.ok) {
                            for c in &checks {
                                eprintln!("  check {}: {} ({})", c.what, c.ok, c.detail);
                            }
                            return Err(BenchError::Usage(format!(
                                "forward-auth pre-check failed for {family}: the auth service is not in the path"
                            )));
                        }
                    }
                    let (first, second) = if with_first {
                        ((&with, true), (&without, false))
                    } else {
                        ((&without, false), (&with, true))
                    };
                    let (a, b, _, _) = ctx.pair(round, family, first, second, &others)?;
                    log_eprint(&a);
                    log_eprint(&b);
                    measurements.extend([a, b]);
                }
            }
        }
    }
    drop(origin);
    let result = BudgetResult {
        schema_version: SCHEMA_VERSION,
        scenario: opts.scenario,
        timestamp: machine::timestamp_utc(started),
        machine: machine_info,
        loadavg_start,
        loadavg_end: loadavg().0,
        duration_s: opts.duration.as_secs_f64().ceil(),
        warmup_s: opts.warmup.as_secs_f64().ceil(),
        rounds: opts.repeat,
        connections_each: CONNECTIONS_EACH,
        plugins,
        budget: conf.budget,
        budget_note: conf.budget_note,
        checks,
        sink: sink_rounds,
        measurements,
    };
    let written = write_results(&result, &opts.results)?;
    Ok((result, written))
}

/// Pre-check: `X-Deny` gets 403 through the auth proxy and 200 through the plain one; a
/// plain request gets hello through both.
fn deny_checks(family: &str, with: &Proxy, without: &Proxy) -> Vec<Check> {
    let mut out = Vec::new();
    for (p, deny, want, what) in [
        (with, true, 403, "with auth, X-Deny"),
        (with, false, 200, "with auth, allowed"),
        (without, true, 200, "without auth, X-Deny"),
    ] {
        let r = get_status(p.port, if deny { "X-Deny: 1\r\n" } else { "" });
        let (ok, detail) = match &r {
            Ok((s, body)) => (
                *s == want && (want != 200 || body.as_slice() == probe::HELLO_BODY),
                format!("status {s}"),
            ),
            Err(e) => (false, e.clone()),
        };
        out.push(Check {
            what: format!("{family} {what}: {want}"),
            ok,
            detail,
        });
    }
    out
}

/// The median of the finite values (the suite's).
fn median(v: &mut [f64]) -> f64 {
    crate::suite::median(v.iter().copied())
}

/// Medians of one proxy family over rounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// `sluice` or `nginx`.
    pub proxy: String,
    /// Medians (req/s, req/CPU-s, p50, p99) with the plugins.
    pub with: [f64; 4],
    /// The same without.
    pub without: [f64; 4],
    /// Median over rounds of with ÷ without req/CPU-s.
    pub ratio: f64,
    /// Each round's ratio.
    pub ratios: Vec<f64>,
    /// Median over rounds of with − without p50, ms.
    pub added_p50_ms: f64,
    /// Median over rounds of with − without p99, ms.
    pub added_p99_ms: f64,
    /// Rows with errors.
    pub errors: u64,
    /// Noisy rounds.
    pub noisy_rounds: usize,
}

/// Per proxy family: medians and per-round ratios.
pub fn summarize(ms: &[Measurement]) -> Vec<Summary> {
    let mut families: Vec<&str> = Vec::new();
    for m in ms {
        if !families.contains(&m.proxy.as_str()) {
            families.push(&m.proxy);
        }
    }
    families.sort_unstable_by_key(|f| *f != "sluice");
    families
        .into_iter()
        .map(|f| {
            let rows: Vec<&Measurement> = ms.iter().filter(|m| m.proxy == f).collect();
            let med = |with: bool| {
                let pick = |g: fn(&Measurement) -> f64| {
                    median(
                        &mut rows
                            .iter()
                            .filter(|m| m.with_plugins == with)
                            .map(|m| g(m))
                            .collect::<Vec<_>>(),
                    )
                };
                [
                    pick(|m| m.req_per_s),
                    pick(|m| m.req_per_cpu_s),
                    pick(|m| m.p50_ms),
                    pick(|m| m.p99_ms),
                ]
            };
            let mut ratios = Vec::new();
            let (mut d50, mut d99) = (Vec::new(), Vec::new());
            let mut rounds: Vec<u32> = rows.iter().map(|m| m.round).collect();
            rounds.dedup();
            let mut noisy_rounds = 0;
            for r in rounds {
                let w = rows.iter().find(|m| m.round == r && m.with_plugins);
                let wo = rows.iter().find(|m| m.round == r && !m.with_plugins);
                if let (Some(w), Some(wo)) = (w, wo) {
                    ratios.push(w.req_per_cpu_s / wo.req_per_cpu_s);
                    d50.push(w.p50_ms - wo.p50_ms);
                    d99.push(w.p99_ms - wo.p99_ms);
                    noisy_rounds += usize::from(w.noisy);
                }
            }
            Summary {
                proxy: f.into(),
                with: med(true),
                without: med(false),
                ratio: median(&mut ratios.clone()),
                ratios,
                added_p50_ms: median(&mut d50),
                added_p99_ms: median(&mut d99),
                errors: rows.iter().map(|m| m.errors).sum(),
                noisy_rounds,
            }
        })
        .collect()
}

/// The printed report.
pub fn render_markdown(r: &BudgetResult) -> String {
    let names: Vec<&str> = r.plugins.iter().map(|p| p.name.as_str()).collect();
    let mut out = format!(
        "# sluice-bench suite {} — plugin budgets (issue 19)\n\n\
         {} ({}), {} CPUs, kernel {}, {}, {}; commit {}{}.\n\
         Plugins on the route: {}. Side by side: both instances of a pair on the proxy's core, \
         each loaded by its own wrk (`-t1 -c{}`), {} s measured after a {} s warm-up, {} round(s), \
         start order alternating.\n\
         Load average at start: `{}`; at end: `{}`. The machine is shared: other builds and \
         benchmarks may run at the same time (see `other CPU-s` and NOISY below).\n\n",
        r.scenario.name(),
        r.machine.arch,
        r.machine.cpu_model,
        r.machine.nproc,
        r.machine.kernel,
        r.machine.nginx_version,
        r.machine.wrk_version,
        &r.machine.git_commit[..r.machine.git_commit.len().min(12)],
        if r.machine.git_dirty { " (dirty)" } else { "" },
        names.join(", "),
        r.connections_each,
        r.duration_s,
        r.warmup_s,
        r.rounds,
        r.loadavg_start,
        r.loadavg_end,
    );
    let invalid = r.checks.iter().any(|c| !c.ok);
    if !r.checks.is_empty() {
        out.push_str("## Checks\n\n| check | ok | seen |\n|---|---|---|\n");
        for c in &r.checks {
            out.push_str(&format!(
                "| {} | {} | {} |\n",
                c.what,
                if c.ok { "yes" } else { "**NO**" },
                c.detail
            ));
        }
        out.push('\n');
        if invalid {
            out.push_str(
                "**INVALID**: a check failed; the figures below may not measure the plugins.\n\n",
            );
        }
    }
    let with_label = match r.scenario {
        BudgetScenario::Logger | BudgetScenario::TracingOff => "with the plugins",
        BudgetScenario::ForwardAuth => "with auth",
    };
    out.push_str(
        "## Medians\n\n| proxy | | req/s | req/CPU-s | p50 ms | p99 ms |\n|---|---|---:|---:|---:|---:|\n",
    );
    let sums = summarize(&r.measurements);
    for s in &sums {
        for (label, v) in [(with_label, s.with), ("without", s.without)] {
            out.push_str(&format!(
                "| {} | {label} | {:.0} | {:.0} | {:.2} | {:.2} |\n",
                s.proxy, v[0], v[1], v[2], v[3]
            ));
        }
    }
    out.push('\n');
    for s in &sums {
        out.push_str(&format!(
            "- {}: {with_label} ÷ without, req/CPU-s: **{:.3}×** (rounds: {}); added latency p50 **{:+.2} ms**, p99 **{:+.2} ms**{}{}\n",
            s.proxy,
            s.ratio,
            s.ratios.iter().map(|x| format!("{x:.3}")).collect::<Vec<_>>().join(", "),
            s.added_p50_ms,
            s.added_p99_ms,
            if s.errors > 0 { format!("; **{} errors**", s.errors) } else { String::new() },
            if s.noisy_rounds > 0 { format!("; {} NOISY round(s)", s.noisy_rounds) } else { String::new() },
        ));
    }
    if let Some(b) = r.budget
        && let Some(s) = sums.iter().find(|s| s.proxy == "sluice")
    {
        out.push_str(&format!(
            "\n**Budget**: ≥ {b:.2}× → measured {:.3}×: {}{}.{}\n",
            s.ratio,
            if s.ratio >= b { "met" } else { "**not met**" },
            if invalid { " (INVALID run)" } else { "" },
            r.budget_note.as_ref().map_or_else(String::new, |n| format!(
                " NB: {n}; this run measures {}.",
                names.join(" + ")
            ))
        ));
    }
    if r.scenario == BudgetScenario::ForwardAuth
        && let (Some(s), Some(n)) = (
            sums.iter().find(|s| s.proxy == "sluice"),
            sums.iter().find(|s| s.proxy == "nginx"),
        )
    {
        out.push_str(&format!(
            "\nAuth adds p50 {:+.2} ms / p99 {:+.2} ms in Sluice (forward-auth) and p50 {:+.2} ms / p99 {:+.2} ms in nginx (auth_request); \
             Sluice with auth ÷ nginx with auth, req/CPU-s: **{:.3}×**, p99: **{:.2}×**.\n",
            s.added_p50_ms, s.added_p99_ms, n.added_p50_ms, n.added_p99_ms,
            s.with[1] / n.with[1], s.with[3] / n.with[3],
        ));
    }
    if !r.sink.is_empty() {
        out.push_str("\n## Log sink\n\n| round | requests answered | entries received | sent (metric) | dropped (metric) | OTLP exports received | spans exported (metric) |\n|---:|---:|---:|---:|---:|---:|---:|\n");
        for s in &r.sink {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} |\n",
                s.round,
                s.requests,
                s.entries_received,
                s.entries_sent,
                s.entries_dropped,
                s.otlp_exports,
                s.spans_exported
            ));
        }
    }
    out.push_str("\n## Runs\n\n| round | proxy | | first | req | req/s | req/CPU-s | p50 ms | p99 ms | CPU-s | errors | other CPU-s | load 1m |\n|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for m in &r.measurements {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {:.2}{} | {:.2} |\n",
            m.round,
            m.proxy,
            if m.with_plugins { with_label } else { "without" },
            if m.started_first { "yes" } else { "" },
            m.requests,
            m.req_per_s,
            m.req_per_cpu_s,
            m.p50_ms,
            m.p99_ms,
            m.cpu_s,
            m.errors,
            m.other_cpu_s,
            if m.noisy { " NOISY" } else { "" },
            m.loadavg_1m
        ));
    }
    out
}

/// Writes `suite-<scenario>-<arch>-<timestamp>.{json,md}` to the history and the
/// `latest-suite-<scenario>-<arch>.{json,md}` copies.
pub fn write_results(
    r: &BudgetResult,
    dirs: &crate::results::ResultsDirs,
) -> Result<Vec<PathBuf>, BenchError> {
    let arch = r.machine.file_arch();
    let name = r.scenario.name();
    let json = serde_json::to_string_pretty(r).map_err(|e| BenchError::Json {
        path: dirs.history.clone(),
        source: e,
    })? + "\n";
    let md = render_markdown(r);
    let stem = format!("suite-{name}-{arch}-{}", r.timestamp);
    let written = vec![
        dirs.write_history(&format!("{stem}.json"), &json)?,
        dirs.write_history(&format!("{stem}.md"), &md)?,
    ];
    dirs.write_latest(&format!("latest-suite-{name}-{arch}.json"), &json)?;
    dirs.write_latest(&format!("latest-suite-{name}-{arch}.md"), &md)?;
    Ok(written)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_owned()
    }

    fn conf(s: BudgetScenario) -> ScenarioConf {
        let text = std::fs::read_to_string(budget_config(&workspace())).unwrap();
        parse_scenario_conf(&text, s).unwrap()
    }

    #[test]
    fn budget_yaml_has_both_scenarios_with_their_plugins() {
        let l = conf(BudgetScenario::Logger);
        assert_eq!(l.budget, Some(0.90));
        assert!(l.budget_note.unwrap().contains("opentelemetry"));
        let h = l.plugins.iter().find(|p| p.name == "http-logger").unwrap();
        // APISIX's batch defaults.
        assert_eq!(h.config["batch_max_size"], 1000);
        assert_eq!(h.config["inactive_timeout"], 5);
        assert_eq!(h.config["buffer_duration"], 60);
        assert_eq!(h.config["max_retry_count"], 0);
        let f = conf(BudgetScenario::ForwardAuth);
        assert_eq!(f.plugins.len(), 1);
        assert_eq!(f.plugins[0].name, "forward-auth");
        assert_eq!(f.plugins[0].config["request_headers"][0], "X-Deny");
        assert!(parse_scenario_conf("logger:\n  plugins: []\n", BudgetScenario::Logger).is_err());
        let e = parse_scenario_conf("logger:\n  plugins: []\n", BudgetScenario::ForwardAuth);
        assert!(e.unwrap_err().contains("no scenario \"forward-auth\""));
    }

    #[test]
    fn placeholders_are_filled_and_unknown_ones_refused() {
        let l = conf(BudgetScenario::Logger);
        let p = substitute(&l.plugins, &[("LOG_SINK", "127.0.0.1:4242".into())]).unwrap();
        assert_eq!(p[0].config["uri"], "http://127.0.0.1:4242/log");
        assert_eq!(p[1].name, "opentelemetry");
        assert_eq!(p[1].config["sampler"]["name"], "always_on");
        let md = substitute_value(
            l.plugin_metadata.as_ref().unwrap(),
            &[("OTLP_SINK", "127.0.0.1:4318".into())],
        )
        .unwrap();
        assert_eq!(
            md["opentelemetry"]["collector"]["address"],
            "127.0.0.1:4318"
        );
        assert!(substitute_value(l.plugin_metadata.as_ref().unwrap(), &[]).is_err());
        let e = substitute(&l.plugins, &[("AUTH_SERVICE", "x".into())]).unwrap_err();
        assert!(e.contains("${LOG_SINK}"), "{e}");
        assert_eq!(flush_wait(&p), Duration::from_millis(6500));
        assert_eq!(flush_wait(&[]), Duration::from_millis(6500));
    }

    /// The generated config is scenario 1 plus exactly the plugin list on rule r1, and the
    /// plain one is scenario 1 itself.
    #[test]
    fn route_config_is_scenario1_plus_the_plugins() {
        let base = std::fs::read_to_string(sluice::scenario_config(&workspace(), 1)).unwrap();
        let docs = |text: &str| -> Vec<serde_yaml::Value> {
            serde_yaml::Deserializer::from_str(text)
                .map(|d| serde_yaml::Value::deserialize(d).unwrap())
                .collect()
        };
        let plain = route_yaml(&base, &[]).unwrap();
        assert_eq!(docs(&plain), docs(&base));
        for s in [
            BudgetScenario::Logger,
            BudgetScenario::TracingOff,
            BudgetScenario::ForwardAuth,
        ] {
            let p = substitute(
                &conf(s).plugins,
                &[
                    ("LOG_SINK", "127.0.0.1:1".into()),
                    ("AUTH_SERVICE", "127.0.0.1:2".into()),
                    ("OTLP_SINK", "127.0.0.1:3".into()),
                ],
            )
            .unwrap();
            let with = docs(&route_yaml(&base, &p).unwrap());
            let mut base_docs = docs(&base);
            assert_eq!(with.len(), base_docs.len());
            let rule = &with[0]["spec"]["http"][0];
            assert_eq!(rule["name"], "r1");
            let list = rule["plugins"].as_sequence().unwrap();
            assert_eq!(list.len(), p.len());
            for (got, want) in list.iter().zip(&p) {
                assert_eq!(got["name"].as_str(), Some(want.name.as_str()));
                assert_eq!(got["enable"].as_bool(), Some(true));
                let cfg: serde_json::Value = serde_yaml::from_value(got["config"].clone()).unwrap();
                assert_eq!(cfg, want.config);
            }
            // Without the plugins, the same documents as scenario 1.
            let mut stripped = with.clone();
            stripped[0]["spec"]["http"][0]
                .as_mapping_mut()
                .unwrap()
                .remove("plugins");
            assert_eq!(stripped, std::mem::take(&mut base_docs));
        }
        assert!(route_yaml("kind: Service\n", &[]).is_err());
    }

    #[test]
    fn nginx_auth_configs() {
        let a = auth_service_conf(Path::new("/p"), 7001);
        assert!(a.contains("listen 127.0.0.1:7001;"), "{a}");
        assert!(
            a.contains("if ($http_x_deny) {\n                return 403;"),
            "{a}"
        );
        assert!(
            a.contains("add_header X-User bench;\n            return 200;"),
            "{a}"
        );
        assert!(!a.contains("hello world"), "{a}");
        let p = auth_proxy_conf(Path::new("/p"), 9000, 1980, 7001);
        for want in [
            "upstream auth {\n        server 127.0.0.1:7001;\n        keepalive 320;",
            "server 127.0.0.1:1980;",
            "listen 127.0.0.1:9000;",
            "auth_request /_auth;",
            "auth_request_set $auth_user $upstream_http_x_user;",
            "proxy_set_header X-User $auth_user;",
            "location = /_auth {\n            internal;\n            proxy_pass http://auth/auth;",
            "proxy_pass_request_body off;",
        ] {
            assert!(p.contains(want), "{want} in {p}");
        }
        // location / still proxies with kept-alive upstream connections.
        assert_eq!(
            p.matches("proxy_set_header Connection \"\";").count(),
            2,
            "{p}"
        );
    }

    #[test]
    fn sink_counts_entries_and_parses_heads() {
        assert_eq!(count_entries(b"[{\"a\":1},{\"b\":[1,2]},{}]"), Some(3));
        assert_eq!(count_entries(b"[]"), Some(0));
        assert_eq!(count_entries(b"{\"a\":1}"), Some(1));
        assert_eq!(count_entries(b"{\"a\":1}\n{\"a\":2}\n"), Some(2));
        assert_eq!(count_entries(b"[{\"a\":1},"), None);
        assert_eq!(count_entries(b"nope"), None);
        assert_eq!(count_entries(b""), None);
        let h = "POST /log HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\n";
        assert_eq!(content_length(h), Some(12));
        assert_eq!(
            content_length("POST / HTTP/1.1\r\ncontent-length:  7 \r\n\r\n"),
            Some(7)
        );
        assert_eq!(content_length("POST / HTTP/1.1\r\nHost: x\r\n\r\n"), None);
        assert_eq!(
            content_length(
                "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
            ),
            None
        );
        assert_eq!(
            content_length("POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n"),
            None
        );
    }

    /// The real sink over loopback: two batches on one kept-alive connection are counted.
    #[test]
    fn log_sink_counts_batches_over_a_kept_alive_connection() {
        let sink = LogSink::start().unwrap();
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, sink.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        for body in ["[{\"a\":1},{\"a\":2}]", "[{\"a\":3}]"] {
            let req = format!(
                "POST /log HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            s.write_all(req.as_bytes()).unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 200 OK"), "{:?}", &buf[..n]);
        }
        assert_eq!(sink.entries(), 3);
        assert_eq!(sink.stats.batches.load(Ordering::Relaxed), 2);
        // A request without a length is refused and counted.
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, sink.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"POST /log HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        assert!(raw.starts_with(b"HTTP/1.1 400"));
        assert_eq!(sink.stats.bad.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn dataplane_flags() {
        let a = sluice_args(Path::new("/c.yaml"), 8080, 9090);
        assert_eq!(a[a.iter().position(|x| x == "--workers").unwrap() + 1], "1");
        assert!(a.contains(&"--write-batching=send".to_owned()), "{a:?}");
        assert!(a.contains(&"127.0.0.1:8080".to_owned()), "{a:?}");
    }

    #[test]
    fn metrics_counters_are_summed() {
        let page = "# HELP sluice_log_entries_sent_total x\n\
                    sluice_log_entries_sent_total{plugin=\"http-logger\",route=\"a\"} 1200\n\
                    sluice_log_entries_sent_total{plugin=\"file-logger\",route=\"b\"} 3\n\
                    sluice_log_entries_sent_totalx 99\n\
                    sluice_log_entries_dropped_total{plugin=\"http-logger\",route=\"a\",reason=\"queue_full\"} 7\n";
        assert_eq!(counter_sum(page, "sluice_log_entries_sent_total"), 1203);
        assert_eq!(counter_sum(page, "sluice_log_entries_dropped_total"), 7);
        assert_eq!(counter_sum("", "x"), 0);
    }

    fn m(round: u32, proxy: &str, with: bool, per_cpu: f64, p50: f64, p99: f64) -> Measurement {
        Measurement {
            round,
            proxy: proxy.into(),
            with_plugins: with,
            started_first: with == (round % 2 == 1),
            requests: 1000,
            errors: 0,
            cpu_s: 10.0,
            req_per_s: 100.0,
            req_per_cpu_s: per_cpu,
            p50_ms: p50,
            p99_ms: p99,
            loadavg_1m: 2.5,
            other_cpu_s: 0.0,
            noisy: false,
        }
    }

    #[test]
    fn summary_ratios_added_latency_and_report() {
        let ms = vec![
            m(1, "sluice", true, 90.0, 1.5, 3.0),
            m(1, "sluice", false, 100.0, 1.0, 2.0),
            m(1, "nginx", true, 40.0, 2.0, 4.0),
            m(1, "nginx", false, 80.0, 1.0, 2.0),
            m(2, "nginx", true, 50.0, 2.0, 5.0),
            m(2, "nginx", false, 100.0, 1.0, 2.0),
            m(2, "sluice", true, 95.0, 1.5, 3.0),
            m(2, "sluice", false, 100.0, 1.0, 2.5),
        ];
        let s = summarize(&ms);
        assert_eq!(s[0].proxy, "sluice");
        assert!((s[0].ratio - 0.925).abs() < 1e-9, "{:?}", s[0]);
        assert!((s[0].added_p50_ms - 0.5).abs() < 1e-9);
        assert!((s[0].added_p99_ms - 0.75).abs() < 1e-9);
        assert!((s[1].ratio - 0.5).abs() < 1e-9);
        assert!((s[1].added_p99_ms - 2.5).abs() < 1e-9);
        let mut r = BudgetResult {
            schema_version: SCHEMA_VERSION,
            scenario: BudgetScenario::ForwardAuth,
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
            loadavg_start: "3.10 2.00 1.00 1/100 1".into(),
            loadavg_end: "4.20 2.00 1.00 1/100 1".into(),
            duration_s: 5.0,
            warmup_s: 2.0,
            rounds: 2,
            connections_each: CONNECTIONS_EACH,
            plugins: conf(BudgetScenario::ForwardAuth).plugins,
            budget: None,
            budget_note: None,
            checks: vec![Check {
                what: "sluice with auth, X-Deny: 403".into(),
                ok: true,
                detail: "status 403".into(),
            }],
            sink: Vec::new(),
            measurements: ms,
        };
        let md = render_markdown(&r);
        assert!(
            md.contains("3.10 2.00 1.00"),
            "load average is recorded: {md}"
        );
        assert!(
            md.contains("sluice: with auth ÷ without, req/CPU-s: **0.925×**"),
            "{md}"
        );
        assert!(md.contains("p99 +0.75 ms in Sluice"), "{md}");
        assert!(!md.contains("INVALID"));
        let back: BudgetResult = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        // Logger: the budget line, and a failed sink check marks the run invalid.
        r.scenario = BudgetScenario::Logger;
        r.budget = Some(0.90);
        r.budget_note = Some("for otel and logger together".into());
        r.plugins = conf(BudgetScenario::Logger).plugins;
        r.checks = vec![Check {
            what: "the log sink received the entries".into(),
            ok: false,
            detail: "0 entries".into(),
        }];
        let md = render_markdown(&r);
        assert!(
            md.contains("≥ 0.90× → measured 0.925×: met (INVALID run)"),
            "{md}"
        );
        assert!(
            md.contains("this run measures http-logger + opentelemetry."),
            "{md}"
        );
        assert!(md.contains("**INVALID**"), "{md}");
    }
}
