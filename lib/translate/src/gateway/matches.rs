//! HTTPRoute and GRPCRoute matches → router paths, methods and exprs (see the
//! [`http`](super::http) module docs).

use std::collections::BTreeSet;

use sluice_proto::v1;

/// Path precedence among routes on the same router path entry. NB: a regex sits on the
/// `/*` entry, where it competes only with `PathPrefix /` (and other regexes): ranking it
/// above the prefix keeps a catch-all from shadowing it. A longer prefix still wins over a
/// regex, through the router's longest-prefix order.
pub(super) const RANK_EXACT: u8 = 3;
pub(super) const RANK_REGEX: u8 = 2;
pub(super) const RANK_PREFIX: u8 = 1;

/// Methods the router knows.
pub(super) const METHODS: &[&str] = &[
    "CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE",
];

/// One match, before hosts and schemes are applied.
pub(super) struct Match {
    pub(super) paths: Vec<String>,
    pub(super) methods: Vec<String>,
    pub(super) exprs: Vec<v1::Expr>,
    /// `PathPrefix` value (trailing `/` trimmed) for `ReplacePrefixMatch`.
    pub(super) prefix: Option<String>,
    pub(super) rank_path: u8,
    pub(super) headers: usize,
    pub(super) queries: usize,
}

pub(super) fn expr(scope: v1::ExprScope, name: &str, regex: bool, value: &str) -> v1::Expr {
    let (op, value) = if regex {
        (v1::ExprOp::RegexMatch, format!("^(?:{value})$"))
    } else {
        (v1::ExprOp::Equal, value.to_owned())
    };
    v1::Expr {
        scope: scope as i32,
        name: name.to_owned(),
        op: op as i32,
        value,
        set: Vec::new(),
    }
}

/// `Exact` (default) or `RegularExpression`: whether it is a regex.
pub(super) fn match_type(t: Option<&str>, field: &str) -> Result<bool, String> {
    match t.unwrap_or("Exact") {
        "Exact" => Ok(false),
        "RegularExpression" => Ok(true),
        other => Err(format!(
            "{field}.type: {other} is not supported (Exact, RegularExpression)"
        )),
    }
}

/// Checks an expr the way the dataplane router would (header names, variables, regexes).
pub(super) fn check_expr(e: &v1::Expr, field: &str) -> Result<(), String> {
    use sluice_crds::{ExprOp, ExprScope};
    let scope = match v1::ExprScope::try_from(e.scope) {
        Ok(v1::ExprScope::Header) => Some(ExprScope::Header),
        Ok(v1::ExprScope::Query) => Some(ExprScope::Query),
        Ok(v1::ExprScope::Variable) => Some(ExprScope::Variable),
        _ => None,
    };
    if let Some(scope) = scope {
        crate::validate::expr_subject(scope, &e.name).map_err(|m| format!("{field}.name: {m}"))?;
    }
    if e.op == v1::ExprOp::RegexMatch as i32 {
        crate::validate::regex(ExprOp::RegexMatch, &e.value)
            .map_err(|m| format!("{field}.value: {m}"))?;
    }
    Ok(())
}

/// Header matches (first of each case-insensitive name).
pub(super) fn header_exprs<'h>(
    headers: impl Iterator<Item = (Option<&'h str>, &'h str, &'h str)>,
    field: &str,
) -> Result<Vec<v1::Expr>, String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (k, (t, name, value)) in headers.enumerate() {
        let f = format!("{field}.headers[{k}]");
        if !seen.insert(name.to_ascii_lowercase()) {
            continue;
        }
        let e = expr(v1::ExprScope::Header, name, match_type(t, &f)?, value);
        check_expr(&e, &f)?;
        out.push(e);
    }
    Ok(out)
}

pub(super) fn http_match(
    m: &sluice_crds::gateway::HttpRouteMatch,
    field: &str,
) -> Result<Match, String> {
    let path_type = m
        .path
        .as_ref()
        .and_then(|p| p.type_.as_deref())
        .unwrap_or("PathPrefix");
    let value = m
        .path
        .as_ref()
        .and_then(|p| p.value.as_deref())
        .unwrap_or("/");
    let pf = format!("{field}.path");
    let HttpPath {
        paths,
        rank_path,
        prefix,
        mut exprs,
    } = http_path(path_type, value, &pf)?;
    for p in &paths {
        crate::validate::path(p).map_err(|m| format!("{pf}.value: {m}"))?;
    }
    let headers = header_exprs(
        m.headers
            .iter()
            .map(|h| (h.type_.as_deref(), h.name.as_str(), h.value.as_str())),
        field,
    )?;
    let n_headers = headers.len();
    exprs.extend(headers);
    let queries = query_exprs(m, field)?;
    let n_queries = queries.len();
    exprs.extend(queries);
    let methods = match m.method.as_deref() {
        None => Vec::new(),
        Some(mth) if METHODS.contains(&mth) => vec![mth.to_owned()],
        Some(mth) => return Err(format!("{field}.method: {mth} is not supported")),
    };
    Ok(Match {
        paths,
        methods,
        exprs,
        prefix,
        rank_path,
        headers: n_headers,
        queries: n_queries,
    })
}

