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
//! - [`grpc`]: the snapshot channel (server side) and per-dataplane ACK/NACK tracking.
//! - [`tls`]: mutual TLS from PEM files; `--insecure` only on loopback.
//! - [`metrics`]: the controller's Prometheus metrics.
#![forbid(unsafe_code)]

pub mod grpc;
pub mod metrics;
pub mod tls;
