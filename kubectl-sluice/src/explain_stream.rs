//! `explain` for a layer-4 connection (`tcp://[HOST]:PORT`, `tls://SNI:PORT`,
//! `udp://[HOST]:PORT`): which listener takes it, which stream route the dataplane's own
//! [`StreamRouter`] picks for its SNI and client address, what the stream plugins decide
//! (the dataplane's [`StreamPlugins`] run on it), how TLS is treated, and the weighted
//! backends with their endpoints.
//!
//! The port is the one the dataplane listens on (`Listener.port`: a `--stream-ports` port,
//! or a per-Gateway port); a Gateway's own port number is accepted too when exactly one
//! Gateway listener has it (`--listener ID` picks one otherwise).

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use serde::Serialize;
use sluice_dataplane::config::stream::{ListenerKind, StreamMode};
use sluice_dataplane::config::table::{ListenerTable, RouteTable};
use sluice_dataplane::plugins::stream::Verdict;
use sluice_dataplane::router::stream::{MatchedBy, StreamMatch, StreamRouter};
use sluice_proto::v1;

use crate::explain::{
    Context, EndpointView, MAX_CANDIDATES, PluginView, RequestError, endpoint_views, para,
    plugin_config, plugin_note,
};

/// A layer-4 connection to explain.
#[derive(Debug, Clone)]
pub struct Connection {
    /// UDP (else TCP, plain or TLS: the listener says which).
    pub udp: bool,
    /// Whether the URL said `tls://`.
    pub tls: bool,
    /// The port connected to.
    pub port: u16,
    /// The ClientHello's server name (TLS listeners).
    pub sni: Option<String>,
    /// Client address the dataplane sees.
    pub client_ip: IpAddr,
    /// `--listener ID`: the listener, when the port does not say.
    pub listener: Option<String>,
}

impl Connection {
    /// A connection from `explain`'s arguments when `url` is `tcp://`, `tls://` or
    /// `udp://`; `None` for any other URL (an HTTP request). A `tls://` URL's host is the
    /// SNI unless `sni` is given.
    pub fn parse(
        url: &str,
        sni: Option<String>,
        client_ip: IpAddr,
        listener: Option<String>,
    ) -> Result<Option<Self>, RequestError> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Ok(None);
        };
        let scheme = scheme.to_ascii_lowercase();
        if !matches!(scheme.as_str(), "tcp" | "tls" | "udp") {
            return Ok(None);
        }
        let bad = |why: &str| RequestError::Url(url.into(), why.into());
        let rest = rest.trim_end_matches('/');
        let (host, port) = rest.rsplit_once(':').unwrap_or(("", rest));
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| bad("a stream URL needs a port: tls://SNI:PORT, tcp://:PORT"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let tls = scheme == "tls";
        let sni = sni.or_else(|| (tls && !host.is_empty()).then(|| host.to_owned()));
        Ok(Some(Connection {
            udp: scheme == "udp",
            tls,
            port,
            sni,
            client_ip,
            listener,
        }))
    }

    fn describe(&self) -> String {
        let transport = match (self.udp, self.tls) {
            (true, _) => "UDP",
            (false, true) => "TLS",
            (false, false) => "TCP",
        };
        let sni = match (&self.sni, self.udp) {
            (Some(s), false) => format!(" (SNI {s})"),
            (None, false) if self.tls => " (no SNI)".to_owned(),
            _ => String::new(),
        };
        format!(
            "{transport} connection to port {}{sni} from {}",
            self.port, self.client_ip
        )
    }
}

/// The listener that takes the connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerView {
    /// `stream/tcp/9100`, `<ns>/<gateway>/<port>`.
    pub id: String,
    /// The object or flag that produced it.
    pub source: String,
    /// `TCP`, `TLS`, `UDP` or `HTTP`.
    pub protocol: String,
    /// The port the dataplanes listen on (a Gateway's Service targets it).
    pub port: u16,
    /// Whether connections must start with a PROXY header, and from which peers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<String>,
}

/// A stream route considered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamRouteView {
    /// Route id.
    pub id: String,
    /// The object that produced it (`TLSRoute default/db`).
    pub source: String,
    /// Why it matched (the winner) or did not.
    pub why: String,
}

