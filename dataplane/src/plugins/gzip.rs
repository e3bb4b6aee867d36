//! `gzip` (priority 995, response phases): compresses the response as it streams when the
//! client accepts gzip (`Accept-Encoding`, HTTP version at least `http_version`), the
//! upstream did not encode it, it has a `Content-Type` in `types` (`*` for any) and its
//! `Content-Length` (when known) is at least `min_length`. Sets `Content-Encoding: gzip`,
//! drops `Content-Length`, and adds `Vary: Accept-Encoding` with `vary`. Its response phases
//! run after every other plugin's (as nginx's gzip filter). `buffers` is accepted and
//! ignored.

use std::io::Write as _;

use bytes::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use http::header::{self, HeaderValue};
use http::{Method, StatusCode, Version, request, response};
use sluice_plugin_config::gzip::Gzip as Config;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{BodyFilter, BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx};

/// The plugin.
#[derive(Debug)]
pub struct Gzip {
    types: Option<Vec<String>>,
    min_length: u64,
    level: u32,
    min_version: Version,
    vary: bool,
}

/// Whether the client takes gzip for this request.
#[derive(Debug, Clone, Copy)]
struct Accepts;

/// The response is being compressed.
#[derive(Debug, Clone, Copy)]
struct On;

impl Builtin for Gzip {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE
        .with(Hooks::RESPONSE_HEADERS)
        .with(Hooks::BODY_FILTER)
        .with(Hooks::ENCODES_BODY);

    /// Builds `gzip`.
    fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let types = conf.type_list().map_err(|e| ConfigError::Field {
            plugin: Config::NAME.into(),
            field: e.field,
            reason: e.reason,
        })?;
        Ok(Gzip {
            types,
            min_length: conf.min_length,
            level: conf.comp_level,
            min_version: if conf.http_version < 1.1 {
                Version::HTTP_10
            } else {
                Version::HTTP_11
            },
            vary: conf.vary,
        })
    }
}

/// Whether `Accept-Encoding` values accept gzip (a `gzip` or `*` coding with q > 0).
pub fn accepts_gzip(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or("").trim();
            if !(name.eq_ignore_ascii_case("gzip") || name == "*") {
                return false;
            }
            parts.all(|p| {
                let p = p.trim();
                match p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")) {
                    Some(q) => q.trim().parse::<f32>().map_or(true, |q| q > 0.0),
                    None => true,
                }
            })
        })
}

impl Plugin for Gzip {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        if req.method != Method::HEAD
            && req.version >= self.min_version
            && accepts_gzip(&req.headers)
        {
            ctx.extensions.insert(Accepts);
        }
        Flow::Continue
    }

    fn response_headers(&self, resp: &mut response::Parts, ctx: &mut PluginCtx) {
        if ctx.extensions.get::<Accepts>().is_none()
            || matches!(
                resp.status,
                StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED
            )
            || resp.status.is_informational()
            || resp.headers.contains_key(header::CONTENT_ENCODING)
        {
            return;
        }
        // Like nginx: no Content-Type, no compression (even with `*`).
        let Some(ct) = resp
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| v.trim().to_ascii_lowercase())
        else {
            return;
        };
        if let Some(types) = &self.types
            && !types.contains(&ct)
        {
            return;
        }
        let len = resp
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if len.is_some_and(|l| l < self.min_length) {
            return;
        }
        resp.headers
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        resp.headers.remove(header::CONTENT_LENGTH);
        if self.vary {
            resp.headers
                .append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
        }
        ctx.extensions.insert(On);
    }

    fn body_filter(&self, ctx: &mut PluginCtx) -> Option<Box<dyn BodyFilter>> {
        ctx.extensions.remove::<On>()?;
        Some(Box::new(Encoder {
            enc: Some(GzEncoder::new(Vec::new(), Compression::new(self.level))),
        }))
    }
}

/// Compresses chunks as they pass; what the compressor holds back comes out at the end.
struct Encoder {
    enc: Option<GzEncoder<Vec<u8>>>,
}

impl BodyFilter for Encoder {
    fn data(&mut self, chunk: Bytes, _ctx: &mut PluginCtx) -> Bytes {
        let Some(enc) = self.enc.as_mut() else {
            return Bytes::new();
        };
        // NB: writing into a Vec cannot fail.
        let _ = enc.write_all(&chunk);
        Bytes::from(std::mem::take(enc.get_mut()))
    }

    fn end(&mut self, _ctx: &mut PluginCtx) -> Option<Bytes> {
        let enc = self.enc.take()?;
        enc.finish().ok().map(Bytes::from)
    }
}
