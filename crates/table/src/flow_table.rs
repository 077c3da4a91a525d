//! The per-core flow table. Two layouts ([`Layout`], fixed at creation) behind one API:
//!
//! * [`Layout::Bucketed`]: a bucketized cuckoo hash (2 candidate buckets of 8 slots, one 64-byte line each)
//!   whose slots hold 16-bit tags and handles into the state slab (`slab.rs`); a lookup reads the bucket line,
//!   then the entry's line(s). Any entry size.
//! * [`Layout::Inline`]: the entries themselves are the table (`inline.rs`): a key's home entry comes from its
//!   hash, so a lookup's common case reads that one entry (one line, or two adjacent lines for larger blocks).
//!
//! This module owns the API (single and batched lookup, with the rte_hash_lookup_bulk prefetch phases;
//! add-on-miss insertion; the full-table policy; removal; statistics) and the bucketed layout (displacement
//! paths come from `cuckoo.rs`, with the bucket overflow bookkeeping). Expiry lives in `expiry.rs`. Handles
//! are entry indices in both layouts and never change while a flow lives.

use crate::cuckoo::{
    self, alt, check_batch, find_slot, place, primary, PathSearch, Place, Search, BULK_LOOKUP_MAX, SLOTS,
};
use crate::error::TableError;
use crate::key::FlowKey;
use crate::simd::match_tags;
use crate::slab::{prefetch, RawMem, Slab};
use core::cell::Cell;

/// Index of a flow's entry in the state slab; stable for the flow's lifetime (cuckoo moves never change it).
pub type Handle = u32;

/// Written to `out[i]` for keys that were not found / not inserted.
pub const INVALID_HANDLE: Handle = u32::MAX;

/// Nodes explored by one displacement search before an insert gives up (bounds insert latency).
const MAX_BFS_NODES: usize = 256;

/// Handles an insertion must not evict: those already handed out by the same batched call.
#[derive(Clone, Copy)]
pub(crate) struct Protected<'a> {
    /// Every handle of the call's earlier chunks (failed keys hold `INVALID_HANDLE`, which matches no entry).
    done: &'a [Handle],
    /// The current chunk's handles; only those whose bit is set in `mask` are valid yet.
    chunk: &'a [Handle],
    mask: u64,
    /// The chunk's hits found idle, not yet renewed: the only protected entries whose last-seen time can be
    /// older than `floor`.
    stale: u64,
    /// The call's earliest packet time: every other entry the call handed out was stamped at or after it.
    floor: u64,
}

impl Protected<'_> {
    pub(crate) const NONE: Protected<'static> = Protected { done: &[], chunk: &[], mask: 0, stale: 0, floor: 0 };

    /// Whether `h`, last seen at `seen`, was handed out by this call. An entry seen before the call's first packet
    /// was not touched by it (unless a stale hit of this chunk): the common case costs no scan of the call's
    /// handles (issue 33: evict under a new-flow flood scanned up to a batch of handles per eviction).
    pub(crate) fn contains(&self, h: Handle, seen: u64) -> bool {
        let in_chunk = |mut m: u64| {
            while m != 0 {
                let j = m.trailing_zeros() as usize;
                m &= m - 1;
                if self.chunk.get(j) == Some(&h) {
                    return true;
                }
            }
            false
        };
        if seen < self.floor {
            return in_chunk(self.stale);
        }
        self.done.contains(&h) || in_chunk(self.mask)
    }
}

/// What an insert does when the table is full (slab exhausted or no displacement path).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FullPolicy {
    /// Fail the insert and count a `full_event`.
    #[default]
    Reject,
    /// Evict the least-recently-seen entry among the new key's two candidate buckets (16 entries),
    /// reuse its slab entry for the new flow and count an `eviction`. The upsert callbacks see the evicted flow's key
    /// and state first ([`Upsert::Evicted`]); evictions do not call the expiry callback.
    EvictLruIdle,
}

/// How a table finds a key's entry; chosen once, at creation (the chain compiler picks it from the size of the
/// aggregated block with [`Layout::fit`]). Both layouts give the same results through the same API; they differ
/// in the cache lines a lookup reads and in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Layout {
    /// Cuckoo buckets of tags and handles over a separate slab of entries: a lookup reads the bucket's line, then
    /// the entry's (two dependent random lines). Holds `capacity` entries in about `capacity` x (entry + 9) bytes.
    #[default]
    Bucketed,
    /// Entries stored in place, at their home position or a few positions after it: a lookup reads the home
    /// entry (one random line for entries of 64 bytes, two adjacent lines for 128), plus the next entries for
    /// the quarter or so of keys that found their home taken. Twice the entries of `capacity` (so homes stay
    /// mostly free), and [`inline::WINDOW`](crate::inline::WINDOW) positions of slack at the end.
    Inline,
}

impl Layout {
    /// Largest entry (key, header and state, in bytes) for which [`Layout::fit`] picks [`Layout::Inline`]: two
    /// lines. Above that an entry's lines outweigh the bucket line the inline layout saves.
    pub const INLINE_MAX_ENTRY: usize = 128;

    /// Largest capacity of an inline table (its handles, about twice the capacity, stay below 2^31).
    pub const INLINE_MAX_CAPACITY: usize = 1 << 29;

    /// The layout for entries of key `K` and `state_size` bytes of state: [`Layout::Inline`] when an entry takes
    /// at most two lines (state up to 32 bytes for a 16-byte key in one line, 96 in two), else
    /// [`Layout::Bucketed`].
    pub fn fit<K: FlowKey>(state_size: usize) -> Layout {
        match crate::slab::EntryLayout::new::<K>(state_size) {
            Ok(l) if l.size <= Self::INLINE_MAX_ENTRY => Layout::Inline,
            _ => Layout::Bucketed,
        }
    }

    /// Bytes of one entry (a multiple of 64) for key `K` and `state_size` bytes of state.
    pub fn entry_size<K: FlowKey>(state_size: usize) -> Option<usize> {
        crate::slab::EntryLayout::new::<K>(state_size).ok().map(|l| l.size)
    }

    /// Short name for reports: `bucketed` or `inline`.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Bucketed => "bucketed",
            Layout::Inline => "inline",
        }
    }
}

/// Table creation parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableConfig {
    /// Maximum number of flows (slab entries), 1 ..= 2^31.
    pub capacity: usize,
    /// Bytes of state per flow (rounded up so each slab entry is a multiple of 64 bytes).
    pub state_size: usize,
    /// Entries idle longer than this expire in [`FlowTable::expire`]; `None` disables expiry.
    pub idle_timeout_ns: Option<u64>,
    /// Behaviour of inserts into a full table.
    pub full_policy: FullPolicy,
    /// Back buckets and slab with 2 MiB hugepages when available (falls back to normal pages).
    pub hugepages: bool,
    /// Where entries live and how a lookup finds them.
    pub layout: Layout,
}

impl TableConfig {
    /// A config with no expiry, `Reject` policy, normal pages, the bucketed layout.
    pub fn new(capacity: usize, state_size: usize) -> Self {
        TableConfig {
            capacity,
            state_size,
            idle_timeout_ns: None,
            full_policy: FullPolicy::Reject,
            hugepages: false,
            layout: Layout::Bucketed,
        }
    }
}

