//! Endpoint choice, retries and passive health for the requests that do not take the plain
//! HTTP/1.1 path of [`crate::request`]: HTTP/2, gRPC and TLS upstreams ([`crate::upstream::h2`]) and
//! WebSocket upgrades ([`crate::upstream::websocket`]).
//!
//! The rules are those of the HTTP/1.1 path. The upstream's balancer picks an endpoint
//! (healthy and untried first). A failure of the connect phase (TCP connect, connect
//! timeout, TLS handshake) is retried on another endpoint, as nothing of the request was
//! sent: at most `retries` times (default: endpoints - 1), and not after connect + read
//! timeout counted from the first failure. An HTTP/2 request that a dying connection
//! refused before taking it (hyper hands it back) counts as a connect failure too. Once a
//! request has been taken by a connection its body may be streaming, so it is never sent
//! elsewhere. Every outcome feeds the
//! upstream's passive health check: the response status (for an upgrade, the upstream's
//! answer to it), connect failures as TCP failures, timeouts as timeouts.

use std::sync::Arc;
use std::time::Instant;

use http::HeaderValue;
use http::{Request, Response};

use crate::http::ConnInfo;
use crate::upstream::body::ProxyBody;
use crate::upstream::error::ProxyError;
use crate::upstream::h2::Connected;
use crate::upstream::request_body::RequestBody;
use crate::upstream::retry::{Attempts, failed, succeeded};
use crate::upstream::{Pool, Timeouts, Upstream};

/// Proxies `req` to `upstream` (an upgrade when `upgrade`, else over its non-HTTP/1.1
/// protocol); `host` is the client's Host, `hash` the request's balancer hash.
pub async fn proxy(
    req: Request<RequestBody>,
    host: Option<HeaderValue>,
    conn: &ConnInfo,
    upstream: &Upstream,
    hash: u64,
    timeouts: Timeouts,
    upgrade: bool,
) -> Result<Response<ProxyBody>, ProxyError> {
    let Some(protocol) = upstream.protocol.as_deref().filter(|_| !upgrade) else {
        return upgrade_to(req, host, conn, upstream, hash, timeouts).await;
    };
    let mut attempts = Attempts::new(upstream);
    let mut prepared = crate::upstream::h2::prepare(req, conn, host.as_ref());
    loop {
        let idx = upstream
            .pick_index(hash, attempts.tried())
            .ok_or_else(|| ProxyError::NoEndpoint(upstream.id.clone()))?;
        let Some(endpoint) = upstream.endpoints.get(idx) else {
            return Err(ProxyError::NoEndpoint(upstream.id.clone()));
        };
        let attempt_started = Instant::now();
        let started = upstream.measures_latency().then_some(attempt_started);
        let in_flight = endpoint.state.begin();
        let address = endpoint.address.as_str();
        let error = match crate::upstream::h2::connect(conn, protocol, address, timeouts).await {
            Err(e) => {
                drop(in_flight);
                e
            }
            Ok(Connected::H1(pooled)) => {
                // HTTP/1.1 over TLS, with the client of the plain path.
                let endpoint_host = upstream.host_header(endpoint).cloned().or(host.clone());
                let sent = crate::upstream::h2::send_h1(
                    prepared,
                    endpoint_host,
                    conn,
                    protocol,
                    address,
                    pooled,
                    timeouts,
                    in_flight,
                )
                .await;
                match sent {
                    Ok(mut resp) => {
                        succeeded(upstream, endpoint, resp.status(), started);
                        resp.extensions_mut().insert(Picked {
                            pool: Arc::clone(&endpoint.pool),
                            started: attempt_started,
                        });
                        return Ok(resp);
                    }
                    Err(e) => {
                        failed(upstream, endpoint, &e, started, timeouts);
                        return Err(e);
                    }
                }
            }
            Ok(Connected::H2(connected)) => {
                let endpoint_host = upstream.host_header(endpoint).cloned().or(host.clone());
                let sent = crate::upstream::h2::send(
                    prepared,
                    endpoint_host,
                    conn,
                    protocol,
                    address,
                    connected,
                    timeouts,
                    in_flight,
                )
                .await;
                match sent {
                    Ok(mut resp) => {
                        succeeded(upstream, endpoint, resp.status(), started);
                        resp.extensions_mut().insert(Picked {
                            pool: Arc::clone(&endpoint.pool),
                            started: attempt_started,
                        });
                        return Ok(resp);
                    }
                    Err(crate::upstream::h2::SendError::Failed(e)) => {
                        failed(upstream, endpoint, &e, started, timeouts);
                        return Err(e);
                    }
                    Err(crate::upstream::h2::SendError::Unsent(p, e)) => {
                        prepared = *p;
                        e
                    }
                }
            }
        };
        failed(upstream, endpoint, &error, started, timeouts);
        if let Some(e) = attempts.give_up(upstream, idx, error, timeouts, None) {
            return Err(e);
        }
    }
}

/// Carried by a response from [`proxy`]: the endpoint that answered (the `node` of the log
/// phase) and when the attempt that reached it started (the upstream's time).
#[derive(Debug, Clone)]
pub struct Picked {
    /// The endpoint's pool; its address names the node.
    pub pool: Arc<Pool>,
    /// When the successful attempt started.
    pub started: Instant,
}

/// Proxies the upgrade request `req` to an endpoint of `upstream`.
async fn upgrade_to(
    req: Request<RequestBody>,
    host: Option<HeaderValue>,
    conn: &ConnInfo,
    upstream: &Upstream,
    hash: u64,
    timeouts: Timeouts,
) -> Result<Response<ProxyBody>, ProxyError> {
    let tls = upstream.protocol.as_deref().and_then(|p| p.tls.as_deref());
    let mut attempts = Attempts::new(upstream);
    loop {
        let idx = upstream
            .pick_index(hash, attempts.tried())
            .ok_or_else(|| ProxyError::NoEndpoint(upstream.id.clone()))?;
        let Some(endpoint) = upstream.endpoints.get(idx) else {
            return Err(ProxyError::NoEndpoint(upstream.id.clone()));
        };
        let attempt_started = Instant::now();
        let started = upstream.measures_latency().then_some(attempt_started);
        let in_flight = endpoint.state.begin();
        let address = endpoint.address.as_str();
        match crate::upstream::websocket::connect(conn, tls, address, timeouts).await {
            Ok(io) => {
                let mut result = crate::upstream::websocket::proxy(
                    req,
                    host,
                    upstream.host_header(endpoint).cloned(),
                    conn,
                    io,
                    address,
                    timeouts,
                    in_flight,
                )
                .await;
                match &mut result {
                    Ok(resp) => {
                        succeeded(upstream, endpoint, resp.status(), started);
                        resp.extensions_mut().insert(Picked {
                            pool: Arc::clone(&endpoint.pool),
                            started: attempt_started,
                        });
                    }
                    Err(e) => failed(upstream, endpoint, e, started, timeouts),
                }
                return result;
            }
            Err(e) => {
                drop(in_flight);
                failed(upstream, endpoint, &e, started, timeouts);
                if let Some(e) = attempts.give_up(upstream, idx, e, timeouts, None) {
                    return Err(e);
                }
            }
        }
    }
}
