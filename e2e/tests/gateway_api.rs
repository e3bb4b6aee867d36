//! Gateway API end to end: the vendored Gateway API CRDs (`crds/gateway-api/`) in a real
//! kube-apiserver, `kubectl apply` of GatewayClass / Gateway / HTTPRoute / GRPCRoute /
//! ReferenceGrant → the `sluice-controller` binary (running with exactly the chart's RBAC) →
//! gRPC → the `sluice-dataplane` binary → real backends in a network namespace. Every case
//! checks what a user sees: the status read back from the API server and the traffic.
//!
//! The Gateway listens on port 80, the fleet's HTTP port (`--gateway-http-port`, default
//! 80, the dataplane Service's port); the test reaches the dataplane's listener directly,
//! as the Service would forward port 80 to it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use sluice_e2e::{Pipeline, eventually, http_get};

const CONTROLLER: &str = "sluice.dev/gateway-controller";
const WAIT: Duration = Duration::from_secs(30);

/// The object as JSON, read back with kubectl.
fn get(p: &Pipeline, kind: &str, ns: Option<&str>, name: &str) -> Option<Value> {
    let mut args = vec!["get", kind, name, "-o", "json"];
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    let out = p.cluster.kubectl(&args).ok().filter(|o| o.success)?;
    serde_json::from_str(&out.stdout).ok()
}

/// `(status, reason, observedGeneration)` of condition `ty` in `conditions`.
fn cond(conditions: &Value, ty: &str) -> Option<(String, String, i64)> {
    let c = conditions.as_array()?.iter().find(|c| c["type"] == ty)?;
    Some((
        c["status"].as_str()?.to_owned(),
        c["reason"].as_str()?.to_owned(),
        c["observedGeneration"].as_i64()?,
    ))
}

/// Waits until `probe` on the object's JSON holds; returns the JSON.
fn wait_object(
    p: &Pipeline,
    kind: &str,
    ns: Option<&str>,
    name: &str,
    what: &str,
    probe: impl Fn(&Value) -> bool,
) -> Value {
    let mut last = Value::Null;
    eventually(WAIT, || {
        let v = get(p, kind, ns, name)?;
        let ok = probe(&v);
        last = v.clone();
        ok.then_some(v)
    })
    .unwrap_or_else(|| panic!("timed out waiting for {kind} {name}: {what}; last: {last:#}"))
}

/// Our `status.parents[]` entry of a route.
fn our_parent(route: &Value) -> Option<&Value> {
    route["status"]["parents"]
        .as_array()?
        .iter()
        .find(|e| e["controllerName"] == CONTROLLER)
}

fn parent_cond(route: &Value, ty: &str) -> Option<(String, String, i64)> {
    cond(&our_parent(route)?["conditions"], ty)
}

fn generation(obj: &Value) -> i64 {
    obj["metadata"]["generation"].as_i64().unwrap()
}

fn wait_http(addr: SocketAddr, host: &str, path: &str, want: u16) -> sluice_e2e::HttpResponse {
    let mut last = None;
    eventually(WAIT, || {
        let r = http_get(addr, host, path).ok();
        last = r.as_ref().map(|r| r.status);
        r.filter(|r| r.status == want)
    })
    .unwrap_or_else(|| panic!("timed out waiting for {host}{path} to answer {want}; last {last:?}"))
}

fn class_and_gateway(ns: &str, from: &str) -> String {
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: sluice}}
spec: {{controllerName: {CONTROLLER}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: {ns}}}
spec:
  gatewayClassName: sluice
  listeners:
    - name: http
      protocol: HTTP
      port: 80
      allowedRoutes: {{namespaces: {{from: {from}}}}}
"#
    )
}

fn http_route(ns: &str, name: &str, gw_ns: &str, hosts: &[&str], backend: &str) -> String {
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: {ns}}}
spec:
  parentRefs: [{{name: gw, namespace: {gw_ns}}}]
  hostnames: {hosts:?}
  rules:
    - matches: [{{path: {{type: PathPrefix, value: /}}}}]
      backendRefs: [{backend}]
"#
    )
}

#[test]
fn http_route_serves_through_a_gateway_and_every_status_says_so() {
    let p = Pipeline::start_with_gateway_api(&[]).unwrap();
    let ns = p.namespace.clone();
    p.cluster.apply(&class_and_gateway(&ns, "Same")).unwrap();
    p.cluster
        .apply(&http_route(
            &ns,
            "web",
            &ns,
            &["gw.e2e"],
            "{name: echo, port: 80}",
        ))
        .unwrap();

    // Traffic through the dataplane to the echo backend.
    let resp = wait_http(p.http, "gw.e2e", "/hello", 200);
    assert_eq!(resp.header("x-echo-server"), Some("e2e-echo"));

    // GatewayClass: Accepted, with the features we support.
    let class = wait_object(&p, "gatewayclass", None, "sluice", "Accepted=True", |c| {
        cond(&c["status"]["conditions"], "Accepted").is_some_and(|(s, _, _)| s == "True")
    });
    let (_, _, og) = cond(&class["status"]["conditions"], "Accepted").unwrap();
    assert_eq!(og, generation(&class));
    let features: Vec<&str> = class["status"]["supportedFeatures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(
        features.contains(&"HTTPRoute") && features.contains(&"GRPCRoute"),
        "{features:?}"
    );

    // Gateway: Accepted and Programmed (the dataplane ACKed it), one route attached.
    let gw = wait_object(
        &p,
        "gateway",
        Some(&ns),
        "gw",
        "Accepted and Programmed, the route attached",
        |g| {
            let c = &g["status"]["conditions"];
            // NB: the Gateway may be Programmed before the route is seen (0 attached).
            cond(c, "Accepted").is_some_and(|(s, _, _)| s == "True")
                && cond(c, "Programmed").is_some_and(|(s, _, _)| s == "True")
                && g["status"]["listeners"][0]["attachedRoutes"] == 1
        },
    );
    let c = &gw["status"]["conditions"];
    assert_eq!(
        cond(c, "Programmed").unwrap(),
        ("True".into(), "Programmed".into(), generation(&gw))
    );
    let listener = &gw["status"]["listeners"][0];
    assert_eq!(listener["name"], "http");
    assert_eq!(listener["attachedRoutes"], 1, "{gw:#}");
    assert_eq!(listener["supportedKinds"][0]["kind"], "HTTPRoute", "{gw:#}");
    for ty in ["Accepted", "Programmed", "ResolvedRefs"] {
        assert_eq!(
            cond(&listener["conditions"], ty).map(|c| c.0),
            Some("True".into()),
            "listener {ty}: {gw:#}"
        );
    }
    let transition = |g: &Value| -> String {
        g["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Accepted")
            .unwrap()["lastTransitionTime"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let accepted_since = transition(&gw);

    // The route's parent entry: ours, Accepted and ResolvedRefs at generation 1.
    let route = wait_object(&p, "httproute", Some(&ns), "web", "parent Accepted", |r| {
        parent_cond(r, "Accepted").is_some_and(|(s, _, _)| s == "True")
    });
    assert_eq!(generation(&route), 1);
    assert_eq!(
        parent_cond(&route, "Accepted").unwrap(),
        ("True".into(), "Accepted".into(), 1)
    );
    assert_eq!(
        parent_cond(&route, "ResolvedRefs").unwrap(),
        ("True".into(), "ResolvedRefs".into(), 1)
    );
    assert_eq!(our_parent(&route).unwrap()["parentRef"]["name"], "gw");

    // Edit the route: generation 2, observedGeneration follows, the new host serves.
    p.cluster
        .kubectl_ok(&[
            "patch",
            "httproute",
            "web",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"hostnames":["gw.e2e","gw2.e2e"]}}"#,
        ])
        .unwrap();
    let route = wait_object(
        &p,
        "httproute",
        Some(&ns),
        "web",
        "observedGeneration 2",
        |r| parent_cond(r, "Accepted").is_some_and(|(_, _, g)| g == 2),
    );
    assert_eq!(generation(&route), 2);
    assert_eq!(
        parent_cond(&route, "ResolvedRefs").unwrap(),
        ("True".into(), "ResolvedRefs".into(), 2)
    );
    wait_http(p.http, "gw2.e2e", "/", 200);
    // The Gateway was Programmed again for the new content; Accepted never changed.
    let gw = wait_object(&p, "gateway", Some(&ns), "gw", "Programmed", |g| {
        cond(&g["status"]["conditions"], "Programmed").is_some_and(|(s, _, _)| s == "True")
    });
    assert_eq!(transition(&gw), accepted_since, "lastTransitionTime kept");

    // A route from a namespace the listener does not allow (from: Same): not accepted, not
    // served.
    let other = p.cluster.create_namespace("other").unwrap();
    p.cluster
        .apply(&http_route(
            &other,
            "intruder",
            &ns,
            &["intruder.e2e"],
            "{name: echo, port: 80}",
        ))
        .unwrap();
    let intruder = wait_object(
        &p,
        "httproute",
        Some(&other),
        "intruder",
        "parent Accepted=False",
        |r| parent_cond(r, "Accepted").is_some_and(|(s, _, _)| s == "False"),
    );
    assert_eq!(
        parent_cond(&intruder, "Accepted").unwrap().1,
        "NotAllowedByListeners"
    );
    assert_eq!(http_get(p.http, "intruder.e2e", "/").unwrap().status, 404);
    let gw = get(&p, "gateway", Some(&ns), "gw").unwrap();
    assert_eq!(gw["status"]["listeners"][0]["attachedRoutes"], 1, "{gw:#}");

    // The route moves to a Gateway that is not ours: our parent entry goes, nothing is
    // attached any more, the host is no longer served.
    p.cluster
        .kubectl_ok(&[
            "patch",
            "httproute",
            "web",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"parentRefs":[{"name":"elsewhere"}]}}"#,
        ])
        .unwrap();
    wait_object(
        &p,
        "httproute",
        Some(&ns),
        "web",
        "no parent of ours",
        |r| our_parent(r).is_none(),
    );
    wait_object(&p, "gateway", Some(&ns), "gw", "no attached route", |g| {
        g["status"]["listeners"][0]["attachedRoutes"] == 0
    });
    wait_http(p.http, "gw.e2e", "/", 404);
}

