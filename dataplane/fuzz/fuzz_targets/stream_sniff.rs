//! The stream stage's bounded readers of a connection's first bytes (issue 41): the PROXY
//! protocol header (`dataplane/src/stream/proxy_protocol.rs`, also read by the HTTP and HTTPS
//! listeners) and the TLS ClientHello (`dataplane/src/stream/client_hello.rs`).
//!
//! From the input: the first byte sets how many bytes a read returns (1 to 64, so headers
//! and records arrive split anywhere); the rest is what the client sends, then EOF.
//!
//! Properties:
//! - Neither reader panics.
//! - Bounded consumption: the PROXY reader takes at most 16 + `MAX_V2_PAYLOAD` + 1 bytes,
//!   the ClientHello reader at most `MAX_CLIENT_HELLO`, whatever comes.
//! - What a reader returns is what it read: the bytes past a PROXY header are the stream's
//!   next bytes; a ClientHello's bytes are the stream's first bytes, and they parse to the
//!   same answer on their own and in one piece (`try_parse`).
//! - The framing is the module's own; the parsing is the crates'. So the framing must agree
//!   with the crates' own framing: a PROXY header the module accepts is one `ppp` accepts
//!   from the same bytes, with the same length and source address, and a complete header
//!   `ppp` accepts within the bounds is accepted (or refused by policy: DGRAM, UNIX); a
//!   ClientHello the module reassembles from records is the one `tls-parser`'s record parser
//!   (`parse_tls_raw_record`) reassembles, with the same SNI and ALPN, and a ClientHello
//!   `tls-parser` frames within the bounds is found.
#![no_main]

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use sluice_dataplane::stream::client_hello::{
    ClientHelloError, MAX_CLIENT_HELLO, read_client_hello, try_parse,
};
use sluice_dataplane::stream::proxy_protocol::{
    MAX_V1, MAX_V2_PAYLOAD, ProxyHeaderError, read_header,
};
use tokio::io::{AsyncRead, ReadBuf};

const V2_SIG: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// A client that sends `data` `step` bytes per read, then closes; counts what was taken.
struct Chunked<'a> {
    data: &'a [u8],
    at: usize,
    step: usize,
}

impl AsyncRead for Chunked<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self
            .step
            .min(buf.remaining())
            .min(self.data.len() - self.at);
        let at = self.at;
        buf.put_slice(&self.data[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime")
    })
}

fn ppp_source_v2(h: &ppp::v2::Header<'_>) -> Option<SocketAddr> {
    match h.addresses {
        ppp::v2::Addresses::IPv4(a) => {
            Some(SocketAddr::new(IpAddr::V4(a.source_address), a.source_port))
        }
        ppp::v2::Addresses::IPv6(a) => {
            Some(SocketAddr::new(IpAddr::V6(a.source_address), a.source_port))
        }
        _ => None,
    }
}

/// The would-be v1 line (up to its first CRLF, or the v1 bound) is printable ASCII: ppp 2.3's
/// v1 parser panics on a multi-byte character (slicing inside it) and frames at the first CR,
/// so it is consulted only then; the dataplane refuses any other byte.
fn v1_line_is_printable(stream: &[u8]) -> bool {
    let window = &stream[..stream.len().min(MAX_V1 + 2)];
    let end = window
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or(window.len());
    window[..end].iter().all(|b| (0x20..0x7f).contains(b))
}

fn ppp_source_v1(h: &ppp::v1::Header<'_>) -> Option<SocketAddr> {
    match h.addresses {
        ppp::v1::Addresses::Tcp4(a) => {
            Some(SocketAddr::new(IpAddr::V4(a.source_address), a.source_port))
        }
        ppp::v1::Addresses::Tcp6(a) => {
            Some(SocketAddr::new(IpAddr::V6(a.source_address), a.source_port))
        }
        ppp::v1::Addresses::Unknown => None,
    }
}

