//! `proxy-mirror` (priority 1010): sends a copy of the request to a mirror service and
//! ignores its answer, as APISIX does; the client's request and response never wait for
//! the mirror.
//!
//! - **Which requests**: a share `sample_ratio` of those that reach an upstream (a request
//!   a plugin answers, e.g. an auth failure, is not mirrored); never a WebSocket upgrade.
//! - **What the mirror gets** (HTTP/1.1): the method; the target computed in the rewrite
//!   phase as APISIX does (the request's path and query, or `path` instead of the path,
//!   or `path` before it with `path_concat_mode: prefix`); the request's headers as the
//!   upstream would get them from the plugins (proxy-rewrite's changes included, before
//!   Sluice's `X-Forwarded-*` and the upstream's `passHost`), hop-by-hop ones left out; and
//!   the body.
//! - **Body**: copied as it streams to the upstream, at most [`MAX_MIRROR_BODY`] bytes; the
//!   mirror request leaves once the whole body has gone upstream. A larger body (announced
//!   or not) is not copied and that request is not mirrored
//!   (`sluice_mirror_dropped_total{reason="body_too_large"}`), nor one whose body did not
//!   end (`reason="body_incomplete"`). The upstream gets the client's body unchanged.
//! - **Bounds**: at most [`MAX_IN_FLIGHT`] mirror requests per mirror service and process;
//!   a request beyond that is not mirrored (`reason="queue_full"`). Each mirror request has
//!   [`CONNECT_TIMEOUT`] to connect and [`MIRROR_TIMEOUT`] in all; its answer body is read
//!   (at most [`MAX_ANSWER_BODY`] bytes) and dropped. Outcomes are counted in
//!   `sluice_mirror_requests_total{result="ok"|"error"|"timeout"}`.
//! - `https://` mirrors are verified against the system roots (APISIX, as nginx's
//!   `proxy_ssl_verify off`, does not verify).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Version, request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use sluice_plugin_config::proxy_mirror::{MirrorTarget, PathConcatMode, ProxyMirror as Config};
use sluice_plugin_config::{ConfigError, PluginSchema};
use tokio::sync::Semaphore;

use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx};
use crate::upstream::request_body::{BodyTap, TapLoss};
use crate::upstream::tls::{Alpn, UpstreamTlsClient};

/// Largest request body copied to the mirror; a request with a larger body is not mirrored.
pub const MAX_MIRROR_BODY: usize = 1024 * 1024;
/// Most mirror requests in flight per mirror service and process.
pub const MAX_IN_FLIGHT: usize = 64;
/// Time to connect to the mirror (TCP and TLS).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time for one mirror request in all: connect, send, answer head and body.
pub const MIRROR_TIMEOUT: Duration = Duration::from_secs(15);
/// Most answer-body bytes read (and dropped) to keep the connection; past it the
/// connection is closed.
pub const MAX_ANSWER_BODY: usize = 64 * 1024;
/// Most idle keep-alive connections kept per mirror service.
const MAX_IDLE: usize = 16;
/// Idle time after which a kept connection is not reused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Process-wide counts of the mirror, rendered on `/metrics`.
#[derive(Debug, Default)]
pub struct MirrorMetrics {
    queue_full: AtomicU64,
    body_too_large: AtomicU64,
    body_incomplete: AtomicU64,
    ok: AtomicU64,
    error: AtomicU64,
    timeout: AtomicU64,
}

