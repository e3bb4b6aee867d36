//! The Gateway API types against upstream material: every example of the pinned release
//! (`crds/tests/fixtures/gateway-api/`, copied by `scripts/generate/gateway-api-crds.sh`) parses and
//! round-trips, and the vendored CRDs are the release the types follow.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use serde::Deserialize;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sluice_crds::gateway::{
    BackendTLSPolicy, GATEWAY_API_BUNDLE_VERSION, GATEWAY_GROUP, GRPCRoute, Gateway, GatewayClass,
    HTTPRoute, ListenerSet, ReferenceGrant, TCPRoute, TLSRoute, UDPRoute,
};

fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
}

fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(manifest_dir().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// Parses `doc` as `T`, serializes it and parses that again: the two values must be equal,
/// and the serialized form must parse to the same JSON (nothing we model is lost).
fn round_trip<T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug>(
    doc: &serde_yaml::Value,
    what: &str,
) -> T {
    let first: T = serde_yaml::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{what}: does not parse: {e}"));
    let json = serde_json::to_value(&first).unwrap();
    let second: T = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(first, second, "{what}: round trip changed the value");
    assert_eq!(serde_json::to_value(&second).unwrap(), json, "{what}");
    first
}

#[test]
fn upstream_examples_parse_and_round_trip() {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for file in yaml_files("tests/fixtures/gateway-api") {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, de) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let doc = serde_yaml::Value::deserialize(de).unwrap();
            if doc.is_null() {
                continue;
            }
            let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
            let api_version = doc["apiVersion"].as_str().unwrap_or_default();
            if !api_version.starts_with(GATEWAY_GROUP) {
                continue;
            }
            let what = format!("{} document {} ({kind})", file.display(), i + 1);
            match kind.as_str() {
                "GatewayClass" => {
                    let gc: GatewayClass = round_trip(&doc, &what);
                    assert!(!gc.spec.controller_name.is_empty(), "{what}");
                }
                "Gateway" => {
                    let gw: Gateway = round_trip(&doc, &what);
                    if let Some(a) = &gw.spec.allowed_listeners {
                        let from = a.namespaces.as_ref().and_then(|n| n.from.as_deref());
                        assert!(from.is_some(), "{what}: allowedListeners.namespaces.from");
                    }
                    assert!(!gw.spec.listeners.is_empty(), "{what}");
                    assert!(
                        gw.spec.listeners.iter().all(|l| l.port > 0),
                        "{what}: listener ports"
                    );
                }
                "HTTPRoute" => {
                    let r: HTTPRoute = round_trip(&doc, &what);
                    assert!(
                        r.spec
                            .rules
                            .iter()
                            .flat_map(|r| &r.backend_refs)
                            .all(|b| !b.backend.name.is_empty()),
                        "{what}"
                    );
                }
                "GRPCRoute" => {
                    let _: GRPCRoute = round_trip(&doc, &what);
                }
                "ReferenceGrant" => {
                    let g: ReferenceGrant = round_trip(&doc, &what);
                    assert!(!g.spec.from.is_empty() && !g.spec.to.is_empty(), "{what}");
                }
                "BackendTLSPolicy" => {
                    let p: BackendTLSPolicy = round_trip(&doc, &what);
                    assert!(!p.spec.target_refs.is_empty(), "{what}");
                }
                "TLSRoute" => {
                    let r: TLSRoute = round_trip(&doc, &what);
                    assert!(!r.spec.hostnames.is_empty(), "{what}: hostnames");
                    assert!(stream_backends_named(&r.spec.rules), "{what}");
                }
                "TCPRoute" => {
                    let r: TCPRoute = round_trip(&doc, &what);
                    assert!(stream_backends_named(&r.spec.rules), "{what}");
                }
                "UDPRoute" => {
                    let r: UDPRoute = round_trip(&doc, &what);
                    assert!(stream_backends_named(&r.spec.rules), "{what}");
                }
                "ListenerSet" => {
                    let s: ListenerSet = round_trip(&doc, &what);
                    assert!(!s.spec.parent_ref.name.is_empty(), "{what}");
                    assert!(
                        !s.spec.listeners.is_empty() && s.spec.listeners.iter().all(|l| l.port > 0),
                        "{what}: listeners"
                    );
                }
                _ => continue,
            }
            *counts.entry(kind).or_default() += 1;
        }
    }
    // The release's examples cover every kind Sluice reads.
    for kind in [
        "GatewayClass",
        "Gateway",
        "HTTPRoute",
        "GRPCRoute",
        "ReferenceGrant",
        "BackendTLSPolicy",
        "TLSRoute",
        "TCPRoute",
        "UDPRoute",
        "ListenerSet",
    ] {
        assert!(
            counts.get(kind).copied().unwrap_or(0) > 0,
            "no {kind} example: {counts:?}"
        );
    }
}

/// Every backendRef of the rules names something, and at least one rule has backends.
fn stream_backends_named(rules: &[sluice_crds::gateway::StreamRouteRule]) -> bool {
    let refs: Vec<_> = rules.iter().flat_map(|r| &r.backend_refs).collect();
    !refs.is_empty() && refs.iter().all(|b| !b.backend.name.is_empty())
}

