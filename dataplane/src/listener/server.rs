//! Listeners and workers: `--workers N` threads, each with its own single-threaded runtime
//! and its own `SO_REUSEPORT` listener, so workers share nothing on the accept path.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::config::store::Store;
use crate::http::ConnInfo;
use crate::listener::idle;
use crate::listener::proxy_protocol::{self, ProxyProtocol};
use crate::request::handle;
use sluice_io::send_timeout::SendTimeout;
use sluice_io::timer::CoarseTimer;

/// Limits on the downstream side.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most open downstream connections per worker.
    pub max_connections: usize,
    /// Time a client may take to send a request head (slowloris guard).
    pub header_read_timeout: Duration,
    /// Largest request head buffer, bytes.
    pub max_header_bytes: usize,
    /// Most request headers.
    pub max_headers: usize,
    /// How long an HTTP/2 connection may stay without a request in flight before it is
    /// closed (nginx `keepalive_timeout`; an HTTP/1.1 connection waiting for its next
    /// request is bounded by `header_read_timeout`). Its first request must come within
    /// `header_read_timeout`, preface included.
    pub idle_timeout: Duration,
    /// Longest pause between two pieces of a request body (nginx `client_body_timeout`);
    /// past it the request is answered 408.
    pub client_body_timeout: Duration,
    /// Longest a write to a client may wait for it to read (nginx `send_timeout`); past it
    /// the connection is closed.
    pub send_timeout: Duration,
    /// On a listener that requires the PROXY protocol: time a client (its load balancer) has
    /// to send the whole header ([`crate::listener::proxy_protocol`]).
    pub proxy_header_timeout: Duration,
}

impl Default for Limits {
    /// 10,000 connections per worker, 30 s to send a head, 64 KiB and 100 headers, 60 s
    /// idle (APISIX's `keepalive_timeout`), 60 s between pieces of a request body, 60 s for a
    /// client to read what is sent to it, 5 s for a PROXY header.
    fn default() -> Self {
        Limits {
            max_connections: 10_000,
            header_read_timeout: Duration::from_secs(30),
            max_header_bytes: crate::http::MAX_HEADER_BYTES,
            max_headers: 100,
            idle_timeout: Duration::from_secs(60),
            client_body_timeout: crate::http::CLIENT_BODY_TIMEOUT,
            send_timeout: Duration::from_secs(60),
            proxy_header_timeout: Duration::from_secs(5),
        }
    }
}

/// The requests in flight on one HTTP/2 connection, and when the last one ended: hyper's
/// HTTP/2 server has no timeout of its own for a client that sends a preface and nothing
/// more, or opens a connection and never uses it.
#[derive(Debug, Clone)]
pub(crate) struct Activity(Arc<ActivityState>);

#[derive(Debug)]
struct ActivityState {
    started: std::time::Instant,
    in_flight: std::sync::atomic::AtomicUsize,
    /// Milliseconds from `started` to the end of the last request; `u64::MAX` before any.
    last_ms: std::sync::atomic::AtomicU64,
    /// The response bodies being sent (see [`Activity::watch`]).
    bodies: std::sync::Mutex<Vec<std::sync::Weak<BodyClock>>>,
}

/// When a response body last handed a frame to hyper without being asked for the next one
/// since: milliseconds from the connection's start, `u64::MAX` while it is asked (waiting
/// for its upstream) or done. A value that stays is a stream hyper cannot send: the
/// client's flow-control window is closed (or its socket is full).
#[derive(Debug)]
struct BodyClock(std::sync::atomic::AtomicU64);

/// A response body on an HTTP/2 connection, watched for a client that stops reading it
/// ([`Activity::stalled`]).
pub(crate) struct Watched<B> {
    body: B,
    clock: Arc<BodyClock>,
    started: std::time::Instant,
}

