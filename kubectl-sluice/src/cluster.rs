//! Reading the cluster for `status`, with the current kubeconfig as kubectl does: the
//! controller replicas' records (Leases), the Apisix objects' status, and the Ingresses
//! translated with what the controller reads for them.

use std::path::Path;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, Resource};
use serde::de::DeserializeOwned;
use sluice_crds::{
    ApisixConsumer, ApisixGlobalRule, ApisixPluginConfig, ApisixRoute, ApisixStatus, ApisixTls,
    ApisixUpstream,
};
use sluice_translate::{ClusterState, translate};

use crate::offline::controller_options;
use crate::status::{
    self, APISIX_REQUIRED, INGRESS_REQUIRED, ObjectConditions, RECORD_LABEL, Report,
};

/// Why the cluster could not be read (exit code 2 in `main`).
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No kubeconfig, or one that cannot be used.
    #[error("kubeconfig: {0}")]
    Config(String),
    /// A list the report cannot do without failed.
    #[error("listing {what}: {source}")]
    List {
        /// What was listed.
        what: &'static str,
        /// The API error.
        source: kube::Error,
    },
}

/// Where to connect: `--kubeconfig` and `--context`, as kubectl takes them.
#[derive(Debug, Clone, Default)]
pub struct Target<'a> {
    /// A kubeconfig file; default `$KUBECONFIG`, else `~/.kube/config`, else in-cluster.
    pub kubeconfig: Option<&'a Path>,
    /// A context of the kubeconfig; default its current context.
    pub context: Option<&'a str>,
}

/// Which objects `status` checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace (`-A`).
    All,
    /// One namespace (`--namespace`, else the context's).
    Namespace(String),
}

/// A client for `target`, as the controller builds one (`Config` → `Client`, rustls with
/// ring); also returns the context's default namespace.
pub async fn connect(target: &Target<'_>) -> Result<Client, ClusterError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let options = KubeConfigOptions {
        context: target.context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let config = match (target.kubeconfig, target.context) {
        (Some(path), _) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| ClusterError::Config(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| ClusterError::Config(format!("{}: {e}", path.display())))?
        }
        (None, Some(_)) => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| ClusterError::Config(e.to_string()))?,
        (None, None) => Config::infer()
            .await
            .map_err(|e| ClusterError::Config(e.to_string()))?,
    };
    Client::try_from(config).map_err(|e| ClusterError::Config(e.to_string()))
}

fn api<K>(client: &Client, scope: &Scope) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match scope {
        Scope::All => Api::all(client.clone()),
        Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
    }
}

async fn list<K>(api: &Api<K>, what: &'static str) -> Result<Vec<K>, ClusterError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|source| ClusterError::List { what, source })
}

/// The conditions of an Apisix object of the controller's class (or of no class).
fn apisix<K>(
    objects: &[K],
    kind: &str,
    class: &str,
    status: impl Fn(&K) -> Option<&ApisixStatus>,
    class_of: impl Fn(&K) -> Option<&str>,
) -> Vec<ObjectConditions>
where
    K: Resource,
{
    objects
        .iter()
        .filter(|o| class.is_empty() || class_of(o).is_none_or(|c| c.is_empty() || c == class))
        .map(|o| {
            let meta = o.meta();
            ObjectConditions {
                kind: kind.to_owned(),
                namespace: meta.namespace.clone().unwrap_or_default(),
                name: meta.name.clone().unwrap_or_default(),
                generation: meta.generation,
                conditions: status(o).map(|s| s.conditions.clone()).unwrap_or_default(),
                required: APISIX_REQUIRED,
            }
        })
        .collect()
}

