//! The canonical request host, written here from the rules `dataplane/src/http/host.rs`
//! documents (not from its code), for the fuzz targets to compare against.

use std::net::Ipv6Addr;

/// Longest canonical host (`sluice_proto::validate::MAX_HOST_LEN`).
pub const MAX_HOST_LEN: usize = 255;

/// The canonical form of a `Host` value or an authority; `None` when the request is
/// refused (400): not `host[:port]`, a port of more than 5 digits, an empty host or label,
/// a name longer than 255 bytes, a bracketed literal that is not an IPv6 address.
pub fn canonical(raw: &str) -> Option<String> {
    let (host, port) = match raw.strip_prefix('[') {
        Some(rest) => {
            let (literal, after) = rest.split_once(']')?;
            let ip: Ipv6Addr = literal.parse().ok()?;
            (format!("[{ip}]"), after)
        }
        None => match raw.split_once(':') {
            Some((h, _)) => (h.to_owned(), &raw[h.len()..]),
            None => (raw.to_owned(), ""),
        },
    };
    if let Some(digits) = port.strip_prefix(':') {
        if digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
    } else if !port.is_empty() {
        return None;
    }
    if host.starts_with('[') {
        return Some(host);
    }
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=".contains(&b);
    if !host.bytes().all(allowed) {
        return None;
    }
    let host = host.strip_suffix('.').unwrap_or(&host);
    if host.is_empty() || host.len() > MAX_HOST_LEN || host.split('.').any(str::is_empty) {
        return None;
    }
    Some(host.to_ascii_lowercase())
}
