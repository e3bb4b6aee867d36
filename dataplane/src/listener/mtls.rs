//! The mTLS guard: whether a request may reach a host whose certificate asks for client
//! certificates (ApisixTls `client`), checked before routing by the HTTPS listener
//! ([`super::tls`]) and the plain-HTTP one ([`super::server`]), HTTP/1.1 and HTTP/2 alike.
//!
//! It checks the host the router routes on ([`crate::http::host::effective_host`]: an
//! absolute-form target's authority over `Host`, `:authority` over `host`, canonical form)
//! and, for `skip_mtls_uri_regex`, the path routes match ([`crate::http::path::normalize`]).
//! The certificate guarding host H is the most specific one covering it, a wildcard
//! covering any depth of subdomain as route wildcards do
//! ([`crate::config::certs::TlsTable::covering`]). In order ([`verdict`]):
//!
//! 1. Over TLS, when the connection's own certificate asks for an optional client
//!    certificate (it has `skip_mtls_uri_regex`) and none was sent: a path that may not
//!    skip gets 400 `client certificate verification is not passed` (APISIX's answer).
//! 2. A host that cannot be decided (two `Host` headers, userinfo, an empty host, …): 400,
//!    the answer the request path gives it.
//! 3. No host (HTTP/1.0), no certificate covering H, or one that asks for no client
//!    certificate: served.
//! 4. Over TLS, a connection made with another certificate than H's (the SNI of another
//!    host, the default certificate): 421 Misdirected Request, skip path or not; the client
//!    should connect with H as SNI, where its certificate is asked for.
//! 5. Over plain HTTP: 403 `this host requires a client certificate; use HTTPS`, unless H's
//!    certificate is optional and the path may skip. NB: APISIX serves these hosts over
//!    plain HTTP (its check runs for https only), which turns every mTLS host into a plain
//!    one for anybody who can reach the HTTP port; Sluice refuses. An `http-to-https`
//!    redirect on such a host is not reached either (the answer comes before routing).
//!
//! The skip rule ([`skip_allows`]): the normalised path (dot segments removed, `%XX`
//! decoded, runs of `/` merged) matches one of the regexes, and is not read differently by
//! upstreams that split paths their own way: no `\` and no segment that is `.` or `..`
//! before a `;` (`/public/..;/private`, which Tomcat reads as `/private`). A path the
//! normaliser refuses never skips.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use regex::RegexSet;

use crate::config::certs::{ClientAuth, SniEntry, TlsTable};
use crate::http::host::effective_host;
use crate::http::path;
use crate::upstream::body::ProxyBody;

/// Body of the 400 for a request without a client certificate on a path that needs one.
pub const NO_CLIENT_CERT_BODY: &str =
    "{\"error_msg\":\"client certificate verification is not passed\"}\n";
/// Body of the 421 for a request whose host needs a different handshake.
pub const MISDIRECTED_BODY: &str = "{\"error_msg\":\"421 Misdirected Request: this host needs its own TLS connection (SNI must match Host)\"}\n";
/// Body of the 403 for a plain-HTTP request to a host that requires client certificates.
pub const PLAIN_HTTP_BODY: &str =
    "{\"error_msg\":\"403 Forbidden: this host requires a client certificate; use HTTPS\"}\n";

/// The connection a request came on.
#[derive(Debug, Clone, Copy)]
pub enum Conn<'a> {
    /// Plain HTTP (HTTP/1.1 or h2c).
    Plain,
    /// TLS, with the certificate its handshake chose.
    Tls {
        /// That certificate's id.
        cert_id: &'a str,
        /// Its client-certificate policy.
        client_auth: &'a ClientAuth,
        /// Whether the client sent a (verified) certificate.
        client_cert: bool,
    },
}

/// What the guard decides for a request (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// On to routing.
    Serve,
    /// 400: no client certificate on a path that needs one.
    NoClientCert,
    /// 400: the request's host cannot be decided (the reason).
    BadHost(&'static str),
    /// 421: the host needs its own TLS connection.
    Misdirected,
    /// 403: the host requires client certificates and the request came over plain HTTP.
    PlainHttp,
}

