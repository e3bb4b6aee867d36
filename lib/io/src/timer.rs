//! A coarse timer for request-path timeouts: one per worker, 100 ms resolution, and no
//! system call to arm or disarm a timeout.
//!
//! NB: tokio's timer wakes its driver through an eventfd whenever a new timeout becomes the
//! earliest one, which on a proxy happens for a large share of requests (measured: 0.43
//! extra system calls per proxied request, about 9% of all of them). Request timeouts are
//! seconds long and need no millisecond precision, so here a timeout is a deadline in a
//! slot of a list that one sweeper task per worker checks ten times a second; a dropped
//! timeout gives its slot back at once, so arming one allocates nothing. It also serves as
//! hyper's [`hyper::rt::Timer`] (header-read and keep-alive timeouts).
//!
//! Arming a timeout reads no clock either: deadlines count from the time of the last sweep,
//! which the sweeper keeps, plus one [`RESOLUTION`] for the time since, so a timeout fires
//! between its duration and two resolutions past it (never early while the sweeper keeps
//! its pace; a worker stalled longer than a resolution can fire one early by the excess).
//! A request arms about three and polls each; reading the clock for each cost ~70
//! instructions and a vDSO call, seven times per proxied request (issue 21).
//!
//! Long waits of many idle things (parked keep-alive connections: thousands, each waiting
//! up to the keep-alive limit) go on a second list, swept once a second
//! ([`CoarseTimer::sleep_far`]): a sweep touches every entry of its list, and 9,000 parked
//! connections on the per-tick list cost the worker about 0.6 ms every 100 ms, a stall
//! that the requests in flight then wait out (issue 21: loaded p99 with idle connections).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::lock;

/// How often the sweeper checks deadlines; a timeout fires up to twice this late (see the
/// module's documentation).
pub const RESOLUTION: Duration = Duration::from_millis(100);

const RESOLUTION_MS: u64 = RESOLUTION.as_millis() as u64;

/// How often the sweeper checks the deadlines of [`CoarseTimer::sleep_far`], in ticks.
const FAR_EVERY: u64 = 10;

/// How often the sweeper checks the far list: a [`CoarseTimer::sleep_far`] fires up to this
/// and one [`RESOLUTION`] late.
pub const FAR_RESOLUTION: Duration = Duration::from_millis(100 * FAR_EVERY);

#[derive(Debug)]
struct Inner {
    start: Instant,
    /// Milliseconds since `start` at the last sweep.
    swept: AtomicU64,
    near: Mutex<Slots>,
    /// Those of [`CoarseTimer::sleep_far`].
    far: Mutex<Slots>,
}

/// The pending sleeps of one list, in reusable slots: a sleep takes a free slot and gives
/// it back when dropped.
///
/// NB: no allocation per sleep. Each sleep used to be an `Arc` that its list referred to
/// weakly until the next sweep; a request arms about three (upstream read, body and send
/// timeouts), so each request allocated three times, and the dropped sleeps' memory stayed
/// allocated until the sweep: about 100 ms worth of them, cold in the caches when the
/// sweep walked them (issue 21: keep-alive `send` and churn).
#[derive(Debug, Default)]
struct Slots {
    slots: Vec<Slot>,
    /// Indexes of the free slots.
    free: Vec<u32>,
}

#[derive(Debug, Default)]
struct Slot {
    /// Milliseconds since `Inner::start`.
    deadline: u64,
    /// Whether a sleep holds the slot.
    live: bool,
    fired: bool,
    waker: Option<Waker>,
}

impl Slots {
    /// A slot for a sleep until `deadline`.
    fn take(&mut self, deadline: u64) -> u32 {
        let slot = Slot {
            deadline,
            live: true,
            fired: false,
            waker: None,
        };
        if let Some(i) = self.free.pop()
            && let Some(s) = self.slots.get_mut(i as usize)
        {
            *s = slot;
            return i;
        }
        self.slots.push(slot);
        // NB: more than u32::MAX sleeps at once would need that many slots in memory (128 GiB).
        u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
    }

    /// Gives slot `i` back; returns its waker, to be dropped outside the lock.
    fn give_back(&mut self, i: u32) -> Option<Waker> {
        let s = self.slots.get_mut(i as usize)?;
        if !s.live {
            return None;
        }
        s.live = false;
        s.fired = false;
        self.free.push(i);
        s.waker.take()
    }

    /// Marks the live sleeps whose deadline is `now` or before as fired and takes their
    /// wakers into `fire`; then drops the trailing free slots (and gives memory back when
    /// the list shrank to a quarter).
    fn expire(&mut self, now: u64, fire: &mut Vec<Waker>) {
        for s in &mut self.slots {
            if s.live && !s.fired && s.deadline <= now {
                s.fired = true;
                fire.extend(s.waker.take());
            }
        }
        let len = self.slots.len();
        while self.slots.last().is_some_and(|s| !s.live) {
            self.slots.pop();
        }
        if self.slots.len() != len {
            let len = self.slots.len();
            self.free.retain(|&i| (i as usize) < len);
            if self.slots.capacity() > 4 * len.max(64) {
                self.slots.shrink_to(2 * len);
                self.free.shrink_to(len);
            }
        }
    }

