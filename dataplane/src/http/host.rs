//! The request's host: the one decision of which host a request names. The router
//! ([`crate::router`]) routes on it and the listeners' mTLS guard (`listener::mtls`: the
//! 421 / 403 / client-certificate checks) checks it, both through this module, so a request
//! cannot be checked as one host and routed as another.
//!
//! Which host ([`request_host`], RFC 9112 §3.2 and RFC 9113 §8.3.1):
//!
//! - HTTP/1.x in absolute form (`GET https://a.example/x`, or CONNECT's authority form): the
//!   target's authority, whatever `Host` says (RFC 9112 §3.2.2: the recipient ignores
//!   `Host`); the authority replaces `Host` in what goes upstream.
//! - Else HTTP/1.x: the `Host` header; HTTP/1.1 without one is refused, HTTP/1.0 may omit it
//!   (then only routes without hosts match, and no host is protected).
//! - HTTP/2: `:authority`, else `host`; both present and different: refused.
//!
//! Refused with 400, as nginx refuses them: more than one `Host` header; a host that is not
//! `host[:port]` (userinfo such as `a@b`, a path, spaces, a second colon, text after `]`,
//! a port longer than 5 digits); an empty host (`Host:`, `:80`, `.`); an empty label
//! (`a..b`, `.a`); a name longer than 255 bytes; a bracketed literal that is not an IPv6
//! address.
//!
//! The canonical form ([`HostName`]), what routes and certificates are looked up with: the
//! port stripped, ASCII lower-cased, one trailing dot removed (`A.Example.:443` →
//! `a.example`), an IPv6 literal as `[2001:db8::1]` (compressed, lower case, as route hosts
//! are written). Canonicalising a canonical name changes nothing.

use std::net::Ipv6Addr;

use http::Request;
use http::header::{self, HeaderValue};

/// Longest canonical host (DNS names are at most 253 bytes, see `sluice_proto::validate`).
pub const MAX_HOST_LEN: usize = sluice_proto::validate::MAX_HOST_LEN;

/// A host in canonical form (see the module docs), held without allocating.
#[derive(Clone)]
pub struct HostName {
    buf: [u8; MAX_HOST_LEN],
    len: usize,
}

impl HostName {
    /// The canonical form of a `Host` value or an authority (`name[:port]`,
    /// `[v6]:port`); `Err` names why a request with it is refused (400).
    pub fn parse(raw: &[u8]) -> Result<HostName, &'static str> {
        let mut out = HostName {
            buf: [0; MAX_HOST_LEN],
            len: 0,
        };
        match check(raw)? {
            Checked::Name(name) => {
                let dst = &mut out.buf[..name.len()];
                dst.copy_from_slice(name);
                dst.make_ascii_lowercase();
                out.len = name.len();
            }
            Checked::V6(ip) => {
                use std::io::Write;
                let mut dst: &mut [u8] = &mut out.buf[..];
                // Cannot fail: the longest IPv6 text is 45 bytes.
                write!(dst, "[{ip}]").map_err(|_| "invalid IPv6 literal")?;
                let left = dst.len();
                out.len = MAX_HOST_LEN - left;
            }
        }
        Ok(out)
    }

    /// The canonical host.
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever written (`is_host` admits nothing else).
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

impl std::fmt::Debug for HostName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq for HostName {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for HostName {}

/// The request's host as sent (with its port), chosen and checked as the module docs say;
/// `Err` names why the request must be refused with 400. `Ok(None)`: an HTTP/1.0 request
/// without a host. What goes upstream as `Host`; [`effective_host`] is its canonical form.
pub fn request_host<B>(req: &Request<B>) -> Result<Option<HeaderValue>, &'static str> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let first = hosts.next();
    if hosts.next().is_some() {
        return Err("more than one Host header");
    }
    let authority = req.uri().authority();
    let chosen = if req.version() >= http::Version::HTTP_2 {
        match (authority, first) {
            (Some(a), Some(h)) if !a.as_str().as_bytes().eq_ignore_ascii_case(h.as_bytes()) => {
                return Err("Host header differs from :authority");
            }
            (Some(a), _) => {
                Some(HeaderValue::from_str(a.as_str()).map_err(|_| "invalid :authority")?)
            }
            (None, h) => h.cloned(),
        }
    } else if let Some(a) = authority {
        Some(HeaderValue::from_str(a.as_str()).map_err(|_| "invalid request target")?)
    } else {
        match first {
            Some(h) => Some(h.clone()),
            None if req.version() == http::Version::HTTP_11 => return Err("missing Host header"),
            None => None,
        }
    };
    if let Some(h) = &chosen {
        check(h.as_bytes())?;
    }
    Ok(chosen)
}

