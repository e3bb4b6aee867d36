//! HTTPRoute `rules[].timeouts` and `rules[].retry` → the snapshot route's `timeout`
//! (`request_ms`, `attempt_ms`) and `retry`.
//!
//! - `timeouts.request` → `request_ms`: the whole-request deadline (every attempt and
//!   backoff), 504 on expiry. `timeouts.backendRequest` → `attempt_ms`: each attempt's
//!   deadline, 504 (or a retry) on expiry. `0s` disables either. Values are Gateway API
//!   durations (GEP-2257: one to four `<1-5 digits><h|m|s|ms>` parts). A `backendRequest`
//!   longer than a non-zero `request` is invalid, as the CRD's validation says. A route
//!   whose deadline is longer than the dataplane's default read timeout (60 s) has its read
//!   timeout raised to it, so the longer deadline is the one that applies.
//! - `retry.attempts` (at least 1) → `attempts`; `retry.codes` (400-599) → `codes`;
//!   `retry.backoff` (a Gateway API duration) → `backoff_ms`. The dataplane retries
//!   connection errors and attempt timeouts of a replayable request (no body, idempotent
//!   method) and the listed codes, up to `attempts` times, to untried endpoints first.
//!
//! Invalid values leave the rule out (`UnsupportedValue`), like any other invalid rule.

use sluice_crds::gateway::{HttpRouteRetry, HttpRouteTimeouts};
use sluice_proto::v1;

/// The dataplane's read timeout when a route sets none (APISIX's 60 s).
const DEFAULT_READ_MS: u64 = 60_000;

/// Parses a Gateway API duration (GEP-2257): `^([0-9]{1,5}(h|m|s|ms)){1,4}$`, in ms.
pub(crate) fn gateway_duration_ms(s: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "{s:?} is not a Gateway API duration (one to four parts such as `1h`, `30s`, `500ms`)"
        )
    };
    let b = s.as_bytes();
    let (mut i, mut parts, mut total) = (0usize, 0usize, 0u64);
    while i < b.len() {
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = &s[start..i];
        if digits.is_empty() || digits.len() > 5 {
            return Err(bad());
        }
        let n: u64 = digits.parse().map_err(|_| bad())?;
        let unit_ms = if s[i..].starts_with("ms") {
            i += 2;
            1
        } else {
            let u = match b.get(i) {
                Some(b'h') => 3_600_000,
                Some(b'm') => 60_000,
                Some(b's') => 1_000,
                _ => return Err(bad()),
            };
            i += 1;
            u
        };
        parts += 1;
        if parts > 4 {
            return Err(bad());
        }
        total = total.saturating_add(n.saturating_mul(unit_ms));
    }
    if parts == 0 {
        return Err(bad());
    }
    Ok(total)
}

/// The snapshot timeouts of a rule's `timeouts` (`field`: `spec.rules[i].timeouts`), `None`
/// when they set nothing; problems go into `problems`.
pub(crate) fn route_timeouts(
    t: &HttpRouteTimeouts,
    field: &str,
    problems: &mut Vec<String>,
) -> Option<v1::Timeouts> {
    let mut one = |name: &str, v: &Option<String>| -> Option<u64> {
        let v = v.as_deref()?;
        gateway_duration_ms(v)
            .map_err(|e| problems.push(format!("{field}.{name}: {e}")))
            .ok()
    };
    let request = one("request", &t.request).unwrap_or(0);
    let attempt = one("backendRequest", &t.backend_request).unwrap_or(0);
    if request > 0 && attempt > request {
        problems.push(format!(
            "{field}.backendRequest: {} must not be longer than request ({})",
            t.backend_request.as_deref().unwrap_or_default(),
            t.request.as_deref().unwrap_or_default(),
        ));
        return None;
    }
    if request == 0 && attempt == 0 {
        return None;
    }
    let longest = request.max(attempt);
    Some(v1::Timeouts {
        request_ms: request,
        attempt_ms: attempt,
        // NB: else the default read timeout would end a longer deadline first.
        read_ms: if longest > DEFAULT_READ_MS {
            longest
        } else {
            0
        },
        ..Default::default()
    })
}

/// The snapshot retry policy of a rule's `retry` (`field`: `spec.rules[i].retry`); problems
/// go into `problems`.
pub(crate) fn retry_policy(
    r: &HttpRouteRetry,
    field: &str,
    problems: &mut Vec<String>,
) -> Option<v1::RetryPolicy> {
    let before = problems.len();
    let attempts = match r.attempts {
        None => 0,
        Some(n) if n >= 1 => n as u32,
        Some(n) => {
            problems.push(format!("{field}.attempts: {n} must be at least 1"));
            0
        }
    };
    let mut codes = Vec::with_capacity(r.codes.len());
    for (k, c) in r.codes.iter().enumerate() {
        match u32::try_from(*c) {
            Ok(c) if (400..=599).contains(&c) => codes.push(c),
            _ => problems.push(format!("{field}.codes[{k}]: {c} is not in 400-599")),
        }
    }
    codes.sort_unstable();
    codes.dedup();
    let backoff_ms = match r.backoff.as_deref().map(gateway_duration_ms) {
        None => 0,
        Some(Ok(ms)) => ms,
        Some(Err(e)) => {
            problems.push(format!("{field}.backoff: {e}"));
            0
        }
    };
    (problems.len() == before).then_some(v1::RetryPolicy {
        attempts,
        codes,
        backoff_ms,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn gateway_durations_follow_gep_2257() {
        assert_eq!(gateway_duration_ms("10s"), Ok(10_000));
        assert_eq!(gateway_duration_ms("500ms"), Ok(500));
        assert_eq!(gateway_duration_ms("1h2m3s4ms"), Ok(3_723_004));
        assert_eq!(gateway_duration_ms("0s"), Ok(0));
        assert_eq!(gateway_duration_ms("99999m"), Ok(5_999_940_000));
        for bad in [
            "",
            "10",
            "1.5s",
            "-1s",
            "1d",
            "100000s",
            "1h1m1s1ms1h",
            " 1s",
            "1s ",
            "s",
        ] {
            assert!(
                gateway_duration_ms(bad).is_err(),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn backend_request_longer_than_request_is_refused() {
        let mut problems = Vec::new();
        let t = HttpRouteTimeouts {
            request: Some("1s".into()),
            backend_request: Some("2s".into()),
        };
        assert_eq!(route_timeouts(&t, "f", &mut problems), None);
        assert_eq!(
            problems,
            ["f.backendRequest: 2s must not be longer than request (1s)"]
        );
        // A request timeout of 0s disables it: any backendRequest goes.
        problems.clear();
        let t = HttpRouteTimeouts {
            request: Some("0s".into()),
            backend_request: Some("2m".into()),
        };
        let got = route_timeouts(&t, "f", &mut problems).unwrap();
        assert!(problems.is_empty());
        assert_eq!(
            (got.request_ms, got.attempt_ms, got.read_ms),
            (0, 120_000, 120_000)
        );
    }
}
