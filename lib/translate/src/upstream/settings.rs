//! ApisixUpstream → the settings of the upstreams of its Service: load balancer, scheme,
//! retries, timeouts, `tlsSecret`, `loadbalancer.hashOn` ([`super::hash_on`]), `healthCheck`
//! ([`super::health_check`]) and `passHost` ([`super::pass_host`]), Service level and port
//! level (`portLevelSettings`), plus external nodes and subsets.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sluice_crds::{
    ApisixUpstream, ApisixUpstreamConfig, ApisixUpstreamExternalNode, ExternalNodeType,
    LoadBalancerType, UpstreamScheme, UpstreamTimeout, parse_duration,
};
use sluice_proto::v1;

use super::service::external_name_of;
use super::{hash_on, health_check, pass_host};
use crate::Index;
use crate::problems::Problems;
use crate::refs::{Referrer, Target};
use crate::status::REASON_BACKEND_NOT_FOUND;

/// Parses a duration field into milliseconds (rounded up, so `500us` is not the 0 that means
/// "default"). Zero is rejected, as APISIX does (`exclusiveMinimum: 0`).
pub(crate) fn duration_ms(raw: &str) -> Result<u64, String> {
    let d = parse_duration(raw).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err(format!("{raw:?} must be greater than 0"));
    }
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).map_err(|_| format!("{raw:?} is too large"))
}

/// Parses `timeout {connect, send, read}`; unset fields are `None`.
pub(crate) fn parse_timeout(
    t: &UpstreamTimeout,
    field: &str,
    problems: &mut Problems,
) -> [Option<u64>; 3] {
    let mut one = |name: &str, v: &Option<String>| {
        v.as_deref().and_then(|s| match duration_ms(s) {
            Ok(ms) => Some(ms),
            Err(e) => {
                problems.error(format!("{field}.{name}"), e);
                None
            }
        })
    };
    [
        one("connect", &t.connect),
        one("send", &t.send),
        one("read", &t.read),
    ]
}

/// Upstream settings of an ApisixUpstream (Service level or port level), validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Settings {
    lb: Option<LoadBalancerType>,
    scheme: Option<UpstreamScheme>,
    retries: Option<u32>,
    /// connect, send, read in ms.
    timeout: [Option<u64>; 3],
    /// `retryTimeout` in ms (0: disabled).
    retry_timeout: Option<u64>,
    /// `loadbalancer.hashOn` and `key`.
    hash: Option<(v1::UpstreamHashOn, String)>,
    /// `passHost` and `upstreamHost`.
    pass_host: Option<(v1::UpstreamPassHost, String)>,
    /// `healthCheck`, defaults filled in.
    health_check: Option<v1::UpstreamHealthCheck>,
    /// CA and client certificate from `tlsSecret`.
    tls: Option<v1::UpstreamTls>,
}

