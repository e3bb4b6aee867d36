//! `limit-count` (priority 1002): at most `count` requests per `time_window` per key.
//!
//! Redis policy (`policy: redis`): one counter per key in Redis, shared by every replica,
//! created with the window as its TTL and decremented atomically by a script; when Redis
//! fails, `allow_degradation: true` lets the request through and `false` answers 500
//! `{"error_msg":"failed to limit count"}`.
//!
//! Local policy: a fixed window per key that starts with the key's first request (as
//! lua-resty-limit-count does), kept in sharded maps in process memory; expired windows are
//! swept when a map grows. Counters are shared by all workers of the process and survive
//! snapshot reloads while the route's config stays the same (or by `group`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::request;
use sluice_plugin_config::common::LimitKey;
use sluice_plugin_config::limit_count::LimitCount as Config;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::support::fasthash::{MixBuildHasher, Prehashed};
use super::support::redis::{LimitStore, compiled_key, limit_store};
use super::support::vars::{self, KeyValue};
use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx};

const SHARDS: usize = 16;

/// `X-RateLimit-Limit`.
pub static LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub static REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub static RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The `X-RateLimit-*` headers of one response: set by limit-count in the access phase,
/// written into the response head by the response phases.
///
/// NB: one slot, so the last limit-count plugin of a request sets them (a route's after a
/// global rule's), as APISIX's `core.response.set_header` replaces. Numbers stay numbers
/// until the head is written: staging three header pairs per request cost ~150
/// instructions more (issue 4).
#[derive(Debug, Clone)]
pub struct Quota {
    limit: HeaderValue,
    remaining: u64,
    reset: u64,
}

impl Quota {
    /// Appends the three headers to `headers`; returns their size in the head.
    pub fn append_to(self, headers: &mut HeaderMap) -> u64 {
        let remaining = number_value(self.remaining);
        let reset = number_value(self.reset);
        let size = LIMIT.as_str().len()
            + self.limit.len()
            + REMAINING.as_str().len()
            + remaining.len()
            + RESET.as_str().len()
            + reset.len()
            + 3 * 4;
        headers.reserve(3);
        headers.append(LIMIT.clone(), self.limit);
        headers.append(REMAINING.clone(), remaining);
        headers.append(RESET.clone(), reset);
        size as u64
    }
}

/// The verdict for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the request fits the budget.
    pub allowed: bool,
    /// Requests left in the window (0 when rejected).
    pub remaining: u64,
    /// Seconds until the window resets.
    pub reset: u64,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    /// When the window ends (its first request + `time_window`). NB: the end, not the
    /// start, so that a request compares instants and subtracts once (issue 4).
    end: Instant,
    used: u64,
}

/// Fixed windows per key in process memory.
#[derive(Debug)]
pub struct LocalWindows {
    shards: [Mutex<Shard>; SHARDS],
    /// NB: aHash with a random key, as DoS-resistant as std's SipHash for keys clients
    /// choose (their addresses) and ~100 instructions cheaper per request (issue 4).
    hasher: ahash::RandomState,
}

#[derive(Debug, Default)]
struct Shard {
    /// NB: keyed by the keyed hash computed once for the shard (see [`Prehashed`]).
    map: HashMap<Prehashed<KeyValue>, Window, MixBuildHasher>,
    sweep_at: usize,
}

impl Default for LocalWindows {
    fn default() -> Self {
        LocalWindows {
            shards: std::array::from_fn(|_| Mutex::new(Shard::default())),
            hasher: Default::default(),
        }
    }
}

