//! `consumer-restriction`: allow or deny by consumer name or route id.

use serde::Deserialize;

use crate::{FieldError, PluginSchema, common};

/// What `consumer-restriction` compares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestrictionType {
    /// The authenticated consumer's name (the default).
    #[default]
    ConsumerName,
    /// The matched route's id (configured on a consumer).
    RouteId,
    /// The service id (Sluice has no services; rejected).
    ServiceId,
    /// The consumer group id (Sluice has no consumer groups; rejected).
    ConsumerGroupId,
}

/// One `allowed_by_methods` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AllowedByMethods {
    /// Consumer name.
    pub user: String,
    /// Methods that consumer may use.
    #[serde(default)]
    pub methods: Vec<String>,
}

/// Configuration of `consumer-restriction` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ConsumerRestriction {
    /// What to compare; default `consumer_name`.
    #[serde(default, rename = "type")]
    pub type_: RestrictionType,
    /// Allowed values.
    #[serde(default)]
    pub whitelist: Option<Vec<String>>,
    /// Denied values.
    #[serde(default)]
    pub blacklist: Option<Vec<String>>,
    /// Per-consumer method allow lists.
    #[serde(default)]
    pub allowed_by_methods: Option<Vec<AllowedByMethods>>,
    /// Status of a rejection; default 403.
    #[serde(default = "default_rejected_code")]
    pub rejected_code: u16,
    /// Message of a rejection; default `The consumer_name is forbidden.` (by type).
    #[serde(default)]
    pub rejected_msg: Option<String>,
}

fn default_rejected_code() -> u16 {
    403
}

impl PluginSchema for ConsumerRestriction {
    const NAME: &'static str = "consumer-restriction";
    const PRIORITY: i32 = 2400;

    fn check(&self) -> Result<(), FieldError> {
        match self.type_ {
            RestrictionType::ConsumerName | RestrictionType::RouteId => {}
            t => {
                return Err(FieldError::new(
                    "type",
                    format!("{t:?} is not supported (Sluice has no services or consumer groups)"),
                ));
            }
        }
        for (field, list) in [
            ("whitelist", &self.whitelist),
            ("blacklist", &self.blacklist),
        ] {
            if list.as_ref().is_some_and(Vec::is_empty) {
                return Err(FieldError::new(field, "must have at least one entry"));
            }
        }
        if self.whitelist.is_none() && self.blacklist.is_none() && self.allowed_by_methods.is_none()
        {
            return Err(FieldError::new(
                "",
                "one of whitelist, blacklist or allowed_by_methods is required",
            ));
        }
        common::check_status("rejected_code", self.rejected_code)?;
        common::check_msg("rejected_msg", self.rejected_msg.as_ref())
    }
}