/// What an HTTPRoute path match becomes.
pub(super) struct HttpPath {
    paths: Vec<String>,
    rank_path: u8,
    /// The prefix of a `PathPrefix` match, without a trailing `/`.
    prefix: Option<String>,
    /// The path regex of a `RegularExpression` match.
    exprs: Vec<v1::Expr>,
}

/// The router paths of a path match of `path_type` and `value` (`pf`: its field).
pub(super) fn http_path(path_type: &str, value: &str, pf: &str) -> Result<HttpPath, String> {
    let mut out = HttpPath {
        paths: vec!["/*".to_owned()],
        rank_path: RANK_PREFIX,
        prefix: None,
        exprs: Vec::new(),
    };
    match path_type {
        "Exact" => {
            if value.contains('*') {
                return Err(format!("{pf}.value: `*` in an Exact path is not supported"));
            }
            out.paths = vec![value.to_owned()];
            out.rank_path = RANK_EXACT;
        }
        "PathPrefix" => {
            if value.contains('*') {
                return Err(format!("{pf}.value: `*` in a PathPrefix is not supported"));
            }
            let base = value.trim_end_matches('/');
            out.prefix = Some(base.to_owned());
            if !base.is_empty() {
                out.paths = vec![base.to_owned(), format!("{base}/*")];
            }
        }
        "RegularExpression" => {
            let e = expr(v1::ExprScope::Path, "", true, value);
            check_expr(&e, pf)?;
            out.exprs.push(e);
            out.rank_path = RANK_REGEX;
        }
        other => {
            return Err(format!(
                "{pf}.type: {other} is not supported (Exact, PathPrefix, RegularExpression)"
            ));
        }
    }
    Ok(out)
}

/// The exprs of `queryParams` (the first of each name).
pub(super) fn query_exprs(
    m: &sluice_crds::gateway::HttpRouteMatch,
    field: &str,
) -> Result<Vec<v1::Expr>, String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (k, q) in m.query_params.iter().enumerate() {
        let f = format!("{field}.queryParams[{k}]");
        if !seen.insert(q.name.as_str()) {
            continue;
        }
        let e = expr(
            v1::ExprScope::Query,
            &q.name,
            match_type(q.type_.as_deref(), &f)?,
            &q.value,
        );
        check_expr(&e, &f)?;
        out.push(e);
    }
    Ok(out)
}

pub(super) fn grpc_match(
    m: &sluice_crds::gateway::GrpcRouteMatch,
    field: &str,
) -> Result<Match, String> {
    let mf = format!("{field}.method");
    let (paths, mut exprs, rank_path) = match &m.method {
        None => (vec!["/*".to_owned()], Vec::new(), RANK_PREFIX),
        Some(method) => {
            let regex = match_type(method.type_.as_deref(), &mf)?;
            let (s, me) = (method.service.as_deref(), method.method.as_deref());
            for (what, v) in [("service", s), ("method", me)] {
                if !regex && v.is_some_and(|v| v.is_empty() || v.contains(['/', '*'])) {
                    return Err(format!(
                        "{mf}.{what}: {:?} is not a gRPC name",
                        v.unwrap_or("")
                    ));
                }
            }
            match (regex, s, me) {
                (false, Some(s), Some(me)) => (vec![format!("/{s}/{me}")], Vec::new(), RANK_EXACT),
                (false, Some(s), None) => (vec![format!("/{s}/*")], Vec::new(), RANK_PREFIX),
                (false, None, None) => (vec!["/*".to_owned()], Vec::new(), RANK_PREFIX),
                (false, None, Some(me)) => (
                    vec!["/*".to_owned()],
                    vec![expr(
                        v1::ExprScope::Path,
                        "",
                        true,
                        &format!("/[^/]+/{}", regex::escape(me)),
                    )],
                    RANK_REGEX,
                ),
                (true, s, me) => (
                    vec!["/*".to_owned()],
                    vec![expr(
                        v1::ExprScope::Path,
                        "",
                        true,
                        &format!(
                            "/(?:{})/(?:{})",
                            s.unwrap_or("[^/]+"),
                            me.unwrap_or("[^/]+")
                        ),
                    )],
                    RANK_REGEX,
                ),
            }
        }
    };
    for e in &exprs {
        check_expr(e, &mf)?;
    }
    for p in &paths {
        crate::validate::path(p).map_err(|m| format!("{mf}: {m}"))?;
    }
    let headers = header_exprs(
        m.headers
            .iter()
            .map(|h| (h.type_.as_deref(), h.name.as_str(), h.value.as_str())),
        field,
    )?;
    let n = headers.len();
    exprs.extend(headers);
    // NB: only gRPC requests: an HTTPRoute on the same host and path keeps the rest.
    exprs.push(expr(
        v1::ExprScope::Header,
        "content-type",
        true,
        "application/grpc([+;].*)?",
    ));
    Ok(Match {
        paths,
        methods: vec!["POST".to_owned()],
        exprs,
        prefix: None,
        rank_path,
        headers: n,
        queries: 0,
    })
}
