//! WebSocket upgrades for routes with `websocket: true`.
//!
//! The request goes to the upstream on a connection of its own (plain TCP, or TLS with ALPN
//! `http/1.1` for scheme `https`) with its `Upgrade` and `Connection: upgrade` headers kept
//! (they are hop-by-hop and dropped on every other request, as APISIX does for routes
//! without `enable_websocket`). When the upstream answers `101`, the answer is relayed and
//! both connections are spliced byte for byte until either side closes. The splice runs in
//! a task of its own that holds only the two sockets, so snapshot swaps do not touch it; the
//! connection never returns to a pool.
//!
//! NB: once upgraded, a session has no idle timeout (the route's read timeout applies only
//! to the upstream's answer to the upgrade request).
//!
//! Graceful drain: an upgraded session outlives its HTTP connection, so each worker counts
//! the sessions it runs ([`sessions_closed`]) and keeps serving them after SIGTERM until
//! they end or the process's `--drain-timeout` passes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use bytes::BytesMut;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::http::ConnInfo;
use crate::http::headers::ProxyHeaders;
use crate::http::headers::strip_hop_by_hop;
use crate::upstream::attempt::{self, AttemptPolicy, Exchange, Failure, Picked};
use crate::upstream::body::ProxyBody;
use crate::upstream::error::ProxyError;
use crate::upstream::health::InFlight;
use crate::upstream::request_body::RequestBody;
use crate::upstream::tls::{Alpn, UpstreamTlsClient};
use crate::upstream::{Endpoint, Timeouts, Upstream};
use sluice_io::h1::{
    Framing, H1Error, MAX_HEAD_BYTES, ResponseHead, encode_request_head,
    parse_upgrade_response_head,
};

/// Upgraded sessions running on one worker thread.
#[derive(Debug, Default)]
struct Sessions {
    open: AtomicUsize,
    closed: Notify,
}

thread_local! {
    // NB: per thread, because a worker is a current-thread runtime: its sessions' tasks run
    // where the upgrade was answered, and that worker waits for them when it drains.
    static SESSIONS: Arc<Sessions> = Arc::new(Sessions::default());
}

/// Counts one upgraded session of this thread as open until dropped.
struct SessionGuard(Arc<Sessions>);

impl SessionGuard {
    fn open() -> Self {
        let sessions = SESSIONS.with(Arc::clone);
        sessions.open.fetch_add(1, Ordering::SeqCst);
        SessionGuard(sessions)
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.closed.notify_waiters();
        }
    }
}

/// Resolves once no upgraded session is open on this thread (this worker); a draining
/// worker awaits it after its HTTP connections have finished.
pub async fn sessions_closed() {
    let sessions = SESSIONS.with(Arc::clone);
    loop {
        let closed = sessions.closed.notified();
        tokio::pin!(closed);
        closed.as_mut().enable();
        let open = sessions.open.load(Ordering::SeqCst);
        if open == 0 {
            return;
        }
        tracing::info!(
            open,
            "draining: waiting for upgraded (WebSocket) sessions to close"
        );
        closed.await;
    }
}

/// Largest body of a refused upgrade (a non-101 answer) relayed to the client.
const MAX_REFUSAL_BODY: usize = 64 * 1024;

/// A byte stream to the upstream, plain or TLS.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A connection to an upstream endpoint made for one upgrade (see [`connect`]).
pub type UpstreamIo = Box<dyn Io>;

/// Whether a request with head `req` asks for a WebSocket upgrade (HTTP/1.1
/// `Upgrade: websocket`).
pub fn is_upgrade(req: &http::request::Parts) -> bool {
    req.version == http::Version::HTTP_11
        && req.headers.get_all(header::UPGRADE).iter().any(|v| {
            v.to_str().is_ok_and(|s| {
                s.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("websocket"))
            })
        })
}

fn upstream_err(addr: &str, e: H1Error) -> ProxyError {
    ProxyError::Upstream {
        addr: addr.to_owned(),
        source: e,
    }
}

/// Proxies the upgrade request `req` to an endpoint of `upstream` (over TLS with `tls`),
/// in the attempt loop of [`crate::upstream::attempt`]: a connect failure is retried on
/// another endpoint; once sent, the upstream's answer is final. `host` is the client's
/// Host, `hash` the request's balancer hash, `picked` as in [`attempt::run`].
#[allow(clippy::too_many_arguments)]
pub async fn upgrade(
    req: Request<RequestBody>,
    host: Option<HeaderValue>,
    conn: &ConnInfo,
    upstream: &Upstream,
    tls: Option<&UpstreamTlsClient>,
    hash: u64,
    timeouts: Timeouts,
    policy: Option<&AttemptPolicy>,
    picked: Option<&mut Option<Picked>>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let mut upgrade = Upgrade {
        req: Some(req),
        host,
        conn,
        tls,
        timeouts,
    };
    attempt::run(&mut upgrade, upstream, hash, timeouts, policy, picked).await
}

