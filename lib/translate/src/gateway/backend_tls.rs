//! BackendTLSPolicy → TLS to the backends of HTTPRoutes and GRPCRoutes, and the policy
//! status (`status.ancestors[]`).
//!
//! - A policy targets core Services (`targetRefs`, group `""`, kind `Service`), all ports or
//!   the port named `sectionName`; other target kinds are not used. A backendRef to a
//!   targeted Service port gets scheme `https` (`grpcs` from a GRPCRoute), SNI =
//!   `validation.hostname`, and its certificate verified against the CA bundle of
//!   `validation.caCertificateRefs` (ConfigMaps, and Secrets as an implementation-specific
//!   extension, key `ca.crt`) or the system roots (`wellKnownCACertificates: System`). The
//!   name verified is the hostname, or, with `subjectAltNames`, one of those (Hostname or
//!   URI; the hostname is then only sent as SNI). The upstream id gets `@tls`.
//! - Precedence: a policy naming the port (`sectionName`) wins over one naming the whole
//!   Service; among policies with the same target the older one (`creationTimestamp`), then
//!   the first by namespace/name, wins; the others are `Accepted=False` (`Conflicted`).
//! - A policy without a usable CA (every `caCertificateRefs` entry missing, malformed or of
//!   another kind: `Accepted=False`, `NoValidCACertificate`), or whose validation is
//!   otherwise invalid (`Accepted=False`, `Invalid`), still takes its targets: their
//!   backends get an upstream without endpoints (`@tls-invalid`), so requests to them fail
//!   with 503 and never reach the backend in plain text.
//! - Status: one `ancestors[]` entry per Gateway a route using a targeted backend is
//!   attached to (the same conditions on each): `Accepted` and `ResolvedRefs`
//!   (`InvalidCACertificateRef`, `InvalidKind`). A policy no route of Sluice's Gateways uses
//!   gets no entry.
//! - With the Gateway's `spec.tls.backend.clientCertificateRef` (a `kubernetes.io/tls`
//!   Secret), the dataplane presents that certificate to the TLS backends of the Gateway's
//!   routes (upstream id `@tls:<gateway ns>/<gateway name>`). A route attached to several
//!   Gateways uses the first one's (by namespace/name) that has one.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use sluice_crds::gateway::{BackendTLSPolicy, ParentReference, SecretObjectReference};
use sluice_crds::gateway::{GATEWAY_GROUP, Gateway};
use sluice_proto::v1;

use super::{ACCEPTED, RESOLVED_REFS, cond, granted};
use crate::status::Condition;
use crate::{ClusterState, Index};

/// Reasons of the BackendTLSPolicy conditions (the Gateway API constants' values).
pub mod policy_reason {
    /// `Accepted` = True.
    pub const ACCEPTED: &str = "Accepted";
    /// `Accepted` = False: another policy takes precedence for a target.
    pub const CONFLICTED: &str = "Conflicted";
    /// `Accepted` = False: the validation settings cannot be used.
    pub const INVALID: &str = "Invalid";
    /// `Accepted` = False: no `caCertificateRefs` entry is usable.
    pub const NO_VALID_CA_CERTIFICATE: &str = "NoValidCACertificate";
    /// `ResolvedRefs` = True.
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    /// `ResolvedRefs` = False: a CA reference is missing or holds no usable `ca.crt`.
    pub const INVALID_CA_CERTIFICATE_REF: &str = "InvalidCACertificateRef";
    /// `ResolvedRefs` = False: a CA reference of a kind Sluice does not read.
    pub const INVALID_KIND: &str = "InvalidKind";
    /// Gateway `ResolvedRefs` = False: `spec.tls.backend.clientCertificateRef` is unusable.
    pub const INVALID_CLIENT_CERTIFICATE_REF: &str = "InvalidClientCertificateRef";
}

/// (namespace, Service, port name) a backendRef resolved to.
type Use = (String, String, Option<String>);

/// One policy with its verdict.
struct Verdict<'a> {
    policy: &'a BackendTLSPolicy,
    ns: &'a str,
    name: &'a str,
    /// The TLS settings; `None`: invalid, connections to its targets must fail.
    tls: Option<v1::UpstreamTls>,
    accepted: Condition,
    resolved_refs: Condition,
}

