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
    /// The fleet-wide layer-4 ports ApisixRoute `spec.stream` rules may use
    /// (`--stream-ports tcp:9100,udp:9200,tls:9443`, from the chart's
    /// `dataplane.stream.ports`); each becomes a `Snapshot.listeners` entry
    /// `stream/<protocol>/<port>`. Empty (the default): every stream rule is refused.
    pub stream_ports: Vec<StreamPort>,
    /// Ingress classes served in ingress-nginx's place (`--ingress-nginx-class`): their
    /// Ingresses are ours too, and their `nginx.ingress.kubernetes.io/*` annotations are
    /// honoured with ingress-nginx's behaviour (see `ingress::nginx`). Empty (the default):
    /// none.
    pub nginx_classes: Vec<String>,
    /// ingress-nginx's ConfigMap settings for those classes (`--ingress-nginx-config
    /// KEY=VALUE`; keys of `ingress::nginx::CONFIG_KEYS`, checked with
    /// `ingress::nginx::check_config`). Unset keys take ingress-nginx's defaults.
    pub nginx_config: std::collections::BTreeMap<String, String>,
}

/// The flag that declares [`Options::stream_ports`].
pub const STREAM_PORTS_FLAG: &str = "--stream-ports";

/// What a declared stream port speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StreamPortProtocol {
    /// Raw TCP (`tcp:<port>`).
    Tcp,
    /// UDP datagrams (`udp:<port>`).
    Udp,
    /// TCP with TLS terminated by SNI with the ApisixTls certificates (`tls:<port>`), as an
    /// APISIX `stream_proxy.tcp` entry with `tls: true`.
    Tls,
}

impl StreamPortProtocol {
    /// The lower-case name used in the flag and in listener ids.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Tls => "tls",
        }
    }
}

/// One declared stream port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamPort {
    /// What it speaks.
    pub protocol: StreamPortProtocol,
    /// The port the dataplanes listen on (and clients reach through the dataplane Service).
    pub port: u16,
}

impl StreamPort {
    /// The `Snapshot.listeners` id: `stream/<protocol>/<port>`.
    pub fn listener_id(&self) -> String {
        format!("stream/{}/{}", self.protocol.as_str(), self.port)
    }
}

/// Parses `--stream-ports`: comma-separated `tcp:<port>`, `udp:<port>` or `tls:<port>`,
/// sorted on return. A port number may be both TCP (or TLS) and UDP, never declared twice on
/// one transport. An empty string declares none.
pub fn parse_stream_ports(s: &str) -> Result<Vec<StreamPort>, String> {
    let mut out: Vec<StreamPort> = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (proto, port) = item
            .split_once(':')
            .ok_or_else(|| format!("{item:?}: expected tcp:<port>, udp:<port> or tls:<port>"))?;
        let protocol = match proto.to_ascii_lowercase().as_str() {
            "tcp" => StreamPortProtocol::Tcp,
            "udp" => StreamPortProtocol::Udp,
            "tls" => StreamPortProtocol::Tls,
            other => {
                return Err(format!(
                    "{item:?}: unknown protocol {other:?} (tcp, udp, tls)"
                ));
            }
        };
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{item:?}: {port:?} is not a port (1-65535)"))?;
        let udp = protocol == StreamPortProtocol::Udp;
        if let Some(o) = out
            .iter()
            .find(|o| o.port == port && (o.protocol == StreamPortProtocol::Udp) == udp)
        {
            return Err(format!(
                "{item:?}: port {port} is already declared as {}:{port}",
                o.protocol.as_str()
            ));
        }
        out.push(StreamPort { protocol, port });
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn stream_ports_parse() {
        let p = parse_stream_ports("tcp:9100, udp:9200,tls:9443,udp:9100").unwrap();
        let ids: Vec<String> = p.iter().map(StreamPort::listener_id).collect();
        assert_eq!(
            ids,
            [
                "stream/tcp/9100",
                "stream/udp/9100",
                "stream/udp/9200",
                "stream/tls/9443"
            ]
        );
        assert_eq!(parse_stream_ports("").unwrap(), Vec::new());
        for bad in [
            "tcp:0",
            "tcp",
            "sctp:1",
            "tcp:70000",
            "tcp:9100,tls:9100",
            "udp:1,udp:1",
        ] {
            assert!(parse_stream_ports(bad).is_err(), "{bad}");
        }
    }
}
