//! ApisixUpstream `passHost` and `upstreamHost` (which Host header an upstream request
//! carries: the client's (`pass`, default), the endpoint's (`node`) or `upstreamHost`
//! (`rewrite`)): validation and conversion into the snapshot's `Upstream.pass_host` and
//! `upstream_host`. Set per ApisixUpstream (and per port in `portLevelSettings`) through
//! [`super::settings`].

use sluice_crds::PassHost;
use sluice_proto::v1;

use crate::problems::Problems;

/// `passHost` and `upstreamHost`, validated.
pub(crate) fn pass_host(
    pass: Option<PassHost>,
    upstream_host: Option<&str>,
    field: &str,
    problems: &mut Problems,
) -> Option<(v1::UpstreamPassHost, String)> {
    if pass.is_none() && upstream_host.is_none() {
        return None;
    }
    let host = upstream_host.unwrap_or_default().to_owned();
    if !host.is_empty() {
        let ok = host.parse::<http_authority::Check>().is_ok();
        if !ok {
            problems.error(
                format!("{field}upstreamHost"),
                format!("{host:?} is not a valid host[:port]"),
            );
        }
    }
    let p = match pass.unwrap_or_default() {
        PassHost::Pass => v1::UpstreamPassHost::Pass,
        PassHost::Node => v1::UpstreamPassHost::Node,
        PassHost::Rewrite => {
            if host.is_empty() {
                problems.error(
                    format!("{field}upstreamHost"),
                    "required when passHost is rewrite",
                );
            }
            v1::UpstreamPassHost::Rewrite
        }
    };
    Some((p, host))
}

/// A tiny `host[:port]` check for `upstreamHost` (no scheme, path or spaces).
pub(super) mod http_authority {
    /// Marker type: parsing succeeds for a valid `host[:port]`.
    pub(crate) struct Check;

    impl std::str::FromStr for Check {
        type Err = ();

        fn from_str(s: &str) -> Result<Self, ()> {
            let (host, port) = match s.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') || h.starts_with('[') => (h, Some(p)),
                _ => (s, None),
            };
            if let Some(p) = port
                && p.parse::<u16>().map_or(true, |p| p == 0)
            {
                return Err(());
            }
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if host.parse::<std::net::IpAddr>().is_ok() {
                return Ok(Check);
            }
            crate::validate::node_host(host)
                .map(|_| Check)
                .map_err(|_| ())
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn authority() {
        for ok in [
            "example.com",
            "example.com:8080",
            "10.0.0.1:80",
            "[fd00::1]:80",
        ] {
            assert!(ok.parse::<http_authority::Check>().is_ok(), "{ok}");
        }
        for bad in ["http://x", "a b", "x:0", "x:99999", ""] {
            assert!(bad.parse::<http_authority::Check>().is_err(), "{bad}");
        }
    }
}
