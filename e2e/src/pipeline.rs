//! A running Sluice pipeline for e2e tests and measurements: a real kube-apiserver with the
//! CRDs, a namespace with a Service and EndpointSlice for an echo backend in a network
//! namespace, the `sluice-controller` binary — running as the Helm chart's ServiceAccount with
//! exactly the chart's RBAC, electing a leader with a Lease in the pipeline's namespace unless
//! the test passes its own `--leader-elect` flags — and one `sluice-dataplane` binary
//! connected to it over gRPC (plaintext on loopback). With [`Pipeline::start_replicated`]
//! several controller replicas share the Lease behind one address, as the chart's
//! controller Service puts them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{Backend, Cluster, Error, Netns, RELEASE, ServiceProxy, repo_root, workspace_bin};

/// A free loopback port for a process the test is about to start.
///
/// NB: the port comes from 21000-32767, below the kernel's ephemeral range (32768-60999),
/// not from binding port 0: a port handed out by the kernel and released again can be taken
/// by any outgoing connection before the process binds it. `scripts/testcluster.sh` uses
/// 10000-20999, so the two never race for one port.
pub fn free_port() -> Result<SocketAddr, Error> {
    use std::hash::{BuildHasher, Hasher};
    const LOW: u64 = 21_000;
    const SPAN: u64 = 32_768 - LOW;
    let mut last = None;
    for attempt in 0..200u64 {
        // A fresh RandomState per call is seeded differently: enough randomness for ports.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(attempt ^ u64::from(std::process::id()));
        let port = u16::try_from(LOW + h.finish() % SPAN).unwrap_or(21_000);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        match std::net::TcpListener::bind(addr) {
            Ok(_) => return Ok(addr),
            Err(e) => last = Some(e),
        }
    }
    Err(Error::Http {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        why: format!("no free port in 21000-32767: {last:?}"),
    })
}

/// Polls `probe` every 5 ms until it returns `Some`, for at most `limit`.
pub fn eventually<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A controller replica beyond the first, in a pipeline started with
/// [`Pipeline::start_replicated`].
#[derive(Debug)]
pub struct Replica {
    /// Its identity in the Lease, `e2e-controller-N`.
    pub identity: String,
    /// The process (`None` once killed).
    pub process: Option<Backend>,
    /// Its gRPC address (an endpoint of [`Pipeline::controller_service`]).
    pub grpc: SocketAddr,
    /// Its metrics address (`/metrics`).
    pub metrics: SocketAddr,
}

/// The pieces of a running pipeline; everything stops when it is dropped.
pub struct Pipeline {
    /// The API server (with the CRDs Established).
    pub cluster: Cluster,
    /// The namespace holding the test objects.
    pub namespace: String,
    /// The backends' network namespace.
    pub net: Netns,
    /// The echo backend (`e2e-echo`) at `net.addr():8080`, behind Service `echo` port 80.
    pub echo: Backend,
    /// The controller process.
    pub controller: Option<Backend>,
    /// The controller's gRPC address.
    pub grpc: SocketAddr,
    /// The controller's metrics address (`/metrics`).
    pub metrics: SocketAddr,
    /// The kubeconfig the controller runs with: the chart's controller ServiceAccount in
    /// `namespace`, bound by the chart's ClusterRole/Role (see
    /// [`Cluster::chart_controller_kubeconfig`]). Its default namespace is `namespace`.
    pub controller_kubeconfig: PathBuf,
    /// The controller's extra flags, kept for restarts.
    controller_args: Vec<String>,
    /// The controller's identity in the Lease (`e2e-controller-0` unless the test's own
    /// flags name another).
    pub controller_identity: String,
    /// The Lease the controllers elect a leader with (`sluice-controller` in `namespace`
    /// unless the test's own flags name another).
    pub lease_name: String,
    /// The other controller replicas (`e2e-controller-1`, ...); empty unless started with
    /// [`Pipeline::start_replicated`].
    pub replicas: Vec<Replica>,
    /// With several replicas: the one address the dataplane dials, spreading connections
    /// over every replica's gRPC port as the chart's controller Service does.
    pub controller_service: Option<ServiceProxy>,
    /// The dataplane process.
    pub dataplane: Option<Backend>,
    /// The dataplane's HTTP listener.
    pub http: SocketAddr,
    /// The dataplane's HTTPS listener.
    pub https: SocketAddr,
    /// The dataplane's state directory (persisted snapshot).
    pub state_dir: PathBuf,
}

impl Pipeline {
    /// Starts everything and waits until each process listens.
    pub fn start() -> Result<Pipeline, Error> {
        Self::start_with(&[])
    }

    /// Like [`Pipeline::start`], with extra flags for the controller (e.g. leader election).
    /// Without `--leader-elect` among them the controller elects itself leader with Lease
    /// `sluice-controller` in the pipeline's namespace, as the chart runs it.
    pub fn start_with(controller_args: &[&str]) -> Result<Pipeline, Error> {
        Self::start_inner(controller_args, 1)
    }

