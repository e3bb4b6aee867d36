//! Assembling the [`ClusterState`] that translation sees from the reflector stores, keeping
//! only the objects of our ingress class.
//!
//! An object is ours when
//!
//! - its `spec.ingressClassName` is our class (`--ingress-class`, default `apisix` so that
//!   manifests written for the APISIX ingress controller work unchanged), or
//! - (Ingress only) it has no `spec.ingressClassName` and its legacy
//!   `kubernetes.io/ingress.class` annotation is our class, or
//! - it names no class at all and the IngressClass named after our class carries
//!   `ingressclass.kubernetes.io/is-default-class: "true"`.
//!
//! Objects of other classes are left out entirely: no snapshot entry and no status (another
//! controller owns them). Services, EndpointSlices, Secrets and ConfigMaps have no class and
//! are all kept, and so are Pods (metadata only); translation only looks at the ones our routes
//! reference.
//!
//! The Gateway API kinds have no ingress class: they are all kept, and translation decides
//! which Gateways are ours by their GatewayClass's `controllerName`
//! (`--gateway-controller-name`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::Resource;
use kube::core::PartialObjectMeta;
use sluice_crds::gateway::{
    BackendTLSPolicy, GRPCRoute, Gateway, GatewayClass, HTTPRoute, ListenerSet, ReferenceGrant,
    TCPRoute, TLSRoute, UDPRoute,
};
use sluice_crds::{
    ApisixConsumer, ApisixGlobalRule, ApisixPluginConfig, ApisixRoute, ApisixTls, ApisixUpstream,
};
use sluice_translate::ClusterState;

/// Annotation that makes an IngressClass the cluster's default.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";
/// Legacy Ingress annotation naming the class, honoured when `spec.ingressClassName` is unset.
pub const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
/// Default of `--ingress-class`: what APISIX users' manifests say.
pub const DEFAULT_INGRESS_CLASS: &str = "apisix";

/// Everything the reflector stores hold, as shared pointers (cheap to take).
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// ApisixRoutes.
    pub apisix_routes: Vec<Arc<ApisixRoute>>,
    /// ApisixUpstreams.
    pub apisix_upstreams: Vec<Arc<ApisixUpstream>>,
    /// ApisixTlses.
    pub apisix_tlses: Vec<Arc<ApisixTls>>,
    /// ApisixPluginConfigs.
    pub apisix_plugin_configs: Vec<Arc<ApisixPluginConfig>>,
    /// ApisixConsumers.
    pub apisix_consumers: Vec<Arc<ApisixConsumer>>,
    /// ApisixGlobalRules.
    pub apisix_global_rules: Vec<Arc<ApisixGlobalRule>>,
    /// Services.
    pub services: Vec<Arc<Service>>,
    /// EndpointSlices.
    pub endpoint_slices: Vec<Arc<EndpointSlice>>,
    /// Secrets.
    pub secrets: Vec<Arc<Secret>>,
    /// Pods, metadata only (name, namespace, labels): for ApisixUpstream subsets.
    pub pods: Vec<Arc<PartialObjectMeta<Pod>>>,
    /// Ingresses.
    pub ingresses: Vec<Arc<Ingress>>,
    /// IngressClasses.
    pub ingress_classes: Vec<Arc<IngressClass>>,
    /// Namespaces, metadata only (name, labels): for `allowedRoutes.namespaces.selector`.
    pub namespaces: Vec<Arc<PartialObjectMeta<Namespace>>>,
    /// GatewayClasses (empty when the Gateway API is not installed).
    pub gateway_classes: Vec<Arc<GatewayClass>>,
    /// Gateways.
    pub gateways: Vec<Arc<Gateway>>,
    /// ListenerSets.
    pub listener_sets: Vec<Arc<ListenerSet>>,
    /// HTTPRoutes.
    pub http_routes: Vec<Arc<HTTPRoute>>,
    /// GRPCRoutes.
    pub grpc_routes: Vec<Arc<GRPCRoute>>,
    /// TLSRoutes.
    pub tls_routes: Vec<Arc<TLSRoute>>,
    /// TCPRoutes.
    pub tcp_routes: Vec<Arc<TCPRoute>>,
    /// UDPRoutes.
    pub udp_routes: Vec<Arc<UDPRoute>>,
    /// ReferenceGrants.
    pub reference_grants: Vec<Arc<ReferenceGrant>>,
    /// BackendTLSPolicies.
    pub backend_tls_policies: Vec<Arc<BackendTLSPolicy>>,
    /// ConfigMaps (CA bundles of BackendTLSPolicy and Gateway frontend validation; watched
    /// with the Gateway API).
    pub config_maps: Vec<Arc<ConfigMap>>,
}