    /// Live sleeps in the list.
    #[cfg(test)]
    fn live(&self) -> usize {
        self.slots.iter().filter(|s| s.live).count()
    }
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
                swept: AtomicU64::new(0),
                near: Mutex::new(Slots::default()),
                far: Mutex::new(Slots::default()),
            }),
        }
    }

    /// The time of the last sweep, milliseconds since `start` (no clock read).
    fn swept_ms(&self) -> u64 {
        self.inner.swept.load(Ordering::Relaxed)
    }

    /// The deadline of a sleep of `duration` armed now: from the last sweep, plus a
    /// resolution for the time since then (none for a zero duration, which fires at its
    /// first poll).
    fn deadline_in(&self, duration: Duration) -> u64 {
        let ms = duration.as_millis() as u64;
        let slack = if ms == 0 { 0 } else { RESOLUTION_MS };
        self.swept_ms().saturating_add(ms).saturating_add(slack)
    }

    fn at(&self, deadline: Instant) -> u64 {
        let ms = deadline
            .saturating_duration_since(self.inner.start)
            .as_millis() as u64;
        if ms <= self.swept_ms() {
            ms
        } else {
            ms.saturating_add(RESOLUTION_MS)
        }
    }

    /// Fires expired sleeps every [`RESOLUTION`]; runs until the timer is dropped.
    pub async fn run(self) {
        let weak = Arc::downgrade(&self.inner);
        drop(self);
        let mut tick = tokio::time::interval(RESOLUTION);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks: u64 = 0;
        let mut fire = Vec::new();
        loop {
            tick.tick().await;
            let Some(inner) = weak.upgrade() else { return };
            let now = inner.start.elapsed().as_millis() as u64;
            inner.swept.store(now, Ordering::Relaxed);
            lock(&inner.near).expire(now, &mut fire);
            ticks = ticks.wrapping_add(1);
            if ticks.is_multiple_of(FAR_EVERY) {
                lock(&inner.far).expire(now, &mut fire);
            }
            for w in fire.drain(..) {
                w.wake();
            }
        }
    }

    /// A future that completes `duration` from now (up to two [`RESOLUTION`]s later).
    #[inline]
    pub fn sleep(&self, duration: Duration) -> CoarseSleep {
        self.sleep_until_ms(self.deadline_in(duration))
    }

    /// Like [`CoarseTimer::sleep`], for a long wait that many idle things may share: it
    /// fires up to [`FAR_RESOLUTION`] (and a [`RESOLUTION`]) late, and a sweep every
    /// [`RESOLUTION`] does not touch it.
    #[inline]
    pub fn sleep_far(&self, duration: Duration) -> CoarseSleep {
        self.sleep_on(true, self.deadline_in(duration))
    }

    fn sleep_until_ms(&self, deadline: u64) -> CoarseSleep {
        self.sleep_on(false, deadline)
    }

    fn list(&self, far: bool) -> &Mutex<Slots> {
        if far {
            &self.inner.far
        } else {
            &self.inner.near
        }
    }

    fn sleep_on(&self, far: bool, deadline: u64) -> CoarseSleep {
        let slot = lock(self.list(far)).take(deadline);
        CoarseSleep {
            timer: self.clone(),
            slot,
            far,
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

/// A deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("deadline elapsed")]
pub struct Elapsed;

/// A pending coarse timeout; dropping it cancels it (and frees its slot).
#[derive(Debug)]
pub struct CoarseSleep {
    timer: CoarseTimer,
    slot: u32,
    far: bool,
    /// Whether it was polled (the first poll checks the deadline against the last sweep).
    polled: bool,
}

impl Future for CoarseSleep {
    type Output = ();

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        // NB: the first poll completes a deadline already past (a zero duration) against
        // the last sweep's time; later polls, one per wake-up of the request's task, just
        // check `fired` (issue 2).
        let now = if this.polled {
            None
        } else {
            this.polled = true;
            Some(this.timer.swept_ms())
        };
        let mut list = lock(this.timer.list(this.far));
        let Some(slot) = list.slots.get_mut(this.slot as usize) else {
            return Poll::Ready(());
        };
        if slot.fired || now.is_some_and(|now| slot.deadline <= now) {
            return Poll::Ready(());
        }
        // The waker of a task does not change, but a future may move between tasks, so
        // it is kept again when it would not wake the same one.
        match &slot.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => slot.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl Drop for CoarseSleep {
    #[inline]
    fn drop(&mut self) {
        let waker = lock(self.timer.list(self.far)).give_back(self.slot);
        drop(waker);
    }
}

impl hyper::rt::Sleep for CoarseSleep {}

/// hyper's header-read and keep-alive deadlines count from the last sweep, as the timer's
/// own do (up to a [`RESOLUTION`] before the true time; [`CoarseTimer::sleep_until`] adds
/// it back).
impl hyper::rt::Timer for CoarseTimer {
    fn now(&self) -> Instant {
        self.inner.start + Duration::from_millis(self.swept_ms())
    }

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

    /// A zero sleep completes at its first poll, sweeper or not; hyper's clock is the last
    /// sweep's, never ahead of the true time and at most about a resolution behind it.
    #[tokio::test]
    async fn a_zero_sleep_is_due_at_once_and_hypers_clock_is_the_sweeps() {
        use hyper::rt::Timer as _;
        let timer = CoarseTimer::new();
        assert!(futures::poll!(timer.sleep(Duration::ZERO)).is_ready());
        assert!(futures::poll!(timer.sleep(Duration::from_millis(1))).is_pending());
        // Later than the last sweep (none yet: the timer's start): not due before a sweep.
        std::thread::sleep(Duration::from_millis(5));
        let past = Instant::now();
        assert!(futures::poll!(hyper::rt::Timer::sleep_until(&timer, past)).is_pending());
        tokio::spawn(timer.clone().run());
        tokio::time::sleep(RESOLUTION * 3).await;
        let (before, swept) = (Instant::now(), timer.now());
        assert!(swept <= before);
        assert!(
            before - swept <= RESOLUTION * 2,
            "{:?} behind",
            before - swept
        );
        // A deadline at or before the last sweep is due at the first poll.
        assert!(futures::poll!(hyper::rt::Timer::sleep_until(&timer, past)).is_ready());
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
    async fn dropped_sleeps_give_their_slot_back_and_the_sweep_trims_the_list() {
        let timer = CoarseTimer::new();
        tokio::spawn(timer.clone().run());
        for _ in 0..1000 {
            drop(timer.sleep(Duration::from_secs(60)));
        }
        assert_eq!(timer.inner.near.lock().unwrap().slots.len(), 1);
        let many: Vec<_> = (0..1000)
            .map(|_| timer.sleep(Duration::from_secs(60)))
            .collect();
        drop(many);
        tokio::time::sleep(RESOLUTION * 3).await;
        assert_eq!(timer.inner.near.lock().unwrap().slots.len(), 0);
    }

    #[test]
    fn a_slot_fired_before_it_was_given_back_does_not_fire_its_next_sleep() {
        let mut list = Slots::default();
        let a = list.take(5);
        let mut fire = Vec::new();
        list.expire(10, &mut fire);
        assert!(list.slots[a as usize].fired);
        list.give_back(a);
        let b = list.take(1_000);
        assert_eq!(a, b, "the slot is reused");
        list.expire(20, &mut fire);
        assert!(!list.slots[b as usize].fired);
        list.expire(1_000, &mut fire);
        assert!(list.slots[b as usize].fired);
    }

    #[tokio::test]
    async fn a_sleep_wakes_its_task_when_it_fires_and_a_dropped_one_does_not() {
        let timer = CoarseTimer::new();
        tokio::spawn(timer.clone().run());
        let dropped = tokio::spawn({
            let timer = timer.clone();
            async move {
                let s = timer.sleep(Duration::from_millis(50));
                drop(s);
                std::future::pending::<()>().await
            }
        });
        tokio::time::timeout(
            Duration::from_secs(5),
            timer.sleep(Duration::from_millis(150)),
        )
        .await
        .expect("the sweeper woke the sleep");
        assert!(!dropped.is_finished());
        dropped.abort();
        assert_eq!(timer.inner.near.lock().unwrap().live(), 0);
    }

    #[tokio::test]
    async fn far_sleeps_fire_within_their_resolution_and_stay_off_the_per_tick_list() {
        let timer = CoarseTimer::new();
        tokio::spawn(timer.clone().run());
        let start = Instant::now();
        let far = timer.sleep_far(Duration::from_millis(250));
        assert_eq!(timer.inner.near.lock().unwrap().slots.len(), 0);
        assert_eq!(timer.inner.far.lock().unwrap().live(), 1);
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
        // Dropped ones are trimmed at the next far sweep.
        let many: Vec<_> = (0..1000)
            .map(|_| timer.sleep_far(Duration::from_secs(60)))
            .collect();
        drop(many);
        tokio::time::sleep(FAR_RESOLUTION * 2 + RESOLUTION).await;
        assert_eq!(timer.inner.far.lock().unwrap().slots.len(), 0);
    }
}
