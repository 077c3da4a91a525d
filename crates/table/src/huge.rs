//! [`HugeArray`]: a zeroed array of plain data on transparent huge pages
//! when the kernel gives them, for NF-private tables read at random (the
//! synthetic NF's chase array, a route table): on 4 KiB pages nearly every
//! such read is also a TLB miss, whose page walk a prefetch cannot hide.
//!
//! [`advise_hugepages`]: the same hint for arrays allocated elsewhere (an
//! NF's compiled rule set, per-rule counters).

use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};

use bytemuck::Pod;

use crate::error::TableError;
use crate::slab::RawMem;

/// `len` values of `T`, zero-initialised, in one mapping advised for 2 MiB
/// pages and backed up front (no page fault later, on the packet path).
pub struct HugeArray<T: Pod> {
    mem: RawMem,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Pod> HugeArray<T> {
    /// `len` zeroes; fails (rather than aborting) when the memory cannot be had.
    pub fn zeroed(len: usize) -> Result<Self, TableError> {
        let bytes = len.checked_mul(core::mem::size_of::<T>()).ok_or(TableError::OutOfMemory { bytes: usize::MAX })?;
        if core::mem::align_of::<T>() > 64 {
            return Err(TableError::InvalidConfig("HugeArray elements must be aligned to at most 64 bytes"));
        }
        // Miri cannot run a MAP_HUGETLB mapping: plain pages there (same code paths otherwise).
        let mut mem = RawMem::new(bytes, !cfg!(miri))?;
        mem.prefault();
        Ok(HugeArray { mem, len, _t: PhantomData })
    }
}

// SAFETY: a shared `&HugeArray` only reads the elements (`Deref` to `&[T]`);
// writing needs `&mut`, so sharing one between threads is sharing a `&[T]`,
// which `T: Sync` allows (as for `Vec<T>`).
unsafe impl<T: Pod + Sync> Sync for HugeArray<T> {}

impl<T: Pod> Deref for HugeArray<T> {
    type Target = [T];
    #[inline(always)]
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds at least len * size_of::<T>() bytes (RawMem rounds up), is 64-byte aligned
        // (>= align_of::<T>(), checked in `zeroed`), zero-initialised (a valid T: Pod implies Zeroable) and only
        // ever written through `&mut self` as T values; the borrow of `self` bounds the slice's lifetime.
        unsafe { core::slice::from_raw_parts(self.mem.ptr().cast::<T>(), self.len) }
    }
}

impl<T: Pod> DerefMut for HugeArray<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes the access exclusive.
        unsafe { core::slice::from_raw_parts_mut(self.mem.ptr().cast::<T>(), self.len) }
    }
}

impl<T: Pod> core::fmt::Debug for HugeArray<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "HugeArray({} x {} bytes)", self.len, core::mem::size_of::<T>())
    }
}

/// 2 MiB: the transparent hugepage size on x86-64.
const HUGE: usize = 2 << 20;

/// Asks the kernel to back the whole 2 MiB pages inside `s` with
/// transparent hugepages (`MADV_HUGEPAGE`) and to collapse them now
/// (`MADV_COLLAPSE`, Linux 6.1+). A hint: the contents never change, and
/// failure (an older kernel, no THP, a small array) only costs TLB misses.
pub fn advise_hugepages<T>(s: &[T]) {
    advise_range(s.as_ptr() as usize, std::mem::size_of_val(s));
}

/// [`advise_hugepages`] for `bytes` bytes at address `start` of an allocation the caller owns (memory not
/// initialised yet, as a map's reserved slab): the hint neither reads nor writes it.
pub(crate) fn advise_range(start: usize, bytes: usize) {
    let end = start + bytes;
    let (a, b) = (start.next_multiple_of(HUGE), end & !(HUGE - 1));
    if b <= a || cfg!(miri) {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: [a, b) lies inside the allocation the caller owns and keeps
    // alive for the call; MADV_HUGEPAGE and MADV_COLLAPSE change only
    // the size of the pages backing the range, never its contents, mapping or
    // permissions, so no reference into it is invalidated.
    unsafe {
        libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE);
        libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_COLLAPSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Miri checks the unsafe views on a small array (it interprets every access).
    const N: usize = if cfg!(miri) { 4096 } else { 3 << 20 };

    #[test]
    fn zeroed_writable_and_sized() {
        let mut a = HugeArray::<u32>::zeroed(N).unwrap();
        assert_eq!(a.len(), N);
        assert!(a.iter().all(|&x| x == 0));
        for (i, x) in a.iter_mut().enumerate() {
            *x = i as u32;
        }
        a.swap(0, N - 1);
        assert_eq!((a[0], a[N - 1], a[7]), (N as u32 - 1, 0, 7));
        assert!(HugeArray::<u64>::zeroed(0).unwrap().is_empty());
        assert!(HugeArray::<u64>::zeroed(usize::MAX).is_err());
        let _ = format!("{a:?}");
    }

    #[test]
    fn hints_leave_contents_alone() {
        let v: Vec<u64> = (0..N as u64 / 8).collect();
        advise_hugepages(&v);
        advise_hugepages(&v[..3]);
        advise_hugepages::<u8>(&[]);
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
    }
}
