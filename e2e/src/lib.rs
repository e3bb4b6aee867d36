//! End-to-end test support: a real Kubernetes control plane, network namespaces for backends,
//! and the workspace's binaries.
//!
//! - [`Cluster`]: etcd + kube-apiserver on loopback ports (started by
//!   `scripts/cluster/testcluster.sh`), an admin kubeconfig, a [`Cluster::kubectl`] helper and
//!   ServiceAccount kubeconfigs for RBAC-bound clients. Stopped and deleted on drop; a watchdog
//!   also cleans up when the test process dies without running destructors.
//! - [`Netns`]: a network namespace joined to the root namespace by a veth pair with
//!   private-range addresses, because the API server rejects loopback addresses in
//!   EndpointSlices. Backends run inside it ([`Netns::spawn_echo`]) and are reached from the
//!   root namespace at [`Netns::addr`]. Deleted on drop.
//! - [`helm`], [`render_chart`], [`Cluster::helm`]: the Helm chart, rendered and installed with
//!   the helm that `scripts/install/helm.sh` builds; [`Cluster::chart_controller_kubeconfig`]
//!   gives a client with exactly the chart's controller RBAC.
//! - Faults: [`Cluster::kill`] and [`Cluster::start_again`] SIGKILL and restart etcd or
//!   kube-apiserver with the same data, ports and certificates; [`Pipeline::start_replicated`]
//!   runs several controllers behind one [`ServiceProxy`], [`Pipeline::start_fleet`] several
//!   dataplanes as well, each with a path to the controllers that can be cut; a [`Load`] keeps requests flowing
//!   over keep-alive connections ([`HttpConnection`]) and counts every failure.
//! - [`HttpRecorder`]: a loopback HTTP server that records requests and answers as the test
//!   says (an authorization service, OpenID provider, log receiver or mirror host).
//! - [`workspace_bin`]: builds (if stale) and locates a binary of another workspace crate,
//!   e.g. `sluice-echo`, `sluice-dataplane` or `sluice-controller`.
//! - [`eventually`] (with [`Wait`] for a slower pace) and [`metric`]: `sluice-testkit`'s
//!   waiting and metrics parsing, for these blocking tests.
//!
//! Tiers: every test in `tests/` is the system tier, built only with the `system` feature
//! (`scripts/test.sh` turns it on), so `cargo test --workspace` passes without root or
//! cluster binaries; `tier.rs` checks that no test file escapes the gate.
//!
//! The cluster binaries are installed by `scripts/cluster/testcluster.sh install` (which
//! `scripts/test.sh` runs); a missing binary is a test failure that names that command.

#![forbid(unsafe_code)]

mod bins;
mod cluster;
mod error;
mod helm;
mod http;
mod load;
mod netns;
mod pipeline;
mod process;
mod recorder;
mod service;
#[cfg(test)]
mod tier;

pub use bins::workspace_bin;
pub use cluster::{Cluster, Component, KubectlOutput, SERVICE_CIDR, kubectl_path};
pub use error::Error;
pub use helm::{
    HelmOutput, RELEASE, chart_dir, helm, helm_command, helm_ok, helm_path, render_chart,
    render_release,
};
pub use http::{HttpConnection, HttpResponse, http_get, http_get_with, http_request, metric};
pub use load::{Failure, Load, LoadReport};
pub use netns::{Backend, Netns, SUBNET_POOL};
pub use pipeline::{
    DATAPLANE_SERVICE, FleetDataplane, GATEWAY_API_CRDS, Pipeline, Replica, eventually, free_port,
    install_gateway_api_crds, spawn_controller, spawn_dataplane, spawn_dataplane_https,
    spawn_dataplane_with,
};
pub use recorder::{HttpRecorder, Recorded, Reply};
pub use service::ServiceProxy;
pub use sluice_testkit::Wait;

/// The repository root: the nearest ancestor of the running test's package (cargo sets
/// `CARGO_MANIFEST_DIR` at run time) or of the working directory that holds `Cargo.lock`.
///
/// NB: not `env!("CARGO_MANIFEST_DIR")` alone: a build cache shared between clones (CI keeps
/// the target directory outside the clone) would bake in the path of whichever clone built
/// this crate first.
pub fn repo_root() -> std::path::PathBuf {
    let starts = [
        std::env::var_os("CARGO_MANIFEST_DIR").map(std::path::PathBuf::from),
        std::env::current_dir().ok(),
    ];
    for start in starts.into_iter().flatten() {
        if let Some(root) = start.ancestors().find(|d| d.join("Cargo.lock").is_file()) {
            return root.to_path_buf();
        }
    }
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}
