//! `kubectl-sluice`: flags and exit codes only; the work is in the `sluice_kubectl` library.

use std::process::ExitCode;

use clap::{CommandFactory as _, Parser as _};
use sluice_kubectl::cli::{Cli, Command};
use sluice_kubectl::cluster::{self, Scope, Target};
use sluice_kubectl::offline::{self, Offline};
use sluice_kubectl::{Format, completion, diff, explain, render_structured, validate};

fn print<T: serde::Serialize>(report: &T, format: Format, text: impl FnOnce() -> String) {
    match format {
        Format::Text => print!("{}", text()),
        f => print!("{}", render_structured(report, f)),
    }
}

fn run(cli: Cli) -> Result<i32, anyhow::Error> {
    match cli.command {
        Command::Validate { input } => {
            let opts = offline::controller_options(&input.ingress_class);
            let off = Offline::from_sources(&input.files, &opts)?;
            let report = validate::validate(&off, &input.ingress_class);
            print(&report, input.output, || report.render_text());
            Ok(report.exit_code())
        }
        Command::Explain {
            url,
            method,
            headers,
            client_ip,
            sni,
            input,
        } => {
            let req = explain::Request::parse(&url, &method, &headers, client_ip, sni)?;
            let opts = offline::controller_options(&input.ingress_class);
            let off = Offline::from_sources(&input.files, &opts)?;
            let table = match &off.table {
                Ok(t) => t,
                Err(e) => anyhow::bail!("the dataplane would reject this snapshot: {e}"),
            };
            let ex = explain::explain(table, &off.translation.snapshot, &req);
            print(&ex, input.output, || ex.render_text());
            Ok(0)
        }
        Command::Diff { input, against } => {
            let opts = offline::controller_options(&input.ingress_class);
            let new = Offline::from_sources(&input.files, &opts)?;
            let (old, remote) = match against.as_slice() {
                [url] if url.starts_with("http://") || url.starts_with("https://") => {
                    (diff::fetch_admin_snapshot(url)?, true)
                }
                files => (
                    Offline::from_sources(files, &opts)?.translation.snapshot,
                    false,
                ),
            };
            let report = diff::diff(&old, &new.translation.snapshot, remote);
            print(&report, input.output, || report.render_text());
            Ok(report.exit_code())
        }
        Command::Status {
            namespace,
            all_namespaces,
            kubeconfig,
            context,
            ingress_class,
            output,
        } => {
            // NB: one thread: a handful of list calls, and a CLI should not start a pool.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let report = runtime.block_on(async {
                let target = Target {
                    kubeconfig: kubeconfig.as_deref(),
                    context: context.as_deref(),
                };
                let client = cluster::connect(&target).await?;
                let scope = match (all_namespaces, namespace) {
                    (true, _) => Scope::All,
                    (false, Some(ns)) => Scope::Namespace(ns),
                    (false, None) => Scope::Namespace(client.default_namespace().to_owned()),
                };
                cluster::read(&client, &scope, &ingress_class).await
            })?;
            print(&report, output, || report.render_text());
            Ok(report.exit_code())
        }
        Command::Completion { shell } => {
            print!("{}", completion::generate(&Cli::command(), shell));
            Ok(0)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
