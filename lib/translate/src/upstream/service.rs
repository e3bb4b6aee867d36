//! Service backends → upstreams: see the [module docs](super) for how endpoints are
//! resolved.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sluice_crds::{ApisixUpstreamConfig, ResolveGranularity, UpstreamScheme};
use sluice_proto::v1;

use super::settings::{Settings, UpstreamObject, proto_scheme};
use crate::Index;
use crate::problems::Problems;
use crate::status::REASON_BACKEND_NOT_FOUND;

/// Weight of every endpoint taken from an EndpointSlice or a Service.
const ENDPOINT_WEIGHT: u32 = 100;

/// The `externalName` of an ExternalName Service, or why there is none.
pub(super) fn external_name_of(idx: &Index<'_>, ns: &str, name: &str) -> Result<String, String> {
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
    if !b.check(problems) {
        return None;
    }
    let (ns, name) = (b.namespace, b.service);
    let au_entry = upstreams.get(&(ns, name));
    let subset = b.subset_labels(au_entry, problems)?;
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
    let mut up = b.upstream(port_number, idx, au_entry);
    // NB: an ApisixUpstream `tlsVerify.hostname` already chose the name.
    if !is_external
        && let Some(tls) = up.tls.as_mut()
        && tls.sni.is_empty()
    {
        tls.sni = format!("{name}.{ns}.svc");
    }
    let Some((svc, port_u32, subset)) = b.resolvable(svc, port_number, subset, problems) else {
        return Some(up);
    };
    if is_external {
        b.external_endpoint(idx, port_u32, &mut up, problems);
        return Some(up);
    }
    if b.granularity == ResolveGranularity::Service
        && subset.is_none()
        && b.cluster_ips(svc, port_u32, &mut up, problems)
    {
        return Some(up);
    }
    let port_name = port.and_then(|p| p.name.as_deref()).unwrap_or("");
    up.endpoints = slice_endpoints(idx, ns, name, port_name, subset.map(|s| s.1));
    sort_endpoints(&mut up.endpoints);
    if let Some((subset, labels)) = subset
        && up.endpoints.is_empty()
    {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        problems.unresolved(
            REASON_BACKEND_NOT_FOUND,
            format!("{}.subset", b.field),
            format!(
                "no ready endpoint of Service {ns}/{name} is a Pod with the labels of subset \
                 {subset:?} ({})",
                labels.join(",")
            ),
        );
    }
    Some(up)
}

/// A subset and its Pod labels (`None`: the ApisixUpstream is invalid, so they are unknown).
type Subset<'s> = (&'s str, Option<&'s BTreeMap<String, String>>);

/// A backend whose references resolve: the Service, the endpoint port and the subset with
/// its Pod labels.
type Resolvable<'s, 'u> = (
    &'s Service,
    u32,
    Option<(&'u str, &'u BTreeMap<String, String>)>,
);

impl<'a> BackendRef<'a> {
    /// `field.<name>` for messages.
    fn f(&self, name: &str) -> String {
        format!("{}.{name}", self.field)
    }

    /// Whether the fields are valid (the errors go into `problems`).
    fn check(&self, problems: &mut Problems) -> bool {
        let mut valid = true;
        if self.service.is_empty() {
            problems.error(self.f(self.field_names.0), "must not be empty");
            valid = false;
        }
        match self.port {
            IntOrString::Int(p) if !(1..=65535).contains(p) => {
                problems.error(
                    self.f(self.field_names.1),
                    format!("{p} is not a port number (1-65535)"),
                );
                valid = false;
            }
            IntOrString::String(s) if s.is_empty() => {
                problems.error(self.f(self.field_names.1), "must not be empty");
                valid = false;
            }
            _ => {}
        }
        if self.subset.is_some_and(str::is_empty) {
            problems.error(self.f("subset"), "must not be empty");
            valid = false;
        }
        valid
    }

