//! Endpoint choice, retries and passive health for the requests that do not take the plain
//! HTTP/1.1 path of [`crate::proxy`]: HTTP/2, gRPC and TLS upstreams ([`crate::h2up`]) and
//! WebSocket upgrades ([`crate::websocket`]).
//!
//! The rules are those of the HTTP/1.1 path. The upstream's balancer picks an endpoint
//! (healthy and untried first). A failure of the connect phase (TCP connect, connect
//! timeout, TLS handshake) is retried on another endpoint, as nothing of the request was
//! sent: at most `retries` times (default: endpoints - 1), and not after connect + read
//! timeout counted from the first failure. Once a request has been handed to a connection
//! its body may be streaming, so it is never sent elsewhere. Every outcome feeds the
//! upstream's passive health check: the response status (for an upgrade, the upstream's
//! answer to it), connect failures as TCP failures, timeouts as timeouts.

use std::time::Instant;

use http::HeaderValue;
use http::{Request, Response};
use hyper::body::Incoming;

use crate::balancer::Tried;
use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::health::Outcome;
use crate::proxy::ConnInfo;
use crate::upstream::{Endpoint, Timeouts, Upstream};

/// A connection made in the connect phase, by protocol.
enum Connected {
    /// HTTP/2 or TLS upstream.
    Hyper(crate::h2up::Connected),
    /// WebSocket upgrade.
    Upgrade(crate::websocket::UpstreamIo),
}

/// What a failed exchange says about the endpoint's health (`None`: not its fault).
fn failure_outcome(e: &ProxyError) -> Option<Outcome> {
    match e {
        ProxyError::Connect { .. } | ProxyError::Upstream { .. } => Some(Outcome::TcpFailure),
        // NB: a failed handshake counts as a TCP failure, as in lua-resty-healthcheck.
        ProxyError::UpstreamTls { .. } => Some(Outcome::TcpFailure),
        ProxyError::ConnectTimeout(_) | ProxyError::ReadTimeout(_) | ProxyError::SendTimeout(_) => {
            Some(Outcome::Timeout)
        }
        _ => None,
    }
}

/// Whether a failure of the connect phase may be retried on another endpoint.
fn connect_retryable(e: &ProxyError) -> bool {
    e.retryable() || matches!(e, ProxyError::UpstreamTls { .. })
}

/// Proxies `req` to `upstream` (an upgrade when `upgrade`, else over its non-HTTP/1.1
/// protocol); `host` is the client's Host, `hash` the request's balancer hash.
pub async fn proxy(
    req: Request<Incoming>,
    host: Option<HeaderValue>,
    conn: &ConnInfo,
    upstream: &Upstream,
    hash: u64,
    timeouts: Timeouts,
    upgrade: bool,
) -> Result<Response<ProxyBody>, ProxyError> {
    let protocol = upstream.protocol.as_deref();
    let mut tried = Tried::default();
    let budget = upstream.retry_budget();
    let mut deadline: Option<Instant> = None;
    let (endpoint, connected, in_flight, started) = loop {
        let idx = upstream
            .pick_index(hash, &tried)
            .ok_or_else(|| ProxyError::NoEndpoint(upstream.id.clone()))?;
        let Some(endpoint) = upstream.endpoints.get(idx) else {
            return Err(ProxyError::NoEndpoint(upstream.id.clone()));
        };
        let started = upstream.measures_latency().then(Instant::now);
        let in_flight = endpoint.state.begin();
        let address = endpoint.address.as_str();
        let made = if upgrade {
            let tls = protocol.and_then(|p| p.tls.as_deref());
            crate::websocket::connect(conn, tls, address, timeouts)
                .await
                .map(Connected::Upgrade)
        } else if let Some(protocol) = protocol {
            crate::h2up::connect(conn, protocol, address, timeouts)
                .await
                .map(Connected::Hyper)
        } else {
            return Err(ProxyError::NoEndpoint(upstream.id.clone()));
        };
        match made {
            Ok(c) => break (endpoint, c, in_flight, started),
            Err(e) => {
                drop(in_flight);
                failed(upstream, endpoint, &e, started, timeouts);
                let now = Instant::now();
                let until = *deadline.get_or_insert(now + timeouts.connect + timeouts.read);
                if !connect_retryable(&e) || tried.len() >= budget || now >= until {
                    // Known down by the health checks, every one: 503, as on the HTTP/1.1
                    // path.
                    if connect_retryable(&e) && upstream.all_unhealthy() {
                        return Err(ProxyError::AllEndpointsDown(upstream.id.clone()));
                    }
                    return Err(e);
                }
                tracing::debug!(upstream = %upstream.id, error = %e, "retrying on another endpoint");
                tried.push(idx);
                upstream.count_retry();
            }
        }
    };
    let host = upstream.host_header(endpoint).cloned().or(host);
    let address = endpoint.address.as_str();
    let result = match (connected, protocol) {
        (Connected::Upgrade(io), _) => {
            crate::websocket::proxy(req, host, conn, io, address, timeouts).await
        }
        (Connected::Hyper(c), Some(protocol)) => {
            crate::h2up::send(req, host, conn, protocol, address, c, timeouts).await
        }
        (Connected::Hyper(_), None) => Err(ProxyError::NoEndpoint(upstream.id.clone())),
    };
    drop(in_flight);
    match &result {
        Ok(resp) => {
            upstream.report(endpoint, Outcome::Status(resp.status().as_u16()));
            if let Some(t) = started {
                endpoint.state.observe_latency(t.elapsed());
            }
        }
        Err(e) => failed(upstream, endpoint, e, started, timeouts),
    }
    result
}

/// Reports a failed exchange with `endpoint` to the passive check (and to `ewma`).
fn failed(
    upstream: &Upstream,
    endpoint: &Endpoint,
    e: &ProxyError,
    started: Option<Instant>,
    timeouts: Timeouts,
) {
    if let Some(outcome) = failure_outcome(e) {
        upstream.report(endpoint, outcome);
        // A failed endpoint looks slow to `ewma`.
        if let Some(t) = started {
            endpoint
                .state
                .observe_latency(t.elapsed().max(timeouts.connect));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn connect_phase_failures_are_retryable_and_count_against_health() {
        let refused = ProxyError::Connect {
            addr: "a:1".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert!(connect_retryable(&refused));
        assert_eq!(failure_outcome(&refused), Some(Outcome::TcpFailure));
        let timeout = ProxyError::ConnectTimeout("a:1".into());
        assert!(connect_retryable(&timeout));
        assert_eq!(failure_outcome(&timeout), Some(Outcome::Timeout));
        let read = ProxyError::ReadTimeout("a:1".into());
        assert!(!connect_retryable(&read));
    }
}
