//! The I/O plumbing of the Sluice dataplane below hyper: what talks to the kernel and the
//! allocator, apart from the dataplane's policy, so that the dataplane crate itself is
//! `#![forbid(unsafe_code)]`.
//!
//! - [`wbatch`]: write batching of small sends per event-loop turn (send(2), io_uring).
//! - [`timer`]: the per-worker coarse timer (request timeouts, hyper's timer).
//! - [`send_timeout`]: the bound on a write a client does not read.
//! - [`park`]: the stream wrapper that parks an idle HTTP/1.1 keep-alive connection
//!   without its buffers.
//! - [`h1`]: the HTTP/1.1 client codec and connection of the upstream path (response head
//!   parser, request head encoder, body decoder), fuzzed against hyper and httparse
//!   (`dataplane/fuzz`).
//! - [`headers`]: the header rules every protocol path shares (hop-by-hop headers, the
//!   forwarding headers a proxy adds).
//! - [`allocator`]: the global allocator (mimalloc's calls), heap trimming and the
//!   transparent-huge-pages switch.
//! - [`lock`]: the one way the dataplane takes a mutex.
//!
//! Nothing here knows about routes, plugins or configuration; the dataplane passes values
//! down (a timeout, a policy) instead.

// NB: `deny`, not `forbid`: the exceptions are [`wbatch`], whose system calls (send(2),
// io_uring submissions) are `unsafe` FFI, and [`allocator`] (mimalloc's calls, prctl(2),
// malloc_trim(3)), each allowed where it stands with its safety argument.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod allocator;
pub mod h1;
pub mod headers;
pub mod park;
pub mod send_timeout;
pub mod timer;
pub mod wbatch;

/// `m`'s guard, whether or not a thread panicked while holding it: no code of the
/// dataplane leaves a guarded value half-changed on a panic, so a poisoned value is still
/// consistent, and a worker must not fail because another one panicked.
#[inline]
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
