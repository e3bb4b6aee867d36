//! Reading a running dataplane's admin listener (`--admin`, loopback by default; reach a
//! pod's with `kubectl port-forward`): the snapshot it serves (`/snapshot?full=1`, which
//! the dataplane redacts before it leaves the process) and its endpoints' live health
//! (`sluice_upstream_endpoint_healthy` in `/metrics`).
//!
//! The answer is untrusted: read within one deadline for the whole exchange (a server that
//! trickles bytes cannot hold the CLI), at most [`MAX_ANSWER`] bytes, and an error body is
//! cut to [`MAX_ERROR_BODY`] bytes (the caller prints it through
//! [`crate::terminal::sanitize`]).

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use sluice_proto::v1;

/// Largest answer read from an admin listener (a snapshot of 10,000 routes is ~10 MiB).
pub const MAX_ANSWER: u64 = 256 * 1024 * 1024;
/// Longest wait to connect and between two reads (within the whole exchange's deadline).
const TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of a non-200 answer's body shown in the error.
pub const MAX_ERROR_BODY: usize = 1024;
/// The gauge that says whether an endpoint is in the rotation.
const HEALTH_METRIC: &str = "sluice_upstream_endpoint_healthy";

/// Why the dataplane could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Only `http://host:port` admin URLs are supported.
    #[error("unsupported admin URL {0:?}: expected http://HOST:PORT")]
    Url(String),
    /// Network error.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// The whole exchange took longer than the deadline (`--request-timeout`).
    #[error("{0}: no complete answer within {1:?} (--request-timeout)")]
    Deadline(String, Duration),
    /// The answer is not what was asked for.
    #[error("{0}: {1}")]
    Body(String, String),
}

/// What a dataplane serves, as its admin listener shows it.
#[derive(Debug, Clone)]
pub struct Served {
    /// Snapshot version.
    pub version: u64,
    /// Snapshot content hash.
    pub hash: String,
    /// The snapshot, with every key and credential redacted by the dataplane.
    pub snapshot: v1::Snapshot,
}

/// `GET path` on the admin listener at `url` (`http://HOST:PORT`); the body of a 200, the
/// whole exchange within `deadline`.
pub fn get(url: &str, path: &str, deadline: Duration) -> Result<String, AdminError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| AdminError::Url(url.into()))?;
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() {
        return Err(AdminError::Url(url.into()));
    }
    let start = Instant::now();
    let io = |e| AdminError::Io(url.into(), e);
    let late = || AdminError::Deadline(url.into(), deadline);
    // The time left, at most TIMEOUT; an error once the deadline passed.
    let left = || {
        deadline
            .checked_sub(start.elapsed())
            .filter(|d| !d.is_zero())
            .map(|d| d.min(TIMEOUT))
            .ok_or_else(late)
    };
    let addrs: Vec<_> = std::net::ToSocketAddrs::to_socket_addrs(authority)
        .map_err(io)?
        .collect();
    let mut last = None;
    let mut stream = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, left()?) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut stream = stream.ok_or_else(|| {
        io(last.unwrap_or_else(|| std::io::Error::other("no address for the host")))
    })?;
    stream.set_write_timeout(Some(left()?)).map_err(io)?;
    // NB: HTTP/1.0 so the body is not chunked and ends with the connection.
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {authority}\r\nAccept: application/json, text/plain\r\n\r\n"
    )
    .map_err(io)?;
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        stream.set_read_timeout(Some(left()?)).map_err(io)?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::Interrupted) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) && left().is_err() =>
            {
                return Err(late());
            }
            Err(e) => return Err(io(e)),
        }
        if raw.len() as u64 > MAX_ANSWER {
            return Err(AdminError::Body(
                url.into(),
                format!("{path}: answer larger than {MAX_ANSWER} bytes"),
            ));
        }
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| AdminError::Body(url.into(), "no HTTP response".into()))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        let status = head.lines().next().unwrap_or_default();
        let mut body = body.trim();
        if body.len() > MAX_ERROR_BODY {
            let mut end = MAX_ERROR_BODY;
            while !body.is_char_boundary(end) {
                end -= 1;
            }
            body = &body[..end];
        }
        return Err(AdminError::Body(
            url.into(),
            format!(
                "{path}: {}: {body}",
                status.chars().take(200).collect::<String>()
            ),
        ));
    }
    Ok(body.to_owned())
}

