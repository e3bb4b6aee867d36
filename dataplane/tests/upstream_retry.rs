//! Route deadlines and retry policies (HTTPRoute `timeouts` and `retry`, in the one attempt
//! loop): a whole-request deadline answers 504 and drops the upstream connection; a
//! per-attempt timeout is retried on another endpoint for a replayable request and never
//! for a POST whose body was sent; connection errors are retried, on the same endpoint when
//! it is the only one; statuses are retried only when listed; the backoff is waited; every
//! retry is counted by reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::StatusCode;
use sluice_proto::v1;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Route `default/r/r1` on `/*` to upstream `u` of `addrs`, with `timeout` and `retry`.
fn apply(
    dp: &Dataplane,
    addrs: &[SocketAddr],
    timeout: Option<v1::Timeouts>,
    retry: Option<v1::RetryPolicy>,
) {
    let mut r = route("default/r/r1", &["/*"], "u");
    r.timeout = timeout;
    r.retry = retry;
    // NB: each snapshot a newer version than the last.
    static VERSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let version = VERSION.fetch_add(1, Ordering::SeqCst);
    dp.store
        .apply(
            snapshot(version, vec![r], vec![upstream_of("u", addrs)]),
            vec![],
        )
        .unwrap();
}

fn deadlines(request_ms: u64, attempt_ms: u64) -> Option<v1::Timeouts> {
    Some(v1::Timeouts {
        request_ms,
        attempt_ms,
        ..Default::default()
    })
}

fn retries(dp: &Dataplane, reason: &str) -> f64 {
    metric_of(
        dp,
        "sluice_upstream_retries_total",
        &["upstream=\"u\"", &format!("reason=\"{reason}\"")],
    )
    .unwrap_or(0.0)
}

/// A raw HTTP/1.1 origin whose first `fail` connections read the request head and close
/// without answering (a connection error after the request was sent); later connections
/// answer `200 ok` to every request. Counts connections.
async fn flaky(fail: usize) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&conns);
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let n = seen.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut head = Vec::new();
                loop {
                    let Ok(k) = s.read(&mut buf).await else {
                        return;
                    };
                    if k == 0 {
                        return;
                    }
                    head.extend_from_slice(&buf[..k]);
                    if !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        continue;
                    }
                    head.clear();
                    if n < fail {
                        return; // closed without an answer
                    }
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if s.write_all(ok).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, conns)
}

