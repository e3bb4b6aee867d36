//! The `proxy` command: start the upstream, then each proxy in turn, load it
//! with wrk, measure, stop it, and write the result files.

use crate::results::ResultsDirs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use crate::duration::wrk_duration_arg;
use crate::error::BenchError;
use crate::machine;
use crate::nginx;
use crate::probe;
use crate::process::{self, ProcessGuard, TempDir};
use crate::procfs;
use crate::report::{self, BenchResult, CpuWindow, Metrics, ProxyRun, RunParams};
use crate::sluice;
use crate::wrk::{self, WrkReport};

/// The upstream port fixed by the scenario YAML (Service/EndpointSlice port).
pub const UPSTREAM_PORT: u16 = 1980;
/// The benchmarked path.
pub const PATH: &str = "/hello";
/// wrk `-t`, as in the APISIX benchmark.
pub const WRK_THREADS: u32 = 1;
/// wrk `-c`, as in the APISIX benchmark.
pub const WRK_CONNECTIONS: u32 = 64;

/// Which proxies a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Only {
    /// Only the nginx baseline.
    Nginx,
    /// Only sluice (no ratios then).
    Sluice,
}

/// Where the upstream nginx runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamCpu {
    /// On the proxy's core (default; the APISIX 2-core setup).
    Proxy,
    /// On wrk's core, leaving the proxy's core to the proxy alone.
    Wrk,
    /// Not pinned.
    Any,
}

/// Options of the `proxy` command.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// 1 (pure proxy) or 2 (limit-count + prometheus).
    pub scenario: u8,
    /// Measured wrk run length.
    pub duration: Duration,
    /// Warm-up wrk run before each measurement; zero disables it.
    pub warmup: Duration,
    /// A prebuilt dataplane binary; `None` builds it with cargo.
    pub sluice_bin: Option<PathBuf>,
    /// Restrict the run to one proxy; `None` runs both.
    pub only: Option<Only>,
    /// The cargo workspace root (for the build, the scenario YAML and git).
    pub workspace: PathBuf,
    /// Where result files go: history outside the clone, `latest-*` copies in
    /// `bench/results` ([`crate::results`]).
    pub results: crate::results::ResultsDirs,
    /// How long a proxy may take to serve its first correct response.
    pub ready_timeout: Duration,
    /// Placement of the upstream nginx.
    pub upstream_cpu: UpstreamCpu,
    /// A user-mode emulator (e.g. `qemu-aarch64-static`) that runs the dataplane binary,
    /// for a dataplane built for another architecture. The result is labelled emulated.
    pub emulator: Option<PathBuf>,
    /// Extra flags for sluice-dataplane, after the benchmark's own.
    pub sluice_args: Vec<String>,
    /// Scenario 2's side-by-side figure: start the dataplane without the plugins, and its
    /// wrk, first. NB: which of the two goes first can favour it by about a point on this
    /// VM, in either direction and varying over time (scenario 1 against itself: 0.977–
    /// 1.010×); `--repeat` alternates, so that the median sees both orders.
    pub without_first: bool,
    /// Another sluice-dataplane binary (e.g. the main branch's) to load side by side with
    /// the one under test, on the same scenario during the same seconds
    /// ([`report::BaselineSideBySide`]); with `without_first`, the baseline starts first.
    pub baseline_bin: Option<PathBuf>,
    /// The scenario the baseline serves; `None`: the same as [`Self::scenario`].
    pub baseline_scenario: Option<u8>,
    /// Every request on a new connection (wrk sends `Connection: close`).
    pub connection_close: bool,
}

/// Paths of the files a run wrote.
#[derive(Debug, Clone)]
pub struct Written {
    /// The timestamped JSON file.
    pub json: PathBuf,
    /// The timestamped markdown file.
    pub markdown: PathBuf,
}

/// External programs the harness drives.
struct Tools {
    nginx: PathBuf,
    wrk: PathBuf,
}

pub(crate) fn require(program: &'static str) -> Result<PathBuf, BenchError> {
    process::find_on_path(program).ok_or(BenchError::MissingTool { program })
}

/// Parses a kernel CPU list such as `0-3,8,10-11` into CPU numbers.
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if a > b {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

/// The CPUs this process may run on (`Cpus_allowed_list` in /proc/self/status).
pub(crate) fn allowed_cpus() -> Vec<usize> {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .and_then(parse_cpu_list)
        })
        .unwrap_or_default()
}

