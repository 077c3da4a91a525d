//! Per-core auxiliary table (FAJITA ③): 5-tuple -> { inline state of the chain's
//! 5-tuple NFs, pinned handles to coarse-grained entries in shared tables }.
//!
//! This module owns the link between one core's 5-tuple flows and the shared,
//! coarse-keyed state (source IP counter, destination IP policer, ...) that many
//! flows on many cores use. The first packet of a flow pays for one
//! lookup-or-insert in each [`SharedFlowTable`] and *pins* the coarse entries
//! (refcount + 1); every later packet reaches all of its state through the one
//! per-core lookup. When the flow ends (explicit removal) or expires, its pins
//! are released, so a coarse entry is removed only once every finer flow using it
//! has gone (and, if its shared table has a timeout, once it has been idle for it).
//!
//! Built on the per-core [`FlowTable`] with the `Reject` full policy: an eviction
//! would drop a flow without releasing its pins.
//!
//! State block of a flow: `[handle 0 | handle 1 | ... (8 bytes each, little endian)]`
//! then the inline bytes.

use crate::flow_table::{BatchResult, FlowTable, FullPolicy, Handle, TableConfig, INVALID_HANDLE, MAX_BATCH};
use crate::key::FlowKey;
use crate::shared::sync::AtomicU64;
use crate::shared::{SharedFlowTable, SharedHandle, SharedKey};
use crate::TableError;
use std::sync::Arc;

/// Creation parameters of an [`AuxTable`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuxConfig {
    /// Maximum number of 5-tuple flows on this core.
    pub capacity: usize,
    /// Bytes of inline state (the chain's 5-tuple NFs, aggregated).
    pub inline_size: usize,
    /// Idle timeout of a flow; `None` = flows end only through [`AuxTable::remove`].
    pub idle_timeout_ns: Option<u64>,
    /// Back the per-core table with hugepages when available.
    pub hugepages: bool,
}

/// Counters since creation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuxStats {
    /// Flows created.
    pub created: u64,
    /// Flows ended (removed or expired), pins released.
    pub ended: u64,
    /// New flows dropped because a shared table was full (their other pins were released).
    pub shared_failures: u64,
}

/// A per-core 5-tuple table whose entries pin coarse entries of shared tables.
pub struct AuxTable<K: FlowKey, C: SharedKey> {
    flows: FlowTable<K>,
    shared: Vec<Arc<SharedFlowTable<C>>>,
    inline_size: usize,
    stats: AuxStats,
    /// Coarse keys of one batch (capacity [`MAX_BATCH`], allocated once: no per-packet allocation).
    scratch: Vec<C>,
}

#[inline(always)]
fn handle_at(state: &[u8], t: usize) -> SharedHandle {
    match state.get(t * 8..t * 8 + 8) {
        Some(b) => SharedHandle::from_bits(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])),
        None => SharedHandle::NONE,
    }
}

#[inline(always)]
fn set_handle(state: &mut [u8], t: usize, h: SharedHandle) {
    if let Some(b) = state.get_mut(t * 8..t * 8 + 8) {
        b.copy_from_slice(&h.to_bits().to_le_bytes());
    }
}

/// Releases every pin recorded in a flow's state block.
fn release_all<C: SharedKey>(shared: &[Arc<SharedFlowTable<C>>], state: &[u8], now: u64) {
    for (t, table) in shared.iter().enumerate() {
        let h = handle_at(state, t);
        if h.is_some() {
            table.release(h, now);
        }
    }
}

