//! The output accumulator the processors write into, and what it becomes: [`Translation`].
//!
//! Each processor adds the routes, upstreams and statuses of one input family;
//! [`Builder::finish`] sorts and seals nothing, it only assembles the snapshot (routes and
//! upstreams come out sorted by id because they are kept in maps).

use std::collections::BTreeMap;

use sluice_proto::v1;

use crate::gateway;
use crate::problems::Problems;
use crate::status::{IngressStatus, ObjectKind, ObjectStatus, StatusReport};
use crate::tls::TlsTranslation;

/// The result of [`crate::translate`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Translation {
    /// Routes and upstreams sorted by id; `version = 0`, `hash` empty (seal it with
    /// [`sluice_proto::seal`]).
    pub snapshot: v1::Snapshot,
    /// Conditions per object.
    pub status: StatusReport,
    /// Conditions per Ingress of this controller's class, sorted by namespace and name (see
    /// [`IngressStatus`] for why they are not in `status`).
    pub ingresses: Vec<IngressStatus>,
    /// Problems with the settings in [`crate::Options`] (a bad `--default-ssl-certificate` Secret,
    /// a `--fallback-sni` no certificate covers), one line each naming the flag. Empty when
    /// all is well.
    pub settings: Vec<String>,
    /// With [`crate::Options::now`]: the next time a certificate's validity verdict changes (one
    /// second past the earliest `notAfter` of a checked certificate, or the earliest future
    /// `notBefore`). Translate again then so an expired certificate stops being served and
    /// its object gets `Accepted=False`. `None`: nothing changes with time.
    pub certificates_change_at: Option<std::time::SystemTime>,
}

/// What one accepted object (an ApisixRoute rule set, an Ingress) contributes.
#[derive(Debug, Default)]
pub(crate) struct RouteOutput {
    pub(crate) routes: Vec<v1::Route>,
    pub(crate) upstreams: Vec<v1::Upstream>,
}

/// The translation so far.
#[derive(Default)]
pub(crate) struct Builder {
    /// By id: the snapshot's routes come out sorted.
    pub(crate) routes: BTreeMap<String, v1::Route>,
    /// Layer-4 routes by id.
    pub(crate) stream_routes: BTreeMap<String, v1::StreamRoute>,
    /// Listeners of the declared stream ports (ApisixRoute `spec.stream`).
    stream_listeners: Vec<v1::Listener>,
    /// By id; the same id always resolves to the same content, so the first one stays.
    upstreams: BTreeMap<String, v1::Upstream>,
    pub(crate) consumers: Vec<v1::Consumer>,
    pub(crate) global_rules: Vec<v1::GlobalRule>,
    pub(crate) status: StatusReport,
    pub(crate) ingresses: Vec<IngressStatus>,
    tls: TlsTranslation,
    gateway: gateway::Output,
}

impl Builder {
    /// Adds the status of an object.
    pub(crate) fn status(&mut self, status: ObjectStatus) {
        self.status.objects.push(status);
    }

    /// Adds `out`'s routes (replacing any of the same id) and upstreams; returns the route
    /// ids, sorted.
    pub(crate) fn add(&mut self, out: RouteOutput) -> Vec<String> {
        let mut ids = Vec::new();
        for r in out.routes {
            ids.push(r.id.clone());
            self.routes.insert(r.id.clone(), r);
        }
        for u in out.upstreams {
            self.upstream(u);
        }
        ids.sort();
        ids
    }

    /// Adds stream routes (replacing any of the same id) and their upstreams; returns the
    /// route ids.
    pub(crate) fn add_streams(
        &mut self,
        routes: Vec<v1::StreamRoute>,
        upstreams: Vec<v1::Upstream>,
    ) -> Vec<String> {
        let mut ids = Vec::new();
        for r in routes {
            ids.push(r.id.clone());
            self.stream_routes.insert(r.id.clone(), r);
        }
        for u in upstreams {
            self.upstream(u);
        }
        ids
    }

