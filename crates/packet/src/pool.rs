//! The per-core buffer pool: one page-aligned region, a LIFO free list.
//!
//! LIFO reuse keeps recently freed (cache-hot) buffers in circulation, which
//! is what makes the replay source's RX copy land in L1/L2 in steady state.
//!
//! A buffer may also be *in device*: lent to a port (an AF_XDP fill or TX
//! ring, a NIC descriptor) and reclaimed when the device gives it back.
//! The pool keeps one flag per buffer for that state, so an index a device
//! hands back is accepted only if it was lent (a bogus or repeated index
//! from a device can never create a second owner). The region is
//! page-aligned so a device can register it whole (AF_XDP's UMEM is this
//! region: no copy between the device's memory and the pool).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::{DEFAULT_BUF_SIZE, DEFAULT_HEADROOM};

/// Pool geometry, fixed at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Number of buffers.
    pub buffers: usize,
    /// Bytes per buffer, headroom included; a multiple of 64.
    pub buf_size: usize,
    /// Bytes reserved in front of the data for prepending headers.
    pub headroom: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig { buffers: 4096, buf_size: DEFAULT_BUF_SIZE, headroom: DEFAULT_HEADROOM }
    }
}

/// Why a pool could not be created or a buffer not be returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolError {
    /// Geometry is invalid (zero buffers, size not a multiple of 64, headroom too large, > 2^32 buffers).
    BadConfig,
    /// The allocator refused the region.
    OutOfMemory,
    /// A batch was returned to a pool it does not belong to.
    ForeignBatch,
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PoolError::BadConfig => "invalid packet pool configuration",
            PoolError::OutOfMemory => "cannot allocate packet pool memory",
            PoolError::ForeignBatch => "batch belongs to another packet pool",
        })
    }
}

impl std::error::Error for PoolError {}

/// The buffer memory, shared (read-only metadata) between a pool and its batches.
pub(crate) struct PoolMem {
    base: NonNull<u8>,
    /// The allocation to free on drop; None for a device's region (not ours to free).
    layout: Option<Layout>,
    pub(crate) buf_size: usize,
    pub(crate) headroom: usize,
    pub(crate) count: usize,
    /// Packet data never starts before this offset in a buffer, nor ends past
    /// `ceil` (a device's buffer holds its own header and trailer around the data).
    pub(crate) floor: usize,
    pub(crate) ceil: usize,
}

// SAFETY: `PoolMem` is a plain memory region; all access to buffer bytes goes
// through batches that own the buffer index exclusively (crate invariant), so
// sharing the region pointer between threads cannot create data races.
unsafe impl Send for PoolMem {}
// SAFETY: see `Send`: the region itself is never accessed through `&PoolMem`
// except via uniquely owned buffer indices.
unsafe impl Sync for PoolMem {}

impl PoolMem {
    /// Pointer to the first byte of buffer `idx`.
    ///
    /// # Safety
    /// `idx < self.count`: buffer indices come from the pool's free list, which only ever holds
    /// indices below `count`. (The result may then be used for `buf_size` bytes by the buffer's owner.)
    #[inline(always)]
    pub(crate) unsafe fn buf_ptr(&self, idx: u32) -> *mut u8 {
        debug_assert!((idx as usize) < self.count);
        // SAFETY: idx < count (the caller's contract), so the offset stays inside the
        // allocation of count * buf_size bytes.
        unsafe { self.base.as_ptr().add(idx as usize * self.buf_size) }
    }
}

impl Drop for PoolMem {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: `base` was allocated in `PacketPool::new` with exactly `layout`.
            unsafe { dealloc(self.base.as_ptr(), layout) }
        }
    }
}

/// Alignment of the pool's region: a page, so a device can register it (AF_XDP UMEM).
pub const REGION_ALIGN: usize = 4096;

/// Keeps a pool's region allocated (see [`PacketPool::region_guard`]).
pub struct RegionGuard(#[allow(dead_code)] Arc<PoolMem>);

impl fmt::Debug for RegionGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RegionGuard")
    }
}

