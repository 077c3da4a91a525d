//! The cuckoo core shared by the per-core [`FlowTable`](crate::FlowTable) and the
//! [`SharedFlowTable`](crate::shared::SharedFlowTable): where a key may live and how
//! an entry is moved out of the way.
//!
//! This module owns the placement arithmetic (the 16-bit tag and the primary bucket
//! from the caller's hash, the alternate bucket from bucket and tag alone, as in
//! rte_hash and cuckoo filters, so an entry can be moved to its other bucket without
//! its key or full hash), the search of one bucket's tags, and the bounded
//! breadth-first search for a displacement path when both candidate buckets are full.
//! The tables keep their own bucket layouts and carry out a path's moves themselves:
//! the per-core table directly, the shared table under its bucket locks with
//! re-verification.
//!
//! Vocabulary used across the crate: a *slot* is a position (0..[`SLOTS`]) inside a
//! bucket; an *entry* is a flow's key and state in the slab or arena, named by its
//! *handle*; an occupied slot holds a tag and a handle.

use crate::simd::match_tags;

/// Slots per bucket (one cache line of tags and handles).
pub const SLOTS: usize = 8;

/// Keys one bulk probe handles at once (hit masks are `u64`): both tables' batched calls
/// prefetch this many keys' buckets, then their entries, then verify, and process longer
/// batches in chunks of this size.
pub const BULK_LOOKUP_MAX: usize = 64;

/// The batch contract of both tables: one hash per key and room for every key's result. A violation is a caller
/// bug; it stops the caller here rather than letting keys be skipped silently.
#[inline(always)]
pub(crate) fn check_batch(keys: usize, hashes: usize, out: usize) {
    assert!(hashes == keys && out >= keys, "batch of {keys} keys with {hashes} hashes and room for {out} results");
}

/// Tag of an occupied slot, from the top 16 bits of the hash; 0 marks an empty slot, so tags are never 0.
#[inline(always)]
pub(crate) fn tag(hash: u64) -> u16 {
    let t = (hash >> 48) as u16;
    t | u16::from(t == 0)
}

/// Primary bucket index, from the low bits of both halves of the hash. Not the low half alone: the flow
/// keys' 64-bit hash (`wire::hash`) has a CRC low half, and CRC is affine in its seed, so keys that share a
/// bucket by the low half share it under every seed (a per-run secret would not stop a collision flood); the
/// high half is keyed non-linearly, and XOR-ing it in makes the bucket depend on the secret (one shift and one
/// XOR per key).
#[inline(always)]
pub(crate) fn primary(hash: u64, mask: u32) -> u32 {
    (hash ^ (hash >> 32)) as u32 & mask
}

/// The other candidate bucket of an entry with tag `tag` stored in bucket `b`
/// (an involution: `alt(alt(b, t), t) == b`; odd offset so `alt != b` whenever there are 2+ buckets).
#[inline(always)]
pub(crate) fn alt(b: u32, tag: u16, mask: u32) -> u32 {
    let off = (u32::from(tag).wrapping_mul(0x5BD1_E995) >> 7) | 1;
    (b ^ off) & mask
}

/// A key's tag and candidate buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) tag: u16,
    /// Primary bucket.
    pub(crate) b1: u32,
    /// Alternate bucket (equal to `b1` only in a one-bucket table).
    pub(crate) b2: u32,
}

/// Tag and both candidate buckets of `hash` in a table of `mask + 1` buckets.
#[inline(always)]
pub(crate) fn place(hash: u64, mask: u32) -> Place {
    let tag = tag(hash);
    let b1 = primary(hash, mask);
    Place { tag, b1, b2: alt(b1, tag, mask) }
}

/// Bucket search: the first slot among `matches` (a tag-compare mask, bit i = slot i) whose entry
/// `is_key` confirms. Tags are 16 bits, so most matches are the key; others are rare false positives.
#[inline(always)]
pub(crate) fn find_slot(mut matches: u32, mut is_key: impl FnMut(usize) -> bool) -> Option<usize> {
    while matches != 0 {
        let s = matches.trailing_zeros() as usize;
        if is_key(s) {
            return Some(s);
        }
        matches &= matches - 1;
    }
    None
}

