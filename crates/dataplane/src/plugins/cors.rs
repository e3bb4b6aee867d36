//! `cors` (priority 4000): answers every `OPTIONS` request of the route itself (200, empty
//! body — the preflight) and adds the CORS headers to responses whose request `Origin` is
//! allowed:
//!
//! - `allow_origins: "*"` → `Access-Control-Allow-Origin: *`; `"**"` → the request's
//!   Origin; a list → the Origin when listed (then `Vary: Origin`), else no CORS headers;
//! - `allow_origins_by_regex` (whole-origin match) replaces `allow_origins`;
//! - `Access-Control-Allow-Methods` (`**` → every method), `-Allow-Headers` (`**` → the
//!   request's `Access-Control-Request-Headers`), `-Expose-Headers` (when set), `-Max-Age`,
//!   `-Allow-Credentials: true` with `allow_credential`.

use std::sync::Arc;

use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode, request, response};
use regex::Regex;
use sluice_plugin_config::cors::Cors as Config;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{BuildCtx, Flow, Plugin, PluginCtx};
use crate::body::ProxyBody;

const ALL_METHODS: &str = "GET,POST,PUT,DELETE,PATCH,HEAD,OPTIONS,CONNECT,TRACE";

#[derive(Debug)]
enum Origins {
    Any,
    Echo,
    List(Vec<String>),
    Regex(Vec<Regex>),
}

/// The plugin.
#[derive(Debug)]
pub struct Cors {
    origins: Origins,
    methods: HeaderValue,
    headers: Option<HeaderValue>,
    expose: Option<HeaderValue>,
    max_age: HeaderValue,
    credential: bool,
}

/// What the response phase needs from the request.
#[derive(Debug, Clone)]
struct CorsRequest {
    origin: Option<HeaderValue>,
    request_headers: Option<HeaderValue>,
}

fn value(field: &str, v: &str) -> Result<HeaderValue, ConfigError> {
    HeaderValue::from_str(v).map_err(|_| ConfigError::Field {
        plugin: Config::NAME.into(),
        field: field.into(),
        reason: "must be printable ASCII".into(),
    })
}

/// Builds `cors`.
pub fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Arc<dyn Plugin>, ConfigError> {
    let conf: Config = sluice_plugin_config::parse_json(json)?;
    let regexes = conf.origin_regexes().map_err(|e| ConfigError::Field {
        plugin: Config::NAME.into(),
        field: e.field,
        reason: e.reason,
    })?;
    let origins = if !regexes.is_empty() {
        Origins::Regex(regexes)
    } else {
        match conf.allow_origins.trim() {
            "*" => Origins::Any,
            "**" => Origins::Echo,
            list => Origins::List(
                list.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect(),
            ),
        }
    };
    let methods = match conf.allow_methods.trim() {
        "**" => HeaderValue::from_static(ALL_METHODS),
        m => value("allow_methods", m)?,
    };
    let headers = match conf.allow_headers.trim() {
        "**" => None,
        h => Some(value("allow_headers", h)?),
    };
    let expose = match conf.expose_headers.as_deref().map(str::trim) {
        None => None,
        Some("**") => Some(HeaderValue::from_static("*")),
        Some(e) => Some(value("expose_headers", e)?),
    };
    Ok(Arc::new(Cors {
        origins,
        methods,
        headers,
        expose,
        max_age: HeaderValue::from(conf.max_age),
        credential: conf.allow_credential,
    }))
}

impl Cors {
    /// The `Access-Control-Allow-Origin` value for `origin`, `None` when not allowed.
    fn allow_origin(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        match &self.origins {
            Origins::Any => Some(HeaderValue::from_static("*")),
            Origins::Echo => Some(
                origin
                    .cloned()
                    .unwrap_or_else(|| HeaderValue::from_static("*")),
            ),
            Origins::List(list) => {
                let o = origin?.to_str().ok()?;
                list.iter().any(|l| l == o).then(|| origin.cloned())?
            }
            Origins::Regex(res) => {
                let o = origin?.to_str().ok()?;
                res.iter().any(|r| r.is_match(o)).then(|| origin.cloned())?
            }
        }
    }
}

static ACRH: HeaderName = HeaderName::from_static("access-control-request-headers");

impl Plugin for Cors {
    fn name(&self) -> &'static str {
        Config::NAME
    }

    fn priority(&self) -> i32 {
        Config::PRIORITY
    }

    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        // NB: kept before other plugins may change the request, as APISIX does.
        ctx.extensions.insert(CorsRequest {
            origin: req.headers.get(header::ORIGIN).cloned(),
            request_headers: req.headers.get(&ACRH).cloned(),
        });
        if req.method == Method::OPTIONS {
            let mut resp = Response::new(ProxyBody::empty());
            *resp.status_mut() = StatusCode::OK;
            return Flow::Respond(resp);
        }
        Flow::Continue
    }

    fn response_headers(&self, resp: &mut response::Parts, ctx: &mut PluginCtx) {
        let Some(r) = ctx.extensions.get::<CorsRequest>() else {
            return;
        };
        let Some(allow) = self.allow_origin(r.origin.as_ref()) else {
            return;
        };
        let h = &mut resp.headers;
        if allow != "*" {
            h.append(header::VARY, HeaderValue::from_static("Origin"));
        }
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, self.methods.clone());
        let allow_headers = match &self.headers {
            Some(v) => Some(v.clone()),
            None => r.request_headers.clone(),
        };
        if let Some(v) = allow_headers {
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, v);
        }
        h.insert(header::ACCESS_CONTROL_MAX_AGE, self.max_age.clone());
        if let Some(v) = &self.expose {
            h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, v.clone());
        }
        if self.credential {
            h.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
    }
}
