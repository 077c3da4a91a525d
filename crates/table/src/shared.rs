//! Shared flow table: one table reached by every core through `&self`, for state
//! with coarse keys (source IP, destination IP) when RSS spreads packets by 5-tuple.
//!
//! This module owns the concurrent bucketized cuckoo table, its entry arena with
//! per-entry reference counts, its free lists and its idle expiry. Placement,
//! bucket search and displacement-path search are the per-core table's
//! (`cuckoo.rs`); this module adds the locking around them. The engine's
//! auxiliary state (flow blocks holding pinned handles) builds on the refcounts.
//!
//! # Layout
//! - **Buckets** are one cache line: a 32-bit version counter, 8 slots of 16-bit
//!   tags (packed in two `AtomicU64`, 0 = empty) and 8 entry indices. A key has
//!   two candidate buckets: `hash & mask` and an alternate derived from the tag
//!   alone (partial-key cuckoo), so displacement never reads the entry.
//! - **Entries** live in an arena of cache-line-aligned blocks (one block never
//!   shares a line with another, so cores updating different entries do not
//!   false-share). A block is `[key0, key1, hash, last_seen, refword, state...]`,
//!   all `AtomicU64`: several cores update state words concurrently (counters with
//!   `fetch_add`, token buckets with CAS).
//!
//! # Concurrency protocol
//! - The bucket version is both a seqlock and the bucket's writer lock: a writer
//!   CASes it from even to odd, modifies slots, then stores odd + 1. Writers lock
//!   at most two buckets, always in index order (no deadlock), never a global
//!   lock, so concurrent inserters on different buckets never wait for each
//!   other and readers never wait for writers of other buckets.
//! - Readers are lock-free: read both candidate buckets' (even) versions, scan
//!   both, then re-check both versions and retry on change. Checking *both*
//!   versions after scanning both buckets means a key moved between them by a
//!   cuckoo displacement cannot be missed; the move itself locks both buckets
//!   and copies the slot before clearing the old one.
//! - The refword of an entry packs `generation (32) | DEAD (1) | count (31)`.
//!   Linking and unlinking happen under the bucket locks; the DEAD bit is set
//!   only while holding them and together with the unlink, so a validated
//!   reader never sees a dead entry as present.
//!
//! # Memory reclamation (why no epochs are needed)
//! The arena is never freed while the table lives, and every word is atomic, so
//! a stale reader is memory-safe whatever it reads. Logical safety:
//! - A lookup reads a slot's entry index and that entry's key inside one
//!   bucket-version window. Unlinking bumps the version before the entry is put
//!   back on a free list, and a new owner writes the key only after popping it,
//!   so a reader that saw a reused entry's new key fails validation.
//! - A handle carries the entry's generation. Freeing bumps the generation
//!   *before* the entry can be popped again, and the new owner issues a release
//!   fence before writing, so [`SharedFlowTable::read_state`] (read, acquire
//!   fence, re-check generation) detects any reuse during its read.
//! - Writes through a handle are only safe while it is *pinned* (refcount > 0,
//!   from [`SharedFlowTable::acquire_batch`] or [`SharedFlowTable::try_acquire`]):
//!   a pinned entry is never freed (removal defers the free to the last release).
//!
//! Version counters wrap after 2^31 writes to one bucket; a reader would have
//! to stall across exactly that many writes to be fooled, which we accept.

use core::fmt;
use core::marker::PhantomData;
use std::net::{Ipv4Addr, Ipv6Addr};

use self::sync::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use crate::cuckoo::{self, check_batch, find_slot, place, PathSearch, Place, Search, BULK_LOOKUP_MAX, SLOTS};
use crate::simd::match_tags;

/// Atomics used by the table: `std`'s normally, `loom`'s under `--cfg loom` so the
/// version-counter protocol can be model-checked.
pub(crate) mod sync {
    #[cfg(loom)]
    pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    #[cfg(not(loom))]
    pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};

    /// Back-off inside a retry loop (a loom yield, so the model can schedule the writer).
    #[inline(always)]
    pub(crate) fn spin() {
        #[cfg(loom)]
        loom::thread::yield_now();
        #[cfg(not(loom))]
        core::hint::spin_loop();
    }
}

/// Largest supported capacity (indices are `u32`, counts 31 bits).
pub const MAX_CAPACITY: usize = 1 << 31;

const W_KEY0: usize = 0;
const W_KEY1: usize = 1;
const W_HASH: usize = 2;
const W_SEEN: usize = 3;
const W_REF: usize = 4;
/// Header words before the state words of an entry.
const HEADER_WORDS: usize = 5;
const LINE_WORDS: usize = 8;

const DEAD: u64 = 1 << 31;
const COUNT: u64 = DEAD - 1;
const NIL: u32 = u32::MAX;
/// Buckets examined by one cuckoo path search (breadth-first, depth ~2-3).
const MAX_BFS_NODES: usize = 64;
/// Lock / search / retry rounds before an insertion is declared failed.
const MAX_LINK_ATTEMPTS: usize = 8;

/// A key that fits the shared table: at most 16 bytes, packed in two words.
///
/// Coarse keys (IPv4/IPv6 addresses, address pairs) all fit. `from_words` must
/// invert `to_words` for every key.
pub trait SharedKey: Copy + Eq {
    /// Packs the key into two words.
    fn to_words(&self) -> [u64; 2];
    /// Unpacks a key packed by [`SharedKey::to_words`].
    fn from_words(words: [u64; 2]) -> Self;
}

impl SharedKey for u32 {
    fn to_words(&self) -> [u64; 2] {
        [u64::from(*self), 0]
    }
    fn from_words(w: [u64; 2]) -> Self {
        w[0] as u32
    }
}

impl SharedKey for u64 {
    fn to_words(&self) -> [u64; 2] {
        [*self, 0]
    }
    fn from_words(w: [u64; 2]) -> Self {
        w[0]
    }
}

