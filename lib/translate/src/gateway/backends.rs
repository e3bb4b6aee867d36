//! HTTPRoute and GRPCRoute backends → upstreams, and the `RequestMirror` filter's
//! backend (see the [`http`](super::http) module docs).

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;
use sluice_crds::gateway::{BackendObjectReference, HttpRequestMirrorFilter};
use sluice_proto::v1;

use super::filters::plugin;
use super::http::{Ctx, RouteInput};
use super::{RouteKind, granted, reason};
use crate::problems::Problems;
use crate::upstream::{self, BackendRef};

impl Ctx<'_, '_> {
    /// A backend's upstream; `None` (with the reason in `unresolved`) when it is invalid.
    pub(super) fn backend(
        &self,
        b: &BackendObjectReference,
        route: &RouteInput<'_>,
        field: &str,
        unresolved: &mut Vec<(&'static str, String)>,
        websocket: &mut bool,
    ) -> Option<v1::Upstream> {
        let (ns, port) = match self.backend_ref(b, route, field) {
            Ok(found) => found,
            Err(refused) => {
                unresolved.push(refused);
                return None;
            }
        };
        let port = IntOrString::Int(port);
        let r = BackendRef {
            namespace: ns,
            service: &b.name,
            port: &port,
            granularity: Default::default(),
            subset: None,
            field,
            field_names: ("name", "port"),
        };
        let mut problems = Problems::default();
        let up = upstream::service_upstream(&r, self.idx, self.aus, &mut problems);
        if !problems.is_valid() || !problems.unresolved.is_empty() {
            let errors = problems.errors.into_iter();
            let unresolved_refs = problems.unresolved.into_iter().map(|(_, m)| m);
            unresolved.extend(
                errors
                    .chain(unresolved_refs)
                    .map(|m| (reason::BACKEND_NOT_FOUND, m)),
            );
            return None;
        }
        let mut up = up?;
        let svc_port = self
            .idx
            .services
            .get(&(ns, b.name.as_str()))
            .and_then(|svc| upstream::find_port(svc, &port));
        let port_name = svc_port.and_then(|p| p.name.as_deref());
        if let Some(refused) = self.tls_policy(ns, b, port_name, field) {
            unresolved.push(refused);
            return None;
        }
        let app_protocol = svc_port.and_then(|p| p.app_protocol.as_deref());
        *websocket |= app_protocol == Some("kubernetes.io/ws");
        if app_protocol == Some("kubernetes.io/h2c") && route.kind == RouteKind::HttpRoute {
            // HTTP/2 with prior knowledge, in clear text (the scheme gRPC upstreams use).
            up.id.push_str("@h2c");
            up.scheme = v1::Scheme::Grpc as i32;
        }
        if route.kind == RouteKind::GrpcRoute {
            up.id.push_str("@grpc");
            up.scheme = match v1::Scheme::try_from(up.scheme) {
                Ok(v1::Scheme::Https | v1::Scheme::Grpcs) => v1::Scheme::Grpcs as i32,
                _ => v1::Scheme::Grpc as i32,
            };
        }
        Some(up)
    }

    /// The namespace and port of a backendRef to a core Service the route may refer to;
    /// `Err` is (reason, message) for `ResolvedRefs`.
    fn backend_ref<'b>(
        &self,
        b: &'b BackendObjectReference,
        route: &RouteInput<'b>,
        field: &str,
    ) -> Result<(&'b str, i32), (&'static str, String)> {
        let group = b.group.as_deref().unwrap_or("");
        let kind = b.kind.as_deref().unwrap_or("Service");
        if !group.is_empty() || kind != "Service" {
            return Err((
                reason::INVALID_KIND,
                format!("{field}: {group}/{kind} is not a supported backend kind (core Service)"),
            ));
        }
        let ns = b.namespace.as_deref().unwrap_or(route.ns);
        let kind = route.kind.as_str();
        if ns != route.ns && !granted(self.grants, kind, route.ns, "", "Service", ns, &b.name) {
            return Err((
                reason::REF_NOT_PERMITTED,
                format!(
                    "{field}: Service {ns}/{} is in another namespace and no ReferenceGrant there \
                     allows it",
                    b.name
                ),
            ));
        }
        let Some(port) = b.port else {
            return Err((
                reason::BACKEND_NOT_FOUND,
                format!("{field}.port: required for a Service"),
            ));
        };
        Ok((ns, port))
    }

