//! Test certificates (rcgen): a CA made for one test, leaves it signs, self-signed
//! certificates. Keys are ECDSA P-256 unless a test passes its own. It panics when rcgen
//! fails, as an assertion would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls_pki_types::CertificateDer;

/// A certificate authority made for one test.
pub struct Ca {
    /// Its certificate, PEM.
    pub pem: String,
    /// Its certificate, DER (a trust anchor for a client).
    pub der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    /// A self-signed CA with common name `name`, no path-length limit and rcgen's default
    /// extensions.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        Ca::from_params(params)
    }

    /// A CA self-signed from `params` exactly as given (set `is_ca` and any key usages).
    pub fn from_params(params: CertificateParams) -> Ca {
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    /// The signer, for certificates this module does not shape (e.g. an intermediate CA).
    pub fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }

    /// A certificate of `params` for `key`, signed by this CA.
    pub fn sign_with(&self, params: CertificateParams, key: KeyPair) -> Cert {
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let mut cert = Cert::new(cert, &key);
        cert.chain_pem.push_str(&self.pem);
        cert
    }

    /// A certificate of `params` for a new key, signed by this CA.
    pub fn sign(&self, params: CertificateParams) -> Cert {
        self.sign_with(params, KeyPair::generate().unwrap())
    }

    /// A leaf for `names` (DNS names or IP addresses as subject alternative names), with
    /// the first name (or `client`) as common name and rcgen's default extensions.
    pub fn leaf(&self, names: &[&str]) -> Cert {
        self.leaf_with(names, KeyPair::generate().unwrap())
    }

    /// [`Ca::leaf`] for a given key (e.g. RSA instead of the default P-256).
    pub fn leaf_with(&self, names: &[&str], key: KeyPair) -> Cert {
        let mut params = params_for(names);
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("client"),
        );
        self.sign_with(params, key)
    }
}

/// A certificate with its private key.
#[derive(Debug, Clone)]
pub struct Cert {
    /// The certificate, PEM.
    pub pem: String,
    /// The certificate, DER.
    pub der: CertificateDer<'static>,
    /// The certificate then its issuer's (PEM), as a server sends its chain; the
    /// certificate alone when self-signed.
    pub chain_pem: String,
    /// The private key, PKCS#8 PEM.
    pub key_pem: String,
    /// The private key, PKCS#8 DER.
    pub key_der: Vec<u8>,
}

impl Cert {
    fn new(cert: rcgen::Certificate, key: &KeyPair) -> Cert {
        Cert {
            pem: cert.pem(),
            der: cert.der().clone(),
            chain_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            key_der: key.serialize_der(),
        }
    }
}

/// `CertificateParams` with `names` as subject alternative names.
pub fn params_for(names: &[&str]) -> CertificateParams {
    CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
}

/// A self-signed certificate for `names` (rcgen's default subject and extensions).
pub fn self_signed(names: &[&str]) -> Cert {
    self_signed_from(params_for(names))
}

/// A certificate of `params` for a new key, signed by itself.
pub fn self_signed_from(params: CertificateParams) -> Cert {
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Cert::new(cert, &key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_names_its_hosts_and_is_signed_by_the_ca() {
        let ca = Ca::new("test CA");
        let leaf = ca.leaf(&["a.example", "127.0.0.1"]);
        assert!(leaf.pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(leaf.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert_ne!(leaf.der, ca.der);
        assert_eq!(leaf.chain_pem, format!("{}{}", leaf.pem, ca.pem));
        let own = self_signed(&["b.example"]);
        assert!(own.pem.starts_with("-----BEGIN CERTIFICATE-----"));
    }
}
