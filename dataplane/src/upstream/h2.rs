//! Upstreams that are not plain HTTP/1.1: schemes `grpc` (HTTP/2 with prior knowledge, h2c),
//! `grpcs` (HTTP/2 over TLS, ALPN `h2`) and `https` (TLS, HTTP/2 when the upstream
//! negotiates `h2` by ALPN, else HTTP/1.1). Plain `http` keeps the in-task client of
//! [`crate::upstream::h1`].
//!
//! Requests go through hyper's client connections. An HTTP/2 connection is multiplexed: each
//! worker thread keeps one per endpoint and all its requests share it; a dead one is
//! replaced on the next request. HTTP/1.1-over-TLS connections are pooled one request at a
//! time. Bodies stream both ways frame by frame, trailers included, so gRPC streaming,
//! `grpc-status` and `grpc-message` pass through untouched; `te: trailers` is kept.
//!
//! Pools are shared across snapshots by (scheme, endpoint, TLS settings), so a snapshot swap
//! neither reconnects nor cuts the streams in flight: a stream holds its connection's sender
//! until it ends.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, Weak};
use std::thread::ThreadId;

use http::header::{self, HeaderValue};
use http::{Request, Response, Uri, Version};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message as _;
use sluice_proto::v1;
use tokio::net::TcpStream;

use http_body::Body as _;

use crate::http::ConnInfo;
use crate::http::headers::{ProxyHeaders, strip_hop_by_hop, wants_trailers};
use crate::upstream::body::{BodyLimit, ProxyBody, StreamBody};
use crate::upstream::error::ProxyError;
use crate::upstream::h1_client::{self, Outgoing, exchange, framing, stale};
use crate::upstream::health::InFlight;
use crate::upstream::request_body::RequestBody;
use crate::upstream::tls::{Alpn, InvalidUpstreamTls, UpstreamTlsClient, negotiated_h2};
use crate::upstream::{Pool, PoolConfig, PooledConn, Timeouts, TlsIo};
use sluice_io::h1::{Conn, Framing, H1Error, encode_request_head};

/// How an upstream is spoken to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpstreamScheme {
    /// HTTP/1.1 over TCP (handled by [`crate::upstream::h1`]).
    Http,
    /// TLS; HTTP/2 if the upstream negotiates it, else HTTP/1.1.
    Https,
    /// HTTP/2 over TCP with prior knowledge.
    Grpc,
    /// HTTP/2 over TLS.
    Grpcs,
}

impl UpstreamScheme {
    /// The scheme of a snapshot upstream (unknown values are plain HTTP).
    pub fn of(up: &v1::Upstream) -> Self {
        match v1::Scheme::try_from(up.scheme).unwrap_or(v1::Scheme::Http) {
            v1::Scheme::Http => UpstreamScheme::Http,
            v1::Scheme::Https => UpstreamScheme::Https,
            v1::Scheme::Grpc => UpstreamScheme::Grpc,
            v1::Scheme::Grpcs => UpstreamScheme::Grpcs,
        }
    }

    fn uses_tls(self) -> bool {
        matches!(self, UpstreamScheme::Https | UpstreamScheme::Grpcs)
    }
}

/// The protocol side of a compiled upstream whose scheme is not `http`: its TLS client and
/// one connection pool per endpoint.
#[derive(Debug)]
pub struct UpstreamProtocol {
    /// The scheme.
    pub scheme: UpstreamScheme,
    /// The TLS client, for `https` and `grpcs`.
    pub tls: Option<Arc<UpstreamTlsClient>>,
    pools: HashMap<String, Arc<HyperPool>>,
}