impl<K: FlowKey, C: SharedKey> AuxTable<K, C> {
    /// Creates the per-core table for flows that pin entries of `shared` (one handle each).
    pub fn new(cfg: AuxConfig, shared: Vec<Arc<SharedFlowTable<C>>>) -> Result<Self, TableError> {
        let state_size = shared
            .len()
            .checked_mul(8)
            .and_then(|b| b.checked_add(cfg.inline_size))
            .ok_or(TableError::InvalidConfig("aux state size overflows"))?;
        let flows = FlowTable::new(TableConfig {
            capacity: cfg.capacity,
            state_size,
            idle_timeout_ns: cfg.idle_timeout_ns,
            full_policy: FullPolicy::Reject,
            hugepages: cfg.hugepages,
        })?;
        Ok(AuxTable {
            flows,
            shared,
            inline_size: cfg.inline_size,
            stats: AuxStats::default(),
            scratch: Vec::with_capacity(MAX_BATCH),
        })
    }

    /// The shared tables, in handle order.
    pub fn shared_tables(&self) -> &[Arc<SharedFlowTable<C>>] {
        &self.shared
    }

    /// The underlying per-core table (read-only: statistics, iteration).
    pub fn flows(&self) -> &FlowTable<K> {
        &self.flows
    }

    /// Counters since creation.
    pub fn stats(&self) -> AuxStats {
        self.stats
    }

    /// Live flows.
    pub fn len(&self) -> usize {
        self.flows.len()
    }

    /// True if no flow is live.
    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    /// Batched lookup of existing flows (no insertion); returns the hit mask.
    pub fn lookup_batch(&self, keys: &[K], hashes: &[u64], out: &mut [Handle]) -> u64 {
        self.flows.lookup_batch(keys, hashes, out)
    }

    /// Batched add-on-miss of up to [`MAX_BATCH`] flows (extra keys are ignored).
    ///
    /// For each new flow, `coarse(key, t)` gives its key and hash in shared table `t`;
    /// those entries are looked up or inserted (with `init_shared(t, coarse_key, state)` on a
    /// shared miss) in one batch per shared table and pinned, and `init_inline` fills the
    /// flow's zeroed inline state. A new flow that cannot get all its shared entries (a
    /// shared table is full) is removed again and reported in `failed`, never half-built.
    #[allow(clippy::too_many_arguments)]
    pub fn lookup_or_insert_batch(
        &mut self,
        keys: &[K],
        hashes: &[u64],
        now: u64,
        out: &mut [Handle],
        mut coarse: impl FnMut(&K, usize) -> (C, u64),
        mut init_shared: impl FnMut(usize, &C, &[AtomicU64]),
        mut init_inline: impl FnMut(&K, &mut [u8]),
    ) -> BatchResult {
        let n = keys.len().min(hashes.len()).min(out.len()).min(MAX_BATCH);
        let nshared = self.shared.len();
        let mut res = self.flows.lookup_or_insert_batch(&keys[..n], &hashes[..n], now, &mut out[..n], |i, st| {
            for t in 0..nshared {
                set_handle(st, t, SharedHandle::NONE);
            }
            if let Some(inline) = st.get_mut(nshared * 8..) {
                init_inline(&keys[i], inline);
            }
        });
        if res.inserted == 0 {
            return res;
        }
        self.stats.created += u64::from(res.inserted.count_ones());
        // One batched pinned lookup-or-insert per shared table for all new flows of the batch.
        let mut rows = [0usize; MAX_BATCH];
        let mut m = 0;
        let mut bits = res.inserted;
        while bits != 0 {
            rows[m] = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            m += 1;
        }
        let mut chash = [0u64; MAX_BATCH];
        let mut got = [SharedHandle::NONE; MAX_BATCH];
        let mut broken = 0u64;
        for (t, table) in self.shared.iter().enumerate() {
            self.scratch.clear();
            for (j, &i) in rows[..m].iter().enumerate() {
                let (c, h) = coarse(&keys[i], t);
                self.scratch.push(c);
                chash[j] = h;
            }
            table.acquire_batch(&self.scratch, &chash[..m], now, &mut got[..m], |c, s| init_shared(t, c, s));
            for (j, &i) in rows[..m].iter().enumerate() {
                if got[j].is_some() {
                    set_handle(self.flows.state_mut(out[i]), t, got[j]);
                } else {
                    broken |= 1 << i;
                }
            }
        }
        // A flow missing a shared entry is undone: release what it pinned, drop it.
        let mut bits = broken;
        while bits != 0 {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            release_all(&self.shared, self.flows.state(out[i]), now);
            self.flows.remove_handle(out[i]);
            out[i] = INVALID_HANDLE;
            self.stats.shared_failures += 1;
        }
        res.inserted &= !broken;
        res.failed |= broken;
        res
    }

