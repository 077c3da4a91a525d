//! Raw table memory and the state slab.
//!
//! [`RawMem`] owns one zeroed, 64-byte-aligned region (2 MiB hugepages via
//! `mmap(MAP_HUGETLB)` when asked and available, else normal pages with a
//! transparent-hugepage hint). [`Slab`] carves it into fixed-size entries —
//! `key | hash | last_seen | state`, each entry a multiple of 64 bytes so a
//! flow's key and first state bytes share one cache line — and keeps the free
//! list and the live bitmap. The slab knows nothing about buckets.
//!
//! A *placed* slab (the inline layout, `inline.rs`) has no free list: the table
//! picks each entry's position itself ([`Slab::alloc_at`]) and keeps a small
//! word of placement bookkeeping in the entry's hash field ([`Slab::meta`]).

use crate::error::TableError;
use core::marker::PhantomData;
use core::ptr::NonNull;

/// 2 MiB: the hugepage size used for `hugepages: true`.
const HUGE: usize = 2 << 20;

/// A zeroed, 64-byte-aligned, exclusively owned allocation.
pub(crate) struct RawMem {
    ptr: NonNull<u8>,
    len: usize,
    kind: MemKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MemKind {
    /// `mmap` of `len` bytes (hugetlb or normal pages).
    Mmap { huge: bool },
    /// Global allocator (non-Linux targets).
    #[allow(dead_code)]
    Heap,
}

// SAFETY: RawMem is a uniquely owned buffer (like a Box<[u8]>); moving it to another thread is sound.
unsafe impl Send for RawMem {}

impl RawMem {
    /// Allocates `len` zeroed bytes (at least 64), 64-byte aligned.
    pub(crate) fn new(len: usize, hugepages: bool) -> Result<Self, TableError> {
        let len = len.max(64);
        #[cfg(target_os = "linux")]
        {
            if hugepages {
                let huge_len = len.checked_add(HUGE - 1).ok_or(TableError::OutOfMemory { bytes: len })? & !(HUGE - 1);
                if let Some(ptr) = Self::mmap(huge_len, libc::MAP_HUGETLB) {
                    return Ok(RawMem { ptr, len: huge_len, kind: MemKind::Mmap { huge: true } });
                }
            }
            let ptr = Self::mmap(len, 0).ok_or(TableError::OutOfMemory { bytes: len })?;
            if hugepages {
                // Fallback: ask for transparent hugepages; failure only costs TLB misses.
                // SAFETY: ptr/len describe a mapping we own; madvise does not invalidate it.
                unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_HUGEPAGE) };
            }
            Ok(RawMem { ptr, len, kind: MemKind::Mmap { huge: false } })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = hugepages;
            let layout =
                std::alloc::Layout::from_size_align(len, 64).map_err(|_| TableError::OutOfMemory { bytes: len })?;
            // SAFETY: layout has non-zero size.
            let p = unsafe { std::alloc::alloc_zeroed(layout) };
            let ptr = NonNull::new(p).ok_or(TableError::OutOfMemory { bytes: len })?;
            Ok(RawMem { ptr, len, kind: MemKind::Heap })
        }
    }

    #[cfg(target_os = "linux")]
    fn mmap(len: usize, extra_flags: libc::c_int) -> Option<NonNull<u8>> {
        // SAFETY: anonymous private mapping with no address hint; the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                // No MAP_NORESERVE: hugetlb pages must be reserved at mmap time, or a later touch raises SIGBUS.
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            None
        } else {
            // mmap returns page-aligned (>= 4 KiB) zero-filled memory.
            NonNull::new(p.cast::<u8>())
        }
    }

    #[inline(always)]
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Whether the region is backed by explicit 2 MiB hugepages.
    pub(crate) fn is_huge(&self) -> bool {
        self.kind == MemKind::Mmap { huge: true }
    }

    /// Start address and length of the region (diagnostics: which mapping of /proc/self/smaps holds it).
    pub(crate) fn span(&self) -> (usize, usize) {
        (self.ptr.as_ptr() as usize, self.len)
    }

    /// Backs the whole region with memory now, so that no page fault happens later (in a measurement, on the
    /// packet path), and asks for transparent hugepages to be assembled now rather than whenever khugepaged gets
    /// to them. Best effort, contents unchanged; what was obtained shows in /proc/self/smaps.
    pub(crate) fn prefault(&mut self) {
        #[cfg(target_os = "linux")]
        if let MemKind::Mmap { huge } = self.kind {
            let (p, len) = (self.ptr.as_ptr().cast::<libc::c_void>(), self.len);
            // SAFETY: p/len is exactly our mapping; MADV_POPULATE_WRITE (Linux 5.14) only faults pages in, writable,
            // without changing their contents. (Miri cannot run madvise: it takes the touch loop below.)
            let populated = !cfg!(miri) && unsafe { libc::madvise(p, len, libc::MADV_POPULATE_WRITE) } == 0;
            if !populated {
                // Older kernels: touch one byte per 4 KiB page, rewriting the value it holds.
                for off in (0..len).step_by(4096) {
                    // SAFETY: off < len, inside the mapping; the memory is initialised (zeroed by mmap, then only
                    // written through this RawMem) and `&mut self` excludes any concurrent access.
                    unsafe {
                        let b = self.ptr.as_ptr().add(off);
                        b.write_volatile(b.read_volatile());
                    }
                }
            }
            if !huge && !cfg!(miri) {
                // Collapse what the faults could not get as 2 MiB pages (Linux 6.1; fails harmlessly elsewhere).
                // SAFETY: as above; MADV_COLLAPSE migrates pages without changing their contents.
                unsafe { libc::madvise(p, len, libc::MADV_COLLAPSE) };
            }
        }
    }
}

