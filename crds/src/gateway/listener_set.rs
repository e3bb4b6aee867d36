//! `ListenerSet` (v1, standard channel since v1.5): listeners of a Gateway kept in an object
//! of their own, possibly in another namespace, which the Gateway admits with
//! `spec.allowedListeners`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::gateway_spec::{Listener, ListenerStatus};
use super::shared::null_default;

/// Spec of a `ListenerSet`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "ListenerSet",
    plural = "listenersets",
    namespaced,
    status = "ListenerSetStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct ListenerSetSpec {
    /// The Gateway the listeners join.
    pub parent_ref: ParentGatewayReference,
    /// Listeners (`ListenerEntry`: the fields of a Gateway listener), unique by name within
    /// the set.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub listeners: Vec<Listener>,
}

/// `ParentGatewayReference`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ParentGatewayReference {
    /// API group; default `gateway.networking.k8s.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind; default `Gateway`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name of the Gateway.
    pub name: String,
    /// Namespace of the Gateway; default: the ListenerSet's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Status of a `ListenerSet`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListenerSetStatus {
    /// `Accepted`, `Programmed`.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<Condition>,
    /// One entry per listener (`ListenerEntryStatus`, the fields of a Gateway's).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub listeners: Vec<ListenerStatus>,
}
