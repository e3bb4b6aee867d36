//! [`ClusterState`]: the inputs of translation, and the multi-document YAML loader used by
//! standalone mode and the golden tests.

use std::fmt;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::PartialObjectMeta;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use sluice_crds::gateway::{
    BackendTLSPolicy, GATEWAY_GROUP, GRPCRoute, Gateway, GatewayClass, HTTPRoute, ListenerSet,
    ReferenceGrant, TCPRoute, TLSRoute, UDPRoute,
};
use sluice_crds::{
    ApisixConsumer, ApisixGlobalRule, ApisixPluginConfig, ApisixRoute, ApisixTls, ApisixUpstream,
};

/// Namespace of an object whose `metadata.namespace` is unset, as `kubectl apply` assumes.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Everything translation looks at: plain data, no caches, no I/O.
///
/// The controller fills it from its reflector stores; standalone mode fills it with
/// [`ClusterState::load_yaml`]. The order of objects in each `Vec` does not matter: translation
/// output is the same for any order. Objects are expected to be unique per kind, namespace and
/// name (the loader replaces an earlier definition with a later one).
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    /// `apisix.apache.org/v2` ApisixRoutes.
    pub apisix_routes: Vec<ApisixRoute>,
    /// `apisix.apache.org/v2` ApisixUpstreams.
    pub apisix_upstreams: Vec<ApisixUpstream>,
    /// `apisix.apache.org/v2` ApisixTlses. Loaded but not translated yet.
    pub apisix_tlses: Vec<ApisixTls>,
    /// `apisix.apache.org/v2` ApisixPluginConfigs. Loaded but not translated yet (a rule
    /// naming one is rejected).
    pub apisix_plugin_configs: Vec<ApisixPluginConfig>,
    /// `apisix.apache.org/v2` ApisixConsumers. Loaded but not translated yet.
    pub apisix_consumers: Vec<ApisixConsumer>,
    /// `apisix.apache.org/v2` ApisixGlobalRules. Loaded but not translated yet.
    pub apisix_global_rules: Vec<ApisixGlobalRule>,
    /// `v1` Services.
    pub services: Vec<Service>,
    /// `discovery.k8s.io/v1` EndpointSlices.
    pub endpoint_slices: Vec<EndpointSlice>,
    /// `v1` Secrets (plugin `secretRef`s).
    pub secrets: Vec<Secret>,
    /// `v1` Pods, metadata only: their labels select the endpoints of ApisixUpstream
    /// `subsets` (matched through the EndpointSlice endpoints' `targetRef`). The loader
    /// accepts full `kind: Pod` documents and keeps only the metadata.
    pub pods: Vec<PartialObjectMeta<Pod>>,
    /// `networking.k8s.io/v1` Ingresses.
    pub ingresses: Vec<Ingress>,
    /// `networking.k8s.io/v1` IngressClasses (only the default-class annotation is used).
    pub ingress_classes: Vec<IngressClass>,
    /// `v1` Namespaces, metadata only: their labels select the routes a Gateway listener
    /// allows (`allowedRoutes.namespaces.from: Selector`).
    pub namespaces: Vec<PartialObjectMeta<Namespace>>,
    /// `gateway.networking.k8s.io/v1` GatewayClasses (cluster-scoped).
    pub gateway_classes: Vec<GatewayClass>,
    /// `gateway.networking.k8s.io/v1` Gateways.
    pub gateways: Vec<Gateway>,
    /// `gateway.networking.k8s.io/v1` ListenerSets.
    pub listener_sets: Vec<ListenerSet>,
    /// `gateway.networking.k8s.io/v1` HTTPRoutes.
    pub http_routes: Vec<HTTPRoute>,
    /// `gateway.networking.k8s.io/v1` GRPCRoutes.
    pub grpc_routes: Vec<GRPCRoute>,
    /// `gateway.networking.k8s.io/v1` TLSRoutes.
    pub tls_routes: Vec<TLSRoute>,
    /// `gateway.networking.k8s.io/v1` TCPRoutes.
    pub tcp_routes: Vec<TCPRoute>,
    /// `gateway.networking.k8s.io/v1` UDPRoutes.
    pub udp_routes: Vec<UDPRoute>,
    /// `gateway.networking.k8s.io/v1beta1` (or `v1`) ReferenceGrants.
    pub reference_grants: Vec<ReferenceGrant>,
    /// `gateway.networking.k8s.io/v1` BackendTLSPolicies.
    pub backend_tls_policies: Vec<BackendTLSPolicy>,
    /// `v1` ConfigMaps (CA bundles, key `ca.crt`: BackendTLSPolicy, Gateway frontend
    /// client-certificate validation).
    pub config_maps: Vec<ConfigMap>,
}

