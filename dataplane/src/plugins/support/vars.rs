//! Reading APISIX variables ([`Var`]) from a request.

use std::borrow::Cow;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

use http::request;
use sluice_plugin_config::common::LimitKey;
use sluice_plugin_config::vars::{Piece, Template, Var};

use crate::plugins::PluginCtx;

/// The value of `var` for this request; `None` when absent (no such header, ...).
pub fn get<'r>(var: &Var, req: &'r request::Parts, ctx: &'r PluginCtx) -> Option<Cow<'r, str>> {
    Some(match var {
        Var::RemoteAddr => Cow::Owned(ctx.remote_addr.ip().to_string()),
        Var::RemotePort => Cow::Owned(ctx.remote_addr.port().to_string()),
        Var::ServerAddr => Cow::Owned(ctx.local_addr.ip().to_string()),
        Var::ServerPort => Cow::Owned(ctx.local_addr.port().to_string()),
        Var::Uri => Cow::Borrowed(req.uri.path()),
        Var::RequestUri => Cow::Borrowed(req.uri.path_and_query().map_or("/", |p| p.as_str())),
        Var::Args => Cow::Borrowed(req.uri.query()?),
        Var::Host => {
            let h = req
                .headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .or_else(|| req.uri.host())?;
            Cow::Borrowed(strip_port(h))
        }
        Var::RequestMethod => Cow::Borrowed(req.method.as_str()),
        Var::Scheme => Cow::Borrowed(ctx.scheme),
        Var::RouteId => Cow::Borrowed(&ctx.chain.route_id),
        Var::ConsumerName => Cow::Borrowed(ctx.consumer_name()?),
        Var::Header(name) => Cow::Borrowed(req.headers.get(name.as_str())?.to_str().ok()?),
        Var::Arg(name) => query_arg(req.uri.query()?, name)?,
        Var::Cookie(name) => Cow::Borrowed(cookie(&req.headers, name)?),
    })
}

fn strip_port(h: &str) -> &str {
    if h.starts_with('[') {
        return h.split_once(']').map_or(h, |(a, _)| &a[1..]);
    }
    h.rsplit_once(':')
        .filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit()))
        .map_or(h, |(a, _)| a)
}

/// The first value of query argument `name`, percent-decoded.
pub fn query_arg<'q>(query: &'q str, name: &str) -> Option<Cow<'q, str>> {
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == name {
            return Some(percent_decode(v));
        }
    }
    None
}

pub(crate) fn percent_decode(s: &str) -> Cow<'_, str> {
    if !s.bytes().any(|b| b == b'%' || b == b'+') {
        return Cow::Borrowed(s);
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// The value of cookie `name`.
pub fn cookie<'h>(headers: &'h http::HeaderMap, name: &str) -> Option<&'h str> {
    for h in headers.get_all(http::header::COOKIE) {
        let Ok(s) = h.to_str() else { continue };
        for part in s.split(';') {
            if let Some((k, v)) = part.trim().split_once('=')
                && k == name
            {
                return Some(v);
            }
        }
    }
    None
}

/// A rate-limit key value; the client IP needs no allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyValue {
    /// The client IP.
    Ip(IpAddr),
    /// Any other key.
    Text(Box<str>),
}

impl Hash for KeyValue {
    /// NB: one integer write for an IPv4 address (the derived impl makes three writes: ~100
    /// instructions more per request of a limit keyed by `remote_addr`, issue 4).
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            KeyValue::Ip(IpAddr::V4(ip)) => {
                state.write_u64((4 << 32) | u64::from(u32::from(*ip)));
            }
            KeyValue::Ip(IpAddr::V6(ip)) => {
                state.write_u8(6);
                state.write_u128(u128::from(*ip));
            }
            KeyValue::Text(t) => {
                state.write_u8(b'T');
                state.write(t.as_bytes());
            }
        }
    }
}

impl std::fmt::Display for KeyValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyValue::Ip(ip) => write!(f, "{ip}"),
            KeyValue::Text(t) => f.write_str(t),
        }
    }
}

/// The key of a rate limit for this request. As APISIX, a missing variable falls back to
/// the client address.
pub fn limit_key(key: &LimitKey, req: &request::Parts, ctx: &PluginCtx) -> KeyValue {
    match key {
        LimitKey::Var(Var::RemoteAddr) => KeyValue::Ip(ctx.remote_addr.ip()),
        LimitKey::Var(v) => match get(v, req, ctx) {
            Some(s) if !s.is_empty() => KeyValue::Text(s.into()),
            _ => KeyValue::Ip(ctx.remote_addr.ip()),
        },
        LimitKey::Combination(t) => match render(t, req, ctx) {
            Some(s) => KeyValue::Text(s.into()),
            None => KeyValue::Ip(ctx.remote_addr.ip()),
        },
        LimitKey::Constant(c) => KeyValue::Text(c.as_str().into()),
    }
}

/// Renders a template; `None` when every variable is absent. Absent variables render empty.
pub fn render(t: &Template, req: &request::Parts, ctx: &PluginCtx) -> Option<String> {
    let mut out = String::new();
    let mut any = false;
    for p in &t.pieces {
        match p {
            Piece::Text(s) => out.push_str(s),
            Piece::Var(v) => {
                if let Some(s) = get(v, req, ctx) {
                    any = true;
                    out.push_str(&s);
                }
            }
        }
    }
    any.then_some(out)
}

/// The node's host name (the `hostname` variable, the `apisix_node_info` label, the spans'
/// resource); empty when unknown.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn args_and_cookies() {
        assert_eq!(query_arg("a=1&apikey=x%20y", "apikey").unwrap(), "x y");
        assert_eq!(query_arg("a=1", "b"), None);
        let mut h = http::HeaderMap::new();
        h.insert("cookie", "a=1; jwt=tok".parse().unwrap());
        assert_eq!(cookie(&h, "jwt"), Some("tok"));
        assert_eq!(strip_port("example.com:8080"), "example.com");
        assert_eq!(strip_port("[::1]:80"), "::1");
    }
}