/// Picks (proxy CPU, wrk CPU): the first two allowed CPUs, as in the APISIX
/// 2-core benchmark. `None` when fewer than two are available.
pub fn pick_cpus(allowed: &[usize]) -> Option<(usize, usize)> {
    match allowed {
        [a, b, ..] => Some((*a, *b)),
        _ => None,
    }
}

/// A command pinned to `cpu` with taskset (which execs, so the pid stays the program's).
pub(crate) fn pinned(cpu: Option<usize>, program: &Path, args: &[String]) -> Command {
    match cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpu.to_string()).arg(program).args(args);
            c
        }
        None => {
            let mut c = Command::new(program);
            c.args(args);
            c
        }
    }
}

fn write_file(path: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|e| BenchError::io("write", path, e))
}

/// Everything fixed for the whole run.
struct Bench<'a> {
    opts: &'a ProxyOptions,
    tools: Tools,
    wrk_cpu: Option<usize>,
    clk_tck: u64,
}

impl Bench<'_> {
    /// Starts nginx with `conf` in its own prefix and waits until `port` serves hello.
    fn start_nginx(
        &self,
        what: &str,
        cpu: Option<usize>,
        dir: &TempDir,
        conf: &str,
        port: u16,
    ) -> Result<ProcessGuard, BenchError> {
        write_file(&dir.path().join("nginx.conf"), conf)?;
        let cmd = pinned(cpu, &self.tools.nginx, &nginx::args(dir.path()));
        let mut guard = ProcessGuard::spawn(what, cmd, &dir.path().join("stdout.log"))?;
        let ready = probe::wait_for_hello(port, PATH, self.opts.ready_timeout, || {
            match guard.try_exit_status() {
                Some(status) => Err(format!("exited with {status}")),
                None => Ok(()),
            }
        });
        if let Err(detail) = ready {
            let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(10)..].join("\n");
            return Err(BenchError::NotReady {
                what: what.into(),
                detail: format!("{detail}\n{tail}\n{}", guard.log_tail(10)),
            });
        }
        Ok(guard)
    }

    /// Runs wrk once against `port` and parses its report.
    fn run_wrk(
        &self,
        dir: &Path,
        port: u16,
        duration: Duration,
        label: &str,
    ) -> Result<WrkReport, BenchError> {
        let guard = self.spawn_wrk(dir, port, WRK_CONNECTIONS, duration, label)?;
        self.finish_wrk(guard, duration, label)
    }

    /// Starts wrk with `connections` against `port`.
    fn spawn_wrk(
        &self,
        dir: &Path,
        port: u16,
        connections: u32,
        duration: Duration,
        label: &str,
    ) -> Result<ProcessGuard, BenchError> {
        let args = proxy_wrk_args(port, connections, duration, self.opts.connection_close);
        let cmd = pinned(self.wrk_cpu, &self.tools.wrk, &args);
        let log = dir.join(format!("wrk-{label}.log"));
        ProcessGuard::spawn(&format!("wrk ({label})"), cmd, &log)
    }

    /// Waits for a wrk started by [`Bench::spawn_wrk`] and parses its report.
    fn finish_wrk(
        &self,
        mut guard: ProcessGuard,
        duration: Duration,
        label: &str,
    ) -> Result<WrkReport, BenchError> {
        let status = guard
            .wait_timeout(duration + Duration::from_secs(30))
            .ok_or_else(|| BenchError::Wrk(format!("{label}: wrk did not finish in time")))?;
        if !status.success() {
            return Err(BenchError::Wrk(format!(
                "{label}: exited with {status}: {}",
                guard.log_tail(5)
            )));
        }
        wrk::parse_wrk_output(&guard.log_text())
    }

    /// Scenario 2's plugin cost side by side (see [`report::SideBySide`]): `with` and
    /// `without` (process, port) are loaded at the same time by two wrk processes with half
    /// the connections each, after a warm-up done the same way.
    fn measure_side_by_side(
        &self,
        dir: &Path,
        with: (&ProcessGuard, u16),
        without: (&ProcessGuard, u16),
        what: &str,
    ) -> Result<Option<report::SideBySide>, BenchError> {
        let opts = self.opts;
        let half = WRK_CONNECTIONS / 2;
        let both = |duration: Duration,
                    label: &str|
         -> Result<(WrkReport, WrkReport), BenchError> {
            let (with_label, without_label) = (format!("{label}-with"), format!("{label}-without"));
            let (a, b) = if opts.without_first {
                let b = self.spawn_wrk(dir, without.1, half, duration, &without_label)?;
                let a = self.spawn_wrk(dir, with.1, half, duration, &with_label)?;
                (a, b)
            } else {
                let a = self.spawn_wrk(dir, with.1, half, duration, &with_label)?;
                let b = self.spawn_wrk(dir, without.1, half, duration, &without_label)?;
                (a, b)
            };
            let a = self.finish_wrk(a, duration, &with_label)?;
            let b = self.finish_wrk(b, duration, &without_label)?;
            Ok((a, b))
        };
        if !opts.warmup.is_zero() {
            both(opts.warmup, "side-by-side-warmup")?;
        }
        eprintln!(
            "sluice-bench: side by side, {what}: measuring {:?}",
            opts.duration
        );
        // NB: CPU time in nanoseconds from the scheduler (schedstat) where readable, else
        // clock ticks: a tick is 0.3% of a dataplane's share here, as much as the effects
        // this figure looks for.
        let cpu = |pid: u32| {
            (
                procfs::process_cpu_ns(pid),
                procfs::tree_cpu_ticks(pid) as f64 / self.clk_tck as f64,
            )
        };
        let secs = |before: (Option<u64>, f64), after: (Option<u64>, f64)| match (before, after) {
            ((Some(x), _), (Some(y), _)) => y.saturating_sub(x) as f64 / 1e9,
            ((_, x), (_, y)) => (y - x).max(0.0),
        };
        let with_before = cpu(with.0.pid());
        let without_before = cpu(without.0.pid());
        let (a, b) = both(opts.duration, "side-by-side")?;
        let with_after = cpu(with.0.pid());
        let without_after = cpu(without.0.pid());
        let x = report::SideBySide::new(
            report::Share::new(&a, secs(with_before, with_after)),
            report::Share::new(&b, secs(without_before, without_after)),
        )
        .map(|x| report::SideBySide {
            without_first: opts.without_first,
            ..x
        });
        if x.is_none() {
            eprintln!(
                "sluice-bench: side by side: errors ({} and {}) or no CPU time: no figure",
                a.non_2xx_3xx + a.socket_errors.total(),
                b.non_2xx_3xx + b.socket_errors.total()
            );
        }
        Ok(x)
    }

    /// Warm-up, then a measured wrk run with CPU sampled around it.
    fn measure(
        &self,
        dir: &Path,
        proxy: &ProcessGuard,
        upstream: &ProcessGuard,
        port: u16,
    ) -> Result<Metrics, BenchError> {
        let opts = self.opts;
        if !opts.warmup.is_zero() {
            eprintln!("sluice-bench: {}: warm-up {:?}", proxy.name(), opts.warmup);
            let w = self.run_wrk(dir, port, opts.warmup, "warmup")?;
            if w.has_errors() {
                eprintln!(
                    "sluice-bench: {}: warning: warm-up saw {} non-2xx and {} socket errors",
                    proxy.name(),
                    w.non_2xx_3xx,
                    w.socket_errors.total()
                );
            }
        }
        eprintln!(
            "sluice-bench: {}: measuring {:?}",
            proxy.name(),
            opts.duration
        );
        // Sample the whole machine outermost so the per-process figures nest inside it.
        let machine_before = procfs::system_cpu();
        let wrk_before = procfs::own_reaped_children_ticks();
        let proxy_before = procfs::tree_cpu_ticks(proxy.pid());
        let proxy_sys_before = procfs::tree_system_ticks(proxy.pid());
        let upstream_before = procfs::tree_cpu_ticks(upstream.pid());
        let report = self.run_wrk(dir, port, opts.duration, "measure")?;
        let proxy_after = procfs::tree_cpu_ticks(proxy.pid());
        let proxy_sys_after = procfs::tree_system_ticks(proxy.pid());
        let upstream_after = procfs::tree_cpu_ticks(upstream.pid());
        // wrk has been reaped by now, so its time is in our children's total.
        let wrk_after = procfs::own_reaped_children_ticks();
        let machine_after = procfs::system_cpu();
        let peak_rss_kib = procfs::tree_peak_rss_kib(proxy.pid());
        let secs = |a: u64, b: u64| b.saturating_sub(a) as f64 / self.clk_tck as f64;
        let m = Metrics::new(
            report,
            CpuWindow {
                proxy: secs(proxy_before, proxy_after),
                proxy_system: secs(proxy_sys_before, proxy_sys_after),
                upstream: secs(upstream_before, upstream_after),
                wrk: secs(wrk_before, wrk_after),
                machine: secs(machine_before.busy, machine_after.busy),
            },
            peak_rss_kib,
        );
        if m.noisy {
            eprintln!(
                "sluice-bench: {}: WARNING: other activity used {:.2} CPU-s during the measured run \
                 (steal {:.2} s); figures are not comparable",
                proxy.name(),
                m.background_cpu_seconds,
                secs(machine_before.steal, machine_after.steal)
            );
        }
        if m.errors_flagged {
            eprintln!(
                "sluice-bench: {}: WARNING: {} non-2xx/3xx responses and {} socket errors in the measured run",
                proxy.name(),
                m.wrk.non_2xx_3xx,
                m.wrk.socket_errors.total()
            );
        }
        Ok(m)
    }
}

