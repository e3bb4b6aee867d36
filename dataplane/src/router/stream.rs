//! The stream router: which layer-4 route of a listener a connection gets, by the SNI of
//! its ClientHello (TLS listeners) and the client's address.
//!
//! - SNI: an exact host first, then the wildcard `*.suffix` with the longest suffix (any
//!   depth: `*.example.com` matches `a.b.example.com`, as Gateway API hostnames do, not the
//!   one-label rule of TLS certificates), then a route with no hosts.
//! - Within one of those, routes are tried in snapshot order (by id); the first whose
//!   `remote_addrs` admits the client wins. None admits it: the next, less specific, level.
//! - Hosts compare case-insensitively, without a trailing dot. A connection without SNI
//!   reaches only routes with no hosts.
//!
//! Lookup cost does not grow with the number of routes: a hash lookup per label of the SNI.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;

/// Why a stream route's match rules cannot be compiled.
#[derive(Debug, thiserror::Error)]
#[error("stream route {route}: {field}: {reason}")]
pub struct InvalidStreamRoute {
    /// Route id.
    pub route: String,
    /// Offending field.
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

/// The match rules of one stream route, as the router indexes them.
#[derive(Debug, Clone, Default)]
pub struct StreamMatch {
    /// Route id (for errors and explain).
    pub id: String,
    /// SNI hosts, exact or `*.suffix`; empty = any.
    pub hosts: Vec<String>,
    /// Client CIDRs (or single addresses); empty = any.
    pub remote_addrs: Vec<String>,
}

/// Where a lookup found its route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchedBy {
    /// The SNI equals one of the route's hosts.
    Exact,
    /// The SNI is under one of the route's `*.suffix` hosts.
    Wildcard,
    /// The route has no hosts.
    Any,
}

/// The stream routes of one listener, indexed.
#[derive(Debug, Default)]
pub struct StreamRouter {
    exact: HashMap<String, Vec<usize>>,
    /// Keyed by the suffix without `*.`.
    wildcard: HashMap<String, Vec<usize>>,
    any: Vec<usize>,
    remote: Vec<Vec<IpNet>>,
}

