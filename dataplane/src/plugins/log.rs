//! What the logger plugins (`http-logger`, `file-logger`) share: APISIX's log entry, the
//! custom `log_format`, the response-body tee, and the batch processor that takes entries
//! off the request path.
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
//! A logger's queue and task live in [`super::PluginState`], keyed by its owner (route)
//! and config: a reload that keeps the config keeps the queue; a changed or removed
//! config drops the last handle when the store prunes, which closes the queue; the task
//! then sends what it holds (with its retries) and ends. No task outlives its config.
//! A stopping process calls [`flush_all`] once its requests are done.

use std::borrow::Cow;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, request};
use prometheus::{IntCounterVec, Opts};
use serde_json::{Map, Value};
use sluice_plugin_config::logger::{LogField, LogFormat, LogVar};
use tokio::sync::{mpsc, watch};

use super::{BodyFilter, PluginCtx, vars};

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

/// What a logger puts in its entries, besides APISIX's fixed fields.
#[derive(Debug, Clone)]
pub struct EntryOptions {
    /// A custom entry (`log_format`) instead of the full one.
    pub format: Option<LogFormat>,
    /// Most response-body bytes logged, when `include_resp_body`.
    pub resp_body: Option<usize>,
    /// Most request-body bytes logged, when `include_req_body`.
    pub req_body: Option<usize>,
}

/// A logger plugin on one route (http-logger, file-logger): the log phase builds the
/// entry and queues it on the logger's [`Batcher`]; the response head and (with
/// `include_resp_body`) a capped copy of the body are kept for it.
#[derive(Debug)]
pub struct Logger {
    name: &'static str,
    priority: i32,
    opts: EntryOptions,
    batcher: Arc<Batcher>,
}

impl Logger {
    /// The plugin `name` at `priority`, logging to `batcher`. `bodies`: the most
    /// request- and response-body bytes logged (`include_req_body` with
    /// `max_req_body_bytes`, `include_resp_body` with `max_resp_body_bytes`).
    pub fn new(
        name: &'static str,
        priority: i32,
        format: Option<LogFormat>,
        bodies: (Option<u64>, Option<u64>),
        batcher: Arc<Batcher>,
    ) -> Self {
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Logger {
            name,
            priority,
            opts: EntryOptions {
                format,
                req_body: bodies.0.map(size),
                resp_body: bodies.1.map(size),
            },
            batcher,
        }
    }
}

impl super::Plugin for Logger {
    fn name(&self) -> &'static str {
        self.name
    }

    fn priority(&self) -> i32 {
        self.priority
    }

    fn phases(&self) -> super::Phases {
        if self.opts.req_body.is_some() {
            super::Phases::BEFORE_PROXY
        } else {
            super::Phases::NONE
        }
    }

    fn before_proxy(&self, req: &mut request::Parts, ctx: &mut PluginCtx) {
        if let Some(cap) = self.opts.req_body {
            tee_request_body(cap, req, ctx);
        }
    }

    fn response_headers(&self, resp: &mut http::response::Parts, ctx: &mut PluginCtx) {
        keep_response_head(&resp.headers, ctx);
    }

    fn body_filter(&self, ctx: &mut PluginCtx) -> Option<Box<dyn BodyFilter>> {
        tee_response_body(self.opts.resp_body?, ctx)
    }

    fn wants_log(&self) -> bool {
        true
    }

    fn wants_request_head(&self) -> bool {
        true
    }

    fn log(&self, ctx: &mut PluginCtx) {
        if self.opts.req_body.is_some() {
            resolve_request_body(ctx);
        }
        self.batcher.push(entry(ctx, &self.opts));
    }
}

/// A copy of the request head as it arrived (before the plugins changed it), kept for the
/// log phase when a chain's plugin asks for it ([`super::Plugin::wants_request_head`]).
pub fn copy_head(req: &request::Parts) -> request::Parts {
    let mut r = http::Request::new(());
    *r.method_mut() = req.method.clone();
    *r.uri_mut() = req.uri.clone();
    *r.version_mut() = req.version;
    *r.headers_mut() = req.headers.clone();
    r.into_parts().0
}

/// The response head as the response phases made it, kept for the log phase.
#[derive(Debug, Clone)]
pub struct ResponseHead(pub HeaderMap);

/// Keeps a copy of the response headers for the log phase (once per request).
pub fn keep_response_head(headers: &HeaderMap, ctx: &mut PluginCtx) {
    if ctx.extensions.get::<ResponseHead>().is_none() {
        ctx.extensions.insert(ResponseHead(headers.clone()));
    }
}

