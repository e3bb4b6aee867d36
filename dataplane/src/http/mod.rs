//! HTTP facts and header rules shared by every stage of the request path: the listeners,
//! the request phases, the router, the plugins and the upstream clients all import them
//! from here, and this module imports nothing above it.
//!
//! - [`ConnInfo`]: facts about a downstream connection, computed once per connection.
//! - [`RequestInfo`]: what the router and the balancer read of a request.
//! - [`headers`]: hop-by-hop headers (RFC 9110 §7.6.1) and the forwarding headers a proxy
//!   adds (`X-Forwarded-*`, `X-Real-IP`).

pub mod headers;

use std::net::SocketAddr;

use http::Request;
use http::header::{self, HeaderValue};

use crate::net::timer::CoarseTimer;

/// Facts about the downstream connection, computed once per connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Client address.
    pub remote_addr: SocketAddr,
    /// Address the connection was accepted on.
    pub local_addr: SocketAddr,
    /// `"http"` or `"https"`.
    pub scheme: &'static str,
    /// The client IP as a header value, for `X-Forwarded-For` and `X-Real-IP`.
    pub remote_ip: HeaderValue,
    /// The worker's timer for request timeouts.
    pub timer: CoarseTimer,
}

impl ConnInfo {
    /// Describes a connection.
    pub fn new(
        remote_addr: SocketAddr,
        local_addr: SocketAddr,
        scheme: &'static str,
        timer: CoarseTimer,
    ) -> Self {
        let ip = remote_addr.ip().to_canonical().to_string();
        let remote_ip = HeaderValue::from_str(&ip).unwrap_or(HeaderValue::from_static("unknown"));
        ConnInfo {
            remote_addr: SocketAddr::new(remote_addr.ip().to_canonical(), remote_addr.port()),
            local_addr,
            scheme,
            remote_ip,
            timer,
        }
    }
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

/// The request's host: the Host header, or the HTTP/2 `:authority`.
pub fn request_host<B>(req: &Request<B>) -> Option<HeaderValue> {
    if let Some(h) = req.headers().get(header::HOST) {
        return Some(h.clone());
    }
    req.uri()
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
}
