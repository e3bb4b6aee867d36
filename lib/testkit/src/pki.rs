//! Test certificates (rcgen): a CA made for one test, leaves it signs, self-signed
//! certificates. Keys are ECDSA P-256 unless a test passes its own ([`RsaKey`] makes an RSA
//! 2048 one with openssl). It panics when rcgen
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

    /// An intermediate CA with common name `name`, signed by this one (no path-length
    /// limit); its `pem` and `der` are the intermediate's certificate.
    pub fn intermediate(&self, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Ca {
            pem: cert.pem(),
            der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    /// The signer, for certificates this module does not shape.
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

/// An RSA 2048 key made by `openssl` (ring signs with RSA but cannot generate RSA keys;
/// `scripts/install/test-deps.sh` installs openssl).
#[derive(Debug, Clone)]
pub struct RsaKey {
    /// The private key, PKCS#8 PEM.
    pub pem: String,
}

impl RsaKey {
    /// A new RSA 2048 key.
    pub fn generate() -> RsaKey {
        let pem = openssl(
            &[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
            ],
            None,
        );
        RsaKey {
            pem: String::from_utf8(pem).unwrap(),
        }
    }

    /// The public key, SubjectPublicKeyInfo PEM.
    pub fn public_pem(&self) -> String {
        String::from_utf8(openssl(&["pkey", "-pubout"], Some(&self.pem))).unwrap()
    }

    /// The modulus, big-endian bytes (a JWK's `n`).
    pub fn modulus(&self) -> Vec<u8> {
        let out =
            String::from_utf8(openssl(&["rsa", "-noout", "-modulus"], Some(&self.pem))).unwrap();
        let hex = out.trim().strip_prefix("Modulus=").unwrap();
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The key for rcgen, to sign a certificate with ([`Ca::leaf_with`]).
    pub fn key_pair(&self) -> KeyPair {
        KeyPair::from_pem_and_sign_algo(&self.pem, &rcgen::PKCS_RSA_SHA256).unwrap()
    }
}

/// The standard output of `openssl args`, fed `stdin`; panics unless it succeeds.
fn openssl(args: &[&str], stdin: Option<&str>) -> Vec<u8> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("openssl")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl (scripts/install/test-deps.sh installs it)");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "openssl {args:?}: {}", out.status);
    out.stdout
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
        let inter = ca.intermediate("intermediate");
        let deep = inter.leaf(&["c.example"]);
        assert_eq!(deep.chain_pem, format!("{}{}", deep.pem, inter.pem));
        assert_ne!(inter.der, ca.der);
    }

    #[test]
    fn an_rsa_key_gives_its_public_half_and_modulus_and_signs_a_leaf() {
        let key = RsaKey::generate();
        assert!(key.pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(key.public_pem().starts_with("-----BEGIN PUBLIC KEY-----"));
        assert_eq!(key.modulus().len(), 256);
        let leaf = Ca::new("test CA").leaf_with(&["rsa.example"], key.key_pair());
        assert!(leaf.pem.starts_with("-----BEGIN CERTIFICATE-----"));
    }
}