impl SharedKey for u128 {
    fn to_words(&self) -> [u64; 2] {
        [*self as u64, (*self >> 64) as u64]
    }
    fn from_words(w: [u64; 2]) -> Self {
        u128::from(w[0]) | (u128::from(w[1]) << 64)
    }
}

impl SharedKey for (u32, u32) {
    fn to_words(&self) -> [u64; 2] {
        [(u64::from(self.0) << 32) | u64::from(self.1), 0]
    }
    fn from_words(w: [u64; 2]) -> Self {
        ((w[0] >> 32) as u32, w[0] as u32)
    }
}

impl SharedKey for Ipv4Addr {
    fn to_words(&self) -> [u64; 2] {
        u32::from(*self).to_words()
    }
    fn from_words(w: [u64; 2]) -> Self {
        Ipv4Addr::from(u32::from_words(w))
    }
}

impl SharedKey for Ipv6Addr {
    fn to_words(&self) -> [u64; 2] {
        u128::from(*self).to_words()
    }
    fn from_words(w: [u64; 2]) -> Self {
        Ipv6Addr::from(u128::from_words(w))
    }
}

/// A cheap, well-mixed 64-bit hash of a shared key (for callers without their own).
#[inline]
pub fn hash_key<K: SharedKey>(key: &K) -> u64 {
    let [a, b] = key.to_words();
    let mut h = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.rotate_left(29).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    h = (h ^ (h >> 32)).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    h ^ (h >> 32)
}

/// Configuration of a [`SharedFlowTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedTableConfig {
    /// Maximum number of entries (the arena is preallocated for all of them).
    pub capacity: usize,
    /// `AtomicU64` state words per entry.
    pub state_words: usize,
    /// Idle time after which an unreferenced entry expires; 0 = no timeout, and then an
    /// entry whose refcount drops to 0 through [`SharedFlowTable::release`] is removed at once.
    pub idle_timeout_ns: u64,
}

/// Why a [`SharedTableConfig`] was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SharedConfigError {
    /// `capacity` is 0 or above [`MAX_CAPACITY`].
    #[error("shared table capacity {0} is out of range 1..={MAX_CAPACITY}")]
    Capacity(usize),
    /// `state_words` is too large (more than 4096 words per entry).
    #[error("shared table state of {0} words is too large (max 4096)")]
    StateWords(usize),
}

/// A reference to an entry: its arena index and the generation it had when found.
///
/// Weak by itself (the entry may be removed and reused later); see the module docs
/// for when its state may be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SharedHandle {
    idx: u32,
    gen: u32,
}

impl SharedHandle {
    /// "No entry" (a miss, or a failed insertion).
    pub const NONE: SharedHandle = SharedHandle { idx: NIL, gen: u32::MAX };

    /// True unless this is [`SharedHandle::NONE`].
    #[inline]
    pub fn is_some(self) -> bool {
        self.idx != NIL
    }

    /// Arena index of the entry.
    #[inline]
    pub fn index(self) -> usize {
        self.idx as usize
    }

    /// Packs the handle in 64 bits (e.g. to store it in another table's state block).
    #[inline]
    pub fn to_bits(self) -> u64 {
        (u64::from(self.gen) << 32) | u64::from(self.idx)
    }

    /// Unpacks [`SharedHandle::to_bits`].
    #[inline]
    pub fn from_bits(bits: u64) -> Self {
        SharedHandle { idx: bits as u32, gen: (bits >> 32) as u32 }
    }
}

/// Counts of one batched call; per-row results are in its `out` slice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedBatchResult {
    /// Rows whose key was present.
    pub hit: usize,
    /// Rows whose key was inserted by this call.
    pub inserted: usize,
    /// Rows that could not be inserted (table full); their handle is [`SharedHandle::NONE`].
    pub failed: usize,
}

/// Result of [`SharedFlowTable::remove`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoveOutcome {
    /// The key was not present.
    NotFound,
    /// Removed and its entry freed.
    Removed,
    /// Removed from lookups, but still pinned: the entry is freed by the last release.
    Deferred,
}

/// Result of [`SharedFlowTable::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The handle was stale or not pinned (nothing changed; a caller bug, never a crash).
    Invalid,
    /// Other references remain.
    Referenced,
    /// No reference remains; the entry stays until idle expiry (or explicit removal).
    Unreferenced,
    /// No reference remained and the entry was freed (no timeout configured, or it had been removed).
    Removed,
}

#[repr(C, align(64))]
struct Bucket {
    /// Seqlock and writer lock: odd while a writer holds the bucket.
    version: AtomicU32,
    /// Four 16-bit tags per word (slot i in word i / 4, bits 16 * (i % 4)); tag 0 marks an empty slot.
    tags: [AtomicU64; 2],
    /// Arena index of the entry in each occupied slot.
    entries: [AtomicU32; SLOTS],
}

impl Bucket {
    fn new() -> Self {
        Bucket {
            version: AtomicU32::new(0),
            tags: [AtomicU64::new(0), AtomicU64::new(0)],
            entries: core::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// The 8 tags (unsynchronised: callers validate with the version, or hold the lock).
    #[inline(always)]
    fn tags(&self) -> [u16; SLOTS] {
        unpack_tags([self.tags[0].load(Relaxed), self.tags[1].load(Relaxed)])
    }

    /// Bitmask of slots whose tag equals `tag` (tag 0: the empty slots).
    #[inline(always)]
    fn match_tag(&self, tag: u16) -> u32 {
        match_tags(&self.tags(), tag)
    }

    #[inline(always)]
    fn tag_at(&self, s: usize) -> u16 {
        (self.tags[s / 4].load(Relaxed) >> ((s % 4) * 16)) as u16
    }

    /// Only under the bucket lock (single writer: load + store is enough).
    #[inline(always)]
    fn set_tag(&self, s: usize, tag: u16) {
        let w = &self.tags[s / 4];
        let sh = (s % 4) * 16;
        let v = w.load(Relaxed);
        w.store((v & !(0xFFFF << sh)) | (u64::from(tag) << sh), Relaxed);
    }
}

/// The tags packed in a bucket's two words, slot order (on little-endian targets the packing is the
/// memory layout of `[u16; 8]`, so this is a plain reinterpretation).
#[inline(always)]
fn unpack_tags(w: [u64; 2]) -> [u16; SLOTS] {
    #[cfg(target_endian = "little")]
    {
        bytemuck::cast(w)
    }
    #[cfg(not(target_endian = "little"))]
    {
        core::array::from_fn(|s| (w[s / 4] >> ((s % 4) * 16)) as u16)
    }
}

/// Head of one free-list stripe (a Treiber stack with an ABA tag) on its own line.
#[repr(C, align(64))]
struct FreeStripe {
    /// `tag << 32 | index` (index `NIL` = empty).
    head: AtomicU64,
    /// Entries on this stripe (for `len`).
    free: AtomicU64,
}

#[repr(align(64))]
struct Padded<T>(T);

#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    {
        // SAFETY: prefetcht0 is a hint that never faults whatever the address, and SSE
        // (which provides it) is part of the x86_64 baseline.
        unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8) }
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = p;
}

