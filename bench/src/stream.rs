//! `sluice-bench stream` (issue 41): plain TCP through Sluice's stream proxy, HAProxy
//! (`mode tcp`) and nginx `stream`, one after the other against the same origin.
//!
//! Setup, the same for the three: the proxy pinned to CPU 0 with one worker (Sluice
//! `--workers 1` plus the given `--sluice-arg`s, HAProxy `nbthread 1`, nginx
//! `worker_processes 1`); the origin and the load generator are threads of this process,
//! pinned to CPU 1, so no backend shares the proxy's core.
//!
//! Two cases, each `duration` long after a 1 s warm-up:
//! - **throughput**: `connections` connections each write 64 KiB chunks as fast as the
//!   path takes them; the origin reads and drops them. Figure: bytes per second through the
//!   proxy, and per CPU-second of the proxy.
//! - **connect**: `connections` threads each open a connection, send one byte, wait for the
//!   origin's one-byte answer, close, and again. Figure: connections per second, and per
//!   CPU-second of the proxy.
//!
//! Rounds (`repeat`) rotate the order of the proxies; the report gives each figure's median.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::BenchError;
use crate::process::{ProcessGuard, TempDir};
use crate::{haproxy, nginx, probe, procfs, sluice};

/// Chunk the throughput case writes.
const CHUNK: usize = 64 * 1024;

/// What `sluice-bench stream` runs.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// The measured part of each case.
    pub duration: Duration,
    /// Client connections (throughput) or client threads (connect).
    pub connections: usize,
    /// Rounds; the order of the proxies rotates between them.
    pub repeat: usize,
    /// The `sluice-dataplane` binary.
    pub sluice_bin: PathBuf,
    /// Extra flags for the dataplane (e.g. `--write-batching=send`).
    pub sluice_args: Vec<String>,
    /// `/usr/lib/nginx/modules/ngx_stream_module.so` or where it is.
    pub nginx_stream_module: PathBuf,
}

/// The proxies compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proxy {
    /// `sluice-dataplane --standalone` with an ApisixRoute `spec.stream` rule.
    Sluice,
    /// HAProxy, `mode tcp`.
    Haproxy,
    /// nginx `stream { proxy_pass }`.
    Nginx,
}

impl Proxy {
    /// The name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Proxy::Sluice => "sluice",
            Proxy::Haproxy => "haproxy",
            Proxy::Nginx => "nginx",
        }
    }
}

/// One proxy's figures in one round.
#[derive(Debug, Clone, Copy, Default)]
pub struct Figures {
    /// Throughput case: bytes per second.
    pub bytes_per_s: f64,
    /// Throughput case: bytes per CPU-second of the proxy.
    pub bytes_per_cpu_s: f64,
    /// Connect case: connections per second.
    pub conns_per_s: f64,
    /// Connect case: connections per CPU-second of the proxy.
    pub conns_per_cpu_s: f64,
    /// Failed connects or writes (both cases).
    pub errors: u64,
}

/// The origin: answers the first byte of every connection with one byte, then reads and
/// drops everything until the client closes.
struct Origin {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Origin {
    fn start() -> Result<Self, BenchError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| BenchError::Usage(format!("origin bind: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| BenchError::Usage(format!("origin address: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; CHUNK];
                    if !matches!(conn.read(&mut buf), Ok(n) if n > 0) {
                        return;
                    }
                    if conn.write_all(b"k").is_err() {
                        return;
                    }
                    while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
                });
            }
        });
        Ok(Self { addr, stop })
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop.
        let _ = TcpStream::connect(self.addr);
    }
}

/// One connection that said hello: a byte out, the origin's byte back.
fn hello(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let mut c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    c.write_all(b"h")?;
    let mut one = [0u8; 1];
    c.read_exact(&mut one)?;
    Ok(c)
}

