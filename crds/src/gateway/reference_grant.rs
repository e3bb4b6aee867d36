//! `ReferenceGrant`: lets objects of other namespaces refer to objects of this one.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::shared::null_default;

/// Spec of a `ReferenceGrant`. v1beta1 is the storage version; v1 (served too) has the same
/// schema, and the YAML loader accepts both.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1beta1",
    kind = "ReferenceGrant",
    plural = "referencegrants",
    namespaced,
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantSpec {
    /// Who may refer (group, kind, namespace).
    #[serde(default, deserialize_with = "null_default")]
    pub from: Vec<ReferenceGrantFrom>,
    /// What may be referred to in this namespace (group, kind, optional name).
    #[serde(default, deserialize_with = "null_default")]
    pub to: Vec<ReferenceGrantTo>,
}

/// `ReferenceGrantFrom`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantFrom {
    /// API group of the referring kind (`gateway.networking.k8s.io`).
    #[serde(default)]
    pub group: String,
    /// Referring kind, e.g. `HTTPRoute` or `Gateway`.
    pub kind: String,
    /// Namespace of the referring objects.
    pub namespace: String,
}

/// `ReferenceGrantTo`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantTo {
    /// API group of the target kind (`""` for core).
    #[serde(default)]
    pub group: String,
    /// Target kind, e.g. `Service` or `Secret`.
    pub kind: String,
    /// Target name; unset: every object of the kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}
