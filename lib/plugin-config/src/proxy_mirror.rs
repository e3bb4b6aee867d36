//! `proxy-mirror`: send a copy of each request to another service and ignore its answer.

use serde::Deserialize;

use crate::{FieldError, PluginSchema, common};

/// How [`ProxyMirror::path`] combines with the request's path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PathConcatMode {
    /// The mirror gets `path` instead of the request's path (the query is kept). Default.
    #[default]
    Replace,
    /// The mirror gets `path` followed by the request's path and query.
    Prefix,
}

/// Configuration of `proxy-mirror` (APISIX schema and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyMirror {
    /// The mirror service, `http://host[:port]` or `https://host[:port]`, without a path.
    /// Required.
    pub host: String,
    /// A path for the mirrored request (`/...`, without `?` or `&`); default none (the
    /// request's own path).
    #[serde(default)]
    pub path: Option<String>,
    /// How `path` combines with the request's path; default `replace`.
    #[serde(default)]
    pub path_concat_mode: PathConcatMode,
    /// Share of requests mirrored, 0.00001..=1; default 1 (every request).
    #[serde(default = "default_sample_ratio")]
    pub sample_ratio: f64,
}

fn default_sample_ratio() -> f64 {
    1.0
}

/// Where mirrored requests go, from [`ProxyMirror::host`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorTarget {
    /// `https`.
    pub tls: bool,
    /// Host name or IP (without brackets), for DNS and TLS verification.
    pub host: String,
    /// Port (default 80 / 443).
    pub port: u16,
}

impl MirrorTarget {
    /// `host:port` to dial (`[v6]:port`).
    pub fn dial(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl ProxyMirror {
    /// A mirror of every `fraction` (0..=1, `None` = all) of requests to a resolved
    /// endpoint `host:port` over plain HTTP, keeping the request's path: what a Gateway API
    /// `RequestMirror` filter asks for once its `backendRef` is resolved (a Service's
    /// ClusterIP or DNS name and port). `None` when `fraction` mirrors nothing (0, or below
    /// APISIX's smallest ratio): the filter then needs no plugin at all.
    pub fn to_endpoint(host: &str, port: u16, fraction: Option<f64>) -> Option<ProxyMirror> {
        let ratio = fraction.unwrap_or(1.0).clamp(0.0, 1.0);
        if ratio < MIN_SAMPLE_RATIO {
            return None;
        }
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        Some(ProxyMirror {
            host: format!("http://{host}:{port}"),
            path: None,
            path_concat_mode: PathConcatMode::Replace,
            sample_ratio: ratio,
        })
    }

    /// The parsed [`ProxyMirror::host`].
    pub fn target(&self) -> Result<MirrorTarget, FieldError> {
        let err = |reason: &str| FieldError::new("host", format!("{:?} {reason}", self.host));
        let (tls, rest) = if let Some(rest) = self.host.strip_prefix("http://") {
            (false, rest)
        } else if let Some(rest) = self.host.strip_prefix("https://") {
            (true, rest)
        } else if self.host.starts_with("grpc://") || self.host.starts_with("grpcs://") {
            return Err(err(
                "is a gRPC mirror, which Sluice does not support yet; use http:// or https://",
            ));
        } else {
            return Err(err("must start with http:// or https://"));
        };
        if rest.is_empty() {
            return Err(err("has no host"));
        }
        if rest.contains(['/', '?', '#', '@']) {
            return Err(err(
                "must be scheme://host[:port] only (no path, query or user info)",
            ));
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let Some((addr, after)) = v6.split_once(']') else {
                return Err(err("has an unclosed IPv6 bracket"));
            };
            if addr.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(err("has an invalid IPv6 address"));
            }
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| err("has junk after the IPv6 address"))?,
                ),
            };
            (addr, port)
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (rest, None),
            }
        };
        let port = match port {
            None => {
                if tls {
                    443
                } else {
                    80
                }
            }
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
                _ => return Err(err("has an invalid port")),
            },
        };
        if !rest.starts_with('[') {
            common::check_host(host).map_err(|e| FieldError::new("host", e))?;
        }
        Ok(MirrorTarget {
            tls,
            host: host.to_owned(),
            port,
        })
    }
}

/// APISIX's smallest `sample_ratio`.
pub const MIN_SAMPLE_RATIO: f64 = 0.00001;

impl PluginSchema for ProxyMirror {
    const NAME: &'static str = "proxy-mirror";
    const PRIORITY: i32 = 1010;

