//! basic-auth's Sluice extensions for ingress-nginx `auth-type: basic`: htpasswd users
//! (bcrypt, `$apr1$`, `{SHA}`) and the challenge's realm, as a client observes them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use base64::Engine as _;
use common::*;
use http::StatusCode;
use serde_json::json;
use sluice_proto::v1;

/// `Basic base64(user:password)`.
fn basic(user: &str, password: &str) -> String {
    let raw = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    )
}

/// The htpasswd users; vectors from libxcrypt's crypt(3) (bcrypt), `openssl passwd -apr1`
/// and `openssl dgst -sha1 -binary | base64`.
fn htpasswd() -> serde_json::Value {
    json!([
        {"username": "bob", "hash": "$2y$10$ABCDEFGHIJKLMNOPQRSTUuil2QQyrQJZQv23xC5ObUXot4klFBg3O"},
        {"username": "ann", "hash": "$apr1$s4ltS4lt$OclgO3BbA4P5n9rdkkg9F/"},
        {"username": "sam", "hash": "{SHA}mYaP0lMpbAbqlz+/QP6oV6SzMLc="},
    ])
}

#[tokio::test]
async fn htpasswd_users_and_realm() {
    let (dp, _echo) = serve_echo(
        vec![
            route_with(
                "default/r/h",
                &["/h*"],
                "u",
                vec![plugin(
                    "basic-auth",
                    json!({"htpasswd": htpasswd(), "realm": "Authentication Required - foo"}),
                )],
            ),
            route_with(
                "default/r/hide",
                &["/hide*"],
                "u",
                vec![plugin(
                    "basic-auth",
                    json!({"htpasswd": htpasswd(), "hide_credentials": true}),
                )],
            ),
        ],
        // A consumer's credential is ignored by htpasswd routes.
        vec![v1::Consumer {
            name: "default_foo".into(),
            plugins: vec![plugin(
                "basic-auth",
                json!({"username": "foo", "password": "bar"}),
            )],
        }],
    )
    .await;

    let r = get_with(dp.addr, "/h", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        r.headers["www-authenticate"],
        "Basic realm=\"Authentication Required - foo\""
    );
    assert_eq!(
        r.json(),
        json!({"message": "Missing authorization in request"})
    );

    for (user, password) in [
        ("bob", "secret-apr1"),
        ("ann", "secret-bcrypt"),
        ("sam", "secret-shaX"),
        ("nobody", "secret-sha"),
        ("foo", "bar"),
    ] {
        let r = get_with(dp.addr, "/h", &[("authorization", &basic(user, password))]).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{user}:{password}");
        assert_eq!(r.json(), json!({"message": "Invalid user authorization"}));
        // As nginx's auth_basic: the challenge on every 401.
        assert_eq!(
            r.headers.get("www-authenticate").unwrap(),
            "Basic realm=\"Authentication Required - foo\""
        );
    }

    for (user, password) in [
        ("bob", "secret-bcrypt"),
        ("ann", "secret-apr1"),
        ("sam", "secret-sha"),
    ] {
        let auth = basic(user, password);
        let r = get_with(dp.addr, "/h", &[("authorization", &auth)]).await;
        assert_eq!(r.status, StatusCode::OK, "{user}:{password}");
        assert_eq!(
            r.json()["headers"]["authorization"],
            auth.as_str(),
            "kept without hide_credentials"
        );
    }

    // Without a realm: APISIX's challenge; hide_credentials still applies.
    let r = get_with(dp.addr, "/hide", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers["www-authenticate"], "Basic realm='.'");
    let r = get_with(
        dp.addr,
        "/hide",
        &[("authorization", &basic("ann", "secret-apr1"))],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.json()["headers"].get("authorization").is_none(),
        "hidden from the origin"
    );
}

#[tokio::test]
async fn htpasswd_bad_hash_is_rejected() {
    let conf = json!({"htpasswd": [
        {"username": "ok", "hash": "{PLAIN}x"},
        {"username": "mallory", "hash": "md5:0123"},
    ]});
    // What translate runs.
    let e = sluice_plugin_config::validate("basic-auth", &conf)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("htpasswd[1].hash: unsupported hash format for user \"mallory\""),
        "{e}"
    );
    let e = sluice_plugin_config::validate(
        "basic-auth",
        &json!({"htpasswd": [{"username": "eve", "hash": "$2y$10$truncated"}]}),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("malformed bcrypt hash for user \"eve\""), "{e}");

    // And the dataplane refuses the snapshot.
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let e = dp
        .store
        .apply(
            snapshot(
                1,
                vec![route_with(
                    "default/r/bad",
                    &["/*"],
                    "u",
                    vec![plugin("basic-auth", conf)],
                )],
                vec![upstream("u", &[(echo.addr, 1)])],
            ),
            vec![],
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("route default/r/bad"), "{e}");
    assert!(
        e.contains("unsupported hash format for user \"mallory\""),
        "{e}"
    );
}
