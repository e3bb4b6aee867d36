//! `basic-auth` (priority 2520): the consumer named by HTTP Basic credentials.
//!
//! 401 with `WWW-Authenticate: Basic realm='.'` and
//! `{"message":"Missing authorization in request"}` without credentials;
//! `"Invalid authorization in request"` when they cannot be decoded;
//! `"Invalid user authorization"` for an unknown user or a wrong password (as APISIX 3.x).
//!
//! Sluice extensions (ingress-nginx `auth-type: basic`): with `htpasswd`, users are those
//! entries only (bcrypt, `$apr1$`, `{SHA}`, `{SSHA}`, `{PLAIN}` hashes, parsed when the
//! route is built) and no consumer is attached; `realm` makes the challenge
//! `Basic realm="<realm>"`.

use std::collections::HashMap;
use std::str::FromStr as _;
use std::sync::Arc;

use base64::Engine as _;
use http::header::{self, HeaderValue};
use http::{StatusCode, request};
use md5::{Digest as _, Md5};
use serde_json::json;
use sha1::Sha1;
use sluice_plugin_config::basic_auth::{BasicAuth as Config, BasicAuthConsumer, HashFormat};
use sluice_plugin_config::{ConfigError, PluginSchema};
use subtle::ConstantTimeEq as _;

use super::{BuildCtx, Builtin, Consumer, Flow, Hooks, Plugin, PluginCtx, json_response};

type Users = HashMap<String, (String, Arc<Consumer>)>;

/// The challenge without a configured realm (APISIX's).
const DEFAULT_CHALLENGE: &str = "Basic realm='.'";

/// Who may pass.
#[derive(Debug)]
enum Accounts {
    /// APISIX: consumers with a `basic-auth` credential.
    Consumers(Arc<Users>),
    /// Sluice extension: the route's htpasswd entries (no consumer).
    Htpasswd(HashMap<String, Hash>),
}

/// An htpasswd hash, parsed once when the route is built.
#[derive(Debug)]
enum Hash {
    /// bcrypt: cost and salt, and the whole hash as the crate formats it (`$2b$`).
    Bcrypt {
        cost: u32,
        salt: [u8; 16],
        expected: String,
    },
    /// Apache MD5-crypt: salt and the 22 characters of the checksum.
    Apr1 { salt: Vec<u8>, sum: Vec<u8> },
    /// SHA-1 digest of the password.
    Sha(Vec<u8>),
    /// SHA-1 digest of password + salt, and the salt.
    Ssha { digest: Vec<u8>, salt: Vec<u8> },
    /// The password itself.
    Plain(Vec<u8>),
}

impl Hash {
    /// Parses `hash` (already checked by the config's validation; checked again here).
    fn parse(hash: &str) -> Result<Hash, String> {
        let b64 = |s: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(|e| format!("bad base64: {e}"))
        };
        Ok(match HashFormat::of(hash).map_err(|e| e.to_string())? {
            HashFormat::Bcrypt => {
                let parts = bcrypt::HashParts::from_str(hash).map_err(|e| e.to_string())?;
                Hash::Bcrypt {
                    cost: parts.get_cost(),
                    salt: parts.get_salt_raw(),
                    expected: parts.to_string(),
                }
            }
            HashFormat::Apr1 => {
                let rest = hash.strip_prefix(APR1_MAGIC).unwrap_or_default();
                let (salt, sum) = rest.split_once('$').unwrap_or_default();
                Hash::Apr1 {
                    salt: salt.as_bytes().to_vec(),
                    sum: sum.as_bytes().to_vec(),
                }
            }
            HashFormat::Sha => Hash::Sha(b64(hash.strip_prefix("{SHA}").unwrap_or_default())?),
            HashFormat::Ssha => {
                let mut digest = b64(hash.strip_prefix("{SSHA}").unwrap_or_default())?;
                if digest.len() <= 20 {
                    return Err("the {SSHA} hash has no salt".into());
                }
                let salt = digest.split_off(20);
                Hash::Ssha { digest, salt }
            }
            HashFormat::Plain => {
                Hash::Plain(hash.strip_prefix("{PLAIN}").unwrap_or_default().into())
            }
        })
    }

    /// Whether `password` matches: digests compared in constant time; an error is a mismatch.
    fn verify(&self, password: &[u8]) -> bool {
        match self {
            // NB: ~50-100 ms of CPU at cost 10, on the worker thread. Plugin phases may
            // return `Flow::Pending`, but nothing in the dataplane moves CPU work off the
            // runtime (no `block_in_place`, which also panics on a current-thread runtime),
            // so it is just called.
            Hash::Bcrypt {
                cost,
                salt,
                expected,
            } => bcrypt::hash_with_salt(password, *cost, *salt)
                .is_ok_and(|got| got.to_string().as_bytes().ct_eq(expected.as_bytes()).into()),
            Hash::Apr1 { salt, sum } => apr1_checksum(password, salt).ct_eq(sum).into(),
            Hash::Sha(digest) => Sha1::digest(password).as_slice().ct_eq(digest).into(),
            Hash::Ssha { digest, salt } => {
                let mut h = Sha1::new();
                h.update(password);
                h.update(salt);
                h.finalize().as_slice().ct_eq(digest).into()
            }
            Hash::Plain(want) => password.ct_eq(want).into(),
        }
    }
}

