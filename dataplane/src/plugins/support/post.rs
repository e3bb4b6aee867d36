//! One kept-alive HTTP/1.1 connection that `POST`s batches to a server (http-logger's log
//! server, opentelemetry's collector), off the request path.
//!
//! An answer below 400 delivers the batch; anything else, a connection error or no answer
//! within the timeout fails it. The connection is kept alive between batches; a kept
//! connection the server closed meanwhile fails before an answer, and the batch then goes
//! once more on a new connection. NB: header values (credentials) never reach a log line or
//! an error message.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use crate::upstream::tls::{Alpn, UpstreamTlsClient};

/// Most bytes of the server's answer read (the rest closes the connection).
const MAX_ANSWER: usize = 64 * 1024;

/// Posts batches to one server.
pub struct HttpPost {
    /// `host:port` to connect to (IPv6 in brackets).
    dial: String,
    /// `host[:port]` as configured, in error messages.
    authority: String,
    /// Path and query of each request.
    path_and_query: String,
    host: HeaderValue,
    headers: Vec<(HeaderName, HeaderValue)>,
    tls: Option<UpstreamTlsClient>,
    timeout: Duration,
    /// The kept-alive connection.
    conn: Option<SendRequest<Full<Bytes>>>,
}

impl std::fmt::Debug for HttpPost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpPost")
            .field("dial", &self.dial)
            .field("path_and_query", &self.path_and_query)
            .finish_non_exhaustive()
    }
}

impl HttpPost {
    /// Posts to `path_and_query` on `host:port` (TLS with `tls`), with `Host: authority`
    /// and `headers` (marked sensitive), each exchange bounded by `timeout`. `Err` when
    /// `authority` is no valid `Host` value.
    pub fn new(
        host: &str,
        port: u16,
        authority: &str,
        path_and_query: &str,
        tls: Option<UpstreamTlsClient>,
        headers: Vec<(HeaderName, HeaderValue)>,
        timeout: Duration,
    ) -> Result<Self, String> {
        let host_value = HeaderValue::from_str(authority)
            .map_err(|_| "host is not a valid Host header".to_owned())?;
        Ok(HttpPost {
            dial: if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            },
            authority: authority.to_owned(),
            path_and_query: path_and_query.to_owned(),
            host: host_value,
            headers: headers
                .into_iter()
                .map(|(k, mut v)| {
                    v.set_sensitive(true);
                    (k, v)
                })
                .collect(),
            tls,
            timeout,
            conn: None,
        })
    }

    /// Sends `body` with `Content-Type: content_type`; `Ok` when the server answered
    /// below 400 within the timeout.
    pub async fn post(&mut self, body: Bytes, content_type: &'static str) -> Result<(), String> {
        match tokio::time::timeout(self.timeout, self.exchange(body, content_type)).await {
            Ok(r) => r,
            Err(_) => {
                // NB: a connection that timed out mid-exchange is never reused.
                self.conn = None;
                Err(format!(
                    "{} did not answer within {:?}",
                    self.authority, self.timeout
                ))
            }
        }
    }

    fn request(&self, body: Bytes, ct: &'static str) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = Method::POST;
        if let Ok(uri) = self.path_and_query.parse() {
            *req.uri_mut() = uri;
        }
        let h = req.headers_mut();
        h.insert(header::HOST, self.host.clone());
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
        for (k, v) in &self.headers {
            h.insert(k.clone(), v.clone());
        }
        req
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let tcp = tokio::net::TcpStream::connect(self.dial.as_str())
            .await
            .map_err(|e| format!("connect {}: {e}", self.dial))?;
        let _ = tcp.set_nodelay(true);
        let tx = match &self.tls {
            Some(tls) => {
                let stream = tls
                    .connect(tcp, &self.dial, Alpn::Http11)
                    .await
                    .map_err(|e| format!("TLS with {}: {e}", self.dial))?;
                let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(|e| format!("handshake: {e}"))?;
                tokio::spawn(conn);
                tx
            }
            None => {
                let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                    .await
                    .map_err(|e| format!("handshake: {e}"))?;
                tokio::spawn(conn);
                tx
            }
        };
        Ok(tx)
    }

    /// One exchange, on the kept connection when there is one.
    async fn exchange(&mut self, body: Bytes, ct: &'static str) -> Result<(), String> {
        if let Some(mut tx) = self.conn.take()
            && tx.ready().await.is_ok()
        {
            match tx.send_request(self.request(body.clone(), ct)).await {
                Ok(resp) => return self.answer(tx, resp).await,
                Err(e) if !e.is_canceled() && !e.is_incomplete_message() => {
                    return Err(format!("request to {}: {e}", self.dial));
                }
                Err(_) => {}
            }
        }
        let mut tx = self.connect().await?;
        tx.ready().await.map_err(|e| format!("connection: {e}"))?;
        let resp = tx
            .send_request(self.request(body, ct))
            .await
            .map_err(|e| format!("request to {}: {e}", self.dial))?;
        self.answer(tx, resp).await
    }

    /// Reads the answer; the connection is kept when its body was read to the end.
    async fn answer(
        &mut self,
        tx: SendRequest<Full<Bytes>>,
        resp: http::Response<hyper::body::Incoming>,
    ) -> Result<(), String> {
        let status = resp.status();
        let mut body = resp.into_body();
        let mut kept = BytesMut::new();
        let mut whole = true;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("answer body: {e}"))?;
            if let Ok(data) = frame.into_data() {
                if kept.len() + data.len() > MAX_ANSWER {
                    whole = false;
                    break;
                }
                kept.extend_from_slice(&data);
            }
        }
        if whole {
            self.conn = Some(tx);
        }
        if status.as_u16() >= 400 {
            let shown = String::from_utf8_lossy(&kept[..kept.len().min(256)]).into_owned();
            return Err(format!("{} answered {status}: {shown:?}", self.authority));
        }
        Ok(())
    }
}
