//! `match.exprs[]`: subjects, operators and their evaluation against a request.
//!
//! Semantics follow APISIX: the ingress controller turns every expr into a
//! lua-resty-expr rule on an nginx/APISIX variable (Header → `http_<name>`, Query →
//! `arg_<name>`, Cookie → `cookie_<name>`, Path → `uri`, Variable → the name itself), and
//! lua-resty-expr decides what a *missing* variable (nil) does:
//!
//! | operator | subject missing |
//! |---|---|
//! | Equal, GreaterThan(Equal), LessThan(Equal), RegexMatch*, In | no match |
//! | NotEqual, RegexNotMatch*, NotIn | match |
//!
//! (`~=` is `nil ~= value`, true; the "Not" regex and NotIn operators are `!` applied to
//! `~~`/`~*`/`in`, which are false on nil.) Comparisons are numeric like Lua's `tonumber`:
//! a subject or value that is not a number never matches. Equal and In compare bytes
//! exactly (case-sensitive), as Lua string equality does.

use std::borrow::Cow;

use http::HeaderName;
use http::header::{COOKIE, HOST};
use regex::bytes::{Regex, RegexBuilder};
use sluice_proto::v1::{Expr, ExprOp, ExprScope};

use super::{InvalidReason, RequestInfo};
use crate::http::InlineText;

/// Size limit for one compiled regex; keeps a hostile pattern from eating memory.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Where an expr reads its subject from.
#[derive(Debug)]
enum Subject {
    /// First value of a request header (`http_<name>`).
    Header(HeaderName),
    /// The request host as the client sent it, port included (`http_host`; also covers
    /// HTTP/2 `:authority`, which has no Host header).
    RawHost,
    /// First value of a query argument, percent-decoded (`arg_<name>`).
    Arg(Box<[u8]>),
    /// A cookie from the Cookie header(s) (`cookie_<name>`, case-sensitive name).
    Cookie(Box<[u8]>),
    /// The request path (`uri`).
    Path,
    /// Path plus `?query` when there is a query (`request_uri`).
    RequestUri,
    /// Normalised host: lower-case, no port (`host`).
    Host,
    /// Client IP (`remote_addr`).
    RemoteAddr,
    /// Client port (`remote_port`).
    RemotePort,
    /// Local IP the request arrived on (`server_addr`).
    ServerAddr,
    /// Local port the request arrived on (`server_port`).
    ServerPort,
    /// `request_method`.
    Method,
    /// `scheme`: `http` or `https`.
    Scheme,
    /// Raw query string (`query_string`, `args`); missing when the URI has no `?`.
    QueryString,
}

/// What to do with the subject.
#[derive(Debug)]
enum Op {
    Equal(Box<[u8]>),
    NotEqual(Box<[u8]>),
    /// Numeric comparison; `None` when the value is not a number (never matches).
    Compare(Cmp, Option<f64>),
    Regex {
        re: Regex,
        negate: bool,
    },
    In {
        set: Box<[Box<[u8]>]>,
        negate: bool,
    },
}

#[derive(Debug, Clone, Copy)]
enum Cmp {
    Gt,
    Ge,
    Lt,
    Le,
}

/// One compiled expr.
#[derive(Debug)]
pub(crate) struct CompiledExpr {
    subject: Subject,
    op: Op,
}

