//! ApisixRoute `spec.stream[]` rules → snapshot stream routes on the fleet-wide stream
//! ports ([`crate::Options::stream_ports`]).
//!
//! - `match.ingressPort` must be a declared port of the rule's transport (`protocol: TCP` →
//!   a `tcp:` or `tls:` port, `UDP` → a `udp:` port), else the object is `Accepted=False`
//!   naming the port and the ports declared. APISIX likewise serves only the ports of its
//!   `stream_proxy` configuration.
//! - `match.host` (SNI) needs a `tls:` port: TLS is terminated there with the ApisixTls and
//!   Ingress certificates, as an APISIX `stream_proxy.tcp` entry with `tls: true` does
//!   (TLS passthrough is TLSRoute's). A rule without a host on a `tls:` port takes every SNI.
//! - `backend` resolves as an HTTP backend does (upstream `<ns>/<service>:<port>...`), so the
//!   ApisixUpstream of the Service applies its load balancer, retries (connect attempts),
//!   `timeout.connect` and health checks (use `type: tcp`); `timeout.read` becomes the
//!   stream's idle timeout. `scheme` is ignored, as in APISIX.
//! - Plugins: only the stream plugins `ip-restriction` and `limit-conn`, without their
//!   HTTP-only keys (a response code or body means nothing to a byte stream).
//! - One (port, host) is served by one rule: the oldest ApisixRoute (creationTimestamp, then
//!   namespace/name) keeps it; a later one is `Accepted=False` naming the holder.

use std::collections::BTreeMap;

use sluice_crds::{ApisixRoute, ApisixRouteStream, StreamProtocol};
use sluice_proto::v1;

use super::plugins;
use crate::Index;
use crate::options::{StreamPort, StreamPortProtocol};
use crate::problems::Problems;
use crate::upstream::{self, BackendRef, UpstreamObject};

/// Stream plugins and the keys of their configs that only HTTP has.
const STREAM_PLUGINS: &[(&str, &[&str])] = &[
    ("ip-restriction", &["message", "response_code"]),
    ("limit-conn", &["rejected_code", "rejected_msg"]),
];

/// What one ApisixRoute's stream rules contribute.
#[derive(Debug, Default)]
pub(crate) struct StreamOutput {
    pub(crate) routes: Vec<v1::StreamRoute>,
    pub(crate) upstreams: Vec<v1::Upstream>,
    /// (listener id, SNI host or "") each route serves, with the rule's field.
    pub(crate) claims: Vec<(String, String, String)>,
}

/// Who holds each (listener id, host) so far, oldest ApisixRoute first.
pub(crate) type Claims = BTreeMap<(String, String), String>;

/// Translates the `spec.stream[]` rules of one ApisixRoute; errors go to `problems`.
pub(crate) fn translate_rules(
    ar: &ApisixRoute,
    ns: &str,
    name: &str,
    idx: &Index<'_>,
    aus: &BTreeMap<(&str, &str), Result<UpstreamObject, ()>>,
    ports: &[StreamPort],
    problems: &mut Problems,
) -> StreamOutput {
    let mut out = StreamOutput::default();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, rule) in ar.spec.stream.iter().enumerate() {
        let field = format!("spec.stream[{i}]");
        if rule.name.is_empty() {
            problems.error(format!("{field}.name"), "must not be empty");
        } else if let Some(first) = seen.insert(&rule.name, i) {
            problems.error(
                format!("{field}.name"),
                format!(
                    "duplicate rule name {:?} (also spec.stream[{first}].name)",
                    rule.name
                ),
            );
        }
        // NB: an http rule and a stream rule may share a name: their ids differ.
        let before = problems.errors.len();
        let Some(port) = port_of(rule, &field, ports, problems) else {
            continue;
        };
        let host = host_of(rule, &field, port, problems);
        let plugins = stream_plugins(rule, ns, &field, idx, problems);
        let backend_field = format!("{field}.backend");
        let r = BackendRef {
            namespace: ns,
            service: &rule.backend.service_name,
            port: &rule.backend.service_port,
            granularity: rule.backend.resolve_granularity.unwrap_or_default(),
            subset: rule.backend.subset.as_deref(),
            field: &backend_field,
            field_names: ("serviceName", "servicePort"),
        };
        let up = upstream::service_upstream(&r, idx, aus, problems);
        let (Some(up), true) = (up, problems.errors.len() == before) else {
            continue;
        };
        let listener = port.listener_id();
        out.claims.push((
            listener.clone(),
            host.clone().unwrap_or_default(),
            field.clone(),
        ));
        out.routes.push(v1::StreamRoute {
            id: format!("{ns}/{name}/stream/{}", rule.name),
            source: format!("ApisixRoute {ns}/{name}"),
            listeners: vec![listener],
            hosts: host.into_iter().collect(),
            tls: if port.protocol == StreamPortProtocol::Tls {
                v1::StreamTls::Terminate as i32
            } else {
                v1::StreamTls::None as i32
            },
            remote_addrs: Vec::new(),
            backends: vec![v1::Backend {
                upstream_id: up.id.clone(),
                weight: 1,
                plugins: Vec::new(),
            }],
            plugins,
            idle_timeout_ms: up.timeout.as_ref().map_or(0, |t| t.read_ms),
        });
        out.upstreams.push(up);
    }
    out
}

