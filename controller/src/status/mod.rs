//! Status and the other side outputs of translation, written by one writer (the leader).
//!
//! ```text
//! rebuild (Rebuilt) ─┐
//! fleet (ACKs) ──────┼─▶ writer::run::<Family>  ─ plan: desired(...) per family (pure)
//! leader ────────────┘     batch · diff with last write · apply · retry · metrics
//! ```
//!
//! - [`writer`]: the one loop, run once per family: leader-gated, batched, skips what it
//!   wrote last, one retry schedule ([`writer::Retry`]), metrics.
//! - [`programmed`]: the `Programmed` condition (Apisix kinds, Gateways and listeners):
//!   how many of the dataplanes that should serve an object serve it as it is now.
//! - One module per family, each a pure `desired(...)` from the rebuild output (and the
//!   stores' current objects) to the writes, plus how a write is applied:
//!   [`apisix`] (`.status` of the Apisix kinds), [`gateway`] (GatewayClass, Gateway and
//!   route `status.parents[]`), [`ingress`] (`status.loadBalancer`), [`events`] (Warning
//!   Events for rejected objects), [`gateway_services`] (one Service per Gateway).
//! - [`address`]: where the published address comes from (Ingress and Gateway).
//!
//! Conditions written carry `observedGeneration`; `lastTransitionTime` is kept from the
//! object's current status while a condition's status does not change; an object whose
//! status already says what we would write is not patched.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use sluice_translate::ConditionStatus;

pub mod address;
pub mod apisix;
pub mod events;
pub mod gateway;
pub mod gateway_services;
pub mod ingress;
pub mod programmed;
pub mod writer;

pub use address::Publish;
pub use gateway_services::GatewayServices;

/// Field manager of the Apisix and Ingress status writes (and of the records).
pub const FIELD_MANAGER: &str = "sluice-controller";
/// Longest condition message written; longer ones are cut (status objects stay small).
pub const MAX_MESSAGE_CHARS: usize = 1024;

/// A condition without its transition time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// Condition type.
    pub type_: String,
    /// `True` or `False`.
    pub status: &'static str,
    /// CamelCase reason.
    pub reason: String,
    /// Message (at most [`MAX_MESSAGE_CHARS`]).
    pub message: String,
}

/// `s` cut to [`MAX_MESSAGE_CHARS`].
pub(crate) fn truncate(mut s: String) -> String {
    if s.chars().count() > MAX_MESSAGE_CHARS {
        s = s.chars().take(MAX_MESSAGE_CHARS - 1).collect();
        s.push('…');
    }
    s
}

/// A translation condition as it is written (message cut to [`MAX_MESSAGE_CHARS`]).
pub fn from_translation(c: &sluice_translate::Condition) -> Desired {
    Desired {
        type_: c.type_.clone(),
        status: match c.status {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
        },
        reason: c.reason.clone(),
        message: truncate(c.message.clone()),
    }
}

/// Conditions to write: `desired` with `observedGeneration = generation` and
/// `lastTransitionTime` kept from `existing` where the condition's status did not change.
pub fn conditions_to_write(
    desired: &[Desired],
    generation: Option<i64>,
    existing: &[Condition],
    now: Timestamp,
) -> Vec<Condition> {
    desired
        .iter()
        .map(|d| {
            let last_transition_time = existing
                .iter()
                .find(|c| c.type_ == d.type_ && c.status == d.status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or(Time(now));
            Condition {
                type_: d.type_.clone(),
                status: d.status.to_owned(),
                reason: d.reason.clone(),
                message: d.message.clone(),
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
}
