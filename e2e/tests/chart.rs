//! The Helm chart (charts/sluice) against real helm and a real kube-apiserver: lint, the
//! values schema, the committed manifests/, server-side dry-run, `helm install` with the
//! default and the Graviton example values, and the chart's certificates and RBAC carrying a
//! real controller ⇄ dataplane snapshot stream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;
use sluice_e2e::{
    Backend, Cluster, chart_dir, eventually, free_port, helm, helm_path, http_get, render_chart,
    render_release, repo_root, workspace_bin,
};

fn graviton_values() -> String {
    chart_dir()
        .join("examples/graviton-values.yaml")
        .to_string_lossy()
        .into_owned()
}

/// The shared cluster with the chart's CRDs Established.
fn cluster() -> &'static Cluster {
    static READY: OnceLock<()> = OnceLock::new();
    let cluster = Cluster::shared();
    READY.get_or_init(|| {
        let crds = chart_dir().join("crds/apisix-crds.yaml");
        cluster
            .kubectl_ok(&["apply", "--server-side", "-f", crds.to_str().unwrap()])
            .unwrap();
        cluster
            .kubectl_ok(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/apisixroutes.apisix.apache.org",
            ])
            .unwrap();
    });
    cluster
}

/// Helm installs touch cluster-wide objects (IngressClass, ClusterRole): one at a time.
fn install_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Top-level documents of a multi-document YAML stream that hold an object.
fn object_count(yaml: &str) -> usize {
    yaml.lines().filter(|l| l.starts_with("kind: ")).count()
}

#[test]
fn helm_lint_passes_for_the_default_and_the_graviton_values() {
    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    let out = helm(&["lint", "--strict", chart]).unwrap();
    assert!(out.success, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("0 chart(s) failed"), "{}", out.stdout);
    let out = helm(&["lint", "--strict", chart, "-f", &graviton_values()]).unwrap();
    assert!(out.success, "{}{}", out.stdout, out.stderr);
}

#[test]
fn the_values_schema_refuses_bad_values_with_the_field_named() {
    let cases: &[(&[&str], &str)] = &[
        (&["--set", "controller.replicas=-1"], "/controller/replicas"),
        (&["--set", "dataplane.replicas=-2"], "/dataplane/replicas"),
        (
            &["--set", "dataplane.autoscaling.minReplicas=0"],
            "/dataplane/autoscaling/minReplicas",
        ),
        (&["--set", "arch=s390x"], "/arch"),
        (&["--set", "arch=x86_64"], "'', 'amd64', 'arm64'"),
        (
            &["--set", "dataplane.service.type=Ingress"],
            "/dataplane/service/type",
        ),
        (&["--set", "dataplane.replicaz=3"], "'replicaz' not allowed"),
        (
            &["--set", "dataplane.proxyProtocol.trusted={nonsense}"],
            "/dataplane/proxyProtocol/trusted/0",
        ),
        (
            &["--set", "podSecurityContext.runAsNonRoot=false"],
            "/podSecurityContext/runAsNonRoot",
        ),
        (
            &["--set", "snapshotTLS.mode=plaintext"],
            "/snapshotTLS/mode",
        ),
        // Cross-field checks the schema cannot express, made by templates/validate.yaml.
        (
            &["--set", "dataplane.autoscaling.maxReplicas=1"],
            "maxReplicas (1) must be at least dataplane.autoscaling.minReplicas (2)",
        ),
        (
            &["--set", "controller.leaderElection=false"],
            "needs leader election",
        ),
        (
            &["--set", "dataplane.shutdownDelaySeconds=-1"],
            "/dataplane/shutdownDelaySeconds",
        ),
        // The shutdown delay and the drain must both fit in the grace period.
        (
            &["--set", "dataplane.drainTimeoutSeconds=30"],
            "dataplane.shutdownDelaySeconds (5) + dataplane.drainTimeoutSeconds (30) must be \
             below dataplane.terminationGracePeriodSeconds (35)",
        ),
        (
            &[
                "--set",
                "dataplane.shutdownDelaySeconds=10",
                "--set",
                "dataplane.terminationGracePeriodSeconds=35",
            ],
            "dataplane.shutdownDelaySeconds (10) + dataplane.drainTimeoutSeconds (25) must be \
             below dataplane.terminationGracePeriodSeconds (35)",
        ),
        // A dataplane port used twice.
        (
            &[
                "--set-json",
                r#"dataplane.stream.ports=[{"name":"pg","port":9443}]"#,
            ],
            "dataplane.stream.ports[0]: TCP port 9443 is already used by dataplane.ports.https",
        ),
        (
            &[
                "--set-json",
                r#"dataplane.stream.ports=[{"name":"a","port":9100},{"name":"b","port":9100}]"#,
            ],
            "dataplane.stream.ports[1]: TCP port 9100 is already used by dataplane.stream.ports[0]",
        ),
        (
            &["--set", "dataplane.ports.admin=9090"],
            "dataplane.ports.status: port 9090 is already used by dataplane.ports.admin",
        ),
        (
            &[
                "--set-json",
                r#"dataplane.stream.ports=[{"name":"a","port":20001}]"#,
            ],
            "port 20001 is inside controller.gatewayServices.listenerPorts (20000-29999)",
        ),
        (
            &[
                "--set-json",
                r#"dataplane.stream.ports=[{"name":"dns","port":53,"protocol":"UDP","tls":true}]"#,
            ],
            "dataplane.stream.ports[0]: tls needs protocol TCP",
        ),
    ];
    let chart = chart_dir();
    for (args, want) in cases {
        let mut all = vec!["template", "x", chart.to_str().unwrap()];
        all.extend_from_slice(args);
        let out = helm(&all).unwrap();
        assert!(!out.success, "{args:?} was accepted:\n{}", out.stdout);
        assert!(
            out.stderr.contains(want),
            "{args:?}: the error does not mention {want:?}:\n{}",
            out.stderr
        );
    }
    // The same values files, both of which must pass.
    let ok = helm(&[
        "template",
        "x",
        chart.to_str().unwrap(),
        "-f",
        &graviton_values(),
    ])
    .unwrap();
    assert!(ok.success, "{}", ok.stderr);
}

