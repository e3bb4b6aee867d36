//! Plugins with real processes on a real kube-apiserver: each plugin is written
//! as APISIX users write it (an ApisixRoute's `plugins`, an ApisixConsumer's `hmacAuth`, an
//! ApisixPluginConfig, Ingress `auth-*` annotations), applied with kubectl, translated by the
//! `sluice-controller` binary and served by the `sluice-dataplane` binary; the behaviour is
//! observed through real traffic, with real servers on the other side: an authorization
//! service, an OpenID provider serving its JWKS, a log receiver, a mirror host (HTTP servers
//! of this test on loopback, where the dataplane process reaches them) and the OpenTelemetry
//! Collector that `scripts/install/otelcol.sh` builds.
//!
//! Three pipelines share the startup cost: authentication plugins, observability plugins
//! (the dataplane restarted with `--plugin-metadata` for its collector), and traffic
//! control plus a refused plugin. Each route has its own host; every allowed path is
//! checked with its denied path, so each case can fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::{Value, json};
use sluice_e2e::{
    HttpRecorder, HttpResponse, Pipeline, Reply, eventually, free_port, http_get_with, http_request,
};

const WAIT: Duration = Duration::from_secs(30);

/// An ApisixRoute `name` with one rule for `host` (`/*`) to Service `echo`, with `plugins`
/// (name, config) and `extra` rule fields (YAML lines at the rule's indentation).
fn route(ns: &str, name: &str, host: &str, plugins: &[(&str, Value)], extra: &str) -> String {
    let mut plugin_yaml = String::new();
    for (plugin, config) in plugins {
        plugin_yaml.push_str(&format!(
            "        - name: {plugin}\n          enable: true\n          config: {config}\n"
        ));
    }
    let plugins = if plugins.is_empty() {
        String::new()
    } else {
        format!("      plugins:\n{plugin_yaml}")
    };
    format!(
        r#"apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: {name}, namespace: {ns}}}
spec:
  ingressClassName: apisix
  http:
    - name: r
      match: {{hosts: [{host}], paths: ["/*"]}}
      backends: [{{serviceName: echo, servicePort: 80}}]
{extra}{plugins}"#
    )
}

fn get(p: &Pipeline, host: &str, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    http_get_with(p.http, host, path, headers).unwrap_or_else(|e| panic!("GET {host}{path}: {e}"))
}

fn post(
    p: &Pipeline,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> HttpResponse {
    http_request(p.http, "POST", host, path, headers, body.as_bytes())
        .unwrap_or_else(|e| panic!("POST {host}{path}: {e}"))
}

/// Waits until `GET host path` is answered `want`.
fn wait_for(p: &Pipeline, host: &str, path: &str, headers: &[(&str, &str)], want: u16) {
    eventually(WAIT, || {
        http_get_with(p.http, host, path, headers)
            .ok()
            .filter(|r| r.status == want)
    })
    .unwrap_or_else(|| panic!("{host}{path} was not answered {want} within {WAIT:?}"));
}

/// The echo backend's view of the request, when the echo backend answered.
fn echoed(r: &HttpResponse) -> Option<Value> {
    if r.header("x-echo-server") != Some("e2e-echo") {
        return None;
    }
    serde_json::from_str(&r.body).ok()
}

/// The upstream's view of a request that must have reached it.
fn upstream_saw(r: &HttpResponse) -> Value {
    echoed(r).unwrap_or_else(|| panic!("not answered by the echo backend: {r:?}"))
}

fn body_json(r: &HttpResponse) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {r:?}"))
}

