//! nginx configurations for the upstream origin and the baseline proxy.
//!
//! Both run with `daemon off; master_process on;` so the harness owns the
//! master and the CPU of the worker is found below it, and with every path
//! (pid, error log, temp dirs) inside a private prefix directory.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The part shared by both configurations.
fn head(prefix: &Path) -> String {
    head_with(prefix, 10240, None)
}

/// [`head`] with `worker_connections` (client and upstream connections of the worker) and,
/// when given, `worker_rlimit_nofile`.
fn head_with(prefix: &Path, worker_connections: u32, rlimit_nofile: Option<u32>) -> String {
    let p = prefix.display();
    let rlimit = rlimit_nofile.map_or_else(String::new, |n| format!("worker_rlimit_nofile {n};\n"));
    format!(
        "worker_processes 1;
{rlimit}daemon off;
master_process on;
pid {p}/nginx.pid;
error_log {p}/error.log warn;

events {{
    worker_connections {worker_connections};
}}
"
    )
}

/// Temp paths inside the prefix so nginx never touches /var/lib/nginx.
fn temp_paths(prefix: &Path) -> String {
    let p = prefix.display();
    format!(
        "    client_body_temp_path {p}/client_body;
    proxy_temp_path {p}/proxy;
    fastcgi_temp_path {p}/fastcgi;
    uwsgi_temp_path {p}/uwsgi;
    scgi_temp_path {p}/scgi;
"
    )
}

/// The origin: answers every request with `200 hello world\n`, on 127.0.0.1:`port`.
pub fn upstream_conf(prefix: &Path, port: u16) -> String {
    format!(
        "{head}
http {{
    access_log off;
{temp}
    server {{
        listen 127.0.0.1:{port};
        default_type text/plain;
        location / {{
            return 200 \"hello world\\n\";
        }}
    }}
}}
",
        head = head(prefix),
        temp = temp_paths(prefix),
    )
}

/// The baseline proxy: `proxy_pass` to an upstream block with `keepalive 320`
/// and HTTP/1.1 without a `Connection` header (so upstream connections are
/// reused), listening on 127.0.0.1:`listen_port`.
pub fn proxy_conf(prefix: &Path, listen_port: u16, upstream_port: u16) -> String {
    proxy_conf_with(head(prefix), prefix, listen_port, upstream_port, "")
}

/// The baseline proxy of `sluice-bench conns`: [`proxy_conf`] with room for `clients`
/// client connections in its one worker (`worker_connections` also counts the upstream
/// ones, `worker_rlimit_nofile` every descriptor), and the client timeouts given in whole
/// milliseconds: `client_header_timeout` (time to send a request head) and
/// `keepalive_timeout` (idle time between requests).
pub fn conns_proxy_conf(
    prefix: &Path,
    listen_port: u16,
    upstream_port: u16,
    clients: u32,
    client_header_timeout: Duration,
    keepalive_timeout: Duration,
) -> String {
    // NB: the upstream keepalive cache (320) and a margin for the listener, log files and
    // upstream connections opened while the cache is full.
    let worker_connections = clients.saturating_add(1024);
    let timeouts = format!(
        "    client_header_timeout {}ms;\n    keepalive_timeout {}ms;\n",
        client_header_timeout.as_millis(),
        keepalive_timeout.as_millis()
    );
    proxy_conf_with(
        head_with(
            prefix,
            worker_connections,
            Some(worker_connections.saturating_mul(2)),
        ),
        prefix,
        listen_port,
        upstream_port,
        &timeouts,
    )
}

fn proxy_conf_with(
    head: String,
    prefix: &Path,
    listen_port: u16,
    upstream_port: u16,
    http_extra: &str,
) -> String {
    format!(
        "{head}
http {{
    access_log off;
{temp}{http_extra}
    upstream backend {{
        server 127.0.0.1:{upstream_port};
        keepalive 320;
    }}

    server {{
        listen 127.0.0.1:{listen_port};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }}
    }}
}}
",
        temp = temp_paths(prefix),
    )
}

/// The origin of `sluice-bench suite`: [`upstream_conf`]'s `/hello`, plus the files under
/// `files_root/files/` (the large-body downloads, sent with sendfile) and `POST /upload`,
/// which reads the whole request body (in memory) before it answers: the proxy module
/// reads it first (request buffering), then fetches `/hello` from this origin without it.
/// NB: not `return` (the rewrite phase answers before any body is read, so a proxy that
/// stops sending on an early response and discards the rest does less work than one that
/// forwards it all), and not `mirror_request_body` with `return` (same phase problem).
/// With `workers` processes (1, or 2 for the scaling scenario).
pub fn origin_conf(prefix: &Path, port: u16, workers: u32, files_root: &Path) -> String {
    let head = head(prefix).replacen(
        "worker_processes 1;",
        &format!("worker_processes {};", workers.max(1)),
        1,
    );
    format!(
        "{head}
http {{
    access_log off;
    sendfile on;
{temp}
    server {{
        listen 127.0.0.1:{port};
        default_type text/plain;
        location / {{
            return 200 \"hello world\\n\";
        }}
        location /files/ {{
            root {root};
        }}
        location = /upload {{
            client_max_body_size 0;
            client_body_buffer_size 16m;
            proxy_http_version 1.1;
            proxy_method GET;
            proxy_pass_request_body off;
            proxy_set_header Content-Length \"\";
            proxy_pass http://127.0.0.1:{port}/hello;
        }}
    }}
}}
",
        temp = temp_paths(prefix),
        root = files_root.display(),
    )
}

