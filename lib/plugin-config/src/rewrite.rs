//! Pieces shared by the rewriting plugins (proxy-rewrite, response-rewrite, redirect):
//! value templates with `$var` / `${var}` / `$1` references, `regex_uri` pairs and header
//! operations `{add, set, remove}` (or the legacy flat map).

use regex::Regex;
use serde_json::Value;

use crate::FieldError;
use crate::vars::Var;

/// A piece of a [`ValueTemplate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TPiece {
    /// Literal text.
    Text(String),
    /// A request variable (`$uri`, `$http_x_user`, ...).
    Var(Var),
    /// A capture of the matched `regex_uri` (`$1`, `${2}`); `$0` is the whole match.
    Capture(usize),
}

/// Text with variable and capture references, parsed once. Unlike
/// [`crate::vars::Template`] it may be plain text. `\$` is a literal `$`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueTemplate {
    /// The pieces in order.
    pub pieces: Vec<TPiece>,
}

impl ValueTemplate {
    /// Parses `text`; an unknown variable is an error naming it.
    pub fn parse(text: &str) -> Result<ValueTemplate, String> {
        let mut pieces = Vec::new();
        let mut lit = String::new();
        let mut chars = text.char_indices().peekable();
        let bytes = text;
        while let Some((i, c)) = chars.next() {
            if c == '\\' && bytes[i + 1..].starts_with('$') {
                lit.push('$');
                chars.next();
                continue;
            }
            if c != '$' {
                lit.push(c);
                continue;
            }
            let rest = &text[i + 1..];
            let (name, used) = if let Some(r) = rest.strip_prefix('{') {
                let end = r
                    .find('}')
                    .ok_or_else(|| format!("unclosed `${{` in {text:?}"))?;
                (&r[..end], end + 2)
            } else {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                (&rest[..end], end)
            };
            if name.is_empty() {
                lit.push('$');
                continue;
            }
            let piece = if let Ok(n) = name.parse::<usize>() {
                TPiece::Capture(n)
            } else {
                TPiece::Var(Var::parse(name).ok_or_else(|| {
                    format!(
                        "unknown variable ${name} (supported: remote_addr, remote_port, \
                         server_addr, server_port, uri, request_uri, args, host, \
                         request_method, scheme, route_id, consumer_name, http_*, arg_*, \
                         cookie_*)"
                    )
                })?)
            };
            if !lit.is_empty() {
                pieces.push(TPiece::Text(std::mem::take(&mut lit)));
            }
            pieces.push(piece);
            for _ in 0..used {
                chars.next();
            }
        }
        if !lit.is_empty() {
            pieces.push(TPiece::Text(lit));
        }
        Ok(ValueTemplate { pieces })
    }

    /// The text when the template has no references.
    pub fn as_literal(&self) -> Option<&str> {
        match self.pieces.as_slice() {
            [] => Some(""),
            [TPiece::Text(t)] => Some(t),
            _ => None,
        }
    }

    /// The highest capture referenced (0 when none).
    pub fn max_capture(&self) -> usize {
        self.pieces
            .iter()
            .map(|p| match p {
                TPiece::Capture(n) => *n,
                _ => 0,
            })
            .max()
            .unwrap_or(0)
    }
}

/// One `regex_uri` pair: a pattern matched against the path and the template of the new
/// URI.
#[derive(Debug, Clone)]
pub struct RegexUri {
    /// The pattern.
    pub regex: Regex,
    /// The replacement (`$1` ... captures, `$var` variables).
    pub template: ValueTemplate,
}

/// Compiles a flat `[pattern, replacement, pattern, replacement, ...]` array (field
/// `regex_uri`); `max_pairs` limits the number of pairs (redirect allows one).
pub fn compile_regex_uri(list: &[String], max_pairs: usize) -> Result<Vec<RegexUri>, FieldError> {
    if list.is_empty() || !list.len().is_multiple_of(2) {
        return Err(FieldError::new(
            "regex_uri",
            "must hold pairs [pattern, replacement, ...] (an even, non-zero number of strings)",
        ));
    }
    if list.len() / 2 > max_pairs {
        return Err(FieldError::new(
            "regex_uri",
            format!("at most {max_pairs} [pattern, replacement] pair(s)"),
        ));
    }
    let mut out = Vec::new();
    for (i, pair) in list.chunks(2).enumerate() {
        let (Some(pat), Some(rep)) = (pair.first(), pair.get(1)) else {
            continue;
        };
        let regex = Regex::new(pat).map_err(|e| {
            FieldError::new(format!("regex_uri[{}]", 2 * i), format!("bad regex: {e}"))
        })?;
        let template = ValueTemplate::parse(rep)
            .map_err(|r| FieldError::new(format!("regex_uri[{}]", 2 * i + 1), r))?;
        if template.max_capture() >= regex.captures_len() {
            return Err(FieldError::new(
                format!("regex_uri[{}]", 2 * i + 1),
                format!(
                    "references capture ${} but the pattern has {} group(s)",
                    template.max_capture(),
                    regex.captures_len() - 1
                ),
            ));
        }
        out.push(RegexUri { regex, template });
    }
    Ok(out)
}

/// Header operations, applied in the order add, set, remove (APISIX 3.x).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderOps {
    /// Appended values.
    pub add: Vec<(http::HeaderName, ValueTemplate)>,
    /// Removed headers.
    pub remove: Vec<http::HeaderName>,
    /// Replaced (or created) headers; several values replace with several headers.
    pub set: Vec<(http::HeaderName, Vec<ValueTemplate>)>,
}

