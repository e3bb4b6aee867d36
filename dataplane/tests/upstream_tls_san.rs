//! Subject-alternative-name verification of upstream certificates (BackendTLSPolicy
//! `subjectAltNames`, ApisixUpstream `tlsVerify.subjectAltNames`): with SANs, the certificate
//! must carry one of them (a DNS name or a URI) instead of the SNI name, which is still sent.
//! The origins here speak TLS only and record whether any connection opened with anything
//! but a TLS handshake, so "never plain text to a TLS backend" is observed, not assumed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, DnType, ExtendedKeyUsagePurpose, IsCa, KeyUsagePurpose, SanType};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sluice_proto::v1;
use sluice_testkit::pki::{self, Ca};
use tokio::net::TcpListener;

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

/// A server certificate with DNS SANs `dns` and URI SANs `uris`.
fn server_leaf(ca: &Ca, dns: &[&str], uris: &[&str]) -> (String, String) {
    let mut p = pki::params_for(dns);
    for u in uris {
        p.subject_alt_names
            .push(SanType::URI((*u).try_into().unwrap()));
    }
    p.distinguished_name.push(DnType::CommonName, "backend");
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = ca.sign(p);
    (cert.pem, cert.key_pem)
}

/// What a TLS-only origin saw.
#[derive(Default)]
struct Seen {
    /// Connections whose first byte was not a TLS handshake record (0x16).
    plain_text: AtomicUsize,
    /// Requests served over TLS.
    served: AtomicUsize,
}

/// A TLS-only HTTP origin answering with the SNI the client sent.
async fn tls_origin((cert, key): (String, String)) -> (SocketAddr, Arc<Seen>) {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            let seen = Arc::clone(&s);
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                if tcp.peek(&mut first).await.unwrap_or(0) == 1 && first[0] != 0x16 {
                    seen.plain_text.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let sni = tls.get_ref().1.server_name().map(str::to_owned);
                let service = service_fn(move |_req: http::Request<hyper::body::Incoming>| {
                    seen.served.fetch_add(1, Ordering::SeqCst);
                    let body = serde_json::json!({ "sni": sni }).to_string();
                    async move { Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(body)))) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

async fn dataplane_with(origin: SocketAddr, tls: v1::UpstreamTls) -> Dataplane {
    let mut up = upstream("u", &[(origin, 1)]);
    up.scheme = v1::Scheme::Https as i32;
    up.tls = Some(tls);
    let dp = dataplane().await;
    dp.store
        .apply(
            snapshot(1, vec![route("default/r/r1", &["/*"], "u")], vec![up]),
            vec![],
        )
        .unwrap();
    dp
}

fn policy(ca: &Ca, dns: &[&str], uris: &[&str]) -> v1::UpstreamTls {
    v1::UpstreamTls {
        ca_pem: ca.pem.clone(),
        sni: "abc.example.com".into(),
        subject_alt_dns_names: dns.iter().map(|s| (*s).to_owned()).collect(),
        subject_alt_uris: uris.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_dns_san_replaces_the_hostname_in_verification_and_a_wrong_one_is_502() {
    let ca = ca("san ca");
    // The certificate does not name the SNI host at all.
    let (origin, seen) = tls_origin(server_leaf(&ca, &["backend.internal"], &[])).await;

    let dp = dataplane_with(origin, policy(&ca, &["other.internal"], &[])).await;
    let resp = get(dp.addr, "client.example", "/").await;
    assert_eq!(resp.status, 502, "{}", resp.text());
    assert!(resp.text().contains("TLS handshake"), "{}", resp.text());

    // Without SANs the hostname itself is verified: refused as well.
    let dp = dataplane_with(origin, policy(&ca, &[], &[])).await;
    assert_eq!(get(dp.addr, "client.example", "/").await.status, 502);

    let dp = dataplane_with(
        origin,
        policy(&ca, &["other.internal", "backend.internal"], &[]),
    )
    .await;
    let resp = get(dp.addr, "client.example", "/").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    // The hostname is still what is sent as SNI.
    assert_eq!(resp.json()["sni"], "abc.example.com");

    assert_eq!(
        seen.served.load(Ordering::SeqCst),
        1,
        "only the verified request"
    );
    assert_eq!(
        seen.plain_text.load(Ordering::SeqCst),
        0,
        "never plain text"
    );
}

#[tokio::test]
async fn a_wildcard_certificate_covers_a_dns_san() {
    let ca = ca("san ca");
    let (origin, _) = tls_origin(server_leaf(&ca, &["*.svc.internal"], &[])).await;
    let dp = dataplane_with(origin, policy(&ca, &["backend.svc.internal"], &[])).await;
    let resp = get(dp.addr, "client.example", "/").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
}

#[tokio::test]
async fn a_uri_san_must_match_exactly() {
    let ca = ca("san ca");
    let id = "spiffe://cluster.local/ns/default/sa/backend";
    let (origin, seen) = tls_origin(server_leaf(&ca, &["backend.internal"], &[id])).await;

    let wrong = "spiffe://cluster.local/ns/default/sa/other";
    let dp = dataplane_with(origin, policy(&ca, &[], &[wrong])).await;
    assert_eq!(get(dp.addr, "client.example", "/").await.status, 502);

    let dp = dataplane_with(origin, policy(&ca, &[], &[id])).await;
    let resp = get(dp.addr, "client.example", "/").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(seen.plain_text.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_uri_san_does_not_excuse_a_certificate_from_another_ca() {
    let real = ca("real ca");
    let other = ca("other ca");
    let id = "spiffe://cluster.local/ns/default/sa/backend";
    let (origin, seen) = tls_origin(server_leaf(&real, &["backend.internal"], &[id])).await;
    let dp = dataplane_with(origin, policy(&other, &["backend.internal"], &[id])).await;
    assert_eq!(get(dp.addr, "client.example", "/").await.status, 502);
    assert_eq!(seen.served.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_san_that_is_not_a_dns_name_rejects_the_snapshot() {
    let ca = ca("san ca");
    let mut up = upstream("u", &[("127.0.0.1:1".parse().unwrap(), 1)]);
    up.scheme = v1::Scheme::Https as i32;
    up.tls = Some(policy(&ca, &["not a name"], &[]));
    let dp = dataplane().await;
    let err = dp
        .store
        .apply(
            snapshot(1, vec![route("default/r/r1", &["/*"], "u")], vec![up]),
            vec![],
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("tls.subject_alt_dns_names"),
        "{err}"
    );
}
