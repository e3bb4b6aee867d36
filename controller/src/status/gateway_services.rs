//! One Service per Gateway (leader only), with `--gateway-service-namespace`: each Gateway
//! gets its own address, as Envoy Gateway gives each Gateway its own Service.
//!
//! Translation gives each port of each accepted Gateway a port of the dataplanes
//! (`Snapshot.listeners`, from `--gateway-listener-ports`). This task keeps, in the
//! dataplanes' namespace, one Service per such Gateway: its ports are the Gateway's
//! listener ports, each targeting the dataplane port translation chose, its selector the
//! dataplane pods' labels (`--gateway-service-selector`), its type
//! `--gateway-service-type`. The Gateway's `status.addresses` are that Service's address
//! (see [`super::gateway`]).
//!
//! - Services are written with server-side apply under [`FIELD_MANAGER`] and labelled
//!   [`MANAGED_BY`]; one whose Gateway no longer has ports is deleted. Services without the
//!   label are never touched.
//! - A Service cannot be owned by a Gateway in another namespace (owner references do not
//!   cross namespaces), so the annotation [`GATEWAY_ANNOTATION`] names it (`ns/name`; a
//!   label value could not hold a long name).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde::Serialize;

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

/// Where and how Gateway Services are made (`--gateway-service-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayServices {
    /// Namespace of the dataplane pods, where the Services live.
    pub namespace: String,
    /// Labels of the dataplane pods.
    pub selector: BTreeMap<String, String>,
    /// `ClusterIP`, `NodePort` or `LoadBalancer`.
    pub type_: String,
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
    let mut readable = format!("gw-{}-{}", clean(ns), clean(name));
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

