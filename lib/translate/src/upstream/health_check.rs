//! ApisixUpstream `healthCheck`: validation and conversion into the snapshot, with every
//! APISIX default filled in so the dataplane never has to know them.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sluice_crds::{
    ActiveHealthCheck, ActiveHealthCheckHealthy, ActiveHealthCheckUnhealthy, HealthCheck,
    HealthCheckType, PassiveHealthCheck, parse_duration,
};
use sluice_proto::v1;

use super::pass_host::http_authority;
use crate::problems::Problems;

/// Shortest probe interval APISIX accepts.
const MIN_INTERVAL_MS: u64 = 1000;
/// Largest value of a health counter (APISIX: 1-254; Sluice also takes 0 = never).
const MAX_COUNTER: i32 = 254;

fn counter(v: Option<i32>, default: u32, field: String, problems: &mut Problems) -> u32 {
    match v {
        None => default,
        Some(n) if (0..=MAX_COUNTER).contains(&n) => n as u32,
        Some(n) => {
            problems.error(field, format!("{n} is not in 0-{MAX_COUNTER}"));
            default
        }
    }
}

fn codes(v: &[i32], default: &[u32], field: String, problems: &mut Problems) -> Vec<u32> {
    if v.is_empty() {
        return default.to_vec();
    }
    let mut out = Vec::with_capacity(v.len());
    for (i, c) in v.iter().enumerate() {
        if (100..=599).contains(c) {
            out.push(*c as u32);
        } else {
            problems.error(
                format!("{field}[{i}]"),
                format!("{c} is not an HTTP status code (100-599)"),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn interval(v: Option<&str>, field: String, problems: &mut Problems) -> u64 {
    let Some(raw) = v else {
        return MIN_INTERVAL_MS;
    };
    match parse_duration(raw) {
        Err(e) => {
            problems.error(field, e.to_string());
            MIN_INTERVAL_MS
        }
        Ok(d) if d.as_millis() < u128::from(MIN_INTERVAL_MS) => {
            problems.error(field, format!("{raw:?} is under the 1s minimum"));
            MIN_INTERVAL_MS
        }
        Ok(d) => u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    }
}

fn check_type(t: Option<HealthCheckType>) -> v1::UpstreamHealthCheckType {
    match t.unwrap_or_default() {
        HealthCheckType::Http => v1::UpstreamHealthCheckType::Http,
        HealthCheckType::Https => v1::UpstreamHealthCheckType::Https,
        HealthCheckType::Tcp => v1::UpstreamHealthCheckType::Tcp,
    }
}

/// APISIX's default passive "healthy" statuses.
const PASSIVE_HEALTHY: [u32; 19] = [
    200, 201, 202, 203, 204, 205, 206, 207, 208, 226, 300, 301, 302, 303, 304, 305, 306, 307, 308,
];

/// `healthCheck`, validated, with APISIX defaults filled in.
pub(crate) fn health_check(
    hc: &HealthCheck,
    field: &str,
    problems: &mut Problems,
) -> v1::UpstreamHealthCheck {
    let f = format!("{field}healthCheck.");
    v1::UpstreamHealthCheck {
        active: Some(active(&hc.active, &format!("{f}active."), problems)),
        passive: hc
            .passive
            .as_ref()
            .map(|p| passive(p, &format!("{f}passive."), problems)),
    }
}

fn active(a: &ActiveHealthCheck, f: &str, problems: &mut Problems) -> v1::UpstreamActiveCheck {
    let ty = check_type(a.type_);
    let timeout_ms = active_timeout(a, f, problems);
    let (concurrency, port) = concurrency_and_port(a, f, problems);
    let http_path = a.http_path.clone().unwrap_or_else(|| "/".to_owned());
    if !http_path.starts_with('/') || http_path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        problems.error(
            format!("{f}httpPath"),
            format!("{http_path:?} must start with `/` and contain no spaces"),
        );
    }
    let host = a.host.clone().unwrap_or_default();
    if !host.is_empty() && host.parse::<http_authority::Check>().is_err() {
        problems.error(
            format!("{f}host"),
            format!("{host:?} is not a valid host[:port]"),
        );
    }
    let request_headers = request_headers(a, f, problems);
    let healthy = active_healthy(&a.healthy.clone().unwrap_or_default(), f, problems);
    let unhealthy = active_unhealthy(&a.unhealthy.clone().unwrap_or_default(), f, problems);
    v1::UpstreamActiveCheck {
        r#type: ty as i32,
        timeout_ms,
        concurrency,
        host,
        port,
        http_path,
        request_headers,
        // `strictTLS` matters only to https probes; unset (verify) otherwise.
        https_verify_certificate: (ty == v1::UpstreamHealthCheckType::Https)
            .then(|| a.strict_tls.unwrap_or(true)),
        healthy: Some(healthy),
        unhealthy: Some(unhealthy),
    }
}

/// `active.timeout` in ms: seconds as a number, or a duration; default 1s.
fn active_timeout(a: &ActiveHealthCheck, f: &str, problems: &mut Problems) -> u64 {
    match &a.timeout {
        None => 1000,
        Some(IntOrString::Int(s)) if *s > 0 => u64::try_from(*s).unwrap_or(1) * 1000,
        Some(IntOrString::Int(s)) => {
            problems.error(format!("{f}timeout"), format!("{s} must be greater than 0"));
            1000
        }
        Some(IntOrString::String(s)) => match crate::upstream::duration_ms(s) {
            Ok(ms) => ms,
            Err(e) => {
                problems.error(format!("{f}timeout"), e);
                1000
            }
        },
    }
}

/// `active.concurrency` (default 10) and `active.port` (0: the endpoint's).
fn concurrency_and_port(a: &ActiveHealthCheck, f: &str, problems: &mut Problems) -> (u32, u32) {
    let concurrency = match a.concurrency {
        None => 10,
        Some(n) if n > 0 => n as u32,
        Some(n) => {
            problems.error(
                format!("{f}concurrency"),
                format!("{n} must be greater than 0"),
            );
            10
        }
    };
    let port = match a.port {
        None | Some(0) => 0,
        Some(p) if (1..=65535).contains(&p) => p as u32,
        Some(p) => {
            problems.error(
                format!("{f}port"),
                format!("{p} is not a port number (1-65535)"),
            );
            0
        }
    };
    (concurrency, port)
}

/// `active.requestHeaders`: `Name: value` each.
fn request_headers(
    a: &ActiveHealthCheck,
    f: &str,
    problems: &mut Problems,
) -> Vec<v1::UpstreamHealthHeader> {
    let mut request_headers = Vec::new();
    for (i, h) in a.request_headers.iter().enumerate() {
        match h.split_once(':') {
            Some((n, v))
                if http::HeaderName::from_bytes(n.trim().as_bytes()).is_ok()
                    && http::HeaderValue::from_str(v.trim()).is_ok() =>
            {
                request_headers.push(v1::UpstreamHealthHeader {
                    name: n.trim().to_ascii_lowercase(),
                    value: v.trim().to_owned(),
                })
            }
            _ => problems.error(
                format!("{f}requestHeaders[{i}]"),
                format!("{h:?} is not `Name: value`"),
            ),
        }
    }
    request_headers
}

/// `active.healthy`, APISIX defaults filled in.
fn active_healthy(
    healthy: &ActiveHealthCheckHealthy,
    f: &str,
    problems: &mut Problems,
) -> v1::UpstreamHealthThresholds {
    v1::UpstreamHealthThresholds {
        http_codes: codes(
            &healthy.http_codes,
            &[200, 302],
            format!("{f}healthy.httpCodes"),
            problems,
        ),
        successes: counter(
            healthy.successes,
            2,
            format!("{f}healthy.successes"),
            problems,
        ),
        interval_ms: interval(
            healthy.interval.as_deref(),
            format!("{f}healthy.interval"),
            problems,
        ),
        ..Default::default()
    }
}

/// `active.unhealthy`, APISIX defaults filled in.
fn active_unhealthy(
    unhealthy: &ActiveHealthCheckUnhealthy,
    f: &str,
    problems: &mut Problems,
) -> v1::UpstreamHealthThresholds {
    v1::UpstreamHealthThresholds {
        http_codes: codes(
            &unhealthy.http_codes,
            &[404, 429, 500, 501, 502, 503, 504, 505],
            format!("{f}unhealthy.httpCodes"),
            problems,
        ),
        http_failures: counter(
            unhealthy.http_failures,
            5,
            format!("{f}unhealthy.httpFailures"),
            problems,
        ),
        tcp_failures: counter(
            unhealthy.tcp_failures,
            2,
            format!("{f}unhealthy.tcpFailures"),
            problems,
        ),
        timeouts: counter(
            unhealthy.timeout,
            3,
            format!("{f}unhealthy.timeout"),
            problems,
        ),
        interval_ms: interval(
            unhealthy.interval.as_deref(),
            format!("{f}unhealthy.interval"),
            problems,
        ),
        ..Default::default()
    }
}

fn passive(p: &PassiveHealthCheck, f: &str, problems: &mut Problems) -> v1::UpstreamPassiveCheck {
    let healthy = p.healthy.clone().unwrap_or_default();
    let unhealthy = p.unhealthy.clone().unwrap_or_default();
    v1::UpstreamPassiveCheck {
        r#type: check_type(p.type_) as i32,
        healthy: Some(v1::UpstreamHealthThresholds {
            http_codes: codes(
                &healthy.http_codes,
                &PASSIVE_HEALTHY,
                format!("{f}healthy.httpCodes"),
                problems,
            ),
            successes: counter(
                healthy.successes,
                5,
                format!("{f}healthy.successes"),
                problems,
            ),
            ..Default::default()
        }),
        unhealthy: Some(v1::UpstreamHealthThresholds {
            http_codes: codes(
                &unhealthy.http_codes,
                &[429, 500, 503],
                format!("{f}unhealthy.httpCodes"),
                problems,
            ),
            http_failures: counter(
                unhealthy.http_failures,
                5,
                format!("{f}unhealthy.httpFailures"),
                problems,
            ),
            tcp_failures: counter(
                unhealthy.tcp_failures,
                2,
                format!("{f}unhealthy.tcpFailures"),
                problems,
            ),
            timeouts: counter(
                unhealthy.timeout,
                7,
                format!("{f}unhealthy.timeout"),
                problems,
            ),
            ..Default::default()
        }),
    }
}
