//! request-validation against a real echo origin: what the client gets, what the origin
//! receives.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::json;

fn post(path: &str, content_type: &str, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("host", "example.com")
        .header("content-type", content_type)
        .body(Full::new(body.into()))
        .unwrap()
}

async fn serve(plugins: Vec<sluice_proto::v1::Plugin>) -> (sluice_testkit::EchoServer, Dataplane) {
    with_plugins(plugins).await
}

fn order_schema() -> serde_json::Value {
    json!({"body_schema": {
        "type": "object",
        "required": ["item", "quantity"],
        "properties": {
            "item": {"type": "string", "minLength": 1},
            "quantity": {"type": "integer", "minimum": 1}
        }
    }})
}

#[tokio::test]
async fn a_valid_json_body_reaches_the_upstream_as_checked() {
    let (_echo, dp) = serve(vec![plugin("request-validation", order_schema())]).await;
    // Duplicate keys: the upstream gets what the validator saw (the last one).
    let body = r#"{"item":"book","quantity":0,"quantity":2}"#;
    let r = send(dp.addr, post("/orders", "application/json", body)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let origin = r.json();
    assert_eq!(origin["body"], r#"{"item":"book","quantity":2}"#);
    assert_eq!(
        origin["headers"]["content-length"],
        r#"{"item":"book","quantity":2}"#.len().to_string()
    );
}

#[tokio::test]
async fn an_invalid_body_is_rejected_with_the_reason_or_the_message() {
    let (_echo, dp) = serve(vec![plugin("request-validation", order_schema())]).await;
    let r = send(
        dp.addr,
        post("/orders", "application/json", r#"{"item":"book"}"#),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.text().contains("\"quantity\" is a required property"),
        "{}",
        r.text()
    );
    let r = send(dp.addr, post("/orders", "application/json", "{not json")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.text().starts_with("invalid JSON body"), "{}", r.text());
    let r = send(dp.addr, post("/orders", "application/json", "")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.text(), "request body is empty");
    // Hostile nesting: a rejection, never a crash.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let r = send(dp.addr, post("/orders", "application/json", deep)).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    let mut conf = order_schema();
    conf["rejected_code"] = json!(422);
    conf["rejected_msg"] = json!("invalid order");
    let (_echo, dp) = serve(vec![plugin("request-validation", conf)]).await;
    let r = send(
        dp.addr,
        post("/orders", "application/json", r#"{"item":""}"#),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.text(), "invalid order");
}

#[tokio::test]
async fn forms_are_checked_as_objects_of_strings() {
    let (_echo, dp) = serve(vec![plugin(
        "request-validation",
        json!({"body_schema": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "enum": ["alice", "bob"]}}
        }}),
    )])
    .await;
    let form = "application/x-www-form-urlencoded; charset=utf-8";
    let r = send(dp.addr, post("/f", form, "name=alice&x=1")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        r.json()["body"],
        "name=alice&x=1",
        "a form goes as received"
    );
    let r = send(dp.addr, post("/f", form, "name=mallory")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn the_body_limit_is_the_plugins_or_client_controls() {
    let mut conf = order_schema();
    conf["max_req_body_size"] = json!(100);
    let (_echo, dp) = serve(vec![plugin("request-validation", conf)]).await;
    let big = format!(r#"{{"item":"{}","quantity":1}}"#, "x".repeat(200));
    let r = send(dp.addr, post("/orders", "application/json", big.clone())).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.text(), "request body is larger than 100 bytes");
    // With client-control's smaller limit, client-control's 413 (from Content-Length).
    let (_echo, dp) = serve(vec![
        plugin("request-validation", order_schema()),
        plugin("client-control", json!({"max_body_size": 50})),
    ])
    .await;
    let r = send(dp.addr, post("/orders", "application/json", big)).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn headers_are_checked_whatever_their_case() {
    let (_echo, dp) = serve(vec![plugin(
        "request-validation",
        json!({"header_schema": {
            "type": "object",
            "required": ["X-Api-Version"],
            "properties": {"X-Api-Version": {"type": "string", "enum": ["v1", "v2"]}}
        }}),
    )])
    .await;
    let r = get_with(dp.addr, "/h", &[("x-api-version", "v2")]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = get_with(dp.addr, "/h", &[("X-API-VERSION", "v3")]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = get_with(dp.addr, "/h", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.text().contains("x-api-version"), "{}", r.text());
    // Routes without the plugin are untouched.
    let r = get_with(dp.addr, "/free", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn a_validated_body_is_what_the_mirror_gets_too() {
    // proxy-mirror taps the body request-validation read: the mirror's copy is the
    // re-encoded one, the same bytes the upstream got.
    let (_echo, dp) = serve(vec![
        plugin("request-validation", order_schema()),
        plugin(
            "proxy-mirror",
            json!({"host": format!("http://{}", closed_port())}),
        ),
    ])
    .await;
    let r = send(
        dp.addr,
        post(
            "/orders",
            "application/json",
            r#"{ "quantity": 1, "item": "x" }"#,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["body"], r#"{"item":"x","quantity":1}"#);
}