/// A backend of the chosen route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamUpstreamView {
    /// Upstream id.
    pub id: String,
    /// Weight in the route's split.
    pub weight: u32,
    /// The PROXY header sent to it first, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<String>,
    /// Endpoints; empty = the connection is closed.
    pub endpoints: Vec<EndpointView>,
}

/// The result of `explain` for a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamExplanation {
    /// What was explained: files, a dataplane's snapshot, or the cluster's objects.
    pub source: String,
    /// `TLS connection to port 9443 (SNI db.example.com) from 192.0.2.1`.
    pub request: String,
    /// The listener; `None`: nothing listens there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listener: Option<ListenerView>,
    /// The winning route; `None`: the connection is closed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matched: Option<StreamRouteView>,
    /// The listener's other routes, with why each did not win.
    pub not_matched: Vec<StreamRouteView>,
    /// How TLS is treated (TLS listeners).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<String>,
    /// Stream plugins in execution order.
    pub plugins: Vec<PluginView>,
    /// What the stream plugins decide for this client.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// Backends of the winning route.
    pub upstreams: Vec<StreamUpstreamView>,
    /// Idle timeout of the connection (UDP: of the session).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    /// What happens to the connection, in one line.
    pub outcome: String,
}

fn kind_text(k: ListenerKind, tls: bool) -> &'static str {
    match k {
        ListenerKind::Http if tls => "HTTPS",
        ListenerKind::Http => "HTTP",
        ListenerKind::Tcp => "TCP",
        ListenerKind::Tls => "TLS",
        ListenerKind::Udp => "UDP",
    }
}

