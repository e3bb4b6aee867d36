//! The `--listen-https` accept loop: TLS termination with the certificates of the current
//! snapshot ([`crate::config::certs::TlsTable`]).
//!
//! ```text
//! TCP accept ─▶ read ClientHello (LazyConfigAcceptor) ─▶ SNI ─▶ current TlsTable ─▶ ServerConfig
//!   ─▶ handshake (ALPN h2 | http/1.1, client certificate when the host asks for one)
//!   ─▶ hyper HTTP/2 or HTTP/1.1 ─▶ per request: mTLS path check ─▶ request::handle (scheme https)
//! ```
//!
//! - A handshake takes the table current at its ClientHello and keeps that configuration for
//!   its whole life, so a rotation (the next snapshot) serves new handshakes with the new
//!   certificate while open connections carry on.
//! - Client certificates per request ([`super::mtls`], the plain-HTTP listener runs the
//!   same guard): with `skip_mtls_uri_regex`, a request without a client certificate whose
//!   normalised path matches none of the regexes gets 400 `client certificate verification
//!   is not passed`; a request whose host (the one it is routed by: an absolute-form
//!   target's authority, else `Host`; `:authority` in HTTP/2) is covered by a different
//!   certificate that requires client certificates gets 421 Misdirected Request, so a
//!   handshake for a public host cannot be used to reach an mTLS-protected one.
//! - On a per-Gateway port with several Gateway listeners, a request whose host chooses
//!   another listener than the ClientHello's server name did gets 421 too
//!   ([`crate::config::sections`]), whatever the certificates: the connection belongs to
//!   the listener its handshake was made for (HTTP/2 connections coalesced by a client
//!   across hosts included).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::ServerConfig;
use rustls::server::Acceptor;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::LazyConfigAcceptor;

use crate::config::certs::{SniEntry, refusing_config};
use crate::config::store::Store;
use crate::http::ConnInfo;
use crate::http::host::effective_host;
use crate::listener::mtls::Conn;
use crate::listener::proxy_protocol::{self, ProxyProtocol};
use crate::listener::server::{
    Activity, Drain, Limits, close_if_going_away, connection_builders, serve_h2,
    spawn_listener_workers,
};
use crate::request::handle;
use crate::upstream::body::ProxyBody;
use sluice_io::send_timeout::SendTimeout;
use sluice_io::timer::CoarseTimer;

/// What a TLS connection brings to each of its requests.
#[derive(Debug)]
struct TlsConn {
    entry: Arc<SniEntry>,
    has_client_cert: bool,
    /// The per-Gateway listener it came in on (`None`: the dataplane's own).
    listener: Option<Arc<str>>,
    /// The ClientHello's server name, on a per-Gateway listener (misdirected requests).
    server_name: Option<Box<str>>,
}

impl TlsConn {
    /// A response refusing the request, if the connection may not serve it
    /// ([`super::mtls`]).
    fn refuse(&self, req: &Request<Incoming>, store: &Store) -> Option<Response<ProxyBody>> {
        let conn = Conn::Tls {
            cert_id: &self.entry.id,
            client_auth: &self.entry.client_auth,
            client_cert: self.has_client_cert,
        };
        let table = store.peek_table();
        if let Some(l) = self.listener.as_deref().and_then(|id| table.listener(id))
            && !l.sections.is_empty()
        {
            // NB: a host that cannot be decided is refused by the mTLS guard below.
            if let Ok(host) = effective_host(req)
                && l.sections.misdirected(
                    self.server_name.as_deref(),
                    host.as_ref().map(|h| h.as_str()),
                )
            {
                return super::mtls::response(super::mtls::Verdict::Misdirected);
            }
        }
        super::mtls::refuse(req, conn, table.tls_for(self.listener.as_deref()))
    }
}

/// Like [`crate::listener::server::spawn_workers_until`], for the HTTPS listener
/// ([`serve_https_until`]).
pub fn spawn_https_workers(
    addr: SocketAddr,
    workers: usize,
    store: Arc<Store>,
    limits: Limits,
    drain: Drain,
    proxy: Option<ProxyProtocol>,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    let proxy = proxy.map(Arc::new);
    spawn_listener_workers(addr, workers, "sluice-tls-worker", move |listener| {
        serve_https_listener(
            listener,
            Arc::clone(&store),
            limits,
            drain.clone(),
            None,
            proxy.clone(),
        )
    })
}

