//! Result files (JSON) and their markdown rendering.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::machine::MachineInfo;
use crate::wrk::WrkReport;

/// A run is flagged noisy when other activity used more than this share of one core.
pub const NOISE_LIMIT: f64 = 0.10;

/// Version of the JSON layout below; bump on incompatible changes.
pub const SCHEMA_VERSION: u32 = 1;

/// DESIGN budget: sluice requests per CPU-second at least this multiple of nginx's.
pub const BUDGET_REQ_PER_CPU: f64 = 1.2;
/// DESIGN budget: sluice p99 at most this multiple of nginx's.
pub const BUDGET_P99: f64 = 1.0;
/// DESIGN budget: scenario 2 (limit-count + prometheus) at least this share of the pure-proxy rate.
pub const BUDGET_PLUGIN_RATE: f64 = 0.95;

/// One benchmark invocation: all proxies of one scenario on one machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    /// [`SCHEMA_VERSION`] at the time of writing.
    pub schema_version: u32,
    /// 1 = pure proxy, 2 = limit-count + prometheus on the route.
    pub scenario: u8,
    /// Start of the run, UTC, `YYYYMMDDTHHMMSSZ`.
    pub timestamp: String,
    /// Where it ran.
    pub machine: MachineInfo,
    /// How the load was generated.
    pub params: RunParams,
    /// One entry per proxy, in run order (nginx first).
    pub runs: Vec<ProxyRun>,
    /// sluice ÷ nginx, when both ran.
    pub ratios: Option<Ratios>,
    /// Scenario 2 only: plugin cost relative to the latest scenario-1 result on this arch.
    pub plugin_cost: Option<PluginCost>,
    /// Scenario 2 only: sluice's requests per CPU-second with the plugins ÷ without them
    /// (scenario 1's route), both measured in this run (budget ≥ [`BUDGET_PLUGIN_RATE`]).
    #[serde(default)]
    pub plugin_cost_same_run: Option<f64>,
    /// Scenario 2 only: the same comparison with both dataplanes loaded at the same time
    /// (see [`SideBySide`]); the figure of record for the budget.
    #[serde(default)]
    pub plugin_cost_side_by_side: Option<SideBySide>,
    /// With `--baseline-bin`: this build beside the baseline build, same scenario, loaded
    /// during the same seconds.
    #[serde(default)]
    pub baseline_side_by_side: Option<BaselineSideBySide>,
}

/// The dataplane under test and a baseline dataplane (`--baseline-bin`, e.g. the main
/// branch's build) on the same scenario, loaded at the same time on the proxy's core by two
/// wrk processes with half the connections each, as [`SideBySide`] does for the plugins.
/// The figure that shows whether a change moved the proxy's cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineSideBySide {
    /// The baseline binary's path.
    pub baseline: String,
    /// The build under test.
    pub build: Share,
    /// The baseline build.
    pub baseline_share: Share,
    /// `build ÷ baseline` in requests per CPU-second (1.0: no change).
    pub ratio: f64,
    /// Whether the baseline, and its wrk, started first (the order alternates between
    /// rounds).
    pub baseline_first: bool,
}

/// Scenario 2's plugin cost measured side by side: the dataplane with the plugins and the
/// same dataplane without them (scenario 1's route) run at the same time on the proxy's
/// core, each loaded by its own wrk with half the connections, during the same seconds.
/// Drifts of the machine's speed (which move sequential runs by ±10% on a shared VM) then
/// act on both alike.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SideBySide {
    /// With the plugins.
    pub with_plugins: Share,
    /// Without them.
    pub without_plugins: Share,
    /// `with_plugins.requests_per_cpu_second ÷ without_plugins.requests_per_cpu_second`
    /// (budget ≥ [`BUDGET_PLUGIN_RATE`]).
    pub ratio: f64,
    /// Whether the dataplane without the plugins, and its wrk, started first (the order
    /// alternates between rounds; the one started first can gain about a point).
    #[serde(default)]
    pub without_first: bool,
}

/// One dataplane's part of a [`SideBySide`] measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Share {
    /// Requests completed.
    pub requests: u64,
    /// The dataplane's CPU time (user + system), seconds.
    pub cpu_seconds: f64,
    /// `requests ÷ cpu_seconds`.
    pub requests_per_cpu_second: f64,
    /// Responses with a status of 400 or above, plus socket errors.
    pub errors: u64,
}

impl SideBySide {
    /// The comparison of two shares; `None` when either used no CPU or saw errors.
    pub fn new(with_plugins: Share, without_plugins: Share) -> Option<Self> {
        if with_plugins.errors > 0 || without_plugins.errors > 0 {
            return None;
        }
        let ratio = ratio(
            with_plugins.requests_per_cpu_second,
            without_plugins.requests_per_cpu_second,
        )?;
        Some(SideBySide {
            with_plugins,
            without_plugins,
            ratio,
            without_first: false,
        })
    }
}

impl Share {
    /// A share from wrk's report and the CPU seconds it cost.
    pub fn new(wrk: &WrkReport, cpu_seconds: f64) -> Self {
        Share {
            requests: wrk.requests,
            cpu_seconds,
            requests_per_cpu_second: if cpu_seconds > 0.0 {
                wrk.requests as f64 / cpu_seconds
            } else {
                f64::NAN
            },
            errors: wrk.non_2xx_3xx + wrk.socket_errors.total(),
        }
    }
}

