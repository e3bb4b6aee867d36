//! Upstreams that are not plain `http`: schemes `grpc` (HTTP/2 with prior knowledge,
//! h2c), `grpcs` (HTTP/2 over TLS, ALPN `h2`) and `https` (TLS, HTTP/2 when the upstream
//! negotiates `h2` by ALPN, else HTTP/1.1). Plain `http` is the path of
//! [`crate::upstream::h1_client`].
//!
//! - The connections of each endpoint: HTTP/2 ones are multiplexed, each worker thread
//!   keeps one per endpoint and all its requests share it, a dead one is replaced on the
//!   next request ([`crate::upstream::h2`], hyper's client). HTTP/1.1-over-TLS ones are
//!   pooled one request at a time, with the plain path's client, framing rules and
//!   connection-reuse guard ([`crate::upstream::Pool`]`<`[`crate::upstream::TlsIo`]`>`).
//! - The connect phase of an attempt: TCP, TLS, and for `https` the choice ALPN makes,
//!   known only after the handshake, so inside the attempt.
//! - [`proxy`]: a request's attempts, in the one loop of [`crate::upstream::attempt`].
//!
//! Pools are shared across snapshots by (scheme, endpoint, TLS settings), so a snapshot swap
//! neither reconnects nor cuts the streams in flight: a stream holds its connection's sender
//! until it ends.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, Weak};
use std::thread::ThreadId;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body::Body as _;
use hyper::client::conn::http2;
use hyper_util::rt::TokioIo;
use prost::Message as _;
use sluice_proto::v1;
use tokio::net::TcpStream;

use crate::http::ConnInfo;
use crate::http::headers::{ProxyHeaders, strip_hop_by_hop, wants_trailers};
use crate::upstream::attempt::{self, AttemptPolicy, Exchange, Failure, Picked};
use crate::upstream::body::ProxyBody;
use crate::upstream::error::ProxyError;
use crate::upstream::h1_client::{self, Outgoing, body_limit, exchange, failure, framing, stale};
use crate::upstream::h2::{self, SendError};
use crate::upstream::health::InFlight;
use crate::upstream::request_body::RequestBody;
use crate::upstream::tls::{Alpn, InvalidUpstreamTls, UpstreamTlsClient, negotiated_h2};
use crate::upstream::{Endpoint, Pool, PoolConfig, PooledConn, Timeouts, TlsIo, Upstream};
use sluice_io::h1::{Conn, Framing, H1Error, encode_request_head};

/// How an upstream is spoken to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpstreamScheme {
    /// HTTP/1.1 over TCP (the plain path of [`crate::upstream::h1_client`]).
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

    pub(crate) fn uses_tls(self) -> bool {
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
    conns: HashMap<String, Arc<EndpointConns>>,
}

