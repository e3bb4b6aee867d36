//! Per-Gateway listeners: the ports a snapshot's `listeners` ask for, opened when a snapshot
//! names them and closed when one no longer does.
//!
//! - Each port is served like the dataplane's own listeners (`--workers` threads, each with
//!   its own `SO_REUSEPORT` socket and runtime, the same limits and timeouts), on the IP of
//!   `--listen-http`. A plain port reaches only its listener's routes; a TLS port serves
//!   only its listener's certificates, then its routes.
//! - A port that cannot be bound (in use, not permitted) is logged with the listener id and
//!   tried again every [`RETRY`]; the rest of the snapshot is served meanwhile.
//! - A listener that goes away (or changes port or protocol) stops accepting; its open
//!   connections finish their requests, as on shutdown.
//! - On shutdown the process's [`Drain`] phases are passed on to every port.
//! - Stream listeners (TCP, TLS, UDP: `Listener.protocol`) are opened and closed the same
//!   way and served by [`crate::stream`]; a UDP listener may share its port number with a
//!   TCP one. Adding or removing one never touches another port.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::store::Store;
use crate::config::stream::ListenerKind;
use crate::listener::server::{Drain, DrainTrigger, Limits, serve_scoped, spawn_listener_workers};
use crate::listener::tls::serve_https_scoped;
use crate::stream::StreamLimits;
use sluice_io::lock;

/// How long a port that could not be bound waits before the next try.
pub const RETRY: Duration = Duration::from_secs(5);

