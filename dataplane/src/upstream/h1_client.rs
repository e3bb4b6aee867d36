//! The HTTP/1.1 client of every upstream that speaks it, plain or over TLS: one request on
//! one pooled connection ([`crate::upstream::Pool`], the `sluice_io::h1` codec), up to the
//! response head, and the response whose body then streams from that connection.
//!
//! Generic over the connection's stream ([`Transport`]): plain TCP compiles to its own code,
//! with no branch on the kind of stream; HTTPS upstreams whose ALPN settles on HTTP/1.1 (or
//! none) take the same code over rustls ([`crate::upstream::protocol`]), with the same
//! framing rules and the same connection-reuse guard.
//!
//! [`H1Forward`] is the plain `http` path: its attempts run in
//! [`crate::upstream::attempt::run`], like every protocol's. A request without a body can be
//! sent again on a fresh connection if a reused one turns out to have been closed by the
//! upstream, or to another endpoint after a reset before any response byte; others check
//! the idle connection before using it (the pool's reuse guard).

use std::time::Instant;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode, request, response};
use http_body::Body as _;
use http_body_util::BodyExt as _;

use crate::http::ConnInfo;
use crate::http::headers::{ProxyHeaders, strip_hop_by_hop};
use crate::upstream::attempt::{self, AttemptPolicy, Exchange, Failure, Picked};
use crate::upstream::body::{BodyLimit, ProxyBody, ReadWatch, UpstreamBody};
use crate::upstream::error::ProxyError;
use crate::upstream::health::InFlight;
use crate::upstream::request_body::RequestBody;
use crate::upstream::{Endpoint, PooledConn, Timeouts, Upstream};
use sluice_io::h1::{Framing, H1Error, ResponseHead, Transport, encode_request_head};

/// Where an HTTP/1.1 request to a plain `http` upstream goes, and what is sent with it.
#[derive(Debug, Clone, Copy)]
pub struct H1Forward<'a> {
    /// The downstream connection.
    pub conn: &'a ConnInfo,
    /// The upstream.
    pub upstream: &'a Upstream,
    /// The request's balancer hash.
    pub hash: u64,
    /// Timeouts of the route or upstream.
    pub timeouts: Timeouts,
    /// The route's deadlines and retry policy, if any.
    pub policy: Option<&'a AttemptPolicy>,
    /// The request's host (`Host` when the request has none, `X-Forwarded-Host`).
    pub host: Option<&'a HeaderValue>,
}

impl H1Forward<'_> {
    /// Proxies the request (`parts`, `body`) to an endpoint over HTTP/1.1 and returns the
    /// response, whose body streams from the upstream connection, with the size of the
    /// upstream's response head.
    ///
    /// - `real_ip`: the client address the plugins (real-ip) put in place of the peer's.
    /// - `picked`: when given, receives the endpoint of each attempt and when it started
    ///   (the log phase's `node` and upstream time); when `None` the clock is not read for it.
    ///
    /// Once the response head came, `parts.headers` is empty: the map's allocation is kept
    /// for the connection's next response head ([`sluice_io::h1::Conn::keep_for_next_head`]).
    ///
    /// NB: the request by reference, so that the request's future does not store the head
    /// twice (an async fn keeps its arguments for its whole life).
    pub async fn send(
        self,
        parts: &mut request::Parts,
        body: &mut RequestBody,
        real_ip: Option<&crate::http::InlineText>,
        picked: Option<&mut Option<Picked>>,
    ) -> Result<(Response<ProxyBody>, usize), ProxyError> {
        let H1Forward {
            conn,
            upstream,
            hash,
            timeouts,
            policy,
            host,
        } = self;
        // NB: the request path removed the client's hop-by-hop headers before the plugins ran.
        let has_body = !body.is_end_stream();
        let framing = framing(parts, body, has_body);
        let mut plain = Plain {
            limit: body_limit(parts, has_body),
            replayable: !has_body && parts.method.is_idempotent(),
            parts,
            body: has_body.then_some(body),
            head: Vec::with_capacity(512),
            framing,
            proxy: ProxyHeaders {
                client_ip: real_ip.unwrap_or(&conn.remote_ip).as_bytes(),
                proto: conn.scheme,
                host: host.map(HeaderValue::as_bytes),
            },
            conn,
            timeouts,
        };
        let (pooled, head) =
            attempt::run(&mut plain, upstream, hash, timeouts, policy, picked).await?;
        // The request's header map is not read after its response head came (no attempt
        // follows): its allocation takes the connection's next response head.
        let head_len = head.head_len;
        let spare = std::mem::take(&mut plain.parts.headers);
        let (parts, body) = response(pooled, head, spare, timeouts, conn);
        Ok((
            Response::from_parts(parts, ProxyBody::Upstream(body)),
            head_len,
        ))
    }
}