/// Counters since creation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// New entries created (an entry expired on lookup and started over counts as one).
    pub inserts: u64,
    /// Entries removed explicitly (`remove`, `remove_handle`).
    pub removes: u64,
    /// Entries expired: removed by `expire`, or found idle past the timeout on lookup and renewed.
    pub expiries: u64,
    /// Inserts that failed because the table was full.
    pub full_events: u64,
    /// Entries evicted to make room (`EvictLruIdle`).
    pub evictions: u64,
    /// Keys looked up (single, batched and the lookup part of inserts).
    pub lookups: u64,
    /// Lookups that found their key.
    pub hits: u64,
}

/// Counts of one [`FlowTable::lookup_or_insert_batch`] call (they add up to the number of keys); per-key results
/// are in its `out` slice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchResult {
    /// Keys that were present (or inserted by an earlier key of the same batch).
    pub hit: usize,
    /// Keys inserted by this call (their `init` ran).
    pub inserted: usize,
    /// Keys that were absent and could not be inserted (table full): their `out[i]` is [`INVALID_HANDLE`].
    pub failed: usize,
}

impl core::ops::AddAssign for BatchResult {
    fn add_assign(&mut self, r: BatchResult) {
        self.hit += r.hit;
        self.inserted += r.inserted;
        self.failed += r.failed;
    }
}

/// What [`FlowTable::upsert_batch`] and [`FlowTable::upsert`] hand their callback for a key (`K`: the table's key).
pub enum Upsert<'a, K> {
    /// The key's entry was idle longer than the table's timeout (a real conntrack checks the time on lookup
    /// rather than trusting the sweep to have run): its old state, to release; a [`Upsert::New`] for the same key,
    /// on the same entry zeroed, follows at once.
    Expired(&'a [u8]),
    /// A new entry (inserted, or reused after [`Upsert::Expired`] or [`Upsert::Evicted`]): zeroed state for the
    /// callback to fill.
    New(&'a mut [u8]),
    /// The table was full and (`EvictLruIdle`) another flow's entry is reused for the key: that flow's key and
    /// state, to release or report before they are overwritten; the key's [`Upsert::New`] follows at once.
    Evicted(&'a K, &'a [u8]),
}

/// The time each key of a batched call is seen at: one time for all (`u64`) or one per key (`&[u64]`, as long
/// as the keys). Per-key times make idle checks independent of how packets were grouped into batches.
pub trait Stamps: Copy {
    /// Time of key `i`.
    fn at(self, i: usize) -> u64;
    /// The times of keys `start..` (the next chunk).
    fn skip(self, start: usize) -> Self;
    /// The earliest time of keys `0..n`: every entry a call touches is stamped at or after it.
    fn floor(self, n: usize) -> u64;
}

impl Stamps for u64 {
    #[inline(always)]
    fn at(self, _: usize) -> u64 {
        self
    }
    #[inline(always)]
    fn skip(self, _: usize) -> Self {
        self
    }
    #[inline(always)]
    fn floor(self, _: usize) -> u64 {
        self
    }
}

impl Stamps for &[u64] {
    #[inline(always)]
    fn at(self, i: usize) -> u64 {
        self.get(i).copied().unwrap_or(0)
    }
    #[inline(always)]
    fn skip(self, start: usize) -> Self {
        self.get(start..).unwrap_or(&[])
    }
    #[inline]
    fn floor(self, n: usize) -> u64 {
        // A key past the slice is seen at 0 (`at`).
        if self.len() < n {
            0
        } else {
            self[..n].iter().copied().min().unwrap_or(0)
        }
    }
}

/// One cache line: 8 tags (0 = empty slot), the 8 slab handles they lead to, and the overflow bookkeeping that
/// lets most lookups skip the alternate bucket: `overflow` counts entries whose primary bucket is this one but
/// which live in their alternate bucket; `alt_bits` marks this bucket's slots holding such entries. A key whose
/// primary bucket has `overflow == 0` can only be in its primary bucket, so a lookup reads 2 lines (bucket,
/// entry) instead of 3 — the difference between the bandwidth of 3 and of 2 random lines per op.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct Bucket {
    pub(crate) tags: [u16; SLOTS],
    pub(crate) handles: [Handle; SLOTS],
    pub(crate) overflow: u32,
    pub(crate) alt_bits: u8,
    _spare: [u8; 11],
}

const _: () = assert!(core::mem::size_of::<Bucket>() == 64);

/// A per-core flow table (Send, not Sync: one per core, no locks).
pub struct FlowTable<K: FlowKey> {
    /// Bucketed: the bucket array; inline: one unused line.
    buckets: RawMem,
    pub(crate) mask: u32,
    /// Inline: the number of home positions (0 for the bucketed layout, which is how the code tells them apart).
    pub(crate) homes: u32,
    /// Entries the table holds at most (`capacity`; the inline slab has more positions than that).
    pub(crate) max_len: u32,
    pub(crate) slab: Slab<K>,
    pub(crate) idle_timeout_ns: Option<u64>,
    /// `idle_timeout_ns` or `u64::MAX` (never idle): one compare per hit in [`Self::is_idle`].
    idle_limit: u64,
    pub(crate) policy: FullPolicy,
    pub(crate) stats: TableStats,
    pub(crate) lookups: Cell<u64>,
    pub(crate) hits: Cell<u64>,
    /// Next slab index the incremental expiry sweep examines.
    pub(crate) sweep_cursor: u32,
    /// Next slab index [`Self::far_victim`] examines.
    evict_cursor: u32,
}

// SAFETY: the table exclusively owns its memory (RawMem, Slab); K is Send. It is not Sync (Cell counters).
unsafe impl<K: FlowKey> Send for FlowTable<K> {}

impl<K: FlowKey> FlowTable<K> {
    /// Bytes [`Self::new`] allocates for `capacity` entries of `state_size` bytes (buckets, slab, free list and
    /// live bitmap; `None` for a state too large): lets a caller check a configuration against the machine's
    /// memory before allocating it.
    pub fn footprint(capacity: usize, state_size: usize) -> Option<u128> {
        Self::footprint_with(Layout::Bucketed, capacity, state_size)
    }

    /// [`Self::footprint`] for a table of layout `layout`.
    pub fn footprint_with(layout_kind: Layout, capacity: usize, state_size: usize) -> Option<u128> {
        let layout = crate::slab::EntryLayout::new::<K>(state_size).ok()?;
        if layout_kind == Layout::Inline {
            let entries = crate::inline::entries(capacity)? as u128;
            return Some(64 + entries * layout.size as u128 + entries.div_ceil(64) * 8);
        }
        let cap = capacity as u128;
        let buckets = (cap * 10).div_ceil(SLOTS as u128 * 9).next_power_of_two() * 64;
        Some(buckets + cap * (layout.size as u128 + 4) + cap.div_ceil(64) * 8)
    }

    /// Creates a table; buckets are sized so a full slab loads at most 90% of the slots.
    pub fn new(cfg: TableConfig) -> Result<Self, TableError> {
        if cfg.capacity == 0 || cfg.capacity > (1 << 31) {
            return Err(TableError::InvalidConfig("capacity must be in 1..=2^31"));
        }
        if cfg.layout == Layout::Inline {
            return Self::new_inline(cfg);
        }
        let min_buckets = (cfg.capacity * 10).div_ceil(SLOTS * 9);
        Self::with_buckets(cfg, min_buckets.next_power_of_two())
    }