/// The listener for `c`, or why there is none.
fn find_listener<'a>(table: &'a RouteTable, c: &Connection) -> Result<&'a ListenerTable, String> {
    if let Some(id) = &c.listener {
        return table
            .listener(id)
            .ok_or_else(|| format!("no listener {id:?} in the snapshot"));
    }
    let transport = if c.udp { "UDP" } else { "TCP" };
    let same_transport = |l: &&ListenerTable| (l.kind == ListenerKind::Udp) == c.udp;
    if let Some(l) = table
        .listeners
        .iter()
        .filter(same_transport)
        .find(|l| l.port == c.port)
    {
        return Ok(l);
    }
    // A Gateway's own port: `<ns>/<gateway>/<port>[/udp]`.
    let by_gateway_port: Vec<&ListenerTable> = table
        .listeners
        .iter()
        .filter(same_transport)
        .filter(|l| {
            let id = l.id.strip_suffix("/udp").unwrap_or(&l.id);
            !l.id.starts_with("stream/")
                && id.rsplit('/').next() == Some(c.port.to_string().as_str())
        })
        .collect();
    match by_gateway_port.as_slice() {
        [l] => Ok(l),
        [] => Err(format!(
            "no listener on {transport} port {}: the connection is refused",
            c.port
        )),
        many => Err(format!(
            "port {} is the Gateway port of several listeners ({}): pick one with --listener ID",
            c.port,
            many.iter()
                .map(|l| l.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The route's `*.suffix` host that covers `sni` most specifically.
fn wildcard_of(route: &v1::StreamRoute, sni: &str) -> String {
    let sni = sni.trim_end_matches('.').to_ascii_lowercase();
    route
        .hosts
        .iter()
        .filter_map(|h| h.strip_prefix("*."))
        .filter(|suffix| sni.ends_with(&format!(".{}", suffix.to_ascii_lowercase())))
        .max_by_key(|s| s.len())
        .map(|s| format!("*.{s}"))
        .unwrap_or_else(|| "a wildcard".into())
}

fn remote_text(route: &v1::StreamRoute, client: IpAddr) -> String {
    if route.remote_addrs.is_empty() {
        "remoteAddrs: any client".into()
    } else {
        format!(
            "client {client} in remoteAddrs [{}]",
            route.remote_addrs.join(", ")
        )
    }
}

fn matcher(route: &v1::StreamRoute, with_remote: bool) -> StreamMatch {
    StreamMatch {
        id: route.id.clone(),
        hosts: route.hosts.clone(),
        remote_addrs: if with_remote {
            route.remote_addrs.clone()
        } else {
            Vec::new()
        },
    }
}

/// Why `route` did not win for `sni`/`client`, asked of the dataplane's router with that
/// route alone (with and without its remoteAddrs).
fn lost_because(
    route: &v1::StreamRoute,
    sni: Option<&str>,
    client: IpAddr,
    winner: Option<&str>,
) -> String {
    let alone = |with_remote| {
        StreamRouter::new(&[matcher(route, with_remote)])
            .ok()
            .and_then(|r| r.lookup(sni, client))
            .is_some()
    };
    if alone(true) {
        return match winner {
            Some(w) => format!(
                "matches too, but {w} comes first (a more specific SNI match, or the same \
                 and earlier by id)"
            ),
            None => "matches".into(),
        };
    }
    if alone(false) {
        return format!(
            "client {client} not in remoteAddrs [{}]",
            route.remote_addrs.join(", ")
        );
    }
    match sni {
        Some(sni) => format!("hosts [{}] do not cover SNI {sni}", route.hosts.join(", ")),
        None => format!(
            "hosts [{}]: a connection without SNI reaches only routes without hosts",
            route.hosts.join(", ")
        ),
    }
}

/// Explains the connection `c` against a compiled table and the snapshot it was compiled
/// from.
pub fn explain(
    table: &RouteTable,
    snapshot: &v1::Snapshot,
    c: &Connection,
    cx: &Context,
) -> StreamExplanation {
    let mut ex = StreamExplanation {
        source: cx.source.clone(),
        request: c.describe(),
        listener: None,
        matched: None,
        not_matched: Vec::new(),
        tls: None,
        plugins: Vec::new(),
        verdict: None,
        upstreams: Vec::new(),
        idle_timeout: None,
        outcome: String::new(),
    };
    let l = match find_listener(table, c) {
        Ok(l) => l,
        Err(why) => {
            ex.outcome = why;
            return ex;
        }
    };
    let source = snapshot
        .listeners
        .iter()
        .find(|s| s.id == l.id)
        .map(|s| s.source.clone())
        .unwrap_or_default();
    ex.listener = Some(ListenerView {
        id: l.id.clone(),
        source,
        protocol: kind_text(l.kind, l.tls).into(),
        port: l.port,
        proxy_protocol: l.accept_proxy_protocol.then(|| {
            if l.proxy_protocol_trusted.is_empty() {
                "required, from any peer".to_owned()
            } else {
                let nets: Vec<String> = l
                    .proxy_protocol_trusted
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                format!("required, from {}", nets.join(", "))
            }
        }),
    });
    if !l.kind.is_stream() {
        ex.outcome = format!(
            "an {} listener: explain an http{}:// URL instead",
            kind_text(l.kind, l.tls),
            if l.tls { "s" } else { "" }
        );
        return ex;
    }
    // NB: the SNI counts on TLS listeners only; elsewhere no ClientHello is read.
    let sni = (l.kind == ListenerKind::Tls)
        .then_some(c.sni.as_deref())
        .flatten();
    let routes_of = |id: &str| snapshot.stream_routes.iter().find(|r| r.id == id);
    let found = l
        .streams
        .router
        .lookup(sni, c.client_ip)
        .and_then(|(i, by)| Some((l.streams.routes.get(i)?, by)));
    let winner_id = found.map(|(r, _)| r.id.clone());
    for r in &l.streams.routes {
        if Some(&r.id) == winner_id.as_ref() {
            continue;
        }
        let Some(v) = routes_of(&r.id) else { continue };
        ex.not_matched.push(StreamRouteView {
            id: r.id.clone(),
            source: r.source.clone(),
            why: lost_because(v, sni, c.client_ip, winner_id.as_deref()),
        });
    }
    let Some((route, by)) = found else {
        ex.outcome = match (l.kind, sni) {
            (ListenerKind::Tls, None) => "no route for a ClientHello without SNI: the \
                                          connection is closed"
                .into(),
            (ListenerKind::Tls, Some(s)) => {
                format!("no route for SNI {s}: the connection is closed")
            }
            _ => format!(
                "no route admits client {}: the connection is closed",
                c.client_ip
            ),
        };
        return ex;
    };
    let Some(v) = routes_of(&route.id) else {
        ex.outcome = "the route is not in the snapshot".into();
        return ex;
    };
    let sni_text = match (by, sni) {
        (MatchedBy::Exact, Some(s)) => format!("exact SNI {s}"),
        (MatchedBy::Wildcard, Some(s)) => format!("SNI {s} under {}", wildcard_of(v, s)),
        _ if l.kind == ListenerKind::Tls => "no hosts (any SNI)".to_owned(),
        _ => "the listener's route".to_owned(),
    };
    ex.matched = Some(StreamRouteView {
        id: route.id.clone(),
        source: route.source.clone(),
        why: format!("{sni_text}; {}", remote_text(v, c.client_ip)),
    });
    ex.tls = match route.mode {
        StreamMode::Plain if c.tls && l.kind != ListenerKind::Tls => Some(format!(
            "none: a {} listener copies the bytes as they come (the backend sees the \
             ClientHello)",
            kind_text(l.kind, false)
        )),
        StreamMode::Plain => None,
        StreamMode::Passthrough => Some(
            "passthrough: the encrypted bytes go to the backend untouched (the client \
             checks the backend's own certificate)"
                .into(),
        ),
        StreamMode::Terminate => Some(match l.certs.select(sni) {
            Some(cert) => format!(
                "terminated with certificate {} (no ALPN); the backend gets plain bytes",
                cert.id
            ),
            None => "terminate, but no certificate covers this SNI: the handshake fails and \
                     the connection is closed"
                .into(),
        }),
    };
    // Stream plugins: APISIX's order, ip-restriction (3000) then limit-conn (1003).
    let mut names: Vec<(&str, i32)> = v
        .plugins
        .iter()
        .map(|p| {
            let priority = if p.name == "ip-restriction" {
                3000
            } else {
                1003
            };
            (p.name.as_str(), priority)
        })
        .collect();
    names.sort_by_key(|(_, p)| -p);
    for (name, priority) in names {
        let config = plugin_config(&v.plugins, name);
        ex.plugins.push(PluginView {
            name: name.into(),
            scope: "route".into(),
            priority,
            note: plugin_note(name, &config),
        });
    }
    let local = SocketAddr::new(IpAddr::from([0, 0, 0, 0]), l.port);
    let client = SocketAddr::new(c.client_ip, 50000);
    let denied = if route.plugins.is_empty() {
        None
    } else {
        // NB: the dataplane's own plugins on a copy of the table: limit-conn's counters
        // start empty, so only ip-restriction can refuse.
        let verdict = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .ok()
            .map(|rt| rt.block_on(route.plugins.on_connect(client, local)));
        let denied = match verdict {
            Some(Verdict::Deny(plugin)) => Some(plugin.to_owned()),
            _ => None,
        };
        ex.verdict = Some(match &denied {
            Some(p) => format!("refused by {p}: the connection is closed"),
            None => "allowed (limit-conn counts the connections open at the time)".into(),
        });
        denied
    };
    for b in &v.backends {
        let Some(up) = snapshot.upstreams.iter().find(|u| u.id == b.upstream_id) else {
            continue;
        };
        let proxy_protocol = match v1::ProxyProtocolVersion::try_from(up.send_proxy_protocol) {
            Ok(v1::ProxyProtocolVersion::ProxyProtocolV1) => Some("v1 header sent first"),
            Ok(v1::ProxyProtocolVersion::ProxyProtocolV2) => Some("v2 header sent first"),
            _ => None,
        };
        ex.upstreams.push(StreamUpstreamView {
            id: up.id.clone(),
            weight: b.weight,
            proxy_protocol: proxy_protocol.map(str::to_owned),
            endpoints: endpoint_views(up, cx),
        });
    }
    ex.idle_timeout = Some(format!("{}s", route.idle_timeout_on(l.kind).as_secs()));
    ex.outcome = match denied {
        Some(p) => format!("closed by {p}"),
        None if ex.upstreams.iter().all(|u| u.endpoints.is_empty()) => {
            "no endpoint: the connection is closed".into()
        }
        None => format!("proxied to {}", route.id),
    };
    ex
}

impl StreamExplanation {
    /// Text for an 80-column terminal.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        if !self.source.is_empty() {
            para(&mut out, "Source:   ", &self.source);
        }
        para(&mut out, "Request:  ", &self.request);
        if let Some(l) = &self.listener {
            let source = if l.source.is_empty() {
                String::new()
            } else {
                format!(" ({})", l.source)
            };
            para(
                &mut out,
                "Listener: ",
                &format!(
                    "{}{source}, {} on dataplane port {}",
                    l.id, l.protocol, l.port
                ),
            );
            if let Some(p) = &l.proxy_protocol {
                para(&mut out, "  PROXY:  ", p);
            }
        }
        if let Some(m) = &self.matched {
            para(&mut out, "Route:    ", &format!("{} ({})", m.id, m.source));
            para(&mut out, "  why:    ", &m.why);
        } else if self.listener.is_some() {
            para(&mut out, "Route:    ", "none");
        }
        if !self.not_matched.is_empty() {
            let _ = writeln!(out, "Other routes of the listener:");
            for c in self.not_matched.iter().take(MAX_CANDIDATES) {
                para(&mut out, "  ", &format!("{} ({})", c.id, c.source));
                para(&mut out, "    ", &c.why);
            }
            if self.not_matched.len() > MAX_CANDIDATES {
                let _ = writeln!(
                    out,
                    "  ... and {} more (-o yaml lists all)",
                    self.not_matched.len() - MAX_CANDIDATES
                );
            }
        }
        if let Some(t) = &self.tls {
            para(&mut out, "TLS:      ", t);
        }
        if self.matched.is_some() {
            if self.plugins.is_empty() {
                let _ = writeln!(out, "Plugins:  none");
            } else {
                let _ = writeln!(out, "Plugins (in execution order):");
                for (n, p) in self.plugins.iter().enumerate() {
                    para(
                        &mut out,
                        "  ",
                        &format!("{}. {} (priority {})", n + 1, p.name, p.priority),
                    );
                    if let Some(note) = &p.note {
                        para(&mut out, "     ", note);
                    }
                }
            }
            if let Some(v) = &self.verdict {
                para(&mut out, "Verdict:  ", v);
            }
            for u in &self.upstreams {
                let proxy = u
                    .proxy_protocol
                    .as_deref()
                    .map(|p| format!(", PROXY {p}"))
                    .unwrap_or_default();
                para(
                    &mut out,
                    "Upstream: ",
                    &format!("{} (weight {}{proxy})", u.id, u.weight),
                );
                if u.endpoints.is_empty() {
                    let _ = writeln!(out, "  no endpoints");
                }
                for e in &u.endpoints {
                    para(
                        &mut out,
                        "  ",
                        &format!("{} weight {}: {}", e.address, e.weight, e.health),
                    );
                }
            }
            if let Some(t) = &self.idle_timeout {
                para(
                    &mut out,
                    "Idle:     ",
                    &format!("closed after {t} without a byte"),
                );
            }
        }
        para(&mut out, "Outcome:  ", &self.outcome);
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn stream_urls_parse_and_others_are_left_to_http() {
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let c = Connection::parse("tls://db.example.com:9443", None, ip, None)
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.port, c.sni.as_deref(), c.udp),
            (9443, Some("db.example.com"), false)
        );
        let c = Connection::parse("tcp://:9100", Some("x".into()), ip, None)
            .unwrap()
            .unwrap();
        assert_eq!((c.port, c.sni.as_deref(), c.tls), (9100, Some("x"), false));
        let c = Connection::parse("UDP://9200", None, ip, None)
            .unwrap()
            .unwrap();
        assert!(c.udp && c.port == 9200);
        assert!(
            Connection::parse("http://a/b", None, ip, None)
                .unwrap()
                .is_none()
        );
        assert!(
            Connection::parse("a.com/b", None, ip, None)
                .unwrap()
                .is_none()
        );
        assert!(Connection::parse("tcp://host", None, ip, None).is_err());
    }
}
