//! Field checks that mirror what the dataplane router accepts (dataplane/src/router),
//! so that a snapshot produced here is never NACKed for a match rule. Keep the two in step.
//!
//! Every function returns the reason as text; the caller prefixes the field path.

use std::net::{IpAddr, Ipv6Addr};

use ipnet::IpNet;
use regex::bytes::RegexBuilder;
use sluice_crds::{ExprOp, ExprScope};

/// Same limit as the dataplane's compiled-regex size limit.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Longest host the dataplane matches.
pub(crate) use sluice_proto::validate::dns_name;

/// Variables the dataplane provides to `Variable` exprs (besides `http_*`, `arg_*`,
/// `cookie_*`).
const KNOWN_VARIABLES: &[&str] = &[
    "remote_addr",
    "remote_port",
    "server_addr",
    "server_port",
    "host",
    "uri",
    "request_uri",
    "request_method",
    "scheme",
    "query_string",
    "args",
];

/// `match.paths[]`: exact, or a prefix ending in one `*`.
pub(crate) fn path(p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Err("empty path; paths start with \"/\"".into());
    }
    if !p.starts_with('/') {
        return Err(format!("{p:?} must start with \"/\""));
    }
    if p.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err(format!("{p:?} contains a space or control character"));
    }
    if p.contains(['?', '#']) {
        return Err(format!(
            "{p:?} must not contain a query string or fragment (use exprs with scope Query)"
        ));
    }
    let body = p.strip_suffix('*').unwrap_or(p);
    if body.contains('*') {
        return Err(format!(
            "{p:?}: `*` is only allowed once, at the end (prefix match)"
        ));
    }
    Ok(())
}

/// `match.hosts[]`: an exact name, an IP literal or one leading `*.` wildcard.
pub(crate) fn host(raw: &str) -> Result<(), String> {
    if raw.is_empty() {
        return Err("empty host".into());
    }
    if let Some(suffix) = raw.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err(format!(
                "{raw:?}: only one leading `*.` wildcard is allowed"
            ));
        }
        return dns_name(suffix).map_err(|r| format!("{raw:?}: {r}"));
    }
    if raw.contains('*') {
        return Err(format!(
            "{raw:?}: a wildcard must be the whole first label, as in \"*.example.com\""
        ));
    }
    let v6 = raw
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(raw);
    if v6.contains(':') {
        return v6.parse::<Ipv6Addr>().map(|_| ()).map_err(|_| {
            format!("{raw:?} is not a host name or IP address (hosts carry no port)")
        });
    }
    dns_name(raw).map_err(|r| format!("{raw:?}: {r}"))
}

/// A node address of an upstream: an IP address or a DNS name, without port or scheme.
pub(crate) fn node_host(raw: &str) -> Result<(), String> {
    if raw.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    if raw.contains(':') || raw.contains('/') {
        return Err(format!(
            "{raw:?} is not a host name or IP address (give the port in `port`, no scheme)"
        ));
    }
    dns_name(raw).map_err(|r| format!("{raw:?}: {r}"))
}

/// `match.remoteAddrs[]`: an IP address or CIDR. Returns the address trimmed, as the
/// dataplane reads it.
pub(crate) fn remote_addr(raw: &str) -> Result<String, String> {
    let t = raw.trim();
    let ok = if t.contains('/') {
        t.parse::<IpNet>().is_ok()
    } else {
        t.parse::<IpAddr>().is_ok()
    };
    if ok {
        Ok(t.to_owned())
    } else {
        Err(format!("{raw:?} is not an IP address or CIDR"))
    }
}

/// Checks the subject name of an expr; the error goes on `subject.name` (or `subject.scope`
/// for Body, which is reported by the caller).
pub(crate) fn expr_subject(scope: ExprScope, name: &str) -> Result<(), String> {
    if scope != ExprScope::Path && name.is_empty() {
        return Err(format!(
            "required for scope {scope:?} (only Path takes no name)"
        ));
    }
    match scope {
        ExprScope::Header => header_name(name),
        ExprScope::Variable => variable(name),
        ExprScope::Query | ExprScope::Cookie | ExprScope::Path | ExprScope::Body => Ok(()),
    }
}

fn header_name(name: &str) -> Result<(), String> {
    http::HeaderName::from_bytes(name.as_bytes())
        .map(|_| ())
        .map_err(|_| format!("{name:?} is not a valid HTTP header name"))
}

fn variable(name: &str) -> Result<(), String> {
    if let Some(header) = name.strip_prefix("http_").filter(|h| !h.is_empty()) {
        return header_name(&header.replace('_', "-"));
    }
    let prefixed = ["arg_", "cookie_"]
        .iter()
        .any(|p| name.strip_prefix(p).is_some_and(|rest| !rest.is_empty()));
    if prefixed || KNOWN_VARIABLES.contains(&name) {
        return Ok(());
    }
    Err(format!(
        "unknown variable {name:?} (supported: {}, http_<header>, arg_<name>, cookie_<name>)",
        KNOWN_VARIABLES.join(", ")
    ))
}

