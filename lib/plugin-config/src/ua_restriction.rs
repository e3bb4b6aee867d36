//! `ua-restriction`: allow or deny clients by their `User-Agent` (regexes).

use serde::Deserialize;

use crate::{FieldError, PluginSchema, common};

/// Configuration of `ua-restriction` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UaRestriction {
    /// Let a request without `User-Agent` through; default false (it is refused).
    #[serde(default)]
    pub bypass_missing: bool,
    /// Regexes: only a matching `User-Agent` passes (exactly one of `allowlist`/`denylist`).
    #[serde(default)]
    pub allowlist: Option<Vec<String>>,
    /// Regexes: a matching `User-Agent` is refused.
    #[serde(default)]
    pub denylist: Option<Vec<String>>,
    /// Message of a rejection (403 `{"message":...}`), 1..=1024 characters; default
    /// `Not allowed`.
    #[serde(default = "default_message")]
    pub message: String,
}

fn default_message() -> String {
    "Not allowed".into()
}

impl UaRestriction {
    /// The compiled rules and whether they are an allowlist.
    pub fn rules(&self) -> Result<(regex::RegexSet, bool), FieldError> {
        let (list, field, allow) = match (&self.allowlist, &self.denylist) {
            (Some(a), None) => (a, "allowlist", true),
            (None, Some(d)) => (d, "denylist", false),
            _ => {
                return Err(FieldError::new(
                    "",
                    "exactly one of allowlist and denylist is required",
                ));
            }
        };
        if list.is_empty() {
            return Err(FieldError::new(field, "must not be empty"));
        }
        if let Some(i) = list.iter().position(String::is_empty) {
            return Err(FieldError::new(
                format!("{field}[{i}]"),
                "must not be empty",
            ));
        }
        Ok((common::compile_regex_set(field, list, false)?, allow))
    }
}

impl PluginSchema for UaRestriction {
    const NAME: &'static str = "ua-restriction";
    const PRIORITY: i32 = 2999;

    fn check(&self) -> Result<(), FieldError> {
        if self.message.is_empty() || self.message.chars().count() > 1024 {
            return Err(FieldError::new("message", "must be 1..=1024 characters"));
        }
        self.rules().map(drop)
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
            "ua-restriction",
            &json!({"denylist": ["curl/.*", "(Baiduspider)"]}),
        )
        .unwrap();
        validate(
            "ua-restriction",
            &json!({"allowlist": ["Mozilla"], "bypass_missing": true}),
        )
        .unwrap();
        for (conf, want) in [
            (
                json!({}),
                "plugin \"ua-restriction\": exactly one of allowlist and denylist is required",
            ),
            (
                json!({"allowlist": ["a"], "denylist": ["b"]}),
                "plugin \"ua-restriction\": exactly one of allowlist and denylist is required",
            ),
            (
                json!({"denylist": []}),
                "plugin \"ua-restriction\": denylist: must not be empty",
            ),
            (
                json!({"denylist": ["ok", ""]}),
                "plugin \"ua-restriction\": denylist[1]: must not be empty",
            ),
            (
                json!({"denylist": ["a"], "message": ""}),
                "plugin \"ua-restriction\": message: must be 1..=1024 characters",
            ),
        ] {
            assert_eq!(
                validate("ua-restriction", &conf).unwrap_err().to_string(),
                want
            );
        }
        let e = validate("ua-restriction", &json!({"allowlist": ["ok", "(unclosed"]})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "plugin \"ua-restriction\": allowlist[1]: not a valid regex: unclosed group"
        );
        let e = validate(
            "ua-restriction",
            &json!({"bypass_missing": "maybe", "denylist": ["a"]}),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("bypass_missing: invalid type"),
            "{e}"
        );
    }
}