/// Decides which objects belong to this controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassFilter {
    /// Our class name (`--ingress-class`).
    pub class: String,
    /// Whether objects that name no class are ours (our IngressClass is the default).
    pub unclassed_are_ours: bool,
}

impl ClassFilter {
    /// The filter for `class`, given the IngressClasses in the cluster.
    pub fn new(class: &str, ingress_classes: &[Arc<IngressClass>]) -> Self {
        let unclassed_are_ours = ingress_classes.iter().any(|ic| {
            ic.metadata.name.as_deref() == Some(class)
                && ic
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                    .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        });
        Self {
            class: class.to_owned(),
            unclassed_are_ours,
        }
    }

    /// Whether an object with `spec.ingressClassName = class` is ours.
    pub fn selects(&self, class: Option<&str>) -> bool {
        match class.filter(|c| !c.is_empty()) {
            Some(c) => c == self.class,
            None => self.unclassed_are_ours,
        }
    }

    /// Whether an Ingress is ours (`spec.ingressClassName`, else the legacy annotation).
    pub fn selects_ingress(&self, ingress: &Ingress) -> bool {
        self.selects(ingress_class(ingress))
    }
}

/// The class an Ingress names: `spec.ingressClassName`, else the legacy annotation.
fn ingress_class(ingress: &Ingress) -> Option<&str> {
    ingress
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
        .filter(|c| !c.is_empty())
        .or_else(|| {
            ingress
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION))
                .map(String::as_str)
                .filter(|c| !c.is_empty())
        })
}

fn owned<K: Clone>(list: &[Arc<K>], keep: impl Fn(&K) -> bool) -> Vec<K> {
    list.iter()
        .filter(|o| keep(o))
        .map(|o| K::clone(o))
        .collect()
}

fn all<K: Clone>(list: &[Arc<K>]) -> Vec<K> {
    owned(list, |_| true)
}

/// The state translation sees: our objects only, every Service, EndpointSlice, Secret and Pod,
/// and every Gateway API object (see the module doc).
pub fn assemble(inputs: &Inputs, class: &str) -> ClusterState {
    assemble_with(inputs, class, &[])
}

