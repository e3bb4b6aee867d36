//! Fields shared by several plugins: rate-limit keys, policies and Redis settings.

use serde::Deserialize;

use crate::FieldError;
use crate::vars::{Template, Var};

/// How a rate limit's `key` is read (APISIX `key_type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyType {
    /// `key` names one variable (`remote_addr`, `http_x_user`, ...). The default.
    #[default]
    Var,
    /// `key` is a template of variables (`$remote_addr $http_x_user`).
    VarCombination,
    /// `key` is used as it is: one budget for everyone.
    Constant,
}

/// A compiled rate-limit key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitKey {
    /// One variable.
    Var(Var),
    /// A template.
    Combination(Template),
    /// A constant.
    Constant(String),
}

impl LimitKey {
    /// Compiles `key` of type `key_type`; the error names the `key` field.
    pub fn compile(key_type: KeyType, key: &str) -> Result<Self, FieldError> {
        match key_type {
            KeyType::Var => {
                let name = key.strip_prefix('$').unwrap_or(key);
                Var::parse(name)
                    .map(LimitKey::Var)
                    .ok_or_else(|| FieldError::new("key", format!("unknown variable {key:?}")))
            }
            KeyType::VarCombination => Template::parse(key)
                .map(LimitKey::Combination)
                .map_err(|r| FieldError::new("key", r)),
            KeyType::Constant => Ok(LimitKey::Constant(key.to_owned())),
        }
    }
}

/// Where a rate limit keeps its counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum Policy {
    /// In this dataplane process only; never touches the network. The default.
    #[default]
    #[serde(rename = "local")]
    Local,
    /// In one Redis server, shared by every replica.
    #[serde(rename = "redis")]
    Redis,
    /// Redis Cluster (rejected by `check`: not supported yet).
    #[serde(rename = "redis-cluster")]
    RedisCluster,
}

/// Redis connection settings (APISIX's `redis_*` fields).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RedisConf {
    /// Host name or address; required with `policy: redis`.
    #[serde(default)]
    pub redis_host: Option<String>,
    /// Port, default 6379.
    #[serde(default = "default_redis_port")]
    pub redis_port: u16,
    /// ACL user name (Redis 6+), default none.
    #[serde(default)]
    pub redis_username: Option<String>,
    /// Password, default none.
    #[serde(default)]
    pub redis_password: Option<String>,
    /// Database number, default 0.
    #[serde(default)]
    pub redis_database: u32,
    /// Timeout of one Redis operation (and connect) in milliseconds, default 1000.
    #[serde(default = "default_redis_timeout")]
    pub redis_timeout: u64,
    /// TLS to Redis (rejected: not supported yet).
    #[serde(default)]
    pub redis_ssl: bool,
}

fn default_redis_port() -> u16 {
    6379
}

fn default_redis_timeout() -> u64 {
    1000
}

impl RedisConf {
    /// Checks the settings for `policy`.
    pub fn check(&self, policy: Policy) -> Result<(), FieldError> {
        match policy {
            Policy::Local => Ok(()),
            Policy::RedisCluster => Err(FieldError::new(
                "policy",
                "redis-cluster is not supported yet (use redis or local)",
            )),
            Policy::Redis => {
                let Some(host) = self.redis_host.as_deref().filter(|h| !h.is_empty()) else {
                    return Err(FieldError::new(
                        "redis_host",
                        "required when policy is redis",
                    ));
                };
                check_host(host).map_err(|why| FieldError::new("redis_host", why))?;
                if self.redis_port == 0 {
                    return Err(FieldError::new("redis_port", "must be at least 1"));
                }
                if self.redis_timeout == 0 {
                    return Err(FieldError::new("redis_timeout", "must be at least 1"));
                }
                if self.redis_ssl {
                    return Err(FieldError::new(
                        "redis_ssl",
                        "TLS to Redis is not supported yet",
                    ));
                }
                Ok(())
            }
        }
    }
}

/// Checks `host` is an IP address (IPv6 optionally in brackets) or a DNS name: what a
/// client can connect to, so that a value the dataplane's client would refuse is rejected
/// here, with the field named, instead of failing the whole snapshot on the dataplane.
pub fn check_host(host: &str) -> Result<(), String> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if bare.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    sluice_proto::validate::dns_name(name)
        .map_err(|e| format!("{host:?} is neither an IP address nor a host name: {e}"))?;
    // NB: URL parsing reads a name whose last label is a number as an IPv4 address.
    if name
        .rsplit('.')
        .next()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!("{host:?} is not a valid IPv4 address"));
    }
    Ok(())
}

