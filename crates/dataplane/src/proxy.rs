//! The request path: route lookup, upstream request, response streaming.

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri};
use hyper::body::Incoming;

use crate::body::{ProxyBody, UpstreamBody};
use crate::error::ProxyError;
use crate::router::RequestInfo;
use crate::store::Store;
use crate::table::RouteTable;

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
}

impl ConnInfo {
    /// Describes a connection.
    pub fn new(remote_addr: SocketAddr, local_addr: SocketAddr, scheme: &'static str) -> Self {
        let ip = remote_addr.ip().to_canonical().to_string();
        let remote_ip = HeaderValue::from_str(&ip).unwrap_or(HeaderValue::from_static("unknown"));
        ConnInfo {
            remote_addr: SocketAddr::new(remote_addr.ip().to_canonical(), remote_addr.port()),
            local_addr,
            scheme,
            remote_ip,
        }
    }
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Serves one request against the current snapshot. Never fails: errors become responses.
pub async fn handle(req: Request<Incoming>, conn: &ConnInfo, store: &Store) -> Response<ProxyBody> {
    let table = store.table();
    let resp = match proxy(req, conn, &table).await {
        Ok(resp) => resp,
        Err(err) => {
            if !matches!(err, ProxyError::NoRoute) {
                tracing::warn!(error = %err, "request failed");
            }
            err.into_response()
        }
    };
    store.metrics().observe_status(resp.status());
    resp
}

async fn proxy(
    mut req: Request<Incoming>,
    conn: &ConnInfo,
    table: &Arc<RouteTable>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let host = request_host(&req);
    let uri = req.uri();
    let route = {
        let info = RequestInfo {
            method: req.method(),
            host: host.as_ref().and_then(|h| h.to_str().ok()),
            path: uri.path(),
            query: uri.query(),
            headers: req.headers(),
            remote_addr: conn.remote_addr,
            local_addr: conn.local_addr,
            scheme: conn.scheme,
        };
        let idx = table.router.lookup(&info).ok_or(ProxyError::NoRoute)?;
        table.routes.get(idx).ok_or(ProxyError::NoRoute)?
    };
    let upstream = route
        .pick_backend()
        .ok_or_else(|| ProxyError::NoEndpoint(route.id.clone()))?;
    let endpoint = upstream
        .pick()
        .ok_or_else(|| ProxyError::NoEndpoint(upstream.id.clone()))?;
    let timeouts = upstream.timeouts.unwrap_or(route.timeouts);

    // Origin-form request target for the upstream.
    if req.uri().scheme().is_some() || req.uri().authority().is_some() {
        let pq = req
            .uri()
            .path_and_query()
            .map(|pq| pq.as_str())
            .unwrap_or("/");
        *req.uri_mut() =
            Uri::try_from(pq).map_err(|_| ProxyError::BadRequest("invalid request target"))?;
    }
    *req.version_mut() = http::Version::HTTP_11;
    let headers = req.headers_mut();
    strip_hop_by_hop(headers);
    if let Some(h) = host {
        if !headers.contains_key(header::HOST) {
            headers.insert(header::HOST, h.clone());
        }
        headers.insert(X_FORWARDED_HOST.clone(), h);
    }
    forwarded_for(headers, &conn.remote_ip);
    headers.insert(X_REAL_IP.clone(), conn.remote_ip.clone());
    headers.insert(
        X_FORWARDED_PROTO.clone(),
        HeaderValue::from_static(conn.scheme),
    );

    let mut pooled = endpoint.pool.checkout(timeouts.connect).await?;
    let exchange = pooled.sender.send_request(req);
    let resp = match tokio::time::timeout(timeouts.read, exchange).await {
        Err(_) => return Err(ProxyError::ReadTimeout(endpoint.address.clone())),
        Ok(Err(source)) => {
            return Err(ProxyError::Upstream {
                addr: endpoint.address.clone(),
                source,
            });
        }
        Ok(Ok(resp)) => resp,
    };
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(
        parts,
        ProxyBody::Upstream(UpstreamBody::new(body, Some(pooled))),
    ))
}

/// The request's host: the Host header, or the HTTP/2 `:authority`.
fn request_host(req: &Request<Incoming>) -> Option<HeaderValue> {
    if let Some(h) = req.headers().get(header::HOST) {
        return Some(h.clone());
    }
    req.uri()
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
}

fn forwarded_for(headers: &mut HeaderMap, ip: &HeaderValue) {
    match headers.get(&X_FORWARDED_FOR) {
        Some(prev) => {
            let mut v = Vec::with_capacity(prev.len() + 2 + ip.len());
            v.extend_from_slice(prev.as_bytes());
            v.extend_from_slice(b", ");
            v.extend_from_slice(ip.as_bytes());
            if let Ok(v) = HeaderValue::from_bytes(&v) {
                headers.insert(X_FORWARDED_FOR.clone(), v);
            }
        }
        None => {
            headers.insert(X_FORWARDED_FOR.clone(), ip.clone());
        }
    }
}

/// Removes hop-by-hop headers (RFC 9110 §7.6.1), including those named in `Connection`.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry at most `Connection`: one pass over the names, without hashing,
    // decides whether there is anything to do.
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    if let Some(conn) = headers.remove(header::CONNECTION)
        && let Ok(list) = conn.to_str()
    {
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            headers.remove(name);
        }
    }
    for name in [
        &header::TE,
        &header::TRANSFER_ENCODING,
        &header::UPGRADE,
        &header::TRAILER,
        &header::PROXY_AUTHENTICATE,
        &KEEP_ALIVE,
        &PROXY_CONNECTION,
    ] {
        headers.remove(name);
    }
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "te"
            | "transfer-encoding"
            | "upgrade"
            | "trailer"
            | "proxy-authenticate"
            | "keep-alive"
            | "proxy-connection"
    )
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
    fn forwarded_for_appends() {
        let mut h = HeaderMap::new();
        forwarded_for(&mut h, &HeaderValue::from_static("10.0.0.1"));
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.1");
        forwarded_for(&mut h, &HeaderValue::from_static("10.0.0.2"));
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.1, 10.0.0.2");
    }
}
