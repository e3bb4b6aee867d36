//! Endpoint selection: smooth weighted round robin (nginx), a consistent-hash ring with
//! virtual nodes (`chash`), latency-aware `ewma` and `least_conn`.
//!
//! Every policy picks among endpoints that are healthy and not yet tried for this request;
//! when none is left it falls back to the untried unhealthy ones, as APISIX does when every
//! node is unhealthy (better a chance than a certain 503).

use std::hash::Hasher as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::HeaderMap;
use sluice_proto::v1;

use crate::upstream::WeightedSequence;
use crate::upstream::health::EndpointState;

/// Virtual nodes on the ring for an endpoint with the largest weight of its upstream.
const RING_POINTS: u64 = 160;

/// Endpoints already tried by one request (they are not picked again).
#[derive(Debug, Default, Clone)]
pub struct Tried(Vec<usize>);

impl Tried {
    /// Marks `i` as tried.
    pub fn push(&mut self, i: usize) {
        self.0.push(i);
    }

    /// Whether `i` was tried.
    #[inline]
    pub fn contains(&self, i: usize) -> bool {
        self.0.contains(&i)
    }

    /// Number of endpoints tried.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether nothing was tried yet.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What `chash` hashes on, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashSource {
    /// A variable (`remote_addr`, `uri`, `arg_x`, `http_x`, `cookie_x`, ...).
    Var(Var),
    /// A request header.
    Header(http::HeaderName),
    /// A cookie.
    Cookie(String),
    /// The authenticated consumer's name (falls back to `remote_addr`).
    Consumer,
    /// A template of literal text and variables.
    Combination(Vec<Part>),
}

/// A piece of a `vars_combinations` template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Literal text.
    Text(String),
    /// A variable.
    Var(Var),
}

/// A request variable usable as a hash key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Var {
    /// Client IP.
    RemoteAddr,
    /// Client port.
    RemotePort,
    /// Path without the query.
    Uri,
    /// Path with the query.
    RequestUri,
    /// Host header without port.
    Host,
    /// Local address.
    ServerAddr,
    /// Query string.
    QueryString,
    /// A query argument.
    Arg(String),
    /// A header (`http_x_user` = `x-user`).
    Http(http::HeaderName),
    /// A cookie.
    Cookie(String),
}

impl Var {
    fn parse(name: &str) -> Option<Var> {
        Some(match name {
            "remote_addr" | "" => Var::RemoteAddr,
            "remote_port" => Var::RemotePort,
            "uri" => Var::Uri,
            "request_uri" => Var::RequestUri,
            "host" | "hostname" | "server_name" => Var::Host,
            "server_addr" => Var::ServerAddr,
            "query_string" => Var::QueryString,
            _ => {
                if let Some(a) = name.strip_prefix("arg_").filter(|a| !a.is_empty()) {
                    Var::Arg(a.to_owned())
                } else if let Some(h) = name.strip_prefix("http_").filter(|h| !h.is_empty()) {
                    Var::Http(http::HeaderName::from_bytes(h.replace('_', "-").as_bytes()).ok()?)
                } else if let Some(c) = name.strip_prefix("cookie_").filter(|c| !c.is_empty()) {
                    Var::Cookie(c.to_owned())
                } else {
                    return None;
                }
            }
        })
    }
}

impl HashSource {
    /// Compiles `hash_on`/`hash_key`; `Err` names what is wrong.
    pub fn from_proto(on: v1::UpstreamHashOn, key: &str) -> Result<Self, String> {
        Ok(match on {
            v1::UpstreamHashOn::Vars => {
                HashSource::Var(Var::parse(key).ok_or_else(|| format!("unknown variable {key:?}"))?)
            }
            v1::UpstreamHashOn::Header => HashSource::Header(
                http::HeaderName::from_bytes(key.as_bytes())
                    .map_err(|_| format!("{key:?} is not a header name"))?,
            ),
            v1::UpstreamHashOn::Cookie => {
                if key.is_empty() {
                    return Err("cookie name is empty".into());
                }
                HashSource::Cookie(key.to_owned())
            }
            v1::UpstreamHashOn::Consumer => HashSource::Consumer,
            v1::UpstreamHashOn::VarsCombinations => {
                let mut parts = Vec::new();
                let mut rest = key;
                while let Some(i) = rest.find('$') {
                    if i > 0 {
                        parts.push(Part::Text(rest[..i].to_owned()));
                    }
                    let after = &rest[i + 1..];
                    let end = after
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(after.len());
                    let name = &after[..end];
                    if name.is_empty() {
                        return Err(format!("{key:?}: `$` without a variable name"));
                    }
                    parts.push(Part::Var(
                        Var::parse(name).ok_or_else(|| format!("unknown variable ${name}"))?,
                    ));
                    rest = &after[end..];
                }
                if !rest.is_empty() {
                    parts.push(Part::Text(rest.to_owned()));
                }
                HashSource::Combination(parts)
            }
        })
    }

