//! Helpers of the rewriting plugins: rendering value templates, applying header
//! operations, evaluating `vars` conditions, and a copy of the request head for plugins
//! that need it in the response phases.

use std::borrow::Cow;
use std::sync::Arc;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::request;
use sluice_plugin_config::expr::{Expr, ExprVar};
use sluice_plugin_config::rewrite::{HeaderOps, TPiece, ValueTemplate};

use super::vars;
use crate::plugins::PluginCtx;

/// Renders `t`: variables from the request (absent ones are empty, as APISIX), captures
/// from `caps` (missing ones are empty).
pub fn render(
    t: &ValueTemplate,
    req: &request::Parts,
    ctx: &PluginCtx,
    caps: Option<&regex::Captures<'_>>,
) -> String {
    render_escaped(t, req, ctx, caps, false)
}

/// Like [`render`]; with `escape_query`, a `?` in a variable's value becomes `%3F` so that
/// a value cannot start a query string (APISIX proxy-rewrite `uri`).
pub fn render_escaped(
    t: &ValueTemplate,
    req: &request::Parts,
    ctx: &PluginCtx,
    caps: Option<&regex::Captures<'_>>,
    escape_query: bool,
) -> String {
    let mut out = String::new();
    for p in &t.pieces {
        match p {
            TPiece::Text(s) => out.push_str(s),
            TPiece::Var(v) => {
                if let Some(s) = vars::get(v, req, ctx) {
                    if escape_query {
                        out.push_str(&s.replace('?', "%3F"));
                    } else {
                        out.push_str(&s);
                    }
                }
            }
            TPiece::Capture(n) => {
                if let Some(m) = caps.and_then(|c| c.get(*n)) {
                    out.push_str(m.as_str());
                }
            }
        }
    }
    out
}

/// Renders `t` as a header value; `None` when the result is not a valid value.
pub fn render_value(
    t: &ValueTemplate,
    req: &request::Parts,
    ctx: &PluginCtx,
    caps: Option<&regex::Captures<'_>>,
) -> Option<HeaderValue> {
    match t.as_literal() {
        Some(l) => HeaderValue::from_str(l).ok(),
        None => HeaderValue::from_str(&render(t, req, ctx, caps)).ok(),
    }
}

/// Header operations with their values rendered for one request.
#[derive(Debug, Default)]
pub struct RenderedOps {
    add: Vec<(HeaderName, HeaderValue)>,
    remove: Vec<HeaderName>,
    set: Vec<(HeaderName, Vec<HeaderValue>)>,
}

/// Renders the values of `ops` (so that the request may change afterwards).
pub fn render_ops(
    ops: &HeaderOps,
    req: &request::Parts,
    ctx: &PluginCtx,
    caps: Option<&regex::Captures<'_>>,
) -> RenderedOps {
    RenderedOps {
        add: ops
            .add
            .iter()
            .filter_map(|(n, t)| Some((n.clone(), render_value(t, req, ctx, caps)?)))
            .collect(),
        remove: ops.remove.clone(),
        set: ops
            .set
            .iter()
            .map(|(n, ts)| {
                (
                    n.clone(),
                    ts.iter()
                        .filter_map(|t| render_value(t, req, ctx, caps))
                        .collect(),
                )
            })
            .collect(),
    }
}

impl RenderedOps {
    /// Applies the operations to `headers` in APISIX's order: add, set, remove.
    pub fn apply(self, headers: &mut HeaderMap) {
        for (name, v) in self.add {
            headers.append(name, v);
        }
        for (name, vs) in self.set {
            headers.remove(&name);
            for v in vs {
                headers.append(name.clone(), v);
            }
        }
        for name in &self.remove {
            headers.remove(name);
        }
    }
}

/// Replaces the first match of `re` in `subject` with `t` (captures and variables), as
/// `ngx.re.sub`; `None` when nothing matches.
pub fn regex_sub(
    re: &regex::Regex,
    t: &ValueTemplate,
    subject: &str,
    req: &request::Parts,
    ctx: &PluginCtx,
) -> Option<String> {
    let caps = re.captures(subject)?;
    let whole = caps.get(0)?;
    let mut out = String::with_capacity(subject.len() + 16);
    out.push_str(&subject[..whole.start()]);
    out.push_str(&render(t, req, ctx, Some(&caps)));
    out.push_str(&subject[whole.end()..]);
    Some(out)
}

/// Evaluates `e` on the request (and the response `status`, when known).
pub fn eval(e: &Expr, req: &request::Parts, ctx: &PluginCtx, status: Option<u16>) -> bool {
    e.eval(&mut |v| match v {
        ExprVar::Status => status.map(|s| Cow::Owned(s.to_string())),
        ExprVar::Req(var) => vars::get(var, req, ctx).map(|c| Cow::Owned(c.into_owned())),
    })
}

/// A copy of the request head as it arrived at the plugins, for response phases.
#[derive(Debug, Clone)]
pub struct RequestHead(pub Arc<request::Parts>);

/// Keeps a copy of the request head in `ctx` (once per request) and returns it.
pub fn stash_request(req: &request::Parts, ctx: &mut PluginCtx) -> Arc<request::Parts> {
    if let Some(h) = ctx.extensions.get::<RequestHead>() {
        return Arc::clone(&h.0);
    }
    let mut b = http::Request::builder()
        .method(req.method.clone())
        .uri(req.uri.clone())
        .version(req.version);
    if let Some(h) = b.headers_mut() {
        *h = req.headers.clone();
    }
    let parts = match b.body(()) {
        Ok(r) => r.into_parts().0,
        Err(_) => http::Request::new(()).into_parts().0,
    };
    let parts = Arc::new(parts);
    ctx.extensions.insert(RequestHead(Arc::clone(&parts)));
    parts
}

/// The request head stashed by [`stash_request`].
pub fn stashed_request(ctx: &PluginCtx) -> Option<Arc<request::Parts>> {
    ctx.extensions
        .get::<RequestHead>()
        .map(|h| Arc::clone(&h.0))
}
/// Percent-encodes what may not appear in a URI path (as APISIX's `uri_safe_encode`):
/// everything but unreserved, sub-delims, `:@/%` characters.
pub fn encode_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for b in p.bytes() {
        let keep = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/%".contains(&b);
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Removes query argument `name` from the request URI (for `hide_credentials`).
pub fn remove_query_arg(req: &mut request::Parts, name: &str) {
    let Some(q) = req.uri.query() else {
        return;
    };
    let kept: Vec<&str> = q
        .split('&')
        .filter(|kv| kv.split_once('=').map_or(*kv, |(k, _)| k) != name)
        .collect();
    let mut pq = req.uri.path().to_owned();
    if !kept.is_empty() {
        pq.push('?');
        pq.push_str(&kept.join("&"));
    }
    let mut parts = req.uri.clone().into_parts();
    if let Ok(v) = pq.parse() {
        parts.path_and_query = Some(v);
        if let Ok(uri) = http::Uri::from_parts(parts) {
            req.uri = uri;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_only_what_a_path_cannot_hold() {
        assert_eq!(encode_path("/a b/ü/%20/x:y@z"), "/a%20b/%C3%BC/%20/x:y@z");
    }
}
