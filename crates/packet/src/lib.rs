//! `flowplane-packet`: packet buffers, the per-core buffer pool and the batch.
//!
//! A [`PacketPool`] owns one contiguous, cache-line-aligned region of
//! fixed-size buffers (default 2 KiB, 128 bytes of headroom for encapsulation
//! or SCR history prefixes) and a free list of buffer indices. A [`Batch`]
//! holds up to [`MAX_BATCH`] buffers plus per-packet annotations stored as
//! separate arrays (struct of arrays), so a stage that only needs the flow
//! hashes or the verdicts streams through one dense array.
//!
//! Ownership invariant (what makes the unsafe code in `pool` sound): every
//! buffer index is in exactly one of three places — its pool's free list,
//! one batch position, or *in device* (lent to a port: an RX fill ring or a
//! TX ring, marked by one flag per buffer in the pool). Only this crate moves
//! indices, and a device's returned index is accepted only if it was lent
//! ([`PacketPool::reclaim`], [`Batch::push_from_device`]), so safe code can
//! never alias a buffer, whatever a device hands back. While a buffer is in
//! device, no Rust reference to its bytes exists; the device (kernel, NIC)
//! may write it.
//! Nothing here allocates per packet: pools and batches are sized up front.

mod batch;
mod pool;
pub mod tsc;

pub use batch::{Batch, Lanes, Line, RxTimes, SplitError, Verdict, DROP, MAX_BATCH};
pub use pool::{PacketPool, PoolConfig, PoolError, PoolStats, RegionGuard, REGION_ALIGN};

/// Default buffer size (data room + headroom), as DPDK's default mbuf.
pub const DEFAULT_BUF_SIZE: usize = 2048;
/// Default headroom in front of the packet data.
pub const DEFAULT_HEADROOM: usize = 128;
/// Buffer size for pools no device constrains (the in-memory replay): the
/// default plus one cache line. With a 2048-byte stride every buffer's first
/// data line falls in the same two of a 32 KiB L1's 64 sets, so a burst's
/// 64 packets evict each other's lines before the NFs read them; one extra
/// line per buffer spreads them over every set (DPDK's mempool pads its
/// objects for the same reason). Pools a port registers keep
/// [`DEFAULT_BUF_SIZE`]: AF_XDP's aligned UMEM chunks must be a power of two.
pub const SPREAD_BUF_SIZE: usize = DEFAULT_BUF_SIZE + 64;

/// Software prefetch hints (safe wrappers: a prefetch never faults).
pub mod prefetch {
    /// Hints the CPU to bring the cache line holding `*r` into all cache levels.
    #[inline(always)]
    pub fn read<T: ?Sized>(r: &T) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `prefetcht0` is a hint with no architectural effect; the
        // address comes from a valid reference, and prefetches never fault.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(r as *const T as *const i8)
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = r;
    }

    /// Hints the CPU to bring the line holding address `p` into all cache
    /// levels: for addresses named by an NF's resumable action
    /// (`flowplane_nf::stateful::Step::Prefetch`). Any address is fine, even
    /// a dangling or null one: a prefetch is never dereferenced.
    #[inline(always)]
    pub fn addr(p: *const u8) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `prefetcht0` has no architectural effect and never faults,
        // whatever the address (invalid ones are dropped by the CPU).
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = p;
    }

    /// Hints that the line holding `*r` is about to be written.
    #[inline(always)]
    pub fn write<T: ?Sized>(r: &T) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `read`; `prefetchw` (ET0 hint) is equally side-effect free.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_ET0 }>(r as *const T as *const i8)
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = r;
    }
}