/// `host` lowercased, without a trailing dot.
fn normalise(host: &str) -> String {
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

impl StreamRouter {
    /// Indexes `routes`; lookups return indexes into it.
    pub fn new(routes: &[StreamMatch]) -> Result<Self, InvalidStreamRoute> {
        let mut r = StreamRouter::default();
        for (i, m) in routes.iter().enumerate() {
            let invalid = |field: String, reason: String| InvalidStreamRoute {
                route: m.id.clone(),
                field,
                reason,
            };
            let mut nets = Vec::with_capacity(m.remote_addrs.len());
            for (k, a) in m.remote_addrs.iter().enumerate() {
                let net = a
                    .parse::<IpNet>()
                    .or_else(|_| a.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| {
                        invalid(
                            format!("remote_addrs[{k}]"),
                            format!("{a:?} is not an IP address or CIDR"),
                        )
                    })?;
                nets.push(net);
            }
            r.remote.push(nets);
            if m.hosts.is_empty() {
                r.any.push(i);
            }
            for (k, h) in m.hosts.iter().enumerate() {
                let h = normalise(h);
                let bad = h.is_empty()
                    || h.contains(['/', ':', ' '])
                    || h.strip_prefix("*.").unwrap_or(&h).contains('*');
                if bad {
                    return Err(invalid(
                        format!("hosts[{k}]"),
                        format!("{h:?} is not a host name or `*.suffix`"),
                    ));
                }
                let list = match h.strip_prefix("*.") {
                    Some(suffix) => r.wildcard.entry(suffix.to_owned()).or_default(),
                    None => r.exact.entry(h).or_default(),
                };
                if !list.contains(&i) {
                    list.push(i);
                }
            }
        }
        Ok(r)
    }

    /// Whether no route is indexed.
    pub fn is_empty(&self) -> bool {
        self.remote.is_empty()
    }

    /// The route for a connection from `client` with `sni` (`None`: no SNI, or not a TLS
    /// listener), and how it matched.
    pub fn lookup(&self, sni: Option<&str>, client: IpAddr) -> Option<(usize, MatchedBy)> {
        let client = client.to_canonical();
        let admits = |i: &&usize| {
            self.remote
                .get(**i)
                .is_some_and(|nets| nets.is_empty() || nets.iter().any(|n| n.contains(&client)))
        };
        if let Some(sni) = sni {
            let sni = normalise(sni);
            if let Some(i) = self.exact.get(&sni).and_then(|l| l.iter().find(admits)) {
                return Some((*i, MatchedBy::Exact));
            }
            // Longest suffix first: drop one label at a time.
            let mut rest = sni.as_str();
            while let Some((_, suffix)) = rest.split_once('.') {
                if let Some(i) = self
                    .wildcard
                    .get(suffix)
                    .and_then(|l| l.iter().find(admits))
                {
                    return Some((*i, MatchedBy::Wildcard));
                }
                rest = suffix;
            }
        }
        self.any.iter().find(admits).map(|i| (*i, MatchedBy::Any))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn m(id: &str, hosts: &[&str], remote: &[&str]) -> StreamMatch {
        StreamMatch {
            id: id.into(),
            hosts: hosts.iter().map(|s| s.to_string()).collect(),
            remote_addrs: remote.iter().map(|s| s.to_string()).collect(),
        }
    }

    const C: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));

    #[test]
    fn exact_then_longest_wildcard_at_any_depth_then_any() {
        let r = StreamRouter::new(&[
            m("any", &[], &[]),
            m("star", &["*.example.com"], &[]),
            m("deep", &["*.b.example.com"], &[]),
            m("exact", &["A.b.example.com."], &[]),
        ])
        .unwrap();
        let at = |sni: Option<&str>| r.lookup(sni, C);
        assert_eq!(at(Some("a.b.example.com")), Some((3, MatchedBy::Exact)));
        assert_eq!(at(Some("x.b.example.com")), Some((2, MatchedBy::Wildcard)));
        assert_eq!(
            at(Some("x.y.b.example.com")),
            Some((2, MatchedBy::Wildcard))
        );
        assert_eq!(at(Some("x.y.example.com")), Some((1, MatchedBy::Wildcard)));
        assert_eq!(at(Some("example.com")), Some((0, MatchedBy::Any)));
        assert_eq!(at(Some("other.org")), Some((0, MatchedBy::Any)));
        assert_eq!(at(None), Some((0, MatchedBy::Any)));
    }

    #[test]
    fn no_default_means_no_route_for_unknown_or_missing_sni() {
        let r = StreamRouter::new(&[m("a", &["a.com"], &[])]).unwrap();
        assert_eq!(r.lookup(Some("b.com"), C), None);
        assert_eq!(r.lookup(None, C), None);
    }

    #[test]
    fn remote_addrs_fall_through_to_the_next_level() {
        let r = StreamRouter::new(&[
            m("inner", &["a.com"], &["192.168.0.0/16"]),
            m("fallback", &[], &["10.0.0.1"]),
        ])
        .unwrap();
        assert_eq!(r.lookup(Some("a.com"), C), Some((1, MatchedBy::Any)));
        let inside: IpAddr = "::ffff:192.168.3.4".parse().unwrap();
        assert_eq!(r.lookup(Some("a.com"), inside), Some((0, MatchedBy::Exact)));
        assert_eq!(r.lookup(None, "10.0.0.2".parse().unwrap()), None);
    }

    #[test]
    fn bad_hosts_and_addresses_name_the_field() {
        let e = StreamRouter::new(&[m("r", &["a.*.com"], &[])]).unwrap_err();
        assert_eq!(e.field, "hosts[0]");
        let e = StreamRouter::new(&[m("r", &[], &["x"])]).unwrap_err();
        assert_eq!(e.field, "remote_addrs[0]");
    }

    /// The index agrees with a scan over every route for random host sets.
    #[test]
    fn agrees_with_a_naive_scan() {
        let labels = ["a", "b", "c"];
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize
        };
        for _ in 0..200 {
            let mut routes = Vec::new();
            for i in 0..4 {
                let depth = 1 + next() % 3;
                let name: Vec<&str> = (0..depth).map(|_| labels[next() % 3]).collect();
                let host = if next() % 2 == 0 {
                    format!("*.{}", name.join("."))
                } else {
                    name.join(".")
                };
                let hosts = if next() % 5 == 0 { vec![] } else { vec![host] };
                routes.push(StreamMatch {
                    id: format!("r{i}"),
                    hosts,
                    remote_addrs: vec![],
                });
            }
            let r = StreamRouter::new(&routes).unwrap();
            for _ in 0..20 {
                let depth = 1 + next() % 4;
                let sni: Vec<&str> = (0..depth).map(|_| labels[next() % 3]).collect();
                let sni = sni.join(".");
                let naive = routes
                    .iter()
                    .position(|m| m.hosts.contains(&sni))
                    .or_else(|| {
                        routes
                            .iter()
                            .enumerate()
                            .filter_map(|(i, m)| {
                                m.hosts
                                    .iter()
                                    .filter_map(|h| h.strip_prefix("*."))
                                    .filter(|s| sni.ends_with(&format!(".{s}")))
                                    .map(|s| (s.len(), std::cmp::Reverse(i)))
                                    .max()
                            })
                            .max()
                            .map(|(_, std::cmp::Reverse(i))| i)
                    })
                    .or_else(|| routes.iter().position(|m| m.hosts.is_empty()));
                assert_eq!(
                    r.lookup(Some(&sni), C).map(|x| x.0),
                    naive,
                    "{sni} {routes:?}"
                );
            }
        }
    }
}
