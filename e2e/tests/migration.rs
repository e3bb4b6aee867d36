//! The ingress-nginx migration path of docs/migrate-from-ingress-nginx.md on a real API
//! server: the Ingresses of `e2e/fixtures/ingress-nginx/shop.ingress.yaml` (class `nginx`,
//! ingress-nginx annotations) and what ingress2gateway v1.1.0 makes of them,
//! `shop.gateway.yaml`, applied as a user would, with the GatewayClass `nginx` the guide
//! tells them to create and the CA ConfigMap ingress2gateway asks for. Sluice runs with one
//! Service per Gateway (the chart's default), so the Gateway's ports 80 and 443 are its own.
//!
//! What each converted annotation must still do, checked as a client sees it:
//! `ssl-redirect` → 308 to https; TLS → served on 443 with the Ingress's certificate;
//! `upstream-vhost` → the Host the backend gets; `canary-by-header` → the canary for
//! `always`, the main backend otherwise; `enable-cors` / `cors-*` → a preflight answered by
//! the dataplane; `proxy-*-timeout` → 504 after 10 s; `backend-protocol: HTTPS` +
//! `proxy-ssl-*` → TLS to the backend, verified against the CA and `proxy-ssl-name`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_e2e::{Pipeline, eventually, http_get, http_get_with};
use sluice_testkit::pki::Ca;

const CONTROLLER: &str = "sluice.dev/gateway-controller";
const WAIT: Duration = Duration::from_secs(30);

/// A fixture of `e2e/fixtures/ingress-nginx/` with `{namespace}` filled in.
fn fixture(name: &str, ns: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/ingress-nginx")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .replace("{namespace}", ns)
}

fn get(p: &Pipeline, kind: &str, ns: &str, name: &str) -> Option<Value> {
    let out = p
        .cluster
        .kubectl(&["get", kind, name, "-n", ns, "-o", "json"])
        .ok()
        .filter(|o| o.success)?;
    serde_json::from_str(&out.stdout).ok()
}

/// `(status, reason)` of condition `ty` in `conditions`.
fn cond(conditions: &Value, ty: &str) -> Option<(String, String)> {
    let c = conditions.as_array()?.iter().find(|c| c["type"] == ty)?;
    Some((
        c["status"].as_str()?.to_owned(),
        c["reason"].as_str()?.to_owned(),
    ))
}

fn is_true(conditions: &Value, ty: &str) -> bool {
    cond(conditions, ty).is_some_and(|(s, _)| s == "True")
}

/// Waits until `probe` holds on the object; returns it.
fn wait_object(
    p: &Pipeline,
    kind: &str,
    ns: &str,
    name: &str,
    probe: impl Fn(&Value) -> bool,
) -> Value {
    let mut last = Value::Null;
    eventually(WAIT, || {
        let v = get(p, kind, ns, name)?;
        let ok = probe(&v);
        last = v.clone();
        ok.then_some(v)
    })
    .unwrap_or_else(|| panic!("timed out waiting for {kind} {name}; last: {last:#}"))
}

/// The dataplane port the Gateway Service of `ns/gateway` targets for `port`.
fn gateway_port(p: &Pipeline, ns: &str, gateway: &str, port: i64) -> Option<u16> {
    let out = p
        .cluster
        .kubectl(&[
            "get",
            "services",
            "-n",
            ns,
            "-l",
            "app.kubernetes.io/managed-by=sluice-gateway",
            "-o",
            "json",
        ])
        .ok()?;
    let v: Value = serde_json::from_str(&out.stdout).ok()?;
    let svc = v["items"].as_array()?.iter().find(|s| {
        s["metadata"]["annotations"]["gateway.sluice.dev/gateway"] == format!("{ns}/{gateway}")
    })?;
    let p = svc["spec"]["ports"]
        .as_array()?
        .iter()
        .find(|p| p["port"] == port)?;
    u16::try_from(p["targetPort"].as_i64()?).ok()
}

