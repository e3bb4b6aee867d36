//! Lease-based leader election (`--leader-elect`), as client-go's leaderelection does it: a
//! `coordination.k8s.io/v1` Lease names the holder; the holder renews it every
//! [`LeaseConfig::retry_period`]; another replica takes it over once it has not been renewed
//! for [`LeaseConfig::lease_duration`]. Updates use the Lease's `resourceVersion`, so two
//! replicas can never both win a race.
//!
//! Only the leader writes status and events; every replica serves dataplanes, leader or not
//! (see `app.rs`). A leader that cannot renew steps down once its lease would have expired,
//! before anyone else may take over.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;

use crate::metrics::Metrics;

/// How to run the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Lease name (default `sluice-controller`).
    pub name: String,
    /// Lease namespace (default: the pod's namespace).
    pub namespace: String,
    /// This replica's identity (default: the pod name).
    pub identity: String,
    /// How long a lease is valid without renewal (default 15 s).
    pub lease_duration: Duration,
    /// How often to try to acquire or renew (default 2 s).
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// The defaults for `name`, `namespace` and `identity`.
    pub fn new(name: &str, namespace: &str, identity: &str) -> Self {
        Self {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(15),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What to do with the Lease as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No Lease yet: create it, holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it over.
    TakeOver,
    /// Someone else holds a valid lease.
    Follow {
        /// The current holder.
        holder: String,
    },
}

/// Decides from the Lease's spec (`None` = no Lease object) at time `now`.
pub fn decide(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> Decision {
    let Some(spec) = spec else {
        return Decision::Create;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder == me {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::TakeOver;
    }
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(0)));
    let expired = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .is_none_or(|t| t.0.saturating_add(duration).is_ok_and(|end| end < now));
    if expired {
        Decision::TakeOver
    } else {
        Decision::Follow {
            holder: holder.to_owned(),
        }
    }
}

fn held_spec(cfg: &LeaseConfig, previous: Option<&LeaseSpec>, now: Timestamp) -> LeaseSpec {
    let renewing = previous.is_some_and(|p| p.holder_identity.as_deref() == Some(&cfg.identity));
    let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(cfg.identity.clone()),
        lease_duration_seconds: Some(i32::try_from(cfg.lease_duration.as_secs()).unwrap_or(15)),
        acquire_time: if renewing {
            previous.and_then(|p| p.acquire_time.clone())
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if renewing || previous.is_none() {
            transitions
        } else {
            transitions.saturating_add(1)
        }),
        ..Default::default()
    }
}

/// One round: reads the Lease and acquires, renews or follows. Returns whether we hold it.
async fn round(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let current = api.get_opt(&cfg.name).await?;
    let spec = current.as_ref().and_then(|l| l.spec.as_ref());
    match decide(spec, &cfg.identity, now) {
        Decision::Follow { holder } => {
            tracing::trace!(%holder, "following");
            Ok(false)
        }
        Decision::Create => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(held_spec(cfg, None, now)),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        Decision::Renew | Decision::TakeOver => {
            let Some(mut lease) = current else {
                return Ok(false);
            };
            lease.spec = Some(held_spec(cfg, lease.spec.as_ref(), now));
            // NB: `replace` sends the resourceVersion we read: a concurrent writer gets 409.
            match api.replace(&cfg.name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

/// Runs the election forever, publishing whether this replica leads on `leader`.
pub async fn run(client: Client, cfg: LeaseConfig, leader: watch::Sender<bool>, metrics: Metrics) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut last_renewal: Option<tokio::time::Instant> = None;
    let mut tick = tokio::time::interval(cfg.retry_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let leading = match round(&api, &cfg).await {
            Ok(held) => {
                if held {
                    last_renewal = Some(tokio::time::Instant::now());
                }
                held
            }
            Err(e) => {
                metrics.reconcile_errors.with_label_values(&["lease"]).inc();
                tracing::warn!(error = %e, lease = %cfg.name, "leader election round failed");
                // Keep leading only while the lease we last renewed is surely still ours.
                let margin = cfg.lease_duration.saturating_sub(cfg.retry_period);
                last_renewal.is_some_and(|t| t.elapsed() < margin) && *leader.borrow()
            }
        };
        if leading != *leader.borrow() {
            if leading {
                tracing::info!(identity = %cfg.identity, lease = %cfg.name, "became the leader");
            } else {
                tracing::warn!(identity = %cfg.identity, lease = %cfg.name, "lost the leadership");
            }
            metrics.leader.set(i64::from(leading));
            leader.send_replace(leading);
        }
    }
}

/// Gives the Lease up if we hold it, so another replica takes over at once (on shutdown).
///
/// NB: a failure is logged, never silent: a Lease left held by a process that is gone
/// (on `helm uninstall` the Role may be deleted before this runs: 403) makes the next
/// leader wait for it to expire.
pub async fn release(client: Client, cfg: &LeaseConfig) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut lease = match api.get_opt(&cfg.name).await {
        Ok(Some(lease)) => lease,
        Ok(None) => {
            tracing::info!(lease = %cfg.name, namespace = %cfg.namespace, "no lease to release");
            return;
        }
        Err(e) => {
            tracing::warn!(
                lease = %cfg.name,
                namespace = %cfg.namespace,
                error = %e,
                "cannot read the lease to release it; it stays held until it expires"
            );
            return;
        }
    };
    let Some(spec) = lease.spec.as_mut() else {
        tracing::info!(lease = %cfg.name, namespace = %cfg.namespace, "lease has no holder; nothing to release");
        return;
    };
    if spec.holder_identity.as_deref() != Some(&cfg.identity) {
        tracing::debug!(
            lease = %cfg.name,
            holder = ?spec.holder_identity,
            "lease held by another replica; nothing to release"
        );
        return;
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    spec.acquire_time = None;
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => tracing::info!(lease = %cfg.name, "leadership released"),
        Err(e) => tracing::warn!(
            lease = %cfg.name,
            namespace = %cfg.namespace,
            error = %e,
            "cannot release the lease; it stays held until it expires"
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn spec(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(at(renewed))),
            acquire_time: Some(MicroTime(at(0))),
            lease_transitions: Some(3),
            ..Default::default()
        }
    }

    #[test]
    fn decisions() {
        assert_eq!(decide(None, "a", at(0)), Decision::Create);
        assert_eq!(decide(Some(&spec("a", 0)), "a", at(100)), Decision::Renew);
        assert_eq!(
            decide(Some(&spec("b", 0)), "a", at(10)),
            Decision::Follow { holder: "b".into() }
        );
        assert_eq!(decide(Some(&spec("b", 0)), "a", at(16)), Decision::TakeOver);
        let released = LeaseSpec {
            holder_identity: None,
            ..spec("b", 0)
        };
        assert_eq!(decide(Some(&released), "a", at(1)), Decision::TakeOver);
    }

    #[test]
    fn takeover_counts_a_transition_and_renewal_keeps_acquire_time() {
        let cfg = LeaseConfig::new("l", "ns", "a");
        let taken = held_spec(&cfg, Some(&spec("b", 0)), at(20));
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.acquire_time, Some(MicroTime(at(20))));
        let renewed = held_spec(&cfg, Some(&taken), at(22));
        assert_eq!(renewed.lease_transitions, Some(4));
        assert_eq!(renewed.acquire_time, Some(MicroTime(at(20))));
        assert_eq!(renewed.renew_time, Some(MicroTime(at(22))));
        assert_eq!(renewed.lease_duration_seconds, Some(15));
    }
}
