//! `request-id` (priority 12015, rewrite phase): every request carries an id in
//! `header_name` (`X-Request-Id`) to the upstream and, with `include_in_response` (default),
//! back to the client. An id the client sent is kept. Ids: `uuid` (v4, the default),
//! `nanoid` (21 characters of `A-Za-z0-9_-`) or `range_id` (`length` characters of
//! `char_set`).

use std::sync::Arc;

use http::header::{HeaderName, HeaderValue};
use http::{request, response};
use sluice_plugin_config::request_id::{Algorithm, RequestId as Config};
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{BuildCtx, Flow, Plugin, PluginCtx};

const NANOID: &[u8] = b"_-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// The plugin.
#[derive(Debug)]
pub struct RequestId {
    header: HeaderName,
    in_response: bool,
    algorithm: Algorithm,
    charset: Vec<u8>,
    length: usize,
}

#[derive(Debug, Clone)]
struct Id(HeaderValue);

/// Builds `request-id`.
pub fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Arc<dyn Plugin>, ConfigError> {
    let conf: Config = sluice_plugin_config::parse_json(json)?;
    let header =
        HeaderName::from_bytes(conf.header_name.to_ascii_lowercase().as_bytes()).map_err(|_| {
            ConfigError::Field {
                plugin: Config::NAME.into(),
                field: "header_name".into(),
                reason: "not a valid header name".into(),
            }
        })?;
    Ok(Arc::new(RequestId {
        header,
        in_response: conf.include_in_response,
        algorithm: conf.algorithm,
        charset: conf.range_id.char_set.into_bytes(),
        length: conf.range_id.length,
    }))
}

/// A random UUID v4, lower-case with dashes.
pub fn uuid_v4() -> String {
    let mut b: [u8; 16] = fastrand::u128(..).to_le_bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let mut s = String::with_capacity(36);
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{x:02x}"));
    }
    s
}

fn from_set(set: &[u8], len: usize) -> String {
    (0..len)
        .map(|_| char::from(set[fastrand::usize(..set.len())]))
        .collect()
}

impl RequestId {
    fn make(&self) -> String {
        match self.algorithm {
            Algorithm::Uuid => uuid_v4(),
            Algorithm::Nanoid => from_set(NANOID, 21),
            Algorithm::RangeId => from_set(&self.charset, self.length),
        }
    }
}

impl Plugin for RequestId {
    fn name(&self) -> &'static str {
        Config::NAME
    }

    fn priority(&self) -> i32 {
        Config::PRIORITY
    }

    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        let id = match req.headers.get(&self.header) {
            Some(v) => v.clone(),
            None => {
                let v = HeaderValue::from_str(&self.make())
                    .unwrap_or(HeaderValue::from_static("invalid"));
                req.headers.insert(self.header.clone(), v.clone());
                v
            }
        };
        ctx.extensions.insert(Id(id));
        Flow::Continue
    }

    fn response_headers(&self, resp: &mut response::Parts, ctx: &mut PluginCtx) {
        if self.in_response
            && let Some(Id(v)) = ctx.extensions.get::<Id>()
        {
            resp.headers.insert(self.header.clone(), v.clone());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn uuid_shape() {
        let u = uuid_v4();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"), "{u}");
        assert_ne!(uuid_v4(), u);
    }
}
