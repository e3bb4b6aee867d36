//! A snapshot as a set of resources keyed by kind and id, and the deltas between two of them
//! (protocol 2 of the snapshot channel, see `sync.proto`).
//!
//! - [`SnapshotState::from_snapshot`] / [`SnapshotState::to_snapshot`] convert from and to the
//!   whole [`Snapshot`];
//! - [`diff`] gives the [`ChangeSet`] from one state to another, [`chunks`] cuts it into
//!   [`v1::Delta`] messages, [`SnapshotState::apply`] / [`SnapshotState::apply_chunks`] apply
//!   them on the receiving side, refusing a malformed or mismatched delta whole;
//! - [`SnapshotState::hash`] is the v2 hash ([`hash`]), the same however a state was reached.
//!
//! Pure: no I/O, no clock. Nothing here is wired into the controller or the dataplane yet.
//!
//! Each kind is a `BTreeMap<Arc<str>, Arc<T>>` behind an `Arc`: sorted, so diffs and
//! snapshots come out in a deterministic order, and resources are shared (not copied)
//! between a state and the next. Cloning a state copies a few pointers; a change copies the
//! map of each kind it touches (its nodes and pointers, no resource: O(resources of that
//! kind)), so an endpoint-only change never copies the routes; the hash tree is shared
//! bucket by bucket and a change copies and re-hashes only the buckets it touches.
//! A persistent map (`imbl::OrdMap`) would make a route change O(log n) instead of
//! O(routes), at the price of a dependency and slower reads; `benches/delta.rs` measured
//! the whole apply of one route change at 50,000 routes at about 4 ms (the copy of the
//! route map is most of it; an endpoint-only change, 0.3 ms), against about 250 ms for
//! building the state from a whole snapshot, so the plain map stays until a profile says
//! otherwise.

pub mod hash;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;

use prost::Message;

use crate::Snapshot;
use crate::v1::{self, ResourceKind, resource::Body};
use hash::HashTree;

/// One kind's resources by id, sorted by id (byte order).
pub type Map<T> = BTreeMap<Arc<str>, Arc<T>>;

/// A snapshot as sorted maps of resources plus its v2 hash tree. Equal states have equal
/// [`SnapshotState::hash`]es, and (with overwhelming likelihood) the converse.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SnapshotState {
    version: u64,
    routes: Arc<Map<v1::Route>>,
    upstreams: Arc<Map<v1::Upstream>>,
    tls_certificates: Arc<Map<v1::TlsCertificate>>,
    consumers: Arc<Map<v1::Consumer>>,
    global_rules: Arc<Map<v1::GlobalRule>>,
    listeners: Arc<Map<v1::Listener>>,
    stream_routes: Arc<Map<v1::StreamRoute>>,
    /// At most one entry, of id "".
    settings: Arc<Map<v1::Settings>>,
    tree: HashTree,
}

/// A resource type of the state: its kind, its id, where it lives.
trait Item: Message + PartialEq + Clone + Sized + 'static {
    const KIND: ResourceKind;
    fn id(&self) -> &str;
    fn body(self) -> Body;
    fn map(s: &SnapshotState) -> &Map<Self>;
    fn map_mut(s: &mut SnapshotState) -> &mut Map<Self>;
}

macro_rules! item {
    ($t:ty, $kind:ident, $field:ident, $body:ident, |$x:ident| $id:expr) => {
        impl Item for $t {
            const KIND: ResourceKind = ResourceKind::$kind;
            fn id(&self) -> &str {
                let $x = self;
                $id
            }
            fn body(self) -> Body {
                Body::$body(self)
            }
            fn map(s: &SnapshotState) -> &Map<Self> {
                &s.$field
            }
            fn map_mut(s: &mut SnapshotState) -> &mut Map<Self> {
                Arc::make_mut(&mut s.$field)
            }
        }
    };
}

item!(v1::Route, Route, routes, Route, |x| &x.id);
item!(v1::Upstream, Upstream, upstreams, Upstream, |x| &x.id);
item!(
    v1::TlsCertificate,
    TlsCertificate,
    tls_certificates,
    TlsCertificate,
    |x| &x.id
);
item!(v1::Consumer, Consumer, consumers, Consumer, |x| &x.name);
item!(v1::GlobalRule, GlobalRule, global_rules, GlobalRule, |x| &x
    .id);
