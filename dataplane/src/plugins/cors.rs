//! `cors` (priority 4000): answers every `OPTIONS` request of the route itself (200, empty
//! body — the preflight) and adds the CORS headers to responses, as APISIX 3.x:
//!
//! - `allow_origins: "*"` → `Access-Control-Allow-Origin: *`; `"**"` → the request's
//!   Origin (or `*`); one origin → that origin, always; a comma-separated list → the
//!   request's Origin when listed, else no CORS headers;
//! - `allow_origins_by_regex` (a search in the Origin, like `ngx.re.find`) replaces
//!   `allow_origins`: the Origin when a regex finds, else no CORS headers;
//! - `Vary: Origin` unless `allow_origins` is `*` without regexes;
//! - `Access-Control-Allow-Methods` (`**` → every method), `-Allow-Headers` (`**` → the
//!   request's `Access-Control-Request-Headers`), `-Max-Age`, `-Expose-Headers` (when set),
//!   `-Allow-Credentials: true` with `allow_credential`;
//! - `Timing-Allow-Origin` when `timing_allow_origins(_by_regex)` allows the Origin.
//!
//! Two Sluice extensions serve the Gateway API CORS filter: `echo_request_method` (the
//! allowed method is the request's `Access-Control-Request-Method`, with
//! `Vary: Access-Control-Request-Method`) and `preflight_only` (only an `OPTIONS` request
//! with `Origin` and `Access-Control-Request-Method` is answered; other `OPTIONS` requests
//! go upstream).

use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode, request, response};
use regex::Regex;
use sluice_plugin_config::cors::Cors as Config;
use sluice_plugin_config::{ConfigError, FieldError, PluginSchema};

use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx};
use crate::upstream::body::ProxyBody;

const ALL_METHODS: &str = "GET,POST,PUT,DELETE,PATCH,HEAD,OPTIONS,CONNECT,TRACE";

/// Which origins are allowed.
#[derive(Debug)]
enum Origins {
    /// `*`.
    Any,
    /// `**`: the request's.
    Echo,
    /// One origin, sent whatever the request's is (APISIX).
    Single(HeaderValue),
    /// Several: the request's when listed.
    List(Vec<String>),
    /// By regex: the request's when one finds.
    Regex(Vec<Regex>),
}

impl Origins {
    fn new(list: &str, regexes: Vec<Regex>, field: &str) -> Result<Self, ConfigError> {
        if !regexes.is_empty() {
            return Ok(Origins::Regex(regexes));
        }
        Ok(match list.trim() {
            "*" => Origins::Any,
            "**" => Origins::Echo,
            l if l.contains(',') => Origins::List(
                l.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect(),
            ),
            l => Origins::Single(value(field, l)?),
        })
    }

