//! Plugins wave 2 (ua-restriction, uri-blocker, client-control, csrf, hmac-auth,
//! api-breaker) and refused plugins: what a client observes (statuses, APISIX bodies,
//! headers the origin receives), with real origins.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::Full;
use ring::hmac;
use serde_json::json;
use sluice_proto::v1;
use sluice_testkit::EchoServer;

/// An echo origin behind `routes` (all to upstream `u`), with `consumers`.
async fn serve(routes: Vec<v1::Route>, consumers: Vec<v1::Consumer>) -> (Dataplane, EchoServer) {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let mut snap = snapshot(1, routes, vec![upstream("u", &[(echo.addr, 1)])]);
    snap.consumers = consumers;
    dp.store.apply(snap, vec![]).unwrap();
    (dp, echo)
}

/// Whether the origin answered (the echo origin answers JSON with the request's path).
fn from_origin(r: &Resp) -> bool {
    serde_json::from_slice::<serde_json::Value>(&r.body).is_ok_and(|v| v.get("path").is_some())
}

/// Sends `method path` with `headers` and `body`.
async fn send_body(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &'static str,
) -> Resp {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "example.com");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(
        addr,
        b.body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap(),
    )
    .await
}

// ---------------------------------------------------------------- ua-restriction

#[tokio::test]
async fn ua_restriction_allow_and_deny_lists() {
    let (dp, _echo) = serve(
        vec![
            route_with(
                "default/r/deny",
                &["/deny*"],
                "u",
                vec![plugin(
                    "ua-restriction",
                    json!({"denylist": ["curl/.*", "(Baidu|Yandex)bot"]}),
                )],
            ),
            route_with(
                "default/r/allow",
                &["/allow*"],
                "u",
                vec![plugin(
                    "ua-restriction",
                    json!({"allowlist": ["^Mozilla/"], "message": "browsers only", "bypass_missing": true}),
                )],
            ),
        ],
        vec![],
    )
    .await;
    let denied = json!({"message": "Not allowed"});
    for ua in [
        "curl/8.5.0",
        "Mozilla/5.0 (compatible; Baidubot)",
        "  curl/7 ",
    ] {
        let r = get_with(dp.addr, "/deny", &[("user-agent", ua)]).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{ua}");
        assert_eq!(r.json(), denied, "{ua}");
    }
    for ua in ["Mozilla/5.0", "CURL/8.5.0", "Googlebot"] {
        let r = get_with(dp.addr, "/deny", &[("user-agent", ua)]).await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "{ua}: rules are case-sensitive, as APISIX's"
        );
        assert!(from_origin(&r));
    }
    // Without User-Agent: refused unless bypass_missing.
    let r = get_with(dp.addr, "/deny", &[]).await;
    assert_eq!(
        (r.status, r.json()),
        (StatusCode::FORBIDDEN, denied.clone())
    );
    // Several User-Agent headers: a denylist refuses when any matches.
    let r = get_with(
        dp.addr,
        "/deny",
        &[("user-agent", "Mozilla/5.0"), ("user-agent", "curl/8")],
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    let r = get_with(dp.addr, "/allow", &[("user-agent", "Mozilla/5.0 (X11)")]).await;
    assert_eq!(r.status, StatusCode::OK);
    for ua in ["curl/8", "xMozilla/5.0"] {
        let r = get_with(dp.addr, "/allow", &[("user-agent", ua)]).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{ua}");
        assert_eq!(r.json(), json!({"message": "browsers only"}));
    }
    let r = get_with(dp.addr, "/allow", &[]).await;
    assert_eq!(r.status, StatusCode::OK, "bypass_missing");
    // An allowlist passes when any of several values matches.
    let r = get_with(
        dp.addr,
        "/allow",
        &[("user-agent", "curl/8"), ("user-agent", "Mozilla/5.0")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
}

// ---------------------------------------------------------------- uri-blocker

#[tokio::test]
async fn uri_blocker_matches_the_request_uri_however_encoded() {
    let (dp, _echo) = serve(
        vec![
            route_with(
                "default/r/p",
                &["/*"],
                "u",
                vec![plugin(
                    "uri-blocker",
                    json!({"block_rules": ["root\\.exe", "^/admin", "\\.php$"]}),
                )],
            ),
            route_with(
                "default/r/ci",
                &["/ci/*"],
                "u",
                vec![plugin(
                    "uri-blocker",
                    json!({"block_rules": ["root\\.exe"], "case_insensitive": true, "rejected_code": 418, "rejected_msg": "blocked"}),
                )],
            ),
        ],
        vec![],
    )
    .await;
    for path in [
        "/x/root.exe",
        "/admin",
        "/admin/users",
        "/a/b.php",
        // Encodings and dot segments cannot get around a rule (NB: APISIX matches only
        // the raw target, so these pass there).
        "/x/root%2Eexe",
        "/x/%72oot.exe",
        "/x/y/../root.exe",
        "//admin",
        "/%61dmin",
        // As APISIX: the query string is part of the URI the rules see.
        "/download?file=root.exe",
    ] {
        let r = get(dp.addr, "example.com", path).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}");
        assert!(
            r.body.is_empty(),
            "{path}: no rejected_msg, no body: {:?}",
            r.text()
        );
    }
    for path in [
        "/x/ROOT.EXE",
        "/x/rootXexe",
        "/x/admin",
        "/a/b.php?x=1",
        "/a/b.phps",
        "/fine",
    ] {
        let r = get(dp.addr, "example.com", path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert!(from_origin(&r), "{path}");
    }
    for path in ["/ci/ROOT.EXE", "/ci/x?f=Root.Exe", "/ci/Root%2EExe"] {
        let r = get(dp.addr, "example.com", path).await;
        assert_eq!(r.status.as_u16(), 418, "{path}");
        assert_eq!(r.json(), json!({"error_msg": "blocked"}), "{path}");
    }
    let r = get(dp.addr, "example.com", "/ci/fine").await;
    assert_eq!(r.status, StatusCode::OK);
}

// ---------------------------------------------------------------- client-control

#[tokio::test]
async fn client_control_refuses_a_declared_oversized_body_first() {
    let (dp, _echo) = serve(
        vec![
            route_with(
                "default/r/small",
                &["/small*"],
                "u",
                vec![
                    plugin("client-control", json!({"max_body_size": 10})),
                    plugin("key-auth", json!({})),
                ],
            ),
            route_with(
                "default/r/any",
                &["/any*"],
                "u",
                vec![plugin("client-control", json!({"max_body_size": 0}))],
            ),
        ],
        vec![v1::Consumer {
            name: "default_jack".into(),
            plugins: vec![plugin("key-auth", json!({"key": "k"}))],
        }],
    )
    .await;
    let key = [("apikey", "k")];
    let r = send_body(dp.addr, "POST", "/small", &key, "0123456789").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["body"], "0123456789");
    let r = send_body(dp.addr, "POST", "/small", &key, "0123456789A").await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        r.json(),
        json!({"error_msg": "413 Request Entity Too Large"})
    );
    // Priority 22000: before authentication (APISIX's order), so 413 rather than 401.
    let r = send_body(dp.addr, "PUT", "/small", &[], "0123456789A").await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    let r = send_body(dp.addr, "POST", "/small", &[], "0123").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // 0 = no limit.
    let big: &'static str = Box::leak("x".repeat(100_000).into_boxed_str());
    let r = send_body(dp.addr, "POST", "/any", &[], big).await;
    assert_eq!(r.status, StatusCode::OK);
}

