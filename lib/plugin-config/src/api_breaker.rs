//! `api-breaker`: stop sending a route's requests to an upstream that keeps failing.

use serde::Deserialize;

use crate::{FieldError, PluginSchema, common};

/// One header of the breaker's response.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakHeader {
    /// Name. Required.
    pub key: String,
    /// Value, may use variables (`$remote_addr`). Required.
    pub value: String,
}

/// When the upstream counts as unhealthy.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unhealthy {
    /// Upstream statuses that count as failures (500..=599); default `[500]`.
    #[serde(default = "default_unhealthy_statuses")]
    pub http_statuses: Vec<u16>,
    /// Failures that open the breaker; default 3.
    #[serde(default = "three")]
    pub failures: u64,
}

/// When the upstream counts as healthy again.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Healthy {
    /// Upstream statuses that count as successes (200..=499); default `[200]`.
    #[serde(default = "default_healthy_statuses")]
    pub http_statuses: Vec<u16>,
    /// Successes that close the breaker; default 3.
    #[serde(default = "three")]
    pub successes: u64,
}

impl Default for Unhealthy {
    fn default() -> Self {
        Unhealthy {
            http_statuses: default_unhealthy_statuses(),
            failures: 3,
        }
    }
}

impl Default for Healthy {
    fn default() -> Self {
        Healthy {
            http_statuses: default_healthy_statuses(),
            successes: 3,
        }
    }
}

/// Configuration of `api-breaker` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiBreaker {
    /// Status answered while the breaker is open, 200..=599. Required.
    pub break_response_code: u16,
    /// Body answered while open; default none (empty body).
    #[serde(default)]
    pub break_response_body: Option<String>,
    /// Headers answered while open (only with `break_response_body`, as APISIX).
    #[serde(default)]
    pub break_response_headers: Option<Vec<BreakHeader>>,
    /// Longest time the breaker stays open, seconds (at least 3); default 300.
    #[serde(default = "default_max_breaker_sec")]
    pub max_breaker_sec: u64,
    /// Unhealthy thresholds.
    #[serde(default)]
    pub unhealthy: Unhealthy,
    /// Healthy thresholds.
    #[serde(default)]
    pub healthy: Healthy,
}

fn default_unhealthy_statuses() -> Vec<u16> {
    vec![500]
}
fn default_healthy_statuses() -> Vec<u16> {
    vec![200]
}
fn three() -> u64 {
    3
}
fn default_max_breaker_sec() -> u64 {
    300
}

fn check_statuses(
    field: &str,
    list: &[u16],
    range: std::ops::RangeInclusive<u16>,
) -> Result<(), FieldError> {
    if list.is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    for (i, s) in list.iter().enumerate() {
        if !range.contains(s) {
            return Err(FieldError::new(
                format!("{field}[{i}]"),
                format!("{s} is out of range {}..={}", range.start(), range.end()),
            ));
        }
        if list[..i].contains(s) {
            return Err(FieldError::new(
                format!("{field}[{i}]"),
                format!("{s} is listed twice"),
            ));
        }
    }
    Ok(())
}

impl PluginSchema for ApiBreaker {
    const NAME: &'static str = "api-breaker";
    const PRIORITY: i32 = 1005;

    fn check(&self) -> Result<(), FieldError> {
        common::check_status("break_response_code", self.break_response_code)?;
        if self.max_breaker_sec < 3 {
            return Err(FieldError::new("max_breaker_sec", "must be at least 3"));
        }
        check_statuses(
            "unhealthy.http_statuses",
            &self.unhealthy.http_statuses,
            500..=599,
        )?;
        if self.unhealthy.failures == 0 {
            return Err(FieldError::new("unhealthy.failures", "must be at least 1"));
        }
        check_statuses(
            "healthy.http_statuses",
            &self.healthy.http_statuses,
            200..=499,
        )?;
        if self.healthy.successes == 0 {
            return Err(FieldError::new("healthy.successes", "must be at least 1"));
        }
        for (i, h) in self.break_response_headers.iter().flatten().enumerate() {
            if http::HeaderName::from_bytes(h.key.as_bytes()).is_err() {
                return Err(FieldError::new(
                    format!("break_response_headers[{i}].key"),
                    "must be a valid header name",
                ));
            }
            if h.value.is_empty() {
                return Err(FieldError::new(
                    format!("break_response_headers[{i}].value"),
                    "must not be empty",
                ));
            }
            crate::rewrite::ValueTemplate::parse(&h.value)
                .map_err(|r| FieldError::new(format!("break_response_headers[{i}].value"), r))?;
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
        validate("api-breaker", &json!({"break_response_code": 502})).unwrap();
        for (conf, want) in [
            (
                json!({}),
                "plugin \"api-breaker\": missing field `break_response_code`",
            ),
            (
                json!({"break_response_code": 600}),
                "plugin \"api-breaker\": break_response_code: 600 is out of range 200..=599",
            ),
            (
                json!({"break_response_code": 502, "max_breaker_sec": 2}),
                "plugin \"api-breaker\": max_breaker_sec: must be at least 3",
            ),
            (
                json!({"break_response_code": 502, "unhealthy": {"http_statuses": [500, 404]}}),
                "plugin \"api-breaker\": unhealthy.http_statuses[1]: 404 is out of range 500..=599",
            ),
            (
                json!({"break_response_code": 502, "unhealthy": {"http_statuses": [500, 500]}}),
                "plugin \"api-breaker\": unhealthy.http_statuses[1]: 500 is listed twice",
            ),
            (
                json!({"break_response_code": 502, "unhealthy": {"failures": 0}}),
                "plugin \"api-breaker\": unhealthy.failures: must be at least 1",
            ),
            (
                json!({"break_response_code": 502, "healthy": {"http_statuses": [500]}}),
                "plugin \"api-breaker\": healthy.http_statuses[0]: 500 is out of range 200..=499",
            ),
            (
                json!({"break_response_code": 502, "healthy": {"successes": 0}}),
                "plugin \"api-breaker\": healthy.successes: must be at least 1",
            ),
            (
                json!({"break_response_code": 502, "break_response_headers": [{"key": "a b", "value": "v"}]}),
                "plugin \"api-breaker\": break_response_headers[0].key: must be a valid header name",
            ),
        ] {
            assert_eq!(
                validate("api-breaker", &conf).unwrap_err().to_string(),
                want
            );
        }
        let e = validate(
            "api-breaker",
            &json!({"break_response_code": 502, "break_response_headers": [{"key": "a"}]}),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("break_response_headers[0]: missing field `value`"),
            "{e}"
        );
    }
}
