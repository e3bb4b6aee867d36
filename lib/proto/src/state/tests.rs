#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::v1::resource::Body;

// --- fixtures -------------------------------------------------------------------------

fn endpoints(salt: u64) -> Vec<v1::Endpoint> {
    (0..1 + salt % 3)
        .map(|i| v1::Endpoint {
            host: format!("10.0.{}.{i}", salt % 7),
            port: 8080,
            weight: 100,
        })
        .collect()
}

fn route(id: &str, salt: u64) -> v1::Route {
    v1::Route {
        id: id.into(),
        source: format!("ApisixRoute {id}"),
        priority: (salt % 3) as i32,
        hosts: vec![format!("h{}.example.com", salt % 5)],
        paths: vec![format!("/p{salt}*")],
        backends: vec![v1::Backend {
            upstream_id: format!("ns/svc{}:80", salt % 4),
            weight: 100,
            plugins: Vec::new(),
        }],
        ..Default::default()
    }
}

fn upstream(id: &str, salt: u64) -> v1::Upstream {
    v1::Upstream {
        id: id.into(),
        load_balancer: (salt % 2) as i32,
        retries: salt.is_multiple_of(5).then_some(2),
        endpoints: endpoints(salt),
        ..Default::default()
    }
}

fn certificate(id: &str, salt: u64) -> v1::TlsCertificate {
    v1::TlsCertificate {
        id: id.into(),
        source: format!("ApisixTls {id}"),
        hosts: vec![format!("c{}.example.com", salt % 9)],
        cert_chain_pem: format!("cert {salt}"),
        private_key_pem: format!("key {salt}"),
        client_auth: None,
    }
}

fn consumer(name: &str, salt: u64) -> v1::Consumer {
    v1::Consumer {
        name: name.into(),
        plugins: vec![v1::Plugin {
            name: "key-auth".into(),
            config_json: format!("{{\"key\":\"k{salt}\"}}"),
        }],
    }
}

fn global_rule(id: &str, salt: u64) -> v1::GlobalRule {
    v1::GlobalRule {
        id: id.into(),
        plugins: vec![v1::Plugin {
            name: "cors".into(),
            config_json: format!("{{\"max_age\":{salt}}}"),
        }],
    }
}

fn listener(id: &str, salt: u64) -> v1::Listener {
    v1::Listener {
        id: id.into(),
        source: format!("Gateway {id}"),
        port: 8000 + (salt % 100) as u32,
        tls: salt.is_multiple_of(2),
        ..Default::default()
    }
}

fn stream_route(id: &str, salt: u64) -> v1::StreamRoute {
    v1::StreamRoute {
        id: id.into(),
        listeners: vec![format!("ns/gw/{}", 9000 + salt % 3)],
        backends: vec![v1::Backend {
            upstream_id: "ns/db:5432".into(),
            weight: 1,
            plugins: Vec::new(),
        }],
        idle_timeout_ms: salt,
        ..Default::default()
    }
}

/// The resources of a snapshot by kind and id: what a random edit sequence changes.
#[derive(Clone, Default, Debug)]
struct World {
    routes: BTreeMap<String, v1::Route>,
    upstreams: BTreeMap<String, v1::Upstream>,
    certificates: BTreeMap<String, v1::TlsCertificate>,
    consumers: BTreeMap<String, v1::Consumer>,
    global_rules: BTreeMap<String, v1::GlobalRule>,
    listeners: BTreeMap<String, v1::Listener>,
    stream_routes: BTreeMap<String, v1::StreamRoute>,
    default_certificate: Option<v1::TlsCertificate>,
    fallback_sni: String,
}

/// One edit: (kind, id, action, salt).
type Op = (u8, u8, u8, u16);

fn edit<T>(map: &mut BTreeMap<String, T>, id: String, action: u8, make: impl FnOnce(&str) -> T) {
    if action == 0 {
        map.remove(&id);
    } else {
        let v = make(&id);
        map.insert(id, v);
    }
}