#[test]
fn layer4_routes_keep_the_fields_sluice_reads() {
    let r: TLSRoute = serde_yaml::from_str(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: r, namespace: web}
spec:
  parentRefs: [{name: gw, sectionName: tls, port: 443}]
  hostnames: ["*.example.com"]
  rules:
    - name: one
      backendRefs:
        - {name: svc, port: 8443, weight: 0, namespace: other, somethingNew: 1}
"#,
    )
    .unwrap();
    assert_eq!(r.spec.parent_refs[0].port, Some(443));
    assert_eq!(r.spec.hostnames, ["*.example.com"]);
    let b = &r.spec.rules[0].backend_refs[0];
    assert_eq!(
        (b.backend.name.as_str(), b.backend.port, b.weight),
        ("svc", Some(8443), Some(0))
    );
    assert_eq!(b.backend.namespace.as_deref(), Some("other"));
    assert_eq!(r.spec.rules[0].name.as_deref(), Some("one"));
    let u: UDPRoute = serde_yaml::from_str(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: UDPRoute\nmetadata: {name: u}\n\
         spec: {parentRefs: [{name: gw}], rules: [{backendRefs: [{name: dns, port: 53}]}]}\n",
    )
    .unwrap();
    assert_eq!(u.spec.rules[0].backend_refs[0].backend.port, Some(53));
    let t: TCPRoute = serde_yaml::from_str(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\nmetadata: {name: t}\n\
         spec: {rules: null}\n",
    )
    .unwrap();
    assert!(t.spec.rules.is_empty() && t.spec.parent_refs.is_empty());
}

#[test]
fn a_full_httproute_keeps_the_fields_sluice_reads() {
    let r: HTTPRoute = serde_yaml::from_str(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: web}
spec:
  parentRefs: [{name: gw, sectionName: http, port: 80}]
  hostnames: ["*.example.com"]
  rules:
    - name: one
      matches:
        - path: {type: Exact, value: /a}
          headers: [{type: RegularExpression, name: x-v, value: "v[0-9]"}]
          queryParams: [{name: q, value: "1"}]
          method: GET
      filters:
        - type: URLRewrite
          urlRewrite: {hostname: b.example, path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}
        - type: RequestRedirect
          requestRedirect: {scheme: https, statusCode: 301}
      backendRefs:
        - {name: svc, port: 8080, weight: 3, namespace: other, somethingNew: 1}
      timeouts: {request: 10s, backendRequest: 2s}
      unknownRuleField: {a: b}
"#,
    )
    .unwrap();
    let rule = &r.spec.rules[0];
    assert_eq!(r.spec.parent_refs[0].section_name.as_deref(), Some("http"));
    assert_eq!(
        rule.matches[0].headers[0].type_.as_deref(),
        Some("RegularExpression")
    );
    assert_eq!(rule.matches[0].query_params[0].value, "1");
    assert_eq!(
        rule.filters[0]
            .url_rewrite
            .as_ref()
            .unwrap()
            .path
            .as_ref()
            .unwrap()
            .replace_prefix_match
            .as_deref(),
        Some("/b")
    );
    assert_eq!(
        rule.backend_refs[0].backend.namespace.as_deref(),
        Some("other")
    );
    assert_eq!(rule.backend_refs[0].weight, Some(3));
    assert_eq!(
        rule.timeouts.as_ref().unwrap().backend_request.as_deref(),
        Some("2s")
    );
}

/// Name of a vendored CRD file's kind, with its served versions and bundle annotation.
fn crd_summary(path: &PathBuf) -> Option<(String, Vec<String>, String)> {
    let doc: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    if doc["kind"].as_str()? != "CustomResourceDefinition" {
        return None;
    }
    let kind = doc["spec"]["names"]["kind"].as_str()?.to_owned();
    let served = doc["spec"]["versions"]
        .as_sequence()?
        .iter()
        .filter(|v| v["served"].as_bool() == Some(true))
        .filter_map(|v| v["name"].as_str().map(str::to_owned))
        .collect();
    let bundle = doc["metadata"]["annotations"]["gateway.networking.k8s.io/bundle-version"]
        .as_str()?
        .to_owned();
    Some((kind, served, bundle))
}

#[test]
fn vendored_crds_are_the_release_the_types_follow() {
    use kube::Resource;
    let crds: Vec<_> = yaml_files("gateway-api")
        .iter()
        .filter_map(crd_summary)
        .collect();
    assert!(crds.len() >= 6, "{crds:?}");
    for (_, _, bundle) in &crds {
        assert_eq!(bundle, GATEWAY_API_BUNDLE_VERSION);
    }
    let version = std::fs::read_to_string(manifest_dir().join("gateway-api/VERSION")).unwrap();
    assert_eq!(version.trim(), GATEWAY_API_BUNDLE_VERSION);
    for (kind, version) in [
        (GatewayClass::kind(&()), GatewayClass::version(&())),
        (Gateway::kind(&()), Gateway::version(&())),
        (HTTPRoute::kind(&()), HTTPRoute::version(&())),
        (GRPCRoute::kind(&()), GRPCRoute::version(&())),
        (ReferenceGrant::kind(&()), ReferenceGrant::version(&())),
        (BackendTLSPolicy::kind(&()), BackendTLSPolicy::version(&())),
        (TLSRoute::kind(&()), TLSRoute::version(&())),
        (TCPRoute::kind(&()), TCPRoute::version(&())),
        (UDPRoute::kind(&()), UDPRoute::version(&())),
    ] {
        let (_, served, _) = crds
            .iter()
            .find(|(k, _, _)| *k == kind)
            .unwrap_or_else(|| panic!("no vendored CRD for {kind}"));
        assert!(
            served.iter().any(|v| *v == version),
            "{kind} {version} not served: {served:?}"
        );
    }
}
