//! Building plugins from a snapshot's configs: [`Builtin`], what a plugin type declares
//! once (its config schema, whose name and priority it runs under, and its hooks), the
//! [`Registration`] rows of [`crate::plugins::BUILTINS`], and [`build`] / [`build_sorted`].

use std::sync::Arc;

use sluice_plugin_config::{ConfigError, PluginSchema};
use sluice_proto::v1;

use super::consumer::ConsumerTable;
use super::plugin::{Hooks, Instance, Plugin};
use super::state::PluginState;
use crate::plugins::BUILTINS;

/// What a plugin's `build` gets besides its config.
#[derive(Debug)]
pub struct BuildCtx<'a> {
    /// Id of the route (or `global-rule:<id>`, `consumer:<name>`) the plugin is built for.
    pub owner: &'a str,
    /// Process-wide state that outlives snapshots.
    pub state: &'a PluginState,
    /// The snapshot's consumers.
    pub consumers: &'a Arc<ConsumerTable>,
    /// The snapshot's upstreams by id, for plugins that pick one (traffic-split); `None`
    /// where there is no route to pick for (global rules, consumers).
    pub upstreams: Option<&'a UpstreamMap<'a>>,
}

/// A snapshot's compiled upstreams by id.
pub type UpstreamMap<'a> = std::collections::HashMap<&'a str, Arc<crate::upstream::Upstream>>;

/// A built-in plugin type: what it declares once, besides its behaviour ([`Plugin`]).
///
/// Its name and priority are its config schema's ([`PluginSchema::NAME`],
/// [`PluginSchema::PRIORITY`] in `sluice_plugin_config`), so translate and the dataplane
/// cannot disagree; its hooks are [`Builtin::HOOKS`], checked against the methods it
/// overrides by a unit test.
pub trait Builtin: Plugin + Sized + 'static {
    /// Its typed config.
    type Config: PluginSchema;

    /// The [`Plugin`] methods it overrides (exactly those: `plugins::tests` checks) and how
    /// to run them ([`Hooks::ENCODES_BODY`], [`Hooks::REQUEST_HEAD`], [`Hooks::READS_BODY`]).
    const HOOKS: Hooks;

    /// Builds the plugin from its canonical JSON config (parsed once, when a snapshot
    /// compiles, with `sluice_plugin_config::parse_json::<Self::Config>`).
    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError>;

    /// The hooks this instance has: [`Builtin::HOOKS`] less those its config leaves idle
    /// (e.g. a logger without `include_req_body` needs no `before_proxy`). Default: all.
    fn hooks(&self) -> Hooks {
        Self::HOOKS
    }
}

/// One row of [`crate::plugins::BUILTINS`]: a built-in plugin's name, priority and hooks,
/// and how to build it.
#[derive(Clone, Copy)]
pub struct Registration {
    /// APISIX name, e.g. `limit-count`.
    pub name: &'static str,
    /// APISIX priority.
    pub priority: i32,
    /// [`Builtin::HOOKS`].
    pub hooks: Hooks,
    build: fn(&str, &BuildCtx<'_>) -> Result<Instance, ConfigError>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("name", &self.name)
            .field("priority", &self.priority)
            .field("hooks", &self.hooks)
            .finish_non_exhaustive()
    }
}

/// The row of built-in `P`.
pub const fn builtin<P: Builtin>() -> Registration {
    Registration {
        name: P::Config::NAME,
        priority: P::Config::PRIORITY,
        hooks: P::HOOKS,
        build: build_as::<P>,
    }
}

fn build_as<P: Builtin>(json: &str, cx: &BuildCtx<'_>) -> Result<Instance, ConfigError> {
    let plugin = P::build(json, cx)?;
    let hooks = plugin.hooks();
    debug_assert!(
        P::HOOKS.has(hooks),
        "{}: hooks beyond HOOKS",
        P::Config::NAME
    );
    Ok(Instance {
        name: P::Config::NAME,
        priority: P::Config::PRIORITY,
        hooks,
        plugin: Arc::new(plugin),
    })
}

impl Registration {
    /// Builds the plugin from its canonical JSON config.
    pub fn build(&self, json: &str, cx: &BuildCtx<'_>) -> Result<Instance, ConfigError> {
        (self.build)(json, cx)
    }
}

/// Builds plugin `p` for `cx.owner`.
pub fn build(p: &v1::Plugin, cx: &BuildCtx<'_>) -> Result<Instance, ConfigError> {
    let Some(r) = BUILTINS.iter().find(|r| r.name == p.name) else {
        return Err(sluice_plugin_config::not_found(&p.name));
    };
    if !cx.state.is_enabled(&p.name) {
        return Err(ConfigError::NotEnabled(p.name.clone()));
    }
    r.build(&p.config_json, cx)
}

/// Builds `plugins` and sorts them by priority (higher first; equal priorities keep their
/// order).
pub fn build_sorted(
    plugins: &[v1::Plugin],
    cx: &BuildCtx<'_>,
) -> Result<Vec<Instance>, ConfigError> {
    let mut out = Vec::with_capacity(plugins.len());
    for p in plugins {
        out.push(build(p, cx)?);
    }
    out.sort_by_key(|p| std::cmp::Reverse(p.priority));
    Ok(out)
}
