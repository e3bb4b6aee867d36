//! The request path: route lookup, upstream request, response streaming.

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response};
use http_body::Body as _;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;

use crate::balancer::Tried;
use crate::body::{ProxyBody, UpstreamBody};
use crate::error::ProxyError;
use crate::h1::{Framing, H1Error, ProxyHeaders, ResponseHead, encode_request_head};
use crate::health::Outcome;
use crate::plugins::{self, PluginBody, PluginCtx};
use crate::router::RequestInfo;
use crate::store::Store;
use crate::table::RouteTable;
use crate::timer::CoarseTimer;
use crate::upstream::{Endpoint, PooledConn, Timeouts};

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

/// Serves one request against the current snapshot. Never fails: errors become responses.
pub async fn handle(req: Request<Incoming>, conn: &ConnInfo, store: &Store) -> Response<ProxyBody> {
    let table = store.table();
    let apisix = &store.plugin_state().apisix;
    apisix.request_started();
    let mut plugin_run = None;
    let grpc = crate::h2up::is_grpc(&req);
    let resp = match proxy(req, conn, &table, &mut plugin_run).await {
        Ok(resp) => resp,
        Err(err) => {
            if !matches!(err, ProxyError::NoRoute) {
                tracing::warn!(error = %err, "request failed");
            }
            if grpc {
                err.into_grpc_response()
            } else {
                err.into_response()
            }
        }
    };
    store.metrics().observe_status(resp.status());
    apisix.request_finished();
    // Plugins: response phases (headers, body filters, log) of routes with plugins.
    plugins::response_phases(resp, &mut plugin_run)
}

