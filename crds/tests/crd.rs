//! The generated CRDs: committed file up to date, structural schemas the API server accepts,
//! and schemas that accept (without pruning anything from) the documentation fixtures.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Deserialize;
use serde_json::Value;
use sluice_crds::{CRDGEN_COMMAND, crds, crds_yaml};

/// This crate's directory, read when the test runs (cargo sets `CARGO_MANIFEST_DIR` for test
/// processes). NB: not `env!` alone: CI keeps the build cache outside the clone, and a test
/// binary another clone built would look for files in that clone.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
}

fn committed() -> std::path::PathBuf {
    manifest_dir().join("apisix-crds.yaml")
}

#[test]
fn committed_crd_yaml_is_up_to_date() {
    let generated = crds_yaml().unwrap();
    let committed = std::fs::read_to_string(committed()).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}\nrun `{CRDGEN_COMMAND}` from the repository root",
            committed().display()
        )
    });
    if generated != committed {
        let (line, (want, got)) = generated
            .lines()
            .chain(std::iter::repeat("<end of file>"))
            .zip(committed.lines().chain(std::iter::repeat("<end of file>")))
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .unwrap_or((0, ("", "")));
        panic!(
            "crds/apisix-crds.yaml is out of date with the Rust types \
             (first difference at line {}: expected {want:?}, found {got:?}).\n\
             run `{CRDGEN_COMMAND}` from the repository root and commit the result",
            line + 1
        );
    }
}

#[test]
fn committed_yaml_parses_as_six_crds() {
    let text = std::fs::read_to_string(committed()).unwrap();
    let docs: Vec<CustomResourceDefinition> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| CustomResourceDefinition::deserialize(d).unwrap())
        .collect();
    let names: Vec<_> = docs
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "apisixroutes.apisix.apache.org",
            "apisixupstreams.apisix.apache.org",
            "apisixtlses.apisix.apache.org",
            "apisixpluginconfigs.apisix.apache.org",
            "apisixconsumers.apisix.apache.org",
            "apisixglobalrules.apisix.apache.org",
        ]
    );
}

#[test]
fn names_scope_subresources_and_columns() {
    let expected = [
        ("ApisixRoute", "apisixroutes", "ar"),
        ("ApisixUpstream", "apisixupstreams", "au"),
        ("ApisixTls", "apisixtlses", "atls"),
        ("ApisixPluginConfig", "apisixpluginconfigs", "apc"),
        ("ApisixConsumer", "apisixconsumers", "ac"),
        ("ApisixGlobalRule", "apisixglobalrules", "agr"),
    ];
    let all = crds();
    assert_eq!(all.len(), expected.len());
    for (crd, (kind, plural, short)) in all.iter().zip(expected) {
        let spec = &crd.spec;
        assert_eq!(spec.group, "apisix.apache.org");
        assert_eq!(spec.scope, "Namespaced", "{kind}");
        assert_eq!(spec.names.kind, kind);
        assert_eq!(spec.names.plural, plural);
        assert_eq!(
            spec.names.short_names.as_deref(),
            Some(&[short.to_owned()][..])
        );
        assert_eq!(spec.versions.len(), 1);
        let v = &spec.versions[0];
        assert_eq!(v.name, "v2");
        assert!(v.served && v.storage, "{kind}");
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            "{kind} has the status subresource"
        );
        let cols: Vec<(&str, &str)> = v
            .additional_printer_columns
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|c| (c.name.as_str(), c.json_path.as_str()))
            .collect();
        for want in [
            (
                "Accepted",
                r#".status.conditions[?(@.type=="Accepted")].status"#,
            ),
            (
                "Programmed",
                r#".status.conditions[?(@.type=="Programmed")].status"#,
            ),
            ("Age", ".metadata.creationTimestamp"),
        ] {
            assert!(
                cols.contains(&want),
                "{kind} lacks column {want:?}: {cols:?}"
            );
        }
        let schema = serde_json::to_value(v.schema.as_ref().unwrap()).unwrap();
        let spec_props = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"];
        assert_eq!(
            spec_props["ingressClassName"]["type"], "string",
            "{kind} has spec.ingressClassName"
        );
    }
    let route = &all[0].spec.versions[0];
    let cols: Vec<_> = route
        .additional_printer_columns
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|c| (c.name.as_str(), c.json_path.as_str()))
        .collect();
    assert!(
        cols.contains(&("Hosts", ".spec.http[*].match.hosts")),
        "{cols:?}"
    );
    assert!(
        cols.contains(&("URIs", ".spec.http[*].match.paths")),
        "{cols:?}"
    );
}

