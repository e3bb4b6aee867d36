//! The request path: the phases one request goes through, from the listener's hand-off to
//! the response that streams back.
//!
//! ```text
//! handle ─▶ normalize_path ─▶ route ─▶ request_plugins ─┬─▶ forward_h1 ─▶ upstream::h1_client
//!   │                          (router)  (rewrite, access, │     (HTTP/1.1)
//!   │                                     before_proxy;    └─▶ forward_other ─▶ upstream::protocol
//!   │                                     may answer)        (https, gRPC; upgrades: upstream::websocket)
//!   └─ errors ─▶ error (the one place they become responses) ─▶ response_plugins
//!                                                     (headers, body filters, log)
//! ```
//!
//! Each phase is a function of its own below. The current [`RouteTable`] is read once per
//! request, in [`handle`].

pub mod error;

use std::sync::Arc;

use http::header::HeaderValue;
use http::{Request, Response, request};
use hyper::body::Incoming;

use crate::config::store::Store;
use crate::config::table::{CompiledRoute, RouteTable};
use crate::http::headers::strip_request_hop_by_hop;
use crate::http::path::{self, Normalized};
use crate::http::{ConnInfo, RequestInfo, request_host};
use crate::plugins::{self, PluginBody, PluginCtx};
use crate::upstream::Upstream;
use crate::upstream::balancer::request_hash;
use crate::upstream::body::ProxyBody;
use crate::upstream::error::ProxyError;
use crate::upstream::request_body::{BodyTaps, RequestBody};

/// The plugin state of a request on a route with plugins, and its chain (which lives as
/// long as the route table).
type PluginRun<'t> = plugins::PluginSlot<'t>;

/// Where a request goes: its upstream and its balancer hash.
type Chosen<'t> = (&'t Upstream, u64);

/// Where a request goes and how: its upstream, its balancer hash, and whether it is a
/// WebSocket upgrade.
struct Target<'t> {
    upstream: &'t Upstream,
    hash: u64,
    upgrade: bool,
}

/// Serves one request against the current snapshot. Never fails: errors become responses.
pub async fn handle(req: Request<Incoming>, conn: &ConnInfo, store: &Store) -> Response<ProxyBody> {
    let table = store.table();
    let apisix = &store.plugin_state().apisix;
    apisix.request_started();
    let mut plugin_run = None;
    let (req, grpc) = with_grpc(req);
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
    response_plugins(resp, &mut plugin_run)
}

/// The request and whether it is a gRPC one (whose errors are answered in gRPC's form).
///
/// NB: by value and out of [`handle`]: a request future keeps room for every local that was
/// ever borrowed, and the request (264 bytes) is moved on to [`proxy`].
#[inline]
fn with_grpc(req: Request<Incoming>) -> (Request<Incoming>, bool) {
    let grpc = crate::upstream::protocol::is_grpc(&req);
    (req, grpc)
}

/// What phases 0 and 1 made of a request: its head and body apart, its host, its route and,
/// for a route without plugins, its upstream and balancer hash.
struct Routed<'t> {
    parts: request::Parts,
    body: RequestBody,
    host: Option<HeaderValue>,
    route: &'t CompiledRoute,
    picked: Option<Chosen<'t>>,
    upgrade: bool,
}

/// Phases 0 and 1 ([`normalize_path`], [`route`]), and the request's hop-by-hop headers
/// removed.
///
/// NB: not async, so that the request future keeps neither the request as it came (264
/// bytes, borrowed here) nor the normalised path.
#[inline]
fn routed<'t>(
    mut req: Request<Incoming>,
    conn: &ConnInfo,
    table: &'t RouteTable,
) -> Result<Routed<'t>, ProxyError> {
    if req.version() < http::Version::HTTP_2 {
        let len = crate::http::head_len(&req);
        if len > conn.max_header_bytes {
            return Err(ProxyError::HeadTooLarge(len));
        }
    }
    let host = request_host(&req).map_err(ProxyError::BadRequest)?;
    let host_str = host.as_ref().and_then(|h| h.to_str().ok());
    let normal = normalize_path(&mut req)?;
    let path = normal.as_ref().map(|n| n.decoded.as_str());
    let (route, picked) = route(&req, host_str, path, conn, table)?;
    // NB: the head and body stay apart from here on (each join and split moves the head).
    let (mut parts, body) = req.into_parts();
    let upgrade = route.websocket && crate::upstream::websocket::is_upgrade(&parts);
    strip_request_hop_by_hop(&mut parts.headers, upgrade);
    if parts.uri.authority().is_some()
        && parts.version < http::Version::HTTP_2
        && let Some(h) = &host
    {
        // Absolute form: the target's authority is the host sent on, whatever `Host` said.
        parts.headers.insert(http::header::HOST, h.clone());
    }
    Ok(Routed {
        parts,
        body: RequestBody::Incoming(body),
        host,
        route,
        picked,
        upgrade,
    })
}