/// The text given to [`ClusterState::load_yaml`] is not YAML at all. Nothing was loaded from
/// it; a caller reloading configuration should keep its last good state.
#[derive(Debug, thiserror::Error)]
#[error("{file}: not valid YAML: {source}")]
pub struct YamlError {
    /// Source name given to `load_yaml` (usually a file name).
    pub file: String,
    /// The parser's error, with line and column.
    #[source]
    pub source: serde_yaml::Error,
}

/// [`ClusterState::load_file`] failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum LoadFileError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The path as given.
        file: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not YAML.
    #[error(transparent)]
    Yaml(#[from] YamlError),
}

/// One document that could not be loaded; the other documents of the file still are.
///
/// Displays as
/// `routes.yaml: document 3 (ApisixRoute default/bad): spec.http[0].match.exprs[0].op: unknown variant ...`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DocumentError {
    /// Source name given to `load_yaml`.
    pub file: String,
    /// 1-based position of the document in the file (documents are separated by `---`;
    /// empty documents count too).
    pub document: usize,
    /// 0-based index in `items` when the document is a `List`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item: Option<usize>,
    /// `kind` of the document, when readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// `metadata.namespace` (or `default`), when a name was readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `metadata.name`, when readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Path of the offending field, e.g. `spec.http[0].match.exprs[0].op`; `None` when the
    /// problem is the document as a whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: document {}", self.file, self.document)?;
        if let Some(item) = self.item {
            write!(f, " item {item}")?;
        }
        match (&self.kind, &self.name) {
            (Some(kind), Some(name)) => {
                let ns = self.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE);
                write!(f, " ({kind} {ns}/{name})")?;
            }
            (Some(kind), None) => write!(f, " ({kind})")?,
            _ => {}
        }
        f.write_str(": ")?;
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        f.write_str(&self.reason)
    }
}

impl std::error::Error for DocumentError {}

/// What [`ClusterState::load_yaml`] did with a file.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LoadReport {
    /// Number of objects added to (or replaced in) the state.
    pub loaded: usize,
    /// Documents that could not be loaded.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<DocumentError>,
    /// Informational lines: skipped kinds, replaced duplicates. Worth logging, not errors.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Where a document sits, for messages.
#[derive(Clone, Copy)]
struct DocPos<'a> {
    file: &'a str,
    document: usize,
    item: Option<usize>,
}

impl DocPos<'_> {
    fn label(&self) -> String {
        match self.item {
            Some(item) => format!("{}: document {} item {item}", self.file, self.document),
            None => format!("{}: document {}", self.file, self.document),
        }
    }
}

/// The kinds the loader understands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum KnownKind {
    ApisixRoute,
    ApisixUpstream,
    ApisixTls,
    ApisixPluginConfig,
    ApisixConsumer,
    ApisixGlobalRule,
    Service,
    EndpointSlice,
    Secret,
    ConfigMap,
    Pod,
    Ingress,
    IngressClass,
    Namespace,
    GatewayClass,
    Gateway,
    ListenerSet,
    HttpRoute,
    GrpcRoute,
    TlsRoute,
    TcpRoute,
    UdpRoute,
    ReferenceGrant,
    BackendTlsPolicy,
}