/// Compiles `exprs[i]`; errors carry the field suffix (after `match.exprs[i].`).
pub(crate) fn compile(expr: &Expr) -> Result<CompiledExpr, (&'static str, InvalidReason)> {
    let scope = ExprScope::try_from(expr.scope)
        .ok()
        .filter(|s| *s != ExprScope::Unspecified)
        .ok_or(("subject.scope", InvalidReason::UnspecifiedScope(expr.scope)))?;
    let op_kind = ExprOp::try_from(expr.op)
        .ok()
        .filter(|o| *o != ExprOp::Unspecified)
        .ok_or(("op", InvalidReason::UnspecifiedOp(expr.op)))?;
    let subject = compile_subject(scope, &expr.name).map_err(|r| ("subject.name", r))?;

    let takes_set = matches!(op_kind, ExprOp::In | ExprOp::NotIn);
    if takes_set {
        if expr.set.is_empty() {
            return Err(("set", InvalidReason::MissingSet));
        }
        if !expr.value.is_empty() {
            return Err(("value", InvalidReason::ValueWithSet));
        }
    } else if !expr.set.is_empty() {
        return Err(("set", InvalidReason::SetWithoutIn));
    }

    let value = || expr.value.as_bytes().into();
    let op = match op_kind {
        ExprOp::Unspecified => return Err(("op", InvalidReason::UnspecifiedOp(expr.op))),
        ExprOp::Equal => Op::Equal(value()),
        ExprOp::NotEqual => Op::NotEqual(value()),
        ExprOp::GreaterThan => Op::Compare(Cmp::Gt, to_number(expr.value.as_bytes())),
        ExprOp::GreaterThanEqual => Op::Compare(Cmp::Ge, to_number(expr.value.as_bytes())),
        ExprOp::LessThan => Op::Compare(Cmp::Lt, to_number(expr.value.as_bytes())),
        ExprOp::LessThanEqual => Op::Compare(Cmp::Le, to_number(expr.value.as_bytes())),
        ExprOp::RegexMatch => Op::Regex {
            re: regex(&expr.value, false)?,
            negate: false,
        },
        ExprOp::RegexNotMatch => Op::Regex {
            re: regex(&expr.value, false)?,
            negate: true,
        },
        ExprOp::RegexMatchCaseInsensitive => Op::Regex {
            re: regex(&expr.value, true)?,
            negate: false,
        },
        ExprOp::RegexNotMatchCaseInsensitive => Op::Regex {
            re: regex(&expr.value, true)?,
            negate: true,
        },
        ExprOp::In | ExprOp::NotIn => Op::In {
            set: expr.set.iter().map(|s| s.as_bytes().into()).collect(),
            negate: op_kind == ExprOp::NotIn,
        },
    };
    Ok(CompiledExpr { subject, op })
}

fn regex(pattern: &str, case_insensitive: bool) -> Result<Regex, (&'static str, InvalidReason)> {
    RegexBuilder::new(pattern)
        .case_insensitive(case_insensitive)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| ("value", InvalidReason::Regex(e)))
}

fn compile_subject(scope: ExprScope, name: &str) -> Result<Subject, InvalidReason> {
    if scope != ExprScope::Path && name.is_empty() {
        return Err(InvalidReason::MissingName);
    }
    Ok(match scope {
        ExprScope::Unspecified => return Err(InvalidReason::UnspecifiedScope(0)),
        ExprScope::Header => header_subject(name)?,
        ExprScope::Query => Subject::Arg(name.as_bytes().into()),
        ExprScope::Cookie => Subject::Cookie(name.as_bytes().into()),
        ExprScope::Path => Subject::Path,
        ExprScope::Variable => variable_subject(name)?,
    })
}

fn header_subject(name: &str) -> Result<Subject, InvalidReason> {
    let name = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| InvalidReason::InvalidHeaderName(name.to_owned()))?;
    Ok(if name == HOST {
        Subject::RawHost
    } else {
        Subject::Header(name)
    })
}

/// Variables Sluice knows; anything else is rejected rather than silently never matching.
pub(crate) const KNOWN_VARIABLES: &str = "remote_addr, remote_port, server_addr, server_port, \
     host, uri, request_uri, request_method, scheme, query_string, args, http_<header>, \
     arg_<name>, cookie_<name>";

fn variable_subject(name: &str) -> Result<Subject, InvalidReason> {
    if let Some(header) = name.strip_prefix("http_").filter(|h| !h.is_empty()) {
        // nginx: `$http_x_foo` is header `X-Foo`.
        return header_subject(&header.replace('_', "-"));
    }
    if let Some(arg) = name.strip_prefix("arg_").filter(|a| !a.is_empty()) {
        return Ok(Subject::Arg(arg.as_bytes().into()));
    }
    if let Some(cookie) = name.strip_prefix("cookie_").filter(|c| !c.is_empty()) {
        return Ok(Subject::Cookie(cookie.as_bytes().into()));
    }
    Ok(match name {
        "remote_addr" => Subject::RemoteAddr,
        "remote_port" => Subject::RemotePort,
        "server_addr" => Subject::ServerAddr,
        "server_port" => Subject::ServerPort,
        "host" => Subject::Host,
        "uri" => Subject::Path,
        "request_uri" => Subject::RequestUri,
        "request_method" => Subject::Method,
        "scheme" => Subject::Scheme,
        "query_string" | "args" => Subject::QueryString,
        _ => return Err(InvalidReason::UnknownVariable(name.to_owned())),
    })
}