/// The `type` condition of `kind/name` in the pipeline's namespace.
fn condition(p: &Pipeline, kind: &str, name: &str, ty: &str) -> Option<Value> {
    let out = p
        .cluster
        .kubectl(&["get", kind, name, "-n", &p.namespace, "-o", "json"])
        .ok()?;
    let obj: Value = serde_json::from_str(&out.stdout).ok()?;
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)
        .cloned()
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An IMF-fixdate (`Date` header) for `secs` since the epoch.
fn http_date(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        DAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn b64url(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// An Ed25519 key of the test's OpenID provider.
struct EdKey {
    pair: ring::signature::Ed25519KeyPair,
}

impl EdKey {
    fn generate() -> EdKey {
        use ring::signature::KeyPair as _;
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        assert_eq!(pair.public_key().as_ref().len(), 32);
        EdKey { pair }
    }

    fn jwk(&self, kid: &str) -> Value {
        use ring::signature::KeyPair as _;
        json!({"kty": "OKP", "crv": "Ed25519", "x": b64url(self.pair.public_key().as_ref()),
               "kid": kid, "use": "sig", "alg": "EdDSA"})
    }

    /// A compact JWS (EdDSA) of `claims` with `kid`.
    fn sign(&self, kid: &str, claims: &Value) -> String {
        let header = json!({"alg": "EdDSA", "typ": "JWT", "kid": kid});
        let input = format!(
            "{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes())
        );
        let sig = self.pair.sign(input.as_bytes());
        format!("{input}.{}", b64url(sig.as_ref()))
    }
}

/// An APISIX 3.x hmac-auth `Authorization` for `GET target` signed over
/// `@request-target date`.
fn hmac_authorization(key_id: &str, secret: &str, target: &str, date: &str) -> String {
    let text = format!("{key_id}\nGET {target}\ndate: {date}\n");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, text.as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(tag.as_ref());
    format!(
        "Signature keyId=\"{key_id}\",algorithm=\"hmac-sha256\",headers=\"@request-target date\",signature=\"{sig}\""
    )
}

// ------------------------------------------------------------------ authentication

#[test]
fn forward_auth_oidc_and_hmac_auth_on_the_real_api_server() {
    let p = Pipeline::start().unwrap();
    let ns = p.namespace.clone();

    // The authorization service: `Bearer let-me-in` passes as alice, anything else is
    // refused with a login redirect the client must see.
    let auth = HttpRecorder::start(|r| match r.header("authorization") {
        Some("Bearer let-me-in") => Reply::new(200, "").header("X-User-ID", "alice"),
        _ => Reply::new(401, r#"{"message":"denied by the auth service"}"#)
            .header("Location", "https://login.e2e/")
            .header("X-Internal", "not for clients"),
    })
    .unwrap();

    // The OpenID provider: discovery document and JWKS (key `e2e-1`).
    let key = EdKey::generate();
    let jwks = json!({"keys": [key.jwk("e2e-1")]}).to_string();
    let idp = HttpRecorder::start(move |r| {
        let host = r.header("host").unwrap_or_default().to_owned();
        match r.target.as_str() {
            "/.well-known/openid-configuration" => Reply::new(
                200,
                json!({"issuer": "https://idp.e2e", "jwks_uri": format!("http://{host}/jwks")})
                    .to_string(),
            )
            .header("Content-Type", "application/json"),
            "/jwks" => Reply::new(200, jwks.clone()).header("Content-Type", "application/json"),
            _ => Reply::new(404, ""),
        }
    })
    .unwrap();

    let docs = [
        route(
            &ns,
            "fa",
            "fa.e2e",
            &[(
                "forward-auth",
                json!({"uri": auth.url("/verify"), "request_headers": ["Authorization"],
                       "upstream_headers": ["X-User-ID"], "client_headers": ["Location"]}),
            )],
            "",
        ),
        format!(
            r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: ing-auth
  namespace: {ns}
  annotations:
    k8s.apisix.apache.org/auth-uri: "{uri}"
    k8s.apisix.apache.org/auth-request-headers: "Authorization"
    k8s.apisix.apache.org/auth-upstream-headers: "X-User-ID"
spec:
  ingressClassName: apisix
  rules:
    - host: ing.e2e
      http:
        paths:
          - path: /
            pathType: Prefix
            backend: {{service: {{name: echo, port: {{number: 80}}}}}}
"#,
            uri = auth.url("/ingress-verify")
        ),
        route(
            &ns,
            "oidc",
            "oidc.e2e",
            &[(
                "openid-connect",
                json!({"client_id": "e2e", "bearer_only": true, "use_jwks": true,
                       "discovery": idp.url("/.well-known/openid-configuration")}),
            )],
            "",
        ),
        route(
            &ns,
            "hmac",
            "hmac.e2e",
            &[],
            "      authentication: {enable: true, type: hmacAuth}\n",
        ),
        format!(
            r#"apiVersion: apisix.apache.org/v2
kind: ApisixConsumer
metadata: {{name: jack, namespace: {ns}}}
spec:
  ingressClassName: apisix
  authParameter:
    hmacAuth:
      value: {{key_id: jack-key, secret_key: jack-secret}}
"#
        ),
    ];
    p.cluster.apply(&docs.join("---\n")).unwrap();

    // ---- forward-auth (ApisixRoute): allow, with the service's X-User-ID upstream.
    let allow = [
        ("Authorization", "Bearer let-me-in"),
        ("X-User-ID", "mallory"),
    ];
    wait_for(&p, "fa.e2e", "/api?q=1", &allow, 200);
    let r = get(&p, "fa.e2e", "/api?q=1", &allow);
    let seen = upstream_saw(&r);
    assert_eq!(seen["headers"]["x-user-id"], "alice", "{seen}");
    let asked = auth
        .requests()
        .into_iter()
        .rfind(|q| q.target == "/verify")
        .expect("the auth service was asked");
    assert_eq!(asked.method, "GET");
    assert_eq!(asked.header("authorization"), Some("Bearer let-me-in"));
    assert_eq!(asked.header("x-forwarded-uri"), Some("/api?q=1"));
    assert_eq!(asked.header("x-forwarded-host"), Some("fa.e2e"));
    assert_eq!(asked.header("x-forwarded-method"), Some("GET"));
    assert_eq!(
        asked.header("x-user-id"),
        None,
        "unlisted client headers stay"
    );
    // Deny: the service's answer goes to the client, with only the client_headers.
    for headers in [&[("Authorization", "Bearer wrong")][..], &[]] {
        let r = get(&p, "fa.e2e", "/api", headers);
        assert_eq!(r.status, 401, "{r:?}");
        assert!(
            echoed(&r).is_none(),
            "denied requests never reach the upstream"
        );
        assert_eq!(
            body_json(&r),
            json!({"message": "denied by the auth service"})
        );
        assert_eq!(r.header("location"), Some("https://login.e2e/"));
        assert_eq!(r.header("x-internal"), None);
    }

    // ---- Ingress auth-* annotations → forward-auth.
    wait_for(&p, "ing.e2e", "/x", &allow, 200);
    let r = get(&p, "ing.e2e", "/x", &allow);
    assert_eq!(upstream_saw(&r)["headers"]["x-user-id"], "alice");
    assert!(
        auth.requests()
            .iter()
            .any(|q| q.target == "/ingress-verify"
                && q.header("x-forwarded-host") == Some("ing.e2e")),
        "the Ingress's auth-uri was asked"
    );
    let r = get(&p, "ing.e2e", "/x", &[("Authorization", "Bearer wrong")]);
    assert_eq!(r.status, 401, "{r:?}");
    assert!(echoed(&r).is_none());

    // ---- openid-connect: a token signed by the provider's JWKS key passes.
    let claims = json!({"iss": "https://idp.e2e", "sub": "alice", "aud": "e2e",
                        "exp": now_secs() + 600});
    let token = key.sign("e2e-1", &claims);
    let bearer = format!("Bearer {token}");
    wait_for(&p, "oidc.e2e", "/me", &[("Authorization", &bearer)], 200);
    let r = get(&p, "oidc.e2e", "/me", &[("Authorization", &bearer)]);
    let seen = upstream_saw(&r);
    assert_eq!(seen["headers"]["x-access-token"], token.as_str());
    let info = base64::engine::general_purpose::STANDARD
        .decode(seen["headers"]["x-userinfo"].as_str().unwrap_or_default())
        .unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&info).unwrap(), claims);
    assert!(
        idp.requests().iter().any(|q| q.target == "/jwks"),
        "the JWKS was fetched from the provider"
    );
    // Signed by another key under the same kid, expired, or missing: 401.
    let forged = EdKey::generate().sign("e2e-1", &claims);
    let mut expired_claims = claims.clone();
    expired_claims["exp"] = json!(now_secs() - 3600);
    let expired = key.sign("e2e-1", &expired_claims);
    for (what, token) in [("forged", &forged), ("expired", &expired)] {
        let r = get(
            &p,
            "oidc.e2e",
            "/me",
            &[("Authorization", &format!("Bearer {token}"))],
        );
        assert_eq!(r.status, 401, "{what}: {r:?}");
        assert!(echoed(&r).is_none(), "{what}");
        let challenge = r.header("www-authenticate").unwrap_or_default();
        assert!(
            challenge.contains("error=\"invalid_token\""),
            "{what}: {challenge}"
        );
    }
    let r = get(&p, "oidc.e2e", "/me", &[]);
    assert_eq!(r.status, 401, "{r:?}");
    assert!(
        r.header("www-authenticate")
            .unwrap_or_default()
            .starts_with("Bearer")
    );

    // ---- hmac-auth through an ApisixConsumer's hmacAuth and `authentication`.
    let date = http_date(now_secs());
    let signed = hmac_authorization("jack-key", "jack-secret", "/signed?a=1", &date);
    let headers = [("Date", date.as_str()), ("Authorization", signed.as_str())];
    wait_for(&p, "hmac.e2e", "/signed?a=1", &headers, 200);
    let r = get(&p, "hmac.e2e", "/signed?a=1", &headers);
    assert_eq!(upstream_saw(&r)["path"], "/signed");
    let wrong = hmac_authorization("jack-key", "not-the-secret", "/signed?a=1", &date);
    let other_target = hmac_authorization("jack-key", "jack-secret", "/other", &date);
    for (what, auth) in [
        ("wrong secret", &wrong),
        ("signed for another target", &other_target),
    ] {
        let r = get(
            &p,
            "hmac.e2e",
            "/signed?a=1",
            &[("Date", &date), ("Authorization", auth)],
        );
        assert_eq!(r.status, 401, "{what}: {r:?}");
        assert_eq!(
            body_json(&r),
            json!({"message": "client request can't be validated"}),
            "{what}"
        );
    }
    let r = get(&p, "hmac.e2e", "/signed?a=1", &[("Date", &date)]);
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(
        body_json(&r),
        json!({"message": "client request can't be validated: missing Authorization header"})
    );
    assert_eq!(r.header("www-authenticate"), Some("hmac realm=\"hmac\""));
}

// ------------------------------------------------------------------ observability

/// The collector binary: `$SLUICE_OTELCOL`, else the one `scripts/install/otelcol.sh` built
/// (`$SLUICE_CACHE/bin/otelcol-sluice`, default `~/.cache/sluice/bin/otelcol-sluice`), as
/// the dataplane's opentelemetry tests find it.
fn otelcol_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_OTELCOL") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("SLUICE_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/sluice")))
        .unwrap_or_else(|| PathBuf::from(".cache/sluice"));
    cache.join("bin/otelcol-sluice")
}

