//! Graceful drain of the real `sluice-dataplane` process: SIGTERM under load.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod upstream_support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::get;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use upstream_support::*;

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

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
    for _ in 0..5 {
        let (http, admin) = (free_port(), free_port());
        let https = free_port().to_string();
        let args: Vec<&str> = extra
            .iter()
            .map(|a| if *a == "HTTPS" { https.as_str() } else { *a })
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
                return (child, http, admin);
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
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if tokio::net::TcpStream::connect(http).await.is_ok()
            && get(http, "app", "/warm").await.status == StatusCode::OK
        {
            break;
        }
        assert!(Instant::now() < deadline, "dataplane did not serve");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

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
    let deadline = Instant::now() + Duration::from_secs(5);
    while origin.state.requests.load(Ordering::SeqCst) < before + 40 {
        assert!(
            Instant::now() < deadline,
            "requests did not reach the origin"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let pid = i32::try_from(child.id()).unwrap();
    assert_eq!(send_sigterm(pid), 0);
    let term_at = Instant::now();

    // Draining: /readyz turns 503 and new connections are refused.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let refused = tokio::net::TcpStream::connect(http).await.is_err();
        if refused {
            break;
        }
        assert!(Instant::now() < deadline, "new connections still accepted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "dataplane did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
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
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.state.probes.load(Ordering::SeqCst) == 0 || b.state.probes.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no probes arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = get(http, "client.example.com", "/other").await;
        if r.headers["x-seen-host"] == "other.example.com" {
            break;
        }
        assert!(Instant::now() < deadline, "reload not applied");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok((mut ws, _)) =
            tokio_tungstenite::connect_async(format!("ws://{http}/ws/warm")).await
        {
            let _ = ws.close(None).await;
            break;
        }
        assert!(Instant::now() < deadline, "dataplane did not serve");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let deadline = Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(http).await.is_ok() {
        assert!(Instant::now() < deadline, "new connections still accepted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_exit(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "dataplane did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
