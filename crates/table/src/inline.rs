//! The inline layout of the per-core [`FlowTable`] ([`Layout::Inline`](crate::Layout::Inline)): the entries
//! are the table. A key's *home* is an entry position computed from its hash; the key lives at its home or at
//! most [`WINDOW`]` - 1` positions after it (linear probing over a bounded window), so a lookup whose key sits
//! at home reads one entry — one random cache line for 64-byte entries, two adjacent ones for 128 — instead of
//! a bucket line and then an entry line (VPP's bihash keeps key and value inline for the same reason).
//!
//! Entries never move (no displacement, no backward shift on removal): a handle is the entry's position and
//! stays valid for the flow's lifetime, exactly as in the bucketed layout, so everything built on handles
//! (typed state views, the auxiliary table's pins, expiry over the live bitmap, hand-over) is shared.
//!
//! Each entry's hash field holds a *placement word* instead of the hash, about the position rather than the
//! flow: bit 0 "live" (the bitmap's bit, readable in the line a lookup fetches anyway), bits 8..16 the live
//! entry's distance from its home, bits 16..32 how many live keys whose home is this position live after it
//! ("displaced"; kept when the position's own entry is removed). A lookup reads the home entry; if the key is
//! not there and the home has displaced keys, it walks the next positions, taking only entries whose distance
//! names this home, and stops once it has seen as many as the count says. Holes left by removals need no
//! tombstones: the count, not an empty position, ends the walk.
//!
//! Sizing: twice as many home positions as the capacity (a full table loads half of them), and `WINDOW - 1`
//! positions past the last home so no window wraps. With random homes, a key inserted at load `x` finds its
//! home free with probability `1 - x`: filled to capacity, about 3 in 4 keys sit at home and most of the rest
//! one position after (measured by `inline_keys_mostly_sit_at_home` below). Without the slack the walk grows
//! fast (linear probing's expected distance at load `a` is about `a / (2 (1 - a))`).
//!
//! The window bounds the worst case: keys that share one home (a hash-collision flood under a leaked secret)
//! fill its window and are then refused (or evict within it), and no lookup walks more than `WINDOW`
//! positions. The longest walk random keys need at load 1/2 is a few dozen positions at millions of keys.

use crate::error::TableError;
use crate::flow_table::{FlowTable, FullPolicy, Handle, Protected, INVALID_HANDLE};
use crate::key::FlowKey;
use crate::slab::prefetch;
use crate::BULK_LOOKUP_MAX;

/// Positions a key may live at, from its home on (the longest walk; what a collision flood gets in).
pub const WINDOW: u32 = 128;

/// Placement word: live flag.
const LIVE: u32 = 1;
/// Placement word: the live entry's distance from its home.
const DIST_SHIFT: u32 = 8;
/// Placement word: displaced keys of this position as a home.
const DISPLACED_SHIFT: u32 = 16;
const DISPLACED_ONE: u32 = 1 << DISPLACED_SHIFT;
/// The low half of the placement word for a live entry at distance `d`.
#[inline(always)]
const fn occupant(d: u32) -> u32 {
    LIVE | (d << DIST_SHIFT)
}

/// Candidates the eviction policy compares (as many as the bucketed layout's two buckets).
const EVICT_CANDIDATES: usize = 16;

/// Home positions of a table of `capacity` entries.
pub(crate) fn homes(capacity: usize) -> u32 {
    (capacity.max(1) * 2) as u32
}

/// Entry positions (homes and the last window's slack) of a table of `capacity`; `None` above 2^29 entries
/// (handles must stay below 2^31: the engine keeps a flag in bit 31).
pub(crate) fn entries(capacity: usize) -> Option<u32> {
    (capacity <= crate::Layout::INLINE_MAX_CAPACITY).then(|| homes(capacity) + WINDOW - 1)
}