    /// The listeners of the declared stream ports; call after [`Builder::tls`] (TLS ports
    /// carry the certificates their routes need).
    pub(crate) fn stream_listeners(&mut self, ports: &[crate::StreamPort]) {
        self.stream_listeners = crate::apisix::stream::listeners(
            ports,
            &self.stream_routes,
            &self.tls.certificates,
            self.tls.default_certificate.as_ref(),
        );
    }

    /// Adds an upstream unless one of its id is there already.
    pub(crate) fn upstream(&mut self, u: v1::Upstream) {
        self.upstreams.entry(u.id.clone()).or_insert(u);
    }

    /// The certificates of ApisixTls objects and Ingress `spec.tls[]` (their statuses go
    /// into the report); returns the unresolved TLS entries per Ingress.
    pub(crate) fn tls(
        &mut self,
        mut tls: TlsTranslation,
    ) -> BTreeMap<(String, String), Vec<crate::tls::Unresolved>> {
        self.status.objects.append(&mut tls.apisix);
        let ingress = std::mem::take(&mut tls.ingress);
        self.tls = tls;
        ingress
    }

    /// The certificates served so far (by ApisixTls objects and Ingresses).
    pub(crate) fn certificates(&self) -> &[v1::TlsCertificate] {
        &self.tls.certificates
    }

    /// The Gateway API's part; its routes never replace one of the same id.
    pub(crate) fn gateway(&mut self, mut gw: gateway::Output) {
        for r in std::mem::take(&mut gw.routes) {
            self.routes.entry(r.id.clone()).or_insert(r);
        }
        for u in std::mem::take(&mut gw.upstreams) {
            self.upstream(u);
        }
        for r in std::mem::take(&mut gw.stream_routes) {
            self.stream_routes.entry(r.id.clone()).or_insert(r);
        }
        self.status.gateway = std::mem::take(&mut gw.status);
        self.gateway = gw;
    }

    /// The translation: snapshot (unsealed), status report sorted.
    pub(crate) fn finish(mut self) -> Translation {
        let (mut tls, gw) = (self.tls, self.gateway);
        let mut certificates = tls.certificates;
        certificates.extend(gw.certificates);
        certificates.sort_by(|a, b| a.id.cmp(&b.id));
        if let Some(at) = gw.changes_at {
            tls.changes_at = Some(tls.changes_at.map_or(at, |n| n.min(at)));
        }
        self.status.sort();
        self.consumers.sort_by(|a, b| a.name.cmp(&b.name));
        let mut listeners = gw.listeners;
        listeners.extend(self.stream_listeners);
        listeners.sort_by(|a, b| a.id.cmp(&b.id));
        Translation {
            snapshot: v1::Snapshot {
                version: 0,
                hash: String::new(),
                routes: self.routes.into_values().collect(),
                upstreams: self.upstreams.into_values().collect(),
                consumers: self.consumers,
                global_rules: self.global_rules,
                tls_certificates: certificates,
                // NB: the operator's --default-ssl-certificate wins over a Gateway's.
                default_certificate: tls.default_certificate.or(gw.default_certificate),
                fallback_sni: tls.fallback_sni,
                listeners,
                stream_routes: self.stream_routes.into_values().collect(),
            },
            status: self.status,
            ingresses: self.ingresses,
            settings: tls.settings,
            certificates_change_at: tls
                .changes_at
                .and_then(|s| u64::try_from(s).ok())
                .map(|s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s)),
        }
    }
}

/// The status of an object that only has an `Accepted` condition.
pub(crate) fn simple_status(
    kind: ObjectKind,
    (ns, name): (&str, &str),
    generation: Option<i64>,
    problems: &Problems,
) -> ObjectStatus {
    ObjectStatus {
        kind,
        namespace: ns.to_owned(),
        name: name.to_owned(),
        generation,
        conditions: vec![problems.accepted()],
        routes: Vec::new(),
    }
}
