//! Request path normalisation, as nginx builds `$uri` (which APISIX routes on):
//! percent-decoding, merged slashes, dot segments removed. Routes match the normalised path,
//! and the normalised path is what goes upstream, so that `/public/../admin`, `/%61dmin`,
//! `//admin` or `/./admin` cannot reach an `/admin/*` route's backend past that route's
//! plugins.
//!
//! - Every `%XX` is decoded (`%2F` too, as nginx does). A malformed escape, an encoded NUL
//!   or a decoded path that is not UTF-8 is refused (400).
//! - Runs of `/` become one; `.` segments go; `..` removes the segment before it. A `..`
//!   above the root is refused (400), as nginx refuses it.
//! - What is forwarded: the normalised path, percent-encoded again where a byte is not a
//!   path character (RFC 3986 `pchar` or `/`), then the query as the client sent it.
//!   With proxy-rewrite's `use_real_request_uri_unsafe` (APISIX's option of that name), the
//!   target as received goes upstream instead ([`RequestTarget`]).
//! - A path that needs none of this (the usual case) is left as it is, with no allocation.

/// Why a path is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// `%` not followed by two hex digits.
    #[error("malformed percent-encoding in the path")]
    BadEscape,
    /// `%00`.
    #[error("encoded NUL in the path")]
    Nul,
    /// The decoded path is not UTF-8.
    #[error("the decoded path is not UTF-8")]
    NotUtf8,
    /// A `..` segment would climb above the root.
    #[error("the path climbs above the root")]
    AboveRoot,
}

impl PathError {
    /// The reason, for the 400 it leads to.
    pub fn reason(self) -> &'static str {
        match self {
            PathError::BadEscape => "malformed percent-encoding in the path",
            PathError::Nul => "encoded NUL in the path",
            PathError::NotUtf8 => "the decoded path is not UTF-8",
            PathError::AboveRoot => "the path climbs above the root",
        }
    }
}

/// The request target (path and query) as the client sent it, kept in the request's
/// extensions when normalising changed the path: proxy-rewrite's
/// `use_real_request_uri_unsafe` forwards it.
#[derive(Debug, Clone)]
pub struct RequestTarget(pub http::uri::PathAndQuery);

/// A normalised path that differs from the request's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized {
    /// Decoded, what routes match (nginx `$uri`).
    pub decoded: String,
    /// Encoded again where needed, what is sent upstream.
    pub encoded: String,
}

/// The normalised form of `path`; `Ok(None)` when `path` is normalised already (or is not
/// an absolute path, such as `*`).
pub fn normalize(path: &str) -> Result<Option<Normalized>, PathError> {
    if !path.starts_with('/') || is_normal(path.as_bytes()) {
        return Ok(None);
    }
    let decoded = decode(path.as_bytes())?;
    let mut out: Vec<&[u8]> = Vec::new();
    let segments: Vec<&[u8]> = decoded[1..].split(|b| *b == b'/').collect();
    let last = segments.len() - 1;
    // Whether the result ends with a `/`: a trailing slash, or a final `.`/`..`
    // (RFC 3986 §5.2.4: `/a/b/..` is `/a/`).
    let mut trailing = false;
    for (i, seg) in segments.iter().enumerate() {
        match *seg {
            b"" => trailing = i == last && !out.is_empty(),
            b"." => trailing = i == last,
            b".." => {
                if out.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
                trailing = i == last;
            }
            s => {
                out.push(s);
                trailing = false;
            }
        }
    }
    let mut normal = Vec::with_capacity(decoded.len());
    for seg in &out {
        normal.push(b'/');
        normal.extend_from_slice(seg);
    }
    if normal.is_empty() || trailing {
        normal.push(b'/');
    }
    let decoded = String::from_utf8(normal).map_err(|_| PathError::NotUtf8)?;
    let encoded = encode(&decoded);
    Ok(Some(Normalized { decoded, encoded }))
}

/// Whether `path` (starting with `/`) has no escape, no `//` and no `.` or `..` segment.
#[inline]
fn is_normal(path: &[u8]) -> bool {
    let mut prev_slash = false;
    let mut i = 0;
    while i < path.len() {
        match path[i] {
            b'%' => return false,
            b'/' if prev_slash => return false,
            b'.' if prev_slash => {
                let next = path.get(i + 1);
                let after = path.get(i + 2);
                if matches!(next, None | Some(b'/'))
                    || (next == Some(&b'.') && matches!(after, None | Some(b'/')))
                {
                    return false;
                }
            }
            _ => {}
        }
        prev_slash = path[i] == b'/';
        i += 1;
    }
    true
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn decode(path: &[u8]) -> Result<Vec<u8>, PathError> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        if path[i] == b'%' {
            let hi = path.get(i + 1).copied().and_then(hex);
            let lo = path.get(i + 2).copied().and_then(hex);
            let (Some(hi), Some(lo)) = (hi, lo) else {
                return Err(PathError::BadEscape);
            };
            let b = hi << 4 | lo;
            if b == 0 {
                return Err(PathError::Nul);
            }
            out.push(b);
            i += 3;
        } else if path[i] == 0 {
            // NB: as `%00`, so that normalising the forwarded form gives the same verdict
            // (the fuzz target `path_normalize` found the difference).
            return Err(PathError::Nul);
        } else {
            out.push(path[i]);
            i += 1;
        }
    }
    Ok(out)
}

