//! Flow keys: what the table stores once per flow, hashed by the caller.
//!
//! The table never hashes keys itself: the caller (the packet parser, which
//! already computed an RSS/flow hash) passes a precomputed 64-bit hash with
//! every key. The table takes the bucket index from the low bits and the
//! 16-bit tag from the top bits, so the hash must be well mixed in both.

/// A fixed-size flow key (5-tuple, source IP, ...): copied into the slab once per flow.
///
/// The alignment of an implementing type must not exceed 64 bytes (checked by `FlowTable::new`).
pub trait FlowKey: Copy + Eq + Send + 'static {}

impl<T: Copy + Eq + Send + 'static> FlowKey for T {}

/// Candidate-bucket arithmetic shared by the per-core table: the primary bucket
/// from the low hash bits, the tag from the high bits, the alternate bucket
/// from (bucket, tag) only, as in rte_hash and cuckoo filters, so an entry can
/// be moved to its other bucket without its key or full hash.
pub(crate) mod placement {
    /// Tag of an occupied slot; 0 marks an empty slot, so tags are never 0.
    #[inline(always)]
    pub(crate) fn tag(hash: u64) -> u16 {
        let t = (hash >> 48) as u16;
        t | u16::from(t == 0)
    }

    /// Primary bucket index.
    #[inline(always)]
    pub(crate) fn primary(hash: u64, mask: u32) -> u32 {
        hash as u32 & mask
    }

    /// The other candidate bucket of an entry with tag `tag` stored in bucket `b`
    /// (an involution: `alt(alt(b, t), t) == b`; odd offset so `alt != b` whenever there are 2+ buckets).
    #[inline(always)]
    pub(crate) fn alt(b: u32, tag: u16, mask: u32) -> u32 {
        let off = (u32::from(tag).wrapping_mul(0x5BD1_E995) >> 7) | 1;
        (b ^ off) & mask
    }
}

#[cfg(test)]
mod tests {
    use super::placement::*;

    #[test]
    fn alt_is_an_involution_and_differs() {
        for mask in [0u32, 1, 7, 1023, (1 << 20) - 1] {
            for h in [0u64, 1, 0xFFFF_0000_0000_0000, 0x1234_5678_9ABC_DEF0, u64::MAX] {
                let t = tag(h);
                assert_ne!(t, 0);
                let b = primary(h, mask);
                let a = alt(b, t, mask);
                assert_eq!(alt(a, t, mask), b);
                assert!(a <= mask);
                if mask > 0 {
                    assert_ne!(a, b);
                }
            }
        }
    }
}
