//! `client-control` (priority 22000, rewrite phase): `max_body_size` answers 413 to a
//! request whose `Content-Length` exceeds it (0 = no limit), before any other plugin runs.
//!
//! A body without `Content-Length` (chunked HTTP/1.1, HTTP/2 without the header) is
//! counted as it streams upstream ([`BodyLimit`] in the request's extensions): the chunk
//! that would pass the limit is not sent, the upstream request is cut short (its
//! connection closed) and the client gets 413, as nginx's `client_max_body_size`. NB: on
//! the HTTP/1.1 upstream path only; to HTTP/2, gRPC and TLS upstreams such a body is not
//! limited yet (docs/plugins.md says so).

use http::{StatusCode, request};
use sluice_plugin_config::ConfigError;
use sluice_plugin_config::client_control::ClientControl as Config;

use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx, rejection};
use crate::upstream::body::BodyLimit;

/// The plugin.
#[derive(Debug)]
pub struct ClientControl {
    max_body_size: Option<u64>,
}

impl Builtin for ClientControl {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE;

    /// Builds `client-control`.
    fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        Ok(ClientControl {
            max_body_size: conf.max_body_size.filter(|&n| n > 0),
        })
    }
}

impl Plugin for ClientControl {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, _ctx: &'a mut PluginCtx) -> Flow<'a> {
        let Some(max) = self.max_body_size else {
            return Flow::Continue;
        };
        let len = req
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        match len {
            Some(n) if n > max => Flow::respond(rejection(
                StatusCode::PAYLOAD_TOO_LARGE,
                Some("413 Request Entity Too Large"),
            )),
            Some(_) => Flow::Continue,
            None => {
                // NB: the body's length is unknown here (chunked, HTTP/2): the upstream
                // layer counts it as it streams.
                req.extensions.insert(BodyLimit(max));
                Flow::Continue
            }
        }
    }
}
