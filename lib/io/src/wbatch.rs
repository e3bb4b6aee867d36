//! Write batching (`--write-batching`): the small writes that a worker's connections make
//! during one turn of its event loop are sent together when the turn ends, with one
//! io_uring submission instead of one `send`/`writev` system call each.
//!
//! Why: on the proxy path of issue 2 about 70% of the dataplane's CPU is kernel time, and
//! each request costs two writes (request to the upstream, response to the client). Every
//! write is a system call, and a write that wakes the peer (an upstream or client process
//! on the same CPU) is where the dataplane is preempted, so it runs one request per time
//! slice instead of all the ready ones. One submission for the whole turn enters the
//! kernel once and is preempted at most once.
//!
//! How: [`BatchedStream`] wraps a `TcpStream`. A write that finds nothing queued and is
//! smaller than [`DIRECT_WRITE`] is copied into the connection's pending buffer (one of
//! the worker's spare buffers, [`SPARE_BUFFERS`]) and
//! reported as written; the connection is put in its thread's batch, and the thread's
//! flusher task is woken. That task runs after every task already ready in the turn (the
//! worker is a current-thread runtime, whose run queue is FIFO), then sends every pending
//! buffer with `MSG_DONTWAIT`: one io_uring submission when there are two or more, a
//! plain `send` for one. What a send could not take (a full socket buffer) stays pending,
//! and the connection's task then drains it through the reactor like any write (every
//! poll of the stream tries first). A send error is kept and returned by the stream's
//! next read or write.
//!
//! Guarantees: bytes leave in the order they were written; a write never waits behind
//! more than [`MAX_PENDING`] bytes; a stream dropped with bytes pending sends them (best
//! effort, without blocking) before its socket closes, and the flusher holds each
//! connection's lock while it sends, so a descriptor is never used after it was closed.
//! Without io_uring (`io_uring_setup` refused, as under Docker's default seccomp profile)
//! the batch is sent with one `send` per connection, which keeps the ordering and the
//! end-of-turn grouping. The first worker to start logs which mode is used (one INFO line
//! per process, with the reason when it is `send`), and `/metrics` shows it as
//! `sluice_dataplane_write_batching{mode="io_uring"|"send"|"off"} 1` ([`modes_in_use`]).

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A write waits (returns `Pending`) while this many bytes are pending.
pub const MAX_PENDING: usize = 64 * 1024;
/// A write of at least this many bytes, with nothing pending, goes straight to the socket:
/// bulk bodies are not copied.
pub const DIRECT_WRITE: usize = 16 * 1024;
/// A send buffer up to this size is kept for the next writes (in the worker's spares).
const KEEP_CAPACITY: usize = 4096;
/// Send buffers a worker keeps for its connections' next writes.
///
/// NB: a connection used to keep its send buffer between writes (the size of its last
/// response, up to 4 KiB), idle or not: about 2 MiB on 9,000 idle connections (issue 21).
/// A buffer now goes back to its worker once sent, and a turn's writes take the ones the
/// last turn sent: a few buffers, warm in the caches, serve all connections.
const SPARE_BUFFERS: usize = 64;
/// Submission queue entries of a worker's ring; larger batches are sent in several
/// submissions.
const RING_ENTRIES: u32 = 256;

/// Whether and how workers batch their writes (`--write-batching`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// io_uring where the kernel allows it, else one send(2) per connection.
    #[default]
    Auto,
    /// Batched, sent with one send(2) per connection (no io_uring).
    Send,
    /// Every write goes straight to its socket.
    Off,
}

// NB: `Auto` by default, as in the binary.
static POLICY: AtomicU8 = AtomicU8::new(0);

/// Sets the policy of the workers started after this call.
pub fn set_policy(policy: Policy) {
    let v = match policy {
        Policy::Auto => 0,
        Policy::Send => 1,
        Policy::Off => 2,
    };
    POLICY.store(v, Ordering::Relaxed);
}

/// The policy for new workers.
pub fn policy() -> Policy {
    match POLICY.load(Ordering::Relaxed) {
        0 => Policy::Auto,
        1 => Policy::Send,
        _ => Policy::Off,
    }
}

/// How a worker thread sends its batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One io_uring submission per batch.
    IoUring,
    /// One `send` per connection (io_uring was refused).
    Send,
}

