//! Server certificates: ApisixTls objects and Ingress `spec.tls[]` entries → snapshot
//! [`v1::TlsCertificate`]s, validated here so that a bad Secret is a condition on the object
//! that names it instead of a snapshot the dataplanes reject.
//!
//! - An ApisixTls becomes certificate `<ns>/<name>` (source `ApisixTls <ns>/<name>`) for its
//!   `spec.hosts` (lower-cased, deduplicated), from the kubernetes.io/tls Secret
//!   `spec.secret` (`tls.crt`: leaf first, then intermediates; `tls.key`). `spec.client`
//!   adds client verification: the CAs in `ca.crt` of `client.caSecret`, `depth` (default
//!   1, as APISIX) and `skip_mtls_uri_regex`.
//! - Ingress `spec.tls[k]` becomes certificate `<ns>/<name>/ingress-tls<k>` for its `hosts`
//!   from Secret `secretName` in the Ingress's namespace. An entry is independent of the
//!   Ingress's rules: a bad entry leaves the routes served (over HTTP and with the other
//!   certificates) and sets `ResolvedRefs=False` on the Ingress.
//! - A Secret of an ApisixTls in another namespace (`spec.secret`, `spec.client.caSecret`)
//!   needs a ReferenceGrant there or `--allow-cross-namespace-refs` ([`crate::refs`]);
//!   otherwise the ApisixTls is `Accepted=False` with reason `RefNotPermitted` and serves
//!   nothing, as with a missing Secret.
//! - Checks: the Secret exists; `tls.crt` holds PEM certificates that parse as X.509;
//!   `tls.key` holds one PEM private key (PKCS#8, PKCS#1 or SEC1) of a kind the dataplane can
//!   sign with, matching the leaf; with `Options::now` set, every certificate of the chain
//!   is valid at that time. The failure reason is `InvalidCertificateRef` and the message
//!   names the Secret, the key and the problem. An invalid ApisixTls is `Accepted=False` and
//!   serves nothing.
//! - A host is served by exactly one certificate. When two objects claim the same host, the
//!   older one (`metadata.creationTimestamp`, then ApisixTls before Ingress, then namespace
//!   and name) keeps it; the other is refused whole with reason `HostConflict` naming the
//!   holder, so adding an object never takes a host away from one already serving it. An
//!   exact host and a wildcard covering it do not conflict: the exact one wins per SNI.
//! - Default certificate ([`Options::default_certificate`], the `--default-ssl-certificate
//!   NS/NAME` flag as in ingress-nginx): the kubernetes.io/tls Secret is checked like any
//!   other and becomes the snapshot's `default_certificate`, served to a ClientHello without
//!   SNI or for a host no certificate covers. A bad one is left out (such handshakes stay
//!   refused) and reported in [`crate::Translation::settings`] naming the flag and the
//!   Secret; every other certificate is still served.
//! - Fallback SNI ([`Options::fallback_sni`], APISIX's `apisix.ssl.fallback_sni`): a
//!   ClientHello without SNI gets the certificate of this host. A host that no certificate
//!   covers is reported in [`crate::Translation::settings`] (it still goes into the
//!   snapshot: a certificate for it may be added later).
//! - Expiry: with `Options::now`, [`crate::Translation::certificates_change_at`] is the next
//!   time a verdict on a checked certificate changes (one second past the earliest
//!   `notAfter`, or the earliest future `notBefore`), so the caller can translate again
//!   then: an expired certificate becomes `Accepted=False` ("expired at ...") and is no
//!   longer served, without any object changing.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sluice_crds::ApisixTls;
use sluice_proto::v1;
use sluice_proto::validate::dns_name;

use crate::problems::Problems;
use crate::refs::{REASON_REF_NOT_PERMITTED, Referrer, Target};
use crate::status::{CONDITION_ACCEPTED, Condition, ConditionStatus, ObjectKind, ObjectStatus};
use crate::{Index, Options};

