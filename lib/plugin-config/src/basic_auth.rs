//! `basic-auth`: a consumer is identified by HTTP Basic credentials.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::{ConsumerSchema, FieldError, PluginSchema};

/// Most entries `htpasswd` may hold.
pub const MAX_HTPASSWD_USERS: usize = 10_000;

/// Route configuration of `basic-auth`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct BasicAuth {
    /// Remove the `Authorization` header before proxying; default false.
    #[serde(default)]
    pub hide_credentials: bool,
    /// Sluice extension (ingress-nginx `auth-type: basic` with an htpasswd `auth-secret`):
    /// the users of an htpasswd file. When set, credentials are checked against these
    /// entries only (consumers are ignored) and no consumer is attached to the request.
    /// At most [`MAX_HTPASSWD_USERS`] entries; see [`HashFormat`] for the hashes accepted.
    #[serde(default)]
    pub htpasswd: Option<Vec<HtpasswdUser>>,
    /// Sluice extension (ingress-nginx `auth-realm`): the realm of the `WWW-Authenticate`
    /// challenge, sent as `Basic realm="<realm>"` (`"` and `\` escaped). Default: APISIX's
    /// `Basic realm='.'`.
    #[serde(default)]
    pub realm: Option<String>,
}

/// One line of an htpasswd file: `username:hash`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HtpasswdUser {
    /// User name: not empty, no `:`.
    pub username: String,
    /// The password hash as htpasswd writes it (see [`HashFormat`]).
    pub hash: String,
}

/// The hash formats of htpasswd entries that Sluice verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashFormat {
    /// bcrypt, `$2a$`, `$2b$` or `$2y$` (`htpasswd -B`).
    Bcrypt,
    /// Apache MD5-crypt, `$apr1$salt$hash` (`htpasswd -m`, the historical default).
    Apr1,
    /// `{SHA}` + base64(SHA-1(password)) (`htpasswd -s`).
    Sha,
    /// `{SSHA}` + base64(SHA-1(password + salt) + salt) (OpenLDAP's salted SHA-1).
    Ssha,
    /// `{PLAIN}` + the password in clear.
    Plain,
}

/// An htpasswd hash Sluice cannot verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadHash {
    /// What is wrong (`unsupported hash format`, `malformed bcrypt hash`).
    pub problem: &'static str,
    /// What is expected instead.
    pub want: &'static str,
}

impl std::fmt::Display for BadHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.problem, self.want)
    }
}

const fn bad(problem: &'static str, want: &'static str) -> BadHash {
    BadHash { problem, want }
}

/// bcrypt's base64 alphabet, in order.
const BCRYPT64: &[u8; 64] = b"./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// The alphabet of crypt(3)'s base64 (bcrypt and MD5-crypt hashes).
fn is_crypt64(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'.' || c == b'/'
}

