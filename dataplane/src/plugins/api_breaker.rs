//! `api-breaker` (priority 1005): a circuit breaker on the upstream's statuses.
//!
//! - Log phase: an upstream status in `unhealthy.http_statuses` counts a failure (and
//!   forgets the successes); every `unhealthy.failures`-th failure opens the breaker. A
//!   status in `healthy.http_statuses` after failures counts a success;
//!   `healthy.successes` of them close it and forget everything.
//! - Access phase: while open, requests are answered `break_response_code` (with
//!   `break_response_body` and, only with a body as in APISIX, `break_response_headers`)
//!   without reaching the upstream. The breaker stays open for
//!   `2^(failures / unhealthy.failures)` seconds (at least 2), at most `max_breaker_sec`.
//!
//! Only answers of an upstream count (not Sluice's or a plugin's own). NB: APISIX keys its
//! state by host and URI; Sluice keeps one breaker per route (so a route's URIs share it
//! and client-chosen URIs cannot grow the state). The state is shared by every worker of
//! the dataplane and survives snapshots while the route's config is unchanged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Response, request};
use sluice_plugin_config::api_breaker::ApiBreaker as Config;
use sluice_plugin_config::rewrite::ValueTemplate;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::support::rewrite::render;
use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx};
use crate::upstream::body::ProxyBody;

/// One route's breaker.
#[derive(Debug, Default, Clone, Copy)]
struct Breaker {
    failures: u64,
    successes: u64,
    opened: Option<Instant>,
}

/// Breakers by route id (one per route the plugin runs on: a global rule's instance serves
/// many routes).
#[derive(Debug, Default)]
struct Breakers(Mutex<HashMap<Arc<str>, Breaker>>);

impl Breakers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Breaker>> {
        match self.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

/// The plugin.
#[derive(Debug)]
pub struct ApiBreaker {
    code: http::StatusCode,
    body: Option<String>,
    headers: Vec<(HeaderName, ValueTemplate)>,
    max_open: Duration,
    unhealthy: Vec<u16>,
    failures: u64,
    healthy: Vec<u16>,
    successes: u64,
    state: Arc<Breakers>,
}

impl Builtin for ApiBreaker {
    type Config = Config;
    const HOOKS: Hooks = Hooks::ACCESS.with(Hooks::LOG);

    /// Builds `api-breaker`.
    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let field = |field: String, reason: String| ConfigError::Field {
            plugin: Config::NAME.into(),
            field,
            reason,
        };
        let mut headers = Vec::new();
        for (i, h) in conf.break_response_headers.iter().flatten().enumerate() {
            let name = HeaderName::from_bytes(h.key.to_ascii_lowercase().as_bytes())
                .map_err(|e| field(format!("break_response_headers[{i}].key"), e.to_string()))?;
            let value = ValueTemplate::parse(&h.value)
                .map_err(|r| field(format!("break_response_headers[{i}].value"), r))?;
            headers.push((name, value));
        }
        // NB: keyed by the config too, so that a changed config starts with a closed breaker.
        let key = format!("{}:{}:{json}", Config::NAME, cx.owner);
        Ok(ApiBreaker {
            code: super::status(conf.break_response_code),
            body: conf.break_response_body,
            headers,
            max_open: Duration::from_secs(conf.max_breaker_sec),
            unhealthy: conf.unhealthy.http_statuses,
            failures: conf.unhealthy.failures,
            healthy: conf.healthy.http_statuses,
            successes: conf.healthy.successes,
            state: cx.state.shared(&key, Breakers::default),
        })
    }
}

impl ApiBreaker {
    /// How long the breaker stays open after `failures` failures.
    fn open_for(&self, failures: u64) -> Duration {
        let times = (failures / self.failures).clamp(1, 63) as u32;
        Duration::from_secs(2u64.saturating_pow(times)).min(self.max_open)
    }

    fn is_open(&self, route: &str) -> bool {
        let mut map = self.state.lock();
        let Some(b) = map.get_mut(route) else {
            return false;
        };
        let Some(opened) = b.opened else {
            return false;
        };
        let elapsed = opened.elapsed();
        if elapsed > self.max_open {
            // APISIX's open mark expires after max_breaker_sec.
            b.opened = None;
            return false;
        }
        elapsed <= self.open_for(b.failures)
    }

    fn answer(&self, req: &request::Parts, ctx: &PluginCtx) -> Response<ProxyBody> {
        let mut resp = match &self.body {
            Some(body) => {
                let mut resp = Response::new(ProxyBody::full(body.clone()));
                resp.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
                for (name, value) in &self.headers {
                    if let Ok(v) = HeaderValue::from_str(&render(value, req, ctx, None)) {
                        resp.headers_mut().append(name.clone(), v);
                    }
                }
                resp
            }
            None => Response::new(ProxyBody::empty()),
        };
        *resp.status_mut() = self.code;
        resp
    }
}

impl Plugin for ApiBreaker {
    fn access<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        if self.is_open(&ctx.chain.route_id) {
            Flow::respond(self.answer(req, ctx))
        } else {
            Flow::Continue
        }
    }

    fn log(&self, ctx: &mut PluginCtx) {
        // Only an upstream's answer counts (not the breaker's own, nor another plugin's).
        if ctx.upstream.is_none() {
            return;
        }
        let status = ctx.status.as_u16();
        let route = &ctx.chain.route_id;
        if self.unhealthy.contains(&status) {
            let mut map = self.state.lock();
            let b = map.entry(Arc::clone(route)).or_default();
            b.failures += 1;
            b.successes = 0;
            if b.failures.is_multiple_of(self.failures) {
                b.opened = Some(Instant::now());
            }
        } else if self.healthy.contains(&status) {
            let mut map = self.state.lock();
            let Some(b) = map.get_mut(route) else {
                return;
            };
            b.successes += 1;
            if b.successes >= self.successes {
                map.remove(route);
            }
        }
    }
}
