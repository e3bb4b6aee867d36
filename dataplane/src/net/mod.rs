//! Socket and clock primitives shared by the listeners and the upstream connections: write
//! batching of small sends ([`wbatch`]) and the per-worker coarse timer ([`timer`]).

pub mod timer;
pub mod wbatch;
