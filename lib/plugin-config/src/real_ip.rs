//! `real-ip`: take the client address from a header or argument set by a trusted proxy.

use ipnet::IpNet;
use serde::Deserialize;

use crate::vars::Var;
use crate::{FieldError, PluginSchema};

/// Configuration of `real-ip` (APISIX schema).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RealIp {
    /// Where the address is read: `http_x_forwarded_for`, `http_<header>`, `arg_<name>`,
    /// `remote_addr`... Required.
    pub source: String,
    /// Only connections from these IPs/CIDRs may set the address; default: any.
    #[serde(default)]
    pub trusted_addresses: Option<Vec<String>>,
    /// With a list source (X-Forwarded-For), skip trusted addresses from the right and take
    /// the first untrusted one; default false (take the last address).
    #[serde(default)]
    pub recursive: bool,
}

impl RealIp {
    /// The compiled source variable and trusted networks.
    pub fn compile(&self) -> Result<(Var, Vec<IpNet>), FieldError> {
        let var =
            Var::parse(self.source.strip_prefix('$').unwrap_or(&self.source)).ok_or_else(|| {
                FieldError::new("source", format!("unknown variable {:?}", self.source))
            })?;
        let nets = self
            .trusted_addresses
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, s)| crate::ip_restriction::parse_net(&format!("trusted_addresses[{i}]"), s))
            .collect::<Result<_, _>>()?;
        Ok((var, nets))
    }
}

impl PluginSchema for RealIp {
    const NAME: &'static str = "real-ip";
    const PRIORITY: i32 = 23000;

    fn check(&self) -> Result<(), FieldError> {
        if self.source.is_empty() {
            return Err(FieldError::new("source", "must not be empty"));
        }
        self.compile().map(|_| ())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::validate;
    use serde_json::json;

    #[test]
    fn checks() {
        validate("real-ip", &json!({"source": "http_x_real_ip"})).unwrap();
        let e = validate(
            "real-ip",
            &json!({"source": "http_x_forwarded_for", "trusted_addresses": ["x"]}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("trusted_addresses[0]"), "{e}");
        let e = validate("real-ip", &json!({"source": ""})).unwrap_err();
        assert!(e.to_string().contains("source: must not be empty"), "{e}");
    }
}