    /// Creates a table with exactly `nbuckets` (a power of two) buckets: lets tests fill the slots themselves.
    pub(crate) fn with_buckets(cfg: TableConfig, nbuckets: usize) -> Result<Self, TableError> {
        if cfg.capacity == 0 || cfg.capacity > (1 << 31) {
            return Err(TableError::InvalidConfig("capacity must be in 1..=2^31"));
        }
        if !nbuckets.is_power_of_two() || nbuckets > (1 << 31) {
            return Err(TableError::InvalidConfig("bucket count must be a power of two <= 2^31"));
        }
        if cfg.idle_timeout_ns == Some(0) {
            return Err(TableError::InvalidConfig("idle_timeout_ns must be positive"));
        }
        let bytes = nbuckets * core::mem::size_of::<Bucket>();
        let buckets = RawMem::new(bytes, cfg.hugepages)?;
        let slab = Slab::new(cfg.capacity as u32, cfg.state_size, cfg.hugepages)?;
        Ok(Self::with_parts(&cfg, buckets, (nbuckets - 1) as u32, 0, slab))
    }

    /// Creates an inline-layout table (see `inline.rs`).
    fn new_inline(cfg: TableConfig) -> Result<Self, TableError> {
        if cfg.idle_timeout_ns == Some(0) {
            return Err(TableError::InvalidConfig("idle_timeout_ns must be positive"));
        }
        let entries =
            crate::inline::entries(cfg.capacity).ok_or(TableError::InvalidConfig("inline capacity must be <= 2^29"))?;
        let slab = Slab::new_placed(entries, cfg.state_size, cfg.hugepages)?;
        Ok(Self::with_parts(&cfg, RawMem::new(64, false)?, 0, crate::inline::homes(cfg.capacity), slab))
    }

    /// A table over its memory: both layouts' constructors end here.
    fn with_parts(cfg: &TableConfig, buckets: RawMem, mask: u32, homes: u32, slab: Slab<K>) -> Self {
        FlowTable {
            buckets,
            mask,
            homes,
            max_len: cfg.capacity as u32,
            slab,
            idle_timeout_ns: cfg.idle_timeout_ns,
            idle_limit: cfg.idle_timeout_ns.unwrap_or(u64::MAX),
            policy: cfg.full_policy,
            stats: TableStats::default(),
            lookups: Cell::new(0),
            hits: Cell::new(0),
            sweep_cursor: 0,
            evict_cursor: 0,
        }
    }

    /// The table's layout.
    #[inline(always)]
    pub fn layout(&self) -> Layout {
        if self.homes != 0 {
            Layout::Inline
        } else {
            Layout::Bucketed
        }
    }

    /// Address of bucket `b`, computed without a check (for prefetching); only [`Self::bucket`] and
    /// [`Self::bucket_mut`], which check the index, dereference it.
    #[inline(always)]
    fn bucket_ptr(&self, b: u32) -> *mut Bucket {
        self.buckets.ptr().cast::<Bucket>().wrapping_add(b as usize)
    }

    /// Bucket `b`. Callers pass indices from `primary`/`alt`, which are masked, so the check never fails (and
    /// compiles away right after the mask); it keeps "in bounds" a checked fact rather than a convention.
    #[inline(always)]
    pub(crate) fn bucket(&self, b: u32) -> &Bucket {
        assert!(b <= self.mask, "bucket index {b} past the mask {}", self.mask);
        // SAFETY: b <= mask < nbuckets (checked above), so the pointer is inside the bucket array of nbuckets * 64
        // bytes, 64-aligned; zero-initialised memory is a valid Bucket (all-integer fields); the borrow is tied to
        // &self and writes need &mut self.
        unsafe { &*self.bucket_ptr(b) }
    }

    /// Bucket `b`, writable (index checked as in [`Self::bucket`]).
    #[inline(always)]
    fn bucket_mut(&mut self, b: u32) -> &mut Bucket {
        assert!(b <= self.mask, "bucket index {b} past the mask {}", self.mask);
        // SAFETY: as in `bucket`, with exclusive access through &mut self.
        unsafe { &mut *self.bucket_ptr(b) }
    }

    /// Whether the entry in an occupied slot holding handle `h` has key `key`.
    #[inline(always)]
    fn holds(&self, h: Handle, key: &K) -> bool {
        // SAFETY: `h` comes from an occupied bucket slot, and occupied slots only ever hold live handles (`place`
        // and `move_entry` link entries just allocated or already linked; `clear_slot` runs before `slab.free`).
        unsafe { self.slab.key_unchecked(h) == key }
    }

    /// Finds `key` in bucket `b`: (slot, handle).
    #[inline(always)]
    fn find_in(&self, b: u32, tag: u16, key: &K) -> Option<(usize, Handle)> {
        let bk = self.bucket(b);
        find_slot(match_tags(&bk.tags, tag), |s| self.holds(bk.handles[s], key)).map(|s| (s, bk.handles[s]))
    }

    /// Finds `key` in its primary bucket, then in its alternate one (read only if the primary has overflowed).
    #[inline(always)]
    fn find(&self, key: &K, p: Place) -> Option<(u32, usize, Handle)> {
        if let Some((s, h)) = self.find_in(p.b1, p.tag, key) {
            return Some((p.b1, s, h));
        }
        if self.bucket(p.b1).overflow == 0 {
            return None;
        }
        self.find_in(p.b2, p.tag, key).map(|(s, h)| (p.b2, s, h))
    }

    /// The handle of `key`'s entry, in either layout.
    #[inline(always)]
    fn find_handle(&self, key: &K, hash: u64) -> Option<Handle> {
        if self.homes != 0 {
            self.inline_find(key, hash)
        } else {
            self.find(key, place(hash, self.mask)).map(|(_, _, h)| h)
        }
    }

    /// Latency-optimised single-key lookup: the primary bucket, then the key's entry; the alternate bucket only
    /// when the primary one has overflowed (inline layout: the home entry, then the next ones if it has
    /// overflowed).
    #[inline]
    pub fn lookup(&self, key: &K, hash: u64) -> Option<Handle> {
        let r = self.find_handle(key, hash);
        self.lookups.set(self.lookups.get() + 1);
        self.hits.set(self.hits.get() + u64::from(r.is_some()));
        r
    }