    /// The hash of this request's key. A missing header, cookie or consumer hashes the
    /// client address instead, as APISIX does.
    pub fn hash(&self, req: &HashInput<'_>) -> u64 {
        let mut h = Fnv::default();
        let wrote = match self {
            HashSource::Var(v) => req.write_var(v, &mut h),
            HashSource::Header(name) => match req.headers.get(name) {
                Some(v) => {
                    h.write(v.as_bytes());
                    true
                }
                None => false,
            },
            HashSource::Cookie(name) => match cookie(req.headers, name.as_bytes()) {
                Some(v) => {
                    h.write(v);
                    true
                }
                None => false,
            },
            HashSource::Consumer => match req.consumer {
                Some(c) => {
                    h.write(c.as_bytes());
                    true
                }
                None => false,
            },
            HashSource::Combination(parts) => {
                for p in parts {
                    match p {
                        Part::Text(t) => h.write(t.as_bytes()),
                        Part::Var(v) => {
                            req.write_var(v, &mut h);
                        }
                    }
                }
                true
            }
        };
        if !wrote {
            req.write_var(&Var::RemoteAddr, &mut h);
        }
        mix(h.finish())
    }
}

/// What a hash key may be taken from.
#[derive(Debug, Clone, Copy)]
pub struct HashInput<'a> {
    /// Host header (may carry a port).
    pub host: Option<&'a str>,
    /// Path without query.
    pub path: &'a str,
    /// Query string.
    pub query: Option<&'a str>,
    /// Request headers.
    pub headers: &'a HeaderMap,
    /// Client address.
    pub remote_addr: SocketAddr,
    /// Local address.
    pub local_addr: SocketAddr,
    /// The authenticated consumer, if any (set by the auth plugins).
    pub consumer: Option<&'a str>,
}

impl HashInput<'_> {
    /// Feeds the variable's value; false when the request has none.
    fn write_var(&self, v: &Var, h: &mut Fnv) -> bool {
        match v {
            Var::RemoteAddr => h.write(self.remote_addr.ip().to_string().as_bytes()),
            Var::RemotePort => h.write(self.remote_addr.port().to_string().as_bytes()),
            Var::Uri => h.write(self.path.as_bytes()),
            Var::RequestUri => {
                h.write(self.path.as_bytes());
                if let Some(q) = self.query {
                    h.write(b"?");
                    h.write(q.as_bytes());
                }
            }
            Var::Host => {
                let host = self.host.unwrap_or("");
                let host =
                    match host.rsplit_once(':') {
                        Some((h, p))
                            if !h.ends_with(']') && p.bytes().all(|b| b.is_ascii_digit()) =>
                        {
                            if h.contains(':') { host } else { h }
                        }
                        _ => host,
                    };
                h.write(host.to_ascii_lowercase().as_bytes());
            }
            Var::ServerAddr => h.write(self.local_addr.ip().to_string().as_bytes()),
            Var::QueryString => h.write(self.query.unwrap_or("").as_bytes()),
            Var::Arg(name) => {
                let v = self.query.and_then(|q| {
                    q.split('&').find_map(|kv| {
                        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                        (k == name).then_some(v)
                    })
                });
                match v {
                    Some(v) => h.write(v.as_bytes()),
                    None => return false,
                }
            }
            Var::Http(name) => match self.headers.get(name) {
                Some(v) => h.write(v.as_bytes()),
                None => return false,
            },
            Var::Cookie(name) => match cookie(self.headers, name.as_bytes()) {
                Some(v) => h.write(v),
                None => return false,
            },
        }
        true
    }
}

/// Value of the first cookie called `name`.
fn cookie<'h>(headers: &'h HeaderMap, name: &[u8]) -> Option<&'h [u8]> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .find_map(|header| {
            header.as_bytes().split(|&b| b == b';').find_map(|pair| {
                let pair = pair.trim_ascii();
                let i = pair.iter().position(|&b| b == b'=')?;
                (pair[..i].trim_ascii() == name).then(|| pair[i + 1..].trim_ascii())
            })
        })
}

/// FNV-1a, 64 bit: stable across processes and versions (the ring must be the same on every
/// dataplane replica so a key lands on the same endpoint everywhere).
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// splitmix64's finalizer: spreads FNV's output over the whole ring.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn hash_bytes(b: &[u8]) -> u64 {
    let mut h = Fnv::default();
    h.write(b);
    mix(h.finish())
}

/// A consistent-hash ring: each endpoint owns points named after its address, so adding or
/// removing an endpoint moves only the keys of its own arcs.
#[derive(Debug)]
pub struct Ring {
    points: Vec<(u64, u32)>,
}