/// Lowest empty slot of a bucket with these tags.
#[inline(always)]
pub(crate) fn free_slot(tags: &[u16; SLOTS]) -> Option<usize> {
    let m = match_tags(tags, 0);
    (m != 0).then(|| m.trailing_zeros() as usize)
}

/// One bucket reached by the path search.
#[derive(Clone, Copy)]
struct Node {
    bucket: u32,
    /// Index of the node whose entry moves into `bucket` ([`ROOT`] for the candidate buckets).
    parent: u16,
    /// Slot in the parent's bucket whose entry moves into `bucket`.
    slot: u8,
}

const ROOT: u16 = u16::MAX;

/// Outcome of [`PathSearch::run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Search {
    /// A displacement path was found: see [`PathSearch::moves`].
    Found,
    /// A bucket on the search had an empty slot (only under concurrent writers:
    /// a candidate bucket may have room again, so the caller retries a direct insert).
    SlotFreed,
    /// No path within the search bound: the table is full for this key.
    NoPath,
}

/// Bounded breadth-first search over at most `N` buckets for a cuckoo path from a key's
/// full candidate buckets to a bucket with an empty slot (MemC3 / libcuckoo style:
/// short paths, so an insertion moves few entries). The search only reads tags; the
/// caller executes [`PathSearch::moves`], far end first, so every move goes into a slot
/// that is already empty and no entry is ever out of the table.
pub(crate) struct PathSearch<const N: usize> {
    q: [Node; N],
    /// (node, slot in its bucket, bucket with the empty slot) of the path's far end.
    leaf: (usize, usize, u32),
}

impl<const N: usize> PathSearch<N> {
    const FITS: () = assert!(N >= 2 && N < ROOT as usize, "node indices are u16");

    #[inline]
    pub(crate) fn new() -> Self {
        let () = Self::FITS;
        PathSearch { q: [Node { bucket: 0, parent: ROOT, slot: 0 }; N], leaf: (0, 0, 0) }
    }

    /// Searches from candidate buckets `b1` and `b2`; `tags(b)` returns bucket `b`'s tags
    /// (a snapshot: the shared table reads them without locks, as a hint). Paths are
    /// simple (no bucket twice), so their moves cannot collide.
    pub(crate) fn run(&mut self, b1: u32, b2: u32, mask: u32, mut tags: impl FnMut(u32) -> [u16; SLOTS]) -> Search {
        self.q[0] = Node { bucket: b1, parent: ROOT, slot: 0 };
        let mut len = 1;
        if b2 != b1 {
            self.q[1] = Node { bucket: b2, parent: ROOT, slot: 0 };
            len = 2;
        }
        let mut head = 0;
        while head < len {
            let node = self.q[head];
            let ts = tags(node.bucket);
            for (s, &t) in ts.iter().enumerate() {
                if t == 0 {
                    return Search::SlotFreed;
                }
                let nb = alt(node.bucket, t, mask);
                if self.on_path(head, nb) {
                    continue;
                }
                if free_slot(&tags(nb)).is_some() {
                    self.leaf = (head, s, nb);
                    return Search::Found;
                }
                if len < N {
                    self.q[len] = Node { bucket: nb, parent: head as u16, slot: s as u8 };
                    len += 1;
                }
            }
            head += 1;
        }
        Search::NoPath
    }

    /// Whether bucket `b` is node `i` or one of its ancestors.
    #[inline]
    fn on_path(&self, mut i: usize, b: u32) -> bool {
        loop {
            let n = self.q[i];
            if n.bucket == b {
                return true;
            }
            if n.parent == ROOT {
                return false;
            }
            i = n.parent as usize;
        }
    }

