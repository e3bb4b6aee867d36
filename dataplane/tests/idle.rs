//! Idle HTTP/1.1 keep-alive connections are parked without their buffers
//! (`listener/idle.rs`): what a client sees must not change. A connection quiet between
//! requests is parked after 250 ms; its next request, pipelined requests, slow heads, slow
//! response bodies, the keep-alive limit and drain all behave as on an unparked one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use sluice_dataplane::config::store::Store;
use sluice_dataplane::listener::server::{self, Drain, Limits};
use sluice_testkit::EchoServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The system allocator, counting the allocations of each thread (for
/// [`a_coarse_sleep_allocates_nothing`]).
struct CountingAlloc;

thread_local! {
    static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[allow(unsafe_code)]
// SAFETY: forwards every call to the system allocator unchanged; the counter is a
// thread-local `Cell` without a destructor, so counting never allocates.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: as above.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: as above.
        unsafe { std::alloc::System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static COUNTING: CountingAlloc = CountingAlloc;

fn allocations_here() -> u64 {
    ALLOCATIONS.with(std::cell::Cell::get)
}

/// Longer than the parking grace (250 ms) plus the coarse timer's resolution.
const PARKED_AFTER: Duration = Duration::from_millis(600);

fn parked(dp: &Dataplane) -> f64 {
    metric_of(dp, "sluice_dataplane_parked_connections", &[]).unwrap_or(-1.0)
}

async fn until_parked(dp: &Dataplane, want: f64) {
    assert!(
        eventually(Duration::from_secs(8), || parked(dp) == want).await,
        "parked connections: {} (want {want})",
        parked(dp)
    );
}

/// Reads one response with a `Content-Length` or chunked body; returns the status and the
/// body.
async fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> (u16, Vec<u8>) {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(head) = resp.parse(buf).unwrap() {
            let status = resp.code.unwrap();
            let len = resp
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .map(|h| {
                    std::str::from_utf8(h.value)
                        .unwrap()
                        .parse::<usize>()
                        .unwrap()
                });
            let chunked = resp
                .headers
                .iter()
                .any(|h| h.name.eq_ignore_ascii_case("transfer-encoding") && h.value == b"chunked");
            if let Some(len) = len
                && buf.len() >= head + len
            {
                let body = buf[head..head + len].to_vec();
                buf.drain(..head + len);
                return (status, body);
            }
            if chunked && let Some((body, used)) = dechunk(&buf[head..]) {
                buf.drain(..head + used);
                return (status, body);
            }
        }
        let mut more = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut more))
            .await
            .expect("no response within 10 s")
            .unwrap();
        assert!(
            n > 0,
            "connection closed mid-response: {:?}",
            String::from_utf8_lossy(buf)
        );
        buf.extend_from_slice(&more[..n]);
    }
}

/// A complete chunked body at the start of `b`: the data and the bytes it took.
fn dechunk(b: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut at = 0;
    let mut out = Vec::new();
    loop {
        let line = b[at..].windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&b[at..at + line]).ok()?, 16).ok()?;
        at += line + 2;
        if size == 0 {
            return (b.len() >= at + 2).then_some((out, at + 2));
        }
        if b.len() < at + size + 2 {
            return None;
        }
        out.extend_from_slice(&b[at..at + size]);
        at += size + 2;
    }
}

const GET: &[u8] = b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n";

async fn echo_dataplane() -> (EchoServer, Dataplane) {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane_to("/*", echo.addr).await;
    (echo, dp)
}

/// A request arms about three coarse timeouts (upstream read, body, send); they take slots
/// that dropped sleeps gave back, so arming, polling and dropping one allocates nothing
/// (issue 21: it allocated an `Arc` each, freed only at the next sweep).
#[test]
fn a_coarse_sleep_allocates_nothing() {
    use sluice_io::timer::{CoarseSleep, CoarseTimer};
    use std::future::Future;
    use std::pin::Pin;
    let timer = CoarseTimer::new();
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut pending = |s: &mut CoarseSleep| Pin::new(s).poll(&mut cx).is_pending();
    // Sleeps that stay armed throughout, as other connections' would.
    let mut held = (
        timer.sleep(Duration::from_secs(60)),
        timer.sleep_far(Duration::from_secs(60)),
    );
    assert!(pending(&mut held.0) && pending(&mut held.1));
    let mut arm = |timer: &CoarseTimer| {
        let mut near = timer.sleep(Duration::from_secs(60));
        let mut far = timer.sleep_far(Duration::from_secs(60));
        assert!(pending(&mut near) && pending(&mut near) && pending(&mut far));
    };
    // The first round makes each list's slots.
    arm(&timer);
    let before = allocations_here();
    for _ in 0..1000 {
        arm(&timer);
    }
    let made = allocations_here() - before;
    drop(held);
    assert_eq!(made, 0, "2,000 sleeps allocated {made} times");
}

