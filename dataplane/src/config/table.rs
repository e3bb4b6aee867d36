//! A snapshot compiled for serving: the router index plus the routes' upstreams, built off
//! the request path and swapped in whole.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_proto::v1;

use crate::plugins::{self, BuildCtx, ConsumerTable, Instance, PluginChain, PluginState};
use crate::router::{InvalidRoute, Router};
use crate::upstream::attempt::{AttemptPolicy, RetryPolicy, StatusCodes};
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
    /// A backend of a route has a plugin that cannot run per backend.
    #[error(
        "route {route}: backends[{index}].plugins: `{plugin}` cannot run per backend (only proxy-rewrite, response-rewrite)"
    )]
    BackendPlugin {
        /// Route id.
        route: String,
        /// Index in `backends`.
        index: usize,
        /// The plugin's name.
        plugin: String,
    },
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
    /// Its Gateway listeners (hostname isolation, misdirected requests); empty: `router`
    /// serves every host.
    pub sections: crate::config::sections::Sections,
}

/// The plugins of each backend of a route (`None` for a backend without any).
pub type BackendPlugins = Box<[Option<Arc<[Instance]>>]>;

/// A route ready to serve.
#[derive(Debug)]
pub struct CompiledRoute {
    /// Stable route id (`namespace/name/rule`).
    pub id: String,
    /// Upstreams of the weighted split.
    pub backends: Vec<Arc<Upstream>>,
    /// The plugins of each of `backends` (`Backend.plugins`); `None` when no backend has
    /// any.
    pub backend_plugins: Option<BackendPlugins>,
    split: Option<WeightedSequence>,
    /// Timeouts of the route.
    pub timeouts: Timeouts,
    /// The route's whole-request and per-attempt deadlines and retry policy (HTTPRoute
    /// `timeouts` and `retry`); `None` when it has none.
    pub policy: Option<Box<AttemptPolicy>>,
    /// Whether WebSocket upgrades are allowed.
    pub websocket: bool,
    /// Global rules' and the route's plugins; `None` when there are none (fast path).
    pub plugins: Option<Arc<PluginChain>>,
}

impl CompiledRoute {
    /// The upstream for the next request, by the route's weighted split.
    #[inline]
    pub fn pick_backend(&self) -> Option<&Arc<Upstream>> {
        self.pick_backend_at().map(|(_, up)| up)
    }

    /// Like [`CompiledRoute::pick_backend`], with the upstream's index in `backends`.
    #[inline]
    pub fn pick_backend_at(&self) -> Option<(usize, &Arc<Upstream>)> {
        let i = match self.backends.len() {
            1 => 0,
            _ => self.split.as_ref()?.next(),
        };
        self.backends.get(i).map(|up| (i, up))
    }

