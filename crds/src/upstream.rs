//! `ApisixUpstream`: per-Service upstream settings (named after the Service), or a standalone
//! upstream of `externalNodes` referenced from routes.
// NB: kube's `printcolumn(...)` repeats keys such as `type_` by design; clippy mistakes them
// for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{ApisixSecret, ApisixStatus, DEFAULT_WEIGHT, UpstreamTimeout, null_as_default};
use crate::duration::DURATION_PATTERN;

/// Spec of an `ApisixUpstream`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "apisix.apache.org",
    version = "v2",
    kind = "ApisixUpstream",
    namespaced,
    shortname = "au",
    status = "ApisixStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "ApisixUpstream configures load balancing, health checks, timeouts and TLS for the \
           Service of the same name, or defines external nodes.",
    printcolumn(
        name = "Scheme",
        type_ = "string",
        json_path = ".spec.scheme",
        description = "Protocol to the upstream"
    ),
    printcolumn(
        name = "LB",
        type_ = "string",
        json_path = ".spec.loadbalancer.type",
        description = "Load balancing algorithm"
    ),
    printcolumn(
        name = "External Nodes",
        type_ = "string",
        json_path = ".spec.externalNodes[*].name",
        description = "External node names",
        priority = 1
    ),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Accepted")].status"#,
        description = "Whether the controller accepted the upstream"
    ),
    printcolumn(
        name = "Programmed",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Programmed")].status"#,
        description = "Whether the dataplanes serve the upstream"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ApisixUpstreamSpec {
    /// IngressClass this object belongs to; unset means the default IngressClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_class_name: Option<String>,
    /// Nodes outside the cluster (or ExternalName Services) used instead of Service endpoints.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub external_nodes: Vec<ApisixUpstreamExternalNode>,
    /// Settings for every port of the Service.
    #[serde(flatten)]
    pub config: ApisixUpstreamConfig,
    /// Per-port overrides of `config`.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub port_level_settings: Vec<PortLevelSettings>,
}

/// Upstream settings, at Service level or port level.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixUpstreamConfig {
    /// Load balancer. Default round robin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loadbalancer: Option<LoadBalancer>,
    /// Protocol to the upstream. Default `http`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<UpstreamScheme>,
    /// How many other nodes to try after a failure. Default: number of nodes - 1 (APISIX).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub retries: Option<i64>,
    /// Timeouts. Default 60s each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<UpstreamTimeout>,
    /// APISIX `retry_timeout`: how long after the first attempt a retry may still start, an
    /// integer number of seconds (as APISIX documents it) or a duration string such as
    /// `1500ms`; `0` disables it. Default: connect + read timeout counted from the first
    /// failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_timeout: Option<IntOrString>,
    /// Active and passive health checks. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    /// Client certificate Secret for mTLS to the upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_secret: Option<ApisixSecret>,
    /// Which name the upstream's certificate is verified for (schemes `https` and `grpcs`;
    /// the CA is `tlsSecret`'s `ca.crt`, else the system roots). Sluice extension, shaped
    /// like the Gateway API BackendTLSPolicy's `validation`. Default: the endpoint's address,
    /// with no SNI for an IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_verify: Option<UpstreamTlsVerify>,
    /// Named groups of endpoints selected by Pod labels (referenced by `backends[].subset`).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub subsets: Vec<ApisixUpstreamSubset>,
    /// Which Host header the upstream sees. Default `pass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_host: Option<PassHost>,
    /// Host header sent when `passHost` is `rewrite`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_host: Option<String>,
}

/// Port-level override of the Service-level upstream settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortLevelSettings {
    /// Service port these settings apply to.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Settings overriding the Service-level ones for this port.
    #[serde(flatten)]
    pub config: ApisixUpstreamConfig,
}

/// An external node of an `ApisixUpstream`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixUpstreamExternalNode {
    /// Domain name or IP (type `Domain`), or ExternalName Service name (type `Service`).
    #[schemars(length(min = 1))]
    pub name: String,
    /// Kind of node. Default `Domain`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<ExternalNodeType>,
    /// Relative weight. Default 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub weight: Option<i32>,
    /// Port. Default: by scheme (80 for http/grpc, 443 for https/grpcs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

impl ApisixUpstreamExternalNode {
    /// `weight`, or [`DEFAULT_WEIGHT`] when unset.
    pub fn weight_or_default(&self) -> i32 {
        self.weight.unwrap_or(DEFAULT_WEIGHT)
    }
}

/// Kind of external node.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ExternalNodeType {
    /// A domain name or IP address.
    #[default]
    Domain,
    /// A Kubernetes ExternalName Service in the same namespace.
    Service,
}

/// Load balancer settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancer {
    /// Algorithm. Default `roundrobin`.
    #[serde(rename = "type", default)]
    pub type_: LoadBalancerType,
    /// What `chash` hashes on. Default `vars`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_on: Option<HashOn>,
    /// Hash key: a variable, header or cookie name, depending on `hashOn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Load balancing algorithm.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LoadBalancerType {
    /// Weighted round robin (the default).
    #[default]
    #[serde(rename = "roundrobin")]
    RoundRobin,
    /// Consistent hashing on `hashOn`/`key`.
    #[serde(rename = "chash")]
    Chash,
    /// Exponentially weighted moving average of latency.
    Ewma,
    /// Fewest active connections.
    LeastConn,
}

/// Input of consistent hashing.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HashOn {
    /// An APISIX variable named by `key` (the default).
    #[default]
    Vars,
    /// A request header named by `key`.
    Header,
    /// A cookie named by `key`.
    Cookie,
    /// The authenticated consumer name.
    Consumer,
    /// A template combining variables, e.g. `$host$remote_addr`.
    VarsCombinations,
}

