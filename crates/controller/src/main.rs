//! `sluice-controller`: not implemented yet (see the controller issue).
use clap::Parser;

/// Sluice Kubernetes controller.
#[derive(Parser)]
#[command(version, about)]
struct Args {}

fn main() -> anyhow::Result<()> {
    let _ = Args::parse();
    anyhow::bail!("sluice-controller is not implemented yet; use `sluice-dataplane --standalone`")
}
