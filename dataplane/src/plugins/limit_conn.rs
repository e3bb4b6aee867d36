//! `limit-conn` (priority 1003): at most `conn` requests in flight per key; up to `burst`
//! more are delayed (`default_conn_delay` seconds, scaled by how far over the limit unless
//! `only_use_default_delay`), the rest rejected with `rejected_code` (503) — as
//! lua-resty-limit-conn does for APISIX. A request counts until its response body has been
//! sent (the log phase).
//!
//! Local policy: counters in sharded process maps. Redis policy: a counter per key in
//! Redis shared by every replica (incremented by a script that refuses above the limit,
//! decremented when the request ends); failures follow `allow_degradation` (500
//! `{"error_msg":"failed to limit conn"}` when false).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::request;
use sluice_plugin_config::common::LimitKey;
use sluice_plugin_config::limit_conn::LimitConn as Config;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::support::redis::{LimitStore, RedisClient, compiled_key, limit_store};
use super::support::vars::{self, KeyValue};
use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx};

const SHARDS: usize = 16;

/// In-flight counters per key in process memory.
#[derive(Debug)]
pub struct LocalConns {
    shards: [Mutex<HashMap<KeyValue, u64>>; SHARDS],
    hasher: std::collections::hash_map::RandomState,
}

impl Default for LocalConns {
    fn default() -> Self {
        LocalConns {
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
            hasher: Default::default(),
        }
    }
}

impl LocalConns {
    fn shard(&self, key: &KeyValue) -> Option<&Mutex<HashMap<KeyValue, u64>>> {
        self.shards
            .get((self.hasher.hash_one(key) as usize) % SHARDS)
    }

    /// Counts a request in; `Some(in_flight)` including it, `None` when over `limit`.
    pub fn enter(&self, key: &KeyValue, limit: u64) -> Option<u64> {
        let mut m = match self.shard(key)?.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let cur = m.get(key).copied().unwrap_or(0);
        if cur + 1 > limit {
            return None;
        }
        m.insert(key.clone(), cur + 1);
        Some(cur + 1)
    }

    /// Counts a request out.
    pub fn leave(&self, key: &KeyValue) {
        let Some(shard) = self.shard(key) else { return };
        let mut m = match shard.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some(n) = m.get_mut(key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(key);
            }
        }
    }
}

/// Releases a local slot when the request ends.
struct LocalSlot(Arc<LocalConns>, KeyValue);

impl Drop for LocalSlot {
    fn drop(&mut self) {
        self.0.leave(&self.1);
    }
}

/// Releases a Redis slot when the request ends (a task, as Drop cannot wait).
struct RedisSlot(Arc<RedisClient>, String);

impl Drop for RedisSlot {
    fn drop(&mut self) {
        let (client, key) = (Arc::clone(&self.0), std::mem::take(&mut self.1));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let script = redis::Script::new(LEAVE_SCRIPT);
                if let Err(e) = client.run::<i64>(&script, &[&key], &[]).await {
                    tracing::warn!(error = %e, "limit-conn: redis release failed");
                }
            });
        }
    }
}

/// `{1, n}` with the new count, or `{0, n}` when over ARGV[1] (not counted).
const ENTER_SCRIPT: &str = r"
local n = redis.call('incr', KEYS[1])
if n > tonumber(ARGV[1]) then
  redis.call('decr', KEYS[1])
  return {0, n - 1}
end
redis.call('expire', KEYS[1], 3600)
return {1, n}
";

const LEAVE_SCRIPT: &str = r"
local n = redis.call('decr', KEYS[1])
if n <= 0 then redis.call('del', KEYS[1]) end
return n
";

/// The plugin.
#[derive(Debug)]
pub struct LimitConn {
    conf: Config,
    key: LimitKey,
    backend: LimitStore<LocalConns>,
    script: redis::Script,
}

impl Builtin for LimitConn {
    type Config = Config;
    const HOOKS: Hooks = Hooks::ACCESS;

    /// Builds `limit-conn`.
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
            &format!("limit-conn:{}:{json}", cx.owner),
        )?;
        Ok(LimitConn {
            conf,
            key,
            backend,
            script: redis::Script::new(ENTER_SCRIPT),
        })
    }
}

impl LimitConn {
    fn reject(&self) -> http::Response<crate::upstream::body::ProxyBody> {
        super::rejection(
            super::status(self.conf.rejected_code),
            self.conf.rejected_msg.as_deref(),
        )
    }

    /// The delay of the `n`th request in flight.
    fn delay(&self, n: u64) -> Option<Duration> {
        if n <= self.conf.conn {
            return None;
        }
        let unit = self.conf.default_conn_delay;
        let secs = if self.conf.only_use_default_delay {
            unit
        } else {
            unit * ((n - 1) / self.conf.conn) as f64
        };
        Some(Duration::from_secs_f64(secs))
    }
}

impl Plugin for LimitConn {
    fn access<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        let key = vars::limit_key(&self.key, req, ctx);
        let max = self.conf.conn.saturating_add(self.conf.burst);
        match &self.backend {
            LimitStore::Local(conns) => match conns.enter(&key, max) {
                None => Flow::respond(self.reject()),
                Some(n) => {
                    ctx.keep(Box::new(LocalSlot(Arc::clone(conns), key)));
                    match self.delay(n) {
                        None => Flow::Continue,
                        Some(d) => Flow::Pending(Box::pin(async move {
                            tokio::time::sleep(d).await;
                            Ok(())
                        })),
                    }
                }
            },
            LimitStore::Redis { client, prefix } => {
                let redis_key = format!("{prefix}{key}");
                Flow::Pending(Box::pin(async move {
                    let max = i64::try_from(max).unwrap_or(i64::MAX);
                    let res: Result<Vec<i64>, _> =
                        client.run(&self.script, &[&redis_key], &[max]).await;
                    match res.as_deref() {
                        Ok(&[1, n]) => {
                            ctx.keep(Box::new(RedisSlot(Arc::clone(client), redis_key)));
                            if let Some(d) = self.delay(u64::try_from(n).unwrap_or(0)) {
                                tokio::time::sleep(d).await;
                            }
                            Ok(())
                        }
                        Ok(&[0, _]) => Err(Box::new(self.reject())),
                        other => {
                            tracing::error!(route = %ctx.chain.route_id, reply = ?other.map_err(|e| e.to_string()), "limit-conn: redis failed");
                            super::degrade(self.conf.allow_degradation, "failed to limit conn")
                        }
                    }
                }))
            }
        }
    }
}
