//! The controller in-process against a real kube-apiserver + etcd (`sluice_e2e::Cluster`,
//! started by `scripts/cluster/testcluster.sh`): watches → rebuild → gRPC → a real dataplane client
//! → ACK → status written with server-side apply; and two replicas sharing one Lease, both
//! serving dataplanes, the leader counting them all.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::{WAIT, client_config, dataplane, eventually};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::Value;
use sluice_controller::app::{self, Settings};
use sluice_controller::grpc;
use sluice_controller::leader::LeaseConfig;
use sluice_controller::metrics::Metrics;
use sluice_controller::rebuild::{Debounce, TlsSettings};
use sluice_controller::watch::Scope;
use sluice_e2e::Cluster;
use sluice_testkit::{Wait, eventually_async};

fn cluster() -> &'static Cluster {
    static CRDS: OnceLock<()> = OnceLock::new();
    let cluster = Cluster::shared();
    CRDS.get_or_init(|| {
        let crds = sluice_e2e::repo_root().join("crds/apisix-crds.yaml");
        cluster
            .apply(&std::fs::read_to_string(crds).unwrap())
            .unwrap();
        cluster
            .kubectl_ok(&[
                "wait",
                "--for=condition=Established",
                "--timeout=30s",
                "crd",
                "--all",
            ])
            .unwrap();
    });
    cluster
}

async fn client(cluster: &Cluster) -> Client {
    let kc = Kubeconfig::read_from(cluster.kubeconfig()).unwrap();
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

fn settings(ns: &str, lease: Option<LeaseConfig>) -> Settings {
    Settings {
        ingress_class: "apisix".into(),
        scope: Scope::Namespaces(vec![ns.to_owned()]),
        debounce: Debounce::default(),
        lease,
        publish: None,
        instance: None,
        tls: TlsSettings::default(),
        dataplane_service: None,
        gateway: Default::default(),
        gateway_services: None,
        cross_namespace_refs: Default::default(),
        stream_ports: Vec::new(),
        nginx_classes: Vec::new(),
        nginx_config: Default::default(),
    }
}

/// Serves `running.hub` on a loopback port; returns the URL.
async fn serve(running: &app::Running) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(grpc::serve(
        Arc::clone(&running.hub),
        listener,
        None,
        std::future::pending(),
    ));
    url
}

fn get_json(cluster: &Cluster, args: &[&str]) -> Value {
    let mut full = vec!["get", "-o", "json"];
    full.extend_from_slice(args);
    serde_json::from_str(&cluster.kubectl_ok(&full).unwrap()).unwrap()
}

fn condition(obj: &Value, type_: &str) -> Option<Value> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

/// Polls `kubectl get` in a blocking thread until `check` is satisfied (the kit's
/// `eventually_async`: 20 s, a pause of 100 ms between two runs of kubectl).
async fn eventually_kubectl(
    what: &str,
    args: &[&str],
    check: impl Fn(&Value) -> bool + Send + 'static,
) -> Value {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let (args, check) = (&args, &check);
    let wait = Wait::up_to(Duration::from_secs(20)).every(Duration::from_millis(100));
    eventually_async(wait, || async move {
        let a = args.clone();
        let obj = tokio::task::spawn_blocking(move || {
            let refs: Vec<&str> = a.iter().map(String::as_str).collect();
            get_json(cluster(), &refs)
        })
        .await
        .unwrap();
        if check(&obj) { Ok(obj) } else { Err(obj) }
    })
    .await
    .unwrap_or_else(|obj| panic!("timed out waiting for {what}; last seen: {obj:#}"))
}

fn objects(ns: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {ns}}}
spec:
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: {ns}
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{{port: 8080}}]
endpoints: [{{addresses: ["10.251.0.2"]}}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: web, namespace: {ns}}}
spec:
  ingressClassName: apisix
  http:
  - name: main
    match: {{paths: ["/hello*"], hosts: [demo.local]}}
    backends: [{{serviceName: web, servicePort: 80}}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: bad, namespace: {ns}}}
spec:
  ingressClassName: apisix
  http:
  - name: main
    match: {{paths: ["no-slash"]}}
    backends: [{{serviceName: web, servicePort: 80}}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: other, namespace: {ns}}}
