//! PROXY protocol v1/v2 on the HTTP and HTTPS listeners: the header a load balancer (AWS
//! NLB, HAProxy, a bare-metal balancer) writes before the client's bytes, carrying the
//! client's address. Opt-in per listener, as ingress-nginx's `use-proxy-protocol` and Envoy's
//! proxy protocol listener filter:
//!
//! - the dataplane's own `--listen-http` / `--listen-https` ports with `--proxy-protocol`
//!   (peers limited by `--proxy-protocol-trusted`), chart `dataplane.proxyProtocol`; the
//!   same flag covers the fleet-wide TCP/TLS stream ports (`crate::stream`);
//! - a per-Gateway port whose snapshot `Listener` has `accept_proxy_protocol` (peers
//!   limited by its `proxy_protocol_trusted`).
//!
//! On such a listener every connection must start with a header, read before anything else
//! (before the HTTP/2 preface sniff, before the TLS ClientHello) by the stream stage's
//! bounded reader ([`crate::stream::proxy_protocol::read_header`]: 107 bytes for v1, 16 +
//! 4,096 for v2, within `Limits::proxy_header_timeout`). A connection without a valid
//! header, or from a peer outside the trusted CIDRs, is closed without a byte written. The
//! address the header carries becomes the connection's client address (`ConnInfo`):
//! `X-Forwarded-For`/`X-Real-IP`, `real-ip`, `ip-restriction`, `limit-*` keys, access logs
//! and route `remoteAddrs` all see it. A v2 `LOCAL` header (the balancer's health check) and
//! v1 `UNKNOWN` keep the socket's peer. Bytes read past the header are the client's first
//! bytes and are replayed before the socket.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

use crate::config::store::Store;
use crate::stream::proxy_protocol::read_header;

/// `--proxy-protocol` on the dataplane's own HTTP and HTTPS listeners.
#[derive(Debug, Clone, Default)]
pub struct ProxyProtocol {
    /// Peers allowed to send the header (the balancer's addresses); empty = any peer.
    pub trusted: Vec<ipnet::IpNet>,
}

impl ProxyProtocol {
    fn trusts(&self, peer: &SocketAddr) -> bool {
        trusts(&self.trusted, peer)
    }
}

fn trusts(trusted: &[ipnet::IpNet], peer: &SocketAddr) -> bool {
    let ip = peer.ip().to_canonical();
    trusted.is_empty() || trusted.iter().any(|n| n.contains(&ip))
}

/// What a listener asks of a new connection's first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// No PROXY protocol: the bytes are the client's.
    Nothing,
    /// A PROXY header first.
    Header,
    /// The listener requires a header, and this peer may not send one: close.
    Refuse,
}

/// What the listener `scope` (`None`: the dataplane's own, with `fleet`) expects of a
/// connection from `peer`. A per-Gateway listener's setting is read from the table serving
/// now.
pub(crate) fn expect(
    fleet: Option<&ProxyProtocol>,
    scope: Option<&str>,
    store: &Store,
    peer: &SocketAddr,
) -> Expect {
    let verdict = |trusted: bool| {
        if trusted {
            Expect::Header
        } else {
            Expect::Refuse
        }
    };
    match scope {
        None => fleet.map_or(Expect::Nothing, |p| verdict(p.trusts(peer))),
        Some(id) => {
            let table = store.peek_table();
            match table.listener(id) {
                Some(l) if l.accept_proxy_protocol => {
                    verdict(trusts(&l.proxy_protocol_trusted, peer))
                }
                _ => Expect::Nothing,
            }
        }
    }
}

/// Reads the PROXY header `expect` asks for from `stream`: the client's address (`peer`
/// itself without one, or for a `LOCAL`/`UNKNOWN` header) and the bytes read past the
/// header. `None`: close the connection (logged at debug level, counted in
/// `sluice_proxy_protocol_refused_total`).
pub(crate) async fn accept(
    stream: &mut TcpStream,
    peer: SocketAddr,
    expect: Expect,
    timeout: Duration,
    store: &Store,
) -> Option<(SocketAddr, Vec<u8>)> {
    match expect {
        Expect::Nothing => Some((peer, Vec::new())),
        Expect::Refuse => {
            tracing::debug!(%peer, "PROXY header from an untrusted peer: connection closed");
            store.metrics().proxy_protocol_refused("untrusted");
            None
        }
        Expect::Header => match read_header(stream, timeout).await {
            Ok(h) => Some((h.source.unwrap_or(peer), h.rest)),
            Err(e) => {
                tracing::debug!(%peer, error = %e, "PROXY header refused: connection closed");
                store.metrics().proxy_protocol_refused(refusal_reason(&e));
                None
            }
        },
    }
}

/// The `reason` label of a refused header.
fn refusal_reason(e: &crate::stream::proxy_protocol::ProxyHeaderError) -> &'static str {
    use crate::stream::proxy_protocol::ProxyHeaderError as E;
    match e {
        E::Timeout => "timeout",
        E::Closed => "closed",
        E::Missing => "missing",
        E::TooLong => "too_long",
        E::Invalid(_) => "invalid",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_trusted_list_trusts_every_peer_and_v4_mapped_peers_match_v4_cidrs() {
        let any = ProxyProtocol::default();
        assert!(any.trusts(&"192.0.2.1:1".parse().unwrap()));
        let lb = ProxyProtocol {
            trusted: vec!["10.0.0.0/8".parse().unwrap()],
        };
        assert!(lb.trusts(&"10.1.2.3:1".parse().unwrap()));
        assert!(lb.trusts(&"[::ffff:10.1.2.3]:1".parse().unwrap()));
        assert!(!lb.trusts(&"192.0.2.1:1".parse().unwrap()));
    }
}
