//! [`Options`]: how to translate.

use crate::gateway;
use crate::refs::CrossNamespaceRefs;

/// How to translate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// `None` (the default, used by standalone mode): translate every object. `Some(class)`:
    /// only objects whose `spec.ingressClassName` is `class` or unset (for Ingresses: see the
    /// crate docs).
    pub ingress_class: Option<String>,
    /// The time certificates must be valid at (the controller and standalone mode pass the
    /// current time). `None` (the default): validity periods are not checked.
    pub now: Option<std::time::SystemTime>,
    /// (namespace, name) of the kubernetes.io/tls Secret served to handshakes without SNI or
    /// for a host no certificate covers (`--default-ssl-certificate NS/NAME`, as in
    /// ingress-nginx). `None` (the default): those handshakes are refused.
    pub default_certificate: Option<(String, String)>,
    /// A ClientHello without SNI gets the certificate of this host (APISIX
    /// `apisix.ssl.fallback_sni`; `--fallback-sni`). `None` (the default): not set.
    pub fallback_sni: Option<String>,
    /// Which cross-namespace references of the APISIX kinds (ApisixUpstream `tlsSecret`,
    /// ApisixTls `secret` and `client.caSecret`, ApisixRoute `plugin_config_namespace`) are
    /// honoured; default: only those a ReferenceGrant allows (see [`crate::refs`]).
    pub cross_namespace_refs: CrossNamespaceRefs,
    /// Gateway API settings (controller name, served ports); see [`gateway`].
    pub gateway: gateway::GatewayOptions,
}