    /// Like [`Pipeline::start`] with `replicas` controllers (`e2e-controller-0`, ...) that
    /// elect a leader with one Lease, as the chart runs `controller.replicas` with
    /// `leaderElection`. The dataplane dials one address, [`Pipeline::controller_service`],
    /// which spreads connections over all replicas as the chart's controller Service does;
    /// only the leader accepts a stream, so the dataplane redials until it reaches it.
    pub fn start_replicated(replicas: usize) -> Result<Pipeline, Error> {
        Self::start_inner(&[], replicas.max(1))
    }

    fn start_inner(controller_args: &[&str], replicas: usize) -> Result<Pipeline, Error> {
        let cluster = Cluster::try_start()?;
        let crds = repo_root().join("crds/apisix-crds.yaml");
        cluster.kubectl_ok(&["apply", "--server-side", "-f", &crds.to_string_lossy()])?;
        cluster.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/apisixroutes.apisix.apache.org",
        ])?;
        let namespace = cluster.create_namespace("pipeline")?;
        let net = Netns::try_create()?;
        let echo = net.spawn_echo("e2e-echo", net.addr(), 8080)?;
        cluster.apply(&format!(
            r#"apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: {namespace}}}
spec:
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-1
  namespace: {namespace}
  labels: {{kubernetes.io/service-name: echo}}
addressType: IPv4
endpoints:
  - addresses: ["{addr}"]
    conditions: {{ready: true}}
ports: [{{name: http, port: 8080}}]
"#,
            addr = net.addr()
        ))?;
        // NB: the controller runs with exactly the chart's RBAC, so a right missing from
        // charts/sluice/templates/rbac.yaml fails these tests.
        let controller_kubeconfig = cluster.chart_controller_kubeconfig(&namespace)?;
        let default_lease = format!("{RELEASE}-controller");
        let mut controller_args: Vec<&str> = controller_args.to_vec();
        if !controller_args.contains(&"--leader-elect") {
            controller_args.extend([
                "--leader-elect",
                "--lease-name",
                &default_lease,
                "--identity",
                "e2e-controller-0",
            ]);
        }
        let flag = |name: &str| {
            controller_args
                .iter()
                .position(|a| *a == name)
                .and_then(|i| controller_args.get(i + 1))
                .map(|v| (*v).to_owned())
        };
        let controller_identity = flag("--identity").unwrap_or_default();
        let lease_name = flag("--lease-name").unwrap_or_else(|| "sluice-controller".to_owned());
        let grpc = free_port()?;
        let metrics = free_port()?;
        let controller = spawn_controller(&controller_kubeconfig, grpc, metrics, &controller_args)?;
        let mut others = Vec::new();
        for n in 1..replicas {
            let identity = format!("e2e-controller-{n}");
            let mut args = controller_args.clone();
            if let Some(i) = args.iter().position(|a| *a == "--identity") {
                args.drain(i..(i + 2).min(args.len()));
            }
            args.extend(["--identity", &identity]);
            let (grpc, metrics) = (free_port()?, free_port()?);
            let process = spawn_controller(&controller_kubeconfig, grpc, metrics, &args)?;
            others.push(Replica {
                identity,
                process: Some(process),
                grpc,
                metrics,
            });
        }
        let controller_service = if others.is_empty() {
            None
        } else {
            let endpoints: Vec<SocketAddr> = std::iter::once(grpc)
                .chain(others.iter().map(|r| r.grpc))
                .collect();
            Some(ServiceProxy::start(&endpoints)?)
        };
        let controller_url = match &controller_service {
            Some(service) => format!("http://{}", service.addr()),
            None => format!("http://{grpc}"),
        };
        let state_dir = cluster.dir().join("dataplane-state");
        std::fs::create_dir_all(&state_dir).map_err(|e| Error::Http {
            addr: grpc,
            why: e.to_string(),
        })?;
        let http = free_port()?;
        let https = free_port()?;
        let dataplane = spawn_dataplane_https(&controller_url, &state_dir, http, https)?;
        Ok(Pipeline {
            cluster,
            namespace,
            net,
            echo,
            controller: Some(controller),
            grpc,
            metrics,
            controller_kubeconfig,
            controller_args: controller_args.iter().map(|s| s.to_string()).collect(),
            controller_identity,
            lease_name,
            replicas: others,
            controller_service,
            dataplane: Some(dataplane),
            http,
            https,
            state_dir,
        })
    }

    /// Stops the controller (if running) and starts a new one on the same ports.
    pub fn restart_controller(&mut self) -> Result<(), Error> {
        self.controller = None;
        let args: Vec<&str> = self.controller_args.iter().map(String::as_str).collect();
        self.controller = Some(spawn_controller(
            &self.controller_kubeconfig,
            self.grpc,
            self.metrics,
            &args,
        )?);
        Ok(())
    }

    /// Stops the dataplane and starts a new one (same controller and state directory) on a
    /// new port, which becomes `self.http`.
    pub fn restart_dataplane(&mut self) -> Result<(), Error> {
        self.dataplane = None;
        self.http = free_port()?;
        self.https = free_port()?;
        let url = self.controller_url();
        self.dataplane = Some(spawn_dataplane_https(
            &url,
            &self.state_dir,
            self.http,
            self.https,
        )?);
        Ok(())
    }

    /// The URL the dataplane dials: the controller Service with several replicas, else the
    /// controller's gRPC address.
    pub fn controller_url(&self) -> String {
        match &self.controller_service {
            Some(service) => format!("http://{}", service.addr()),
            None => format!("http://{}", self.grpc),
        }
    }

    /// The `holderIdentity` of the controllers' Lease, as `kubectl get lease` shows it;
    /// `None` while there is no Lease, no holder, or no answer from the API server.
    pub fn lease_holder(&self) -> Option<String> {
        let out = self
            .cluster
            .kubectl(&[
                "get",
                "lease",
                &self.lease_name,
                "-n",
                &self.namespace,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ])
            .ok()?;
        let holder = out.stdout.trim();
        (out.success && !holder.is_empty()).then(|| holder.to_owned())
    }

    /// SIGKILLs the controller replica whose Lease identity is `identity` (no graceful
    /// shutdown, so it does not release the Lease). Returns whether such a replica ran.
    pub fn kill_controller(&mut self, identity: &str) -> bool {
        if identity == self.controller_identity {
            return self.controller.take().is_some();
        }
        self.replicas
            .iter_mut()
            .find(|r| r.identity == identity)
            .and_then(|r| r.process.take())
            .is_some()
    }

    /// An ApisixRoute `name` (class `apisix`) for host `demo.e2e` and `path` to Service `echo`.
    pub fn route_yaml(&self, name: &str, path: &str) -> String {
        format!(
            r#"apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: {name}, namespace: {ns}}}
spec:
  ingressClassName: apisix
  http:
    - name: r1
      match:
        hosts: [demo.e2e]
        paths: ["{path}"]
      backends:
        - serviceName: echo
          servicePort: 80
"#,
            ns = self.namespace
        )
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // NB: the clients of the API server go first. With a controller's watches still
        // open, kube-apiserver ignores SIGTERM until `testcluster.sh stop` gives up after
        // 10 s and kills it; without them it exits at once.
        self.dataplane = None;
        self.controller = None;
        self.replicas.clear();
        self.controller_service = None;
    }
}

