//! The certificates of a snapshot compiled into a [`TlsTable`], swapped in with the
//! [`crate::config::table::RouteTable`] it belongs to; the HTTPS listener
//! ([`crate::listener::tls`]) picks a handshake configuration from it by SNI.
//!
//! - SNI selection: an exact host beats a wildcard; `*.example.com` covers exactly one
//!   label (`a.example.com`, not `a.b.example.com`), as certificate wildcards do.
//! - A ClientHello without SNI gets the certificate of the snapshot's `fallback_sni` host
//!   (APISIX `apisix.ssl.fallback_sni`) if one covers it, else the default certificate.
//!   A ClientHello for a host no certificate covers gets the snapshot's
//!   `default_certificate` (ingress-nginx `--default-ssl-certificate`); the default is
//!   never served for a host another certificate covers. Without a default such
//!   handshakes are refused ([`refusing_config`]): a client never gets another tenant's
//!   certificate.
//! - One `rustls::ServerConfig` per certificate, built when the snapshot compiles, never per
//!   connection.
//! - Client mTLS: the CA bundle, `depth` (most intermediates between the client certificate
//!   and a CA: `depth - 1`, as nginx's `ssl_verify_depth` counts) and
//!   `skip_mtls_uri_regex` ([`ClientAuth`]).
//! - TLS 1.3 and 1.2 with rustls' default (modern, AEAD-only) suites from the ring provider;
//!   ECDSA, Ed25519 and RSA keys.

use std::collections::HashMap;
use std::sync::Arc;

use regex::RegexSet;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use sluice_proto::v1;

/// ALPN protocols offered, in server preference order.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

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

/// Certificates of one snapshot indexed by host, as the HTTPS listener chooses them (see
/// the module docs): `T` is the compiled entry ([`TlsTable`]) or, for tools that only
/// explain the choice, the certificate id ([`SniIndex::ids`], which needs no key).
#[derive(Debug)]
pub struct SniIndex<T> {
    exact: HashMap<String, T>,
    /// For a ClientHello without SNI: the fallback SNI's certificate, else the default.
    no_sni: Option<T>,
    /// For a host no certificate covers.
    default: Option<T>,
    /// Keyed by the wildcard's suffix without `*.`.
    wildcard: HashMap<String, T>,
    count: usize,
}

impl<T> Default for SniIndex<T> {
    fn default() -> Self {
        SniIndex {
            exact: HashMap::new(),
            no_sni: None,
            default: None,
            wildcard: HashMap::new(),
            count: 0,
        }
    }
}

impl<T: Clone> SniIndex<T> {
    /// Indexes `certs` (each built into a `T` by `build`) with the snapshot's
    /// `default_certificate` and `fallback_sni` ("" = unset), validating hosts as the
    /// dataplane does.
    pub fn build(
        certs: &[v1::TlsCertificate],
        default: Option<&v1::TlsCertificate>,
        fallback_sni: &str,
        mut build: impl FnMut(&v1::TlsCertificate) -> Result<T, InvalidTlsCertificate>,
    ) -> Result<Self, InvalidTlsCertificate> {
        let mut index = SniIndex::default();
        for cert in certs {
            let entry = build(cert)?;
            if cert.hosts.is_empty() {
                return Err(invalid(cert, "hosts", "empty".into()));
            }
            for host in &cert.hosts {
                let host = host.to_ascii_lowercase();
                let (map, key) = match host.strip_prefix("*.") {
                    Some(suffix) => (&mut index.wildcard, suffix.to_owned()),
                    None => (&mut index.exact, host.clone()),
                };
                if map.insert(key, entry.clone()).is_some() {
                    let other = certs
                        .iter()
                        .find(|c| c.hosts.iter().any(|h| h.eq_ignore_ascii_case(&host)))
                        .map(|c| c.id.as_str())
                        .unwrap_or_default();
                    return Err(invalid(
                        cert,
                        "hosts",
                        format!("host {host} is also served by {other}"),
                    ));
                }
            }
            index.count += 1;
        }
        if let Some(cert) = default {
            if !cert.hosts.is_empty() {
                return Err(invalid(
                    cert,
                    "hosts",
                    "the default certificate is not chosen by host; must be empty".into(),
                ));
            }
            index.default = Some(build(cert)?);
        }
        index.no_sni = if fallback_sni.is_empty() {
            None
        } else {
            sluice_proto::validate::dns_name(fallback_sni).map_err(|e| InvalidTlsCertificate {
                id: "fallback_sni".into(),
                field: "fallback_sni",
                reason: format!("{fallback_sni:?}: {e}"),
            })?;
            index.lookup(fallback_sni).cloned()
        }
        .or_else(|| index.default.clone());
        Ok(index)
    }
}

