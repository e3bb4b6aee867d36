//! Ingresses written for ingress-nginx (class `nginx`, served in its place with
//! `Options::nginx_classes`), translated as the controller and standalone mode translate
//! them and served by the dataplane against a real origin: one case per annotation, each
//! checked against ingress-nginx's documented answer (its annotations.md and template), and
//! each failing without that annotation's support (the request would reach the origin
//! unchanged, or the Ingress would be served whole).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::Full;
use sluice_translate::{ClusterState, Options, translate};

/// The origin's Service `app` (ClusterIP loopback, its one endpoint `addr`).
fn service(addr: SocketAddr) -> String {
    named_service("app", addr.port())
}

/// Service `name` (ClusterIP loopback) with its one endpoint at `127.0.0.1:port`.
fn named_service(name: &str, port: u16) -> String {
    format!(
        "
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

/// An Ingress of class `nginx` for `host`, one `path` (ImplementationSpecific) to `app`,
/// with `annotations` (`key: value` lines, without the `nginx.ingress.kubernetes.io/`
/// prefix).
fn ingress(name: &str, host: &str, path: &str, annotations: &[(&str, &str)], port: u16) -> String {
    let mut a = String::new();
    for (k, v) in annotations {
        a.push_str(&format!(
            "\n    nginx.ingress.kubernetes.io/{k}: {}",
            serde_json::to_string(v).unwrap()
        ));
    }
    format!(
        "
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: {name}
  namespace: default
  annotations:{a}
    note.example.com/owner: team-a
spec:
  ingressClassName: nginx
  rules:
    - host: {host}
      http:
        paths:
          - path: {path:?}
            pathType: ImplementationSpecific
            backend: {{service: {{name: app, port: {{number: {port}}}}}}}
"
    )
}

struct Served {
    dp: Dataplane,
    /// The `Accepted` message of each Ingress, by name.
    accepted: Vec<(String, String, String)>,
    _origin: EchoServer,
}

/// The dataplane serving the translation of the Ingresses `make(port)` returns, beside
/// the origin.
async fn serve(make: impl Fn(u16) -> String) -> Served {
    serve_with(make, &[]).await
}

/// Like [`serve`], with settings of ingress-nginx's ConfigMap.
async fn serve_with(make: impl Fn(u16) -> String, config: &[(&str, &str)]) -> Served {
    let origin = EchoServer::start("app", any()).await.unwrap();
    let yaml = format!("{}{}", service(origin.addr), make(origin.addr.port()));
    let mut state = ClusterState::new();
    state.load_yaml("test.yaml", &yaml).unwrap();
    let opts = Options {
        nginx_classes: vec!["nginx".into()],
        nginx_config: config
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Options::default()
    };
    let t = translate(&state, &opts);
    let accepted = t
        .ingresses
        .iter()
        .map(|o| {
            let c = o.conditions.iter().find(|c| c.type_ == "Accepted").unwrap();
            (o.name.clone(), format!("{:?}", c.status), c.message.clone())
        })
        .collect();
    let dp = dataplane().await;
    dp.store.apply(t.snapshot, vec![]).unwrap();
    Served {
        dp,
        accepted,
        _origin: origin,
    }
}

impl Served {
    fn accepted(&self, name: &str) -> (String, String) {
        let (_, s, m) = self
            .accepted
            .iter()
            .find(|(n, _, _)| n == name)
            .unwrap_or_else(|| panic!("no status of {name}: {:?}", self.accepted));
        (s.clone(), m.clone())
    }

    async fn req(
        &self,
        method: &str,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: usize,
    ) -> Resp {
        let mut b = Request::builder()
            .method(method)
            .uri(path)
            .header("host", host);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        send(
            self.dp.addr,
            b.body(Full::new(Bytes::from(vec![b'x'; body]))).unwrap(),
        )
        .await
    }

    async fn get(&self, host: &str, path: &str) -> Resp {
        self.req("GET", host, path, &[], 0).await
    }
}

fn upstream(r: &Resp) -> serde_json::Value {
    assert!(
        from_origin(r),
        "not from the origin: {} {:?}",
        r.status,
        r.body
    );
    serde_json::from_slice(&r.body).unwrap()
}

/// `rewrite-target` with capture groups (ingress-nginx's documented example): the path is a
/// case-insensitive regex anchored at the start, the whole path is replaced by the target
/// with `$2`, the query string is kept; `x-forwarded-prefix` goes with the rewrite.
#[tokio::test]
async fn rewrite_target_with_capture_groups() {
    let s = serve(|port| {
        ingress(
            "rewrite",
            "rewrite.example.com",
            "/something(/|$)(.*)",
            &[
                ("rewrite-target", "/$2"),
                ("x-forwarded-prefix", "/something"),
            ],
            port,
        )
    })
    .await;
    for (path, want, query) in [
        ("/something", "/", None),
        ("/something/", "/", None),
        ("/something/new", "/new", None),
        ("/SomeThing/new/deeper?x=1", "/new/deeper", Some("x=1")),
    ] {
        let r = s.get("rewrite.example.com", path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        let u = upstream(&r);
        assert_eq!(u["path"], want, "{path}");
        assert_eq!(u["query"].as_str(), query, "{path}");
        assert_eq!(u["headers"]["x-forwarded-prefix"], "/something", "{path}");
    }
    // Anchored at the start: a path that only contains the regex is not this route's.
    assert_eq!(
        s.get("rewrite.example.com", "/x/something/new")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

/// `use-regex` alone: regex paths, no rewrite.
#[tokio::test]
async fn use_regex_matches_case_insensitively_without_rewriting() {
    let s = serve(|port| {
        ingress(
            "re",
            "re.example.com",
            "/api/v[0-9]+/",
            &[("use-regex", "true")],
            port,
        )
    })
    .await;
    let r = s.get("re.example.com", "/API/V2/users").await;
    assert_eq!(upstream(&r)["path"], "/API/V2/users");
    assert_eq!(
        s.get("re.example.com", "/api/vx/users").await.status,
        StatusCode::NOT_FOUND
    );
    // A path Rust's regex cannot run (look-behind) rejects the Ingress, naming the path.
    let bad = serve(|port| {
        ingress(
            "bad",
            "bad.example.com",
            "/(?<=a)b",
            &[("use-regex", "true")],
            port,
        )
    })
    .await;
    let (status, msg) = bad.accepted("bad");
    assert_eq!(status, "False", "{msg}");
    assert!(msg.contains("spec.rules[0].http.paths[0].path"), "{msg}");
}

/// `app-root`: only `/` is answered with a 302 to the app root; other paths are proxied.
#[tokio::test]
async fn app_root_redirects_the_root_only() {
    let s = serve(|port| {
        ingress(
            "root",
            "approot.example.com",
            "/",
            &[("app-root", "/app1")],
            port,
        )
    })
    .await;
    let r = s.get("approot.example.com", "/").await;
    assert_eq!(r.status, StatusCode::FOUND);
    assert_eq!(h(&r, "location"), Some("http://approot.example.com/app1"));
    assert_eq!(
        upstream(&s.get("approot.example.com", "/app1").await)["path"],
        "/app1"
    );
}

/// `permanent-redirect` (301, or `-code`), `temporal-redirect` (302) which wins over it, and
/// out-of-range codes falling back to the default, as ingress-nginx's parser does.
#[tokio::test]
async fn permanent_and_temporal_redirects_with_codes() {
    let s = serve(|port| {
        [
            ingress(
                "p",
                "p.example.com",
                "/",
                &[("permanent-redirect", "https://www.example.org/new")],
                port,
            ),
            ingress(
                "p308",
                "p308.example.com",
                "/",
                &[
                    ("permanent-redirect", "https://www.example.org/"),
                    ("permanent-redirect-code", "308"),
                ],
                port,
            ),
            ingress(
                "pbad",
                "pbad.example.com",
                "/",
                &[
                    ("permanent-redirect", "https://www.example.org/"),
                    ("permanent-redirect-code", "200"),
                ],
                port,
            ),
            ingress(
                "t",
                "t.example.com",
                "/",
                &[
                    ("temporal-redirect", "https://www.example.org/tmp"),
                    ("permanent-redirect", "https://www.example.org/perm"),
                ],
                port,
            ),
            ingress(
                "t308",
                "t308.example.com",
                "/",
                &[
                    ("temporal-redirect", "https://www.example.org/tmp"),
                    ("temporal-redirect-code", "308"),
                ],
                port,
            ),
        ]
        .concat()
    })
    .await;
    for (host, code, location) in [
        ("p.example.com", 301, "https://www.example.org/new"),
        ("p308.example.com", 308, "https://www.example.org/"),
        ("pbad.example.com", 301, "https://www.example.org/"),
        ("t.example.com", 302, "https://www.example.org/tmp"),
        // 308 is outside temporal-redirect-code's 300-307: the default 302.
        ("t308.example.com", 302, "https://www.example.org/tmp"),
    ] {
        let r = s.get(host, "/any/path").await;
        assert_eq!(r.status.as_u16(), code, "{host}");
        assert_eq!(h(&r, "location"), Some(location), "{host}");
        assert!(!from_origin(&r), "{host}");
    }
}

/// `force-ssl-redirect`: plain HTTP gets 308 to `https://<host><uri>` (method and body kept),
/// except ACME HTTP-01 challenges; `ssl-redirect: "false"` with TLS does not redirect.
#[tokio::test]
async fn ssl_redirects_send_308_except_acme_challenges() {
    let s = serve(|port| {
        ingress(
            "force",
            "force.example.com",
            "/",
            &[("force-ssl-redirect", "true")],
            port,
        )
    })
    .await;
    for method in ["GET", "POST"] {
        let r = s.req(method, "force.example.com", "/a/b?c=d", &[], 0).await;
        assert_eq!(r.status, StatusCode::PERMANENT_REDIRECT, "{method}");
        assert_eq!(
            h(&r, "location"),
            Some("https://force.example.com/a/b?c=d"),
            "{method}"
        );
    }
    let r = s
        .get("force.example.com", "/.well-known/acme-challenge/token")
        .await;
    assert_eq!(upstream(&r)["path"], "/.well-known/acme-challenge/token");
    let off = serve(|port| {
        ingress(
            "off",
            "off.example.com",
            "/",
            &[("force-ssl-redirect", "false")],
            port,
        )
    })
    .await;
    assert_eq!(off.get("off.example.com", "/").await.status, StatusCode::OK);
}

/// `proxy-body-size`: 413 above the limit (nginx sizes), `0` no limit, and ingress-nginx's
/// default of 1m without the annotation.
#[tokio::test]
async fn proxy_body_size_with_nginx_units_and_the_1m_default() {
    let s = serve(|port| {
        [
            ingress(
                "small",
                "small.example.com",
                "/",
                &[("proxy-body-size", "1k")],
                port,
            ),
            ingress(
                "none",
                "none.example.com",
                "/",
                &[("proxy-body-size", "0")],
                port,
            ),
            ingress("default", "default.example.com", "/", &[], port),
        ]
        .concat()
    })
    .await;
    for (host, size, want) in [
        ("small.example.com", 1024, 200),
        ("small.example.com", 1025, 413),
        ("none.example.com", 3 << 20, 200),
        ("default.example.com", 1 << 20, 200),
        ("default.example.com", (1 << 20) + 1, 413),
    ] {
        let r = s.req("POST", host, "/upload", &[], size).await;
        assert_eq!(r.status.as_u16(), want, "{host} {size}");
    }
}

/// `enable-cors` with ingress-nginx's defaults, and `cors-allow-origin` lists (the matching
/// origin echoed, with credentials; `*.` wildcards one label; others get no CORS headers).
#[tokio::test]
async fn cors_defaults_and_origin_lists() {
    let s = serve(|port| {
        [
            ingress(
                "any",
                "any.example.com",
                "/",
                &[("enable-cors", "true")],
                port,
            ),
            ingress(
                "list",
                "list.example.com",
                "/",
                &[
                    ("enable-cors", "true"),
                    (
                        "cors-allow-origin",
                        "https://app.example.com, https://*.example.net",
                    ),
                    ("cors-allow-methods", "GET, POST"),
                    ("cors-max-age", "600"),
                ],
                port,
            ),
        ]
        .concat()
    })
    .await;
    assert_eq!(s.accepted("list").0, "True", "{:?}", s.accepted("list"));
    let pre = [
        ("origin", "https://app.example.com"),
        ("access-control-request-method", "GET"),
    ];
    let r = s.req("OPTIONS", "any.example.com", "/x", &pre, 0).await;
    assert!(!from_origin(&r), "the preflight reached the origin");
    assert_eq!(h(&r, "access-control-allow-origin"), Some("*"));
    assert_eq!(
        h(&r, "access-control-allow-methods"),
        Some("GET,PUT,POST,DELETE,PATCH,OPTIONS")
    );
    assert_eq!(h(&r, "access-control-max-age"), Some("1728000"));
    let r = s.req("GET", "any.example.com", "/x", &pre[..1], 0).await;
    assert!(from_origin(&r));
    assert_eq!(h(&r, "access-control-allow-origin"), Some("*"));

    for (origin, allowed) in [
        ("https://app.example.com", true),
        ("https://a.example.net", true),
        ("https://a.b.example.net", false),
        ("https://evil.example.com", false),
    ] {
        let r = s
            .req("GET", "list.example.com", "/x", &[("origin", origin)], 0)
            .await;
        assert!(from_origin(&r), "{origin}: {} {:?}", r.status, r.body);
        let got = h(&r, "access-control-allow-origin");
        if allowed {
            assert_eq!(got, Some(origin), "{origin}");
            assert_eq!(
                h(&r, "access-control-allow-credentials"),
                Some("true"),
                "{origin}"
            );
        } else {
            assert_eq!(got, None, "{origin}");
        }
    }
    let r = s
        .req(
            "OPTIONS",
            "list.example.com",
            "/x",
            &[
                ("origin", "https://app.example.com"),
                ("access-control-request-method", "POST"),
            ],
            0,
        )
        .await;
    assert_eq!(h(&r, "access-control-allow-methods"), Some("GET,POST"));
    assert_eq!(h(&r, "access-control-max-age"), Some("600"));
}

/// `whitelist-source-range` and `denylist-source-range`: 403 for the other (or listed)
/// client addresses; a bad CIDR rejects the Ingress naming the annotation.
#[tokio::test]
async fn source_ranges_answer_403() {
    let s = serve(|port| {
        [
            ingress(
                "in",
                "in.example.com",
                "/",
                &[("whitelist-source-range", "10.0.0.0/8, 127.0.0.1/32")],
                port,
            ),
            ingress(
                "out",
                "out.example.com",
                "/",
                &[("whitelist-source-range", "10.0.0.0/8")],
                port,
            ),
            ingress(
                "deny",
                "deny.example.com",
                "/",
                &[("denylist-source-range", "127.0.0.0/8")],
                port,
            ),
            ingress(
                "bad",
                "bad.example.com",
                "/",
                &[("whitelist-source-range", "10.0.0.0/33")],
                port,
            ),
        ]
        .concat()
    })
    .await;
    assert_eq!(s.get("in.example.com", "/").await.status, StatusCode::OK);
    assert_eq!(
        s.get("out.example.com", "/").await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        s.get("deny.example.com", "/").await.status,
        StatusCode::FORBIDDEN
    );
    let (status, msg) = s.accepted("bad");
    assert_eq!(status, "False", "{msg}");
    assert!(
        msg.contains("nginx.ingress.kubernetes.io/whitelist-source-range"),
        "{msg}"
    );
    // Fail closed: the rejected Ingress serves nothing.
    assert_eq!(
        s.get("bad.example.com", "/").await.status,
        StatusCode::NOT_FOUND
    );
}

/// `upstream-vhost`: the Host the origin sees.
#[tokio::test]
async fn upstream_vhost_sets_the_upstream_host() {
    let s = serve(|port| {
        ingress(
            "vhost",
            "vhost.example.com",
            "/",
            &[("upstream-vhost", "internal.svc.local")],
            port,
        )
    })
    .await;
    let u = upstream(&s.get("vhost.example.com", "/").await);
    assert_eq!(u["headers"]["host"], "internal.svc.local");
}

/// `limit-rps` with `limit-burst-multiplier`: burst = limit × multiplier requests pass at
/// once, the rest get 503 (limit-req-status-code).
#[tokio::test]
async fn limit_rps_answers_503_beyond_the_burst() {
    let s = serve(|port| {
        ingress(
            "rps",
            "rps.example.com",
            "/",
            &[("limit-rps", "1"), ("limit-burst-multiplier", "2")],
            port,
        )
    })
    .await;
    let mut codes = Vec::new();
    for _ in 0..6 {
        codes.push(s.get("rps.example.com", "/").await.status.as_u16());
    }
    // 1 r/s with a burst of 2: the first three pass, within any realistic test speed.
    assert_eq!(&codes[..3], &[200, 200, 200], "{codes:?}");
    assert!(codes.contains(&503), "{codes:?}");
}

/// Snippets are refused: the Ingress is not served and its status names the annotation;
/// an access-control annotation not served yet is refused the same way; unknown and ignored
/// annotations are named in the message of an Ingress still served.
#[tokio::test]
async fn snippets_and_unserved_access_control_are_refused_others_named() {
    let s = serve(|port| {
        [
            ingress(
                "snippet",
                "snippet.example.com",
                "/",
                &[("configuration-snippet", "more_set_headers \"X: y\";")],
                port,
            ),
            ingress(
                "auth",
                "auth.example.com",
                "/",
                &[("auth-tls-secret", "default/client-ca")],
                port,
            ),
            ingress(
                "other",
                "other.example.com",
                "/",
                &[("proxy-buffering", "on"), ("no-such-thing", "1")],
                port,
            ),
        ]
        .concat()
    })
    .await;
    for (name, annotation) in [
        ("snippet", "configuration-snippet"),
        ("auth", "auth-tls-secret"),
    ] {
        let (status, msg) = s.accepted(name);
        assert_eq!(status, "False", "{name}: {msg}");
        assert!(
            msg.contains(&format!("nginx.ingress.kubernetes.io/{annotation}")),
            "{msg}"
        );
        assert_eq!(
            s.get(&format!("{name}.example.com"), "/").await.status,
            StatusCode::NOT_FOUND
        );
    }
    let (status, msg) = s.accepted("other");
    assert_eq!(status, "True", "{msg}");
    assert!(
        msg.contains("nginx.ingress.kubernetes.io/proxy-buffering"),
        "{msg}"
    );
    assert!(
        msg.contains("nginx.ingress.kubernetes.io/no-such-thing"),
        "{msg}"
    );
    assert_eq!(s.get("other.example.com", "/").await.status, StatusCode::OK);
}

/// Without the class in `nginx_classes`, an Ingress of class `nginx` is not served.
#[tokio::test]
async fn only_the_named_classes_are_served_as_ingress_nginx() {
    let origin = EchoServer::start("app", any()).await.unwrap();
    let yaml = format!(
        "{}{}",
        service(origin.addr),
        ingress(
            "plain",
            "plain.example.com",
            "/",
            &[("app-root", "/app1")],
            origin.addr.port()
        )
    );
    let mut state = ClusterState::new();
    state.load_yaml("test.yaml", &yaml).unwrap();
    let opts = Options {
        ingress_class: Some("apisix".into()),
        ..Options::default()
    };
    let t = translate(&state, &opts);
    assert!(t.snapshot.routes.is_empty(), "{:?}", t.snapshot.routes);
}

/// A canary Ingress beside its main Ingress (same host and path), as ingress-nginx's
/// canary documentation: `canary-by-header` (`always` to the canary, `never` to the main
/// backend, before anything else), then `canary-by-cookie`, then `canary-weight` of the
/// rest. A canary without a main Ingress serves nothing and says so.
#[tokio::test]
async fn canary_by_header_cookie_and_weight_in_precedence() {
    let canary = EchoServer::start("canary", any()).await.unwrap();
    let canary_port = canary.addr.port();
    let canary_svc = format!("\n---{}", named_service("app-canary", canary_port));
    let s = serve(|port| {
        let canary_ing = ingress(
            "web-canary",
            "canary.example.com",
            "/",
            &[
                ("canary", "true"),
                ("canary-by-header", "X-Canary"),
                ("canary-by-cookie", "canary"),
                ("canary-weight", "30"),
                ("proxy-body-size", "1k"),
            ],
            port,
        )
        .replace(
            &format!("number: {port}"),
            &format!("number: {canary_port}"),
        )
        .replace("name: app, port", "name: app-canary, port");
        let orphan = ingress(
            "orphan-canary",
            "nobody.example.com",
            "/",
            &[("canary", "true"), ("canary-weight", "50")],
            port,
        );
        format!(
            "{canary_svc}{}{canary_ing}{orphan}",
            ingress("web", "canary.example.com", "/", &[], port)
        )
    })
    .await;
    let server = |r: &Resp| upstream(r)["server"].as_str().unwrap().to_owned();
    let with = |headers: Vec<(&'static str, &'static str)>| {
        let s = &s;
        async move { s.req("GET", "canary.example.com", "/x", &headers, 0).await }
    };
    assert_eq!(server(&with(vec![("x-canary", "always")]).await), "canary");
    // `never` wins over the cookie.
    assert_eq!(
        server(&with(vec![("x-canary", "never"), ("cookie", "canary=always")]).await),
        "app"
    );
    assert_eq!(
        server(&with(vec![("cookie", "canary=always")]).await),
        "canary"
    );
    // Another header value falls through to the cookie, and `never` there to the main one.
    assert_eq!(
        server(&with(vec![("x-canary", "maybe"), ("cookie", "canary=never")]).await),
        "app"
    );
    // The rest: 30% to the canary.
    let mut to_canary = 0;
    for _ in 0..200 {
        if server(&with(vec![]).await) == "canary" {
            to_canary += 1;
        }
    }
    assert!(
        (30..=90).contains(&to_canary),
        "{to_canary} of 200 went to the canary"
    );
    let (status, msg) = s.accepted("web-canary");
    assert_eq!(status, "True", "{msg}");
    assert!(
        msg.contains("proxy-body-size"),
        "the ignored annotation is named: {msg}"
    );
    let (status, msg) = s.accepted("orphan-canary");
    assert_eq!(status, "True", "{msg}");
    assert!(msg.contains("nothing goes to it"), "{msg}");
    assert_eq!(
        s.get("nobody.example.com", "/").await.status,
        StatusCode::NOT_FOUND
    );
}

/// A TLS origin (certificate `cert`) answering JSON with the SNI the client sent.
async fn tls_origin(cert: &sluice_testkit::pki::Cert) -> SocketAddr {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert.chain_pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let sni = tls.get_ref().1.server_name().map(str::to_owned);
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let body =
                            serde_json::json!({"path": req.uri().path(), "sni": sni, "tls": true});
                        async move {
                            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                                Bytes::from(body.to_string()),
                            )))
                        }
                    });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
            });
        }
    });
    addr
}