/// Per-request view used while evaluating exprs.
pub(crate) struct EvalCtx<'a, 'r> {
    pub(crate) req: &'a RequestInfo<'r>,
    /// Normalised host (lower-case, no port).
    pub(crate) host: Option<&'a str>,
}

impl CompiledExpr {
    /// Whether the request satisfies this expr.
    pub(crate) fn matches(&self, ctx: &EvalCtx<'_, '_>) -> bool {
        let subject = self.subject.resolve(ctx);
        let Some(subject) = subject.as_bytes() else {
            return match &self.op {
                Op::NotEqual(_) => true,
                Op::Regex { negate, .. } | Op::In { negate, .. } => *negate,
                Op::Equal(_) | Op::Compare(..) => false,
            };
        };
        match &self.op {
            Op::Equal(v) => subject == &**v,
            Op::NotEqual(v) => subject != &**v,
            Op::Compare(cmp, value) => match (to_number(subject), value) {
                (Some(l), Some(r)) => match cmp {
                    Cmp::Gt => l > *r,
                    Cmp::Ge => l >= *r,
                    Cmp::Lt => l < *r,
                    Cmp::Le => l <= *r,
                },
                _ => false,
            },
            Op::Regex { re, negate } => re.is_match(subject) != *negate,
            Op::In { set, negate } => set.iter().any(|v| &**v == subject) != *negate,
        }
    }
}

/// A resolved subject; borrowed from the request whenever possible.
enum Value<'a> {
    Missing,
    Borrowed(&'a [u8]),
    Inline(InlineText),
    /// Only for percent-decoded query args and `request_uri` with a query.
    Owned(Vec<u8>),
}

impl Value<'_> {
    fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Missing => None,
            Value::Borrowed(b) => Some(b),
            Value::Inline(b) => Some(b.as_bytes()),
            Value::Owned(v) => Some(v),
        }
    }
}

fn inline<'a>(text: Option<InlineText>) -> Value<'a> {
    text.map_or(Value::Missing, Value::Inline)
}

impl Subject {
    fn resolve<'a>(&'a self, ctx: &EvalCtx<'a, '_>) -> Value<'a> {
        let req = ctx.req;
        let borrowed = |b: Option<&'a [u8]>| b.map_or(Value::Missing, Value::Borrowed);
        match self {
            Subject::Header(name) => borrowed(req.headers.get(name).map(|v| v.as_bytes())),
            Subject::RawHost => borrowed(
                req.host
                    .map(str::as_bytes)
                    .or_else(|| req.headers.get(HOST).map(|v| v.as_bytes())),
            ),
            Subject::Arg(name) => match req.query.and_then(|q| query_arg(q.as_bytes(), name)) {
                Some(raw) => match percent_decode(raw) {
                    Cow::Borrowed(b) => Value::Borrowed(b),
                    Cow::Owned(v) => Value::Owned(v),
                },
                None => Value::Missing,
            },
            Subject::Cookie(name) => borrowed(cookie(req.headers, name)),
            Subject::Path => Value::Borrowed(req.path.as_bytes()),
            Subject::RequestUri => match req.query {
                None => Value::Borrowed(req.path.as_bytes()),
                Some(q) => {
                    let mut uri = Vec::with_capacity(req.path.len() + 1 + q.len());
                    uri.extend_from_slice(req.path.as_bytes());
                    uri.push(b'?');
                    uri.extend_from_slice(q.as_bytes());
                    Value::Owned(uri)
                }
            },
            Subject::Host => borrowed(ctx.host.map(str::as_bytes)),
            Subject::RemoteAddr => Value::Inline(InlineText::ip(req.remote_addr.ip())),
            Subject::RemotePort => inline(InlineText::display(req.remote_addr.port())),
            Subject::ServerAddr => Value::Inline(InlineText::ip(req.local_addr.ip())),
            Subject::ServerPort => inline(InlineText::display(req.local_addr.port())),
            Subject::Method => Value::Borrowed(req.method.as_str().as_bytes()),
            Subject::Scheme => Value::Borrowed(req.scheme.as_bytes()),
            Subject::QueryString => borrowed(req.query.map(str::as_bytes)),
        }
    }
}

/// Raw (still percent-encoded) value of the first argument named `name` (compared after
/// decoding). `?a` and `?a=` both give an empty value.
fn query_arg<'q>(query: &'q [u8], name: &[u8]) -> Option<&'q [u8]> {
    query.split(|&b| b == b'&').find_map(|pair| {
        let (key, value) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &pair[pair.len()..]),
        };
        decoded_eq(key, name).then_some(value)
    })
}