const APR1_MAGIC: &str = "$apr1$";

/// crypt(3)'s base64 alphabet, in the order MD5-crypt uses it.
const ITOA64: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The 22-character checksum of Apache's `$apr1$` MD5-crypt: Poul-Henning Kamp's FreeBSD
/// MD5-crypt with the magic `$apr1$` instead of `$1$` (salt up to 8 bytes, 1000 rounds).
fn apr1_checksum(pw: &[u8], salt: &[u8]) -> [u8; 22] {
    let salt = &salt[..salt.len().min(8)];
    // The alternate sum: MD5(pw, salt, pw).
    let alt = Md5::new()
        .chain_update(pw)
        .chain_update(salt)
        .chain_update(pw)
        .finalize();
    let mut ctx = Md5::new()
        .chain_update(pw)
        .chain_update(APR1_MAGIC)
        .chain_update(salt);
    // As many bytes of the alternate sum as the password is long.
    let mut left = pw.len();
    while left > 0 {
        let n = left.min(16);
        ctx.update(&alt[..n]);
        left -= n;
    }
    // For each bit of the length, low bit first: a NUL if set, else the first byte of pw.
    let mut bits = pw.len();
    while bits != 0 {
        if bits & 1 == 1 {
            ctx.update([0u8]);
        } else {
            ctx.update(&pw[..1]);
        }
        bits >>= 1;
    }
    let mut fin = ctx.finalize();
    for i in 0..1000 {
        let mut c = Md5::new();
        if i & 1 == 1 {
            c.update(pw);
        } else {
            c.update(fin);
        }
        if i % 3 != 0 {
            c.update(salt);
        }
        if i % 7 != 0 {
            c.update(pw);
        }
        if i & 1 == 1 {
            c.update(fin);
        } else {
            c.update(pw);
        }
        fin = c.finalize();
    }
    let mut out = [0u8; 22];
    let mut at = 0;
    let mut to64 = |mut v: u32, n: usize| {
        for _ in 0..n {
            out[at] = ITOA64[(v & 0x3f) as usize];
            v >>= 6;
            at += 1;
        }
    };
    let b = |i: usize| u32::from(fin[i]);
    for (x, y, z) in [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)] {
        to64((b(x) << 16) | (b(y) << 8) | b(z), 4);
    }
    to64(b(11), 2);
    out
}

/// `Basic realm="<realm>"`, `"` and `\` escaped (a quoted-string, as nginx sends).
fn challenge(realm: Option<&str>) -> Result<HeaderValue, ConfigError> {
    let Some(realm) = realm else {
        return Ok(HeaderValue::from_static(DEFAULT_CHALLENGE));
    };
    let mut v = String::with_capacity(realm.len() + 16);
    v.push_str("Basic realm=\"");
    for c in realm.chars() {
        if c == '"' || c == '\\' {
            v.push('\\');
        }
        v.push(c);
    }
    v.push('"');
    HeaderValue::from_str(&v).map_err(|_| ConfigError::Field {
        plugin: Config::NAME.into(),
        field: "realm".into(),
        reason: "must not contain control characters".into(),
    })
}

/// The plugin on one route.
#[derive(Debug)]
pub struct BasicAuth {
    hide_credentials: bool,
    accounts: Accounts,
    challenge: HeaderValue,
}

impl Builtin for BasicAuth {
    type Config = Config;
    const HOOKS: Hooks = Hooks::REWRITE;

