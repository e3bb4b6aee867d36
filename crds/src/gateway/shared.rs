//! Types shared by several Gateway API kinds: object references and route status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::{Deserialize, Deserializer, Serialize};

/// A `null` field reads as its default, like an absent one (Kubernetes clients send both).
pub(crate) fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `ParentReference`: the Gateway (or listener of it) a route wants to attach to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    /// API group of the parent; default `gateway.networking.k8s.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind of the parent; default `Gateway`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Namespace of the parent; default: the route's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the parent.
    pub name: String,
    /// Listener name; unset: every listener of the Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    /// Listener port; unset: every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// `BackendObjectReference`: a backend, by default a core `Service` with a port.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BackendObjectReference {
    /// API group; default `""` (core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind; default `Service`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name of the referent.
    pub name: String,
    /// Namespace; default: the route's namespace (another one needs a ReferenceGrant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Destination port; required for a Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// `SecretObjectReference` (listener certificates, BackendTLSPolicy CA bundles).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SecretObjectReference {
    /// API group; default `""` (core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind; default `Secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name of the referent.
    pub name: String,
    /// Namespace; default: the referring object's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `LocalObjectReference` (same namespace, group and kind required).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectReference {
    /// API group (`""` for core).
    #[serde(default)]
    pub group: String,
    /// Kind, e.g. `ConfigMap`.
    pub kind: String,
    /// Name of the referent.
    pub name: String,
}

/// `HTTPHeader`: a header name and value (filters).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeader {
    /// Header name (case-insensitive).
    pub name: String,
    /// Header value.
    pub value: String,
}

/// `HTTPHeaderFilter` (`RequestHeaderModifier`, `ResponseHeaderModifier`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeaderFilter {
    /// Headers to overwrite (or add when absent).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub set: Vec<HttpHeader>,
    /// Headers to add (appended to existing values).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub add: Vec<HttpHeader>,
    /// Header names to remove.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub remove: Vec<String>,
}

/// `HTTPRequestMirrorFilter`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRequestMirrorFilter {
    /// Where mirrored requests go.
    pub backend_ref: BackendObjectReference,
    /// Percentage of requests mirrored (0-100); unset: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<i32>,
    /// The share of requests mirrored as a fraction (exclusive with `percent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<Fraction>,
}

/// `Fraction`: `numerator / denominator` (default 100).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Fraction {
    /// Numerator.
    pub numerator: i32,
    /// Denominator; unset: 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denominator: Option<i32>,
}

/// `RouteStatus.parents[]`: a route's status with respect to one parent.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    /// The parent reference as written in the route's spec.
    pub parent_ref: ParentReference,
    /// The controller that wrote this entry (the GatewayClass `controllerName`).
    pub controller_name: String,
    /// `Accepted`, `ResolvedRefs` (and optionally `PartiallyInvalid`).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<Condition>,
}

/// `RouteStatus`: shared by HTTPRoute and GRPCRoute.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    /// One entry per (parent, controller) pair; each controller owns its own entries.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub parents: Vec<RouteParentStatus>,
}

/// `PolicyAncestorStatus` (BackendTLSPolicy status).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyAncestorStatus {
    /// The ancestor (usually a Gateway) the conditions are about.
    pub ancestor_ref: ParentReference,
    /// The controller that wrote this entry.
    pub controller_name: String,
    /// `Accepted`, `ResolvedRefs`.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<Condition>,
}

/// `PolicyStatus`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// One entry per ancestor and controller.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ancestors: Vec<PolicyAncestorStatus>,
}