/// Whether `raw` percent-decodes (with `+` as space) to exactly `want`.
fn decoded_eq(raw: &[u8], want: &[u8]) -> bool {
    let mut decoded = Decoder { raw };
    want.iter().all(|w| decoded.next() == Some(*w)) && decoded.next().is_none()
}

/// `application/x-www-form-urlencoded` decoding as `ngx.req.get_uri_args` does it;
/// malformed `%` escapes are kept as they are.
fn percent_decode(raw: &[u8]) -> Cow<'_, [u8]> {
    if !raw.iter().any(|&b| b == b'%' || b == b'+') {
        return Cow::Borrowed(raw);
    }
    Cow::Owned(Decoder { raw }.collect())
}

struct Decoder<'a> {
    raw: &'a [u8],
}

impl Iterator for Decoder<'_> {
    type Item = u8;

    fn next(&mut self) -> Option<u8> {
        let (&b, rest) = self.raw.split_first()?;
        self.raw = rest;
        match b {
            b'+' => Some(b' '),
            b'%' => match rest {
                [h, l, tail @ ..] => match (hex(*h), hex(*l)) {
                    (Some(h), Some(l)) => {
                        self.raw = tail;
                        Some(h << 4 | l)
                    }
                    _ => Some(b'%'),
                },
                _ => Some(b'%'),
            },
            _ => Some(b),
        }
    }
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

/// Value of the first cookie called `name` in any Cookie header.
fn cookie<'h>(headers: &'h http::HeaderMap, name: &[u8]) -> Option<&'h [u8]> {
    headers.get_all(COOKIE).iter().find_map(|header| {
        header.as_bytes().split(|&b| b == b';').find_map(|pair| {
            let pair = pair.trim_ascii();
            let i = pair.iter().position(|&b| b == b'=')?;
            (pair[..i].trim_ascii() == name).then(|| pair[i + 1..].trim_ascii())
        })
    })
}

/// Lua's `tonumber` on a string: decimal (with fraction/exponent) or `0x` hex, surrounding
/// whitespace allowed; `inf`, `nan` and anything else are not numbers.
pub(crate) fn to_number(raw: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(raw).ok()?.trim_ascii();
    let (negative, digits) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let magnitude = if let Some(hex) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        // Precision loss above 2^53 is what Lua does too.
        hex.bytes().fold(0f64, |acc, b| {
            acc * 16.0 + f64::from(self::hex(b).unwrap_or(0))
        })
    } else {
        let ok = digits
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_digit() || b == b'.')
            && digits.bytes().any(|b| b.is_ascii_digit())
            && digits
                .bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'));
        if !ok {
            return None;
        }
        digits.parse::<f64>().ok()?
    };
    Some(if negative { -magnitude } else { magnitude })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn numbers_follow_lua_tonumber() {
        assert_eq!(to_number(b"10"), Some(10.0));
        assert_eq!(to_number(b" -2.5 "), Some(-2.5));
        assert_eq!(to_number(b"1e3"), Some(1000.0));
        assert_eq!(to_number(b"0x1F"), Some(31.0));
        for bad in [&b""[..], b"abc", b"inf", b"NaN", b"1x", b"--1", b"0x", b"-"] {
            assert_eq!(to_number(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn query_args_decode_and_take_the_first_value() {
        assert_eq!(query_arg(b"a=1&b=2&a=3", b"a"), Some(&b"1"[..]));
        assert_eq!(query_arg(b"x&a", b"a"), Some(&b""[..]));
        assert_eq!(query_arg(b"ab=1", b"a"), None);
        assert_eq!(query_arg(b"my%20key=1", b"my key"), Some(&b"1"[..]));
        assert_eq!(&*percent_decode(b"a%2Fb+c%zz%4"), b"a/b c%zz%4");
        assert!(matches!(percent_decode(b"plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn cookies_are_found_in_any_cookie_header() {
        let mut h = http::HeaderMap::new();
        h.append(COOKIE, "a=1; session = xyz ;b=".parse().unwrap());
        h.append(COOKIE, "c=3".parse().unwrap());
        assert_eq!(cookie(&h, b"session"), Some(&b"xyz"[..]));
        assert_eq!(cookie(&h, b"b"), Some(&b""[..]));
        assert_eq!(cookie(&h, b"c"), Some(&b"3"[..]));
        assert_eq!(cookie(&h, b"A"), None);
    }
}