impl KnownKind {
    /// The kind for `apiVersion`/`kind`; `Err` with a reason for a known kind at the wrong
    /// version, `Ok(None)` for kinds Sluice does not use.
    fn from_type(api_version: &str, kind: &str) -> Result<Option<Self>, String> {
        let (group, version) = match api_version.rsplit_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let apisix = (sluice_crds::GROUP, sluice_crds::VERSION);
        let (known, (want_group, want_version)) = match kind {
            "ApisixRoute" => (Self::ApisixRoute, apisix),
            "ApisixUpstream" => (Self::ApisixUpstream, apisix),
            "ApisixTls" => (Self::ApisixTls, apisix),
            "ApisixPluginConfig" => (Self::ApisixPluginConfig, apisix),
            "ApisixConsumer" => (Self::ApisixConsumer, apisix),
            "ApisixGlobalRule" => (Self::ApisixGlobalRule, apisix),
            "Service" => (Self::Service, ("", "v1")),
            "Secret" => (Self::Secret, ("", "v1")),
            "ConfigMap" => (Self::ConfigMap, ("", "v1")),
            "Pod" => (Self::Pod, ("", "v1")),
            "EndpointSlice" => (Self::EndpointSlice, ("discovery.k8s.io", "v1")),
            "Ingress" => (Self::Ingress, ("networking.k8s.io", "v1")),
            "IngressClass" => (Self::IngressClass, ("networking.k8s.io", "v1")),
            "Namespace" => (Self::Namespace, ("", "v1")),
            // NB: the Gateway API serves v1beta1 of these kinds with the same schema as v1
            // (for ReferenceGrant, v1beta1 is even the storage version): accept both.
            "GatewayClass" | "Gateway" | "HTTPRoute" | "ReferenceGrant" => {
                let known = match kind {
                    "GatewayClass" => Self::GatewayClass,
                    "Gateway" => Self::Gateway,
                    "HTTPRoute" => Self::HttpRoute,
                    _ => Self::ReferenceGrant,
                };
                let v = if version == "v1beta1" {
                    "v1beta1"
                } else {
                    "v1"
                };
                (known, (GATEWAY_GROUP, v))
            }
            "GRPCRoute" => (Self::GrpcRoute, (GATEWAY_GROUP, "v1")),
            "ListenerSet" => (Self::ListenerSet, (GATEWAY_GROUP, "v1")),
            "TLSRoute" => (Self::TlsRoute, (GATEWAY_GROUP, "v1")),
            "TCPRoute" => (Self::TcpRoute, (GATEWAY_GROUP, "v1")),
            "UDPRoute" => (Self::UdpRoute, (GATEWAY_GROUP, "v1")),
            "BackendTLSPolicy" => (Self::BackendTlsPolicy, (GATEWAY_GROUP, "v1")),
            _ => return Ok(None),
        };
        if group != want_group {
            // Same kind name in another API group (e.g. a Knative `Service`): not ours.
            return Ok(None);
        }
        if version != want_version {
            let want = if want_group.is_empty() {
                want_version.to_owned()
            } else {
                format!("{want_group}/{want_version}")
            };
            return Err(format!(
                "apiVersion {api_version:?} is not supported for {kind}; use {want:?}"
            ));
        }
        Ok(Some(known))
    }
}

/// The object's `metadata`, defaulting the namespace; `Err` when the name is missing.
fn fix_meta(meta: &mut ObjectMeta) -> Result<(), String> {
    if meta.name.as_deref().is_none_or(str::is_empty) {
        return Err("required".into());
    }
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some(DEFAULT_NAMESPACE.to_owned());
    }
    Ok(())
}

fn same_object(a: &ObjectMeta, b: &ObjectMeta) -> bool {
    a.name == b.name && a.namespace == b.namespace
}

/// Adds `obj` to `list`, replacing an object with the same namespace and name. Returns
/// whether one was replaced.
fn upsert<T: Resource>(list: &mut Vec<T>, obj: T) -> bool {
    if let Some(slot) = list.iter_mut().find(|o| same_object(o.meta(), obj.meta())) {
        *slot = obj;
        true
    } else {
        list.push(obj);
        false
    }
}

/// The error of document `pos` (`doc`).
fn doc_error(
    pos: DocPos<'_>,
    doc: &serde_yaml::Value,
    kind: Option<String>,
    field: Option<String>,
    reason: String,
) -> DocumentError {
    let (namespace, name) = untyped_name(doc);
    DocumentError {
        file: pos.file.to_owned(),
        document: pos.document,
        item: pos.item,
        kind,
        namespace,
        name,
        field,
        reason,
    }
}

/// The kind `doc` is; `None` (with a note or an error in `report`) when it is not one Sluice
/// loads.
fn known_kind(
    pos: DocPos<'_>,
    doc: &serde_yaml::Value,
    api_version: &str,
    kind: &str,
    report: &mut LoadReport,
) -> Option<KnownKind> {
    match KnownKind::from_type(api_version, kind) {
        Ok(Some(k)) => Some(k),
        Ok(None) => {
            let (ns, name) = untyped_name(doc);
            let what = match (ns, name) {
                (Some(ns), Some(name)) => format!("{kind} {ns}/{name}"),
                _ => kind.to_owned(),
            };
            report.notes.push(format!(
                "{}: skipped {what} ({api_version} {kind} is not used by Sluice)",
                pos.label()
            ));
            None
        }
        Err(reason) => {
            let error = doc_error(
                pos,
                doc,
                Some(kind.to_owned()),
                Some("apiVersion".into()),
                reason,
            );
            report.errors.push(error);
            None
        }
    }
}

