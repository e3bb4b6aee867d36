//! The status side output of translation: per object, its conditions and the routes it
//! produced. The status writer turns these into Kubernetes conditions (adding
//! `lastTransitionTime` and `observedGeneration`).

use std::fmt;

use serde::Serialize;

/// Condition type of the translation verdict.
pub use sluice_crds::CONDITION_ACCEPTED;
/// `Accepted` reason when the object is valid.
pub use sluice_crds::REASON_ACCEPTED;
/// `Accepted` reason when the spec is invalid; the message names the field.
pub use sluice_crds::REASON_INVALID_SPEC;

/// `Accepted` reason for kinds Sluice loads but does not translate yet.
pub const REASON_UNSUPPORTED: &str = "Unsupported";

/// Condition type saying whether every reference (Service, port, subset, ExternalName
/// Service) of an accepted object was found.
pub const CONDITION_RESOLVED_REFS: &str = "ResolvedRefs";
/// `ResolvedRefs` reason when every reference was found.
pub const REASON_RESOLVED_REFS: &str = "ResolvedRefs";
/// `ResolvedRefs` reason when a backend Service, its port or a subset is missing. The route
/// is still served; requests to the missing backend get 503.
pub const REASON_BACKEND_NOT_FOUND: &str = "BackendNotFound";
/// `ResolvedRefs` reason when a reference exists but Sluice cannot resolve it yet. (Subsets
/// used it until Pod labels were watched; kept for API stability.)
pub const REASON_UNSUPPORTED_REF: &str = "UnsupportedReference";

/// Kind of an object that gets a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum ObjectKind {
    /// `apisix.apache.org/v2` ApisixRoute.
    ApisixRoute,
    /// `apisix.apache.org/v2` ApisixUpstream.
    ApisixUpstream,
    /// `apisix.apache.org/v2` ApisixTls.
    ApisixTls,
    /// `apisix.apache.org/v2` ApisixPluginConfig.
    ApisixPluginConfig,
    /// `apisix.apache.org/v2` ApisixConsumer.
    ApisixConsumer,
    /// `apisix.apache.org/v2` ApisixGlobalRule.
    ApisixGlobalRule,
}

impl ObjectKind {
    /// The Kubernetes `kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ApisixRoute => "ApisixRoute",
            Self::ApisixUpstream => "ApisixUpstream",
            Self::ApisixTls => "ApisixTls",
            Self::ApisixPluginConfig => "ApisixPluginConfig",
            Self::ApisixConsumer => "ApisixConsumer",
            Self::ApisixGlobalRule => "ApisixGlobalRule",
        }
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Status of a condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum ConditionStatus {
    /// `"True"`
    True,
    /// `"False"`
    False,
}

impl ConditionStatus {
    /// `"True"` or `"False"`, as in a Kubernetes condition.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
        }
    }
}

/// One condition, without timestamps (translation is pure).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Condition {
    /// `Accepted` or `ResolvedRefs`.
    #[serde(rename = "type")]
    pub type_: String,
    /// True or False.
    pub status: ConditionStatus,
    /// CamelCase reason, e.g. `InvalidSpec`.
    pub reason: String,
    /// Human-readable detail naming the field at fault.
    pub message: String,
}

impl Condition {
    pub(crate) fn new(type_: &str, status: ConditionStatus, reason: &str, message: String) -> Self {
        Self {
            type_: type_.to_owned(),
            status,
            reason: reason.to_owned(),
            message,
        }
    }
}

/// The translation verdict for one object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStatus {
    /// Kind of the object.
    pub kind: ObjectKind,
    /// Namespace of the object.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
    /// `metadata.generation` the conditions were computed from (to write as
    /// `observedGeneration`); `None` when the object had none (standalone YAML).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// `Accepted` always comes first; `ResolvedRefs` follows when relevant.
    pub conditions: Vec<Condition>,
    /// Ids of the snapshot routes this object produced, sorted. Empty when not accepted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<String>,
}

impl ObjectStatus {
    /// The condition of the given type, if present.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Whether the object is `Accepted=True`.
    pub fn is_accepted(&self) -> bool {
        self.condition(CONDITION_ACCEPTED)
            .is_some_and(|c| c.status == ConditionStatus::True)
    }
}

/// The translation verdict for one `networking.k8s.io/v1` Ingress of this controller's class.
///
/// Kept apart from [`StatusReport`] (and [`ObjectKind`]) on purpose: an Ingress has no
/// status conditions to write (its status is the load-balancer address), so a status writer
/// that patches `.status.conditions` of every [`ObjectStatus`] must not see these. Publish
/// them as Events or logs instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IngressStatus {
    /// Namespace of the Ingress.
    pub namespace: String,
    /// Name of the Ingress.
    pub name: String,
    /// `metadata.generation` the conditions were computed from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// `Accepted` always comes first; `ResolvedRefs` follows when accepted.
    pub conditions: Vec<Condition>,
    /// Ids of the snapshot routes this Ingress produced, sorted. Empty when not accepted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<String>,
}

impl IngressStatus {
    /// The condition of the given type, if present.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// Status of every object translation looked at (objects filtered out by ingress class are
/// not listed: they belong to another controller). Sorted by kind, namespace, name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct StatusReport {
    /// One entry per object.
    pub objects: Vec<ObjectStatus>,
    /// Gateway API status (GatewayClass, Gateway, HTTPRoute, GRPCRoute). Not part of the
    /// serialized list above: its shape is the Gateway API's own (listeners, route parents).
    #[serde(skip)]
    pub gateway: crate::gateway::GatewayStatusReport,
}

impl StatusReport {
    /// The status of one object, if translation looked at it.
    pub fn get(&self, kind: ObjectKind, namespace: &str, name: &str) -> Option<&ObjectStatus> {
        self.objects
            .binary_search_by(|o| {
                (o.kind, o.namespace.as_str(), o.name.as_str()).cmp(&(kind, namespace, name))
            })
            .ok()
            .and_then(|i| self.objects.get(i))
    }

    pub(crate) fn sort(&mut self) {
        self.objects
            .sort_by(|a, b| (a.kind, &a.namespace, &a.name).cmp(&(b.kind, &b.namespace, &b.name)));
    }
}
