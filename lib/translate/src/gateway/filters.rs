//! HTTPRoute filters → plugins: `proxy-rewrite`, `response-rewrite`, `redirect` (see the
//! [`http`](super::http) module docs; `RequestMirror` is in [`super::backends`]).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sluice_crds::gateway::{
    HttpHeaderFilter, HttpPathModifier, HttpRequestMirrorFilter, HttpRequestRedirectFilter,
    HttpUrlRewriteFilter,
};
use sluice_proto::v1;

use super::matches::Match;

/// A rule's filters, validated.
#[derive(Default)]
pub(super) struct Filters<'a> {
    pub(super) request_headers: Option<&'a HttpHeaderFilter>,
    pub(super) response_headers: Option<&'a HttpHeaderFilter>,
    pub(super) redirect: Option<&'a HttpRequestRedirectFilter>,
    pub(super) rewrite: Option<&'a HttpUrlRewriteFilter>,
    pub(super) mirror: Option<&'a HttpRequestMirrorFilter>,
}

/// `$` is a variable in plugin templates; header values and paths are literal.
pub(super) fn literal(s: &str) -> String {
    s.replace('$', "\\$")
}

pub(super) fn header_ops(f: &HttpHeaderFilter) -> Option<Value> {
    let mut ops = serde_json::Map::new();
    let mut set = serde_json::Map::new();
    for h in &f.set {
        set.insert(h.name.clone(), Value::String(literal(&h.value)));
    }
    let mut add: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for h in &f.add {
        add.entry(h.name.as_str())
            .or_default()
            .push(literal(&h.value));
    }
    if !set.is_empty() {
        ops.insert("set".into(), Value::Object(set));
    }
    if !add.is_empty() {
        let add: serde_json::Map<String, Value> = add
            .into_iter()
            .map(|(k, v)| (k.to_owned(), json!(v)))
            .collect();
        ops.insert("add".into(), Value::Object(add));
    }
    if !f.remove.is_empty() {
        ops.insert("remove".into(), json!(f.remove));
    }
    (!ops.is_empty()).then_some(Value::Object(ops))
}

pub(super) fn plugin(name: &str, config: &Value, field: &str) -> Result<v1::Plugin, String> {
    sluice_plugin_config::validate(name, config).map_err(|e| format!("{field}: {e}"))?;
    Ok(v1::Plugin {
        name: name.to_owned(),
        config_json: crate::json::canonical(config),
    })
}

/// Plugins of one match of a rule.
/// The plugins of one match's filters. `listener_port`: the Gateway listener port (and
/// whether it is HTTPS) the copy is served on, with per-Gateway ports: a redirect without
/// scheme and port keeps it.
pub(super) fn plugins(
    f: &Filters<'_>,
    m: &Match,
    field: &str,
    listener_port: Option<(u16, bool)>,
) -> Result<Vec<v1::Plugin>, String> {
    let mut out = Vec::new();
    let rewrite = proxy_rewrite(f, m, field)?;
    if !rewrite.is_empty() {
        out.push(plugin("proxy-rewrite", &Value::Object(rewrite), field)?);
    }
    if let Some(h) = f.response_headers.and_then(header_ops) {
        out.push(plugin("response-rewrite", &json!({ "headers": h }), field)?);
    }
    if let Some(r) = f.redirect {
        let config = redirect(r, m, field, listener_port)?;
        out.push(plugin("redirect", &config, field)?);
    }
    Ok(out)
}

