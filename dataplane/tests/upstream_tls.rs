//! TLS to upstreams (schemes `https` and `grpcs`) against real TLS origins whose
//! certificates are generated here with rcgen: ALPN h2 vs HTTP/1.1, CA verification, SNI,
//! client certificates (mTLS), and gRPC over TLS.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, DnType, ExtendedKeyUsagePurpose, IsCa, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sluice_proto::v1;
use sluice_testkit::grpc::{EchoClient, EchoRequest, GrpcEchoServer};
use sluice_testkit::pki::{self, Ca};
use tokio::net::TcpListener;

/// A certificate authority made for one test, with the key usages a real one declares.
fn ca(name: &str) -> Ca {
    let mut p = pki::params_for(&[]);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ca::from_params(p)
}

/// A leaf certificate and key (PEM) for `sans` (DNS names or IP addresses).
fn leaf(ca: &Ca, cn: &str, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> (String, String) {
    let mut p = pki::params_for(sans);
    p.distinguished_name.push(DnType::CommonName, cn);
    p.extended_key_usages = vec![usage];
    let cert = ca.sign(p);
    (cert.pem, cert.key_pem)
}

fn server_leaf(ca: &Ca, sans: &[&str]) -> (String, String) {
    leaf(ca, "upstream", sans, ExtendedKeyUsagePurpose::ServerAuth)
}

/// A TLS origin answering every request with JSON: the HTTP version it saw, the SNI the
/// client sent, and the common name... presence of the client certificate.
async fn tls_origin(
    (cert, key): (String, String),
    alpn: &[&[u8]],
    client_ca: Option<&str>,
) -> SocketAddr {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots.add(c.unwrap()).unwrap();
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let (_, session) = tls.get_ref();
                let sni = session.server_name().map(str::to_owned);
                let client_cert = session.peer_certificates().is_some_and(|c| !c.is_empty());
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let body = serde_json::json!({
                        "version": format!("{:?}", req.version()),
                        "sni": sni,
                        "client_cert": client_cert,
                        "path": req.uri().path(),
                        "x_forwarded_for": req.headers().get("x-forwarded-for")
                            .map(|v| v.to_str().unwrap().to_owned()),
                        "te": req.headers().get("te").map(|v| v.to_str().unwrap().to_owned()),
                    });
                    async move {
                        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(
                            body.to_string(),
                        ))))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

fn tls_upstream(
    scheme: v1::Scheme,
    backend: SocketAddr,
    host: Option<&str>,
    tls: v1::UpstreamTls,
) -> v1::Upstream {
    let mut up = upstream("u", &[(backend, 1)]);
    up.scheme = scheme as i32;
    if let Some(h) = host {
        up.endpoints[0].host = h.to_owned();
    }
    up.tls = Some(tls);
    up
}

async fn dataplane_with(up: v1::Upstream) -> Dataplane {
    let dp = dataplane().await;
    dp.store
        .apply(
            snapshot(1, vec![route("default/r/r1", &["/*"], "u")], vec![up]),
            vec![],
        )
        .unwrap();
    dp
}

#[tokio::test]
async fn https_upstream_speaks_h2_when_alpn_offers_it_and_sends_the_sni() {
    let ca = ca("test ca");
    let origin = tls_origin(
        server_leaf(&ca, &["upstream.test"]),
        &[b"h2", b"http/1.1"],
        None,
    )
    .await;
    let dp = dataplane_with(tls_upstream(
        v1::Scheme::Https,
        origin,
        None,
        v1::UpstreamTls {
            ca_pem: ca.pem.clone(),
            sni: "upstream.test".into(),
            ..Default::default()
        },
    ))
    .await;
    for _ in 0..3 {
        let req = http::Request::get("/a")
            .header("host", "client.example")
            .header("te", "trailers")
            .header("connection", "te")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = send(dp.addr, req).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        let body = resp.json();
        assert_eq!(body["version"], "HTTP/2.0");
        // `te: trailers` is the one hop-by-hop header HTTP/2 (and gRPC) needs.
        assert_eq!(body["te"], "trailers");
        assert_eq!(body["sni"], "upstream.test");
        assert_eq!(body["path"], "/a");
        assert_eq!(body["x_forwarded_for"], "127.0.0.1");
    }
}

