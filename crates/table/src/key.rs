//! Flow keys: what the table stores once per flow, hashed by the caller.
//!
//! The table never hashes keys itself: the caller (the packet parser, which
//! already computed an RSS/flow hash) passes a precomputed 64-bit hash with
//! every key. The tables take the bucket index from the low bits and the
//! 16-bit tag from the top bits (`cuckoo.rs`), so the hash must be well mixed in both.

/// A fixed-size flow key (5-tuple, source IP, ...): copied into the slab once per flow.
///
/// The alignment of an implementing type must not exceed 64 bytes (checked by `FlowTable::new`).
pub trait FlowKey: Copy + Eq + Send + 'static {}

impl<T: Copy + Eq + Send + 'static> FlowKey for T {}
