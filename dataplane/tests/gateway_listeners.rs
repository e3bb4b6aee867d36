//! Per-Gateway ports (`Snapshot.listeners`): the dataplane opens a port for each listener
//! of the snapshot, each reaching only its own routes and serving only its own
//! certificates, and closes the ports a later snapshot drops. Real sockets on loopback,
//! real echo backends, certificates generated here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::*;
use http::StatusCode;
use rustls::ClientConfig;
use rustls::pki_types::{CertificateDer, ServerName};
use sluice_dataplane::listener::gateway::GatewayListeners;
use sluice_dataplane::listener::server::Limits;
use sluice_dataplane::upstream::tls::NoVerification;
use sluice_proto::v1;
use sluice_testkit::EchoServer;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

fn on(mut r: v1::Route, host: &str, listeners: &[&str]) -> v1::Route {
    r.hosts = vec![host.into()];
    r.listeners = listeners.iter().map(|s| s.to_string()).collect();
    r
}

fn self_signed(name: &str) -> (v1::TlsCertificate, CertificateDer<'static>) {
    let cert = sluice_testkit::pki::self_signed(&[name]);
    (
        v1::TlsCertificate {
            id: format!("cert/{name}"),
            source: format!("test {name}"),
            hosts: Vec::new(),
            cert_chain_pem: cert.pem,
            private_key_pem: cert.key_pem,
            client_auth: None,
        },
        cert.der,
    )
}

fn listener(id: &str, port: u16, tls: Option<v1::TlsCertificate>) -> v1::Listener {
    v1::Listener {
        id: id.into(),
        source: format!("Gateway {id}"),
        port: u32::from(port),
        tls: tls.is_some(),
        tls_certificates: Vec::new(),
        default_certificate: tls,
        ..Default::default()
    }
}

/// The certificate a TLS handshake on `addr` gets for `sni`, or the error.
async fn served(addr: SocketAddr, sni: &str) -> Result<CertificateDer<'static>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(sni.to_owned()).unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    Ok(tls.get_ref().1.peer_certificates().unwrap()[0].clone())
}

fn server_of(r: &Resp) -> &str {
    h(r, "x-echo-server").unwrap_or("-")
}