/// The guard's decision for a request with `host` (its [`effective_host`], as a string)
/// and path `raw_path` (as sent) on `conn`; `covering` finds the certificate id and policy
/// covering a host ([`TlsTable::covering`]). Pure: the fuzz targets call it.
pub fn verdict<'t>(
    host: Result<Option<&str>, &'static str>,
    raw_path: &str,
    conn: Conn<'_>,
    covering: impl FnOnce(&str) -> Option<(&'t str, &'t ClientAuth)>,
) -> Verdict {
    if let Conn::Tls {
        client_auth: ClientAuth::Optional(skip),
        client_cert: false,
        ..
    } = conn
        && !skip_allows(skip, raw_path)
    {
        return Verdict::NoClientCert;
    }
    let host = match host {
        Ok(Some(h)) => h,
        Ok(None) => return Verdict::Serve,
        Err(reason) => return Verdict::BadHost(reason),
    };
    let Some((id, auth)) = covering(host) else {
        return Verdict::Serve;
    };
    match (conn, auth) {
        (_, ClientAuth::None) => Verdict::Serve,
        (Conn::Tls { cert_id, .. }, _) if cert_id != id => Verdict::Misdirected,
        // The connection's own certificate: the handshake required one, or step 1 checked.
        (Conn::Tls { .. }, _) => Verdict::Serve,
        (Conn::Plain, ClientAuth::Optional(skip)) if skip_allows(skip, raw_path) => Verdict::Serve,
        (Conn::Plain, _) => Verdict::PlainHttp,
    }
}

/// The answer refusing `req` on `conn` with the certificates of its listener (`tls`:
/// `None` when it has none), or `None` when it goes on to routing.
pub fn refuse<B>(
    req: &Request<B>,
    conn: Conn<'_>,
    tls: Option<&TlsTable>,
) -> Option<Response<ProxyBody>> {
    let guarded = tls.filter(|t| t.any_client_auth);
    if guarded.is_none() && matches!(conn, Conn::Plain) {
        // The common case: nothing to check, the host is not even looked at.
        return None;
    }
    let host = match guarded {
        Some(_) => effective_host(req),
        // NB: no certificate of this listener asks for client certificates: only step 1.
        None => Ok(None),
    };
    let covering = |h: &str| {
        guarded
            .and_then(|t| t.covering(h))
            .map(|e: &std::sync::Arc<SniEntry>| (e.id.as_str(), &e.client_auth))
    };
    let v = verdict(
        host.as_ref()
            .map(|h| h.as_ref().map(|h| h.as_str()))
            .map_err(|e| *e),
        req.uri().path(),
        conn,
        covering,
    );
    response(v)
}

