//! TLS to upstreams (schemes `https` and `grpcs`): the rustls client configuration of an
//! upstream, built once when a snapshot compiles, and the handshake.
//!
//! The upstream's certificate is always verified: against the snapshot's CA bundle
//! (`UpstreamTls.ca_pem`, from the `ca.crt` key of the ApisixUpstream `tlsSecret`) when
//! there is one, else against the system roots. The name verified, and sent as SNI, is
//! `UpstreamTls.sni` when set, else the endpoint host (an IP endpoint is verified against the
//! certificate's IP addresses and sends no SNI). A client certificate is presented when the
//! snapshot carries one (upstream mTLS).
//!
//! With subject alternative names (`UpstreamTls.subject_alt_dns_names` / `subject_alt_uris`,
//! from a BackendTLSPolicy's `subjectAltNames` or an ApisixUpstream's `tlsVerify`), the
//! certificate must carry one of them instead of the SNI name, which is then only sent
//! (the Gateway API's semantics): [`SanVerifier`] checks the chain with rustls' webpki
//! verifier, DNS names with webpki's name matching, and URIs against the certificate's URI
//! SANs as x509-parser reads them.

use std::sync::{Arc, OnceLock};

use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use sluice_proto::v1;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// Why an upstream's TLS settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum InvalidUpstreamTls {
    /// `ca_pem` holds no usable certificate.
    #[error("tls.ca_pem: {0}")]
    Ca(String),
    /// The client certificate or key cannot be used.
    #[error("tls.client_cert_pem/client_key_pem: {0}")]
    ClientCert(String),
    /// `sni` is not a DNS name or IP address.
    #[error("tls.sni: `{0}` is not a DNS name or IP address")]
    Sni(String),
    /// A `subject_alt_dns_names` entry is not a DNS name.
    #[error("tls.subject_alt_dns_names: `{0}` is not a DNS name")]
    SanDns(String),
    /// rustls refused the configuration.
    #[error("tls: {0}")]
    Config(String),
}

/// Application protocols offered in the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// `h2` only (gRPC over TLS).
    H2,
    /// `h2` preferred, `http/1.1` accepted (`https`).
    H2OrHttp11,
    /// `http/1.1` only (WebSocket).
    Http11,
}

/// The TLS client side of one upstream, ready to connect.
#[derive(Debug)]
pub struct UpstreamTlsClient {
    h2: Arc<ClientConfig>,
    both: Arc<ClientConfig>,
    h1: Arc<ClientConfig>,
    sni: Option<ServerName<'static>>,
}

/// The system roots, loaded once per process.
fn system_roots() -> Arc<rustls::RootCertStore> {
    static ROOTS: OnceLock<Arc<rustls::RootCertStore>> = OnceLock::new();
    Arc::clone(ROOTS.get_or_init(|| {
        let mut store = rustls::RootCertStore::empty();
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!(error = %e, "loading a system root certificate failed");
        }
        let (added, ignored) = store.add_parsable_certificates(found.certs);
        tracing::debug!(added, ignored, "system roots for upstream TLS loaded");
        Arc::new(store)
    }))
}

impl UpstreamTlsClient {
    /// Builds the client for `tls` (`None` = system roots, no client certificate, SNI from
    /// the endpoint host).
    pub fn new(tls: Option<&v1::UpstreamTls>) -> Result<Self, InvalidUpstreamTls> {
        Self::with_options(tls, None, true)
    }

    /// Builds the client for active health probes over TLS: like [`Self::new`], with the
    /// name sent as SNI and verified taken from `sni` when given (the probe's `host`), and
    /// without any certificate verification when `verify` is false (APISIX's
    /// `https_verify_certificate: false`, the ApisixUpstream `strictTLS: false`).
    pub fn for_probes(
        tls: Option<&v1::UpstreamTls>,
        sni: Option<&str>,
        verify: bool,
    ) -> Result<Self, InvalidUpstreamTls> {
        Self::with_options(tls, sni, verify)
    }