impl UpstreamProtocol {
    /// Compiles the protocol settings of `up` for its endpoint `addresses`; `None` for plain
    /// `http`, which needs nothing of this module.
    pub fn compile(
        up: &v1::Upstream,
        addresses: &[String],
        registry: &HyperRegistry,
        config: PoolConfig,
    ) -> Result<Option<Self>, InvalidUpstreamTls> {
        let scheme = UpstreamScheme::of(up);
        if scheme == UpstreamScheme::Http {
            return Ok(None);
        }
        let tls_key = up.tls.as_ref().map(|t| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            t.encode_to_vec().hash(&mut h);
            h.finish()
        });
        let tls = if scheme.uses_tls() {
            Some(Arc::new(UpstreamTlsClient::new(up.tls.as_ref())?))
        } else {
            None
        };
        let pools = addresses
            .iter()
            .map(|a| {
                let key = PoolKey {
                    scheme,
                    address: a.clone(),
                    tls: tls_key.filter(|_| scheme.uses_tls()),
                };
                (a.clone(), registry.get(key, tls.clone(), config))
            })
            .collect();
        Ok(Some(UpstreamProtocol { scheme, tls, pools }))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    scheme: UpstreamScheme,
    address: String,
    tls: Option<u64>,
}

/// Keeps the pools of this module alive across snapshots (weakly, like
/// [`crate::upstream::PoolRegistry`]).
#[derive(Debug, Default)]
pub struct HyperRegistry {
    pools: Mutex<HashMap<PoolKey, Weak<HyperPool>>>,
}

impl HyperRegistry {
    fn get(
        &self,
        key: PoolKey,
        tls: Option<Arc<UpstreamTlsClient>>,
        config: PoolConfig,
    ) -> Arc<HyperPool> {
        let mut pools = match self.pools.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(pool) = pools.get(&key).and_then(Weak::upgrade) {
            return pool;
        }
        let h1 = (key.scheme == UpstreamScheme::Https)
            .then(|| Arc::new(Pool::tls(&key.address, config)));
        let pool = Arc::new(HyperPool {
            address: key.address.clone(),
            scheme: key.scheme,
            tls,
            h2: Mutex::new(Vec::new()),
            h1,
            connecting: tokio::sync::Mutex::new(()),
        });
        pools.insert(key, Arc::downgrade(&pool));
        pool
    }

    /// Forgets pools that no snapshot holds any more.
    pub fn prune(&self) {
        if let Ok(mut pools) = self.pools.lock() {
            pools.retain(|_, p| p.strong_count() > 0);
        }
    }
}

/// An HTTP/2 connection's request sender, shared by the requests of the worker that opened it.
#[derive(Debug, Clone)]
struct H2Sender {
    tx: http2::SendRequest<RequestBody>,
    worker: ThreadId,
}

/// Connections to one endpoint: the HTTP/2 ones, and for `https` the HTTP/1.1-over-TLS
/// ones of an upstream whose ALPN did not settle on `h2`.
#[derive(Debug)]
struct HyperPool {
    address: String,
    scheme: UpstreamScheme,
    tls: Option<Arc<UpstreamTlsClient>>,
    h2: Mutex<Vec<H2Sender>>,
    /// Idle HTTP/1.1 connections over TLS (`https` only), with the reuse guard of the plain
    /// path.
    h1: Option<Arc<Pool<TlsIo>>>,
    /// Held while an HTTP/2-only connection is being set up, so that a burst of requests
    /// on a cold pool waits for that one connection instead of each dialing its own.
    connecting: tokio::sync::Mutex<()>,
}

/// A connection to one endpoint, ready to take a request: the connect phase of an attempt,
/// split off so that a connect failure can be retried on another endpoint (see
/// [`crate::upstream::failover`]). Which one it is, for `https`, ALPN said.
#[derive(Debug)]
pub enum Connected {
    /// HTTP/2 (`h2`, h2c, gRPC): hyper's client.
    H2(H2Connected),
    /// HTTP/1.1 over TLS: the in-task client of [`crate::upstream::h1_client`].
    H1(PooledConn<TlsIo>),
}

/// An HTTP/2 connection to one endpoint.
#[derive(Debug)]
pub struct H2Connected {
    pool: Arc<HyperPool>,
    tx: http2::SendRequest<RequestBody>,
}