/// Load-generation parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunParams {
    /// Measured wrk run length, seconds.
    pub duration_s: f64,
    /// Warm-up wrk run length before each measurement, seconds (0 = none).
    pub warmup_s: f64,
    /// wrk `-t`.
    pub threads: u32,
    /// wrk `-c`.
    pub connections: u32,
    /// Request path.
    pub path: String,
    /// CPU the proxy was pinned to, if pinning was possible.
    pub proxy_cpu: Option<usize>,
    /// CPU the upstream nginx was pinned to (`None`: not pinned).
    #[serde(default)]
    pub upstream_cpu: Option<usize>,
    /// CPU wrk was pinned to, if pinning was possible.
    pub wrk_cpu: Option<usize>,
    /// Clock ticks per second used to convert /proc CPU times.
    pub clk_tck: u64,
    /// Extra flags given to sluice-dataplane (`--sluice-arg`).
    #[serde(default)]
    pub sluice_args: Vec<String>,
    /// Every request on a new connection (`--connection-close`).
    #[serde(default)]
    pub connection_close: bool,
}

/// One proxy's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxyRun {
    /// `nginx` or `sluice`.
    pub proxy: String,
    /// Why the proxy was not measured; `None` when it was.
    pub skipped: Option<String>,
    /// The measurements; `None` when skipped.
    pub metrics: Option<Metrics>,
    /// Problems that make the measurement doubtful without preventing it,
    /// e.g. scenario-2 plugins that showed no effect.
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// Measurements of one proxy over the measured wrk run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// wrk's figures.
    pub wrk: WrkReport,
    /// True when wrk saw non-2xx/3xx responses or socket errors: do not trust the rate.
    pub errors_flagged: bool,
    /// CPU seconds (user + system) of the proxy process and all its children.
    pub cpu_seconds: f64,
    /// `cpu_seconds` / wrk's run length (1.0 = one core fully busy).
    pub cpu_utilisation: f64,
    /// Completed requests / `cpu_seconds`.
    pub requests_per_cpu_second: f64,
    /// Peak RSS (VmHWM) summed over the proxy process and its children, KiB.
    pub peak_rss_kib: u64,
    /// CPU seconds of the upstream nginx in the same window (context: is the origin the bottleneck?).
    pub upstream_cpu_seconds: f64,
    /// CPU seconds of the load generator (wrk) in the same window.
    #[serde(default)]
    pub wrk_cpu_seconds: f64,
    /// CPU seconds used by everything else on the machine in the same window
    /// (other processes, interrupts, hypervisor steal). High values mean a noisy run.
    #[serde(default)]
    pub background_cpu_seconds: f64,
    /// True when `background_cpu_seconds` exceeded [`NOISE_LIMIT`] of one core:
    /// the machine was busy and the figures are not comparable.
    #[serde(default)]
    pub noisy: bool,
    /// Share of the proxy's CPU time spent in the kernel (0.0-1.0): what is left for
    /// user-space optimisation to win is `1 - kernel_share`.
    #[serde(default)]
    pub kernel_share: f64,
}

/// CPU seconds of everything in the measured window, as sampled by the runner.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuWindow {
    /// The proxy process tree.
    pub proxy: f64,
    /// The part of `proxy` spent in the kernel (system time).
    pub proxy_system: f64,
    /// The upstream nginx tree.
    pub upstream: f64,
    /// wrk.
    pub wrk: f64,
    /// The whole machine (busy time of all CPUs, including steal).
    pub machine: f64,
}

impl Metrics {
    /// Derives the per-CPU and noise figures from raw measurements.
    pub fn new(wrk: WrkReport, cpu: CpuWindow, peak_rss_kib: u64) -> Self {
        let cpu_seconds = cpu.proxy;
        let background_cpu_seconds = (cpu.machine - cpu.proxy - cpu.upstream - cpu.wrk).max(0.0);
        let requests_per_cpu_second = if cpu_seconds > 0.0 {
            wrk.requests as f64 / cpu_seconds
        } else {
            0.0
        };
        let cpu_utilisation = if wrk.duration_s > 0.0 {
            cpu_seconds / wrk.duration_s
        } else {
            0.0
        };
        let noisy = wrk.duration_s > 0.0 && background_cpu_seconds / wrk.duration_s > NOISE_LIMIT;
        let kernel_share = if cpu_seconds > 0.0 {
            (cpu.proxy_system / cpu_seconds).clamp(0.0, 1.0)
        } else {
            0.0
        };
        Self {
            kernel_share,
            errors_flagged: wrk.has_errors(),
            wrk,
            cpu_seconds,
            cpu_utilisation,
            requests_per_cpu_second,
            peak_rss_kib,
            upstream_cpu_seconds: cpu.upstream,
            wrk_cpu_seconds: cpu.wrk,
            background_cpu_seconds,
            noisy,
        }
    }
}

/// sluice ÷ nginx in the same run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ratios {
    /// Throughput ratio (higher is better).
    pub requests_per_sec: f64,
    /// Efficiency ratio (higher is better; budget ≥ [`BUDGET_REQ_PER_CPU`]).
    pub requests_per_cpu_second: f64,
    /// p99 latency ratio (lower is better; budget ≤ [`BUDGET_P99`]).
    pub p99_latency: f64,
    /// True when either run had errors, which makes the ratios unreliable.
    pub errors_flagged: bool,
    /// True when either run was flagged noisy.
    #[serde(default)]
    pub noisy: bool,
}

/// Scenario 2's cost of the plugins, normalised by nginx to cancel run-to-run drift:
/// `(sluice₂ / nginx₂) / (sluice₁ / nginx₁)` in requests/s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginCost {
    /// The scenario-1 result file used as reference.
    pub reference: String,
    /// Timestamp of that reference.
    pub reference_timestamp: String,
    /// The normalised rate ratio (budget ≥ [`BUDGET_PLUGIN_RATE`]).
    pub normalised_rate_ratio: f64,
}

impl BenchResult {
    /// The metrics of `proxy`, if it was measured.
    pub fn metrics(&self, proxy: &str) -> Option<&Metrics> {
        self.runs
            .iter()
            .find(|r| r.proxy == proxy)
            .and_then(|r| r.metrics.as_ref())
    }