impl<B: http_body::Body + Unpin> http_body::Body for Watched<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::sync::atomic::Ordering::Relaxed;
        let this = &mut *self;
        this.clock.0.store(u64::MAX, Relaxed);
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && frame.is_data()
        {
            let ms = u64::try_from(this.started.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
            this.clock.0.store(ms, Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Counts one request in flight until dropped (see [`Activity::begin`]).
pub(crate) struct InFlightRequest(Activity);

impl Drop for InFlightRequest {
    fn drop(&mut self) {
        let s = &self.0.0;
        let ms = u64::try_from(s.started.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        s.last_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
        s.in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Activity {
    pub(crate) fn new() -> Self {
        Activity(Arc::new(ActivityState {
            started: std::time::Instant::now(),
            in_flight: std::sync::atomic::AtomicUsize::new(0),
            last_ms: std::sync::atomic::AtomicU64::new(u64::MAX),
            bodies: std::sync::Mutex::new(Vec::new()),
        }))
    }

    /// `resp` with its body watched for a client that stops reading it.
    pub(crate) fn watch<B>(&self, resp: http::Response<B>) -> http::Response<Watched<B>> {
        let clock = Arc::new(BodyClock(std::sync::atomic::AtomicU64::new(u64::MAX)));
        {
            let mut bodies = sluice_io::lock(&self.0.bodies);
            if bodies.len() >= 64 {
                bodies.retain(|w| w.strong_count() > 0);
            }
            bodies.push(Arc::downgrade(&clock));
        }
        let started = self.0.started;
        resp.map(|body| Watched {
            body,
            clock,
            started,
        })
    }

    /// Resolves once a response body has waited longer than `limit` for the client to
    /// take its data (nginx's `send_timeout`, per stream): checked every `limit / 4`.
    async fn stalled(&self, limit: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let every = (limit / 4).max(Duration::from_millis(50));
        loop {
            tokio::time::sleep(every).await;
            let now = u64::try_from(self.0.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            let limit = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
            let mut bodies = sluice_io::lock(&self.0.bodies);
            bodies.retain(|w| w.strong_count() > 0);
            let stalled = bodies.iter().filter_map(std::sync::Weak::upgrade).any(|c| {
                let handed = c.0.load(Relaxed);
                handed != u64::MAX && now.saturating_sub(handed) > limit
            });
            if stalled {
                return;
            }
        }
    }

    /// A request started; it counts until the returned guard is dropped.
    pub(crate) fn begin(&self) -> InFlightRequest {
        self.0
            .in_flight
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        InFlightRequest(self.clone())
    }

    /// Whether the connection has carried a request (or carries one now).
    fn has_carried_a_request(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.0.in_flight.load(Relaxed) > 0 || self.0.last_ms.load(Relaxed) != u64::MAX
    }

    /// Resolves once the connection has carried a request (checked every 50 ms: only
    /// connections still silent during the shutdown delay wait here).
    async fn first_request(&self) {
        while !self.has_carried_a_request() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Resolves once the connection has had no request in flight for `idle` (for
    /// `first` from its start, before any request).
    pub(crate) async fn idle(&self, first: Duration, idle: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.0;
        loop {
            let last = s.last_ms.load(Relaxed);
            let (since, limit) = match last {
                u64::MAX => (Duration::ZERO, first),
                ms => (Duration::from_millis(ms), idle),
            };
            let due = s.started + since + limit;
            if s.in_flight.load(Relaxed) == 0 && std::time::Instant::now() >= due {
                return;
            }
            let wake = due.max(std::time::Instant::now() + Duration::from_millis(100));
            tokio::time::sleep_until(wake.into()).await;
        }
    }
}

/// Serves an HTTP/2 connection until it ends, `drain` fires, the shutdown delay starts and
/// the connection has carried a request, or it has had no request in flight past the
/// limits (`activity` is what its requests report to); all but the first shut it down
/// gracefully: GOAWAY, and the streams already open finish (a connection that never
/// carried a request is closed at once). A response whose data the client has not taken
/// for `send_timeout` (a flow-control window left closed) closes the connection at once:
/// its streams would otherwise pin their upstream connections for ever.
///
/// NB: during the shutdown delay a new connection gets its GOAWAY only after its first
/// request has arrived: a GOAWAY right after the preface could reach a client before it
/// sent anything, and send it back to the same pod.
///
/// NB: a request counts until its response head is sent; a long response body on an
/// otherwise idle connection gets a GOAWAY after `idle_timeout`, and finishes.
pub(crate) async fn serve_h2<F, E>(
    conn: F,
    activity: Activity,
    limits: Limits,
    mut drain: Drain,
    shutdown: impl FnOnce(Pin<&mut F>),
) -> Result<(), E>
where
    F: Future<Output = Result<(), E>>,
{
    tokio::pin!(conn);
    let mut away = drain.clone();
    tokio::select! {
        r = conn.as_mut() => return r,
        _ = drain.wait() => {}
        _ = async {
            away.going_away().await;
            activity.first_request().await;
        } => {}
        () = activity.stalled(limits.send_timeout) => {
            // NB: a stream whose data the client does not take (a closed flow-control
            // window) would pin its upstream connection forever; a graceful shutdown would
            // wait for it. The connection is closed, as nginx's send_timeout closes it.
            tracing::debug!("HTTP/2 connection closed: a response waited past send_timeout");
            return Ok(());
        }
        _ = activity.idle(limits.header_read_timeout, limits.idle_timeout) => {
            // Never a request (a preface that never completed, or silence): nothing to
            // finish, and no GOAWAY owed to a peer that has not spoken HTTP/2.
            if activity.0.last_ms.load(std::sync::atomic::Ordering::Relaxed) == u64::MAX {
                return Ok(());
            }
        }
    }
    shutdown(conn.as_mut());
    conn.await
}

/// Binds `addr` with `SO_REUSEPORT`, so every worker gets a listener of its own.
pub fn bind_reuseport(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// Turns Nagle's algorithm off for the connections `listener` accepts. On Linux an accepted
/// socket inherits `TCP_NODELAY` from its listener, so it is set once here instead of once
/// per connection (a system call per connection: issue 21, plain connection churn);
/// elsewhere each connection still sets it ([`nodelay_per_connection`]).
pub(crate) fn nodelay_for_accepted(listener: &TcpListener) {
    if let Err(error) = socket2::SockRef::from(listener).set_tcp_nodelay(true) {
        tracing::warn!(%error, "TCP_NODELAY on the listener");
    }
}

/// What a listener needs per accepted connection besides [`nodelay_for_accepted`].
pub(crate) fn nodelay_per_connection(stream: &tokio::net::TcpStream) {
    if !cfg!(target_os = "linux") {
        let _ = stream.set_nodelay(true);
    }
}

/// The HTTP/2 connection preface a client with prior knowledge sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Most bytes the sniff reads at once: they go to hyper first, so a request head this size
/// or smaller is read with one system call.
const SNIFF_READ: usize = 2048;

/// Whether the client speaks HTTP/2 with prior knowledge (h2c), judged from its first bytes,
/// which are returned too: they are read (not peeked) and handed to hyper before the socket
/// ([`sluice_io::wbatch::BatchedStream::with_unread`]). `None` when the client sent
/// nothing conclusive within `timeout` (the header read timeout) or closed: the connection
/// is then closed.
///
/// NB: deciding this ourselves, once per connection, lets each connection be served by
/// hyper's HTTP/1 or HTTP/2 server directly, without the auto-detecting wrapper that costs
/// about 2% of the CPU per request. Reading instead of peeking saves a system call per
/// connection (issue 21, plain connection churn), and sees a close after a partial `P`/`PR`.
///
/// NB: through `AsyncRead`, not `try_read_buf`: a read that does not fill the buffer then
/// clears the socket's readiness, so hyper's next read waits for the reactor instead of
/// trying the socket once more for nothing (`EAGAIN`).
///
/// `buf`: bytes the client already sent (what followed its PROXY header), judged first.
async fn sniff_h2(
    stream: &mut tokio::net::TcpStream,
    timeout: Duration,
    mut buf: Vec<u8>,
) -> Option<(bool, Bytes)> {
    use tokio::io::AsyncReadExt;
    buf.reserve(SNIFF_READ);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if buf.is_empty() {
            let n = tokio::time::timeout_at(deadline, stream.read_buf(&mut buf))
                .await
                .ok()?
                .ok()?;
            if n == 0 {
                return None;
            }
        }
        let n = buf.len().min(3);
        if buf[..n] != H2_PREFACE[..n] {
            return Some((false, buf.into()));
        }
        if n == 3 {
            // No HTTP/1 request starts with `PRI`.
            return Some((true, buf.into()));
        }
        // A partial `P` or `PR`: the rest is read once it comes.
        let more = tokio::time::timeout_at(deadline, stream.read_buf(&mut buf))
            .await
            .ok()?
            .ok()?;
        if more == 0 {
            return None;
        }
    }
}

/// Where the process is in its shutdown; each phase includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Serving,
    /// The shutdown delay: listeners still accept and serve, but every connection is asked
    /// to go away (HTTP/1.1 `Connection: close`, HTTP/2 GOAWAY), so clients move to other
    /// pods while the endpoint is being removed.
    GoingAway,
    /// Listeners closed; in-flight requests finish, idle connections close.
    Draining,
}

/// Tells workers to shut down: [`go_away`](Self::go_away) during the shutdown delay, then
/// [`drain`](Self::drain).
#[derive(Debug)]
pub struct DrainTrigger {
    phase: tokio::sync::watch::Sender<Phase>,
    going_away: Arc<AtomicBool>,
    waiters: Arc<Waiters>,
}

impl DrainTrigger {
    /// Starts the shutdown delay: workers keep accepting and serving, an HTTP/1.1 response
    /// carries `Connection: close` (and its connection closes once it is sent), an HTTP/2
    /// connection gets a graceful GOAWAY once it has carried a request.
    pub fn go_away(&self) {
        self.going_away.store(true, Ordering::Relaxed);
        self.phase.send_if_modified(|p| {
            let earlier = *p < Phase::GoingAway;
            if earlier {
                *p = Phase::GoingAway;
            }
            earlier
        });
    }

    /// Starts draining every worker given the matching [`Drain`]: stop accepting, finish
    /// in-flight requests, close idle connections.
    pub fn drain(&self) {
        self.going_away.store(true, Ordering::Relaxed);
        let _ = self.phase.send(Phase::Draining);
        self.waiters.draining.store(true, Ordering::Release);
        // NB: after the flag is set: a `Draining` that registers from here on sees it.
        let mut slots = self.waiters.lock();
        for waker in slots.wakers.iter_mut().filter_map(Option::take) {
            waker.wake();
        }
    }
}

/// The tasks waiting on a [`Drain`] through [`Drain::draining`]: woken by
/// [`DrainTrigger::drain`].
///
/// NB: a slot per waiting task, reused through a free list. Every connection registers
/// while it is served and every worker's accept loop waits on it: with a `watch` channel
/// and its `Notify` that cost about 850 instructions per registration, and a `HashMap`
/// keyed by id hashed twice per connection (issue 21).
#[derive(Debug, Default)]
struct Waiters {
    /// Set once draining has started, before the wakers are woken.
    draining: AtomicBool,
    slots: std::sync::Mutex<Slots>,
}

/// [`Waiters`]' wakers by slot; a slot stays taken until its [`Draining`] is done with it,
/// even once its waker was woken.
#[derive(Debug, Default)]
struct Slots {
    wakers: Vec<Option<std::task::Waker>>,
    free: Vec<usize>,
}

impl Slots {
    fn take(&mut self, waker: std::task::Waker) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.wakers[i] = Some(waker);
                i
            }
            None => {
                self.wakers.push(Some(waker));
                self.wakers.len() - 1
            }
        }
    }

    fn give_back(&mut self, i: usize) {
        if let Some(w) = self.wakers.get_mut(i) {
            *w = None;
            self.free.push(i);
        }
    }

    /// Slots taken.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.wakers.len() - self.free.len()
    }
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        sluice_io::lock(&self.slots)
    }

    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

/// [`Drain::draining`]'s future.
#[derive(Debug)]
pub(crate) struct Draining<'a> {
    drain: &'a Drain,
    /// Its slot in the drain's [`Waiters`], once polled.
    slot: Option<usize>,
}

impl Future for Draining<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let waiters = &this.drain.waiters;
        if !waiters.is_draining() {
            let mut slots = waiters.lock();
            // NB: read again under the lock, which `DrainTrigger::drain` takes after it
            // sets the flag: either this sees draining, or the trigger sees this waker.
            if !waiters.is_draining() {
                match this.slot.and_then(|i| slots.wakers.get_mut(i)) {
                    None => this.slot = Some(slots.take(cx.waker().clone())),
                    Some(Some(w)) if w.will_wake(cx.waker()) => {}
                    Some(w) => *w = Some(cx.waker().clone()),
                }
                return Poll::Pending;
            }
        }
        if let Some(i) = this.slot.take() {
            waiters.lock().give_back(i);
        }
        Poll::Ready(())
    }
}

impl Drop for Draining<'_> {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            self.drain.waiters.lock().give_back(i);
        }
    }
}