/// The nginx baseline of `sluice-bench suite`: [`proxy_conf`]'s settings (upstream
/// `keepalive 320`, HTTP/1.1, `Connection ""`), with the fields below.
#[derive(Debug, Clone, PartialEq)]
pub struct SuiteProxy {
    /// `worker_processes`.
    pub workers: u32,
    /// Port on 127.0.0.1.
    pub listen_port: u16,
    /// The origin's port on 127.0.0.1.
    pub upstream_port: u16,
    /// Client connections the worker must hold (idle scenario); `None` keeps the
    /// benchmark's `worker_connections 10240`. With it, `worker_connections` is this + 1024
    /// and `worker_rlimit_nofile` twice that.
    pub clients: Option<u32>,
    /// `keepalive_timeout` and `client_header_timeout`; `None` keeps nginx's defaults.
    pub client_timeout: Option<Duration>,
    /// Stream bodies both ways, as Sluice and HAProxy do: `client_max_body_size 0`,
    /// `proxy_buffering off`, `proxy_request_buffering off` (large-body scenario).
    pub stream_bodies: bool,
    /// `listen ... ssl` with this certificate chain and key; session cache and tickets on
    /// (resumption is the client's choice).
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl SuiteProxy {
    /// One worker, the benchmark's defaults, plain HTTP.
    pub fn new(listen_port: u16, upstream_port: u16) -> Self {
        Self {
            workers: 1,
            listen_port,
            upstream_port,
            clients: None,
            client_timeout: None,
            stream_bodies: false,
            tls: None,
        }
    }

    /// The configuration text, with every path inside `prefix`.
    pub fn render(&self, prefix: &Path) -> String {
        let head = match self.clients {
            Some(n) => {
                let wc = n.saturating_add(1024);
                head_with(prefix, wc, Some(wc.saturating_mul(2)))
            }
            None => head(prefix),
        }
        .replacen(
            "worker_processes 1;",
            &format!("worker_processes {};", self.workers.max(1)),
            1,
        );
        let mut extra = String::new();
        if let Some(t) = self.client_timeout {
            extra.push_str(&format!(
                "    client_header_timeout {ms}ms;\n    keepalive_timeout {ms}ms;\n",
                ms = t.as_millis()
            ));
        }
        if self.stream_bodies {
            extra.push_str(
                "    client_max_body_size 0;\n    proxy_buffering off;\n    proxy_request_buffering off;\n",
            );
        }
        let (ssl, tls) = match &self.tls {
            Some((cert, key)) => (
                " ssl",
                format!(
                    "        ssl_certificate {};\n        ssl_certificate_key {};\n        ssl_protocols TLSv1.2 TLSv1.3;\n        ssl_session_cache shared:SSL:10m;\n        ssl_session_tickets on;\n",
                    cert.display(),
                    key.display()
                ),
            ),
            None => ("", String::new()),
        };
        format!(
            "{head}
http {{
    access_log off;
{temp}{extra}
    upstream backend {{
        server 127.0.0.1:{upstream};
        keepalive 320;
    }}

    server {{
        listen 127.0.0.1:{listen}{ssl};
{tls}        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }}
    }}
}}
",
            temp = temp_paths(prefix),
            upstream = self.upstream_port,
            listen = self.listen_port,
        )
    }
}

/// The nginx command line for a config written to `prefix/nginx.conf`.
/// `-e` keeps even the earliest startup messages out of /var/log/nginx.
pub fn args(prefix: &Path) -> Vec<String> {
    vec![
        "-p".into(),
        prefix.display().to_string(),
        "-c".into(),
        prefix.join("nginx.conf").display().to_string(),
        "-e".into(),
        prefix.join("error.log").display().to_string(),
    ]
}

/// `nginx -v` output without the `nginx version: ` prefix, e.g. `nginx/1.22.1`.
pub fn version(nginx: &Path) -> Option<String> {
    let out = Command::new(nginx).arg("-v").output().ok()?;
    // nginx prints its version on stderr.
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    parse_version(&text)
}