/// An origin on its own thread (its allocations are not counted on the test's): every
/// request head it reads is answered `200` with the body `hello`, on keep-alive.
fn origin_thread() -> SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut have = 0;
                loop {
                    let Ok(n) = conn.read(&mut buf[have..]) else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    have += n;
                    while let Some(end) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") {
                        let resp = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello";
                        if conn.write_all(resp).is_err() {
                            return;
                        }
                        buf.copy_within(end + 4..have, 0);
                        have -= end + 4;
                    }
                }
            });
        }
    });
    addr
}

/// Sends `GET` on `s` and reads the whole response (it ends with `hello`) into `buf`,
/// without allocating.
async fn get_hello(s: &mut TcpStream, buf: &mut [u8]) {
    s.write_all(GET).await.unwrap();
    let mut have = 0;
    while !buf[..have].ends_with(b"hello") {
        let n = s.read(&mut buf[have..]).await.unwrap();
        assert!(
            n > 0,
            "closed after {:?}",
            String::from_utf8_lossy(&buf[..have])
        );
        have += n;
    }
    assert!(buf.starts_with(b"HTTP/1.1 200 "));
}

/// What a proxied keep-alive request costs the worker in allocations (issue 21: allocation
/// is a good part of Sluice's user-space time per request). The worker runs on this test's
/// thread, so the thread's count is the worker's (the client reads into a fixed buffer).
/// Measured here: 16 per request before the coarse timer's slots, the write batch's jobs on
/// the stack and its queue kept, the response head's spans on the stack and the request's
/// header map handed on to the next response; 4 after them (hyper's header-read timer, the
/// two read buffers' shared halves, the request head's bytes).
#[tokio::test]
async fn a_proxied_keepalive_request_allocates_little() {
    let store = Arc::new(Store::new().unwrap());
    apply_one_route(&store, "/*", origin_thread());
    let listener = server::bind_reuseport("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server::serve_until(
        listener,
        Arc::clone(&store),
        Limits::default(),
        Drain::never(),
    ));
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 4096];
    for _ in 0..50 {
        get_hello(&mut s, &mut buf).await;
    }
    let before = allocations_here();
    const N: u64 = 500;
    for _ in 0..N {
        get_hello(&mut s, &mut buf).await;
    }
    let per_request = (allocations_here() - before) as f64 / N as f64;
    eprintln!("allocations per proxied request: {per_request:.2}");
    assert!(
        per_request <= 6.0,
        "{per_request:.2} allocations per request"
    );
}

#[tokio::test]
async fn a_quiet_keepalive_connection_is_parked_and_its_next_request_is_served() {
    let (_echo, dp) = echo_dataplane().await;
    let mut s = TcpStream::connect(dp.addr).await.unwrap();
    let mut buf = Vec::new();
    s.write_all(GET).await.unwrap();
    assert_eq!(read_response(&mut s, &mut buf).await.0, 200);
    assert_eq!(parked(&dp), 0.0, "parked before its grace");
    // Parked within its grace (plus the timer's resolution): a connection waiting for its
    // next request does not hold hyper's buffers for long (9,000 clients that had each sent
    // a request held 218 MiB with a 2 s grace).
    tokio::time::sleep(PARKED_AFTER).await;
    assert_eq!(
        parked(&dp),
        1.0,
        "not parked {PARKED_AFTER:?} after its response"
    );
    // Same socket: the next request gets a new hyper connection.
    for _ in 0..3 {
        s.write_all(GET).await.unwrap();
        assert_eq!(read_response(&mut s, &mut buf).await.0, 200);
    }
    assert_eq!(parked(&dp), 0.0);
    // And parks again.
    until_parked(&dp, 1.0).await;
    drop(s);
    until_parked(&dp, 0.0).await;
}

#[tokio::test]
async fn pipelined_requests_are_all_answered_before_and_after_parking() {
    let (_echo, dp) = echo_dataplane().await;
    let mut s = TcpStream::connect(dp.addr).await.unwrap();
    let mut buf = Vec::new();
    for round in 0..2 {
        s.write_all(&GET.repeat(3)).await.unwrap();
        for i in 0..3 {
            let (status, _) = read_response(&mut s, &mut buf).await;
            assert_eq!(status, 200, "round {round}, response {i}");
        }
        assert!(buf.is_empty(), "bytes after the third response: {buf:?}");
        until_parked(&dp, 1.0).await;
    }
}

