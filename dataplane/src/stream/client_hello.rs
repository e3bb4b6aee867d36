//! Reads a TLS ClientHello without terminating TLS: what a TLS listener routes on (SNI).
//!
//! - Bounded: at most [`MAX_CLIENT_HELLO`] bytes (records included) within the timeout. A
//!   handshake header that announces more is refused as soon as it is read, without waiting
//!   for the bytes.
//! - The ClientHello may span records (a post-quantum key share makes it about 1.8 KB, and
//!   a client may send 1-byte records): the handshake fragments are reassembled.
//! - Parsing the ClientHello is `tls-parser`'s (any TLS version, no policy: a passthrough
//!   backend may accept clients this dataplane's own TLS would refuse).
//! - Every byte read is returned, to be sent to the upstream (passthrough) or replayed into
//!   the TLS acceptor (terminate).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Most bytes read before the ClientHello must be complete.
pub const MAX_CLIENT_HELLO: usize = 16 * 1024;
/// Default time a client has to send its ClientHello.
pub const CLIENT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);

const RECORD_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;

/// Why no ClientHello was read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClientHelloError {
    /// Not complete within the timeout.
    #[error("no complete ClientHello within the timeout")]
    Timeout,
    /// The client closed (or the read failed) first.
    #[error("connection closed before the ClientHello ended")]
    Closed,
    /// Larger than [`MAX_CLIENT_HELLO`].
    #[error("ClientHello larger than the limit")]
    TooLong,
    /// Not a TLS handshake (HTTP on a TLS port, SSLv2, another record first).
    #[error("not a TLS ClientHello")]
    NotTls,
    /// A handshake record whose ClientHello does not parse.
    #[error("malformed ClientHello")]
    Malformed,
}

/// What a ClientHello says, with the bytes it took.
#[derive(Debug)]
pub struct ClientHello {
    /// `server_name` (host_name), lowercased; `None` when absent.
    pub sni: Option<String>,
    /// ALPN protocols offered.
    pub alpn: Vec<Vec<u8>>,
    /// Every byte read from the client, in order.
    pub bytes: Vec<u8>,
}

/// Reads a ClientHello from `io` within `timeout`.
pub async fn read_client_hello<R: AsyncRead + Unpin>(
    io: &mut R,
    prefix: Vec<u8>,
    timeout: Duration,
) -> Result<ClientHello, ClientHelloError> {
    tokio::time::timeout(timeout, read_inner(io, prefix))
        .await
        .map_err(|_| ClientHelloError::Timeout)?
}

