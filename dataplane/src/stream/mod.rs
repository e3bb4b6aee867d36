//! The stream stage: layer-4 connections on TCP, TLS and UDP listeners
//! (`Snapshot.stream_routes`), a peer of the HTTP request stage.
//!
//! ```text
//! accept ─▶ PROXY header? ─▶ ClientHello (TLS) ─▶ route (SNI, client address)
//!        ─▶ plugins (ip-restriction, limit-conn) ─▶ TLS handshake (terminate)
//!        ─▶ connect (balancer, retries, PROXY header out) ─▶ bytes read so far ─▶ splice
//! ```
//!
//! - A connection reads the table twice (its listener's settings, then its route) and
//!   keeps only its route's `Arc`: an hours-long connection pins no table.
//! - Every refusal is a plain close (FIN), never a TLS alert or a hang, counted in
//!   `sluice_stream_connections_total{outcome}`.
//! - A route removed by a snapshot: its connections go on for the drain timeout, then close.
//!   On shutdown, once the listener stops accepting, the same timeout applies.
//!
//! Modules: [`client_hello`] (bounded ClientHello reader), [`proxy_protocol`] (PROXY v1/v2
//! in and out), [`connect`] (upstream dial), [`splice`] (the copy), [`udp`] (sessions).

pub mod client_hello;
pub mod connect;
pub mod proxy_protocol;
pub mod splice;
pub mod udp;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::store::Store;
use crate::config::stream::{CompiledStreamRoute, ListenerKind, StreamMode};
use crate::plugins::stream::Verdict;

/// Bounds of the stream listeners.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// Most open connections per worker and port.
    pub max_connections: usize,
    /// Time a client has to send its ClientHello (TLS listeners), and to finish a
    /// terminated handshake.
    pub client_hello_timeout: Duration,
    /// Time a client has to send its PROXY header.
    pub proxy_header_timeout: Duration,
    /// How long the connections of a removed route (or of a port being closed) go on.
    pub drain_timeout: Duration,
    /// Most UDP sessions per worker and port.
    pub udp_max_sessions: usize,
    /// Most UDP sessions of one client IP per worker and port.
    pub udp_max_sessions_per_ip: usize,
}

impl Default for StreamLimits {
    /// 10,000 connections, 10 s for a ClientHello, 5 s for a PROXY header, 60 s of drain,
    /// 10,000 UDP sessions of which 256 per client IP.
    fn default() -> Self {
        StreamLimits {
            max_connections: 10_000,
            client_hello_timeout: client_hello::CLIENT_HELLO_TIMEOUT,
            proxy_header_timeout: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(60),
            udp_max_sessions: 10_000,
            udp_max_sessions_per_ip: 256,
        }
    }
}

struct Worker {
    store: Arc<Store>,
    scope: Arc<str>,
    limits: StreamLimits,
    local: SocketAddr,
    /// Fires once the port closed and the drain timeout passed.
    closing: CancellationToken,
    /// `--proxy-protocol`'s trusted peers (empty: any), when the dataplane requires the
    /// PROXY protocol on its own ports: applies to the fleet-wide stream ports
    /// (`stream/...`, on the dataplane Service behind the same balancer).
    fleet_proxy: Option<Arc<Vec<ipnet::IpNet>>>,
}

/// Whether listener `id` is a fleet-wide stream port (`--stream-ports`), not a Gateway's.
pub fn is_fleet_port(id: &str) -> bool {
    id.starts_with("stream/")
}

/// Serves the TCP or TLS stream listener `scope` on `listener` until `stop` resolves; then
/// its connections get the drain timeout before they are closed. `fleet_proxy`: the
/// dataplane's `--proxy-protocol` trusted peers, for a fleet-wide port ([`is_fleet_port`]).
pub async fn serve_tcp(
    listener: TcpListener,
    store: Arc<Store>,
    limits: StreamLimits,
    scope: Arc<str>,
    fleet_proxy: Option<Arc<Vec<ipnet::IpNet>>>,
    stop: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let local = match listener.local_addr() {
        Ok(a) => a,
        Err(_) => return,
    };
    let _ = socket2::SockRef::from(&listener).set_tcp_nodelay(true);
    let worker = Arc::new(Worker {
        store,
        scope,
        limits,
        local,
        closing: CancellationToken::new(),
        fleet_proxy,
    });
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut stop => break,
            a = async {
                let permit = Arc::clone(&permits).acquire_owned().await.ok()?;
                Some((permit, listener.accept().await))
            } => a,
        };
        let Some((permit, accepted)) = accepted else {
            return;
        };
        let (stream, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "stream accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let worker = Arc::clone(&worker);
        tokio::spawn(async move {
            connection(stream, peer, &worker).await;
            drop(permit);
        });
    }
    drop(listener);
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    tokio::select! {
        _ = permits.acquire_many(all) => {}
        () = tokio::time::sleep(limits.drain_timeout) => {
            worker.closing.cancel();
            let _ = permits.acquire_many(all).await;
        }
    }
}

/// Counts one connection's outcome.
fn count(w: &Worker, route: &str, outcome: &str) {
    w.store
        .metrics()
        .stream
        .connections
        .with_label_values(&[&w.scope, route, outcome])
        .inc();
}

/// Decrements `sluice_stream_active_connections` when dropped.
struct Active(prometheus::IntGauge);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.dec();
    }
}

