//! HTTPS termination: the certificates of a snapshot compiled into a [`TlsTable`] (swapped
//! in with the [`crate::table::RouteTable`] it belongs to), and the `--listen-https`
//! accept loop.
//!
//! ```text
//! TCP accept ─▶ read ClientHello (LazyConfigAcceptor) ─▶ SNI ─▶ current TlsTable ─▶ ServerConfig
//!   ─▶ handshake (ALPN h2 | http/1.1, client certificate when the host asks for one)
//!   ─▶ hyper HTTP/2 or HTTP/1.1 ─▶ per request: mTLS path check ─▶ proxy::handle (scheme https)
//! ```
//!
//! - SNI selection: an exact host beats a wildcard; `*.example.com` covers exactly one
//!   label (`a.example.com`, not `a.b.example.com`), as certificate wildcards do.
//! - A ClientHello without SNI gets the certificate of the snapshot's `fallback_sni` host
//!   (APISIX `apisix.ssl.fallback_sni`) if one covers it, else the default certificate.
//!   A ClientHello for a host no certificate covers gets the snapshot's
//!   `default_certificate` (ingress-nginx `--default-ssl-certificate`); the default is
//!   never served for a host another certificate covers. Without a default such
//!   handshakes are refused with a TLS `access_denied` alert: a client never gets another
//!   tenant's certificate.
//! - One `rustls::ServerConfig` per certificate, built when the snapshot compiles, never per
//!   connection. A handshake takes the table current at its ClientHello and keeps that
//!   config for its whole life, so a rotation (the next snapshot) serves new handshakes with
//!   the new certificate while open connections carry on.
//! - Client mTLS: the CA bundle, `depth` (most intermediates between the client certificate
//!   and a CA: `depth - 1`, as nginx's `ssl_verify_depth` counts) and
//!   `skip_mtls_uri_regex`. Without regexes a client certificate is required by the
//!   handshake (alert `certificate_required` otherwise). With them the certificate is
//!   asked for but optional, and a request without one whose path matches none of the
//!   regexes gets 400 `client certificate verification is not passed`. A presented
//!   certificate is always verified.
//! - A request on a TLS connection whose Host header names a host served by a different
//!   certificate that requires client certificates gets 421 Misdirected Request, so a
//!   handshake for a public host cannot be used to reach an mTLS-protected one.
//! - TLS 1.3 and 1.2 with rustls' default (modern, AEAD-only) suites from the ring provider;
//!   ECDSA, Ed25519 and RSA keys.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use regex::RegexSet;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{Acceptor, ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use sluice_proto::v1;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::LazyConfigAcceptor;

use crate::body::ProxyBody;
use crate::proxy::{ConnInfo, handle};
use crate::server::{Drain, Limits, connection_builders};
use crate::store::Store;
use crate::timer::CoarseTimer;

/// ALPN protocols offered, in server preference order.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Body of the 400 for a request without a client certificate on a path that needs one.
const NO_CLIENT_CERT_BODY: &str =
    "{\"error_msg\":\"client certificate verification is not passed\"}\n";
/// Body of the 421 for a request whose host needs a different handshake.
const MISDIRECTED_BODY: &str = "{\"error_msg\":\"421 Misdirected Request: this host needs its own TLS connection (SNI must match Host)\"}\n";

/// Why a snapshot's certificates could not be compiled; the snapshot is rejected whole.
#[derive(Debug, thiserror::Error)]
#[error("tls_certificates {id}: {field}: {reason}")]
pub struct InvalidTlsCertificate {
    /// Certificate id.
    pub id: String,
    /// Offending field.
    pub field: &'static str,
    /// What is wrong.
    pub reason: String,
}

/// How a host asks for client certificates.
#[derive(Debug)]
pub enum ClientAuth {
    /// No client certificate is asked for.
    None,
    /// The handshake fails without a valid client certificate.
    Required,
    /// A certificate is asked for; without one, only paths matching these regexes are
    /// served.
    Optional(RegexSet),
}

/// One compiled certificate with its handshake configuration.
#[derive(Debug)]
pub struct SniEntry {
    /// Certificate id from the snapshot.
    pub id: String,
    /// The handshake configuration: certificate, ALPN, client verification.
    pub config: Arc<ServerConfig>,
    /// Client certificate policy.
    pub client_auth: ClientAuth,
}

/// The certificates of one snapshot, indexed by SNI.
#[derive(Debug, Default)]
pub struct TlsTable {
    exact: HashMap<String, Arc<SniEntry>>,
    /// For a ClientHello without SNI: the fallback SNI's certificate, else the default.
    no_sni: Option<Arc<SniEntry>>,
    /// For a host no certificate covers.
    default: Option<Arc<SniEntry>>,
    /// Keyed by the wildcard's suffix without `*.`.
    wildcard: HashMap<String, Arc<SniEntry>>,
    any_client_auth: bool,
    count: usize,
}

