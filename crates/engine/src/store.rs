//! Per-core flow state for the 5-tuple NFs of a chain: one table for IPv4
//! 5-tuples and one for IPv6, whose entries hold the chain's aggregated
//! state block. A [`FlowRef`] (the executor's per-packet annotation) names
//! the entry: the table's entry handle, bit 31 set for the IPv6 table.

use bytemuck::Pod;
use flowplane_table::{FlowKey, FlowTable, FullPolicy, Layout, StatesMut, TableConfig, TableError, TableStats, Upsert};
use flowplane_wire::flow::{FiveTuple, FiveTupleV4, FiveTupleV6};

/// A packet's flow entry in a [`FlowStore`]: which table and which entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct FlowRef(u32);

/// Bit marking the IPv6 table.
const V6_BIT: u32 = 1 << 31;

impl FlowRef {
    /// No flow: the packet is unparsed, or the table was full.
    pub const NONE: FlowRef = FlowRef(u32::MAX);

    /// Entry `handle` of the IPv4 table (`INVALID_HANDLE` gives `NONE`).
    #[inline(always)]
    pub fn v4(handle: u32) -> FlowRef {
        FlowRef(if handle & V6_BIT == 0 { handle } else { u32::MAX })
    }

    /// Entry `handle` of the IPv6 table.
    #[inline(always)]
    pub fn v6(handle: u32) -> FlowRef {
        FlowRef(if handle & V6_BIT == 0 { handle | V6_BIT } else { u32::MAX })
    }

    /// The raw value (a table handle, bit 31 for IPv6), e.g. to hash it.
    #[inline(always)]
    pub fn bits(self) -> u32 {
        self.0
    }

    /// True for a real entry.
    #[inline(always)]
    pub fn is_some(self) -> bool {
        self != FlowRef::NONE
    }

    /// Which table and which entry: every accessor of [`FlowStore`] dispatches
    /// through this one decoding (IPv4 tested first: it is the common case).
    #[inline(always)]
    fn entry(self) -> Entry {
        if self.0 & V6_BIT == 0 {
            Entry::V4(self.0)
        } else if self == FlowRef::NONE {
            Entry::None
        } else {
            Entry::V6(self.0 & !V6_BIT)
        }
    }
}

/// A decoded [`FlowRef`].
enum Entry {
    V4(u32),
    V6(u32),
    None,
}

/// How to size a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// IPv4 flows (entries).
    pub capacity: usize,
    /// IPv6 flows (entries); IPv6 entries are larger, and rarer in the benchmarks.
    pub capacity_v6: usize,
    /// Bytes of aggregated state per flow.
    pub state_size: usize,
    /// Idle timeout.
    pub idle_timeout_ns: Option<u64>,
    /// Full-table policy.
    pub full_policy: FullPolicy,
    /// 2 MiB pages when available.
    pub hugepages: bool,
    /// Each table's layout is the compiler's choice for its entry size ([`Layout::fit`]: inline for blocks that
    /// fit an entry of one or two lines); false: bucketed.
    pub inline: bool,
}

/// The two tables.
pub struct FlowStore {
    v4: FlowTable<FiveTupleV4>,
    v6: FlowTable<FiveTupleV6>,
}

impl FlowStore {
    /// Creates both tables.
    pub fn new(c: StoreConfig) -> Result<Self, TableError> {
        let state_size = c.state_size.max(1);
        let mk = |cap: usize, layout: Layout| TableConfig {
            // Exactly what was asked: the report's capacity is what the table holds.
            capacity: cap.max(1),
            state_size,
            idle_timeout_ns: c.idle_timeout_ns,
            full_policy: c.full_policy,
            hugepages: c.hugepages,
            layout,
        };
        Ok(FlowStore {
            v4: FlowTable::new(mk(c.capacity, store_layout::<FiveTupleV4>(c.inline, state_size, c.capacity)))?,
            v6: FlowTable::new(mk(c.capacity_v6, store_layout::<FiveTupleV6>(c.inline, state_size, c.capacity_v6)))?,
        })
    }

    /// The IPv4 table's layout (the IPv6 table's, with its larger key, may differ).
    pub fn layout(&self) -> Layout {
        self.v4.layout()
    }