#[tokio::test]
async fn https_upstream_falls_back_to_http11_and_verifies_an_ip_endpoint() {
    let ca = ca("test ca");
    let origin = tls_origin(server_leaf(&ca, &["127.0.0.1"]), &[b"http/1.1"], None).await;
    let dp = dataplane_with(tls_upstream(
        v1::Scheme::Https,
        origin,
        None,
        v1::UpstreamTls {
            ca_pem: ca.pem.clone(),
            ..Default::default()
        },
    ))
    .await;
    for _ in 0..3 {
        let resp = get(dp.addr, "client.example", "/b").await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        let body = resp.json();
        assert_eq!(body["version"], "HTTP/1.1");
        // No SNI for an IP address.
        assert_eq!(body["sni"], serde_json::Value::Null);
    }
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused_with_502() {
    let real = ca("real ca");
    let other = ca("other ca");
    let origin = tls_origin(server_leaf(&real, &["127.0.0.1"]), &[b"h2"], None).await;
    let dp = dataplane_with(tls_upstream(
        v1::Scheme::Https,
        origin,
        None,
        v1::UpstreamTls {
            ca_pem: other.pem.clone(),
            ..Default::default()
        },
    ))
    .await;
    let resp = get(dp.addr, "client.example", "/").await;
    assert_eq!(resp.status, 502);
    assert!(
        resp.text()
            .contains("TLS handshake with the upstream failed"),
        "{}",
        resp.text()
    );

    // A name the certificate does not carry is refused too.
    let dp = dataplane_with(tls_upstream(
        v1::Scheme::Https,
        origin,
        None,
        v1::UpstreamTls {
            ca_pem: real.pem.clone(),
            sni: "elsewhere.test".into(),
            ..Default::default()
        },
    ))
    .await;
    let resp = get(dp.addr, "client.example", "/").await;
    assert_eq!(resp.status, 502);
    assert!(resp.text().contains("TLS handshake"), "{}", resp.text());
}

#[tokio::test]
async fn client_certificate_is_presented_to_an_upstream_that_requires_one() {
    let ca = ca("test ca");
    let origin = tls_origin(
        server_leaf(&ca, &["127.0.0.1"]),
        &[b"h2", b"http/1.1"],
        Some(&ca.pem),
    )
    .await;
    let (cert, key) = leaf(&ca, "sluice", &[], ExtendedKeyUsagePurpose::ClientAuth);
    let dp = dataplane_with(tls_upstream(
        v1::Scheme::Https,
        origin,
        None,
        v1::UpstreamTls {
            ca_pem: ca.pem.clone(),
            client_cert_pem: cert,
            client_key_pem: key,
            ..Default::default()
        },
    ))
    .await;
    let resp = get(dp.addr, "client.example", "/").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["client_cert"], true);

    // Without the client certificate the upstream refuses the connection.
    let dp = dataplane_with(tls_upstream(
        v1::Scheme::Https,
        origin,
        None,
        v1::UpstreamTls {
            ca_pem: ca.pem.clone(),
            ..Default::default()
        },
    ))
    .await;
    let resp = get(dp.addr, "client.example", "/").await;
    assert_eq!(resp.status, 502, "{}", resp.text());
}

