//! Upstreams: ApisixUpstream settings, Service/EndpointSlice resolution and external nodes.
//!
//! Service resolution, per `backends[]` entry:
//!
//! - `resolveGranularity: endpoint` (default): every address of every endpoint whose
//!   `conditions.ready` is not `false`, from the EndpointSlices labelled
//!   `kubernetes.io/service-name=<service>` in the same namespace, with the port of the slice
//!   port named like the Service port (unnamed = `""`). Deduplicated and sorted.
//! - `resolveGranularity: service`: the Service's ClusterIP(s) and the Service port. A
//!   headless Service (`clusterIP: None`) has no virtual IP, so its endpoints are used
//!   instead, as for `endpoint`. A Service without a ClusterIP yet gets no endpoints and a
//!   `ResolvedRefs=False` condition.
//! - A Service of type `ExternalName` resolves to its `externalName` and the Service port (or
//!   the number given in `servicePort` when the Service lists no ports), for either
//!   granularity.
//! - `subset: NAME`: the ApisixUpstream named after the Service must define `subsets[]` entry
//!   `NAME` (else the route is rejected, `Accepted=False` naming the `subset` field). Its
//!   upstream (`...#<subset>`) gets only the endpoints whose `targetRef` is a Pod carrying
//!   every label of the subset (Pod labels come from [`crate::ClusterState::pods`]). No
//!   matching endpoint keeps the route with `ResolvedRefs=False` naming the subset and its
//!   labels (requests get 503). A subset needs Pods, so it is resolved from EndpointSlices
//!   even with `resolveGranularity: service`, and is unresolved for an ExternalName Service.
//! - `scheme: https|grpcs`: the upstream gets `tls` (see [`settings::tls_from_secret`]): the server
//!   name verified and sent as SNI is `<service>.<namespace>.svc` for Service backends (the
//!   Service's cluster DNS name, which in-cluster certificates carry), and the node or
//!   externalName host otherwise (the dataplane's default for an empty `sni`).
//!
//! Files: [`service`] resolves Service backends (above); [`settings`] validates an
//! ApisixUpstream into the settings every upstream of its Service gets (load balancer,
//! scheme, retries, timeouts, `tlsSecret`), with [`hash_on`], [`health_check`] and
//! [`pass_host`] (`passHost`/`upstreamHost`) for the fields of those names.

pub(crate) mod hash_on;
pub(crate) mod health_check;
pub(crate) mod pass_host;
pub(crate) mod service;
pub(crate) mod settings;

pub(crate) use service::{BackendRef, find_port, inline_upstream, service_upstream};
pub(crate) use settings::{UpstreamObject, duration_ms, parse_timeout, timeouts, validate_object};