    /// Backs both tables' memory now (no page fault on the packet path later):
    /// paced and live runs, where a fault is a stall that loses packets.
    pub fn prefault(&mut self) {
        self.v4.prefault();
        self.v6.prefault();
    }

    /// The IPv4 table.
    pub fn v4(&mut self) -> &mut FlowTable<FiveTupleV4> {
        &mut self.v4
    }

    /// The IPv6 table.
    pub fn v6(&mut self) -> &mut FlowTable<FiveTupleV6> {
        &mut self.v6
    }

    /// State block of `r` (empty for `FlowRef::NONE`).
    #[inline(always)]
    pub fn block(&self, r: FlowRef) -> &[u8] {
        match r.entry() {
            Entry::V4(h) => self.v4.state(h),
            Entry::V6(h) => self.v6.state(h),
            Entry::None => &[],
        }
    }

    /// Mutable state block of `r` (empty for `FlowRef::NONE`).
    #[inline(always)]
    pub fn block_mut(&mut self, r: FlowRef) -> &mut [u8] {
        match r.entry() {
            Entry::V4(h) => self.v4.state_mut(h),
            Entry::V6(h) => self.v6.state_mut(h),
            Entry::None => &mut [],
        }
    }

    /// The `S` at `offset` of `r`'s block, checked (size, alignment, range);
    /// `None` for [`FlowRef::NONE`] or when it does not fit.
    #[inline(always)]
    pub fn state_mut<S: Pod>(&mut self, r: FlowRef, offset: usize) -> Option<&mut S> {
        match r.entry() {
            Entry::V4(h) => self.v4.state_as_mut(h, offset),
            Entry::V6(h) => self.v6.state_as_mut(h, offset),
            Entry::None => None,
        }
    }