impl MirrorMetrics {
    /// Appends `sluice_mirror_dropped_total` and `sluice_mirror_requests_total`.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = writeln!(
            out,
            "# HELP sluice_mirror_dropped_total Requests proxy-mirror did not mirror, by reason\n\
             # TYPE sluice_mirror_dropped_total counter"
        );
        for (reason, n) in [
            ("body_incomplete", &self.body_incomplete),
            ("body_too_large", &self.body_too_large),
            ("queue_full", &self.queue_full),
        ] {
            let _ = writeln!(
                out,
                "sluice_mirror_dropped_total{{reason=\"{reason}\"}} {}",
                n.load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP sluice_mirror_requests_total Mirror requests sent by proxy-mirror, by result\n\
             # TYPE sluice_mirror_requests_total counter"
        );
        for (result, n) in [
            ("error", &self.error),
            ("ok", &self.ok),
            ("timeout", &self.timeout),
        ] {
            let _ = writeln!(
                out,
                "sluice_mirror_requests_total{{result=\"{result}\"}} {}",
                n.load(Relaxed)
            );
        }
    }
}

/// The plugin on one route.
#[derive(Debug)]
pub struct ProxyMirror {
    /// Tells this mirror's target apart from another mirror's on the same route.
    id: u64,
    path: Option<String>,
    mode: PathConcatMode,
    sample_ratio: f64,
    client: Arc<MirrorClient>,
    metrics: Arc<MirrorMetrics>,
}

impl Builtin for ProxyMirror {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE.with(Hooks::BEFORE_PROXY);

    /// Builds `proxy-mirror`.
    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let field = |field: &str, reason: String| ConfigError::Field {
            plugin: Config::NAME.into(),
            field: field.into(),
            reason,
        };
        let target = conf.target().map_err(|e| field(&e.field, e.reason))?;
        let tls = if target.tls {
            Some(
                UpstreamTlsClient::for_probes(None, None, true)
                    .map_err(|e| field("host", e.to_string()))?,
            )
        } else {
            None
        };
        // NB: one client (connections, in-flight bound) per mirror service, shared by routes
        // and kept across snapshots.
        let key = format!("proxy-mirror:{}", conf.host);
        let client = cx.state.shared(&key, || MirrorClient {
            dial: target.dial(),
            target,
            tls,
            permits: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            idle: Mutex::new(Vec::new()),
        });
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Ok(ProxyMirror {
            id: NEXT_ID.fetch_add(1, Relaxed),
            path: conf.path,
            mode: conf.path_concat_mode,
            sample_ratio: conf.sample_ratio,
            client,
            metrics: Arc::clone(&cx.state.mirror),
        })
    }
}

/// The targets of this request's mirrors (by [`ProxyMirror::id`]: a route may have several,
/// e.g. a Gateway API rule with two `RequestMirror` filters), chosen in the rewrite phase.
#[derive(Debug, Clone, Default)]
struct MirrorUris(Vec<(u64, String)>);

impl ProxyMirror {
    /// The mirror's request target for a request to `req.uri`, as APISIX computes it.
    fn target_of(&self, req: &request::Parts) -> String {
        let pq = req.uri.path_and_query().map_or("/", |p| p.as_str());
        match (&self.path, self.mode) {
            (None, _) => pq.to_owned(),
            (Some(p), PathConcatMode::Prefix) => format!("{p}{pq}"),
            (Some(p), PathConcatMode::Replace) => match req.uri.query() {
                Some(q) => format!("{p}?{q}"),
                None => p.clone(),
            },
        }
    }

    /// The mirror's request head from the upstream request's `req`.
    fn mirror_head(&self, req: &request::Parts, target: &str) -> Option<request::Parts> {
        let mut out = Request::new(());
        *out.method_mut() = req.method.clone();
        *out.uri_mut() = target.parse().ok()?;
        *out.version_mut() = Version::HTTP_11;
        let headers = out.headers_mut();
        headers.clone_from(&req.headers);
        // Framing is the mirror body's own; the whole body is there, nothing to expect.
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::TRANSFER_ENCODING);
        headers.remove(header::EXPECT);
        headers.remove(header::TE);
        headers.remove(header::UPGRADE);
        headers.remove(header::CONNECTION);
        if !headers.contains_key(header::HOST)
            && let Some(a) = req.uri.authority()
            && let Ok(v) = HeaderValue::from_str(a.as_str())
        {
            // An HTTP/2 client's `:authority`.
            headers.insert(header::HOST, v);
        }
        Some(out.into_parts().0)
    }
}