/// Free-list stripe of the calling thread: threads get consecutive numbers on first use,
/// so two cores churning entries work on different free-list lines.
#[cfg(not(loom))]
#[inline]
fn home_stripe() -> usize {
    use std::cell::Cell;
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    thread_local! {
        static HOME: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    HOME.with(|h| {
        let v = h.get();
        if v != usize::MAX {
            return v;
        }
        let v = NEXT.fetch_add(1, Relaxed);
        h.set(v);
        v
    })
}

/// Under loom every model thread uses stripe 0 (model tables are small: one stripe).
#[cfg(loom)]
#[inline]
fn home_stripe() -> usize {
    0
}

/// A concurrent flow table with lock-free readers; see the module docs.
pub struct SharedFlowTable<K> {
    buckets: Box<[Bucket]>,
    mask: u32,
    words: Box<[AtomicU64]>,
    /// Word offset of entry 0 (cache-line aligned).
    base: usize,
    /// Words per entry, a multiple of a cache line.
    stride: usize,
    state_words: usize,
    capacity: usize,
    next: Box<[AtomicU32]>,
    stripes: Box<[FreeStripe]>,
    timeout: u64,
    /// `last_seen` is rewritten only when it is this much older, so hits on a popular
    /// entry from several cores do not bounce its line on every packet.
    touch_ns: u64,
    cursor: Padded<AtomicUsize>,
    failed: Padded<AtomicU64>,
    _key: PhantomData<fn() -> K>,
}

impl<K: SharedKey> fmt::Debug for SharedFlowTable<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedFlowTable")
            .field("capacity", &self.capacity)
            .field("buckets", &self.buckets.len())
            .field("state_words", &self.state_words)
            .field("len", &self.len())
            .finish()
    }
}

enum Link {
    Linked,
    Exists,
    Full,
}

enum Room {
    /// A candidate bucket may have a free slot now: retry the link.
    Retry,
    /// No displacement path within the search bound.
    NoPath,
}

impl<K: SharedKey> SharedFlowTable<K> {
    /// Bytes [`Self::new`] allocates (and touches) for `capacity` keys of `state_words` words: lets a caller
    /// check a configuration against the machine's memory before allocating it.
    pub fn footprint(capacity: usize, state_words: usize) -> u128 {
        let (cap, slots) = (capacity as u128, SLOTS as u128);
        let nb = (cap + cap / 10).div_ceil(slots).max(2).next_power_of_two();
        let stride = (HEADER_WORDS + state_words).div_ceil(LINE_WORDS) * LINE_WORDS;
        nb * core::mem::size_of::<Bucket>() as u128 + cap * (stride as u128 * 8 + 4)
    }

    /// Creates a table with every entry preallocated.
    pub fn new(cfg: SharedTableConfig) -> Result<Self, SharedConfigError> {
        if cfg.capacity == 0 || cfg.capacity > MAX_CAPACITY {
            return Err(SharedConfigError::Capacity(cfg.capacity));
        }
        if cfg.state_words > 4096 {
            return Err(SharedConfigError::StateWords(cfg.state_words));
        }
        // ~10% slot headroom: the table reaches full capacity before cuckoo paths get long.
        let want = (cfg.capacity + cfg.capacity / 10).div_ceil(SLOTS);
        let nb = want.next_power_of_two().max(2);
        let stride = (HEADER_WORDS + cfg.state_words).div_ceil(LINE_WORDS) * LINE_WORDS;
        let words: Box<[AtomicU64]> = (0..cfg.capacity * stride + LINE_WORDS).map(|_| AtomicU64::new(0)).collect();
        let base = if core::mem::size_of::<AtomicU64>() == 8 {
            let addr = words.as_ptr() as usize;
            ((64 - addr % 64) % 64) / 8
        } else {
            0
        };
        let nstripes = if cfg.capacity >= 1024 { 16 } else { 1 };
        let next: Box<[AtomicU32]> = (0..cfg.capacity).map(|_| AtomicU32::new(NIL)).collect();
        let stripes: Box<[FreeStripe]> = (0..nstripes)
            .map(|_| FreeStripe { head: AtomicU64::new(u64::from(NIL)), free: AtomicU64::new(0) })
            .collect();
        let t = SharedFlowTable {
            buckets: (0..nb).map(|_| Bucket::new()).collect(),
            mask: (nb - 1) as u32,
            words,
            base,
            stride,
            state_words: cfg.state_words,
            capacity: cfg.capacity,
            next,
            stripes,
            timeout: cfg.idle_timeout_ns,
            touch_ns: (cfg.idle_timeout_ns / 16).max(1),
            cursor: Padded(AtomicUsize::new(0)),
            failed: Padded(AtomicU64::new(0)),
            _key: PhantomData,
        };
        for i in (0..cfg.capacity).rev() {
            t.word(i, W_REF).store(DEAD, Relaxed);
            t.push_to(i % nstripes, i as u32);
        }
        Ok(t)
    }

