//! The [`Plugin`] trait: explicit phases with no-op defaults, what a request phase decides
//! ([`Flow`]), the hooks a plugin implements ([`Hooks`]), and a built plugin as chains
//! hold it ([`Instance`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, request, response};

use super::context::PluginCtx;
use crate::upstream::body::ProxyBody;

/// The outcome of a request phase that may have to wait (e.g. for Redis).
pub type PhaseResult = Result<(), Box<Response<ProxyBody>>>;

/// What a request phase decided.
pub enum Flow<'a> {
    /// Go on with the next plugin.
    Continue,
    /// Answer the client with this response; later request phases and the upstream are
    /// skipped (response phases and log still run).
    Respond(Box<Response<ProxyBody>>),
    /// The decision needs I/O; await it. Only plugins that really wait allocate this.
    Pending(Pin<Box<dyn Future<Output = PhaseResult> + Send + 'a>>),
}

impl Flow<'_> {
    /// Answers the client with `resp`.
    pub fn respond(resp: Response<ProxyBody>) -> Self {
        Flow::Respond(Box::new(resp))
    }
}

impl std::fmt::Debug for Flow<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Flow::Continue => f.write_str("Continue"),
            Flow::Respond(r) => write!(f, "Respond({})", r.status()),
            Flow::Pending(_) => f.write_str("Pending"),
        }
    }
}

/// The hooks a plugin implements: the [`Plugin`] methods it overrides, and how its response
/// and log phases must be run. A chain calls a plugin only for the hooks it has.
///
/// A built-in plugin declares them once, as [`super::registry::Builtin::HOOKS`]; a unit test
/// (`plugins::tests`) calls every method of every built-in and checks that the methods it
/// overrides are exactly the method hooks it declares.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Hooks(u16);

impl Hooks {
    /// None (e.g. a plugin that only keeps state).
    pub const NONE: Hooks = Hooks(0);
    /// [`Plugin::rewrite`].
    pub const REWRITE: Hooks = Hooks(1);
    /// [`Plugin::access`].
    pub const ACCESS: Hooks = Hooks(1 << 1);
    /// [`Plugin::before_proxy`].
    pub const BEFORE_PROXY: Hooks = Hooks(1 << 2);
    /// [`Plugin::response_headers`].
    pub const RESPONSE_HEADERS: Hooks = Hooks(1 << 3);
    /// [`Plugin::body_filter`].
    pub const BODY_FILTER: Hooks = Hooks(1 << 4);
    /// [`Plugin::log`]: the body is wrapped so that the log phase runs at its end.
    pub const LOG: Hooks = Hooks(1 << 5);
    /// The plugin encodes the response (gzip): its response phases run after every other
    /// plugin's, so it sees the final headers and body (as nginx's gzip filter runs after
    /// the Lua filters).
    pub const ENCODES_BODY: Hooks = Hooks(1 << 6);
    /// The log phase needs the request head as it arrived ([`PluginCtx::request_head`]): a
    /// chain with such a plugin copies it before the request phases (an allocation per
    /// request, so only then).
    pub const REQUEST_HEAD: Hooks = Hooks(1 << 7);
    /// A request phase reads the request body ([`PluginCtx::read_body`]): the request path
    /// then lends the body to the phases of the routes with this plugin. Without it plugins
    /// see the head only and the body streams upstream.
    pub const READS_BODY: Hooks = Hooks(1 << 8);
    /// The methods of the three request phases.
    pub const REQUEST_PHASES: Hooks = Hooks(0b111);
    /// The methods of the response phases.
    pub const RESPONSE_PHASES: Hooks = Hooks(0b11 << 3);
    /// Every hook that is a method of [`Plugin`] (the others describe how to run them).
    pub const METHODS: Hooks = Hooks(0b11_1111);

    /// Both sets.
    pub const fn with(self, other: Hooks) -> Hooks {
        Hooks(self.0 | other.0)
    }

    /// The hooks of `self` that are also in `other`.
    pub const fn and(self, other: Hooks) -> Hooks {
        Hooks(self.0 & other.0)
    }

    /// `self` without the hooks of `other`.
    pub const fn without(self, other: Hooks) -> Hooks {
        Hooks(self.0 & !other.0)
    }

    /// Whether every hook of `other` is in `self`.
    pub const fn has(self, other: Hooks) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether some hook of `other` is in `self`.
    pub const fn has_any(self, other: Hooks) -> bool {
        self.0 & other.0 != 0
    }
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const NAMES: [&str; 9] = [
            "rewrite",
            "access",
            "before_proxy",
            "response_headers",
            "body_filter",
            "log",
            "encodes_body",
            "request_head",
            "reads_body",
        ];
        let on = NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, n)| *n);
        f.debug_set().entries(on).finish()
    }
}

