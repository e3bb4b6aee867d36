//! Header rules every protocol path shares: the hop-by-hop headers a proxy removes
//! (RFC 9110 §7.6.1), and the forwarding headers it adds ([`ProxyHeaders`]).

use http::header::{self, HeaderMap, HeaderValue};

/// Headers a proxy adds to every upstream request: `X-Forwarded-For` (the client appended),
/// `X-Real-IP`, `X-Forwarded-Proto` and `X-Forwarded-Host`, replacing any the client sent.
///
/// The HTTP/1.1 client writes them while it serializes the head
/// ([`crate::upstream::h1::encode_request_head`]); the hyper-based clients (HTTP/2, TLS)
/// insert them into the header map with [`ProxyHeaders::insert_into`].
#[derive(Debug, Clone, Copy)]
pub struct ProxyHeaders<'a> {
    /// Client IP: appended to `X-Forwarded-For`, and the value of `X-Real-IP`.
    pub client_ip: &'a [u8],
    /// `X-Forwarded-Proto`.
    pub proto: &'a str,
    /// The request's host: `X-Forwarded-Host`, and `Host` when the request has none (HTTP/2).
    pub host: Option<&'a [u8]>,
}

/// The forwarding headers [`ProxyHeaders`] replaces.
pub const FORWARDING: [&str; 4] = [
    "x-forwarded-for",
    "x-real-ip",
    "x-forwarded-proto",
    "x-forwarded-host",
];

impl ProxyHeaders<'_> {
    /// Sets the forwarding headers in `headers` (a request to a hyper client connection,
    /// whose host travels as `:authority`, so `Host` is left alone).
    pub fn insert_into(&self, headers: &mut HeaderMap) {
        let mut xff = Vec::new();
        for prev in headers.get_all(FORWARDING[0]) {
            xff.extend_from_slice(prev.as_bytes());
            xff.extend_from_slice(b", ");
        }
        xff.extend_from_slice(self.client_ip);
        if let Ok(v) = HeaderValue::from_bytes(&xff) {
            headers.insert(FORWARDING[0], v);
        }
        if let Ok(ip) = HeaderValue::from_bytes(self.client_ip) {
            headers.insert(FORWARDING[1], ip);
        }
        headers.insert(
            FORWARDING[2],
            HeaderValue::from_static(if self.proto == "https" {
                "https"
            } else {
                "http"
            }),
        );
        if let Some(h) = self.host.and_then(|h| HeaderValue::from_bytes(h).ok()) {
            headers.insert(FORWARDING[3], h);
        }
    }
}

/// The hop-by-hop headers of RFC 9110 §7.6.1 (plus the legacy `proxy-connection`).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "te",
    "transfer-encoding",
    "upgrade",
    "trailer",
    "proxy-authenticate",
    "keep-alive",
    "proxy-connection",
];

/// The bit of `name` in [`HOP_BY_HOP`] (index order), or 0 for any other header.
///
/// NB: a `match` on the length first rejects almost every header with one comparison;
/// this runs for every request and response header (issue 2: searching the list cost about
/// 90 instructions per header).
#[inline]
pub fn hop_by_hop_bit(name: &str) -> u8 {
    let bit = match name.len() {
        2 if name == HOP_BY_HOP[1] => 1,
        7 if name == HOP_BY_HOP[3] => 3,
        7 if name == HOP_BY_HOP[4] => 4,
        10 if name == HOP_BY_HOP[0] => 0,
        10 if name == HOP_BY_HOP[6] => 6,
        16 if name == HOP_BY_HOP[7] => 7,
        17 if name == HOP_BY_HOP[2] => 2,
        18 if name == HOP_BY_HOP[5] => 5,
        _ => return 0,
    };
    1 << bit
}

/// Whether a `Connection` token names one of the hop-by-hop headers (any case).
pub fn is_hop_by_hop_token(token: &str) -> bool {
    HOP_BY_HOP.iter().any(|h| h.eq_ignore_ascii_case(token))
}

/// Removes hop-by-hop headers, including those named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names, without hashing, finds which are present; typically only
    // `connection`, or none.
    let mut present = 0u8;
    for name in headers.keys() {
        present |= hop_by_hop_bit(name.as_str());
    }
    if present == 0 {
        return;
    }
    if present & 1 != 0
        && let Some(conn) = headers.remove(header::CONNECTION)
        && let Ok(list) = conn.to_str()
    {
        for token in list.split(',').map(str::trim) {
            let known = token.is_empty()
                || token.eq_ignore_ascii_case("close")
                || is_hop_by_hop_token(token);
            if !known {
                headers.remove(token);
            }
        }
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate().skip(1) {
        if present & (1 << i) != 0 {
            headers.remove(*name);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn every_hop_by_hop_header_is_recognised_and_no_other() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_bit(name), 1 << i, "{name}");
            let mut h = HeaderMap::new();
            h.insert(*name, HeaderValue::from_static("x"));
            h.insert("x-kept", HeaderValue::from_static("1"));
            strip_hop_by_hop(&mut h);
            assert_eq!(h.len(), 1, "{name} left in place");
        }
        for other in [
            "host",
            "tx",
            "upgrader",
            "connections",
            "content-length",
            "trailers",
        ] {
            assert_eq!(hop_by_hop_bit(other), 0, "{other}");
        }
    }
}