    /// Maximum number of entries.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// State words per entry.
    pub fn state_words(&self) -> usize {
        self.state_words
    }

    /// The two candidate buckets of `hash` (primary, alternate): for tests and diagnostics.
    pub fn candidate_buckets(&self, hash: u64) -> (usize, usize) {
        let p = place(hash, self.mask);
        (p.b1 as usize, p.b2 as usize)
    }

    /// Number of buckets (a power of two, at least 2).
    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// Entries currently allocated (exact when no operation is in flight).
    pub fn len(&self) -> usize {
        let free: u64 = self.stripes.iter().map(|s| s.free.load(Relaxed)).sum();
        self.capacity.saturating_sub(free as usize)
    }

    /// True if no entry is allocated.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Insertions that failed because the table was full (counted, never a panic).
    pub fn failed_inserts(&self) -> u64 {
        self.failed.0.load(Relaxed)
    }

    #[inline(always)]
    fn word(&self, idx: usize, w: usize) -> &AtomicU64 {
        &self.words[self.base + idx * self.stride + w]
    }

    #[inline(always)]
    fn entry_ptr(&self, idx: usize) -> *const AtomicU64 {
        self.words[self.base..].as_ptr().wrapping_add(idx * self.stride)
    }

    #[inline(always)]
    fn key_at(&self, idx: usize) -> [u64; 2] {
        [self.word(idx, W_KEY0).load(Relaxed), self.word(idx, W_KEY1).load(Relaxed)]
    }

    #[inline(always)]
    fn state_slice(&self, idx: usize) -> &[AtomicU64] {
        let s = self.base + idx * self.stride + HEADER_WORDS;
        &self.words[s..s + self.state_words]
    }

    /// Bucket `b` (indices come from `cuckoo::place`/`alt`, masked, so always in range).
    #[inline(always)]
    fn bucket(&self, b: u32) -> &Bucket {
        &self.buckets[b as usize]
    }

    // ---- bucket locks and versions -------------------------------------------------------

    #[inline(always)]
    fn stable_version(&self, b: u32) -> u32 {
        loop {
            let v = self.bucket(b).version.load(Acquire);
            if v & 1 == 0 {
                return v;
            }
            sync::spin();
        }
    }

    /// Takes bucket `b`'s writer lock; returns the (odd) locked version.
    fn lock(&self, b: u32) -> u32 {
        let ver = &self.bucket(b).version;
        loop {
            let v = ver.load(Relaxed);
            if v & 1 == 0 && ver.compare_exchange_weak(v, v.wrapping_add(1), Acquire, Relaxed).is_ok() {
                // Orders the odd version before the slot writes that follow (seqlock writer side).
                fence(Release);
                return v.wrapping_add(1);
            }
            sync::spin();
        }
    }

    #[inline(always)]
    fn unlock(&self, b: u32, odd: u32) {
        self.bucket(b).version.store(odd.wrapping_add(1), Release);
    }

    /// Locks two distinct buckets in index order.
    fn lock2(&self, a: u32, b: u32) -> (u32, u32) {
        if a < b {
            let x = self.lock(a);
            (x, self.lock(b))
        } else {
            let y = self.lock(b);
            (self.lock(a), y)
        }
    }

    fn unlock2(&self, a: u32, b: u32, (va, vb): (u32, u32)) {
        self.unlock(a, va);
        self.unlock(b, vb);
    }

    // ---- lookup -----------------------------------------------------------------------

    /// Slot and entry of `kw` in bucket `b` (reads are validated by the caller).
    #[inline(always)]
    fn scan(&self, b: u32, tag: u16, kw: [u64; 2]) -> Option<(usize, u32)> {
        let bk = self.bucket(b);
        let mut entry = NIL;
        let s = find_slot(bk.match_tag(tag), |s| {
            entry = bk.entries[s].load(Relaxed);
            (entry as usize) < self.capacity && self.key_at(entry as usize) == kw
        })?;
        Some((s, entry))
    }

    /// Slot and entry of `kw` in either candidate bucket.
    #[inline(always)]
    fn scan2(&self, kw: [u64; 2], p: Place) -> Option<(u32, usize, u32)> {
        self.scan(p.b1, p.tag, kw)
            .map(|(s, e)| (p.b1, s, e))
            .or_else(|| self.scan(p.b2, p.tag, kw).map(|(s, e)| (p.b2, s, e)))
    }

    /// Lock-free validated lookup.
    #[inline]
    fn find(&self, kw: [u64; 2], p: Place) -> SharedHandle {
        loop {
            let v1 = self.stable_version(p.b1);
            let v2 = self.stable_version(p.b2);
            let h = match self.scan2(kw, p) {
                Some((_, _, idx)) => {
                    SharedHandle { idx, gen: (self.word(idx as usize, W_REF).load(Relaxed) >> 32) as u32 }
                }
                None => SharedHandle::NONE,
            };
            fence(Acquire);
            if self.bucket(p.b1).version.load(Relaxed) == v1 && self.bucket(p.b2).version.load(Relaxed) == v2 {
                return h;
            }
            sync::spin();
        }
    }

    /// Single-key lookup (latency-optimised). Returns a weak handle or [`SharedHandle::NONE`].
    pub fn lookup(&self, key: &K, hash: u64) -> SharedHandle {
        self.find(key.to_words(), place(hash, self.mask))
    }

    /// Prefetches both candidate buckets of every row, then the candidate entries, and
    /// fills `meta` (key words and placement) for the chunk.
    #[inline(always)]
    fn prefetch_chunk(&self, keys: &[K], hashes: &[u64], meta: &mut [([u64; 2], Place); BULK_LOOKUP_MAX]) {
        for (i, (k, &h)) in keys.iter().zip(hashes).enumerate() {
            let p = place(h, self.mask);
            prefetch(self.bucket(p.b1));
            prefetch(self.bucket(p.b2));
            meta[i] = (k.to_words(), p);
        }
        for &(_, p) in meta.iter().take(keys.len()) {
            let mut m = self.bucket(p.b1).match_tag(p.tag);
            let b = if m == 0 {
                m = self.bucket(p.b2).match_tag(p.tag);
                p.b2
            } else {
                p.b1
            };
            while m != 0 {
                let s = m.trailing_zeros() as usize;
                m &= m - 1;
                prefetch(self.entry_ptr(self.bucket(b).entries[s].load(Relaxed) as usize % self.capacity));
            }
        }
    }