// ---------------------------------------------------------------- csrf

fn csrf_cookie(r: &Resp, name: &str) -> String {
    let set = r
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|c| c.starts_with(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} cookie in {:?}", r.headers));
    let parts: Vec<&str> = set.split(';').collect();
    assert_eq!(parts[1], "path=/");
    assert_eq!(parts[2], "SameSite=Lax");
    let expires = parts[3].strip_prefix("Expires=").unwrap();
    let at = httpdate::parse_http_date(expires).unwrap();
    assert!(at > SystemTime::now(), "expires in the future: {expires}");
    parts[0].split_once('=').unwrap().1.to_owned()
}

#[tokio::test]
async fn csrf_double_submit() {
    let (dp, _echo) = serve(
        vec![
            route_with(
                "default/r/p",
                &["/*"],
                "u",
                vec![plugin("csrf", json!({"key": "k1"}))],
            ),
            route_with(
                "default/r/other",
                &["/other/*"],
                "u",
                vec![plugin("csrf", json!({"key": "another-key"}))],
            ),
            route_with(
                "default/r/named",
                &["/named/*"],
                "u",
                vec![plugin(
                    "csrf",
                    json!({"key": "k1", "name": "x-csrf", "expires": 1}),
                )],
            ),
        ],
        vec![],
    )
    .await;
    // Safe methods pass and get a token.
    let r = get_with(dp.addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let token = csrf_cookie(&r, "apisix-csrf-token");
    for m in ["HEAD", "OPTIONS"] {
        let r = request(dp.addr, m, "/", &[]).await;
        assert_eq!(r.status, StatusCode::OK, "{m}");
    }
    let cookie = format!("apisix-csrf-token={token}");
    let ok = [
        ("apisix-csrf-token", token.as_str()),
        ("cookie", cookie.as_str()),
    ];
    for m in ["POST", "PUT", "DELETE", "PATCH"] {
        let r = request(dp.addr, m, "/", &ok).await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "{m} with the token in cookie and header"
        );
        assert!(from_origin(&r));
    }
    let expect = |r: &Resp, msg: &str| {
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{msg}");
        assert_eq!(r.json(), json!({"error_msg": msg}));
        // A rejection carries a fresh token too (APISIX's header filter runs on it).
        csrf_cookie(r, "apisix-csrf-token");
    };
    for m in ["POST", "DELETE"] {
        let r = request(dp.addr, m, "/", &[("cookie", &cookie)]).await;
        expect(&r, "no csrf token in headers");
        let r = request(
            dp.addr,
            m,
            "/",
            &[("cookie", &cookie), ("apisix-csrf-token", "")],
        )
        .await;
        expect(&r, "no csrf token in headers");
    }
    let r = request(dp.addr, "POST", "/", &[("apisix-csrf-token", &token)]).await;
    expect(&r, "no csrf cookie");
    let r = request(
        dp.addr,
        "POST",
        "/",
        &[("apisix-csrf-token", "other"), ("cookie", &cookie)],
    )
    .await;
    expect(&r, "csrf token mismatch");
    // A token signed with another key, or tampered with, fails the signature.
    let foreign = csrf_cookie(
        &get_with(dp.addr, "/other/", &[]).await,
        "apisix-csrf-token",
    );
    let fc = format!("apisix-csrf-token={foreign}");
    let r = request(
        dp.addr,
        "POST",
        "/",
        &[("apisix-csrf-token", &foreign), ("cookie", &fc)],
    )
    .await;
    expect(&r, "Failed to verify the csrf token signature");
    let raw = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(&token)
            .unwrap(),
    )
    .unwrap();
    let issued = raw
        .split("\"expires\":")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap();
    let later: i64 = issued.parse::<i64>().unwrap() + 3600;
    let tampered = base64::engine::general_purpose::STANDARD.encode(raw.replace(
        &format!("\"expires\":{issued}"),
        &format!("\"expires\":{later}"),
    ));
    let tc = format!("apisix-csrf-token={tampered}");
    let r = request(
        dp.addr,
        "POST",
        "/",
        &[("apisix-csrf-token", &tampered), ("cookie", &tc)],
    )
    .await;
    expect(&r, "Failed to verify the csrf token signature");
    // `name` renames both; tokens expire after `expires` seconds.
    let t = csrf_cookie(&get_with(dp.addr, "/named/", &[]).await, "x-csrf");
    let c = format!("x-csrf={t}");
    let r = request(
        dp.addr,
        "POST",
        "/named/",
        &[("x-csrf", &t), ("cookie", &c)],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let r = request(
        dp.addr,
        "POST",
        "/named/",
        &[("x-csrf", &t), ("cookie", &c)],
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "expired");
    assert_eq!(
        r.json(),
        json!({"error_msg": "Failed to verify the csrf token signature"})
    );
}

