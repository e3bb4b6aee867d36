//! `validate`: what the controller would reject, and what it would accept but is probably
//! wrong.
//!
//! Rejections come from the shared loader (documents that are not valid objects), from
//! translation (`Accepted=False`, with the field path from the condition message), from the
//! translation settings, and from the dataplane's snapshot compiler (a snapshot every
//! dataplane would NACK). Warnings are heuristics over the same data:
//!
//! - a route every host and path of which is also listed by an unconditional route that
//!   wins ties (higher priority, or equal priority and a smaller id): it can never match;
//! - a backend Service present in the files without any EndpointSlice (requests get 503);
//! - a plugin with `enable: false` (left out of the snapshot);
//! - an Ingress the controller ignores (no class and no default IngressClass, or another
//!   class);
//! - `ResolvedRefs=False` on an accepted object.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;

use http::{HeaderMap, Method};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use sluice_dataplane::router::RequestInfo;
use sluice_translate::{ConditionStatus, SERVICE_NAME_LABEL};

use crate::offline::Offline;
use crate::table::{WIDTH, wrap};

/// One rejected object or one warning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// Kind of the object (`ApisixRoute`, `Ingress`, ...; `Snapshot` or `Setting` for
    /// problems not tied to one object).
    pub kind: String,
    /// Namespace (empty when not tied to an object).
    pub namespace: String,
    /// Name (empty when not tied to an object).
    pub name: String,
    /// Path of the offending field, when known (`spec.http[0].match.paths[1]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// CamelCase reason of the condition, when it came from one (`InvalidSpec`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition_reason: Option<String>,
    /// What is wrong.
    pub message: String,
    /// File and document, when the loader found it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// The result of `validate`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Objects with a status (translated), plus Ingresses of the controller's class.
    pub objects: usize,
    /// Routes in the snapshot.
    pub routes: usize,
    /// Upstreams in the snapshot.
    pub upstreams: usize,
    /// Server certificates in the snapshot.
    pub certificates: usize,
    /// Rejected objects, one entry per problem.
    pub rejected: Vec<Finding>,
    /// Accepted but probably wrong.
    pub warnings: Vec<Finding>,
}

impl Report {
    /// Exit code: 0 when nothing is rejected, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        if self.rejected.is_empty() { 0 } else { 1 }
    }

    /// Text for a terminal.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let mut section = |label: &str, list: &[Finding]| {
            let mut last: Option<(&str, &str, &str)> = None;
            for f in list {
                let who = if f.name.is_empty() {
                    f.kind.clone()
                } else {
                    format!("{} {}/{}", f.kind, f.namespace, f.name)
                };
                // Findings of one object come together: name it once.
                let this = (f.kind.as_str(), f.namespace.as_str(), f.name.as_str());
                if last != Some(this) || f.source.is_some() {
                    let _ = writeln!(out, "{label} {who}");
                }
                last = Some(this);
                if let Some(src) = &f.source {
                    let _ = writeln!(out, "  at {src}");
                }
                let reason = f
                    .condition_reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default();
                let text = match &f.field {
                    Some(field) => format!("{field}: {}{reason}", f.message),
                    None => format!("{}{reason}", f.message),
                };
                // NB: 80 columns: the first line indented by two, the rest by four.
                for (i, line) in wrap(&text, WIDTH, "    ").iter().enumerate() {
                    let line = if i == 0 { &line[2..] } else { line.as_str() };
                    let _ = writeln!(out, "{line}");
                }
            }
        };
        section("REJECTED", &self.rejected);
        section("WARNING ", &self.warnings);
        let _ = writeln!(
            out,
            "{} objects, {} routes, {} upstreams, {} certificates: {} rejected, {} warnings",
            self.objects,
            self.routes,
            self.upstreams,
            self.certificates,
            self.rejected.len(),
            self.warnings.len()
        );
        out
    }
}

/// Splits a condition message (`a.b[0]: why; c.d: why (and 2 more)`) into (field, reason)
/// pairs. Pieces that do not start with a field path keep `None`.
fn split_message(message: &str) -> Vec<(Option<String>, String)> {
    message
        .split("; ")
        .map(|piece| match piece.split_once(": ") {
            Some((field, rest))
                if !field.is_empty()
                    && !field.contains(' ')
                    && (field.starts_with("spec") || field.starts_with("metadata")) =>
            {
                (Some(field.to_owned()), rest.to_owned())
            }
            _ => (None, piece.to_owned()),
        })
        .collect()
}