item!(v1::Listener, Listener, listeners, Listener, |x| &x.id);
item!(
    v1::StreamRoute,
    StreamRoute,
    stream_routes,
    StreamRoute,
    |x| &x.id
);
item!(v1::Settings, Settings, settings, Settings, |_x| "");

/// Two resources of one kind with the same id in a [`Snapshot`]: it has no state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DuplicateId {
    /// The list it is in.
    pub kind: ResourceKind,
    /// The id.
    pub id: String,
}

impl fmt::Display for DuplicateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} `{}` appears twice in the snapshot",
            self.kind.as_str_name(),
            self.id
        )
    }
}

impl std::error::Error for DuplicateId {}

impl SnapshotState {
    /// The empty state, version 0.
    pub fn empty() -> Self {
        Self::default()
    }

    /// The state of `snapshot`, with its `version` (its `hash`, v1, is not checked here).
    /// Resources are moved, not copied.
    pub fn from_snapshot(snapshot: Snapshot) -> Result<Self, DuplicateId> {
        let Snapshot {
            version,
            hash: _,
            routes,
            upstreams,
            tls_certificates,
            default_certificate,
            fallback_sni,
            consumers,
            global_rules,
            listeners,
            stream_routes,
        } = snapshot;
        let mut s = Self {
            version,
            ..Self::default()
        };
        let mut tree = std::mem::take(&mut s.tree);
        let mut batch = tree.batch();
        fill(&mut s, &mut batch, routes)?;
        fill(&mut s, &mut batch, upstreams)?;
        fill(&mut s, &mut batch, tls_certificates)?;
        fill(&mut s, &mut batch, consumers)?;
        fill(&mut s, &mut batch, global_rules)?;
        fill(&mut s, &mut batch, listeners)?;
        fill(&mut s, &mut batch, stream_routes)?;
        if default_certificate.is_some() || !fallback_sni.is_empty() {
            let settings = v1::Settings {
                default_certificate,
                fallback_sni,
            };
            fill(&mut s, &mut batch, vec![settings])?;
        }
        batch.finish();
        s.tree = tree;
        Ok(s)
    }

    /// The whole snapshot of this state, unsealed (`version` 0, `hash` ""), as translate
    /// produces it: `seal(state.to_snapshot(), state.version())` is what the controller
    /// publishes. Every list is sorted by id (byte order) except `global_rules`, sorted by
    /// (namespace, name) of their `<namespace>/<name>` ids as translate emits them.
    pub fn to_snapshot(&self) -> Snapshot {
        fn list<T: Clone>(m: &Map<T>) -> Vec<T> {
            m.values().map(|v| T::clone(v)).collect()
        }
        let mut global_rules = list(&self.global_rules);
        global_rules.sort_by(|a, b| namespace_name(&a.id).cmp(&namespace_name(&b.id)));
        let settings = self.settings.values().next();
        Snapshot {
            version: 0,
            hash: String::new(),
            routes: list(&self.routes),
            upstreams: list(&self.upstreams),
            tls_certificates: list(&self.tls_certificates),
            default_certificate: settings.and_then(|s| s.default_certificate.clone()),
            fallback_sni: settings.map(|s| s.fallback_sni.clone()).unwrap_or_default(),
            consumers: list(&self.consumers),
            global_rules,
            listeners: list(&self.listeners),
            stream_routes: list(&self.stream_routes),
        }
    }

    /// The version this state was published as (0 for the empty state).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The v2 hash, `v2:<64 hex digits>` (see [`hash`]).
    pub fn hash(&self) -> &str {
        self.tree.root()
    }

    /// Whether the state holds no resource.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of resources (settings count as one when set).
    pub fn len(&self) -> usize {
        self.routes.len()
            + self.upstreams.len()
            + self.tls_certificates.len()
            + self.consumers.len()
            + self.global_rules.len()
            + self.listeners.len()
            + self.stream_routes.len()
            + self.settings.len()
    }