    /// Batched lookup of any number of rows, [`BULK_LOOKUP_MAX`] at a time: prefetches all
    /// buckets, then all candidate entries, then verifies. `out[i]` gets a weak handle or
    /// [`SharedHandle::NONE`]; returns the number of hits.
    ///
    /// # Panics
    /// If `hashes.len() != keys.len()` or `out.len() < keys.len()`: a caller bug, reported rather than skipping rows.
    pub fn lookup_batch(&self, keys: &[K], hashes: &[u64], out: &mut [SharedHandle]) -> usize {
        check_batch(keys.len(), hashes.len(), out.len());
        let n = keys.len();
        let mut meta = [([0u64; 2], Place { tag: 0, b1: 0, b2: 0 }); BULK_LOOKUP_MAX];
        let mut hits = 0;
        for start in (0..n).step_by(BULK_LOOKUP_MAX) {
            let end = (start + BULK_LOOKUP_MAX).min(n);
            self.prefetch_chunk(&keys[start..end], &hashes[start..end], &mut meta);
            for (o, &(kw, p)) in out[start..end].iter_mut().zip(meta.iter()) {
                *o = self.find(kw, p);
                hits += usize::from(o.is_some());
            }
        }
        hits
    }

    /// Batched add-on-miss: every row ends with a weak handle to its key's entry, inserted
    /// with `init(key, state)` (state zeroed first) on a miss, or [`SharedHandle::NONE`] if
    /// the table is full. Hits refresh the entry's idle timer.
    ///
    /// # Panics
    /// If `hashes.len() != keys.len()` or `out.len() < keys.len()`: a caller bug, reported rather than skipping rows.
    pub fn lookup_or_insert_batch<F>(
        &self,
        keys: &[K],
        hashes: &[u64],
        now: u64,
        out: &mut [SharedHandle],
        init: F,
    ) -> SharedBatchResult
    where
        F: FnMut(&K, &[AtomicU64]),
    {
        self.upsert_batch::<false, F>(keys, hashes, now, out, init)
    }

    /// Like [`SharedFlowTable::lookup_or_insert_batch`], but every returned handle is
    /// *pinned* (its refcount incremented): the entry cannot be removed or reused until
    /// the matching [`SharedFlowTable::release`]. A key repeated in the batch is pinned once
    /// per row. The engine's auxiliary table uses this.
    ///
    /// # Panics
    /// If `hashes.len() != keys.len()` or `out.len() < keys.len()`: a caller bug, reported rather than skipping rows.
    pub fn acquire_batch<F>(
        &self,
        keys: &[K],
        hashes: &[u64],
        now: u64,
        out: &mut [SharedHandle],
        init: F,
    ) -> SharedBatchResult
    where
        F: FnMut(&K, &[AtomicU64]),
    {
        self.upsert_batch::<true, F>(keys, hashes, now, out, init)
    }

    /// Single-key add-on-miss (weak handle); `None` if the table is full.
    pub fn lookup_or_insert<F>(&self, key: &K, hash: u64, now: u64, mut init: F) -> Option<(SharedHandle, bool)>
    where
        F: FnMut(&K, &[AtomicU64]),
    {
        self.upsert_one::<false, F>(key, key.to_words(), hash, place(hash, self.mask), now, &mut init)
    }

    /// Single-key pinned add-on-miss; `None` if the table is full.
    pub fn acquire<F>(&self, key: &K, hash: u64, now: u64, mut init: F) -> Option<(SharedHandle, bool)>
    where
        F: FnMut(&K, &[AtomicU64]),
    {
        self.upsert_one::<true, F>(key, key.to_words(), hash, place(hash, self.mask), now, &mut init)
    }

    fn upsert_batch<const PIN: bool, F>(
        &self,
        keys: &[K],
        hashes: &[u64],
        now: u64,
        out: &mut [SharedHandle],
        mut init: F,
    ) -> SharedBatchResult
    where
        F: FnMut(&K, &[AtomicU64]),
    {
        check_batch(keys.len(), hashes.len(), out.len());
        let n = keys.len();
        let mut meta = [([0u64; 2], Place { tag: 0, b1: 0, b2: 0 }); BULK_LOOKUP_MAX];
        let mut res = SharedBatchResult::default();
        for start in (0..n).step_by(BULK_LOOKUP_MAX) {
            let end = (start + BULK_LOOKUP_MAX).min(n);
            self.prefetch_chunk(&keys[start..end], &hashes[start..end], &mut meta);
            for (i, &(kw, p)) in meta.iter().enumerate().take(end - start) {
                let r = self.upsert_one::<PIN, F>(&keys[start + i], kw, hashes[start + i], p, now, &mut init);
                out[start + i] = match r {
                    Some((h, true)) => {
                        res.inserted += 1;
                        h
                    }
                    Some((h, false)) => {
                        res.hit += 1;
                        h
                    }
                    None => {
                        res.failed += 1;
                        SharedHandle::NONE
                    }
                };
            }
        }
        res
    }