spec:
  ingressClassName: nginx
  http:
  - name: main
    match: {{paths: ["/other"]}}
    backends: [{{serviceName: web, servicePort: 80}}]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "system tier: a real kube-apiserver and etcd (scripts/cluster/testcluster.sh install; scripts/test.sh runs this)"]
async fn cluster_objects_reach_the_dataplane_and_status_says_so() {
    let cluster = tokio::task::spawn_blocking(cluster).await.unwrap();
    let ns = cluster.create_namespace("ctl").unwrap();
    cluster.apply(&objects(&ns)).unwrap();

    let running = app::start(
        client(cluster).await,
        settings(&ns, None),
        Metrics::new().unwrap(),
    );
    let url = serve(&running).await;
    let dp = dataplane(client_config(url, "dp-0", None, None));

    // The dataplane serves our valid route only; the invalid one is listed as rejected.
    assert!(
        eventually(WAIT, || { dp.store.state().routes == 1 }).await,
        "timed out waiting for: dataplane serves the route"
    );
    let route_id = format!("{ns}/web/main");
    let snap = dp.store.snapshot().unwrap();
    assert_eq!(snap.routes[0].id, route_id);
    assert_eq!(snap.upstreams[0].endpoints[0].host, "10.251.0.2");
    let rejected = dp.store.state().rejected_objects;
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(rejected[0].contains(&format!("ApisixRoute {ns}/bad: InvalidSpec")));

    // Status: Accepted + Programmed with the dataplane count, observedGeneration.
    let web = eventually_kubectl("web Programmed=True", &["ar", "web", "-n", &ns], |o| {
        condition(o, "Programmed").is_some_and(|c| c["status"] == "True")
    })
    .await;
    let accepted = condition(&web, "Accepted").unwrap();
    assert_eq!(accepted["status"], "True");
    assert_eq!(accepted["observedGeneration"], 1);
    let programmed = condition(&web, "Programmed").unwrap();
    // The route is in the first snapshot.
    assert_eq!(programmed["message"], "1/1 dataplanes at v1");
    assert_eq!(programmed["reason"], "AllDataplanesProgrammed");
    assert_eq!(web["status"]["observedGeneration"], 1);

    let bad = eventually_kubectl("bad has a status", &["ar", "bad", "-n", &ns], |o| {
        condition(o, "Accepted").is_some()
    })
    .await;
    let accepted = condition(&bad, "Accepted").unwrap();
    assert_eq!(accepted["status"], "False");
    assert_eq!(accepted["reason"], "InvalidSpec");
    assert!(
        accepted["message"]
            .as_str()
            .unwrap()
            .contains("spec.http[0].match.paths[0]"),
        "{accepted}"
    );

    // An EndpointSlice change reaches the dataplane.
    cluster
        .kubectl_ok(&[
            "patch",
            "endpointslice",
            "web-1",
            "-n",
            &ns,
            "--type",
            "merge",
            "-p",
            r#"{"endpoints":[{"addresses":["10.251.0.3"]}]}"#,
        ])
        .unwrap();
    assert!(
        eventually(WAIT, || {
            dp.store
                .snapshot()
                .is_some_and(|s| s.upstreams[0].endpoints[0].host == "10.251.0.3")
        })
        .await,
        "timed out waiting for: new endpoint served"
    );

    // A spec change: new generation, Programmed again for it.
    cluster
        .kubectl_ok(&[
            "patch",
            "ar",
            "web",
            "-n",
            &ns,
            "--type",
            "json",
            "-p",
            r#"[{"op":"replace","path":"/spec/http/0/match/paths/0","value":"/v2*"}]"#,
        ])
        .unwrap();
    assert!(
        eventually(WAIT, || {
            dp.store
                .snapshot()
                .is_some_and(|s| s.routes[0].paths == ["/v2*"])
        })
        .await,
        "timed out waiting for: new path served"
    );
    eventually_kubectl(
        "Programmed for generation 2",
        &["ar", "web", "-n", &ns],
        |o| {
            condition(o, "Programmed")
                .is_some_and(|c| c["status"] == "True" && c["observedGeneration"] == 2)
        },
    )
    .await;

    // The other class's route never gets a status from us.
    let other = get_json(cluster, &["ar", "other", "-n", &ns]);
    assert!(other.get("status").is_none(), "{other:#}");
    assert!(running.metrics.status_writes.get() >= 3);
    assert_eq!(running.metrics.nacks.get(), 0);
}