struct Batcher {
    ring: Option<io_uring::IoUring>,
    queue: Vec<Arc<Shared>>,
    flusher: Option<Waker>,
    stats: Stats,
    /// Empty send buffers for the next writes ([`SPARE_BUFFERS`] at most).
    spare: Vec<Vec<u8>>,
}

/// What a worker thread's flusher did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Batches sent (flusher turns with at least one connection to send).
    pub batches: u64,
    /// Connection sends, over all batches.
    pub sends: u64,
    /// io_uring submissions (a batch of one is a plain send(2)).
    pub submissions: u64,
}

/// The current thread's [`Stats`] (zero without batching).
pub fn stats() -> Stats {
    BATCHER.with(|b| b.borrow().as_ref().map(|b| b.stats).unwrap_or_default())
}

thread_local! {
    static BATCHER: RefCell<Option<Batcher>> = const { RefCell::new(None) };
}

/// The modes the workers of this process use, one bit each: [`IO_URING`], [`SEND`], [`OFF`].
static MODES_IN_USE: AtomicU8 = AtomicU8::new(0);
const IO_URING: u8 = 1;
const SEND: u8 = 2;
const OFF: u8 = 4;

/// Notes that a worker uses `mode` (one of the bits of [`MODES_IN_USE`]) because of `why`.
/// The first worker of the process logs it; a later one only when its mode differs.
fn record_mode(mode: u8, why: &dyn std::fmt::Display) {
    let name = mode_name(mode);
    let before = MODES_IN_USE.fetch_or(mode, Ordering::Relaxed);
    if before == 0 {
        tracing::info!(mode = %name, reason = %why, "write batching: {name}");
    } else if before & mode == 0 {
        tracing::warn!(mode = %name, reason = %why, "write batching: this worker uses {name}, unlike the workers before it");
    }
}

fn mode_name(bit: u8) -> &'static str {
    match bit {
        IO_URING => "io_uring",
        SEND => "send",
        _ => "off",
    }
}

/// The write-batching modes that the workers of this process use, by name (`io_uring`,
/// `send`, `off`): normally exactly one, none before the first worker started. The metric
/// `sluice_dataplane_write_batching{mode}`.
pub fn modes_in_use() -> Vec<&'static str> {
    let bits = MODES_IN_USE.load(Ordering::Relaxed);
    [IO_URING, SEND, OFF]
        .into_iter()
        .filter(|b| bits & b != 0)
        .map(mode_name)
        .collect()
}

/// Sets up batching for the current thread, which must run a current-thread Tokio runtime
/// (a worker), and spawns its flusher task. Does nothing when batching is off or already
/// set up here. Returns the mode in use.
pub fn enable_on_this_thread() -> Option<Mode> {
    let policy = policy();
    if policy == Policy::Off {
        record_mode(OFF, &"--write-batching off");
        return None;
    }
    // NB: only a current-thread runtime runs the flusher and the connections' tasks on
    // this thread; on a multi-thread runtime (tests, embedders) writes stay direct.
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread => {}
        _ => return None,
    }
    let fresh = BATCHER.with(|b| {
        let mut b = b.borrow_mut();
        if b.is_some() {
            return None;
        }
        let ring = match policy {
            Policy::Send | Policy::Off => {
                record_mode(SEND, &"--write-batching send");
                None
            }
            Policy::Auto => match io_uring::IoUring::new(RING_ENTRIES) {
                Ok(r) => {
                    record_mode(IO_URING, &"--write-batching auto");
                    Some(r)
                }
                Err(e) => {
                    // NB: e.g. a container runtime's seccomp profile that refuses
                    // io_uring_setup (Docker's and newer containerd's defaults).
                    record_mode(
                        SEND,
                        &format_args!(
                            "--write-batching auto, io_uring unavailable ({e}): one send(2) per connection"
                        ),
                    );
                    None
                }
            },
        };
        let mode = if ring.is_some() {
            Mode::IoUring
        } else {
            Mode::Send
        };
        *b = Some(Batcher {
            ring,
            queue: Vec::new(),
            flusher: None,
            stats: Stats::default(),
            spare: Vec::new(),
        });
        Some(mode)
    });
    if fresh.is_some() {
        tokio::spawn(flush_loop());
    }
    fresh.or_else(current_mode)
}