/// The workers' side of a [`DrainTrigger`].
#[derive(Debug, Clone)]
pub struct Drain {
    phase: tokio::sync::watch::Receiver<Phase>,
    // NB: read on every HTTP/1.1 response (through `ConnInfo`, cloned once per connection);
    // an atomic load costs nothing there, where the watch channel's value sits behind a
    // lock that every worker would share.
    going_away: Arc<AtomicBool>,
    waiters: Arc<Waiters>,
}

impl Drain {
    /// A trigger and its receiver.
    pub fn channel() -> (DrainTrigger, Drain) {
        let (tx, rx) = tokio::sync::watch::channel(Phase::Serving);
        let going_away = Arc::new(AtomicBool::new(false));
        let waiters = Arc::new(Waiters::default());
        (
            DrainTrigger {
                phase: tx,
                going_away: Arc::clone(&going_away),
                waiters: Arc::clone(&waiters),
            },
            Drain {
                phase: rx,
                going_away,
                waiters,
            },
        )
    }

    /// Never drains (the trigger is dropped; `wait` then stays pending).
    pub fn never() -> Drain {
        Drain::channel().1
    }

    /// Resolves once draining has started ([`draining`](Self::draining)).
    pub async fn wait(&mut self) {
        self.draining().await;
    }

    /// Whether draining has started: one atomic load.
    pub(crate) fn is_draining(&self) -> bool {
        self.waiters.is_draining()
    }

