//! Serving HTTP/1.1 connections that park while idle: a connection quiet for
//! [`GRACE`] between requests ends its hyper connection and waits on the bare socket (see
//! `sluice_io::park` for the stream wrapper and the rules), here counted in the metrics and
//! closed on drain or after the header read timeout.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use sluice_io::park::{Counted, GRACE, InFlight, Parkable, Watch, Watched};
use sluice_io::timer::CoarseTimer;

use http::{Request, Response};
use hyper::body::Incoming;

use crate::config::store::Store;
use crate::listener::server::{Drain, until_drained};
use crate::upstream::body::ProxyBody;

/// The future hyper keeps for one request: `answer`, with `request` attached to its response.
///
/// NB: `map`, not an async block awaiting `answer`: that block keeps room for the answer
/// twice (captured, then awaited), and hyper boxes this future with each connection and
/// moves it into that box with each request.
fn attached<S, F>(
    request: InFlight<S>,
    answer: F,
) -> impl std::future::Future<Output = Result<Response<Counted<ProxyBody, S>>, std::convert::Infallible>>
where
    F: std::future::Future<Output = Response<ProxyBody>>,
{
    answer.map(move |resp| Ok(request.attach(resp)))
}

/// Serves an HTTP/1.1 connection until it ends or `drain` fires (see [`until_drained`]),
/// parking it whenever it is quiet for [`GRACE`] between requests: `handle` answers each
/// request. A parked connection is closed when `drain` fires or when it has waited
/// `header_read_timeout` in all for its next request (the bound hyper's header timer puts on
/// an idle connection). For TLS connections; plain ones park as the bare socket
/// (`server::plain_connection`, with [`until_parked`] and [`parked`]).
///
/// NB: what a parked connection's task keeps is this future's state, so it holds only the
/// stream and a few handles: the hyper connection and what serves it live in a box that is
/// freed when the connection parks (issue 21: the task of a parked connection took
/// 1.5 KB, measured with `bench/idle-heap.sh`).
pub(crate) async fn serve_h1<S, H, F>(
    mut io: S,
    timer: CoarseTimer,
    store: Arc<Store>,
    h1: Arc<hyper::server::conn::http1::Builder>,
    header_read_timeout: Duration,
    drain: Drain,
    handle: H,
) -> Result<(), hyper::Error>
where
    S: Parkable + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<ProxyBody>> + Send + 'static,
{
    loop {
        io = match until_parked(io, &timer, &h1, &drain, handle.clone()).await {
            (Ok(()), Some(io)) => io,
            (result, _) => return result,
        };
        io.release_buffers();
        if !parked(&io, &store, &timer, header_read_timeout, &drain).await {
            return Ok(());
        }
    }
}

/// Waits while the connection on `io` is parked: true once its next request is coming (the
/// socket is readable), false when it is to be closed (`drain` fired, it waited
/// `header_read_timeout` in all, counting the [`GRACE`] before it parked, up to a second
/// more: [`sluice_io::timer::FAR_RESOLUTION`] and a
/// [`sluice_io::timer::RESOLUTION`]; or an error).
/// Counted in `sluice_dataplane_parked_connections` meanwhile.
pub(crate) async fn parked<S: Parkable>(
    io: &S,
    store: &Store,
    timer: &CoarseTimer,
    header_read_timeout: Duration,
    drain: &Drain,
) -> bool {
    let _parked = Parked::new(store);
    // NB: thousands of parked connections may wait at once: on the timer's far list.
    let idle = timer.sleep_far(header_read_timeout.saturating_sub(GRACE));
    tokio::select! {
        biased;
        _ = drain.draining() => false,
        readable = std::future::poll_fn(|cx| io.poll_read_ready(cx)) => readable.is_ok(),
        _ = idle => false,
    }
}

/// What [`until_parked`] returns: the connection's result, and its stream when it parked.
pub(crate) type Served<S> = (Result<(), hyper::Error>, Option<S>);

/// One hyper connection on `io`, until it ends or parks ([`serve_until_parked`]), boxed.
/// NB: a plain function, so that no unboxed copy of the future takes room in the caller's
/// state.
pub(crate) fn until_parked<'a, S, H, F>(
    io: S,
    timer: &'a CoarseTimer,
    h1: &'a hyper::server::conn::http1::Builder,
    drain: &'a Drain,
    handle: H,
) -> Pin<Box<impl std::future::Future<Output = Served<S>> + Send + 'a>>
where
    S: Parkable + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<ProxyBody>> + Send + 'static,
{
    Box::pin(serve_until_parked(io, timer, h1, drain, handle))
}

/// One hyper connection on `io`, until it ends or parks: its result, and the stream when it
/// parked.
async fn serve_until_parked<S, H, F>(
    io: S,
    timer: &CoarseTimer,
    h1: &hyper::server::conn::http1::Builder,
    drain: &Drain,
    handle: H,
) -> Served<S>
where
    S: Parkable + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let watch = Watch::new();
    let service = {
        let watch = Arc::clone(&watch);
        service_fn(move |req| attached(watch.begin_for(&req), handle(req)))
    };
    let watched = Watched::new(io, Arc::clone(&watch), timer.clone());
    let result = {
        let served = h1
            .serve_connection(TokioIo::new(watched), service)
            .with_upgrades();
        tokio::pin!(served);
        until_drained(served, drain.clone(), |c| c.graceful_shutdown()).await
        // `served` is dropped here: a parked stream is in `watch` from then on.
    };
    (result, watch.take_parked())
}

thread_local! {
    /// Connections parked on this worker thread (a worker's connections all run on it).
    static PARKED_HERE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Connections parked on the calling worker thread: they hold no buffers, so the worker's
/// heap trim counts them as closed (`server::spawn_idle_trim`).
pub(crate) fn parked_on_this_thread() -> usize {
    PARKED_HERE.with(std::cell::Cell::get)
}

/// Counts a parked connection in `sluice_dataplane_parked_connections` and in its worker's
/// [`parked_on_this_thread`] while it lives.
struct Parked<'a>(&'a Store);

impl<'a> Parked<'a> {
    fn new(store: &'a Store) -> Self {
        store.metrics().parked_connections.inc();
        PARKED_HERE.with(|p| p.set(p.get() + 1));
        Parked(store)
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.metrics().parked_connections.dec();
        PARKED_HERE.with(|p| p.set(p.get().saturating_sub(1)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// hyper boxes a connection's request future and moves it with each request: wrapping
    /// the handler's answer must not add the answer's size again.
    #[test]
    fn the_request_future_hyper_keeps_is_the_answer_and_a_guard() {
        let answer = async {
            let held = [7u8; 4096];
            tokio::task::yield_now().await;
            Response::new(ProxyBody::full(held[4095].to_string()))
        };
        let answer_size = std::mem::size_of_val(&answer);
        assert!(answer_size >= 4096, "{answer_size}");
        let watch = Watch::<tokio::net::TcpStream>::new();
        let kept = attached(watch.begin(), answer);
        let size = std::mem::size_of_val(&kept);
        assert!(
            size <= answer_size + 64,
            "the request future takes {size} bytes for an answer of {answer_size}"
        );
    }
}
