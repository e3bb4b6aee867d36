//! Dials the upstream of a stream connection: the route's weighted backend, then an
//! endpoint by the upstream's balancer (round robin, `chash` on the client address,
//! least_conn, ewma), with the upstream's connect timeout. A failed connect is retried on
//! another endpoint, up to the upstream's `retries` (default: every other endpoint), and
//! reported to the passive health check. The PROXY header goes first when the upstream
//! asks for one.

use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::config::stream::{CompiledStreamRoute, SendProxy};
use crate::upstream::balancer::Tried;
use crate::upstream::error::ProxyError;
use crate::upstream::health::{InFlight, Outcome};
use crate::upstream::{DEFAULT_CONNECT_TIMEOUT, Upstream};

use super::proxy_protocol;

/// A connected upstream.
pub struct Connected {
    /// The socket, PROXY header already sent.
    pub stream: TcpStream,
    /// The upstream it belongs to.
    pub upstream: Arc<Upstream>,
    /// Endpoint address.
    pub address: String,
    /// Counts the connection in the endpoint's in-flight load (least_conn) until dropped.
    pub in_flight: InFlight,
}

/// The `chash` key of a stream connection: the client IP (APISIX's stream `chash` on
/// `remote_addr`).
fn client_hash(client: SocketAddr) -> u64 {
    // NB: SipHash with fixed keys: the same client lands on the same endpoint on every
    // worker and every replica.
    let mut h = std::hash::DefaultHasher::new();
    client.ip().to_canonical().hash(&mut h);
    h.finish()
}

/// Connects a connection from `client`, accepted on `local`, to `route`'s upstream.
pub async fn connect(
    route: &CompiledStreamRoute,
    client: SocketAddr,
    local: SocketAddr,
) -> Result<Connected, ProxyError> {
    let backend = route
        .pick_backend()
        .ok_or_else(|| ProxyError::NoEndpoint(route.id.clone()))?;
    let up = &backend.upstream;
    let hash = if up.hash_source().is_some() {
        client_hash(client)
    } else {
        0
    };
    let timeout = up.timeouts.map_or(DEFAULT_CONNECT_TIMEOUT, |t| t.connect);
    let budget = up.retry_budget();
    let mut tried = Tried::default();
    loop {
        let i = up
            .pick_index(hash, &tried)
            .ok_or_else(|| ProxyError::NoEndpoint(up.id.clone()))?;
        let Some(ep) = up.endpoints.get(i) else {
            return Err(ProxyError::NoEndpoint(up.id.clone()));
        };
        let in_flight = ep.state.begin();
        match ep.pool.connect_stream(timeout).await {
            Ok(mut stream) => {
                let _ = stream.set_nodelay(true);
                up.report(ep, Outcome::Status(200));
                if backend.send_proxy != SendProxy::None {
                    let header =
                        proxy_protocol::encode(backend.send_proxy == SendProxy::V2, client, local);
                    stream
                        .write_all(&header)
                        .await
                        .map_err(|source| ProxyError::Connect {
                            addr: ep.address.clone(),
                            source,
                        })?;
                }
                return Ok(Connected {
                    stream,
                    upstream: Arc::clone(up),
                    address: ep.address.clone(),
                    in_flight,
                });
            }
            Err(e) => {
                let outcome = match e {
                    ProxyError::ConnectTimeout(_) => Outcome::Timeout,
                    _ => Outcome::TcpFailure,
                };
                up.report(ep, outcome);
                tried.push(i);
                tracing::debug!(route = %route.id, endpoint = %ep.address, error = %e, "stream connect failed");
                if tried.len() > budget || tried.len() >= up.endpoints.len() {
                    return Err(e);
                }
                up.count_retry("connect");
            }
        }
    }
}
