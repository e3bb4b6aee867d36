//! Listeners: where connections come in. Accept loops and workers ([`server`]), HTTPS
//! termination ([`tls`]), idle HTTP/1.1 connections parked without their buffers
//! ([`idle`]), per-Gateway ports opened from the snapshot ([`gateway`]), and the
//! admin listener ([`admin`]: probes, metrics, snapshot). A listener that requires the
//! PROXY protocol reads its header first ([`proxy_protocol`]). Before routing, the HTTP and
//! HTTPS listeners run the mTLS guard ([`mtls`]) on each request.
//! Each accepted request is handed to [`crate::request::handle`].

pub mod admin;
pub mod gateway;
pub(crate) mod idle;
pub mod mtls;
pub mod proxy_protocol;
pub mod server;
pub mod tls;
