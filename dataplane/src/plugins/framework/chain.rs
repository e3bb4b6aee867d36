//! The plugins of one route compiled into a chain when a snapshot compiles: global rules'
//! and the route's own, each sorted by priority and split by phase, with what the request
//! path must know before it runs them (wrap the body, lend the request body, copy the head).

use std::sync::Arc;

use sluice_proto::v1;

use super::consumer::ConsumerTable;
use super::plugin::{Hooks, Instance};

/// A priority-sorted list of plugins split by phase: each phase's list holds the plugins
/// that implement it ([`Instance::hooks`]), in order.
#[derive(Debug, Default)]
pub(super) struct ByPhase {
    pub(super) rewrite: Box<[Instance]>,
    pub(super) access: Box<[Instance]>,
    pub(super) before_proxy: Box<[Instance]>,
    pub(super) log: Box<[Instance]>,
}

impl ByPhase {
    fn new(plugins: &[Instance]) -> Self {
        let with = |hook: Hooks| -> Box<[Instance]> {
            plugins
                .iter()
                .filter(|p| p.hooks.has(hook))
                .cloned()
                .collect()
        };
        ByPhase {
            rewrite: with(Hooks::REWRITE),
            access: with(Hooks::ACCESS),
            before_proxy: with(Hooks::BEFORE_PROXY),
            log: with(Hooks::LOG),
        }
    }
}

/// The plugins of one route: global rules' and the route's own, each sorted by priority.
#[derive(Debug)]
pub struct PluginChain {
    /// The route id (metrics label, `route_id` variable).
    pub route_id: Arc<str>,
    /// The route's first path pattern (`matched_uri` label).
    pub matched_uri: Arc<str>,
    /// The route's first host pattern (`matched_host` label), empty for any host.
    pub matched_host: Arc<str>,
    /// Plugins of global rules (run first).
    pub global: Vec<Instance>,
    /// The route's plugins.
    pub route: Arc<[Instance]>,
    /// The snapshot's consumers (consumer plugins merge into `route`).
    pub consumers: Arc<ConsumerTable>,
    /// Whether a plugin of `global`, `route` or a consumer logs (the body is wrapped).
    pub(super) wrap_body: bool,
    /// Whether a plugin of `global`, `route` or a consumer reads the request body.
    pub(super) reads_body: bool,
    /// Whether a plugin of `global` or `route` has response phases (a consumer's merged
    /// plugins are checked per request).
    pub(super) response_phases: bool,
    /// Whether a plugin of `global`, `route` or a consumer wants
    /// [`super::PluginCtx::request_head`].
    pub(super) capture_head: bool,
    /// `global` by phase.
    pub(super) global_by: ByPhase,
    /// `route` by phase.
    pub(super) route_by: ByPhase,
}

impl PluginChain {
    /// A chain; `None` when there is nothing to run. A route with plugins on a backend
    /// (`Backend.plugins`) always has one: they run with the request's plugin state.
    pub fn new(
        route: &v1::Route,
        global: Vec<Instance>,
        plugins: Vec<Instance>,
        consumers: Arc<ConsumerTable>,
    ) -> Option<Arc<Self>> {
        let backend_plugins = route.backends.iter().any(|b| !b.plugins.is_empty());
        if global.is_empty() && plugins.is_empty() && !backend_plugins {
            return None;
        }
        // The hooks of every plugin of the chain, and of every consumer's (which may merge in).
        let own = global
            .iter()
            .chain(plugins.iter())
            .fold(Hooks::NONE, |h, p| h.with(p.hooks));
        let any = own.with(consumers.hooks());
        let wrap_body = any.has(Hooks::LOG);
        let response_phases = own.has_any(Hooks::RESPONSE_PHASES);
        let capture_head = any.has(Hooks::REQUEST_HEAD);
        let reads_body = any.has(Hooks::READS_BODY);
        let global_by = ByPhase::new(&global);
        let route_by = ByPhase::new(&plugins);
        Some(Arc::new(PluginChain {
            route_id: Arc::from(route.id.as_str()),
            matched_uri: Arc::from(route.paths.first().map(String::as_str).unwrap_or("")),
            matched_host: Arc::from(route.hosts.first().map(String::as_str).unwrap_or("")),
            global,
            route: Arc::from(plugins),
            consumers,
            wrap_body,
            reads_body,
            response_phases,
            capture_head,
            global_by,
            route_by,
        }))
    }
}

impl PluginChain {
    /// Whether a plugin of the chain (or of a consumer) reads the request body: the request
    /// path then lends it to the request phases ([`super::PluginCtx::read_body`]).
    #[inline]
    pub fn reads_body(&self) -> bool {
        self.reads_body
    }
}
