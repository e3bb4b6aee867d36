//! The one writer loop every family of writes runs in (one instance per family, so a slow
//! family never holds up another): it waits for a change, batches, writes only while this
//! replica leads, skips what it wrote last, retries failures on one schedule and counts
//! what it did.
//!
//! A pass: the family plans the writes that would change something now (a pure
//! `desired(...)` function over the rebuild output and the stores, see the family
//! modules); the writer drops those whose body (without `lastTransitionTime`) equals the
//! last write to the same object, so a write is not repeated before the watch shows it;
//! applies the rest, [`CONCURRENCY`] at a time; and remembers what landed.
//!
//! Retries have one home, [`Retry`]: a pass with a failed write (or a plan that could not
//! be made) is followed by another after 1 s, doubling up to [`RESYNC_INTERVAL`]; a pass
//! without failure resets the delay. `404 Not Found` means the object was deleted
//! meanwhile (nothing to report, no retry) for the families that say so; `409 Conflict`
//! means it changed meanwhile (retried, not counted as an error). Every
//! [`RESYNC_INTERVAL`] a pass runs even without a change.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;
use tokio::sync::watch;

use crate::context::Context;
use crate::metrics::Metrics;
use crate::rebuild::Rebuilt;

/// How often a pass runs even without a change: retries failures, and notices what the
/// stores cannot show (an address outside the watched namespaces, a write that got lost).
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(30);
/// Wait after a change before a pass, to batch bursts of ACKs (one per dataplane per
/// snapshot).
pub const BATCH: Duration = Duration::from_millis(250);
/// Writes in flight at once.
pub const CONCURRENCY: usize = 8;

/// One object written: Kubernetes kind, namespace (empty when cluster-scoped), name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// Kubernetes kind, e.g. `ApisixRoute`.
    pub kind: &'static str,
    /// Namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl Key {
    /// The key of `kind` `namespace/name`.
    pub fn new(kind: &'static str, namespace: &str, name: &str) -> Self {
        Self {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

/// One family of writes (Apisix status, Gateway API status, ...): what to write now and
/// how to write it. The loop around it is [`run`].
pub trait Family: Send + Sync + 'static {
    /// One write: compared, without `lastTransitionTime`, with the last one to the same
    /// object.
    type Write: Serialize + Send + Sync + 'static;
    /// Names the family in logs.
    const NAME: &'static str;
    /// The `source` label of `sluice_controller_reconcile_errors_total` on failure.
    const ERROR_SOURCE: &'static str = "status";
    /// Whether what it writes depends on the fleet (`Programmed`): then the writer waits
    /// for the fleet's watches to list once, so a new leader never writes from a partial
    /// view, and runs a pass whenever the fleet changes.
    const FLEET: bool = false;
    /// Whether a resync forgets what was written. True when the plan compares with the
    /// stores (a write that did not land shows there); false when what was written is
    /// known only here (Events).
    const FORGET_ON_RESYNC: bool = true;
    /// Whether `404 Not Found` means the object is gone (nothing to do) rather than a
    /// failure.
    const NOT_FOUND_IS_GONE: bool = true;

    /// The writes that would change something now. An `Err` (a read that failed) counts as
    /// a failed pass.
    fn plan(
        &self,
        ctx: &Context,
        rebuilt: &Rebuilt,
    ) -> impl Future<Output = Result<Vec<(Key, Self::Write)>, kube::Error>> + Send;

    /// Makes one write.
    fn apply(
        &self,
        ctx: &Context,
        key: &Key,
        write: &Self::Write,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;

    /// Counts a write that landed (its family's metric).
    fn count(&self, metrics: &Metrics);

    /// A change the family must see beyond the rebuild output (a counter bumped on each),
    /// started once when the loop starts; `None` (default): none.
    fn wakeups(&self, _ctx: &Context) -> Option<watch::Receiver<u64>> {
        None
    }
}

/// The retry schedule of every family: after a failed pass, the next comes after
/// [`Retry::FIRST`], doubling up to [`RESYNC_INTERVAL`]; a pass without failure resets.
#[derive(Debug)]
pub struct Retry {
    delay: Duration,
    armed: Option<Duration>,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            delay: Self::FIRST,
            armed: None,
        }
    }
}

impl Retry {
    /// Delay of the first retry.
    pub const FIRST: Duration = Duration::from_secs(1);

