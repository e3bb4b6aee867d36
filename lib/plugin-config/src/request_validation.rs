//! `request-validation`: check request headers and body against JSON Schemas.

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::{FieldError, PluginSchema, common};

/// Largest request body read when neither `max_req_body_size` nor client-control's
/// `max_body_size` sets one (APISIX: 64 MiB; Sluice keeps the body in memory).
pub const DEFAULT_MAX_BODY: u64 = 1024 * 1024;

/// Largest `max_req_body_size` accepted: the body is held in memory while it is checked.
pub use crate::common::MAX_BODY_LIMIT;

/// Largest compiled program of one `pattern` (`regex` crate size limit).
const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// Configuration of `request-validation` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestValidation {
    /// JSON Schema of the request headers, seen as an object of lower-case names to a
    /// string (an array of strings for a repeated header). At least one of
    /// `header_schema` and `body_schema` is required.
    #[serde(default)]
    pub header_schema: Option<Map<String, Value>>,
    /// JSON Schema of the body: JSON, or an `application/x-www-form-urlencoded` form seen
    /// as an object of strings.
    #[serde(default)]
    pub body_schema: Option<Map<String, Value>>,
    /// Largest body read, bytes, 1..=64 MiB; default 1 MiB (APISIX: 64 MiB), or
    /// client-control's `max_body_size` when that is smaller.
    #[serde(default)]
    pub max_req_body_size: Option<u64>,
    /// Status of a rejection, 200..=599; default 400.
    #[serde(default = "default_rejected_code")]
    pub rejected_code: u16,
    /// Body of a rejection (1..=256 characters); default the reason.
    #[serde(default)]
    pub rejected_msg: Option<String>,
}

fn default_rejected_code() -> u16 {
    400
}

/// A compiled schema.
pub struct CompiledSchema(jsonschema::Validator);

impl std::fmt::Debug for CompiledSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompiledSchema")
    }
}

impl CompiledSchema {
    /// Checks `instance`: `Err` with the first violation, e.g.
    /// `"name" is a required property (at /)`.
    pub fn check(&self, instance: &Value) -> Result<(), String> {
        match self.0.iter_errors(instance).next() {
            None => Ok(()),
            Some(e) => {
                let at = e.instance_path().to_string();
                let at = if at.is_empty() { "/".to_owned() } else { at };
                Err(format!("{e} (at {at})"))
            }
        }
    }
}

/// Compiles `schema` (field `field`) as APISIX's validator reads it: draft 7 unless its
/// `$schema` names another draft (4, 6, 2019-09, 2020-12); `pattern`s with the linear-time
/// `regex` engine; no remote `$ref` (nothing is fetched).
pub fn compile(field: &str, schema: &Map<String, Value>) -> Result<CompiledSchema, FieldError> {
    let value = Value::Object(schema.clone());
    let mut options = jsonschema::options()
        .with_pattern_options(jsonschema::PatternOptions::regex().size_limit(PATTERN_SIZE_LIMIT));
    if !schema.contains_key("$schema") {
        options = options.with_draft(jsonschema::Draft::Draft7);
    }
    options
        .build(&value)
        .map(CompiledSchema)
        .map_err(|e| FieldError::new(field, format!("is not a valid JSON Schema: {e}")))
}

impl RequestValidation {
    /// `header_schema` with the names of its top-level `properties` and `required` in
    /// lower case: headers are matched whatever their case, as APISIX's header table is.
    pub fn header_schema_lowercased(&self) -> Option<Map<String, Value>> {
        let mut schema = self.header_schema.clone()?;
        if let Some(Value::Object(props)) = schema.get_mut("properties") {
            let lowered: Map<String, Value> = std::mem::take(props)
                .into_iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v))
                .collect();
            *props = lowered;
        }
        if let Some(Value::Array(required)) = schema.get_mut("required") {
            for r in required.iter_mut() {
                if let Value::String(s) = r {
                    *s = s.to_ascii_lowercase();
                }
            }
        }
        Some(schema)
    }

    /// The compiled `header_schema`, if any.
    pub fn compiled_header_schema(&self) -> Result<Option<CompiledSchema>, FieldError> {
        self.header_schema_lowercased()
            .map(|s| compile("header_schema", &s))
            .transpose()
    }

    /// The compiled `body_schema`, if any.
    pub fn compiled_body_schema(&self) -> Result<Option<CompiledSchema>, FieldError> {
        self.body_schema
            .as_ref()
            .map(|s| compile("body_schema", s))
            .transpose()
    }
}

impl PluginSchema for RequestValidation {
    const NAME: &'static str = "request-validation";
    const PRIORITY: i32 = 2800;

