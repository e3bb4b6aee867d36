//! `traffic-split` on a route: every weighted upstream is resolved here into a snapshot
//! upstream, and the plugin's config is rewritten so that each entry carries
//! `upstream_id` = a snapshot upstream id (or nothing: the route's own upstream). The
//! dataplane then only looks ids up in the snapshot.
//!
//! What `upstream_id` names, in the route's namespace (cross-namespace references are
//! refused, as for `backends[]`):
//!
//! - `<service>:<port>` — a Service port (number or name), resolved like a `backends[]`
//!   entry (`resolveGranularity: endpoint`; the ApisixUpstream named after the Service
//!   applies its settings). Upstream id `<ns>/<service>:<port>`, shared with backends.
//! - `<name>` — the ApisixUpstream `<name>` with `externalNodes` (as `upstreams[].name`),
//!   upstream id `<ns>/<name>`; else, when Service `<name>` has exactly one port, that
//!   Service port.
//!
//! An inline `upstream` becomes the upstream `<route id>/traffic-split/<rule>/<entry>`.
//!
//! Anything that does not resolve (no such Service, port or ApisixUpstream, an invalid
//! ApisixUpstream) rejects the rule with an error naming
//! `plugins[i].config.rules[j].weighted_upstreams[k].upstream_id`: a canary share is never
//! silently sent elsewhere.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Map, Value, json};
use sluice_crds::{ApisixUpstreamConfig, ResolveGranularity};
use sluice_plugin_config::PluginSchema;
use sluice_plugin_config::traffic_split::{InlineUpstream, TrafficSplit};
use sluice_proto::v1;

use crate::Index;
use crate::json as canon;
use crate::problems::Problems;
use crate::upstream::{self, BackendRef, UpstreamObject};

/// Where the route's `traffic-split` was written, for messages.
pub(crate) enum Origin {
    /// In the rule's own `plugins`: the field prefix `spec.http[i].plugins[j].config`.
    Rule(String),
    /// In a referenced ApisixPluginConfig: the rule's `plugin_config_name` field and
    /// `ApisixPluginConfig <ns>/<name> spec.plugins[j].config`.
    PluginConfig {
        /// `spec.http[i].plugin_config_name`.
        field: String,
        /// `ApisixPluginConfig <ns>/<name> spec.plugins[j].config`.
        what: String,
    },
}

impl Origin {
    fn error(&self, problems: &mut Problems, sub: &str, reason: impl AsRef<str>) {
        match self {
            Origin::Rule(prefix) if sub.is_empty() => problems.error(prefix, reason),
            Origin::Rule(prefix) => problems.error(format!("{prefix}.{sub}"), reason),
            Origin::PluginConfig { field, what } if sub.is_empty() => {
                problems.error(field, format!("{what}: {}", reason.as_ref()))
            }
            Origin::PluginConfig { field, what } => {
                problems.error(field, format!("{what}.{sub}: {}", reason.as_ref()))
            }
        }
    }

    /// A field path for messages from the shared upstream resolution.
    fn path(&self, sub: &str) -> String {
        match self {
            Origin::Rule(prefix) => format!("{prefix}.{sub}"),
            Origin::PluginConfig { field, .. } => field.clone(),
        }
    }
}

/// What the rule needs to resolve references.
pub(crate) struct Scope<'c, 'a> {
    /// The route's namespace.
    pub(crate) ns: &'c str,
    /// The route id (`<ns>/<name>/<rule>`), prefix of inline upstream ids.
    pub(crate) route_id: &'c str,
    pub(crate) idx: &'c Index<'a>,
    pub(crate) aus: &'c BTreeMap<(&'a str, &'a str), Result<UpstreamObject, ()>>,
}