impl<K: FlowKey> FlowTable<K> {
    /// Home position of `hash`: from both halves of the hash, as the bucketed layout's primary bucket (so the
    /// position depends on the run's secret), mapped onto the homes by a multiply-shift (no power-of-two size).
    #[inline(always)]
    pub(crate) fn home(&self, hash: u64) -> u32 {
        let m = (hash ^ (hash >> 32)) as u32;
        ((u64::from(m) * u64::from(self.homes)) >> 32) as u32
    }

    /// Whether position `e`, whose placement word is `meta`, holds `key` at distance `d` from its home.
    #[inline(always)]
    fn holds_at(&self, e: u32, meta: u32, d: u32, key: &K) -> bool {
        // SAFETY: the live flag of `e`'s placement word is set (checked first), and the table keeps it equal to the
        // slab's live bit (`alloc_at` sets both, `inline_unlink` clears both), so `e` is live.
        meta & 0xFFFF == occupant(d) && unsafe { self.slab.key_unchecked(e) } == key
    }

    /// The walk past a home whose own entry is not `key`: positions after it whose entry names it as home, until
    /// `displaced` of them have been seen.
    #[inline]
    fn inline_walk(&self, key: &K, home: u32, mut displaced: u32) -> Option<Handle> {
        for d in 1..WINDOW {
            if displaced == 0 {
                return None;
            }
            let e = home + d;
            let m = self.slab.meta(e);
            if m & 0xFFFF == occupant(d) {
                // SAFETY: as in `holds_at` (live flag checked just above).
                if unsafe { self.slab.key_unchecked(e) } == key {
                    return Some(e);
                }
                displaced -= 1;
            }
        }
        None
    }

    /// Finds `key`'s entry: its home, then the walk if the home has displaced keys.
    #[inline(always)]
    pub(crate) fn inline_find(&self, key: &K, hash: u64) -> Option<Handle> {
        let home = self.home(hash);
        let m = self.slab.meta(home);
        if self.holds_at(home, m, 0, key) {
            return Some(home);
        }
        self.inline_walk(key, home, m >> DISPLACED_SHIFT)
    }

    /// The bulk lookup of the inline layout (same contract as the bucketed `probe`): (1) every key's home entry
    /// prefetched (both lines of a two-line entry); (2) the home checked, and the next entry prefetched for keys
    /// that are not at home but whose home has displaced keys; (3) those keys' walks.
    #[inline(always)]
    pub(crate) fn probe_inline(&self, keys: &[K], hashes: &[u64], out: &mut [Handle]) -> u64 {
        let n = keys.len().min(hashes.len()).min(out.len()).min(BULK_LOOKUP_MAX);
        let two_lines = self.slab.layout.size > 64;
        let mut homes = [0u32; BULK_LOOKUP_MAX];
        for i in 0..n {
            let home = self.home(hashes[i]);
            homes[i] = home;
            let p = self.slab.entry_ptr(home);
            prefetch(p);
            if two_lines {
                prefetch(p.wrapping_add(64));
            }
        }
        let mut hit = 0u64;
        let mut walk = 0u64;
        for i in 0..n {
            let home = homes[i];
            let m = self.slab.meta(home);
            if self.holds_at(home, m, 0, &keys[i]) {
                out[i] = home;
                hit |= 1 << i;
            } else {
                out[i] = INVALID_HANDLE;
                if m >> DISPLACED_SHIFT != 0 {
                    walk |= 1 << i;
                    prefetch(self.slab.entry_ptr(home + 1));
                }
            }
        }
        while walk != 0 {
            let i = walk.trailing_zeros() as usize;
            walk &= walk - 1;
            let home = homes[i];
            if let Some(e) = self.inline_walk(&keys[i], home, self.slab.meta(home) >> DISPLACED_SHIFT) {
                out[i] = e;
                hit |= 1 << i;
            }
        }
        self.lookups.set(self.lookups.get() + n as u64);
        self.hits.set(self.hits.get() + u64::from(hit.count_ones()));
        hit
    }

    /// Distance from `home` of the first free position of its window.
    #[inline]
    fn free_in_window(&self, home: u32) -> Option<u32> {
        (0..WINDOW).find(|&d| self.slab.meta(home + d) & LIVE == 0)
    }