/// `backend-protocol: HTTPS` with `proxy-ssl-secret` (its `ca.crt`) and `proxy-ssl-name`:
/// TLS to the backend, its certificate verified for that name (a wrong name, or no CA,
/// is a 502, never plain text); `proxy-ssl-verify: "off"` and a Secret of another namespace
/// are refused.
#[tokio::test]
async fn backend_https_with_verification_against_the_secrets_ca() {
    use base64::Engine as _;
    let ca = sluice_testkit::pki::Ca::new("backend CA");
    let origin = tls_origin(&ca.leaf(&["backend.internal"])).await;
    let ca_b64 = base64::engine::general_purpose::STANDARD.encode(&ca.pem);
    let port = origin.port();
    let secret = format!(
        "
---
apiVersion: v1
kind: Secret
metadata: {{name: backend-ca, namespace: default}}
data: {{ca.crt: {ca_b64}}}
"
    );
    let secret = format!("{secret}---{}", named_service("tlsapp", port));
    let s = serve(|_| {
        let https = |name: &str, host: &str, extra: &[(&str, &str)]| {
            let mut a = vec![("backend-protocol", "HTTPS")];
            a.extend_from_slice(extra);
            ingress(name, host, "/", &a, port).replace("name: app, port", "name: tlsapp, port")
        };
        format!(
            "{secret}{}{}{}{}{}",
            https(
                "good",
                "good.example.com",
                &[
                    ("proxy-ssl-secret", "default/backend-ca"),
                    ("proxy-ssl-verify", "on"),
                    ("proxy-ssl-name", "backend.internal")
                ]
            ),
            https(
                "wrong-name",
                "wrong.example.com",
                &[
                    ("proxy-ssl-secret", "default/backend-ca"),
                    ("proxy-ssl-name", "other.internal")
                ]
            ),
            https(
                "no-ca",
                "noca.example.com",
                &[("proxy-ssl-name", "backend.internal")]
            ),
            https("off", "off.example.com", &[("proxy-ssl-verify", "off")]),
            https(
                "elsewhere",
                "elsewhere.example.com",
                &[("proxy-ssl-secret", "other/backend-ca")]
            ),
        )
    })
    .await;
    let r = s.get("good.example.com", "/x").await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["sni"], "backend.internal");
    assert_eq!(v["tls"], true);
    for host in ["wrong.example.com", "noca.example.com"] {
        assert_eq!(
            s.get(host, "/x").await.status,
            StatusCode::BAD_GATEWAY,
            "{host}"
        );
    }
    for (name, annotation) in [
        ("off", "proxy-ssl-verify"),
        ("elsewhere", "proxy-ssl-secret"),
    ] {
        let (status, msg) = s.accepted(name);
        assert_eq!(status, "False", "{name}: {msg}");
        assert!(
            msg.contains(&format!("nginx.ingress.kubernetes.io/{annotation}")),
            "{msg}"
        );
    }
}