/// Validates what `offline` holds.
pub fn validate(offline: &Offline, ingress_class: &str) -> Report {
    let t = &offline.translation;
    let mut report = Report {
        objects: t.status.objects.len() + t.ingresses.len(),
        routes: t.snapshot.routes.len(),
        upstreams: t.snapshot.upstreams.len(),
        certificates: t.snapshot.tls_certificates.len(),
        ..Report::default()
    };
    for e in &offline.loaded.errors {
        report.rejected.push(Finding {
            kind: e.kind.clone().unwrap_or_else(|| "Document".into()),
            namespace: e.namespace.clone().unwrap_or_default(),
            name: e.name.clone().unwrap_or_default(),
            field: e.field.clone(),
            condition_reason: None,
            message: e.reason.clone(),
            source: Some(match e.item {
                Some(item) => format!("{}: document {} item {item}", e.file, e.document),
                None => format!("{}: document {}", e.file, e.document),
            }),
        });
    }
    let objects = t.status.objects.iter().map(|o| {
        (
            o.kind.as_str().to_owned(),
            &o.namespace,
            &o.name,
            o.is_accepted(),
            &o.conditions,
        )
    });
    let ingresses = t.ingresses.iter().map(|o| {
        let accepted = o
            .condition("Accepted")
            .is_some_and(|c| c.status == ConditionStatus::True);
        (
            "Ingress".to_owned(),
            &o.namespace,
            &o.name,
            accepted,
            &o.conditions,
        )
    });
    for (kind, ns, name, accepted, conditions) in objects.chain(ingresses) {
        for c in conditions
            .iter()
            .filter(|c| c.status == ConditionStatus::False)
        {
            for (field, message) in split_message(&c.message) {
                let f = Finding {
                    kind: kind.clone(),
                    namespace: ns.clone(),
                    name: name.clone(),
                    field,
                    condition_reason: Some(format!("{}={}", c.type_, c.reason)),
                    message,
                    source: None,
                };
                if accepted {
                    report.warnings.push(f);
                } else {
                    report.rejected.push(f);
                }
            }
        }
    }
    for s in &t.settings {
        report.rejected.push(Finding {
            kind: "Setting".into(),
            namespace: String::new(),
            name: String::new(),
            field: None,
            condition_reason: None,
            message: s.clone(),
            source: None,
        });
    }
    if let Err(e) = &offline.table {
        report.rejected.push(Finding {
            kind: "Snapshot".into(),
            namespace: String::new(),
            name: String::new(),
            field: None,
            condition_reason: None,
            message: format!("every dataplane would reject (NACK) the snapshot: {e}"),
            source: None,
        });
    }
    shadowed_routes(offline, &mut report.warnings);
    services_without_slices(offline, &mut report.warnings);
    disabled_plugins(offline, &mut report.warnings);
    unclassed_objects(offline, ingress_class, &mut report.warnings);
    report
}

/// `Kind ns/name` of a route's `source`.
fn parse_source(source: &str) -> (String, String, String) {
    let (kind, rest) = source.split_once(' ').unwrap_or(("Route", source));
    let (ns, name) = rest.split_once('/').unwrap_or(("", rest));
    (kind.to_owned(), ns.to_owned(), name.to_owned())
}

/// A label no real host or path has: probes reach a route's host or prefix without
/// landing on another route's exact host or path.
const PROBE: &str = "sluice-shadow-probe";