/// Records `out`'s claims in `claims`, or, when one is held by an older ApisixRoute, an
/// error naming it (and nothing is claimed).
pub(crate) fn claim(out: &StreamOutput, owner: &str, claims: &mut Claims, problems: &mut Problems) {
    let mut mine = Claims::new();
    for (listener, host, field) in &out.claims {
        let key = (listener.clone(), host.clone());
        let holder = claims
            .get(&key)
            .cloned()
            .or_else(|| mine.get(&key).map(|f| format!("{owner} {f}")));
        if let Some(holder) = holder {
            let what = if host.is_empty() {
                "every connection".to_owned()
            } else {
                format!("SNI {host}")
            };
            problems.error(
                format!("{field}.match"),
                format!("{what} on stream port {listener} is already served by {holder}"),
            );
        } else {
            mine.insert(key, field.clone());
        }
    }
    if problems.is_valid() {
        for (key, field) in mine {
            claims.insert(key, format!("{owner} {field}"));
        }
    }
}

/// The declared port `match.ingressPort` names on the rule's transport.
fn port_of(
    rule: &ApisixRouteStream,
    field: &str,
    ports: &[StreamPort],
    problems: &mut Problems,
) -> Option<StreamPort> {
    let want_udp = rule.protocol == StreamProtocol::Udp;
    let found = ports.iter().find(|p| {
        i32::from(p.port) == rule.match_.ingress_port
            && (p.protocol == StreamPortProtocol::Udp) == want_udp
    });
    if found.is_none() {
        let declared: Vec<String> = ports
            .iter()
            .filter(|p| (p.protocol == StreamPortProtocol::Udp) == want_udp)
            .map(|p| format!("{}:{}", p.protocol.as_str(), p.port))
            .collect();
        let transport = if want_udp { "UDP" } else { "TCP" };
        problems.error(
            format!("{field}.match.ingressPort"),
            format!(
                "{} is not a declared {transport} stream port ({}: {})",
                rule.match_.ingress_port,
                crate::options::STREAM_PORTS_FLAG,
                if declared.is_empty() {
                    "none".to_owned()
                } else {
                    declared.join(",")
                }
            ),
        );
    }
    found.copied()
}

/// `match.host`, lower-cased; only on a `tls:` port.
fn host_of(
    rule: &ApisixRouteStream,
    field: &str,
    port: StreamPort,
    problems: &mut Problems,
) -> Option<String> {
    let h = rule.match_.host.as_deref().filter(|h| !h.is_empty())?;
    if port.protocol != StreamPortProtocol::Tls {
        problems.error(
            format!("{field}.match.host"),
            format!(
                "an SNI host needs a TLS stream port (tls:<port> in {}); {} is {}",
                crate::options::STREAM_PORTS_FLAG,
                port.port,
                port.protocol.as_str()
            ),
        );
        return None;
    }
    let h = h.to_ascii_lowercase();
    if let Err(e) = crate::validate::host(&h) {
        problems.error(format!("{field}.match.host"), e);
        return None;
    }
    Some(h)
}