impl Settings {
    /// `from` is the object the settings are written in (its namespace is where
    /// `tlsSecret` may point without a ReferenceGrant).
    pub(super) fn parse(
        c: &ApisixUpstreamConfig,
        field: &str,
        from: Referrer<'_>,
        idx: &Index<'_>,
        problems: &mut Problems,
    ) -> Self {
        let retries = c.retries.and_then(|r| match u32::try_from(r) {
            Ok(r) => Some(r),
            Err(_) if r < 0 => {
                problems.error(
                    format!("{field}retries"),
                    format!("{r} must not be negative"),
                );
                None
            }
            Err(_) => {
                problems.error(format!("{field}retries"), format!("{r} is too large"));
                None
            }
        });
        let timeout = c
            .timeout
            .as_ref()
            .map(|t| parse_timeout(t, &format!("{field}timeout"), problems))
            .unwrap_or_default();
        let retry_timeout = c
            .retry_timeout
            .as_ref()
            .and_then(|t| retry_timeout(t, &format!("{field}retryTimeout"), problems));
        let hash = c
            .loadbalancer
            .as_ref()
            .and_then(|lb| hash_on::hash_on(lb, field, problems));
        let pass_host =
            pass_host::pass_host(c.pass_host, c.upstream_host.as_deref(), field, problems);
        let health_check = c
            .health_check
            .as_ref()
            .map(|hc| health_check::health_check(hc, field, problems));
        // NB: settings the snapshot cannot carry yet are listed in the Accepted message by the
        // caller rather than silently dropped.
        let tls = c.tls_secret.as_ref().and_then(|s| {
            // NB: an empty namespace means the object's own, as for ApisixTls.
            let ns = Some(s.namespace.as_str())
                .filter(|n| !n.is_empty())
                .unwrap_or(from.ns);
            if let Err(e) = idx.permit(from, Target::secret(ns, &s.name)) {
                problems.refused(format!("{field}tlsSecret"), e);
                return None;
            }
            tls_from_secret(idx, ns, &s.name)
                .map_err(|e| problems.error(format!("{field}tlsSecret"), e))
                .ok()
        });
        let tls = tls_verify(c, tls, field, problems);
        let https_probes = health_check
            .as_ref()
            .and_then(|h| h.active.as_ref())
            .is_some_and(|a| a.r#type() == v1::UpstreamHealthCheckType::Https);
        if tls.is_some()
            && !https_probes
            && matches!(
                c.scheme.unwrap_or_default(),
                UpstreamScheme::Http | UpstreamScheme::Grpc
            )
            && c.scheme.is_some()
        {
            problems.notes.push(format!(
                "{field}tlsSecret has no effect with scheme {}",
                if c.scheme == Some(UpstreamScheme::Grpc) {
                    "grpc"
                } else {
                    "http"
                }
            ));
        }
        Self {
            lb: c.loadbalancer.as_ref().map(|lb| lb.type_),
            scheme: c.scheme,
            retries,
            timeout,
            retry_timeout,
            hash,
            pass_host,
            health_check,
            tls,
        }
    }

    /// `self` with every field that `over` sets replaced.
    fn overlay(&self, over: &Self) -> Self {
        let t = |i: usize| over.timeout[i].or(self.timeout[i]);
        Self {
            lb: over.lb.or(self.lb),
            scheme: over.scheme.or(self.scheme),
            retries: over.retries.or(self.retries),
            timeout: [t(0), t(1), t(2)],
            retry_timeout: over.retry_timeout.or(self.retry_timeout),
            hash: over.hash.clone().or_else(|| self.hash.clone()),
            pass_host: over.pass_host.clone().or_else(|| self.pass_host.clone()),
            health_check: over
                .health_check
                .clone()
                .or_else(|| self.health_check.clone()),
            tls: over.tls.clone().or_else(|| self.tls.clone()),
        }
    }

    pub(super) fn apply(&self, up: &mut v1::Upstream) {
        up.load_balancer = match self.lb.unwrap_or_default() {
            LoadBalancerType::RoundRobin => v1::LoadBalancer::RoundRobin,
            LoadBalancerType::Chash => v1::LoadBalancer::Chash,
            LoadBalancerType::Ewma => v1::LoadBalancer::Ewma,
            LoadBalancerType::LeastConn => v1::LoadBalancer::LeastConn,
        } as i32;
        let scheme = self.scheme.unwrap_or_default();
        up.scheme = proto_scheme(scheme) as i32;
        // `https` health probes use the tlsSecret too, whatever the scheme of the traffic.
        let https_probes = self
            .health_check
            .as_ref()
            .and_then(|h| h.active.as_ref())
            .is_some_and(|a| a.r#type() == v1::UpstreamHealthCheckType::Https);
        up.tls = match scheme {
            UpstreamScheme::Https | UpstreamScheme::Grpcs => {
                Some(self.tls.clone().unwrap_or_default())
            }
            UpstreamScheme::Http | UpstreamScheme::Grpc if https_probes => self.tls.clone(),
            UpstreamScheme::Http | UpstreamScheme::Grpc => None,
        };
        up.retries = self.retries;
        up.timeout = timeouts(self.timeout);
        if let Some(ms) = self.retry_timeout.filter(|ms| *ms > 0) {
            up.timeout.get_or_insert_default().retry_timeout_ms = ms;
        }
        if let Some((on, key)) = &self.hash {
            up.hash_on = *on as i32;
            up.hash_key = key.clone();
        }
        if let Some((pass, host)) = &self.pass_host {
            up.pass_host = *pass as i32;
            up.upstream_host = host.clone();
        }
        up.health_check = self.health_check.clone();
    }
}

pub(super) fn proto_scheme(s: UpstreamScheme) -> v1::Scheme {
    match s {
        UpstreamScheme::Http => v1::Scheme::Http,
        UpstreamScheme::Https => v1::Scheme::Https,
        UpstreamScheme::Grpc => v1::Scheme::Grpc,
        UpstreamScheme::Grpcs => v1::Scheme::Grpcs,
    }
}

/// `retryTimeout` in ms: seconds as a number, or a duration; `0` disables it.
fn retry_timeout(t: &IntOrString, field: &str, problems: &mut Problems) -> Option<u64> {
    match t {
        IntOrString::Int(s) if *s >= 0 => Some(u64::try_from(*s).unwrap_or(0) * 1000),
        IntOrString::Int(s) => {
            problems.error(field, format!("{s} must not be negative"));
            None
        }
        IntOrString::String(s) if parse_duration(s).is_ok_and(|d| d.is_zero()) => Some(0),
        IntOrString::String(s) => duration_ms(s).map_err(|e| problems.error(field, e)).ok(),
    }
}

/// Proto timeouts, `None` when nothing is set (0 = the dataplane default).
pub(crate) fn timeouts(t: [Option<u64>; 3]) -> Option<v1::Timeouts> {
    if t.iter().all(Option::is_none) {
        return None;
    }
    Some(v1::Timeouts {
        connect_ms: t[0].unwrap_or(0),
        send_ms: t[1].unwrap_or(0),
        read_ms: t[2].unwrap_or(0),
        ..Default::default()
    })
}

/// A validated ApisixUpstream.
#[derive(Debug, Clone)]
pub(crate) struct UpstreamObject {
    base: Settings,
    /// Port-level settings, already merged over `base`.
    ports: BTreeMap<i32, Settings>,
    /// Resolved external nodes (sorted, deduplicated).
    nodes: Vec<v1::Endpoint>,
    /// Whether `externalNodes` was given at all.
    has_external_nodes: bool,
    /// `subsets[]`: name -> Pod labels.
    pub(super) subsets: BTreeMap<String, BTreeMap<String, String>>,
}

impl UpstreamObject {
    /// Settings for a Service port.
    pub(super) fn settings_for_port(&self, port: i32) -> &Settings {
        self.ports.get(&port).unwrap_or(&self.base)
    }

    /// The upstream `<ns>/<name>` made of this object's external nodes, for
    /// `upstreams[]` references; `None` when it has no `externalNodes`.
    pub(crate) fn external_upstream(&self, ns: &str, name: &str) -> Option<v1::Upstream> {
        if !self.has_external_nodes {
            return None;
        }
        let mut up = v1::Upstream {
            id: format!("{ns}/{name}"),
            endpoints: self.nodes.clone(),
            ..Default::default()
        };
        self.base.apply(&mut up);
        Some(up)
    }
}

/// Validates one ApisixUpstream; `Err(())` when it is invalid (problems hold why). External
/// nodes of type `Service` that cannot be resolved are recorded as unresolved references.
pub(crate) fn validate_object(
    au: &ApisixUpstream,
    ns: &str,
    idx: &Index<'_>,
    problems: &mut Problems,
) -> Result<UpstreamObject, ()> {
    let spec = &au.spec;
    let from = Referrer {
        kind: "ApisixUpstream",
        ns,
    };
    let base = Settings::parse(&spec.config, "spec.", from, idx, problems);
    let ports = port_settings(au, &base, from, idx, problems);
    let nodes = external_nodes(au, ns, idx, problems);
    let subsets = subsets(au, problems);
    if !problems.is_valid() {
        return Err(());
    }
    Ok(UpstreamObject {
        base,
        ports,
        nodes,
        has_external_nodes: !spec.external_nodes.is_empty(),
        subsets,
    })
}

/// `portLevelSettings`, each merged over `base`.
fn port_settings(
    au: &ApisixUpstream,
    base: &Settings,
    from: Referrer<'_>,
    idx: &Index<'_>,
    problems: &mut Problems,
) -> BTreeMap<i32, Settings> {
    let mut ports = BTreeMap::new();
    for (i, pls) in au.spec.port_level_settings.iter().enumerate() {
        let field = format!("spec.portLevelSettings[{i}].");
        if !(1..=65535).contains(&pls.port) {
            problems.error(
                format!("{field}port"),
                format!("{} is not a port number (1-65535)", pls.port),
            );
            continue;
        }
        let s = Settings::parse(&pls.config, &field, from, idx, problems);
        if ports.insert(pls.port, base.overlay(&s)).is_some() {
            problems.error(
                format!("{field}port"),
                format!("port {} is listed twice", pls.port),
            );
        }
    }
    ports
}

/// `externalNodes`, resolved, sorted and deduplicated.
fn external_nodes(
    au: &ApisixUpstream,
    ns: &str,
    idx: &Index<'_>,
    problems: &mut Problems,
) -> Vec<v1::Endpoint> {
    let scheme = au.spec.config.scheme.unwrap_or_default();
    let mut nodes = Vec::new();
    for (i, node) in au.spec.external_nodes.iter().enumerate() {
        let field = format!("spec.externalNodes[{i}]");
        if let Some(node) = external_node(node, &field, scheme, ns, idx, problems) {
            nodes.push(node);
        }
    }
    nodes.sort_by(|a, b| (&a.host, a.port, a.weight).cmp(&(&b.host, b.port, b.weight)));
    nodes.dedup();
    nodes
}

/// One external node (`field`); `None` when it is invalid or does not resolve.
fn external_node(
    node: &ApisixUpstreamExternalNode,
    field: &str,
    scheme: UpstreamScheme,
    ns: &str,
    idx: &Index<'_>,
    problems: &mut Problems,
) -> Option<v1::Endpoint> {
    let Ok(weight) = u32::try_from(node.weight_or_default()) else {
        problems.error(format!("{field}.weight"), "must not be negative");
        return None;
    };
    let port = match node.port {
        None => match scheme {
            UpstreamScheme::Https | UpstreamScheme::Grpcs => 443,
            UpstreamScheme::Http | UpstreamScheme::Grpc => 80,
        },
        Some(p) => match u32::try_from(p).ok().filter(|p| (1..=65535).contains(p)) {
            Some(p) => p,
            None => {
                problems.error(
                    format!("{field}.port"),
                    format!("{p} is not a port number (1-65535)"),
                );
                return None;
            }
        },
    };
    let host = match node.type_.unwrap_or_default() {
        ExternalNodeType::Domain => {
            if let Err(e) = crate::validate::node_host(&node.name) {
                problems.error(format!("{field}.name"), e);
                return None;
            }
            node.name.clone()
        }
        ExternalNodeType::Service => match external_name_of(idx, ns, &node.name) {
            Ok(host) => host,
            Err(message) => {
                problems.unresolved(REASON_BACKEND_NOT_FOUND, format!("{field}.name"), message);
                return None;
            }
        },
    };
    Some(v1::Endpoint { host, port, weight })
}

/// `subsets[]`: name → Pod labels.
fn subsets(
    au: &ApisixUpstream,
    problems: &mut Problems,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut subsets = BTreeMap::new();
    for (i, s) in au.spec.config.subsets.iter().enumerate() {
        if s.name.is_empty() {
            problems.error(format!("spec.subsets[{i}].name"), "must not be empty");
        } else if subsets.insert(s.name.clone(), s.labels.clone()).is_some() {
            problems.error(
                format!("spec.subsets[{i}].name"),
                format!("duplicate subset name {:?}", s.name),
            );
        }
    }
    subsets
}

/// `tls` (from `tlsSecret`) with `tlsVerify`'s name to verify (and SNI) and subject
/// alternative names; a `tlsVerify` without `tlsSecret` verifies against the system roots.
fn tls_verify(
    c: &ApisixUpstreamConfig,
    tls: Option<v1::UpstreamTls>,
    field: &str,
    problems: &mut Problems,
) -> Option<v1::UpstreamTls> {
    let Some(v) = &c.tls_verify else {
        return tls;
    };
    let mut tls = tls.unwrap_or_default();
    if let Some(h) = &v.hostname {
        let h = h.to_ascii_lowercase();
        if h.contains('*') || crate::validate::host(&h).is_err() {
            problems.error(
                format!("{field}tlsVerify.hostname"),
                format!("{h:?} is not a DNS name"),
            );
            return None;
        }
        tls.sni = h;
    }
    for (i, san) in v.subject_alt_names.iter().enumerate() {
        let f = format!("{field}tlsVerify.subjectAltNames[{i}]");
        match (san.type_.as_str(), &san.hostname, &san.uri) {
            ("Hostname", Some(h), _)
                if !h.starts_with("*.") && crate::validate::host(h).is_ok() =>
            {
                tls.subject_alt_dns_names.push(h.to_ascii_lowercase());
            }
            ("URI", _, Some(u)) if u.contains(':') => tls.subject_alt_uris.push(u.clone()),
            (t, _, _) => {
                problems.error(
                    f,
                    format!("type {t:?} needs a DNS name in hostname (Hostname) or an absolute uri (URI)"),
                );
                return None;
            }
        }
    }
    Some(tls)
}

/// The upstream TLS settings of the `tlsSecret` `<ns>/<name>`: keys `tls.crt` + `tls.key`
/// (the client certificate for upstream mTLS, as in a `kubernetes.io/tls` Secret) and/or
/// `ca.crt` (the CA that signs the upstream's certificate; without it the dataplane verifies
/// against the system roots). Each present key must hold valid PEM.
pub(crate) fn tls_from_secret(
    idx: &Index<'_>,
    ns: &str,
    name: &str,
) -> Result<v1::UpstreamTls, String> {
    let secret = idx
        .secrets
        .get(&(ns, name))
        .ok_or_else(|| format!("Secret {ns}/{name} not found"))?;
    let get = |key: &str| -> Result<Option<String>, String> {
        let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(key)) else {
            return Ok(None);
        };
        String::from_utf8(bytes.0.clone())
            .map(Some)
            .map_err(|_| format!("Secret {ns}/{name}: {key} is not PEM text"))
    };
    let (cert, key, ca) = (get("tls.crt")?, get("tls.key")?, get("ca.crt")?);
    let bad = |key: &str, what: &str| format!("Secret {ns}/{name}: {key} holds no valid {what}");
    if let Some(cert) = &cert
        && !crate::validate::pem_has_certificate(cert)
    {
        return Err(bad("tls.crt", "PEM certificate"));
    }
    if let Some(key) = &key
        && !crate::validate::pem_has_private_key(key)
    {
        return Err(bad("tls.key", "PEM private key"));
    }
    if let Some(ca) = &ca
        && !crate::validate::pem_has_certificate(ca)
    {
        return Err(bad("ca.crt", "PEM certificate"));
    }
    match (&cert, &key, &ca) {
        (Some(_), None, _) | (None, Some(_), _) => Err(format!(
            "Secret {ns}/{name}: tls.crt and tls.key must be given together"
        )),
        (None, None, None) => Err(format!(
            "Secret {ns}/{name} has none of tls.crt/tls.key or ca.crt"
        )),
        _ => Ok(v1::UpstreamTls {
            ca_pem: ca.unwrap_or_default(),
            client_cert_pem: cert.unwrap_or_default(),
            client_key_pem: key.unwrap_or_default(),
            ..Default::default()
        }),
    }
}