    /// The three phases of a bulk lookup over `n <= BULK_LOOKUP_MAX` keys: (1) primary bucket index and prefetch
    /// for every key; (2) SIMD tag compare, prefetch of the first candidate entry line, and prefetch of the alternate
    /// bucket for keys whose primary bucket has overflowed; (3) key verification (alternate bucket last). Fills
    /// `out` (hit: handle, miss: INVALID_HANDLE) and returns the hit mask. With `PREFETCH_FREE`, each miss also
    /// prefetches the slab entry the next insertion will take, so add-on-miss writes hit the cache. Callers pass
    /// one chunk of a batch (equal lengths, at most `BULK_LOOKUP_MAX`).
    #[inline(always)]
    fn probe<const PREFETCH_FREE: bool>(&self, keys: &[K], hashes: &[u64], out: &mut [Handle]) -> u64 {
        debug_assert!(keys.len() <= BULK_LOOKUP_MAX && hashes.len() == keys.len() && out.len() >= keys.len());
        if self.homes != 0 {
            return self.probe_inline(keys, hashes, out);
        }
        let n = keys.len().min(hashes.len()).min(out.len()).min(BULK_LOOKUP_MAX);
        // Pass 1 takes each key's primary bucket once, checked (free right after the mask); the later passes reuse
        // the reference. Indexing again there (with a second mask or check) cost batch-32 lookups 3-4% at 4M entries
        // (`scripts/table_ab.sh`, against 57bd9ab).
        let mut k1s = [self.bucket(0); BULK_LOOKUP_MAX];
        let mut cand = [0u32; BULK_LOOKUP_MAX];
        let mut need_b2 = 0u64;
        for i in 0..n {
            let k1 = self.bucket(primary(hashes[i], self.mask));
            prefetch(k1);
            k1s[i] = k1;
        }
        for i in 0..n {
            let tag = cuckoo::tag(hashes[i]);
            let k1 = k1s[i];
            let m = match_tags(&k1.tags, tag);
            cand[i] = m;
            if m != 0 {
                let p = self.slab.entry_ptr(k1.handles[m.trailing_zeros() as usize]);
                prefetch(p);
                // A two-line entry (large aggregated state): fetch both lines in parallel.
                if self.slab.layout.size > 64 {
                    prefetch(p.wrapping_add(64));
                }
            }
            if k1.overflow != 0 {
                need_b2 |= 1 << i;
                prefetch(self.bucket_ptr(place(hashes[i], self.mask).b2));
            }
        }
        let mut hit = 0u64;
        let mut misses = 0usize;
        for i in 0..n {
            out[i] = INVALID_HANDLE;
            let k1 = k1s[i];
            if let Some(s) = find_slot(cand[i], |s| self.holds(k1.handles[s], &keys[i])) {
                out[i] = k1.handles[s];
                hit |= 1 << i;
            }
            if hit & (1 << i) == 0 && need_b2 & (1 << i) != 0 {
                let tag = cuckoo::tag(hashes[i]);
                if let Some((_, h)) = self.find_in(place(hashes[i], self.mask).b2, tag, &keys[i]) {
                    out[i] = h;
                    hit |= 1 << i;
                }
            }
            if PREFETCH_FREE && hit & (1 << i) == 0 {
                if let Some(f) = self.slab.peek_free(misses) {
                    let p = self.slab.entry_ptr(f);
                    prefetch(p);
                    // Insertion writes the whole entry: fetch its remaining lines too.
                    for line in 1..self.slab.layout.size / 64 {
                        prefetch(p.wrapping_add(line * 64));
                    }
                }
                misses += 1;
            }
        }
        self.lookups.set(self.lookups.get() + n as u64);
        self.hits.set(self.hits.get() + u64::from(hit.count_ones()));
        hit
    }

    /// Throughput-optimised lookup of any number of keys, [`BULK_LOOKUP_MAX`] at a time (one prefetching pass per
    /// chunk). `out[i]` receives the handle of key `i` or [`INVALID_HANDLE`]; returns the number of hits.
    ///
    /// # Panics
    /// If `hashes.len() != keys.len()` or `out.len() < keys.len()`: a caller bug, reported rather than skipping keys.
    #[inline]
    pub fn lookup_batch(&self, keys: &[K], hashes: &[u64], out: &mut [Handle]) -> usize {
        check_batch(keys.len(), hashes.len(), out.len());
        // One chunk (the usual batch) without the chunk loop's slicing: 1-2% of batch-32 lookups at 4M entries.
        if keys.len() <= BULK_LOOKUP_MAX {
            return self.probe::<false>(keys, hashes, out).count_ones() as usize;
        }
        let mut hits = 0;
        let mut start = 0;
        while start < keys.len() {
            let end = keys.len().min(start + BULK_LOOKUP_MAX);
            let hit = self.probe::<false>(&keys[start..end], &hashes[start..end], &mut out[start..end]);
            hits += hit.count_ones() as usize;
            start = end;
        }
        hits
    }

    /// Add-on-miss (PNA) over any number of keys, [`BULK_LOOKUP_MAX`] at a time: hits are touched
    /// (`last_seen = now_ns`), misses are inserted with zeroed state that `init(i, state)` then fills (`i` indexes
    /// `keys`). `out[i]` receives key `i`'s handle, or [`INVALID_HANDLE`] if it could not be inserted. A key
    /// repeated in the batch is inserted once and counted as a hit for its later occurrences. Entries handed out
    /// by this call (hits and inserts) are never evicted by its own later inserts. An entry idle longer than the
    /// table's timeout is reinitialised (zeroed, `init` runs) as if it had expired; use
    /// [`Self::upsert_batch`] to release its old state first.
    ///
    /// # Panics
    /// If `hashes.len() != keys.len()` or `out.len() < keys.len()`: a caller bug, reported rather than skipping keys.
    pub fn lookup_or_insert_batch(
        &mut self,
        keys: &[K],
        hashes: &[u64],
        now_ns: u64,
        out: &mut [Handle],
        mut init: impl FnMut(usize, &mut [u8]),
    ) -> BatchResult {
        self.upsert_batch(keys, hashes, now_ns, out, |i, u| {
            if let Upsert::New(s) = u {
                init(i, s)
            }
        })
    }