    /// Resolves once draining has started, as [`wait`](Self::wait) does, in a future of a
    /// few bytes: what a parked connection's task waits on (`wait`'s future takes about
    /// 200, which every parked connection kept; issue 21).
    pub(crate) fn draining(&self) -> Draining<'_> {
        Draining {
            drain: self,
            slot: None,
        }
    }

    /// Resolves once the shutdown delay (or draining) has started.
    pub async fn going_away(&mut self) {
        self.reached(Phase::GoingAway).await;
    }

    /// The flag a connection's [`ConnInfo::going_away`] shares: set once the shutdown delay
    /// (or draining) has started.
    pub(crate) fn going_away_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.going_away)
    }

    async fn reached(&mut self, phase: Phase) {
        if self.phase.wait_for(|p| *p >= phase).await.is_err() {
            // Trigger gone without reaching it: never.
            std::future::pending::<()>().await;
        }
    }
}

/// Asks an HTTP/1.x client to go away after `resp` once the shutdown delay has started:
/// `Connection: close`, which hyper honours by closing the connection once the response is
/// sent. An upgrade (101) keeps its `Connection: upgrade`.
#[inline]
pub(crate) fn close_if_going_away<B>(resp: &mut http::Response<B>, conn: &ConnInfo) {
    if conn.is_going_away() && resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        resp.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
}

/// Runs a connection until it ends. When `drain` fires first, `shutdown` is called on it
/// (hyper's graceful shutdown) and the connection is then run to its end.
///
/// NB: the drain signal is registered once, at the first poll; later wake-ups of the
/// connection only read the drain's flag (one atomic load) instead of polling the
/// registration again, which takes a lock (issue 2: a `Notified` future cost about 360
/// instructions per request).
pub(crate) async fn until_drained<F: Future>(
    mut conn: Pin<&mut F>,
    drain: Drain,
    shutdown: impl FnOnce(Pin<&mut F>),
) -> F::Output {
    let wait = drain.draining();
    tokio::pin!(wait);
    let mut registered = false;
    let drained = std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = conn.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        // NB: the drain wakes this task's waker, which stays the same while `conn` runs in
        // it; a drain that never comes (`Drain::never`) leaves the flag unset.
        if !registered || drain.is_draining() {
            registered = true;
            if wait.as_mut().poll(cx).is_ready() {
                return Poll::Ready(None);
            }
        }
        Poll::Pending
    })
    .await;
    match drained {
        Some(out) => out,
        None => {
            shutdown(conn.as_mut());
            conn.await
        }
    }
}

/// Streams one HTTP/2 client connection may have open at once (nginx's
/// `http2_max_concurrent_streams`): each may hold an upstream connection (HTTP/1.1
/// upstreams take one per request), so this also bounds what one client connection holds
/// upstream.
pub const MAX_CONCURRENT_STREAMS: u32 = 128;

/// hyper's HTTP/1.1 and HTTP/2 connection builders with the downstream limits; shared by
/// the HTTP and HTTPS listeners.
#[allow(clippy::type_complexity)]
pub(crate) fn connection_builders(
    limits: &Limits,
    timer: &CoarseTimer,
) -> (
    Arc<hyper::server::conn::http1::Builder>,
    Arc<hyper::server::conn::http2::Builder<TokioExecutor>>,
) {
    let mut h1 = hyper::server::conn::http1::Builder::new();
    h1.timer(timer.clone())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes)
        .max_headers(limits.max_headers)
        .writev(true);
    let mut h2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    h2.timer(timer.clone())
        .max_header_list_size(limits.max_header_bytes as u32)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS);
    (Arc::new(h1), Arc::new(h2))
}

/// Accepts connections on `listener` and serves them until the runtime stops.
pub async fn serve(listener: TcpListener, store: Arc<Store>, limits: Limits) {
    serve_until(listener, store, limits, Drain::never()).await;
}

/// A worker trims its heap (see [`set_idle_trim`]) when this many fewer connections are
/// open than at the peak since its last trim (27 KB a connection: about 7 MiB)...
const TRIM_DROP: usize = 256;
/// ...at most this often.
const TRIM_EVERY: Duration = Duration::from_secs(10);

static IDLE_TRIM: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Sets what a worker thread calls when its open connections fell [`TRIM_DROP`] below their
/// peak: the binary passes a function that returns the thread's freed memory to the OS.
/// (mimalloc keeps the pages a thread freed until that thread allocates again: measured
/// with 10,000 idle connections closed, a quiet worker held 273 MiB for as long as no
/// traffic came.) Unset, workers do nothing.
pub fn set_idle_trim(trim: fn()) {
    let _ = IDLE_TRIM.set(trim);
}

