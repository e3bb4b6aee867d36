//! ingress-nginx's annotations (`nginx.ingress.kubernetes.io/*`), honoured on the Ingresses
//! of the classes Sluice serves in ingress-nginx's place (`Options::nginx_classes`), with
//! ingress-nginx's documented behaviour. [`ANNOTATIONS`] is the one table of what Sluice does
//! with each of them; translation, the status message and `kubectl sluice migrate` read it.
//!
//! - **Served** annotations become routes, expressions and plugins of the same engine as
//!   every other route (no slow path of their own): `rewrite-target` and `use-regex`
//!   (case-insensitive regular-expression paths anchored at the start, the rewrite replacing
//!   the whole path with `$n` captures, as nginx's `rewrite ... break`), `app-root`,
//!   `ssl-redirect` / `force-ssl-redirect` (308 from plain HTTP, on a route of its own that
//!   matches `scheme == http`), `permanent-redirect` / `temporal-redirect` (+ `-code`),
//!   `proxy-body-size` (413), `proxy-{connect,send,read}-timeout`, `enable-cors` and
//!   `cors-*`, `whitelist-source-range` / `denylist-source-range` (403), `upstream-vhost`,
//!   `x-forwarded-prefix`, `limit-rps` / `limit-rpm` / `limit-burst-multiplier` (503).
//! - **Refused** annotations reject the Ingress (`Accepted=False` naming the annotation, a
//!   Warning event): every `*-snippet` (Sluice runs no text configuration: the
//!   IngressNightmare class of hole), and the access-control annotations not served yet,
//!   which would otherwise serve the Ingress with less protection than written.
//! - **Ignored** annotations are listed in the `Accepted` message (a Warning): the Ingress is
//!   served without them; none of them widens access.
//! - An `nginx.ingress.kubernetes.io/` annotation not in the table is ignored the same way,
//!   named as unknown.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::Ingress;
use serde_json::{Value, json};
use sluice_proto::v1;

use crate::problems::Problems;

/// Prefix of ingress-nginx's annotations.
pub const PREFIX: &str = "nginx.ingress.kubernetes.io/";

/// What Sluice does with one ingress-nginx annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Served with ingress-nginx's behaviour.
    Same,
    /// Served, with this difference from ingress-nginx.
    Differently(&'static str),
    /// The Ingress is not served while it carries the annotation, for this reason.
    Refused(&'static str),
    /// The Ingress is served without it (a Warning says so), for this reason.
    Ignored(&'static str),
}

impl Support {
    /// `served`, `served differently`, `refused` or `ignored`.
    pub fn verdict(&self) -> &'static str {
        match self {
            Support::Same => "served",
            Support::Differently(_) => "served differently",
            Support::Refused(_) => "refused",
            Support::Ignored(_) => "ignored",
        }
    }

    /// The difference or the reason; empty for [`Support::Same`].
    pub fn why(&self) -> &'static str {
        match self {
            Support::Same => "",
            Support::Differently(s) | Support::Refused(s) | Support::Ignored(s) => s,
        }
    }
}

const SNIPPET: Support = Support::Refused(
    "a snippet is raw nginx configuration, and Sluice runs no text configuration (the IngressNightmare class of hole). Move what it does to an annotation, a plugin of an ApisixPluginConfig, or a Gateway API filter",
);
const NOT_YET_ACCESS: Support = Support::Refused(
    "access control not served yet: serving the Ingress without it would expose more than written",
);
const NOT_YET_ROUTING: Support = Support::Refused(
    "not served yet: serving the Ingress without it would send traffic where it was not meant to go",
);