    /// The subset's Pod labels. An unknown subset is a spec error (`None`); an
    /// ApisixUpstream that is itself invalid has its own Accepted=False, so the subset is
    /// only unresolved then.
    fn subset_labels<'u>(
        &self,
        au_entry: Option<&'u Result<UpstreamObject, ()>>,
        problems: &mut Problems,
    ) -> Option<Option<Subset<'u>>>
    where
        'a: 'u,
    {
        let (ns, name) = (self.namespace, self.service);
        let Some(subset) = self.subset else {
            return Some(None);
        };
        match au_entry {
            Some(Err(())) => Some(Some((subset, None))),
            Some(Ok(au)) if au.subsets.contains_key(subset) => {
                Some(Some((subset, au.subsets.get(subset))))
            }
            Some(Ok(_)) => {
                problems.error(
                    self.f("subset"),
                    format!("ApisixUpstream {ns}/{name} defines no subset {subset:?}"),
                );
                None
            }
            None => {
                problems.error(
                    self.f("subset"),
                    format!(
                        "subset {subset:?} needs an ApisixUpstream {ns}/{name} defining it \
                         (none found)"
                    ),
                );
                None
            }
        }
    }

    /// The upstream without endpoints: its id and the settings of the ApisixUpstream named
    /// after the Service.
    fn upstream(
        &self,
        port_number: Option<i32>,
        idx: &Index<'_>,
        au_entry: Option<&Result<UpstreamObject, ()>>,
    ) -> v1::Upstream {
        let (ns, name) = (self.namespace, self.service);
        let port_label = match (port_number, self.port) {
            (Some(n), _) => n.to_string(),
            (None, IntOrString::Int(n)) => n.to_string(),
            (None, IntOrString::String(s)) => s.clone(),
        };
        let mut id = format!("{ns}/{name}:{port_label}");
        if self.granularity == ResolveGranularity::Service {
            id.push_str("@service");
        }
        if let Some(subset) = self.subset {
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
            // NB: a rejected ApisixUpstream (e.g. its tlsSecret is missing) leaves the
            // defaults, but one that asks for TLS must not fall back to plain text: keep the
            // scheme with default TLS settings (system roots), so the dataplane fails closed.
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
        up
    }

    /// The Service, its port as an endpoint port and the subset's labels, when all resolve;
    /// else `None` with the unresolved reference in `problems`.
    fn resolvable<'s, 'u>(
        &self,
        svc: Option<&'s Service>,
        port_number: Option<i32>,
        subset: Option<Subset<'u>>,
        problems: &mut Problems,
    ) -> Option<Resolvable<'s, 'u>> {
        let (ns, name) = (self.namespace, self.service);
        let mut unresolved = |field: String, message: String| {
            problems.unresolved(REASON_BACKEND_NOT_FOUND, field, message);
            None
        };
        let Some(svc) = svc else {
            return unresolved(
                self.f(self.field_names.0),
                format!("Service {ns}/{name} not found"),
            );
        };
        let Some(port_number) = port_number else {
            let what = match self.port {
                IntOrString::Int(n) => format!("port {n}"),
                IntOrString::String(s) => format!("port named {s:?}"),
            };
            return unresolved(
                self.f(self.field_names.1),
                format!("Service {ns}/{name} has no {what}"),
            );
        };
        let subset = match subset {
            None => None,
            Some((subset, None)) => {
                return unresolved(
                    self.f("subset"),
                    format!(
                        "ApisixUpstream {ns}/{name} is invalid, so subset {subset:?} is unknown"
                    ),
                );
            }
            Some((subset, Some(labels))) => {
                let external =
                    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName");
                if external {
                    return unresolved(
                        self.f("subset"),
                        format!(
                            "Service {ns}/{name} is of type ExternalName and has no Pods for \
                             subset {subset:?}"
                        ),
                    );
                }
                Some((subset, labels))
            }
        };
        // NB: standalone YAML skips the API server's validation, so a Service port may be 0
        // or too large; an endpoint with it would make the dataplane reject the whole
        // snapshot.
        let Some(port_u32) = u32::try_from(port_number)
            .ok()
            .filter(|p| (1..=65535).contains(p))
        else {
            return unresolved(
                self.f(self.field_names.1),
                format!("Service {ns}/{name} port {port_number} is not a port number (1-65535)"),
            );
        };
        Some((svc, port_u32, subset))
    }

    /// The endpoint of an ExternalName Service.
    fn external_endpoint(
        &self,
        idx: &Index<'_>,
        port: u32,
        up: &mut v1::Upstream,
        problems: &mut Problems,
    ) {
        match external_name_of(idx, self.namespace, self.service) {
            Ok(host) => up.endpoints.push(v1::Endpoint {
                host,
                port,
                weight: ENDPOINT_WEIGHT,
            }),
            Err(message) => problems.unresolved(
                REASON_BACKEND_NOT_FOUND,
                self.f(self.field_names.0),
                message,
            ),
        }
    }

    /// `resolveGranularity: service`: the ClusterIP(s) as endpoints; `false` for a headless
    /// Service (no virtual IP: its endpoints are used instead).
    fn cluster_ips(
        &self,
        svc: &Service,
        port: u32,
        up: &mut v1::Upstream,
        problems: &mut Problems,
    ) -> bool {
        let (ns, name) = (self.namespace, self.service);
        let spec = svc.spec.as_ref();
        let mut ips: Vec<&str> = spec
            .and_then(|s| s.cluster_ips.as_ref())
            .map(|v| v.iter().map(String::as_str).collect())
            .unwrap_or_default();
        if ips.is_empty()
            && let Some(ip) = spec.and_then(|s| s.cluster_ip.as_deref())
        {
            ips.push(ip);
        }
        if ips.contains(&"None") {
            return false;
        }
        ips.retain(|ip| !ip.is_empty());
        if ips.is_empty() {
            problems.unresolved(
                REASON_BACKEND_NOT_FOUND,
                self.f("resolveGranularity"),
                format!(
                    "Service {ns}/{name} has no clusterIP (resolveGranularity: service needs one)"
                ),
            );
        }
        up.endpoints = ips
            .into_iter()
            .map(|ip| v1::Endpoint {
                host: ip.to_owned(),
                port,
                weight: ENDPOINT_WEIGHT,
            })
            .collect();
        sort_endpoints(&mut up.endpoints);
        true
    }
}