/// On this worker's runtime: once a second, compares the connections counted by
/// `permits`, less those parked (`idle::parked_on_this_thread`), with their peak and calls
/// the trim of [`set_idle_trim`] when they fell (an atomic load a second when nothing
/// changed).
pub(crate) fn spawn_idle_trim(permits: &Arc<Semaphore>, max_connections: usize) {
    let Some(trim) = IDLE_TRIM.get().copied() else {
        return;
    };
    let permits = Arc::downgrade(permits);
    tokio::spawn(async move {
        let mut peak = 0;
        // NB: the first trim may come at once: the first burst of connections to close is
        // often the largest (measured: 150 MiB kept for 10 s after 9,000 clients parked).
        let mut last: Option<tokio::time::Instant> = None;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(permits) = permits.upgrade() else {
                return;
            };
            // NB: a parked connection holds no buffers: what it held is freed like a
            // closed connection's.
            let open = max_connections
                .saturating_sub(permits.available_permits())
                .saturating_sub(crate::listener::idle::parked_on_this_thread());
            peak = peak.max(open);
            if peak - open >= TRIM_DROP && last.is_none_or(|t| t.elapsed() >= TRIM_EVERY) {
                tracing::debug!(
                    open,
                    peak,
                    "connections closed: returning freed memory to the OS"
                );
                trim();
                peak = open;
                last = Some(tokio::time::Instant::now());
            }
        }
    });
}

/// Accepts connections on `listener` and serves them until `drain` fires; then closes the
/// listener (new connections are refused), lets every open connection finish its in-flight
/// request, closes idle keep-alive connections, and returns when none is left. Before that,
/// during the shutdown delay ([`DrainTrigger::go_away`]), it still accepts and serves, and
/// asks every connection to close after its response (see `close_if_going_away` and
/// `serve_h2`).
pub async fn serve_until(listener: TcpListener, store: Arc<Store>, limits: Limits, drain: Drain) {
    serve_listener(listener, store, limits, drain, None, None).await;
}

/// Like [`serve_until`], with `--proxy-protocol`: `proxy` set, every connection must start
/// with a PROXY header ([`crate::listener::proxy_protocol`]).
pub async fn serve_proxied_until(
    listener: TcpListener,
    store: Arc<Store>,
    limits: Limits,
    drain: Drain,
    proxy: Option<ProxyProtocol>,
) {
    serve_listener(listener, store, limits, drain, None, proxy.map(Arc::new)).await;
}

/// Like [`serve_until`], for a per-Gateway listener (`scope`: its id; `None` for the
/// dataplane's own listener): its connections reach only its routes, and start with a PROXY
/// header when its `Listener` has `accept_proxy_protocol`.
pub async fn serve_scoped(
    listener: TcpListener,
    store: Arc<Store>,
    limits: Limits,
    drain: Drain,
    scope: Option<Arc<str>>,
) {
    serve_listener(listener, store, limits, drain, scope, None).await;
}

async fn serve_listener(
    listener: TcpListener,
    store: Arc<Store>,
    limits: Limits,
    drain: Drain,
    scope: Option<Arc<str>>,
    proxy: Option<Arc<ProxyProtocol>>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    spawn_idle_trim(&permits, limits.max_connections);
    nodelay_for_accepted(&listener);
    sluice_io::wbatch::enable_on_this_thread();
    let timer = CoarseTimer::new();
    tokio::spawn(timer.clone().run());
    let (h1, h2) = connection_builders(&limits, &timer);
    let worker = Arc::new(Worker {
        local: listening_on(&listener),
        store,
        h1,
        h2,
        timer,
        drain: drain.clone(),
        scope,
        proxy,
        limits,
    });
    // NB: registered once, not per accepted connection.
    let stop = drain.draining();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            biased;
            _ = &mut stop => break,
            a = async {
                let permit = Arc::clone(&permits).acquire_owned().await.ok()?;
                Some((permit, listener.accept().await))
            } => a,
        };
        let Some((permit, accepted)) = accepted else {
            return;
        };
        let (stream, remote) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        nodelay_per_connection(&stream);
        worker.store.plugin_state().apisix.connection_opened();
        tokio::spawn(plain_connection(
            stream,
            remote,
            permit,
            Arc::clone(&worker),
        ));
    }
    drop(listener);
    // Every connection holds a permit: having them all back means none is left.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = permits.acquire_many(all).await;
    // Upgraded (WebSocket) sessions outlive their connection: serve them until they close
    // (the process's --drain-timeout bounds the wait).
    crate::upstream::websocket::sessions_closed().await;
}

/// The address every connection accepted on `listener` arrives at, when it is bound to one
/// (not a wildcard such as `0.0.0.0`): then a connection's address needs no `getsockname`,
/// as nginx does (issue 21: one system call per connection of about ten).
pub(crate) fn listening_on(listener: &TcpListener) -> Option<SocketAddr> {
    listener
        .local_addr()
        .ok()
        .filter(|a| !a.ip().is_unspecified())
}

/// The address `stream`, accepted from `remote` on a listener [`listening_on`] `local`,
/// arrived at.
pub(crate) fn local_addr_of(
    stream: &tokio::net::TcpStream,
    local: Option<SocketAddr>,
    remote: SocketAddr,
) -> SocketAddr {
    local.unwrap_or_else(|| stream.local_addr().unwrap_or(remote))
}

/// What the connections of one worker's plain-HTTP listener share.
struct Worker {
    /// The listener's address when it is not a wildcard ([`listening_on`]).
    local: Option<SocketAddr>,
    store: Arc<Store>,
    h1: Arc<hyper::server::conn::http1::Builder>,
    h2: Arc<hyper::server::conn::http2::Builder<TokioExecutor>>,
    timer: CoarseTimer,
    drain: Drain,
    scope: Option<Arc<str>>,
    /// `--proxy-protocol` on the dataplane's own listener (a per-Gateway listener's setting
    /// is its snapshot `Listener`'s).
    proxy: Option<Arc<ProxyProtocol>>,
    limits: Limits,
}

