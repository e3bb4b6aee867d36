//! `proxy-rewrite` (priority 1008, rewrite phase): rewrites the request forwarded upstream
//! — path (`uri` with `$var`s, or the first matching `regex_uri` pair with `$1`...
//! captures; the query string of the request is appended), method, `Host`, and headers
//! (`add`, `set`, `remove`, in that order; values may hold `$var`s and captures).

use http::request;
use sluice_plugin_config::proxy_rewrite::{Compiled, ProxyRewrite as Config};
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::support::rewrite::{self, encode_path, render_escaped};
use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx};

/// The plugin.
#[derive(Debug)]
pub struct ProxyRewrite {
    c: Compiled,
    raw_uri: bool,
}

impl Builtin for ProxyRewrite {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE;

    /// Builds `proxy-rewrite`.
    fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let c = conf.compile().map_err(|e| ConfigError::Field {
            plugin: Config::NAME.into(),
            field: e.field,
            reason: e.reason,
        })?;
        Ok(ProxyRewrite {
            c,
            raw_uri: conf.use_real_request_uri_unsafe,
        })
    }
}

/// Sets the path-and-query of `req` to `pq` (keeps the URI when `pq` is not valid).
pub fn set_path_and_query(req: &mut request::Parts, pq: &str) {
    let mut parts = req.uri.clone().into_parts();
    if let Ok(v) = pq.parse() {
        parts.path_and_query = Some(v);
        if let Ok(uri) = http::Uri::from_parts(parts) {
            req.uri = uri;
        }
    }
}

/// Percent-encodes what a request line cannot hold (controls, space, non-ASCII and the
/// characters the `http` crate refuses) and keeps every delimiter — as APISIX's
/// `escape_uri_control_chars` for the query part.
pub fn encode_query(q: &str) -> String {
    let mut out = String::with_capacity(q.len());
    for b in q.bytes() {
        if b.is_ascii_graphic() && !b"\"#<>\\^`{|}".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl ProxyRewrite {
    /// `use_real_request_uri_unsafe`: the request URI as received; `uri` (with the query
    /// string appended) or `regex_uri` (matched against path and query) still apply, and
    /// only what a request line cannot hold is encoded.
    fn rewrite_raw(&self, req: &mut request::Parts, ctx: &mut PluginCtx) -> Flow<'static> {
        // NB: as received, not as normalised for routing (see `crate::http::path`).
        let real = match req.extensions.get::<crate::http::path::RequestTarget>() {
            Some(sent) => sent.0.as_str().to_owned(),
            None => req
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned(),
        };
        let mut caps = None;
        let mut new_uri = None;
        if let Some(t) = &self.c.uri {
            let mut u = rewrite::render(t, req, ctx, None);
            if let Some(q) = req.uri.query() {
                u.push(if u.contains('?') { '&' } else { '?' });
                u.push_str(q);
            }
            new_uri = Some(u);
        } else {
            for pair in &self.c.regex_uri {
                if let Some(c) = pair.regex.captures(&real) {
                    new_uri = rewrite::regex_sub(&pair.regex, &pair.template, &real, req, ctx);
                    caps = Some(c);
                    break;
                }
            }
        }
        let ops = (!self.c.headers.is_empty())
            .then(|| rewrite::render_ops(&self.c.headers, req, ctx, caps.as_ref()));
        match new_uri {
            Some(u) => {
                let mut pq = encode_query(&u);
                if !pq.starts_with('/') {
                    pq.insert(0, '/');
                }
                set_path_and_query(req, &pq);
            }
            None if req.uri.path_and_query().map(|p| p.as_str()) != Some(real.as_str()) => {
                set_path_and_query(req, &real);
            }
            None => {}
        }
        self.finish(req, ops);
        Flow::Continue
    }

    /// Method, Host and headers.
    fn finish(&self, req: &mut request::Parts, ops: Option<rewrite::RenderedOps>) {
        if let Some(m) = &self.c.method {
            req.method = m.clone();
        }
        if let Some(h) = &self.c.host {
            req.headers.insert(http::header::HOST, h.clone());
        }
        if let Some(ops) = ops {
            ops.apply(&mut req.headers);
        }
    }
}

impl Plugin for ProxyRewrite {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        if self.raw_uri {
            return self.rewrite_raw(req, ctx);
        }
        let path = req.uri.path().to_owned();
        let mut caps = None;
        let mut new_uri = None;
        {
            if let Some(t) = &self.c.uri {
                new_uri = Some(render_escaped(t, req, ctx, None, true));
            } else {
                // As APISIX: the first pattern that matches; its match in the path is
                // replaced (`ngx.re.sub`), the rest of the path kept.
                for pair in &self.c.regex_uri {
                    if let Some(c) = pair.regex.captures(&path) {
                        new_uri = rewrite::regex_sub(&pair.regex, &pair.template, &path, req, ctx);
                        caps = Some(c);
                        break;
                    }
                }
            }
        }
        let ops = (!self.c.headers.is_empty())
            .then(|| rewrite::render_ops(&self.c.headers, req, ctx, caps.as_ref()));
        if let Some(u) = new_uri {
            let (p, q) = match u.split_once('?') {
                Some((p, q)) => (p, Some(q)),
                None => (u.as_str(), None),
            };
            let mut pq = encode_path(p);
            if pq.is_empty() || !pq.starts_with('/') {
                pq.insert(0, '/');
            }
            let args = req.uri.query();
            match (q, args) {
                (Some(q), Some(a)) => {
                    pq.push('?');
                    pq.push_str(&encode_query(q));
                    pq.push('&');
                    pq.push_str(a);
                }
                (Some(q), None) => {
                    pq.push('?');
                    pq.push_str(&encode_query(q));
                }
                (None, Some(a)) => {
                    pq.push('?');
                    pq.push_str(a);
                }
                (None, None) => {}
            }
            set_path_and_query(req, &pq);
        }
        self.finish(req, ops);
        Flow::Continue
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn encodes_only_what_a_path_cannot_hold() {
        assert_eq!(encode_query("a=1&b=x y\r\n?"), "a=1&b=x%20y%0D%0A?");
    }
}
