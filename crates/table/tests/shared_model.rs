//! Single-threaded behaviour of the shared table against a `HashMap` model:
//! batch and single APIs agree, fill to >= 90%, full table counts failures,
//! expiry, refcount/remove interplay, stale handles.

use flowplane_table::shared::{
    hash_key, ReleaseOutcome, RemoveOutcome, SharedConfigError, SharedFlowTable, SharedHandle, SharedKey,
    SharedTableConfig,
};
use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::Ordering::Relaxed;

fn cfg(capacity: usize, timeout: u64) -> SharedTableConfig {
    SharedTableConfig { capacity, state_words: 2, idle_timeout_ns: timeout }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[test]
fn random_ops_match_hashmap_model() {
    let t = SharedFlowTable::<u32>::new(cfg(2000, 0)).unwrap();
    let mut model: HashMap<u32, u64> = HashMap::new();
    let mut rng = Rng(1);
    for step in 0..200_000u64 {
        let k = (rng.next() % 3000) as u32;
        let h = hash_key(&k);
        match rng.next() % 5 {
            0 | 1 => {
                let r = t.lookup_or_insert(&k, h, step, |k, s| s[0].store(u64::from(*k) + 1, Relaxed));
                match r {
                    Some((hd, new)) => {
                        assert_eq!(new, !model.contains_key(&k));
                        if new {
                            model.insert(k, u64::from(k) + 1);
                        }
                        let s = t.state(hd).unwrap();
                        s[1].fetch_add(1, Relaxed);
                        assert_eq!(s[0].load(Relaxed), model[&k]);
                    }
                    None => {
                        assert!(!model.contains_key(&k));
                        assert!(model.len() >= 1800, "insert failed at {} entries", model.len());
                    }
                }
            }
            2 => {
                let hd = t.lookup(&k, h);
                assert_eq!(hd.is_some(), model.contains_key(&k));
                if hd.is_some() {
                    assert_eq!(t.key(hd), Some(k));
                }
            }
            3 => {
                let r = t.remove(&k, h);
                let expect = if model.remove(&k).is_some() { RemoveOutcome::Removed } else { RemoveOutcome::NotFound };
                assert_eq!(r, expect);
            }
            _ => {
                // Batch lookup of 40 keys agrees with single lookups and the model.
                let keys: Vec<u32> = (0..40).map(|_| (rng.next() % 3000) as u32).collect();
                let hashes: Vec<u64> = keys.iter().map(hash_key).collect();
                let mut out = vec![SharedHandle::NONE; 40];
                let hits = t.lookup_batch(&keys, &hashes, &mut out);
                assert_eq!(hits, keys.iter().filter(|k| model.contains_key(k)).count());
                for (i, k) in keys.iter().enumerate() {
                    assert_eq!(out[i], t.lookup(k, hashes[i]));
                }
            }
        }
        assert_eq!(t.len(), model.len());
    }
    let mut seen = 0;
    t.for_each(|_, k, s| {
        assert_eq!(s[0].load(Relaxed), model[k]);
        seen += 1;
    });
    assert_eq!(seen, model.len());
}

#[test]
fn batch_add_on_miss_longer_than_a_chunk() {
    let t = SharedFlowTable::<u64>::new(cfg(1000, 0)).unwrap();
    let keys: Vec<u64> = (0..150).collect();
    let hashes: Vec<u64> = keys.iter().map(hash_key).collect();
    let mut out = vec![SharedHandle::NONE; 150];
    let r = t.lookup_or_insert_batch(&keys, &hashes, 0, &mut out, |k, s| s[0].store(*k * 3, Relaxed));
    assert_eq!((r.hit, r.inserted, r.failed), (0, 150, 0));
    // A key repeated inside one batch is inserted once.
    let keys2: Vec<u64> = vec![500, 500, 7];
    let h2: Vec<u64> = keys2.iter().map(hash_key).collect();
    let mut out2 = vec![SharedHandle::NONE; 3];
    let r = t.lookup_or_insert_batch(&keys2, &h2, 0, &mut out2, |k, s| s[0].store(*k * 3, Relaxed));
    assert_eq!((r.hit, r.inserted, r.failed), (2, 1, 0));
    assert_eq!(out2[0], out2[1]);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(t.read_state(out[i], |s| s[0].load(Relaxed)), Some(k * 3));
    }
    assert_eq!(t.len(), 151);
}

