//! The plain HTTP/1.1 path to an upstream: endpoint choice, retries to other endpoints and
//! passive health, over the in-task client of [`crate::upstream::h1`] and the pools of
//! [`crate::upstream::Pool`]. The other protocols (HTTP/2, gRPC, TLS, WebSocket) take
//! [`crate::upstream::failover`], with the same rules.
//!
//! - A request without a body can be sent again if a reused connection turns out to have
//!   been closed by the upstream, or to another endpoint after a reset before any response
//!   byte; others check the idle connection before using it.
//! - A connect failure or timeout is retried on another endpoint whatever the request, as
//!   nothing of it was sent: at most `retries` times, and not after connect + read timeout
//!   counted from the first failure ([`crate::upstream::retry`], shared with failover).
//! - Every outcome feeds the upstream's passive health check.

use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Response, request};
use http_body::Body as _;

use crate::http::ConnInfo;
use crate::http::headers::ProxyHeaders;
use crate::upstream::body::{BodyLimit, ProxyBody};
use crate::upstream::error::ProxyError;
use crate::upstream::failover::Picked;
use crate::upstream::h1_client::{self, Outgoing, exchange, framing, stale};
use crate::upstream::request_body::RequestBody;
use crate::upstream::retry::{Attempts, failed, succeeded};
use crate::upstream::{Endpoint, PooledConn, Timeouts, Upstream};
use sluice_io::h1::{Framing, ResponseHead, encode_request_head};

/// Where an HTTP/1.1 request goes, and what is sent with it.
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
        mut picked: Option<&mut Option<Picked>>,
    ) -> Result<(Response<ProxyBody>, usize), ProxyError> {
        let H1Forward {
            conn,
            upstream,
            hash,
            timeouts,
            host,
        } = self;
        // NB: the request path removed the client's hop-by-hop headers before the plugins ran.
        let has_body = !body.is_end_stream();
        let framing = framing(parts, body, has_body);
        // A plugin's limit on a body of unannounced length (client-control).
        let limit = if has_body {
            parts.extensions.get::<BodyLimit>().map(|l| l.0)
        } else {
            None
        };
        let target = parts
            .uri
            .path_and_query()
            .map(|pq| pq.as_str())
            .unwrap_or("/");
        let mut head = Vec::with_capacity(512);
        let proxy_headers = ProxyHeaders {
            client_ip: real_ip.unwrap_or(&conn.remote_ip).as_bytes(),
            proto: conn.scheme,
            host: host.map(HeaderValue::as_bytes),
        };
        // A request without a body can be sent again if a reused connection turns out to have
        // been closed by the upstream, or to another endpoint after a reset before any response
        // byte; others check the idle connection before using it.
        let replayable = !has_body && parts.method.is_idempotent();
        let mut attempts = Attempts::new(upstream);
        let (pooled, response) = loop {
            let idx = upstream
                .pick_index(hash, attempts.tried())
                .ok_or_else(|| ProxyError::NoEndpoint(upstream.id.clone()))?;
            let Some(endpoint) = upstream.endpoints.get(idx) else {
                return Err(ProxyError::NoEndpoint(upstream.id.clone()));
            };
            // NB: the attempt's start serves the pool's idle timeout check too.
            let attempt_started = picked.as_deref_mut().map(|slot| {
                let now = std::time::Instant::now();
                *slot = Some(Picked {
                    pool: Arc::clone(&endpoint.pool),
                    started: now,
                });
                now
            });
            if let Some(h) = upstream.host_header(endpoint) {
                parts.headers.insert(header::HOST, h.clone());
            }
            head.clear();
            let (method, headers) = (&parts.method, &parts.headers);
            encode_request_head(
                &mut head,
                method,
                target,
                headers,
                framing,
                Some(proxy_headers),
            );
            // NB: only `ewma` needs the latency; the clock is not read otherwise.
            let started = upstream.measures_latency().then(std::time::Instant::now);
            let in_flight = endpoint.state.begin();
            let mut req = Outgoing {
                head: &head,
                body: has_body.then_some(&mut *body),
                limit,
                chunked: framing == Framing::Chunked,
                method: &parts.method,
            };
            let sent = attempt(
                endpoint,
                &mut req,
                timeouts,
                replayable,
                conn,
                attempt_started,
            )
            .await;
            match sent {
                Ok((mut pooled, resp)) => {
                    succeeded(upstream, endpoint, resp.parts.status, started);
                    pooled.hold(in_flight);
                    break (pooled, resp);
                }
                Err(e) => {
                    drop(in_flight);
                    failed(upstream, endpoint, &e, started, timeouts);
                    let reset = matches!(&e, ProxyError::Upstream { source, .. } if source.is_stale_connection());
                    let may_retry = e.retryable() || (replayable && reset);
                    if let Some(e) = attempts.give_up(upstream, idx, e, timeouts, Some(may_retry)) {
                        return Err(e);
                    }
                }
            }
        };
        // The request's header map is not read after its response head came (no attempt
        // follows): its allocation takes the connection's next response head.
        let head_len = response.head_len;
        let spare = std::mem::take(&mut parts.headers);
        let (parts, body) = h1_client::response(pooled, response, spare, timeouts, conn);
        let resp = Response::from_parts(parts, ProxyBody::Upstream(body));
        Ok((resp, head_len))
    }
}

/// One attempt on `endpoint`: a pooled connection (a fresh one if a reused connection of a
/// replayable request turns out stale), the request, and the response head.
async fn attempt(
    endpoint: &Endpoint,
    req: &mut Outgoing<'_>,
    timeouts: Timeouts,
    replayable: bool,
    conn: &ConnInfo,
    now: Option<std::time::Instant>,
) -> Result<(PooledConn, ResponseHead), ProxyError> {
    let mut pooled = endpoint.pool.checkout(timeouts.connect, now).await?;
    loop {
        match exchange(&mut pooled, req, timeouts, conn).await {
            Ok(resp) => return Ok((pooled, resp)),
            Err(e) if stale(&e, &pooled, replayable) => {
                pooled = endpoint.pool.connect(timeouts.connect).await?;
            }
            Err(e) => return Err(e),
        }
    }
}
