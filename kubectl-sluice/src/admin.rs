//! Reading a running dataplane's admin listener (`--admin`, loopback by default; reach a
//! pod's with `kubectl port-forward`): the snapshot it serves (`/snapshot?full=1`, which
//! the dataplane redacts before it leaves the process) and its endpoints' live health
//! (`sluice_upstream_endpoint_healthy` in `/metrics`).

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use sluice_proto::v1;

/// Largest answer read from an admin listener (a snapshot of 10,000 routes is ~10 MiB).
pub const MAX_ANSWER: u64 = 256 * 1024 * 1024;
/// Time to connect and between two reads.
const TIMEOUT: Duration = Duration::from_secs(10);
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

/// `GET path` on the admin listener at `url` (`http://HOST:PORT`); the body of a 200.
pub fn get(url: &str, path: &str) -> Result<String, AdminError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| AdminError::Url(url.into()))?;
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() {
        return Err(AdminError::Url(url.into()));
    }
    let io = |e| AdminError::Io(url.into(), e);
    let addrs: Vec<_> = std::net::ToSocketAddrs::to_socket_addrs(authority)
        .map_err(io)?
        .collect();
    let mut last = None;
    let mut stream = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, TIMEOUT) {
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
    stream.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
    // NB: HTTP/1.0 so the body is not chunked and ends with the connection.
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {authority}\r\nAccept: application/json, text/plain\r\n\r\n"
    )
    .map_err(io)?;
    let mut raw = Vec::new();
    stream
        .take(MAX_ANSWER + 1)
        .read_to_end(&mut raw)
        .map_err(io)?;
    if raw.len() as u64 > MAX_ANSWER {
        return Err(AdminError::Body(
            url.into(),
            format!("{path}: answer larger than {MAX_ANSWER} bytes"),
        ));
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| AdminError::Body(url.into(), "no HTTP response".into()))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        let status = head.lines().next().unwrap_or_default();
        return Err(AdminError::Body(
            url.into(),
            format!("{path}: {status}: {}", body.trim()),
        ));
    }
    Ok(body.to_owned())
}

/// The snapshot the dataplane at `url` serves (redacted by the dataplane).
pub fn served(url: &str) -> Result<Served, AdminError> {
    let body = get(url, "/snapshot?full=1")?;
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
pub fn health(url: &str) -> Result<Health, AdminError> {
    Ok(parse_health(&get(url, "/metrics")?))
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
            get("https://127.0.0.1:1", "/"),
            Err(AdminError::Url(_))
        ));
        assert!(matches!(get("http:///x", "/"), Err(AdminError::Url(_))));
    }
}
