//! A small HTTP/1.1 client for upstream connections that runs inside the downstream
//! request's own task.
//!
//! NB: this replaces hyper's client on the hot path. hyper's client drives each connection
//! from a task of its own and hands requests, responses and body chunks across channels; here
//! the request head is written, the response head parsed and the body read straight from the
//! socket by whoever polls the response body (the downstream connection's task), with one
//! buffer per connection and no channel. The framing rules are RFC 9112 §6.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::headers::ProxyHeaders;
use crate::wbatch::BatchedStream;

/// Largest response head accepted from an upstream.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most response headers accepted from an upstream.
pub const MAX_HEADERS: usize = 128;
/// Longest chunk-size or trailer line accepted.
const MAX_LINE: usize = 4096;
/// Read-buffer growth step.
const READ_CHUNK: usize = 16 * 1024;
/// Header slots a parsed response head leaves free for the headers plugins add.
const RESPONSE_HEADER_ROOM: usize = 4;
/// Response headers whose spans [`parse_response_head`] keeps on the stack; a head with
/// more takes one allocation.
const INLINE_SPANS: usize = 16;

/// What went wrong talking to an upstream.
#[derive(Debug, thiserror::Error)]
pub enum H1Error {
    /// The socket failed.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// The upstream closed the connection before sending a byte of the response.
    #[error("connection closed before a response")]
    ClosedBeforeResponse,
    /// The upstream closed the connection in the middle of a message.
    #[error("connection closed mid-message")]
    Truncated,
    /// The response is not valid HTTP/1.x.
    #[error("invalid response: {0}")]
    Invalid(&'static str),
}

impl H1Error {
    /// Whether nothing of a response arrived, so that a request that had no body can be sent
    /// again on a fresh connection (the usual cause: the upstream closed an idle keep-alive
    /// connection just as it was reused).
    #[inline]
    pub fn is_stale_connection(&self) -> bool {
        match self {
            H1Error::ClosedBeforeResponse => true,
            H1Error::Io(e) => matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionAborted
            ),
            _ => false,
        }
    }
}

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the upstream closes the connection (responses only).
    UntilClose,
}

/// What a look at a stream, without waiting, found (see [`Transport::peek_now`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peeked {
    /// Nothing to read, and the stream is open (as far as the reactor knows).
    Nothing,
    /// The upstream closed the stream.
    Closed,
    /// The upstream sent bytes.
    Data,
    /// The stream failed.
    Failed,
}

/// The stream a [`Conn`] runs on: plain TCP ([`BatchedStream`]) or TLS
/// ([`tokio_rustls::client::TlsStream`]). Reading and writing are the stream's own; this
/// adds the one look the connection-reuse guard ([`Conn::idle_is_usable`]) and the early
/// body check ([`Conn::check_buffered_body`]) need.
///
/// NB: a trait, not an enum of streams, so that the plain path is compiled for
/// [`BatchedStream`] alone, with no branch on the kind of stream per read.
pub trait Transport: AsyncRead + AsyncWrite + Unpin {
    /// Whether the upstream has sent bytes or closed the stream since the last read, found
    /// without waiting and with no system call unless the reactor saw the socket become
    /// readable. A stream that can only tell by reading (TLS: the socket holds records, which
    /// may carry nothing for the connection, such as a session ticket or a `close_notify`)
    /// reads at most once and appends the plaintext it got to `buf`.
    fn peek_now(&mut self, buf: &mut BytesMut) -> Peeked;
}

/// A poll made only to look, never to be woken.
#[inline]
fn noop_cx() -> Context<'static> {
    Context::from_waker(std::task::Waker::noop())
}