/// Every ingress-nginx annotation (without [`PREFIX`]) and what Sluice does with it,
/// sorted by name.
pub const ANNOTATIONS: &[(&str, Support)] = &[
    ("affinity", NOT_YET_ROUTING),
    ("affinity-canary-behavior", NOT_YET_ROUTING),
    ("affinity-mode", NOT_YET_ROUTING),
    ("app-root", Support::Same),
    ("auth-always-set-cookie", NOT_YET_ACCESS),
    ("auth-cache-duration", NOT_YET_ACCESS),
    ("auth-cache-key", NOT_YET_ACCESS),
    ("auth-keepalive", NOT_YET_ACCESS),
    ("auth-keepalive-requests", NOT_YET_ACCESS),
    ("auth-keepalive-share-vars", NOT_YET_ACCESS),
    ("auth-keepalive-timeout", NOT_YET_ACCESS),
    (
        "auth-method",
        Support::Differently("GET or POST only (others are refused)"),
    ),
    ("auth-proxy-set-headers", NOT_YET_ACCESS),
    ("auth-realm", Support::Same),
    ("auth-request-redirect", NOT_YET_ACCESS),
    ("auth-response-headers", Support::Same),
    (
        "auth-secret",
        Support::Differently(
            "the Secret must be in the Ingress's namespace; a missing Secret refuses the Ingress, where ingress-nginx answers 503",
        ),
    ),
    ("auth-secret-type", Support::Same),
    (
        "auth-signin",
        Support::Refused(
            "the redirect to a sign-in page on 401 is not served yet: without it a browser would get 401 where it should be sent to log in",
        ),
    ),
    ("auth-signin-redirect-param", NOT_YET_ACCESS),
    ("auth-snippet", SNIPPET),
    ("auth-tls-error-page", NOT_YET_ACCESS),
    ("auth-tls-match-cn", NOT_YET_ACCESS),
    ("auth-tls-pass-certificate-to-upstream", NOT_YET_ACCESS),
    ("auth-tls-secret", NOT_YET_ACCESS),
    ("auth-tls-verify-client", NOT_YET_ACCESS),
    ("auth-tls-verify-depth", NOT_YET_ACCESS),
    (
        "auth-type",
        Support::Differently(
            "basic only (digest needs a third-party nginx module and is refused); every 401 carries the challenge",
        ),
    ),
    (
        "auth-url",
        Support::Differently(
            "the auth service gets the client's Authorization, Cookie, Proxy-Authorization, User-Agent, Accept, Accept-Language and X-Requested-With headers with X-Forwarded-Proto/-Method/-Host/-Uri/-For, not every client header and X-Original-URL; any denying answer (not only 401 and 403) is passed to the client; a URL with nginx variables is refused",
        ),
    ),
    (
        "backend-protocol",
        Support::Differently(
            "HTTPS and GRPCS always verify the backend's certificate (against proxy-ssl-secret's ca.crt, else the system roots), where ingress-nginx verifies only with proxy-ssl-verify: on; H2C and GRPC speak HTTP/2 without TLS; AUTO_HTTP and FCGI are refused",
        ),
    ),
    ("canary", Support::Same),
    ("canary-by-cookie", Support::Same),
    ("canary-by-header", Support::Same),
    ("canary-by-header-pattern", Support::Same),
    ("canary-by-header-value", Support::Same),
    ("canary-weight", Support::Same),
    ("canary-weight-total", Support::Same),
    (
        "client-body-buffer-size",
        Support::Ignored("Sluice streams request bodies; there is no buffer to size"),
    ),
    ("configuration-snippet", SNIPPET),
    (
        "connection-proxy-header",
        Support::Ignored(
            "Sluice sets Connection itself (keep-alive to upstreams, Upgrade for WebSocket)",
        ),
    ),
    (
        "cors-allow-credentials",
        Support::Differently(
            "with cors-allow-origin `*` no Access-Control-Allow-Credentials is sent (the Fetch standard forbids the pair; browsers ignore it)",
        ),
    ),
    ("cors-allow-headers", Support::Same),
    ("cors-allow-methods", Support::Same),
    ("cors-allow-origin", Support::Same),
    ("cors-expose-headers", Support::Same),
    ("cors-max-age", Support::Same),
    ("custom-headers", NOT_YET_ROUTING),
    ("custom-http-errors", NOT_YET_ROUTING),
    ("default-backend", NOT_YET_ROUTING),
    ("denylist-source-range", Support::Same),
    (
        "disable-proxy-intercept-errors",
        Support::Ignored(
            "Sluice does not intercept upstream errors unless custom-http-errors asks",
        ),
    ),
    (
        "enable-access-log",
        Support::Ignored(
            "access logs are configured per dataplane (logger plugins), not per Ingress",
        ),
    ),
    (
        "enable-cors",
        Support::Differently(
            "a preflight (any OPTIONS request from an allowed origin) is answered 200 with an empty body, where ingress-nginx answers 204",
        ),
    ),
    ("enable-global-auth", NOT_YET_ACCESS),
    ("enable-modsecurity", NOT_YET_ACCESS),
    (
        "enable-opentelemetry",
        Support::Ignored(
            "tracing is the opentelemetry plugin (ApisixGlobalRule or ApisixPluginConfig)",
        ),
    ),
    ("enable-owasp-core-rules", NOT_YET_ACCESS),
    (
        "enable-rewrite-log",
        Support::Ignored("nginx debug logging; no equivalent"),
    ),
    (
        "force-ssl-redirect",
        Support::Differently(
            "the Location keeps a trailing `/` (ingress-nginx strips it unless preserve-trailing-slash)",
        ),
    ),
    ("from-to-www-redirect", NOT_YET_ROUTING),
    ("global-rate-limit", NOT_YET_ACCESS),
    ("global-rate-limit-key", NOT_YET_ACCESS),
    ("global-rate-limit-window", NOT_YET_ACCESS),
    (
        "http2-push-preload",
        Support::Ignored("HTTP/2 server push is obsolete (browsers removed it)"),
    ),
    ("limit-burst-multiplier", Support::Same),
    ("limit-connections", NOT_YET_ACCESS),
    (
        "limit-rate",
        Support::Ignored("response bandwidth limits are not served"),
    ),
    (
        "limit-rate-after",
        Support::Ignored("response bandwidth limits are not served"),
    ),
    (
        "limit-rpm",
        Support::Differently(
            "together with limit-rps on one Ingress it is refused (ingress-nginx applies both zones)",
        ),
    ),
    ("limit-rps", Support::Same),
    ("limit-whitelist", NOT_YET_ACCESS),
    ("load-balance", NOT_YET_ROUTING),
    ("mirror-host", NOT_YET_ROUTING),
    ("mirror-request-body", NOT_YET_ROUTING),
    ("mirror-target", NOT_YET_ROUTING),
    ("modsecurity-snippet", SNIPPET),
    ("modsecurity-transaction-id", NOT_YET_ACCESS),
    (
        "opentelemetry-operation-name",
        Support::Ignored("tracing is the opentelemetry plugin"),
    ),
    (
        "opentelemetry-trust-incoming-span",
        Support::Ignored("tracing is the opentelemetry plugin"),
    ),
    ("permanent-redirect", Support::Same),
    ("permanent-redirect-code", Support::Same),
    (
        "preserve-trailing-slash",
        Support::Ignored("Sluice's HTTPS redirect always keeps the trailing `/`"),
    ),
    ("proxy-body-size", Support::Same),
    (
        "proxy-buffer-size",
        Support::Ignored("Sluice streams responses; there is no buffer to size"),
    ),
    (
        "proxy-buffering",
        Support::Ignored("Sluice streams responses without buffering them"),
    ),
    (
        "proxy-buffers-number",
        Support::Ignored("Sluice streams responses; there is no buffer to size"),
    ),
    (
        "proxy-busy-buffers-size",
        Support::Ignored("Sluice streams responses; there is no buffer to size"),
    ),
    ("proxy-connect-timeout", Support::Same),
    ("proxy-cookie-domain", NOT_YET_ROUTING),
    ("proxy-cookie-path", NOT_YET_ROUTING),
    (
        "proxy-http-version",
        Support::Ignored("Sluice speaks HTTP/1.1 to HTTP upstreams"),
    ),
    (
        "proxy-max-temp-file-size",
        Support::Ignored("Sluice streams responses; no temporary files"),
    ),
    ("proxy-next-upstream", NOT_YET_ROUTING),
    ("proxy-next-upstream-timeout", NOT_YET_ROUTING),
    ("proxy-next-upstream-tries", NOT_YET_ROUTING),
    ("proxy-read-timeout", Support::Same),
    ("proxy-redirect-from", NOT_YET_ROUTING),
    ("proxy-redirect-to", NOT_YET_ROUTING),
    (
        "proxy-request-buffering",
        Support::Ignored("Sluice streams request bodies without buffering them"),
    ),
    ("proxy-send-timeout", Support::Same),
    (
        "proxy-ssl-ciphers",
        Support::Ignored("TLS to backends uses rustls' safe defaults"),
    ),
    ("proxy-ssl-name", Support::Same),
    (
        "proxy-ssl-protocols",
        Support::Ignored("TLS to backends uses rustls' safe defaults (TLS 1.2 and 1.3)"),
    ),
    (
        "proxy-ssl-secret",
        Support::Differently(
            "the Secret must be in the Ingress's namespace (another namespace is refused rather than read across tenants)",
        ),
    ),
    (
        "proxy-ssl-server-name",
        Support::Differently("SNI is always sent: proxy-ssl-name, else the endpoint's host"),
    ),
    (
        "proxy-ssl-verify",
        Support::Differently(
            "the certificate is always verified: `off` is refused rather than served less safely than Sluice serves every backend",
        ),
    ),
    (
        "proxy-ssl-verify-depth",
        Support::Ignored("rustls verifies the whole chain, whatever its depth"),
    ),
    ("rewrite-target", Support::Same),
    ("satisfy", NOT_YET_ACCESS),
    ("server-alias", NOT_YET_ROUTING),
    ("server-snippet", SNIPPET),
    ("service-upstream", NOT_YET_ROUTING),
    ("session-cookie-change-on-failure", NOT_YET_ROUTING),
    ("session-cookie-conditional-samesite-none", NOT_YET_ROUTING),
    ("session-cookie-domain", NOT_YET_ROUTING),
    ("session-cookie-expires", NOT_YET_ROUTING),
    ("session-cookie-max-age", NOT_YET_ROUTING),
    ("session-cookie-name", NOT_YET_ROUTING),
    ("session-cookie-path", NOT_YET_ROUTING),
    ("session-cookie-samesite", NOT_YET_ROUTING),
    ("session-cookie-secure", NOT_YET_ROUTING),
    (
        "ssl-ciphers",
        Support::Ignored("TLS ciphers are the dataplane's (rustls' safe defaults)"),
    ),
    ("ssl-passthrough", NOT_YET_ROUTING),
    (
        "ssl-prefer-server-ciphers",
        Support::Ignored("TLS ciphers are the dataplane's (rustls' safe defaults)"),
    ),
    (
        "ssl-redirect",
        Support::Differently(
            "the Location keeps a trailing `/` (ingress-nginx strips it unless preserve-trailing-slash)",
        ),
    ),
    ("stream-snippet", SNIPPET),
    ("temporal-redirect", Support::Same),
    ("temporal-redirect-code", Support::Same),
    ("upstream-hash-by", NOT_YET_ROUTING),
    ("upstream-hash-by-subset", NOT_YET_ROUTING),
    ("upstream-hash-by-subset-size", NOT_YET_ROUTING),
    ("upstream-vhost", Support::Same),
    (
        "use-regex",
        Support::Differently(
            "the regular expressions are Rust's `regex` (RE2-like: no look-around or back-references; such a path is refused); they apply to the paths of this Ingress, where ingress-nginx applies them to every path of the host",
        ),
    ),
    ("whitelist-source-range", Support::Same),
    ("x-forwarded-prefix", Support::Same),
];

