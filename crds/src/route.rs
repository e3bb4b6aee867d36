//! `ApisixRoute`: HTTP rules (`spec.http[]`) and L4 rules (`spec.stream[]`).
// NB: kube's `printcolumn(...)` repeats keys such as `type_` by design; clippy mistakes them
// for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{
    ApisixRoutePlugin, ApisixStatus, DEFAULT_WEIGHT, UpstreamTimeout, null_as_default,
};

/// Spec of an `ApisixRoute`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "apisix.apache.org",
    version = "v2",
    kind = "ApisixRoute",
    namespaced,
    shortname = "ar",
    status = "ApisixStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "ApisixRoute defines HTTP routing rules (and L4 stream rules) for Services.",
    printcolumn(
        name = "Hosts",
        type_ = "string",
        json_path = ".spec.http[*].match.hosts",
        description = "HTTP hosts"
    ),
    printcolumn(
        name = "URIs",
        type_ = "string",
        json_path = ".spec.http[*].match.paths",
        description = "HTTP paths"
    ),
    printcolumn(
        name = "Target Service (HTTP)",
        type_ = "string",
        json_path = ".spec.http[*].backends[*].serviceName",
        description = "Backend Services of the HTTP rules",
        priority = 1
    ),
    printcolumn(
        name = "Ingress Port (Stream)",
        type_ = "string",
        json_path = ".spec.stream[*].match.ingressPort",
        description = "Ingress ports of the stream rules",
        priority = 1
    ),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Accepted")].status"#,
        description = "Whether the controller accepted the route"
    ),
    printcolumn(
        name = "Programmed",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Programmed")].status"#,
        description = "Whether the dataplanes serve the route"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ApisixRouteSpec {
    /// IngressClass this object belongs to; unset means the default IngressClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_class_name: Option<String>,
    /// HTTP rules. Default: none.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub http: Vec<ApisixRouteHttp>,
    /// L4 (TCP/UDP) rules. Default: none.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub stream: Vec<ApisixRouteStream>,
}

/// One HTTP rule of an `ApisixRoute`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixRouteHttp {
    /// Rule name, unique within the object.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Higher wins among otherwise equal matches. Default 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i64,
    /// Upstream timeouts. Default 60s each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<UpstreamTimeout>,
    /// What requests this rule matches.
    #[serde(rename = "match")]
    pub match_: ApisixRouteHttpMatch,
    /// Services to proxy to; several means a weighted split.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub backends: Vec<ApisixRouteHttpBackend>,
    /// References to `ApisixUpstream` objects (usually with `externalNodes`).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub upstreams: Vec<ApisixRouteUpstreamReference>,
    /// Allow WebSocket upgrades. Default false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub websocket: bool,
    /// Name of an `ApisixPluginConfig` whose plugins apply first (route plugins override them).
    #[serde(
        rename = "plugin_config_name",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub plugin_config_name: Option<String>,
    /// Namespace of `plugin_config_name`. Default: the route's namespace.
    #[serde(
        rename = "plugin_config_namespace",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub plugin_config_namespace: Option<String>,
    /// Plugins of this rule.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub plugins: Vec<ApisixRoutePlugin>,
    /// Authentication required by this rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<ApisixRouteAuthentication>,
}

/// Request matching conditions of an HTTP rule; all given conditions must hold.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixRouteHttpMatch {
    /// Paths: exact, or a prefix when ending in `*` (`/foo*`). At least one.
    #[serde(deserialize_with = "null_as_default")]
    #[schemars(length(min = 1))]
    pub paths: Vec<String>,
    /// HTTP methods. Default: any.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub methods: Vec<HttpMethod>,
    /// Host names, exact or with one leading wildcard label (`*.example.com`). Default: any.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub hosts: Vec<String>,
    /// Client IPv4/IPv6 addresses or CIDRs. Default: any.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub remote_addrs: Vec<String>,
    /// Expressions on headers, query, cookies, path and variables. Default: none.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub exprs: Vec<ApisixRouteHttpMatchExpr>,
    /// APISIX Lua filter function. Sluice cannot run Lua; it is kept so the controller can
    /// reject the rule with a clear condition instead of silently ignoring it.
    #[serde(
        rename = "filter_func",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub filter_func: Option<String>,
}

