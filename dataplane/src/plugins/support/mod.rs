//! Helpers several plugins share, none of them a plugin: variables, value templates and
//! header operations, the access-log entry and the batch processor behind the loggers and
//! opentelemetry, an HTTP `POST` client, the Redis store of the rate limits, a cheap hasher,
//! and the W3C trace context.

pub mod batch;
pub mod fasthash;
pub mod log;
pub mod post;
pub mod redis;
pub mod rewrite;
pub mod trace;
pub mod vars;
