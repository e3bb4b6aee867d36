//! UDP listeners: one session per client address, per worker (`SO_REUSEPORT` hashes a
//! client's datagrams to one worker).
//!
//! - A new client gets its route (client address; no SNI), the stream plugins, a weighted
//!   backend and an endpoint, picked once for the session, and a connected socket to it:
//!   the kernel then drops replies from any other source.
//! - Replies go back to the client from the listening socket.
//! - Bounds: at most `udp_max_sessions` sessions per worker and port, `udp_max_sessions_per_ip`
//!   of one client IP; a datagram that would open a session past them is dropped. A session
//!   ends after its route's idle timeout (default 60 s) with no datagram either way, or
//!   when its route is removed and the drain timeout passed.
//! - No queue of our own: a datagram waits only for its socket's send buffer (the kernel
//!   drops what a UDP socket cannot send, so that wait is short).
//!
//! NB: `send`, not `try_send`: a socket just registered has no readiness yet, so `try_send`
//! refuses its first datagram (`WouldBlock`) until the reactor has seen it writable.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use crate::config::store::Store;
use crate::config::stream::ListenerKind;
use crate::plugins::stream::Verdict;
use sluice_io::lock;

use super::StreamLimits;

/// Largest datagram forwarded.
const MAX_DATAGRAM: usize = 64 * 1024;

struct Session {
    upstream: Arc<UdpSocket>,
    /// Milliseconds since the worker started at which a datagram last passed.
    last_ms: Arc<AtomicU64>,
}

#[derive(Default)]
struct Sessions {
    by_client: HashMap<SocketAddr, Session>,
    per_ip: HashMap<IpAddr, usize>,
}

impl Sessions {
    fn remove(&mut self, client: SocketAddr) {
        if self.by_client.remove(&client).is_some() {
            let ip = client.ip().to_canonical();
            if let Some(n) = self.per_ip.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    self.per_ip.remove(&ip);
                }
            }
        }
    }
}

