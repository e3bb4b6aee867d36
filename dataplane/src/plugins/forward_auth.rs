//! `forward-auth` (priority 2002, rewrite phase): asks an external HTTP service whether a
//! request may pass, as APISIX does.
//!
//! The service gets a `GET` for the configured URL with `X-Forwarded-Proto`,
//! `X-Forwarded-Method`, `X-Forwarded-Host` (the Host without port), `X-Forwarded-Uri`
//! (path and query) and `X-Forwarded-For` (the client address, after real-ip) set by
//! Sluice, plus the client's headers named in `request_headers` (never overriding the
//! `X-Forwarded-*` ones; hop-by-hop and framing headers are not copied). No other client
//! header reaches it.
//!
//! With `request_method: POST` it gets a `POST` instead, whose body is the client's body,
//! read whole first (before the service is asked; the upstream then gets the same bytes),
//! with the client's `Content-Encoding` and a `Content-Length` of its own, as APISIX 3.18
//! re-frames it. A body over `max_req_body_size` (64 MiB), or over client-control's
//! smaller `max_body_size`, is answered 413 `{"error_msg":"413 Request Entity Too
//! Large"}` (client-control's answer) without asking the service; a client that stalls
//! longer than its body timeout gets 408. With `GET` the body is never read: it streams
//! to the upstream after the answer.
//!
//! - A 2xx answer lets the request go on; each header of `upstream_headers` is set on the
//!   upstream request from the answer (removed when the answer lacks it, so that a client
//!   cannot inject it).
//! - Any other answer is sent to the client: its status, its body (at most
//!   [`MAX_AUTH_BODY`] bytes; the rest is dropped) and the headers of `client_headers`.
//! - When the service cannot be reached, or does not answer within `timeout` (the whole
//!   exchange: connect, TLS, request, answer head and body), the client gets
//!   `status_on_error` (403) with an empty body, or the request goes on with
//!   `allow_degradation`, stripped of the client's copies of the `upstream_headers` (a
//!   stricter rule than APISIX's, which lets them through: the upstream trusts them).
//!
//! Connections are HTTP/1.1 (hyper's client), kept per service URL in a pool of at most
//! `keepalive_pool` idle connections, each closed after `keepalive_timeout` idle (checked
//! when a connection is taken). Only the error is logged, never a header.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use sluice_plugin_config::forward_auth::{ForwardAuth as Config, RequestMethod, Target};
use sluice_plugin_config::vars::Var;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{
    BodyRefusal, BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx, read_whole_body, rejection,
    support::vars,
};
use crate::upstream::body::ProxyBody;
use crate::upstream::tls::{Alpn, UpstreamTlsClient};

/// Most bytes of the service's answer body kept (sent to the client on a denial); the rest
/// is dropped and the connection is not reused.
pub const MAX_AUTH_BODY: usize = 64 * 1024;

const X_FORWARDED: [&str; 5] = [
    "x-forwarded-proto",
    "x-forwarded-method",
    "x-forwarded-host",
    "x-forwarded-uri",
    "x-forwarded-for",
];

/// Client headers never copied to the service even when listed: they describe the
/// client's connection or body, not the request.
const NOT_COPIED: [HeaderName; 8] = [
    header::CONNECTION,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::TE,
    header::UPGRADE,
    header::EXPECT,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// The plugin on one route.
#[derive(Debug)]
pub struct ForwardAuth {
    request_headers: Vec<HeaderName>,
    upstream_headers: Vec<HeaderName>,
    client_headers: Vec<HeaderName>,
    /// `request_method: POST`: the client's body goes along, at most this many bytes.
    post_body_cap: Option<u64>,
    timeout: Duration,
    allow_degradation: bool,
    status_on_error: StatusCode,
    client: Arc<AuthClient>,
}

impl Builtin for ForwardAuth {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE.with(Hooks::ACCESS).with(Hooks::READS_BODY);

    /// Builds `forward-auth`.
    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let field = |field: &str, reason: String| ConfigError::Field {
            plugin: Config::NAME.into(),
            field: field.into(),
            reason,
        };
        let target = conf.target().map_err(|e| field(&e.field, e.reason))?;
        let names = |list: &[String]| -> Vec<HeaderName> {
            // Checked by the config already.
            list.iter()
                .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
                .collect()
        };
        let tls = if target.tls {
            Some(
                UpstreamTlsClient::for_probes(None, None, conf.ssl_verify)
                    .map_err(|e| field("uri", e.to_string()))?,
            )
        } else {
            None
        };
        let host_header = HeaderValue::from_str(&target.authority)
            .map_err(|_| field("uri", "host is not a valid Host header".into()))?;
        // NB: one pool per service and connection settings, shared by routes and kept across
        // snapshots.
        let key = format!(
            "forward-auth:{}:{}:{}:{}:{}",
            conf.uri, conf.ssl_verify, conf.keepalive, conf.keepalive_timeout, conf.keepalive_pool
        );
        let client = cx.state.shared(&key, || AuthClient {
            dial: if target.host.contains(':') {
                format!("[{}]:{}", target.host, target.port)
            } else {
                format!("{}:{}", target.host, target.port)
            },
            target,
            host_header,
            tls,
            keepalive: conf.keepalive,
            keepalive_timeout: Duration::from_millis(conf.keepalive_timeout),
            pool_max: usize::try_from(conf.keepalive_pool).unwrap_or(usize::MAX),
            idle: Mutex::new(Vec::new()),
        });
        Ok(ForwardAuth {
            request_headers: names(&conf.request_headers),
            upstream_headers: names(&conf.upstream_headers),
            client_headers: names(&conf.client_headers),
            post_body_cap: (conf.request_method == RequestMethod::Post)
                .then_some(conf.max_req_body_size),
            timeout: Duration::from_millis(conf.timeout),
            allow_degradation: conf.allow_degradation,
            status_on_error: super::status(conf.status_on_error),
            client,
        })
    }

    fn hooks(&self) -> Hooks {
        if self.post_body_cap.is_some() {
            Self::HOOKS
        } else {
            Self::HOOKS.without(Hooks::READS_BODY)
        }
    }
}

