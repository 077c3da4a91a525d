//! Fragments follow their first fragment across cores (issue 33).
//!
//! Only a datagram's first fragment carries the ports, so a classifier that
//! hashes the 5-tuple steers its later fragments by their addresses alone,
//! usually to another core than the first fragment, where the engine's
//! fragment table (`engine::frag`) has never seen the datagram (an orphan).
//! NICs hash every fragment by its addresses (the first one too), which
//! keeps a datagram together but apart from its flow's unfragmented packets
//! and from flow-director rules on ports (nat's replies).
//!
//! flowplane's receive side does what neither does alone: the classifier
//! runs unchanged on every packet, first fragments included (so a first
//! fragment meets its flow's state, its rule, its move), and [`FragSteer`]
//! remembers each first fragment's steering key and hash by its datagram —
//! (source, destination, protocol, identification), IPv4 or IPv6 — and
//! gives them to the datagram's later fragments. Those then reach the core
//! that judged the first one, and that core's fragment table lets them
//! follow its decision. A later fragment with no remembered first (it came
//! first, or its entry was overwritten) keeps the classifier's key (the
//! addresses'), as before.
//!
//! Bounded: [`FRAG_STEER_ENTRIES`] datagrams in 4-way sets indexed by a hash
//! keyed with a per-process random secret (no one can aim datagrams at one
//! set); a new first fragment takes the oldest way of a full set. Whoever
//! classifies in arrival order keeps one: the replay's loader (at load) and
//! the live dispatcher; the kernel steering programs keep the same in an LRU
//! map (`crates/io/csrc/steer_classify.h`, `fp_frags`).

use std::hash::{BuildHasher, Hasher};

use flowplane_wire::frame::{fragment_of, Fragment};

/// Datagrams remembered.
pub const FRAG_STEER_ENTRIES: usize = 4096;
const WAYS: usize = 4;

#[derive(Clone, Copy, Default)]
struct Slot {
    /// 64-bit digest of the datagram's identity (0: empty).
    tag: u64,
    /// When it was written (the oldest way of a full set is overwritten).
    seq: u64,
    key: u16,
    hash: u32,
}

/// First fragments' steering keys by datagram (see the module doc).
pub struct FragSteer {
    slots: Box<[Slot]>,
    seed: std::collections::hash_map::RandomState,
    seq: u64,
    /// Later fragments given their first fragment's key.
    pub followed: u64,
}

impl Default for FragSteer {
    fn default() -> Self {
        Self::new()
    }
}

impl FragSteer {
    /// An empty table with a fresh random secret.
    pub fn new() -> Self {
        FragSteer {
            slots: vec![Slot::default(); FRAG_STEER_ENTRIES].into_boxed_slice(),
            seed: std::collections::hash_map::RandomState::new(),
            seq: 0,
            followed: 0,
        }
    }

    fn tag(&self, f: &Fragment) -> u64 {
        let mut h = self.seed.build_hasher();
        h.write(&f.src);
        h.write(&f.dst);
        h.write_u32(f.id);
        h.write_u8(f.proto);
        h.write_u8(u8::from(f.v6));
        h.finish() | 1
    }

    /// The steering `(key, hash)` of `frame`, which the classifier gave
    /// `kh` (call it for classified frames only): a first fragment's is
    /// remembered; a later fragment takes its first fragment's; every other
    /// packet keeps `kh`. One header word read for a packet that is not a
    /// fragment.
    #[inline]
    pub fn follow(&mut self, frame: &[u8], kh: (u16, u32)) -> (u16, u32) {
        if !maybe_fragment(frame) {
            return kh;
        }
        self.fragment(frame, kh)
    }

