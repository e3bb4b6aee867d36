//! The batch processor that takes queued records (access-log entries, spans) off the request
//! path and sends them in batches: a bounded queue per logger, one task per queue on a runtime
//! of its own, retries, and the counters of what was sent and dropped.
//!
//! # Never on the request path
//!
//! The log phase builds an entry (a JSON line) and hands it to a [`Batcher`] with
//! `try_send`: no lock held across I/O, no await, no wait. The queue is bounded (entries
//! and bytes); a full queue drops the entry and counts it in
//! `sluice_log_entries_dropped_total{plugin,route,reason="queue_full"}`. One task per
//! configured logger, on a runtime of its own thread (`sluice-logger`), groups entries in
//! batches and sends them; a batch that still fails after `max_retry_count` retries is
//! dropped and counted with `reason="send_failed"`. Sent entries are counted in
//! `sluice_log_entries_sent_total{plugin,route}`.
//!
//! # Across snapshots
//!
//! A logger's queue and task live in [`crate::plugins::PluginState`], keyed by its owner (route)
//! and config: a reload that keeps the config keeps the queue; a changed or removed
//! config drops the last handle when the store prunes, which closes the queue; the task
//! then sends what it holds (with its retries) and ends. No task outlives its config.
//! A stopping process calls [`flush_all`] once its requests are done.

use std::future::Future;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use prometheus::{IntCounterVec, Opts};
use tokio::sync::{mpsc, watch};

/// Most entries a logger's queue holds (APISIX's default `max_pending_entries`).
pub const MAX_PENDING_ENTRIES: usize = 8192;

/// Most bytes of entries a logger holds (queued and in its current batch): entries with
/// bodies are large, and 8192 of 512 KiB would be 4 GiB.
pub const MAX_PENDING_BYTES: usize = 64 * 1024 * 1024;

/// The counters of the loggers, registered in the dataplane's registry.
#[derive(Debug, Clone)]
pub struct LogMetrics {
    /// `sluice_log_entries_dropped_total{plugin,route,reason}`.
    pub dropped: IntCounterVec,
    /// `sluice_log_entries_sent_total{plugin,route}`.
    pub sent: IntCounterVec,
}

impl Default for LogMetrics {
    fn default() -> Self {
        // NB: constant names and labels: construction cannot fail; the fallback only
        // satisfies the types.
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).unwrap_or_else(|_| fallback())
        };
        LogMetrics {
            dropped: counter(
                "sluice_log_entries_dropped_total",
                "Access-log entries of a logger plugin dropped: its queue was full \
                 (queue_full) or its batch failed every retry (send_failed)",
                &["plugin", "route", "reason"],
            ),
            sent: counter(
                "sluice_log_entries_sent_total",
                "Access-log entries a logger plugin delivered",
                &["plugin", "route"],
            ),
        }
    }
}

fn fallback() -> IntCounterVec {
    IntCounterVec::new(Opts::new("sluice_invalid", "invalid"), &[]).unwrap_or_else(|_| fallback())
}

impl LogMetrics {
    /// Both families, for registration.
    pub fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![Box::new(self.dropped.clone()), Box::new(self.sent.clone())]
    }
}

/// When a [`Batcher`] sends.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Most entries per batch.
    pub max_size: usize,
    /// Send a partial batch after this long without a new entry; `None`: as soon as the
    /// queue is empty (file-logger).
    pub inactive: Option<Duration>,
    /// Send a partial batch when its oldest entry is this old.
    pub buffer_duration: Duration,
    /// Retries of a failed batch.
    pub max_retries: u64,
    /// Wait between attempts.
    pub retry_delay: Duration,
}

/// What a [`Batcher`] queues: a logger's JSON entry (`String`), or another plugin's record
/// (opentelemetry's spans).
pub trait Item: Send + 'static {
    /// Approximate bytes it holds, for the queue's byte bound.
    fn size(&self) -> usize;
}

impl Item for String {
    fn size(&self) -> usize {
        self.len()
    }
}