fn root_schema(kind: &str) -> Value {
    let crd = crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap();
    let v = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
    v["openAPIV3Schema"].clone()
}

/// Collects violations of the rules the API server enforces on structural schemas (and of the
/// shapes kube's generator must not leave behind).
fn structural_violations(node: &Value, path: &str, out: &mut Vec<String>) {
    let Some(obj) = node.as_object() else {
        out.push(format!("{path}: schema is not an object"));
        return;
    };
    for forbidden in [
        "$ref",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "definitions",
        "$defs",
    ] {
        if obj.contains_key(forbidden) {
            out.push(format!("{path}: contains `{forbidden}`"));
        }
    }
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    let preserve = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    let ty = obj.get("type").and_then(Value::as_str);
    if ty.is_none() && !int_or_string && !preserve {
        out.push(format!("{path}: no `type`"));
    }
    if int_or_string && ty.is_some() {
        out.push(format!("{path}: int-or-string must not set `type`"));
    }
    if let Some(ap) = obj.get("additionalProperties") {
        if !ap.is_object() {
            out.push(format!(
                "{path}: additionalProperties must be a schema, got {ap}"
            ));
        }
        if obj.contains_key("properties") {
            out.push(format!("{path}: both properties and additionalProperties"));
        }
    }
    if ty == Some("array") && !obj.contains_key("items") {
        out.push(format!("{path}: array without items"));
    }
    if let Some(req) = obj.get("required").and_then(Value::as_array) {
        for r in req {
            let r = r.as_str().unwrap_or_default();
            if obj["properties"].get(r).is_none() {
                out.push(format!("{path}: required `{r}` is not a property"));
            }
        }
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            structural_violations(v, &format!("{path}.{k}"), out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(v) = obj.get(key).filter(|v| v.is_object()) {
            structural_violations(v, &format!("{path}[{key}]"), out);
        }
    }
}

#[test]
fn schemas_are_structural() {
    for crd in crds() {
        let kind = crd.spec.names.kind.clone();
        let mut out = Vec::new();
        structural_violations(&root_schema(&kind), &kind, &mut out);
        assert!(out.is_empty(), "{kind}:\n{}", out.join("\n"));
    }
}

#[test]
fn structural_check_can_fail() {
    let bad = serde_json::json!({
        "type": "object",
        "properties": {
            "a": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "b": {"type": "array"},
            "c": {"type": "object", "properties": {}, "additionalProperties": true}
        },
        "required": ["d"]
    });
    let mut out = Vec::new();
    structural_violations(&bad, "X", &mut out);
    assert_eq!(out.len(), 6, "{out:#?}");
}

/// A small validator for the subset of OpenAPI the generated schemas use. Reports values the API
/// server would reject, and fields it would silently prune.
fn validate(schema: &Value, value: &Value, path: &str, out: &mut Vec<String>) {
    if value.is_null() {
        if schema["nullable"] != Value::Bool(true) {
            out.push(format!("{path}: null is not allowed"));
        }
        return;
    }
    if schema["x-kubernetes-int-or-string"] == Value::Bool(true) {
        if !(value.is_i64() || value.is_string()) {
            out.push(format!("{path}: expected int or string, got {value}"));
        }
        return;
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        out.push(format!("{path}: {value} is not one of {allowed:?}"));
    }
    let type_ok = match schema["type"].as_str() {
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some("array") => value.is_array(),
        Some("object") => value.is_object(),
        _ => true,
    };
    if !type_ok {
        out.push(format!("{path}: {value} is not of type {}", schema["type"]));
        return;
    }
    if let (Some(p), Some(s)) = (schema["pattern"].as_str(), value.as_str())
        && !regex::Regex::new(p).unwrap().is_match(s)
    {
        out.push(format!("{path}: {s:?} does not match {p}"));
    }
    if let (Some(min), Some(s)) = (schema["minLength"].as_u64(), value.as_str())
        && (s.chars().count() as u64) < min
    {
        out.push(format!("{path}: shorter than {min}"));
    }
    if let Some(n) = value.as_f64() {
        if schema["minimum"].as_f64().is_some_and(|m| n < m) {
            out.push(format!("{path}: {n} below minimum"));
        }
        if schema["maximum"].as_f64().is_some_and(|m| n > m) {
            out.push(format!("{path}: {n} above maximum"));
        }
    }
    if let Some(items) = value.as_array() {
        if schema["minItems"]
            .as_u64()
            .is_some_and(|m| (items.len() as u64) < m)
        {
            out.push(format!("{path}: fewer than {} items", schema["minItems"]));
        }
        for (i, item) in items.iter().enumerate() {
            validate(&schema["items"], item, &format!("{path}[{i}]"), out);
        }
    }
    if let Some(map) = value.as_object() {
        if schema["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true) {
            return;
        }
        for r in schema["required"].as_array().into_iter().flatten() {
            if !map.contains_key(r.as_str().unwrap_or_default()) {
                out.push(format!("{path}: missing required field {r}"));
            }
        }
        for (k, v) in map {
            let sub = if let Some(p) = schema["properties"].get(k) {
                p
            } else if schema["additionalProperties"].is_object() {
                &schema["additionalProperties"]
            } else {
                out.push(format!(
                    "{path}.{k}: unknown field, the API server would prune it"
                ));
                continue;
            };
            validate(sub, v, &format!("{path}.{k}"), out);
        }
    }
}

fn fixture_documents(file: &str) -> Vec<Value> {
    let path = format!("{}/tests/fixtures/{file}", manifest_dir().display());
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_json::to_value(serde_yaml::Value::deserialize(d).unwrap()).unwrap())
        .collect()
}