    #[inline]
    fn upsert_one<const PIN: bool, F>(
        &self,
        key: &K,
        kw: [u64; 2],
        hash: u64,
        p: Place,
        now: u64,
        init: &mut F,
    ) -> Option<(SharedHandle, bool)>
    where
        F: FnMut(&K, &[AtomicU64]),
    {
        // Each retry means another thread changed this key's entry (removed it, or inserted
        // it first): progress is made globally, so the loop terminates.
        loop {
            let h = self.find(kw, p);
            if h.is_some() {
                if PIN && !self.try_acquire(h) {
                    sync::spin();
                    continue;
                }
                self.touch(h.index(), now);
                return Some((h, false));
            }
            let Some(idx) = self.pop_free(hash) else {
                self.failed.0.fetch_add(1, Relaxed);
                return None;
            };
            let i = idx as usize;
            // Seqlock writer side for weak readers of this entry's previous life: the
            // generation bump (done by `free_entry`) is ordered before these writes.
            fence(Release);
            let gen = (self.word(i, W_REF).load(Relaxed) >> 32) as u32;
            self.word(i, W_KEY0).store(kw[0], Relaxed);
            self.word(i, W_KEY1).store(kw[1], Relaxed);
            self.word(i, W_HASH).store(hash, Relaxed);
            self.word(i, W_SEEN).store(now, Relaxed);
            let st = self.state_slice(i);
            for w in st {
                w.store(0, Relaxed);
            }
            init(key, st);
            // Live with one reference (ours) so nobody can expire it before it is linked.
            self.word(i, W_REF).store((u64::from(gen) << 32) | 1, Release);
            match self.link(idx, kw, p) {
                Link::Linked => {
                    if !PIN {
                        self.word(i, W_REF).fetch_sub(1, Release);
                    }
                    return Some((SharedHandle { idx, gen }, true));
                }
                Link::Exists => {
                    self.free_entry(idx);
                    continue;
                }
                Link::Full => {
                    self.free_entry(idx);
                    self.failed.0.fetch_add(1, Relaxed);
                    return None;
                }
            }
        }
    }

    #[inline(always)]
    fn touch(&self, idx: usize, now: u64) {
        if self.timeout != 0 {
            let w = self.word(idx, W_SEEN);
            if now > w.load(Relaxed).saturating_add(self.touch_ns) {
                w.store(now, Relaxed);
            }
        }
    }

    // ---- insertion internals ------------------------------------------------------------

    /// Links entry `idx` (holding `kw`) into one of its buckets, displacing if needed.
    fn link(&self, idx: u32, kw: [u64; 2], p: Place) -> Link {
        for _ in 0..MAX_LINK_ATTEMPTS {
            let v = self.lock2(p.b1, p.b2);
            // Under both locks the check is exact: a key only ever lives in b1 or b2,
            // and moves between them hold both locks.
            if self.scan2(kw, p).is_some() {
                self.unlock2(p.b1, p.b2, v);
                return Link::Exists;
            }
            for b in [p.b1, p.b2] {
                let bk = self.bucket(b);
                if let Some(s) = cuckoo::free_slot(&bk.tags()) {
                    bk.entries[s].store(idx, Relaxed);
                    bk.set_tag(s, p.tag);
                    self.unlock2(p.b1, p.b2, v);
                    return Link::Linked;
                }
            }
            self.unlock2(p.b1, p.b2, v);
            if let Room::NoPath = self.make_room(p.b1, p.b2) {
                return Link::Full;
            }
        }
        Link::Full
    }

    /// Searches a cuckoo path from `b1`/`b2` to a bucket with a free slot (`cuckoo::PathSearch`
    /// over unsynchronised tag reads: only a hint), then executes it from the far end, each
    /// move under the two buckets' locks with re-verification.
    fn make_room(&self, b1: u32, b2: u32) -> Room {
        let mut search = PathSearch::<MAX_BFS_NODES>::new();
        match search.run(b1, b2, self.mask, |b| self.bucket(b).tags()) {
            Search::NoPath => return Room::NoPath,
            Search::SlotFreed => return Room::Retry,
            Search::Found => {}
        }
        for (from, s, to) in search.moves() {
            if !self.move_slot(from, s, to) {
                break;
            }
        }
        Room::Retry
    }

    /// Moves the entry in `src[s]` to a free slot of `dst` (its alternate bucket):
    /// copy first, then clear, both buckets locked, so readers always find the key.
    fn move_slot(&self, src: u32, s: usize, dst: u32) -> bool {
        let v = self.lock2(src, dst);
        let sb = self.bucket(src);
        let db = self.bucket(dst);
        let t = sb.tag_at(s);
        let free = cuckoo::free_slot(&db.tags());
        let ok = t != 0 && cuckoo::alt(src, t, self.mask) == dst && free.is_some();
        if let (true, Some(d)) = (ok, free) {
            db.entries[d].store(sb.entries[s].load(Relaxed), Relaxed);
            db.set_tag(d, t);
            sb.set_tag(s, 0);
        }
        self.unlock2(src, dst, v);
        ok
    }

    // ---- free lists -------------------------------------------------------------------

    /// Returns `idx` to the calling thread's home stripe, so a core that frees and then
    /// allocates entries (steady churn) keeps reusing its own free-list line and entries.
    fn push_free(&self, idx: u32) {
        self.push_to(home_stripe(), idx);
    }

    fn push_to(&self, stripe: usize, idx: u32) {
        let st = &self.stripes[stripe & (self.stripes.len() - 1)];
        let mut h = st.head.load(Relaxed);
        loop {
            self.next[idx as usize].store(h as u32, Relaxed);
            let new = (((h >> 32).wrapping_add(1)) << 32) | u64::from(idx);
            match st.head.compare_exchange_weak(h, new, Release, Relaxed) {
                Ok(_) => break,
                Err(x) => h = x,
            }
        }
        st.free.fetch_add(1, Relaxed);
    }

    /// Pops a free entry from the calling thread's home stripe, else from the others,
    /// visited from a hash-chosen start so threads whose home is empty spread out.
    fn pop_free(&self, hash: u64) -> Option<u32> {
        let ns = self.stripes.len();
        let home = home_stripe();
        let start = (hash >> 32) as usize;
        for k in 0..=ns {
            let s = if k == 0 { home } else { start + k };
            let st = &self.stripes[s & (ns - 1)];
            let mut h = st.head.load(Acquire);
            loop {
                let idx = h as u32;
                if idx == NIL {
                    break;
                }
                let nxt = self.next[idx as usize].load(Relaxed);
                let new = (((h >> 32).wrapping_add(1)) << 32) | u64::from(nxt);
                match st.head.compare_exchange_weak(h, new, Acquire, Acquire) {
                    Ok(_) => {
                        st.free.fetch_sub(1, Relaxed);
                        return Some(idx);
                    }
                    Err(x) => h = x,
                }
            }
        }
        None
    }

