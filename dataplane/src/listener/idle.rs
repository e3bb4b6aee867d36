//! Parking idle HTTP/1.1 keep-alive connections without their buffers.
//!
//! Why: hyper's HTTP/1.1 server keeps a connection's read buffer (8 KiB once it has read),
//! its header-write buffer (8 KiB, allocated with the connection) and the slot of the
//! request future for as long as the connection lives. 10,000 idle keep-alive clients
//! cost Sluice about 25 KB each, where nginx, which frees a keep-alive connection's
//! buffers while it waits, needs under 1 KB (issue 21, `sluice-bench conns`).
//!
//! How: a connection that has waited [`GRACE`] for its next request, with no request in
//! flight, nothing read since the last one ended and nothing left to send, is *parked*.
//! Its hyper connection is ended: the next read returns end-of-stream, which hyper takes
//! as the client closing an idle connection (a clean end, with an empty buffer), and the
//! socket is kept. The connection's task then holds only the socket and waits for it to
//! become readable; the next request gets a new hyper connection.
//!
//! [`Watched`] wraps the stream and [`Watch`] is what it shares with the service: requests
//! in flight (from the service call until hyper drops the response body, which it does once
//! the body is written), whether a read returned bytes since the last request ended, and
//! whether a write waits for its flush. hyper reads the socket between requests only when
//! its buffer holds no complete request head. With no byte read since the last request
//! ended, that buffer is empty, except in one case: a read that carried a request and also
//! the start of the next one (pipelining), after which the client stops mid-head for
//! [`GRACE`]. hyper then sees a head cut short and closes the connection, as its header
//! timeout would have later.
//!
//! An upgraded connection (101: WebSocket) is never parked, and neither is one with bytes
//! it could not send yet (a client that does not read).

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt as _;
use http_body::{Body, Frame, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use http::{Request, Response};
use hyper::body::Incoming;

use crate::config::store::Store;
use crate::listener::server::{Drain, until_drained};
use crate::upstream::body::ProxyBody;
use sluice_io::send_timeout::SendTimeout;
use sluice_io::timer::{CoarseSleep, CoarseTimer};
use sluice_io::wbatch::BatchedStream;

/// How long a connection waits for its next request before it is parked (fired on the
/// worker's coarse timer: 250 to 350 ms).
///
/// NB: a connection that is not parked yet holds hyper's buffers, about 23 KB. With 2 s,
/// 9,000 clients that each sent a request within 2 s held 218 MiB at the peak while nginx,
/// which frees a keep-alive connection's buffers at once, stayed at 21 MiB (issue 21,
/// `sluice-bench suite --scenario idle`). Clients that send back to back (a page's
/// resources, a pooled API client under load) wait far less than this and keep their
/// hyper connection; one that comes back later pays for a new one (a few microseconds).
pub(crate) const GRACE: Duration = Duration::from_millis(250);

/// A stream that can be parked: it says whether bytes wait to be sent, and can free what it
/// keeps between writes.
pub(crate) trait Parkable: AsyncRead + AsyncWrite + Unpin {
    /// Whether written bytes wait to be sent (or a write waits for the peer).
    fn has_pending(&self) -> bool;
    /// Frees the buffers kept between writes.
    fn release_buffers(&mut self);
    /// Ready when the socket has bytes to read (or is closed).
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    /// For a stream about to be dropped: sends everything written, where closing the
    /// socket then ends the stream as well as a shutdown would (plain TCP: `close` sends the
    /// FIN that `shutdown` would). `None` where the shutdown itself writes something (TLS:
    /// close_notify).
    fn poll_send_all(&mut self, _cx: &mut Context<'_>) -> Option<Poll<io::Result<()>>> {
        None
    }
}

impl Parkable for SendTimeout<BatchedStream> {
    fn has_pending(&self) -> bool {
        self.is_stalled() || self.get_ref().has_pending()
    }

    fn release_buffers(&mut self) {
        self.get_mut().release_buffer();
    }

    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_ref().get_ref().poll_read_ready(cx)
    }

    fn poll_send_all(&mut self, cx: &mut Context<'_>) -> Option<Poll<io::Result<()>>> {
        Some(self.poll_bounded(cx, |io, cx| io.poll_send_all(cx)))
    }
}

/// The bare socket of a parked plain connection (nothing to send, no buffers).
impl Parkable for tokio::net::TcpStream {
    fn has_pending(&self) -> bool {
        false
    }

    fn release_buffers(&mut self) {}

    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        tokio::net::TcpStream::poll_read_ready(self, cx)
    }
}

/// NB: when hyper's read of a TLS stream is pending, rustls holds no decrypted bytes (it
/// hands those out before it reads the socket); a record cut short stays in rustls and its
/// rest makes the socket readable.
impl Parkable for tokio_rustls::server::TlsStream<SendTimeout<BatchedStream>> {
    fn has_pending(&self) -> bool {
        let (io, tls) = self.get_ref();
        tls.wants_write() || io.has_pending()
    }

    fn release_buffers(&mut self) {
        self.get_mut().0.release_buffers();
    }

    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_ref().0.poll_read_ready(cx)
    }
}

/// What a connection's service and its [`Watched`] stream share.
#[derive(Debug)]
pub(crate) struct Watch<S> {
    in_flight: AtomicUsize,
    /// A read returned bytes since the last request ended (or the hyper connection began).
    read: AtomicBool,
    /// A 101 was sent: the stream belongs to the upgraded session from then on.
    upgraded: AtomicBool,
    /// The stream, once its hyper connection was told end-of-stream and dropped it.
    parked: Mutex<Option<S>>,
}

