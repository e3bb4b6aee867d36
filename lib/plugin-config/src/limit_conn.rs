//! `limit-conn`: at most `conn` concurrent requests per key, `burst` more delayed.

use serde::Deserialize;

use crate::common::{self, KeyType, LimitKey, Policy, RedisConf};
use crate::{FieldError, PluginSchema};

/// Configuration of `limit-conn` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct LimitConn {
    /// Concurrent requests allowed; >= 1. Required.
    pub conn: u64,
    /// Excess concurrent requests that are delayed; >= 0. Required.
    pub burst: u64,
    /// Delay in seconds of a request in the burst; > 0. Required.
    pub default_conn_delay: f64,
    /// Delay exactly `default_conn_delay` (not scaled by the excess); default false.
    #[serde(default)]
    pub only_use_default_delay: bool,
    /// The key. Required.
    pub key: String,
    /// How `key` is read; default `var`.
    #[serde(default)]
    pub key_type: KeyType,
    /// Status of a rejected request; default 503.
    #[serde(default = "default_rejected_code")]
    pub rejected_code: u16,
    /// Body `{"error_msg":"<msg>"}` of a rejection.
    #[serde(default)]
    pub rejected_msg: Option<String>,
    /// Let requests through when Redis fails; default false (500).
    #[serde(default)]
    pub allow_degradation: bool,
    /// Where state lives; default `local`.
    #[serde(default)]
    pub policy: Policy,
    /// Redis settings for `policy: redis`.
    #[serde(flatten)]
    pub redis: RedisConf,
}

fn default_rejected_code() -> u16 {
    503
}

impl LimitConn {
    /// The compiled key.
    pub fn limit_key(&self) -> Result<LimitKey, FieldError> {
        LimitKey::compile(self.key_type, &self.key)
    }
}

impl PluginSchema for LimitConn {
    const NAME: &'static str = "limit-conn";
    const PRIORITY: i32 = 1003;

    fn check(&self) -> Result<(), FieldError> {
        if self.conn == 0 {
            return Err(FieldError::new("conn", "must be at least 1"));
        }
        if !(self.default_conn_delay > 0.0 && self.default_conn_delay.is_finite()) {
            return Err(FieldError::new(
                "default_conn_delay",
                "must be greater than 0",
            ));
        }
        common::check_status("rejected_code", self.rejected_code)?;
        common::check_msg("rejected_msg", self.rejected_msg.as_ref())?;
        self.limit_key()?;
        self.redis.check(self.policy)
    }
}
