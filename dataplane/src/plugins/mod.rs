//! APISIX's plugins: a small framework (`framework/`: the [`Plugin`] trait with explicit
//! phases and [`Hooks`], the per-request [`PluginCtx`], chains compiled per route when a
//! snapshot compiles, the code that runs their phases), helpers several plugins share
//! (`support/`), and one file per plugin beside them, registered in [`BUILTINS`].
//!
//! ```text
//!            request
//!               │
//!  ┌────────────▼─────────────┐  global rules first (ApisixGlobalRule), then the route's
//!  │ rewrite   (high → low)   │  plugins; in each, higher priority first. Auth plugins
//!  │ access    (high → low)   │  (key-auth 2500 ...) identify the consumer in rewrite;
//!  └────────────┬─────────────┘  the consumer's plugins then merge into the route's.
//!               │ any phase may answer (short-circuit) ─────────────────┐
//!  ┌────────────▼─────────────┐                                         │
//!  │ before_proxy             │  on the upstream request head           │
//!  └────────────┬─────────────┘                                         │
//!   upstream: traffic-split's choice (access, 966), else the route's     │
//!   weighted backends; then an endpoint (or an error: 502/503/504)       │
//!  ┌────────────▼─────────────┐                                         │
//!  │ response_headers         │◀────────────────────────────────────────┘
//!  │ body_filter (streaming)  │  per chunk, never buffering unless a plugin must
//!  │ log                      │  when the body has been sent (or dropped)
//!  └──────────────────────────┘
//! ```
//!
//! A route without plugins (and no global rules) has no chain at all: the request path
//! checks one `Option` and pays nothing else.
//!
//! # Adding a plugin
//!
//! 1. Its typed config: `lib/plugin-config/src/<plugin>.rs` (its `NAME` and `PRIORITY` are
//!    the plugin's, here too) + one line in `sluice_plugin_config::REGISTRY` (translate then
//!    validates it too).
//! 2. Its behaviour: one file `src/plugins/<plugin>.rs` with a type implementing [`Plugin`]
//!    (override only the phases it needs) and [`Builtin`]: `type Config`, `const HOOKS`
//!    naming the methods it overrides (a unit test checks they agree), and `build`, which
//!    parses the config with `sluice_plugin_config::parse_json` — once, when a snapshot
//!    compiles.
//! 3. `mod <plugin>;` and one line in [`BUILTINS`] below.
//!
//! State that must survive snapshot reloads (rate-limit counters, metrics, Redis clients)
//! lives in [`PluginState`], which the [`crate::config::store::Store`] keeps for the process.

pub mod framework;
pub mod support;

pub mod api_breaker;
pub mod basic_auth;
pub mod client_control;
pub mod consumer_restriction;
pub mod cors;
pub mod csrf;
pub mod fault_injection;
pub mod file_logger;
pub mod forward_auth;
pub mod gzip;
pub mod hmac_auth;
pub mod http_logger;
pub mod ip_restriction;
pub mod jwt_auth;
pub mod key_auth;
pub mod limit_conn;
pub mod limit_count;
pub mod limit_req;
pub mod openid_connect;
pub mod opentelemetry;
pub mod prometheus;
pub mod proxy_mirror;
pub mod proxy_rewrite;
pub mod real_ip;
pub mod redirect;
pub mod request_id;
pub mod request_validation;
pub mod response_rewrite;
pub mod stream;
pub mod traffic_split;
pub mod ua_restriction;
pub mod uri_blocker;

pub use framework::{
    BodyFilter, BodyRefusal, BuildCtx, Builtin, Consumer, ConsumerTable, Flow, Hooks, Instance,
    PhaseResult, Plugin, PluginBody, PluginChain, PluginCtx, PluginMetadata, PluginSlot,
    PluginState, ReadBodyError, Registration, UpstreamMap, backend_phases, build, build_sorted,
    builtin, degrade, json_response, read_whole_body, rejection, request_phases, response_phases,
    status,
};