impl SniIndex<String> {
    /// The ids of a snapshot's certificates, chosen exactly as the HTTPS listener chooses
    /// the compiled ones. Reads no key: works on a redacted snapshot.
    pub fn ids(snapshot: &v1::Snapshot) -> Result<Self, InvalidTlsCertificate> {
        Self::build(
            &snapshot.tls_certificates,
            snapshot.default_certificate.as_ref(),
            &snapshot.fallback_sni,
            |c| Ok(c.id.clone()),
        )
    }
}

impl<T> SniIndex<T> {
    /// The certificate for a ClientHello's server name (`None`: no SNI): see the module
    /// docs. `None` when the handshake must be refused.
    pub fn select(&self, server_name: Option<&str>) -> Option<&T> {
        match server_name {
            None => self.no_sni.as_ref(),
            Some(name) => self.lookup(name).or(self.default.as_ref()),
        }
    }

    /// The certificate for a server name: exact match first, then the wildcard of its
    /// parent domain.
    pub fn lookup(&self, server_name: &str) -> Option<&T> {
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

    /// The certificate whose hosts cover a request's host (canonical, see
    /// [`crate::http::host::HostName`]) most specifically, for the mTLS guard: the exact
    /// host, else the wildcard of the longest parent domain. NB: unlike [`SniIndex::lookup`],
    /// a wildcard covers any depth of subdomain here (`*.example.com` covers
    /// `a.b.example.com`), as a route's `*.example.com` matches it: a host the router serves
    /// under an mTLS wildcard is guarded by it. The default certificate covers nothing.
    pub fn covering(&self, host: &str) -> Option<&T> {
        if let Some(e) = self.exact.get(host) {
            return Some(e);
        }
        let mut rest = host;
        while let Some((_, parent)) = rest.split_once('.') {
            if let Some(e) = self.wildcard.get(parent) {
                return Some(e);
            }
            rest = parent;
        }
        None
    }

    /// Number of certificates chosen by host (the default not counted).
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no certificate is chosen by host.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// The certificates of one snapshot, compiled and indexed by SNI.
#[derive(Debug, Default)]
pub struct TlsTable {
    index: SniIndex<Arc<SniEntry>>,
    /// Whether any certificate asks for client certificates.
    pub(crate) any_client_auth: bool,
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
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut any_client_auth = false;
        let index = SniIndex::build(certs, default, fallback_sni, |cert| {
            let entry = Arc::new(compile_one(cert, &provider, false)?);
            any_client_auth |= !matches!(entry.client_auth, ClientAuth::None);
            Ok(entry)
        })?;
        Ok(TlsTable {
            index,
            any_client_auth,
        })
    }

    /// Validates and compiles the certificates of a per-Gateway port, each verifying client
    /// certificates as the port's `validation` says (Gateway `spec.tls.frontend`):
    /// `AllowValidOnly` requires a valid one ([`ClientAuth::Required`]);
    /// `AllowInsecureFallback` asks for one but serves every connection, with or without a
    /// valid one ([`ClientAuth::None`]: nothing to check per request).
    pub fn compile_for_listener(
        certs: &[v1::TlsCertificate],
        default: Option<&v1::TlsCertificate>,
        validation: Option<&v1::FrontendValidation>,
    ) -> Result<Self, InvalidTlsCertificate> {
        let Some(v) = validation else {
            return Self::compile_with_defaults(certs, default, "");
        };
        let with_validation = |c: &v1::TlsCertificate| v1::TlsCertificate {
            client_auth: Some(v1::TlsClientAuth {
                ca_pem: v.ca_pem.clone(),
                depth: FRONTEND_DEPTH,
                skip_mtls_uri_regex: Vec::new(),
            }),
            ..c.clone()
        };
        let certs: Vec<v1::TlsCertificate> = certs.iter().map(with_validation).collect();
        let default = default.map(with_validation);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut any_client_auth = false;
        let index = SniIndex::build(&certs, default.as_ref(), "", |cert| {
            let entry = Arc::new(compile_one(cert, &provider, v.insecure_fallback)?);
            any_client_auth |= !matches!(entry.client_auth, ClientAuth::None);
            Ok(entry)
        })?;
        Ok(TlsTable {
            index,
            any_client_auth,
        })
    }

    /// The certificate for a ClientHello's server name (`None`: no SNI): see the module
    /// docs. `None` when the handshake must be refused.
    pub fn select(&self, server_name: Option<&str>) -> Option<&Arc<SniEntry>> {
        self.index.select(server_name)
    }

    /// The certificate covering a request's host for the mTLS guard
    /// ([`SniIndex::covering`]).
    pub fn covering(&self, host: &str) -> Option<&Arc<SniEntry>> {
        self.index.covering(host)
    }

    /// Number of certificates.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether there are no certificates.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The certificate for a server name: exact match first, then the wildcard of its
    /// parent domain.
    pub fn lookup(&self, server_name: &str) -> Option<&Arc<SniEntry>> {
        self.index.lookup(server_name)
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

/// Session-ticket keys per certificate: TLS 1.3 (and 1.2) sessions resume from a stateless
/// ticket, whatever the number of clients and across snapshots that keep the certificate,
/// instead of from rustls's default 256-entry session cache, which a busy listener evicts
/// before clients come back (measured: 38% of resumption attempts resumed).
///
/// - The keys belong to one certificate chain: a rotated certificate gets new keys, so no
///   session made under the old certificate resumes under the new one. They live as long
///   as a compiled configuration uses them; rustls also rotates them every 6 hours.
/// - Certificates that ask for client certificates issue no tickets and keep their own
///   cache: a session never crosses into a configuration that verifies clients.
/// - rustls binds a resumed session to its server name (RFC 6066).
fn ticketer_for(chain_pem: &str) -> Option<Arc<dyn rustls::server::ProducesTickets>> {
    type Keys = std::sync::Weak<dyn rustls::server::ProducesTickets>;
    static TICKETERS: std::sync::Mutex<Option<HashMap<String, Keys>>> = std::sync::Mutex::new(None);
    let mut map = match TICKETERS.lock() {
        Ok(m) => m,
        Err(p) => p.into_inner(),
    };
    let map = map.get_or_insert_with(HashMap::new);
    if let Some(t) = map.get(chain_pem).and_then(std::sync::Weak::upgrade) {
        return Some(t);
    }
    map.retain(|_, t| t.strong_count() > 0);
    let t = rustls::crypto::ring::Ticketer::new().ok()?;
    map.insert(chain_pem.to_owned(), Arc::downgrade(&t));
    Some(t)
}

/// Most intermediates plus one between a client certificate and its CA under Gateway
/// frontend validation, which has no depth setting (nginx's `ssl_verify_depth` counting).
const FRONTEND_DEPTH: u32 = 10;

/// Compiles one certificate; `insecure_fallback`: its client certificates are asked for but
/// never required nor refused (Gateway `AllowInsecureFallback`).
fn compile_one(
    cert: &v1::TlsCertificate,
    provider: &Arc<CryptoProvider>,
    insecure_fallback: bool,
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
        Some(ca) if insecure_fallback => {
            let (verifier, _) = client_verifier(cert, ca, provider)?;
            let verifier: Arc<dyn ClientCertVerifier> = Arc::new(Fallback(verifier));
            (
                builder.with_client_cert_verifier(verifier),
                ClientAuth::None,
            )
        }
        Some(ca) => {
            let (verifier, mode) = client_verifier(cert, ca, provider)?;
            (builder.with_client_cert_verifier(verifier), mode)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| invalid(cert, "private_key_pem", e.to_string()))?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    if cert.client_auth.is_none()
        && let Some(ticketer) = ticketer_for(&cert.cert_chain_pem)
    {
        config.ticketer = ticketer;
    }
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

/// Gateway `AllowInsecureFallback`: asks for a client certificate, and accepts a connection
/// without one or with one that does not verify (the handshake's signature checks still
/// run: a client cannot present a certificate whose key it does not hold).
#[derive(Debug)]
struct Fallback(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for Fallback {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // NB: the verdict is not used: the fallback serves either way.
        let _ = self.0.verify_client_cert(end_entity, intermediates, now);
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
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
pub(crate) fn refusing_config() -> Option<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .ok()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(NoCertificate));
    Some(Arc::new(config))
}