    /// The allowed origin for a request with `origin`, `None` when not allowed.
    fn resolve(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        match self {
            Origins::Any => Some(HeaderValue::from_static("*")),
            Origins::Echo => Some(
                origin
                    .cloned()
                    .unwrap_or_else(|| HeaderValue::from_static("*")),
            ),
            Origins::Single(v) => Some(v.clone()),
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

/// The plugin.
#[derive(Debug)]
pub struct Cors {
    origins: Origins,
    vary: bool,
    /// `None`: the request's `Access-Control-Request-Method` (`echo_request_method`).
    methods: Option<HeaderValue>,
    headers: Option<HeaderValue>,
    expose: Option<HeaderValue>,
    max_age: HeaderValue,
    credential: bool,
    timing: Option<Origins>,
    preflight_only: bool,
}

/// What the response phase needs from the request, as it arrived.
#[derive(Debug, Clone)]
struct CorsRequest {
    origin: Option<HeaderValue>,
    request_headers: Option<HeaderValue>,
    /// Kept only with `echo_request_method`.
    request_method: Option<HeaderValue>,
}

fn value(field: &str, v: &str) -> Result<HeaderValue, ConfigError> {
    HeaderValue::from_str(v.trim()).map_err(|_| ConfigError::Field {
        plugin: Config::NAME.into(),
        field: field.into(),
        reason: "must be printable ASCII".into(),
    })
}

fn field(e: FieldError) -> ConfigError {
    ConfigError::Field {
        plugin: Config::NAME.into(),
        field: e.field,
        reason: e.reason,
    }
}

impl Builtin for Cors {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE.with(Hooks::RESPONSE_HEADERS);

    /// Builds `cors`.
    fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let regexes = conf.origin_regexes().map_err(field)?;
        let vary = conf.allow_origins.trim() != "*" || !regexes.is_empty();
        let origins = Origins::new(&conf.allow_origins, regexes, "allow_origins")?;
        let timing_regexes = conf.timing_regexes().map_err(field)?;
        let timing = match (&conf.timing_allow_origins, timing_regexes.is_empty()) {
            (None, true) => None,
            (list, _) => Some(Origins::new(
                list.as_deref().unwrap_or(""),
                timing_regexes,
                "timing_allow_origins",
            )?),
        };
        let methods = match conf.allow_methods.trim() {
            _ if conf.echo_request_method => None,
            "**" => Some(HeaderValue::from_static(ALL_METHODS)),
            m => Some(value("allow_methods", m)?),
        };
        let headers = match conf.allow_headers.trim() {
            "**" => None,
            h => Some(value("allow_headers", h)?),
        };
        let expose = match conf.expose_headers.as_deref() {
            None | Some("") => None,
            Some(e) => Some(value("expose_headers", e)?),
        };
        Ok(Cors {
            origins,
            vary,
            methods,
            headers,
            expose,
            max_age: HeaderValue::from(conf.max_age),
            credential: conf.allow_credential,
            timing,
            preflight_only: conf.preflight_only,
        })
    }
}

static ACRH: HeaderName = HeaderName::from_static("access-control-request-headers");
static ACRM: HeaderName = HeaderName::from_static("access-control-request-method");
static TIMING: HeaderName = HeaderName::from_static("timing-allow-origin");

impl Plugin for Cors {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        // NB: kept before other plugins may change the request, as APISIX does.
        let origin = req.headers.get(header::ORIGIN).cloned();
        let request_method = req.headers.get(&ACRM).cloned();
        let preflight = req.method == Method::OPTIONS
            && (!self.preflight_only || (origin.is_some() && request_method.is_some()));
        ctx.extensions.insert(CorsRequest {
            origin,
            request_headers: req.headers.get(&ACRH).cloned(),
            request_method: request_method.filter(|_| self.methods.is_none()),
        });
        if preflight {
            let mut resp = Response::new(ProxyBody::empty());
            *resp.status_mut() = StatusCode::OK;
            return Flow::Respond(Box::new(resp));
        }
        Flow::Continue
    }

    fn response_headers(&self, resp: &mut response::Parts, ctx: &mut PluginCtx) {
        let Some(r) = ctx.extensions.get::<CorsRequest>() else {
            return;
        };
        let h = &mut resp.headers;
        if self.vary {
            h.append(header::VARY, HeaderValue::from_static("Origin"));
        }
        if let Some(allow) = self.origins.resolve(r.origin.as_ref()) {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
            match &self.methods {
                Some(m) => {
                    h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, m.clone());
                }
                None => {
                    h.append(
                        header::VARY,
                        HeaderValue::from_static("Access-Control-Request-Method"),
                    );
                    if let Some(m) = &r.request_method {
                        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, m.clone());
                    }
                }
            }
            h.insert(header::ACCESS_CONTROL_MAX_AGE, self.max_age.clone());
            if let Some(v) = &self.expose {
                h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, v.clone());
            }
            let allow_headers = match &self.headers {
                Some(v) => Some(v.clone()),
                None => r.request_headers.clone(),
            };
            if let Some(v) = allow_headers {
                h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, v);
            }
            if self.credential {
                h.insert(
                    header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                    HeaderValue::from_static("true"),
                );
            }
        }
        // Timing-Allow-Origin only when it names the request's origin (or is `*`).
        if let Some(t) = self
            .timing
            .as_ref()
            .and_then(|t| t.resolve(r.origin.as_ref()))
            && (t == "*" || r.origin.as_ref() == Some(&t))
        {
            h.insert(TIMING.clone(), t);
        }
    }
}