impl HyperPool {
    /// A connection for one request: a shared HTTP/2 one, an idle HTTP/1.1 one, or a new
    /// connection.
    async fn checkout(
        self: &Arc<Self>,
        timeouts: Timeouts,
        conn: &ConnInfo,
    ) -> Result<Connected, ProxyError> {
        if let Some(c) = self.checkout_idle() {
            return Ok(c);
        }
        if self.scheme == UpstreamScheme::Https {
            // HTTP/1.1 is possible: connections are not shared, so dial in parallel.
            return self.connect(timeouts, conn).await;
        }
        let _guard = self.connecting.lock().await;
        match self.checkout_idle() {
            Some(c) => Ok(c),
            None => self.connect(timeouts, conn).await,
        }
    }

    /// A connection that can take a request now, without connecting.
    fn checkout_idle(self: &Arc<Self>) -> Option<Connected> {
        let me = std::thread::current().id();
        if let Ok(mut h2) = self.h2.lock() {
            h2.retain(|s| !s.tx.is_closed());
            if let Some(s) = h2.iter().find(|s| s.worker == me) {
                return Some(Connected::H2(H2Connected {
                    pool: Arc::clone(self),
                    tx: s.tx.clone(),
                }));
            }
        }
        let pooled = self.h1.as_ref()?.checkout_idle(None)?;
        Some(Connected::H1(pooled))
    }

    /// Dials the endpoint and sets up a client connection; an HTTP/2 one is shared at once.
    async fn connect(
        self: &Arc<Self>,
        timeouts: Timeouts,
        conn: &ConnInfo,
    ) -> Result<Connected, ProxyError> {
        let addr = self.address.clone();
        let tcp = match conn
            .timer
            .timeout(timeouts.connect, TcpStream::connect(addr.as_str()))
            .await
        {
            Err(_) => return Err(ProxyError::ConnectTimeout(addr)),
            Ok(Err(source)) => return Err(ProxyError::Connect { addr, source }),
            Ok(Ok(s)) => s,
        };
        let _ = tcp.set_nodelay(true);
        let handshake_err = |e: hyper::Error| ProxyError::Upstream {
            addr: self.address.clone(),
            source: H1Error::Io(std::io::Error::other(e)),
        };
        let tx = match (&self.tls, self.scheme) {
            (Some(tls), scheme) => {
                let alpn = if scheme == UpstreamScheme::Grpcs {
                    Alpn::H2
                } else {
                    Alpn::H2OrHttp11
                };
                let stream = match conn
                    .timer
                    .timeout(timeouts.connect, tls.connect(tcp, &addr, alpn))
                    .await
                {
                    Err(_) => return Err(ProxyError::ConnectTimeout(addr)),
                    Ok(Err(source)) => return Err(ProxyError::UpstreamTls { addr, source }),
                    Ok(Ok(s)) => s,
                };
                if negotiated_h2(&stream) || scheme == UpstreamScheme::Grpcs {
                    h2_handshake(TokioIo::new(stream), conn)
                        .await
                        .map_err(handshake_err)?
                } else if let Some(h1) = &self.h1 {
                    return Ok(Connected::H1(h1.adopt(Conn::over(Box::new(stream)))));
                } else {
                    return Err(ProxyError::UpstreamTls {
                        addr,
                        source: std::io::Error::other("the upstream did not negotiate h2"),
                    });
                }
            }
            (None, _) => h2_handshake(TokioIo::new(tcp), conn)
                .await
                .map_err(handshake_err)?,
        };
        if let Ok(mut h2) = self.h2.lock() {
            h2.push(H2Sender {
                tx: tx.clone(),
                worker: std::thread::current().id(),
            });
        }
        Ok(Connected::H2(H2Connected {
            pool: Arc::clone(self),
            tx,
        }))
    }
}

async fn h2_handshake<T>(
    io: T,
    conn: &ConnInfo,
) -> Result<http2::SendRequest<RequestBody>, hyper::Error>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (tx, c) = http2::Builder::new(TokioExecutor::new())
        .timer(conn.timer.clone())
        .handshake(io)
        .await?;
    tokio::spawn(async move {
        if let Err(e) = c.await {
            tracing::debug!(error = %e, "upstream h2 connection ended");
        }
    });
    Ok(tx)
}