#[test]
fn a_cross_namespace_backend_needs_a_reference_grant() {
    let p = Pipeline::start_with_gateway_api(&[]).unwrap();
    let ns = p.namespace.clone();
    p.cluster.apply(&class_and_gateway(&ns, "All")).unwrap();
    let apps = p.cluster.create_namespace("apps").unwrap();
    let backend = format!("{{name: echo, namespace: {ns}, port: 80}}");
    p.cluster
        .apply(&http_route(&apps, "app", &ns, &["app.e2e"], &backend))
        .unwrap();

    // Attached (the listener allows every namespace) but the backend is not permitted.
    let route = wait_object(
        &p,
        "httproute",
        Some(&apps),
        "app",
        "ResolvedRefs=False",
        |r| parent_cond(r, "ResolvedRefs").is_some_and(|(s, _, _)| s == "False"),
    );
    assert_eq!(
        parent_cond(&route, "ResolvedRefs").unwrap().1,
        "RefNotPermitted"
    );
    assert_eq!(parent_cond(&route, "Accepted").unwrap().0, "True");
    wait_http(p.http, "app.e2e", "/", 500);

    // The Service's namespace grants it: resolved, served.
    p.cluster
        .apply(&format!(
            r#"apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {{name: routes-from-apps, namespace: {ns}}}
spec:
  from: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: {apps}}}]
  to: [{{group: "", kind: Service}}]
"#
        ))
        .unwrap();
    let resp = wait_http(p.http, "app.e2e", "/", 200);
    assert_eq!(resp.header("x-echo-server"), Some("e2e-echo"));
    let route = wait_object(
        &p,
        "httproute",
        Some(&apps),
        "app",
        "ResolvedRefs=True",
        |r| parent_cond(r, "ResolvedRefs").is_some_and(|(s, _, _)| s == "True"),
    );
    assert_eq!(
        parent_cond(&route, "ResolvedRefs").unwrap(),
        ("True".into(), "ResolvedRefs".into(), 1)
    );
}

/// The CORS filter and a backendRef's own filter, applied to the real API server (so the
/// vendored CRDs' schema accepts them) and served: a preflight is answered by the dataplane
/// (the echo backend never sees it), the actual request gets the CORS headers, and the
/// backendRef's request header reaches the backend.
#[test]
fn cors_preflight_and_a_backend_ref_header() {
    let p = Pipeline::start_with_gateway_api(&[]).unwrap();
    let ns = p.namespace.clone();
    p.cluster.apply(&class_and_gateway(&ns, "Same")).unwrap();
    p.cluster
        .apply(&format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: cors, namespace: {ns}}}
spec:
  parentRefs: [{{name: gw}}]
  hostnames: [cors.e2e]
  rules:
    - matches: [{{path: {{type: PathPrefix, value: /}}}}]
      filters:
        - type: CORS
          cors:
            allowOrigins: ["https://*.example.com"]
            allowMethods: [GET, PUT]
            allowHeaders: [x-token]
            allowCredentials: true
            maxAge: 600
      backendRefs:
        - name: echo
          port: 80
          filters:
            - type: RequestHeaderModifier
              requestHeaderModifier: {{set: [{{name: X-Backend-Ref, value: echo}}]}}
"#
        ))
        .unwrap();
    let route = wait_object(&p, "httproute", Some(&ns), "cors", "Accepted=True", |r| {
        parent_cond(r, "Accepted").is_some_and(|(s, _, _)| s == "True")
    });
    assert_eq!(
        parent_cond(&route, "ResolvedRefs").map(|c| c.0),
        Some("True".into())
    );
    let actual = wait_http(p.http, "cors.e2e", "/actual", 200);
    // The backendRef's filter: the header reached the backend.
    let echoed: Value = serde_json::from_str(&actual.body).unwrap();
    assert_eq!(echoed["headers"]["x-backend-ref"], "echo", "{echoed:#}");

    let preflight = |origin: &str| {
        sluice_e2e::http_request(
            p.http,
            "OPTIONS",
            "cors.e2e",
            "/actual",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "PUT"),
                ("Access-Control-Request-Headers", "x-token"),
            ],
            b"",
        )
        .unwrap()
    };
    let r = preflight("https://app.example.com");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.header("x-echo-server"),
        None,
        "the backend answered: {r:?}"
    );
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(r.header("access-control-allow-methods"), Some("GET, PUT"));
    assert_eq!(r.header("access-control-allow-headers"), Some("x-token"));
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(r.header("access-control-max-age"), Some("600"));
    let r = preflight("https://example.org");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("access-control-allow-origin"), None, "{r:?}");

    // The actual request: from the backend, with the CORS headers.
    let r = sluice_e2e::http_request(
        p.http,
        "GET",
        "cors.e2e",
        "/actual",
        &[("Origin", "https://app.example.com")],
        b"",
    )
    .unwrap();
    assert_eq!(r.header("x-echo-server"), Some("e2e-echo"), "{r:?}");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(r.header("vary"), Some("Origin"));
}

/// A gRPC unary call `sluice.test.v1.Echo/Unary` with message `msg`, made with curl over
/// h2c (prior knowledge); returns (response headers and trailers, body).
fn grpc_unary(addr: SocketAddr, host: &str, msg: &str) -> Option<(String, Vec<u8>)> {
    // EchoRequest { message = 1 }: field 1, wire type 2.
    let mut pb = vec![0x0a, u8::try_from(msg.len()).ok()?];
    pb.extend_from_slice(msg.as_bytes());
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(pb.len()).ok()?.to_be_bytes());
    frame.extend_from_slice(&pb);
    let dir = tempfile_dir();
    let (req, headers) = (dir.join("req.bin"), dir.join("headers.txt"));
    std::fs::write(&req, &frame).ok()?;
    let out = std::process::Command::new("curl")
        .args(["-s", "--max-time", "5", "--http2-prior-knowledge"])
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .args(["-H", &format!("host: {host}")])
        .arg("--data-binary")
        .arg(format!("@{}", req.display()))
        .arg("-D")
        .arg(&headers)
        .arg(format!("http://{addr}/sluice.test.v1.Echo/Unary"))
        .output()
        .ok()?;
    let head = std::fs::read_to_string(&headers).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    out.status.success().then_some((head, out.stdout))
}

