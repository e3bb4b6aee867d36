//! openid-connect (bearer flow) against a real in-process OpenID provider: discovery
//! document, JWKS (keys generated here) and RFC 7662 introspection; what the client
//! observes and what the origin receives.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};
use sluice_testkit::EchoServer;

fn b64url(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A signing key of the provider: its JWK (public) and its encoding key.
struct SigningKey {
    kid: String,
    alg: Algorithm,
    jwk: Value,
    enc: EncodingKey,
    pem_public: String,
}

fn ec_key(kid: &str) -> SigningKey {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let raw = kp.public_key_raw();
    assert_eq!(raw.len(), 65);
    SigningKey {
        kid: kid.into(),
        alg: Algorithm::ES256,
        jwk: json!({"kty": "EC", "crv": "P-256", "x": b64url(&raw[1..33]),
                    "y": b64url(&raw[33..]), "kid": kid, "use": "sig", "alg": "ES256"}),
        enc: EncodingKey::from_ec_pem(kp.serialize_pem().as_bytes()).unwrap(),
        pem_public: kp.public_key_pem(),
    }
}

fn ed_key(kid: &str) -> SigningKey {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    SigningKey {
        kid: kid.into(),
        alg: Algorithm::EdDSA,
        jwk: json!({"kty": "OKP", "crv": "Ed25519", "x": b64url(kp.public_key_raw()), "kid": kid}),
        enc: EncodingKey::from_ed_pem(kp.serialize_pem().as_bytes()).unwrap(),
        pem_public: kp.public_key_pem(),
    }
}

fn rsa_key(kid: &str) -> SigningKey {
    let key = sluice_testkit::pki::RsaKey::generate();
    let (n, pem) = (key.modulus(), key.pem);
    SigningKey {
        kid: kid.into(),
        alg: Algorithm::RS256,
        jwk: json!({"kty": "RSA", "n": b64url(&n), "e": "AQAB", "kid": kid, "use": "sig"}),
        enc: EncodingKey::from_rsa_pem(pem.as_bytes()).unwrap(),
        pem_public: String::new(),
    }
}

impl SigningKey {
    fn sign(&self, claims: &Value) -> String {
        let mut h = Header::new(self.alg);
        h.kid = Some(self.kid.clone());
        encode(&h, claims, &self.enc).unwrap()
    }
}

/// The provider: `/.well-known/openid-configuration`, `/jwks` (the published keys) and
/// `/introspect` (token `good` is active, anything else is not; needs client `api` with
/// secret `s3 cret`, by Basic or in the body). `down` answers 503 to everything (and counts 1000 hits).
struct Provider {
    addr: SocketAddr,
    jwks: Arc<Mutex<Vec<Value>>>,
    jwks_hits: Arc<AtomicUsize>,
    down: Arc<AtomicBool>,
    introspected: Arc<Mutex<Vec<(String, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Provider {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let jwks = Arc::new(Mutex::new(Vec::new()));
        let jwks_hits = Arc::new(AtomicUsize::new(0));
        let down = Arc::new(AtomicBool::new(false));
        let introspected = Arc::new(Mutex::new(Vec::new()));
        let (j, h, d, i) = (
            Arc::clone(&jwks),
            Arc::clone(&jwks_hits),
            Arc::clone(&down),
            Arc::clone(&introspected),
        );
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (j, h, d, i) = (
                    Arc::clone(&j),
                    Arc::clone(&h),
                    Arc::clone(&d),
                    Arc::clone(&i),
                );
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let (j, h, d, i) = (
                            Arc::clone(&j),
                            Arc::clone(&h),
                            Arc::clone(&d),
                            Arc::clone(&i),
                        );
                        async move { Ok::<_, Infallible>(answer(req, addr, &j, &h, &d, &i).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Provider {
            addr,
            jwks,
            jwks_hits,
            down,
            introspected,
            task,
        }
    }

    fn issuer(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn discovery(&self) -> String {
        format!("http://{}/.well-known/openid-configuration", self.addr)
    }

    fn publish(&self, keys: &[&SigningKey]) {
        *self.jwks.lock().unwrap() = keys.iter().map(|k| k.jwk.clone()).collect();
    }

    fn hits(&self) -> usize {
        self.jwks_hits.load(Ordering::SeqCst)
    }
}

async fn answer(
    req: Request<hyper::body::Incoming>,
    addr: SocketAddr,
    jwks: &Mutex<Vec<Value>>,
    hits: &AtomicUsize,
    down: &AtomicBool,
    introspected: &Mutex<Vec<(String, String)>>,
) -> Response<Full<Bytes>> {
    let ok = |v: Value| {
        Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(v.to_string())))
            .unwrap()
    };
    if req.uri().path() == "/jwks" {
        hits.fetch_add(1, Ordering::SeqCst);
    }
    if down.load(Ordering::SeqCst) {
        hits.fetch_add(1000, Ordering::SeqCst);
        return Response::builder()
            .status(503)
            .body(Full::new(Bytes::new()))
            .unwrap();
    }
    let base = format!("http://{addr}");
    match req.uri().path() {
        "/.well-known/openid-configuration" => ok(json!({
            "issuer": base,
            "jwks_uri": format!("{base}/jwks"),
            "introspection_endpoint": format!("{base}/introspect"),
        })),
        "/jwks" => ok(json!({"keys": *jwks.lock().unwrap()})),
        "/introspect" => {
            let auth = req
                .headers()
                .get("authorization")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let body = String::from_utf8(body.to_vec()).unwrap();
            introspected
                .lock()
                .unwrap()
                .push((auth.clone(), body.clone()));
            let basic = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("api:s3%20cret")
            );
            let authed = auth == basic
                || (body.contains("client_id=api") && body.contains("client_secret=s3%20cret"));
            if !authed {
                return Response::builder()
                    .status(401)
                    .body(Full::new(Bytes::from_static(
                        b"{\"error\":\"invalid_client\"}",
                    )))
                    .unwrap();
            }
            if body.split('&').any(|kv| kv == "token=good") {
                ok(
                    json!({"active": true, "sub": "alice", "scope": "read write", "client_id": "api"}),
                )
            } else {
                ok(json!({"active": false}))
            }
        }
        _ => Response::builder()
            .status(404)
            .body(Full::new(Bytes::new()))
            .unwrap(),
    }
}

/// A dataplane with route `/*` to an echo origin, openid-connect configured as `conf`.
async fn serve(conf: Value) -> (Dataplane, EchoServer) {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let snap = snapshot(
        1,
        vec![route_with(
            "default/r/oidc",
            &["/*"],
            "u",
            vec![plugin("openid-connect", conf)],
        )],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    dp.store.apply(snap, vec![]).unwrap();
    (dp, echo)
}

async fn bearer(dp: &Dataplane, token: &str) -> Resp {
    get_with(
        dp.addr,
        "/api",
        &[("authorization", &format!("Bearer {token}"))],
    )
    .await
}

fn www_authenticate(r: &Resp) -> String {
    h(r, "www-authenticate").unwrap_or_default().to_owned()
}

fn claims(iss: &str) -> Value {
    json!({"iss": iss, "sub": "alice", "aud": "api", "exp": now() + 600, "scope": "read"})
}

#[tokio::test]
async fn jwks_tokens_pass_with_the_tokens_headers_and_bad_ones_are_401() {
    let idp = Provider::start().await;
    let (ec, ed, rsa) = (ec_key("ec-1"), ed_key("ed-1"), rsa_key("rsa-1"));
    idp.publish(&[&ec, &ed, &rsa]);
    let (dp, _echo) = serve(json!({
        "client_id": "api", "discovery": idp.discovery(), "bearer_only": true,
        "use_jwks": true, "realm": "sluice",
        "claim_validator": {"audience": {"match_with_client_id": true}},
    }))
    .await;
    let iss = idp.issuer();

    for key in [&ec, &ed, &rsa] {
        let c = claims(&iss);
        let t = key.sign(&c);
        let r = get_with(
            dp.addr,
            "/api",
            &[
                ("authorization", &format!("bearer {t}")),
                ("x-userinfo", "forged"),
                ("x-id-token", "forged"),
            ],
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{:?}: {}", key.alg, r.text());
        let hs = &r.json()["headers"];
        assert_eq!(hs["x-access-token"], t.as_str());
        let info = base64::engine::general_purpose::STANDARD
            .decode(hs["x-userinfo"].as_str().unwrap())
            .unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&info).unwrap(), c);
        assert!(
            hs.get("x-id-token").is_none(),
            "the client's X-ID-Token is dropped"
        );
    }
    // The token may come in X-Access-Token when there is no Authorization header.
    let t = ec.sign(&claims(&iss));
    let r = get_with(dp.addr, "/api", &[("x-access-token", &t)]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());

    // No token: 401 with the realm.
    let r = get_with(dp.addr, "/api", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(www_authenticate(&r), "Bearer realm=\"sluice\"");
    // Another scheme is no token either.
    let r = get_with(dp.addr, "/api", &[("authorization", "Basic YTpi")]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // An Authorization header without a space is malformed.
    let r = get_with(dp.addr, "/api", &[("authorization", "Bearer")]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    let invalid = |r: &Resp, why: &str| {
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{why}: {}", r.text());
        let w = www_authenticate(r);
        assert!(
            w.starts_with("Bearer realm=\"sluice\", error=\"invalid_token\", error_description=\""),
            "{why}: {w}"
        );
        assert!(w.contains(why), "{why}: {w}");
        assert!(!from_origin(r));
    };
    let mut c = claims(&iss);
    c["exp"] = json!(now() - 1000);
    invalid(&bearer(&dp, &ec.sign(&c)).await, "JWT expired");
    // Within the leeway (iat_slack 120 s) an expired token still passes, as in APISIX.
    c["exp"] = json!(now() - 30);
    assert_eq!(bearer(&dp, &ec.sign(&c)).await.status, StatusCode::OK);
    let mut c = claims(&iss);
    c["nbf"] = json!(now() + 1000);
    invalid(&bearer(&dp, &ec.sign(&c)).await, "not valid yet");
    let mut c = claims(&iss);
    c.as_object_mut().unwrap().remove("exp");
    invalid(&bearer(&dp, &ec.sign(&c)).await, "missing claim exp");
    invalid(
        &bearer(&dp, &ec.sign(&claims("https://evil.example.com"))).await,
        "invalid issuer",
    );
    // Signed by a key the provider never published, under a published kid.
    let forger = ec_key("ec-1");
    invalid(
        &bearer(&dp, &forger.sign(&claims(&iss))).await,
        "invalid signature",
    );
    // A tampered payload.
    let t = ec.sign(&claims(&iss));
    let mut parts: Vec<&str> = t.split('.').collect();
    let mut c = claims(&iss);
    c["sub"] = json!("admin");
    let forged = b64url(c.to_string().as_bytes());
    parts[1] = &forged;
    invalid(&bearer(&dp, &parts.join(".")).await, "invalid signature");
    // alg none, and HS256 with a public key as the secret.
    let none = format!(
        "{}.{}.",
        b64url(br#"{"alg":"none","typ":"JWT","kid":"ec-1"}"#),
        b64url(claims(&iss).to_string().as_bytes())
    );
    invalid(&bearer(&dp, &none).await, "malformed token");
    let mut hdr = Header::new(Algorithm::HS256);
    hdr.kid = Some("ec-1".into());
    let hs = encode(
        &hdr,
        &claims(&iss),
        &EncodingKey::from_secret(ec.pem_public.as_bytes()),
    )
    .unwrap();
    invalid(&bearer(&dp, &hs).await, "unexpected signing algorithm");
    for junk in ["abc", "a.b.c", "....."] {
        invalid(&bearer(&dp, junk).await, "malformed token");
    }
    // Audience: APISIX answers 403 to a token for another client.
    let mut c = claims(&iss);
    c["aud"] = json!(["other", "more"]);
    let r = bearer(&dp, &ec.sign(&c)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.json(), json!({"error": "mismatched audience"}));
    c["aud"] = json!(["other", "api"]);
    assert_eq!(bearer(&dp, &ec.sign(&c)).await.status, StatusCode::OK);
    c.as_object_mut().unwrap().remove("aud");
    let r = bearer(&dp, &ec.sign(&c)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        r.json(),
        json!({"error": "required audience claim not present"})
    );
}

fn from_origin(r: &Resp) -> bool {
    serde_json::from_slice::<Value>(&r.body).is_ok_and(|v| v.get("path").is_some())
}

#[tokio::test]
async fn key_rotation_is_followed_and_unknown_kids_refetch_at_a_bounded_rate() {
    let idp = Provider::start().await;
    let (k1, k2, k3) = (ec_key("k1"), ec_key("k2"), ec_key("k3"));
    idp.publish(&[&k1]);
    let (dp, _echo) = serve(json!({
        "client_id": "api", "discovery": idp.discovery(), "bearer_only": true,
        "use_jwks": true, "token_signing_alg_values_expected": "ES256",
    }))
    .await;
    let iss = idp.issuer();
    assert_eq!(
        bearer(&dp, &k1.sign(&claims(&iss))).await.status,
        StatusCode::OK
    );
    assert_eq!(
        bearer(&dp, &k1.sign(&claims(&iss))).await.status,
        StatusCode::OK
    );
    assert_eq!(idp.hits(), 1, "keys are cached");
    // The provider rotates to k2: a token of k2 makes one re-fetch and passes.
    idp.publish(&[&k2]);
    let r = bearer(&dp, &k2.sign(&claims(&iss))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", www_authenticate(&r));
    assert_eq!(idp.hits(), 2);
    // k1 is gone from the new set.
    let r = bearer(&dp, &k1.sign(&claims(&iss))).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(www_authenticate(&r).contains("unknown key id"));
    // Unknown kids within the refetch interval do not reach the provider.
    for _ in 0..5 {
        let r = bearer(&dp, &k3.sign(&claims(&iss))).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(idp.hits(), 2, "unknown kids re-fetch at most every 10 s");
    assert_eq!(
        bearer(&dp, &k2.sign(&claims(&iss))).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_provider_that_goes_down_leaves_the_cached_keys_working() {
    let idp = Provider::start().await;
    let k1 = ec_key("k1");
    idp.publish(&[&k1]);
    let (dp, _echo) = serve(json!({
        "client_id": "api", "discovery": idp.discovery(), "bearer_only": true,
        "use_jwks": true, "jwk_expires_in": 1, "timeout": 1,
    }))
    .await;
    let iss = idp.issuer();
    assert_eq!(
        bearer(&dp, &k1.sign(&claims(&iss))).await.status,
        StatusCode::OK
    );
    idp.down.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Stale keys: a background refresh fails; the cached keys keep serving.
    for _ in 0..3 {
        let r = bearer(&dp, &k1.sign(&claims(&iss))).await;
        assert_eq!(r.status, StatusCode::OK, "{}", www_authenticate(&r));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(idp.hits() >= 1000, "a refresh was attempted");
    let r = bearer(&dp, &ec_key("k9").sign(&claims(&iss))).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // A provider that never answered: no keys, every token refused.
    let (dp2, _echo2) = serve(json!({
        "client_id": "api", "discovery": idp.discovery(), "bearer_only": true,
        "use_jwks": true, "timeout": 1, "claim_validator": {"issuer": {"valid_issuers": [iss]}},
    }))
    .await;
    let r = bearer(&dp2, &k1.sign(&claims(&iss))).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(www_authenticate(&r).contains("signing keys unavailable"));
}

#[tokio::test]
async fn public_key_verifies_without_jwks() {
    let idp = Provider::start().await;
    let ed = ed_key("x");
    let (dp, _echo) = serve(json!({
        "client_id": "api", "discovery": idp.discovery(), "bearer_only": true,
        "public_key": ed.pem_public,
        "claim_validator": {"issuer": {"valid_issuers": ["https://issuer.example"]}},
        "set_userinfo_header": false, "access_token_in_authorization_header": true,
    }))
    .await;
    let t = ed.sign(&claims("https://issuer.example"));
    let r = bearer(&dp, &t).await;
    assert_eq!(r.status, StatusCode::OK, "{}", www_authenticate(&r));
    let hs = &r.json()["headers"];
    assert_eq!(hs["authorization"], format!("Bearer {t}"));
    assert!(hs.get("x-userinfo").is_none() && hs.get("x-access-token").is_none());
    assert_eq!(idp.hits(), 0);
    let other = ed_key("x");
    let r = bearer(&dp, &other.sign(&claims("https://issuer.example"))).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn introspection_asks_the_provider() {
    let idp = Provider::start().await;
    let (dp, _echo) = serve(json!({
        "client_id": "api", "client_secret": "s3 cret", "discovery": idp.discovery(),
        "bearer_only": true,
    }))
    .await;
    let r = bearer(&dp, "good").await;
    assert_eq!(r.status, StatusCode::OK, "{}", www_authenticate(&r));
    let hs = &r.json()["headers"];
    assert_eq!(hs["x-access-token"], "good");
    let info = base64::engine::general_purpose::STANDARD
        .decode(hs["x-userinfo"].as_str().unwrap())
        .unwrap();
    let info: Value = serde_json::from_slice(&info).unwrap();
    assert_eq!(
        (info["active"].clone(), info["sub"].clone()),
        (json!(true), json!("alice"))
    );
    let (auth, body) = idp.introspected.lock().unwrap().last().cloned().unwrap();
    assert!(auth.starts_with("Basic "), "client_secret_basic by default");
    assert_eq!(body, "token=good", "the secret is not in the body");

    let r = bearer(&dp, "revoked").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(www_authenticate(&r).contains("error_description=\"invalid token\""));

    // client_secret_post, an explicit endpoint, required scopes.
    let (dp, _echo) = serve(json!({
        "client_id": "api", "client_secret": "s3 cret", "discovery": idp.discovery(),
        "bearer_only": true, "introspection_endpoint": format!("{}/introspect", idp.issuer()),
        "introspection_endpoint_auth_method": "client_secret_post",
        "required_scopes": ["read", "admin"],
    }))
    .await;
    let r = bearer(&dp, "good").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        r.json(),
        json!({"error": "required scopes read, admin not present"})
    );
    let (auth, body) = idp.introspected.lock().unwrap().last().cloned().unwrap();
    assert_eq!(auth, "");
    assert_eq!(body, "token=good&client_id=api&client_secret=s3%20cret");

    // A wrong secret: the provider refuses the call; the client gets 401.
    let (dp, _echo) = serve(json!({
        "client_id": "api", "client_secret": "wrong", "discovery": idp.discovery(),
        "bearer_only": true,
    }))
    .await;
    assert_eq!(bearer(&dp, "good").await.status, StatusCode::UNAUTHORIZED);
    // The provider is down.
    idp.down.store(true, Ordering::SeqCst);
    let (dp, _echo) = serve(json!({
        "client_id": "api", "client_secret": "s3 cret", "discovery": idp.discovery(),
        "bearer_only": true, "introspection_endpoint": format!("{}/introspect", idp.issuer()),
    }))
    .await;
    assert_eq!(bearer(&dp, "good").await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_browser_flow_is_refused() {
    let dp = dataplane().await;
    let snap = snapshot(
        1,
        vec![route_with(
            "default/r/oidc",
            &["/*"],
            "u",
            vec![plugin(
                "openid-connect",
                json!({"client_id": "a", "client_secret": "b",
                       "discovery": "https://idp.example.com/.well-known/openid-configuration"}),
            )],
        )],
        vec![upstream("u", &[(closed_port(), 1)])],
    );
    let e = dp.store.apply(snap, vec![]).unwrap_err().to_string();
    assert!(
        e.contains("bearer_only") && e.contains("not supported"),
        "{e}"
    );
}
