//! ApisixUpstream `healthCheck`, `loadbalancer.hashOn/key` and `passHost/upstreamHost`:
//! validation and conversion into the snapshot, with every APISIX default filled in so the
//! dataplane never has to know them.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sluice_crds::{
    ActiveHealthCheck, HashOn, HealthCheck, HealthCheckType, LoadBalancer, PassHost,
    PassiveHealthCheck, parse_duration,
};
use sluice_proto::v1;

use crate::problems::Problems;

/// Shortest probe interval APISIX accepts.
const MIN_INTERVAL_MS: u64 = 1000;
/// Largest value of a health counter (APISIX: 1-254; Sluice also takes 0 = never).
const MAX_COUNTER: i32 = 254;

/// Variables `hashOn: vars` may name (as APISIX allows), besides `arg_*`, `http_*` and
/// `cookie_*`.
const HASH_VARS: [&str; 9] = [
    "uri",
    "server_name",
    "server_addr",
    "request_uri",
    "remote_port",
    "remote_addr",
    "query_string",
    "host",
    "hostname",
];

/// Whether `name` is a variable the dataplane can hash on.
pub(crate) fn known_var(name: &str) -> bool {
    HASH_VARS.contains(&name)
        || ["arg_", "http_", "cookie_"]
            .iter()
            .any(|p| name.strip_prefix(p).is_some_and(|rest| !rest.is_empty()))
}

/// `loadbalancer.hashOn` and `key`, validated. `None` when the load balancer sets neither.
pub(crate) fn hash_on(
    lb: &LoadBalancer,
    field: &str,
    problems: &mut Problems,
) -> Option<(v1::UpstreamHashOn, String)> {
    if lb.hash_on.is_none() && lb.key.is_none() {
        return None;
    }
    let on = lb.hash_on.unwrap_or_default();
    let key = lb.key.clone().unwrap_or_default();
    let kfield = format!("{field}loadbalancer.key");
    let proto = match on {
        HashOn::Vars => {
            if !key.is_empty() && !known_var(&key) {
                problems.error(
                    &kfield,
                    format!(
                        "{key:?} is not a variable Sluice can hash on (one of {}, or arg_*, http_*, cookie_*)",
                        HASH_VARS.join(", ")
                    ),
                );
            }
            v1::UpstreamHashOn::Vars
        }
        HashOn::Header | HashOn::Cookie => {
            if key.is_empty() {
                problems.error(
                    &kfield,
                    format!("required when hashOn is {}", hash_on_name(on)),
                );
            } else if !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                problems.error(&kfield, format!("{key:?} is not a header or cookie name"));
            }
            if on == HashOn::Header {
                v1::UpstreamHashOn::Header
            } else {
                v1::UpstreamHashOn::Cookie
            }
        }
        HashOn::Consumer => v1::UpstreamHashOn::Consumer,
        HashOn::VarsCombinations => {
            match crate::upstream_health::template_vars(&key) {
                Err(e) => problems.error(&kfield, e),
                Ok(vars) => {
                    for v in vars {
                        if !known_var(v) {
                            problems.error(
                                &kfield,
                                format!("${v} is not a variable Sluice can hash on"),
                            );
                        }
                    }
                }
            }
            v1::UpstreamHashOn::VarsCombinations
        }
    };
    Some((proto, key))
}

fn hash_on_name(on: HashOn) -> &'static str {
    match on {
        HashOn::Vars => "vars",
        HashOn::Header => "header",
        HashOn::Cookie => "cookie",
        HashOn::Consumer => "consumer",
        HashOn::VarsCombinations => "vars_combinations",
    }
}

/// The `$name` variables of a `vars_combinations` template such as `$host-$remote_addr`.
pub(crate) fn template_vars(t: &str) -> Result<Vec<&str>, String> {
    if !t.contains('$') {
        return Err(format!(
            "{t:?} names no variable (write e.g. `$host$remote_addr`)"
        ));
    }
    let mut vars = Vec::new();
    let mut rest = t;
    while let Some(i) = rest.find('$') {
        let after = &rest[i + 1..];
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        if end == 0 {
            return Err(format!("{t:?}: `$` without a variable name"));
        }
        vars.push(&after[..end]);
        rest = &after[end..];
    }
    Ok(vars)
}

/// `passHost` and `upstreamHost`, validated.
pub(crate) fn pass_host(
    pass: Option<PassHost>,
    upstream_host: Option<&str>,
    field: &str,
    problems: &mut Problems,
) -> Option<(v1::UpstreamPassHost, String)> {
    if pass.is_none() && upstream_host.is_none() {
        return None;
    }
    let host = upstream_host.unwrap_or_default().to_owned();
    if !host.is_empty() {
        let ok = host.parse::<http_authority::Check>().is_ok();
        if !ok {
            problems.error(
                format!("{field}upstreamHost"),
                format!("{host:?} is not a valid host[:port]"),
            );
        }
    }
    let p = match pass.unwrap_or_default() {
        PassHost::Pass => v1::UpstreamPassHost::Pass,
        PassHost::Node => v1::UpstreamPassHost::Node,
        PassHost::Rewrite => {
            if host.is_empty() {
                problems.error(
                    format!("{field}upstreamHost"),
                    "required when passHost is rewrite",
                );
            }
            v1::UpstreamPassHost::Rewrite
        }
    };
    Some((p, host))
}

/// A tiny `host[:port]` check for `upstreamHost` (no scheme, path or spaces).
mod http_authority {
    /// Marker type: parsing succeeds for a valid `host[:port]`.
    pub(crate) struct Check;

    impl std::str::FromStr for Check {
        type Err = ();

        fn from_str(s: &str) -> Result<Self, ()> {
            let (host, port) = match s.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') || h.starts_with('[') => (h, Some(p)),
                _ => (s, None),
            };
            if let Some(p) = port
                && p.parse::<u16>().map_or(true, |p| p == 0)
            {
                return Err(());
            }
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if host.parse::<std::net::IpAddr>().is_ok() {
                return Ok(Check);
            }
            crate::validate::node_host(host)
                .map(|_| Check)
                .map_err(|_| ())
        }
    }
}

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
    let timeout_ms = match &a.timeout {
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
    };
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
    let healthy = a.healthy.clone().unwrap_or_default();
    let unhealthy = a.unhealthy.clone().unwrap_or_default();
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
        healthy: Some(v1::UpstreamHealthThresholds {
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
        }),
        unhealthy: Some(v1::UpstreamHealthThresholds {
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
        }),
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn templates_and_vars() {
        assert_eq!(
            template_vars("$host-$remote_addr").unwrap(),
            vec!["host", "remote_addr"]
        );
        assert!(template_vars("host").is_err());
        assert!(template_vars("a$").is_err());
        assert!(known_var("arg_user"));
        assert!(!known_var("arg_"));
        assert!(!known_var("nope"));
    }

    #[test]
    fn authority() {
        for ok in [
            "example.com",
            "example.com:8080",
            "10.0.0.1:80",
            "[fd00::1]:80",
        ] {
            assert!(ok.parse::<http_authority::Check>().is_ok(), "{ok}");
        }
        for bad in ["http://x", "a b", "x:0", "x:99999", ""] {
            assert!(bad.parse::<http_authority::Check>().is_err(), "{bad}");
        }
    }
}
