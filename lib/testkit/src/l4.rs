//! Layer-4 origins: a TCP echo, a TLS echo that answers with its own certificate, and a
//! UDP echo, each on a loopback port, counting what they accept.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

/// Echoes every byte back until the client closes its side, then closes.
async fn echo<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if s.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = s.shutdown().await;
}

/// A TCP echo origin.
pub struct TcpEcho {
    /// Where it listens.
    pub addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpEcho {
    /// Starts one on a free loopback port.
    pub async fn start() -> TcpEcho {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(echo(s));
            }
        });
        TcpEcho {
            addr,
            accepted,
            task,
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for TcpEcho {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A TLS echo origin with a self-signed certificate for its name.
pub struct TlsEcho {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its certificate (a client checks it to know which origin answered).
    pub cert: crate::pki::Cert,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsEcho {
    /// Starts one for `name` on a free loopback port.
    pub async fn start(name: &str) -> TlsEcho {
        let cert = crate::pki::self_signed(&[name]);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der.clone()],
                rustls_pki_types::PrivateKeyDer::Pkcs8(cert.key_der.clone().into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(s).await {
                        echo(tls).await;
                    }
                });
            }
        });
        TlsEcho {
            addr,
            cert,
            accepted,
            task,
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for TlsEcho {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A UDP echo origin: each datagram comes back as is, from the address it was sent to.
pub struct UdpEcho {
    /// Where it listens.
    pub addr: SocketAddr,
    received: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl UdpEcho {
    /// Starts one on a free loopback port.
    pub async fn start() -> UdpEcho {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let received = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&received);
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                count.fetch_add(1, Ordering::SeqCst);
                let _ = socket.send_to(&buf[..n], from).await;
            }
        });
        UdpEcho {
            addr,
            received,
            task,
        }
    }

    /// Datagrams received so far.
    pub fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A TLS client configuration that trusts exactly `cert` (no ALPN).
pub fn client_trusting(cert: &crate::pki::Cert) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}
