//! Header rules every protocol path shares: the hop-by-hop headers a proxy removes
//! (RFC 9110 §7.6.1), and the forwarding headers it adds ([`ProxyHeaders`]).

use http::header::{self, HeaderMap, HeaderValue};

/// Headers a proxy adds to every upstream request: `X-Forwarded-For` (the client appended),
/// `X-Real-IP`, `X-Forwarded-Proto` and `X-Forwarded-Host`, replacing any the client sent.
///
/// The HTTP/1.1 client writes them while it serializes the head
/// ([`crate::h1::encode_request_head`]); the hyper-based clients (HTTP/2, TLS)
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

/// Removes hop-by-hop headers, including those named in `Connection`, from a client's
/// request before any plugin runs. Two survive, for the protocols that need them: for a
/// WebSocket upgrade (`upgrade`), `Upgrade`, with `Connection: upgrade`; and `TE: trailers`
/// when the client sent it (HTTP/2 and gRPC upstreams need it; the HTTP/1.1 client does not
/// send it on).
///
/// NB: before the plugins, so that a client cannot name in `Connection` a header a plugin
/// adds (an auth header, proxy-rewrite's host) and have it removed on the way upstream.
pub fn strip_request_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let present = present_bits(headers);
    if present == 0 {
        return;
    }
    let kept = if upgrade {
        headers.get(header::UPGRADE).cloned()
    } else {
        None
    };
    // Bit 1: `te` (see `HOP_BY_HOP`).
    let trailers = present & 2 != 0 && wants_trailers(headers);
    strip_present(headers, present);
    if let Some(u) = kept {
        headers.insert(header::UPGRADE, u);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    if trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// Whether any `te` value lists `trailers` (gRPC requires it to reach the upstream).
pub fn wants_trailers(headers: &HeaderMap) -> bool {
    headers.get_all(header::TE).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        })
    })
}

/// The bits ([`hop_by_hop_bit`]) of the hop-by-hop headers present in `headers`.
///
/// NB: one pass over the names, without hashing; typically only `connection`, or none.
#[inline]
fn present_bits(headers: &HeaderMap) -> u8 {
    let mut present = 0u8;
    for name in headers.keys() {
        present |= hop_by_hop_bit(name.as_str());
    }
    present
}

/// Removes hop-by-hop headers, including those named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip_present(headers, present_bits(headers));
}

/// Removes the hop-by-hop headers whose bits are in `present`, and those `Connection` names.
fn strip_present(headers: &mut HeaderMap, present: u8) {
    if present == 0 {
        return;
    }
    if present & 1 != 0 {
        // NB: every `Connection` header counts, not only the first (a client may split its
        // list over several). No allocation unless one names another header.
        let mut named: Vec<String> = Vec::new();
        for value in headers.get_all(header::CONNECTION) {
            let Ok(list) = value.to_str() else { continue };
            for token in list.split(',').map(str::trim) {
                let known = token.is_empty()
                    || token.eq_ignore_ascii_case("close")
                    || is_hop_by_hop_token(token);
                if !known {
                    named.push(token.to_owned());
                }
            }
        }
        headers.remove(header::CONNECTION);
        for token in &named {
            headers.remove(token.as_str());
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
    fn every_connection_header_names_headers_to_remove() {
        let mut h = HeaderMap::new();
        h.append(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        h.append(
            header::CONNECTION,
            HeaderValue::from_static("x-second, X-Third"),
        );
        h.insert("x-second", HeaderValue::from_static("1"));
        h.insert("x-third", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn a_request_keeps_upgrade_and_te_trailers_only() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("Upgrade, te, x-a"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::TE, HeaderValue::from_static("trailers, deflate"));
        h.insert("keep-alive", HeaderValue::from_static("1"));
        h.insert("x-a", HeaderValue::from_static("1"));
        let mut upgrade = h.clone();
        strip_request_hop_by_hop(&mut upgrade, true);
        assert_eq!(upgrade.len(), 3, "{upgrade:?}");
        assert_eq!(upgrade["connection"], "upgrade");
        assert_eq!(upgrade["upgrade"], "websocket");
        assert_eq!(upgrade["te"], "trailers");
        strip_request_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h["te"], "trailers");
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