    /// Computes sluice ÷ nginx when both were measured.
    pub fn compute_ratios(&self) -> Option<Ratios> {
        let n = self.metrics("nginx")?;
        let s = self.metrics("sluice")?;
        Some(Ratios {
            requests_per_sec: ratio(s.wrk.requests_per_sec, n.wrk.requests_per_sec)?,
            requests_per_cpu_second: ratio(s.requests_per_cpu_second, n.requests_per_cpu_second)?,
            p99_latency: ratio(s.wrk.p99_ms, n.wrk.p99_ms)?,
            errors_flagged: n.errors_flagged || s.errors_flagged,
            noisy: n.noisy || s.noisy,
        })
    }

    /// Scenario 2: sluice's req/CPU-s with plugins ÷ the same dataplane without them, both
    /// from this run.
    pub fn compute_plugin_cost_same_run(&self) -> Option<f64> {
        if self.scenario != 2 {
            return None;
        }
        let with = self.metrics("sluice")?;
        let without = self.metrics(crate::runner::SLUICE_SCENARIO_1)?;
        ratio(
            with.requests_per_cpu_second,
            without.requests_per_cpu_second,
        )
    }

    /// For a scenario-2 result, the plugin cost against a scenario-1 `reference`.
    pub fn plugin_cost_against(
        &self,
        reference: &BenchResult,
        reference_name: &str,
    ) -> Option<PluginCost> {
        if self.scenario != 2 || reference.scenario != 1 {
            return None;
        }
        // With plugins that did not run, the "cost" would be meaningless.
        if self
            .runs
            .iter()
            .any(|r| r.proxy == "sluice" && !r.warnings.is_empty())
        {
            return None;
        }
        let now = self.compute_ratios()?;
        let before = reference.compute_ratios()?;
        Some(PluginCost {
            reference: reference_name.to_owned(),
            reference_timestamp: reference.timestamp.clone(),
            normalised_rate_ratio: ratio(now.requests_per_sec, before.requests_per_sec)?,
        })
    }

    /// Reads a result file.
    pub fn load(path: &Path) -> Result<Self, BenchError> {
        let text = std::fs::read_to_string(path).map_err(|e| BenchError::io("read", path, e))?;
        serde_json::from_str(&text).map_err(|e| BenchError::Json {
            path: path.to_owned(),
            source: e,
        })
    }

    /// Pretty JSON text of this result.
    pub fn to_json(&self) -> Result<String, BenchError> {
        serde_json::to_string_pretty(self).map_err(|e| BenchError::Json {
            path: "<memory>".into(),
            source: e,
        })
    }
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0 && a.is_finite()).then(|| a / b)
}

/// `1234567.8` → `1,234,568`.
pub fn thousands(v: f64) -> String {
    let n = v.round().max(0.0) as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

fn scenario_title(s: u8) -> &'static str {
    match s {
        1 => "pure proxy",
        2 => "limit-count + prometheus",
        3 => "HTTPRoute with timeouts and a retry policy",
        4 => "HTTPRoute without them",
        5 => "ingress-nginx Ingress with annotations",
        6 => "the equivalent ApisixRoute",
        _ => "unknown scenario",
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "meets" } else { "MISSES" }
}

fn errors_cell(m: &Metrics) -> String {
    if !m.errors_flagged {
        return "0".into();
    }
    let se = m.wrk.socket_errors;
    format!(
        "**FLAGGED** {} non-2xx, socket c{}/r{}/w{}/t{}",
        m.wrk.non_2xx_3xx, se.connect, se.read, se.write, se.timeout
    )
}

/// What an emulated result is and is not, for reports and charts.
pub fn emulation_note(e: &crate::machine::Emulation) -> String {
    format!(
        "EMULATED: sluice-dataplane ({}) ran under {} on an {} host{}; nginx, the origin and \
         wrk ran natively. These figures measure the emulator, not {} hardware (not a \
         Graviton measurement); its sluice ÷ nginx ratios compare emulated code with native \
         nginx.",
        e.guest_arch,
        e.emulator,
        e.host_arch,
        if e.harness_emulated {
            " (sluice-bench too)"
        } else {
            ""
        },
        e.guest_arch
    )
}