/// A streaming transformation of the response body, made per request by
/// [`Plugin::body_filter`].
pub trait BodyFilter: Send {
    /// Transforms one chunk (may return an empty chunk to hold data back).
    fn data(&mut self, chunk: Bytes, ctx: &mut PluginCtx) -> Bytes;
    /// The body ended: anything still held back. Default: nothing.
    fn end(&mut self, _ctx: &mut PluginCtx) -> Option<Bytes> {
        None
    }

    /// Whether the filter forwards every byte unchanged (a tee): the response then keeps
    /// its `Content-Length`. Default false.
    fn keeps_length(&self) -> bool {
        false
    }
}

/// A plugin's behaviour: built from its typed config when a snapshot compiles and shared
/// by every request of the route. Every phase has a no-op default; a plugin overrides the
/// ones it needs and declares them as its [`Hooks`] (chains call nothing else).
///
/// NB: each call through `dyn Plugin` is an indirect branch and ~12 instructions; a route
/// with limit-count and prometheus made five calls that did nothing (issue 4), hence the
/// hooks.
pub trait Plugin: Send + Sync + std::fmt::Debug {
    /// Rewrite phase: change the request, identify the consumer (auth plugins).
    fn rewrite<'a>(&'a self, _req: &'a mut request::Parts, _ctx: &'a mut PluginCtx) -> Flow<'a> {
        #[cfg(test)]
        probe::default_ran(Hooks::REWRITE);
        Flow::Continue
    }

    /// Access phase: allow, deny or delay (limits, restrictions).
    fn access<'a>(&'a self, _req: &'a mut request::Parts, _ctx: &'a mut PluginCtx) -> Flow<'a> {
        #[cfg(test)]
        probe::default_ran(Hooks::ACCESS);
        Flow::Continue
    }

    /// Before proxy: last changes to the request head that goes upstream.
    fn before_proxy(&self, _req: &mut request::Parts, _ctx: &mut PluginCtx) {
        #[cfg(test)]
        probe::default_ran(Hooks::BEFORE_PROXY);
    }

    /// Response headers phase: the response head (upstream's, an error's, or a plugin's).
    fn response_headers(&self, _resp: &mut response::Parts, _ctx: &mut PluginCtx) {
        #[cfg(test)]
        probe::default_ran(Hooks::RESPONSE_HEADERS);
    }

    /// A streaming body filter for this response, if the plugin transforms bodies.
    fn body_filter(&self, _ctx: &mut PluginCtx) -> Option<Box<dyn BodyFilter>> {
        #[cfg(test)]
        probe::default_ran(Hooks::BODY_FILTER);
        None
    }

    /// Log phase: after the response body was sent (or the client went away).
    fn log(&self, _ctx: &mut PluginCtx) {
        #[cfg(test)]
        probe::default_ran(Hooks::LOG);
    }
}

/// A plugin built for one route, global rule or consumer, as chains hold it: its behaviour
/// and what a chain must know without calling it (its name, priority and hooks, read from
/// here rather than through `dyn Plugin`).
#[derive(Debug, Clone)]
pub struct Instance {
    /// APISIX name, e.g. `limit-count`.
    pub name: &'static str,
    /// APISIX priority: within a phase, higher runs first.
    pub priority: i32,
    /// The hooks this instance has.
    pub hooks: Hooks,
    /// The behaviour.
    pub plugin: Arc<dyn Plugin>,
}

impl Instance {
    /// A plugin that is not a built-in (tests, tools): `hooks` must name the methods it
    /// overrides.
    pub fn new(name: &'static str, priority: i32, hooks: Hooks, plugin: Arc<dyn Plugin>) -> Self {
        Instance {
            name,
            priority,
            hooks,
            plugin,
        }
    }

    /// APISIX name, e.g. `limit-count`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// APISIX priority: within a phase, higher runs first.
    pub fn priority(&self) -> i32 {
        self.priority
    }
}

impl std::ops::Deref for Instance {
    type Target = dyn Plugin;

    #[inline]
    fn deref(&self) -> &Self::Target {
        &*self.plugin
    }
}

/// Which default (no-op) methods of [`Plugin`] ran on this thread: how the unit test of
/// the registry tells the methods a plugin overrides.
#[cfg(test)]
pub(crate) mod probe {
    use std::cell::Cell;

    use super::Hooks;

    thread_local! {
        static RAN: Cell<Hooks> = const { Cell::new(Hooks::NONE) };
    }

    /// A default method ran.
    pub(crate) fn default_ran(hook: Hooks) {
        RAN.with(|r| r.set(r.get().with(hook)));
    }

    /// The defaults that ran since the last call.
    pub(crate) fn take() -> Hooks {
        RAN.with(|r| r.replace(Hooks::NONE))
    }
}
