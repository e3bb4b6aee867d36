//! A running Sluice pipeline for e2e tests and measurements: a real kube-apiserver with the
//! CRDs, a namespace with a Service and EndpointSlice for an echo backend in a network
//! namespace, the `sluice-controller` binary — running as the Helm chart's ServiceAccount with
//! exactly the chart's RBAC, electing a leader with a Lease in the pipeline's namespace unless
//! the test passes its own `--leader-elect` flags — and one `sluice-dataplane` binary
//! connected to it over gRPC (plaintext on loopback). With [`Pipeline::start_replicated`]
//! several controller replicas share the Lease behind one address, as the chart's
//! controller Service puts them. With [`Pipeline::start_fleet`] several dataplanes run as
//! well, each with an id like a pod name, listed in the EndpointSlice of a dataplane Service
//! that the controllers count `Programmed` against (`--dataplane-service`).
//!
//! What is real and what stands in, with a fleet: the API server, the chart's RBAC, the
//! controller and dataplane processes, the Lease and the replicas' records are real. The
//! dataplanes are processes, not pods: the test writes the dataplane Service and its
//! EndpointSlice itself, as the EndpointSlice controller would write them for the chart's
//! dataplane pods (one endpoint per pod: a made-up address from TEST-NET-1, nothing ever
//! connects to it, `conditions.ready`, and `targetRef` naming the pod, which is the id
//! each dataplane process is given with `--dataplane-id`, as the chart gives the pod name).
//! Each dataplane dials the controllers through a [`ServiceProxy`] of its own, standing in
//! for kube-proxy on its node, so a test can cut one dataplane off every controller.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{Backend, Cluster, Error, Netns, RELEASE, ServiceProxy, repo_root, workspace_bin};

/// The Gateway API CRDs Sluice reads, as named in the API server; their files are
/// `crds/gateway-api/<name>.yaml`.
pub const GATEWAY_API_CRDS: &[&str] = &[
    "gatewayclasses.gateway.networking.k8s.io",
    "gateways.gateway.networking.k8s.io",
    "listenersets.gateway.networking.k8s.io",
    "httproutes.gateway.networking.k8s.io",
    "grpcroutes.gateway.networking.k8s.io",
    "referencegrants.gateway.networking.k8s.io",
    "backendtlspolicies.gateway.networking.k8s.io",
];

/// Installs the vendored Gateway API CRDs (standard channel, `crds/gateway-api/`) that Sluice
/// reads into `cluster` and waits until they are Established.
pub fn install_gateway_api_crds(cluster: &Cluster) -> Result<(), Error> {
    let dir = repo_root().join("crds/gateway-api");
    for name in GATEWAY_API_CRDS {
        let (plural, group) = name.split_once('.').unwrap_or((name, ""));
        let file = dir.join(format!("{group}_{plural}.yaml"));
        cluster.kubectl_ok(&["apply", "--server-side", "-f", &file.to_string_lossy()])?;
    }
    let mut args = vec!["wait", "--for=condition=Established", "--timeout=60s"];
    let crds: Vec<String> = GATEWAY_API_CRDS
        .iter()
        .map(|n| format!("crd/{n}"))
        .collect();
    args.extend(crds.iter().map(String::as_str));
    cluster.kubectl_ok(&args)?;
    Ok(())
}

/// A free loopback port for a process the test is about to start: the kit's
/// [`sluice_testkit::net::try_free_port`] (from 21000-32767, below the kernel's ephemeral
/// range and above `scripts/cluster/testcluster.sh`'s ports).
pub fn free_port() -> Result<SocketAddr, Error> {
    sluice_testkit::net::try_free_port().map_err(|e| Error::Http {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        why: e.to_string(),
    })
}

/// Polls `probe` until it is settled (`true`, `Some`, `Ok`), for at most `limit`: the kit's
/// [`sluice_testkit::eventually_blocking`], under the name the system tests use.
pub use sluice_testkit::eventually_blocking as eventually;

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

/// The dataplane Service of a fleet ([`Pipeline::start_fleet`]): the chart's
/// `<release>-dataplane`.
pub const DATAPLANE_SERVICE: &str = "sluice-dataplane";

