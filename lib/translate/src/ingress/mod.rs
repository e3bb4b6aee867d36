//! `networking.k8s.io/v1` Ingress → snapshot routes.
//!
//! - Route ids: `<ns>/<name>/ingress-r<i>-p<j>` for `spec.rules[i].http.paths[j]`, and
//!   `<ns>/<name>/ingress-default` for `spec.defaultBackend`. Source `Ingress <ns>/<name>`.
//! - Paths by `pathType`: `Exact` → the path; `Prefix` → element-wise prefix (`/foo` and
//!   `/foo/` → `["/foo", "/foo/*"]`, `/` → `["/*"]`); `ImplementationSpecific` → the APISIX
//!   prefix `"/foo*"`. A `*` in an `Exact` or `Prefix` path is rejected (the router would read
//!   it as a prefix).
//! - The default backend is a host-less `/*` route with priority `i32::MIN`. `Exact` routes
//!   get priority 1 (others 0): the router already ranks exact paths above prefixes, and the
//!   priority settles the tie between `Exact /foo` and the `/foo` of `Prefix /foo`.
//! - Backends resolve exactly like ApisixRoute backends (same upstream ids), weight 100.
//! - Annotations `k8s.apisix.apache.org/enable-websocket` and `upstream-{connect,send,read}-timeout`
//!   are applied to every route of the Ingress, and so is the `redirect` plugin made from
//!   `http-to-https: "true"` (`{"http_to_https":true}`: APISIX answers 301 for GET/HEAD and
//!   308 otherwise) or `http-redirect` + `http-redirect-code` (see [`redirect_plugin`]), and
//!   the `forward-auth` plugin made from `auth-uri` with `auth-ssl-verify`,
//!   `auth-request-headers`, `auth-upstream-headers` and `auth-client-headers` (see
//!   [`forward_auth_plugin`]). Access-control annotations that are not
//!   implemented yet reject the Ingress (fail closed, like ApisixRoute `authentication`);
//!   other unknown ones are listed in the `Accepted` message.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{Ingress, IngressBackend, IngressClass, IngressRule};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sluice_proto::v1;

use crate::builder::{Builder, RouteOutput};
use crate::problems::Problems;
use crate::status::IngressStatus;
use crate::tls::Unresolved;
use crate::upstream::{self, BackendRef, UpstreamObject};
use crate::{Index, Options, validate};

pub mod nginx;

/// The class an Ingress names (`spec.ingressClassName`, else the legacy annotation).
pub(crate) fn class_of(ing: &Ingress) -> Option<&str> {
    ing.spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
        .filter(|c| !c.is_empty())
        .or_else(|| {
            ing.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION))
                .map(String::as_str)
                .filter(|c| !c.is_empty())
        })
}

/// Prefix of the APISIX Ingress annotations.
const ANNOTATION_PREFIX: &str = "k8s.apisix.apache.org/";
/// Legacy class annotation, still honoured.
const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
/// IngressClass annotation that makes it the cluster default.
const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";
/// Priority of an `Exact` path route (other paths: 0; the default backend: `i32::MIN`).
const EXACT_PRIORITY: i32 = 1;
/// Weight of an Ingress backend (there is one per path).
const BACKEND_WEIGHT: u32 = 100;

/// Annotations that restrict access: serving the Ingress without them would expose more than
/// the user wrote, so the Ingress is rejected until they are implemented.
const FAIL_CLOSED_ANNOTATIONS: &[&str] = &[
    "allowlist-source-range",
    "blocklist-source-range",
    "auth-type",
    "http-allow-methods",
    "http-block-methods",
    "plugin-config-name",
];

