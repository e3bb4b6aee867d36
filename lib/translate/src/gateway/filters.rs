//! HTTPRoute filters → plugins: `proxy-rewrite`, `response-rewrite`, `redirect`, `cors`
//! (see the [`http`](super::http) module docs; `RequestMirror` is in [`super::backends`]).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sluice_crds::gateway::{
    HttpCorsFilter, HttpHeaderFilter, HttpPathModifier, HttpRequestMirrorFilter,
    HttpRequestRedirectFilter, HttpRouteFilter, HttpUrlRewriteFilter,
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
    /// The `RequestMirror` filters with their index in `filters`.
    pub(super) mirrors: Vec<(usize, &'a HttpRequestMirrorFilter)>,
    pub(super) cors: Option<&'a HttpCorsFilter>,
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
    if let Some(c) = f.cors {
        out.push(plugin("cors", &cors(c, field)?, field)?);
    }
    Ok(out)
}

/// The plugins of the filters of one backendRef (`field`: `spec.rules[i].backendRefs[k]`):
/// `RequestHeaderModifier` → `proxy-rewrite` headers, `ResponseHeaderModifier` →
/// `response-rewrite` headers. Any other filter type is an error: it would have to run
/// before the backend is picked (a redirect, a rewrite of the path the router matched) or
/// is not per backend in Sluice (mirror, CORS).
pub(super) fn backend_plugins(
    filters: &[HttpRouteFilter],
    field: &str,
) -> Result<Vec<v1::Plugin>, String> {
    let mut out = Vec::new();
    for (k, f) in filters.iter().enumerate() {
        let ff = format!("{field}.filters[{k}]");
        let (name, config) = match (
            f.type_.as_str(),
            &f.request_header_modifier,
            &f.response_header_modifier,
        ) {
            ("RequestHeaderModifier", Some(h), _) => ("proxy-rewrite", header_ops(h)),
            ("ResponseHeaderModifier", _, Some(h)) => ("response-rewrite", header_ops(h)),
            (t @ ("RequestHeaderModifier" | "ResponseHeaderModifier"), _, _) => {
                return Err(format!("{ff}: a {t} filter needs its configuration"));
            }
            (other, _, _) => {
                return Err(format!(
                    "{ff}: {other} filters are not supported on a backendRef (only \
                     RequestHeaderModifier and ResponseHeaderModifier)"
                ));
            }
        };
        if let Some(h) = config {
            out.push(plugin(name, &json!({ "headers": h }), &ff)?);
        }
    }
    Ok(out)
}

/// The `cors` config of a CORS filter (`field`: the rule's `filters`).
///
/// - Origins become anchored, case-insensitive regexes, so that the response always names
///   the request's own Origin (never `*`, which a browser refuses with credentials) and
///   carries `Vary: Origin`. `https://*.example.com` matches any number of labels before
///   `.example.com`; a host `*` matches every host of the scheme; `*` alone every origin.
///   An origin without a port is the scheme's default port (80, 443), written or not.
/// - `allowMethods: ["*"]`: `*` without credentials; with credentials the request's
///   `Access-Control-Request-Method` (`echo_request_method`). No methods: the CORS-safelisted
///   ones (`GET, HEAD, POST`).
/// - `allowHeaders: ["*"]`: the request's `Access-Control-Request-Headers` (`**`). No headers:
///   the CORS-safelisted request header names (a browser never asks for those).
/// - `exposeHeaders: ["*"]`: `*` without credentials; with credentials it is left out (a
///   browser reads `*` literally then).
/// - Only preflights (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) are
///   answered without the backend (`preflight_only`); `maxAge` default 5.
pub(super) fn cors(c: &HttpCorsFilter, field: &str) -> Result<Value, String> {
    let cred = c.allow_credentials.unwrap_or(false);
    let mut regexes = Vec::with_capacity(c.allow_origins.len());
    for (k, o) in c.allow_origins.iter().enumerate() {
        regexes
            .push(origin_regex(o).ok_or_else(|| {
                format!("{field}.cors.allowOrigins[{k}]: `{o}` is not an origin")
            })?);
    }
    if regexes.is_empty() {
        // NB: no origin is allowed: a regex that matches nothing keeps every CORS header out.
        regexes.push("^$".to_owned());
    }
    let wildcard = |list: &[String]| list.len() == 1 && list[0] == "*";
    let (methods, echo) = match (wildcard(&c.allow_methods), cred) {
        (true, false) => ("*".to_owned(), false),
        (true, true) => ("**".to_owned(), true),
        (false, _) if c.allow_methods.is_empty() => ("GET, HEAD, POST".to_owned(), false),
        (false, _) => (c.allow_methods.join(", "), false),
    };
    let headers = if wildcard(&c.allow_headers) {
        "**".to_owned()
    } else if c.allow_headers.is_empty() {
        "Accept, Accept-Language, Content-Language".to_owned()
    } else {
        c.allow_headers.join(", ")
    };
    let mut config = json!({
        // NB: ignored when regexes are given; not `*`, which is refused with credentials.
        "allow_origins": "**",
        "allow_origins_by_regex": regexes,
        "allow_methods": methods,
        "allow_headers": headers,
        "allow_credential": cred,
        "max_age": c.max_age.unwrap_or(5),
        "echo_request_method": echo,
        "preflight_only": true,
    });
    let expose = match (wildcard(&c.expose_headers), cred) {
        (true, true) => None,
        _ if c.expose_headers.is_empty() => None,
        _ => Some(c.expose_headers.join(", ")),
    };
    if let (Some(e), Value::Object(m)) = (expose, &mut config) {
        m.insert("expose_headers".into(), json!(e));
    }
    Ok(config)
}

