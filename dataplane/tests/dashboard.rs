//! The Grafana dashboard the chart ships (charts/sluice/dashboards/sluice-apisix.json, the
//! panels and queries of the APISIX dashboard grafana.com 11719) against a real standalone
//! `sluice-dataplane` serving real requests: every metric selector in every panel query and
//! every `label_values` variable finds a series on `/metrics`, except the families that
//! docs/observability.md says have no data by design. Driven from the committed JSON, so a
//! change that drops a metric or a label the dashboard needs fails here. Also the stand-ins
//! for APISIX's etcd metrics: `apisix_etcd_modify_indexes` and `apisix_etcd_reachable`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Wait, eventually_async, free_port, get, listening, sample};
use http::StatusCode;
use regex::Regex;
use sluice_testkit::EchoServer;

/// Metric families the dashboard queries that Sluice does not export, by design (see
/// docs/observability.md): it has no nginx shared dicts.
const NO_DATA_BY_DESIGN: &[&str] = &[
    "apisix_shared_dict_capacity_bytes",
    "apisix_shared_dict_free_space_bytes",
];

/// Labels Prometheus adds to every scraped series (not on `/metrics` itself).
const TARGET_LABELS: &[&str] = &["instance", "job"];

fn dashboard() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../charts/sluice/dashboards/sluice-apisix.json");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Every panel query of the dashboard (rows' nested panels included), with the panel title.
fn panel_queries(d: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(panels: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("").to_owned();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = t["expr"].as_str() {
                    out.push((title.clone(), expr.to_owned()));
                }
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&d["panels"], &mut out);
    out
}

/// `label_values(metric, label)` of every query variable.
fn variable_queries(d: &serde_json::Value) -> Vec<(String, String, String)> {
    let re = Regex::new(r"^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_]+)\s*\)$")
        .unwrap();
    let mut out = Vec::new();
    for v in d["templating"]["list"].as_array().unwrap() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .unwrap();
        let c = re
            .captures(q)
            .unwrap_or_else(|| panic!("variable {}: not label_values(m, l): {q}", v["name"]));
        out.push((
            v["name"].as_str().unwrap().to_owned(),
            c[1].into(),
            c[2].into(),
        ));
    }
    out
}

/// One label matcher of a selector.
#[derive(Debug)]
struct Matcher {
    label: String,
    op: String,
    value: String,
}

impl Matcher {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        // As PromQL: a missing label is the empty string; regexes are anchored.
        let v = labels.get(&self.label).map_or("", String::as_str);
        let re = || Regex::new(&format!("^(?:{})$", self.value)).unwrap();
        match self.op.as_str() {
            "=" => v == self.value,
            "!=" => v != self.value,
            "=~" => re().is_match(v),
            "!~" => !re().is_match(v),
            op => panic!("matcher op {op}"),
        }
    }
}

