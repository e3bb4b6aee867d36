//! Configuration, flowing in from the side of the request path: a snapshot (from the
//! controller or from YAML files) compiled into an immutable [`table::RouteTable`] off the
//! request path and swapped in whole by the [`store::Store`]; a request reads the current
//! table once.
//!
//! - [`controller_client`]: the gRPC snapshot channel to the controller (ACK / NACK).
//! - [`standalone`]: the same translate pipeline as the controller, fed from YAML files.
//! - [`table`]: a snapshot compiled for serving (router, upstreams, plugin chains,
//!   [`certs`], [`sections`]).
//! - [`stream`]: the layer-4 routes of a snapshot, per listener.
//! - [`store`]: the live table, the last good snapshot on disk, and [`metrics`].
//! - [`redact`]: the copy of a snapshot that may be shown (no keys, no credentials).
//!
//! This layer imports the router, the plugins and the upstreams (to compile them); none of
//! those imports it.

pub mod certs;
pub mod controller_client;
pub mod metrics;
pub mod redact;
pub mod sections;
pub mod standalone;
pub mod store;
pub mod stream;
pub mod table;