/// Whether the Ingress belongs to this controller. `None` (standalone): every Ingress.
/// Otherwise `spec.ingressClassName` or the legacy annotation must name the class, or neither
/// is set and the IngressClass of that name is the cluster default.
pub(crate) fn selected(ing: &Ingress, classes: &[IngressClass], opts: &Options) -> bool {
    let Some(want) = opts.ingress_class.as_deref() else {
        return true;
    };
    let spec_class = ing
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
        .filter(|c| !c.is_empty());
    let legacy = ing
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION))
        .map(String::as_str)
        .filter(|c| !c.is_empty());
    if spec_class == Some(want) || legacy == Some(want) {
        return true;
    }
    if spec_class
        .or(legacy)
        .is_some_and(|c| opts.nginx_classes.iter().any(|n| n == c))
    {
        return true;
    }
    if spec_class.is_some() || legacy.is_some() {
        return false;
    }
    classes.iter().any(|c| {
        c.metadata.name.as_deref() == Some(want)
            && c.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                .is_some_and(|v| v == "true")
    })
}

/// Route-wide settings taken from annotations.
#[derive(Default)]
struct Settings {
    websocket: bool,
    timeout: Option<v1::Timeouts>,
    /// Plugins from annotations (`forward-auth`, `redirect`), sorted by name.
    plugins: Vec<v1::Plugin>,
    /// ingress-nginx's annotations, on an Ingress of a class served in its place.
    nginx: Option<nginx::Nginx>,
}

/// `redirect` plugin from `http-to-https`, else `http-redirect` with `http-redirect-code`,
/// as the APISIX ingress controller translates them: `{"http_to_https": true}`, or
/// `{"uri": <uri>, "ret_code": <code>}` where a code outside 301..=308 (or unparsable)
/// becomes 301.
fn redirect_plugin(ing: &Ingress, problems: &mut Problems) -> Option<v1::Plugin> {
    let get = |name: &str| {
        ing.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(&format!("{ANNOTATION_PREFIX}{name}")))
    };
    let config = match get("http-to-https").map(String::as_str) {
        Some("true") => serde_json::json!({"http_to_https": true}),
        Some("false") | None => {
            let uri = get("http-redirect").filter(|u| !u.is_empty())?;
            let code = get("http-redirect-code")
                .and_then(|c| c.parse::<u16>().ok())
                .filter(|c| (301..=308).contains(c))
                .unwrap_or(301);
            serde_json::json!({"uri": uri, "ret_code": code})
        }
        Some(other) => {
            problems.error(
                annotation_field(&format!("{ANNOTATION_PREFIX}http-to-https")),
                format!("{other:?} must be \"true\" or \"false\""),
            );
            return None;
        }
    };
    Some(v1::Plugin {
        name: "redirect".into(),
        config_json: crate::json::canonical(&config),
    })
}

/// `forward-auth` plugin from `auth-uri` (required, else the other `auth-*` annotations
/// do nothing), as the APISIX ingress controller translates them: `ssl_verify` is false
/// only for `auth-ssl-verify: "false"`; the header lists are comma-separated (blanks
/// trimmed, empty items dropped). The config is validated like any plugin's, so a bad URI
/// or header name rejects the Ingress with the annotation named.
fn forward_auth_plugin(ing: &Ingress, problems: &mut Problems) -> Option<v1::Plugin> {
    let get = |name: &str| {
        ing.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(&format!("{ANNOTATION_PREFIX}{name}")))
    };
    let uri = get("auth-uri").filter(|u| !u.is_empty())?;
    let list = |name: &str| -> Vec<String> {
        get(name)
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let config = serde_json::json!({
        "uri": uri,
        "ssl_verify": get("auth-ssl-verify").map(String::as_str) != Some("false"),
        "request_headers": list("auth-request-headers"),
        "upstream_headers": list("auth-upstream-headers"),
        "client_headers": list("auth-client-headers"),
    });
    if let Err(e) = sluice_plugin_config::validate("forward-auth", &config) {
        let (field, reason) = match &e {
            sluice_plugin_config::ConfigError::Field { field, reason, .. } => {
                let name = match field.split('[').next().unwrap_or("") {
                    "request_headers" => "auth-request-headers",
                    "upstream_headers" => "auth-upstream-headers",
                    "client_headers" => "auth-client-headers",
                    _ => "auth-uri",
                };
                (name, reason.clone())
            }
            other => ("auth-uri", other.to_string()),
        };
        problems.error(
            annotation_field(&format!("{ANNOTATION_PREFIX}{field}")),
            reason,
        );
        return None;
    }
    Some(v1::Plugin {
        name: "forward-auth".into(),
        config_json: crate::json::canonical(&config),
    })
}