/// Reads the records, the objects in `scope` and their conditions; `ingress_class` is the
/// controller's (`--ingress-class`), which selects objects as the controller does.
pub async fn read(
    client: &Client,
    scope: &Scope,
    ingress_class: &str,
) -> Result<Report, ClusterError> {
    let mut notes = Vec::new();
    // Records live in the controller's namespace, which need not be the objects': look
    // everywhere, or where we may.
    let by_label = ListParams::default().labels(RECORD_LABEL);
    let leases = match Api::<Lease>::all(client.clone()).list(&by_label).await {
        Ok(l) => l.items,
        Err(e) => {
            let ns = match scope {
                Scope::Namespace(ns) => ns.clone(),
                Scope::All => client.default_namespace().to_owned(),
            };
            match Api::<Lease>::namespaced(client.clone(), &ns)
                .list(&by_label)
                .await
            {
                Ok(l) => {
                    notes.push(format!(
                        "cannot list Leases in every namespace ({e}); dataplanes are those \
                         of the records in namespace {ns}"
                    ));
                    l.items
                }
                Err(source) => {
                    return Err(ClusterError::List {
                        what: "Leases (the controller replicas' records)",
                        source,
                    });
                }
            }
        }
    };

    let routes = list(&api::<ApisixRoute>(client, scope), "ApisixRoutes").await?;
    let upstreams = list(&api::<ApisixUpstream>(client, scope), "ApisixUpstreams").await?;
    let tlses = list(&api::<ApisixTls>(client, scope), "ApisixTlses").await?;
    let plugin_configs = list(
        &api::<ApisixPluginConfig>(client, scope),
        "ApisixPluginConfigs",
    )
    .await?;
    let consumers = list(&api::<ApisixConsumer>(client, scope), "ApisixConsumers").await?;
    let global_rules = list(&api::<ApisixGlobalRule>(client, scope), "ApisixGlobalRules").await?;

    let mut objects = Vec::new();
    let class = ingress_class;
    objects.extend(apisix(
        &routes,
        "ApisixRoute",
        class,
        |o| o.status.as_ref(),
        |o| o.spec.ingress_class_name.as_deref(),
    ));
    objects.extend(apisix(
        &upstreams,
        "ApisixUpstream",
        class,
        |o| o.status.as_ref(),
        |o| o.spec.ingress_class_name.as_deref(),
    ));
    objects.extend(apisix(
        &tlses,
        "ApisixTls",
        class,
        |o| o.status.as_ref(),
        |o| o.spec.ingress_class_name.as_deref(),
    ));
    objects.extend(apisix(
        &plugin_configs,
        "ApisixPluginConfig",
        class,
        |o| o.status.as_ref(),
        |o| o.spec.ingress_class_name.as_deref(),
    ));
    objects.extend(apisix(
        &consumers,
        "ApisixConsumer",
        class,
        |o| o.status.as_ref(),
        |o| o.spec.ingress_class_name.as_deref(),
    ));
    objects.extend(apisix(
        &global_rules,
        "ApisixGlobalRule",
        class,
        |o| o.status.as_ref(),
        |o| o.spec.ingress_class_name.as_deref(),
    ));

    // Ingress has no conditions: translate the Ingresses with what the controller reads
    // for them (classes, Services, EndpointSlices, the TLS Secrets they name) and report
    // translation's verdicts, which are what the controller acts on.
    let ingresses = list(&api::<Ingress>(client, scope), "Ingresses").await?;
    if !ingresses.is_empty() {
        let mut state = ClusterState {
            ingresses,
            apisix_plugin_configs: plugin_configs,
            ..ClusterState::default()
        };
        match Api::<IngressClass>::all(client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(l) => state.ingress_classes = l.items,
            Err(e) => notes.push(format!("cannot list IngressClasses: {e}")),
        }
        match list(&api::<Service>(client, scope), "Services").await {
            Ok(s) => state.services = s,
            Err(e) => notes.push(e.to_string()),
        }
        match list(&api::<EndpointSlice>(client, scope), "EndpointSlices").await {
            Ok(s) => state.endpoint_slices = s,
            Err(e) => notes.push(e.to_string()),
        }
        let mut wanted: Vec<(String, String)> = state
            .ingresses
            .iter()
            .flat_map(|i| {
                let ns = i.metadata.namespace.clone().unwrap_or_default();
                i.spec
                    .iter()
                    .flat_map(|s| s.tls.iter().flatten())
                    .filter_map(move |t| t.secret_name.clone().map(|n| (ns.clone(), n)))
            })
            .collect();
        wanted.sort();
        wanted.dedup();
        for (ns, name) in wanted {
            // NB: only the Secrets the Ingresses name, and only to tell a missing one from
            // a present one; nothing of them is printed.
            match Api::<Secret>::namespaced(client.clone(), &ns)
                .get_opt(&name)
                .await
            {
                Ok(Some(s)) => state.secrets.push(s),
                Ok(None) => {}
                Err(e) => notes.push(format!("cannot read Secret {ns}/{name}: {e}")),
            }
        }
        let now = Timestamp::now();
        let translation = translate(&state, &controller_options(ingress_class));
        for i in translation.ingresses {
            objects.push(ObjectConditions {
                kind: "Ingress".to_owned(),
                namespace: i.namespace,
                name: i.name,
                generation: None,
                conditions: i
                    .conditions
                    .iter()
                    .map(|c| Condition {
                        type_: c.type_.clone(),
                        status: c.status.as_str().to_owned(),
                        reason: c.reason.clone(),
                        message: c.message.clone(),
                        observed_generation: None,
                        last_transition_time: Time(now),
                    })
                    .collect(),
                required: INGRESS_REQUIRED,
            });
        }
    }

    let mut report = status::report(&leases, &objects, Timestamp::now());
    report.notes = notes;
    Ok(report)
}