fn tempfile_dir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sluice-e2e-grpc-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn grpc_route_proxies_a_real_grpc_call() {
    let p = Pipeline::start_with_gateway_api(&[]).unwrap();
    let ns = p.namespace.clone();
    let bin = sluice_e2e::workspace_bin("sluice-testkit", "sluice-grpc-echo").unwrap();
    let listen = SocketAddr::from((p.net.addr(), 50051));
    let mut cmd = p.net.command(bin);
    cmd.args(["--listen", &listen.to_string(), "--name", "e2e-grpc"]);
    let _grpc = p.net.spawn(cmd, listen, Duration::from_secs(10)).unwrap();
    p.cluster.apply(&class_and_gateway(&ns, "Same")).unwrap();
    p.cluster
        .apply(&format!(
            r#"apiVersion: v1
kind: Service
metadata: {{name: grpc, namespace: {ns}}}
spec:
  ports: [{{name: grpc, port: 50051, targetPort: 50051}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: grpc-1
  namespace: {ns}
  labels: {{kubernetes.io/service-name: grpc}}
addressType: IPv4
endpoints:
  - addresses: ["{addr}"]
    conditions: {{ready: true}}
ports: [{{name: grpc, port: 50051}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: echo, namespace: {ns}}}
spec:
  parentRefs: [{{name: gw}}]
  hostnames: [grpc.e2e]
  rules:
    - matches: [{{method: {{service: sluice.test.v1.Echo, method: Unary}}}}]
      backendRefs: [{{name: grpc, port: 50051}}]
"#,
            addr = p.net.addr()
        ))
        .unwrap();

    let (head, body) = eventually(WAIT, || {
        grpc_unary(p.http, "grpc.e2e", "hello-grpc").filter(|(h, _)| h.contains("grpc-status: 0"))
    })
    .expect("a gRPC call through the GRPCRoute");
    assert!(
        head.contains("x-echo-server: e2e-grpc"),
        "served by the gRPC backend: {head}"
    );
    assert!(
        String::from_utf8_lossy(&body).contains("hello-grpc"),
        "echoed message: {body:?}"
    );
    let route = wait_object(&p, "grpcroute", Some(&ns), "echo", "parent Accepted", |r| {
        parent_cond(r, "Accepted").is_some_and(|(s, _, _)| s == "True")
    });
    assert_eq!(
        parent_cond(&route, "ResolvedRefs").unwrap(),
        ("True".into(), "ResolvedRefs".into(), 1)
    );
    let gw = wait_object(&p, "gateway", Some(&ns), "gw", "Programmed", |g| {
        cond(&g["status"]["conditions"], "Programmed").is_some_and(|(s, _, _)| s == "True")
    });
    assert_eq!(gw["status"]["listeners"][0]["attachedRoutes"], 1, "{gw:#}");
}

#[test]
fn without_the_gateway_api_crds_the_controller_still_serves_apisix_routes() {
    let mut p = Pipeline::start().unwrap();
    assert!(!p.has_gateway_api(), "this API server has no Gateway API");
    p.cluster.apply(&p.route_yaml("demo", "/hello*")).unwrap();
    let resp = wait_http(p.http, "demo.e2e", "/hello", 200);
    assert_eq!(resp.header("x-echo-server"), Some("e2e-echo"));
    let ns = p.namespace.clone();
    wait_object(&p, "ar", Some(&ns), "demo", "Programmed=True", |r| {
        cond(&r["status"]["conditions"], "Programmed").is_some_and(|(s, _, _)| s == "True")
    });
    // Still running (no crash loop), still serving changes.
    std::thread::sleep(Duration::from_secs(2));
    let controller = p.controller.as_mut().unwrap();
    assert!(controller.is_running(), "the controller exited");
    p.cluster.apply(&p.route_yaml("demo", "/other*")).unwrap();
    wait_http(p.http, "demo.e2e", "/other", 200);
}

/// The Gateway Services the controller manages in `ns`, as JSON.
fn gateway_services(p: &Pipeline, ns: &str) -> Vec<Value> {
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
        .unwrap();
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
    v["items"].as_array().cloned().unwrap_or_default()
}

/// The target port of `port` in the Gateway Service of `ns/name`.
fn target_of(services: &[Value], gateway: &str, port: i64) -> Option<u16> {
    let svc = services
        .iter()
        .find(|s| s["metadata"]["annotations"]["gateway.sluice.dev/gateway"] == gateway)?;
    let p = svc["spec"]["ports"]
        .as_array()?
        .iter()
        .find(|p| p["port"] == port)?;
    u16::try_from(p["targetPort"].as_i64()?).ok()
}

/// `--gateway-service-namespace`: each Gateway gets its own Service (its own ClusterIP,
/// published in its status) whose ports target dataplane ports opened for that Gateway
/// alone. Two Gateways route the same host and path to different answers, a listener may
/// use any port (8080), and a Gateway that goes takes its Service and ports with it.
#[test]
fn each_gateway_gets_its_own_service_address_and_ports() {
    let p = Pipeline::start_with_gateway_services("20000-20499").unwrap();
    let ns = p.namespace.clone();
    let gateway = |name: &str, port: u16| {
        format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: {name}, namespace: {ns}}}
spec:
  gatewayClassName: sluice
  listeners: [{{name: http, protocol: HTTP, port: {port}}}]
"#
        )
    };
    let route = |name: &str, gw: &str| {
        format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: {ns}}}
spec:
  parentRefs: [{{name: {gw}}}]
  hostnames: [same.e2e]
  rules:
    - backendRefs: [{{name: echo, port: 80}}]
      filters:
        - type: ResponseHeaderModifier
          responseHeaderModifier: {{set: [{{name: x-gateway, value: {gw}}}]}}
"#
        )
    };
    p.cluster
        .apply(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: sluice}}\nspec: {{controllerName: {CONTROLLER}}}\n---\n{}---\n{}---\n{}---\n{}",
            gateway("one", 80),
            gateway("two", 8080),
            route("to-one", "one"),
            route("to-two", "two"),
        ))
        .unwrap();

    // One Service per Gateway, its port targeting a dataplane port from the range.
    let (one, two) = eventually(WAIT, || {
        let s = gateway_services(&p, &ns);
        Some((
            target_of(&s, &format!("{ns}/one"), 80)?,
            target_of(&s, &format!("{ns}/two"), 8080)?,
        ))
    })
    .unwrap_or_else(|| panic!("no Gateway Services: {:#?}", gateway_services(&p, &ns)));
    assert!((20000..=20499).contains(&one) && (20000..=20499).contains(&two));
    assert_ne!(one, two);
    let services = gateway_services(&p, &ns);
    for s in &services {
        assert_eq!(
            s["spec"]["selector"]["app.kubernetes.io/component"], "dataplane",
            "{s:#}"
        );
    }

    // Same host and path, two Gateways, two answers; the shared port serves neither.
    let at = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let r = wait_http(at(one), "same.e2e", "/", 200);
    assert_eq!(r.header("x-gateway"), Some("one"));
    let r = wait_http(at(two), "same.e2e", "/", 200);
    assert_eq!(r.header("x-gateway"), Some("two"));
    assert_eq!(http_get(p.http, "same.e2e", "/").unwrap().status, 404);

    // Each Gateway publishes its own Service's ClusterIP.
    for (gw, svc) in ["one", "two"].iter().map(|g| {
        let svc = services
            .iter()
            .find(|s| {
                s["metadata"]["annotations"]["gateway.sluice.dev/gateway"] == format!("{ns}/{g}")
            })
            .unwrap()
            .clone();
        (*g, svc)
    }) {
        let ip = svc["spec"]["clusterIP"].as_str().unwrap().to_owned();
        wait_object(&p, "gateway", Some(&ns), gw, "its Service's address", |g| {
            g["status"]["addresses"][0]["value"] == ip.as_str()
                && cond(&g["status"]["conditions"], "Programmed")
                    .is_some_and(|(s, _, _)| s == "True")
        });
    }

    // Gateway two goes: its Service goes, its port closes; one keeps serving.
    p.cluster
        .kubectl_ok(&["delete", "gateway", "two", "-n", &ns])
        .unwrap();
    eventually(WAIT, || {
        let s = gateway_services(&p, &ns);
        (s.len() == 1 && target_of(&s, &format!("{ns}/one"), 80).is_some()).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "Service of Gateway two left: {:#?}",
            gateway_services(&p, &ns)
        )
    });
    eventually(WAIT, || {
        http_get(at(two), "same.e2e", "/").is_err().then_some(())
    })
    .expect("the port of Gateway two still answers");
    let r = wait_http(at(one), "same.e2e", "/", 200);
    assert_eq!(r.header("x-gateway"), Some("one"));
}

