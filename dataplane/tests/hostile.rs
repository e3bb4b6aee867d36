//! Hostile peers, as an attacker drives them with raw sockets: upstreams that send bytes no
//! request asked for, clients that send a byte and go silent or close. Each case here was a
//! finding of an external audit of the traffic path.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use http::StatusCode;
use sluice_dataplane::config::store::Store;
use sluice_dataplane::listener::server::Limits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A raw TCP upstream on a loopback port: `serve` runs on each connection it accepts.
async fn raw_upstream<F, Fut>(serve: F) -> SocketAddr
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            tokio::spawn(serve(s));
        }
    });
    addr
}

/// What a hostile upstream slips in after a complete response: a response of its own.
const POISON: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nSTOLEN";

/// An HTTP/1.1 upstream that keeps its connections alive and answers each request by its
/// path; some answers carry bytes after the response's end ([`POISON`]). Any other path
/// gets `fresh`.
async fn poisoning_upstream() -> SocketAddr {
    raw_upstream(move |mut s| async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
                continue;
            };
            let head = String::from_utf8_lossy(&got[..end]).into_owned();
            got.drain(..end + 4);
            let target = head.split(' ').nth(1).unwrap_or("/").to_owned();
            let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
            let answer: Vec<u8> = match target.as_str() {
                "/extra" => [&ok[..], POISON].concat(),
                "/head" => [&b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n"[..], POISON]
                    .concat(),
                "/204" => [&b"HTTP/1.1 204 No Content\r\n\r\n"[..], POISON].concat(),
                "/304" => [&b"HTTP/1.1 304 Not Modified\r\n\r\n"[..], POISON].concat(),
                "/chunked" => [
                    &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"[..],
                    POISON,
                ]
                .concat(),
                "/late" => ok.to_vec(),
                _ => b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh".to_vec(),
            };
            if s.write_all(&answer).await.is_err() {
                return;
            }
            if target == "/late" {
                // The extra response arrives while the connection sits in the pool.
                tokio::time::sleep(Duration::from_millis(30)).await;
                if s.write_all(POISON).await.is_err() {
                    return;
                }
            }
        }
    })
    .await
}

/// `method path` on a new connection; a POST carries a body.
async fn call(addr: SocketAddr, method: &str, path: &str) -> Resp {
    let body = if method == "POST" {
        &b"payload"[..]
    } else {
        b""
    };
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "h")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(body)))
        .unwrap();
    send(addr, req).await
}

#[tokio::test]
async fn bytes_after_a_complete_response_never_reach_the_next_client() {
    for (method, path, status) in [
        ("GET", "/extra", StatusCode::OK),
        ("HEAD", "/head", StatusCode::OK),
        ("GET", "/204", StatusCode::NO_CONTENT),
        ("GET", "/304", StatusCode::NOT_MODIFIED),
        ("GET", "/chunked", StatusCode::OK),
        ("GET", "/late", StatusCode::OK),
        // A request with a body takes the same pooled connection.
        ("POST", "/extra", StatusCode::OK),
    ] {
        let dp = dataplane_to("/*", poisoning_upstream().await).await;
        let first = call(dp.addr, method, path).await;
        assert_eq!(first.status, status, "{method} {path}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        for victim in ["GET", "POST"] {
            let next = call(dp.addr, victim, "/victim").await;
            assert_eq!(
                (next.status, next.text().as_str()),
                (StatusCode::OK, "fresh"),
                "{victim} after {method} {path} got another response's bytes"
            );
        }
    }
}