/// The canonical form of [`request_host`]: the host the router routes on and the mTLS
/// guard checks.
pub fn effective_host<B>(req: &Request<B>) -> Result<Option<HostName>, &'static str> {
    match request_host(req)? {
        Some(h) => HostName::parse(h.as_bytes()).map(Some),
        None => Ok(None),
    }
}

/// A host that passed [`check`]: its name as sent (port and one trailing dot removed, case
/// kept), or its IPv6 literal.
enum Checked<'a> {
    Name(&'a [u8]),
    V6(Ipv6Addr),
}

/// Whether `raw` is a host a request may name (see the module docs), without building its
/// canonical form; `Err` names why not.
///
/// NB: run for every request (by [`request_host`], and again by the router through
/// [`HostName::parse`]): one pass over the name, no copy (callgrind: two full parses cost
/// ~800 instructions a request, ~3% of a proxied keep-alive request).
fn check(raw: &[u8]) -> Result<Checked<'_>, &'static str> {
    if !is_host(raw) {
        return Err("invalid host");
    }
    if raw.first() == Some(&b'[') {
        let end = raw.iter().position(|&b| b == b']').ok_or("invalid host")?;
        let literal = std::str::from_utf8(&raw[1..end]).map_err(|_| "invalid host")?;
        let ip: Ipv6Addr = literal.parse().map_err(|_| "invalid IPv6 literal")?;
        return Ok(Checked::V6(ip));
    }
    let name = match raw.iter().position(|&b| b == b':') {
        Some(colon) => &raw[..colon],
        None => raw,
    };
    let name = name.strip_suffix(b".").unwrap_or(name);
    if name.is_empty() {
        return Err("empty host");
    }
    // An empty label: a leading dot, or two dots in a row (one trailing dot was removed).
    let mut prev = b'.';
    for &b in name {
        if b == b'.' && prev == b'.' {
            return Err("empty label in the host");
        }
        prev = b;
    }
    if prev == b'.' {
        return Err("empty label in the host");
    }
    if name.len() > MAX_HOST_LEN {
        return Err("host too long");
    }
    Ok(Checked::Name(name))
}

/// The bytes of a host name (RFC 3986 `reg-name`: unreserved, sub-delims and `%`), one
/// table look a byte (a chain of comparisons a byte was the larger part of the check's
/// cost).
const NAME_BYTES: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'%'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            );
        b += 1;
    }
    t
};