    fn check(&self) -> Result<(), FieldError> {
        self.target()?;
        if let Some(path) = &self.path {
            let ok = path.len() > 1
                && path.starts_with('/')
                && !path.contains(['?', '&'])
                && http::uri::PathAndQuery::try_from(path.as_str()).is_ok();
            if !ok {
                return Err(FieldError::new(
                    "path",
                    format!(
                        "{path:?} must start with / and be followed by a valid path without ? or &"
                    ),
                ));
            }
        }
        if !(MIN_SAMPLE_RATIO..=1.0).contains(&self.sample_ratio) {
            return Err(FieldError::new(
                "sample_ratio",
                format!("{} is out of range 0.00001..=1", self.sample_ratio),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::{parse, validate};
    use serde_json::json;

    #[test]
    fn defaults_as_apisix() {
        let c: ProxyMirror = parse(&json!({"host": "http://mirror.default:9797"})).unwrap();
        assert_eq!(c.path, None);
        assert_eq!(c.path_concat_mode, PathConcatMode::Replace);
        assert_eq!(c.sample_ratio, 1.0);
        assert_eq!(
            c.target().unwrap(),
            MirrorTarget {
                tls: false,
                host: "mirror.default".into(),
                port: 9797
            }
        );
        let t = parse::<ProxyMirror>(&json!({"host": "https://[::1]"}))
            .unwrap()
            .target()
            .unwrap();
        assert_eq!((t.tls, t.host.as_str(), t.port), (true, "::1", 443));
        assert_eq!(t.dial(), "[::1]:443");
        let c: ProxyMirror = parse(&json!({
            "host": "http://10.0.0.1", "path": "/a/b", "path_concat_mode": "prefix",
            "sample_ratio": "0.5"
        }))
        .unwrap();
        assert_eq!(c.path_concat_mode, PathConcatMode::Prefix);
        assert_eq!(c.sample_ratio, 0.5);
        assert_eq!(c.target().unwrap().port, 80);
    }

    #[test]
    fn a_gateway_mirror_to_a_resolved_service_is_a_valid_config() {
        let c = ProxyMirror::to_endpoint("10.96.0.12", 8080, Some(0.25)).unwrap();
        assert_eq!(c.host, "http://10.96.0.12:8080");
        assert_eq!(c.sample_ratio, 0.25);
        let json = json!({"host": c.host, "sample_ratio": c.sample_ratio});
        assert_eq!(parse::<ProxyMirror>(&json).unwrap(), c);
        let c = ProxyMirror::to_endpoint("fd00::12", 80, None).unwrap();
        assert_eq!(c.target().unwrap().dial(), "[fd00::12]:80");
        let c = ProxyMirror::to_endpoint("echo.default.svc.cluster.local", 80, None).unwrap();
        assert!(c.check().is_ok());
        assert!(ProxyMirror::to_endpoint("10.0.0.1", 80, Some(0.0)).is_none());
    }

    #[test]
    fn checks() {
        for (conf, want) in [
            (json!({}), "missing field `host`"),
            (
                json!({"host": "ftp://a"}),
                "host: \"ftp://a\" must start with http:// or https://",
            ),
            (
                json!({"host": "grpc://a:50051"}),
                "host: \"grpc://a:50051\" is a gRPC mirror, which Sluice does not support yet; use http:// or https://",
            ),
            (
                json!({"host": "http://a/x"}),
                "host: \"http://a/x\" must be scheme://host[:port] only (no path, query or user info)",
            ),
            (
                json!({"host": "http://u@a"}),
                "host: \"http://u@a\" must be scheme://host[:port] only (no path, query or user info)",
            ),
            (
                json!({"host": "http://a:99999"}),
                "host: \"http://a:99999\" has an invalid port",
            ),
            (json!({"host": "http://"}), "host: \"http://\" has no host"),
            (
                json!({"host": "http://a b"}),
                "host: \"a b\" is neither an IP address nor a host name: invalid character ' ' in host name",
            ),
            (
                json!({"host": "http://a", "path": "/x?y=1"}),
                "path: \"/x?y=1\" must start with / and be followed by a valid path without ? or &",
            ),
            (
                json!({"host": "http://a", "path": "x"}),
                "path: \"x\" must start with / and be followed by a valid path without ? or &",
            ),
            (
                json!({"host": "http://a", "sample_ratio": 0}),
                "sample_ratio: 0 is out of range 0.00001..=1",
            ),
            (
                json!({"host": "http://a", "sample_ratio": 1.5}),
                "sample_ratio: 1.5 is out of range 0.00001..=1",
            ),
            (
                json!({"host": "http://a", "path_concat_mode": "append"}),
                "path_concat_mode: unknown variant `append`, expected `replace` or `prefix`",
            ),
            (
                json!({"host": "http://a", "timeout": 3}),
                "timeout: unknown field `timeout`, expected one of `host`, `path`, `path_concat_mode`, `sample_ratio`",
            ),
        ] {
            let e = validate("proxy-mirror", &conf).unwrap_err().to_string();
            assert_eq!(e, format!("plugin \"proxy-mirror\": {want}"), "{conf}");
        }
    }
}
