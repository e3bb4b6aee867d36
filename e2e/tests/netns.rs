//! Backends in network namespaces, reachable from the root namespace at private addresses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Command;

use sluice_e2e::{Cluster, Netns, http_get};

fn ip(args: &[&str]) -> (bool, String) {
    let out = Command::new("ip").args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn echo_server_name(addr: SocketAddr, path: &str) -> String {
    let resp = http_get(addr, "backend.test", path).unwrap();
    assert_eq!(resp.status, 200, "{resp:?}");
    let body: serde_json::Value = serde_json::from_str(&resp.body).unwrap();
    assert_eq!(body["path"], path, "{body}");
    body["server"].as_str().unwrap().to_owned()
}

#[test]
fn an_echo_backend_in_a_netns_answers_at_its_private_address() {
    let netns = Netns::create();
    let addr = netns.addr();
    assert!(addr.is_private() && !addr.is_loopback(), "{addr}");
    let backend = netns.spawn_echo("alpha", addr, 8080).unwrap();
    assert_eq!(echo_server_name(backend.addr(), "/hello"), "alpha");

    // The backend really runs inside the namespace, not in the root one.
    let (ok, identify) = ip(&["netns", "identify", &backend.pid().to_string()]);
    assert!(ok);
    assert_eq!(identify.trim(), netns.name());
    // The private address exists only on the veth pair, the root end being .1 of the /28.
    let (_, root_addrs) = ip(&["-4", "-o", "addr", "show"]);
    assert!(
        root_addrs.contains(&format!("{}/28", netns.host_addr())),
        "{root_addrs}"
    );
    assert!(!root_addrs.contains(&format!(" {addr}/")), "{root_addrs}");
}

#[test]
fn extra_addresses_serve_separate_backends_on_the_same_port() {
    let mut netns = Netns::create();
    let first = netns.addr();
    let second = netns.add_address().unwrap();
    assert_ne!(first, second);
    let a = netns.spawn_echo("a", first, 9000).unwrap();
    let b = netns.spawn_echo("b", second, 9000).unwrap();
    assert_eq!(echo_server_name(a.addr(), "/"), "a");
    assert_eq!(echo_server_name(b.addr(), "/x"), "b");
    assert_eq!(netns.addrs(), [first, second]);
}

#[test]
fn namespaces_get_disjoint_subnets_and_vanish_on_drop() {
    let a = Netns::create();
    let b = Netns::create();
    assert_ne!(a.name(), b.name());
    assert_ne!(a.subnet(), b.subnet());
    let backend = b.spawn_echo("b", b.addr(), 8081).unwrap();
    let name = a.name().to_owned();
    let a_addr = a.host_addr();
    drop(a);
    let (_, list) = ip(&["netns", "list"]);
    assert!(
        !list
            .lines()
            .any(|l| l.split_whitespace().next() == Some(name.as_str())),
        "{list}"
    );
    let (_, addrs) = ip(&["-4", "-o", "addr", "show"]);
    assert!(!addrs.contains(&format!(" {a_addr}/")), "{addrs}");
    // The other namespace is untouched.
    assert_eq!(echo_server_name(backend.addr(), "/still"), "b");
}

#[test]
fn the_api_server_accepts_a_netns_address_in_an_endpointslice_but_not_loopback() {
    let cluster = Cluster::shared();
    let netns = Netns::create();
    let ns = cluster.create_namespace("slices").unwrap();
    let slice = |name: &str, addr: &str| {
        format!(
            r#"apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}
  namespace: {ns}
  labels: {{kubernetes.io/service-name: echo}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
- addresses: ["{addr}"]
  conditions: {{ready: true}}
"#
        )
    };
    let ok = cluster
        .kubectl_stdin(
            &["apply", "-f", "-"],
            &slice("echo-netns", &netns.addr().to_string()),
        )
        .unwrap();
    assert!(ok.success, "{}", ok.stderr);
    let stored = cluster
        .kubectl_ok(&[
            "get",
            "endpointslice",
            "echo-netns",
            "-n",
            &ns,
            "-o",
            "jsonpath={.endpoints[0].addresses[0]}",
        ])
        .unwrap();
    assert_eq!(stored, netns.addr().to_string());

    let loopback = cluster
        .kubectl_stdin(&["apply", "-f", "-"], &slice("echo-loopback", "127.0.0.1"))
        .unwrap();
    assert!(!loopback.success);
    assert!(loopback.stderr.contains("loopback"), "{}", loopback.stderr);
}

#[test]
fn a_backend_that_dies_before_listening_is_reported_with_its_exit_status() {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo 'cannot bind' >&2; exit 3"]);
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let err = sluice_e2e::Backend::spawn(cmd, addr, std::time::Duration::from_secs(30))
        .unwrap_err()
        .to_string();
    assert!(err.contains("exit status: 3"), "{err}");
    assert!(err.contains("127.0.0.1:9"), "{err}");
    // The exit status in the message means it gave up when the process died, not at the
    // (30 s) timeout.
}
