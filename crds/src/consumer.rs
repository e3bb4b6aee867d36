//! `ApisixConsumer`: credentials for the auth plugins, plus consumer plugins.
// NB: kube's `printcolumn(...)` repeats keys such as `type_` by design; clippy mistakes them
// for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{ApisixRoutePlugin, ApisixStatus, LocalSecretReference, null_as_default};
use crate::route::AuthType;

/// Spec of an `ApisixConsumer`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "apisix.apache.org",
    version = "v2",
    kind = "ApisixConsumer",
    namespaced,
    shortname = "ac",
    status = "ApisixStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "ApisixConsumer holds the credentials a client authenticates with, for routes whose \
           authentication type matches.",
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Accepted")].status"#,
        description = "Whether the controller accepted the consumer"
    ),
    printcolumn(
        name = "Programmed",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Programmed")].status"#,
        description = "Whether the dataplanes know the consumer"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ApisixConsumerSpec {
    /// IngressClass this object belongs to; unset means the default IngressClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_class_name: Option<String>,
    /// The consumer's credentials (one kind is expected).
    pub auth_parameter: ApisixConsumerAuthParameter,
    /// Plugins applied to requests of this consumer.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub plugins: Vec<ApisixRoutePlugin>,
}

/// Credentials of a consumer, by auth plugin. Each is given inline (`value`) or as a Secret in
/// the consumer's namespace (`secretRef`) whose keys have the same names as the `value` fields.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixConsumerAuthParameter {
    /// basic-auth credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<ApisixConsumerCredential<ApisixConsumerBasicAuthValue>>,
    /// key-auth credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_auth: Option<ApisixConsumerCredential<ApisixConsumerKeyAuthValue>>,
    /// wolf-rbac credentials.
    #[serde(rename = "wolfRBAC", default, skip_serializing_if = "Option::is_none")]
    pub wolf_rbac: Option<ApisixConsumerCredential<ApisixConsumerWolfRbacValue>>,
    /// jwt-auth credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt_auth: Option<ApisixConsumerCredential<ApisixConsumerJwtAuthValue>>,
    /// hmac-auth credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hmac_auth: Option<ApisixConsumerCredential<ApisixConsumerHmacAuthValue>>,
    /// ldap-auth credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ldap_auth: Option<ApisixConsumerCredential<ApisixConsumerLdapAuthValue>>,
}

impl ApisixConsumerAuthParameter {
    /// The credential kinds that are set, in a fixed order (the controller expects exactly one).
    pub fn kinds(&self) -> Vec<AuthType> {
        [
            (self.basic_auth.is_some(), AuthType::BasicAuth),
            (self.key_auth.is_some(), AuthType::KeyAuth),
            (self.wolf_rbac.is_some(), AuthType::WolfRbac),
            (self.jwt_auth.is_some(), AuthType::JwtAuth),
            (self.hmac_auth.is_some(), AuthType::HmacAuth),
            (self.ldap_auth.is_some(), AuthType::LdapAuth),
        ]
        .into_iter()
        .filter_map(|(set, kind)| set.then_some(kind))
        .collect()
    }
}

/// One credential, inline (`value`) or from a Secret (`secretRef`); exactly one is expected.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", bound(deserialize = "T: Deserialize<'de>"))]
pub struct ApisixConsumerCredential<T> {
    /// Secret in the consumer's namespace holding the credential fields as keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalSecretReference>,
    /// The credential, inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<T>,
}

/// basic-auth credential.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ApisixConsumerBasicAuthValue {
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
}

/// key-auth credential.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ApisixConsumerKeyAuthValue {
    /// The API key.
    pub key: String,
}

/// wolf-rbac credential.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ApisixConsumerWolfRbacValue {
    /// Wolf server URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Application id in Wolf.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub appid: Option<String>,
    /// Prefix of the headers carrying the Wolf user info.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_prefix: Option<String>,
}

/// jwt-auth credential.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ApisixConsumerJwtAuthValue {
    /// Key identifying the consumer (the token's `key` claim).
    pub key: String,
    /// Shared secret of HS* algorithms. Default: generated by APISIX.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// PEM public key of RS*/ES*/PS*/EdDSA algorithms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// PEM private key (only used by APISIX's token-signing endpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    /// Signing algorithm. Default `HS256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<JwtAlgorithm>,
    /// Token lifetime in seconds. Default 86400.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub exp: Option<i64>,
    /// Whether `secret` is base64-encoded. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64_secret: Option<bool>,
    /// Clock skew allowed when checking `exp`/`nbf`, in seconds. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub lifetime_grace_period: Option<i64>,
}

/// JWT signing algorithm.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum JwtAlgorithm {
    /// HMAC with SHA-256 (the default).
    #[default]
    HS256,
    /// HMAC with SHA-384.
    HS384,
    /// HMAC with SHA-512.
    HS512,
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    RS256,
    /// RSASSA-PKCS1-v1_5 with SHA-384.
    RS384,
    /// RSASSA-PKCS1-v1_5 with SHA-512.
    RS512,
    /// ECDSA P-256 with SHA-256.
    ES256,
    /// ECDSA P-384 with SHA-384.
    ES384,
    /// ECDSA P-521 with SHA-512.
    ES512,
    /// RSASSA-PSS with SHA-256.
    PS256,
    /// RSASSA-PSS with SHA-384.
    PS384,
    /// RSASSA-PSS with SHA-512.
    PS512,
    /// Ed25519.
    EdDSA,
}

/// hmac-auth credential. Fields other than `key_id`/`secret_key` are accepted for compatibility
/// with older APISIX manifests (they moved to the route's plugin config in APISIX 3).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ApisixConsumerHmacAuthValue {
    /// Key id the client sends in its signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// Shared secret.
    pub secret_key: String,
    /// Older name of `key_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key: Option<String>,
    /// HMAC algorithm, e.g. `hmac-sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    /// Allowed clock skew in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_skew: Option<i64>,
    /// Headers that must be signed.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub signed_headers: Vec<String>,
    /// Keep the signature headers when proxying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_headers: Option<bool>,
    /// Encode URI parameters when computing the signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encode_uri_params: Option<bool>,
    /// Also sign the request body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validate_request_body: Option<bool>,
    /// Largest body that is validated, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_req_body: Option<i64>,
}

/// ldap-auth credential.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ApisixConsumerLdapAuthValue {
    /// Distinguished name of the LDAP user.
    pub user_dn: String,
}
