//! `redirect` (priority 900, rewrite phase): answers with a redirect.
//!
//! - `http_to_https`: a request that is not HTTPS (`X-Forwarded-Proto` when present, else
//!   its connection) gets `Location: https://$host$request_uri` with 301 for GET/HEAD and 308
//!   otherwise (so the method and body are kept), as APISIX. The port is left out (443):
//!   in a cluster the HTTPS listener is published on 443.
//! - `uri` (`$var`s rendered; absent variables are empty) or `regex_uri` (the request is
//!   proxied when the path does not match) with `ret_code` (302), `encode_uri`,
//!   `append_query_string`.
//!
//! The body is empty.

use http::header::{self, HeaderValue};
use http::{Method, Response, StatusCode, request};
use sluice_plugin_config::redirect::{Redirect as Config, Target};
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::support::rewrite::{self, encode_path, render};
use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx, support::vars};
use crate::upstream::body::ProxyBody;

/// The plugin.
#[derive(Debug)]
pub struct Redirect {
    target: Target,
    ret_code: StatusCode,
    encode_uri: bool,
    append_query_string: bool,
}

impl Builtin for Redirect {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE;

    /// Builds `redirect`.
    fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let target = conf.target().map_err(|e| ConfigError::Field {
            plugin: Config::NAME.into(),
            field: e.field,
            reason: e.reason,
        })?;
        Ok(Redirect {
            target,
            ret_code: super::status(conf.ret_code),
            encode_uri: conf.encode_uri,
            append_query_string: conf.append_query_string,
        })
    }
}

fn redirect(code: StatusCode, location: &str) -> Flow<'static> {
    let mut resp = Response::new(ProxyBody::empty());
    *resp.status_mut() = code;
    match HeaderValue::from_str(location) {
        Ok(v) => {
            resp.headers_mut().insert(header::LOCATION, v);
        }
        Err(_) => {
            // A template rendered control characters: refuse rather than send a broken header.
            *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        }
    }
    Flow::Respond(Box::new(resp))
}

impl Redirect {
    fn finish(&self, mut loc: String, req: &request::Parts) -> String {
        if self.encode_uri {
            loc = match loc.split_once('?') {
                Some((p, q)) => format!("{}?{q}", encode_path(p)),
                None => encode_path(&loc),
            };
        }
        if self.append_query_string
            && let Some(q) = req.uri.query()
        {
            loc.push(if loc.contains('?') { '&' } else { '?' });
            loc.push_str(q);
        }
        loc
    }
}

impl Plugin for Redirect {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        match &self.target {
            Target::HttpToHttps => {
                let proto = req
                    .headers
                    .get("x-forwarded-proto")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or(ctx.scheme);
                if proto.eq_ignore_ascii_case("https") {
                    return Flow::Continue;
                }
                let host = vars::get(&sluice_plugin_config::vars::Var::Host, req, ctx)
                    .map(|h| h.into_owned())
                    .unwrap_or_else(|| ctx.local_addr.ip().to_string());
                let pq = req.uri.path_and_query().map_or("/", |p| p.as_str());
                let code = if req.method == Method::GET || req.method == Method::HEAD {
                    StatusCode::MOVED_PERMANENTLY
                } else {
                    StatusCode::PERMANENT_REDIRECT
                };
                redirect(code, &format!("https://{host}{pq}"))
            }
            Target::Uri(t) => {
                let loc = self.finish(render(t, req, ctx, None), req);
                redirect(self.ret_code, &loc)
            }
            Target::Regex(pair) => {
                // As APISIX (`ngx.re.sub`): the match in the path is replaced.
                let Some(loc) =
                    rewrite::regex_sub(&pair.regex, &pair.template, req.uri.path(), req, ctx)
                else {
                    return Flow::Continue;
                };
                let loc = self.finish(loc, req);
                redirect(self.ret_code, &loc)
            }
        }
    }
}