/// The first bytes of the response body, copied as it streams (the longest cap of the
/// request's loggers).
#[derive(Debug, Clone, Default)]
pub struct ResponseBody {
    buf: Vec<u8>,
    cap: usize,
}

/// A body filter copying the first `cap` bytes into [`ResponseBody`]; it forwards every
/// chunk as it is (the length does not change).
#[derive(Debug)]
struct Tee;

impl BodyFilter for Tee {
    fn data(&mut self, chunk: Bytes, ctx: &mut PluginCtx) -> Bytes {
        if let Some(b) = ctx.extensions.get_mut::<ResponseBody>() {
            let room = b.cap.saturating_sub(b.buf.len());
            if room > 0 {
                b.buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
        }
        chunk
    }

    fn keeps_length(&self) -> bool {
        true
    }
}

/// The tee of a logger with `include_resp_body` (one per request, whichever logger asks
/// first; later ones raise its cap).
pub fn tee_response_body(cap: usize, ctx: &mut PluginCtx) -> Option<Box<dyn BodyFilter>> {
    if let Some(b) = ctx.extensions.get_mut::<ResponseBody>() {
        b.cap = b.cap.max(cap);
        return None;
    }
    ctx.extensions.insert(ResponseBody {
        buf: Vec::new(),
        cap,
    });
    Some(Box::new(Tee))
}

/// The copy of the request body the loggers of a request share (the first logger with
/// `include_req_body` asks for it, with its cap): waiting for the body to end, then its
/// first bytes, or none (the body did not end, or the request never went upstream).
#[derive(Debug, Clone)]
enum RequestBodyCopy {
    Waiting(Arc<std::sync::Mutex<Option<TapReceiver>>>),
    Done(Option<Bytes>),
}

type TapReceiver = tokio::sync::oneshot::Receiver<crate::upstream::request_body::TapResult>;

/// Asks for the first `cap` bytes of the request body as it streams upstream (once per
/// request).
fn tee_request_body(cap: usize, req: &mut request::Parts, ctx: &mut PluginCtx) {
    if ctx.extensions.get::<RequestBodyCopy>().is_some() {
        return;
    }
    let (tap, rx) = crate::upstream::request_body::BodyTap::truncating(cap);
    tap.attach(&mut req.extensions);
    ctx.extensions
        .insert(RequestBodyCopy::Waiting(Arc::new(std::sync::Mutex::new(
            Some(rx),
        ))));
}

/// The log phase: the body's copy, if the body has ended (an empty body is none, as
/// APISIX logs no `request.body` without one).
fn resolve_request_body(ctx: &mut PluginCtx) {
    let Some(RequestBodyCopy::Waiting(rx)) = ctx.extensions.get::<RequestBodyCopy>() else {
        return;
    };
    let rx = match rx.lock() {
        Ok(mut g) => g.take(),
        Err(p) => p.into_inner().take(),
    };
    let body = rx
        .and_then(|mut rx| rx.try_recv().ok())
        .and_then(Result::ok)
        .filter(|b| !b.is_empty());
    ctx.extensions.insert(RequestBodyCopy::Done(body));
}

/// The log entry of the request of `ctx`, as JSON text.
pub fn entry(ctx: &PluginCtx, opts: &EntryOptions) -> String {
    let end = ctx.end_time();
    if opts.format.is_none() {
        // NB: written straight from the request's own data, without a `Value` tree (whose
        // map of every header cost more than the rest of the request: issue 19's budget).
        // NB: sized for a typical entry at once, instead of growing from 128 bytes.
        let mut out = Vec::with_capacity(1024);
        if serde_json::to_writer(&mut out, &full(ctx, opts, end)).is_err() {
            return String::new();
        }
        // NB: serde_json writes valid UTF-8 only.
        return String::from_utf8(out).unwrap_or_default();
    }
    let value = match &opts.format {
        Some(f) => {
            let mut m = custom(f, ctx, end);
            m.insert("route_id".into(), Value::from(&*ctx.chain.route_id));
            m.insert("service_id".into(), Value::from(""));
            Value::Object(m)
        }
        None => Value::Null,
    };
    value.to_string()
}

fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

fn text(v: &http::HeaderValue) -> Value {
    Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// Headers as `ngx.req.get_headers()` gives them: lower-case names in order, a list for
/// a repeated header; serialised from the map itself.
struct Headers<'a>(&'a HeaderMap);

impl serde::Serialize for Headers<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut names: Vec<&http::HeaderName> = self.0.keys().collect();
        names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
        let mut m = s.serialize_map(Some(names.len()))?;
        for name in names {
            let all = self.0.get_all(name);
            let mut it = all.iter();
            match (it.next(), it.next()) {
                (Some(one), None) => m.serialize_entry(name.as_str(), &Lossy(one.as_bytes()))?,
                _ => m.serialize_entry(
                    name.as_str(),
                    &all.iter().map(|v| Lossy(v.as_bytes())).collect::<Vec<_>>(),
                )?,
            }
        }
        m.end()
    }
}

