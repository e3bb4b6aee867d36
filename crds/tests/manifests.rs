//! Real-world shaped manifests parse unchanged into the typed structs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use sluice_crds::*;

/// Parses every YAML document of a fixture separately, as the standalone loader does.
/// This crate's directory, read when the test runs (cargo sets `CARGO_MANIFEST_DIR` for test
/// processes). NB: not `env!` alone: CI keeps the build cache outside the clone, and a test
/// binary another clone built would look for files in that clone.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
}

fn documents(file: &str) -> Vec<serde_yaml::Value> {
    let path = format!("{}/tests/fixtures/{file}", manifest_dir().display());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_yaml::Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

use serde::Deserialize;

/// Parses all documents of `file` as `T`, checking `kind` and that serializing the typed value
/// keeps every field the user wrote, with the same name and value.
fn parse_all<T: DeserializeOwned + serde::Serialize>(file: &str, kind: &str) -> Vec<T> {
    documents(file)
        .into_iter()
        .map(|doc| {
            assert_eq!(doc["apiVersion"].as_str(), Some(API_VERSION));
            assert_eq!(doc["kind"].as_str(), Some(kind));
            let typed: T = serde_yaml::from_value(doc.clone())
                .unwrap_or_else(|e| panic!("{file}: {kind} {:?}: {e}", doc["metadata"]["name"]));
            let original = serde_json::to_value(&doc).unwrap();
            let again = serde_json::to_value(&typed).unwrap();
            assert_subset(&original, &again, "");
            typed
        })
        .collect()
}

/// Every key/value of `want` appears in `got` (which may add defaults such as `enable: true`).
fn assert_subset(want: &serde_json::Value, got: &serde_json::Value, path: &str) {
    use serde_json::Value;
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                let gv = g
                    .get(k)
                    .unwrap_or_else(|| panic!("field {path}.{k} was lost on the round trip"));
                assert_subset(wv, gv, &format!("{path}.{k}"));
            }
        }
        (Value::Array(w), Value::Array(g)) => {
            assert_eq!(w.len(), g.len(), "length of {path}");
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                assert_subset(wv, gv, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(want, got, "value of {path}"),
    }
}

