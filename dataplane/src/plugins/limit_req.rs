//! `limit-req` (priority 1001): a leaky bucket of `rate` requests per second per key.
//! Requests above the rate are delayed (unless `nodelay`) while the excess stays within
//! `burst`; beyond that they are rejected with `rejected_code` (503) and, with
//! `rejected_msg`, `{"error_msg":"<msg>"}` — as lua-resty-limit-req does for APISIX.
//!
//! Local policy: state per key in sharded process maps. Redis policy: the same bucket in a
//! Redis hash updated by a script (clock: the dataplanes', in milliseconds), shared by
//! every replica; Redis failures follow `allow_degradation` (500
//! `{"error_msg":"failed to limit req"}` when false).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::request;
use sluice_plugin_config::common::LimitKey;
use sluice_plugin_config::limit_req::LimitReq as Config;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::support::redis::{LimitStore, compiled_key, limit_store};
use super::support::vars::{self, KeyValue};
use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx};

const SHARDS: usize = 16;

/// Excess is kept in thousandths of a request, as lua-resty-limit-req does.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    excess: u64,
    last: Instant,
}

/// Leaky buckets per key in process memory.
#[derive(Debug)]
pub struct LocalBuckets {
    shards: [Mutex<(HashMap<KeyValue, Bucket>, usize)>; SHARDS],
    hasher: std::collections::hash_map::RandomState,
}

impl Default for LocalBuckets {
    fn default() -> Self {
        LocalBuckets {
            shards: std::array::from_fn(|_| Mutex::new((HashMap::new(), 0))),
            hasher: Default::default(),
        }
    }
}

/// `Some(delay)` to let the request through after `delay`, `None` to reject.
pub type Decision = Option<Duration>;

impl LocalBuckets {
    /// Counts one request for `key` (lua-resty-limit-req's step: the excess leaks at `rate`,
    /// each request adds one; above `burst` the request is rejected and not counted).
    pub fn incoming(&self, key: KeyValue, rate: f64, burst: f64, now: Instant) -> Decision {
        let rate_milli = (rate * 1000.0) as u64;
        let burst_milli = (burst * 1000.0) as u64;
        let idx = (self.hasher.hash_one(&key) as usize) % SHARDS;
        let Some(shard) = self.shards.get(idx) else {
            return Some(Duration::ZERO);
        };
        let mut g = match shard.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let (map, sweep_at) = &mut *g;
        if map.len() >= (*sweep_at).max(1024) {
            // A bucket that has fully drained holds no information.
            map.retain(|_, b| {
                let ms = now.saturating_duration_since(b.last).as_millis() as u64;
                rate_milli.saturating_mul(ms) / 1000 < b.excess
            });
            *sweep_at = map.len() * 2;
        }
        let excess = match map.get_mut(&key) {
            Some(b) => {
                let ms = now.saturating_duration_since(b.last).as_millis() as u64;
                let e = (b.excess + 1000).saturating_sub(rate_milli.saturating_mul(ms) / 1000);
                if e > burst_milli {
                    return None;
                }
                *b = Bucket {
                    excess: e,
                    last: now,
                };
                e
            }
            None => {
                map.insert(
                    key,
                    Bucket {
                        excess: 0,
                        last: now,
                    },
                );
                0
            }
        };
        Some(Duration::from_secs_f64(
            excess as f64 / rate_milli.max(1) as f64,
        ))
    }
}

/// The bucket in a Redis hash: fields `excess` (milli-requests) and `last` (ms). Returns
/// `{allowed (1/0), excess}`.
const REDIS_SCRIPT: &str = r"
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local st = redis.call('hmget', KEYS[1], 'excess', 'last')
local excess = 0
if st[1] then
  local elapsed = math.abs(now - tonumber(st[2]))
  excess = math.max(tonumber(st[1]) - rate * elapsed / 1000 + 1000, 0)
  if excess > burst then
    return {0, 0}
  end