/// Resolves the dataplane binary: the given path, or a fresh release build.
fn sluice_binary(opts: &ProxyOptions) -> Result<PathBuf, BenchError> {
    let config = sluice::scenario_config(&opts.workspace, opts.scenario);
    if !config.is_file() {
        return Err(BenchError::SluiceUnavailable(format!(
            "scenario file {} is missing",
            config.display()
        )));
    }
    match &opts.sluice_bin {
        Some(p) => sluice::check_given_binary(p),
        None => sluice::build_release(&opts.workspace),
    }
}

/// Scenario 2 is only meaningful if the plugins really run. Checks what a
/// user would see: limit-count's `X-RateLimit-Limit` header on the route and
/// prometheus's `apisix_http_status` metric on the admin `/metrics`.
/// Returns one warning per plugin that shows no sign of life.
pub fn scenario2_plugin_warnings(
    route: &probe::Response,
    metrics: Option<&probe::Response>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    if route.header("x-ratelimit-limit").is_none() {
        warnings
            .push("limit-count not active: GET /hello had no X-RateLimit-Limit header".to_owned());
    }
    let has_metric = metrics.is_some_and(|m| {
        m.status == 200 && String::from_utf8_lossy(&m.body).contains("apisix_http_status")
    });
    if !has_metric {
        warnings.push("prometheus not active: admin /metrics has no apisix_http_status".to_owned());
    }
    warnings
}

