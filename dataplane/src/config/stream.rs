//! Layer-4 routes of a snapshot (`Snapshot.stream_routes`), compiled: each listener with
//! protocol TCP, UDP or TLS gets a [`StreamRouter`] over its routes, and each route its
//! weighted backends, stream plugins and idle timeout.
//!
//! Rules checked here (a snapshot that breaks one is refused whole):
//! - A stream route names at least one listener, each a TCP, UDP or TLS one; an HTTP route
//!   never names those.
//! - `tls` is PASSTHROUGH or TERMINATE on TLS listeners, NONE elsewhere; `hosts` only on TLS
//!   listeners. TERMINATE needs a certificate on the listener.
//! - At least one backend with a non-zero weight; upstream ids exist.
//!
//! A connection holds its route's `Arc`, never the table. When a snapshot drops a route
//! (by id), its [`CompiledStreamRoute::removed`] token fires, and its connections close
//! after the stream drain timeout; a route that stays keeps its token across snapshots.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_proto::v1;
use tokio_util::sync::CancellationToken;

use crate::plugins::stream::StreamPlugins;
use crate::router::stream::{StreamMatch, StreamRouter};
use crate::upstream::{Upstream, WeightedSequence};

use super::table::InvalidSnapshot;

/// Default idle timeout of a TCP or TLS stream connection (nginx `proxy_timeout`: 10 min).
pub const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Default idle timeout of a UDP session.
pub const UDP_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// What a listener speaks (`Listener.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ListenerKind {
    /// HTTP, or HTTPS when the listener has `tls`.
    Http,
    /// Raw TCP: the listener's stream route, bytes copied both ways.
    Tcp,
    /// UDP sessions.
    Udp,
    /// TLS on TCP, routed by SNI.
    Tls,
}

impl ListenerKind {
    /// From the wire enum; `None` for an unknown value.
    pub fn from_proto(p: i32) -> Option<Self> {
        match v1::ListenerProtocol::try_from(p).ok()? {
            v1::ListenerProtocol::Http => Some(ListenerKind::Http),
            v1::ListenerProtocol::Tcp => Some(ListenerKind::Tcp),
            v1::ListenerProtocol::Udp => Some(ListenerKind::Udp),
            v1::ListenerProtocol::Tls => Some(ListenerKind::Tls),
        }
    }

    /// Whether it carries stream routes.
    pub fn is_stream(self) -> bool {
        self != ListenerKind::Http
    }
}

/// How a stream route treats TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamMode {
    /// Plain TCP or UDP.
    Plain,
    /// The ClientHello and everything after go to the upstream untouched.
    Passthrough,
    /// TLS is terminated with the listener's certificates; the plaintext goes upstream.
    Terminate,
}

/// The PROXY protocol header an upstream wants first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendProxy {
    /// None.
    None,
    /// Version 1 (text).
    V1,
    /// Version 2 (binary).
    V2,
}

impl SendProxy {
    /// From the upstream's `send_proxy_protocol`.
    pub fn of(up: &v1::Upstream) -> Self {
        match up.send_proxy_protocol() {
            v1::ProxyProtocolVersion::ProxyProtocolNone => SendProxy::None,
            v1::ProxyProtocolVersion::ProxyProtocolV1 => SendProxy::V1,
            v1::ProxyProtocolVersion::ProxyProtocolV2 => SendProxy::V2,
        }
    }
}

/// One weighted backend of a stream route.
#[derive(Debug)]
pub struct StreamBackend {
    /// The upstream (endpoints, balancer, connect timeout, retries, health).
    pub upstream: Arc<Upstream>,
    /// Header to send it first.
    pub send_proxy: SendProxy,
}

/// A stream route ready to serve.
#[derive(Debug)]
pub struct CompiledStreamRoute {
    /// Stable id.
    pub id: String,
    /// What produced it, e.g. `TLSRoute default/db`.
    pub source: String,
    /// TLS treatment.
    pub mode: StreamMode,
    /// Backends with a non-zero weight.
    pub backends: Vec<StreamBackend>,
    split: Option<WeightedSequence>,
    /// ip-restriction, limit-conn.
    pub plugins: StreamPlugins,
    /// `idle_timeout_ms`; `None` = the listener's default ([`TCP_IDLE_TIMEOUT`],
    /// [`UDP_IDLE_TIMEOUT`]).
    pub idle_timeout: Option<Duration>,
    /// Fires when a snapshot no longer carries this route.
    pub removed: CancellationToken,
}