/// Where a batch goes.
pub trait Sink<T: Item = String>: Send + 'static {
    /// What a batch becomes once, before its first attempt; retries send it again.
    type Payload: Send + Sync + 'static;

    /// Turns `batch` into what is sent, consuming it (its entries are moved, not copied).
    fn encode(&mut self, batch: Vec<T>) -> Self::Payload;

    /// Delivers `payload`; `Err` is retried per the [`Policy`].
    fn send<'a>(
        &'a mut self,
        payload: &'a Self::Payload,
    ) -> impl Future<Output = Result<(), String>> + Send + 'a;

    /// The name Sluice's own log lines give the logger (http-logger's `name`). Default
    /// none.
    fn name(&self) -> &str {
        ""
    }
}

/// One entry in a queue.
struct Queued<T>(T);

/// The sending side of one logger's queue; the task ends when the last one drops.
pub struct Batcher<T: Item = String> {
    tx: mpsc::Sender<Queued<T>>,
    pending_bytes: Arc<AtomicUsize>,
    dropped_full: prometheus::IntCounter,
}

impl<T: Item> std::fmt::Debug for Batcher<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("pending_bytes", &self.pending_bytes.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<T: Item> std::fmt::Debug for Queued<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Queued({} bytes)", self.0.size())
    }
}

/// The counters of one [`Batcher`].
#[derive(Debug, Clone)]
pub struct Counters {
    /// Items delivered.
    pub sent: prometheus::IntCounter,
    /// Items dropped because the queue was full.
    pub dropped_full: prometheus::IntCounter,
    /// Items dropped because their batch failed every attempt.
    pub dropped_failed: prometheus::IntCounter,
}

impl Batcher<String> {
    /// Starts the task of one logger (`plugin` on `route`) sending to `sink`.
    pub fn start<S: Sink>(
        plugin: &'static str,
        route: &str,
        policy: Policy,
        sink: S,
        metrics: &LogMetrics,
    ) -> Batcher {
        let counters = Counters {
            sent: metrics.sent.with_label_values(&[plugin, route]),
            dropped_full: metrics
                .dropped
                .with_label_values(&[plugin, route, "queue_full"]),
            dropped_failed: metrics
                .dropped
                .with_label_values(&[plugin, route, "send_failed"]),
        };
        Batcher::start_with(plugin, route, policy, MAX_PENDING_ENTRIES, sink, counters)
    }
}

impl<T: Item> Batcher<T> {
    /// Starts the task of a queue of at most `capacity` items (`plugin` on `route`, in
    /// Sluice's own log lines) sending to `sink`, counting in `counters`.
    pub fn start_with<S: Sink<T>>(
        plugin: &'static str,
        route: &str,
        policy: Policy,
        capacity: usize,
        sink: S,
        counters: Counters,
    ) -> Batcher<T> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let pending_bytes = Arc::new(AtomicUsize::new(0));
        let task = Task {
            rx,
            policy,
            sink,
            pending_bytes: Arc::clone(&pending_bytes),
            sent: counters.sent,
            dropped: counters.dropped_failed,
            plugin,
            route: route.to_owned(),
        };
        match runtime() {
            Some(rt) => {
                rt.spawn(task.run());
            }
            None => tracing::error!(plugin, route, "no logger runtime: entries are dropped"),
        }
        Batcher {
            tx,
            pending_bytes,
            dropped_full: counters.dropped_full,
        }
    }

    /// Queues `entry` without waiting; a full queue drops it (counted).
    pub fn push(&self, entry: T) {
        let n = entry.size();
        if self.pending_bytes.fetch_add(n, Ordering::Relaxed) + n > MAX_PENDING_BYTES {
            self.pending_bytes.fetch_sub(n, Ordering::Relaxed);
            self.dropped_full.inc();
            return;
        }
        // NB: counted before the send, so that the task never subtracts first.
        PENDING.fetch_add(1, Ordering::Relaxed);
        if self.tx.try_send(Queued(entry)).is_err() {
            PENDING.fetch_sub(1, Ordering::Relaxed);
            self.pending_bytes.fetch_sub(n, Ordering::Relaxed);
            self.dropped_full.inc();
        }
    }
}

/// Entries queued or being sent by every logger of the process.
static PENDING: AtomicUsize = AtomicUsize::new(0);

fn shutdown_signal() -> &'static watch::Sender<bool> {
    static TX: OnceLock<watch::Sender<bool>> = OnceLock::new();
    TX.get_or_init(|| watch::channel(false).0)
}