/// Whether `req` is a gRPC call (`content-type: application/grpc` or `application/grpc+...`),
/// whose errors must be answered in gRPC's own terms.
pub fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

fn upstream_failed(addr: &str, e: hyper::Error) -> ProxyError {
    ProxyError::Upstream {
        addr: addr.to_owned(),
        source: H1Error::Io(std::io::Error::other(e)),
    }
}

/// Connects to the endpoint `address` of an upstream with `protocol` (or takes an idle or
/// shared connection). Nothing of a request has been sent when this fails.
pub async fn connect(
    conn: &ConnInfo,
    protocol: &UpstreamProtocol,
    address: &str,
    timeouts: Timeouts,
) -> Result<Connected, ProxyError> {
    let pool = protocol
        .pools
        .get(address)
        .ok_or_else(|| ProxyError::NoEndpoint(address.to_owned()))?;
    pool.checkout(timeouts, conn).await
}

/// A request made ready for any endpoint of the upstream (hop-by-hop headers dropped,
/// forwarding headers added), so that it can be sent again elsewhere unchanged.
#[derive(Debug)]
pub struct Prepared {
    req: Request<RequestBody>,
    path: String,
}

/// Prepares `req` from a client whose Host is `client_host`.
pub fn prepare(
    req: Request<RequestBody>,
    conn: &ConnInfo,
    client_host: Option<&HeaderValue>,
) -> Prepared {
    let (mut parts, body) = req.into_parts();
    let te_trailers = wants_trailers(&parts.headers);
    strip_hop_by_hop(&mut parts.headers);
    if te_trailers {
        parts
            .headers
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
    ProxyHeaders {
        client_ip: conn.remote_ip.as_bytes(),
        proto: conn.scheme,
        host: client_host.map(HeaderValue::as_bytes),
    }
    .insert_into(&mut parts.headers);
    let path = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/")
        .to_owned();
    Prepared {
        req: Request::from_parts(parts, body),
        path,
    }
}

/// Why [`send`] failed.
#[derive(Debug)]
pub enum SendError {
    /// The request never left: its connection died before taking it and no new one could
    /// be made. Another endpoint may take it.
    Unsent(Box<Prepared>, ProxyError),
    /// The request may have reached the upstream.
    Failed(ProxyError),
}

impl From<ProxyError> for SendError {
    fn from(e: ProxyError) -> Self {
        SendError::Failed(e)
    }
}

/// Sends `prepared` on `connected`, an HTTP/2 connection to the endpoint `address` of an
/// upstream with `protocol`; `host` is the `:authority` this endpoint receives. The
/// response's body keeps `in_flight` until it ends; an error drops it.
#[allow(clippy::too_many_arguments)]
pub async fn send(
    prepared: Prepared,
    host: Option<HeaderValue>,
    conn: &ConnInfo,
    protocol: &UpstreamProtocol,
    address: &str,
    connected: H2Connected,
    timeouts: Timeouts,
    in_flight: InFlight,
) -> Result<Response<ProxyBody>, SendError> {
    let H2Connected { pool, mut tx } = connected;
    let Prepared { mut req, path } = prepared;
    let scheme = if protocol.scheme.uses_tls() {
        "https"
    } else {
        "http"
    };
    let authority = host
        .as_ref()
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or(address);
    *req.uri_mut() = Uri::builder()
        .scheme(scheme)
        .authority(authority)
        .path_and_query(path.as_str())
        .build()
        .map_err(|_| SendError::Failed(ProxyError::BadRequest("invalid host or path")))?;
    *req.version_mut() = Version::HTTP_2;
    req.headers_mut().remove(header::HOST);
    let mut retried = false;
    let response = loop {
        let sent = conn
            .timer
            .timeout(timeouts.read, tx.try_send_request(req))
            .await;
        match sent {
            Err(_) => return Err(ProxyError::ReadTimeout(address.to_owned()).into()),
            Ok(Ok(resp)) => break resp,
            Ok(Err(mut e)) => match e.take_message() {
                // NB: the request never left (the connection had just died): send it once
                // more on a fresh connection, or hand it back for another endpoint.
                Some(again) if !retried => {
                    retried = true;
                    match pool.connect(timeouts, conn).await {
                        Ok(Connected::H2(fresh)) => {
                            req = again;
                            tx = fresh.tx;
                        }
                        Ok(Connected::H1(_)) => {
                            let e = ProxyError::Upstream {
                                addr: address.to_owned(),
                                source: H1Error::Invalid("the upstream stopped offering h2"),
                            };
                            return Err(SendError::Unsent(Box::new(unsent(again, path)), e));
                        }
                        Err(e) => {
                            return Err(SendError::Unsent(Box::new(unsent(again, path)), e));
                        }
                    }
                }
                _ => return Err(upstream_failed(address, e.into_error()).into()),
            },
        }
    };
    let (mut parts, body) = response.into_parts();
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(
        parts,
        ProxyBody::Stream(StreamBody::new(body, in_flight)),
    ))
}

