//! The one attempt loop of every request sent upstream, whatever its protocol (plain and
//! TLS HTTP/1.1, HTTP/2, gRPC, WebSocket upgrades): endpoint choice, retries to other
//! endpoints, the retry budget and deadline, and passive health. What one attempt is on
//! one endpoint is the protocol's ([`Exchange`]): [`crate::upstream::h1_client`],
//! [`crate::upstream::protocol`], [`crate::upstream::websocket`].
//!
//! The rules:
//!
//! - The upstream's balancer picks an endpoint, healthy and untried first.
//! - A failure of the connect phase (TCP connect, connect timeout, TLS handshake) is
//!   retried on another endpoint, as nothing of the request was sent; so is an HTTP/2
//!   request that a dying connection refused before taking it (hyper hands it back), and
//!   a replayable HTTP/1.1 request (no body, idempotent) reset before any response byte.
//!   Once a request was taken its body may be streaming: it is never sent elsewhere.
//! - At most `retries` times (default: endpoints - 1), and not after connect + read
//!   timeout counted from the first failure (so that the clock is never read on the fast
//!   path). When every endpoint is known down by the health checks the answer is 503.
//! - Every outcome feeds the upstream's passive health check: the response status (for an
//!   upgrade, the upstream's answer to it), connect failures and resets as TCP failures,
//!   timeouts as timeouts; and `ewma` its latency, to which a failed endpoint looks slow.
//!
//! NB: per-route timeouts and retry policies belong here.

use std::sync::Arc;
use std::time::Instant;

use http::StatusCode;

use crate::upstream::balancer::Tried;
use crate::upstream::error::ProxyError;
use crate::upstream::health::{InFlight, Outcome};
use crate::upstream::{Endpoint, Pool, Timeouts, Upstream};

/// The endpoint an attempt went to (the `node` of the log phase) and when it started (the
/// upstream's time); after a request, the last attempt's.
#[derive(Debug, Clone)]
pub struct Picked {
    /// The endpoint's pool; its address names the node.
    pub pool: Arc<Pool>,
    /// When the attempt started.
    pub started: Instant,
}

/// Why an attempt failed, and whether the request may go to another endpoint.
#[derive(Debug)]
pub(crate) struct Failure {
    /// What went wrong.
    pub error: ProxyError,
    /// `Some(false)`: the request was taken, never send it elsewhere; `Some(true)`: nothing
    /// of it was taken (or it may be replayed); `None`: whether the error is one of the
    /// connect phase decides.
    pub may_retry: Option<bool>,
}

impl From<ProxyError> for Failure {
    /// A failure before the request was sent, or of the connect phase.
    #[inline]
    fn from(error: ProxyError) -> Self {
        Failure {
            error,
            may_retry: None,
        }
    }
}

impl Failure {
    /// A failure after the upstream may have taken the request.
    #[inline]
    pub(crate) fn taken(error: ProxyError) -> Self {
        Failure {
            error,
            may_retry: Some(false),
        }
    }
}

/// One protocol's attempt on one endpoint.
pub(crate) trait Exchange {
    /// What a successful attempt gives (a response, up to its head).
    type Output;

    /// Sends the request to `endpoint`. `in_flight` counts it there: the output keeps it
    /// until the response ends, a failure drops it. `now`: when the attempt started, if the
    /// clock was read for it.
    async fn attempt(
        &mut self,
        upstream: &Upstream,
        endpoint: &Endpoint,
        in_flight: InFlight,
        now: Option<Instant>,
    ) -> Result<Self::Output, Failure>;

    /// The status of a successful attempt's response, for the passive health check.
    fn status(output: &Self::Output) -> StatusCode;
}