/// `spec.addresses` and `spec.infrastructure` with per-Gateway Services: a static address
/// becomes the Gateway Service's ClusterIP and the Gateway's only status address; a new one
/// re-creates the Service on it; one the API server refuses (outside the Service range)
/// leaves the Service on the old address and the Gateway `Programmed=False`,
/// `AddressNotUsable`; infrastructure labels and annotations are on the Service; a
/// `parametersRef` is `Accepted=False`, `InvalidParameters`.
#[test]
fn static_addresses_and_infrastructure_reach_the_gateway_service() {
    let p = Pipeline::start_with_gateway_services("18500-18999").unwrap();
    let ns = p.namespace.clone();
    // NB: the lowest 256 addresses of the test cluster's 10.96.0.0/16 are the band the API
    // server keeps for static ClusterIPs; a test in another namespace may use 10.96.0.1-20.
    let gateway = |address: &str| {
        format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: sluice}}
spec: {{controllerName: {CONTROLLER}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: fixed, namespace: {ns}}}
spec:
  gatewayClassName: sluice
  addresses: [{{type: IPAddress, value: "{address}"}}]
  infrastructure:
    labels: {{team: payments}}
    annotations: {{example.com/lb-class: internal}}
  listeners: [{{name: http, protocol: HTTP, port: 80}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r, namespace: {ns}}}
spec:
  parentRefs: [{{name: fixed}}]
  hostnames: [fixed.e2e]
  rules: [{{backendRefs: [{{name: echo, port: 80}}]}}]
"#
        )
    };
    let service = || -> Option<Value> {
        gateway_services(&p, &ns).into_iter().find(|s| {
            s["metadata"]["annotations"]["gateway.sluice.dev/gateway"] == format!("{ns}/fixed")
        })
    };
    let settled = |address: &'static str| {
        let svc = eventually(WAIT, || {
            service().filter(|s| s["spec"]["clusterIP"] == address)
        })
        .unwrap_or_else(|| panic!("no Service on {address}: {:#?}", service()));
        wait_object(&p, "gateway", Some(&ns), "fixed", address, |g| {
            g["status"]["addresses"].as_array().is_some_and(|a| {
                a.len() == 1 && a[0]["value"] == address && a[0]["type"] == "IPAddress"
            }) && cond(&g["status"]["conditions"], "Programmed")
                .is_some_and(|(s, _, _)| s == "True")
        });
        svc
    };

    p.cluster.apply(&gateway("10.96.0.213")).unwrap();
    let svc = settled("10.96.0.213");
    assert_eq!(svc["metadata"]["labels"]["team"], "payments", "{svc:#}");
    assert_eq!(
        svc["metadata"]["labels"]["gateway.networking.k8s.io/gateway-name"], "fixed",
        "{svc:#}"
    );
    assert_eq!(
        svc["metadata"]["annotations"]["example.com/lb-class"], "internal",
        "{svc:#}"
    );
    let port = target_of(std::slice::from_ref(&svc), &format!("{ns}/fixed"), 80).unwrap();
    let at = SocketAddr::from(([127, 0, 0, 1], port));
    wait_http(at, "fixed.e2e", "/", 200);

    // A new address: the Service is made again on it.
    p.cluster.apply(&gateway("10.96.0.214")).unwrap();
    let moved = settled("10.96.0.214");
    assert_ne!(moved["metadata"]["uid"], svc["metadata"]["uid"]);

    // An address the API server refuses: the Service stays where it was, the Gateway says why.
    p.cluster.apply(&gateway("10.99.0.1")).unwrap();
    let g = wait_object(&p, "gateway", Some(&ns), "fixed", "AddressNotUsable", |g| {
        cond(&g["status"]["conditions"], "Programmed")
            .is_some_and(|(s, r, _)| s == "False" && r == "AddressNotUsable")
    });
    let kept = service().unwrap();
    assert_eq!(kept["spec"]["clusterIP"], "10.96.0.214", "{kept:#}");
    assert_eq!(kept["metadata"]["uid"], moved["metadata"]["uid"]);
    assert_eq!(g["status"]["addresses"][0]["value"], "10.96.0.214", "{g:#}");
    wait_http(at, "fixed.e2e", "/", 200);

    // parametersRef: Sluice takes none.
    p.cluster
        .apply(&format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: with-parameters, namespace: {ns}}}
spec:
  gatewayClassName: sluice
  infrastructure:
    parametersRef: {{group: invalid.io, kind: InvalidParameters, name: invalid}}
  listeners: [{{name: http, protocol: HTTP, port: 81}}]
"#
        ))
        .unwrap();
    wait_object(
        &p,
        "gateway",
        Some(&ns),
        "with-parameters",
        "InvalidParameters",
        |g| {
            cond(&g["status"]["conditions"], "Accepted")
                .is_some_and(|(s, r, _)| s == "False" && r == "InvalidParameters")
        },
    );
}

/// `--gateway-service-placement=gateway`: a Gateway's Service lives in the Gateway's own
/// namespace, owned by the Gateway, with its `spec.infrastructure` labels and annotations
/// and the `gateway-name` label (where the Gateway API's conformance looks); it has no
/// selector: its EndpointSlice mirrors the one Kubernetes keeps for a headless backing
/// Service in the dataplanes' namespace (written here by the test, as the test cluster has
/// no kube-controller-manager), following its endpoints' readiness; the Gateway's address
/// is that Service's. Deleting the Gateway removes all three.
#[test]
fn gateway_placement_puts_the_service_beside_the_gateway_with_mirrored_endpoints() {
    let p = Pipeline::start_with_gateway_services_and(
        "17500-17999",
        &[
            "--gateway-service-placement",
            "gateway",
            "--gateway-controller-name",
            "sluice.dev/placement-e2e",
        ],
    )
    .unwrap();
    let ns = p.namespace.clone();
    let apps = p.cluster.create_namespace("apps").unwrap();
    p.cluster
        .apply(&format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: sluice-placement}}