/// Reads `metadata.name` / `metadata.namespace` from an untyped document, for messages.
fn untyped_name(doc: &serde_yaml::Value) -> (Option<String>, Option<String>) {
    let meta = doc.get("metadata");
    let get = |key: &str| {
        meta.and_then(|m| m.get(key))
            .and_then(serde_yaml::Value::as_str)
            .map(str::to_owned)
    };
    let name = get("name");
    let namespace = name
        .as_ref()
        .map(|_| get("namespace").unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()));
    (namespace, name)
}

impl ClusterState {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Loads every document of a (multi-document) YAML text, as `kubectl apply -f` would.
    ///
    /// `source` names the text in messages (usually the file name). Each document is
    /// dispatched on `apiVersion`/`kind` and parsed on its own, so a bad document yields a
    /// [`DocumentError`] naming the field, and the other documents still load. Kinds Sluice
    /// does not use (Deployments, Namespaces, ...) are skipped with a note; `List` documents
    /// are unpacked. A missing `metadata.namespace` means `default`. An object with the same
    /// kind, namespace and name as one already loaded replaces it (with a note).
    ///
    /// # Errors
    ///
    /// [`YamlError`] when the text is not YAML at all; the state is then left unchanged.
    pub fn load_yaml(&mut self, source: &str, text: &str) -> Result<LoadReport, YamlError> {
        // Parse the whole stream first, so a syntax error anywhere changes nothing.
        let mut docs = Vec::new();
        for de in serde_yaml::Deserializer::from_str(text) {
            let value = serde_yaml::Value::deserialize(de).map_err(|err| YamlError {
                file: source.to_owned(),
                source: err,
            })?;
            docs.push(value);
        }
        let mut report = LoadReport::default();
        for (i, doc) in docs.into_iter().enumerate() {
            let pos = DocPos {
                file: source,
                document: i + 1,
                item: None,
            };
            self.load_document(pos, doc, &mut report);
        }
        Ok(report)
    }

