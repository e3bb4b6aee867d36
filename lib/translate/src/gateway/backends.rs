//! HTTPRoute and GRPCRoute backends → upstreams, and the `RequestMirror` filter's
//! backend (see the [`http`](super::http) module docs).

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;
use sluice_crds::gateway::{BackendObjectReference, HttpRequestMirrorFilter};
use sluice_proto::v1;

use super::backend_tls::BackendTls;
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
        let tls = self.tls_policies.backend(ns, &b.name, port_name);
        let tls_asked = tls.is_some();
        let app_protocol = svc_port.and_then(|p| p.app_protocol.as_deref());
        *websocket |= app_protocol == Some("kubernetes.io/ws");
        match tls {
            Some(BackendTls::Tls(settings, suffix)) => {
                up.id.push_str(&suffix);
                up.scheme = v1::Scheme::Https as i32;
                up.tls = Some(settings);
            }
            Some(BackendTls::Refused) => {
                // NB: an invalid policy still claims its backends: no endpoint, so every
                // request fails (503) rather than reaching the backend in plain text.
                up.id.push_str("@tls-invalid");
                up.scheme = v1::Scheme::Https as i32;
                up.endpoints.clear();
                up.health_check = None;
            }
            None => {}
        }
        if app_protocol == Some("kubernetes.io/h2c")
            && route.kind == RouteKind::HttpRoute
            && !tls_asked
        {
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
        let Some(up) = self.backend(&mf.backend_ref, route, field, unresolved, &mut websocket)
        else {
            return Ok(None);
        };
        let b = &mf.backend_ref;
        if up.tls.is_some() || up.id.ends_with("@tls-invalid") {
            return Err(format!(
                "{field}: Service {} is targeted by a BackendTLSPolicy and mirrors are sent in \
                 plain text (not supported)",
                b.name
            ));
        }
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