impl World {
    fn apply(&mut self, (kind, id, action, salt): Op) {
        let salt = u64::from(salt);
        let n = id % 6;
        // NB: namespaces `a` and `a-b` sort differently as (namespace, name) and as
        // `namespace/name`: global rules exercise translate's order.
        let ns = if n % 2 == 0 { "a" } else { "a-b" };
        let id = format!("{ns}/o{n}");
        match kind % 9 {
            0 => edit(
                &mut self.routes,
                format!("{id}/rule{}", n % 2),
                action,
                |id| route(id, salt),
            ),
            1 => {
                let id = format!("{id}:80");
                match (action, self.upstreams.get_mut(&id)) {
                    // Endpoints only.
                    (3, Some(up)) => up.endpoints = endpoints(salt.wrapping_add(1)),
                    _ => edit(&mut self.upstreams, id, action, |id| upstream(id, salt)),
                }
            }
            2 => edit(&mut self.certificates, id, action, |id| {
                certificate(id, salt)
            }),
            3 => edit(&mut self.consumers, format!("{ns}_o{n}"), action, |name| {
                consumer(name, salt)
            }),
            4 => edit(&mut self.global_rules, id, action, |id| {
                global_rule(id, salt)
            }),
            5 => edit(&mut self.listeners, id, action, |id| listener(id, salt)),
            6 => edit(&mut self.stream_routes, id, action, |id| {
                stream_route(id, salt)
            }),
            7 => {
                self.default_certificate =
                    (action != 0).then(|| certificate("default-certificate", salt));
            }
            _ => {
                self.fallback_sni = if action == 0 {
                    String::new()
                } else {
                    format!("f{salt}.example.com")
                };
            }
        }
    }

    /// The snapshot translate would produce (unsealed), with `version`.
    fn snapshot(&self, version: u64) -> Snapshot {
        let mut global_rules: Vec<_> = self.global_rules.values().cloned().collect();
        global_rules.sort_by(|a, b| namespace_name(&a.id).cmp(&namespace_name(&b.id)));
        Snapshot {
            version,
            hash: String::new(),
            routes: self.routes.values().cloned().collect(),
            upstreams: self.upstreams.values().cloned().collect(),
            tls_certificates: self.certificates.values().cloned().collect(),
            default_certificate: self.default_certificate.clone(),
            fallback_sni: self.fallback_sni.clone(),
            consumers: self.consumers.values().cloned().collect(),
            global_rules,
            listeners: self.listeners.values().cloned().collect(),
            stream_routes: self.stream_routes.values().cloned().collect(),
        }
    }
}

fn state(s: Snapshot) -> SnapshotState {
    SnapshotState::from_snapshot(s).unwrap()
}

/// A state with two routes, two upstreams and settings, at version 1.
fn base() -> SnapshotState {
    let mut w = World::default();
    for op in [
        (0, 0, 1, 1),
        (0, 1, 1, 2),
        (1, 0, 1, 3),
        (1, 1, 1, 4),
        (8, 0, 1, 5),
    ] {
        w.apply(op);
    }
    state(w.snapshot(1))
}

fn one_delta(from: &SnapshotState, to: &SnapshotState) -> v1::Delta {
    let mut d = chunks(&diff(from, to), usize::MAX);
    assert_eq!(d.len(), 1);
    d.remove(0)
}

fn key(kind: ResourceKind, id: &str) -> v1::ResourceKey {
    v1::ResourceKey {
        kind: kind as i32,
        id: id.into(),
    }
}

// --- the property: delta = full --------------------------------------------------------

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec((0u8..9, 0u8..6, 0u8..4, any::<u16>()), 0..8)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// At every step of a random edit sequence, the previous state plus the chunked diff
    /// equals the state of the next full snapshot, in value, in v2 hash and in snapshot.
    /// Skipping a step is refused (base mismatch) and a full resend converges.
    #[test]
    fn delta_applied_equals_full(
        steps in prop::collection::vec(ops(), 1..24),
        max_bytes in prop_oneof![Just(usize::MAX), 60usize..1500],
    ) {
        let mut world = World::default();
        let mut served = SnapshotState::empty();
        let mut stale: Option<SnapshotState> = None;
        for (i, step) in steps.into_iter().enumerate() {
            for op in step {
                world.apply(op);
            }
            let version = i as u64 + 1;
            let expected = world.snapshot(version);
            let full = state(expected.clone());
            let changes = diff(&served, &full);
            let deltas = chunks(&changes, max_bytes);
            for d in &deltas {
                let items = d.removed.len() + d.upserts.len();
                prop_assert!(items > 0 || deltas.len() == 1, "an empty chunk {}", d.chunk);
                prop_assert!(d.encoded_len() <= max_bytes || items <= 1,
                    "chunk {} is {} bytes with {items} items", d.chunk, d.encoded_len());
            }
            let applied = served.apply_chunks(&deltas);
            prop_assert!(applied.is_ok(), "step {i}: {:?}", applied.err());
            let applied = applied.unwrap();
            prop_assert_eq!(applied.hash(), full.hash());
            prop_assert_eq!(&applied, &full);
            prop_assert_eq!(applied.to_snapshot(), Snapshot { version: 0, ..expected });

            // A dataplane that missed the previous delta: refused, then healed by a full resend.
            if let Some(stale) = stale.take() && stale.hash() != served.hash() {
                let refused = stale.apply_chunks(&deltas);
                prop_assert!(matches!(refused, Err(DeltaError::BaseMismatch { .. })),
                    "{refused:?}");
                let healed = stale.apply_chunks(&chunks(&ChangeSet::full(&full), max_bytes));
                prop_assert_eq!(healed.as_ref().ok(), Some(&full));
            }
            stale = Some(std::mem::replace(&mut served, applied));
        }
    }
}

