//! Loopback helpers: free ports and a minimal HTTP/1.1 GET used to check
//! that a proxy really serves the benchmark route before load starts.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// The body the upstream returns and every proxy must pass through.
pub const HELLO_BODY: &[u8] = b"hello world\n";

/// A port on 127.0.0.1 that was free a moment ago (bind to port 0, then release).
pub fn free_port() -> std::io::Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(l.local_addr()?.port())
}

/// True when something accepts TCP connections on 127.0.0.1:`port`.
pub fn port_in_use(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// A parsed HTTP response: status code and (de-chunked) body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code, e.g. 200.
    pub status: u16,
    /// Header fields in order, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body bytes.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses a complete HTTP/1.x response read until the server closed the
/// connection. Supports `Content-Length`, chunked and close-delimited bodies.
pub fn parse_response(raw: &[u8]) -> Result<Response, String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| "no end of headers".to_owned())?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let rest = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1 status line: {status_line:?}"));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line: {status_line:?}"))?;
    let mut content_length = None;
    let mut chunked = false;
    let mut headers = Vec::new();
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            let name = name.trim().to_ascii_lowercase();
            let value = value.trim();
            headers.push((name.clone(), value.to_owned()));
            if name == "content-length" {
                content_length = value.parse::<usize>().ok();
            } else if name == "transfer-encoding" && value.to_ascii_lowercase().contains("chunked")
            {
                chunked = true;
            }
        }
    }
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(n) = content_length {
        rest.get(..n)
            .ok_or_else(|| format!("body shorter than content-length {n}"))?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| "truncated chunk size".to_owned())?;
        let size_text = String::from_utf8_lossy(&data[..eol]);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| format!("bad chunk size {size_hex:?}"))?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = data
            .get(..size)
            .ok_or_else(|| "truncated chunk".to_owned())?;
        out.extend_from_slice(chunk);
        data = data.get(size + 2..).unwrap_or_default();
    }
}

/// Sends `GET path` to 127.0.0.1:`port` with `Connection: close` and returns the response.
pub fn http_get(port: u16, path: &str, timeout: Duration) -> Result<Response, String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    parse_response(&raw)
}

/// Polls `GET path` until it returns 200 with the hello body, the deadline
/// passes, or `give_up` returns an error (e.g. because the process died).
/// On failure returns the last thing observed.
pub fn wait_for_hello(
    port: u16,
    path: &str,
    deadline: Duration,
    mut give_up: impl FnMut() -> Result<(), String>,
) -> Result<(), String> {
    let end = Instant::now() + deadline;
    let mut last = String::from("no attempt made");
    while Instant::now() < end {
        give_up()?;
        match http_get(port, path, Duration::from_secs(2)) {
            Ok(r) if r.status == 200 && r.body == HELLO_BODY => return Ok(()),
            Ok(r) => {
                last = format!(
                    "GET {path} answered {} with body {:?}",
                    r.status,
                    String::from_utf8_lossy(&r.body[..r.body.len().min(200)])
                );
            }
            Err(e) => last = format!("GET {path}: {e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "not serving after {deadline:?}; last attempt: {last}"
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn content_length_body() {
        let raw = b"HTTP/1.1 200 OK\r\nServer: x\r\nContent-Length: 12\r\n\r\nhello world\n";
        let r = parse_response(raw).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, HELLO_BODY);
        assert_eq!(r.header("SERVER"), Some("x"));
        assert_eq!(r.header("content-length"), Some("12"));
        assert_eq!(r.header("x-ratelimit-limit"), None);
    }

    #[test]
    fn chunked_body() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello \r\n6;x=y\r\nworld\n\r\n0\r\n\r\n";
        assert_eq!(parse_response(raw).unwrap().body, HELLO_BODY);
    }

    #[test]
    fn error_status_and_close_delimited() {
        let raw = b"HTTP/1.0 404 Not Found\r\n\r\nno route";
        let r = parse_response(raw).unwrap();
        assert_eq!(r.status, 404);
        assert_eq!(r.body, b"no route");
    }

    #[test]
    fn garbage_is_rejected() {
        assert!(parse_response(b"").is_err());
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nshort").is_err());
    }

    #[test]
    fn get_against_a_local_server() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).unwrap();
            let req = String::from_utf8_lossy(&buf[..n]).to_string();
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nhello world\n")
                .unwrap();
            req
        });
        wait_for_hello(port, "/hello", Duration::from_secs(5), || Ok(())).unwrap();
        let req = server.join().unwrap();
        assert!(req.starts_with("GET /hello HTTP/1.1\r\n"), "{req}");
    }

    #[test]
    fn wait_reports_wrong_answer_and_give_up() {
        let port = free_port().unwrap();
        let e = wait_for_hello(port, "/hello", Duration::from_millis(300), || Ok(())).unwrap_err();
        assert!(e.contains("connect"), "{e}");
        let e = wait_for_hello(port, "/hello", Duration::from_secs(5), || {
            Err("process exited".into())
        })
        .unwrap_err();
        assert_eq!(e, "process exited");
    }
}