/// The dataplane Deployment of `helm template s charts/sluice --namespace ns <extra>`.
fn dataplane_deployment(extra: &[&str]) -> String {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        "s",
        chart.to_str().unwrap(),
        "--namespace",
        "ns",
        "--show-only",
        "templates/dataplane.yaml",
    ];
    args.extend_from_slice(extra);
    let out = helm(&args).unwrap();
    assert!(out.success, "{extra:?}: {}", out.stderr);
    out.stdout
        .split("\n---\n")
        .find(|doc| doc.contains("\nkind: Deployment\n"))
        .unwrap_or_else(|| panic!("no Deployment in {}", out.stdout))
        .to_owned()
}

#[test]
fn the_dataplane_gets_a_shutdown_delay_that_fits_its_grace_period_with_the_drain() {
    // Defaults: 5 s of serving while the endpoint goes away, then 25 s of drain, in 35 s.
    let d = dataplane_deployment(&[]);
    assert!(d.contains("\n            - --shutdown-delay=5s\n"), "{d}");
    assert!(d.contains("\n            - --drain-timeout=25s\n"), "{d}");
    assert!(
        d.contains("\n      terminationGracePeriodSeconds: 35\n"),
        "{d}"
    );
    // The dataplane delays its own shutdown: no preStop hook (the image has no shell).
    assert!(!d.contains("preStop"), "{d}");
    let d = dataplane_deployment(&[
        "--set",
        "dataplane.shutdownDelaySeconds=0",
        "--set",
        "dataplane.drainTimeoutSeconds=10",
        "--set",
        "dataplane.terminationGracePeriodSeconds=11",
    ]);
    assert!(d.contains("\n            - --shutdown-delay=0s\n"), "{d}");
    assert!(d.contains("\n            - --drain-timeout=10s\n"), "{d}");
    assert!(
        d.contains("\n      terminationGracePeriodSeconds: 11\n"),
        "{d}"
    );
}

#[test]
fn a_fresh_render_starts_the_autoscaled_dataplane_at_min_replicas() {
    // Without a live Deployment (helm template, a first install) the HPA's minimum, not
    // Kubernetes' default of 1.
    let d = dataplane_deployment(&[]);
    assert!(d.contains("\nspec:\n  replicas: 2\n"), "{d}");
    let d = dataplane_deployment(&[
        "--set",
        "dataplane.autoscaling.minReplicas=3",
        "--set",
        "dataplane.autoscaling.maxReplicas=5",
    ]);
    assert!(d.contains("\nspec:\n  replicas: 3\n"), "{d}");
    let d = dataplane_deployment(&[
        "--set",
        "dataplane.autoscaling.enabled=false",
        "--set",
        "dataplane.replicas=4",
    ]);
    assert!(d.contains("\nspec:\n  replicas: 4\n"), "{d}");
}

#[test]
fn committed_manifests_match_the_chart() {
    let script = repo_root().join("scripts/generate/render-manifests.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--stdout")
        .env("SLUICE_HELM", helm_path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8(out.stdout).unwrap();
    let path = repo_root().join("manifests/sluice.yaml");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if rendered != committed {
        let first = rendered
            .lines()
            .zip(committed.lines())
            .position(|(a, b)| a != b)
            .map_or("(one is a prefix of the other)".to_owned(), |i| {
                format!("first difference at line {}", i + 1)
            });
        panic!(
            "{} is stale ({first}); regenerate it with scripts/generate/render-manifests.sh",
            path.display()
        );
    }
    // Everything but the generated certificates, and never a private key.
    assert!(object_count(&committed) >= 20, "{committed}");
    assert!(
        !committed.contains("\nkind: Secret\n") && !committed.contains("LS0tLS1CRUdJTi"),
        "manifests/ must not carry certificates or keys"
    );
}

#[test]
fn rendered_chart_passes_a_server_side_dry_run() {
    let cluster = cluster();
    // NB: the dry run reads the cluster-wide IngressClass that the install tests create
    // and delete; without the lock it can be found, then gone before the patch.
    let _guard = install_lock();
    let ns = cluster.create_namespace("dryrun").unwrap();
    for extra in [vec![], vec!["-f".to_owned(), graviton_values()]] {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let yaml = render_chart(&ns, &extra).unwrap();
        assert!(object_count(&yaml) >= 17, "{yaml}");
        let out = cluster
            .kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &yaml)
            .unwrap();
        assert!(out.success, "{extra:?}: {}", out.stderr);
        assert!(
            out.stdout
                .contains("deployment.apps/sluice-dataplane created (server dry run)"),
            "{}",
            out.stdout
        );
        assert!(
            out.stdout.contains(
                "horizontalpodautoscaler.autoscaling/sluice-dataplane created (server dry run)"
            ),
            "{}",
            out.stdout
        );
    }
}