// --- unit tests ------------------------------------------------------------------------

#[test]
fn hash_is_of_the_set_not_the_order_nor_the_version() {
    let a = base();
    let mut s = a.to_snapshot();
    s.routes.reverse();
    s.upstreams.reverse();
    s.version = 9;
    let b = state(s);
    assert_eq!(a.hash(), b.hash());
    assert!(a.hash().starts_with("v2:"), "{}", a.hash());
    assert_eq!(a.hash().len(), 3 + 64);
    assert_ne!(a.hash(), SnapshotState::empty().hash());
}

#[test]
fn any_byte_changes_the_hash() {
    let a = base();
    let mut s = a.to_snapshot();
    s.routes[0].paths[0].push('x');
    assert_ne!(state(s).hash(), a.hash());
    let mut s = a.to_snapshot();
    s.upstreams[1].endpoints[0].port += 1;
    assert_ne!(state(s).hash(), a.hash());
    let mut s = a.to_snapshot();
    s.fallback_sni.clear();
    assert_ne!(state(s).hash(), a.hash());
}

#[test]
fn v1_hash_is_unchanged() {
    // The v1 hash of a state's snapshot is the one `seal` gives today.
    let snap = base().to_snapshot();
    assert_eq!(crate::content_hash(&snap).len(), 64);
    assert_eq!(
        crate::seal(snap.clone(), 4).hash,
        crate::content_hash(&snap)
    );
}

#[test]
fn endpoint_only_change_is_upstream_endpoints() {
    let a = base();
    let mut s = a.to_snapshot();
    s.upstreams[0].endpoints = endpoints(40);
    s.version = 2;
    let b = state(s);
    let cs = diff(&a, &b);
    assert!(cs.removed.is_empty());
    assert_eq!(cs.upserts.len(), 1, "{cs:?}");
    let Some(Body::Endpoints(e)) = &cs.upserts[0].body else {
        panic!("expected endpoints, got {:?}", cs.upserts[0]);
    };
    assert_eq!(e.upstream_id, b.to_snapshot().upstreams[0].id);
    let applied = a.apply(&one_delta(&a, &b)).unwrap();
    assert_eq!(applied, b);
    // The routes were not copied: the map is the base's.
    assert!(Arc::ptr_eq(&a.routes, &applied.routes));
    assert!(!Arc::ptr_eq(&a.upstreams, &applied.upstreams));

    // Another field too: the whole upstream.
    let mut s = b.to_snapshot();
    s.upstreams[0].endpoints = endpoints(41);
    s.upstreams[0].retries = Some(7);
    let c = state(s);
    let cs = diff(&b, &c);
    assert!(
        matches!(cs.upserts[0].body, Some(Body::Upstream(_))),
        "{cs:?}"
    );
}

#[test]
fn to_snapshot_keeps_translates_order() {
    let mut w = World::default();
    for op in [
        (4, 0, 1, 1),
        (4, 1, 1, 2),
        (0, 0, 1, 3),
        (0, 1, 1, 4),
        (3, 1, 1, 5),
        (3, 0, 1, 6),
    ] {
        w.apply(op);
    }
    let s = w.snapshot(0);
    // `a-b/o1` before `a/o0` by id, after it by (namespace, name).
    assert_eq!(
        s.global_rules
            .iter()
            .map(|g| g.id.as_str())
            .collect::<Vec<_>>(),
        ["a/o0", "a-b/o1"]
    );
    assert_eq!(state(s.clone()).to_snapshot(), s);
}

#[test]
fn duplicate_id_in_a_snapshot_is_refused() {
    let mut s = base().to_snapshot();
    s.routes.push(s.routes[0].clone());
    let err = SnapshotState::from_snapshot(s).unwrap_err();
    assert_eq!(err.kind, ResourceKind::Route);
}

#[test]
fn shared_resources_are_skipped_by_diff() {
    let a = base();
    let b = a.apply(&one_delta(&a, &a)).unwrap();
    assert!(diff(&a, &b).is_empty());
    assert!(Arc::ptr_eq(
        a.routes().values().next().unwrap(),
        b.routes().values().next().unwrap()
    ));
}