/// Reason of a condition when a referenced Secret is missing or does not hold a usable
/// certificate (the Gateway API name for the same problem).
pub const REASON_INVALID_CERTIFICATE_REF: &str = "InvalidCertificateRef";
/// Reason when a host is already served by an older object.
pub const REASON_HOST_CONFLICT: &str = "HostConflict";
/// `client.depth` when unset, as in APISIX.
const DEFAULT_CLIENT_DEPTH: u32 = 1;
/// Key of the server certificate chain in a kubernetes.io/tls Secret.
const TLS_CRT: &str = "tls.crt";
/// Key of the private key in a kubernetes.io/tls Secret.
const TLS_KEY: &str = "tls.key";
/// Key of the client CA bundle in an ApisixTls `client.caSecret`.
const CA_CRT: &str = "ca.crt";
/// Snapshot id of the default certificate.
pub const DEFAULT_CERTIFICATE_ID: &str = "default-certificate";
/// The controller and dataplane flag naming the default certificate's Secret.
pub const DEFAULT_CERTIFICATE_FLAG: &str = "--default-ssl-certificate";
/// The flag setting the fallback SNI.
pub const FALLBACK_SNI_FLAG: &str = "--fallback-sni";

/// The time certificates are checked against, and the next time a verdict changes.
struct Clock {
    /// Unix seconds; `None`: validity is not checked.
    now: Option<i64>,
    /// Earliest unix second after `now` at which a checked certificate's verdict changes.
    next: Cell<Option<i64>>,
}

impl Clock {
    /// Notes that a verdict changes at `at` (ignored when not in the future).
    fn changes_at(&self, at: i64) {
        if let Some(now) = self.now
            && at > now
        {
            self.next
                .set(Some(self.next.get().map_or(at, |n| n.min(at))));
        }
    }
}

/// An unresolved TLS entry of an Ingress: (reason, field, message).
pub(crate) type Unresolved = (&'static str, String, String);

/// What translation makes of ApisixTls objects and Ingress TLS entries.
#[derive(Default)]
pub(crate) struct TlsTranslation {
    /// Certificates to serve, sorted by id.
    pub(crate) certificates: Vec<v1::TlsCertificate>,
    /// Status of every ApisixTls of our class.
    pub(crate) apisix: Vec<ObjectStatus>,
    /// Per Ingress (namespace, name): unresolved (reason, field, message) of its TLS entries.
    pub(crate) ingress: BTreeMap<(String, String), Vec<Unresolved>>,
    /// The default certificate, if configured and valid.
    pub(crate) default_certificate: Option<v1::TlsCertificate>,
    /// The fallback SNI ("" when unset).
    pub(crate) fallback_sni: String,
    /// Problems with the TLS settings, one line each naming the flag.
    pub(crate) settings: Vec<String>,
    /// Next unix second at which a certificate verdict changes.
    pub(crate) changes_at: Option<i64>,
}

/// Who asked for a certificate.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Owner<'a> {
    /// ApisixTls (namespace, name).
    ApisixTls(&'a str, &'a str),
    /// Ingress (namespace, name) and the index in `spec.tls`.
    Ingress(&'a str, &'a str, usize),
}

impl Owner<'_> {
    fn describe(&self) -> String {
        match self {
            Owner::ApisixTls(ns, name) => format!("ApisixTls {ns}/{name}"),
            Owner::Ingress(ns, name, k) => format!("Ingress {ns}/{name} spec.tls[{k}]"),
        }
    }

    fn hosts_field(&self) -> String {
        match self {
            Owner::ApisixTls(..) => "spec.hosts".into(),
            Owner::Ingress(_, _, k) => format!("spec.tls[{k}].hosts"),
        }
    }
}

/// A valid certificate waiting for the host conflict check.
struct Candidate<'a> {
    /// Seconds of `creationTimestamp` (None first: standalone objects have none).
    created: Option<i64>,
    owner: Owner<'a>,
    cert: v1::TlsCertificate,
}

/// Translates every ApisixTls of the index and the TLS entries of its Ingresses.
pub(crate) fn translate(idx: &Index<'_>, opts: &Options) -> TlsTranslation {
    let clock = Clock {
        now: opts.now.map(unix_seconds),
        next: Cell::new(None),
    };
    let mut out = TlsTranslation::default();
    let mut claims = Claims::default();
    claims.apisix_tls(idx, &clock, &mut out);
    claims.ingresses(idx, &clock, &mut out);
    claims.settle(idx, &mut out);
    if let Some((ns, name)) = &opts.default_certificate {
        default_certificate(idx, ns, name, &clock, &mut out);
    }
    if let Some(raw) = &opts.fallback_sni {
        fallback_sni(raw, &mut out);
    }
    out.changes_at = clock.next.get();
    out
}