// ---------------------------------------------------------------- hmac-auth

fn hmac_consumer(name: &str, key_id: &str, secret: &str) -> v1::Consumer {
    v1::Consumer {
        name: name.into(),
        plugins: vec![plugin(
            "hmac-auth",
            json!({"key_id": key_id, "secret_key": secret}),
        )],
    }
}

fn now_date(offset_secs: i64) -> String {
    let now = SystemTime::now();
    let t = if offset_secs >= 0 {
        now + Duration::from_secs(offset_secs as u64)
    } else {
        now - Duration::from_secs((-offset_secs) as u64)
    };
    httpdate::fmt_http_date(t)
}

/// A client's `Authorization` for `method target`, signing `signed` (names, in order) whose
/// values are in `headers`.
fn signature(
    key_id: &str,
    secret: &str,
    alg: &str,
    method: &str,
    target: &str,
    signed: &[&str],
    headers: &[(&str, &str)],
) -> String {
    let mut text = format!("{key_id}\n");
    for h in signed {
        if *h == "@request-target" {
            text.push_str(&format!("{method} {target}\n"));
        } else if let Some((_, v)) = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(h)) {
            text.push_str(&format!("{h}: {v}\n"));
        }
    }
    let a = match alg {
        "hmac-sha1" => hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        "hmac-sha512" => hmac::HMAC_SHA512,
        _ => hmac::HMAC_SHA256,
    };
    let tag = hmac::sign(&hmac::Key::new(a, secret.as_bytes()), text.as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(tag.as_ref());
    format!(
        "Signature keyId=\"{key_id}\",algorithm=\"{alg}\",headers=\"{}\",signature=\"{sig}\"",
        signed.join(" ")
    )
}

