//! Host names of routes: validation and normalisation. A request's host is canonicalised
//! by [`crate::http::host`], the decision the mTLS guard shares.

use std::net::Ipv6Addr;

use sluice_proto::validate::dns_name;

/// A route host after validation.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RouteHost {
    /// Lower-cased exact name (IPv6 literals in brackets, as in a Host header).
    Exact(String),
    /// Lower-cased suffix of a wildcard including its leading dot: `*.a.com` → `.a.com`.
    Wildcard(String),
}

/// Validates and normalises one `match.hosts[]` entry. The error is the reason.
pub(crate) fn parse_route_host(raw: &str) -> Result<RouteHost, String> {
    if raw.is_empty() {
        return Err("empty host".into());
    }
    if let Some(suffix) = raw.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err("only one leading `*.` wildcard is allowed".into());
        }
        dns_name(suffix)?;
        return Ok(RouteHost::Wildcard(format!(
            ".{}",
            suffix.to_ascii_lowercase()
        )));
    }
    if raw.contains('*') {
        return Err("a wildcard must be the whole first label, as in `*.example.com`".into());
    }
    let v6 = raw
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(raw);
    if v6.contains(':') {
        let ip: Ipv6Addr = v6
            .parse()
            .map_err(|_| "not a host name or IP address (hosts carry no port)".to_string())?;
        return Ok(RouteHost::Exact(format!("[{ip}]")));
    }
    dns_name(raw)?;
    Ok(RouteHost::Exact(raw.to_ascii_lowercase()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn route_hosts_are_validated_and_normalised() {
        assert_eq!(
            parse_route_host("A.com"),
            Ok(RouteHost::Exact("a.com".into()))
        );
        assert_eq!(
            parse_route_host("*.A.com"),
            Ok(RouteHost::Wildcard(".a.com".into()))
        );
        assert_eq!(
            parse_route_host("::1"),
            Ok(RouteHost::Exact("[::1]".into()))
        );
        assert_eq!(
            parse_route_host("[::1]"),
            Ok(RouteHost::Exact("[::1]".into()))
        );
        for bad in [
            "", "*", "*.", "a.*.com", "*a.com", "a.com:80", "a..com", "a b.com", "*.*.a",
        ] {
            assert!(parse_route_host(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