    /// Bumps the generation (invalidating every handle of this life), then frees.
    fn free_entry(&self, idx: u32) {
        let w = self.word(idx as usize, W_REF);
        let gen = (w.load(Relaxed) >> 32).wrapping_add(1) & 0xFFFF_FFFF;
        w.store((gen << 32) | DEAD, Release);
        self.push_free(idx);
    }

    /// Under both locks of the entry's buckets: clears the slot pointing at `idx`.
    fn unlink_locked(&self, idx: u32, p: Place) -> bool {
        for b in [p.b1, p.b2] {
            let bk = self.bucket(b);
            let occupied = !bk.match_tag(0) & ((1 << SLOTS) - 1);
            if let Some(s) = find_slot(occupied, |s| bk.entries[s].load(Relaxed) == idx) {
                bk.set_tag(s, 0);
                return true;
            }
        }
        false
    }

    /// Removes entry `idx` if its refword is still exactly `expect` (live, count 0).
    fn remove_if_unreferenced(&self, idx: u32, expect: u64) -> bool {
        let hash = self.word(idx as usize, W_HASH).load(Relaxed);
        // Pairs with the release fence of a new owner: if `hash` came from a later life,
        // the CAS below sees the bumped generation and fails.
        fence(Acquire);
        let p = place(hash, self.mask);
        let v = self.lock2(p.b1, p.b2);
        let w = self.word(idx as usize, W_REF);
        let ok = w.compare_exchange(expect, expect | DEAD, AcqRel, Relaxed).is_ok();
        let ok = ok && {
            if self.unlink_locked(idx, p) {
                true
            } else {
                // Not linked (cannot happen for a live, unpinned entry): undo, keep it.
                w.store(expect, Relaxed);
                false
            }
        };
        self.unlock2(p.b1, p.b2, v);
        ok
    }

    // ---- handles, refcounts, state -----------------------------------------------------

    /// The entry's state words, or `None` for a handle that is not from this table.
    ///
    /// Meaningful while the handle is pinned; with a weak handle the entry may have been
    /// reused (memory-safe, but use [`SharedFlowTable::read_state`] to detect it).
    #[inline]
    pub fn state(&self, h: SharedHandle) -> Option<&[AtomicU64]> {
        if h.index() < self.capacity {
            Some(self.state_slice(h.index()))
        } else {
            None
        }
    }

    /// Prefetches the entry's first line (header and the first state words).
    #[inline]
    pub fn prefetch_state(&self, h: SharedHandle) {
        if h.index() < self.capacity {
            prefetch(self.entry_ptr(h.index()));
        }
    }

    /// Runs `f` on the state and returns its result only if the entry still belonged to
    /// the handle's key for the whole read (generation checked before and after).
    pub fn read_state<R>(&self, h: SharedHandle, f: impl FnOnce(&[AtomicU64]) -> R) -> Option<R> {
        if h.index() >= self.capacity {
            return None;
        }
        let w = self.word(h.index(), W_REF);
        let r1 = w.load(Acquire);
        if (r1 >> 32) as u32 != h.gen || r1 & DEAD != 0 {
            return None;
        }
        let r = f(self.state_slice(h.index()));
        fence(Acquire);
        ((w.load(Relaxed) >> 32) as u32 == h.gen).then_some(r)
    }

    /// Key of a live entry (`None` if the handle is stale).
    pub fn key(&self, h: SharedHandle) -> Option<K> {
        self.read_state(h, |_| ()).and_then(|()| {
            let k = self.key_at(h.index());
            fence(Acquire);
            let r = self.word(h.index(), W_REF).load(Relaxed);
            ((r >> 32) as u32 == h.gen).then(|| K::from_words(k))
        })
    }

    /// True if the handle's entry is still live (not removed, not reused).
    pub fn is_current(&self, h: SharedHandle) -> bool {
        h.index() < self.capacity && {
            let r = self.word(h.index(), W_REF).load(Acquire);
            (r >> 32) as u32 == h.gen && r & DEAD == 0
        }
    }

    /// Current reference count of a live entry.
    pub fn refcount(&self, h: SharedHandle) -> Option<u32> {
        if h.index() >= self.capacity {
            return None;
        }
        let r = self.word(h.index(), W_REF).load(Acquire);
        ((r >> 32) as u32 == h.gen).then_some((r & COUNT) as u32)
    }

    /// Pins a weak handle: increments the refcount unless the entry was removed or reused.
    pub fn try_acquire(&self, h: SharedHandle) -> bool {
        if h.index() >= self.capacity {
            return false;
        }
        let w = self.word(h.index(), W_REF);
        let mut cur = w.load(Relaxed);
        loop {
            if (cur >> 32) as u32 != h.gen || cur & DEAD != 0 || cur & COUNT == COUNT {
                return false;
            }
            match w.compare_exchange_weak(cur, cur + 1, Acquire, Relaxed) {
                Ok(_) => return true,
                Err(x) => cur = x,
            }
        }
    }