impl Plugin for ProxyMirror {
    /// Samples the request and fixes the mirror's target (as APISIX, before proxy-rewrite
    /// changes the upstream path).
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        if self.sample_ratio >= 1.0 || fastrand::f64() < self.sample_ratio {
            let target = self.target_of(req);
            match ctx.extensions.get_mut::<MirrorUris>() {
                Some(MirrorUris(uris)) => uris.push((self.id, target)),
                None => {
                    ctx.extensions.insert(MirrorUris(vec![(self.id, target)]));
                }
            }
        }
        Flow::Continue
    }

    /// The request goes upstream: the mirror request is spawned, to leave once the body
    /// has been copied.
    fn before_proxy(&self, req: &mut request::Parts, ctx: &mut PluginCtx) {
        let Some(MirrorUris(uris)) = ctx.extensions.get_mut::<MirrorUris>() else {
            return;
        };
        let Some(at) = uris.iter().position(|(id, _)| *id == self.id) else {
            return;
        };
        let (_, target) = uris.swap_remove(at);
        let Ok(permit) = Arc::clone(&self.client.permits).try_acquire_owned() else {
            self.metrics.queue_full.fetch_add(1, Relaxed);
            return;
        };
        let Some(head) = self.mirror_head(req, &target) else {
            return;
        };
        let (tap, body) = BodyTap::new(MAX_MIRROR_BODY);
        tap.attach(&mut req.extensions);
        let client = Arc::clone(&self.client);
        let metrics = Arc::clone(&self.metrics);
        tokio::spawn(async move {
            let _permit = permit;
            let body = match body.await {
                Ok(Ok(body)) => body,
                Ok(Err(TapLoss::TooLarge)) => {
                    metrics.body_too_large.fetch_add(1, Relaxed);
                    return;
                }
                Ok(Err(TapLoss::Incomplete)) => {
                    metrics.body_incomplete.fetch_add(1, Relaxed);
                    return;
                }
                // Not proxied after all (an upgrade): nothing to mirror.
                Err(_) => return,
            };
            let req = Request::from_parts(head, Full::new(body));
            match tokio::time::timeout(MIRROR_TIMEOUT, client.call(req)).await {
                Ok(Ok(())) => metrics.ok.fetch_add(1, Relaxed),
                Ok(Err(e)) => {
                    tracing::debug!(mirror = %client.dial, error = %e, "proxy-mirror: the mirror failed");
                    metrics.error.fetch_add(1, Relaxed)
                }
                Err(_) => metrics.timeout.fetch_add(1, Relaxed),
            };
        });
    }
}

type Sender = SendRequest<Full<Bytes>>;

/// HTTP/1.1 connections to one mirror service.
struct MirrorClient {
    target: MirrorTarget,
    /// `host:port` to dial.
    dial: String,
    tls: Option<UpstreamTlsClient>,
    /// Mirror requests in flight (at most [`MAX_IN_FLIGHT`]).
    permits: Arc<Semaphore>,
    /// Idle connections, most recently used last, with when they went idle.
    idle: Mutex<Vec<(Sender, Instant)>>,
}

impl std::fmt::Debug for MirrorClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirrorClient")
            .field("dial", &self.dial)
            .field("tls", &self.target.tls)
            .finish_non_exhaustive()
    }
}

