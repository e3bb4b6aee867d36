//! HTTP facts and header rules shared by every stage of the request path: the listeners,
//! the request phases, the router, the plugins and the upstream clients all import them
//! from here, and this module imports nothing above it.
//!
//! - [`ConnInfo`]: facts about a downstream connection, computed once per connection.
//! - [`RequestInfo`]: what the router and the balancer read of a request.
//! - [`headers`]: hop-by-hop headers (RFC 9110 §7.6.1) and the forwarding headers a proxy
//!   adds (`X-Forwarded-*`, `X-Real-IP`).
//! - [`path`]: request path normalisation (what routes match, what is forwarded).
//! - [`host`]: the request's host, the one decision the router and the mTLS guard share
//!   ([`request_host`] as sent, [`host::effective_host`] canonical).

pub use sluice_io::headers;
pub mod host;
pub mod path;

pub use host::request_host;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use http::Request;

use sluice_io::timer::CoarseTimer;

/// Facts about the downstream connection, computed once per connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Client address.
    pub remote_addr: SocketAddr,
    /// Address the connection was accepted on.
    pub local_addr: SocketAddr,
    /// `"http"` or `"https"`.
    pub scheme: &'static str,
    /// The client IP as text, for `X-Forwarded-For` and `X-Real-IP`.
    pub remote_ip: InlineText,
    /// The worker's timer for request timeouts.
    pub timer: CoarseTimer,
    /// Longest pause between two pieces of a request body from the client (nginx
    /// `client_body_timeout`); past it the request is answered 408.
    pub client_body_timeout: std::time::Duration,
    /// Largest HTTP/1.x request head, bytes, as sent (request line, headers, CRLFs); past it
    /// the request is answered 431. hyper's `max_buf_size` bounds its read buffer, not the
    /// head: a head that arrives in one read may be up to twice that size.
    pub max_header_bytes: usize,
    /// Set by the listener once the process shuts down (its shutdown delay, then drain):
    /// from then on an HTTP/1.x response on this connection asks the client to close it.
    /// Default: none, the connection is never asked to close.
    pub going_away: Option<Arc<AtomicBool>>,
    /// The per-Gateway listener (`Snapshot.listeners` id) the connection came in on; `None`
    /// for the dataplane's own listeners. Its routes and certificates are the only ones
    /// it can reach.
    pub listener: Option<Arc<str>>,
}

impl ConnInfo {
    /// Describes a connection.
    pub fn new(
        remote_addr: SocketAddr,
        local_addr: SocketAddr,
        scheme: &'static str,
        timer: CoarseTimer,
    ) -> Self {
        let ip = remote_addr.ip().to_canonical();
        ConnInfo {
            remote_addr: SocketAddr::new(ip, remote_addr.port()),
            local_addr,
            scheme,
            remote_ip: InlineText::ip(ip),
            timer,
            client_body_timeout: CLIENT_BODY_TIMEOUT,
            max_header_bytes: MAX_HEADER_BYTES,
            going_away: None,
            listener: None,
        }
    }

    /// Whether the process is shutting down and the connection should not be kept alive.
    #[inline]
    pub fn is_going_away(&self) -> bool {
        self.going_away
            .as_ref()
            .is_some_and(|g| g.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// Short text in a fixed buffer, without allocating: an IP address or a port as the
/// request path writes them (`X-Forwarded-For`, the router's `remote_addr` and
/// `server_port` variables).
///
/// NB: [`InlineText::ip`] writes an IPv4 address by hand, without `fmt`: `to_string` took
/// ~1,400 instructions and four allocations per connection for the client's address
/// (issue 21). IPv4-mapped IPv6 addresses are written as IPv4, as nginx's `$remote_addr`
/// shows them.
#[derive(Clone, Copy)]
pub struct InlineText {
    /// An IPv6 address takes at most 45 bytes (`ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255`).
    buf: [u8; 45],
    len: u8,
}

impl InlineText {
    fn empty() -> InlineText {
        InlineText {
            buf: [0; 45],
            len: 0,
        }
    }

    /// `ip` as text.
    pub fn ip(ip: IpAddr) -> InlineText {
        let mut t = InlineText::empty();
        match ip.to_canonical() {
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        t.push(b'.');
                    }
                    if octet >= 100 {
                        t.push(b'0' + octet / 100);
                    }
                    if octet >= 10 {
                        t.push(b'0' + octet / 10 % 10);
                    }
                    t.push(b'0' + octet % 10);
                }
            }
            IpAddr::V6(v6) => {
                use std::fmt::Write;
                // Cannot fail: the buffer holds the longest IPv6 text.
                let _ = write!(t, "{v6}");
            }
        }
        t
    }

