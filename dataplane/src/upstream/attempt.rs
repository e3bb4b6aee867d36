//! The one attempt loop of every request sent upstream, whatever its protocol (plain and
//! TLS HTTP/1.1, HTTP/2, gRPC, WebSocket upgrades): endpoint choice, retries, the retry
//! budget and deadlines, and passive health. What one attempt is on one endpoint is the
//! protocol's ([`Exchange`]): [`crate::upstream::h1_client`], [`crate::upstream::protocol`],
//! [`crate::upstream::websocket`].
//!
//! The rules:
//!
//! - The upstream's balancer picks an endpoint, healthy and untried first.
//! - A failure of the connect phase (TCP connect, connect timeout, TLS handshake) is
//!   retried on another endpoint, as nothing of the request was sent; so is an HTTP/2
//!   request that a dying connection refused before taking it (hyper hands it back), and
//!   a replayable HTTP/1.1 request (no body, idempotent) reset or timed out before any
//!   response byte (nginx's `proxy_next_upstream error timeout`). Once a request with a body
//!   was taken its body may be streaming: it is never sent again.
//! - At most `retries` times (default: endpoints - 1), and not after connect + read
//!   timeout counted from the first failure (so that the clock is never read on the fast
//!   path), or, with the upstream's `retry_timeout` (APISIX), not later than that after the
//!   first attempt. When every endpoint is known down by the health checks the answer is 503.
//! - A route's [`AttemptPolicy`] (HTTPRoute `timeouts` and `retry`) adds: a whole-request
//!   deadline over every attempt and backoff (504 on expiry), a deadline per attempt (the
//!   attempt is cancelled and its connection closed, never reused; it counts as a timeout),
//!   and a retry policy: its own number of retries (to untried endpoints first, then the same
//!   ones again), retries on listed status codes (the response is dropped unread, its
//!   connection closed), and a backoff between retries. Replayable requests only: a
//!   request whose body was sent, or whose method is not idempotent, is never sent again.
//! - Every outcome feeds the upstream's passive health check: the response status (for an
//!   upgrade, the upstream's answer to it), connect failures and resets as TCP failures,
//!   timeouts as timeouts; and `ewma` its latency, to which a failed endpoint looks slow.
//!   Every retry is counted in `sluice_upstream_retries_total{upstream, reason}`.

use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// Status codes a retry policy lists (400-599), as a bit set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatusCodes([u64; 4]);

impl StatusCodes {
    /// The set of `codes`; `None` when one is outside 400-599.
    pub fn new(codes: impl IntoIterator<Item = u32>) -> Option<Self> {
        let mut set = StatusCodes::default();
        for c in codes {
            if !(400..=599).contains(&c) {
                return None;
            }
            let i = (c - 400) as usize;
            set.0[i / 64] |= 1 << (i % 64);
        }
        Some(set)
    }

    /// Whether `status` is in the set.
    #[inline]
    pub fn contains(&self, status: StatusCode) -> bool {
        let c = status.as_u16();
        if !(400..=599).contains(&c) {
            return false;
        }
        let i = usize::from(c - 400);
        self.0[i / 64] & (1 << (i % 64)) != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }
}

/// A route's retry policy (HTTPRoute `rules[].retry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Most retries after the first attempt; `None` = the upstream's budget, at least 1.
    pub attempts: Option<u32>,
    /// Statuses whose response is dropped and the request sent again.
    pub codes: StatusCodes,
    /// Least wait before the first retry; doubled for each further one, up to 8 times.
    pub backoff: Duration,
}

impl RetryPolicy {
    /// The wait before retry number `n` (1 for the first).
    fn backoff(&self, n: usize) -> Duration {
        let doublings = n.saturating_sub(1).min(3) as u32;
        self.backoff.saturating_mul(1 << doublings)
    }
}

/// What a route adds to the attempt loop (HTTPRoute `timeouts` and `retry`). A route
/// without any has none, and the loop reads no clock for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttemptPolicy {
    /// Whole-request deadline, every attempt and backoff included.
    pub request: Option<Duration>,
    /// Deadline of each attempt, up to its response head.
    pub attempt: Option<Duration>,
    /// The retry policy.
    pub retry: Option<RetryPolicy>,
}

impl AttemptPolicy {
    /// `None` when nothing is set.
    pub fn or_none(self) -> Option<Self> {
        (self != AttemptPolicy::default()).then_some(self)
    }
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