/// An upgrade request, as an attempt sends it.
struct Upgrade<'a> {
    /// The request, until an endpoint was reached.
    req: Option<Request<RequestBody>>,
    host: Option<HeaderValue>,
    conn: &'a ConnInfo,
    tls: Option<&'a UpstreamTlsClient>,
    timeouts: Timeouts,
}

impl Exchange for Upgrade<'_> {
    type Output = Response<ProxyBody>;

    async fn attempt(
        &mut self,
        upstream: &Upstream,
        endpoint: &Endpoint,
        in_flight: InFlight,
        _now: Option<Instant>,
    ) -> Result<Self::Output, Failure> {
        let address = endpoint.address.as_str();
        let io = connect(self.conn, self.tls, address, self.timeouts).await?;
        let Some(req) = self.req.take() else {
            return Err(ProxyError::NoEndpoint(upstream.id.clone()).into());
        };
        proxy(
            req,
            self.host.clone(),
            upstream.host_header(endpoint).cloned(),
            self.conn,
            io,
            address,
            self.timeouts,
            in_flight,
        )
        .await
        .map_err(Failure::taken)
    }

    #[inline]
    fn status(resp: &Self::Output) -> StatusCode {
        resp.status()
    }
}

/// Connects to the endpoint `address` for an upgrade (over TLS with `tls`, ALPN
/// `http/1.1`). Nothing of the request has been sent when this fails, so another endpoint
/// may be tried.
async fn connect(
    conn: &ConnInfo,
    tls: Option<&UpstreamTlsClient>,
    address: &str,
    timeouts: Timeouts,
) -> Result<UpstreamIo, ProxyError> {
    let addr = address.to_owned();
    let tcp = match conn
        .timer
        .timeout(timeouts.connect, TcpStream::connect(address))
        .await
    {
        Err(_) => return Err(ProxyError::ConnectTimeout(addr)),
        Ok(Err(source)) => return Err(ProxyError::Connect { addr, source }),
        Ok(Ok(s)) => s,
    };
    let _ = tcp.set_nodelay(true);
    Ok(match tls {
        None => Box::new(tcp),
        Some(tls) => match conn
            .timer
            .timeout(timeouts.connect, tls.connect(tcp, address, Alpn::Http11))
            .await
        {
            Err(_) => return Err(ProxyError::ConnectTimeout(addr)),
            Ok(Err(source)) => return Err(ProxyError::UpstreamTls { addr, source }),
            Ok(Ok(s)) => Box::new(s),
        },
    })
}

/// Carried by a `101 Switching Protocols` response: cancelled when the session it opened
/// ends (both sides closed, or the drain cut it), so that what a request holds until its end
/// (the log phase, limit-conn's slot) lasts as long as the session, as in nginx.
#[derive(Debug, Clone)]
pub struct SessionEnd {
    /// Cancelled when the session ends.
    pub ended: CancellationToken,
    /// What the session carried, set before `ended` is cancelled.
    pub bytes: Arc<SessionBytes>,
}

/// Bytes of a session (0 when it ended on an error).
#[derive(Debug, Default)]
pub struct SessionBytes {
    /// From the client to the upstream.
    pub up: AtomicU64,
    /// From the upstream to the client.
    pub down: AtomicU64,
}