/// Resolves the `traffic-split` plugin in `plugins` (if any), rewriting its config; returns
/// the upstreams it references. Errors go to `problems`.
pub(crate) fn resolve(
    plugins: &mut [v1::Plugin],
    origin: &Origin,
    scope: &Scope<'_, '_>,
    problems: &mut Problems,
) -> Vec<v1::Upstream> {
    let Some(p) = plugins.iter_mut().find(|p| p.name == TrafficSplit::NAME) else {
        return Vec::new();
    };
    // NB: already validated by plugin_list; a failure here cannot happen, but is named.
    let conf: TrafficSplit = match sluice_plugin_config::parse_json(&p.config_json) {
        Ok(c) => c,
        Err(e) => {
            origin.error(problems, "", e.to_string());
            return Vec::new();
        }
    };
    let before = problems.errors.len();
    let mut upstreams = Vec::new();
    let mut rules = Vec::with_capacity(conf.rules.len());
    for (j, rule) in conf.rules.iter().enumerate() {
        let mut entries = Vec::new();
        for (k, wu) in rule.weighted_upstreams().iter().enumerate() {
            let sub = format!("rules[{j}].weighted_upstreams[{k}]");
            let mut entry = Map::new();
            entry.insert("weight".into(), json!(wu.weight()));
            let up = if let Some(id) = wu.upstream_id() {
                by_id(&id, &format!("{sub}.upstream_id"), origin, scope, problems)
            } else if let Some(inline) = &wu.upstream {
                let id = format!("{}/traffic-split/{j}/{k}", scope.route_id);
                inline_upstream(
                    id,
                    inline,
                    &format!("{sub}.upstream"),
                    origin,
                    scope,
                    problems,
                )
            } else {
                None
            };
            if let Some(up) = up {
                entry.insert("upstream_id".into(), Value::String(up.id.clone()));
                upstreams.push(up);
            }
            entries.push(Value::Object(entry));
        }
        let mut r = Map::new();
        if let Some(m) = &rule.match_ {
            let list: Vec<Value> = m
                .iter()
                .map(|m| match &m.vars {
                    Some(v) => json!({ "vars": v }),
                    None => json!({}),
                })
                .collect();
            r.insert("match".into(), Value::Array(list));
        }
        r.insert("weighted_upstreams".into(), Value::Array(entries));
        rules.push(Value::Object(r));
    }
    if problems.errors.len() > before {
        return Vec::new();
    }
    p.config_json = canon::canonical(&json!({ "rules": rules }));
    upstreams
}

fn by_id(
    id: &str,
    sub: &str,
    origin: &Origin,
    scope: &Scope<'_, '_>,
    problems: &mut Problems,
) -> Option<v1::Upstream> {
    let ns = scope.ns;
    if id.contains('/') {
        origin.error(
            problems,
            sub,
            format!(
                "{id:?}: cross-namespace references are not supported; name a Service port \
                 (`<service>:<port>`) or an ApisixUpstream in namespace {ns}"
            ),
        );
        return None;
    }
    if let Some((svc, port)) = id.rsplit_once(':') {
        let port = match port.parse::<i32>() {
            Ok(n) => IntOrString::Int(n),
            Err(_) => IntOrString::String(port.to_owned()),
        };
        return service(svc, &port, sub, origin, scope, problems);
    }
    match scope.aus.get(&(ns, id)) {
        Some(Err(())) => {
            origin.error(
                problems,
                sub,
                format!("ApisixUpstream {ns}/{id} is invalid (see its status)"),
            );
            return None;
        }
        Some(Ok(au)) => {
            if let Some(up) = au.external_upstream(ns, id) {
                return Some(up);
            }
        }
        None => {}
    }
    let Some(svc) = scope.idx.services.get(&(ns, id)) else {
        origin.error(
            problems,
            sub,
            format!(
                "{id:?} names no ApisixUpstream with externalNodes and no Service in namespace \
                 {ns} (upstream_id is `<service>:<port>` or an ApisixUpstream name)"
            ),
        );
        return None;
    };
    let ports: Vec<i32> = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|p| p.iter().map(|p| p.port).collect())
        .unwrap_or_default();
    match ports.as_slice() {
        [port] => service(id, &IntOrString::Int(*port), sub, origin, scope, problems),
        _ => {
            origin.error(
                problems,
                sub,
                format!(
                    "Service {ns}/{id} has {} ports; name one as `{id}:<port>`",
                    ports.len()
                ),
            );
            None
        }
    }
}