/// A Gateway's backend client certificate: (PEM chain, PEM key), or why it is unusable.
type ClientCert = Result<(String, String), String>;

/// Every BackendTLSPolicy with its verdict, which one wins each target, and the targets the
/// routes being translated use.
pub(crate) struct Policies<'a> {
    verdicts: Vec<Verdict<'a>>,
    /// (namespace, Service, sectionName) → index into `verdicts` of the winner.
    winners: BTreeMap<(&'a str, &'a str, Option<&'a str>), usize>,
    /// Backend client certificates of the Gateways that name one, by (namespace, name).
    client_certs: BTreeMap<(String, String), ClientCert>,
    /// The Gateways of the route being translated (set by [`Policies::start_route`]).
    route_gateways: RefCell<Vec<(String, String)>>,
    /// Targets used by the route being translated.
    uses: RefCell<BTreeSet<Use>>,
    /// Gateways whose routes used each target: (namespace, Service, port name) → Gateways.
    used_by: RefCell<BTreeMap<Use, BTreeSet<(String, String)>>>,
}

/// The TLS a backend gets from the winning policy.
pub(crate) enum BackendTls {
    /// Verified TLS with these settings; `String` is the upstream id suffix.
    Tls(v1::UpstreamTls, String),
    /// The policy is invalid: no connection at all.
    Refused,
}

fn created(p: &BackendTLSPolicy) -> Option<i64> {
    p.metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
}

impl<'a> Policies<'a> {
    /// Validates every policy of `state` and resolves conflicts.
    pub(crate) fn new(state: &'a ClusterState, idx: &Index<'_>) -> Self {
        let mut sorted: Vec<&BackendTLSPolicy> = state.backend_tls_policies.iter().collect();
        // NB: no creationTimestamp (files) sorts first, like the oldest.
        sorted.sort_by(|a, b| {
            (created(a), crate::key(&a.metadata)).cmp(&(created(b), crate::key(&b.metadata)))
        });
        let mut verdicts = Vec::new();
        let mut winners = BTreeMap::new();
        for policy in sorted {
            let (ns, name) = crate::key(&policy.metadata);
            let (tls, accepted, resolved_refs) = validate(policy, ns, idx);
            let i = verdicts.len();
            let mut lost = Vec::new();
            for t in &policy.spec.target_refs {
                if !t.group.is_empty() || t.kind != "Service" {
                    continue;
                }
                let key = (ns, t.name.as_str(), t.section_name.as_deref());
                match winners.get(&key) {
                    Some(&w) => lost.push((t, w)),
                    None => {
                        winners.insert(key, i);
                    }
                }
            }
            let accepted = match lost.first() {
                Some((t, w)) => {
                    let winner: &Verdict<'_> = &verdicts[*w];
                    let port = t
                        .section_name
                        .as_deref()
                        .map(|s| format!(" port {s}"))
                        .unwrap_or_default();
                    cond(
                        ACCEPTED,
                        false,
                        policy_reason::CONFLICTED,
                        format!(
                            "BackendTLSPolicy {}/{} (older, or first by name) already targets \
                             Service {ns}/{}{port}",
                            winner.ns, winner.name, t.name
                        ),
                    )
                }
                None => accepted,
            };
            verdicts.push(Verdict {
                policy,
                ns,
                name,
                tls,
                accepted,
                resolved_refs,
            });
        }
        let client_certs = state
            .gateways
            .iter()
            .filter_map(|g| {
                let r = backend_client_certificate_ref(g)?;
                let (ns, name) = crate::key(&g.metadata);
                let cert = client_certificate(&r, ns, name, idx, &state.reference_grants);
                Some(((ns.to_owned(), name.to_owned()), cert))
            })
            .collect();
        Self {
            verdicts,
            winners,
            client_certs,
            route_gateways: RefCell::default(),
            uses: RefCell::default(),
            used_by: RefCell::default(),
        }
    }

    /// Starts the translation of a route attached to `gateways`.
    pub(crate) fn start_route(&self, gateways: &BTreeSet<(String, String)>) {
        *self.route_gateways.borrow_mut() = gateways.iter().cloned().collect();
        self.uses.borrow_mut().clear();
    }