#[tokio::test]
async fn request_deadline_is_504_and_the_upstream_connection_is_not_reused() {
    let slow = Origin::start("slow");
    let dp = dataplane().await;
    apply(&dp, &[slow.addr], deadlines(300, 0), None);
    // A first request leaves a pooled connection.
    assert_eq!(get_with(dp.addr, "/a", &[]).await.status, StatusCode::OK);
    assert_eq!(slow.state.connections.load(Ordering::SeqCst), 1);

    slow.state.delay_ms.store(3000, Ordering::SeqCst);
    let started = Instant::now();
    let resp = get_with(dp.addr, "/b", &[]).await;
    assert_eq!(resp.status, StatusCode::GATEWAY_TIMEOUT, "{}", resp.text());
    assert!(started.elapsed() >= Duration::from_millis(250));

    // The connection whose answer is late was closed: the next request opens another one
    // (reused, it would read the late answer as its own).
    slow.state.delay_ms.store(0, Ordering::SeqCst);
    assert_eq!(get_with(dp.addr, "/c", &[]).await.status, StatusCode::OK);
    assert_eq!(slow.state.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_attempt_timeout_is_retried_on_the_next_endpoint_but_a_sent_post_is_not() {
    let (slow, fast) = (Origin::start("slow"), Origin::start("fast"));
    slow.state.delay_ms.store(3000, Ordering::SeqCst);
    let dp = dataplane().await;
    apply(&dp, &[slow.addr, fast.addr], deadlines(0, 200), None);

    for _ in 0..4 {
        let resp = get_with(dp.addr, "/get", &[]).await;
        assert_eq!(resp.status, StatusCode::OK, "{}", resp.text());
        assert_eq!(h(&resp, "x-origin"), Some("fast"));
    }
    assert!(slow.state.requests.load(Ordering::SeqCst) >= 1);
    assert!(retries(&dp, "timeout") >= 1.0);

    // Round robin over two endpoints: of two POSTs in a row, one goes to the slow one, and
    // its body was sent: 504, never sent to the fast one.
    let fast_before = fast.state.requests.load(Ordering::SeqCst);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let resp = request_with_body(
            dp.addr,
            "POST",
            "/post",
            &[],
            Bytes::from_static(b"order=1"),
        )
        .await;
        statuses.push(resp.status);
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let timed_out = statuses
        .iter()
        .filter(|s| **s == StatusCode::GATEWAY_TIMEOUT)
        .count();
    assert_eq!((ok, timed_out), (2, 2), "{statuses:?}");
    assert_eq!(fast.state.requests.load(Ordering::SeqCst) - fast_before, ok);
}

#[tokio::test]
async fn connection_errors_are_retried_on_the_only_endpoint_up_to_the_attempts() {
    let (addr, conns) = flaky(2).await;
    let dp = dataplane().await;
    let policy = v1::RetryPolicy {
        attempts: 3,
        ..Default::default()
    };
    apply(&dp, &[addr], None, Some(policy));
    let resp = get_with(dp.addr, "/x", &[]).await;
    assert_eq!(resp.status, StatusCode::OK, "{}", resp.text());
    assert_eq!(conns.load(Ordering::SeqCst), 3);
    assert_eq!(retries(&dp, "connection_error"), 2.0);

    // More failures than attempts: the error is the client's.
    let (addr, conns) = flaky(5).await;
    let policy = v1::RetryPolicy {
        attempts: 2,
        ..Default::default()
    };
    apply(&dp, &[addr], None, Some(policy));
    let resp = get_with(dp.addr, "/x", &[]).await;
    assert_eq!(resp.status, StatusCode::BAD_GATEWAY, "{}", resp.text());
    assert_eq!(conns.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn only_listed_status_codes_are_retried_and_never_a_post_with_a_body() {
    // `a` answers /status/503 with 503; `b` answers 200 to anything.
    let a = EchoServer::start("a", any()).await.unwrap();
    let b = Origin::start("b");
    let dp = dataplane().await;
    let listed = |codes: Vec<u32>| v1::RetryPolicy {
        attempts: 1,
        codes,
        ..Default::default()
    };
    apply(&dp, &[a.addr, b.addr], None, Some(listed(vec![500, 503])));
    for _ in 0..4 {
        let resp = get_with(dp.addr, "/status/503", &[]).await;
        assert_eq!(resp.status, StatusCode::OK, "{}", resp.text());
    }
    let by_status = retries(&dp, "status");
    assert!(by_status >= 1.0, "{by_status}");

    // A POST with a body is not sent again: of two in a row one gets a's 503.
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let resp = request_with_body(
            dp.addr,
            "POST",
            "/status/503",
            &[],
            Bytes::from_static(b"x"),
        )
        .await;
        statuses.push(resp.status);
    }
    assert!(
        statuses.contains(&StatusCode::SERVICE_UNAVAILABLE),
        "{statuses:?}"
    );
    assert_eq!(retries(&dp, "status"), by_status);

    // 503 not listed: passed on as it is.
    apply(&dp, &[a.addr, b.addr], None, Some(listed(vec![500])));
    let mut statuses = Vec::new();
    for _ in 0..2 {
        statuses.push(get_with(dp.addr, "/status/503", &[]).await.status);
    }
    assert!(
        statuses.contains(&StatusCode::SERVICE_UNAVAILABLE),
        "{statuses:?}"
    );
    assert_eq!(retries(&dp, "status"), by_status);
}

#[tokio::test]
async fn the_backoff_is_waited_between_retries() {
    let (addr, conns) = flaky(2).await;
    let dp = dataplane().await;
    let policy = v1::RetryPolicy {
        attempts: 2,
        backoff_ms: 200,
        ..Default::default()
    };
    apply(&dp, &[addr], None, Some(policy));
    let started = Instant::now();
    let resp = get_with(dp.addr, "/x", &[]).await;
    assert_eq!(resp.status, StatusCode::OK, "{}", resp.text());
    assert_eq!(conns.load(Ordering::SeqCst), 3);
    // 200 ms, then twice that.
    assert!(
        started.elapsed() >= Duration::from_millis(550),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn the_request_deadline_bounds_retries_and_backoff() {
    let (addr, _conns) = flaky(100).await;
    let dp = dataplane().await;
    let policy = v1::RetryPolicy {
        attempts: 50,
        backoff_ms: 100,
        ..Default::default()
    };
    apply(&dp, &[addr], deadlines(400, 0), Some(policy));
    let resp = get_with(dp.addr, "/x", &[]).await;
    assert_eq!(resp.status, StatusCode::GATEWAY_TIMEOUT, "{}", resp.text());
}