    /// Whether the request can be sent again after an attempt that sent it (no body, an
    /// idempotent method, and the exchange keeps what it needs to send it again): after a
    /// cancelled attempt, or a response whose status the retry policy lists.
    fn replayable(&self) -> bool {
        false
    }
}

/// Sends a request to an endpoint of `upstream` with `exchange`, retrying by the rules
/// above. `hash`: the request's balancer hash. `policy`: the route's deadlines and retry
/// policy. `picked`, when given, receives each attempt's endpoint and start (when `None` the
/// clock is not read for it).
pub(crate) async fn run<E: Exchange>(
    exchange: &mut E,
    upstream: &Upstream,
    hash: u64,
    timeouts: Timeouts,
    policy: Option<&AttemptPolicy>,
    mut picked: Option<&mut Option<Picked>>,
) -> Result<E::Output, ProxyError> {
    let mut attempts = Attempts::new(upstream, policy);
    loop {
        let idx = attempts
            .pick(upstream, hash)
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
        let attempt = exchange.attempt(upstream, endpoint, in_flight, attempt_started);
        let result = match attempts.attempt_deadline() {
            None => attempt.await,
            // NB: boxed, so that a route without deadlines keeps the request's future as small
            // as before (a timer is ~200 bytes; `a_requests_future_is_small`).
            Some((until, whole)) => {
                match Box::pin(tokio::time::timeout_at(until.into(), attempt)).await {
                    Ok(r) => r,
                    // NB: the attempt's future is dropped: its connection is closed, never
                    // pooled again, and its in-flight count ends.
                    Err(_) if whole => Err(Failure::taken(ProxyError::RequestTimeout(
                        upstream.id.clone(),
                    ))),
                    Err(_) => Err(Failure {
                        error: ProxyError::AttemptTimeout(endpoint.address.clone()),
                        may_retry: Some(exchange.replayable()),
                    }),
                }
            }
        };
        match result {
            Ok(out) => {
                let status = E::status(&out);
                succeeded(upstream, endpoint, status, started);
                if !attempts.retry_status(upstream, idx, status, exchange.replayable()) {
                    return Ok(out);
                }
                // NB: the response is dropped unread: its connection is closed.
                drop(out);
            }
            Err(Failure { error, may_retry }) => {
                failed(upstream, endpoint, &error, started, timeouts);
                if let Some(e) = attempts.give_up(upstream, idx, error, timeouts, may_retry) {
                    return Err(e);
                }
            }
        }
        attempts.backoff(upstream).await?;
    }
}

/// Whether a failure of the connect phase (nothing of the request was sent) may be retried
/// on another endpoint: a TCP connect failure or timeout, or a failed TLS handshake.
fn connect_retryable(e: &ProxyError) -> bool {
    e.retryable() || matches!(e, ProxyError::UpstreamTls { .. })
}

/// The `reason` label of a retry after `e`.
fn retry_reason(e: &ProxyError) -> &'static str {
    match e {
        e if connect_retryable(e) => "connect",
        ProxyError::AttemptTimeout(_) | ProxyError::ReadTimeout(_) | ProxyError::SendTimeout(_) => {
            "timeout"
        }
        _ => "connection_error",
    }
}

/// Retry bookkeeping of one request: the endpoints tried, the budget (`retries`, default
/// endpoints - 1, or the route's retry policy), the retry deadline (connect + read timeout
/// counted from the first failure, so that the clock is never read on the fast path, or the
/// upstream's `retry_timeout`) and the route's deadlines.
struct Attempts<'p> {
    tried: Tried,
    /// Retries made so far.
    retries: usize,
    budget: usize,
    deadline: Option<Instant>,
    policy: Option<&'p AttemptPolicy>,
    /// The route's whole-request deadline.
    request_deadline: Option<Instant>,
}

impl<'p> Attempts<'p> {
    /// No attempt yet on `upstream`.
    #[inline]
    fn new(upstream: &Upstream, policy: Option<&'p AttemptPolicy>) -> Self {
        let retry = policy.and_then(|p| p.retry.as_ref());
        let budget = match retry {
            None => upstream.retry_budget(),
            Some(r) => match r.attempts {
                Some(n) => n as usize,
                None => upstream.retry_budget().max(1),
            },
        };
        // NB: the clock is read up front only when a deadline counts from the start.
        let now = (upstream.retry_timeout.is_some() || policy.is_some_and(|p| p.request.is_some()))
            .then(Instant::now);
        Attempts {
            tried: Tried::default(),
            retries: 0,
            budget,
            deadline: now.zip(upstream.retry_timeout).map(|(n, t)| n + t),
            policy,
            request_deadline: now.zip(policy.and_then(|p| p.request)).map(|(n, t)| n + t),
        }
    }

