//! The cluster state indexed by (namespace, name), in sorted order, with the objects of other
//! classes left out: what every processor reads.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use sluice_crds::{
    ApisixConsumer, ApisixGlobalRule, ApisixPluginConfig, ApisixRoute, ApisixTls, ApisixUpstream,
};

use sluice_crds::gateway::ReferenceGrant;

use crate::refs::CrossNamespaceRefs;
use crate::{ClusterState, Options, ingress, state};

/// Label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Objects of the state indexed by (namespace, name), in sorted order.
pub(crate) struct Index<'a> {
    pub(crate) routes: BTreeMap<(&'a str, &'a str), &'a ApisixRoute>,
    /// Ingresses of this controller's class.
    pub(crate) ingresses: BTreeMap<(&'a str, &'a str), &'a Ingress>,
    pub(crate) upstreams: BTreeMap<(&'a str, &'a str), &'a ApisixUpstream>,
    pub(crate) services: BTreeMap<(&'a str, &'a str), &'a Service>,
    /// Keyed by (namespace, Service name from the label); slices sorted by name.
    pub(crate) slices: BTreeMap<(&'a str, &'a str), Vec<&'a EndpointSlice>>,
    pub(crate) secrets: BTreeMap<(&'a str, &'a str), &'a Secret>,
    pub(crate) config_maps: BTreeMap<(&'a str, &'a str), &'a ConfigMap>,
    pub(crate) plugin_configs: BTreeMap<(&'a str, &'a str), &'a ApisixPluginConfig>,
    pub(crate) consumers: BTreeMap<(&'a str, &'a str), &'a ApisixConsumer>,
    pub(crate) global_rules: BTreeMap<(&'a str, &'a str), &'a ApisixGlobalRule>,
    pub(crate) tlses: BTreeMap<(&'a str, &'a str), &'a ApisixTls>,
    /// Pod labels, keyed by (namespace, Pod name); for subsets.
    pub(crate) pod_labels: BTreeMap<(&'a str, &'a str), Option<&'a BTreeMap<String, String>>>,
    /// Every ReferenceGrant, for cross-namespace references ([`crate::refs`]).
    pub(crate) grants: &'a [ReferenceGrant],
    /// Which cross-namespace references of the APISIX kinds are honoured.
    pub(crate) cross_namespace_refs: CrossNamespaceRefs,
    /// Ingress classes whose ingress-nginx annotations are honoured.
    pub(crate) nginx_classes: Vec<String>,
    /// ingress-nginx's ConfigMap settings for those classes.
    pub(crate) nginx_config: std::collections::BTreeMap<String, String>,
}

/// (namespace, name) of an object; the namespace defaults to `default`.
pub(crate) fn key(meta: &ObjectMeta) -> (&str, &str) {
    (
        meta.namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(state::DEFAULT_NAMESPACE),
        meta.name.as_deref().unwrap_or_default(),
    )
}

pub(crate) fn class_selected(class: Option<&str>, opts: &Options) -> bool {
    match (&opts.ingress_class, class.filter(|c| !c.is_empty())) {
        (None, _) | (Some(_), None) => true,
        (Some(want), Some(have)) => want == have,
    }
}

/// `objects` by (namespace, name).
// NB: with duplicate (namespace, name) entries the later one wins, like the loader.
fn by_key<'a, T: Resource + 'a>(
    objects: impl IntoIterator<Item = &'a T>,
) -> BTreeMap<(&'a str, &'a str), &'a T> {
    objects.into_iter().map(|o| (key(o.meta()), o)).collect()
}

/// The Apisix objects of `objects` whose `spec.ingressClassName` selects them.
fn of_class<'a, T>(
    objects: &'a [T],
    class: impl Fn(&T) -> Option<&str>,
    opts: &Options,
) -> impl Iterator<Item = &'a T> {
    objects
        .iter()
        .filter(move |o| class_selected(class(o), opts))
}

/// EndpointSlices keyed by (namespace, Service name from the label), sorted by name,
/// deduplicated.
fn slices_by_service(slices: &[EndpointSlice]) -> BTreeMap<(&str, &str), Vec<&EndpointSlice>> {
    let mut out: BTreeMap<(&str, &str), Vec<&EndpointSlice>> = BTreeMap::new();
    for s in slices {
        let svc = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL));
        if let Some(svc) = svc {
            out.entry((key(&s.metadata).0, svc.as_str()))
                .or_default()
                .push(s);
        }
    }
    for list in out.values_mut() {
        list.sort_by(|a, b| key(&a.metadata).cmp(&key(&b.metadata)));
        list.dedup_by(|a, b| key(&a.metadata) == key(&b.metadata));
    }
    out
}

impl<'a> Index<'a> {
    pub(crate) fn build(state: &'a ClusterState, opts: &Options) -> Self {
        let ingresses = state
            .ingresses
            .iter()
            .filter(|o| ingress::selected(o, &state.ingress_classes, opts));
        let pod_labels = state
            .pods
            .iter()
            .map(|p| (key(&p.metadata), p.metadata.labels.as_ref()))
            .collect();
        Self {
            routes: by_key(of_class(
                &state.apisix_routes,
                |o| o.spec.ingress_class_name.as_deref(),
                opts,
            )),
            ingresses: by_key(ingresses),
            upstreams: by_key(of_class(
                &state.apisix_upstreams,
                |o| o.spec.ingress_class_name.as_deref(),
                opts,
            )),
            services: by_key(&state.services),
            slices: slices_by_service(&state.endpoint_slices),
            secrets: by_key(&state.secrets),
            config_maps: by_key(&state.config_maps),
            plugin_configs: by_key(of_class(
                &state.apisix_plugin_configs,
                |o| o.spec.ingress_class_name.as_deref(),
                opts,
            )),
            consumers: by_key(of_class(
                &state.apisix_consumers,
                |o| o.spec.ingress_class_name.as_deref(),
                opts,
            )),
            global_rules: by_key(of_class(
                &state.apisix_global_rules,
                |o| o.spec.ingress_class_name.as_deref(),
                opts,
            )),
            tlses: by_key(of_class(
                &state.apisix_tlses,
                |o| o.spec.ingress_class_name.as_deref(),
                opts,
            )),
            pod_labels,
            grants: &state.reference_grants,
            cross_namespace_refs: opts.cross_namespace_refs,
            nginx_classes: opts.nginx_classes.clone(),
            nginx_config: opts.nginx_config.clone(),
        }
    }
}
