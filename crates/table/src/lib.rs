//! `flowplane-table`: per-core flow tables and their state slab.
//!
//! [`FlowTable`] is a bucketized cuckoo hash (two 64-byte candidate buckets of
//! 8 tagged slots per key) whose values are [`Handle`]s into a preallocated,
//! cache-line-aligned slab of `key | hash | last_seen | state` entries. It
//! offers batched prefetching lookup (FAJITA / `rte_hash_lookup_bulk`),
//! add-on-miss insertion (PNA), in-place state update through handles, removal
//! by key or handle, idle expiry with bounded work per call, and a full-table
//! policy chosen at creation. Keys come with caller-computed 64-bit hashes.
//!
//! Module map: `key` (the [`FlowKey`] trait, bucket/tag placement), `simd`
//! (tag compare), `slab` (memory, entries, free list), `flow_table` (the table),
//! `expiry` (idle sweep), `error`.

pub mod aux;
pub mod error;
pub mod expiry;
pub mod flow_table;
pub mod key;
pub mod shared;
pub mod simd;
mod slab;

pub use error::TableError;
pub use flow_table::{
    BatchResult, FlowTable, FullPolicy, Handle, Iter, TableConfig, TableStats, INVALID_HANDLE, MAX_BATCH,
};
pub use key::FlowKey;
