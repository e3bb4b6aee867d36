//! In-process harness: a dataplane serving on a loopback port, plus a tiny HTTP client.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use sluice_dataplane::config::store::Store;
use sluice_dataplane::listener::server::{self, Limits};
use sluice_proto::v1;

/// A dataplane serving on a loopback port.
pub struct Dataplane {
    pub addr: SocketAddr,
    pub store: Arc<Store>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn dataplane() -> Dataplane {
    dataplane_with(Arc::new(Store::new().unwrap())).await
}

/// A dataplane serving `store` on a loopback port.
pub async fn dataplane_with(store: Arc<Store>) -> Dataplane {
    dataplane_limited(store, Limits::default()).await
}

/// A dataplane serving `store` on a loopback port with the downstream `limits`.
pub async fn dataplane_limited(store: Arc<Store>, limits: Limits) -> Dataplane {
    let std_listener = server::bind_reuseport("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(server::serve(listener, Arc::clone(&store), limits));
    Dataplane { addr, store, task }
}

/// A dataplane serving one route, `default/r/r1` for `path`, to the single endpoint `backend`.
pub async fn dataplane_to(path: &str, backend: SocketAddr) -> Dataplane {
    let dp = dataplane().await;
    apply_one_route(&dp.store, path, backend);
    dp
}

/// Applies snapshot 1: one route, `default/r/r1` for `path`, to the single endpoint `backend`.
pub fn apply_one_route(store: &Store, path: &str, backend: SocketAddr) {
    store
        .apply(
            snapshot(
                1,
                vec![route("default/r/r1", &[path], "u")],
                vec![upstream("u", &[(backend, 1)])],
            ),
            vec![],
        )
        .unwrap();
}

/// A response as a client sees it.
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one HTTP/1.1 request on a new connection.
pub async fn send(addr: SocketAddr, req: Request<Full<Bytes>>) -> Resp {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = sender.send_request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Resp {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub async fn get(addr: SocketAddr, host: &str, path: &str) -> Resp {
    let req = Request::get(path)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .unwrap();
    send(addr, req).await
}

/// Snapshot builders.
pub fn route(id: &str, paths: &[&str], upstream: &str) -> v1::Route {
    v1::Route {
        id: id.into(),
        paths: paths.iter().map(|p| p.to_string()).collect(),
        backends: vec![v1::Backend {
            upstream_id: upstream.into(),
            weight: 100,
        }],
        ..Default::default()
    }
}

pub fn upstream(id: &str, endpoints: &[(SocketAddr, u32)]) -> v1::Upstream {
    v1::Upstream {
        id: id.into(),
        endpoints: endpoints
            .iter()
            .map(|(a, w)| v1::Endpoint {
                host: a.ip().to_string(),
                port: a.port() as u32,
                weight: *w,
            })
            .collect(),
        ..Default::default()
    }
}

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

/// A plugin with its config as JSON.
pub fn plugin(name: &str, config: serde_json::Value) -> v1::Plugin {
    v1::Plugin {
        name: name.into(),
        config_json: config.to_string(),
    }
}

/// Route `id` for `paths` to upstream `u` with `plugins`.
pub fn route_with(id: &str, paths: &[&str], upstream: &str, plugins: Vec<v1::Plugin>) -> v1::Route {
    v1::Route {
        plugins,
        ..route(id, paths, upstream)
    }
}

/// GET `path` with extra headers.
pub async fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Resp {
    let mut b = Request::get(path).header("host", "example.com");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(addr, b.body(Full::new(Bytes::new())).unwrap()).await
}

/// Serves the admin endpoints of `store` on a loopback port.
pub async fn admin(store: &Arc<Store>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(sluice_dataplane::listener::admin::serve(
        listener,
        Arc::clone(store),
        sluice_dataplane::listener::admin::Endpoints::All,
    ));
    addr
}

/// The value of the sample `series` (name with labels exactly as rendered) in `text`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

// Shared by the plugin suites (plugins_misc, plugins_rewrite, plugins_cors_ip).

/// `127.0.0.1:0`.
pub fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// An echo origin `a` behind route `default/r/p` (`/*`, with `plugins`) and a plugin-free
/// route `default/r/free` (`/free`).
pub async fn with_plugins(
    plugins: Vec<sluice_proto::v1::Plugin>,
) -> (sluice_testkit::EchoServer, Dataplane) {
    let echo = sluice_testkit::EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    dp.store
        .apply(
            snapshot(
                1,
                vec![
                    route_with("default/r/p", &["/*"], "u", plugins),
                    route("default/r/free", &["/free"], "u"),
                ],
                vec![upstream("u", &[(echo.addr, 1)])],
            ),
            vec![],
        )
        .unwrap();
    (echo, dp)
}

/// Sends a bodiless `method` request for `path` with Host `example.com` and `headers`.
pub async fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "example.com");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(addr, b.body(Full::new(Bytes::new())).unwrap()).await
}

/// A response header as text.
pub fn h<'a>(r: &'a Resp, name: &str) -> Option<&'a str> {
    r.headers.get(name).map(|v| v.to_str().unwrap())
}

// Shared by the failover tests of the h2, TLS and WebSocket suites.

/// An address on which nothing listens (a port bound and released at once).
pub fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A passive-only health check: one connect failure or timeout ejects an endpoint, one 200
/// brings it back.
pub fn passive_check() -> v1::UpstreamHealthCheck {
    v1::UpstreamHealthCheck {
        active: None,
        passive: Some(v1::UpstreamPassiveCheck {
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
        }),
    }
}

/// The value of `name` in the dataplane's metrics for the series carrying every label of
/// `labels` (`key="value"` strings).
pub fn metric_of(dp: &Dataplane, name: &str, labels: &[&str]) -> Option<f64> {
    dp.store
        .metrics()
        .render()
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `sluice_upstream_endpoint_healthy` of `endpoint` in `upstream`.
pub fn health_of(dp: &Dataplane, upstream: &str, endpoint: SocketAddr) -> Option<f64> {
    metric_of(
        dp,
        "sluice_upstream_endpoint_healthy",
        &[
            &format!("upstream=\"{upstream}\""),
            &format!("endpoint=\"{endpoint}\""),
        ],
    )
}

/// A dataplane with `routes` (all to upstream `u`) and `consumers`, in front of an echo
/// origin.
pub async fn serve_echo(
    routes: Vec<v1::Route>,
    consumers: Vec<v1::Consumer>,
) -> (Dataplane, sluice_testkit::EchoServer) {
    let echo = sluice_testkit::EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let mut snap = snapshot(1, routes, vec![upstream("u", &[(echo.addr, 1)])]);
    snap.consumers = consumers;
    dp.store.apply(snap, vec![]).unwrap();
    (dp, echo)
}

/// Whether the origin answered (the echo origin answers JSON with the request's path).
pub fn from_origin(r: &Resp) -> bool {
    serde_json::from_slice::<serde_json::Value>(&r.body).is_ok_and(|v| v.get("path").is_some())
}
