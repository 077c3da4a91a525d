//! [`Table`]: a plain-data array the UPF's data path indexes at random (the
//! TEID and UE address indexes, the per-core URR counters). From 1 MiB up it
//! lives in its own mapping advised for transparent hugepages before it is
//! first touched, so its pages are 2 MiB when the kernel has them: a heap
//! `Vec` of that size usually reuses memory already faulted in 4 KiB pages,
//! where nearly every random read is also a TLB miss (a page walk, nested
//! under virtualisation) that a prefetch does not hide.

use std::ops::{Deref, DerefMut};

use bytemuck::Pod;
use flowplane_table::HugeArray;

/// Arrays at least this large get their own mapping.
const HUGE_FROM: usize = 1 << 20;

/// An array of `T`, on hugepages when large (see the module docs).
pub enum Table<T: Pod> {
    /// A small array.
    Small(Vec<T>),
    /// A large array in its own mapping.
    Huge(HugeArray<T>),
}

impl<T: Pod> Table<T> {
    /// `n` copies of `x`.
    pub fn filled(n: usize, x: T) -> Table<T> {
        if n.saturating_mul(std::mem::size_of::<T>()) >= HUGE_FROM {
            if let Ok(mut h) = HugeArray::zeroed(n) {
                h.fill(x);
                return Table::Huge(h);
            }
        }
        Table::Small(vec![x; n])
    }

    /// A copy of `s`.
    pub fn from_slice(s: &[T]) -> Table<T> {
        if std::mem::size_of_val(s) >= HUGE_FROM {
            if let Ok(mut h) = HugeArray::zeroed(s.len()) {
                h.copy_from_slice(s);
                return Table::Huge(h);
            }
        }
        Table::Small(s.to_vec())
    }
}

impl<T: Pod> Default for Table<T> {
    fn default() -> Table<T> {
        Table::Small(Vec::new())
    }
}

impl<T: Pod> Deref for Table<T> {
    type Target = [T];
    #[inline(always)]
    fn deref(&self) -> &[T] {
        match self {
            Table::Small(v) => v,
            Table::Huge(h) => h,
        }
    }
}

impl<T: Pod> DerefMut for Table<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Table::Small(v) => v,
            Table::Huge(h) => h,
        }
    }
}

impl<T: Pod> Clone for Table<T> {
    fn clone(&self) -> Table<T> {
        Table::from_slice(self)
    }
}

impl<T: Pod> std::fmt::Debug for Table<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if matches!(self, Table::Huge(_)) { "huge" } else { "small" };
        write!(f, "Table({} x {} bytes, {kind})", self.len(), std::mem::size_of::<T>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_tables_hold_their_values() {
        let s = Table::filled(10, 7u64);
        assert!(matches!(s, Table::Small(_)) && s.iter().all(|&x| x == 7));
        let mut l = Table::filled(HUGE_FROM / 8 + 1, 3u64);
        assert!(matches!(l, Table::Huge(_)));
        assert!(l.iter().all(|&x| x == 3));
        l[5] = 9;
        let c = l.clone();
        assert_eq!((c[5], c[6], c.len()), (9, 3, HUGE_FROM / 8 + 1));
        let v: Vec<u32> = (0..(HUGE_FROM as u32)).collect();
        let t = Table::from_slice(&v);
        assert_eq!(&t[..], &v[..]);
        assert!(format!("{t:?}").contains("huge"));
        assert!(Table::<u8>::default().is_empty());
    }
}