    /// Why a BackendTLSPolicy for the Service port refuses the backend, if one does.
    // NB: fail closed: TLS to the backend is not implemented yet, and sending plain text
    // where a BackendTLSPolicy asks for TLS would expose the traffic.
    fn tls_policy(
        &self,
        ns: &str,
        b: &BackendObjectReference,
        port_name: Option<&str>,
        field: &str,
    ) -> Option<(&'static str, String)> {
        let policy = self.tls_policies.iter().find(|p| {
            crate::key(&p.metadata).0 == ns
                && p.spec.target_refs.iter().any(|t| {
                    t.group.is_empty()
                        && t.kind == "Service"
                        && t.name == b.name
                        && t.section_name
                            .as_deref()
                            .is_none_or(|s| Some(s) == port_name)
                })
        })?;
        Some((
            reason::UNSUPPORTED_PROTOCOL,
            format!(
                "{field}: BackendTLSPolicy {ns}/{} asks for TLS to Service {ns}/{}, which \
                 Sluice does not support yet (the backend is not used)",
                policy.metadata.name.as_deref().unwrap_or_default(),
                b.name
            ),
        ))
    }
}

impl Ctx<'_, '_> {
    /// The `proxy-mirror` plugin of a `RequestMirror` filter: requests copied to the
    /// backend Service's ClusterIP and port (kube-proxy picks the endpoint), a share
    /// `percent` / `fraction` of them. `Ok(None)` when the share is zero or the backend is
    /// invalid (its reason then in `unresolved`, as for backends); `Err` for what Sluice
    /// cannot mirror to.
    pub(super) fn mirror_plugin(
        &self,
        mf: &HttpRequestMirrorFilter,
        route: &RouteInput<'_>,
        field: &str,
        unresolved: &mut Vec<(&'static str, String)>,
    ) -> Result<Option<v1::Plugin>, String> {
        let mut websocket = false;
        if self
            .backend(&mf.backend_ref, route, field, unresolved, &mut websocket)
            .is_none()
        {
            return Ok(None);
        }
        let b = &mf.backend_ref;
        let ns = b.namespace.as_deref().unwrap_or(route.ns);
        let ip = self
            .idx
            .services
            .get(&(ns, b.name.as_str()))
            .and_then(|s| s.spec.as_ref())
            .and_then(|s| s.cluster_ip.as_deref())
            .filter(|ip| !ip.is_empty() && *ip != "None")
            .ok_or_else(|| {
                format!(
                    "{field}: Service {ns}/{} has no ClusterIP (a headless Service cannot be \
                     mirrored to yet)",
                    b.name
                )
            })?;
        let port = b
            .port
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| format!("{field}.port: required"))?;
        let share = match (&mf.percent, &mf.fraction) {
            (Some(p), _) => Some(f64::from(*p) / 100.0),
            (None, Some(f)) => {
                let d = f.denominator.unwrap_or(100);
                if d <= 0 || f.numerator < 0 || f.numerator > d {
                    return Err(format!(
                        "{field}: fraction {}/{d} is not a share between 0 and 1",
                        f.numerator
                    ));
                }
                Some(f64::from(f.numerator) / f64::from(d))
            }
            (None, None) => None,
        };
        let Some(m) = sluice_plugin_config::proxy_mirror::ProxyMirror::to_endpoint(ip, port, share)
        else {
            return Ok(None);
        };
        plugin(
            "proxy-mirror",
            &json!({"host": m.host, "sample_ratio": m.sample_ratio}),
            field,
        )
        .map(Some)
    }
}
