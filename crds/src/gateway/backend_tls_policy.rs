//! `BackendTLSPolicy`: how the dataplane verifies TLS to a backend Service.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::shared::{LocalObjectReference, PolicyStatus, null_default};

/// Spec of a `BackendTLSPolicy`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "BackendTLSPolicy",
    plural = "backendtlspolicies",
    namespaced,
    status = "PolicyStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct BackendTlsPolicySpec {
    /// The Services (optionally one port, by `sectionName`) the policy applies to.
    #[serde(default, deserialize_with = "null_default")]
    pub target_refs: Vec<LocalPolicyTargetReferenceWithSectionName>,
    /// How the backend certificate is verified.
    #[serde(default)]
    pub validation: BackendTlsPolicyValidation,
    /// Implementation-specific options; Sluice defines none.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "std::collections::BTreeMap::is_empty"
    )]
    pub options: std::collections::BTreeMap<String, String>,
}

/// `LocalPolicyTargetReferenceWithSectionName`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LocalPolicyTargetReferenceWithSectionName {
    /// API group (`""` for Service).
    #[serde(default)]
    pub group: String,
    /// Kind (`Service`).
    pub kind: String,
    /// Name.
    pub name: String,
    /// Service port name; unset: every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

/// `BackendTLSPolicyValidation`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BackendTlsPolicyValidation {
    /// ConfigMaps (key `ca.crt`) holding the CA bundle.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ca_certificate_refs: Vec<LocalObjectReference>,
    /// `System`: verify against the system roots.
    // NB: camelCase would make it `wellKnownCaCertificates`.
    #[serde(
        default,
        rename = "wellKnownCACertificates",
        skip_serializing_if = "Option::is_none"
    )]
    pub well_known_ca_certificates: Option<String>,
    /// Server name sent as SNI and verified.
    pub hostname: String,
    /// Names verified instead of `hostname` (Hostname or URI types).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub subject_alt_names: Vec<SubjectAltName>,
}

/// `SubjectAltName`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SubjectAltName {
    /// `Hostname` or `URI`.
    #[serde(rename = "type")]
    pub type_: String,
    /// For `Hostname`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// For `URI`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
}
