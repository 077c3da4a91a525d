//! Typed errors of the table crate (configuration, allocation, full table).

use thiserror::Error;

/// Why a table could not be created or an entry not inserted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TableError {
    /// A `TableConfig` field is out of range (the message names it).
    #[error("invalid table configuration: {0}")]
    InvalidConfig(&'static str),
    /// The operating system refused the memory for the buckets or the slab.
    #[error("cannot allocate {bytes} bytes of table memory")]
    OutOfMemory {
        /// Size of the failed allocation.
        bytes: usize,
    },
    /// The table is full and its policy is `Reject` (or no entry could be evicted).
    #[error("flow table is full")]
    Full,
}
