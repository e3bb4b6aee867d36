//! Running a chain over one request: the request phases ([`request_phases`]), the response
//! phases ([`response_phases`]), and [`PluginBody`], the request's plugin state that becomes
//! the response body so that body filters and the log phase run as it streams.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Response, request, response};
use http_body::{Body, Frame};

use super::chain::PluginChain;
use super::context::PluginCtx;
use super::plugin::{BodyFilter, Flow, Hooks, Instance, PhaseResult};
use crate::upstream::body::ProxyBody;
use crate::upstream::h1::H1Error;

/// Runs one request phase of one plugin: returns from the calling function with the
/// plugin's response, awaits a pending decision. NB: a macro rather than an `async fn`, so
/// that a phase that decides at once (nearly all) costs no future.
macro_rules! phase {
    ($flow:expr) => {
        match $flow {
            Flow::Continue => {}
            Flow::Respond(r) => return Err(r),
            Flow::Pending(f) => f.await?,
        }
    };
}

/// Runs the request phases (rewrite, access, before_proxy) of `chain`, the chain of
/// `ctx`. `Err` carries the response a plugin answered with.
///
/// NB: `chain` is passed besides `ctx` (which plugins borrow mutably) so that walking it
/// needs no `Arc` clone.
pub async fn request_phases(
    chain: &PluginChain,
    req: &mut request::Parts,
    ctx: &mut PluginCtx,
) -> PhaseResult {
    debug_assert!(std::ptr::eq(chain, &*ctx.chain));
    ctx.request_bytes = approx_request_head(req);
    if chain.capture_head {
        ctx.request_head = Some(Box::new(copy_head(req)));
    }
    for p in &chain.global_by.rewrite {
        phase!(p.rewrite(req, ctx));
    }
    for p in &chain.global_by.access {
        phase!(p.access(req, ctx));
    }
    for p in &chain.route_by.rewrite {
        phase!(p.rewrite(req, ctx));
    }
    // The consumer's plugins override the route's of the same name (APISIX merge).
    if let Some(c) = ctx.consumer.as_ref().filter(|c| !c.plugins.is_empty()) {
        let mut merged: Vec<Instance> = chain
            .route
            .iter()
            .filter(|p| !c.plugins.iter().any(|q| q.name == p.name))
            .cloned()
            .collect();
        merged.extend(c.plugins.iter().cloned());
        merged.sort_by_key(|p| std::cmp::Reverse(p.priority));
        ctx.merged = Some(Arc::from(merged));
    }
    match ctx.merged.clone() {
        // NB: cloned only when a consumer's plugins were merged in.
        Some(merged) => {
            for p in merged.iter() {
                phase!(p.access(req, ctx));
            }
            for p in chain.global_by.before_proxy.iter().chain(merged.iter()) {
                p.before_proxy(req, ctx);
            }
        }
        None => {
            for p in &chain.route_by.access {
                phase!(p.access(req, ctx));
            }
            let before = &chain.route_by.before_proxy;
            for p in chain.global_by.before_proxy.iter().chain(before.iter()) {
                p.before_proxy(req, ctx);
            }
        }
    }
    Ok(())
}

/// Runs the request phases (rewrite, access, before_proxy) of the plugins of the backend
/// the weighted split picked, after the route's ([`request_phases`]); their response phases
/// then run in [`response_phases`], before the route's. `Err` carries the response a plugin
/// answered with.
pub async fn backend_phases(
    plugins: &Arc<[Instance]>,
    req: &mut request::Parts,
    ctx: &mut PluginCtx,
) -> PhaseResult {
    ctx.backend_plugins = Some(Arc::clone(plugins));
    for p in plugins.iter().filter(|p| p.hooks.has(Hooks::REWRITE)) {
        phase!(p.rewrite(req, ctx));
    }
    for p in plugins.iter().filter(|p| p.hooks.has(Hooks::ACCESS)) {
        phase!(p.access(req, ctx));
    }
    for p in plugins.iter().filter(|p| p.hooks.has(Hooks::BEFORE_PROXY)) {
        p.before_proxy(req, ctx);
    }
    Ok(())
}