/// Extracts `nginx/1.22.1` from `nginx version: nginx/1.22.1`.
pub fn parse_version(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("nginx version:"))
        .map(|v| v.trim().to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn proxy_conf_has_the_baseline_settings() {
        let c = proxy_conf(&PathBuf::from("/tmp/x"), 9081, 1980);
        for needle in [
            "worker_processes 1;",
            "daemon off;",
            "master_process on;",
            "access_log off;",
            "pid /tmp/x/nginx.pid;",
            "server 127.0.0.1:1980;",
            "keepalive 320;",
            "listen 127.0.0.1:9081;",
            "proxy_pass http://backend;",
            "proxy_http_version 1.1;",
            "proxy_set_header Connection \"\";",
        ] {
            assert!(c.contains(needle), "missing {needle:?} in\n{c}");
        }
        assert!(!c.contains("0.0.0.0"), "must listen on loopback only");
    }

    #[test]
    fn conns_conf_has_room_and_the_timeouts() {
        let c = conns_proxy_conf(
            &PathBuf::from("/tmp/x"),
            9081,
            1980,
            10_000,
            Duration::from_secs(5),
            Duration::from_secs(300),
        );
        for needle in [
            "worker_processes 1;\nworker_rlimit_nofile 22048;\ndaemon off;",
            "worker_connections 11024;",
            "client_header_timeout 5000ms;",
            "keepalive_timeout 300000ms;",
            "keepalive 320;",
            "listen 127.0.0.1:9081;",
            "proxy_pass http://backend;",
        ] {
            assert!(c.contains(needle), "missing {needle:?} in\n{c}");
        }
        // The proxy benchmark's configuration is unchanged by it.
        let plain = proxy_conf(&PathBuf::from("/tmp/x"), 9081, 1980);
        assert!(plain.contains("worker_connections 10240;"));
        assert!(!plain.contains("worker_rlimit_nofile"));
        assert!(!plain.contains("client_header_timeout"));
    }

    #[test]
    fn upstream_conf_answers_hello_world() {
        let c = upstream_conf(&PathBuf::from("/tmp/u"), 1980);
        assert!(c.contains("listen 127.0.0.1:1980;"));
        assert!(c.contains("return 200 \"hello world\\n\";"));
        assert!(c.contains("client_body_temp_path /tmp/u/client_body;"));
    }

    #[test]
    fn braces_balance() {
        for c in [
            proxy_conf(&PathBuf::from("/p"), 1, 2),
            conns_proxy_conf(
                &PathBuf::from("/p"),
                1,
                2,
                3,
                Duration::from_secs(1),
                Duration::from_secs(1),
            ),
            upstream_conf(&PathBuf::from("/p"), 1),
        ] {
            assert_eq!(c.matches('{').count(), c.matches('}').count(), "{c}");
        }
    }

    #[test]
    fn suite_origin_serves_files_and_reads_uploads() {
        let c = origin_conf(
            &PathBuf::from("/tmp/o"),
            1980,
            2,
            &PathBuf::from("/tmp/o/www"),
        );
        for needle in [
            "worker_processes 2;",
            "listen 127.0.0.1:1980;",
            "return 200 \"hello world\\n\";",
            "root /tmp/o/www;",
            "client_max_body_size 0;",
            "client_body_buffer_size 16m;",
            "proxy_pass_request_body off;",
            "proxy_pass http://127.0.0.1:1980/hello;",
        ] {
            assert!(c.contains(needle), "missing {needle:?} in\n{c}");
        }
        assert_eq!(c.matches('{').count(), c.matches('}').count(), "{c}");
    }

    #[test]
    fn suite_proxy_defaults_are_the_benchmark_baseline() {
        let c = SuiteProxy::new(9081, 1980).render(&PathBuf::from("/p"));
        let base = proxy_conf(&PathBuf::from("/p"), 9081, 1980);
        assert_eq!(
            c.replace(char::is_whitespace, ""),
            base.replace(char::is_whitespace, "")
        );
    }

    #[test]
    fn suite_proxy_options() {
        let mut p = SuiteProxy::new(9443, 1980);
        p.workers = 2;
        p.clients = Some(10_000);
        p.client_timeout = Some(Duration::from_secs(300));
        p.stream_bodies = true;
        p.tls = Some(("/c/e.crt".into(), "/c/e.key".into()));
        let c = p.render(&PathBuf::from("/p"));
        for needle in [
            "worker_processes 2;\nworker_rlimit_nofile 22048;",
            "worker_connections 11024;",
            "keepalive_timeout 300000ms;",
            "client_max_body_size 0;",
            "proxy_buffering off;",
            "proxy_request_buffering off;",
            "listen 127.0.0.1:9443 ssl;",
            "ssl_certificate /c/e.crt;",
            "ssl_session_tickets on;",
        ] {
            assert!(c.contains(needle), "missing {needle:?} in\n{c}");
        }
        assert_eq!(c.matches('{').count(), c.matches('}').count(), "{c}");
    }

    #[test]
    fn version_line() {
        assert_eq!(
            parse_version("nginx version: nginx/1.22.1\n").as_deref(),
            Some("nginx/1.22.1")
        );
        assert_eq!(parse_version("bash: nginx: command not found"), None);
    }
}