impl UpstreamProtocol {
    /// Compiles the protocol settings of `up` for its endpoint `addresses`; `None` for plain
    /// `http`, which needs nothing of this module.
    pub fn compile(
        up: &v1::Upstream,
        addresses: &[String],
        registry: &ProtocolRegistry,
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
        let conns = addresses
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
        Ok(Some(UpstreamProtocol { scheme, tls, conns }))
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
pub struct ProtocolRegistry {
    pools: Mutex<HashMap<PoolKey, Weak<EndpointConns>>>,
}

impl ProtocolRegistry {
    fn get(
        &self,
        key: PoolKey,
        tls: Option<Arc<UpstreamTlsClient>>,
        config: PoolConfig,
    ) -> Arc<EndpointConns> {
        let mut pools = match self.pools.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(pool) = pools.get(&key).and_then(Weak::upgrade) {
            return pool;
        }
        let h1 = (key.scheme == UpstreamScheme::Https)
            .then(|| Arc::new(Pool::tls(&key.address, config)));
        let pool = Arc::new(EndpointConns {
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

/// Connections to one endpoint of an upstream that is not plain `http`: the HTTP/2 ones
/// (one per worker, shared by its requests), and for `https` the idle HTTP/1.1-over-TLS ones
/// of an upstream whose ALPN did not settle on `h2`.
#[derive(Debug)]
struct EndpointConns {
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
/// which may be retried on another endpoint when it fails. Which one it is, for `https`,
/// ALPN said.
#[derive(Debug)]
pub enum Connected {
    /// HTTP/2 (`h2`, h2c, gRPC): hyper's client.
    H2(http2::SendRequest<RequestBody>),
    /// HTTP/1.1 over TLS: the in-task client of [`crate::upstream::h1_client`].
    H1(PooledConn<TlsIo>),
}

impl EndpointConns {
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
                return Some(Connected::H2(s.tx.clone()));
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
                    h2::handshake(TokioIo::new(stream), &conn.timer)
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
            (None, _) => h2::handshake(TokioIo::new(tcp), &conn.timer)
                .await
                .map_err(handshake_err)?,
        };
        if let Ok(mut h2) = self.h2.lock() {
            h2.push(H2Sender {
                tx: tx.clone(),
                worker: std::thread::current().id(),
            });
        }
        Ok(Connected::H2(tx))
    }
}

/// Proxies `req` to `upstream` over its protocol; `host` is the client's Host, `hash` the
/// request's balancer hash, `policy` the route's deadlines and retry policy, `picked` as in
/// [`attempt::run`]. NB: an HTTP/2 request is not sent again once it was taken (its
/// exchange keeps no copy), so only connect failures and untaken requests are retried.
#[allow(clippy::too_many_arguments)]
pub async fn proxy(
    req: Request<RequestBody>,
    host: Option<HeaderValue>,
    conn: &ConnInfo,
    upstream: &Upstream,
    protocol: &UpstreamProtocol,
    hash: u64,
    timeouts: Timeouts,
    policy: Option<&AttemptPolicy>,
    picked: Option<&mut Option<Picked>>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let mut negotiated = Negotiated {
        prepared: Some(prepare(req, conn, host.as_ref())),
        host,
        conn,
        protocol,
        timeouts,
    };
    attempt::run(&mut negotiated, upstream, hash, timeouts, policy, picked).await
}

/// A request to an upstream with a protocol, as each attempt sends it.
struct Negotiated<'a> {
    /// The request; away only while an HTTP/2 connection holds it (it comes back untaken,
    /// or the attempt is the last).
    prepared: Option<Prepared>,
    /// The client's Host.
    host: Option<HeaderValue>,
    conn: &'a ConnInfo,
    protocol: &'a UpstreamProtocol,
    timeouts: Timeouts,
}

impl Exchange for Negotiated<'_> {
    type Output = Response<ProxyBody>;

    async fn attempt(
        &mut self,
        upstream: &Upstream,
        endpoint: &Endpoint,
        in_flight: InFlight,
        _now: Option<Instant>,
    ) -> Result<Self::Output, Failure> {
        let (conn, timeouts) = (self.conn, self.timeouts);
        let address = endpoint.address.as_str();
        let conns = self
            .protocol
            .conns
            .get(address)
            .ok_or_else(|| ProxyError::NoEndpoint(address.to_owned()))?;
        let mut connected = conns.checkout(timeouts, conn).await?;
        let host = upstream
            .host_header(endpoint)
            .cloned()
            .or(self.host.clone());
        let mut in_flight = Some(in_flight);
        // NB: an HTTP/2 request that a dying connection handed back untaken goes once more
        // on a fresh connection, then to another endpoint.
        let mut resent = false;
        loop {
            let Some(prepared) = self.prepared.as_mut() else {
                return Err(ProxyError::NoEndpoint(upstream.id.clone()).into());
            };
            let tx = match connected {
                Connected::H1(pooled) => {
                    let in_flight = in_flight.take().unwrap_or_else(|| endpoint.state.begin());
                    return send_h1(prepared, host, conn, conns, pooled, timeouts, in_flight).await;
                }
                Connected::H2(tx) => tx,
            };
            let Some(prepared) = self.prepared.take() else {
                return Err(ProxyError::NoEndpoint(upstream.id.clone()).into());
            };
            let tls = self.protocol.scheme.uses_tls();
            match h2::send(
                prepared,
                host.as_ref(),
                conn,
                tls,
                address,
                tx,
                timeouts,
                &mut in_flight,
            )
            .await
            {
                Ok(resp) => return Ok(resp),
                Err(SendError::Failed(e)) => return Err(Failure::taken(e)),
                Err(SendError::Unsent(p, e)) => {
                    self.prepared = Some(*p);
                    if resent {
                        return Err(Failure::taken(e));
                    }
                    resent = true;
                    connected = conns.connect(timeouts, conn).await?;
                }
            }
        }
    }

    #[inline]
    fn status(resp: &Self::Output) -> StatusCode {
        resp.status()
    }
}

/// A request made ready for any endpoint of the upstream (hop-by-hop headers dropped,
/// forwarding headers added), so that it can be sent again elsewhere unchanged.
#[derive(Debug)]
pub struct Prepared {
    /// The request head (its target as the client sent it, or as HTTP/2 rewrote it).
    pub(crate) parts: http::request::Parts,
    /// The request body.
    pub(crate) body: RequestBody,
    /// The path and query sent on.
    pub(crate) path: String,
}

/// Prepares `req` from a client whose Host is `client_host`.
fn prepare(
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
    Prepared { parts, body, path }
}

/// Whether `req` is a gRPC call (`content-type: application/grpc` or `application/grpc+...`),
/// whose errors must be answered in gRPC's own terms.
pub fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// Sends `prepared` on `pooled`, an HTTP/1.1-over-TLS connection to the endpoint `address`,
/// with the client of [`crate::upstream::h1_client`] (the plain path's framing rules, reuse
/// guard, retry rules and pool); `host` is the Host this endpoint receives. A replayable
/// request whose reused connection turns out closed goes once more on a fresh connection
/// from `endpoint`. The response's body keeps `in_flight` until it ends.
#[allow(clippy::too_many_arguments)]
async fn send_h1(
    prepared: &mut Prepared,
    host: Option<HeaderValue>,
    conn: &ConnInfo,
    endpoint: &Arc<EndpointConns>,
    mut pooled: PooledConn<TlsIo>,
    timeouts: Timeouts,
    in_flight: InFlight,
) -> Result<Response<ProxyBody>, Failure> {
    let Prepared { parts, body, path } = prepared;
    if let Some(h) = host {
        parts.headers.insert(header::HOST, h);
    }
    let has_body = !body.is_end_stream();
    let framing = framing(parts, body, has_body);
    let limit = body_limit(parts, has_body);
    let mut head = Vec::with_capacity(512);
    encode_request_head(
        &mut head,
        &parts.method,
        path,
        &parts.headers,
        framing,
        None,
    );
    let replayable = !has_body && parts.method.is_idempotent();
    let mut out = Outgoing {
        head: &head,
        body: has_body.then_some(body),
        limit,
        chunked: framing == Framing::Chunked,
        method: &parts.method,
    };
    let response = loop {
        match exchange(&mut pooled, &mut out, timeouts, conn).await {
            Ok(r) => break r,
            Err(e) if stale(&e, &pooled, replayable) => {
                match endpoint.connect(timeouts, conn).await? {
                    Connected::H1(fresh) => pooled = fresh,
                    Connected::H2(_) => return Err(failure(e, replayable)),
                }
            }
            Err(e) => return Err(failure(e, replayable)),
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