impl HeaderOps {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty() && self.set.is_empty()
    }
}

fn header_name(field: &str, name: &str) -> Result<http::HeaderName, FieldError> {
    http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
        .map_err(|_| FieldError::new(field, format!("{name:?} is not a valid header name")))
}

fn header_values(field: &str, v: &Value) -> Result<Vec<ValueTemplate>, FieldError> {
    let one = |s: &str| -> Result<ValueTemplate, FieldError> {
        if s.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(FieldError::new(
                field,
                "a header value must not hold CR, LF or NUL",
            ));
        }
        ValueTemplate::parse(s).map_err(|r| FieldError::new(field, r))
    };
    match v {
        Value::String(s) => Ok(vec![one(s)?]),
        Value::Number(n) => Ok(vec![one(&n.to_string())?]),
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|i| match i {
                Value::String(s) => one(s),
                Value::Number(n) => one(&n.to_string()),
                _ => Err(FieldError::new(field, "values must be strings")),
            })
            .collect(),
        _ => Err(FieldError::new(
            field,
            "must be a string or a non-empty array of strings",
        )),
    }
}

/// Compiles `headers` (field name `field`): `{add: {..}, set: {..}, remove: [..]}`, or a
/// flat map `{name: value}` meaning set (an empty value removes the header, as APISIX's
/// legacy form).
pub fn compile_header_ops(field: &str, v: &Value) -> Result<HeaderOps, FieldError> {
    let Value::Object(map) = v else {
        return Err(FieldError::new(field, "must be an object"));
    };
    let mut ops = HeaderOps::default();
    let verbs = ["add", "set", "remove"];
    let structured = !map.is_empty() && map.keys().all(|k| verbs.contains(&k.as_str()));
    if !structured {
        for (k, val) in map {
            let f = format!("{field}.{k}");
            let name = header_name(&f, k)?;
            if val.as_str() == Some("") {
                ops.remove.push(name);
            } else {
                ops.set.push((name, header_values(&f, val)?));
            }
        }
        return Ok(ops);
    }
    if let Some(add) = map.get("add") {
        let Value::Object(add) = add else {
            return Err(FieldError::new(format!("{field}.add"), "must be an object"));
        };
        for (k, val) in add {
            let f = format!("{field}.add.{k}");
            let name = header_name(&f, k)?;
            for t in header_values(&f, val)? {
                ops.add.push((name.clone(), t));
            }
        }
    }
    if let Some(set) = map.get("set") {
        let Value::Object(set) = set else {
            return Err(FieldError::new(format!("{field}.set"), "must be an object"));
        };
        for (k, val) in set {
            let f = format!("{field}.set.{k}");
            ops.set.push((header_name(&f, k)?, header_values(&f, val)?));
        }
    }
    if let Some(remove) = map.get("remove") {
        let Value::Array(items) = remove else {
            return Err(FieldError::new(
                format!("{field}.remove"),
                "must be an array of header names",
            ));
        };
        for (i, item) in items.iter().enumerate() {
            let f = format!("{field}.remove[{i}]");
            let Some(s) = item.as_str() else {
                return Err(FieldError::new(f, "must be a string"));
            };
            ops.remove.push(header_name(&f, s)?);
        }
    }
    Ok(ops)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn templates() {
        let t = ValueTemplate::parse("/v2/$1?u=${uri}&x=\\$y$").unwrap();
        assert_eq!(
            t.pieces,
            vec![
                TPiece::Text("/v2/".into()),
                TPiece::Capture(1),
                TPiece::Text("?u=".into()),
                TPiece::Var(Var::Uri),
                TPiece::Text("&x=$y$".into()),
            ]
        );
        assert_eq!(
            ValueTemplate::parse("plain").unwrap().as_literal(),
            Some("plain")
        );
        assert!(ValueTemplate::parse("$nope").unwrap_err().contains("$nope"));
    }

    #[test]
    fn regex_pairs() {
        let p = compile_regex_uri(&["^/a/(.*)".into(), "/b/$1".into()], 8).unwrap();
        assert_eq!(p.len(), 1);
        let e = compile_regex_uri(&["^/a/(.*)".into()], 8).unwrap_err();
        assert_eq!(e.field, "regex_uri");
        let e = compile_regex_uri(&["^/a/(".into(), "/b".into()], 8).unwrap_err();
        assert_eq!(e.field, "regex_uri[0]");
        let e = compile_regex_uri(&["^/a/(.*)".into(), "/b/$2".into()], 8).unwrap_err();
        assert_eq!(e.field, "regex_uri[1]");
    }

    #[test]
    fn header_forms() {
        let o = compile_header_ops(
            "headers",
            &json!({"add": {"X-A": "1"}, "set": {"X-B": ["2", "3"]}, "remove": ["X-C"]}),
        )
        .unwrap();
        assert_eq!(o.add.len(), 1);
        assert_eq!(o.set[0].1.len(), 2);
        assert_eq!(o.remove[0].as_str(), "x-c");
        let o = compile_header_ops("headers", &json!({"X-A": "1", "X-Gone": ""})).unwrap();
        assert_eq!(o.set.len(), 1);
        assert_eq!(o.remove.len(), 1);
        let e = compile_header_ops("headers", &json!({"set": {"bad name": "1"}})).unwrap_err();
        assert_eq!(e.field, "headers.set.bad name");
    }
}