/// One dataplane of a fleet ([`Pipeline::start_fleet`], [`Pipeline::add_fleet_dataplane`]).
#[derive(Debug)]
pub struct FleetDataplane {
    /// Its `--dataplane-id`, as a pod name: `sluice-dataplane-N` unless given.
    pub id: String,
    /// The process (`None` once stopped).
    pub process: Option<Backend>,
    /// Its HTTP listener.
    pub http: SocketAddr,
    /// Its HTTPS listener.
    pub https: SocketAddr,
    /// Its admin listener (`/snapshot`, `/readyz`).
    pub admin: SocketAddr,
    /// Its state directory.
    pub state_dir: PathBuf,
    /// Its own path to every controller replica (kube-proxy on its node): cut it to
    /// partition this dataplane from the controllers.
    pub link: ServiceProxy,
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
    /// The dataplanes of a fleet ([`Pipeline::start_fleet`]); empty otherwise.
    pub fleet: Vec<FleetDataplane>,
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
        Self::start_inner(controller_args, 1, 0, false)
    }

    /// Like [`Pipeline::start_with`], with the vendored Gateway API CRDs
    /// (`crds/gateway-api/`, standard channel) installed and Established before the
    /// controller starts, so it watches the Gateway API from the start.
    pub fn start_with_gateway_api(controller_args: &[&str]) -> Result<Pipeline, Error> {
        Self::start_inner(controller_args, 1, 0, true)
    }

    /// Like [`Pipeline::start_with_gateway_api`], with one ClusterIP Service per Gateway in
    /// the test's namespace (selecting the dataplane) and per-Gateway dataplane ports from
    /// `ports` (`FIRST-LAST`). Give each test its own range below both the tests' port
    /// picker (21000-32767) and the kernel's ephemeral range (32768-60999): a port from
    /// either may be held by another test's socket.
    pub fn start_with_gateway_services(ports: &str) -> Result<Pipeline, Error> {
        Self::start_with_gateway_services_and(ports, &[])
    }

    /// Like [`Pipeline::start_with_gateway_services`], with more controller flags.
    pub fn start_with_gateway_services_and(ports: &str, extra: &[&str]) -> Result<Pipeline, Error> {
        let mut args = vec![
            "--gateway-service-namespace",
            "{namespace}",
            "--gateway-service-selector",
            "app.kubernetes.io/component=dataplane",
            "--gateway-service-type",
            "ClusterIP",
            "--gateway-listener-ports",
            ports,
        ];
        args.extend_from_slice(extra);
        Self::start_with_gateway_api(&args)
    }

    /// Like [`Pipeline::start_replicated`] with `dataplanes` dataplanes
    /// (`sluice-dataplane-0`, ...) in [`Pipeline::fleet`] instead of the one
    /// [`Pipeline::dataplane`] (`None` here; [`Pipeline::http`] is the first fleet
    /// dataplane's). The controllers run with `--dataplane-service NS/`[`DATAPLANE_SERVICE`],
    /// whose EndpointSlice lists every fleet dataplane as ready (see the module doc for what
    /// stands in for pods); change it with [`Pipeline::set_expected_dataplanes`].
    pub fn start_fleet(controllers: usize, dataplanes: usize) -> Result<Pipeline, Error> {
        Self::start_inner(&[], controllers.max(1), dataplanes.max(1), false)
    }

    /// Like [`Pipeline::start`] with `replicas` controllers (`e2e-controller-0`, ...) that
    /// elect a leader with one Lease, as the chart runs `controller.replicas` with
    /// `leaderElection`. The dataplane dials one address, [`Pipeline::controller_service`],
    /// which spreads connections over all replicas as the chart's controller Service does;
    /// every replica that has built a snapshot accepts the stream, leader or not.
    pub fn start_replicated(replicas: usize) -> Result<Pipeline, Error> {
        Self::start_inner(&[], replicas.max(1), 0, false)
    }

    fn start_inner(
        controller_args: &[&str],
        replicas: usize,
        fleet: usize,
        gateway_api: bool,
    ) -> Result<Pipeline, Error> {
        let cluster = Cluster::try_start()?;
        let crds = repo_root().join("crds/apisix-crds.yaml");
        cluster.kubectl_ok(&["apply", "--server-side", "-f", &crds.to_string_lossy()])?;
        cluster.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/apisixroutes.apisix.apache.org",
        ])?;
        if gateway_api {
            install_gateway_api_crds(&cluster)?;
        }
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
        let default_lease = format!("{RELEASE}-controller");
        // `{namespace}` in a flag stands for the pipeline's namespace (the release's).
        let substituted: Vec<String> = controller_args
            .iter()
            .map(|a| a.replace("{namespace}", &namespace))
            .collect();
        // NB: Gateway Services in the Gateways' namespaces take the chart's wider rights,
        // rendered for a release of this pipeline's own (its ClusterRole is not the one the
        // other pipelines share).
        let placed = substituted
            .windows(2)
            .any(|w| w[0] == "--gateway-service-placement" && w[1] == "gateway");
        let controller_kubeconfig = if placed {
            cluster.chart_controller_kubeconfig_with(
                &namespace,
                &namespace,
                &["--set", "controller.gatewayServices.placement=gateway"],
            )?
        } else {
            cluster.chart_controller_kubeconfig(&namespace)?
        };
        let mut controller_args: Vec<&str> = substituted.iter().map(String::as_str).collect();
        if !controller_args.contains(&"--leader-elect") {
            controller_args.extend([
                "--leader-elect",
                "--lease-name",
                &default_lease,
                "--identity",
                "e2e-controller-0",
            ]);
        }
        let dataplane_service = format!("{namespace}/{DATAPLANE_SERVICE}");
        if fleet > 0 {
            controller_args.extend(["--dataplane-service", &dataplane_service]);
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
        let (mut http, mut https) = (free_port()?, free_port()?);
        let dataplane = if fleet == 0 {
            Some(spawn_dataplane_https(
                &controller_url,
                &state_dir,
                http,
                https,
            )?)
        } else {
            None
        };
        let mut p = Pipeline {
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
            dataplane,
            http,
            https,
            state_dir,
            fleet: Vec::new(),
        };
        if fleet > 0 {
            let ids: Vec<String> = (0..fleet)
                .map(|i| format!("{DATAPLANE_SERVICE}-{i}"))
                .collect();
            let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            p.set_expected_dataplanes(&refs)?;
            for id in &ids {
                p.add_fleet_dataplane(id, &[])?;
            }
            (http, https) = (p.fleet[0].http, p.fleet[0].https);
            (p.http, p.https) = (http, https);
        }
        Ok(p)
    }

    /// Whether the Gateway API CRDs are installed in the pipeline's API server.
    pub fn has_gateway_api(&self) -> bool {
        self.cluster
            .kubectl(&["get", "crd", GATEWAY_API_CRDS[0]])
            .is_ok_and(|o| o.success)
    }

    /// Every controller replica's gRPC address (the endpoints of the controller Service).
    pub fn controller_endpoints(&self) -> Vec<SocketAddr> {
        std::iter::once(self.grpc)
            .chain(self.replicas.iter().map(|r| r.grpc))
            .collect()
    }

    /// Starts a dataplane with `--dataplane-id id` (and `extra` flags, e.g. `--plugins`)
    /// that dials every controller replica through a [`ServiceProxy`] of its own, and adds it
    /// to [`Pipeline::fleet`]. It is not expected to serve until it is listed with
    /// [`Pipeline::set_expected_dataplanes`]. Returns its index in the fleet.
    pub fn add_fleet_dataplane(&mut self, id: &str, extra: &[&str]) -> Result<usize, Error> {
        // NB: each dataplane's path starts at another replica, as kube-proxy on different
        // nodes spreads dataplanes over the replicas.
        let mut endpoints = self.controller_endpoints();
        let first = self.fleet.len() % endpoints.len().max(1);
        endpoints.rotate_left(first);
        let link = ServiceProxy::start(&endpoints)?;
        let state_dir = self.cluster.dir().join(format!("state-{id}"));
        std::fs::create_dir_all(&state_dir)
            .map_err(|e| Error::io(format!("creating {}", state_dir.display()), e))?;
        let (http, https) = (free_port()?, free_port()?);
        let mut args = vec!["--dataplane-id", id];
        args.extend_from_slice(extra);
        let process = spawn_dataplane_with(
            &format!("http://{}", link.addr()),
            &state_dir,
            http,
            https,
            &args,
        )?;
        self.fleet.push(FleetDataplane {
            id: id.to_owned(),
            admin: process.addr(),
            process: Some(process),
            http,
            https,
            state_dir,
            link,
        });
        Ok(self.fleet.len() - 1)
    }

    /// Writes the dataplane Service [`DATAPLANE_SERVICE`] and its EndpointSlice with one
    /// ready endpoint per id, as the EndpointSlice controller does for the ready pods of the
    /// chart's dataplane Deployment: these are the dataplanes that should serve.
    pub fn set_expected_dataplanes(&self, ids: &[&str]) -> Result<(), Error> {
        let endpoints: String = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                format!(
                    "  - addresses: [\"192.0.2.{}\"]\n    conditions: {{ready: true, serving: true, terminating: false}}\n    targetRef: {{kind: Pod, name: {id}, namespace: {ns}}}\n",
                    i + 1,
                    ns = self.namespace
                )
            })
            .collect();
        let endpoints = if ids.is_empty() {
            "endpoints: []\n".to_owned()
        } else {
            format!("endpoints:\n{endpoints}")
        };
        self.cluster.apply(&format!(
            r#"apiVersion: v1
kind: Service
metadata: {{name: {svc}, namespace: {ns}}}
spec:
  ports: [{{name: http, port: 80, targetPort: 9080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {svc}-pods
  namespace: {ns}
  labels:
    kubernetes.io/service-name: {svc}
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
addressType: IPv4
ports: [{{name: http, port: 9080}}]
{endpoints}"#,
            svc = DATAPLANE_SERVICE,
            ns = self.namespace,
        ))?;
        Ok(())
    }

    /// Starts the controller replica `identity` again after [`Pipeline::kill_controller`],
    /// with its flags and ports. Returns whether such a replica exists.
    pub fn restart_controller_replica(&mut self, identity: &str) -> Result<bool, Error> {
        if identity == self.controller_identity {
            self.restart_controller()?;
            return Ok(true);
        }
        let Some(i) = self.replicas.iter().position(|r| r.identity == identity) else {
            return Ok(false);
        };
        let mut args: Vec<String> = self.controller_args.clone();
        if let Some(at) = args.iter().position(|a| a == "--identity") {
            args.drain(at..(at + 2).min(args.len()));
        }
        args.extend(["--identity".to_owned(), identity.to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (grpc, metrics) = (self.replicas[i].grpc, self.replicas[i].metrics);
        self.replicas[i].process = None;
        self.replicas[i].process = Some(spawn_controller(
            &self.controller_kubeconfig,
            grpc,
            metrics,
            &args,
        )?);
        Ok(true)
    }

    /// The metrics address of the controller replica `identity`.
    pub fn controller_metrics(&self, identity: &str) -> Option<SocketAddr> {
        if identity == self.controller_identity {
            return Some(self.metrics);
        }
        self.replicas
            .iter()
            .find(|r| r.identity == identity)
            .map(|r| r.metrics)
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
        self.restart_dataplane_with(&[])
    }

    /// Like [`Pipeline::restart_dataplane`], with `extra` flags for the new dataplane (e.g.
    /// `--plugin-metadata FILE`, read once at start).
    pub fn restart_dataplane_with(&mut self, extra: &[&str]) -> Result<(), Error> {
        self.dataplane = None;
        self.http = free_port()?;
        self.https = free_port()?;
        let url = self.controller_url();
        self.dataplane = Some(spawn_dataplane_with(
            &url,
            &self.state_dir,
            self.http,
            self.https,
            extra,
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
        self.fleet.clear();
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
    // NB: each dataplane gets an id of its own, as each pod has its own name; without one
    // every dataplane of a test would report the host name.
    if !extra.contains(&"--dataplane-id") {
        cmd.args(["--dataplane-id", &format!("e2e-dataplane-{}", http.port())]);
    }
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
