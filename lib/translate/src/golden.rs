//! The golden-case layout, shared by this crate's golden test, `kubectl-sluice`'s tests and
//! the dataplane's translate mutation test, so all three read the same cases the same way.
//!
//! `testdata/<family>/<case>.in.yaml` holds objects as a user writes them;
//! `<case>.out.yaml` next to it what [`render`] makes of them. The families are the input
//! families of translation (`apisix`, `ingress`, `gateway`) and `load` (what the YAML loader
//! reports). A first line `# options: key=value ...` of an input sets [`Options`] fields
//! (see [`options`]).
//!
//! Regenerate the outputs after an intended change, then review the diff:
//!
//! ```text
//! SLUICE_UPDATE_GOLDEN=1 cargo test -p sluice-translate --test golden
//! git diff lib/translate/testdata
//! ```

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::gateway::GatewayStatusReport;
use crate::{ClusterState, IngressStatus, LoadReport, ObjectStatus, Options, StatusReport};

/// The family whose outputs show the Gateway API view (see [`render`]).
pub const GATEWAY_FAMILY: &str = "gateway";

/// One golden case.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Case {
    /// The folder under `testdata/`: `apisix`, `ingress`, `gateway`, `load`.
    pub family: String,
    /// The file name without `.in.yaml`.
    pub name: String,
    /// `<family>/<name>.in.yaml`.
    pub input: PathBuf,
    /// `<family>/<name>.out.yaml`.
    pub output: PathBuf,
}

impl Case {
    /// `<family>/<name>`, for messages.
    pub fn id(&self) -> String {
        format!("{}/{}", self.family, self.name)
    }

    /// The name the input is loaded under (load reports name it).
    pub fn file_name(&self) -> String {
        format!("{}.in.yaml", self.name)
    }
}

/// Every case under `testdata` (a crate's `testdata/` folder), sorted by family and name.
pub fn cases(testdata: &Path) -> std::io::Result<Vec<Case>> {
    let mut out = Vec::new();
    for family in std::fs::read_dir(testdata)? {
        let family = family?.path();
        if !family.is_dir() {
            continue;
        }
        let family_name = file_name(&family);
        for file in std::fs::read_dir(&family)? {
            let input = file?.path();
            let Some(name) = file_name(&input)
                .strip_suffix(".in.yaml")
                .map(str::to_owned)
            else {
                continue;
            };
            out.push(Case {
                family: family_name.clone(),
                output: family.join(format!("{name}.out.yaml")),
                name,
                input,
            });
        }
    }
    out.sort();
    Ok(out)
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The [`Options`] a first line `# options: k=v ...` of `input` asks for: `ingress_class=<name>
/// now=<unix seconds> default_certificate=<ns>/<name> fallback_sni=<host>
/// controller_name=<name> http_port=<n> https_port=<n> listener_ports=<first>-<last>
/// allow_cross_namespace_refs=true stream_ports=tcp:9100,udp:9200,tls:9443`.
/// `Err` names an unknown key or a bad value.
pub fn options(input: &str) -> Result<Options, String> {
    let mut opts = Options::default();
    let Some(rest) = input
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("# options:"))
    else {
        return Ok(opts);
    };
    for kv in rest.split_whitespace() {
        let bad = |what: &str| format!("golden option {kv:?}: {what}");
        let port = |v: &str| v.parse::<u16>().map_err(|e| bad(&e.to_string()));
        match kv.split_once('=') {
            Some(("ingress_class", v)) => opts.ingress_class = Some(v.to_owned()),
            Some(("now", v)) => {
                let secs: u64 = v.parse().map_err(|_| bad("now=<unix seconds>"))?;
                opts.now = Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs));
            }
            Some(("default_certificate", v)) => {
                opts.default_certificate =
                    Some(crate::parse_secret_ref(v).map_err(|_| bad("NS/NAME"))?);
            }
            Some(("fallback_sni", v)) => opts.fallback_sni = Some(v.to_owned()),
            Some(("allow_cross_namespace_refs", "true")) => {
                opts.cross_namespace_refs = crate::CrossNamespaceRefs::Allow;
            }
            Some(("controller_name", v)) => opts.gateway.controller_name = v.to_owned(),
            Some(("http_port", v)) => opts.gateway.http_port = port(v)?,
            Some(("https_port", v)) => opts.gateway.https_port = port(v)?,
            Some(("listener_ports", v)) => {
                let (a, b) = v.split_once('-').ok_or_else(|| bad("<first>-<last>"))?;
                opts.gateway.listener_ports = Some(port(a)?..=port(b)?);
            }
            Some(("stream_ports", v)) => {
                opts.stream_ports = crate::parse_stream_ports(v).map_err(|e| bad(&e))?;
            }
            _ => return Err(bad("unknown key")),
        }
    }
    Ok(opts)
}

/// The output of `case` for `input` (its `.in.yaml`), as its `.out.yaml` must read.
///
/// Two views: the `gateway` family shows the routes, upstreams, certificates and listeners
/// without key material and the Gateway API status; every other family the whole snapshot
/// (canonical protobuf JSON mapping), the status report, Ingress verdicts, settings problems
/// and `certificatesChangeAt`. Both show the load report when it is not empty.
pub fn render(case: &Case, input: &str) -> Result<String, String> {
    let mut state = ClusterState::new();
    let report = state
        .load_yaml(&case.file_name(), input)
        .map_err(|e| format!("{}: {e}", case.id()))?;
    let t = crate::translate(&state, &options(input)?);
    let load = (!report.errors.is_empty() || !report.notes.is_empty()).then_some(&report);
    let yaml = if case.family == GATEWAY_FAMILY {
        let view = gateway_view(load, &t).map_err(|e| e.to_string())?;
        format!("{GATEWAY_HEADER}{}", to_yaml(&view)?)
    } else {
        format!("{HEADER}{}", to_yaml(&full_view(load, &t))?)
    };
    Ok(yaml)
}

