//! Kubernetes Events for rejected objects: `kubectl describe ar demo` shows a `Warning`
//! with the same reason and message as the `Accepted` / `ResolvedRefs` condition, and for an
//! Ingress (whose status has no conditions) it is the only place the verdict shows.
//!
//! Only the leader publishes. An event is published when an object is first seen rejected,
//! and again only when its generation, reason or message changes (the writer's diff against
//! its last write, see [`super::writer::Written`]), so a steady stream of rebuilds does not
//! flood the API server; an object that becomes accepted and is rejected again gets a new
//! event.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde::Serialize;
use sluice_translate::status::{CONDITION_ACCEPTED, Condition, ConditionStatus};

use super::writer::{Family, Key};
use crate::context::Context;
use crate::metrics::Metrics;
use crate::rebuild::Rebuilt;

/// `reportingController` of our events.
pub const REPORTING_CONTROLLER: &str = "sluice.dev/controller";
/// `action` of our events: translating the object into the snapshot.
pub const ACTION: &str = "Translate";
/// Longest event note the API server accepts is 1 kB; longer messages are cut.
const MAX_NOTE_BYTES: usize = 1024;

/// The object an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Subject {
    /// `apisix.apache.org/v2` or `networking.k8s.io/v1`.
    pub api_version: &'static str,
    /// Kubernetes kind.
    pub kind: &'static str,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// One rejection to report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    /// The rejected object.
    pub subject: Subject,
    /// Its generation when translated.
    pub generation: Option<i64>,
    /// The condition's CamelCase reason, e.g. `InvalidSpec`.
    pub reason: String,
    /// The condition's message (names the field at fault).
    pub message: String,
}

/// The first `False` condition among `Accepted` and `ResolvedRefs` (in that order).
fn first_false(conditions: &[Condition]) -> Option<&Condition> {
    conditions
        .iter()
        .filter(|c| c.status == ConditionStatus::False)
        .min_by_key(|c| c.type_ != CONDITION_ACCEPTED)
}

/// Every rejected object of a rebuild, with the reason that matters most.
pub fn warnings(rebuilt: &Rebuilt) -> Vec<Warning> {
    let apisix = rebuilt.objects.iter().filter_map(|v| {
        let s = &v.status;
        let c = first_false(&s.conditions)?;
        Some(Warning {
            subject: Subject {
                api_version: "apisix.apache.org/v2",
                kind: s.kind.as_str(),
                namespace: s.namespace.clone(),
                name: s.name.clone(),
            },
            generation: s.generation,
            reason: c.reason.clone(),
            message: c.message.clone(),
        })
    });
    let ingresses = rebuilt.ingresses.iter().filter_map(|i| {
        let c = first_false(&i.conditions)?;
        Some(Warning {
            subject: Subject {
                api_version: "networking.k8s.io/v1",
                kind: "Ingress",
                namespace: i.namespace.clone(),
                name: i.name.clone(),
            },
            generation: i.generation,
            reason: c.reason.clone(),
            message: c.message.clone(),
        })
    });
    apisix.chain(ingresses).collect()
}

/// Every Warning to publish now, keyed by its object: one per rejected object (the writer
/// publishes those that differ from the last one it published for the object).
pub fn desired(rebuilt: &Rebuilt) -> Vec<(Key, Warning)> {
    warnings(rebuilt)
        .into_iter()
        .map(|w| {
            let s = &w.subject;
            (Key::new(s.kind, &s.namespace, &s.name), w)
        })
        .collect()
}

