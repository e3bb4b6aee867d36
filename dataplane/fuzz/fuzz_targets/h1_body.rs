//! Upstream HTTP/1.1 body framing against hyper's client on the same bytes: a chunked body
//! (chunk sizes, extensions, trailers, CRLFs, the last chunk) or a `Content-Length` body,
//! read to its end by our reader (`sluice_io::h1::Conn`) and by
//! `hyper::client::conn::http1`.
//!
//! Input: the first byte picks the variant (bit 0: chunked or `Content-Length`; bit 4 for a
//! length: a number from the next two bytes, or the raw header value up to the first `\n`)
//! and how the bytes arrive (bits 1-3: whole, or in pieces of 1 to 4096 bytes, the same for
//! both readers). The rest follows the fixed head `HTTP/1.1 200 OK\r\n` +
//! `Transfer-Encoding: chunked` (or `Content-Length: ...`) + `\r\n\r\n`, then the upstream
//! closes the connection.
//!
//! The property, in one direction only: whenever ours accepts a complete body, hyper accepts
//! it too and yields the same bytes (so what hyper refuses, ours refuses). Ours may refuse
//! what hyper accepts, as it is deliberately stricter: a `Content-Length` of digits only
//! (hyper also takes a list of equal values, `5, 5`), and a chunk-size or trailer line of at
//! most 4096 bytes unless it arrives in one read. Never the other way round: a body whose
//! framing hyper reads differently, or refuses, must not reach a client through us.
//!
//! Also: what `Conn::check_buffered_body` refuses (the early check of the bytes that came
//! with the head, which turns a framing error into a 502), `Conn::poll_body` refuses too.
#![no_main]

use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::Method;
use http_body_util::{BodyExt as _, Empty};
use sluice_io::h1::{BodyPoll, BodyState, Conn};
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

/// Pieces the upstream's bytes arrive in: 0 = all at once.
const PIECES: [usize; 8] = [0, 1, 2, 3, 7, 64, 1000, 4096];
/// Most writes for one input, so that 1-byte pieces of a long input stay fast.
const MAX_WRITES: usize = 512;

/// The per-process runtime and the loopback listener our reader's upstream connects to
/// (`Conn` wraps a `TcpStream`: there is no in-memory constructor).
struct Env {
    rt: Runtime,
    listener: TcpListener,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .expect("runtime");
        let listener = rt
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("loopback listener");
        Env { rt, listener }
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut piece = PIECES[usize::from(mode >> 1 & 7)];
    let mut wire = b"HTTP/1.1 200 OK\r\n".to_vec();
    let body = if mode & 1 == 0 {
        wire.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
        rest
    } else if mode & 0x10 == 0 {
        let Some((len, body)) = rest.split_first_chunk::<2>() else {
            return;
        };
        let len = u16::from_le_bytes(*len);
        wire.extend_from_slice(format!("Content-Length: {len}\r\n\r\n").as_bytes());
        body
    } else {
        let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
        wire.extend_from_slice(b"Content-Length: ");
        wire.extend_from_slice(&rest[..end]);
        wire.extend_from_slice(b"\r\n\r\n");
        rest.get(end + 1..).unwrap_or_default()
    };
    wire.extend_from_slice(body);
    if piece != 0 {
        piece = piece.max(wire.len().div_ceil(MAX_WRITES));
    }

    let env = env();
    let (ours, theirs) = env.rt.block_on(async {
        let ours = read_ours(&env.listener, &wire, piece).await;
        let theirs = read_hyper(&wire, piece).await;
        (ours, theirs)
    });
    match (ours, theirs) {
        (Ok(ours), Ok(theirs)) => assert!(
            ours == theirs,
            "another body than hyper's: ours {:?}, hyper's {:?}",
            String::from_utf8_lossy(&ours),
            String::from_utf8_lossy(&theirs)
        ),
        (Ok(ours), Err(e)) => panic!(
            "accepted a body hyper refuses ({e}): {:?}",
            String::from_utf8_lossy(&ours)
        ),
        // Ours is stricter (see the module documentation), or both refuse.
        (Err(_), _) => {}
    }
});

