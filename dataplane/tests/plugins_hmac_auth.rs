//! hmac-auth: signatures as APISIX checks them (algorithms, clock skew, signed headers, the
//! body digest), what a client observes (statuses, APISIX bodies, headers the origin
//! receives), with real origins.
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
/// values are in `headers` (a repeated header: its values joined by `, `, in order, as the
/// HTTP signatures draft says).
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
        } else {
            let values: Vec<&str> = headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(h))
                .map(|(_, v)| *v)
                .collect();
            if !values.is_empty() {
                text.push_str(&format!("{h}: {}\n", values.join(", ")));
            }
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
    let (dp, _echo) = serve_echo(
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
    // A signed header sent twice: every value is signed, or none passes (an upstream that
    // reads the second copy must not get an unsigned value).
    let only_first = signature(
        "jack-key",
        "jack-secret",
        "hmac-sha512",
        "GET",
        "/strict/a",
        &strict,
        &hs,
    );
    let both = [
        ("date", date.as_str()),
        ("x-custom", "v1"),
        ("x-custom", "evil"),
    ];
    let all_signed = signature(
        "jack-key",
        "jack-secret",
        "hmac-sha512",
        "GET",
        "/strict/a",
        &strict,
        &both,
    );
    for (auth, want) in [
        (&only_first, StatusCode::UNAUTHORIZED),
        (&all_signed, StatusCode::OK),
    ] {
        let mut sent = both.to_vec();
        sent.push(("authorization", auth));
        let r = get_with(dp.addr, "/strict/a", &sent).await;
        assert_eq!(r.status, want, "x-custom twice: {}", r.text());
    }

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
    let (dp, _echo) = serve_echo(
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
