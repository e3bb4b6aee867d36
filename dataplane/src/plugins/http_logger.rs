//! `http-logger` (priority 410, log phase): APISIX's access-log entry, sent in batches
//! to an HTTP(S) server by a task off the request path ([`super::support::batch`]).
//!
//! Each batch is one `POST` to `uri` (path and query as written) with `Host` from the URL,
//! `Content-Type: application/json` (`concat_method: json`: a JSON array, or the single
//! object when `batch_max_size` is 1) or `text/plain` (`new_line`: one JSON object per
//! line) and `Authorization: <auth_header>` when set. An answer below 400 delivers the
//! batch; anything else, a connection error or no answer within `timeout` seconds fails
//! it (retried `max_retry_count` times, `retry_delay` seconds apart, then dropped and
//! counted). One HTTP/1.1 connection per logger is kept alive between batches.
//!
//! NB: the `auth_header` value never reaches a log line or an error message.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use sluice_plugin_config::http_logger::{ConcatMethod, HttpLogger as Config};
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::support::batch::{Batcher, Policy, Sink};
use super::support::log::Logger;
use super::support::post::HttpPost;
use super::{BuildCtx, Builtin, Hooks};
use crate::upstream::tls::UpstreamTlsClient;

/// The plugin: a [`Logger`] sending to an HTTP server.
pub type HttpLogger = Logger<Config>;

impl Builtin for HttpLogger {
    type Config = Config;
    const HOOKS: Hooks = Logger::<Config>::HOOKS;

    fn hooks(&self) -> Hooks {
        Logger::hooks(self)
    }

    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let field = |field: &str, reason: String| ConfigError::Field {
            plugin: Config::NAME.into(),
            field: field.into(),
            reason,
        };
        let target = conf.target().map_err(|e| field(&e.field, e.reason))?;
        let format = conf.format().map_err(|e| field(&e.field, e.reason))?;
        let tls = if target.tls {
            Some(
                UpstreamTlsClient::for_probes(None, None, conf.ssl_verify)
                    .map_err(|e| field("uri", e.to_string()))?,
            )
        } else {
            None
        };
        let mut headers = Vec::new();
        if let Some(a) = &conf.auth_header {
            let v = HeaderValue::from_str(a)
                .map_err(|_| field("auth_header", "is not a valid header value".into()))?;
            headers.push((header::AUTHORIZATION, v));
        }
        let post = HttpPost::new(
            &target.host,
            target.port,
            &target.authority,
            &target.path_and_query,
            tls,
            headers,
            Duration::from_secs(conf.timeout),
        )
        .map_err(|e| field("uri", e))?;
        // NB: one queue and task per route and config, kept across snapshots while both are.
        let key = format!("http-logger:{}:{json}", cx.owner);
        let metrics = &cx.state.log_metrics;
        let owner = cx.owner;
        let batcher = cx.state.shared(&key, || {
            let policy = Policy {
                max_size: usize::try_from(conf.batch_max_size).unwrap_or(usize::MAX),
                inactive: Some(Duration::from_secs(conf.inactive_timeout)),
                buffer_duration: Duration::from_secs(conf.buffer_duration),
                max_retries: conf.max_retry_count,
                retry_delay: Duration::from_secs(conf.retry_delay),
            };
            let sink = HttpSink {
                post,
                concat: conf.concat_method,
                single: conf.batch_max_size == 1,
                name: conf.name.clone(),
            };
            Batcher::start(Config::NAME, owner, policy, sink, metrics)
        });
        Ok(Logger::new(
            format,
            (
                conf.include_req_body.then_some(conf.max_req_body_bytes),
                conf.include_resp_body.then_some(conf.max_resp_body_bytes),
            ),
            batcher,
        ))
    }
}

/// Sends batches to one log server.
struct HttpSink {
    post: HttpPost,
    concat: ConcatMethod,
    /// `batch_max_size: 1`: a batch is one JSON object, not an array.
    single: bool,
    /// `name`, for Sluice's own log lines.
    name: String,
}

impl HttpSink {
    fn body(&self, batch: &[String]) -> (Bytes, &'static str) {
        let len: usize = batch.iter().map(|e| e.len() + 1).sum::<usize>() + 2;
        let mut b = Vec::with_capacity(len);
        match self.concat {
            ConcatMethod::Json if self.single && batch.len() == 1 => {
                b.extend_from_slice(batch[0].as_bytes());
            }
            ConcatMethod::Json => {
                b.push(b'[');
                for (i, e) in batch.iter().enumerate() {
                    if i > 0 {
                        b.push(b',');
                    }
                    b.extend_from_slice(e.as_bytes());
                }
                b.push(b']');
            }
            ConcatMethod::NewLine => {
                for (i, e) in batch.iter().enumerate() {
                    if i > 0 {
                        b.push(b'\n');
                    }
                    b.extend_from_slice(e.as_bytes());
                }
            }
        }
        let ct = match self.concat {
            ConcatMethod::Json => "application/json",
            ConcatMethod::NewLine => "text/plain",
        };
        (Bytes::from(b), ct)
    }
}

impl Sink for HttpSink {
    fn name(&self) -> &str {
        &self.name
    }

    type Payload = (Bytes, &'static str);

    fn encode(&mut self, batch: Vec<String>) -> Self::Payload {
        self.body(&batch)
    }

    async fn send(&mut self, (body, ct): &Self::Payload) -> Result<(), String> {
        self.post.post(body.clone(), ct).await
    }
}
