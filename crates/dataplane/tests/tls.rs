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
use sluice_dataplane::server::{self, Limits};
use sluice_dataplane::store::Store;
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
        let task = tokio::spawn(sluice_dataplane::tls::serve_https(
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
        let mut snap = snapshot(
            version,
            vec![route("default/r/r1", &["/*"], "u")],
            vec![upstream("u", &[(self.echo.addr, 1)])],
        );
        snap.tls_certificates = certs;
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

    let tls = connect(dp.addr, "rotate.example.com", Arc::clone(&cfg))
        .await
        .unwrap();
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