/// Renders the result as a markdown report (title, machine, table, ratios).
pub fn render_markdown(r: &BenchResult) -> String {
    let mut s = String::new();
    let m = &r.machine;
    let p = &r.params;
    let _ = writeln!(
        s,
        "## Sluice vs nginx, scenario {} ({}), {}, {}\n",
        r.scenario,
        scenario_title(r.scenario),
        m.arch_label(),
        r.timestamp
    );
    if let Some(e) = &m.emulation {
        let _ = writeln!(s, "**{}**\n", emulation_note(e));
    }
    let _ = writeln!(
        s,
        "- machine: {} × {} CPUs, kernel {}, {}, {}",
        m.cpu_model, m.nproc, m.kernel, m.nginx_version, m.wrk_version
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
    if !p.sluice_args.is_empty() {
        let _ = writeln!(s, "- sluice flags: `{}`", p.sluice_args.join(" "));
    }
    if p.connection_close {
        let _ = writeln!(
            s,
            "- every request on a new connection (wrk sends `Connection: close`)"
        );
    }
    let pin = match (p.wrk_cpu, p.proxy_cpu, p.upstream_cpu) {
        (Some(w), Some(x), Some(u)) if u == x => {
            format!("wrk on CPU {w}, proxy and upstream on CPU {x}")
        }
        (Some(w), Some(x), Some(u)) => {
            format!("wrk on CPU {w}, proxy on CPU {x}, upstream on CPU {u}")
        }
        (Some(w), Some(x), None) => {
            format!("wrk on CPU {w}, proxy on CPU {x}, upstream not pinned")
        }
        _ => "no CPU pinning (fewer than 2 CPUs)".into(),
    };
    let _ = writeln!(
        s,
        "- load: `wrk -t{} -c{} -d{}s --latency {}`, {}; {}\n",
        p.threads,
        p.connections,
        p.duration_s,
        p.path,
        if p.warmup_s > 0.0 {
            format!("after a {}s warm-up", p.warmup_s)
        } else {
            "no warm-up".to_owned()
        },
        pin
    );
    let _ = writeln!(
        s,
        "| proxy | req/s | p50 ms | p90 ms | p99 ms | errors | proxy CPU-s | CPU % | req/CPU-s | peak RSS MiB | upstream CPU-s | wrk CPU-s | other CPU-s | proxy kernel % |"
    );
    let _ = writeln!(
        s,
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for run in &r.runs {
        match (&run.metrics, &run.skipped) {
            (Some(x), _) => {
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.2} | {:.2} | {:.2} | {} | {:.2} | {:.0}% | {} | {} | {:.2} | {:.2} | {:.2}{} | {:.0}% |",
                    run.proxy,
                    thousands(x.wrk.requests_per_sec),
                    x.wrk.p50_ms,
                    x.wrk.p90_ms,
                    x.wrk.p99_ms,
                    errors_cell(x),
                    x.cpu_seconds,
                    x.cpu_utilisation * 100.0,
                    thousands(x.requests_per_cpu_second),
                    mib(x.peak_rss_kib),
                    x.upstream_cpu_seconds,
                    x.wrk_cpu_seconds,
                    x.background_cpu_seconds,
                    if x.noisy { " **NOISY**" } else { "" },
                    x.kernel_share * 100.0,
                );
            }
            (None, reason) => {
                let reason = reason
                    .as_deref()
                    .unwrap_or("not run")
                    .replace('|', "\\|")
                    .replace('\n', " ");
                let _ = writeln!(
                    s,
                    "| {} | skipped: {} | | | | | | | | | |",
                    run.proxy, reason
                );
            }
        }
    }
    s.push('\n');
    for run in &r.runs {
        for w in &run.warnings {
            let _ = writeln!(s, "**WARNING ({}): {}**\n", run.proxy, w);
        }
    }
    if r.ratios.is_none()
        && r.runs
            .iter()
            .filter_map(|x| x.metrics.as_ref())
            .any(|m| m.noisy)
    {
        let _ = writeln!(
            s,
            "**Other processes used more than {:.0}% of a core during a measured run (NOISY); rerun on a quiet machine.**\n",
            NOISE_LIMIT * 100.0
        );
    }
    match &r.ratios {
        Some(q) => {
            let _ = writeln!(s, "| sluice ÷ nginx | ratio | budget |");
            let _ = writeln!(s, "|---|---:|---|");
            let _ = writeln!(
                s,
                "| req/s | {:.2}× | (higher is better) |",
                q.requests_per_sec
            );
            let _ = writeln!(
                s,
                "| req/CPU-s | {:.2}× | ≥ {BUDGET_REQ_PER_CPU:.2}×: {} |",
                q.requests_per_cpu_second,
                verdict(q.requests_per_cpu_second >= BUDGET_REQ_PER_CPU)
            );
            let _ = writeln!(
                s,
                "| p99 latency | {:.2}× | ≤ {BUDGET_P99:.2}×: {} |",
                q.p99_latency,
                verdict(q.p99_latency <= BUDGET_P99)
            );
            if q.noisy {
                let _ = writeln!(
                    s,
                    "\n**Other processes used more than {:.0}% of a core during a measured run (NOISY); rerun on a quiet machine.**",
                    NOISE_LIMIT * 100.0
                );
            }
            if q.errors_flagged {
                let _ = writeln!(
                    s,
                    "\n**Errors were seen in at least one run; the ratios are not reliable.**"
                );
            }
        }
        None => {
            let _ = writeln!(
                s,
                "No sluice ÷ nginx ratios: both proxies must be measured in the same run."
            );
        }
    }
    if let (Some(c), Some(n), Some(s2), Some(s1)) = (
        r.plugin_cost_same_run,
        r.metrics("nginx"),
        r.metrics("sluice"),
        r.metrics(crate::runner::SLUICE_SCENARIO_1),
    ) {
        let _ = writeln!(
            s,
            "\nPlugin cost, same run: sluice with the plugins {:.0} req/CPU-s ÷ without them (scenario 1's route) {:.0} = {:.2}× (budget ≥ {BUDGET_PLUGIN_RATE:.2}×: {}); with the plugins ÷ nginx's plain proxy {:.0} = {:.2}× (budget > 1: {})",
            s2.requests_per_cpu_second,
            s1.requests_per_cpu_second,
            c,
            verdict(c >= BUDGET_PLUGIN_RATE),
            n.requests_per_cpu_second,
            s2.requests_per_cpu_second / n.requests_per_cpu_second,
            verdict(s2.requests_per_cpu_second > n.requests_per_cpu_second)
        );
    }
    if let Some(x) = &r.plugin_cost_side_by_side {
        let _ = writeln!(
            s,
            "\nPlugin cost, side by side (both dataplanes loaded during the same {:.0} s, {} connections each, the one {} the plugins started first): with the plugins {} requests in {:.2} CPU-s = {:.0} req/CPU-s ÷ without them {} requests in {:.2} CPU-s = {:.0} req/CPU-s = **{:.3}×** (budget ≥ {BUDGET_PLUGIN_RATE:.2}×: {})",
            r.params.duration_s,
            r.params.connections / 2,
            if x.without_first { "without" } else { "with" },
            x.with_plugins.requests,
            x.with_plugins.cpu_seconds,
            x.with_plugins.requests_per_cpu_second,
            x.without_plugins.requests,
            x.without_plugins.cpu_seconds,
            x.without_plugins.requests_per_cpu_second,
            x.ratio,
            verdict(x.ratio >= BUDGET_PLUGIN_RATE)
        );
    }
    if let Some(x) = &r.baseline_side_by_side {
        let _ = writeln!(
            s,
            "\nThis build beside the baseline `{}` (both loaded during the same {:.0} s, {} connections each, the {} started first): this build {} requests in {:.2} CPU-s = {:.0} req/CPU-s ÷ baseline {} requests in {:.2} CPU-s = {:.0} req/CPU-s = **{:.3}×**",
            x.baseline,
            r.params.duration_s,
            r.params.connections / 2,
            if x.baseline_first {
                "baseline"
            } else {
                "build"
            },
            x.build.requests,
            x.build.cpu_seconds,
            x.build.requests_per_cpu_second,
            x.baseline_share.requests,
            x.baseline_share.cpu_seconds,
            x.baseline_share.requests_per_cpu_second,
            x.ratio
        );
    }
    if let Some(c) = &r.plugin_cost {
        let _ = writeln!(
            s,
            "\nPlugin cost: (sluice/nginx req/s here) ÷ (same in {} from {}) = {:.2}× (budget ≥ {BUDGET_PLUGIN_RATE:.2}×: {})",
            c.reference,
            c.reference_timestamp,
            c.normalised_rate_ratio,
            verdict(c.normalised_rate_ratio >= BUDGET_PLUGIN_RATE)
        );
    }
    s
}