    fn check(&self) -> Result<(), FieldError> {
        if self.header_schema.is_none() && self.body_schema.is_none() {
            return Err(FieldError::new(
                "",
                "at least one of header_schema and body_schema is required",
            ));
        }
        self.compiled_header_schema()?;
        self.compiled_body_schema()?;
        if let Some(n) = self.max_req_body_size {
            common::check_body_size("max_req_body_size", n)?;
        }
        common::check_status("rejected_code", self.rejected_code)?;
        common::check_msg("rejected_msg", self.rejected_msg.as_ref())?;
        if self
            .rejected_msg
            .as_ref()
            .is_some_and(|m| m.chars().count() > 256)
        {
            return Err(FieldError::new(
                "rejected_msg",
                "must be at most 256 characters",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::{parse, validate};
    use serde_json::json;

    #[test]
    fn defaults_as_apisix() {
        let c: RequestValidation = parse(&json!({"body_schema": {"type": "object"}})).unwrap();
        assert_eq!(c.rejected_code, 400);
        assert_eq!(c.rejected_msg, None);
        assert_eq!(c.max_req_body_size, None);
        assert!(c.compiled_header_schema().unwrap().is_none());
        let body = c.compiled_body_schema().unwrap().unwrap();
        assert!(body.check(&json!({})).is_ok());
        assert!(body.check(&json!([1])).is_err());
    }

    #[test]
    fn header_names_match_whatever_their_case() {
        let c: RequestValidation = parse(&json!({"header_schema": {
            "type": "object",
            "required": ["X-Api-Version"],
            "properties": {"X-Api-Version": {"type": "string", "enum": ["v1", "v2"]}}
        }}))
        .unwrap();
        let s = c.compiled_header_schema().unwrap().unwrap();
        assert!(s.check(&json!({"x-api-version": "v1"})).is_ok());
        let e = s.check(&json!({"x-api-version": "v3"})).unwrap_err();
        assert!(e.contains("/x-api-version"), "{e}");
        let e = s.check(&json!({})).unwrap_err();
        assert!(
            e.contains("\"x-api-version\" is a required property"),
            "{e}"
        );
    }

    #[test]
    fn drafts_and_patterns() {
        // Draft 7 by default: `exclusiveMinimum` is a number.
        let c: RequestValidation = parse(&json!({"body_schema": {
            "type": "object",
            "properties": {"n": {"type": "number", "exclusiveMinimum": 1}}
        }}))
        .unwrap();
        let s = c.compiled_body_schema().unwrap().unwrap();
        assert!(s.check(&json!({"n": 1})).is_err());
        assert!(s.check(&json!({"n": 2})).is_ok());
        // Draft 4 when asked: `exclusiveMinimum` is a boolean beside `minimum`.
        let c: RequestValidation = parse(&json!({"body_schema": {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "properties": {"n": {"type": "number", "minimum": 1, "exclusiveMinimum": true}}
        }}))
        .unwrap();
        let s = c.compiled_body_schema().unwrap().unwrap();
        assert!(s.check(&json!({"n": 1})).is_err());
        assert!(s.check(&json!({"n": 1.5})).is_ok());
        // A pattern runs in linear time, even one that backtracks exponentially elsewhere.
        let c: RequestValidation = parse(&json!({"body_schema": {
            "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}
        }}))
        .unwrap();
        let s = c.compiled_body_schema().unwrap().unwrap();
        let evil = format!("{}!", "a".repeat(5000));
        assert!(s.check(&json!({ "s": evil })).is_err());
    }

    #[test]
    fn checks() {
        for (conf, want) in [
            (
                json!({}),
                "at least one of header_schema and body_schema is required",
            ),
            (
                json!({"body_schema": {"type": "objekt"}}),
                "body_schema: is not a valid JSON Schema: ",
            ),
            (
                json!({"header_schema": {"properties": {"a": {"minLength": -1}}}}),
                "header_schema: is not a valid JSON Schema: ",
            ),
            (
                json!({"body_schema": {"$ref": "http://example.com/schema.json"}}),
                "body_schema: is not a valid JSON Schema: ",
            ),
            (
                json!({"body_schema": {"properties": {"s": {"pattern": "(?<=a)b"}}}}),
                "body_schema: is not a valid JSON Schema: ",
            ),
            (
                json!({"body_schema": "object"}),
                "body_schema: invalid type: string \"object\", expected a map",
            ),
            (
                json!({"body_schema": {}, "rejected_code": 600}),
                "rejected_code: 600 is out of range 200..=599",
            ),
            (
                json!({"body_schema": {}, "rejected_msg": ""}),
                "rejected_msg: must not be empty",
            ),
            (
                json!({"body_schema": {}, "rejected_msg": "x".repeat(257)}),
                "rejected_msg: must be at most 256 characters",
            ),
            (
                json!({"body_schema": {}, "max_req_body_size": 0}),
                "max_req_body_size: 0 is out of range 1..=67108864",
            ),
            (
                json!({"body_schema": {}, "schema": {}}),
                "schema: unknown field `schema`",
            ),
        ] {
            let e = validate("request-validation", &conf)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!("plugin \"request-validation\": {want}")),
                "{conf}: {e}"
            );
        }
        validate(
            "request-validation",
            &json!({"header_schema": {"type": "object"}, "rejected_code": "403", "rejected_msg": "no"}),
        )
        .unwrap();
    }
}
