//! [`FixedMap`]: the fixed-capacity hash map NFs keep private per-core state in
//! (fw's connections, conntrack's connections, amf's UE contexts, ...).
//!
//! Layout: an **open-addressing index over a slab**. The index is a power of
//! two (at least twice the capacity, so at most half full) of `u64` words
//! `hash << 32 | (slot + 1)` (0: empty), probed linearly from `hash & mask`;
//! the slab holds `capacity` entries `value | key` (in that order, `repr(C)`:
//! a value aligned to 64 bytes starts its entry's first cache line, the key
//! follows). Why not inline entries or buckets (as [`crate::FlowTable`]):
//! * **stable slots**: an entry never moves while it lives, so a flow's state
//!   can name its entry by slot (fw binds each direction to its connection
//!   by slot and generation; the prefetch hook fetches it packets ahead), and
//!   side arrays can be indexed by slot (SCR's variable-size states);
//! * the index word carries 32 hash bits, so a probe reads the slab only on a
//!   hash match: a lookup costs one index line plus the entry's line;
//! * deletion is a **backward shift** of the index words (no tombstones):
//!   probe sequences stay as short under churn as after a fresh build, and
//!   the index never needs a rebuild.
//!
//! All memory is taken at construction: the index (zeroed by the allocator,
//! so its pages are touched only as used), the slab (one allocation aligned
//! to a cache line whatever the entry's alignment: a 32-byte entry never
//! straddles two lines, so a lookup reads one index line and one entry
//! line — the UPF's TEID index relies on it) and the free list's
//! capacity (entries are written the first time their slot is used, never
//! moved or reallocated) and a live bitmap. Nothing allocates afterwards; an
//! insert into a full map returns [`TableError::Full`] (it never grows, never
//! panics). Index and slab get the transparent-hugepage hint (both are read
//! at random; on 4 KiB pages nearly every such read is also a TLB miss).
//!
//! Determinism: slots are handed out lowest-unused-first, then freed slots
//! last-in-first-out; iteration and the idle [`FixedMap::sweep`] go in slot
//! order. The same operations therefore give the same slots, the same
//! iteration order and the same sweep victims on every machine (nothing
//! depends on addresses or a random seed; the hash is the caller's).
//!
//! Keys and values are `Copy` (plain data): a removed entry's bytes stay in
//! its slot until the slot is reused, which [`FixedMap::peek_at`] exposes for
//! generation checks (see fw) and prefetch hints.

use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};
use core::ptr::NonNull;
use std::alloc::Layout;

use crate::error::TableError;

/// The hash of a key as the map uses it: the caller chooses it (a flow hash
/// with a seed, a multiplicative hash of an integer id). The map takes the
/// home index position from the low bits and compares all 32 bits before it
/// reads an entry, so the bits must be well mixed throughout.
pub trait KeyHash<K> {
    /// The 32-bit hash of `key`.
    fn hash(key: &K) -> u32;

    /// The hash of `key` keyed by `secret` (a run's random secret, [`FixedMap::set_secret`]): keys that
    /// collide under it cannot be computed without the secret. Secret 0 must give [`KeyHash::hash`].
    /// Default: [`KeyHash::hash`] (a hash of ids the map's owner hands out, not of keys others choose).
    #[inline(always)]
    fn hash_keyed(key: &K, _secret: u32) -> u32 {
        Self::hash(key)
    }
}

/// Fibonacci hashing of integer keys (ids, packed addresses): the product's
/// bits 32..64, so keys allocated in sequence spread over the index.
#[derive(Clone, Copy, Debug, Default)]
pub struct FibHash;

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl KeyHash<u64> for FibHash {
    #[inline(always)]
    fn hash(key: &u64) -> u32 {
        (key.wrapping_mul(GOLDEN) >> 32) as u32
    }
}

impl KeyHash<u32> for FibHash {
    #[inline(always)]
    fn hash(key: &u32) -> u32 {
        <FibHash as KeyHash<u64>>::hash(&u64::from(*key))
    }
}