/// The dataplane Service `dp` with one ready endpoint per id, as the EndpointSlice
/// controller writes it for the dataplane pods (the pod name is the dataplane id).
fn dataplane_service(ns: &str, ids: &[&str]) -> String {
    let endpoints: String = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            format!(
                "  - addresses: [\"192.0.2.{}\"]\n    conditions: {{ready: true, serving: true, terminating: false}}\n    targetRef: {{kind: Pod, name: {id}, namespace: {ns}}}\n",
                i + 1
            )
        })
        .collect();
    let endpoints = if ids.is_empty() {
        "endpoints: []\n".to_owned()
    } else {
        format!("endpoints:\n{endpoints}")
    };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: dp, namespace: {ns}}}\nspec:\n  ports: [{{name: http, port: 80}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: dp-1\n  namespace: {ns}\n  labels: {{kubernetes.io/service-name: dp}}\naddressType: IPv4\nports: [{{name: http, port: 9080}}]\n{endpoints}"
    )
}

fn programmed_message(obj: &Value) -> Option<(String, String)> {
    let c = condition(obj, "Programmed")?;
    Some((
        c["status"].as_str()?.to_owned(),
        c["message"].as_str()?.to_owned(),
    ))
}

/// Two replicas, one Lease: both serve dataplanes; the leader alone writes status, and its
/// `Programmed` counts the dataplanes of the dataplane Service, whichever replica serves
/// them; when the leader goes away the follower takes over and its dataplanes never wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "system tier: a real kube-apiserver and etcd (scripts/cluster/testcluster.sh install; scripts/test.sh runs this)"]
async fn every_replica_serves_and_the_leader_counts_the_expected_dataplanes() {
    let cluster = tokio::task::spawn_blocking(cluster).await.unwrap();
    let ns = cluster.create_namespace("lease").unwrap();
    cluster.apply(&objects(&ns)).unwrap();
    cluster
        .apply(&dataplane_service(&ns, &["dp-a", "dp-b"]))
        .unwrap();
    let replica = |id: &str| {
        let mut cfg = LeaseConfig::new("sluice-test", &ns, id);
        cfg.lease_duration = Duration::from_secs(4);
        cfg.retry_period = Duration::from_millis(300);
        Settings {
            dataplane_service: Some((ns.clone(), "dp".to_owned())),
            ..settings(&ns, Some(cfg))
        }
    };
    let a = app::start(client(cluster).await, replica("a"), Metrics::new().unwrap());
    let mut a_leader = a.leader.clone();
    tokio::time::timeout(Duration::from_secs(10), a_leader.wait_for(|l| *l))
        .await
        .unwrap()
        .unwrap();
    let b = app::start(client(cluster).await, replica("b"), Metrics::new().unwrap());
    let a_url = serve(&a).await;
    let b_url = serve(&b).await;

    // The follower serves its dataplane as the leader serves its own.
    // NB: a replica refuses dataplanes until it has its first snapshot; dp-a, given both
    // replicas, would then go to b. Both have one before the dataplanes dial.
    assert!(
        eventually(WAIT, || {
            a.metrics.snapshot_version.get() > 0 && b.metrics.snapshot_version.get() > 0
        })
        .await,
        "timed out waiting for: both replicas have a snapshot"
    );
    let dp_b = dataplane(client_config(b_url.clone(), "dp-b", None, None));
    let dp_a = dataplane(client_config(
        format!("{a_url},{b_url}"),
        "dp-a",
        None,
        None,
    ));
    assert!(
        eventually(WAIT, || { dp_b.store.state().routes == 1 }).await,
        "timed out waiting for: the follower serves dp-b"
    );
    assert!(
        eventually(WAIT, || dp_a.store.state().routes == 1).await,
        "timed out waiting for: the leader serves dp-a"
    );
    assert!(!*b.leader.borrow());
    assert_eq!(b.metrics.connected_dataplanes.get(), 1);
    assert_eq!(
        dp_a.store.state().hash,
        dp_b.store.state().hash,
        "same content from both replicas"
    );

    // The leader counts both, though it serves one: dp-b's ACK reached it through b's record.
    let web = eventually_kubectl("web Programmed 2/2", &["ar", "web", "-n", &ns], |o| {
        programmed_message(o).is_some_and(|(s, m)| s == "True" && m.starts_with("2/2 dataplanes"))
    })
    .await;
    assert_eq!(
        condition(&web, "Programmed").unwrap()["reason"],
        "AllDataplanesProgrammed"
    );
    assert_eq!(
        b.metrics.status_writes.get(),
        0,
        "only the leader writes status"
    );
    let records = get_json(
        cluster,
        &[
            "lease",
            "-n",
            &ns,
            "-l",
            "sluice.dev/replica-of=sluice-test",
        ],
    );
    let holders: Vec<&str> = records["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["spec"]["holderIdentity"].as_str())
        .collect();
    assert_eq!(holders, ["a", "b"], "one record per replica: {records:#}");

    // A dataplane pod that should serve but never connected holds Programmed back, by name.
    cluster
        .apply(&dataplane_service(&ns, &["dp-a", "dp-b", "dp-c"]))
        .unwrap();
    eventually_kubectl("web waits for dp-c", &["ar", "web", "-n", &ns], |o| {
        programmed_message(o).is_some_and(|(s, m)| {
            s == "False"
                && m.starts_with("2/3 dataplanes")
                && m.ends_with("waiting for: dp-c (not connected)")
        })
    })
    .await;
    // Its pod goes away: it leaves the expected set.
    cluster
        .apply(&dataplane_service(&ns, &["dp-a", "dp-b"]))
        .unwrap();
    eventually_kubectl("web 2/2 again", &["ar", "web", "-n", &ns], |o| {
        programmed_message(o).is_some_and(|(s, m)| s == "True" && m.starts_with("2/2"))
    })
    .await;

    // The leader goes away without releasing: dp-a redials b at once; b takes over the
    // Lease once it expires, and counts both dataplanes for a change made after that.
    // NB: closing the hub ends a's streams and refuses new ones (its server keeps running).
    a.hub.close();
    drop(a);
    assert!(
        eventually(WAIT, || { b.metrics.connected_dataplanes.get() == 2 }).await,
        "timed out waiting for: dp-a moved to b"
    );
    let mut b_leader = b.leader.clone();
    tokio::time::timeout(Duration::from_secs(15), b_leader.wait_for(|l| *l))
        .await
        .unwrap()
        .unwrap();
    cluster
        .kubectl_ok(&[
            "patch",
            "ar",
            "web",
            "-n",
            &ns,
            "--type",
            "json",
            "-p",
            r#"[{"op":"replace","path":"/spec/http/0/match/paths/0","value":"/v2*"}]"#,
        ])
        .unwrap();
    assert!(
        eventually(WAIT, || {
            [&dp_a, &dp_b].iter().all(|dp| {
                dp.store
                    .snapshot()
                    .is_some_and(|s| s.routes[0].paths == ["/v2*"])
            })
        })
        .await,
        "timed out waiting for: both serve the change"
    );
    eventually_kubectl(
        "generation 2 Programmed 2/2 by the new leader",
        &["ar", "web", "-n", &ns],
        |o| {
            condition(o, "Programmed").is_some_and(|c| {
                c["status"] == "True"
                    && c["observedGeneration"] == 2
                    && c["message"].as_str().is_some_and(|m| m.starts_with("2/2"))
            })
        },
    )
    .await;
    let lease_obj = get_json(cluster, &["lease", "sluice-test", "-n", &ns]);
    assert_eq!(lease_obj["spec"]["holderIdentity"], "b");
    assert_eq!(lease_obj["spec"]["leaseTransitions"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "system tier: a real kube-apiserver and etcd (scripts/cluster/testcluster.sh install; scripts/test.sh runs this)"]
async fn rejections_become_events_and_accepted_ingresses_get_the_published_address() {
    use sluice_controller::status::Publish;

    let cluster = tokio::task::spawn_blocking(cluster).await.unwrap();
    let ns = cluster.create_namespace("ev").unwrap();
    cluster
        .apply(&format!(
            r#"
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {ns}}}
spec:
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: bad, namespace: {ns}}}
spec:
  ingressClassName: apisix
  http:
  - name: main
    match: {{paths: ["no-slash"]}}
    backends: [{{serviceName: web, servicePort: 80}}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: good, namespace: {ns}}}
spec:
  ingressClassName: apisix
  rules:
  - host: good.example
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: broken, namespace: {ns}}}
spec:
  ingressClassName: apisix
  rules:
  - host: broken.example
    http:
      paths:
      - {{path: "/a*", pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}
"#
        ))
        .unwrap();

    let mut s = settings(&ns, None);
    s.publish = Some(Publish::Addresses(vec![
        "192.0.2.10".into(),
        "ingress.example.com".into(),
    ]));
    let _running = app::start(client(cluster).await, s, Metrics::new().unwrap());

    // A Warning event names the field, for the ApisixRoute and for the Ingress.
    for (kind, name, field) in [
        ("ApisixRoute", "bad", "spec.http[0].match.paths[0]"),
        ("Ingress", "broken", "spec.rules[0].http.paths[0].path"),
    ] {
        let selector = format!("involvedObject.name={name},involvedObject.kind={kind}");
        let events = eventually_kubectl(
            &format!("a Warning event for {kind} {name}"),
            &["events", "-n", &ns, "--field-selector", &selector],
            |o| o["items"].as_array().is_some_and(|i| !i.is_empty()),
        )
        .await;
        let ev = &events["items"][0];
        assert_eq!(ev["type"], "Warning", "{ev:#}");
        assert_eq!(ev["reason"], "InvalidSpec", "{ev:#}");
        assert!(
            ev["involvedObject"]["uid"]
                .as_str()
                .is_some_and(|u| !u.is_empty()),
            "{ev:#}"
        );
        let msg = ev["message"].as_str().unwrap();
        assert!(msg.contains(field), "{kind} {name}: {msg}");
    }

    // The accepted Ingress shows the published address; the rejected one none.
    let good = eventually_kubectl(
        "Ingress good has status.loadBalancer",
        &["ingress", "good", "-n", &ns],
        |o| o.pointer("/status/loadBalancer/ingress").is_some(),
    )
    .await;
    assert_eq!(
        good["status"]["loadBalancer"]["ingress"],
        serde_json::json!([{"ip": "192.0.2.10"}, {"hostname": "ingress.example.com"}])
    );
    let broken = get_json(cluster, &["ingress", "broken", "-n", &ns]);
    assert!(
        broken.pointer("/status/loadBalancer/ingress").is_none(),
        "{broken:#}"
    );

    // Events are not repeated for an unchanged rejection across rebuilds.
    cluster
        .kubectl_ok(&["annotate", "ar", "bad", "-n", &ns, "touched=1"])
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let events = get_json(
        cluster,
        &[
            "events",
            "-n",
            &ns,
            "--field-selector",
            "involvedObject.name=bad",
        ],
    );
    assert_eq!(events["items"].as_array().unwrap().len(), 1, "{events:#}");
    assert!(events["items"][0]["series"].is_null(), "{events:#}");
}