/// Accepts TLS connections on `listener` and serves them until the runtime stops.
pub async fn serve_https(listener: TcpListener, store: Arc<Store>, limits: Limits) {
    serve_https_until(listener, store, limits, Drain::never()).await;
}

/// Like [`serve_https`] until `drain` fires; then, as the HTTP listener does, stops
/// accepting, lets open connections finish their in-flight requests and returns when none
/// is left.
pub async fn serve_https_until(
    listener: TcpListener,
    store: Arc<Store>,
    limits: Limits,
    drain: Drain,
) {
    serve_https_listener(listener, store, limits, drain, None, None).await;
}

/// Like [`serve_https_until`], with `--proxy-protocol`: `proxy` set, every connection must
/// start with a PROXY header, before its ClientHello ([`crate::listener::proxy_protocol`]).
pub async fn serve_https_proxied_until(
    listener: TcpListener,
    store: Arc<Store>,
    limits: Limits,
    drain: Drain,
    proxy: Option<ProxyProtocol>,
) {
    serve_https_listener(listener, store, limits, drain, None, proxy.map(Arc::new)).await;
}

/// Like [`serve_https_until`], for a per-Gateway listener (`scope`: its id; `None` for the
/// dataplane's own HTTPS listener): handshakes take its certificates and requests its
/// routes; connections start with a PROXY header when its `Listener` has
/// `accept_proxy_protocol`.
pub async fn serve_https_scoped(
    listener: TcpListener,
    store: Arc<Store>,
    limits: Limits,
    drain: Drain,
    scope: Option<Arc<str>>,
) {
    serve_https_listener(listener, store, limits, drain, scope, None).await;
}

