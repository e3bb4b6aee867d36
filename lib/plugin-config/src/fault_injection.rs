//! `fault-injection`: delay or abort a share of requests.

use serde::Deserialize;
use serde_json::Value;

use crate::expr::{self, Expr};
use crate::{FieldError, PluginSchema};

/// `abort`: answer without calling the upstream.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Abort {
    /// Status, at least 200. Required.
    pub http_status: u16,
    /// Body (may hold `$var`s).
    #[serde(default)]
    pub body: Option<String>,
    /// Response headers (values may hold `$var`s).
    #[serde(default)]
    pub headers: Option<serde_json::Map<String, Value>>,
    /// Share of requests aborted, 0..=100; default all.
    #[serde(default)]
    pub percentage: Option<u8>,
    /// Expressions of which one must hold: `[[[var, op, value], ...], ...]` (APISIX).
    #[serde(default)]
    pub vars: Option<Value>,
}

/// `delay`: wait before going on.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Delay {
    /// Seconds (fractions allowed). Required.
    pub duration: f64,
    /// Share of requests delayed, 0..=100; default all.
    #[serde(default)]
    pub percentage: Option<u8>,
    /// Expressions of which one must hold: `[[[var, op, value], ...], ...]` (APISIX).
    #[serde(default)]
    pub vars: Option<Value>,
}

/// Configuration of `fault-injection` (APISIX schema); at least one of `abort`, `delay`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultInjection {
    /// Abort settings.
    #[serde(default)]
    pub abort: Option<Abort>,
    /// Delay settings.
    #[serde(default)]
    pub delay: Option<Delay>,
}

fn check_pct(field: &str, p: Option<u8>) -> Result<(), FieldError> {
    match p {
        Some(p) if p > 100 => Err(FieldError::new(field, "must be 0..=100")),
        _ => Ok(()),
    }
}

/// Compiles an optional `vars`.
pub fn compile_vars(field: &str, v: Option<&Value>) -> Result<Option<Expr>, FieldError> {
    let Some(v) = v else { return Ok(None) };
    // NB: a list of expressions, one of which must hold (APISIX fault-injection).
    let e = expr::compile_any(field, v)?;
    if e.uses_status() {
        return Err(FieldError::new(
            field,
            "`status` is not known before the upstream answers",
        ));
    }
    Ok(Some(e))
}

impl PluginSchema for FaultInjection {
    const NAME: &'static str = "fault-injection";
    const PRIORITY: i32 = 11000;

    fn check(&self) -> Result<(), FieldError> {
        if self.abort.is_none() && self.delay.is_none() {
            return Err(FieldError::new(
                "",
                "at least one of abort and delay is required",
            ));
        }
        if let Some(a) = &self.abort {
            if !(200..=599).contains(&a.http_status) {
                return Err(FieldError::new("abort.http_status", "must be 200..=599"));
            }
            check_pct("abort.percentage", a.percentage)?;
            compile_vars("abort.vars", a.vars.as_ref())?;
            for (k, v) in a.headers.iter().flatten() {
                crate::rewrite::compile_header_ops("abort.headers", &serde_json::json!({ k: v }))?;
            }
            if let Some(b) = &a.body {
                crate::rewrite::ValueTemplate::parse(b)
                    .map_err(|r| FieldError::new("abort.body", r))?;
            }
        }
        if let Some(d) = &self.delay {
            if !(0.0..=3600.0).contains(&d.duration) {
                return Err(FieldError::new(
                    "delay.duration",
                    "must be 0..=3600 seconds",
                ));
            }
            check_pct("delay.percentage", d.percentage)?;
            compile_vars("delay.vars", d.vars.as_ref())?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::validate;
    use serde_json::json;

    #[test]
    fn checks() {
        validate(
            "fault-injection",
            &json!({"delay": {"duration": "0.5", "percentage": 50}}),
        )
        .unwrap();
        let e = validate("fault-injection", &json!({"abort": {"body": "x"}})).unwrap_err();
        assert!(e.to_string().contains("missing field `http_status`"), "{e}");
        let e = validate("fault-injection", &json!({"delay": {"duration": -1}})).unwrap_err();
        assert!(
            e.to_string().contains("delay.duration: must be 0..=3600"),
            "{e}"
        );
        let e = validate("fault-injection", &json!({"abort": {"http_status": 100}})).unwrap_err();
        assert!(e.to_string().contains("abort.http_status"), "{e}");
    }
}
