//! Gateway listeners sharing one per-Gateway port (`Listener.sections`) and frontend
//! client-certificate validation (`Listener.client_validation`): hostname isolation, 421
//! for a request whose host belongs to another listener than its SNI chose (HTTP/1.1 and
//! HTTP/2), a client without a certificate refused on a validating port and served with
//! the insecure fallback. Real sockets on loopback, real echo backends, certificates from
//! the test kit's PKI.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use sluice_dataplane::listener::gateway::GatewayListeners;
use sluice_dataplane::listener::server::Limits;
use sluice_proto::v1;
use sluice_testkit::EchoServer;
use sluice_testkit::pki::Ca;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

fn at(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn section(name: &str, hostname: &str, routes: &[&str]) -> v1::ListenerSection {
    v1::ListenerSection {
        name: name.into(),
        hostname: hostname.into(),
        routes: routes.iter().map(|r| (*r).to_owned()).collect(),
    }
}

fn on(mut r: v1::Route, hosts: &[&str], listener: &str) -> v1::Route {
    r.hosts = hosts.iter().map(|h| (*h).to_owned()).collect();
    r.listeners = vec![listener.into()];
    r
}

/// Opens the snapshot's per-Gateway ports.
fn open(dp: &Dataplane, snap: v1::Snapshot) -> GatewayListeners {
    dp.store.apply(sluice_proto::seal(snap, 1), vec![]).unwrap();
    let mut gw = GatewayListeners::new(
        "127.0.0.1".parse().unwrap(),
        1,
        Arc::clone(&dp.store),
        Limits::default(),
    );
    gw.reconcile();
    gw
}

fn server_of(r: &Resp) -> &str {
    h(r, "x-echo-server").unwrap_or("-")
}

/// The isolation conformance test's Gateway: four HTTP listeners on one port, a route on
/// each; a host reaches only the routes of its most specific listener.
#[tokio::test]
async fn a_host_reaches_only_the_routes_of_its_most_specific_listener() {
    let echo = EchoServer::start("v1", any()).await.unwrap();
    let dp = dataplane().await;
    let port = closed_port().port();
    let l = "ns/iso/80";
    let names = [
        ("empty-hostname", ""),
        ("wildcard-example-com", "*.example.com"),
        ("wildcard-foo-example-com", "*.foo.example.com"),
        ("abc-foo-example-com", "abc.foo.example.com"),
    ];
    let routes: Vec<v1::Route> = names
        .iter()
        .map(|(name, host)| {
            let hosts: &[&str] = if host.is_empty() { &[] } else { &[host] };
            on(
                route(&format!("ns/{name}/r0"), &[&format!("/{name}*")], "u"),
                hosts,
                l,
            )
        })
        .collect();
    let mut sections: Vec<v1::ListenerSection> = names
        .iter()
        .map(|(name, host)| section(name, host, &[&format!("ns/{name}/r0")]))
        .collect();
    sections.sort_by(|a, b| a.name.cmp(&b.name));
    let snap = v1::Snapshot {
        routes,
        upstreams: vec![upstream("u", &[(echo.addr, 1)])],
        listeners: vec![v1::Listener {
            id: l.into(),
            source: "Gateway ns/iso".into(),
            port: u32::from(port),
            sections,
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut gw = open(&dp, snap);
    let mut failures = Vec::new();
    for host in [
        "bar.com",
        "bar.example.com",
        "bar.foo.example.com",
        "abc.foo.example.com",
    ] {
        let served_by = match host {
            "bar.com" => "empty-hostname",
            "bar.example.com" => "wildcard-example-com",
            "bar.foo.example.com" => "wildcard-foo-example-com",
            _ => "abc-foo-example-com",
        };
        for (name, _) in names {
            let r = get(at(port), host, &format!("/{name}")).await;
            let want = if name == served_by {
                StatusCode::OK
            } else {
                StatusCode::NOT_FOUND
            };
            if r.status != want {
                failures.push(format!("{host} /{name}: {} (want {want})", r.status));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    gw.drain();
}

fn client(
    ca: &CertificateDer<'static>,
    alpn: &[u8],
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
    let mut config = match identity {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key).unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(config)
}

/// One request with `host` over a fresh TLS connection for `sni`, HTTP/1.1 or HTTP/2 as
/// `alpn` says; `Err` when the handshake or the request fails.
async fn over_tls(
    addr: SocketAddr,
    sni: &str,
    host: &str,
    config: Arc<ClientConfig>,
) -> Result<(StatusCode, String), String> {
    let h2 = config.alpn_protocols.first().map(Vec::as_slice) == Some(b"h2");
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let tls = TlsConnector::from(config)
        .connect(ServerName::try_from(sni.to_owned()).unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let resp = if h2 {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = Request::get(format!("https://{host}/x"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        sender.send_request(req).await.map_err(|e| e.to_string())?
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = Request::get("/x")
            .header("host", host)
            .body(Full::new(Bytes::new()))
            .unwrap();
        sender.send_request(req).await.map_err(|e| e.to_string())?
    };
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    let server = serde_json::from_slice::<serde_json::Value>(&body.to_bytes())
        .ok()
        .and_then(|j| j["server"].as_str().map(str::to_owned))
        .unwrap_or_default();
    Ok((status, server))
}

/// The misdirected-requests conformance test's Gateway: four HTTPS listeners on one port
/// sharing one certificate; the SNI picks a listener and a request whose host picks another
/// gets 421, over HTTP/1.1 and HTTP/2 alike.
#[tokio::test]
async fn a_host_of_another_listener_than_the_sni_chose_gets_421() {
    let ca = Ca::new("test CA");
    let leaf = ca.leaf(&[
        "example.org",
        "second-example.org",
        "*.wildcard.org",
        "unknown-example.org",
    ]);
    let backends = [
        EchoServer::start("v1", any()).await.unwrap(),
        EchoServer::start("v2", any()).await.unwrap(),
        EchoServer::start("v3", any()).await.unwrap(),
        EchoServer::start("v4", any()).await.unwrap(),
    ];
    let dp = dataplane().await;
    let port = closed_port().port();
    let l = "ns/tls/443";
    let cert = |id: &str, hosts: &[&str]| v1::TlsCertificate {
        id: id.into(),
        source: format!("Gateway ns/tls listener {id}"),
        hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        cert_chain_pem: leaf.chain_pem.clone(),
        private_key_pem: leaf.key_pem.clone(),
        client_auth: None,
    };
    let snap = v1::Snapshot {
        routes: vec![
            on(route("ns/r1/r0", &["/*"], "v1"), &["example.org"], l),
            on(route("ns/r2/r0", &["/*"], "v2"), &["second-example.org"], l),
            on(route("ns/r3/r0", &["/*"], "v3"), &["*.wildcard.org"], l),
            on(
                route("ns/r4/r0", &["/*"], "v4"),
                &["fourth-example.wildcard.org"],
                l,
            ),
        ],
        upstreams: backends
            .iter()
            .enumerate()
            .map(|(i, b)| upstream(&format!("v{}", i + 1), &[(b.addr, 1)]))
            .collect(),
        listeners: vec![v1::Listener {
            id: l.into(),
            source: "Gateway ns/tls".into(),
            port: u32::from(port),
            tls: true,
            tls_certificates: vec![
                cert("ns/tls/fourth", &["fourth-example.wildcard.org"]),
                cert("ns/tls/second", &["second-example.org"]),
                cert("ns/tls/wildcard", &["*.wildcard.org"]),
            ],
            default_certificate: Some(cert("ns/tls/https", &[])),
            sections: vec![
                section("https", "", &["ns/r1/r0"]),
                section("https-with-hostname", "second-example.org", &["ns/r2/r0"]),
                section(
                    "https-with-hostname-matching-wildcard",
                    "fourth-example.wildcard.org",
                    &["ns/r4/r0"],
                ),
                section(
                    "https-with-wildcard-hostname",
                    "*.wildcard.org",
                    &["ns/r3/r0"],
                ),
            ],
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut gw = open(&dp, snap);
    let cases: &[(&str, &str, u16, &str)] = &[
        ("example.org", "example.org", 200, "v1"),
        ("example.org", "second-example.org", 421, ""),
        ("example.org", "unknown-example.org", 404, ""),
        ("second-example.org", "second-example.org", 200, "v2"),
        ("second-example.org", "example.org", 421, ""),
        ("second-example.org", "unknown-example.org", 421, ""),
        (
            "third-example.wildcard.org",
            "third-example.wildcard.org",
            200,
            "v3",
        ),
        (
            "third-example.wildcard.org",
            "fith-example.wildcard.org",
            200,
            "v3",
        ),
        (
            "third-example.wildcard.org",
            "fourth-example.wildcard.org",
            421,
            "",
        ),
        ("third-example.wildcard.org", "second-example.org", 421, ""),
        ("third-example.wildcard.org", "unknown-example.org", 421, ""),
        (
            "fourth-example.wildcard.org",
            "fourth-example.wildcard.org",
            200,
            "v4",
        ),
        (
            "fourth-example.wildcard.org",
            "fith-example.wildcard.org",
            421,
            "",
        ),
        ("unknown-example.org", "example.org", 200, "v1"),
        ("unknown-example.org", "unknown-example.org", 404, ""),
    ];
    let mut failures = Vec::new();
    for alpn in [&b"http/1.1"[..], &b"h2"[..]] {
        let config = client(&ca.der, alpn, None);
        for &(sni, host, status, server) in cases {
            let got = over_tls(at(port), sni, host, Arc::clone(&config)).await;
            let ok = matches!(&got, Ok((s, by)) if s.as_u16() == status && (server.is_empty() || by == server));
            if !ok {
                failures.push(format!(
                    "{} sni {sni} host {host}: want {status} {server}, got {got:?}",
                    String::from_utf8_lossy(alpn)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    gw.drain();
}

/// A port with frontend validation: without a client certificate the handshake (or the
/// first request, TLS 1.3) fails under `AllowValidOnly`; with one from the CA it is
/// served; under `AllowInsecureFallback` clients without one, and with one from another CA,
/// are served too.
#[tokio::test]
async fn a_validating_port_refuses_clients_without_a_certificate_unless_insecure_fallback() {
    let server_ca = Ca::new("server CA");
    let leaf = server_ca.leaf(&["mtls.example.org"]);
    let client_ca = Ca::new("client CA");
    let good = client_ca.leaf(&["client"]);
    let other = Ca::new("other CA").leaf(&["stranger"]);
    let identity = |c: &sluice_testkit::pki::Cert| {
        Some((
            vec![c.der.clone()],
            PrivateKeyDer::try_from(c.key_der.clone()).unwrap(),
        ))
    };
    let echo = EchoServer::start("v1", any()).await.unwrap();
    let dp = dataplane().await;
    let (strict, fallback) = (closed_port().port(), closed_port().port());
    let listener = |id: &str, port: u16, insecure_fallback: bool| v1::Listener {
        id: id.into(),
        source: "Gateway ns/mtls".into(),
        port: u32::from(port),
        tls: true,
        default_certificate: Some(v1::TlsCertificate {
            id: format!("{id}/https"),
            source: "Gateway ns/mtls listener https".into(),
            hosts: Vec::new(),
            cert_chain_pem: leaf.chain_pem.clone(),
            private_key_pem: leaf.key_pem.clone(),
            client_auth: None,
        }),
        client_validation: Some(v1::FrontendValidation {
            ca_pem: client_ca.pem.clone(),
            insecure_fallback,
        }),
        ..Default::default()
    };
    let snap = v1::Snapshot {
        routes: vec![{
            let mut r = route("ns/web/r0", &["/*"], "u");
            r.listeners = vec!["ns/mtls/443".into(), "ns/mtls/8443".into()];
            r
        }],
        upstreams: vec![upstream("u", &[(echo.addr, 1)])],
        listeners: vec![
            listener("ns/mtls/443", strict, false),
            listener("ns/mtls/8443", fallback, true),
        ],
        ..Default::default()
    };
    let mut gw = open(&dp, snap);
    let host = "mtls.example.org";
    for alpn in [&b"http/1.1"[..], &b"h2"[..]] {
        let anonymous = over_tls(at(strict), host, host, client(&server_ca.der, alpn, None)).await;
        assert!(
            anonymous.is_err(),
            "served without a certificate: {anonymous:?}"
        );
        let stranger = over_tls(
            at(strict),
            host,
            host,
            client(&server_ca.der, alpn, identity(&other)),
        )
        .await;
        assert!(
            stranger.is_err(),
            "served another CA's client: {stranger:?}"
        );
        let valid = over_tls(
            at(strict),
            host,
            host,
            client(&server_ca.der, alpn, identity(&good)),
        )
        .await;
        assert_eq!(valid.unwrap().0, StatusCode::OK);
        for id in [None, identity(&good), identity(&other)] {
            let has = id.is_some();
            let r = over_tls(at(fallback), host, host, client(&server_ca.der, alpn, id)).await;
            assert_eq!(r.unwrap().0, StatusCode::OK, "fallback, certificate: {has}");
        }
    }
    gw.drain();
}

/// Sanity: a listener without sections keeps serving every route naming it for every host.
#[tokio::test]
async fn a_port_without_sections_is_not_isolated() {
    let echo = EchoServer::start("v1", any()).await.unwrap();
    let dp = dataplane().await;
    let port = closed_port().port();
    let snap = v1::Snapshot {
        routes: vec![on(route("ns/r/r0", &["/*"], "u"), &[], "ns/gw/80")],
        upstreams: vec![upstream("u", &[(echo.addr, 1)])],
        listeners: vec![v1::Listener {
            id: "ns/gw/80".into(),
            source: "Gateway ns/gw".into(),
            port: u32::from(port),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut gw = open(&dp, snap);
    let r = get(at(port), "anything.test", "/x").await;
    assert_eq!((r.status, server_of(&r)), (StatusCode::OK, "v1"));
    gw.drain();
}