/// Endpoints of upstream `id` in the dataplane's current snapshot.
fn endpoints_of(dp: &common::Dataplane, id: &str) -> Option<Vec<String>> {
    let snap = dp.store.snapshot()?;
    let up = snap.upstreams.iter().find(|u| u.id == id)?;
    Some(up.endpoints.iter().map(|e| e.host.clone()).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "system tier: a real kube-apiserver and etcd (scripts/cluster/testcluster.sh install; scripts/test.sh runs this)"]
async fn subsets_follow_pod_labels() {
    let cluster = tokio::task::spawn_blocking(cluster).await.unwrap();
    let ns = cluster.create_namespace("subsets").unwrap();
    // No kubelet in the test cluster: the Pods stay Pending, which is all a subset needs
    // (their labels, through the EndpointSlice targetRefs).
    let pod = |name: &str, version: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {{app: web, version: {version}}}}}\nspec:\n  automountServiceAccountToken: false\n  containers: [{{name: web, image: example.invalid/web:1}}]\n---\n"
        )
    };
    let yaml = format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: default, namespace: {ns}}}
---
{}{}apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {ns}}}
spec:
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: {ns}
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{{port: 8080}}]
endpoints:
- addresses: ["10.251.1.1"]
  targetRef: {{kind: Pod, name: web-a, namespace: {ns}}}