impl Ring {
    /// Builds the ring of `(address, weight)`; points per endpoint are proportional to weight.
    pub fn new(endpoints: &[(&str, u32)]) -> Self {
        let max = endpoints.iter().map(|e| e.1).max().unwrap_or(0).max(1);
        let mut points = Vec::new();
        for (i, (addr, w)) in endpoints.iter().enumerate() {
            if *w == 0 {
                continue;
            }
            let n = (RING_POINTS * u64::from(*w))
                .div_ceil(u64::from(max))
                .max(1);
            for j in 0..n {
                let p = hash_bytes(format!("{addr}#{j}").as_bytes());
                points.push((p, i as u32));
            }
        }
        points.sort_unstable();
        Ring { points }
    }

    /// The first acceptable endpoint clockwise from `hash`.
    pub fn find(&self, hash: u64, ok: impl Fn(usize) -> bool) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        let start = self.points.partition_point(|(p, _)| *p < hash);
        let n = self.points.len();
        (0..n)
            .map(|k| self.points[(start + k) % n].1 as usize)
            .find(|i| ok(*i))
    }
}

/// The load-balancing policy of an upstream.
#[derive(Debug)]
pub enum Policy {
    /// Smooth weighted round robin.
    RoundRobin(Option<WeightedSequence>),
    /// Consistent hashing.
    Chash {
        /// The ring.
        ring: Ring,
        /// What the key is.
        source: HashSource,
    },
    /// Lowest latency average times in-flight requests.
    Ewma(AtomicUsize),
    /// Fewest in-flight requests relative to weight.
    LeastConn(AtomicUsize),
}

impl Policy {
    /// Builds the policy for endpoints `(address, weight)` (weights are non-zero).
    pub fn new(
        lb: v1::LoadBalancer,
        source: Option<HashSource>,
        endpoints: &[(&str, u32)],
    ) -> Self {
        match lb {
            v1::LoadBalancer::RoundRobin => {
                let w: Vec<u32> = endpoints.iter().map(|e| e.1).collect();
                Policy::RoundRobin(WeightedSequence::new(&w))
            }
            v1::LoadBalancer::Chash => Policy::Chash {
                ring: Ring::new(endpoints),
                source: source.unwrap_or(HashSource::Var(Var::RemoteAddr)),
            },
            v1::LoadBalancer::Ewma => Policy::Ewma(AtomicUsize::new(0)),
            v1::LoadBalancer::LeastConn => Policy::LeastConn(AtomicUsize::new(0)),
        }
    }

    /// Whether picks depend on the request (the caller then computes a hash).
    pub fn needs_hash(&self) -> bool {
        matches!(self, Policy::Chash { .. })
    }

    /// Picks an endpoint index: available (healthy, not ejected) and untried first, then
    /// untried at all.
    pub fn pick(
        &self,
        states: &[Arc<EndpointState>],
        weights: &[u32],
        hash: u64,
        tried: &Tried,
    ) -> Option<usize> {
        let healthy =
            |i: usize| !tried.contains(i) && states.get(i).is_some_and(|s| s.is_available());
        let untried = |i: usize| i < states.len() && !tried.contains(i);
        self.pick_with(states, weights, hash, healthy)
            .or_else(|| self.pick_with(states, weights, hash, untried))
    }

    fn pick_with(
        &self,
        states: &[Arc<EndpointState>],
        weights: &[u32],
        hash: u64,
        ok: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        match self {
            Policy::RoundRobin(seq) => {
                let seq = seq.as_ref()?;
                (0..seq.len()).map(|_| seq.next()).find(|i| ok(*i))
            }
            Policy::Chash { ring, .. } => ring.find(hash, ok),
            Policy::LeastConn(rot) => {
                // (in_flight + 1) / weight, compared without division; ties rotate.
                let n = states.len();
                let start = rot.fetch_add(1, Ordering::Relaxed);
                let mut best: Option<(usize, u128)> = None;
                for k in 0..n {
                    let i = (start + k) % n;
                    if !ok(i) {
                        continue;
                    }
                    let w = u128::from(weights.get(i).copied().unwrap_or(1).max(1));
                    let load = u128::from(states[i].in_flight() + 1);
                    // Scale so weights compare: load/w < best_load/best_w.
                    let score = load * 1_000_000 / w;
                    if best.is_none_or(|(_, b)| score < b) {
                        best = Some((i, score));
                    }
                }
                best.map(|b| b.0)
            }
            Policy::Ewma(rot) => {
                let n = states.len();
                let start = rot.fetch_add(1, Ordering::Relaxed);
                // NB: an endpoint not measured yet counts as twice as fast as the fastest
                // measured one: preferred while idle, so it gets measured, but not free, or
                // every concurrent request would go to it until its first response.
                let fastest = states
                    .iter()
                    .map(|s| s.ewma_us())
                    .filter(|e| *e > 0.0)
                    .fold(f64::INFINITY, f64::min);
                let fastest = if fastest.is_finite() { fastest } else { 1.0 };
                let mut best: Option<(usize, f64)> = None;
                for k in 0..n {
                    let i = (start + k) % n;
                    if !ok(i) {
                        continue;
                    }
                    let s = &states[i];
                    let ewma = match s.ewma_us() {
                        e if e > 0.0 => e,
                        _ => fastest / 2.0,
                    };
                    let score = ewma * (s.in_flight() + 1) as f64;
                    if best.is_none_or(|(_, b)| score < b) {
                        best = Some((i, score));
                    }
                }
                best.map(|b| b.0)
            }
        }
    }
}