impl HashFormat {
    /// The format of `hash`, checked to be well-formed: `Err` says what is wrong.
    pub fn of(hash: &str) -> Result<HashFormat, BadHash> {
        if let Some(rest) = ["$2a$", "$2b$", "$2y$"]
            .iter()
            .find_map(|p| hash.strip_prefix(p))
        {
            // `NN$` + 22 salt characters + 31 hash characters.
            let bytes = rest.as_bytes();
            let cost_ok = bytes.len() == 3 + 53
                && bytes[2] == b'$'
                && rest[..2].bytes().all(|b| b.is_ascii_digit())
                && rest[..2]
                    .parse::<u32>()
                    .is_ok_and(|c| (4..=31).contains(&c));
            // The salt (16 bytes in 22 characters) and the hash (23 bytes in 31) end with
            // unused bits, which must be zero (as bcrypt writes them and the crate demands).
            let canonical = |c: u8, unit: usize| {
                BCRYPT64
                    .iter()
                    .position(|&a| a == c)
                    .is_some_and(|i| i % unit == 0)
            };
            if !cost_ok
                || !bytes[3..].iter().all(|&b| is_crypt64(b))
                || !canonical(bytes[3 + 21], 16)
                || !canonical(bytes[3 + 52], 4)
            {
                return Err(bad(
                    "malformed bcrypt hash",
                    "want $2y$NN$ with a cost of 04 to 31 and 53 characters of salt and hash",
                ));
            }
            return Ok(HashFormat::Bcrypt);
        }
        if let Some(rest) = hash.strip_prefix("$apr1$") {
            let ok = rest.split_once('$').is_some_and(|(salt, sum)| {
                salt.len() <= 8 && sum.len() == 22 && sum.bytes().all(is_crypt64)
            });
            if !ok {
                return Err(bad(
                    "malformed $apr1$ hash",
                    "want $apr1$<salt of up to 8 characters>$<22 characters>",
                ));
            }
            return Ok(HashFormat::Apr1);
        }
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.decode(s).ok();
        if let Some(rest) = hash.strip_prefix("{SHA}") {
            if b64(rest).is_none_or(|d| d.len() != 20) {
                return Err(bad(
                    "malformed {SHA} hash",
                    "want the base64 of a 20-byte SHA-1 digest",
                ));
            }
            return Ok(HashFormat::Sha);
        }
        if let Some(rest) = hash.strip_prefix("{SSHA}") {
            if b64(rest).is_none_or(|d| d.len() <= 20) {
                return Err(bad(
                    "malformed {SSHA} hash",
                    "want the base64 of a SHA-1 digest and a salt",
                ));
            }
            return Ok(HashFormat::Ssha);
        }
        if hash.starts_with("{PLAIN}") {
            return Ok(HashFormat::Plain);
        }
        Err(bad(
            "unsupported hash format",
            "bcrypt $2a$/$2b$/$2y$, $apr1$, {SHA}, {SSHA} or {PLAIN}",
        ))
    }
}

impl PluginSchema for BasicAuth {
    const NAME: &'static str = "basic-auth";
    const PRIORITY: i32 = 2520;

    fn check(&self) -> Result<(), FieldError> {
        if self
            .realm
            .as_deref()
            .is_some_and(|r| r.chars().any(char::is_control))
        {
            return Err(FieldError::new(
                "realm",
                "must not contain control characters",
            ));
        }
        let Some(users) = &self.htpasswd else {
            return Ok(());
        };
        if users.len() > MAX_HTPASSWD_USERS {
            return Err(FieldError::new(
                "htpasswd",
                format!("at most {MAX_HTPASSWD_USERS} users"),
            ));
        }
        for (i, u) in users.iter().enumerate() {
            check_username(&u.username)
                .map_err(|e| FieldError::new(format!("htpasswd[{i}].username"), e.reason))?;
            HashFormat::of(&u.hash).map_err(|e| {
                FieldError::new(
                    format!("htpasswd[{i}].hash"),
                    format!("{} for user {:?} ({})", e.problem, u.username, e.want),
                )
            })?;
        }
        Ok(())
    }
}

fn check_username(name: &str) -> Result<(), FieldError> {
    if name.is_empty() {
        return Err(FieldError::new("username", "must not be empty"));
    }
    if name.contains(':') {
        return Err(FieldError::new("username", "must not contain ':'"));
    }
    Ok(())
}

/// A consumer's `basic-auth` credential.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BasicAuthConsumer {
    /// User name. Required, not empty, no `:`.
    pub username: String,
    /// Password. Required.
    pub password: String,
}

