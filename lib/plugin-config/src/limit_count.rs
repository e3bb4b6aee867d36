//! `limit-count`: at most `count` requests per `time_window` seconds per key.

use serde::Deserialize;

use crate::common::{self, KeyType, LimitKey, Policy, RedisConf};
use crate::{FieldError, PluginSchema};

/// Configuration of `limit-count` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LimitCount {
    /// Requests allowed per window; at least 1. Required.
    pub count: u64,
    /// Window length in seconds; at least 1. Required.
    pub time_window: u64,
    /// How `key` is read; default `var`.
    #[serde(default)]
    pub key_type: KeyType,
    /// The key; default `remote_addr`.
    #[serde(default = "common::remote_addr")]
    pub key: String,
    /// Status of a rejected request, 200..=599; default 503.
    #[serde(default = "default_rejected_code")]
    pub rejected_code: u16,
    /// Body `{"error_msg":"<msg>"}` of a rejection; default none (empty body).
    #[serde(default)]
    pub rejected_msg: Option<String>,
    /// Where counters live; default `local`.
    #[serde(default)]
    pub policy: Policy,
    /// Redis settings for `policy: redis`.
    #[serde(flatten)]
    pub redis: RedisConf,
    /// When the Redis policy fails: `true` lets the request through, `false` (default)
    /// answers 500.
    #[serde(default)]
    pub allow_degradation: bool,
    /// Send `X-RateLimit-Limit/Remaining/Reset`; default true.
    #[serde(default = "common::yes")]
    pub show_limit_quota_header: bool,
    /// Routes with the same group share one budget (their configs must be equal).
    #[serde(default)]
    pub group: Option<String>,
}

fn default_rejected_code() -> u16 {
    503
}

impl LimitCount {
    /// The compiled key.
    pub fn limit_key(&self) -> Result<LimitKey, FieldError> {
        LimitKey::compile(self.key_type, &self.key)
    }
}

impl PluginSchema for LimitCount {
    const NAME: &'static str = "limit-count";
    const PRIORITY: i32 = 1002;

    fn check(&self) -> Result<(), FieldError> {
        if self.count == 0 {
            return Err(FieldError::new("count", "must be at least 1"));
        }
        if self.time_window == 0 {
            return Err(FieldError::new("time_window", "must be at least 1"));
        }
        common::check_status("rejected_code", self.rejected_code)?;
        common::check_msg("rejected_msg", self.rejected_msg.as_ref())?;
        if self.group.as_deref() == Some("") {
            return Err(FieldError::new("group", "must not be empty"));
        }
        self.limit_key()?;
        self.redis.check(self.policy)
    }
}