impl TlsTable {
    /// Validates and compiles certificates chosen by SNI only (no default certificate, no
    /// fallback SNI).
    pub fn compile(certs: &[v1::TlsCertificate]) -> Result<Self, InvalidTlsCertificate> {
        Self::compile_with_defaults(certs, None, "")
    }

    /// Validates and compiles the snapshot's certificates with its `default_certificate`
    /// and `fallback_sni` ("" = unset).
    pub fn compile_with_defaults(
        certs: &[v1::TlsCertificate],
        default: Option<&v1::TlsCertificate>,
        fallback_sni: &str,
    ) -> Result<Self, InvalidTlsCertificate> {
        let mut table = Self::compile_sni(certs)?;
        if let Some(cert) = default {
            if !cert.hosts.is_empty() {
                return Err(invalid(
                    cert,
                    "hosts",
                    "the default certificate is not chosen by host; must be empty".into(),
                ));
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let entry = Arc::new(compile_one(cert, &provider)?);
            table.any_client_auth |= !matches!(entry.client_auth, ClientAuth::None);
            table.default = Some(entry);
        }
        table.no_sni = if fallback_sni.is_empty() {
            None
        } else {
            sluice_proto::validate::dns_name(fallback_sni).map_err(|e| InvalidTlsCertificate {
                id: "fallback_sni".into(),
                field: "fallback_sni",
                reason: format!("{fallback_sni:?}: {e}"),
            })?;
            table.lookup(fallback_sni).cloned()
        }
        .or_else(|| table.default.clone());
        Ok(table)
    }

    /// The certificate for a ClientHello's server name (`None`: no SNI): see the module
    /// docs. `None` when the handshake must be refused.
    pub fn select(&self, server_name: Option<&str>) -> Option<&Arc<SniEntry>> {
        match server_name {
            None => self.no_sni.as_ref(),
            Some(name) => self.lookup(name).or(self.default.as_ref()),
        }
    }

    fn compile_sni(certs: &[v1::TlsCertificate]) -> Result<Self, InvalidTlsCertificate> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut table = TlsTable::default();
        for cert in certs {
            let entry = Arc::new(compile_one(cert, &provider)?);
            table.any_client_auth |= !matches!(entry.client_auth, ClientAuth::None);
            if cert.hosts.is_empty() {
                return Err(invalid(cert, "hosts", "empty".into()));
            }
            for host in &cert.hosts {
                let host = host.to_ascii_lowercase();
                let (map, key) = match host.strip_prefix("*.") {
                    Some(suffix) => (&mut table.wildcard, suffix.to_owned()),
                    None => (&mut table.exact, host.clone()),
                };
                if let Some(other) = map.insert(key, Arc::clone(&entry)) {
                    return Err(invalid(
                        cert,
                        "hosts",
                        format!("host {host} is also served by {}", other.id),
                    ));
                }
            }
            table.count += 1;
        }
        Ok(table)
    }

    /// Number of certificates.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are no certificates.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The certificate for a server name: exact match first, then the wildcard of its
    /// parent domain.
    pub fn lookup(&self, server_name: &str) -> Option<&Arc<SniEntry>> {
        let lower;
        let name = if server_name.bytes().any(|b| b.is_ascii_uppercase()) {
            lower = server_name.to_ascii_lowercase();
            lower.as_str()
        } else {
            server_name
        };
        let name = name.strip_suffix('.').unwrap_or(name);
        if let Some(e) = self.exact.get(name) {
            return Some(e);
        }
        let (_, parent) = name.split_once('.')?;
        self.wildcard.get(parent)
    }
}

fn invalid(
    cert: &v1::TlsCertificate,
    field: &'static str,
    reason: String,
) -> InvalidTlsCertificate {
    InvalidTlsCertificate {
        id: cert.id.clone(),
        field,
        reason,
    }
}

