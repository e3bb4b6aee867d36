//! Gateway API status computed by translation: what the controller writes into
//! `GatewayClass.status`, `Gateway.status`, `ListenerSet.status` and the routes'
//! `status.parents[]`.
//!
//! Conditions carry no timestamps (translation is pure); `generation` is the
//! `metadata.generation` they were computed from, to write as `observedGeneration` on every
//! condition. Every list is sorted, so the report is deterministic.
//!
//! `Programmed` is translation's half of the verdict: `True` means "valid and in the
//! snapshot". The controller must only write `Programmed=True` once the connected dataplanes
//! ACKed a snapshot containing [`GatewayStatus::routes`] / [`GatewayStatus::certificates`];
//! until then it writes `Programmed=False` with reason `Pending`.

use std::collections::BTreeMap;

use serde::Serialize;
use sluice_crds::gateway::{ParentReference, RouteGroupKind};

use crate::status::Condition;

/// Condition type `Accepted`.
pub const ACCEPTED: &str = "Accepted";
/// Condition type `Programmed`.
pub const PROGRAMMED: &str = "Programmed";
/// Condition type `ResolvedRefs`.
pub const RESOLVED_REFS: &str = "ResolvedRefs";
/// Condition type `Conflicted` (listeners).
pub const CONFLICTED: &str = "Conflicted";
/// Condition type `PartiallyInvalid` (routes with some rules left out).
pub const PARTIALLY_INVALID: &str = "PartiallyInvalid";

/// Reasons used in the Gateway API conditions (the upstream constants' values).
pub mod reason {
    /// `Accepted` = True.
    pub const ACCEPTED: &str = "Accepted";
    /// `Programmed` = True.
    pub const PROGRAMMED: &str = "Programmed";
    /// `ResolvedRefs` = True.
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    /// `Conflicted` = False.
    pub const NO_CONFLICTS: &str = "NoConflicts";
    /// `Programmed` = False: the object is invalid.
    pub const INVALID: &str = "Invalid";
    /// GatewayClass / Gateway `Accepted` = False: parameters Sluice does not take.
    pub const INVALID_PARAMETERS: &str = "InvalidParameters";
    /// Gateway `Accepted` = False: no listener is valid.
    pub const LISTENERS_NOT_VALID: &str = "ListenersNotValid";
    /// Gateway `Accepted` = False: `spec.addresses` cannot be honoured.
    pub const UNSUPPORTED_ADDRESS: &str = "UnsupportedAddress";
    /// Gateway `Programmed` = False: a requested address cannot be used (yet).
    pub const ADDRESS_NOT_USABLE: &str = "AddressNotUsable";
    /// Listener `Accepted` = False: the dataplane fleet does not serve this port for this
    /// protocol.
    pub const PORT_UNAVAILABLE: &str = "PortUnavailable";
    /// Listener `Accepted` = False: protocol other than HTTP / HTTPS. Route `ResolvedRefs` =
    /// False: a backend needs a protocol Sluice cannot speak to it (TLS asked for by a
    /// BackendTLSPolicy).
    pub const UNSUPPORTED_PROTOCOL: &str = "UnsupportedProtocol";
    /// Listener / route condition: a value Sluice cannot serve as written.
    pub const UNSUPPORTED_VALUE: &str = "UnsupportedValue";
    /// Listener `ResolvedRefs` = False: a certificate Secret is missing or unusable.
    pub const INVALID_CERTIFICATE_REF: &str = "InvalidCertificateRef";
    /// `ResolvedRefs` = False: a cross-namespace reference without a ReferenceGrant.
    pub const REF_NOT_PERMITTED: &str = "RefNotPermitted";
    /// Listener `ResolvedRefs` = False: `allowedRoutes.kinds` names a kind Sluice does not
    /// serve.
    pub const INVALID_ROUTE_KINDS: &str = "InvalidRouteKinds";
    /// Listener `Conflicted` = True: same port, protocol and hostname as another listener.
    pub const HOSTNAME_CONFLICT: &str = "HostnameConflict";
    /// Listener `Conflicted` = True: same port as a listener of another protocol.
    pub const PROTOCOL_CONFLICT: &str = "ProtocolConflict";
    /// Route `Accepted` = False: no listener allows the route's namespace or kind.
    pub const NOT_ALLOWED_BY_LISTENERS: &str = "NotAllowedByListeners";
    /// Route `Accepted` = False: no listener hostname intersects the route's hostnames.
    pub const NO_MATCHING_LISTENER_HOSTNAME: &str = "NoMatchingListenerHostname";
    /// Route `Accepted` = False: no listener matches `sectionName` / `port`, or the Gateway
    /// is not accepted.
    pub const NO_MATCHING_PARENT: &str = "NoMatchingParent";
    /// Route `ResolvedRefs` = False: a backend Service or port does not exist.
    pub const BACKEND_NOT_FOUND: &str = "BackendNotFound";
    /// Route `ResolvedRefs` = False: a backend of a kind other than Service.
    pub const INVALID_KIND: &str = "InvalidKind";
    /// Listener `ResolvedRefs` = False: a frontend validation CA reference does not resolve.
    pub const INVALID_CA_CERTIFICATE_REF: &str = "InvalidCACertificateRef";
    /// Listener `ResolvedRefs` = False: a frontend validation CA reference of a kind Sluice
    /// does not read.
    pub const INVALID_CA_CERTIFICATE_KIND: &str = "InvalidCACertificateKind";
    /// Listener `Accepted` = False: no frontend validation CA reference is usable.
    pub const NO_VALID_CA_CERTIFICATE: &str = "NoValidCACertificate";
    /// Gateway `InsecureFrontendValidationMode` = True.
    pub const CONFIGURATION_CHANGED: &str = "ConfigurationChanged";
    /// Programmed = False until dataplanes ACK (written by the controller, never here).
    pub const PENDING: &str = "Pending";
    /// ListenerSet `Accepted` / `Programmed` = False: its Gateway's `allowedListeners` does
    /// not admit its namespace.
    pub const NOT_ALLOWED: &str = "NotAllowed";
    /// ListenerSet `Accepted` / `Programmed` = False: its Gateway is not accepted.
    pub const PARENT_NOT_ACCEPTED: &str = "ParentNotAccepted";
}

