//! Frontend client-certificate validation: Gateway `spec.tls.frontend` (`default`, and
//! `perPort` overriding it for the HTTPS listeners of one port).
//!
//! - Served only with per-Gateway ports ([`super::GatewayOptions::listener_ports`]): each
//!   port's certificates then verify clients against its CA bundle
//!   (`Listener.client_validation`). On the shared HTTPS port an HTTPS listener of a
//!   Gateway with `spec.tls` stays `Accepted=False` (`UnsupportedValue`), since that port's
//!   certificates serve every Gateway.
//! - `caCertificateRefs`: a core ConfigMap (Core support) or Secret (Sluice's own
//!   extension), key `ca.crt`, PEM, every certificate usable as a trust anchor; in another
//!   namespace only with a ReferenceGrant there. The usable ones are joined into one
//!   bundle. Any unusable one: the port's HTTPS listeners get `ResolvedRefs=False`
//!   (`InvalidCACertificateKind` for another kind, `RefNotPermitted` without a grant, else
//!   `InvalidCACertificateRef`), naming the reference; none usable: also `Accepted=False`
//!   (`NoValidCACertificate`) and they serve nothing. Plain HTTP listeners are not
//!   affected.
//! - `mode: AllowValidOnly` (default): the handshake needs a valid client certificate.
//!   `AllowInsecureFallback`: one is asked for, but every client is served; the Gateway gets
//!   `InsecureFrontendValidationMode=True` (`ConfigurationChanged`).

use serde::Deserialize;
use sluice_proto::v1;

use super::listeners::{GatewayRef, Inputs};
use super::{granted, reason};

/// Why a reference is unusable: (listener `ResolvedRefs` reason, message).
pub(super) type Refusal = (&'static str, String);

/// `spec.tls` as far as Sluice reads it.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct GatewayTls {
    #[serde(default)]
    frontend: Option<Frontend>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Frontend {
    #[serde(default)]
    default: Option<TlsConfig>,
    #[serde(default)]
    per_port: Vec<PerPort>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PerPort {
    port: i32,
    #[serde(default)]
    tls: TlsConfig,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct TlsConfig {
    #[serde(default)]
    validation: Option<Validation>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Validation {
    #[serde(default)]
    ca_certificate_refs: Vec<ObjectRef>,
    #[serde(default)]
    mode: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    name: String,
    #[serde(default)]
    namespace: Option<String>,
}

/// The validation of one port's HTTPS listeners.
pub(super) struct PortValidation {
    /// What the port's certificates verify with.
    pub(super) validation: v1::FrontendValidation,
    /// The first unusable reference when some others are usable (`ResolvedRefs=False`).
    pub(super) partly: Option<Refusal>,
}

/// Whether `g` asks for the insecure fallback on some port (its
/// `InsecureFrontendValidationMode` condition).
pub(super) fn insecure_fallback(g: &GatewayRef<'_>) -> bool {
    let Ok(Some(f)) = frontend(g) else {
        return false;
    };
    f.default
        .iter()
        .chain(f.per_port.iter().map(|p| &p.tls))
        .filter_map(|t| t.validation.as_ref())
        .any(|v| v.mode.as_deref() == Some("AllowInsecureFallback"))
}

fn frontend(g: &GatewayRef<'_>) -> Result<Option<Frontend>, String> {
    let Some(raw) = &g.gw.spec.tls else {
        return Ok(None);
    };
    let tls: GatewayTls =
        serde_json::from_value(raw.clone()).map_err(|e| format!("spec.tls: {e}"))?;
    Ok(tls.frontend)
}

/// The validation for the HTTPS listeners of `g` on `port`: `Ok(None)` when none applies;
/// `Err` (`ResolvedRefs` reason and message) when no CA reference is usable.
pub(super) fn for_port(
    g: &GatewayRef<'_>,
    port: i32,
    inputs: &Inputs<'_, '_>,
) -> Result<Option<PortValidation>, Refusal> {
    let f = frontend(g).map_err(|m| (reason::INVALID_CA_CERTIFICATE_REF, m))?;
    let Some(f) = f else {
        return Ok(None);
    };
    let (field, config) = match f.per_port.iter().position(|p| p.port == port) {
        Some(i) => (
            format!("spec.tls.frontend.perPort[{i}].tls"),
            Some(&f.per_port[i].tls),
        ),
        None => ("spec.tls.frontend.default".to_owned(), f.default.as_ref()),
    };
    let Some(v) = config.and_then(|c| c.validation.as_ref()) else {
        return Ok(None);
    };
    let insecure_fallback = match v.mode.as_deref().unwrap_or("AllowValidOnly") {
        "AllowValidOnly" => false,
        "AllowInsecureFallback" => true,
        other => {
            return Err((
                reason::INVALID_CA_CERTIFICATE_REF,
                format!(
                    "{field}.validation.mode: {other} is not a mode (AllowValidOnly, AllowInsecureFallback)"
                ),
            ));
        }
    };
    let mut bundle = String::new();
    let mut first_refusal = None;
    for (i, r) in v.ca_certificate_refs.iter().enumerate() {
        let at = format!("{field}.validation.caCertificateRefs[{i}]");
        match ca_of(g, r, inputs) {
            Ok(pem) => bundle.push_str(&pem),
            Err((why, m)) => {
                first_refusal.get_or_insert((why, format!("{at}: {m}")));
            }
        }
    }
    if bundle.is_empty() {
        return Err(first_refusal.unwrap_or((
            reason::INVALID_CA_CERTIFICATE_REF,
            format!("{field}.validation.caCertificateRefs: empty"),
        )));
    }
    Ok(Some(PortValidation {
        validation: v1::FrontendValidation {
            ca_pem: bundle,
            insecure_fallback,
        },
        partly: first_refusal,
    }))
}

/// The CA bundle one reference names, checked.
fn ca_of(g: &GatewayRef<'_>, r: &ObjectRef, inputs: &Inputs<'_, '_>) -> Result<String, Refusal> {
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("");
    if !group.is_empty() || !matches!(kind, "ConfigMap" | "Secret") {
        let gk = if group.is_empty() {
            kind.to_owned()
        } else {
            format!("{group}/{kind}")
        };
        return Err((
            reason::INVALID_CA_CERTIFICATE_KIND,
            format!("{gk} is not supported (core ConfigMap or Secret)"),
        ));
    }
    let ns = r.namespace.as_deref().unwrap_or(g.ns);
    let grants = &inputs.state.reference_grants;
    if ns != g.ns && !granted(grants, "Gateway", g.ns, "", kind, ns, &r.name) {
        return Err((
            reason::REF_NOT_PERMITTED,
            format!(
                "{kind} {ns}/{} is in another namespace and no ReferenceGrant there allows it",
                r.name
            ),
        ));
    }
    let refused = |m: String| (reason::INVALID_CA_CERTIFICATE_REF, m);
    if kind == "Secret" {
        return crate::tls::client_ca(inputs.idx, ns, &r.name).map_err(refused);
    }
    let what = format!("ConfigMap {ns}/{}", r.name);
    let cm = inputs
        .state
        .config_maps
        .iter()
        .find(|c| {
            c.metadata
                .namespace
                .as_deref()
                .unwrap_or(crate::state::DEFAULT_NAMESPACE)
                == ns
                && c.metadata.name.as_deref() == Some(r.name.as_str())
        })
        .ok_or_else(|| refused(format!("{what} not found")))?;
    let raw = cm
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .ok_or_else(|| refused(format!("{what} has no ca.crt")))?;
    crate::tls::ca_bundle(&format!("{what}: ca.crt"), raw).map_err(refused)
}