impl Transport for BatchedStream {
    /// `MSG_PEEK` on the socket (when the reactor saw it readable): nothing is consumed.
    #[inline]
    fn peek_now(&mut self, _buf: &mut BytesMut) -> Peeked {
        let mut probe = [0u8; 1];
        let mut probe = tokio::io::ReadBuf::new(&mut probe);
        match self.get_ref().poll_peek(&mut noop_cx(), &mut probe) {
            Poll::Pending => Peeked::Nothing,
            Poll::Ready(Ok(0)) => Peeked::Closed,
            Poll::Ready(Ok(_)) => Peeked::Data,
            Poll::Ready(Err(_)) => Peeked::Failed,
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> Transport for tokio_rustls::client::TlsStream<T> {
    /// One read through rustls: records that hold no application data (a session ticket
    /// sent after the handshake) are consumed and leave the connection usable; the
    /// plaintext rustls had buffered or decrypts now lands in `buf`; a `close_notify` or
    /// the socket's end without one is the end of the stream.
    fn peek_now(&mut self, buf: &mut BytesMut) -> Peeked {
        buf.reserve(READ_CHUNK);
        match tokio_util::io::poll_read_buf(Pin::new(self), &mut noop_cx(), buf) {
            Poll::Pending => Peeked::Nothing,
            Poll::Ready(Ok(0)) => Peeked::Closed,
            Poll::Ready(Ok(_)) => Peeked::Data,
            Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Peeked::Closed,
            Poll::Ready(Err(_)) => Peeked::Failed,
        }
    }
}

impl<T: Transport + ?Sized> Transport for Box<T> {
    #[inline]
    fn peek_now(&mut self, buf: &mut BytesMut) -> Peeked {
        (**self).peek_now(buf)
    }
}

/// An upstream connection with its read buffer, over plain TCP (the default) or any other
/// [`Transport`].
#[derive(Debug)]
pub struct Conn<S = BatchedStream> {
    io: S,
    buf: BytesMut,
    /// An empty header map whose allocation the next final response head fills (see
    /// [`Conn::keep_for_next_head`]). NB: boxed once per connection, so that the
    /// connection (moved with every response body) stays small.
    spare_headers: Box<HeaderMap>,
}

/// A parsed response head.
#[derive(Debug)]
pub struct ResponseHead {
    /// Status, version and headers.
    pub parts: http::response::Parts,
    /// How the body that follows is delimited.
    pub framing: Framing,
    /// Whether the connection may carry another request after this response.
    pub keep_alive: bool,
    /// Bytes of the head as the upstream sent it (for the bandwidth metrics).
    pub head_len: usize,
}

impl Conn {
    /// Wraps a connected socket.
    pub fn new(io: TcpStream) -> Self {
        Conn::over(BatchedStream::new(io))
    }
}

impl<S: Transport> Conn<S> {
    /// Wraps a connected stream (TLS: after its handshake).
    pub fn over(io: S) -> Self {
        Conn {
            io,
            buf: BytesMut::with_capacity(READ_CHUNK),
            spare_headers: Box::default(),
        }
    }

    /// Keeps `headers` (emptied here) for the next final response head read on this
    /// connection: the proxy gives the request's header map once the request was answered.
    ///
    /// NB: issue 21. hyper parses each request into the header map of the previous
    /// response it wrote; handing the request's map on to the next response closes that
    /// loop, so a proxied request allocates no header map (two allocations before).
    #[inline]
    pub fn keep_for_next_head(&mut self, mut headers: HeaderMap) {
        headers.clear();
        *self.spare_headers = headers;
    }

    /// For an idle pooled connection: false when the upstream closed it or sent something
    /// unexpected. Costs no system call unless the reactor saw the socket become readable.
    #[inline]
    pub fn idle_is_usable(&mut self) -> bool {
        self.buf.is_empty() && self.io.peek_now(&mut self.buf) == Peeked::Nothing
    }

    /// Whether bytes the upstream sent are waiting in the read buffer.
    #[inline]
    pub fn has_buffered(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Writes `bytes` completely.
    pub async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.io.write_all(bytes).await
    }

    /// Writes one body chunk, in chunked encoding when `chunked`.
    pub async fn write_body_chunk(&mut self, data: &[u8], chunked: bool) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if chunked {
            let size = format!("{:x}\r\n", data.len());
            self.io.write_all(size.as_bytes()).await?;
            self.io.write_all(data).await?;
            self.io.write_all(b"\r\n").await
        } else {
            self.io.write_all(data).await
        }
    }

    /// Reads and parses the next final response head (1xx interim responses are skipped).
    pub async fn read_head(&mut self, request_method: &Method) -> Result<ResponseHead, H1Error> {
        let mut received_any = false;
        loop {
            if !self.buf.is_empty() {
                received_any = true;
                if let Some(head) = self.try_parse_head(request_method)? {
                    if head.parts.status.is_informational() {
                        continue;
                    }
                    return Ok(head);
                }
                if self.buf.len() > MAX_HEAD_BYTES {
                    return Err(H1Error::Invalid("response head too large"));
                }
            }
            self.buf.reserve(READ_CHUNK);
            let n = self.io.read_buf(&mut self.buf).await?;
            if n == 0 {
                return Err(if received_any {
                    H1Error::Truncated
                } else {
                    H1Error::ClosedBeforeResponse
                });
            }
        }
    }

    fn try_parse_head(&mut self, request_method: &Method) -> Result<Option<ResponseHead>, H1Error> {
        parse_final_head(&mut self.buf, request_method, &mut self.spare_headers)
    }
}

/// [`parse_response_head_in`] of a request's response, for every [`Conn`] and
/// [`parse_response_head`].
///
/// NB: one function, not inlined into each caller, so that the parser has a single call
/// site and the compiler inlines it whole, header appends included. Called from each
/// `Conn<S>` and from the upgrade parser, the parser was compiled out of line with its
/// helpers: +600 instructions a proxied request (callgrind, `bench/profile.sh`), ~2.5% of
/// the keep-alive throughput side by side.
#[inline(never)]
fn parse_final_head(
    buf: &mut BytesMut,
    request_method: &Method,
    spare: &mut HeaderMap,
) -> Result<Option<ResponseHead>, H1Error> {
    parse_response_head_in::<false>(buf, request_method, spare)
}

/// Parses a response head at the start of `buf`; on success the head's bytes are split off
/// `buf` (what follows stays, as the body's first bytes). `Ok(None)`: not complete yet.
/// The one parser of upstream response heads, also fuzzed against httparse's own verdict
/// (`dataplane/fuzz`).
pub fn parse_response_head(
    buf: &mut BytesMut,
    request_method: &Method,
) -> Result<Option<ResponseHead>, H1Error> {
    parse_final_head(buf, request_method, &mut HeaderMap::new())
}

/// The upstream's answer to an upgrade request (WebSocket), parsed like any response head
/// by [`parse_response_head`], except that a `101 Switching Protocols` is a final answer
/// (what follows it is the upgraded protocol, left in `buf`) and every header is kept, hop
/// by hop or not (a 101's `Upgrade` and `Connection` are its meaning). Other 1xx answers
/// come back too, for the caller to skip.
pub fn parse_upgrade_response_head(
    buf: &mut BytesMut,
    request_method: &Method,
) -> Result<Option<ResponseHead>, H1Error> {
    parse_response_head_in::<true>(buf, request_method, &mut HeaderMap::new())
}

/// The response header names upstreams send most, spelled as they send them (or in lower
/// case): taken as the constant, without `HeaderName::from_bytes` lowercasing the name and
/// looking it up (~117 instructions a name, five names a typical response; issue 21). Any
/// other spelling, and every other name, goes through `from_bytes`.
#[inline(always)]
fn common_name(name: &[u8]) -> Option<HeaderName> {
    Some(match name {
        b"Date" | b"date" => header::DATE,
        b"Server" | b"server" => header::SERVER,
        b"Content-Type" | b"content-type" => header::CONTENT_TYPE,
        b"Content-Length" | b"content-length" => header::CONTENT_LENGTH,
        b"Connection" | b"connection" => header::CONNECTION,
        b"Transfer-Encoding" | b"transfer-encoding" => header::TRANSFER_ENCODING,
        b"Content-Encoding" | b"content-encoding" => header::CONTENT_ENCODING,
        b"Cache-Control" | b"cache-control" => header::CACHE_CONTROL,
        b"Last-Modified" | b"last-modified" => header::LAST_MODIFIED,
        b"ETag" | b"etag" => header::ETAG,
        b"Accept-Ranges" | b"accept-ranges" => header::ACCEPT_RANGES,
        b"Vary" | b"vary" => header::VARY,
        b"Expires" | b"expires" => header::EXPIRES,
        b"Location" | b"location" => header::LOCATION,
        b"Set-Cookie" | b"set-cookie" => header::SET_COOKIE,
        _ => return None,
    })
}

/// [`parse_response_head`] (or, `UPGRADE`, [`parse_upgrade_response_head`]), with the
/// headers of a final response in `spare`'s allocation (an empty map; left empty without an
/// allocation when taken).
fn parse_response_head_in<const UPGRADE: bool>(
    buf: &mut BytesMut,
    request_method: &Method,
    spare: &mut HeaderMap,
) -> Result<Option<ResponseHead>, H1Error> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len > MAX_HEAD_BYTES => {
            return Err(H1Error::Invalid("response head too large"));
        }
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(H1Error::Invalid("too many headers"));
        }
        Err(_) => return Err(H1Error::Invalid("malformed response head")),
    };
    let status = StatusCode::from_u16(resp.code.unwrap_or(0))
        .map_err(|_| H1Error::Invalid("bad status code"))?;
    // NB: outside an upgrade a 101 is not an interim response to skip: what follows it is
    // not HTTP.
    if !UPGRADE && status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(H1Error::Invalid("unsolicited 101 Switching Protocols"));
    }
    let version = if resp.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    // Header values point into the buffer: remember offsets, then share the bytes.
    // NB: on the stack for up to `INLINE_SPANS` headers (issue 21: an allocation per
    // response before).
    let base = buf.as_ptr() as usize;
    let mut spans: smallvec::SmallVec<[(HeaderName, usize, usize); INLINE_SPANS]> =
        smallvec::SmallVec::with_capacity(resp.headers.len());
    // The framing headers are noted on the way, so no header map lookup is needed later.
    let mut facts = FramingFacts::default();
    for h in resp.headers.iter() {
        let name = match common_name(h.name.as_bytes()) {
            Some(name) => name,
            None => HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|_| H1Error::Invalid("bad header name"))?,
        };
        facts.note(&name, h.value);
        let start = h.value.as_ptr() as usize - base;
        spans.push((name, start, start + h.value.len()));
    }
    // NB: decided before the buffer is split (the facts borrow it); an invalid header
    // value below still takes precedence over a framing error.
    let framing = response_framing(request_method, status, &facts);
    // Both framings given: the connection carries no other response afterwards.
    let ambiguous = facts.transfer_encoding.is_some() && facts.content_length != Ok(None);
    let close = facts.close || ambiguous;
    let facts_nominates = facts.nominates;
    let head = buf.split_to(len).freeze();
    // NB: room for the headers response phases add (limit-count's three X-RateLimit-*,
    // cors, request-id): without it, a map sized to the upstream's headers regrows and
    // rehashes every entry (issue 4: ~400 instructions per request).
    let mut map = if status.is_informational() && !UPGRADE {
        HeaderMap::new()
    } else {
        std::mem::take(spare)
    };
    map.reserve(spans.len() + RESPONSE_HEADER_ROOM);
    // NB: a proxy drops hop-by-hop headers anyway; leaving them out here saves adding
    // and then removing them (issue 2). When `Connection` names other headers (rare),
    // all are kept for `strip_hop_by_hop`, which removes the named ones too.
    let skip_hop_by_hop = !facts_nominates && !UPGRADE;
    for (name, start, end) in spans {
        if skip_hop_by_hop && crate::headers::hop_by_hop_bit(name.as_str()) != 0 {
            continue;
        }
        if ambiguous && name == header::CONTENT_LENGTH {
            continue;
        }
        let value = HeaderValue::from_maybe_shared(head.slice(start..end))
            .map_err(|_| H1Error::Invalid("bad header value"))?;
        map.append(name, value);
    }
    let framing = framing?;
    let keep_alive = version == Version::HTTP_11 && framing != Framing::UntilClose && !close;
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = status;
    parts.version = version;
    parts.headers = map;
    Ok(Some(ResponseHead {
        parts,
        framing,
        keep_alive,
        head_len: len,
    }))
}