#[tokio::test]
async fn grpc_over_tls_to_a_tonic_server() {
    let ca = ca("test ca");
    let (cert, key) = server_leaf(&ca, &["grpc.test"]);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = listener.local_addr().unwrap();
    let tls = tonic::transport::ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(cert, key));
    tokio::spawn(
        tonic::transport::Server::builder()
            .tls_config(tls)
            .unwrap()
            .add_service(GrpcEchoServer::service("tls"))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let dp = dataplane().await;
    let mut up = tls_upstream(
        v1::Scheme::Grpcs,
        origin,
        None,
        v1::UpstreamTls {
            ca_pem: ca.pem.clone(),
            sni: "grpc.test".into(),
            ..Default::default()
        },
    );
    up.id = "g".into();
    dp.store
        .apply(
            snapshot(
                1,
                vec![route("default/g/r1", &["/sluice.test.v1.Echo/*"], "g")],
                vec![up],
            ),
            vec![],
        )
        .unwrap();
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", dp.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = EchoClient::new(channel);
    let reply = client
        .unary(EchoRequest {
            message: "over tls".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(reply.metadata().get("x-echo-server").unwrap(), "tls");
    assert_eq!(reply.into_inner().message, "over tls");
}

#[tokio::test]
async fn unusable_tls_settings_reject_the_snapshot_and_keep_the_last_good_one() {
    let backend = sluice_testkit::EchoServer::start("e", "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dp = dataplane_to("/*", backend.addr).await;
    let bad = tls_upstream(
        v1::Scheme::Https,
        backend.addr,
        None,
        v1::UpstreamTls {
            ca_pem: "-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n".into(),
            ..Default::default()
        },
    );
    let err = dp
        .store
        .apply(
            snapshot(2, vec![route("default/r/r1", &["/*"], "u")], vec![bad]),
            vec![],
        )
        .unwrap_err();
    assert!(
        err.to_string().starts_with("upstream u: tls.ca_pem:"),
        "{err}"
    );
    assert_eq!(get(dp.addr, "a", "/").await.status, 200);
}

/// A TLS origin (HTTP/1.1) whose `/healthz` answers 200 while `healthy` is set and 500
/// otherwise; it records the SNI of every handshake in `snis`.
async fn tls_health_origin(
    (cert, key): (String, String),
    healthy: Arc<std::sync::atomic::AtomicBool>,
    snis: Arc<std::sync::Mutex<Vec<Option<String>>>>,
) -> SocketAddr {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            let healthy = Arc::clone(&healthy);
            let snis = Arc::clone(&snis);
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                snis.lock()
                    .unwrap()
                    .push(tls.get_ref().1.server_name().map(str::to_owned));
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let ok = !req.uri().path().starts_with("/healthz")
                        || healthy.load(std::sync::atomic::Ordering::SeqCst);
                    async move {
                        let mut resp = http::Response::new(Full::new(Bytes::from("tls")));
                        if !ok {
                            *resp.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                        }
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

/// An https upstream of `origin` with active `type: https` probes of `/healthz` (one probe
/// flips the state, every second) whose Host is `probe_host`.
fn https_probed(
    origin: SocketAddr,
    ca_pem: &str,
    probe_host: &str,
    verify: Option<bool>,
) -> v1::Upstream {
    let mut up = tls_upstream(
        v1::Scheme::Https,
        origin,
        None,
        v1::UpstreamTls {
            ca_pem: ca_pem.to_owned(),
            ..Default::default()
        },
    );
    let mut hc = health_check(false);
    let active = hc.active.as_mut().unwrap();
    active.r#type = v1::UpstreamHealthCheckType::Https as i32;
    active.host = probe_host.to_owned();
    active.https_verify_certificate = verify;
    up.health_check = Some(hc);
    up
}

fn endpoint_healthy(dp: &Dataplane, origin: SocketAddr) -> Option<f64> {
    metric(
        &dp.store.metrics().render(),
        "sluice_upstream_endpoint_healthy",
        &["upstream=\"u\"", &format!("endpoint=\"{origin}\"")],
    )
}

#[tokio::test]
async fn https_probes_eject_an_endpoint_whose_healthz_fails_over_tls_and_restore_it() {
    let ca = ca("probe ca");
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let snis = Arc::new(std::sync::Mutex::new(Vec::new()));
    // The certificate names only `probe.test`: a probe that does not send the probe's host as
    // SNI and verify that name fails.
    let origin = tls_health_origin(
        server_leaf(&ca, &["probe.test"]),
        Arc::clone(&healthy),
        Arc::clone(&snis),
    )
    .await;
    let dp = dataplane_with(https_probed(origin, &ca.pem, "probe.test:8443", None)).await;
    let wait = Duration::from_secs(6);
    // Probes run and succeed: the endpoint stays in.
    assert!(eventually(wait, || !snis.lock().unwrap().is_empty()).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(endpoint_healthy(&dp, origin), Some(1.0));
    assert_eq!(
        snis.lock().unwrap()[0].as_deref(),
        Some("probe.test"),
        "the probe's host is the SNI"
    );

    healthy.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(
        eventually(wait, || endpoint_healthy(&dp, origin) == Some(0.0)).await,
        "a 500 from /healthz over TLS ejects the endpoint"
    );
    healthy.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(
        eventually(wait, || endpoint_healthy(&dp, origin) == Some(1.0)).await,
        "a 200 restores it"
    );
}

#[tokio::test]
async fn an_https_probe_that_cannot_verify_the_certificate_ejects_unless_verification_is_off() {
    let real = ca("real ca");
    let other = ca("other ca");
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let snis = Arc::new(std::sync::Mutex::new(Vec::new()));
    let origin = tls_health_origin(
        server_leaf(&real, &["127.0.0.1"]),
        Arc::clone(&healthy),
        Arc::clone(&snis),
    )
    .await;
    // `/healthz` answers 200, but the upstream trusts another CA.
    let dp = dataplane_with(https_probed(origin, &other.pem, "", None)).await;
    let wait = Duration::from_secs(6);
    assert!(
        eventually(wait, || endpoint_healthy(&dp, origin) == Some(0.0)).await,
        "a certificate that fails verification marks the endpoint unhealthy"
    );
    // `strictTLS: false` (https_verify_certificate = false): the same origin is healthy.
    dp.store
        .apply(
            snapshot(
                2,
                vec![route("default/r/r1", &["/*"], "u")],
                vec![https_probed(origin, &other.pem, "", Some(false))],
            ),
            vec![],
        )
        .unwrap();
    assert!(
        eventually(wait, || endpoint_healthy(&dp, origin) == Some(1.0)).await,
        "without verification the probe succeeds"
    );
}

#[tokio::test]
async fn a_dead_tls_endpoint_is_retried_on_another_and_ejected_by_the_passive_check() {
    let ca = ca("test ca");
    let origin = tls_origin(
        server_leaf(&ca, &["127.0.0.1"]),
        &[b"h2", b"http/1.1"],
        None,
    )
    .await;
    let dead = closed_port();
    let mut up = tls_upstream(
        v1::Scheme::Https,
        origin,
        None,
        v1::UpstreamTls {
            ca_pem: ca.pem.clone(),
            ..Default::default()
        },
    );
    up.endpoints.insert(
        0,
        v1::Endpoint {
            host: "127.0.0.1".into(),
            port: u32::from(dead.port()),
            weight: 1,
        },
    );
    up.health_check = Some(passive_check());
    let dp = dataplane_with(up).await;
    for i in 0..6 {
        let resp = get(dp.addr, "client.example", &format!("/t/{i}")).await;
        assert_eq!(resp.status, 200, "request {i}: {}", resp.text());
        assert_eq!(resp.json()["path"], format!("/t/{i}"));
    }
    assert_eq!(
        health_of(&dp, "u", dead),
        Some(0.0),
        "dead endpoint ejected"
    );
    assert_eq!(health_of(&dp, "u", origin), Some(1.0));
}

/// A TLS origin (ALPN `http/1.1`) that answers every request on a connection with the raw
/// bytes `answer`, whatever they say.
async fn raw_tls_origin(ca: &Ca, answer: &'static [u8]) -> SocketAddr {
    let (cert, key) = server_leaf(ca, &["127.0.0.1"]);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Ok(n) = tls.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        seen.clear();
                        if tls.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// HTTPS upstreams that speak HTTP/1.1 go through the same client as plain ones, with its
/// strict framing: a list as `Content-Length` (which hyper's client took as one length) is
/// a 502, as on plain HTTP; a well-framed answer passes.
#[tokio::test]
async fn https_http11_responses_get_the_strict_framing_of_the_plain_path() {
    let ca = ca("test ca");
    let tls = || v1::UpstreamTls {
        ca_pem: ca.pem.clone(),
        ..Default::default()
    };
    let bad = raw_tls_origin(&ca, b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello").await;
    let dp = dataplane_with(tls_upstream(v1::Scheme::Https, bad, None, tls())).await;
    let resp = get(dp.addr, "client.example", "/").await;
    assert_eq!(resp.status, 502, "{}", resp.text());

    let good = raw_tls_origin(&ca, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello").await;
    let dp = dataplane_with(tls_upstream(v1::Scheme::Https, good, None, tls())).await;
    for _ in 0..3 {
        let resp = get(dp.addr, "client.example", "/").await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.text(), "hello");
    }
}
