//! The router: picks the route that serves a request, with ApisixRoute match semantics.
//!
//! [`Router::new`] compiles the `routes` of a snapshot into an index; [`Router::lookup`]
//! returns the index of the winning route for one request. Matching, in order:
//!
//! 1. **Host class.** Routes whose `hosts` contain the request host exactly (its canonical
//!    form, [`crate::http::host::HostName`]: case-insensitive, port and one trailing dot
//!    stripped) come first; then routes with a wildcard
//!    `*.suffix` matching it (any depth of subdomain, never the bare suffix), longest
//!    suffix first; then routes without hosts. If nothing in a class matches, the next class
//!    is tried (APISIX `radixtree_host_uri`).
//! 2. **Path**, within a class: the exact path first, then prefixes (`/foo*`) longest
//!    first. The query string never takes part.
//! 3. Among routes with the same path: higher `priority` first, then route id, then
//!    position in the snapshot.
//! 4. The first candidate in that order whose methods, `remoteAddrs` and every expr
//!    match wins.
//!
//! [`Router::explain`] walks the same candidates in the same order (one shared walk) and
//! reports, for each, the condition that failed: `kubectl sluice explain` shows it.
//!
//! Lookup cost does not depend on the number of routes: one hash lookup for the exact host,
//! one per dot of the host for wildcards (skipped for suffix lengths no route uses), then per
//! host class one hash lookup for the exact path and one walk of a radix tree over prefixes.
//! Lookup allocates nothing, except where a route's expr needs a percent-decoded query
//! argument that contains escapes, or `request_uri` of a request with a query string.
//!
//! Request paths are matched as given in [`RequestInfo::path`]; normalising them (dot
//! segments, percent-decoding) is the caller's decision.

mod expr;
pub(crate) mod host;
mod radix;
pub mod stream;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;
use sluice_proto::v1::Route;

use self::expr::{CompiledExpr, EvalCtx};
use self::host::RouteHost;
use self::radix::RadixTree;
use crate::http::host::HostName;

pub use crate::http::RequestInfo;

/// A route of a snapshot that cannot be compiled. Displays as
/// `route <id>: <field>: <reason>`, e.g.
/// `route default/r/rule1: match.exprs[0].value: invalid regex: ...`.
#[derive(Debug, thiserror::Error)]
#[error("route {route_id}: {field}: {reason}")]
pub struct InvalidRoute {
    /// Id of the offending route (`<namespace>/<name>/<rule>`).
    pub route_id: String,
    /// The field at fault, named as in ApisixRoute `spec.http[]`, e.g. `match.hosts[1]`.
    pub field: String,
    /// What is wrong with it.
    pub reason: InvalidReason,
}

/// Why a route field was rejected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidReason {
    /// The route id is empty.
    #[error("route id is empty")]
    MissingId,
    /// More routes than the router can index (u32::MAX).
    #[error("too many routes")]
    TooManyRoutes,
    /// `paths` is empty.
    #[error("at least one path is required")]
    NoPaths,
    /// A path is malformed.
    #[error("invalid path {path:?}: {reason}")]
    BadPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A host is neither an exact name nor a `*.suffix` wildcard.
    #[error("invalid host {host:?}: {reason}")]
    BadHost {
        /// The host as given.
        host: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A method outside CONNECT, DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT, TRACE.
    #[error("unknown method {0:?} (expected one of {METHOD_NAMES})")]
    UnknownMethod(String),
    /// A remote address that is neither an IP address nor a CIDR.
    #[error("invalid IP address or CIDR {addr:?}: {reason}")]
    BadRemoteAddr {
        /// The address as given.
        addr: String,
        /// Parser message.
        reason: String,
    },
    /// The expr scope is unspecified or unknown (the raw enum value).
    #[error("scope is unspecified or unknown ({0})")]
    UnspecifiedScope(i32),
    /// The expr operator is unspecified or unknown (the raw enum value).
    #[error("operator is unspecified or unknown ({0})")]
    UnspecifiedOp(i32),
    /// A Header, Query, Cookie or Variable expr without a name.
    #[error("name is required unless the scope is Path")]
    MissingName,
    /// A header name that is not a valid HTTP header name.
    #[error("invalid header name {0:?}")]
    InvalidHeaderName(String),
    /// A Variable expr naming a variable Sluice does not provide.
    #[error("unknown variable {0:?} (supported: {known})", known = expr::KNOWN_VARIABLES)]
    UnknownVariable(String),
    /// In/NotIn without `set`.
    #[error("In and NotIn need a non-empty set")]
    MissingSet,
    /// In/NotIn with a `value`.
    #[error("In and NotIn take `set`, not `value`")]
    ValueWithSet,
    /// `set` on an operator other than In/NotIn.
    #[error("`set` is only for In and NotIn; this operator takes `value`")]
    SetWithoutIn,
    /// A regex that does not compile (Rust `regex` syntax: no look-around or
    /// back-references).
    #[error("invalid regex: {0}")]
    Regex(regex::Error),
}

