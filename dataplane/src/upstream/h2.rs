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
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message as _;
use sluice_proto::v1;
use tokio::net::TcpStream;

use crate::http::ConnInfo;
use crate::http::headers::{ProxyHeaders, strip_hop_by_hop, wants_trailers};
use crate::upstream::Timeouts;
use crate::upstream::body::{ProxyBody, StreamBody};
use crate::upstream::error::ProxyError;
use crate::upstream::health::InFlight;
use crate::upstream::request_body::RequestBody;
use crate::upstream::tls::{Alpn, InvalidUpstreamTls, UpstreamTlsClient, negotiated_h2};
use sluice_io::h1::H1Error;

/// Most HTTP/1.1-over-TLS connections kept per endpoint.
const MAX_H1_CONNS: usize = 256;

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
                (a.clone(), registry.get(key, tls.clone()))
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
    fn get(&self, key: PoolKey, tls: Option<Arc<UpstreamTlsClient>>) -> Arc<HyperPool> {
        let mut pools = match self.pools.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(pool) = pools.get(&key).and_then(Weak::upgrade) {
            return pool;
        }
        let pool = Arc::new(HyperPool {
            address: key.address.clone(),
            scheme: key.scheme,
            tls,
            conns: Mutex::new(Vec::new()),
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

/// A client connection's request sender.
#[derive(Debug)]
enum Sender {
    H1(http1::SendRequest<RequestBody>),
    H2 {
        tx: http2::SendRequest<RequestBody>,
        worker: ThreadId,
    },
}

impl Sender {
    fn is_closed(&self) -> bool {
        match self {
            Sender::H1(tx) => tx.is_closed(),
            Sender::H2 { tx, .. } => tx.is_closed(),
        }
    }
}

/// Connections to one endpoint.
#[derive(Debug)]
struct HyperPool {
    address: String,
    scheme: UpstreamScheme,
    tls: Option<Arc<UpstreamTlsClient>>,
    conns: Mutex<Vec<Sender>>,
    /// Held while an HTTP/2-only connection is being set up, so that a burst of requests
    /// on a cold pool waits for that one connection instead of each dialing its own.
    connecting: tokio::sync::Mutex<()>,
}

impl HyperPool {
    /// A sender for one request: an idle one, or a new connection.
    async fn checkout(&self, timeouts: Timeouts, conn: &ConnInfo) -> Result<Sender, ProxyError> {
        if let Some(s) = self.checkout_idle() {
            return Ok(s);
        }
        if self.scheme == UpstreamScheme::Https {
            // HTTP/1.1 is possible: connections are not shared, so dial in parallel.
            return self.connect(timeouts, conn).await;
        }
        let _guard = self.connecting.lock().await;
        match self.checkout_idle() {
            Some(s) => Ok(s),
            None => self.connect(timeouts, conn).await,
        }
    }

    /// A sender that can take a request now, without connecting.
    fn checkout_idle(&self) -> Option<Sender> {
        let me = std::thread::current().id();
        let mut conns = self.conns.lock().ok()?;
        conns.retain(|s| !s.is_closed());
        let i = conns.iter().position(|s| match s {
            Sender::H1(tx) => tx.is_ready(),
            Sender::H2 { worker, .. } => *worker == me,
        })?;
        match &conns[i] {
            Sender::H2 { tx, worker } => Some(Sender::H2 {
                tx: tx.clone(),
                worker: *worker,
            }),
            Sender::H1(_) => Some(conns.swap_remove(i)),
        }
    }

    /// Keeps an HTTP/1.1 sender for reuse (it becomes ready once its response body ends).
    fn put_back(&self, tx: http1::SendRequest<RequestBody>) {
        if let Ok(mut conns) = self.conns.lock()
            && conns.len() < MAX_H1_CONNS
        {
            conns.push(Sender::H1(tx));
        }
    }

    /// Dials the endpoint and sets up a client connection; an HTTP/2 one is shared at once.
    async fn connect(&self, timeouts: Timeouts, conn: &ConnInfo) -> Result<Sender, ProxyError> {
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
        let sender = match (&self.tls, self.scheme) {
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
                } else {
                    let (tx, c) = http1::handshake(TokioIo::new(stream))
                        .await
                        .map_err(handshake_err)?;
                    tokio::spawn(async move {
                        if let Err(e) = c.await {
                            tracing::debug!(error = %e, "upstream connection ended");
                        }
                    });
                    Sender::H1(tx)
                }
            }
            (None, _) => h2_handshake(TokioIo::new(tcp), conn)
                .await
                .map_err(handshake_err)?,
        };
        if let Sender::H2 { tx, worker } = &sender
            && let Ok(mut conns) = self.conns.lock()
        {
            conns.push(Sender::H2 {
                tx: tx.clone(),
                worker: *worker,
            });
        }
        Ok(sender)
    }
}

async fn h2_handshake<T>(io: T, conn: &ConnInfo) -> Result<Sender, hyper::Error>
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
    Ok(Sender::H2 {
        tx,
        worker: std::thread::current().id(),
    })
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

/// A connection to one endpoint, ready to take a request: the connect phase of
/// [`send`], split off so that a connect failure can be retried on another endpoint
/// (see [`crate::upstream::failover`]).
#[derive(Debug)]
pub struct Connected {
    pool: Arc<HyperPool>,
    sender: Sender,
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
    let sender = pool.checkout(timeouts, conn).await?;
    Ok(Connected {
        pool: Arc::clone(pool),
        sender,
    })
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

/// Sends `prepared` on `connected`, a connection to the endpoint `address` of an upstream
/// with `protocol`; `host` is the Host (HTTP/2 `:authority`) this endpoint receives. The
/// response's body keeps `in_flight` until it ends; an error drops it.
#[allow(clippy::too_many_arguments)]
pub async fn send(
    prepared: Prepared,
    host: Option<HeaderValue>,
    conn: &ConnInfo,
    protocol: &UpstreamProtocol,
    address: &str,
    connected: Connected,
    timeouts: Timeouts,
    in_flight: InFlight,
) -> Result<Response<ProxyBody>, SendError> {
    let Connected { pool, mut sender } = connected;
    let Prepared { mut req, path } = prepared;
    let mut retried = false;
    let response = loop {
        let sent = match &mut sender {
            Sender::H2 { tx, .. } => {
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
                    .map_err(|_| {
                        SendError::Failed(ProxyError::BadRequest("invalid host or path"))
                    })?;
                *req.version_mut() = Version::HTTP_2;
                req.headers_mut().remove(header::HOST);
                conn.timer
                    .timeout(timeouts.read, tx.try_send_request(req))
                    .await
            }
            Sender::H1(tx) => {
                *req.uri_mut() = Uri::try_from(path.as_str())
                    .map_err(|_| SendError::Failed(ProxyError::BadRequest("invalid path")))?;
                *req.version_mut() = Version::HTTP_11;
                if let Some(h) = &host {
                    req.headers_mut().insert(header::HOST, h.clone());
                }
                conn.timer
                    .timeout(timeouts.read, tx.try_send_request(req))
                    .await
            }
        };
        match sent {
            Err(_) => return Err(ProxyError::ReadTimeout(address.to_owned()).into()),
            Ok(Ok(resp)) => break resp,
            Ok(Err(mut e)) => match e.take_message() {
                // NB: the request never left (the connection had just died): send it once
                // more on a fresh connection, or hand it back for another endpoint.
                Some(again) if !retried => {
                    retried = true;
                    match pool.connect(timeouts, conn).await {
                        Ok(s) => {
                            req = again;
                            sender = s;
                        }
                        Err(e) => {
                            let path = path.clone();
                            return Err(SendError::Unsent(
                                Box::new(Prepared { req: again, path }),
                                e,
                            ));
                        }
                    }
                }
                _ => return Err(upstream_failed(address, e.into_error()).into()),
            },
        }
    };
    if let Sender::H1(tx) = sender {
        pool.put_back(tx);
    }
    let (mut parts, body) = response.into_parts();
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(
        parts,
        ProxyBody::Stream(StreamBody::new(body, in_flight)),
    ))
}
