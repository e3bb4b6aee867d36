//! Upstreams: ApisixUpstream settings, Service/EndpointSlice resolution and external nodes.
//!
//! Service resolution, per `backends[]` entry:
//!
//! - `resolveGranularity: endpoint` (default): every address of every endpoint whose
//!   `conditions.ready` is not `false`, from the EndpointSlices labelled
//!   `kubernetes.io/service-name=<service>` in the same namespace, with the port of the slice
//!   port named like the Service port (unnamed = `""`). Deduplicated and sorted.
//! - `resolveGranularity: service`: the Service's ClusterIP(s) and the Service port. A
//!   headless Service (`clusterIP: None`) has no virtual IP, so its endpoints are used
//!   instead, as for `endpoint`. A Service without a ClusterIP yet gets no endpoints and a
//!   `ResolvedRefs=False` condition.
//! - A Service of type `ExternalName` resolves to its `externalName` and the Service port (or
//!   the number given in `servicePort` when the Service lists no ports), for either
//!   granularity.
//! - `subset: NAME`: the ApisixUpstream named after the Service must define `subsets[]` entry
//!   `NAME` (else the route is rejected, `Accepted=False` naming the `subset` field). Its
//!   upstream (`...#<subset>`) gets only the endpoints whose `targetRef` is a Pod carrying
//!   every label of the subset (Pod labels come from [`crate::ClusterState::pods`]). No
//!   matching endpoint keeps the route with `ResolvedRefs=False` naming the subset and its
//!   labels (requests get 503). A subset needs Pods, so it is resolved from EndpointSlices
//!   even with `resolveGranularity: service`, and is unresolved for an ExternalName Service.
//! - `scheme: https|grpcs`: the upstream gets `tls` (see [`tls_from_secret`]): the server
//!   name verified and sent as SNI is `<service>.<namespace>.svc` for Service backends (the
//!   Service's cluster DNS name, which in-cluster certificates carry), and the node or
//!   externalName host otherwise (the dataplane's default for an empty `sni`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sluice_crds::{
    ApisixUpstream, ApisixUpstreamConfig, ExternalNodeType, LoadBalancerType, ResolveGranularity,
    UpstreamScheme, UpstreamTimeout, parse_duration,
};
use sluice_proto::v1;

use crate::Index;
use crate::problems::Problems;
use crate::status::REASON_BACKEND_NOT_FOUND;
use crate::upstream_health as health;