fn annotation_field(key: &str) -> String {
    format!("metadata.annotations[{key:?}]")
}

fn settings(ing: &Ingress, problems: &mut Problems) -> Settings {
    let mut out = Settings::default();
    let mut timeouts = [None, None, None];
    let mut unknown = Vec::new();
    for (key, value) in ing.metadata.annotations.iter().flatten() {
        let Some(name) = key.strip_prefix(ANNOTATION_PREFIX) else {
            continue;
        };
        let slot = match name {
            "enable-websocket" => {
                match value.as_str() {
                    "true" => out.websocket = true,
                    "false" => out.websocket = false,
                    _ => problems.error(
                        annotation_field(key),
                        format!("{value:?} must be \"true\" or \"false\""),
                    ),
                }
                continue;
            }
            "http-to-https" | "http-redirect" | "http-redirect-code" => continue,
            "auth-uri"
            | "auth-ssl-verify"
            | "auth-request-headers"
            | "auth-upstream-headers"
            | "auth-client-headers" => continue,
            "upstream-connect-timeout" => 0,
            "upstream-send-timeout" => 1,
            "upstream-read-timeout" => 2,
            _ if FAIL_CLOSED_ANNOTATIONS.contains(&name) => {
                problems.error(
                    annotation_field(key),
                    "not supported yet (the Ingress is rejected rather than served with less access control than written)",
                );
                continue;
            }
            _ => {
                unknown.push(key.as_str());
                continue;
            }
        };
        match upstream::duration_ms(value) {
            Ok(ms) => timeouts[slot] = Some(ms),
            Err(e) => problems.error(annotation_field(key), e),
        }
    }
    out.timeout = upstream::timeouts(timeouts);
    out.plugins.extend(forward_auth_plugin(ing, problems));
    out.plugins.extend(redirect_plugin(ing, problems));
    if !unknown.is_empty() {
        problems.notes.push(format!(
            "annotations not supported yet, ignored: {}",
            unknown.join(", ")
        ));
    }
    out
}

/// Snapshot paths of one Ingress path; `Err` is the field (`path` or `pathType`) and why it
/// is invalid.
fn paths(path: Option<&str>, path_type: &str) -> Result<Vec<String>, (&'static str, String)> {
    if !matches!(path_type, "Exact" | "Prefix" | "ImplementationSpecific") {
        return Err((
            "pathType",
            format!("unknown pathType {path_type:?} (Exact, Prefix or ImplementationSpecific)"),
        ));
    }
    let path = match (path.filter(|p| !p.is_empty()), path_type) {
        (Some(p), _) => p,
        (None, "ImplementationSpecific") => "/",
        (None, _) => return Err(("path", format!("required for pathType {path_type}"))),
    };
    validate::path(path).map_err(|e| ("path", e))?;
    let out = match path_type {
        "Exact" | "Prefix" if path.contains('*') => {
            return Err((
                "path",
                format!("{path:?}: `*` is not supported in {path_type} paths"),
            ));
        }
        "Exact" => vec![path.to_owned()],
        "Prefix" => {
            let base = path.trim_end_matches('/');
            if base.is_empty() {
                vec!["/*".to_owned()]
            } else {
                vec![base.to_owned(), format!("{base}/*")]
            }
        }
        "ImplementationSpecific" if path.ends_with('*') => vec![path.to_owned()],
        _ => vec![format!("{path}*")],
    };
    for p in &out {
        validate::path(p).map_err(|e| ("path", e))?;
    }
    Ok(out)
}