/// What a logger's task does next.
enum Next<T> {
    Entry(T),
    /// The batch waited long enough (`inactive_timeout`, `buffer_duration`).
    Idle,
    /// The process is stopping ([`flush_all`]).
    Drain,
    /// Every [`Batcher`] of the logger is gone.
    Closed,
}

async fn recv<T>(rx: &mut mpsc::Receiver<Queued<T>>, deadline: Option<Instant>) -> Next<T> {
    let got = match deadline {
        Some(d) => match tokio::time::timeout_at(d.into(), rx.recv()).await {
            Ok(got) => got,
            Err(_) => return Next::Idle,
        },
        None => rx.recv().await,
    };
    got.map_or(Next::Closed, |Queued(e)| Next::Entry(e))
}

/// How often a busy logger's task looks at its queue. While entries keep coming, the task
/// sleeps this long and then takes every entry queued, instead of waiting on the queue:
/// a task waiting on its queue is woken by each entry, and that wake (a write to the
/// logger thread's eventfd, a context switch there and back) cost the request path more
/// than building the entry (issue 19's budget, profiled). An idle task waits on the queue
/// and is woken by the first entry of the next burst. At 20 ms and the queue's 8,192
/// entries, a worker would have to log 400,000 requests a second to fill it between looks.
pub const BUSY_TICK: Duration = Duration::from_millis(20);

/// For a stopping process, once its requests are done: every logger sends what it holds
/// at once, and so does it with each entry that still comes. Returns whether every entry
/// was delivered or dropped (counted) within `timeout`.
pub async fn flush_all(timeout: Duration) -> bool {
    shutdown_signal().send_replace(true);
    let deadline = tokio::time::Instant::now() + timeout;
    while PENDING.load(Ordering::Relaxed) > 0 {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// The logger runtime: one thread of its own, started on first use, so that sending and
/// writing never compete with a worker's requests.
fn runtime() -> Option<&'static tokio::runtime::Handle> {
    static RT: OnceLock<Option<tokio::runtime::Handle>> = OnceLock::new();
    RT.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        let handle = rt.handle().clone();
        std::thread::Builder::new()
            .name("sluice-logger".into())
            .spawn(move || rt.block_on(std::future::pending::<()>()))
            .ok()?;
        Some(handle)
    })
    .as_ref()
}

struct Task<S, T> {
    rx: mpsc::Receiver<Queued<T>>,
    policy: Policy,
    sink: S,
    pending_bytes: Arc<AtomicUsize>,
    sent: prometheus::IntCounter,
    dropped: prometheus::IntCounter,
    plugin: &'static str,
    route: String,
}

impl<T: Item, S: Sink<T>> Task<S, T> {
    async fn run(mut self) {
        let mut batch: Vec<T> = Vec::new();
        let (mut first, mut last) = (Instant::now(), Instant::now());
        let mut shutdown = shutdown_signal().subscribe();
        let mut draining = *shutdown.borrow_and_update();
        // Whether the last look found entries: then the next look is a tick away, and no
        // entry wakes the task.
        let mut busy = false;
        loop {
            // Draining (the process is stopping): every entry goes at once.
            let eager = draining || self.policy.inactive.is_none();
            let deadline = self.deadline(&batch, first, last, eager);
            let mut took = 0;
            let mut closed = false;
            if busy {
                let until = deadline.map_or(Instant::now() + BUSY_TICK, |d| {
                    d.min(Instant::now() + BUSY_TICK)
                });
                tokio::select! {
                    () = tokio::time::sleep_until(until.into()) => {}
                    _ = shutdown.changed(), if !draining => draining = true,
                }
            } else {
                let next = tokio::select! {
                    next = recv(&mut self.rx, deadline) => next,
                    _ = shutdown.changed(), if !draining => Next::Drain,
                };
                match next {
                    Next::Entry(e) => {
                        took += 1;
                        self.take(e, &mut batch, &mut first, &mut last).await;
                    }
                    Next::Idle => {}
                    Next::Drain => draining = true,
                    Next::Closed => closed = true,
                }
            }
            // Everything else queued, without waiting.
            while !closed {
                match self.rx.try_recv() {
                    Ok(Queued(e)) => {
                        took += 1;
                        self.take(e, &mut batch, &mut first, &mut last).await;
                    }
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => closed = true,
                }
            }
            busy = took > 0;
            if closed {
                // Every handle is gone (the config changed or its route went away): send
                // what is left, then end.
                self.flush(&mut batch).await;
                return;
            }
            let eager = draining || self.policy.inactive.is_none();
            let due = self
                .deadline(&batch, first, last, eager)
                .is_some_and(|d| d <= Instant::now());
            if due {
                self.flush(&mut batch).await;
            }
        }
    }