/// The metric selectors `name{matchers}` of a PromQL expression, with the dashboard's
/// variables set as Grafana does for "All" (`.*`).
fn selectors(expr: &str) -> Vec<(String, Vec<Matcher>)> {
    let expr = Regex::new(r"\$(service|route|instance|consumer|node)\b")
        .unwrap()
        .replace_all(expr, ".*");
    let sel = Regex::new(r"\b(apisix_[a-z_]+)\s*(\{([^}]*)\})?").unwrap();
    let m = Regex::new(r#"\s*([a-zA-Z_]+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?"#).unwrap();
    sel.captures_iter(&expr)
        .map(|c| {
            let matchers = c
                .get(3)
                .map(|body| {
                    m.captures_iter(body.as_str())
                        .map(|mc| Matcher {
                            label: mc[1].into(),
                            op: mc[2].into(),
                            value: mc[3].into(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            (c[1].to_owned(), matchers)
        })
        .collect()
}

/// The samples of an exposition: (name, labels).
fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>)> {
    let label = Regex::new(r#"([a-zA-Z_]+)="((?:[^"\\]|\\.)*)""#).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (series, _value) = l.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = label
                .captures_iter(labels)
                .map(|c| (c[1].to_owned(), c[2].to_owned()))
                .collect();
            (name.to_owned(), labels)
        })
        .collect()
}

struct Proc {
    child: Child,
    http: SocketAddr,
    admin: SocketAddr,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start(config: &Path) -> Proc {
    let http = free_port();
    let admin = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_sluice-dataplane"))
        .arg("--standalone")
        .arg(config)
        .args([
            "--listen-http",
            &http.to_string(),
            "--listen-https",
            "127.0.0.1:0",
            "--admin",
            &admin.to_string(),
            "--workers",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let p = Proc { child, http, admin };
    assert!(
        listening(admin, Duration::from_secs(10)).await,
        "dataplane did not start"
    );
    p
}

/// Scrapes `/metrics` until `cond` holds (bounded); returns the last exposition.
async fn wait_metrics(p: &Proc, what: &str, cond: impl Fn(&str) -> bool) -> String {
    let (admin, cond) = (p.admin, &cond);
    eventually_async(
        Wait::up_to(Duration::from_secs(10)).every(Duration::from_millis(50)),
        || async move {
            let text = get(admin, "admin", "/metrics").await.text();
            if cond(&text) { Ok(text) } else { Err(text) }
        },
    )
    .await
    .unwrap_or_else(|text| panic!("timed out waiting for {what}; /metrics:\n{text}"))
}

fn backend_yaml(port: u16) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  ports: [{{name: http, port: 80, targetPort: {port}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
endpoints:
  - addresses: ["127.0.0.1"]
    conditions: {{ready: true}}
ports: [{{name: http, port: {port}}}]
"#
    )
}

fn routes_yaml(api_path: &str) -> String {
    format!(
        r#"apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: shop, namespace: default}}
spec:
  http:
    - name: api
      match:
        paths: ["{api_path}", "/status/*"]
      backends:
        - serviceName: web
          servicePort: 80
      plugins:
        - name: prometheus
          enable: true
    - name: static
      match:
        paths: ["/static/*"]
      backends:
        - serviceName: web
          servicePort: 80
      plugins:
        - name: prometheus
          enable: true
"#
    )
}

fn index(text: &str, key: &str) -> Option<f64> {
    sample(
        text,
        &format!("apisix_etcd_modify_indexes{{key=\"{key}\"}}"),
    )
}

#[tokio::test]
async fn every_series_the_dashboard_queries_is_on_metrics() {
    let echo = EchoServer::start("web", "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("backend.yaml"),
        backend_yaml(echo.addr.port()),
    )
    .unwrap();
    std::fs::write(dir.path().join("routes.yaml"), routes_yaml("/api/*")).unwrap();
    let p = start(dir.path()).await;
    wait_metrics(&p, "the first snapshot", |t| {
        sample(t, "sluice_snapshot_version") == Some(1.0)
    })
    .await;

    // Real traffic: successes, upstream 4xx and 5xx, and a request no route matches.
    for path in [
        "/api/a",
        "/api/b",
        "/static/x.css",
        "/status/404",
        "/status/503",
    ] {
        get(p.http, "shop.example", path).await;
    }
    assert_eq!(
        get(p.http, "shop.example", "/nowhere").await.status,
        StatusCode::NOT_FOUND
    );
    let text = get(p.admin, "admin", "/metrics").await.text();
    let all = samples(&text);

    let d = dashboard();
    let queries = panel_queries(&d);
    assert!(queries.len() >= 20, "{queries:?}");
    let mut missing = Vec::new();
    let mut by_design_seen = Vec::new();
    for (title, expr) in &queries {
        for (name, matchers) in selectors(expr) {
            if NO_DATA_BY_DESIGN.contains(&name.as_str()) {
                assert!(
                    !all.iter().any(|(n, _)| *n == name),
                    "{name} is exported now: move it out of NO_DATA_BY_DESIGN and the docs"
                );
                by_design_seen.push(name);
                continue;
            }
            let found = all
                .iter()
                .any(|(n, l)| *n == name && matchers.iter().all(|m| m.matches(l)));
            if !found {
                missing.push(format!("panel {title:?}: {name}{matchers:?} in {expr}"));
            }
        }
    }
    for (var, metric, label) in variable_queries(&d) {
        let has = all.iter().any(|(n, l)| {
            *n == metric && (TARGET_LABELS.contains(&label.as_str()) || l.contains_key(&label))
        });
        if !has {
            missing.push(format!("variable ${var}: label_values({metric},{label})"));
        }
    }
    assert!(
        missing.is_empty(),
        "the dashboard queries series /metrics lacks:\n{}\n/metrics:\n{text}",
        missing.join("\n")
    );
    by_design_seen.sort();
    by_design_seen.dedup();
    assert_eq!(by_design_seen, NO_DATA_BY_DESIGN, "stale NO_DATA_BY_DESIGN");

    // The panels have something to show: the traffic above, per route and status.
    for (code, n) in [("200", 2.0), ("404", 1.0), ("503", 1.0)] {
        let count: f64 = text
            .lines()
            .filter(|l| {
                l.starts_with(&format!(
                    "apisix_http_status{{code=\"{code}\",route=\"default/shop/api\","
                ))
            })
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        assert_eq!(count, n, "code {code}\n{text}");
    }

    // Stand-ins for etcd: the files are readable, and every kind got version 1.
    assert_eq!(sample(&text, "apisix_etcd_reachable"), Some(1.0), "{text}");
    for key in [
        "consumers",
        "global_rules",
        "routes",
        "ssls",
        "upstreams",
        "max_modify_index",
    ] {
        assert_eq!(index(&text, key), Some(1.0), "{key}\n{text}");
    }
    assert_eq!(
        sample(&text, "apisix_nginx_metric_errors_total"),
        Some(0.0),
        "{text}"
    );

    // A change to a route only: routes and max_modify_index move to version 2, the
    // upstreams keep the version that last changed them.
    std::fs::write(dir.path().join("routes.yaml"), routes_yaml("/v2/api/*")).unwrap();
    let text = wait_metrics(&p, "the route change", |t| {
        index(t, "max_modify_index") == Some(2.0)
    })
    .await;
    assert_eq!(index(&text, "routes"), Some(2.0), "{text}");
    assert_eq!(index(&text, "upstreams"), Some(1.0), "{text}");
    assert_eq!(index(&text, "consumers"), Some(1.0), "{text}");

    // Files that cannot be read as configuration: the source is unreachable, the last good
    // snapshot keeps serving; fixing them makes it reachable again.
    std::fs::write(dir.path().join("broken.yaml"), "kind: [unclosed\n  - {").unwrap();
    wait_metrics(&p, "unreachable", |t| {
        sample(t, "apisix_etcd_reachable") == Some(0.0)
    })
    .await;
    assert_eq!(
        get(p.http, "shop.example", "/v2/api/x").await.status,
        StatusCode::OK
    );
    std::fs::remove_file(dir.path().join("broken.yaml")).unwrap();
    wait_metrics(&p, "reachable again", |t| {
        sample(t, "apisix_etcd_reachable") == Some(1.0)
    })
    .await;
}

#[test]
fn the_selector_parser_reads_the_dashboards_forms() {
    let s = selectors(
        r#"sum(irate(apisix_bandwidth{type="ingress", service =~"$service",route=~"$route"}[$__rate_interval])) by (route)"#,
    );
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].0, "apisix_bandwidth");
    let m: Vec<(&str, &str, &str)> = s[0]
        .1
        .iter()
        .map(|m| (m.label.as_str(), m.op.as_str(), m.value.as_str()))
        .collect();
    assert_eq!(
        m,
        [
            ("type", "=", "ingress"),
            ("service", "=~", ".*"),
            ("route", "=~", ".*")
        ]
    );
    let s = selectors(
        "(apisix_shared_dict_free_space_bytes * 100) / on (name) apisix_shared_dict_capacity_bytes",
    );
    let names: Vec<&str> = s.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "apisix_shared_dict_free_space_bytes",
            "apisix_shared_dict_capacity_bytes"
        ]
    );
    // A selector whose label value does not match finds nothing.
    let labels: BTreeMap<String, String> = [("type".to_owned(), "egress".to_owned())].into();
    assert!(!selectors(r#"apisix_bandwidth{type="ingress"}"#)[0].1[0].matches(&labels));
    assert!(selectors(r#"apisix_bandwidth{instance=~"$instance"}"#)[0].1[0].matches(&labels));
}