async fn connection(mut stream: TcpStream, peer: SocketAddr, w: &Worker) {
    let gauge = w.store.metrics().stream.active.clone();
    gauge.inc();
    let _active = Active(gauge);
    // The listener's settings, from the table serving now.
    let (kind, proxy_header) = {
        let table = w.store.peek_table();
        let Some(l) = table.listener(&w.scope) else {
            return;
        };
        // NB: the listener's own setting first; else a fleet-wide port follows the
        // dataplane's --proxy-protocol.
        let nets = if l.accept_proxy_protocol {
            Some(&l.proxy_protocol_trusted[..])
        } else {
            w.fleet_proxy
                .as_deref()
                .filter(|_| is_fleet_port(&l.id))
                .map(|v| &v[..])
        };
        let trusted = |nets: &[ipnet::IpNet]| {
            nets.is_empty() || nets.iter().any(|n| n.contains(&peer.ip().to_canonical()))
        };
        (l.kind, nets.map(trusted))
    };
    let mut client = peer;
    let mut first: Vec<u8> = Vec::new();
    match proxy_header {
        None => {}
        Some(false) => {
            tracing::debug!(listener = %w.scope, %peer, "PROXY header from an untrusted peer");
            return count(w, "", "proxy_header");
        }
        Some(true) => {
            match proxy_protocol::read_header(&mut stream, w.limits.proxy_header_timeout).await {
                Ok(h) => {
                    if let Some(source) = h.source {
                        client = source;
                    }
                    first = h.rest;
                }
                Err(e) => {
                    tracing::debug!(listener = %w.scope, %peer, error = %e, "PROXY header refused");
                    return count(w, "", "proxy_header");
                }
            }
        }
    }
    let sni = if kind == ListenerKind::Tls {
        match client_hello::read_client_hello(&mut stream, first, w.limits.client_hello_timeout)
            .await
        {
            Ok(hello) => {
                first = hello.bytes;
                hello.sni
            }
            Err(e) => {
                tracing::debug!(listener = %w.scope, %client, error = %e, "ClientHello refused");
                return count(w, "", "client_hello");
            }
        }
    } else {
        None
    };
    let route: Option<Arc<CompiledStreamRoute>> = {
        let table = w.store.peek_table();
        table
            .listener(&w.scope)
            .and_then(|l| l.streams.lookup(sni.as_deref(), client.ip()))
            .cloned()
    };
    let Some(route) = route else {
        tracing::debug!(listener = %w.scope, %client, sni = ?sni, "no stream route");
        return count(w, "", "no_route");
    };
    let _slot = match route.plugins.on_connect(client, w.local).await {
        Verdict::Allow(slot) => slot,
        Verdict::Deny(plugin) => {
            tracing::debug!(route = %route.id, %client, plugin, "stream connection refused");
            return count(w, &route.id, "denied");
        }
    };
    let outcome = match route.mode {
        StreamMode::Plain | StreamMode::Passthrough => {
            proxy(stream, first, client, &route, kind, w).await
        }
        StreamMode::Terminate => {
            let Some(config) = terminate_config(w, sni.as_deref()) else {
                return count(w, &route.id, "tls_failed");
            };
            let io = Prefixed {
                prefix: first,
                at: 0,
                inner: stream,
            };
            let accept = tokio_rustls::TlsAcceptor::from(config).accept(io);
            match tokio::time::timeout(w.limits.client_hello_timeout, accept).await {
                Ok(Ok(tls)) => proxy(tls, Vec::new(), client, &route, kind, w).await,
                _ => "tls_failed",
            }
        }
    };
    count(w, &route.id, outcome);
}

/// The listener's certificate for `sni`, without ALPN (the HTTP listeners' configurations
/// offer h2 and http/1.1, which mean nothing to a TCP upstream).
fn terminate_config(w: &Worker, sni: Option<&str>) -> Option<Arc<rustls::ServerConfig>> {
    let table = w.store.peek_table();
    let entry = table.listener(&w.scope)?.certs.select(sni)?;
    let mut config = (*entry.config).clone();
    config.alpn_protocols.clear();
    Some(Arc::new(config))
}

/// Connects upstream, sends `first`, then splices. Returns the outcome label.
async fn proxy<C: AsyncRead + AsyncWrite + Unpin>(
    client_io: C,
    first: Vec<u8>,
    client: SocketAddr,
    route: &CompiledStreamRoute,
    kind: ListenerKind,
    w: &Worker,
) -> &'static str {
    let mut up = match connect::connect(route, client, w.local).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(route = %route.id, %client, error = %e, "stream upstream unreachable");
            return "upstream_failed";
        }
    };
    if !first.is_empty() && up.stream.write_all(&first).await.is_err() {
        return "upstream_failed";
    }
    let drain = w.limits.drain_timeout;
    let stop = async {
        tokio::select! {
            () = route.removed.cancelled() => tokio::time::sleep(drain).await,
            () = w.closing.cancelled() => {}
        }
    };
    let (ended, moved) =
        splice::splice(client_io, &mut up.stream, route.idle_timeout_on(kind), stop).await;
    let bytes = &w.store.metrics().stream.bytes;
    bytes
        .with_label_values(&["upstream"])
        .inc_by(moved.upstream + first.len() as u64);
    bytes
        .with_label_values(&["downstream"])
        .inc_by(moved.downstream);
    match ended {
        splice::Ended::Done => "ok",
        splice::Ended::Idle => "idle",
        splice::Ended::Drained => "drained",
    }
}

/// A stream that yields `prefix` before reading `inner`: bytes already read (a ClientHello,
/// what followed a PROXY header) replayed into a TLS acceptor.
struct Prefixed<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.at < this.prefix.len() {
            let rest = &this.prefix[this.at..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.at += n;
            if this.at == this.prefix.len() {
                this.prefix = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
