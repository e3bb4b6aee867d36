//! `ApisixTls`: server certificates for hosts, with optional client mTLS.
// NB: kube's `printcolumn(...)` repeats keys such as `type_` by design; clippy mistakes them
// for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{ApisixSecret, ApisixStatus, null_as_default};

/// Pattern of an `ApisixTls` host: a DNS name with an optional leading `*` wildcard.
pub const TLS_HOST_PATTERN: &str = r"^\*?[0-9a-zA-Z-.]+$";

/// Spec of an `ApisixTls`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "apisix.apache.org",
    version = "v2",
    kind = "ApisixTls",
    plural = "apisixtlses",
    namespaced,
    shortname = "atls",
    status = "ApisixStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "ApisixTls serves a certificate from a kubernetes.io/tls Secret for the given hosts, \
           optionally requiring client certificates.",
    printcolumn(
        name = "SNIs",
        type_ = "string",
        json_path = ".spec.hosts",
        description = "Hosts the certificate is served for"
    ),
    printcolumn(
        name = "Secret Name",
        type_ = "string",
        json_path = ".spec.secret.name"
    ),
    printcolumn(
        name = "Secret Namespace",
        type_ = "string",
        json_path = ".spec.secret.namespace"
    ),
    printcolumn(
        name = "Client CA Secret Name",
        type_ = "string",
        json_path = ".spec.client.caSecret.name",
        priority = 1
    ),
    printcolumn(
        name = "Client CA Secret Namespace",
        type_ = "string",
        json_path = ".spec.client.caSecret.namespace",
        priority = 1
    ),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Accepted")].status"#,
        description = "Whether the controller accepted the certificate"
    ),
    printcolumn(
        name = "Programmed",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Programmed")].status"#,
        description = "Whether the dataplanes serve the certificate"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ApisixTlsSpec {
    /// IngressClass this object belongs to; unset means the default IngressClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_class_name: Option<String>,
    /// Host names (SNIs), exact or with a leading wildcard (`*.example.com`). At least one.
    #[serde(deserialize_with = "null_as_default")]
    #[schemars(length(min = 1), inner(pattern(TLS_HOST_PATTERN)))]
    pub hosts: Vec<String>,
    /// The kubernetes.io/tls Secret holding `tls.crt` and `tls.key`.
    pub secret: ApisixSecret,
    /// Client certificate verification (mTLS). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<ApisixMutualTlsClientConfig>,
}

/// Client certificate verification settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixMutualTlsClientConfig {
    /// Secret whose `ca.crt` holds the CA certificates that client certificates must chain to.
    pub ca_secret: ApisixSecret,
    /// Maximum verification depth of the client certificate chain. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub depth: Option<i32>,
    /// Regexes of request paths for which no client certificate is required.
    #[serde(
        rename = "skip_mtls_uri_regex",
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub skip_mtls_uri_regex: Vec<String>,
}
