//! `client-control`: per-route limits on what a client sends (`max_body_size`).

use serde::Deserialize;

use crate::PluginSchema;

/// Configuration of `client-control` (APISIX schema).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientControl {
    /// Largest request body in bytes; 0 = no limit; default none (no limit).
    #[serde(default)]
    pub max_body_size: Option<u64>,
}

impl PluginSchema for ClientControl {
    const NAME: &'static str = "client-control";
    const PRIORITY: i32 = 22000;
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::validate;
    use serde_json::json;

    #[test]
    fn checks() {
        validate("client-control", &json!({})).unwrap();
        validate("client-control", &json!({"max_body_size": 0})).unwrap();
        validate("client-control", &json!({"max_body_size": "1024"})).unwrap();
        let e = validate("client-control", &json!({"max_body_size": -1})).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("plugin \"client-control\": max_body_size: invalid value"),
            "{e}"
        );
    }
}
