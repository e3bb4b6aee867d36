//! HTTPS termination against real clients: certificates generated here with rcgen, the
//! dataplane's HTTPS listener on a loopback port, rustls clients (plus curl and openssl
//! s_client) checking which certificate each SNI gets, ALPN, client mTLS and rotation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use sluice_dataplane::config::store::Store;
use sluice_dataplane::listener::server::{self, Limits};
use sluice_dataplane::upstream::tls::NoVerification;
use sluice_proto::v1;
use sluice_testkit::EchoServer;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A CA that signs leaf certificates.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
    der: CertificateDer<'static>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for `names` with an ECDSA P-256 key (or the given key).
    fn leaf_with(&self, names: &[&str], key: KeyPair) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("client"),
        );
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            // The chain: leaf, then the CA (as a server would send an intermediate).
            chain_pem: format!("{}{}", cert.pem(), self.pem),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    fn leaf(&self, names: &[&str]) -> Leaf {
        self.leaf_with(names, KeyPair::generate().unwrap())
    }
}

struct Leaf {
    chain_pem: String,
    key_pem: String,
    der: CertificateDer<'static>,
}

impl Leaf {
    fn cert(&self, id: &str, hosts: &[&str]) -> v1::TlsCertificate {
        v1::TlsCertificate {
            id: id.into(),
            source: format!("test {id}"),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            cert_chain_pem: self.chain_pem.clone(),
            private_key_pem: self.key_pem.clone(),
            client_auth: None,
        }
    }

    fn client_identity(&self) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        (
            vec![self.der.clone()],
            PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).unwrap(),
        )
    }
}