    /// [`Self::lookup_or_insert_batch`] with the idle check on lookup made visible: key `i` seen at
    /// `now.at(i)` finds its entry idle longer than the timeout → `f(i, Upsert::Expired(old))`, then the entry
    /// is zeroed and `f(i, Upsert::New(state))` runs as for an inserted key (counted as an expiry). Keys are
    /// handled in order for the callbacks that create state (new and expired-then-new), so state a callback hands
    /// out (e.g. NAT ports) does not depend on which keys were hits.
    ///
    /// # Panics
    /// If `hashes.len() != keys.len()` or `out.len() < keys.len()`: a caller bug, reported rather than skipping keys.
    pub fn upsert_batch<T: Stamps>(
        &mut self,
        keys: &[K],
        hashes: &[u64],
        now: T,
        out: &mut [Handle],
        mut f: impl FnMut(usize, Upsert<'_, K>),
    ) -> BatchResult {
        check_batch(keys.len(), hashes.len(), out.len());
        let mut res = BatchResult::default();
        let mut start = 0;
        // Only eviction reads it (see `Protected::contains`).
        let floor = if self.policy == FullPolicy::EvictLruIdle { now.floor(keys.len()) } else { 0 };
        while start < keys.len() {
            let end = keys.len().min(start + BULK_LOOKUP_MAX);
            let (done, chunk) = out[..end].split_at_mut(start);
            let times = now.skip(start);
            res += self.upsert_chunk(&keys[start..end], &hashes[start..end], times, (done, floor), chunk, |i, u| {
                f(start + i, u)
            });
            start = end;
        }
        res
    }

    /// Whether entries can go idle at all. Without a timeout a touch need not read the old time (measured: that
    /// read and its branch cost single-key add-on-miss 13-18%, `table_ab` batch 1 mixed rows against 57bd9ab).
    #[inline(always)]
    fn timed(&self) -> bool {
        self.idle_limit != u64::MAX
    }

    /// True if an entry last seen at `seen` is idle longer than the timeout at `now` (never for a clock that
    /// went backwards).
    #[inline(always)]
    fn is_idle(&self, seen: u64, now: u64) -> bool {
        // A clock that went backwards saturates to 0: not idle.
        now.saturating_sub(seen) > self.idle_limit
    }

    /// True if live entry `h`, seen at `now_ns`, would be renewed as idle by a lookup (for callers that found
    /// the entry themselves and want to touch it instead of looking it up again).
    pub fn idle_at(&self, h: Handle, now_ns: u64) -> bool {
        self.slab.is_live(h) && self.is_idle(self.slab.last_seen(h), now_ns)
    }

    /// Sets live entry `h`'s last-seen time to `now`, or renews it (see [`Self::renew`]) if it was idle past the
    /// timeout; true if renewed.
    #[inline(always)]
    fn touch_or_renew(&mut self, h: Handle, now: u64, f: impl FnMut(Upsert<'_, K>)) -> bool {
        if self.timed() && self.is_idle(self.slab.last_seen(h), now) {
            self.renew(h, now, f);
            true
        } else {
            self.slab.set_last_seen(h, now);
            false
        }
    }

    /// Expires entry `h` in place on lookup: `f` sees the old state, then the zeroed state to fill.
    #[inline(never)]
    fn renew(&mut self, h: Handle, now: u64, mut f: impl FnMut(Upsert<'_, K>)) {
        f(Upsert::Expired(self.slab.state(h)));
        let s = self.slab.state_mut(h);
        s.fill(0);
        f(Upsert::New(s));
        self.slab.set_last_seen(h, now);
        // An expiry and a new entry in its place: the counters still add up (live + expiries + ... = inserts).
        self.stats.expiries += 1;
        self.stats.inserts += 1;
    }

    /// [`Self::lookup_or_insert_batch`] for one chunk of at most `BULK_LOOKUP_MAX` keys; `done` holds the handles
    /// already handed out by earlier chunks of the same call (protected from eviction, like this chunk's).
    #[inline(always)]
    fn upsert_chunk<T: Stamps>(
        &mut self,
        keys: &[K],
        hashes: &[u64],
        now: T,
        (done, floor): (&[Handle], u64),
        out: &mut [Handle],
        mut f: impl FnMut(usize, Upsert<'_, K>),
    ) -> BatchResult {
        let n = keys.len().min(hashes.len()).min(out.len()).min(BULK_LOOKUP_MAX);
        let mut hit = self.probe::<true>(keys, hashes, out);
        // Hits idle past the timeout are renewed in key order with the misses (below), not here.
        let mut stale = 0u64;
        let mut m = hit;
        let timed = self.timed();
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            let t = now.at(i);
            if timed && self.is_idle(self.slab.last_seen(out[i]), t) {
                stale |= 1 << i;
            } else {
                self.slab.set_last_seen(out[i], t);
            }
        }
        hit &= !stale;
        let all = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        let mut inserted = 0u64;
        let mut failed = 0u64;
        let mut miss = all & !hit;
        while miss != 0 {
            let i = miss.trailing_zeros() as usize;
            miss &= miss - 1;
            let t = now.at(i);
            if stale & (1 << i) != 0 {
                // An earlier key of the chunk may have renewed (or touched) the same entry.
                if self.touch_or_renew(out[i], t, |u| f(i, u)) {
                    inserted |= 1 << i;
                } else {
                    hit |= 1 << i;
                }
                continue;
            }
            let (key, hash) = (&keys[i], hashes[i]);
            // Only an earlier insert of this chunk can have added the key since the probe.
            if inserted != 0 {
                if let Some(h) = self.find_handle(key, hash) {
                    out[i] = h;
                    // A batch can span more than the timeout of packet time.
                    if self.touch_or_renew(h, t, |u| f(i, u)) {
                        inserted |= 1 << i;
                    } else {
                        hit |= 1 << i;
                    }
                    continue;
                }
            }
            let (chunk, mask) = (&out[..n], hit | inserted | stale);
            let evicted = |k: &K, s: &[u8]| f(i, Upsert::Evicted(k, s));
            match self.insert_new(key, hash, t, || Protected { done, chunk, mask, stale, floor }, evicted) {
                Ok(h) => {
                    out[i] = h;
                    inserted |= 1 << i;
                    f(i, Upsert::New(self.slab.state_mut(h)));
                }
                Err(_) => failed |= 1 << i,
            }
        }
        BatchResult {
            hit: hit.count_ones() as usize,
            inserted: inserted.count_ones() as usize,
            failed: failed.count_ones() as usize,
        }
    }

    /// Single-key add-on-miss: returns (handle, true) after inserting a new entry whose zeroed state `init` fills,
    /// or (handle, false) for an existing one (touched). `Err(Full)` when the table is full under `Reject`.
    ///
    /// An entry idle longer than the timeout is reinitialised (zeroed, `init` runs, `true` returned); use
    /// [`Self::upsert`] to release its old state first.
    pub fn insert(
        &mut self,
        key: &K,
        hash: u64,
        now_ns: u64,
        init: impl FnOnce(&mut [u8]),
    ) -> Result<(Handle, bool), TableError> {
        let mut init = Some(init);
        self.upsert(key, hash, now_ns, |u| {
            if let Upsert::New(s) = u {
                if let Some(init) = init.take() {
                    init(s)
                }
            }
        })
    }

    /// Single-key [`Self::upsert_batch`]: `(handle, true)` when `f` created state (a new entry, or an idle one
    /// renewed after `f(Upsert::Expired(old))`), `(handle, false)` for a live entry (touched).
    pub fn upsert(
        &mut self,
        key: &K,
        hash: u64,
        now_ns: u64,
        mut f: impl FnMut(Upsert<'_, K>),
    ) -> Result<(Handle, bool), TableError> {
        self.lookups.set(self.lookups.get() + 1);
        if let Some(h) = self.find_handle(key, hash) {
            self.hits.set(self.hits.get() + 1);
            return Ok((h, self.touch_or_renew(h, now_ns, f)));
        }
        let h = self.insert_new(key, hash, now_ns, || Protected::NONE, |k, s| f(Upsert::Evicted(k, s)))?;
        f(Upsert::New(self.slab.state_mut(h)));
        Ok((h, true))
    }

    /// Inserts a key known to be absent: into a free slot of its buckets, else one freed by a displacement path,
    /// else (table full) per the full policy, where `protect()` names the handles that must not be evicted (built
    /// only then) and `evicted(key, state)` sees the flow evicted, if any, before its entry is reused.
    #[inline]
    fn insert_new<'p>(
        &mut self,
        key: &K,
        hash: u64,
        now: u64,
        protect: impl FnOnce() -> Protected<'p>,
        evicted: impl FnOnce(&K, &[u8]),
    ) -> Result<Handle, TableError> {
        if self.homes != 0 {
            return self.inline_insert(key, hash, now, protect, evicted);
        }
        let p = place(hash, self.mask);
        if self.slab.len() < self.max_len as usize {
            let slot = self.free_in(p);
            let slot = slot.or_else(|| self.make_room(p.b1, p.b2));
            if let Some((b, s)) = slot {
                let Some(h) = self.slab.alloc(key, hash, now) else {
                    return Err(TableError::Full); // unreachable: len < capacity checked above
                };
                self.place(b, s, p.tag, h, p.b1);
                self.stats.inserts += 1;
                return Ok(h);
            }
        }
        self.insert_full(key, hash, p, now, protect(), evicted)
    }

    /// The full-table path of [`Self::insert_new`]: evict (`EvictLruIdle`) or count a full event.
    fn insert_full(
        &mut self,
        key: &K,
        hash: u64,
        p: Place,
        now: u64,
        protect: Protected<'_>,
        evicted: impl FnOnce(&K, &[u8]),
    ) -> Result<Handle, TableError> {
        if self.policy == FullPolicy::EvictLruIdle {
            if let Some((b, s, victim)) = self.lru_victim(p.b1, p.b2, protect) {
                // The victim's key and state, before they are overwritten (its flow's last record, a release).
                if let Some(k) = self.slab.key(victim).copied() {
                    evicted(&k, self.slab.state(victim));
                }
                self.slab.write_entry(victim, key, hash, now);
                self.clear_slot(b, s);
                self.place(b, s, p.tag, victim, p.b1);
                self.stats.evictions += 1;
                self.stats.inserts += 1;
                return Ok(victim);
            }
            // The key's buckets have a free slot, or hold only entries this call handed out, while the slab is full
            // with flows linked elsewhere: evict one of those instead of refusing (a new flow was refused now and
            // then under `evict` when its two buckets happened to be near empty).
            let free = self.free_in(p);
            if let Some((b, s)) = free {
                if let Some(victim) = self.far_victim(protect) {
                    if let Some(k) = self.slab.key(victim).copied() {
                        evicted(&k, self.slab.state(victim));
                    }
                    self.unlink(victim);
                    if let Some(h) = self.slab.alloc(key, hash, now) {
                        self.place(b, s, p.tag, h, p.b1);
                        self.stats.evictions += 1;
                        self.stats.inserts += 1;
                        return Ok(h);
                    }
                }
            }
        }
        self.stats.full_events += 1;
        Err(TableError::Full)
    }

    /// Stores (tag, h) in empty slot `s` of bucket `b`, for a key whose primary bucket is `b1`.
    #[inline]
    fn place(&mut self, b: u32, s: usize, tag: u16, h: Handle, b1: u32) {
        let bk = self.bucket_mut(b);
        bk.tags[s] = tag;
        bk.handles[s] = h;
        if b != b1 {
            bk.alt_bits |= 1 << s;
            self.bucket_mut(b1).overflow += 1;
        }
    }

    /// Empties slot `s` of bucket `b`, keeping the overflow count of the entry's primary bucket exact.
    #[inline]
    fn clear_slot(&mut self, b: u32, s: usize) {
        let mask = self.mask;
        let bk = self.bucket_mut(b);
        let tag = bk.tags[s];
        bk.tags[s] = 0;
        if bk.alt_bits & (1 << s) != 0 {
            bk.alt_bits &= !(1 << s);
            let p = self.bucket_mut(alt(b, tag, mask));
            p.overflow = p.overflow.saturating_sub(1);
        }
    }

    /// An empty slot of the key's primary bucket, else of its alternate.
    #[inline(always)]
    fn free_in(&self, p: Place) -> Option<(u32, usize)> {
        self.free_slot(p.b1).map(|s| (p.b1, s)).or_else(|| self.free_slot(p.b2).map(|s| (p.b2, s)))
    }

    #[inline(always)]
    fn free_slot(&self, b: u32) -> Option<usize> {
        cuckoo::free_slot(&self.bucket(b).tags)
    }

    /// Least-recently-seen occupied slot of b1/b2 whose handle is not protected.
    fn lru_victim(&self, b1: u32, b2: u32, protect: Protected<'_>) -> Option<(u32, usize, Handle)> {
        // The candidates' last-seen times are up to 16 random slab lines; their loads are independent, so the
        // core overlaps the misses without a separate prefetch pass (measured: the pass cost more than it saved).
        // Protection is checked lazily, oldest candidate first: a protected handle was touched by this very call,
        // so it is among the newest and the oldest candidate is almost never one. Checking every candidate against
        // every handle of the call cost 16 scans of up to a batch of handles per eviction (issue 33: evict 10x reject).
        let (bk1, bk2) = (self.bucket(b1), self.bucket(b2));
        // Empty slots (and candidates found protected) read as u64::MAX; a live entry's time is capped below it.
        let mut seen = [u64::MAX; 2 * SLOTS];
        for (half, bk) in seen.chunks_exact_mut(SLOTS).zip([bk1, bk2]) {
            for ((seen, &tag), &h) in half.iter_mut().zip(&bk.tags).zip(&bk.handles) {
                if tag != 0 {
                    *seen = self.slab.last_seen(h).min(u64::MAX - 1);
                }
            }
        }
        loop {
            let mut k = 0;
            for j in 1..2 * SLOTS {
                if seen[j] < seen[k] {
                    k = j;
                }
            }
            if seen[k] == u64::MAX {
                return None;
            }
            let (b, bk, s) = if k < SLOTS { (b1, bk1, k) } else { (b2, bk2, k - SLOTS) };
            let h = bk.handles[s];
            if !protect.contains(h, seen[k]) {
                return Some((b, s, h));
            }
            seen[k] = u64::MAX;
        }
    }

    /// The least recently seen of the next 8 unprotected live entries from a cursor that walks the slab (at most 64
    /// examined): the victim for a key whose own buckets offer none.
    pub(crate) fn far_victim(&mut self, protect: Protected<'_>) -> Option<Handle> {
        let cap = self.slab.capacity();
        let mut at = self.evict_cursor;
        let mut best: Option<(u64, Handle)> = None;
        let mut found = 0;
        for _ in 0..64 {
            let Some(h) = self.slab.next_live(at, cap).or_else(|| self.slab.next_live(0, cap)) else { break };
            at = if h + 1 >= cap { 0 } else { h + 1 };
            let seen = self.slab.last_seen(h);
            if !protect.contains(h, seen) {
                if best.is_none_or(|(t, _)| seen < t) {
                    best = Some((seen, h));
                }
                found += 1;
                if found == 8 {
                    break;
                }
            }
        }
        self.evict_cursor = at;
        best.map(|(_, h)| h)
    }

    /// Frees a slot in full b1/b2 by moving entries along a displacement path (`cuckoo::PathSearch`), far end
    /// first; returns the freed (bucket, slot) in b1 or b2. Handles never change.
    fn make_room(&mut self, b1: u32, b2: u32) -> Option<(u32, usize)> {
        let mut search = PathSearch::<MAX_BFS_NODES>::new();
        if search.run(b1, b2, self.mask, |b| self.bucket(b).tags) != Search::Found {
            return None;
        }
        let mut vacated: Option<(u32, usize)> = None;
        for (from, s, to) in search.moves() {
            // The far end's bucket has a free slot; every later move fills the slot its predecessor vacated.
            let ts = match vacated {
                Some((_, vs)) => vs,
                None => self.free_slot(to)?,
            };
            self.move_entry(from, s, to, ts);
            vacated = Some((from, s));
        }
        vacated
    }

    /// Moves the entry in `from[fs]` to its other bucket `to[ts]` (an empty slot), updating overflow bookkeeping.
    #[inline]
    fn move_entry(&mut self, from: u32, fs: usize, to: u32, ts: usize) {
        let (t, h, was_alt) = {
            let f = self.bucket_mut(from);
            let v = (f.tags[fs], f.handles[fs], f.alt_bits & (1 << fs) != 0);
            f.tags[fs] = 0;
            f.alt_bits &= !(1 << fs);
            v
        };
        let d = self.bucket_mut(to);
        d.tags[ts] = t;
        d.handles[ts] = h;
        if was_alt {
            // Back home: `to` is its primary bucket.
            d.overflow = d.overflow.saturating_sub(1);
        } else {
            d.alt_bits |= 1 << ts;
            self.bucket_mut(from).overflow += 1;
        }
    }

    /// Removes `key`; false if absent.
    pub fn remove(&mut self, key: &K, hash: u64) -> bool {
        if self.homes != 0 {
            let Some(h) = self.inline_find(key, hash) else { return false };
            self.inline_unlink(h);
            self.stats.removes += 1;
            return true;
        }
        match self.find(key, place(hash, self.mask)) {
            Some((b, s, h)) => {
                self.clear_slot(b, s);
                self.slab.free(h);
                self.stats.removes += 1;
                true
            }
            None => false,
        }
    }

    /// Removes the entry behind handle `h` (e.g. on TCP FIN/RST); false if `h` is not a live entry.
    pub fn remove_handle(&mut self, h: Handle) -> bool {
        if self.unlink(h) {
            self.stats.removes += 1;
            true
        } else {
            false
        }
    }

    /// Clears the bucket slot of live entry `h` and frees it.
    pub(crate) fn unlink(&mut self, h: Handle) -> bool {
        if self.homes != 0 {
            return self.inline_unlink(h);
        }
        if !self.slab.is_live(h) {
            return false;
        }
        let p = place(self.slab.hash(h), self.mask);
        for b in [p.b1, p.b2] {
            let bk = self.bucket(b);
            if let Some(s) = find_slot(match_tags(&bk.tags, p.tag), |s| bk.handles[s] == h) {
                self.clear_slot(b, s);
                self.slab.free(h);
                return true;
            }
        }
        // A live entry is always linked from one of its buckets; reaching here means a broken invariant.
        debug_assert!(false, "live entry {h} not linked");
        false
    }

    /// State bytes of entry `h` (length [`Self::state_len`]); empty for an out-of-range handle. A free entry's bytes
    /// are stale but harmless.
    #[inline(always)]
    pub fn state(&self, h: Handle) -> &[u8] {
        if h < self.slab.capacity() {
            self.slab.state(h)
        } else {
            &[]
        }
    }

    /// Mutable state of entry `h` (in-place update, PNA's writable action parameters); empty if out of range.
    #[inline(always)]
    pub fn state_mut(&mut self, h: Handle) -> &mut [u8] {
        if h < self.slab.capacity() {
            self.slab.state_mut(h)
        } else {
            &mut []
        }
    }

    /// Typed view of `size_of::<T>()` state bytes at `offset` (states start 16-byte aligned inside 64-aligned
    /// entries). `None` if out of range or misaligned.
    #[inline]
    pub fn state_as<T: bytemuck::Pod>(&self, h: Handle, offset: usize) -> Option<&T> {
        let s = self.state(h);
        bytemuck::try_from_bytes(s.get(offset..offset.checked_add(core::mem::size_of::<T>())?)?).ok()
    }

    /// Mutable typed view, as [`Self::state_as`].
    #[inline]
    pub fn state_as_mut<T: bytemuck::Pod>(&mut self, h: Handle, offset: usize) -> Option<&mut T> {
        let s = self.state_mut(h);
        let end = offset.checked_add(core::mem::size_of::<T>())?;
        bytemuck::try_from_bytes_mut(s.get_mut(offset..end)?).ok()
    }

    /// Key of live entry `h`.
    #[inline]
    pub fn key(&self, h: Handle) -> Option<&K> {
        self.slab.key(h)
    }

    /// Last-seen time of live entry `h`.
    pub fn last_seen(&self, h: Handle) -> Option<u64> {
        self.slab.is_live(h).then(|| self.slab.last_seen(h))
    }

    /// Marks live entry `h` as seen at `now_ns`.
    #[inline]
    pub fn touch(&mut self, h: Handle, now_ns: u64) {
        if self.slab.is_live(h) {
            self.slab.set_last_seen(h, now_ns);
        }
    }

    /// Prefetches the first line of `h`'s state (FAJITA ②: the hardware prefetcher brings the rest).
    #[inline(always)]
    pub fn prefetch_state(&self, h: Handle) {
        if h < self.slab.capacity() {
            prefetch(self.slab.entry_ptr(h).wrapping_add(self.slab.layout.state_off));
        }
    }

    /// Live entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.slab.len()
    }

    /// True when no entry is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Maximum number of entries.
    pub fn capacity(&self) -> usize {
        self.max_len as usize
    }

    /// Bytes of state per entry (>= the configured `state_size`).
    pub fn state_len(&self) -> usize {
        self.slab.layout.state_len
    }

    /// Bucket slots (8 per bucket); `len() / slots()` is the cuckoo load factor. Inline layout: the home
    /// positions.
    pub fn slots(&self) -> usize {
        if self.homes != 0 {
            return self.homes as usize;
        }
        (self.mask as usize + 1) * SLOTS
    }

    /// Whether buckets and slab got explicit 2 MiB hugepages.
    pub fn hugepages(&self) -> bool {
        (self.homes != 0 || self.buckets.is_huge()) && self.slab.is_huge()
    }

    /// Backs all of the table's memory now (no page fault later) and asks for transparent hugepages to be assembled
    /// now rather than by khugepaged later: for measurements that must not depend on when the kernel got to it.
    /// Costs the whole footprint in resident memory. Best effort; see [`Self::memory_spans`] to check the result.
    pub fn prefault(&mut self) {
        self.buckets.prefault();
        self.slab.mem_mut().prefault();
    }

    /// Start address and length of the table's two memory regions (buckets, slab), to find them in
    /// /proc/self/smaps (page-backing diagnostics).
    pub fn memory_spans(&self) -> [(usize, usize); 2] {
        [self.buckets.span(), self.slab.mem().span()]
    }

    /// Counters since creation.
    pub fn stats(&self) -> TableStats {
        TableStats { lookups: self.lookups.get(), hits: self.hits.get(), ..self.stats }
    }

    /// The two candidate buckets of `hash` (primary, alternate): for tests and diagnostics (a collision
    /// flood is keys sharing both).
    /// Inline layout: the home position, twice (a collision flood is keys sharing it).
    pub fn candidate_buckets(&self, hash: u64) -> (usize, usize) {
        if self.homes != 0 {
            let h = self.home(hash) as usize;
            return (h, h);
        }
        let p = place(hash, self.mask);
        (p.b1 as usize, p.b2 as usize)
    }

    /// Number of buckets (a power of two); inline layout: home positions.
    pub fn bucket_count(&self) -> usize {
        if self.homes != 0 {
            return self.homes as usize;
        }
        self.mask as usize + 1
    }

    /// Keys sharing every candidate position of one key that the table still holds (what a hash-collision
    /// flood gets in before `table_full`): both buckets' slots, or the inline window.
    pub fn collision_room(&self) -> usize {
        if self.homes != 0 {
            crate::inline::WINDOW as usize
        } else {
            2 * SLOTS
        }
    }

    /// Live entries as (handle, key, state), in handle order (for exporting NF state).
    pub fn iter(&self) -> Iter<'_, K> {
        Iter { table: self, next: 0 }
    }

    /// Live entries from slab position `from` on (a resumable walk: the
    /// next position is the last handle returned plus one).
    pub fn iter_from(&self, from: Handle) -> Iter<'_, K> {
        Iter { table: self, next: from }
    }
}