fn compile_one(
    cert: &v1::TlsCertificate,
    provider: &Arc<CryptoProvider>,
) -> Result<SniEntry, InvalidTlsCertificate> {
    let chain = CertificateDer::pem_slice_iter(cert.cert_chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(cert, "cert_chain_pem", format!("not valid PEM: {e:?}")))?;
    if chain.is_empty() {
        return Err(invalid(cert, "cert_chain_pem", "no certificate".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(cert.private_key_pem.as_bytes())
        .map_err(|e| invalid(cert, "private_key_pem", format!("not valid PEM: {e:?}")))?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| invalid(cert, "cert_chain_pem", e.to_string()))?;
    let (builder, client_auth) = match &cert.client_auth {
        None => (builder.with_no_client_auth(), ClientAuth::None),
        Some(ca) => {
            let (verifier, mode) = client_verifier(cert, ca, provider)?;
            (builder.with_client_cert_verifier(verifier), mode)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| invalid(cert, "private_key_pem", e.to_string()))?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(SniEntry {
        id: cert.id.clone(),
        config: Arc::new(config),
        client_auth,
    })
}

fn client_verifier(
    cert: &v1::TlsCertificate,
    ca: &v1::TlsClientAuth,
    provider: &Arc<CryptoProvider>,
) -> Result<(Arc<dyn ClientCertVerifier>, ClientAuth), InvalidTlsCertificate> {
    let field = "client_auth.ca_pem";
    let anchors = CertificateDer::pem_slice_iter(ca.ca_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(cert, field, format!("not valid PEM: {e:?}")))?;
    let mut roots = rustls::RootCertStore::empty();
    for der in &anchors {
        roots
            .add(der.clone())
            .map_err(|e| invalid(cert, field, e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(invalid(cert, field, "no CA certificate".into()));
    }
    let skip = if ca.skip_mtls_uri_regex.is_empty() {
        None
    } else {
        Some(
            RegexSet::new(&ca.skip_mtls_uri_regex)
                .map_err(|e| invalid(cert, "client_auth.skip_mtls_uri_regex", e.to_string()))?,
        )
    };
    let mut builder =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider));
    if skip.is_some() {
        builder = builder.allow_unauthenticated();
    }
    let inner = builder
        .build()
        .map_err(|e| invalid(cert, field, e.to_string()))?;
    let verifier = DepthLimited {
        inner,
        max_intermediates: ca.depth.saturating_sub(1) as usize,
        anchors,
    };
    let mode = match skip {
        Some(set) => ClientAuth::Optional(set),
        None => ClientAuth::Required,
    };
    Ok((Arc::new(verifier), mode))
}

/// Verifies client certificates with webpki and limits the chain length as `depth` says.
///
/// NB: webpki has no depth limit of its own; counting the intermediates the client sent
/// (minus copies of the CAs themselves, which some clients include) bounds the path, since
/// webpki only builds paths from those.
#[derive(Debug)]
struct DepthLimited {
    inner: Arc<dyn ClientCertVerifier>,
    max_intermediates: usize,
    anchors: Vec<CertificateDer<'static>>,
}

impl ClientCertVerifier for DepthLimited {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let counted = intermediates
            .iter()
            .filter(|c| !self.anchors.iter().any(|a| a.as_ref() == c.as_ref()))
            .count();
        if counted > self.max_intermediates {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ));
        }
        self.inner
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Resolves no certificate: the handshake of an unknown SNI ends with `access_denied`.
#[derive(Debug)]
struct NoCertificate;

impl ResolvesServerCert for NoCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        None
    }
}

/// The configuration that refuses a handshake (unknown or missing SNI).
fn refusing_config() -> Option<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .ok()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(NoCertificate));
    Some(Arc::new(config))
}

/// What a TLS connection brings to each of its requests.
#[derive(Debug)]
struct TlsConn {
    entry: Arc<SniEntry>,
    has_client_cert: bool,
}

impl TlsConn {
    /// A response refusing the request, if the connection may not serve it.
    fn refuse(&self, req: &Request<Incoming>, store: &Store) -> Option<Response<ProxyBody>> {
        if let ClientAuth::Optional(skip) = &self.entry.client_auth
            && !self.has_client_cert
            && !skip.is_match(req.uri().path())
        {
            return Some(small_response(StatusCode::BAD_REQUEST, NO_CLIENT_CERT_BODY));
        }
        let table = store.table();
        if !table.tls.any_client_auth {
            return None;
        }
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri().host())?;
        let host = strip_port(host);
        let other = table.tls.lookup(host)?;
        if other.id != self.entry.id && !matches!(other.client_auth, ClientAuth::None) {
            return Some(small_response(
                StatusCode::MISDIRECTED_REQUEST,
                MISDIRECTED_BODY,
            ));
        }
        None
    }
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host;
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