    /// Routes by id.
    pub fn routes(&self) -> &Map<v1::Route> {
        &self.routes
    }

    /// Upstreams by id.
    pub fn upstreams(&self) -> &Map<v1::Upstream> {
        &self.upstreams
    }

    /// Server certificates by id.
    pub fn tls_certificates(&self) -> &Map<v1::TlsCertificate> {
        &self.tls_certificates
    }

    /// Consumers by name.
    pub fn consumers(&self) -> &Map<v1::Consumer> {
        &self.consumers
    }

    /// Global rules by id.
    pub fn global_rules(&self) -> &Map<v1::GlobalRule> {
        &self.global_rules
    }

    /// Per-Gateway listeners by id.
    pub fn listeners(&self) -> &Map<v1::Listener> {
        &self.listeners
    }

    /// Layer-4 routes by id.
    pub fn stream_routes(&self) -> &Map<v1::StreamRoute> {
        &self.stream_routes
    }

    /// The default certificate and fallback SNI, when either is set.
    pub fn settings(&self) -> Option<&Arc<v1::Settings>> {
        self.settings.values().next()
    }

    /// Applies one whole delta (a single chunk with `last`, or [`assemble`]d chunks) and
    /// returns the resulting state; `self` is left as it was, also on error.
    ///
    /// Refused: a delta without `last` ([`DeltaError::Incomplete`]); a base other than this
    /// state's version and hash, unless the base is empty (0, ""): a full resend; a key twice
    /// in `removed` and `upserts` together; a removed key or an `UpstreamEndpoints` upstream
    /// the base does not hold; a `Resource` without body or a key of unknown kind; a result
    /// whose v2 hash is not `delta.hash`.
    pub fn apply(&self, delta: &v1::Delta) -> Result<SnapshotState, DeltaError> {
        if !delta.last {
            return Err(DeltaError::Incomplete);
        }
        let from_empty = delta.base_version == 0 && delta.base_hash.is_empty();
        if !from_empty && (delta.base_version != self.version || delta.base_hash != self.hash()) {
            return Err(DeltaError::BaseMismatch {
                serving_version: self.version,
                serving_hash: self.hash().to_owned(),
                base_version: delta.base_version,
                base_hash: delta.base_hash.clone(),
            });
        }
        check_keys(delta)?;
        let mut next = if from_empty {
            Self::empty()
        } else {
            self.clone()
        };
        let mut tree = std::mem::take(&mut next.tree);
        let mut batch = tree.batch();
        for key in &delta.removed {
            next.remove(&mut batch, key)?;
        }
        for r in &delta.upserts {
            match r.body.clone() {
                None => return Err(DeltaError::EmptyResource),
                Some(Body::Route(x)) => next.put(&mut batch, x),
                Some(Body::Upstream(x)) => next.put(&mut batch, x),
                Some(Body::TlsCertificate(x)) => next.put(&mut batch, x),
                Some(Body::Consumer(x)) => next.put(&mut batch, x),
                Some(Body::GlobalRule(x)) => next.put(&mut batch, x),
                Some(Body::Listener(x)) => next.put(&mut batch, x),
                Some(Body::StreamRoute(x)) => next.put(&mut batch, x),
                Some(Body::Settings(x)) => next.put(&mut batch, x),
                Some(Body::Endpoints(e)) => {
                    let Some(up) = next.upstreams.get(e.upstream_id.as_str()) else {
                        return Err(DeltaError::EndpointsOfAbsentUpstream { id: e.upstream_id });
                    };
                    let up = v1::Upstream {
                        endpoints: e.endpoints,
                        ..v1::Upstream::clone(up)
                    };
                    next.put(&mut batch, up);
                }
            }
        }
        batch.finish();
        next.tree = tree;
        next.version = delta.version;
        if next.hash() != delta.hash {
            return Err(DeltaError::HashMismatch {
                expected: delta.hash.clone(),
                actual: next.hash().to_owned(),
            });
        }
        Ok(next)
    }

