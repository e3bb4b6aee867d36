//! `Gateway`: listeners (port, protocol, hostname, TLS) that routes attach to.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::shared::{SecretObjectReference, null_default};

/// Spec of a `Gateway`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "Gateway",
    plural = "gateways",
    namespaced,
    status = "GatewayStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// Name of the GatewayClass.
    pub gateway_class_name: String,
    /// Listeners, unique by name (and by port + protocol + hostname).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub listeners: Vec<Listener>,
    /// Requested addresses: static IPs for the Gateway's own Service, or `IPAddress`
    /// without a value (any address).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub addresses: Vec<GatewaySpecAddress>,
    /// Gateway-wide TLS settings (frontend client-certificate validation, backend client
    /// certificate). Modelled as opaque JSON: Sluice only needs to know whether it is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<serde_json::Value>,
    /// Which ListenerSets may add listeners to this Gateway; default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_listeners: Option<AllowedListeners>,
    /// Labels and annotations for what the Gateway is served by (its Service), and a
    /// reference to implementation parameters (Sluice takes none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure: Option<GatewayInfrastructure>,
}

/// `GatewayInfrastructure`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayInfrastructure {
    /// Labels for the resources serving the Gateway.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Annotations for the resources serving the Gateway.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
    /// `LocalParametersReference` (group, kind, name) to implementation parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters_ref: Option<serde_json::Value>,
}

/// `AllowedListeners`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AllowedListeners {
    /// Namespaces ListenerSets may come from; default `from: None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<ListenerNamespaces>,
}

/// `ListenerNamespaces`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListenerNamespaces {
    /// `None` (default), `Same`, `All` or `Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Namespace label selector, for `from: Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// `GatewaySpecAddress`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpecAddress {
    /// `IPAddress` (default), `Hostname` or an implementation-specific type.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// `Listener`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Listener {
    /// Unique within the Gateway; routes select it with `sectionName`.
    pub name: String,
    /// Exact host or `*.` wildcard; unset: every host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Port clients connect to.
    pub port: i32,
    /// `HTTP`, `HTTPS`, `TLS`, `TCP`, `UDP` or a domain-prefixed custom protocol.
    pub protocol: String,
    /// TLS settings (HTTPS and TLS listeners).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ListenerTls>,
    /// Which routes may attach; default: routes of the Gateway's namespace, of the kinds the
    /// protocol allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_routes: Option<AllowedRoutes>,
}

/// `ListenerTLSConfig` (named `GatewayTLSConfig` before v1.5).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListenerTls {
    /// `Terminate` (default) or `Passthrough`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Certificates (kubernetes.io/tls Secrets); the first one Sluice can use is served.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub certificate_refs: Vec<SecretObjectReference>,
    /// Implementation-specific options; Sluice defines none.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "std::collections::BTreeMap::is_empty"
    )]
    pub options: std::collections::BTreeMap<String, String>,
}

/// `AllowedRoutes`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AllowedRoutes {
    /// Namespaces routes may come from; default `from: Same`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<RouteNamespaces>,
    /// Route kinds allowed; empty: the kinds the listener protocol supports.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub kinds: Vec<RouteGroupKind>,
}

/// `RouteNamespaces`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteNamespaces {
    /// `All`, `Same` (default) or `Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Namespace label selector, for `from: Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// `RouteGroupKind`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct RouteGroupKind {
    /// API group; default `gateway.networking.k8s.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Route kind, e.g. `HTTPRoute`.
    pub kind: String,
}

/// Status of a `Gateway`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    /// Addresses the Gateway is reachable at.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub addresses: Vec<GatewayStatusAddress>,
    /// `Accepted`, `Programmed`.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<Condition>,
    /// One entry per listener.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub listeners: Vec<ListenerStatus>,
    /// How many ListenerSets are attached (accepted); unset when the Gateway allows none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached_listener_sets: Option<i32>,
}

/// `GatewayStatusAddress`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatusAddress {
    /// `IPAddress` or `Hostname`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The address.
    pub value: String,
}

/// `ListenerStatus`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatus {
    /// Listener name.
    pub name: String,
    /// Route kinds the listener accepts.
    #[serde(default, deserialize_with = "null_default")]
    pub supported_kinds: Vec<RouteGroupKind>,
    /// Number of routes successfully attached.
    pub attached_routes: i32,
    /// `Accepted`, `Programmed`, `ResolvedRefs`, `Conflicted`.
    #[serde(default, deserialize_with = "null_default")]
    pub conditions: Vec<Condition>,
}