    fn with_options(
        tls: Option<&v1::UpstreamTls>,
        sni_override: Option<&str>,
        verify: bool,
    ) -> Result<Self, InvalidUpstreamTls> {
        let default = v1::UpstreamTls::default();
        let tls = tls.unwrap_or(&default);
        let roots = if tls.ca_pem.trim().is_empty() {
            system_roots()
        } else {
            let mut store = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(tls.ca_pem.as_bytes()) {
                let cert = cert.map_err(|e| InvalidUpstreamTls::Ca(format!("bad PEM: {e}")))?;
                store
                    .add(cert)
                    .map_err(|e| InvalidUpstreamTls::Ca(format!("bad certificate: {e}")))?;
            }
            if store.is_empty() {
                return Err(InvalidUpstreamTls::Ca("no CERTIFICATE block".into()));
            }
            Arc::new(store)
        };
        let client_auth = match (
            tls.client_cert_pem.trim().is_empty(),
            tls.client_key_pem.trim().is_empty(),
        ) {
            (true, true) => None,
            (false, false) => {
                let chain = CertificateDer::pem_slice_iter(tls.client_cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| InvalidUpstreamTls::ClientCert(format!("bad PEM: {e}")))?;
                if chain.is_empty() {
                    return Err(InvalidUpstreamTls::ClientCert(
                        "no CERTIFICATE block in the client certificate".into(),
                    ));
                }
                let key = PrivateKeyDer::from_pem_slice(tls.client_key_pem.as_bytes())
                    .map_err(|e| InvalidUpstreamTls::ClientCert(format!("bad key: {e}")))?;
                Some((chain, key))
            }
            _ => {
                return Err(InvalidUpstreamTls::ClientCert(
                    "a client certificate needs both the certificate and its key".into(),
                ));
            }
        };
        let sni_name = sni_override.unwrap_or(&tls.sni);
        let sni = if sni_name.is_empty() {
            None
        } else {
            Some(
                ServerName::try_from(sni_name.to_owned())
                    .map_err(|_| InvalidUpstreamTls::Sni(sni_name.to_owned()))?,
            )
        };
        let sans = Sans::new(tls)?;
        let config = |alpn: &[&[u8]]| -> Result<Arc<ClientConfig>, InvalidUpstreamTls> {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
                .with_safe_default_protocol_versions()
                .map_err(|e| InvalidUpstreamTls::Config(e.to_string()))?;
            let builder = if verify && sans.is_empty() {
                builder.with_root_certificates(Arc::clone(&roots))
            } else if verify {
                let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
                    Arc::clone(&roots),
                    Arc::clone(&provider),
                )
                .build()
                .map_err(|e| InvalidUpstreamTls::Config(e.to_string()))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(SanVerifier {
                        webpki,
                        sans: sans.clone(),
                    }))
            } else {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            };
            let mut config = match &client_auth {
                None => builder.with_no_client_auth(),
                Some((chain, key)) => builder
                    .with_client_auth_cert(chain.clone(), key.clone_key())
                    .map_err(|e| InvalidUpstreamTls::ClientCert(e.to_string()))?,
            };
            config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            Ok(Arc::new(config))
        };
        Ok(UpstreamTlsClient {
            h2: config(&[b"h2"])?,
            both: config(&[b"h2", b"http/1.1"])?,
            h1: config(&[b"http/1.1"])?,
            sni,
        })
    }

    /// The name to verify for an endpoint `address` (`host:port` or `[v6]:port`).
    fn server_name(&self, address: &str) -> std::io::Result<ServerName<'static>> {
        if let Some(sni) = &self.sni {
            return Ok(sni.clone());
        }
        let host = address
            .rsplit_once(':')
            .map_or(address, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        ServerName::try_from(host.to_owned()).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("`{host}` is not a valid TLS server name"),
            )
        })
    }

    /// Performs the TLS handshake on `tcp` to the endpoint `address`, offering `alpn`.
    pub async fn connect(
        &self,
        tcp: TcpStream,
        address: &str,
        alpn: Alpn,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let name = self.server_name(address)?;
        let connector = match alpn {
            Alpn::H2 => &self.h2,
            Alpn::H2OrHttp11 => &self.both,
            Alpn::Http11 => &self.h1,
        };
        TlsConnector::from(Arc::clone(connector))
            .connect(name, tcp)
            .await
    }
}

