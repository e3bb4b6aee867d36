//! `http-logger` (priority 410, log phase): APISIX's access-log entry, sent in batches
//! to an HTTP(S) server by a task off the request path ([`super::log`]).
//!
//! Each batch is one `POST` to `uri` (path and query as written) with `Host` from the URL,
//! `Content-Type: application/json` (`concat_method: json`: a JSON array, or the single
//! object when `batch_max_size` is 1) or `text/plain` (`new_line`: one JSON object per
//! line) and `Authorization: <auth_header>` when set. An answer below 400 delivers the
//! batch; anything else, a connection error or no answer within `timeout` seconds fails
//! it (retried `max_retry_count` times, `retry_delay` seconds apart, then dropped and
//! counted). One HTTP/1.1 connection per logger is kept alive between batches.
//!
//! NB: the `auth_header` value never reaches a log line or an error message.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use sluice_plugin_config::forward_auth::Target;
use sluice_plugin_config::http_logger::{ConcatMethod, HttpLogger as Config};
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::log::{Batcher, Logger, Policy, Sink};
use super::{BuildCtx, Plugin};
use crate::upstream::tls::{Alpn, UpstreamTlsClient};

/// Most bytes of the log server's answer read (the rest closes the connection).
const MAX_ANSWER: usize = 64 * 1024;

/// Builds `http-logger`.
pub fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Arc<dyn Plugin>, ConfigError> {
    let conf: Config = sluice_plugin_config::parse_json(json)?;
    let field = |field: &str, reason: String| ConfigError::Field {
        plugin: Config::NAME.into(),
        field: field.into(),
        reason,
    };
    let target = conf.target().map_err(|e| field(&e.field, e.reason))?;
    let format = conf.format().map_err(|e| field(&e.field, e.reason))?;
    let tls = if target.tls {
        Some(
            UpstreamTlsClient::for_probes(None, None, conf.ssl_verify)
                .map_err(|e| field("uri", e.to_string()))?,
        )
    } else {
        None
    };
    let host = HeaderValue::from_str(&target.authority)
        .map_err(|_| field("uri", "host is not a valid Host header".into()))?;
    let auth = match &conf.auth_header {
        Some(a) => Some(
            HeaderValue::from_str(a)
                .map_err(|_| field("auth_header", "is not a valid header value".into()))?,
        ),
        None => None,
    };
    // NB: one queue and task per route and config, kept across snapshots while both are.
    let key = format!("http-logger:{}:{json}", cx.owner);
    let metrics = &cx.state.log_metrics;
    let owner = cx.owner;
    let batcher = cx.state.shared(&key, || {
        let policy = Policy {
            max_size: usize::try_from(conf.batch_max_size).unwrap_or(usize::MAX),
            inactive: Some(Duration::from_secs(conf.inactive_timeout)),
            buffer_duration: Duration::from_secs(conf.buffer_duration),
            max_retries: conf.max_retry_count,
            retry_delay: Duration::from_secs(conf.retry_delay),
        };
        let sink = HttpSink {
            dial: if target.host.contains(':') {
                format!("[{}]:{}", target.host, target.port)
            } else {
                format!("{}:{}", target.host, target.port)
            },
            target,
            host,
            auth,
            tls,
            timeout: Duration::from_secs(conf.timeout),
            concat: conf.concat_method,
            single: conf.batch_max_size == 1,
            conn: None,
            name: conf.name.clone(),
        };
        Batcher::start(Config::NAME, owner, policy, sink, metrics)
    });
    Ok(Arc::new(Logger::new(
        Config::NAME,
        Config::PRIORITY,
        format,
        conf.include_resp_body.then_some(conf.max_resp_body_bytes),
        batcher,
    )))
}

/// Sends batches to one log server.
struct HttpSink {
    target: Target,
    dial: String,
    host: HeaderValue,
    auth: Option<HeaderValue>,
    tls: Option<UpstreamTlsClient>,
    timeout: Duration,
    concat: ConcatMethod,
    /// `batch_max_size: 1`: a batch is one JSON object, not an array.
    single: bool,
    /// The kept-alive connection.
    conn: Option<SendRequest<Full<Bytes>>>,
    /// `name`, for Sluice's own log lines.
    name: String,
}

impl HttpSink {
    fn body(&self, batch: &[String]) -> (Bytes, &'static str) {
        let len: usize = batch.iter().map(|e| e.len() + 1).sum::<usize>() + 2;
        let mut b = Vec::with_capacity(len);
        match self.concat {
            ConcatMethod::Json if self.single && batch.len() == 1 => {
                b.extend_from_slice(batch[0].as_bytes());
            }
            ConcatMethod::Json => {
                b.push(b'[');
                for (i, e) in batch.iter().enumerate() {
                    if i > 0 {
                        b.push(b',');
                    }
                    b.extend_from_slice(e.as_bytes());
                }
                b.push(b']');
            }
            ConcatMethod::NewLine => {
                for (i, e) in batch.iter().enumerate() {
                    if i > 0 {
                        b.push(b'\n');
                    }
                    b.extend_from_slice(e.as_bytes());
                }
            }
        }
        let ct = match self.concat {
            ConcatMethod::Json => "application/json",
            ConcatMethod::NewLine => "text/plain",
        };
        (Bytes::from(b), ct)
    }

    fn request(&self, body: Bytes, ct: &'static str) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = Method::POST;
        if let Ok(uri) = self.target.path_and_query.parse() {
            *req.uri_mut() = uri;
        }
        let h = req.headers_mut();
        h.insert(header::HOST, self.host.clone());
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
        if let Some(a) = &self.auth {
            let mut a = a.clone();
            a.set_sensitive(true);
            h.insert(header::AUTHORIZATION, a);
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

    /// One exchange, on the kept connection when there is one: a kept connection the
    /// server closed meanwhile fails before an answer, and the batch then goes once more
    /// on a new connection.
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
            return Err(format!(
                "{} answered {status}: {shown:?}",
                self.target.authority
            ));
        }
        Ok(())
    }
}

impl Sink for HttpSink {
    fn name(&self) -> &str {
        &self.name
    }

    async fn send(&mut self, batch: &[String]) -> Result<(), String> {
        let (body, ct) = self.body(batch);
        match tokio::time::timeout(self.timeout, self.exchange(body, ct)).await {
            Ok(r) => r,
            Err(_) => {
                // NB: a connection that timed out mid-exchange is never reused.
                self.conn = None;
                Err(format!(
                    "{} did not answer within {:?}",
                    self.target.authority, self.timeout
                ))
            }
        }
    }
}