fn get_json(cluster: &Cluster, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.extend(["-o", "json"]);
    serde_json::from_str(&cluster.kubectl_ok(&args).unwrap()).unwrap()
}

/// Installs the chart as `release` into a new namespace and checks that every object of the
/// release manifest exists. Returns the namespace.
fn install(cluster: &Cluster, release: &str, extra: &[&str]) -> String {
    let ns = cluster.create_namespace(release).unwrap();
    let chart = chart_dir();
    let mut args = vec![
        "install",
        release,
        chart.to_str().unwrap(),
        "--namespace",
        &ns,
    ];
    args.extend_from_slice(extra);
    let out = cluster.helm(&args).unwrap();
    assert!(out.success, "helm install {extra:?}: {}", out.stderr);
    assert!(out.stdout.contains("STATUS: deployed"), "{}", out.stdout);
    assert!(out.stdout.contains("NOTES:"), "{}", out.stdout);

    // Every object helm rendered is in the cluster.
    let manifest = cluster
        .helm_ok(&["get", "manifest", release, "--namespace", &ns])
        .unwrap();
    let expected = object_count(&manifest);
    assert!(expected >= 17, "{manifest}");
    let got = cluster
        .kubectl_stdin(&["get", "-f", "-", "-o", "json"], &manifest)
        .unwrap();
    assert!(got.success, "objects missing after install: {}", got.stderr);
    let got: Value = serde_json::from_str(&got.stdout).unwrap();
    let items = got["items"].as_array().unwrap();
    assert_eq!(items.len(), expected, "{}", got);
    let mut kinds: Vec<&str> = items.iter().map(|i| i["kind"].as_str().unwrap()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    for kind in [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "HorizontalPodAutoscaler",
        "IngressClass",
        "PodDisruptionBudget",
        "Role",
        "RoleBinding",
        "Secret",
        "Service",
        "ServiceAccount",
    ] {
        assert!(kinds.contains(&kind), "no {kind} in {kinds:?}");
    }
    ns
}

fn secret_data(cluster: &Cluster, ns: &str, name: &str, key: &str) -> Vec<u8> {
    let s = get_json(cluster, &["get", "secret", name, "-n", ns]);
    base64::engine::general_purpose::STANDARD
        .decode(s["data"][key].as_str().unwrap())
        .unwrap()
}

#[test]
fn helm_install_creates_every_object_with_default_and_graviton_values() {
    let cluster = cluster();
    let _guard = install_lock();

    // Default values.
    let ns = install(cluster, "sluice", &[]);
    let dp = get_json(cluster, &["get", "deploy", "sluice-dataplane", "-n", &ns]);
    let pod = &dp["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["serviceAccountName"], "sluice-dataplane");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let c = &pod["containers"][0];
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    // Probes and metrics on the pod address; the debug endpoints on loopback only.
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "status");
    let dargs = c["args"].to_string();
    assert!(dargs.contains("--status=0.0.0.0:9090"), "{dargs}");
    assert!(dargs.contains("--admin=127.0.0.1:9091"), "{dargs}");
    let sa = get_json(cluster, &["get", "sa", "sluice-dataplane", "-n", &ns]);
    assert_eq!(sa["automountServiceAccountToken"], false);
    let ctrl = get_json(cluster, &["get", "deploy", "sluice-controller", "-n", &ns]);
    assert_eq!(ctrl["spec"]["replicas"], 2);
    let args = ctrl["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--leader-elect"), "{args}");
    let hpa = get_json(cluster, &["get", "hpa", "sluice-dataplane", "-n", &ns]);
    assert_eq!(hpa["apiVersion"], "autoscaling/v2");
    assert_eq!(hpa["spec"]["minReplicas"], 2);
    assert_eq!(hpa["spec"]["maxReplicas"], 10);
    assert_eq!(hpa["spec"]["metrics"][0]["resource"]["name"], "cpu");
    let svc = get_json(cluster, &["get", "svc", "sluice-dataplane", "-n", &ns]);
    assert_eq!(svc["spec"]["type"], "LoadBalancer");
    // The dataplane starts at the HPA's minimum; then the HPA (here: kubectl) scales it.
    assert_eq!(dp["spec"]["replicas"], 2);
    cluster
        .kubectl_ok(&[
            "scale",
            "deploy/sluice-dataplane",
            "-n",
            &ns,
            "--replicas=4",
        ])
        .unwrap();

    // An upgrade keeps the generated certificates (lookup), so dataplanes stay trusted.
    let ca = secret_data(cluster, &ns, "sluice-controller-tls", "ca.crt");
    let key = secret_data(cluster, &ns, "sluice-controller-tls", "tls.key");
    let chart = chart_dir();
    let out = cluster
        .helm(&[
            "upgrade",
            "sluice",
            chart.to_str().unwrap(),
            "--namespace",
            &ns,
            "--set",
            "dataplane.service.type=NodePort",
        ])
        .unwrap();
    assert!(out.success, "{}", out.stderr);
    assert_eq!(
        secret_data(cluster, &ns, "sluice-controller-tls", "ca.crt"),
        ca
    );
    assert_eq!(
        secret_data(cluster, &ns, "sluice-controller-tls", "tls.key"),
        key
    );
    assert_eq!(
        secret_data(cluster, &ns, "sluice-dataplane-tls", "ca.crt"),
        ca
    );
    let svc = get_json(cluster, &["get", "svc", "sluice-dataplane", "-n", &ns]);
    assert_eq!(svc["spec"]["type"], "NodePort");
    // ... and the replica count the HPA chose (lookup), not minReplicas again.
    let dp = get_json(cluster, &["get", "deploy", "sluice-dataplane", "-n", &ns]);
    assert_eq!(dp["spec"]["replicas"], 4);
    let out = cluster
        .helm(&["uninstall", "sluice", "--namespace", &ns])
        .unwrap();
    assert!(out.success, "{}", out.stderr);

    // The Graviton example: arm64 nodes, tolerations, spread, HPA 3..30.
    let ns = install(cluster, "edge", &["-f", &graviton_values()]);
    for deploy in ["edge-sluice-controller", "edge-sluice-dataplane"] {
        let d = get_json(cluster, &["get", "deploy", deploy, "-n", &ns]);
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(
            pod["nodeSelector"]["kubernetes.io/arch"], "arm64",
            "{deploy}"
        );
        assert_eq!(pod["tolerations"][0]["value"], "arm64", "{deploy}");
        assert!(
            pod["topologySpreadConstraints"].as_array().is_some(),
            "{deploy}"
        );
    }
    let hpa = get_json(cluster, &["get", "hpa", "edge-sluice-dataplane", "-n", &ns]);
    assert_eq!(hpa["spec"]["minReplicas"], 3);
    assert_eq!(hpa["spec"]["maxReplicas"], 30);
    assert_eq!(
        hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
        60
    );
    let out = cluster
        .helm(&["uninstall", "edge", "--namespace", &ns])
        .unwrap();
    assert!(out.success, "{}", out.stderr);
}