fn current_mode() -> Option<Mode> {
    BATCHER.with(|b| {
        b.borrow().as_ref().map(|b| {
            if b.ring.is_some() {
                Mode::IoUring
            } else {
                Mode::Send
            }
        })
    })
}

/// What a connection shares with its thread's flusher.
struct Shared {
    fd: RawFd,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Accepted from the writer, not yet sent.
    pending: Vec<u8>,
    /// In the thread's batch: the flusher sends `pending`. When false and `pending` is not
    /// empty, the socket was full: the connection's own polls drain it.
    queued: bool,
    /// The stream was dropped: the flusher skips it.
    closed: bool,
    /// A send failed (OS error code); returned by the next read or write.
    error: Option<i32>,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
}

impl State {
    fn take_error(&self) -> Option<io::Error> {
        self.error.map(io::Error::from_raw_os_error)
    }

    fn wake(&mut self) {
        if let Some(w) = self.read_waker.take() {
            w.wake();
        }
        if let Some(w) = self.write_waker.take() {
            w.wake();
        }
    }
}

fn set_waker(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // A panic while the lock was held cannot leave the state inconsistent (every field
    // is valid on its own), so a poisoned lock is used as is.
    crate::lock(&shared.state)
}

/// A TCP stream whose small writes are batched per event-loop turn (see the module
/// documentation). On a thread without batching it is the plain stream.
pub struct BatchedStream {
    // NB: before `io`, so that a stream dropped with bytes pending sends them while the
    // descriptor is still open (fields drop in order).
    shared: Option<Registered>,
    io: TcpStream,
    /// Bytes taken from the socket before the stream was made (a listener's protocol
    /// sniff), returned by the first reads.
    unread: Bytes,
}

/// A stream's place in its thread's batch; dropping it takes the stream out (see its
/// `Drop`).
struct Registered(Arc<Shared>);

impl std::ops::Deref for Registered {
    type Target = Arc<Shared>;

    fn deref(&self) -> &Arc<Shared> {
        &self.0
    }
}

impl std::fmt::Debug for BatchedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchedStream")
            .field("io", &self.io)
            .field("batched", &self.shared.is_some())
            .finish()
    }
}

impl BatchedStream {
    /// Wraps `io`; batched when the current thread has batching set up.
    pub fn new(io: TcpStream) -> Self {
        Self::with_unread(io, Bytes::new())
    }

    /// Like [`BatchedStream::new`], for a socket from which `unread` was already read: reads
    /// return those bytes first.
    pub fn with_unread(io: TcpStream, unread: Bytes) -> Self {
        let batched = BATCHER.with(|b| b.borrow().is_some());
        let shared = batched.then(|| {
            Registered(Arc::new(Shared {
                fd: io.as_raw_fd(),
                state: Mutex::new(State::default()),
            }))
        });
        BatchedStream { shared, io, unread }
    }

    /// The socket alone, for a connection that keeps nothing else while it idles (bytes
    /// still pending are sent first, best effort, as when the stream is dropped).
    ///
    /// NB: only once the stream's reader has read what was [`unread`](Self::with_unread):
    /// a parked connection's reader waited on the socket, which it does only after that.
    pub fn into_inner(self) -> TcpStream {
        let BatchedStream { shared, io, unread } = self;
        debug_assert!(unread.is_empty(), "sniffed bytes left unread");
        drop(shared);
        io
    }

    /// The socket.
    #[inline]
    pub fn get_ref(&self) -> &TcpStream {
        &self.io
    }

    /// Sends everything pending at once (not at the end of the turn); `Pending` while the
    /// socket is full.
    pub fn poll_send_all(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(shared) = &self.shared {
            let mut st = lock(shared);
            if let Some(e) = st.take_error() {
                return Poll::Ready(Err(e));
            }
            // NB: still `queued` if it was: the flusher then finds nothing to send.
            return drain(&mut self.io, &mut st, cx);
        }
        Poll::Ready(Ok(()))
    }

    /// Whether writes on this stream are batched.
    #[inline]
    pub fn is_batched(&self) -> bool {
        self.shared.is_some()
    }

