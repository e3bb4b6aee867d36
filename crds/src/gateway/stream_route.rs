//! The layer-4 route kinds: `TLSRoute` (by SNI), `TCPRoute` and `UDPRoute`, all
//! `gateway.networking.k8s.io/v1` since Gateway API v1.6. They share the rule shape: weighted
//! backends, no matches.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::shared::{BackendObjectReference, ParentReference, RouteStatus, null_default};

/// Spec of a `TLSRoute`: connections to a TLS listener whose SNI matches `hostnames`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "TLSRoute",
    plural = "tlsroutes",
    namespaced,
    status = "RouteStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct TlsRouteSpec {
    /// Gateways (or listeners) to attach to.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub parent_refs: Vec<ParentReference>,
    /// SNI host names, exact or `*.suffix` (at least one in v1).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub hostnames: Vec<String>,
    /// Rules (exactly one in v1).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub rules: Vec<StreamRouteRule>,
}

/// Spec of a `TCPRoute`: every connection to a TCP listener.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "TCPRoute",
    plural = "tcproutes",
    namespaced,
    status = "RouteStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct TcpRouteSpec {
    /// Gateways (or listeners) to attach to.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub parent_refs: Vec<ParentReference>,
    /// Rules.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub rules: Vec<StreamRouteRule>,
}

/// Spec of a `UDPRoute`: every datagram session to a UDP listener.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "UDPRoute",
    plural = "udproutes",
    namespaced,
    status = "RouteStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct UdpRouteSpec {
    /// Gateways (or listeners) to attach to.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub parent_refs: Vec<ParentReference>,
    /// Rules.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub rules: Vec<StreamRouteRule>,
}

/// A rule of a TLSRoute, TCPRoute or UDPRoute.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StreamRouteRule {
    /// Optional rule name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Weighted backends; a connection picks one by weight.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub backend_refs: Vec<StreamBackendRef>,
}

/// `BackendRef` of a layer-4 rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct StreamBackendRef {
    /// The backend.
    #[serde(flatten)]
    pub backend: BackendObjectReference,
    /// Relative weight; default 1; 0 = no connection goes there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
}
