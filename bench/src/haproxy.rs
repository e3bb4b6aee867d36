//! HAProxy as a second baseline proxy (`sluice-bench suite`, issue 21).
//!
//! The configuration is a typed value rendered by [`HaproxyConf::render`], like the nginx
//! configurations in `nginx.rs`: every setting comes from a field, numbers are numbers, and
//! the only strings (paths of files the harness made itself) are checked to be single
//! configuration words before they are written. HAProxy runs in the foreground (`-db`: no
//! daemon, no master-worker), so the harness owns the one process and its threads' CPU
//! time is the process's.
//!
//! What it mirrors from the nginx baseline: one thread (`nbthread 1`) unless asked for
//! more, loopback listener, keep-alive to the origin (HAProxy's default `http-reuse safe`
//! with idle server connections kept), no logging. Bodies stream both ways (HAProxy's
//! default: no `option http-buffer-request`). TLS resumption is HAProxy's default (session
//! cache and TLS tickets); whether a client resumes is the client's choice.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::error::BenchError;

/// A HAProxy configuration for the benchmark.
#[derive(Debug, Clone, PartialEq)]
pub struct HaproxyConf {
    /// `nbthread`: worker threads of the one process (1 = the single-worker benchmark).
    pub threads: u32,
    /// Port of the frontend on 127.0.0.1.
    pub listen_port: u16,
    /// Port of the origin on 127.0.0.1.
    pub upstream_port: u16,
    /// `maxconn` (global and frontend): client connections held at once. As root, HAProxy
    /// raises its own RLIMIT_NOFILE to fit it.
    pub maxconn: u32,
    /// `timeout client` and `timeout http-keep-alive`: how long an idle client connection
    /// is kept.
    pub client_timeout: Duration,
    /// `timeout http-request`: time to send a request head.
    pub header_timeout: Duration,
    /// TLS on the frontend: one PEM file with the certificate chain and its key.
    pub tls_pem: Option<PathBuf>,
}

impl HaproxyConf {
    /// The benchmark defaults: one thread, 10,240 connections, 60 s client timeout, 30 s
    /// head timeout, plain HTTP.
    pub fn new(listen_port: u16, upstream_port: u16) -> Self {
        Self {
            threads: 1,
            listen_port,
            upstream_port,
            maxconn: 10_240,
            client_timeout: Duration::from_secs(60),
            header_timeout: Duration::from_secs(30),
            tls_pem: None,
        }
    }

    /// The configuration text; an error when a field cannot be written safely (a path
    /// that is not one configuration word, zero threads or connections).
    pub fn render(&self) -> Result<String, BenchError> {
        if self.threads == 0 {
            return Err(BenchError::Usage(
                "haproxy config: threads must be at least 1".into(),
            ));
        }
        if self.maxconn == 0 {
            return Err(BenchError::Usage(
                "haproxy config: maxconn must be at least 1".into(),
            ));
        }
        let ms = |d: Duration| format!("{}ms", d.as_millis().max(1));
        let bind_tls = match &self.tls_pem {
            Some(pem) => format!(" ssl crt {} alpn http/1.1", config_word(pem, "tls_pem")?),
            None => String::new(),
        };
        Ok(format!(
            "global
    nbthread {threads}
    maxconn {maxconn}
    ssl-default-bind-options ssl-min-ver TLSv1.2

defaults
    mode http
    option http-keep-alive
    timeout connect 5s
    timeout client {client}
    timeout server 60s
    timeout http-request {header}
    timeout http-keep-alive {client}

frontend bench
    bind 127.0.0.1:{listen}{bind_tls}
    maxconn {maxconn}
    default_backend origin

backend origin
    server origin 127.0.0.1:{upstream}
",
            threads = self.threads,
            maxconn = self.maxconn,
            client = ms(self.client_timeout),
            header = ms(self.header_timeout),
            listen = self.listen_port,
            upstream = self.upstream_port,
        ))
    }
}