/// The Services `listeners` (id `<ns>/<gateway>/<port>` or `<ns>/<gateway>/<port>/udp`,
/// dataplane port, [`port_kind`]) ask for. Port names are `<kind>-<port>`; UDP ports have
/// protocol `UDP` (a Service mixing TCP and UDP needs Kubernetes 1.26 for `LoadBalancer`).
pub fn desired(
    listeners: &[(String, u16, &'static str)],
    cfg: &GatewayServices,
    infra: &BTreeMap<(String, String), GatewayInfra>,
) -> Vec<Service> {
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
    let none = GatewayInfra::default();
    let mut names = BTreeSet::new();
    by_gateway
        .into_iter()
        .filter(|(key, _)| !infra.get(key).is_some_and(|i| i.unusable))
        .filter(|(key, _)| {
            // NB: two Gateways with one Service name take a SHA-256 collision; should it
            // happen, the first (by namespace/name) keeps the Service rather than both
            // overwriting it in turn.
            let fresh = names.insert(service_name(&key.0, &key.1));
            if !fresh {
                tracing::error!(gateway = %format!("{}/{}", key.0, key.1), "Gateway Service name taken by another Gateway; no Service written");
            }
            fresh
        })
        .map(|((ns, name), ports)| {
            let i = infra.get(&(ns.clone(), name.clone())).unwrap_or(&none);
            let mut labels = i.labels.clone();
            labels.insert("app.kubernetes.io/managed-by".into(), MANAGED_BY.into());
            // NB: a label value holds at most 63 characters; a longer Gateway name is in
            // the annotation only.
            if name.len() <= 63 {
                labels.insert(GATEWAY_NAME_LABEL.into(), name.clone());
            }
            let mut annotations = i.annotations.clone();
            annotations.insert(GATEWAY_ANNOTATION.into(), format!("{ns}/{name}"));
            let mut spec = ServiceSpec {
                type_: Some(cfg.type_.clone()),
                selector: Some(cfg.selector.clone()),
                ports: Some(ports),
                ..Default::default()
            };
            set_addresses(&mut spec, &cfg.type_, &i.addresses);
            Service {
                metadata: ObjectMeta {
                    name: Some(service_name(&ns, &name)),
                    namespace: Some(cfg.namespace.clone()),
                    labels: Some(labels),
                    annotations: Some(annotations),
                    ..Default::default()
                },
                spec: Some(spec),
                ..Default::default()
            }
        })
        .collect()
}

/// One write to a Gateway Service (named by its [`Key`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Write {
    /// Server-side apply of this body.
    Apply(serde_json::Value),
    /// Delete it: its Gateway has no ports.
    Delete,
}

/// Every write that makes the Services in `cfg.namespace` what `listeners` ask for, given
/// the names of the Services labelled [`MANAGED_BY`] there now (`existing`).
pub fn desired_writes(
    listeners: &[(String, u16, &'static str)],
    cfg: &GatewayServices,
    infra: &BTreeMap<(String, String), GatewayInfra>,
    existing: &[String],
) -> Vec<(Key, Write)> {
    let mut keep = BTreeSet::new();
    let mut out = Vec::new();
    for svc in desired(listeners, cfg, infra) {
        let name = svc.metadata.name.clone().unwrap_or_default();
        // NB: a `Service` always serializes; `Null` would only mean a write every pass.
        let mut body = serde_json::to_value(&svc).unwrap_or_default();
        if let Some(obj) = body.as_object_mut() {
            obj.insert("apiVersion".into(), "v1".into());
            obj.insert("kind".into(), "Service".into());
        }
        out.push((
            Key::new("Service", &cfg.namespace, &name),
            Write::Apply(body),
        ));
        keep.insert(name);
    }
    for name in existing.iter().filter(|n| !keep.contains(*n)) {
        out.push((Key::new("Service", &cfg.namespace, name), Write::Delete));
    }
    out
}

impl Family for GatewayServices {
    type Write = Write;
    const NAME: &'static str = "gateway-services";
    const ERROR_SOURCE: &'static str = "gateway-service";
    // NB: a Service cannot be applied into a namespace that does not exist: that is a
    // failure to retry, not an object gone.
    const NOT_FOUND_IS_GONE: bool = false;

    async fn plan(
        &self,
        ctx: &Context,
        rebuilt: &Rebuilt,
    ) -> Result<Vec<(Key, Write)>, kube::Error> {
        let api: Api<Service> = Api::namespaced(ctx.client.clone(), &self.namespace);
        let managed = format!("app.kubernetes.io/managed-by={MANAGED_BY}");
        let existing: Vec<String> = api
            .list_metadata(&ListParams::default().labels(&managed))
            .await?
            .items
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect();
        let infra = infra_of(&rebuilt.gateway.report);
        Ok(desired_writes(
            &rebuilt.gateway.listeners,
            self,
            &infra,
            &existing,
        ))
    }

    async fn apply(&self, ctx: &Context, key: &Key, w: &Write) -> Result<(), kube::Error> {
        let api: Api<Service> = Api::namespaced(ctx.client.clone(), &self.namespace);
        let name = &key.name;
        match w {
            Write::Apply(body) => {
                let params = PatchParams::apply(FIELD_MANAGER).force();
                match api.patch(name, &params, &Patch::Apply(body)).await {
                    Ok(_) => {}
                    // A new static address: `clusterIP` cannot change in place, so the
                    // Service is made again (its Gateway was asked to move address).
                    // (1.34 says "spec.clusterIPs[0]: Invalid value: ...: may not change
                    // once set"; older releases "field is immutable".)
                    Err(kube::Error::Api(e))
                        if e.code == 422
                            && e.message.contains("spec.clusterIP")
                            && (e.message.contains("may not change")
                                || e.message.contains("immutable")) =>
                    {
                        // NB: the new address is tried first (a dry-run create under a
                        // generated name), so an address the API server refuses leaves the
                        // Service, and its Gateway, on the old one.
                        let mut probe: Service = serde_json::from_value(body.clone())
                            .map_err(kube::Error::SerdeError)?;
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
                    }
                    Err(e) => return Err(e),
                }
                tracing::info!(service = %name, namespace = %self.namespace, "Gateway Service written");
            }
            Write::Delete => match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {
                    tracing::info!(service = %name, "Gateway Service deleted: its Gateway has no ports")
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            },
        }
        Ok(())
    }

    /// Service writes have no metric of their own.
    fn count(&self, _: &Metrics) {}
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
        );
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
        );
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
        );
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
        let want = desired(&listeners, &cfg(), &infra);
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
            let s = by_name(&desired(&listeners, &c, &infra), "static").unwrap();
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
        let plain = by_name(&desired(&listeners, &cfg(), &BTreeMap::new()), "static").unwrap();
        let spec = plain.spec.unwrap();
        assert_eq!((spec.cluster_ip, spec.cluster_ips), (None, None));
        assert_eq!(plain.metadata.labels.unwrap().len(), 2);
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
            &[web.clone(), gone.clone()],
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