/// Probes a running sluice for the scenario-2 plugins.
fn check_scenario2(port: u16, admin: u16) -> Vec<String> {
    let timeout = Duration::from_secs(2);
    match probe::http_get(port, PATH, timeout) {
        Ok(route) => {
            let metrics = probe::http_get(admin, "/metrics", timeout).ok();
            scenario2_plugin_warnings(&route, metrics.as_ref())
        }
        Err(e) => vec![format!("could not probe the plugins: {e}")],
    }
}

/// Starts sluice and waits until it proxies hello; a failure is a skip reason.
/// Returns the process and its admin port.
fn start_sluice(
    opts: &ProxyOptions,
    scenario: u8,
    bin: &Path,
    cpu: Option<usize>,
    dir: &TempDir,
    port: u16,
) -> Result<(ProcessGuard, u16), String> {
    let admin = probe::free_port().map_err(|e| format!("no free admin port: {e}"))?;
    let config = sluice::scenario_config(&opts.workspace, scenario);
    let mut args = sluice::args(&config, port, admin);
    args.extend(opts.sluice_args.iter().cloned());
    let cmd = match &opts.emulator {
        // NB: qemu-user runs the guest in its own process, so the pid (and its CPU
        // accounting) is the dataplane's.
        Some(emulator) => pinned(
            cpu,
            emulator,
            &[vec![bin.display().to_string()], args].concat(),
        ),
        None => pinned(cpu, bin, &args),
    };
    let mut guard = ProcessGuard::spawn("sluice", cmd, &dir.path().join("sluice.log"))
        .map_err(|e| e.to_string())?;
    let ready = probe::wait_for_hello(port, PATH, opts.ready_timeout, || {
        match guard.try_exit_status() {
            Some(status) => Err(format!(
                "sluice-dataplane exited with {status} before serving"
            )),
            None => Ok(()),
        }
    });
    match ready {
        Ok(()) => Ok((guard, admin)),
        Err(detail) => {
            let tail = guard.log_tail(8);
            Err(if tail.is_empty() {
                detail
            } else {
                format!("{detail}; last log lines: {}", tail.replace('\n', " ⏎ "))
            })
        }
    }
}