#[test]
fn fills_to_capacity_then_counts_failures() {
    for cap in [1usize, 7, 1000, 1 << 16] {
        let t = SharedFlowTable::<u64>::new(cfg(cap, 0)).unwrap();
        let mut ok = 0;
        for k in 0..cap as u64 + 50 {
            if t.lookup_or_insert(&k, hash_key(&k), 0, |_, _| {}).is_some() {
                ok += 1;
            }
        }
        assert!(ok * 10 >= cap * 9, "cap {cap}: only {ok} inserted");
        assert_eq!(t.len(), ok);
        assert_eq!(t.failed_inserts() as usize, cap + 50 - ok);
        // Every inserted key is still findable after all the displacement.
        let found = (0..cap as u64 + 50).filter(|k| t.lookup(k, hash_key(k)).is_some()).count();
        assert_eq!(found, ok);
    }
}

#[test]
fn bad_configs_are_errors() {
    assert_eq!(SharedFlowTable::<u32>::new(cfg(0, 0)).unwrap_err(), SharedConfigError::Capacity(0));
    let e = SharedFlowTable::<u32>::new(SharedTableConfig { capacity: 4, state_words: 1 << 20, idle_timeout_ns: 0 });
    assert!(matches!(e, Err(SharedConfigError::StateWords(_))));
}

#[test]
fn expiry_removes_idle_unreferenced_entries_only() {
    let t = SharedFlowTable::<u32>::new(cfg(64, 100)).unwrap();
    let h = |k: u32| hash_key(&k);
    t.lookup_or_insert(&1, h(1), 0, |_, _| {}).unwrap();
    let (pinned, _) = t.acquire(&2, h(2), 0, |_, _| {}).unwrap();
    t.lookup_or_insert(&3, h(3), 90, |_, _| {}).unwrap();
    let mut gone = Vec::new();
    assert_eq!(t.expire(150, 64, |k, _| gone.push(*k)), 1);
    assert_eq!(gone, vec![1]);
    // Pinned entries never expire; a release restarts the idle clock.
    assert_eq!(t.expire(1000, 64, |k, _| gone.push(*k)), 1);
    assert_eq!(gone, vec![1, 3]);
    assert_eq!(t.release(pinned, 1000), ReleaseOutcome::Unreferenced);
    assert_eq!(t.expire(1050, 64, |_, _| {}), 0);
    assert_eq!(t.expire(1101, 64, |k, _| gone.push(*k)), 1);
    assert_eq!(gone, vec![1, 3, 2]);
    assert!(t.is_empty());
    // A clock that went backwards expires nothing.
    t.lookup_or_insert(&4, h(4), 5000, |_, _| {}).unwrap();
    assert_eq!(t.expire(10, 64, |_, _| {}), 0);
}

/// Two cores whose packet clocks differ (issue 29): the core behind releasing its pin last
/// must not move the entry's last-seen time back, or the sweep frees a key the core ahead
/// touched within the timeout.
#[test]
fn a_release_behind_never_moves_last_seen_back() {
    let t = SharedFlowTable::<u32>::new(cfg(64, 100)).unwrap();
    let h = hash_key(&7u32);
    let (ahead, _) = t.acquire(&7, h, 1000, |_, _| {}).unwrap();
    let (behind, _) = t.acquire(&7, h, 10, |_, _| {}).unwrap();
    assert_eq!(t.release(ahead, 1000), ReleaseOutcome::Referenced);
    assert_eq!(t.release(behind, 10), ReleaseOutcome::Unreferenced);
    assert_eq!(t.expire(1100, 64, |_, _| {}), 0, "touched at 1000: live at 1100");
    assert_eq!(t.expire(1101, 64, |_, _| {}), 1);
}

#[test]
fn expiry_work_is_bounded_by_budget() {
    let t = SharedFlowTable::<u32>::new(cfg(1000, 10)).unwrap();
    for k in 0..1000u32 {
        t.lookup_or_insert(&k, hash_key(&k), 0, |_, _| {}).unwrap();
    }
    let mut total = 0;
    for _ in 0..10 {
        let n = t.expire(100, 100, |_, _| {});
        assert!(n <= 100);
        total += n;
    }
    assert_eq!(total, 1000);
    assert!(t.is_empty());
}

