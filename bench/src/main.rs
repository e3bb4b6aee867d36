//! `sluice-bench`: run the proxy benchmark or compare two result files.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};

use sluice_bench::duration::parse_duration;
use sluice_bench::process;
use sluice_bench::report::{self, BenchResult};
use sluice_bench::results::ResultsDirs;
use sluice_bench::runner::{self, Only, ProxyOptions, UpstreamCpu};

/// Whole-process benchmark: Sluice side by side with nginx (APISIX single-worker setup).
#[derive(Debug, Parser)]
#[command(name = "sluice-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Benchmark nginx and sluice in turn against one nginx origin on 127.0.0.1:1980.
    Proxy {
        /// 1 = pure proxy; 2 = limit-count + prometheus on the route; 3 = a Gateway API
        /// HTTPRoute with request and backend-request timeouts and a retry policy; 4 = the
        /// same HTTPRoute without them; 5 = an Ingress written for ingress-nginx (class
        /// `nginx`, with `--sluice-arg=--ingress-nginx-class=nginx`) with CORS, a body-size
        /// limit, a source range and an upstream Host; 6 = the ApisixRoute with the same
        /// plugins and timeouts.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=6))]
        scenario: u8,
        /// Length of the measured wrk run (`10s`, `1m`; wrk rounds up to whole seconds).
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        duration: Duration,
        /// Warm-up wrk run before each measurement; `0s` is not allowed, use `--no-warmup`.
        #[arg(long, default_value = "2s", value_parser = parse_duration)]
        warmup: Duration,
        /// Skip the warm-up run.
        #[arg(long)]
        no_warmup: bool,
        /// Use this sluice-dataplane binary instead of building it with `cargo build --release`.
        #[arg(long, value_name = "PATH")]
        sluice_bin: Option<PathBuf>,
        /// Measure only one proxy (no ratios then).
        #[arg(long, value_enum)]
        only: Option<OnlyArg>,
        /// Sluice checkout holding bench/config (default: the one this binary was built from).
        #[arg(long, value_name = "DIR", env = "SLUICE_WORKSPACE")]
        workspace: Option<PathBuf>,
        /// Where result files are written (history; default: $SLUICE_CACHE/bench/results, i.e. ~/.cache/sluice/bench/results; the latest-* copies go to bench/results in the workspace).
        #[arg(long, value_name = "DIR")]
        results_dir: Option<PathBuf>,
        /// How long a proxy may take to answer its first request correctly.
        #[arg(long, default_value = "20s", value_parser = parse_duration)]
        ready_timeout: Duration,
        /// Core of the upstream nginx: with the proxy (APISIX 2-core setup), with wrk, or unpinned.
        #[arg(long, value_enum, default_value = "proxy")]
        upstream_cpu: UpstreamArg,
        /// Run the dataplane through this user-mode emulator (e.g. `qemu-aarch64-static` for an
        /// arm64 `--sluice-bin` on an x86_64 host); nginx and wrk stay native. The result is
        /// labelled emulated and written as `<scenario>-<arch>-qemu-*.json`.
        #[arg(long, value_name = "PROGRAM")]
        emulator: Option<PathBuf>,
        /// Rounds of nginx-then-sluice to run; with more than one, a summary gives each
        /// round's ratios and their median (this machine's throughput drifts 10-20% between
        /// runs, so one round's ratio is only indicative).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
        repeat: u32,
        /// An extra flag for sluice-dataplane (repeatable), e.g.
        /// `--sluice-arg=--write-batching=off`; recorded in the results.
        #[arg(long = "sluice-arg", value_name = "ARG", allow_hyphen_values = true)]
        sluice_args: Vec<String>,
        /// Also load this sluice-dataplane binary (e.g. the main branch's build) side by side
        /// with the one under test, on the same scenario during the same seconds, and report
        /// this build ÷ baseline in requests per CPU-second (the start order alternates
        /// between rounds).
        #[arg(long, value_name = "PATH")]
        baseline_bin: Option<PathBuf>,
        /// The baseline (`--baseline-bin`, which may be the same binary) serves this
        /// scenario's configuration instead of `--scenario`'s: e.g. `--scenario 3
        /// --baseline-scenario 4` is the cost of timeouts and retries on one route.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=6), requires = "baseline_bin")]
        baseline_scenario: Option<u8>,
        /// Every request on a new connection: wrk sends `Connection: close` and reconnects
        /// (connection churn, e.g. side by side with `--baseline-bin`); recorded in the
        /// results.
        #[arg(long)]
        connection_close: bool,
    },
    /// Layer 4 (issue 41): plain TCP through Sluice's stream proxy, HAProxy (mode tcp) and
    /// nginx stream in turn, each pinned to CPU 0 with one worker: throughput of large
    /// transfers and connection rate, per second and per proxy CPU-second. Prints markdown.
    Stream {
        /// Length of each measured case.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        duration: Duration,
        /// Client connections (throughput case) and client threads (connect case).
        #[arg(long, default_value_t = 8)]
        connections: usize,
        /// Rounds; the order of the proxies rotates; the table gives medians.
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// The sluice-dataplane binary (a release build).
        #[arg(long, value_name = "PATH")]
        sluice_bin: PathBuf,
        /// Extra flag for sluice-dataplane, e.g. `--sluice-arg=--write-batching=send`.
        #[arg(long = "sluice-arg", value_name = "ARG", allow_hyphen_values = true)]
        sluice_args: Vec<String>,
        /// nginx's stream module (Debian: libnginx-mod-stream, installed by
        /// scripts/install/bench-deps.sh).
        #[arg(
            long,
            value_name = "PATH",
            default_value = "/usr/lib/nginx/modules/ngx_stream_module.so"
        )]
        nginx_stream_module: PathBuf,
    },
    /// HTTPS side by side with nginx (same certificate): keep-alive requests and new TLS
    /// connections (ECDSA P-256, RSA-2048) per proxy CPU-second. Writes tls-<arch>.md.
    Tls {
        /// Length of each measured run.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        duration: Duration,
        /// Use this sluice-dataplane binary instead of building it with `cargo build --release`.
        #[arg(long, value_name = "PATH")]
        sluice_bin: Option<PathBuf>,
        /// Sluice checkout holding bench/config (default: the one this binary was built from).
        #[arg(long, value_name = "DIR", env = "SLUICE_WORKSPACE")]
        workspace: Option<PathBuf>,
        /// Where the report is written (history; default: $SLUICE_CACHE/bench/results, i.e. ~/.cache/sluice/bench/results; the latest-* copies go to bench/results in the workspace).
        #[arg(long, value_name = "DIR")]
        results_dir: Option<PathBuf>,
        /// Rounds of every measurement (nginx, then sluice); the table gives medians.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
        repeat: u32,
    },
    /// Resource bounds: RSS of nginx and sluice with N idle keep-alive connections and with
    /// N half-sent request heads, and after the header timeout and the close (issue 16).
    /// Writes conns-<arch>-<time>.{json,md}.
    Conns {
        /// Connections held open at once.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        count: u32,
        /// Connections being opened at the same time (mind the proxies' accept queues:
        /// nginx 511, sluice 4096).
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
        concurrency: u32,
        /// Header timeout of the half-sent-heads processes: nginx `client_header_timeout`
        /// and `keepalive_timeout`, sluice `--header-timeout`.
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        header_timeout: Duration,
        /// The same settings in the idle keep-alive processes; long enough that no idle
        /// connection is closed while they are counted.
        #[arg(long, default_value = "300s", value_parser = parse_duration)]
        keepalive_timeout: Duration,
        /// Open-measure-close rounds in each proxy process (memory that grows from round
        /// to round is not bounded).
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=20))]
        rounds: u32,
        /// Use this sluice-dataplane binary instead of building it with `cargo build --release`.
        #[arg(long, value_name = "PATH")]
        sluice_bin: Option<PathBuf>,
        /// Measure only one proxy.
        #[arg(long, value_enum)]
        only: Option<OnlyArg>,
        /// Sluice checkout holding bench/config (default: the one this binary was built from).
        #[arg(long, value_name = "DIR", env = "SLUICE_WORKSPACE")]
        workspace: Option<PathBuf>,
        /// Where result files are written (history; default: $SLUICE_CACHE/bench/results, i.e. ~/.cache/sluice/bench/results; the latest-* copies go to bench/results in the workspace).
        #[arg(long, value_name = "DIR")]
        results_dir: Option<PathBuf>,
        /// How long a proxy may take to answer its first request correctly.
        #[arg(long, default_value = "20s", value_parser = parse_duration)]
        ready_timeout: Duration,
        /// An extra flag for sluice-dataplane (repeatable); recorded, and no latest-conns
        /// copy is written.
        #[arg(long = "sluice-arg", value_name = "ARG", allow_hyphen_values = true)]
        sluice_args: Vec<String>,
    },
    /// Issue 21's scenarios: Sluice, nginx and HAProxy in the same run, one worker each, in
    /// both topologies (origin on and off the proxy's core). Writes
    /// suite-<scenario>-<arch>-<time>.{json,md,svg}.
    Suite {
        /// keepalive | churn | large | idle | workers2 (issue 21); logger | tracing-off | forward-auth (issue
        /// 19's plugin budgets, side by side; `--topology` and `--idle-count` do not apply).
        #[arg(long, value_enum)]
        scenario: SuiteScenarioArg,
        /// Where the origin runs: on the proxy's core, off it, or both in turn.
        #[arg(long, value_enum, default_value = "both")]
        topology: TopologyArg,
        /// Length of each measured run.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        duration: Duration,
        /// Warm-up before each measured run; `0s` for none.
        #[arg(long, default_value = "2s", value_parser = parse_duration)]
        warmup: Duration,
        /// Rounds; the proxies' order alternates and the report gives medians.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
        repeat: u32,
        /// Idle keep-alive connections in the `idle` scenario.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        idle_count: u32,
        /// Use this sluice-dataplane binary instead of building it with `cargo build --release`.
        #[arg(long, value_name = "PATH")]
        sluice_bin: Option<PathBuf>,
        /// Sluice checkout holding bench/config (default: the one this binary was built from).
        #[arg(long, value_name = "DIR", env = "SLUICE_WORKSPACE")]
        workspace: Option<PathBuf>,
        /// Where result files are written (history; default: $SLUICE_CACHE/bench/results, i.e. ~/.cache/sluice/bench/results; the latest-* copies go to bench/results in the workspace).
        #[arg(long, value_name = "DIR")]
        results_dir: Option<PathBuf>,
        /// How long a proxy may take to answer its first request correctly.
        #[arg(long, default_value = "20s", value_parser = parse_duration)]
        ready_timeout: Duration,
        /// Only the cases whose name contains this text (e.g. `upload`, `plain`, `RSA`).
        #[arg(long = "case", value_name = "TEXT")]
        case_filter: Option<String>,
        /// Record a `perf` profile (call graphs) of every proxy's measured runs into DIR,
        /// with a summary per run (`<scenario>-<topology>-<case>-<proxy>.txt`). Sampling
        /// perturbs the figures: a profiled run is not a figure of record.
        #[arg(long = "perf", value_name = "DIR")]
        perf_dir: Option<PathBuf>,
    },
    /// Print a side-by-side markdown table of two result files (B ÷ A ratios).
    Compare {
        /// First result JSON (A), e.g. bench/results/latest-1-x86_64.json.
        a: PathBuf,
        /// Second result JSON (B), e.g. bench/results/latest-1-aarch64.json.
        b: PathBuf,
        /// Also write the comparison as an SVG chart (requests per CPU-second of both
        /// proxies on both machines, and the sluice ÷ nginx ratios) to this file.
        #[arg(long, value_name = "FILE")]
        svg: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum UpstreamArg {
    Proxy,
    Wrk,
    Any,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum SuiteScenarioArg {
    Keepalive,
    Churn,
    Large,
    Idle,
    Workers2,
    /// Issue 19: http-logger and opentelemetry, always_on (plugin list in
    /// bench/config/budget.yaml), with and without.
    Logger,
    /// Issue 19: opentelemetry with sampling off, with and without.
    TracingOff,
    /// Issue 19: forward-auth against nginx's auth_request, each with and without.
    ForwardAuth,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TopologyArg {
    /// The origin on the proxy's core.
    On,
    /// The origin on the load generator's core.
    Off,
    /// Both, one after the other.
    Both,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OnlyArg {
    Nginx,
    Sluice,
}

/// The median of `values` (mean of the middle two for an even count); `None` when empty.
fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// A markdown table of each round's sluice ÷ nginx ratios and their medians.
fn render_rounds(rounds: &[BenchResult]) -> String {
    // Scenario 2 also has the plugin cost (with ÷ without the plugins), sequential and
    // side by side.
    let same_run = rounds.iter().any(|r| r.plugin_cost_same_run.is_some());
    let side = rounds.iter().any(|r| r.plugin_cost_side_by_side.is_some());
    let base = rounds.iter().any(|r| r.baseline_side_by_side.is_some());
    let mut out = String::from("| round | req/s ratio | req/CPU-s ratio | p99 ratio |");
    let mut rule = String::from("|---:|---:|---:|---:|");
    if same_run {
        out.push_str(" plugin cost (same run) |");
        rule.push_str("---:|");
    }
    if side {
        out.push_str(" plugin cost (side by side) |");
        rule.push_str("---:|");
    }
    if base {
        out.push_str(" build ÷ baseline (side by side) |");
        rule.push_str("---:|");
    }
    out.push_str(" noisy |\n");
    out.push_str(&rule);
    out.push_str("---|\n");
    let (mut rps, mut cpu, mut p99) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cost, mut cost_side, mut vs_base) = (Vec::new(), Vec::new(), Vec::new());
    let cell = |shown: bool, x: Option<f64>, all: &mut Vec<f64>| match (shown, x) {
        (false, _) => String::new(),
        (true, Some(c)) => {
            all.push(c);
            format!(" {c:.2}× |")
        }
        (true, None) => " - |".to_owned(),
    };
    for (i, r) in rounds.iter().enumerate() {
        if let Some(x) = &r.ratios {
            let c = cell(same_run, r.plugin_cost_same_run, &mut cost);
            let mut d = cell(
                side,
                r.plugin_cost_side_by_side.as_ref().map(|s| s.ratio),
                &mut cost_side,
            );
            if r.plugin_cost_side_by_side
                .as_ref()
                .is_some_and(|s| s.without_first)
            {
                d = d.replace("× |", "× (plain first) |");
            }
            let mut e = cell(
                base,
                r.baseline_side_by_side.as_ref().map(|s| s.ratio),
                &mut vs_base,
            );
            if r.baseline_side_by_side
                .as_ref()
                .is_some_and(|s| s.baseline_first)
            {
                e = e.replace("× |", "× (baseline first) |");
            }
            out.push_str(&format!(
                "| {} | {:.2}× | {:.2}× | {:.2}× |{c}{d}{e} {} |\n",
                i + 1,
                x.requests_per_sec,
                x.requests_per_cpu_second,
                x.p99_latency,
                if x.noisy { "yes" } else { "" }
            ));
            rps.push(x.requests_per_sec);
            cpu.push(x.requests_per_cpu_second);
            p99.push(x.p99_latency);
        }
    }
    let m = |v: &[f64]| median(v).map_or_else(|| "-".to_owned(), |x| format!("{x:.2}×"));
    out.push_str(&format!(
        "| **median** | **{}** | **{}** | **{}** |{}{}{} |\n",
        m(&rps),
        m(&cpu),
        m(&p99),
        if same_run {
            format!(" **{}** |", m(&cost))
        } else {
            String::new()
        },
        if side {
            format!(" **{}** |", m(&cost_side))
        } else {
            String::new()
        },
        if base {
            format!(" **{}** |", m(&vs_base))
        } else {
            String::new()
        }
    ));
    out
}

fn workspace_root() -> PathBuf {
    // bench/ is a direct member of the workspace. NB: `cargo run` sets CARGO_MANIFEST_DIR for
    // the process; the compiled-in path is only a fallback (the build cache may come from
    // another clone).
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).to_owned());
    manifest.parent().unwrap_or(&manifest).to_owned()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if process::interrupted() {
                // The signal thread is stopping the children and will exit
                // with 130; the error is only a consequence of that.
                std::thread::sleep(Duration::from_secs(30));
                return ExitCode::from(130);
            }
            eprintln!("sluice-bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Cmd::Proxy {
            scenario,
            duration,
            warmup,
            no_warmup,
            sluice_bin,
            only,
            results_dir,
            ready_timeout,
            upstream_cpu,
            workspace,
            repeat,
            emulator,
            sluice_args,
            baseline_bin,
            baseline_scenario,
            connection_close,
        } => {
            process::install_signal_handler().context("installing signal handlers")?;
            let workspace = workspace.unwrap_or_else(workspace_root);
            let mut opts = ProxyOptions {
                without_first: false,
                connection_close,
                baseline_bin,
                baseline_scenario,
                emulator,
                sluice_args,
                scenario,
                duration,
                warmup: if no_warmup { Duration::ZERO } else { warmup },
                sluice_bin,
                only: only.map(|o| match o {
                    OnlyArg::Nginx => Only::Nginx,
                    OnlyArg::Sluice => Only::Sluice,
                }),
                results: ResultsDirs::new(results_dir, &workspace),
                workspace,
                ready_timeout,
                upstream_cpu: match upstream_cpu {
                    UpstreamArg::Proxy => UpstreamCpu::Proxy,
                    UpstreamArg::Wrk => UpstreamCpu::Wrk,
                    UpstreamArg::Any => UpstreamCpu::Any,
                },
            };
            let mut rounds = Vec::new();
            for round in 1..=repeat {
                if repeat > 1 {
                    eprintln!("sluice-bench: round {round} of {repeat}");
                }
                // Scenario 2's side-by-side order alternates between rounds.
                opts.without_first = round % 2 == 0;
                let (result, written) = runner::run_proxy_bench(&opts)?;
                println!("{}", report::render_markdown(&result));
                eprintln!(
                    "sluice-bench: wrote {} and {} (and latest-{}-{}.{{json,md}})",
                    written.json.display(),
                    written.markdown.display(),
                    result.scenario,
                    result.machine.file_arch()
                );
                rounds.push(result);
            }
            if rounds.len() > 1 {
                let summary = render_rounds(&rounds);
                println!("{summary}");
                if let Some(last) = rounds.last() {
                    let path = opts.results.write_history(
                        &format!(
                            "rounds-{}-{}-{}.md",
                            last.scenario,
                            last.machine.file_arch(),
                            last.timestamp
                        ),
                        &summary,
                    )?;
                    eprintln!("sluice-bench: wrote {}", path.display());
                }
            }
        }
        Cmd::Stream {
            duration,
            connections,
            repeat,
            sluice_bin,
            sluice_args,
            nginx_stream_module,
        } => {
            process::install_signal_handler().context("installing signal handlers")?;
            let opts = sluice_bench::stream::StreamOptions {
                duration,
                connections,
                repeat,
                sluice_bin,
                sluice_args,
                nginx_stream_module,
            };
            println!("{}", sluice_bench::stream::run(&opts)?);
        }
        Cmd::Tls {
            duration,
            sluice_bin,
            workspace,
            results_dir,
            repeat,
        } => {
            process::install_signal_handler().context("installing signal handlers")?;
            let workspace = workspace.unwrap_or_else(workspace_root);
            let opts = sluice_bench::tls::TlsOptions {
                sluice_bin,
                results: ResultsDirs::new(results_dir, &workspace),
                workspace,
                duration,
                repeat,
            };
            println!("{}", sluice_bench::tls::run_tls_bench(&opts)?);
        }
        Cmd::Conns {
            count,
            concurrency,
            header_timeout,
            keepalive_timeout,
            rounds,
            sluice_bin,
            only,
            workspace,
            results_dir,
            ready_timeout,
            sluice_args,
        } => {
            process::install_signal_handler().context("installing signal handlers")?;
            let workspace = workspace.unwrap_or_else(workspace_root);
            let opts = sluice_bench::conns::ConnsOptions {
                count,
                concurrency,
                header_timeout,
                keepalive_timeout,
                rounds,
                sluice_bin,
                only: only.map(|o| match o {
                    OnlyArg::Nginx => Only::Nginx,
                    OnlyArg::Sluice => Only::Sluice,
                }),
                results: ResultsDirs::new(results_dir, &workspace),
                workspace,
                ready_timeout,
                sluice_args,
            };
            let (result, written) = sluice_bench::conns::run_conns_bench(&opts)?;
            println!("{}", sluice_bench::conns::render_markdown(&result));
            for path in written {
                eprintln!("sluice-bench: wrote {}", path.display());
            }
        }
        Cmd::Suite {
            scenario,
            topology,
            duration,
            warmup,
            repeat,
            idle_count,
            sluice_bin,
            workspace,
            results_dir,
            ready_timeout,
            case_filter,
            perf_dir,
        } => {
            use sluice_bench::suite::{Scenario, SuiteOptions, Topology};
            process::install_signal_handler().context("installing signal handlers")?;
            let workspace = workspace.unwrap_or_else(workspace_root);
            let budget = match scenario {
                SuiteScenarioArg::Logger => Some(sluice_bench::budget::BudgetScenario::Logger),
                SuiteScenarioArg::TracingOff => {
                    Some(sluice_bench::budget::BudgetScenario::TracingOff)
                }
                SuiteScenarioArg::ForwardAuth => {
                    Some(sluice_bench::budget::BudgetScenario::ForwardAuth)
                }
                _ => None,
            };
            if let Some(scenario) = budget {
                if case_filter.is_some() || perf_dir.is_some() {
                    anyhow::bail!("--case and --perf apply to issue 21's scenarios only");
                }
                let opts = sluice_bench::budget::BudgetOptions {
                    scenario,
                    duration,
                    warmup,
                    repeat,
                    sluice_bin,
                    results: ResultsDirs::new(results_dir, &workspace),
                    workspace,
                    ready_timeout,
                };
                let (result, written) = sluice_bench::budget::run_budget(&opts)?;
                println!("{}", sluice_bench::budget::render_markdown(&result));
                for path in written {
                    eprintln!("sluice-bench: wrote {}", path.display());
                }
                return Ok(());
            }
            let opts = SuiteOptions {
                scenario: match scenario {
                    SuiteScenarioArg::Keepalive => Scenario::Keepalive,
                    SuiteScenarioArg::Churn => Scenario::Churn,
                    SuiteScenarioArg::Large => Scenario::Large,
                    SuiteScenarioArg::Idle => Scenario::Idle,
                    SuiteScenarioArg::Workers2 => Scenario::Workers2,
                    SuiteScenarioArg::Logger
                    | SuiteScenarioArg::TracingOff
                    | SuiteScenarioArg::ForwardAuth => {
                        anyhow::bail!("{scenario:?} is a plugin-budget scenario")
                    }
                },
                topologies: match topology {
                    TopologyArg::On => vec![Topology::OriginOnProxyCore],
                    TopologyArg::Off => vec![Topology::OriginOffProxyCore],
                    TopologyArg::Both => {
                        vec![Topology::OriginOffProxyCore, Topology::OriginOnProxyCore]
                    }
                },
                duration,
                warmup,
                repeat,
                idle_count,
                sluice_bin,
                results: ResultsDirs::new(results_dir, &workspace),
                workspace,
                ready_timeout,
                case_filter,
                perf_dir,
            };
            let (result, written) = sluice_bench::suite::run_suite(&opts)?;
            println!("{}", sluice_bench::suite::render_markdown(&result));
            for path in written {
                eprintln!("sluice-bench: wrote {}", path.display());
            }
        }
        Cmd::Compare { a, b, svg } => {
            let ra = BenchResult::load(&a)?;
            let rb = BenchResult::load(&b)?;
            let name = |p: &Path| {
                p.file_name().map_or_else(
                    || p.display().to_string(),
                    |n| n.to_string_lossy().into_owned(),
                )
            };
            println!("{}", report::render_compare(&ra, &rb, &name(&a), &name(&b)));
            if let Some(path) = svg {
                let chart = sluice_bench::chart::render_compare_svg(&ra, &rb, &name(&a), &name(&b));
                std::fs::write(&path, chart)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("sluice-bench: wrote {}", path.display());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }
}
