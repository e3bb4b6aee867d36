//! A steady client load for fault tests: one thread sending requests over keep-alive
//! connections while the test breaks things, counting every request that was not answered
//! by a backend.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::http::{HttpConnection, HttpResponse};

/// At most this many failures are kept with their details (all are counted).
const KEPT_FAILURES: usize = 100;

/// One request that failed.
#[derive(Debug, Clone)]
pub struct Failure {
    /// When it was sent, from the start of the load.
    pub at: Duration,
    /// The `Host` header.
    pub host: String,
    /// The path.
    pub path: String,
    /// What came back instead of a backend's 200 (status and body, or the I/O error).
    pub what: String,
}

/// What a load saw from start to stop.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    /// Requests answered 200 by a backend.
    pub ok: u64,
    /// Requests that failed (`failures` keeps the first [`KEPT_FAILURES`] of them).
    pub failed: u64,
    /// The first failures, in order.
    pub failures: Vec<Failure>,
    /// Connections opened (1 when keep-alive held throughout).
    pub connections: u64,
    /// Requests sent again on a new connection because the server had closed the reused one
    /// before answering (RFC 9112 §9.3.1); the retry's outcome is what counts.
    pub retried: u64,
    /// How long the load ran.
    pub elapsed: Duration,
    /// How long each request took (sent to answered or failed), in order.
    pub latencies: Vec<Duration>,
}

impl LoadReport {
    /// The latency below which a fraction `q` (0..=1) of the requests took (nearest rank);
    /// zero without requests.
    pub fn latency_quantile(&self, q: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
        sorted
            .get(rank.saturating_sub(1).min(sorted.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    }

    /// Adds `other`'s counts, failures and latencies to this report.
    pub fn merge(&mut self, other: LoadReport) {
        self.ok += other.ok;
        self.failed += other.failed;
        self.connections += other.connections;
        self.retried += other.retried;
        self.elapsed = self.elapsed.max(other.elapsed);
        self.failures.extend(other.failures);
        self.latencies.extend(other.latencies);
    }

    fn record(&mut self, failure: Failure) {
        self.failed += 1;
        if self.failures.len() < KEPT_FAILURES {
            self.failures.push(failure);
        }
    }
}

/// A client thread sending `GET`s in a loop over keep-alive connections, cycling through
/// its targets. A request succeeds when it is answered `200` with an `x-echo-server` header
/// (it reached a `sluice-echo` backend). Stops when [`Load::stop`] is called or it drops.
#[derive(Debug)]
pub struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    thread: Option<JoinHandle<LoadReport>>,
}

fn judge(resp: &HttpResponse) -> Result<(), String> {
    if resp.status == 200 && resp.header("x-echo-server").is_some() {
        return Ok(());
    }
    let mut body = resp.body.clone();
    body.truncate(200);
    Err(format!("status {} body {body:?}", resp.status))
}

impl Load {
    /// Starts the load against `addr`: `targets` are `(host, path)` pairs sent in turn, with
    /// `pause` between two requests (zero = as fast as one connection goes).
    pub fn start(addr: SocketAddr, targets: &[(&str, &str)], pause: Duration) -> Load {
        Load::start_with(addr, targets, pause, 0)
    }

    /// Like [`Load::start`], with a new connection for every request: each one is a new
    /// choice of a Service's kube-proxy (or a load balancer), so terminating pods keep
    /// receiving new connections until their endpoint is gone.
    pub fn start_reconnecting(addr: SocketAddr, targets: &[(&str, &str)], pause: Duration) -> Load {
        Load::start_with(addr, targets, pause, 1)
    }

