//! Rust types of the Gateway API kinds Sluice reads (`gateway.networking.k8s.io`, standard
//! channel v1.6.3): GatewayClass, Gateway, ListenerSet, HTTPRoute, GRPCRoute, TLSRoute, TCPRoute,
//! UDPRoute (v1), ReferenceGrant
//! (v1beta1, the storage version; v1 has the same schema) and BackendTLSPolicy (v1).
//!
//! Only the fields Sluice uses are modelled, plus the status types the controller writes.
//! Unknown fields are ignored, as Kubernetes clients do. Enumerations (protocols, path match
//! types, filter types, ...) are plain strings: an unknown value is a status condition on
//! the object (`UnsupportedValue`), never a parse error.
//!
//! The CRDs users install are the vendored upstream ones in `crds/gateway-api/`, not generated
//! from these types (hence `schema = "disabled"`), and these kinds are not part of
//! [`crate::crds`].
// NB: kube's derive repeats keys such as `derive` by design; clippy mistakes them for
// duplicated attributes.
#![allow(clippy::duplicated_attributes)]

pub mod backend_tls_policy;
pub mod gateway_class;
pub mod gateway_spec;
pub mod grpc_route;
pub mod http_route;
pub mod listener_set;
pub mod reference_grant;
pub mod shared;
pub mod stream_route;

pub use backend_tls_policy::*;
pub use gateway_class::*;
pub use gateway_spec::*;
pub use grpc_route::*;
pub use http_route::*;
pub use listener_set::*;
pub use reference_grant::*;
pub use shared::*;
pub use stream_route::*;

/// API group of every Gateway API kind.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
/// Gateway API release the types and the vendored CRDs follow.
pub const GATEWAY_API_BUNDLE_VERSION: &str = "v1.6.3";