impl LocalWindows {
    /// Counts one request for `key` against `limit` per `window`.
    pub fn incoming(&self, key: KeyValue, limit: u64, window: Duration, now: Instant) -> Verdict {
        let h = self.hasher.hash_one(&key);
        let idx = (h as usize) % SHARDS;
        let Some(shard) = self.shards.get(idx) else {
            return Verdict {
                allowed: true,
                remaining: limit,
                reset: window.as_secs(),
            };
        };
        let mut shard = match shard.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if shard.map.len() >= shard.sweep_at.max(1024) {
            shard.map.retain(|_, w| now < w.end);
            shard.sweep_at = shard.map.len() * 2;
        }
        let w = shard
            .map
            .entry(Prehashed { hash: h, key })
            .or_insert(Window {
                end: window_end(now, window),
                used: 0,
            });
        let left = if now < w.end {
            w.end.saturating_duration_since(now)
        } else {
            *w = Window {
                end: window_end(now, window),
                used: 0,
            };
            window
        };
        let reset = left.as_secs() + u64::from(left.subsec_nanos() > 0);
        if w.used >= limit {
            return Verdict {
                allowed: false,
                remaining: 0,
                reset,
            };
        }
        w.used += 1;
        Verdict {
            allowed: true,
            remaining: limit - w.used,
            reset,
        }
    }
}

/// When a window that starts `now` ends. NB: a `time_window` too long for the clock (any
/// u64 is a valid config) ends ~136 years on, never panics.
fn window_end(now: Instant, window: Duration) -> Instant {
    now.checked_add(window)
        .or_else(|| now.checked_add(Duration::from_secs(u64::from(u32::MAX))))
        .unwrap_or(now)
}

/// Decrements the window's budget; creates it (with the window as TTL) on first use.
/// Returns `{remaining, ttl}`; a negative remaining means rejected.
const REDIS_SCRIPT: &str = r"
local ttl = redis.call('ttl', KEYS[1])
if ttl < 0 then
  redis.call('set', KEYS[1], ARGV[1] - 1, 'EX', ARGV[2])
  return {ARGV[1] - 1, tonumber(ARGV[2])}
end
return {redis.call('decr', KEYS[1]), ttl}
";

/// The plugin.
#[derive(Debug)]
pub struct LimitCount {
    conf: Config,
    key: LimitKey,
    window: Duration,
    limit_value: HeaderValue,
    backend: LimitStore<LocalWindows>,
    script: redis::Script,
}

impl Builtin for LimitCount {
    type Config = Config;
    const HOOKS: Hooks = Hooks::ACCESS;

    /// Builds `limit-count` from its config.
    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let key = compiled_key(Config::NAME, conf.limit_key())?;
        // NB: routes in one group share one budget, as in APISIX.
        let (scope, local_key) = match &conf.group {
            Some(g) => (format!("group:{g}"), format!("limit-count:group:{g}")),
            None => (
                cx.owner.to_owned(),
                format!("limit-count:{}:{json}", cx.owner),
            ),
        };
        let backend = limit_store(
            Config::NAME,
            conf.policy,
            &conf.redis,
            cx.state,
            &scope,
            json,
            &local_key,
        )?;
        Ok(LimitCount {
            window: Duration::from_secs(conf.time_window),
            limit_value: lasting_number_value(conf.count),
            key,
            conf,
            backend,
            script: redis::Script::new(REDIS_SCRIPT),
        })
    }
}

impl LimitCount {
    fn apply(&self, v: Verdict, ctx: &mut PluginCtx) -> Flow<'static> {
        if self.conf.show_limit_quota_header {
            ctx.quota = Some(Quota {
                limit: self.limit_value.clone(),
                remaining: v.remaining,
                reset: v.reset,
            });
        }
        if v.allowed {
            Flow::Continue
        } else {
            Flow::respond(super::rejection(
                super::status(self.conf.rejected_code),
                self.conf.rejected_msg.as_deref(),
            ))
        }
    }
}

/// `0000` to `9999`, four digits each, for [`number_value`].
static DIGITS4: [u8; 40_000] = digits4();

/// [`DIGITS4`] as text. NB: checked once, at compile time, so that a slice of it makes a
/// header value without checking its bytes again.
static DIGITS4_STR: &str = match std::str::from_utf8(&DIGITS4) {
    Ok(s) => s,
    Err(_) => "",
};