    /// Loads one YAML file from disk with [`ClusterState::load_yaml`]; the source name is the
    /// path as given.
    ///
    /// # Errors
    ///
    /// [`LoadFileError::Read`] when the file cannot be read, [`LoadFileError::Yaml`] when it is
    /// not YAML; the state is then left unchanged.
    pub fn load_file(&mut self, path: &std::path::Path) -> Result<LoadReport, LoadFileError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| LoadFileError::Read {
            file: name.clone(),
            source,
        })?;
        Ok(self.load_yaml(&name, &text)?)
    }

    fn load_document(&mut self, pos: DocPos<'_>, doc: serde_yaml::Value, report: &mut LoadReport) {
        if doc.is_null() {
            return; // An empty document (`---` at the end, or only comments).
        }
        let fail = |kind: Option<String>, field: Option<String>, reason: String| {
            doc_error(pos, &doc, kind, field, reason)
        };
        if !doc.is_mapping() {
            report.errors.push(fail(
                None,
                None,
                "expected a Kubernetes object (a mapping with apiVersion and kind)".into(),
            ));
            return;
        }
        let kind = doc.get("kind").and_then(serde_yaml::Value::as_str);
        let api_version = doc.get("apiVersion").and_then(serde_yaml::Value::as_str);
        let (Some(kind), Some(api_version)) = (kind, api_version) else {
            let missing = if kind.is_none() { "kind" } else { "apiVersion" };
            report.errors.push(fail(
                kind.map(str::to_owned),
                Some(missing.to_owned()),
                "required (a string)".into(),
            ));
            return;
        };
        let kind = kind.to_owned();
        if kind == "List" || kind.ends_with("List") && doc.get("items").is_some() {
            self.load_list(pos, &doc, kind, report);
            return;
        }
        let Some(known) = known_kind(pos, &doc, api_version, &kind, report) else {
            return;
        };
        match self.add_known(known, &doc) {
            Ok(Added { replaced, ns, name }) => {
                report.loaded += 1;
                if replaced {
                    report.notes.push(format!(
                        "{}: {kind} {ns}/{name} replaces an earlier definition",
                        pos.label()
                    ));
                }
            }
            Err((field, reason)) => report.errors.push(fail(Some(kind), field, reason)),
        }
    }

    /// The items of a `List` (not inside another List).
    fn load_list(
        &mut self,
        pos: DocPos<'_>,
        doc: &serde_yaml::Value,
        kind: String,
        report: &mut LoadReport,
    ) {
        if pos.item.is_some() {
            report.errors.push(doc_error(
                pos,
                doc,
                Some(kind),
                None,
                "a List inside a List is not supported".into(),
            ));
            return;
        }
        let items = match doc.get("items") {
            Some(serde_yaml::Value::Sequence(items)) => items.clone(),
            Some(serde_yaml::Value::Null) | None => Vec::new(),
            Some(_) => {
                report.errors.push(doc_error(
                    pos,
                    doc,
                    Some(kind),
                    Some("items".into()),
                    "expected a list of objects".into(),
                ));
                return;
            }
        };
        for (j, item) in items.into_iter().enumerate() {
            let pos = DocPos {
                item: Some(j),
                ..pos
            };
            self.load_document(pos, item, report);
        }
    }

    /// Adds `doc` to the list of its kind.
    fn add_known(
        &mut self,
        known: KnownKind,
        doc: &serde_yaml::Value,
    ) -> Result<Added, (Option<String>, String)> {
        match known {
            KnownKind::ApisixRoute => add(doc, &mut self.apisix_routes),
            KnownKind::ApisixUpstream => add(doc, &mut self.apisix_upstreams)
                .map_err(|(field, reason)| upstream_error_field(doc, field, reason)),
            KnownKind::ApisixTls => add(doc, &mut self.apisix_tlses),
            KnownKind::ApisixPluginConfig => add(doc, &mut self.apisix_plugin_configs),
            KnownKind::ApisixConsumer => add(doc, &mut self.apisix_consumers),
            KnownKind::ApisixGlobalRule => add(doc, &mut self.apisix_global_rules),
            KnownKind::Service => add(doc, &mut self.services),
            KnownKind::EndpointSlice => add(doc, &mut self.endpoint_slices),
            KnownKind::Secret => add(doc, &mut self.secrets),
            KnownKind::ConfigMap => add(doc, &mut self.config_maps),
            KnownKind::Pod => add(doc, &mut self.pods),
            KnownKind::Ingress => add(doc, &mut self.ingresses),
            KnownKind::IngressClass => add(doc, &mut self.ingress_classes),
            KnownKind::Namespace => add_cluster_scoped(doc, &mut self.namespaces),
            KnownKind::GatewayClass => add_cluster_scoped(doc, &mut self.gateway_classes),
            KnownKind::Gateway => add(doc, &mut self.gateways),
            KnownKind::ListenerSet => add(doc, &mut self.listener_sets),
            KnownKind::HttpRoute => add(doc, &mut self.http_routes),
            KnownKind::GrpcRoute => add(doc, &mut self.grpc_routes),
            KnownKind::TlsRoute => add(doc, &mut self.tls_routes),
            KnownKind::TcpRoute => add(doc, &mut self.tcp_routes),
            KnownKind::UdpRoute => add(doc, &mut self.udp_routes),
            KnownKind::ReferenceGrant => add(doc, &mut self.reference_grants),
            KnownKind::BackendTlsPolicy => add(doc, &mut self.backend_tls_policies),
        }
    }
}

/// `ApisixUpstream` settings sit in flattened structs, where serde loses the field path
/// (an unknown `loadbalancer.type` is reported on `spec`): find the field by parsing the
/// settings on their own.
fn upstream_error_field(
    doc: &serde_yaml::Value,
    field: Option<String>,
    reason: String,
) -> (Option<String>, String) {
    let inner = |v: &serde_yaml::Value, prefix: String| {
        serde_path_to_error::deserialize::<_, sluice_crds::ApisixUpstreamConfig>(v.clone())
            .err()
            .map(|e| {
                (
                    Some(format!("{prefix}.{}", e.path())),
                    e.into_inner().to_string(),
                )
            })
    };
    let Some(spec) = doc.get("spec") else {
        return (field, reason);
    };
    match field.as_deref() {
        Some("spec") => inner(spec, "spec".into()).unwrap_or((field, reason)),
        Some(f) if f.starts_with("spec.portLevelSettings[") => {
            let i = f["spec.portLevelSettings[".len()..]
                .split(']')
                .next()
                .and_then(|i| i.parse::<usize>().ok());
            let item = i.and_then(|i| spec.get("portLevelSettings")?.get(i));
            match (i, item) {
                (Some(i), Some(item)) => {
                    inner(item, format!("spec.portLevelSettings[{i}]")).unwrap_or((field, reason))
                }
                _ => (field, reason),
            }
        }
        _ => (field, reason),
    }
}