struct Ctx<'c, 'a> {
    ns: &'c str,
    idx: &'c Index<'a>,
    aus: &'c BTreeMap<(&'a str, &'a str), Result<UpstreamObject, ()>>,
    /// The canaries of ingress-nginx's class, for the main Ingresses.
    canaries: &'c [nginx::Canary],
    /// ingress-nginx's `backend-protocol` and `proxy-ssl-*`: the upstream of every backend
    /// becomes this variant of it.
    upstream: Option<nginx::UpstreamVariant>,
}

impl Ctx<'_, '_> {
    /// The backend of one path (`field` is its `backend` field path).
    fn backend(
        &self,
        b: &IngressBackend,
        field: &str,
        problems: &mut Problems,
    ) -> Option<(v1::Backend, v1::Upstream)> {
        if b.resource.is_some() {
            problems.error(
                format!("{field}.resource"),
                "resource backends are not supported (use service)",
            );
            return None;
        }
        let Some(svc) = &b.service else {
            problems.error(format!("{field}.service"), "required");
            return None;
        };
        let port = match svc.port.as_ref() {
            Some(p) => match (p.number, p.name.as_deref()) {
                (Some(n), _) if n != 0 => IntOrString::Int(n),
                (_, Some(name)) if !name.is_empty() => IntOrString::String(name.to_owned()),
                _ => {
                    problems.error(format!("{field}.service.port"), "number or name required");
                    return None;
                }
            },
            None => {
                problems.error(format!("{field}.service.port"), "required");
                return None;
            }
        };
        let r = BackendRef {
            namespace: self.ns,
            service: &svc.name,
            port: &port,
            granularity: Default::default(),
            subset: None,
            field,
            field_names: ("service.name", "service.port"),
        };
        let mut up = upstream::service_upstream(&r, self.idx, self.aus, problems)?;
        if let Some(v) = &self.upstream {
            v.apply(&mut up);
        }
        Some((
            v1::Backend {
                upstream_id: up.id.clone(),
                weight: BACKEND_WEIGHT,
                plugins: Vec::new(),
            },
            up,
        ))
    }
}

/// Every Ingress of our class: its routes enter the snapshot, or none (`Accepted=False`);
/// `tls` holds the unresolved `spec.tls[]` entries per Ingress (from [`crate::tls`]). The
/// verdicts go to [`Builder::ingresses`], apart from the status report.
pub(crate) fn translate(
    idx: &Index<'_>,
    aus: &BTreeMap<(&str, &str), Result<UpstreamObject, ()>>,
    mut tls: BTreeMap<(String, String), Vec<Unresolved>>,
    out: &mut Builder,
) {
    // ingress-nginx's canaries first: their backends join the routes of the main Ingresses
    // with the same host and path.
    let mut canaries = Vec::new();
    let mut canary_status = BTreeMap::new();
    for (&(ns, name), ing) in &idx.ingresses {
        if !is_nginx(ing, idx) || !nginx::is_canary(ing) {
            continue;
        }
        let mut problems = Problems::default();
        let found = canary_object(ing, ns, name, idx, aus, &mut problems);
        if problems.is_valid() {
            canaries.extend(found);
        }
        canary_status.insert((ns, name), problems);
    }
    for (&(ns, name), ing) in &idx.ingresses {
        if let Some(mut problems) = canary_status.remove(&(ns, name)) {
            let mine: Vec<&nginx::Canary> = canaries
                .iter()
                .filter(|c| c.ingress == (ns.to_owned(), name.to_owned()))
                .collect();
            if problems.is_valid() && !mine.iter().any(|c| c.used.get()) {
                problems.notes.push(
                    "canary: no Ingress of the class serves the same host and path, so nothing goes to it"
                        .into(),
                );
            }
            let mut conditions = vec![problems.accepted()];
            if problems.is_valid() {
                conditions.push(problems.resolved_refs());
            }
            out.ingresses.push(IngressStatus {
                namespace: ns.to_owned(),
                name: name.to_owned(),
                generation: ing.metadata.generation,
                conditions,
                routes: Vec::new(),
            });
            continue;
        }
        let mut problems = Problems::default();
        let translated = translate_object(ing, ns, name, idx, aus, &canaries, &mut problems);
        if let Some(list) = tls.remove(&(ns.to_owned(), name.to_owned())) {
            for (reason, field, message) in list {
                problems.unresolved(reason, field, message);
            }
        }
        // An ApisixRoute of the same name with a rule named like `ingress-r0-p0` would take
        // the same id: reject the Ingress rather than silently replace that route.
        for r in &translated.routes {
            if let Some(other) = out.routes.get(&r.id) {
                problems.error(
                    "metadata.name",
                    format!("route id {} is already used by {}", r.id, other.source),
                );
            }
        }
        let mut conditions = vec![problems.accepted()];
        let mut ids = Vec::new();
        if problems.is_valid() {
            conditions.push(problems.resolved_refs());
            ids = out.add(translated);
        }
        out.ingresses.push(IngressStatus {
            namespace: ns.to_owned(),
            name: name.to_owned(),
            generation: ing.metadata.generation,
            conditions,
            routes: ids,
        });
    }
}