/// A path as one word of HAProxy's configuration: no whitespace, quotes, comment sign,
/// backslash or control characters (the harness only writes paths it made itself; this
/// makes sure a strange temp dir is an error, not a different configuration).
fn config_word(path: &Path, field: &str) -> Result<String, BenchError> {
    let text = path
        .to_str()
        .ok_or_else(|| BenchError::Usage(format!("haproxy config: {field}: path is not UTF-8")))?;
    let bad = text.is_empty()
        || text
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '\'' | '#' | '\\'));
    if bad {
        return Err(BenchError::Usage(format!(
            "haproxy config: {field}: {text:?} is not a single configuration word"
        )));
    }
    Ok(text.to_owned())
}

/// HAProxy's command line for a configuration at `conf`: foreground, no master-worker.
pub fn args(conf: &Path) -> Vec<String> {
    vec!["-db".into(), "-f".into(), conf.display().to_string()]
}

/// `haproxy -v` first line, shortened to `HAProxy 2.6.12-1+deb12u4`.
pub fn version(haproxy: &Path) -> Option<String> {
    let out = Command::new(haproxy).arg("-v").output().ok()?;
    parse_version(&String::from_utf8_lossy(&out.stdout))
}

/// Extracts `HAProxy 2.6.12-1+deb12u4` from `HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/`.
pub fn parse_version(text: &str) -> Option<String> {
    let rest = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("HAProxy version "))?;
    let v = rest.split_whitespace().next()?;
    Some(format!("HAProxy {v}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn plain_config_has_the_baseline_settings() {
        let c = HaproxyConf::new(9081, 1980).render().unwrap();
        for needle in [
            "nbthread 1\n",
            "maxconn 10240\n",
            "mode http\n",
            "timeout client 60000ms\n",
            "timeout http-request 30000ms\n",
            "timeout http-keep-alive 60000ms\n",
            "bind 127.0.0.1:9081\n",
            "server origin 127.0.0.1:1980\n",
        ] {
            assert!(c.contains(needle), "missing {needle:?} in\n{c}");
        }
        assert!(!c.contains("0.0.0.0"), "loopback only");
        assert!(!c.contains("ssl crt"));
        assert!(!c.contains("daemon"), "the harness owns the process");
        assert!(!c.contains("http-buffer-request"), "bodies must stream");
    }

    #[test]
    fn tls_threads_and_room() {
        let mut conf = HaproxyConf::new(9443, 1980);
        conf.threads = 2;
        conf.maxconn = 11_024;
        conf.client_timeout = Duration::from_secs(300);
        conf.tls_pem = Some(PathBuf::from("/tmp/sluice-bench-x/ecdsa.pem"));
        let c = conf.render().unwrap();
        for needle in [
            "nbthread 2\n",
            "maxconn 11024\n",
            "timeout http-keep-alive 300000ms\n",
            "bind 127.0.0.1:9443 ssl crt /tmp/sluice-bench-x/ecdsa.pem alpn http/1.1\n",
        ] {
            assert!(c.contains(needle), "missing {needle:?} in\n{c}");
        }
    }

    #[test]
    fn a_path_that_is_not_one_word_is_refused() {
        for bad in [
            "/tmp/a b.pem",
            "/tmp/a\nfrontend x",
            "/tmp/#x",
            "/tmp/\"x",
            "",
        ] {
            let mut conf = HaproxyConf::new(1, 2);
            conf.tls_pem = Some(PathBuf::from(bad));
            let e = conf.render().unwrap_err().to_string();
            assert!(e.contains("tls_pem"), "{e}");
        }
        let mut conf = HaproxyConf::new(1, 2);
        conf.threads = 0;
        assert!(conf.render().unwrap_err().to_string().contains("threads"));
    }

    #[test]
    fn version_line() {
        assert_eq!(
            parse_version(
                "HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/\nStatus: x\n"
            )
            .as_deref(),
            Some("HAProxy 2.6.12-1+deb12u4")
        );
        assert_eq!(parse_version("command not found"), None);
    }
}
