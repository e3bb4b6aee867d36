//! Hostile clients on stream listeners: slow, partial and oversized ClientHellos, and
//! PROXY headers that lie or never end. Each is closed within its bound and never opens an
//! upstream connection.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use sluice_dataplane::config::store::Store;
use sluice_dataplane::listener::gateway::GatewayListeners;
use sluice_dataplane::listener::server::Limits;
use sluice_dataplane::stream::StreamLimits;
use sluice_proto::v1;
use sluice_testkit::l4::TcpEcho;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn at(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A port manager serving one listener of `protocol` whose one route (passthrough on TLS)
/// goes to `backend`; `edit` changes the listener.
fn serve_one(
    protocol: v1::ListenerProtocol,
    backend: SocketAddr,
    limits: StreamLimits,
    edit: impl FnOnce(&mut v1::Listener),
) -> (Arc<Store>, GatewayListeners, u16) {
    let store = Arc::new(Store::new().unwrap());
    let mut gw = GatewayListeners::new(
        "127.0.0.1".parse().unwrap(),
        1,
        Arc::clone(&store),
        Limits::default(),
    )
    .with_stream_limits(limits);
    let port = closed_port().port();
    let mut l = v1::Listener {
        id: "l".into(),
        port: u32::from(port),
        protocol: protocol as i32,
        ..Default::default()
    };
    edit(&mut l);
    let route = v1::StreamRoute {
        id: "ns/r/0".into(),
        listeners: vec!["l".into()],
        tls: if protocol == v1::ListenerProtocol::Tls {
            v1::StreamTls::Passthrough as i32
        } else {
            0
        },
        backends: vec![v1::Backend {
            upstream_id: "u".into(),
            weight: 1,
            plugins: Vec::new(),
        }],
        ..Default::default()
    };
    let snap = sluice_proto::seal(
        v1::Snapshot {
            listeners: vec![l],
            stream_routes: vec![route],
            upstreams: vec![upstream("u", &[(backend, 1)])],
            ..Default::default()
        },
        1,
    );
    store.apply(snap, vec![]).unwrap();
    gw.reconcile();
    (store, gw, port)
}

/// How long until the peer closes `s` (EOF or reset), at most `limit`.
async fn time_to_close(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut b = [0u8; 64];
    match tokio::time::timeout(limit, s.read(&mut b)).await {
        Ok(Ok(0)) | Ok(Err(_)) => Some(started.elapsed()),
        Ok(Ok(_)) => panic!("the dataplane sent bytes"),
        Err(_) => None,
    }
}

/// A real ClientHello for `sni`.
fn client_hello(sni: &str) -> Vec<u8> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(sni.to_owned()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut out = Vec::new();
    conn.write_tls(&mut out).unwrap();
    out
}

/// A ClientHello sent a byte at a time, slower than the timeout allows, is closed at the
/// timeout; no upstream connection is opened.
#[tokio::test]
async fn a_slow_client_hello_is_closed_at_the_timeout() {
    let echo = TcpEcho::start().await;
    let limits = StreamLimits {
        client_hello_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let (_store, mut gw, port) = serve_one(v1::ListenerProtocol::Tls, echo.addr, limits, |_| {});
    let hello = client_hello("slow.example.com");
    let c = TcpStream::connect(at(port)).await.unwrap();
    let (mut rd, mut wr) = c.into_split();
    let started = Instant::now();
    // Four bytes a second: the whole hello would take over a minute.
    let writer = tokio::spawn(async move {
        for b in hello {
            if wr.write_all(&[b]).await.is_err() || started.elapsed() > Duration::from_secs(8) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(8), rd.read(&mut buf)).await;
    let closed_after = started.elapsed();
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    assert!(closed_after >= Duration::from_secs(2), "{closed_after:?}");
    assert!(closed_after < Duration::from_secs(6), "{closed_after:?}");
    writer.abort();
    assert_eq!(echo.accepted(), 0);
    gw.drain();
}

/// A ClientHello that announces 100 KB is closed on its first bytes, long before the
/// timeout, and a partial ClientHello followed by a close opens no upstream connection.
#[tokio::test]
async fn oversized_and_partial_client_hellos_open_nothing() {
    let echo = TcpEcho::start().await;
    let (store, mut gw, port) = serve_one(
        v1::ListenerProtocol::Tls,
        echo.addr,
        StreamLimits::default(),
        |_| {},
    );
    for _ in 0..50 {
        let mut c = TcpStream::connect(at(port)).await.unwrap();
        // Record of 16 KiB, handshake ClientHello of 100,000 bytes.
        let mut big = vec![22, 3, 1, 0x40, 0x00, 1, 0x01, 0x86, 0xa0];
        big.extend_from_slice(&[0u8; 64]);
        let _ = c.write_all(&big).await;
        let t = time_to_close(&mut c, Duration::from_secs(5)).await;
        assert!(t.is_some_and(|t| t < Duration::from_secs(5)), "{t:?}");
    }
    let hello = client_hello("partial.example.com");
    let mut c = TcpStream::connect(at(port)).await.unwrap();
    c.write_all(&hello[..hello.len() / 2]).await.unwrap();
    drop(c);
    eventually(Duration::from_secs(5), || {
        metric(
            &store.render_metrics(),
            "sluice_stream_connections_total",
            &[r#"outcome="client_hello""#],
        ) == Some(51.0)
    })
    .await;
    assert_eq!(echo.accepted(), 0);
    assert_eq!(
        metric(
            &store.render_metrics(),
            "sluice_stream_active_connections",
            &[]
        ),
        Some(0.0)
    );
    gw.drain();
}

/// HTTP bytes on a TLS port are closed at once.
#[tokio::test]
async fn http_on_a_tls_port_is_closed() {
    let echo = TcpEcho::start().await;
    let (_store, mut gw, port) = serve_one(
        v1::ListenerProtocol::Tls,
        echo.addr,
        StreamLimits::default(),
        |_| {},
    );
    let mut c = TcpStream::connect(at(port)).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(
        time_to_close(&mut c, Duration::from_secs(5))
            .await
            .is_some()
    );
    assert_eq!(echo.accepted(), 0);
    gw.drain();
}

/// PROXY headers that lie: from a peer outside the trusted CIDRs, missing, longer than the
/// v1 bound, a v2 length past the cap, a DGRAM family on TCP, or never finished: each is
/// closed without an upstream connection, the slow one at the header timeout.
#[tokio::test]
async fn lying_proxy_headers_are_closed() {
    let echo = TcpEcho::start().await;
    let limits = StreamLimits {
        proxy_header_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let (_s1, mut trusted_gw, port) =
        serve_one(v1::ListenerProtocol::Tcp, echo.addr, limits, |l| {
            l.accept_proxy_protocol = true;
            l.proxy_protocol_trusted = vec!["127.0.0.1/32".into()];
        });
    let (_s2, mut untrusted_gw, untrusted_port) =
        serve_one(v1::ListenerProtocol::Tcp, echo.addr, limits, |l| {
            l.accept_proxy_protocol = true;
            l.proxy_protocol_trusted = vec!["10.0.0.0/8".into()];
        });
    let good = sluice_dataplane::stream::proxy_protocol::encode(
        true,
        "192.0.2.1:1000".parse().unwrap(),
        at(port),
    );
    // From an untrusted peer, even a well-formed header.
    let mut c = TcpStream::connect(at(untrusted_port)).await.unwrap();
    let _ = c.write_all(&good).await;
    assert!(
        time_to_close(&mut c, Duration::from_secs(5))
            .await
            .is_some()
    );

    let mut v2_huge = b"\r\n\r\n\0\r\nQUIT\n\x21\x11\xff\xff".to_vec();
    v2_huge.extend_from_slice(&[0u8; 32]);
    let mut dgram = good.clone();
    dgram[13] = 0x12; // AF_INET, DGRAM
    let long_v1 = format!("PROXY TCP4 {} 1.1.1.1 1 2\r\n", "1".repeat(200));
    for lie in [
        b"SSH-2.0-OpenSSH_9.6\r\n".to_vec(),
        long_v1.into_bytes(),
        b"PROXY TCP4 1.2.3.4 5.6.7.8 70000 80\r\n".to_vec(),
        v2_huge,
        dgram,
    ] {
        let mut c = TcpStream::connect(at(port)).await.unwrap();
        let _ = c.write_all(&lie).await;
        let t = time_to_close(&mut c, Duration::from_secs(5)).await;
        // Closed on the bytes, not at the timeout.
        assert!(
            t.is_some_and(|t| t < Duration::from_millis(900)),
            "{:?}: {t:?}",
            String::from_utf8_lossy(&lie)
        );
    }
    // Never finished: closed at the header timeout.
    let mut c = TcpStream::connect(at(port)).await.unwrap();
    c.write_all(b"PROXY TCP4 1.2.3.4 ").await.unwrap();
    let t = time_to_close(&mut c, Duration::from_secs(5)).await;
    assert!(t.is_some_and(|t| t >= Duration::from_millis(900)), "{t:?}");
    assert_eq!(echo.accepted(), 0);
    // The good header works on the trusted port.
    let mut c = TcpStream::connect(at(port)).await.unwrap();
    let mut hello = good.clone();
    hello.extend_from_slice(b"ok");
    c.write_all(&hello).await.unwrap();
    let mut back = [0u8; 2];
    c.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ok");
    trusted_gw.drain();
    untrusted_gw.drain();
}

/// A UDP flood from many source ports of one IP opens at most the per-IP cap of sessions;
/// a client from another IP still gets answers.
#[tokio::test]
async fn a_udp_flood_from_one_ip_is_capped_and_others_are_served() {
    let echo = sluice_testkit::l4::UdpEcho::start().await;
    let limits = StreamLimits {
        udp_max_sessions_per_ip: 5,
        ..Default::default()
    };
    let (store, mut gw, port) = serve_one(v1::ListenerProtocol::Udp, echo.addr, limits, |_| {});
    let mut flood = Vec::new();
    for _ in 0..40 {
        let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        s.send_to(b"flood", at(port)).await.unwrap();
        flood.push(s);
    }
    eventually(Duration::from_secs(5), || {
        metric(&store.render_metrics(), "sluice_udp_sessions", &[]) == Some(5.0)
    })
    .await;
    let mut answered = 0;
    for s in &flood {
        let mut b = [0u8; 16];
        if tokio::time::timeout(Duration::from_millis(100), s.recv(&mut b))
            .await
            .is_ok()
        {
            answered += 1;
        }
    }
    assert_eq!(answered, 5);
    assert_eq!(echo.received(), 5);
    // Another loopback address is another client IP.
    let other = tokio::net::UdpSocket::bind("127.0.0.2:0").await.unwrap();
    other.send_to(b"legit", at(port)).await.unwrap();
    let mut b = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), other.recv(&mut b))
        .await
        .expect("the other client got no answer")
        .unwrap();
    assert_eq!(&b[..n], b"legit");
    assert_eq!(
        metric(
            &store.render_metrics(),
            "sluice_stream_connections_total",
            &[r#"outcome="session_limit""#]
        ),
        Some(35.0)
    );
    gw.drain();
}