/// The chart's generated certificates and the chart's RBAC carry a real snapshot stream:
/// the controller runs as the chart's ServiceAccount with the controller Secret, the
/// dataplane with the dataplane Secret, verifying the controller by its in-cluster DNS name.
#[test]
fn chart_certificates_and_rbac_carry_a_real_snapshot_stream() {
    // NB: release `mtls`: its ClusterRole and Secrets have names of their own, so it shares
    // the cluster with the helm releases of the other tests.
    let cluster = cluster();
    let ns = cluster.create_namespace("mtls").unwrap();
    let yaml = render_release(
        "mtls",
        &ns,
        &["--show-only", "templates/snapshot-tls-secret.yaml"],
    )
    .unwrap();
    cluster.apply(&yaml).unwrap();
    let kubeconfig = cluster
        .chart_controller_kubeconfig_for("mtls", &ns)
        .unwrap();
    let dir = cluster.dir().join(format!("mtls-{ns}"));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |secret: &str, key: &str| -> PathBuf {
        let path = dir.join(format!("{secret}-{key}"));
        std::fs::write(&path, secret_data(cluster, &ns, secret, key)).unwrap();
        path
    };
    let grpc = free_port().unwrap();
    let metrics = free_port().unwrap();
    let mut cmd = Command::new(workspace_bin("sluice-controller", "sluice-controller").unwrap());
    cmd.arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--grpc-listen", &grpc.to_string()])
        .args(["--metrics-listen", &metrics.to_string()])
        .args([
            "--leader-elect",
            "--identity",
            "mtls-0",
            "--lease-namespace",
            &ns,
        ])
        .args(["--watch-namespace", &ns])
        .arg("--tls-cert")
        .arg(write("mtls-sluice-controller-tls", "tls.crt"))
        .arg("--tls-key")
        .arg(write("mtls-sluice-controller-tls", "tls.key"))
        .arg("--tls-ca")
        .arg(write("mtls-sluice-controller-tls", "ca.crt"));
    let _controller = Backend::spawn(cmd, grpc, Duration::from_secs(30)).unwrap();

    let admin = free_port().unwrap();
    let http = free_port().unwrap();
    let mut cmd = Command::new(workspace_bin("sluice-dataplane", "sluice-dataplane").unwrap());
    cmd.args(["--controller", &format!("https://{grpc}")])
        .args([
            "--tls-server-name",
            &format!("mtls-sluice-controller.{ns}.svc"),
        ])
        .arg("--tls-cert")
        .arg(write("mtls-sluice-dataplane-tls", "tls.crt"))
        .arg("--tls-key")
        .arg(write("mtls-sluice-dataplane-tls", "tls.key"))
        .arg("--tls-ca")
        .arg(write("mtls-sluice-dataplane-tls", "ca.crt"))
        .args(["--workers", "1", "--dataplane-id", "mtls-dp"])
        .args([
            "--listen-http",
            &http.to_string(),
            "--admin",
            &admin.to_string(),
        ]);
    let _dataplane = Backend::spawn(cmd, admin, Duration::from_secs(30)).unwrap();

    // A route applied now reaches the dataplane over the mutually authenticated stream, and
    // its status (written by the controller with the chart's RBAC) says so.
    cluster
        .apply(&format!(
            r#"apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {ns}}}
spec:
  ports: [{{name: http, port: 80}}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: mtls, namespace: {ns}}}
spec:
  ingressClassName: apisix
  http:
    - name: r1
      match: {{hosts: [mtls.e2e], paths: ["/x"]}}
      backends: [{{serviceName: web, servicePort: 80}}]
"#
        ))
        .unwrap();
    let programmed = eventually(Duration::from_secs(30), || {
        let ar = get_json(cluster, &["get", "ar", "mtls", "-n", &ns]);
        ar["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Programmed" && c["status"] == "True")
            .and_then(|c| c["message"].as_str().map(str::to_owned))
    });
    let programmed = programmed.expect("the route was never Programmed on the dataplane");
    assert!(programmed.contains("1/1"), "{programmed}");
    // Served by the dataplane: the route exists (its Service has no endpoints, so no
    // connection is made anywhere), an unknown host 404s.
    let routed = http_get(http, "mtls.e2e", "/x").unwrap();
    assert_ne!(routed.status, 404, "{routed:?}");
    assert_eq!(http_get(http, "other.e2e", "/x").unwrap().status, 404);
}