    /// When the current batch is due: now when `eager`, else `inactive_timeout` after its
    /// last entry or `buffer_duration` after its first, whichever comes first; `None` for
    /// an empty batch.
    fn deadline(&self, batch: &[T], first: Instant, last: Instant, eager: bool) -> Option<Instant> {
        if batch.is_empty() {
            return None;
        }
        match self.policy.inactive {
            Some(inactive) if !eager => {
                Some((last + inactive).min(first + self.policy.buffer_duration))
            }
            _ => Some(Instant::now()),
        }
    }

    /// Adds `entry` to `batch`, sending the batch once it is full.
    async fn take(
        &mut self,
        entry: T,
        batch: &mut Vec<T>,
        first: &mut Instant,
        last: &mut Instant,
    ) {
        let now = Instant::now();
        if batch.is_empty() {
            *first = now;
        }
        *last = now;
        batch.push(entry);
        if batch.len() >= self.policy.max_size {
            self.flush(batch).await;
        }
    }

    /// Sends `batch` with the policy's retries, then empties it.
    async fn flush(&mut self, batch: &mut Vec<T>) {
        if batch.is_empty() {
            return;
        }
        let count = batch.len();
        let bytes: usize = batch.iter().map(Item::size).sum();
        let payload = self.sink.encode(std::mem::take(batch));
        let mut attempt = 0;
        loop {
            match self.sink.send(&payload).await {
                Ok(()) => {
                    self.sent.inc_by(count as u64);
                    break;
                }
                Err(error) if attempt < self.policy.max_retries => {
                    attempt += 1;
                    tracing::warn!(plugin = self.plugin, route = %self.route, name = self.sink.name(), entries = count,
                        attempt, %error, "log batch failed; retrying");
                    tokio::time::sleep(self.policy.retry_delay).await;
                }
                Err(error) => {
                    tracing::error!(plugin = self.plugin, route = %self.route, name = self.sink.name(), entries = count,
                        %error, "log batch failed every attempt; dropped");
                    self.dropped.inc_by(count as u64);
                    break;
                }
            }
        }
        self.pending_bytes.fetch_sub(bytes, Ordering::Relaxed);
        PENDING.fetch_sub(count, Ordering::Relaxed);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Records every batch.
    struct Recorder(Arc<std::sync::Mutex<Vec<Vec<String>>>>);

    impl Sink for Recorder {
        type Payload = Vec<String>;

        fn encode(&mut self, batch: Vec<String>) -> Vec<String> {
            batch
        }

        async fn send(&mut self, batch: &Vec<String>) -> Result<(), String> {
            self.0.lock().unwrap().push(batch.clone());
            Ok(())
        }
    }

    // NB: the only test of this binary that starts a logger: `flush_all` drains every
    // logger of the process.
    #[tokio::test]
    async fn a_stopping_process_sends_held_entries_at_once() {
        let got = Arc::new(std::sync::Mutex::new(Vec::new()));
        let policy = Policy {
            max_size: 100,
            inactive: Some(Duration::from_secs(3600)),
            buffer_duration: Duration::from_secs(3600),
            max_retries: 0,
            retry_delay: Duration::ZERO,
        };
        let metrics = LogMetrics::default();
        let b = Batcher::start("t", "r", policy, Recorder(Arc::clone(&got)), &metrics);
        for i in 0..3 {
            b.push(format!("{{\"n\":{i}}}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(got.lock().unwrap().is_empty(), "held for an hour");
        assert!(flush_all(Duration::from_secs(30)).await);
        assert_eq!(
            got.lock().unwrap().concat(),
            ["{\"n\":0}", "{\"n\":1}", "{\"n\":2}"]
        );
        // Entries that come later go at once.
        b.push("{}".into());
        assert!(flush_all(Duration::from_secs(30)).await);
        assert_eq!(got.lock().unwrap().last().unwrap(), &["{}"]);
        assert_eq!(metrics.sent.with_label_values(&["t", "r"]).get(), 4);
    }
}