/// A request an HTTP/2 connection handed back untaken, made ready for another endpoint
/// again (its target back to the path alone).
fn unsent(mut req: Request<RequestBody>, path: String) -> Prepared {
    if let Ok(uri) = Uri::try_from(path.as_str()) {
        *req.uri_mut() = uri;
    }
    Prepared { req, path }
}

/// Sends `prepared` on `pooled`, an HTTP/1.1-over-TLS connection to an endpoint of an
/// `https` upstream, with the client of [`crate::upstream::h1_client`] (the plain path's
/// framing rules, reuse guard and pool); `host` is the Host this endpoint receives. A
/// replayable request whose reused connection turns out closed goes once more on a fresh
/// connection from `protocol`. The response's body keeps `in_flight` until it ends.
#[allow(clippy::too_many_arguments)]
pub async fn send_h1(
    prepared: Prepared,
    host: Option<HeaderValue>,
    conn: &ConnInfo,
    protocol: &UpstreamProtocol,
    address: &str,
    mut pooled: PooledConn<TlsIo>,
    timeouts: Timeouts,
    in_flight: InFlight,
) -> Result<Response<ProxyBody>, ProxyError> {
    let Prepared { req, path } = prepared;
    let (mut parts, mut body) = req.into_parts();
    if let Some(h) = host {
        parts.headers.insert(header::HOST, h);
    }
    let has_body = !body.is_end_stream();
    let framing = framing(&parts, &body, has_body);
    let limit = if has_body {
        parts.extensions.get::<BodyLimit>().map(|l| l.0)
    } else {
        None
    };
    let mut head = Vec::with_capacity(512);
    encode_request_head(
        &mut head,
        &parts.method,
        &path,
        &parts.headers,
        framing,
        None,
    );
    let replayable = !has_body && parts.method.is_idempotent();
    let mut out = Outgoing {
        head: &head,
        body: has_body.then_some(&mut body),
        limit,
        chunked: framing == Framing::Chunked,
        method: &parts.method,
    };
    let response = loop {
        match exchange(&mut pooled, &mut out, timeouts, conn).await {
            Ok(r) => break r,
            Err(e) if stale(&e, &pooled, replayable) => {
                let pool = protocol
                    .pools
                    .get(address)
                    .ok_or_else(|| ProxyError::NoEndpoint(address.to_owned()))?;
                match pool.connect(timeouts, conn).await? {
                    Connected::H1(fresh) => pooled = fresh,
                    Connected::H2(_) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    };
    pooled.hold(in_flight);
    let spare = std::mem::take(&mut parts.headers);
    let (parts, body) = h1_client::response(pooled, response, spare, timeouts, conn);
    Ok(Response::from_parts(
        parts,
        ProxyBody::UpstreamTls(Box::new(body)),
    ))
}