/// A request's plugin state and its route's chain, from the request phases to the response
/// phases. The state is boxed: a request's future keeps room for the slot whether or not
/// its route has plugins, and a streaming response body takes the box as it is.
pub type PluginSlot<'c> = Option<(Box<PluginBody>, &'c PluginChain)>;

/// Runs the response phases on `resp` with the request's plugin state `run` and its chain
/// in `slot` (`None` for a route without plugins: `resp` is returned as it is). `run` was
/// made by [`PluginBody::start`] before the request phases; when a plugin logs or filters
/// a body that is still streaming, `run` leaves `slot` and becomes the response body, so
/// that body filters and the log phase run as it streams. The chain is `run.ctx.chain`,
/// kept apart so that walking it needs no `Arc` clone.
pub fn response_phases(
    resp: Response<ProxyBody>,
    slot: &mut PluginSlot<'_>,
) -> Response<ProxyBody> {
    let Some((run, chain)) = slot.as_mut() else {
        return resp;
    };
    let chain: &PluginChain = chain;
    debug_assert!(std::ptr::eq(chain, &*run.ctx.chain));
    let (mut parts, body) = resp.into_parts();
    let ctx = &mut run.ctx;
    ctx.status = parts.status;
    // The head size: the upstream's when known (set by the proxy), else measured below.
    let mut head_bytes = ctx.response_head_bytes;
    if let Some(quota) = ctx.quota.take() {
        head_bytes += quota.append_to(&mut parts.headers);
    }
    if !ctx.response_headers.is_empty() {
        // NB: one reservation instead of a rehash while appending several.
        parts.headers.reserve(ctx.response_headers.len());
        for (name, value) in ctx.response_headers.drain(..) {
            head_bytes += (name.as_str().len() + value.len() + 4) as u64;
            parts.headers.append(name, value);
        }
    }
    let merged = ctx.merged.clone();
    let plugins: &[Instance] = merged.as_deref().unwrap_or(&chain.route);
    // NB: cloned only when the picked backend has plugins of its own.
    let backend = ctx.backend_plugins.clone();
    let backend: &[Instance] = backend.as_deref().unwrap_or(&[]);
    let mut filters = Vec::new();
    // Encoders (gzip) last: they see the headers and body every other plugin made.
    // NB: skipped when no plugin of the chain has response phases (a consumer's merged
    // plugins may have).
    let passes: &[bool] = if chain.response_phases || merged.is_some() || !backend.is_empty() {
        &[false, true]
    } else {
        &[]
    };
    for &last in passes {
        for p in backend.iter().chain(plugins).chain(chain.global.iter()) {
            if p.hooks.has(Hooks::ENCODES_BODY) != last {
                continue;
            }
            if p.hooks.has(Hooks::RESPONSE_HEADERS) {
                p.response_headers(&mut parts, ctx);
            }
            if p.hooks.has(Hooks::BODY_FILTER)
                && let Some(f) = p.body_filter(ctx)
            {
                filters.push(f);
            }
        }
    }
    // An upgraded session: its log phase and what the request phases kept (limit-conn's
    // slot) wait for the session's end, as nginx logs a WebSocket when it closes.
    if let Some(session) = parts
        .extensions
        .remove::<crate::upstream::websocket::SessionEnd>()
    {
        let head_bytes = approx_response_head(&parts);
        if let Some((mut run, _)) = slot.take() {
            run.ctx.response_head_bytes = head_bytes;
            run.wrapped = true;
            tokio::spawn(async move {
                session.ended.cancelled().await;
                let bytes = &session.bytes;
                run.ctx.request_bytes += bytes.up.load(std::sync::atomic::Ordering::Relaxed);
                run.ctx.response_body_bytes +=
                    bytes.down.load(std::sync::atomic::Ordering::Relaxed);
                run.finish();
            });
        }
        return Response::from_parts(parts, body);
    }
    // NB: values kept by request phases (limit-conn slots) live until the body is sent.
    if filters.is_empty() && !chain.wrap_body && ctx.keep.is_empty() {
        return Response::from_parts(parts, body);
    }
    if filters.iter().any(|f| !f.keeps_length()) {
        // The length changes under a filter.
        parts.headers.remove(http::header::CONTENT_LENGTH);
    }
    ctx.response_head_bytes = if ctx.response_head_bytes == 0 {
        approx_response_head(&parts)
    } else {
        head_bytes
    };
    let mut body = body;
    // A body that is complete already (a small upstream body that came with its head,
    // Sluice's own answers) is not wrapped: the log phase runs now, its size known, and
    // the plugin state is freed before hyper writes the response. NB: saves a body layer
    // per request (issue 4); the latency then runs to the response's hand-over.
    if filters.is_empty()
        && ctx.keep.is_empty()
        && let Some(data) = body.take_complete()
    {
        ctx.response_body_bytes = data.len() as u64;
        ctx.ended = body.ended();
        run.wrapped = true;
        run.finish();
        let body = if data.is_empty() {
            ProxyBody::empty()
        } else {
            ProxyBody::Full(Some(data))
        };
        return Response::from_parts(parts, body);
    }
    // The plugin state becomes the body, in the box it has lived in since the request began.
    let Some((mut run, _)) = slot.take() else {
        return Response::from_parts(parts, body);
    };
    run.inner = body;
    run.filters = filters;
    run.wrapped = true;
    Response::from_parts(parts, ProxyBody::Plugin(run))
}