/// HTTP request method accepted in `match.methods`.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    /// `CONNECT`
    Connect,
    /// `DELETE`
    Delete,
    /// `GET`
    Get,
    /// `HEAD`
    Head,
    /// `OPTIONS`
    Options,
    /// `PATCH`
    Patch,
    /// `POST`
    Post,
    /// `PUT`
    Put,
    /// `TRACE`
    Trace,
}

impl HttpMethod {
    /// The method as it appears on the wire, e.g. `GET`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "CONNECT",
            Self::Delete => "DELETE",
            Self::Get => "GET",
            Self::Head => "HEAD",
            Self::Options => "OPTIONS",
            Self::Patch => "PATCH",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Trace => "TRACE",
        }
    }
}

/// One `match.exprs[]` entry: `subject op value` or `subject op set`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixRouteHttpMatchExpr {
    /// What the expression looks at.
    pub subject: ApisixRouteHttpMatchExprSubject,
    /// Comparison operator.
    pub op: ExprOp,
    /// Operand for every operator except `In`/`NotIn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Operands for `In`/`NotIn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<Vec<String>>,
}

/// Subject of a match expression.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixRouteHttpMatchExprSubject {
    /// Where the subject comes from.
    pub scope: ExprScope,
    /// Header, query argument, cookie or variable name; required unless `scope` is `Path`.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub name: String,
}

/// Scope of a match expression subject.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ExprScope {
    /// A request header (`name` is case-insensitive).
    Header,
    /// A query-string argument.
    Query,
    /// A cookie.
    Cookie,
    /// The request path (`name` is ignored).
    Path,
    /// An APISIX/nginx variable such as `remote_addr`.
    Variable,
    /// A field of the request body.
    Body,
}

/// Operator of a match expression.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ExprOp {
    /// Subject equals `value` (APISIX `==`).
    Equal,
    /// Subject differs from `value` (APISIX `~=`).
    NotEqual,
    /// Subject, as a number, is greater than `value`.
    GreaterThan,
    /// Subject, as a number, is greater than or equal to `value`.
    GreaterThanEqual,
    /// Subject, as a number, is less than `value`.
    LessThan,
    /// Subject, as a number, is less than or equal to `value`.
    LessThanEqual,
    /// Subject matches the regex `value` (APISIX `~~`).
    RegexMatch,
    /// Subject does not match the regex `value`.
    RegexNotMatch,
    /// Subject matches the regex `value`, ignoring case (APISIX `~*`).
    RegexMatchCaseInsensitive,
    /// Subject does not match the regex `value`, ignoring case.
    RegexNotMatchCaseInsensitive,
    /// Subject is one of `set`.
    In,
    /// Subject is none of `set`.
    NotIn,
}

impl ExprOp {
    /// Whether the operator takes `set` (In, NotIn) rather than `value`.
    pub fn takes_set(self) -> bool {
        matches!(self, Self::In | Self::NotIn)
    }
}

/// A Service in the route's namespace to proxy to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixRouteHttpBackend {
    /// Service name (same namespace as the route).
    #[schemars(length(min = 1))]
    pub service_name: String,
    /// Service port, by number or by name.
    pub service_port: IntOrString,
    /// How to resolve the Service. Default `endpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolve_granularity: Option<ResolveGranularity>,
    /// Relative weight in a split. Default 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub weight: Option<i32>,
    /// Subset name, defined in the `ApisixUpstream` of the Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset: Option<String>,
}

impl ApisixRouteHttpBackend {
    /// `weight`, or [`DEFAULT_WEIGHT`] when unset.
    pub fn weight_or_default(&self) -> i32 {
        self.weight.unwrap_or(DEFAULT_WEIGHT)
    }
}

/// How a backend Service is turned into upstream nodes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
// NB: the APISIX 2.x CRD documents `endpoints` while 1.x and the stream backend use `endpoint`;
// accept both spellings, in the parser and in the CRD schema.
#[schemars(extend("enum" = ["endpoint", "endpoints", "service"]))]
pub enum ResolveGranularity {
    /// Pod IPs from the Service's EndpointSlices (the default); also spelt `endpoints`.
    #[default]
    #[serde(alias = "endpoints")]
    Endpoint,
    /// The Service's ClusterIP.
    Service,
}