#[test]
fn refcounts_pin_and_release() {
    let t = SharedFlowTable::<u32>::new(cfg(16, 0)).unwrap();
    let hk = hash_key(&9u32);
    let (a, new) = t.acquire(&9, hk, 0, |_, s| s[0].store(1, Relaxed)).unwrap();
    assert!(new);
    let (b, new) = t.acquire(&9, hk, 0, |_, _| unreachable!()).unwrap();
    assert!(!new);
    assert_eq!(a, b);
    assert_eq!(t.refcount(a), Some(2));
    assert_eq!(t.release(a, 0), ReleaseOutcome::Referenced);
    assert_eq!(t.release(b, 0), ReleaseOutcome::Removed);
    assert_eq!(t.release(b, 0), ReleaseOutcome::Invalid, "double release must be refused");
    assert!(!t.is_current(a));
    assert_eq!(t.read_state(a, |s| s[0].load(Relaxed)), None);
    assert!(!t.try_acquire(a));
    assert!(t.is_empty());

    // Explicit removal of a pinned entry is deferred to the last release.
    let (c, _) = t.acquire(&9, hk, 0, |_, s| s[0].store(2, Relaxed)).unwrap();
    assert_eq!(t.remove(&9, hk), RemoveOutcome::Deferred);
    assert!(!t.lookup(&9, hk).is_some());
    assert_eq!(t.state(c).unwrap()[0].load(Relaxed), 2, "pinned state stays usable");
    assert_eq!(t.len(), 1);
    assert_eq!(t.release(c, 0), ReleaseOutcome::Removed);
    assert!(t.is_empty());
}

#[test]
fn foreign_and_stale_handles_are_harmless() {
    let t = SharedFlowTable::<u32>::new(cfg(4, 0)).unwrap();
    let bogus = SharedHandle::from_bits(u64::MAX - 5);
    assert!(t.state(bogus).is_none());
    assert_eq!(t.release(bogus, 0), ReleaseOutcome::Invalid);
    assert!(!t.try_acquire(bogus));
    assert_eq!(t.refcount(SharedHandle::NONE), None);
    assert!(t.key(SharedHandle::NONE).is_none());
    let (h, _) = t.lookup_or_insert(&1, hash_key(&1u32), 0, |_, _| {}).unwrap();
    assert_eq!(SharedHandle::from_bits(h.to_bits()), h);
    t.remove(&1, hash_key(&1u32));
    let (h2, _) = t.lookup_or_insert(&2, hash_key(&2u32), 0, |_, _| {}).unwrap();
    if h2.index() == h.index() {
        assert_ne!(h2, h, "reuse must change the generation");
    }
    assert!(t.key(h).is_none());
}

#[test]
fn key_types_round_trip() {
    fn rt<K: SharedKey + std::fmt::Debug>(k: K) {
        assert_eq!(K::from_words(k.to_words()), k);
    }
    rt(0xdead_beefu32);
    rt(u64::MAX);
    rt(u128::MAX - 3);
    rt((7u32, 9u32));
    rt(Ipv4Addr::new(10, 1, 2, 3));
    rt(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1));
    let t = SharedFlowTable::<Ipv6Addr>::new(cfg(8, 0)).unwrap();
    let k = Ipv6Addr::LOCALHOST;
    t.lookup_or_insert(&k, hash_key(&k), 0, |_, _| {}).unwrap();
    let mut keys = Vec::new();
    t.for_each(|_, k, _| keys.push(*k));
    assert_eq!(keys, vec![k]);
}

#[test]
fn table_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<SharedFlowTable<u32>>();
    check::<SharedFlowTable<Ipv6Addr>>();
}