/// A copy of the request head as it arrived (before the plugins changed it), kept for the
/// log phase when a chain's plugin asks for it ([`Hooks::REQUEST_HEAD`]).
pub fn copy_head(req: &request::Parts) -> request::Parts {
    let mut r = http::Request::new(());
    *r.method_mut() = req.method.clone();
    *r.uri_mut() = req.uri.clone();
    *r.version_mut() = req.version;
    *r.headers_mut() = req.headers.clone();
    r.into_parts().0
}

fn approx_request_head(req: &request::Parts) -> u64 {
    let target = req.uri.path_and_query().map_or(1, |pq| pq.as_str().len());
    let mut n = req.method.as_str().len() + target + 12;
    for (k, v) in &req.headers {
        n += k.as_str().len() + v.len() + 4;
    }
    n as u64
}

fn approx_response_head(resp: &response::Parts) -> u64 {
    let mut n = 17;
    for (k, v) in &resp.headers {
        n += k.as_str().len() + v.len() + 4;
    }
    n as u64
}

/// The plugin state of one request: its [`PluginCtx`] through the request phases, then
/// the response body that runs body filters per chunk and the log phase at its end.
///
/// NB: boxed from the request's start ([`PluginSlot`]): inline, its 600 bytes made every
/// request's future larger, with plugins or without, and hyper moves that future with each
/// request. A streaming response body takes the box as it is.
pub struct PluginBody {
    /// The request's context.
    pub ctx: PluginCtx,
    inner: ProxyBody,
    filters: Vec<Box<dyn BodyFilter>>,
    /// Whether [`response_phases`] made this the response body (then the log phase runs at
    /// its end).
    wrapped: bool,
    done: bool,
}

impl std::fmt::Debug for PluginBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginBody")
            .field("inner", &self.inner)
            .field("filters", &self.filters.len())
            .finish_non_exhaustive()
    }
}

impl PluginBody {
    /// The state of a request on `ctx.chain`, before its request phases.
    ///
    /// NB: inlined with [`PluginCtx::new`], so that the context is written once, in place;
    /// built apart and moved in, it was copied twice (~140 instructions per request,
    /// issue 4).
    #[inline(always)]
    pub fn start(ctx: PluginCtx) -> Self {
        PluginBody {
            ctx,
            inner: ProxyBody::empty(),
            filters: Vec::new(),
            wrapped: false,
            done: false,
        }
    }

    fn finish(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        if self.wrapped {
            // NB: the upstream body's end was timed when its connection went back to the
            // pool; the log phase reuses that reading.
            if self.ctx.ended.is_none() {
                self.ctx.ended = self.inner.ended();
            }
            let chain = Arc::clone(&self.ctx.chain);
            let merged = self.ctx.merged.clone();
            let ctx = &mut self.ctx;
            match merged.as_deref() {
                Some(merged) => {
                    for p in merged.iter().chain(chain.global.iter()) {
                        p.log(ctx);
                    }
                }
                None => {
                    for p in chain.route_by.log.iter().chain(chain.global_by.log.iter()) {
                        p.log(ctx);
                    }
                }
            }
        }
    }