/// Translates one Ingress. The output is only meaningful when `problems` holds no errors
/// afterwards.
pub(crate) fn translate_object(
    ing: &Ingress,
    ns: &str,
    name: &str,
    idx: &Index<'_>,
    aus: &BTreeMap<(&str, &str), Result<UpstreamObject, ()>>,
    canaries: &[nginx::Canary],
    problems: &mut Problems,
) -> RouteOutput {
    let mut out = RouteOutput::default();
    let mut settings = settings(ing, problems);
    if is_nginx(ing, idx) {
        let tls_hosts: Vec<String> = ing
            .spec
            .iter()
            .flat_map(|s| s.tls.iter().flatten())
            .flat_map(|t| t.hosts.iter().flatten().cloned())
            .collect();
        let n = nginx::settings(ing, &idx.nginx_config, problems);
        if let Some(t) = upstream::timeouts(n.timeouts) {
            settings.timeout = Some(t);
        }
        settings.plugins.extend(n.plugins.iter().cloned());
        settings.plugins.sort_by(|a, b| a.name.cmp(&b.name));
        settings.nginx = Some(nginx::Nginx { tls_hosts, ..n });
    }
    let upstream_variant = settings
        .nginx
        .as_ref()
        .and_then(|n| n.upstream_variant(ns, idx, problems));
    if let Some(p) = settings
        .nginx
        .as_ref()
        .and_then(|n| n.basic_auth_plugin(ns, idx, problems))
    {
        settings.plugins.push(p);
        settings.plugins.sort_by(|a, b| a.name.cmp(&b.name));
    }
    let ctx = Ctx {
        ns,
        idx,
        aus,
        canaries,
        upstream: upstream_variant,
    };
    let Some(spec) = ing.spec.as_ref() else {
        problems.error("spec", "required");
        return out;
    };
    let routes = Routes {
        source: format!("Ingress {ns}/{name}"),
        settings,
    };
    for (i, rule) in spec.rules.iter().flatten().enumerate() {
        routes.rule(&ctx, name, i, rule, problems, &mut out);
    }
    if let Some(b) = &spec.default_backend
        && let Some((backend, up)) = ctx.backend(b, "spec.defaultBackend", problems)
    {
        let route = routes.route(
            format!("{ns}/{name}/ingress-default"),
            i32::MIN,
            Vec::new(),
            vec!["/*".to_owned()],
            backend,
        );
        // NB: ingress-nginx's default backend takes no path regex or rewrite of its own.
        let n = routes.settings.nginx.as_ref();
        if let Some(code) = n.and_then(|n| n.ssl_redirect_for(None)) {
            out.routes.push(nginx::ssl_redirect_route(&route, code));
        }
        out.routes.push(route);
        out.upstreams.push(up);
    }
    out
}