/// Runs the benchmark and writes the result files; returns the result and
/// where it was written.
pub fn run_proxy_bench(opts: &ProxyOptions) -> Result<(BenchResult, Written), BenchError> {
    for s in [Some(opts.scenario), opts.baseline_scenario]
        .into_iter()
        .flatten()
    {
        if !matches!(s, 1..=6) {
            return Err(BenchError::Usage(format!(
                "unknown scenario {s}; use 1 to 6"
            )));
        }
    }
    let tools = Tools {
        nginx: require("nginx")?,
        wrk: require("wrk")?,
    };
    require("kill")?;
    let cpus = pick_cpus(&allowed_cpus());
    if cpus.is_some() {
        require("taskset")?;
    } else {
        eprintln!("sluice-bench: warning: fewer than 2 CPUs available, running without pinning");
    }
    let (proxy_cpu, wrk_cpu) = (cpus.map(|c| c.0), cpus.map(|c| c.1));
    let upstream_cpu = match opts.upstream_cpu {
        UpstreamCpu::Proxy => proxy_cpu,
        UpstreamCpu::Wrk => wrk_cpu,
        UpstreamCpu::Any => None,
    };
    if probe::port_in_use(UPSTREAM_PORT) {
        return Err(BenchError::PortInUse {
            port: UPSTREAM_PORT,
        });
    }

    let emulator =
        match &opts.emulator {
            Some(e) if e.components().count() == 1 => {
                let name = e.to_string_lossy();
                Some(process::find_on_path(&name).ok_or_else(|| {
                    BenchError::Usage(format!("--emulator {name} is not on PATH"))
                })?)
            }
            Some(e) if !e.is_file() => {
                return Err(BenchError::Usage(format!(
                    "--emulator {} is not a file",
                    e.display()
                )));
            }
            other => other.clone(),
        };
    let opts = &ProxyOptions {
        emulator,
        ..opts.clone()
    };

    let started = SystemTime::now();
    let clk_tck = procfs::clock_ticks_per_sec();

    // Resolve sluice before starting anything, so a long build does not sit
    // between the upstream start and the measurements.
    let sluice_bin = match opts.only {
        Some(Only::Nginx) => None,
        _ => Some(sluice_binary(opts).map_err(|e| e.to_string())),
    };
    let host_arch = machine::host_arch();
    let dataplane_arch = sluice_bin
        .as_ref()
        .and_then(|b| b.as_ref().ok())
        .and_then(|b| machine::binary_arch(b));
    let emulation = machine::emulation(
        &machine::arch(),
        &host_arch,
        dataplane_arch,
        opts.emulator.as_deref().map(machine::emulator_version),
    );
    if let Some(e) = &emulation {
        eprintln!(
            "sluice-bench: EMULATED run: sluice-dataplane ({}) runs under {} on this {} host; \
             the figures measure the emulator, not {} hardware",
            e.guest_arch, e.emulator, e.host_arch, e.guest_arch
        );
    }
    let sluice_bin = sluice_bin.map(|b| {
        b.and_then(|bin| match dataplane_arch {
            Some(a) if a != host_arch && opts.emulator.is_none() && !binfmt_handles(a) => {
                Err(format!(
                    "{} is an {a} binary and this host is {host_arch}; run it through an \
                     emulator with --emulator qemu-{a}-static",
                    bin.display()
                ))
            }
            _ => Ok(bin),
        })
    });

    let bench = Bench {
        opts,
        tools,
        wrk_cpu,
        clk_tck,
    };
    let upstream_dir = TempDir::new("upstream")?;
    let upstream = bench.start_nginx(
        "upstream nginx",
        upstream_cpu,
        &upstream_dir,
        &nginx::upstream_conf(upstream_dir.path(), UPSTREAM_PORT),
        UPSTREAM_PORT,
    )?;

    let mut runs = Vec::new();
    if opts.only != Some(Only::Sluice) {
        let dir = TempDir::new("nginx")?;
        let port = probe::free_port().map_err(|e| BenchError::io("bind", "127.0.0.1:0", e))?;
        let proxy = bench.start_nginx(
            "proxy nginx",
            proxy_cpu,
            &dir,
            &nginx::proxy_conf(dir.path(), port, UPSTREAM_PORT),
            port,
        )?;
        let m = bench.measure(dir.path(), &proxy, &upstream, port)?;
        drop(proxy);
        runs.push(ProxyRun {
            proxy: "nginx".into(),
            skipped: None,
            metrics: Some(m),
            warnings: Vec::new(),
        });
    }
    let mut plain_run = None;
    let mut side_by_side = None;
    let sluice_bin_for_baseline = sluice_bin
        .clone()
        .unwrap_or_else(|| Err("sluice was not measured".into()));
    if let Some(bin) = sluice_bin {
        let bin_for_plain = bin.clone();
        let outcome = bin.and_then(|bin| {
            let dir = TempDir::new("sluice").map_err(|e| e.to_string())?;
            let port = probe::free_port().map_err(|e| format!("no free port: {e}"))?;
            let (proxy, admin) = start_sluice(opts, opts.scenario, &bin, proxy_cpu, &dir, port)?;
            let m = bench
                .measure(dir.path(), &proxy, &upstream, port)
                .map_err(|e| e.to_string())?;
            let warnings = if opts.scenario == 2 {
                check_scenario2(port, admin)
            } else {
                Vec::new()
            };
            for w in &warnings {
                eprintln!("sluice-bench: sluice: WARNING: {w}");
            }
            Ok((m, warnings))
        });
        // Scenario 2: the same dataplane without the plugins (scenario 1's route), in the
        // same run, for the plugin cost (issue 4's budget).
        if opts.scenario == 2
            && let Ok(bin) = &bin_for_plain
        {
            let plain = (|| {
                let dir = TempDir::new("sluice-s1").map_err(|e| e.to_string())?;
                let port = probe::free_port().map_err(|e| format!("no free port: {e}"))?;
                let (proxy, _) = start_sluice(opts, 1, bin, proxy_cpu, &dir, port)?;
                bench
                    .measure(dir.path(), &proxy, &upstream, port)
                    .map_err(|e| e.to_string())
            })();
            // Then both at once, for the figure of record.
            let side = (|| {
                // NB: a directory each, for their logs.
                let dir2 = TempDir::new("sluice-side-2").map_err(|e| e.to_string())?;
                let dir1 = TempDir::new("sluice-side-1").map_err(|e| e.to_string())?;
                let p2 = probe::free_port().map_err(|e| format!("no free port: {e}"))?;
                let p1 = probe::free_port().map_err(|e| format!("no free port: {e}"))?;
                let start_with = || start_sluice(opts, 2, bin, proxy_cpu, &dir2, p2);
                let start_without = || start_sluice(opts, 1, bin, proxy_cpu, &dir1, p1);
                let ((with, _), (without, _)) = if opts.without_first {
                    let without = start_without()?;
                    (start_with()?, without)
                } else {
                    let with = start_with()?;
                    (with, start_without()?)
                };
                bench
                    .measure_side_by_side(
                        dir2.path(),
                        (&with, p2),
                        (&without, p1),
                        "with and without the plugins",
                    )
                    .map_err(|e| e.to_string())
            })();
            match side {
                Ok(x) => side_by_side = x,
                Err(reason) => {
                    eprintln!("sluice-bench: no side-by-side plugin cost: {reason}")
                }
            }
            match plain {
                Ok(m) => {
                    plain_run = Some(ProxyRun {
                        proxy: SLUICE_SCENARIO_1.into(),
                        skipped: None,
                        metrics: Some(m),
                        warnings: Vec::new(),
                    })
                }
                Err(reason) => {
                    eprintln!("sluice-bench: no same-run scenario 1 for sluice: {reason}")
                }
            }
        }
        match outcome {
            Ok((m, warnings)) => runs.push(ProxyRun {
                proxy: "sluice".into(),
                skipped: None,
                metrics: Some(m),
                warnings,
            }),
            Err(reason) => {
                eprintln!("sluice-bench: SKIPPING sluice: {reason}");
                runs.push(ProxyRun {
                    proxy: "sluice".into(),
                    skipped: Some(reason),
                    metrics: None,
                    warnings: Vec::new(),
                });
            }
        }
    }
    runs.extend(plain_run);
    // This build beside a baseline build, same scenario, during the same seconds.
    let mut baseline_side_by_side = None;
    if let (Some(baseline), Ok(bin)) = (&opts.baseline_bin, &sluice_bin_for_baseline) {
        let side = (|| {
            let dir_b = TempDir::new("sluice-build").map_err(|e| e.to_string())?;
            let dir_a = TempDir::new("sluice-baseline").map_err(|e| e.to_string())?;
            let pb = probe::free_port().map_err(|e| format!("no free port: {e}"))?;
            let pa = probe::free_port().map_err(|e| format!("no free port: {e}"))?;
            let start_build = || start_sluice(opts, opts.scenario, bin, proxy_cpu, &dir_b, pb);
            let base_scenario = opts.baseline_scenario.unwrap_or(opts.scenario);
            let start_base = || start_sluice(opts, base_scenario, baseline, proxy_cpu, &dir_a, pa);
            let ((build, _), (base, _)) = if opts.without_first {
                let base = start_base()?;
                (start_build()?, base)
            } else {
                let build = start_build()?;
                (build, start_base()?)
            };
            bench
                .measure_side_by_side(
                    dir_b.path(),
                    (&build, pb),
                    (&base, pa),
                    "this build and the baseline",
                )
                .map_err(|e| e.to_string())
        })();
        match side {
            Ok(x) => {
                baseline_side_by_side = x.map(|x| report::BaselineSideBySide {
                    baseline: match opts.baseline_scenario {
                        Some(s) if s != opts.scenario => {
                            format!("{} serving scenario {s}", baseline.display())
                        }
                        _ => baseline.display().to_string(),
                    },
                    build: x.with_plugins,
                    baseline_share: x.without_plugins,
                    ratio: x.ratio,
                    baseline_first: x.without_first,
                })
            }
            Err(reason) => eprintln!("sluice-bench: no side-by-side baseline figure: {reason}"),
        }
    }
    drop(upstream);
    drop(upstream_dir);

    if runs.iter().all(|r| r.metrics.is_none()) {
        let reasons: Vec<String> = runs.iter().filter_map(|r| r.skipped.clone()).collect();
        return Err(BenchError::Usage(format!(
            "nothing was measured: {}",
            reasons.join("; ")
        )));
    }

    let nginx_version = nginx::version(&bench.tools.nginx).unwrap_or_else(|| "unknown".into());
    let wrk_version = machine::wrk_version(&bench.tools.wrk);
    let mut result = BenchResult {
        schema_version: report::SCHEMA_VERSION,
        scenario: opts.scenario,
        timestamp: machine::timestamp_utc(started),
        machine: machine::collect(&opts.workspace, nginx_version, wrk_version, emulation),
        params: RunParams {
            duration_s: opts.duration.as_secs_f64().ceil(),
            warmup_s: if opts.warmup.is_zero() {
                0.0
            } else {
                opts.warmup.as_secs_f64().ceil()
            },
            threads: WRK_THREADS,
            connections: WRK_CONNECTIONS,
            path: PATH.into(),
            proxy_cpu,
            upstream_cpu,
            wrk_cpu,
            clk_tck,
            sluice_args: opts.sluice_args.clone(),
            connection_close: opts.connection_close,
        },
        runs,
        ratios: None,
        plugin_cost: None,
        plugin_cost_same_run: None,
        plugin_cost_side_by_side: side_by_side,
        baseline_side_by_side,
    };
    result.ratios = result.compute_ratios();
    result.plugin_cost_same_run = result.compute_plugin_cost_same_run();
    if opts.scenario == 2 {
        let name = latest_name(1, &result.machine.file_arch(), "json");
        if let Ok(reference) = BenchResult::load(&opts.results.latest.join(&name)) {
            result.plugin_cost = result.plugin_cost_against(&reference, &name);
        }
    }
    let written = write_results(&result, &opts.results)?;
    Ok((result, written))
}

