//! `kubectl-sluice`: flags and exit codes only; the work is in the `sluice_kubectl` library.

use std::process::ExitCode;

use clap::{CommandFactory as _, Parser as _};
use sluice_kubectl::cli::{Cli, Command};
use sluice_kubectl::cluster::{self, Scope, Target};
use sluice_kubectl::offline::{self, Offline};
use sluice_kubectl::terminal::sanitize;
use sluice_kubectl::{
    Format, admin, completion, diff, explain, explain_stream, render_structured, validate,
};

fn print<T: serde::Serialize>(report: &T, format: Format, text: impl FnOnce() -> String) {
    match format {
        Format::Text => print!("{}", sanitize(&text())),
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
            listener,
            stream_ports,
            gateway_listener_ports,
            files,
            admin,
            kubeconfig,
            context,
            namespace,
            ingress_class,
            output,
            request_timeout,
        } => {
            let stream = explain_stream::Connection::parse(&url, sni.clone(), client_ip, listener)?;
            let req = match stream {
                Some(_) => None,
                None => Some(explain::Request::parse(
                    &url, &method, &headers, client_ip, sni,
                )?),
            };
            let mut opts = offline::controller_options(&ingress_class);
            opts.gateway.listener_ports = gateway_listener_ports;
            if let Some(ports) = &stream_ports {
                opts.stream_ports =
                    sluice_translate::parse_stream_ports(ports).map_err(anyhow::Error::msg)?;
            }
            let mut notes = Vec::new();
            let (snapshot, table, cx) = if let Some(url) = admin {
                let served = admin::served(&url, request_timeout)?;
                let health = admin::health(&url, request_timeout)?;
                // NB: a dataplane's snapshot comes redacted; compile it without the key
                // material it no longer has (certificates are chosen by id, see explain).
                let table = offline::compile_redacted(&served.snapshot).map_err(|e| {
                    anyhow::anyhow!("{url}: the served snapshot does not compile here: {e}")
                })?;
                let cx = explain::Context {
                    source: format!(
                        "dataplane {url}: snapshot {} (hash {})",
                        served.version, served.hash
                    ),
                    health: Some(health),
                };
                (served.snapshot, table, cx)
            } else {
                let (off, source) = if files.is_empty() {
                    let target = Target {
                        kubeconfig: kubeconfig.as_deref(),
                        context: context.as_deref(),
                    };
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    let scope = match namespace {
                        Some(ns) => Scope::Namespace(ns),
                        None => Scope::All,
                    };
                    let (state, read_notes) = runtime.block_on(async {
                        let client = cluster::connect(&target).await?;
                        cluster::read_state(&client, &scope, &ingress_class).await
                    })?;
                    notes = read_notes;
                    let context = cluster::context_name(&target)
                        .map(|c| format!("context {c}"))
                        .unwrap_or_else(|| "in-cluster".into());
                    let ns = match &scope {
                        Scope::All => "every namespace".to_owned(),
                        Scope::Namespace(ns) => format!("namespace {ns}"),
                    };
                    let off = Offline::build(
                        sluice_translate::files::Loaded {
                            state,
                            ..Default::default()
                        },
                        &opts,
                    );
                    (
                        off,
                        format!("cluster ({context}, {ns}), translated as the controller does"),
                    )
                } else {
                    let off = Offline::from_sources(&files, &opts)?;
                    (off, format!("files {}", files.join(", ")))
                };
                let table = off.table.map_err(|e| {
                    anyhow::anyhow!("the dataplane would reject this snapshot: {e}")
                })?;
                let cx = explain::Context {
                    source,
                    health: None,
                };
                (off.translation.snapshot, table, cx)
            };
            for n in &notes {
                eprintln!("note: {}", sanitize(n));
            }
            match (stream, req) {
                (Some(conn), _) => {
                    let ex = explain_stream::explain(&table, &snapshot, &conn, &cx);
                    print(&ex, output, || ex.render_text());
                }
                (None, Some(req)) => {
                    let ex = explain::explain(&table, &snapshot, &req, &cx);
                    print(&ex, output, || ex.render_text());
                }
                (None, None) => {}
            }
            Ok(0)
        }
        Command::Diff {
            input,
            against,
            request_timeout,
        } => {
            let opts = offline::controller_options(&input.ingress_class);
            let new = Offline::from_sources(&input.files, &opts)?;
            let (old, remote) = match against.as_slice() {
                [url] if url.starts_with("http://") || url.starts_with("https://") => {
                    (admin::served(url, request_timeout)?.snapshot, true)
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
        Command::Migrate {
            files,
            classes,
            output,
        } => {
            let loaded = offline::load_sources(&files)?;
            let report = sluice_kubectl::migrate::migrate(&loaded, &classes);
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
    // `kubectl sluice <TAB>`: kubectl runs `kubectl_complete-sluice WORDS...` (a link to this
    // binary); `kubectl-sluice __complete WORDS...` answers the same.
    let mut args = std::env::args();
    let argv0 = args.next().unwrap_or_default();
    let invoked_as = std::path::Path::new(&argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let rest: Vec<String> = args.collect();
    if invoked_as == completion::KUBECTL_COMPLETE {
        print!("{}", completion::complete(&Cli::command(), &rest));
        return ExitCode::SUCCESS;
    }
    if rest.first().map(String::as_str) == Some("__complete") {
        print!("{}", completion::complete(&Cli::command(), &rest[1..]));
        return ExitCode::SUCCESS;
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {}", sanitize(&e.to_string()));
            ExitCode::from(2)
        }
    }
}
