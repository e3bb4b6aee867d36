//! A loopback stand-in for a Kubernetes ClusterIP Service: one address whose connections are
//! spread over several endpoints, as kube-proxy spreads the connections to the chart's
//! controller Service over the controller pods.

use std::collections::BTreeMap;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{Error, free_port};

type Open = Arc<Mutex<BTreeMap<u64, [TcpStream; 2]>>>;

/// A TCP forwarder on a loopback port standing in for a Service: each new connection goes to
/// the next endpoint in turn (round robin). The endpoints stay listed whether they are up or
/// not, as a pod's do until its readiness probe fails: a connection to an endpoint that
/// refuses is closed at once, as a connection to a dead pod is reset. Bytes are forwarded
/// unchanged (plaintext HTTP/2 or TLS alike). Dropping it closes every connection.
#[derive(Debug)]
pub struct ServiceProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    cut: Arc<AtomicBool>,
    open: Open,
    accept: Option<JoinHandle<()>>,
}

fn lock(open: &Open) -> MutexGuard<'_, BTreeMap<u64, [TcpStream; 2]>> {
    open.lock().unwrap_or_else(|poison| poison.into_inner())
}

fn close(pair: &[TcpStream; 2]) {
    for s in pair {
        let _ = s.shutdown(Shutdown::Both);
    }
}

/// Copies `from` to `to` until either side ends, then closes both connections (gRPC never
/// half-closes a TCP connection, so the first end is the end of the exchange).
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

fn forward(client: TcpStream, endpoint: SocketAddr, id: u64, open: &Open) {
    let Ok(upstream) = TcpStream::connect_timeout(&endpoint, Duration::from_secs(1)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let clones = (
        client.try_clone(),
        upstream.try_clone(),
        client.try_clone(),
        upstream.try_clone(),
    );
    let (Ok(c1), Ok(u1), Ok(c2), Ok(u2)) = clones else {
        return;
    };
    lock(open).insert(id, [c2, u2]);
    let back = std::thread::spawn(move || pump(u1, c1));
    pump(client, upstream);
    let _ = back.join();
    lock(open).remove(&id);
}

impl ServiceProxy {
    /// Listens on a free loopback port and forwards each connection to the next of
    /// `endpoints` in turn.
    pub fn start(endpoints: &[SocketAddr]) -> Result<ServiceProxy, Error> {
        let addr = free_port()?;
        let listener =
            TcpListener::bind(addr).map_err(|e| Error::io(format!("binding {addr}"), e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(AtomicBool::new(false));
        let open: Open = Arc::default();
        let endpoints = endpoints.to_vec();
        let (stop_t, cut_t, open_t) = (Arc::clone(&stop), Arc::clone(&cut), Arc::clone(&open));
        let accept = std::thread::spawn(move || {
            let next = AtomicU64::new(0);
            for client in listener.incoming() {
                if stop_t.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = client else { continue };
                if cut_t.load(Ordering::Relaxed) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let n = next.fetch_add(1, Ordering::Relaxed);
                let Some(&endpoint) = usize::try_from(n)
                    .ok()
                    .and_then(|n| endpoints.get(n % endpoints.len().max(1)))
                else {
                    continue;
                };
                let open = Arc::clone(&open_t);
                std::thread::spawn(move || forward(client, endpoint, n, &open));
            }
        });
        Ok(ServiceProxy {
            addr,
            stop,
            cut,
            open,
            accept: Some(accept),
        })
    }

    /// The Service's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cuts the path: closes every open connection and closes new ones at once, as a network
    /// partition between a client and every endpoint would (until [`ServiceProxy::restore`]).
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
        for pair in lock(&self.open).values() {
            close(pair);
        }
    }

    /// Undoes [`ServiceProxy::cut`]: new connections are forwarded again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::Relaxed);
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // NB: wakes the blocking accept so the thread sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for pair in lock(&self.open).values() {
            close(pair);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::io::Read;
    use std::io::Write;

    use super::*;

    /// A server that writes `name` to every connection and closes it.
    fn named(name: &'static str) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let _ = stream.write_all(name.as_bytes());
            }
        });
        addr
    }

    fn read_all(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn a_cut_path_closes_every_connection_until_restored() {
        let service = ServiceProxy::start(&[named("a")]).unwrap();
        assert_eq!(read_all(service.addr()), "a");
        service.cut();
        assert_eq!(read_all(service.addr()), "");
        service.restore();
        assert_eq!(read_all(service.addr()), "a");
    }

    #[test]
    fn connections_go_round_robin_and_a_dead_endpoint_closes_them() {
        let dead = free_port().unwrap();
        let service = ServiceProxy::start(&[named("a"), dead, named("b")]).unwrap();
        let got: Vec<String> = (0..6).map(|_| read_all(service.addr())).collect();
        assert_eq!(got, ["a", "", "b", "a", "", "b"]);
    }
}
