//! ApisixRoute `spec.http[]` rules → snapshot routes (`spec.stream[]`: [`super::stream`]).

use std::collections::{BTreeMap, HashMap};

use sluice_crds::{ApisixRoute, ApisixRouteHttp, ApisixRouteHttpMatchExpr, ExprOp, ExprScope};
use sluice_proto::v1;

use super::plugins;
use crate::Index;
pub(crate) use crate::builder::RouteOutput;
use crate::problems::Problems;
use crate::upstream::{self, BackendRef, UpstreamObject};
use crate::validate;

/// Translates one ApisixRoute. The output is only meaningful when `problems` holds no
/// errors afterwards.
pub(crate) fn translate_object(
    ar: &ApisixRoute,
    ns: &str,
    name: &str,
    idx: &Index<'_>,
    aus: &BTreeMap<(&str, &str), Result<UpstreamObject, ()>>,
    pcs: &PluginConfigs<'_>,
    problems: &mut Problems,
) -> RouteOutput {
    let mut out = RouteOutput::default();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, rule) in ar.spec.http.iter().enumerate() {
        let field = format!("spec.http[{i}]");
        if rule.name.is_empty() {
            problems.error(format!("{field}.name"), "must not be empty");
        } else if let Some(first) = seen.insert(&rule.name, i) {
            problems.error(
                format!("{field}.name"),
                format!(
                    "duplicate rule name {:?} (also spec.http[{first}].name)",
                    rule.name
                ),
            );
        }
        let ctx = RuleCtx {
            ns,
            name,
            field: &field,
            idx,
            aus,
            pcs,
        };
        if let Some((route, ups)) = ctx.rule(rule, problems) {
            out.routes.push(route);
            out.upstreams.extend(ups);
        }
    }
    out
}

struct RuleCtx<'c, 'a> {
    ns: &'c str,
    name: &'c str,
    /// `spec.http[i]`.
    field: &'c str,
    idx: &'c Index<'a>,
    aus: &'c BTreeMap<(&'a str, &'a str), Result<UpstreamObject, ()>>,
    pcs: &'c PluginConfigs<'a>,
}

/// Translated ApisixPluginConfigs by (namespace, name); `Err` when invalid.
pub(crate) type PluginConfigs<'a> = BTreeMap<(&'a str, &'a str), Result<Vec<v1::Plugin>, ()>>;

