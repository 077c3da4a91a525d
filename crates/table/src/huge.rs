//! [`HugeArray`]: a zeroed array of plain data on transparent huge pages
//! when the kernel gives them, for NF-private tables read at random (the
//! synthetic NF's chase array, a route table): on 4 KiB pages nearly every
//! such read is also a TLB miss, whose page walk a prefetch cannot hide.

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
        let mut mem = RawMem::new(bytes, true)?;
        mem.prefault();
        Ok(HugeArray { mem, len, _t: PhantomData })
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_writable_and_sized() {
        let mut a = HugeArray::<u32>::zeroed(3 << 20).unwrap();
        assert_eq!(a.len(), 3 << 20);
        assert!(a.iter().all(|&x| x == 0));
        for (i, x) in a.iter_mut().enumerate() {
            *x = i as u32;
        }
        a.swap(0, (3 << 20) - 1);
        assert_eq!((a[0], a[(3 << 20) - 1], a[7]), ((3 << 20) - 1, 0, 7));
        assert!(HugeArray::<u64>::zeroed(0).unwrap().is_empty());
        assert!(HugeArray::<u64>::zeroed(usize::MAX).is_err());
        let _ = format!("{a:?}");
    }
}
