//! Gateway API filters in one process: HTTPRoutes translated as the controller translates
//! them, served by the dataplane against in-process origins. The CORS filter (a preflight
//! answered without the backend, the headers of the actual request), filters on one
//! backendRef of a 50/50 rule (reaching that backend only), and two mirrors of one rule
//! (each receiving its copy).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use http::StatusCode;
use sluice_translate::{ClusterState, Options, translate};

/// The GatewayClass and a Gateway with one HTTP listener (served on the dataplane's own
/// plain-HTTP port).
const GATEWAY: &str = "
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: sluice}
spec: {controllerName: sluice.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: default}
spec:
  gatewayClassName: sluice
  listeners:
    - {name: http, port: 80, protocol: HTTP}
";

/// A Service `name` whose ClusterIP is loopback and whose port and only endpoint are
/// `addr`'s port: the dataplane proxies (and mirrors) to `addr`.
fn service(name: &str, addr: SocketAddr) -> String {
    let port = addr.port();
    format!(
        "
---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec: {{clusterIP: 127.0.0.1, ports: [{{port: {port}}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: default
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports: [{{port: {port}}}]
endpoints:
  - addresses: [127.0.0.1]
"
    )
}

/// A dataplane serving the translation of `yaml` (the Gateway prepended); every route is
/// accepted whole.
async fn serve(yaml: &str) -> Dataplane {
    let mut state = ClusterState::new();
    state
        .load_yaml("test.yaml", &format!("{GATEWAY}{yaml}"))
        .unwrap();
    let t = translate(&state, &Options::default());
    let routes = serde_json::to_string(&t.status.gateway.routes).unwrap();
    assert!(routes.contains("\"True\""), "{routes}");
    assert!(!routes.contains("\"False\""), "{routes}");
    let dp = dataplane().await;
    dp.store.apply(t.snapshot, vec![]).unwrap();
    dp
}

const CORS_ROUTE: &str = "
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: cors, namespace: default}
spec:
  parentRefs: [{name: gw}]
  rules:
    - matches: [{path: {type: PathPrefix, value: /cors}}]
      filters:
        - type: CORS
          cors:
            allowOrigins: ['https://www.foo.com', 'https://*.bar.com']
            allowMethods: [GET, OPTIONS]
            allowHeaders: [x-header-1, x-header-2]
            exposeHeaders: [x-header-3, x-header-4]
            allowCredentials: true
            maxAge: 3600
      backendRefs: [{name: app, port: PORT}]
    - matches: [{path: {type: PathPrefix, value: /any}}]
      filters:
        - type: CORS
          cors:
            allowOrigins: ['*']
            allowMethods: ['*']
            allowHeaders: ['*']
            allowCredentials: true
      backendRefs: [{name: app, port: PORT}]
";

/// A preflight for `GET /cors/x` with two request headers, from `origin`.
async fn preflight(addr: SocketAddr, origin: &str) -> Resp {
    request(
        addr,
        "OPTIONS",
        "/cors/x",
        &[
            ("origin", origin),
            ("access-control-request-method", "GET"),
            ("access-control-request-headers", "x-header-1, x-header-2"),
        ],
    )
    .await
}

#[tokio::test]
async fn cors_preflight_is_answered_without_the_backend() {
    let echo = EchoServer::start("app", any()).await.unwrap();
    let route = CORS_ROUTE.replace("PORT", &echo.addr.port().to_string());
    let dp = serve(&format!("{}{route}", service("app", echo.addr))).await;

    let preflight = |origin: &'static str| preflight(dp.addr, origin);
    // An exact origin and one under the wildcard (any number of labels).
    for origin in ["https://www.foo.com", "https://xpto.www.bar.com"] {
        let r = preflight(origin).await;
        assert_eq!(r.status, StatusCode::OK, "{origin}");
        assert!(
            !from_origin(&r),
            "{origin}: the backend answered the preflight"
        );
        assert_eq!(h(&r, "access-control-allow-origin"), Some(origin));
        assert_eq!(h(&r, "access-control-allow-methods"), Some("GET, OPTIONS"));
        assert_eq!(
            h(&r, "access-control-allow-headers"),
            Some("x-header-1, x-header-2")
        );
        assert_eq!(
            h(&r, "access-control-expose-headers"),
            Some("x-header-3, x-header-4")
        );
        assert_eq!(h(&r, "access-control-max-age"), Some("3600"));
        assert_eq!(h(&r, "access-control-allow-credentials"), Some("true"));
        assert_eq!(h(&r, "vary"), Some("Origin"));
    }
    // An origin not listed: answered, without any CORS header.
    let r = preflight("https://foobar.com").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(!from_origin(&r));
    assert_eq!(h(&r, "access-control-allow-origin"), None);
    assert_eq!(h(&r, "access-control-allow-credentials"), None);
    // The wildcard needs a label before `.bar.com`, and the default port only.
    for origin in [
        "https://bar.com",
        "https://www.bar.com:8443",
        "http://www.bar.com",
    ] {
        let r = preflight(origin).await;
        assert_eq!(h(&r, "access-control-allow-origin"), None, "{origin}");
    }
    let r = preflight("https://www.bar.com:443").await;
    assert_eq!(
        h(&r, "access-control-allow-origin"),
        Some("https://www.bar.com:443")
    );

    // The actual request reaches the backend and gets the headers.
    let r = request(
        dp.addr,
        "GET",
        "/cors/x",
        &[("origin", "https://www.bar.com")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(from_origin(&r));
    assert_eq!(
        h(&r, "access-control-allow-origin"),
        Some("https://www.bar.com")
    );
    assert_eq!(h(&r, "access-control-allow-credentials"), Some("true"));
    assert_eq!(
        h(&r, "access-control-expose-headers"),
        Some("x-header-3, x-header-4")
    );
    // An OPTIONS request that is no preflight goes to the backend.
    let r = request(dp.addr, "OPTIONS", "/cors/x", &[]).await;
    assert!(from_origin(&r), "{}", r.text());
    let r = request(
        dp.addr,
        "GET",
        "/cors/x",
        &[("origin", "https://evil.test")],
    )
    .await;
    assert!(from_origin(&r));
    assert_eq!(h(&r, "access-control-allow-origin"), None);

    // `*` with credentials: never `*` in an answer; the method and headers asked for.
    let r = request(
        dp.addr,
        "OPTIONS",
        "/any",
        &[
            ("origin", "https://other.foo.com:12345"),
            ("access-control-request-method", "PUT"),
            ("access-control-request-headers", "x-a"),
        ],
    )
    .await;
    assert!(!from_origin(&r));
    assert_eq!(
        h(&r, "access-control-allow-origin"),
        Some("https://other.foo.com:12345")
    );
    assert_eq!(h(&r, "access-control-allow-methods"), Some("PUT"));
    assert_eq!(h(&r, "access-control-allow-headers"), Some("x-a"));
    assert_eq!(h(&r, "access-control-allow-credentials"), Some("true"));
    let vary: Vec<&str> = r
        .headers
        .get_all("vary")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(vary, ["Origin", "Access-Control-Request-Method"]);
}

#[tokio::test]
async fn a_backend_ref_filter_reaches_only_its_backend() {
    let v1 = EchoServer::start("v1", any()).await.unwrap();
    let v2 = EchoServer::start("v2", any()).await.unwrap();
    let route = format!(
        "
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: split, namespace: default}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
    - filters:
        - type: RequestHeaderModifier
          requestHeaderModifier: {{set: [{{name: X-Rule, value: both}}]}}
      backendRefs:
        - name: v1
          port: {p1}
          weight: 50
          filters:
            - type: RequestHeaderModifier
              requestHeaderModifier: {{set: [{{name: Backend, value: v1}}], remove: [X-Drop]}}
            - type: ResponseHeaderModifier
              responseHeaderModifier: {{add: [{{name: X-Served-By, value: v1}}]}}
        - name: v2
          port: {p2}
          weight: 50
",
        p1 = v1.addr.port(),
        p2 = v2.addr.port()
    );
    let dp = serve(&format!(
        "{}{}{route}",
        service("v1", v1.addr),
        service("v2", v2.addr)
    ))
    .await;
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..40 {
        let r = get_with(dp.addr, "/", &[("x-drop", "d")]).await;
        assert_eq!(r.status, StatusCode::OK);
        let body = r.json();
        let server = body["server"].as_str().unwrap().to_owned();
        let headers = &body["headers"];
        // The rule's filter on both, the backendRef's on its backend only.
        assert_eq!(headers["x-rule"], "both", "{server}");
        match server.as_str() {
            "v1" => {
                assert_eq!(headers["backend"], "v1");
                assert!(headers.get("x-drop").is_none(), "{body}");
                assert_eq!(h(&r, "x-served-by"), Some("v1"));
            }
            _ => {
                assert!(headers.get("backend").is_none(), "{body}");
                assert_eq!(headers["x-drop"], "d");
                assert_eq!(h(&r, "x-served-by"), None);
            }
        }
        *count.entry(server).or_default() += 1;
    }
    // 50/50: smooth weighted round robin alternates.
    assert_eq!(count.get("v1"), Some(&20), "{count:?}");
    assert_eq!(count.get("v2"), Some(&20), "{count:?}");
}

#[tokio::test]
async fn two_mirrors_of_one_rule_each_receive_a_copy() {
    let app = EchoServer::start("app", any()).await.unwrap();
    let m1 = Origin::start("m1");
    let m2 = Origin::start("m2");
    let route = format!(
        "
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: mirrors, namespace: default}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
    - filters:
        - type: RequestMirror
          requestMirror: {{backendRef: {{name: m1, port: {pm1}}}}}
        - type: RequestMirror
          requestMirror: {{backendRef: {{name: m2, port: {pm2}}}}}
      backendRefs: [{{name: app, port: {pa}}}]
",
        pm1 = m1.addr.port(),
        pm2 = m2.addr.port(),
        pa = app.addr.port()
    );
    let dp = serve(&format!(
        "{}{}{}{route}",
        service("app", app.addr),
        service("m1", m1.addr),
        service("m2", m2.addr)
    ))
    .await;
    for _ in 0..3 {
        let r = get_with(dp.addr, "/mirrored", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(from_origin(&r));
    }
    let seen = |o: &Origin| o.state.requests.load(Ordering::SeqCst);
    eventually(Duration::from_secs(5), || seen(&m1) >= 3 && seen(&m2) >= 3).await;
    assert_eq!((seen(&m1), seen(&m2)), (3, 3));
}