/// The `chash` hash of a request for `upstream` (0 when it does not hash).
#[inline]
pub fn request_hash(
    upstream: &crate::upstream::Upstream,
    info: &crate::http::RequestInfo<'_>,
    consumer: Option<&str>,
) -> u64 {
    match upstream.hash_source() {
        None => 0,
        Some(source) => source.hash(&HashInput {
            host: info.host,
            path: info.path,
            query: info.query,
            headers: info.headers,
            remote_addr: info.remote_addr,
            local_addr: info.local_addr,
            consumer,
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn ring_moves_about_one_fifth_of_keys_when_a_fifth_endpoint_joins() {
        let four: Vec<String> = (1..=4).map(|i| format!("10.0.0.{i}:80")).collect();
        let mut five = four.clone();
        five.push("10.0.0.5:80".into());
        let a: Vec<(&str, u32)> = four.iter().map(|s| (s.as_str(), 100)).collect();
        let b: Vec<(&str, u32)> = five.iter().map(|s| (s.as_str(), 100)).collect();
        let (ra, rb) = (Ring::new(&a), Ring::new(&b));
        let n = 10_000;
        let mut moved = 0;
        for k in 0..n {
            let h = hash_bytes(format!("user-{k}").as_bytes());
            let x = ra.find(h, |_| true).unwrap();
            let y = rb.find(h, |_| true).unwrap();
            if four[x] != five[y] {
                moved += 1;
                assert_eq!(y, 4, "a key moved between two old endpoints");
            }
        }
        let share = moved as f64 / n as f64;
        assert!((0.10..=0.30).contains(&share), "moved {share}");
    }

    #[test]
    fn combination_templates_compile() {
        let s =
            HashSource::from_proto(v1::UpstreamHashOn::VarsCombinations, "$host-$arg_u").unwrap();
        assert_eq!(
            s,
            HashSource::Combination(vec![
                Part::Var(Var::Host),
                Part::Text("-".into()),
                Part::Var(Var::Arg("u".into()))
            ])
        );
        assert!(HashSource::from_proto(v1::UpstreamHashOn::Vars, "nope").is_err());
    }

    #[test]
    fn consumer_hash_uses_the_consumer_and_falls_back_to_the_client_address() {
        let headers = HeaderMap::new();
        let input = |consumer, ip: &str| HashInput {
            host: Some("a.com"),
            path: "/",
            query: None,
            headers: &headers,
            remote_addr: format!("{ip}:1000").parse().unwrap(),
            local_addr: "127.0.0.1:80".parse().unwrap(),
            consumer,
        };
        let s = HashSource::Consumer;
        // Same consumer from two clients: same key.
        assert_eq!(
            s.hash(&input(Some("alice"), "10.0.0.1")),
            s.hash(&input(Some("alice"), "10.0.0.2"))
        );
        assert_ne!(
            s.hash(&input(Some("alice"), "10.0.0.1")),
            s.hash(&input(Some("bob"), "10.0.0.1"))
        );
        // No consumer: the client address decides.
        assert_eq!(
            s.hash(&input(None, "10.0.0.1")),
            HashSource::Var(Var::RemoteAddr).hash(&input(None, "10.0.0.1"))
        );
    }

    #[test]
    fn ewma_does_not_pile_requests_onto_an_unmeasured_endpoint() {
        let reg = crate::upstream::health::HealthRegistry::default();
        let measured = reg.state("u", "a:1");
        measured.observe_latency(std::time::Duration::from_millis(10));
        let fresh = reg.state("u", "b:1");
        let states = vec![Arc::clone(&measured), Arc::clone(&fresh)];
        let policy = Policy::new(v1::LoadBalancer::Ewma, None, &[("a:1", 1), ("b:1", 1)]);
        // Idle, the unmeasured endpoint would be preferred; three requests in flight on it
        // make the measured one the better choice.
        let _held: Vec<_> = (0..3).map(|_| fresh.begin()).collect();
        for _ in 0..4 {
            assert_eq!(policy.pick(&states, &[1, 1], 0, &Tried::default()), Some(0));
        }
    }
}