/// The response for a refusing verdict.
pub fn response(v: Verdict) -> Option<Response<ProxyBody>> {
    let (status, body) = match v {
        Verdict::Serve => return None,
        Verdict::NoClientCert => (StatusCode::BAD_REQUEST, NO_CLIENT_CERT_BODY),
        Verdict::BadHost(reason) => {
            return Some(crate::upstream::error::ProxyError::BadRequest(reason).into_response());
        }
        Verdict::Misdirected => (StatusCode::MISDIRECTED_REQUEST, MISDIRECTED_BODY),
        Verdict::PlainHttp => (StatusCode::FORBIDDEN, PLAIN_HTTP_BODY),
    };
    let mut resp = Response::new(ProxyBody::full(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Some(resp)
}

/// Whether a request with path `raw_path` (as sent) may skip the client certificate under
/// `skip` (see the module docs).
pub fn skip_allows(skip: &RegexSet, raw_path: &str) -> bool {
    let normal = match path::normalize(raw_path) {
        Ok(n) => n,
        Err(_) => return false,
    };
    let p = normal.as_ref().map_or(raw_path, |n| n.decoded.as_str());
    !ambiguous(p) && skip.is_match(p)
}

/// Whether an upstream could read `path` (normalised) as another path than the router does.
fn ambiguous(path: &str) -> bool {
    path.contains('\\')
        || path.split('/').any(|seg| {
            let name = seg.split(';').next().unwrap_or(seg);
            seg.contains(';') && (name == "." || name == "..")
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn set(re: &[&str]) -> RegexSet {
        RegexSet::new(re).unwrap()
    }

    /// Every spelling of a way out of `/public/` skips only where routing sees `/public/`.
    #[test]
    fn the_skip_rule_sees_the_path_routes_match() {
        let skip = set(&["^/public/"]);
        for p in [
            "/public/logo.png",
            "/public//logo.png",
            "/public/./logo.png",
            "/public/a/../logo.png",
            "/public/%6Cogo.png",
            "//public/logo.png",
            "/x/../public/logo.png",
            "/public%2flogo.png",
            "/public;v=1/../public/logo.png",
        ] {
            assert!(skip_allows(&skip, p), "{p} should skip");
        }
        for p in [
            "/private",
            "/public/../private/x",
            "/public/%2e%2e/private/x",
            "/public/%2E%2E/private/x",
            "/public/.%2e/private/x",
            "/public/..%2Fprivate/x",
            "/public/..%2fprivate/x",
            "/public/%2e%2e%2fprivate/x",
            "/public//../../private/x",
            "/public/..;/private/x",
            "/public/.;/x",
            "/public/..%3B/private/x",
            "/public/..\\private\\x",
            "/public/..%5Cprivate",
            "/public/%zz",
            "/public/%00",
            "/public/../../private",
            "/publicity/x",
        ] {
            assert!(!skip_allows(&skip, p), "{p} must not skip");
        }
    }

    #[test]
    fn verdicts() {
        let required = ClientAuth::Required;
        let optional = ClientAuth::Optional(set(&["^/public/"]));
        let none = ClientAuth::None;
        let certs = |h: &str| match h {
            "mtls.test" => Some(("mtls", &required)),
            "mixed.test" => Some(("mixed", &optional)),
            "public.test" => Some(("public", &none)),
            _ => None,
        };
        let public = Conn::Tls {
            cert_id: "public",
            client_auth: &none,
            client_cert: false,
        };
        let mixed_anon = Conn::Tls {
            cert_id: "mixed",
            client_auth: &optional,
            client_cert: false,
        };
        let mtls = Conn::Tls {
            cert_id: "mtls",
            client_auth: &required,
            client_cert: true,
        };
        use Verdict::*;
        for (host, path, conn, want) in [
            (Ok(Some("mtls.test")), "/", public, Misdirected),
            (Ok(Some("mtls.test")), "/", mtls, Serve),
            (Ok(Some("mtls.test")), "/", Conn::Plain, PlainHttp),
            (Ok(Some("mixed.test")), "/public/x", Conn::Plain, Serve),
            (
                Ok(Some("mixed.test")),
                "/public/../x",
                Conn::Plain,
                PlainHttp,
            ),
            (Ok(Some("mixed.test")), "/public/x", public, Misdirected),
            (Ok(Some("mixed.test")), "/public/x", mixed_anon, Serve),
            (
                Ok(Some("mixed.test")),
                "/public/%2e%2e/x",
                mixed_anon,
                NoClientCert,
            ),
            (Ok(Some("public.test")), "/x", mixed_anon, NoClientCert),
            (Ok(Some("public.test")), "/x", Conn::Plain, Serve),
            (Ok(Some("other.test")), "/x", public, Serve),
            (Ok(None), "/x", Conn::Plain, Serve),
            (Err("bad"), "/x", public, BadHost("bad")),
        ] {
            assert_eq!(
                verdict(host, path, conn, certs),
                want,
                "{host:?} {path} {conn:?}"
            );
        }
    }
}
