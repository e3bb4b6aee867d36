//! Socket and clock primitives shared by the listeners and the upstream connections: write
//! batching of small sends ([`wbatch`]), the per-worker coarse timer ([`timer`]), and the
//! bound on a write a client does not read ([`send_timeout`]).

pub mod send_timeout;
pub mod timer;
pub mod wbatch;