/// Whether `ing` is of a class served in ingress-nginx's place.
fn is_nginx(ing: &Ingress, idx: &Index<'_>) -> bool {
    class_of(ing).is_some_and(|c| idx.nginx_classes.iter().any(|n| n == c))
}

/// The canary entries of an ingress-nginx canary Ingress: one per host and path, with its
/// backend and rules.
fn canary_object(
    ing: &Ingress,
    ns: &str,
    name: &str,
    idx: &Index<'_>,
    aus: &BTreeMap<(&str, &str), Result<UpstreamObject, ()>>,
    problems: &mut Problems,
) -> Vec<nginx::Canary> {
    let Some(rules) = nginx::canary_rules(ing, problems) else {
        return Vec::new();
    };
    let ctx = Ctx {
        ns,
        idx,
        aus,
        canaries: &[],
        upstream: None,
    };
    let mut out = Vec::new();
    for (i, rule) in ing
        .spec
        .iter()
        .flat_map(|s| s.rules.iter().flatten())
        .enumerate()
    {
        let host = rule.host.clone().filter(|h| !h.is_empty());
        for (j, p) in rule.http.iter().flat_map(|h| &h.paths).enumerate() {
            let field = format!("spec.rules[{i}].http.paths[{j}].backend");
            if let Some((mut backend, upstream)) = ctx.backend(&p.backend, &field, problems) {
                backend.weight = 0;
                out.push(nginx::Canary {
                    ingress: (ns.to_owned(), name.to_owned()),
                    host: host.clone(),
                    path: p
                        .path
                        .clone()
                        .filter(|p| !p.is_empty())
                        .unwrap_or_else(|| "/".into()),
                    backend,
                    upstream,
                    rules: rules.clone(),
                    used: std::cell::Cell::new(false),
                });
            }
        }
    }
    out
}

/// What every route of one Ingress shares.
struct Routes {
    source: String,
    settings: Settings,
}

impl Routes {
    fn route(
        &self,
        id: String,
        priority: i32,
        hosts: Vec<String>,
        paths: Vec<String>,
        backend: v1::Backend,
    ) -> v1::Route {
        v1::Route {
            id,
            source: self.source.clone(),
            priority,
            hosts,
            paths,
            timeout: self.settings.timeout,
            websocket: self.settings.websocket,
            backends: vec![backend],
            plugins: self.settings.plugins.clone(),
            ..Default::default()
        }
    }

