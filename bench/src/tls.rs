//! `sluice-bench tls`: HTTPS side by side with nginx, same certificate, same origin.
//!
//! ```text
//!   CPU 1                                  CPU 0
//!   h2load --h1 -c64 (keep-alive)  ──TLS──▶  proxy (nginx `listen ssl` | sluice --listen-https) ──▶ nginx origin :1980
//!   handshake client (this process)  ──TLS──▶  (new connection + one request each)
//! ```
//!
//! Measurements, each for both proxies in turn, proxy CPU from /proc:
//!
//! - `keepalive-ecdsa`: HTTPS keep-alive requests per proxy CPU-second (h2load `--h1 -t1
//!   -c64`, SNI `bench.test`, ECDSA P-256 certificate).
//! - `handshake-ecdsa`, `handshake-rsa`: new TLS connections per proxy CPU-second (full
//!   TLS 1.3 handshake with X25519, no resumption, then `GET /hello` with
//!   `Connection: close`), from 32 concurrent rustls clients in this process that skip
//!   certificate verification, so the client side stays cheap. ECDSA P-256 and RSA-2048.
//!
//! nginx runs with `worker_processes 1`, `ssl_session_cache off`, `ssl_session_tickets
//! off` (no resumption on either side) and `keepalive_requests` raised so neither proxy
//! closes keep-alive connections during a run. Certificates are made with `openssl req`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::BenchError;
use crate::process::{ProcessGuard, TempDir};
use crate::runner::{PATH, UPSTREAM_PORT, allowed_cpus, pick_cpus, pinned, require};
use crate::{nginx, probe, procfs, sluice};

/// The SNI and Host every client uses.
pub(crate) const HOST: &str = "bench.test";
/// Concurrent handshake clients.
const HANDSHAKE_CLIENTS: usize = 32;
/// h2load connections for the keep-alive run.
const KEEPALIVE_CONNECTIONS: u32 = 64;

/// Options of `sluice-bench tls`.
#[derive(Debug, Clone)]
pub struct TlsOptions {
    /// The sluice-dataplane binary; `None` builds it with `cargo build --release`.
    pub sluice_bin: Option<PathBuf>,
    /// Workspace (for the build and for `bench/results`).
    pub workspace: PathBuf,
    /// Length of each measured run.
    pub duration: Duration,
    /// Rounds (nginx then sluice, every measurement).
    pub repeat: u32,
    /// Where result files go: history outside the clone, `latest-*` copies in
    /// `bench/results` ([`crate::results`]).
    pub results: crate::results::ResultsDirs,
}

/// Key type of the served certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// ECDSA P-256.
    Ecdsa,
    /// RSA 2048.
    Rsa,
}

impl Key {
    fn name(self) -> &'static str {
        match self {
            Key::Ecdsa => "ecdsa",
            Key::Rsa => "rsa",
        }
    }
}

/// One measured figure for one proxy.
#[derive(Debug, Clone, Copy)]
struct Figure {
    /// Completed requests (keep-alive) or connections (handshake).
    count: u64,
    wall_s: f64,
    proxy_cpu_s: f64,
}

impl Figure {
    fn per_cpu_s(&self) -> f64 {
        self.count as f64 / self.proxy_cpu_s.max(1e-9)
    }
    fn per_s(&self) -> f64 {
        self.count as f64 / self.wall_s.max(1e-9)
    }
}