/// Whether the dataplane closes a connection that sent `bytes` (and, with `close`, shut its
/// side) within `within`.
async fn closed_within(addr: SocketAddr, bytes: &[u8], close: bool, within: Duration) -> bool {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    if close {
        s.shutdown().await.unwrap();
    }
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // An error response (e.g. 408 or 400) before the close is fine.
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test]
async fn the_header_timeout_closes_a_connection_whatever_its_first_bytes() {
    let limits = Limits {
        header_read_timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    let dp = dataplane_limited(Arc::new(Store::new().unwrap()), limits).await;
    // Prefixes of the HTTP/2 preface, of an HTTP/1.1 head, and nothing at all; silent or
    // closed after them.
    for bytes in [
        &b"P"[..],
        b"PR",
        b"PRI * HT",
        b"G",
        b"GET / HTTP/1.1\r\nHost: a",
        b"",
    ] {
        for close in [false, true] {
            assert!(
                closed_within(dp.addr, bytes, close, Duration::from_secs(5)).await,
                "a connection that sent {:?} (then {}) was still open 5 s later",
                String::from_utf8_lossy(bytes),
                if close { "closed" } else { "nothing" }
            );
        }
    }
}

/// Sends `raw` on a new connection and returns the response's status code and everything
/// that came back (the connection is closed by `Connection: close` or by the dataplane).
async fn raw(addr: SocketAddr, raw: &[u8]) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

/// A dataplane with a route for host `a.example` to echo backend `a` and one for
/// `b.example` to echo backend `b`, plus a host-less route `/any*` to `a`.
async fn two_hosts() -> (
    Dataplane,
    sluice_testkit::EchoServer,
    sluice_testkit::EchoServer,
) {
    let a = sluice_testkit::EchoServer::start("a", any()).await.unwrap();
    let b = sluice_testkit::EchoServer::start("b", any()).await.unwrap();
    let dp = dataplane().await;
    let mut ra = route("default/a/r", &["/*"], "ua");
    ra.hosts = vec!["a.example".into()];
    let mut rb = route("default/b/r", &["/*"], "ub");
    rb.hosts = vec!["b.example".into()];
    let any_host = route("default/any/r", &["/any*"], "ua");
    let snap = snapshot(
        1,
        vec![ra, rb, any_host],
        vec![
            upstream("ua", &[(a.addr, 1)]),
            upstream("ub", &[(b.addr, 1)]),
        ],
    );
    dp.store.apply(snap, vec![]).unwrap();
    (dp, a, b)
}

#[tokio::test]
async fn host_headers_are_checked_as_rfc_9112_asks() {
    let (dp, _a, _b) = two_hosts().await;
    // Two Host headers: the proxy and the upstream could each route by a different one.
    let (code, text) = raw(
        dp.addr,
        b"GET /x HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(code, 400, "{text}");
    // HTTP/1.1 requires Host; HTTP/1.0 may omit it.
    let (code, text) = raw(dp.addr, b"GET /any HTTP/1.1\r\nConnection: close\r\n\r\n").await;
    assert_eq!(code, 400, "{text}");
    let (code, text) = raw(dp.addr, b"GET /any HTTP/1.0\r\n\r\n").await;
    assert_eq!(code, 200, "{text}");
    // The absolute form's authority wins over Host, for routing and upstream.
    let (code, text) = raw(
        dp.addr,
        b"GET http://b.example/x HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("x-echo-server: b"), "routed by Host: {text}");
    assert!(
        text.contains("\"host\":\"b.example\""),
        "Host sent on: {text}"
    );
    // A Host that is not `host[:port]` could be read as another host by an upstream.
    let bad = [
        "[::1]evil",
        "[::1]:1:2",
        "a.example:80:80",
        "a.example/x",
        "user@a.example",
        "a.example:8o",
        "a example",
        "[zz::1]",
        "[::1",
        // An empty host or label (nginx refuses them too; issue 39: the router and the mTLS
        // guard need one host to agree on).
        "",
        ":80",
        "a..example",
        ".a.example",
    ];
    let good = [
        "a.example",
        "A.EXAMPLE:8080",
        "[::1]:80",
        "[::1]",
        "127.0.0.1",
        "x_y.example.",
    ];
    let cases = bad
        .iter()
        .map(|h| (h, 400))
        .chain(good.iter().map(|h| (h, 200)));
    for (host, want) in cases {
        let req = format!("GET /any HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let (code, text) = raw(dp.addr, req.as_bytes()).await;
        assert_eq!(code, want, "Host {host:?}: {text}");
    }
    // One Host: fine.
    let (code, text) = raw(
        dp.addr,
        b"GET /x HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("x-echo-server: a"), "{text}");
}

#[tokio::test]
async fn an_http2_host_header_that_differs_from_authority_is_refused() {
    let (dp, _a, _b) = two_hosts().await;
    let stream = tokio::net::TcpStream::connect(dp.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let mut send = |host: Option<&'static str>| {
        let mut b = http::Request::get("http://a.example/x");
        if let Some(h) = host {
            b = b.header("host", h);
        }
        let req = b
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        sender.send_request(req)
    };
    assert_eq!(send(Some("b.example")).await.unwrap().status(), 400);
    assert_eq!(send(Some("A.example")).await.unwrap().status(), 200);
    assert_eq!(send(None).await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_client_cannot_remove_a_header_a_plugin_adds() {
    let echo = sluice_testkit::EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let rewrite = plugin(
        "proxy-rewrite",
        serde_json::json!({"headers": {"set": {"x-from-plugin": "yes"}}}),
    );
    let snap = snapshot(
        1,
        vec![route_with("default/r/r1", &["/*"], "u", vec![rewrite])],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    dp.store.apply(snap, vec![]).unwrap();
    let resp = request(
        dp.addr,
        "GET",
        "/x",
        &[
            ("connection", "keep-alive, x-from-plugin, x-client"),
            ("x-client", "1"),
        ],
    )
    .await;
    assert_eq!(resp.status, StatusCode::OK);
    let j = resp.json();
    assert_eq!(j["headers"]["x-from-plugin"], "yes", "{j}");
    // What the client itself named in Connection is still dropped.
    assert!(j["headers"].get("x-client").is_none(), "{j}");
}

#[tokio::test]
async fn no_admin_endpoint_serves_a_private_key_or_a_credential() {
    use sluice_dataplane::listener::admin::{self, Endpoints};
    use sluice_proto::v1;
    let key = sluice_testkit::pki::self_signed(&["a.example"]);
    let key_pem = key.key_pem.clone();
    // The base64 body of the key: any line of it in a response is a leak.
    let key_line = key_pem.lines().nth(1).unwrap().to_owned();
    let echo = sluice_testkit::EchoServer::start("a", any()).await.unwrap();
    let mut snap = snapshot(
        1,
        vec![route_with(
            "default/r/r1",
            &["/*"],
            "u",
            vec![plugin("key-auth", serde_json::json!({}))],
        )],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    snap.tls_certificates = vec![v1::TlsCertificate {
        id: "default/a".into(),
        source: "test".into(),
        hosts: vec!["a.example".into()],
        cert_chain_pem: key.pem.clone(),
        private_key_pem: key_pem.clone(),
        client_auth: None,
    }];
    snap.consumers = vec![v1::Consumer {
        name: "default_alice".into(),
        plugins: vec![plugin(
            "key-auth",
            serde_json::json!({"key": "alice-api-key-123"}),
        )],
    }];
    let store = Arc::new(Store::new().unwrap());
    store.apply(snap, vec![]).unwrap();
    let debug = common::admin(&store).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let status = listener.local_addr().unwrap();
    tokio::spawn(admin::serve(
        listener,
        Arc::clone(&store),
        Endpoints::Status,
    ));
    for addr in [debug, status] {
        for path in [
            "/snapshot",
            "/snapshot?full=1",
            "/snapshot?full=true",
            "/metrics",
            "/healthz",
            "/readyz",
        ] {
            let text = get(addr, "admin", path).await.text();
            assert!(!text.contains(&key_line), "{path} shows the private key");
            assert!(
                !text.contains("alice-api-key-123"),
                "{path} shows a credential"
            );
        }
    }
    // The debug listener still shows what the snapshot holds, with the secrets redacted.
    let full = get(debug, "admin", "/snapshot?full=1").await.text();
    assert!(
        full.contains("<redacted>") && full.contains("default_alice"),
        "{full}"
    );
    assert!(
        full.contains(key.pem.lines().nth(1).unwrap()),
        "certificate shown"
    );
    // The status listener (the pod's address, for kubelet and Prometheus) has no /snapshot.
    assert_eq!(
        get(status, "admin", "/snapshot").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(get(status, "admin", "/readyz").await.status, StatusCode::OK);
    assert!(
        get(status, "admin", "/metrics")
            .await
            .text()
            .contains("sluice_snapshot_version")
    );
}

/// An admin listener of `endpoints` on loopback, with `header_timeout` and at most four
/// connections.
async fn admin_of_four(
    endpoints: sluice_dataplane::listener::admin::Endpoints,
    header_timeout: Duration,
) -> SocketAddr {
    let store = Arc::new(Store::new().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(sluice_dataplane::listener::admin::serve_limited(
        listener,
        store,
        endpoints,
        header_timeout,
        4,
    ));
    addr
}

#[tokio::test]
async fn admin_connections_are_bounded_in_time_and_number() {
    use sluice_dataplane::listener::admin::Endpoints;
    let addr = admin_of_four(Endpoints::All, Duration::from_millis(500)).await;
    // A silent client, a slow head and an idle keep-alive connection are each closed.
    assert!(closed_within(addr, b"", false, Duration::from_secs(5)).await);
    assert!(
        closed_within(
            addr,
            b"GET /healthz HTTP/1.1\r\nHo",
            false,
            Duration::from_secs(5)
        )
        .await
    );
    assert!(
        closed_within(
            addr,
            b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
            false,
            Duration::from_secs(5)
        )
        .await
    );
}

/// Idle and silent connections cannot starve the status port (kubelet's probes): past the
/// limit the oldest connection not serving a request is closed for the newcomer, however
/// long the header timeout.
#[tokio::test]
async fn idle_connections_cannot_starve_the_admin_listener() {
    use sluice_dataplane::listener::admin::Endpoints;
    // NB: a header timeout of an hour: only an eviction can free a slot.
    let addr = admin_of_four(Endpoints::Status, Duration::from_secs(3600)).await;
    // Every slot taken: two silent connections, a half-sent head, an idle keep-alive one.
    let mut held = Vec::new();
    for first in [&b""[..], b"", b"GET /healthz HTTP/1.1\r\nHo"] {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(first).await.unwrap();
        held.push(s);
    }
    let mut keep_alive = tokio::net::TcpStream::connect(addr).await.unwrap();
    keep_alive
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = keep_alive.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    // Probes keep being answered, each evicting the oldest idle connection. The guard
    // only turns a hang (a probe waiting behind the held slots) into a failure.
    for round in 0..8 {
        let probe = tokio::time::timeout(Duration::from_secs(30), get(addr, "admin", "/healthz"))
            .await
            .unwrap_or_else(|_| panic!("probe {round} starved by idle connections"));
        assert_eq!(probe.status, StatusCode::OK);
        // A new idle connection takes the freed slot again.
        held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // The evicted ones were closed (the oldest first): the first silent connection.
    let first = &mut held[0];
    let closed = tokio::time::timeout(Duration::from_secs(30), first.read(&mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0) | Err(_))), "{closed:?}");
}

#[tokio::test]
async fn paths_are_matched_and_forwarded_normalised() {
    let echo = sluice_testkit::EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let admin_route = route_with(
        "default/admin/r",
        &["/admin/*"],
        "u",
        vec![plugin("key-auth", serde_json::json!({}))],
    );
    let public = route("default/public/r", &["/public/*"], "u");
    let snap = snapshot(
        1,
        vec![admin_route, public],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    dp.store.apply(snap, vec![]).unwrap();
    let get = |target: &str| {
        let req = format!("GET {target} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
        let addr = dp.addr;
        async move { raw(addr, req.as_bytes()).await }
    };
    // Every spelling of /admin/x reaches the admin route, whose key-auth answers 401.
    for target in [
        "/admin/x",
        "/public/../admin/x",
        "/public/%2e%2e/admin/x",
        "/public/%2E%2E/admin/x",
        "/public/..%2fadmin/x",
        "/public/..%2Fadmin/x",
        "//admin/x",
        "/./admin/x",
        "/%61dmin/x",
        "/public/./../admin//x",
    ] {
        let (code, text) = get(target).await;
        assert_eq!(
            code, 401,
            "{target} bypassed the admin route's key-auth: {text}"
        );
    }
    // Paths that climb above the root or are not valid escapes: 400.
    for target in [
        "/../admin/x",
        "/public/../../admin/x",
        "/%2e%2e/admin",
        "/a%zz",
        "/a%00b",
    ] {
        let (code, text) = get(target).await;
        assert_eq!(code, 400, "{target}: {text}");
    }
    // What goes upstream is the normalised path, with the query as the client sent it.
    let (code, text) = get("/public/./a//b/../c%20d?x=%2e%2e&y=1").await;
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("\"path\":\"/public/a/c%20d\""), "{text}");
    assert!(text.contains("\"query\":\"x=%2e%2e&y=1\""), "{text}");
}

#[tokio::test]
async fn silent_http2_connections_cannot_hold_the_connection_limit() {
    let echo = sluice_testkit::EchoServer::start("a", any()).await.unwrap();
    let limits = Limits {
        max_connections: 3,
        header_read_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_millis(800),
        ..Limits::default()
    };
    let dp = dataplane_limited(Arc::new(Store::new().unwrap()), limits).await;
    apply_one_route(&dp.store, "/*", echo.addr);
    // Three h2c clients that send the whole preface and then nothing take every slot...
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    let mut silent = Vec::new();
    for _ in 0..3 {
        let mut s = tokio::net::TcpStream::connect(dp.addr).await.unwrap();
        s.write_all(preface).await.unwrap();
        silent.push(s);
    }
    // ...until the first-request timeout closes them; then a client is served again.
    for s in &mut silent {
        let mut buf = [0u8; 256];
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "a silent HTTP/2 connection was kept open");
    }
    let resp = tokio::time::timeout(Duration::from_secs(5), get(dp.addr, "h", "/x")).await;
    assert_eq!(resp.expect("not served").status, StatusCode::OK);
    // An HTTP/2 connection that served a request and then idles is closed after the idle
    // timeout (GOAWAY).
    let stream = tokio::net::TcpStream::connect(dp.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::get("http://h/x")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    assert_eq!(sender.send_request(req).await.unwrap().status(), 200);
    let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(ended.is_ok(), "an idle HTTP/2 connection was kept open");
}

#[tokio::test]
async fn real_ip_is_what_goes_upstream_on_every_protocol() {
    // An h2c (gRPC scheme) upstream and an HTTP/1.1 one, behind real-ip.
    let echo = sluice_testkit::EchoServer::start("a", any()).await.unwrap();
    for scheme in [
        sluice_proto::v1::Scheme::Http,
        sluice_proto::v1::Scheme::Grpc,
    ] {
        let dp = dataplane().await;
        let mut up = upstream("u", &[(echo.addr, 1)]);
        up.scheme = scheme as i32;
        let real_ip = plugin(
            "real-ip",
            serde_json::json!({"source": "http_x_forwarded_for", "trusted_addresses": ["127.0.0.1"]}),
        );
        let snap = snapshot(
            1,
            vec![route_with("default/r/r1", &["/*"], "u", vec![real_ip])],
            vec![up],
        );
        dp.store.apply(snap, vec![]).unwrap();
        let r = request(dp.addr, "GET", "/x", &[("x-forwarded-for", "198.51.100.9")]).await;
        assert_eq!(r.status, StatusCode::OK, "{scheme:?}: {}", r.text());
        let j = r.json();
        assert_eq!(j["headers"]["x-real-ip"], "198.51.100.9", "{scheme:?}: {j}");
        assert_eq!(
            j["headers"]["x-forwarded-for"], "198.51.100.9, 198.51.100.9",
            "{scheme:?}: {j}"
        );
    }
}

/// An upstream that refuses every WebSocket upgrade with a 403 whose body names the `Host`
/// and `X-Forwarded-Host` it received.
async fn host_reporting_upstream() -> SocketAddr {
    raw_upstream(move |mut s| async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let head = String::from_utf8_lossy(&got).to_lowercase();
        let field = |name: &str| {
            head.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                .unwrap_or("-")
                .trim()
                .to_owned()
        };
        let body = format!("host={};xfh={}", field("host"), field("x-forwarded-host"));
        let resp = format!(
            "HTTP/1.1 403 Forbidden\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = s.write_all(resp.as_bytes()).await;
    })
    .await
}

#[tokio::test]
async fn websocket_upgrades_follow_pass_host() {
    use sluice_proto::v1;
    let backend = host_reporting_upstream().await;
    for (pass, rewrite, want) in [
        (
            v1::UpstreamPassHost::Pass,
            "",
            "host=client.example;xfh=client.example",
        ),
        (
            v1::UpstreamPassHost::Node,
            "",
            &*format!("host={backend};xfh=client.example"),
        ),
        (
            v1::UpstreamPassHost::Rewrite,
            "internal.example",
            "host=internal.example;xfh=client.example",
        ),
    ] {
        let dp = dataplane().await;
        let mut up = upstream("u", &[(backend, 1)]);
        up.pass_host = pass as i32;
        up.upstream_host = rewrite.into();
        let mut r = route("default/r/r1", &["/*"], "u");
        r.websocket = true;
        dp.store
            .apply(snapshot(1, vec![r], vec![up]), vec![])
            .unwrap();
        let (code, text) = raw(
            dp.addr,
            b"GET /ws HTTP/1.1\r\nHost: client.example\r\nUpgrade: websocket\r\nConnection: Upgrade, close\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        )
        .await;
        assert_eq!(code, 403, "{pass:?}: {text}");
        assert!(text.ends_with(want), "{pass:?}: want {want}, got {text}");
    }
}

#[tokio::test]
async fn a_request_or_response_body_that_stalls_times_out() {
    // An upstream that sends a head and a piece of its body, then nothing, and keeps the
    // connection open until the proxy closes it: only the read timeout can end the response.
    let stalling = raw_upstream(|mut s| async move {
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf).await;
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
            .await;
        while s.read(&mut buf).await.is_ok_and(|n| n > 0) {}
    })
    .await;
    let echo = sluice_testkit::EchoServer::start("a", any()).await.unwrap();
    let limits = Limits {
        client_body_timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    let dp = dataplane_limited(Arc::new(Store::new().unwrap()), limits).await;
    let mut stalls = route("default/s/r", &["/stall"], "s");
    stalls.timeout = Some(sluice_proto::v1::Timeouts {
        connect_ms: 1000,
        send_ms: 1000,
        read_ms: 500,
        ..Default::default()
    });
    let snap = snapshot(
        1,
        vec![stalls, route("default/e/r", &["/echo"], "e")],
        vec![
            upstream("s", &[(stalling, 1)]),
            upstream("e", &[(echo.addr, 1)]),
        ],
    );
    dp.store.apply(snap, vec![]).unwrap();
    // The client sends 3 of its 10 bytes and pauses: 408 (nginx client_body_timeout).
    let (code, text) = raw(
        dp.addr,
        b"POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\nConnection: close\r\n\r\nabc",
    )
    .await;
    assert_eq!(code, 408, "{text}");
    // The upstream's body stalls after a piece and the upstream never closes: the response
    // ends (the connection to the client is closed) instead of hanging. NB: the guard only
    // turns a hang into a failure; it is not a bound on how fast the cut is.
    let (code, text) = tokio::time::timeout(
        Duration::from_secs(60),
        raw(dp.addr, b"GET /stall HTTP/1.1\r\nHost: h\r\n\r\n"),
    )
    .await
    .expect("the stalled body was not cut");
    assert_eq!(code, 200, "{text}");
    assert!(text.ends_with("partial"), "{text}");
}

#[tokio::test]
async fn a_client_that_stops_reading_is_cut_off_after_the_send_timeout() {
    const SIZE: usize = 64 << 20;
    let big = raw_upstream(|mut s| async move {
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf).await;
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\n\r\n");
        if s.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let chunk = vec![b'x'; 64 << 10];
        for _ in 0..SIZE / chunk.len() {
            if s.write_all(&chunk).await.is_err() {
                return;
            }
        }
    })
    .await;
    let limits = Limits {
        send_timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    let dp = dataplane_limited(Arc::new(Store::new().unwrap()), limits).await;
    let snap = snapshot(
        1,
        vec![route("default/r/r1", &["/*"], "u")],
        vec![upstream("u", &[(big, 1)])],
    );
    dp.store.apply(snap, vec![]).unwrap();
    let mut s = tokio::net::TcpStream::connect(dp.addr).await.unwrap();
    s.write_all(b"GET /big HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    // Read nothing for a while: the dataplane's writes wait, then time out.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got += n,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the connection was still open");
    assert!(
        got < SIZE,
        "the whole body arrived ({got} bytes): nothing was cut"
    );
}

/// A request head of exactly `len` bytes: the request line, `Host`, then `X-Pad-<i>` headers
/// of `each` bytes (the last one shorter) and the empty line.
fn head_of(len: usize, target: &str, each: usize) -> Vec<u8> {
    let mut head = format!("GET {target} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n");
    let mut i = 0;
    while head.len() + 2 < len {
        let room = len - 2 - head.len();
        let name = format!("X-Pad-{i}: ");
        // A field line needs its name, one value byte and CRLF.
        let line = if room >= name.len() + 3 {
            let value = (room - name.len() - 2).min(each);
            let value =
                if room - (name.len() + value + 2) < 12 && room - (name.len() + value + 2) > 0 {
                    // Leave no remainder too small for one more field line.
                    room - name.len() - 2
                } else {
                    value
                };
            format!("{name}{}\r\n", "v".repeat(value))
        } else {
            unreachable!("head_of: {room} bytes left")
        };
        head.push_str(&line);
        i += 1;
    }
    head.push_str("\r\n");
    assert_eq!(head.len(), len);
    head.into_bytes()
}

#[tokio::test]
async fn request_heads_are_held_to_64_kib_exactly() {
    const LIMIT: usize = 64 * 1024;
    let echo = sluice_testkit::EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let snap = snapshot(
        1,
        vec![route("default/r/r1", &["/*"], "u")],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    dp.store.apply(snap, vec![]).unwrap();
    // The same sizes in three shapes: one large header, many headers of 700 bytes (under the
    // 100-header limit), and a long request target.
    for len in [
        LIMIT - 1,
        LIMIT,
        LIMIT + 1,
        LIMIT + 4096,
        100 * 1024,
        120 * 1024,
    ] {
        let long_target = format!("/{}", "t".repeat(len.saturating_sub(LIMIT / 2)));
        for (shape, head) in [
            ("one header", head_of(len, "/", usize::MAX)),
            ("700-byte headers", head_of(len, "/", 700)),
            ("long target", head_of(len, &long_target, usize::MAX)),
        ] {
            if shape == "700-byte headers" && len > 70 * 1024 {
                continue; // more than 100 headers: refused for that reason instead
            }
            let (code, text) = raw(dp.addr, &head).await;
            // NB: a target over 65,534 bytes is refused by the http crate with 414 (as nginx does).
            let want = match (len <= LIMIT, shape) {
                (true, _) => 200,
                (false, "long target") if code == 414 => 414,
                (false, _) => 431,
            };
            assert_eq!(
                code,
                want,
                "{shape}, {len} bytes: {}",
                &text[..text.len().min(200)]
            );
        }
    }
    // The connection limit's neighbour, the header count: 101 headers are refused too.
    let mut head = String::from("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n");
    for i in 0..99 {
        head.push_str(&format!("X-N-{i}: 1\r\n"));
    }
    head.push_str("\r\n");
    let (code, _) = raw(dp.addr, head.as_bytes()).await;
    assert_eq!(code, 431, "101 headers");
}

/// An HTTP/1.1 upstream that answers every request with `first`, then, 300 ms later (the
/// proxy has sent the head on by then), `then`, and closes.
async fn answering(first: &'static [u8], then: &'static [u8]) -> SocketAddr {
    raw_upstream(move |mut s| async move {
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf).await;
        let _ = s.write_all(first).await;
        if !then.is_empty() {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let _ = s.write_all(then).await;
        }
        let _ = s.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn an_upstream_framing_error_is_a_502_before_the_head_and_an_abort_after_it() {
    const CHUNKED: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n";
    const LENGTH: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhello";
    // Framing errors in the head, or in the body bytes that came with it, or the upstream
    // gone before the body's end: known before the head is sent on, so a 502.
    let before: [(&'static [u8], &'static [u8]); 8] = [
        (b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello", b""),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nhello",
            b"",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
            b"",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\n",
            b"",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXY",
            b"",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n",
            b"",
        ),
        (CHUNKED, b""),
        (LENGTH, b""),
    ];
    // Errors that come after the head went on: the client must not be able to take what it
    // got for a whole response (HTTP/1.1: no last chunk and the connection closed, or fewer
    // bytes than the Content-Length; HTTP/2: the stream reset).
    let after: [(&'static [u8], &'static [u8]); 4] = [
        (CHUNKED, b"ZZ\r\n"),
        (CHUNKED, b"3\r\nab"),
        (CHUNKED, b"5\r\nworldXY0\r\n\r\n"),
        (LENGTH, b" world"),
    ];
    let dp = dataplane().await;
    let mut routes = Vec::new();
    let mut ups = Vec::new();
    for (i, (first, then)) in before.iter().chain(after.iter()).enumerate() {
        let name = format!("u{i}");
        routes.push(route(
            &format!("default/r/r{i}"),
            &[&format!("/{i}")],
            &name,
        ));
        ups.push(upstream(&name, &[(answering(first, then).await, 1)]));
    }
    dp.store.apply(snapshot(1, routes, ups), vec![]).unwrap();
    for i in 0..before.len() {
        for h2 in [false, true] {
            let (status, body) = get_body(dp.addr, &format!("/{i}"), h2).await;
            assert_eq!(status, 502, "error {i} before the head (h2 {h2})");
            assert!(body.is_ok_and(|b| b.starts_with(b"{\"error_msg\":\"502")));
        }
    }
    for j in 0..after.len() {
        let i = before.len() + j;
        for h2 in [false, true] {
            let (status, body) = get_body(dp.addr, &format!("/{i}"), h2).await;
            assert_eq!(status, 200, "error {i} after the head (h2 {h2})");
            assert!(
                body.is_err(),
                "error {i} (h2 {h2}): read as complete: {body:?}"
            );
        }
    }
}

/// One GET over a new HTTP/1.1 or h2c connection: the status and the whole body, or the
/// error that cut it.
async fn get_body(
    addr: SocketAddr,
    path: &str,
    h2: bool,
) -> (StatusCode, Result<bytes::Bytes, hyper::Error>) {
    use http_body_util::BodyExt as _;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(stream);
    let req = http::Request::get(format!("http://h{path}"))
        .header("host", "h")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = if h2 {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .unwrap();
        tokio::spawn(conn);
        sender.send_request(req).await.unwrap()
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        sender.send_request(req).await.unwrap()
    };
    let status = resp.status();
    let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
        .await
        .expect("the body neither ended nor failed")
        .map(|c| c.to_bytes());
    (status, body)
}

#[tokio::test]
async fn a_request_body_that_stalls_over_http2_times_out_too() {
    let echo = sluice_testkit::EchoServer::start("a", any()).await.unwrap();
    let limits = Limits {
        client_body_timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    let dp = dataplane_limited(Arc::new(Store::new().unwrap()), limits).await;
    let snap = snapshot(
        1,
        vec![route("default/e/r", &["/echo"], "e")],
        vec![upstream("e", &[(echo.addr, 1)])],
    );
    dp.store.apply(snap, vec![]).unwrap();
    // h2c: 3 bytes of a 10-byte body, then nothing (the sender is kept, so no end of stream).
    let stream = tokio::net::TcpStream::connect(dp.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let (tx, rx) = futures::channel::mpsc::channel::<
        Result<http_body::Frame<bytes::Bytes>, std::convert::Infallible>,
    >(4);
    let mut tx = tx;
    futures::SinkExt::send(
        &mut tx,
        Ok(http_body::Frame::data(bytes::Bytes::from_static(b"abc"))),
    )
    .await
    .unwrap();
    let req = http::Request::post("http://h/echo")
        .header("content-length", "10")
        .body(http_body_util::StreamBody::new(rx))
        .unwrap();
    // NB: the guard only turns a hang into a failure; the 408 says the timeout fired.
    let resp = tokio::time::timeout(Duration::from_secs(60), sender.send_request(req))
        .await
        .expect("no answer to a stalled HTTP/2 request body")
        .unwrap();
    assert_eq!(resp.status(), 408);
    drop(tx);
}

/// An origin that answers every request with an endless body (as fast as it can be sent)
/// and counts the connections that ended.
async fn endless_origin() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ended = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&ended);
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let ended = Arc::clone(&counted);
            tokio::spawn(async move {
                let mut head = [0u8; 4096];
                let _ = s.read(&mut head).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
                    .await;
                let chunk = vec![b'x'; 64 * 1024];
                while s.write_all(&chunk).await.is_ok() {}
                ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
    });
    (addr, ended)
}

/// A client that opens HTTP/2 streams and never opens their flow-control window cannot pin
/// upstream connections: past send_timeout the connection is closed and every upstream
/// connection its streams held is released.
#[tokio::test]
async fn http2_streams_with_a_closed_window_do_not_pin_upstream_connections() {
    let (origin, ended) = endless_origin().await;
    let limits = Limits {
        send_timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    let dp = dataplane_limited(Arc::new(Store::new().unwrap()), limits).await;
    let snap = snapshot(
        1,
        vec![route("default/big/r", &["/big"], "big")],
        vec![upstream("big", &[(origin, 1)])],
    );
    dp.store.apply(snap, vec![]).unwrap();
    let stream = tokio::net::TcpStream::connect(dp.addr).await.unwrap();
    let mut client = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    client.adaptive_window(false).initial_stream_window_size(0);
    let (sender, conn) = client
        .handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let mut heads = Vec::new();
    for _ in 0..5 {
        let mut sender = sender.clone();
        let req = http::Request::get("http://h/big")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        heads.push(tokio::spawn(async move { sender.send_request(req).await }));
    }
    let mut bodies = Vec::new();
    for h in heads {
        let resp = h.await.unwrap().unwrap();
        assert_eq!(resp.status(), 200);
        bodies.push(resp); // NB: kept, never read: the window stays closed.
    }
    // NB: the guards only turn a hang (streams pinned for ever) into a failure.
    assert!(
        eventually(Duration::from_secs(60), || {
            ended.load(std::sync::atomic::Ordering::SeqCst) >= 5
        })
        .await,
        "upstream connections still pinned by streams the client never reads"
    );
    tokio::time::timeout(Duration::from_secs(60), conn)
        .await
        .expect("the client connection is still open")
        .unwrap()
        .ok();
    drop(bodies);
}

/// One HTTP/2 connection cannot open an upstream connection per stream without bound:
/// the dataplane allows 128 concurrent streams per connection (nginx's
/// `http2_max_concurrent_streams`), so 400 requests in flight on one h2c connection to an
/// HTTP/1.1 upstream that holds every request hold at most 128 upstream connections.
#[tokio::test]
async fn one_http2_connection_holds_at_most_128_upstream_connections() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = listener.local_addr().unwrap();
    let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    {
        let (opened, release) = (Arc::clone(&opened), Arc::clone(&release));
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let release = Arc::clone(&release);
                tokio::spawn(async move {
                    let mut head = [0u8; 4096];
                    let _ = s.read(&mut head).await;
                    release.notified().await;
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .await;
                });
            }
        });
    }
    let dp = dataplane().await;
    let snap = snapshot(
        1,
        vec![route("default/held/r", &["/held"], "held")],
        vec![upstream("held", &[(origin, 1)])],
    );
    dp.store.apply(snap, vec![]).unwrap();
    let stream = tokio::net::TcpStream::connect(dp.addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let mut inflight = Vec::new();
    for _ in 0..400 {
        let mut sender = sender.clone();
        inflight.push(tokio::spawn(async move {
            let req = http::Request::get("http://h/held")
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap();
            sender.send_request(req).await.map(|r| r.status())
        }));
    }
    // Until the count settles (the guard only bounds the wait).
    let mut last = usize::MAX;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = opened.load(std::sync::atomic::Ordering::SeqCst);
        if now == last && now > 0 {
            break;
        }
        last = now;
    }
    let held = opened.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        held <= 128,
        "{held} upstream connections for one client connection"
    );
    assert!(
        held >= 100,
        "{held}: the streams did not reach the upstream"
    );
    release.notify_waiters();
    drop(inflight);
}