    /// `route` as ingress-nginx's annotations make it: regular-expression paths, the
    /// rewrite, and before it the redirect of plain HTTP to HTTPS (a route of its own,
    /// `<id>-ssl-redirect`, matching `scheme == http`). Without ingress-nginx's annotations,
    /// `route` alone.
    fn with_nginx(
        &self,
        mut route: v1::Route,
        raw_path: &str,
        host: Option<&str>,
        field: &str,
        problems: &mut Problems,
    ) -> Vec<v1::Route> {
        let Some(n) = &self.settings.nginx else {
            return vec![route];
        };
        let extra = n.host_plugins(host);
        if !extra.is_empty() {
            route.plugins.extend(extra);
            route.plugins.sort_by(|a, b| a.name.cmp(&b.name));
        }
        let mut rewrite = serde_json::Map::new();
        if n.regex {
            match nginx::regex_path(raw_path) {
                Ok((anchored, _literal)) => {
                    // NB: `/*` and the expression: the regex is case-insensitive, a literal
                    // prefix path would not be. Longer paths first, as ingress-nginx orders
                    // its locations.
                    route.paths = vec!["/*".to_owned()];
                    route.exprs.push(v1::Expr {
                        scope: v1::ExprScope::Path.into(),
                        op: v1::ExprOp::RegexMatchCaseInsensitive.into(),
                        value: anchored,
                        ..Default::default()
                    });
                    // NB: ×16 leaves room for the canary (+2, +4) and redirect (+8) routes
                    // of one path below the next longer path.
                    route.priority =
                        i32::try_from(raw_path.len().min(1 << 20) * 16).unwrap_or(i32::MAX / 4);
                }
                Err(e) => {
                    problems.error(field, e);
                    return Vec::new();
                }
            }
            if let Some(target) = &n.rewrite_target
                && let serde_json::Value::Object(o) = nginx::rewrite_config(raw_path, target, n)
            {
                rewrite = o;
            }
        }
        if rewrite.is_empty() {
            nginx::extra_rewrite(&mut rewrite, n);
        }
        if !rewrite.is_empty() {
            let conf = serde_json::Value::Object(rewrite);
            match sluice_plugin_config::validate("proxy-rewrite", &conf) {
                Ok(()) => {
                    route.plugins.push(v1::Plugin {
                        name: "proxy-rewrite".into(),
                        config_json: crate::json::canonical(&conf),
                    });
                    route.plugins.sort_by(|a, b| a.name.cmp(&b.name));
                }
                Err(e) => {
                    problems.error(
                        format!("metadata.annotations[\"{}rewrite-target\"]", nginx::PREFIX),
                        e.to_string(),
                    );
                    return Vec::new();
                }
            }
        }
        let mut out = Vec::new();
        if let Some(code) = n.ssl_redirect_for(host) {
            out.push(nginx::ssl_redirect_route(&route, code));
        }
        out.push(route);
        out
    }

    /// The `app-root` route of a rule's host: `/` answered with a 302 to the app root.
    fn app_root(&self, id: String, hosts: Vec<String>, backend: v1::Backend) -> Option<v1::Route> {
        let root = self.settings.nginx.as_ref()?.app_root.as_ref()?;
        Some(v1::Route {
            id,
            source: self.source.clone(),
            // NB: ingress-nginx answers it in the server block, before any location.
            priority: i32::MAX / 2,
            hosts,
            paths: vec!["/".to_owned()],
            backends: vec![backend],
            plugins: vec![v1::Plugin {
                name: "redirect".into(),
                config_json: crate::json::canonical(&serde_json::json!({
                    "uri": format!("$scheme://$http_host{}", root.replace('$', "$$")),
                    "ret_code": 302,
                })),
            }],
            ..Default::default()
        })
    }

