//! The plugin framework: the [`Plugin`] trait and its [`Hooks`], the per-request context,
//! chains and the code that runs their phases, building plugins from configs, consumers,
//! and the state that outlives snapshots. The plugins themselves are the files beside this
//! folder; helpers several plugins share are in `../support`.

pub mod chain;
pub mod consumer;
pub mod context;
pub mod phases;
pub mod plugin;
pub mod registry;
pub mod respond;
pub mod state;

pub use chain::PluginChain;
pub use consumer::{Consumer, ConsumerTable, InvalidConsumer};
pub use context::{BodyRefusal, PluginCtx, ReadBodyError, read_whole_body};
pub use phases::{PluginBody, PluginSlot, backend_phases, request_phases, response_phases};
pub use plugin::{BodyFilter, Flow, Hooks, Instance, PhaseResult, Plugin};
pub use registry::{BuildCtx, Builtin, Registration, UpstreamMap, build, build_sorted, builtin};
pub use respond::{degrade, json_response, rejection, status};
pub use state::{PluginMetadata, PluginState};
