//! A minimal blocking HTTP/1.1 client for checking test backends without extra dependencies.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::Error;

/// A response read to the end of the connection.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// Header lines as (name, value), names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body (not de-chunked: backends used with this helper send a Content-Length).
    pub body: String,
}

impl HttpResponse {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A sample of the `/metrics` at `addr` (`series` as printed, labels included): `None` when
/// the scrape fails or the series is absent.
pub fn metric(addr: SocketAddr, series: &str) -> Option<f64> {
    let body = http_get(addr, "localhost", "/metrics").ok()?.body;
    sluice_testkit::metrics::sample(&body, series)
}

/// `GET path` with `Host: host` to `addr` over a fresh connection (`Connection: close`), with a
/// 10 s timeout on each step.
pub fn http_get(addr: SocketAddr, host: &str, path: &str) -> Result<HttpResponse, Error> {
    http_get_with(addr, host, path, &[])
}

/// Like [`http_get`], with extra request headers.
pub fn http_get_with(
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<HttpResponse, Error> {
    http_request(addr, "GET", host, path, headers, b"")
}

/// `method path` with `Host: host`, extra `headers` and `body` (sent with a
/// `Content-Length` unless empty) to `addr` over a fresh connection (`Connection: close`),
/// with a 10 s timeout on each step. `User-Agent: sluice-e2e` unless `headers` has one.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<HttpResponse, Error> {
    let err = |why: String| Error::Http { addr, why };
    let timeout = Duration::from_secs(10);
    let mut stream =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| err(format!("connect: {e}")))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| err(e.to_string()))?;
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    if !headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("user-agent"))
    {
        request.push_str("User-Agent: sluice-e2e\r\n");
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body);
    stream
        .write_all(&bytes)
        .map_err(|e| err(format!("write: {e}")))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|e| err(format!("read: {e}")))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| err(format!("no end of headers in {text:?}")))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| err(format!("bad status line {status_line:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok(HttpResponse {
        status,
        headers,
        body: body.to_owned(),
    })
}

/// One HTTP/1.1 keep-alive connection, as a browser or a load balancer's client holds it:
/// requests go out one after another on the same socket and each response is read by its
/// framing (`Content-Length`, chunked, or to the end of the connection), with a 10 s timeout
/// on each step.
#[derive(Debug)]
pub struct HttpConnection {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
    responses: u64,
    open: bool,
    closed_while_idle: bool,
}

impl HttpConnection {
    /// Connects to `addr`.
    pub fn connect(addr: SocketAddr) -> Result<HttpConnection, Error> {
        let err = |why: String| Error::Http { addr, why };
        let timeout = Duration::from_secs(10);
        let stream =
            TcpStream::connect_timeout(&addr, timeout).map_err(|e| err(format!("connect: {e}")))?;
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(|e| err(e.to_string()))?;
        Ok(HttpConnection {
            addr,
            reader: BufReader::new(stream),
            responses: 0,
            open: true,
            closed_while_idle: false,
        })
    }

    /// How many responses were read on this connection.
    pub fn responses(&self) -> u64 {
        self.responses
    }

    /// Whether another request may be sent (false once the server said `Connection: close`,
    /// closed the connection, or an exchange failed).
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Whether the last failed request went out on a reused connection that the server had
    /// already closed: no byte of a response arrived. RFC 9112 §9.3.1 lets a client retry an
    /// idempotent request on a new connection then; any other failure is the server's.
    pub fn closed_while_idle(&self) -> bool {
        self.closed_while_idle
    }

    /// `GET path` with `Host: host` on this connection.
    pub fn get(&mut self, host: &str, path: &str) -> Result<HttpResponse, Error> {
        self.closed_while_idle = false;
        let result = self.exchange(host, path);
        match &result {
            Ok(resp) => {
                self.responses += 1;
                if resp
                    .header("connection")
                    .is_some_and(|v| v.eq_ignore_ascii_case("close"))
                {
                    self.open = false;
                }
            }
            Err(_) => self.open = false,
        }
        result
    }

    fn exchange(&mut self, host: &str, path: &str) -> Result<HttpResponse, Error> {
        let addr = self.addr;
        let err = |why: String| Error::Http { addr, why };
        if !self.open {
            return Err(err("the connection is closed".to_owned()));
        }
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: sluice-e2e\r\n\r\n");
        let reused = self.responses > 0;
        if let Err(e) = self.reader.get_mut().write_all(request.as_bytes()) {
            self.closed_while_idle = reused;
            return Err(err(format!("write: {e}")));
        }
        let mut status_line = String::new();
        match self.reader.read_line(&mut status_line) {
            Ok(0) => {
                self.closed_while_idle = reused;
                return Err(err("connection closed before the response".to_owned()));
            }
            Ok(_) => {}
            Err(e) => {
                self.closed_while_idle = reused
                    && status_line.is_empty()
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                    );
                return Err(err(format!("read: {e}")));
            }
        }
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| err(format!("bad status line {status_line:?}")))?;
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            let n = self
                .reader
                .read_line(&mut line)
                .map_err(|e| err(format!("read headers: {e}")))?;
            let line = line.trim_end_matches(['\r', '\n']);
            if n == 0 || line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
            }
        }
        let find = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let chunked =
            find("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        let length = find("content-length").and_then(|v| v.parse::<usize>().ok());
        let body = if status == 204 || status == 304 {
            Vec::new()
        } else if chunked {
            self.read_chunked()
                .map_err(|e| err(format!("read chunked body: {e}")))?
        } else if let Some(length) = length {
            let mut body = vec![0; length];
            self.reader
                .read_exact(&mut body)
                .map_err(|e| err(format!("read body: {e}")))?;
            body
        } else {
            let mut body = Vec::new();
            self.reader
                .read_to_end(&mut body)
                .map_err(|e| err(format!("read body: {e}")))?;
            self.open = false;
            body
        };
        Ok(HttpResponse {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }

    fn read_chunked(&mut self) -> std::io::Result<Vec<u8>> {
        let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        let mut body = Vec::new();
        loop {
            let mut size_line = String::new();
            self.reader.read_line(&mut size_line)?;
            let size = size_line.trim().split(';').next().unwrap_or_default();
            let size = usize::from_str_radix(size, 16)
                .map_err(|_| bad(format!("bad chunk size {size_line:?}")))?;
            if size == 0 {
                // Trailers, up to the empty line.
                loop {
                    let mut line = String::new();
                    if self.reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
                        return Ok(body);
                    }
                }
            }
            let start = body.len();
            body.resize(start + size, 0);
            self.reader.read_exact(&mut body[start..])?;
            let mut crlf = [0; 2];
            self.reader.read_exact(&mut crlf)?;
        }
    }
}