    /// `v` as text; `None` when it does not fit.
    pub fn display(v: impl std::fmt::Display) -> Option<InlineText> {
        use std::fmt::Write;
        let mut t = InlineText::empty();
        write!(t, "{v}").ok().map(|()| t)
    }

    fn push(&mut self, b: u8) {
        if let Some(slot) = self.buf.get_mut(usize::from(self.len)) {
            *slot = b;
            self.len += 1;
        }
    }

    /// The text's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // Only whole `str`s and ASCII digits and dots are ever written.
        std::str::from_utf8(self.as_bytes()).unwrap_or("")
    }
}

impl std::fmt::Write for InlineText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let start = usize::from(self.len);
        let end = start + s.len();
        let dst = self.buf.get_mut(start..end).ok_or(std::fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = u8::try_from(end).map_err(|_| std::fmt::Error)?;
        Ok(())
    }
}

impl std::fmt::Debug for InlineText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for InlineText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Default of [`ConnInfo::client_body_timeout`]: nginx's and APISIX's 60 s.
pub const CLIENT_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Default of [`ConnInfo::max_header_bytes`]: 64 KiB.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// The size of an HTTP/1.x request head on the wire: request line, header lines and the
/// empty line that ends it (`METHOD SP target SP HTTP/1.1 CRLF`, `name: value CRLF`, CRLF).
/// HTTP/2 heads are bounded by `SETTINGS_MAX_HEADER_LIST_SIZE` instead.
pub fn head_len<B>(req: &Request<B>) -> usize {
    let uri = req.uri();
    let target = match (uri.scheme(), uri.authority()) {
        // Absolute form: `scheme://authority` before the path.
        (Some(s), Some(a)) => s.as_str().len() + 3 + a.as_str().len(),
        _ => 0,
    } + uri.path_and_query().map_or(1, |pq| pq.as_str().len());
    let line = req.method().as_str().len() + 1 + target + 1 + "HTTP/1.1".len() + 2;
    let fields: usize = req
        .headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + 2 + v.len() + 2)
        .sum();
    line + fields + 2
}

/// What the router and the balancer need to know about a request.
#[derive(Debug, Clone, Copy)]
pub struct RequestInfo<'a> {
    /// Request method.
    pub method: &'a http::Method,
    /// Raw Host header or HTTP/2 `:authority`; may include a port (`a.com:8080`,
    /// `[::1]:8080`). `None` matches only host-less routes.
    pub host: Option<&'a str>,
    /// Request path without the query string.
    pub path: &'a str,
    /// Query string without the `?`; `None` when the URI has no `?`.
    pub query: Option<&'a str>,
    /// Request headers.
    pub headers: &'a http::HeaderMap,
    /// Client (peer) address.
    pub remote_addr: SocketAddr,
    /// Local address the connection was accepted on.
    pub local_addr: SocketAddr,
    /// `"http"` or `"https"`.
    pub scheme: &'a str,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::InlineText;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    #[test]
    fn ip_text_writes_what_display_writes() {
        // Every octet value in every position, with the others at their widest and
        // narrowest.
        for o in 0..=255u8 {
            for fill in [0u8, 9, 10, 99, 100, 255] {
                for pos in 0..4 {
                    let mut octets = [fill; 4];
                    octets[pos] = o;
                    let ip = IpAddr::V4(Ipv4Addr::from(octets));
                    assert_eq!(InlineText::ip(ip).as_str(), ip.to_string());
                }
            }
        }
        for v6 in [
            Ipv6Addr::UNSPECIFIED,
            Ipv6Addr::LOCALHOST,
            "2001:db8::1".parse().unwrap(),
            "fe80::1:2:3:4".parse().unwrap(),
            Ipv6Addr::from([0xffff; 8]),
            // IPv4-compatible (deprecated) and the like: the longest texts std writes.
            "::ffff:0:255.255.255.255".parse().unwrap(),
            "64:ff9b::255.255.255.255".parse().unwrap(),
        ] {
            let ip = IpAddr::V6(v6);
            assert_eq!(InlineText::ip(ip).as_str(), ip.to_string(), "{v6:?}");
        }
    }

    #[test]
    fn ip_text_writes_an_ipv4_mapped_address_as_ipv4() {
        let mapped = IpAddr::V6(Ipv4Addr::new(192, 0, 2, 7).to_ipv6_mapped());
        assert_eq!(InlineText::ip(mapped).as_bytes(), b"192.0.2.7");
    }
}