/// wrk's arguments for `connections` against `port`; with `close`, every request on a new
/// connection.
fn proxy_wrk_args(port: u16, connections: u32, duration: Duration, close: bool) -> Vec<String> {
    let mut args = vec![
        format!("-t{WRK_THREADS}"),
        format!("-c{connections}"),
        format!("-d{}", wrk_duration_arg(duration)),
        "--latency".into(),
    ];
    if close {
        args.extend(["-H".into(), "Connection: close".into()]);
    }
    args.push(format!("http://127.0.0.1:{port}{PATH}"));
    args
}

/// True when the kernel has a binfmt_misc interpreter registered for `arch` binaries
/// (e.g. `/proc/sys/fs/binfmt_misc/qemu-aarch64`), so they can be executed directly.
fn binfmt_handles(arch: &str) -> bool {
    std::fs::read_to_string(format!("/proc/sys/fs/binfmt_misc/qemu-{arch}"))
        .is_ok_and(|s| s.lines().next() == Some("enabled"))
}

/// In a scenario-2 run, the dataplane measured again with scenario 1's route (no plugins).
pub const SLUICE_SCENARIO_1: &str = "sluice (scenario 1)";

/// `latest-<scenario>-<arch>.<ext>`.
pub fn latest_name(scenario: u8, arch: &str, ext: &str) -> String {
    format!("latest-{scenario}-{arch}.{ext}")
}

