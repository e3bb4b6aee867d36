//! Stream plugins: what runs on a layer-4 connection once its route is known and before
//! the upstream is dialled. APISIX's stream subsystem has `ip-restriction` and
//! `limit-conn`; any other plugin on a stream route is refused when the snapshot compiles.
//!
//! - `ip-restriction`: `whitelist` or `blacklist`; a refused client is closed (there is no
//!   response to send). `message` and `response_code` are HTTP-only and ignored.
//! - `limit-conn`: at most `conn` connections per key, `burst` more delayed by
//!   `default_conn_delay` (scaled unless `only_use_default_delay`), the rest closed. Keys:
//!   `remote_addr`, `remote_port`, `server_addr`, `server_port` or a constant. Local policy
//!   only (APISIX's stream limit-conn has no Redis policy). A connection counts until it
//!   closes.
//!
//! Order: ip-restriction (priority 3000) before limit-conn (1003), as in APISIX.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use sluice_plugin_config::common::{LimitKey, Policy};
use sluice_plugin_config::ip_restriction::IpRestriction as IpConfig;
use sluice_plugin_config::limit_conn::LimitConn as ConnConfig;
use sluice_plugin_config::vars::Var;
use sluice_plugin_config::{ConfigError, PluginSchema};
use sluice_proto::v1;

use super::limit_conn::LocalConns;
use super::support::vars::KeyValue;

/// What a stream plugin decided for a new connection.
#[derive(Debug)]
pub enum Verdict {
    /// Go on to the upstream, holding `slot` (if any) until the connection closes.
    Allow(Option<ConnSlot>),
    /// Close the connection.
    Deny(&'static str),
}

/// A limit-conn slot, released when dropped (the connection closed).
#[derive(Debug)]
pub struct ConnSlot(Arc<LocalConns>, KeyValue);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.leave(&self.1);
    }
}

#[derive(Debug)]
enum KeySource {
    RemoteAddr,
    RemotePort,
    ServerAddr,
    ServerPort,
    Constant(String),
}

#[derive(Debug)]
struct LimitConn {
    conf: ConnConfig,
    key: KeySource,
    conns: Arc<LocalConns>,
    /// The config as sent, to keep counters across snapshots that keep it.
    json: String,
}

/// The stream plugins of one route, compiled.
#[derive(Debug, Default)]
pub struct StreamPlugins {
    ip: Option<(Vec<IpNet>, bool)>,
    limit: Option<LimitConn>,
}

fn field(plugin: &str, field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        plugin: plugin.into(),
        field: field.into(),
        reason: reason.into(),
    }
}

impl StreamPlugins {
    /// Compiles `plugins`; `previous` is the same route's plugins in the table served
    /// before, whose limit-conn counters are kept when its config is unchanged.
    pub fn build(
        plugins: &[v1::Plugin],
        previous: Option<&StreamPlugins>,
    ) -> Result<Self, ConfigError> {
        let mut out = StreamPlugins::default();
        for p in plugins {
            match p.name.as_str() {
                IpConfig::NAME => {
                    let conf: IpConfig = sluice_plugin_config::parse_json(&p.config_json)?;
                    let nets = conf
                        .nets()
                        .map_err(|e| field(IpConfig::NAME, &e.field, e.reason))?;
                    out.ip = Some(nets);
                }
                ConnConfig::NAME => {
                    let conf: ConnConfig = sluice_plugin_config::parse_json(&p.config_json)?;
                    if conf.policy != Policy::Local {
                        return Err(field(
                            ConnConfig::NAME,
                            "policy",
                            "only `local` applies to stream routes",
                        ));
                    }
                    let key = match conf
                        .limit_key()
                        .map_err(|e| field(ConnConfig::NAME, &e.field, e.reason))?
                    {
                        LimitKey::Var(Var::RemoteAddr) => KeySource::RemoteAddr,
                        LimitKey::Var(Var::RemotePort) => KeySource::RemotePort,
                        LimitKey::Var(Var::ServerAddr) => KeySource::ServerAddr,
                        LimitKey::Var(Var::ServerPort) => KeySource::ServerPort,
                        LimitKey::Constant(c) => KeySource::Constant(c),
                        _ => {
                            return Err(field(
                                ConnConfig::NAME,
                                "key",
                                "a stream route keys on remote_addr, remote_port, server_addr, \
                                 server_port or a constant",
                            ));
                        }
                    };
                    let conns = previous
                        .and_then(|p| p.limit.as_ref())
                        .filter(|l| l.json == p.config_json)
                        .map(|l| Arc::clone(&l.conns))
                        .unwrap_or_default();
                    out.limit = Some(LimitConn {
                        conf,
                        key,
                        conns,
                        json: p.config_json.clone(),
                    });
                }
                other => {
                    return Err(field(
                        other,
                        "",
                        "not a stream plugin (stream routes take ip-restriction and limit-conn)",
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Whether the route has no plugin.
    pub fn is_empty(&self) -> bool {
        self.ip.is_none() && self.limit.is_none()
    }

    /// Runs the plugins for a connection from `client` accepted on `local`. A delay asked
    /// by limit-conn's `burst` is waited here.
    pub async fn on_connect(&self, client: SocketAddr, local: SocketAddr) -> Verdict {
        if let Some((nets, whitelist)) = &self.ip {
            let ip = client.ip().to_canonical();
            if nets.iter().any(|n| n.contains(&ip)) != *whitelist {
                return Verdict::Deny("ip-restriction");
            }
        }
        let Some(limit) = &self.limit else {
            return Verdict::Allow(None);
        };
        let key = match &limit.key {
            KeySource::RemoteAddr => KeyValue::Ip(client.ip().to_canonical()),
            KeySource::RemotePort => KeyValue::Text(client.port().to_string().into()),
            KeySource::ServerAddr => KeyValue::Ip(local.ip().to_canonical()),
            KeySource::ServerPort => KeyValue::Text(local.port().to_string().into()),
            KeySource::Constant(c) => KeyValue::Text(c.as_str().into()),
        };
        let max = limit.conf.conn.saturating_add(limit.conf.burst);
        let Some(n) = limit.conns.enter(&key, max) else {
            return Verdict::Deny("limit-conn");
        };
        let slot = ConnSlot(Arc::clone(&limit.conns), key);
        if n > limit.conf.conn {
            let unit = limit.conf.default_conn_delay;
            let secs = if limit.conf.only_use_default_delay {
                unit
            } else {
                unit * ((n - 1) / limit.conf.conn) as f64
            };
            tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        }
        Verdict::Allow(Some(slot))
    }
}