    /// One NF's state (an `S` at `offset` of every block) in both tables,
    /// checked once for the whole view; with a store sized for another chain
    /// (the `S` does not fit), a view in which every flow is out of range.
    #[inline]
    pub fn states_mut<S: Pod>(&mut self, offset: usize) -> StoreStates<'_, S> {
        let v4 = self.v4.states_mut::<S>(offset);
        let v6 = self.v6.states_mut::<S>(offset);
        match (v4, v6) {
            (Some(v4), Some(v6)) => StoreStates { v4, v6 },
            _ => StoreStates { v4: StatesMut::empty(), v6: StatesMut::empty() },
        }
    }

    /// Single-key add-on-miss (latency-optimised path) at the packet's time
    /// `now_ns`: `f(Upsert::New(block))` fills a new flow's block, preceded by
    /// `f(Upsert::Expired(old))` when the flow's entry was idle past the
    /// timeout (expired on lookup) or by `f(Upsert::Evicted(key, old))` when
    /// a full table (`--table-full evict`) reuses another flow's entry.
    /// Returns the flow's entry and whether `f` created state; `None` when
    /// the table is full.
    #[inline]
    pub fn upsert(
        &mut self,
        key: &FiveTuple,
        hash: u64,
        now_ns: u64,
        mut f: impl FnMut(Upsert<'_, FiveTuple>),
    ) -> Option<(FlowRef, bool)> {
        match key {
            FiveTuple::V4(k) => self
                .v4
                .upsert(k, hash, now_ns, |u| widen(u, FiveTuple::V4, &mut f))
                .ok()
                .map(|(h, new)| (FlowRef::v4(h), new)),
            FiveTuple::V6(k) => self
                .v6
                .upsert(k, hash, now_ns, |u| widen(u, FiveTuple::V6, &mut f))
                .ok()
                .map(|(h, new)| (FlowRef::v6(h), new)),
        }
    }

    /// Sets `r`'s last-seen time (a later packet served by the same lookup).
    #[inline]
    pub fn touch(&mut self, r: FlowRef, now_ns: u64) {
        match r.entry() {
            Entry::V4(h) => self.v4.touch(h, now_ns),
            Entry::V6(h) => self.v6.touch(h, now_ns),
            Entry::None => {}
        }
    }

    /// True if `r`'s flow, seen at `now_ns`, is idle past the timeout (a lookup would renew it).
    #[inline]
    pub fn idle_at(&self, r: FlowRef, now_ns: u64) -> bool {
        match r.entry() {
            Entry::V4(h) => self.v4.idle_at(h, now_ns),
            Entry::V6(h) => self.v6.idle_at(h, now_ns),
            Entry::None => false,
        }
    }

    /// The flow's entry, if it has one (no insertion).
    pub fn find(&self, key: &FiveTuple, hash: u64) -> Option<FlowRef> {
        match key {
            FiveTuple::V4(k) => self.v4.lookup(k, hash).map(FlowRef::v4),
            FiveTuple::V6(k) => self.v6.lookup(k, hash).map(FlowRef::v6),
        }
    }

    /// Removes the entry of `r`.
    pub fn remove(&mut self, r: FlowRef) -> bool {
        match r.entry() {
            Entry::V4(h) => self.v4.remove_handle(h),
            Entry::V6(h) => self.v6.remove_handle(h),
            Entry::None => false,
        }
    }

    /// Key of `r`'s flow (None: no entry there any more).
    pub fn key(&self, r: FlowRef) -> Option<FiveTuple> {
        match r.entry() {
            Entry::V4(h) => self.v4.key(h).map(|k| FiveTuple::V4(*k)),
            Entry::V6(h) => self.v6.key(h).map(|k| FiveTuple::V6(*k)),
            Entry::None => None,
        }
    }

    /// Expires idle entries with bounded work, calling `f(key, block)` before each removal.
    pub fn expire(&mut self, now_ns: u64, budget: usize, mut f: impl FnMut(&FiveTuple, &[u8])) -> usize {
        let a = self.v4.expire(now_ns, budget, |_, k, s| f(&FiveTuple::V4(*k), s));
        let b = self.v6.expire(now_ns, budget / 4 + 1, |_, k, s| f(&FiveTuple::V6(*k), s));
        a + b
    }

    /// Live flows.
    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    /// True if no flow is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// IPv4 entries the store holds (`--flows`: what a table-full report
    /// and a capacity figure mean for the common case).
    pub fn capacity(&self) -> usize {
        self.v4.capacity()
    }

    /// IPv6 entries the store holds besides (a table of its own).
    pub fn capacity_v6(&self) -> usize {
        self.v6.capacity()
    }

    /// Summed counters of both tables.
    pub fn stats(&self) -> TableStats {
        let (a, b) = (self.v4.stats(), self.v6.stats());
        TableStats {
            inserts: a.inserts + b.inserts,
            removes: a.removes + b.removes,
            expiries: a.expiries + b.expiries,
            full_events: a.full_events + b.full_events,
            evictions: a.evictions + b.evictions,
            lookups: a.lookups + b.lookups,
            hits: a.hits + b.hits,
        }
    }

    /// Every flow a lookup at `now_ns` would still find (not idle past the
    /// timeout; every live flow for `None`) with its block: what an export lists.
    pub fn for_each_live(&self, now_ns: Option<u64>, mut f: impl FnMut(&FiveTuple, &[u8])) {
        let live4 = |h| now_ns.is_none_or(|t| !self.v4.idle_at(h, t));
        let live6 = |h| now_ns.is_none_or(|t| !self.v6.idle_at(h, t));
        for (h, k, s) in self.v4.iter() {
            if live4(h) {
                f(&FiveTuple::V4(*k), s);
            }
        }
        for (h, k, s) in self.v6.iter() {
            if live6(h) {
                f(&FiveTuple::V6(*k), s);
            }
        }
    }

    /// Visits up to `budget.0` live IPv4 flows and `budget.1` IPv6 ones from
    /// the cursor `at` (each table's position), a table wrapping to its start
    /// when walked through: a paced walk over every flow (IPFIX active timeouts).
    pub fn visit(&self, at: &mut (u32, u32), budget: (usize, usize), mut f: impl FnMut(&FiveTuple, &[u8])) {
        at.0 = walk(self.v4.iter_from(at.0), budget.0, |k, s| f(&FiveTuple::V4(*k), s));
        at.1 = walk(self.v6.iter_from(at.1), budget.1, |k, s| f(&FiveTuple::V6(*k), s));
    }

    /// Live IPv4 flows.
    pub fn len_v4(&self) -> usize {
        self.v4.len()
    }

    /// Live IPv6 flows.
    pub fn len_v6(&self) -> usize {
        self.v6.len()
    }

    /// Every live flow with its block and whether it is idle past the
    /// timeout at `now_ns` (a sweep or a lookup would expire it).
    pub fn for_each_judged(&self, now_ns: u64, mut f: impl FnMut(&FiveTuple, &[u8], bool)) {
        for (h, k, s) in self.v4.iter() {
            f(&FiveTuple::V4(*k), s, self.v4.idle_at(h, now_ns));
        }
        for (h, k, s) in self.v6.iter() {
            f(&FiveTuple::V6(*k), s, self.v6.idle_at(h, now_ns));
        }
    }

    /// Every live flow with its block.
    pub fn for_each(&self, mut f: impl FnMut(&FiveTuple, &[u8])) {
        for (_, k, s) in self.v4.iter() {
            f(&FiveTuple::V4(*k), s);
        }
        for (_, k, s) in self.v6.iter() {
            f(&FiveTuple::V6(*k), s);
        }
    }
}

