//! `ip-restriction`: allow or deny clients by IP / CIDR.

use ipnet::IpNet;
use serde::Deserialize;

use crate::{FieldError, PluginSchema};

/// Configuration of `ip-restriction` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpRestriction {
    /// Only these IPs/CIDRs may pass (exactly one of `whitelist`/`blacklist`).
    #[serde(default)]
    pub whitelist: Option<Vec<String>>,
    /// These IPs/CIDRs are denied.
    #[serde(default)]
    pub blacklist: Option<Vec<String>>,
    /// Message of a rejection, 1..=1024 characters; default
    /// `Your IP address is not allowed`.
    #[serde(default = "default_message")]
    pub message: String,
    /// Status of a rejection, 403 or 404; default 403.
    #[serde(default = "default_code")]
    pub response_code: u16,
}

fn default_message() -> String {
    "Your IP address is not allowed".into()
}

fn default_code() -> u16 {
    403
}

/// Parses an IP or CIDR (field `field`).
pub fn parse_net(field: &str, s: &str) -> Result<IpNet, FieldError> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| FieldError::new(field, format!("{s:?} is not an IP address or CIDR")))
}

impl IpRestriction {
    /// The compiled list and whether it is a whitelist.
    pub fn nets(&self) -> Result<(Vec<IpNet>, bool), FieldError> {
        let (list, field, white) = match (&self.whitelist, &self.blacklist) {
            (Some(w), None) => (w, "whitelist", true),
            (None, Some(b)) => (b, "blacklist", false),
            _ => {
                return Err(FieldError::new(
                    "",
                    "exactly one of whitelist and blacklist is required",
                ));
            }
        };
        if list.is_empty() {
            return Err(FieldError::new(field, "must not be empty"));
        }
        let nets = list
            .iter()
            .enumerate()
            .map(|(i, s)| parse_net(&format!("{field}[{i}]"), s))
            .collect::<Result<_, _>>()?;
        Ok((nets, white))
    }
}

impl PluginSchema for IpRestriction {
    const NAME: &'static str = "ip-restriction";
    const PRIORITY: i32 = 3000;

    fn check(&self) -> Result<(), FieldError> {
        if self.message.is_empty() || self.message.len() > 1024 {
            return Err(FieldError::new("message", "must be 1..=1024 characters"));
        }
        if !(403..=404).contains(&self.response_code) {
            return Err(FieldError::new("response_code", "must be 403 or 404"));
        }
        self.nets().map(|_| ())
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
            "ip-restriction",
            &json!({"whitelist": ["10.0.0.0/8", "::1", "fe80::/10"]}),
        )
        .unwrap();
        let e = validate("ip-restriction", &json!({})).unwrap_err();
        assert!(
            e.to_string()
                .contains("exactly one of whitelist and blacklist"),
            "{e}"
        );
        let e = validate("ip-restriction", &json!({"blacklist": []})).unwrap_err();
        assert!(
            e.to_string().contains("blacklist: must not be empty"),
            "{e}"
        );
        let e = validate(
            "ip-restriction",
            &json!({"blacklist": ["1.1.1.1"], "response_code": 401}),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("response_code: must be 403 or 404"),
            "{e}"
        );
        let e = validate("ip-restriction", &json!({"blacklist": "1.1.1.1"})).unwrap_err();
        assert!(e.to_string().contains("blacklist: invalid type"), "{e}");
    }
}