    /// [`assemble`] then [`SnapshotState::apply`].
    pub fn apply_chunks(&self, chunks: &[v1::Delta]) -> Result<SnapshotState, DeltaError> {
        self.apply(&assemble(chunks)?)
    }

    fn put<T: Item>(&mut self, batch: &mut hash::Batch<'_>, value: T) {
        let id: Arc<str> = Arc::from(value.id());
        batch.set(T::KIND, &id, &value.encode_to_vec());
        T::map_mut(self).insert(id, Arc::new(value));
    }

    fn remove(
        &mut self,
        batch: &mut hash::Batch<'_>,
        key: &v1::ResourceKey,
    ) -> Result<(), DeltaError> {
        fn take<T: Item>(
            s: &mut SnapshotState,
            batch: &mut hash::Batch<'_>,
            id: &str,
        ) -> Result<(), DeltaError> {
            let Some((id, _)) = T::map_mut(s).remove_entry(id) else {
                return Err(DeltaError::RemovedAbsent {
                    kind: T::KIND,
                    id: id.to_owned(),
                });
            };
            batch.remove(T::KIND, &id);
            Ok(())
        }
        let id = key.id.as_str();
        match ResourceKind::try_from(key.kind) {
            Ok(ResourceKind::Route) => take::<v1::Route>(self, batch, id),
            Ok(ResourceKind::Upstream) => take::<v1::Upstream>(self, batch, id),
            Ok(ResourceKind::TlsCertificate) => take::<v1::TlsCertificate>(self, batch, id),
            Ok(ResourceKind::Consumer) => take::<v1::Consumer>(self, batch, id),
            Ok(ResourceKind::GlobalRule) => take::<v1::GlobalRule>(self, batch, id),
            Ok(ResourceKind::Listener) => take::<v1::Listener>(self, batch, id),
            Ok(ResourceKind::StreamRoute) => take::<v1::StreamRoute>(self, batch, id),
            Ok(ResourceKind::Settings) => take::<v1::Settings>(self, batch, id),
            Ok(ResourceKind::Unspecified) | Err(_) => Err(DeltaError::UnknownKind(key.kind)),
        }
    }
}

/// `<namespace>/<name>` as (namespace, name).
fn namespace_name(id: &str) -> (&str, &str) {
    id.split_once('/').unwrap_or((id, ""))
}

fn fill<T: Item>(
    s: &mut SnapshotState,
    batch: &mut hash::Batch<'_>,
    items: Vec<T>,
) -> Result<(), DuplicateId> {
    for item in items {
        if T::map(s).contains_key(item.id()) {
            return Err(DuplicateId {
                kind: T::KIND,
                id: item.id().to_owned(),
            });
        }
        s.put(batch, item);
    }
    Ok(())
}

/// The key of an upsert: its kind and id (an `UpstreamEndpoints` has its upstream's key).
fn upsert_key(r: &v1::Resource) -> Result<(ResourceKind, &str), DeltaError> {
    Ok(match r.body.as_ref() {
        None => return Err(DeltaError::EmptyResource),
        Some(Body::Route(x)) => (ResourceKind::Route, x.id()),
        Some(Body::Upstream(x)) => (ResourceKind::Upstream, x.id()),
        Some(Body::TlsCertificate(x)) => (ResourceKind::TlsCertificate, x.id()),
        Some(Body::Consumer(x)) => (ResourceKind::Consumer, x.id()),
        Some(Body::GlobalRule(x)) => (ResourceKind::GlobalRule, x.id()),
        Some(Body::Listener(x)) => (ResourceKind::Listener, x.id()),
        Some(Body::StreamRoute(x)) => (ResourceKind::StreamRoute, x.id()),
        Some(Body::Settings(x)) => (ResourceKind::Settings, x.id()),
        Some(Body::Endpoints(e)) => (ResourceKind::Upstream, e.upstream_id.as_str()),
    })
}