/// One open per-Gateway port.
struct Running {
    port: u16,
    tls: bool,
    kind: ListenerKind,
    trigger: DrainTrigger,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// The per-Gateway ports of one process.
pub struct GatewayListeners {
    ip: IpAddr,
    workers: usize,
    store: Arc<Store>,
    limits: Limits,
    stream_limits: StreamLimits,
    /// `--proxy-protocol` (trusted peers), for the fleet-wide stream ports.
    fleet_proxy: Option<Arc<Vec<ipnet::IpNet>>>,
    running: BTreeMap<String, Running>,
    /// Threads of ports already closed, until they finish.
    closing: Vec<std::thread::JoinHandle<()>>,
    /// Ports that failed to bind: when they were last tried.
    failed: BTreeMap<String, Instant>,
    /// Set once the process is going away: new ports start in that phase.
    going_away: bool,
}

impl std::fmt::Debug for GatewayListeners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayListeners")
            .field("ip", &self.ip)
            .field("running", &self.running.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl GatewayListeners {
    /// Ports on `ip`, served by `workers` threads each, with `limits`.
    pub fn new(ip: IpAddr, workers: usize, store: Arc<Store>, limits: Limits) -> Self {
        GatewayListeners {
            ip,
            workers,
            store,
            limits,
            stream_limits: StreamLimits::default(),
            fleet_proxy: None,
            running: BTreeMap::new(),
            closing: Vec::new(),
            failed: BTreeMap::new(),
            going_away: false,
        }
    }

    /// The bounds of the stream (TCP, TLS, UDP) ports opened from now on.
    pub fn with_stream_limits(mut self, limits: StreamLimits) -> Self {
        self.stream_limits = limits;
        self
    }

    /// The dataplane's `--proxy-protocol`: the fleet-wide stream ports (`stream/...`, on the
    /// dataplane Service like the HTTP and HTTPS ports) opened from now on require a PROXY
    /// header from these peers too, unless their `Listener` says otherwise. Per-Gateway
    /// ports follow their `Listener` only.
    pub fn with_fleet_proxy_protocol(
        mut self,
        proxy: Option<crate::listener::proxy_protocol::ProxyProtocol>,
    ) -> Self {
        self.fleet_proxy = proxy.map(|p| Arc::new(p.trusted));
        self
    }

    /// Opens the ports the current table names and closes the others.
    pub fn reconcile(&mut self) {
        let table = self.store.table();
        let want: BTreeMap<&str, (u16, bool, ListenerKind)> = table
            .listeners
            .iter()
            .map(|l| (l.id.as_str(), (l.port, l.tls, l.kind)))
            .collect();
        let stale: Vec<String> = self
            .running
            .iter()
            .filter(|(id, r)| want.get(id.as_str()) != Some(&(r.port, r.tls, r.kind)))
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            if let Some(r) = self.running.remove(&id) {
                tracing::info!(listener = %id, port = r.port, "closing Gateway listener");
                r.trigger.drain();
                self.closing.extend(r.threads);
            }
        }
        self.failed.retain(|id, _| want.contains_key(id.as_str()));
        for (id, (port, tls, kind)) in want {
            if self.running.contains_key(id) {
                continue;
            }
            if self.failed.get(id).is_some_and(|at| at.elapsed() < RETRY) {
                continue;
            }
            match self.open(id, port, tls, kind) {
                Ok(r) => {
                    tracing::info!(listener = %id, port, tls, protocol = ?kind, "Gateway listener serving");
                    self.failed.remove(id);
                    self.running.insert(id.to_owned(), r);
                }
                Err(e) => {
                    tracing::error!(listener = %id, port, error = %e, "cannot open Gateway listener; retrying");
                    self.failed.insert(id.to_owned(), Instant::now());
                }
            }
        }
        self.closing.retain(|t| !t.is_finished());
    }

    fn open(&self, id: &str, port: u16, tls: bool, kind: ListenerKind) -> std::io::Result<Running> {
        let addr = SocketAddr::new(self.ip, port);
        let (trigger, drain) = Drain::channel();
        if self.going_away {
            trigger.go_away();
        }
        let scope: Arc<str> = Arc::from(id);
        let (store, limits) = (Arc::clone(&self.store), self.limits);
        let stream_limits = self.stream_limits;
        let fleet_proxy = self.fleet_proxy.clone();
        let threads = if kind == ListenerKind::Udp {
            spawn_udp_workers(addr, self.workers, move |socket| {
                let drain = drain.clone();
                crate::stream::udp::serve_udp(
                    socket,
                    Arc::clone(&store),
                    stream_limits,
                    Arc::clone(&scope),
                    async move { drain.draining().await },
                )
            })?
        } else if kind.is_stream() {
            spawn_listener_workers(addr, self.workers, "sluice-l4", move |listener| {
                let drain = drain.clone();
                crate::stream::serve_tcp(
                    listener,
                    Arc::clone(&store),
                    stream_limits,
                    Arc::clone(&scope),
                    fleet_proxy.clone(),
                    async move { drain.draining().await },
                )
            })?
        } else if tls {
            spawn_listener_workers(addr, self.workers, "sluice-gw-tls", move |listener| {
                serve_https_scoped(
                    listener,
                    Arc::clone(&store),
                    limits,
                    drain.clone(),
                    Some(Arc::clone(&scope)),
                )
            })?
        } else {
            spawn_listener_workers(addr, self.workers, "sluice-gw", move |listener| {
                serve_scoped(
                    listener,
                    Arc::clone(&store),
                    limits,
                    drain.clone(),
                    Some(Arc::clone(&scope)),
                )
            })?
        };
        Ok(Running {
            port,
            tls,
            kind,
            trigger,
            threads,
        })
    }

    /// The shutdown delay started: every port asks its connections to go away.
    pub fn go_away(&mut self) {
        self.going_away = true;
        for r in self.running.values() {
            r.trigger.go_away();
        }
    }

    /// Closes every port; [`GatewayListeners::finished`] tells when their connections are
    /// done.
    pub fn drain(&mut self) {
        for (_, r) in std::mem::take(&mut self.running) {
            r.trigger.drain();
            self.closing.extend(r.threads);
        }
    }

    /// Whether every port is closed and its threads have ended.
    pub fn finished(&self) -> bool {
        self.running.is_empty()
            && self
                .closing
                .iter()
                .all(std::thread::JoinHandle::is_finished)
    }

    /// Ids of the ports open now.
    pub fn open_ids(&self) -> Vec<String> {
        self.running.keys().cloned().collect()
    }
}

/// Starts `workers` threads, each with its own `SO_REUSEPORT` UDP socket on `addr` and a
/// current-thread runtime running `serve(socket)`. Returns once every socket is bound.
fn spawn_udp_workers<F, Fut>(
    addr: SocketAddr,
    workers: usize,
    serve: F,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>>
where
    F: Fn(tokio::net::UdpSocket) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut handles = Vec::with_capacity(workers);
    for i in 0..workers.max(1) {
        let std_socket = crate::stream::udp::bind_udp_reuseport(addr)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let socket = {
            let _guard = rt.enter();
            tokio::net::UdpSocket::from_std(std_socket)?
        };
        let fut = serve(socket);
        handles.push(
            std::thread::Builder::new()
                .name(format!("sluice-udp-{i}"))
                .spawn(move || rt.block_on(fut))?,
        );
    }
    Ok(handles)
}

/// Keeps `listeners` in step with the served table until `drain` starts going away; then
/// passes the shutdown phases on.
pub async fn run(listeners: Arc<Mutex<GatewayListeners>>, store: Arc<Store>, mut drain: Drain) {
    lock(&listeners).reconcile();
    let mut away = drain.clone();
    loop {
        tokio::select! {
            _ = store.table_changed() => {}
            _ = tokio::time::sleep(RETRY) => {}
            _ = away.going_away() => break,
        }
        lock(&listeners).reconcile();
    }
    lock(&listeners).go_away();
    drain.wait().await;
    lock(&listeners).drain();
}