fn proxy_header(stream: &[u8], step: usize) {
    let mut io = Chunked {
        data: stream,
        at: 0,
        step,
    };
    let got = runtime().block_on(read_header(&mut io, Duration::from_secs(5)));
    let consumed = io.at;
    assert!(
        consumed <= 16 + MAX_V2_PAYLOAD + 1,
        "the PROXY reader took {consumed} bytes"
    );
    let is_v2 = stream.starts_with(V2_SIG);
    match &got {
        Ok(h) => {
            let len = consumed - h.rest.len();
            assert_eq!(
                &h.rest[..],
                &stream[len..consumed],
                "the bytes past the header"
            );
            if is_v2 {
                let announced = 16 + usize::from(u16::from_be_bytes([stream[14], stream[15]]));
                assert_eq!(len, announced);
                assert!(len <= 16 + MAX_V2_PAYLOAD);
                let theirs = ppp::v2::Header::try_from(stream)
                    .unwrap_or_else(|e| panic!("accepted a v2 header ppp refuses: {e:?}"));
                assert_eq!(theirs.len(), len, "v2 header length");
                if let Some(source) = h.source {
                    assert_eq!(Some(source), ppp_source_v2(&theirs), "v2 source");
                }
            } else {
                assert!(
                    len <= MAX_V1 && stream[..len].ends_with(b"\r\n"),
                    "v1 frame"
                );
                let theirs = ppp::v1::Header::try_from(stream)
                    .unwrap_or_else(|e| panic!("accepted a v1 header ppp refuses: {e:?}"));
                assert_eq!(theirs.header.len(), len, "v1 header length");
                assert_eq!(h.source, ppp_source_v1(&theirs), "v1 source");
            }
        }
        Err(ProxyHeaderError::Timeout) => panic!("a reader that never waits timed out"),
        Err(_) => {}
    }
    // The converse: a complete header ppp frames within the bounds is accepted.
    if is_v2 {
        if let Ok(theirs) = ppp::v2::Header::try_from(stream)
            && theirs.len() <= 16 + MAX_V2_PAYLOAD
        {
            let policy = theirs.command == ppp::v2::Command::Proxy
                && (theirs.protocol != ppp::v2::Protocol::Stream
                    || matches!(theirs.addresses, ppp::v2::Addresses::Unix(_)));
            match &got {
                Ok(h) if theirs.command == ppp::v2::Command::Proxy => {
                    assert_eq!(h.source, ppp_source_v2(&theirs))
                }
                Ok(h) => assert_eq!(h.source, None, "LOCAL keeps the socket's address"),
                Err(ProxyHeaderError::Invalid(_)) if policy => {}
                Err(e) => panic!("refused a v2 header ppp accepts: {e:?}"),
            }
        }
    } else if v1_line_is_printable(stream)
        && let Ok(theirs) = ppp::v1::Header::try_from(stream)
        && theirs.header.ends_with("\r\n")
    {
        match &got {
            Ok(h) => assert_eq!(h.source, ppp_source_v1(&theirs)),
            Err(e) => panic!("refused a v1 header ppp accepts: {e:?}"),
        }
    }
}

/// What tls-parser's record framing makes of `data`: the ClientHello handshake message
/// (header included), once complete, and the bytes its records took.
enum Framed {
    Hello {
        handshake: Vec<u8>,
        used: usize,
    },
    Incomplete,
    /// Not a handshake record, not TLS 1.x, or a record tls-parser refuses.
    Other,
}

fn tls_parser_framing(data: &[u8]) -> Framed {
    let mut handshake = Vec::new();
    let mut rest = data;
    loop {
        if handshake.len() >= 4 {
            let len = (usize::from(handshake[1]) << 16)
                | (usize::from(handshake[2]) << 8)
                | usize::from(handshake[3]);
            if handshake.len() >= 4 + len {
                handshake.truncate(4 + len);
                return Framed::Hello {
                    handshake,
                    used: data.len() - rest.len(),
                };
            }
        }
        match tls_parser::parse_tls_raw_record(rest) {
            Ok((after, record)) => {
                if record.hdr.record_type != tls_parser::TlsRecordType::Handshake
                    || record.hdr.version.0 >> 8 != 3
                    || record.hdr.len == 0
                {
                    return Framed::Other;
                }
                handshake.extend_from_slice(record.data);
                rest = after;
            }
            Err(tls_parser::nom::Err::Incomplete(_)) => return Framed::Incomplete,
            Err(_) => return Framed::Other,
        }
    }
}