async fn serve_https_listener(
    listener: TcpListener,
    store: Arc<Store>,
    limits: Limits,
    drain: Drain,
    scope: Option<Arc<str>>,
    proxy: Option<Arc<ProxyProtocol>>,
) {
    let Some(refuse) = refusing_config() else {
        tracing::error!("cannot build the TLS configuration; HTTPS listener not serving");
        return;
    };
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    super::server::spawn_idle_trim(&permits, limits.max_connections);
    super::server::nodelay_for_accepted(&listener);
    sluice_io::wbatch::enable_on_this_thread();
    let timer = CoarseTimer::new();
    tokio::spawn(timer.clone().run());
    let (h1, h2) = connection_builders(&limits, &timer);
    let listening = super::server::listening_on(&listener);
    // NB: registered once, not per accepted connection.
    let stop = drain.draining();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            biased;
            _ = &mut stop => break,
            a = async {
                let permit = Arc::clone(&permits).acquire_owned().await.ok()?;
                Some((permit, listener.accept().await))
            } => a,
        };
        let Some((permit, accepted)) = accepted else {
            return;
        };
        let (mut stream, remote) = match accepted {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        crate::listener::server::nodelay_per_connection(&stream);
        let local = super::server::local_addr_of(&stream, listening, remote);
        let store = Arc::clone(&store);
        let (h1, h2) = (Arc::clone(&h1), Arc::clone(&h2));
        let timer = timer.clone();
        let refuse = Arc::clone(&refuse);
        let mut drain = drain.clone();
        let scope = scope.clone();
        let expect = proxy_protocol::expect(proxy.as_deref(), scope.as_deref(), &store, &remote);
        tokio::spawn(async move {
            let deadline = limits.header_read_timeout;
            // NB: boxed, so that the connection's task keeps no room for the handshake
            // once it is done (a parked connection keeps its task; issue 21).
            let handshaking: Pin<Box<dyn Future<Output = _> + Send + '_>> = Box::pin(async {
                // NB: the PROXY header comes before the ClientHello; its own timeout.
                let (client, first) = proxy_protocol::accept(
                    &mut stream,
                    remote,
                    expect,
                    limits.proxy_header_timeout,
                    &store,
                )
                .await?;
                let io = SendTimeout::new(
                    sluice_io::wbatch::BatchedStream::with_unread(stream, first.into()),
                    timer.clone(),
                    limits.send_timeout,
                );
                let shaken = tokio::time::timeout(
                    deadline,
                    handshake(io, client, &store, refuse, scope.clone()),
                )
                .await
                .ok()??;
                Some((client, shaken))
            });
            let handshaken = tokio::select! {
                h = handshaking => h,
                _ = drain.wait() => return,
            };
            let Some((remote, (tls, conn))) = handshaken else {
                return;
            };
            let is_h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            let mut info = ConnInfo::new(remote, local, "https", timer);
            info.client_body_timeout = limits.client_body_timeout;
            info.max_header_bytes = limits.max_header_bytes;
            info.going_away = Some(drain.going_away_flag());
            info.listener = scope;
            let info = Arc::new(info);
            let conn = Arc::new(conn);
            let timer = info.timer.clone();
            let metrics = Arc::clone(&store);
            let answer = move |req: Request<Incoming>| {
                let store = Arc::clone(&store);
                let info = Arc::clone(&info);
                let conn = Arc::clone(&conn);
                async move {
                    if let Some(resp) = conn.refuse(&req, &store) {
                        store.metrics().observe_status(resp.status());
                        return resp;
                    }
                    let mut resp = handle(req, &info, &store).await;
                    if !is_h2 {
                        close_if_going_away(&mut resp, &info);
                    }
                    resp
                }
            };
            let result = if is_h2 {
                serve_tls_h2(tls, &h2, limits, drain, answer).await
            } else {
                crate::listener::idle::serve_h1(
                    tls,
                    timer,
                    metrics,
                    h1,
                    limits.header_read_timeout,
                    drain,
                    answer,
                )
                .await
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "downstream TLS connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    // Every connection holds a permit: having them all back means none is left.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = permits.acquire_many(all).await;
    // Upgraded (WebSocket) sessions outlive their connection: serve them until they close
    // (the process's --drain-timeout bounds the wait).
    crate::upstream::websocket::sessions_closed().await;
}

/// An HTTP/2 connection over TLS, served to its end by `answer`. NB: a plain function
/// returning a box, so that HTTP/1.1 connections' tasks keep no room for it.
fn serve_tls_h2<A, F>(
    tls: tokio_rustls::server::TlsStream<SendTimeout<sluice_io::wbatch::BatchedStream>>,
    h2: &hyper::server::conn::http2::Builder<hyper_util::rt::TokioExecutor>,
    limits: Limits,
    drain: Drain,
    answer: A,
) -> Pin<Box<dyn Future<Output = Result<(), hyper::Error>> + Send>>
where
    A: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = http::Response<crate::upstream::body::ProxyBody>> + Send + 'static,
{
    let activity = Activity::new();
    let counted = activity.clone();
    let service = service_fn(move |req: Request<Incoming>| {
        let request = counted.begin();
        let answer = answer(req);
        let watch = counted.clone();
        async move {
            let resp = answer.await;
            drop(request);
            Ok::<_, std::convert::Infallible>(watch.watch(resp))
        }
    });
    let conn = h2.serve_connection(TokioIo::new(tls), service);
    Box::pin(serve_h2(conn, activity, limits, drain, |c| {
        c.graceful_shutdown()
    }))
}

/// Reads the ClientHello, picks the configuration for its SNI from the current table and
/// completes the handshake. `None` when the handshake failed (logged at debug level).
async fn handshake(
    stream: SendTimeout<sluice_io::wbatch::BatchedStream>,
    remote: SocketAddr,
    store: &Store,
    refuse: Arc<ServerConfig>,
    listener: Option<Arc<str>>,
) -> Option<(
    tokio_rustls::server::TlsStream<SendTimeout<sluice_io::wbatch::BatchedStream>>,
    TlsConn,
)> {
    let start = match LazyConfigAcceptor::new(Acceptor::default(), stream).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(%remote, error = %e, "not a TLS ClientHello");
            return None;
        }
    };
    let sni = start.client_hello().server_name().map(str::to_owned);
    let entry = store
        .table()
        .tls_for(listener.as_deref())
        .and_then(|tls| tls.select(sni.as_deref()))
        .cloned();
    let Some(entry) = entry else {
        tracing::debug!(%remote, sni = ?sni, "TLS handshake refused: no certificate for this server name");
        // NB: finishing the handshake with a resolver that has no certificate sends the
        // client an `access_denied` alert rather than just closing the socket.
        let _ = start.into_stream(refuse).await;
        return None;
    };
    match start.into_stream(Arc::clone(&entry.config)).await {
        Ok(tls) => {
            let has_client_cert = tls.get_ref().1.peer_certificates().is_some();
            let server_name = listener.as_ref().and(sni).map(String::into_boxed_str);
            Some((
                tls,
                TlsConn {
                    entry,
                    has_client_cert,
                    listener,
                    server_name,
                },
            ))
        }
        Err(e) => {
            tracing::debug!(%remote, sni = ?sni, error = %e, "TLS handshake failed");
            None
        }
    }
}