fn cut(mut s: String) -> String {
    if s.len() > MAX_NOTE_BYTES {
        let mut end = MAX_NOTE_BYTES - '…'.len_utf8();
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// The Events family of the writer.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// Publishes as `instance` (`reportingInstance`) of [`REPORTING_CONTROLLER`].
    pub fn new(client: Client, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: REPORTING_CONTROLLER.to_owned(),
            instance,
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }
}

impl Family for Events {
    type Write = Warning;
    const NAME: &'static str = "events";
    const ERROR_SOURCE: &'static str = "event";
    // NB: what was published is known only here; forgetting it would publish every
    // Warning again.
    const FORGET_ON_RESYNC: bool = false;
    const NOT_FOUND_IS_GONE: bool = false;

    async fn plan(
        &self,
        _: &Context,
        rebuilt: &Rebuilt,
    ) -> Result<Vec<(Key, Warning)>, kube::Error> {
        Ok(desired(rebuilt))
    }

    async fn apply(&self, ctx: &Context, _: &Key, w: &Warning) -> Result<(), kube::Error> {
        let s = &w.subject;
        let reference = ObjectReference {
            api_version: Some(s.api_version.to_owned()),
            kind: Some(s.kind.to_owned()),
            namespace: Some(s.namespace.clone()),
            name: Some(s.name.clone()),
            uid: ctx.stores.uid_of(s.kind, &s.namespace, &s.name),
            ..Default::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: w.reason.clone(),
            note: Some(cut(w.message.clone())),
            action: ACTION.to_owned(),
            secondary: None,
        };
        self.recorder.publish(&event, &reference).await
    }

    fn count(&self, metrics: &Metrics) {
        metrics.events.inc();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::status::writer::Written;

    fn warning(name: &str, generation: i64, message: &str) -> Warning {
        Warning {
            subject: Subject {
                api_version: "apisix.apache.org/v2",
                kind: "ApisixRoute",
                namespace: "ns".into(),
                name: name.into(),
            },
            generation: Some(generation),
            reason: "InvalidSpec".into(),
            message: message.into(),
        }
    }

    /// The writer's diff with every write landing: what would be published.
    #[derive(Default)]
    struct Dedup(Written);

    impl Dedup {
        fn fresh(&mut self, all: Vec<Warning>) -> Vec<Warning> {
            let plan = all
                .into_iter()
                .map(|w| {
                    let s = &w.subject;
                    (Key::new(s.kind, &s.namespace, &s.name), w)
                })
                .collect();
            let todo = self.0.fresh(plan);
            todo.into_iter()
                .map(|(k, w, b)| {
                    self.0.landed(k, b);
                    w
                })
                .collect()
        }

        fn clear(&mut self) {
            self.0.clear();
        }
    }

    #[test]
    fn each_distinct_rejection_is_reported_once() {
        let mut d = Dedup::default();
        assert_eq!(d.fresh(vec![warning("a", 1, "bad")]).len(), 1);
        assert!(
            d.fresh(vec![warning("a", 1, "bad")]).is_empty(),
            "unchanged"
        );
        let changed = d.fresh(vec![warning("a", 2, "worse")]);
        assert_eq!(changed, vec![warning("a", 2, "worse")]);
        // Accepted meanwhile, then rejected again with the same message: reported again.
        assert!(d.fresh(vec![]).is_empty());
        assert_eq!(d.fresh(vec![warning("a", 2, "worse")]).len(), 1);
        d.clear();
        assert_eq!(d.fresh(vec![warning("a", 2, "worse")]).len(), 1);
    }

    #[test]
    fn accepted_beats_resolved_refs_as_the_reported_reason() {
        let c = |t: &str, s, r: &str| Condition {
            type_: t.into(),
            status: s,
            reason: r.into(),
            message: String::new(),
        };
        let conds = vec![
            c("ResolvedRefs", ConditionStatus::False, "BackendNotFound"),
            c("Accepted", ConditionStatus::False, "InvalidSpec"),
        ];
        assert_eq!(first_false(&conds).unwrap().reason, "InvalidSpec");
        let conds = vec![
            c("Accepted", ConditionStatus::True, "Accepted"),
            c("ResolvedRefs", ConditionStatus::False, "BackendNotFound"),
        ];
        assert_eq!(first_false(&conds).unwrap().reason, "BackendNotFound");
        assert!(first_false(&conds[..1]).is_none());
    }

    #[test]
    fn long_notes_are_cut_on_a_char_boundary() {
        let s = cut("é".repeat(800));
        assert!(s.len() <= MAX_NOTE_BYTES);
        assert!(s.ends_with('…'));
    }
}
