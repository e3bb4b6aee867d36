//! A real kube-apiserver + etcd for one test or one test binary.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::Error;
use crate::process::{check, run_ok, run_output};

/// The Service ClusterIP range of the test cluster (`--service-cluster-ip-range`).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";

const INSTALL_HINT: &str =
    "\n(install the test cluster tools with: scripts/cluster/testcluster.sh install)";

/// A running etcd + kube-apiserver on free loopback ports, with an admin kubeconfig.
///
/// Everything lives in a private temporary directory. Dropping the value stops both processes
/// and deletes the directory. If the test process dies without running destructors (a
/// [`Cluster::shared`] cluster never drops, a killed test binary neither), a watchdog started
/// with the cluster does the same once the process is gone.
///
/// There is no kube-controller-manager: deleted namespaces stay `Terminating`, namespaces get no
/// `default` ServiceAccount, Pods never run. Create what a test needs explicitly.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    kubeconfig: PathBuf,
    server: String,
    ca_cert: PathBuf,
    apiserver_pid: u32,
    etcd_pid: u32,
    kube_version: String,
    names: AtomicU32,
    /// Command lines of killed processes, for [`Cluster::start_again`].
    killed: BTreeMap<Component, Vec<OsString>>,
}

/// A process of the test cluster's control plane, for fault tests ([`Cluster::kill`],
/// [`Cluster::start_again`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Component {
    /// etcd, the API server's storage.
    Etcd,
    /// kube-apiserver.
    ApiServer,
}

impl Component {
    /// The program's name, as in its command line, its log file and `cluster.env`.
    fn program(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::ApiServer => "kube-apiserver",
        }
    }

    fn env_key(self) -> &'static str {
        match self {
            Component::Etcd => "ETCD_PID",
            Component::ApiServer => "APISERVER_PID",
        }
    }
}

/// What a kubectl run printed and how it exited.
#[derive(Debug, Clone)]
pub struct KubectlOutput {
    /// Whether it exited with status 0.
    pub success: bool,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

fn script() -> PathBuf {
    crate::repo_root().join("scripts/cluster/testcluster.sh")
}

static DIRS: AtomicU32 = AtomicU32::new(0);

/// Creates a fresh private directory under the system temp dir.
pub(crate) fn unique_temp_dir(prefix: &str) -> Result<PathBuf, Error> {
    let base = std::env::temp_dir();
    loop {
        let n = DIRS.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("{prefix}-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::io(format!("creating {}", dir.display()), e)),
        }
    }
}

fn parse_env(path: &Path) -> Result<BTreeMap<String, String>, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect())
}

fn env_key<'a>(
    env: &'a BTreeMap<String, String>,
    path: &Path,
    key: &'static str,
) -> Result<&'a str, Error> {
    env.get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| Error::ClusterEnv {
            path: path.to_owned(),
            key,
        })
}

fn env_pid(env: &BTreeMap<String, String>, path: &Path, key: &'static str) -> Result<u32, Error> {
    env_key(env, path, key)?
        .parse()
        .map_err(|_| Error::ClusterEnv {
            path: path.to_owned(),
            key,
        })
}

/// The kubectl the harness runs: `$SLUICE_KUBECTL`, else `kubectl` on `PATH`, else the one
/// `scripts/cluster/testcluster.sh install` builds when none is installed.
pub fn kubectl_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_KUBECTL") {
        return PathBuf::from(p);
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join("kubectl");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    let cache = std::env::var_os("SLUICE_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/sluice")))
        .unwrap_or_else(|| PathBuf::from(".cache/sluice"));
    cache.join("bin/kubectl")
}

/// The command line of process `pid`, if it runs.
fn cmdline(pid: u32) -> Option<Vec<OsString>> {
    use std::os::unix::ffi::OsStrExt as _;
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let argv: Vec<OsString> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| std::ffi::OsStr::from_bytes(a).to_owned())
        .collect();
    (!argv.is_empty()).then_some(argv)
}

