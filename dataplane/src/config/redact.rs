//! Secret material never leaves the process: the copy of a snapshot the admin listener
//! shows (`/snapshot?full=1`) has every private key and credential replaced by
//! [`REDACTED`].
//!
//! What counts as secret: TLS private keys (server certificates, the default certificate,
//! those of per-Gateway listeners,
//! upstream client certificates), and in every plugin configuration (routes, global rules,
//! consumers) the values of fields named as credentials: `password`, `secret`,
//! `private_key`, `token`, `secret_key` (hmac-auth), any field ending in `_password`,
//! `_secret`, `_token` or `_private_key` (openid-connect's `client_rsa_private_key`), the
//! `key` of key-auth and csrf, http-logger's `auth_header`, and in any header map the
//! values of credential headers (`Authorization`, `Proxy-Authorization`, `Cookie`,
//! `Set-Cookie`, `X-Api-Key`, ...). Public keys, CA bundles and certificate chains are
//! shown.

use sluice_proto::v1;

/// What a secret value is replaced with.
pub const REDACTED: &str = "<redacted>";

/// A copy of `snapshot` without secret material.
pub fn redacted(snapshot: &v1::Snapshot) -> v1::Snapshot {
    let mut s = snapshot.clone();
    let listener_certs = s.listeners.iter_mut().flat_map(|l| {
        l.tls_certificates
            .iter_mut()
            .chain(l.default_certificate.as_mut())
    });
    for cert in s
        .tls_certificates
        .iter_mut()
        .chain(s.default_certificate.as_mut())
        .chain(listener_certs)
    {
        hide(&mut cert.private_key_pem);
    }
    for up in &mut s.upstreams {
        if let Some(tls) = up.tls.as_mut() {
            hide(&mut tls.client_key_pem);
        }
    }
    // A backend's plugins (`Backend.plugins`) may set credential headers too.
    let plugins = s
        .routes
        .iter_mut()
        .flat_map(|r| {
            let v1::Route {
                plugins, backends, ..
            } = r;
            let own = backends.iter_mut().flat_map(|b| b.plugins.iter_mut());
            plugins.iter_mut().chain(own)
        })
        .chain(s.global_rules.iter_mut().flat_map(|g| g.plugins.iter_mut()))
        .chain(s.consumers.iter_mut().flat_map(|c| c.plugins.iter_mut()));
    for plugin in plugins {
        plugin.config_json = redacted_config(&plugin.name, &plugin.config_json);
    }
    s
}

fn hide(value: &mut String) {
    if !value.is_empty() {
        *value = REDACTED.to_owned();
    }
}

/// Whether field `name` of plugin `plugin`'s configuration holds a credential.
fn is_secret(plugin: &str, name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(
        name.as_str(),
        "password" | "secret" | "private_key" | "token" | "secret_key"
    ) || name.ends_with("_password")
        || name.ends_with("_secret")
        || name.ends_with("_token")
        || name.ends_with("_private_key")
        || ((plugin == "key-auth" || plugin == "csrf") && name == "key")
        || name == "auth_header"
        || is_credential_header(&name)
}

/// Whether a header of this (lowercase) name carries a credential: the value of such a key
/// in any header map of a configuration (proxy-rewrite's `headers.set`, a logger's or
/// collector's headers) is hidden.
fn is_credential_header(name: &str) -> bool {
    matches!(
        name,
        "authorization"
            | "proxy-authorization"
            | "cookie"
            | "set-cookie"
            | "x-api-key"
            | "api-key"
            | "apikey"
            | "api_key"
    )
}