/// A regex operand, compiled the way the dataplane compiles it.
pub(crate) fn regex(op: ExprOp, pattern: &str) -> Result<(), String> {
    let case_insensitive = matches!(
        op,
        ExprOp::RegexMatchCaseInsensitive | ExprOp::RegexNotMatchCaseInsensitive
    );
    RegexBuilder::new(pattern)
        .case_insensitive(case_insensitive)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map(|_| ())
        .map_err(|e| format!("invalid regex {pattern:?}: {}", regex_reason(&e)))
}

/// Whether the operator takes a regex operand.
pub(crate) fn is_regex(op: ExprOp) -> bool {
    matches!(
        op,
        ExprOp::RegexMatch
            | ExprOp::RegexNotMatch
            | ExprOp::RegexMatchCaseInsensitive
            | ExprOp::RegexNotMatchCaseInsensitive
    )
}

/// The reason of a regex error on one line: the parser's multi-line message (pattern, caret,
/// `error: ...`) becomes its `error:` line.
fn regex_reason(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("error: "))
        .map(str::to_owned)
        .unwrap_or_else(|| {
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
}

/// Whether `pem` holds at least one `CERTIFICATE` block and no malformed one.
pub(crate) fn pem_has_certificate(pem: &str) -> bool {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(pem.as_bytes()).collect();
    certs.is_ok_and(|c| !c.is_empty())
}

/// Whether `pem` holds a private key (PKCS#8, PKCS#1 or SEC1).
pub(crate) fn pem_has_private_key(pem: &str) -> bool {
    use rustls_pki_types::PrivateKeyDer;
    use rustls_pki_types::pem::PemObject;
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).is_ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        for ok in ["/", "/a", "/a*", "/*", "/a/b.c"] {
            assert_eq!(path(ok), Ok(()), "{ok}");
        }
        assert!(path("a").unwrap_err().contains("must start with"));
        assert!(path("/a*b").unwrap_err().contains("only allowed once"));
        assert!(path("/a**").unwrap_err().contains("only allowed once"));
        assert!(path("/a?x=1").unwrap_err().contains("query string"));
        assert!(path("/a b").unwrap_err().contains("space"));
        assert!(path("").is_err());
    }

    #[test]
    fn hosts() {
        for ok in [
            "a.com", "*.a.com", "A.Com", "::1", "[::1]", "10.0.0.1", "a_b.c",
        ] {
            assert_eq!(host(ok), Ok(()), "{ok}");
        }
        for bad in [
            "", "*", "*.", "a.*.com", "*a.com", "a.com:80", "a..com", "a b.com", "*.*.a",
        ] {
            assert!(host(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn remote_addrs() {
        assert_eq!(remote_addr(" 10.0.0.0/8 ").unwrap(), "10.0.0.0/8");
        assert_eq!(remote_addr("::1").unwrap(), "::1");
        assert_eq!(
            remote_addr("10.0.0.300").unwrap_err(),
            "\"10.0.0.300\" is not an IP address or CIDR"
        );
        assert!(remote_addr("10.0.0.0/33").is_err());
    }

    #[test]
    fn subjects_and_regexes() {
        assert!(expr_subject(ExprScope::Path, "").is_ok());
        assert!(
            expr_subject(ExprScope::Header, "")
                .unwrap_err()
                .contains("required")
        );
        assert!(expr_subject(ExprScope::Header, "bad header").is_err());
        assert!(expr_subject(ExprScope::Variable, "http_x_user").is_ok());
        assert!(expr_subject(ExprScope::Variable, "arg_").is_err());
        assert!(
            expr_subject(ExprScope::Variable, "upstream_addr")
                .unwrap_err()
                .contains("unknown variable")
        );
        assert!(regex(ExprOp::RegexMatch, "^/a(b|c)$").is_ok());
        let e = regex(ExprOp::RegexMatch, "(").unwrap_err();
        assert_eq!(e, "invalid regex \"(\": unclosed group");
        // Look-around is not supported by the dataplane's engine.
        assert!(regex(ExprOp::RegexMatch, "a(?=b)").is_err());
    }

    #[test]
    fn node_hosts() {
        assert!(node_host("httpbin.org").is_ok());
        assert!(node_host("10.0.0.1").is_ok());
        assert!(node_host("fd00::1").is_ok());
        assert!(node_host("httpbin.org:80").is_err());
        assert!(node_host("http://httpbin.org").is_err());
    }
}
