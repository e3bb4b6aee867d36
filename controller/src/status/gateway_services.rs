//! One Service per Gateway (leader only), with `--gateway-service-namespace`: each Gateway
//! gets its own address, as Envoy Gateway gives each Gateway its own Service.
//!
//! Translation gives each port of each accepted Gateway a port of the dataplanes
//! (`Snapshot.listeners`, from `--gateway-listener-ports`). This task keeps one Service per
//! such Gateway: its ports are the Gateway's listener ports, each targeting the dataplane
//! port translation chose, its type `--gateway-service-type`. The Gateway's
//! `status.addresses` are that Service's address (see [`super::gateway`]). Where the
//! Service lives is [`Placement`]:
//!
//! - [`Placement::Dataplane`] (default): in the dataplanes' namespace, its selector the
//!   dataplane pods' labels (`--gateway-service-selector`). The controller writes Services
//!   in that namespace only.
//! - [`Placement::Gateway`] (`--gateway-service-placement=gateway`): in the Gateway's own
//!   namespace, owned by the Gateway (deleted with it), beside the Gateway and its routes, as
//!   the Gateway API expects of what serves a Gateway (`spec.infrastructure` metadata is
//!   found there). A Service cannot select pods of another namespace, so it has no selector:
//!   a headless *backing* Service in the dataplanes' namespace selects the pods, and this
//!   task mirrors the backing Service's EndpointSlices (addresses, readiness, node, zone:
//!   Kubernetes' own EndpointSlice controller decides them) into EndpointSlices of the
//!   Gateway's Service, labelled [`SLICE_MANAGER`]. A change of those slices (a dataplane
//!   pod started, ready, stopping) wakes the task at once (a watch of the dataplanes'
//!   namespace), so the mirror lags Kubernetes' own by the writer's batching only. This
//!   needs write access to Services and EndpointSlices in every namespace; the chart grants
//!   it only with this placement.
//!
//! Services are written with server-side apply under [`FIELD_MANAGER`] and labelled
//! [`MANAGED_BY`]; one whose Gateway no longer has ports is deleted. Services without the
//! label are never touched. The annotation [`GATEWAY_ANNOTATION`] names the Gateway
//! (`ns/name`; a label value could not hold a long name).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde::Serialize;
use tokio::sync::watch;

use super::writer::{Family, Key};
use crate::context::Context;
use crate::metrics::Metrics;
use crate::rebuild::Rebuilt;

/// Field manager of the Service writes.
pub const FIELD_MANAGER: &str = "sluice-gateway-services";
/// Label every Gateway Service carries (`app.kubernetes.io/managed-by=<this>`).
pub const MANAGED_BY: &str = "sluice-gateway";
/// Annotation: `namespace/name` of the Gateway a Service serves.
pub const GATEWAY_ANNOTATION: &str = "gateway.sluice.dev/gateway";
/// `endpointslice.kubernetes.io/managed-by` of the EndpointSlices Sluice mirrors into the
/// Gateway's namespace ([`Placement::Gateway`]); Kubernetes' controllers leave them alone.
pub const SLICE_MANAGER: &str = "gateway.sluice.dev";
/// The label naming an EndpointSlice's manager.
const SLICE_MANAGER_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// Label on what [`Placement::Gateway`] writes: the dataplanes' namespace, which names the
/// Sluice installation (two installations never delete each other's Services).
pub const INSTALL_LABEL: &str = "gateway.sluice.dev/dataplane-namespace";
/// Kubernetes' EndpointSlice controller, the manager of the backing Services' slices.
const KUBE_SLICE_MANAGER: &str = "endpointslice-controller.k8s.io";

/// Where each Gateway's Service lives (`--gateway-service-placement`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Placement {
    /// In the dataplanes' namespace, selecting the dataplane pods.
    #[default]
    Dataplane,
    /// In the Gateway's namespace, without a selector, its EndpointSlices mirrored from a
    /// headless backing Service in the dataplanes' namespace.
    Gateway,
}

/// Where and how Gateway Services are made (`--gateway-service-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayServices {
    /// Namespace of the dataplane pods, where the Services (or, with
    /// [`Placement::Gateway`], the backing Services) live.
    pub namespace: String,
    /// Labels of the dataplane pods.
    pub selector: BTreeMap<String, String>,
    /// `ClusterIP`, `NodePort` or `LoadBalancer`.
    pub type_: String,
    /// Where each Gateway's Service lives.
    pub placement: Placement,
}

impl GatewayServices {
    /// Namespace of the Service of the Gateway in `gateway_ns`.
    pub fn service_namespace<'a>(&'a self, gateway_ns: &'a str) -> &'a str {
        match self.placement {
            Placement::Dataplane => &self.namespace,
            Placement::Gateway => gateway_ns,
        }
    }
}

/// Parses `k=v,k2=v2` (`--gateway-service-selector`).
pub fn parse_selector(raw: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for part in raw.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                out.insert(k.trim().to_owned(), v.trim().to_owned());
            }
            _ => return Err(format!("{part:?}: expected KEY=VALUE")),
        }
    }
    if out.is_empty() {
        return Err("empty selector: it would select every pod".into());
    }
    Ok(out)
}

/// Hex digits of the hash in a Service name: 64 bits of SHA-256, so that no one can pick a
/// Gateway name whose Service name is another Gateway's (a 32-bit hash can be matched by
/// trying names for minutes).
const NAME_HASH_HEX: usize = 16;
/// Longest DNS label, the limit of a Service name.
const MAX_NAME: usize = 63;

/// Name of the Service of Gateway `ns/name`: `gw-<ns>-<name>` (lower-cased, other
/// characters as `-`, cut to fit) then `-` and [`NAME_HASH_HEX`] hex digits of the SHA-256
/// of `<ns>/<name>`. A DNS label of at most 63 bytes that starts with a letter; the readable
/// part may be the same for two Gateways (`a-b`/`c` and `a`/`b-c`, or long names that
/// differ only past the cut), the hash makes the names differ.
pub fn service_name(ns: &str, name: &str) -> String {
    prefixed_name("gw", ns, name)
}