/// The phases up to the upstream's response head. `plugin_run` receives the plugin state of
/// a route with plugins.
async fn proxy<'t>(
    req: Request<Incoming>,
    conn: &ConnInfo,
    table: &'t Arc<RouteTable>,
    plugin_run: &mut PluginRun<'t>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let Routed {
        mut parts,
        mut body,
        host,
        route,
        picked,
        upgrade,
    } = routed(req, conn, table)?;
    // Holds the upstream traffic-split chose, which `upstream` then borrows.
    let mut split = None;
    let (upstream, hash) = match picked {
        Some(picked) => picked,
        None => {
            // NB: the host was checked for the router; a route with plugins needs it again
            // (its balancer hash).
            let host_str = host.as_ref().and_then(|h| h.to_str().ok());
            let phases = request_plugins(
                route, &mut parts, &mut body, host_str, conn, plugin_run, &mut split,
            );
            let picked = match phases.await? {
                Ok(picked) => picked,
                Err(answer) => return Ok(answer),
            };
            // Plugins want copies of the body as it streams (proxy-mirror, loggers); never of an
            // upgraded session's bytes (the tap is dropped: no copy).
            if let Some(BodyTaps(taps)) = parts.extensions.remove::<BodyTaps>()
                && !upgrade
            {
                for tap in taps {
                    body = body.tap(tap);
                }
            }
            picked
        }
    };
    let target = Target {
        upstream,
        hash,
        upgrade,
    };
    if upgrade || upstream.protocol.is_some() {
        return forward_other(parts, body, host, conn, route, target, plugin_run).await;
    }
    forward_h1(
        &mut parts,
        &mut body,
        host.as_ref(),
        conn,
        route,
        target,
        plugin_run,
    )
    .await
}

/// Phase 0, the path: normalised as nginx builds `$uri` ([`crate::http::path`]); the
/// request's target becomes the normalised path (encoded again where needed) and the query
/// as sent. Returns the decoded form, for the router, when the path changed.
#[inline]
fn normalize_path(req: &mut Request<Incoming>) -> Result<Option<Normalized>, ProxyError> {
    let Some(normal) =
        path::normalize(req.uri().path()).map_err(|e| ProxyError::BadRequest(e.reason()))?
    else {
        return Ok(None);
    };
    let target = match req.uri().query() {
        Some(q) => format!("{}?{q}", normal.encoded),
        None => normal.encoded.clone(),
    };
    let mut uri = req.uri().clone().into_parts();
    let sent = uri.path_and_query.replace(
        http::uri::PathAndQuery::try_from(target)
            .map_err(|_| ProxyError::BadRequest("invalid request target"))?,
    );
    if let Some(sent) = sent {
        req.extensions_mut().insert(path::RequestTarget(sent));
    }
    *req.uri_mut() =
        http::Uri::from_parts(uri).map_err(|_| ProxyError::BadRequest("invalid request target"))?;
    Ok(Some(normal))
}