/// The layout of a table of `capacity` keys `K` and `state_size` bytes of block: the chain compiler's choice by
/// entry size when `inline` is allowed (and the capacity within the inline layout's).
pub fn store_layout<K: FlowKey>(inline: bool, state_size: usize, capacity: usize) -> Layout {
    if inline && capacity <= Layout::INLINE_MAX_CAPACITY {
        Layout::fit::<K>(state_size)
    } else {
        Layout::Bucketed
    }
}

/// A table's upsert event with its key as a [`FiveTuple`] (an evicted flow's).
#[inline(always)]
pub(crate) fn widen<K: Copy>(u: Upsert<'_, K>, wrap: fn(K) -> FiveTuple, f: &mut impl FnMut(Upsert<'_, FiveTuple>)) {
    match u {
        Upsert::Expired(s) => f(Upsert::Expired(s)),
        Upsert::New(s) => f(Upsert::New(s)),
        Upsert::Evicted(k, s) => f(Upsert::Evicted(&wrap(*k), s)),
    }
}

/// Visits up to `budget` entries of `it`; returns where to resume (0: walked through, start over).
fn walk<'a, K: 'a>(
    it: impl Iterator<Item = (u32, &'a K, &'a [u8])>,
    budget: usize,
    mut f: impl FnMut(&K, &[u8]),
) -> u32 {
    if budget == 0 {
        return 0;
    }
    let mut n = 0;
    for (h, k, s) in it {
        f(k, s);
        n += 1;
        if n >= budget {
            return h + 1;
        }
    }
    0
}

/// One NF's typed state in every block of a [`FlowStore`]
/// ([`FlowStore::states_mut`]): a batch pass reaches packet i's state
/// through its [`FlowRef`] without a per-packet size or alignment check.
pub struct StoreStates<'a, S> {
    v4: StatesMut<'a, S>,
    v6: StatesMut<'a, S>,
}

impl<S: Pod> StoreStates<'_, S> {
    /// The state of `r`'s flow; `None` for [`FlowRef::NONE`] or an out-of-range entry.
    #[inline(always)]
    pub fn get_mut(&mut self, r: FlowRef) -> Option<&mut S> {
        match r.entry() {
            Entry::V4(h) => self.v4.get_mut(h),
            Entry::V6(h) => self.v6.get_mut(h),
            Entry::None => None,
        }
    }

    /// The state of `r`'s flow if `r` is an IPv4 entry in range, with one
    /// comparison: an IPv4 ref is its table handle, and every IPv6 ref and
    /// [`FlowRef::NONE`] has bit 31 set, above any table's capacity. `None`
    /// sends the caller to [`Self::get_mut`] (the batch loops' fast path).
    #[inline(always)]
    pub fn get_v4_mut(&mut self, r: FlowRef) -> Option<&mut S> {
        self.v4.get_mut(r.0)
    }

    /// Read-only [`Self::get_mut`] (prefetch hooks).
    #[inline(always)]
    pub fn get(&self, r: FlowRef) -> Option<&S> {
        match r.entry() {
            Entry::V4(h) => self.v4.get(h),
            Entry::V6(h) => self.v6.get(h),
            Entry::None => None,
        }
    }
}