/// Weight of every endpoint taken from an EndpointSlice or a Service.
const ENDPOINT_WEIGHT: u32 = 100;

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
    fn parse(
        c: &ApisixUpstreamConfig,
        field: &str,
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
        let hash = c
            .loadbalancer
            .as_ref()
            .and_then(|lb| health::hash_on(lb, field, problems));
        let pass_host = health::pass_host(c.pass_host, c.upstream_host.as_deref(), field, problems);
        let health_check = c
            .health_check
            .as_ref()
            .map(|hc| health::health_check(hc, field, problems));
        // NB: settings the snapshot cannot carry yet are listed in the Accepted message by the
        // caller rather than silently dropped.
        let tls = c.tls_secret.as_ref().and_then(|s| {
            tls_from_secret(idx, &s.namespace, &s.name)
                .map_err(|e| problems.error(format!("{field}tlsSecret"), e))
                .ok()
        });
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
            hash: over.hash.clone().or_else(|| self.hash.clone()),
            pass_host: over.pass_host.clone().or_else(|| self.pass_host.clone()),
            health_check: over
                .health_check
                .clone()
                .or_else(|| self.health_check.clone()),
            tls: over.tls.clone().or_else(|| self.tls.clone()),
        }
    }

    fn apply(&self, up: &mut v1::Upstream) {
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

fn proto_scheme(s: UpstreamScheme) -> v1::Scheme {
    match s {
        UpstreamScheme::Http => v1::Scheme::Http,
        UpstreamScheme::Https => v1::Scheme::Https,
        UpstreamScheme::Grpc => v1::Scheme::Grpc,
        UpstreamScheme::Grpcs => v1::Scheme::Grpcs,
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
    subsets: BTreeMap<String, BTreeMap<String, String>>,
}

impl UpstreamObject {
    /// Settings for a Service port.
    fn settings_for_port(&self, port: i32) -> &Settings {
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
    let base = Settings::parse(&spec.config, "spec.", idx, problems);
    let mut ports = BTreeMap::new();
    for (i, pls) in spec.port_level_settings.iter().enumerate() {
        let field = format!("spec.portLevelSettings[{i}].");
        if !(1..=65535).contains(&pls.port) {
            problems.error(
                format!("{field}port"),
                format!("{} is not a port number (1-65535)", pls.port),
            );
            continue;
        }
        let s = Settings::parse(&pls.config, &field, idx, problems);
        if ports.insert(pls.port, base.overlay(&s)).is_some() {
            problems.error(
                format!("{field}port"),
                format!("port {} is listed twice", pls.port),
            );
        }
    }

    let scheme = spec.config.scheme.unwrap_or_default();
    let mut nodes = Vec::new();
    for (i, node) in spec.external_nodes.iter().enumerate() {
        let field = format!("spec.externalNodes[{i}]");
        let weight = match u32::try_from(node.weight_or_default()) {
            Ok(w) => w,
            Err(_) => {
                problems.error(format!("{field}.weight"), "must not be negative");
                continue;
            }
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
                    continue;
                }
            },
        };
        let host = match node.type_.unwrap_or_default() {
            ExternalNodeType::Domain => {
                if let Err(e) = crate::validate::node_host(&node.name) {
                    problems.error(format!("{field}.name"), e);
                    continue;
                }
                node.name.clone()
            }
            ExternalNodeType::Service => match external_name_of(idx, ns, &node.name) {
                Ok(host) => host,
                Err(message) => {
                    problems.unresolved(REASON_BACKEND_NOT_FOUND, format!("{field}.name"), message);
                    continue;
                }
            },
        };
        nodes.push(v1::Endpoint { host, port, weight });
    }
    nodes.sort_by(|a, b| (&a.host, a.port, a.weight).cmp(&(&b.host, b.port, b.weight)));
    nodes.dedup();

    let mut subsets = BTreeMap::new();
    for (i, s) in spec.config.subsets.iter().enumerate() {
        if s.name.is_empty() {
            problems.error(format!("spec.subsets[{i}].name"), "must not be empty");
        } else if subsets.insert(s.name.clone(), s.labels.clone()).is_some() {
            problems.error(
                format!("spec.subsets[{i}].name"),
                format!("duplicate subset name {:?}", s.name),
            );
        }
    }

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
            sni: String::new(),
        }),
    }
}

/// The `externalName` of an ExternalName Service, or why there is none.
fn external_name_of(idx: &Index<'_>, ns: &str, name: &str) -> Result<String, String> {
    let svc = idx
        .services
        .get(&(ns, name))
        .ok_or_else(|| format!("Service {ns}/{name} not found"))?;
    let spec = svc.spec.as_ref();
    if spec.and_then(|s| s.type_.as_deref()) != Some("ExternalName") {
        return Err(format!("Service {ns}/{name} is not of type ExternalName"));
    }
    let host = spec
        .and_then(|s| s.external_name.as_deref())
        .unwrap_or_default();
    crate::validate::node_host(host)
        .map_err(|e| format!("Service {ns}/{name} has an invalid externalName: {e}"))?;
    Ok(host.to_owned())
}

/// One `backends[]` entry of a route.
pub(crate) struct BackendRef<'a> {
    pub(crate) namespace: &'a str,
    pub(crate) service: &'a str,
    pub(crate) port: &'a IntOrString,
    pub(crate) granularity: ResolveGranularity,
    pub(crate) subset: Option<&'a str>,
    /// Field path of the entry, e.g. `spec.http[0].backends[1]`.
    pub(crate) field: &'a str,
    /// Names of the Service and port fields under `field` (`serviceName`/`servicePort` for
    /// ApisixRoute, `service.name`/`service.port` for Ingress), used in messages.
    pub(crate) field_names: (&'a str, &'a str),
}