/// Counters of a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers in the pool.
    pub buffers: usize,
    /// Buffers currently free.
    pub free: usize,
    /// Buffers lent to a device (RX fill or TX in flight).
    pub in_device: usize,
    /// Allocation requests that could not be fully served (pool empty).
    pub alloc_failures: u64,
}

/// A per-core pool of fixed-size packet buffers.
pub struct PacketPool {
    pub(crate) mem: Arc<PoolMem>,
    free: Vec<u32>,
    alloc_failures: u64,
    /// One flag per buffer: lent to a device. A byte, not a bit: a burst's
    /// buffers are often neighbours, and bits in one word made each packet's
    /// update wait for the previous one's store (a read-modify-write chain).
    lent: Vec<bool>,
    in_device: usize,
}

impl PacketPool {
    /// Allocates `cfg.buffers` buffers of `cfg.buf_size` bytes, page-aligned and zeroed.
    pub fn new(cfg: PoolConfig) -> Result<Self, PoolError> {
        if cfg.buffers == 0
            || cfg.buffers > u32::MAX as usize
            || cfg.buf_size == 0
            || !cfg.buf_size.is_multiple_of(64)
            || cfg.buf_size > u16::MAX as usize
            || cfg.headroom >= cfg.buf_size
        {
            return Err(PoolError::BadConfig);
        }
        let bytes = cfg.buffers.checked_mul(cfg.buf_size).ok_or(PoolError::BadConfig)?;
        let layout = Layout::from_size_align(bytes, REGION_ALIGN).map_err(|_| PoolError::BadConfig)?;
        // SAFETY: layout has non-zero size (buffers > 0, buf_size > 0).
        let raw = unsafe { alloc_zeroed(layout) };
        let base = NonNull::new(raw).ok_or(PoolError::OutOfMemory)?;
        let mem = Arc::new(PoolMem {
            base,
            layout: Some(layout),
            buf_size: cfg.buf_size,
            headroom: cfg.headroom,
            count: cfg.buffers,
            floor: 0,
            ceil: cfg.buf_size,
        });
        // Highest index at the bottom so buffer 0 is handed out first.
        let free = (0..cfg.buffers as u32).rev().collect();
        let lent = vec![false; cfg.buffers];
        Ok(PacketPool { mem, free, alloc_failures: 0, lent, in_device: 0 })
    }

    /// Backs the pool's whole region with memory now (one write per 4 KiB
    /// page), so that no page fault lands on the packet path later. For paced
    /// and live runs, where a fault is a stall that overflows the receive
    /// ring: the region comes from `alloc_zeroed`, which the kernel backs only
    /// on first touch (tens of microseconds per fault inside a VM). Does
    /// nothing for a pool over a device's region, or while any buffer is out
    /// of the pool (someone else may be writing it).
    pub fn prefault(&mut self) {
        let Some(layout) = self.mem.layout else { return };
        if self.free.len() != self.mem.count {
            return;
        }
        let base = self.mem.base.as_ptr();
        for off in (0..layout.size()).step_by(4096) {
            // SAFETY: off < layout.size(), inside the region `new` allocated with `layout` (kept alive by
            // `self.mem`); the region is initialised (zeroed, then only written through buffers); every buffer is
            // in the free list and `&mut self` is exclusive, so no one else reads or writes the byte meanwhile.
            unsafe {
                let b = base.add(off);
                b.write_volatile(b.read_volatile());
            }
        }
    }

