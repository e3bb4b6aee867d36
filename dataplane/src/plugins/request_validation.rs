//! `request-validation` (priority 2800, rewrite phase): checks the request headers and
//! body against JSON Schemas compiled when the snapshot compiles, as APISIX does.
//!
//! - Headers are seen as an object of lower-case names to a string (an array of strings
//!   for a repeated header; bytes that are not UTF-8 replaced).
//! - The body (only with `body_schema`) is read whole before the request goes on, at most
//!   `max_req_body_size` bytes (default [`DEFAULT_MAX_BODY`]); client-control's
//!   `max_body_size` applies when smaller (answered 413 as client-control does). An
//!   `application/x-www-form-urlencoded` body is seen as an object of strings (an array
//!   for a repeated key, `true` for a key without `=`); any other body must be JSON
//!   (nesting depth at most 128). A checked JSON body is sent upstream as Sluice encoded
//!   it (as APISIX: what was checked is what the upstream parses).
//! - A rejection is `rejected_code` (400) with `rejected_msg` as the body, or the reason
//!   (`text/plain`). An empty or unreadable body, a body over the limit and a repeated
//!   `Content-Type` are rejections too.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode, request};
use serde_json::{Map, Value};
use sluice_plugin_config::request_validation::{
    CompiledSchema, DEFAULT_MAX_BODY, RequestValidation as Config,
};
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx, ReadBodyError, rejection};
use crate::upstream::body::{BodyLimit, ProxyBody};

/// The plugin on one route.
#[derive(Debug)]
pub struct RequestValidation {
    header_schema: Option<CompiledSchema>,
    body_schema: Option<CompiledSchema>,
    max_body: u64,
    rejected_code: StatusCode,
    rejected_msg: Option<String>,
}

impl Builtin for RequestValidation {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE.with(Hooks::READS_BODY);

    /// Builds `request-validation`.
    fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let field = |e: sluice_plugin_config::FieldError| ConfigError::Field {
            plugin: Config::NAME.into(),
            field: e.field,
            reason: e.reason,
        };
        Ok(RequestValidation {
            header_schema: conf.compiled_header_schema().map_err(field)?,
            body_schema: conf.compiled_body_schema().map_err(field)?,
            max_body: conf.max_req_body_size.unwrap_or(DEFAULT_MAX_BODY),
            rejected_code: super::status(conf.rejected_code),
            rejected_msg: conf.rejected_msg,
        })
    }

    fn hooks(&self) -> Hooks {
        if self.body_schema.is_some() {
            Self::HOOKS
        } else {
            Self::HOOKS.without(Hooks::READS_BODY)
        }
    }
}

/// The request headers as APISIX's validator sees them.
fn headers_value(req: &request::Parts) -> Value {
    let mut map = Map::new();
    for name in req.headers.keys() {
        let text = |v: &HeaderValue| Value::String(String::from_utf8_lossy(v.as_bytes()).into());
        let mut values = req.headers.get_all(name).iter();
        let value = match (values.next(), values.next()) {
            (Some(one), None) => text(one),
            (Some(first), Some(second)) => {
                let mut all = vec![text(first), text(second)];
                all.extend(values.map(text));
                Value::Array(all)
            }
            (None, _) => continue,
        };
        map.insert(name.as_str().to_owned(), value);
    }
    // An HTTP/2 request's `:authority` stands for `Host`, as nginx's `$http_host`.
    if !map.contains_key("host")
        && let Some(a) = req.uri.authority()
    {
        map.insert("host".into(), Value::String(a.as_str().to_owned()));
    }
    Value::Object(map)
}

/// An urlencoded form as an object: a repeated key gives an array, a key without `=`
/// gives `true` (as nginx's `ngx.decode_args`).
fn form_value(body: &[u8]) -> Value {
    let mut map = Map::new();
    for piece in body.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        let (key, value) = if piece.contains(&b'=') {
            match form_urlencoded::parse(piece).next() {
                Some((k, v)) => (k.into_owned(), Value::String(v.into_owned())),
                None => continue,
            }
        } else {
            match form_urlencoded::parse(piece).next() {
                Some((k, _)) => (k.into_owned(), Value::Bool(true)),
                None => continue,
            }
        };
        match map.get_mut(&key) {
            None => {
                map.insert(key, value);
            }
            Some(Value::Array(all)) => all.push(value),
            Some(first) => {
                let first = std::mem::take(first);
                map.insert(key, Value::Array(vec![first, value]));
            }
        }
    }
    Value::Object(map)
}

