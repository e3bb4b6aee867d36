//! The Sluice dataplane: listeners, router, upstream pools, snapshot store, admin endpoint
//! and the standalone (YAML file) configuration source.
//!
//! Request flow: [`server`] accepts → [`proxy::handle`] reads the current
//! [`table::RouteTable`] once → [`router`] picks a route → [`upstream`] picks an endpoint and a
//! pooled connection → the response streams back through [`body::ProxyBody`]. Errors become
//! responses in [`error::ProxyError::into_response`] only.

#![forbid(unsafe_code)]

pub mod admin;
pub mod balancer;
pub mod body;
pub mod controller_client;
pub mod dns;
pub mod error;
pub mod h1;
pub mod health;
pub mod metrics;
pub mod proxy;
pub mod router;
pub mod server;
pub mod standalone;
pub mod store;
pub mod table;
pub mod timer;
pub mod tls;
pub mod upstream;
