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
        /// 1 = pure proxy; 2 = limit-count + prometheus on the route.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
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
        /// Where result files are written (default: bench/results in the workspace).
        #[arg(long, value_name = "DIR")]
        results_dir: Option<PathBuf>,
        /// How long a proxy may take to answer its first request correctly.
        #[arg(long, default_value = "20s", value_parser = parse_duration)]
        ready_timeout: Duration,
        /// Core of the upstream nginx: with the proxy (APISIX 2-core setup), with wrk, or unpinned.
        #[arg(long, value_enum, default_value = "proxy")]
        upstream_cpu: UpstreamArg,
    },
    /// Print a side-by-side markdown table of two result files (B ÷ A ratios).
    Compare {
        /// First result JSON (A), e.g. bench/results/latest-1-x86_64.json.
        a: PathBuf,
        /// Second result JSON (B), e.g. bench/results/latest-1-aarch64.json.
        b: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum UpstreamArg {
    Proxy,
    Wrk,
    Any,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OnlyArg {
    Nginx,
    Sluice,
}

fn workspace_root() -> PathBuf {
    // bench/ is a direct member of the workspace.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_owned()
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
        } => {
            process::install_signal_handler().context("installing signal handlers")?;
            let workspace = workspace.unwrap_or_else(workspace_root);
            let opts = ProxyOptions {
                scenario,
                duration,
                warmup: if no_warmup { Duration::ZERO } else { warmup },
                sluice_bin,
                only: only.map(|o| match o {
                    OnlyArg::Nginx => Only::Nginx,
                    OnlyArg::Sluice => Only::Sluice,
                }),
                results_dir: results_dir.unwrap_or_else(|| workspace.join("bench").join("results")),
                workspace,
                ready_timeout,
                upstream_cpu: match upstream_cpu {
                    UpstreamArg::Proxy => UpstreamCpu::Proxy,
                    UpstreamArg::Wrk => UpstreamCpu::Wrk,
                    UpstreamArg::Any => UpstreamCpu::Any,
                },
            };
            let (result, written) = runner::run_proxy_bench(&opts)?;
            println!("{}", report::render_markdown(&result));
            eprintln!(
                "sluice-bench: wrote {} and {} (and latest-{}-{}.{{json,md}})",
                written.json.display(),
                written.markdown.display(),
                result.scenario,
                result.machine.arch
            );
        }
        Cmd::Compare { a, b } => {
            let ra = BenchResult::load(&a)?;
            let rb = BenchResult::load(&b)?;
            let name = |p: &Path| {
                p.file_name().map_or_else(
                    || p.display().to_string(),
                    |n| n.to_string_lossy().into_owned(),
                )
            };
            println!("{}", report::render_compare(&ra, &rb, &name(&a), &name(&b)));
        }
    }
    Ok(())
}
