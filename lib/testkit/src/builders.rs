//! Snapshot builders: the smallest `sluice.v1` routes, upstreams and health checks a test
//! needs, with everything else at its default.

use std::net::SocketAddr;

use sluice_proto::v1;

/// Route `id` for `paths` to upstream `upstream` (weight 100).
pub fn route(id: &str, paths: &[&str], upstream: &str) -> v1::Route {
    v1::Route {
        id: id.into(),
        paths: paths.iter().map(|p| p.to_string()).collect(),
        backends: vec![v1::Backend {
            upstream_id: upstream.into(),
            weight: 100,
            plugins: Vec::new(),
        }],
        ..Default::default()
    }
}

/// Route `id` for `paths` to upstream `upstream` with `plugins`.
pub fn route_with(id: &str, paths: &[&str], upstream: &str, plugins: Vec<v1::Plugin>) -> v1::Route {
    v1::Route {
        plugins,
        ..route(id, paths, upstream)
    }
}

/// Upstream `id` of `(address, weight)` endpoints.
pub fn upstream(id: &str, endpoints: &[(SocketAddr, u32)]) -> v1::Upstream {
    v1::Upstream {
        id: id.into(),
        endpoints: endpoints
            .iter()
            .map(|(a, w)| v1::Endpoint {
                host: a.ip().to_string(),
                port: u32::from(a.port()),
                weight: *w,
            })
            .collect(),
        ..Default::default()
    }
}

/// Upstream `id` of `addrs`, weight 100 each.
pub fn upstream_of(id: &str, addrs: &[SocketAddr]) -> v1::Upstream {
    let endpoints: Vec<(SocketAddr, u32)> = addrs.iter().map(|a| (*a, 100)).collect();
    upstream(id, &endpoints)
}

/// Snapshot `version` of `routes` and `upstreams`, sealed (hash set) as a controller sends it.
pub fn snapshot(
    version: u64,
    routes: Vec<v1::Route>,
    upstreams: Vec<v1::Upstream>,
) -> v1::Snapshot {
    sluice_proto::seal(
        v1::Snapshot {
            routes,
            upstreams,
            ..Default::default()
        },
        version,
    )
}

/// Plugin `name` with its config as JSON.
pub fn plugin(name: &str, config: serde_json::Value) -> v1::Plugin {
    v1::Plugin {
        name: name.into(),
        config_json: config.to_string(),
    }
}

/// The passive check of [`health_check`] and [`passive_check`]: one connect failure or
/// timeout (or three 500/503 answers) ejects an endpoint, one 200 brings it back.
fn passive() -> v1::UpstreamPassiveCheck {
    v1::UpstreamPassiveCheck {
        healthy: Some(v1::UpstreamHealthThresholds {
            http_codes: vec![200],
            successes: 1,
            ..Default::default()
        }),
        unhealthy: Some(v1::UpstreamHealthThresholds {
            http_codes: vec![500, 503],
            http_failures: 3,
            tcp_failures: 1,
            timeouts: 1,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A passive-only health check: one connect failure or timeout ejects an endpoint, one 200
/// brings it back.
pub fn passive_check() -> v1::UpstreamHealthCheck {
    v1::UpstreamHealthCheck {
        active: None,
        passive: Some(passive()),
    }
}

/// A health check: active HTTP probes of `/healthz` every second, flipping after one probe,
/// and (with `passive`) the passive check of [`passive_check`].
pub fn health_check(passive_too: bool) -> v1::UpstreamHealthCheck {
    v1::UpstreamHealthCheck {
        active: Some(v1::UpstreamActiveCheck {
            timeout_ms: 500,
            concurrency: 10,
            http_path: "/healthz".into(),
            healthy: Some(v1::UpstreamHealthThresholds {
                http_codes: vec![200],
                successes: 1,
                interval_ms: 1000,
                ..Default::default()
            }),
            unhealthy: Some(v1::UpstreamHealthThresholds {
                http_codes: vec![500],
                http_failures: 1,
                tcp_failures: 1,
                timeouts: 1,
                interval_ms: 1000,
                ..Default::default()
            }),
            ..Default::default()
        }),
        passive: passive_too.then(passive),
    }
}