/// What Sluice does with annotation `name` (without [`PREFIX`]); `None` for one ingress-nginx
/// does not document.
pub fn support(name: &str) -> Option<Support> {
    ANNOTATIONS
        .binary_search_by(|(n, _)| (*n).cmp(name))
        .ok()
        .map(|i| ANNOTATIONS[i].1)
}

/// The keys of ingress-nginx's ConfigMap Sluice honours (`--ingress-nginx-config KEY=VALUE`,
/// the chart's `ingressClass.nginxConfig`), with ingress-nginx's defaults: the defaults
/// of the annotations of the same names, and settings of every route of the class.
pub const CONFIG_KEYS: &[(&str, &str)] = &[
    ("denylist-source-range", ""),
    ("enable-real-ip", "false"),
    ("force-ssl-redirect", "false"),
    ("forwarded-for-header", "X-Forwarded-For"),
    ("hsts", "true"),
    ("hsts-include-subdomains", "true"),
    ("hsts-max-age", "31536000"),
    ("hsts-preload", "false"),
    ("http-redirect-code", "308"),
    ("limit-req-status-code", "503"),
    ("proxy-body-size", "1m"),
    ("proxy-connect-timeout", "5"),
    ("proxy-read-timeout", "60"),
    ("proxy-real-ip-cidr", "0.0.0.0/0"),
    ("proxy-send-timeout", "60"),
    ("ssl-redirect", "true"),
    ("use-forwarded-headers", "false"),
    ("whitelist-source-range", ""),
];

/// Checks a ConfigMap setting: a key of [`CONFIG_KEYS`] with a value ingress-nginx would
/// take. The error names the key and why.
pub fn check_config(key: &str, value: &str) -> Result<(), String> {
    if !CONFIG_KEYS.iter().any(|(k, _)| *k == key) {
        let known: Vec<&str> = CONFIG_KEYS.iter().map(|(k, _)| *k).collect();
        return Err(format!(
            "{key}: not a setting Sluice takes from ingress-nginx's ConfigMap (it takes {})",
            known.join(", ")
        ));
    }
    let v = value.trim();
    let why = match key {
        "enable-real-ip"
        | "force-ssl-redirect"
        | "hsts"
        | "hsts-include-subdomains"
        | "hsts-preload"
        | "ssl-redirect"
        | "use-forwarded-headers" => boolean(v).is_none().then_some("must be true or false"),
        "hsts-max-age" | "proxy-connect-timeout" | "proxy-read-timeout" | "proxy-send-timeout" => {
            v.parse::<u64>().is_err().then_some("must be whole seconds")
        }
        "http-redirect-code" => {
            (!matches!(v, "301" | "302" | "307" | "308")).then_some("must be 301, 302, 307 or 308")
        }
        "limit-req-status-code" => (!v.parse::<u16>().is_ok_and(|c| (400..=599).contains(&c)))
            .then_some("must be a status from 400 to 599"),
        "proxy-body-size" => size(v)
            .is_none()
            .then_some("must be a size such as 8m, 512k or 1024"),
        "forwarded-for-header" => http::HeaderName::from_bytes(v.as_bytes())
            .is_err()
            .then_some("must be a header name"),
        _ => None,
    };
    if let Some(why) = why {
        return Err(format!("{key}: {value:?} {why}"));
    }
    Ok(())
}

/// Parses one `--ingress-nginx-config KEY=VALUE` and checks it ([`check_config`]).
pub fn parse_config(raw: &str) -> Result<(String, String), String> {
    let (k, v) = raw
        .split_once('=')
        .ok_or_else(|| format!("{raw:?}: expected KEY=VALUE"))?;
    let (k, v) = (k.trim(), v.trim());
    check_config(k, v)?;
    Ok((k.to_owned(), v.to_owned()))
}

/// The value of ConfigMap setting `key`: `config`'s, else ingress-nginx's default.
fn config<'c>(config: &'c BTreeMap<String, String>, key: &str) -> &'c str {
    config.get(key).map(String::as_str).unwrap_or_else(|| {
        CONFIG_KEYS
            .iter()
            .find(|(k, _)| *k == key)
            .map_or("", |(_, v)| *v)
    })
}

/// What the annotations of one Ingress ask of each of its routes.
#[derive(Debug, Default, Clone)]
pub(crate) struct Nginx {
    /// Paths are case-insensitive regular expressions anchored at the start
    /// (`use-regex`, or `rewrite-target`).
    pub regex: bool,
    /// `rewrite-target`: the whole path becomes this, `$n` being the path's captures.
    pub rewrite_target: Option<String>,
    /// `app-root`: `/` is redirected (302) here.
    pub app_root: Option<String>,
    /// `ssl-redirect` (default true): plain-HTTP requests for a host of `tls_hosts` are
    /// redirected to HTTPS (308).
    pub ssl_redirect: bool,
    /// `force-ssl-redirect`: plain-HTTP requests for every host are redirected (308).
    pub force_ssl_redirect: bool,
    /// The hosts of the Ingress's `spec.tls`.
    pub tls_hosts: Vec<String>,
    /// `proxy-{connect,send,read}-timeout`, in ms.
    pub timeouts: [Option<u64>; 3],
    /// Plugins of every route of the Ingress.
    pub plugins: Vec<v1::Plugin>,
    /// `proxy-rewrite` settings beside the path (`upstream-vhost`, `x-forwarded-prefix`).
    pub rewrite_host: Option<String>,
    /// `x-forwarded-prefix` value.
    pub forwarded_prefix: Option<String>,
    /// `backend-protocol`, upper-cased (`HTTP` when unset).
    pub backend_protocol: String,
    /// `proxy-ssl-secret` (namespace, name).
    pub proxy_ssl_secret: Option<(String, String)>,
    /// `proxy-ssl-name`.
    pub proxy_ssl_name: Option<String>,
    /// `auth-type: basic`.
    pub basic_auth: Option<BasicAuth>,
    /// The ConfigMap's `http-redirect-code` (308).
    pub redirect_code: u16,
    /// The `Strict-Transport-Security` value of the ConfigMap's `hsts*`, when on.
    pub hsts: Option<String>,
}

/// `auth-type: basic` with `auth-secret`, `auth-secret-type` and `auth-realm`.
#[derive(Debug, Clone)]
pub(crate) struct BasicAuth {
    /// `auth-secret`: `name` or `namespace/name`.
    secret: String,
    /// `auth-secret-type: auth-map` (each key a user, its value the hash); else
    /// `auth-file` (key `auth`, htpasswd lines).
    map: bool,
    /// `auth-realm`.
    realm: String,
}