    /// Ends the route started last: when it `attached`, the targets it used count for the
    /// status of the policies (their ancestors are its Gateways).
    pub(crate) fn end_route(&self, attached: bool) {
        let uses = std::mem::take(&mut *self.uses.borrow_mut());
        if !attached {
            return;
        }
        let gateways = self.route_gateways.borrow();
        let mut used_by = self.used_by.borrow_mut();
        for u in uses {
            used_by
                .entry(u)
                .or_default()
                .extend(gateways.iter().cloned());
        }
    }

    /// The TLS of a backend to Service `ns/svc`, port named `port_name`; `None` when no
    /// policy targets it.
    pub(crate) fn backend(
        &self,
        ns: &str,
        svc: &str,
        port_name: Option<&str>,
    ) -> Option<BackendTls> {
        let i = port_name
            .and_then(|p| self.winners.get(&(ns, svc, Some(p))))
            .or_else(|| self.winners.get(&(ns, svc, None)))?;
        self.uses.borrow_mut().insert((
            ns.to_owned(),
            svc.to_owned(),
            port_name.map(str::to_owned),
        ));
        let v = &self.verdicts[*i];
        let Some(tls) = &v.tls else {
            return Some(BackendTls::Refused);
        };
        let mut tls = tls.clone();
        let mut suffix = "@tls".to_owned();
        let gateways = self.route_gateways.borrow();
        if let Some(((gns, gname), (cert, key))) = gateways.iter().find_map(|g| {
            let c = self.client_certs.get(g)?.as_ref().ok()?;
            Some((g, c))
        }) {
            tls.client_cert_pem = cert.clone();
            tls.client_key_pem = key.clone();
            suffix = format!("@tls:{gns}/{gname}");
        }
        Some(BackendTls::Tls(tls, suffix))
    }

    /// The Gateway's `ResolvedRefs` for its backend client certificate, when it names one:
    /// `Ok(())` when usable, else `Err((reason, message))`.
    pub(crate) fn client_certificate_verdict(
        &self,
        ns: &str,
        name: &str,
    ) -> Option<Result<(), (&'static str, String)>> {
        Some(
            match self.client_certs.get(&(ns.to_owned(), name.to_owned()))? {
                Ok(_) => Ok(()),
                Err(m) if m.starts_with("RefNotPermitted:") => Err((
                    super::reason::REF_NOT_PERMITTED,
                    m.trim_start_matches("RefNotPermitted:").to_owned(),
                )),
                Err(m) => Err((policy_reason::INVALID_CLIENT_CERTIFICATE_REF, m.clone())),
            },
        )
    }