impl KeyHash<u128> for FibHash {
    #[inline(always)]
    fn hash(key: &u128) -> u32 {
        let x = (*key as u64) ^ ((*key >> 64) as u64).rotate_left(29);
        <FibHash as KeyHash<u64>>::hash(&x)
    }
}

/// One slab entry: the value first (so an NF's hot fields can fill the first cache line), then the key.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct Entry<K, V> {
    value: V,
    key: K,
}

/// The slab's storage: room for `cap` entries in one allocation aligned to at least 64 bytes (a `Vec` is
/// aligned only to its element, so entries of 32 bytes from `malloc` (16 mod 64) would straddle lines);
/// entries `0..len` are initialised, written only by [`Slab::push`] or through the slice.
struct Slab<E> {
    ptr: NonNull<E>,
    cap: usize,
    len: usize,
}

// SAFETY: a Slab uniquely owns its entries (like a `Vec<E>`): sending it sends the entries, sharing it shares `&[E]`.
unsafe impl<E: Send> Send for Slab<E> {}
// SAFETY: as above; `&Slab` gives only `&[E]`.
unsafe impl<E: Sync> Sync for Slab<E> {}

impl<E: Copy> Slab<E> {
    fn layout(cap: usize) -> Option<Layout> {
        let bytes = cap.checked_mul(size_of::<E>())?;
        Layout::from_size_align(bytes, align_of::<E>().max(64)).ok()
    }

    fn with_capacity(cap: usize) -> Result<Self, TableError> {
        let oom = TableError::OutOfMemory { bytes: cap.saturating_mul(size_of::<E>()) };
        let layout = Self::layout(cap).ok_or(oom.clone())?;
        let ptr = if layout.size() == 0 {
            NonNull::dangling()
        } else {
            // SAFETY: the layout's size is non-zero (checked above).
            NonNull::new(unsafe { std::alloc::alloc(layout) }.cast::<E>()).ok_or(oom)?
        };
        Ok(Slab { ptr, cap, len: 0 })
    }

    /// Appends `e`; the caller keeps `len < cap` (checked: a full slab panics rather than writing out of bounds).
    #[inline]
    fn push(&mut self, e: E) {
        assert!(self.len < self.cap, "FixedMap slab overflow");
        // SAFETY: len < cap, so the slot lies inside the allocation (or E is zero-sized); writing an
        // uninitialised slot with `write` drops nothing.
        unsafe { self.ptr.as_ptr().add(self.len).write(e) };
        self.len += 1;
    }

    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.cap
    }

    /// The whole allocation as bytes' address range, for the hugepage hint (no entry is read).
    fn span(&self) -> (usize, usize) {
        (self.ptr.as_ptr() as usize, self.cap * size_of::<E>())
    }
}