/// How an Ingress's upstreams differ from the Services' plain ones (`backend-protocol`,
/// `proxy-ssl-*`): a variant of each upstream, under an id of its own.
#[derive(Debug, Clone)]
pub(crate) struct UpstreamVariant {
    scheme: v1::Scheme,
    tls: Option<v1::UpstreamTls>,
    /// Appended to the upstream id: tells the variants of one Service port apart.
    suffix: String,
}

impl UpstreamVariant {
    /// Makes `up` this variant.
    pub(crate) fn apply(&self, up: &mut v1::Upstream) {
        up.scheme = self.scheme.into();
        up.tls = self.tls.clone();
        up.id = format!("{}{}", up.id, self.suffix);
    }
}

fn field(name: &str) -> String {
    format!("metadata.annotations[\"{PREFIX}{name}\"]")
}

fn plugin(
    name: &str,
    config: &Value,
    problems: &mut Problems,
    annotation: &str,
) -> Option<v1::Plugin> {
    match sluice_plugin_config::validate(name, config) {
        Ok(()) => Some(v1::Plugin {
            name: name.to_owned(),
            config_json: crate::json::canonical(config),
        }),
        Err(e) => {
            problems.error(field(annotation), e.to_string());
            None
        }
    }
}

/// `true`/`false` as ingress-nginx's parser reads them (Go's `strconv.ParseBool`).
fn boolean(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// An nginx size (`8m`, `512k`, `1g`, bytes without a unit) in bytes.
pub(crate) fn size(v: &str) -> Option<u64> {
    let v = v.trim();
    let (num, mul) = match v.as_bytes().last()? {
        b'k' | b'K' => (&v[..v.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&v[..v.len() - 1], 1 << 20),
        b'g' | b'G' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mul)
}

/// CIDRs or addresses, comma-separated (ingress-nginx's `whitelist-source-range` format).
fn cidrs(v: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        // NB: each is checked by ip-restriction's own validation (the plugin below).
        out.push(part.to_owned());
    }
    if out.is_empty() {
        return Err("no address or CIDR".into());
    }
    Ok(out)
}

impl Nginx {
    /// The `basic-auth` plugin of `auth-type: basic`: the Secret's htpasswd users (from
    /// `ns`), the realm, and the `Authorization` header not sent upstream (ingress-nginx
    /// clears it). A Secret that is missing, in another namespace, or holds no user
    /// refuses the Ingress (ingress-nginx would answer 503 for it: nobody gets in either
    /// way).
    pub(crate) fn basic_auth_plugin(
        &self,
        ns: &str,
        idx: &crate::Index<'_>,
        problems: &mut Problems,
    ) -> Option<v1::Plugin> {
        let b = self.basic_auth.as_ref()?;
        let (sns, name) = b.secret.split_once('/').unwrap_or((ns, b.secret.as_str()));
        if sns != ns {
            problems.error(
                field("auth-secret"),
                format!("{sns}/{name}: the Secret must be in the Ingress's namespace {ns}"),
            );
            return None;
        }
        let Some(secret) = idx.secrets.get(&(sns, name)) else {
            problems.error(
                field("auth-secret"),
                format!("Secret {sns}/{name} not found"),
            );
            return None;
        };
        let data = secret.data.clone().unwrap_or_default();
        let text = |v: &k8s_openapi::ByteString| String::from_utf8_lossy(&v.0).into_owned();
        let mut users = Vec::new();
        if b.map {
            for (user, hash) in &data {
                users.push(json!({"username": user, "hash": text(hash).trim()}));
            }
        } else {
            let Some(file) = data.get("auth") else {
                problems.error(
                    field("auth-secret"),
                    format!("Secret {sns}/{name} has no key \"auth\" (an htpasswd file)"),
                );
                return None;
            };
            for line in text(file).lines().map(str::trim) {
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                match line.split_once(':') {
                    Some((user, hash)) => users.push(json!({"username": user, "hash": hash})),
                    None => {
                        problems.error(
                            field("auth-secret"),
                            format!("Secret {sns}/{name}: a line of \"auth\" is not user:hash"),
                        );
                        return None;
                    }
                }
            }
        }
        if users.is_empty() {
            problems.error(
                field("auth-secret"),
                format!("Secret {sns}/{name} holds no user"),
            );
            return None;
        }
        plugin(
            "basic-auth",
            &json!({"htpasswd": users, "realm": b.realm, "hide_credentials": true}),
            problems,
            "auth-secret",
        )
    }

    /// The upstream variant `backend-protocol` and `proxy-ssl-*` ask for; `None` for plain
    /// HTTP without them. The Secret must be in `ns`.
    pub(crate) fn upstream_variant(
        &self,
        ns: &str,
        idx: &crate::Index<'_>,
        problems: &mut Problems,
    ) -> Option<UpstreamVariant> {
        let scheme = match self.backend_protocol.as_str() {
            "HTTP" => v1::Scheme::Http,
            "HTTPS" => v1::Scheme::Https,
            "GRPC" | "H2C" => v1::Scheme::Grpc,
            "GRPCS" => v1::Scheme::Grpcs,
            other => {
                problems.error(
                    field("backend-protocol"),
                    format!("{other:?} is not served (HTTP, HTTPS, GRPC, GRPCS or H2C)"),
                );
                return None;
            }
        };
        let tls_scheme = matches!(scheme, v1::Scheme::Https | v1::Scheme::Grpcs);
        let mut tls = None;
        if let Some((sns, name)) = &self.proxy_ssl_secret {
            if sns != ns {
                problems.error(
                    field("proxy-ssl-secret"),
                    format!("{sns}/{name}: the Secret must be in the Ingress's namespace {ns}"),
                );
                return None;
            }
            match crate::upstream::settings::tls_from_secret(idx, sns, name) {
                Ok(t) => tls = Some(t),
                Err(e) => {
                    problems.error(field("proxy-ssl-secret"), e);
                    return None;
                }
            }
        }
        if let Some(n) = &self.proxy_ssl_name {
            tls.get_or_insert_with(v1::UpstreamTls::default).sni = n.clone();
        }
        if tls.is_some() && !tls_scheme {
            problems.notes.push(format!(
                "{PREFIX}proxy-ssl-* has no effect without backend-protocol HTTPS or GRPCS"
            ));
            tls = None;
        }
        if scheme == v1::Scheme::Http && tls.is_none() {
            return None;
        }
        let mut suffix = format!("#nginx-{}", self.backend_protocol.to_ascii_lowercase());
        if let Some((sns, name)) = &self.proxy_ssl_secret {
            suffix.push_str(&format!("-{sns}/{name}"));
        }
        if let Some(n) = &self.proxy_ssl_name {
            suffix.push_str(&format!("-{n}"));
        }
        Some(UpstreamVariant {
            scheme,
            tls,
            suffix,
        })
    }

    /// The status plain-HTTP requests for `host` (`None`: the default backend) are
    /// redirected to HTTPS with, if they are: ingress-nginx's `http-redirect-code`, 308.
    pub fn ssl_redirect_for(&self, host: Option<&str>) -> Option<u16> {
        let tls = host.is_some_and(|h| self.tls_hosts.iter().any(|t| t == h));
        (self.force_ssl_redirect || (self.ssl_redirect && tls)).then_some(self.redirect_code)
    }

    /// The plugins of a route for `host` beside the Ingress-wide ones: HSTS on HTTPS
    /// answers for a host with TLS (ingress-nginx's `hsts`, on by default).
    pub(crate) fn host_plugins(&self, host: Option<&str>) -> Vec<v1::Plugin> {
        let tls = host.is_some_and(|h| self.tls_hosts.iter().any(|t| t == h));
        match (&self.hsts, tls) {
            (Some(value), true) => vec![v1::Plugin {
                name: "response-rewrite".into(),
                config_json: crate::json::canonical(&json!({
                    "headers": {"set": {"Strict-Transport-Security": value}},
                    "vars": [["scheme", "==", "https"]],
                })),
            }],
            _ => Vec::new(),
        }
    }
}

/// The ingress-nginx annotations of `ing` (`tls_hosts` is left empty for the caller).
pub(crate) fn settings(
    ing: &Ingress,
    global: &BTreeMap<String, String>,
    problems: &mut Problems,
) -> Nginx {
    let annotations = annotations_of(ing);
    // NB: an annotation of a ConfigMap key's name overrides it; otherwise the ConfigMap's
    // value (or ingress-nginx's default) stands.
    let get = |n: &str| {
        annotations.get(n).copied().or_else(|| {
            CONFIG_KEYS
                .iter()
                .any(|(k, _)| *k == n)
                .then(|| config(global, n))
                .filter(|v| !v.is_empty())
        })
    };
    let mut out = Nginx::default();
    let mut ignored = Vec::new();
    let mut unknown = Vec::new();
    for &name in annotations.keys() {
        match support(name) {
            Some(Support::Refused(why)) => problems.error(field(name), why),
            Some(Support::Ignored(why)) => ignored.push(format!("{PREFIX}{name} ({why})")),
            Some(_) => {}
            None => unknown.push(format!("{PREFIX}{name}")),
        }
    }
    if !is_canary(ing) && annotations.keys().any(|n| n.starts_with("canary-")) {
        problems.notes.push(format!(
            "{PREFIX}canary-* without {PREFIX}canary: \"true\" does nothing (ingress-nginx calls it an invalid configuration)"
        ));
    }
    let flag = |n: &str, problems: &mut Problems| -> Option<bool> {
        let v = get(n)?;
        let b = boolean(v);
        if b.is_none() {
            problems.error(field(n), format!("{v:?} must be true or false"));
        }
        b
    };

    // Paths and rewrites.
    out.rewrite_target = get("rewrite-target").map(str::to_owned);
    out.regex = flag("use-regex", problems).unwrap_or(false) || out.rewrite_target.is_some();
    if let Some(root) = get("app-root") {
        if root.starts_with('/') && crate::validate::path(root).is_ok() && !root.contains("://") {
            out.app_root = Some(root.to_owned());
        } else {
            // NB: ingress-nginx ignores it with a warning too.
            problems.notes.push(format!(
                "{PREFIX}app-root {root:?} ignored: it must be a path starting with /"
            ));
        }
    }

    // Redirects.
    out.force_ssl_redirect = flag("force-ssl-redirect", problems).unwrap_or(false);
    out.ssl_redirect = flag("ssl-redirect", problems).unwrap_or(true);
    out.redirect_code = config(global, "http-redirect-code")
        .trim()
        .parse()
        .unwrap_or(308);
    let on = |k: &str| boolean(config(global, k)).unwrap_or(false);
    if on("hsts") {
        let mut v = format!("max-age={}", config(global, "hsts-max-age").trim());
        if on("hsts-include-subdomains") {
            v.push_str("; includeSubDomains");
        }
        if on("hsts-preload") {
            v.push_str("; preload");
        }
        out.hsts = Some(v);
    }
    if on("use-forwarded-headers") || on("enable-real-ip") {
        let header = config(global, "forwarded-for-header")
            .trim()
            .to_ascii_lowercase()
            .replace('-', "_");
        let trusted: Vec<&str> = config(global, "proxy-real-ip-cidr")
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        out.plugins.extend(plugin(
            "real-ip",
            &json!({"source": format!("http_{header}"), "trusted_addresses": trusted, "recursive": true}),
            problems,
            "use-forwarded-headers",
        ));
    }
    // NB: as ingress-nginx, a code out of range falls back to the default (permanent:
    // 300-308, else 301; temporal: 300-307, else 302), and temporal wins over permanent.
    let code = |n: &str, range: std::ops::RangeInclusive<u16>, default: u16| -> u16 {
        get(n)
            .and_then(|v| v.trim().parse::<u16>().ok())
            .filter(|c| range.contains(c))
            .unwrap_or(default)
    };
    let redirect = if let Some(to) = get("temporal-redirect").filter(|v| !v.is_empty()) {
        Some((
            "temporal-redirect",
            to,
            code("temporal-redirect-code", 300..=307, 302),
        ))
    } else {
        get("permanent-redirect")
            .filter(|v| !v.is_empty())
            .map(|to| {
                (
                    "permanent-redirect",
                    to,
                    code("permanent-redirect-code", 300..=308, 301),
                )
            })
    };
    if let Some((name, to, code)) = redirect {
        let ok = to.starts_with("http://")
            || to.starts_with("https://")
            || (to.starts_with('/') && !to.starts_with("//"));
        if ok && !to.chars().any(|c| c.is_control() || c == ' ') {
            out.plugins.extend(plugin(
                "redirect",
                &json!({"uri": to.replace('$', "$$"), "ret_code": code}),
                problems,
                name,
            ));
        } else {
            problems.error(
                field(name),
                format!("{to:?} must be an http(s) URL or a path"),
            );
        }
    }

    // Limits and timeouts.
    // NB: ingress-nginx's default (ConfigMap proxy-body-size) is 1m.
    {
        let v = get("proxy-body-size").unwrap_or("1m");
        match size(v) {
            // `0`: no limit, as nginx's `client_max_body_size 0`.
            Some(0) => {}
            Some(bytes) => out.plugins.extend(plugin(
                "client-control",
                &json!({"max_body_size": bytes}),
                problems,
                "proxy-body-size",
            )),
            None => problems.error(
                field("proxy-body-size"),
                format!("{v:?} must be a size such as 8m, 512k or 1024"),
            ),
        }
    }
    for (i, n) in [
        "proxy-connect-timeout",
        "proxy-send-timeout",
        "proxy-read-timeout",
    ]
    .into_iter()
    .enumerate()
    {
        // NB: ingress-nginx's defaults (ConfigMap proxy-connect-timeout 5, -send- and
        // -read- 60); a value that is not whole seconds falls back to it, with a note.
        let default = if i == 0 { 5 } else { 60 };
        let secs = match get(n) {
            None => default,
            Some(v) => match v.trim().parse::<u64>() {
                Ok(s) if s > 0 && s <= 86_400 => s,
                _ => {
                    problems.notes.push(format!(
                        "{PREFIX}{n} {v:?} is not whole seconds: {default} used"
                    ));
                    default
                }
            },
        };
        out.timeouts[i] = Some(secs * 1000);
    }
    rate_limits(&get, problems, &mut out);

    // Access.
    for (n, key) in [
        ("whitelist-source-range", "whitelist"),
        ("denylist-source-range", "blacklist"),
    ] {
        if let Some(v) = get(n) {
            match cidrs(v) {
                Ok(list) => out.plugins.extend(plugin(
                    "ip-restriction",
                    &json!({key: list, "response_code": 403, "message": "Forbidden"}),
                    problems,
                    n,
                )),
                Err(e) => problems.error(field(n), e),
            }
        }
    }
    if get("whitelist-source-range").is_some() && get("denylist-source-range").is_some() {
        // NB: one ip-restriction per route; ingress-nginx applies the deny list first, then
        // the allow list: an address in both is denied either way, so the allow list
        // alone (every other address denied) is the same answer once the deny list's
        // addresses are dropped from it; Sluice refuses the pair rather than guess.
        problems.error(
            field("denylist-source-range"),
            "together with whitelist-source-range: not served yet (keep one of the two)",
        );
    }
    if flag("enable-cors", problems).unwrap_or(false) {
        out.plugins.extend(cors(&get, problems));
    }

    // Upstream request.
    if let Some(h) = get("upstream-vhost") {
        match crate::validate::host(h) {
            Ok(()) => out.rewrite_host = Some(h.to_owned()),
            Err(e) => problems.error(field("upstream-vhost"), e),
        }
    }
    if let Some(p) = get("x-forwarded-prefix") {
        if p.chars().all(|c| c.is_ascii_graphic()) && !p.is_empty() {
            out.forwarded_prefix = Some(p.to_owned());
        } else {
            problems.error(field("x-forwarded-prefix"), format!("{p:?} must be a path"));
        }
    }

    out.backend_protocol = get("backend-protocol")
        .map(|v| v.trim().to_ascii_uppercase())
        .unwrap_or_else(|| "HTTP".into());
    if let Some(v) = get("proxy-ssl-secret") {
        match v.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() => {
                out.proxy_ssl_secret = Some((ns.to_owned(), name.to_owned()));
            }
            _ => problems.error(
                field("proxy-ssl-secret"),
                format!("{v:?} must be namespace/name"),
            ),
        }
    }
    if let Some(v) = get("proxy-ssl-verify")
        && v.trim() != "on"
    {
        problems.error(
            field("proxy-ssl-verify"),
            format!("{v:?}: Sluice always verifies backend certificates (use proxy-ssl-secret with the CA in ca.crt)"),
        );
    }
    if let Some(url) = get("auth-url").map(str::trim) {
        external_auth(url, &get, problems, &mut out);
    }
    match get("auth-type").map(str::trim) {
        None => {}
        Some("basic") => {
            let secret = get("auth-secret").map(str::trim).filter(|v| !v.is_empty());
            match secret {
                None => problems.error(field("auth-secret"), "required with auth-type basic"),
                Some(v) => {
                    out.basic_auth = Some(BasicAuth {
                        secret: v.to_owned(),
                        map: match get("auth-secret-type").map(str::trim) {
                            None | Some("auth-file") => false,
                            Some("auth-map") => true,
                            Some(other) => {
                                problems.error(
                                    field("auth-secret-type"),
                                    format!("{other:?} must be auth-file or auth-map"),
                                );
                                false
                            }
                        },
                        realm: get("auth-realm").unwrap_or_default().to_owned(),
                    });
                }
            }
        }
        Some(other) => problems.error(
            field("auth-type"),
            format!("{other:?} is not served (basic is; digest needs nginx's third-party module)"),
        ),
    }
    if let Some(v) = get("proxy-ssl-name") {
        match crate::validate::host(v.trim()) {
            Ok(()) => out.proxy_ssl_name = Some(v.trim().to_owned()),
            Err(e) => problems.error(field("proxy-ssl-name"), e),
        }
    }
    if !ignored.is_empty() {
        problems.notes.push(format!(
            "ingress-nginx annotations ignored: {}",
            ignored.join("; ")
        ));
    }
    if !unknown.is_empty() {
        problems.notes.push(format!(
            "unknown ingress-nginx annotations, ignored: {}",
            unknown.join(", ")
        ));
    }
    out.plugins.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// `auth-url` (with `auth-method`, `auth-response-headers`): the `forward-auth` plugin.
/// ingress-nginx's `auth_request` sends every client header; Sluice sends the ones that
/// carry a session or credentials (`Authorization`, `Cookie`, ...) besides its
/// `X-Forwarded-*` ones, and passes a denial's status, body, `WWW-Authenticate` and
/// `Set-Cookie` to the client; an unreachable service is a 500, as nginx answers.
fn external_auth<'a>(
    url: &str,
    get: &impl Fn(&str) -> Option<&'a str>,
    problems: &mut Problems,
    out: &mut Nginx,
) {
    if url.contains('$') {
        problems.error(
            field("auth-url"),
            format!(
                "{url:?}: nginx variables in the URL are not served (write the service's address)"
            ),
        );
        return;
    }
    let method = match get("auth-method").map(|m| m.trim().to_ascii_uppercase()) {
        None => "GET".to_owned(),
        Some(m) if m == "GET" || m == "POST" => m,
        Some(m) => {
            problems.error(
                field("auth-method"),
                format!("{m:?}: GET or POST are served"),
            );
            return;
        }
    };
    let upstream_headers: Vec<String> = get("auth-response-headers")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    out.plugins.extend(plugin(
        "forward-auth",
        &json!({
            "uri": url,
            "request_method": method,
            "request_headers": ["Authorization", "Cookie", "Proxy-Authorization", "User-Agent", "Accept", "Accept-Language", "X-Requested-With"],
            "upstream_headers": upstream_headers,
            "client_headers": ["WWW-Authenticate", "Set-Cookie", "Location"],
            "timeout": 60_000,
            "status_on_error": 500,
        }),
        problems,
        "auth-url",
    ));
}