/// Bytes as a JSON string, invalid UTF-8 replaced.
struct Lossy<'a>(&'a [u8]);

impl serde::Serialize for Lossy<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&String::from_utf8_lossy(self.0))
    }
}

/// Query arguments as `ngx.req.get_uri_args()`: decoded, `true` for an argument without
/// `=`, a list for a repeated one.
fn query(q: Option<&str>) -> Value {
    let mut m = Map::new();
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = match pair.split_once('=') {
            Some((k, v)) => (k, Value::String(vars::percent_decode(v).into_owned())),
            None => (pair, Value::Bool(true)),
        };
        let k = vars::percent_decode(k).into_owned();
        match m.get_mut(&k) {
            Some(Value::Array(a)) => a.push(v),
            Some(old) => *old = Value::Array(vec![old.take(), v]),
            None => {
                m.insert(k, v);
            }
        }
    }
    Value::Object(m)
}

fn epoch_ms(at: Instant) -> f64 {
    let ago = Instant::now().saturating_duration_since(at);
    let t = SystemTime::now()
        .checked_sub(ago)
        .unwrap_or(SystemTime::now())
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    t.as_millis() as f64
}

/// APISIX's full entry (`log-util.get_full_log`). Fields in name order, as a JSON object
/// map writes them.
#[derive(serde::Serialize)]
struct Full<'a> {
    apisix_latency: f64,
    client_ip: Text<std::net::IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    consumer: Option<Consumer<'a>>,
    latency: f64,
    request: Req<'a>,
    response: Resp<'a>,
    route_id: &'a str,
    server: Server,
    service_id: &'static str,
    start_time: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_latency: Option<f64>,
}

#[derive(serde::Serialize)]
struct Consumer<'a> {
    username: &'a str,
}

#[derive(serde::Serialize)]
struct Req<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<Lossy<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    headers: Option<Headers<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    querystring: Option<Value>,
    size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    uri: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<Url<'a>>,
}

/// A value written as its `Display` text, straight into the entry.
struct Text<T>(T);

impl<T: std::fmt::Display> serde::Serialize for Text<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

/// `request.url` as APISIX writes it: `<scheme>://<host>:<port><target>`.
struct Url<'a> {
    scheme: &'a str,
    host: Option<Cow<'a, str>>,
    port: u16,
    target: &'a str,
}

impl std::fmt::Display for Url<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let host = self.host.as_deref().unwrap_or("");
        write!(f, "{}://{host}:{}{}", self.scheme, self.port, self.target)
    }
}

impl serde::Serialize for Url<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[derive(serde::Serialize)]
struct Resp<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<Lossy<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    headers: Option<Headers<'a>>,
    size: u64,
    status: u16,
}

#[derive(serde::Serialize)]
struct Server {
    hostname: &'static str,
    version: &'static str,
}

fn full<'a>(ctx: &'a PluginCtx, opts: &EntryOptions, end: Instant) -> Full<'a> {
    let head = ctx.request_head.as_deref();
    let target = head.map(|req| req.uri.path_and_query().map_or("/", |p| p.as_str()));
    let url = head.map(|req| Url {
        scheme: ctx.scheme,
        host: vars::get(&sluice_plugin_config::vars::Var::Host, req, ctx),
        port: ctx.local_addr.port(),
        target: target.unwrap_or("/"),
    });
    let body = match (opts.resp_body, ctx.extensions.get::<ResponseBody>()) {
        (Some(cap), Some(b)) => Some(Lossy(&b.buf[..b.buf.len().min(cap)])),
        _ => None,
    };
    let latency = end.saturating_duration_since(ctx.started);
    let upstream_latency = ctx
        .upstream_started
        .map(|up| end.saturating_duration_since(up));
    let apisix = upstream_latency.map_or(latency, |up| latency.saturating_sub(up));
    Full {
        apisix_latency: ms(apisix),
        client_ip: Text(ctx.remote_addr.ip().to_canonical()),
        consumer: ctx.consumer_name().map(|username| Consumer { username }),
        latency: ms(latency),
        request: Req {
            body: match (opts.req_body, ctx.extensions.get::<RequestBodyCopy>()) {
                (Some(cap), Some(RequestBodyCopy::Done(Some(b)))) => {
                    Some(Lossy(&b[..b.len().min(cap)]))
                }
                _ => None,
            },
            headers: head.map(|req| Headers(&req.headers)),
            method: head.map(|req| req.method.as_str()),
            querystring: head.map(|req| query(req.uri.query())),
            size: ctx.request_bytes,
            uri: target,
            url,
        },
        response: Resp {
            body,
            headers: ctx.extensions.get::<ResponseHead>().map(|h| Headers(&h.0)),
            size: ctx.response_head_bytes + ctx.response_body_bytes,
            status: ctx.status.as_u16(),
        },
        route_id: &ctx.chain.route_id,
        server: Server {
            hostname: hostname(),
            version: env!("CARGO_PKG_VERSION"),
        },
        service_id: "",
        start_time: epoch_ms(ctx.started),
        upstream: ctx.upstream.as_ref().map(|p| p.address()),
        upstream_latency: upstream_latency.map(ms),
    }
}