/// Two Gateways route the same host and path to different backends on their own ports; the
/// dataplane's own listener serves neither; each TLS port has its own default certificate;
/// a port the next snapshot drops is closed and the others keep serving.
#[tokio::test]
async fn each_gateway_port_serves_only_its_routes_and_certificates() {
    let a = EchoServer::start("a", any()).await.unwrap();
    let b = EchoServer::start("b", any()).await.unwrap();
    let own = EchoServer::start("own", any()).await.unwrap();
    let dp = dataplane().await;
    let (pa, pb, ptls_a, ptls_b) = (
        closed_port().port(),
        closed_port().port(),
        closed_port().port(),
        closed_port().port(),
    );
    let (cert_a, der_a) = self_signed("a.gateway.test");
    let (cert_b, der_b) = self_signed("b.gateway.test");
    let build = |version: u64, with_b: bool| {
        let mut routes = vec![
            on(
                route("gw/a/r", &["/*"], "a"),
                "www.example.com",
                &["ns/a/443", "ns/a/80"],
            ),
            route("own/r", &["/own"], "own"),
        ];
        let mut listeners = vec![
            listener("ns/a/443", ptls_a, Some(cert_a.clone())),
            listener("ns/a/80", pa, None),
        ];
        if with_b {
            routes.push(on(
                route("gw/b/r", &["/*"], "b"),
                "www.example.com",
                &["ns/b/443", "ns/b/80"],
            ));
            listeners.push(listener("ns/b/443", ptls_b, Some(cert_b.clone())));
            listeners.push(listener("ns/b/80", pb, None));
        }
        let mut snap = v1::Snapshot {
            routes,
            upstreams: vec![
                upstream("a", &[(a.addr, 1)]),
                upstream("b", &[(b.addr, 1)]),
                upstream("own", &[(own.addr, 1)]),
            ],
            listeners,
            ..Default::default()
        };
        snap = sluice_proto::seal(snap, version);
        snap
    };
    dp.store.apply(build(1, true), vec![]).unwrap();
    let mut gw = GatewayListeners::new(
        "127.0.0.1".parse().unwrap(),
        1,
        Arc::clone(&dp.store),
        Limits::default(),
    );
    gw.reconcile();
    assert_eq!(
        gw.open_ids(),
        vec!["ns/a/443", "ns/a/80", "ns/b/443", "ns/b/80"]
    );
    let at = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));

    // Same host and path, two Gateways, two backends.
    let r = get(at(pa), "www.example.com", "/x").await;
    assert_eq!((r.status, server_of(&r)), (StatusCode::OK, "a"));
    let r = get(at(pb), "www.example.com", "/x").await;
    assert_eq!((r.status, server_of(&r)), (StatusCode::OK, "b"));
    // A Gateway port does not reach the dataplane's own routes, nor they its routes.
    assert_eq!(
        get(at(pa), "www.example.com", "/own").await.status,
        StatusCode::OK
    );
    assert_eq!(
        server_of(&get(at(pa), "www.example.com", "/own").await),
        "a"
    );
    assert_eq!(
        get(at(pa), "other.example.com", "/own").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(dp.addr, "www.example.com", "/x").await.status,
        StatusCode::NOT_FOUND
    );
    let r = get(dp.addr, "www.example.com", "/own").await;
    assert_eq!((r.status, server_of(&r)), (StatusCode::OK, "own"));

    // Each TLS port serves its own Gateway's default certificate.
    assert_eq!(served(at(ptls_a), "www.example.com").await.unwrap(), der_a);
    assert_eq!(served(at(ptls_b), "www.example.com").await.unwrap(), der_b);

    // Gateway b goes: its ports close, a's keep serving.
    dp.store.apply(build(2, false), vec![]).unwrap();
    gw.reconcile();
    assert_eq!(gw.open_ids(), vec!["ns/a/443", "ns/a/80"]);
    let mut closed = false;
    for _ in 0..100 {
        if TcpStream::connect(at(pb)).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(closed, "port {pb} of the removed Gateway still accepts");
    let r = get(at(pa), "www.example.com", "/x").await;
    assert_eq!((r.status, server_of(&r)), (StatusCode::OK, "a"));
    gw.drain();
}

/// A snapshot whose route names a listener it does not carry, or with two listeners on one
/// port, is refused whole with the listener named; the last good one stays.
#[tokio::test]
async fn bad_listeners_are_refused_with_the_field_named() {
    let dp = dataplane().await;
    let own = EchoServer::start("own", any()).await.unwrap();
    let good = snapshot(
        1,
        vec![route("own/r", &["/*"], "own")],
        vec![upstream("own", &[(own.addr, 1)])],
    );
    dp.store.apply(good.clone(), vec![]).unwrap();

    let mut unknown = good.clone();
    unknown.routes[0].listeners = vec!["ns/nope/80".into()];
    let err = dp
        .store
        .apply(sluice_proto::seal(unknown, 2), vec![])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("route own/r: listeners[0]: unknown listener `ns/nope/80`"),
        "{err}"
    );

    let mut twice = good.clone();
    twice.listeners = vec![
        listener("ns/a/80", 20080, None),
        listener("ns/b/80", 20080, None),
    ];
    let err = dp
        .store
        .apply(sluice_proto::seal(twice, 3), vec![])
        .unwrap_err()
        .to_string();
    assert!(err.contains("listener ns/b/80: port"), "{err}");

    let mut plain_with_cert = good;
    let mut l = listener("ns/a/80", 20081, None);
    l.default_certificate = Some(self_signed("x.test").0);
    plain_with_cert.listeners = vec![l];
    let err = dp
        .store
        .apply(sluice_proto::seal(plain_with_cert, 4), vec![])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("certificates on a listener without TLS"),
        "{err}"
    );

    // The good snapshot still serves.
    let r = get(dp.addr, "any.test", "/x").await;
    assert_eq!((r.status, server_of(&r)), (StatusCode::OK, "own"));
}