#[tokio::test]
async fn a_head_sent_slowly_after_a_request_is_not_cut_off() {
    let (_echo, dp) = echo_dataplane().await;
    let mut s = TcpStream::connect(dp.addr).await.unwrap();
    let mut buf = Vec::new();
    s.write_all(GET).await.unwrap();
    assert_eq!(read_response(&mut s, &mut buf).await.0, 200);
    // Half a head, then a pause longer than the grace: the connection has read bytes since
    // its last request, so it is not parked and the head completes.
    s.write_all(b"GET /x HTTP/1.1\r\nHo").await.unwrap();
    tokio::time::sleep(PARKED_AFTER).await;
    assert_eq!(parked(&dp), 0.0);
    s.write_all(b"st: h\r\n\r\n").await.unwrap();
    assert_eq!(read_response(&mut s, &mut buf).await.0, 200);
}

/// A pipelined head whose start came in the same read as the request before it, and whose
/// rest comes after a pause longer than the grace, is served, not lost: the connection is
/// not parked while hyper holds the start. Heads cut at every point of the head.
#[tokio::test]
async fn a_pipelined_head_that_straddles_the_grace_is_served() {
    let (_echo, dp) = echo_dataplane().await;
    let next = b"GET /second HTTP/1.1\r\nHost: h\r\n\r\n";
    for cut in [1, 5, 17, next.len() - 3, next.len() - 1] {
        let mut s = TcpStream::connect(dp.addr).await.unwrap();
        let mut buf = Vec::new();
        let mut first = GET.to_vec();
        first.extend_from_slice(&next[..cut]);
        s.write_all(&first).await.unwrap();
        assert_eq!(read_response(&mut s, &mut buf).await.0, 200, "cut {cut}");
        tokio::time::sleep(PARKED_AFTER).await;
        assert_eq!(
            parked(&dp),
            0.0,
            "cut {cut}: parked with half a head in hyper's buffer"
        );
        s.write_all(&next[cut..]).await.unwrap();
        let (status, body) = read_response(&mut s, &mut buf).await;
        assert_eq!(status, 200, "cut {cut}");
        assert!(
            String::from_utf8_lossy(&body).contains("/second"),
            "cut {cut}: {}",
            String::from_utf8_lossy(&body)
        );
    }
}

/// An upstream that reads each request head and then hands the connection to `answer`.
async fn upstream_answering<F, Fut>(answer: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut b).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    head.extend_from_slice(&b[..n]);
                }
                answer(s).await;
            });
        }
    });
    addr
}

/// An upstream that sends its response head and first chunk, pauses `pause`, then sends the
/// rest (a long poll, server-sent events).
async fn pausing_upstream(pause: Duration) -> SocketAddr {
    upstream_answering(move |mut s| async move {
        s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
            .await
            .unwrap();
        tokio::time::sleep(pause).await;
        let _ = s.write_all(b"6\r\n world\r\n0\r\n\r\n").await;
    })
    .await
}

/// An upstream that answers every request with `len` bytes of body.
async fn large_upstream(len: usize) -> SocketAddr {
    upstream_answering(move |mut s| async move {
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        let _ = s.write_all(&vec![b'x'; len]).await;
    })
    .await
}