const METHOD_NAMES: &str = "CONNECT, DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT, TRACE";

/// Bit of a method in [`Matcher::methods`]; 0 for methods routes cannot name.
fn method_bit(method: &str) -> u16 {
    match method {
        "GET" => 1,
        "POST" => 1 << 1,
        "PUT" => 1 << 2,
        "DELETE" => 1 << 3,
        "PATCH" => 1 << 4,
        "HEAD" => 1 << 5,
        "OPTIONS" => 1 << 6,
        "CONNECT" => 1 << 7,
        "TRACE" => 1 << 8,
        _ => 0,
    }
}

/// The conditions of one route besides host and path.
#[derive(Debug)]
struct Matcher {
    /// Allowed methods as a bit set; 0 = any.
    methods: u16,
    /// Allowed client networks; empty = any.
    remote_addrs: Box<[IpNet]>,
    /// All must match.
    exprs: Box<[CompiledExpr]>,
}

impl Matcher {
    #[inline]
    fn matches(&self, ctx: &EvalCtx<'_, '_>) -> bool {
        self.mismatch(ctx).is_none()
    }

    /// The first condition that fails for this request, in the order they are checked;
    /// `None` when the route matches.
    #[inline]
    fn mismatch(&self, ctx: &EvalCtx<'_, '_>) -> Option<Mismatch> {
        if self.methods != 0 && self.methods & method_bit(ctx.req.method.as_str()) == 0 {
            return Some(Mismatch::Method);
        }
        if !self.remote_addrs.is_empty() {
            // NB: a dual-stack listener reports IPv4 clients as `::ffff:a.b.c.d`.
            let ip: IpAddr = ctx.req.remote_addr.ip().to_canonical();
            if !self.remote_addrs.iter().any(|net| net.contains(&ip)) {
                return Some(Mismatch::RemoteAddr);
            }
        }
        self.exprs
            .iter()
            .position(|e| !e.matches(ctx))
            .map(Mismatch::Expr)
    }
}

/// Which condition of a candidate route failed for a request ([`Router::explain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mismatch {
    /// The request method is not in `match.methods`.
    Method,
    /// The client address is in none of `match.remoteAddrs`.
    RemoteAddr,
    /// `match.exprs[i]` is false (the first false one).
    Expr(usize),
}

/// The host class a candidate was found in, in the order classes are tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostClass {
    /// The route lists the request host exactly.
    Exact,
    /// The route lists a `*.suffix` wildcard matching the request host; the suffix with its
    /// leading dot (`.example.com`).
    Wildcard(String),
    /// The route has no hosts.
    Any,
}

/// How a candidate's path matched the request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// An exact path.
    Exact,
    /// A prefix path (`/foo*`); longer prefixes are tried first.
    Prefix,
}

/// One route the router considered for a request, in the order it considered them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Index into the `routes` given to [`Router::new`].
    pub route: usize,
    /// Where its host matched.
    pub host: HostClass,
    /// How its path matched.
    pub path: PathKind,
    /// The first condition that failed; `None` for the winner.
    pub mismatch: Option<Mismatch>,
}

/// Routes of one host class, indexed by path.
#[derive(Debug, Default)]
struct PathIndex {
    /// Exact paths → candidates in match order.
    exact: HashMap<Box<str>, Box<[u32]>>,
    /// Prefixes (without the `*`) → candidates in match order.
    prefixes: RadixTree,
}

/// Set of lengths below 256, to skip hash lookups for wildcard suffixes no route has.
#[derive(Debug, Default)]
struct LenSet([u64; 4]);

