//! Retry bookkeeping and passive-health reports shared by every protocol path
//! ([`crate::upstream::forward`] for HTTP/1.1, [`crate::upstream::failover`] for the
//! others), so that they retry and count failures by the same rules.

use std::time::Instant;

use http::StatusCode;

use crate::upstream::balancer::Tried;
use crate::upstream::error::ProxyError;
use crate::upstream::health::Outcome;
use crate::upstream::{Endpoint, Timeouts, Upstream};

/// Whether a failure of the connect phase (nothing of the request was sent) may be retried
/// on another endpoint: a TCP connect failure or timeout, or a failed TLS handshake.
fn connect_retryable(e: &ProxyError) -> bool {
    e.retryable() || matches!(e, ProxyError::UpstreamTls { .. })
}

/// Retry bookkeeping of one request: the endpoints tried, the budget (`retries`, default
/// endpoints - 1) and the deadline (connect + read timeout, counted from the first failure,
/// so that the clock is never read on the fast path).
pub(crate) struct Attempts {
    tried: Tried,
    budget: usize,
    deadline: Option<Instant>,
}

impl Attempts {
    /// No attempt yet on `upstream`.
    #[inline]
    pub(crate) fn new(upstream: &Upstream) -> Self {
        Attempts {
            tried: Tried::default(),
            budget: upstream.retry_budget(),
            deadline: None,
        }
    }

    /// The endpoints tried so far, for the balancer to skip.
    #[inline]
    pub(crate) fn tried(&self) -> &Tried {
        &self.tried
    }

    /// After endpoint `idx` failed with `e`: `None` to try another endpoint, or the error
    /// to answer with. `may_retry` overrides the default rule (a failure of the connect
    /// phase may be retried), e.g. for a replayable request on a reset connection.
    pub(crate) fn give_up(
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
pub(crate) fn succeeded(
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
pub(crate) fn failed(
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