/// Whether `b` may stand in a path as it is: RFC 3986 `pchar` (unreserved, sub-delims,
/// `:`, `@`) or `/`.
fn path_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&b)
}

fn encode(decoded: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(decoded.len());
    for &b in decoded.as_bytes() {
        if path_char(b) {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn norm(p: &str) -> Result<String, PathError> {
        Ok(normalize(p)?.map_or_else(|| p.to_owned(), |n| n.decoded))
    }

    #[test]
    fn normal_paths_are_left_alone() {
        for p in [
            "/",
            "/a",
            "/a/b/",
            "/a.b/c..d/.e/..f",
            "/a/b.",
            "*",
            "/~user/x:y@z",
        ] {
            assert_eq!(normalize(p), Ok(None), "{p}");
        }
    }

    #[test]
    fn paths_are_normalised_as_nginx_builds_uri() {
        for (raw, want) in [
            ("/public/../admin/x", "/admin/x"),
            ("/public/%2e%2e/admin/x", "/admin/x"),
            ("/public/%2E%2E/admin/x", "/admin/x"),
            ("/public/..%2fadmin/x", "/admin/x"),
            ("/public/..%2Fadmin/x", "/admin/x"),
            ("//admin/x", "/admin/x"),
            ("/./admin/x", "/admin/x"),
            ("/%61dmin/x", "/admin/x"),
            ("/a//b///c", "/a/b/c"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/..", "/"),
            ("/.", "/"),
            ("//", "/"),
            ("/a/b/../../c/", "/c/"),
            ("/caf%C3%A9", "/café"),
            ("/a%20b", "/a b"),
        ] {
            assert_eq!(norm(raw), Ok(want.to_owned()), "{raw}");
        }
    }

    #[test]
    fn what_is_forwarded_is_encoded_again_where_needed() {
        let n = normalize("/a%20b/%3F/%25/%23/x%2Fy/./%7Euser")
            .unwrap()
            .unwrap();
        assert_eq!(n.decoded, "/a b/?/%/#/x/y/~user");
        assert_eq!(n.encoded, "/a%20b/%3F/%25/%23/x/y/~user");
    }

    #[test]
    fn bad_paths_are_refused() {
        for (raw, e) in [
            ("/..", PathError::AboveRoot),
            ("/../admin", PathError::AboveRoot),
            ("/a/../..", PathError::AboveRoot),
            ("/%2e%2e/admin", PathError::AboveRoot),
            ("/a%zz", PathError::BadEscape),
            ("/a%2", PathError::BadEscape),
            ("/a%", PathError::BadEscape),
            ("/a%00b", PathError::Nul),
            ("/a%41\0", PathError::Nul),
            ("/a%ff", PathError::NotUtf8),
        ] {
            assert_eq!(normalize(raw), Err(e), "{raw}");
        }
    }

    /// Random paths over the characters that matter: normalising is idempotent, never climbs
    /// above the root, and its encoded form decodes back to its decoded form.
    #[test]
    fn normalising_is_idempotent_and_stays_under_the_root() {
        let alphabet: &[&str] = &[
            "/", ".", "..", "%2e", "%2E", "%2f", "%2F", "a", "b", "%", "%25", "%41", " ", "?",
            "%3f", "//",
        ];
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..20_000 {
            let mut p = String::from("/");
            for _ in 0..rng.usize(0..10) {
                p.push_str(alphabet[rng.usize(0..alphabet.len())]);
            }
            let Ok(n) = normalize(&p) else { continue };
            let (decoded, encoded) = match n {
                None => (p.clone(), p.clone()),
                Some(n) => (n.decoded, n.encoded),
            };
            assert!(encoded.starts_with('/'), "{p} -> {encoded}");
            assert!(!encoded.contains("//"), "{p} -> {encoded}");
            let segs: Vec<&str> = decoded.split('/').collect();
            assert!(!segs.contains(&".."), "{p} -> {decoded}");
            // Normalising the forwarded form again changes nothing.
            let again = normalize(&encoded).unwrap();
            if let Some(again) = again {
                assert_eq!(again.decoded, decoded, "{p}: {encoded}");
                assert_eq!(again.encoded, encoded, "{p}");
            }
        }
    }
}