/// A real OpenTelemetry Collector: OTLP/HTTP receiver on a loopback port, debug exporter at
/// detailed verbosity writing to `log`.
struct Collector {
    child: Child,
    addr: std::net::SocketAddr,
    log: PathBuf,
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Collector {
    fn start(dir: &std::path::Path) -> Collector {
        let bin = otelcol_path();
        assert!(
            bin.is_file(),
            "no OpenTelemetry Collector at {}: build it with scripts/install/otelcol.sh \
             (scripts/test.sh does)",
            bin.display()
        );
        let addr = free_port().unwrap();
        let config = dir.join("otelcol.yaml");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: {addr}\n\
                 exporters:\n  debug:\n    verbosity: detailed\n\
                 service:\n  telemetry:\n    metrics:\n      level: none\n\
                 \x20 pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [debug]\n"
            ),
        )
        .unwrap();
        let log = dir.join("otelcol.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(&bin)
            .arg("--config")
            .arg(format!("file:{}", config.display()))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let c = Collector { child, addr, log };
        eventually(WAIT, || {
            c.text().contains("Everything is ready").then_some(())
        })
        .unwrap_or_else(|| panic!("the collector did not start:\n{}", c.text()));
        c
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The debug exporter's block for the span of trace `trace` (from its `Span #` line to
    /// the next one, each line trimmed with runs of blanks made one space), once there is one.
    fn span_of(&self, trace: &str) -> Option<String> {
        let text = self.text();
        let lines: Vec<String> = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        let blocks = lines.split(|l| l.starts_with("Span #") || l.starts_with("ResourceSpans #"));
        blocks
            .map(|b| b.join("\n"))
            .find(|b| b.contains(&format!("Trace ID : {trace}")))
    }
}

/// Log entries the receiver got: each POST's JSON body (an object, or an array of them).
fn log_entries(logs: &HttpRecorder) -> Vec<Value> {
    let mut out = Vec::new();
    for q in logs.requests() {
        match serde_json::from_slice::<Value>(&q.body) {
            Ok(Value::Array(entries)) => out.extend(entries),
            Ok(entry) => out.push(entry),
            Err(_) => {}
        }
    }
    out
}

#[test]
fn opentelemetry_loggers_and_proxy_mirror_on_the_real_api_server() {
    let mut p = Pipeline::start().unwrap();
    let ns = p.namespace.clone();
    let dir = p.cluster.dir().to_path_buf();

    // The collector settings are plugin metadata, read by the dataplane at start.
    let collector = Collector::start(&dir);
    let metadata = dir.join("plugin-metadata.yaml");
    std::fs::write(
        &metadata,
        json!({"opentelemetry": {
            "collector": {"address": collector.addr.to_string()},
            "batch_span_processor": {"max_export_batch_size": 1, "inactive_timeout": 0.1, "batch_timeout": 0.1},
        }})
        .to_string(),
    )
    .unwrap();
    p.restart_dataplane_with(&[
        "--plugin-metadata",
        &metadata.to_string_lossy(),
        "--file-logger-dir",
        &dir.to_string_lossy(),
    ])
    .unwrap();

    let logs = HttpRecorder::start(|_| Reply::new(200, "")).unwrap();
    let mirror = HttpRecorder::start(|_| Reply::new(200, "the mirror's answer")).unwrap();
    let access_log = dir.join("access.log");

    let docs = [
        route(
            &ns,
            "otel",
            "otel.e2e",
            &[("opentelemetry", json!({"sampler": {"name": "always_on"}}))],
            "",
        ),
        // The default sampler (always_off): nothing is exported.
        route(
            &ns,
            "otel-off",
            "otel-off.e2e",
            &[("opentelemetry", json!({}))],
            "",
        ),
        route(
            &ns,
            "hl",
            "hl.e2e",
            &[(
                "http-logger",
                json!({"uri": logs.url("/logs"), "batch_max_size": 1, "inactive_timeout": 1}),
            )],
            "",
        ),
        route(
            &ns,
            "fl",
            "fl.e2e",
            &[("file-logger", json!({"path": access_log.to_string_lossy()}))],
            "",
        ),
        route(
            &ns,
            "pm",
            "pm.e2e",
            &[(
                "proxy-mirror",
                json!({"host": format!("http://{}", mirror.addr())}),
            )],
            "",
        ),
    ];
    p.cluster.apply(&docs.join("---\n")).unwrap();

    // ---- opentelemetry: the client's trace continues upstream and its span reaches the
    // collector. The unsampled request goes first: the export queue is first in, first out.
    const OFF_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const PARENT: &str = "00f067aa0ba902b7";
    let off = format!("00-{OFF_TRACE}-{PARENT}-01");
    wait_for(&p, "otel-off.e2e", "/quiet", &[("traceparent", &off)], 200);
    let traceparent = format!("00-{TRACE}-{PARENT}-01");
    wait_for(&p, "otel.e2e", "/warmup", &[], 200);
    let r = get(
        &p,
        "otel.e2e",
        "/traced?x=1",
        &[("traceparent", &traceparent)],
    );
    let upstream_tp = upstream_saw(&r)["headers"]["traceparent"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        upstream_tp.starts_with(&format!("00-{TRACE}-")) && upstream_tp.ends_with("-01"),
        "the upstream continues the client's trace: {upstream_tp}"
    );
    let span_id = &upstream_tp[36..52];
    assert_ne!(span_id, PARENT, "the upstream's parent is the proxy's span");
    let span = eventually(WAIT, || collector.span_of(TRACE)).unwrap_or_else(|| {
        panic!(
            "no span of trace {TRACE} at the collector:\n{}",
            collector.text()
        )
    });
    assert!(span.contains(&format!("Parent ID : {PARENT}")), "{span}");
    assert!(span.contains(&format!("\nID : {span_id}")), "{span}");
    assert!(span.contains("http.target: Str(/traced?x=1)"), "{span}");
    assert!(span.contains("http.status_code: Int(200)"), "{span}");
    assert!(
        collector.span_of(OFF_TRACE).is_none(),
        "always_off exported a span:\n{}",
        collector.text()
    );

    // ---- http-logger: one entry per request reaches the log receiver.
    wait_for(&p, "hl.e2e", "/first", &[], 200);
    let r = get(&p, "hl.e2e", "/logged?who=e2e", &[("X-Trace-Me", "yes")]);
    assert_eq!(r.status, 200);
    let entry = eventually(WAIT, || {
        log_entries(&logs)
            .into_iter()
            .find(|e| e["request"]["uri"] == "/logged?who=e2e")
    })
    .unwrap_or_else(|| panic!("no log entry for /logged: {:?}", logs.requests()));
    assert_eq!(entry["request"]["method"], "GET", "{entry}");
    assert_eq!(entry["request"]["headers"]["x-trace-me"], "yes", "{entry}");
    assert_eq!(entry["request"]["querystring"]["who"], "e2e", "{entry}");
    assert_eq!(entry["response"]["status"], 200, "{entry}");
    assert!(
        entry["route_id"]
            .as_str()
            .unwrap_or_default()
            .contains("hl"),
        "{entry}"
    );
    let sent = logs.requests().into_iter().next().unwrap();
    assert_eq!(
        (sent.method.as_str(), sent.target.as_str()),
        ("POST", "/logs")
    );
    assert!(
        sent.header("content-type")
            .unwrap_or_default()
            .starts_with("application/json")
    );
    // A request of another route is not this logger's (checked at the end).
    let r = get(&p, "otel-off.e2e", "/not-logged", &[]);
    assert_eq!(r.status, 200);

    // ---- file-logger: the entry is a JSON line in the file.
    wait_for(&p, "fl.e2e", "/first", &[], 200);
    let r = get(&p, "fl.e2e", "/filed?n=1", &[]);
    assert_eq!(r.status, 200);
    let line = eventually(WAIT, || {
        std::fs::read_to_string(&access_log)
            .ok()?
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["request"]["uri"] == "/filed?n=1")
    })
    .unwrap_or_else(|| panic!("no line for /filed in {}", access_log.display()));
    assert_eq!(line["response"]["status"], 200, "{line}");
    assert_eq!(line["request"]["headers"]["host"], "fl.e2e", "{line}");

