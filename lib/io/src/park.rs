//! Parking idle HTTP/1.1 keep-alive connections without their buffers: the stream wrapper
//! and what it shares with the service. The dataplane's `listener::idle` serves the
//! connections with it (hyper, drain, metrics).
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
//! the start of the next one (pipelining), after which the client stops mid-head. Parking
//! then would lose that start (hyper sees a head cut short), so a connection whose last
//! bytes read do not end a request head (`\r\n\r\n`) is not parked after a request
//! without a body: hyper keeps it, and its header timeout bounds the wait for the rest.
//! After a request with a body, the bytes read end with the body, which cannot be told
//! from a pipelined head's start without parsing; such a connection parks as before (a
//! client pipelining after a request with a body and stopping mid-head for [`GRACE`] has
//! that head dropped: RFC 9112 §9.3.2 asks clients not to pipeline after non-idempotent
//! requests, and the client retries it as after any closed keep-alive connection).
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
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::send_timeout::SendTimeout;
use crate::timer::{CoarseSleep, CoarseTimer};
use crate::wbatch::BatchedStream;

/// How long a connection waits for its next request before it is parked (fired on the
/// worker's coarse timer: 250 to 350 ms).
///
/// NB: a connection that is not parked yet holds hyper's buffers, about 23 KB. With 2 s,
/// 9,000 clients that each sent a request within 2 s held 218 MiB at the peak while nginx,
/// which frees a keep-alive connection's buffers at once, stayed at 21 MiB (issue 21,
/// `sluice-bench suite --scenario idle`). Clients that send back to back (a page's
/// resources, a pooled API client under load) wait far less than this and keep their
/// hyper connection; one that comes back later pays for a new one (a few microseconds).
pub const GRACE: Duration = Duration::from_millis(250);

/// A stream that can be parked: it says whether bytes wait to be sent, and can free what it
/// keeps between writes.
pub trait Parkable: AsyncRead + AsyncWrite + Unpin {
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
    #[inline]
    fn has_pending(&self) -> bool {
        self.is_stalled() || self.get_ref().has_pending()
    }

    #[inline]
    fn release_buffers(&mut self) {
        self.get_mut().release_buffer();
    }

    #[inline]
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_ref().get_ref().poll_read_ready(cx)
    }

    #[inline]
    fn poll_send_all(&mut self, cx: &mut Context<'_>) -> Option<Poll<io::Result<()>>> {
        Some(self.poll_bounded(cx, |io, cx| io.poll_send_all(cx)))
    }
}

/// The bare socket of a parked plain connection (nothing to send, no buffers).
impl Parkable for tokio::net::TcpStream {
    #[inline]
    fn has_pending(&self) -> bool {
        false
    }

    #[inline]
    fn release_buffers(&mut self) {}

    #[inline]
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        tokio::net::TcpStream::poll_read_ready(self, cx)
    }
}

/// NB: when hyper's read of a TLS stream is pending, rustls holds no decrypted bytes (it
/// hands those out before it reads the socket); a record cut short stays in rustls and its
/// rest makes the socket readable.
impl Parkable for tokio_rustls::server::TlsStream<SendTimeout<BatchedStream>> {
    #[inline]
    fn has_pending(&self) -> bool {
        let (io, tls) = self.get_ref();
        tls.wants_write() || io.has_pending()
    }

    #[inline]
    fn release_buffers(&mut self) {
        self.get_mut().0.release_buffers();
    }

    #[inline]
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_ref().0.poll_read_ready(cx)
    }
}

/// What a connection's service and its [`Watched`] stream share.
#[derive(Debug)]
pub struct Watch<S> {
    in_flight: AtomicUsize,
    /// A read returned bytes since the last request ended (or the hyper connection began).
    read: AtomicBool,
    /// A 101 was sent: the stream belongs to the upgraded session from then on.
    upgraded: AtomicBool,
    /// The last request that started had a body.
    had_body: AtomicBool,
    /// The stream, once its hyper connection was told end-of-stream and dropped it.
    parked: Mutex<Option<S>>,
}

impl<S> Watch<S> {
    /// A connection's watch: no request in flight, nothing read, not upgraded or parked.
    pub fn new() -> Arc<Self> {
        Arc::new(Watch {
            in_flight: AtomicUsize::new(0),
            read: AtomicBool::new(false),
            upgraded: AtomicBool::new(false),
            had_body: AtomicBool::new(false),
            parked: Mutex::new(None),
        })
    }

    /// A request started (the service was called); it counts until the returned guard,
    /// attached to its response with [`InFlight::attach`], is dropped.
    pub fn begin(self: &Arc<Self>) -> InFlight<S> {
        self.in_flight.fetch_add(1, Relaxed);
        InFlight(Arc::clone(self))
    }

    /// [`Watch::begin`] for `req`, noting whether it has a body (see the module docs: what
    /// the bytes read last may end with).
    pub fn begin_for<B: Body>(self: &Arc<Self>, req: &http::Request<B>) -> InFlight<S> {
        self.had_body.store(!req.body().is_end_stream(), Relaxed);
        self.begin()
    }

    /// The stream, if its hyper connection ended because it was parked.
    pub fn take_parked(&self) -> Option<S> {
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

/// One request in flight (see [`Watch::begin`]).
#[derive(Debug)]
pub struct InFlight<S>(Arc<Watch<S>>);

impl<S> InFlight<S> {
    /// `resp` with this guard in its body: the request counts until hyper drops the body.
    pub fn attach<B>(self, resp: http::Response<B>) -> http::Response<Counted<B, S>> {
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
pub struct Counted<B, S> {
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
pub struct Watched<S: Parkable> {
    io: Option<S>,
    watch: Arc<Watch<S>>,
    timer: CoarseTimer,
    /// Armed while hyper waits for a request on a quiet connection.
    grace: Option<CoarseSleep>,
    /// A write went through that was not flushed yet.
    unflushed: bool,
    /// End-of-stream was returned: the stream is parked when hyper drops it.
    parking: bool,
    /// The last four bytes read (a request head ends with `\r\n\r\n`).
    tail: u32,
}

/// `\r\n\r\n` as [`Watched::tail`] holds it.
const HEAD_END: u32 = u32::from_be_bytes(*b"\r\n\r\n");

impl<S: Parkable> Watched<S> {
    /// `io` for one hyper connection, sharing `watch` with its service; the grace is timed
    /// on `timer` (the worker's).
    pub fn new(io: S, watch: Arc<Watch<S>>, timer: CoarseTimer) -> Self {
        Watched {
            io: Some(io),
            watch,
            timer,
            grace: None,
            unflushed: false,
            parking: false,
            // NB: nothing read yet is a boundary too.
            tail: HEAD_END,
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
                let read = &buf.filled()[before..];
                if !read.is_empty() {
                    this.watch.read.store(true, Relaxed);
                    let last = &read[read.len().saturating_sub(4)..];
                    this.tail = last.iter().fold(this.tail, |t, &b| (t << 8) | u32::from(b));
                }
                this.grace = None;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                // NB: after a request without a body, bytes read that do not end a head
                // are the start of a pipelined one, in hyper's buffer: never parked.
                let boundary = this.tail == HEAD_END || this.watch.had_body.load(Relaxed);
                if !this.watch.quiet() || !boundary {
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
