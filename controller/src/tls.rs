//! Mutual TLS for the snapshot channel, with certificates read from PEM files (e.g. a
//! cert-manager Secret mounted into the pod).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// Why the channel's security settings were refused.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key file could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not PEM of the expected kind.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: &'static str,
    },
    /// Some but not all of `--tls-cert`, `--tls-key` and `--tls-ca` were given.
    #[error("--tls-cert, --tls-key and --tls-ca go together; missing: {0}")]
    Incomplete(String),
    /// Neither certificates nor `--insecure` were given.
    #[error(
        "the snapshot channel needs --tls-cert, --tls-key and --tls-ca (mutual TLS); \
         --insecure is allowed only on a loopback address"
    )]
    Missing,
    /// `--insecure` together with certificates.
    #[error("--insecure and --tls-* exclude each other")]
    Conflict,
    /// `--insecure` on an address other machines can reach.
    #[error(
        "--insecure refused: {0} is not a loopback address; snapshots carry TLS keys, so \
         plaintext is allowed only on 127.0.0.1/::1"
    )]
    NotLoopback(SocketAddr),
}

/// Paths of the server's certificate chain and key and of the CA that signs dataplane
/// (client) certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain of the controller (`--tls-cert`).
    pub cert: PathBuf,
    /// PEM private key of the controller (`--tls-key`).
    pub key: PathBuf,
    /// PEM CA bundle that dataplane certificates must chain to (`--tls-ca`).
    pub ca: PathBuf,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn require_pem(
    path: &Path,
    pem: &[u8],
    marker: &str,
    reason: &'static str,
) -> Result<(), TlsError> {
    let text = String::from_utf8_lossy(pem);
    if text.contains("-----BEGIN ") && text.contains(marker) {
        Ok(())
    } else {
        Err(TlsError::Pem {
            path: path.to_path_buf(),
            reason,
        })
    }
}

impl TlsFiles {
    /// Builds the files from the three optional flags: all or none.
    pub fn from_flags(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        ca: Option<PathBuf>,
    ) -> Result<Option<Self>, TlsError> {
        match (cert, key, ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(Self { cert, key, ca })),
            (cert, key, ca) => {
                let missing: Vec<&str> = [
                    (cert.is_none(), "--tls-cert"),
                    (key.is_none(), "--tls-key"),
                    (ca.is_none(), "--tls-ca"),
                ]
                .into_iter()
                .filter_map(|(m, n)| m.then_some(n))
                .collect();
                Err(TlsError::Incomplete(missing.join(", ")))
            }
        }
    }

    /// Reads the files into a server configuration that requires a client certificate
    /// signed by the CA.
    pub fn server_config(&self) -> Result<ServerTlsConfig, TlsError> {
        let cert = read(&self.cert)?;
        let key = read(&self.key)?;
        let ca = read(&self.ca)?;
        require_pem(&self.cert, &cert, "CERTIFICATE", "not a PEM certificate")?;
        require_pem(&self.key, &key, "PRIVATE KEY", "not a PEM private key")?;
        require_pem(&self.ca, &ca, "CERTIFICATE", "not a PEM CA certificate")?;
        Ok(ServerTlsConfig::new()
            .identity(Identity::from_pem(cert, key))
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(false))
    }
}

/// Decides how the channel on `listen` is secured: mutual TLS from `files`, or plaintext
/// when `insecure` is set and `listen` is a loopback address.
pub fn channel_security(
    listen: SocketAddr,
    files: Option<&TlsFiles>,
    insecure: bool,
) -> Result<Option<ServerTlsConfig>, TlsError> {
    match (files, insecure) {
        (Some(_), true) => Err(TlsError::Conflict),
        (Some(files), false) => files.server_config().map(Some),
        (None, true) if listen.ip().is_loopback() => Ok(None),
        (None, true) => Err(TlsError::NotLoopback(listen)),
        (None, false) => Err(TlsError::Missing),
    }
}

/// Installs rustls' `ring` provider as the process default. tonic's server builds its
/// rustls configuration with the process default; Sluice never links aws-lc.
pub fn install_crypto_provider() {
    // NB: fails only when a provider is already installed, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn insecure_only_on_loopback() {
        let lo: SocketAddr = "127.0.0.1:18000".parse().unwrap();
        let lo6: SocketAddr = "[::1]:18000".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:18000".parse().unwrap();
        assert!(matches!(channel_security(lo, None, true), Ok(None)));
        assert!(matches!(channel_security(lo6, None, true), Ok(None)));
        let err = channel_security(any, None, true).unwrap_err();
        assert!(err.to_string().contains("not a loopback address"), "{err}");
        let err = channel_security(lo, None, false).unwrap_err();
        assert!(err.to_string().contains("--tls-cert"), "{err}");
    }

    #[test]
    fn tls_flags_go_together() {
        let err = TlsFiles::from_flags(Some("c".into()), None, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--tls-cert, --tls-key and --tls-ca go together; missing: --tls-key, --tls-ca"
        );
        assert!(TlsFiles::from_flags(None, None, None).unwrap().is_none());
    }

    #[test]
    fn unreadable_and_non_pem_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "hello").unwrap();
        let files = TlsFiles {
            cert: junk.clone(),
            key: junk.clone(),
            ca: dir.path().join("missing.pem"),
        };
        let err = files.server_config().unwrap_err();
        assert!(
            err.to_string().contains("missing.pem: cannot read"),
            "{err}"
        );
        let files = TlsFiles {
            cert: junk.clone(),
            key: junk.clone(),
            ca: junk.clone(),
        };
        let err = files.server_config().unwrap_err();
        assert!(
            err.to_string().ends_with("junk.pem: not a PEM certificate"),
            "{err}"
        );
    }
}