fn service(
    name: &str,
    port: &IntOrString,
    sub: &str,
    origin: &Origin,
    scope: &Scope<'_, '_>,
    problems: &mut Problems,
) -> Option<v1::Upstream> {
    let ns = scope.ns;
    let Some(svc) = scope.idx.services.get(&(ns, name)) else {
        origin.error(problems, sub, format!("Service {ns}/{name} not found"));
        return None;
    };
    let external = svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName");
    if !external && upstream::find_port(svc, port).is_none() {
        let what = match port {
            IntOrString::Int(n) => format!("port {n}"),
            IntOrString::String(s) => format!("port named {s:?}"),
        };
        origin.error(problems, sub, format!("Service {ns}/{name} has no {what}"));
        return None;
    }
    let field = origin.path(sub);
    let r = BackendRef {
        namespace: ns,
        service: name,
        port,
        granularity: ResolveGranularity::Endpoint,
        subset: None,
        field: &field,
        field_names: ("upstream_id", "upstream_id"),
    };
    upstream::service_upstream(&r, scope.idx, scope.aus, problems)
}

/// The settings of an inline upstream as an ApisixUpstream `spec` would write them.
fn apisix_upstream_shape(inline: &InlineUpstream) -> Map<String, Value> {
    let mut lb = Map::new();
    if let Some(t) = &inline.type_ {
        lb.insert("type".into(), json!(t));
    }
    if let Some(h) = &inline.hash_on {
        lb.insert("hashOn".into(), json!(h));
    }
    if let Some(k) = &inline.key {
        lb.insert("key".into(), json!(k));
    }
    let mut c = Map::new();
    if !lb.is_empty() {
        c.insert("loadbalancer".into(), Value::Object(lb));
    }
    if let Some(s) = &inline.scheme {
        c.insert("scheme".into(), json!(s));
    }
    if let Some(r) = inline.retries {
        c.insert("retries".into(), json!(r));
    }
    if let Some(t) = &inline.timeout {
        let mut tm = Map::new();
        for (name, v) in [("connect", t.connect), ("send", t.send), ("read", t.read)] {
            if let Some(secs) = v {
                let ms = (secs * 1000.0).ceil().max(1.0);
                tm.insert(name.into(), json!(format!("{ms}ms")));
            }
        }
        c.insert("timeout".into(), Value::Object(tm));
    }
    if let Some(p) = &inline.pass_host {
        c.insert("passHost".into(), json!(p));
    }
    if let Some(h) = &inline.upstream_host {
        c.insert("upstreamHost".into(), json!(h));
    }
    c
}

fn inline_upstream(
    id: String,
    inline: &InlineUpstream,
    sub: &str,
    origin: &Origin,
    scope: &Scope<'_, '_>,
    problems: &mut Problems,
) -> Option<v1::Upstream> {
    let before = problems.errors.len();
    let nodes = match inline.nodes() {
        Ok(n) => n,
        Err(e) => {
            origin.error(problems, &format!("{sub}.{}", e.field), e.reason);
            return None;
        }
    };
    let mut endpoints = Vec::with_capacity(nodes.len());
    for n in nodes {
        if let Err(e) = crate::validate::node_host(&n.host) {
            origin.error(problems, &format!("{sub}.nodes"), e);
            continue;
        }
        endpoints.push(v1::Endpoint {
            host: n.host,
            port: u32::from(n.port),
            weight: n.weight,
        });
    }
    // The inline fields in the ApisixUpstream shape, so they are checked and applied exactly
    // as an ApisixUpstream's are.
    let c = apisix_upstream_shape(inline);
    let config: ApisixUpstreamConfig = match serde_json::from_value(Value::Object(c)) {
        Ok(c) => c,
        Err(e) => {
            origin.error(problems, sub, e.to_string());
            return None;
        }
    };
    let up = upstream::inline_upstream(
        id,
        &config,
        endpoints,
        &format!("{}.", origin.path(sub)),
        crate::refs::Referrer {
            kind: "ApisixRoute",
            ns: scope.ns,
        },
        scope.idx,
        problems,
    );
    (problems.errors.len() == before).then_some(up)
}