/// The body as our reader decodes it from an upstream that sends `wire` in `piece`-byte
/// writes and then closes.
async fn read_ours(listener: &TcpListener, wire: &[u8], piece: usize) -> Result<Vec<u8>, String> {
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (client, accepted) = futures::join!(TcpStream::connect(addr), listener.accept());
    let (client, (upstream, _)) = (client.expect("connect"), accepted.expect("accept"));
    // NB: both ends reset the connection when they drop it, rather than close it: the side
    // that closes first would linger in TIME_WAIT for a minute, and a long run would fill
    // the table with a million of them.
    let _ = client.set_zero_linger();
    let _ = upstream.set_zero_linger();
    let write = async move {
        let mut upstream = upstream;
        let pieces = if piece == 0 { wire.len().max(1) } else { piece };
        for p in wire.chunks(pieces) {
            // NB: a write fails once our reader gave up and closed: that is its verdict.
            if upstream.write_all(p).await.is_err() {
                break;
            }
            if piece != 0 {
                tokio::task::yield_now().await;
            }
        }
        let _ = upstream.shutdown().await;
        // Kept open until our reader is done: dropped, it would reset the connection and
        // take the bytes not read yet with it.
        upstream
    };
    let read = async move {
        let mut conn = Conn::new(client);
        let head = conn
            .read_head(&Method::GET)
            .await
            .map_err(|e| e.to_string())?;
        // As the proxy does (`upstream::forward`): the bytes that came with the head are
        // checked before the head is sent on; what that refuses fails the exchange.
        let early = conn.check_buffered_body(head.framing);
        let mut state = BodyState::new(head.framing);
        let mut out = Vec::new();
        let streamed = loop {
            match std::future::poll_fn(|cx| conn.poll_body(&mut state, cx)).await {
                Ok(BodyPoll::Data(d)) => out.extend_from_slice(&d),
                Ok(BodyPoll::End) => break Ok(out),
                Err(e) => break Err(e.to_string()),
            }
        };
        if let Err(e) = early {
            assert!(
                streamed.is_err(),
                "check_buffered_body refused ({e}) a body that poll_body reads"
            );
            return Err(e.to_string());
        }
        streamed
    };
    let (_, verdict) = futures::join!(write, read);
    verdict
}

/// The body as hyper's HTTP/1.1 client decodes it from the same bytes; the request it
/// writes is discarded.
async fn read_hyper(wire: &[u8], piece: usize) -> Result<Vec<u8>, String> {
    let io = Upstream {
        wire: Bytes::copy_from_slice(wire),
        piece,
        asked: false,
        reader: None,
    };
    let (mut send, conn) = hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(io)
        .await
        .map_err(|e| e.to_string())?;
    let conn = tokio::spawn(conn);
    let verdict = async {
        let req = http::Request::get("/")
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let mut body = send
            .send_request(req)
            .await
            .map_err(|e| chain(&e))?
            .into_body();
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(d) = frame.map_err(|e| chain(&e))?.into_data() {
                out.extend_from_slice(&d);
            }
        }
        Ok(out)
    }
    .await;
    conn.abort();
    verdict
}

/// An error with its sources, for the report of a failure.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(e) = source {
        s = format!("{s}: {e}");
        source = e.source();
    }
    s
}

/// An in-memory upstream for hyper: once the request is written (and dropped), reads give
/// `wire` in `piece`-byte reads (0: all at once), then end of file.
struct Upstream {
    wire: Bytes,
    piece: usize,
    /// Whether hyper wrote its request. NB: before, reads wait: hyper refuses a response
    /// that arrives while no request is in flight.
    asked: bool,
    reader: Option<Waker>,
}

impl hyper::rt::Read for Upstream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.asked {
            self.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let mut n = self.wire.len().min(buf.remaining());
        if self.piece != 0 {
            n = n.min(self.piece);
        }
        let chunk = self.wire.split_to(n);
        buf.put_slice(&chunk);
        Poll::Ready(Ok(()))
    }
}

impl hyper::rt::Write for Upstream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.asked = true;
        if let Some(w) = self.reader.take() {
            w.wake();
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