fn schema_violations(doc: &Value) -> Vec<String> {
    let kind = doc["kind"].as_str().unwrap();
    let mut doc = doc.clone();
    // apiVersion, kind and metadata are validated by the API server itself, not by the CRD.
    for k in ["apiVersion", "kind", "metadata"] {
        doc.as_object_mut().unwrap().remove(k);
    }
    let mut out = Vec::new();
    validate(&root_schema(kind), &doc, kind, &mut out);
    out
}

#[test]
fn fixtures_validate_against_the_crd_schemas_without_pruning() {
    let files = [
        "apisixroute.yaml",
        "apisixupstream.yaml",
        "apisixtls.yaml",
        "apisixconsumer.yaml",
        "apisixpluginconfig.yaml",
        "apisixglobalrule.yaml",
    ];
    let mut n = 0;
    for file in files {
        for doc in fixture_documents(file) {
            let out = schema_violations(&doc);
            assert!(out.is_empty(), "{file}: {}", out.join("\n"));
            n += 1;
        }
    }
    assert_eq!(n, 16, "every fixture document was checked");
}

#[test]
fn schema_rejects_what_the_types_reject() {
    let mut doc = fixture_documents("apisixroute.yaml").remove(0);
    doc["spec"]["http"][0]["match"]["exprs"][0]["op"] = "Bogus".into();
    doc["spec"]["http"][0]["timeout"]["read"] = "10".into();
    doc["spec"]["http"][0]["match"]["paths"] = serde_json::json!([]);
    doc["spec"]["http"][0]["match"]["hots"] = serde_json::json!(["typo.com"]);
    let out = schema_violations(&doc).join("\n");
    assert!(out.contains("\"Bogus\" is not one of"), "{out}");
    assert!(out.contains("timeout.read: \"10\" does not match"), "{out}");
    assert!(out.contains("match.paths: fewer than 1 items"), "{out}");
    assert!(out.contains("match.hots: unknown field"), "{out}");
}

#[test]
fn duration_pattern_agrees_with_parse_duration() {
    let re = regex::Regex::new(sluice_crds::DURATION_PATTERN).unwrap();
    let samples = [
        "0",
        "0s",
        "30s",
        "500ms",
        "1m30s",
        "1.5h",
        ".5s",
        "1.s",
        "15µs",
        "15μs",
        "15us",
        "7ns",
        "1h2m3s4ms",
        "",
        "30",
        "5d",
        "-1s",
        "+1s",
        "s",
        "1s.",
        " 1s",
        "1 s",
        "1.2.3s",
        "00",
        "1S",
        "1sec",
    ];
    for s in samples {
        assert_eq!(
            re.is_match(s),
            sluice_crds::parse_duration(s).is_ok(),
            "pattern and parser disagree on {s:?}"
        );
    }
}