spec: {{controllerName: sluice.dev/placement-e2e}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: web, namespace: {apps}}}
spec:
  gatewayClassName: sluice-placement
  infrastructure:
    labels: {{team: payments}}
    annotations: {{example.com/lb-class: internal}}
  listeners:
  - {{name: http, protocol: HTTP, port: 80, allowedRoutes: {{namespaces: {{from: All}}}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r, namespace: {ns}}}
spec:
  parentRefs: [{{name: web, namespace: {apps}}}]
  hostnames: [placed.e2e]
  rules: [{{backendRefs: [{{name: echo, port: 80}}]}}]
"#
        ))
        .unwrap();
    let list = |kind: &str, ns: &str, selector: &str| -> Vec<Value> {
        let out = p
            .cluster
            .kubectl(&["get", kind, "-n", ns, "-l", selector, "-o", "json"])
            .unwrap();
        let v: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
        v["items"].as_array().cloned().unwrap_or_default()
    };
    let face = eventually(WAIT, || {
        list(
            "services",
            &apps,
            "gateway.networking.k8s.io/gateway-name=web",
        )
        .into_iter()
        .next()
    })
    .unwrap_or_else(|| panic!("no Service in {apps}"));
    let gw = get(&p, "gateway", Some(&apps), "web").unwrap();
    assert_eq!(face["metadata"]["labels"]["team"], "payments", "{face:#}");
    assert_eq!(
        face["metadata"]["annotations"]["example.com/lb-class"], "internal",
        "{face:#}"
    );
    assert_eq!(
        face["metadata"]["ownerReferences"][0]["uid"], gw["metadata"]["uid"],
        "{face:#}"
    );
    assert_eq!(face["spec"]["selector"], Value::Null, "{face:#}");
    let face_name = face["metadata"]["name"].as_str().unwrap().to_owned();
    let port = face["spec"]["ports"][0].clone();
    assert_eq!(
        (port["name"].as_str(), port["port"].as_i64()),
        (Some("http-80"), Some(80))
    );
    let target = port["targetPort"].as_i64().unwrap();

    // The backing Service selects the dataplanes, headless.
    let backing = list(
        "services",
        &ns,
        "gateway.networking.k8s.io/gateway-name=web",
    )
    .into_iter()
    .find(|s| s["metadata"]["annotations"]["gateway.sluice.dev/gateway"] == format!("{apps}/web"))
    .unwrap_or_else(|| panic!("no backing Service in {ns}"));
    assert_eq!(backing["spec"]["clusterIP"], "None", "{backing:#}");
    assert_eq!(
        backing["spec"]["selector"]["app.kubernetes.io/component"], "dataplane",
        "{backing:#}"
    );
    let backing_name = backing["metadata"]["name"].as_str().unwrap().to_owned();

    // The route is served on the Gateway's own dataplane port.
    let at = SocketAddr::from(([127, 0, 0, 1], u16::try_from(target).unwrap()));
    wait_http(at, "placed.e2e", "/", 200);

    // Kubernetes' slice of the backing Service (two dataplane pods, one not ready yet) is
    // mirrored into the Gateway's namespace.
    let backing_slice = |second_ready: bool| {
        format!(
            r#"apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {backing_name}-abcde
  namespace: {ns}
  labels:
    kubernetes.io/service-name: {backing_name}
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
addressType: IPv4
ports: [{{name: http-80, port: {target}, protocol: TCP}}]
endpoints:
- addresses: ["10.244.0.7"]
  conditions: {{ready: true}}
  nodeName: node-a
- addresses: ["10.244.0.8"]
  conditions: {{ready: {second_ready}}}
  nodeName: node-b
"#
        )
    };
    p.cluster.apply(&backing_slice(false)).unwrap();
    let mirrored = |want: &dyn Fn(&Value) -> bool| {
        let mut last = Vec::new();
        eventually(WAIT, || {
            last = list(
                "endpointslices",
                &apps,
                &format!("kubernetes.io/service-name={face_name}"),
            );
            last.iter().find(|s| want(s)).cloned()
        })
        .unwrap_or_else(|| panic!("no mirrored slice as wanted; last: {last:#?}"))
    };
    let ready = |s: &Value| -> Vec<(String, bool)> {
        s["endpoints"]
            .as_array()
            .map(|e| {
                e.iter()
                    .map(|e| {
                        (
                            e["addresses"][0].as_str().unwrap_or_default().to_owned(),
                            e["conditions"]["ready"].as_bool().unwrap_or(false),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let s = mirrored(&|s| ready(s).len() == 2);
    assert_eq!(
        ready(&s),
        vec![("10.244.0.7".into(), true), ("10.244.0.8".into(), false)]
    );
    assert_eq!(s["ports"][0]["name"], "http-80", "{s:#}");
    assert_eq!(s["ports"][0]["port"], target, "{s:#}");
    assert_eq!(s["endpoints"][1]["nodeName"], "node-b", "{s:#}");
    assert_eq!(
        s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"], "gateway.sluice.dev",
        "{s:#}"
    );
    // The second pod becomes ready: the mirror follows.
    p.cluster.apply(&backing_slice(true)).unwrap();
    mirrored(&|s| ready(s) == vec![("10.244.0.7".into(), true), ("10.244.0.8".into(), true)]);

    // The Gateway's address is its Service's.
    let ip = face["spec"]["clusterIP"].as_str().unwrap().to_owned();
    wait_object(
        &p,
        "gateway",
        Some(&apps),
        "web",
        "the Service's address",
        |g| g["status"]["addresses"][0]["value"] == ip.as_str(),
    );

    // The Gateway goes: its Service, slice and backing Service go too.
    p.cluster
        .kubectl_ok(&["delete", "gateway", "web", "-n", &apps])
        .unwrap();
    eventually(WAIT, || {
        (list(
            "services",
            &apps,
            "app.kubernetes.io/managed-by=sluice-gateway",
        )
        .is_empty()
            && list(
                "endpointslices",
                &apps,
                "endpointslice.kubernetes.io/managed-by=gateway.sluice.dev",
            )
            .is_empty()
            && get(&p, "service", Some(&ns), &backing_name).is_none())
        .then_some(())
    })
    .unwrap_or_else(|| panic!("Gateway objects left behind"));
}

/// The Gateway annotation `gateway.sluice.dev/proxy-protocol: "true"` (with
/// `…-trusted`) makes that Gateway's own port require a PROXY header whose address the
/// upstream sees in X-Forwarded-For; a connection without one gets no answer; another
/// Gateway's port is untouched; a bad value is `Accepted=False`, `InvalidParameters`.
#[test]
fn a_gateway_annotation_turns_on_the_proxy_protocol_for_its_ports() {
    use std::io::{Read as _, Write as _};
    let p = Pipeline::start_with_gateway_services("18000-18499").unwrap();
    let ns = p.namespace.clone();
    let gateway = |name: &str, annotations: &str| {
        format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: {name}
  namespace: {ns}
  annotations: {{{annotations}}}
spec:
  gatewayClassName: sluice
  listeners: [{{name: http, protocol: HTTP, port: 80}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: {ns}}}
spec:
  parentRefs: [{{name: {name}}}]
  hostnames: [pp.e2e]
  rules: [{{backendRefs: [{{name: echo, port: 80}}]}}]
"#
        )
    };
    p.cluster
        .apply(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: sluice}}\nspec: {{controllerName: {CONTROLLER}}}\n---\n{}---\n{}---\n{}",
            gateway(
                "behind-lb",
                r#"gateway.sluice.dev/proxy-protocol: "true", gateway.sluice.dev/proxy-protocol-trusted: "127.0.0.0/8""#
            ),
            gateway("direct", ""),
            gateway("bad", r#"gateway.sluice.dev/proxy-protocol: "yes""#),
        ))
        .unwrap();
    let (lb, direct) = eventually(WAIT, || {
        let s = gateway_services(&p, &ns);
        Some((
            target_of(&s, &format!("{ns}/behind-lb"), 80)?,
            target_of(&s, &format!("{ns}/direct"), 80)?,
        ))
    })
    .unwrap_or_else(|| panic!("no Gateway Services: {:#?}", gateway_services(&p, &ns)));
    let at = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let raw_get = |port: u16, header: &[u8]| -> String {
        let Ok(mut c) = std::net::TcpStream::connect(at(port)) else {
            return String::new();
        };
        let _ = c.set_read_timeout(Some(WAIT));
        let mut out = header.to_vec();
        out.extend_from_slice(b"GET / HTTP/1.1\r\nhost: pp.e2e\r\nconnection: close\r\n\r\n");
        let _ = c.write_all(&out);
        let mut answer = Vec::new();
        let _ = c.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    };
    let header = format!("PROXY TCP4 203.0.113.7 127.0.0.1 40000 {lb}\r\n");
    let answer = eventually(WAIT, || {
        Some(raw_get(lb, header.as_bytes())).filter(|a| a.starts_with("HTTP/1.1 200"))
    })
    .unwrap_or_else(|| panic!("behind-lb not served: {}", raw_get(lb, header.as_bytes())));
    assert!(
        answer.contains(r#""x-forwarded-for":"203.0.113.7""#),
        "{answer}"
    );
    assert_eq!(raw_get(lb, b""), "", "no header: closed without an answer");
    // The other Gateway's port takes plain HTTP, and a PROXY line there is not a request.
    assert!(raw_get(direct, b"").starts_with("HTTP/1.1 200"));
    assert!(raw_get(direct, header.as_bytes()).starts_with("HTTP/1.1 400"));
    wait_object(&p, "gateway", Some(&ns), "bad", "InvalidParameters", |g| {
        cond(&g["status"]["conditions"], "Accepted")
            .is_some_and(|(s, r, _)| s == "False" && r == "InvalidParameters")
    });
}

/// `curl` over TLS to `127.0.0.1:port` with `sni` as the URL's host (its SNI), trusting
/// `ca`, with `host` as the `Host` header (`:authority` over HTTP/2), with a client
/// certificate when `identity` names one (cert, key files); the HTTP status, or `None` when
/// the handshake or the request fails.
fn curl_tls(
    port: u16,
    sni: &str,
    host: &str,
    ca: &std::path::Path,
    identity: Option<(&std::path::Path, &std::path::Path)>,
    http2: bool,
) -> Option<u16> {
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "5",
    ])
    .arg(if http2 { "--http2" } else { "--http1.1" })
    .arg("--cacert")
    .arg(ca)
    .arg("--resolve")
    .arg(format!("{sni}:{port}:127.0.0.1"))
    .args(["-H", &format!("Host: {host}")]);
    if let Some((cert, key)) = identity {
        cmd.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    let out = cmd.arg(format!("https://{sni}:{port}/")).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

fn indented(text: &str, by: usize) -> String {
    let pad = " ".repeat(by);
    text.trim().lines().map(|l| format!("{pad}{l}\n")).collect()
}

/// Gateway `spec.tls.frontend` and listener sections on a per-Gateway HTTPS port: a client
/// without a certificate (or with one from another CA) is refused, one with a certificate
/// from the ConfigMap's CA is served; over a connection made for `a.e2e`, a request for
/// `b.e2e` (another listener of the port) gets 421, over HTTP/1.1 and HTTP/2; a Gateway
/// whose CA ConfigMap is missing has its listener `Accepted=False` (`NoValidCACertificate`).
#[test]
fn a_validating_gateway_listener_refuses_clients_without_a_certificate_and_misdirected_hosts() {
    use sluice_testkit::pki::Ca;
    let p = Pipeline::start_with_gateway_services("20500-20999").unwrap();
    let ns = p.namespace.clone();
    let dir = p.cluster.dir().join("frontend-certs");
    std::fs::create_dir_all(&dir).unwrap();
    let server_ca = Ca::new("server CA");
    let server = server_ca.leaf(&["a.e2e", "b.e2e"]);
    let client_ca = Ca::new("client CA");
    let client = client_ca.leaf(&["client.e2e"]);
    let stranger = Ca::new("other CA").leaf(&["stranger.e2e"]);
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let ca_file = write("server-ca.crt", &server_ca.pem);
    let client_files = (
        write("client.crt", &client.pem),
        write("client.key", &client.key_pem),
    );
    let stranger_files = (
        write("stranger.crt", &stranger.pem),
        write("stranger.key", &stranger.key_pem),
    );
    let listener = |name: &str, host: &str| {
        format!(
            "    - name: {name}\n      protocol: HTTPS\n      port: 443\n      hostname: {host}\n      tls: {{certificateRefs: [{{name: server-cert}}]}}\n"
        )
    };
    let route = |name: &str, section: &str, header: &str| {
        format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: {ns}}}
spec:
  parentRefs: [{{name: mtls, sectionName: {section}}}]
  rules:
    - backendRefs: [{{name: echo, port: 80}}]
      filters:
        - type: ResponseHeaderModifier
          responseHeaderModifier: {{set: [{{name: x-listener, value: {header}}}]}}
"#
        )
    };
    let yaml = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: sluice}}\nspec: {{controllerName: {CONTROLLER}}}\n---\n\