    /// Records the outcome of a pass; returns the delay until the retry, if one is due.
    pub fn after(&mut self, failed: bool) -> Option<Duration> {
        if failed {
            self.armed = Some(self.delay);
            self.delay = (self.delay * 2).min(RESYNC_INTERVAL);
        } else {
            self.armed = None;
            self.delay = Self::FIRST;
        }
        self.armed
    }

    /// Resolves when the retry is due; never when none is.
    async fn due(&self) {
        match self.armed {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    }

    /// A pass is starting: the retry, if armed, is taken.
    fn disarm(&mut self) {
        self.armed = None;
    }
}

/// What a write came to.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Written,
    /// Deleted meanwhile: nothing to report on.
    Gone,
    /// Changed meanwhile (another controller, or our store lags): retried.
    Conflict,
    Failed,
}

fn outcome<F: Family>(r: &Result<(), kube::Error>) -> Outcome {
    match r {
        Ok(()) => Outcome::Written,
        Err(kube::Error::Api(e)) if e.code == 404 && F::NOT_FOUND_IS_GONE => Outcome::Gone,
        Err(kube::Error::Api(e)) if e.code == 409 => Outcome::Conflict,
        Err(_) => Outcome::Failed,
    }
}

/// A write's body as compared with the last one: without `lastTransitionTime` (a
/// condition written a moment ago that the stores do not show yet would get a new time on
/// every pass).
pub fn body<W: Serialize>(write: &W) -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.remove("lastTransitionTime");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    // NB: the write types are plain data; one that did not serialize compares as `Null`,
    // i.e. it is written every pass rather than never.
    let mut v = serde_json::to_value(write).unwrap_or_default();
    strip(&mut v);
    v
}

/// Runs `family` while the rebuild output's sender lives: a pass after every rebuild,
/// leader change, fleet change (for [`Family::FLEET`]), due retry and resync; writes only
/// while this replica leads.
pub async fn run<F: Family>(family: F, ctx: Context) {
    let mut rebuilt = ctx.rebuilt.clone();
    let mut leader = ctx.leader.clone();
    let mut fleet = if F::FLEET {
        ctx.fleet.synced().await;
        Some(ctx.fleet.subscribe())
    } else {
        None
    };
    let mut wakeups = family.wakeups(&ctx);
    let mut written = Written::default();
    let mut resync = tokio::time::interval(RESYNC_INTERVAL);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut retry = Retry::default();
    loop {
        tokio::select! {
            _ = resync.tick() => if F::FORGET_ON_RESYNC { written.clear() },
            () = retry.due() => {},
            r = rebuilt.changed() => if r.is_err() { return },
            r = changed(&mut fleet) => if r.is_err() { return },
            r = changed(&mut wakeups) => if r.is_err() { wakeups = None },
            r = leader.changed() => {
                if r.is_err() { return }
                written.clear();
            },
        }
        retry.disarm();
        tokio::time::sleep(BATCH).await;
        // NB: mark every input seen, or `changed()` would fire again at once.
        if let Some(f) = &mut fleet {
            f.borrow_and_update();
        }
        if let Some(w) = &mut wakeups {
            w.borrow_and_update();
        }
        let out = rebuilt.borrow_and_update().clone();
        if !*leader.borrow_and_update() {
            continue;
        }
        let Some(out) = out else { continue };
        let failed = pass(&family, &ctx, &out, &mut written).await;
        retry.after(failed);
    }
}

/// Resolves when the fleet changed; never without a fleet.
async fn changed(fleet: &mut Option<watch::Receiver<u64>>) -> Result<(), watch::error::RecvError> {
    match fleet {
        Some(f) => f.changed().await,
        None => std::future::pending().await,
    }
}

/// What was written last per object: the diff of a pass against it drops repeats.
#[derive(Debug, Default)]
pub struct Written {
    last: HashMap<Key, serde_json::Value>,
}

impl Written {
    /// The writes of `plan` that differ from the last write to their object, with their
    /// bodies. Objects not in `plan` are forgotten: the stores show them as they should be,
    /// and an Event is published again when its object is rejected again later.
    pub fn fresh<W: Serialize>(&mut self, plan: Vec<(Key, W)>) -> Vec<(Key, W, serde_json::Value)> {
        let planned: HashSet<&Key> = plan.iter().map(|(k, _)| k).collect();
        self.last.retain(|k, _| planned.contains(k));
        plan.into_iter()
            .map(|(k, w)| {
                let b = body(&w);
                (k, w, b)
            })
            .filter(|(k, _, b)| self.last.get(k) != Some(b))
            .collect()
    }

    /// Records a write that landed.
    pub fn landed(&mut self, key: Key, body: serde_json::Value) {
        self.last.insert(key, body);
    }