/// What the framing rules need from a response head, collected while it is parsed.
#[derive(Debug)]
struct FramingFacts {
    /// `transfer-encoding`, every value of every such header: `None` without one,
    /// `Some(Err)` at the first coding other than one final `chunked`.
    transfer_encoding: Option<Result<(), &'static str>>,
    /// The `content-length`: `Err` at the first value that is not a number or disagrees.
    content_length: Result<Option<u64>, &'static str>,
    /// Whether a `connection` value lists `close`.
    close: bool,
    /// Whether a `connection` value names a header other than the hop-by-hop ones, so that
    /// header must be removed too.
    nominates: bool,
}

/// A header value as text, as [`HeaderValue::to_str`] sees it (visible ASCII only; values
/// with control characters never get this far).
fn ascii_str(value: &[u8]) -> Option<&str> {
    if value.is_ascii() {
        std::str::from_utf8(value).ok()
    } else {
        None
    }
}

/// A `content-length` value: decimal digits only (no sign, no inner space), without
/// overflow; the whitespace around a field value is not part of it.
fn content_length(value: &[u8]) -> Option<u64> {
    let s = ascii_str(value)?.trim_matches([' ', '\t']);
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

impl Default for FramingFacts {
    fn default() -> Self {
        FramingFacts {
            transfer_encoding: None,
            content_length: Ok(None),
            close: false,
            nominates: false,
        }
    }
}

impl FramingFacts {
    #[inline(always)]
    fn note(&mut self, name: &HeaderName, value: &[u8]) {
        if *name == header::TRANSFER_ENCODING {
            // NB: Sluice decodes only `chunked`, and drops the header on the way down: a
            // body in any other coding would reach the client undeclared, so it is refused.
            let seen = self.transfer_encoding.take();
            self.transfer_encoding = Some(match (seen, ascii_str(value)) {
                (Some(Err(e)), _) => Err(e),
                (_, None) => Err("transfer-encoding is not text"),
                (seen, Some(s)) => {
                    let mut chunked = matches!(seen, Some(Ok(())));
                    let mut verdict = Ok(());
                    for coding in s.split(',').map(|c| c.trim_matches([' ', '\t'])) {
                        if coding.is_empty() {
                            continue;
                        }
                        if !coding.eq_ignore_ascii_case("chunked") {
                            verdict = Err("unsupported transfer coding");
                            break;
                        }
                        if chunked {
                            verdict = Err("chunked applied more than once");
                            break;
                        }
                        chunked = true;
                    }
                    match verdict {
                        Ok(()) if !chunked => Err("empty transfer-encoding"),
                        v => v,
                    }
                }
            });
        } else if *name == header::CONTENT_LENGTH {
            self.content_length = match (content_length(value), self.content_length) {
                (_, Err(e)) => Err(e),
                (None, _) => Err("bad content-length"),
                (Some(n), Ok(Some(l))) if l != n => Err("conflicting content-length"),
                (Some(n), Ok(_)) => Ok(Some(n)),
            };
        } else if *name == header::CONNECTION {
            // A value that is not text names nothing (as in `strip_hop_by_hop`).
            let Some(s) = ascii_str(value) else {
                return;
            };
            for token in s.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    self.close = true;
                } else if !token.is_empty() && !crate::headers::is_hop_by_hop_token(token) {
                    self.nominates = true;
                }
            }
        }
    }
}