/// Writes `<scenario>-<arch>-<timestamp>.{json,md}` to the history and, for a run with the
/// default dataplane flags, the `latest-*` copies to `bench/results`.
pub fn write_results(result: &BenchResult, dirs: &ResultsDirs) -> Result<Written, BenchError> {
    let arch = result.machine.file_arch();
    let stem = format!("{}-{arch}-{}", result.scenario, result.timestamp);
    let json = result.to_json()? + "\n";
    let md = report::render_markdown(result);
    let written = Written {
        json: dirs.write_history(&format!("{stem}.json"), &json)?,
        markdown: dirs.write_history(&format!("{stem}.md"), &md)?,
    };
    // A run with extra dataplane flags is an experiment: it does not become the reference
    // (`latest-*`, which scenario 2's plugin cost is computed against).
    if !result.params.sluice_args.is_empty() || result.params.connection_close {
        return Ok(written);
    }
    dirs.write_latest(&latest_name(result.scenario, &arch, "json"), &json)?;
    dirs.write_latest(&latest_name(result.scenario, &arch, "md"), &md)?;
    Ok(written)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn connection_close_asks_wrk_for_a_new_connection_per_request() {
        let keep = proxy_wrk_args(8080, 32, Duration::from_secs(5), false);
        assert!(!keep.iter().any(|a| a == "-H"));
        assert_eq!(
            keep.last().map(String::as_str),
            Some("http://127.0.0.1:8080/hello")
        );
        let close = proxy_wrk_args(8080, 32, Duration::from_secs(5), true);
        let h = close.iter().position(|a| a == "-H").expect("a header");
        assert_eq!(close[h + 1], "Connection: close");
        assert_eq!(close.last(), keep.last());
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0,2-4,7"), Some(vec![0, 2, 3, 4, 7]));
        assert_eq!(parse_cpu_list("3"), Some(vec![3]));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("4-2"), None);
        assert_eq!(parse_cpu_list("a-b"), None);
    }

    #[test]
    fn cpu_choice() {
        assert_eq!(pick_cpus(&[0, 1]), Some((0, 1)));
        assert_eq!(pick_cpus(&[2, 5, 6]), Some((2, 5)));
        assert_eq!(pick_cpus(&[0]), None);
        assert_eq!(pick_cpus(&[]), None);
    }

    fn response(headers: &[(&str, &str)], body: &str) -> probe::Response {
        probe::Response {
            status: 200,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn scenario2_plugins_must_show_up() {
        let route_ok = response(&[("x-ratelimit-limit", "2000000000000")], "hello world\n");
        let metrics_ok = response(&[], "apisix_http_status{code=\"200\",route=\"r1\"} 5\n");
        assert!(scenario2_plugin_warnings(&route_ok, Some(&metrics_ok)).is_empty());

        let route_bare = response(&[("content-length", "12")], "hello world\n");
        let metrics_bare = response(&[], "sluice_http_responses_total{class=\"2xx\"} 1\n");
        let w = scenario2_plugin_warnings(&route_bare, Some(&metrics_bare));
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("limit-count"), "{w:?}");
        assert!(w[1].contains("prometheus"), "{w:?}");
        let w = scenario2_plugin_warnings(&route_ok, None);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("prometheus"), "{w:?}");
    }

    #[test]
    fn file_names() {
        assert_eq!(latest_name(2, "aarch64", "md"), "latest-2-aarch64.md");
    }
}