/// Iterator over live entries, see [`FlowTable::iter`].
pub struct Iter<'a, K: FlowKey> {
    table: &'a FlowTable<K>,
    next: u32,
}

impl<'a, K: FlowKey> Iterator for Iter<'a, K> {
    type Item = (Handle, &'a K, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let slab = &self.table.slab;
        let h = slab.next_live(self.next, u32::MAX)?;
        self.next = h + 1;
        // SAFETY: next_live returns live entries only.
        Some((h, unsafe { slab.key_unchecked(h) }, slab.state(h)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(x: u64) -> u64 {
        let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Under `EvictLruIdle` a full slab never refuses a key whose own buckets are empty: a flow linked elsewhere
    /// is evicted (the regression: `cli_ipfix`'s eviction test saw a table-full event in about one run of eight).
    #[test]
    fn evict_finds_a_victim_when_the_new_keys_buckets_are_empty() {
        let cfg = TableConfig {
            capacity: 64,
            state_size: 8,
            idle_timeout_ns: None,
            full_policy: FullPolicy::EvictLruIdle,
            hugepages: false,
            layout: Layout::Bucketed,
        };
        let mut t = FlowTable::<u64>::new(cfg).unwrap();
        // 64 flows none of which may live in the new key's two buckets.
        let k = 1_000_000u64;
        let p = place(mix(k), t.mask);
        let away = |j: &u64| {
            let q = place(mix(*j), t.mask);
            ![q.b1, q.b2].iter().any(|b| *b == p.b1 || *b == p.b2)
        };
        let keys: Vec<u64> = (0u64..).filter(away).take(64).collect();
        for (i, j) in keys.iter().enumerate() {
            t.insert(j, mix(*j), i as u64, |_| {}).unwrap();
        }
        let mut gone = Vec::new();
        let (h, new) = t
            .upsert(&k, mix(k), 100, |u| {
                if let Upsert::Evicted(old, _) = u {
                    gone.push(*old);
                }
            })
            .expect("evicted, not refused");
        assert!(new);
        assert_eq!(t.key(h), Some(&k));
        assert_eq!(gone.len(), 1, "one flow evicted and handed to the callback");
        assert!(t.lookup(&gone[0], mix(gone[0])).is_none());
        assert_eq!((t.len(), t.stats().evictions, t.stats().full_events), (64, 1, 0));
        for j in keys.iter().copied().filter(|j| *j != gone[0]) {
            assert!(t.lookup(&j, mix(j)).is_some(), "key {j} kept");
        }
    }

    /// The footprint a memory budget checks is what the table maps (buckets and slab), plus its index vectors.
    #[test]
    fn footprint_covers_what_new_maps() {
        for (cap, state) in [(1usize, 1usize), (1000, 24), (1 << 14, 100), (100_000, 200)] {
            let t = FlowTable::<u64>::new(TableConfig::new(cap, state)).expect("table");
            let mapped: usize = t.memory_spans().iter().map(|s| s.1).sum();
            let f = FlowTable::<u64>::footprint(cap, state).expect("footprint") as usize;
            assert!(f >= mapped && f <= mapped + cap * 5 + 64, "cap {cap} state {state}: {f} vs {mapped} mapped");
        }
    }

    /// Fills exactly-sized bucket arrays (slab as large as the slots) until the first failure.
    /// Issue 29: `capacity` is what the table holds — exactly `capacity`
    /// distinct keys, the next one refused (`table_full`) — at every size,
    /// the smallest included (a store once floored them at 64 and reported
    /// the floor's neighbour's figure).
    #[test]
    fn a_table_holds_exactly_its_capacity() {
        let sizes: Vec<usize> =
            if cfg!(miri) { vec![1, 7, 64] } else { (1..=80).chain([1000, 4096, 65_536]).collect() };
        for cap in sizes {
            let mut t = FlowTable::<u64>::new(TableConfig::new(cap, 8)).unwrap();
            let mut n = 0u64;
            while t.insert(&n, mix(n), 0, |_| {}).is_ok() {
                n += 1;
            }
            assert_eq!((n as usize, t.len(), t.capacity()), (cap, cap, cap), "capacity {cap}");
            assert_eq!(t.stats().full_events, 1, "capacity {cap}: the refused insert counted once");
        }
    }

    #[test]
    fn cuckoo_reaches_90_percent_load() {
        // Miri interprets every instruction: small tables only (the bookkeeping is the same at any size).
        let sizes: &[usize] = if cfg!(miri) { &[1, 2, 16, 64] } else { &[1, 2, 16, 1024, 1 << 14] };
        for &nb in sizes {
            let slots = nb * SLOTS;
            let mut t = FlowTable::<u64>::with_buckets(TableConfig::new(slots, 8), nb).unwrap();
            let mut n = 0u64;
            while t.insert(&n, mix(n), 0, |_| {}).is_ok() {
                n += 1;
            }
            let load = t.len() as f64 / slots as f64;
            println!("{nb} buckets: first insert failure at load {load:.3}");
            assert_eq!(t.stats().full_events, 1);
            assert!(load >= 0.9, "nb {nb}: first failure at load {load}");
            for k in 0..n {
                assert!(t.lookup(&k, mix(k)).is_some(), "key {k} lost by displacement");
            }
        }
    }

    /// Every bucket's overflow count equals the number of entries elsewhere that call it primary, and every live
    /// entry is linked once, from its primary bucket or (alt bit set) from its alternate.
    fn check_invariants<K: FlowKey>(t: &FlowTable<K>) {
        let nb = t.mask + 1;
        let mut want = vec![0u32; nb as usize];
        let mut linked = 0;
        for b in 0..nb {
            let bk = t.bucket(b);
            for s in 0..SLOTS {
                if bk.tags[s] == 0 {
                    continue;
                }
                linked += 1;
                let h = bk.handles[s];
                let hash = t.slab.hash(h);
                assert_eq!(cuckoo::tag(hash), bk.tags[s]);
                let p = primary(hash, t.mask);
                if bk.alt_bits & (1 << s) != 0 {
                    assert_eq!(alt(p, bk.tags[s], t.mask), b);
                    want[p as usize] += 1;
                } else {
                    assert_eq!(p, b);
                }
            }
        }
        assert_eq!(linked, t.len());
        for b in 0..nb {
            assert_eq!(t.bucket(b).overflow, want[b as usize], "bucket {b}");
        }
    }

    #[test]
    fn overflow_bookkeeping_survives_fill_and_removal() {
        let nb = if cfg!(miri) { 32 } else { 256 };
        let mut t = FlowTable::<u64>::with_buckets(TableConfig::new(nb * SLOTS, 8), nb).unwrap();
        let mut n = 0u64;
        while t.insert(&n, mix(n), 0, |_| {}).is_ok() {
            n += 1;
        }
        check_invariants(&t);
        for k in (0..n).step_by(3) {
            assert!(t.remove(&k, mix(k)));
        }
        for k in (1..n).step_by(3) {
            let h = t.lookup(&k, mix(k)).unwrap();
            assert!(t.remove_handle(h));
        }
        check_invariants(&t);
        for k in n..n + n / 2 {
            let _ = t.insert(&k, mix(k), 0, |_| {});
        }
        check_invariants(&t);
    }

    #[test]
    // Huge-page mmap and madvise are syscalls Miri cannot run.
    #[cfg_attr(miri, ignore)]
    fn prefault_keeps_contents_and_spans_are_disjoint() {
        for hugepages in [false, true] {
            let cfg = TableConfig { hugepages, ..TableConfig::new(10_000, 24) };
            let mut t = FlowTable::<u64>::new(cfg).unwrap();
            for k in 0..5_000u64 {
                let (h, _) = t.insert(&k, mix(k), 0, |_| {}).unwrap();
                t.state_mut(h)[..8].copy_from_slice(&k.to_le_bytes());
            }
            t.prefault();
            for k in 0..5_000u64 {
                let h = t.lookup(&k, mix(k)).unwrap();
                assert_eq!(t.state(h)[..8], k.to_le_bytes());
            }
            let [(b, bl), (s, sl)] = t.memory_spans();
            assert!(bl >= t.slots() / SLOTS * 64 && sl >= 10_000 * 64);
            assert!(b + bl <= s || s + sl <= b, "spans overlap");
            check_invariants(&t);
        }
    }

    #[test]
    fn bucket_layout_is_one_line() {
        assert_eq!(core::mem::align_of::<Bucket>(), 64);
        assert_eq!(core::mem::size_of::<Bucket>(), 64);
    }
}
