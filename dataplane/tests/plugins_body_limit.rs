//! client-control's `max_body_size` on bodies of unannounced length: chunked HTTP/1.1 and
//! HTTP/2 uploads without `content-length`, counted as they stream upstream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use sluice_testkit::EchoServer;

type Chunks =
    StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// A body of `n` chunks of `size` bytes, of unknown length (no `content-length`).
fn chunks(n: usize, size: usize) -> Chunks {
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = (0..n)
        .map(|_| Ok(Frame::data(Bytes::from(vec![b'a'; size]))))
        .collect();
    StreamBody::new(futures::stream::iter(frames))
}

fn upload(path: &str, body: Chunks) -> Request<Chunks> {
    Request::post(path)
        .header("host", "example.com")
        .body(body)
        .unwrap()
}

async fn collect(resp: http::Response<hyper::body::Incoming>) -> Resp {
    let (parts, body) = resp.into_parts();
    Resp {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// Sends `req` over HTTP/1.1 (chunked) on a new connection.
async fn send_h1(addr: SocketAddr, req: Request<Chunks>) -> Resp {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    collect(tx.send_request(req).await.unwrap()).await
}

/// Sends `req` over HTTP/2 (h2c, prior knowledge) on a new connection.
async fn send_h2(addr: SocketAddr, req: Request<Chunks>) -> Resp {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = req;
    *req.uri_mut() = format!("http://example.com{}", req.uri()).parse().unwrap();
    req.headers_mut().remove("host");
    collect(tx.send_request(req).await.unwrap()).await
}

/// An echo origin behind `/limited*` (client-control, 1000 bytes) and `/free*` (none).
async fn serve() -> (Dataplane, EchoServer) {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let snap = snapshot(
        1,
        vec![
            route_with(
                "default/r/limited",
                &["/limited*"],
                "u",
                vec![plugin("client-control", json!({"max_body_size": 1000}))],
            ),
            route("default/r/free", &["/free*"], "u"),
        ],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    dp.store.apply(snap, vec![]).unwrap();
    (dp, echo)
}

fn assert_too_large(r: &Resp) {
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.text());
    assert_eq!(r.json()["error_msg"], "413 Request Entity Too Large");
}

fn assert_from_origin(r: &Resp, len: u64) {
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["body_len"], len, "{}", r.text());
}

#[tokio::test]
async fn a_chunked_http1_body_is_limited_as_it_streams() {
    let (dp, _echo) = serve().await;
    // Under and at the limit: passes whole.
    let r = send_h1(dp.addr, upload("/limited", chunks(3, 300))).await;
    assert_from_origin(&r, 900);
    let r = send_h1(dp.addr, upload("/limited", chunks(4, 250))).await;
    assert_from_origin(&r, 1000);
    // Past it: 413, whether the first chunk or a later one crosses it.
    let r = send_h1(dp.addr, upload("/limited", chunks(5, 400))).await;
    assert_too_large(&r);
    let r = send_h1(dp.addr, upload("/limited", chunks(1, 1001))).await;
    assert_too_large(&r);
    // Another route is not limited.
    let r = send_h1(dp.addr, upload("/free", chunks(5, 400))).await;
    assert_from_origin(&r, 2000);
    // The upstream still serves (the cut connection was not pooled).
    let r = send_h1(dp.addr, upload("/limited", chunks(2, 10))).await;
    assert_from_origin(&r, 20);
}

#[tokio::test]
async fn an_http2_body_without_content_length_is_limited_as_it_streams() {
    let (dp, _echo) = serve().await;
    let r = send_h2(dp.addr, upload("/limited", chunks(3, 300))).await;
    assert_from_origin(&r, 900);
    let r = send_h2(dp.addr, upload("/limited", chunks(5, 400))).await;
    assert_too_large(&r);
    let r = send_h2(dp.addr, upload("/free", chunks(5, 400))).await;
    assert_from_origin(&r, 2000);
}

#[tokio::test]
async fn a_content_length_over_the_limit_is_refused_before_the_upstream() {
    let (dp, _echo) = serve().await;
    let r = request(dp.addr, "POST", "/limited", &[("content-length", "0")]).await;
    assert_from_origin(&r, 0);
    let req = Request::post("/limited")
        .header("host", "example.com")
        .body(http_body_util::Full::new(Bytes::from(vec![b'a'; 1001])))
        .unwrap();
    let r = send(dp.addr, req).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
}