- addresses: ["10.251.1.2"]
  targetRef: {{kind: Pod, name: web-b, namespace: {ns}}}
---
apiVersion: apisix.apache.org/v2
kind: ApisixUpstream
metadata: {{name: web, namespace: {ns}}}
spec:
  ingressClassName: apisix
  subsets:
  - name: v1
    labels: {{version: v1}}
---
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {{name: web, namespace: {ns}}}
spec:
  ingressClassName: apisix
  http:
  - name: main
    match: {{paths: ["/*"]}}
    backends: [{{serviceName: web, servicePort: 80, subset: v1}}]
"#,
        pod("web-a", "v1"),
        pod("web-b", "v2"),
    );
    cluster.apply(&yaml).unwrap();

    let running = app::start(
        client(cluster).await,
        settings(&ns, None),
        Metrics::new().unwrap(),
    );
    let url = serve(&running).await;
    let dp = dataplane(client_config(url, "dp-0", None, None));
    let id = format!("{ns}/web:80#v1");

    // Only the v1 Pod's endpoint is in the subset.
    assert!(
        eventually(WAIT, || {
            endpoints_of(&dp, &id).is_some_and(|e| e == ["10.251.1.1"])
        })
        .await,
        "timed out waiting for: subset holds the v1 Pod"
    );
    let web = eventually_kubectl("web ResolvedRefs=True", &["ar", "web", "-n", &ns], |o| {
        condition(o, "ResolvedRefs").is_some_and(|c| c["status"] == "True")
    })
    .await;
    assert_eq!(condition(&web, "Accepted").unwrap()["status"], "True");

    // Relabeling web-b into v1 moves it into the subset.
    let label = |pod: &str, version: &str| {
        cluster
            .kubectl_ok(&[
                "label",
                "pod",
                pod,
                "-n",
                &ns,
                "--overwrite",
                &format!("version={version}"),
            ])
            .unwrap();
    };
    label("web-b", "v1");
    assert!(
        eventually(WAIT, || {
            endpoints_of(&dp, &id).is_some_and(|e| e == ["10.251.1.1", "10.251.1.2"])
        })
        .await,
        "timed out waiting for: web-b joins the subset"
    );

    // Relabeling web-a out of v1 moves it out.
    label("web-a", "v3");
    assert!(
        eventually(WAIT, || {
            endpoints_of(&dp, &id).is_some_and(|e| e == ["10.251.1.2"])
        })
        .await,
        "timed out waiting for: web-a leaves the subset"
    );

    // No v1 Pod left: the upstream is empty and the route says why.
    label("web-b", "v2");
    assert!(
        eventually(WAIT, || {
            endpoints_of(&dp, &id).is_some_and(|e| e.is_empty())
        })
        .await,
        "timed out waiting for: subset empty"
    );
    let web = eventually_kubectl("web ResolvedRefs=False", &["ar", "web", "-n", &ns], |o| {
        condition(o, "ResolvedRefs").is_some_and(|c| c["status"] == "False")
    })
    .await;
    let msg = condition(&web, "ResolvedRefs").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        msg.contains("spec.http[0].backends[0].subset") && msg.contains("version=v1"),
        "{msg}"
    );

    // A Pod change that is not a label change does not trigger a rebuild.
    let skipped = || {
        running
            .metrics
            .watch_events
            .with_label_values(&["Pod", "skipped"])
            .get()
    };
    let before = skipped();
    cluster
        .kubectl_ok(&["annotate", "pod", "web-a", "-n", &ns, "note=hello"])
        .unwrap();
    assert!(
        eventually(WAIT, || skipped() > before).await,
        "timed out waiting for: annotation skipped"
    );
    assert_eq!(running.metrics.nacks.get(), 0);
}