    /// Whether written bytes still wait to be sent (queued for the batch, or left by a full
    /// socket) or a send error waits to be returned.
    #[inline]
    pub fn has_pending(&self) -> bool {
        self.shared.as_ref().is_some_and(|shared| {
            let st = lock(shared);
            st.queued || !st.pending.is_empty() || st.error.is_some()
        })
    }

    /// Frees the send buffer kept between writes (up to 4 KiB) when nothing is pending: for
    /// a connection that goes idle.
    #[inline]
    pub fn release_buffer(&mut self) {
        if let Some(shared) = &self.shared {
            let mut st = lock(shared);
            if st.pending.is_empty() {
                st.pending = Vec::new();
            }
        }
    }
}

/// Writes `st.pending` to `io` through the reactor until it is empty (`Ready(Ok)`), the
/// socket is full (`Pending`, the task is woken when it is writable) or an error.
fn drain(io: &mut TcpStream, st: &mut State, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    while !st.pending.is_empty() {
        match Pin::new(&mut *io).poll_write(cx, &st.pending) {
            Poll::Ready(Ok(0)) => {
                st.pending.clear();
                st.error = Some(libc::EPIPE);
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            Poll::Ready(Ok(n)) => {
                st.pending.drain(..n);
            }
            Poll::Ready(Err(e)) => {
                st.pending.clear();
                st.error = Some(e.raw_os_error().unwrap_or(libc::EIO));
                return Poll::Ready(Err(e));
            }
            Poll::Pending => return Poll::Pending,
        }
    }
    Poll::Ready(Ok(()))
}

/// Data left after the socket was full: drained by the connection itself.
fn stuck(st: &State) -> bool {
    !st.queued && !st.pending.is_empty()
}

impl BatchedStream {
    /// Queues `bufs` (total `len` bytes) or says why not: `Ok(None)` to write directly.
    fn poll_batch(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
        len: usize,
    ) -> Poll<io::Result<Option<usize>>> {
        let Some(shared) = &self.shared else {
            return Poll::Ready(Ok(None));
        };
        let mut st = lock(shared);
        if let Some(e) = st.take_error() {
            return Poll::Ready(Err(e));
        }
        if stuck(&st)
            && let Poll::Ready(Err(e)) = drain(&mut self.io, &mut st, cx)
        {
            return Poll::Ready(Err(e));
        }
        if st.pending.is_empty() && len >= DIRECT_WRITE {
            return Poll::Ready(Ok(None));
        }
        if st.pending.len() >= MAX_PENDING {
            set_waker(&mut st.write_waker, cx);
            return Poll::Pending;
        }
        let was_empty = st.pending.is_empty();
        if st.pending.capacity() == 0
            && let Some(spare) = take_spare()
        {
            st.pending = spare;
        }
        for b in bufs {
            st.pending.extend_from_slice(b);
        }
        if was_empty && !st.queued {
            st.queued = true;
            drop(st);
            if !enqueue(Arc::clone(shared)) {
                // No batch here: the bytes are drained by this stream's next poll (a
                // flush, a read or a write), as after a full socket.
                lock(shared).queued = false;
            }
        }
        Poll::Ready(Ok(Some(len)))
    }

    /// Before a read or flush: drains stuck data, returns a kept error.
    fn poll_pending(&mut self, cx: &mut Context<'_>, reading: bool) -> Poll<io::Result<()>> {
        let Some(shared) = &self.shared else {
            return Poll::Ready(Ok(()));
        };
        let mut st = lock(shared);
        if let Some(e) = st.take_error() {
            return Poll::Ready(Err(e));
        }
        let drained = if stuck(&st) {
            drain(&mut self.io, &mut st, cx)
        } else {
            Poll::Ready(Ok(()))
        };
        if reading {
            set_waker(&mut st.read_waker, cx);
        }
        drained
    }
}

impl AsyncRead for BatchedStream {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Poll::Ready(Err(e)) = this.poll_pending(cx, true) {
            return Poll::Ready(Err(e));
        }
        if !this.unread.is_empty() {
            let n = this.unread.len().min(buf.remaining());
            buf.put_slice(&this.unread[..n]);
            this.unread.advance(n);
            if this.unread.is_empty() {
                // Frees the sniff's buffer.
                this.unread = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for BatchedStream {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match this.poll_batch(cx, &[io::IoSlice::new(buf)], buf.len()) {
            Poll::Ready(Ok(None)) => Pin::new(&mut this.io).poll_write(cx, buf),
            Poll::Ready(Ok(Some(n))) => Poll::Ready(Ok(n)),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let len = bufs.iter().map(|b| b.len()).sum();
        match this.poll_batch(cx, bufs, len) {
            Poll::Ready(Ok(None)) => Pin::new(&mut this.io).poll_write_vectored(cx, bufs),
            Poll::Ready(Ok(Some(n))) => Poll::Ready(Ok(n)),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Queued bytes count as flushed (they are sent when the turn ends); bytes the socket
    /// could not take yet are written first.
    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.poll_pending(cx, false) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.io).poll_flush(cx),
            other => other,
        }
    }

    /// Sends everything pending at once, then shuts the write side.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.poll_send_all(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.io).poll_shutdown(cx),
            other => other,
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut st = lock(&self.0);
        if !st.pending.is_empty() {
            // Best effort, as the kernel does for a closed socket's queued bytes; the
            // descriptor is still open here (`BatchedStream::io` drops after this).
            let _ = send_now(self.0.fd, &st.pending);
            st.pending.clear();
        }
        st.closed = true;
        st.queued = false;
    }
}

/// An empty send buffer the worker kept, if any.
fn take_spare() -> Option<Vec<u8>> {
    BATCHER.with(|b| b.borrow_mut().as_mut().and_then(|b| b.spare.pop()))
}

/// Puts `shared` in this thread's batch; false when the thread has none (its runtime is
/// gone, or the stream moved to another thread).
fn enqueue(shared: Arc<Shared>) -> bool {
    BATCHER.with(|b| match b.borrow_mut().as_mut() {
        Some(b) => {
            b.queue.push(shared);
            if let Some(w) = b.flusher.take() {
                w.wake();
            }
            true
        }
        None => false,
    })
}

/// `send(2)` with `MSG_DONTWAIT | MSG_NOSIGNAL`: bytes taken, or `-errno`.
#[allow(unsafe_code)]
fn send_now(fd: RawFd, bytes: &[u8]) -> isize {
    // SAFETY: `bytes` is valid for reads of its length for the duration of the call, and
    // `fd` is an open socket (the caller holds the connection's lock and it is not closed).
    let n = unsafe {
        libc::send(
            fd,
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        -(io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO) as isize)
    } else {
        n
    }
}

/// Ends the thread's batching when the flusher task is dropped (its runtime shut down), so
/// that a later runtime on the thread sets it up again.
struct EndBatching;

impl Drop for EndBatching {
    fn drop(&mut self) {
        let _ = BATCHER.try_with(|b| b.borrow_mut().take());
    }
}

fn flush_loop() -> impl std::future::Future<Output = ()> + Send + 'static {
    // NB: made before the task is first polled, so a runtime dropped before that still
    // ends the thread's batching.
    let end = EndBatching;
    async move {
        let _end = end;
        flush_forever().await;
    }
}

async fn flush_forever() {
    loop {
        let mine = std::future::poll_fn(|cx| {
            BATCHER.with(|b| match b.borrow_mut().as_mut() {
                Some(b) if b.queue.is_empty() => {
                    b.flusher = Some(cx.waker().clone());
                    Poll::Pending
                }
                Some(_) => Poll::Ready(true),
                // Not this task's thread (cannot happen on a current-thread runtime).
                None => Poll::Ready(false),
            })
        })
        .await;
        if !mine {
            tracing::error!("write batching: the flusher runs off its worker thread; stopping");
            return;
        }
        flush();
    }
}

/// Sends every queued connection's pending bytes.
fn flush() {
    // NB: the spare buffers are taken out for the flush and put back after it: no write
    // runs meanwhile (the flush does not yield).
    let (queue, ring, mut spare) = BATCHER.with(|b| match b.borrow_mut().as_mut() {
        Some(b) => (
            std::mem::take(&mut b.queue),
            b.ring.take(),
            std::mem::take(&mut b.spare),
        ),
        None => (Vec::new(), None, Vec::new()),
    });
    let mut ring = ring;
    let mut queue = queue;
    // A connection is queued once per batch (`queued`); deduplicated all the same, as
    // locking one twice below would deadlock the worker.
    queue.sort_unstable_by_key(|s| Arc::as_ptr(s) as usize);
    queue.dedup_by(|a, b| Arc::ptr_eq(a, b));
    // Each connection's lock is held until its send is done (see the module docs).
    // NB: the jobs and their results on the stack up to `INLINE_JOBS` connections: at low
    // concurrency a batch is one or two connections, and each flush allocated both (with
    // the queue, three allocations per flush, up to six per proxied request; issue 21).
    let mut jobs: Jobs<'_> = SmallVec::with_capacity(queue.len());
    for shared in &queue {
        let mut st = lock(shared);
        if !st.queued || st.closed {
            continue;
        }
        st.queued = false;
        if st.pending.is_empty() {
            continue;
        }
        let bytes = std::mem::take(&mut st.pending);
        jobs.push((st, bytes, shared.fd));
    }
    let results = send_all(ring.as_mut(), &jobs);
    let submissions = match &ring {
        Some(_) if jobs.len() > 1 => jobs.len().div_ceil(RING_ENTRIES as usize) as u64,
        _ => 0,
    };
    let sends = jobs.len() as u64;
    for ((mut st, mut bytes, _), res) in jobs.into_iter().zip(results) {
        if res >= 0 {
            let sent = usize::try_from(res).unwrap_or(0).min(bytes.len());
            if sent == bytes.len() {
                // The allocation serves the worker's next writes, unless a burst made it
                // large.
                if bytes.capacity() <= KEEP_CAPACITY && spare.len() < SPARE_BUFFERS {
                    bytes.clear();
                    spare.push(bytes);
                }
                if let Some(w) = st.write_waker.take() {
                    w.wake();
                }
            } else {
                bytes.drain(..sent);
                st.pending = bytes;
                st.wake();
            }
        } else if res == -(libc::EAGAIN as isize) || res == -(libc::EINTR as isize) {
            st.pending = bytes;
            st.wake();
        } else {
            st.error = Some(i32::try_from(-res).unwrap_or(libc::EIO));
            st.wake();
        }
    }
    BATCHER.with(|b| {
        if let Some(b) = b.borrow_mut().as_mut() {
            b.ring = ring;
            b.spare = spare;
            if sends > 0 {
                b.stats.batches += 1;
                b.stats.sends += sends;
                b.stats.submissions += submissions;
            }
        }
    });
    // The queue's allocation goes back for the next batch (nothing was queued meanwhile:
    // the flush does not yield).
    queue.clear();
    BATCHER.with(|b| {
        if let Some(b) = b.borrow_mut().as_mut()
            && b.queue.capacity() == 0
        {
            b.queue = queue;
        }
    });
}

/// Connections in one batch on the stack before [`flush`] allocates for them.
const INLINE_JOBS: usize = 8;

/// What [`flush`] sends: each connection's lock, bytes and socket.
type Jobs<'a> = SmallVec<[(MutexGuard<'a, State>, Vec<u8>, RawFd); INLINE_JOBS]>;

