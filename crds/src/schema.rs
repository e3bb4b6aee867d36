//! Hand-written schema fragments for what the derive cannot express structurally.

use schemars::{Schema, SchemaGenerator, json_schema};

/// An object with arbitrary content: `type: object` + `x-kubernetes-preserve-unknown-fields`.
/// Used for plugin `config`, which the API server must store unchanged.
pub(crate) fn preserve_unknown_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "nullable": true,
        "x-kubernetes-preserve-unknown-fields": true,
    })
}
