//! Collecting what is wrong with one object while translating it, then turning that into
//! conditions.

use crate::refs::REASON_REF_NOT_PERMITTED;
use crate::status::{
    CONDITION_ACCEPTED, CONDITION_RESOLVED_REFS, Condition, ConditionStatus, REASON_ACCEPTED,
    REASON_INVALID_SPEC, REASON_RESOLVED_REFS,
};

/// At most this many problems are spelled out in one condition message; status messages must
/// stay small even for objects with hundreds of rules.
const MAX_LISTED: usize = 5;

/// Problems found in one object.
#[derive(Debug, Default)]
pub(crate) struct Problems {
    /// Spec errors (`<field>: <reason>`): the object is rejected.
    pub(crate) errors: Vec<String>,
    /// References that could not be resolved (reason, `<field>: <message>`): the object is
    /// kept, with `ResolvedRefs=False`.
    pub(crate) unresolved: Vec<(&'static str, String)>,
    /// Informational remarks appended to the `Accepted=True` message.
    pub(crate) notes: Vec<String>,
    /// How many of `errors` are refused cross-namespace references ([`Problems::refused`]).
    refused: usize,
}

impl Problems {
    /// Records a spec error on `field`.
    pub(crate) fn error(&mut self, field: impl AsRef<str>, reason: impl AsRef<str>) {
        self.errors
            .push(format!("{}: {}", field.as_ref(), reason.as_ref()));
    }

    /// Records a cross-namespace reference on `field` that is not permitted (see
    /// [`crate::refs`]): an error like a missing target, and when every error is one of
    /// these the reason is `RefNotPermitted` rather than `InvalidSpec`.
    pub(crate) fn refused(&mut self, field: impl AsRef<str>, message: impl AsRef<str>) {
        self.error(field, message);
        self.refused += 1;
    }

    /// Records an unresolved reference on `field`.
    pub(crate) fn unresolved(
        &mut self,
        reason: &'static str,
        field: impl AsRef<str>,
        message: impl AsRef<str>,
    ) {
        self.unresolved
            .push((reason, format!("{}: {}", field.as_ref(), message.as_ref())));
    }

    /// Whether the object is valid (it may still have unresolved references).
    pub(crate) fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }

    /// The `Accepted` condition.
    pub(crate) fn accepted(&self) -> Condition {
        if self.errors.is_empty() {
            let mut message = String::from("Accepted");
            for note in &self.notes {
                message.push_str("; ");
                message.push_str(note);
            }
            Condition::new(
                CONDITION_ACCEPTED,
                ConditionStatus::True,
                REASON_ACCEPTED,
                message,
            )
        } else {
            let reason = if self.refused == self.errors.len() {
                REASON_REF_NOT_PERMITTED
            } else {
                REASON_INVALID_SPEC
            };
            Condition::new(
                CONDITION_ACCEPTED,
                ConditionStatus::False,
                reason,
                join(&self.errors),
            )
        }
    }

    /// The `ResolvedRefs` condition of a valid object.
    pub(crate) fn resolved_refs(&self) -> Condition {
        match self.unresolved.first() {
            None => Condition::new(
                CONDITION_RESOLVED_REFS,
                ConditionStatus::True,
                REASON_RESOLVED_REFS,
                "All references resolved".into(),
            ),
            Some((reason, _)) => {
                let messages: Vec<String> =
                    self.unresolved.iter().map(|(_, m)| m.clone()).collect();
                Condition::new(
                    CONDITION_RESOLVED_REFS,
                    ConditionStatus::False,
                    reason,
                    join(&messages),
                )
            }
        }
    }
}

/// `a; b; c (and 4 more)`.
fn join(items: &[String]) -> String {
    let mut out = items
        .iter()
        .take(MAX_LISTED)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if items.len() > MAX_LISTED {
        out.push_str(&format!(" (and {} more)", items.len() - MAX_LISTED));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn long_lists_are_capped() {
        let mut p = Problems::default();
        for i in 0..8 {
            p.error(format!("spec.http[{i}].name"), "must not be empty");
        }
        let c = p.accepted();
        assert_eq!(c.status, ConditionStatus::False);
        assert_eq!(c.reason, "InvalidSpec");
        assert!(
            c.message
                .starts_with("spec.http[0].name: must not be empty; "),
            "{}",
            c.message
        );
        assert!(
            c.message
                .ends_with("spec.http[4].name: must not be empty (and 3 more)"),
            "{}",
            c.message
        );
    }
}