/// Accepts any server certificate, still checking the handshake signatures: for health
/// probes whose configuration turns verification off (`strictTLS: false`), never for traffic.
/// (Public for tests that must see which certificate a server presents, whatever it names.)
#[derive(Debug)]
pub struct NoVerification(pub Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The subject alternative names an upstream's certificate must carry one of.
#[derive(Debug, Clone, Default)]
struct Sans {
    dns: Vec<ServerName<'static>>,
    uris: Vec<String>,
}

impl Sans {
    fn new(tls: &v1::UpstreamTls) -> Result<Self, InvalidUpstreamTls> {
        let dns = tls
            .subject_alt_dns_names
            .iter()
            .map(|n| match ServerName::try_from(n.clone()) {
                Ok(name @ ServerName::DnsName(_)) => Ok(name),
                _ => Err(InvalidUpstreamTls::SanDns(n.clone())),
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            dns,
            uris: tls.subject_alt_uris.clone(),
        })
    }

    fn is_empty(&self) -> bool {
        self.dns.is_empty() && self.uris.is_empty()
    }
}

/// Verifies an upstream certificate against a list of subject alternative names instead of
/// the server name: the chain as [`rustls::client::WebPkiServerVerifier`] does, then a DNS
/// SAN by webpki's own matching (the verifier run for that name) or a URI SAN exactly.
#[derive(Debug)]
struct SanVerifier {
    webpki: Arc<rustls::client::WebPkiServerVerifier>,
    sans: Sans,
}

/// Whether `e` says only that the certificate does not carry the name asked for (webpki
/// checks the name after the chain, so the chain is then known to be good).
fn only_the_name_differs(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. }
        )
    )
}

/// The URI subject alternative names of a DER certificate.
fn uri_sans(cert: &CertificateDer<'_>) -> Result<Vec<String>, rustls::Error> {
    use x509_parser::extensions::GeneralName;
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|_| rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
    let san = parsed
        .subject_alternative_name()
        .map_err(|_| rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
    Ok(san
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(u) => Some((*u).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default())
}

impl rustls::client::danger::ServerCertVerifier for SanVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        for name in &self.sans.dns {
            match self.webpki.verify_server_cert(
                end_entity,
                intermediates,
                name,
                ocsp_response,
                now,
            ) {
                Ok(ok) => return Ok(ok),
                Err(e) if only_the_name_differs(&e) => {}
                Err(e) => return Err(e),
            }
        }
        if !self.sans.uris.is_empty() {
            // The chain, whatever name the certificate carries.
            match self.webpki.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            ) {
                Ok(_) => {}
                Err(e) if only_the_name_differs(&e) => {}
                Err(e) => return Err(e),
            }
            let found = uri_sans(end_entity)?;
            if found.iter().any(|u| self.sans.uris.contains(u)) {
                return Ok(rustls::client::danger::ServerCertVerified::assertion());
            }
        }
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName,
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// Whether the handshake on `stream` settled on HTTP/2.
pub fn negotiated_h2(stream: &TlsStream<TcpStream>) -> bool {
    stream.get_ref().1.alpn_protocol() == Some(b"h2")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_rejected_with_the_field_named() {
        let err = UpstreamTlsClient::new(Some(&v1::UpstreamTls {
            ca_pem: "not a pem".into(),
            ..Default::default()
        }))
        .unwrap_err();
        assert!(err.to_string().starts_with("tls.ca_pem:"), "{err}");
        let err = UpstreamTlsClient::new(Some(&v1::UpstreamTls {
            client_cert_pem: "x".into(),
            ..Default::default()
        }))
        .unwrap_err();
        assert!(err.to_string().contains("both"), "{err}");
    }

    #[test]
    fn server_name_defaults_to_the_endpoint_host() {
        let c = UpstreamTlsClient::new(None).unwrap();
        assert_eq!(
            c.server_name("backend.example:443").unwrap(),
            ServerName::try_from("backend.example").unwrap()
        );
        assert!(matches!(
            c.server_name("[::1]:443").unwrap(),
            ServerName::IpAddress(_)
        ));
    }
}