/// A kubernetes.io/tls Secret `<name>-cert` (self-signed for `host`, valid until
/// `not_after`) and an ApisixTls `<name>` serving it.
fn tls_objects(ns: &str, name: &str, host: &str, not_after: std::time::SystemTime) -> String {
    let mut params = sluice_testkit::pki::params_for(&[host]);
    params.not_before = time::OffsetDateTime::now_utc() - Duration::from_secs(3600);
    params.not_after = time::OffsetDateTime::from(not_after);
    let cert = sluice_testkit::pki::self_signed_from(params);
    let indent = |t: &str| t.lines().map(|l| format!("    {l}\n")).collect::<String>();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}-cert, namespace: {ns}}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}---\napiVersion: apisix.apache.org/v2\nkind: ApisixTls\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  ingressClassName: apisix\n  hosts: [{host}]\n  secret: {{name: {name}-cert, namespace: {ns}}}\n---\n",
        indent(&cert.pem),
        indent(&cert.key_pem)
    )
}

/// Certificate expiry on a timer: a certificate that expires a few seconds after it was
/// applied turns its ApisixTls `Accepted=False` ("expired at ...") and leaves the
/// dataplane's table without any object changing; with `--default-ssl-certificate` its
/// host then gets the default certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "system tier: a real kube-apiserver and etcd (scripts/cluster/testcluster.sh install; scripts/test.sh runs this)"]
async fn an_expiring_certificate_is_rejected_when_it_expires() {
    let cluster = tokio::task::spawn_blocking(cluster).await.unwrap();
    let ns = cluster.create_namespace("tlsexp").unwrap();
    let now = std::time::SystemTime::now();
    let soon = now + Duration::from_secs(6);
    let later = now + Duration::from_secs(86_400);
    cluster
        .apply(&format!(
            "{}{}",
            tls_objects(&ns, "soon", "soon.example.com", soon),
            tls_objects(&ns, "later", "later.example.com", later)
        ))
        .unwrap();

    let mut settings = settings(&ns, None);
    settings.tls = TlsSettings {
        default_certificate: Some((ns.clone(), "later-cert".into())),
        fallback_sni: None,
    };
    let running = app::start(client(cluster).await, settings, Metrics::new().unwrap());
    let url = serve(&running).await;
    let dp = dataplane(client_config(url, "dp-0", None, None));
    assert!(
        eventually(WAIT, || {
            dp.store
                .snapshot()
                .is_some_and(|s| s.tls_certificates.len() == 2 && s.default_certificate.is_some())
        })
        .await,
        "timed out waiting for: dataplane serves both certificates and the default"
    );
    let table = dp.store.table();
    let entry = table.tls.select(Some("soon.example.com")).unwrap();
    assert_eq!(entry.id, format!("{ns}/soon"));
    drop(table);
    eventually_kubectl(
        "soon Accepted=True",
        &["apisixtls", "soon", "-n", &ns],
        |o| condition(o, "Accepted").is_some_and(|c| c["status"] == "True"),
    )
    .await;

    // Nothing is changed from here on.
    let soon_tls = eventually_kubectl(
        "soon Accepted=False after its expiry",
        &["apisixtls", "soon", "-n", &ns],
        |o| condition(o, "Accepted").is_some_and(|c| c["status"] == "False"),
    )
    .await;
    assert!(std::time::SystemTime::now() > soon);
    let accepted = condition(&soon_tls, "Accepted").unwrap();
    assert_eq!(accepted["reason"], "InvalidCertificateRef");
    let message = accepted["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("Secret {ns}/soon-cert")) && message.contains("expired at"),
        "{message}"
    );
    assert!(
        eventually(WAIT, || {
            dp.store
                .snapshot()
                .is_some_and(|s| s.tls_certificates.len() == 1)
        })
        .await,
        "timed out waiting for: dataplane no longer serves the expired certificate"
    );
    let table = dp.store.table();
    assert!(table.tls.lookup("soon.example.com").is_none());
    assert_eq!(
        table.tls.select(Some("soon.example.com")).unwrap().id,
        "default-certificate",
        "the expired host now gets the default certificate"
    );
    assert_eq!(
        table.tls.select(Some("later.example.com")).unwrap().id,
        format!("{ns}/later")
    );
    let later_tls = get_json(cluster, &["apisixtls", "later", "-n", &ns]);
    assert_eq!(condition(&later_tls, "Accepted").unwrap()["status"], "True");
}