/// An object added by [`add`].
struct Added {
    replaced: bool,
    ns: String,
    name: String,
}

/// Parses `doc` as `T`, defaults its namespace and upserts it; on failure the field path (if
/// any) and the reason.
fn add<T: DeserializeOwned + Resource>(
    doc: &serde_yaml::Value,
    list: &mut Vec<T>,
) -> Result<Added, (Option<String>, String)> {
    let mut obj: T = serde_path_to_error::deserialize(doc.clone()).map_err(|e| {
        let path = e.path().to_string();
        let field = (path != "." && !path.is_empty()).then_some(path);
        (field, e.into_inner().to_string())
    })?;
    fix_meta(obj.meta_mut()).map_err(|r| (Some("metadata.name".to_owned()), r))?;
    let ns = obj.meta().namespace.clone().unwrap_or_default();
    let name = obj.meta().name.clone().unwrap_or_default();
    let replaced = upsert(list, obj);
    Ok(Added { replaced, ns, name })
}

/// Like [`add`] for a cluster-scoped kind (GatewayClass, Namespace): the namespace is
/// cleared instead of defaulted.
fn add_cluster_scoped<T: DeserializeOwned + Resource>(
    doc: &serde_yaml::Value,
    list: &mut Vec<T>,
) -> Result<Added, (Option<String>, String)> {
    let mut obj: T = serde_path_to_error::deserialize(doc.clone()).map_err(|e| {
        let path = e.path().to_string();
        let field = (path != "." && !path.is_empty()).then_some(path);
        (field, e.into_inner().to_string())
    })?;
    if obj.meta().name.as_deref().is_none_or(str::is_empty) {
        return Err((Some("metadata.name".to_owned()), "required".into()));
    }
    obj.meta_mut().namespace = None;
    let name = obj.meta().name.clone().unwrap_or_default();
    let replaced = upsert(list, obj);
    Ok(Added {
        replaced,
        ns: String::new(),
        name,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const GOOD_ROUTE: &str = "\
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {name: good}
spec:
  http:
    - name: r
      match: {paths: [/]}
      backends: [{serviceName: svc, servicePort: 80}]
";

    fn route_names(s: &ClusterState) -> Vec<String> {
        s.apisix_routes
            .iter()
            .map(|r| {
                format!(
                    "{}/{}",
                    r.metadata.namespace.as_deref().unwrap_or("?"),
                    r.metadata.name.as_deref().unwrap_or("?")
                )
            })
            .collect()
    }

    #[test]
    fn one_bad_document_keeps_the_others_and_names_the_field() {
        let text = format!(
            "{GOOD_ROUTE}---
apiVersion: v1
kind: Service
metadata: {{name: svc, namespace: web}}
spec: {{ports: [{{port: 80}}]}}
---
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: bad, namespace: web}}
spec:
  http:
    - name: r
      match:
        paths: [/]
        exprs:
          - subject: {{scope: Header, name: X-A}}
            op: Bogus
            value: x
      backends: [{{serviceName: svc, servicePort: 80}}]
"
        );
        let mut state = ClusterState::new();
        let report = state.load_yaml("routes.yaml", &text).unwrap();
        assert_eq!(report.loaded, 2);
        assert_eq!(route_names(&state), ["default/good"]);
        assert_eq!(state.services.len(), 1);
        assert_eq!(report.errors.len(), 1, "{report:?}");
        let e = &report.errors[0];
        assert_eq!(e.document, 3);
        assert_eq!(e.field.as_deref(), Some("spec.http[0].match.exprs[0].op"));
        let shown = e.to_string();
        assert!(
            shown.starts_with(
                "routes.yaml: document 3 (ApisixRoute web/bad): \
                 spec.http[0].match.exprs[0].op: unknown variant `Bogus`, expected one of "
            ),
            "{shown}"
        );
    }

    #[test]
    fn text_that_is_not_yaml_changes_nothing() {
        let mut state = ClusterState::new();
        state.load_yaml("a.yaml", GOOD_ROUTE).unwrap();
        // The second document is broken: nothing of the file may be loaded.
        let broken = "apiVersion: v1\nkind: Service\nmetadata: {name: x}\n---\nkey: [unclosed\n";
        let err = state.load_yaml("b.yaml", broken).unwrap_err();
        assert!(
            err.to_string().starts_with("b.yaml: not valid YAML: "),
            "{err}"
        );
        assert!(state.services.is_empty());
        assert_eq!(route_names(&state), ["default/good"]);
    }

    #[test]
    fn namespace_defaults_and_later_definitions_replace_earlier_ones() {
        let mut state = ClusterState::new();
        let r1 = state.load_yaml("a.yaml", GOOD_ROUTE).unwrap();
        assert!(r1.notes.is_empty());
        let changed = GOOD_ROUTE.replace("paths: [/]", "paths: [/new]");
        let r2 = state
            .load_yaml("b.yaml", &format!("---\n\n---\n{changed}"))
            .unwrap();
        assert_eq!(route_names(&state), ["default/good"]);
        assert_eq!(state.apisix_routes[0].spec.http[0].match_.paths, ["/new"]);
        // Empty documents count in the numbering but are not errors.
        assert_eq!(
            r2.notes,
            ["b.yaml: document 2: ApisixRoute default/good replaces an earlier definition"]
        );
        assert!(r2.errors.is_empty());
    }

    #[test]
    fn unknown_kinds_are_skipped_and_lists_unpacked() {
        let text = "\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
---
apiVersion: serving.knative.dev/v1
kind: Service
metadata: {name: kn}
---
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Secret
    metadata: {name: s}
    stringData: {a: b}
  - apiVersion: v1
    kind: Secret
    metadata: {}
";
        let mut state = ClusterState::new();
        let report = state.load_yaml("x.yaml", text).unwrap();
        assert_eq!(report.loaded, 1);
        assert_eq!(state.secrets.len(), 1);
        assert!(
            state.services.is_empty(),
            "a Knative Service is not a v1 Service"
        );
        assert_eq!(report.notes.len(), 2, "{:?}", report.notes);
        assert!(report.notes[0].contains("skipped Deployment shop/web"));
        assert_eq!(
            report.errors[0].to_string(),
            "x.yaml: document 3 item 1 (Secret): metadata.name: required"
        );
    }

    #[test]
    fn a_document_without_kind_is_an_error() {
        let mut state = ClusterState::new();
        let report = state
            .load_yaml("x.yaml", "apiVersion: v1\nmetadata: {name: a}\n")
            .unwrap();
        assert_eq!(
            report.errors[0].to_string(),
            "x.yaml: document 1: kind: required (a string)"
        );
    }

    #[test]
    fn gateway_api_versions_load() {
        let mut state = ClusterState::new();
        let report = state
            .load_yaml(
                "x.yaml",
                "apiVersion: gateway.networking.k8s.io/v1\nkind: ReferenceGrant\nmetadata: {name: a}\n\
                 spec: {from: [], to: []}\n---\n\
                 apiVersion: gateway.networking.k8s.io/v1beta1\nkind: HTTPRoute\nmetadata: {name: b}\n\
                 spec: {}\n---\n\
                 apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: GRPCRoute\nmetadata: {name: c}\n\
                 spec: {}\n---\n\
                 apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: d, namespace: x}\n\
                 spec: {controllerName: c}\n",
            )
            .unwrap();
        assert_eq!(report.loaded, 3, "{report:?}");
        assert_eq!(state.reference_grants.len(), 1);
        assert_eq!(state.http_routes.len(), 1);
        assert_eq!(
            state.gateway_classes[0].metadata.namespace, None,
            "cluster-scoped"
        );
        assert_eq!(
            report.errors[0].to_string(),
            "x.yaml: document 3 (GRPCRoute default/c): apiVersion: apiVersion \
             \"gateway.networking.k8s.io/v1alpha2\" is not supported for GRPCRoute; use \
             \"gateway.networking.k8s.io/v1\""
        );
    }
}