/// `limit-rps` / `limit-rpm` with `limit-burst-multiplier` (default 5): ingress-nginx's
/// `limit_req` per client address, burst = multiplier × limit, 503 when exceeded.
fn rate_limits<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    problems: &mut Problems,
    out: &mut Nginx,
) {
    let multiplier = match get("limit-burst-multiplier") {
        None => 5.0,
        Some(v) => match v.trim().parse::<u32>() {
            Ok(m) if m > 0 => f64::from(m),
            _ => {
                problems.error(
                    field("limit-burst-multiplier"),
                    format!("{v:?} must be a whole number above 0"),
                );
                5.0
            }
        },
    };
    // NB: ingress-nginx's `limit_req ... burst=<limit × multiplier> nodelay`: that many
    // requests above the rate pass at once, the next are refused.
    let (name, per_second) = match (get("limit-rps"), get("limit-rpm")) {
        (Some(_), Some(_)) => {
            problems.error(
                field("limit-rpm"),
                "together with limit-rps: not served yet (keep one of the two)",
            );
            return;
        }
        (Some(v), None) => (
            "limit-rps",
            v.trim()
                .parse::<u32>()
                .map(f64::from)
                .ok()
                .filter(|r| *r > 0.0)
                .map(|r| (r, v)),
        ),
        (None, Some(v)) => (
            "limit-rpm",
            v.trim()
                .parse::<u32>()
                .map(f64::from)
                .ok()
                .filter(|r| *r > 0.0)
                .map(|r| (r / 60.0, v)),
        ),
        (None, None) => return,
    };
    let limit = get(name).unwrap_or_default();
    let Some((rate, raw)) = per_second else {
        problems.error(
            field(name),
            format!("{limit:?} must be a whole number above 0"),
        );
        return;
    };
    let per_unit: f64 = raw.trim().parse().unwrap_or(0.0);
    out.plugins.extend(plugin(
        "limit-req",
        &json!({
            "rate": rate,
            "burst": per_unit * multiplier,
            "key": "remote_addr",
            "rejected_code": get("limit-req-status-code")
                .and_then(|c| c.trim().parse::<u16>().ok())
                .unwrap_or(503),
            "nodelay": true,
        }),
        problems,
        name,
    ));
}

