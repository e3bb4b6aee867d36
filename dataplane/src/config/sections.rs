//! The Gateway listeners sharing one per-Gateway port (`Listener.sections`), compiled: which
//! one a host chooses, and each one's routes.
//!
//! - Listener isolation (Gateway API `GatewayHTTPListenerIsolation`): a request is routed
//!   only among the routes of the section its host chooses ([`Sections::select`]): the
//!   section whose hostname is that exact host, else the one with the longest wildcard
//!   covering it (`*.example.com` covers any depth of subdomain, never `example.com`), else
//!   the section without a hostname. No section: nothing serves the host (404).
//! - Misdirected requests (`GatewayHTTPSListenerDetectMisdirectedRequests`): on a TLS port
//!   the handshake's server name chooses a section the same way; a request whose host
//!   chooses another one gets 421 ([`Sections::misdirected`]), so a connection made for one
//!   listener (its certificate, its client-certificate checks) never serves another's
//!   routes, HTTP/2 connection coalescing included.

use sluice_proto::v1;

use crate::router::host::{RouteHost, parse_route_host};
use crate::router::{InvalidRoute, Router};

/// One Gateway listener of a port.
#[derive(Debug)]
pub struct Section {
    /// The Gateway listener's name.
    pub name: String,
    /// Its routes (indexes of the snapshot's routes).
    pub router: Router,
}

/// The sections of one port; empty when the port has none (no isolation).
#[derive(Debug, Default)]
pub struct Sections {
    list: Vec<Section>,
    /// Index in `list` by exact hostname.
    exact: Vec<(String, usize)>,
    /// (suffix with its leading dot, index), longest suffix first.
    wildcard: Vec<(String, usize)>,
    /// The section without a hostname.
    any: Option<usize>,
}

impl Sections {
    /// Compiles the `sections` of listener `listener` over the snapshot's `routes`; `Err`
    /// names the offending field. Every route a section lists must name the listener.
    pub fn compile(
        listener: &str,
        sections: &[v1::ListenerSection],
        routes: &[v1::Route],
    ) -> Result<Sections, (String, String)> {
        let mut out = Sections::default();
        if sections.is_empty() {
            return Ok(out);
        }
        let by_id: std::collections::HashMap<&str, &v1::Route> =
            routes.iter().map(|r| (r.id.as_str(), r)).collect();
        for (i, s) in sections.iter().enumerate() {
            let field = |f: &str| format!("sections[{i}].{f}");
            let taken = |what: &str| {
                (
                    field("hostname"),
                    format!("{what} is also section {}'s", s.name),
                )
            };
            if s.hostname.is_empty() {
                if out.any.is_some() {
                    return Err(taken("no hostname"));
                }
                out.any = Some(i);
            } else {
                match parse_route_host(&s.hostname).map_err(|e| (field("hostname"), e))? {
                    RouteHost::Exact(h) => {
                        if out.exact.iter().any(|(o, _)| *o == h) {
                            return Err(taken(&h));
                        }
                        out.exact.push((h, i));
                    }
                    RouteHost::Wildcard(suffix) => {
                        if out.wildcard.iter().any(|(o, _)| *o == suffix) {
                            return Err(taken(&s.hostname));
                        }
                        out.wildcard.push((suffix, i));
                    }
                }
            }
            let router = Router::scoped(routes, |r| s.routes.binary_search(&r.id).is_ok())
                .map_err(|e: InvalidRoute| (field("routes"), e.to_string()))?;
            if !s.routes.is_sorted() {
                return Err((field("routes"), "not sorted".into()));
            }
            for (j, id) in s.routes.iter().enumerate() {
                match by_id.get(id.as_str()) {
                    None => {
                        return Err((
                            format!("{}[{j}]", field("routes")),
                            format!("unknown route `{id}`"),
                        ));
                    }
                    Some(r) if !r.listeners.iter().any(|l| l == listener) => {
                        return Err((
                            format!("{}[{j}]", field("routes")),
                            format!("route `{id}` does not name this listener"),
                        ));
                    }
                    Some(_) => {}
                }
            }
            out.list.push(Section {
                name: s.name.clone(),
                router,
            });
        }
        out.wildcard
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        Ok(out)
    }