impl LenSet {
    fn insert(&mut self, len: usize) {
        if let Some(word) = self.0.get_mut(len / 64) {
            *word |= 1 << (len % 64);
        }
    }

    fn contains(&self, len: usize) -> bool {
        self.0
            .get(len / 64)
            .is_some_and(|word| word & (1 << (len % 64)) != 0)
    }
}

/// A compiled, immutable route index. Build one per snapshot with [`Router::new`] and share
/// it (it is `Send + Sync`).
#[derive(Debug)]
pub struct Router {
    /// Same order as the `routes` given to [`Router::new`].
    matchers: Box<[Matcher]>,
    /// Lower-case exact host → its routes.
    exact_hosts: HashMap<Box<str>, PathIndex>,
    /// Wildcard suffix with its leading dot (`.example.com`) → its routes.
    wildcard_hosts: HashMap<Box<str>, PathIndex>,
    /// Lengths of the keys of `wildcard_hosts`.
    wildcard_lens: LenSet,
    /// Routes without hosts.
    any_host: PathIndex,
}

/// Exact and prefix paths collected for one host class before ordering.
#[derive(Default)]
struct PathIndexBuilder {
    exact: HashMap<Box<str>, Vec<u32>>,
    prefixes: RadixTree,
}

impl PathIndexBuilder {
    fn add(&mut self, path: &RoutePath, route: u32) {
        match path {
            RoutePath::Exact(p) => self.exact.entry(p.as_str().into()).or_default().push(route),
            RoutePath::Prefix(p) => self.prefixes.insert(p.as_bytes(), route),
        }
    }

    fn finish(self, order: &impl Fn(&mut Vec<u32>)) -> PathIndex {
        let mut prefixes = self.prefixes;
        prefixes.finish(order);
        let exact = self
            .exact
            .into_iter()
            .map(|(path, mut list)| {
                order(&mut list);
                (path, list.into_boxed_slice())
            })
            .collect();
        PathIndex { exact, prefixes }
    }
}

enum RoutePath {
    Exact(String),
    /// Without the trailing `*`.
    Prefix(String),
}

impl Router {
    /// Compiles the routes served on the dataplane's own listeners (those without
    /// `listeners`); errors name the route id, the field and the reason
    /// (e.g. `route default/r/rule1: match.exprs[0].value: invalid regex ...`).
    pub fn new(routes: &[Route]) -> Result<Router, InvalidRoute> {
        Self::scoped(routes, |r| r.listeners.is_empty())
    }

