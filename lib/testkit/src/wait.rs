//! Waiting for a condition that becomes true some time after an action: one signature,
//! [`eventually`] on a Tokio runtime and [`eventually_blocking`] on a plain thread.
//!
//! The probe is polled first at once, then with a pause that doubles from 5 ms up to
//! [`MAX_PAUSE`], until it is [`Settled`] or `limit` has passed; the last probe is taken at
//! the deadline. The result is the last probe's value, so a `bool` probe answers whether the
//! condition was met and an `Option` or `Result` probe carries the value (or the last error):
//!
//! ```ignore
//! assert!(eventually(Duration::from_secs(3), || healthy(&dp) == Some(0.0)).await, "not ejected");
//! let v = eventually_blocking(limit, || status(&p).filter(|s| s == "True"));
//! ```

use std::time::Duration;

/// The longest pause between two probes.
pub const MAX_PAUSE: Duration = Duration::from_millis(50);
const FIRST_PAUSE: Duration = Duration::from_millis(5);

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

/// Polls `probe` on the current Tokio runtime until it is [`Settled`] or `limit` has passed;
/// returns its last answer. Measures time with Tokio's clock, so a test with paused time
/// waits in virtual time.
pub async fn eventually<P: Settled>(limit: Duration, mut probe: impl FnMut() -> P) -> P {
    let deadline = tokio::time::Instant::now() + limit;
    let mut pause = FIRST_PAUSE;
    loop {
        let answer = probe();
        let now = tokio::time::Instant::now();
        if answer.settled() || now >= deadline {
            return answer;
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// [`eventually`] for a thread outside any runtime (the system tests): the same polling,
/// with `std::thread::sleep` between probes.
pub fn eventually_blocking<P: Settled>(limit: Duration, mut probe: impl FnMut() -> P) -> P {
    let deadline = std::time::Instant::now() + limit;
    let mut pause = FIRST_PAUSE;
    loop {
        let answer = probe();
        let now = std::time::Instant::now();
        if answer.settled() || now >= deadline {
            return answer;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(MAX_PAUSE);
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
    }
}