    /// Whether the port has sections (isolation applies).
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Index of the section a host (canonical: lower case, no port, no trailing dot; `None`
    /// for none) chooses; `None` when no section serves it.
    pub fn select(&self, host: Option<&str>) -> Option<usize> {
        let Some(host) = host else {
            return self.any;
        };
        if let Some((_, i)) = self.exact.iter().find(|(h, _)| h == host) {
            return Some(*i);
        }
        self.wildcard
            .iter()
            .find(|(suffix, _)| host.len() > suffix.len() && host.ends_with(suffix.as_str()))
            .map(|(_, i)| *i)
            .or(self.any)
    }

    /// The section `i` ([`Sections::select`]).
    pub fn get(&self, i: usize) -> Option<&Section> {
        self.list.get(i)
    }

    /// The router for a request's host: its section's; `None` when no section serves it.
    pub fn router_for(&self, host: Option<&str>) -> Option<&Router> {
        self.select(host)
            .and_then(|i| self.get(i))
            .map(|s| &s.router)
    }

    /// Whether a request for `host` (canonical) on a TLS connection whose ClientHello named
    /// `server_name` must be refused with 421: the two choose different sections.
    pub fn misdirected(&self, server_name: Option<&str>, host: Option<&str>) -> bool {
        if self.is_empty() {
            return false;
        }
        let sni = server_name.map(|n| {
            let n = n.strip_suffix('.').unwrap_or(n);
            n.to_ascii_lowercase()
        });
        self.select(sni.as_deref()) != self.select(host)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn sections(hosts: &[&str]) -> Sections {
        let list: Vec<v1::ListenerSection> = hosts
            .iter()
            .map(|h| v1::ListenerSection {
                name: if h.is_empty() {
                    "any".into()
                } else {
                    (*h).into()
                },
                hostname: (*h).into(),
                routes: Vec::new(),
            })
            .collect();
        Sections::compile("l", &list, &[]).unwrap()
    }

    fn name(s: &Sections, host: Option<&str>) -> Option<String> {
        s.select(host).map(|i| s.get(i).unwrap().name.clone())
    }

    /// The isolation conformance test's listeners.
    #[test]
    fn the_most_specific_section_wins() {
        let s = sections(&[
            "",
            "*.example.com",
            "*.foo.example.com",
            "abc.foo.example.com",
        ]);
        for (host, want) in [
            ("bar.com", "any"),
            ("example.com", "any"),
            ("bar.example.com", "*.example.com"),
            ("a.b.example.com", "*.example.com"),
            ("bar.foo.example.com", "*.foo.example.com"),
            ("abc.foo.example.com", "abc.foo.example.com"),
        ] {
            assert_eq!(name(&s, Some(host)).as_deref(), Some(want), "{host}");
        }
        assert_eq!(name(&s, None).as_deref(), Some("any"));
        let no_any = sections(&["a.com"]);
        assert_eq!(name(&no_any, Some("b.com")), None);
    }

    /// The misdirected-requests conformance test's listeners and cases.
    #[test]
    fn another_sections_host_is_misdirected() {
        let s = sections(&[
            "",
            "second-example.org",
            "*.wildcard.org",
            "fourth-example.wildcard.org",
        ]);
        for (sni, host, want) in [
            ("example.org", "example.org", false),
            ("example.org", "second-example.org", true),
            ("example.org", "unknown-example.org", false),
            ("second-example.org", "example.org", true),
            ("second-example.org", "unknown-example.org", true),
            ("Second-Example.org.", "second-example.org", false),
            (
                "third-example.wildcard.org",
                "fith-example.wildcard.org",
                false,
            ),
            (
                "third-example.wildcard.org",
                "fourth-example.wildcard.org",
                true,
            ),
            (
                "fourth-example.wildcard.org",
                "fith-example.wildcard.org",
                true,
            ),
            ("unknown-example.org", "example.org", false),
        ] {
            assert_eq!(s.misdirected(Some(sni), Some(host)), want, "{sni} {host}");
        }
        assert!(!Sections::default().misdirected(Some("a.com"), Some("b.com")));
    }

    #[test]
    fn two_sections_for_one_hostname_are_refused() {
        let list = |a: &str, b: &str| {
            vec![
                v1::ListenerSection {
                    name: "a".into(),
                    hostname: a.into(),
                    routes: Vec::new(),
                },
                v1::ListenerSection {
                    name: "b".into(),
                    hostname: b.into(),
                    routes: Vec::new(),
                },
            ]
        };
        assert!(Sections::compile("l", &list("", ""), &[]).is_err());
        assert!(Sections::compile("l", &list("A.com", "a.com"), &[]).is_err());
        assert!(Sections::compile("l", &list("*.a.com", "*.a.com"), &[]).is_err());
        assert!(Sections::compile("l", &list("a.com", "*.a.com"), &[]).is_ok());
    }
}
