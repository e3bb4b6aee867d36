//! `sluice-grpc-echo`: a real gRPC (h2c) backend serving `sluice.test.v1.Echo`.
use clap::Parser;

/// gRPC echo backend for tests and benchmarks.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: std::net::SocketAddr,
    /// Name reported in the `x-echo-server` metadata of every response.
    #[arg(long, default_value = "grpc-echo")]
    name: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let server = sluice_testkit::grpc::GrpcEchoServer::start(&args.name, args.listen).await?;
    eprintln!(
        "sluice-grpc-echo `{}` listening on {}",
        args.name, server.addr
    );
    tokio::signal::ctrl_c().await?;
    Ok(())
}