/// RFC 9112 §6.3: how the body of a response is delimited.
fn response_framing(
    method: &Method,
    status: StatusCode,
    facts: &FramingFacts,
) -> Result<Framing, H1Error> {
    if method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::Empty);
    }
    // NB: with both, Transfer-Encoding wins and the Content-Length is dropped (RFC 9112
    // §6.3); the caller closes the connection after such a response.
    if let Some(te) = facts.transfer_encoding {
        return te.map(|()| Framing::Chunked).map_err(H1Error::Invalid);
    }
    Ok(match facts.content_length {
        Err(e) => return Err(H1Error::Invalid(e)),
        Ok(Some(0)) => Framing::Empty,
        Ok(Some(n)) => Framing::Length(n),
        Ok(None) => Framing::UntilClose,
    })
}

/// Serializes a request head. `framing` says how the body that follows is delimited; any
/// `content-length`/`transfer-encoding` in `headers` is replaced accordingly. With `proxy`,
/// `X-Forwarded-For` gets the client appended and `X-Real-IP`, `X-Forwarded-Proto` and
/// `X-Forwarded-Host` are replaced.
pub fn encode_request_head(
    out: &mut Vec<u8>,
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    framing: Framing,
    proxy: Option<ProxyHeaders<'_>>,
) {
    fn line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut forwarded_for: Vec<&[u8]> = Vec::new();
    let mut saw_host = false;
    for (name, value) in headers {
        match name.as_str() {
            // NB: `te: trailers` is kept for HTTP/2 upstreams; this client reads no trailers.
            "content-length" | "transfer-encoding" | "te" => continue,
            "x-forwarded-for" | "x-real-ip" | "x-forwarded-proto" | "x-forwarded-host"
                if proxy.is_some() =>
            {
                if name.as_str() == "x-forwarded-for" {
                    forwarded_for.push(value.as_bytes());
                }
                continue;
            }
            "host" => saw_host = true,
            _ => {}
        }
        line(out, name.as_str().as_bytes(), value.as_bytes());
    }
    if let Some(p) = proxy {
        if let Some(host) = p.host {
            if !saw_host {
                line(out, b"host", host);
            }
            line(out, b"x-forwarded-host", host);
        }
        out.extend_from_slice(b"x-forwarded-for: ");
        for prev in forwarded_for {
            out.extend_from_slice(prev);
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(p.client_ip);
        out.extend_from_slice(b"\r\n");
        line(out, b"x-real-ip", p.client_ip);
        line(out, b"x-forwarded-proto", p.proto.as_bytes());
    }
    match framing {
        Framing::Length(n) => line(out, b"content-length", n.to_string().as_bytes()),
        Framing::Chunked => line(out, b"transfer-encoding", b"chunked"),
        Framing::Empty | Framing::UntilClose => {}
    }
    out.extend_from_slice(b"\r\n");
}

/// Where a response body decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyState {
    /// Bytes left of a fixed-length body.
    Length(u64),
    /// Expecting a chunk-size line.
    ChunkSize,
    /// Bytes left of the current chunk.
    ChunkData(u64),
    /// Expecting the CRLF after chunk data.
    ChunkEnd,
    /// Reading trailer lines (checked, then dropped) until the empty line; how many so far.
    Trailers(u32),
    /// Reading until the upstream closes.
    UntilClose,
    /// The body is complete.
    Done,
}

