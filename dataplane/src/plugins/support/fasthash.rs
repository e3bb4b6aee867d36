//! A cheap hasher for plugin-internal maps: a multiply-rotate mix per word instead of
//! SipHash.
//!
//! Use it only where the client does not choose the keys, or does not choose what they hash
//! to:
//! - pointers and status codes (the Prometheus series cache);
//! - a value that is already a keyed hash of the client's input under a random key (the
//!   rate-limit windows, see [`Prehashed`]).
//!
//! Never use it for raw request data, which would open the map to HashDoS.

use std::hash::{BuildHasherDefault, Hash, Hasher};

/// The hasher (see the module documentation).
#[derive(Debug, Default, Clone, Copy)]
pub struct MixHasher(u64);

impl MixHasher {
    #[inline]
    fn mix(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for MixHasher {
    /// A folded multiply: the low bits a table indexes by depend on every input bit (a
    /// plain multiply leaves them depending on the low input bits only, and aligned
    /// pointers share those).
    #[inline]
    fn finish(&self) -> u64 {
        let full = u128::from(self.0) * u128::from(0x9e37_79b9_7f4a_7c15u64);
        (full as u64) ^ ((full >> 64) as u64)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.mix(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.mix(i as u64);
    }
}

/// Builds [`MixHasher`]s.
pub type MixBuildHasher = BuildHasherDefault<MixHasher>;

/// A key with its hash computed once, by a keyed hasher (aHash or SipHash with a random
/// key), so a map with [`MixBuildHasher`] does not hash it again. Equality compares the
/// keys.
#[derive(Debug, Clone)]
pub struct Prehashed<K> {
    /// The key's hash.
    pub hash: u64,
    /// The key.
    pub key: K,
}

impl<K: PartialEq> PartialEq for Prehashed<K> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.key == other.key
    }
}

impl<K: Eq> Eq for Prehashed<K> {}

impl<K> Hash for Prehashed<K> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::hash::BuildHasher;

    #[test]
    fn prehashed_keys_find_their_entries_and_equal_hashes_do_not_merge_keys() {
        let sip = std::collections::hash_map::RandomState::new();
        let mut m: HashMap<Prehashed<String>, u32, MixBuildHasher> = HashMap::default();
        for i in 0..1000u32 {
            let key = format!("k{i}");
            m.insert(
                Prehashed {
                    hash: sip.hash_one(&key),
                    key,
                },
                i,
            );
        }
        assert_eq!(m.len(), 1000);
        let key = "k777".to_owned();
        let probe = Prehashed {
            hash: sip.hash_one(&key),
            key,
        };
        assert_eq!(m.get(&probe), Some(&777));
        // Two keys forced onto one hash stay two entries.
        let mut m: HashMap<Prehashed<&str>, u32, MixBuildHasher> = HashMap::default();
        m.insert(Prehashed { hash: 1, key: "a" }, 1);
        m.insert(Prehashed { hash: 1, key: "b" }, 2);
        assert_eq!(m.len(), 2);
        assert_eq!(m.get(&Prehashed { hash: 1, key: "b" }), Some(&2));
    }

    #[test]
    fn the_mix_spreads_pointer_like_values() {
        // Aligned addresses differ only in their middle bits; their hashes must still spread
        // over the low bits a table uses.
        let b = MixBuildHasher::default();
        let mut low: Vec<u64> = (0..64usize)
            .map(|i| b.hash_one(0x7f00_0000_1000usize + i * 64) & 63)
            .collect();
        low.sort_unstable();
        low.dedup();
        assert!(low.len() > 32, "{} distinct low 6-bit values", low.len());
    }
}