/// Every malformed delta is refused with its error, and the state stays as it was.
#[test]
fn malformed_deltas_are_refused() {
    let a = base();
    let before = a.clone();
    let route_id = a.routes().keys().next().unwrap().to_string();
    let up_id = a.upstreams().keys().next().unwrap().to_string();
    let mut s = a.to_snapshot();
    s.version = 2;
    s.routes[0].priority += 10;
    let b = state(s);
    let good = one_delta(&a, &b);
    assert_eq!(a.apply(&good).unwrap(), b);

    let route_upsert = good.upserts[0].clone();
    type Case = (&'static str, v1::Delta, fn(&DeltaError) -> bool);
    let cases: Vec<Case> = vec![
        (
            "base version",
            v1::Delta {
                base_version: 5,
                ..good.clone()
            },
            |e| matches!(e, DeltaError::BaseMismatch { .. }),
        ),
        (
            "base hash",
            v1::Delta {
                base_hash: "v2:00".into(),
                ..good.clone()
            },
            |e| matches!(e, DeltaError::BaseMismatch { .. }),
        ),
        (
            "removed absent",
            v1::Delta {
                removed: vec![key(ResourceKind::Route, "nope/nope/rule0")],
                ..good.clone()
            },
            |e| matches!(e, DeltaError::RemovedAbsent { .. }),
        ),
        (
            "removed of another kind",
            v1::Delta {
                removed: vec![key(ResourceKind::Listener, &route_id)],
                ..good.clone()
            },
            |e| {
                matches!(
                    e,
                    DeltaError::RemovedAbsent {
                        kind: ResourceKind::Listener,
                        ..
                    }
                )
            },
        ),
        (
            "upsert twice",
            v1::Delta {
                upserts: vec![route_upsert.clone(), route_upsert.clone()],
                ..good.clone()
            },
            |e| {
                matches!(
                    e,
                    DeltaError::DuplicateKey {
                        kind: ResourceKind::Route,
                        ..
                    }
                )
            },
        ),
        (
            "removed and upserted",
            v1::Delta {
                removed: vec![key(ResourceKind::Route, &route_id)],
                ..good.clone()
            },
            |e| matches!(e, DeltaError::DuplicateKey { .. }),
        ),
        (
            "removed twice",
            v1::Delta {
                removed: vec![
                    key(ResourceKind::Upstream, &up_id),
                    key(ResourceKind::Upstream, &up_id),
                ],
                ..good.clone()
            },
            |e| matches!(e, DeltaError::DuplicateKey { .. }),
        ),
        (
            "endpoints of an absent upstream",
            v1::Delta {
                upserts: vec![v1::Resource {
                    body: Some(Body::Endpoints(v1::UpstreamEndpoints {
                        upstream_id: "nope/svc:80".into(),
                        endpoints: endpoints(1),
                    })),
                }],
                ..good.clone()
            },
            |e| matches!(e, DeltaError::EndpointsOfAbsentUpstream { .. }),
        ),
        (
            "endpoints of a removed upstream",
            v1::Delta {
                removed: vec![key(ResourceKind::Upstream, &up_id)],
                upserts: vec![v1::Resource {
                    body: Some(Body::Endpoints(v1::UpstreamEndpoints {
                        upstream_id: up_id.clone(),
                        endpoints: endpoints(1),
                    })),
                }],
                ..good.clone()
            },
            |e| matches!(e, DeltaError::DuplicateKey { .. }),
        ),
        (
            "empty resource",
            v1::Delta {
                upserts: vec![v1::Resource { body: None }],
                ..good.clone()
            },
            |e| matches!(e, DeltaError::EmptyResource),
        ),
        (
            "unknown kind",
            v1::Delta {
                removed: vec![v1::ResourceKey {
                    kind: 99,
                    id: route_id.clone(),
                }],
                ..good.clone()
            },
            |e| matches!(e, DeltaError::UnknownKind(99)),
        ),
        (
            "content not the hash's",
            v1::Delta {
                upserts: vec![v1::Resource {
                    body: Some(Body::Route(route(&route_id, 99))),
                }],
                ..good.clone()
            },
            |e| matches!(e, DeltaError::HashMismatch { .. }),
        ),
        (
            "hash not the content's",
            v1::Delta {
                hash: a.hash().to_owned(),
                ..good.clone()
            },
            |e| matches!(e, DeltaError::HashMismatch { .. }),
        ),
        (
            "not last",
            v1::Delta {
                last: false,
                ..good.clone()
            },
            |e| matches!(e, DeltaError::Incomplete),
        ),
    ];
    for (name, delta, expected) in cases {
        let err = a.apply(&delta).expect_err(name);
        assert!(expected(&err), "{name}: {err:?}");
        assert_eq!(a, before, "{name}: the state changed");
        // Every error says what it is, and maps to a NACK reason.
        assert!(!err.to_string().is_empty());
        let _ = err.nack_reason();
    }
    assert_eq!(
        DeltaError::BaseMismatch {
            serving_version: 0,
            serving_hash: String::new(),
            base_version: 0,
            base_hash: String::new()
        }
        .nack_reason(),
        v1::NackReason::BaseMismatch
    );
}

/// A delta from the empty state applies to any state: a full resend.
#[test]
fn full_resend_applies_to_anything() {
    let a = base();
    let mut s = a.to_snapshot();
    s.routes.clear();
    s.version = 7;
    let b = state(s);
    let full = chunks(&ChangeSet::full(&b), usize::MAX);
    assert_eq!(full[0].base_hash, "");
    assert_eq!(a.apply_chunks(&full).unwrap(), b);
    assert_eq!(SnapshotState::empty().apply_chunks(&full).unwrap(), b);
}

#[test]
fn corrupt_chunk_sets_are_refused() {
    let a = SnapshotState::empty();
    let b = base();
    let set = chunks(&ChangeSet::full(&b), 200);
    assert!(set.len() >= 3, "{}", set.len());
    assert_eq!(a.apply_chunks(&set).unwrap(), b);

    let missing_last = &set[..set.len() - 1];
    assert_eq!(a.apply_chunks(missing_last), Err(DeltaError::Incomplete));
    let mut missing_middle = set.clone();
    missing_middle.remove(1);
    assert!(matches!(
        a.apply_chunks(&missing_middle),
        Err(DeltaError::ChunkOrder {
            expected: 1,
            got: 2
        })
    ));
    let mut repeated = set.clone();
    repeated.insert(1, set[0].clone());
    assert!(matches!(
        a.apply_chunks(&repeated),
        Err(DeltaError::ChunkOrder { .. })
    ));
    let mut after_last = set.clone();
    let mut extra = set[set.len() - 1].clone();
    extra.chunk += 1;
    after_last.push(extra);
    assert!(matches!(
        a.apply_chunks(&after_last),
        Err(DeltaError::ChunkOrder { .. })
    ));
    let mut one_wrong_hash = set.clone();
    one_wrong_hash[1].hash = "v2:00".into();
    assert_eq!(
        a.apply_chunks(&one_wrong_hash),
        Err(DeltaError::ChunkHeader { chunk: 1 })
    );
    let all_wrong_hash: Vec<_> = set
        .iter()
        .map(|d| v1::Delta {
            hash: a.hash().to_owned(),
            ..d.clone()
        })
        .collect();
    assert!(matches!(
        a.apply_chunks(&all_wrong_hash),
        Err(DeltaError::HashMismatch { .. })
    ));
    assert_eq!(a.apply_chunks(&[]), Err(DeltaError::NoChunks));
    let mut lost_upsert = set.clone();
    lost_upsert[1].upserts.pop();
    assert!(matches!(
        a.apply_chunks(&lost_upsert),
        Err(DeltaError::HashMismatch { .. })
    ));
}

#[test]
fn chunks_respect_the_cap_and_an_oversized_resource_goes_alone() {
    let mut s = base().to_snapshot();
    s.routes[0].paths = (0..100).map(|i| format!("/long/path/{i}")).collect();
    let b = state(s);
    let set = chunks(&ChangeSet::full(&b), 300);
    let big = set
        .iter()
        .find(|d| d.encoded_len() > 300)
        .expect("the big route's chunk");
    assert_eq!(big.upserts.len() + big.removed.len(), 1);
    for d in &set {
        let items = d.upserts.len() + d.removed.len();
        assert!(items > 0, "an empty chunk {}", d.chunk);
        assert!(d.encoded_len() <= 300 || items == 1);
    }
    assert_eq!(set.iter().filter(|d| d.last).count(), 1);
    assert!(set.last().unwrap().last);
    assert_eq!(SnapshotState::empty().apply_chunks(&set).unwrap(), b);
    // Nothing changed but the version: one empty chunk.
    let mut c = b.clone();
    c.version = 3;
    let set = chunks(&diff(&b, &c), 300);
    assert_eq!(set.len(), 1);
    assert!(set[0].last && set[0].upserts.is_empty());
    assert_eq!(b.apply_chunks(&set).unwrap().version(), 3);
}