    /// The endpoint for the next attempt: an untried one, or, when the route's retry policy
    /// allows more retries than there are endpoints, the round starts again.
    fn pick(&mut self, upstream: &Upstream, hash: u64) -> Option<usize> {
        if let Some(i) = upstream.pick_index(hash, &self.tried) {
            return Some(i);
        }
        let again = self.policy.is_some_and(|p| p.retry.is_some()) && !self.tried.is_empty();
        if !again {
            return None;
        }
        self.tried = Tried::default();
        upstream.pick_index(hash, &self.tried)
    }

    /// When the next attempt must have its response head by, and whether that is the
    /// whole request's deadline (`true`) or the attempt's own.
    fn attempt_deadline(&self) -> Option<(Instant, bool)> {
        let own = self
            .policy
            .and_then(|p| p.attempt)
            .map(|t| Instant::now() + t);
        match (own, self.request_deadline) {
            (Some(a), Some(r)) if r <= a => Some((r, true)),
            (Some(a), _) => Some((a, false)),
            (None, Some(r)) => Some((r, true)),
            (None, None) => None,
        }
    }

    /// After endpoint `idx` answered `status`: whether to drop the answer and retry (the
    /// route's retry policy lists the status, the request can be sent again, and budget and
    /// deadline allow).
    fn retry_status(
        &mut self,
        upstream: &Upstream,
        idx: usize,
        status: StatusCode,
        replayable: bool,
    ) -> bool {
        let Some(retry) = self.policy.and_then(|p| p.retry.as_ref()) else {
            return false;
        };
        if !replayable || !retry.codes.contains(status) || self.retries >= self.budget {
            return false;
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        tracing::debug!(upstream = %upstream.id, %status, "retrying after a retriable status");
        self.retried(upstream, idx, "status");
        true
    }

    /// After endpoint `idx` failed with `e`: `None` to try again, or the error to answer
    /// with. `may_retry` overrides the default rule (a failure of the connect phase may be
    /// retried), e.g. for a replayable request on a reset connection.
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
        if !may_retry.unwrap_or(connect_phase) || self.retries >= self.budget || now >= until {
            // Known down by the health checks, every one: 503 rather than the 502 of a
            // single failed connection (as nginx/APISIX answer).
            if connect_phase && upstream.all_unhealthy() {
                return Some(ProxyError::AllEndpointsDown(upstream.id.clone()));
            }
            return Some(e);
        }
        tracing::debug!(upstream = %upstream.id, error = %e, "retrying");
        self.retried(upstream, idx, retry_reason(&e));
        None
    }

    fn retried(&mut self, upstream: &Upstream, idx: usize, reason: &str) {
        self.tried.push(idx);
        self.retries += 1;
        upstream.count_retry(reason);
    }

    /// Waits the retry policy's backoff before the next retry; a whole-request deadline
    /// that passes meanwhile ends the request with 504.
    async fn backoff(&self, upstream: &Upstream) -> Result<(), ProxyError> {
        let wait = self
            .policy
            .and_then(|p| p.retry.as_ref())
            .map(|r| r.backoff(self.retries))
            .filter(|w| !w.is_zero());
        let timed_out = || ProxyError::RequestTimeout(upstream.id.clone());
        match (wait, self.request_deadline) {
            (None, None) => Ok(()),
            (None, Some(d)) if Instant::now() >= d => Err(timed_out()),
            (None, Some(_)) => Ok(()),
            (Some(w), deadline) => {
                let until = Instant::now() + w;
                match deadline {
                    Some(d) if d <= until => {
                        // NB: boxed timers, as in `run`: only a retry pays for them.
                        Box::pin(tokio::time::sleep_until(d.into())).await;
                        Err(timed_out())
                    }
                    _ => {
                        Box::pin(tokio::time::sleep_until(until.into())).await;
                        Ok(())
                    }
                }
            }
        }
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