apiVersion: v1\nkind: Secret\nmetadata: {{name: server-cert, namespace: {ns}}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}---\n\
apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: client-ca, namespace: {ns}}}\ndata:\n  ca.crt: |\n{}---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: mtls, namespace: {ns}}}\nspec:\n  gatewayClassName: sluice\n  tls:\n    frontend:\n      default:\n        validation:\n          caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: client-ca}}]\n  listeners:\n{}{}---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: broken, namespace: {ns}}}\nspec:\n  gatewayClassName: sluice\n  tls:\n    frontend:\n      default:\n        validation:\n          caCertificateRefs: [{{group: \"\", kind: ConfigMap, name: missing}}]\n  listeners:\n{}---\n{}---\n{}",
        indented(&server.chain_pem, 4),
        indented(&server.key_pem, 4),
        indented(&client_ca.pem, 4),
        listener("a", "a.e2e"),
        listener("b", "b.e2e"),
        listener("a", "a.e2e"),
        route("to-a", "a", "a"),
        route("to-b", "b", "b"),
    );
    p.cluster.apply(&yaml).unwrap();

    let port = eventually(WAIT, || {
        target_of(&gateway_services(&p, &ns), &format!("{ns}/mtls"), 443)
    })
    .unwrap_or_else(|| panic!("no Gateway Service: {:#?}", gateway_services(&p, &ns)));
    let with_cert = Some((client_files.0.as_path(), client_files.1.as_path()));
    for http2 in [false, true] {
        eventually(WAIT, || {
            (curl_tls(port, "a.e2e", "a.e2e", &ca_file, with_cert, http2) == Some(200))
                .then_some(())
        })
        .unwrap_or_else(|| panic!("a.e2e with a client certificate never served (h2: {http2})"));
        assert_eq!(
            curl_tls(port, "a.e2e", "a.e2e", &ca_file, None, http2),
            None,
            "served without a client certificate (h2: {http2})"
        );
        let other = Some((stranger_files.0.as_path(), stranger_files.1.as_path()));
        assert_eq!(
            curl_tls(port, "a.e2e", "a.e2e", &ca_file, other, http2),
            None,
            "served a client certificate of another CA (h2: {http2})"
        );
        assert_eq!(
            curl_tls(port, "a.e2e", "b.e2e", &ca_file, with_cert, http2),
            Some(421),
            "SNI a.e2e, Host b.e2e (h2: {http2})"
        );
        assert_eq!(
            curl_tls(port, "b.e2e", "b.e2e", &ca_file, with_cert, http2),
            Some(200)
        );
    }

    // A missing CA ConfigMap: the listener is not accepted, and says why.
    wait_object(
        &p,
        "gateway",
        Some(&ns),
        "broken",
        "NoValidCACertificate",
        |g| {
            let l = &g["status"]["listeners"][0]["conditions"];
            cond(l, "Accepted").is_some_and(|(s, r, _)| s == "False" && r == "NoValidCACertificate")
                && cond(l, "ResolvedRefs")
                    .is_some_and(|(s, r, _)| s == "False" && r == "InvalidCACertificateRef")
        },
    );
}

/// A backend in the root namespace (on the veth's host end, which the dataplane reaches)
/// that accepts every connection, reads the request and never answers. Returns its address
/// and the request lines it saw.
fn silent_backend(
    host: std::net::Ipv4Addr,
) -> (SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::Read;
    let listener = std::net::TcpListener::bind((host, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = std::sync::Arc::clone(&seen);
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let record = std::sync::Arc::clone(&record);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                if let Ok(n) = s.read(&mut buf) {
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let line = text.lines().next().unwrap_or_default().to_owned();
                    record.lock().unwrap().push(line);
                }
                // Held open, never answered, until the peer gives up.
                let _ = s.read(&mut buf);
                std::thread::sleep(Duration::from_secs(30));
            });
        }
    });
    (addr, seen)
}