    /// The moves of the path found by [`PathSearch::run`], far end first, as
    /// `(from bucket, slot in it, to bucket)`: each entry moves to its alternate bucket.
    /// The first `to` had an empty slot; each later `to` is the previous move's `from`,
    /// whose vacated slot is the previous move's slot. The last `from` is `b1` or `b2`.
    pub(crate) fn moves(&self) -> impl Iterator<Item = (u32, usize, u32)> + '_ {
        let mut next = Some(self.leaf);
        core::iter::from_fn(move || {
            let (i, s, to) = next?;
            let n = self.q[i];
            next = (n.parent != ROOT).then_some((n.parent as usize, n.slot as usize, n.bucket));
            Some((n.bucket, s, to))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alt_is_an_involution_and_differs() {
        for mask in [0u32, 1, 7, 1023, (1 << 20) - 1] {
            for h in [0u64, 1, 0xFFFF_0000_0000_0000, 0x1234_5678_9ABC_DEF0, u64::MAX] {
                let p = place(h, mask);
                assert_ne!(p.tag, 0);
                assert_eq!(p.b1, primary(h, mask));
                assert_eq!(alt(p.b2, p.tag, mask), p.b1);
                assert!(p.b2 <= mask);
                if mask > 0 {
                    assert_ne!(p.b2, p.b1);
                }
            }
        }
        // Every tag (every 61st under Miri), on a table with more than one bucket.
        for tag in (1..=u16::MAX).step_by(if cfg!(miri) { 61 } else { 1 }) {
            for b in [0u32, 7, 4095] {
                let a = alt(b, tag, 4095);
                assert_ne!(a, b);
                assert_eq!(alt(a, tag, 4095), b);
            }
        }
    }

    #[test]
    fn find_slot_returns_first_confirmed_match() {
        assert_eq!(find_slot(0, |_| true), None);
        assert_eq!(find_slot(0b1010_0100, |s| s != 2), Some(5));
        assert_eq!(find_slot(0b1010_0100, |_| false), None);
        let mut tags = [1u16; SLOTS];
        assert_eq!(free_slot(&tags), None);
        tags[6] = 0;
        tags[3] = 0;
        assert_eq!(free_slot(&tags), Some(3));
    }

    /// A model of full buckets: the search must find a simple path ending at an empty slot, whose moves
    /// (applied far end first to the model) keep every entry in one of its two buckets.
    #[test]
    fn path_moves_free_a_candidate_slot() {
        let mask = 63u32;
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut found = 0;
        let rounds = if cfg!(miri) { 20 } else { 200 };
        for _round in 0..rounds {
            // Fill all buckets but a few; each slot gets a random non-zero tag.
            let mut buckets = vec![[0u16; SLOTS]; (mask + 1) as usize];
            for (b, bk) in buckets.iter_mut().enumerate() {
                if next() % 16 != 0 || b < 2 {
                    for t in bk.iter_mut() {
                        *t = (next() as u16) | 1;
                    }
                }
            }
            let (b1, b2) = (0, alt(0, 0x77, mask));
            buckets[b2 as usize] = [3; SLOTS];
            let mut search = PathSearch::<256>::new();
            match search.run(b1, b2, mask, |b| buckets[b as usize]) {
                Search::Found => {
                    let moves: Vec<_> = search.moves().collect();
                    assert!(free_slot(&buckets[moves[0].2 as usize]).is_some());
                    let mut vacated = None;
                    for &(from, s, to) in &moves {
                        let t = buckets[from as usize][s];
                        assert_eq!(alt(from, t, mask), to, "an entry moves to its other bucket");
                        let d = match vacated {
                            None => free_slot(&buckets[to as usize]).unwrap(),
                            Some((vb, vs)) => {
                                assert_eq!(vb, to);
                                vs
                            }
                        };
                        assert_eq!(buckets[to as usize][d], 0);
                        buckets[to as usize][d] = t;
                        buckets[from as usize][s] = 0;
                        vacated = Some((from, s));
                    }
                    let (last, _) = vacated.unwrap();
                    assert!(last == b1 || last == b2);
                    assert!(moves.len() <= 4, "bounded search finds short paths");
                    found += 1;
                }
                Search::NoPath => {}
                Search::SlotFreed => panic!("all searched buckets were full"),
            }
        }
        assert!(found * 4 > rounds * 3, "paths found in {found} of {rounds} rounds");
        // Candidate buckets with an empty slot are reported, not searched past.
        let tags = |b: u32| if b == 5 { [0; SLOTS] } else { [9; SLOTS] };
        assert_eq!(PathSearch::<16>::new().run(5, 6, mask, tags), Search::SlotFreed);
    }
}
