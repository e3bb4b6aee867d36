//! A coarse timer for request-path timeouts: one per worker, 100 ms resolution, and no
//! system call to arm or disarm a timeout.
//!
//! NB: tokio's timer wakes its driver through an eventfd whenever a new timeout becomes the
//! earliest one, which on a proxy happens for a large share of requests (measured: 0.43
//! extra system calls per proxied request, about 9% of all of them). Request timeouts are
//! seconds long and need no millisecond precision, so here a timeout is an atomic deadline
//! in a list that one sweeper task per worker checks ten times a second. It also serves as
//! hyper's [`hyper::rt::Timer`] (header-read and keep-alive timeouts).
//!
//! Long waits of many idle things (parked keep-alive connections: thousands, each waiting
//! up to the keep-alive limit) go on a second list, swept once a second
//! ([`CoarseTimer::sleep_far`]): a sweep touches every entry of its list, and 9,000 parked
//! connections on the per-tick list cost the worker about 0.6 ms every 100 ms, a stall
//! that the requests in flight then wait out (issue 21: loaded p99 with idle connections).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;

/// How often the sweeper checks deadlines: the most a timeout fires late.
pub const RESOLUTION: Duration = Duration::from_millis(100);

/// How often the sweeper checks the deadlines of [`CoarseTimer::sleep_far`], in ticks.
const FAR_EVERY: u64 = 10;

/// The most a [`CoarseTimer::sleep_far`] fires late.
pub const FAR_RESOLUTION: Duration = Duration::from_millis(100 * FAR_EVERY);

#[derive(Debug)]
struct Inner {
    start: Instant,
    sleepers: Mutex<Vec<Weak<SleepState>>>,
    /// Those of [`CoarseTimer::sleep_far`].
    far: Mutex<Vec<Weak<SleepState>>>,
}

#[derive(Debug)]
struct SleepState {
    /// Milliseconds since `Inner::start`.
    deadline: AtomicU64,
    fired: AtomicBool,
    waker: AtomicWaker,
}

/// A handle to one worker's coarse timer. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CoarseTimer {
    inner: Arc<Inner>,
}

impl Default for CoarseTimer {
    fn default() -> Self {
        Self::new()
    }
}

impl CoarseTimer {
    /// A timer with no sweeper yet; call [`CoarseTimer::run`] on the worker's runtime.
    pub fn new() -> Self {
        CoarseTimer {
            inner: Arc::new(Inner {
                start: Instant::now(),
                sleepers: Mutex::new(Vec::new()),
                far: Mutex::new(Vec::new()),
            }),
        }
    }

    fn now_ms(&self) -> u64 {
        self.inner.start.elapsed().as_millis() as u64
    }

    fn at(&self, deadline: Instant) -> u64 {
        deadline
            .saturating_duration_since(self.inner.start)
            .as_millis() as u64
    }

    /// Fires expired sleeps every [`RESOLUTION`]; runs until the timer is dropped.
    pub async fn run(self) {
        let weak = Arc::downgrade(&self.inner);
        drop(self);
        let mut tick = tokio::time::interval(RESOLUTION);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks: u64 = 0;
        loop {
            tick.tick().await;
            let Some(inner) = weak.upgrade() else { return };
            let now = inner.start.elapsed().as_millis() as u64;
            let mut fire = Vec::new();
            expired(&inner.sleepers, now, &mut fire);
            ticks = ticks.wrapping_add(1);
            if ticks.is_multiple_of(FAR_EVERY) {
                expired(&inner.far, now, &mut fire);
            }
            for s in fire {
                s.fired.store(true, Ordering::Release);
                s.waker.wake();
            }
        }
    }

    /// A future that completes `duration` from now (up to [`RESOLUTION`] later).
    pub fn sleep(&self, duration: Duration) -> CoarseSleep {
        self.sleep_until_ms(self.now_ms().saturating_add(duration.as_millis() as u64))
    }

    /// Like [`CoarseTimer::sleep`], for a long wait that many idle things may share: it
    /// fires up to [`FAR_RESOLUTION`] late, and a sweep every [`RESOLUTION`] does not
    /// touch it.
    pub fn sleep_far(&self, duration: Duration) -> CoarseSleep {
        let deadline = self.now_ms().saturating_add(duration.as_millis() as u64);
        self.sleep_on(&self.inner.far, deadline)
    }

    fn sleep_until_ms(&self, deadline: u64) -> CoarseSleep {
        self.sleep_on(&self.inner.sleepers, deadline)
    }

    fn sleep_on(&self, list: &Mutex<Vec<Weak<SleepState>>>, deadline: u64) -> CoarseSleep {
        let state = Arc::new(SleepState {
            deadline: AtomicU64::new(deadline),
            fired: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        });
        if let Ok(mut sleepers) = list.lock() {
            sleepers.push(Arc::downgrade(&state));
        }
        CoarseSleep {
            timer: self.clone(),
            state,
            polled: false,
        }
    }

