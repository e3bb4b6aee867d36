//! Plugins in translation: route/plugin-config/global-rule/consumer plugin lists (with
//! `enable`, `secretRef` merging and validation by `sluice-plugin-config`),
//! ApisixPluginConfig references with APISIX's merge order, `authentication`, and
//! ApisixConsumer credentials.
//!
//! Merge order of a rule's plugins (a later source overrides an earlier plugin of the same
//! name): the referenced ApisixPluginConfig, then the rule's `plugins`, then the plugin that
//! `authentication` implies.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Secret;
use serde_json::{Map, Value};
use sluice_crds::{ApisixConsumer, ApisixRouteAuthentication, ApisixRoutePlugin, AuthType};
use sluice_proto::v1;

use crate::json;
use crate::problems::Problems;

type Secrets<'a> = BTreeMap<(&'a str, &'a str), &'a Secret>;

/// Where a plugin list is used; consumers validate credentials with the consumer schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A route or plugin config.
    Route,
    /// An ApisixGlobalRule.
    GlobalRule,
    /// A consumer's `plugins[]`.
    Consumer,
}

/// Translates `plugins` (field prefix `field`, e.g. `spec.http[0].plugins`): disabled ones are
/// left out, `secretRef`s merged, each config validated. Errors go to `problems`.
pub(crate) fn plugin_list(
    plugins: &[ApisixRoutePlugin],
    ns: &str,
    field: &str,
    secrets: &Secrets<'_>,
    owner: Owner,
    problems: &mut Problems,
) -> Vec<v1::Plugin> {
    let mut out = Vec::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (j, p) in plugins.iter().enumerate() {
        let field = format!("{field}[{j}]");
        if p.name.is_empty() {
            problems.error(format!("{field}.name"), "must not be empty");
            continue;
        }
        if let Some(first) = seen.insert(&p.name, j) {
            problems.error(
                format!("{field}.name"),
                format!(
                    "plugin {:?} is listed twice (also {}[{first}])",
                    p.name,
                    field.rsplit_once('[').map_or("", |(f, _)| f)
                ),
            );
            continue;
        }
        if !p.enable {
            continue;
        }
        if owner != Owner::Route && p.name == "traffic-split" {
            problems.error(
                format!("{field}.name"),
                "traffic-split picks a route's upstream, so it only works in an ApisixRoute's \
                 plugins or an ApisixPluginConfig a route references",
            );
            continue;
        }
        let Some(config) = plugin_config(p, ns, &field, secrets, owner, problems) else {
            continue;
        };
        out.push(v1::Plugin {
            name: p.name.clone(),
            config_json: json::canonical(&config),
        });
    }
    out
}

/// The config of plugin `p` (`field`), its `secretRef` merged in, validated; `None` (with
/// the error in `problems`) when it is not usable.
fn plugin_config(
    p: &ApisixRoutePlugin,
    ns: &str,
    field: &str,
    secrets: &Secrets<'_>,
    owner: Owner,
    problems: &mut Problems,
) -> Option<Value> {
    let mut config = p.config.clone().unwrap_or_default();
    if let Some(secret_name) = &p.secret_ref {
        let field = format!("{field}.secretRef");
        let Some(secret) = secrets.get(&(ns, secret_name.as_str())) else {
            problems.error(
                field,
                format!(
                    "Secret {ns}/{secret_name} not found (the rule is rejected rather than served with an incomplete plugin config)"
                ),
            );
            return None;
        };
        if let Err(e) = merge_secret(&mut config, secret) {
            problems.error(field, format!("Secret {ns}/{secret_name}: {e}"));
            return None;
        }
    }
    let config = Value::Object(config);
    let checked = match owner {
        Owner::Consumer if sluice_plugin_config::is_auth(&p.name) => {
            sluice_plugin_config::validate_consumer(&p.name, &config)
        }
        _ => sluice_plugin_config::validate(&p.name, &config),
    };
    if let Err(e) = checked {
        let at = match e {
            sluice_plugin_config::ConfigError::UnknownPlugin(_)
            | sluice_plugin_config::ConfigError::Refused(_) => "name",
            _ => "config",
        };
        problems.error(format!("{field}.{at}"), e.to_string());
        return None;
    }
    Some(config)
}