/// The rule's plugins: stream ones only, validated as HTTP ones are, without HTTP-only keys.
fn stream_plugins(
    rule: &ApisixRouteStream,
    ns: &str,
    field: &str,
    idx: &Index<'_>,
    problems: &mut Problems,
) -> Vec<v1::Plugin> {
    let mut ok = true;
    for (j, p) in rule.plugins.iter().enumerate() {
        let f = format!("{field}.plugins[{j}]");
        let Some((_, http_only)) = STREAM_PLUGINS.iter().find(|(n, _)| *n == p.name) else {
            let names: Vec<&str> = STREAM_PLUGINS.iter().map(|(n, _)| *n).collect();
            problems.error(
                format!("{f}.name"),
                format!("{:?} is not a stream plugin ({})", p.name, names.join(", ")),
            );
            ok = false;
            continue;
        };
        if let Some(config) = &p.config {
            for key in http_only.iter().filter(|k| config.contains_key(**k)) {
                problems.error(
                    format!("{f}.config.{key}"),
                    format!(
                        "only applies to HTTP; {} on a stream closes the connection",
                        p.name
                    ),
                );
                ok = false;
            }
        }
    }
    if !ok {
        return Vec::new();
    }
    plugins::plugin_list(
        &rule.plugins,
        ns,
        &format!("{field}.plugins"),
        &idx.secrets,
        plugins::Owner::Route,
        problems,
    )
}

/// The listeners of the declared stream ports, `tls:` ones with the certificates the stream
/// routes on them need: those covering their SNI hosts (every one when a route takes any
/// SNI), and the default certificate.
pub(crate) fn listeners(
    ports: &[StreamPort],
    routes: &BTreeMap<String, v1::StreamRoute>,
    certificates: &[v1::TlsCertificate],
    default_certificate: Option<&v1::TlsCertificate>,
) -> Vec<v1::Listener> {
    let mut out = Vec::new();
    for p in ports {
        let id = p.listener_id();
        let (protocol, tls) = match p.protocol {
            StreamPortProtocol::Tcp => (v1::ListenerProtocol::Tcp, false),
            StreamPortProtocol::Udp => (v1::ListenerProtocol::Udp, false),
            StreamPortProtocol::Tls => (v1::ListenerProtocol::Tls, true),
        };
        let mut l = v1::Listener {
            id: id.clone(),
            source: format!(
                "{} {}",
                crate::options::STREAM_PORTS_FLAG,
                p.protocol.as_str()
            ),
            port: u32::from(p.port),
            tls,
            protocol: protocol as i32,
            ..Default::default()
        };
        if tls {
            let on_port: Vec<&v1::StreamRoute> = routes
                .values()
                .filter(|r| r.listeners.contains(&id))
                .collect();
            let any_sni = on_port.iter().any(|r| r.hosts.is_empty());
            l.tls_certificates = certificates
                .iter()
                .filter(|c| {
                    any_sni
                        || on_port
                            .iter()
                            .flat_map(|r| &r.hosts)
                            .any(|h| c.hosts.iter().any(|ch| covers(ch, h)))
                })
                .cloned()
                .collect();
            l.default_certificate = default_certificate.cloned();
        }
        out.push(l);
    }
    out
}

/// Whether certificate host `cert` (exact or `*.suffix`, one label) serves SNI `host`.
fn covers(cert: &str, host: &str) -> bool {
    if cert == host {
        return true;
    }
    match (cert.strip_prefix("*."), host.split_once('.')) {
        (Some(suffix), Some((_, rest))) => rest == suffix,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::covers;

    #[test]
    fn certificate_cover() {
        assert!(covers("a.com", "a.com"));
        assert!(covers("*.a.com", "x.a.com"));
        assert!(covers("*.a.com", "*.a.com"));
        assert!(!covers("*.a.com", "y.x.a.com"));
        assert!(!covers("*.a.com", "a.com"));
        assert!(!covers("b.com", "a.com"));
    }
}