/// The anchored regex of a Gateway API CORS origin (`*`, or
/// `<scheme>://<host>[:<port>]` whose host may be `*` or start with `*.`); `None` when it
/// is none of those.
fn origin_regex(o: &str) -> Option<String> {
    if o == "*" {
        return Some("^.*$".to_owned());
    }
    let (scheme, rest) = o.split_once("://")?;
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) => (h, Some(p.parse::<u16>().ok().filter(|p| *p != 0)?)),
        None => (rest, None),
    };
    if host.is_empty() || host.contains(['/', '?', '#', '@']) {
        return None;
    }
    let host_re = if host == "*" {
        "[^/:]+".to_owned()
    } else if let Some(suffix) = host.strip_prefix("*.") {
        format!("[^/:]+\\.{}", regex::escape(suffix))
    } else if host.contains('*') {
        return None;
    } else {
        regex::escape(host)
    };
    // The scheme's default port may be written or not.
    let port_re = match port.unwrap_or(default_port) {
        p if p == default_port => format!("(?::{p})?"),
        p => format!(":{p}"),
    };
    Some(format!(
        "(?i)^{}://{host_re}{port_re}$",
        regex::escape(scheme)
    ))
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::origin_regex;

    /// Which of `origins` the CORS origin `pattern` allows.
    fn allowed<'a>(pattern: &str, origins: &[&'a str]) -> Vec<&'a str> {
        let re = regex::Regex::new(&origin_regex(pattern).unwrap()).unwrap();
        origins.iter().copied().filter(|o| re.is_match(o)).collect()
    }

    #[test]
    fn origins_match_as_the_gateway_api_says() {
        let all = [
            "https://www.bar.com",
            "https://a.b.bar.com",
            "https://bar.com",
            "https://xbar.com",
            "https://www.bar.com:443",
            "https://www.bar.com:8443",
            "http://www.bar.com",
            "HTTPS://WWW.BAR.COM",
            "https://www.bar.com.evil.test",
        ];
        assert_eq!(
            allowed("https://*.bar.com", &all),
            [
                "https://www.bar.com",
                "https://a.b.bar.com",
                "https://www.bar.com:443",
                "HTTPS://WWW.BAR.COM"
            ]
        );
        assert_eq!(
            allowed("https://www.bar.com:8443", &all),
            ["https://www.bar.com:8443"]
        );
        assert_eq!(allowed("http://*", &all), ["http://www.bar.com"]);
        assert_eq!(allowed("*", &all).len(), all.len());
        for bad in [
            "ftp://a.test",
            "https://",
            "https://a.*.test",
            "https://a.test:0",
            "x",
        ] {
            assert_eq!(origin_regex(bad), None, "{bad}");
        }
    }
}
