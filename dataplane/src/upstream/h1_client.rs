//! The HTTP/1.1 client of every upstream that speaks it, plain or over TLS: one request on
//! one pooled connection ([`crate::upstream::Pool`], the `sluice_io::h1` codec), up to the
//! response head, and the response whose body then streams from that connection.
//!
//! Generic over the connection's stream ([`Transport`]): plain TCP compiles to its own code,
//! with no branch on the kind of stream; HTTPS upstreams whose ALPN settles on HTTP/1.1 (or
//! none) take the same code over rustls, with the same framing rules and the same
//! connection-reuse guard.

use http::header::{self, HeaderMap};
use http::{Method, request, response};
use http_body::Body as _;
use http_body_util::BodyExt as _;

use crate::http::ConnInfo;
use crate::http::headers::strip_hop_by_hop;
use crate::upstream::body::{ReadWatch, UpstreamBody};
use crate::upstream::error::ProxyError;
use crate::upstream::request_body::RequestBody;
use crate::upstream::{PooledConn, Timeouts};
use sluice_io::h1::{Framing, H1Error, ResponseHead, Transport};

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