/// Throughput case: bytes written through `addr` in `d`, and errors.
fn throughput(addr: SocketAddr, connections: usize, d: Duration) -> (u64, u64) {
    let bytes = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + d;
    let threads: Vec<_> = (0..connections)
        .map(|_| {
            let (bytes, errors) = (Arc::clone(&bytes), Arc::clone(&errors));
            std::thread::spawn(move || {
                let Ok(mut c) = hello(addr) else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                let chunk = vec![0x5au8; CHUNK];
                while Instant::now() < until {
                    match c.write(&chunk) {
                        Ok(n) => {
                            bytes.fetch_add(n as u64, Ordering::Relaxed);
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    }
                }
                let _ = c.shutdown(Shutdown::Both);
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    (
        bytes.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
    )
}

/// Connect case: connections completed through `addr` in `d`, and errors.
fn connects(addr: SocketAddr, threads: usize, d: Duration) -> (u64, u64) {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + d;
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (done, errors) = (Arc::clone(&done), Arc::clone(&errors));
            std::thread::spawn(move || {
                while Instant::now() < until {
                    match hello(addr) {
                        Ok(c) => {
                            drop(c);
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            // Out of ephemeral ports or a refused connect: back off a little.
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    (done.load(Ordering::Relaxed), errors.load(Ordering::Relaxed))
}

/// Pins this process's later threads to `cpu` (threads inherit the creator's affinity).
fn pin_self(cpu: usize) {
    let _ = Command::new("taskset")
        .args(["-pc", &cpu.to_string(), &std::process::id().to_string()])
        .output();
}

fn pinned(cpu: usize, program: &Path, args: &[String]) -> Command {
    let mut c = Command::new("taskset");
    c.arg("-c").arg(cpu.to_string()).arg(program).args(args);
    c
}

fn write(path: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|e| BenchError::io("write", path, e))
}

/// Starts `proxy` on 127.0.0.1:`port` in front of `origin`; ready once a hello goes through.
fn start(
    proxy: Proxy,
    opts: &StreamOptions,
    dir: &Path,
    port: u16,
    origin: SocketAddr,
) -> Result<ProcessGuard, BenchError> {
    let o = origin.port();
    let cmd = match proxy {
        Proxy::Sluice => {
            let config = dir.join("stream.yaml");
            write(
                &config,
                &format!(
                    "apiVersion: apisix.apache.org/v2\nkind: ApisixRoute\n\
                     metadata: {{name: bench, namespace: default}}\n\
                     spec:\n  stream:\n    - {{name: tcp, protocol: TCP, match: {{ingressPort: {port}}}, \
                     backend: {{serviceName: origin, servicePort: {o}}}}}\n---\n\
                     apiVersion: v1\nkind: Service\nmetadata: {{name: origin, namespace: default}}\n\
                     spec: {{ports: [{{name: tcp, protocol: TCP, port: {o}, targetPort: {o}}}]}}\n---\n\
                     apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
                     metadata: {{name: origin-1, namespace: default, labels: {{kubernetes.io/service-name: origin}}}}\n\
                     addressType: IPv4\nendpoints: [{{addresses: [127.0.0.1], conditions: {{ready: true}}}}]\n\
                     ports: [{{name: tcp, protocol: TCP, port: {o}}}]\n"
                ),
            )?;
            let http = probe::free_port().map_err(|e| BenchError::Usage(e.to_string()))?;
            let admin = probe::free_port().map_err(|e| BenchError::Usage(e.to_string()))?;
            let mut args = sluice::args(&config, http, admin);
            args.extend(["--stream-ports".to_owned(), format!("tcp:{port}")]);
            args.extend(opts.sluice_args.iter().cloned());
            pinned(0, &opts.sluice_bin, &args)
        }
        Proxy::Haproxy => {
            let conf = dir.join("haproxy.cfg");
            write(
                &conf,
                &format!(
                    "global\n    nbthread 1\n    maxconn 4000\n\
                     defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 60s\n    timeout server 60s\n\
                     frontend f\n    bind 127.0.0.1:{port}\n    default_backend b\n\
                     backend b\n    server origin 127.0.0.1:{o}\n"
                ),
            )?;
            pinned(0, Path::new("haproxy"), &haproxy::args(&conf))
        }
        Proxy::Nginx => {
            let p = dir.display();
            write(
                &dir.join("nginx.conf"),
                &format!(
                    "load_module {};\nworker_processes 1;\ndaemon off;\nmaster_process on;\n\
                     pid {p}/nginx.pid;\nerror_log {p}/error.log warn;\n\
                     events {{ worker_connections 20000; }}\n\
                     stream {{ server {{ listen 127.0.0.1:{port}; proxy_pass 127.0.0.1:{o}; }} }}\n",
                    opts.nginx_stream_module.display()
                ),
            )?;
            pinned(0, Path::new("nginx"), &nginx::args(dir))
        }
    };
    let mut guard = ProcessGuard::spawn(proxy.name(), cmd, &dir.join("proxy.log"))?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if hello(addr).is_ok() {
            return Ok(guard);
        }
        if guard.try_exit_status().is_some() || Instant::now() > deadline {
            return Err(BenchError::Usage(format!(
                "{} did not proxy a hello: {}",
                proxy.name(),
                guard.log_tail(10)
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// CPU-seconds the process tree of `pid` used while `f` ran, and `f`'s result.
fn with_cpu<T>(pid: u32, f: impl FnOnce() -> T) -> (f64, T) {
    let tck = procfs::clock_ticks_per_sec().max(1) as f64;
    let before = procfs::tree_cpu_ticks(pid);
    let out = f();
    let after = procfs::tree_cpu_ticks(pid);
    (after.saturating_sub(before) as f64 / tck, out)
}

/// One proxy, both cases.
fn measure(proxy: Proxy, opts: &StreamOptions, origin: SocketAddr) -> Result<Figures, BenchError> {
    let dir = TempDir::new(&format!("sluice-stream-{}", proxy.name()))?;
    let port = probe::free_port().map_err(|e| BenchError::Usage(e.to_string()))?;
    let guard = start(proxy, opts, dir.path(), port, origin)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let secs = opts.duration.as_secs_f64();
    // Warm-up.
    throughput(addr, opts.connections, Duration::from_secs(1));
    let (cpu, (bytes, e1)) = with_cpu(guard.pid(), || {
        throughput(addr, opts.connections, opts.duration)
    });
    let bytes_per_s = bytes as f64 / secs;
    let bytes_per_cpu_s = if cpu > 0.0 { bytes as f64 / cpu } else { 0.0 };
    connects(addr, opts.connections, Duration::from_secs(1));
    let (cpu, (n, e2)) = with_cpu(guard.pid(), || {
        connects(addr, opts.connections, opts.duration)
    });
    drop(guard);
    Ok(Figures {
        bytes_per_s,
        bytes_per_cpu_s,
        conns_per_s: n as f64 / secs,
        conns_per_cpu_s: if cpu > 0.0 { n as f64 / cpu } else { 0.0 },
        errors: e1 + e2,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Runs every round and returns the report (markdown).
pub fn run(opts: &StreamOptions) -> Result<String, BenchError> {
    pin_self(1);
    let origin = Origin::start()?;
    let proxies = [Proxy::Sluice, Proxy::Haproxy, Proxy::Nginx];
    let mut rounds: Vec<Vec<(Proxy, Figures)>> = Vec::new();
    for r in 0..opts.repeat.max(1) {
        let mut round = Vec::new();
        for i in 0..proxies.len() {
            let p = proxies[(i + r) % proxies.len()];
            let f = measure(p, opts, origin.addr)?;
            eprintln!(
                "sluice-bench stream: round {} {}: {:.0} MB/s ({:.0} MB/CPU-s), {:.0} conn/s ({:.0} conn/CPU-s), {} errors",
                r + 1,
                p.name(),
                f.bytes_per_s / 1e6,
                f.bytes_per_cpu_s / 1e6,
                f.conns_per_s,
                f.conns_per_cpu_s,
                f.errors
            );
            round.push((p, f));
        }
        rounds.push(round);
    }
    let med = |p: Proxy, get: fn(&Figures) -> f64| {
        median(
            rounds
                .iter()
                .flatten()
                .filter(|(q, _)| *q == p)
                .map(|(_, f)| get(f))
                .collect(),
        )
    };
    let mut out = String::new();
    out.push_str(&format!(
        "Setup: each proxy pinned to CPU 0 with one worker; origin and load generator on CPU 1 \
         (threads of sluice-bench); {} connections; {} s per case; {} rounds, medians.\n\n",
        opts.connections,
        opts.duration.as_secs(),
        opts.repeat.max(1)
    ));
    out.push_str("| proxy | MB/s | MB per CPU-s | conn/s | conn per CPU-s | errors |\n|---|---|---|---|---|---|\n");
    for p in proxies {
        let errors: u64 = rounds
            .iter()
            .flatten()
            .filter(|(q, _)| *q == p)
            .map(|(_, f)| f.errors)
            .sum();
        out.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {} |\n",
            p.name(),
            med(p, |f| f.bytes_per_s) / 1e6,
            med(p, |f| f.bytes_per_cpu_s) / 1e6,
            med(p, |f| f.conns_per_s),
            med(p, |f| f.conns_per_cpu_s),
            errors
        ));
    }
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    for (base, name) in [(Proxy::Haproxy, "HAProxy"), (Proxy::Nginx, "nginx")] {
        out.push_str(&format!(
            "\nSluice ÷ {name}: throughput {:.2}× (per CPU-s {:.2}×), connection rate {:.2}× (per CPU-s {:.2}×)",
            ratio(med(Proxy::Sluice, |f| f.bytes_per_s), med(base, |f| f.bytes_per_s)),
            ratio(
                med(Proxy::Sluice, |f| f.bytes_per_cpu_s),
                med(base, |f| f.bytes_per_cpu_s)
            ),
            ratio(med(Proxy::Sluice, |f| f.conns_per_s), med(base, |f| f.conns_per_s)),
            ratio(
                med(Proxy::Sluice, |f| f.conns_per_cpu_s),
                med(base, |f| f.conns_per_cpu_s)
            ),
        ));
    }
    out.push('\n');
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }

    /// The origin answers a hello and drops what follows; a direct throughput and connect
    /// run against it count bytes and connections (the load generator works without a proxy).
    #[test]
    fn the_origin_and_the_load_generator_work_end_to_end() {
        let origin = Origin::start().unwrap();
        let (bytes, errors) = throughput(origin.addr, 2, Duration::from_millis(200));
        assert!(bytes > 0 && errors == 0, "{bytes} {errors}");
        let (n, errors) = connects(origin.addr, 2, Duration::from_millis(200));
        assert!(n > 0 && errors == 0, "{n} {errors}");
    }
}