impl ConsumerSchema for BasicAuthConsumer {
    fn check(&self) -> Result<(), FieldError> {
        check_username(&self.username)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::validate;

    #[test]
    fn basic_htpasswd_formats() {
        // Vectors: bcrypt from libxcrypt's crypt(3), $apr1$ from `openssl passwd -apr1`,
        // {SHA} and {SSHA} from `openssl dgst -sha1 -binary | base64`.
        for (h, f) in [
            (
                "$2y$10$ABCDEFGHIJKLMNOPQRSTUuil2QQyrQJZQv23xC5ObUXot4klFBg3O",
                HashFormat::Bcrypt,
            ),
            (
                "$2a$05$0123456789abcdefghijke7bhppOifpsH2hS8.a0fHHGZQ6G.xPgW",
                HashFormat::Bcrypt,
            ),
            ("$apr1$s4ltS4lt$OclgO3BbA4P5n9rdkkg9F/", HashFormat::Apr1),
            ("{SHA}mYaP0lMpbAbqlz+/QP6oV6SzMLc=", HashFormat::Sha),
            (
                "{SSHA}VoXcsc5QLLslH04c6jnjNxKGX2FOYUNsMTIzNA==",
                HashFormat::Ssha,
            ),
            ("{PLAIN}x", HashFormat::Plain),
        ] {
            assert_eq!(HashFormat::of(h), Ok(f), "{h}");
        }
        for h in [
            "",
            "plain",
            "$1$abcdefgh$G//4keteveJp0qb8z2DxG/",
            "$2y$10$short",
            "$2y$99$ABCDEFGHIJKLMNOPQRSTUuil2QQyrQJZQv23xC5ObUXot4klFBg3O",
            "$2y$10$ABCDEFGHIJKLMNOPQRSTUuil2QQyrQJZQv23xC5ObUXot4klFBg3!",
            // Unused bits set in the last salt, then hash, character.
            "$2y$10$ABCDEFGHIJKLMNOPQRSTUvil2QQyrQJZQv23xC5ObUXot4klFBg3O",
            "$2y$10$ABCDEFGHIJKLMNOPQRSTUuil2QQyrQJZQv23xC5ObUXot4klFBg3P",
            "$apr1$s4ltS4lt$short",
            "$apr1$toolongsalt$OclgO3BbA4P5n9rdkkg9F/",
            "{SHA}notbase64!",
            "{SHA}YWJj",
            "{SSHA}mYaP0lMpbAbqlz+/QP6oV6SzMLc=",
        ] {
            assert!(HashFormat::of(h).is_err(), "{h}");
        }
    }

    #[test]
    fn basic_htpasswd_validation() {
        let v = |c| validate("basic-auth", &c);
        v(json!({})).unwrap();
        v(json!({"htpasswd": [], "realm": "r"})).unwrap();
        v(json!({"htpasswd": [{"username": "a", "hash": "{PLAIN}x"}], "realm": "Auth \"x\""}))
            .unwrap();
        let e = v(json!({"htpasswd": [{"username": "a", "hash": "{PLAIN}x"}, {"username": "bob", "hash": "md5:xyz"}]}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("htpasswd[1].hash: unsupported hash format for user \"bob\""),
            "{e}"
        );
        assert!(e.contains("$apr1$"), "{e}");
        let e = v(json!({"htpasswd": [{"username": "c", "hash": "$2y$10$nope"}]}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("htpasswd[0].hash: malformed bcrypt hash for user \"c\" (want $2y$"),
            "{e}"
        );
        assert!(e.contains("\"c\""), "{e}");
        let e = v(json!({"htpasswd": [{"username": "a:b", "hash": "{PLAIN}x"}]}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("htpasswd[0].username: must not contain ':'"),
            "{e}"
        );
        let e = v(json!({"htpasswd": [{"username": "", "hash": "{PLAIN}x"}]}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("htpasswd[0].username: must not be empty"), "{e}");
        let e = v(json!({"htpasswd": [{"username": "a", "hash": "{PLAIN}x", "x": 1}]}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field"), "{e}");
        let e = v(json!({"realm": "a\r\nb"})).unwrap_err().to_string();
        assert!(
            e.contains("realm: must not contain control characters"),
            "{e}"
        );
        let many: Vec<_> = (0..=MAX_HTPASSWD_USERS)
            .map(|i| json!({"username": format!("u{i}"), "hash": "{PLAIN}x"}))
            .collect();
        let e = v(json!({ "htpasswd": many })).unwrap_err().to_string();
        assert!(e.contains("htpasswd: at most 10000 users"), "{e}");
    }
}