/// Like [`assemble`], with the Ingresses of `nginx_classes` too (served in ingress-nginx's
/// place, `--ingress-nginx-class`).
pub fn assemble_with(inputs: &Inputs, class: &str, nginx_classes: &[String]) -> ClusterState {
    let filter = ClassFilter::new(class, &inputs.ingress_classes);
    let f = &filter;
    let nginx =
        |o: &Ingress| ingress_class(o).is_some_and(|c| nginx_classes.iter().any(|n| n == c));
    ClusterState {
        apisix_routes: owned(&inputs.apisix_routes, |o| {
            f.selects(o.spec.ingress_class_name.as_deref())
        }),
        apisix_upstreams: owned(&inputs.apisix_upstreams, |o| {
            f.selects(o.spec.ingress_class_name.as_deref())
        }),
        apisix_tlses: owned(&inputs.apisix_tlses, |o| {
            f.selects(o.spec.ingress_class_name.as_deref())
        }),
        apisix_plugin_configs: owned(&inputs.apisix_plugin_configs, |o| {
            f.selects(o.spec.ingress_class_name.as_deref())
        }),
        apisix_consumers: owned(&inputs.apisix_consumers, |o| {
            f.selects(o.spec.ingress_class_name.as_deref())
        }),
        apisix_global_rules: owned(&inputs.apisix_global_rules, |o| {
            f.selects(o.spec.ingress_class_name.as_deref())
        }),
        services: all(&inputs.services),
        endpoint_slices: all(&inputs.endpoint_slices),
        secrets: all(&inputs.secrets),
        pods: all(&inputs.pods),
        ingresses: owned(&inputs.ingresses, |o| f.selects_ingress(o) || nginx(o)),
        ingress_classes: owned(&inputs.ingress_classes, |o| {
            o.meta().name.as_deref() == Some(class)
        }),
        namespaces: all(&inputs.namespaces),
        gateway_classes: all(&inputs.gateway_classes),
        gateways: all(&inputs.gateways),
        listener_sets: all(&inputs.listener_sets),
        http_routes: all(&inputs.http_routes),
        grpc_routes: all(&inputs.grpc_routes),
        tls_routes: all(&inputs.tls_routes),
        tcp_routes: all(&inputs.tcp_routes),
        udp_routes: all(&inputs.udp_routes),
        reference_grants: all(&inputs.reference_grants),
        backend_tls_policies: all(&inputs.backend_tls_policies),
        config_maps: all(&inputs.config_maps),
    }
}

