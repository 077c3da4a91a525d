//! Typed views of one NF's state across a table's entries.
//!
//! An executor runs one NF over a batch: for each packet, the NF's state sits
//! at the same offset of the packet's entry. [`FlowTable::state_as_mut`] checks
//! the offset, the size and the alignment on every call; a [`StatesMut`] checks
//! them once, when it is made, and then reaches entry `h`'s state with a range
//! check on `h` and an address computation (a batch pass of a six-NF chain
//! makes six such passes per packet).

use core::marker::PhantomData;
use core::mem::{align_of, size_of};

use bytemuck::Pod;

use crate::flow_table::{FlowTable, Handle};
use crate::key::FlowKey;

/// Exclusive, typed access to the `S` at one offset of every entry's state.
/// Borrows the table mutably: nothing else touches it while the view lives.
pub struct StatesMut<'a, S> {
    /// Entry 0's `S` (dangling and never read when `capacity` is 0).
    base: *mut u8,
    /// Bytes from one entry to the next.
    stride: usize,
    /// Entries in range: `get_mut(h)` for `h >= capacity` is `None`.
    capacity: u32,
    _borrow: PhantomData<&'a mut S>,
}

impl<S: Pod> StatesMut<'_, S> {
    /// A view with no entries: every handle is out of range.
    pub fn empty() -> Self {
        StatesMut {
            base: core::ptr::NonNull::<S>::dangling().as_ptr().cast(),
            stride: 0,
            capacity: 0,
            _borrow: PhantomData,
        }
    }

    /// Entry `h`'s `S` (stale but harmless for a free entry), or `None` when `h` is out of range.
    #[inline(always)]
    pub fn get_mut(&mut self, h: Handle) -> Option<&mut S> {
        if h < self.capacity {
            // SAFETY: `h < capacity`, so the address lies inside the slab's allocation at an
            // `S` that `FlowTable::states_mut` checked to fit inside the entry's state and
            // to be aligned for `S` (base and stride are multiples of its alignment); the
            // bytes are initialised (zeroed memory) and `S: Pod` accepts any bit pattern.
            // The result borrows `self` mutably, and `self` borrows the table mutably:
            // no other reference to these bytes exists meanwhile.
            Some(unsafe { &mut *self.base.add(h as usize * self.stride).cast::<S>() })
        } else {
            None
        }
    }

    /// Entry `h`'s `S`, read-only (e.g. for a prefetch hook), or `None` when `h` is out of range.
    #[inline(always)]
    pub fn get(&self, h: Handle) -> Option<&S> {
        if h < self.capacity {
            // SAFETY: as in `get_mut`; shared, and no `&mut` from this view can be alive
            // while `&self` is borrowed.
            Some(unsafe { &*self.base.add(h as usize * self.stride).cast::<S>() })
        } else {
            None
        }
    }
}

impl<K: FlowKey> FlowTable<K> {
    /// The `S` at byte `offset` of every entry's state, checked once: `None` if
    /// it does not fit in the state or is not aligned for `S`.
    pub fn states_mut<S: Pod>(&mut self, offset: usize) -> Option<StatesMut<'_, S>> {
        let layout = self.slab.layout;
        let end = offset.checked_add(size_of::<S>())?;
        if end > layout.state_len {
            return None;
        }
        let at = layout.state_off + offset;
        let base = self.slab.entry_ptr(0).wrapping_add(at);
        if !(base as usize).is_multiple_of(align_of::<S>()) || !layout.size.is_multiple_of(align_of::<S>()) {
            return None;
        }
        Some(StatesMut { base, stride: layout.size, capacity: self.slab.capacity(), _borrow: PhantomData })
    }
}

#[cfg(test)]
mod tests {
    use crate::flow_table::{FlowTable, FullPolicy, Layout, TableConfig};

    fn table(state_size: usize, layout: Layout) -> FlowTable<u64> {
        FlowTable::new(TableConfig {
            capacity: 64,
            state_size,
            idle_timeout_ns: None,
            full_policy: FullPolicy::Reject,
            hugepages: false,
            layout,
        })
        .unwrap()
    }

    #[test]
    fn view_reaches_the_same_bytes_as_state_as_mut() {
        for layout in [Layout::Bucketed, Layout::Inline] {
            view_reaches_the_same_bytes(layout);
        }
    }

    fn view_reaches_the_same_bytes(layout: Layout) {
        let mut t = table(24, layout);
        let hs: Vec<u32> =
            (0..10u64).map(|k| t.insert(&k, k.wrapping_mul(0x9e37_79b9), 0, |_| {}).unwrap().0).collect();
        {
            let mut v = t.states_mut::<u64>(8).unwrap();
            for (k, &h) in hs.iter().enumerate() {
                *v.get_mut(h).unwrap() = 1000 + k as u64;
            }
            assert_eq!(v.get(hs[3]).copied(), Some(1003));
        }
        for (k, &h) in hs.iter().enumerate() {
            assert_eq!(*t.state_as::<u64>(h, 8).unwrap(), 1000 + k as u64);
            assert_eq!(*t.state_as::<u64>(h, 0).unwrap(), 0, "the neighbouring field is untouched");
        }
    }

    #[test]
    fn out_of_range_handles_and_offsets_are_refused() {
        let mut t = table(16, Layout::Bucketed);
        let state_len = t.state_len();
        assert!(t.states_mut::<u64>(state_len - 8).is_some());
        assert!(t.states_mut::<u64>(state_len - 7).is_none(), "past the state");
        assert!(t.states_mut::<u64>(usize::MAX).is_none(), "offset overflow");
        assert!(t.states_mut::<u64>(4).is_none(), "misaligned for u64");
        assert!(t.states_mut::<u32>(4).is_some());
        let mut v = t.states_mut::<u64>(0).unwrap();
        assert!(v.get_mut(64).is_none() && v.get(u32::MAX).is_none());
        let mut e = super::StatesMut::<u64>::empty();
        assert!(e.get_mut(0).is_none() && e.get(0).is_none());
    }
}