impl RequestValidation {
    fn reject(&self, reason: &str) -> Box<Response<ProxyBody>> {
        let msg = self.rejected_msg.as_deref().unwrap_or(reason);
        let mut resp = Response::new(ProxyBody::full(msg.to_owned()));
        *resp.status_mut() = self.rejected_code;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        Box::new(resp)
    }

    /// Checks the body; `Ok(Some(json))` when a JSON body is to be sent upstream as
    /// re-encoded.
    async fn check_body(
        &self,
        schema: &CompiledSchema,
        req: &request::Parts,
        ctx: &mut PluginCtx,
    ) -> Result<Option<Bytes>, Box<Response<ProxyBody>>> {
        // client-control's limit on a body of unannounced length, when smaller.
        let outer = req.extensions.get::<BodyLimit>().map(|l| l.0);
        let cap = outer.map_or(self.max_body, |o| o.min(self.max_body));
        let body = match ctx.read_body(cap).await {
            Ok(b) => b,
            Err(ReadBodyError::TooLarge(_)) if outer.is_some_and(|o| o <= self.max_body) => {
                return Err(Box::new(rejection(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    Some("413 Request Entity Too Large"),
                )));
            }
            Err(ReadBodyError::TooLarge(n)) => {
                return Err(self.reject(&format!("request body is larger than {n} bytes")));
            }
            Err(ReadBodyError::Timeout) => {
                return Err(Box::new(rejection(StatusCode::REQUEST_TIMEOUT, None)));
            }
            Err(e) => {
                tracing::debug!(error = ?e, "request-validation: the body could not be read");
                return Err(self.reject("failed to read the request body"));
            }
        };
        if body.is_empty() {
            return Err(self.reject("request body is empty"));
        }
        let mut types = req.headers.get_all(header::CONTENT_TYPE).iter();
        let content_type = types.next();
        if types.next().is_some() {
            // NB: ambiguous: Sluice and the upstream could parse the body differently.
            return Err(self.reject("duplicated Content-Type header"));
        }
        let form = content_type.is_some_and(|t| {
            let t = t.as_bytes();
            let want = b"application/x-www-form-urlencoded";
            t.len() >= want.len() && t[..want.len()].eq_ignore_ascii_case(want)
        });
        let value = if form {
            form_value(&body)
        } else {
            match serde_json::from_slice::<Value>(&body) {
                Ok(v) => v,
                Err(e) => return Err(self.reject(&format!("invalid JSON body: {e}"))),
            }
        };
        if let Err(e) = schema.check(&value) {
            return Err(self.reject(&e));
        }
        if form {
            return Ok(None);
        }
        Ok(serde_json::to_vec(&value).ok().map(Bytes::from))
    }
}

impl Plugin for RequestValidation {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        if let Some(schema) = &self.header_schema
            && let Err(e) = schema.check(&headers_value(req))
        {
            return Flow::Respond(self.reject(&e));
        }
        let Some(schema) = &self.body_schema else {
            return Flow::Continue;
        };
        Flow::Pending(Box::pin(async move {
            if let Some(json) = self.check_body(schema, req, ctx).await? {
                req.headers
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(json.len()));
                ctx.replace_body(json);
            }
            Ok(())
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn forms_as_nginx_decodes_them() {
        assert_eq!(
            form_value(b"a=1&b=x+y%21&a=2&flag&&c="),
            json!({"a": ["1", "2"], "b": "x y!", "flag": true, "c": ""})
        );
        assert_eq!(form_value(b""), json!({}));
    }

    #[test]
    fn headers_as_apisix_sees_them() {
        let req = http::Request::get("/")
            .header("X-One", "1")
            .header("accept", "a")
            .header("accept", "b")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        assert_eq!(
            headers_value(&req),
            json!({"x-one": "1", "accept": ["a", "b"]})
        );
    }
}
