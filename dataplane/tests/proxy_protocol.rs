//! PROXY protocol v1/v2 on the HTTP and HTTPS listeners (`--proxy-protocol` on the
//! dataplane's own ports, `Listener.accept_proxy_protocol` on a per-Gateway port): real
//! headers written on real loopback sockets before HTTP/1.1, h2c and TLS (HTTP/1.1 and
//! HTTP/2), the carried address checked where a user sees it (the upstream's
//! `X-Forwarded-For`/`X-Real-IP`, ip-restriction's verdict, limit-count's budgets), and the
//! refusals: no header, an untrusted peer, a slow partial header, an oversized v1 line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use serde_json::json;
use sluice_dataplane::config::store::Store;
use sluice_dataplane::listener::gateway::GatewayListeners;
use sluice_dataplane::listener::proxy_protocol::ProxyProtocol;
use sluice_dataplane::listener::server::{self, Drain, Limits};
use sluice_dataplane::stream::proxy_protocol::encode;
use sluice_proto::v1;
use sluice_testkit::EchoServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn v1_header(client: &str, to: SocketAddr) -> Vec<u8> {
    encode(false, sa(client), to)
}

fn v2_header(client: &str, to: SocketAddr) -> Vec<u8> {
    encode(true, sa(client), to)
}

/// A v2 `LOCAL` header: a balancer's own health check.
fn v2_local() -> Vec<u8> {
    ppp::v2::Builder::new(
        ppp::v2::Version::Two | ppp::v2::Command::Local,
        ppp::v2::AddressFamily::Unspecified | ppp::v2::Protocol::Unspecified,
    )
    .build()
    .unwrap()
}

/// Routes: `/*` with ip-restriction (only 203.0.113.0/24) and limit-count (one request a
/// minute per client address); `/free` without plugins. All to `echo`.
fn routes(version: u64, echo: SocketAddr) -> v1::Snapshot {
    snapshot(
        version,
        vec![
            route_with(
                "default/r/p",
                &["/*"],
                "u",
                vec![
                    plugin("ip-restriction", json!({"whitelist": ["203.0.113.0/24"]})),
                    plugin("limit-count", json!({"count": 1, "time_window": 60})),
                ],
            ),
            route("default/r/free", &["/free"], "u"),
        ],
        vec![upstream("u", &[(echo, 1)])],
    )
}

/// The dataplane's own plain-HTTP listener with `--proxy-protocol` (`trusted` peers), short
/// PROXY header timeout `header_timeout`.
async fn fleet_http(
    store: &Arc<Store>,
    trusted: &[&str],
    header_timeout: Duration,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener =
        tokio::net::TcpListener::from_std(server::bind_reuseport(any()).unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = Limits {
        proxy_header_timeout: header_timeout,
        ..Default::default()
    };
    let proxy = ProxyProtocol {
        trusted: trusted.iter().map(|c| c.parse().unwrap()).collect(),
    };
    let task = tokio::spawn(server::serve_proxied_until(
        listener,
        Arc::clone(store),
        limits,
        Drain::never(),
        Some(proxy),
    ));
    (addr, task)
}

/// `GET path` over HTTP/1.1 on a new connection to `addr` that starts with `header`.
async fn get_h1(addr: SocketAddr, header: &[u8], path: &str) -> Result<Resp, String> {
    let mut tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    tcp.write_all(header).await.map_err(|e| e.to_string())?;
    over_h1(tcp, path).await
}

async fn over_h1<S>(io: S, path: &str) -> Result<Resp, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "example.com")
        .body(Full::new(Bytes::new()))
        .unwrap();
    collect(sender.send_request(req).await.map_err(|e| e.to_string())?).await
}