    /// Drops one pin. When the last pin goes: a removed entry is freed; with no idle
    /// timeout the entry is removed now; otherwise its idle timer runs from the latest of
    /// `now` and its last touch. The last-seen time never moves back: cores whose packet
    /// clocks differ (a replay's cores drift apart in trace time) share the entry, and a
    /// core behind releasing it must not make a flow another core is still in look idle
    /// to the sweep.
    pub fn release(&self, h: SharedHandle, now: u64) -> ReleaseOutcome {
        if h.index() >= self.capacity {
            return ReleaseOutcome::Invalid;
        }
        let w = self.word(h.index(), W_REF);
        let mut cur = w.load(Relaxed);
        if self.timeout != 0 && (cur >> 32) as u32 == h.gen && cur & DEAD == 0 {
            let seen = self.word(h.index(), W_SEEN);
            // Read first: the common case (a core at or behind the last touch) writes nothing.
            if now > seen.load(Relaxed) {
                seen.fetch_max(now, Relaxed);
            }
        }
        let new = loop {
            if (cur >> 32) as u32 != h.gen || cur & COUNT == 0 {
                return ReleaseOutcome::Invalid;
            }
            match w.compare_exchange_weak(cur, cur - 1, AcqRel, Relaxed) {
                Ok(_) => break cur - 1,
                Err(x) => cur = x,
            }
        };
        if new & COUNT != 0 {
            ReleaseOutcome::Referenced
        } else if new & DEAD != 0 || (self.timeout == 0 && self.remove_if_unreferenced(h.idx, new)) {
            // Removed earlier and this was the last pin, or no timeout: free it now.
            self.free_entry(h.idx);
            ReleaseOutcome::Removed
        } else {
            ReleaseOutcome::Unreferenced
        }
    }

    /// Removes `key`. A pinned entry disappears from lookups now and is freed by its
    /// last release ([`RemoveOutcome::Deferred`]).
    pub fn remove(&self, key: &K, hash: u64) -> RemoveOutcome {
        let p = place(hash, self.mask);
        let v = self.lock2(p.b1, p.b2);
        let Some((b, s, idx)) = self.scan2(key.to_words(), p) else {
            self.unlock2(p.b1, p.b2, v);
            return RemoveOutcome::NotFound;
        };
        let prev = self.word(idx as usize, W_REF).fetch_or(DEAD, AcqRel);
        self.bucket(b).set_tag(s, 0);
        self.unlock2(p.b1, p.b2, v);
        if prev & COUNT == 0 {
            self.free_entry(idx);
            RemoveOutcome::Removed
        } else {
            RemoveOutcome::Deferred
        }
    }

    /// Expires up to `budget` entries' worth of the arena (an incremental sweep shared by
    /// all callers): unreferenced entries idle for longer than the timeout are removed and
    /// passed to `on_expire` before their entry is freed. Returns the number expired.
    pub fn expire(&self, now: u64, budget: usize, mut on_expire: impl FnMut(&K, &[AtomicU64])) -> usize {
        if self.timeout == 0 || budget == 0 {
            return 0;
        }
        let budget = budget.min(self.capacity);
        let start = self.cursor.0.fetch_add(budget, Relaxed) % self.capacity;
        let mut n = 0;
        for j in 0..budget {
            let idx = (start + j) % self.capacity;
            let r = self.word(idx, W_REF).load(Acquire);
            if r & (DEAD | COUNT) != 0 {
                continue;
            }
            if now.saturating_sub(self.word(idx, W_SEEN).load(Relaxed)) <= self.timeout {
                continue;
            }
            if self.remove_if_unreferenced(idx as u32, r) {
                on_expire(&K::from_words(self.key_at(idx)), self.state_slice(idx));
                self.free_entry(idx as u32);
                n += 1;
            }
        }
        n
    }

    /// Visits every live entry (a racy snapshot under concurrent writers; exact when quiet).
    pub fn for_each(&self, mut f: impl FnMut(SharedHandle, &K, &[AtomicU64])) {
        for idx in 0..self.capacity {
            let r = self.word(idx, W_REF).load(Acquire);
            if r & DEAD == 0 {
                let h = SharedHandle { idx: idx as u32, gen: (r >> 32) as u32 };
                f(h, &K::from_words(self.key_at(idx)), self.state_slice(idx));
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn layout_is_one_line_per_bucket_and_aligned_entries() {
        assert_eq!(core::mem::size_of::<Bucket>(), 64);
        let t = SharedFlowTable::<u32>::new(SharedTableConfig { capacity: 100, state_words: 3, idle_timeout_ns: 0 })
            .unwrap();
        assert_eq!(t.stride, 8);
        for i in 0..100 {
            assert_eq!(t.entry_ptr(i) as usize % 64, 0);
        }
        let t = SharedFlowTable::<u32>::new(SharedTableConfig { capacity: 10, state_words: 8, idle_timeout_ns: 0 })
            .unwrap();
        assert_eq!(t.stride, 16);
    }

    #[test]
    fn packed_tags_unpack_in_slot_order() {
        let b = Bucket::new();
        for s in 0..SLOTS {
            b.set_tag(s, 0x100 + s as u16);
        }
        assert_eq!(b.tags(), core::array::from_fn(|s| 0x100 + s as u16));
        for s in 0..SLOTS {
            assert_eq!(b.tag_at(s), 0x100 + s as u16);
        }
        b.set_tag(5, 0);
        b.set_tag(2, 0x8000);
        assert_eq!(b.match_tag(0), 1 << 5);
        assert_eq!(b.match_tag(0x8000), 1 << 2);
    }

    #[test]
    fn candidate_buckets_differ_and_pair_up() {
        let capacity = if cfg!(miri) { 500 } else { 5000 };
        let t =
            SharedFlowTable::<u32>::new(SharedTableConfig { capacity, state_words: 1, idle_timeout_ns: 0 }).unwrap();
        let mut x = 1u64;
        for _ in 0..if cfg!(miri) { 1_000 } else { 10_000 } {
            x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
            let (b1, b2) = t.candidate_buckets(x);
            assert_ne!(b1, b2);
            assert!(b1 < t.bucket_count() && b2 < t.bucket_count());
            assert_eq!(cuckoo::alt(b2 as u32, cuckoo::tag(x), t.mask) as usize, b1);
        }
    }

    #[test]
    fn bad_config_is_an_error() {
        let c = SharedTableConfig { capacity: 0, state_words: 1, idle_timeout_ns: 0 };
        assert_eq!(SharedFlowTable::<u32>::new(c).unwrap_err(), SharedConfigError::Capacity(0));
        let c = SharedTableConfig { capacity: 1, state_words: 5000, idle_timeout_ns: 0 };
        assert_eq!(SharedFlowTable::<u32>::new(c).unwrap_err(), SharedConfigError::StateWords(5000));
    }
}