impl CompiledStreamRoute {
    /// The backend for the next connection (or UDP session), by weight.
    pub fn pick_backend(&self) -> Option<&StreamBackend> {
        match self.backends.len() {
            1 => self.backends.first(),
            _ => self.backends.get(self.split.as_ref()?.next()),
        }
    }

    /// The idle timeout on a listener of `kind`.
    pub fn idle_timeout_on(&self, kind: ListenerKind) -> Duration {
        self.idle_timeout.unwrap_or(match kind {
            ListenerKind::Udp => UDP_IDLE_TIMEOUT,
            _ => TCP_IDLE_TIMEOUT,
        })
    }
}

/// The stream routes of one listener.
#[derive(Debug, Default)]
pub struct ListenerStreams {
    /// Index over `routes`.
    pub router: StreamRouter,
    /// Routes in snapshot order (by id).
    pub routes: Vec<Arc<CompiledStreamRoute>>,
}

impl ListenerStreams {
    /// The route for a connection from `client` with `sni`.
    pub fn lookup(
        &self,
        sni: Option<&str>,
        client: std::net::IpAddr,
    ) -> Option<&Arc<CompiledStreamRoute>> {
        let (i, _) = self.router.lookup(sni, client)?;
        self.routes.get(i)
    }
}

/// Stream routes per listener id.
pub(super) type ByListener = HashMap<String, ListenerStreams>;
/// Stream routes by their id.
pub(super) type ById = HashMap<String, Arc<CompiledStreamRoute>>;

/// What [`compile`] needs to know of a listener.
pub(super) struct ListenerFacts<'a> {
    pub id: &'a str,
    pub kind: ListenerKind,
    pub has_certs: bool,
}

