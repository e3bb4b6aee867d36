//! An origin that can be killed (every socket closed at once, as when a pod dies) and
//! restarted on the same port, with counters a test can read and switches it can flip.
//! It panics when it cannot start, as an assertion would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

/// Counters and switches shared with the origin's threads.
#[derive(Debug, Default)]
pub struct OriginState {
    /// `/healthz` answers 200 when true, 500 when false.
    pub healthy: AtomicBool,
    /// Connections accepted.
    pub connections: AtomicUsize,
    /// Requests served.
    pub requests: AtomicUsize,
    /// Requests whose path started with `/healthz`.
    pub probes: AtomicUsize,
    /// Delay before every answer, ms.
    pub delay_ms: std::sync::atomic::AtomicU64,
    /// `host` and `x-probe` headers of the last `/healthz` request.
    pub last_probe: std::sync::Mutex<(String, String)>,
}

/// An HTTP/1.1 origin on its own thread and runtime. Answers `name` in the body and in
/// `x-origin`; `x-seen-host` carries the Host it received; `/delay/<ms>` waits; `/healthz`
/// follows `state.healthy`.
pub struct Origin {
    /// Its name, answered in the body and in `x-origin`.
    pub name: &'static str,
    /// The address it listens on.
    pub addr: SocketAddr,
    /// Its counters and switches, shared with a restarted origin.
    pub state: Arc<OriginState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Origin {
    /// Starts a healthy origin named `name` on a free loopback port.
    pub fn start(name: &'static str) -> Origin {
        let state = Arc::new(OriginState {
            healthy: AtomicBool::new(true),
            ..Default::default()
        });
        Self::start_on(name, "127.0.0.1:0".parse().unwrap(), state)
    }

    /// Starts an origin named `name` on `addr` with `state`.
    pub fn start_on(name: &'static str, addr: SocketAddr, state: Arc<OriginState>) -> Origin {
        let std_listener = bind(addr);
        let addr = std_listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let st = Arc::clone(&state);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                let serve = async {
                    loop {
                        let Ok((stream, _)) = listener.accept().await else {
                            continue;
                        };
                        st.connections.fetch_add(1, Ordering::SeqCst);
                        let st = Arc::clone(&st);
                        tokio::spawn(async move {
                            let svc = service_fn(move |req| handle(req, name, Arc::clone(&st)));
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), svc)
                                .await;
                        });
                    }
                };
                tokio::select! {
                    _ = serve => {}
                    _ = rx => {}
                }
            });
            // Dropping the runtime here closes the listener and every connection.
            drop(rt);
        });
        Origin {
            name,
            addr,
            state,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    /// Closes the listener and every open connection, as a dying pod does.
    pub fn kill(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }

    /// A new origin on the same port with the same state.
    pub fn restart(&self) -> Origin {
        Origin::start_on(self.name, self.addr, Arc::clone(&self.state))
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.kill();
    }
}

fn bind(addr: SocketAddr) -> std::net::TcpListener {
    let socket = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .unwrap();
    socket.set_reuse_address(true).unwrap();
    socket.set_nonblocking(true).unwrap();
    socket.bind(&addr.into()).unwrap();
    socket.listen(1024).unwrap();
    socket.into()
}

async fn handle(
    req: Request<Incoming>,
    name: &'static str,
    st: Arc<OriginState>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    let host = req
        .headers()
        .get("host")
        .map(|h| h.to_str().unwrap_or("").to_owned())
        .unwrap_or_default();
    let x_probe = req
        .headers()
        .get("x-probe")
        .map(|h| h.to_str().unwrap_or("").to_owned())
        .unwrap_or_default();
    let _ = req.into_body().collect().await;
    let mut status = StatusCode::OK;
    if path.starts_with("/healthz") {
        *st.last_probe.lock().unwrap() = (host.clone(), x_probe);
        st.probes.fetch_add(1, Ordering::SeqCst);
        if !st.healthy.load(Ordering::SeqCst) {
            status = StatusCode::INTERNAL_SERVER_ERROR;
        }
    } else {
        st.requests.fetch_add(1, Ordering::SeqCst);
    }
    let delay = st.delay_ms.load(Ordering::SeqCst);
    if delay > 0 && !path.starts_with("/healthz") {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    if let Some(ms) = path
        .strip_prefix("/delay/")
        .and_then(|c| c.parse::<u64>().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let mut resp = Response::new(Full::new(Bytes::from(name)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert("x-origin", http::HeaderValue::from_static(name));
    resp.headers_mut().insert(
        "x-seen-host",
        http::HeaderValue::from_str(&host).unwrap_or(http::HeaderValue::from_static("")),
    );
    Ok(resp)
}