/// The snapshot the dataplane at `url` serves (redacted by the dataplane).
pub fn served(url: &str, deadline: Duration) -> Result<Served, AdminError> {
    let body = get(url, "/snapshot?full=1", deadline)?;
    let bad = |e: String| AdminError::Body(url.into(), e);
    let doc: serde_json::Value = serde_json::from_str(&body).map_err(|e| bad(e.to_string()))?;
    let snap = doc
        .get("snapshot")
        .cloned()
        .ok_or_else(|| bad("no snapshot served yet".into()))?;
    Ok(Served {
        version: doc.get("version").and_then(|v| v.as_u64()).unwrap_or(0),
        hash: doc
            .get("hash")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned(),
        snapshot: serde_json::from_value(snap).map_err(|e| bad(e.to_string()))?,
    })
}

/// Live health of endpoints, keyed by (upstream id, `host:port`): `true` in the rotation.
pub type Health = BTreeMap<(String, String), bool>;

/// The endpoints' health read from the dataplane's `/metrics`.
pub fn health(url: &str, deadline: Duration) -> Result<Health, AdminError> {
    Ok(parse_health(&get(url, "/metrics", deadline)?))
}

/// Reads the `sluice_upstream_endpoint_healthy{upstream="..",endpoint=".."} 0|1` samples of
/// a Prometheus text exposition; other lines are ignored.
pub fn parse_health(text: &str) -> Health {
    let mut out = Health::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(HEALTH_METRIC) else {
            continue;
        };
        let Some((labels, value)) = rest.strip_prefix('{').and_then(|r| r.rsplit_once('}')) else {
            continue;
        };
        let mut upstream = None;
        let mut endpoint = None;
        for (name, v) in labels_of(labels) {
            match name.as_str() {
                "upstream" => upstream = Some(v),
                "endpoint" => endpoint = Some(v),
                _ => {}
            }
        }
        let healthy = match value.trim().parse::<f64>() {
            Ok(v) => v != 0.0,
            Err(_) => continue,
        };
        if let (Some(u), Some(e)) = (upstream, endpoint) {
            out.insert((u, e), healthy);
        }
    }
    out
}

/// `name="value",...` with the exposition format's escapes (`\\`, `\"`, `\n`).
fn labels_of(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        let name: String = chars
            .by_ref()
            .skip_while(|c| *c == ',' || c.is_whitespace())
            .take_while(|c| *c != '=')
            .collect();
        if name.is_empty() || chars.next() != Some('"') {
            return out;
        }
        let mut value = String::new();
        loop {
            match chars.next() {
                None => return out,
                Some('"') => break,
                Some('\\') => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(c) => value.push(c),
                    None => return out,
                },
                Some(c) => value.push(c),
            }
        }
        out.push((name.trim().to_owned(), value));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_health_samples_and_ignores_other_lines() {
        let text = "\
# HELP sluice_upstream_endpoint_healthy Whether ...
# TYPE sluice_upstream_endpoint_healthy gauge
sluice_upstream_endpoint_healthy{endpoint=\"10.0.0.1:80\",upstream=\"default/web\"} 1
sluice_upstream_endpoint_healthy{endpoint=\"[fd00::1]:8080\",upstream=\"a\\\"b\"} 0
sluice_upstream_endpoint_healthy_total{endpoint=\"x:1\",upstream=\"y\"} 0
sluice_upstream_requests_in_flight{endpoint=\"10.0.0.1:80\",upstream=\"default/web\"} 3
sluice_upstream_endpoint_healthy{endpoint=\"broken\"} 0
";
        let h = parse_health(text);
        assert_eq!(h.len(), 2, "{h:?}");
        assert!(h[&("default/web".into(), "10.0.0.1:80".into())]);
        assert!(!h[&("a\"b".into(), "[fd00::1]:8080".into())]);
    }

    #[test]
    fn only_http_urls() {
        assert!(matches!(
            get("https://127.0.0.1:1", "/", Duration::from_secs(1)),
            Err(AdminError::Url(_))
        ));
        assert!(matches!(
            get("http:///x", "/", Duration::from_secs(1)),
            Err(AdminError::Url(_))
        ));
    }
}
