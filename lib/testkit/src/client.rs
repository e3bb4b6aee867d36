//! A small HTTP/1.1 test client: one request per new connection, the whole response read.
//! It panics when the exchange fails, as an assertion would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

/// A response as a client sees it.
#[derive(Debug)]
pub struct Resp {
    /// The status code.
    pub status: StatusCode,
    /// The response headers.
    pub headers: http::HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Resp {
    /// The body as JSON (panics if it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one HTTP/1.1 request on a new connection.
pub async fn send(addr: SocketAddr, req: Request<Full<Bytes>>) -> Resp {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = sender.send_request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Resp {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// `GET path` with `Host: host`.
pub async fn get(addr: SocketAddr, host: &str, path: &str) -> Resp {
    let req = Request::get(path)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .unwrap();
    send(addr, req).await
}

/// `GET path` with Host `example.com` and extra headers.
pub async fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Resp {
    request(addr, "GET", path, headers).await
}

/// Sends a bodiless `method` request for `path` with Host `example.com` and `headers`.
pub async fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
    request_with_body(addr, method, path, headers, Bytes::new()).await
}

/// Sends `method path` with Host `example.com`, `headers` and `body`.
pub async fn request_with_body(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Resp {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "example.com");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(addr, b.body(Full::new(body)).unwrap()).await
}

/// A response header as text.
pub fn h<'a>(r: &'a Resp, name: &str) -> Option<&'a str> {
    r.headers.get(name).map(|v| v.to_str().unwrap())
}

/// Whether the response came from an [`EchoServer`](crate::EchoServer) (it answers JSON
/// with the request's path).
pub fn from_origin(r: &Resp) -> bool {
    serde_json::from_slice::<serde_json::Value>(&r.body).is_ok_and(|v| v.get("path").is_some())
}