/// Builds the upstream of a Service backend. Invalid values are spec errors (`None`);
/// a missing Service, port or subset is an unresolved reference, and the upstream is still
/// returned, without endpoints.
pub(crate) fn service_upstream(
    b: &BackendRef<'_>,
    idx: &Index<'_>,
    upstreams: &BTreeMap<(&str, &str), Result<UpstreamObject, ()>>,
    problems: &mut Problems,
) -> Option<v1::Upstream> {
    let field = b.field;
    let mut valid = true;
    if b.service.is_empty() {
        problems.error(format!("{field}.{}", b.field_names.0), "must not be empty");
        valid = false;
    }
    match b.port {
        IntOrString::Int(p) if !(1..=65535).contains(p) => {
            problems.error(
                format!("{field}.{}", b.field_names.1),
                format!("{p} is not a port number (1-65535)"),
            );
            valid = false;
        }
        IntOrString::String(s) if s.is_empty() => {
            problems.error(format!("{field}.{}", b.field_names.1), "must not be empty");
            valid = false;
        }
        _ => {}
    }
    if b.subset.is_some_and(str::is_empty) {
        problems.error(format!("{field}.subset"), "must not be empty");
        valid = false;
    }
    if !valid {
        return None;
    }

    let (ns, name) = (b.namespace, b.service);
    let au_entry = upstreams.get(&(ns, name));
    // The subset's Pod labels. An unknown subset is a spec error; an ApisixUpstream that is
    // itself invalid has its own Accepted=False, so the subset is only unresolved then.
    let subset: Option<(&str, Option<&BTreeMap<String, String>>)> = match b.subset {
        None => None,
        Some(subset) => match au_entry {
            Some(Err(())) => Some((subset, None)),
            Some(Ok(au)) if au.subsets.contains_key(subset) => {
                Some((subset, au.subsets.get(subset)))
            }
            Some(Ok(_)) => {
                problems.error(
                    format!("{field}.subset"),
                    format!("ApisixUpstream {ns}/{name} defines no subset {subset:?}"),
                );
                return None;
            }
            None => {
                problems.error(
                    format!("{field}.subset"),
                    format!(
                        "subset {subset:?} needs an ApisixUpstream {ns}/{name} defining it \
                         (none found)"
                    ),
                );
                return None;
            }
        },
    };
    let svc = idx.services.get(&(ns, name)).copied();
    let is_external = svc
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.type_.as_deref())
        == Some("ExternalName");
    let port: Option<&ServicePort> = svc.and_then(|s| find_port(s, b.port));
    // The port part of the id: the resolved number, else the port as written.
    let port_number: Option<i32> = match (port, b.port) {
        (Some(p), _) => Some(p.port),
        (None, IntOrString::Int(n)) if is_external || svc.is_none() => Some(*n),
        (None, _) => None,
    };
    let port_label = match (port_number, b.port) {
        (Some(n), _) => n.to_string(),
        (None, IntOrString::Int(n)) => n.to_string(),
        (None, IntOrString::String(s)) => s.clone(),
    };
    let mut id = format!("{ns}/{name}:{port_label}");
    if b.granularity == ResolveGranularity::Service {
        id.push_str("@service");
    }
    if let Some(subset) = b.subset {
        id.push('#');
        id.push_str(subset);
    }
    let mut up = v1::Upstream {
        id,
        ..Default::default()
    };
    let au = au_entry.and_then(|r| r.as_ref().ok());
    if let Some(au) = au {
        au.settings_for_port(port_number.unwrap_or(0))
            .apply(&mut up);
    } else if let Some(raw) = idx.upstreams.get(&(ns, name)) {
        // NB: a rejected ApisixUpstream (e.g. its tlsSecret is missing) leaves the defaults,
        // but one that asks for TLS must not fall back to plain text: keep the scheme with
        // default TLS settings (system roots), so the dataplane fails closed instead.
        let scheme = raw
            .spec
            .port_level_settings
            .iter()
            .find(|p| Some(p.port) == port_number)
            .and_then(|p| p.config.scheme)
            .or(raw.spec.config.scheme);
        if let Some(s @ (UpstreamScheme::Https | UpstreamScheme::Grpcs)) = scheme {
            up.scheme = proto_scheme(s) as i32;
            up.tls = Some(v1::UpstreamTls::default());
        }
    }

    if !is_external && let Some(tls) = up.tls.as_mut() {
        tls.sni = format!("{name}.{ns}.svc");
    }

    let Some(svc) = svc else {
        problems.unresolved(
            REASON_BACKEND_NOT_FOUND,
            format!("{field}.{}", b.field_names.0),
            format!("Service {ns}/{name} not found"),
        );
        return Some(up);
    };
    let Some(port_number) = port_number else {
        let what = match b.port {
            IntOrString::Int(n) => format!("port {n}"),
            IntOrString::String(s) => format!("port named {s:?}"),
        };
        problems.unresolved(
            REASON_BACKEND_NOT_FOUND,
            format!("{field}.{}", b.field_names.1),
            format!("Service {ns}/{name} has no {what}"),
        );
        return Some(up);
    };
    let subset = match subset {
        None => None,
        Some((subset, None)) => {
            problems.unresolved(
                REASON_BACKEND_NOT_FOUND,
                format!("{field}.subset"),
                format!("ApisixUpstream {ns}/{name} is invalid, so subset {subset:?} is unknown"),
            );
            return Some(up);
        }
        Some((subset, Some(labels))) => {
            if is_external {
                problems.unresolved(
                    REASON_BACKEND_NOT_FOUND,
                    format!("{field}.subset"),
                    format!(
                        "Service {ns}/{name} is of type ExternalName and has no Pods for subset \
                         {subset:?}"
                    ),
                );
                return Some(up);
            }
            Some((subset, labels))
        }
    };

    // NB: standalone YAML skips the API server's validation, so a Service port may be 0 or
    // too large; an endpoint with it would make the dataplane reject the whole snapshot.
    let Some(port_u32) = u32::try_from(port_number)
        .ok()
        .filter(|p| (1..=65535).contains(p))
    else {
        problems.unresolved(
            REASON_BACKEND_NOT_FOUND,
            format!("{field}.{}", b.field_names.1),
            format!("Service {ns}/{name} port {port_number} is not a port number (1-65535)"),
        );
        return Some(up);
    };
    let spec = svc.spec.as_ref();
    if is_external {
        match external_name_of(idx, ns, name) {
            Ok(host) => up.endpoints.push(v1::Endpoint {
                host,
                port: port_u32,
                weight: ENDPOINT_WEIGHT,
            }),
            Err(message) => problems.unresolved(
                REASON_BACKEND_NOT_FOUND,
                format!("{field}.{}", b.field_names.0),
                message,
            ),
        }
        return Some(up);
    }

    if b.granularity == ResolveGranularity::Service && subset.is_none() {
        let mut ips: Vec<&str> = spec
            .and_then(|s| s.cluster_ips.as_ref())
            .map(|v| v.iter().map(String::as_str).collect())
            .unwrap_or_default();
        if ips.is_empty()
            && let Some(ip) = spec.and_then(|s| s.cluster_ip.as_deref())
        {
            ips.push(ip);
        }
        let headless = ips.contains(&"None");
        if !headless {
            ips.retain(|ip| !ip.is_empty());
            if ips.is_empty() {
                problems.unresolved(
                    REASON_BACKEND_NOT_FOUND,
                    format!("{field}.resolveGranularity"),
                    format!(
                        "Service {ns}/{name} has no clusterIP (resolveGranularity: service needs one)"
                    ),
                );
            }
            up.endpoints = ips
                .into_iter()
                .map(|ip| v1::Endpoint {
                    host: ip.to_owned(),
                    port: port_u32,
                    weight: ENDPOINT_WEIGHT,
                })
                .collect();
            sort_endpoints(&mut up.endpoints);
            return Some(up);
        }
        // Headless: no virtual IP, fall through to the endpoints.
    }

    let port_name = port.and_then(|p| p.name.as_deref()).unwrap_or("");
    for slice in idx.slices.get(&(ns, name)).into_iter().flatten() {
        let slice_port = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref().unwrap_or("") == port_name)
            .and_then(|p| p.port)
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| (1..=65535).contains(p));
        let Some(slice_port) = slice_port else {
            continue;
        };
        for ep in &slice.endpoints {
            if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            if let Some((_, labels)) = subset
                && !pod_matches(idx, ns, ep, labels)
            {
                continue;
            }
            for addr in &ep.addresses {
                if addr.is_empty() {
                    continue;
                }
                up.endpoints.push(v1::Endpoint {
                    host: addr.clone(),
                    port: slice_port,
                    weight: ENDPOINT_WEIGHT,
                });
            }
        }
    }
    sort_endpoints(&mut up.endpoints);
    if let Some((subset, labels)) = subset
        && up.endpoints.is_empty()
    {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        problems.unresolved(
            REASON_BACKEND_NOT_FOUND,
            format!("{field}.subset"),
            format!(
                "no ready endpoint of Service {ns}/{name} is a Pod with the labels of subset \
                 {subset:?} ({})",
                labels.join(",")
            ),
        );
    }
    Some(up)
}