/// Valid certificates waiting for the host conflict check.
#[derive(Default)]
struct Claims<'a> {
    candidates: Vec<Candidate<'a>>,
    /// Verdicts of ApisixTls objects that got as far as the conflict check.
    pending: BTreeMap<(&'a str, &'a str), (Option<i64>, Problems)>,
}

impl<'a> Claims<'a> {
    /// Checks every ApisixTls: a valid one is a candidate, an invalid one gets its status.
    fn apisix_tls(&mut self, idx: &Index<'a>, now: &Clock, out: &mut TlsTranslation) {
        for (&(ns, name), atls) in &idx.tlses {
            let mut problems = Problems::default();
            let created = created(&atls.metadata);
            match apisix_tls(atls, ns, name, idx, now, &mut problems) {
                Ok(cert) if problems.is_valid() => {
                    self.candidates.push(Candidate {
                        created,
                        owner: Owner::ApisixTls(ns, name),
                        cert,
                    });
                    self.pending
                        .insert((ns, name), (atls.metadata.generation, problems));
                }
                Ok(_) => out.apisix.push(status(ns, name, atls, problems.accepted())),
                Err((reason, message)) => {
                    let condition = if problems.is_valid() {
                        Condition::new(CONDITION_ACCEPTED, ConditionStatus::False, reason, message)
                    } else {
                        problems.accepted()
                    };
                    out.apisix.push(status(ns, name, atls, condition));
                }
            }
        }
    }

    /// Checks the `spec.tls[]` entries of every Ingress.
    fn ingresses(&mut self, idx: &Index<'a>, now: &Clock, out: &mut TlsTranslation) {
        for (&(ns, name), ing) in &idx.ingresses {
            let created = created(&ing.metadata);
            for (k, result) in ingress_tls(ing, ns, name, idx, now).into_iter().enumerate() {
                match result {
                    Ok(Some(cert)) => self.candidates.push(Candidate {
                        created,
                        owner: Owner::Ingress(ns, name, k),
                        cert,
                    }),
                    Ok(None) => {}
                    Err((field, message)) => out
                        .ingress
                        .entry((ns.to_owned(), name.to_owned()))
                        .or_default()
                        .push((REASON_INVALID_CERTIFICATE_REF, field, message)),
                }
            }
        }
    }

    /// Oldest first; the first claim of a host keeps it. The certificates and the statuses
    /// of the ApisixTls objects still pending go into `out`.
    fn settle(mut self, idx: &Index<'a>, out: &mut TlsTranslation) {
        self.candidates
            .sort_by(|a, b| (a.created, a.owner).cmp(&(b.created, b.owner)));
        let mut claimed: BTreeMap<String, Owner<'_>> = BTreeMap::new();
        let mut certificates = BTreeMap::new();
        for c in self.candidates {
            let conflict = c.cert.hosts.iter().enumerate().find_map(|(i, h)| {
                claimed
                    .get(h)
                    .map(|holder| (i, h.clone(), holder.describe()))
            });
            if let Some((i, host, holder)) = conflict {
                let field = format!("{}[{i}]", c.owner.hosts_field());
                let message = format!("host {host} is already served by {holder}");
                conflicted(c.owner, field, message, idx, &mut self.pending, out);
                continue;
            }
            for h in &c.cert.hosts {
                claimed.insert(h.clone(), c.owner);
            }
            certificates.insert(c.cert.id.clone(), c.cert);
        }
        for ((ns, name), (_, problems)) in self.pending {
            if let Some(atls) = idx.tlses.get(&(ns, name)) {
                out.apisix.push(status(ns, name, atls, problems.accepted()));
            }
        }
        out.certificates = certificates.into_values().collect();
    }
}

/// A certificate turned away because another owner holds one of its hosts.
fn conflicted<'a>(
    owner: Owner<'a>,
    field: String,
    message: String,
    idx: &Index<'_>,
    pending: &mut BTreeMap<(&'a str, &'a str), (Option<i64>, Problems)>,
    out: &mut TlsTranslation,
) {
    match owner {
        Owner::ApisixTls(ns, name) => {
            pending.remove(&(ns, name));
            if let Some(atls) = idx.tlses.get(&(ns, name)) {
                let condition = Condition::new(
                    CONDITION_ACCEPTED,
                    ConditionStatus::False,
                    REASON_HOST_CONFLICT,
                    format!("{field}: {message}"),
                );
                out.apisix.push(status(ns, name, atls, condition));
            }
        }
        Owner::Ingress(ns, name, _) => out
            .ingress
            .entry((ns.to_owned(), name.to_owned()))
            .or_default()
            .push((REASON_HOST_CONFLICT, field, message)),
    }
}