/// Sets `key=value` in the `KEY=VALUE` file at `path`, replacing the key's old line.
fn set_env_key(path: &Path, key: &str, value: &str) -> Result<(), Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let mut out: String = text
        .lines()
        .filter(|l| l.split_once('=').is_none_or(|(k, _)| k.trim() != key))
        .map(|l| format!("{l}\n"))
        .collect();
    out.push_str(&format!("{key}={value}\n"));
    let tmp = path.with_extension("env.tmp");
    // NB: renamed into place, so the watchdog never sees the file missing.
    std::fs::write(&tmp, out)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// Whether process `pid` is gone or a zombie (nobody may reap the detached processes).
fn dead(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // "pid (comm) S ...": the state follows the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state == "Z" || state == "X")
}

impl Cluster {
    /// Starts a cluster, panicking with the reason (and the command that fixes a missing
    /// binary) if it cannot. For tests; see [`Cluster::try_start`].
    pub fn start() -> Cluster {
        match Cluster::try_start() {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    /// Starts etcd and kube-apiserver with `scripts/cluster/testcluster.sh start` in a fresh temporary
    /// directory and returns once `/readyz` answers `ok` (typically 3–6 s).
    pub fn try_start() -> Result<Cluster, Error> {
        let dir = unique_temp_dir("sluice-e2e-cluster")?;
        match Cluster::start_in(&dir, false) {
            Ok(c) => Ok(c),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// Starts a real one-node cluster (`scripts/cluster/testcluster.sh start DIR --node`): the control
    /// plane plus kube-controller-manager, kube-scheduler, containerd + runc, the kubelet,
    /// kube-proxy, CoreDNS and metrics-server, so Pods run. Needs root and
    /// `scripts/cluster/testcluster.sh install --node`; one such node runs on a host at a time (fixed
    /// addresses), so its users serialise. Returns once the node is Ready and DNS answers.
    pub fn try_start_node() -> Result<Cluster, Error> {
        let dir = unique_temp_dir("sluice-e2e-node")?;
        match Cluster::start_in(&dir, true) {
            Ok(c) => Ok(c),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    fn start_in(dir: &Path, node: bool) -> Result<Cluster, Error> {
        let pid = std::process::id().to_string();
        let mut cmd = Command::new("bash");
        cmd.arg(script())
            .arg("start")
            .arg(dir)
            .args(["--owner-pid", &pid]);
        if node {
            cmd.arg("--node");
        }
        let out = run_output(&mut cmd, None, "")?;
        if !out.status.success() {
            let mut log = String::from_utf8_lossy(&out.stderr).into_owned();
            log.push_str(&String::from_utf8_lossy(&out.stdout));
            return Err(Error::ClusterStart { log });
        }
        let env_path = dir.join("cluster.env");
        let env = parse_env(&env_path)?;
        let cluster = Cluster {
            dir: dir.to_owned(),
            kubeconfig: dir.join("kubeconfig"),
            server: env_key(&env, &env_path, "APISERVER_URL")?.to_owned(),
            ca_cert: PathBuf::from(env_key(&env, &env_path, "CA_CERT")?),
            apiserver_pid: env_pid(&env, &env_path, "APISERVER_PID")?,
            etcd_pid: env_pid(&env, &env_path, "ETCD_PID")?,
            kube_version: env_key(&env, &env_path, "KUBE_VERSION")?.to_owned(),
            names: AtomicU32::new(0),
            killed: BTreeMap::new(),
        };
        // NB: the script already waited for /readyz; asking again through kubectl proves the
        // kubeconfig and the kubectl binary work before any test relies on them.
        let ready = cluster.kubectl_ok(&["get", "--raw", "/readyz"])?;
        if ready.trim() != "ok" {
            return Err(Error::ClusterStart {
                log: format!("/readyz answered {ready:?}"),
            });
        }
        Ok(cluster)
    }

    /// One cluster for the whole test binary, started on first use. It is never dropped; the
    /// watchdog stops it and deletes its directory when the test process exits.
    /// Panics (in every test that asks) if it could not start.
    pub fn shared() -> &'static Cluster {
        static SHARED: OnceLock<Result<Cluster, String>> = OnceLock::new();
        match SHARED.get_or_init(|| Cluster::try_start().map_err(|e| e.to_string())) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    /// The directory holding the kubeconfig, PKI, logs (`etcd.log`, `kube-apiserver.log`) and
    /// `cluster.env`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The admin kubeconfig (client certificate in group `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server URL, `https://127.0.0.1:PORT`.
    pub fn server_url(&self) -> &str {
        &self.server
    }

    /// The CA certificate that signed the API server's serving certificate (PEM file).
    pub fn ca_cert(&self) -> &Path {
        &self.ca_cert
    }

    /// The kube-apiserver version, e.g. `v1.34.4`.
    pub fn kube_version(&self) -> &str {
        &self.kube_version
    }

    /// Process ids of kube-apiserver and etcd.
    pub fn pids(&self) -> (u32, u32) {
        (self.apiserver_pid, self.etcd_pid)
    }

    /// SIGKILLs `component` (no graceful shutdown: a crash, an OOM kill, a node losing
    /// power) and returns once it is dead. Its command line is kept for
    /// [`Cluster::start_again`]; its data directory, ports and certificates stay as they are.
    pub fn kill(&mut self, component: Component) -> Result<(), Error> {
        let pid = self.pid_of(component);
        let argv = cmdline(pid)
            .filter(|argv| {
                argv.first()
                    .is_some_and(|a| a.to_string_lossy().contains(component.program()))
            })
            .ok_or_else(|| Error::ControlPlane {
                what: format!("{} (pid {pid}) is not running", component.program()),
            })?;
        run_ok(Command::new("kill").args(["-KILL", &pid.to_string()]))?;
        if !crate::eventually(Duration::from_secs(10), || dead(pid)) {
            return Err(Error::ControlPlane {
                what: format!(
                    "{} (pid {pid}) still runs 10 s after SIGKILL",
                    component.program()
                ),
            });
        }
        self.killed.insert(component, argv);
        Ok(())
    }

    /// Starts `component` again after [`Cluster::kill`], with the same command line: the
    /// same data directory (etcd keeps every object), ports and certificates, so clients
    /// reconnect to the same URL. Its output is appended to its log in [`Cluster::dir`].
    /// Returns once the process runs; see [`Cluster::wait_ready`].
    pub fn start_again(&mut self, component: Component) -> Result<(), Error> {
        let argv = self
            .killed
            .remove(&component)
            .ok_or_else(|| Error::ControlPlane {
                what: format!("{} was not killed", component.program()),
            })?;
        let log = self.dir.join(format!("{}.log", component.program()));
        // NB: detached in a session of its own, as scripts/cluster/testcluster.sh starts it, so it
        // is not the test's child and `testcluster.sh stop` (or the watchdog) stops it.
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(r#"setsid "$@" </dev/null >>"$SLUICE_E2E_LOG" 2>&1 & echo $!"#)
            .arg("start-again")
            .args(&argv)
            .env("SLUICE_E2E_LOG", &log);
        let out = run_ok(&mut cmd)?;
        let pid: u32 = out.trim().parse().map_err(|_| Error::ControlPlane {
            what: format!("starting {} printed {out:?}", component.program()),
        })?;
        match component {
            Component::Etcd => self.etcd_pid = pid,
            Component::ApiServer => self.apiserver_pid = pid,
        }
        self.record_pid(component, pid)
    }

    /// Waits until the API server answers `/readyz` with `ok` (kubectl as the admin), for at
    /// most `limit`; returns how long that took.
    pub fn wait_ready(&self, limit: Duration) -> Result<Duration, Error> {
        let started = Instant::now();
        loop {
            if self
                .kubectl(&["get", "--raw", "/readyz"])
                .is_ok_and(|out| out.success && out.stdout.trim() == "ok")
            {
                return Ok(started.elapsed());
            }
            if started.elapsed() >= limit {
                return Err(Error::ControlPlane {
                    what: format!(
                        "the API server was not ready within {limit:?} (see {})",
                        self.dir.join("kube-apiserver.log").display()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn pid_of(&self, component: Component) -> u32 {
        match component {
            Component::Etcd => self.etcd_pid,
            Component::ApiServer => self.apiserver_pid,
        }
    }

    /// Writes the new pid into `cluster.env`, where `testcluster.sh stop` and the watchdog
    /// look for it.
    fn record_pid(&self, component: Component, pid: u32) -> Result<(), Error> {
        set_env_key(
            &self.dir.join("cluster.env"),
            component.env_key(),
            &pid.to_string(),
        )
    }

    /// A kubectl command for `kubeconfig` with a discovery cache private to this cluster.
    pub fn kubectl_command_as(&self, kubeconfig: &Path) -> Command {
        let mut cmd = Command::new(kubectl_path());
        cmd.arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.join("kube-cache"))
            .env_remove("KUBECONFIG");
        cmd
    }

    /// Runs kubectl as the admin with `args` and returns what it printed, whatever its exit
    /// status (so tests can assert rejections). Errs only if kubectl could not run.
    pub fn kubectl(&self, args: &[&str]) -> Result<KubectlOutput, Error> {
        self.kubectl_as(&self.kubeconfig, args, None)
    }

    /// Like [`Cluster::kubectl`] with `stdin` fed to kubectl (e.g. `apply -f -`).
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Result<KubectlOutput, Error> {
        self.kubectl_as(&self.kubeconfig, args, Some(stdin))
    }

    /// Runs kubectl with another kubeconfig (e.g. from
    /// [`Cluster::service_account_kubeconfig`]).
    pub fn kubectl_as(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<KubectlOutput, Error> {
        let mut cmd = self.kubectl_command_as(kubeconfig);
        cmd.args(args);
        let out = run_output(&mut cmd, stdin.map(str::as_bytes), INSTALL_HINT)?;
        Ok(KubectlOutput {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Runs kubectl as the admin and returns its stdout; a non-zero exit is an error carrying
    /// kubectl's message.
    pub fn kubectl_ok(&self, args: &[&str]) -> Result<String, Error> {
        let mut cmd = self.kubectl_command_as(&self.kubeconfig);
        cmd.args(args);
        let out = run_output(&mut cmd, None, INSTALL_HINT)?;
        check(&cmd, out)
    }

    /// `kubectl apply -f -` of `yaml` as the admin; returns kubectl's output.
    pub fn apply(&self, yaml: &str) -> Result<String, Error> {
        let mut cmd = self.kubectl_command_as(&self.kubeconfig);
        cmd.args(["apply", "-f", "-"]);
        let out = run_output(&mut cmd, Some(yaml.as_bytes()), INSTALL_HINT)?;
        check(&cmd, out)
    }

    /// Creates a namespace named `PREFIX-N` (N unique within this cluster) and returns its
    /// name. Namespaces are never deleted: the cluster is thrown away as a whole.
    pub fn create_namespace(&self, prefix: &str) -> Result<String, Error> {
        let n = self.names.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{n}");
        self.kubectl_ok(&["create", "namespace", &name])?;
        Ok(name)
    }

    /// Creates the ServiceAccount `namespace/name` (if missing), issues it a token through the
    /// TokenRequest API (valid 24 h) and writes a kubeconfig that authenticates with it. The
    /// account can do nothing until RBAC grants it something: apply Roles/ClusterRoles and
    /// bindings whose subject is `{kind: ServiceAccount, name, namespace}` — e.g. the chart's
    /// RBAC — and the returned kubeconfig is a client with exactly those rights.
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PathBuf, Error> {
        self.apply(&format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {name}\n  namespace: {namespace}\n"
        ))?;
        let token = self.kubectl_ok(&[
            "create",
            "token",
            name,
            "--namespace",
            namespace,
            "--duration",
            "24h",
        ])?;
        let ca = std::fs::read(&self.ca_cert)
            .map_err(|e| Error::io(format!("reading {}", self.ca_cert.display()), e))?;
        let ca = base64::engine::general_purpose::STANDARD.encode(ca);
        let path = self.dir.join(format!("sa-{namespace}-{name}.kubeconfig"));
        let text = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: sluice-test
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {namespace}-{name}
  user:
    token: {token}
contexts:
- name: {namespace}-{name}
  context:
    cluster: sluice-test
    user: {namespace}-{name}
    namespace: {namespace}
current-context: {namespace}-{name}
",
            server = self.server,
            token = token.trim(),
        );
        std::fs::write(&path, text)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        Ok(path)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut cmd = Command::new("bash");
        cmd.arg(script()).arg("stop").arg(&self.dir).arg("--remove");
        if let Err(e) = run_ok(&mut cmd) {
            eprintln!(
                "sluice-e2e: stopping the test cluster in {}: {e}",
                self.dir.display()
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn cluster_env_is_parsed_and_missing_keys_are_named() {
        let dir = unique_temp_dir("sluice-e2e-unit").unwrap();
        let path = dir.join("cluster.env");
        std::fs::write(&path, "APISERVER_PID=42\nETCD_PID=x\nEMPTY=\n").unwrap();
        let env = parse_env(&path).unwrap();
        assert_eq!(env_pid(&env, &path, "APISERVER_PID").unwrap(), 42);
        let err = env_pid(&env, &path, "ETCD_PID").unwrap_err().to_string();
        assert!(err.ends_with("missing or malformed ETCD_PID"), "{err}");
        let err = env_key(&env, &path, "EMPTY").unwrap_err().to_string();
        assert!(err.contains("EMPTY"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_restarted_pid_replaces_the_old_one_in_cluster_env() {
        let dir = unique_temp_dir("sluice-e2e-unit").unwrap();
        let path = dir.join("cluster.env");
        std::fs::write(&path, "APISERVER_PID=1\nETCD_PID=2\nWATCHDOG_PID=3\n").unwrap();
        set_env_key(&path, Component::Etcd.env_key(), "42").unwrap();
        let env = parse_env(&path).unwrap();
        assert_eq!(env_pid(&env, &path, "ETCD_PID").unwrap(), 42);
        assert_eq!(env_pid(&env, &path, "APISERVER_PID").unwrap(), 1);
        assert_eq!(env_pid(&env, &path, "WATCHDOG_PID").unwrap(), 3);
        assert!(!dir.join("cluster.env.tmp").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn processes_are_seen_alive_and_dead() {
        let me = std::process::id();
        assert!(!dead(me));
        let argv = cmdline(me).unwrap();
        assert!(!argv.is_empty());
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        assert!(!dead(child.id()));
        child.kill().unwrap();
        // Not reaped yet: a zombie counts as dead.
        crate::eventually(Duration::from_secs(5), || dead(child.id()));
        assert!(dead(child.id()));
        child.wait().unwrap();
        assert!(dead(child.id()));
    }

    #[test]
    fn temp_dirs_are_distinct() {
        let a = unique_temp_dir("sluice-e2e-unit").unwrap();
        let b = unique_temp_dir("sluice-e2e-unit").unwrap();
        assert_ne!(a, b);
        assert!(a.is_dir() && b.is_dir());
        std::fs::remove_dir_all(a).unwrap();
        std::fs::remove_dir_all(b).unwrap();
    }
}