    /// A pool over a device's own buffer region (a DPDK mempool of mbufs):
    /// `count` buffers of `stride` bytes from `base`, every one of them *in
    /// device* at the start (the device hands them out with each receive and
    /// takes them back through [`PacketPool::lend`]). Packet data stays within
    /// `floor..ceil` of its buffer (the device's own header before it, its
    /// trailer after): `Batch::prepend` and `set_len` refuse to cross them.
    /// Nothing is freed on drop.
    ///
    /// # Safety
    /// `base .. base + count * stride` must be valid for reads and writes for
    /// as long as the pool or any batch over it lives (a DPDK mempool lives
    /// until the process ends), and not be accessed by Rust code except
    /// through this pool, nor the bytes outside `floor..ceil` of each buffer
    /// by anyone but the device.
    pub unsafe fn from_device_region(
        base: NonNull<u8>,
        count: usize,
        stride: usize,
        floor: usize,
        ceil: usize,
    ) -> Result<Self, PoolError> {
        if count == 0
            || count > u32::MAX as usize
            || stride == 0
            || !stride.is_multiple_of(64)
            || stride > u16::MAX as usize
            || floor >= ceil
            || ceil > stride
        {
            return Err(PoolError::BadConfig);
        }
        let headroom = (floor + crate::DEFAULT_HEADROOM).min(ceil - 1);
        let mem = Arc::new(PoolMem { base, layout: None, buf_size: stride, headroom, count, floor, ceil });
        let lent = vec![true; count];
        Ok(PacketPool { mem, free: Vec::with_capacity(count), alloc_failures: 0, lent, in_device: count })
    }

    /// True for a pool over a device's own region ([`PacketPool::from_device_region`]).
    pub fn is_device_region(&self) -> bool {
        self.mem.layout.is_none()
    }

    /// Bytes per buffer.
    pub fn buf_size(&self) -> usize {
        self.mem.buf_size
    }

    /// Headroom given to freshly allocated packets.
    pub fn headroom(&self) -> usize {
        self.mem.headroom
    }

    /// Maximum packet data a fresh buffer can hold (buffer size minus headroom).
    pub fn data_room(&self) -> usize {
        self.mem.ceil - self.mem.headroom
    }