/// Renders two result files side by side: every metric of every proxy, A, B and B ÷ A.
pub fn render_compare(a: &BenchResult, b: &BenchResult, a_name: &str, b_name: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## {a_name} (A) vs {b_name} (B)\n");
    let _ = writeln!(s, "| | A | B | B ÷ A |");
    let _ = writeln!(s, "|---|---|---|---:|");
    let text_row = |s: &mut String, label: &str, x: &str, y: &str| {
        let _ = writeln!(s, "| {label} | {x} | {y} | |");
    };
    text_row(
        &mut s,
        "scenario",
        &a.scenario.to_string(),
        &b.scenario.to_string(),
    );
    text_row(&mut s, "timestamp", &a.timestamp, &b.timestamp);
    text_row(
        &mut s,
        "arch",
        &a.machine.arch_label(),
        &b.machine.arch_label(),
    );
    let emulated = |r: &BenchResult| {
        r.machine
            .emulation
            .as_ref()
            .map_or_else(|| "native".to_owned(), |e| e.emulator.clone())
    };
    text_row(&mut s, "execution", &emulated(a), &emulated(b));
    text_row(&mut s, "cpu", &a.machine.cpu_model, &b.machine.cpu_model);
    text_row(
        &mut s,
        "nproc",
        &a.machine.nproc.to_string(),
        &b.machine.nproc.to_string(),
    );
    text_row(&mut s, "kernel", &a.machine.kernel, &b.machine.kernel);
    text_row(
        &mut s,
        "nginx",
        &a.machine.nginx_version,
        &b.machine.nginx_version,
    );
    text_row(
        &mut s,
        "commit",
        &a.machine.git_commit,
        &b.machine.git_commit,
    );
    text_row(
        &mut s,
        "duration s",
        &a.params.duration_s.to_string(),
        &b.params.duration_s.to_string(),
    );

    let num_row = |s: &mut String,
                   label: &str,
                   x: Option<f64>,
                   y: Option<f64>,
                   fmt: &dyn Fn(f64) -> String| {
        let cell = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), fmt);
        let r = match (x, y) {
            (Some(x), Some(y)) => {
                ratio(y, x).map_or_else(|| "–".to_owned(), |q| format!("{q:.2}×"))
            }
            _ => "–".to_owned(),
        };
        let _ = writeln!(s, "| {label} | {} | {} | {r} |", cell(x), cell(y));
    };
    let mut proxies: Vec<&str> = a.runs.iter().map(|r| r.proxy.as_str()).collect();
    for r in &b.runs {
        if !proxies.contains(&r.proxy.as_str()) {
            proxies.push(&r.proxy);
        }
    }
    let int = |v: f64| thousands(v);
    let ms = |v: f64| format!("{v:.2}");
    for proxy in proxies {
        let (x, y) = (a.metrics(proxy), b.metrics(proxy));
        let f = |m: Option<&Metrics>, g: fn(&Metrics) -> f64| m.map(g);
        num_row(
            &mut s,
            &format!("{proxy} req/s"),
            f(x, |m| m.wrk.requests_per_sec),
            f(y, |m| m.wrk.requests_per_sec),
            &int,
        );
        num_row(
            &mut s,
            &format!("{proxy} p50 ms"),
            f(x, |m| m.wrk.p50_ms),
            f(y, |m| m.wrk.p50_ms),
            &ms,
        );
        num_row(
            &mut s,
            &format!("{proxy} p90 ms"),
            f(x, |m| m.wrk.p90_ms),
            f(y, |m| m.wrk.p90_ms),
            &ms,
        );
        num_row(
            &mut s,
            &format!("{proxy} p99 ms"),
            f(x, |m| m.wrk.p99_ms),
            f(y, |m| m.wrk.p99_ms),
            &ms,
        );
        num_row(
            &mut s,
            &format!("{proxy} CPU %"),
            f(x, |m| m.cpu_utilisation * 100.0),
            f(y, |m| m.cpu_utilisation * 100.0),
            &|v| format!("{v:.0}%"),
        );
        num_row(
            &mut s,
            &format!("{proxy} req/CPU-s"),
            f(x, |m| m.requests_per_cpu_second),
            f(y, |m| m.requests_per_cpu_second),
            &int,
        );
        num_row(
            &mut s,
            &format!("{proxy} peak RSS MiB"),
            f(x, |m| m.peak_rss_kib as f64 / 1024.0),
            f(y, |m| m.peak_rss_kib as f64 / 1024.0),
            &|v| format!("{v:.1}"),
        );
        let flagged = |m: Option<&Metrics>| {
            m.map_or("–", |m| if m.errors_flagged { "FLAGGED" } else { "none" })
        };
        text_row(&mut s, &format!("{proxy} errors"), flagged(x), flagged(y));
    }
    let q = |r: &BenchResult, g: fn(&Ratios) -> f64| r.ratios.as_ref().map(g);
    let x2 = |v: f64| format!("{v:.2}×");
    num_row(
        &mut s,
        "sluice÷nginx req/s",
        q(a, |r| r.requests_per_sec),
        q(b, |r| r.requests_per_sec),
        &x2,
    );
    num_row(
        &mut s,
        "sluice÷nginx req/CPU-s",
        q(a, |r| r.requests_per_cpu_second),
        q(b, |r| r.requests_per_cpu_second),
        &x2,
    );
    num_row(
        &mut s,
        "sluice÷nginx p99",
        q(a, |r| r.p99_latency),
        q(b, |r| r.p99_latency),
        &x2,
    );
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::wrk::SocketErrors;

    fn wrk(rps: f64, p99: f64, non2xx: u64) -> WrkReport {
        WrkReport {
            requests: (rps * 10.0) as u64,
            duration_s: 10.0,
            requests_per_sec: rps,
            latency_avg_ms: 0.8,
            latency_max_ms: 10.0,
            p50_ms: 0.8,
            p75_ms: 0.9,
            p90_ms: 1.0,
            p99_ms: p99,
            non_2xx_3xx: non2xx,
            socket_errors: SocketErrors::default(),
        }
    }

    /// Metrics on a quiet machine: only proxy and upstream used CPU.
    fn metrics(w: WrkReport, proxy: f64, rss: u64, upstream: f64) -> Metrics {
        Metrics::new(
            w,
            CpuWindow {
                proxy,
                proxy_system: proxy / 2.0,
                upstream,
                wrk: 0.0,
                machine: proxy + upstream,
            },
            rss,
        )
    }

    fn result(scenario: u8, runs: Vec<ProxyRun>) -> BenchResult {
        let mut r = BenchResult {
            schema_version: SCHEMA_VERSION,
            scenario,
            timestamp: "20250101T000000Z".into(),
            machine: MachineInfo {
                arch: "x86_64".into(),
                nproc: 2,
                kernel: "6.1".into(),
                cpu_model: "Test CPU".into(),
                nginx_version: "nginx/1.22.1".into(),
                wrk_version: "wrk 4.1.0".into(),
                git_commit: "abcdef0".into(),
                git_dirty: false,
                emulation: None,
            },
            params: RunParams {
                duration_s: 10.0,
                warmup_s: 2.0,
                threads: 1,
                connections: 64,
                path: "/hello".into(),
                proxy_cpu: Some(0),
                upstream_cpu: Some(0),
                wrk_cpu: Some(1),
                clk_tck: 100,
                sluice_args: Vec::new(),
                connection_close: false,
            },
            runs,
            ratios: None,
            plugin_cost: None,
            plugin_cost_same_run: None,
            plugin_cost_side_by_side: None,
            baseline_side_by_side: None,
        };
        r.ratios = r.compute_ratios();
        r
    }

    fn run(proxy: &str, m: Metrics) -> ProxyRun {
        ProxyRun {
            proxy: proxy.into(),
            skipped: None,
            metrics: Some(m),
            warnings: Vec::new(),
        }
    }

    #[test]
    fn scenario_2_reports_the_plugin_cost_against_sluice_without_plugins_in_the_same_run() {
        // nginx 40k req/CPU-s; sluice with plugins 50k; the same dataplane without 50k.
        let mut r = result(
            2,
            vec![
                run("nginx", metrics(wrk(40_000.0, 2.0, 0), 10.0, 1, 1.0)),
                run("sluice", metrics(wrk(50_000.0, 2.0, 0), 10.0, 1, 1.0)),
                run(
                    crate::runner::SLUICE_SCENARIO_1,
                    metrics(wrk(50_000.0, 2.0, 0), 10.0, 1, 1.0),
                ),
            ],
        );
        r.plugin_cost_same_run = r.compute_plugin_cost_same_run();
        let c = r.plugin_cost_same_run.unwrap();
        assert!((c - 1.0).abs() < 1e-9, "{c}");
        // The nginx ratio is sluice-with-plugins ÷ nginx, not the plugin-less run.
        assert!((r.ratios.as_ref().unwrap().requests_per_cpu_second - 1.25).abs() < 1e-9);
        let md = render_markdown(&r);
        assert!(
            md.contains(
                "plugins 50000 req/CPU-s ÷ without them (scenario 1's route) 50000 = 1.00× (budget ≥ 0.95×: meets)"
            ),
            "{md}"
        );
        assert!(
            md.contains("÷ nginx's plain proxy 40000 = 1.25× (budget > 1: meets)"),
            "{md}"
        );
        // Side by side: 60,000 requests in 1.5 CPU-s with the plugins, 64,000 in 1.5 without.
        let with = Share::new(&wrk(6_000.0, 2.0, 0), 1.5);
        let without = Share::new(&wrk(6_400.0, 2.0, 0), 1.5);
        assert_eq!(with.requests, 60_000);
        r.plugin_cost_side_by_side = SideBySide::new(with.clone(), without.clone());
        let x = r.plugin_cost_side_by_side.as_ref().unwrap();
        assert!((x.ratio - 0.9375).abs() < 1e-9, "{}", x.ratio);
        let md = render_markdown(&r);
        assert!(
            md.contains("= 40000 req/CPU-s ÷ without them 64000 requests in 1.50 CPU-s = 42667 req/CPU-s = **0.938×** (budget ≥ 0.95×: MISSES)"),
            "{md}"
        );
        assert!(
            md.contains("the one with the plugins started first"),
            "{md}"
        );
        // Rounds alternate the start order; the report says which went first, and older
        // result files (without the field) read as "with the plugins first".
        let mut swapped = r.clone();
        if let Some(x) = swapped.plugin_cost_side_by_side.as_mut() {
            x.without_first = true;
        }
        let md = render_markdown(&swapped);
        assert!(
            md.contains("the one without the plugins started first"),
            "{md}"
        );
        let mut json = serde_json::to_value(x).unwrap();
        json.as_object_mut().unwrap().remove("without_first");
        let old: SideBySide = serde_json::from_value(json).unwrap();
        assert!(!old.without_first);
        // Errors on either side void the comparison.
        assert!(SideBySide::new(Share::new(&wrk(6_000.0, 2.0, 3), 1.5), without).is_none());
        // Scenario 1 has no such figure.
        let s1 = result(
            1,
            vec![run("sluice", metrics(wrk(1.0, 1.0, 0), 1.0, 1, 1.0))],
        );
        assert_eq!(s1.compute_plugin_cost_same_run(), None);
    }

    #[test]
    fn a_baseline_side_by_side_is_reported_as_build_over_baseline() {
        let mut r = result(
            1,
            vec![run("sluice", metrics(wrk(50_000.0, 2.0, 0), 10.0, 1, 1.0))],
        );
        assert!(!render_markdown(&r).contains("beside the baseline"));
        let build = Share::new(&wrk(6_300.0, 2.0, 0), 1.5);
        let base = Share::new(&wrk(6_000.0, 2.0, 0), 1.5);
        let x = SideBySide::new(build, base).unwrap();
        r.baseline_side_by_side = Some(BaselineSideBySide {
            baseline: "/tmp/main/sluice-dataplane".into(),
            build: x.with_plugins,
            baseline_share: x.without_plugins,
            ratio: x.ratio,
            baseline_first: true,
        });
        let md = render_markdown(&r);
        assert!(
            md.contains("beside the baseline `/tmp/main/sluice-dataplane`"),
            "{md}"
        );
        assert!(md.contains("the baseline started first"), "{md}");
        assert!(
            md.contains("= 42000 req/CPU-s ÷ baseline 60000 requests in 1.50 CPU-s = 40000 req/CPU-s = **1.050×**"),
            "{md}"
        );
        // Result files written before the field existed still load.
        let mut json = serde_json::to_value(&r).unwrap();
        json.as_object_mut()
            .unwrap()
            .remove("baseline_side_by_side");
        let old: BenchResult = serde_json::from_value(json).unwrap();
        assert!(old.baseline_side_by_side.is_none());
    }

    #[test]
    fn metrics_derive_per_cpu_figures() {
        let m = metrics(wrk(70_000.0, 1.5, 0), 9.0, 4096, 3.0);
        assert!((m.requests_per_cpu_second - 700_000.0 / 9.0).abs() < 1e-6);
        assert!((m.cpu_utilisation - 0.9).abs() < 1e-9);
        assert!(!m.errors_flagged);
        assert!(metrics(wrk(1.0, 1.0, 5), 1.0, 0, 0.0).errors_flagged);
        assert_eq!(
            metrics(wrk(1.0, 1.0, 0), 0.0, 0, 0.0).requests_per_cpu_second,
            0.0
        );
    }

    #[test]
    fn ratios_are_sluice_over_nginx() {
        let r = result(
            1,
            vec![
                run("nginx", metrics(wrk(70_000.0, 2.0, 0), 10.0, 4096, 3.0)),
                run("sluice", metrics(wrk(84_000.0, 1.0, 0), 8.0, 8192, 3.0)),
            ],
        );
        let q = r.ratios.clone().unwrap();
        assert!((q.requests_per_sec - 1.2).abs() < 1e-9);
        // nginx 70k/CPU-s, sluice 105k/CPU-s
        assert!((q.requests_per_cpu_second - 1.5).abs() < 1e-9);
        assert!((q.p99_latency - 0.5).abs() < 1e-9);
        assert!(!q.errors_flagged);
        let md = render_markdown(&r);
        assert!(md.contains("| nginx | 70,000 |"), "{md}");
        assert!(
            md.contains("| req/CPU-s | 1.50× | ≥ 1.20×: meets |"),
            "{md}"
        );
        assert!(
            md.contains("| p99 latency | 0.50× | ≤ 1.00×: meets |"),
            "{md}"
        );
        assert!(md.contains("| 4.0 |"), "peak RSS in MiB: {md}");
    }

    #[test]
    fn skipped_sluice_has_no_ratios_and_says_why() {
        let r = result(
            1,
            vec![
                run("nginx", metrics(wrk(70_000.0, 2.0, 0), 10.0, 4096, 3.0)),
                ProxyRun {
                    proxy: "sluice".into(),
                    skipped: Some("binary exited with status 1".into()),
                    metrics: None,
                    warnings: Vec::new(),
                },
            ],
        );
        assert!(r.ratios.is_none());
        let md = render_markdown(&r);
        assert!(
            md.contains("| sluice | skipped: binary exited with status 1 |"),
            "{md}"
        );
        assert!(md.contains("No sluice ÷ nginx ratios"), "{md}");
    }

    #[test]
    fn errors_are_flagged_in_table_and_ratios() {
        let r = result(
            1,
            vec![
                run("nginx", metrics(wrk(70_000.0, 2.0, 0), 10.0, 4096, 3.0)),
                run("sluice", metrics(wrk(90_000.0, 3.0, 12), 10.0, 4096, 3.0)),
            ],
        );
        let md = render_markdown(&r);
        assert!(md.contains("**FLAGGED** 12 non-2xx"), "{md}");
        assert!(md.contains("ratios are not reliable"), "{md}");
        assert!(
            md.contains("| p99 latency | 1.50× | ≤ 1.00×: MISSES |"),
            "{md}"
        );
        assert!(r.ratios.unwrap().errors_flagged);
    }

    #[test]
    fn kernel_share_is_system_time_over_proxy_time() {
        let m = Metrics::new(
            wrk(70_000.0, 2.0, 0),
            CpuWindow {
                proxy: 8.0,
                proxy_system: 6.0,
                upstream: 3.0,
                wrk: 0.0,
                machine: 11.0,
            },
            0,
        );
        assert!((m.kernel_share - 0.75).abs() < 1e-9);
    }

    #[test]
    fn background_cpu_marks_a_noisy_run() {
        let cpu = |machine| CpuWindow {
            proxy: 9.0,
            proxy_system: 6.0,
            upstream: 3.0,
            wrk: 8.0,
            machine,
        };
        // 0.5 CPU-s of others over 10 s = 5% of a core: fine.
        let quiet = Metrics::new(wrk(70_000.0, 2.0, 0), cpu(20.5), 0);
        assert!((quiet.background_cpu_seconds - 0.5).abs() < 1e-9);
        assert!(!quiet.noisy);
        // 5 CPU-s of others over 10 s = 50% of a core: noisy.
        let busy = Metrics::new(wrk(70_000.0, 2.0, 0), cpu(25.0), 0);
        assert!(busy.noisy);
        let r = result(1, vec![run("nginx", quiet.clone()), run("sluice", busy)]);
        assert!(r.ratios.as_ref().unwrap().noisy);
        let md = render_markdown(&r);
        assert!(md.contains("| 5.00 **NOISY** |"), "{md}");
        assert!(md.contains("rerun on a quiet machine"), "{md}");
        let calm = result(1, vec![run("nginx", quiet)]);
        assert!(!render_markdown(&calm).contains("NOISY"));
    }

    #[test]
    fn json_round_trip() {
        let r = result(
            1,
            vec![run(
                "nginx",
                metrics(wrk(70_000.0, 2.0, 0), 10.0, 4096, 3.0),
            )],
        );
        let text = r.to_json().unwrap();
        let back: BenchResult = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        assert!(text.contains("\"requests_per_cpu_second\""));
    }

    #[test]
    fn plugin_cost_normalises_by_nginx() {
        let s1 = result(
            1,
            vec![
                run("nginx", metrics(wrk(70_000.0, 2.0, 0), 10.0, 0, 0.0)),
                run("sluice", metrics(wrk(84_000.0, 2.0, 0), 10.0, 0, 0.0)),
            ],
        );
        // nginx drifted down 10% in the second run; sluice lost 5.5% to drift and plugins.
        let s2 = result(
            2,
            vec![
                run("nginx", metrics(wrk(63_000.0, 2.0, 0), 10.0, 0, 0.0)),
                run("sluice", metrics(wrk(71_820.0, 2.0, 0), 10.0, 0, 0.0)),
            ],
        );
        let c = s2.plugin_cost_against(&s1, "latest-1-x86_64.json").unwrap();
        assert!((c.normalised_rate_ratio - 0.95).abs() < 1e-9, "{c:?}");
        assert!(s1.plugin_cost_against(&s2, "x").is_none());

        // Plugins that did not run: no cost figure, and the warning is shown.
        let mut inactive = s2.clone();
        inactive.runs[1].warnings = vec!["limit-count not active".into()];
        assert!(inactive.plugin_cost_against(&s1, "x").is_none());
        let md = render_markdown(&inactive);
        assert!(
            md.contains("**WARNING (sluice): limit-count not active**"),
            "{md}"
        );
    }

    #[test]
    fn compare_shows_b_over_a() {
        let a = result(
            1,
            vec![run(
                "nginx",
                metrics(wrk(70_000.0, 2.0, 0), 10.0, 4096, 3.0),
            )],
        );
        let mut b = a.clone();
        b.machine.arch = "aarch64".into();
        b.runs = vec![run(
            "nginx",
            metrics(wrk(35_000.0, 4.0, 0), 10.0, 4096, 3.0),
        )];
        let md = render_compare(&a, &b, "a.json", "b.json");
        assert!(md.contains("| arch | x86_64 | aarch64 | |"), "{md}");
        assert!(md.contains("| execution | native | native | |"), "{md}");
        assert!(!render_markdown(&b).contains("EMULATED"));

        // An arm64 dataplane under qemu-user says so wherever it is shown.
        b.machine.emulation = crate::machine::emulation(
            "aarch64",
            "x86_64",
            Some("aarch64"),
            Some("qemu-aarch64-static (qemu-aarch64 version 7.2.22)".into()),
        );
        let md = render_compare(&a, &b, "a.json", "b.json");
        assert!(
            md.contains("| arch | x86_64 | aarch64 under qemu-user on x86_64 | |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| execution | native | qemu-aarch64-static (qemu-aarch64 version 7.2.22) | |"
            ),
            "{md}"
        );
        let report = render_markdown(&b);
        assert!(
            report.contains("aarch64 under qemu-user on x86_64"),
            "{report}"
        );
        assert!(
            report.contains("**EMULATED: sluice-dataplane (aarch64) ran under qemu-aarch64-static"),
            "{report}"
        );
        assert!(report.contains("not a Graviton measurement"), "{report}");
        assert!(
            md.contains("| nginx req/s | 70,000 | 35,000 | 0.50× |"),
            "{md}"
        );
        assert!(
            md.contains("| nginx p99 ms | 2.00 | 4.00 | 2.00× |"),
            "{md}"
        );
        assert!(md.contains("| sluice÷nginx req/s | – | – | – |"), "{md}");
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(1_234_567.8), "1,234,568");
    }
}