#[test]
fn cert_manager_mode_issues_both_certificates_and_needs_cert_manager() {
    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    let base = ["template", "s", chart, "--namespace", "ns"];
    let mut without = base.to_vec();
    without.extend(["--set", "snapshotTLS.mode=certManager"]);
    let out = helm(&without).unwrap();
    assert!(!out.success, "{}", out.stdout);
    assert!(
        out.stderr.contains("needs cert-manager installed"),
        "{}",
        out.stderr
    );

    let mut with = without.clone();
    with.extend(["--api-versions", "cert-manager.io/v1"]);
    let yaml = helm(&with).unwrap();
    assert!(yaml.success, "{}", yaml.stderr);
    let y = &yaml.stdout;
    // Self-signed root, CA certificate, CA issuer, then the two leaf certificates.
    assert_eq!(y.matches("\nkind: Certificate\n").count(), 3, "{y}");
    assert_eq!(y.matches("\nkind: Issuer\n").count(), 2, "{y}");
    assert!(y.contains("secretName: s-sluice-controller-tls"), "{y}");
    assert!(y.contains("- s-sluice-controller.ns.svc\n"), "{y}");
    assert!(y.contains("secretName: s-sluice-dataplane-tls"), "{y}");
    assert!(y.contains("usages: [client auth"), "{y}");
    assert!(
        !y.contains("\nkind: Secret\n"),
        "no generated Secret with cert-manager: {y}"
    );

    // With an issuer of one's own, only the two leaf certificates.
    let mut own = with.clone();
    own.extend([
        "--set",
        "snapshotTLS.certManager.issuerRef.name=corp-ca",
        "--set",
        "snapshotTLS.certManager.issuerRef.kind=ClusterIssuer",
    ]);
    let yaml = helm(&own).unwrap();
    assert!(yaml.success, "{}", yaml.stderr);
    assert_eq!(yaml.stdout.matches("\nkind: Certificate\n").count(), 2);
    assert_eq!(yaml.stdout.matches("\nkind: Issuer\n").count(), 0);
    assert_eq!(yaml.stdout.matches("name: corp-ca").count(), 2);

    // Existing Secrets: the names are required, and then nothing is generated.
    let mut existing = base.to_vec();
    existing.extend(["--set", "snapshotTLS.mode=existingSecrets"]);
    let out = helm(&existing).unwrap();
    assert!(!out.success);
    assert!(
        out.stderr.contains("controllerSecretName"),
        "{}",
        out.stderr
    );
    existing.extend([
        "--set",
        "snapshotTLS.controllerSecretName=c-tls",
        "--set",
        "snapshotTLS.dataplaneSecretName=d-tls",
    ]);
    let out = helm(&existing).unwrap();
    assert!(out.success, "{}", out.stderr);
    assert!(!out.stdout.contains("\nkind: Secret\n"));
    assert!(out.stdout.contains("secretName: c-tls"));
    assert!(out.stdout.contains("secretName: d-tls"));
}

