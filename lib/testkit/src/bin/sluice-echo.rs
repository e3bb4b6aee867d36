//! `sluice-echo`: a real HTTP/1.1 + h2c backend that echoes each request as JSON.
use clap::Parser;

/// Echo backend for tests and the quick start.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:1980")]
    listen: std::net::SocketAddr,
    /// Name reported in every response (`server` field and `x-echo-server` header).
    #[arg(long, default_value = "echo")]
    name: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let server = sluice_testkit::EchoServer::start(&args.name, args.listen).await?;
    eprintln!("sluice-echo `{}` listening on {}", args.name, server.addr);
    // SIGTERM (a pod being stopped) ends it like SIGINT: the listener closes with the process.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    eprintln!("sluice-echo `{}` stopping", args.name);
    Ok(())
}