/// `enable-cors` with `cors-*`, ingress-nginx's defaults.
fn cors<'a>(get: &impl Fn(&str) -> Option<&'a str>, problems: &mut Problems) -> Option<v1::Plugin> {
    let origins = get("cors-allow-origin").unwrap_or("*").trim();
    let credentials = match get("cors-allow-credentials") {
        None => true,
        Some(v) => boolean(v).unwrap_or_else(|| {
            problems.error(
                field("cors-allow-credentials"),
                format!("{v:?} must be true or false"),
            );
            true
        }),
    };
    let list: Vec<&str> = origins
        .split(',')
        .map(str::trim)
        .filter(|o| !o.is_empty())
        .collect();
    let any = list.is_empty() || list.contains(&"*");
    let mut conf = json!({
        "allow_methods": get("cors-allow-methods").unwrap_or("GET, PUT, POST, DELETE, PATCH, OPTIONS").replace(' ', ""),
        "allow_headers": get("cors-allow-headers").unwrap_or("DNT,Keep-Alive,User-Agent,X-Requested-With,If-Modified-Since,Cache-Control,Content-Type,Range,Authorization").replace(' ', ""),
        "max_age": match get("cors-max-age") {
            None => 1_728_000,
            Some(v) => v.trim().parse::<i64>().unwrap_or_else(|_| {
                problems.error(field("cors-max-age"), format!("{v:?} must be whole seconds"));
                1_728_000
            }),
        },
        "allow_credential": credentials && !any,
    });
    if let Some(o) = conf.as_object_mut() {
        if any {
            o.insert("allow_origins".into(), "*".into());
        } else if list.iter().any(|o| o.contains('*')) {
            // `https://*.example.com`: ingress-nginx's wildcard subdomain form.
            // NB: every origin of the list as a regex (APISIX ignores `allow_origins` once
            // `allow_origins_by_regex` is set; it must still not be `*` with credentials).
            let res: Vec<String> = list
                .iter()
                .map(|o| format!("(?i)^{}$", regex::escape(o).replace(r"\*", "[a-zA-Z0-9-]+")))
                .collect();
            o.insert("allow_origins_by_regex".into(), json!(res));
            o.insert("allow_origins".into(), "null".into());
        } else {
            o.insert("allow_origins".into(), list.join(",").into());
        }
        if let Some(e) = get("cors-expose-headers").filter(|e| !e.trim().is_empty()) {
            o.insert("expose_headers".into(), e.replace(' ', "").into());
        }
    }
    plugin("cors", &conf, problems, "enable-cors")
}