impl MirrorClient {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Sender, Instant)>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn checkout(&self) -> Option<Sender> {
        let now = Instant::now();
        let mut idle = self.lock();
        while let Some((tx, since)) = idle.pop() {
            if !tx.is_closed() && now.duration_since(since) < IDLE_TIMEOUT {
                return Some(tx);
            }
        }
        None
    }

    fn checkin(&self, tx: Sender) {
        if tx.is_closed() {
            return;
        }
        let mut idle = self.lock();
        if idle.len() >= MAX_IDLE {
            idle.remove(0);
        }
        idle.push((tx, Instant::now()));
    }

    async fn connect(&self) -> Result<Sender, String> {
        let tcp = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect(self.dial.as_str()),
        )
        .await
        .map_err(|_| "connect: timed out".to_owned())?
        .map_err(|e| format!("connect: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let tx = match &self.tls {
            Some(tls) => {
                let stream = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    tls.connect(tcp, &self.dial, Alpn::Http11),
                )
                .await
                .map_err(|_| "TLS: timed out".to_owned())?
                .map_err(|e| format!("TLS: {e}"))?;
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

    /// Sends `req` on a kept connection (once more on a new one if the kept one turns out
    /// closed before taking it), reads and drops the answer.
    async fn call(&self, req: Request<Full<Bytes>>) -> Result<(), String> {
        if let Some(mut tx) = self.checkout()
            && tx.ready().await.is_ok()
        {
            match tx.try_send_request(req).await {
                Ok(resp) => return self.drain(tx, resp).await,
                Err(mut e) => match e.take_message() {
                    Some(again) => return self.call_new(again).await,
                    None => return Err(format!("request: {}", e.into_error())),
                },
            }
        }
        self.call_new(req).await
    }

    async fn call_new(&self, req: Request<Full<Bytes>>) -> Result<(), String> {
        let mut tx = self.connect().await?;
        tx.ready().await.map_err(|e| format!("connection: {e}"))?;
        let resp = tx
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        self.drain(tx, resp).await
    }

    /// Reads and drops the answer's body; the connection is kept only when all of it was
    /// read within [`MAX_ANSWER_BODY`].
    async fn drain(
        &self,
        tx: Sender,
        resp: http::Response<hyper::body::Incoming>,
    ) -> Result<(), String> {
        let mut body = resp.into_body();
        let mut read = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("answer body: {e}"))?;
            if let Ok(data) = frame.into_data() {
                read += data.len();
                if read > MAX_ANSWER_BODY {
                    return Ok(());
                }
            }
        }
        self.checkin(tx);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn plugin(path: Option<&str>, mode: PathConcatMode) -> ProxyMirror {
        ProxyMirror {
            id: 0,
            path: path.map(str::to_owned),
            mode,
            sample_ratio: 1.0,
            client: Arc::new(MirrorClient {
                target: MirrorTarget {
                    tls: false,
                    host: "m".into(),
                    port: 80,
                },
                dial: "m:80".into(),
                tls: None,
                permits: Arc::new(Semaphore::new(1)),
                idle: Mutex::new(Vec::new()),
            }),
            metrics: Arc::default(),
        }
    }

    fn parts(uri: &str) -> request::Parts {
        Request::get(uri).body(()).unwrap().into_parts().0
    }

    #[test]
    fn the_target_as_apisix_computes_it() {
        let r = parts("/api/x?a=1&b=2");
        let p = plugin(None, PathConcatMode::Replace);
        assert_eq!(p.target_of(&r), "/api/x?a=1&b=2");
        let p = plugin(Some("/shadow"), PathConcatMode::Replace);
        assert_eq!(p.target_of(&r), "/shadow?a=1&b=2");
        assert_eq!(p.target_of(&parts("/api/x")), "/shadow");
        let p = plugin(Some("/shadow"), PathConcatMode::Prefix);
        assert_eq!(p.target_of(&r), "/shadow/api/x?a=1&b=2");
    }

    #[test]
    fn metrics_render_every_series() {
        let m = MirrorMetrics::default();
        m.queue_full.fetch_add(2, Relaxed);
        let mut out = String::new();
        m.render(&mut out);
        assert!(
            out.contains("sluice_mirror_dropped_total{reason=\"queue_full\"} 2\n"),
            "{out}"
        );
        assert!(out.contains("sluice_mirror_requests_total{result=\"ok\"} 0\n"));
    }
}
