//! `response-rewrite` (priority 899, response phases): when `vars` holds (always without
//! `vars`; `status` is the upstream's status), sets `status_code`, applies `headers`
//! (values may hold request `$var`s), and replaces the body with
//! `body` or applies `filters` (regex replacements over the whole body, which is then
//! buffered up to `max_resp_body_size`; a gzip body is decoded first, another encoding is
//! left alone). A changed body loses `Content-Length` (sent chunked),
//! `Content-Encoding`, `ETag` and `Last-Modified`. Headers are applied in the order add,
//! set, remove.

use std::io::Write as _;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use flate2::write::GzDecoder;
use http::header;
use http::{request, response};
use sluice_plugin_config::response_rewrite::{Compiled, ResponseRewrite as Config};
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::support::rewrite::{self, stash_request, stashed_request};
use super::{BodyFilter, BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx};

/// The plugin.
#[derive(Debug)]
pub struct ResponseRewrite {
    c: Arc<Compiled>,
    needs_request: bool,
}

/// This request's response was rewritten (the body filter then applies).
#[derive(Debug, Clone, Copy)]
struct Applied {
    filters: bool,
    gzip: bool,
}

impl Builtin for ResponseRewrite {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE
        .with(Hooks::RESPONSE_HEADERS)
        .with(Hooks::BODY_FILTER);

    /// Builds `response-rewrite`.
    fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let c = conf.compile().map_err(|e| ConfigError::Field {
            plugin: Config::NAME.into(),
            field: e.field,
            reason: e.reason,
        })?;
        let templated = c
            .headers
            .add
            .iter()
            .map(|(_, t)| t)
            .chain(c.headers.set.iter().flat_map(|(_, ts)| ts.iter()))
            .any(|t| t.as_literal().is_none());
        Ok(ResponseRewrite {
            needs_request: templated || c.vars.is_some(),
            c: Arc::new(c),
        })
    }
}

impl Plugin for ResponseRewrite {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        if self.needs_request {
            stash_request(req, ctx);
        }
        Flow::Continue
    }

    fn response_headers(&self, resp: &mut response::Parts, ctx: &mut PluginCtx) {
        let req = match stashed_request(ctx) {
            Some(r) => r,
            // The request was answered before this plugin's rewrite phase ran.
            None if self.needs_request => return,
            None => Arc::new(http::Request::new(()).into_parts().0),
        };
        if let Some(v) = &self.c.vars
            && !rewrite::eval(v, &req, ctx, Some(resp.status.as_u16()))
        {
            return;
        }
        if let Some(s) = self.c.status {
            resp.status = super::status(s);
            ctx.status = resp.status;
        }
        let encoding = resp
            .headers
            .get(header::CONTENT_ENCODING)
            .map(|v| v.as_bytes().to_ascii_lowercase());
        let gzip = encoding.as_deref() == Some(b"gzip");
        // NB: filters need the plain text; a gzip body is decoded, another encoding is
        // left alone (APISIX would drop the header and garble the body).
        let filters = !self.c.filters.is_empty() && (encoding.is_none() || gzip);
        if self.c.body.is_some() || filters {
            resp.headers.remove(header::CONTENT_LENGTH);
            resp.headers.remove(header::CONTENT_ENCODING);
            resp.headers.remove(header::ETAG);
            resp.headers.remove(header::LAST_MODIFIED);
            ctx.extensions.insert(Applied { filters, gzip });
        }
        if !self.c.headers.is_empty() {
            rewrite::render_ops(&self.c.headers, &req, ctx, None).apply(&mut resp.headers);
        }
    }

    fn body_filter(&self, ctx: &mut PluginCtx) -> Option<Box<dyn BodyFilter>> {
        let applied = ctx.extensions.remove::<Applied>()?;
        if let Some(b) = &self.c.body {
            return Some(Box::new(Replace {
                body: Some(Bytes::from(b.clone())),
            }));
        }
        applied.filters.then(|| {
            Box::new(Filters {
                c: Arc::clone(&self.c),
                buf: BytesMut::new(),
                gunzip: applied.gzip.then(|| GzDecoder::new(Vec::new())),
                overflow: false,
            }) as Box<dyn BodyFilter>
        })
    }
}

/// Drops the upstream body and sends `body` at the end.
struct Replace {
    body: Option<Bytes>,
}

impl BodyFilter for Replace {
    fn data(&mut self, _chunk: Bytes, _ctx: &mut PluginCtx) -> Bytes {
        Bytes::new()
    }

    fn end(&mut self, _ctx: &mut PluginCtx) -> Option<Bytes> {
        self.body.take()
    }
}

/// Buffers the (decoded) body and applies the regex filters at the end; a body longer
/// than `max_resp_body_size` passes unfiltered.
struct Filters {
    c: Arc<Compiled>,
    buf: BytesMut,
    gunzip: Option<GzDecoder<Vec<u8>>>,
    overflow: bool,
}

impl Filters {
    fn decode(&mut self, chunk: &[u8]) -> Bytes {
        match self.gunzip.as_mut() {
            // NB: a corrupt gzip stream yields what decoded so far.
            Some(d) => {
                let _ = d.write_all(chunk);
                Bytes::from(std::mem::take(d.get_mut()))
            }
            None => Bytes::copy_from_slice(chunk),
        }
    }
}

impl BodyFilter for Filters {
    fn data(&mut self, chunk: Bytes, _ctx: &mut PluginCtx) -> Bytes {
        let plain = if self.gunzip.is_some() {
            self.decode(&chunk)
        } else {
            chunk
        };
        if self.overflow {
            return plain;
        }
        self.buf.extend_from_slice(&plain);
        if self.buf.len() > self.c.max_body {
            self.overflow = true;
            return std::mem::take(&mut self.buf).freeze();
        }
        Bytes::new()
    }

    fn end(&mut self, _ctx: &mut PluginCtx) -> Option<Bytes> {
        if let Some(d) = self.gunzip.take() {
            let rest = d.finish().unwrap_or_default();
            if self.overflow {
                return Some(Bytes::from(rest));
            }
            self.buf.extend_from_slice(&rest);
        }
        if self.overflow {
            return None;
        }
        let raw = std::mem::take(&mut self.buf);
        if raw.len() > self.c.max_body {
            return Some(raw.freeze());
        }
        // NB: a body that is not UTF-8 text is sent as it came.
        let Ok(text) = std::str::from_utf8(&raw) else {
            return Some(raw.freeze());
        };
        let mut text = text.to_owned();
        for f in &self.c.filters {
            text = if f.global {
                f.regex.replace_all(&text, f.replace.as_str()).into_owned()
            } else {
                f.regex.replace(&text, f.replace.as_str()).into_owned()
            };
        }
        Some(Bytes::from(text))
    }
}
