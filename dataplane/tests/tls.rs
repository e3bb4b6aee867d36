//! HTTPS termination against real clients: certificates from the test kit's `pki` (rcgen), the
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
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use sluice_dataplane::config::store::Store;
use sluice_dataplane::listener::server::{self, Limits};
use sluice_dataplane::upstream::tls::NoVerification;
use sluice_proto::v1;
use sluice_testkit::EchoServer;
use sluice_testkit::pki::{self, Ca, Cert, RsaKey};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// What this suite makes of a test certificate.
trait LeafExt {
    /// The certificate (its chain) and key as a `TlsCertificate` `id` for `hosts`.
    fn cert(&self, id: &str, hosts: &[&str]) -> v1::TlsCertificate;
    /// The certificate and key as a client identity.
    fn client_identity(&self) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);
}

impl LeafExt for Cert {
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
    let key = RsaKey::generate().key_pair();
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
    let inter = root.intermediate("client intermediate");
    let client = inter.sign(pki::params_for(&["client.example.com"]));
    let identity = || {
        (
            vec![client.der.clone(), inter.der.clone()],
            PrivateKeyDer::from_pem_slice(client.key_pem.as_bytes()).unwrap(),
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
    let secret = |name: &str, leaf: &Cert| {
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

// ---- the mTLS guard: every way a request names its host, every path spelling --------------

/// An HTTPS and a plain-HTTP listener on one store. Certificates: `mtls.test` and
/// `*.wild.test` require a client certificate, `mixed.test` asks for an optional one
/// (`skip_mtls_uri_regex: ^/public/`), `public.test` none. Routes: `mtls.test`,
/// `*.wild.test` and `mixed.test` go to the echo server "secret"; `public.test` and `[::1]`
/// to "open"; no host-less route, so the server named in a 200 is the router's decision.
struct Guarded {
    https: SocketAddr,
    http: SocketAddr,
    server_ca: Ca,
    client_ca: Ca,
    _echoes: (EchoServer, EchoServer),
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Guarded {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Guarded {
    async fn start() -> Guarded {
        let server_ca = Ca::new("server CA");
        let client_ca = Ca::new("client CA");
        let secret = EchoServer::start("secret", any()).await.unwrap();
        let open = EchoServer::start("open", any()).await.unwrap();
        let store = Arc::new(Store::new().unwrap());
        let tls_listener =
            tokio::net::TcpListener::from_std(server::bind_reuseport(any()).unwrap()).unwrap();
        let plain_listener =
            tokio::net::TcpListener::from_std(server::bind_reuseport(any()).unwrap()).unwrap();
        let (https, http) = (
            tls_listener.local_addr().unwrap(),
            plain_listener.local_addr().unwrap(),
        );
        let tasks = vec![
            tokio::spawn(sluice_dataplane::listener::tls::serve_https(
                tls_listener,
                Arc::clone(&store),
                Limits::default(),
            )),
            tokio::spawn(server::serve(
                plain_listener,
                Arc::clone(&store),
                Limits::default(),
            )),
        ];
        let mut to_secret = route("default/secret/r", &["/*"], "secret");
        to_secret.hosts = vec![
            "mtls.test".into(),
            "*.wild.test".into(),
            "mixed.test".into(),
        ];
        let mut to_open = route("default/open/r", &["/*"], "open");
        to_open.hosts = vec!["public.test".into(), "[::1]".into()];
        let mut snap = snapshot(
            1,
            vec![to_secret, to_open],
            vec![
                upstream("secret", &[(secret.addr, 1)]),
                upstream("open", &[(open.addr, 1)]),
            ],
        );
        let leaf = |names: &[&str], id: &str| server_ca.leaf(names).cert(id, names);
        snap.tls_certificates = vec![
            with_client_auth(leaf(&["mtls.test"], "default/mtls"), &client_ca, 1, &[]),
            with_client_auth(leaf(&["*.wild.test"], "default/wild"), &client_ca, 1, &[]),
            with_client_auth(
                leaf(&["mixed.test"], "default/mixed"),
                &client_ca,
                1,
                &["^/public/"],
            ),
            leaf(&["public.test"], "default/public"),
        ];
        store
            .apply(sluice_proto::seal(snap, 1), vec![])
            .map_err(|e| e.to_string())
            .unwrap();
        Guarded {
            https,
            http,
            server_ca,
            client_ca,
            _echoes: (secret, open),
            tasks,
        }
    }

    /// A client trusting the server CA, with ALPN `alpn`, and a client certificate when
    /// `cert`.
    fn client(&self, alpn: &[u8], cert: bool) -> Arc<ClientConfig> {
        let identity = cert.then(|| self.client_ca.leaf(&["client.test"]).client_identity());
        client_config(&[&self.server_ca.der], &[alpn], identity)
    }
}

/// What a request got: status, and the echo server that answered (the route it took).
#[derive(Debug, PartialEq, Eq)]
struct Got {
    status: u16,
    server: Option<String>,
    body: String,
}

/// Sends an HTTP/1.1 request head (`GET target`, one `Host` line per entry of `hosts`,
/// `Connection: close`) on `stream` and reads the answer to the end.
async fn raw_h1<S>(mut stream: S, target: &str, hosts: &[&str]) -> Got
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = format!("GET {target} HTTP/1.1\r\n");
    for h in hosts {
        head.push_str(&format!("Host: {h}\r\n"));
    }
    head.push_str("Connection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    // NB: the dataplane may close without close_notify: what was read is the answer.
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut buf),
    )
    .await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    got(status, body)
}

fn got(status: u16, body: String) -> Got {
    let server = serde_json::from_str::<serde_json::Value>(body.trim())
        .ok()
        .and_then(|j| j["server"].as_str().map(str::to_owned));
    Got {
        status,
        server,
        body,
    }
}

/// An HTTP/2 request for `uri` (its authority is `:authority`) with the `host` headers given.
async fn h2_on<S>(stream: S, uri: &str, hosts: &[&str]) -> Got
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = Request::get(uri);
    for h in hosts {
        req = req.header("host", *h);
    }
    let resp = sender
        .send_request(req.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    got(status, String::from_utf8_lossy(&body).into_owned())
}

/// Checks each case, collecting every mismatch, so one run shows the whole class.
fn check(failures: &mut Vec<String>, what: &str, got: Got, status: u16, server: Option<&str>) {
    if got.status != status || (server.is_some() && got.server.as_deref() != server) {
        failures.push(format!(
            "{what}: expected {status} {server:?}, got {} {:?} {:?}",
            got.status,
            got.server,
            got.body.chars().take(120).collect::<String>()
        ));
    }
}

const SECRET: Option<&str> = Some("secret");
const OPEN: Option<&str> = Some("open");

/// Issue 39, finding 1: over a TLS connection made for a public host, every way of naming
/// an mTLS host (absolute-form target with and without port, either scheme, upper case, a
/// trailing dot, a deeper subdomain of an mTLS wildcard, `Host` with a port, HTTP/2
/// `:authority`) gets 421; the 421 check and the router decide on the same host, so a
/// target naming a public host is routed there whatever `Host` says; what cannot be decided
/// (userinfo, two `Host` headers, `:authority` and `host` disagreeing) is 400.
#[tokio::test]
async fn every_way_of_naming_an_mtls_host_over_another_hosts_connection_is_refused() {
    let g = Guarded::start().await;
    let mut failures = Vec::new();
    let h1_cases: &[(&str, &[&str], u16, Option<&str>)] = &[
        ("https://mtls.test/private", &["public.test"], 421, None),
        ("http://mtls.test/private", &["public.test"], 421, None),
        ("https://mtls.test:443/private", &["public.test"], 421, None),
        ("http://mtls.test:8080/private", &["public.test"], 421, None),
        ("https://MTLS.TEST/private", &["public.test"], 421, None),
        ("https://mtls.test./private", &["public.test"], 421, None),
        (
            "https://Mtls.Test.:443/private",
            &["public.test"],
            421,
            None,
        ),
        ("https://mtls.test/private", &[], 421, None),
        ("https://a.b.wild.test/private", &["public.test"], 421, None),
        ("https://a@mtls.test/private", &["public.test"], 400, None),
        (
            "https://public.test@mtls.test/private",
            &["public.test"],
            400,
            None,
        ),
        (
            "https://mtls.test/private",
            &["public.test", "public.test"],
            400,
            None,
        ),
        ("/private", &["mtls.test"], 421, None),
        ("/private", &["mtls.test:443"], 421, None),
        ("/private", &["MTLS.test."], 421, None),
        ("/private", &["x.wild.test"], 421, None),
        ("/private", &["a.b.wild.test"], 421, None),
        ("/private", &["public.test", "mtls.test"], 400, None),
        ("/private", &["mtls.test", "public.test"], 400, None),
        ("/private", &[""], 400, None),
        ("/private", &["mtls..test"], 400, None),
        // The target's authority wins over Host for a public host too, and an IPv6 literal.
        ("https://public.test/x", &["mtls.test"], 200, OPEN),
        ("https://public.test:443/x", &["MTLS.test"], 200, OPEN),
        ("https://[::1]:8443/x", &["mtls.test"], 200, OPEN),
        ("https://[0:0::1]/x", &["mtls.test"], 200, OPEN),
        ("/x", &["public.test"], 200, OPEN),
    ];
    for (target, hosts, status, server) in h1_cases {
        let tls = connect(g.https, "public.test", g.client(b"http/1.1", false))
            .await
            .unwrap();
        let got = raw_h1(tls, target, hosts).await;
        let what = format!("h1 on public.test: GET {target} Host {hosts:?}");
        check(&mut failures, &what, got, *status, *server);
    }
    let h2_cases: &[(&str, &[&str], u16, Option<&str>)] = &[
        ("https://mtls.test/private", &[], 421, None),
        ("https://MTLS.test.:443/private", &[], 421, None),
        ("https://a.b.wild.test/private", &[], 421, None),
        ("https://mtls.test/private", &["public.test"], 400, None),
        ("https://public.test/x", &["mtls.test"], 400, None),
        ("https://public.test/x", &[], 200, OPEN),
    ];
    for (uri, hosts, status, server) in h2_cases {
        let tls = connect(g.https, "public.test", g.client(b"h2", false))
            .await
            .unwrap();
        let got = h2_on(tls, uri, hosts).await;
        let what = format!("h2 on public.test: {uri} host {hosts:?}");
        check(&mut failures, &what, got, *status, *server);
    }
    // With the client certificate, on the mTLS host's own connection: served, also in
    // absolute form; a public host stays reachable from it.
    for (target, hosts, status, server) in [
        ("/private", &["mtls.test"][..], 200, SECRET),
        (
            "https://mtls.test:443/private",
            &["mtls.test"][..],
            200,
            SECRET,
        ),
        ("https://public.test/x", &["mtls.test"][..], 200, OPEN),
        ("https://x.wild.test/x", &["mtls.test"][..], 421, None),
    ] {
        let tls = connect(g.https, "mtls.test", g.client(b"http/1.1", true))
            .await
            .unwrap();
        let got = raw_h1(tls, target, hosts).await;
        let what = format!("h1 on mtls.test with a certificate: GET {target} Host {hosts:?}");
        check(&mut failures, &what, got, status, server);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Issue 39, finding 2: `skip_mtls_uri_regex` is matched on the path routes match, so no
/// spelling of a way out of `/public/` (dot segments, `%2e`, `%2E`, `..%2F`, `..%2f`, runs of
/// slashes, `..;`, backslashes) skips the client certificate; what really is under
/// `/public/` still does.
#[tokio::test]
async fn no_spelling_of_a_path_escapes_the_mtls_skip_regex() {
    let g = Guarded::start().await;
    let mut failures = Vec::new();
    let skipping = [
        "/public/logo.png",
        "/public//logo.png",
        "/public/./logo.png",
        "/public/a/../logo.png",
        "/public/%6Cogo.png",
        "/x/../public/logo.png",
    ];
    let refused = [
        "/private",
        "/public/../private/x",
        "/public/%2e%2e/private/x",
        "/public/%2E%2E/private/x",
        "/public/.%2e/private/x",
        "/public/%2e./private/x",
        "/public/..%2Fprivate/x",
        "/public/..%2fprivate/x",
        "/public/%2e%2e%2fprivate/x",
        "/public/a/..//..//private/x",
        "/public/..;/private/x",
        "/public/.;/x",
        "/public/..%3Bprivate/x",
        "/public/..%5Cprivate/x",
        "/public/%5C..%5Cprivate/x",
        "/publicx/../private",
    ];
    let anon = || connect(g.https, "mixed.test", g.client(b"http/1.1", false));
    for path in skipping {
        let got = raw_h1(anon().await.unwrap(), path, &["mixed.test"]).await;
        check(&mut failures, &format!("h1 {path}"), got, 200, SECRET);
    }
    for path in refused {
        let got = raw_h1(anon().await.unwrap(), path, &["mixed.test"]).await;
        if !got
            .body
            .contains("client certificate verification is not passed")
        {
            failures.push(format!(
                "h1 {path}: expected the 400 of a missing certificate, got {} {:?}",
                got.status, got.body
            ));
        }
        check(&mut failures, &format!("h1 {path}"), got, 400, None);
        let abs = format!("https://mixed.test{path}");
        let got = raw_h1(anon().await.unwrap(), &abs, &["public.test"]).await;
        check(&mut failures, &format!("h1 {abs}"), got, 400, None);
    }
    // HTTP/2 alike.
    for (path, status, server) in [
        ("/public/logo.png", 200, SECRET),
        ("/public/%2e%2e/private/x", 400, None),
        ("/public/..%2Fprivate/x", 400, None),
    ] {
        let tls = connect(g.https, "mixed.test", g.client(b"h2", false))
            .await
            .unwrap();
        let got = h2_on(tls, &format!("https://mixed.test{path}"), &[]).await;
        check(&mut failures, &format!("h2 {path}"), got, status, server);
    }
    // A backslash the router keeps as it is, if the HTTP parser lets it through at all.
    let got = raw_h1(
        anon().await.unwrap(),
        "/public/..\\private",
        &["mixed.test"],
    )
    .await;
    if got.status == 200 {
        failures.push(format!("h1 backslash: skipped: {:?}", got.body));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Issue 39, finding 9: a host that requires a client certificate is refused over plain
/// HTTP (403), however it is named, in HTTP/1.1 and h2c; an optional one serves its skip
/// paths (normalised) and refuses the rest; other hosts are served as before.
#[tokio::test]
async fn mtls_hosts_are_refused_over_plain_http() {
    let g = Guarded::start().await;
    let mut failures = Vec::new();
    let cases: &[(&str, &[&str], u16, Option<&str>)] = &[
        ("/private", &["mtls.test"], 403, None),
        ("/private", &["MTLS.test.:80"], 403, None),
        ("http://mtls.test/private", &["public.test"], 403, None),
        ("http://mtls.test:8080/private", &[], 403, None),
        ("/private", &["a.b.wild.test"], 403, None),
        ("/private", &["mixed.test"], 403, None),
        ("/public/../private", &["mixed.test"], 403, None),
        ("/public/%2e%2e/private", &["mixed.test"], 403, None),
        ("/public/logo.png", &["mixed.test"], 200, SECRET),
        ("/x", &["public.test"], 200, OPEN),
        ("http://public.test/x", &["mtls.test"], 200, OPEN),
        ("/x", &["public.test", "mtls.test"], 400, None),
        ("http://a@mtls.test/x", &["public.test"], 400, None),
    ];
    for (target, hosts, status, server) in cases {
        let tcp = TcpStream::connect(g.http).await.unwrap();
        let got = raw_h1(tcp, target, hosts).await;
        if *status == 403 && !got.body.contains("requires a client certificate") {
            failures.push(format!("GET {target} Host {hosts:?}: body {:?}", got.body));
        }
        let what = format!("plain GET {target} Host {hosts:?}");
        check(&mut failures, &what, got, *status, *server);
    }
    for (uri, status, server) in [
        ("http://mtls.test/private", 403, None),
        ("http://x.wild.test/private", 403, None),
        ("http://public.test/x", 200, OPEN),
    ] {
        let tcp = TcpStream::connect(g.http).await.unwrap();
        let got = h2_on(tcp, uri, &[]).await;
        check(&mut failures, &format!("h2c {uri}"), got, status, server);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