impl<S> Watch<S> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Watch {
            in_flight: AtomicUsize::new(0),
            read: AtomicBool::new(false),
            upgraded: AtomicBool::new(false),
            parked: Mutex::new(None),
        })
    }

    /// A request started (the service was called); it counts until the returned guard,
    /// attached to its response with [`InFlight::attach`], is dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight<S> {
        self.in_flight.fetch_add(1, Relaxed);
        InFlight(Arc::clone(self))
    }

    /// The stream, if its hyper connection ended because it was parked.
    pub(crate) fn take_parked(&self) -> Option<S> {
        match self.parked.lock() {
            Ok(mut g) => g.take(),
            Err(p) => p.into_inner().take(),
        }
    }

    fn quiet(&self) -> bool {
        self.in_flight.load(Relaxed) == 0
            && !self.read.load(Relaxed)
            && !self.upgraded.load(Relaxed)
    }
}

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

/// One request in flight (see [`Watch::begin`]).
#[derive(Debug)]
pub(crate) struct InFlight<S>(Arc<Watch<S>>);

impl<S> InFlight<S> {
    /// `resp` with this guard in its body: the request counts until hyper drops the body.
    pub(crate) fn attach<B>(self, resp: http::Response<B>) -> http::Response<Counted<B, S>> {
        if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
            self.0.upgraded.store(true, Relaxed);
        }
        resp.map(|body| Counted {
            body,
            _request: self,
        })
    }
}

impl<S> Drop for InFlight<S> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Relaxed) == 1 {
            self.0.read.store(false, Relaxed);
        }
    }
}

/// A response body that keeps its request counted (see [`InFlight::attach`]).
#[derive(Debug)]
pub(crate) struct Counted<B, S> {
    body: B,
    _request: InFlight<S>,
}

impl<B: Body<Data = Bytes> + Unpin, S> Body for Counted<B, S> {
    type Data = Bytes;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The stream of one hyper connection, which ends it with end-of-stream once the
/// connection is quiet for [`GRACE`] (see the module documentation).
pub(crate) struct Watched<S: Parkable> {
    io: Option<S>,
    watch: Arc<Watch<S>>,
    timer: CoarseTimer,
    /// Armed while hyper waits for a request on a quiet connection.
    grace: Option<CoarseSleep>,
    /// A write went through that was not flushed yet.
    unflushed: bool,
    /// End-of-stream was returned: the stream is parked when hyper drops it.
    parking: bool,
}

impl<S: Parkable> Watched<S> {
    pub(crate) fn new(io: S, watch: Arc<Watch<S>>, timer: CoarseTimer) -> Self {
        Watched {
            io: Some(io),
            watch,
            timer,
            grace: None,
            unflushed: false,
            parking: false,
        }
    }

    fn io(&mut self) -> io::Result<&mut S> {
        self.io
            .as_mut()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }
}

impl<S: Parkable> Drop for Watched<S> {
    fn drop(&mut self) {
        if self.parking
            && let Some(io) = self.io.take()
            && let Ok(mut slot) = self.watch.parked.lock()
        {
            *slot = Some(io);
        }
    }
}

impl<S: Parkable> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.parking {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let io = this.io()?;
        match Pin::new(io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.watch.read.store(true, Relaxed);
                }
                this.grace = None;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if !this.watch.quiet() {
                    this.grace = None;
                    return Poll::Pending;
                }
                loop {
                    let timer = &this.timer;
                    let grace = this.grace.get_or_insert_with(|| timer.sleep(GRACE));
                    if Pin::new(grace).poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    this.grace = None;
                    // NB: checked when the grace ends, not when it starts: the response's
                    // last bytes are usually still queued for the end of the turn then.
                    // Bytes a client has not taken yet: wait another grace.
                    let sent =
                        !this.unflushed && this.io.as_ref().is_some_and(|io| !io.has_pending());
                    if sent {
                        this.parking = true;
                        return Poll::Ready(Ok(()));
                    }
                }
            }
        }
    }
}

impl<S: Parkable> AsyncWrite for Watched<S> {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(this.io()?).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.unflushed = true;
        }
        polled
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(this.io()?).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.unflushed = true;
        }
        polled
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        self.io.as_ref().is_some_and(|io| io.is_write_vectored())
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(this.io()?).poll_flush(cx);
        if matches!(polled, Poll::Ready(Ok(()))) {
            this.unflushed = false;
        }
        polled
    }

    /// A parked stream is kept open: hyper shuts down what it takes for a closed connection.
    ///
    /// NB: hyper shuts a connection down just before it drops it, so a plain TCP stream only
    /// sends what it holds ([`Parkable::poll_send_all`]): its `close` sends the FIN, and the
    /// `shutdown` system call would add nothing but its cost (issue 21, plain connection
    /// churn; with unread bytes, `close` resets the connection either way). An upgraded one
    /// (WebSocket) is shut down for real: its session half-closes it and reads on.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.parking {
            return Poll::Ready(Ok(()));
        }
        let upgraded = this.watch.upgraded.load(Relaxed);
        let io = this.io()?;
        if !upgraded && let Some(sent) = io.poll_send_all(cx) {
            return sent;
        }
        Pin::new(io).poll_shutdown(cx)
    }
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
        service_fn(move |req| attached(watch.begin(), handle(req)))
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
