//! `uri-blocker`: refuse requests whose URI matches one of `block_rules` (regexes).

use serde::Deserialize;

use crate::{FieldError, PluginSchema, common};

/// Configuration of `uri-blocker` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UriBlocker {
    /// Regexes, each 1..=4096 characters, no duplicates. Required.
    pub block_rules: Vec<String>,
    /// Status of a rejection, 200..=599; default 403.
    #[serde(default = "default_code")]
    pub rejected_code: u16,
    /// Body of a rejection, `{"error_msg":"<msg>"}`; default none (empty body).
    #[serde(default)]
    pub rejected_msg: Option<String>,
    /// Match regardless of case; default false.
    #[serde(default)]
    pub case_insensitive: bool,
}

fn default_code() -> u16 {
    403
}

impl UriBlocker {
    /// The rules compiled into one set (at snapshot compile time).
    pub fn rules(&self) -> Result<regex::RegexSet, FieldError> {
        common::compile_regex_set("block_rules", &self.block_rules, self.case_insensitive)
    }
}

impl PluginSchema for UriBlocker {
    const NAME: &'static str = "uri-blocker";
    const PRIORITY: i32 = 2900;

    fn check(&self) -> Result<(), FieldError> {
        if self.block_rules.is_empty() {
            return Err(FieldError::new("block_rules", "must not be empty"));
        }
        for (i, r) in self.block_rules.iter().enumerate() {
            let n = r.chars().count();
            if n == 0 || n > 4096 {
                return Err(FieldError::new(
                    format!("block_rules[{i}]"),
                    "must be 1..=4096 characters",
                ));
            }
            if let Some(j) = self.block_rules[..i].iter().position(|q| q == r) {
                return Err(FieldError::new(
                    format!("block_rules[{i}]"),
                    format!("duplicates block_rules[{j}]"),
                ));
            }
        }
        common::check_status("rejected_code", self.rejected_code)?;
        common::check_msg("rejected_msg", self.rejected_msg.as_ref())?;
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
            "uri-blocker",
            &json!({"block_rules": ["root.exe", "root.m+"]}),
        )
        .unwrap();
        for (conf, want) in [
            (
                json!({}),
                "plugin \"uri-blocker\": missing field `block_rules`",
            ),
            (
                json!({"block_rules": []}),
                "plugin \"uri-blocker\": block_rules: must not be empty",
            ),
            (
                json!({"block_rules": ["a", ""]}),
                "plugin \"uri-blocker\": block_rules[1]: must be 1..=4096 characters",
            ),
            (
                json!({"block_rules": ["a", "b", "a"]}),
                "plugin \"uri-blocker\": block_rules[2]: duplicates block_rules[0]",
            ),
            (
                json!({"block_rules": ["a"], "rejected_code": 199}),
                "plugin \"uri-blocker\": rejected_code: 199 is out of range 200..=599",
            ),
            (
                json!({"block_rules": ["a"], "rejected_msg": ""}),
                "plugin \"uri-blocker\": rejected_msg: must not be empty",
            ),
        ] {
            assert_eq!(
                validate("uri-blocker", &conf).unwrap_err().to_string(),
                want
            );
        }
        let e = validate("uri-blocker", &json!({"block_rules": ["ok", "a{2,1}"]})).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("plugin \"uri-blocker\": block_rules[1]: not a valid regex"),
            "{e}"
        );
        // A rule whose compiled program is too big is refused at validation (bounded size).
        let e = validate("uri-blocker", &json!({"block_rules": ["(\\w{100}){100}"]})).unwrap_err();
        assert!(
            e.to_string().contains("block_rules[0]: regex")
                && e.to_string().contains("compiles to more than"),
            "{e}"
        );
        let e = validate(
            "uri-blocker",
            &json!({"block_rules": ["a"], "rejected_message": "x"}),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("plugin \"uri-blocker\": rejected_message: unknown field"),
            "{e}"
        );
        let long = "a".repeat(4097);
        let e = validate("uri-blocker", &json!({"block_rules": [long]})).unwrap_err();
        assert!(
            e.to_string()
                .contains("block_rules[0]: must be 1..=4096 characters"),
            "{e}"
        );
    }
}
