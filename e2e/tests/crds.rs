//! The generated CRDs and the APISIX-doc-shaped fixtures against a real kube-apiserver.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;

use serde_json::Value;
use sluice_e2e::{Cluster, repo_root};

const CRD_NAMES: [&str; 6] = [
    "apisixconsumers.apisix.apache.org",
    "apisixglobalrules.apisix.apache.org",
    "apisixpluginconfigs.apisix.apache.org",
    "apisixroutes.apisix.apache.org",
    "apisixtlses.apisix.apache.org",
    "apisixupstreams.apisix.apache.org",
];

/// The shared cluster with the CRDs applied and Established and the fixtures' namespaces.
fn cluster() -> &'static Cluster {
    static READY: OnceLock<()> = OnceLock::new();
    let cluster = Cluster::shared();
    READY.get_or_init(|| {
        let crds = repo_root().join("crds/apisix-crds.yaml");
        cluster
            .kubectl_ok(&["apply", "--server-side", "-f", crds.to_str().unwrap()])
            .unwrap();
        let mut wait = vec!["wait", "--for=condition=Established", "--timeout=60s"];
        let names: Vec<String> = CRD_NAMES.iter().map(|n| format!("crd/{n}")).collect();
        wait.extend(names.iter().map(String::as_str));
        cluster.kubectl_ok(&wait).unwrap();
        // The fixtures put some objects into namespace `shared`.
        cluster
            .apply("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shared\n")
            .unwrap();
    });
    cluster
}

fn json(cluster: &Cluster, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.extend(["-o", "json"]);
    serde_json::from_str(&cluster.kubectl_ok(&args).unwrap()).unwrap()
}

fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a str> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)?["status"]
        .as_str()
}

#[test]
fn generated_crds_install_and_become_established() {
    let cluster = cluster();
    let list = json(cluster, &["get", "crd"]);
    let mut ours: Vec<&Value> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["spec"]["group"] == "apisix.apache.org")
        .collect();
    ours.sort_by_key(|c| {
        c["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    });
    let names: Vec<&str> = ours
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, CRD_NAMES);
    for crd in &ours {
        let name = &crd["metadata"]["name"];
        assert_eq!(
            condition(crd, "Established"),
            Some("True"),
            "{name} not Established"
        );
        assert_eq!(
            condition(crd, "NamesAccepted"),
            Some("True"),
            "{name} names not accepted"
        );
        // A non-structural schema would show up as this condition.
        assert_eq!(
            condition(crd, "NonStructuralSchema"),
            None,
            "{name} schema not structural"
        );
    }

    // Users reach the kinds by their APISIX short names.
    let resources = cluster
        .kubectl_ok(&[
            "api-resources",
            "--api-group=apisix.apache.org",
            "--no-headers",
        ])
        .unwrap();
    for short in ["ar", "au", "atls", "apc", "ac", "agr"] {
        assert!(
            resources
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(short)),
            "short name {short} missing from:\n{resources}"
        );
    }
}

#[test]
fn doc_shaped_fixtures_pass_server_side_dry_run_unchanged() {
    let cluster = cluster();
    let dir = repo_root().join("crds/tests/fixtures");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert_eq!(
        files.len(),
        6,
        "expected one fixture file per kind in {}",
        dir.display()
    );
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let documents = text.lines().filter(|l| l.starts_with("kind: ")).count();
        // Strict field validation: a field the schema does not know would be an error here
        // instead of being silently pruned, so "accepted" means "accepted unchanged".
        let out = cluster
            .kubectl(&[
                "apply",
                "--dry-run=server",
                "--validate=strict",
                "-f",
                file.to_str().unwrap(),
            ])
            .unwrap();
        assert!(
            out.success,
            "{} rejected:\n{}{}",
            file.display(),
            out.stderr,
            out.stdout
        );
        assert!(
            out.stderr.is_empty(),
            "{}: warnings:\n{}",
            file.display(),
            out.stderr
        );
        let accepted = out
            .stdout
            .lines()
            .filter(|l| l.ends_with("(server dry run)"))
            .count();
        assert_eq!(accepted, documents, "{}:\n{}", file.display(), out.stdout);
    }
}