/// Status of a GatewayClass whose `controllerName` is Sluice's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassStatus {
    /// Name (cluster-scoped).
    pub name: String,
    /// `metadata.generation`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// `Accepted`.
    pub conditions: Vec<Condition>,
    /// `status.supportedFeatures[].name`, sorted.
    pub supported_features: Vec<String>,
}

/// Status of one listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatus {
    /// Listener name.
    pub name: String,
    /// Route kinds the listener accepts (the valid part of `allowedRoutes.kinds`).
    pub supported_kinds: Vec<RouteGroupKind>,
    /// Routes attached (accepted by this listener), counted once per route.
    pub attached_routes: i32,
    /// `Accepted`, `Conflicted`, `ResolvedRefs`, `Programmed`, in that order.
    pub conditions: Vec<Condition>,
}

/// Status of a Gateway of one of Sluice's GatewayClasses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.generation`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// `Accepted`, `Programmed`.
    pub conditions: Vec<Condition>,
    /// In `spec.listeners` order.
    pub listeners: Vec<ListenerStatus>,
    /// Snapshot route and stream route ids served through this Gateway, sorted (for
    /// `Programmed`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<String>,
    /// Snapshot certificate ids of its HTTPS listeners (and those of its ListenerSets),
    /// sorted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<String>,
    /// `status.attachedListenerSets`: how many ListenerSets are accepted on it; `None` when
    /// its `allowedListeners` admits none and none is attached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attached_listener_sets: Option<i32>,
    /// `spec.addresses` with a value, as IPs (at most one per family) for the Gateway's
    /// own Service; its `Programmed` waits until that Service has them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub static_addresses: Vec<String>,
    /// `spec.infrastructure.labels`, for the Gateway's own Service.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub infrastructure_labels: BTreeMap<String, String>,
    /// `spec.infrastructure.annotations`, for the Gateway's own Service.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub infrastructure_annotations: BTreeMap<String, String>,
}

/// Status of a ListenerSet whose parent is a Gateway of one of Sluice's classes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerSetStatus {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.generation`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Namespace of the parent Gateway. Its `Programmed` verdict from the dataplanes is the
    /// set's: the set's listeners serve on its ports.
    pub gateway_namespace: String,
    /// Name of the parent Gateway.
    pub gateway_name: String,
    /// `Accepted`, `Programmed`.
    pub conditions: Vec<Condition>,
    /// In `spec.listeners` order; empty when the set is not attached.
    pub listeners: Vec<ListenerStatus>,
}

/// `HTTPRoute`, `GRPCRoute`, `TLSRoute`, `TCPRoute` or `UDPRoute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum RouteKind {
    /// `HTTPRoute`.
    #[serde(rename = "HTTPRoute")]
    HttpRoute,
    /// `GRPCRoute`.
    #[serde(rename = "GRPCRoute")]
    GrpcRoute,
    /// `TLSRoute`.
    #[serde(rename = "TLSRoute")]
    TlsRoute,
    /// `TCPRoute`.
    #[serde(rename = "TCPRoute")]
    TcpRoute,
    /// `UDPRoute`.
    #[serde(rename = "UDPRoute")]
    UdpRoute,
}

impl RouteKind {
    /// The Kubernetes `kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HttpRoute => "HTTPRoute",
            Self::GrpcRoute => "GRPCRoute",
            Self::TlsRoute => "TLSRoute",
            Self::TcpRoute => "TCPRoute",
            Self::UdpRoute => "UDPRoute",
        }
    }
}

/// One `status.parents[]` entry of a route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    /// The parentRef as written (to match the entry the controller owns).
    pub parent_ref: ParentReference,
    /// `Accepted`, `ResolvedRefs`, and `PartiallyInvalid` when some rules were left out.
    pub conditions: Vec<Condition>,
}

/// Status of a route (any [`RouteKind`]) with at least one parent Sluice owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    /// Kind.
    pub kind: RouteKind,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.generation`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// One entry per parentRef that names a Gateway of Sluice's classes, in spec order.
    pub parents: Vec<RouteParentStatus>,
    /// Snapshot route ids produced, sorted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<String>,
}

/// The Gateway API part of the [`crate::StatusReport`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatusReport {
    /// The `controllerName` status entries are written for.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub controller_name: String,
    /// Sluice's GatewayClasses, by name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gateway_classes: Vec<GatewayClassStatus>,
    /// Gateways of those classes, by namespace and name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<GatewayStatus>,
    /// ListenerSets whose parent is one of those Gateways, by namespace and name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub listener_sets: Vec<ListenerSetStatus>,
    /// Routes with a parent among those Gateways, by kind, namespace and name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteStatus>,
    /// BackendTLSPolicies used by those routes, by namespace and name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backend_tls_policies: Vec<super::BackendTlsPolicyStatus>,
}