/// Compiles `snapshot.stream_routes` and returns, per listener id, its routes indexed.
/// `previous` is the table served before (tokens and limit-conn counters carry over).
pub(super) fn compile(
    snapshot: &v1::Snapshot,
    listeners: &[ListenerFacts<'_>],
    upstreams: &HashMap<&str, Arc<Upstream>>,
    previous: Option<&HashMap<String, Arc<CompiledStreamRoute>>>,
) -> Result<(ByListener, ById), InvalidSnapshot> {
    let mut by_listener: HashMap<String, (Vec<StreamMatch>, Vec<Arc<CompiledStreamRoute>>)> =
        HashMap::new();
    let mut all = HashMap::with_capacity(snapshot.stream_routes.len());
    let up_send: HashMap<&str, SendProxy> = snapshot
        .upstreams
        .iter()
        .map(|u| (u.id.as_str(), SendProxy::of(u)))
        .collect();
    for r in &snapshot.stream_routes {
        let fail = |field: String, reason: String| InvalidSnapshot::Listener {
            owner: format!("stream route {}", r.id),
            field,
            reason,
        };
        if r.id.is_empty() {
            return Err(fail("id".into(), "empty".into()));
        }
        if all.contains_key(&r.id) {
            return Err(fail("id".into(), "appears twice".into()));
        }
        if r.listeners.is_empty() {
            return Err(fail("listeners".into(), "empty".into()));
        }
        let mode = match r.tls() {
            v1::StreamTls::None => StreamMode::Plain,
            v1::StreamTls::Passthrough => StreamMode::Passthrough,
            v1::StreamTls::Terminate => StreamMode::Terminate,
        };
        for (i, id) in r.listeners.iter().enumerate() {
            let field = format!("listeners[{i}]");
            let Some(l) = listeners.iter().find(|l| l.id == id) else {
                return Err(fail(field, format!("unknown listener `{id}`")));
            };
            match (l.kind, mode) {
                (ListenerKind::Http, _) => {
                    return Err(fail(field, format!("listener `{id}` is an HTTP listener")));
                }
                (ListenerKind::Tls, StreamMode::Plain) => {
                    return Err(fail(
                        "tls".into(),
                        format!("must be PASSTHROUGH or TERMINATE on TLS listener `{id}`"),
                    ));
                }
                (ListenerKind::Tls, StreamMode::Terminate) if !l.has_certs => {
                    return Err(fail(
                        "tls".into(),
                        format!("TERMINATE on listener `{id}`, which has no certificate"),
                    ));
                }
                (ListenerKind::Tcp | ListenerKind::Udp, m) if m != StreamMode::Plain => {
                    return Err(fail(
                        "tls".into(),
                        format!("listener `{id}` is not a TLS listener"),
                    ));
                }
                (ListenerKind::Tcp | ListenerKind::Udp, _) if !r.hosts.is_empty() => {
                    return Err(fail(
                        "hosts".into(),
                        format!("listener `{id}` is not a TLS listener (no SNI)"),
                    ));
                }
                _ => {}
            }
        }
        let mut backends = Vec::with_capacity(r.backends.len());
        let mut weights = Vec::with_capacity(r.backends.len());
        for (index, b) in r.backends.iter().enumerate() {
            if !b.plugins.is_empty() {
                return Err(fail(
                    format!("backends[{index}].plugins"),
                    "per-backend plugins are HTTP only".into(),
                ));
            }
            let up = upstreams.get(b.upstream_id.as_str()).ok_or_else(|| {
                InvalidSnapshot::UnknownUpstream {
                    route: r.id.clone(),
                    index,
                    upstream: b.upstream_id.clone(),
                }
            })?;
            if b.weight > 0 {
                backends.push(StreamBackend {
                    upstream: Arc::clone(up),
                    send_proxy: up_send
                        .get(b.upstream_id.as_str())
                        .copied()
                        .unwrap_or(SendProxy::None),
                });
                weights.push(b.weight);
            }
        }
        if backends.is_empty() {
            return Err(InvalidSnapshot::NoBackend(r.id.clone()));
        }
        let before = previous.and_then(|p| p.get(&r.id));
        let plugins =
            StreamPlugins::build(&r.plugins, before.map(|b| &b.plugins)).map_err(|error| {
                InvalidSnapshot::Plugin {
                    owner: format!("stream route {}", r.id),
                    error,
                }
            })?;
        let route = Arc::new(CompiledStreamRoute {
            id: r.id.clone(),
            source: r.source.clone(),
            mode,
            split: WeightedSequence::new(&weights),
            backends,
            plugins,
            idle_timeout: (r.idle_timeout_ms > 0).then(|| Duration::from_millis(r.idle_timeout_ms)),
            removed: before.map(|b| b.removed.clone()).unwrap_or_default(),
        });
        let m = StreamMatch {
            id: r.id.clone(),
            hosts: r.hosts.clone(),
            remote_addrs: r.remote_addrs.clone(),
        };
        for id in &r.listeners {
            let e = by_listener.entry(id.clone()).or_default();
            e.0.push(m.clone());
            e.1.push(Arc::clone(&route));
        }
        all.insert(r.id.clone(), route);
    }
    let mut out = HashMap::with_capacity(by_listener.len());
    for (id, (matches, routes)) in by_listener {
        let router = StreamRouter::new(&matches).map_err(|e| InvalidSnapshot::Listener {
            owner: format!("stream route {}", e.route),
            field: e.field,
            reason: e.reason,
        })?;
        out.insert(id, ListenerStreams { router, routes });
    }
    Ok((out, all))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use sluice_proto::v1;

    use crate::config::table::RouteTable;
    use crate::upstream::PoolRegistry;

    fn listener(id: &str, port: u32, p: v1::ListenerProtocol) -> v1::Listener {
        v1::Listener {
            id: id.into(),
            port,
            protocol: p as i32,
            ..Default::default()
        }
    }

    fn route(id: &str, listener: &str, tls: v1::StreamTls, hosts: &[&str]) -> v1::StreamRoute {
        v1::StreamRoute {
            id: id.into(),
            listeners: vec![listener.into()],
            tls: tls as i32,
            hosts: hosts.iter().map(|s| s.to_string()).collect(),
            backends: vec![v1::Backend {
                upstream_id: "u".into(),
                weight: 1,
                plugins: Vec::new(),
            }],
            ..Default::default()
        }
    }

    fn compile(
        listeners: Vec<v1::Listener>,
        routes: Vec<v1::StreamRoute>,
    ) -> Result<RouteTable, String> {
        let snap = v1::Snapshot {
            listeners,
            stream_routes: routes,
            upstreams: vec![v1::Upstream {
                id: "u".into(),
                endpoints: vec![v1::Endpoint {
                    host: "127.0.0.1".into(),
                    port: 9,
                    weight: 1,
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        RouteTable::compile(&snap, &PoolRegistry::default()).map_err(|e| e.to_string())
    }

    use v1::ListenerProtocol::{Tcp, Tls, Udp};
    use v1::StreamTls::{None as Plain, Passthrough, Terminate};

    #[test]
    fn tcp_and_udp_share_a_port_number_but_two_tcp_do_not() {
        let t = compile(
            vec![listener("l/tcp", 53, Tcp), listener("l/53/udp", 53, Udp)],
            vec![
                route("a", "l/tcp", Plain, &[]),
                route("b", "l/53/udp", Plain, &[]),
            ],
        )
        .unwrap();
        assert_eq!(t.stream_routes.len(), 2);
        let e = compile(vec![listener("a", 53, Tcp), listener("b", 53, Tls)], vec![]).unwrap_err();
        assert!(e.contains("same id or port 53"), "{e}");
    }

    #[test]
    fn modes_hosts_and_listener_kinds_are_checked_with_the_field_named() {
        let cases = [
            (
                listener("l", 1, Tls),
                route("r", "l", Plain, &[]),
                "tls: must be PASSTHROUGH",
            ),
            (
                listener("l", 1, Tls),
                route("r", "l", Terminate, &[]),
                "which has no certificate",
            ),
            (
                listener("l", 1, Tcp),
                route("r", "l", Passthrough, &[]),
                "not a TLS listener",
            ),
            (
                listener("l", 1, Tcp),
                route("r", "l", Plain, &["a.com"]),
                "hosts:",
            ),
            (
                listener("l", 1, v1::ListenerProtocol::Http),
                route("r", "l", Plain, &[]),
                "is an HTTP listener",
            ),
            (
                listener("l", 1, Tcp),
                route("r", "x", Plain, &[]),
                "unknown listener `x`",
            ),
            (
                listener("l", 1, Tls),
                route("r", "l", Passthrough, &["a.*.com"]),
                "hosts[0]",
            ),
        ];
        for (l, r, want) in cases {
            let e = compile(vec![l], vec![r]).unwrap_err();
            assert!(
                e.starts_with("stream route r: ") && e.contains(want),
                "{e} / {want}"
            );
        }
    }

    #[test]
    fn a_route_that_stays_keeps_its_drain_token_and_one_that_goes_fires_it() {
        let l = vec![listener("l", 1, Tcp)];
        let first = compile(l.clone(), vec![route("r", "l", Plain, &[])]).unwrap();
        let snap = v1::Snapshot {
            listeners: l,
            stream_routes: vec![route("r", "l", Plain, &[])],
            upstreams: vec![v1::Upstream {
                id: "u".into(),
                endpoints: vec![v1::Endpoint {
                    host: "127.0.0.1".into(),
                    port: 9,
                    weight: 1,
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let pools = PoolRegistry::default();
        let state = crate::plugins::PluginState::default();
        let second = RouteTable::compile_after(&snap, &pools, &state, Some(&first)).unwrap();
        first.cancel_removed_streams(&second);
        let token = &second.stream_routes["r"].removed;
        assert!(!token.is_cancelled());
        let third = RouteTable::compile(&v1::Snapshot::default(), &pools).unwrap();
        second.cancel_removed_streams(&third);
        assert!(first.stream_routes["r"].removed.is_cancelled());
    }
}