/// An HTTP/1.1 request to a plain `http` upstream, as each attempt sends it.
struct Plain<'a> {
    parts: &'a mut request::Parts,
    body: Option<&'a mut RequestBody>,
    /// The encoded head, rewritten for each endpoint (its Host may differ).
    head: Vec<u8>,
    framing: Framing,
    limit: Option<u64>,
    replayable: bool,
    proxy: ProxyHeaders<'a>,
    conn: &'a ConnInfo,
    timeouts: Timeouts,
}

impl Exchange for Plain<'_> {
    type Output = (PooledConn, ResponseHead);

    async fn attempt(
        &mut self,
        upstream: &Upstream,
        endpoint: &Endpoint,
        in_flight: InFlight,
        now: Option<Instant>,
    ) -> Result<Self::Output, Failure> {
        let (timeouts, conn) = (self.timeouts, self.conn);
        if let Some(h) = upstream.host_header(endpoint) {
            self.parts.headers.insert(header::HOST, h.clone());
        }
        self.head.clear();
        let parts = &*self.parts;
        let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        encode_request_head(
            &mut self.head,
            &parts.method,
            target,
            &parts.headers,
            self.framing,
            Some(self.proxy),
        );
        let mut req = Outgoing {
            head: &self.head,
            body: self.body.as_deref_mut(),
            limit: self.limit,
            chunked: self.framing == Framing::Chunked,
            method: &parts.method,
        };
        let mut pooled = endpoint.pool.checkout(timeouts.connect, now).await?;
        loop {
            match exchange(&mut pooled, &mut req, timeouts, conn).await {
                Ok(head) => {
                    pooled.hold(in_flight);
                    return Ok((pooled, head));
                }
                Err(e) if stale(&e, &pooled, self.replayable) => {
                    pooled = endpoint.pool.connect(timeouts.connect).await?;
                }
                Err(e) => return Err(failure(e, self.replayable)),
            }
        }
    }

    #[inline]
    fn status((_, head): &Self::Output) -> StatusCode {
        head.parts.status
    }

    #[inline]
    fn replayable(&self) -> bool {
        self.replayable
    }
}

/// A plugin's limit on a request body of unannounced length (client-control), when the
/// request has a body.
#[inline]
pub(crate) fn body_limit(parts: &request::Parts, has_body: bool) -> Option<u64> {
    if has_body {
        parts.extensions.get::<BodyLimit>().map(|l| l.0)
    } else {
        None
    }
}

/// A failed HTTP/1.1 exchange as the attempt loop sees it: a replayable request reset or
/// timed out before any response byte may go to another endpoint (nginx's
/// `proxy_next_upstream error timeout`), as may any request whose connection could not be
/// made.
#[inline]
pub(crate) fn failure(e: ProxyError, replayable: bool) -> Failure {
    let reset = matches!(&e, ProxyError::Upstream { source, .. } if source.is_stale_connection());
    let timed_out = matches!(&e, ProxyError::ReadTimeout(_));
    Failure {
        may_retry: Some(e.retryable() || (replayable && (reset || timed_out))),
        error: e,
    }
}

/// How the request body is delimited upstream: its exact length when known, else chunked;
/// an explicit `Content-Length: 0` is kept.
#[inline]
pub(crate) fn framing(parts: &request::Parts, body: &RequestBody, has_body: bool) -> Framing {
    if has_body {
        match body.size_hint().exact() {
            Some(n) => Framing::Length(n),
            None => Framing::Chunked,
        }
    } else if parts.headers.contains_key(header::CONTENT_LENGTH) {
        Framing::Length(0)
    } else {
        Framing::Empty
    }
}