/// Routes that can never match: every request they accept is taken first by a route with
/// no conditions of its own. Decided by the dataplane's router (no second matcher): for
/// each host, path and method of the route, the least specific request it accepts (a
/// wildcard or any-host route gets a host no other route names, a prefix gets a path
/// below it no other route names, a route for every method gets a method no route lists)
/// is walked through [`Router::explain`](sluice_dataplane::router::Router::explain). The
/// route is shadowed when each of those requests is won by a route without methods
/// restricting it further, client addresses or exprs. Routes with client-address or expr
/// conditions of their own are not judged (which requests they accept depends on values
/// not in the files).
fn shadowed_routes(offline: &Offline, out: &mut Vec<Finding>) {
    let Ok(table) = &offline.table else { return };
    let routes = &offline.translation.snapshot.routes;
    let probe_method = Method::from_bytes(b"SLUICE-PROBE").unwrap_or(Method::OPTIONS);
    let headers = HeaderMap::new();
    for (i, r) in routes.iter().enumerate() {
        if !r.remote_addrs.is_empty() || !r.exprs.is_empty() || r.paths.is_empty() {
            continue;
        }
        let hosts: Vec<String> = if r.hosts.is_empty() {
            vec![format!("{PROBE}.invalid")]
        } else {
            r.hosts
                .iter()
                .map(|h| match h.strip_prefix('*') {
                    Some(rest) => format!("{PROBE}{rest}"),
                    None => h.to_ascii_lowercase(),
                })
                .collect()
        };
        let paths: Vec<String> = r
            .paths
            .iter()
            .map(|p| match p.strip_suffix('*') {
                Some(prefix) => format!("{prefix}{PROBE}"),
                None => p.clone(),
            })
            .collect();
        let methods: Vec<Method> = if r.methods.is_empty() {
            vec![probe_method.clone()]
        } else {
            r.methods
                .iter()
                .filter_map(|m| Method::from_bytes(m.as_bytes()).ok())
                .collect()
        };
        let mut by = BTreeSet::new();
        let mut shadowed = !methods.is_empty();
        'probes: for host in &hosts {
            for path in &paths {
                for method in &methods {
                    let info = RequestInfo {
                        method,
                        host: Some(host),
                        path,
                        query: None,
                        headers: &headers,
                        remote_addr: SocketAddr::from(([192, 0, 2, 1], 50000)),
                        local_addr: SocketAddr::from(([0, 0, 0, 0], 80)),
                        scheme: "http",
                    };
                    let winner = table
                        .router
                        .explain(&info)
                        .last()
                        .filter(|c| c.mismatch.is_none())
                        .map(|c| c.route);
                    match winner.and_then(|w| routes.get(w).map(|wr| (w, wr))) {
                        Some((w, wr))
                            if w != i && wr.remote_addrs.is_empty() && wr.exprs.is_empty() =>
                        {
                            by.insert(wr.id.as_str());
                        }
                        _ => {
                            shadowed = false;
                            break 'probes;
                        }
                    }
                }
            }
        }
        if shadowed && !by.is_empty() {
            let (kind, namespace, name) = parse_source(&r.source);
            let by: Vec<&str> = by.into_iter().collect();
            out.push(Finding {
                kind,
                namespace,
                name,
                field: None,
                condition_reason: None,
                message: format!(
                    "route {} never matches: every host, path and method it accepts is \
                     taken first by {}, which has no other conditions and comes first \
                     in the router's order (`kubectl sluice explain` shows why)",
                    r.id,
                    by.join(", ")
                ),
                source: None,
            });
        }
    }
}

fn services_without_slices(offline: &Offline, out: &mut Vec<Finding>) {
    let state = &offline.loaded.state;
    let snapshot = &offline.translation.snapshot;
    let ns_of = |m: &ObjectMeta| {
        m.namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into())
    };
    let mut sliced: BTreeSet<(String, String)> = BTreeSet::new();
    for s in &state.endpoint_slices {
        if let Some(svc) = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
        {
            sliced.insert((ns_of(&s.metadata), svc.clone()));
        }
    }
    let mut services: BTreeMap<(String, String), bool> = BTreeMap::new();
    for s in &state.services {
        let external = s
            .spec
            .as_ref()
            .and_then(|sp| sp.type_.as_deref())
            .is_some_and(|t| t == "ExternalName");
        services.insert(
            (
                ns_of(&s.metadata),
                s.metadata.name.clone().unwrap_or_default(),
            ),
            external,
        );
    }
    // Upstream id → routes using it.
    let mut users: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in &snapshot.routes {
        for b in &r.backends {
            users.entry(b.upstream_id.as_str()).or_default().push(&r.id);
        }
    }
    let mut seen = BTreeSet::new();
    for up in snapshot.upstreams.iter().filter(|u| u.endpoints.is_empty()) {
        // `<ns>/<service>:<port>[@service][#subset]`
        let Some((ns, rest)) = up.id.split_once('/') else {
            continue;
        };
        let Some((svc, _)) = rest.split_once(':') else {
            continue;
        };
        let key = (ns.to_owned(), svc.to_owned());
        if services.get(&key) != Some(&false) || sliced.contains(&key) || !seen.insert(key) {
            continue;
        }
        let routes = users.get(up.id.as_str()).cloned().unwrap_or_default();
        out.push(Finding {
            kind: "Service".into(),
            namespace: ns.to_owned(),
            name: svc.to_owned(),
            field: None,
            condition_reason: None,
            message: format!(
                "no EndpointSlice labelled {SERVICE_NAME_LABEL}={svc} in the files: upstream {} \
                 has no endpoints, requests to {} get 503 unless the cluster has them",
                up.id,
                if routes.is_empty() {
                    "it".to_owned()
                } else {
                    routes.join(", ")
                }
            ),
            source: None,
        });
    }
}

