//! The Sluice controller: watches the cluster, translates it into route snapshots and pushes
//! them to dataplanes over a mutually authenticated gRPC stream.
//!
//! ```text
//! kube-apiserver ─watch─▶ reflector stores ─▶ rebuild loop (debounce, translate, seal)
//!                                                   │ publish
//!                                                   ▼
//!                                  grpc::Hub (watch) ─stream─▶ dataplanes ─ACK/NACK─┐
//!                                                   ▲                               │
//!                                                   └───────────────────────────────┘
//! ```
//!
//! - [`app`]: all of the below wired together against a Kubernetes client.
//! - [`watch`]: kube-runtime reflectors for every input kind; skips no-op events.
//! - [`cluster`]: which objects are ours (ingress class) and the state translation sees.
//! - [`rebuild`]: the debounced rebuild loop; seals a new version when the content changes.
//! - [`grpc`]: the snapshot channel (server side) and per-dataplane ACK/NACK tracking. Every
//!   replica serves dataplanes, leader or not.
//! - [`fleet`]: which dataplanes should serve and what each serves (pure).
//! - [`records`]: each replica's record of its dataplanes (a Lease), shared by all replicas;
//!   the expected set from the dataplane Service's EndpointSlices.
//! - [`tls`]: mutual TLS from PEM files; `--insecure` only on loopback.
//! - [`status`]: the status writer (leader only): one loop ([`status::writer`]) over pure
//!   `desired(...)` functions per family: Apisix conditions (`Accepted`, `ResolvedRefs`,
//!   `Programmed`), Gateway API status, Ingress `status.loadBalancer`, Warning Events and
//!   the per-Gateway Services.
//! - [`context`]: what every task shares (client, metrics, hub, fleet, stores, rebuild
//!   output, leadership).
//! - [`leader`]: Lease-based leader election (who writes status).
//! - [`metrics`], [`http`]: Prometheus metrics, `/healthz`, `/readyz`.
#![forbid(unsafe_code)]

pub mod app;
pub mod cluster;
pub mod context;
pub mod fleet;
pub mod grpc;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod rebuild;
pub mod records;
pub mod status;
pub mod tls;
pub mod watch;