/// The upstream `id` made of `nodes` with the settings `config` (a plugin's inline upstream,
/// given in the ApisixUpstream shape). Errors name fields under `field` (e.g.
/// `...upstream.`).
pub(crate) fn inline_upstream(
    id: String,
    config: &ApisixUpstreamConfig,
    nodes: Vec<v1::Endpoint>,
    field: &str,
    idx: &Index<'_>,
    problems: &mut Problems,
) -> v1::Upstream {
    let settings = Settings::parse(config, field, idx, problems);
    let mut up = v1::Upstream {
        id,
        endpoints: nodes,
        ..Default::default()
    };
    sort_endpoints(&mut up.endpoints);
    settings.apply(&mut up);
    up
}

/// Whether an EndpointSlice endpoint is a Pod (in `ns` unless its `targetRef` says
/// otherwise) carrying every label in `labels`.
fn pod_matches(
    idx: &Index<'_>,
    ns: &str,
    ep: &k8s_openapi::api::discovery::v1::Endpoint,
    labels: &BTreeMap<String, String>,
) -> bool {
    let Some(target) = ep.target_ref.as_ref() else {
        return false;
    };
    if target.kind.as_deref().is_some_and(|k| k != "Pod") {
        return false;
    }
    let Some(pod) = target.name.as_deref() else {
        return false;
    };
    let pod_ns = target
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or(ns);
    let Some(have) = idx.pod_labels.get(&(pod_ns, pod)) else {
        return false;
    };
    labels
        .iter()
        .all(|(k, v)| have.and_then(|h| h.get(k)) == Some(v))
}

fn sort_endpoints(eps: &mut Vec<v1::Endpoint>) {
    eps.sort_by(|a, b| (&a.host, a.port, a.weight).cmp(&(&b.host, b.port, b.weight)));
    eps.dedup();
}

/// The Service port a backend names: by name for a string, by number for an int.
pub(crate) fn find_port<'s>(svc: &'s Service, port: &IntOrString) -> Option<&'s ServicePort> {
    let ports = svc.spec.as_ref()?.ports.as_ref()?;
    match port {
        IntOrString::Int(n) => ports.iter().find(|p| p.port == *n),
        IntOrString::String(s) => ports.iter().find(|p| p.name.as_deref() == Some(s.as_str())),
    }
}