const fn digits4() -> [u8; 40_000] {
    let mut t = [0u8; 40_000];
    let mut n = 0;
    while n < 10_000 {
        t[4 * n] = b'0' + (n / 1000) as u8;
        t[4 * n + 1] = b'0' + (n / 100 % 10) as u8;
        t[4 * n + 2] = b'0' + (n / 10 % 10) as u8;
        t[4 * n + 3] = b'0' + (n % 10) as u8;
        n += 1;
    }
    t
}

/// `n` as a header value. NB: below 10,000 (the seconds to a window's reset, most limits)
/// it is a static slice: no allocation, and cloning or dropping it counts no references
/// (each an atomic operation); formatting and allocating per request cost ~150
/// instructions (issue 4). Above, one allocation (`HeaderValue::from(u64)` makes two, and
/// a reference count).
pub fn number_value(n: u64) -> HeaderValue {
    if let Ok(i) = usize::try_from(n)
        && i < 10_000
    {
        let width = match i {
            0..=9 => 1,
            10..=99 => 2,
            100..=999 => 3,
            _ => 4,
        };
        if let Some(digits) = DIGITS4_STR.get(4 * i + 4 - width..4 * i + 4) {
            return HeaderValue::from_static(digits);
        }
    }
    // Four digits at a time from the table, from the right.
    let mut buf = [b'0'; 20];
    let mut at = buf.len();
    let mut rest = n;
    while rest > 0 && at >= 4 {
        let i = (rest % 10_000) as usize;
        rest /= 10_000;
        if let Some(four) = DIGITS4.get(4 * i..4 * i + 4)
            && let Ok(four) = <[u8; 4]>::try_from(four)
            && let Some(to) = buf.get_mut(at - 4..at)
        {
            to.copy_from_slice(&four);
        }
        at -= 4;
    }
    let width = n.checked_ilog10().unwrap_or(0) as usize + 1;
    buf.get(buf.len().saturating_sub(width)..)
        .and_then(|d| HeaderValue::from_bytes(d).ok())
        .unwrap_or_else(|| HeaderValue::from(n))
}