/// Name of the backing Service of Gateway `ns/name` ([`Placement::Gateway`]): as
/// [`service_name`] with the prefix `gwb`, so that it differs from the Gateway's own
/// Service when the Gateway is in the dataplanes' namespace.
pub fn backing_name(ns: &str, name: &str) -> String {
    prefixed_name("gwb", ns, name)
}

fn prefixed_name(prefix: &str, ns: &str, name: &str) -> String {
    use sha2::{Digest, Sha256};
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect()
    };
    let digest = Sha256::digest(format!("{ns}/{name}").as_bytes());
    let hash: String = digest
        .iter()
        .take(NAME_HASH_HEX / 2)
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut readable = format!("{prefix}-{}-{}", clean(ns), clean(name));
    readable.truncate(MAX_NAME - 1 - NAME_HASH_HEX);
    let readable = readable.trim_end_matches('-');
    format!("{readable}-{hash}")
}

/// What a per-Gateway listener port speaks, as the prefix of its Service port name:
/// `http`, `https`, `tls`, `tcp` or `udp`.
pub fn port_kind(l: &sluice_proto::v1::Listener) -> &'static str {
    use sluice_proto::v1::ListenerProtocol;
    match ListenerProtocol::try_from(l.protocol) {
        Ok(ListenerProtocol::Tls) => "tls",
        Ok(ListenerProtocol::Tcp) => "tcp",
        Ok(ListenerProtocol::Udp) => "udp",
        _ if l.tls => "https",
        _ => "http",
    }
}

/// What a Gateway asks of its Service beyond ports: `spec.infrastructure` labels and
/// annotations, and `spec.addresses` static IPs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GatewayInfra {
    /// Labels added to the Service (Sluice's own win on a clash).
    pub labels: BTreeMap<String, String>,
    /// Annotations added to the Service (Sluice's own win on a clash).
    pub annotations: BTreeMap<String, String>,
    /// Static IPs (at most one per family, as translation checked).
    pub addresses: Vec<String>,
    /// Its addresses cannot be honoured (translation said `AddressNotUsable`): no Service,
    /// rather than one on an address the user did not ask for.
    pub unusable: bool,
}

/// Each accepted Gateway's [`GatewayInfra`], from translation's report.
pub fn infra_of(
    report: &sluice_translate::gateway::GatewayStatusReport,
) -> BTreeMap<(String, String), GatewayInfra> {
    use sluice_translate::gateway::{PROGRAMMED, reason};
    report
        .gateways
        .iter()
        .map(|g| {
            let unusable = g
                .conditions
                .iter()
                .any(|c| c.type_ == PROGRAMMED && c.reason == reason::ADDRESS_NOT_USABLE);
            (
                (g.namespace.clone(), g.name.clone()),
                GatewayInfra {
                    labels: g.infrastructure_labels.clone(),
                    annotations: g.infrastructure_annotations.clone(),
                    addresses: g.static_addresses.clone(),
                    unusable,
                },
            )
        })
        .collect()
}

/// Label the Gateway API recommends on what serves a Gateway: the Gateway's name.
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";

/// Sets the static `addresses` on a Service of `type_`: a ClusterIP Service's
/// `clusterIPs` (one per family), a LoadBalancer's `loadBalancerIP` (the first; the load
/// balancer implementation must honour it, as MetalLB and most clouds' do), a NodePort's
/// `externalIPs`.
fn set_addresses(spec: &mut ServiceSpec, type_: &str, addresses: &[String]) {
    if addresses.is_empty() {
        return;
    }
    match type_ {
        "LoadBalancer" => spec.load_balancer_ip = addresses.first().cloned(),
        "NodePort" => spec.external_ips = Some(addresses.to_vec()),
        _ => {
            spec.cluster_ip = addresses.first().cloned();
            spec.cluster_ips = Some(addresses.to_vec());
            if addresses.len() > 1 {
                spec.ip_family_policy = Some("RequireDualStack".into());
                spec.ip_families = Some(
                    addresses
                        .iter()
                        .map(|a| if a.contains(':') { "IPv6" } else { "IPv4" }.to_owned())
                        .collect(),
                );
            }
        }
    }
}

/// What the cluster shows that the writes of [`Placement::Gateway`] depend on.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Each Gateway's uid, by `(namespace, name)`: the owner of its Service and
    /// EndpointSlices. A Gateway not (yet) in the stores gets objects without an owner.
    pub gateway_uids: BTreeMap<(String, String), String>,
    /// The EndpointSlices Kubernetes keeps for the Services of the dataplanes' namespace
    /// (the backing Services' among them).
    pub backing_slices: Vec<EndpointSlice>,
}

/// What the writes make: every Service and mirrored EndpointSlice.
#[derive(Debug, Clone, Default)]
pub struct Desired {
    /// Gateway Services, and with [`Placement::Gateway`] the backing Services.
    pub services: Vec<Service>,
    /// With [`Placement::Gateway`]: the Gateway Services' EndpointSlices.
    pub slices: Vec<EndpointSlice>,
}