/// Splits a [`ClusterState`] (e.g. loaded from YAML in tests) into [`Inputs`].
impl From<ClusterState> for Inputs {
    fn from(s: ClusterState) -> Self {
        fn arcs<K>(v: Vec<K>) -> Vec<Arc<K>> {
            v.into_iter().map(Arc::new).collect()
        }
        Self {
            apisix_routes: arcs(s.apisix_routes),
            apisix_upstreams: arcs(s.apisix_upstreams),
            apisix_tlses: arcs(s.apisix_tlses),
            apisix_plugin_configs: arcs(s.apisix_plugin_configs),
            apisix_consumers: arcs(s.apisix_consumers),
            apisix_global_rules: arcs(s.apisix_global_rules),
            services: arcs(s.services),
            endpoint_slices: arcs(s.endpoint_slices),
            secrets: arcs(s.secrets),
            pods: arcs(s.pods),
            ingresses: arcs(s.ingresses),
            ingress_classes: arcs(s.ingress_classes),
            namespaces: arcs(s.namespaces),
            gateway_classes: arcs(s.gateway_classes),
            gateways: arcs(s.gateways),
            listener_sets: arcs(s.listener_sets),
            http_routes: arcs(s.http_routes),
            grpc_routes: arcs(s.grpc_routes),
            tls_routes: arcs(s.tls_routes),
            tcp_routes: arcs(s.tcp_routes),
            udp_routes: arcs(s.udp_routes),
            reference_grants: arcs(s.reference_grants),
            backend_tls_policies: arcs(s.backend_tls_policies),
            config_maps: arcs(s.config_maps),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn inputs(yaml: &str) -> Inputs {
        let mut state = ClusterState::default();
        let report = state.load_yaml("test.yaml", yaml).unwrap();
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        state.into()
    }

    fn names<K: Resource>(list: &[K]) -> Vec<String> {
        let mut v: Vec<String> = list
            .iter()
            .map(|o| o.meta().name.clone().unwrap_or_default())
            .collect();
        v.sort();
        v
    }

    const ROUTES: &str = r#"
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {name: ours}
spec:
  ingressClassName: apisix
  http:
  - name: r
    match: {paths: ["/a"]}
    backends: [{serviceName: svc, servicePort: 80}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {name: theirs}
spec:
  ingressClassName: nginx
  http:
  - name: r
    match: {paths: ["/b"]}
    backends: [{serviceName: svc, servicePort: 80}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {name: unclassed}
spec:
  http:
  - name: r
    match: {paths: ["/c"]}
    backends: [{serviceName: svc, servicePort: 80}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixUpstream
metadata: {name: svc}
spec:
  ingressClassName: nginx
  retries: 2
---
apiVersion: v1
kind: Service
metadata: {name: svc}
spec:
  ports: [{port: 80}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: ing-spec}
spec:
  ingressClassName: apisix
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: ing-annotation
  annotations: {kubernetes.io/ingress.class: apisix}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: ing-other}
spec:
  ingressClassName: nginx
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: ing-unclassed}
"#;

    #[test]
    fn only_our_class_is_kept_when_we_are_not_the_default() {
        let state = assemble(&inputs(ROUTES), "apisix");
        assert_eq!(names(&state.apisix_routes), ["ours"]);
        assert!(state.apisix_upstreams.is_empty(), "other class left out");
        assert_eq!(names(&state.services), ["svc"], "Services have no class");
        assert_eq!(names(&state.ingresses), ["ing-annotation", "ing-spec"]);
    }

    #[test]
    fn unclassed_objects_are_ours_when_our_ingress_class_is_the_default() {
        let yaml = format!(
            "{ROUTES}---\napiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: apisix\n  annotations: {{ingressclass.kubernetes.io/is-default-class: \"true\"}}\nspec: {{controller: apisix.apache.org/apisix-ingress-controller}}\n"
        );
        let state = assemble(&inputs(&yaml), "apisix");
        assert_eq!(names(&state.apisix_routes), ["ours", "unclassed"]);
        assert_eq!(
            names(&state.ingresses),
            ["ing-annotation", "ing-spec", "ing-unclassed"]
        );
        assert_eq!(names(&state.ingress_classes), ["apisix"]);
    }

    #[test]
    fn another_default_class_does_not_make_unclassed_objects_ours() {
        let yaml = format!(
            "{ROUTES}---\napiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: nginx\n  annotations: {{ingressclass.kubernetes.io/is-default-class: \"true\"}}\n"
        );
        let state = assemble(&inputs(&yaml), "apisix");
        assert_eq!(names(&state.apisix_routes), ["ours"]);
        let state = assemble(&inputs(&yaml), "nginx");
        assert_eq!(names(&state.apisix_routes), ["theirs", "unclassed"]);
        assert_eq!(names(&state.apisix_upstreams), ["svc"]);
    }

    #[test]
    fn gateway_api_objects_are_kept_whatever_the_ingress_class() {
        let yaml = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: sluice}
spec: {controllerName: sluice.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: theirs}
spec: {controllerName: example.com/other}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: default}
spec:
  gatewayClassName: sluice
  listeners: [{name: http, protocol: HTTP, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: default}
spec:
  parentRefs: [{name: gw}]
  rules: [{backendRefs: [{name: svc, port: 80}]}]
---
apiVersion: v1
kind: Namespace
metadata: {name: default, labels: {team: a}}
"#;
        let state = assemble(&inputs(&format!("{ROUTES}---{yaml}")), "nginx");
        assert_eq!(names(&state.gateway_classes), ["sluice", "theirs"]);
        assert_eq!(names(&state.gateways), ["gw"]);
        assert_eq!(names(&state.http_routes), ["web"]);
        assert_eq!(state.namespaces.len(), 1);
        let t = sluice_translate::translate(&state, &sluice_translate::Options::default());
        assert!(
            t.snapshot
                .routes
                .iter()
                .any(|r| r.id.starts_with("default/web/httproute-")),
            "the HTTPRoute is served whatever --ingress-class says"
        );
        let classes: Vec<&str> = t
            .status
            .gateway
            .gateway_classes
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(classes, ["sluice"], "status only for our controllerName");
    }

    #[test]
    fn translation_of_the_assembled_state_sees_only_our_routes() {
        let state = assemble(&inputs(ROUTES), "apisix");
        let t = sluice_translate::translate(&state, &sluice_translate::Options::default());
        let ids: Vec<&str> = t.snapshot.routes.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["default/ours/r"]);
        assert_eq!(t.status.objects.len(), 1, "no status for other classes");
    }
}