async fn over_h2<S>(io: S, path: &str) -> Result<Resp, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = Request::get(format!("http://example.com{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    collect(sender.send_request(req).await.map_err(|e| e.to_string())?).await
}

async fn collect(resp: http::Response<hyper::body::Incoming>) -> Result<Resp, String> {
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Resp {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// What the upstream saw as the client: (`X-Forwarded-For`, `X-Real-IP`).
fn seen(r: &Resp) -> (String, String) {
    let j = r.json();
    (
        j["headers"]["x-forwarded-for"]
            .as_str()
            .unwrap_or("-")
            .into(),
        j["headers"]["x-real-ip"].as_str().unwrap_or("-").into(),
    )
}

/// Whether the server closes `s` (EOF or reset) within `limit` without sending a byte.
async fn closed_silently(s: &mut TcpStream, limit: Duration) -> bool {
    let mut b = [0u8; 64];
    matches!(
        tokio::time::timeout(limit, s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

fn refused(store: &Store, reason: &str) -> f64 {
    metric(
        &store.render_metrics(),
        "sluice_proxy_protocol_refused_total",
        &[&format!("reason=\"{reason}\"")],
    )
    .unwrap_or(0.0)
}

/// v1 and v2 headers on the plain listener: the carried address reaches the upstream, is
/// the one ip-restriction judges and the one limit-count counts; a v2 LOCAL header keeps
/// the socket's peer. HTTP/1.1 and h2c alike.
#[tokio::test]
async fn the_carried_address_is_the_client_for_the_upstream_ip_restriction_and_limits() {
    let echo = EchoServer::start("origin", any()).await.unwrap();
    let store = Arc::new(Store::new().unwrap());
    store.apply(routes(1, echo.addr), vec![]).unwrap();
    let (addr, _task) = fleet_http(&store, &["127.0.0.0/8"], Duration::from_secs(5)).await;

    let r = get_h1(addr, &v1_header("203.0.113.7:40000", addr), "/")
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(seen(&r), ("203.0.113.7".into(), "203.0.113.7".into()));
    // limit-count: 203.0.113.7 has used its budget, 203.0.113.8 has its own.
    let r = get_h1(addr, &v2_header("203.0.113.7:40001", addr), "/")
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let r = get_h1(addr, &v2_header("203.0.113.8:40000", addr), "/")
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(seen(&r).0, "203.0.113.8");
    // ip-restriction refuses an address outside its list, whatever the socket's peer.
    let r = get_h1(addr, &v2_header("198.51.100.1:40000", addr), "/")
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // IPv6 client through an IPv4 balancer connection.
    let r = get_h1(addr, &v2_header("[2001:db8::7]:40000", addr), "/free")
        .await
        .unwrap();
    assert_eq!(seen(&r).0, "2001:db8::7");
    // A LOCAL header: the balancer's health check is the socket's peer.
    let r = get_h1(addr, &v2_local(), "/free").await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(seen(&r), ("127.0.0.1".into(), "127.0.0.1".into()));
    let r = get_h1(addr, &v2_local(), "/").await.unwrap();
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    // h2c with prior knowledge after the header; the request in the same write as the
    // header (the bytes read past it are replayed).
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&v2_header("203.0.113.9:40000", addr))
        .await
        .unwrap();
    let r = over_h2(tcp, "/").await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(seen(&r).0, "203.0.113.9");
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let mut first = v1_header("203.0.113.10:40000", addr);
    first
        .extend_from_slice(b"GET /free HTTP/1.1\r\nhost: example.com\r\nconnection: close\r\n\r\n");
    tcp.write_all(&first).await.unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains("\"x-forwarded-for\":\"203.0.113.10\""),
        "{answer}"
    );
}

/// On a listener that requires the header: a connection without one, from an untrusted
/// peer, with a header that stalls, or with a v1 line past 107 bytes is closed without an
/// answer, each counted by reason; the stall only after the header timeout, the others
/// at once.
#[tokio::test]
async fn connections_without_a_valid_header_are_closed() {
    let echo = EchoServer::start("origin", any()).await.unwrap();
    let store = Arc::new(Store::new().unwrap());
    store.apply(routes(1, echo.addr), vec![]).unwrap();
    let timeout = Duration::from_millis(500);
    let (addr, _task) = fleet_http(&store, &["127.0.0.0/8"], timeout).await;

    // No header: a plain HTTP request gets no answer.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET /free HTTP/1.1\r\nhost: example.com\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_silently(&mut c, Duration::from_secs(2)).await);
    assert_eq!(refused(&store, "missing"), 1.0);
    // An h2c preface without a header.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_silently(&mut c, Duration::from_secs(2)).await);

    // A slow partial header: closed once the header timeout passed, not before.
    let started = Instant::now();
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"PROXY TCP4 203.0.113.7 ").await.unwrap();
    assert!(closed_silently(&mut c, Duration::from_secs(5)).await);
    let took = started.elapsed();
    assert!(took >= timeout, "closed after {took:?}");
    assert_eq!(refused(&store, "timeout"), 1.0);

    // An oversized v1 line: closed before the timeout.
    let mut c = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    let long = format!("PROXY TCP4 {} 127.0.0.1 1 2", "1".repeat(200));
    c.write_all(long.as_bytes()).await.unwrap();
    assert!(closed_silently(&mut c, Duration::from_secs(5)).await);
    assert!(started.elapsed() < timeout, "{:?}", started.elapsed());
    assert_eq!(refused(&store, "too_long"), 1.0);

    // A malformed header (port out of range).
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"PROXY TCP4 1.2.3.4 5.6.7.8 99999 80\r\nGET / HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_silently(&mut c, Duration::from_secs(2)).await);
    assert_eq!(refused(&store, "invalid"), 1.0);

    // The same dataplane with the balancer elsewhere: a valid header from this peer is
    // refused too.
    let (untrusting, _task) = fleet_http(&store, &["10.0.0.0/8"], timeout).await;
    let mut c = TcpStream::connect(untrusting).await.unwrap();
    let mut first = v1_header("203.0.113.7:40000", untrusting);
    first.extend_from_slice(b"GET /free HTTP/1.1\r\nhost: example.com\r\n\r\n");
    c.write_all(&first).await.unwrap();
    assert!(closed_silently(&mut c, Duration::from_secs(2)).await);
    assert_eq!(refused(&store, "untrusted"), 1.0);

    // And the listener still serves a good one.
    let r = get_h1(addr, &v1_header("203.0.113.7:1", addr), "/free")
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
}

/// A TLS client config trusting nothing in particular (the test checks addresses, not
/// certificates), offering `alpn`.
fn tls_client(alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(
            sluice_dataplane::upstream::tls::NoVerification(provider),
        ))
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(config)
}

/// A TLS connection to `addr` for `sni`, after `header`.
async fn tls_after(
    addr: SocketAddr,
    header: &[u8],
    sni: &str,
    alpn: &[u8],
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let mut tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    tcp.write_all(header).await.map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(tls_client(alpn))
        .connect(ServerName::try_from(sni.to_owned()).unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())
}

/// The HTTPS listener with `--proxy-protocol`: the header precedes the ClientHello; the
/// carried address reaches the upstream over HTTP/1.1 and HTTP/2; a ClientHello without a
/// header is closed.
#[tokio::test]
async fn https_reads_the_header_before_the_client_hello_for_h1_and_h2() {
    let echo = EchoServer::start("origin", any()).await.unwrap();
    let store = Arc::new(Store::new().unwrap());
    let cert = sluice_testkit::pki::self_signed(&["example.com"]);
    let mut snap = routes(1, echo.addr);
    snap.tls_certificates = vec![v1::TlsCertificate {
        id: "cert".into(),
        source: "test cert".into(),
        hosts: vec!["example.com".into()],
        cert_chain_pem: cert.pem.clone(),
        private_key_pem: cert.key_pem.clone(),
        client_auth: None,
    }];
    store.apply(sluice_proto::seal(snap, 1), vec![]).unwrap();
    let listener =
        tokio::net::TcpListener::from_std(server::bind_reuseport(any()).unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let _task = tokio::spawn(sluice_dataplane::listener::tls::serve_https_proxied_until(
        listener,
        Arc::clone(&store),
        Limits::default(),
        Drain::never(),
        Some(ProxyProtocol {
            trusted: vec!["127.0.0.1/32".parse().unwrap()],
        }),
    ));

    let tls = tls_after(
        addr,
        &v2_header("203.0.113.7:40000", addr),
        "example.com",
        b"http/1.1",
    )
    .await
    .unwrap();
    let r = over_h1(tls, "/").await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(seen(&r), ("203.0.113.7".into(), "203.0.113.7".into()));

    let tls = tls_after(
        addr,
        &v1_header("[2001:db8::9]:4000", addr),
        "example.com",
        b"h2",
    )
    .await
    .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let r = over_h2(tls, "/").await.unwrap();
    assert_eq!(
        r.status,
        StatusCode::FORBIDDEN,
        "ip-restriction judged 2001:db8::9"
    );
    let tls = tls_after(
        addr,
        &v1_header("[2001:db8::9]:4000", addr),
        "example.com",
        b"h2",
    )
    .await
    .unwrap();
    let r = over_h2(tls, "/free").await.unwrap();
    assert_eq!(seen(&r).0, "2001:db8::9");

    // A ClientHello without a header: the handshake fails, nothing was served.
    assert!(
        tls_after(addr, b"", "example.com", b"http/1.1")
            .await
            .is_err()
    );
    assert_eq!(refused(&store, "missing"), 1.0);
}

/// A per-Gateway port whose `Listener` has `accept_proxy_protocol` reads the header (its
/// own trusted CIDRs); a port without it serves plain HTTP as before, the header being
/// nothing it knows.
#[tokio::test]
async fn a_gateway_listener_with_accept_proxy_protocol_reads_the_header() {
    let echo = EchoServer::start("origin", any()).await.unwrap();
    let store = Arc::new(Store::new().unwrap());
    let (with, without) = (closed_port().port(), closed_port().port());
    let mut snap = routes(1, echo.addr);
    for r in &mut snap.routes {
        r.listeners = vec!["ns/gw/80".into(), "ns/plain/81".into()];
    }
    snap.listeners = vec![
        v1::Listener {
            id: "ns/gw/80".into(),
            source: "Gateway ns/gw".into(),
            port: u32::from(with),
            accept_proxy_protocol: true,
            proxy_protocol_trusted: vec!["127.0.0.0/8".into()],
            ..Default::default()
        },
        v1::Listener {
            id: "ns/plain/81".into(),
            source: "Gateway ns/plain".into(),
            port: u32::from(without),
            ..Default::default()
        },
    ];
    store.apply(sluice_proto::seal(snap, 1), vec![]).unwrap();
    let mut gw = GatewayListeners::new(
        "127.0.0.1".parse().unwrap(),
        1,
        Arc::clone(&store),
        Limits::default(),
    );
    gw.reconcile();
    let (with, without) = (
        SocketAddr::from(([127, 0, 0, 1], with)),
        SocketAddr::from(([127, 0, 0, 1], without)),
    );
    assert!(listening(with, Duration::from_secs(5)).await);
    assert!(listening(without, Duration::from_secs(5)).await);

    let r = get_h1(with, &v2_header("203.0.113.7:40000", with), "/")
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(seen(&r).0, "203.0.113.7");
    let mut c = TcpStream::connect(with).await.unwrap();
    c.write_all(b"GET /free HTTP/1.1\r\nhost: example.com\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_silently(&mut c, Duration::from_secs(2)).await);

    let r = get_h1(without, b"", "/free").await.unwrap();
    assert_eq!(seen(&r).0, "127.0.0.1");
    gw.drain();
}

/// `--proxy-protocol` covers the fleet-wide TCP stream ports (`stream/...`, on the dataplane
/// Service behind the same balancer): the header is read and stripped, the echo sees only
/// the client's bytes, and a connection without it is closed; a Gateway's TCP port without
/// `accept_proxy_protocol` is not affected.
#[tokio::test]
async fn the_flag_covers_the_fleet_stream_ports_and_not_the_gateway_ones() {
    use sluice_testkit::l4::TcpEcho;
    let echo = TcpEcho::start().await;
    let store = Arc::new(Store::new().unwrap());
    let (fleet, gateway) = (closed_port().port(), closed_port().port());
    let l4 = |id: &str, port: u16| v1::Listener {
        id: id.into(),
        source: format!("test {id}"),
        port: u32::from(port),
        protocol: v1::ListenerProtocol::Tcp as i32,
        ..Default::default()
    };
    let route = |id: &str, listener: &str| v1::StreamRoute {
        id: id.into(),
        source: format!("test {id}"),
        listeners: vec![listener.into()],
        backends: vec![v1::Backend {
            upstream_id: "u".into(),
            weight: 1,
            plugins: Vec::new(),
        }],
        ..Default::default()
    };
    let snap = v1::Snapshot {
        listeners: vec![l4("stream/tcp/1", fleet), l4("ns/gw/2", gateway)],
        stream_routes: vec![
            route("ns/a/stream/0", "stream/tcp/1"),
            route("ns/b/tcproute-r0", "ns/gw/2"),
        ],
        upstreams: vec![upstream("u", &[(echo.addr, 1)])],
        ..Default::default()
    };
    store.apply(sluice_proto::seal(snap, 1), vec![]).unwrap();
    let mut gw = GatewayListeners::new(
        "127.0.0.1".parse().unwrap(),
        1,
        Arc::clone(&store),
        Limits::default(),
    )
    .with_fleet_proxy_protocol(Some(ProxyProtocol {
        trusted: vec!["127.0.0.0/8".parse().unwrap()],
    }));
    gw.reconcile();
    let (fleet, gateway) = (
        SocketAddr::from(([127, 0, 0, 1], fleet)),
        SocketAddr::from(([127, 0, 0, 1], gateway)),
    );

    let mut c = TcpStream::connect(fleet).await.unwrap();
    let mut first = v2_header("203.0.113.7:40000", fleet);
    first.extend_from_slice(b"ping");
    c.write_all(&first).await.unwrap();
    let mut back = [0u8; 4];
    c.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping");
    let mut c = TcpStream::connect(fleet).await.unwrap();
    c.write_all(b"ping").await.unwrap();
    assert!(closed_silently(&mut c, Duration::from_secs(2)).await);

    let mut c = TcpStream::connect(gateway).await.unwrap();
    c.write_all(b"ping").await.unwrap();
    c.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping");
    gw.drain();
}