/// Marks a request whose rewrite phase asked the service already (the access phase then
/// does nothing, as APISIX's `ctx.forward_auth_processed`).
#[derive(Debug, Clone, Copy)]
struct Processed;

impl ForwardAuth {
    /// The head of the request to the service for the client's request `req`.
    fn auth_request(&self, req: &request::Parts, ctx: &PluginCtx) -> Request<()> {
        let t = &self.client.target;
        let mut out = Request::new(());
        *out.method_mut() = if self.post_body_cap.is_some() {
            Method::POST
        } else {
            Method::GET
        };
        if let Ok(uri) = t.path_and_query.parse() {
            *out.uri_mut() = uri;
        }
        let h = out.headers_mut();
        h.insert(header::HOST, self.client.host_header.clone());
        for name in &self.request_headers {
            if X_FORWARDED.contains(&name.as_str()) || NOT_COPIED.contains(name) {
                continue;
            }
            // NB: a listed `Host` replaces the service's, as in APISIX (only when the
            // client sent one: HTTP/2 requests carry none).
            if *name == header::HOST && req.headers.contains_key(header::HOST) {
                h.remove(header::HOST);
            }
            for v in req.headers.get_all(name) {
                h.append(name.clone(), v.clone());
            }
        }
        let text = |s: &str| HeaderValue::from_str(s).ok();
        let set = |h: &mut HeaderMap, i: usize, v: Option<HeaderValue>| {
            if let Some(v) = v {
                h.insert(HeaderName::from_static(X_FORWARDED[i]), v);
            }
        };
        set(h, 0, Some(HeaderValue::from_static(ctx.scheme)));
        set(h, 1, text(req.method.as_str()));
        set(h, 2, vars::get(&Var::Host, req, ctx).and_then(|v| text(&v)));
        set(
            h,
            3,
            text(req.uri.path_and_query().map_or("/", |p| p.as_str())),
        );
        set(h, 4, text(&ctx.remote_addr.ip().to_canonical().to_string()));
        if self.post_body_cap.is_some() {
            // NB: the body is sent as read, still encoded: the service must know how.
            h.remove(header::CONTENT_ENCODING);
            for v in req.headers.get_all(header::CONTENT_ENCODING) {
                h.append(header::CONTENT_ENCODING, v.clone());
            }
        }
        out
    }

    fn check<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        ctx.extensions.insert(Processed);
        Flow::Pending(Box::pin(async move {
            let body = match self.post_body_cap {
                None => Bytes::new(),
                Some(cap) => match read_whole_body(req, ctx, cap, Config::NAME).await {
                    Ok(body) => body,
                    Err(BodyRefusal::Answer(resp)) => return Err(resp),
                    Err(BodyRefusal::TooLarge) => {
                        return Err(Box::new(rejection(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            Some("413 Request Entity Too Large"),
                        )));
                    }
                },
            };
            let auth = self.auth_request(req, ctx);
            let answer = tokio::time::timeout(self.timeout, self.client.call(auth, body)).await;
            let answer = match answer {
                Ok(Ok(a)) => a,
                Ok(Err(e)) => return self.unreachable(req, ctx, &e),
                Err(_) => return self.unreachable(req, ctx, "timed out"),
            };
            if answer.status.is_success() {
                for name in &self.upstream_headers {
                    req.headers.remove(name);
                    for v in answer.headers.get_all(name) {
                        req.headers.append(name.clone(), v.clone());
                    }
                }
                return Ok(());
            }
            let mut resp = Response::new(if answer.body.is_empty() {
                ProxyBody::empty()
            } else {
                ProxyBody::full(answer.body)
            });
            *resp.status_mut() = answer.status;
            for name in &self.client_headers {
                for v in answer.headers.get_all(name) {
                    resp.headers_mut().append(name.clone(), v.clone());
                }
            }
            Err(Box::new(resp))
        }))
    }

    /// The service failed: `status_on_error`, or with `allow_degradation` the request goes
    /// on without any client-sent copy of the `upstream_headers` (the upstream trusts them
    /// as the service's; a client must not set them by making the service unreachable).
    fn unreachable(
        &self,
        req: &mut request::Parts,
        ctx: &PluginCtx,
        error: &str,
    ) -> super::PhaseResult {
        tracing::warn!(
            route = %ctx.chain.route_id,
            service = %self.client.dial,
            error,
            degraded = self.allow_degradation,
            "forward-auth: the authorization service failed"
        );
        if self.allow_degradation {
            for name in &self.upstream_headers {
                req.headers.remove(name);
            }
            Ok(())
        } else {
            Err(Box::new(rejection(self.status_on_error, None)))
        }
    }
}

