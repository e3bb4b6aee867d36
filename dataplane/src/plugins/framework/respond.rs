//! The answers plugins give: APISIX's JSON rejections, a rate limit's degradation, a
//! configured status code.

use http::header::HeaderValue;
use http::{Response, StatusCode};

use super::plugin::PhaseResult;
use crate::upstream::body::ProxyBody;

/// A JSON response made by a plugin, e.g. `{"message":"Missing API key in request"}`.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<ProxyBody> {
    let mut text = body.to_string();
    text.push('\n');
    let mut resp = Response::new(ProxyBody::full(text));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// A rejection as APISIX sends it: `{"error_msg":"<msg>"}` with a message, else an empty
/// body.
pub fn rejection(code: StatusCode, msg: Option<&str>) -> Response<ProxyBody> {
    match msg {
        Some(m) => json_response(code, &serde_json::json!({ "error_msg": m })),
        None => {
            let mut resp = Response::new(ProxyBody::empty());
            *resp.status_mut() = code;
            resp
        }
    }
}

/// What a rate limit does when its Redis fails: let the request through
/// (`allow_degradation: true`) or answer 500 `{"error_msg":"<msg>"}`.
pub fn degrade(allow: bool, msg: &str) -> PhaseResult {
    if allow {
        Ok(())
    } else {
        Err(Box::new(rejection(
            StatusCode::INTERNAL_SERVER_ERROR,
            Some(msg),
        )))
    }
}

/// A status code from a validated config (200..=599).
pub fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
}