/// A connection that ends after its response (`Connection: close`) is closed without a
/// `shutdown` of its own (`Watched::poll_shutdown`): everything written must still reach a
/// client that reads slowly, then the end of the stream.
#[tokio::test]
async fn a_closing_connection_delivers_its_whole_response_to_a_slow_reader() {
    const LEN: usize = 8 * 1024 * 1024;
    let upstream = large_upstream(LEN).await;
    let dp = dataplane_to("/*", upstream).await;
    let mut s = TcpStream::connect(dp.addr).await.unwrap();
    s.write_all(b"GET /big HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    // Not reading yet: the socket fills and the proxy's last bytes wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut all))
        .await
        .expect("the response did not end")
        .unwrap();
    let head = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert!(all.starts_with(b"HTTP/1.1 200"), "{:?}", &all[..head]);
    assert_eq!(all.len() - head, LEN);
}

#[tokio::test]
async fn a_response_body_that_pauses_past_the_grace_is_delivered_whole() {
    let upstream = pausing_upstream(PARKED_AFTER + Duration::from_millis(500)).await;
    let dp = dataplane_to("/*", upstream).await;
    let mut s = TcpStream::connect(dp.addr).await.unwrap();
    let mut buf = Vec::new();
    s.write_all(GET).await.unwrap();
    let (status, body) = read_response(&mut s, &mut buf).await;
    assert_eq!((status, body.as_slice()), (200, &b"hello world"[..]));
    // Then idle, and parked.
    until_parked(&dp, 1.0).await;
}

#[tokio::test]
async fn a_parked_connection_is_closed_at_the_keepalive_limit() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let limits = Limits {
        header_read_timeout: Duration::from_secs(4),
        ..Limits::default()
    };
    let dp = dataplane_limited(Arc::new(Store::new().unwrap()), limits).await;
    apply_one_route(&dp.store, "/*", echo.addr);
    let mut s = TcpStream::connect(dp.addr).await.unwrap();
    let mut buf = Vec::new();
    s.write_all(GET).await.unwrap();
    assert_eq!(read_response(&mut s, &mut buf).await.0, 200);
    let idle = tokio::time::Instant::now();
    until_parked(&dp, 1.0).await;
    let mut b = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(8), s.read(&mut b))
        .await
        .expect("a parked connection outlived the keep-alive limit")
        .unwrap_or(0);
    assert_eq!(n, 0, "closed without a response");
    let waited = idle.elapsed();
    assert!(
        waited >= Duration::from_millis(3500),
        "closed after {waited:?}, before the 4 s limit"
    );
    until_parked(&dp, 0.0).await;
}

#[tokio::test]
async fn drain_closes_parked_connections_and_the_worker_finishes() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let store = Arc::new(Store::new().unwrap());
    apply_one_route(&store, "/*", echo.addr);
    let std_listener = server::bind_reuseport("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
    let addr = listener.local_addr().unwrap();
    let (trigger, drain) = Drain::channel();
    let worker = tokio::spawn(server::serve_until(
        listener,
        Arc::clone(&store),
        Limits::default(),
        drain,
    ));
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    s.write_all(GET).await.unwrap();
    assert_eq!(read_response(&mut s, &mut buf).await.0, 200);
    eventually(Duration::from_secs(8), || {
        store.metrics().parked_connections.get() == 1
    })
    .await;
    assert_eq!(store.metrics().parked_connections.get(), 1);
    trigger.drain();
    let mut b = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut b))
        .await
        .expect("drain left a parked connection open")
        .unwrap_or(0);
    assert_eq!(n, 0);
    tokio::time::timeout(Duration::from_secs(3), worker)
        .await
        .expect("the worker did not finish after drain")
        .unwrap();
}

/// The dataplane process runs with transparent huge pages off (`main.rs`): with them,
/// khugepaged refilled the 2 MiB ranges whose memory parked connections had given back,
/// and resident memory grew by about 9 MiB every 10 s with 9,000 parked connections.
#[test]
fn the_dataplane_process_runs_without_transparent_huge_pages() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("routes.yaml");
    std::fs::write(&config, "").unwrap();
    let admin_addr = free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-dataplane"))
        .arg("--standalone")
        .arg(&config)
        .args([
            "--listen-http",
            "127.0.0.1:0",
            "--listen-https",
            "127.0.0.1:0",
        ])
        .args(["--admin", &admin_addr.to_string(), "--workers", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", child.id());
    // Serving once its admin port answers; the policy is set before that.
    if !listening_blocking(admin_addr, Duration::from_secs(10)) {
        let _ = child.kill();
        panic!("the dataplane did not start");
    }
    let thp = std::fs::read_to_string(&status).unwrap();
    let rollup = std::fs::read_to_string(format!("/proc/{}/smaps_rollup", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let line = thp
        .lines()
        .find(|l| l.starts_with("THP_enabled:"))
        .expect("the kernel reports THP_enabled in /proc/PID/status (Linux 5.0+)");
    assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
    // Where the host gives huge pages only to ranges that ask for them (`madvise`, the
    // default), none of the process's memory is one: the allocator does not ask, even for
    // what it maps before `main` turns them off.
    let mode =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if mode.contains("[madvise]") {
        let huge = rollup
            .lines()
            .find(|l| l.starts_with("AnonHugePages:"))
            .expect("smaps_rollup has AnonHugePages");
        assert_eq!(huge.split_whitespace().nth(1), Some("0"), "{huge}");
    }
}