impl RuleCtx<'_, '_> {
    fn f(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.field)
    }

    /// One rule; `None` when it is invalid (the errors are in `problems`).
    fn rule(
        &self,
        rule: &ApisixRouteHttp,
        problems: &mut Problems,
    ) -> Option<(v1::Route, Vec<v1::Upstream>)> {
        let before = problems.errors.len();
        let m = &rule.match_;

        let priority = i32::try_from(rule.priority).unwrap_or_else(|_| {
            problems.error(
                self.f("priority"),
                format!(
                    "{} is out of range (a 32-bit signed integer)",
                    rule.priority
                ),
            );
            0
        });

        let (remote_addrs, exprs) = self.match_(m, problems);

        let timeout = rule
            .timeout
            .as_ref()
            .map(|t| upstream::parse_timeout(t, &self.f("timeout"), problems))
            .and_then(upstream::timeouts);

        let mut plugins = self.plugins(rule, problems);

        let (backends, mut upstreams) = self.backends(rule, problems);

        let id = format!("{}/{}/{}", self.ns, self.name, rule.name);
        if problems.errors.len() == before {
            upstreams.extend(self.traffic_split(rule, &id, &mut plugins, problems));
        }

        if problems.errors.len() > before {
            return None;
        }
        let route = v1::Route {
            id,
            source: format!("ApisixRoute {}/{}", self.ns, self.name),
            priority,
            hosts: m.hosts.clone(),
            paths: m.paths.clone(),
            methods: m.methods.iter().map(|m| m.as_str().to_owned()).collect(),
            remote_addrs,
            exprs,
            timeout,
            websocket: rule.websocket,
            backends,
            plugins,
            listeners: Vec::new(),
            ..Default::default()
        };
        Some((route, upstreams))
    }

    fn expr(
        &self,
        j: usize,
        e: &ApisixRouteHttpMatchExpr,
        problems: &mut Problems,
    ) -> Option<v1::Expr> {
        let field = self.f(&format!("match.exprs[{j}]"));
        let before = problems.errors.len();
        let scope = match e.subject.scope {
            ExprScope::Header => v1::ExprScope::Header,
            ExprScope::Query => v1::ExprScope::Query,
            ExprScope::Cookie => v1::ExprScope::Cookie,
            ExprScope::Path => v1::ExprScope::Path,
            ExprScope::Variable => v1::ExprScope::Variable,
            ExprScope::Body => {
                problems.error(
                    format!("{field}.subject.scope"),
                    "Body is not supported yet",
                );
                v1::ExprScope::Unspecified
            }
        };
        if e.subject.scope != ExprScope::Body
            && let Err(r) = validate::expr_subject(e.subject.scope, &e.subject.name)
        {
            problems.error(format!("{field}.subject.name"), r);
        }
        let op = proto_op(e.op);
        if e.op.takes_set() {
            if e.set.as_ref().is_none_or(Vec::is_empty) {
                problems.error(
                    format!("{field}.set"),
                    format!("{:?} needs a non-empty set", e.op),
                );
            }
            if e.value.is_some() {
                problems.error(
                    format!("{field}.value"),
                    format!("{:?} takes `set`, not `value`", e.op),
                );
            }
        } else {
            if e.set.as_ref().is_some_and(|s| !s.is_empty()) {
                problems.error(
                    format!("{field}.set"),
                    format!("`set` is only for In and NotIn; {:?} takes `value`", e.op),
                );
            }
            match &e.value {
                None => problems.error(
                    format!("{field}.value"),
                    format!("required for operator {:?}", e.op),
                ),
                Some(v) if validate::is_regex(e.op) => {
                    if let Err(r) = validate::regex(e.op, v) {
                        problems.error(format!("{field}.value"), r);
                    }
                }
                Some(_) => {}
            }
        }
        if problems.errors.len() > before {
            return None;
        }
        Some(v1::Expr {
            scope: scope as i32,
            // The dataplane ignores the name for Path; leave it out so equal rules are equal.
            name: if e.subject.scope == ExprScope::Path {
                String::new()
            } else {
                e.subject.name.clone()
            },
            op: op as i32,
            value: e.value.clone().unwrap_or_default(),
            set: e.set.clone().unwrap_or_default(),
        })
    }

    /// The rule's plugins: its ApisixPluginConfig, overridden by its own `plugins`, then by
    /// the plugin `authentication` implies.
    fn plugins(&self, rule: &ApisixRouteHttp, problems: &mut Problems) -> Vec<v1::Plugin> {
        let mut base = Vec::new();
        if let Some(pc_name) = &rule.plugin_config_name {
            let pc_ns = rule
                .plugin_config_namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(self.ns);
            let from = crate::refs::Referrer {
                kind: "ApisixRoute",
                ns: self.ns,
            };
            let to = crate::refs::Target {
                group: crate::refs::APISIX_GROUP,
                kind: "ApisixPluginConfig",
                ns: pc_ns,
                name: pc_name,
            };
            // NB: refused like a missing ApisixPluginConfig: the rule is rejected rather than
            // served without those plugins.
            if let Err(e) = self.idx.permit(from, to) {
                problems.refused(
                    self.f("plugin_config_namespace"),
                    format!("{e} (the rule is rejected rather than served without those plugins)"),
                );
            } else {
                match self.pcs.get(&(pc_ns, pc_name.as_str())) {
                    None => problems.error(
                        self.f("plugin_config_name"),
                        format!(
                            "ApisixPluginConfig {pc_ns}/{pc_name} not found (the rule is rejected rather than served without those plugins)"
                        ),
                    ),
                    Some(Err(())) => problems.error(
                        self.f("plugin_config_name"),
                        format!("ApisixPluginConfig {pc_ns}/{pc_name} is invalid (see its status)"),
                    ),
                    Some(Ok(list)) => base = list.clone(),
                }
            }
        }
        let own = plugins::plugin_list(
            &rule.plugins,
            self.ns,
            &self.f("plugins"),
            &self.idx.secrets,
            plugins::Owner::Route,
            problems,
        );
        let mut out = plugins::merge(base, own);
        if let Some(auth) = &rule.authentication
            && let Some(p) = plugins::authentication(auth, &self.f("authentication"), problems)
        {
            out = plugins::merge(out, vec![p]);
        }
        out
    }

    /// Where the rule's `traffic-split` comes from: its own `plugins` (which override the
    /// plugin config's), else its ApisixPluginConfig.
    fn traffic_split_origin(&self, rule: &ApisixRouteHttp) -> super::traffic_split::Origin {
        let name = <sluice_plugin_config::traffic_split::TrafficSplit as sluice_plugin_config::PluginSchema>::NAME;
        if let Some(j) = rule.plugins.iter().position(|p| p.name == name && p.enable) {
            return super::traffic_split::Origin::Rule(self.f(&format!("plugins[{j}].config")));
        }
        let pc_ns = rule
            .plugin_config_namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(self.ns);
        let pc_name = rule.plugin_config_name.as_deref().unwrap_or_default();
        let j = self
            .idx
            .plugin_configs
            .get(&(pc_ns, pc_name))
            .and_then(|pc| pc.spec.plugins.iter().position(|p| p.name == name));
        super::traffic_split::Origin::PluginConfig {
            field: self.f("plugin_config_name"),
            what: format!(
                "ApisixPluginConfig {pc_ns}/{pc_name} spec.plugins[{}].config",
                j.unwrap_or(0)
            ),
        }
    }

    /// `match`: paths, hosts, remote addresses and exprs validated (`filter_func` is
    /// refused); the remote addresses and exprs.
    fn match_(
        &self,
        m: &sluice_crds::ApisixRouteHttpMatch,
        problems: &mut Problems,
    ) -> (Vec<String>, Vec<v1::Expr>) {
        if m.paths.is_empty() {
            problems.error(self.f("match.paths"), "at least one path is required");
        }
        for (j, p) in m.paths.iter().enumerate() {
            if let Err(e) = validate::path(p) {
                problems.error(self.f(&format!("match.paths[{j}]")), e);
            }
        }
        for (j, h) in m.hosts.iter().enumerate() {
            if let Err(e) = validate::host(h) {
                problems.error(self.f(&format!("match.hosts[{j}]")), e);
            }
        }
        let mut remote_addrs = Vec::with_capacity(m.remote_addrs.len());
        for (j, a) in m.remote_addrs.iter().enumerate() {
            match validate::remote_addr(a) {
                Ok(a) => remote_addrs.push(a),
                Err(e) => problems.error(self.f(&format!("match.remoteAddrs[{j}]")), e),
            }
        }
        let exprs: Vec<v1::Expr> = m
            .exprs
            .iter()
            .enumerate()
            .filter_map(|(j, e)| self.expr(j, e, problems))
            .collect();
        if m.filter_func.is_some() {
            problems.error(
                self.f("match.filter_func"),
                "Lua filter functions are not supported",
            );
        }
        (remote_addrs, exprs)
    }

    /// The upstreams of the rule's `traffic-split` plugin (its config rewritten to carry
    /// snapshot upstream ids).
    fn traffic_split(
        &self,
        rule: &ApisixRouteHttp,
        id: &str,
        plugins: &mut [v1::Plugin],
        problems: &mut Problems,
    ) -> Vec<v1::Upstream> {
        let scope = super::traffic_split::Scope {
            ns: self.ns,
            route_id: id,
            idx: self.idx,
            aus: self.aus,
        };
        let origin = self.traffic_split_origin(rule);
        super::traffic_split::resolve(plugins, &origin, &scope, problems)
    }

    /// `upstreams[j]`: the weight and the upstream of the external nodes of an
    /// ApisixUpstream; `None` (with an error) when it is not usable.
    fn external_upstream(
        &self,
        j: usize,
        u: &sluice_crds::ApisixRouteUpstreamReference,
        problems: &mut Problems,
    ) -> Option<(u32, v1::Upstream)> {
        let field = self.f(&format!("upstreams[{j}]"));
        let Ok(weight) = u32::try_from(u.weight_or_default()) else {
            problems.error(format!("{field}.weight"), "must not be negative");
            return None;
        };
        if u.name.is_empty() {
            problems.error(format!("{field}.name"), "must not be empty");
            return None;
        }
        let message = match self.aus.get(&(self.ns, u.name.as_str())) {
            None => format!("ApisixUpstream {}/{} not found", self.ns, u.name),
            Some(Err(())) => format!(
                "ApisixUpstream {}/{} is invalid (see its status)",
                self.ns, u.name
            ),
            Some(Ok(au)) => match au.external_upstream(self.ns, &u.name) {
                Some(up) => return Some((weight, up)),
                None => format!("ApisixUpstream {}/{} has no externalNodes", self.ns, u.name),
            },
        };
        problems.error(format!("{field}.name"), message);
        None
    }

    fn backends(
        &self,
        rule: &ApisixRouteHttp,
        problems: &mut Problems,
    ) -> (Vec<v1::Backend>, Vec<v1::Upstream>) {
        let mut backends = Vec::new();
        let mut upstreams = Vec::new();
        if rule.backends.is_empty() && rule.upstreams.is_empty() {
            problems.error(
                self.field,
                "at least one of backends or upstreams is required",
            );
            return (backends, upstreams);
        }
        for (j, b) in rule.backends.iter().enumerate() {
            let field = self.f(&format!("backends[{j}]"));
            let Ok(weight) = u32::try_from(b.weight_or_default()) else {
                problems.error(format!("{field}.weight"), "must not be negative");
                continue;
            };
            let r = BackendRef {
                namespace: self.ns,
                service: &b.service_name,
                port: &b.service_port,
                granularity: b.resolve_granularity.unwrap_or_default(),
                subset: b.subset.as_deref(),
                field: &field,
                field_names: ("serviceName", "servicePort"),
            };
            if let Some(up) = upstream::service_upstream(&r, self.idx, self.aus, problems) {
                backends.push(v1::Backend {
                    upstream_id: up.id.clone(),
                    weight,
                    plugins: Vec::new(),
                });
                upstreams.push(up);
            }
        }
        for (j, u) in rule.upstreams.iter().enumerate() {
            if let Some((weight, up)) = self.external_upstream(j, u, problems) {
                backends.push(v1::Backend {
                    upstream_id: up.id.clone(),
                    weight,
                    plugins: Vec::new(),
                });
                upstreams.push(up);
            }
        }
        if !backends.is_empty() && backends.iter().all(|b| b.weight == 0) {
            problems.error(
                self.field,
                "every backend and upstream has weight 0; at least one needs a positive weight",
            );
        }
        (backends, upstreams)
    }
}

fn proto_op(op: ExprOp) -> v1::ExprOp {
    match op {
        ExprOp::Equal => v1::ExprOp::Equal,
        ExprOp::NotEqual => v1::ExprOp::NotEqual,
        ExprOp::GreaterThan => v1::ExprOp::GreaterThan,
        ExprOp::GreaterThanEqual => v1::ExprOp::GreaterThanEqual,
        ExprOp::LessThan => v1::ExprOp::LessThan,
        ExprOp::LessThanEqual => v1::ExprOp::LessThanEqual,
        ExprOp::RegexMatch => v1::ExprOp::RegexMatch,
        ExprOp::RegexNotMatch => v1::ExprOp::RegexNotMatch,
        ExprOp::RegexMatchCaseInsensitive => v1::ExprOp::RegexMatchCaseInsensitive,
        ExprOp::RegexNotMatchCaseInsensitive => v1::ExprOp::RegexNotMatchCaseInsensitive,
        ExprOp::In => v1::ExprOp::In,
        ExprOp::NotIn => v1::ExprOp::NotIn,
    }
}
