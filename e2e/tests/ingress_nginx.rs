//! Ingresses written for ingress-nginx on the real API server: a controller started with
//! `--ingress-nginx-class nginx` (the chart's `ingressClass.nginxClasses`) and the chart's
//! RBAC serves them through a real dataplane to the echo backend in its network namespace:
//! a rewrite with capture groups, basic authentication from an htpasswd Secret, CORS; an
//! Ingress with a snippet is refused with a Warning event naming the annotation; an Ingress
//! of a class not taken over is left alone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;
use sluice_e2e::{Pipeline, eventually, http_get, http_get_with};

const WAIT: Duration = Duration::from_secs(30);

fn ingress(
    ns: &str,
    name: &str,
    class: &str,
    host: &str,
    path: &str,
    annotations: &[(&str, &str)],
) -> String {
    let mut a = String::new();
    for (k, v) in annotations {
        a.push_str(&format!(
            "\n    nginx.ingress.kubernetes.io/{k}: {}",
            serde_json::to_string(v).unwrap()
        ));
    }
    format!(
        "apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: {name}
  namespace: {ns}
  annotations:{a}
    example.com/team: web
spec:
  ingressClassName: {class}
  rules:
  - host: {host}
    http:
      paths:
      - path: {path:?}
        pathType: ImplementationSpecific
        backend: {{service: {{name: echo, port: {{number: 80}}}}}}
"
    )
}

#[test]
fn ingresses_of_the_nginx_class_are_served_with_their_annotations() {
    let p = Pipeline::start_with(&["--ingress-nginx-class", "nginx"]).unwrap();
    let ns = p.namespace.clone();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    // `openssl passwd -apr1 -salt sAlt1234 'two words'`
    let htpasswd = b64("foo:$apr1$sAlt1234$nQULF6mfiJyz.vfg0uuey/\n");
    p.cluster
        .apply(&format!(
            "apiVersion: v1
kind: Secret
metadata: {{name: basic-auth, namespace: {ns}}}
data: {{auth: {htpasswd}}}
---
{}---
{}---
{}---
{}",
            ingress(
                &ns,
                "rewrite",
                "nginx",
                "rewrite.e2e",
                "/something(/|$)(.*)",
                &[("rewrite-target", "/$2"), ("enable-cors", "true")]
            ),
            ingress(
                &ns,
                "private",
                "nginx",
                "private.e2e",
                "/",
                &[
                    ("auth-type", "basic"),
                    ("auth-secret", "basic-auth"),
                    ("auth-realm", "Authentication Required")
                ]
            ),
            ingress(
                &ns,
                "snippet",
                "nginx",
                "snippet.e2e",
                "/",
                &[("configuration-snippet", "more_set_headers \"X-Debug: 1\";")]
            ),
            ingress(&ns, "other", "traefik", "other.e2e", "/", &[]),
        ))
        .unwrap();

    // The rewrite with capture groups, and CORS on the same Ingress.
    let r = eventually(WAIT, || {
        http_get_with(
            p.http,
            "rewrite.e2e",
            "/something/new/path?q=1",
            &[("origin", "https://app.example.com")],
        )
        .ok()
        .filter(|r| r.status == 200)
    })
    .expect("the rewrite Ingress to serve");
    let echo: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(echo["path"], "/new/path", "{}", r.body);
    assert_eq!(echo["query"], "q=1", "{}", r.body);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));

    // Basic authentication.
    let r = eventually(WAIT, || {
        http_get(p.http, "private.e2e", "/")
            .ok()
            .filter(|r| r.status == 401)
    })
    .expect("the private Ingress to ask for credentials");
    assert_eq!(
        r.header("www-authenticate"),
        Some("Basic realm=\"Authentication Required\"")
    );
    let good = format!("Basic {}", b64("foo:two words"));
    let bad = format!("Basic {}", b64("foo:wrong"));
    assert_eq!(
        http_get_with(p.http, "private.e2e", "/", &[("authorization", &bad)])
            .unwrap()
            .status,
        401
    );
    let r = http_get_with(p.http, "private.e2e", "/", &[("authorization", &good)]).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        !r.body.to_ascii_lowercase().contains("authorization"),
        "credentials passed upstream: {}",
        r.body
    );

    // The snippet: not served, a Warning event names the annotation.
    let event = eventually(WAIT, || {
        let out = p
            .cluster
            .kubectl_ok(&[
                "get",
                "events",
                "-n",
                &ns,
                "--field-selector",
                "involvedObject.name=snippet,type=Warning",
                "-o",
                "json",
            ])
            .ok()?;
        let v: Value = serde_json::from_str(&out).ok()?;
        let first = v["items"].as_array()?.first().cloned();
        if first.is_none() {
            std::thread::sleep(Duration::from_millis(200));
        }
        first
    })
    .expect("a Warning event for the snippet Ingress");
    assert!(
        event["message"]
            .as_str()
            .unwrap()
            .contains("nginx.ingress.kubernetes.io/configuration-snippet"),
        "{event:#}"
    );
    assert_eq!(http_get(p.http, "snippet.e2e", "/").unwrap().status, 404);
    // A class not taken over stays with its controller.
    assert_eq!(http_get(p.http, "other.e2e", "/").unwrap().status, 404);
}