    #[cold]
    fn fragment(&mut self, frame: &[u8], kh: (u16, u32)) -> (u16, u32) {
        let Some(f) = fragment_of(frame) else { return kh };
        let tag = self.tag(&f);
        let set = (tag >> 20) as usize & (FRAG_STEER_ENTRIES / WAYS - 1);
        let ways = &mut self.slots[set * WAYS..set * WAYS + WAYS];
        let found = ways.iter().position(|w| w.tag == tag);
        if f.is_first() {
            // Its own way, else an empty or the oldest one.
            let w = found.unwrap_or_else(|| (0..WAYS).min_by_key(|&w| (ways[w].tag != 0, ways[w].seq)).unwrap_or(0));
            self.seq += 1;
            ways[w] = Slot { tag, seq: self.seq, key: kh.0, hash: kh.1 };
            return kh;
        }
        match found {
            Some(w) => {
                self.followed += 1;
                (ways[w].key, ways[w].hash)
            }
            None => kh,
        }
    }
}

/// A cheap pre-check: untagged IPv4 with neither MF nor an offset, or untagged IPv6 whose first next header is
/// the transport's, is no fragment; everything else is looked at closely.
#[inline(always)]
fn maybe_fragment(f: &[u8]) -> bool {
    match (f.get(12..14), f.get(20..22)) {
        (Some([0x08, 0x00]), Some(&[a, b])) => u16::from_be_bytes([a, b]) & 0x3fff != 0,
        (Some([0x86, 0xdd]), _) => f.get(20).is_none_or(|&nh| matches!(nh, 0 | 43 | 44 | 51 | 60)),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An untagged IPv4 frame with fragment field `frag` and id `id`.
    fn v4(src: u8, id: u16, frag: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 16];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&36u16.to_be_bytes());
        f[18..20].copy_from_slice(&id.to_be_bytes());
        f[20..22].copy_from_slice(&frag.to_be_bytes());
        f[23] = 17;
        f[26..30].copy_from_slice(&[10, 0, 0, src]);
        f[30..34].copy_from_slice(&[198, 51, 100, 7]);
        f
    }

    /// An IPv6 frame with a hop-by-hop header then a Fragment header (offset in 8-byte units, M flag, id).
    fn v6(id: u32, offset: u16, more: bool) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 40 + 8 + 8 + 16];
        f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        f[14] = 0x60;
        f[18..20].copy_from_slice(&32u16.to_be_bytes());
        f[20] = 0; // hop-by-hop
        f[22..38].copy_from_slice(&[0xfd; 16]);
        f[38..54].copy_from_slice(&[0xfe; 16]);
        f[54] = 44; // hop-by-hop: next is Fragment, 8 bytes
        f[62] = 17; // Fragment: next is UDP
        f[64..66].copy_from_slice(&((offset << 3) | u16::from(more)).to_be_bytes());
        f[66..70].copy_from_slice(&id.to_be_bytes());
        f
    }

    #[test]
    fn later_fragments_take_their_first_fragments_key() {
        let mut s = FragSteer::new();
        // Not fragments: untouched.
        assert_eq!(s.follow(&v4(1, 5, 0x4000), (3, 33)), (3, 33));
        assert_eq!(s.follow(&v6(9, 0, false), (3, 33)), (3, 33), "an atomic fragment is whole");
        // IPv4: first (MF), middle, last.
        assert_eq!(s.follow(&v4(1, 5, 0x2000), (7, 77)), (7, 77));
        assert_eq!(s.follow(&v4(1, 5, 0x2000 | 2), (1, 11)), (7, 77));
        assert_eq!(s.follow(&v4(1, 5, 4), (1, 11)), (7, 77));
        // Another datagram (id, source) is not that one's.
        assert_eq!(s.follow(&v4(1, 6, 4), (1, 11)), (1, 11));
        assert_eq!(s.follow(&v4(2, 5, 4), (1, 11)), (1, 11));
        // IPv6 behind a hop-by-hop header.
        assert_eq!(s.follow(&v6(9, 0, true), (4, 44)), (4, 44));
        assert_eq!(s.follow(&v6(9, 2, false), (2, 22)), (4, 44));
        assert_eq!(s.followed, 3);
        // A datagram sent again starts over with its new first fragment's key.
        s.follow(&v4(1, 5, 0x2000), (8, 88));
        assert_eq!(s.follow(&v4(1, 5, 4), (1, 11)), (8, 88));
        // Cut frames and garbage never panic.
        let f = v6(9, 2, false);
        for n in 0..f.len() {
            s.follow(&f[..n], (0, 0));
        }
    }
}