/// Proxies the upgrade request `req` on `upstream`, a connection to the endpoint `address`
/// made by [`connect`]. A session keeps `in_flight` until it ends (nginx counts a WebSocket
/// as one request for its whole life, and so does `least_conn`); a refusal drops it.
/// `host` is the client's host (X-Forwarded-Host); `upstream_host`, when the upstream's
/// `passHost` sets one, replaces its `Host`.
#[allow(clippy::too_many_arguments)]
async fn proxy(
    mut req: Request<RequestBody>,
    host: Option<HeaderValue>,
    upstream_host: Option<HeaderValue>,
    conn: &ConnInfo,
    mut upstream: UpstreamIo,
    address: &str,
    timeouts: Timeouts,
    in_flight: InFlight,
) -> Result<Response<ProxyBody>, ProxyError> {
    let on_upgrade = hyper::upgrade::on(&mut req);
    let (mut parts, _body) = req.into_parts();
    let upgrade = parts.headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(&mut parts.headers);
    if let Some(u) = upgrade {
        parts.headers.insert(header::UPGRADE, u);
    }
    // The upstream's `passHost` (node, rewrite), as on the HTTP/1.1 path; `host` (the
    // client's) stays the X-Forwarded-Host.
    if let Some(h) = upstream_host {
        parts.headers.insert(header::HOST, h);
    }
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    let target = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/");
    let mut head = Vec::with_capacity(512);
    encode_request_head(
        &mut head,
        &parts.method,
        target,
        &parts.headers,
        Framing::Empty,
        Some(ProxyHeaders {
            client_ip: conn.remote_ip.as_bytes(),
            proto: conn.scheme,
            host: host.as_ref().map(HeaderValue::as_bytes),
        }),
    );

    let addr = address.to_owned();
    if let Err(e) = upstream.write_all(&head).await {
        return Err(upstream_err(address, H1Error::Io(e)));
    }
    let mut buf = BytesMut::with_capacity(4096);
    let head = match conn
        .timer
        .timeout(
            timeouts.read,
            read_head(&mut upstream, &mut buf, &parts.method),
        )
        .await
    {
        Err(_) => return Err(ProxyError::ReadTimeout(addr)),
        Ok(Err(e)) => return Err(upstream_err(address, e)),
        Ok(Ok(h)) => h,
    };
    let (status, headers) = (head.parts.status, head.parts.headers);

    if status != StatusCode::SWITCHING_PROTOCOLS {
        // The upstream refused the upgrade: relay its answer as an ordinary response.
        let mut headers = headers;
        let length = match head.framing {
            Framing::Length(n) => usize::try_from(n).unwrap_or(usize::MAX),
            _ => 0,
        }
        .min(MAX_REFUSAL_BODY);
        while buf.len() < length {
            match conn
                .timer
                .timeout(timeouts.read, upstream.read_buf(&mut buf))
                .await
            {
                Ok(Ok(n)) if n > 0 => {}
                _ => break,
            }
        }
        buf.truncate(length);
        strip_hop_by_hop(&mut headers);
        headers.remove(header::CONTENT_LENGTH);
        let mut resp = Response::new(ProxyBody::full(buf.freeze()));
        *resp.status_mut() = status;
        *resp.headers_mut() = headers;
        return Ok(resp);
    }

    let mut resp = Response::new(ProxyBody::empty());
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    let end = SessionEnd {
        ended: CancellationToken::new(),
        bytes: Arc::default(),
    };
    resp.extensions_mut().insert(end.clone());
    let leftover = buf.freeze();
    let session = SessionGuard::open();
    tokio::spawn(async move {
        let _session = session;
        let _in_flight = in_flight;
        let _ended = end.ended.drop_guard();
        let bytes = end.bytes;
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "downstream upgrade failed");
                return;
            }
        };
        let mut downstream = TokioIo::new(upgraded);
        if !leftover.is_empty() && downstream.write_all(&leftover).await.is_err() {
            return;
        }
        match tokio::io::copy_bidirectional(&mut downstream, &mut upstream).await {
            Ok((up, down)) => {
                tracing::debug!(up, down, "websocket session ended");
                bytes.up.store(up, Ordering::Relaxed);
                bytes
                    .down
                    .store(down + leftover.len() as u64, Ordering::Relaxed);
            }
            Err(e) => tracing::debug!(error = %e, "websocket session ended"),
        }
    });
    Ok(resp)
}

/// Reads the upstream's answer to the upgrade from `io` (interim 1xx answers other than
/// 101 skipped), parsed by the HTTP/1.1 codec; bytes after it stay in `buf`.
async fn read_head(
    io: &mut Box<dyn Io>,
    buf: &mut BytesMut,
    method: &Method,
) -> Result<ResponseHead, H1Error> {
    loop {
        if !buf.is_empty() {
            if let Some(head) = parse_upgrade_response_head(buf, method)? {
                let status = head.parts.status;
                if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
                    continue;
                }
                return Ok(head);
            }
            if buf.len() > MAX_HEAD_BYTES {
                return Err(H1Error::Invalid("response head too large"));
            }
        }
        buf.reserve(4096);
        if io.read_buf(buf).await? == 0 {
            return Err(if buf.is_empty() {
                H1Error::ClosedBeforeResponse
            } else {
                H1Error::Truncated
            });
        }
    }
}
