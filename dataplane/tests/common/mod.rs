//! The dataplane's in-process harness: a dataplane serving on a loopback port, its admin
//! endpoints, its metrics. Everything not tied to the dataplane's types (waiting, metric
//! parsing, origins, PKI, the HTTP client, snapshot builders) is `sluice-testkit`'s,
//! re-exported here so a suite needs one `use common::*`.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sluice_dataplane::config::store::Store;
use sluice_dataplane::listener::server::{self, Limits};
use sluice_proto::v1;

pub use sluice_testkit::builders::*;
pub use sluice_testkit::client::*;
pub use sluice_testkit::metrics::{metric, sample};
pub use sluice_testkit::net::{
    any, closed_port, free_port, listening, listening_blocking, refused,
};
pub use sluice_testkit::origin::{Origin, OriginState};
pub use sluice_testkit::{EchoServer, Wait, eventually, eventually_async};

/// The deadline of a wait on a background task (an exporter, a logger): far above any
/// expected delay.
pub const LONG_WAIT: Duration = Duration::from_secs(30);

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

/// The value of `name` in the dataplane's metrics for the series carrying every label of
/// `labels` (`key="value"` strings).
pub fn metric_of(dp: &Dataplane, name: &str, labels: &[&str]) -> Option<f64> {
    metric(&dp.store.metrics().render(), name, labels)
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