impl BodyState {
    /// The decoder state at the start of a body with `framing`.
    #[inline]
    pub fn new(framing: Framing) -> Self {
        match framing {
            Framing::Empty => BodyState::Done,
            Framing::Length(n) => BodyState::Length(n),
            Framing::Chunked => BodyState::ChunkSize,
            Framing::UntilClose => BodyState::UntilClose,
        }
    }
}

/// What [`Conn::poll_body`] produced.
#[derive(Debug)]
pub enum BodyPoll {
    /// Body bytes.
    Data(Bytes),
    /// The body ended; `Framing::UntilClose` bodies end only with the connection.
    End,
}

impl<S: Transport> Conn<S> {
    /// The next `n` body bytes, if they have all arrived already (with the head).
    #[inline]
    pub fn take_buffered(&mut self, n: usize) -> Option<Bytes> {
        (self.buf.len() >= n).then(|| self.buf.split_to(n).freeze())
    }

    /// Decodes the next piece of a response body, reading from the socket as needed.
    pub fn poll_body(
        &mut self,
        state: &mut BodyState,
        cx: &mut Context<'_>,
    ) -> Poll<Result<BodyPoll, H1Error>> {
        loop {
            if *state == BodyState::Done {
                return Poll::Ready(Ok(BodyPoll::End));
            }
            match body_step(&self.buf, *state)? {
                Step::Advance { data, skip, next } => {
                    *state = next;
                    if data > 0 {
                        return Poll::Ready(Ok(BodyPoll::Data(self.buf.split_to(data).freeze())));
                    }
                    self.buf.advance(skip);
                }
                Step::NeedMore => {
                    self.buf.reserve(READ_CHUNK);
                    match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(H1Error::Io(e))),
                        Poll::Ready(Ok(0)) => {
                            if *state == BodyState::UntilClose {
                                *state = BodyState::Done;
                                return Poll::Ready(Ok(BodyPoll::End));
                            }
                            return Poll::Ready(Err(H1Error::Truncated));
                        }
                        Poll::Ready(Ok(_)) => {}
                    }
                }
            }
        }
    }

    /// Checks the body bytes that arrived with the head, before the head is sent on: a
    /// framing error among them, or an upstream that has already closed the connection
    /// short of the body's end, fails the exchange now, while the client can still be told
    /// 502. (Past this point a failing body can only cut the client's response short.)
    /// Consumes nothing of the body (a TLS stream may add what it decrypts to the buffer,
    /// which is then checked too); costs no system call unless the body is not all here and
    /// the reactor saw the socket become readable.
    pub fn check_buffered_body(&mut self, framing: Framing) -> Result<(), H1Error> {
        let mut state = BodyState::new(framing);
        let mut at = 0;
        let mut peeked = false;
        while state != BodyState::Done {
            match body_step(&self.buf[at..], state)? {
                Step::Advance { data, skip, next } => {
                    at += data + skip;
                    state = next;
                }
                Step::NeedMore if state == BodyState::UntilClose => return Ok(()),
                // NB: one look only, so that a large body is never read ahead here.
                Step::NeedMore if peeked => return Ok(()),
                Step::NeedMore => match self.io.peek_now(&mut self.buf) {
                    Peeked::Closed => return Err(H1Error::Truncated),
                    // Bytes a TLS stream decrypted: checked with the others.
                    Peeked::Data if self.buf.len() > at => peeked = true,
                    _ => return Ok(()),
                },
            }
        }
        Ok(())
    }
}

/// One step of the response body decoder over the bytes at hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// `data` body bytes at the front of the buffer (or none), then `skip` bytes of framing,
    /// and the decoder's state after them.
    Advance {
        data: usize,
        skip: usize,
        next: BodyState,
    },
    /// The next step needs bytes that have not arrived.
    NeedMore,
}

/// The decoder itself (RFC 9112 §6 and §7.1), on `buf` in `state` (not `Done`); shared by
/// [`Conn::poll_body`] and [`Conn::check_buffered_body`].
fn body_step(buf: &[u8], state: BodyState) -> Result<Step, H1Error> {
    let advance = |data, skip, next| Ok(Step::Advance { data, skip, next });
    match state {
        BodyState::Done | BodyState::Length(0) => advance(0, 0, BodyState::Done),
        BodyState::Length(left) | BodyState::ChunkData(left) if !buf.is_empty() => {
            let take = (buf.len() as u64).min(left);
            let left = left - take;
            let next = match state {
                BodyState::Length(_) if left == 0 => BodyState::Done,
                BodyState::Length(_) => BodyState::Length(left),
                _ if left == 0 => BodyState::ChunkEnd,
                _ => BodyState::ChunkData(left),
            };
            advance(take as usize, 0, next)
        }
        BodyState::UntilClose if !buf.is_empty() => advance(buf.len(), 0, state),
        BodyState::ChunkSize | BodyState::Trailers(_) if let Some(end) = crlf(buf) => {
            let line = &buf[..end];
            if end > MAX_LINE {
                return Err(H1Error::Invalid("chunk line too long"));
            }
            let next = match state {
                BodyState::Trailers(_) if line.is_empty() => BodyState::Done,
                BodyState::Trailers(n) if n >= MAX_TRAILERS => {
                    return Err(H1Error::Invalid("too many trailer fields"));
                }
                BodyState::Trailers(_) if !is_field_line(line) => {
                    return Err(H1Error::Invalid("bad trailer field"));
                }
                BodyState::Trailers(n) => BodyState::Trailers(n + 1),
                _ => match parse_chunk_size(line)? {
                    0 => BodyState::Trailers(0),
                    size => BodyState::ChunkData(size),
                },
            };
            advance(0, end + 2, next)
        }
        BodyState::ChunkEnd if buf.len() >= 2 => {
            if &buf[..2] != b"\r\n" {
                return Err(H1Error::Invalid("chunk not followed by CRLF"));
            }
            advance(0, 2, BodyState::ChunkSize)
        }
        _ if buf.len() > MAX_LINE => Err(H1Error::Invalid("chunk line too long")),
        _ => Ok(Step::NeedMore),
    }
}