    /// The routes of `spec.rules[i]`: one per path.
    fn rule(
        &self,
        ctx: &Ctx<'_, '_>,
        name: &str,
        i: usize,
        rule: &IngressRule,
        problems: &mut Problems,
        out: &mut RouteOutput,
    ) {
        let ns = ctx.ns;
        let rf = format!("spec.rules[{i}]");
        let mut hosts = Vec::new();
        if let Some(h) = rule.host.as_deref().filter(|h| !h.is_empty()) {
            match validate::host(h) {
                Ok(()) => hosts.push(h.to_owned()),
                Err(e) => problems.error(format!("{rf}.host"), e),
            }
        }
        let Some(http) = &rule.http else {
            return;
        };
        let regex = self.settings.nginx.as_ref().is_some_and(|n| n.regex);
        let mut first_backend = None;
        for (j, p) in http.paths.iter().enumerate() {
            let pf = format!("{rf}.http.paths[{j}]");
            let paths = if regex {
                // NB: the path is a regular expression, checked by `with_nginx`.
                Some(Vec::new())
            } else {
                match paths(p.path.as_deref(), &p.path_type) {
                    Ok(paths) => Some(paths),
                    Err((f, e)) => {
                        problems.error(format!("{pf}.{f}"), e);
                        None
                    }
                }
            };
            let backend = ctx.backend(&p.backend, &format!("{pf}.backend"), problems);
            if let (Some(paths), Some((backend, up))) = (paths, backend) {
                // The router ranks an exact path above prefixes already; priority only breaks
                // the tie between `Exact /foo` and the exact half of `Prefix /foo`, which the
                // Ingress spec gives to Exact.
                let priority = if p.path_type == "Exact" {
                    EXACT_PRIORITY
                } else {
                    0
                };
                let id = format!("{ns}/{name}/ingress-r{i}-p{j}");
                first_backend.get_or_insert_with(|| backend.clone());
                let route = self.route(id, priority, hosts.clone(), paths, backend);
                let raw = p.path.as_deref().filter(|p| !p.is_empty()).unwrap_or("/");
                let host = hosts.first().map(String::as_str);
                let routes = self.with_nginx(route, raw, host, &format!("{pf}.path"), problems);
                for c in ctx
                    .canaries
                    .iter()
                    .filter(|c| c.host.as_deref() == host && c.path == raw)
                {
                    c.used.set(true);
                    out.upstreams.push(c.upstream.clone());
                }
                out.routes
                    .extend(nginx::with_canaries(routes, host, raw, ctx.canaries));
                out.upstreams.push(up);
            }
        }
        if let Some(b) = first_backend
            && let Some(r) = self.app_root(format!("{ns}/{name}/ingress-r{i}-app-root"), hosts, b)
        {
            out.routes.push(r);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn ok(path: &str, path_type: &str) -> Vec<String> {
        paths(Some(path), path_type).unwrap()
    }

    #[test]
    fn prefix_paths_are_element_wise() {
        assert_eq!(ok("/foo", "Prefix"), ["/foo", "/foo/*"]);
        assert_eq!(ok("/foo/", "Prefix"), ["/foo", "/foo/*"]);
        assert_eq!(ok("/", "Prefix"), ["/*"]);
        assert_eq!(ok("/foo", "Exact"), ["/foo"]);
        assert_eq!(ok("/foo", "ImplementationSpecific"), ["/foo*"]);
        assert_eq!(ok("/foo*", "ImplementationSpecific"), ["/foo*"]);
        assert_eq!(paths(None, "ImplementationSpecific").unwrap(), ["/*"]);
    }

    #[test]
    fn bad_paths_name_the_field() {
        assert_eq!(paths(Some("foo"), "Prefix").unwrap_err().0, "path");
        assert_eq!(paths(None, "Exact").unwrap_err().0, "path");
        assert_eq!(paths(Some("/a*"), "Prefix").unwrap_err().0, "path");
        assert_eq!(paths(Some("/a"), "Regex").unwrap_err().0, "pathType");
    }

    fn ingress(yaml: &str) -> Ingress {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn class_selection() {
        let sluice = Options {
            ingress_class: Some("sluice".into()),
            ..Default::default()
        };
        let default_class: IngressClass = serde_yaml::from_str(
            "metadata: {name: sluice, annotations: {ingressclass.kubernetes.io/is-default-class: \"true\"}}",
        )
        .unwrap();
        let unclassed = ingress("metadata: {name: a}\nspec: {}");
        let named = ingress("metadata: {name: a}\nspec: {ingressClassName: sluice}");
        let other = ingress("metadata: {name: a}\nspec: {ingressClassName: nginx}");
        let legacy = ingress(
            "metadata: {name: a, annotations: {kubernetes.io/ingress.class: sluice}}\nspec: {}",
        );
        assert!(selected(&unclassed, &[], &Options::default()));
        assert!(selected(&other, &[], &Options::default()));
        assert!(selected(&named, &[], &sluice));
        assert!(selected(&legacy, &[], &sluice));
        assert!(!selected(
            &other,
            std::slice::from_ref(&default_class),
            &sluice
        ));
        assert!(!selected(&unclassed, &[], &sluice));
        assert!(selected(&unclassed, &[default_class], &sluice));
    }
}