/// Serves one accepted plain-HTTP connection (h2c with prior knowledge, or HTTP/1.1).
///
/// NB: a connection's task keeps room for the largest state of this future for as long as
/// the connection lives, parked or not. So what is needed once (the sniff, the HTTP/2
/// connection) and what serves requests (the hyper connection, its stream wrappers, the
/// connection's `ConnInfo`) are boxed or built in plain functions, and an HTTP/1.1
/// connection parks as its bare socket: what remains then is the socket, the permit, two
/// handles and the wait (issue 21: 1.5 KB a parked connection, then 1 KB, before;
/// `tests::a_parked_connections_task_is_small`).
async fn plain_connection(
    mut stream: tokio::net::TcpStream,
    mut remote: SocketAddr,
    _permit: tokio::sync::OwnedSemaphorePermit,
    worker: Arc<Worker>,
) {
    let _closed = ConnClosed(Arc::clone(&worker.store));
    // A connection that has not sent a byte yet is idle: drain closes it.
    let Some((is_h2, read)) = sniff_or_drain(&mut stream, &mut remote, &worker).await else {
        return;
    };
    // NB: on drain, hyper closes an idle connection at once and a busy one after its
    // in-flight response (HTTP/2: GOAWAY, then the open streams finish).
    if is_h2 {
        if let Err(e) = serve_plain_h2(stream, remote, read, &worker).await {
            tracing::debug!(error = %e, "downstream connection ended");
        }
        return;
    }
    // NB: the sniffed bytes go to the first hyper connection only.
    let Some(mut stream) = h1_until_parked(stream, remote, read, &worker).await else {
        return;
    };
    loop {
        let (store, timer, limits) = (&worker.store, &worker.timer, &worker.limits);
        if !idle::parked(
            &stream,
            store,
            timer,
            limits.header_read_timeout,
            &worker.drain,
        )
        .await
        {
            return;
        }
        let Some(parked) = h1_until_parked(stream, remote, Bytes::new(), &worker).await else {
            return;
        };
        stream = parked;
    }
}

/// [`serve_plain_h1`]: the bare socket once the connection parked, `None` once it ended.
/// NB: what the caller's task keeps room for while awaiting this is a box and a few
/// handles, whatever hyper's connection holds.
async fn h1_until_parked(
    stream: tokio::net::TcpStream,
    remote: SocketAddr,
    read: Bytes,
    worker: &Worker,
) -> Option<tokio::net::TcpStream> {
    match serve_plain_h1(stream, remote, read, worker).await {
        (Ok(()), Some(parked)) => Some(parked.into_inner().into_inner()),
        (Ok(()), None) => None,
        (Err(e), _) => {
            tracing::debug!(error = %e, "downstream connection ended");
            None
        }
    }
}

/// The PROXY header when the listener asks for one (then `remote` becomes the address it
/// carries), then [`sniff_h2`]; `None` once `worker` drains or the header is refused; boxed
/// (its sleep is needed once).
fn sniff_or_drain<'a>(
    stream: &'a mut tokio::net::TcpStream,
    remote: &'a mut SocketAddr,
    worker: &'a Worker,
) -> Pin<Box<impl Future<Output = Option<(bool, Bytes)>> + Send + 'a>> {
    Box::pin(async move {
        let expect = proxy_protocol::expect(
            worker.proxy.as_deref(),
            worker.scope.as_deref(),
            &worker.store,
            remote,
        );
        let sniff = async {
            let (client, first) = proxy_protocol::accept(
                stream,
                *remote,
                expect,
                worker.limits.proxy_header_timeout,
                &worker.store,
            )
            .await?;
            *remote = client;
            sniff_h2(stream, worker.limits.header_read_timeout, first).await
        };
        // NB: the sniff first: a connection whose first bytes are there never registers
        // with the drain (a drain that started meanwhile still reaches its request through
        // hyper's graceful shutdown).
        tokio::select! {
            biased;
            s = sniff => s,
            _ = worker.drain.draining() => None,
        }
    })
}

/// A plain-HTTP connection's stream while it serves requests.
type PlainStream = SendTimeout<sluice_io::wbatch::BatchedStream>;

/// The [`ConnInfo`] of a plain-HTTP connection from `remote`, and its stream, which reads
/// `read` (bytes already taken from the socket) first.
fn plain_conn(
    stream: tokio::net::TcpStream,
    remote: SocketAddr,
    read: Bytes,
    worker: &Worker,
) -> (PlainStream, Arc<ConnInfo>) {
    let local = local_addr_of(&stream, worker.local, remote);
    let mut conn = ConnInfo::new(remote, local, "http", worker.timer.clone());
    conn.client_body_timeout = worker.limits.client_body_timeout;
    conn.max_header_bytes = worker.limits.max_header_bytes;
    conn.going_away = Some(worker.drain.going_away_flag());
    conn.listener = worker.scope.clone();
    let io = SendTimeout::new(
        sluice_io::wbatch::BatchedStream::with_unread(stream, read),
        worker.timer.clone(),
        worker.limits.send_timeout,
    );
    (io, Arc::new(conn))
}

/// HTTP/1.1 on `stream` until the connection ends or parks (then its stream is returned:
/// see [`idle::until_parked`]); boxed. NB: a plain function, so that its locals take no
/// room in the connection's task.
fn serve_plain_h1<'a>(
    stream: tokio::net::TcpStream,
    remote: SocketAddr,
    read: Bytes,
    worker: &'a Worker,
) -> Pin<Box<impl Future<Output = idle::Served<PlainStream>> + Send + 'a>> {
    let (io, conn) = plain_conn(stream, remote, read, worker);
    let store = Arc::clone(&worker.store);
    let answer = move |req| {
        let store = Arc::clone(&store);
        let conn = Arc::clone(&conn);
        async move {
            if let Some(mut refused) = plain_refusal(&req, &conn, &store) {
                close_if_going_away(&mut refused, &conn);
                return refused;
            }
            let mut resp = handle(req, &conn, &store).await;
            close_if_going_away(&mut resp, &conn);
            resp
        }
    };
    idle::until_parked(io, &worker.timer, &worker.h1, &worker.drain, answer)
}

