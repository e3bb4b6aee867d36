//! `HTTPRoute`: HTTP routing rules attached to Gateway listeners.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::shared::{
    BackendObjectReference, HttpHeaderFilter, HttpRequestMirrorFilter, LocalObjectReference,
    ParentReference, RouteStatus, null_default,
};

/// Spec of an `HTTPRoute`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "HTTPRoute",
    plural = "httproutes",
    namespaced,
    status = "RouteStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteSpec {
    /// Gateways (or listeners) to attach to.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub parent_refs: Vec<ParentReference>,
    /// Host names (exact or `*.` wildcard) matched against the Host header; empty: the
    /// listeners' host names.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub hostnames: Vec<String>,
    /// Rules; empty means one rule matching `/` prefix without backends (the API server
    /// defaults it).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub rules: Vec<HttpRouteRule>,
}

/// `HTTPRouteRule`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteRule {
    /// Optional rule name (used in route ids when set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Any match selects the rule; empty: `PathPrefix /`.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub matches: Vec<HttpRouteMatch>,
    /// Filters applied to every request of the rule.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub filters: Vec<HttpRouteFilter>,
    /// Weighted backends; empty: requests get a redirect (from a filter) or 500.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub backend_refs: Vec<HttpBackendRef>,
    /// Request and backend-request timeouts (Gateway API durations such as `10s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<HttpRouteTimeouts>,
    /// When to send a failed request again (experimental channel, `HTTPRouteRetry`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<HttpRouteRetry>,
}

/// `HTTPRouteRetry`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteRetry {
    /// Response status codes (400-599) to retry on.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub codes: Vec<i32>,
    /// Most retries of one request (at least 1); unset: implementation-specific.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,
    /// Least wait between retries (a Gateway API duration); unset: implementation-specific.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
}

/// `HTTPRouteTimeouts`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteTimeouts {
    /// Whole request, client to response; `0s` disables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// One attempt to a backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request: Option<String>,
}

/// `HTTPRouteMatch`: all given conditions must hold.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteMatch {
    /// Path match; unset: `PathPrefix /`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathMatch>,
    /// Header matches.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub headers: Vec<HttpHeaderMatch>,
    /// Query parameter matches.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub query_params: Vec<HttpQueryParamMatch>,
    /// Upper-case method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// `HTTPPathMatch`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpPathMatch {
    /// `Exact`, `PathPrefix` (default) or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The path; default `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// `HTTPHeaderMatch`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeaderMatch {
    /// `Exact` (default) or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Header name (case-insensitive).
    pub name: String,
    /// Value to match.
    pub value: String,
}

/// `HTTPQueryParamMatch`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpQueryParamMatch {
    /// `Exact` (default) or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Parameter name (case-sensitive).
    pub name: String,
    /// Value to match.
    pub value: String,
}

/// `HTTPRouteFilter`: `type` says which of the other fields is set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteFilter {
    /// `RequestHeaderModifier`, `ResponseHeaderModifier`, `RequestMirror`,
    /// `RequestRedirect`, `URLRewrite`, `CORS` or `ExtensionRef`.
    #[serde(rename = "type")]
    pub type_: String,
    /// For `RequestHeaderModifier`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_header_modifier: Option<HttpHeaderFilter>,
    /// For `ResponseHeaderModifier`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_header_modifier: Option<HttpHeaderFilter>,
    /// For `RequestMirror`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_mirror: Option<HttpRequestMirrorFilter>,
    /// For `RequestRedirect`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_redirect: Option<HttpRequestRedirectFilter>,
    /// For `URLRewrite`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_rewrite: Option<HttpUrlRewriteFilter>,
    /// For `CORS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<HttpCorsFilter>,
    /// For `ExtensionRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension_ref: Option<LocalObjectReference>,
}

/// `HTTPCORSFilter`: the answers to cross-origin requests (Gateway API v1.6, standard
/// channel).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpCorsFilter {
    /// Origins allowed: `<scheme>://<host>[:<port>]`, where the host may start with `*.`
    /// (any number of labels) or be `*`; or `*` alone (every origin).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allow_origins: Vec<String>,
    /// Whether `Access-Control-Allow-Credentials: true` is sent; default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_credentials: Option<bool>,
    /// Methods allowed, or `*` alone.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allow_methods: Vec<String>,
    /// Request headers allowed, or `*` alone.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allow_headers: Vec<String>,
    /// Response headers exposed to scripts, or `*`.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub expose_headers: Vec<String>,
    /// Seconds a preflight answer may be cached; default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<i32>,
}

/// `HTTPPathModifier`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpPathModifier {
    /// `ReplaceFullPath` or `ReplacePrefixMatch`.
    #[serde(rename = "type")]
    pub type_: String,
    /// For `ReplaceFullPath`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_full_path: Option<String>,
    /// For `ReplacePrefixMatch` (only with a `PathPrefix` match).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_prefix_match: Option<String>,
}

/// `HTTPRequestRedirectFilter`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRequestRedirectFilter {
    /// `http` or `https`; default: the request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Default: the request's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Default: the request's path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathModifier>,
    /// Default: derived from the scheme or the listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// 301 or 302 (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<i32>,
}

/// `HTTPURLRewriteFilter`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpUrlRewriteFilter {
    /// New Host header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// New path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathModifier>,
}

/// `HTTPBackendRef`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpBackendRef {
    /// The backend.
    #[serde(flatten)]
    pub backend: BackendObjectReference,
    /// Relative weight; default 1, 0 = no traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    /// Filters applied to requests sent to this backend only.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub filters: Vec<HttpRouteFilter>,
}