impl Plugin for ForwardAuth {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        self.check(req, ctx)
    }

    /// Only when the rewrite phase did not run (the plugin came with a consumer's plugins).
    fn access<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        if ctx.extensions.get::<Processed>().is_some() {
            return Flow::Continue;
        }
        self.check(req, ctx)
    }
}

/// The service's answer: status, headers and at most [`MAX_AUTH_BODY`] bytes of body.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

/// HTTP/1.1 connections to one authorization service.
struct AuthClient {
    target: Target,
    /// `host:port` to dial (`[v6]:port`).
    dial: String,
    host_header: HeaderValue,
    tls: Option<UpstreamTlsClient>,
    keepalive: bool,
    keepalive_timeout: Duration,
    pool_max: usize,
    /// Idle connections, most recently used last, with when they went idle.
    idle: Mutex<Vec<(SendRequest<Full<Bytes>>, Instant)>>,
}

impl std::fmt::Debug for AuthClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthClient")
            .field("dial", &self.dial)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl AuthClient {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(SendRequest<Full<Bytes>>, Instant)>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle connection that is still open and fresh, if any.
    fn checkout(&self) -> Option<SendRequest<Full<Bytes>>> {
        let now = Instant::now();
        let mut idle = self.lock();
        while let Some((tx, since)) = idle.pop() {
            if !tx.is_closed() && now.duration_since(since) < self.keepalive_timeout {
                return Some(tx);
            }
        }
        None
    }

    fn checkin(&self, tx: SendRequest<Full<Bytes>>) {
        if !self.keepalive || tx.is_closed() {
            return;
        }
        let mut idle = self.lock();
        if idle.len() >= self.pool_max {
            // The oldest goes.
            idle.remove(0);
        }
        idle.push((tx, Instant::now()));
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let tcp = tokio::net::TcpStream::connect(self.dial.as_str())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let (tx, conn) = match &self.tls {
            Some(tls) => {
                let stream = tls
                    .connect(tcp, &self.dial, Alpn::Http11)
                    .await
                    .map_err(|e| format!("TLS: {e}"))?;
                let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(|e| format!("handshake: {e}"))?;
                (tx, tokio::spawn(conn))
            }
            None => {
                let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                    .await
                    .map_err(|e| format!("handshake: {e}"))?;
                (tx, tokio::spawn(conn))
            }
        };
        drop(conn);
        Ok(tx)
    }

    /// Sends `head` with `body` on a kept connection, or a new one; a kept connection that
    /// fails before an answer (the service closed it meanwhile) is retried once on a new
    /// connection.
    async fn call(&self, head: Request<()>, body: Bytes) -> Result<Answer, String> {
        let (parts, ()) = head.into_parts();
        if self.keepalive
            && let Some(mut tx) = self.checkout()
        {
            let retry = Request::from_parts(parts.clone(), Full::new(body.clone()));
            if tx.ready().await.is_ok() {
                match tx
                    .send_request(Request::from_parts(parts, Full::new(body)))
                    .await
                {
                    Ok(resp) => return self.read(tx, resp).await,
                    Err(e) if !e.is_canceled() && !e.is_incomplete_message() => {
                        return Err(format!("request: {e}"));
                    }
                    Err(_) => {}
                }
            }
            return self.call_new(retry).await;
        }
        self.call_new(Request::from_parts(parts, Full::new(body)))
            .await
    }

    async fn call_new(&self, req: Request<Full<Bytes>>) -> Result<Answer, String> {
        let mut tx = self.connect().await?;
        tx.ready().await.map_err(|e| format!("connection: {e}"))?;
        let resp = tx
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        self.read(tx, resp).await
    }

    /// Reads the answer's body, at most [`MAX_AUTH_BODY`] bytes kept; the connection goes
    /// back to the pool only when the body was read to its end.
    async fn read(
        &self,
        tx: SendRequest<Full<Bytes>>,
        resp: Response<hyper::body::Incoming>,
    ) -> Result<Answer, String> {
        let (parts, mut body) = resp.into_parts();
        let mut kept = BytesMut::new();
        let mut whole = true;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("answer body: {e}"))?;
            if let Ok(data) = frame.into_data() {
                let room = MAX_AUTH_BODY - kept.len();
                if data.len() > room {
                    kept.extend_from_slice(&data[..room]);
                    whole = false;
                    break;
                }
                kept.extend_from_slice(&data);
            }
        }
        if whole {
            self.checkin(tx);
        }
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body: kept.freeze(),
        })
    }
}
