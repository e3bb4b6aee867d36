//! Sluice's whole-process benchmark harness.
//!
//! Reproduces the APISIX single-worker benchmark on one machine: an nginx
//! origin answering `hello world`, then nginx (the baseline) and the
//! `sluice-dataplane` binary proxying to it in turn, each loaded by
//! `wrk -t1 -c64 --latency` pinned to the other core. Per proxy it records
//! requests/s, latency percentiles, errors, CPU-seconds of the proxy process
//! tree, requests per CPU-second and peak RSS, and the sluice ÷ nginx ratios.
//!
//! The parsers (wrk output, `/proc`, durations) are unit tested; the
//! benchmark itself is run by hand: see `bench/README.md`.
#![forbid(unsafe_code)]

pub mod budget;
pub mod chart;
pub mod conns;
pub mod duration;
pub mod error;
pub mod haproxy;
pub mod machine;
pub mod nginx;
pub mod perf;
pub mod probe;
pub mod process;
pub mod procfs;
pub mod report;
pub mod results;
pub mod runner;
pub mod sluice;
pub mod stream;
pub mod suite;
pub mod tls;
pub mod wrk;

pub use error::BenchError;