/// Phase 1, route: the route the request matches (on the normalised, decoded `path` when
/// it differs from the target's) and, for a route without plugins, its upstream and
/// balancer hash. A route with plugins picks its upstream after the request plugins:
/// traffic-split may choose another one, and `hashOn: consumer` needs the consumer.
#[inline]
fn route<'t>(
    req: &Request<Incoming>,
    host: Option<&str>,
    path: Option<&str>,
    conn: &ConnInfo,
    table: &'t RouteTable,
) -> Result<(&'t CompiledRoute, Option<Chosen<'t>>), ProxyError> {
    let uri = req.uri();
    let info = RequestInfo {
        method: req.method(),
        host,
        path: path.unwrap_or(uri.path()),
        query: uri.query(),
        headers: req.headers(),
        remote_addr: conn.remote_addr,
        local_addr: conn.local_addr,
        scheme: conn.scheme,
    };
    let idx = table
        .router_for(conn.listener.as_deref(), host)
        .and_then(|router| router.lookup(&info))
        .ok_or(ProxyError::NoRoute)?;
    let route = table.routes.get(idx).ok_or(ProxyError::NoRoute)?;
    if route.plugins.is_some() {
        return Ok((route, None));
    }
    let upstream = route
        .pick_backend()
        .ok_or_else(|| ProxyError::NoEndpoint(route.id.clone()))?;
    Ok((route, Some((upstream, request_hash(upstream, &info, None)))))
}

/// Phase 2, request plugins (rewrite, access, before_proxy) of a route with plugins, then
/// its upstream and balancer hash, and the request phases of that backend's own plugins
/// (`Backend.plugins`). They run before every protocol (WebSocket, h2/gRPC upstreams too),
/// so auth is never bypassed. `Ok(Err(answer))`: a plugin answered the request itself (a
/// rejection, a redirect, a preflight).
async fn request_plugins<'a, 't: 'a>(
    route: &'t CompiledRoute,
    parts: &mut request::Parts,
    body: &mut RequestBody,
    host: Option<&str>,
    conn: &ConnInfo,
    plugin_run: &mut PluginRun<'t>,
    split: &'a mut Option<Arc<Upstream>>,
) -> Result<Result<Chosen<'a>, Response<ProxyBody>>, ProxyError> {
    let Some(chain) = &route.plugins else {
        // NB: not reached: only a route with plugins gets here.
        return Err(ProxyError::NoRoute);
    };
    let (run, _) = plugin_run.insert((
        Box::new(PluginBody::start(PluginCtx::new(
            Arc::clone(chain),
            conn.remote_addr,
            conn.local_addr,
            conn.scheme,
            std::time::Instant::now(),
        ))),
        chain,
    ));
    let ctx = &mut run.ctx;
    // A plugin of the chain reads the body (request-validation): it is lent to the phases
    // and comes back, read or not.
    if chain.reads_body() {
        ctx.lend_body(
            std::mem::replace(body, RequestBody::empty()),
            conn.client_body_timeout,
        );
    }
    let phases = plugins::request_phases(chain, parts, ctx).await;
    if let Some(lent) = ctx.take_body() {
        *body = lent;
    }
    if let Err(answer) = phases {
        return Ok(Err(*answer));
    }
    *split = ctx.split_upstream.take();
    let upstream = match split {
        Some(up) => up,
        None => {
            let (i, up) = route
                .pick_backend_at()
                .ok_or_else(|| ProxyError::NoEndpoint(route.id.clone()))?;
            if let Some(own) = route.plugins_of_backend(i)
                && let Err(answer) = Box::pin(plugins::backend_phases(own, parts, ctx)).await
            {
                return Ok(Err(*answer));
            }
            up
        }
    };
    let info = RequestInfo {
        method: &parts.method,
        host,
        path: parts.uri.path(),
        query: parts.uri.query(),
        headers: &parts.headers,
        remote_addr: conn.remote_addr,
        local_addr: conn.local_addr,
        scheme: conn.scheme,
    };
    let hash = request_hash(upstream, &info, ctx.consumer_name());
    Ok(Ok((upstream, hash)))
}