    /// `reconnect_every`: close the connection after this many requests (0: keep it).
    fn start_with(
        addr: SocketAddr,
        targets: &[(&str, &str)],
        pause: Duration,
        reconnect_every: u64,
    ) -> Load {
        let targets: Vec<(String, String)> = targets
            .iter()
            .map(|(h, p)| ((*h).to_owned(), (*p).to_owned()))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let (stop_t, ok_t, failed_t) = (Arc::clone(&stop), Arc::clone(&ok), Arc::clone(&failed));
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut report = LoadReport::default();
            let mut conn: Option<HttpConnection> = None;
            let mut sent: u64 = 0;
            let fail = |report: &mut LoadReport, at, target: &(String, String), what| {
                failed_t.fetch_add(1, Ordering::Relaxed);
                report.record(Failure {
                    at,
                    host: target.0.clone(),
                    path: target.1.clone(),
                    what,
                });
            };
            for target in targets.iter().cycle() {
                if stop_t.load(Ordering::Relaxed) {
                    break;
                }
                let at = started.elapsed();
                let mut outcome = None;
                // A second attempt only when the server closed the reused connection
                // before answering.
                for attempt in 0..2 {
                    if !conn.as_ref().is_some_and(HttpConnection::is_open) {
                        match HttpConnection::connect(addr) {
                            Ok(c) => {
                                report.connections += 1;
                                conn = Some(c);
                            }
                            Err(e) => {
                                outcome = Some(Err(e.to_string()));
                                break;
                            }
                        }
                    }
                    let Some(c) = conn.as_mut() else { break };
                    match c.get(&target.0, &target.1) {
                        Ok(resp) => {
                            outcome = Some(judge(&resp));
                            break;
                        }
                        Err(e) if attempt == 0 && c.closed_while_idle() => {
                            report.retried += 1;
                            outcome = Some(Err(e.to_string()));
                        }
                        Err(e) => {
                            outcome = Some(Err(e.to_string()));
                            break;
                        }
                    }
                }
                report.latencies.push(started.elapsed().saturating_sub(at));
                sent += 1;
                if reconnect_every > 0 && sent.is_multiple_of(reconnect_every) {
                    conn = None;
                }
                match outcome {
                    Some(Ok(())) => {
                        ok_t.fetch_add(1, Ordering::Relaxed);
                        report.ok += 1;
                    }
                    Some(Err(what)) => fail(&mut report, at, target, what),
                    None => fail(&mut report, at, target, "not sent".to_owned()),
                }
                if !pause.is_zero() {
                    std::thread::sleep(pause);
                }
            }
            report.elapsed = started.elapsed();
            report
        });
        Load {
            stop,
            ok,
            failed,
            thread: Some(thread),
        }
    }

    /// Requests answered by a backend so far.
    pub fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    /// Requests failed so far.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Stops the client thread and returns what it saw.
    pub fn stop(mut self) -> LoadReport {
        self.finish()
    }

    fn finish(&mut self) -> LoadReport {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(report)) => report,
            Some(Err(_)) => LoadReport {
                failed: 1,
                failures: vec![Failure {
                    at: Duration::ZERO,
                    host: String::new(),
                    path: String::new(),
                    what: "the load thread panicked".to_owned(),
                }],
                ..LoadReport::default()
            },
            None => LoadReport::default(),
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;

    use super::*;

    /// A server that answers `/ok` (Content-Length) and `/chunked` as a backend would, `/missing`
    /// with a 404 of its own, and closes every connection after `per_connection` responses
    /// (as a server closing idle keep-alive connections does).
    fn server(per_connection: usize) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut out = stream;
                    for _ in 0..per_connection {
                        let mut request_line = String::new();
                        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
                            return;
                        }
                        loop {
                            let mut line = String::new();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                                break;
                            }
                        }
                        let path = request_line.split_whitespace().nth(1).unwrap_or_default();
                        let response = match path {
                            "/ok" => "HTTP/1.1 200 OK\r\nx-echo-server: t\r\ncontent-length: 2\r\n\r\nok".to_owned(),
                            "/chunked" => "HTTP/1.1 200 OK\r\nx-echo-server: t\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n".to_owned(),
                            _ => "HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\n\r\nno route\n".to_owned(),
                        };
                        if out.write_all(response.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    #[test]
    fn keep_alive_framing_and_idle_closes() {
        let addr = server(3);
        let mut conn = HttpConnection::connect(addr).unwrap();
        let chunked = conn.get("h", "/chunked").unwrap();
        assert_eq!((chunked.status, chunked.body.as_str()), (200, "abcde"));
        let ok = conn.get("h", "/ok").unwrap();
        assert_eq!((ok.status, ok.body.as_str()), (200, "ok"));
        assert_eq!(conn.get("h", "/missing").unwrap().status, 404);
        assert_eq!(conn.responses(), 3);
        // The server closed after three responses: the fourth never got an answer.
        assert!(conn.get("h", "/ok").is_err());
        assert!(conn.closed_while_idle());
        assert!(!conn.is_open());
    }

    #[test]
    fn a_load_counts_what_a_backend_did_not_answer_and_retries_idle_closes() {
        let addr = server(4);
        let load = Load::start(
            addr,
            &[("h", "/ok"), ("h", "/chunked"), ("h", "/missing")],
            Duration::ZERO,
        );
        crate::eventually(Duration::from_secs(10), || load.ok() >= 40);
        let report = load.stop();
        assert!(report.ok >= 40, "{report:?}");
        // Every third request is the 404; nothing else failed.
        assert!(report.failed >= 19, "{report:?}");
        assert!(
            report
                .failures
                .iter()
                .all(|f| f.path == "/missing" && f.what.starts_with("status 404")),
            "{report:#?}"
        );
        assert!(report.connections > 1 && report.retried >= 1, "{report:?}");
    }

    #[test]
    fn nothing_listening_is_a_failure() {
        let addr = crate::free_port().unwrap();
        let load = Load::start(addr, &[("h", "/ok")], Duration::from_millis(1));
        crate::eventually(Duration::from_secs(10), || load.failed() >= 3);
        let report = load.stop();
        assert_eq!(report.ok, 0);
        assert!(report.failed >= 3, "{report:?}");
        assert!(report.failures[0].what.contains("connect"), "{report:?}");
    }
}