/// `plugin_run` receives the plugin state of a route with plugins, and its chain (which
/// lives as long as `table`).
async fn proxy<'t>(
    req: Request<Incoming>,
    conn: &ConnInfo,
    table: &'t Arc<RouteTable>,
    plugin_run: &mut Option<(PluginBody, &'t plugins::PluginChain)>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let host = request_host(&req);
    // NB: checked once; a route with plugins needs it again for its balancer hash
    // (`to_str` checks every byte).
    let host_str = host.as_ref().and_then(|h| h.to_str().ok());
    let uri = req.uri();
    let (route, picked) = {
        let info = RequestInfo {
            method: req.method(),
            host: host_str,
            path: uri.path(),
            query: uri.query(),
            headers: req.headers(),
            remote_addr: conn.remote_addr,
            local_addr: conn.local_addr,
            scheme: conn.scheme,
        };
        let idx = table.router.lookup(&info).ok_or(ProxyError::NoRoute)?;
        let route = table.routes.get(idx).ok_or(ProxyError::NoRoute)?;
        // NB: a route with plugins picks its upstream after the request phases (below):
        // traffic-split may choose another one, and `hashOn: consumer` needs the consumer.
        let picked = match route.plugins {
            Some(_) => None,
            None => {
                let upstream = route
                    .pick_backend()
                    .ok_or_else(|| ProxyError::NoEndpoint(route.id.clone()))?;
                Some((
                    upstream,
                    crate::balancer::request_hash(upstream, &info, None),
                ))
            }
        };
        (route, picked)
    };
    // Holds the upstream traffic-split chose, which `upstream` then borrows.
    let split: Option<Arc<crate::upstream::Upstream>>;
    // NB: the head and body stay apart from here on (each join and split moves the head).
    let (mut parts, mut body) = req.into_parts();
    // Plugins: request phases (rewrite, access, before_proxy); a plugin may answer. They run
    // before every protocol (WebSocket, h2/gRPC upstreams too), so auth is never bypassed.
    let (upstream, hash) = if let Some(picked) = picked {
        picked
    } else if let Some(chain) = &route.plugins {
        let (run, _) = plugin_run.insert((
            PluginBody::start(PluginCtx::new(
                Arc::clone(chain),
                conn.remote_addr,
                conn.local_addr,
                conn.scheme,
                std::time::Instant::now(),
            )),
            chain,
        ));
        let ctx = &mut run.ctx;
        if let Err(resp) = plugins::request_phases(chain, &mut parts, ctx).await {
            return Ok(*resp);
        }
        split = ctx.split_upstream.take();
        let upstream = match &split {
            Some(up) => up,
            None => route
                .pick_backend()
                .ok_or_else(|| ProxyError::NoEndpoint(route.id.clone()))?,
        };
        let info = RequestInfo {
            method: &parts.method,
            host: host_str,
            path: parts.uri.path(),
            query: parts.uri.query(),
            headers: &parts.headers,
            remote_addr: conn.remote_addr,
            local_addr: conn.local_addr,
            scheme: conn.scheme,
        };
        let hash = crate::balancer::request_hash(upstream, &info, ctx.consumer_name());
        (upstream, hash)
    } else {
        // NB: not reached: `picked` is only `None` for a route with plugins.
        return Err(ProxyError::NoRoute);
    };
    let timeouts = upstream.timeouts.unwrap_or(route.timeouts);
    // Protocols other than plain HTTP/1.1 (WebSocket upgrades, HTTP/2 and TLS upstreams):
    // endpoint choice, retries and passive health in `failover`.
    let upgrade = route.websocket && crate::websocket::is_upgrade(&parts);
    if upgrade || upstream.protocol.is_some() {
        // NB: boxed, so that the plain HTTP/1.1 request future does not grow by its size.
        let mut resp = Box::pin(crate::failover::proxy(
            Request::from_parts(parts, body),
            host,
            conn,
            upstream,
            hash,
            timeouts,
            upgrade,
        ))
        .await;
        if let (Ok(r), Some((run, _))) = (&mut resp, plugin_run.as_mut())
            && let Some(picked) = r.extensions_mut().remove::<crate::failover::Picked>()
        {
            run.ctx.upstream = Some(picked.pool);
            run.ctx.upstream_started = Some(picked.started);
        }
        return resp;
    }

    strip_hop_by_hop(&mut parts.headers);

    let has_body = !body.is_end_stream();
    let framing = if has_body {
        match body.size_hint().exact() {
            Some(n) => Framing::Length(n),
            None => Framing::Chunked,
        }
    } else if parts.headers.contains_key(header::CONTENT_LENGTH) {
        Framing::Length(0)
    } else {
        Framing::Empty
    };
    let target = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/");
    let mut head = Vec::with_capacity(512);
    // Plugins (real-ip) may have replaced the client address.
    let real_ip = match plugin_run.as_ref().map(|(r, _)| &r.ctx) {
        Some(ctx) if ctx.remote_addr.ip() != conn.remote_addr.ip() => {
            HeaderValue::from_str(&ctx.remote_addr.ip().to_string()).ok()
        }
        _ => None,
    };
    let client_ip = real_ip.as_ref().unwrap_or(&conn.remote_ip);
    let proxy_headers = ProxyHeaders {
        client_ip: client_ip.as_bytes(),
        proto: conn.scheme,
        host: host.as_ref().map(HeaderValue::as_bytes),
    };

    // --- upstream-LB: endpoint choice, retries to other endpoints, passive health ---
    // A request without a body can be sent again if a reused connection turns out to have
    // been closed by the upstream, or to another endpoint after a reset before any response
    // byte; others check the idle connection before using it. A connect failure or timeout
    // is retried on another endpoint whatever the request, as nothing of it was sent.
    let replayable = !has_body && parts.method.is_idempotent();
    let mut tried = Tried::default();
    let budget = upstream.retry_budget();
    // Retries stop after connect + read timeout, counted from the first failure (so the
    // clock is never read on the fast path).
    let mut deadline: Option<std::time::Instant> = None;
    let (pooled, response) = loop {
        let idx = upstream
            .pick_index(hash, &tried)
            .ok_or_else(|| ProxyError::NoEndpoint(upstream.id.clone()))?;
        let Some(endpoint) = upstream.endpoints.get(idx) else {
            return Err(ProxyError::NoEndpoint(upstream.id.clone()));
        };
        // NB: the attempt's start serves the pool's idle timeout check too.
        let attempt_started = match plugin_run.as_mut() {
            Some((run, _)) => {
                run.ctx.upstream = Some(Arc::clone(&endpoint.pool));
                let now = std::time::Instant::now();
                run.ctx.upstream_started = Some(now);
                Some(now)
            }
            None => None,
        };
        if let Some(h) = upstream.host_header(endpoint) {
            parts.headers.insert(header::HOST, h.clone());
        }
        head.clear();
        encode_request_head(
            &mut head,
            &parts.method,
            target,
            &parts.headers,
            framing,
            Some(proxy_headers),
        );
        // NB: only `ewma` needs the latency; the clock is not read otherwise.
        let started = upstream.measures_latency().then(std::time::Instant::now);
        let in_flight = endpoint.state.begin();
        let sent = attempt(
            endpoint,
            &head,
            has_body.then_some(&mut body),
            framing == Framing::Chunked,
            &parts.method,
            timeouts,
            replayable,
            &conn.timer,
            attempt_started,
        )
        .await;
        match sent {
            Ok((mut pooled, resp)) => {
                upstream.report(endpoint, Outcome::Status(resp.parts.status.as_u16()));
                if let Some(t) = started {
                    endpoint.state.observe_latency(t.elapsed());
                }
                pooled.hold(in_flight);
                break (pooled, resp);
            }
            Err(e) => {
                drop(in_flight);
                if let Some(outcome) = failure_outcome(&e) {
                    upstream.report(endpoint, outcome);
                    // A failed endpoint looks slow to `ewma`.
                    if let Some(t) = started {
                        endpoint
                            .state
                            .observe_latency(t.elapsed().max(timeouts.connect));
                    }
                }
                let reset = matches!(&e, ProxyError::Upstream { source, .. } if source.is_stale_connection());
                let may_retry = e.retryable() || (replayable && reset);
                let now = std::time::Instant::now();
                let until = *deadline.get_or_insert(now + timeouts.connect + timeouts.read);
                if !may_retry || tried.len() >= budget || now >= until {
                    // Known down by the health checks, every one: 503 rather than the
                    // 502 of a single failed connection (as nginx/APISIX answer).
                    if e.retryable() && upstream.all_unhealthy() {
                        return Err(ProxyError::AllEndpointsDown(upstream.id.clone()));
                    }
                    return Err(e);
                }
                tracing::debug!(upstream = %upstream.id, error = %e, "retrying on another endpoint");
                tried.push(idx);
                upstream.count_retry();
            }
        }
    };
    // --- end upstream-LB ---
    if let Some((run, _)) = plugin_run.as_mut() {
        // NB: the upstream's head size stands for the one sent on (its hop-by-hop headers
        // out, the plugins' in): cheaper than measuring the head again.
        run.ctx.response_head_bytes = response.head_len as u64;
    }
    let mut parts = response.parts;
    parts.version = http::Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    let body = UpstreamBody::new(pooled, response.framing, response.keep_alive);
    Ok(Response::from_parts(parts, ProxyBody::Upstream(body)))
}