    /// Builds `basic-auth`.
    fn build(json: &str, cx: &BuildCtx<'_>) -> Result<Self, ConfigError> {
        let conf: Config = sluice_plugin_config::parse_json(json)?;
        let accounts = if let Some(entries) = &conf.htpasswd {
            let mut users = HashMap::with_capacity(entries.len());
            for (i, u) in entries.iter().enumerate() {
                let hash = Hash::parse(&u.hash).map_err(|why| ConfigError::Field {
                    plugin: Config::NAME.into(),
                    field: format!("htpasswd[{i}].hash"),
                    reason: format!("{why} for user {:?}", u.username),
                })?;
                // The first line of a user wins, as in nginx.
                users.entry(u.username.clone()).or_insert(hash);
            }
            Accounts::Htpasswd(users)
        } else {
            Accounts::Consumers(cx.consumers.index(Config::NAME, |consumers| {
                let mut users = Users::new();
                for c in consumers {
                    if let Some(cred) = c.credential(Config::NAME) {
                        let u: BasicAuthConsumer =
                            sluice_plugin_config::parse_consumer_json::<Config, _>(cred)?;
                        users.insert(u.username, (u.password, Arc::clone(c)));
                    }
                }
                Ok(users)
            })?)
        };
        Ok(BasicAuth {
            hide_credentials: conf.hide_credentials,
            accounts,
            challenge: challenge(conf.realm.as_deref())?,
        })
    }
}

fn unauthorized(msg: &str, challenge: Option<&HeaderValue>) -> Flow<'static> {
    let mut resp = json_response(StatusCode::UNAUTHORIZED, &json!({ "message": msg }));
    if let Some(challenge) = challenge {
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, challenge.clone());
    }
    Flow::respond(resp)
}

/// (user, password) from `Basic <base64>`, whitespace removed as APISIX does.
fn credentials(value: &str) -> Option<(String, String)> {
    let (u, p) = raw_credentials(value)?;
    let strip = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    Some((strip(&u), strip(&p)))
}

/// (user, password) from `Basic <base64>` as sent (nginx's `auth_basic`: a password may
/// hold spaces).
fn raw_credentials(value: &str) -> Option<(String, String)> {
    let b64 = value
        .strip_prefix("Basic")
        .filter(|r| r.starts_with(char::is_whitespace))?
        .trim();
    let raw = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_owned(), p.to_owned()))
}