/// GET `target` signed by (`key_id`, `secret`) over `signed`, with `extra` headers.
#[allow(clippy::too_many_arguments)] // NB: each test line reads as one signed request.
async fn signed_get(
    dp: &Dataplane,
    key_id: &str,
    secret: &str,
    alg: &str,
    target: &str,
    signed: &[&str],
    date: Option<String>,
    extra: &[(&str, &str)],
) -> Resp {
    let mut headers: Vec<(&str, &str)> = extra.to_vec();
    if let Some(d) = &date {
        headers.push(("date", d));
    }
    let auth = signature(key_id, secret, alg, "GET", target, signed, &headers);
    headers.push(("authorization", &auth));
    get_with(dp.addr, target, &headers).await
}

#[tokio::test]
async fn hmac_auth_signatures() {
    let (dp, _echo) = serve(
        vec![
            route_with("default/r/p", &["/*"], "u", vec![plugin("hmac-auth", json!({}))]),
            route_with(
                "default/r/strict",
                &["/strict/*"],
                "u",
                vec![plugin(
                    "hmac-auth",
                    json!({"signed_headers": ["date", "x-custom"], "allowed_algorithms": ["hmac-sha512"], "hide_credentials": true, "clock_skew": 60, "realm": "strict"}),
                )],
            ),
            route_with(
                "default/r/jack",
                &["/jack-only/*"],
                "u",
                vec![
                    plugin("hmac-auth", json!({})),
                    plugin("consumer-restriction", json!({"whitelist": ["default_jack"]})),
                ],
            ),
        ],
        vec![
            hmac_consumer("default_jack", "jack-key", "jack-secret"),
            hmac_consumer("default_rose", "rose-key", "rose-secret"),
        ],
    )
    .await;
    let rt = ["@request-target", "date"];
    let d = || Some(now_date(0));
    let fail = hmac_refused;

    // Valid, with every algorithm allowed by default; the credential is kept.
    for alg in ["hmac-sha256", "hmac-sha1", "hmac-sha512"] {
        let r = signed_get(
            &dp,
            "jack-key",
            "jack-secret",
            alg,
            "/a?x=1&y=2",
            &rt,
            d(),
            &[],
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{alg}: {}", r.text());
        assert!(
            r.json()["headers"]["authorization"]
                .as_str()
                .unwrap()
                .starts_with("Signature ")
        );
    }
    let r = signed_get(
        &dp,
        "rose-key",
        "rose-secret",
        "hmac-sha256",
        "/a",
        &rt,
        d(),
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);

    // Missing or foreign Authorization: the reason is in the message.
    let r = get_with(dp.addr, "/a", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        r.json(),
        json!({"message": "client request can't be validated: missing Authorization header"})
    );
    assert_eq!(h(&r, "www-authenticate"), Some("hmac realm=\"hmac\""));
    let r = get_with(dp.addr, "/a", &[("authorization", "Basic Zm9vOmJhcg==")]).await;
    assert_eq!(
        r.json(),
        json!({"message": "client request can't be validated: Authorization header does not start with 'Signature'"})
    );

    // Wrong secret; another consumer's keyId with our secret (and the reverse); unknown key.
    fail(
        &signed_get(&dp, "jack-key", "wrong", "hmac-sha256", "/a", &rt, d(), &[]).await,
        "wrong secret",
    );
    fail(
        &signed_get(
            &dp,
            "rose-key",
            "jack-secret",
            "hmac-sha256",
            "/a",
            &rt,
            d(),
            &[],
        )
        .await,
        "rose's keyId, jack's secret",
    );
    fail(
        &signed_get(
            &dp,
            "jack-key",
            "rose-secret",
            "hmac-sha256",
            "/a",
            &rt,
            d(),
            &[],
        )
        .await,
        "jack's keyId, rose's secret",
    );
    fail(
        &signed_get(
            &dp,
            "nobody",
            "jack-secret",
            "hmac-sha256",
            "/a",
            &rt,
            d(),
            &[],
        )
        .await,
        "unknown keyId",
    );
    // A signature replayed on another target, method or with another Date.
    let date = now_date(0);
    let mut headers = vec![("date", date.as_str())];
    let auth = signature(
        "jack-key",
        "jack-secret",
        "hmac-sha256",
        "GET",
        "/a?x=1",
        &rt,
        &headers,
    );
    headers.push(("authorization", &auth));
    assert_eq!(
        get_with(dp.addr, "/a?x=1", &headers).await.status,
        StatusCode::OK
    );
    fail(&get_with(dp.addr, "/a?x=2", &headers).await, "other query");
    fail(&get_with(dp.addr, "/b?x=1", &headers).await, "other path");
    fail(
        &request(dp.addr, "DELETE", "/a?x=1", &headers).await,
        "other method",
    );
    let other_date = now_date(-5);
    let replay = [
        ("date", other_date.as_str()),
        ("authorization", auth.as_str()),
    ];
    fail(&get_with(dp.addr, "/a?x=1", &replay).await, "other Date");
    // Unknown or disallowed algorithm; a garbled signature.
    let bad_alg = auth.replace("hmac-sha256", "hmac-md5");
    fail(
        &get_with(
            dp.addr,
            "/a?x=1",
            &[("date", &date), ("authorization", &bad_alg)],
        )
        .await,
        "hmac-md5",
    );
    let garbled = auth.replace("signature=\"", "signature=\"!!");
    fail(
        &get_with(
            dp.addr,
            "/a?x=1",
            &[("date", &date), ("authorization", &garbled)],
        )
        .await,
        "not base64",
    );
    let no_alg = auth.replace("algorithm=\"hmac-sha256\",", "");
    fail(
        &get_with(
            dp.addr,
            "/a?x=1",
            &[("date", &date), ("authorization", &no_alg)],
        )
        .await,
        "no algorithm",
    );

    // Clock skew (default 300 s): both directions; a missing or malformed Date.
    let r = signed_get(
        &dp,
        "jack-key",
        "jack-secret",
        "hmac-sha256",
        "/a",
        &rt,
        Some(now_date(-250)),
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "within the skew");
    fail(
        &signed_get(
            &dp,
            "jack-key",
            "jack-secret",
            "hmac-sha256",
            "/a",
            &rt,
            Some(now_date(-310)),
            &[],
        )
        .await,
        "expired Date",
    );
    fail(
        &signed_get(
            &dp,
            "jack-key",
            "jack-secret",
            "hmac-sha256",
            "/a",
            &rt,
            Some(now_date(310)),
            &[],
        )
        .await,
        "future Date",
    );
    fail(
        &signed_get(
            &dp,
            "jack-key",
            "jack-secret",
            "hmac-sha256",
            "/a",
            &["@request-target"],
            None,
            &[],
        )
        .await,
        "no Date",
    );
    fail(
        &signed_get(
            &dp,
            "jack-key",
            "jack-secret",
            "hmac-sha256",
            "/a",
            &rt,
            Some("yesterday".into()),
            &[],
        )
        .await,
        "bad Date",
    );
    // `date` must be signed (the default signed_headers).
    fail(
        &signed_get(
            &dp,
            "jack-key",
            "jack-secret",
            "hmac-sha256",
            "/a",
            &["@request-target"],
            d(),
            &[],
        )
        .await,
        "date unsigned",
    );

    // The strict route: x-custom must be signed, only hmac-sha512, credentials hidden.
    let strict = ["@request-target", "date", "x-custom"];
    let custom = [("x-custom", "v1")];
    let r = signed_get(
        &dp,
        "jack-key",
        "jack-secret",
        "hmac-sha512",
        "/strict/a",
        &strict,
        d(),
        &custom,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(
        r.json()["headers"].get("authorization").is_none(),
        "hide_credentials"
    );
    assert_eq!(r.json()["headers"]["x-custom"], "v1");
    let r = signed_get(
        &dp,
        "jack-key",
        "jack-secret",
        "hmac-sha512",
        "/strict/a",
        &rt,
        d(),
        &custom,
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "x-custom unsigned");
    assert_eq!(h(&r, "www-authenticate"), Some("hmac realm=\"strict\""));
    let r = signed_get(
        &dp,
        "jack-key",
        "jack-secret",
        "hmac-sha256",
        "/strict/a",
        &strict,
        d(),
        &custom,
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "algorithm not allowed");
    let r = signed_get(
        &dp,
        "jack-key",
        "jack-secret",
        "hmac-sha512",
        "/strict/a",
        &strict,
        Some(now_date(-90)),
        &custom,
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "clock_skew 60");
    // A signed header whose value changed.
    let date = now_date(0);
    let hs = [("date", date.as_str()), ("x-custom", "v1")];
    let auth = signature(
        "jack-key",
        "jack-secret",
        "hmac-sha512",
        "GET",
        "/strict/a",
        &strict,
        &hs,
    );
    let r = get_with(
        dp.addr,
        "/strict/a",
        &[
            ("date", &date),
            ("x-custom", "v2"),
            ("authorization", &auth),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "x-custom changed");

    // The consumer is identified: consumer-restriction sees who signed.
    let r = signed_get(
        &dp,
        "jack-key",
        "jack-secret",
        "hmac-sha256",
        "/jack-only/x",
        &rt,
        d(),
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = signed_get(
        &dp,
        "rose-key",
        "rose-secret",
        "hmac-sha256",
        "/jack-only/x",
        &rt,
        d(),
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
}

/// `SHA-256=<base64>` of `body`: the `Digest` a client sends.
fn digest_of(body: &[u8]) -> String {
    let sum = ring::digest::digest(&ring::digest::SHA256, body);
    format!(
        "SHA-256={}",
        base64::engine::general_purpose::STANDARD.encode(sum.as_ref())
    )
}

/// Sends `req` (any body: a chunked one has no `content-length`) over HTTP/1.1.
async fn send_any<B>(addr: std::net::SocketAddr, req: Request<B>) -> Resp
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use http_body_util::BodyExt as _;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let (parts, body) = tx.send_request(req).await.unwrap().into_parts();
    Resp {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// A POST of `target` signed by jack over `@request-target date`, with `digest` (if any)
/// and `body`.
fn signed_post<B>(target: &str, secret: &str, digest: Option<&str>, body: B) -> Request<B> {
    let date = now_date(0);
    let headers = [("date", date.as_str())];
    let auth = signature(
        "jack-key",
        secret,
        "hmac-sha256",
        "POST",
        target,
        &["@request-target", "date"],
        &headers,
    );
    let mut b = Request::post(target)
        .header("host", "example.com")
        .header("date", &date)
        .header("authorization", auth);
    if let Some(d) = digest {
        b = b.header("digest", d);
    }
    b.body(body).unwrap()
}

/// A body of unannounced length (sent chunked).
type Chunked = http_body_util::StreamBody<
    futures::stream::Iter<
        std::vec::IntoIter<Result<http_body::Frame<Bytes>, std::convert::Infallible>>,
    >,
>;

/// A body of unannounced length (sent chunked) made of `pieces`.
fn chunked(pieces: Vec<Bytes>) -> Chunked {
    let frames: Vec<_> = pieces
        .into_iter()
        .map(|p| Ok(http_body::Frame::data(p)))
        .collect();
    http_body_util::StreamBody::new(futures::stream::iter(frames))
}

#[tokio::test]
async fn hmac_auth_validates_the_body_digest() {
    let (dp, _echo) = serve(
        vec![
            route_with(
                "default/r/body",
                &["/body*"],
                "u",
                vec![plugin(
                    "hmac-auth",
                    json!({"validate_request_body": true, "max_req_body_size": 64}),
                )],
            ),
            route_with(
                "default/r/small",
                &["/small*"],
                "u",
                vec![
                    plugin(
                        "hmac-auth",
                        json!({"validate_request_body": true, "max_req_body_size": 64}),
                    ),
                    plugin("client-control", json!({"max_body_size": 16})),
                ],
            ),
            route_with(
                "default/r/nobody",
                &["/nobody*"],
                "u",
                vec![plugin("hmac-auth", json!({}))],
            ),
        ],
        vec![hmac_consumer("default_jack", "jack-key", "jack-secret")],
    )
    .await;
    let full = |b: &'static [u8]| Full::new(Bytes::from_static(b));
    let fail = hmac_refused;
    let body: &'static [u8] = br#"{"name": "world"}"#;
    let good = digest_of(body);

    // A good digest: the upstream gets the body unchanged, Digest included.
    let r = send_any(
        dp.addr,
        signed_post("/body", "jack-secret", Some(&good), full(body)),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let origin = r.json();
    assert_eq!(origin["body"], r#"{"name": "world"}"#);
    assert_eq!(origin["headers"]["content-length"], "17");
    assert_eq!(origin["headers"]["digest"], good.as_str());
    // ... chunked too (the digest of all the pieces).
    let pieces = vec![
        Bytes::from_static(br#"{"name": "#),
        Bytes::from_static(br#""world"}"#),
    ];
    let r = send_any(
        dp.addr,
        signed_post("/body", "jack-secret", Some(&good), chunked(pieces)),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["body"], r#"{"name": "world"}"#);
    // ... and no body: the digest of nothing.
    let r = send_any(
        dp.addr,
        signed_post("/body", "jack-secret", Some(&digest_of(b"")), full(b"")),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());

    // A wrong digest; the body changed on the way; another digest syntax; no digest.
    fail(
        &send_any(
            dp.addr,
            signed_post(
                "/body",
                "jack-secret",
                Some(&digest_of(b"other")),
                full(body),
            ),
        )
        .await,
        "wrong digest",
    );
    fail(
        &send_any(
            dp.addr,
            signed_post(
                "/body",
                "jack-secret",
                Some(&good),
                full(br#"{"name": "mallory"}"#),
            ),
        )
        .await,
        "tampered body",
    );
    let lower = good.replace("SHA-256=", "sha-256=");
    fail(
        &send_any(
            dp.addr,
            signed_post("/body", "jack-secret", Some(&lower), full(body)),
        )
        .await,
        "digest compared as APISIX writes it",
    );
    fail(
        &send_any(
            dp.addr,
            signed_post("/body", "jack-secret", None, full(body)),
        )
        .await,
        "missing digest",
    );
    // A bad signature fails as such, whatever the body.
    fail(
        &send_any(
            dp.addr,
            signed_post("/body", "wrong", Some(&good), full(body)),
        )
        .await,
        "bad signature",
    );

    // Over max_req_body_size (64): 413 with APISIX's message, no challenge; announced
    // (content-length) or not (chunked).
    let big = Bytes::from(vec![b'x'; 100]);
    let big_digest = digest_of(&big);
    let r = send_any(
        dp.addr,
        signed_post(
            "/body",
            "jack-secret",
            Some(&big_digest),
            Full::new(big.clone()),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"message": "request size 100 is greater than the maximum size 64 allowed"})
    );
    assert_eq!(h(&r, "www-authenticate"), None);
    assert!(!from_origin(&r));
    let r = send_any(
        dp.addr,
        signed_post(
            "/body",
            "jack-secret",
            Some(&big_digest),
            chunked(vec![big.slice(..50), big.slice(50..)]),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"message": "request size is greater than the maximum size 64 allowed"})
    );
    // At the cap, it passes.
    let at_cap = Bytes::from(vec![b'y'; 64]);
    let r = send_any(
        dp.addr,
        signed_post(
            "/body",
            "jack-secret",
            Some(&digest_of(&at_cap)),
            Full::new(at_cap),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["body_len"], 64);

    // client-control's smaller limit on a chunked body: client-control's 413.
    let mid = Bytes::from(vec![b'z'; 32]);
    let r = send_any(
        dp.addr,
        signed_post(
            "/small",
            "jack-secret",
            Some(&digest_of(&mid)),
            chunked(vec![mid.slice(..16), mid.slice(16..)]),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"error_msg": "413 Request Entity Too Large"})
    );

    // Without validate_request_body, the digest is not looked at.
    let r = send_any(
        dp.addr,
        signed_post(
            "/nobody",
            "jack-secret",
            Some(&digest_of(b"other")),
            full(body),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["body"], r#"{"name": "world"}"#);
}

// ---------------------------------------------------------------- api-breaker

#[tokio::test]
async fn api_breaker_opens_on_failures_and_closes_on_successes() {
    let (dp, _echo) = serve(
        vec![
            route_with(
                "default/r/p",
                &["/*"],
                "u",
                vec![plugin(
                    "api-breaker",
                    json!({
                        "break_response_code": 502,
                        "break_response_body": "breaker open",
                        "break_response_headers": [{"key": "X-Breaker", "value": "open for $uri"}],
                        "max_breaker_sec": 10,
                        "unhealthy": {"http_statuses": [500, 503], "failures": 2},
                        "healthy": {"http_statuses": [200], "successes": 2}
                    }),
                )],
            ),
            route("default/r/free", &["/free"], "u"),
        ],
        vec![],
    )
    .await;
    let status = |p: &'static str| {
        let addr = dp.addr;
        async move { get(addr, "example.com", p).await }
    };
    assert_eq!(status("/status/500").await.status.as_u16(), 500);
    assert_eq!(
        status("/status/404").await.status.as_u16(),
        404,
        "neither healthy nor unhealthy"
    );
    assert_eq!(
        status("/ok").await.status.as_u16(),
        200,
        "one success does not close"
    );
    assert_eq!(
        status("/status/503").await.status.as_u16(),
        503,
        "second failure: open"
    );
    // Open: the route's requests (any URI) are answered by the breaker.
    for p in ["/ok", "/status/200"] {
        let r = status(p).await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{p}");
        assert_eq!(r.text(), "breaker open");
        assert_eq!(h(&r, "x-breaker"), Some(format!("open for {p}").as_str()));
        assert!(!from_origin(&r));
    }
    let r = status("/free").await;
    assert_eq!(r.status, StatusCode::OK, "other routes are not affected");
    // 2^(2/2) = 2 s later: half open; `successes` successes close and forget the failures.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(status("/ok").await.status, StatusCode::OK);
    assert_eq!(status("/ok").await.status, StatusCode::OK);
    assert_eq!(status("/status/500").await.status.as_u16(), 500);
    assert_eq!(status("/status/500").await.status.as_u16(), 500);
    assert_eq!(
        status("/ok").await.status,
        StatusCode::BAD_GATEWAY,
        "open again"
    );
    // Had the failures not been forgotten (4 of them), it would stay open 2^2 = 4 s.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(status("/ok").await.status, StatusCode::OK);
}

#[tokio::test]
async fn api_breaker_without_body_answers_an_empty_break_response_code() {
    let (dp, _echo) = serve(
        vec![route_with(
            "default/r/p",
            &["/*"],
            "u",
            vec![plugin(
                "api-breaker",
                json!({"break_response_code": 599, "unhealthy": {"failures": 1},
                       "break_response_headers": [{"key": "x-b", "value": "1"}]}),
            )],
        )],
        vec![],
    )
    .await;
    assert_eq!(get(dp.addr, "h", "/status/500").await.status.as_u16(), 500);
    let r = get(dp.addr, "h", "/ok").await;
    assert_eq!(r.status.as_u16(), 599);
    assert!(r.body.is_empty());
    assert_eq!(h(&r, "x-b"), None, "headers only with a body, as APISIX");
}

#[tokio::test]
async fn api_breaker_in_a_global_rule_keeps_one_breaker_per_route() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    let mut snap = snapshot(
        1,
        vec![
            v1::Route {
                hosts: vec!["a.com".into()],
                ..route("default/r/a", &["/*"], "u")
            },
            v1::Route {
                hosts: vec!["b.com".into()],
                ..route("default/r/b", &["/*"], "u")
            },
        ],
        vec![upstream("u", &[(echo.addr, 1)])],
    );
    snap.global_rules = vec![v1::GlobalRule {
        id: "default/g".into(),
        plugins: vec![plugin(
            "api-breaker",
            json!({"break_response_code": 503, "unhealthy": {"failures": 2}}),
        )],
    }];
    dp.store.apply(snap, vec![]).unwrap();
    // One failure on each route: neither reaches `failures: 2`.
    assert_eq!(
        get(dp.addr, "a.com", "/status/500").await.status.as_u16(),
        500
    );
    assert_eq!(
        get(dp.addr, "b.com", "/status/500").await.status.as_u16(),
        500
    );
    assert_eq!(get(dp.addr, "a.com", "/ok").await.status, StatusCode::OK);
    assert_eq!(
        get(dp.addr, "a.com", "/status/500").await.status.as_u16(),
        500
    );
    // Route a opened; route b has one failure and still serves.
    assert_eq!(get(dp.addr, "a.com", "/ok").await.status.as_u16(), 503);
    assert_eq!(get(dp.addr, "b.com", "/ok").await.status, StatusCode::OK);
}

#[tokio::test]
async fn api_breaker_counts_the_proxys_502_for_an_unreachable_upstream() {
    let dp = dataplane().await;
    dp.store
        .apply(
            snapshot(
                1,
                vec![route_with(
                    "default/r/p",
                    &["/*"],
                    "u",
                    vec![plugin(
                        "api-breaker",
                        json!({"break_response_code": 503, "break_response_body": "open",
                               "unhealthy": {"http_statuses": [502], "failures": 1}}),
                    )],
                )],
                vec![upstream("u", &[(closed_port(), 1)])],
            ),
            vec![],
        )
        .unwrap();
    let r = get(dp.addr, "h", "/x").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    let r = get(dp.addr, "h", "/x").await;
    assert_eq!((r.status.as_u16(), r.text()), (503, "open".to_owned()));
}

// ---------------------------------------------------------------- refused plugins

#[tokio::test]
async fn lua_code_plugins_are_refused_by_name() {
    let echo = EchoServer::start("a", any()).await.unwrap();
    let dp = dataplane().await;
    for (name, why) in [
        ("serverless-pre-function", "runs Lua code"),
        ("serverless-post-function", "runs Lua code"),
        (
            "ext-plugin-pre-req",
            "runs code in an external APISIX plugin runner",
        ),
    ] {
        let err = dp
            .store
            .apply(
                snapshot(
                    1,
                    vec![route_with(
                        "default/r/lua",
                        &["/*"],
                        "u",
                        vec![plugin(
                            name,
                            json!({"phase": "rewrite", "functions": ["return function() end"]}),
                        )],
                    )],
                    vec![upstream("u", &[(echo.addr, 1)])],
                ),
                vec![],
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("plugin {name:?} {why}")), "{err}");
        assert!(err.contains("Sluice cannot run it"), "{err}");
        assert!(!err.contains("unknown"), "{err}");
    }
}

/// hmac-auth's refusal, as APISIX answers it: 401, its message and challenge, and the
/// origin never asked.
fn hmac_refused(r: &Resp, why: &str) {
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{why}: {}", r.text());
    assert_eq!(
        r.json(),
        json!({"message": "client request can't be validated"}),
        "{why}"
    );
    assert_eq!(
        h(r, "www-authenticate"),
        Some("hmac realm=\"hmac\""),
        "{why}"
    );
    assert!(!from_origin(r), "{why}");
}