fn custom(f: &LogFormat, ctx: &PluginCtx, end: Instant) -> Map<String, Value> {
    let mut m = Map::new();
    for (k, field) in &f.fields {
        let v = match field {
            LogField::Literal(v) => v.clone(),
            LogField::Nested(n) => Value::Object(custom(n, ctx, end)),
            LogField::Var(var) => log_var(var, ctx, end),
        };
        m.insert(k.clone(), v);
    }
    m
}

fn secs(d: Duration) -> Value {
    Value::String(format!("{:.3}", d.as_secs_f64()))
}

fn log_var(var: &LogVar, ctx: &PluginCtx, end: Instant) -> Value {
    let s = |c: Option<Cow<'_, str>>| c.map_or(Value::Null, |c| Value::String(c.into_owned()));
    match var {
        LogVar::Request(v) => match ctx.request_head.as_deref() {
            Some(req) => s(vars::get(v, req, ctx)),
            None => Value::Null,
        },
        LogVar::Status => Value::from(ctx.status.as_u16()),
        LogVar::RequestTime => secs(end.saturating_duration_since(ctx.started)),
        LogVar::UpstreamAddr => ctx
            .upstream
            .as_ref()
            .map_or(Value::Null, |p| Value::from(p.address())),
        LogVar::UpstreamResponseTime => ctx
            .upstream_started
            .map_or(Value::Null, |u| secs(end.saturating_duration_since(u))),
        LogVar::BytesSent => Value::from(ctx.response_head_bytes + ctx.response_body_bytes),
        LogVar::BodyBytesSent => Value::from(ctx.response_body_bytes),
        LogVar::RequestLength => Value::from(ctx.request_bytes),
        LogVar::TimeIso8601 => Value::String(iso8601(epoch_ms(ctx.started) as u64 / 1000)),
        LogVar::Msec => Value::String(format!("{:.3}", epoch_ms(Instant::now()) / 1000.0)),
        LogVar::Hostname => Value::String(hostname().to_owned()),
        LogVar::SentHeader(name) => ctx
            .extensions
            .get::<ResponseHead>()
            .and_then(|h| h.0.get(name.as_str()))
            .map_or(Value::Null, text),
        LogVar::OpentelemetryTraceId => trace(ctx, |t| t.trace_id_hex()),
        LogVar::OpentelemetrySpanId => trace(ctx, |t| t.span_id_hex()),
        LogVar::OpentelemetryTraceparent => trace(ctx, |t| t.traceparent()),
    }
}

/// A value of the request's trace context (opentelemetry plugin), `null` without one.
fn trace(ctx: &PluginCtx, f: impl Fn(&super::opentelemetry::TraceContext) -> String) -> Value {
    ctx.trace
        .as_ref()
        .map_or(Value::Null, |t| Value::String(f(t)))
}

fn hostname() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(super::prometheus::hostname)
}

/// `secs` since the epoch as `YYYY-MM-DDTHH:MM:SS+00:00` (UTC).
fn iso8601(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}+00:00",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
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

    #[test]
    fn iso_dates() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00+00:00");
        assert_eq!(iso8601(1_709_251_199), "2024-02-29T23:59:59+00:00");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00+00:00");
    }

    #[test]
    fn query_args_as_nginx() {
        assert_eq!(
            query(Some("a=1&b&a=x%20y&c=")),
            serde_json::json!({"a": ["1", "x y"], "b": true, "c": ""})
        );
        assert_eq!(query(None), serde_json::json!({}));
    }
}