/// The `--default-ssl-certificate` Secret `ns/name`, or a settings problem.
fn default_certificate(
    idx: &Index<'_>,
    ns: &str,
    name: &str,
    now: &Clock,
    out: &mut TlsTranslation,
) {
    match server_certificate(idx, ns, name, now) {
        Ok((cert_chain_pem, private_key_pem)) => {
            out.default_certificate = Some(v1::TlsCertificate {
                id: DEFAULT_CERTIFICATE_ID.into(),
                source: format!("{DEFAULT_CERTIFICATE_FLAG} {ns}/{name}"),
                hosts: Vec::new(),
                cert_chain_pem,
                private_key_pem,
                client_auth: None,
            });
        }
        Err(e) => out.settings.push(format!(
            "{DEFAULT_CERTIFICATE_FLAG} {ns}/{name}: {e}; handshakes without SNI or for \
             an unknown host are refused"
        )),
    }
}

/// `--fallback-sni`: a settings problem when it is invalid or no certificate covers it.
fn fallback_sni(raw: &str, out: &mut TlsTranslation) {
    match parse_fallback_sni(raw) {
        Ok(host) => {
            if !out.certificates.iter().any(|c| covers(&c.hosts, &host)) {
                out.settings.push(format!(
                    "{FALLBACK_SNI_FLAG} {host}: no certificate is served for this host"
                ));
            }
            out.fallback_sni = host;
        }
        Err(e) => out.settings.push(format!("{FALLBACK_SNI_FLAG}: {e}")),
    }
}

/// Whether one of `hosts` (exact or `*.` wildcard of one label) covers `host`.
fn covers(hosts: &[String], host: &str) -> bool {
    hosts.iter().any(|h| match h.strip_prefix("*.") {
        Some(suffix) => host
            .split_once('.')
            .is_some_and(|(_, parent)| parent == suffix),
        None => h == host,
    })
}

/// Parses `NS/NAME` (the `--default-ssl-certificate` value) into (namespace, name).
pub fn parse_secret_ref(raw: &str) -> Result<(String, String), String> {
    let Some((ns, name)) = raw.split_once('/') else {
        return Err(format!("{raw:?}: expected NAMESPACE/NAME"));
    };
    for (what, v) in [("namespace", ns), ("name", name)] {
        dns_name(v).map_err(|e| format!("{raw:?}: {what} {v:?}: {e}"))?;
    }
    Ok((ns.to_owned(), name.to_owned()))
}

/// Validates a `--fallback-sni` value: a host name (no wildcard), lower-cased.
pub fn parse_fallback_sni(raw: &str) -> Result<String, String> {
    if raw.starts_with("*.") {
        return Err(format!("{raw:?}: must be a host name, not a wildcard"));
    }
    sni_host(raw)
}

fn status(ns: &str, name: &str, atls: &ApisixTls, accepted: Condition) -> ObjectStatus {
    ObjectStatus {
        kind: ObjectKind::ApisixTls,
        namespace: ns.to_owned(),
        name: name.to_owned(),
        generation: atls.metadata.generation,
        conditions: vec![accepted],
        routes: Vec::new(),
    }
}

fn created(meta: &ObjectMeta) -> Option<i64> {
    meta.creation_timestamp.as_ref().map(|t| t.0.as_second())
}

fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// Validates and lower-cases SNI hosts; errors go to `problems` under `field[i]`.
fn hosts(raw: &[String], field: &str, problems: &mut Problems) -> Vec<String> {
    let mut out = Vec::with_capacity(raw.len());
    for (i, h) in raw.iter().enumerate() {
        match sni_host(h) {
            Ok(h) => out.push(h),
            Err(e) => problems.error(format!("{field}[{i}]"), e),
        }
    }
    out.sort();
    out.dedup();
    out
}