impl Plugin for BasicAuth {
    fn rewrite<'a>(&'a self, req: &'a mut request::Parts, ctx: &'a mut PluginCtx) -> Flow<'a> {
        let Some(value) = req.headers.get(header::AUTHORIZATION) else {
            return unauthorized("Missing authorization in request", Some(&self.challenge));
        };
        // NB: with htpasswd users (ingress-nginx's `auth-type: basic`), as nginx: the
        // credentials as sent, and the challenge on every 401.
        let htpasswd = matches!(self.accounts, Accounts::Htpasswd(_));
        let challenge = htpasswd.then_some(&self.challenge);
        let decode = if htpasswd {
            raw_credentials
        } else {
            credentials
        };
        let Some((user, password)) = value.to_str().ok().and_then(decode) else {
            return unauthorized("Invalid authorization in request", challenge);
        };
        match &self.accounts {
            Accounts::Consumers(users) => match users.get(&user) {
                Some((want, consumer)) if *want == password => {
                    ctx.consumer = Some(Arc::clone(consumer));
                }
                _ => return unauthorized("Invalid user authorization", None),
            },
            Accounts::Htpasswd(users) => {
                if !users
                    .get(&user)
                    .is_some_and(|h| h.verify(password.as_bytes()))
                {
                    return unauthorized("Invalid user authorization", challenge);
                }
            }
        }
        if self.hide_credentials {
            req.headers.remove(header::AUTHORIZATION);
        }
        Flow::Continue
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_basic() {
        assert_eq!(
            credentials("Basic dXNlcjpwYXNz"),
            Some(("user".into(), "pass".into()))
        );
        assert_eq!(credentials("Bearer x"), None);
        assert_eq!(credentials("Basic !!!"), None);
    }

    /// Checks that `hash` accepts `right` and refuses `wrong` ones.
    fn check(hash: &str, right: &str, wrong: &[&str]) {
        let h = Hash::parse(hash).unwrap();
        assert!(h.verify(right.as_bytes()), "{hash} with {right:?}");
        for w in wrong {
            assert!(!h.verify(w.as_bytes()), "{hash} with {w:?}");
        }
    }

    #[test]
    fn basic_auth_htpasswd_bcrypt() {
        // Produced by a second implementation, libxcrypt's crypt(3) (Python's `crypt`
        // module): `crypt.crypt(password, "$2y$10$ABCDEFGHIJKLMNOPQRSTUu")` and so on.
        check(
            "$2y$10$ABCDEFGHIJKLMNOPQRSTUuil2QQyrQJZQv23xC5ObUXot4klFBg3O",
            "secret-bcrypt",
            &["secret-bcryp", "secret-bcryptx", "", "Secret-bcrypt"],
        );
        check(
            "$2a$05$0123456789abcdefghijke7bhppOifpsH2hS8.a0fHHGZQ6G.xPgW",
            "secret-2a",
            &["secret-2b", ""],
        );
        check(
            "$2b$04$zyxwvutsrqponmlkjihgfec3ZSQW0mUz4Zj0NSu538RGksb86YNUm",
            "secret-2b",
            &["secret-2a"],
        );
        check(
            "$2y$04$abcdefghijklmnopqrstuubyCG3zY1GIXMyxfivm.ClDiInHzxjiq",
            "",
            &["a"],
        );
        // 80 bytes: bcrypt only uses the first 72 (libxcrypt gives the same hash for both).
        let long = "a".repeat(80);
        check(
            "$2b$04$abcdefghijklmnopqrstuuBzzIgyKkz7xMWYSzkIjUSnxEQFQ0WNe",
            &long,
            &[&long[..71]],
        );
        assert!(Hash::parse("$2y$10$nope").is_err());
    }

    #[test]
    fn basic_auth_htpasswd_apr1() {
        // `openssl passwd -apr1 -salt <salt> <password>`.
        for (hash, right, wrong) in [
            (
                "$apr1$s4ltS4lt$OclgO3BbA4P5n9rdkkg9F/",
                "secret-apr1",
                "secret-apr2",
            ),
            ("$apr1$ab$eIePjsejfBGR8ITtu2z0U1", "x", "y"),
            (
                "$apr1$12345678$MgqyYzJ7cFlaOdwRwue.l.",
                "a much longer password than sixteen bytes, really",
                "a much longer password than sixteen bytes, reall",
            ),
            ("$apr1$xyz$Pix4eE3fQHxJjb6LqtyMK1", "", "x"),
            (
                "$apr1$AbCdEfGh$/Ui2Z5/aUwlYcPblv4ezw/",
                "pässwörd",
                "passwörd",
            ),
            (
                "$apr1$s4ltS4lt$ulLDYUHjPedjABuvRtRI6/",
                "123456789012345678901234567890123",
                "12345678901234567890123456789012",
            ),
        ] {
            check(hash, right, &[wrong]);
        }
        // The 22 characters themselves.
        assert_eq!(
            &apr1_checksum(b"secret-apr1", b"s4ltS4lt"),
            b"OclgO3BbA4P5n9rdkkg9F/"
        );
    }

    #[test]
    fn basic_auth_htpasswd_sha_ssha_plain() {
        // `printf %s secret-sha | openssl dgst -sha1 -binary | base64`.
        check(
            "{SHA}mYaP0lMpbAbqlz+/QP6oV6SzMLc=",
            "secret-sha",
            &["secret-sh", ""],
        );
        // `(printf %s secret-ssha; printf %s NaCl1234) | openssl dgst -sha1 -binary`, then
        // that digest followed by `NaCl1234`, through `base64`.
        check(
            "{SSHA}VoXcsc5QLLslH04c6jnjNxKGX2FOYUNsMTIzNA==",
            "secret-ssha",
            &["secret-ssh", "secret-sshaNaCl1234", ""],
        );
        check("{PLAIN}open sesame", "open sesame", &["open sesam", ""]);
        check("{PLAIN}", "", &["x"]);
        assert!(Hash::parse("{SHA}YWJj").is_err());
        assert!(Hash::parse("md5:abc").is_err());
    }

    #[test]
    fn basic_auth_realm_challenge() {
        assert_eq!(challenge(None).unwrap(), "Basic realm='.'");
        assert_eq!(
            challenge(Some("Authentication Required - foo")).unwrap(),
            "Basic realm=\"Authentication Required - foo\""
        );
        assert_eq!(
            challenge(Some(r#"a "b" \c"#)).unwrap(),
            r#"Basic realm="a \"b\" \\c""#
        );
        assert!(challenge(Some("a\nb")).is_err());
    }
}