/// A dataplane with an HTTPS listener whose routes send everything to an echo server.
struct Https {
    addr: SocketAddr,
    store: Arc<Store>,
    echo: EchoServer,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Https {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Https {
    async fn start(certs: Vec<v1::TlsCertificate>) -> Https {
        let echo = EchoServer::start("origin", any()).await.unwrap();
        let store = Arc::new(Store::new().unwrap());
        let listener =
            tokio::net::TcpListener::from_std(server::bind_reuseport(any()).unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(sluice_dataplane::listener::tls::serve_https(
            listener,
            Arc::clone(&store),
            Limits::default(),
        ));
        let https = Https {
            addr,
            store,
            echo,
            task,
        };
        https.apply(1, certs).unwrap();
        https
    }

    fn apply(&self, version: u64, certs: Vec<v1::TlsCertificate>) -> Result<(), String> {
        self.apply_with(version, certs, None, "")
    }

    /// Applies certificates plus a default certificate and a fallback SNI ("" = none).
    fn apply_with(
        &self,
        version: u64,
        certs: Vec<v1::TlsCertificate>,
        default: Option<v1::TlsCertificate>,
        fallback_sni: &str,
    ) -> Result<(), String> {
        let mut snap = snapshot(
            version,
            vec![route("default/r/r1", &["/*"], "u")],
            vec![upstream("u", &[(self.echo.addr, 1)])],
        );
        snap.tls_certificates = certs;
        snap.default_certificate = default;
        snap.fallback_sni = fallback_sni.into();
        let snap = sluice_proto::seal(snap, version);
        self.store.apply(snap, vec![]).map_err(|e| e.to_string())
    }
}

fn client_config(
    roots: &[&CertificateDer<'static>],
    alpn: &[&[u8]],
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Arc<ClientConfig> {
    let mut store = RootCertStore::empty();
    for r in roots {
        store.add((*r).clone()).unwrap();
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(store);
    let mut config = match identity {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key).unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

async fn connect(
    addr: SocketAddr,
    sni: &str,
    config: Arc<ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(sni.to_owned()).unwrap();
    TlsConnector::from(config).connect(name, tcp).await
}

fn served_cert(tls: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    tls.get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// Sends GET `path` with `host` over an established TLS stream (HTTP/1.1), and returns
/// the sender so the connection can be reused.
async fn h1_over(
    tls: TlsStream<TcpStream>,
) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

async fn get_on(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: &str,
    path: &str,
) -> Resp {
    sender.ready().await.unwrap();
    let req = Request::get(path)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    Resp {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

#[tokio::test]
async fn each_sni_gets_its_certificate_and_exact_beats_wildcard() {
    let ca = Ca::new("test CA");
    let exact = ca.leaf(&["a.example.com"]);
    let wild = ca.leaf(&["*.example.com"]);
    let other = ca.leaf(&["shop.test"]);
    let dp = Https::start(vec![
        exact.cert("default/a", &["a.example.com"]),
        wild.cert("default/wild", &["*.example.com"]),
        other.cert("default/shop", &["shop.test"]),
    ])
    .await;
    let cfg = client_config(&[&ca.der], &[b"http/1.1"], None);

    let tls = connect(dp.addr, "a.example.com", Arc::clone(&cfg))
        .await
        .unwrap();
    assert_eq!(
        served_cert(&tls),
        exact.der,
        "exact host beats the wildcard"
    );
    let tls = connect(dp.addr, "b.example.com", Arc::clone(&cfg))
        .await
        .unwrap();
    assert_eq!(served_cert(&tls), wild.der);
    let tls = connect(dp.addr, "shop.test", Arc::clone(&cfg))
        .await
        .unwrap();
    assert_eq!(served_cert(&tls), other.der);

    // The request goes through, marked as https.
    let mut sender = h1_over(tls).await;
    let resp = get_on(&mut sender, "shop.test", "/hello").await;
    assert_eq!(resp.status, StatusCode::OK);
    assert_eq!(resp.json()["headers"]["x-forwarded-proto"], "https");
    assert_eq!(resp.json()["path"], "/hello");

    // A wildcard covers one label only, and unknown names get a clear refusal, never
    // another tenant's certificate.
    for sni in ["x.y.example.com", "unknown.test"] {
        let err = connect(dp.addr, sni, Arc::clone(&cfg)).await.unwrap_err();
        assert!(
            err.to_string().contains("AccessDenied"),
            "{sni}: expected an access_denied alert, got {err}"
        );
    }
}

/// A client that comes back resumes its TLS 1.3 session (stateless tickets), every time and
/// after more other clients came and went than rustls's default session cache holds.
#[tokio::test]
async fn returning_clients_resume_their_sessions() {
    let ca = Ca::new("test CA");
    let leaf = ca.leaf(&["a.example.com"]);
    let dp = Https::start(vec![leaf.cert("default/a", &["a.example.com"])]).await;
    let kind = |cfg: Arc<ClientConfig>, sni: &'static str| {
        let addr = dp.addr;
        async move {
            let tls = connect(addr, sni, cfg).await.unwrap();
            let resumed = tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
            // NB: TLS 1.3 tickets come after the handshake; a request reads them.
            let mut sender = h1_over(tls).await;
            let resp = get_on(&mut sender, sni, "/").await;
            assert_eq!(resp.status, StatusCode::OK);
            resumed
        }
    };
    let returning = client_config(&[&ca.der], &[b"http/1.1"], None);
    assert!(!kind(Arc::clone(&returning), "a.example.com").await);
    // 300 other clients (more than rustls's default cache holds) in between.
    for _ in 0..300 {
        let other = client_config(&[&ca.der], &[b"http/1.1"], None);
        let _ = connect(dp.addr, "a.example.com", other).await.unwrap();
    }
    for round in 0..3 {
        assert!(
            kind(Arc::clone(&returning), "a.example.com").await,
            "round {round}: not resumed"
        );
    }
}

#[tokio::test]
async fn alpn_selects_http2_or_http11() {
    let ca = Ca::new("test CA");
    let leaf = ca.leaf(&["h2.example.com"]);
    let dp = Https::start(vec![leaf.cert("default/h2", &["h2.example.com"])]).await;

    let cfg = client_config(&[&ca.der], &[b"h2", b"http/1.1"], None);
    let tls = connect(dp.addr, "h2.example.com", cfg).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::get("https://h2.example.com/over-h2")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let j: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(j["path"], "/over-h2");
    assert_eq!(j["headers"]["x-forwarded-proto"], "https");

    let cfg = client_config(&[&ca.der], &[b"http/1.1"], None);
    let tls = connect(dp.addr, "h2.example.com", cfg).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let mut sender = h1_over(tls).await;
    assert_eq!(
        get_on(&mut sender, "h2.example.com", "/").await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn tls12_with_an_rsa_2048_key() {
    // ring signs with RSA but cannot generate RSA keys: openssl makes the key.
    let out = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let key = KeyPair::from_pem_and_sign_algo(
        std::str::from_utf8(&out.stdout).unwrap(),
        &rcgen::PKCS_RSA_SHA256,
    )
    .unwrap();
    let ca = Ca::new("test CA");
    let leaf = ca.leaf_with(&["rsa.example.com"], key);
    let dp = Https::start(vec![leaf.cert("default/rsa", &["rsa.example.com"])]).await;

    let mut roots = RootCertStore::empty();
    roots.add(ca.der.clone()).unwrap();
    let cfg =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tls = connect(dp.addr, "rsa.example.com", Arc::new(cfg))
        .await
        .unwrap();
    assert_eq!(
        tls.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    assert_eq!(served_cert(&tls), leaf.der);
    let mut sender = h1_over(tls).await;
    assert_eq!(
        get_on(&mut sender, "rsa.example.com", "/").await.status,
        StatusCode::OK
    );
}

fn with_client_auth(
    mut cert: v1::TlsCertificate,
    ca: &Ca,
    depth: u32,
    skip: &[&str],
) -> v1::TlsCertificate {
    cert.client_auth = Some(v1::TlsClientAuth {
        ca_pem: ca.pem.clone(),
        depth,
        skip_mtls_uri_regex: skip.iter().map(|s| s.to_string()).collect(),
    });
    cert
}

#[tokio::test]
async fn mtls_refuses_clients_without_a_valid_certificate() {
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let rogue_ca = Ca::new("rogue CA");
    let leaf = server_ca.leaf(&["secure.example.com"]);
    let dp = Https::start(vec![with_client_auth(
        leaf.cert("default/secure", &["secure.example.com"]),
        &client_ca,
        1,
        &[],
    )])
    .await;

    // A certificate from the configured CA: served.
    let good = client_ca.leaf(&["client.example.com"]);
    let cfg = client_config(
        &[&server_ca.der],
        &[b"http/1.1"],
        Some(good.client_identity()),
    );
    let tls = connect(dp.addr, "secure.example.com", cfg).await.unwrap();
    let mut sender = h1_over(tls).await;
    assert_eq!(
        get_on(&mut sender, "secure.example.com", "/").await.status,
        StatusCode::OK
    );

    // No certificate, or one from another CA: the handshake fails with an alert. (In TLS
    // 1.3 the client learns it on its first read.)
    let rogue = rogue_ca.leaf(&["client.example.com"]);
    for (what, identity) in [("none", None), ("rogue", Some(rogue.client_identity()))] {
        let cfg = client_config(&[&server_ca.der], &[b"http/1.1"], identity);
        let refused = match connect(dp.addr, "secure.example.com", cfg).await {
            Err(e) => e.to_string(),
            Ok(tls) => {
                let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                    .await
                    .unwrap();
                let conn = tokio::spawn(conn);
                let req = Request::get("/")
                    .header("host", "secure.example.com")
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                let sent = sender.send_request(req).await;
                assert!(sent.is_err(), "{what}: request must fail, got {sent:?}");
                format!("{:?}", conn.await.unwrap().err())
            }
        };
        let expected = if what == "none" {
            "CertificateRequired"
        } else {
            "UnknownCA"
        };
        assert!(
            refused.contains(expected),
            "{what}: expected {expected} alert, got {refused}"
        );
    }
}

#[tokio::test]
async fn mtls_depth_limits_intermediates() {
    let server_ca = Ca::new("server CA");
    let root = Ca::new("client root");
    // An intermediate CA signed by the root.
    let inter_key = KeyPair::generate().unwrap();
    let mut inter_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    inter_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    inter_params
        .distinguished_name
        .push(DnType::CommonName, "client intermediate");
    let inter_cert = inter_params.signed_by(&inter_key, &root.issuer).unwrap();
    let inter = Issuer::new(inter_params, inter_key);
    let client_key = KeyPair::generate().unwrap();
    let client_params = CertificateParams::new(vec!["client.example.com".to_string()]).unwrap();
    let client_cert = client_params.signed_by(&client_key, &inter).unwrap();
    let identity = || {
        (
            vec![client_cert.der().clone(), inter_cert.der().clone()],
            PrivateKeyDer::from_pem_slice(client_key.serialize_pem().as_bytes()).unwrap(),
        )
    };
    let leaf = server_ca.leaf(&["deep.example.com", "shallow.example.com"]);
    let dp = Https::start(vec![
        with_client_auth(
            leaf.cert("default/deep", &["deep.example.com"]),
            &root,
            2,
            &[],
        ),
        with_client_auth(
            leaf.cert("default/shallow", &["shallow.example.com"]),
            &root,
            1,
            &[],
        ),
    ])
    .await;
    let status = |sni: &'static str| {
        let cfg = client_config(&[&server_ca.der], &[b"http/1.1"], Some(identity()));
        async move {
            let tls = connect(dp.addr, sni, cfg).await.ok()?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .ok()?;
            tokio::spawn(conn);
            let req = Request::get("/")
                .header("host", sni)
                .body(Full::new(Bytes::new()))
                .unwrap();
            Some(sender.send_request(req).await.ok()?.status())
        }
    };
    assert_eq!(status("deep.example.com").await, Some(StatusCode::OK));
    assert_eq!(
        status("shallow.example.com").await,
        None,
        "depth 1 allows no intermediate"
    );
}

#[tokio::test]
async fn mtls_skip_regex_serves_matching_paths_without_a_certificate() {
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let leaf = server_ca.leaf(&["mixed.example.com"]);
    let public = server_ca.leaf(&["public.example.com"]);
    let dp = Https::start(vec![
        with_client_auth(
            leaf.cert("default/mixed", &["mixed.example.com"]),
            &client_ca,
            1,
            &["^/public/.*"],
        ),
        public.cert("default/public", &["public.example.com"]),
    ])
    .await;

    let anon = client_config(&[&server_ca.der], &[b"http/1.1"], None);
    let tls = connect(dp.addr, "mixed.example.com", Arc::clone(&anon))
        .await
        .unwrap();
    let mut sender = h1_over(tls).await;
    let resp = get_on(&mut sender, "mixed.example.com", "/public/logo.png").await;
    assert_eq!(resp.status, StatusCode::OK);
    let resp = get_on(&mut sender, "mixed.example.com", "/private").await;
    assert_eq!(resp.status, StatusCode::BAD_REQUEST);
    assert!(
        resp.text()
            .contains("client certificate verification is not passed"),
        "{}",
        resp.text()
    );

    let client = client_ca.leaf(&["client.example.com"]);
    let cfg = client_config(
        &[&server_ca.der],
        &[b"http/1.1"],
        Some(client.client_identity()),
    );
    let tls = connect(dp.addr, "mixed.example.com", cfg).await.unwrap();
    let mut sender = h1_over(tls).await;
    assert_eq!(
        get_on(&mut sender, "mixed.example.com", "/private")
            .await
            .status,
        StatusCode::OK
    );

    // A handshake for the public host cannot be used to reach the mTLS host.
    let tls = connect(dp.addr, "public.example.com", anon).await.unwrap();
    let mut sender = h1_over(tls).await;
    assert_eq!(
        get_on(&mut sender, "public.example.com", "/").await.status,
        StatusCode::OK
    );
    let resp = get_on(&mut sender, "mixed.example.com", "/private").await;
    assert_eq!(resp.status, StatusCode::MISDIRECTED_REQUEST);
}

#[tokio::test]
async fn rotation_serves_new_handshakes_the_new_certificate_and_keeps_open_connections() {
    let ca = Ca::new("test CA");
    let old = ca.leaf(&["rotate.example.com"]);
    let new = ca.leaf(&["rotate.example.com"]);
    let dp = Https::start(vec![old.cert("default/rotate", &["rotate.example.com"])]).await;
    let cfg = client_config(&[&ca.der], &[b"http/1.1"], None);

    let tls = connect(dp.addr, "rotate.example.com", Arc::clone(&cfg))
        .await
        .unwrap();
    assert_eq!(served_cert(&tls), old.der);
    let mut old_conn = h1_over(tls).await;
    assert_eq!(
        get_on(&mut old_conn, "rotate.example.com", "/")
            .await
            .status,
        StatusCode::OK
    );

    dp.apply(2, vec![new.cert("default/rotate", &["rotate.example.com"])])
        .unwrap();

    // NB: the same client config: a session made under the old certificate must not
    // resume under the new one.
    let tls = connect(dp.addr, "rotate.example.com", Arc::clone(&cfg))
        .await
        .unwrap();
    assert_eq!(
        tls.get_ref().1.handshake_kind(),
        Some(rustls::HandshakeKind::Full)
    );
    assert_eq!(
        served_cert(&tls),
        new.der,
        "a new handshake gets the new certificate"
    );
    // The connection opened before the rotation keeps working.
    for _ in 0..3 {
        assert_eq!(
            get_on(&mut old_conn, "rotate.example.com", "/again")
                .await
                .status,
            StatusCode::OK
        );
    }

    // A snapshot with a broken certificate is refused whole; the last good one keeps serving.
    let mut broken = new.cert("default/rotate", &["rotate.example.com"]);
    broken.private_key_pem = ca.leaf(&["x"]).key_pem;
    let err = dp.apply(3, vec![broken]).unwrap_err();
    assert!(err.contains("tls_certificates default/rotate"), "{err}");
    let tls = connect(dp.addr, "rotate.example.com", cfg).await.unwrap();
    assert_eq!(served_cert(&tls), new.der);
    assert_eq!(dp.store.state().version, 2);
}

/// Runs a command off the runtime (the dataplane under test shares it), stdin closed.
async fn run(mut cmd: std::process::Command) -> std::process::Output {
    cmd.stdin(std::process::Stdio::null());
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

/// Real command-line clients: curl negotiates h2 by ALPN and verifies the chain against
/// the CA; openssl s_client sees the certificate per SNI.
#[tokio::test]
async fn curl_and_openssl_see_the_right_certificates() {
    let ca = Ca::new("cli CA");
    let exact = ca.leaf(&["cli.example.com"]);
    let wild = ca.leaf(&["*.example.com"]);
    let dp = Https::start(vec![
        exact.cert("default/cli", &["cli.example.com"]),
        wild.cert("default/wild", &["*.example.com"]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let port = dp.addr.port();

    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sS", "--http2", "--cacert"])
        .arg(&ca_file)
        .arg("--resolve")
        .arg(format!("cli.example.com:{port}:127.0.0.1"))
        .args(["-w", "\n%{http_version} %{http_code}"])
        .arg(format!("https://cli.example.com:{port}/via-curl"));
    let curl = run(cmd).await;
    let out = String::from_utf8_lossy(&curl.stdout);
    assert!(
        curl.status.success(),
        "{out} {}",
        String::from_utf8_lossy(&curl.stderr)
    );
    assert!(out.ends_with("\n2 200"), "{out}");
    assert!(out.contains("\"path\":\"/via-curl\""), "{out}");

    // An unknown name: curl fails the handshake.
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sS", "--cacert"])
        .arg(&ca_file)
        .arg("--resolve")
        .arg(format!("nobody.test:{port}:127.0.0.1"))
        .arg(format!("https://nobody.test:{port}/"));
    let curl = run(cmd).await;
    assert_eq!(
        curl.status.code(),
        Some(35),
        "curl exit 35 = TLS handshake failure"
    );

    for (sni, cn) in [
        ("cli.example.com", "cli.example.com"),
        ("z.example.com", "*.example.com"),
    ] {
        let mut cmd = std::process::Command::new("openssl");
        cmd.args(["s_client", "-connect"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["-servername", sni, "-CAfile"])
            .arg(&ca_file);
        let out = run(cmd).await;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!("subject=CN = {cn}")),
            "{sni}: {text}"
        );
        assert!(text.contains("Verify return code: 0 (ok)"), "{sni}: {text}");
    }
}

/// A client that shows whatever certificate it gets; `sni = false` sends no SNI.
fn any_cert_client(sni: bool) -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
        .with_no_client_auth();
    config.enable_sni = sni;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// The certificate served for `sni` (`None`: no SNI sent), or the handshake error.
async fn served_for(
    addr: SocketAddr,
    sni: Option<&str>,
) -> Result<CertificateDer<'static>, String> {
    // NB: without SNI the name only feeds the (accept-all) verifier.
    let cfg = any_cert_client(sni.is_some());
    connect(addr, sni.unwrap_or("no-sni.invalid"), cfg)
        .await
        .map(|tls| served_cert(&tls))
        .map_err(|e| e.to_string())
}

/// `--default-ssl-certificate`: a handshake for a host no certificate covers, or without
/// SNI, gets the default certificate; hosts other certificates cover never do. Without the
/// default, both are refused again.
#[tokio::test]
async fn default_certificate_serves_unknown_and_missing_sni_only() {
    let ca = Ca::new("test CA");
    let exact = ca.leaf(&["a.example.com"]);
    let wild = ca.leaf(&["*.example.com"]);
    let fallback = ca.leaf(&["ingress.local"]);
    let certs = vec![
        exact.cert("default/a", &["a.example.com"]),
        wild.cert("default/wild", &["*.example.com"]),
    ];
    let default = v1::TlsCertificate {
        id: "default-certificate".into(),
        ..fallback.cert("default-certificate", &[])
    };
    let dp = Https::start(certs.clone()).await;
    dp.apply_with(2, certs.clone(), Some(default.clone()), "")
        .unwrap();

    for sni in [Some("unknown.test"), Some("x.y.example.com"), None] {
        assert_eq!(
            served_for(dp.addr, sni).await.unwrap(),
            fallback.der,
            "{sni:?}: the default certificate"
        );
    }
    assert_eq!(
        served_for(dp.addr, Some("a.example.com")).await.unwrap(),
        exact.der
    );
    assert_eq!(
        served_for(dp.addr, Some("B.example.com")).await.unwrap(),
        wild.der
    );

    // A request over a default-certificate connection (no SNI) is routed by Host as usual.
    let tls = connect(dp.addr, "no-sni.invalid", any_cert_client(false))
        .await
        .unwrap();
    let mut sender = h1_over(tls).await;
    let resp = get_on(&mut sender, "unknown.test", "/via-default").await;
    assert_eq!(resp.status, StatusCode::OK);
    assert_eq!(resp.json()["path"], "/via-default");

    // fallback_sni: no SNI gets that host's certificate; an unknown SNI still the default.
    dp.apply_with(3, certs.clone(), Some(default.clone()), "a.example.com")
        .unwrap();
    assert_eq!(served_for(dp.addr, None).await.unwrap(), exact.der);
    assert_eq!(
        served_for(dp.addr, Some("unknown.test")).await.unwrap(),
        fallback.der
    );
    // fallback_sni alone: no SNI is served, an unknown SNI is refused.
    dp.apply_with(4, certs.clone(), None, "b.example.com")
        .unwrap();
    assert_eq!(served_for(dp.addr, None).await.unwrap(), wild.der);
    let err = served_for(dp.addr, Some("unknown.test")).await.unwrap_err();
    assert!(err.contains("AccessDenied"), "{err}");

    // No default any more: refused as before.
    dp.apply_with(5, certs, None, "").unwrap();
    for sni in [Some("unknown.test"), None] {
        let err = served_for(dp.addr, sni).await.unwrap_err();
        assert!(err.contains("AccessDenied"), "{sni:?}: {err}");
    }
}

/// A connection made with the default certificate cannot reach a host that requires
/// client certificates (421), so the default is no way around mTLS.
#[tokio::test]
async fn default_certificate_connection_cannot_reach_an_mtls_host() {
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let secure = server_ca.leaf(&["secure.example.com"]);
    let fallback = server_ca.leaf(&["ingress.local"]);
    let dp = Https::start(vec![]).await;
    dp.apply_with(
        2,
        vec![with_client_auth(
            secure.cert("default/secure", &["secure.example.com"]),
            &client_ca,
            1,
            &[],
        )],
        Some(fallback.cert("default-certificate", &[])),
        "",
    )
    .unwrap();
    let tls = connect(dp.addr, "other.test", any_cert_client(true))
        .await
        .unwrap();
    assert_eq!(served_cert(&tls), fallback.der);
    let mut sender = h1_over(tls).await;
    assert_eq!(
        get_on(&mut sender, "secure.example.com", "/").await.status,
        StatusCode::MISDIRECTED_REQUEST
    );
    assert_eq!(
        get_on(&mut sender, "other.test", "/").await.status,
        StatusCode::OK
    );
}

/// A default certificate with hosts is not a valid snapshot: rejected whole, the last good
/// one keeps serving.
#[tokio::test]
async fn default_certificate_with_hosts_is_rejected() {
    let ca = Ca::new("test CA");
    let leaf = ca.leaf(&["a.example.com"]);
    let certs = vec![leaf.cert("default/a", &["a.example.com"])];
    let dp = Https::start(certs.clone()).await;
    let err = dp
        .apply_with(
            2,
            certs,
            Some(leaf.cert("default-certificate", &["x.test"])),
            "",
        )
        .unwrap_err();
    assert!(
        err.contains("default-certificate") && err.contains("hosts"),
        "{err}"
    );
    assert_eq!(
        served_for(dp.addr, Some("a.example.com")).await.unwrap(),
        leaf.der
    );
}

/// openssl s_client with an unknown SNI and without SNI sees the default certificate; curl
/// to an unknown host gets through it (the name does not match, so `-k`).
#[tokio::test]
async fn openssl_and_curl_get_the_default_certificate() {
    let ca = Ca::new("cli CA");
    let known = ca.leaf(&["known.example.com"]);
    let fallback = ca.leaf(&["ingress.local"]);
    let certs = vec![known.cert("default/known", &["known.example.com"])];
    let dp = Https::start(certs.clone()).await;
    let port = dp.addr.port();
    let s_client = |args: &[&str]| {
        let mut cmd = std::process::Command::new("openssl");
        cmd.args(["s_client", "-connect"])
            .arg(format!("127.0.0.1:{port}"))
            .args(args);
        cmd
    };
    // Without a default: refused, with and without SNI.
    for args in [&["-servername", "unknown"][..], &["-noservername"][..]] {
        let out = run(s_client(args)).await;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {text}");
        assert!(text.contains("access denied"), "{args:?}: {text}");
    }

    dp.apply_with(
        2,
        certs,
        Some(fallback.cert("default-certificate", &[])),
        "",
    )
    .unwrap();
    for (args, cn) in [
        (&["-servername", "unknown"][..], "ingress.local"),
        (&["-noservername"][..], "ingress.local"),
        (
            &["-servername", "known.example.com"][..],
            "known.example.com",
        ),
    ] {
        let out = run(s_client(args)).await;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!("subject=CN = {cn}")),
            "{args:?}: {text}"
        );
    }

    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sS", "-k", "--resolve"])
        .arg(format!("unknown.test:{port}:127.0.0.1"))
        .args(["-w", "\n%{http_code}"])
        .arg(format!("https://unknown.test:{port}/via-default"));
    let curl = run(cmd).await;
    let out = String::from_utf8_lossy(&curl.stdout);
    assert!(
        out.ends_with("\n200"),
        "{out} {}",
        String::from_utf8_lossy(&curl.stderr)
    );
    assert!(out.contains("\"path\":\"/via-default\""), "{out}");
}

/// Standalone mode: `--default-ssl-certificate NS/NAME` names a Secret in the files; the
/// reload serves it, and a Secret that is missing is listed with the rejected objects while
/// the other certificates keep serving.
#[tokio::test]
async fn standalone_default_certificate_from_the_files() {
    let ca = Ca::new("standalone CA");
    let known = ca.leaf(&["known.example.com"]);
    let fallback = ca.leaf(&["ingress.local"]);
    let secret = |name: &str, leaf: &Leaf| {
        let indent = |t: &str| t.lines().map(|l| format!("    {l}\n")).collect::<String>();
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: ingress}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}---\n",
            indent(&leaf.chain_pem),
            indent(&leaf.key_pem)
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(
        &file,
        format!(
            "{}{}apiVersion: apisix.apache.org/v2\nkind: ApisixTls\nmetadata: {{name: known, namespace: ingress}}\nspec:\n  hosts: [known.example.com]\n  secret: {{name: known-cert, namespace: ingress}}\n",
            secret("known-cert", &known),
            secret("fallback-cert", &fallback)
        ),
    )
    .unwrap();
    let dp = Https::start(vec![]).await;
    let mut version = 10;
    let opts = sluice_translate::Options {
        default_certificate: Some(("ingress".into(), "fallback-cert".into())),
        ..Default::default()
    };
    let r =
        sluice_dataplane::config::standalone::reload_with(&file, &dp.store, &mut version, &opts);
    assert!(r.live);
    assert!(r.certificates_change_at.is_some());
    assert_eq!(
        served_for(dp.addr, Some("unknown.test")).await.unwrap(),
        fallback.der
    );
    assert_eq!(served_for(dp.addr, None).await.unwrap(), fallback.der);
    assert_eq!(
        served_for(dp.addr, Some("known.example.com"))
            .await
            .unwrap(),
        known.der
    );

    let opts = sluice_translate::Options {
        default_certificate: Some(("ingress".into(), "no-such".into())),
        ..Default::default()
    };
    assert!(
        sluice_dataplane::config::standalone::reload_with(&file, &dp.store, &mut version, &opts)
            .live
    );
    let rejected = dp.store.state().rejected_objects.clone();
    assert!(
        rejected
            .iter()
            .any(|r| r.contains("--default-ssl-certificate ingress/no-such")
                && r.contains("Secret ingress/no-such not found")),
        "{rejected:?}"
    );
    let err = served_for(dp.addr, Some("unknown.test")).await.unwrap_err();
    assert!(err.contains("AccessDenied"), "{err}");
    assert_eq!(
        served_for(dp.addr, Some("known.example.com"))
            .await
            .unwrap(),
        known.der
    );
}

#[tokio::test]
async fn an_idle_https_connection_is_parked_and_keeps_its_session() {
    let ca = Ca::new("test CA");
    let leaf = ca.leaf(&["park.example.com"]);
    let dp = Https::start(vec![leaf.cert("default/park", &["park.example.com"])]).await;
    let cfg = client_config(&[&ca.der], &[b"http/1.1"], None);
    let tls = connect(dp.addr, "park.example.com", cfg).await.unwrap();
    let mut conn = h1_over(tls).await;
    let parked = || {
        dp.store
            .metrics()
            .render()
            .lines()
            .find_map(|l| l.strip_prefix("sluice_dataplane_parked_connections "))
            .and_then(|v| v.parse::<f64>().ok())
    };
    for round in 0..2 {
        assert_eq!(
            get_on(&mut conn, "park.example.com", "/").await.status,
            StatusCode::OK,
            "round {round}"
        );
        // Quiet past the 250 ms grace: parked, with the TLS session kept.
        let mut waited = 0;
        while parked() != Some(1.0) && waited < 60 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            waited += 1;
        }
        assert_eq!(parked(), Some(1.0), "round {round}");
    }
    assert_eq!(
        get_on(&mut conn, "park.example.com", "/after").await.status,
        StatusCode::OK
    );
}