/// The mTLS guard's answer to a plain-HTTP request for a host that requires client
/// certificates ([`crate::listener::mtls`]); `None` for every other request.
#[inline]
fn plain_refusal<B>(
    req: &http::Request<B>,
    conn: &ConnInfo,
    store: &Store,
) -> Option<http::Response<crate::upstream::body::ProxyBody>> {
    let table = store.peek_table();
    let refused = crate::listener::mtls::refuse(
        req,
        crate::listener::mtls::Conn::Plain,
        table.tls_for(conn.listener.as_deref()),
    )?;
    store.metrics().observe_status(refused.status());
    Some(refused)
}

/// An h2c connection, served to its end; boxed, so that HTTP/1.1 connections' tasks do not
/// keep room for it.
fn serve_plain_h2(
    stream: tokio::net::TcpStream,
    remote: SocketAddr,
    read: Bytes,
    worker: &Worker,
) -> Pin<Box<dyn Future<Output = Result<(), hyper::Error>> + Send>> {
    let (io, conn) = plain_conn(stream, remote, read, worker);
    let activity = Activity::new();
    let counted = activity.clone();
    let store = Arc::clone(&worker.store);
    let service = service_fn(move |req| {
        let store = Arc::clone(&store);
        let conn = Arc::clone(&conn);
        let request = counted.begin();
        let watch = counted.clone();
        async move {
            let resp = match plain_refusal(&req, &conn, &store) {
                Some(refused) => refused,
                None => handle(req, &conn, &store).await,
            };
            drop(request);
            Ok::<_, std::convert::Infallible>(watch.watch(resp))
        }
    });
    let served = worker.h2.serve_connection(TokioIo::new(io), service);
    Box::pin(serve_h2(
        served,
        activity,
        worker.limits,
        worker.drain.clone(),
        |c| c.graceful_shutdown(),
    ))
}

/// Counts a downstream connection as closed when dropped (`apisix_nginx_http_current_connections`).
struct ConnClosed(Arc<Store>);

impl Drop for ConnClosed {
    fn drop(&mut self) {
        self.0.plugin_state().apisix.connection_closed();
    }
}

/// Starts `workers` threads serving `addr`. Returns once every listener is bound, so a
/// caller can rely on the port being open.
pub fn spawn_workers(
    addr: SocketAddr,
    workers: usize,
    store: Arc<Store>,
    limits: Limits,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    spawn_workers_until(addr, workers, store, limits, Drain::never(), None)
}

/// Like [`spawn_workers`]; each worker thread ends once `drain` fired and its connections
/// are done. `proxy`: `--proxy-protocol` ([`serve_proxied_until`]).
pub fn spawn_workers_until(
    addr: SocketAddr,
    workers: usize,
    store: Arc<Store>,
    limits: Limits,
    drain: Drain,
    proxy: Option<ProxyProtocol>,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    let proxy = proxy.map(Arc::new);
    spawn_listener_workers(addr, workers, "sluice-worker", move |listener| {
        serve_listener(
            listener,
            Arc::clone(&store),
            limits,
            drain.clone(),
            None,
            proxy.clone(),
        )
    })
}