/// Sends each job's bytes; one result per job (bytes sent, or `-errno`).
fn send_all(
    ring: Option<&mut io_uring::IoUring>,
    jobs: &[(MutexGuard<'_, State>, Vec<u8>, RawFd)],
) -> SmallVec<[isize; INLINE_JOBS]> {
    match ring {
        Some(ring) if jobs.len() > 1 => {
            let mut results = smallvec::smallvec![-(libc::EIO as isize); jobs.len()];
            for (chunk_no, chunk) in jobs.chunks(RING_ENTRIES as usize).enumerate() {
                let base = chunk_no * RING_ENTRIES as usize;
                if let Err(e) = submit_chunk(ring, chunk, base, &mut results) {
                    // NB: not retried with send(2): some entries may have been sent. The
                    // ones without a completion fail their connection (-EIO).
                    tracing::warn!(error = %e, "io_uring submission failed");
                }
            }
            results
        }
        _ => jobs
            .iter()
            .map(|(_, bytes, fd)| send_now(*fd, bytes))
            .collect(),
    }
}

#[allow(unsafe_code)]
fn submit_chunk(
    ring: &mut io_uring::IoUring,
    chunk: &[(MutexGuard<'_, State>, Vec<u8>, RawFd)],
    base: usize,
    results: &mut [isize],
) -> io::Result<()> {
    use io_uring::{opcode, types};
    {
        let mut sq = ring.submission();
        for (i, (_, bytes, fd)) in chunk.iter().enumerate() {
            let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
            let entry = opcode::Send::new(types::Fd(*fd), bytes.as_ptr(), len)
                .flags(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                .build()
                .user_data((base + i) as u64);
            // SAFETY: the buffer and the descriptor outlive the operation: `submit_and_wait`
            // below returns only after every entry of this chunk has completed, and the
            // caller holds the bytes and the connection's lock until then.
            if unsafe { sq.push(&entry) }.is_err() {
                return Err(io::Error::other("submission queue full"));
            }
        }
    }
    let mut done = 0;
    while done < chunk.len() {
        match ring.submit_and_wait(chunk.len() - done) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for cqe in ring.completion() {
            let slot = usize::try_from(cqe.user_data()).unwrap_or(usize::MAX);
            if let Some(r) = results.get_mut(slot) {
                *r = cqe.result() as isize;
                done += 1;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A current-thread runtime with batching set up, as a worker has.
    fn worker() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A connected pair: (batched client side, plain server side).
    async fn pair() -> (BatchedStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (BatchedStream::new(c), s)
    }

    async fn read_exactly(s: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        s.read_exact(&mut v).await.unwrap();
        v
    }

    #[test]
    fn writes_of_one_turn_leave_in_one_submission_in_order() {
        worker().block_on(async {
            assert_eq!(enable_on_this_thread(), Some(Mode::IoUring));
            let mut pairs = Vec::new();
            for _ in 0..8 {
                pairs.push(pair().await);
            }
            let before = stats();
            // Every connection writes twice in the same turn: nothing is sent yet.
            for (i, (c, _)) in pairs.iter_mut().enumerate() {
                assert!(c.is_batched());
                c.write_all(format!("first {i};").as_bytes()).await.unwrap();
                c.write_all(format!("second {i}").as_bytes()).await.unwrap();
                c.flush().await.unwrap();
            }
            assert_eq!(stats(), before, "sent before the turn ended");
            for (i, (_, s)) in pairs.iter_mut().enumerate() {
                let want = format!("first {i};second {i}");
                assert_eq!(read_exactly(s, want.len()).await, want.as_bytes());
            }
            let after = stats();
            assert_eq!(after.batches - before.batches, 1);
            assert_eq!(after.sends - before.sends, 8);
            assert_eq!(after.submissions - before.submissions, 1);
        });
    }

    #[test]
    fn a_full_socket_is_drained_by_the_connection_in_order_with_backpressure() {
        worker().block_on(async {
            enable_on_this_thread();
            let (mut c, mut s) = pair().await;
            // 8 MiB in 1000-byte writes, far more than the socket buffers hold, while the
            // peer does not read yet: writes must wait (MAX_PENDING), not grow memory.
            let total = 8 * 1024 * 1024;
            let writer = tokio::spawn(async move {
                let mut sent = 0usize;
                let mut seq = 0u8;
                while sent < total {
                    let chunk: Vec<u8> = (0..1000).map(|k| seq.wrapping_add(k as u8)).collect();
                    c.write_all(&chunk).await.unwrap();
                    seq = seq.wrapping_add(7);
                    sent += chunk.len();
                    let st = lock(c.shared.as_ref().unwrap());
                    assert!(
                        st.pending.len() <= MAX_PENDING + 1000,
                        "{}",
                        st.pending.len()
                    );
                }
                c.shutdown().await.unwrap();
            });
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            writer.await.unwrap();
            assert_eq!(got.len(), total.div_ceil(1000) * 1000);
            let mut seq = 0u8;
            for chunk in got.chunks(1000) {
                let want: Vec<u8> = (0..1000).map(|k| seq.wrapping_add(k as u8)).collect();
                assert_eq!(chunk, &want[..]);
                seq = seq.wrapping_add(7);
            }
        });
    }

    #[test]
    fn a_send_error_is_returned_by_the_next_write_instead_of_hanging() {
        worker().block_on(async {
            enable_on_this_thread();
            let (mut c, s) = pair().await;
            // The peer resets the connection (linger 0).
            let s = s.into_std().unwrap();
            socket2::SockRef::from(&s)
                .set_linger(Some(std::time::Duration::ZERO))
                .unwrap();
            drop(s);
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let mut failed = None;
            for _ in 0..10 {
                if let Err(e) = c.write_all(b"hello").await {
                    failed = Some(e);
                    break;
                }
                // The turn ends here: the flusher sends and sees the reset.
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            let e = failed.expect("writes to a reset connection kept succeeding");
            assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
                ),
                "{e:?}"
            );
            let mut buf = [0u8; 8];
            assert!(c.read(&mut buf).await.is_err() || c.read(&mut buf).await.unwrap() == 0);
        });
    }

    #[test]
    fn bytes_pending_when_the_stream_is_dropped_or_shut_down_are_sent_first() {
        worker().block_on(async {
            enable_on_this_thread();
            let (mut c, mut s) = pair().await;
            c.write_all(b"last words").await.unwrap();
            drop(c);
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"last words");

            let (mut c, mut s) = pair().await;
            c.write_all(b"before fin").await.unwrap();
            c.shutdown().await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"before fin");
        });
    }

    #[test]
    fn a_multi_thread_runtime_writes_directly() {
        // Its tasks (and a flusher) could run on any of its threads: no batching there.
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                assert_eq!(enable_on_this_thread(), None);
                let (mut c, mut s) = pair().await;
                assert!(!c.is_batched());
                c.write_all(b"plain").await.unwrap();
                assert_eq!(read_exactly(&mut s, 5).await, b"plain");
            });
    }

    /// The worker's spare send buffers.
    fn spares() -> usize {
        BATCHER.with(|b| b.borrow().as_ref().map_or(0, |b| b.spare.len()))
    }

    #[test]
    fn a_sent_buffer_goes_back_to_the_worker_and_serves_another_connections_write() {
        worker().block_on(async {
            enable_on_this_thread();
            let (mut a, mut sa) = pair().await;
            let (mut b, mut sb) = pair().await;
            a.write_all(b"one").await.unwrap();
            a.flush().await.unwrap();
            assert_eq!(read_exactly(&mut sa, 3).await, b"one");
            // Idle, the connection holds no send buffer; the worker keeps it.
            let held = lock(a.shared.as_ref().unwrap()).pending.capacity();
            assert_eq!(held, 0, "an idle connection kept {held} bytes");
            assert_eq!(spares(), 1);
            b.write_all(b"two").await.unwrap();
            assert_eq!(spares(), 0, "the write did not take the spare buffer");
            b.flush().await.unwrap();
            assert_eq!(read_exactly(&mut sb, 3).await, b"two");
            assert_eq!(spares(), 1);
        });
    }

    #[test]
    fn large_writes_bypass_the_batch() {
        worker().block_on(async {
            enable_on_this_thread();
            let (mut c, mut s) = pair().await;
            let big = vec![7u8; DIRECT_WRITE];
            let before = stats();
            let n = c.write(&big).await.unwrap();
            assert!(n > 0);
            assert_eq!(read_exactly(&mut s, n).await, vec![7u8; n]);
            assert_eq!(stats(), before, "a bulk write went through the batch");
        });
    }

    #[test]
    fn a_thread_without_batching_writes_directly_and_a_dropped_runtime_ends_batching() {
        let plain = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        plain.block_on(async {
            let (mut c, mut s) = pair().await;
            assert!(!c.is_batched());
            c.write_all(b"direct").await.unwrap();
            assert_eq!(read_exactly(&mut s, 6).await, b"direct");
        });
        // Batching set up under one runtime ends with it; a later runtime on the same
        // thread sets it up again (with a flusher of its own).
        worker().block_on(async {
            assert_eq!(enable_on_this_thread(), Some(Mode::IoUring));
        });
        assert!(BATCHER.with(|b| b.borrow().is_none()));
        worker().block_on(async {
            assert_eq!(enable_on_this_thread(), Some(Mode::IoUring));
            let (mut c, mut s) = pair().await;
            assert!(c.is_batched());
            c.write_all(b"again").await.unwrap();
            assert_eq!(read_exactly(&mut s, 5).await, b"again");
        });
    }
}