/// For a path modifier of `what` (`urlRewrite`, `requestRedirect`): `None` for
/// `ReplaceFullPath`, the escaped prefix of the match and its replacement for
/// `ReplacePrefixMatch`.
pub(super) fn prefix_pairs(
    m: &Match,
    field: &str,
    p: &HttpPathModifier,
    what: &str,
) -> Result<Option<(String, String)>, String> {
    match p.type_.as_str() {
        "ReplaceFullPath" => Ok(None),
        "ReplacePrefixMatch" => {
            let Some(prefix) = &m.prefix else {
                return Err(format!(
                    "{field}.{what}.path: ReplacePrefixMatch needs a PathPrefix match"
                ));
            };
            let to = p.replace_prefix_match.as_deref().unwrap_or("/");
            Ok(Some((
                regex::escape(prefix),
                to.trim_end_matches('/').to_owned(),
            )))
        }
        other => Err(format!(
            "{field}.{what}.path.type: {other} is not supported"
        )),
    }
}

/// The `proxy-rewrite` config of the request header modifier and the URL rewrite; empty
/// when there is none.
pub(super) fn proxy_rewrite(
    f: &Filters<'_>,
    m: &Match,
    field: &str,
) -> Result<serde_json::Map<String, Value>, String> {
    let mut rewrite = serde_json::Map::new();
    if let Some(h) = f.request_headers.and_then(header_ops) {
        rewrite.insert("headers".into(), h);
    }
    let Some(rw) = f.rewrite else {
        return Ok(rewrite);
    };
    if let Some(h) = &rw.hostname {
        rewrite.insert("host".into(), json!(h));
    }
    if let Some(p) = &rw.path {
        match prefix_pairs(m, field, p, "urlRewrite")? {
            None => {
                let full = p.replace_full_path.as_deref().unwrap_or("/");
                rewrite.insert("uri".into(), json!(literal(full)));
            }
            Some((prefix, to)) => {
                let to = literal(&to);
                let exact_to = if to.is_empty() {
                    "/".to_owned()
                } else {
                    to.clone()
                };
                rewrite.insert(
                    "regex_uri".into(),
                    json!([
                        format!("^{prefix}$"),
                        exact_to,
                        format!("^{prefix}(/.*)$"),
                        format!("{to}$1"),
                    ]),
                );
            }
        }
    }
    Ok(rewrite)
}

/// The `redirect` config of a request redirect.
pub(super) fn redirect(
    r: &HttpRequestRedirectFilter,
    m: &Match,
    field: &str,
    listener_port: Option<(u16, bool)>,
) -> Result<Value, String> {
    let code = r.status_code.unwrap_or(302);
    let scheme = r.scheme.as_deref();
    let mut target = match scheme {
        Some(s @ ("http" | "https")) => format!("{s}://"),
        Some(other) => {
            return Err(format!(
                "{field}.requestRedirect.scheme: {other} is not supported (http, https)"
            ));
        }
        None => "$scheme://".to_owned(),
    };
    target.push_str(&r.hostname.as_deref().map_or("$host".to_owned(), literal));
    // The port: dropped when it is the scheme's well-known one. Without port and scheme,
    // the listener's port (on shared ports always the well-known one of its scheme).
    let port = match (r.port, scheme, listener_port) {
        (Some(p), _, _) => Some((p, scheme.map(|s| s == "https"))),
        (None, None, Some((p, https))) => Some((i32::from(p), Some(https))),
        _ => None,
    };
    if let Some((port, https)) = port {
        let well_known = matches!((https, port), (Some(false), 80) | (Some(true), 443));
        if !well_known {
            target.push_str(&format!(":{port}"));
        }
    }
    let config = match &r.path {
        None => {
            json!({"uri": format!("{target}$uri"), "ret_code": code, "append_query_string": true})
        }
        Some(p) => match prefix_pairs(m, field, p, "requestRedirect")? {
            None => json!({
                "uri": format!("{target}{}", literal(p.replace_full_path.as_deref().unwrap_or("/"))),
                "ret_code": code,
                "append_query_string": true,
            }),
            Some((prefix, to)) => json!({
                "regex_uri": [format!("^{prefix}(/.*)?$"), format!("{target}{}$1", literal(&to))],
                "ret_code": code,
                "append_query_string": true,
            }),
        },
    };
    Ok(config)
}