    /// Makes free position `home + d` live with `key` (distance `d`), counting it as displaced at `home`.
    #[inline]
    fn place_inline(&mut self, home: u32, d: u32, key: &K, now: u64) -> Handle {
        let e = home + d;
        let keep = self.slab.meta(e) & !0xFFFF;
        let placed = self.slab.alloc_at(e, key, now, keep | occupant(d));
        debug_assert!(placed, "position {e} was free");
        if d > 0 {
            let hm = self.slab.meta(home);
            self.slab.set_meta(home, hm + DISPLACED_ONE);
        }
        e
    }

    /// Inserts a key known to be absent at the first free position of its window; when the table is full (at
    /// capacity, or the window has no free position) per the full policy, as the bucketed layout does: evict
    /// the least recently seen of the first [`EVICT_CANDIDATES`] live entries of the window that `protect()`
    /// does not name, after `evicted(key, state)` saw it, or count a full event.
    pub(crate) fn inline_insert<'p>(
        &mut self,
        key: &K,
        hash: u64,
        now: u64,
        protect: impl FnOnce() -> Protected<'p>,
        evicted: impl FnOnce(&K, &[u8]),
    ) -> Result<Handle, TableError> {
        let home = self.home(hash);
        if self.slab.len() < self.max_len as usize {
            if let Some(d) = self.free_in_window(home) {
                self.stats.inserts += 1;
                return Ok(self.place_inline(home, d, key, now));
            }
        }
        if self.policy == FullPolicy::EvictLruIdle {
            let protect = protect();
            // A window with room but no victim (the table is at capacity with flows elsewhere): evict one of those,
            // as the bucketed layout does, rather than refuse.
            let victim = self
                .inline_victim(home, protect)
                .or_else(|| self.free_in_window(home).and_then(|_| self.far_victim(protect)));
            if let Some(victim) = victim {
                if let Some(k) = self.slab.key(victim).copied() {
                    evicted(&k, self.slab.state(victim));
                }
                self.inline_unlink(victim);
                // The victim's position is in the window: there is a free one now.
                if let Some(d) = self.free_in_window(home) {
                    self.stats.evictions += 1;
                    self.stats.inserts += 1;
                    return Ok(self.place_inline(home, d, key, now));
                }
            }
        }
        self.stats.full_events += 1;
        Err(TableError::Full)
    }

    /// Least recently seen unprotected entry among the first live ones of `home`'s window (adjacent lines, most
    /// of them already fetched by the lookup and the search for a free position).
    fn inline_victim(&self, home: u32, protect: Protected<'_>) -> Option<Handle> {
        // The first live entries, then the oldest of them checked for protection lazily (a protected entry was
        // touched by this call, so it is among the newest): checking each one cost a scan of the call's handles
        // per candidate under a new-flow flood (cachegrind: `Protected::contains` 210 instructions per eviction).
        let mut cand = [(u64::MAX, 0u32); EVICT_CANDIDATES];
        let mut n = 0;
        let mut d = 0;
        while d < WINDOW && n < EVICT_CANDIDATES {
            let e = home + d;
            d += 1;
            if self.slab.meta(e) & LIVE != 0 {
                cand[n] = (self.slab.last_seen(e), e);
                n += 1;
            }
        }
        let cand = &mut cand[..n];
        let mut left = n;
        while left > 0 {
            let (i, &(seen, e)) = cand.iter().enumerate().filter(|(_, c)| c.1 != u32::MAX).min_by_key(|(_, c)| c.0)?;
            if !protect.contains(e, seen) {
                return Some(e);
            }
            cand[i].1 = u32::MAX;
            left -= 1;
        }
        // Every one of them was protected: the oldest unprotected further on in the window.
        let mut best: Option<(u64, Handle)> = None;
        let mut more = 0;
        while d < WINDOW && more < EVICT_CANDIDATES {
            let e = home + d;
            d += 1;
            if self.slab.meta(e) & LIVE == 0 {
                continue;
            }
            let seen = self.slab.last_seen(e);
            if protect.contains(e, seen) {
                continue;
            }
            if best.is_none_or(|(t, _)| seen < t) {
                best = Some((seen, e));
            }
            more += 1;
        }
        best.map(|(_, e)| e)
    }

    /// Removes live entry `h`: clears its position (keeping the position's displaced count) and its home's count.
    pub(crate) fn inline_unlink(&mut self, h: Handle) -> bool {
        if !self.slab.is_live(h) {
            return false;
        }
        let m = self.slab.meta(h);
        self.slab.set_meta(h, m & !0xFFFF);
        let d = (m >> DIST_SHIFT) & 0xFF;
        if d > 0 {
            let home = h - d;
            let hm = self.slab.meta(home);
            debug_assert!(hm >> DISPLACED_SHIFT > 0, "home {home} of {h} counts it");
            self.slab.set_meta(home, hm.saturating_sub(DISPLACED_ONE));
        }
        self.slab.free(h)
    }

    /// Distance of live entry `h` from its home (tests).
    #[cfg(test)]
    pub(crate) fn inline_distance(&self, h: Handle) -> Option<u32> {
        self.slab.is_live(h).then(|| (self.slab.meta(h) >> DIST_SHIFT) & 0xFF)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Layout, TableConfig, Upsert};

    fn mix(x: u64) -> u64 {
        let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn inline(cap: usize, state: usize) -> FlowTable<u64> {
        FlowTable::new(TableConfig { layout: Layout::Inline, ..TableConfig::new(cap, state) }).unwrap()
    }

    /// Every position's placement word agrees with the slab and with every live entry's home: live flag = live
    /// bit, a live entry's distance leads back to a home that counts it, each home's count is exact.
    fn check_invariants(t: &FlowTable<u64>) {
        let n = t.slab.capacity();
        let mut want = vec![0u32; n as usize];
        let mut live = 0;
        for e in 0..n {
            let m = t.slab.meta(e);
            assert_eq!(m & LIVE != 0, t.slab.is_live(e), "position {e}");
            assert_eq!(m & 0xFE, 0, "spare bits");
            if m & LIVE == 0 {
                assert_eq!((m >> DIST_SHIFT) & 0xFF, 0);
                continue;
            }
            live += 1;
            let d = (m >> DIST_SHIFT) & 0xFF;
            let k = *t.slab.key(e).unwrap();
            assert_eq!(t.home(mix(k)) + d, e, "key {k} at {e}");
            if d > 0 {
                want[(e - d) as usize] += 1;
            }
        }
        assert_eq!(live, t.len());
        for e in 0..n {
            assert_eq!(t.slab.meta(e) >> DISPLACED_SHIFT, want[e as usize], "displaced count of {e}");
        }
    }

    #[test]
    fn fit_picks_inline_up_to_two_lines() {
        assert_eq!(Layout::fit::<[u8; 16]>(32), Layout::Inline);
        assert_eq!(Layout::entry_size::<[u8; 16]>(32), Some(64));
        assert_eq!(Layout::fit::<[u8; 16]>(96), Layout::Inline);
        assert_eq!(Layout::entry_size::<[u8; 16]>(96), Some(128));
        assert_eq!(Layout::fit::<[u8; 16]>(97), Layout::Bucketed);
        assert_eq!(Layout::fit::<[u8; 40]>(64), Layout::Inline);
        assert_eq!(Layout::fit::<[u8; 40]>(65), Layout::Bucketed);
        assert_eq!(Layout::fit::<[u8; 16]>(usize::MAX), Layout::Bucketed);
    }

    /// Exactly `capacity` keys, the next refused, at every small size and a few larger ones.
    #[test]
    fn an_inline_table_holds_exactly_its_capacity() {
        let sizes: Vec<usize> = if cfg!(miri) { vec![1, 7, 40] } else { (1..=80).chain([1000, 65_536]).collect() };
        for cap in sizes {
            let mut t = inline(cap, 8);
            let mut n = 0u64;
            while t.insert(&n, mix(n), 0, |_| {}).is_ok() {
                n += 1;
            }
            assert_eq!((n as usize, t.len(), t.capacity()), (cap, cap, cap), "capacity {cap}");
            assert_eq!(t.stats().full_events, 1);
            for k in 0..n {
                assert!(t.lookup(&k, mix(k)).is_some(), "key {k} lost");
            }
            check_invariants(&t);
        }
    }

    /// Filled to capacity with random keys, most keys sit at home (one line per lookup) and almost all the rest
    /// one position after; the longest walk stays far inside the window.
    #[test]
    fn inline_keys_mostly_sit_at_home() {
        let cap = if cfg!(miri) { 300 } else { 100_000 };
        let mut t = inline(cap, 8);
        let mut hist = [0usize; WINDOW as usize];
        for k in 0..cap as u64 {
            let (h, new) = t.insert(&k, mix(k), 0, |_| {}).unwrap();
            assert!(new);
            hist[t.inline_distance(h).unwrap() as usize] += 1;
        }
        let max = hist.iter().rposition(|&c| c > 0).unwrap();
        println!("distance histogram {:?}, max {max}", &hist[..8]);
        // About 75% and 89% (a few hundred keys under Miri: looser bounds).
        let (home, near) = if cfg!(miri) { (60, 75) } else { (70, 85) };
        assert!(hist[0] * 100 >= cap * home, "{} of {cap} at home", hist[0]);
        assert!((hist[0] + hist[1]) * 100 >= cap * near);
        assert!(max < WINDOW as usize / 2, "longest walk {max}");
    }

    #[test]
    fn removal_keeps_walks_exact_without_tombstones() {
        let cap = if cfg!(miri) { 256 } else { 4096 };
        let n = cap as u64 / 32;
        let mut t = inline(cap, 8);
        // Colliding hashes (8 homes, n / 8 keys each) so walks are long and holes appear inside them.
        let weak = |k: u64| mix(k % 8);
        for k in 0..n {
            t.insert(&k, weak(k), 0, |s| s[0] = k as u8).unwrap();
        }
        check_invariants_with(&t, weak);
        for k in (0..n).step_by(3) {
            assert!(t.remove(&k, weak(k)));
            assert!(!t.remove(&k, weak(k)));
        }
        check_invariants_with(&t, weak);
        for k in 0..n {
            let h = t.lookup(&k, weak(k));
            assert_eq!(h.is_some(), k % 3 != 0, "key {k}");
            if let Some(h) = h {
                assert_eq!(t.state(h)[0], k as u8);
            }
        }
        // Refill the holes: a re-inserted key takes the first free position, which may be a hole.
        for k in (0..n).step_by(3) {
            assert!(t.insert(&k, weak(k), 0, |_| {}).unwrap().1);
        }
        check_invariants_with(&t, weak);
    }

    fn check_invariants_with(t: &FlowTable<u64>, hash: impl Fn(u64) -> u64) {
        let n = t.slab.capacity();
        let mut want = vec![0u32; n as usize];
        for e in 0..n {
            let m = t.slab.meta(e);
            assert_eq!(m & LIVE != 0, t.slab.is_live(e));
            if m & LIVE != 0 {
                let d = (m >> DIST_SHIFT) & 0xFF;
                assert_eq!(t.home(hash(*t.slab.key(e).unwrap())) + d, e);
                if d > 0 {
                    want[(e - d) as usize] += 1;
                }
            }
        }
        for e in 0..n {
            assert_eq!(t.slab.meta(e) >> DISPLACED_SHIFT, want[e as usize], "displaced count of {e}");
        }
    }

    /// Keys sharing one home: the window holds `WINDOW` of them, the next is refused (Reject) or evicts the
    /// least recently seen of the window's first 16 (EvictLruIdle), reported before its reuse.
    #[test]
    fn a_collision_flood_fills_one_window_then_the_policy_decides() {
        let same = |_: u64| 0x1234_5678_9ABC_DEF0u64;
        let mut t = inline(1000, 8);
        assert_eq!(t.collision_room(), WINDOW as usize);
        for k in 0..u64::from(WINDOW) {
            t.insert(&k, same(k), k, |_| {}).unwrap();
        }
        assert!(t.insert(&999, same(999), 500, |_| {}).is_err());
        assert_eq!(t.stats().full_events, 1);
        for k in 0..u64::from(WINDOW) {
            assert!(t.lookup(&k, same(k)).is_some());
        }
        let cfg =
            TableConfig { layout: Layout::Inline, full_policy: FullPolicy::EvictLruIdle, ..TableConfig::new(1000, 8) };
        let mut t = FlowTable::<u64>::new(cfg).unwrap();
        for k in 0..u64::from(WINDOW) {
            t.insert(&k, same(k), 100 - k.min(99), |s| s[0] = k as u8).unwrap();
        }
        // Seen earliest among the first 16 positions: key 15 (at 85).
        let mut events = Vec::new();
        let (h, new) = t
            .upsert(&999, same(999), 1000, |u| match u {
                Upsert::Evicted(k, s) => events.push((*k, s[0])),
                Upsert::New(_) => events.push((999, 0)),
                Upsert::Expired(_) => unreachable!(),
            })
            .unwrap();
        assert!(new);
        assert_eq!(events, vec![(15, 15), (999, 0)]);
        assert_eq!(h, t.home(same(0)) + 15, "the victim's position");
        assert!(t.lookup(&15, same(15)).is_none());
        assert_eq!(t.stats().evictions, 1);
    }

    /// Under `EvictLruIdle` a table at capacity never refuses a key whose own window holds no flow: one linked
    /// elsewhere is evicted (as the bucketed layout does since 3380460).
    #[test]
    fn evict_finds_a_victim_outside_an_empty_window() {
        let cfg =
            TableConfig { layout: Layout::Inline, full_policy: FullPolicy::EvictLruIdle, ..TableConfig::new(64, 8) };
        let mut t = FlowTable::<u64>::new(cfg).unwrap();
        let far = (0u64..).find(|k| t.home(mix(*k)) == t.homes - 1).unwrap();
        // Homes below 40: 64 keys live below position 104, outside the window of `far` (home 127).
        let keys: Vec<u64> = (0u64..).filter(|k| t.home(mix(*k)) < 40).take(64).collect();
        for (i, k) in keys.iter().enumerate() {
            t.insert(k, mix(*k), i as u64, |_| {}).unwrap();
        }
        let mut gone = Vec::new();
        let (h, new) = t
            .upsert(&far, mix(far), 100, |u| {
                if let Upsert::Evicted(k, _) = u {
                    gone.push(*k);
                }
            })
            .expect("evicted, not refused");
        assert!(new);
        assert_eq!(t.key(h), Some(&far));
        assert_eq!(gone.len(), 1);
        assert!(t.lookup(&gone[0], mix(gone[0])).is_none());
        assert_eq!((t.len(), t.stats().evictions, t.stats().full_events), (64, 1, 0));
        check_invariants(&t);
    }

    #[test]
    fn two_line_entries_and_batches_agree_with_single_lookups() {
        let cap = if cfg!(miri) { 50 } else { 5000 };
        let mut t = inline(cap, 96);
        assert_eq!(t.slab.layout.size, 128);
        let keys: Vec<u64> = (0..cap as u64).collect();
        let hashes: Vec<u64> = keys.iter().map(|&k| mix(k)).collect();
        let mut out = vec![0u32; keys.len()];
        let r = t.lookup_or_insert_batch(&keys, &hashes, 7, &mut out, |i, s| s[95] = i as u8);
        assert_eq!((r.inserted, r.hit, r.failed), (cap, 0, 0));
        let mut again = vec![0u32; keys.len()];
        assert_eq!(t.lookup_batch(&keys, &hashes, &mut again), cap);
        assert_eq!(out, again);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(t.lookup(k, hashes[i]), Some(out[i]));
            assert_eq!(t.state(out[i])[95], i as u8);
            assert_eq!(t.state(out[i]).len(), 96);
        }
        check_invariants(&t);
    }
}