/// Every key at most once across `removed` and `upserts`.
fn check_keys(delta: &v1::Delta) -> Result<(), DeltaError> {
    let mut seen: HashSet<(i32, &str)> =
        HashSet::with_capacity(delta.removed.len() + delta.upserts.len());
    let keys = delta
        .removed
        .iter()
        .map(|k| Ok((k.kind, k.id.as_str())))
        .chain(
            delta
                .upserts
                .iter()
                .map(|r| upsert_key(r).map(|(kind, id)| (kind as i32, id))),
        );
    for key in keys {
        let (kind, id) = key?;
        if !seen.insert((kind, id)) {
            return Err(DeltaError::DuplicateKey {
                kind: ResourceKind::try_from(kind).unwrap_or(ResourceKind::Unspecified),
                id: id.to_owned(),
            });
        }
    }
    Ok(())
}

/// Why a delta (or a set of chunks) was refused. Each maps to the [`v1::NackReason`] the
/// dataplane answers with ([`DeltaError::nack_reason`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeltaError {
    /// The delta's base is not the state it was applied to.
    BaseMismatch {
        /// What the receiver serves.
        serving_version: u64,
        /// Its v2 hash.
        serving_hash: String,
        /// What the delta applies to.
        base_version: u64,
        /// Its v2 hash.
        base_hash: String,
    },
    /// The result's v2 hash is not the delta's `hash`.
    HashMismatch {
        /// `Delta.hash`.
        expected: String,
        /// The hash of the state the delta produced.
        actual: String,
    },
    /// A removed key the base does not hold.
    RemovedAbsent {
        /// Its kind.
        kind: ResourceKind,
        /// Its id.
        id: String,
    },
    /// A key twice in one delta (removed twice, upserted twice, or both).
    DuplicateKey {
        /// Its kind.
        kind: ResourceKind,
        /// Its id.
        id: String,
    },
    /// An `UpstreamEndpoints` whose upstream the base does not hold.
    EndpointsOfAbsentUpstream {
        /// The upstream id.
        id: String,
    },
    /// A `Resource` without a body.
    EmptyResource,
    /// A removed key of kind `RESOURCE_KIND_UNSPECIFIED` or of a value this build does not
    /// know.
    UnknownKind(i32),
    /// No chunk with `last`: the delta is not whole.
    Incomplete,
    /// No chunk at all.
    NoChunks,
    /// Chunk `got` where `expected` was due (one missing, repeated or out of order), or a
    /// `last` before the end.
    ChunkOrder {
        /// The chunk number due.
        expected: u32,
        /// The one that came.
        got: u32,
    },
    /// A chunk whose base, version or hash differ from chunk 0's.
    ChunkHeader {
        /// The chunk number.
        chunk: u32,
    },
}

impl DeltaError {
    /// The reason a dataplane gives in its `Nack`.
    pub fn nack_reason(&self) -> v1::NackReason {
        match self {
            Self::BaseMismatch { .. } => v1::NackReason::BaseMismatch,
            Self::HashMismatch { .. } => v1::NackReason::HashMismatch,
            _ => v1::NackReason::Malformed,
        }
    }
}

impl fmt::Display for DeltaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BaseMismatch {
                serving_version,
                serving_hash,
                base_version,
                base_hash,
            } => write!(
                f,
                "delta applies to v{base_version} ({base_hash}), this state is \
                 v{serving_version} ({serving_hash})"
            ),
            Self::HashMismatch { expected, actual } => write!(
                f,
                "the delta's result hashes to {actual}, the delta says {expected}"
            ),
            Self::RemovedAbsent { kind, id } => write!(
                f,
                "removes {} `{id}`, which the base does not hold",
                kind.as_str_name()
            ),
            Self::DuplicateKey { kind, id } => {
                write!(
                    f,
                    "{} `{id}` appears twice in the delta",
                    kind.as_str_name()
                )
            }
            Self::EndpointsOfAbsentUpstream { id } => write!(
                f,
                "endpoints of upstream `{id}`, which the base does not hold"
            ),
            Self::EmptyResource => f.write_str("a resource without body"),
            Self::UnknownKind(k) => write!(f, "a removed key of unknown kind {k}"),
            Self::Incomplete => f.write_str("no chunk marked `last`"),
            Self::NoChunks => f.write_str("no chunk"),
            Self::ChunkOrder { expected, got } => {
                write!(f, "chunk {got} where chunk {expected} was due")
            }
            Self::ChunkHeader { chunk } => write!(
                f,
                "chunk {chunk} names another base, version or hash than chunk 0"
            ),
        }
    }
}