impl<E> Deref for Slab<E> {
    type Target = [E];
    #[inline(always)]
    fn deref(&self) -> &[E] {
        // SAFETY: entries 0..len were written by `push` and are never uninitialised again; the pointer is
        // aligned for E and valid for `cap >= len` entries while `self` lives.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<E> DerefMut for Slab<E> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [E] {
        // SAFETY: as in `deref`; `&mut self` makes the access exclusive.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<E> Drop for Slab<E> {
    fn drop(&mut self) {
        let size = self.cap * size_of::<E>();
        if size != 0 {
            // Entries are Copy (no destructor): only the memory is released, with the layout it was taken with.
            // SAFETY: ptr was allocated in `with_capacity` with exactly this size and alignment.
            unsafe {
                std::alloc::dealloc(
                    self.ptr.as_ptr().cast(),
                    Layout::from_size_align_unchecked(size, align_of::<E>().max(64)),
                )
            };
        }
    }
}

impl<E: Copy> Slab<E> {
    /// A copy with the same capacity.
    fn try_clone(&self) -> Self {
        let mut c = Slab::with_capacity(self.cap).expect("FixedMap clone: cannot allocate the slab");
        for &e in self.iter() {
            c.push(e);
        }
        c
    }
}

/// Largest capacity: slots are stored as `slot + 1` in 32 bits.
pub const FIXED_MAP_MAX: usize = (u32::MAX - 1) as usize;

/// A fixed-capacity hash map from `K` to `V`, hashed by `H` (see the module docs).
pub struct FixedMap<K, V, H> {
    /// `hash << 32 | (slot + 1)`; 0 = empty. At most half full.
    index: Vec<u64>,
    mask: usize,
    /// Entries ever used (`len()` is the high-water mark); capacity `cap`, never reallocated.
    slab: Slab<Entry<K, V>>,
    /// One bit per slot: the slot holds a live entry.
    live: Vec<u64>,
    /// Freed slots, reused last-in-first-out (capacity `cap`).
    free: Vec<u32>,
    cap: usize,
    len: usize,
    /// Next slot the sweep looks at.
    cursor: usize,
    /// The hash's secret ([`KeyHash::hash_keyed`]; 0: unkeyed).
    secret: u32,
    _h: PhantomData<fn() -> H>,
}

impl<K: Copy + Eq, V: Copy, H: KeyHash<K>> FixedMap<K, V, H> {
    /// A map for `capacity` entries (1..=[`FIXED_MAP_MAX`]), all memory taken now.
    pub fn new(capacity: usize) -> Result<Self, TableError> {
        if capacity == 0 || capacity > FIXED_MAP_MAX {
            return Err(TableError::InvalidConfig("FixedMap capacity must be in 1..=2^32-2"));
        }
        let slots = capacity
            .checked_mul(2)
            .and_then(usize::checked_next_power_of_two)
            .ok_or(TableError::OutOfMemory { bytes: usize::MAX })?
            .max(16);
        let oom = |bytes: usize| TableError::OutOfMemory { bytes };
        let slab = Slab::with_capacity(capacity)?;
        let mut free = Vec::new();
        free.try_reserve_exact(capacity).map_err(|_| oom(capacity.saturating_mul(4)))?;
        // Zeroed words come from calloc: the index's pages are touched only when used.
        let index = vec![0u64; slots];
        let live = vec![0u64; capacity.div_ceil(64)];
        // Both read at random: ask for hugepages (the slab's pages fault in as slots are first used).
        crate::huge::advise_hugepages(&index);
        let (at, bytes) = slab.span();
        crate::huge::advise_range(at, bytes);
        Ok(FixedMap {
            index,
            mask: slots - 1,
            slab,
            live,
            free,
            cap: capacity,
            len: 0,
            cursor: 0,
            secret: 0,
            _h: PhantomData,
        })
    }

    /// The most entries the map holds.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Live entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// No live entry.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every slot is taken: inserting a new key fails.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.len == self.cap
    }

    /// Slots used at least once (slots `0..high_water()` are the ones [`Self::peek_at`] and the sweep see).
    #[inline]
    pub fn high_water(&self) -> usize {
        self.slab.len()
    }

    /// `H`'s unkeyed hash of `key` (what the map uses before [`Self::set_secret`]).
    #[inline(always)]
    pub fn hash(key: &K) -> u32 {
        H::hash(key)
    }

    /// The hash this map files `key` under ([`KeyHash::hash_keyed`] with its secret): what
    /// [`Self::find_hashed`], [`Self::insert_new_hashed`] and the prefetch hints take.
    #[inline(always)]
    pub fn hash_of(&self, key: &K) -> u32 {
        H::hash_keyed(key, self.secret)
    }

    /// Keys the map's hash with `secret` (a run's random secret). Only while the map is empty (every entry is
    /// filed under its hash): false, and nothing changed, otherwise.
    pub fn set_secret(&mut self, secret: u32) -> bool {
        if self.len != 0 || !self.slab.is_empty() {
            return false;
        }
        self.secret = secret;
        true
    }

    #[inline(always)]
    fn is_live(&self, slot: usize) -> bool {
        self.live.get(slot / 64).is_some_and(|w| w >> (slot % 64) & 1 != 0)
    }

    #[inline(always)]
    fn set_live(&mut self, slot: usize, on: bool) {
        let w = &mut self.live[slot / 64];
        if on {
            *w |= 1 << (slot % 64);
        } else {
            *w &= !(1 << (slot % 64));
        }
    }