/// Refcounted removal as the engine's auxiliary state uses it (one pin per flow on its coarse entry): a batch pins
/// each row, repeated keys included; an entry stays while any pin is held, goes with the last release (no timeout),
/// and an explicit removal of a pinned entry waits for the last of several pins.
#[test]
fn pins_are_per_row_and_the_last_release_removes() {
    let t = SharedFlowTable::<u32>::new(cfg(1024, 0)).unwrap();
    let keys: Vec<u32> = (0..150).map(|i| i % 5).collect();
    let hashes: Vec<u64> = keys.iter().map(hash_key).collect();
    let mut out = vec![SharedHandle::NONE; keys.len()];
    let r = t.acquire_batch(&keys, &hashes, 0, &mut out, |k, s| s[0].store(u64::from(*k) + 1, Relaxed));
    assert_eq!((r.hit, r.inserted, r.failed), (145, 5, 0));
    assert_eq!(t.len(), 5);
    for k in 0..5u32 {
        let h = t.lookup(&k, hash_key(&k));
        assert_eq!(t.refcount(h), Some(keys.iter().filter(|&&x| x == k).count() as u32));
        assert_eq!(t.state(h).unwrap()[0].load(Relaxed), u64::from(k) + 1);
    }
    // Per-row updates through any pin land in the one entry.
    for h in &out {
        t.state(*h).unwrap()[1].fetch_add(1, Relaxed);
    }
    assert_eq!(t.state(out[0]).unwrap()[1].load(Relaxed), 30);
    let mut removed = 0;
    for (i, h) in out.iter().enumerate() {
        match t.release(*h, 1) {
            ReleaseOutcome::Referenced => assert!(i < 145, "row {i}: entry outlived its pins"),
            ReleaseOutcome::Removed => removed += 1,
            o => panic!("row {i}: {o:?}"),
        }
    }
    assert_eq!(removed, 5);
    assert!(t.is_empty());

    // Removal while three pins are held: gone from lookups at once, freed by the third release.
    let hk = hash_key(&77u32);
    let pins: Vec<SharedHandle> = (0..3).map(|_| t.acquire(&77, hk, 0, |_, _| {}).unwrap().0).collect();
    assert_eq!(t.remove(&77, hk), RemoveOutcome::Deferred);
    assert_eq!(t.remove(&77, hk), RemoveOutcome::NotFound);
    assert!(!t.lookup(&77, hk).is_some());
    assert!(!t.try_acquire(pins[0]), "a removed entry cannot be pinned again");
    assert_eq!(t.release(pins[0], 0), ReleaseOutcome::Referenced);
    assert_eq!(t.release(pins[1], 0), ReleaseOutcome::Referenced);
    assert_eq!(t.len(), 1);
    assert_eq!(t.release(pins[2], 0), ReleaseOutcome::Removed);
    assert!(t.is_empty());
}

/// A full table refuses new pins (counted), leaves existing pins alone, and a timeout keeps an unpinned entry until
/// it has been idle for it.
#[test]
fn full_table_refuses_pins_and_timeout_applies_after_last_release() {
    let t = SharedFlowTable::<u32>::new(cfg(1, 100)).unwrap();
    let (a, _) = t.acquire(&1, hash_key(&1u32), 0, |_, _| {}).unwrap();
    let (b, _) = t.acquire(&1, hash_key(&1u32), 0, |_, _| {}).unwrap();
    let mut out = [SharedHandle::NONE; 2];
    let r = t.acquire_batch(&[2, 1], &[hash_key(&2u32), hash_key(&1u32)], 0, &mut out, |_, _| {});
    assert_eq!((r.hit, r.inserted, r.failed), (1, 0, 1));
    assert_eq!(out[0], SharedHandle::NONE);
    assert_eq!(t.failed_inserts(), 1);
    assert_eq!(t.refcount(a), Some(3));
    assert_eq!(t.release(out[1], 10), ReleaseOutcome::Referenced);
    assert_eq!(t.release(a, 20), ReleaseOutcome::Referenced);
    // Pinned: the sweep cannot remove it however idle it looks.
    assert_eq!(t.expire(10_000, 64, |_, _| {}), 0);
    assert_eq!(t.release(b, 50), ReleaseOutcome::Unreferenced);
    assert_eq!(t.expire(150, 64, |_, _| {}), 0, "idle for 100, not more");
    assert_eq!(t.expire(151, 64, |_, _| {}), 1);
    assert!(t.is_empty());
}

/// Slices that disagree are a caller bug: the call stops loudly instead of skipping rows.
#[test]
#[should_panic(expected = "batch of 3 keys with 3 hashes and room for 2 results")]
fn short_output_slice_panics() {
    let t = SharedFlowTable::<u32>::new(cfg(16, 0)).unwrap();
    let keys = [1u32, 2, 3];
    let hashes: Vec<u64> = keys.iter().map(hash_key).collect();
    t.lookup_batch(&keys, &hashes, &mut [SharedHandle::NONE; 2]);
}
