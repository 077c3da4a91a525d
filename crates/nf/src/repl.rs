//! What an NF hands the engine's state replication (`flowplane run
//! --replicate`, `flowplane_engine::repl`): a replicated NF pushes one
//! [`Record`] when a flow's replicated state is created or changes in a way
//! a standby must know (nat: a mapping taken or released; lb: a backend
//! chosen), into a bounded per-core queue ([`ReplTx`]). The push is one ring
//! write: no allocation, lock, formatting or syscall; a full queue counts the
//! record as lost (the standby's next bulk resync repairs it) and the NF goes
//! on. Batching into datagrams, sequence numbers and sending are the engine's
//! replication thread's. The wire format is `flowplane_wire::repl`'s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use flowplane_wire::flow::FiveTuple;
pub use flowplane_wire::repl::{Op, Record, MAX_STATE};

/// The producer side of one NF's per-core replication queue.
pub struct ReplTx {
    ring: rtrb::Producer<Record>,
    lost: Arc<AtomicU64>,
    /// The NF's index among the chain's stateful NFs.
    pub stage: u8,
    /// The worker core.
    pub core: u8,
}

impl std::fmt::Debug for ReplTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplTx").field("stage", &self.stage).field("core", &self.core).finish()
    }
}

impl ReplTx {
    /// A queue of `capacity` records; `lost` counts the pushes it refused.
    pub fn new(capacity: usize, lost: Arc<AtomicU64>, stage: u8, core: u8) -> (Self, rtrb::Consumer<Record>) {
        let (ring, rx) = rtrb::RingBuffer::new(capacity.max(1));
        (ReplTx { ring, lost, stage, core }, rx)
    }

    /// Queues an upsert of `key`'s state (its `Pod` bytes, at most [`MAX_STATE`]).
    #[inline]
    pub fn upsert(&mut self, key: &FiveTuple, state: &[u8]) {
        let r = Record::upsert(self.stage, self.core, *key, state);
        if self.ring.push(r).is_err() {
            self.full();
        }
    }

    /// Queues a delete of `key`'s state.
    #[inline]
    pub fn delete(&mut self, key: &FiveTuple) {
        let r = Record::delete(self.stage, self.core, *key);
        if self.ring.push(r).is_err() {
            self.full();
        }
    }

    /// Free places in the queue (a resync walk stops before filling it).
    pub fn room(&self) -> usize {
        self.ring.slots()
    }

    #[cold]
    fn full(&mut self) {
        self.lost.fetch_add(1, Ordering::Relaxed);
    }
}

/// A queue for unit tests: the NF's side and the records it pushed.
#[cfg(test)]
pub(crate) fn test_queue() -> (ReplTx, rtrb::Consumer<Record>) {
    ReplTx::new(1024, Arc::new(AtomicU64::new(0)), 0, 0)
}