/// Binds a UDP socket on `addr` with `SO_REUSEPORT`.
pub fn bind_udp_reuseport(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Serves the UDP listener `scope` on `socket` until `stop` resolves; sessions then end.
pub async fn serve_udp(
    socket: UdpSocket,
    store: Arc<Store>,
    limits: StreamLimits,
    scope: Arc<str>,
    stop: impl Future<Output = ()>,
) {
    let socket = Arc::new(socket);
    let local = socket
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let sessions: Arc<Mutex<Sessions>> = Arc::default();
    let closing = CancellationToken::new();
    let started = tokio::time::Instant::now();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    tokio::pin!(stop);
    loop {
        let (n, client) = tokio::select! {
            biased;
            () = &mut stop => break,
            r = socket.recv_from(&mut buf) => match r {
                Ok(r) => r,
                // ICMP errors of earlier sends surface here on some systems: go on.
                Err(_) => continue,
            },
        };
        let data = &buf[..n];
        let now_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let existing = {
            let s = lock(&sessions);
            s.by_client
                .get(&client)
                .map(|s| (Arc::clone(&s.upstream), Arc::clone(&s.last_ms)))
        };
        if let Some((upstream, last)) = existing {
            last.store(now_ms, Ordering::Relaxed);
            let _ = upstream.send(data).await;
            continue;
        }
        {
            let s = lock(&sessions);
            let ip = client.ip().to_canonical();
            if s.by_client.len() >= limits.udp_max_sessions
                || s.per_ip.get(&ip).copied().unwrap_or(0) >= limits.udp_max_sessions_per_ip
            {
                count(&store, &scope, "", "session_limit");
                continue;
            }
        }
        let route = {
            let table = store.peek_table();
            table
                .listener(&scope)
                .and_then(|l| l.streams.lookup(None, client.ip()))
                .cloned()
        };
        let Some(route) = route else {
            count(&store, &scope, "", "no_route");
            continue;
        };
        // NB: a burst delay of limit-conn is not waited for on UDP (it would stall every
        // client of this worker): over `conn` the session is refused instead.
        let slot =
            match tokio::time::timeout(Duration::ZERO, route.plugins.on_connect(client, local))
                .await
            {
                Ok(Verdict::Allow(slot)) => slot,
                Ok(Verdict::Deny(_)) | Err(_) => {
                    count(&store, &scope, &route.id, "denied");
                    continue;
                }
            };
        let Some(upstream) = open_upstream(&route, client).await else {
            count(&store, &scope, &route.id, "upstream_failed");
            continue;
        };
        let upstream = Arc::new(upstream);
        let _ = upstream.send(data).await;
        let last = Arc::new(AtomicU64::new(now_ms));
        {
            let mut s = lock(&sessions);
            s.by_client.insert(
                client,
                Session {
                    upstream: Arc::clone(&upstream),
                    last_ms: Arc::clone(&last),
                },
            );
            *s.per_ip.entry(client.ip().to_canonical()).or_default() += 1;
        }
        let gauge = store.metrics().stream.udp_sessions.clone();
        gauge.inc();
        let idle = route.idle_timeout_on(ListenerKind::Udp);
        let (socket, sessions, closing, store, scope) = (
            Arc::clone(&socket),
            Arc::clone(&sessions),
            closing.clone(),
            Arc::clone(&store),
            Arc::clone(&scope),
        );
        let drain = limits.drain_timeout;
        tokio::spawn(async move {
            let _slot = slot;
            let mut reply = vec![0u8; MAX_DATAGRAM];
            let stop = async {
                tokio::select! {
                    () = route.removed.cancelled() => tokio::time::sleep(drain).await,
                    () = closing.cancelled() => {}
                }
            };
            tokio::pin!(stop);
            let outcome = loop {
                let due = started + Duration::from_millis(last.load(Ordering::Relaxed)) + idle;
                tokio::select! {
                    () = &mut stop => break "drained",
                    r = tokio::time::timeout_at(due, upstream.recv(&mut reply)) => match r {
                        Ok(Ok(n)) => {
                            let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                            last.store(ms, Ordering::Relaxed);
                            let _ = socket.send_to(&reply[..n], client).await;
                        }
                        // ICMP port unreachable from the upstream: keep the session until idle,
                        // but do not spin on the error.
                        Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(10)).await,
                        Err(_) => {
                            let last_at = started + Duration::from_millis(last.load(Ordering::Relaxed));
                            if last_at + idle <= tokio::time::Instant::now() {
                                break "ok";
                            }
                        }
                    },
                }
            };
            lock(&sessions).remove(client);
            gauge.dec();
            count(&store, &scope, &route.id, outcome);
        });
    }
    closing.cancel();
}

fn count(store: &Store, scope: &str, route: &str, outcome: &str) {
    store
        .metrics()
        .stream
        .connections
        .with_label_values(&[scope, route, outcome])
        .inc();
}

/// A socket connected to an endpoint of the route's weighted backend (the balancer picks,
/// `chash` on the client address).
async fn open_upstream(
    route: &crate::config::stream::CompiledStreamRoute,
    client: SocketAddr,
) -> Option<UdpSocket> {
    use std::hash::{Hash, Hasher};
    let up = &route.pick_backend()?.upstream;
    let hash = if up.hash_source().is_some() {
        let mut h = std::hash::DefaultHasher::new();
        client.ip().to_canonical().hash(&mut h);
        h.finish()
    } else {
        0
    };
    let i = up.pick_index(hash, &crate::upstream::balancer::Tried::default())?;
    let ep = up.endpoints.get(i)?;
    let target = tokio::net::lookup_host(ep.address.as_str())
        .await
        .ok()?
        .next()?;
    let bind: SocketAddr = if target.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    let socket = UdpSocket::bind(bind).await.ok()?;
    socket.connect(target).await.ok()?;
    Some(socket)
}