    /// Forgets everything (a new leader, or a resync: write what the stores do not show).
    pub fn clear(&mut self) {
        self.last.clear();
    }
}

/// One pass of `family`; returns whether something failed (a retry is due).
async fn pass<F: Family>(family: &F, ctx: &Context, out: &Rebuilt, written: &mut Written) -> bool {
    let plan = match family.plan(ctx, out).await {
        Ok(plan) => plan,
        Err(e) => {
            error(ctx, F::ERROR_SOURCE);
            tracing::warn!(family = F::NAME, error = %e, "cannot plan writes; retrying");
            return true;
        }
    };
    let todo = written.fresh(plan);
    if todo.is_empty() {
        return false;
    }
    tracing::debug!(
        family = F::NAME,
        objects = todo.len(),
        version = out.version,
        "writing"
    );
    let results: Vec<(Key, serde_json::Value, Result<(), kube::Error>)> =
        futures::stream::iter(todo.into_iter().map(|(key, w, b)| async move {
            let r = family.apply(ctx, &key, &w).await;
            (key, b, r)
        }))
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let mut failed = false;
    for (key, b, r) in results {
        match outcome::<F>(&r) {
            Outcome::Written => {
                family.count(&ctx.metrics);
                written.landed(key, b);
            }
            Outcome::Gone => {}
            Outcome::Conflict => {
                tracing::debug!(family = F::NAME, kind = key.kind, namespace = %key.namespace, name = %key.name, "changed meanwhile; retrying");
                failed = true;
            }
            Outcome::Failed => {
                error(ctx, F::ERROR_SOURCE);
                let e = r.err().map(|e| e.to_string()).unwrap_or_default();
                tracing::warn!(family = F::NAME, kind = key.kind, namespace = %key.namespace, name = %key.name, error = %e, "write failed; retrying");
                failed = true;
            }
        }
    }
    failed
}

fn error(ctx: &Context, source: &str) {
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[source])
        .inc();
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_from_a_second_to_the_resync_interval_and_reset() {
        let mut r = Retry::default();
        let delays: Vec<_> = (0..7).map(|_| r.after(true).unwrap()).collect();
        let secs: Vec<u64> = delays.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(r.after(false), None);
        assert_eq!(r.after(true), Some(Retry::FIRST));
    }

    #[test]
    fn bodies_compare_without_transition_times() {
        let a = serde_json::json!({"conditions": [{"type": "A", "lastTransitionTime": "t0"}]});
        let b = serde_json::json!({"conditions": [{"type": "A", "lastTransitionTime": "t1"}]});
        assert_eq!(body(&a), body(&b));
        let c = serde_json::json!({"conditions": [{"type": "B", "lastTransitionTime": "t0"}]});
        assert_ne!(body(&a), body(&c));
    }

    struct Strict;
    impl Family for Strict {
        type Write = ();
        const NAME: &'static str = "strict";
        const NOT_FOUND_IS_GONE: bool = false;
        async fn plan(&self, _: &Context, _: &Rebuilt) -> Result<Vec<(Key, ())>, kube::Error> {
            Ok(Vec::new())
        }
        async fn apply(&self, _: &Context, _: &Key, _: &()) -> Result<(), kube::Error> {
            Ok(())
        }
        fn count(&self, _: &Metrics) {}
    }

    fn api_error(code: u16) -> Result<(), kube::Error> {
        Err(kube::Error::Api(
            kube::core::Status::failure("x", "y")
                .with_code(code)
                .boxed(),
        ))
    }

    #[test]
    fn not_found_is_gone_only_where_the_family_says_so() {
        struct Lenient;
        impl Family for Lenient {
            type Write = ();
            const NAME: &'static str = "lenient";
            async fn plan(&self, _: &Context, _: &Rebuilt) -> Result<Vec<(Key, ())>, kube::Error> {
                Ok(Vec::new())
            }
            async fn apply(&self, _: &Context, _: &Key, _: &()) -> Result<(), kube::Error> {
                Ok(())
            }
            fn count(&self, _: &Metrics) {}
        }
        assert_eq!(outcome::<Lenient>(&api_error(404)), Outcome::Gone);
        assert_eq!(outcome::<Strict>(&api_error(404)), Outcome::Failed);
        assert_eq!(outcome::<Strict>(&api_error(409)), Outcome::Conflict);
        assert_eq!(outcome::<Strict>(&api_error(500)), Outcome::Failed);
        assert_eq!(outcome::<Strict>(&Ok(())), Outcome::Written);
    }
}
