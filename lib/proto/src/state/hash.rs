//! Hash v2: a hash of the resource *set*, not of an encoding of the whole snapshot, so a
//! state reached by a full snapshot and one reached by any chain of deltas have the same
//! hash, and one changed resource re-hashes only its bucket.
//!
//! - leaf = SHA-256(kind ‖ len(id) ‖ id ‖ protobuf encoding of the resource), with `kind` the
//!   [`ResourceKind`] value and `len(id)` as 4 bytes big-endian;
//! - bucket of a key = the first byte of SHA-256(kind ‖ id): 256 buckets;
//! - bucket hash = SHA-256 over the bucket's leaves in (kind, id) order (SHA-256 of nothing
//!   for an empty bucket);
//! - root = `"v2:" + hex(SHA-256("sluice-snapshot-v2" ‖ the 256 bucket hashes))`.
//!
//! A resource's encoding is deterministic (prost writes fields in tag order and the snapshot
//! has no maps), and it is the resource's own message (`Upstream`, not `Resource`), so an
//! `UpstreamEndpoints` change hashes as the whole upstream it produces. The v1 hash
//! ([`crate::content_hash`]) is unchanged.

use std::collections::BTreeMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::v1::ResourceKind;

/// Number of buckets: one per value of the first byte of the key hash.
pub const BUCKETS: usize = 256;

/// Prefix of a v2 root, which tells it apart from a v1 hash (64 hex digits, no prefix).
pub const V2_PREFIX: &str = "v2:";

/// One SHA-256 digest.
pub(crate) type Digest32 = [u8; 32];

/// The key of a leaf inside its bucket: kind, then id, so leaves are hashed in that order.
pub(crate) type LeafKey = (i32, Arc<str>);

/// The leaves of one bucket and their hash.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Bucket {
    leaves: BTreeMap<LeafKey, Digest32>,
    hash: Digest32,
}

impl Default for Bucket {
    fn default() -> Self {
        Self {
            leaves: BTreeMap::new(),
            hash: Sha256::digest([]).into(),
        }
    }
}

impl Bucket {
    fn rehash(&mut self) {
        let mut h = Sha256::new();
        for leaf in self.leaves.values() {
            h.update(leaf);
        }
        self.hash = h.finalize().into();
    }
}

/// The bucket of a key.
pub(crate) fn bucket_of(kind: ResourceKind, id: &str) -> usize {
    let mut h = Sha256::new();
    h.update((kind as i32).to_be_bytes());
    h.update(id.as_bytes());
    usize::from(h.finalize()[0])
}

/// The leaf hash of a resource of `kind` and `id`, given its encoding.
pub(crate) fn leaf(kind: ResourceKind, id: &str, encoded: &[u8]) -> Digest32 {
    let mut h = Sha256::new();
    h.update((kind as i32).to_be_bytes());
    // NB: ids are far below 4 GiB (a gRPC message is at most 256 MiB); saturating keeps the
    // framing total anyway.
    h.update(u32::try_from(id.len()).unwrap_or(u32::MAX).to_be_bytes());
    h.update(id.as_bytes());
    h.update(encoded);
    h.finalize().into()
}

/// The bucketed leaf hashes of a state, with its root. Cloning copies 256 pointers; a change
/// copies and re-hashes only the buckets it touches.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct HashTree {
    buckets: Arc<[Arc<Bucket>]>,
    root: String,
}

impl Default for HashTree {
    fn default() -> Self {
        let bucket = Arc::new(Bucket::default());
        let buckets: Arc<[Arc<Bucket>]> = (0..BUCKETS).map(|_| Arc::clone(&bucket)).collect();
        let mut tree = Self {
            buckets,
            root: String::new(),
        };
        tree.root = tree.compute_root();
        tree
    }
}

impl HashTree {
    /// The root, `v2:<hex>`.
    pub(crate) fn root(&self) -> &str {
        &self.root
    }

    /// Starts a batch of changes; [`Batch::finish`] re-hashes the buckets it touched.
    pub(crate) fn batch(&mut self) -> Batch<'_> {
        let buckets: Vec<Arc<Bucket>> = self.buckets.iter().cloned().collect();
        Batch {
            tree: self,
            buckets,
            dirty: [false; BUCKETS],
        }
    }

    fn compute_root(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"sluice-snapshot-v2");
        for b in self.buckets.iter() {
            h.update(b.hash);
        }
        format!("{V2_PREFIX}{}", hex::encode(h.finalize()))
    }
}

/// Pending changes to a [`HashTree`].
pub(crate) struct Batch<'a> {
    tree: &'a mut HashTree,
    buckets: Vec<Arc<Bucket>>,
    dirty: [bool; BUCKETS],
}

impl Batch<'_> {
    /// Sets the leaf of (`kind`, `id`) from the resource's encoding.
    pub(crate) fn set(&mut self, kind: ResourceKind, id: &Arc<str>, encoded: &[u8]) {
        let b = bucket_of(kind, id);
        let leaf = leaf(kind, id, encoded);
        if let Some(bucket) = self.buckets.get_mut(b) {
            Arc::make_mut(bucket)
                .leaves
                .insert((kind as i32, Arc::clone(id)), leaf);
        }
        if let Some(d) = self.dirty.get_mut(b) {
            *d = true;
        }
    }

    /// Removes the leaf of (`kind`, `id`).
    pub(crate) fn remove(&mut self, kind: ResourceKind, id: &Arc<str>) {
        let b = bucket_of(kind, id);
        if let Some(bucket) = self.buckets.get_mut(b) {
            Arc::make_mut(bucket)
                .leaves
                .remove(&(kind as i32, Arc::clone(id)));
        }
        if let Some(d) = self.dirty.get_mut(b) {
            *d = true;
        }
    }

    /// Re-hashes the touched buckets and the root.
    pub(crate) fn finish(mut self) {
        for (bucket, dirty) in self.buckets.iter_mut().zip(self.dirty) {
            if dirty {
                Arc::make_mut(bucket).rehash();
            }
        }
        self.tree.buckets = self.buckets.into();
        self.tree.root = self.tree.compute_root();
    }
}
