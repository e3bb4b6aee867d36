//! `response-rewrite` (priority 899, response phases): when `vars` holds (always without
//! `vars`; `status` is the upstream's status), sets `status_code`, applies `headers`
//! (`add`, `remove`, `set`; values may hold request `$var`s), and replaces the body with
//! `body` or applies `filters` (regex replacements over the whole body, which is then
//! buffered; skipped for an encoded body, as APISIX). A changed body loses
//! `Content-Length` (sent chunked), `ETag` and `Last-Modified`.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::header;
use http::{request, response};
use sluice_plugin_config::response_rewrite::{Compiled, ResponseRewrite as Config};
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::rewrite::{self, stash_request, stashed_request};
use super::{BodyFilter, BuildCtx, Flow, Plugin, PluginCtx};

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
}

/// Builds `response-rewrite`.
pub fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Arc<dyn Plugin>, ConfigError> {
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
    Ok(Arc::new(ResponseRewrite {
        needs_request: templated || c.vars.is_some(),
        c: Arc::new(c),
    }))
}

impl Plugin for ResponseRewrite {
    fn name(&self) -> &'static str {
        Config::NAME
    }

    fn priority(&self) -> i32 {
        Config::PRIORITY
    }

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
        if !self.c.headers.is_empty() {
            rewrite::render_ops(&self.c.headers, &req, ctx, None).apply(&mut resp.headers);
        }
        let encoded = resp.headers.contains_key(header::CONTENT_ENCODING);
        let filters = !self.c.filters.is_empty() && !encoded;
        if self.c.body.is_some() || filters {
            resp.headers.remove(header::CONTENT_LENGTH);
            resp.headers.remove(header::ETAG);
            resp.headers.remove(header::LAST_MODIFIED);
            if self.c.body.is_some() {
                resp.headers.remove(header::CONTENT_ENCODING);
            }
            ctx.extensions.insert(Applied { filters });
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

/// Buffers the body and applies the regex filters at the end.
struct Filters {
    c: Arc<Compiled>,
    buf: BytesMut,
}

impl BodyFilter for Filters {
    fn data(&mut self, chunk: Bytes, _ctx: &mut PluginCtx) -> Bytes {
        self.buf.extend_from_slice(&chunk);
        Bytes::new()
    }

    fn end(&mut self, _ctx: &mut PluginCtx) -> Option<Bytes> {
        let raw = std::mem::take(&mut self.buf);
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