/// Sends a request to an endpoint of `upstream` with `exchange`, retrying by the rules
/// above. `hash`: the request's balancer hash. `picked`, when given, receives each attempt's
/// endpoint and start (when `None` the clock is not read for it).
pub(crate) async fn run<E: Exchange>(
    exchange: &mut E,
    upstream: &Upstream,
    hash: u64,
    timeouts: Timeouts,
    mut picked: Option<&mut Option<Picked>>,
) -> Result<E::Output, ProxyError> {
    let mut attempts = Attempts::new(upstream);
    loop {
        let idx = upstream
            .pick_index(hash, attempts.tried())
            .ok_or_else(|| ProxyError::NoEndpoint(upstream.id.clone()))?;
        let Some(endpoint) = upstream.endpoints.get(idx) else {
            return Err(ProxyError::NoEndpoint(upstream.id.clone()));
        };
        // NB: the attempt's start serves the pool's idle timeout check too.
        let attempt_started = picked.as_deref_mut().map(|slot| {
            let now = Instant::now();
            *slot = Some(Picked {
                pool: Arc::clone(&endpoint.pool),
                started: now,
            });
            now
        });
        // NB: only `ewma` needs the latency; the clock is not read otherwise.
        let started = upstream.measures_latency().then(Instant::now);
        let in_flight = endpoint.state.begin();
        match exchange
            .attempt(upstream, endpoint, in_flight, attempt_started)
            .await
        {
            Ok(out) => {
                succeeded(upstream, endpoint, E::status(&out), started);
                return Ok(out);
            }
            Err(Failure { error, may_retry }) => {
                failed(upstream, endpoint, &error, started, timeouts);
                if let Some(e) = attempts.give_up(upstream, idx, error, timeouts, may_retry) {
                    return Err(e);
                }
            }
        }
    }
}

/// Whether a failure of the connect phase (nothing of the request was sent) may be retried
/// on another endpoint: a TCP connect failure or timeout, or a failed TLS handshake.
fn connect_retryable(e: &ProxyError) -> bool {
    e.retryable() || matches!(e, ProxyError::UpstreamTls { .. })
}

/// Retry bookkeeping of one request: the endpoints tried, the budget (`retries`, default
/// endpoints - 1) and the deadline (connect + read timeout, counted from the first failure,
/// so that the clock is never read on the fast path).
struct Attempts {
    tried: Tried,
    budget: usize,
    deadline: Option<Instant>,
}

impl Attempts {
    /// No attempt yet on `upstream`.
    #[inline]
    fn new(upstream: &Upstream) -> Self {
        Attempts {
            tried: Tried::default(),
            budget: upstream.retry_budget(),
            deadline: None,
        }
    }

    /// The endpoints tried so far, for the balancer to skip.
    #[inline]
    fn tried(&self) -> &Tried {
        &self.tried
    }

    /// After endpoint `idx` failed with `e`: `None` to try another endpoint, or the error
    /// to answer with. `may_retry` overrides the default rule (a failure of the connect
    /// phase may be retried), e.g. for a replayable request on a reset connection.
    fn give_up(
        &mut self,
        upstream: &Upstream,
        idx: usize,
        e: ProxyError,
        timeouts: Timeouts,
        may_retry: Option<bool>,
    ) -> Option<ProxyError> {
        let now = Instant::now();
        let until = *self
            .deadline
            .get_or_insert(now + timeouts.connect + timeouts.read);
        let connect_phase = connect_retryable(&e);
        if !may_retry.unwrap_or(connect_phase) || self.tried.len() >= self.budget || now >= until {
            // Known down by the health checks, every one: 503 rather than the 502 of a
            // single failed connection (as nginx/APISIX answer).
            if connect_phase && upstream.all_unhealthy() {
                return Some(ProxyError::AllEndpointsDown(upstream.id.clone()));
            }
            return Some(e);
        }
        tracing::debug!(upstream = %upstream.id, error = %e, "retrying on another endpoint");
        self.tried.push(idx);
        upstream.count_retry();
        None
    }
}

/// Reports a response from `endpoint` to the passive check (and to `ewma`).
#[inline]
fn succeeded(
    upstream: &Upstream,
    endpoint: &Endpoint,
    status: StatusCode,
    started: Option<Instant>,
) {
    upstream.report(endpoint, Outcome::Status(status.as_u16()));
    endpoint.state.connected();
    if let Some(t) = started {
        endpoint.state.observe_latency(t.elapsed());
    }
}

/// Reports a failed exchange with `endpoint` to the passive check (and to `ewma`, to which
/// a failed endpoint looks slow).
fn failed(
    upstream: &Upstream,
    endpoint: &Endpoint,
    e: &ProxyError,
    started: Option<Instant>,
    timeouts: Timeouts,
) {
    if e.retryable() {
        // NB: a connect that failed (nothing was sent): ejected at once, checks or not.
        endpoint.state.connect_failed();
    }
    if let Some(outcome) = e.health_outcome() {
        upstream.report(endpoint, outcome);
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
        assert_eq!(refused.health_outcome(), Some(Outcome::TcpFailure));
        let timeout = ProxyError::ConnectTimeout("a:1".into());
        assert!(connect_retryable(&timeout));
        assert_eq!(timeout.health_outcome(), Some(Outcome::Timeout));
        let read = ProxyError::ReadTimeout("a:1".into());
        assert!(!connect_retryable(&read));
    }
}