/// `auth-type: basic` with an htpasswd Secret (`auth-file`, key `auth`; or `auth-map`)
/// and `auth-realm`, as ingress-nginx's basic-auth example: 401 with
/// `WWW-Authenticate: Basic realm="…"` without or with wrong credentials, 200 with the
/// right ones (hashes made by `openssl passwd -apr1`, libxcrypt's bcrypt and
/// `openssl dgst -sha1`; a password with a space kept as sent), the `Authorization`
/// header not passed upstream; a missing Secret refuses the Ingress.
#[tokio::test]
async fn basic_auth_with_an_htpasswd_secret_and_realm() {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let file = b64(
        "# users\nfoo:$apr1$sAlt1234$nQULF6mfiJyz.vfg0uuey/\nbar:$2b$04$D7AJplNtkKv2MF48vP6TRe1B1bbA.KGiyW.OmPJnugdVQVT3LK6.e\nsam:{SHA}O/MvdjOwOQpt8I9HBSVZugThPMw=\n",
    );
    let map_hash = b64("$apr1$X9y8Z7w6$UWjuC/PJEOsa3hhkB7eiA/");
    let secrets = format!(
        "
---
apiVersion: v1
kind: Secret
metadata: {{name: basic-auth, namespace: default}}
data: {{auth: {file}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: basic-map, namespace: default}}
data: {{mapuser: {map_hash}}}
"
    );
    let s = serve(|port| {
        format!(
            "{secrets}{}{}{}",
            ingress(
                "file",
                "file.example.com",
                "/",
                &[
                    ("auth-type", "basic"),
                    ("auth-secret", "basic-auth"),
                    ("auth-realm", "Authentication Required - foo")
                ],
                port
            ),
            ingress(
                "map",
                "map.example.com",
                "/",
                &[
                    ("auth-type", "basic"),
                    ("auth-secret", "default/basic-map"),
                    ("auth-secret-type", "auth-map")
                ],
                port
            ),
            ingress(
                "missing",
                "missing.example.com",
                "/",
                &[("auth-type", "basic"), ("auth-secret", "nope")],
                port
            ),
        )
    })
    .await;
    let basic = |u: &str, p: &str| format!("Basic {}", b64(&format!("{u}:{p}")));
    let realm = "Basic realm=\"Authentication Required - foo\"";
    let r = s.get("file.example.com", "/").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(h(&r, "www-authenticate"), Some(realm));
    for (u, p) in [
        ("foo", "twowords"),
        ("foo", "wrong"),
        ("nobody", "two words"),
    ] {
        let auth = basic(u, p);
        let r = s
            .req(
                "GET",
                "file.example.com",
                "/",
                &[("authorization", &auth)],
                0,
            )
            .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{u}:{p}");
        assert_eq!(h(&r, "www-authenticate"), Some(realm), "{u}:{p}");
    }
    for (u, p) in [
        ("foo", "two words"),
        ("bar", "bcrypt-pw"),
        ("sam", "sha-pw"),
    ] {
        let auth = basic(u, p);
        let r = s
            .req(
                "GET",
                "file.example.com",
                "/",
                &[("authorization", &auth)],
                0,
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{u}:{p}");
        assert!(
            upstream(&r)["headers"].get("authorization").is_none(),
            "{u}: credentials passed upstream"
        );
    }
    let auth = basic("mapuser", "s3cret");
    let r = s
        .req(
            "GET",
            "map.example.com",
            "/",
            &[("authorization", &auth)],
            0,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = s.get("map.example.com", "/").await;
    assert_eq!(h(&r, "www-authenticate"), Some("Basic realm=\"\""));
    let (status, msg) = s.accepted("missing");
    assert_eq!(status, "False", "{msg}");
    assert!(
        msg.contains("nginx.ingress.kubernetes.io/auth-secret"),
        "{msg}"
    );
    assert_eq!(
        s.get("missing.example.com", "/").await.status,
        StatusCode::NOT_FOUND
    );
}

/// `auth-url`: each request is first asked of the auth service (here an echo server whose
/// `/status/NNN` path answers NNN): 2xx lets it through to the backend, a 401 goes back to
/// the client, an unreachable service is a 500 (nginx's answer); `auth-signin` is refused.
#[tokio::test]
async fn auth_url_asks_the_service_first() {
    let auth = EchoServer::start("auth", any()).await.unwrap();
    let closed = closed_port();
    let s = serve(|port| {
        let a = auth.addr;
        [
            ingress(
                "allow",
                "allow.example.com",
                "/",
                &[("auth-url", &format!("http://{a}/status/200"))],
                port,
            ),
            ingress(
                "deny",
                "deny.example.com",
                "/",
                &[("auth-url", &format!("http://{a}/status/401"))],
                port,
            ),
            ingress(
                "down",
                "down.example.com",
                "/",
                &[("auth-url", &format!("http://{closed}/"))],
                port,
            ),
            ingress(
                "signin",
                "signin.example.com",
                "/",
                &[
                    ("auth-url", &format!("http://{a}/status/401")),
                    ("auth-signin", "https://login.example.com/start"),
                ],
                port,
            ),
            ingress(
                "vars",
                "vars.example.com",
                "/",
                &[("auth-url", "https://$host/oauth2/auth")],
                port,
            ),
        ]
        .concat()
    })
    .await;
    let r = s
        .req(
            "GET",
            "allow.example.com",
            "/x",
            &[("cookie", "session=abc")],
            0,
        )
        .await;
    assert_eq!(upstream(&r)["server"], "app");
    assert_eq!(
        s.get("deny.example.com", "/x").await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        s.get("down.example.com", "/x").await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    for (name, annotation) in [("signin", "auth-signin"), ("vars", "auth-url")] {
        let (status, msg) = s.accepted(name);
        assert_eq!(status, "False", "{name}: {msg}");
        assert!(
            msg.contains(&format!("nginx.ingress.kubernetes.io/{annotation}")),
            "{msg}"
        );
    }
}

/// Settings of ingress-nginx's ConfigMap: the defaults of the annotations of the same names
/// (an annotation still overrides them), the redirect code, the limit status, and
/// `use-forwarded-headers` (the client address from X-Forwarded-For, which the source range
/// then sees); a key Sluice does not take, or a bad value, is refused naming the key.
#[tokio::test]
async fn configmap_settings_are_the_defaults_of_the_class() {
    let s = serve_with(
        |port| {
            [
                ingress("plain", "plain.example.com", "/", &[], port),
                ingress(
                    "own",
                    "own.example.com",
                    "/",
                    &[
                        ("proxy-body-size", "8k"),
                        ("whitelist-source-range", "127.0.0.1/32"),
                        ("force-ssl-redirect", "false"),
                    ],
                    port,
                ),
                ingress(
                    "rps",
                    "rps.example.com",
                    "/",
                    &[
                        ("limit-rps", "1"),
                        ("limit-burst-multiplier", "1"),
                        ("force-ssl-redirect", "false"),
                    ],
                    port,
                ),
            ]
            .concat()
        },
        &[
            ("proxy-body-size", "1k"),
            ("force-ssl-redirect", "true"),
            ("http-redirect-code", "301"),
            ("whitelist-source-range", "10.0.0.0/8"),
            ("use-forwarded-headers", "true"),
            ("limit-req-status-code", "429"),
        ],
    )
    .await;
    // force-ssl-redirect from the ConfigMap, with its code.
    let r = s.get("plain.example.com", "/a").await;
    assert_eq!(r.status, StatusCode::MOVED_PERMANENTLY);
    assert_eq!(h(&r, "location"), Some("https://plain.example.com/a"));
    // The annotations of the same names win; the ConfigMap's source range and the
    // forwarded client address.
    let xff = [("x-forwarded-for", "10.1.2.3")];
    assert_eq!(
        s.req("POST", "own.example.com", "/", &[], 4096)
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        s.req("POST", "own.example.com", "/", &[], 9000)
            .await
            .status,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    assert_eq!(s.get("own.example.com", "/").await.status, StatusCode::OK);
    assert_eq!(
        s.req("GET", "own.example.com", "/", &xff, 0).await.status,
        StatusCode::FORBIDDEN
    );
    // rps.example.com: the ConfigMap's range admits 10.1.2.3 only; over the limit, the
    // ConfigMap's status.
    let mut codes = Vec::new();
    for _ in 0..6 {
        codes.push(
            s.req("GET", "rps.example.com", "/", &xff, 0)
                .await
                .status
                .as_u16(),
        );
    }
    assert!(codes.contains(&429), "{codes:?}");
    assert!(codes.iter().all(|c| *c == 200 || *c == 429), "{codes:?}");
    assert_eq!(
        s.get("rps.example.com", "/").await.status,
        StatusCode::FORBIDDEN
    );

    assert!(sluice_translate::nginx::check_config("hsts", "maybe").is_err());
    let e = sluice_translate::nginx::check_config("allow-snippet-annotations", "true").unwrap_err();
    assert!(e.starts_with("allow-snippet-annotations: "), "{e}");
    assert!(sluice_translate::nginx::parse_config("proxy-body-size=10m").is_ok());
}

/// `hsts` (on by default, as ingress-nginx): HTTPS answers for a host with TLS carry
/// Strict-Transport-Security; a host without TLS gets none.
#[test]
fn hsts_goes_on_the_https_answers_of_hosts_with_tls() {
    let yaml = format!(
        "{}{}{}",
        service("127.0.0.1:8080".parse().unwrap()),
        ingress("tls", "tls.example.com", "/", &[], 8080).replace(
            "  rules:",
            "  tls: [{hosts: [tls.example.com], secretName: tls-cert}]\n  rules:"
        ),
        ingress("plain", "plain.example.com", "/", &[], 8080),
    );
    let mut state = ClusterState::new();
    state.load_yaml("test.yaml", &yaml).unwrap();
    let run = |config: &[(&str, &str)]| {
        let opts = Options {
            nginx_classes: vec!["nginx".into()],
            nginx_config: config
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Options::default()
        };
        translate(&state, &opts).snapshot.routes
    };
    let hsts = |routes: &[sluice_proto::v1::Route], host: &str| {
        routes
            .iter()
            .filter(|r| r.hosts.iter().any(|h| h == host) && !r.id.ends_with("-ssl-redirect"))
            .flat_map(|r| r.plugins.iter())
            .find(|p| p.name == "response-rewrite")
            .map(|p| p.config_json.clone())
    };
    let routes = run(&[]);
    let conf = hsts(&routes, "tls.example.com").expect("HSTS on the TLS host");
    assert!(
        conf.contains("max-age=31536000; includeSubDomains"),
        "{conf}"
    );
    assert!(conf.contains("https"), "{conf}");
    assert_eq!(hsts(&routes, "plain.example.com"), None);
    let routes = run(&[("hsts", "false")]);
    assert_eq!(hsts(&routes, "tls.example.com"), None);
}