#[test]
fn apisix_route_documentation_manifests_parse() {
    let routes: Vec<ApisixRoute> = parse_all("apisixroute.yaml", "ApisixRoute");
    assert_eq!(routes.len(), 3);

    let r = &routes[0];
    assert_eq!(r.metadata.name.as_deref(), Some("httpbin-route"));
    assert_eq!(r.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(r.spec.ingress_class_name.as_deref(), Some("apisix"));
    let rule = &r.spec.http[0];
    assert_eq!(rule.name, "rule1");
    assert_eq!(rule.priority, 10);
    assert_eq!(rule.match_.hosts, ["httpbin.org", "*.example.com"]);
    assert_eq!(rule.match_.paths, ["/ip", "/headers*"]);
    assert_eq!(rule.match_.methods, [HttpMethod::Get, HttpMethod::Post]);
    assert_eq!(rule.match_.remote_addrs, ["10.0.0.0/8", "2001:db8::/32"]);
    let exprs = &rule.match_.exprs;
    assert_eq!(exprs[0].subject.scope, ExprScope::Header);
    assert_eq!(exprs[0].subject.name, "X-Foo");
    assert_eq!(exprs[0].op, ExprOp::Equal);
    assert_eq!(exprs[0].value.as_deref(), Some("bar"));
    assert_eq!(exprs[1].op, ExprOp::In);
    assert!(exprs[1].op.takes_set());
    assert_eq!(
        exprs[1].set.as_deref(),
        Some(&["1".to_owned(), "2".to_owned()][..])
    );
    assert_eq!(exprs[2].subject.scope, ExprScope::Path);
    assert_eq!(exprs[2].subject.name, "");
    assert!(rule.websocket);
    let timeout = rule.timeout.as_ref().unwrap().resolve().unwrap();
    assert_eq!(timeout.connect, std::time::Duration::from_secs(1));
    assert_eq!(timeout.send, std::time::Duration::from_millis(500));
    assert_eq!(timeout.read, std::time::Duration::from_secs(90));

    assert_eq!(rule.backends.len(), 2);
    assert_eq!(rule.backends[0].service_name, "httpbin");
    assert_eq!(rule.backends[0].service_port, IntOrString::Int(80));
    assert_eq!(rule.backends[0].weight_or_default(), 10);
    assert_eq!(rule.backends[0].resolve_granularity, None);
    assert_eq!(
        rule.backends[1].service_port,
        IntOrString::String("http".into())
    );
    assert_eq!(
        rule.backends[1].resolve_granularity,
        Some(ResolveGranularity::Service)
    );
    assert_eq!(rule.backends[1].subset.as_deref(), Some("canary"));

    assert_eq!(rule.plugin_config_name.as_deref(), Some("echo-and-cors"));
    assert_eq!(rule.plugin_config_namespace.as_deref(), Some("shared"));
    assert_eq!(rule.plugins.len(), 3);
    let limit = &rule.plugins[0];
    assert_eq!(limit.name, "limit-count");
    assert!(limit.enable);
    assert_eq!(limit.config.as_ref().unwrap()["time_window"], 60);
    let rewrite = &rule.plugins[1];
    assert!(rewrite.enable, "enable defaults to true");
    assert_eq!(
        rewrite.config.as_ref().unwrap()["headers"]["set"]["X-Api-Version"],
        "v2"
    );
    assert!(!rule.plugins[2].enable);
    assert_eq!(rule.plugins[2].secret_ref.as_deref(), Some("echo-secret"));

    let auth = rule.authentication.as_ref().unwrap();
    assert!(auth.enable);
    assert_eq!(auth.type_, AuthType::KeyAuth);
    assert_eq!(
        auth.key_auth.as_ref().unwrap().header.as_deref(),
        Some("X-API-KEY")
    );

    let rule2 = &r.spec.http[1];
    assert_eq!(rule2.priority, 0);
    assert!(!rule2.websocket);
    assert!(rule2.match_.hosts.is_empty());
    assert_eq!(rule2.backends[0].weight_or_default(), DEFAULT_WEIGHT);
    let jwt = rule2.authentication.as_ref().unwrap();
    assert_eq!(jwt.type_, AuthType::JwtAuth);
    assert_eq!(
        jwt.jwt_auth.as_ref().unwrap().query.as_deref(),
        Some("token")
    );

    let ext = &routes[1].spec.http[0];
    assert_eq!(ext.upstreams[0].name, "httpbin-upstream");
    assert_eq!(ext.upstreams[0].weight_or_default(), 50);

    let stream = &routes[2].spec.stream[0];
    assert_eq!(stream.protocol, StreamProtocol::Tcp);
    assert_eq!(stream.match_.ingress_port, 9100);
    assert_eq!(stream.match_.host.as_deref(), Some("db.example.com"));
    assert_eq!(stream.backend.service_port, IntOrString::Int(8080));
    assert_eq!(
        stream.backend.resolve_granularity,
        Some(ResolveGranularity::Endpoint)
    );
    assert_eq!(stream.plugins[0].name, "ip-restriction");
}

#[test]
fn apisix_upstream_documentation_manifests_parse() {
    let ups: Vec<ApisixUpstream> = parse_all("apisixupstream.yaml", "ApisixUpstream");
    assert_eq!(ups.len(), 2);

    let u = &ups[0].spec;
    assert_eq!(u.ingress_class_name.as_deref(), Some("apisix"));
    let lb = u.config.loadbalancer.as_ref().unwrap();
    assert_eq!(lb.type_, LoadBalancerType::Chash);
    assert_eq!(lb.hash_on, Some(HashOn::Header));
    assert_eq!(lb.key.as_deref(), Some("X-User-Id"));
    assert_eq!(u.config.scheme, Some(UpstreamScheme::Https));
    assert_eq!(u.config.retries, Some(3));
    let t = u.config.timeout.as_ref().unwrap().resolve().unwrap();
    assert_eq!(t.connect, std::time::Duration::from_secs(5));
    assert_eq!(u.config.pass_host, Some(PassHost::Rewrite));
    assert_eq!(
        u.config.upstream_host.as_deref(),
        Some("internal.httpbin.org")
    );
    let tls = u.config.tls_secret.as_ref().unwrap();
    assert_eq!(
        (tls.name.as_str(), tls.namespace.as_str()),
        ("upstream-client-cert", "default")
    );

    let hc = u.config.health_check.as_ref().unwrap();
    let active = &hc.active;
    assert_eq!(active.type_, Some(HealthCheckType::Https));
    assert_eq!(active.timeout, Some(IntOrString::Int(5)));
    assert_eq!(active.concurrency, Some(2));
    assert_eq!(active.port, Some(8443));
    assert_eq!(active.http_path.as_deref(), Some("/healthz"));
    assert_eq!(active.strict_tls, Some(false));
    assert_eq!(active.request_headers, ["User-Agent: curl/7.29.0"]);
    let healthy = active.healthy.as_ref().unwrap();
    assert_eq!(healthy.interval.as_deref(), Some("2s"));
    assert_eq!(healthy.successes, Some(3));
    assert_eq!(healthy.http_codes, [200, 302]);
    let unhealthy = active.unhealthy.as_ref().unwrap();
    assert_eq!(unhealthy.http_failures, Some(2));
    assert_eq!(unhealthy.tcp_failures, Some(2));
    assert_eq!(unhealthy.timeout, Some(3));
    let passive = hc.passive.as_ref().unwrap();
    assert_eq!(passive.type_, Some(HealthCheckType::Http));
    assert_eq!(passive.healthy.as_ref().unwrap().successes, Some(5));
    assert_eq!(passive.unhealthy.as_ref().unwrap().timeout, Some(7));

    assert_eq!(u.config.subsets.len(), 2);
    assert_eq!(u.config.subsets[0].name, "canary");
    assert_eq!(u.config.subsets[0].labels["version"], "v2");

    assert_eq!(u.port_level_settings.len(), 2);
    assert_eq!(u.port_level_settings[0].port, 7000);
    assert_eq!(
        u.port_level_settings[0]
            .config
            .loadbalancer
            .as_ref()
            .unwrap()
            .type_,
        LoadBalancerType::LeastConn
    );
    assert_eq!(
        u.port_level_settings[1].config.scheme,
        Some(UpstreamScheme::Grpc)
    );
    assert_eq!(
        u.port_level_settings[1]
            .config
            .timeout
            .as_ref()
            .unwrap()
            .read
            .as_deref(),
        Some("30s")
    );

    let ext = &ups[1].spec;
    assert_eq!(ext.external_nodes.len(), 2);
    assert_eq!(ext.external_nodes[0].type_, Some(ExternalNodeType::Domain));
    assert_eq!(ext.external_nodes[0].name, "httpbin.org");
    assert_eq!(ext.external_nodes[0].weight_or_default(), 1);
    assert_eq!(ext.external_nodes[0].port, Some(443));
    assert_eq!(ext.external_nodes[1].type_, Some(ExternalNodeType::Service));
    assert_eq!(ext.external_nodes[1].weight_or_default(), DEFAULT_WEIGHT);
    assert_eq!(
        ext.config.loadbalancer.as_ref().unwrap().type_,
        LoadBalancerType::Ewma
    );
}

fn route_with_op(op: &str) -> String {
    format!(
        "apiVersion: apisix.apache.org/v2\nkind: ApisixRoute\nmetadata: {{name: r}}\nspec:\n  http:\n  - name: a\n    match:\n      paths: [/]\n      exprs:\n      - subject: {{scope: Header, name: X}}\n        op: {op}\n        value: v\n"
    )
}

#[test]
fn unknown_enum_value_is_rejected_naming_the_value() {
    assert!(serde_yaml::from_str::<ApisixRoute>(&route_with_op("Equal")).is_ok());
    let err = serde_yaml::from_str::<ApisixRoute>(&route_with_op("Bogus"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("Bogus"), "{err}");
    assert!(
        err.contains("Equal"),
        "the error lists valid operators: {err}"
    );

    let err = serde_yaml::from_str::<ApisixUpstream>(
        "apiVersion: apisix.apache.org/v2\nkind: ApisixUpstream\nmetadata: {name: u}\nspec:\n  loadbalancer: {type: random}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("random"), "{err}");
}

#[test]
fn one_bad_document_does_not_hide_the_others() {
    let file = format!(
        "{}---\n{}",
        route_with_op("Bogus"),
        route_with_op("NotEqual").replace("name: r", "name: good")
    );
    let results: Vec<Result<ApisixRoute, _>> = serde_yaml::Deserializer::from_str(&file)
        .map(ApisixRoute::deserialize)
        .collect();
    assert_eq!(results.len(), 2);
    assert!(
        results[0]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("Bogus")
    );
    let good = results[1].as_ref().unwrap();
    assert_eq!(good.metadata.name.as_deref(), Some("good"));
    assert_eq!(good.spec.http[0].match_.exprs[0].op, ExprOp::NotEqual);
}

#[test]
fn required_fields_are_enforced() {
    let no_paths = "apiVersion: apisix.apache.org/v2\nkind: ApisixRoute\nmetadata: {name: r}\nspec:\n  http:\n  - name: a\n    match: {hosts: [a.com]}\n";
    let err = serde_yaml::from_str::<ApisixRoute>(no_paths)
        .unwrap_err()
        .to_string();
    assert!(err.contains("paths"), "{err}");
    let no_service = "apiVersion: apisix.apache.org/v2\nkind: ApisixRoute\nmetadata: {name: r}\nspec:\n  http:\n  - name: a\n    match: {paths: [/]}\n    backends: [{servicePort: 80}]\n";
    let err = serde_yaml::from_str::<ApisixRoute>(no_service)
        .unwrap_err()
        .to_string();
    assert!(err.contains("serviceName"), "{err}");
    let no_name = "apiVersion: apisix.apache.org/v2\nkind: ApisixRoute\nmetadata: {name: r}\nspec:\n  http:\n  - match: {paths: [/]}\n";
    let err = serde_yaml::from_str::<ApisixRoute>(no_name)
        .unwrap_err()
        .to_string();
    assert!(err.contains("name"), "{err}");
}

#[test]
fn explicit_nulls_read_as_empty_like_the_api_server() {
    let y = "apiVersion: apisix.apache.org/v2\nkind: ApisixRoute\nmetadata: {name: r}\nspec:\n  http:\n  - name: a\n    match:\n      paths: [/]\n      hosts:\n      methods: ~\n    plugins:\n";
    let r: ApisixRoute = serde_yaml::from_str(y).unwrap();
    assert!(r.spec.http[0].match_.hosts.is_empty());
    assert!(r.spec.http[0].match_.methods.is_empty());
    assert!(r.spec.http[0].plugins.is_empty());
}

#[test]
fn endpoints_is_accepted_as_a_spelling_of_endpoint() {
    let b: ApisixRouteHttpBackend =
        serde_yaml::from_str("serviceName: s\nservicePort: 80\nresolveGranularity: endpoints\n")
            .unwrap();
    assert_eq!(b.resolve_granularity, Some(ResolveGranularity::Endpoint));
    let err = serde_yaml::from_str::<ApisixRouteHttpBackend>(
        "serviceName: s\nservicePort: 80\nresolveGranularity: pods\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("pods"), "{err}");
}

#[test]
fn apisix_tls_documentation_manifests_parse() {
    let tls: Vec<ApisixTls> = parse_all("apisixtls.yaml", "ApisixTls");
    assert_eq!(tls.len(), 2);
    assert_eq!(tls[0].spec.hosts, ["httpbin.org", "*.httpbin.org"]);
    assert_eq!(tls[0].spec.secret.name, "httpbin-cert");
    assert_eq!(tls[0].spec.secret.namespace, "default");
    assert_eq!(tls[0].spec.client, None);
    let client = tls[1].spec.client.as_ref().unwrap();
    assert_eq!(client.ca_secret.name, "client-ca-secret");
    assert_eq!(client.depth, Some(10));
    assert_eq!(client.skip_mtls_uri_regex, ["/healthz", "^/public/.*"]);
}

#[test]
fn apisix_consumer_documentation_manifests_parse() {
    let cs: Vec<ApisixConsumer> = parse_all("apisixconsumer.yaml", "ApisixConsumer");
    assert_eq!(cs.len(), 7);
    let kinds: Vec<Vec<AuthType>> = cs.iter().map(|c| c.spec.auth_parameter.kinds()).collect();
    assert_eq!(
        kinds,
        [
            vec![AuthType::KeyAuth],
            vec![AuthType::KeyAuth],
            vec![AuthType::BasicAuth],
            vec![AuthType::JwtAuth],
            vec![AuthType::HmacAuth],
            vec![AuthType::LdapAuth],
            vec![AuthType::WolfRbac],
        ]
    );

    let jack = &cs[0].spec;
    let key = jack.auth_parameter.key_auth.as_ref().unwrap();
    assert_eq!(key.value.as_ref().unwrap().key, "jack-key");
    assert_eq!(key.secret_ref, None);
    assert_eq!(jack.plugins[0].name, "limit-count");

    let jill = cs[1].spec.auth_parameter.key_auth.as_ref().unwrap();
    assert_eq!(jill.secret_ref.as_ref().unwrap().name, "jill-key-auth");
    assert_eq!(jill.value, None);

    let basic = cs[2].spec.auth_parameter.basic_auth.as_ref().unwrap();
    let v = basic.value.as_ref().unwrap();
    assert_eq!((v.username.as_str(), v.password.as_str()), ("foo", "bar"));

    let jwt = cs[3]
        .spec
        .auth_parameter
        .jwt_auth
        .as_ref()
        .unwrap()
        .value
        .as_ref()
        .unwrap();
    assert_eq!(jwt.key, "user-key");
    assert_eq!(jwt.secret.as_deref(), Some("my-secret-key"));
    assert_eq!(jwt.algorithm, Some(JwtAlgorithm::RS256));
    assert!(
        jwt.public_key
            .as_deref()
            .unwrap()
            .starts_with("-----BEGIN PUBLIC KEY-----\n")
    );
    assert!(jwt.private_key.as_deref().unwrap().contains("PRIVATE KEY"));
    assert_eq!(jwt.exp, Some(86400));
    assert_eq!(jwt.base64_secret, Some(false));
    assert_eq!(jwt.lifetime_grace_period, Some(5));

    let hmac = cs[4]
        .spec
        .auth_parameter
        .hmac_auth
        .as_ref()
        .unwrap()
        .value
        .as_ref()
        .unwrap();
    assert_eq!(hmac.key_id.as_deref(), Some("hmac-key"));
    assert_eq!(hmac.secret_key, "hmac-secret");
    assert_eq!(hmac.signed_headers, ["x-custom-a"]);

    let ldap = cs[5]
        .spec
        .auth_parameter
        .ldap_auth
        .as_ref()
        .unwrap()
        .value
        .as_ref()
        .unwrap();
    assert_eq!(ldap.user_dn, "cn=user01,ou=users,dc=example,dc=org");

    let wolf = cs[6]
        .spec
        .auth_parameter
        .wolf_rbac
        .as_ref()
        .unwrap()
        .value
        .as_ref()
        .unwrap();
    assert_eq!(wolf.appid.as_deref(), Some("app-a"));
    assert_eq!(wolf.header_prefix.as_deref(), Some("X-"));
}

#[test]
fn apisix_plugin_config_and_global_rule_manifests_parse() {
    let pcs: Vec<ApisixPluginConfig> = parse_all("apisixpluginconfig.yaml", "ApisixPluginConfig");
    let pc = &pcs[0];
    assert_eq!(pc.metadata.namespace.as_deref(), Some("shared"));
    assert_eq!(pc.spec.ingress_class_name.as_deref(), Some("apisix"));
    assert_eq!(pc.spec.plugins.len(), 2);
    assert_eq!(pc.spec.plugins[0].name, "cors");
    assert_eq!(pc.spec.plugins[0].config.as_ref().unwrap()["max_age"], 3600);
    assert!(!pc.spec.plugins[1].enable);

    let grs: Vec<ApisixGlobalRule> = parse_all("apisixglobalrule.yaml", "ApisixGlobalRule");
    let gr = &grs[0];
    assert_eq!(gr.spec.plugins.len(), 2);
    assert_eq!(gr.spec.plugins[0].name, "prometheus");
    assert!(gr.spec.plugins[1].enable);
    assert_eq!(
        gr.spec.plugins[1].config.as_ref().unwrap()["header_name"],
        "X-Request-Id"
    );
}

#[test]
fn unknown_jwt_algorithm_is_rejected_naming_the_value() {
    let err = serde_yaml::from_str::<ApisixConsumerJwtAuthValue>("key: k\nalgorithm: HS1024\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("HS1024"), "{err}");
}