/// One SNI host: a DNS name, optionally with one leading `*.` label.
fn sni_host(raw: &str) -> Result<String, String> {
    let name = raw.strip_prefix("*.").unwrap_or(raw);
    if name.contains('*') {
        return Err(format!(
            "{raw:?}: a wildcard must be the whole first label, as in \"*.example.com\""
        ));
    }
    dns_name(name).map_err(|e| format!("{raw:?}: {e}"))?;
    Ok(raw.to_ascii_lowercase())
}

/// An ApisixTls; `Err` is a (reason, message) about its Secrets. Spec errors go to
/// `problems`.
fn apisix_tls(
    atls: &ApisixTls,
    ns: &str,
    name: &str,
    idx: &Index<'_>,
    now: &Clock,
    problems: &mut Problems,
) -> Result<v1::TlsCertificate, (&'static str, String)> {
    let spec = &atls.spec;
    let hosts = hosts(&spec.hosts, "spec.hosts", problems);
    if spec.hosts.is_empty() {
        problems.error("spec.hosts", "at least one host is required");
    }
    let client = spec.client.as_ref().map(|c| {
        let depth = match c.depth {
            None => DEFAULT_CLIENT_DEPTH,
            Some(d) => u32::try_from(d).unwrap_or_else(|_| {
                problems.error("spec.client.depth", format!("{d} must not be negative"));
                DEFAULT_CLIENT_DEPTH
            }),
        };
        for (i, r) in c.skip_mtls_uri_regex.iter().enumerate() {
            if let Err(e) = regex::Regex::new(r) {
                problems.error(
                    format!("spec.client.skip_mtls_uri_regex[{i}]"),
                    format!(
                        "{r:?} is not a valid regex: {}",
                        e.to_string()
                            .split_whitespace()
                            .collect::<Vec<_>>()
                            .join(" ")
                    ),
                );
            }
        }
        (c, depth)
    });
    let from = Referrer {
        kind: "ApisixTls",
        ns,
    };
    let secret_ns = non_empty(&spec.secret.namespace).unwrap_or(ns);
    idx.permit(from, Target::secret(secret_ns, &spec.secret.name))
        .map_err(|e| (REASON_REF_NOT_PERMITTED, format!("spec.secret: {e}")))?;
    let (cert_chain_pem, private_key_pem) =
        server_certificate(idx, secret_ns, &spec.secret.name, now)
            .map_err(|e| (REASON_INVALID_CERTIFICATE_REF, format!("spec.secret: {e}")))?;
    let client_auth = match client {
        None => None,
        Some((c, depth)) => {
            let ca_ns = non_empty(&c.ca_secret.namespace).unwrap_or(ns);
            idx.permit(from, Target::secret(ca_ns, &c.ca_secret.name))
                .map_err(|e| {
                    (
                        REASON_REF_NOT_PERMITTED,
                        format!("spec.client.caSecret: {e}"),
                    )
                })?;
            let ca_pem = client_ca(idx, ca_ns, &c.ca_secret.name).map_err(|e| {
                (
                    REASON_INVALID_CERTIFICATE_REF,
                    format!("spec.client.caSecret: {e}"),
                )
            })?;
            Some(v1::TlsClientAuth {
                ca_pem,
                depth,
                skip_mtls_uri_regex: c.skip_mtls_uri_regex.clone(),
            })
        }
    };
    Ok(v1::TlsCertificate {
        id: format!("{ns}/{name}"),
        source: format!("ApisixTls {ns}/{name}"),
        hosts,
        cert_chain_pem,
        private_key_pem,
        client_auth,
    })
}

/// The TLS entries of one Ingress: `Ok(None)` for an entry without hosts (nothing to
/// serve; reported as an error too), `Err((field, message))` for a bad one.
#[allow(clippy::type_complexity)]
fn ingress_tls(
    ing: &Ingress,
    ns: &str,
    name: &str,
    idx: &Index<'_>,
    now: &Clock,
) -> Vec<Result<Option<v1::TlsCertificate>, (String, String)>> {
    let Some(spec) = ing.spec.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (k, tls) in spec.tls.iter().flatten().enumerate() {
        let field = format!("spec.tls[{k}]");
        let mut problems = Problems::default();
        let hosts = hosts(
            tls.hosts.as_deref().unwrap_or_default(),
            &format!("{field}.hosts"),
            &mut problems,
        );
        if let Some(e) = problems.errors.first() {
            out.push(Err((format!("{field}.hosts"), e.clone())));
            continue;
        }
        if hosts.is_empty() {
            out.push(Err((
                format!("{field}.hosts"),
                "no hosts: Sluice serves a certificate only for the hosts listed".into(),
            )));
            continue;
        }
        let Some(secret) = tls.secret_name.as_deref().filter(|s| !s.is_empty()) else {
            out.push(Err((format!("{field}.secretName"), "required".into())));
            continue;
        };
        match server_certificate(idx, ns, secret, now) {
            Ok((cert_chain_pem, private_key_pem)) => {
                out.push(Ok(Some(v1::TlsCertificate {
                    id: format!("{ns}/{name}/ingress-tls{k}"),
                    source: format!("Ingress {ns}/{name}"),
                    hosts,
                    cert_chain_pem,
                    private_key_pem,
                    client_auth: None,
                })));
            }
            Err(e) => out.push(Err((format!("{field}.secretName"), e))),
        }
    }
    out
}