impl std::error::Error for DeltaError {}

/// What changed from one state to the next, whole resources keyed by kind and id: the
/// content of a [`v1::Delta`] before it is cut into chunks. Keys are in kind order, then id
/// order, each once.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ChangeSet {
    /// Version of the state the changes apply to (0 with `base_hash` "": the empty state).
    pub base_version: u64,
    /// Its v2 hash ("" for a full resend).
    pub base_hash: String,
    /// Version of the result.
    pub version: u64,
    /// Its v2 hash.
    pub hash: String,
    /// Keys to remove.
    pub removed: Vec<v1::ResourceKey>,
    /// Resources to insert or replace; an upstream whose endpoints alone changed is an
    /// `UpstreamEndpoints`.
    pub upserts: Vec<v1::Resource>,
}

impl ChangeSet {
    /// Every resource of `state`, from the empty state: a full resend.
    pub fn full(state: &SnapshotState) -> Self {
        let mut cs = diff(&SnapshotState::empty(), state);
        cs.base_hash = String::new();
        cs
    }

    /// Whether nothing changed but (maybe) the version.
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.upserts.is_empty()
    }
}

/// The changes that turn `from` into `to`. Resources shared by both (`Arc::ptr_eq`) are
/// skipped without comparing them; equal ones are skipped too.
pub fn diff(from: &SnapshotState, to: &SnapshotState) -> ChangeSet {
    let mut cs = ChangeSet {
        base_version: from.version,
        base_hash: from.hash().to_owned(),
        version: to.version,
        hash: to.hash().to_owned(),
        ..ChangeSet::default()
    };
    diff_kind::<v1::Route>(from, to, &mut cs, |_, _| None);
    diff_kind::<v1::Upstream>(from, to, &mut cs, endpoints_only);
    diff_kind::<v1::TlsCertificate>(from, to, &mut cs, |_, _| None);
    diff_kind::<v1::Consumer>(from, to, &mut cs, |_, _| None);
    diff_kind::<v1::GlobalRule>(from, to, &mut cs, |_, _| None);
    diff_kind::<v1::Listener>(from, to, &mut cs, |_, _| None);
    diff_kind::<v1::StreamRoute>(from, to, &mut cs, |_, _| None);
    diff_kind::<v1::Settings>(from, to, &mut cs, |_, _| None);
    cs
}

/// Appends the changes of one kind; `partial` may give a smaller body for a changed resource.
fn diff_kind<T: Item>(
    from: &SnapshotState,
    to: &SnapshotState,
    cs: &mut ChangeSet,
    partial: fn(&T, &T) -> Option<Body>,
) {
    let whole = |v: &Arc<T>| v1::Resource {
        body: Some(T::clone(v).body()),
    };
    let (a, b) = (T::map(from), T::map(to));
    if std::ptr::eq(a, b) {
        // One shared map: a kind the change did not touch.
        return;
    }
    let mut a = a.iter().peekable();
    let mut b = b.iter().peekable();
    loop {
        let order = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some((ka, _)), Some((kb, _))) => ka.cmp(kb),
        };
        match order {
            std::cmp::Ordering::Less => {
                if let Some((k, _)) = a.next() {
                    cs.removed.push(v1::ResourceKey {
                        kind: T::KIND as i32,
                        id: k.to_string(),
                    });
                }
            }
            std::cmp::Ordering::Greater => {
                if let Some((_, v)) = b.next() {
                    cs.upserts.push(whole(v));
                }
            }
            std::cmp::Ordering::Equal => {
                if let (Some((_, va)), Some((_, vb))) = (a.next(), b.next())
                    && !Arc::ptr_eq(va, vb)
                    && va != vb
                {
                    cs.upserts.push(match partial(va, vb) {
                        Some(body) => v1::Resource { body: Some(body) },
                        None => whole(vb),
                    });
                }
            }
        }
    }
}