    // ---- proxy-mirror: the mirror gets a copy (method, target, body); the client's answer
    // is the upstream's.
    wait_for(&p, "pm.e2e", "/first", &[], 200);
    let r = post(
        &p,
        "pm.e2e",
        "/mirrored?m=1",
        &[("Content-Type", "text/plain")],
        "copy-me",
    );
    let seen = upstream_saw(&r);
    assert_eq!((r.status, seen["body"].as_str()), (200, Some("copy-me")));
    assert!(!r.body.contains("the mirror's answer"));
    let copy = eventually(WAIT, || {
        mirror
            .requests()
            .into_iter()
            .find(|q| q.target == "/mirrored?m=1")
    })
    .unwrap_or_else(|| panic!("the mirror got no copy: {:?}", mirror.requests()));
    assert_eq!(copy.method, "POST");
    assert_eq!(copy.text(), "copy-me");
    assert_eq!(copy.header("host"), Some("pm.e2e"));
    // Routes without the plugin are neither mirrored nor logged by another route's logger.
    assert!(
        log_entries(&logs)
            .iter()
            .all(|e| e["request"]["uri"] != "/not-logged" && e["request"]["uri"] != "/filed?n=1"),
        "{:?}",
        log_entries(&logs)
    );
    assert!(
        mirror
            .requests()
            .iter()
            .all(|q| !q.target.starts_with("/filed") && !q.target.starts_with("/logged")),
        "{:?}",
        mirror.requests()
    );
}