/// The path regex of an Ingress path with `use-regex`: what the router matches the request
/// path against (case-insensitively), and the literal prefix before its first special
/// character (the route's prefix path, so only candidate requests reach the regex).
pub(crate) fn regex_path(path: &str) -> Result<(String, String), String> {
    let anchored = format!("^{path}");
    regex::RegexBuilder::new(&anchored)
        .case_insensitive(true)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| format!("{path:?} is not a regular expression Sluice can run: {e}"))?;
    let literal: String = path
        .chars()
        .take_while(|c| !"\\.^$|?*+()[]{}".contains(*c))
        .collect();
    Ok((anchored, literal))
}

/// An ingress-nginx canary Ingress's backend for one host and path: the main Ingress with
/// the same host and path sends it the requests its rules pick.
#[derive(Debug, Clone)]
pub(crate) struct Canary {
    /// The canary Ingress (namespace, name).
    pub ingress: (String, String),
    /// Its rule's host.
    pub host: Option<String>,
    /// Its path as written.
    pub path: String,
    /// Its backend.
    pub backend: v1::Backend,
    /// The backend's upstream.
    pub upstream: v1::Upstream,
    /// Which requests go to it.
    pub rules: CanaryRules,
    /// Whether a main Ingress took it.
    pub used: std::cell::Cell<bool>,
}

/// `canary-*`: which requests a canary gets, in ingress-nginx's order (header, then
/// cookie, then weight).
#[derive(Debug, Clone, Default)]
pub(crate) struct CanaryRules {
    /// `canary-by-header`.
    pub header: Option<String>,
    /// `canary-by-header-value`: the header must equal it (then `always`/`never` mean
    /// nothing).
    pub header_value: Option<String>,
    /// `canary-by-header-pattern` (without a value): the header must match it.
    pub header_pattern: Option<String>,
    /// `canary-by-cookie`.
    pub cookie: Option<String>,
    /// `canary-weight` out of `total`.
    pub weight: u32,
    /// `canary-weight-total` (at least 100, as ingress-nginx's balancer reads it).
    pub total: u32,
}

/// The ingress-nginx annotations of `ing`, by name without [`PREFIX`].
fn annotations_of(ing: &Ingress) -> BTreeMap<&str, &str> {
    ing.metadata
        .annotations
        .iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.strip_prefix(PREFIX)?, v.as_str())))
        .collect()
}

/// Whether `ing` is a canary (`canary: "true"`).
pub(crate) fn is_canary(ing: &Ingress) -> bool {
    annotations_of(ing)
        .get("canary")
        .and_then(|v| boolean(v))
        .unwrap_or(false)
}

/// The rules of a canary Ingress. ingress-nginx ignores its other annotations (they are
/// named in the message); a snippet is still refused.
pub(crate) fn canary_rules(ing: &Ingress, problems: &mut Problems) -> Option<CanaryRules> {
    let annotations = annotations_of(ing);
    let get = |n: &str| annotations.get(n).copied().filter(|v| !v.trim().is_empty());
    let mut ignored = Vec::new();
    for &name in annotations.keys() {
        if name.ends_with("-snippet") {
            problems.error(field(name), SNIPPET.why());
        } else if !name.starts_with("canary") {
            ignored.push(format!("{PREFIX}{name}"));
        }
    }
    if !ignored.is_empty() {
        problems.notes.push(format!(
            "on a canary, ingress-nginx ignores (and so does Sluice): {}",
            ignored.join(", ")
        ));
    }
    let number = |n: &str, default: u32, problems: &mut Problems| -> u32 {
        match get(n) {
            None => default,
            Some(v) => v.trim().parse::<u32>().unwrap_or_else(|_| {
                problems.error(field(n), format!("{v:?} must be a whole number"));
                default
            }),
        }
    };
    let total = number("canary-weight-total", 100, problems).max(100);
    let weight = number("canary-weight", 0, problems);
    if weight > total {
        problems.error(
            field("canary-weight"),
            format!("{weight} is above canary-weight-total {total}"),
        );
    }
    let header_pattern = get("canary-by-header-pattern").map(str::to_owned);
    if let Some(p) = &header_pattern
        && let Err(e) = regex::RegexBuilder::new(p).size_limit(1 << 20).build()
    {
        problems.error(field("canary-by-header-pattern"), format!("{p:?}: {e}"));
    }
    Some(CanaryRules {
        header: get("canary-by-header").map(str::to_owned),
        header_value: get("canary-by-header-value").map(str::to_owned),
        header_pattern,
        cookie: get("canary-by-cookie").map(str::to_owned),
        weight: weight.min(total),
        total,
    })
}