fn disabled_plugins(offline: &Offline, out: &mut Vec<Finding>) {
    let state = &offline.loaded.state;
    let mut push = |kind: &str, meta: &ObjectMeta, field: String, plugin: &str| {
        out.push(Finding {
            kind: kind.into(),
            namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
            name: meta.name.clone().unwrap_or_default(),
            field: Some(field),
            condition_reason: None,
            message: format!("plugin {plugin} has enable: false and is left out"),
            source: None,
        });
    };
    for r in &state.apisix_routes {
        for (i, rule) in r.spec.http.iter().enumerate() {
            for (j, p) in rule.plugins.iter().enumerate() {
                if !p.enable {
                    let field = format!("spec.http[{i}].plugins[{j}].enable");
                    push("ApisixRoute", &r.metadata, field, &p.name);
                }
            }
        }
    }
    for pc in &state.apisix_plugin_configs {
        for (j, p) in pc.spec.plugins.iter().enumerate() {
            if !p.enable {
                let field = format!("spec.plugins[{j}].enable");
                push("ApisixPluginConfig", &pc.metadata, field, &p.name);
            }
        }
    }
    for gr in &state.apisix_global_rules {
        for (j, p) in gr.spec.plugins.iter().enumerate() {
            if !p.enable {
                let field = format!("spec.plugins[{j}].enable");
                push("ApisixGlobalRule", &gr.metadata, field, &p.name);
            }
        }
    }
}

fn unclassed_objects(offline: &Offline, class: &str, out: &mut Vec<Finding>) {
    let state = &offline.loaded.state;
    let t = &offline.translation;
    let ns_name = |m: &ObjectMeta| {
        (
            m.namespace
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "default".into()),
            m.name.clone().unwrap_or_default(),
        )
    };
    let ours: BTreeSet<(&str, &str)> = t
        .ingresses
        .iter()
        .map(|i| (i.namespace.as_str(), i.name.as_str()))
        .collect();
    for ing in &state.ingresses {
        let (namespace, name) = ns_name(&ing.metadata);
        if ours.contains(&(namespace.as_str(), name.as_str())) {
            continue;
        }
        let named = ing
            .spec
            .as_ref()
            .and_then(|s| s.ingress_class_name.clone())
            .or_else(|| {
                ing.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("kubernetes.io/ingress.class").cloned())
            });
        let message = match named {
            Some(other) => format!(
                "ingress class {other:?} is not {class:?}: the controller ignores this Ingress"
            ),
            None => format!(
                "no ingressClassName: the controller ignores this Ingress unless IngressClass \
                 {class:?} is the cluster default (none is in the files)"
            ),
        };
        out.push(Finding {
            kind: "Ingress".into(),
            namespace,
            name,
            field: Some("spec.ingressClassName".into()),
            condition_reason: None,
            message,
            source: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_message_keeps_fields_and_plain_text() {
        assert_eq!(
            split_message("spec.http[0].match.paths[0]: bad; spec.x: worse (and 1 more)"),
            vec![
                (Some("spec.http[0].match.paths[0]".into()), "bad".into()),
                (Some("spec.x".into()), "worse (and 1 more)".into()),
            ]
        );
        assert_eq!(
            split_message("Service default/x not found"),
            vec![(None, "Service default/x not found".into())]
        );
    }
}
