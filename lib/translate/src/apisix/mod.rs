//! The Apisix input family: ApisixUpstream, ApisixPluginConfig, ApisixConsumer,
//! ApisixGlobalRule and ApisixRoute, one processor each, run by [`crate::translate`] in
//! that order (routes need the verdicts of the others). ApisixTls is in [`crate::tls`],
//! which settles host claims between ApisixTls objects and Ingresses.
//!
//! Files: [`route`] (one ApisixRoute), [`plugins`] (plugin lists, consumers, credentials),
//! [`traffic_split`] (the `traffic-split` plugin's upstreams), [`stream`] (`spec.stream[]`
//! rules on the declared stream ports). ApisixUpstream settings are
//! shared with the other families: [`crate::upstream::settings`].

pub(crate) mod plugins;
pub(crate) mod route;
pub(crate) mod stream;
mod traffic_split;

use std::collections::BTreeMap;

use sluice_crds::ExternalNodeType;
use sluice_proto::v1;

use crate::Index;
use crate::builder::{Builder, simple_status};
use crate::problems::Problems;
use crate::status::{ObjectKind, ObjectStatus};
use crate::upstream::{self, UpstreamObject};

/// Verdicts of the ApisixUpstreams by (namespace, name): `Err` when invalid.
pub(crate) type Upstreams<'a> = BTreeMap<(&'a str, &'a str), Result<UpstreamObject, ()>>;

/// Validates every ApisixUpstream (`Accepted`, plus `ResolvedRefs` when it has `Service`
/// external nodes); returns the verdicts every family's Service backends take settings from.
pub(crate) fn upstreams<'a>(idx: &Index<'a>, out: &mut Builder) -> Upstreams<'a> {
    let mut aus = BTreeMap::new();
    for (&(ns, name), au) in &idx.upstreams {
        let mut problems = Problems::default();
        let verdict = upstream::validate_object(au, ns, idx, &mut problems);
        let mut conditions = vec![problems.accepted()];
        let has_service_nodes = au
            .spec
            .external_nodes
            .iter()
            .any(|n| n.type_ == Some(ExternalNodeType::Service));
        if verdict.is_ok() && has_service_nodes {
            conditions.push(problems.resolved_refs());
        }
        out.status(ObjectStatus {
            kind: ObjectKind::ApisixUpstream,
            namespace: ns.to_owned(),
            name: name.to_owned(),
            generation: au.metadata.generation,
            conditions,
            routes: Vec::new(),
        });
        aus.insert((ns, name), verdict);
    }
    aus
}

/// Validates every ApisixPluginConfig; returns their plugin lists for the routes to merge.
pub(crate) fn plugin_configs<'a>(idx: &Index<'a>, out: &mut Builder) -> route::PluginConfigs<'a> {
    let mut pcs = BTreeMap::new();
    for (&(ns, name), pc) in &idx.plugin_configs {
        let mut problems = Problems::default();
        let list = plugins::plugin_list(
            &pc.spec.plugins,
            ns,
            "spec.plugins",
            &idx.secrets,
            plugins::Owner::Route,
            &mut problems,
        );
        out.status(simple_status(
            ObjectKind::ApisixPluginConfig,
            (ns, name),
            pc.metadata.generation,
            &problems,
        ));
        let verdict = if problems.is_valid() {
            Ok(list)
        } else {
            Err(())
        };
        pcs.insert((ns, name), verdict);
    }
    pcs
}

/// Every ApisixConsumer becomes a snapshot consumer. A credential (key-auth key, basic-auth
/// username, jwt-auth key) names one consumer: a later consumer (by namespace/name) reusing
/// one is rejected.
pub(crate) fn consumers(idx: &Index<'_>, out: &mut Builder) {
    let mut credentials: BTreeMap<(String, String), String> = BTreeMap::new();
    for (&(ns, name), ac) in &idx.consumers {
        let mut problems = Problems::default();
        let c = plugins::consumer(ac, ns, name, &idx.secrets, &mut problems)
            .filter(|c| claim_credentials(c, &mut credentials, &mut problems));
        out.status(simple_status(
            ObjectKind::ApisixConsumer,
            (ns, name),
            ac.metadata.generation,
            &problems,
        ));
        out.consumers.extend(c);
    }
}

/// Claims the credentials of `c` for it; `false` (and an error) when another consumer holds
/// one already.
fn claim_credentials(
    c: &v1::Consumer,
    credentials: &mut BTreeMap<(String, String), String>,
    problems: &mut Problems,
) -> bool {
    let ids = plugins::credential_ids(c);
    for (plugin, id) in &ids {
        if let Some(owner) = credentials.get(&(plugin.clone(), id.clone())) {
            problems.error(
                "spec.authParameter",
                format!("the {plugin} credential is already used by consumer {owner}"),
            );
            return false;
        }
    }
    for id in ids {
        credentials.insert(id, c.name.clone());
    }
    true
}

/// Every valid ApisixGlobalRule becomes a global rule `<ns>/<name>`.
pub(crate) fn global_rules(idx: &Index<'_>, out: &mut Builder) {
    for (&(ns, name), gr) in &idx.global_rules {
        let mut problems = Problems::default();
        let list = plugins::plugin_list(
            &gr.spec.plugins,
            ns,
            "spec.plugins",
            &idx.secrets,
            plugins::Owner::GlobalRule,
            &mut problems,
        );
        out.status(simple_status(
            ObjectKind::ApisixGlobalRule,
            (ns, name),
            gr.metadata.generation,
            &problems,
        ));
        if problems.is_valid() {
            out.global_rules.push(v1::GlobalRule {
                id: format!("{ns}/{name}"),
                plugins: list,
            });
        }
    }
}

/// Every ApisixRoute: all its rules (http and stream) enter the snapshot, or none
/// (`Accepted=False`). Oldest first (creationTimestamp, then namespace/name), so the older
/// object keeps a stream (port, host) two claim.
pub(crate) fn routes(
    idx: &Index<'_>,
    aus: &Upstreams<'_>,
    pcs: &route::PluginConfigs<'_>,
    stream_ports: &[crate::StreamPort],
    out: &mut Builder,
) {
    let mut sorted: Vec<_> = idx.routes.iter().collect();
    sorted.sort_by_key(|(key, ar)| {
        let created = ar.metadata.creation_timestamp.as_ref().map(|t| t.0);
        (created, **key)
    });
    let mut claims = stream::Claims::new();
    for (&(ns, name), ar) in sorted {
        let mut problems = Problems::default();
        let translated = route::translate_object(ar, ns, name, idx, aus, pcs, &mut problems);
        let streams = stream::translate_rules(ar, ns, name, idx, aus, stream_ports, &mut problems);
        if problems.is_valid() {
            let owner = format!("ApisixRoute {ns}/{name}");
            stream::claim(&streams, &owner, &mut claims, &mut problems);
        }
        let mut conditions = vec![problems.accepted()];
        let mut ids = Vec::new();
        if problems.is_valid() {
            conditions.push(problems.resolved_refs());
            ids = out.add(translated);
            ids.extend(out.add_streams(streams.routes, streams.upstreams));
            ids.sort();
        }
        out.status(ObjectStatus {
            kind: ObjectKind::ApisixRoute,
            namespace: ns.to_owned(),
            name: name.to_owned(),
            generation: ar.metadata.generation,
            conditions,
            routes: ids,
        });
    }
}