    /// Index position and slot of `key` (hash `h`).
    #[inline(always)]
    fn find_pos(&self, h: u32, key: &K) -> Option<(usize, usize)> {
        let mut i = h as usize & self.mask;
        loop {
            let e = self.index[i];
            if e == 0 {
                return None;
            }
            if (e >> 32) as u32 == h {
                let s = (e as u32 - 1) as usize;
                if self.slab.get(s).is_some_and(|x| x.key == *key) {
                    return Some((i, s));
                }
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The slot of `key`, if present.
    #[inline]
    pub fn find(&self, key: &K) -> Option<usize> {
        self.find_hashed(self.hash_of(key), key)
    }

    /// The slot of `key` whose hash `hash` the caller already has (it must be [`Self::hash_of`] `key`).
    #[inline]
    pub fn find_hashed(&self, hash: u32, key: &K) -> Option<usize> {
        self.find_pos(hash, key).map(|(_, s)| s)
    }

    /// Whether `key` is present.
    #[inline]
    pub fn contains_key(&self, key: &K) -> bool {
        self.find(key).is_some()
    }

    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: &K) -> Option<&V> {
        let s = self.find(key)?;
        Some(&self.slab[s].value)
    }

    /// The value of `key`, writable.
    #[inline]
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let s = self.find(key)?;
        Some(&mut self.slab[s].value)
    }

    /// The live entry in `slot`.
    #[inline]
    pub fn get_at(&self, slot: usize) -> Option<(&K, &V)> {
        if !self.is_live(slot) {
            return None;
        }
        self.slab.get(slot).map(|e| (&e.key, &e.value))
    }

    /// The live entry in `slot`, its value writable.
    #[inline]
    pub fn get_at_mut(&mut self, slot: usize) -> Option<(&K, &mut V)> {
        if !self.is_live(slot) {
            return None;
        }
        self.slab.get_mut(slot).map(|e| (&e.key, &mut e.value))
    }

    /// The value last stored in `slot`, live or removed (None if the slot was never used): for prefetch hints
    /// and for generation numbers kept in the value (a removed entry's bytes stay until its slot is reused).
    #[inline(always)]
    pub fn peek_at(&self, slot: usize) -> Option<&V> {
        self.slab.get(slot).map(|e| &e.value)
    }

    /// [`Self::peek_at`], writable: for a caller holding a slot it has just found live.
    #[inline(always)]
    pub fn peek_at_mut(&mut self, slot: usize) -> Option<&mut V> {
        self.slab.get_mut(slot).map(|e| &mut e.value)
    }

    /// The slot the next insert of a new key takes (None when full).
    #[inline]
    pub fn next_slot(&self) -> Option<usize> {
        match self.free.last() {
            Some(&s) => Some(s as usize),
            None if self.slab.len() < self.cap => Some(self.slab.len()),
            None => None,
        }
    }

    /// Stores `value` under `key` and returns its slot: an existing key's value is replaced in place (same slot);
    /// a new key takes [`Self::next_slot`]. [`TableError::Full`] when the key is new and every slot is taken.
    pub fn insert(&mut self, key: K, value: V) -> Result<usize, TableError> {
        let h = self.hash_of(&key);
        if let Some((_, s)) = self.find_pos(h, &key) {
            self.slab[s].value = value;
            return Ok(s);
        }
        self.insert_new_hashed(h, key, value)
    }

    /// Inserts `key`, which the caller knows is absent (a lookup just missed), with its hash `hash`: skips
    /// [`Self::insert`]'s probe for an existing entry. Inserting a present key this way makes it appear twice.
    pub fn insert_new_hashed(&mut self, hash: u32, key: K, value: V) -> Result<usize, TableError> {
        debug_assert!(self.find_pos(hash, &key).is_none(), "insert_new_hashed of a present key");
        let s = match self.free.pop() {
            Some(s) => s as usize,
            None if self.slab.len() < self.cap => {
                // Within the reserved capacity: no reallocation.
                self.slab.push(Entry { value, key });
                self.slab.len() - 1
            }
            None => return Err(TableError::Full),
        };
        self.slab[s] = Entry { value, key };
        let mut i = hash as usize & self.mask;
        // At most half full (len < cap <= slots / 2): an empty word exists.
        while self.index[i] != 0 {
            i = (i + 1) & self.mask;
        }
        self.index[i] = u64::from(hash) << 32 | (s as u64 + 1);
        self.set_live(s, true);
        self.len += 1;
        Ok(s)
    }

    /// Removes `key`; returns its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let (i, s) = self.find_pos(self.hash_of(key), key)?;
        self.unlink(i);
        self.release(s);
        Some(self.slab[s].value)
    }

