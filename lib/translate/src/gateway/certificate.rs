//! The certificate of an HTTPS listener: its first `certificateRefs` entry, checked by the
//! ApisixTls code path ([`crate::tls`]) so both kinds can never disagree on what a usable
//! certificate is.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sluice_crds::ApisixTls;
use sluice_crds::gateway::{Listener, SecretObjectReference};
use sluice_proto::v1;

use super::listeners::{Inputs, Owner};
use super::{Output, granted, reason};
use crate::{Index, Options};

/// Why a listener has no certificate: (reason, message) for its `ResolvedRefs`.
type Refusal = (&'static str, String);

/// The certificate of HTTPS listener `l` (index `i`) of `g` (a Gateway or a ListenerSet);
/// notes in `out` when its verdict changes with time.
pub(super) fn listener_certificate(
    g: &Owner<'_>,
    i: usize,
    l: &Listener,
    inputs: &Inputs<'_, '_>,
    out: &mut Output,
) -> Result<v1::TlsCertificate, Refusal> {
    let field = format!("spec.listeners[{i}].tls.certificateRefs");
    let (r, secret_ns) = certificate_ref(g, l, inputs, &field)?;
    let source = format!("{} {}/{} listener {}", g.kind, g.ns, g.name, l.name);
    let Some(hostname) = l.hostname.as_deref() else {
        // A listener without a hostname serves its certificate to every host no other
        // listener names: the default certificate, checked like every other one. It claims
        // no host, so listeners with hostnames keep theirs.
        let ((cert_chain_pem, private_key_pem), at) =
            crate::tls::any_host_certificate(inputs.idx, secret_ns, &r.name, inputs.opts.now)
                .map_err(|m| (reason::INVALID_CERTIFICATE_REF, format!("{field}[0]: {m}")))?;
        if let Some(at) = at {
            out.changes_at = Some(out.changes_at.map_or(at, |n| n.min(at)));
        }
        return Ok(v1::TlsCertificate {
            id: g.certificate_id(&l.name),
            source,
            hosts: Vec::new(),
            cert_chain_pem,
            private_key_pem,
            client_auth: None,
        });
    };
    let mut cert = checked_like_apisix_tls(g, l, hostname, r, secret_ns, inputs, &field, out)?;
    cert.source = source;
    cert.id = g.certificate_id(&l.name);
    Ok(cert)
}

/// The first `certificateRefs` entry and its namespace: a core Secret, in the namespace of
/// the listener's Gateway or ListenerSet, or one whose ReferenceGrant allows it (a grant
/// `from` that kind: a Gateway's grant does not cover its ListenerSets).
fn certificate_ref<'l>(
    g: &Owner<'l>,
    l: &'l Listener,
    inputs: &Inputs<'_, '_>,
    field: &str,
) -> Result<(&'l SecretObjectReference, &'l str), Refusal> {
    let ns = g.ns;
    let refs = l
        .tls
        .as_ref()
        .map(|t| t.certificate_refs.as_slice())
        .unwrap_or_default();
    let Some(r) = refs.first() else {
        return Err((
            reason::INVALID_CERTIFICATE_REF,
            format!("{field}: an HTTPS listener needs a certificate"),
        ));
    };
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Secret");
    if !group.is_empty() || kind != "Secret" {
        return Err((
            reason::INVALID_CERTIFICATE_REF,
            format!("{field}[0]: {group}/{kind} is not supported (core Secret)"),
        ));
    }
    let secret_ns = r.namespace.as_deref().unwrap_or(ns);
    let grants = &inputs.state.reference_grants;
    if secret_ns != ns && !granted(grants, g.kind, ns, "", "Secret", secret_ns, &r.name) {
        return Err((
            reason::REF_NOT_PERMITTED,
            format!(
                "{field}[0]: Secret {secret_ns}/{} is in another namespace and no ReferenceGrant \
                 there allows it",
                r.name
            ),
        ));
    }
    Ok((r, secret_ns))
}

/// The certificate for `hostname`, checked as a stand-in ApisixTls would be.
#[allow(clippy::too_many_arguments)]
fn checked_like_apisix_tls(
    g: &Owner<'_>,
    l: &Listener,
    hostname: &str,
    r: &SecretObjectReference,
    secret_ns: &str,
    inputs: &Inputs<'_, '_>,
    field: &str,
    out: &mut Output,
) -> Result<v1::TlsCertificate, Refusal> {
    let stand_in = ApisixTls {
        metadata: ObjectMeta {
            name: Some(format!("{}/{}", g.name, l.name)),
            namespace: Some(g.ns.to_owned()),
            creation_timestamp: g.meta.creation_timestamp.clone(),
            ..Default::default()
        },
        spec: sluice_crds::ApisixTlsSpec {
            hosts: vec![hostname.to_ascii_lowercase()],
            secret: sluice_crds::ApisixSecret {
                name: r.name.clone(),
                namespace: secret_ns.to_owned(),
            },
            ..Default::default()
        },
        status: None,
    };
    let mut tlses = BTreeMap::new();
    tlses.insert(crate::key(&stand_in.metadata), &stand_in);
    let mini = Index {
        routes: BTreeMap::new(),
        ingresses: BTreeMap::new(),
        upstreams: BTreeMap::new(),
        services: BTreeMap::new(),
        slices: BTreeMap::new(),
        secrets: inputs.idx.secrets.clone(),
        config_maps: BTreeMap::new(),
        plugin_configs: BTreeMap::new(),
        consumers: BTreeMap::new(),
        global_rules: BTreeMap::new(),
        tlses,
        pod_labels: BTreeMap::new(),
        // NB: the Gateway's own ReferenceGrant was checked above; the stand-in's reference
        // is the Gateway's, not an ApisixTls's.
        grants: &[],
        cross_namespace_refs: crate::refs::CrossNamespaceRefs::Allow,
        nginx_classes: Vec::new(),
        nginx_config: Default::default(),
    };
    let tls_opts = Options {
        now: inputs.opts.now,
        ..Options::default()
    };
    let mut t = crate::tls::translate(&mini, &tls_opts);
    if let Some(at) = t.changes_at {
        out.changes_at = Some(out.changes_at.map_or(at, |n| n.min(at)));
    }
    t.certificates.pop().ok_or_else(|| {
        let message = t
            .apisix
            .first()
            .and_then(|s| s.conditions.first())
            .map(|c| c.message.replacen("spec.secret", &format!("{field}[0]"), 1))
            .unwrap_or_else(|| format!("{field}[0]: not usable"));
        (reason::INVALID_CERTIFICATE_REF, message)
    })
}
