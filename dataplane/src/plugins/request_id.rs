//! `request-id` (priority 12015, rewrite phase): every request carries an id in
//! `header_name` (`X-Request-Id`) to the upstream and, with `include_in_response` (default),
//! back to the client. An id the client sent is kept. Ids: `uuid` (v4, the default),
//! `nanoid` (21 characters of `A-Za-z0-9_-`), `range_id` (`length` characters of
//! `char_set`), `ksuid` or `uuidv7`. An id the upstream answers with is kept.

use http::header::{HeaderName, HeaderValue};
use http::{request, response};
use sluice_plugin_config::request_id::{Algorithm, RequestId as Config};
use sluice_plugin_config::{ConfigError, PluginSchema};

use super::{BuildCtx, Builtin, Flow, Hooks, Plugin, PluginCtx};

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

impl Builtin for RequestId {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE.with(Hooks::RESPONSE_HEADERS);

    /// Builds `request-id`.
    fn build(json: &str, _cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let header = HeaderName::from_bytes(conf.header_name.to_ascii_lowercase().as_bytes())
            .map_err(|_| ConfigError::Field {
                plugin: Config::NAME.into(),
                field: "header_name".into(),
                reason: "not a valid header name".into(),
            })?;
        Ok(RequestId {
            header,
            in_response: conf.include_in_response,
            algorithm: conf.algorithm,
            charset: conf.range_id.char_set.into_bytes(),
            length: conf.range_id.length,
        })
    }
}

/// A random UUID v4, lower-case with dashes.
pub fn uuid_v4() -> String {
    let mut b: [u8; 16] = fastrand::u128(..).to_le_bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    hyphenated(&b)
}

/// A UUID v7: 48 bits of Unix milliseconds, then random bits.
pub fn uuid_v7() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut b: [u8; 16] = fastrand::u128(..).to_le_bytes();
    b[..6].copy_from_slice(&(ms as u64).to_be_bytes()[2..]);
    b[6] = (b[6] & 0x0f) | 0x70;
    b[8] = (b[8] & 0x3f) | 0x80;
    hyphenated(&b)
}

fn hyphenated(b: &[u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// A KSUID: 4 bytes of seconds since 2014-05-13 (1400000000) and 16 random bytes, in 27
/// base62 characters.
pub fn ksuid() -> String {
    const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let ts = u32::try_from(secs.saturating_sub(1_400_000_000)).unwrap_or(u32::MAX);
    let mut n = [0u8; 20];
    n[..4].copy_from_slice(&ts.to_be_bytes());
    n[4..].copy_from_slice(&fastrand::u128(..).to_le_bytes());
    // Base62 of a 160-bit big-endian number by repeated division.
    let mut digits = Vec::with_capacity(27);
    let mut num = n.to_vec();
    while num.iter().any(|&d| d != 0) {
        let mut rem = 0u32;
        for d in num.iter_mut() {
            let acc = (rem << 8) | u32::from(*d);
            *d = (acc / 62) as u8;
            rem = acc % 62;
        }
        digits.push(BASE62[rem as usize]);
    }
    while digits.len() < 27 {
        digits.push(b'0');
    }
    digits.reverse();
    String::from_utf8(digits).unwrap_or_default()
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
            Algorithm::Ksuid => ksuid(),
            Algorithm::Uuidv7 => uuid_v7(),
        }
    }
}

impl Plugin for RequestId {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        let id = match req.headers.get(&self.header).filter(|v| !v.is_empty()) {
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
        // NB: an id the upstream answered with is kept, as APISIX.
        if self.in_response
            && resp.headers.get(&self.header).is_none_or(|v| v.is_empty())
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
        let v7 = uuid_v7();
        assert_eq!(&v7[14..15], "7");
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        let t = u64::from_str_radix(&v7[..13].replace('-', ""), 16).unwrap();
        assert!((ms as u64).abs_diff(t) < 60_000, "{v7}");
        let k = ksuid();
        assert_eq!(k.len(), 27, "{k}");
        assert!(k.bytes().all(|b| b.is_ascii_alphanumeric()));
    }
}