#[test]
fn http_route_timeouts_answer_504_and_a_timed_out_get_is_retried_but_not_a_post() {
    let p = Pipeline::start_with_gateway_api(&[]).unwrap();
    let ns = p.namespace.clone();
    p.cluster.apply(&class_and_gateway(&ns, "Same")).unwrap();

    // timeouts.request: a backend slower than the deadline is a 504, well before it answers.
    p.cluster
        .apply(&format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: deadline, namespace: {ns}}}
spec:
  parentRefs: [{{name: gw}}]
  hostnames: [deadline.e2e]
  rules:
    - timeouts: {{request: 1s}}
      backendRefs: [{{name: echo, port: 80}}]
"#
        ))
        .unwrap();
    wait_http(p.http, "deadline.e2e", "/fast", 200);
    let started = std::time::Instant::now();
    let resp = http_get(p.http, "deadline.e2e", "/delay/4000").unwrap();
    assert_eq!(resp.status, 504, "{}", resp.body);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let route = wait_object(&p, "httproute", Some(&ns), "deadline", "Accepted", |r| {
        parent_cond(r, "Accepted").is_some_and(|(s, _, _)| s == "True")
    });
    assert!(
        parent_cond(&route, "PartiallyInvalid").is_none(),
        "{route:#}"
    );

    // timeouts.backendRequest over two endpoints, one of which never answers: a GET that
    // times out there is sent to the other one; a POST whose body was sent is not.
    let (silent, seen) = silent_backend(p.net.host_addr());
    p.cluster
        .apply(&format!(
            r#"apiVersion: v1
kind: Service
metadata: {{name: mixed, namespace: {ns}}}
spec:
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: mixed-echo
  namespace: {ns}
  labels: {{kubernetes.io/service-name: mixed}}
addressType: IPv4
endpoints:
  - addresses: ["{echo}"]
    conditions: {{ready: true}}
ports: [{{name: http, port: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: mixed-silent
  namespace: {ns}
  labels: {{kubernetes.io/service-name: mixed}}
addressType: IPv4
endpoints:
  - addresses: ["{silent_ip}"]
    conditions: {{ready: true}}
ports: [{{name: http, port: {silent_port}}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: retry, namespace: {ns}}}
spec:
  parentRefs: [{{name: gw}}]
  hostnames: [retry.e2e]
  rules:
    - timeouts: {{request: 5s, backendRequest: 500ms}}
      backendRefs: [{{name: mixed, port: 80}}]
"#,
            echo = p.net.addr(),
            silent_ip = silent.ip(),
            silent_port = silent.port(),
        ))
        .unwrap();
    // Served, and both endpoints in use (the silent one saw a request).
    eventually(WAIT, || {
        let r = http_get(p.http, "retry.e2e", "/warm").ok()?;
        (r.status == 200 && !seen.lock().unwrap().is_empty()).then_some(())
    })
    .expect("the route serves with both endpoints");
    for i in 0..4 {
        let resp = http_get(p.http, "retry.e2e", &format!("/get/{i}")).unwrap();
        assert_eq!(resp.status, 200, "GET {i}: {}", resp.body);
        assert_eq!(resp.header("x-echo-server"), Some("e2e-echo"));
    }
    let mut statuses = Vec::new();
    for i in 0..4 {
        let resp = sluice_e2e::http_request(
            p.http,
            "POST",
            "retry.e2e",
            &format!("/post/{i}"),
            &[("content-type", "text/plain")],
            b"order=1",
        )
        .unwrap();
        statuses.push(resp.status);
    }
    // Round robin: two of the four POSTs went to the silent endpoint and were not sent
    // again.
    assert_eq!(
        statuses.iter().filter(|s| **s == 504).count(),
        2,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        2,
        "{statuses:?}"
    );
    let posts = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("POST"))
        .count();
    assert_eq!(posts, 2, "{:?}", seen.lock().unwrap());
}

/// A BackendTLSPolicy `ns/name` for Service `secure`: CA from ConfigMap `backend-ca`, SNI
/// `secure.e2e`, verified against the DNS SAN `san`.
fn backend_tls_policy(ns: &str, san: &str) -> String {
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {{name: secure, namespace: {ns}}}
spec:
  targetRefs: [{{group: "", kind: Service, name: secure}}]
  validation:
    caCertificateRefs: [{{group: "", kind: ConfigMap, name: backend-ca}}]
    hostname: secure.e2e
    subjectAltNames: [{{type: Hostname, hostname: {san}}}]
"#
    )
}

#[test]
fn backend_tls_policy_verifies_the_backend_san_502_when_wrong_200_when_right() {
    let p = Pipeline::start_with_gateway_api(&[]).unwrap();
    let ns = p.namespace.clone();
    // A TLS-only backend in the backends' network namespace: `openssl s_server -www` answers
    // any request with 200 over TLS, with a certificate for `backend.e2e.internal` only.
    let ca = sluice_testkit::pki::Ca::new("e2e backend ca");
    let leaf = ca.sign(sluice_testkit::pki::params_for(&["backend.e2e.internal"]));
    let dir = tempfile_dir();
    std::fs::write(dir.join("tls.crt"), &leaf.pem).unwrap();
    std::fs::write(dir.join("tls.key"), &leaf.key_pem).unwrap();
    let listen = SocketAddr::from((p.net.addr(), 8443));
    let mut cmd = p.net.command("openssl");
    cmd.args(["s_server", "-quiet", "-www", "-accept"])
        .arg(listen.to_string())
        .arg("-cert")
        .arg(dir.join("tls.crt"))
        .arg("-key")
        .arg(dir.join("tls.key"));
    let _backend = p.net.spawn(cmd, listen, Duration::from_secs(10)).unwrap();
    let indented_ca: String = ca.pem.lines().map(|l| format!("    {l}\n")).collect();
    p.cluster.apply(&class_and_gateway(&ns, "Same")).unwrap();
    p.cluster
        .apply(&format!(
            r#"apiVersion: v1
kind: Service
metadata: {{name: secure, namespace: {ns}}}
spec:
  ports: [{{name: https, port: 443, targetPort: 8443}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: secure-1
  namespace: {ns}
  labels: {{kubernetes.io/service-name: secure}}
addressType: IPv4
endpoints:
  - addresses: ["{addr}"]
    conditions: {{ready: true}}
ports: [{{name: https, port: 8443}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: backend-ca, namespace: {ns}}}
data:
  ca.crt: |
{indented_ca}"#,
            addr = p.net.addr()
        ))
        .unwrap();
    p.cluster
        .apply(&backend_tls_policy(&ns, "wrong.e2e.internal"))
        .unwrap();
    p.cluster
        .apply(&http_route(
            &ns,
            "secure",
            &ns,
            &["secure.e2e"],
            "{name: secure, port: 443}",
        ))
        .unwrap();

    // The policy is accepted for the Gateway; the certificate lacks the SAN: 502.
    let policy = wait_object(
        &p,
        "backendtlspolicy",
        Some(&ns),
        "secure",
        "an ancestor entry of ours",
        |v| {
            v["status"]["ancestors"]
                .as_array()
                .is_some_and(|a| a.iter().any(|e| e["controllerName"] == CONTROLLER))
        },
    );
    let ours = policy["status"]["ancestors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["controllerName"] == CONTROLLER)
        .unwrap();
    assert_eq!(ours["ancestorRef"]["name"], "gw");
    assert_eq!(ours["ancestorRef"]["kind"], "Gateway");
    assert_eq!(cond(&ours["conditions"], "Accepted").unwrap().0, "True");
    assert_eq!(cond(&ours["conditions"], "ResolvedRefs").unwrap().0, "True");
    wait_http(p.http, "secure.e2e", "/", 502);

    // The right SAN: 200, over TLS (the backend speaks nothing else).
    p.cluster
        .apply(&backend_tls_policy(&ns, "backend.e2e.internal"))
        .unwrap();
    let resp = wait_http(p.http, "secure.e2e", "/", 200);
    assert!(
        resp.body.contains("s_server"),
        "the TLS backend answered: {:?}",
        resp.body
    );

    // The CA ConfigMap gone: ResolvedRefs=False, and the backend is never reached.
    p.cluster
        .kubectl_ok(&["delete", "configmap", "backend-ca", "-n", &ns])
        .unwrap();
    wait_object(
        &p,
        "backendtlspolicy",
        Some(&ns),
        "secure",
        "ResolvedRefs=False",
        |v| {
            v["status"]["ancestors"].as_array().is_some_and(|a| {
                a.iter().any(|e| {
                    e["controllerName"] == CONTROLLER
                        && cond(&e["conditions"], "ResolvedRefs")
                            .is_some_and(|(s, r, _)| s == "False" && r == "InvalidCACertificateRef")
                })
            })
        },
    );
    wait_http(p.http, "secure.e2e", "/", 503);
}

/// `(status, reason)` of condition `ty` of listener `name` in a `status.listeners` list.
fn listener_cond(listeners: &Value, name: &str, ty: &str) -> Option<(String, String)> {
    let l = listeners.as_array()?.iter().find(|l| l["name"] == name)?;
    cond(&l["conditions"], ty).map(|(s, r, _)| (s, r))
}

/// ListenerSet (GEP-1713) on per-Gateway ports: a set the Gateway admits
/// (`allowedListeners: Same`) adds its listeners to the Gateway's Service and ports, and a
/// route whose parentRef is the set is served there; a set from a namespace the Gateway does
/// not admit is `Accepted=False` (`NotAllowed`) and its route is not served. The set's HTTPS
/// listener names a Secret that does not exist yet, as cert-manager's gateway-shim leaves
/// it: once the Secret is created the listener serves its certificate, with no other change.
#[test]
fn a_listener_set_route_is_served_on_its_gateway_and_an_unadmitted_set_is_refused() {
    use sluice_testkit::pki::Ca;
    let p = Pipeline::start_with_gateway_services("19000-19499").unwrap();
    let ns = p.namespace.clone();
    let other = p.cluster.create_namespace("outside").unwrap();
    let route = |ns: &str, name: &str, set: &str, backend: &str| {
        format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: {ns}}}
spec:
  parentRefs: [{{group: gateway.networking.k8s.io, kind: ListenerSet, name: {set}}}]
  rules:
    - backendRefs: [{backend}]
      filters:
        - type: ResponseHeaderModifier
          responseHeaderModifier: {{set: [{{name: x-via, value: {set}}}]}}
"#
        )
    };
    let yaml = format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: sluice}}
