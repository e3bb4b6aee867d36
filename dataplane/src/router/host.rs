//! Host names: validation of route hosts and normalisation of request hosts.

use std::net::Ipv6Addr;

/// Longest request host the router considers (DNS names are at most 253 bytes). Longer
/// hosts can only match host-less routes.
pub(crate) use sluice_proto::validate::MAX_HOST_LEN;
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

/// Stack buffer holding the lower-cased request host, so lookup does not allocate.
pub(crate) struct HostBuf {
    buf: [u8; MAX_HOST_LEN],
    len: usize,
}

impl HostBuf {
    pub(crate) fn new() -> Self {
        Self {
            buf: [0; MAX_HOST_LEN],
            len: 0,
        }
    }

    /// Normalises a raw Host header / `:authority`: strips the port (also after `[v6]`)
    /// and lower-cases it. `None` when absent, empty or too long to be a host name.
    pub(crate) fn normalize<'b>(&'b mut self, raw: Option<&str>) -> Option<&'b str> {
        let host = strip_port(raw?);
        if host.is_empty() || host.len() > MAX_HOST_LEN {
            return None;
        }
        let dst = &mut self.buf[..host.len()];
        dst.copy_from_slice(host.as_bytes());
        dst.make_ascii_lowercase();
        self.len = host.len();
        // Only ASCII bytes changed, so this is still UTF-8.
        std::str::from_utf8(&self.buf[..self.len]).ok()
    }
}

/// `a.com:80` → `a.com`, `[::1]:80` → `[::1]`; anything else is returned unchanged.
fn strip_port(raw: &str) -> &str {
    if raw.starts_with('[') {
        return match raw.find(']') {
            Some(end) => &raw[..=end],
            None => raw,
        };
    }
    match raw.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            host
        }
        _ => raw,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn norm(raw: &str) -> Option<String> {
        HostBuf::new().normalize(Some(raw)).map(str::to_owned)
    }

    #[test]
    fn request_host_loses_port_and_case() {
        assert_eq!(norm("Api.Example.COM").as_deref(), Some("api.example.com"));
        assert_eq!(norm("a.com:8080").as_deref(), Some("a.com"));
        assert_eq!(norm("a.com:").as_deref(), Some("a.com"));
        assert_eq!(norm("[::1]:443").as_deref(), Some("[::1]"));
        assert_eq!(norm("[2001:DB8::1]").as_deref(), Some("[2001:db8::1]"));
        assert_eq!(norm("10.0.0.1:80").as_deref(), Some("10.0.0.1"));
        assert_eq!(norm(":80"), None);
        assert_eq!(norm(""), None);
        assert_eq!(norm(&"a".repeat(300)), None);
    }

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