async fn read_inner<R: AsyncRead + Unpin>(
    io: &mut R,
    mut buf: Vec<u8>,
) -> Result<ClientHello, ClientHelloError> {
    loop {
        if let Some(hello) = try_parse(&buf)? {
            let (sni, alpn) = hello;
            return Ok(ClientHello {
                sni,
                alpn,
                bytes: buf,
            });
        }
        if buf.len() >= MAX_CLIENT_HELLO {
            return Err(ClientHelloError::TooLong);
        }
        let mut chunk = [0u8; 2048];
        let take = (MAX_CLIENT_HELLO - buf.len()).min(chunk.len());
        let n = io
            .read(&mut chunk[..take])
            .await
            .map_err(|_| ClientHelloError::Closed)?;
        if n == 0 {
            return Err(ClientHelloError::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

type Parsed = (Option<String>, Vec<Vec<u8>>);

/// The ClientHello in `buf` once complete; `None` while more bytes are needed.
pub fn try_parse(buf: &[u8]) -> Result<Option<Parsed>, ClientHelloError> {
    // Reassemble the handshake fragments of the records read so far, until the
    // ClientHello is complete (what follows it is the client's next flight, not ours).
    let mut handshake: Vec<u8> = Vec::new();
    let mut at = 0;
    loop {
        if let Some(len) = hello_len(&handshake)?
            && handshake.len() >= 4 + len
        {
            return parse_hello(&handshake[..4 + len]).map(Some);
        }
        let Some(header) = buf.get(at..at + 5) else {
            if let Some(&t) = buf.get(at)
                && t != RECORD_HANDSHAKE
            {
                return Err(ClientHelloError::NotTls);
            }
            return Ok(None);
        };
        if header[0] != RECORD_HANDSHAKE || header[1] != 3 {
            return Err(ClientHelloError::NotTls);
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > 16 * 1024 + 2048 {
            return Err(ClientHelloError::NotTls);
        }
        if at + 5 + len > MAX_CLIENT_HELLO {
            return Err(ClientHelloError::TooLong);
        }
        let end = (at + 5 + len).min(buf.len());
        handshake.extend_from_slice(&buf[at + 5..end]);
        if end < at + 5 + len {
            // A partial record: what it holds may already say the hello is too long.
            hello_len(&handshake)?;
            return Ok(None);
        }
        at = end;
    }
}

/// The ClientHello's length from its handshake header, once 4 bytes are there.
fn hello_len(handshake: &[u8]) -> Result<Option<usize>, ClientHelloError> {
    if handshake.len() < 4 {
        return Ok(None);
    }
    if handshake[0] != HANDSHAKE_CLIENT_HELLO {
        return Err(ClientHelloError::NotTls);
    }
    let len = (usize::from(handshake[1]) << 16)
        | (usize::from(handshake[2]) << 8)
        | usize::from(handshake[3]);
    // The handshake plus at least one record header must fit.
    if 4 + len + 5 > MAX_CLIENT_HELLO {
        return Err(ClientHelloError::TooLong);
    }
    Ok(Some(len))
}

fn parse_hello(handshake: &[u8]) -> Result<Parsed, ClientHelloError> {
    use tls_parser::{TlsExtension, TlsMessage, TlsMessageHandshake};
    let (_, msg) = tls_parser::parse_tls_message_handshake(handshake)
        .map_err(|_| ClientHelloError::Malformed)?;
    let TlsMessage::Handshake(TlsMessageHandshake::ClientHello(hello)) = msg else {
        return Err(ClientHelloError::Malformed);
    };
    let mut sni = None;
    let mut alpn = Vec::new();
    if let Some(ext) = hello.ext {
        let (_, exts) =
            tls_parser::parse_tls_extensions(ext).map_err(|_| ClientHelloError::Malformed)?;
        for e in exts {
            match e {
                TlsExtension::SNI(names) => {
                    for (kind, name) in names {
                        if kind.0 == 0 && sni.is_none() {
                            let name = std::str::from_utf8(name)
                                .ok()
                                .filter(|n| !n.is_empty() && n.is_ascii())
                                .ok_or(ClientHelloError::Malformed)?;
                            sni = Some(name.to_ascii_lowercase());
                        }
                    }
                }
                TlsExtension::ALPN(list) => alpn = list.iter().map(|p| p.to_vec()).collect(),
                _ => {}
            }
        }
    }
    Ok((sni, alpn))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A real ClientHello from rustls for `sni` (None: without SNI).
    fn hello(sni: Option<&str>) -> Vec<u8> {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        config.enable_sni = sni.is_some();
        let name =
            rustls::pki_types::ServerName::try_from(sni.unwrap_or("x.test").to_owned()).unwrap();
        let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    /// The same handshake re-framed in records of `size` bytes.
    fn refragment(bytes: &[u8], size: usize) -> Vec<u8> {
        let body = &bytes[5..];
        let mut out = Vec::new();
        for chunk in body.chunks(size) {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    #[test]
    fn sni_and_alpn_from_one_record_or_many() {
        let h = hello(Some("Db.Example.com"));
        assert_eq!(
            try_parse(&h).unwrap(),
            Some((Some("db.example.com".into()), vec![b"h2".to_vec()]))
        );
        for size in [1, 7, 100] {
            let f = refragment(&h, size);
            assert_eq!(
                try_parse(&f).unwrap().unwrap().0.as_deref(),
                Some("db.example.com")
            );
            // Every strict prefix wants more.
            for cut in [0, 3, 5, f.len() / 2, f.len() - 1] {
                assert_eq!(try_parse(&f[..cut]).unwrap(), None, "size {size} cut {cut}");
            }
        }
        assert_eq!(try_parse(&hello(None)).unwrap().unwrap().0, None);
    }

    #[test]
    fn not_tls_and_oversized_are_refused_early() {
        assert_eq!(
            try_parse(b"GET / HTTP/1.1\r\n"),
            Err(ClientHelloError::NotTls)
        );
        assert_eq!(try_parse(b"G"), Err(ClientHelloError::NotTls));
        // SSLv2-compatible hello.
        assert_eq!(
            try_parse(&[0x80, 0x2e, 0x01, 0x03, 0x01]),
            Err(ClientHelloError::NotTls)
        );
        // A record of 16 KiB announcing a 100 KB ClientHello: refused on its first bytes.
        let mut big = vec![22, 3, 1, 0x40, 0x00, 1, 0x01, 0x86, 0xa0];
        big.extend_from_slice(&[0; 16]);
        assert_eq!(try_parse(&big), Err(ClientHelloError::TooLong));
        // Handshake of another type.
        assert_eq!(
            try_parse(&[22, 3, 1, 0, 4, 2, 0, 0, 0]),
            Err(ClientHelloError::NotTls)
        );
    }

    #[tokio::test]
    async fn reads_every_byte_it_parsed() {
        let h = refragment(&hello(Some("a.com")), 50);
        let mut input = h.clone();
        input.extend_from_slice(b"more");
        let mut r = input.as_slice();
        let got = read_client_hello(&mut r, Vec::new(), Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(got.sni.as_deref(), Some("a.com"));
        assert!(got.bytes.starts_with(&h));
    }
}