    /// Compiles the routes for which `include` holds (the routes of one listener); the
    /// others are not indexed, and indexes stay those of `routes`.
    pub fn scoped(
        routes: &[Route],
        include: impl Fn(&Route) -> bool,
    ) -> Result<Router, InvalidRoute> {
        if u32::try_from(routes.len()).is_err() {
            return Err(InvalidRoute {
                route_id: String::new(),
                field: "routes".into(),
                reason: InvalidReason::TooManyRoutes,
            });
        }
        let mut matchers = Vec::with_capacity(routes.len());
        let mut exact_hosts: HashMap<String, PathIndexBuilder> = HashMap::new();
        let mut wildcard_hosts: HashMap<String, PathIndexBuilder> = HashMap::new();
        let mut any_host = PathIndexBuilder::default();
        let mut wildcard_lens = LenSet::default();

        for (i, route) in routes.iter().enumerate() {
            let fail = |field: String, reason| InvalidRoute {
                route_id: route.id.clone(),
                field,
                reason,
            };
            if !include(route) {
                // NB: never a candidate; keeps the indexes of `routes`.
                matchers.push(Matcher {
                    methods: 0,
                    remote_addrs: Box::default(),
                    exprs: Box::default(),
                });
                continue;
            }
            if route.id.is_empty() {
                return Err(fail("id".into(), InvalidReason::MissingId));
            }
            let paths = compile_paths(&route.paths).map_err(|(f, r)| fail(f, r))?;
            let hosts = route
                .hosts
                .iter()
                .enumerate()
                .map(|(j, h)| {
                    host::parse_route_host(h).map_err(|reason| {
                        fail(
                            format!("match.hosts[{j}]"),
                            InvalidReason::BadHost {
                                host: h.clone(),
                                reason,
                            },
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            matchers.push(compile_matcher(route).map_err(|(f, r)| fail(f, r))?);

            // Cannot truncate: checked against u32::MAX above.
            let idx = i as u32;
            let add = |class: &mut PathIndexBuilder| {
                for p in &paths {
                    class.add(p, idx);
                }
            };
            if hosts.is_empty() {
                add(&mut any_host);
            }
            for h in hosts {
                match h {
                    RouteHost::Exact(name) => add(exact_hosts.entry(name).or_default()),
                    RouteHost::Wildcard(suffix) => {
                        wildcard_lens.insert(suffix.len());
                        add(wildcard_hosts.entry(suffix).or_default());
                    }
                }
            }
        }

        let order = |list: &mut Vec<u32>| {
            let key = |&i: &u32| {
                let r = &routes[i as usize];
                (std::cmp::Reverse(r.priority), r.id.as_str(), i)
            };
            list.sort_unstable_by(|a, b| key(a).cmp(&key(b)));
            // A route listing the same path (or host) twice needs checking only once.
            list.dedup();
        };
        let finish = |m: HashMap<String, PathIndexBuilder>| {
            m.into_iter()
                .map(|(k, v)| (k.into_boxed_str(), v.finish(&order)))
                .collect()
        };
        Ok(Router {
            matchers: matchers.into_boxed_slice(),
            exact_hosts: finish(exact_hosts),
            wildcard_hosts: finish(wildcard_hosts),
            wildcard_lens,
            any_host: any_host.finish(&order),
        })
    }

    /// Index into the `routes` slice given to `new`, of the route that wins.
    pub fn lookup(&self, req: &RequestInfo<'_>) -> Option<usize> {
        self.walk(req, |ctx, _, _, i| {
            self.matchers
                .get(i)
                .is_some_and(|m| m.matches(ctx))
                .then_some(i)
        })
    }

    /// Every candidate [`Router::lookup`] checks for `req`, in the same order, up to and
    /// including the winner (the last one, with `mismatch: None`); each loser names the
    /// condition that failed. Allocates: for explaining, not for serving.
    pub fn explain(&self, req: &RequestInfo<'_>) -> Vec<Candidate> {
        let mut out = Vec::new();
        let _: Option<()> = self.walk(req, |ctx, class, path, i| {
            let mismatch = match self.matchers.get(i) {
                Some(m) => m.mismatch(ctx),
                None => return None,
            };
            out.push(Candidate {
                route: i,
                host: match class {
                    Class::Exact => HostClass::Exact,
                    Class::Wildcard(s) => HostClass::Wildcard(s.to_owned()),
                    Class::Any => HostClass::Any,
                },
                path,
                mismatch,
            });
            mismatch.is_none().then_some(())
        });
        out
    }

    /// Visits the candidates for `req` in match order until `visit` returns `Some`.
    /// [`Router::lookup`] and [`Router::explain`] share it, so they cannot disagree on order.
    #[inline]
    fn walk<T>(
        &self,
        req: &RequestInfo<'_>,
        mut visit: impl FnMut(&EvalCtx<'_, '_>, Class<'_>, PathKind, usize) -> Option<T>,
    ) -> Option<T> {
        // NB: the canonical form the mTLS guard checks too (`crate::http::host`); a host it
        // refuses matches only host-less routes here (the request path answers it 400 first).
        let name = req.host.and_then(|h| HostName::parse(h.as_bytes()).ok());
        let host = name.as_ref().map(HostName::as_str);
        let ctx = EvalCtx { req, host };
        if let Some(host) = host {
            if let Some(found) = self
                .exact_hosts
                .get(host)
                .and_then(|index| walk_index(index, &ctx, Class::Exact, &mut visit))
            {
                return Some(found);
            }
            if !self.wildcard_hosts.is_empty() {
                // Dots left to right = longest suffix first; a suffix needs a label before it.
                for (at, _) in host.match_indices('.').filter(|&(at, _)| at > 0) {
                    let suffix = &host[at..];
                    if !self.wildcard_lens.contains(suffix.len()) {
                        continue;
                    }
                    if let Some(found) = self.wildcard_hosts.get(suffix).and_then(|index| {
                        walk_index(index, &ctx, Class::Wildcard(suffix), &mut visit)
                    }) {
                        return Some(found);
                    }
                }
            }
        }
        walk_index(&self.any_host, &ctx, Class::Any, &mut visit)
    }

    /// Number of routes the router was built from.
    pub fn len(&self) -> usize {
        self.matchers.len()
    }

    /// Whether the router was built from no routes (every lookup misses).
    pub fn is_empty(&self) -> bool {
        self.matchers.is_empty()
    }
}

/// A host class while walking, borrowing the request host.
#[derive(Clone, Copy)]
enum Class<'h> {
    Exact,
    Wildcard(&'h str),
    Any,
}

/// Visits the candidates of one host class: the exact path's, then each prefix's, longest
/// first.
#[inline]
fn walk_index<T>(
    index: &PathIndex,
    ctx: &EvalCtx<'_, '_>,
    class: Class<'_>,
    visit: &mut impl FnMut(&EvalCtx<'_, '_>, Class<'_>, PathKind, usize) -> Option<T>,
) -> Option<T> {
    let path = ctx.req.path;
    if let Some(found) = index.exact.get(path).and_then(|c| {
        c.iter()
            .find_map(|&i| visit(ctx, class, PathKind::Exact, i as usize))
    }) {
        return Some(found);
    }
    index.prefixes.matches(path.as_bytes()).find_map(|c| {
        c.iter()
            .find_map(|&i| visit(ctx, class, PathKind::Prefix, i as usize))
    })
}

fn compile_paths(paths: &[String]) -> Result<Vec<RoutePath>, (String, InvalidReason)> {
    if paths.is_empty() {
        return Err(("match.paths".into(), InvalidReason::NoPaths));
    }
    paths
        .iter()
        .enumerate()
        .map(|(j, p)| {
            let bad = |reason| {
                (
                    format!("match.paths[{j}]"),
                    InvalidReason::BadPath {
                        path: p.clone(),
                        reason,
                    },
                )
            };
            if !p.starts_with('/') {
                return Err(bad("must start with `/`"));
            }
            if p.bytes().any(|b| b.is_ascii_control() || b == b' ') {
                return Err(bad("contains a space or control character"));
            }
            if p.contains(['?', '#']) {
                return Err(bad("must not contain a query string or fragment"));
            }
            match p.strip_suffix('*') {
                Some(prefix) if prefix.contains('*') => {
                    Err(bad("`*` is only allowed once, at the end (prefix match)"))
                }
                Some(prefix) => Ok(RoutePath::Prefix(prefix.to_owned())),
                None if p.contains('*') => {
                    Err(bad("`*` is only allowed once, at the end (prefix match)"))
                }
                None => Ok(RoutePath::Exact(p.clone())),
            }
        })
        .collect()
}

fn compile_matcher(route: &Route) -> Result<Matcher, (String, InvalidReason)> {
    let mut methods = 0u16;
    for (j, m) in route.methods.iter().enumerate() {
        match method_bit(m) {
            0 => {
                return Err((
                    format!("match.methods[{j}]"),
                    InvalidReason::UnknownMethod(m.clone()),
                ));
            }
            bit => methods |= bit,
        }
    }
    let remote_addrs = route
        .remote_addrs
        .iter()
        .enumerate()
        .map(|(j, a)| {
            parse_net(a).map_err(|reason| {
                (
                    format!("match.remoteAddrs[{j}]"),
                    InvalidReason::BadRemoteAddr {
                        addr: a.clone(),
                        reason,
                    },
                )
            })
        })
        .collect::<Result<Box<[_]>, _>>()?;
    let exprs = route
        .exprs
        .iter()
        .enumerate()
        .map(|(j, e)| expr::compile(e).map_err(|(f, r)| (format!("match.exprs[{j}].{f}"), r)))
        .collect::<Result<Box<[_]>, _>>()?;
    Ok(Matcher {
        methods,
        remote_addrs,
        exprs,
    })
}

/// An address (`10.0.0.1`, `::1`) or CIDR (`10.0.0.0/8`, `fd00::/8`).
fn parse_net(raw: &str) -> Result<IpNet, String> {
    let raw = raw.trim();
    if raw.contains('/') {
        return raw
            .parse::<IpNet>()
            .map(|n| n.trunc())
            .map_err(|e| e.to_string());
    }
    raw.parse::<IpAddr>()
        .map(IpNet::from)
        .map_err(|e| e.to_string())
}