/// The `UpstreamEndpoints` that turns `old` into `new` when they differ in their endpoints
/// only.
fn endpoints_only(old: &v1::Upstream, new: &v1::Upstream) -> Option<Body> {
    let same_but_endpoints = old.endpoints != new.endpoints
        && v1::Upstream {
            endpoints: new.endpoints.clone(),
            ..old.clone()
        } == *new;
    same_but_endpoints.then(|| {
        Body::Endpoints(v1::UpstreamEndpoints {
            upstream_id: new.id.clone(),
            endpoints: new.endpoints.clone(),
        })
    })
}

/// Cuts `changes` into deltas of at most `max_bytes` encoded each (removals first, then
/// upserts, in order), numbered from 0, the last marked `last`; at least one, so a change of
/// version alone is still sent. A resource larger than `max_bytes` alone goes in a chunk of
/// its own, which is then larger: refusing such a resource is the producer's job. `rejected`
/// is left unset for the caller to set on the last chunk.
pub fn chunks(changes: &ChangeSet, max_bytes: usize) -> Vec<v1::Delta> {
    let header = |chunk: u32| v1::Delta {
        base_version: changes.base_version,
        base_hash: changes.base_hash.clone(),
        version: changes.version,
        hash: changes.hash.clone(),
        chunk,
        last: true,
        ..v1::Delta::default()
    };
    // One byte of tag plus the length prefix of an embedded message.
    let field = |len: usize| 1 + prost::length_delimiter_len(len) + len;
    let mut out = Vec::new();
    let mut current = header(0);
    let mut size = current.encoded_len();
    let mut items = 0usize;
    let mut push = |current: &mut v1::Delta, size: &mut usize, add: usize| {
        // NB: by count, not by size: a later chunk's header is a few bytes longer (its
        // number), and an empty chunk must never be cut.
        if items > 0 && *size + add > max_bytes {
            let n = current.chunk.saturating_add(1);
            out.push(std::mem::replace(current, header(n)));
            *size = current.encoded_len();
            items = 0;
        }
        *size += add;
        items += 1;
    };
    for key in &changes.removed {
        push(&mut current, &mut size, field(key.encoded_len()));
        current.removed.push(key.clone());
    }
    for r in &changes.upserts {
        push(&mut current, &mut size, field(r.encoded_len()));
        current.upserts.push(r.clone());
    }
    out.push(current);
    let n = out.len();
    for (i, d) in out.iter_mut().enumerate() {
        d.last = i + 1 == n;
    }
    out
}

/// Joins chunks 0..n of one delta, in order, into one delta with `last`. Refused: no chunks,
/// a chunk number out of sequence, a `last` before the end or none at the end, a chunk with
/// another header than chunk 0.
pub fn assemble(chunks: &[v1::Delta]) -> Result<v1::Delta, DeltaError> {
    let Some(first) = chunks.first() else {
        return Err(DeltaError::NoChunks);
    };
    let mut whole = v1::Delta {
        base_version: first.base_version,
        base_hash: first.base_hash.clone(),
        version: first.version,
        hash: first.hash.clone(),
        chunk: 0,
        last: false,
        ..v1::Delta::default()
    };
    for (i, c) in chunks.iter().enumerate() {
        let expected = u32::try_from(i).unwrap_or(u32::MAX);
        if c.chunk != expected {
            return Err(DeltaError::ChunkOrder {
                expected,
                got: c.chunk,
            });
        }
        if (c.base_version, &c.base_hash, c.version, &c.hash)
            != (
                first.base_version,
                &first.base_hash,
                first.version,
                &first.hash,
            )
        {
            return Err(DeltaError::ChunkHeader { chunk: c.chunk });
        }
        if whole.last {
            // A chunk after the one marked `last`.
            return Err(DeltaError::ChunkOrder {
                expected: expected.saturating_sub(1),
                got: c.chunk,
            });
        }
        whole.removed.extend(c.removed.iter().cloned());
        whole.upserts.extend(c.upserts.iter().cloned());
        if c.rejected.is_some() {
            whole.rejected.clone_from(&c.rejected);
        }
        whole.last = c.last;
    }
    if !whole.last {
        return Err(DeltaError::Incomplete);
    }
    Ok(whole)
}