/// Overrides `config` with the Secret's keys (`data`, then `stringData`, as the API server
/// merges them); dotted keys set nested fields. Values are strings.
pub(crate) fn merge_secret(config: &mut Map<String, Value>, secret: &Secret) -> Result<(), String> {
    for (k, v) in secret_entries(secret)? {
        json::set_dotted(config, k, Value::String(v))?;
    }
    Ok(())
}

fn secret_entries(secret: &Secret) -> Result<BTreeMap<&str, String>, String> {
    let mut entries: BTreeMap<&str, String> = BTreeMap::new();
    for (k, v) in secret.data.iter().flatten() {
        let text =
            String::from_utf8(v.0.clone()).map_err(|_| format!("key {k:?} is not UTF-8 text"))?;
        entries.insert(k, text);
    }
    for (k, v) in secret.string_data.iter().flatten() {
        entries.insert(k, v.clone());
    }
    Ok(entries)
}

/// `base` overridden by `over`, plugin by plugin (order: base's, then new names of `over`).
pub(crate) fn merge(base: Vec<v1::Plugin>, over: Vec<v1::Plugin>) -> Vec<v1::Plugin> {
    let mut out = base;
    for p in over {
        match out.iter_mut().find(|q| q.name == p.name) {
            Some(q) => *q = p,
            None => out.push(p),
        }
    }
    out
}

/// The plugin `authentication` implies, as the APISIX ingress controller maps it.
pub(crate) fn authentication(
    auth: &ApisixRouteAuthentication,
    field: &str,
    problems: &mut Problems,
) -> Option<v1::Plugin> {
    if !auth.enable {
        return None;
    }
    let (name, config) = match auth.type_ {
        AuthType::KeyAuth => {
            let mut c = Map::new();
            if let Some(h) = auth.key_auth.as_ref().and_then(|k| k.header.clone()) {
                c.insert("header".into(), Value::String(h));
            }
            ("key-auth", c)
        }
        AuthType::BasicAuth => ("basic-auth", Map::new()),
        AuthType::JwtAuth => {
            let mut c = Map::new();
            if let Some(j) = &auth.jwt_auth {
                for (k, v) in [
                    ("header", &j.header),
                    ("query", &j.query),
                    ("cookie", &j.cookie),
                ] {
                    if let Some(v) = v {
                        c.insert(k.into(), Value::String(v.clone()));
                    }
                }
            }
            ("jwt-auth", c)
        }
        // NB: the route's hmac-auth settings (clock_skew, signed_headers, ...) come from a
        // `plugins` entry; `authentication` adds the plugin with APISIX's defaults.
        AuthType::HmacAuth => ("hmac-auth", Map::new()),
        other => {
            problems.error(
                format!("{field}.type"),
                format!(
                    "{other:?} is not supported (supported: keyAuth, basicAuth, jwtAuth, hmacAuth); the rule is rejected rather than served without authentication"
                ),
            );
            return None;
        }
    };
    let config = Value::Object(config);
    if let Err(e) = sluice_plugin_config::validate(name, &config) {
        problems.error(field, e.to_string());
        return None;
    }
    Some(v1::Plugin {
        name: name.into(),
        config_json: json::canonical(&config),
    })
}

/// The consumer name APISIX's ingress controller gives an ApisixConsumer.
pub(crate) fn consumer_name(ns: &str, name: &str) -> String {
    format!("{ns}_{name}")
}

