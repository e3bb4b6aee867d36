//! Waiting for a condition that becomes true some time after an action: one signature,
//! [`eventually`] on a Tokio runtime, [`eventually_async`] for a probe that must await (a
//! scrape, a `kubectl` run on a blocking thread) and [`eventually_blocking`] on a plain
//! thread.
//!
//! The probe is polled first at once, then every [`PAUSE`] (or the pause of a [`Wait`])
//! until it is [`Settled`] or the limit has passed; the last probe is taken at the deadline.
//! The result is the last probe's value, so a `bool` probe answers whether the condition was
//! met and an `Option` or `Result` probe carries the value (or the last error):
//!
//! ```ignore
//! assert!(eventually(Duration::from_secs(3), || healthy(&dp) == Some(0.0)).await, "not ejected");
//! let v = eventually_blocking(limit, || status(&p).filter(|s| s == "True"));
//! // A probe that runs kubectl: not more often than every 200 ms.
//! let v = eventually_blocking(Wait::up_to(limit).every(Duration::from_millis(200)), probe);
//! ```

use std::time::Duration;

/// The pause between two probes: the shortest of the helpers the kit replaced (they polled
/// every 5 to 100 ms), so no test polls less often than it did, and a test that times how
/// long a change took to show (e2e's latency tests) keeps its 5 ms resolution.
pub const PAUSE: Duration = Duration::from_millis(5);

/// How long to wait, and how long to pause between probes. A `Duration` converts into a
/// wait of that limit with the default [`PAUSE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// How long to wait at most.
    pub limit: Duration,
    /// The pause between two probes.
    pub pause: Duration,
}

impl Wait {
    /// A wait of at most `limit`, probing every [`PAUSE`].
    pub fn up_to(limit: Duration) -> Wait {
        Wait {
            limit,
            pause: PAUSE,
        }
    }

    /// The same wait, pausing `pause` between probes (a probe that runs a process, e.g.
    /// `kubectl`, keeps the pace its test was written with).
    pub fn every(self, pause: Duration) -> Wait {
        Wait { pause, ..self }
    }
}

impl From<Duration> for Wait {
    fn from(limit: Duration) -> Wait {
        Wait::up_to(limit)
    }
}

/// A probe's answer that says whether waiting is over.
pub trait Settled {
    /// Whether the condition holds (`true`, `Some(_)`, `Ok(_)`).
    fn settled(&self) -> bool;
}

impl Settled for bool {
    fn settled(&self) -> bool {
        *self
    }
}

impl<T> Settled for Option<T> {
    fn settled(&self) -> bool {
        self.is_some()
    }
}

impl<T, E> Settled for Result<T, E> {
    fn settled(&self) -> bool {
        self.is_ok()
    }
}

/// Polls `probe` on the current Tokio runtime until it is [`Settled`] or the limit of `wait`
/// has passed; returns its last answer. Measures time with Tokio's clock, so a test with
/// paused time waits in virtual time.
pub async fn eventually<P: Settled>(wait: impl Into<Wait>, mut probe: impl FnMut() -> P) -> P {
    let Wait { limit, pause } = wait.into();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let answer = probe();
        let now = tokio::time::Instant::now();
        if answer.settled() || now >= deadline {
            return answer;
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
    }
}

/// [`eventually`] for a probe that awaits (a request, a blocking task): the same polling,
/// each probe run to its end before the next pause.
pub async fn eventually_async<P: Settled, F: Future<Output = P>>(
    wait: impl Into<Wait>,
    mut probe: impl FnMut() -> F,
) -> P {
    let Wait { limit, pause } = wait.into();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let answer = probe().await;
        let now = tokio::time::Instant::now();
        if answer.settled() || now >= deadline {
            return answer;
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
    }
}

/// [`eventually`] for a thread outside any runtime (the system tests): the same polling,
/// with `std::thread::sleep` between probes.
pub fn eventually_blocking<P: Settled>(wait: impl Into<Wait>, mut probe: impl FnMut() -> P) -> P {
    let Wait { limit, pause } = wait.into();
    let deadline = std::time::Instant::now() + limit;
    loop {
        let answer = probe();
        let now = std::time::Instant::now();
        if answer.settled() || now >= deadline {
            return answer;
        }
        std::thread::sleep(pause.min(deadline - now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_returns_the_first_settled_answer_or_the_last_one() {
        let mut n = 0;
        let got = eventually_blocking(Duration::from_secs(5), || {
            n += 1;
            (n >= 3).then_some(n)
        });
        assert_eq!(got, Some(3));
        assert!(!eventually_blocking(Duration::from_millis(20), || false));
        let err: Result<(), &str> = eventually_blocking(Duration::from_millis(20), || Err("no"));
        assert_eq!(err, Err("no"));
        // A slower pace: in 250 ms, probes at 0, 100 and 200 ms and the last at the deadline
        // (fewer if a pause overran).
        let mut probes = 0;
        let wait = Wait::up_to(Duration::from_millis(250)).every(Duration::from_millis(100));
        assert!(!eventually_blocking(wait, || {
            probes += 1;
            false
        }));
        assert!((2..=4).contains(&probes), "{probes} probes");
    }

    #[tokio::test]
    async fn async_polls_until_settled_and_gives_up_at_the_limit() {
        let mut n = 0;
        assert!(
            eventually(Duration::from_secs(5), || {
                n += 1;
                n >= 3
            })
            .await
        );
        assert_eq!(n, 3);
        assert_eq!(
            eventually(Duration::from_millis(20), || None::<u8>).await,
            None
        );
        let mut m = 0;
        let got = eventually_async(Duration::from_secs(5), || {
            m += 1;
            let m = m;
            async move { if m >= 2 { Ok(m) } else { Err(m) } }
        })
        .await;
        assert_eq!(got, Ok(2));
    }
}
