//! The Sluice snapshot wire format and the gRPC snapshot channel.
//!
//! These are *wire* types: the dataplane converts them into validated internal types
//! before use. They serialize to JSON/YAML with the canonical protobuf JSON mapping
//! (via `pbjson`), which is what golden files and `/snapshot` show.
//!
//! The channel (`proto/sluice/v1/sync.proto`) is one bidirectional stream per dataplane:
//! [`v1::snapshot_service_server`] is implemented by the controller,
//! [`v1::snapshot_service_client`] is used by the dataplane. The dataplane sends a
//! [`v1::Hello`], the controller answers with the current snapshot and every new one, the
//! dataplane acknowledges each with a [`v1::Ack`] or a [`v1::Nack`].
//!
//! [`state`] holds a snapshot as resources keyed by kind and id, the deltas between two
//! of them ([`v1::Delta`], protocol [`PROTOCOL_DELTA`]) and the v2 hash of a resource set.

#![forbid(unsafe_code)]

/// Generated protobuf messages and gRPC stubs of package `sluice.v1`.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/sluice.v1.rs"));
    include!(concat!(env!("OUT_DIR"), "/sluice.v1.serde.rs"));
}

pub mod state;
pub mod validate;

/// `Hello.protocol` of a peer that speaks deltas ([`v1::Delta`], v2 hash; see [`state`]).
/// A dataplane that predates them sends 0 and gets whole snapshots with the v1 hash.
pub const PROTOCOL_DELTA: u32 = 2;

pub use v1::Snapshot;

use prost::Message;
use sha2::{Digest, Sha256};

/// Content hash of a snapshot: hex SHA-256 of its encoding with `version = 0` and
/// `hash = ""`, so two producers that see the same inputs get the same hash no matter
/// which version numbers they assign.
///
/// A snapshot whose `version` and `hash` are unset is hashed as it is; any other is copied
/// first (prefer [`content_hash_of_sealed`] for those).
pub fn content_hash(snapshot: &Snapshot) -> String {
    if snapshot.version == 0 && snapshot.hash.is_empty() {
        // NB: no copy: at 5,000 routes the deep clone cost as much as the hashing.
        return hash_encoding(snapshot);
    }
    let mut body = snapshot.clone();
    content_hash_of_sealed(&mut body)
}

/// [`content_hash`] of a sealed snapshot without copying it: `version` and `hash` are taken
/// out for the hashing and put back.
pub fn content_hash_of_sealed(snapshot: &mut Snapshot) -> String {
    let version = std::mem::take(&mut snapshot.version);
    let hash = std::mem::take(&mut snapshot.hash);
    let actual = hash_encoding(snapshot);
    snapshot.version = version;
    snapshot.hash = hash;
    actual
}

fn hash_encoding(snapshot: &Snapshot) -> String {
    hex::encode(Sha256::digest(snapshot.encode_to_vec()))
}

/// Sets `version` and the content `hash` of a snapshot.
pub fn seal(mut snapshot: Snapshot, version: u64) -> Snapshot {
    snapshot.hash = content_hash_of_sealed(&mut snapshot);
    snapshot.version = version;
    snapshot
}

/// Sets `version` and a `hash` the caller already computed with [`content_hash`] over this
/// very content (so it is not computed twice).
pub fn seal_with_hash(mut snapshot: Snapshot, version: u64, hash: String) -> Snapshot {
    snapshot.hash = hash;
    snapshot.version = version;
    snapshot
}

/// Largest gRPC message either side of the snapshot channel accepts or sends: 256 MiB.
/// tonic's default of 4 MiB is too small for a snapshot with tens of thousands of routes.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

/// Whether `host` (a host name or an IP address, IPv6 with or without brackets) names the
/// local machine: `localhost`, `127.0.0.0/8` or `::1`. The snapshot channel refuses
/// plaintext (`--insecure`) anywhere else, because snapshots carry TLS keys.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use v1::{Backend, Route};

    fn snap(path: &str) -> Snapshot {
        Snapshot {
            routes: vec![Route {
                id: "default/r/rule1".into(),
                paths: vec![path.into()],
                backends: vec![Backend {
                    upstream_id: "default/svc:80".into(),
                    weight: 100,
                    plugins: Vec::new(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn hash_ignores_version_but_not_content() {
        let a = seal(snap("/a"), 1);
        let b = seal(snap("/a"), 7);
        let c = seal(snap("/b"), 1);
        assert_eq!(a.hash, b.hash);
        assert_ne!(a.hash, c.hash);
        assert_eq!(a.hash.len(), 64);
    }

    #[test]
    fn loopback_hosts() {
        for h in [
            "localhost",
            "LOCALHOST",
            "127.0.0.1",
            "127.3.2.1",
            "::1",
            "[::1]",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "0.0.0.0",
            "10.0.0.1",
            "::",
            "[::]",
            "example.com",
            "localhost.evil.com",
            "",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn json_mapping_uses_enum_names() {
        let up = v1::Upstream {
            id: "default/svc:80".into(),
            load_balancer: v1::LoadBalancer::Chash as i32,
            ..Default::default()
        };
        let json = serde_json::to_string(&up).unwrap_or_default();
        assert!(json.contains("LOAD_BALANCER_CHASH"), "{json}");
    }
}