    /// Removes the live entry in `slot`; returns it.
    pub fn remove_at(&mut self, slot: usize) -> Option<(K, V)> {
        if !self.is_live(slot) {
            return None;
        }
        let Entry { value, key } = self.slab[slot];
        let want = slot as u64 + 1;
        let mut i = self.hash_of(&key) as usize & self.mask;
        // A live slot is indexed, reachable from its home without an empty word between.
        while self.index[i] != 0 {
            if self.index[i] & 0xffff_ffff == want {
                self.unlink(i);
                break;
            }
            i = (i + 1) & self.mask;
        }
        self.release(slot);
        Some((key, value))
    }

    fn release(&mut self, s: usize) {
        self.set_live(s, false);
        self.len -= 1;
        // One place per slot: the free list never outgrows its capacity.
        self.free.push(s as u32);
    }

    /// Backward-shift deletion of index word `i`: later words of the cluster move into the hole when their home
    /// allows it, so no tombstone is left and every probe stays as short as after a fresh build.
    fn unlink(&mut self, mut i: usize) {
        let m = self.mask;
        loop {
            let mut j = (i + 1) & m;
            loop {
                let e = self.index[j];
                if e == 0 {
                    self.index[i] = 0;
                    return;
                }
                let home = (e >> 32) as usize & m;
                // The word at j may fill the hole at i if its home is not in (i, j] (cyclically).
                let movable = if i <= j { home <= i || home > j } else { home <= i && home > j };
                if movable {
                    self.index[i] = e;
                    i = j;
                    break;
                }
                j = (j + 1) & m;
            }
        }
    }