/// The ports of each Gateway: (namespace, name) → Service ports.
fn ports_by_gateway(
    listeners: &[(String, u16, &'static str)],
) -> BTreeMap<(String, String), Vec<ServicePort>> {
    let mut by_gateway: BTreeMap<(String, String), Vec<ServicePort>> = BTreeMap::new();
    for (id, target, kind) in listeners {
        let udp = *kind == "udp";
        let id = if udp {
            id.strip_suffix("/udp").unwrap_or(id)
        } else {
            id
        };
        let mut parts = id.rsplitn(3, '/');
        let (Some(port), Some(name), Some(ns)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Ok(port) = port.parse::<i32>() else {
            continue;
        };
        by_gateway
            .entry((ns.to_owned(), name.to_owned()))
            .or_default()
            .push(ServicePort {
                name: Some(format!("{kind}-{port}")),
                port,
                target_port: Some(IntOrString::Int(i32::from(*target))),
                protocol: Some(if udp { "UDP" } else { "TCP" }.into()),
                ..Default::default()
            });
    }
    by_gateway
}

/// The owner reference to Gateway `uid`.
fn gateway_owner(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "gateway.networking.k8s.io/v1".into(),
        kind: "Gateway".into(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// The Services `listeners` (id `<ns>/<gateway>/<port>` or `<ns>/<gateway>/<port>/udp`,
/// dataplane port, [`port_kind`]) ask for, and with [`Placement::Gateway`] their mirrored
/// EndpointSlices. Port names are `<kind>-<port>`; UDP ports have protocol `UDP` (a
/// Service mixing TCP and UDP needs Kubernetes 1.26 for `LoadBalancer`).
pub fn desired(
    listeners: &[(String, u16, &'static str)],
    cfg: &GatewayServices,
    infra: &BTreeMap<(String, String), GatewayInfra>,
    seen: &Seen,
) -> Desired {
    let none = GatewayInfra::default();
    let mut names = BTreeSet::new();
    let mut out = Desired::default();
    for ((ns, name), ports) in ports_by_gateway(listeners) {
        let key = (ns.clone(), name.clone());
        let i = infra.get(&key).unwrap_or(&none);
        if i.unusable {
            continue;
        }
        let svc_name = service_name(&ns, &name);
        // NB: two Gateways with one Service name take a SHA-256 collision; should it
        // happen, the first (by namespace/name) keeps the Service rather than both
        // overwriting it in turn.
        if !names.insert(svc_name.clone()) {
            tracing::error!(gateway = %format!("{ns}/{name}"), "Gateway Service name taken by another Gateway; no Service written");
            continue;
        }
        let mut labels = BTreeMap::from([(
            "app.kubernetes.io/managed-by".to_owned(),
            MANAGED_BY.to_owned(),
        )]);
        // NB: a label value holds at most 63 characters; a longer Gateway name is in the
        // annotation only.
        if name.len() <= 63 {
            labels.insert(GATEWAY_NAME_LABEL.into(), name.clone());
        }
        let annotations = BTreeMap::from([(GATEWAY_ANNOTATION.to_owned(), format!("{ns}/{name}"))]);
        if cfg.placement == Placement::Gateway {
            labels.insert(INSTALL_LABEL.into(), cfg.namespace.clone());
        }
        let owner = match cfg.placement {
            Placement::Gateway => seen
                .gateway_uids
                .get(&key)
                .map(|uid| vec![gateway_owner(&name, uid)]),
            Placement::Dataplane => None,
        };
        let mut spec = ServiceSpec {
            type_: Some(cfg.type_.clone()),
            ports: Some(ports.clone()),
            ..Default::default()
        };
        set_addresses(&mut spec, &cfg.type_, &i.addresses);
        if cfg.placement == Placement::Dataplane {
            spec.selector = Some(cfg.selector.clone());
        } else {
            let backing = backing_name(&ns, &name);
            out.services.push(Service {
                metadata: ObjectMeta {
                    name: Some(backing.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    labels: Some(labels.clone()),
                    annotations: Some(annotations.clone()),
                    ..Default::default()
                },
                spec: Some(ServiceSpec {
                    type_: Some("ClusterIP".into()),
                    cluster_ip: Some("None".into()),
                    selector: Some(cfg.selector.clone()),
                    ports: Some(ports.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            });
            out.slices.extend(mirror(
                &ns,
                &svc_name,
                &backing,
                &ports,
                &seen.backing_slices,
                &cfg.namespace,
                SliceMeta {
                    labels: &labels,
                    annotations: &annotations,
                    owner: &owner,
                },
            ));
        }
        let mut svc_labels = i.labels.clone();
        svc_labels.extend(labels);
        let mut svc_annotations = i.annotations.clone();
        svc_annotations.extend(annotations);
        out.services.push(Service {
            metadata: ObjectMeta {
                name: Some(svc_name),
                namespace: Some(cfg.service_namespace(&ns).to_owned()),
                labels: Some(svc_labels),
                annotations: Some(svc_annotations),
                owner_references: owner,
                ..Default::default()
            },
            spec: Some(spec),
            ..Default::default()
        });
    }
    out
}

/// What every mirrored EndpointSlice of a Gateway carries besides its own labels.
struct SliceMeta<'a> {
    labels: &'a BTreeMap<String, String>,
    annotations: &'a BTreeMap<String, String>,
    owner: &'a Option<Vec<OwnerReference>>,
}

/// The EndpointSlices of Service `svc` in namespace `ns` (one per address family, named
/// `<svc>-ipv4` and `<svc>-ipv6`): the endpoints of the slices Kubernetes keeps for the
/// backing Service `backing` in `backing_ns` (each address once, sorted, so an unchanged
/// set is an unchanged write), with `ports` as endpoint ports (name, protocol, the
/// dataplane port). A family without endpoints has no slice.
fn mirror(
    ns: &str,
    svc: &str,
    backing: &str,
    ports: &[ServicePort],
    slices: &[EndpointSlice],
    backing_ns: &str,
    meta: SliceMeta<'_>,
) -> Vec<EndpointSlice> {
    let SliceMeta {
        labels,
        annotations,
        owner,
    } = meta;
    let mut by_family: BTreeMap<&str, BTreeMap<String, Endpoint>> = BTreeMap::new();
    for s in slices.iter().filter(|s| {
        s.metadata.namespace.as_deref() == Some(backing_ns)
            && s.metadata.labels.as_ref().is_some_and(|l| {
                l.get(sluice_translate::SERVICE_NAME_LABEL)
                    .map(String::as_str)
                    == Some(backing)
            })
    }) {
        let family = match s.address_type.as_str() {
            "IPv4" => "IPv4",
            "IPv6" => "IPv6",
            _ => continue,
        };
        for e in &s.endpoints {
            let Some(first) = e.addresses.first() else {
                continue;
            };
            by_family
                .entry(family)
                .or_default()
                .entry(first.clone())
                .or_insert_with(|| Endpoint {
                    addresses: e.addresses.clone(),
                    conditions: e.conditions.clone(),
                    node_name: e.node_name.clone(),
                    zone: e.zone.clone(),
                    target_ref: e.target_ref.clone(),
                    ..Default::default()
                });
        }
    }
    let endpoint_ports: Vec<EndpointPort> = ports
        .iter()
        .map(|p| EndpointPort {
            name: p.name.clone(),
            protocol: p.protocol.clone(),
            port: match &p.target_port {
                Some(IntOrString::Int(n)) => Some(*n),
                _ => Some(p.port),
            },
            ..Default::default()
        })
        .collect();
    by_family
        .into_iter()
        .map(|(family, endpoints)| {
            let mut l = labels.clone();
            l.insert(sluice_translate::SERVICE_NAME_LABEL.into(), svc.to_owned());
            l.insert(SLICE_MANAGER_LABEL.into(), SLICE_MANAGER.into());
            EndpointSlice {
                metadata: ObjectMeta {
                    name: Some(format!("{svc}-{}", family.to_ascii_lowercase())),
                    namespace: Some(ns.to_owned()),
                    labels: Some(l),
                    annotations: Some(annotations.clone()),
                    owner_references: owner.clone(),
                    ..Default::default()
                },
                address_type: family.to_owned(),
                endpoints: endpoints.into_values().collect(),
                ports: Some(endpoint_ports.clone()),
            }
        })
        .collect()
}

/// One write to a Gateway Service or mirrored EndpointSlice (named by its [`Key`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Write {
    /// Server-side apply of this body.
    Apply(serde_json::Value),
    /// Delete it: its Gateway has no ports (or, a slice, no endpoints of its family).
    Delete,
}

/// The body of a server-side apply of `obj`.
fn apply_body<T: Serialize>(obj: &T, api_version: &str, kind: &str) -> serde_json::Value {
    // NB: these k8s-openapi types always serialize; `Null` would only mean a write every
    // pass.
    let mut body = serde_json::to_value(obj).unwrap_or_default();
    if let Some(o) = body.as_object_mut() {
        o.insert("apiVersion".into(), api_version.into());
        o.insert("kind".into(), kind.into());
    }
    body
}

/// Every write that makes the Services and mirrored EndpointSlices what `listeners` ask
/// for, given the keys of those labelled as Sluice's now (`existing`: Services labelled
/// [`MANAGED_BY`], EndpointSlices managed by [`SLICE_MANAGER`]).
pub fn desired_writes(
    listeners: &[(String, u16, &'static str)],
    cfg: &GatewayServices,
    infra: &BTreeMap<(String, String), GatewayInfra>,
    seen: &Seen,
    existing: &[Key],
) -> Vec<(Key, Write)> {
    let want = desired(listeners, cfg, infra, seen);
    let mut keep = BTreeSet::new();
    let mut out = Vec::new();
    let key_of = |kind, m: &ObjectMeta| {
        Key::new(
            kind,
            m.namespace.as_deref().unwrap_or_default(),
            m.name.as_deref().unwrap_or_default(),
        )
    };
    for svc in &want.services {
        let key = key_of("Service", &svc.metadata);
        out.push((key.clone(), Write::Apply(apply_body(svc, "v1", "Service"))));
        keep.insert(key);
    }
    for slice in &want.slices {
        let key = key_of("EndpointSlice", &slice.metadata);
        out.push((
            key.clone(),
            Write::Apply(apply_body(slice, "discovery.k8s.io/v1", "EndpointSlice")),
        ));
        keep.insert(key);
    }
    for k in existing.iter().filter(|k| !keep.contains(*k)) {
        out.push((k.clone(), Write::Delete));
    }
    out
}

impl GatewayServices {
    /// The keys of the Services and EndpointSlices Sluice keeps now: those in the
    /// dataplanes' namespace, and with [`Placement::Gateway`] those of this installation
    /// ([`INSTALL_LABEL`]) in every namespace.
    async fn existing(&self, ctx: &Context) -> Result<Vec<Key>, kube::Error> {
        let managed = format!("app.kubernetes.io/managed-by={MANAGED_BY}");
        let key = |kind, m: ObjectMeta| {
            Key::new(
                kind,
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default(),
            )
        };
        let here: Api<Service> = Api::namespaced(ctx.client.clone(), &self.namespace);
        let mut out: BTreeSet<Key> = here
            .list_metadata(&ListParams::default().labels(&managed))
            .await?
            .items
            .into_iter()
            .map(|s| key("Service", s.metadata))
            .collect();
        if self.placement == Placement::Gateway {
            let install = format!("{INSTALL_LABEL}={}", self.namespace);
            let services: Api<Service> = Api::all(ctx.client.clone());
            let ours = ListParams::default().labels(&format!("{managed},{install}"));
            out.extend(
                services
                    .list_metadata(&ours)
                    .await?
                    .items
                    .into_iter()
                    .map(|s| key("Service", s.metadata)),
            );
            let slices: Api<EndpointSlice> = Api::all(ctx.client.clone());
            let ours = ListParams::default()
                .labels(&format!("{SLICE_MANAGER_LABEL}={SLICE_MANAGER},{install}"));
            out.extend(
                slices
                    .list_metadata(&ours)
                    .await?
                    .items
                    .into_iter()
                    .map(|s| key("EndpointSlice", s.metadata)),
            );
        }
        Ok(out.into_iter().collect())
    }

    /// What [`Placement::Gateway`] reads: the Gateways' uids and the slices Kubernetes keeps
    /// in the dataplanes' namespace.
    async fn seen(&self, ctx: &Context, rebuilt: &Rebuilt) -> Result<Seen, kube::Error> {
        if self.placement == Placement::Dataplane {
            return Ok(Seen::default());
        }
        let gateway_uids = rebuilt
            .gateway
            .report
            .gateways
            .iter()
            .filter_map(|g| {
                let uid = ctx
                    .stores
                    .gateway(&g.namespace, &g.name)?
                    .metadata
                    .uid
                    .clone()?;
                Some(((g.namespace.clone(), g.name.clone()), uid))
            })
            .collect();
        let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &self.namespace);
        let backing_slices = api
            .list(
                &ListParams::default()
                    .labels(&format!("{SLICE_MANAGER_LABEL}={KUBE_SLICE_MANAGER}")),
            )
            .await?
            .items;
        Ok(Seen {
            gateway_uids,
            backing_slices,
        })
    }

    async fn apply_service(
        &self,
        api: &Api<Service>,
        name: &str,
        body: &serde_json::Value,
    ) -> Result<(), kube::Error> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match api.patch(name, &params, &Patch::Apply(body)).await {
            Ok(_) => Ok(()),
            // A new static address (or headless becoming not, or the reverse): `clusterIP`
            // cannot change in place, so the Service is made again (its Gateway was asked to
            // move address). (1.34 says "spec.clusterIPs[0]: Invalid value: ...: may not
            // change once set"; older releases "field is immutable".)
            Err(kube::Error::Api(e))
                if e.code == 422
                    && e.message.contains("spec.clusterIP")
                    && (e.message.contains("may not change")
                        || e.message.contains("immutable")) =>
            {
                // NB: the new address is tried first (a dry-run create under a generated
                // name), so an address the API server refuses leaves the Service, and its
                // Gateway, on the old one.
                let mut probe: Service =
                    serde_json::from_value(body.clone()).map_err(kube::Error::SerdeError)?;
                probe.metadata.name = None;
                probe.metadata.generate_name = Some("gw-probe-".into());
                let dry = PostParams {
                    dry_run: true,
                    ..Default::default()
                };
                api.create(&dry, &probe).await?;
                tracing::info!(service = %name, "Gateway Service re-created: its static address changed");
                api.delete(name, &DeleteParams::default()).await?;
                api.patch(name, &params, &Patch::Apply(body)).await?;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// Deletes `name` through `api`; already gone is done.
async fn delete<K>(api: &Api<K>, name: &str) -> Result<bool, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

impl Family for GatewayServices {
    type Write = Write;
    const NAME: &'static str = "gateway-services";
    const ERROR_SOURCE: &'static str = "gateway-service";
    // NB: a Service cannot be applied into a namespace that does not exist: that is a
    // failure to retry, not an object gone.
    const NOT_FOUND_IS_GONE: bool = false;

    fn wakeups(&self, ctx: &Context) -> Option<watch::Receiver<u64>> {
        (self.placement == Placement::Gateway)
            .then(|| watch_slices(ctx.client.clone(), &self.namespace))
    }

    async fn plan(
        &self,
        ctx: &Context,
        rebuilt: &Rebuilt,
    ) -> Result<Vec<(Key, Write)>, kube::Error> {
        let existing = self.existing(ctx).await?;
        let seen = self.seen(ctx, rebuilt).await?;
        let infra = infra_of(&rebuilt.gateway.report);
        Ok(desired_writes(
            &rebuilt.gateway.listeners,
            self,
            &infra,
            &seen,
            &existing,
        ))
    }

    async fn apply(&self, ctx: &Context, key: &Key, w: &Write) -> Result<(), kube::Error> {
        let name = &key.name;
        let ns = &key.namespace;
        match (key.kind, w) {
            ("EndpointSlice", Write::Apply(body)) => {
                let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), ns);
                let params = PatchParams::apply(FIELD_MANAGER).force();
                api.patch(name, &params, &Patch::Apply(body)).await?;
                tracing::debug!(slice = %name, namespace = %ns, "Gateway Service EndpointSlice written");
            }
            ("EndpointSlice", Write::Delete) => {
                let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), ns);
                delete(&api, name).await?;
            }
            (_, Write::Apply(body)) => {
                let api: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
                self.apply_service(&api, name, body).await?;
                tracing::info!(service = %name, namespace = %ns, "Gateway Service written");
            }
            (_, Write::Delete) => {
                let api: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
                if delete(&api, name).await? {
                    tracing::info!(service = %name, namespace = %ns, "Gateway Service deleted: its Gateway has no ports");
                }
            }
        }
        Ok(())
    }

    /// Service writes have no metric of their own.
    fn count(&self, _: &Metrics) {}
}

/// A counter bumped on every change of the EndpointSlices Kubernetes keeps in `namespace`
/// (a watch, retried with backoff while the receiver lives).
fn watch_slices(client: kube::Client, namespace: &str) -> watch::Receiver<u64> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let (tx, rx) = watch::channel(0u64);
    let api: Api<EndpointSlice> = Api::namespaced(client, namespace);
    let cfg =
        watcher::Config::default().labels(&format!("{SLICE_MANAGER_LABEL}={KUBE_SLICE_MANAGER}"));
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, cfg).default_backoff());
        while let Some(ev) = events.next().await {
            if tx.is_closed() {
                return;
            }
            match ev {
                Ok(
                    watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone,
                ) => {
                    tx.send_modify(|n| *n = n.wrapping_add(1));
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "watching the dataplanes' EndpointSlices"),
            }
        }
    });
    rx
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn cfg() -> GatewayServices {
        GatewayServices {
            namespace: "sluice".into(),
            selector: parse_selector("app=sluice,component=dataplane").unwrap(),
            type_: "ClusterIP".into(),
            placement: Placement::Dataplane,
        }
    }

    #[test]
    fn names_are_dns_labels_and_differ_per_gateway() {
        let long = "n".repeat(63);
        for (ns, name) in [
            ("default", "web"),
            ("a.b", "Web_1"),
            (long.as_str(), long.as_str()),
        ] {
            let n = service_name(ns, name);
            assert!(n.len() <= 63, "{n}");
            assert!(n.starts_with("gw-"), "{n}");
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{n}"
            );
            assert!(
                !n.contains("--") || ns.contains('.') || name.contains('_'),
                "{n}"
            );
        }
        assert_ne!(service_name("a-b", "c"), service_name("a", "b-c"));
    }

    /// Gateways in different namespaces never share a Service, even when the readable part
    /// of their names is the same: neighbours after cleaning (`a-b`/`c` vs `a`/`b-c`,
    /// `.` vs `-`), names that differ only past the cut, and a pair whose 32-bit FNV-1a
    /// hashes collide (what the names used to end in: found by trying 2^19 names).
    #[test]
    fn names_do_not_collide_across_namespaces() {
        let (ns47, ns48) = ("a".repeat(47), "a".repeat(48));
        let long = "x".repeat(60);
        let pairs = [
            (("a-b", "c"), ("a", "b-c")),
            (("team", "web.v1"), ("team", "web-v1")),
            ((ns47.as_str(), "gw355805"), (ns48.as_str(), "gx643100")),
            (("team-a", long.as_str()), ("team-b", long.as_str())),
            ((long.as_str(), "one"), (long.as_str(), "two")),
        ];
        for ((ns1, n1), (ns2, n2)) in pairs {
            let (a, b) = (service_name(ns1, n1), service_name(ns2, n2));
            assert_ne!(a, b, "{ns1}/{n1} and {ns2}/{n2}");
            assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        }
        // Each Gateway of such a pair gets its own Service.
        let want = desired(
            &[
                (format!("{ns47}/gw355805/80"), 20001, "http"),
                (format!("{ns48}/gx643100/80"), 20002, "http"),
            ],
            &cfg(),
            &BTreeMap::new(),
            &Seen::default(),
        )
        .services;
        let names: BTreeSet<_> = want.iter().map(|s| s.metadata.name.clone()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn one_service_per_gateway_with_its_ports() {
        let want = desired(
            &[
                ("default/web/80".into(), 20001, "http"),
                ("default/web/443".into(), 20002, "https"),
                ("other/api/8080".into(), 20003, "http"),
            ],
            &cfg(),
            &BTreeMap::new(),
            &Seen::default(),
        )
        .services;
        assert_eq!(want.len(), 2);
        let web = want
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some(&service_name("default", "web")))
            .unwrap();
        let spec = web.spec.as_ref().unwrap();
        let ports: Vec<(i32, Option<IntOrString>)> = spec
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| (p.port, p.target_port.clone()))
            .collect();
        assert_eq!(
            ports,
            vec![
                (80, Some(IntOrString::Int(20001))),
                (443, Some(IntOrString::Int(20002)))
            ]
        );
        assert_eq!(spec.selector.as_ref().unwrap()["component"], "dataplane");
        assert_eq!(web.metadata.namespace.as_deref(), Some("sluice"));
        assert_eq!(
            web.metadata.annotations.as_ref().unwrap()[GATEWAY_ANNOTATION],
            "default/web"
        );
        assert_eq!(
            web.metadata.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"],
            MANAGED_BY
        );
    }

    #[test]
    fn udp_ports_beside_tcp_ones_of_the_same_number() {
        let want = desired(
            &[
                ("default/dns/53".into(), 20001, "tcp"),
                ("default/dns/53/udp".into(), 20002, "udp"),
                ("default/dns/853".into(), 20003, "tls"),
            ],
            &cfg(),
            &BTreeMap::new(),
            &Seen::default(),
        )
        .services;
        assert_eq!(want.len(), 1, "one Service for the Gateway");
        let ports: Vec<(String, i32, String, Option<IntOrString>)> = want[0]
            .spec
            .as_ref()
            .unwrap()
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p.name.clone().unwrap(),
                    p.port,
                    p.protocol.clone().unwrap(),
                    p.target_port.clone(),
                )
            })
            .collect();
        let want_ports = |name: &str, port, proto: &str, target| {
            (
                name.to_owned(),
                port,
                proto.to_owned(),
                Some(IntOrString::Int(target)),
            )
        };
        assert_eq!(
            ports,
            vec![
                want_ports("tcp-53", 53, "TCP", 20001),
                want_ports("udp-53", 53, "UDP", 20002),
                want_ports("tls-853", 853, "TCP", 20003),
            ]
        );
    }

    /// `spec.infrastructure` labels and annotations reach the Gateway's Service beside
    /// Sluice's own (which win a clash); static addresses become its `clusterIPs` (a
    /// LoadBalancer's `loadBalancerIP`, a NodePort's `externalIPs`); a Gateway whose
    /// addresses cannot be used gets no Service.
    #[test]
    fn infrastructure_and_static_addresses_reach_the_service() {
        let key = |n: &str| ("infra".to_owned(), n.to_owned());
        let infra = BTreeMap::from([
            (
                key("static"),
                GatewayInfra {
                    labels: BTreeMap::from([
                        ("key2".into(), "value2".into()),
                        ("app.kubernetes.io/managed-by".into(), "someone-else".into()),
                    ]),
                    annotations: BTreeMap::from([
                        ("key1".into(), "value1".into()),
                        (GATEWAY_ANNOTATION.into(), "x/y".into()),
                    ]),
                    addresses: vec!["10.96.0.200".into()],
                    unusable: false,
                },
            ),
            (
                key("dual"),
                GatewayInfra {
                    addresses: vec!["10.96.0.201".into(), "fd00::c9".into()],
                    ..Default::default()
                },
            ),
            (
                key("unusable"),
                GatewayInfra {
                    unusable: true,
                    ..Default::default()
                },
            ),
        ]);
        let listeners = [
            ("infra/static/8080".into(), 20001, "http"),
            ("infra/dual/8081".into(), 20002, "http"),
            ("infra/unusable/8082".into(), 20003, "http"),
        ];
        let by_name = |svcs: &[Service], n: &str| {
            svcs.iter()
                .find(|s| s.metadata.name.as_deref() == Some(&service_name("infra", n)))
                .cloned()
        };
        let want = desired(&listeners, &cfg(), &infra, &Seen::default()).services;
        assert_eq!(want.len(), 2, "no Service for the unusable one");
        assert!(by_name(&want, "unusable").is_none());
        let s = by_name(&want, "static").unwrap();
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["key2"], "value2");
        assert_eq!(labels["app.kubernetes.io/managed-by"], MANAGED_BY);
        assert_eq!(labels[GATEWAY_NAME_LABEL], "static");
        let ann = s.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann["key1"], "value1");
        assert_eq!(ann[GATEWAY_ANNOTATION], "infra/static");
        let spec = s.spec.as_ref().unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.200"));
        assert_eq!(spec.cluster_ips, Some(vec!["10.96.0.200".to_owned()]));
        assert_eq!(spec.ip_family_policy, None);
        let d = by_name(&want, "dual").unwrap();
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(
            spec.cluster_ips,
            Some(vec!["10.96.0.201".to_owned(), "fd00::c9".to_owned()])
        );
        assert_eq!(spec.ip_family_policy.as_deref(), Some("RequireDualStack"));
        assert_eq!(
            spec.ip_families,
            Some(vec!["IPv4".to_owned(), "IPv6".to_owned()])
        );
        // Other Service types.
        for (type_, check) in [
            ("LoadBalancer", "loadBalancerIP"),
            ("NodePort", "externalIPs"),
        ] {
            let c = GatewayServices {
                type_: type_.into(),
                ..cfg()
            };
            let s = by_name(
                &desired(&listeners, &c, &infra, &Seen::default()).services,
                "static",
            )
            .unwrap();
            let spec = s.spec.unwrap();
            assert_eq!(spec.cluster_ip, None, "{type_}");
            match check {
                "loadBalancerIP" => {
                    assert_eq!(spec.load_balancer_ip.as_deref(), Some("10.96.0.200"))
                }
                _ => assert_eq!(spec.external_ips, Some(vec!["10.96.0.200".to_owned()])),
            }
        }
        // Without infrastructure or addresses nothing is set beyond ports.
        let plain = by_name(
            &desired(&listeners, &cfg(), &BTreeMap::new(), &Seen::default()).services,
            "static",
        )
        .unwrap();
        let spec = plain.spec.unwrap();
        assert_eq!((spec.cluster_ip, spec.cluster_ips), (None, None));
        assert_eq!(plain.metadata.labels.unwrap().len(), 2);
    }

    fn slice(ns: &str, service: &str, family: &str, endpoints: &[(&str, bool)]) -> EndpointSlice {
        use k8s_openapi::api::discovery::v1::EndpointConditions;
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(format!("{service}-{}", endpoints.len())),
                namespace: Some(ns.into()),
                labels: Some(BTreeMap::from([
                    (sluice_translate::SERVICE_NAME_LABEL.into(), service.into()),
                    (SLICE_MANAGER_LABEL.into(), KUBE_SLICE_MANAGER.into()),
                ])),
                ..Default::default()
            },
            address_type: family.into(),
            endpoints: endpoints
                .iter()
                .map(|(ip, ready)| Endpoint {
                    addresses: vec![(*ip).into()],
                    conditions: Some(EndpointConditions {
                        ready: Some(*ready),
                        ..Default::default()
                    }),
                    node_name: Some("node-1".into()),
                    ..Default::default()
                })
                .collect(),
            ports: None,
        }
    }

    /// With the Services in the Gateways' namespaces: a headless backing Service selects
    /// the dataplane pods in theirs; the Gateway's Service, owned by the Gateway, has no
    /// selector and EndpointSlices mirroring the backing Service's (readiness and node
    /// kept, each address once, one slice per family, ports named as the Service's and
    /// numbered as the dataplane's); other Services' slices are not mirrored; a slice no
    /// longer wanted is deleted.
    #[test]
    fn gateway_placement_mirrors_the_backing_slices() {
        let c = GatewayServices {
            placement: Placement::Gateway,
            ..cfg()
        };
        let backing = backing_name("apps", "web");
        let seen = Seen {
            gateway_uids: BTreeMap::from([(("apps".into(), "web".into()), "uid-web".into())]),
            backing_slices: vec![
                slice(
                    "sluice",
                    &backing,
                    "IPv4",
                    &[("10.1.0.2", true), ("10.1.0.3", false)],
                ),
                // A second slice of the same Service, repeating an address (as during a
                // rolling update).
                slice(
                    "sluice",
                    &backing,
                    "IPv4",
                    &[("10.1.0.2", true), ("10.1.0.4", true)],
                ),
                slice("sluice", &backing, "IPv6", &[("fd00::2", true)]),
                slice("sluice", "something-else", "IPv4", &[("10.1.0.9", true)]),
                slice("apps", &backing, "IPv4", &[("10.9.9.9", true)]),
            ],
        };
        let infra = BTreeMap::from([(
            ("apps".to_owned(), "web".to_owned()),
            GatewayInfra {
                labels: BTreeMap::from([("key2".into(), "value2".into())]),
                annotations: BTreeMap::from([("key1".into(), "value1".into())]),
                ..Default::default()
            },
        )]);
        let listeners = [
            ("apps/web/8080".to_owned(), 20001, "http"),
            ("apps/web/53/udp".to_owned(), 20002, "udp"),
        ];
        let want = desired(&listeners, &c, &infra, &seen);
        let svc = |ns: &str, name: &str| {
            want.services
                .iter()
                .find(|s| {
                    s.metadata.namespace.as_deref() == Some(ns)
                        && s.metadata.name.as_deref() == Some(name)
                })
                .cloned()
                .unwrap_or_else(|| panic!("no Service {ns}/{name} in {:?}", want.services))
        };
        assert_eq!(want.services.len(), 2);
        let b = svc("sluice", &backing);
        let bs = b.spec.as_ref().unwrap();
        assert_eq!(bs.cluster_ip.as_deref(), Some("None"), "headless");
        assert_eq!(bs.selector.as_ref().unwrap()["component"], "dataplane");
        assert!(!b.metadata.labels.as_ref().unwrap().contains_key("key2"));
        let face_name = service_name("apps", "web");
        let f = svc("apps", &face_name);
        let fs = f.spec.as_ref().unwrap();
        assert_eq!(fs.selector, None);
        assert_eq!(fs.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(fs.cluster_ip, None);
        let labels = f.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["key2"], "value2");
        assert_eq!(labels[GATEWAY_NAME_LABEL], "web");
        assert_eq!(f.metadata.annotations.as_ref().unwrap()["key1"], "value1");
        let owner = &f.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Gateway", "uid-web")
        );

        assert_eq!(want.slices.len(), 2, "{:?}", want.slices);
        let v4 = want
            .slices
            .iter()
            .find(|s| s.address_type == "IPv4")
            .unwrap();
        assert_eq!(
            v4.metadata.name.as_deref(),
            Some(format!("{face_name}-ipv4").as_str())
        );
        assert_eq!(v4.metadata.namespace.as_deref(), Some("apps"));
        let l = v4.metadata.labels.as_ref().unwrap();
        assert_eq!(l[INSTALL_LABEL], "sluice");
        assert_eq!(f.metadata.labels.as_ref().unwrap()[INSTALL_LABEL], "sluice");
        assert_eq!(l[sluice_translate::SERVICE_NAME_LABEL], face_name);
        assert_eq!(l[SLICE_MANAGER_LABEL], SLICE_MANAGER);
        assert_eq!(
            v4.metadata.owner_references.as_ref().unwrap()[0].uid,
            "uid-web"
        );
        let eps: Vec<(String, Option<bool>, Option<String>)> = v4
            .endpoints
            .iter()
            .map(|e| {
                (
                    e.addresses[0].clone(),
                    e.conditions.as_ref().and_then(|c| c.ready),
                    e.node_name.clone(),
                )
            })
            .collect();
        let node = Some("node-1".to_owned());
        assert_eq!(
            eps,
            vec![
                ("10.1.0.2".into(), Some(true), node.clone()),
                ("10.1.0.3".into(), Some(false), node.clone()),
                ("10.1.0.4".into(), Some(true), node.clone()),
            ]
        );
        let ports: Vec<(Option<String>, Option<i32>, Option<String>)> = v4
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| (p.name.clone(), p.port, p.protocol.clone()))
            .collect();
        assert_eq!(
            ports,
            vec![
                (Some("http-8080".into()), Some(20001), Some("TCP".into())),
                (Some("udp-53".into()), Some(20002), Some("UDP".into())),
            ]
        );
        let v6 = want
            .slices
            .iter()
            .find(|s| s.address_type == "IPv6")
            .unwrap();
        assert_eq!(v6.endpoints.len(), 1);

        // Once the IPv6 endpoints are gone, their slice is deleted; a Gateway without
        // ports loses its Service in its namespace and its backing Service.
        let seen4 = Seen {
            backing_slices: seen.backing_slices[..2].to_vec(),
            ..seen.clone()
        };
        let existing = [
            Key::new("EndpointSlice", "apps", &format!("{face_name}-ipv4")),
            Key::new("EndpointSlice", "apps", &format!("{face_name}-ipv6")),
            Key::new("Service", "apps", &face_name),
            Key::new("Service", "sluice", &backing),
            Key::new("Service", "old", &service_name("old", "gone")),
            Key::new("Service", "sluice", &backing_name("old", "gone")),
        ];
        let writes = desired_writes(&listeners, &c, &infra, &seen4, &existing);
        let deleted: Vec<&Key> = writes
            .iter()
            .filter(|(_, w)| *w == Write::Delete)
            .map(|(k, _)| k)
            .collect();
        assert_eq!(deleted, vec![&existing[1], &existing[4], &existing[5]]);
        let slice_body = writes
            .iter()
            .find(|(k, _)| *k == existing[0])
            .map(|(_, w)| w.clone())
            .unwrap();
        let Write::Apply(body) = slice_body else {
            panic!("{slice_body:?}")
        };
        assert_eq!(body["apiVersion"], "discovery.k8s.io/v1");
        assert_eq!(body["kind"], "EndpointSlice");
    }

    #[test]
    fn selectors_must_name_labels() {
        assert!(parse_selector("").is_err());
        assert!(parse_selector("novalue").is_err());
        assert!(parse_selector("=x").is_err());
    }

    #[test]
    fn services_of_gateways_without_ports_are_deleted() {
        let web = service_name("default", "web");
        let gone = service_name("default", "gone");
        let writes = desired_writes(
            &[("default/web/80".into(), 20001, "http")],
            &cfg(),
            &BTreeMap::new(),
            &Seen::default(),
            &[
                Key::new("Service", "sluice", &web),
                Key::new("Service", "sluice", &gone),
            ],
        );
        let keys: Vec<(&str, &str)> = writes
            .iter()
            .map(|(k, w)| {
                let what = match w {
                    Write::Apply(_) => "apply",
                    Write::Delete => "delete",
                };
                (k.name.as_str(), what)
            })
            .collect();
        assert_eq!(
            keys,
            vec![(web.as_str(), "apply"), (gone.as_str(), "delete")]
        );
        let Write::Apply(body) = &writes[0].1 else {
            panic!("{writes:?}")
        };
        assert_eq!(body["apiVersion"], "v1");
        assert_eq!(body["kind"], "Service");
        assert_eq!(writes[0].0.namespace, "sluice");
    }
}