/// Starts a `sluice-controller` (plaintext gRPC on loopback) with `kubeconfig` (e.g. a
/// pipeline's [`Pipeline::controller_kubeconfig`], the chart's RBAC) and `extra` flags, and
/// waits until it listens on `grpc`.
pub fn spawn_controller(
    kubeconfig: &Path,
    grpc: SocketAddr,
    metrics: SocketAddr,
    extra: &[&str],
) -> Result<Backend, Error> {
    let mut cmd = Command::new(workspace_bin("sluice-controller", "sluice-controller")?);
    cmd.arg("--kubeconfig").arg(kubeconfig).args([
        "--insecure",
        "--grpc-listen",
        &grpc.to_string(),
        "--metrics-listen",
        &metrics.to_string(),
    ]);
    cmd.args(extra);
    Backend::spawn(cmd, grpc, Duration::from_secs(30))
}

/// Starts a `sluice-dataplane` dialing `controllers` (one URL, or several separated by
/// commas), persisting to `state`, serving HTTP on `http`; waits until its admin listener
/// is up.
pub fn spawn_dataplane(
    controllers: &str,
    state: &Path,
    http: SocketAddr,
) -> Result<Backend, Error> {
    spawn_dataplane_https(controllers, state, http, free_port()?)
}

/// Like [`spawn_dataplane`], with the HTTPS listener on `https`.
pub fn spawn_dataplane_https(
    controllers: &str,
    state: &Path,
    http: SocketAddr,
    https: SocketAddr,
) -> Result<Backend, Error> {
    spawn_dataplane_with(controllers, state, http, https, &[])
}

/// Like [`spawn_dataplane_https`], with `extra` flags (e.g. `--plugins`).
pub fn spawn_dataplane_with(
    controllers: &str,
    state: &Path,
    http: SocketAddr,
    https: SocketAddr,
    extra: &[&str],
) -> Result<Backend, Error> {
    let admin = free_port()?;
    let mut cmd = Command::new(workspace_bin("sluice-dataplane", "sluice-dataplane")?);
    cmd.args(["--controller", controllers, "--insecure", "--workers", "1"])
        .arg("--state-dir")
        .arg(state)
        .args([
            "--listen-http",
            &http.to_string(),
            "--listen-https",
            &https.to_string(),
            "--admin",
            &admin.to_string(),
        ])
        .args(extra);
    Backend::spawn(cmd, admin, Duration::from_secs(30))
}
