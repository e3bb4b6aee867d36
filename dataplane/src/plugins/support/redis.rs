//! A shared Redis client for the `policy: redis` rate limits.
//!
//! One [`RedisClient`] per (host, port, user, password, database) in the process, made
//! when a snapshot compiles (no I/O) and connected lazily by the first request that needs
//! it: a `ConnectionManager` multiplexes one connection and reconnects by itself. Every
//! operation is bounded by the plugin's `redis_timeout`; an error is reported to the plugin,
//! which fails open or answers 500 by `allow_degradation`.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use sluice_plugin_config::ConfigError;
use sluice_plugin_config::common::{LimitKey, Policy, RedisConf};
use tokio::sync::OnceCell;

use crate::plugins::PluginState;

/// What went wrong talking to Redis.
#[derive(Debug, thiserror::Error)]
pub enum RedisFailure {
    /// Connecting or the command took longer than `redis_timeout`.
    #[error("redis timed out after {0:?}")]
    Timeout(Duration),
    /// The client reported an error.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// A lazily connected, shared Redis connection.
pub struct RedisClient {
    client: redis::Client,
    conn: OnceCell<ConnectionManager>,
    /// Bound of one operation (and of connecting).
    pub timeout: Duration,
}

impl std::fmt::Debug for RedisClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClient")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl RedisClient {
    /// The process-wide client for `conf` (shared through `state`). Fails only on settings
    /// the client rejects.
    pub fn shared(conf: &RedisConf, state: &PluginState) -> Result<Arc<Self>, String> {
        let host = conf.redis_host.as_deref().unwrap_or_default();
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        let auth = match (&conf.redis_username, &conf.redis_password) {
            (Some(u), Some(p)) => format!("{}:{}@", encode(u), encode(p)),
            (None, Some(p)) => format!(":{}@", encode(p)),
            (Some(u), None) => format!("{}@", encode(u)),
            (None, None) => String::new(),
        };
        let url = format!(
            "redis://{auth}{host}:{}/{}",
            conf.redis_port, conf.redis_database
        );
        let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
        let timeout = Duration::from_millis(conf.redis_timeout);
        let key = format!("redis-client:{url}:{}", conf.redis_timeout);
        Ok(state.shared(&key, || RedisClient {
            client,
            conn: OnceCell::new(),
            timeout,
        }))
    }

    /// A connection, connecting first if needed.
    pub async fn connection(&self) -> Result<ConnectionManager, RedisFailure> {
        let conn = self
            .conn
            .get_or_try_init(|| async {
                match tokio::time::timeout(
                    self.timeout,
                    ConnectionManager::new(self.client.clone()),
                )
                .await
                {
                    Ok(r) => r.map_err(RedisFailure::from),
                    Err(_) => Err(RedisFailure::Timeout(self.timeout)),
                }
            })
            .await?;
        Ok(conn.clone())
    }

    /// Runs `script` with `keys` and `args`, bounded by the timeout.
    pub async fn run<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        keys: &[&str],
        args: &[i64],
    ) -> Result<T, RedisFailure> {
        let mut conn = self.connection().await?;
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(*k);
        }
        for a in args {
            inv.arg(*a);
        }
        match tokio::time::timeout(self.timeout, inv.invoke_async(&mut conn)).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(RedisFailure::Timeout(self.timeout)),
        }
    }
}

/// A stable 64-bit FNV-1a hash (the same in every replica), to tell configs apart in keys.
pub fn stable_hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Where a rate limit keeps its counters: in this process (`policy: local`), or in Redis,
/// shared by every replica (`policy: redis`).
#[derive(Debug)]
pub enum LimitStore<L> {
    /// Process-wide state, shared through [`PluginState`] so it outlives snapshots.
    Local(Arc<L>),
    /// A shared client and the prefix of this limit's keys.
    Redis {
        /// The client.
        client: Arc<RedisClient>,
        /// `sluice:<plugin>:<scope>:<config hash>:`; the request's key follows.
        prefix: String,
    },
}

/// Picks a limit plugin's store by its `policy`.
///
/// `scope` is what shares one budget: the owner (a route, a consumer), or `group:<name>`
/// for limit-count's `group`. Local state is keyed by `local_key` in `state`.
pub fn limit_store<L: Default + Send + Sync + 'static>(
    plugin: &str,
    policy: Policy,
    redis: &RedisConf,
    state: &PluginState,
    scope: &str,
    json: &str,
    local_key: &str,
) -> Result<LimitStore<L>, ConfigError> {
    Ok(match policy {
        Policy::Redis => LimitStore::Redis {
            client: RedisClient::shared(redis, state).map_err(|e| ConfigError::Field {
                plugin: plugin.into(),
                field: "redis_host".into(),
                reason: e,
            })?,
            prefix: format!("sluice:{plugin}:{scope}:{:016x}:", stable_hash(json)),
        },
        _ => LimitStore::Local(state.shared(local_key, L::default)),
    })
}

/// A limit plugin's compiled `key`, or its error named for the plugin.
pub fn compiled_key(
    plugin: &str,
    key: Result<LimitKey, sluice_plugin_config::FieldError>,
) -> Result<LimitKey, ConfigError> {
    key.map_err(|e| ConfigError::Field {
        plugin: plugin.into(),
        field: e.field,
        reason: e.reason,
    })
}
