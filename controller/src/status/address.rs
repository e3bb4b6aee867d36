//! Where the address clients should use comes from, for Ingress `status.loadBalancer` and
//! Gateway `status.addresses`: `--ingress-status-address` (fixed IPs or host names) or
//! `--ingress-publish-service NS/NAME`, the dataplane's Service: its load-balancer ingress
//! points, else its external IPs, else its cluster IP (ExternalName: its external name), as
//! the APISIX and NGINX ingress controllers do.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::IngressLoadBalancerIngress;
use kube::{Api, Client};

use crate::watch::Stores;

/// Where the published address comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Publish {
    /// Fixed addresses: IPs, or host names (`--ingress-status-address`).
    Addresses(Vec<String>),
    /// The address of this Service (`--ingress-publish-service NS/NAME`).
    Service {
        /// Namespace of the Service.
        namespace: String,
        /// Name of the Service.
        name: String,
    },
}

/// Why a `--ingress-publish-service` value is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("--ingress-publish-service {0:?}: expected NAMESPACE/NAME")]
pub struct BadServiceRef(pub String);

impl Publish {
    /// Parses `NAMESPACE/NAME`.
    pub fn service(value: &str) -> Result<Self, BadServiceRef> {
        match value.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self::Service {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(BadServiceRef(value.to_owned())),
        }
    }
}

/// Load-balancer entries for fixed addresses: an IP goes to `ip`, anything else to
/// `hostname`.
pub fn from_addresses(addrs: &[String]) -> Vec<IngressLoadBalancerIngress> {
    addrs
        .iter()
        .map(|a| match a.parse::<IpAddr>() {
            Ok(_) => IngressLoadBalancerIngress {
                ip: Some(a.clone()),
                ..Default::default()
            },
            Err(_) => IngressLoadBalancerIngress {
                hostname: Some(a.clone()),
                ..Default::default()
            },
        })
        .collect()
}

/// Load-balancer entries for a Service.
pub fn from_service(svc: &Service) -> Vec<IngressLoadBalancerIngress> {
    let spec = svc.spec.as_ref();
    if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
        let name = spec.and_then(|s| s.external_name.clone());
        return from_addresses(&name.into_iter().collect::<Vec<_>>());
    }
    let lb: Vec<IngressLoadBalancerIngress> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|points| {
            points
                .iter()
                .filter(|p| p.ip.is_some() || p.hostname.is_some())
                .map(|p| IngressLoadBalancerIngress {
                    ip: p.ip.clone(),
                    hostname: p.hostname.clone(),
                    ..Default::default()
                })
                .collect()
        })
        .unwrap_or_default();
    if !lb.is_empty() {
        return lb;
    }
    let external = spec
        .and_then(|s| s.external_ips.clone())
        .unwrap_or_default();
    if !external.is_empty() {
        return from_addresses(&external);
    }
    let cluster_ip = spec
        .and_then(|s| s.cluster_ip.clone())
        .filter(|ip| !ip.is_empty() && ip != "None");
    from_addresses(&cluster_ip.into_iter().collect::<Vec<_>>())
}

/// The address entries of `publish` now; `None` when the publish Service is unreadable.
pub(crate) async fn published(
    client: &Client,
    publish: &Publish,
    stores: &Stores,
) -> Option<Vec<IngressLoadBalancerIngress>> {
    match publish {
        Publish::Addresses(a) => Some(from_addresses(a)),
        Publish::Service { namespace, name } => {
            if let Some(svc) = stores.service(namespace, name) {
                return Some(from_service(&svc));
            }
            // Outside the watched namespaces: ask the API server.
            match Api::<Service>::namespaced(client.clone(), namespace)
                .get(name)
                .await
            {
                Ok(svc) => Some(from_service(&svc)),
                Err(e) => {
                    tracing::warn!(service = %format!("{namespace}/{name}"), error = %e, "publish service not readable; Ingress status not written");
                    None
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, ServiceSpec, ServiceStatus,
    };

    fn svc(type_: &str, cluster_ip: &str, external: &[&str], lb: &[(&str, &str)]) -> Service {
        Service {
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                cluster_ip: Some(cluster_ip.into()),
                external_ips: (!external.is_empty())
                    .then(|| external.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            }),
            status: Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(
                        lb.iter()
                            .map(|(ip, host)| LoadBalancerIngress {
                                ip: (!ip.is_empty()).then(|| ip.to_string()),
                                hostname: (!host.is_empty()).then(|| host.to_string()),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ips(v: &[IngressLoadBalancerIngress]) -> Vec<String> {
        v.iter()
            .map(|p| p.ip.clone().or(p.hostname.clone()).unwrap())
            .collect()
    }

    #[test]
    fn service_address_prefers_load_balancer_then_external_then_cluster_ip() {
        let s = svc(
            "LoadBalancer",
            "10.0.0.1",
            &["192.0.2.9"],
            &[("203.0.113.5", ""), ("", "lb.example.com")],
        );
        assert_eq!(ips(&from_service(&s)), ["203.0.113.5", "lb.example.com"]);
        let s = svc("LoadBalancer", "10.0.0.1", &["192.0.2.9"], &[]);
        assert_eq!(ips(&from_service(&s)), ["192.0.2.9"]);
        let s = svc("ClusterIP", "10.0.0.1", &[], &[]);
        assert_eq!(ips(&from_service(&s)), ["10.0.0.1"]);
        let s = svc("ClusterIP", "None", &[], &[]);
        assert!(from_service(&s).is_empty(), "headless");
    }

    #[test]
    fn fixed_addresses_split_into_ip_and_hostname() {
        let v = from_addresses(&[
            "192.0.2.1".into(),
            "ingress.example.com".into(),
            "2001:db8::1".into(),
        ]);
        assert_eq!(v[0].ip.as_deref(), Some("192.0.2.1"));
        assert_eq!(v[1].hostname.as_deref(), Some("ingress.example.com"));
        assert_eq!(v[2].ip.as_deref(), Some("2001:db8::1"));
    }

    #[test]
    fn publish_service_must_be_namespace_slash_name() {
        assert_eq!(
            Publish::service("sluice/dataplane").unwrap(),
            Publish::Service {
                namespace: "sluice".into(),
                name: "dataplane".into()
            }
        );
        for bad in ["dataplane", "/x", "x/", "a/b/c"] {
            assert!(Publish::service(bad).is_err(), "{bad}");
        }
    }
}