end
redis.call('hset', KEYS[1], 'excess', excess, 'last', now)
redis.call('pexpire', KEYS[1], math.ceil(excess * 1000 / rate) + 1000)
return {1, math.floor(excess)}
";

/// The plugin.
#[derive(Debug)]
pub struct LimitReq {
    conf: Config,
    key: LimitKey,
    backend: LimitStore<LocalBuckets>,
    script: redis::Script,
}

impl Builtin for LimitReq {
    type Config = Config;
    const HOOKS: Hooks = Hooks::ACCESS;

    /// Builds `limit-req`.
    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let key = compiled_key(Config::NAME, conf.limit_key())?;
        let backend = limit_store(
            Config::NAME,
            conf.policy,
            &conf.redis,
            cx.state,
            cx.owner,
            json,
            &format!("limit-req:{}:{json}", cx.owner),
        )?;
        Ok(LimitReq {
            conf,
            key,
            backend,
            script: redis::Script::new(REDIS_SCRIPT),
        })
    }
}

impl LimitReq {
    fn reject(&self) -> http::Response<crate::upstream::body::ProxyBody> {
        super::rejection(
            super::status(self.conf.rejected_code),
            self.conf.rejected_msg.as_deref(),
        )
    }

    fn delay(&self, d: Duration) -> Option<Duration> {
        (!self.conf.nodelay && d >= Duration::from_millis(1)).then_some(d)
    }
}

impl Plugin for LimitReq {
    fn access<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        let key = vars::limit_key(&self.key, req, ctx);
        match &self.backend {
            LimitStore::Local(b) => {
                match b.incoming(key, self.conf.rate, self.conf.burst, Instant::now()) {
                    None => Flow::respond(self.reject()),
                    Some(d) => match self.delay(d) {
                        None => Flow::Continue,
                        Some(d) => Flow::Pending(Box::pin(async move {
                            tokio::time::sleep(d).await;
                            Ok(())
                        })),
                    },
                }
            }
            LimitStore::Redis { client, prefix } => {
                let redis_key = format!("{prefix}{key}");
                Flow::Pending(Box::pin(async move {
                    let now_ms = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as i64);
                    let rate = (self.conf.rate * 1000.0) as i64;
                    let burst = (self.conf.burst * 1000.0) as i64;
                    let res: Result<Vec<i64>, _> = client
                        .run(&self.script, &[&redis_key], &[rate, burst, now_ms])
                        .await;
                    match res.as_deref() {
                        Ok(&[1, excess]) => {
                            let d = Duration::from_secs_f64(
                                excess.max(0) as f64 / (rate.max(1) as f64),
                            );
                            if let Some(d) = self.delay(d) {
                                tokio::time::sleep(d).await;
                            }
                            Ok(())
                        }
                        Ok(&[0, _]) => Err(Box::new(self.reject())),
                        other => {
                            tracing::error!(route = %ctx.chain.route_id, reply = ?other.map_err(|e| e.to_string()), "limit-req: redis failed");
                            super::degrade(self.conf.allow_degradation, "failed to limit req")
                        }
                    }
                }))
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn bucket_delays_then_rejects() {
        let b = LocalBuckets::default();
        let t0 = Instant::now();
        let k = || KeyValue::Text("k".into());
        // rate 1/s, burst 1: the first passes at once, the second is delayed ~1s, the third
        // is rejected; after 2s the bucket has drained.
        assert_eq!(b.incoming(k(), 1.0, 1.0, t0), Some(Duration::ZERO));
        assert_eq!(b.incoming(k(), 1.0, 1.0, t0), Some(Duration::from_secs(1)));
        assert_eq!(b.incoming(k(), 1.0, 1.0, t0), None);
        assert_eq!(
            b.incoming(k(), 1.0, 1.0, t0 + Duration::from_secs(2)),
            Some(Duration::ZERO)
        );
    }
}