    /// Runs `fut` with a deadline `duration` from now; `Err(Elapsed)` when it passed first.
    pub async fn timeout<F: Future>(
        &self,
        duration: Duration,
        fut: F,
    ) -> Result<F::Output, Elapsed> {
        let sleep = self.sleep(duration);
        tokio::pin!(fut);
        tokio::pin!(sleep);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(v) = fut.as_mut().poll(cx) {
                return Poll::Ready(Ok(v));
            }
            match sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }
}

/// Takes the sleeps of `list` whose deadline is `now` or before into `fire`, and forgets
/// dropped ones.
fn expired(list: &Mutex<Vec<Weak<SleepState>>>, now: u64, fire: &mut Vec<Arc<SleepState>>) {
    if let Ok(mut sleepers) = list.lock() {
        sleepers.retain(|w| match w.upgrade() {
            None => false,
            Some(s) if s.deadline.load(Ordering::Relaxed) <= now => {
                fire.push(s);
                false
            }
            Some(_) => true,
        });
    }
}

/// A deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("deadline elapsed")]
pub struct Elapsed;

/// A pending coarse timeout; dropping it cancels it.
#[derive(Debug)]
pub struct CoarseSleep {
    timer: CoarseTimer,
    state: Arc<SleepState>,
    /// Whether the waker is registered; from then on only the sweeper fires the sleep.
    polled: bool,
}

impl Future for CoarseSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.state.fired.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        // NB: the clock is read at the first poll only (a deadline already past completes
        // at once); later polls, one per wake-up of the request's task, just check `fired`
        // (issue 2). The waker of a task does not change, but a future may move between
        // tasks, so it is registered again when it would not wake the same one.
        if !this.polled {
            this.polled = true;
            if this.state.deadline.load(Ordering::Relaxed) <= this.timer.now_ms() {
                return Poll::Ready(());
            }
        }
        this.state.waker.register(cx.waker());
        if this.state.fired.load(Ordering::Acquire) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl hyper::rt::Sleep for CoarseSleep {}

impl hyper::rt::Timer for CoarseTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(CoarseTimer::sleep(self, duration))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.sleep_until_ms(self.at(deadline)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sleeps_fire_after_their_deadline_and_not_before() {
        let timer = CoarseTimer::new();
        tokio::spawn(timer.clone().run());
        let start = Instant::now();
        timer.sleep(Duration::from_millis(250)).await;
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(250),
            "fired early: {waited:?}"
        );
        assert!(
            waited < Duration::from_millis(250) + RESOLUTION * 10,
            "fired far too late: {waited:?}"
        );
    }

    #[tokio::test]
    async fn timeout_returns_the_value_or_elapsed() {
        let timer = CoarseTimer::new();
        tokio::spawn(timer.clone().run());
        assert_eq!(
            timer.timeout(Duration::from_secs(5), async { 7 }).await,
            Ok(7)
        );
        let never = std::future::pending::<()>();
        assert_eq!(
            timer.timeout(Duration::from_millis(150), never).await,
            Err(Elapsed)
        );
    }

    #[tokio::test]
    async fn dropped_sleeps_leave_the_list_at_the_next_sweep() {
        let timer = CoarseTimer::new();
        tokio::spawn(timer.clone().run());
        for _ in 0..1000 {
            drop(timer.sleep(Duration::from_secs(60)));
        }
        tokio::time::sleep(RESOLUTION * 3).await;
        assert_eq!(timer.inner.sleepers.lock().unwrap().len(), 0);
    }

    #[tokio::test]
    async fn far_sleeps_fire_within_their_resolution_and_stay_off_the_per_tick_list() {
        let timer = CoarseTimer::new();
        tokio::spawn(timer.clone().run());
        let start = Instant::now();
        let far = timer.sleep_far(Duration::from_millis(250));
        assert_eq!(timer.inner.sleepers.lock().unwrap().len(), 0);
        assert_eq!(timer.inner.far.lock().unwrap().len(), 1);
        far.await;
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(250),
            "fired early: {waited:?}"
        );
        assert!(
            waited < Duration::from_millis(250) + FAR_RESOLUTION * 3,
            "fired far too late: {waited:?}"
        );
        // Dropped ones are forgotten at the next far sweep.
        for _ in 0..1000 {
            drop(timer.sleep_far(Duration::from_secs(60)));
        }
        tokio::time::sleep(FAR_RESOLUTION * 2 + RESOLUTION).await;
        assert_eq!(timer.inner.far.lock().unwrap().len(), 0);
    }
}
