//! `ApisixGlobalRule`: plugins applied to every request.
// NB: kube's `printcolumn(...)` repeats keys such as `type_` by design; clippy mistakes them
// for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{ApisixRoutePlugin, ApisixStatus, null_as_default};

/// Spec of an `ApisixGlobalRule`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "apisix.apache.org",
    version = "v2",
    kind = "ApisixGlobalRule",
    namespaced,
    shortname = "agr",
    status = "ApisixStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "ApisixGlobalRule applies plugins to every request served for its IngressClass.",
    printcolumn(
        name = "Plugins",
        type_ = "string",
        json_path = ".spec.plugins[*].name",
        description = "Plugin names"
    ),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Accepted")].status"#,
        description = "Whether the controller accepted the global rule"
    ),
    printcolumn(
        name = "Programmed",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Programmed")].status"#,
        description = "Whether the dataplanes apply the global rule"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ApisixGlobalRuleSpec {
    /// IngressClass this object belongs to; unset means the default IngressClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_class_name: Option<String>,
    /// The plugins.
    #[serde(deserialize_with = "null_as_default")]
    pub plugins: Vec<ApisixRoutePlugin>,
}