/// [`number_value`] for a value that lasts as long as the process: a configured `count`.
///
/// NB: a count of 10,000 or more is kept as static text (each distinct value once, at most
/// [`LASTING_MAX`] of them), so that the header each request copies is cloned and dropped
/// without a reference count (two atomic operations per request, issue 4).
fn lasting_number_value(n: u64) -> HeaderValue {
    static LASTING: Mutex<Vec<(u64, &'static str)>> = Mutex::new(Vec::new());
    if n < 10_000 {
        return number_value(n);
    }
    let mut all = match LASTING.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    if let Some((_, text)) = all.iter().find(|(m, _)| *m == n) {
        return HeaderValue::from_static(text);
    }
    if all.len() >= LASTING_MAX {
        return number_value(n);
    }
    let text: &'static str = Box::leak(n.to_string().into_boxed_str());
    all.push((n, text));
    HeaderValue::from_static(text)
}

/// Distinct counts [`lasting_number_value`] keeps (20 bytes each at most).
const LASTING_MAX: usize = 1024;

impl Plugin for LimitCount {
    fn access<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        let key = vars::limit_key(&self.key, req, ctx);
        match &self.backend {
            LimitStore::Local(local) => {
                // NB: the request's arrival is "now" (as APISIX's cached `ngx.now()`), which
                // spares a clock read.
                let v = local.incoming(key, self.conf.count, self.window, ctx.started);
                self.apply(v, ctx)
            }
            LimitStore::Redis { client, prefix } => {
                let redis_key = format!("{prefix}{key}");
                Flow::Pending(Box::pin(async move {
                    let count = i64::try_from(self.conf.count).unwrap_or(i64::MAX);
                    let window = i64::try_from(self.conf.time_window).unwrap_or(i64::MAX);
                    let res: Result<Vec<i64>, _> = client
                        .run(&self.script, &[&redis_key], &[count, window])
                        .await;
                    match res.as_deref() {
                        Ok(&[left, ttl]) => {
                            let verdict = Verdict {
                                allowed: left >= 0,
                                remaining: u64::try_from(left).unwrap_or(0),
                                reset: u64::try_from(ttl).unwrap_or(0),
                            };
                            match self.apply(verdict, ctx) {
                                Flow::Respond(r) => Err(r),
                                _ => Ok(()),
                            }
                        }
                        other => {
                            let err = match other {
                                Err(e) => e.to_string(),
                                Ok(v) => format!("unexpected reply {v:?}"),
                            };
                            tracing::error!(route = %ctx.chain.route_id, error = %err, "limit-count: redis failed");
                            super::degrade(self.conf.allow_degradation, "failed to limit count")
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
    fn window_counts_and_resets() {
        let w = LocalWindows::default();
        let t0 = Instant::now();
        let k = || KeyValue::Text("k".into());
        let win = Duration::from_secs(60);
        assert_eq!(
            w.incoming(k(), 2, win, t0),
            Verdict {
                allowed: true,
                remaining: 1,
                reset: 60
            }
        );
        assert_eq!(
            w.incoming(k(), 2, win, t0),
            Verdict {
                allowed: true,
                remaining: 0,
                reset: 60
            }
        );
        let v = w.incoming(k(), 2, win, t0 + Duration::from_millis(1500));
        assert_eq!(
            v,
            Verdict {
                allowed: false,
                remaining: 0,
                reset: 59
            }
        );
        let v = w.incoming(k(), 2, win, t0 + Duration::from_secs(61));
        assert_eq!(
            v,
            Verdict {
                allowed: true,
                remaining: 1,
                reset: 60
            }
        );
        // Another key has its own budget.
        assert!(
            w.incoming(KeyValue::Text("other".into()), 2, win, t0)
                .allowed
        );
    }

    #[test]
    fn a_window_too_long_for_the_clock_counts_without_panicking() {
        let w = LocalWindows::default();
        let k = || KeyValue::Text("k".into());
        let forever = Duration::from_secs(u64::MAX);
        let t0 = Instant::now();
        assert_eq!(w.incoming(k(), 2, forever, t0).remaining, 1);
        assert_eq!(w.incoming(k(), 2, forever, t0).remaining, 0);
        assert!(!w.incoming(k(), 2, forever, t0).allowed);
    }

    #[test]
    fn ip_keys_count_per_address() {
        let w = LocalWindows::default();
        let t0 = Instant::now();
        let win = Duration::from_secs(60);
        let ip = |s: &str| KeyValue::Ip(s.parse().unwrap());
        assert_eq!(w.incoming(ip("10.0.0.1"), 2, win, t0).remaining, 1);
        assert_eq!(w.incoming(ip("10.0.0.1"), 2, win, t0).remaining, 0);
        assert!(!w.incoming(ip("10.0.0.1"), 2, win, t0).allowed);
        // Same bytes in another family, and a text key spelling the address: other keys.
        assert_eq!(w.incoming(ip("::ffff:10.0.0.1"), 2, win, t0).remaining, 1);
        assert_eq!(w.incoming(ip("10.0.0.2"), 2, win, t0).remaining, 1);
        let text = KeyValue::Text("10.0.0.1".into());
        assert_eq!(w.incoming(text, 2, win, t0).remaining, 1);
    }

    #[test]
    fn numbers_as_header_values() {
        for n in [
            0, 1, 9, 10, 59, 60, 99, 100, 999, 1000, 3600, 9999, 10_000, 86_400,
        ] {
            assert_eq!(number_value(n), n.to_string().as_str(), "{n}");
        }
        assert_eq!(number_value(2_000_000_000_000), "2000000000000");
        assert_eq!(number_value(u64::MAX), u64::MAX.to_string().as_str());
    }
}
