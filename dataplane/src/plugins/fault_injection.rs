//! `fault-injection` (priority 11000, rewrite phase): `delay` waits `duration` seconds,
//! then `abort` answers `http_status` with `body` (and `headers`) instead of the upstream —
//! each for `percentage` of the requests (all when unset) and only when its `vars` hold.

use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Response, request};
use sluice_plugin_config::expr::Expr;
use sluice_plugin_config::fault_injection::{FaultInjection as Config, compile_vars};
use sluice_plugin_config::rewrite::{HeaderOps, ValueTemplate, compile_header_ops};
use sluice_plugin_config::{ConfigError, FieldError, PluginSchema};

use super::support::rewrite::{self, render};
use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx};
use crate::upstream::body::ProxyBody;

#[derive(Debug)]
struct Abort {
    status: http::StatusCode,
    body: Option<ValueTemplate>,
    headers: HeaderOps,
    percentage: Option<u8>,
    vars: Option<Expr>,
}

#[derive(Debug)]
struct Delay {
    duration: Duration,
    percentage: Option<u8>,
    vars: Option<Expr>,
}

/// The plugin.
#[derive(Debug)]
pub struct FaultInjection {
    abort: Option<Abort>,
    delay: Option<Delay>,
}

fn field(e: FieldError) -> ConfigError {
    ConfigError::Field {
        plugin: Config::NAME.into(),
        field: e.field,
        reason: e.reason,
    }
}

impl Builtin for FaultInjection {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE;

    /// Builds `fault-injection`.
    fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let abort = match conf.abort {
            Some(a) => Some(Abort {
                status: super::status(a.http_status),
                body: a
                    .body
                    .as_deref()
                    .map(ValueTemplate::parse)
                    .transpose()
                    .map_err(|r| field(FieldError::new("abort.body", r)))?,
                headers: match &a.headers {
                    Some(h) => {
                        compile_header_ops("abort.headers", &serde_json::Value::Object(h.clone()))
                            .map_err(field)?
                    }
                    None => HeaderOps::default(),
                },
                percentage: a.percentage,
                vars: compile_vars("abort.vars", a.vars.as_ref()).map_err(field)?,
            }),
            None => None,
        };
        let delay = match conf.delay {
            Some(d) => Some(Delay {
                duration: Duration::from_secs_f64(d.duration),
                percentage: d.percentage,
                vars: compile_vars("delay.vars", d.vars.as_ref()).map_err(field)?,
            }),
            None => None,
        };
        Ok(FaultInjection { abort, delay })
    }
}

/// Whether a request falls in `percentage` (all when unset).
fn hit(percentage: Option<u8>) -> bool {
    match percentage {
        None => true,
        Some(p) => fastrand::u8(1..=100) <= p,
    }
}

impl FaultInjection {
    fn abort_response(&self, req: &request::Parts, ctx: &PluginCtx) -> Option<Response<ProxyBody>> {
        let a = self.abort.as_ref()?;
        if let Some(v) = &a.vars
            && !rewrite::eval(v, req, ctx, None)
        {
            return None;
        }
        if !hit(a.percentage) {
            return None;
        }
        let body = a
            .body
            .as_ref()
            .map(|t| render(t, req, ctx, None))
            .unwrap_or_default();
        let mut resp = Response::new(if body.is_empty() {
            ProxyBody::empty()
        } else {
            ProxyBody::full(body)
        });
        *resp.status_mut() = a.status;
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        rewrite::render_ops(&a.headers, req, ctx, None).apply(resp.headers_mut());
        Some(resp)
    }
}

impl Plugin for FaultInjection {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        let delay = self.delay.as_ref().filter(|d| {
            d.vars
                .as_ref()
                .is_none_or(|v| rewrite::eval(v, req, ctx, None))
                && hit(d.percentage)
        });
        match delay {
            None => match self.abort_response(req, ctx) {
                Some(r) => Flow::Respond(Box::new(r)),
                None => Flow::Continue,
            },
            Some(d) => Flow::Pending(Box::pin(async move {
                tokio::time::sleep(d.duration).await;
                match self.abort_response(req, ctx) {
                    Some(r) => Err(Box::new(r)),
                    None => Ok(()),
                }
            })),
        }
    }
}