    /// Live entries in slot order: `(slot, key, value)`.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &K, &V)> + '_ {
        self.slab.iter().enumerate().filter(|&(s, _)| self.is_live(s)).map(|(s, e)| (s, &e.key, &e.value))
    }

    /// Looks at up to `max_slots` slots (at most the high-water mark) from the sweep cursor, in slot order and
    /// wrapping past the last used slot, and removes every live entry for which `keep(key, value)` says false
    /// (`keep` may also update the value, e.g. rebase a time). The cursor stays where the walk stopped, so an
    /// NF expires idle entries a few slots per batch. Returns the number removed.
    pub fn sweep(&mut self, max_slots: usize, mut keep: impl FnMut(&K, &mut V) -> bool) -> usize {
        let mut removed = 0;
        for _ in 0..max_slots.min(self.slab.len()) {
            if self.cursor >= self.slab.len() {
                self.cursor = 0;
            }
            let s = self.cursor;
            self.cursor += 1;
            if !self.is_live(s) {
                continue;
            }
            let e = &mut self.slab[s];
            if !keep(&e.key, &mut e.value) {
                self.remove_at(s);
                removed += 1;
            }
        }
        removed
    }

    /// The slot the next [`Self::sweep`] starts at (wrapped to 0 when past the high-water mark).
    pub fn sweep_cursor(&self) -> usize {
        self.cursor
    }

    /// The index word at `hash`'s home position: prefetch it a few packets ahead of the lookup.
    #[inline(always)]
    pub fn home_word(&self, hash: u32) -> &u64 {
        &self.index[hash as usize & self.mask]
    }

    /// The slot of the first index word from `hash`'s home position whose hash bits are `hash` (a hint: the
    /// index alone is read, the key is not compared): prefetch [`Self::peek_at`] of it one stage before the
    /// lookup, after prefetching [`Self::home_word`] one stage earlier. Unlike [`Self::home_slot`] it also
    /// names an entry displaced by a collision (probing stops at an empty word, as a lookup would).
    #[inline(always)]
    pub fn probe_hint(&self, hash: u32) -> Option<usize> {
        let mut i = hash as usize & self.mask;
        loop {
            let e = self.index[i];
            if e == 0 {
                return None;
            }
            if (e >> 32) as u32 == hash {
                return Some((e as u32 - 1) as usize);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The slot named by the home index word when its hash bits are `hash` (a hint: the key is not compared,
    /// the entry may sit further along the probe sequence): prefetch [`Self::peek_at`] of it.
    #[inline(always)]
    pub fn home_slot(&self, hash: u32) -> Option<usize> {
        let e = *self.home_word(hash);
        (e != 0 && (e >> 32) as u32 == hash).then(|| (e as u32 - 1) as usize)
    }
}

impl<K: Copy, V: Copy, H> Clone for FixedMap<K, V, H> {
    /// A copy with the same capacity reserved (a `Vec` clone would keep only the used length, and the copy
    /// would reallocate when it grows).
    fn clone(&self) -> Self {
        let slab = self.slab.try_clone();
        let mut free = Vec::with_capacity(self.cap);
        free.extend_from_slice(&self.free);
        FixedMap {
            index: self.index.clone(),
            mask: self.mask,
            slab,
            live: self.live.clone(),
            free,
            cap: self.cap,
            len: self.len,
            cursor: self.cursor,
            secret: self.secret,
            _h: PhantomData,
        }
    }
}

impl<K, V, H> core::fmt::Debug for FixedMap<K, V, H> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FixedMap")
            .field("len", &self.len)
            .field("capacity", &self.cap)
            .field("index_words", &self.index.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type M = FixedMap<u64, u32, FibHash>;

    /// Every key hashes to the same word: probe chains as long as they get.
    struct Collide;
    impl KeyHash<u64> for Collide {
        fn hash(_: &u64) -> u32 {
            7
        }
    }

    #[test]
    fn insert_get_remove_and_full() {
        let mut m = M::new(3).unwrap();
        assert_eq!((m.capacity(), m.len(), m.next_slot()), (3, 0, Some(0)));
        assert_eq!(m.insert(10, 1), Ok(0));
        assert_eq!(m.insert(20, 2), Ok(1));
        assert_eq!(m.insert(10, 5), Ok(0), "replaced in place");
        assert_eq!(m.insert(30, 3), Ok(2));
        assert!(m.is_full());
        assert_eq!(m.insert(40, 4), Err(TableError::Full));
        assert_eq!(m.insert(20, 9), Ok(1), "a present key still updates when full");
        assert_eq!((m.get(&10), m.get(&20), m.get(&40)), (Some(&5), Some(&9), None));
        assert_eq!(m.remove(&20), Some(9));
        assert_eq!(m.remove(&20), None);
        assert_eq!(m.get_at(1), None);
        assert_eq!(m.peek_at(1), Some(&9), "a removed entry's bytes stay");
        assert_eq!(m.next_slot(), Some(1));
        assert_eq!(m.insert(40, 4), Ok(1), "the freed slot is reused");
        *m.get_mut(&40).unwrap() += 1;
        assert_eq!(m.get_at(1), Some((&40, &5)));
        assert_eq!(m.remove_at(1), Some((40, 5)));
        assert_eq!(m.remove_at(1), None);
        assert_eq!(m.remove_at(99), None);
        assert!(M::new(0).is_err());
        assert!(M::new(FIXED_MAP_MAX + 1).is_err());
    }

    #[test]
    fn free_slots_are_reused_last_in_first_out() {
        let mut m = M::new(8).unwrap();
        for k in 0..8 {
            assert_eq!(m.insert(k, 0), Ok(k as usize));
        }
        for k in [2, 5, 3] {
            m.remove(&k);
        }
        let got: Vec<usize> = (100..103).map(|k| m.insert(k, 0).unwrap()).collect();
        assert_eq!(got, [3, 5, 2]);
    }

    #[test]
    fn colliding_keys_survive_churn() {
        let mut m = FixedMap::<u64, u64, Collide>::new(64).unwrap();
        for k in 0..64 {
            m.insert(k, k * 10).unwrap();
        }
        for round in 0..20u64 {
            for k in (round % 3..64).step_by(3) {
                assert_eq!(m.remove(&k), Some(k * 10), "round {round} key {k}");
            }
            for k in 0..64 {
                assert_eq!(m.get(&k).is_some(), (k + 3 - round % 3) % 3 != 0, "round {round} key {k}");
            }
            for k in (round % 3..64).step_by(3) {
                m.insert(k, k * 10).unwrap();
            }
            assert_eq!(m.len(), 64);
        }
        // Backward shift left no tombstones: the index holds exactly one word per entry.
        assert_eq!(m.index.iter().filter(|&&w| w != 0).count(), 64);
    }

    #[test]
    fn sweep_resumes_and_wraps_at_the_high_water_mark() {
        let mut m = M::new(100).unwrap();
        for k in 0..10 {
            m.insert(k, k as u32).unwrap();
        }
        let mut seen = Vec::new();
        assert_eq!(
            m.sweep(4, |k, _| {
                seen.push(*k);
                *k != 2
            }),
            1
        );
        assert_eq!((m.sweep_cursor(), m.len()), (4, 9));
        // Six more slots reach the end (slot 9); the next four wrap to 0 and skip the freed slot 2.
        m.sweep(10, |k, _| {
            seen.push(*k);
            true
        });
        assert_eq!(seen, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 3]);
        // Never more than the high-water mark per call, however large the budget.
        let mut n = 0;
        m.sweep(1000, |_, v| {
            n += 1;
            *v += 1;
            true
        });
        assert_eq!(n, 9);
        assert_eq!(m.get(&9), Some(&10), "keep may update the value");
    }

    #[test]
    fn iteration_is_in_slot_order_and_clone_keeps_capacity() {
        let mut m = M::new(20).unwrap();
        for k in [50, 10, 40, 30, 20] {
            m.insert(k, 0).unwrap();
        }
        m.remove(&10);
        m.insert(60, 1).unwrap();
        let order: Vec<(usize, u64)> = m.iter().map(|(s, k, _)| (s, *k)).collect();
        assert_eq!(order, [(0, 50), (1, 60), (2, 40), (3, 30), (4, 20)]);
        let mut c = m.clone();
        assert_eq!(c.slab.capacity(), 20);
        for k in 100..115 {
            c.insert(k, 0).unwrap();
        }
        assert!(c.is_full() && m.len() == 5);
        let _ = format!("{c:?}");
    }

    /// 32-byte entries start on a cache line or half way through one: never across two (a `Vec` from malloc
    /// would put every other one across a line boundary).
    #[test]
    fn slab_is_line_aligned_so_small_entries_never_straddle() {
        #[derive(Clone, Copy)]
        struct V28([u32; 7]);
        for cap in [1, 100, 70_000] {
            let mut m = FixedMap::<u32, V28, FibHash>::new(cap).unwrap();
            m.insert(5, V28([1; 7])).unwrap();
            let at = m.peek_at(0).unwrap() as *const V28 as usize;
            assert_eq!((at % 64, size_of::<Entry<u32, V28>>()), (0, 32), "cap {cap}");
            assert_eq!(m.get(&5).map(|v| v.0[6]), Some(1));
            let c = m.clone();
            assert_eq!(c.peek_at(0).unwrap() as *const V28 as usize % 64, 0);
        }
        // Zero-sized entries need no memory.
        let mut z = FixedMap::<(), (), Unit>::new(3).unwrap();
        assert_eq!(z.insert((), ()), Ok(0));
        assert_eq!((z.len(), z.get(&()).is_some()), (1, true));
    }

    struct Unit;
    impl KeyHash<()> for Unit {
        fn hash(_: &()) -> u32 {
            1
        }
    }

    #[test]
    fn home_hints_name_the_entry() {
        let mut m = M::new(16).unwrap();
        let s = m.insert(77, 3).unwrap();
        let h = M::hash(&77);
        assert_eq!(*m.home_word(h) as u32 as usize, s + 1);
        assert_eq!(m.home_slot(h), Some(s));
        assert_eq!(m.home_slot(h ^ 1), None);
        assert_eq!(m.probe_hint(h), Some(s));
        assert_eq!(m.find_hashed(h, &77), Some(s));
    }
}
