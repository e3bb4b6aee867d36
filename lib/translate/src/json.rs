//! Canonical JSON for plugin configs: object keys sorted, no whitespace, whatever map type
//! `serde_json` was built with (the `preserve_order` feature may be on elsewhere in the
//! workspace), so equal configs are equal bytes.

use serde_json::Value;

/// `value` as canonical JSON.
pub(crate) fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write(value, &mut out);
    out
}

fn write(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(v, out);
            }
            out.push(']');
        }
        // Scalars have exactly one rendering.
        other => out.push_str(&other.to_string()),
    }
}

/// Sets `config[a][b]...` for a dotted key `a.b...` to `value`, creating objects on the way.
/// Fails when a prefix of the key holds a non-object value.
pub(crate) fn set_dotted(
    config: &mut serde_json::Map<String, Value>,
    key: &str,
    value: Value,
) -> Result<(), String> {
    let mut parts = key.split('.').peekable();
    let mut cur = config;
    let mut walked = String::new();
    while let Some(part) = parts.next() {
        if part.is_empty() {
            return Err(format!("key {key:?} has an empty segment"));
        }
        if parts.peek().is_none() {
            cur.insert(part.to_owned(), value);
            return Ok(());
        }
        if !walked.is_empty() {
            walked.push('.');
        }
        walked.push_str(part);
        let slot = cur
            .entry(part.to_owned())
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        cur = match slot {
            Value::Object(map) => map,
            _ => {
                return Err(format!(
                    "key {key:?}: config field {walked:?} is not an object"
                ));
            }
        };
    }
    Err(format!("key {key:?} is empty"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_sorted_at_every_level() {
        let v = json!({"b": 1, "a": {"d": [true, null, {"z": 1, "y": "x\"y"}], "c": 1.5}});
        assert_eq!(
            canonical(&v),
            r#"{"a":{"c":1.5,"d":[true,null,{"y":"x\"y","z":1}]},"b":1}"#
        );
    }

    #[test]
    fn dotted_keys_nest() {
        let mut m = serde_json::Map::new();
        m.insert("redis".into(), json!({"host": "r"}));
        m.insert("count".into(), json!(1));
        set_dotted(&mut m, "redis.password", json!("pw")).unwrap();
        set_dotted(&mut m, "a.b.c", json!("x")).unwrap();
        set_dotted(&mut m, "count", json!("2")).unwrap();
        assert_eq!(
            Value::Object(m.clone()),
            json!({"redis": {"host": "r", "password": "pw"}, "a": {"b": {"c": "x"}}, "count": "2"})
        );
        let e = set_dotted(&mut m, "count.x", json!("y")).unwrap_err();
        assert!(e.contains("\"count\" is not an object"), "{e}");
        assert!(set_dotted(&mut m, "a..b", json!(1)).is_err());
    }
}