/// Reference to an `ApisixUpstream` in the route's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixRouteUpstreamReference {
    /// `ApisixUpstream` name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Relative weight in a split. Default 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub weight: Option<i32>,
}

impl ApisixRouteUpstreamReference {
    /// `weight`, or [`DEFAULT_WEIGHT`] when unset.
    pub fn weight_or_default(&self) -> i32 {
        self.weight.unwrap_or(DEFAULT_WEIGHT)
    }
}

/// Authentication of an HTTP rule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixRouteAuthentication {
    /// Whether authentication is on.
    pub enable: bool,
    /// Which auth plugin to use; consumers provide the matching credentials.
    #[serde(rename = "type")]
    pub type_: AuthType,
    /// key-auth settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_auth: Option<ApisixRouteAuthenticationKeyAuth>,
    /// jwt-auth settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt_auth: Option<ApisixRouteAuthenticationJwtAuth>,
    /// ldap-auth settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ldap_auth: Option<ApisixRouteAuthenticationLdapAuth>,
}

/// Authentication type of a route (and credential kinds of a consumer).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum AuthType {
    /// `keyAuth`: the key-auth plugin.
    #[serde(rename = "keyAuth")]
    KeyAuth,
    /// `basicAuth`: the basic-auth plugin.
    #[serde(rename = "basicAuth")]
    BasicAuth,
    /// `jwtAuth`: the jwt-auth plugin.
    #[serde(rename = "jwtAuth")]
    JwtAuth,
    /// `hmacAuth`: the hmac-auth plugin.
    #[serde(rename = "hmacAuth")]
    HmacAuth,
    /// `wolfRBAC`: the wolf-rbac plugin.
    #[serde(rename = "wolfRBAC")]
    WolfRbac,
    /// `ldapAuth`: the ldap-auth plugin.
    #[serde(rename = "ldapAuth")]
    LdapAuth,
}

/// key-auth settings of a route.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixRouteAuthenticationKeyAuth {
    /// Header carrying the key. Default `apikey`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
}

/// jwt-auth settings of a route.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixRouteAuthenticationJwtAuth {
    /// Header carrying the token. Default `authorization`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// Query argument carrying the token. Default `jwt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// Cookie carrying the token. Default `jwt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<String>,
}

/// ldap-auth settings of a route.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ApisixRouteAuthenticationLdapAuth {
    /// Base DN for searches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_dn: Option<String>,
    /// LDAP server URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ldap_uri: Option<String>,
    /// Use TLS to the LDAP server. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_tls: Option<bool>,
    /// User id attribute. Default `cn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// One L4 rule of an `ApisixRoute`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixRouteStream {
    /// Rule name, unique within the object.
    #[schemars(length(min = 1))]
    pub name: String,
    /// L4 protocol.
    pub protocol: StreamProtocol,
    /// What connections this rule matches.
    #[serde(rename = "match")]
    pub match_: ApisixRouteStreamMatch,
    /// The Service to forward to.
    pub backend: ApisixRouteStreamBackend,
    /// Stream plugins.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub plugins: Vec<ApisixRoutePlugin>,
}

/// Protocol of a stream rule.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum StreamProtocol {
    /// `TCP`
    #[serde(rename = "TCP")]
    Tcp,
    /// `UDP`
    #[serde(rename = "UDP")]
    Udp,
}

/// Match of a stream rule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixRouteStreamMatch {
    /// Port the dataplane listens on for this rule (statically configured).
    #[schemars(range(min = 1, max = 65535))]
    pub ingress_port: i32,
    /// SNI host to match (TLS passthrough).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// Backend of a stream rule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixRouteStreamBackend {
    /// Service name (same namespace as the route).
    #[schemars(length(min = 1))]
    pub service_name: String,
    /// Service port, by number or by name.
    pub service_port: IntOrString,
    /// How to resolve the Service. Default `endpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolve_granularity: Option<ResolveGranularity>,
    /// Subset name, defined in the `ApisixUpstream` of the Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset: Option<String>,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}