/// Protocol used to talk to the upstream.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamScheme {
    /// HTTP/1.1 cleartext (the default).
    #[default]
    Http,
    /// HTTP over TLS.
    Https,
    /// gRPC over h2c.
    Grpc,
    /// gRPC over TLS.
    Grpcs,
}

/// Which Host header the upstream receives.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PassHost {
    /// The client's Host header (the default).
    #[default]
    Pass,
    /// The upstream node's host (and port).
    Node,
    /// `upstreamHost`.
    Rewrite,
}

/// A named group of endpoints, selected by Pod labels.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApisixUpstreamSubset {
    /// Subset name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Pod labels that select the subset's endpoints.
    pub labels: BTreeMap<String, String>,
}

/// Health checks of an upstream.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    /// Active probing (required when `healthCheck` is set).
    pub active: ActiveHealthCheck,
    /// Passive checks based on live traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passive: Option<PassiveHealthCheck>,
}

/// Kind of health check probe.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HealthCheckType {
    /// HTTP request (the default).
    #[default]
    Http,
    /// HTTPS request.
    Https,
    /// TCP connect.
    Tcp,
}

/// Active health check settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveHealthCheck {
    /// Probe kind. Default `http`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<HealthCheckType>,
    /// Probe timeout: an integer number of seconds (as APISIX documents it) or a duration string
    /// such as `1500ms`. Default 1s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<IntOrString>,
    /// How many nodes are probed at the same time. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub concurrency: Option<i32>,
    /// Host header of HTTP probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Port to probe. Default: the node's port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 65535))]
    pub port: Option<i32>,
    /// Path of HTTP probes. Default `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_path: Option<String>,
    /// Verify the upstream certificate of HTTPS probes. Default true.
    #[serde(rename = "strictTLS", default, skip_serializing_if = "Option::is_none")]
    pub strict_tls: Option<bool>,
    /// Extra request headers of HTTP probes, as `Name: value` strings.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub request_headers: Vec<String>,
    /// When a node counts as healthy again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<ActiveHealthCheckHealthy>,
    /// When a node counts as unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy: Option<ActiveHealthCheckUnhealthy>,
}

/// Active health check: healthy thresholds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveHealthCheckHealthy {
    /// Status codes that count as success. Default `[200, 302]`.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(inner(range(min = 100, max = 599)))]
    pub http_codes: Vec<i32>,
    /// Consecutive successes to become healthy. Default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 254))]
    pub successes: Option<i32>,
    /// Probe interval of healthy nodes, a duration of at least 1s. Default 1s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DURATION_PATTERN))]
    pub interval: Option<String>,
}

/// Active health check: unhealthy thresholds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveHealthCheckUnhealthy {
    /// Status codes that count as failure. Default `[429, 404, 500, 501, 502, 503, 504, 505]`.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(inner(range(min = 100, max = 599)))]
    pub http_codes: Vec<i32>,
    /// Consecutive HTTP failures to become unhealthy. Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 254))]
    pub http_failures: Option<i32>,
    /// Consecutive TCP failures to become unhealthy. Default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 254))]
    pub tcp_failures: Option<i32>,
    /// Consecutive probe timeouts to become unhealthy (a count, not a duration). Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 254))]
    pub timeout: Option<i32>,
    /// Probe interval of unhealthy nodes, a duration of at least 1s. Default 1s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DURATION_PATTERN))]
    pub interval: Option<String>,
}

/// Passive health check settings (judged from live traffic).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PassiveHealthCheck {
    /// Traffic kind. Default `http`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<HealthCheckType>,
    /// When a node counts as healthy again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<PassiveHealthCheckHealthy>,
    /// When a node counts as unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy: Option<PassiveHealthCheckUnhealthy>,
}

/// Passive health check: healthy thresholds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PassiveHealthCheckHealthy {
    /// Status codes that count as success.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(inner(range(min = 100, max = 599)))]
    pub http_codes: Vec<i32>,
    /// Consecutive successes to become healthy. Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 254))]
    pub successes: Option<i32>,
}

/// Passive health check: unhealthy thresholds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PassiveHealthCheckUnhealthy {
    /// Status codes that count as failure. Default `[429, 500, 503]`.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(inner(range(min = 100, max = 599)))]
    pub http_codes: Vec<i32>,
    /// Consecutive HTTP failures to become unhealthy. Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 254))]
    pub http_failures: Option<i32>,
    /// Consecutive TCP failures to become unhealthy. Default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 254))]
    pub tcp_failures: Option<i32>,
    /// Consecutive timeouts to become unhealthy (a count). Default 7.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 254))]
    pub timeout: Option<i32>,
}

/// `tlsVerify`: the name an upstream's certificate is verified for.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamTlsVerify {
    /// Sent as SNI, and the name the certificate must carry unless `subjectAltNames` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub hostname: Option<String>,
    /// The certificate must carry one of these instead of `hostname` (which is then only
    /// sent as SNI).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub subject_alt_names: Vec<UpstreamSubjectAltName>,
}

/// One subject alternative name: a DNS name or a URI (e.g. a SPIFFE ID).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamSubjectAltName {
    /// `Hostname` or `URI`.
    #[serde(rename = "type")]
    #[schemars(regex(pattern = r"^(Hostname|URI)$"))]
    pub type_: String,
    /// For type `Hostname`: a DNS name (a certificate wildcard covers it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// For type `URI`: compared exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
}
