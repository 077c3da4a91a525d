//! `flowplane-table`: per-core flow tables and their state slab, and the shared table for coarse keys.
//!
//! [`FlowTable`] is a bucketized cuckoo hash (two 64-byte candidate buckets of
//! 8 tagged slots per key) whose values are [`Handle`]s into a preallocated,
//! cache-line-aligned slab of `key | hash | last_seen | state` entries. It
//! offers batched prefetching lookup (FAJITA / `rte_hash_lookup_bulk`),
//! add-on-miss insertion (PNA), in-place state update through handles, removal
//! by key or handle, idle expiry with bounded work per call, and a full-table
//! policy chosen at creation. Keys come with caller-computed 64-bit hashes.
//! Its [`Layout::Inline`] variant stores small entries in place instead (`inline`:
//! a key's home entry comes from its hash, so most lookups read one entry's line);
//! the chain compiler picks the layout from the entry size ([`Layout::fit`]).
//! [`shared::SharedFlowTable`] is the same cuckoo layout reached by every core
//! (lock-free readers, per-bucket writer locks, refcounted entries).
//!
//! Words: a *slot* is a position inside a bucket; an *entry* is a flow's key and
//! state, named by its *handle*.
//!
//! [`FixedMap`] is the small fixed-capacity map NFs keep their own per-core
//! state in (index over a slab, stable slots, deterministic sweep).
//!
//! Module map: `cuckoo` (placement, bucket search and displacement paths, shared
//! by both tables), `key` (the [`FlowKey`] trait), `simd` (tag compare), `slab`
//! (memory, entries, free list), `inline` (the inline layout's placement), `fixed_map` (the NF-private map), `flow_table` (the per-core table), `expiry` (its
//! idle sweep), `states` (typed views of one NF's state across the entries),
//! `shared` (the shared table), `error`.

mod cuckoo;
pub mod error;
pub mod expiry;
pub mod fixed_map;
pub mod flow_table;
pub mod huge;
pub mod inline;
pub mod key;
pub mod shared;
pub mod simd;
mod slab;
pub mod states;

pub use cuckoo::{BULK_LOOKUP_MAX, SLOTS};
pub use error::TableError;
pub use fixed_map::{FibHash, FixedMap, KeyHash, FIXED_MAP_MAX};
pub use flow_table::{
    BatchResult, FlowTable, FullPolicy, Handle, Iter, Layout, Stamps, TableConfig, TableStats, Upsert, INVALID_HANDLE,
};
pub use huge::HugeArray;
pub use key::FlowKey;
pub use states::StatesMut;