/// Largest request body a plugin may be configured to read (`max_req_body_size` of
/// request-validation, hmac-auth and forward-auth): Sluice holds the body in memory while
/// the plugin uses it. 64 MiB, APISIX's default for these plugins.
pub const MAX_BODY_LIMIT: u64 = 64 * 1024 * 1024;

/// APISIX's default `max_req_body_size` of hmac-auth and forward-auth: 64 MiB.
pub fn default_max_req_body_size() -> u64 {
    MAX_BODY_LIMIT
}

/// Checks a `max_req_body_size`: 1..=[`MAX_BODY_LIMIT`].
pub fn check_body_size(field: &str, n: u64) -> Result<(), FieldError> {
    if (1..=MAX_BODY_LIMIT).contains(&n) {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            format!("{n} is out of range 1..={MAX_BODY_LIMIT} (Sluice holds the body in memory)"),
        ))
    }
}

/// Checks an HTTP status code for a rejection (`rejected_code`): 200–599 as APISIX.
pub fn check_status(field: &str, code: u16) -> Result<(), FieldError> {
    if (200..=599).contains(&code) {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            format!("{code} is out of range 200..=599"),
        ))
    }
}

/// Checks an optional message is not empty (APISIX `minLength: 1`).
pub fn check_msg(field: &str, msg: Option<&String>) -> Result<(), FieldError> {
    match msg {
        Some(m) if m.is_empty() => Err(FieldError::new(field, "must not be empty")),
        _ => Ok(()),
    }
}

pub(crate) fn yes() -> bool {
    true
}

pub(crate) fn remote_addr() -> String {
    "remote_addr".into()
}

/// Largest compiled program of one user regex (`regex::RegexBuilder::size_limit`): a rule
/// that compiles bigger is rejected at validation, never built per request.
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Largest compiled set of user regexes (all the rules of one plugin).
pub const REGEX_SET_SIZE_LIMIT: usize = 8 << 20;

/// Compiles `rules` (field `field`, e.g. `block_rules`) into one set matched in a single
/// pass, each rule bounded by [`REGEX_SIZE_LIMIT`]; the error names the rule's index.
pub fn compile_regex_set(
    field: &str,
    rules: &[String],
    case_insensitive: bool,
) -> Result<regex::RegexSet, FieldError> {
    for (i, r) in rules.iter().enumerate() {
        regex::RegexBuilder::new(r)
            .case_insensitive(case_insensitive)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|e| FieldError::new(format!("{field}[{i}]"), regex_reason(r, &e)))?;
    }
    regex::RegexSetBuilder::new(rules)
        .case_insensitive(case_insensitive)
        .size_limit(REGEX_SET_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SET_SIZE_LIMIT)
        .build()
        .map_err(|e| FieldError::new(field, format!("the rules together: {e}")))
}

fn regex_reason(rule: &str, e: &regex::Error) -> String {
    match e {
        regex::Error::CompiledTooBig(limit) => format!(
            "regex {rule:?} compiles to more than {limit} bytes; simplify it (e.g. smaller repetition counts)"
        ),
        // NB: the parser's message spans several lines (the pattern, a caret, the error);
        // a status condition wants one line.
        regex::Error::Syntax(text) => {
            let what = text
                .lines()
                .rev()
                .find_map(|l| l.trim().strip_prefix("error: "))
                .unwrap_or("syntax error");
            format!("not a valid regex: {what}")
        }
        other => format!("not a valid regex: {other}"),
    }
}

/// An `http(s)://` URL (a side service's) split for connecting: whether TLS, `host:port` to dial, the Host
/// header and the request target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `https`.
    pub tls: bool,
    /// Host name or IP (without brackets) for TLS verification and DNS.
    pub host: String,
    /// Port (default 80 / 443).
    pub port: u16,
    /// Host header value (`host[:port]` as written in the URL).
    pub authority: String,
    /// Path and query (`/` when empty).
    pub path_and_query: String,
}

/// Parses `url` (field `field`) as an `http://` or `https://` URL without user info.
pub fn parse_http_url(field: &str, url: &str) -> Result<Target, FieldError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| FieldError::new(field, format!("is not a URL: {e}")))?;
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => {
            return Err(FieldError::new(
                field,
                "must start with http:// or https://",
            ));
        }
    };
    let Some(auth) = uri.authority() else {
        return Err(FieldError::new(field, "has no host"));
    };
    if auth.as_str().contains('@') {
        return Err(FieldError::new(field, "must not carry user info"));
    }
    let host = auth.host().trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(FieldError::new(field, "has no host"));
    }
    Ok(Target {
        tls,
        host: host.to_owned(),
        port: auth.port_u16().unwrap_or(if tls { 443 } else { 80 }),
        authority: auth.as_str().to_owned(),
        path_and_query: uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
    })
}