/// The ready endpoints of Service `ns/name` from its EndpointSlices, with the port of the
/// slice port named `port_name`; with `subset`, only Pods carrying its labels. Unsorted.
fn slice_endpoints(
    idx: &Index<'_>,
    ns: &str,
    name: &str,
    port_name: &str,
    subset: Option<&BTreeMap<String, String>>,
) -> Vec<v1::Endpoint> {
    let mut out = Vec::new();
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
            if let Some(labels) = subset
                && !pod_matches(idx, ns, ep, labels)
            {
                continue;
            }
            for addr in ep.addresses.iter().filter(|a| !a.is_empty()) {
                out.push(v1::Endpoint {
                    host: addr.clone(),
                    port: slice_port,
                    weight: ENDPOINT_WEIGHT,
                });
            }
        }
    }
    out
}

/// The upstream `id` made of `nodes` with the settings `config` (a plugin's inline upstream,
/// given in the ApisixUpstream shape). Errors name fields under `field` (e.g.
/// `...upstream.`).
pub(crate) fn inline_upstream(
    id: String,
    config: &ApisixUpstreamConfig,
    nodes: Vec<v1::Endpoint>,
    field: &str,
    from: crate::refs::Referrer<'_>,
    idx: &Index<'_>,
    problems: &mut Problems,
) -> v1::Upstream {
    let settings = Settings::parse(config, field, from, idx, problems);
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
