//! `real-ip` (priority 23000, rewrite phase): replaces the client address that later
//! plugins (`ip-restriction`, `limit-count` keyed by `remote_addr`, ...) and the upstream
//! (`X-Real-IP`, the last `X-Forwarded-For` entry) see, reading it from `source`.
//!
//! Only when the connection comes from `trusted_addresses` (when set). From
//! `X-Forwarded-For` (its last line, as APISIX), the last address is taken; with
//! `recursive` (and `trusted_addresses`), the rightmost address that is not trusted. Other
//! sources are one address. A value that is not an IP (optionally with a port) changes
//! nothing.

use std::net::{IpAddr, SocketAddr};

use http::request;
use ipnet::IpNet;
use sluice_plugin_config::real_ip::RealIp as Config;
use sluice_plugin_config::vars::Var;
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx, support::vars};

/// The plugin.
#[derive(Debug)]
pub struct RealIp {
    source: Var,
    trusted: Vec<IpNet>,
    recursive: bool,
}

impl Builtin for RealIp {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE;

    /// Builds `real-ip`.
    fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let (source, trusted) = conf.compile().map_err(|e| ConfigError::Field {
            plugin: Config::NAME.into(),
            field: e.field,
            reason: e.reason,
        })?;
        Ok(RealIp {
            source,
            trusted,
            recursive: conf.recursive,
        })
    }
}

/// Parses `1.2.3.4`, `1.2.3.4:80`, `::1`, `[::1]:80`.
fn parse_addr(s: &str) -> Option<(IpAddr, Option<u16>)> {
    let s = s.trim();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some((ip, None));
    }
    s.parse::<SocketAddr>()
        .ok()
        .map(|a| (a.ip(), Some(a.port())))
}

impl RealIp {
    fn trusted(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trusted.iter().any(|n| n.contains(&ip))
    }

    fn pick<'v>(&self, value: &'v str) -> &'v str {
        let list: Vec<&str> = value.split(',').map(str::trim).collect();
        if self.recursive && !self.trusted.is_empty() {
            for a in list.iter().skip(1).rev() {
                match parse_addr(a) {
                    Some((ip, _)) if self.trusted(ip) => continue,
                    _ => return a,
                }
            }
            return list.first().copied().unwrap_or("");
        }
        list.last().copied().unwrap_or("")
    }
}

impl Plugin for RealIp {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        if !self.trusted.is_empty() && !self.trusted(ctx.remote_addr.ip()) {
            return Flow::Continue;
        }
        let value = match &self.source {
            // As APISIX: the last X-Forwarded-For line, read as a list.
            Var::Header(h) if h == "x-forwarded-for" => {
                let Some(last) = req
                    .headers
                    .get_all(h.as_str())
                    .iter()
                    .next_back()
                    .and_then(|v| v.to_str().ok())
                else {
                    return Flow::Continue;
                };
                std::borrow::Cow::Borrowed(self.pick(last))
            }
            other => match vars::get(other, req, ctx) {
                Some(v) => v,
                None => return Flow::Continue,
            },
        };
        if let Some((ip, port)) = parse_addr(&value) {
            ctx.remote_addr =
                SocketAddr::new(ip.to_canonical(), port.unwrap_or(ctx.remote_addr.port()));
        }
        Flow::Continue
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn picks_like_apisix() {
        let p = RealIp {
            source: Var::Header("x-forwarded-for".into()),
            trusted: vec!["10.0.0.0/8".parse().unwrap()],
            recursive: true,
        };
        assert_eq!(p.pick("1.1.1.1, 2.2.2.2, 10.0.0.1"), "2.2.2.2");
        assert_eq!(p.pick("10.0.0.2, 10.0.0.1"), "10.0.0.2");
        let p = RealIp {
            recursive: false,
            ..p
        };
        assert_eq!(p.pick("1.1.1.1, 2.2.2.2, 10.0.0.1"), "10.0.0.1");
        assert_eq!(
            parse_addr("[::1]:80"),
            Some(("::1".parse().unwrap(), Some(80)))
        );
    }
}