/// Starts `workers` threads named `name-<i>`, each with its own `SO_REUSEPORT` listener on
/// `addr` and a current-thread runtime running `serve(listener)`. Returns once every
/// listener is bound.
pub(crate) fn spawn_listener_workers<F, Fut>(
    addr: SocketAddr,
    workers: usize,
    name: &str,
    serve: F,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>>
where
    F: Fn(TcpListener) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut handles = Vec::with_capacity(workers);
    for i in 0..workers.max(1) {
        let std_listener = bind_reuseport(addr)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // NB: the listener is registered with the worker's own runtime, inside it.
        let listener = {
            let _guard = rt.enter();
            TcpListener::from_std(std_listener)?
        };
        let fut = serve(listener);
        let handle = std::thread::Builder::new()
            .name(format!("{name}-{i}"))
            .spawn(move || rt.block_on(fut))?;
        handles.push(handle);
    }
    Ok(handles)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Most bytes the task of a plain-HTTP connection may keep: all of it stays for as long
    /// as the connection lives, parked or not (issue 21). In the test profile, where futures
    /// are laid out less tightly than in release builds: 344 bytes; 2,272 before the
    /// connection's one-time parts (sniff, HTTP/2, the hyper connection) were boxed, 832
    /// before it parked as its bare socket and waited on the drain with `Drain::draining`.
    const MOST_TASK_BYTES: usize = 384;

    /// `Drain::draining` wakes a task that waits before the drain, resolves at once after
    /// it, and leaves no waker behind when dropped.
    #[tokio::test]
    async fn draining_wakes_its_waiters_and_forgets_dropped_ones() {
        let (trigger, drain) = Drain::channel();
        let early = tokio::spawn({
            let drain = drain.clone();
            async move { drain.draining().await }
        });
        {
            let gone = drain.draining();
            tokio::pin!(gone);
            assert!(futures::poll!(gone.as_mut()).is_pending());
            assert_eq!(drain.waiters.lock().len(), 1);
        }
        // Only the spawned task's waker remains once it has been polled.
        while drain.waiters.lock().len() != 1 {
            tokio::task::yield_now().await;
        }
        trigger.go_away();
        assert!(futures::poll!(drain.draining()).is_pending());
        trigger.drain();
        tokio::time::timeout(Duration::from_secs(5), early)
            .await
            .expect("the waiting task was woken")
            .unwrap();
        drain.draining().await;
        assert_eq!(drain.waiters.lock().len(), 0);
    }

    /// A slot given back is taken by the next waiter: registering and dropping once per
    /// connection does not grow the drain's list.
    #[tokio::test]
    async fn draining_reuses_the_slots_of_dropped_waiters() {
        let (_trigger, drain) = Drain::channel();
        let stays = drain.draining();
        tokio::pin!(stays);
        assert!(futures::poll!(stays.as_mut()).is_pending());
        for _ in 0..1_000 {
            let once = drain.draining();
            tokio::pin!(once);
            assert!(futures::poll!(once.as_mut()).is_pending());
        }
        let slots = drain.waiters.lock();
        assert_eq!(slots.len(), 1);
        assert_eq!(
            slots.wakers.len(),
            2,
            "one slot for the waiter that stays, one reused"
        );
    }

    /// A listener bound to one address gives its connections that address without asking
    /// the kernel; a wildcard listener does not know it.
    #[tokio::test]
    async fn a_connections_address_is_the_listeners_unless_it_is_a_wildcard() {
        let bound = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = bound.local_addr().unwrap();
        assert_eq!(listening_on(&bound), Some(addr));
        let wildcard = TcpListener::bind("0.0.0.0:0").await.unwrap();
        assert_eq!(listening_on(&wildcard), None);
        let port = wildcard.local_addr().unwrap().port();
        let _client = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let (stream, remote) = wildcard.accept().await.unwrap();
        assert_eq!(
            local_addr_of(&stream, None, remote),
            SocketAddr::from(([127, 0, 0, 1], port))
        );
    }

    /// A worker with default limits, an empty store and no drain.
    fn test_worker() -> Worker {
        let limits = Limits::default();
        let timer = CoarseTimer::new();
        let (h1, h2) = connection_builders(&limits, &timer);
        Worker {
            local: None,
            store: Arc::new(Store::new().unwrap()),
            h1,
            h2,
            timer,
            drain: Drain::never(),
            scope: None,
            proxy: None,
            limits,
        }
    }

    /// What the task of a parked HTTP/1.1 connection keeps, whatever it needed before.
    #[tokio::test]
    async fn a_parked_connections_task_is_small() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, remote) = listener.accept().await.unwrap();
        let worker = Arc::new(test_worker());
        let permit = Arc::new(Semaphore::new(1)).acquire_owned().await.unwrap();
        let task = plain_connection(stream, remote, permit, worker);
        let size = std::mem::size_of_val(&task);
        assert!(
            size <= MOST_TASK_BYTES,
            "a plain connection's task takes {size} bytes, more than {MOST_TASK_BYTES}"
        );
        drop(client);
    }

    /// Most bytes a request's future may take. hyper keeps it in a box it allocates with
    /// each connection and moves it there with each request, so its size is paid per
    /// connection and per request (issue 21). In the test profile: 2,720 bytes; 3,936 when
    /// the request future kept the request as it came (a borrowed argument stays in an async
    /// fn's state after it is moved on) and the plugin state inline (640 bytes, boxed now).
    /// 3,160 since the attempt loop keeps a route's deadlines and retry policy (issue 40:
    /// +88 bytes of state; its timers are boxed, +208 bytes inline).
    const MOST_REQUEST_FUTURE_BYTES: usize = 3_200;

    /// The size of what `f` returns, for a closure that is never called.
    fn returned_size<F: FnOnce(http::Request<hyper::body::Incoming>) -> R, R>(_: &F) -> usize {
        std::mem::size_of::<R>()
    }

    #[tokio::test]
    async fn a_requests_future_is_small() {
        let (_client, stream) = pair().await;
        let remote = stream.peer_addr().unwrap();
        let worker = test_worker();
        let (_io, conn) = plain_conn(stream, remote, Bytes::new(), &worker);
        let store = Arc::clone(&worker.store);
        let size = returned_size(&|req| handle(req, &conn, &store));
        assert!(
            size <= MOST_REQUEST_FUTURE_BYTES,
            "a request's future takes {size} bytes, more than {MOST_REQUEST_FUTURE_BYTES}"
        );
    }

    /// A connected pair: (the client's end, the accepted end).
    async fn pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        (client, listener.accept().await.unwrap().0)
    }

    /// The sniff reads the client's first bytes (they are returned, for hyper), tells an
    /// HTTP/2 preface from anything else, waits for the rest of a partial `P`/`PR`, and
    /// gives up on a client that closes after one, without waiting for the header timeout
    /// (which a peek, blind to a close behind unread bytes, had to).
    #[tokio::test]
    async fn the_sniff_returns_what_it_read_and_sees_a_close_after_a_partial_preface() {
        use tokio::io::AsyncWriteExt;
        let long = Duration::from_secs(60);
        let (mut client, mut server) = pair().await;
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        let (h2, read) = sniff_h2(&mut server, long, Vec::new()).await.unwrap();
        assert!(!h2);
        assert_eq!(&read[..], b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");

        let (mut client, mut server) = pair().await;
        client.write_all(b"PR").await.unwrap();
        let sniffing = tokio::spawn(async move { sniff_h2(&mut server, long, Vec::new()).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        client.write_all(&H2_PREFACE[2..]).await.unwrap();
        let (h2, read) = sniffing.await.unwrap().unwrap();
        assert!(h2);
        assert!(H2_PREFACE.starts_with(&read), "{read:?}");

        let (mut client, mut server) = pair().await;
        client.write_all(b"P").await.unwrap();
        client.shutdown().await.unwrap();
        let gave_up = tokio::time::timeout(
            Duration::from_secs(5),
            sniff_h2(&mut server, long, Vec::new()),
        )
        .await
        .expect("the sniff waited for the header timeout after the client closed");
        assert!(gave_up.is_none());
    }

    /// An accepted connection has Nagle's algorithm off without a system call of its own:
    /// it inherits `TCP_NODELAY` from the listener (Linux).
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn accepted_connections_inherit_nodelay_from_the_listener() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        nodelay_for_accepted(&listener);
        let _client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert!(accepted.nodelay().unwrap());
    }
}
