//! The Sluice dataplane: listeners, request path, router, plugins, upstream pools, and the
//! configuration that flows in from the controller or from YAML files.
//!
//! Folders by stage of a request, dependencies pointing down only (a test,
//! `tests/layering.rs`, fails on an import that points up):
//!
//! ```text
//! listener   accept, TLS termination, admin              ─┐
//! stream     layer-4 connections: TCP, TLS by SNI, UDP     │
//! request    the phases of one request, errors → responses │  each imports only
//! config     snapshot store, compiled table, sources       │  the folders below it
//! router     host index, path trie, exprs                  │
//! plugins    the APISIX-compatible plugin chain            │
//! upstream   pools, balancers, health, h1/h2/WebSocket/TLS │
//! http       shared HTTP facts and header rules            ─┘
//! ```
//!
//! Below them all, the `sluice-io` crate (`lib/io`): write batching, the coarse timer, the
//! send timeout, idle parking, the HTTP/1.1 upstream codec and the allocator: the only
//! `unsafe` code (this crate forbids it).
//!
//! Request flow: [`listener::server`] accepts → [`request::handle`] reads the current
//! [`config::table::RouteTable`] once → [`router`] picks a route → [`plugins`] run their
//! request phases → [`upstream`] picks an endpoint and a pooled connection → the response
//! streams back through [`upstream::body::ProxyBody`]. Errors become responses in
//! [`request::error`] only. `docs/architecture.md` has the whole picture.

#![forbid(unsafe_code)]

pub mod config;
pub mod http;
pub mod listener;
pub mod plugins;
pub mod request;
pub mod router;
pub mod stream;
pub mod upstream;