spec: {{controllerName: {CONTROLLER}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: shared, namespace: {ns}}}
spec:
  gatewayClassName: sluice
  allowedListeners: {{namespaces: {{from: Same}}}}
  listeners: [{{name: http, protocol: HTTP, port: 80, hostname: gw.e2e}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata:
  name: apps
  namespace: {ns}
  annotations: {{cert-manager.io/cluster-issuer: e2e-issuer}}
spec:
  parentRef: {{name: shared}}
  listeners:
    - {{name: http, protocol: HTTP, port: 80, hostname: app.e2e}}
    - name: https
      protocol: HTTPS
      port: 443
      hostname: secure.e2e
      tls: {{certificateRefs: [{{name: app-tls}}]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: ListenerSet
metadata: {{name: outsider, namespace: {other}}}
spec:
  parentRef: {{name: shared, namespace: {ns}}}
  listeners: [{{name: http, protocol: HTTP, port: 80, hostname: outsider.e2e}}]
---
{}---
{}"#,
        route(&ns, "to-apps", "apps", "{name: echo, port: 80}"),
        route(
            &other,
            "to-outsider",
            "outsider",
            &format!("{{name: echo, namespace: {ns}, port: 80}}")
        ),
    );
    p.cluster.apply(&yaml).unwrap();

    // The set's listeners are ports of the Gateway's own Service.
    let (http, https) = eventually(WAIT, || {
        let s = gateway_services(&p, &ns);
        let gw = format!("{ns}/shared");
        Some((target_of(&s, &gw, 80)?, target_of(&s, &gw, 443)?))
    })
    .unwrap_or_else(|| panic!("no Gateway Service ports: {:#?}", gateway_services(&p, &ns)));
    assert!((19000..=19499).contains(&http) && (19000..=19499).contains(&https));
    let at = SocketAddr::from(([127, 0, 0, 1], http));
    let r = wait_http(at, "app.e2e", "/", 200);
    assert_eq!(r.header("x-via"), Some("apps"));
    // A ListenerSet parentRef attaches to the set's listeners only, not the Gateway's own.
    assert_eq!(http_get(at, "gw.e2e", "/").unwrap().status, 404);
    // The set the Gateway does not admit serves nothing.
    assert_eq!(http_get(at, "outsider.e2e", "/").unwrap().status, 404);

    // Status: the admitted set is accepted and programmed, its HTTP listener has the route,
    // its HTTPS listener waits for its Secret; the Gateway counts one set.
    let set = wait_object(&p, "listenerset", Some(&ns), "apps", "Programmed", |s| {
        let st = &s["status"];
        cond(&st["conditions"], "Accepted").is_some_and(|(s, _, _)| s == "True")
            && cond(&st["conditions"], "Programmed")
                .is_some_and(|(s, r, _)| s == "True" && r == "Programmed")
            && listener_cond(&st["listeners"], "https", "ResolvedRefs")
                == Some(("False".into(), "InvalidCertificateRef".into()))
    });
    let listeners = set["status"]["listeners"].as_array().unwrap();
    let http_listener = listeners.iter().find(|l| l["name"] == "http").unwrap();
    assert_eq!(http_listener["attachedRoutes"], 1, "{set:#}");
    wait_object(
        &p,
        "gateway",
        Some(&ns),
        "shared",
        "attachedListenerSets 1",
        |g| g["status"]["attachedListenerSets"] == 1,
    );
    let outsider = wait_object(
        &p,
        "listenerset",
        Some(&other),
        "outsider",
        "NotAllowed",
        |s| {
            let c = &s["status"]["conditions"];
            cond(c, "Accepted").is_some_and(|(s, r, _)| s == "False" && r == "NotAllowed")
                && cond(c, "Programmed").is_some_and(|(s, r, _)| s == "False" && r == "NotAllowed")
        },
    );
    assert_eq!(
        cond(&outsider["status"]["conditions"], "Accepted")
            .unwrap()
            .2,
        generation(&outsider)
    );
    wait_object(
        &p,
        "httproute",
        Some(&other),
        "to-outsider",
        "not accepted",
        |r| {
            parent_cond(r, "Accepted")
                .is_some_and(|(s, r, _)| s == "False" && r == "NoMatchingParent")
        },
    );
    assert_eq!(http_get(at, "outsider.e2e", "/").unwrap().status, 404);

    // cert-manager's part: the Secret appears after the set; the set's HTTPS listener serves
    // it on the Gateway's port 443 with no other change.
    let dir = p.cluster.dir().join("listenerset-certs");
    std::fs::create_dir_all(&dir).unwrap();
    let ca = Ca::new("listenerset CA");
    let leaf = ca.leaf(&["secure.e2e"]);
    let ca_file = dir.join("ca.crt");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    assert_eq!(
        curl_tls(https, "secure.e2e", "secure.e2e", &ca_file, None, false),
        None,
        "served a certificate before its Secret existed"
    );
    p.cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: app-tls, namespace: {ns}}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
            indented(&leaf.chain_pem, 4),
            indented(&leaf.key_pem, 4),
        ))
        .unwrap();
    eventually(WAIT, || {
        (curl_tls(https, "secure.e2e", "secure.e2e", &ca_file, None, false) == Some(200))
            .then_some(())
    })
    .expect("the ListenerSet's HTTPS listener never served the Secret created after it");
    wait_object(
        &p,
        "listenerset",
        Some(&ns),
        "apps",
        "https resolved",
        |s| {
            listener_cond(&s["status"]["listeners"], "https", "ResolvedRefs")
                == Some(("True".into(), "ResolvedRefs".into()))
        },
    );
}
