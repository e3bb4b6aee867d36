//! Graceful drain of the real `sluice-dataplane` process: SIGTERM under load.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

/// Where a test's dataplane writes its log (stderr), to be shown when the test fails.
fn log_file(dir: &std::path::Path) -> Stdio {
    std::fs::File::create(dir.join("dataplane.log"))
        .unwrap()
        .into()
}

/// The last lines of the log written by [`log_file`].
fn log_tail(dir: &std::path::Path) -> String {
    let log = std::fs::read_to_string(dir.join("dataplane.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    let tail = lines[lines.len().saturating_sub(40)..].join("\n");
    format!("dataplane log (last 40 lines):\n{tail}")
}

/// `sluice-dataplane --standalone <dir>/config.yaml` listening on `http` (admin on `admin`)
/// with `extra` flags; its log goes to [`log_file`] at debug level.
fn spawn_standalone(
    dir: &std::path::Path,
    http: SocketAddr,
    admin: SocketAddr,
    extra: &[&str],
) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_sluice-dataplane"))
        .arg("--standalone")
        .arg(dir.join("config.yaml"))
        .args(["--listen-http", &http.to_string()])
        .args(["--admin", &admin.to_string()])
        .args(extra)
        .stdout(Stdio::null())
        .env("RUST_LOG", "info,sluice_dataplane=debug")
        .stderr(log_file(dir))
        .spawn()
        .unwrap()
}

/// [`spawn_standalone`] on free ports (`https` too when `extra` names `--listen-https`,
/// as the placeholder `HTTPS`), once both its HTTP and admin ports accept connections.
///
/// NB: a port found free may be taken by a test running in parallel before the dataplane
/// binds it; the dataplane then exits, and this starts it again on other ports (at most
/// five times) instead of failing the test on a collision.
async fn start_standalone(
    dir: &std::path::Path,
    extra: &[&str],
) -> (std::process::Child, SocketAddr, SocketAddr) {
    let (child, http, admin, _status) = start_standalone_with_status(dir, extra).await;
    (child, http, admin)
}

/// [`start_standalone`], where `extra` may also name the placeholder `STATUS` (for
/// `--status`); returns that address last.
async fn start_standalone_with_status(
    dir: &std::path::Path,
    extra: &[&str],
) -> (std::process::Child, SocketAddr, SocketAddr, SocketAddr) {
    for _ in 0..5 {
        let (http, admin, status) = (free_port(), free_port(), free_port());
        let https = free_port().to_string();
        let status_arg = status.to_string();
        let args: Vec<&str> = extra
            .iter()
            .map(|a| match *a {
                "HTTPS" => https.as_str(),
                "STATUS" => status_arg.as_str(),
                a => a,
            })
            .collect();
        let mut child = spawn_standalone(dir, http, admin, &args);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                eprintln!("dataplane exited at start ({status}), again on other ports");
                eprintln!("{}", log_tail(dir));
                break;
            }
            if tokio::net::TcpStream::connect(http).await.is_ok()
                && tokio::net::TcpStream::connect(admin).await.is_ok()
            {
                return (child, http, admin, status);
            }
            assert!(
                Instant::now() < deadline,
                "dataplane did not start\n{}",
                log_tail(dir)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    panic!("dataplane did not start in five attempts");
}

fn config(port: u16) -> String {
    format!(
        r#"apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: app, namespace: default}}
spec:
  http:
    - name: r1
      match: {{paths: ["/*"]}}
      upstreams: [{{name: ext}}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixUpstream
metadata: {{name: ext, namespace: default}}
spec:
  externalNodes: [{{name: 127.0.0.1, type: Domain, port: {port}}}]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_finishes_every_in_flight_request_and_refuses_new_ones() {
    let origin = Origin::start("slow");
    origin.state.delay_ms.store(800, Ordering::SeqCst);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, config(origin.addr.port())).unwrap();
    let (mut child, http, admin) =
        start_standalone(dir.path(), &["--workers", "2", "--drain-timeout", "10s"]).await;
    assert!(
        eventually_async(
            Wait::up_to(Duration::from_secs(10)).every(Duration::from_millis(50)),
            || async move {
                tokio::net::TcpStream::connect(http).await.is_ok()
                    && get(http, "app", "/warm").await.status == StatusCode::OK
            }
        )
        .await,
        "dataplane did not serve"
    );

    // An idle keep-alive connection: drained connections close.
    let stream = tokio::net::TcpStream::connect(http).await.unwrap();
    let (mut idle_sender, idle_conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let idle_conn = tokio::spawn(idle_conn);
    let r = idle_sender
        .send_request(
            Request::get("/idle")
                .header("host", "app")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.into_body().collect().await.unwrap();

    // 40 slow requests in flight, each on its own connection.
    let before = origin.state.requests.load(Ordering::SeqCst);
    let in_flight: Vec<_> = (0..40)
        .map(|i| {
            tokio::spawn(async move {
                let stream = tokio::net::TcpStream::connect(http).await?;
                let (mut s, c) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(std::io::Error::other)?;
                tokio::spawn(c);
                let resp = s
                    .send_request(
                        Request::get(format!("/slow/{i}"))
                            .header("host", "app")
                            .body(Full::new(Bytes::new()))
                            .unwrap(),
                    )
                    .await
                    .map_err(std::io::Error::other)?;
                let status = resp.status();
                let body = resp
                    .into_body()
                    .collect()
                    .await
                    .map_err(std::io::Error::other)?
                    .to_bytes();
                Ok::<_, std::io::Error>((status, body))
            })
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(5), || {
            origin.state.requests.load(Ordering::SeqCst) >= before + 40
        })
        .await,
        "requests did not reach the origin"
    );

    let pid = i32::try_from(child.id()).unwrap();
    assert_eq!(send_sigterm(pid), 0);
    let term_at = Instant::now();

    // Draining: /readyz turns 503 and new connections are refused.
    assert!(
        refused(http, Duration::from_secs(2)).await,
        "new connections still accepted"
    );
    let ready = get(admin, "admin", "/readyz").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ready.text(), "draining\n");

    let mut ok = 0;
    for t in in_flight {
        let (status, body) = t
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{e}\n{}", log_tail(dir.path())));
        assert_eq!(status, StatusCode::OK, "{}", log_tail(dir.path()));
        assert_eq!(&body[..], b"slow");
        ok += 1;
    }
    assert_eq!(ok, 40);
    // The idle keep-alive connection was closed by the dataplane.
    tokio::time::timeout(Duration::from_secs(2), idle_conn)
        .await
        .expect("idle connection not closed")
        .unwrap()
        .unwrap();

    // The process exits 0 once the in-flight requests are done.
    let status = wait_exit(&mut child, Duration::from_secs(10)).await;
    println!(
        "SIGTERM with 40 requests in flight: 40/40 answered 200, exit {status} after {:?}",
        term_at.elapsed()
    );
    assert!(status.success(), "{status}");
}

/// Sends SIGTERM with the `kill` command (no unsafe code in tests).
fn send_sigterm(pid: i32) -> i32 {
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .map(|s| s.code().unwrap_or(1))
        .unwrap_or(1)
}

fn two_port_config(a: u16, b: u16, interval: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  ports: [{{name: http, port: 80}}, {{name: alt, port: 81}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
endpoints:
  - addresses: ["127.0.0.1"]
ports: [{{name: http, port: {a}}}, {{name: alt, port: {b}}}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: web, namespace: default}}
spec:
  http:
    - name: main
      match: {{paths: ["/main*"]}}
      backends: [{{serviceName: web, servicePort: 80}}]
    - name: alt
      match: {{paths: ["/alt*"]}}
      backends: [{{serviceName: web, servicePort: 81}}]
    - name: other
      match: {{paths: ["/other*"]}}
      backends: [{{serviceName: other, servicePort: 80}}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixUpstream
metadata: {{name: web, namespace: default}}
spec:
  passHost: rewrite
  upstreamHost: internal.example.com
  healthCheck:
    active:
      httpPath: /healthz
      healthy: {{interval: 1s, successes: 1}}
      unhealthy: {{interval: 1s, httpFailures: 1}}
  portLevelSettings:
    - port: 81
      passHost: node
---
apiVersion: v1
kind: Service
metadata: {{name: other, namespace: default}}
spec:
  ports: [{{port: 80}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: other-1
  namespace: default
  labels: {{kubernetes.io/service-name: other}}
addressType: IPv4
endpoints:
  - addresses: ["127.0.0.1"]
ports: [{{port: {a}}}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixUpstream
metadata: {{name: other, namespace: default}}
spec:
  passHost: rewrite
  upstreamHost: other.example.com
  healthCheck:
    active:
      healthy: {{interval: {interval}}}
"#
    )
}

async fn get_json_admin(admin: SocketAddr, path: &str) -> serde_json::Value {
    get(admin, "admin", path).await.json()
}

#[tokio::test]
async fn apisix_upstream_fields_take_effect_through_the_real_process() {
    let a = Origin::start("a");
    let b = Origin::start("b");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    // `other` has an invalid health check (interval under 1s): it is rejected, its Service
    // gets default settings, and the rest keeps working.
    std::fs::write(
        &file,
        two_port_config(a.addr.port(), b.addr.port(), "500ms"),
    )
    .unwrap();
    let (mut child, http, admin) = start_standalone(dir.path(), &["--workers", "1"]).await;

    // passHost rewrite on port 80, node on port 81 (portLevelSettings).
    let r = get(http, "client.example.com", "/main").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["x-origin"], "a");
    assert_eq!(r.headers["x-seen-host"], "internal.example.com");
    let r = get(http, "client.example.com", "/alt").await;
    assert_eq!(r.headers["x-origin"], "b");
    assert_eq!(
        r.headers["x-seen-host"].to_str().unwrap(),
        b.addr.to_string()
    );
    // The invalid ApisixUpstream is reported with its field; its Service is served with
    // defaults (the client's Host passes).
    let snap = get_json_admin(admin, "/snapshot").await;
    let rejected = snap["rejected_objects"].to_string();
    assert!(
        rejected.contains("healthCheck.active.healthy.interval")
            && rejected.contains("under the 1s minimum"),
        "{snap:#}"
    );
    let r = get(http, "client.example.com", "/other").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["x-seen-host"], "client.example.com");

    // The active check probes /healthz on both ports' endpoints.
    assert!(
        eventually(Duration::from_secs(5), || {
            a.state.probes.load(Ordering::SeqCst) > 0 && b.state.probes.load(Ordering::SeqCst) > 0
        })
        .await,
        "no probes arrived"
    );
    let metrics = get(admin, "admin", "/metrics").await.text();
    assert!(
        metrics.contains(&format!(
            "sluice_upstream_endpoint_healthy{{endpoint=\"{}\",upstream=\"default/web:80\"}} 1",
            a.addr
        )),
        "{metrics}"
    );

    // Fixing the ApisixUpstream applies its settings on reload.
    std::fs::write(&file, two_port_config(a.addr.port(), b.addr.port(), "2s")).unwrap();
    assert!(
        eventually_async(
            Wait::up_to(Duration::from_secs(10)).every(Duration::from_millis(100)),
            || async move {
                let r = get(http, "client.example.com", "/other").await;
                r.headers["x-seen-host"] == "other.example.com"
            }
        )
        .await,
        "reload not applied"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// A WebSocket echo server (`echo: <text>`) on a thread and runtime of its own.
fn ws_echo_server() -> SocketAddr {
    use futures::{SinkExt, StreamExt};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                        return;
                    };
                    while let Some(Ok(msg)) = ws.next().await {
                        match msg {
                            tokio_tungstenite::tungstenite::Message::Text(t) => {
                                let reply = format!("echo: {}", t.as_str());
                                if ws.send(reply.into()).await.is_err() {
                                    break;
                                }
                            }
                            tokio_tungstenite::tungstenite::Message::Close(_) => break,
                            _ => {}
                        }
                    }
                });
            }
        });
    });
    addr
}

fn ws_config(port: u16) -> String {
    format!(
        r#"apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: app, namespace: default}}
spec:
  http:
    - name: ws
      match: {{paths: ["/ws*"]}}
      websocket: true
      upstreams: [{{name: ext}}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixUpstream
metadata: {{name: ext, namespace: default}}
spec:
  externalNodes: [{{name: 127.0.0.1, type: Domain, port: {port}}}]
"#
    )
}

/// A real dataplane process in standalone mode proxying `/ws*` to `backend` as WebSocket,
/// with `--drain-timeout drain`; returns it once it answers upgrades.
async fn ws_dataplane(
    dir: &tempfile::TempDir,
    backend: SocketAddr,
    drain: &str,
) -> (std::process::Child, SocketAddr) {
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, ws_config(backend.port())).unwrap();
    let (child, http, _admin) = start_standalone(
        dir.path(),
        &[
            "--listen-https",
            "HTTPS",
            "--workers",
            "2",
            "--drain-timeout",
            drain,
        ],
    )
    .await;
    let (mut ws, _) = eventually_async(
        Wait::up_to(Duration::from_secs(10)).every(Duration::from_millis(50)),
        || tokio_tungstenite::connect_async(format!("ws://{http}/ws/warm")),
    )
    .await
    .expect("dataplane did not serve");
    let _ = ws.close(None).await;
    (child, http)
}

/// Sends `text` and returns the next text message (within 5 s).
async fn ws_echo<S>(ws: &mut S, text: &str) -> Result<String, String>
where
    S: futures::Sink<tokio_tungstenite::tungstenite::Message>
        + futures::Stream<
            Item = Result<
                tokio_tungstenite::tungstenite::Message,
                tokio_tungstenite::tungstenite::Error,
            >,
        > + Unpin,
{
    use futures::{SinkExt, StreamExt};
    ws.send(text.into())
        .await
        .map_err(|_| "send failed".to_owned())?;
    match tokio::time::timeout(Duration::from_secs(5), ws.next()).await {
        Err(_) => Err("no answer".into()),
        Ok(None) => Err("session closed".into()),
        Ok(Some(Err(e))) => Err(e.to_string()),
        Ok(Some(Ok(m))) => Ok(m
            .into_text()
            .map_err(|e| e.to_string())?
            .as_str()
            .to_owned()),
    }
}

/// Waits for the listener to close (drain started) after SIGTERM.
async fn wait_refused(http: SocketAddr) {
    assert!(
        refused(http, Duration::from_secs(5)).await,
        "new connections still accepted"
    );
}

async fn wait_exit(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    eventually(limit, || child.try_wait().unwrap())
        .await
        .expect("dataplane did not exit")
}

/// A dataplane process with `--drain-timeout drain`, a WebSocket session through it that
/// echoes once, then SIGTERM, returned once the listener refuses new connections.
async fn session_then_sigterm(
    dir: &tempfile::TempDir,
    drain: &str,
) -> (
    std::process::Child,
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
) {
    let backend = ws_echo_server();
    let (child, http) = ws_dataplane(dir, backend, drain).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{http}/ws/chat"))
        .await
        .unwrap();
    assert_eq!(ws_echo(&mut ws, "before").await.unwrap(), "echo: before");
    assert_eq!(send_sigterm(i32::try_from(child.id()).unwrap()), 0);
    wait_refused(http).await;
    (child, ws)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_an_open_websocket_session_until_the_client_closes_it() {
    use futures::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let (mut child, mut ws) = session_then_sigterm(&dir, "30s").await;
    // Draining: the session opened before SIGTERM keeps working, and holds the process.
    for i in 0..3 {
        let text = format!("after {i}");
        assert_eq!(
            ws_echo(&mut ws, &text).await,
            Ok(format!("echo: {text}")),
            "the session still echoes after SIGTERM\n{}",
            log_tail(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the process waits for the open session"
    );
    // The client closes the session (close handshake, then its socket): the process exits 0.
    ws.close(None).await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
    drop(ws);
    let status = wait_exit(&mut child, Duration::from_secs(10)).await;
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_session_left_open_is_closed_at_the_drain_timeout() {
    use futures::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let (mut child, mut ws) = session_then_sigterm(&dir, "2s").await;
    assert_eq!(ws_echo(&mut ws, "after").await.unwrap(), "echo: after");
    // Nobody closes the session: the drain timeout does, and the process exits 0.
    let status = wait_exit(&mut child, Duration::from_secs(15)).await;
    assert!(status.success(), "{status}");
    let end = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("the session ends with the process");
    assert!(
        !matches!(
            end,
            Some(Ok(tokio_tungstenite::tungstenite::Message::Text(_)))
        ),
        "{end:?}"
    );
}

/// The log written by [`log_file`], without its colours.
fn plain_log(dir: &std::path::Path) -> String {
    let log = std::fs::read_to_string(dir.join("dataplane.log")).unwrap_or_default();
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // `ESC [ ... m`
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Sends one HTTP/1.1 request for `path` (Host `app`) on a new connection and reads until
/// the dataplane closes it: returns the response head, lower-cased, and the body.
async fn request_until_closed(http: SocketAddr, path: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(http)
        .await
        .expect("a new connection during the shutdown delay is accepted");
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: app\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut raw))
        .await
        .expect("the dataplane closes the connection after its response")
        .unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    (head.to_ascii_lowercase(), body.to_owned())
}

async fn h1_get(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
) -> http::Response<Bytes> {
    let resp = sender
        .send_request(
            Request::get(path)
                .header("host", "app")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    http::Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

/// An h2c (prior knowledge) connection to `http`: its sender, and its task, which ends when
/// the connection closes.
async fn h2c_connect(
    http: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
) {
    let stream = tokio::net::TcpStream::connect(http).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .unwrap();
    (sender, tokio::spawn(conn))
}

async fn h2_get(
    sender: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    path: &str,
) -> StatusCode {
    let resp = sender
        .send_request(
            Request::get(format!("http://app{path}"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status();
    resp.into_body().collect().await.unwrap();
    status
}

/// Waits (up to 3 s) for a client connection's task to end: the dataplane closed it.
async fn closed_by_dataplane<T>(
    conn: tokio::task::JoinHandle<T>,
    what: &str,
    dir: &std::path::Path,
) {
    tokio::time::timeout(Duration::from_secs(3), conn)
        .await
        .unwrap_or_else(|_| panic!("{what}: not closed by the dataplane\n{}", log_tail(dir)))
        .unwrap();
}

/// Waits (up to 5 s) for `/readyz` on `admin` to answer 503 `draining`.
async fn wait_not_ready(admin: SocketAddr, dir: &std::path::Path) {
    let ready = eventually_async(
        Wait::up_to(Duration::from_secs(5)).every(Duration::from_millis(10)),
        || async move {
            let ready = get(admin, "admin", "/readyz").await;
            if ready.status == StatusCode::SERVICE_UNAVAILABLE {
                Ok(ready)
            } else {
                Err(ready.status)
            }
        },
    )
    .await
    .unwrap_or_else(|status| panic!("/readyz still {status} after SIGTERM\n{}", log_tail(dir)));
    assert_eq!(ready.text(), "draining\n");
}

/// A real dataplane on `origin` with `--shutdown-delay delay` and 2 workers, serving.
async fn delayed_dataplane(
    dir: &tempfile::TempDir,
    origin: &Origin,
    delay: &str,
) -> (std::process::Child, SocketAddr, SocketAddr) {
    std::fs::write(dir.path().join("config.yaml"), config(origin.addr.port())).unwrap();
    let (child, http, admin) = start_standalone(
        dir.path(),
        &[
            "--workers",
            "2",
            "--shutdown-delay",
            delay,
            "--drain-timeout",
            "5s",
        ],
    )
    .await;
    assert!(
        eventually_async(
            Wait::up_to(Duration::from_secs(10)).every(Duration::from_millis(50)),
            || async move { get(http, "app", "/warm").await.status == StatusCode::OK }
        )
        .await,
        "dataplane did not serve"
    );
    (child, http, admin)
}

/// `--shutdown-delay`: after SIGTERM the pod turns not-ready but keeps accepting and
/// proxying (kube-proxy still sends it connections), asking every client to go away after
/// its response; only then does the drain close the listeners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_shutdown_delay_keeps_serving_new_connections_until_the_delay_ends() {
    let origin = Origin::start("delayed");
    let dir = tempfile::tempdir().unwrap();
    let (mut child, http, admin) = delayed_dataplane(&dir, &origin, "5s").await;

    // A keep-alive HTTP/1.1 connection and an h2c connection, each used once before SIGTERM.
    let stream = tokio::net::TcpStream::connect(http).await.unwrap();
    let (mut h1, h1_conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let h1_conn = tokio::spawn(h1_conn);
    let r = h1_get(&mut h1, "/before").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get("connection").is_none(), "{r:?}");
    let (mut h2, h2_conn) = h2c_connect(http).await;
    assert_eq!(h2_get(&mut h2, "/before").await, StatusCode::OK);

    assert_eq!(send_sigterm(i32::try_from(child.id()).unwrap()), 0);
    let term_at = Instant::now();
    wait_not_ready(admin, dir.path()).await;

    // The delay: a new connection is accepted and proxied to the origin, and closed after
    // its response, which says so.
    let (head, body) = request_until_closed(http, "/during").await;
    assert!(
        head.starts_with("http/1.1 200"),
        "{head}\n{}",
        log_tail(dir.path())
    );
    assert!(head.contains("\r\nconnection: close"), "{head}");
    assert!(head.contains("\r\nx-origin: delayed"), "{head}");
    assert_eq!(body, "delayed");
    // The keep-alive connection opened before: served, with `Connection: close`, then closed.
    let r = h1_get(&mut h1, "/during").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["connection"], "close");
    assert_eq!(&r.body()[..], b"delayed");
    closed_by_dataplane(h1_conn, "the keep-alive connection", dir.path()).await;
    // HTTP/2: the connection that carried a request gets a GOAWAY and closes; a new one is
    // served, then gets its GOAWAY too.
    closed_by_dataplane(
        h2_conn,
        "the h2c connection opened before SIGTERM",
        dir.path(),
    )
    .await;
    let (mut h2, h2_conn) = h2c_connect(http).await;
    assert_eq!(h2_get(&mut h2, "/during").await, StatusCode::OK);
    closed_by_dataplane(
        h2_conn,
        "the h2c connection opened during the delay",
        dir.path(),
    )
    .await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the dataplane exited before the checks above were done ({:?} after SIGTERM): nothing proven",
        term_at.elapsed()
    );
    let log = plain_log(dir.path());
    assert!(
        log.lines()
            .any(|l| l.contains("INFO") && l.contains("shutting down") && l.contains("delay=5s")),
        "{}",
        log_tail(dir.path())
    );

    // After the delay: the listeners close, and the process exits 0.
    assert!(
        refused(http, Duration::from_secs(10)).await,
        "new connections still accepted"
    );
    assert!(
        term_at.elapsed() >= Duration::from_secs(5),
        "listeners closed {:?} after SIGTERM, before the 5 s delay",
        term_at.elapsed()
    );
    let status = wait_exit(&mut child, Duration::from_secs(10)).await;
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_ends_the_shutdown_delay() {
    let origin = Origin::start("delayed");
    let dir = tempfile::tempdir().unwrap();
    let (mut child, http, admin) = delayed_dataplane(&dir, &origin, "10m").await;
    let pid = i32::try_from(child.id()).unwrap();
    assert_eq!(send_sigterm(pid), 0);
    wait_not_ready(admin, dir.path()).await;
    assert_eq!(get(http, "app", "/during").await.status, StatusCode::OK);
    assert_eq!(send_sigterm(pid), 0);
    wait_refused(http).await;
    let status = wait_exit(&mut child, Duration::from_secs(10)).await;
    assert!(status.success(), "{status}");
    let log = plain_log(dir.path());
    assert!(log.contains("second signal"), "{}", log_tail(dir.path()));
}

/// The write-batching mode of a real process, on the status listener's /metrics and in one
/// log line: `auto` gives io_uring or, where the kernel or a seccomp profile refuses it,
/// `send`; `--write-batching send` forces the fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_batching_mode_is_logged_once_and_exported_as_a_metric() {
    for (flag, want) in [("auto", None), ("send", Some("send"))] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.yaml"), config(1)).unwrap();
        let (mut child, _http, _admin, status) = start_standalone_with_status(
            dir.path(),
            &[
                "--workers",
                "2",
                "--listen-https",
                "HTTPS",
                "--status",
                "STATUS",
                "--write-batching",
                flag,
            ],
        )
        .await;
        let metrics = get(status, "status", "/metrics").await.text();
        let modes: Vec<&str> = ["io_uring", "send"]
            .into_iter()
            .filter(|m| {
                metrics.contains(&format!(
                    "sluice_dataplane_write_batching{{mode=\"{m}\"}} 1\n"
                ))
            })
            .collect();
        assert_eq!(modes.len(), 1, "--write-batching {flag}: {metrics}");
        if let Some(want) = want {
            assert_eq!(modes, [want], "--write-batching {flag}: {metrics}");
        }
        assert!(
            metrics.contains("# TYPE sluice_dataplane_write_batching gauge"),
            "{metrics}"
        );
        // Four worker threads (2 × HTTP and HTTPS): one line.
        let log = plain_log(dir.path());
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("write batching:"))
            .collect();
        assert_eq!(lines.len(), 1, "--write-batching {flag}: {log}");
        assert!(
            lines[0].contains("INFO") && lines[0].contains(&format!("mode={}", modes[0])),
            "{}",
            lines[0]
        );
        if modes[0] == "send" {
            assert!(lines[0].contains("reason="), "{}", lines[0]);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Standalone mode serves ApisixRoute `spec.stream` on the ports `--stream-ports` declares:
/// TCP bytes and a UDP datagram reach the echo backends and come back. Without the flag the
/// rules are refused (their ports are not declared) and nothing listens there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_serves_stream_routes_on_the_declared_stream_ports() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Backends: a TCP echo and a UDP echo on loopback.
    let tcp_echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp_port = tcp_echo.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = tcp_echo.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let udp_echo = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let udp_port = udp_echo.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = udp_echo.recv_from(&mut buf).await {
            let _ = udp_echo.send_to(&buf[..n], from).await;
        }
    });
    let (tcp_in, udp_in) = (free_port().port(), free_port().port());
    let dir = tempfile::tempdir().unwrap();
    let service = |name: &str, proto: &str, port: u16| {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\n\
             spec: {{ports: [{{name: p, protocol: {proto}, port: {port}, targetPort: {port}}}]}}\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}\n\
             addressType: IPv4\nendpoints: [{{addresses: [127.0.0.1], conditions: {{ready: true}}}}]\n\
             ports: [{{name: p, protocol: {proto}, port: {port}}}]\n"
        )
    };
    std::fs::write(
        dir.path().join("config.yaml"),
        format!(
            "apiVersion: apisix.apache.org/v2\nkind: ApisixRoute\nmetadata: {{name: l4, namespace: default}}\n\
             spec:\n  stream:\n\
             \x20   - {{name: tcp, protocol: TCP, match: {{ingressPort: {tcp_in}}}, backend: {{serviceName: tcp-echo, servicePort: {tcp_port}}}}}\n\
             \x20   - {{name: udp, protocol: UDP, match: {{ingressPort: {udp_in}}}, backend: {{serviceName: udp-echo, servicePort: {udp_port}}}}}\n\
             {}{}",
            service("tcp-echo", "TCP", tcp_port),
            service("udp-echo", "UDP", udp_port),
        ),
    )
    .unwrap();

    // Without --stream-ports: nothing listens on the stream port.
    let (mut plain, _, _) = start_standalone(dir.path(), &[]).await;
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", tcp_in))
            .await
            .is_err()
    );
    plain.kill().unwrap();
    plain.wait().unwrap();

    let ports = format!("tcp:{tcp_in},udp:{udp_in}");
    let (mut child, _, _) = start_standalone(dir.path(), &["--stream-ports", &ports]).await;
    // TCP: the listener opens with the first snapshot.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut conn = loop {
        match tokio::net::TcpStream::connect(("127.0.0.1", tcp_in)).await {
            Ok(c) => break c,
            Err(e) => {
                assert!(Instant::now() < deadline, "{e}\n{}", log_tail(dir.path()));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    conn.write_all(b"PING\r\n").await.unwrap();
    let mut got = [0u8; 6];
    tokio::time::timeout(Duration::from_secs(5), conn.read_exact(&mut got))
        .await
        .expect("TCP echo through the stream route")
        .unwrap();
    assert_eq!(&got, b"PING\r\n");
    // UDP: one datagram there and back.
    let client = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    client.connect(("127.0.0.1", udp_in)).await.unwrap();
    let mut buf = [0u8; 64];
    let mut answered = None;
    for _ in 0..20 {
        client.send(b"query").await.unwrap();
        if let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(250), client.recv(&mut buf)).await
        {
            answered = Some(buf[..n].to_vec());
            break;
        }
    }
    assert_eq!(
        answered.as_deref(),
        Some(&b"query"[..]),
        "{}",
        log_tail(dir.path())
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
