//! http-logger and file-logger against real receivers: an in-process HTTP log server
//! that records every batch (and can fail or stall on demand), and a real file.
//!
//! No test asserts a duration: waits are "until it happened", with a generous deadline
//! that only turns a hang into a failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sluice_testkit::EchoServer;

/// One request the log server received.
#[derive(Debug, Clone)]
struct Batch {
    target: String,
    headers: HeaderMap,
    body: String,
}

impl Batch {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

#[derive(Default)]
struct Behaviour {
    /// Answer 500 to this many requests first.
    fail_next: AtomicUsize,
    /// Answer 500 to every request.
    always_fail: AtomicBool,
    /// Never answer.
    stall: AtomicBool,
}

/// A log server recording every request it gets (also the failed ones).
struct LogServer {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Batch>>>,
    behaviour: Arc<Behaviour>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LogServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A TLS acceptor with a self-signed certificate for `127.0.0.1`.
fn self_signed() -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let cert = sluice_testkit::pki::self_signed(&["127.0.0.1"]);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_der)),
        )
        .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

impl LogServer {
    async fn start() -> Self {
        Self::start_with(None).await
    }

    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let behaviour = Arc::new(Behaviour::default());
        let (g, b) = (Arc::clone(&got), Arc::clone(&behaviour));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (g, b, tls) = (Arc::clone(&g), Arc::clone(&b), tls.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let (g, b) = (Arc::clone(&g), Arc::clone(&b));
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body.collect().await.unwrap().to_bytes();
                            g.lock().unwrap().push(Batch {
                                target: parts.uri.to_string(),
                                headers: parts.headers,
                                body: String::from_utf8(body.to_vec()).unwrap(),
                            });
                            if b.stall.load(Ordering::SeqCst) {
                                std::future::pending::<()>().await;
                            }
                            let fail = b.always_fail.load(Ordering::SeqCst)
                                || b.fail_next
                                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                                        n.checked_sub(1)
                                    })
                                    .is_ok();
                            let status = if fail { 500 } else { 200 };
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .status(status)
                                    .body(Full::new(Bytes::from_static(b"ok")))
                                    .unwrap(),
                            )
                        }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    match tls {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                let _ = http.serve_connection(TokioIo::new(stream), service).await;
                            }
                        }
                        None => {
                            let _ = http.serve_connection(TokioIo::new(stream), service).await;
                        }
                    }
                });
            }
        });
        LogServer {
            addr,
            got,
            behaviour,
            task,
        }
    }

    fn uri(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn batches(&self) -> Vec<Batch> {
        self.got.lock().unwrap().clone()
    }

    /// Waits until at least `n` requests arrived.
    async fn wait_for(&self, n: usize) -> Vec<Batch> {
        assert!(
            eventually(LONG_WAIT, || self.got.lock().unwrap().len() >= n).await,
            "condition not met within 30 s"
        );
        self.batches()
    }
}