/// A response read by curl.
#[derive(Debug)]
struct Reply {
    status: u16,
    /// Names lower-cased.
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `method https://host:port/path` over HTTP/1.1 to 127.0.0.1, trusting `ca`; `None` when
/// the handshake or the exchange fails.
fn https(
    port: u16,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    ca: &Path,
) -> Option<Reply> {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sS", "-i", "--http1.1", "--max-time", "20", "-X", method])
        .arg("--cacert")
        .arg(ca)
        .arg("--resolve")
        .arg(format!("{host}:{port}:127.0.0.1"));
    for (n, v) in headers {
        cmd.args(["-H", &format!("{n}: {v}")]);
    }
    let out = cmd
        .arg(format!("https://{host}:{port}{path}"))
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some(Reply {
        status,
        headers,
        body: body.to_owned(),
    })
}

fn indented(text: &str, by: usize) -> String {
    let pad = " ".repeat(by);
    text.trim().lines().map(|l| format!("{pad}{l}\n")).collect()
}

/// A Service `name` (port 80 or 443 → `target`) with one ready endpoint at `addr`.
fn service(ns: &str, name: &str, port: u16, addr: std::net::Ipv4Addr, target: u16) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {ns}}}
spec:
  ports: [{{name: p, port: {port}, targetPort: {target}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: {ns}
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
endpoints:
  - addresses: ["{addr}"]
    conditions: {{ready: true}}
ports: [{{name: p, port: {target}}}]
"#
    )
}

#[test]
fn ingress2gateway_output_for_ingress_nginx_annotations_is_served() {
    let p = Pipeline::start_with_gateway_services("19500-19999").unwrap();
    let ns = p.namespace.clone();
    let dir = p.cluster.dir().join("migration");
    std::fs::create_dir_all(&dir).unwrap();

    // Backends: the canary (a second echo), and a TLS-only one whose certificate names
    // backend.e2e.internal (proxy-ssl-name), signed by the CA of proxy-ssl-secret.
    let _canary = p.net.spawn_echo("e2e-canary", p.net.addr(), 8081).unwrap();
    let backend_ca = Ca::new("backend ca");
    let leaf = backend_ca.leaf(&["backend.e2e.internal"]);
    std::fs::write(dir.join("backend.crt"), &leaf.pem).unwrap();
    std::fs::write(dir.join("backend.key"), &leaf.key_pem).unwrap();
    let listen = SocketAddr::from((p.net.addr(), 8443));
    let mut cmd = p.net.command("openssl");
    cmd.args(["s_server", "-quiet", "-www", "-accept"])
        .arg(listen.to_string())
        .arg("-cert")
        .arg(dir.join("backend.crt"))
        .arg("-key")
        .arg(dir.join("backend.key"));
    let _secure = p.net.spawn(cmd, listen, Duration::from_secs(10)).unwrap();
    let web_ca = Ca::new("web ca");
    let web = web_ca.leaf(&["web.example.com"]);
    let web_ca_file = dir.join("web-ca.crt");
    std::fs::write(&web_ca_file, &web_ca.pem).unwrap();

    // What the cluster already has: the Services, the Ingress's TLS Secret, the
    // proxy-ssl-secret (ca.crt), and the Ingresses themselves, of class nginx.
    p.cluster
        .apply(&format!(
            "{}---\n{}---\n\
apiVersion: v1\nkind: Secret\nmetadata: {{name: web-tls, namespace: {ns}}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}---\n\
apiVersion: v1\nkind: Secret\nmetadata: {{name: backend-ca, namespace: {ns}}}\nstringData:\n  ca.crt: |\n{}",
            service(&ns, "canary", 80, p.net.addr(), 8081),
            service(&ns, "secure", 443, p.net.addr(), 8443),
            indented(&web.chain_pem, 4),
            indented(&web.key_pem, 4),
            indented(&backend_ca.pem, 4),
        ))
        .unwrap();
    p.cluster.apply(&fixture("shop.ingress.yaml", &ns)).unwrap();

    // The guide's steps: a GatewayClass `nginx` of Sluice's, the CA as a ConfigMap, then
    // ingress2gateway's output unchanged.
    p.cluster
        .apply(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: nginx}}\nspec: {{controllerName: {CONTROLLER}}}\n---\n\
apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: backend-ca, namespace: {ns}}}\ndata:\n  ca.crt: |\n{}",
            indented(&backend_ca.pem, 4),
        ))
        .unwrap();
    p.cluster.apply(&fixture("shop.gateway.yaml", &ns)).unwrap();

    // Status: every object accepted, every reference resolved, no rule left out.
    wait_object(&p, "gateway", &ns, "nginx", |g| {
        let c = &g["status"]["conditions"];
        is_true(c, "Accepted")
            && is_true(c, "Programmed")
            && g["status"]["listeners"].as_array().is_some_and(|ls| {
                ls.len() == 3 && ls.iter().all(|l| is_true(&l["conditions"], "ResolvedRefs"))
            })
    });
    for route in [
        "api-api-example-com",
        "web-web-example-com",
        "web-web-example-com-http",
    ] {
        let r = wait_object(&p, "httproute", &ns, route, |r| {
            r["status"]["parents"].as_array().is_some_and(|ps| {
                ps.iter().any(|e| {
                    e["controllerName"] == CONTROLLER
                        && is_true(&e["conditions"], "Accepted")
                        && is_true(&e["conditions"], "ResolvedRefs")
                })
            })
        });
        let ours = r["status"]["parents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["controllerName"] == CONTROLLER)
            .unwrap();
        assert!(
            cond(&ours["conditions"], "PartiallyInvalid").is_none_or(|(s, _)| s == "False"),
            "{route}: {r:#}"
        );
    }
    wait_object(&p, "backendtlspolicy", &ns, "secure-backend-tls", |v| {
        v["status"]["ancestors"].as_array().is_some_and(|a| {
            a.iter().any(|e| {
                e["controllerName"] == CONTROLLER
                    && is_true(&e["conditions"], "Accepted")
                    && is_true(&e["conditions"], "ResolvedRefs")
            })
        })
    });

    let http =
        eventually(WAIT, || gateway_port(&p, &ns, "nginx", 80)).expect("port 80 of the Gateway");
    let tls =
        eventually(WAIT, || gateway_port(&p, &ns, "nginx", 443)).expect("port 443 of the Gateway");
    let at = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));

    // The Ingresses of class nginx stay ingress-nginx's: Sluice's own port does not serve them.
    assert_eq!(
        http_get(p.http, "web.example.com", "/").unwrap().status,
        404
    );

    // ssl-redirect: plain HTTP to the TLS host is a 308 to https.
    let r = eventually(WAIT, || {
        http_get(at(http), "web.example.com", "/cart?x=1")
            .ok()
            .filter(|r| r.status == 308)
    })
    .expect("port 80 redirects web.example.com");
    assert_eq!(
        r.header("location"),
        Some("https://web.example.com/cart?x=1"),
        "{r:?}"
    );

    // TLS with the Ingress's certificate; upstream-vhost is the Host the backend sees.
    let get = |path: &str, headers: &[(&str, &str)]| {
        https(tls, "web.example.com", "GET", path, headers, &web_ca_file)
    };
    let r = eventually(WAIT, || get("/hello", &[]).filter(|r| r.status == 200))
        .expect("https://web.example.com/hello");
    assert_eq!(r.header("x-echo-server"), Some("e2e-echo"), "{r:?}");
    let echoed: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(echoed["headers"]["host"], "web.internal", "{echoed:#}");

    // canary-by-header: `always` → the canary, `never` or none → the main backend.
    for (value, server) in [
        (Some("always"), "e2e-canary"),
        (Some("never"), "e2e-echo"),
        (None, "e2e-echo"),
    ] {
        let headers: Vec<(&str, &str)> = value.map(|v| ("X-Canary", v)).into_iter().collect();
        let r = get("/c", &headers).unwrap();
        assert_eq!(
            (r.status, r.header("x-echo-server")),
            (200, Some(server)),
            "X-Canary {value:?}: {r:?}"
        );
    }

    // enable-cors + cors-*: the preflight is the dataplane's, with the configured values.
    let preflight = |origin: &str| {
        https(
            tls,
            "web.example.com",
            "OPTIONS",
            "/api",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "PUT"),
                ("Access-Control-Request-Headers", "x-token"),
            ],
            &web_ca_file,
        )
        .unwrap()
    };
    let r = preflight("https://app.example.com");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.header("x-echo-server"),
        None,
        "the backend answered the preflight: {r:?}"
    );
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(r.header("access-control-allow-methods"), Some("GET, PUT"));
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(r.header("access-control-max-age"), Some("600"));
    let r = preflight("https://elsewhere.example.org");
    assert_eq!(r.header("access-control-allow-origin"), None, "{r:?}");

    // proxy-*-timeout "1" → timeouts.request 10s: a backend that takes 15 s is a 504 at 10 s.
    let started = Instant::now();
    let r = get("/delay/15000", &[]).expect("an answer before curl's 20 s");
    let took = started.elapsed();
    assert_eq!(r.status, 504, "{r:?}");
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(14),
        "{took:?}"
    );

    // backend-protocol HTTPS + proxy-ssl-*: TLS to the backend, verified (it speaks only TLS).
    let r = eventually(WAIT, || {
        http_get_with(at(http), "api.example.com", "/", &[])
            .ok()
            .filter(|r| r.status == 200)
    })
    .expect("api.example.com through the BackendTLSPolicy");
    assert!(
        r.body.contains("s_server"),
        "the TLS backend answered: {:?}",
        r.body
    );
}