type Parsed = (Option<String>, Vec<Vec<u8>>);

/// SNI and ALPN of a ClientHello handshake message, by tls-parser; `None` when it does not
/// parse, or its server name is not a non-empty ASCII name (what the module refuses).
fn tls_parser_hello(handshake: &[u8]) -> Option<Parsed> {
    use tls_parser::{TlsExtension, TlsMessage, TlsMessageHandshake};
    let (_, msg) = tls_parser::parse_tls_message_handshake(handshake).ok()?;
    let TlsMessage::Handshake(TlsMessageHandshake::ClientHello(hello)) = msg else {
        return None;
    };
    let (mut sni, mut alpn) = (None, Vec::new());
    if let Some(ext) = hello.ext {
        let (_, exts) = tls_parser::parse_tls_extensions(ext).ok()?;
        for e in exts {
            match e {
                TlsExtension::SNI(names) => {
                    for (kind, name) in names {
                        if kind.0 == 0 && sni.is_none() {
                            let name = std::str::from_utf8(name)
                                .ok()
                                .filter(|n| !n.is_empty() && n.is_ascii())?;
                            sni = Some(name.to_ascii_lowercase());
                        }
                    }
                }
                TlsExtension::ALPN(list) => alpn = list.iter().map(|p| p.to_vec()).collect(),
                _ => {}
            }
        }
    }
    Some((sni, alpn))
}

fn client_hello(stream: &[u8], step: usize) {
    let whole = try_parse(stream);
    let mut io = Chunked {
        data: stream,
        at: 0,
        step,
    };
    let read = runtime().block_on(read_client_hello(
        &mut io,
        Vec::new(),
        Duration::from_secs(5),
    ));
    let consumed = io.at;
    assert!(
        consumed <= MAX_CLIENT_HELLO,
        "the ClientHello reader took {consumed} bytes"
    );
    match &read {
        Ok(hello) => {
            assert_eq!(&hello.bytes[..], &stream[..consumed], "the bytes it read");
            let again = try_parse(&hello.bytes).expect("its own bytes parse");
            assert_eq!(again, Some((hello.sni.clone(), hello.alpn.clone())));
            assert_eq!(whole, Ok(again), "read in pieces and whole");
        }
        Err(ClientHelloError::Timeout) => panic!("a reader that never waits timed out"),
        Err(_) => {}
    }
    // Framing agrees with tls-parser's, both ways.
    let framed = tls_parser_framing(stream);
    if let Ok(Some(ours)) = &whole {
        let Framed::Hello { handshake, .. } = &framed else {
            panic!("found a ClientHello tls-parser's records do not frame");
        };
        assert_eq!(
            tls_parser_hello(handshake).as_ref(),
            Some(ours),
            "SNI and ALPN differ from tls-parser's"
        );
    }
    if let Framed::Hello { handshake, used } = &framed
        && *used <= MAX_CLIENT_HELLO
        && handshake.first() == Some(&1)
        && handshake.len() + 5 <= MAX_CLIENT_HELLO
    {
        match (tls_parser_hello(handshake), &whole) {
            (Some(theirs), Ok(Some(ours))) => assert_eq!(&theirs, ours),
            (Some(_), other) => panic!("tls-parser frames and parses a ClientHello: {other:?}"),
            (None, Ok(Some(_))) => panic!("a ClientHello tls-parser cannot parse was accepted"),
            (None, _) => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, stream)) = data.split_first() else {
        return;
    };
    let step = usize::from(first % 64) + 1;
    proxy_header(stream, step);
    client_hello(stream, step);
});