    /// The status of every policy some route of Sluice's Gateways uses, by namespace/name.
    pub(crate) fn status(&self, controller_name: &str) -> Vec<BackendTlsPolicyStatus> {
        let used_by = self.used_by.borrow();
        let mut out: Vec<BackendTlsPolicyStatus> = self
            .verdicts
            .iter()
            .filter_map(|v| {
                let (ns, _) = crate::key(&v.policy.metadata);
                let mut gateways: BTreeSet<&(String, String)> = BTreeSet::new();
                for t in &v.policy.spec.target_refs {
                    if !t.group.is_empty() || t.kind != "Service" {
                        continue;
                    }
                    for ((uns, usvc, uport), gws) in used_by.iter() {
                        let port_ok = t
                            .section_name
                            .as_deref()
                            .is_none_or(|s| Some(s) == uport.as_deref());
                        if uns == ns && *usvc == t.name && port_ok {
                            gateways.extend(gws.iter());
                        }
                    }
                }
                if gateways.is_empty() {
                    return None;
                }
                let ancestors = gateways
                    .into_iter()
                    .map(|(gns, gname)| PolicyAncestor {
                        ancestor_ref: ParentReference {
                            group: Some(GATEWAY_GROUP.to_owned()),
                            kind: Some("Gateway".to_owned()),
                            namespace: Some(gns.clone()),
                            name: gname.clone(),
                            section_name: None,
                            port: None,
                        },
                        conditions: vec![v.accepted.clone(), v.resolved_refs.clone()],
                    })
                    .collect();
                Some(BackendTlsPolicyStatus {
                    namespace: v.ns.to_owned(),
                    name: v.name.to_owned(),
                    generation: v.policy.metadata.generation,
                    controller_name: controller_name.to_owned(),
                    ancestors,
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        out
    }
}

/// Status of a BackendTLSPolicy that a route of Sluice's Gateways uses.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendTlsPolicyStatus {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.generation`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// The `controllerName` of the entries.
    pub controller_name: String,
    /// One entry per Gateway, by namespace/name.
    pub ancestors: Vec<PolicyAncestor>,
}

/// One `status.ancestors[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyAncestor {
    /// The Gateway.
    pub ancestor_ref: ParentReference,
    /// `Accepted`, `ResolvedRefs`.
    pub conditions: Vec<Condition>,
}

/// The policy's TLS settings (`None` when unusable) and its `Accepted` and `ResolvedRefs`
/// conditions (before conflicts).
fn validate(
    policy: &BackendTLSPolicy,
    ns: &str,
    idx: &Index<'_>,
) -> (Option<v1::UpstreamTls>, Condition, Condition) {
    let v = &policy.spec.validation;
    let resolved = || {
        cond(
            RESOLVED_REFS,
            true,
            policy_reason::RESOLVED_REFS,
            "every reference resolved",
        )
    };
    let invalid = |m: String| {
        (
            None,
            cond(ACCEPTED, false, policy_reason::INVALID, m),
            resolved(),
        )
    };
    let hostname = v.hostname.to_ascii_lowercase();
    if hostname.contains('*') || crate::validate::host(&hostname).is_err() {
        return invalid(format!(
            "spec.validation.hostname: {:?} is not a DNS name",
            v.hostname
        ));
    }
    let mut tls = v1::UpstreamTls {
        sni: hostname,
        ..Default::default()
    };
    for (i, san) in v.subject_alt_names.iter().enumerate() {
        let field = format!("spec.validation.subjectAltNames[{i}]");
        match (san.type_.as_str(), &san.hostname, &san.uri) {
            ("Hostname", Some(h), _) if !h.is_empty() => {
                let h = h.to_ascii_lowercase();
                if h.starts_with("*.") || crate::validate::host(&h).is_err() {
                    return invalid(format!("{field}.hostname: {h:?} is not a DNS name"));
                }
                tls.subject_alt_dns_names.push(h);
            }
            ("URI", _, Some(u)) if u.contains(':') => tls.subject_alt_uris.push(u.clone()),
            (t, _, _) => {
                return invalid(format!(
                    "{field}: type {t:?} needs its value (Hostname: hostname, URI: an absolute uri)"
                ));
            }
        }
    }
    match (
        &v.well_known_ca_certificates,
        v.ca_certificate_refs.is_empty(),
    ) {
        (Some(_), false) => invalid(
            "spec.validation: caCertificateRefs and wellKnownCACertificates are exclusive".into(),
        ),
        (Some(w), true) if w == "System" => (
            Some(tls),
            cond(ACCEPTED, true, policy_reason::ACCEPTED, "accepted"),
            resolved(),
        ),
        (Some(w), true) => invalid(format!(
            "spec.validation.wellKnownCACertificates: {w:?} is not supported (only System)"
        )),
        (None, true) => invalid(
            "spec.validation: one of caCertificateRefs or wellKnownCACertificates is required"
                .into(),
        ),
        (None, false) => {
            let mut bundle = String::new();
            let mut problems: Vec<(&'static str, String)> = Vec::new();
            for (i, r) in v.ca_certificate_refs.iter().enumerate() {
                let field = format!("spec.validation.caCertificateRefs[{i}]");
                match ca_bundle(r, ns, idx) {
                    Ok(pem) => {
                        bundle.push_str(pem.trim_end());
                        bundle.push('\n');
                    }
                    Err((reason, m)) => problems.push((reason, format!("{field}: {m}"))),
                }
            }
            let resolved_refs = match problems.first() {
                None => resolved(),
                Some((reason, _)) => {
                    let all: Vec<String> = problems.iter().map(|(_, m)| m.clone()).collect();
                    cond(RESOLVED_REFS, false, reason, all.join("; "))
                }
            };
            if bundle.is_empty() {
                let m = "no caCertificateRefs entry holds a usable CA certificate; requests to \
                         the targeted backends fail";
                return (
                    None,
                    cond(ACCEPTED, false, policy_reason::NO_VALID_CA_CERTIFICATE, m),
                    resolved_refs,
                );
            }
            tls.ca_pem = bundle;
            (
                Some(tls),
                cond(ACCEPTED, true, policy_reason::ACCEPTED, "accepted"),
                resolved_refs,
            )
        }
    }
}

/// The `ca.crt` of a ConfigMap (or Secret) in `ns`: PEM certificates that parse.
fn ca_bundle(
    r: &sluice_crds::gateway::LocalObjectReference,
    ns: &str,
    idx: &Index<'_>,
) -> Result<String, (&'static str, String)> {
    let missing = |what: &str| {
        (
            policy_reason::INVALID_CA_CERTIFICATE_REF,
            format!("{what} {ns}/{} not found", r.name),
        )
    };
    let pem = match (r.group.as_str(), r.kind.as_str()) {
        ("", "ConfigMap") => idx
            .config_maps
            .get(&(ns, r.name.as_str()))
            .ok_or_else(|| missing("ConfigMap"))?
            .data
            .as_ref()
            .and_then(|d| d.get("ca.crt"))
            .cloned(),
        ("", "Secret") => idx
            .secrets
            .get(&(ns, r.name.as_str()))
            .map(|s| crate::tls::secret_value(s, "ca.crt"))
            .ok_or_else(|| missing("Secret"))?
            .and_then(|b| String::from_utf8(b.into_owned()).ok()),
        (g, k) => {
            return Err((
                policy_reason::INVALID_KIND,
                format!("{g}/{k} is not a supported kind (core ConfigMap or Secret)"),
            ));
        }
    };
    let pem = pem.ok_or_else(|| {
        (
            policy_reason::INVALID_CA_CERTIFICATE_REF,
            format!("{} {ns}/{} has no key ca.crt", r.kind, r.name),
        )
    })?;
    if !certificates_parse(&pem) {
        return Err((
            policy_reason::INVALID_CA_CERTIFICATE_REF,
            format!(
                "{} {ns}/{}: ca.crt holds no valid PEM certificate",
                r.kind, r.name
            ),
        ));
    }
    Ok(pem)
}

/// Whether `pem` holds at least one certificate and every one is a usable trust anchor, as
/// the dataplane loads them (so it can never refuse the snapshot for it).
fn certificates_parse(pem: &str) -> bool {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let Ok(certs) = CertificateDer::pem_slice_iter(pem.as_bytes()).collect::<Result<Vec<_>, _>>()
    else {
        return false;
    };
    let mut roots = rustls::RootCertStore::empty();
    !certs.is_empty() && certs.into_iter().all(|c| roots.add(c).is_ok())
}

/// `spec.tls.backend.clientCertificateRef` of a Gateway.
fn backend_client_certificate_ref(g: &Gateway) -> Option<SecretObjectReference> {
    let r = g
        .spec
        .tls
        .as_ref()?
        .get("backend")?
        .get("clientCertificateRef")?;
    serde_json::from_value(r.clone()).ok()
}

/// The client certificate `r` of Gateway `ns/name` names: `tls.crt` and `tls.key` of a core
/// Secret (in another namespace only with a ReferenceGrant). `Err` messages of a refused
/// cross-namespace reference start with `RefNotPermitted:`.
fn client_certificate(
    r: &SecretObjectReference,
    ns: &str,
    name: &str,
    idx: &Index<'_>,
    grants: &[sluice_crds::gateway::ReferenceGrant],
) -> ClientCert {
    let field = "spec.tls.backend.clientCertificateRef";
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Secret");
    if !group.is_empty() || kind != "Secret" {
        return Err(format!(
            "{field}: {group}/{kind} is not supported (core Secret)"
        ));
    }
    let sns = r.namespace.as_deref().unwrap_or(ns);
    if sns != ns && !granted(grants, "Gateway", ns, "", "Secret", sns, &r.name) {
        return Err(format!(
            "RefNotPermitted:{field}: Secret {sns}/{} is in another namespace and no \
             ReferenceGrant there allows Gateway {ns}/{name} to use it",
            r.name
        ));
    }
    // NB: checked as a listener certificate is (key matches, PEM, X.509), so the dataplane
    // never refuses the snapshot for it; expiry is left to the backend to judge.
    crate::tls::any_host_certificate(idx, sns, &r.name, None)
        .map(|(pems, _)| pems)
        .map_err(|m| format!("{field}: {m}"))
}
