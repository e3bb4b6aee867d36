//! In-process harness: a controller gRPC server on a loopback port and real dataplane
//! clients (`sluice_dataplane::config::controller_client`) talking to it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_controller::grpc::{self, Hub, Published};
use sluice_controller::metrics::Metrics;
use sluice_dataplane::config::controller_client::{self, Backoff, ClientConfig, ClientTls};
use sluice_dataplane::config::store::Store;
use sluice_proto::v1;
pub use sluice_testkit::eventually;
use sluice_testkit::pki::Ca;
use tokio::sync::oneshot;
use tonic::transport::ServerTlsConfig;

/// A controller gRPC server; stops when dropped or with [`Controller::stop`].
pub struct Controller {
    pub addr: SocketAddr,
    pub hub: Arc<Hub>,
    pub metrics: Metrics,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Controller {
    pub async fn start(tls: Option<ServerTlsConfig>) -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap(), tls).await
    }

    pub async fn start_on(addr: SocketAddr, tls: Option<ServerTlsConfig>) -> Self {
        let metrics = Metrics::new().unwrap();
        let hub = Hub::new(metrics.clone());
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(grpc::serve(Arc::clone(&hub), listener, tls, async move {
            let _ = stopped.await;
        }));
        let task = tokio::spawn(async move {
            task.await.unwrap().unwrap();
        });
        Self {
            addr,
            hub,
            metrics,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the server and waits until its port is closed.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .expect("graceful shutdown ends the snapshot streams")
                .unwrap();
        }
    }

    pub fn publish(&self, version: u64, snapshot: v1::Snapshot) {
        self.hub.publish(Published {
            snapshot: sluice_proto::seal(snapshot, version),
            rejected_objects: Vec::new(),
        });
    }

    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://{}", self.addr)
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A dataplane store fed by the real controller client.
pub struct Dataplane {
    pub store: Arc<Store>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn client_config(
    url: String,
    id: &str,
    tls: Option<ClientTls>,
    state_dir: Option<PathBuf>,
) -> ClientConfig {
    ClientConfig {
        url,
        tls,
        dataplane_id: id.into(),
        state_dir,
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
        },
    }
}

pub fn dataplane(config: ClientConfig) -> Dataplane {
    dataplane_with_store(config, Arc::new(Store::new().unwrap()))
}

pub fn dataplane_with_store(config: ClientConfig, store: Arc<Store>) -> Dataplane {
    config.validate().unwrap();
    let task = tokio::spawn(controller_client::run(config, Arc::clone(&store), || {}));
    Dataplane { store, task }
}

/// How long a test waits for the channel to converge.
pub const WAIT: Duration = Duration::from_secs(10);

/// A snapshot with one route `/a` to upstream `upstream`, and one upstream `default/svc:80`.
pub fn snapshot(path: &str, upstream: &str) -> v1::Snapshot {
    v1::Snapshot {
        routes: vec![v1::Route {
            id: "default/r/rule1".into(),
            paths: vec![path.into()],
            backends: vec![v1::Backend {
                upstream_id: upstream.into(),
                weight: 100,
                plugins: Vec::new(),
            }],
            ..Default::default()
        }],
        upstreams: vec![v1::Upstream {
            id: "default/svc:80".into(),
            endpoints: vec![v1::Endpoint {
                host: "127.0.0.1".into(),
                port: 1,
                weight: 1,
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// A CA plus server and client certificates, as PEM.
pub struct Pki {
    pub ca: String,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
}

pub fn make_pki() -> Pki {
    let ca = Ca::new("sluice test CA");
    let server = ca.leaf(&["localhost", "sluice-controller"]);
    let client = ca.leaf(&["dataplane-0"]);
    Pki {
        ca: ca.pem.clone(),
        server_cert: server.pem,
        server_key: server.key_pem,
        client_cert: client.pem,
        client_key: client.key_pem,
    }
}
