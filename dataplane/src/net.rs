//! NB: only [`lock`], the one way the dataplane takes a mutex, now `sluice_io::lock`, kept
//! under this path for `plugins/state.rs` while the plugins folder is split on another
//! branch; once that file imports `sluice_io::lock`, this module goes (and `net` leaves
//! `tests/layering.rs`). The I/O plumbing that was here is the `sluice-io` crate.

pub(crate) use sluice_io::lock;