/// Where the first CRLF in `buf` starts.
fn crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

/// Trailer fields after the last chunk, at most (hyper's client allows as many headers).
const MAX_TRAILERS: u32 = 100;

/// Whether a byte may appear in a field value or a chunk extension: not a control
/// character other than HTAB (so never a bare CR or LF, which two parsers could each read
/// as the end of a line), obs-text allowed (RFC 9110 §5.5).
fn is_text(b: u8) -> bool {
    b == b'\t' || (b >= 0x20 && b != 0x7f)
}

/// A trailer field line (RFC 9112 §7.1.2, §5): a token, `:`, then text.
fn is_field_line(line: &[u8]) -> bool {
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return false;
    };
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    !name.is_empty()
        && http::HeaderName::from_bytes(name).is_ok()
        && value.iter().all(|&b| is_text(b))
}

/// A chunk-size line (RFC 9112 §7.1): hex digits (at most a u64), then optional whitespace
/// and, optionally, a `;` chunk extension (ignored, but text only). A sign, leading
/// whitespace, a control character or anything else: invalid.
fn parse_chunk_size(line: &[u8]) -> Result<u64, H1Error> {
    let bad = || H1Error::Invalid("bad chunk size");
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let rest = &line[digits..];
    let ext = rest.iter().position(|b| !matches!(b, b' ' | b'\t'));
    if digits == 0 || ext.is_some_and(|i| rest[i] != b';') || !rest.iter().all(|&b| is_text(b)) {
        return Err(bad());
    }
    let digits = std::str::from_utf8(&line[..digits]).map_err(|_| bad())?;
    u64::from_str_radix(digits, 16).map_err(|_| bad())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A connection whose upstream writes `wire` and then closes.
    async fn conn_reading(wire: &'static [u8]) -> Conn {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            // Dribble the bytes to exercise partial reads.
            for piece in wire.chunks(7) {
                s.write_all(piece).await.unwrap();
                s.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
        });
        Conn::new(TcpStream::connect(addr).await.unwrap())
    }

    async fn body(conn: &mut Conn, framing: Framing) -> Result<Vec<u8>, H1Error> {
        let mut state = BodyState::new(framing);
        let mut out = Vec::new();
        loop {
            match std::future::poll_fn(|cx| conn.poll_body(&mut state, cx)).await? {
                BodyPoll::Data(d) => out.extend_from_slice(&d),
                BodyPoll::End => return Ok(out),
            }
        }
    }

    #[tokio::test]
    async fn content_length_response() {
        let mut c =
            conn_reading(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX-A: b\r\n\r\nhello world\n")
                .await;
        let head = c.read_head(&Method::GET).await.unwrap();
        assert_eq!(head.parts.status, 200);
        assert_eq!(head.parts.headers["x-a"], "b");
        assert_eq!(head.framing, Framing::Length(12));
        assert!(head.keep_alive);
        assert_eq!(body(&mut c, head.framing).await.unwrap(), b"hello world\n");
    }

    #[tokio::test]
    async fn a_response_head_has_room_for_the_headers_plugins_add() {
        // nginx's usual head: four headers are kept (`Connection` is hop-by-hop).
        let mut c = conn_reading(
            b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Mon, 30 Nov 2026 05:00:00 GMT\r\n\
              Content-Type: text/plain\r\nContent-Length: 12\r\nConnection: keep-alive\r\n\r\n\
              hello world\n",
        )
        .await;
        let head = c.read_head(&Method::GET).await.unwrap();
        let headers = &head.parts.headers;
        assert_eq!(headers.len(), 4);
        // limit-count's three X-RateLimit-* must fit without regrowing the map.
        assert!(
            headers.capacity() >= headers.len() + 3,
            "capacity {} for {} headers",
            headers.capacity(),
            headers.len()
        );
    }

    #[tokio::test]
    async fn chunked_response_with_extensions_and_trailers() {
        let wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n";
        let mut c = conn_reading(wire).await;
        let head = c.read_head(&Method::GET).await.unwrap();
        assert_eq!(head.framing, Framing::Chunked);
        assert_eq!(body(&mut c, head.framing).await.unwrap(), b"hello world");
    }

    #[tokio::test]
    async fn interim_responses_are_skipped_and_close_delimited_bodies_read_to_eof() {
        let mut c =
            conn_reading(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\nuntil close").await;
        let head = c.read_head(&Method::POST).await.unwrap();
        assert_eq!(head.parts.status, 200);
        assert_eq!(head.framing, Framing::UntilClose);
        assert!(!head.keep_alive);
        assert_eq!(body(&mut c, head.framing).await.unwrap(), b"until close");
    }

    #[tokio::test]
    async fn head_and_204_have_no_body_and_connection_close_is_honoured() {
        let mut c =
            conn_reading(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\nConnection: close\r\n\r\n")
                .await;
        let head = c.read_head(&Method::HEAD).await.unwrap();
        assert_eq!(head.framing, Framing::Empty);
        assert!(!head.keep_alive);
        let mut c = conn_reading(b"HTTP/1.1 204 No Content\r\n\r\n").await;
        assert_eq!(
            c.read_head(&Method::GET).await.unwrap().framing,
            Framing::Empty
        );
    }

    #[tokio::test]
    async fn truncated_and_invalid_responses_are_errors() {
        let mut c = conn_reading(b"").await;
        assert!(
            c.read_head(&Method::GET)
                .await
                .unwrap_err()
                .is_stale_connection()
        );
        let mut c = conn_reading(b"HTTP/1.1 200 OK\r\nContent-Len").await;
        assert!(matches!(
            c.read_head(&Method::GET).await,
            Err(H1Error::Truncated)
        ));
        let mut c = conn_reading(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort").await;
        let head = c.read_head(&Method::GET).await.unwrap();
        assert!(matches!(
            body(&mut c, head.framing).await,
            Err(H1Error::Truncated)
        ));
        let mut c =
            conn_reading(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")
                .await;
        assert!(matches!(
            c.read_head(&Method::GET).await,
            Err(H1Error::Invalid("conflicting content-length"))
        ));
        let mut c = conn_reading(b"garbage\r\n\r\n").await;
        assert!(matches!(
            c.read_head(&Method::GET).await,
            Err(H1Error::Invalid(_))
        ));
    }

    #[tokio::test]
    async fn framing_headers_are_read_while_parsing() {
        let head = |raw: &'static [u8]| async move {
            conn_reading(raw).await.read_head(&Method::GET).await
        };
        // Transfer-Encoding wins over Content-Length (RFC 9112 §6.3): the length is not
        // sent on, and the connection is not reused after such a response.
        let h = head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(h.framing, Framing::Chunked);
        assert!(!h.keep_alive);
        assert!(
            !h.parts.headers.contains_key("content-length"),
            "{:?}",
            h.parts.headers
        );
        // `close` in any connection header, in any case, among other tokens.
        let h = head(b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nconnection: Upgrade , CLOSE\r\nContent-Length: 2\r\n\r\nok").await.unwrap();
        assert_eq!(h.framing, Framing::Length(2));
        assert!(!h.keep_alive);
        // Equal repeated lengths are fine; a bad one is an error even after a good one.
        let h = head(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length:  2 \r\n\r\nok")
            .await
            .unwrap();
        assert_eq!(h.framing, Framing::Length(2));
        assert!(matches!(
            head(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: x\r\n\r\n").await,
            Err(H1Error::Invalid("bad content-length"))
        ));
        // Hop-by-hop headers are left out of the head; when `Connection` names another
        // header, everything is kept for `strip_hop_by_hop`.
        let h = head(b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nX-A: b\r\nContent-Length: 0\r\n\r\n").await.unwrap();
        assert_eq!(h.parts.headers.len(), 2, "{:?}", h.parts.headers);
        assert_eq!(h.parts.headers["x-a"], "b");
        assert!(h.parts.headers.contains_key("content-length"));
        let h = head(b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, X-Secret\r\nX-Secret: 1\r\nContent-Length: 0\r\n\r\n").await.unwrap();
        assert!(h.parts.headers.contains_key("connection"));
        let mut stripped = h.parts.headers.clone();
        crate::headers::strip_hop_by_hop(&mut stripped);
        assert_eq!(stripped.len(), 1, "{stripped:?}");
        // No length, no transfer-encoding: until close, never kept alive.
        let h = head(b"HTTP/1.1 200 OK\r\nServer: x\r\n\r\n").await.unwrap();
        assert_eq!(h.framing, Framing::UntilClose);
        assert!(!h.keep_alive);
    }

    #[tokio::test]
    async fn ambiguous_or_lenient_framing_is_an_error() {
        let head = |raw: &'static [u8]| async move {
            conn_reading(raw).await.read_head(&Method::GET).await
        };
        for (raw, why) in [
            (&b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello"[..], "signed length"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", "negative length"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 5 5\r\n\r\n", "two numbers"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 0x5\r\n\r\n", "hex length"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n", "overflow"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "unknown coding"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unknown coding alone"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n", "a second header's coding"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", "chunked twice"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", "chunked twice over two headers"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: \r\n\r\n", "empty coding"),
            (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "unsolicited 101"),
        ] {
            assert!(
                matches!(head(raw).await, Err(H1Error::Invalid(_))),
                "{why}: {}",
                String::from_utf8_lossy(raw)
            );
        }
        // Whitespace around a field value is not part of it.
        let h = head(b"HTTP/1.1 200 OK\r\nContent-Length: \t2 \r\n\r\nok")
            .await
            .unwrap();
        assert_eq!(h.framing, Framing::Length(2));
        // A head over the limit is refused even when it arrives whole in one read.
        let mut big = b"HTTP/1.1 200 OK\r\nX-Big: ".to_vec();
        big.resize(MAX_HEAD_BYTES + 100, b'a');
        big.extend_from_slice(b"\r\nContent-Length: 0\r\n\r\n");
        let big: &'static [u8] = Box::leak(big.into_boxed_slice());
        assert!(matches!(head(big).await, Err(H1Error::Invalid(_))));
    }

    #[tokio::test]
    async fn chunk_lines_and_trailers_hold_no_bare_cr_lf_or_junk() {
        // Found by the h1_body fuzz target against hyper: each was read as a whole body.
        let chunked = |after_head: String| {
            let raw = format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{after_head}");
            let raw: &'static [u8] = Box::leak(raw.into_bytes().into_boxed_slice());
            async move {
                let mut c = conn_reading(raw).await;
                let head = c.read_head(&Method::GET).await.unwrap();
                body(&mut c, head.framing).await
            }
        };
        let many = |n: usize| "a: b\r\n".repeat(n);
        for good in [
            "5;a=b\r\nhello\r\n0\r\n\r\n".to_owned(),
            "5\r\nhello\r\n0\r\nX-A: b\r\nEmpty:\r\nObs: caf\u{e9}\r\n\r\n".to_owned(),
            format!("5\r\nhello\r\n0\r\n{}\r\n", many(100)),
        ] {
            assert_eq!(chunked(good.clone()).await.unwrap(), b"hello", "{good:?}");
        }
        for bad in [
            "5\r\nhello\r\n0\r\nx\r\n\r\n".to_owned(),
            "5\r\nhello\r\n0\r\n\rX\r\n\r\n".to_owned(),
            "5\r\nhello\r\n0\r\nA: b\nC: d\r\n\r\n".to_owned(),
            "5\r\nhello\r\n0\r\nX: a\rb\r\n\r\n".to_owned(),
            "5\r\nhello\r\n0\r\n: b\r\n\r\n".to_owned(),
            "5\r\nhello\r\n0\r\nX: a\0b\r\n\r\n".to_owned(),
            "5;a\nb\r\nhello\r\n0\r\n\r\n".to_owned(),
            "5;a\rb\r\nhello\r\n0\r\n\r\n".to_owned(),
            format!("5;{}\r\nhello\r\n0\r\n\r\n", "e".repeat(MAX_LINE)),
            format!("5\r\nhello\r\n0\r\n{}\r\n", many(101)),
        ] {
            let got = chunked(bad.clone()).await;
            assert!(
                matches!(got, Err(H1Error::Invalid(_))),
                "{:?} was read as {got:?}",
                &bad[..bad.len().min(60)]
            );
        }
    }

    #[tokio::test]
    async fn chunk_sizes_are_hex_digits_only() {
        let chunked = |size_line: &str| {
            let raw = format!(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{size_line}\r\nhello\r\n0\r\n\r\n"
            );
            let raw: &'static [u8] = Box::leak(raw.into_bytes().into_boxed_slice());
            async move {
                let mut c = conn_reading(raw).await;
                let head = c.read_head(&Method::GET).await.unwrap();
                body(&mut c, head.framing).await
            }
        };
        // Leading zeros and whitespace before an extension or the line's end, as hyper's
        // decoder takes them.
        for good in [
            "5",
            "05",
            "00000000000000005",
            "5 ",
            "5;name=value",
            "5 ;ext",
            "5\t;ext",
        ] {
            assert_eq!(chunked(good).await.unwrap(), b"hello", "{good:?}");
        }
        for bad in [
            "+5",
            " 5",
            "-5",
            "0x5",
            "5 5",
            "",
            "g",
            "5\u{b}",
            "10000000000000005",
        ] {
            assert!(
                matches!(chunked(bad).await, Err(H1Error::Invalid(_))),
                "{bad:?} was accepted"
            );
        }
    }

    #[test]
    fn request_head_replaces_framing_headers() {
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("a.com"));
        h.insert("content-length", HeaderValue::from_static("99"));
        let mut out = Vec::new();
        encode_request_head(
            &mut out,
            &Method::POST,
            "/x?y=1",
            &h,
            Framing::Chunked,
            None,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /x?y=1 HTTP/1.1\r\nhost: a.com\r\ntransfer-encoding: chunked\r\n\r\n"
        );
    }

    #[test]
    fn proxy_headers_are_appended_or_replaced() {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_static("203.0.113.1"));
        h.append("x-forwarded-for", HeaderValue::from_static("203.0.113.2"));
        h.insert("x-real-ip", HeaderValue::from_static("spoofed"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("spoofed"));
        let p = ProxyHeaders {
            client_ip: b"10.0.0.9",
            proto: "http",
            host: Some(b"h2.example.com"),
        };
        let mut out = Vec::new();
        encode_request_head(&mut out, &Method::GET, "/", &h, Framing::Empty, Some(p));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET / HTTP/1.1\r\nhost: h2.example.com\r\nx-forwarded-host: h2.example.com\r\n\
             x-forwarded-for: 203.0.113.1, 203.0.113.2, 10.0.0.9\r\nx-real-ip: 10.0.0.9\r\n\
             x-forwarded-proto: http\r\n\r\n"
        );
    }

    /// Every spelling the fast path takes gives what `HeaderName::from_bytes` gives; other
    /// spellings and names are left to it.
    #[test]
    fn common_names_are_the_names_from_bytes_gives() {
        let names = [
            "Date",
            "Server",
            "Content-Type",
            "Content-Length",
            "Connection",
            "Transfer-Encoding",
            "Content-Encoding",
            "Cache-Control",
            "Last-Modified",
            "ETag",
            "Accept-Ranges",
            "Vary",
            "Expires",
            "Location",
            "Set-Cookie",
        ];
        for name in names {
            for spelling in [name.to_owned(), name.to_ascii_lowercase()] {
                assert_eq!(
                    common_name(spelling.as_bytes()),
                    Some(HeaderName::from_bytes(spelling.as_bytes()).unwrap()),
                    "{spelling}"
                );
            }
            assert_eq!(common_name(name.to_ascii_uppercase().as_bytes()), None);
        }
        for other in [
            "X-Request-Id",
            "Content-Typ",
            "Datee",
            "",
            "Date ",
            "Dat\0e",
        ] {
            assert_eq!(common_name(other.as_bytes()), None, "{other}");
        }
        // And in a parsed head, whatever the spelling.
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nDATE: x\r\ncontent-length: 0\r\nX-Id: 1\r\n\r\n"[..],
        );
        let head = parse_response_head(&mut buf, &Method::GET)
            .unwrap()
            .unwrap();
        assert_eq!(head.parts.headers["date"], "x");
        assert_eq!(head.parts.headers[header::CONTENT_LENGTH], "0");
        assert_eq!(head.parts.headers["x-id"], "1");
    }
}