/// `routes` (of one host and path of a main Ingress) with the canary of that host and path,
/// if any: routes of their own (priority +4) for `canary-by-header` (`always`, the value or
/// the pattern to the canary; `never` to the main backend), then (+2) for
/// `canary-by-cookie` (`always` / `never`), and the weighted split on the route itself.
/// The HTTPS redirect route stays above them all.
pub(crate) fn with_canaries(
    routes: Vec<v1::Route>,
    host: Option<&str>,
    path: &str,
    canaries: &[Canary],
) -> Vec<v1::Route> {
    // NB: one canary per host and path, as ingress-nginx: the first by namespace and name.
    let Some(c) = canaries
        .iter()
        .find(|c| c.host.as_deref() == host && c.path == path)
    else {
        return routes;
    };
    let r = &c.rules;
    let mut out = Vec::new();
    for route in routes {
        if route.id.ends_with("-ssl-redirect") {
            out.push(route);
            continue;
        }
        let main = route.backends.first().cloned();
        let variant = |suffix: &str, offset: i32, expr: v1::Expr, to_canary: bool| {
            let mut v = route.clone();
            v.id = format!("{}-{suffix}", route.id);
            v.priority = route.priority.saturating_add(offset);
            v.exprs.push(expr);
            let mut b = if to_canary {
                c.backend.clone()
            } else {
                main.clone().unwrap_or_else(|| c.backend.clone())
            };
            b.weight = 1;
            v.backends = vec![b];
            v
        };
        let expr = |scope: v1::ExprScope, name: &str, op: v1::ExprOp, value: &str| v1::Expr {
            scope: scope.into(),
            name: name.to_owned(),
            op: op.into(),
            value: value.to_owned(),
            ..Default::default()
        };
        if let Some(h) = &r.header {
            let h = h.to_ascii_lowercase();
            match (&r.header_value, &r.header_pattern) {
                (Some(v), _) => out.push(variant(
                    "canary-header",
                    4,
                    expr(v1::ExprScope::Header, &h, v1::ExprOp::Equal, v),
                    true,
                )),
                (None, Some(p)) => out.push(variant(
                    "canary-header",
                    4,
                    expr(v1::ExprScope::Header, &h, v1::ExprOp::RegexMatch, p),
                    true,
                )),
                (None, None) => {
                    out.push(variant(
                        "canary-header",
                        4,
                        expr(v1::ExprScope::Header, &h, v1::ExprOp::Equal, "always"),
                        true,
                    ));
                    out.push(variant(
                        "canary-header-never",
                        4,
                        expr(v1::ExprScope::Header, &h, v1::ExprOp::Equal, "never"),
                        false,
                    ));
                }
            }
        }
        if let Some(k) = &r.cookie {
            out.push(variant(
                "canary-cookie",
                2,
                expr(v1::ExprScope::Cookie, k, v1::ExprOp::Equal, "always"),
                true,
            ));
            out.push(variant(
                "canary-cookie-never",
                2,
                expr(v1::ExprScope::Cookie, k, v1::ExprOp::Equal, "never"),
                false,
            ));
        }
        let mut base = route;
        if r.weight > 0 {
            let mut canary = c.backend.clone();
            canary.weight = r.weight;
            base.backends.retain(|_| r.weight < r.total);
            for b in &mut base.backends {
                b.weight = r.total - r.weight;
            }
            base.backends.push(canary);
        }
        out.push(base);
    }
    out
}

/// The route that redirects plain-HTTP requests `route` would serve to HTTPS with `code`
/// (`<id>-ssl-redirect`, one above `route`'s priority, matching `scheme == http`), as
/// ingress-nginx's `return 308 https://$host$request_uri`.
pub(crate) fn ssl_redirect_route(route: &v1::Route, code: u16) -> v1::Route {
    let mut twin = route.clone();
    twin.id = format!("{}-ssl-redirect", route.id);
    // NB: above the route's canary variants (+2, +4): ingress-nginx redirects first.
    twin.priority = route.priority.saturating_add(8);
    twin.exprs.push(v1::Expr {
        scope: v1::ExprScope::Variable.into(),
        name: "scheme".into(),
        op: v1::ExprOp::Equal.into(),
        value: "http".into(),
        ..Default::default()
    });
    // NB: ingress-nginx's no-tls-redirect-locations: ACME HTTP-01 challenges stay on HTTP.
    twin.exprs.push(v1::Expr {
        scope: v1::ExprScope::Path.into(),
        op: v1::ExprOp::RegexNotMatch.into(),
        value: r"^/\.well-known/acme-challenge/".into(),
        ..Default::default()
    });
    twin.plugins = vec![v1::Plugin {
        name: "redirect".into(),
        config_json: crate::json::canonical(&json!({
            "uri": "https://$host$request_uri",
            "ret_code": code,
        })),
    }];
    twin
}

/// The `proxy-rewrite` of `rewrite-target`: the whole path replaced (nginx `rewrite`
/// replaces the URI it matched, not the match alone), `$n` the path regex's captures.
pub(crate) fn rewrite_config(path: &str, target: &str, n: &Nginx) -> Value {
    let mut conf = serde_json::Map::new();
    // `(?i)^(?:PATH).*`: the match covers the whole path, so the substitution is the
    // target alone; the path's own groups keep their numbers.
    conf.insert(
        "regex_uri".into(),
        json!([format!("(?i)^(?:{path}).*"), target]),
    );
    extra_rewrite(&mut conf, n);
    Value::Object(conf)
}

/// `upstream-vhost` and `x-forwarded-prefix` into a `proxy-rewrite` configuration.
pub(crate) fn extra_rewrite(conf: &mut serde_json::Map<String, Value>, n: &Nginx) {
    if let Some(h) = &n.rewrite_host {
        conf.insert("host".into(), h.clone().into());
    }
    // NB: ingress-nginx sends it only together with a rewrite-target rewrite.
    if let (Some(p), Some(_)) = (&n.forwarded_prefix, &n.rewrite_target) {
        conf.insert(
            "headers".into(),
            json!({"set": {"X-Forwarded-Prefix": p.replace('$', "$$")}}),
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_and_each_name_once() {
        for w in ANNOTATIONS.windows(2) {
            assert!(w[0].0 < w[1].0, "{} before {}", w[0].0, w[1].0);
        }
        assert_eq!(support("rewrite-target"), Some(Support::Same));
        assert_eq!(support("configuration-snippet"), Some(SNIPPET));
        assert_eq!(support("no-such-annotation"), None);
        for (name, s) in ANNOTATIONS {
            if name.ends_with("-snippet") {
                assert_eq!(*s, SNIPPET, "{name}");
            }
        }
    }

    #[test]
    fn sizes_are_nginx_sizes() {
        assert_eq!(size("8m"), Some(8 << 20));
        assert_eq!(size("512k"), Some(512 << 10));
        assert_eq!(size("1G"), Some(1 << 30));
        assert_eq!(size("1024"), Some(1024));
        assert_eq!(size("0"), Some(0));
        assert_eq!(size("m"), None);
        assert_eq!(size("-1m"), None);
        assert_eq!(size("99999999999999999g"), None);
    }

    #[test]
    fn regex_paths_keep_their_literal_prefix() {
        assert_eq!(
            regex_path("/something(/|$)(.*)").unwrap(),
            ("^/something(/|$)(.*)".to_owned(), "/something".to_owned())
        );
        assert!(regex_path("/(?<=x)").is_err(), "look-behind is refused");
    }
}