/// Every plugin the dataplane can run; each row takes the plugin's name, priority and hooks
/// from its type ([`Builtin`]). Adding a plugin = one line here.
pub const BUILTINS: &[Registration] = &[
    builtin::<limit_count::LimitCount>(),
    builtin::<prometheus::Prometheus>(),
    builtin::<key_auth::KeyAuth>(),
    builtin::<basic_auth::BasicAuth>(),
    builtin::<jwt_auth::JwtAuth>(),
    builtin::<consumer_restriction::ConsumerRestriction>(),
    builtin::<limit_req::LimitReq>(),
    builtin::<limit_conn::LimitConn>(),
    builtin::<proxy_rewrite::ProxyRewrite>(),
    builtin::<cors::Cors>(),
    builtin::<redirect::Redirect>(),
    builtin::<ip_restriction::IpRestriction>(),
    builtin::<real_ip::RealIp>(),
    builtin::<request_id::RequestId>(),
    builtin::<response_rewrite::ResponseRewrite>(),
    builtin::<fault_injection::FaultInjection>(),
    builtin::<gzip::Gzip>(),
    builtin::<traffic_split::TrafficSplit>(),
    builtin::<ua_restriction::UaRestriction>(),
    builtin::<uri_blocker::UriBlocker>(),
    builtin::<client_control::ClientControl>(),
    builtin::<csrf::Csrf>(),
    builtin::<hmac_auth::HmacAuth>(),
    builtin::<api_breaker::ApiBreaker>(),
    builtin::<forward_auth::ForwardAuth>(),
    builtin::<openid_connect::OpenidConnect>(),
    builtin::<opentelemetry::Opentelemetry>(),
    builtin::<http_logger::HttpLogger>(),
    builtin::<file_logger::FileLogger>(),
    builtin::<proxy_mirror::ProxyMirror>(),
    builtin::<request_validation::RequestValidation>(),
];

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::Instant;

    use sluice_proto::v1;

    use super::framework::plugin::probe;
    use super::*;

    /// A config each built-in builds from without I/O.
    fn sample(name: &str) -> &'static str {
        match name {
            "limit-count" => r#"{"count":1,"time_window":1}"#,
            "limit-req" => r#"{"rate":1,"burst":0,"key":"remote_addr"}"#,
            "limit-conn" => r#"{"conn":1,"burst":0,"default_conn_delay":0.1,"key":"remote_addr"}"#,
            "consumer-restriction" => r#"{"whitelist":["a"]}"#,
            "proxy-rewrite" | "redirect" => r#"{"uri":"/x"}"#,
            "ip-restriction" => r#"{"whitelist":["127.0.0.1"]}"#,
            "real-ip" => r#"{"source":"http_x_forwarded_for"}"#,
            "response-rewrite" => r#"{"body":"x"}"#,
            "fault-injection" => r#"{"abort":{"http_status":403}}"#,
            "ua-restriction" => r#"{"allowlist":["x"]}"#,
            "uri-blocker" => r#"{"block_rules":["x"]}"#,
            "csrf" => r#"{"key":"k"}"#,
            "api-breaker" => r#"{"break_response_code":502}"#,
            "forward-auth" => r#"{"uri":"http://127.0.0.1:1/auth"}"#,
            "openid-connect" => {
                r#"{"client_id":"c","client_secret":"s","bearer_only":true,
                    "discovery":"http://127.0.0.1:1/.well-known/openid-configuration"}"#
            }
            "opentelemetry" => r#"{"sampler":{"name":"always_on"}}"#,
            "http-logger" => r#"{"uri":"http://127.0.0.1:1/log","include_req_body":true}"#,
            "file-logger" => r#"{"path":"/nonexistent/sluice-test.log","include_req_body":true}"#,
            "proxy-mirror" => r#"{"host":"http://127.0.0.1:1"}"#,
            "request-validation" => r#"{"header_schema":{"type":"object"}}"#,
            _ => "{}",
        }
    }

    #[test]
    fn every_known_plugin_is_built_in_with_its_schemas_name_and_priority() {
        for e in sluice_plugin_config::REGISTRY {
            let r = BUILTINS.iter().find(|r| r.name == e.name);
            let r = r.unwrap_or_else(|| {
                panic!(
                    "{} validates in translate but the dataplane cannot build it",
                    e.name
                )
            });
            assert_eq!(r.priority, e.priority, "{}", e.name);
        }
        assert_eq!(BUILTINS.len(), sluice_plugin_config::REGISTRY.len());
    }

    /// `Builtin::HOOKS` names exactly the `Plugin` methods each built-in overrides: every
    /// method is called once, and the defaults that ran are the methods not overridden.
    #[tokio::test]
    async fn every_builtin_declares_exactly_the_methods_it_overrides() {
        let state = PluginState::default();
        let consumers = Arc::new(ConsumerTable::default());
        let upstreams = UpstreamMap::new();
        let cx = BuildCtx {
            owner: "t",
            state: &state,
            consumers: &consumers,
            upstreams: Some(&upstreams),
        };
        let route = v1::Route {
            id: "r".into(),
            ..Default::default()
        };
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let mut wrong = Vec::new();
        for r in BUILTINS {
            let p = match r.build(sample(r.name), &cx) {
                Ok(p) => p,
                Err(e) => {
                    wrong.push(format!("{}: {e}", r.name));
                    continue;
                }
            };
            assert_eq!((p.name, p.priority), (r.name, r.priority));
            assert!(
                r.hooks.has(p.hooks),
                "{}: instance hooks beyond HOOKS",
                r.name
            );
            let chain =
                PluginChain::new(&route, Vec::new(), vec![p.clone()], Arc::clone(&consumers));
            let mut ctx = PluginCtx::new(chain.unwrap(), addr, addr, "http", Instant::now());
            let (mut req, ()) = http::Request::get("http://a.test/p?apikey=k")
                .body(())
                .unwrap()
                .into_parts();
            let (mut resp, ()) = http::Response::new(()).into_parts();
            probe::take();
            drop(p.rewrite(&mut req, &mut ctx));
            drop(p.access(&mut req, &mut ctx));
            p.before_proxy(&mut req, &mut ctx);
            p.response_headers(&mut resp, &mut ctx);
            drop(p.body_filter(&mut ctx));
            p.log(&mut ctx);
            let overridden = Hooks::METHODS.without(probe::take());
            if overridden != r.hooks.and(Hooks::METHODS) {
                wrong.push(format!(
                    "{}: overrides {overridden:?}, declares {:?}",
                    r.name, r.hooks
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn a_plugin_is_built_with_its_priority() {
        let state = PluginState::default();
        let consumers = Arc::new(ConsumerTable::default());
        let cx = BuildCtx {
            owner: "t",
            state: &state,
            consumers: &consumers,
            upstreams: None,
        };
        let p = build(
            &v1::Plugin {
                name: "limit-count".into(),
                config_json: r#"{"count":1,"time_window":1}"#.into(),
            },
            &cx,
        )
        .unwrap();
        assert_eq!(p.priority(), 1002);
    }
}