/// What a failed attempt says about the endpoint's health (`None`: not its fault).
fn failure_outcome(e: &ProxyError) -> Option<Outcome> {
    match e {
        ProxyError::Connect { .. } | ProxyError::Upstream { .. } => Some(Outcome::TcpFailure),
        ProxyError::ConnectTimeout(_) | ProxyError::ReadTimeout(_) | ProxyError::SendTimeout(_) => {
            Some(Outcome::Timeout)
        }
        _ => None,
    }
}

/// One attempt on `endpoint`: a pooled connection (a fresh one if a reused connection of a
/// replayable request turns out stale), the request, and the response head.
#[allow(clippy::too_many_arguments)]
async fn attempt(
    endpoint: &Endpoint,
    head: &[u8],
    mut body: Option<&mut Incoming>,
    chunked: bool,
    method: &http::Method,
    timeouts: Timeouts,
    replayable: bool,
    timer: &CoarseTimer,
    now: Option<std::time::Instant>,
) -> Result<(PooledConn, ResponseHead), ProxyError> {
    let mut pooled = endpoint
        .pool
        .checkout(timeouts.connect, !replayable, now)
        .await?;
    loop {
        let sent = exchange(
            &mut pooled,
            head,
            body.as_deref_mut(),
            chunked,
            method,
            timeouts,
            timer,
        )
        .await;
        match sent {
            Ok(resp) => return Ok((pooled, resp)),
            Err(ProxyError::Upstream { source, .. })
                if replayable && pooled.reused && source.is_stale_connection() =>
            {
                pooled = endpoint.pool.connect(timeouts.connect).await?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Sends one request on `pooled` and reads the response head.
async fn exchange(
    pooled: &mut PooledConn,
    head: &[u8],
    body: Option<&mut Incoming>,
    chunked: bool,
    method: &http::Method,
    timeouts: Timeouts,
    timer: &CoarseTimer,
) -> Result<ResponseHead, ProxyError> {
    let upstream_err = |source: H1Error, pooled: &PooledConn| ProxyError::Upstream {
        addr: pooled.address().to_owned(),
        source,
    };
    if let Err(e) = pooled.conn.write_all(head).await {
        return Err(upstream_err(H1Error::Io(e), pooled));
    }
    if let Some(body) = body {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(ProxyError::RequestBody)?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            match timer
                .timeout(timeouts.send, pooled.conn.write_body_chunk(&data, chunked))
                .await
            {
                Err(_) => return Err(ProxyError::SendTimeout(pooled.address().to_owned())),
                Ok(Err(e)) => return Err(upstream_err(H1Error::Io(e), pooled)),
                Ok(Ok(())) => {}
            }
        }
        if chunked && let Err(e) = pooled.conn.write_all(b"0\r\n\r\n").await {
            return Err(upstream_err(H1Error::Io(e), pooled));
        }
    }
    match timer
        .timeout(timeouts.read, pooled.conn.read_head(method))
        .await
    {
        Err(_) => Err(ProxyError::ReadTimeout(pooled.address().to_owned())),
        Ok(Err(source)) => Err(upstream_err(source, pooled)),
        Ok(Ok(resp)) => Ok(resp),
    }
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

/// The hop-by-hop headers of RFC 9110 §7.6.1 (plus the legacy `proxy-connection`).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "te",
    "transfer-encoding",
    "upgrade",
    "trailer",
    "proxy-authenticate",
    "keep-alive",
    "proxy-connection",
];

/// The bit of `name` in [`HOP_BY_HOP`] (index order), or 0 for any other header.
///
/// NB: a `match` on the length first rejects almost every header with one comparison;
/// this runs for every request and response header (issue 2: searching the list cost about
/// 90 instructions per header).
#[inline]
pub(crate) fn hop_by_hop_bit(name: &str) -> u8 {
    let bit = match name.len() {
        2 if name == HOP_BY_HOP[1] => 1,
        7 if name == HOP_BY_HOP[3] => 3,
        7 if name == HOP_BY_HOP[4] => 4,
        10 if name == HOP_BY_HOP[0] => 0,
        10 if name == HOP_BY_HOP[6] => 6,
        16 if name == HOP_BY_HOP[7] => 7,
        17 if name == HOP_BY_HOP[2] => 2,
        18 if name == HOP_BY_HOP[5] => 5,
        _ => return 0,
    };
    1 << bit
}

/// Whether a `Connection` token names one of the hop-by-hop headers (any case).
pub(crate) fn is_hop_by_hop_token(token: &str) -> bool {
    HOP_BY_HOP.iter().any(|h| h.eq_ignore_ascii_case(token))
}

/// Removes hop-by-hop headers, including those named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names, without hashing, finds which are present; typically only
    // `connection`, or none.
    let mut present = 0u8;
    for name in headers.keys() {
        present |= hop_by_hop_bit(name.as_str());
    }
    if present == 0 {
        return;
    }
    if present & 1 != 0
        && let Some(conn) = headers.remove(header::CONNECTION)
        && let Ok(list) = conn.to_str()
    {
        for token in list.split(',').map(str::trim) {
            let known = token.is_empty()
                || token.eq_ignore_ascii_case("close")
                || is_hop_by_hop_token(token);
            if !known {
                headers.remove(token);
            }
        }
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate().skip(1) {
        if present & (1 << i) != 0 {
            headers.remove(*name);
        }
    }
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
    fn every_hop_by_hop_header_is_recognised_and_no_other() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_bit(name), 1 << i, "{name}");
            let mut h = HeaderMap::new();
            h.insert(*name, HeaderValue::from_static("x"));
            h.insert("x-kept", HeaderValue::from_static("1"));
            strip_hop_by_hop(&mut h);
            assert_eq!(h.len(), 1, "{name} left in place");
        }
        for other in [
            "host",
            "tx",
            "upgrader",
            "connections",
            "content-length",
            "trailers",
        ] {
            assert_eq!(hop_by_hop_bit(other), 0, "{other}");
        }
    }
}