    /// Whether the body is still being sent.
    pub fn is_end_stream(&self) -> bool {
        self.done || (self.filters.is_empty() && self.inner.is_end_stream())
    }

    /// Size hint: the inner one unless a filter changes lengths.
    pub fn size_hint(&self) -> http_body::SizeHint {
        if self.filters.iter().all(|f| f.keeps_length()) {
            self.inner.size_hint()
        } else {
            http_body::SizeHint::default()
        }
    }

    /// Polls the next frame through the filters.
    pub fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(frame))) => {
                let frame = match frame.into_data() {
                    Ok(mut data) => {
                        for f in &mut self.filters {
                            data = f.data(data, &mut self.ctx);
                        }
                        self.ctx.response_body_bytes += data.len() as u64;
                        Frame::data(data)
                    }
                    Err(frame) => frame,
                };
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                let mut tail: Option<Bytes> = None;
                let ctx = &mut self.ctx;
                for f in &mut self.filters {
                    let mut chunk = match tail.take() {
                        Some(t) => f.data(t, ctx),
                        None => Bytes::new(),
                    };
                    if let Some(rest) = f.end(ctx) {
                        let mut v = Vec::with_capacity(chunk.len() + rest.len());
                        v.extend_from_slice(&chunk);
                        v.extend_from_slice(&rest);
                        chunk = Bytes::from(v);
                    }
                    if !chunk.is_empty() {
                        tail = Some(chunk);
                    }
                }
                if let Some(t) = &tail {
                    ctx.response_body_bytes += t.len() as u64;
                }
                // Log once the last frame has been handed over.
                match tail {
                    Some(t) => {
                        self.filters.clear();
                        self.inner = ProxyBody::empty();
                        Poll::Ready(Some(Ok(Frame::data(t))))
                    }
                    None => {
                        self.finish();
                        Poll::Ready(None)
                    }
                }
            }
            Poll::Ready(Some(Err(e))) => {
                self.finish();
                Poll::Ready(Some(Err(e)))
            }
        }
    }
}

// NB: the response body type ([`ProxyBody::Plugin`]) holds this behind `dyn FilteredBody`,
// so that the upstream layer, which defines it, does not import the plugins.
impl http_body::Body for PluginBody {
    type Data = Bytes;
    type Error = H1Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        PluginBody::poll_frame(self.get_mut(), cx)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        PluginBody::is_end_stream(self)
    }

    #[inline]
    fn size_hint(&self) -> http_body::SizeHint {
        PluginBody::size_hint(self)
    }
}

impl Drop for PluginBody {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Instant;

    use sluice_proto::v1;

    use super::*;
    use crate::plugins::{ConsumerTable, Plugin};

    /// Records the response body size each log phase saw.
    #[derive(Debug, Default)]
    struct LogSizes(std::sync::Mutex<Vec<u64>>);

    impl Plugin for LogSizes {
        fn log(&self, ctx: &mut PluginCtx) {
            self.0.lock().unwrap().push(ctx.response_body_bytes);
        }
    }

    #[test]
    fn a_complete_body_is_logged_at_once_and_not_wrapped() {
        let logs = Arc::new(LogSizes::default());
        let route = v1::Route {
            id: "r".into(),
            ..Default::default()
        };
        let plugin = Instance::new("log-sizes", 0, Hooks::LOG, logs.clone());
        let chain = PluginChain::new(
            &route,
            Vec::new(),
            vec![plugin],
            Arc::new(ConsumerTable::default()),
        )
        .unwrap();
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let run = PluginBody::start(PluginCtx::new(
            Arc::clone(&chain),
            addr,
            addr,
            "http",
            Instant::now(),
        ));
        let mut slot = Some((Box::new(run), &*chain));
        let resp = response_phases(Response::new(ProxyBody::full("hello")), &mut slot);
        // Logged before the response is written, with the body's size; the body is the
        // plain one, not a plugin layer.
        assert_eq!(*logs.0.lock().unwrap(), vec![5]);
        assert!(
            matches!(resp.body(), ProxyBody::Full(Some(b)) if b == "hello"),
            "{:?}",
            resp.body()
        );
        drop(resp);
        assert_eq!(logs.0.lock().unwrap().len(), 1, "logged once");
    }
}
