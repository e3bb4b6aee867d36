//! The Sluice dataplane: listeners, router, upstream pools, snapshot store, admin endpoint
//! and the standalone (YAML file) configuration source.
//!
//! Request flow: [`server`] accepts → [`proxy::handle`] reads the current
//! [`table::RouteTable`] once → [`router`] picks a route → [`upstream`] picks an endpoint and a
//! pooled connection → the response streams back through [`body::ProxyBody`]. Errors become
//! responses in [`error::ProxyError::into_response`] only (or
//! [`error::ProxyError::into_grpc_response`] for gRPC clients).
//!
//! Upstream protocols: plain `http` upstreams use the in-task HTTP/1.1 client of [`h1`];
//! schemes `grpc`, `grpcs` and `https` go through [`h2up`] (HTTP/2 multiplexed per worker
//! and endpoint, TLS via [`upstream_tls`]); WebSocket upgrades on routes with
//! `websocket: true` are spliced by [`websocket`]. Both pick endpoints, retry and feed the
//! passive health checks in [`failover`].

// NB: `deny`, not `forbid`: the one exception is [`wbatch`], whose system calls (send(2),
// io_uring submissions) are `unsafe` FFI, each with its safety argument.
#![deny(unsafe_code)]

pub mod admin;
pub mod balancer;
pub mod body;
pub mod controller_client;
pub mod dns;
pub mod error;
pub mod failover;
pub mod h1;
pub mod h2up;
pub mod health;
pub mod metrics;
pub mod plugins;
pub mod proxy;
pub mod router;
pub mod server;
pub mod standalone;
pub mod store;
pub mod table;
pub mod timer;
pub mod tls;
pub mod upstream;
pub mod upstream_tls;
pub mod wbatch;
pub mod websocket;