/// Whether `host` is `uri-host [ ":" port ]` (RFC 9110 §7.2, RFC 3986 §3.2.2): a bracketed
/// IP literal or a name of unreserved, sub-delims and `%` characters, then at most a port
/// of digits. Anything else (a path, `@`, spaces, a second colon, text after `]`) could be
/// read as another host by a router and by an upstream, so the request is refused, as
/// nginx does.
fn is_host(host: &[u8]) -> bool {
    let (name, port) = match host.first() {
        Some(b'[') => match host.iter().position(|&b| b == b']') {
            Some(end) => {
                let literal = &host[1..end];
                let ok = !literal.is_empty()
                    && literal
                        .iter()
                        .all(|&b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'));
                if !ok {
                    return false;
                }
                (&[][..], &host[end + 1..])
            }
            None => return false,
        },
        _ => match host.iter().position(|&b| b == b':') {
            Some(colon) => (&host[..colon], &host[colon..]),
            None => (host, &[][..]),
        },
    };
    let name_ok = name.iter().all(|&b| NAME_BYTES[usize::from(b)]);
    let port_ok = match port.split_first() {
        None => true,
        Some((b':', digits)) => digits.len() <= 5 && digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    };
    name_ok && port_ok
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn canon(raw: &str) -> Result<String, &'static str> {
        HostName::parse(raw.as_bytes()).map(|h| h.as_str().to_owned())
    }

    #[test]
    fn canonical_hosts_lose_port_case_and_one_trailing_dot() {
        for (raw, want) in [
            ("Api.Example.COM", "api.example.com"),
            ("a.com:8080", "a.com"),
            ("a.com:", "a.com"),
            ("a.com.", "a.com"),
            ("A.COM.:443", "a.com"),
            ("[::1]:443", "[::1]"),
            ("[2001:DB8:0::1]", "[2001:db8::1]"),
            ("[::FFFF:10.0.0.1]", "[::ffff:10.0.0.1]"),
            ("10.0.0.1:80", "10.0.0.1"),
            ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ] {
            assert_eq!(canon(raw).as_deref(), Ok(want), "{raw}");
            // Idempotent.
            assert_eq!(canon(want).as_deref(), Ok(want), "{want}");
        }
    }

    #[test]
    fn bad_hosts_are_refused() {
        for raw in [
            "",
            ":80",
            ".",
            ".:80",
            "a..com",
            ".a.com",
            "a.com..",
            "a@b.com",
            "user:pw@b.com",
            "a.com/x",
            "a com",
            "a.com:80:80",
            "a.com:123456",
            "a.com:x",
            "[::1",
            "[::1]x",
            "[]",
            "[:::]",
            "[1:2:3:4:5:6:7:8:9]",
            "[v1.x]",
            "caf\u{e9}.com",
        ] {
            assert!(canon(raw).is_err(), "{raw:?} should be refused");
        }
        assert!(canon(&"a".repeat(MAX_HOST_LEN)).is_ok());
        assert!(canon(&"a".repeat(MAX_HOST_LEN + 1)).is_err());
    }

    /// `None` when the target does not even parse (hyper answers that 400 itself).
    fn req(version: http::Version, target: &str, hosts: &[&str]) -> Option<Request<()>> {
        let mut b = Request::get(target).version(version);
        for h in hosts {
            b = b.header("host", *h);
        }
        b.body(()).ok()
    }

    fn host(r: &Option<Request<()>>) -> Result<Option<String>, &'static str> {
        let r = r.as_ref().ok_or("unparsable target")?;
        effective_host(r).map(|h| h.map(|h| h.as_str().to_owned()))
    }

    #[test]
    #[allow(clippy::type_complexity)] // NB: one row per case reads best.
    fn the_targets_authority_wins_over_host() {
        use http::Version as V;
        let cases: &[(V, &str, &[&str], Result<Option<&str>, ()>)] = &[
            (V::HTTP_11, "/", &["A.com:80"], Ok(Some("a.com"))),
            (V::HTTP_11, "/", &[], Err(())),
            (V::HTTP_10, "/", &[], Ok(None)),
            (V::HTTP_11, "/", &["a.com", "b.com"], Err(())),
            (V::HTTP_11, "/", &["a.com", "a.com"], Err(())),
            (V::HTTP_11, "/", &[""], Err(())),
            (
                V::HTTP_11,
                "https://MTLS.test./x",
                &["public.test"],
                Ok(Some("mtls.test")),
            ),
            (
                V::HTTP_11,
                "http://mtls.test:8443/x",
                &["public.test"],
                Ok(Some("mtls.test")),
            ),
            (
                V::HTTP_11,
                "https://mtls.test/x",
                &[],
                Ok(Some("mtls.test")),
            ),
            (
                V::HTTP_11,
                "https://[::1]:8443/x",
                &["public.test"],
                Ok(Some("[::1]")),
            ),
            (
                V::HTTP_11,
                "https://a@mtls.test/x",
                &["public.test"],
                Err(()),
            ),
            (
                V::HTTP_11,
                "https://mtls.test/x",
                &["a.com", "b.com"],
                Err(()),
            ),
            (V::HTTP_2, "https://mtls.test/x", &[], Ok(Some("mtls.test"))),
            (
                V::HTTP_2,
                "https://mtls.test/x",
                &["MTLS.test"],
                Ok(Some("mtls.test")),
            ),
            (V::HTTP_2, "https://mtls.test/x", &["public.test"], Err(())),
            (
                V::HTTP_2,
                "https://mtls.test:443/x",
                &["mtls.test"],
                Err(()),
            ),
            (V::HTTP_2, "/x", &["mtls.test"], Ok(Some("mtls.test"))),
        ];
        for (version, target, hosts, want) in cases {
            let r = req(*version, target, hosts);
            let got = host(&r);
            match want {
                Ok(w) => assert_eq!(
                    got,
                    Ok(w.map(str::to_owned)),
                    "{version:?} {target} {hosts:?}"
                ),
                Err(()) => assert!(got.is_err(), "{version:?} {target} {hosts:?}: {got:?}"),
            }
        }
    }
}
