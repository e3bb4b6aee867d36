//! key-auth, basic-auth, jwt-auth and consumer-restriction with consumers: what a client
//! observes (statuses, APISIX bodies, headers the origin receives).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use http::StatusCode;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::json;
use sluice_proto::v1;
use sluice_testkit::EchoServer;

fn consumer(name: &str, plugins: Vec<v1::Plugin>) -> v1::Consumer {
    v1::Consumer {
        name: name.into(),
        plugins,
    }
}

#[tokio::test]
async fn key_auth_header_query_and_failures() {
    let (dp, _echo) = serve_echo(
        vec![
            route_with(
                "default/r/k",
                &["/k*"],
                "u",
                vec![plugin("key-auth", json!({}))],
            ),
            route_with(
                "default/r/hide",
                &["/hide*"],
                "u",
                vec![plugin(
                    "key-auth",
                    json!({"header": "X-Key", "hide_credentials": true}),
                )],
            ),
        ],
        vec![
            consumer(
                "default_jack",
                vec![plugin("key-auth", json!({"key": "jack-key"}))],
            ),
            consumer(
                "default_rose",
                vec![plugin("key-auth", json!({"key": "rose-key"}))],
            ),
        ],
    )
    .await;

    let r = get_with(dp.addr, "/k", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.json(), json!({"message": "Missing API key in request"}));
    let r = get_with(dp.addr, "/k", &[("apikey", "nope")]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.json(), json!({"message": "Invalid API key in request"}));

    let r = get_with(dp.addr, "/k", &[("apikey", "jack-key")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.json()["headers"]["apikey"],
        "jack-key",
        "kept without hide_credentials"
    );
    let r = get_with(dp.addr, "/k?apikey=rose-key&a=1", &[]).await;
    assert_eq!(r.status, StatusCode::OK, "query argument works too");

    let r = get_with(dp.addr, "/hide", &[("x-key", "rose-key")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.json()["headers"].get("x-key").is_none(),
        "hidden from the origin"
    );
    let r = get_with(dp.addr, "/hide?apikey=rose-key&a=1", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["query"], "a=1", "the key argument is removed");
}

#[tokio::test]
async fn basic_auth_messages_and_challenge() {
    let (dp, _echo) = serve_echo(
        vec![route_with(
            "default/r/b",
            &["/*"],
            "u",
            vec![plugin("basic-auth", json!({}))],
        )],
        vec![consumer(
            "default_foo",
            vec![plugin(
                "basic-auth",
                json!({"username": "foo", "password": "bar"}),
            )],
        )],
    )
    .await;
    let r = get_with(dp.addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers["www-authenticate"], "Basic realm='.'");
    assert_eq!(
        r.json(),
        json!({"message": "Missing authorization in request"})
    );
    let r = get_with(dp.addr, "/", &[("authorization", "Basic ???")]).await;
    assert_eq!(
        r.json(),
        json!({"message": "Invalid authorization in request"})
    );
    // foo:baz
    let r = get_with(dp.addr, "/", &[("authorization", "Basic Zm9vOmJheg==")]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.json(), json!({"message": "Invalid user authorization"}));
    // foo:bar
    let r = get_with(dp.addr, "/", &[("authorization", "Basic Zm9vOmJhcg==")]).await;
    assert_eq!(r.status, StatusCode::OK);
}

fn token(alg: Algorithm, key: &EncodingKey, claims: serde_json::Value) -> String {
    encode(&Header::new(alg), &claims, key).unwrap()
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An RSA 2048 key pair, PEM: (private, public).
fn rsa_pems() -> (String, String) {
    let key = sluice_testkit::pki::RsaKey::generate();
    let public = key.public_pem();
    (key.pem, public)
}

#[tokio::test]
async fn jwt_auth_all_algorithm_families() {
    let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let (rsa_priv, rsa_pub) = rsa_pems();
    let (dp, _echo) = serve_echo(
        vec![route_with(
            "default/r/j",
            &["/*"],
            "u",
            vec![plugin("jwt-auth", json!({"hide_credentials": true}))],
        )],
        vec![
            consumer(
                "default_hs",
                vec![plugin("jwt-auth", json!({"key": "hs", "secret": "s3cr3t"}))],
            ),
            consumer(
                "default_rs",
                vec![plugin(
                    "jwt-auth",
                    json!({"key": "rs", "algorithm": "RS256", "public_key": rsa_pub}),
                )],
            ),
            consumer(
                "default_es",
                vec![plugin(
                    "jwt-auth",
                    json!({"key": "es", "algorithm": "ES256", "public_key": ec.public_key_pem()}),
                )],
            ),
            consumer(
                "default_ed",
                vec![plugin(
                    "jwt-auth",
                    json!({"key": "ed", "algorithm": "EdDSA", "public_key": ed.public_key_pem()}),
                )],
            ),
        ],
    )
    .await;
    let exp = now() + 600;
    let cases = [
        (Algorithm::HS256, EncodingKey::from_secret(b"s3cr3t"), "hs"),
        (
            Algorithm::RS256,
            EncodingKey::from_rsa_pem(rsa_priv.as_bytes()).unwrap(),
            "rs",
        ),
        (
            Algorithm::ES256,
            EncodingKey::from_ec_pem(ec.serialize_pem().as_bytes()).unwrap(),
            "es",
        ),
        (
            Algorithm::EdDSA,
            EncodingKey::from_ed_pem(ed.serialize_pem().as_bytes()).unwrap(),
            "ed",
        ),
    ];
    for (alg, key, user) in &cases {
        let t = token(*alg, key, json!({"key": user, "exp": exp}));
        let r = get_with(dp.addr, "/", &[("authorization", &format!("Bearer {t}"))]).await;
        assert_eq!(r.status, StatusCode::OK, "{alg:?}: {}", r.text());
        assert!(r.json()["headers"].get("authorization").is_none(), "hidden");
    }
    // Query and cookie sources.
    let t = token(
        Algorithm::HS256,
        &cases[0].1,
        json!({"key": "hs", "exp": exp}),
    );
    assert_eq!(
        get_with(dp.addr, &format!("/?jwt={t}"), &[]).await.status,
        StatusCode::OK
    );
    let cookie = format!("a=b; jwt={t}");
    assert_eq!(
        get_with(dp.addr, "/", &[("cookie", &cookie)]).await.status,
        StatusCode::OK
    );

    // Failures, with APISIX's messages.
    let msg = |r: &Resp| r.json()["message"].as_str().unwrap().to_owned();
    let r = get_with(dp.addr, "/", &[]).await;
    assert_eq!(
        (r.status, msg(&r).as_str()),
        (StatusCode::UNAUTHORIZED, "Missing JWT token in request")
    );
    let r = get_with(dp.addr, "/", &[("authorization", "Bearer not.a-jwt")]).await;
    assert_eq!(msg(&r), "JWT token invalid");
    let t = token(Algorithm::HS256, &cases[0].1, json!({"exp": exp}));
    let r = get_with(dp.addr, "/", &[("authorization", &t)]).await;
    assert_eq!(msg(&r), "missing user key in JWT token");
    let t = token(
        Algorithm::HS256,
        &cases[0].1,
        json!({"key": "who", "exp": exp}),
    );
    let r = get_with(dp.addr, "/", &[("authorization", &t)]).await;
    assert_eq!(msg(&r), "Invalid user key in JWT token");
    let wrong = EncodingKey::from_secret(b"wrong");
    let t = token(Algorithm::HS256, &wrong, json!({"key": "hs", "exp": exp}));
    let r = get_with(dp.addr, "/", &[("authorization", &t)]).await;
    assert_eq!(
        (r.status, msg(&r).as_str()),
        (StatusCode::UNAUTHORIZED, "failed to verify jwt")
    );
    let t = token(
        Algorithm::HS256,
        &cases[0].1,
        json!({"key": "hs", "exp": now() - 100}),
    );
    let r = get_with(dp.addr, "/", &[("authorization", &t)]).await;
    assert_eq!(msg(&r), "failed to verify jwt", "expired");
    // An RS256 consumer does not accept an HS256 token signed with its public key.
    let t = token(
        Algorithm::HS256,
        &EncodingKey::from_secret(cases[1].2.as_bytes()),
        json!({"key": "rs", "exp": exp}),
    );
    let r = get_with(dp.addr, "/", &[("authorization", &t)]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn consumer_restriction_and_consumer_plugins() {
    let (dp, _echo) = serve_echo(
        vec![
            route_with(
                "default/r/wl",
                &["/wl"],
                "u",
                vec![
                    plugin("key-auth", json!({})),
                    plugin("consumer-restriction", json!({"whitelist": ["default_jack"]})),
                ],
            ),
            route_with(
                "default/r/bl",
                &["/bl"],
                "u",
                vec![
                    plugin("key-auth", json!({})),
                    plugin(
                        "consumer-restriction",
                        json!({"blacklist": ["default_jack"], "rejected_code": 401, "rejected_msg": "go away"}),
                    ),
                ],
            ),
            route_with(
                "default/r/none",
                &["/none"],
                "u",
                vec![plugin("consumer-restriction", json!({"whitelist": ["default_jack"]}))],
            ),
        ],
        vec![
            consumer(
                "default_jack",
                vec![
                    plugin("key-auth", json!({"key": "jack"})),
                    // A consumer plugin: jack gets one request per minute on every route.
                    plugin("limit-count", json!({"count": 1, "time_window": 60, "key": "consumer_name"})),
                ],
            ),
            consumer("default_rose", vec![plugin("key-auth", json!({"key": "rose"}))]),
        ],
    )
    .await;
    let r = get_with(dp.addr, "/wl", &[("apikey", "rose")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        r.json(),
        json!({"message": "The consumer_name is forbidden."})
    );
    let r = get_with(dp.addr, "/wl", &[("apikey", "jack")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.headers["x-ratelimit-limit"], "1",
        "jack's consumer plugin runs"
    );
    let r = get_with(dp.addr, "/wl", &[("apikey", "jack")]).await;
    assert_eq!(
        r.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "jack's budget is spent"
    );

    let r = get_with(dp.addr, "/bl", &[("apikey", "rose")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.headers.get("x-ratelimit-limit").is_none(),
        "rose has no consumer plugins"
    );
    let r = get_with(dp.addr, "/bl", &[("apikey", "jack")]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.json(), json!({"message": "go away"}));

    let r = get_with(dp.addr, "/none", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        r.json(),
        json!({"message": "Missing authentication or identity verification."})
    );
}

#[tokio::test]
async fn chash_on_consumer_keeps_each_consumer_on_one_endpoint() {
    let a = EchoServer::start("a", any()).await.unwrap();
    let b = EchoServer::start("b", any()).await.unwrap();
    let dp = dataplane().await;
    let mut up = upstream("u", &[(a.addr, 1), (b.addr, 1)]);
    up.load_balancer = v1::LoadBalancer::Chash as i32;
    up.hash_on = v1::UpstreamHashOn::Consumer as i32;
    let mut snap = snapshot(
        1,
        vec![route_with(
            "default/r/k",
            &["/*"],
            "u",
            vec![plugin("key-auth", json!({}))],
        )],
        vec![up],
    );
    // NB: 32 consumers: the endpoints' ports (and so their places on the ring) change with
    // every run, and with 8 all of them sometimes landed on one endpoint (once in this
    // test's runs of session 9).
    snap.consumers = (0..32)
        .map(|i| {
            consumer(
                &format!("default_c{i}"),
                vec![plugin("key-auth", json!({"key": format!("k{i}")}))],
            )
        })
        .collect();
    dp.store.apply(snap, vec![]).unwrap();
    let mut servers = std::collections::HashSet::new();
    for i in 0..32 {
        let key = format!("k{i}");
        let first = get_with(dp.addr, "/", &[("apikey", &key)]).await;
        assert_eq!(first.status, StatusCode::OK);
        let name = first.headers["x-echo-server"].clone();
        for _ in 0..3 {
            let r = get_with(dp.addr, "/", &[("apikey", &key)]).await;
            assert_eq!(
                r.headers["x-echo-server"], name,
                "consumer c{i} stays on one endpoint"
            );
        }
        servers.insert(name);
    }
    assert_eq!(servers.len(), 2, "32 consumers spread over both endpoints");
}

/// The route's plugins (key-auth) have no response phases, so the chain skips them; a
/// consumer's merged plugin that has them (response-rewrite) must still run.
#[tokio::test]
async fn a_consumer_plugin_with_response_phases_runs_on_a_route_without_any() {
    let (dp, _echo) = serve_echo(
        vec![route_with(
            "default/r/k",
            &["/k*"],
            "u",
            vec![plugin("key-auth", json!({}))],
        )],
        vec![
            consumer(
                "default_jack",
                vec![
                    plugin("key-auth", json!({"key": "jack"})),
                    plugin(
                        "response-rewrite",
                        json!({"headers": {"set": {"X-Consumer-Plugin": "ran"}}}),
                    ),
                ],
            ),
            consumer(
                "default_rose",
                vec![plugin("key-auth", json!({"key": "rose"}))],
            ),
        ],
    )
    .await;
    let r = get_with(dp.addr, "/k", &[("apikey", "jack")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["x-consumer-plugin"], "ran");
    let r = get_with(dp.addr, "/k", &[("apikey", "rose")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.headers.get("x-consumer-plugin").is_none());
}