fn to_yaml(v: &impl Serialize) -> Result<String, String> {
    serde_yaml::to_string(v).map_err(|e| e.to_string())
}

// NB: the headers name the harnesses the outputs were first written by; they stay
// byte-identical until the outputs are regenerated on purpose.
const HEADER: &str = "# Generated by the golden test from the matching .in.yaml; regenerate with\n\
                      # SLUICE_UPDATE_GOLDEN=1 cargo test -p sluice-translate --test golden\n";
const GATEWAY_HEADER: &str = "# Generated by the Gateway API golden test from the other files of this directory;\n\
                              # regenerate with SLUICE_UPDATE_GOLDEN=1 cargo test -p sluice-translate --test golden\n";

/// The `apisix`, `ingress` and `load` view.
#[derive(Serialize)]
struct FullView<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    load: Option<&'a LoadReport>,
    snapshot: &'a sluice_proto::v1::Snapshot,
    status: &'a StatusReport,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    ingresses: &'a [IngressStatus],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    settings: &'a [String],
    /// `Translation::certificates_change_at` in unix seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(rename = "certificatesChangeAt")]
    certificates_change_at: Option<u64>,
}

fn full_view<'a>(load: Option<&'a LoadReport>, t: &'a crate::Translation) -> FullView<'a> {
    FullView {
        load,
        snapshot: &t.snapshot,
        status: &t.status,
        ingresses: &t.ingresses,
        settings: &t.settings,
        certificates_change_at: t
            .certificates_change_at
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs()),
    }
}

/// A certificate without its key material.
#[derive(Serialize)]
struct Certificate<'a> {
    id: &'a str,
    source: &'a str,
    hosts: &'a [String],
}

/// A per-Gateway port without key material.
#[derive(Serialize)]
struct Listener<'a> {
    id: &'a str,
    source: &'a str,
    port: u32,
    tls: bool,
    /// `TLS`, `TCP` or `UDP`; left out for HTTP.
    #[serde(skip_serializing_if = "Option::is_none")]
    protocol: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    certificates: Vec<Certificate<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    default_certificate: Option<&'a str>,
    /// Its Gateway listeners (hostname isolation) and their routes.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    sections: &'a [sluice_proto::v1::ListenerSection],
    #[serde(skip_serializing_if = "Option::is_none")]
    client_validation: Option<ClientValidation>,
    /// Peers trusted to send the PROXY header it requires (empty: any); left out when it
    /// requires none.
    #[serde(skip_serializing_if = "Option::is_none")]
    proxy_protocol_from: Option<&'a [String]>,
}

/// A port's frontend client-certificate validation, the CA bundle counted, not shown.
#[derive(Serialize)]
struct ClientValidation {
    ca_certificates: usize,
    insecure_fallback: bool,
}

fn certificate(c: &sluice_proto::v1::TlsCertificate) -> Certificate<'_> {
    Certificate {
        id: &c.id,
        source: &c.source,
        hosts: &c.hosts,
    }
}

/// The `gateway` view.
#[derive(Serialize)]
struct GatewayView<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    load: Option<&'a LoadReport>,
    routes: serde_json::Value,
    /// TLSRoutes, TCPRoutes and UDPRoutes.
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    stream_routes: serde_json::Value,
    upstreams: serde_json::Value,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    certificates: Vec<Certificate<'a>>,
    /// The default certificate (served for hosts no certificate names), by source.
    #[serde(skip_serializing_if = "Option::is_none")]
    default_certificate: Option<&'a str>,
    /// Per-Gateway ports, their certificates without key material.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    listeners: Vec<Listener<'a>>,
    gateway: &'a GatewayStatusReport,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    apisix: &'a [ObjectStatus],
}

fn gateway_view<'a>(
    load: Option<&'a LoadReport>,
    t: &'a crate::Translation,
) -> serde_json::Result<GatewayView<'a>> {
    let snap = &t.snapshot;
    Ok(GatewayView {
        load,
        routes: serde_json::to_value(&snap.routes)?,
        stream_routes: if snap.stream_routes.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::to_value(&snap.stream_routes)?
        },
        upstreams: serde_json::to_value(&snap.upstreams)?,
        certificates: snap.tls_certificates.iter().map(certificate).collect(),
        default_certificate: snap.default_certificate.as_ref().map(|c| c.source.as_str()),
        listeners: snap
            .listeners
            .iter()
            .map(|l| Listener {
                id: &l.id,
                source: &l.source,
                port: l.port,
                tls: l.tls,
                protocol: match sluice_proto::v1::ListenerProtocol::try_from(l.protocol) {
                    Ok(sluice_proto::v1::ListenerProtocol::Tls) => Some("TLS"),
                    Ok(sluice_proto::v1::ListenerProtocol::Tcp) => Some("TCP"),
                    Ok(sluice_proto::v1::ListenerProtocol::Udp) => Some("UDP"),
                    _ => None,
                },
                certificates: l.tls_certificates.iter().map(certificate).collect(),
                default_certificate: l.default_certificate.as_ref().map(|c| c.source.as_str()),
                sections: &l.sections,
                client_validation: l.client_validation.as_ref().map(|v| ClientValidation {
                    ca_certificates: v.ca_pem.matches("-----BEGIN CERTIFICATE-----").count(),
                    insecure_fallback: v.insecure_fallback,
                }),
                proxy_protocol_from: l
                    .accept_proxy_protocol
                    .then_some(l.proxy_protocol_trusted.as_slice()),
            })
            .collect(),
        gateway: &t.status.gateway,
        apisix: &t.status.objects,
    })
}