/// Phase 3, forward, for protocols other than plain HTTP/1.1 (WebSocket upgrades, HTTP/2,
/// gRPC and TLS upstreams): the request to an endpoint of `upstream`, up to the response
/// head. The plugin state learns which endpoint answered.
async fn forward_other(
    parts: request::Parts,
    body: RequestBody,
    host: Option<HeaderValue>,
    conn: &ConnInfo,
    route: &CompiledRoute,
    target: Target<'_>,
    plugin_run: &mut PluginRun<'_>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let Target {
        upstream,
        hash,
        upgrade,
    } = target;
    let timeouts = upstream.timeouts.unwrap_or(route.timeouts);
    let policy = route.policy.as_deref();
    let req = Request::from_parts(parts, body);
    // Plugins (real-ip) may have replaced the client address: it is the one sent on
    // (`X-Real-IP`, `X-Forwarded-For`), as on the HTTP/1.1 path.
    let real;
    let conn = match plugin_run.as_ref().map(|(run, _)| run.ctx.remote_addr.ip()) {
        Some(ip) if ip != conn.remote_addr.ip() => {
            let mut c = conn.clone();
            c.remote_ip = crate::http::InlineText::ip(ip);
            real = c;
            &real
        }
        _ => conn,
    };
    let mut picked = None;
    let slot = plugin_run.is_some().then_some(&mut picked);
    // NB: boxed, so that the plain HTTP/1.1 request future does not grow by their size.
    let resp = match upstream.protocol.as_deref() {
        Some(protocol) if !upgrade => {
            Box::pin(crate::upstream::protocol::proxy(
                req, host, conn, upstream, protocol, hash, timeouts, policy, slot,
            ))
            .await
        }
        protocol => {
            let tls = protocol.and_then(|p| p.tls.as_deref());
            Box::pin(crate::upstream::websocket::upgrade(
                req, host, conn, upstream, tls, hash, timeouts, policy, slot,
            ))
            .await
        }
    };
    if let (Some(p), Some((run, _))) = (picked, plugin_run.as_mut()) {
        run.ctx.upstream = Some(p.pool);
        run.ctx.upstream_started = Some(p.started);
    }
    resp
}

/// Phase 3, forward, over plain HTTP/1.1 ([`crate::upstream::h1_client`]): the request to an
/// endpoint of `upstream`, up to the response head. The plugin state learns which endpoint
/// answered.
///
/// NB: the request by reference: an async fn keeps its arguments for the whole life of its
/// future, so a request head passed by value at each level grows every request's future by
/// its size (the phase split measured 0.987x side by side before this).
async fn forward_h1(
    parts: &mut request::Parts,
    body: &mut RequestBody,
    host: Option<&HeaderValue>,
    conn: &ConnInfo,
    route: &CompiledRoute,
    target: Target<'_>,
    plugin_run: &mut PluginRun<'_>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let upstream = target.upstream;
    let h1 = crate::upstream::h1_client::H1Forward {
        conn,
        upstream,
        hash: target.hash,
        timeouts: upstream.timeouts.unwrap_or(route.timeouts),
        policy: route.policy.as_deref(),
        host,
    };
    let Some((run, _)) = plugin_run.as_mut() else {
        return Ok(h1.send(parts, body, None, None).await?.0);
    };
    // Plugins (real-ip) may have replaced the client address.
    let real_ip = (run.ctx.remote_addr.ip() != conn.remote_addr.ip())
        .then(|| crate::http::InlineText::ip(run.ctx.remote_addr.ip()));
    let mut picked = None;
    let sent = h1
        .send(parts, body, real_ip.as_ref(), Some(&mut picked))
        .await;
    if let Some(p) = picked {
        run.ctx.upstream = Some(p.pool);
        run.ctx.upstream_started = Some(p.started);
    }
    let (resp, head_len) = sent?;
    // NB: the upstream's head size stands for the one sent on (its hop-by-hop headers out,
    // the plugins' in): cheaper than measuring the head again.
    run.ctx.response_head_bytes = head_len as u64;
    Ok(resp)
}

/// Phase 4, response plugins (headers, body filters, log) of a route with plugins; the
/// response of any other route passes unchanged.
#[inline]
fn response_plugins(
    resp: Response<ProxyBody>,
    plugin_run: &mut PluginRun<'_>,
) -> Response<ProxyBody> {
    plugins::response_phases(resp, plugin_run)
}
