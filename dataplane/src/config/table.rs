//! A snapshot compiled for serving: the router index plus the routes' upstreams, built off
//! the request path and swapped in whole.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_proto::v1;

use crate::plugins::{self, BuildCtx, ConsumerTable, PluginChain, PluginState};
use crate::router::{InvalidRoute, Router};
use crate::upstream::{InvalidUpstream, PoolRegistry, Timeouts, Upstream, WeightedSequence};

/// Why a snapshot could not be compiled. The snapshot is then rejected whole and the
/// previous one keeps serving.
#[derive(Debug, thiserror::Error)]
pub enum InvalidSnapshot {
    /// A route's match rules are invalid.
    #[error(transparent)]
    Route(#[from] InvalidRoute),
    /// A route names an upstream the snapshot does not carry.
    #[error("route {route}: backends[{index}].upstream_id: unknown upstream `{upstream}`")]
    UnknownUpstream {
        /// Route id.
        route: String,
        /// Index in `backends`.
        index: usize,
        /// The missing upstream id.
        upstream: String,
    },
    /// A server certificate is invalid.
    #[error(transparent)]
    Tls(#[from] crate::config::certs::InvalidTlsCertificate),
    /// A route has no backend with a non-zero weight.
    #[error("route {0}: backends: no backend with a non-zero weight")]
    NoBackend(String),
    /// A plugin of a route, global rule or consumer is unknown or misconfigured.
    #[error("{owner}: {error}")]
    Plugin {
        /// Route id, `global rule <id>` or `consumer <name>`.
        owner: String,
        /// What is wrong (names the plugin and field).
        error: sluice_plugin_config::ConfigError,
    },
    /// An upstream's TLS settings are unusable.
    #[error("upstream {upstream}: {source}")]
    UpstreamTls {
        /// Upstream id.
        upstream: String,
        /// What is wrong.
        source: crate::upstream::tls::InvalidUpstreamTls,
    },
    /// An upstream's settings are invalid.
    #[error(transparent)]
    Upstream(#[from] InvalidUpstream),
    /// An endpoint is malformed.
    #[error("upstream {upstream}: endpoints[{index}]: {reason}")]
    Endpoint {
        /// Upstream id.
        upstream: String,
        /// Index in `endpoints`.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A per-Gateway listener is invalid, or a route names a listener the snapshot does
    /// not carry.
    #[error("{owner}: {field}: {reason}")]
    Listener {
        /// `listener <id>` or `route <id>`.
        owner: String,
        /// Offending field.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

/// One per-Gateway port of a snapshot (`Snapshot.listeners`): its own routes and
/// certificates.
#[derive(Debug)]
pub struct ListenerTable {
    /// `<namespace>/<gateway>/<port>`, `.../<port>/udp` for a UDP one sharing a port number,
    /// or `stream/{tcp,udp,tls}/<port>` for the fleet-wide stream ports.
    pub id: String,
    /// Port the dataplane listens on.
    pub port: u16,
    /// Whether TLS is terminated on it (HTTP listeners only).
    pub tls: bool,
    /// What it speaks.
    pub kind: crate::config::stream::ListenerKind,
    /// Whether every connection must start with a PROXY protocol header.
    pub accept_proxy_protocol: bool,
    /// Peers allowed to send that header; empty = any.
    pub proxy_protocol_trusted: Vec<ipnet::IpNet>,
    /// Its stream routes (TCP, UDP and TLS listeners).
    pub streams: crate::config::stream::ListenerStreams,
    /// Index of the routes served on it (indexes of [`RouteTable::routes`]).
    pub router: Router,
    /// Its certificates (empty unless `tls`).
    pub certs: crate::config::certs::TlsTable,
}

/// A route ready to serve.
#[derive(Debug)]
pub struct CompiledRoute {
    /// Stable route id (`namespace/name/rule`).
    pub id: String,
    /// Upstreams of the weighted split.
    pub backends: Vec<Arc<Upstream>>,
    split: Option<WeightedSequence>,
    /// Timeouts of the route.
    pub timeouts: Timeouts,
    /// Whether WebSocket upgrades are allowed.
    pub websocket: bool,
    /// Global rules' and the route's plugins; `None` when there are none (fast path).
    pub plugins: Option<Arc<PluginChain>>,
}

impl CompiledRoute {
    /// The upstream for the next request, by the route's weighted split.
    #[inline]
    pub fn pick_backend(&self) -> Option<&Arc<Upstream>> {
        match self.backends.len() {
            1 => self.backends.first(),
            _ => self.backends.get(self.split.as_ref()?.next()),
        }
    }
}

/// An immutable routing table built from one snapshot.
#[derive(Debug)]
pub struct RouteTable {
    /// Snapshot version.
    pub version: u64,
    /// Snapshot content hash.
    pub hash: String,
    /// The route index.
    pub router: Router,
    /// Routes in the order the router indexes them.
    pub routes: Vec<CompiledRoute>,
    /// Number of upstreams.
    pub upstream_count: usize,
    /// The snapshot's upstreams in snapshot order (by id), for `apisix_upstream_status`.
    pub upstreams: Vec<Arc<Upstream>>,
    /// Server certificates by SNI, for the HTTPS listener.
    pub tls: crate::config::certs::TlsTable,
    /// Per-Gateway ports, sorted by id.
    pub listeners: Vec<ListenerTable>,
    /// Every stream route by id (their listeners index them too).
    pub stream_routes: HashMap<String, Arc<crate::config::stream::CompiledStreamRoute>>,
}

fn duration_or(ms: u64, default: Duration) -> Duration {
    if ms == 0 {
        default
    } else {
        Duration::from_millis(ms)
    }
}

fn timeouts(t: Option<&v1::Timeouts>, base: Timeouts) -> Timeouts {
    match t {
        None => base,
        Some(t) => Timeouts {
            connect: duration_or(t.connect_ms, base.connect),
            send: duration_or(t.send_ms, base.send),
            read: duration_or(t.read_ms, base.read),
        },
    }
}

impl RouteTable {
    /// An empty table (nothing loaded yet): every request gets 404.
    pub fn empty() -> Result<Self, InvalidSnapshot> {
        Self::compile(&v1::Snapshot::default(), &PoolRegistry::default())
    }

    /// Validates and compiles `snapshot`. Connection pools are taken from `pools`, so
    /// endpoints that stay keep their warm connections.
    pub fn compile(snapshot: &v1::Snapshot, pools: &PoolRegistry) -> Result<Self, InvalidSnapshot> {
        Self::compile_with(snapshot, pools, &PluginState::default())
    }

    /// Like [`RouteTable::compile`], with plugin state (rate-limit counters, ...) that
    /// outlives this snapshot.
    pub fn compile_with(
        snapshot: &v1::Snapshot,
        pools: &PoolRegistry,
        plugin_state: &PluginState,
    ) -> Result<Self, InvalidSnapshot> {
        Self::compile_after(snapshot, pools, plugin_state, None)
    }

    /// Like [`RouteTable::compile_with`], replacing `previous`: stream routes that stay (by
    /// id) keep their drain token and limit-conn counters.
    pub fn compile_after(
        snapshot: &v1::Snapshot,
        pools: &PoolRegistry,
        plugin_state: &PluginState,
        previous: Option<&RouteTable>,
    ) -> Result<Self, InvalidSnapshot> {
        let consumers = ConsumerTable::build(&snapshot.consumers, plugin_state).map_err(|e| {
            InvalidSnapshot::Plugin {
                owner: format!("consumer {}", e.consumer),
                error: e.error,
            }
        })?;
        let mut global = Vec::new();
        for rule in &snapshot.global_rules {
            let owner = format!("global-rule:{}", rule.id);
            let cx = BuildCtx {
                owner: &owner,
                state: plugin_state,
                consumers: &consumers,
                upstreams: None,
            };
            let built = plugins::build_sorted(&rule.plugins, &cx).map_err(|error| {
                InvalidSnapshot::Plugin {
                    owner: format!("global rule {}", rule.id),
                    error,
                }
            })?;
            global.extend(built);
        }
        global.sort_by_key(|p| std::cmp::Reverse(p.priority()));
        let router = Router::new(&snapshot.routes)?;
        let mut listeners = compile_listeners(snapshot)?;
        let tls = crate::config::certs::TlsTable::compile_with_defaults(
            &snapshot.tls_certificates,
            snapshot.default_certificate.as_ref(),
            &snapshot.fallback_sni,
        )?;
        let mut upstreams: HashMap<&str, Arc<Upstream>> =
            HashMap::with_capacity(snapshot.upstreams.len());
        for up in &snapshot.upstreams {
            let mut endpoints = Vec::with_capacity(up.endpoints.len());
            for (index, ep) in up.endpoints.iter().enumerate() {
                if ep.host.is_empty() || ep.port == 0 || ep.port > u32::from(u16::MAX) {
                    return Err(InvalidSnapshot::Endpoint {
                        upstream: up.id.clone(),
                        index,
                        reason: format!("invalid address `{}:{}`", ep.host, ep.port),
                    });
                }
                let address = if ep.host.contains(':') {
                    format!("[{}]:{}", ep.host, ep.port)
                } else {
                    format!("{}:{}", ep.host, ep.port)
                };
                endpoints.push((address, ep.weight));
            }
            let t = up
                .timeout
                .as_ref()
                .map(|t| timeouts(Some(t), Timeouts::default()));
            let addresses: Vec<String> = endpoints.iter().map(|(a, _)| a.clone()).collect();
            let protocol = crate::upstream::protocol::UpstreamProtocol::compile(
                up,
                &addresses,
                &pools.protocols,
                pools.config(),
            )
            .map_err(|source| InvalidSnapshot::UpstreamTls {
                upstream: up.id.clone(),
                source,
            })?;
            upstreams.insert(
                &up.id,
                Arc::new(Upstream::compile(up, endpoints, t, pools)?.with_protocol(protocol)),
            );
        }
        let mut routes = Vec::with_capacity(snapshot.routes.len());
        for r in &snapshot.routes {
            let mut backends = Vec::with_capacity(r.backends.len());
            let mut weights = Vec::with_capacity(r.backends.len());
            for (index, b) in r.backends.iter().enumerate() {
                let up = upstreams.get(b.upstream_id.as_str()).ok_or_else(|| {
                    InvalidSnapshot::UnknownUpstream {
                        route: r.id.clone(),
                        index,
                        upstream: b.upstream_id.clone(),
                    }
                })?;
                if b.weight > 0 {
                    backends.push(Arc::clone(up));
                    weights.push(b.weight);
                }
                // NB: the HTTP path writes no PROXY header yet; an HTTP route must not
                // reach an upstream that expects one (it would take the request for garbage).
                if snapshot
                    .upstreams
                    .iter()
                    .any(|u| u.id == b.upstream_id && u.send_proxy_protocol != 0)
                {
                    return Err(InvalidSnapshot::Listener {
                        owner: format!("route {}", r.id),
                        field: format!("backends[{index}]"),
                        reason: format!(
                            "upstream `{}` has send_proxy_protocol, which only stream routes \
                             serve",
                            b.upstream_id
                        ),
                    });
                }
            }
            if backends.is_empty() {
                return Err(InvalidSnapshot::NoBackend(r.id.clone()));
            }
            let cx = BuildCtx {
                owner: &r.id,
                state: plugin_state,
                consumers: &consumers,
                upstreams: Some(&upstreams),
            };
            let route_plugins = plugins::build_sorted(&r.plugins, &cx).map_err(|error| {
                InvalidSnapshot::Plugin {
                    owner: format!("route {}", r.id),
                    error,
                }
            })?;
            let chain = PluginChain::new(r, global.clone(), route_plugins, Arc::clone(&consumers));
            routes.push(CompiledRoute {
                plugins: chain,
                id: r.id.clone(),
                split: WeightedSequence::new(&weights),
                backends,
                timeouts: timeouts(r.timeout.as_ref(), Timeouts::default()),
                websocket: r.websocket,
            });
        }
        let facts: Vec<crate::config::stream::ListenerFacts<'_>> = listeners
            .iter()
            .map(|l| crate::config::stream::ListenerFacts {
                id: &l.id,
                kind: l.kind,
                has_certs: !l.certs.is_empty(),
            })
            .collect();
        let (mut streams, stream_routes) = crate::config::stream::compile(
            snapshot,
            &facts,
            &upstreams,
            previous.map(|p| &p.stream_routes),
        )?;
        drop(facts);
        for l in &mut listeners {
            if let Some(s) = streams.remove(&l.id) {
                l.streams = s;
            }
        }
        pools.prune();
        Ok(RouteTable {
            version: snapshot.version,
            hash: snapshot.hash.clone(),
            router,
            routes,
            upstream_count: upstreams.len(),
            upstreams: snapshot
                .upstreams
                .iter()
                .filter_map(|u| upstreams.get(u.id.as_str()).cloned())
                .collect(),
            tls,
            listeners,
            stream_routes,
        })
    }

    /// Fires the drain token of every stream route of this table that `next` no longer
    /// carries (by id): their connections close after the stream drain timeout.
    pub fn cancel_removed_streams(&self, next: &RouteTable) {
        for (id, r) in &self.stream_routes {
            if !next.stream_routes.contains_key(id) {
                r.removed.cancel();
            }
        }
    }

    /// The per-Gateway listener `id`.
    pub fn listener(&self, id: &str) -> Option<&ListenerTable> {
        self.listeners
            .binary_search_by(|l| l.id.as_str().cmp(id))
            .ok()
            .and_then(|i| self.listeners.get(i))
    }

    /// The routes of a connection's listener: the dataplane's own (`None`) or a
    /// per-Gateway one; `None` when that listener is no longer in this table.
    pub fn router_for(&self, listener: Option<&str>) -> Option<&Router> {
        match listener {
            None => Some(&self.router),
            Some(id) => self.listener(id).map(|l| &l.router),
        }
    }

    /// The certificates of a connection's listener (see [`RouteTable::router_for`]).
    pub fn tls_for(&self, listener: Option<&str>) -> Option<&crate::config::certs::TlsTable> {
        match listener {
            None => Some(&self.tls),
            Some(id) => self.listener(id).map(|l| &l.certs),
        }
    }
}

/// Validates and compiles `snapshot.listeners`, and checks that every route's
/// `listeners` names one of them.
fn compile_listeners(snapshot: &v1::Snapshot) -> Result<Vec<ListenerTable>, InvalidSnapshot> {
    let mut out: Vec<ListenerTable> = Vec::with_capacity(snapshot.listeners.len());
    for l in &snapshot.listeners {
        let fail = |field: &str, reason: String| InvalidSnapshot::Listener {
            owner: format!("listener {}", l.id),
            field: field.to_owned(),
            reason,
        };
        if l.id.is_empty() {
            return Err(fail("id", "empty".into()));
        }
        let port = u16::try_from(l.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| fail("port", format!("{} is not a TCP port", l.port)))?;
        use crate::config::stream::ListenerKind;
        let kind = ListenerKind::from_proto(l.protocol)
            .ok_or_else(|| fail("protocol", format!("unknown value {}", l.protocol)))?;
        // A UDP port may share its number with a TCP one (another transport).
        let udp = kind == ListenerKind::Udp;
        if let Some(other) = out
            .iter()
            .find(|o| o.id == l.id || (o.port == port && (o.kind == ListenerKind::Udp) == udp))
        {
            return Err(fail(
                "port",
                format!("listener {} has the same id or port {port}", other.id),
            ));
        }
        // NB: PROXY protocol is read on stream listeners only so far; an HTTP listener that
        // asks for it is refused rather than served without it.
        if l.accept_proxy_protocol && kind == ListenerKind::Http {
            return Err(fail(
                "accept_proxy_protocol",
                "PROXY protocol on HTTP listeners is not served by this dataplane".into(),
            ));
        }
        if l.accept_proxy_protocol && udp {
            return Err(fail(
                "accept_proxy_protocol",
                "PROXY protocol is for TCP listeners".into(),
            ));
        }
        let mut trusted = Vec::with_capacity(l.proxy_protocol_trusted.len());
        for (i, c) in l.proxy_protocol_trusted.iter().enumerate() {
            let net = c
                .parse::<ipnet::IpNet>()
                .or_else(|_| c.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| {
                    fail(
                        &format!("proxy_protocol_trusted[{i}]"),
                        format!("{c:?} is not an IP address or CIDR"),
                    )
                })?;
            trusted.push(net);
        }
        let has_certs = !l.tls_certificates.is_empty() || l.default_certificate.is_some();
        match kind {
            ListenerKind::Http if !l.tls && has_certs => {
                return Err(fail(
                    "tls_certificates",
                    "certificates on a listener without TLS".into(),
                ));
            }
            ListenerKind::Tcp | ListenerKind::Udp if l.tls || has_certs => {
                return Err(fail(
                    "tls",
                    format!("TLS on a {kind:?} listener (use protocol TLS)"),
                ));
            }
            _ => {}
        }
        let id = l.id.clone();
        let router = Router::scoped(&snapshot.routes, |r| r.listeners.contains(&id))?;
        let certs = crate::config::certs::TlsTable::compile_with_defaults(
            &l.tls_certificates,
            l.default_certificate.as_ref(),
            "",
        )?;
        out.push(ListenerTable {
            id,
            port,
            tls: l.tls && kind == ListenerKind::Http,
            kind,
            accept_proxy_protocol: l.accept_proxy_protocol,
            proxy_protocol_trusted: trusted,
            streams: Default::default(),
            router,
            certs,
        });
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    for r in &snapshot.routes {
        for (i, id) in r.listeners.iter().enumerate() {
            let reason = match out.binary_search_by(|l| l.id.as_str().cmp(id)) {
                Err(_) => format!("unknown listener `{id}`"),
                Ok(k) if out[k].kind.is_stream() => {
                    format!("listener `{id}` is a {:?} listener", out[k].kind)
                }
                Ok(_) => continue,
            };
            return Err(InvalidSnapshot::Listener {
                owner: format!("route {}", r.id),
                field: format!("listeners[{i}]"),
                reason,
            });
        }
    }
    Ok(out)
}