#[test]
fn kubectl_get_ar_shows_the_printer_columns() {
    let cluster = cluster();
    let ns = cluster.create_namespace("printer").unwrap();
    let route = r#"apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata:
  name: httpbin-route
spec:
  http:
    - name: rule1
      match:
        hosts: [httpbin.org]
        paths: ["/ip"]
      backends:
        - serviceName: httpbin
          servicePort: 80
"#;
    cluster
        .kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], route)
        .map(|o| assert!(o.success, "{}", o.stderr))
        .unwrap();

    let table = cluster.kubectl_ok(&["get", "ar", "-n", &ns]).unwrap();
    let mut lines = table.lines();
    let header: Vec<&str> = columns(lines.next().unwrap());
    let row: Vec<&str> = columns(lines.next().unwrap());
    assert_eq!(header.first(), Some(&"NAME"), "{table}");
    assert_eq!(header.last(), Some(&"AGE"), "{table}");
    let cell = |name: &str| {
        let i = header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no {name} column:\n{table}"));
        row[i]
    };
    assert_eq!(cell("NAME"), "httpbin-route");
    assert!(cell("HOSTS").contains("httpbin.org"), "{table}");
    assert!(cell("URIS").contains("/ip"), "{table}");
    // The wide view adds the backend Services.
    let wide = cluster
        .kubectl_ok(&["get", "ar", "-n", &ns, "-o", "wide"])
        .unwrap();
    assert!(
        wide.lines()
            .next()
            .unwrap()
            .contains("TARGET SERVICE (HTTP)"),
        "{wide}"
    );
    assert!(wide.lines().nth(1).unwrap().contains("httpbin"), "{wide}");
}

/// Splits a kubectl table line on runs of two or more spaces.
fn columns(line: &str) -> Vec<&str> {
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

#[test]
fn an_unknown_expr_operator_is_rejected_with_the_field_path() {
    let cluster = cluster();
    let ns = cluster.create_namespace("invalid").unwrap();
    let route = r#"apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata:
  name: bad-op
spec:
  http:
    - name: rule1
      match:
        paths: ["/*"]
        exprs:
          - subject:
              scope: Header
              name: X-Foo
            op: Bogus
            value: bar
      backends:
        - serviceName: httpbin
          servicePort: 80
"#;
    let out = cluster
        .kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], route)
        .unwrap();
    assert!(!out.success, "accepted an unknown op:\n{}", out.stdout);
    assert!(
        out.stderr
            .contains(r#"spec.http[0].match.exprs[0].op: Unsupported value: "Bogus""#),
        "{}",
        out.stderr
    );
    // The message lists what is allowed.
    assert!(
        out.stderr.contains(r#""RegexMatchCaseInsensitive""#),
        "{}",
        out.stderr
    );
    let get = cluster
        .kubectl(&["get", "ar", "bad-op", "-n", &ns])
        .unwrap();
    assert!(
        !get.success && get.stderr.contains("NotFound"),
        "{}",
        get.stderr
    );
}

#[test]
fn a_wrongly_typed_field_is_rejected_with_the_field_path() {
    let cluster = cluster();
    let ns = cluster.create_namespace("invalid").unwrap();
    let route = r#"apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata:
  name: bad-priority
spec:
  http:
    - name: rule1
      priority: high
      match:
        paths: ["/*"]
      backends:
        - serviceName: httpbin
          servicePort: 80
"#;
    let out = cluster
        .kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], route)
        .unwrap();
    assert!(!out.success, "accepted priority: high:\n{}", out.stdout);
    assert!(
        out.stderr.contains("spec.http[0].priority"),
        "{}",
        out.stderr
    );
}