// ------------------------------------------------------------------ traffic control

/// The `apisix-csrf-token` cookie's value from a response's `Set-Cookie`.
fn csrf_cookie(r: &HttpResponse) -> Option<String> {
    r.headers
        .iter()
        .filter(|(n, _)| n == "set-cookie")
        .find_map(|(_, v)| v.strip_prefix("apisix-csrf-token="))
        .and_then(|v| v.split(';').next())
        .map(str::to_owned)
}

#[test]
fn traffic_control_plugins_and_a_refused_plugin_on_the_real_api_server() {
    let p = Pipeline::start().unwrap();
    let ns = p.namespace.clone();

    let docs = [
        route(
            &ns,
            "ab",
            "ab.e2e",
            &[(
                "api-breaker",
                json!({"break_response_code": 503, "break_response_body": "breaker open",
                       "max_breaker_sec": 10,
                       "unhealthy": {"http_statuses": [500], "failures": 2}}),
            )],
            "",
        ),
        route(
            &ns,
            "ua",
            "ua.e2e",
            &[(
                "ua-restriction",
                json!({"denylist": ["curl/.*", "(Baidu|Yandex)bot"]}),
            )],
            "",
        ),
        format!(
            r#"apiVersion: apisix.apache.org/v2
kind: ApisixPluginConfig
metadata: {{name: blocker, namespace: {ns}}}
spec:
  ingressClassName: apisix
  plugins:
    - name: uri-blocker
      enable: true
      config: {config}
"#,
            config = json!({"block_rules": ["root\\.exe", "^/admin"], "rejected_msg": "blocked"})
        ),
        route(
            &ns,
            "ub",
            "ub.e2e",
            &[],
            "      plugin_config_name: blocker\n",
        ),
        route(
            &ns,
            "cs",
            "cs.e2e",
            &[("csrf", json!({"key": "e2e-csrf-key"}))],
            "",
        ),
        route(
            &ns,
            "cc",
            "cc.e2e",
            &[("client-control", json!({"max_body_size": 10}))],
            "",
        ),
        route(
            &ns,
            "rv",
            "rv.e2e",
            &[(
                "request-validation",
                json!({"body_schema": {"type": "object", "required": ["quantity"],
                       "properties": {"quantity": {"type": "integer", "minimum": 1}}}}),
            )],
            "",
        ),
    ];
    p.cluster.apply(&docs.join("---\n")).unwrap();

    // ---- api-breaker: two 500s from the upstream open the breaker.
    wait_for(&p, "ab.e2e", "/ok", &[], 200);
    for _ in 0..2 {
        let r = get(&p, "ab.e2e", "/status/500", &[]);
        assert_eq!(r.status, 500);
        assert!(echoed(&r).is_some(), "the upstream's own 500");
    }
    let r = get(&p, "ab.e2e", "/ok", &[]);
    assert_eq!((r.status, r.body.as_str()), (503, "breaker open"), "{r:?}");
    assert!(
        echoed(&r).is_none(),
        "an open breaker does not ask the upstream"
    );

    // ---- ua-restriction.
    wait_for(&p, "ua.e2e", "/x", &[], 200);
    for ua in ["curl/8.5.0", "Mozilla/5.0 (compatible; Yandexbot/3.0)"] {
        let r = get(&p, "ua.e2e", "/x", &[("User-Agent", ua)]);
        assert_eq!(r.status, 403, "{ua}: {r:?}");
        assert_eq!(body_json(&r), json!({"message": "Not allowed"}), "{ua}");
    }
    let r = get(
        &p,
        "ua.e2e",
        "/x",
        &[("User-Agent", "Mozilla/5.0 Firefox/140.0")],
    );
    assert!(echoed(&r).is_some(), "{r:?}");

    // ---- uri-blocker, from an ApisixPluginConfig.
    wait_for(&p, "ub.e2e", "/fine", &[], 200);
    for path in ["/x?f=root.exe", "/admin/users", "/a/root.exe"] {
        let r = get(&p, "ub.e2e", path, &[]);
        assert_eq!(r.status, 403, "{path}: {r:?}");
        assert_eq!(body_json(&r), json!({"error_msg": "blocked"}), "{path}");
    }
    assert!(echoed(&get(&p, "ub.e2e", "/rootexe/admin", &[])).is_some());

    // ---- csrf: a GET hands out the token; an unsafe method must send it back.
    wait_for(&p, "cs.e2e", "/form", &[], 200);
    let r = get(&p, "cs.e2e", "/form", &[]);
    let token = csrf_cookie(&r).unwrap_or_else(|| panic!("no csrf cookie: {r:?}"));
    let cookie = format!("apisix-csrf-token={token}");
    let r = post(&p, "cs.e2e", "/submit", &[("Cookie", &cookie)], "a=1");
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(
        body_json(&r),
        json!({"error_msg": "no csrf token in headers"})
    );
    let r = post(
        &p,
        "cs.e2e",
        "/submit",
        &[("apisix-csrf-token", &token)],
        "a=1",
    );
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(body_json(&r), json!({"error_msg": "no csrf cookie"}));
    let mut forged = token.clone();
    forged.insert_str(2, "AAAA");
    let forged_cookie = format!("apisix-csrf-token={forged}");
    let r = post(
        &p,
        "cs.e2e",
        "/submit",
        &[("apisix-csrf-token", &forged), ("Cookie", &forged_cookie)],
        "a=1",
    );
    assert_eq!(r.status, 401, "{r:?}");
    let r = post(
        &p,
        "cs.e2e",
        "/submit",
        &[("apisix-csrf-token", &token), ("Cookie", &cookie)],
        "a=1",
    );
    assert_eq!(upstream_saw(&r)["body"], "a=1");

    // ---- client-control: a declared body over max_body_size is 413.
    wait_for(&p, "cc.e2e", "/up", &[], 200);
    let r = post(&p, "cc.e2e", "/up", &[], "0123456789x");
    assert_eq!(r.status, 413, "{r:?}");
    assert_eq!(
        body_json(&r),
        json!({"error_msg": "413 Request Entity Too Large"})
    );
    let r = post(&p, "cc.e2e", "/up", &[], "0123456789");
    assert_eq!(upstream_saw(&r)["body_len"], 10);

    // ---- request-validation: the JSON body is checked against body_schema.
    let json_type = [("Content-Type", "application/json")];
    wait_for(&p, "rv.e2e", "/x", &[], 400);
    let r = post(&p, "rv.e2e", "/order", &json_type, r#"{"quantity": 2}"#);
    let seen = upstream_saw(&r);
    assert_eq!(
        serde_json::from_str::<Value>(seen["body"].as_str().unwrap_or_default()).unwrap(),
        json!({"quantity": 2})
    );
    for bad in [r#"{"name": "x"}"#, r#"{"quantity": 0}"#, "not json"] {
        let r = post(&p, "rv.e2e", "/order", &json_type, bad);
        assert_eq!(r.status, 400, "{bad}: {r:?}");
        assert!(echoed(&r).is_none(), "{bad}");
    }
    let r = post(&p, "rv.e2e", "/order", &json_type, r#"{"name": "x"}"#);
    assert!(r.body.contains("quantity"), "{r:?}");

    // ---- Plugins that run code are refused by name; every other route keeps serving.
    p.cluster
        .apply(
            &[
                route(
                    &ns,
                    "lua",
                    "lua.e2e",
                    &[(
                        "serverless-pre-function",
                        json!({"phase": "rewrite", "functions": ["return function(conf, ctx) ngx.say('hi') end"]}),
                    )],
                    "",
                ),
                route(
                    &ns,
                    "ext",
                    "ext.e2e",
                    &[("ext-plugin-pre-req", json!({"conf": [{"name": "filter", "value": "{}"}]}))],
                    "",
                ),
            ]
            .join("---\n"),
        )
        .unwrap();
    for (name, plugin, why) in [
        ("lua", "serverless-pre-function", "runs Lua code"),
        ("ext", "ext-plugin-pre-req", "external APISIX plugin runner"),
    ] {
        let c = eventually(WAIT, || {
            condition(&p, "ar", name, "Accepted").filter(|c| c["status"] == "False")
        })
        .unwrap_or_else(|| panic!("{name}: no Accepted=False"));
        let msg = c["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(&format!("plugin {plugin:?}")) && msg.contains(why),
            "{name}: {c}"
        );
        assert_eq!(get(&p, &format!("{name}.e2e"), "/x", &[]).status, 404);
    }
    for (host, path) in [("ua.e2e", "/x"), ("ub.e2e", "/fine"), ("cc.e2e", "/up")] {
        let r = get(&p, host, path, &[]);
        assert!(echoed(&r).is_some(), "{host} still serves: {r:?}");
    }
    assert_eq!(
        condition(&p, "ar", "ua", "Accepted").map(|c| c["status"].clone()),
        Some(json!("True"))
    );
}

/// Sends `GET / HTTP/1.1` for `host` on a new connection to `addr` that starts with
/// `header` (a PROXY header, or nothing); the whole answer as text ("" when the dataplane
/// closed without one).
fn raw_get(addr: std::net::SocketAddr, header: &[u8], host: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(WAIT)).unwrap();
    let mut out = header.to_vec();
    out.extend_from_slice(
        format!("GET / HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n").as_bytes(),
    );
    c.write_all(&out).unwrap();
    let mut answer = Vec::new();
    let _ = c.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// A PROXY protocol v2 header (PROXY, TCP over IPv4) from `client` to `to`.
fn proxy_v2(client: [u8; 4], port: u16, to: std::net::SocketAddr) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[0x21, 0x11, 0, 12]);
    h.extend_from_slice(&client);
    h.extend_from_slice(&[127, 0, 0, 1]);
    h.extend_from_slice(&port.to_be_bytes());
    h.extend_from_slice(&to.port().to_be_bytes());
    h
}