fn non_empty(s: &str) -> Option<&str> {
    Some(s).filter(|s| !s.is_empty())
}

/// The value of `key` in a Secret: `data`, else `stringData`.
pub(crate) fn secret_value<'s>(secret: &'s Secret, key: &str) -> Option<Cow<'s, [u8]>> {
    if let Some(v) = secret.data.as_ref().and_then(|d| d.get(key)) {
        return Some(Cow::Borrowed(&v.0));
    }
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| Cow::Borrowed(v.as_bytes()))
}

fn find_secret<'i>(idx: &'i Index<'_>, ns: &str, name: &str) -> Result<&'i Secret, String> {
    idx.secrets
        .get(&(ns, name))
        .copied()
        .ok_or_else(|| format!("Secret {ns}/{name} not found"))
}

/// A PEM value of a Secret as text.
fn pem_text(secret: &Secret, ns: &str, name: &str, key: &str) -> Result<String, String> {
    let raw =
        secret_value(secret, key).ok_or_else(|| format!("Secret {ns}/{name} has no {key}"))?;
    let text = String::from_utf8(raw.into_owned())
        .map_err(|_| format!("Secret {ns}/{name}: {key} is not PEM text"))?;
    // NB: trailing whitespace must not change the snapshot hash.
    Ok(format!("{}\n", text.trim()))
}

/// Parses PEM certificates; at least one.
fn certificates(text: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not valid PEM: {}", pem_error(&e)))?;
    if certs.is_empty() {
        return Err("no PEM CERTIFICATE block found".into());
    }
    Ok(certs)
}

fn pem_error(e: &pem::Error) -> String {
    match e {
        pem::Error::MissingSectionEnd { end_marker } => format!(
            "section without its end marker {:?}",
            String::from_utf8_lossy(end_marker)
        ),
        pem::Error::IllegalSectionStart { .. } => "malformed BEGIN line".into(),
        pem::Error::Base64Decode(d) => format!("bad base64 ({d})"),
        other => format!("{other:?}"),
    }
}

/// Validates the kubernetes.io/tls Secret `ns/name`; returns (`tls.crt`, `tls.key`).
/// A usable server certificate from Secret `ns/name` for no particular host (a Gateway
/// listener without a hostname): its PEM chain and key, and the unix second its verdict
/// changes (expiry), checked exactly as every other certificate.
pub(crate) fn any_host_certificate(
    idx: &Index<'_>,
    ns: &str,
    name: &str,
    now: Option<std::time::SystemTime>,
) -> Result<((String, String), Option<i64>), String> {
    let clock = Clock {
        now: now.map(unix_seconds),
        next: Cell::new(None),
    };
    let pems = server_certificate(idx, ns, name, &clock)?;
    Ok((pems, clock.next.get()))
}

