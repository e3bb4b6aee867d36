//! `limit-req`: leaky bucket of `rate` requests per second with `burst` excess delayed.

use serde::Deserialize;

use crate::common::{self, KeyType, LimitKey, Policy, RedisConf};
use crate::{FieldError, PluginSchema};

/// Configuration of `limit-req` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct LimitReq {
    /// Requests per second allowed; > 0. Required.
    pub rate: f64,
    /// Excess requests per second that are delayed rather than rejected; >= 0. Required.
    pub burst: f64,
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
    /// Do not delay requests within the burst; default false.
    #[serde(default)]
    pub nodelay: bool,
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

impl LimitReq {
    /// The compiled key.
    pub fn limit_key(&self) -> Result<LimitKey, FieldError> {
        LimitKey::compile(self.key_type, &self.key)
    }
}

impl PluginSchema for LimitReq {
    const NAME: &'static str = "limit-req";
    const PRIORITY: i32 = 1001;

    fn check(&self) -> Result<(), FieldError> {
        if !(self.rate > 0.0 && self.rate.is_finite()) {
            return Err(FieldError::new("rate", "must be greater than 0"));
        }
        if !(self.burst >= 0.0 && self.burst.is_finite()) {
            return Err(FieldError::new("burst", "must be at least 0"));
        }
        common::check_status("rejected_code", self.rejected_code)?;
        common::check_msg("rejected_msg", self.rejected_msg.as_ref())?;
        self.limit_key()?;
        self.redis.check(self.policy)
    }
}