/// `config_json` with the values of secret fields, at any depth, replaced; a configuration
/// that is not JSON is replaced whole (it cannot be shown safely).
fn redacted_config(plugin: &str, config_json: &str) -> String {
    fn walk(plugin: &str, v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, v) in map.iter_mut() {
                    // NB: a flag named like a secret (jwt-auth's `base64_secret`) is no
                    // secret, and turning it into a string breaks the config's schema.
                    if is_secret(plugin, k) && !v.is_null() && !v.is_boolean() {
                        *v = serde_json::Value::String(REDACTED.to_owned());
                    } else {
                        walk(plugin, v);
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|i| walk(plugin, i)),
            _ => {}
        }
    }
    match serde_json::from_str::<serde_json::Value>(config_json) {
        Ok(mut v) => {
            walk(plugin, &mut v);
            v.to_string()
        }
        Err(_) => format!("\"{REDACTED}\""),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Flags named like secrets stay booleans (the redacted config still parses with the
    /// plugin's schema); a secret given as a number is hidden like a string.
    #[test]
    fn boolean_flags_are_kept_and_numeric_secrets_hidden() {
        let shown = redacted_config(
            "jwt-auth",
            &serde_json::json!({"key": "k", "secret": 12345, "base64_secret": true}).to_string(),
        );
        let v: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(v["base64_secret"], true);
        assert_eq!(v["secret"], REDACTED);
        assert!(!shown.contains("12345"), "{shown}");
    }

    #[test]
    fn openid_connect_credentials_are_hidden() {
        let shown = redacted_config(
            "openid-connect",
            &serde_json::json!({
                "client_id": "api", "client_secret": "oidc-client-secret",
                "discovery": "https://idp/.well-known/openid-configuration",
                "bearer_only": true, "use_jwks": true,
                "client_rsa_private_key": "-----BEGIN PRIVATE KEY-----x",
                "session": {"secret": "session-secret-123", "redis": {"password": "pw-1"}},
                "public_key": "-----BEGIN PUBLIC KEY-----y",
            })
            .to_string(),
        );
        let v: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(v["client_secret"], REDACTED);
        assert_eq!(v["client_rsa_private_key"], REDACTED);
        assert_eq!(v["session"]["secret"], REDACTED);
        assert_eq!(v["session"]["redis"]["password"], REDACTED);
        assert_eq!(
            (v["client_id"].as_str(), v["use_jwks"].as_bool()),
            (Some("api"), Some(true))
        );
        assert_eq!(
            v["public_key"], "-----BEGIN PUBLIC KEY-----y",
            "public keys are shown"
        );
        for secret in [
            "oidc-client-secret",
            "PRIVATE",
            "session-secret-123",
            "pw-1",
        ] {
            assert!(!shown.contains(secret), "{shown}");
        }
    }

    /// Credentials a plugin sends elsewhere: a logger's `auth_header`, the credential
    /// headers of any header map (any case, any depth); other headers are shown.
    #[test]
    fn credentials_sent_onwards_are_hidden() {
        for (name, config, secret, kept) in [
            (
                "http-logger",
                serde_json::json!({"uri": "http://log:9000/x", "auth_header": "Bearer LOG-TOKEN"}),
                "LOG-TOKEN",
                "log:9000",
            ),
            (
                "proxy-rewrite",
                serde_json::json!({"headers": {"set": {"Authorization": "Basic UP-CRED", "X-Env": "prod"}}}),
                "UP-CRED",
                "prod",
            ),
            (
                "proxy-rewrite",
                serde_json::json!({"headers": {"add": {"X-API-KEY": "APIKEY-1"}, "remove": ["Cookie"]}}),
                "APIKEY-1",
                "Cookie",
            ),
            (
                "opentelemetry",
                serde_json::json!({"collector": {"address": "otel:4318", "request_headers": {"proxy-authorization": "PXY-1", "cookie": "sid=COOKIE-1"}}}),
                "PXY-1",
                "otel:4318",
            ),
        ] {
            let shown = redacted_config(name, &config.to_string());
            assert!(!shown.contains(secret), "{name}: {secret} shown: {shown}");
            assert!(!shown.contains("COOKIE-1"), "{name}: {shown}");
            assert!(shown.contains(kept), "{name}: {kept} hidden: {shown}");
        }
    }

    fn plugin(name: &str, config: serde_json::Value) -> v1::Plugin {
        v1::Plugin {
            name: name.into(),
            config_json: config.to_string(),
        }
    }

    #[test]
    fn a_backend_plugin_credential_is_hidden() {
        let snap = v1::Snapshot {
            routes: vec![v1::Route {
                id: "r".into(),
                backends: vec![v1::Backend {
                    upstream_id: "u".into(),
                    weight: 1,
                    plugins: vec![plugin(
                        "proxy-rewrite",
                        serde_json::json!({"headers": {"set": {"Authorization": "Bearer BACKEND-CRED"}}}),
                    )],
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let shown = serde_json::to_string(&redacted(&snap)).unwrap();
        assert!(!shown.contains("BACKEND-CRED"), "{shown}");
        assert!(shown.contains("Authorization"), "{shown}");
    }

    #[test]
    fn keys_and_credentials_are_hidden_and_the_rest_is_kept() {
        let snap = v1::Snapshot {
            tls_certificates: vec![v1::TlsCertificate {
                id: "c".into(),
                cert_chain_pem: "CHAIN".into(),
                private_key_pem: "TOP-SECRET-KEY".into(),
                ..Default::default()
            }],
            default_certificate: Some(v1::TlsCertificate {
                private_key_pem: "DEFAULT-KEY".into(),
                ..Default::default()
            }),
            listeners: vec![v1::Listener {
                id: "ns/gw/443".into(),
                tls: true,
                tls_certificates: vec![v1::TlsCertificate {
                    private_key_pem: "GATEWAY-KEY".into(),
                    ..Default::default()
                }],
                default_certificate: Some(v1::TlsCertificate {
                    private_key_pem: "GATEWAY-DEFAULT-KEY".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            upstreams: vec![v1::Upstream {
                id: "u".into(),
                tls: Some(v1::UpstreamTls {
                    ca_pem: "CA".into(),
                    client_key_pem: "CLIENT-KEY".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            consumers: vec![v1::Consumer {
                name: "ns_alice".into(),
                plugins: vec![
                    plugin("key-auth", serde_json::json!({"key": "alice-api-key"})),
                    plugin(
                        "basic-auth",
                        serde_json::json!({"username": "alice", "password": "pw-1"}),
                    ),
                    plugin(
                        "jwt-auth",
                        serde_json::json!({"key": "alice", "secret": "hs-secret", "private_key": "PEM", "public_key": "PUB"}),
                    ),
                    plugin(
                        "hmac-auth",
                        serde_json::json!({"key_id": "alice-hmac", "secret_key": "hmac-secret"}),
                    ),
                ],
            }],
            routes: vec![v1::Route {
                id: "r".into(),
                plugins: vec![
                    plugin(
                        "limit-count",
                        serde_json::json!({"key": "remote_addr", "redis_password": "redis-pw", "nested": [{"auth_token": "t"}]}),
                    ),
                    plugin("csrf", serde_json::json!({"key": "csrf-signing-key"})),
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let shown = serde_json::to_string(&redacted(&snap)).unwrap();
        for secret in [
            "TOP-SECRET-KEY",
            "DEFAULT-KEY",
            "GATEWAY-KEY",
            "GATEWAY-DEFAULT-KEY",
            "CLIENT-KEY",
            "alice-api-key",
            "pw-1",
            "hs-secret",
            "\"PEM\"",
            "redis-pw",
            "\"t\"",
            "hmac-secret",
            "csrf-signing-key",
        ] {
            assert!(!shown.contains(secret), "{secret} shown: {shown}");
        }
        for kept in [
            "CHAIN",
            "\"CA\"",
            "alice",
            "PUB",
            "remote_addr",
            "ns_alice",
            "alice-hmac",
        ] {
            assert!(shown.contains(kept), "{kept} hidden: {shown}");
        }
        assert_eq!(redacted_config("x", "not json"), format!("\"{REDACTED}\""));
    }
}