    /// Counters.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            buffers: self.mem.count,
            free: self.free.len(),
            in_device: self.in_device,
            alloc_failures: self.alloc_failures,
        }
    }

    /// Takes one free buffer index, if any.
    #[inline(always)]
    pub(crate) fn pop(&mut self) -> Option<u32> {
        let r = self.free.pop();
        if r.is_none() {
            self.alloc_failures += 1;
        }
        r
    }

    /// Takes `out.len()` free buffer indices at once, or none (returns false,
    /// counting one failure) if the pool holds fewer.
    #[inline(always)]
    pub(crate) fn pop_bulk(&mut self, out: &mut [u32]) -> bool {
        let n = out.len();
        let have = self.free.len();
        if have < n {
            self.alloc_failures += 1;
            return false;
        }
        out.copy_from_slice(&self.free[have - n..]);
        self.free.truncate(have - n);
        true
    }

    /// Returns many buffer indices at once.
    #[inline(always)]
    pub(crate) fn push_bulk(&mut self, idx: &[u32]) {
        debug_assert!(self.free.len() + idx.len() <= self.mem.count, "double free");
        self.free.extend_from_slice(idx);
    }

    /// Counts a request the pool could not fully serve.
    #[inline(always)]
    pub(crate) fn note_shortfall(&mut self) {
        self.alloc_failures += 1;
    }

    /// Free buffers right now.
    #[inline(always)]
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Returns a buffer index to the free list.
    #[inline(always)]
    pub(crate) fn push(&mut self, idx: u32) {
        debug_assert!(self.free.len() < self.mem.count, "double free of buffer {idx}");
        // Capacity was reserved for every buffer at creation: never reallocates.
        self.free.push(idx);
    }

    /// Lends up to `out.len()` free buffers to a device (an RX fill ring);
    /// returns how many were written to `out`. They stay the device's until
    /// [`PacketPool::reclaim`] or a batch's `push_from_device` takes them back.
    pub fn lend(&mut self, out: &mut [u32]) -> usize {
        let n = out.len().min(self.free.len());
        let have = self.free.len();
        out[..n].copy_from_slice(&self.free[have - n..]);
        self.free.truncate(have - n);
        for &i in &out[..n] {
            self.mark_lent(i);
        }
        n
    }

    /// A lent buffer comes back unused (TX completion, teardown): onto the
    /// free list. False — and nothing changes — if `idx` was not lent.
    pub fn reclaim(&mut self, idx: u32) -> bool {
        if !self.take_lent(idx) {
            return false;
        }
        self.free.push(idx);
        true
    }

    /// Clears `idx`'s lent flag if it was set (the device hands it back).
    #[inline(always)]
    pub(crate) fn take_lent(&mut self, idx: u32) -> bool {
        let taken = self.clear_lent(idx);
        self.in_device -= usize::from(taken);
        taken
    }

    /// [`PacketPool::take_lent`] without the count: a burst adjusts it once
    /// ([`PacketPool::note_taken`]), so no packet waits on the previous one's update.
    #[inline(always)]
    pub(crate) fn clear_lent(&mut self, idx: u32) -> bool {
        match self.lent.get_mut(idx as usize) {
            Some(f) if *f => {
                *f = false;
                true
            }
            _ => false,
        }
    }

    /// `n` buffers left the device through [`PacketPool::clear_lent`].
    #[inline(always)]
    pub(crate) fn note_taken(&mut self, n: usize) {
        self.in_device -= n;
    }

    /// Marks an owned index as lent to a device.
    #[inline(always)]
    pub(crate) fn mark_lent(&mut self, idx: u32) {
        self.lent[idx as usize] = true;
        self.in_device += 1;
    }

    /// Marks owned indices as lent to a device (a transmit burst).
    #[inline(always)]
    pub(crate) fn mark_lent_bulk(&mut self, idx: &[u32]) {
        for &i in idx {
            self.lent[i as usize] = true;
        }
        self.in_device += idx.len();
    }

    /// Buffers lent to a device now.
    pub fn in_device(&self) -> usize {
        self.in_device
    }

    /// Offset of buffer `idx` in the region (an AF_XDP UMEM address), or
    /// None if `idx` is not a buffer of this pool.
    pub fn addr_of(&self, idx: u32) -> Option<u64> {
        ((idx as usize) < self.mem.count).then(|| idx as u64 * self.mem.buf_size as u64)
    }

    /// The buffer holding region offset `addr` (a device may hand back an
    /// address inside the buffer), or None if it is outside the region.
    pub fn index_of(&self, addr: u64) -> Option<u32> {
        let i = addr / self.mem.buf_size as u64;
        (i < self.mem.count as u64).then_some(i as u32)
    }

    /// The region's start and length, for registering it with a device.
    /// Only lent buffers may be touched through it (by the device).
    pub fn region(&self) -> (*mut u8, usize) {
        (self.mem.base.as_ptr(), self.mem.count * self.mem.buf_size)
    }

    /// A handle that keeps the region mapped while a device may still write
    /// it (hold it until the device is closed; the pool may be dropped first).
    pub fn region_guard(&self) -> RegionGuard {
        RegionGuard(Arc::clone(&self.mem))
    }

    pub(crate) fn same_pool(&self, mem: &Arc<PoolMem>) -> bool {
        Arc::ptr_eq(&self.mem, mem)
    }
}

impl fmt::Debug for PacketPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacketPool")
            .field("buffers", &self.mem.count)
            .field("buf_size", &self.mem.buf_size)
            .field("free", &self.free.len())
            .finish()
    }
}

#[cfg(test)]
mod prefault_tests {
    use super::*;

    #[test]
    fn prefault_keeps_the_region_zeroed_and_skips_pools_with_buffers_out() {
        let mut p =
            PacketPool::new(PoolConfig { buffers: if cfg!(miri) { 8 } else { 4096 }, ..Default::default() }).unwrap();
        p.prefault();
        let (base, len) = p.region();
        // SAFETY: region() is the pool's live allocation of `len` initialised bytes, and nothing writes it meanwhile.
        let bytes = unsafe { core::slice::from_raw_parts(base, len) };
        assert!(bytes.iter().all(|&b| b == 0));
        assert_eq!(p.stats().free, p.stats().buffers);
        // A buffer lent to a device: the pool leaves its region alone (the device may be writing it).
        let mut out = [0u32; 1];
        assert_eq!(p.lend(&mut out), 1);
        p.prefault();
        assert!(p.reclaim(out[0]));
        assert_eq!(p.stats().free, p.stats().buffers);
    }
}
