//! The Helm chart (`charts/sluice`) from the tests: `helm` itself (built from the Go module
//! proxy by `scripts/install/helm.sh`), rendering, and the chart's RBAC for the controller.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::process::{check, run_output};
use crate::{Cluster, Error, repo_root};

const INSTALL_HINT: &str = "\n(build helm with: scripts/install/helm.sh)";

/// The release name the harness renders and installs the chart as, unless a test picks one.
pub const RELEASE: &str = "sluice";

/// The helm the harness runs: `$SLUICE_HELM`, else the one `scripts/install/helm.sh` built
/// (`$SLUICE_CACHE/bin/helm`, default `~/.cache/sluice/bin/helm`).
pub fn helm_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_HELM") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("SLUICE_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/sluice")))
        .unwrap_or_else(|| PathBuf::from(".cache/sluice"));
    cache.join("bin/helm")
}

/// The chart's directory, `charts/sluice`.
pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/sluice")
}

/// What a helm run printed and how it exited.
#[derive(Debug, Clone)]
pub struct HelmOutput {
    /// Whether it exited with status 0.
    pub success: bool,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// A helm command with its caches, config and data in `home` (so tests never touch the
/// user's helm settings) and, when given, the cluster's admin kubeconfig.
pub fn helm_command(home: &Path, kubeconfig: Option<&Path>) -> Command {
    let mut cmd = Command::new(helm_path());
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .env_remove("HELM_NAMESPACE")
        .current_dir(repo_root());
    if let Some(kc) = kubeconfig {
        cmd.arg("--kubeconfig").arg(kc);
    }
    cmd
}

/// Runs helm with `args` (no cluster) and returns what it printed, whatever its exit status,
/// so tests can assert refusals. Errs only if helm could not run.
pub fn helm(args: &[&str]) -> Result<HelmOutput, Error> {
    let home = std::env::temp_dir().join(format!("sluice-e2e-helm-{}", std::process::id()));
    let mut cmd = helm_command(&home, None);
    cmd.args(args);
    let out = run_output(&mut cmd, None, INSTALL_HINT)?;
    Ok(HelmOutput {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Runs helm with `args` and returns its stdout; a non-zero exit is an error with its message.
pub fn helm_ok(args: &[&str]) -> Result<String, Error> {
    let home = std::env::temp_dir().join(format!("sluice-e2e-helm-{}", std::process::id()));
    let mut cmd = helm_command(&home, None);
    cmd.args(args);
    let out = run_output(&mut cmd, None, INSTALL_HINT)?;
    check(&cmd, out)
}

/// `helm template RELEASE charts/sluice --namespace NAMESPACE` with `extra` arguments
/// (e.g. `["--show-only", "templates/rbac.yaml"]` or `["-f", "values.yaml"]`), for release
/// [`RELEASE`].
pub fn render_chart(namespace: &str, extra: &[&str]) -> Result<String, Error> {
    render_release(RELEASE, namespace, extra)
}

/// Like [`render_chart`] for another release name (object names start with
/// `RELEASE-sluice-` unless the release name contains `sluice`).
pub fn render_release(release: &str, namespace: &str, extra: &[&str]) -> Result<String, Error> {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        release,
        chart.to_str().unwrap_or("charts/sluice"),
        "--namespace",
        namespace,
    ];
    args.extend_from_slice(extra);
    helm_ok(&args)
}

impl Cluster {
    /// Runs helm against this cluster as the admin (`--kubeconfig`), with helm's own state in
    /// this cluster's directory; returns what it printed whatever its exit status.
    pub fn helm(&self, args: &[&str]) -> Result<HelmOutput, Error> {
        let mut cmd = helm_command(&self.dir().join("helm"), Some(self.kubeconfig()));
        cmd.args(args);
        let out = run_output(&mut cmd, None, INSTALL_HINT)?;
        Ok(HelmOutput {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Like [`Cluster::helm`]; a non-zero exit is an error carrying helm's message.
    pub fn helm_ok(&self, args: &[&str]) -> Result<String, Error> {
        let mut cmd = helm_command(&self.dir().join("helm"), Some(self.kubeconfig()));
        cmd.args(args);
        let out = run_output(&mut cmd, None, INSTALL_HINT)?;
        check(&cmd, out)
    }

    /// Applies the chart's controller RBAC (ServiceAccount, ClusterRole, Role and bindings as
    /// `helm template` renders them for release [`RELEASE`] in `namespace`) and returns a
    /// kubeconfig that authenticates as that ServiceAccount: a client with exactly the
    /// rights the chart grants the controller.
    pub fn chart_controller_kubeconfig(&self, namespace: &str) -> Result<PathBuf, Error> {
        self.chart_controller_kubeconfig_for(RELEASE, namespace)
    }

    /// Like [`Cluster::chart_controller_kubeconfig`] for release `release`, whose
    /// cluster-wide objects (ClusterRole, ClusterRoleBinding) have names of their own, so
    /// several can live in one cluster. The ServiceAccount is `<fullname>-controller`.
    pub fn chart_controller_kubeconfig_for(
        &self,
        release: &str,
        namespace: &str,
    ) -> Result<PathBuf, Error> {
        self.chart_controller_kubeconfig_with(release, namespace, &[])
    }

    /// Like [`Cluster::chart_controller_kubeconfig_for`], the RBAC rendered with more helm
    /// flags (`--set` values that change the controller's rights).
    pub fn chart_controller_kubeconfig_with(
        &self,
        release: &str,
        namespace: &str,
        values: &[&str],
    ) -> Result<PathBuf, Error> {
        let mut args = vec![
            "--show-only",
            "templates/rbac.yaml",
            "--show-only",
            "templates/serviceaccounts.yaml",
        ];
        args.extend_from_slice(values);
        let rbac = render_release(release, namespace, &args)?;
        self.apply(&rbac)?;
        let fullname = if release.contains("sluice") {
            release.to_owned()
        } else {
            format!("{release}-sluice")
        };
        self.service_account_kubeconfig(namespace, &format!("{fullname}-controller"))
    }
}