/// The real dataplane binary with `--proxy-protocol` (as the chart's
/// `dataplane.proxyProtocol.enabled` runs it) behind a balancer sending PROXY v2: the
/// address the header carries is the one an ApisixRoute's ip-restriction judges and the one
/// the upstream gets in X-Forwarded-For; a connection without a header gets no answer.
#[test]
fn proxy_protocol_v2_gives_ip_restriction_the_client_address() {
    let mut p = Pipeline::start().unwrap();
    p.restart_dataplane_with(&[
        "--proxy-protocol",
        "--proxy-protocol-trusted",
        "127.0.0.0/8",
    ])
    .unwrap();
    let ns = p.namespace.clone();
    p.cluster
        .apply(&route(
            &ns,
            "pp",
            "pp.e2e",
            &[("ip-restriction", json!({"whitelist": ["203.0.113.0/24"]}))],
            "",
        ))
        .unwrap();
    let allowed = proxy_v2([203, 0, 113, 7], 40000, p.http);
    let answer = eventually(WAIT, || {
        Some(raw_get(p.http, &allowed, "pp.e2e")).filter(|a| a.starts_with("HTTP/1.1 200"))
    })
    .unwrap_or_else(|| panic!("pp.e2e not served: {}", raw_get(p.http, &allowed, "pp.e2e")));
    assert!(answer.contains("e2e-echo"), "{answer}");
    assert!(
        answer.contains(r#""x-forwarded-for":"203.0.113.7""#),
        "{answer}"
    );
    let denied = raw_get(
        p.http,
        &proxy_v2([198, 51, 100, 1], 40000, p.http),
        "pp.e2e",
    );
    assert!(denied.starts_with("HTTP/1.1 403"), "{denied}");
    assert_eq!(
        raw_get(p.http, b"", "pp.e2e"),
        "",
        "no header: closed without an answer"
    );
}