#[test]
fn a_network_policy_admits_traffic_and_metrics_only_when_asked_for() {
    let chart = chart_dir();
    let base = [
        "template",
        "s",
        chart.to_str().unwrap(),
        "--namespace",
        "ns",
    ];
    let out = helm(&base).unwrap();
    assert!(out.success, "{}", out.stderr);
    assert!(!out.stdout.contains("kind: NetworkPolicy"));
    let mut args = base.to_vec();
    args.extend([
        "--set",
        "dataplane.networkPolicy.enabled=true",
        "--set-json",
        r#"dataplane.networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]"#,
    ]);
    let out = helm(&args).unwrap();
    assert!(out.success, "{}", out.stderr);
    let y = &out.stdout;
    let policy = &y[y.find("kind: NetworkPolicy").expect("no NetworkPolicy")..];
    let policy = &policy[..policy.find("\n---").unwrap_or(policy.len())];
    for want in [
        "policyTypes: [Ingress]",
        "- {port: 9080, protocol: TCP}",
        "- {port: 9443, protocol: TCP}",
        "- {port: 9090, protocol: TCP}",
        "kubernetes.io/metadata.name: monitoring",
    ] {
        assert!(policy.contains(want), "{want} missing:\n{policy}");
    }
    // The debug port is never admitted: it listens on loopback.
    assert!(!policy.contains("9091"), "{policy}");
}

#[test]
fn proxy_protocol_reaches_the_dataplane_flags_only_when_enabled() {
    let d = dataplane_deployment(&[]);
    assert!(!d.contains("--proxy-protocol"), "{d}");
    let d = dataplane_deployment(&[
        "--set",
        "dataplane.proxyProtocol.enabled=true",
        "--set",
        "dataplane.proxyProtocol.trusted={10.0.0.0/8,192.0.2.7}",
        "--set",
        "dataplane.proxyProtocol.headerTimeoutSeconds=3",
    ]);
    for want in [
        "\n            - --proxy-protocol\n",
        "\n            - --proxy-protocol-trusted=10.0.0.0/8,192.0.2.7\n",
        "\n            - --proxy-header-timeout=3s\n",
    ] {
        assert!(d.contains(want), "{want} missing: {d}");
    }
    let d = dataplane_deployment(&["--set", "dataplane.proxyProtocol.enabled=true"]);
    assert!(!d.contains("--proxy-protocol-trusted"), "{d}");
}

#[test]
fn stream_ports_reach_the_pods_the_service_the_network_policy_and_the_controller() {
    let chart = chart_dir();
    let out = helm(&[
        "template",
        "s",
        chart.to_str().unwrap(),
        "--namespace",
        "ns",
        "--set",
        "dataplane.networkPolicy.enabled=true",
        "--set-json",
        r#"dataplane.stream.ports=[{"name":"redis","port":9100,"protocol":"TCP"},{"name":"dns","port":9100,"protocol":"UDP"},{"name":"pg-tls","port":9543,"tls":true}]"#,
    ])
    .unwrap();
    assert!(out.success, "{}", out.stderr);
    let y = &out.stdout;
    for want in [
        // Pods.
        "- {name: redis, containerPort: 9100, protocol: TCP}",
        "- {name: dns, containerPort: 9100, protocol: UDP}",
        "- {name: pg-tls, containerPort: 9543, protocol: TCP}",
        // The dataplane Service.
        "- {name: dns, port: 9100, targetPort: dns, protocol: UDP}",
        "- {name: pg-tls, port: 9543, targetPort: pg-tls, protocol: TCP}",
        // The NetworkPolicy, and UDP for Gateway listeners.
        "- {port: 9100, protocol: UDP}",
        "- {port: 20000, endPort: 29999, protocol: UDP}",
        // The controller.
        "- --stream-ports=tcp:9100,udp:9100,tls:9543",
    ] {
        assert!(y.contains(want), "{want} missing");
    }
    // None by default: no flag.
    let out = helm(&["template", "s", chart.to_str().unwrap()]).unwrap();
    assert!(out.success, "{}", out.stderr);
    assert!(!out.stdout.contains("--stream-ports"));
}

#[test]
fn service_monitors_scrape_both_components_and_need_the_prometheus_operator() {
    let chart = chart_dir();
    let args = [
        "template",
        "s",
        chart.to_str().unwrap(),
        "--namespace",
        "ns",
        "--set",
        "serviceMonitor.enabled=true",
    ];
    let out = helm(&args).unwrap();
    assert!(!out.success);
    assert!(
        out.stderr.contains("needs the Prometheus Operator"),
        "{}",
        out.stderr
    );
    let mut with = args.to_vec();
    with.extend(["--api-versions", "monitoring.coreos.com/v1"]);
    let out = helm(&with).unwrap();
    assert!(out.success, "{}", out.stderr);
    let y = &out.stdout;
    assert_eq!(y.matches("\nkind: ServiceMonitor\n").count(), 2, "{y}");
    // Each selects a Service that exists in the release, on a port that Service has.
    assert!(
        y.contains("app.kubernetes.io/component: dataplane-metrics\n"),
        "{y}"
    );
    assert_eq!(y.matches("- port: metrics\n").count(), 2, "{y}");
    assert!(
        y.contains("- {name: metrics, port: 9090, targetPort: status, protocol: TCP}"),
        "{y}"
    );
}