    /// Inline state of flow `h` (empty for an invalid handle).
    #[inline]
    pub fn inline(&self, h: Handle) -> &[u8] {
        self.flows.state(h).get(self.shared.len() * 8..).unwrap_or(&[])
    }

    /// Mutable inline state of flow `h` (empty for an invalid handle).
    #[inline]
    pub fn inline_mut(&mut self, h: Handle) -> &mut [u8] {
        let off = self.shared.len() * 8;
        self.flows.state_mut(h).get_mut(off..).unwrap_or(&mut [])
    }

    /// Bytes of inline state per flow (as configured).
    pub fn inline_size(&self) -> usize {
        self.inline_size
    }

    /// Flow `h`'s pinned handle into shared table `t` (NONE if out of range).
    #[inline]
    pub fn shared_handle(&self, h: Handle, t: usize) -> SharedHandle {
        if t < self.shared.len() {
            handle_at(self.flows.state(h), t)
        } else {
            SharedHandle::NONE
        }
    }

    /// Flow `h`'s coarse state in shared table `t`: pinned, so safe to update (atomically)
    /// for as long as the flow lives.
    #[inline]
    pub fn shared_state(&self, h: Handle, t: usize) -> Option<&[AtomicU64]> {
        let sh = self.shared_handle(h, t);
        if sh.is_some() {
            self.shared[t].state(sh)
        } else {
            None
        }
    }

    /// Prefetches flow `h`'s coarse entries (FAJITA ②: indirect state).
    #[inline]
    pub fn prefetch_shared(&self, h: Handle) {
        for (t, table) in self.shared.iter().enumerate() {
            table.prefetch_state(handle_at(self.flows.state(h), t));
        }
    }

    /// Marks flow `h` as seen at `now`.
    #[inline]
    pub fn touch(&mut self, h: Handle, now: u64) {
        self.flows.touch(h, now);
    }

    /// Ends a flow (e.g. TCP FIN/RST): releases its pins and removes it. False if absent.
    pub fn remove(&mut self, key: &K, hash: u64, now: u64) -> bool {
        match self.flows.lookup(key, hash) {
            Some(h) => self.remove_handle(h, now),
            None => false,
        }
    }

    /// Ends flow `h`; false if it is not live.
    pub fn remove_handle(&mut self, h: Handle, now: u64) -> bool {
        if self.flows.key(h).is_none() {
            return false;
        }
        release_all(&self.shared, self.flows.state(h), now);
        self.stats.ended += 1;
        self.flows.remove_handle(h)
    }

    /// Expires idle flows (bounded by `budget`, as [`FlowTable::expire`]), releasing their
    /// pins after `on_expire(key, inline)`. Returns the number of flows expired.
    pub fn expire(&mut self, now: u64, budget: usize, mut on_expire: impl FnMut(&K, &[u8])) -> usize {
        let AuxTable { flows, shared, stats, .. } = self;
        let off = shared.len() * 8;
        let n = flows.expire(now, budget, |_, k, st| {
            on_expire(k, st.get(off..).unwrap_or(&[]));
            release_all(shared, st, now);
        });
        stats.ended += n as u64;
        n
    }
}

impl<K: FlowKey, C: SharedKey> Drop for AuxTable<K, C> {
    /// A dropped core table ends all its flows, so shared entries do not stay pinned forever.
    fn drop(&mut self) {
        for (_, _, st) in self.flows.iter() {
            release_all(&self.shared, st, 0);
        }
    }
}