    /// The plugins of `backends[i]`, if it has any.
    #[inline]
    pub fn plugins_of_backend(&self, i: usize) -> Option<&Arc<[Instance]>> {
        self.backend_plugins.as_ref()?.get(i)?.as_ref()
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

/// The deadlines and retry policy of route `r`.
fn attempt_policy(r: &v1::Route) -> Result<Option<Box<AttemptPolicy>>, InvalidSnapshot> {
    let ms = |v: u64| (v > 0).then(|| Duration::from_millis(v));
    let t = r.timeout.as_ref();
    let retry = match &r.retry {
        None => None,
        Some(p) => Some(RetryPolicy {
            attempts: (p.attempts > 0).then_some(p.attempts),
            codes: StatusCodes::new(p.codes.iter().copied()).ok_or_else(|| {
                InvalidSnapshot::Listener {
                    owner: format!("route {}", r.id),
                    field: "retry.codes".into(),
                    reason: format!("{:?}: every code must be in 400-599", p.codes),
                }
            })?,
            backoff: Duration::from_millis(p.backoff_ms),
        }),
    };
    Ok(AttemptPolicy {
        request: t.and_then(|t| ms(t.request_ms)),
        attempt: t.and_then(|t| ms(t.attempt_ms)),
        retry,
    }
    .or_none()
    .map(Box::new))
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
            let cx = BuildCtx {
                owner: &r.id,
                state: plugin_state,
                consumers: &consumers,
                upstreams: Some(&upstreams),
            };
            let mut backends = Vec::with_capacity(r.backends.len());
            let mut weights = Vec::with_capacity(r.backends.len());
            let mut backend_plugins = Vec::new();
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
                    backend_plugins.push(compile_backend_plugins(r, index, b, &cx)?);
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
            let route_plugins = plugins::build_sorted(&r.plugins, &cx).map_err(|error| {
                InvalidSnapshot::Plugin {
                    owner: format!("route {}", r.id),
                    error,
                }
            })?;
            let chain = PluginChain::new(r, global.clone(), route_plugins, Arc::clone(&consumers));
            let backend_plugins = backend_plugins
                .iter()
                .any(Option::is_some)
                .then(|| backend_plugins.into_boxed_slice());
            routes.push(CompiledRoute {
                plugins: chain,
                backend_plugins,
                id: r.id.clone(),
                split: WeightedSequence::new(&weights),
                backends,
                timeouts: timeouts(r.timeout.as_ref(), Timeouts::default()),
                policy: attempt_policy(r)?,
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

    /// The routes of a connection's listener for a request's `host` (as sent): the
    /// dataplane's own (`None`) or a per-Gateway one, there those of the Gateway listener
    /// the host chooses ([`crate::config::sections`]); `None` when that listener is no
    /// longer in this table or no Gateway listener of it serves the host.
    pub fn router_for(&self, listener: Option<&str>, host: Option<&str>) -> Option<&Router> {
        match listener {
            None => Some(&self.router),
            Some(id) => {
                let l = self.listener(id)?;
                if l.sections.is_empty() {
                    return Some(&l.router);
                }
                match host.map(|h| crate::http::host::HostName::parse(h.as_bytes())) {
                    None => l.sections.router_for(None),
                    Some(Ok(h)) => l.sections.router_for(Some(h.as_str())),
                    // NB: not reached: the request path refused such a host already.
                    Some(Err(_)) => None,
                }
            }
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

/// Plugins a backend may have: those that only change the request's and the response's
/// headers (Gateway API `backendRefs[].filters`).
const BACKEND_PLUGINS: &[&str] = &["proxy-rewrite", "response-rewrite"];

/// The plugins of `backends[index]` of route `r`, sorted by priority; `None` for none.
fn compile_backend_plugins(
    r: &v1::Route,
    index: usize,
    b: &v1::Backend,
    cx: &BuildCtx<'_>,
) -> Result<Option<Arc<[Instance]>>, InvalidSnapshot> {
    if b.plugins.is_empty() {
        return Ok(None);
    }
    if let Some(p) = b
        .plugins
        .iter()
        .find(|p| !BACKEND_PLUGINS.contains(&p.name.as_str()))
    {
        return Err(InvalidSnapshot::BackendPlugin {
            route: r.id.clone(),
            index,
            plugin: p.name.clone(),
        });
    }
    let built = plugins::build_sorted(&b.plugins, cx).map_err(|error| InvalidSnapshot::Plugin {
        owner: format!("route {} backends[{index}]", r.id),
        error,
    })?;
    Ok(Some(Arc::from(built)))
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
        if !l.tls && l.client_validation.is_some() {
            return Err(fail(
                "client_validation",
                "client validation on a listener without TLS".into(),
            ));
        }
        let certs = crate::config::certs::TlsTable::compile_for_listener(
            &l.tls_certificates,
            l.default_certificate.as_ref(),
            l.client_validation.as_ref(),
        )?;
        let sections =
            crate::config::sections::Sections::compile(&l.id, &l.sections, &snapshot.routes)
                .map_err(|(field, reason)| fail(&field, reason))?;
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
            sections,
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