#[test]
fn the_dashboard_configmap_carries_the_committed_json_for_the_grafana_sidecar() {
    let chart = chart_dir();
    let base = [
        "template",
        "s",
        chart.to_str().unwrap(),
        "--namespace",
        "ns",
    ];
    let out = helm(&base).unwrap();
    assert!(out.success, "{}", out.stderr);
    assert!(!out.stdout.contains("grafana_dashboard"), "off by default");

    let mut args = base.to_vec();
    args.extend(["--set", "dashboard.enabled=true"]);
    let out = helm(&args).unwrap();
    assert!(out.success, "{}", out.stderr);
    let y = &out.stdout;
    let doc = &y[y
        .find("# Source: sluice/templates/dashboard.yaml")
        .expect("no dashboard")..];
    let doc = &doc[..doc.find("\n---").unwrap_or(doc.len())];
    for want in [
        "kind: ConfigMap\n",
        "  name: s-sluice-dashboard\n",
        "  namespace: ns\n",
        "    grafana_dashboard: \"1\"\n",
    ] {
        assert!(doc.contains(want), "{want:?} missing:\n{doc}");
    }
    // The data is the committed dashboard, byte for byte once unindented.
    let (_, block) = doc.split_once("  sluice-apisix.json: |-\n").expect(doc);
    let json: String = block
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let shipped: Value = serde_json::from_str(&json).unwrap();
    let committed: Value = serde_json::from_str(
        &std::fs::read_to_string(chart.join("dashboards/sluice-apisix.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(shipped, committed);
    assert_eq!(committed["uid"], "sluice-apisix");

    // The sidecar's label, namespace and folder annotation are the user's to set.
    args.extend([
        "--set",
        "dashboard.namespace=monitoring",
        "--set",
        "dashboard.label=grafana_dashboard_sluice",
        "--set",
        "dashboard.labelValue=yes",
        "--set",
        "dashboard.annotations.grafana_folder=Gateways",
    ]);
    let out = helm(&args).unwrap();
    assert!(out.success, "{}", out.stderr);
    let y = &out.stdout;
    let doc = &y[y.find("# Source: sluice/templates/dashboard.yaml").unwrap()..];
    for want in [
        "  namespace: monitoring\n",
        "    grafana_dashboard_sluice: \"yes\"\n",
        "    grafana_folder: Gateways\n",
    ] {
        assert!(doc.contains(want), "{want:?} missing:\n{doc}");
    }

    // A label the API server would refuse is refused with the field named.
    let mut bad = base.to_vec();
    bad.extend([
        "--set",
        "dashboard.enabled=true",
        "--set",
        "dashboard.label=a b",
    ]);
    let out = helm(&bad).unwrap();
    assert!(!out.success);
    assert!(out.stderr.contains("/dashboard/label"), "{}", out.stderr);
}

/// `dataplane.pluginMetadata` reaches the dataplane as a file in a Secret, named by
/// `--plugin-metadata`; without it the flag, the mount and the Secret are absent.
#[test]
fn plugin_metadata_reaches_the_dataplane_as_a_secret_file() {
    let chart = chart_dir();
    let render = |extra: &[&str]| {
        let mut args = vec![
            "template",
            "s",
            chart.to_str().unwrap(),
            "--namespace",
            "ns",
        ];
        args.extend_from_slice(extra);
        let out = helm(&args).unwrap();
        assert!(out.success, "{extra:?}: {}", out.stderr);
        out.stdout
    };
    let plain = render(&[]);
    assert!(!plain.contains("plugin-metadata"), "{plain}");

    let meta = r#"dataplane.pluginMetadata={"opentelemetry":{"collector":{"address":"otel-collector.observability:4318","request_headers":{"authorization":"Bearer t0ken"}}}}"#;
    let out = render(&["--set-json", meta]);
    let deployment = out
        .split("\n---\n")
        .find(|d| d.contains("\nkind: Deployment\n") && d.contains("name: s-sluice-dataplane\n"))
        .unwrap();
    assert!(
        deployment.contains("- --plugin-metadata=/etc/sluice/plugin-metadata/metadata.yaml"),
        "{deployment}"
    );
    assert!(
        deployment.contains(
            "{name: plugin-metadata, mountPath: /etc/sluice/plugin-metadata, readOnly: true}"
        ),
        "{deployment}"
    );
    let secret = out
        .split("\n---\n")
        .find(|d| {
            d.contains("name: s-sluice-dataplane-plugin-metadata") && d.contains("kind: Secret")
        })
        .unwrap_or_else(|| panic!("no plugin-metadata Secret in {out}"));
    // The credential is not in the rendered text in the clear.
    assert!(!secret.contains("t0ken"), "{secret}");
    let b64 = secret
        .lines()
        .find_map(|l| l.trim().strip_prefix("metadata.yaml: "))
        .unwrap();
    let text = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .unwrap(),
    )
    .unwrap();
    assert!(
        text.contains("address: otel-collector.observability:4318"),
        "{text}"
    );
    assert!(text.contains("authorization: Bearer t0ken"), "{text}");
}

/// The Gateway Services' placement: by default the controller may write Services in the
/// release namespace only (a Role); `placement=gateway` passes the flag and adds, to the
/// ClusterRole, exactly the writes of Services and EndpointSlices it needs in the Gateways'
/// namespaces.
#[test]
fn gateway_service_placement_reaches_the_controller_and_widens_rbac_only_when_asked() {
    let cluster_role = |extra: &[&str]| -> (String, String) {
        let all = render_chart("ns", extra).unwrap();
        let role = all
            .split("\n---\n")
            .find(|d| {
                d.contains("\nkind: ClusterRole\n") && d.contains("name: sluice-controller\n")
            })
            .unwrap_or_else(|| panic!("no ClusterRole sluice-controller in {all}"))
            .to_owned();
        (all, role)
    };
    let writes = ["verbs: [create, patch, delete]"];
    let (all, role) = cluster_role(&[]);
    assert!(
        all.contains("- --gateway-service-placement=dataplane\n"),
        "{all}"
    );
    for w in writes {
        assert!(!role.contains(w), "default ClusterRole writes: {role}");
    }
    let (all, role) = cluster_role(&["--set", "controller.gatewayServices.placement=gateway"]);
    assert!(
        all.contains("- --gateway-service-placement=gateway\n"),
        "{all}"
    );
    for want in [
        "  - apiGroups: [\"\"]\n    resources: [services]\n    verbs: [create, patch, delete]",
        "  - apiGroups: [discovery.k8s.io]\n    resources: [endpointslices]\n    verbs: [create, patch, delete]",
    ] {
        assert!(role.contains(want), "{want} missing: {role}");
    }
    // Gateway Services off: no placement, no grant.
    let (all, role) = cluster_role(&[
        "--set",
        "controller.gatewayServices.placement=gateway",
        "--set",
        "controller.gatewayServices.enabled=false",
    ]);
    assert!(!all.contains("--gateway-service-placement"), "{all}");
    assert!(!role.contains("verbs: [create, patch, delete]"), "{role}");
    // Any other value is refused by the schema.
    let out = helm(&[
        "template",
        "s",
        chart_dir().to_str().unwrap(),
        "--set",
        "controller.gatewayServices.placement=everywhere",
    ])
    .unwrap();
    assert!(!out.success, "{}", out.stdout);
    assert!(out.stderr.contains("placement"), "{}", out.stderr);
}

/// `ingressClass.nginxClasses` reaches the controller as `--ingress-nginx-class`, only when
/// set; a class name that is not a DNS subdomain is refused by the schema.
#[test]
fn nginx_classes_reach_the_controller_only_when_set() {
    let all = render_chart("ns", &[]).unwrap();
    assert!(!all.contains("--ingress-nginx-class"), "{all}");
    let all = render_chart(
        "ns",
        &["--set", "ingressClass.nginxClasses={nginx,nginx-internal}"],
    )
    .unwrap();
    assert!(
        all.contains("- --ingress-nginx-class=nginx,nginx-internal\n"),
        "{all}"
    );
    let out = helm(&[
        "template",
        "s",
        chart_dir().to_str().unwrap(),
        "--set",
        "ingressClass.nginxClasses={Not_A_Class}",
    ])
    .unwrap();
    assert!(!out.success, "{}", out.stdout);
    assert!(out.stderr.contains("nginxClasses"), "{}", out.stderr);
    // ingress-nginx's ConfigMap settings, each its own flag; a key Sluice does not take is
    // refused by the schema.
    let all = render_chart(
        "ns",
        &[
            "--set",
            "ingressClass.nginxConfig.ssl-redirect=false",
            "--set-string",
            "ingressClass.nginxConfig.whitelist-source-range=10.0.0.0/8\\,192.168.0.0/16",
        ],
    )
    .unwrap();
    assert!(
        all.contains("- \"--ingress-nginx-config=ssl-redirect=false\"\n"),
        "{all}"
    );
    assert!(
        all.contains(
            "- \"--ingress-nginx-config=whitelist-source-range=10.0.0.0/8,192.168.0.0/16\"\n"
        ),
        "{all}"
    );
    let out = helm(&[
        "template",
        "s",
        chart_dir().to_str().unwrap(),
        "--set",
        "ingressClass.nginxConfig.allow-snippet-annotations=true",
    ])
    .unwrap();
    assert!(!out.success, "{}", out.stdout);
    assert!(
        out.stderr
            .contains("invalid propertyName 'allow-snippet-annotations'"),
        "{}",
        out.stderr
    );
}