impl Drop for RawMem {
    fn drop(&mut self) {
        match self.kind {
            #[cfg(target_os = "linux")]
            MemKind::Mmap { .. } => {
                // SAFETY: ptr/len are exactly the mapping created in `new`, unmapped once.
                unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
            }
            #[cfg(not(target_os = "linux"))]
            MemKind::Mmap { .. } => {}
            MemKind::Heap => {
                if let Ok(layout) = std::alloc::Layout::from_size_align(self.len, 64) {
                    // SAFETY: allocated in `new` with this exact layout.
                    unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
                }
            }
        }
    }
}

/// Issues a read prefetch of the cache line holding `p` into L2 and outer levels.
/// `prefetcht1` rather than `t0`: for DRAM-bound random lines it sustains more
/// misses in flight here (measured: batched lookup-hit at 4M entries +23%).
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint that never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T1 }>(p.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Byte offsets inside one slab entry, computed once from the key type and state size.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EntryLayout {
    /// Offset of the caller's 64-bit hash (after the key, 8-aligned).
    pub(crate) hash_off: usize,
    /// Offset of the last-seen timestamp.
    pub(crate) seen_off: usize,
    /// Offset of the state block (16-aligned so 16-byte Pod types fit at offset 0).
    pub(crate) state_off: usize,
    /// Bytes of state available (>= requested state size).
    pub(crate) state_len: usize,
    /// Entry stride, a multiple of 64.
    pub(crate) size: usize,
}

impl EntryLayout {
    pub(crate) fn new<K>(state_size: usize) -> Result<Self, TableError> {
        if core::mem::align_of::<K>() > 64 {
            return Err(TableError::InvalidConfig("key alignment above 64 bytes"));
        }
        let hash_off = core::mem::size_of::<K>().next_multiple_of(8);
        let seen_off = hash_off + 8;
        let state_off = (seen_off + 8).next_multiple_of(16);
        let size = state_off
            .checked_add(state_size)
            .and_then(|s| s.checked_next_multiple_of(64))
            .ok_or(TableError::InvalidConfig("state_size too large"))?;
        Ok(EntryLayout { hash_off, seen_off, state_off, state_len: size - state_off, size })
    }
}

/// The state slab: `capacity` entries of `layout.size` bytes, a LIFO free list
/// (recently freed entries are the likeliest to still be cached) and a live bitmap
/// (lets the expiry sweep and iteration skip free entries without touching them).
pub(crate) struct Slab<K> {
    mem: RawMem,
    pub(crate) layout: EntryLayout,
    capacity: u32,
    /// Free entries (empty and unused in a placed slab).
    free: Vec<u32>,
    live: Vec<u64>,
    /// Live entries.
    count: u32,
    /// Positions chosen by the table ([`Slab::alloc_at`]) rather than popped from the free list.
    placed: bool,
    _k: PhantomData<K>,
}

impl<K: crate::FlowKey> Slab<K> {
    pub(crate) fn new(capacity: u32, state_size: usize, hugepages: bool) -> Result<Self, TableError> {
        let layout = EntryLayout::new::<K>(state_size)?;
        let bytes = (capacity as usize)
            .checked_mul(layout.size)
            .ok_or(TableError::InvalidConfig("capacity x state too large"))?;
        let mem = RawMem::new(bytes, hugepages)?;
        // Popped from the back: entries are handed out in ascending order on a fresh table.
        let free: Vec<u32> = (0..capacity).rev().collect();
        let live = vec![0u64; (capacity as usize).div_ceil(64)];
        Ok(Slab { mem, layout, capacity, free, live, count: 0, placed: false, _k: PhantomData })
    }

    /// A placed slab of `entries` entries: no free list; the table chooses positions ([`Slab::alloc_at`]).
    pub(crate) fn new_placed(entries: u32, state_size: usize, hugepages: bool) -> Result<Self, TableError> {
        let layout = EntryLayout::new::<K>(state_size)?;
        let bytes = (entries as usize)
            .checked_mul(layout.size)
            .ok_or(TableError::InvalidConfig("capacity x state too large"))?;
        let mem = RawMem::new(bytes, hugepages)?;
        let live = vec![0u64; (entries as usize).div_ceil(64)];
        Ok(Slab { mem, layout, capacity: entries, free: Vec::new(), live, count: 0, placed: true, _k: PhantomData })
    }

    #[inline(always)]
    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    pub(crate) fn is_huge(&self) -> bool {
        self.mem.is_huge()
    }

    pub(crate) fn mem_mut(&mut self) -> &mut RawMem {
        &mut self.mem
    }

    pub(crate) fn mem(&self) -> &RawMem {
        &self.mem
    }

    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.count as usize
    }

    /// Address of entry `h`, computed without a bounds check (for prefetching): dereferencing it is only valid
    /// for `h < capacity`, which every accessor below checks or requires.
    #[inline(always)]
    pub(crate) fn entry_ptr(&self, h: u32) -> *mut u8 {
        self.mem.ptr().wrapping_add(h as usize * self.layout.size)
    }

    /// Base of entry `h`, or `None` when `h` is out of range: the bounds check of the safe accessors.
    #[inline(always)]
    fn entry(&self, h: u32) -> Option<*mut u8> {
        (h < self.capacity).then(|| self.entry_ptr(h))
    }

    #[inline(always)]
    pub(crate) fn is_live(&self, h: u32) -> bool {
        h < self.capacity && self.live[(h >> 6) as usize] & (1u64 << (h & 63)) != 0
    }

    /// The entry that the `n`-th next allocation will return (for prefetching before inserting).
    #[inline(always)]
    pub(crate) fn peek_free(&self, n: usize) -> Option<u32> {
        self.free.len().checked_sub(n + 1).map(|i| self.free[i])
    }

    /// Takes a free entry, writes key/hash/last-seen, zeroes the state; returns its handle.
    #[inline]
    pub(crate) fn alloc(&mut self, key: &K, hash: u64, now: u64) -> Option<u32> {
        debug_assert!(!self.placed);
        let h = self.free.pop()?;
        self.live[(h >> 6) as usize] |= 1u64 << (h & 63);
        self.count += 1;
        self.write_entry(h, key, hash, now);
        Some(h)
    }

    /// Placed slab: makes free entry `h` live with `key`, last-seen `now`, zeroed state and placement word `meta`
    /// (the hash field's low 32 bits; its high half is zeroed). False if `h` is out of range or already live.
    #[inline]
    pub(crate) fn alloc_at(&mut self, h: u32, key: &K, now: u64, meta: u32) -> bool {
        debug_assert!(self.placed);
        let Some(p) = self.entry(h) else { return false };
        if self.is_live(h) {
            return false;
        }
        self.live[(h >> 6) as usize] |= 1u64 << (h & 63);
        self.count += 1;
        let l = self.layout;
        // SAFETY: as in `write_entry`: p is the 64-aligned base of in-range entry h, exclusively borrowed through
        // &mut self; key at offset 0 (align <= 64), u64 fields at 8-aligned offsets inside the entry.
        unsafe {
            p.cast::<K>().write(*key);
            p.add(l.hash_off).cast::<u64>().write(u64::from(meta));
            p.add(l.seen_off).cast::<u64>().write(now);
            core::ptr::write_bytes(p.add(l.state_off), 0, l.state_len);
        }
        true
    }

    /// Placed slab: the placement word of entry `h` (0 if out of range). Readable for free entries too: the
    /// table keeps per-position bookkeeping there that outlives the entry.
    #[inline(always)]
    pub(crate) fn meta(&self, h: u32) -> u32 {
        match self.entry(h) {
            // SAFETY: in-range entry: an 8-aligned u64 inside the allocation (read as its low u32, little- or
            // big-endian alike through the u64), always initialised (zeroed memory).
            Some(p) => unsafe { p.add(self.layout.hash_off).cast::<u64>().read() as u32 },
            None => 0,
        }
    }

    /// Placed slab: sets entry `h`'s placement word (ignored if out of range).
    #[inline(always)]
    pub(crate) fn set_meta(&mut self, h: u32, meta: u32) {
        if let Some(p) = self.entry(h) {
            // SAFETY: as in `meta`; &mut self gives exclusive access.
            unsafe { p.add(self.layout.hash_off).cast::<u64>().write(u64::from(meta)) }
        }
    }

    /// Reinitialises entry `h` for a new key (eviction reuses the victim's entry); ignored if `h` is out of range.
    #[inline]
    pub(crate) fn write_entry(&mut self, h: u32, key: &K, hash: u64, now: u64) {
        let Some(p) = self.entry(h) else { return };
        let l = self.layout;
        // SAFETY: p is the 64-aligned base of in-range entry h, exclusively borrowed through &mut self; the offsets
        // are inside the entry (EntryLayout) and aligned for K (align <= 64, offset 0) and u64 (8-aligned offsets).
        unsafe {
            p.cast::<K>().write(*key);
            p.add(l.hash_off).cast::<u64>().write(hash);
            p.add(l.seen_off).cast::<u64>().write(now);
            core::ptr::write_bytes(p.add(l.state_off), 0, l.state_len);
        }
    }

    /// Returns live entry `h` to the free list. False if it was not live.
    #[inline]
    pub(crate) fn free(&mut self, h: u32) -> bool {
        if !self.is_live(h) {
            return false;
        }
        self.live[(h >> 6) as usize] &= !(1u64 << (h & 63));
        self.count -= 1;
        if !self.placed {
            self.free.push(h);
        }
        true
    }

    /// Key of entry `h`, without checking that the entry is live (the lookup hot path reads it for handles taken
    /// from occupied bucket slots, which are live by construction).
    ///
    /// # Safety
    /// `h` must be live: allocated by [`Slab::alloc`] and not freed since. Its key was then written by
    /// [`Slab::write_entry`]; any other entry may hold zeroed bytes, which need not be a valid `K`.
    #[inline(always)]
    pub(crate) unsafe fn key_unchecked(&self, h: u32) -> &K {
        debug_assert!(self.is_live(h));
        // SAFETY: the caller guarantees h is live, so h < capacity (the pointer is the 64-aligned base of an entry
        // inside the allocation) and a valid K was written there; the borrow is tied to &self, and writes to the key
        // need &mut self.
        unsafe { &*self.entry_ptr(h).cast::<K>() }
    }

    /// Key of entry `h` if it is live.
    #[inline]
    pub(crate) fn key(&self, h: u32) -> Option<&K> {
        // SAFETY: is_live(h) was checked just before.
        self.is_live(h).then(|| unsafe { self.key_unchecked(h) })
    }

    /// Hash stored with entry `h` (0 if `h` is out of range; stale for a free entry).
    #[inline(always)]
    pub(crate) fn hash(&self, h: u32) -> u64 {
        match self.entry(h) {
            // SAFETY: in-range entry: an 8-aligned u64 inside the allocation, always initialised (zeroed memory).
            Some(p) => unsafe { p.add(self.layout.hash_off).cast::<u64>().read() },
            None => 0,
        }
    }

    /// Last-seen time of entry `h` (0 if `h` is out of range; stale for a free entry).
    #[inline(always)]
    pub(crate) fn last_seen(&self, h: u32) -> u64 {
        match self.entry(h) {
            // SAFETY: as in `hash`.
            Some(p) => unsafe { p.add(self.layout.seen_off).cast::<u64>().read() },
            None => 0,
        }
    }

    /// Sets entry `h`'s last-seen time (ignored if `h` is out of range).
    #[inline(always)]
    pub(crate) fn set_last_seen(&mut self, h: u32, now: u64) {
        if let Some(p) = self.entry(h) {
            // SAFETY: as in `hash`; &mut self gives exclusive access.
            unsafe { p.add(self.layout.seen_off).cast::<u64>().write(now) }
        }
    }

    /// State bytes of entry `h` (empty if `h` is out of range; stale but harmless for a free entry).
    #[inline(always)]
    pub(crate) fn state(&self, h: u32) -> &[u8] {
        match self.entry(h) {
            // SAFETY: the state range of an in-range entry lies inside the allocation; bytes are always initialised
            // (zeroed memory); the borrow is tied to &self, and writes need &mut self.
            Some(p) => unsafe { core::slice::from_raw_parts(p.add(self.layout.state_off), self.layout.state_len) },
            None => &[],
        }
    }

    /// Mutable state bytes of entry `h` (empty if `h` is out of range).
    #[inline(always)]
    pub(crate) fn state_mut(&mut self, h: u32) -> &mut [u8] {
        match self.entry(h) {
            // SAFETY: as in `state`, with exclusive access through &mut self.
            Some(p) => unsafe { core::slice::from_raw_parts_mut(p.add(self.layout.state_off), self.layout.state_len) },
            None => &mut [],
        }
    }

    /// First live entry in `from..end` (scans the bitmap only; `end` is clamped to the capacity).
    pub(crate) fn next_live(&self, from: u32, end: u32) -> Option<u32> {
        let end = end.min(self.capacity);
        if from >= end {
            return None;
        }
        let mut w = (from >> 6) as usize;
        let mut bits = self.live[w] & (!0u64 << (from & 63));
        loop {
            if bits != 0 {
                let h = (w as u32) * 64 + bits.trailing_zeros();
                return (h < end).then_some(h);
            }
            w += 1;
            if w as u32 * 64 >= end {
                return None;
            }
            bits = self.live[w];
        }
    }
}
