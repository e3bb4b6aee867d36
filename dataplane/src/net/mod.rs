//! Socket and clock primitives shared by the listeners and the upstream connections: write
//! batching of small sends ([`wbatch`]), the per-worker coarse timer ([`timer`]), and the
//! bound on a write a client does not read ([`send_timeout`]); and [`lock`], the one way
//! the dataplane takes a mutex.

pub mod send_timeout;
pub mod timer;
pub mod wbatch;

/// `m`'s guard, whether or not a thread panicked while holding it: no code of the
/// dataplane leaves a guarded value half-changed on a panic, so a poisoned value is still
/// consistent, and a worker must not fail because another one panicked.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