/// Every object the controller reads, in `scope`, kept as the controller keeps them (its
/// class filter, [`sluice_controller::cluster::assemble`]): the input `explain` translates.
/// Secrets that cannot be listed are left out with a note (their certificates and
/// credentials are then missing); nothing read here is printed.
pub async fn read_state(
    client: &Client,
    scope: &Scope,
    ingress_class: &str,
) -> Result<(ClusterState, Vec<String>), ClusterError> {
    use k8s_openapi::api::core::v1::Pod;
    use sluice_controller::cluster::{Inputs, assemble};
    use std::sync::Arc;

    fn arcs<K>(v: Vec<K>) -> Vec<Arc<K>> {
        v.into_iter().map(Arc::new).collect()
    }
    let mut notes = Vec::new();
    let mut inputs = Inputs {
        apisix_routes: arcs(list(&api::<ApisixRoute>(client, scope), "ApisixRoutes").await?),
        apisix_upstreams: arcs(
            list(&api::<ApisixUpstream>(client, scope), "ApisixUpstreams").await?,
        ),
        apisix_tlses: arcs(list(&api::<ApisixTls>(client, scope), "ApisixTlses").await?),
        apisix_plugin_configs: arcs(
            list(
                &api::<ApisixPluginConfig>(client, scope),
                "ApisixPluginConfigs",
            )
            .await?,
        ),
        apisix_consumers: arcs(
            list(&api::<ApisixConsumer>(client, scope), "ApisixConsumers").await?,
        ),
        apisix_global_rules: arcs(
            list(&api::<ApisixGlobalRule>(client, scope), "ApisixGlobalRules").await?,
        ),
        services: arcs(list(&api::<Service>(client, scope), "Services").await?),
        endpoint_slices: arcs(list(&api::<EndpointSlice>(client, scope), "EndpointSlices").await?),
        ingresses: arcs(list(&api::<Ingress>(client, scope), "Ingresses").await?),
        ..Inputs::default()
    };
    match Api::<IngressClass>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(l) => inputs.ingress_classes = arcs(l.items),
        Err(e) => notes.push(format!(
            "cannot list IngressClasses ({e}): objects without a class are left out"
        )),
    }
    // NB: Helm's release records are Secrets too, and large; translation never reads them.
    let secrets = ListParams::default().fields("type!=helm.sh/release.v1");
    match api::<Secret>(client, scope).list(&secrets).await {
        Ok(l) => inputs.secrets = arcs(l.items),
        Err(e) => notes.push(format!(
            "cannot list Secrets ({e}): certificates and credentials kept in Secrets are \
             missing, and objects naming them are rejected here"
        )),
    }
    match api::<Pod>(client, scope)
        .list_metadata(&ListParams::default())
        .await
    {
        Ok(l) => inputs.pods = arcs(l.items),
        Err(e) => notes.push(format!(
            "cannot list Pods ({e}): ApisixUpstream subsets select no endpoint"
        )),
    }
    Ok((assemble(&inputs, ingress_class), notes))
}

/// The kubeconfig context `target` names or the kubeconfig's current one, for messages.
pub fn context_name(target: &Target<'_>) -> Option<String> {
    if let Some(c) = target.context {
        return Some(c.to_owned());
    }
    let kc = match target.kubeconfig {
        Some(path) => Kubeconfig::read_from(path).ok()?,
        None => Kubeconfig::read().ok()?,
    };
    kc.current_context
}