/// Generates a self-signed certificate for [`HOST`] with `openssl req`.
pub(crate) fn make_cert(dir: &Path, key: Key) -> Result<(PathBuf, PathBuf), BenchError> {
    let cert = dir.join(format!("{}.crt", key.name()));
    let keyf = dir.join(format!("{}.key", key.name()));
    let mut cmd = Command::new("openssl");
    cmd.args(["req", "-x509", "-nodes", "-days", "30", "-newkey"]);
    match key {
        Key::Ecdsa => cmd.args(["ec", "-pkeyopt", "ec_paramgen_curve:P-256"]),
        Key::Rsa => cmd.args(["rsa:2048"]),
    };
    cmd.arg("-keyout")
        .arg(&keyf)
        .arg("-out")
        .arg(&cert)
        .args(["-subj", &format!("/CN={HOST}")])
        .args(["-addext", &format!("subjectAltName=DNS:{HOST}")]);
    let out = cmd
        .output()
        .map_err(|e| BenchError::Usage(format!("openssl: {e}")))?;
    if !out.status.success() {
        return Err(BenchError::Usage(format!(
            "openssl req failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok((cert, keyf))
}

fn nginx_tls_conf(prefix: &Path, port: u16, cert: &Path, key: &Path) -> String {
    let p = prefix.display();
    format!(
        "worker_processes 1;
daemon off;
master_process on;
pid {p}/nginx.pid;
error_log {p}/error.log warn;
events {{ worker_connections 10240; }}
http {{
    access_log off;
    client_body_temp_path {p}/client_body;
    proxy_temp_path {p}/proxy;
    fastcgi_temp_path {p}/fastcgi;
    uwsgi_temp_path {p}/uwsgi;
    scgi_temp_path {p}/scgi;
    keepalive_requests 100000000;
    upstream backend {{
        server 127.0.0.1:{UPSTREAM_PORT};
        keepalive 320;
    }}
    server {{
        listen 127.0.0.1:{port} ssl;
        server_name {HOST};
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache off;
        ssl_session_tickets off;
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }}
    }}
}}
",
        cert = cert.display(),
        key = key.display(),
    )
}

fn indent(text: &str) -> String {
    text.trim()
        .lines()
        .map(|l| format!("      {l}\n"))
        .collect()
}

/// Scenario 1 plus a Secret and an ApisixTls for [`HOST`].
pub(crate) fn sluice_yaml(scenario1: &str, cert: &Path, key: &Path) -> Result<String, BenchError> {
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| BenchError::io("read", p, e));
    Ok(format!(
        "{scenario1}
---
apiVersion: v1
kind: Secret
metadata:
  name: bench-cert
  namespace: default
type: kubernetes.io/tls
stringData:
  tls.crt: |
{crt}  tls.key: |
{key}---
apiVersion: apisix.apache.org/v2
kind: ApisixTls
metadata:
  name: bench
  namespace: default
spec:
  hosts: [{HOST}]
  secret:
    name: bench-cert
    namespace: default
",
        crt = indent(&read(cert)?),
        key = indent(&read(key)?),
    ))
}

/// Accepts any server certificate: the benchmark measures the proxy, not the client.
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn client_config() -> Result<Arc<ClientConfig>, BenchError> {
    client_config_with(false)
}

/// The handshake clients' configuration; with `resume`, TLS 1.3 session tickets are kept
/// in memory and offered on the next connection (rustls's default client cache).
pub(crate) fn client_config_with(resume: bool) -> Result<Arc<ClientConfig>, BenchError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| BenchError::Usage(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
        .with_no_client_auth();
    if !resume {
        config.resumption = rustls::client::Resumption::disabled();
    }
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// One new TLS connection with one request; `Ok(true)` when the response was 200.
async fn one_connection(
    addr: SocketAddr,
    connector: &tokio_rustls::TlsConnector,
) -> std::io::Result<bool> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(HOST).map_err(std::io::Error::other)?;
    let mut tls = connector.connect(name, tcp).await?;
    let req = format!("GET {PATH} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).await?;
    let mut buf = Vec::with_capacity(512);
    // NB: a peer closing without close_notify is an error for rustls; the response is in.
    let _ = tls.read_to_end(&mut buf).await;
    Ok(buf.starts_with(b"HTTP/1.1 200"))
}

/// Ready when one HTTPS request answers 200.
pub(crate) fn wait_ready(addr: SocketAddr, proxy: &mut ProcessGuard) -> Result<(), BenchError> {
    let rt = runtime()?;
    let connector = tokio_rustls::TlsConnector::from(client_config()?);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if rt
            .block_on(one_connection(addr, &connector))
            .unwrap_or(false)
        {
            return Ok(());
        }
        if let Some(status) = proxy.try_exit_status() {
            return Err(BenchError::NotReady {
                what: proxy.name().into(),
                detail: format!("exited with {status}: {}", proxy.log_tail(10)),
            });
        }
        if Instant::now() > deadline {
            return Err(BenchError::NotReady {
                what: proxy.name().into(),
                detail: format!("no HTTPS 200 within 20 s: {}", proxy.log_tail(10)),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::Usage(format!("tokio runtime: {e}")))
}

/// New connections with one request each, from [`HANDSHAKE_CLIENTS`] concurrent clients,
/// for `duration`. Returns (successful connections, failures, wall seconds).
fn handshake_load(addr: SocketAddr, duration: Duration) -> Result<(u64, u64, f64), BenchError> {
    let rt = runtime()?;
    let connector = tokio_rustls::TlsConnector::from(client_config()?);
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + duration;
    rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..HANDSHAKE_CLIENTS {
            let (connector, ok, failed) = (connector.clone(), Arc::clone(&ok), Arc::clone(&failed));
            tasks.push(tokio::spawn(async move {
                while tokio::time::Instant::now() < deadline {
                    match one_connection(addr, &connector).await {
                        Ok(true) => ok.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    });
    Ok((
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64(),
    ))
}

/// Parses `requests: N total, N started, N done, N succeeded` from h2load.
pub fn parse_h2load_succeeded(output: &str) -> Option<u64> {
    let line = output.lines().find(|l| l.starts_with("requests:"))?;
    let part = line.split(',').find(|p| p.trim().ends_with("succeeded"))?;
    part.split_whitespace().next()?.parse().ok()
}

struct Ctx {
    h2load: PathBuf,
    proxy_cpu: Option<usize>,
    load_cpu: Option<usize>,
    clk_tck: u64,
}

impl Ctx {
    fn cpu_s(&self, ticks: u64) -> f64 {
        ticks as f64 / self.clk_tck as f64
    }

    fn keepalive(
        &self,
        dir: &Path,
        proxy: &ProcessGuard,
        port: u16,
        duration: Duration,
    ) -> Result<Figure, BenchError> {
        let args = vec![
            "--h1".to_string(),
            "-t1".into(),
            format!("-c{KEEPALIVE_CONNECTIONS}"),
            format!("-D{}", duration.as_secs().max(1)),
            format!("--connect-to=127.0.0.1:{port}"),
            format!("https://{HOST}{PATH}"),
        ];
        let cmd = pinned(self.load_cpu, &self.h2load, &args);
        let before = procfs::tree_cpu_ticks(proxy.pid());
        let started = Instant::now();
        let mut guard = ProcessGuard::spawn("h2load", cmd, &dir.join("h2load.log"))?;
        let status = guard
            .wait_timeout(duration + Duration::from_secs(30))
            .ok_or_else(|| BenchError::Wrk("h2load did not finish in time".into()))?;
        let wall_s = started.elapsed().as_secs_f64();
        let after = procfs::tree_cpu_ticks(proxy.pid());
        let text = guard.log_text();
        if !status.success() {
            return Err(BenchError::Wrk(format!(
                "h2load exited with {status}: {text}"
            )));
        }
        let count = parse_h2load_succeeded(&text)
            .ok_or_else(|| BenchError::Wrk(format!("no request count in h2load output: {text}")))?;
        Ok(Figure {
            count,
            wall_s,
            proxy_cpu_s: self.cpu_s(after.saturating_sub(before)),
        })
    }

    fn handshakes(
        &self,
        proxy: &ProcessGuard,
        port: u16,
        duration: Duration,
    ) -> Result<Figure, BenchError> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let before = procfs::tree_cpu_ticks(proxy.pid());
        let (ok, failed, wall_s) = handshake_load(addr, duration)?;
        let after = procfs::tree_cpu_ticks(proxy.pid());
        if failed > ok / 100 {
            eprintln!(
                "sluice-bench tls: {}: WARNING: {failed} failed connections ({ok} ok)",
                proxy.name()
            );
        }
        Ok(Figure {
            count: ok,
            wall_s,
            proxy_cpu_s: self.cpu_s(after.saturating_sub(before)),
        })
    }
}

/// Pins this process (the handshake client) to `cpu`.
fn pin_self(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        let _ = Command::new("taskset")
            .args([
                "-a",
                "-p",
                "-c",
                &cpu.to_string(),
                &std::process::id().to_string(),
            ])
            .output();
    }
}

/// (measurement, proxy) → one figure per round.
type Table = Vec<(String, &'static str, Vec<Figure>)>;

fn record(table: &mut Table, what: &str, proxy: &'static str, f: Figure) {
    eprintln!(
        "sluice-bench tls: {what} {proxy}: {} in {:.1} s ({:.0}/s), proxy CPU {:.2} s → {:.0} per CPU-s",
        f.count,
        f.wall_s,
        f.per_s(),
        f.proxy_cpu_s,
        f.per_cpu_s()
    );
    match table.iter_mut().find(|(w, p, _)| w == what && *p == proxy) {
        Some((_, _, v)) => v.push(f),
        None => table.push((what.to_owned(), proxy, vec![f])),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Markdown: per measurement, each proxy's median per-CPU-second and per-second figures and
/// the per-round sluice ÷ nginx ratios with their median.
fn render(table: &Table, rounds: u32, header: &str) -> String {
    let mut out = format!(
        "{header}\n\n| measurement | nginx /CPU-s | sluice /CPU-s | sluice ÷ nginx per CPU-s (median; rounds) | nginx /s | sluice /s |\n|---|---:|---:|---|---:|---:|\n"
    );
    let mut names: Vec<&str> = Vec::new();
    for (w, _, _) in table {
        if !names.contains(&w.as_str()) {
            names.push(w);
        }
    }
    for name in names {
        let get = |proxy: &str| {
            table
                .iter()
                .find(|(w, p, _)| w == name && *p == proxy)
                .map(|(_, _, v)| v.clone())
                .unwrap_or_default()
        };
        let (n, s) = (get("nginx"), get("sluice"));
        let ratios: Vec<f64> = n
            .iter()
            .zip(&s)
            .map(|(a, b)| b.per_cpu_s() / a.per_cpu_s())
            .collect();
        let per_round: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        out.push_str(&format!(
            "| {name} | {:.0} | {:.0} | **{:.2}×** ({}) | {:.0} | {:.0} |\n",
            median(n.iter().map(Figure::per_cpu_s).collect()),
            median(s.iter().map(Figure::per_cpu_s).collect()),
            median(ratios.clone()),
            per_round.join(", "),
            median(n.iter().map(Figure::per_s).collect()),
            median(s.iter().map(Figure::per_s).collect()),
        ));
    }
    out.push_str(&format!(
        "\n{rounds} round(s); figures are medians over rounds.\n"
    ));
    out
}

/// Runs the TLS benchmark and writes `tls-<arch>.md` into the results dir.
pub fn run_tls_bench(opts: &TlsOptions) -> Result<String, BenchError> {
    let nginx_bin = require("nginx")?;
    let h2load = require("h2load")?;
    require("openssl")?;
    let cpus = pick_cpus(&allowed_cpus());
    let (proxy_cpu, load_cpu) = (cpus.map(|c| c.0), cpus.map(|c| c.1));
    if probe::port_in_use(UPSTREAM_PORT) {
        return Err(BenchError::PortInUse {
            port: UPSTREAM_PORT,
        });
    }
    let bin = match &opts.sluice_bin {
        Some(p) => sluice::check_given_binary(p)?,
        None => sluice::build_release(&opts.workspace)?,
    };
    let scenario1_path = sluice::scenario_config(&opts.workspace, 1);
    let scenario1 = std::fs::read_to_string(&scenario1_path)
        .map_err(|e| BenchError::io("read", &scenario1_path, e))?;
    pin_self(load_cpu);
    let ctx = Ctx {
        h2load,
        proxy_cpu,
        load_cpu,
        clk_tck: procfs::clock_ticks_per_sec(),
    };

    let certs_dir = TempDir::new("tls-certs")?;
    let ecdsa = make_cert(certs_dir.path(), Key::Ecdsa)?;
    let rsa = make_cert(certs_dir.path(), Key::Rsa)?;

    let upstream_dir = TempDir::new("upstream")?;
    std::fs::write(
        upstream_dir.path().join("nginx.conf"),
        nginx::upstream_conf(upstream_dir.path(), UPSTREAM_PORT),
    )
    .map_err(|e| BenchError::io("write", upstream_dir.path(), e))?;
    let _upstream = ProcessGuard::spawn(
        "upstream nginx",
        pinned(ctx.proxy_cpu, &nginx_bin, &nginx::args(upstream_dir.path())),
        &upstream_dir.path().join("stdout.log"),
    )?;
    probe::wait_for_hello(UPSTREAM_PORT, PATH, Duration::from_secs(20), || Ok(())).map_err(
        |d| BenchError::NotReady {
            what: "upstream nginx".into(),
            detail: d,
        },
    )?;

    let mut table = Table::new();
    for round in 1..=opts.repeat {
        eprintln!("sluice-bench tls: round {round}/{}", opts.repeat);
        for (key, (cert, keyf)) in [(Key::Ecdsa, &ecdsa), (Key::Rsa, &rsa)] {
            for proxy_name in ["nginx", "sluice"] {
                let dir = TempDir::new(&format!("tls-{proxy_name}"))?;
                let port =
                    probe::free_port().map_err(|e| BenchError::io("bind", "127.0.0.1:0", e))?;
                let mut proxy = if proxy_name == "nginx" {
                    std::fs::write(
                        dir.path().join("nginx.conf"),
                        nginx_tls_conf(dir.path(), port, cert, keyf),
                    )
                    .map_err(|e| BenchError::io("write", dir.path(), e))?;
                    ProcessGuard::spawn(
                        "nginx (tls)",
                        pinned(ctx.proxy_cpu, &nginx_bin, &nginx::args(dir.path())),
                        &dir.path().join("stdout.log"),
                    )?
                } else {
                    let yaml = dir.path().join("sluice.yaml");
                    std::fs::write(&yaml, sluice_yaml(&scenario1, cert, keyf)?)
                        .map_err(|e| BenchError::io("write", &yaml, e))?;
                    let http =
                        probe::free_port().map_err(|e| BenchError::io("bind", "127.0.0.1:0", e))?;
                    let admin =
                        probe::free_port().map_err(|e| BenchError::io("bind", "127.0.0.1:0", e))?;
                    let mut args = sluice::args(&yaml, http, admin);
                    if let Some(i) = args.iter().position(|a| a == "--listen-https") {
                        args.drain(i..i + 2);
                    }
                    args.extend(["--listen-https".into(), format!("127.0.0.1:{port}")]);
                    ProcessGuard::spawn(
                        "sluice (tls)",
                        pinned(ctx.proxy_cpu, &bin, &args),
                        &dir.path().join("stdout.log"),
                    )?
                };
                let addr = SocketAddr::from(([127, 0, 0, 1], port));
                wait_ready(addr, &mut proxy)?;
                if key == Key::Ecdsa {
                    // Warm-up, then the keep-alive measurement.
                    ctx.keepalive(dir.path(), &proxy, port, Duration::from_secs(2))?;
                    let f = ctx.keepalive(dir.path(), &proxy, port, opts.duration)?;
                    record(&mut table, "keepalive-ecdsa req", proxy_name, f);
                }
                ctx.handshakes(&proxy, port, Duration::from_secs(1))?;
                let f = ctx.handshakes(&proxy, port, opts.duration)?;
                record(
                    &mut table,
                    &format!("handshake-{} conn", key.name()),
                    proxy_name,
                    f,
                );
                proxy.stop();
            }
        }
    }
    let header = format!(
        "## sluice-bench tls ({}; proxy CPU {}, load CPU {}; {} s per run; h2load --h1 -c{KEEPALIVE_CONNECTIONS}; {HANDSHAKE_CLIENTS} handshake clients)",
        std::env::consts::ARCH,
        proxy_cpu.map_or_else(|| "any".into(), |c| c.to_string()),
        load_cpu.map_or_else(|| "any".into(), |c| c.to_string()),
        opts.duration.as_secs()
    );
    let text = render(&table, opts.repeat, &header);
    let arch = std::env::consts::ARCH;
    let stamp = crate::machine::timestamp_utc(std::time::SystemTime::now());
    opts.results
        .write_history(&format!("tls-{arch}-{stamp}.md"), &text)?;
    opts.results
        .write_latest(&format!("latest-tls-{arch}.md"), &text)?;
    Ok(text)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn h2load_counts() {
        let out = "finished in 10.00s, 51234.50 req/s, 5.00MB/s\nrequests: 512345 total, 512409 started, 512345 done, 512300 succeeded, 45 failed, 0 errored, 0 timeout\n";
        assert_eq!(parse_h2load_succeeded(out), Some(512300));
        assert_eq!(parse_h2load_succeeded("nothing"), None);
    }

    #[test]
    fn nginx_conf_terminates_tls_without_resumption() {
        let c = nginx_tls_conf(
            Path::new("/p"),
            9443,
            Path::new("/c.crt"),
            Path::new("/c.key"),
        );
        for needle in [
            "listen 127.0.0.1:9443 ssl;",
            "ssl_certificate /c.crt;",
            "ssl_session_cache off;",
            "ssl_session_tickets off;",
            "worker_processes 1;",
        ] {
            assert!(c.contains(needle), "{needle}");
        }
        assert_eq!(c.matches('{').count(), c.matches('}').count());
    }
}