/// Translates one ApisixConsumer; `None` when invalid (errors in `problems`).
pub(crate) fn consumer(
    ac: &ApisixConsumer,
    ns: &str,
    name: &str,
    secrets: &Secrets<'_>,
    problems: &mut Problems,
) -> Option<v1::Consumer> {
    let before = problems.errors.len();
    let ap = &ac.spec.auth_parameter;
    let mut creds: Vec<v1::Plugin> = Vec::new();
    let field = "spec.authParameter";
    macro_rules! credential {
        ($opt:expr, $key:literal, $plugin:literal) => {
            if let Some(c) = &$opt {
                let f = format!("{field}.{}", $key);
                if let Some(p) = credential(
                    c.value.as_ref(),
                    c.secret_ref.as_ref().map(|r| r.name.as_str()),
                    $plugin,
                    ns,
                    &f,
                    secrets,
                    problems,
                ) {
                    creds.push(p);
                }
            }
        };
    }
    credential!(ap.key_auth, "keyAuth", "key-auth");
    credential!(ap.basic_auth, "basicAuth", "basic-auth");
    credential!(ap.jwt_auth, "jwtAuth", "jwt-auth");
    credential!(ap.hmac_auth, "hmacAuth", "hmac-auth");
    for (opt, key) in [
        (ap.ldap_auth.is_some(), "ldapAuth"),
        (ap.wolf_rbac.is_some(), "wolfRBAC"),
    ] {
        if opt {
            problems.error(
                format!("{field}.{key}"),
                "not supported (supported: keyAuth, basicAuth, jwtAuth, hmacAuth)",
            );
        }
    }
    if creds.is_empty() && problems.errors.len() == before {
        problems.error(
            field,
            "one of keyAuth, basicAuth, jwtAuth or hmacAuth is required",
        );
    }
    let plugins = plugin_list(
        &ac.spec.plugins,
        ns,
        "spec.plugins",
        secrets,
        Owner::Consumer,
        problems,
    );
    if problems.errors.len() > before {
        return None;
    }
    let mut all = merge(plugins, creds);
    all.sort_by(|a, b| a.name.cmp(&b.name));
    Some(v1::Consumer {
        name: consumer_name(ns, name),
        plugins: all,
    })
}

/// (plugin, identifying value) of each credential of `c`: the key-auth `key`, basic-auth
/// `username`, jwt-auth `key`, hmac-auth `key_id` (or its 2.x name `access_key`).
pub(crate) fn credential_ids(c: &v1::Consumer) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in &c.plugins {
        let fields: &[&str] = match p.name.as_str() {
            "key-auth" | "jwt-auth" => &["key"],
            "basic-auth" => &["username"],
            "hmac-auth" => &["key_id", "access_key"],
            _ => continue,
        };
        if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(&p.config_json)
            && let Some(v) = fields
                .iter()
                .find_map(|f| m.get(*f).and_then(Value::as_str))
        {
            out.push((p.name.clone(), v.to_owned()));
        }
    }
    out
}

fn credential<T: serde::Serialize>(
    value: Option<&T>,
    secret_ref: Option<&str>,
    plugin: &str,
    ns: &str,
    field: &str,
    secrets: &Secrets<'_>,
    problems: &mut Problems,
) -> Option<v1::Plugin> {
    let config = match (value, secret_ref) {
        (Some(_), Some(_)) => {
            problems.error(field, "set either value or secretRef, not both");
            return None;
        }
        (None, None) => {
            problems.error(field, "one of value or secretRef is required");
            return None;
        }
        (Some(v), None) => match serde_json::to_value(v) {
            Ok(Value::Object(m)) => m,
            _ => {
                problems.error(format!("{field}.value"), "must be an object");
                return None;
            }
        },
        (None, Some(name)) => {
            let Some(secret) = secrets.get(&(ns, name)) else {
                problems.error(
                    format!("{field}.secretRef"),
                    format!("Secret {ns}/{name} not found"),
                );
                return None;
            };
            let mut m = Map::new();
            match secret_entries(secret) {
                Ok(entries) => {
                    for (k, v) in entries {
                        m.insert(k.to_owned(), Value::String(v));
                    }
                }
                Err(e) => {
                    problems.error(
                        format!("{field}.secretRef"),
                        format!("Secret {ns}/{name}: {e}"),
                    );
                    return None;
                }
            }
            m
        }
    };
    // Unset optional fields serialize as nothing; drop explicit nulls so defaults apply.
    let config: Map<String, Value> = config.into_iter().filter(|(_, v)| !v.is_null()).collect();
    let config = Value::Object(config);
    if let Err(e) = sluice_plugin_config::validate_consumer(plugin, &config) {
        problems.error(field, e.to_string());
        return None;
    }
    Some(v1::Plugin {
        name: plugin.into(),
        config_json: json::canonical(&config),
    })
}