fn small_response(status: StatusCode, body: &'static str) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::full(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Accepts TLS connections on `listener` and serves them until the runtime stops.
pub async fn serve_https(listener: TcpListener, store: Arc<Store>, limits: Limits) {
    serve_https_until(listener, store, limits, Drain::never()).await;
}

/// Like [`serve_https`] until `drain` fires; then, as the HTTP listener does, stops
/// accepting, lets open connections finish their in-flight requests and returns when none
/// is left.
pub async fn serve_https_until(
    listener: TcpListener,
    store: Arc<Store>,
    limits: Limits,
    drain: Drain,
) {
    let Some(refuse) = refusing_config() else {
        tracing::error!("cannot build the TLS configuration; HTTPS listener not serving");
        return;
    };
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    crate::wbatch::enable_on_this_thread();
    let timer = CoarseTimer::new();
    tokio::spawn(timer.clone().run());
    let (h1, h2) = connection_builders(&limits, &timer);
    let mut stop = drain.clone();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.wait() => break,
            a = async {
                let permit = Arc::clone(&permits).acquire_owned().await.ok()?;
                Some((permit, listener.accept().await))
            } => a,
        };
        let Some((permit, accepted)) = accepted else {
            return;
        };
        let (stream, remote) = match accepted {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let local = stream.local_addr().unwrap_or(remote);
        let store = Arc::clone(&store);
        let (h1, h2) = (Arc::clone(&h1), Arc::clone(&h2));
        let timer = timer.clone();
        let refuse = Arc::clone(&refuse);
        let mut drain = drain.clone();
        tokio::spawn(async move {
            let deadline = limits.header_read_timeout;
            let handshaken = tokio::select! {
                h = tokio::time::timeout(
                    deadline,
                    handshake(crate::wbatch::BatchedStream::new(stream), remote, &store, refuse),
                ) => h,
                _ = drain.wait() => return,
            };
            let Ok(Some((tls, conn))) = handshaken else {
                return;
            };
            let is_h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            let info = Arc::new(ConnInfo::new(remote, local, "https", timer));
            let conn = Arc::new(conn);
            let service = service_fn(move |req: Request<Incoming>| {
                let store = Arc::clone(&store);
                let info = Arc::clone(&info);
                let conn = Arc::clone(&conn);
                async move {
                    if let Some(resp) = conn.refuse(&req, &store) {
                        store.metrics().observe_status(resp.status());
                        return Ok::<_, std::convert::Infallible>(resp);
                    }
                    Ok(handle(req, &info, &store).await)
                }
            });
            let io = TokioIo::new(tls);
            let result = if is_h2 {
                let conn = h2.serve_connection(io, service);
                tokio::pin!(conn);
                tokio::select! {
                    r = conn.as_mut() => r,
                    _ = drain.wait() => {
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                }
            } else {
                let conn = h1.serve_connection(io, service).with_upgrades();
                tokio::pin!(conn);
                tokio::select! {
                    r = conn.as_mut() => r,
                    _ = drain.wait() => {
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "downstream TLS connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    // Every connection holds a permit: having them all back means none is left.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = permits.acquire_many(all).await;
    // Upgraded (WebSocket) sessions outlive their connection: serve them until they close
    // (the process's --drain-timeout bounds the wait).
    crate::websocket::sessions_closed().await;
}

/// Reads the ClientHello, picks the configuration for its SNI from the current table and
/// completes the handshake. `None` when the handshake failed (logged at debug level).
async fn handshake(
    stream: crate::wbatch::BatchedStream,
    remote: SocketAddr,
    store: &Store,
    refuse: Arc<ServerConfig>,
) -> Option<(
    tokio_rustls::server::TlsStream<crate::wbatch::BatchedStream>,
    TlsConn,
)> {
    let start = match LazyConfigAcceptor::new(Acceptor::default(), stream).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(%remote, error = %e, "not a TLS ClientHello");
            return None;
        }
    };
    let sni = start.client_hello().server_name().map(str::to_owned);
    let entry = store.table().tls.select(sni.as_deref()).cloned();
    let Some(entry) = entry else {
        tracing::debug!(%remote, sni = ?sni, "TLS handshake refused: no certificate for this server name");
        // NB: finishing the handshake with a resolver that has no certificate sends the
        // client an `access_denied` alert rather than just closing the socket.
        let _ = start.into_stream(refuse).await;
        return None;
    };
    match start.into_stream(Arc::clone(&entry.config)).await {
        Ok(tls) => {
            let has_client_cert = tls.get_ref().1.peer_certificates().is_some();
            Some((
                tls,
                TlsConn {
                    entry,
                    has_client_cert,
                },
            ))
        }
        Err(e) => {
            tracing::debug!(%remote, sni = ?sni, error = %e, "TLS handshake failed");
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_stripped() {
        assert_eq!(strip_port("a.com:8443"), "a.com");
        assert_eq!(strip_port("a.com"), "a.com");
    }
}