fn server_certificate(
    idx: &Index<'_>,
    ns: &str,
    name: &str,
    clock: &Clock,
) -> Result<(String, String), String> {
    let secret = find_secret(idx, ns, name)?;
    let crt = pem_text(secret, ns, name, TLS_CRT)?;
    let key = pem_text(secret, ns, name, TLS_KEY)?;
    let chain = certificates(&crt).map_err(|e| format!("Secret {ns}/{name}: {TLS_CRT}: {e}"))?;
    for (i, der) in chain.iter().enumerate() {
        let what = if i == 0 {
            "the certificate".to_owned()
        } else {
            format!("chain certificate {i}")
        };
        let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| {
            format!("Secret {ns}/{name}: {TLS_CRT}: {what} is not a valid X.509 certificate: {e}")
        })?;
        if let Some(now) = clock.now {
            let v = cert.validity();
            // NB: valid through the whole second of notAfter, as the check below counts.
            clock.changes_at(v.not_after.timestamp().saturating_add(1));
            clock.changes_at(v.not_before.timestamp());
            if v.not_after.timestamp() < now {
                return Err(format!(
                    "Secret {ns}/{name}: {TLS_CRT}: {what} expired at {}",
                    v.not_after
                ));
            }
            if v.not_before.timestamp() > now {
                return Err(format!(
                    "Secret {ns}/{name}: {TLS_CRT}: {what} is not valid before {}",
                    v.not_before
                ));
            }
        }
    }
    let key_der = match PrivateKeyDer::from_pem_slice(key.as_bytes()) {
        Ok(k) => k,
        Err(pem::Error::NoItemsFound) => {
            return Err(format!(
                "Secret {ns}/{name}: {TLS_KEY}: no PEM PRIVATE KEY block found"
            ));
        }
        Err(e) => {
            return Err(format!(
                "Secret {ns}/{name}: {TLS_KEY}: not valid PEM: {}",
                pem_error(&e)
            ));
        }
    };
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(chain, key_der, &provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            format!("Secret {ns}/{name}: {TLS_KEY} does not match the certificate in {TLS_CRT}")
        }
        e => format!("Secret {ns}/{name}: {TLS_KEY}: unusable private key: {e}"),
    })?;
    Ok((crt, key))
}

/// Checks a PEM CA bundle read from `what` (e.g. `ConfigMap a/b: ca.crt`): one certificate
/// at least, each usable as a trust anchor; returns it with trailing whitespace trimmed.
pub(crate) fn ca_bundle(what: &str, raw: &str) -> Result<String, String> {
    let ca = format!("{}\n", raw.trim());
    let certs = certificates(&ca).map_err(|e| format!("{what}: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for (i, der) in certs.into_iter().enumerate() {
        roots
            .add(der)
            .map_err(|e| format!("{what}: certificate {i} cannot be a CA: {e}"))?;
    }
    Ok(ca)
}

/// Validates the client CA Secret `ns/name`; returns `ca.crt`.
pub(crate) fn client_ca(idx: &Index<'_>, ns: &str, name: &str) -> Result<String, String> {
    let secret = find_secret(idx, ns, name)?;
    let ca = pem_text(secret, ns, name, CA_CRT)?;
    let certs = certificates(&ca).map_err(|e| format!("Secret {ns}/{name}: {CA_CRT}: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for (i, der) in certs.into_iter().enumerate() {
        roots.add(der).map_err(|e| {
            format!("Secret {ns}/{name}: {CA_CRT}: certificate {i} cannot be a CA: {e}")
        })?;
    }
    Ok(ca)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn sni_hosts() {
        assert_eq!(sni_host("A.Example.com").unwrap(), "a.example.com");
        assert_eq!(sni_host("*.Example.com").unwrap(), "*.example.com");
        assert!(
            sni_host("a.*.com")
                .unwrap_err()
                .contains("whole first label")
        );
        assert!(sni_host("a..com").unwrap_err().contains("empty label"));
    }

    #[test]
    fn flag_values() {
        assert_eq!(
            parse_secret_ref("ingress/default-cert").unwrap(),
            ("ingress".to_owned(), "default-cert".to_owned())
        );
        assert!(
            parse_secret_ref("default-cert")
                .unwrap_err()
                .contains("NAMESPACE/NAME")
        );
        assert!(parse_secret_ref("a/b/c").unwrap_err().contains("name"));
        assert_eq!(
            parse_fallback_sni("Www.Example.com").unwrap(),
            "www.example.com"
        );
        assert!(
            parse_fallback_sni("*.example.com")
                .unwrap_err()
                .contains("not a wildcard")
        );
    }

    #[test]
    fn wildcards_cover_one_label() {
        let hosts = ["*.example.com".to_owned(), "a.test".to_owned()];
        assert!(covers(&hosts, "x.example.com"));
        assert!(!covers(&hosts, "x.y.example.com"));
        assert!(!covers(&hosts, "example.com"));
        assert!(covers(&hosts, "a.test"));
    }
}