/// A dataplane with route `default/r/p` (`/*`) to an echo origin, with `plugins`.
async fn serve(plugins: Vec<sluice_proto::v1::Plugin>) -> (Dataplane, EchoServer) {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let snap = snapshot(
        1,
        vec![route_with("default/r/p", &["/*"], "u", plugins)],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    dp.store.apply(snap, vec![]).unwrap();
    (dp, echo)
}

fn counter(dp: &Dataplane, name: &str, labels: &[&str]) -> f64 {
    metric_of(dp, name, labels).unwrap_or(0.0)
}

#[tokio::test]
async fn a_full_batch_goes_at_once_in_apisixs_entry_shape() {
    let logs = LogServer::start().await;
    let (dp, _echo) = serve(vec![plugin(
        "http-logger",
        json!({
            "uri": logs.uri("/ingest?src=sluice"),
            "auth_header": "Bearer log-token",
            "batch_max_size": 3,
            "inactive_timeout": 3600,
            "buffer_duration": 3600,
            "include_resp_body": true,
            "max_resp_body_bytes": 12,
        }),
    )])
    .await;
    for i in 0..3 {
        let r = get_with(
            dp.addr,
            &format!("/items/{i}?a=1&a=2&flag"),
            &[("user-agent", "curl/8"), ("x-multi", "1"), ("x-multi", "2")],
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
        // The tee changes nothing the client sees.
        assert_eq!(
            h(&r, "content-length"),
            Some(r.body.len().to_string().as_str())
        );
        assert!(r.json()["path"].as_str().unwrap().starts_with("/items/"));
    }
    let batches = logs.wait_for(1).await;
    assert_eq!(batches.len(), 1, "three entries, one batch");
    let b = &batches[0];
    assert_eq!(b.target, "/ingest?src=sluice");
    assert_eq!(b.headers["content-type"], "application/json");
    assert_eq!(b.headers["authorization"], "Bearer log-token");
    assert_eq!(b.headers["host"], logs.addr.to_string().as_str());
    let entries = b.json();
    let entries = entries.as_array().expect("a JSON array");
    assert_eq!(entries.len(), 3);
    let e = &entries[0];
    let req = &e["request"];
    assert_eq!(req["method"], "GET");
    assert_eq!(req["uri"], "/items/0?a=1&a=2&flag");
    assert_eq!(
        req["url"],
        format!("http://example.com:{}/items/0?a=1&a=2&flag", dp.addr.port())
    );
    assert_eq!(req["headers"]["user-agent"], "curl/8");
    assert_eq!(req["headers"]["host"], "example.com");
    assert_eq!(
        req["headers"]["x-multi"],
        json!(["1", "2"]),
        "a repeated header is a list"
    );
    assert_eq!(req["querystring"], json!({"a": ["1", "2"], "flag": true}));
    assert!(req["size"].as_u64().unwrap() > 0);
    let resp = &e["response"];
    assert_eq!(resp["status"], 200);
    assert_eq!(resp["headers"]["x-echo-server"], "a");
    assert!(resp["size"].as_u64().unwrap() > 30, "{resp}");
    assert_eq!(
        resp["body"], "{\"body\":\"\",\"",
        "cut at max_resp_body_bytes"
    );
    assert_eq!(e["route_id"], "default/r/p");
    assert_eq!(e["service_id"], "");
    assert_eq!(e["client_ip"], "127.0.0.1");
    assert_eq!(e["upstream"], _echo.addr.to_string().as_str());
    assert!(e.get("consumer").is_none());
    assert!(!e["server"]["hostname"].is_null());
    assert!(e["server"]["version"].is_string());
    for f in [
        "latency",
        "upstream_latency",
        "apisix_latency",
        "start_time",
    ] {
        assert!(e[f].as_f64().is_some(), "{f}: {e}");
    }
    assert!(
        e["start_time"].as_f64().unwrap() > 1.6e12,
        "epoch milliseconds"
    );
    assert_eq!(entries[2]["request"]["uri"], "/items/2?a=1&a=2&flag");
    // NB: counted once the log server has answered, which is after the test received it.
    assert!(
        eventually(LONG_WAIT, || {
            counter(
                &dp,
                "sluice_log_entries_sent_total",
                &["plugin=\"http-logger\"", "route=\"default/r/p\""],
            ) == 3.0
        })
        .await,
        "condition not met within 30 s"
    );
}

#[tokio::test]
async fn a_partial_batch_goes_after_the_inactive_timeout() {
    let logs = LogServer::start().await;
    let (dp, _echo) = serve(vec![plugin(
        "http-logger",
        json!({"uri": logs.uri("/"), "batch_max_size": 100, "inactive_timeout": 1}),
    )])
    .await;
    for _ in 0..2 {
        assert_eq!(get_with(dp.addr, "/a", &[]).await.status, StatusCode::OK);
    }
    let batches = logs.wait_for(1).await;
    assert_eq!(batches[0].json().as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn new_line_concatenation_and_single_entry_batches() {
    let logs = LogServer::start().await;
    let (dp, _echo) = serve(vec![plugin(
        "http-logger",
        json!({"uri": logs.uri("/nl"), "batch_max_size": 2, "concat_method": "new_line"}),
    )])
    .await;
    for p in ["/one", "/two"] {
        assert_eq!(get_with(dp.addr, p, &[]).await.status, StatusCode::OK);
    }
    let b = &logs.wait_for(1).await[0];
    assert_eq!(b.headers["content-type"], "text/plain");
    let lines: Vec<Value> = b
        .body
        .split('\n')
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{}", b.body);
    assert_eq!(lines[0]["request"]["uri"], "/one");
    assert_eq!(lines[1]["request"]["uri"], "/two");

    // batch_max_size 1 with json: the entry's object itself, not an array.
    let logs = LogServer::start().await;
    let (dp, _echo) = serve(vec![plugin(
        "http-logger",
        json!({"uri": logs.uri("/single"), "batch_max_size": 1}),
    )])
    .await;
    get_with(dp.addr, "/solo", &[]).await;
    let b = &logs.wait_for(1).await[0];
    assert_eq!(b.json()["request"]["uri"], "/solo");
}

#[tokio::test]
async fn a_failed_batch_is_retried_then_dropped_and_counted() {
    let logs = LogServer::start().await;
    logs.behaviour.fail_next.store(2, Ordering::SeqCst);
    let (dp, _echo) = serve(vec![plugin(
        "http-logger",
        json!({"uri": logs.uri("/"), "batch_max_size": 1, "max_retry_count": 2,
               "retry_delay": 0}),
    )])
    .await;
    get_with(dp.addr, "/retried", &[]).await;
    let batches = logs.wait_for(3).await;
    // The same entry three times: two 500s, then delivered.
    assert!(batches.iter().all(|b| b.body == batches[0].body));
    let sent = ["plugin=\"http-logger\"", "route=\"default/r/p\""];
    assert!(
        eventually(LONG_WAIT, || counter(
            &dp,
            "sluice_log_entries_sent_total",
            &sent
        ) == 1.0)
        .await,
        "condition not met within 30 s"
    );
    assert_eq!(
        counter(
            &dp,
            "sluice_log_entries_dropped_total",
            &["reason=\"send_failed\""]
        ),
        0.0
    );

    // A server that always fails: one retry, then the entry is dropped and counted.
    let logs = LogServer::start().await;
    logs.behaviour.always_fail.store(true, Ordering::SeqCst);
    let (dp, _echo) = serve(vec![plugin(
        "http-logger",
        json!({"uri": logs.uri("/"), "batch_max_size": 1, "max_retry_count": 1,
               "retry_delay": 0}),
    )])
    .await;
    let r = get_with(dp.addr, "/lost", &[]).await;
    assert_eq!(r.status, StatusCode::OK, "the client never notices");
    let failed = [
        "plugin=\"http-logger\"",
        "route=\"default/r/p\"",
        "reason=\"send_failed\"",
    ];
    assert!(
        eventually(LONG_WAIT, || counter(
            &dp,
            "sluice_log_entries_dropped_total",
            &failed
        ) == 1.0)
        .await,
        "condition not met within 30 s"
    );
    assert_eq!(logs.batches().len(), 2, "the first attempt and one retry");
}

/// Sends `n` GETs on one kept-alive connection; returns how many were answered 200.
async fn burst(addr: SocketAddr, n: usize) -> usize {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut ok = 0;
    for _ in 0..n {
        tx.ready().await.unwrap();
        let req = Request::get("/burst")
            .header("host", "example.com")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = tx.send_request(req).await.unwrap();
        let status = resp.status();
        resp.into_body().collect().await.unwrap();
        ok += usize::from(status == StatusCode::OK);
    }
    ok
}

#[tokio::test]
async fn a_stalled_log_server_never_holds_requests_and_overflow_is_counted() {
    let logs = LogServer::start().await;
    logs.behaviour.stall.store(true, Ordering::SeqCst);
    let (dp, _echo) = serve(vec![plugin(
        "http-logger",
        json!({"uri": logs.uri("/"), "batch_max_size": 1, "timeout": 3600}),
    )])
    .await;
    // The first entry is being sent (and never answered); the queue holds 8192 more.
    let n = sluice_dataplane::plugins::support::batch::MAX_PENDING_ENTRIES + 100;
    let ok = burst(dp.addr, n).await;
    assert_eq!(ok, n, "every request answered while the log server stalls");
    assert!(
        eventually(LONG_WAIT, || logs.batches().len() == 1).await,
        "condition not met within 30 s"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        logs.batches().len(),
        1,
        "the log server is still stuck on the first"
    );
    let full = [
        "plugin=\"http-logger\"",
        "route=\"default/r/p\"",
        "reason=\"queue_full\"",
    ];
    let dropped = counter(&dp, "sluice_log_entries_dropped_total", &full);
    assert!(
        (99.0..=100.0).contains(&dropped),
        "what did not fit was dropped and counted: {dropped}"
    );
    assert_eq!(
        counter(
            &dp,
            "sluice_log_entries_sent_total",
            &["route=\"default/r/p\""]
        ),
        0.0
    );
}

#[tokio::test]
async fn removing_the_logger_sends_what_it_held_and_a_custom_format_is_used() {
    let logs = LogServer::start().await;
    let conf = json!({
        "uri": logs.uri("/"), "batch_max_size": 100, "inactive_timeout": 3600,
        "buffer_duration": 3600,
        "log_format": {"host": "$host", "client": "$remote_addr", "st": "$status",
                       "ua": "$http_user_agent", "lit": 7,
                       "up": {"addr": "$upstream_addr", "ct": "$sent_http_content_type"}},
    });
    let (dp, echo) = serve(vec![plugin("http-logger", conf.clone())]).await;
    get_with(dp.addr, "/x", &[("user-agent", "ua/1")]).await;
    get_with(dp.addr, "/y", &[]).await;
    // Same config in a new snapshot: the same queue (nothing is sent yet).
    let again = snapshot(
        2,
        vec![route_with(
            "default/r/p",
            &["/*"],
            "u",
            vec![plugin("http-logger", conf)],
        )],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    dp.store.apply(again, vec![]).unwrap();
    get_with(dp.addr, "/z", &[]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(logs.batches().is_empty(), "a kept queue is not flushed");
    // The logger goes away: its task sends the partial batch and ends.
    let without = snapshot(
        3,
        vec![route("default/r/p", &["/*"], "u")],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    dp.store.apply(without, vec![]).unwrap();
    let b = logs.wait_for(1).await;
    let entries = b[0].json();
    let entries = entries.as_array().unwrap();
    assert_eq!(entries.len(), 3, "{entries:?}");
    assert_eq!(
        entries[0],
        json!({"host": "example.com", "client": "127.0.0.1", "st": 200, "ua": "ua/1",
               "lit": 7, "up": {"addr": echo.addr.to_string(), "ct": "application/json"},
               "route_id": "default/r/p", "service_id": ""})
    );
    assert_eq!(entries[1]["ua"], Value::Null);
}

#[tokio::test]
async fn file_logger_appends_json_lines_and_reopens_a_rotated_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let (dp, _echo) = serve(vec![plugin(
        "file-logger",
        json!({"path": path.to_str().unwrap(), "include_resp_body": true,
               "max_resp_body_bytes": 9}),
    )])
    .await;
    let read = |p: &std::path::Path| -> Vec<Value> {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    get_with(dp.addr, "/f1", &[]).await;
    get_with(dp.addr, "/f2", &[]).await;
    assert!(
        eventually(LONG_WAIT, || read(&path).len() == 2).await,
        "condition not met within 30 s"
    );
    let lines = read(&path);
    assert_eq!(lines[0]["request"]["uri"], "/f1");
    assert_eq!(lines[1]["request"]["uri"], "/f2");
    assert_eq!(lines[0]["response"]["body"], "{\"body\":\"");
    assert_eq!(lines[0]["route_id"], "default/r/p");

    // Rotation: the file is moved away; the next entry goes to a new file at the path.
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&path, &rotated).unwrap();
    get_with(dp.addr, "/f3", &[]).await;
    assert!(
        eventually(LONG_WAIT, || read(&path).len() == 1).await,
        "condition not met within 30 s"
    );
    assert_eq!(read(&path)[0]["request"]["uri"], "/f3");
    assert_eq!(read(&rotated).len(), 2);
    // NB: counted after the write the test already sees.
    assert!(
        eventually(LONG_WAIT, || {
            counter(
                &dp,
                "sluice_log_entries_sent_total",
                &["plugin=\"file-logger\""],
            ) == 3.0
        })
        .await,
        "condition not met within 30 s"
    );
}

/// file-logger writes only into the dataplane's `--file-logger-dir` directories (and
/// /dev/stdout, /dev/stderr): a route cannot overwrite the state directory's snapshot, or
/// any other file, by naming it; the refusal names the plugin and field, and the last good
/// snapshot keeps serving.
#[tokio::test]
async fn file_logger_writes_only_into_its_directories() {
    let logs = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let snapshot_pb = state.path().join("snapshot.pb");
    std::fs::write(&snapshot_pb, b"last good").unwrap();
    let inside = logs.path().join("access.log");
    let (dp, echo) = serve(vec![plugin(
        "file-logger",
        json!({"path": inside.to_str().unwrap()}),
    )])
    .await;
    dp.store
        .plugin_state()
        .set_file_log_dirs(Some(vec![logs.path().to_path_buf()]));
    let with_path = |path: &str| {
        snapshot(
            2,
            vec![route_with(
                "default/r/p",
                &["/*"],
                "u",
                vec![plugin("file-logger", json!({ "path": path }))],
            )],
            vec![upstream("u", &[(echo.addr, 1)])],
        )
    };
    let sibling = format!("{}-other/access.log", logs.path().display());
    for outside in [
        snapshot_pb.to_str().unwrap(),
        "/etc/passwd",
        "/var/lib/sluice/snapshot.pb",
        sibling.as_str(),
    ] {
        let e = dp
            .store
            .apply(with_path(outside), vec![])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("file-logger") && e.contains("path") && e.contains(outside),
            "{outside}: {e}"
        );
        assert!(e.contains("--file-logger-dir"), "{e}");
    }
    assert_eq!(std::fs::read(&snapshot_pb).unwrap(), b"last good");
    // The last good snapshot still serves and logs.
    assert_eq!(get_with(dp.addr, "/kept", &[]).await.status, StatusCode::OK);
    assert!(
        eventually(LONG_WAIT, || std::fs::read_to_string(&inside)
            .is_ok_and(|t| t.contains("/kept")))
        .await,
        "condition not met within 30 s"
    );
    for ok in [
        "/dev/stdout",
        "/dev/stderr",
        logs.path().join("sub/x.log").to_str().unwrap(),
    ] {
        dp.store.apply(with_path(ok), vec![]).unwrap();
    }
}

#[tokio::test]
async fn https_log_servers_with_and_without_verification() {
    let logs = LogServer::start_with(Some(self_signed())).await;
    let uri = format!("https://{}/tls", logs.addr);
    // ssl_verify false (APISIX's default): a self-signed server is accepted.
    let (dp, _echo) = serve(vec![plugin(
        "http-logger",
        json!({"uri": uri, "batch_max_size": 1}),
    )])
    .await;
    get_with(dp.addr, "/over-tls", &[]).await;
    let b = &logs.wait_for(1).await[0];
    assert_eq!(b.target, "/tls");
    assert_eq!(b.json()["request"]["uri"], "/over-tls");

    // ssl_verify true: the unknown certificate fails every attempt; nothing arrives.
    let (dp, _echo) = serve(vec![plugin(
        "http-logger",
        json!({"uri": uri, "batch_max_size": 1, "ssl_verify": true}),
    )])
    .await;
    get_with(dp.addr, "/refused", &[]).await;
    let failed = ["plugin=\"http-logger\"", "reason=\"send_failed\""];
    assert!(
        eventually(LONG_WAIT, || counter(
            &dp,
            "sluice_log_entries_dropped_total",
            &failed
        ) == 1.0)
        .await,
        "condition not met within 30 s"
    );
    assert_eq!(logs.batches().len(), 1, "no request reached the server");
}

#[tokio::test]
async fn the_consumer_and_requests_a_plugin_answered_are_logged() {
    let logs = LogServer::start().await;
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let mut snap = snapshot(
        1,
        vec![route_with(
            "default/r/k",
            &["/*"],
            "u",
            vec![
                plugin("key-auth", json!({})),
                plugin(
                    "http-logger",
                    json!({"uri": logs.uri("/"), "batch_max_size": 2}),
                ),
            ],
        )],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    // bob carries his own http-logger: it replaces the route's for his requests.
    let bobs = LogServer::start().await;
    snap.consumers = vec![
        sluice_proto::v1::Consumer {
            name: "alice".into(),
            plugins: vec![plugin("key-auth", json!({"key": "k1"}))],
        },
        sluice_proto::v1::Consumer {
            name: "bob".into(),
            plugins: vec![
                plugin("key-auth", json!({"key": "k2"})),
                plugin(
                    "http-logger",
                    json!({"uri": bobs.uri("/bob"), "batch_max_size": 1}),
                ),
            ],
        },
    ];
    dp.store.apply(snap, vec![]).unwrap();
    let ok = get_with(dp.addr, "/in", &[("apikey", "k1")]).await;
    assert_eq!(ok.status, StatusCode::OK);
    let denied = get_with(dp.addr, "/out?x=1", &[]).await;
    assert_eq!(denied.status, StatusCode::UNAUTHORIZED);
    let entries = logs.wait_for(1).await[0].json();
    let entries = entries.as_array().unwrap();
    assert_eq!(entries[0]["consumer"], json!({"username": "alice"}));
    assert_eq!(
        entries[0]["request"]["headers"]["apikey"], "k1",
        "as APISIX: headers as is"
    );
    // key-auth answered before the logger's turn: the entry still has the request.
    assert!(entries[1].get("consumer").is_none());
    assert_eq!(entries[1]["request"]["uri"], "/out?x=1");
    assert_eq!(entries[1]["response"]["status"], 401);
    assert!(entries[1].get("upstream").is_none());
    assert!(entries[1].get("upstream_latency").is_none());

    let r = get_with(dp.addr, "/bob?q=1", &[("apikey", "k2")]).await;
    assert_eq!(r.status, StatusCode::OK);
    let e = bobs.wait_for(1).await[0].json();
    assert_eq!(e["consumer"], json!({"username": "bob"}));
    assert_eq!(
        e["request"]["uri"], "/bob?q=1",
        "the head is kept for a consumer's logger"
    );
    assert_eq!(e["route_id"], "default/r/k");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(logs.batches().len(), 1, "not in the route's logger");
}

/// Sends `body` chunked (no `Content-Length`) on a new connection; returns the response's
/// status line.
async fn post_chunked(addr: SocketAddr, path: &str, body: &[u8]) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nhost: example.com\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    )
    .into_bytes();
    for chunk in body.chunks(5) {
        req.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        req.extend_from_slice(chunk);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    s.write_all(&req).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out)
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test]
async fn include_req_body_logs_the_first_bytes_and_the_upstream_and_a_mirror_get_all() {
    let logs = LogServer::start().await;
    let mirror = LogServer::start().await;
    let (dp, _echo) = serve(vec![
        plugin(
            "http-logger",
            json!({"uri": logs.uri("/"), "batch_max_size": 1,
                   "include_req_body": true, "max_req_body_bytes": 8}),
        ),
        plugin(
            "proxy-mirror",
            json!({"host": format!("http://{}", mirror.addr)}),
        ),
    ])
    .await;
    // A sized body longer than the cap: cut in the log, whole upstream and at the mirror.
    let body = "hello world, whole upstream";
    let req = Request::post("/upload")
        .header("host", "example.com")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let r = send(dp.addr, req).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["body"], body, "the upstream got every byte");
    let e = logs.wait_for(1).await[0].json();
    assert_eq!(
        e["request"]["body"], "hello wo",
        "cut at max_req_body_bytes"
    );
    let m = mirror.wait_for(1).await;
    assert_eq!(
        m[0].body, body,
        "the mirror's copy is whole, beside the log's"
    );

    // Chunked, shorter than the cap: the whole body is logged.
    assert!(
        post_chunked(dp.addr, "/small", b"tiny")
            .await
            .contains("200")
    );
    let e = logs.wait_for(2).await[1].json();
    assert_eq!(e["request"]["uri"], "/small");
    assert_eq!(e["request"]["body"], "tiny");

    // Chunked and longer than the cap: cut, and the upstream still gets it all.
    assert!(
        post_chunked(dp.addr, "/big", b"0123456789abcdef0123")
            .await
            .contains("200")
    );
    let e = logs.wait_for(3).await[2].json();
    assert_eq!(e["request"]["body"], "01234567");

    // Without a body there is no `request.body`, as in APISIX.
    let r = get(dp.addr, "example.com", "/nobody").await;
    assert_eq!(r.status, StatusCode::OK);
    let e = logs.wait_for(4).await[3].json();
    assert_eq!(e["request"]["uri"], "/nobody");
    assert!(e["request"].get("body").is_none(), "{e}");
}

#[tokio::test]
async fn without_include_req_body_no_body_is_logged() {
    let logs = LogServer::start().await;
    let (dp, _echo) = serve(vec![plugin(
        "http-logger",
        json!({"uri": logs.uri("/"), "batch_max_size": 1}),
    )])
    .await;
    let req = Request::post("/upload")
        .header("host", "example.com")
        .body(Full::new(Bytes::from_static(b"secret form")))
        .unwrap();
    assert_eq!(send(dp.addr, req).await.status, StatusCode::OK);
    let e = logs.wait_for(1).await[0].json();
    assert!(e["request"].get("body").is_none(), "{e}");
}
