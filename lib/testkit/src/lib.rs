//! Sluice's test kit: what more than one test crate needs, in one place. Nothing here
//! depends on the dataplane or the controller (their in-process harnesses live in their own
//! `tests/common/`), so every crate can use the kit without a second copy of their types.
//!
//! - [`eventually`] / [`eventually_async`] / [`eventually_blocking`]: wait for a condition,
//!   one signature.
//! - [`metrics`]: samples out of a Prometheus text exposition.
//! - Origins: [`EchoServer`] answers every request with a JSON document describing it (its
//!   name, method, path, query, headers and body length), so a test can assert what the
//!   upstream received; `/status/<code>` answers with that status, `/delay/<ms>` waits.
//!   [`origin::Origin`] can be killed and restarted on the same port and counts what it
//!   saw; [`grpc`] is a tonic echo service.
//! - [`pki`]: test CAs and certificates.
//! - [`client`]: a small HTTP/1.1 client ([`client::get`], [`client::send`], ...).
//! - [`builders`]: `sluice.v1` routes, upstreams, snapshots, plugins and health checks.
//! - [`net`]: free and closed loopback ports.
//!
//! The `sluice-echo` and `sluice-grpc-echo` binaries serve the same origins for the quick
//! start, the system tests and the benchmarks.

#![forbid(unsafe_code)]

pub mod builders;
pub mod client;
pub mod grpc;
pub mod l4;
pub mod metrics;
pub mod net;
pub mod origin;
pub mod pki;
mod wait;

pub use wait::{PAUSE, Settled, Wait, eventually, eventually_async, eventually_blocking};

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// A running echo backend.
#[derive(Debug)]
pub struct EchoServer {
    /// Address it listens on.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl EchoServer {
    /// Starts an echo backend named `name` on `addr` (use port 0 for any free port).
    pub async fn start(name: &str, addr: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
        let task = tokio::spawn(serve(listener, name));
        Ok(EchoServer { addr, task })
    }

    /// Stops accepting new connections (open connections end with the runtime).
    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves echo responses on `listener` forever.
pub async fn serve(listener: TcpListener, name: &'static str) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let service = service_fn(move |req| echo(req, name));
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn echo(
    req: Request<Incoming>,
    name: &'static str,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let path = parts.uri.path().to_owned();
    let mut status = StatusCode::OK;
    if let Some(code) = path
        .strip_prefix("/status/")
        .and_then(|c| c.parse::<u16>().ok())
    {
        status = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    }
    if let Some(ms) = path
        .strip_prefix("/delay/")
        .and_then(|c| c.parse::<u64>().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let headers: serde_json::Map<String, serde_json::Value> = parts
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                serde_json::Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()),
            )
        })
        .collect();
    let doc = serde_json::json!({
        "server": name,
        "method": parts.method.as_str(),
        "path": path,
        "query": parts.uri.query(),
        "version": format!("{:?}", parts.version),
        "headers": headers,
        "body_len": body.len(),
        "body": String::from_utf8_lossy(&body),
    });
    let mut resp = Response::new(Full::new(Bytes::from(doc.to_string() + "\n")));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    resp.headers_mut()
        .insert("x-echo-server", http::HeaderValue::from_static(name));
    Ok(resp)
}