/// A request as the connection sends it: its encoded head, then its body.
pub(crate) struct Outgoing<'a> {
    /// The request head, encoded.
    pub head: &'a [u8],
    /// The body, when the request has one.
    pub body: Option<&'a mut RequestBody>,
    /// A plugin's limit on a body of unannounced length.
    pub limit: Option<u64>,
    /// Whether the body is sent in chunked encoding.
    pub chunked: bool,
    /// The request's method (a `HEAD` response has no body).
    pub method: &'a Method,
}

/// Sends `req` on `pooled` and reads the response head. The body bytes that came with the
/// head are checked at once ([`sluice_io::h1::Conn::check_buffered_body`]), so that a
/// framing error is still a 502.
pub(crate) async fn exchange<S: Transport>(
    pooled: &mut PooledConn<S>,
    req: &mut Outgoing<'_>,
    timeouts: Timeouts,
    conn: &ConnInfo,
) -> Result<ResponseHead, ProxyError> {
    let timer = &conn.timer;
    let upstream_err = |source: H1Error, pooled: &PooledConn<S>| ProxyError::Upstream {
        addr: pooled.address().to_owned(),
        source,
    };
    if let Err(e) = pooled.conn.write_all(req.head).await {
        return Err(upstream_err(H1Error::Io(e), pooled));
    }
    if let Some(body) = req.body.as_deref_mut() {
        let (limit, chunked) = (req.limit, req.chunked);
        let mut sent: u64 = 0;
        loop {
            // NB: nginx's `client_body_timeout`: between two reads, not for the whole body.
            let Ok(next) = timer.timeout(conn.client_body_timeout, body.frame()).await else {
                return Err(ProxyError::ClientBodyTimeout);
            };
            let Some(frame) = next else { break };
            let frame = frame.map_err(ProxyError::RequestBody)?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if let Some(max) = limit {
                sent += data.len() as u64;
                if sent > max {
                    // NB: the upstream got a request cut short; the connection is dropped
                    // (closed), never pooled.
                    return Err(ProxyError::BodyTooLarge(max));
                }
            }
            match timer
                .timeout(timeouts.send, pooled.conn.write_body_chunk(&data, chunked))
                .await
            {
                Err(_) => return Err(ProxyError::SendTimeout(pooled.address().to_owned())),
                Ok(Err(e)) => return Err(upstream_err(H1Error::Io(e), pooled)),
                Ok(Ok(())) => {}
            }
        }
        if chunked && let Err(e) = pooled.conn.write_all(b"0\r\n\r\n").await {
            return Err(upstream_err(H1Error::Io(e), pooled));
        }
    }
    match timer
        .timeout(timeouts.read, pooled.conn.read_head(req.method))
        .await
    {
        Err(_) => Err(ProxyError::ReadTimeout(pooled.address().to_owned())),
        Ok(Err(source)) => Err(upstream_err(source, pooled)),
        Ok(Ok(resp)) => match pooled.conn.check_buffered_body(resp.framing) {
            Ok(()) => Ok(resp),
            Err(source) => Err(upstream_err(source, pooled)),
        },
    }
}

/// Whether a failed exchange may go again on a fresh connection to the same endpoint: a
/// replayable request (no body, idempotent) on a reused connection that the upstream had
/// closed (nothing of a response came).
#[inline]
pub(crate) fn stale<S>(e: &ProxyError, pooled: &PooledConn<S>, replayable: bool) -> bool {
    replayable
        && pooled.reused
        && matches!(e, ProxyError::Upstream { source, .. } if source.is_stale_connection())
}

/// The response to pass downstream: `head` with its hop-by-hop headers removed, the body
/// streaming from `pooled` (which goes back to its pool at the body's end), each pause
/// between two reads bounded by the read timeout. `spare` (the request's header map,
/// emptied) takes the connection's next response head.
#[inline]
pub(crate) fn response<S: Transport>(
    mut pooled: PooledConn<S>,
    head: ResponseHead,
    spare: HeaderMap,
    timeouts: Timeouts,
    conn: &ConnInfo,
) -> (response::Parts, UpstreamBody<S>) {
    pooled.conn.keep_for_next_head(spare);
    let mut parts = head.parts;
    parts.version = http::Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    let stall = ReadWatch::new(conn.timer.clone(), timeouts.read);
    let body = UpstreamBody::new(pooled, head.framing, head.keep_alive, Some(stall));
    (parts, body)
}
