//! Load factor, full-table policies, expiry with a controllable clock, and bounded memory under churn.

//! Every test that does not depend on the bucket geometry runs on both layouts.

use flowplane_table::{
    FlowTable, FullPolicy, Layout, TableConfig, TableError, Upsert, BULK_LOOKUP_MAX, INVALID_HANDLE,
};

const LAYOUTS: [Layout; 2] = [Layout::Bucketed, Layout::Inline];

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn cfg(capacity: usize, timeout: Option<u64>, policy: FullPolicy) -> TableConfig {
    cfg_in(Layout::Bucketed, capacity, timeout, policy)
}

fn cfg_in(layout: Layout, capacity: usize, timeout: Option<u64>, policy: FullPolicy) -> TableConfig {
    TableConfig { capacity, state_size: 64, idle_timeout_ns: timeout, full_policy: policy, hugepages: false, layout }
}

#[test]
fn fills_to_capacity_without_failure() {
    for layout in LAYOUTS {
        for cap in [1usize, 7, 100, 4096, 100_000] {
            let mut t = FlowTable::<u64>::new(cfg_in(layout, cap, None, FullPolicy::Reject)).unwrap();
            for k in 0..cap as u64 {
                assert!(t.insert(&k, mix(k), 0, |_| {}).is_ok(), "cap {cap}: insert {k} failed");
            }
            assert_eq!(t.len(), cap);
            assert!(t.len() * 10 <= t.slots() * 9, "a full slab loads at most 90% of the slots");
            for k in 0..cap as u64 {
                assert!(t.lookup(&k, mix(k)).is_some());
            }
        }
    }
}

#[test]
fn reject_policy_counts_and_reports() {
    for layout in LAYOUTS {
        let mut t = FlowTable::<u64>::new(cfg_in(layout, 100, None, FullPolicy::Reject)).unwrap();
        for k in 0..100u64 {
            t.insert(&k, mix(k), 0, |_| {}).unwrap();
        }
        assert_eq!(t.insert(&1000, mix(1000), 0, |_| {}), Err(TableError::Full));
        // Existing keys still "insert" (they are found).
        assert_eq!(t.insert(&5, mix(5), 0, |_| {}).map(|(_, new)| new), Ok(false));
        let keys = [2000u64, 3, 2001];
        let hashes: Vec<u64> = keys.iter().map(|&k| mix(k)).collect();
        let mut out = [0u32; 3];
        let r = t.lookup_or_insert_batch(&keys, &hashes, 0, &mut out, |_, _| {});
        assert_eq!((r.hit, r.inserted, r.failed), (1, 0, 2));
        assert_eq!([out[0], out[2]], [INVALID_HANDLE; 2]);
        assert_eq!(t.key(out[1]), Some(&3));
        let s = t.stats();
        assert_eq!((s.full_events, s.evictions, t.len()), (3, 0, 100));
    }
}

#[test]
fn evict_policy_evicts_least_recently_seen_candidate() {
    // The bucket geometry decides the candidates (the inline layout's: `inline::tests`).
    {
        let layout = Layout::Bucketed;
        // Capacity 7 -> a single bucket: both candidates are that bucket, so the victim is the global LRU.
        let mut t = FlowTable::<u64>::new(cfg_in(layout, 7, None, FullPolicy::EvictLruIdle)).unwrap();
        assert_eq!(t.slots(), 8);
        for k in 0..7u64 {
            t.insert(&k, mix(k), 10 + k, |s| s[0] = k as u8).unwrap();
        }
        let h0 = t.lookup(&0, mix(0)).unwrap();
        t.touch(h0, 100);
        let (h, new) = t.insert(&99, mix(99), 101, |s| s[0] = 99).unwrap();
        assert!(new);
        assert_eq!(t.state(h)[0], 99, "state of the reused entry is fresh");
        assert!(t.lookup(&1, mix(1)).is_none(), "key 1 was least recently seen");
        assert!(t.lookup(&0, mix(0)).is_some());
        assert_eq!((t.len(), t.stats().evictions, t.stats().full_events), (7, 1, 0));
        // In a batch, a key hit earlier in the batch is protected even if it is the LRU (key 2, seen at 12).
        let keys = [2u64, 500];
        let hashes = [mix(2), mix(500)];
        let mut out = [0u32; 2];
        let mut inits = Vec::new();
        let r = t.lookup_or_insert_batch(&keys, &hashes, 5, &mut out, |i, _| inits.push(i));
        assert_eq!((r.hit, r.inserted, inits), (1, 1, vec![1]));
        assert_eq!(t.key(out[0]), Some(&2));
        assert_eq!(t.key(out[1]), Some(&500));
        assert!(t.lookup(&3, mix(3)).is_none(), "next LRU (key 3) evicted instead");
    }
}

#[test]
fn evict_protects_an_idle_hit_not_yet_renewed_and_handles_of_earlier_chunks() {
    // One bucket (capacity 7), idle timeout 50: keys 0..7 seen at 0..6.
    let mut t = FlowTable::<u64>::new(cfg(7, Some(50), FullPolicy::EvictLruIdle)).unwrap();
    for k in 0..7u64 {
        t.insert(&k, mix(k), k, |_| {}).unwrap();
    }
    // At 100 every entry is idle. Key 100 comes first and needs a victim: the LRU (key 0, seen at 0, before the
    // call's first packet) is a hit of this very chunk still waiting to be renewed, so key 1 goes instead.
    let keys = [100u64, 0];
    let hashes = [mix(100), mix(0)];
    let mut out = [0u32; 2];
    let r = t.upsert_batch(&keys, &hashes, 100, &mut out, |_, _| {});
    assert_eq!((r.inserted, r.failed), (2, 0), "the new key and the renewed idle one");
    assert_eq!((t.key(out[0]), t.key(out[1])), (Some(&100), Some(&0)));
    assert!(t.lookup(&1, mix(1)).is_none(), "key 1, the oldest unprotected entry, was evicted");
    // Across chunks: the first chunk touches keys 2..7 at 200; a later chunk's new keys must not evict them,
    // even though each is older than some entry they could pick: with no unprotected candidate left, they fail.
    let mut keys: Vec<u64> = (2..7).collect();
    keys.resize(BULK_LOOKUP_MAX, 2);
    keys.extend([1000u64, 1001, 1002]);
    let hashes: Vec<u64> = keys.iter().map(|&k| mix(k)).collect();
    let mut out = vec![0u32; keys.len()];
    let times: Vec<u64> = vec![200; keys.len()];
    let r = t.upsert_batch(&keys, &hashes, times.as_slice(), &mut out, |_, _| {});
    for k in 2..7u64 {
        assert!(t.lookup(&k, mix(k)).is_some(), "key {k}, handed out by the first chunk, stays");
    }
    assert!(t.lookup(&0, mix(0)).is_none() && t.lookup(&100, mix(100)).is_none(), "the two unprotected went");
    assert_eq!(r.failed, 1, "the third new key finds every candidate protected");
}

#[test]
fn evicted_flows_are_handed_to_the_upsert_callback_before_reuse() {
    // The bucket geometry decides the candidates (the inline layout's: `inline::tests`).
    {
        let layout = Layout::Bucketed;
        // A flow exporter's last record of an evicted flow needs its key and state (issue 34): the upsert
        // callbacks see them before the entry is rewritten, then the new key's fresh state.
        let mut t = FlowTable::<u64>::new(cfg_in(layout, 7, None, FullPolicy::EvictLruIdle)).unwrap();
        for k in 0..7u64 {
            t.insert(&k, mix(k), 10 + k, |s| s[0] = 100 + k as u8).unwrap();
        }
        let mut events = Vec::new();
        t.upsert(&50, mix(50), 30, |u| match u {
            Upsert::Evicted(k, s) => events.push(("evicted", *k, s[0])),
            Upsert::New(s) => events.push(("new", 50, s[0])),
            Upsert::Expired(_) => panic!("no timeout"),
        })
        .unwrap();
        // Key 0 was least recently seen (at 10): its key and state, then the zeroed entry for 50.
        assert_eq!(events, vec![("evicted", 0, 100), ("new", 50, 0)]);
        // Batched: key 1 (seen at 11) goes for key 51, key 2 for 52, each reported before its reuse.
        let keys = [51u64, 52];
        let hashes = [mix(51), mix(52)];
        let mut out = [0u32; 2];
        let mut events = Vec::new();
        t.upsert_batch(&keys, &hashes, 40u64, &mut out, |i, u| match u {
            Upsert::Evicted(k, s) => events.push((i, *k, s[0])),
            Upsert::New(_) => events.push((i, keys[i], 0)),
            Upsert::Expired(_) => panic!("no timeout"),
        });
        assert_eq!(events, vec![(0, 1, 101), (0, 51, 0), (1, 2, 102), (1, 52, 0)]);
        assert_eq!(t.stats().evictions, 3);
    }
}

#[test]
fn invalid_config_and_handles_are_errors_not_panics() {
    for layout in LAYOUTS {
        assert!(FlowTable::<u64>::new(cfg_in(layout, 0, None, FullPolicy::Reject)).is_err());
        assert!(FlowTable::<u64>::new(cfg_in(layout, 10, Some(0), FullPolicy::Reject)).is_err());
        assert!(FlowTable::<u64>::new(TableConfig::new(10, usize::MAX)).is_err());
        let mut t = FlowTable::<u64>::new(cfg_in(layout, 10, None, FullPolicy::Reject)).unwrap();
        assert!(t.state(12345).is_empty());
        assert!(t.state_mut(u32::MAX).is_empty());
        assert_eq!(t.key(3), None);
        assert!(!t.remove_handle(3));
        assert!(!t.remove_handle(u32::MAX));
        t.touch(u32::MAX, 5);
        let (h, _) = t.insert(&1, mix(1), 0, |_| {}).unwrap();
        assert!(t.state_as::<u64>(h, 1).is_none(), "misaligned");
        assert!(t.state_as::<u64>(h, t.state_len()).is_none(), "out of range");
        assert!(t.state_as::<u64>(h, usize::MAX).is_none());
        assert_eq!(t.expire(u64::MAX, 100, |_, _, _| {}), 0, "no timeout configured");
        // Empty batches are fine; a longer output slice than needed too.
        assert_eq!(t.lookup_batch(&[], &[], &mut []), 0);
        let mut out = [7u32; 3];
        assert_eq!(t.lookup_batch(&[1, 2], &[mix(1), mix(2)], &mut out), 1);
        assert_eq!(out, [h, INVALID_HANDLE, 7]);
    }
}

/// A batch whose slices disagree is a caller bug: it stops loudly instead of skipping keys.
#[test]
#[should_panic(expected = "batch of 2 keys with 1 hashes")]
fn mismatched_batch_slices_panic() {
    let t = FlowTable::<u64>::new(cfg(16, None, FullPolicy::Reject)).unwrap();
    t.lookup_batch(&[1, 2], &[mix(1)], &mut [0; 2]);
}

#[test]
#[should_panic(expected = "room for 1 results")]
fn short_output_slice_panics() {
    let mut t = FlowTable::<u64>::new(cfg(16, None, FullPolicy::Reject)).unwrap();
    t.lookup_or_insert_batch(&[1, 2], &[mix(1), mix(2)], 0, &mut [0; 1], |_, _| {});
}

/// Batches longer than one bulk chunk are processed whole, in chunks of `BULK_LOOKUP_MAX`: no key is skipped,
/// `init` gets batch-wide indices, repeated keys are inserted once across chunks, and entries handed out by an
/// earlier chunk are never evicted by a later chunk's inserts.
#[test]
fn batches_longer_than_a_chunk_process_every_key() {
    for layout in LAYOUTS {
        let n = 3 * BULK_LOOKUP_MAX + 5;
        let mut t = FlowTable::<u64>::new(cfg_in(layout, 1000, None, FullPolicy::Reject)).unwrap();
        let keys: Vec<u64> = (0..n as u64).map(|i| i % 150).collect();
        let hashes: Vec<u64> = keys.iter().map(|&k| mix(k)).collect();
        let mut out = vec![0u32; n];
        let mut inits = Vec::new();
        let r = t.lookup_or_insert_batch(&keys, &hashes, 1, &mut out, |i, s| {
            inits.push(i);
            s[0] = keys[i] as u8;
        });
        assert_eq!((r.hit, r.inserted, r.failed), (n - 150, 150, 0));
        assert_eq!(inits, (0..150).collect::<Vec<_>>());
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(t.key(out[i]), Some(k), "key {i}");
            assert_eq!(t.state(out[i])[0], *k as u8);
        }
        let probe: Vec<u64> = (0..n as u64).collect();
        let ph: Vec<u64> = probe.iter().map(|&k| mix(k)).collect();
        let mut found = vec![0u32; n];
        assert_eq!(t.lookup_batch(&probe, &ph, &mut found), 150);
        assert!(found[150..].iter().all(|&h| h == INVALID_HANDLE));
        assert_eq!(t.stats().lookups, (2 * n) as u64);

        // Eviction across chunks: a one-bucket table (7 entries) under EvictLruIdle and 70 new keys. The first 7 are
        // inserted; every later key, in this chunk or the next, would have to evict an entry this call handed out
        // (protected), so it fails instead of recycling a handle the caller already holds.
        let mut t = FlowTable::<u64>::new(cfg_in(layout, 7, None, FullPolicy::EvictLruIdle)).unwrap();
        let keys: Vec<u64> = (1000..1070).collect();
        let hashes: Vec<u64> = keys.iter().map(|&k| mix(k)).collect();
        let mut out = vec![0u32; keys.len()];
        let r = t.lookup_or_insert_batch(&keys, &hashes, 1, &mut out, |_, _| {});
        assert_eq!((r.hit, r.inserted, r.failed), (0, 7, 63), "no entry handed out by this call is evicted");
        for (i, k) in keys.iter().enumerate().take(7) {
            assert_eq!(t.key(out[i]), Some(k));
        }
        assert!(out[7..].iter().all(|&h| h == INVALID_HANDLE));
    }
}

#[test]
fn hugepage_request_falls_back() {
    for layout in LAYOUTS {
        let mut c = cfg_in(layout, 1000, None, FullPolicy::Reject);
        c.hugepages = true;
        let mut t = FlowTable::<u64>::new(c).unwrap();
        let (h, _) = t.insert(&7, mix(7), 0, |s| s[3] = 3).unwrap();
        assert_eq!(t.state(h)[3], 3);
    }
}

#[test]
fn expiry_with_controllable_clock() {
    for layout in LAYOUTS {
        let mut t = FlowTable::<u64>::new(cfg_in(layout, 1000, Some(100), FullPolicy::Reject)).unwrap();
        for k in 0..1000u64 {
            t.insert(&k, mix(k), 0, |s| s[0] = (k % 251) as u8).unwrap();
        }
        assert_eq!(t.expire(100, usize::MAX, |_, _, _| {}), 0, "idle == timeout is not expired");
        // Keep the even keys alive.
        for k in (0..1000u64).step_by(2) {
            let h = t.lookup(&k, mix(k)).unwrap();
            t.touch(h, 150);
        }
        // Bounded work: each call examines at most 64 entries, so it expires at most 64.
        let mut expired = Vec::new();
        let mut calls = 0;
        while expired.len() < 500 {
            let n = t.expire(200, 64, |_, k, s| {
                assert_eq!(s[0], (*k % 251) as u8, "callback sees the state");
                expired.push(*k);
            });
            // Inline: 64 entries' worth of positions (about twice as many), so about as many live entries.
            assert!(n <= if layout == Layout::Bucketed { 64 } else { 64 * 3 });
            calls += 1;
            assert!(calls <= 1000 / 64 + 1, "a full sweep takes capacity/budget calls");
        }
        expired.sort_unstable();
        assert_eq!(expired, (1..1000).step_by(2).collect::<Vec<u64>>());
        assert_eq!(t.len(), 500);
        assert_eq!(t.stats().expiries, 500);
    }
}

#[test]
fn backwards_clock_never_expires_early_nor_panics() {
    for layout in LAYOUTS {
        let mut t = FlowTable::<u64>::new(cfg_in(layout, 64, Some(100), FullPolicy::Reject)).unwrap();
        for k in 0..50u64 {
            t.insert(&k, mix(k), 1_000_000, |_| {}).unwrap();
        }
        // Clock jumps back to 10: nothing expires, entries are rebased to 10.
        assert_eq!(t.expire(10, usize::MAX, |_, _, _| {}), 0);
        assert_eq!(t.expire(110, usize::MAX, |_, _, _| {}), 0);
        assert_eq!(t.len(), 50);
        assert_eq!(t.expire(111, usize::MAX, |_, _, _| {}), 50, "one timeout after the jump was seen");
        // Extreme clocks.
        t.insert(&1, mix(1), u64::MAX, |_| {}).unwrap();
        assert_eq!(t.expire(0, usize::MAX, |_, _, _| {}), 0);
        assert_eq!(t.expire(u64::MAX, usize::MAX, |_, _, _| {}), 1);
    }
}

#[test]
fn endless_churn_keeps_memory_bounded() {
    for layout in LAYOUTS {
        const CAP: usize = 2000;
        for policy in [FullPolicy::Reject, FullPolicy::EvictLruIdle] {
            let mut t = FlowTable::<u64>::new(cfg_in(layout, CAP, Some(1_000), policy)).unwrap();
            let mut out = [0u32; 32];
            let mut next = 0u64;
            let mut live_expired = 0usize;
            for step in 0..40_000u64 {
                let now = step * 10;
                let keys: Vec<u64> =
                    (0..32).map(|i| if i % 4 == 0 { next + i } else { next.saturating_sub(i * 3) }).collect();
                next += 8;
                let hashes: Vec<u64> = keys.iter().map(|&k| mix(k)).collect();
                t.lookup_or_insert_batch(&keys, &hashes, now, &mut out, |_, _| {});
                live_expired += t.expire(now, 64, |_, _, _| {});
                assert!(t.len() <= CAP);
            }
            assert!(live_expired > 100_000 / 2, "expiry keeps up with churn");
            // Far in the future everything expires and the whole slab is reusable: no leaked entries.
            while t.expire(u64::MAX / 2, CAP, |_, _, _| {}) > 0 {}
            assert_eq!(t.len(), 0);
            for k in 0..CAP as u64 {
                t.insert(&(k + (1 << 40)), mix(k + (1 << 40)), 0, |_| {}).unwrap();
            }
            assert_eq!(t.len(), CAP);
            assert_eq!(t.iter().count(), CAP);
        }
    }
}

/// A flow idle past its timeout but not yet swept is expired on lookup, as a conntrack does: its old state is
/// handed over for release, the entry starts over zeroed, and per-key times decide (not the batch's latest time).
#[test]
fn idle_entries_are_expired_on_lookup_with_per_key_times() {
    for layout in LAYOUTS {
        const T: u64 = 1_000;
        let mut t = FlowTable::<u64>::new(cfg_in(layout, 1024, Some(T), FullPolicy::Reject)).unwrap();
        let (a, b) = (7u64, 8u64);
        for k in [a, b] {
            t.insert(&k, mix(k), 100, |s| s[0] = 42).unwrap();
        }
        // b is seen once more at 600: idle for exactly T at 1600, which is not "longer than" T.
        t.insert(&b, mix(b), 600, |_| {}).unwrap();
        let keys = [a, a, b, 99];
        let hashes: Vec<u64> = keys.iter().map(|&k| mix(k)).collect();
        let times = [1_101u64, 1_102, 1_600, 1_700];
        let mut out = [0u32; 4];
        let mut events = Vec::new();
        let r = t.upsert_batch(&keys, &hashes, &times[..], &mut out, |i, u| match u {
            Upsert::Expired(old) => events.push((i, "expired", old[0])),
            Upsert::New(s) => {
                events.push((i, "new", s[0]));
                s[0] = i as u8 + 1;
            }
            Upsert::Evicted(..) => panic!("no eviction under Reject"),
        });
        // a at 1101 is 1001 ns idle: expired then renewed (zeroed); its second packet is a hit; b is live; 99 is new.
        assert_eq!(events, vec![(0, "expired", 42), (0, "new", 0), (3, "new", 0)]);
        assert_eq!((r.hit, r.inserted, r.failed), (2, 2, 0));
        assert_eq!(out[0], out[1]);
        assert_eq!(t.state(out[0])[0], 1);
        assert_eq!(t.last_seen(out[0]), Some(1_102));
        assert_eq!(t.state(out[2])[0], 42, "b kept its state");
        assert_eq!(t.stats().expiries, 1);
        assert_eq!(t.len(), 3);
        // Single-key path: the same rule, and a clock that went backwards never expires anything.
        let mut seen = Vec::new();
        let (h, new) = t.upsert(&b, mix(b), 3_000, |u| seen.push(matches!(u, Upsert::Expired(_)))).unwrap();
        assert!(new && seen == [true, false] && h == out[2]);
        assert!(!t.upsert(&a, mix(a), 5, |_| panic!("no callback for a live entry")).unwrap().1);
        assert_eq!(t.stats().expiries, 2);
        // An expiry on lookup is an expiry and an insertion: the books balance.
        let s = t.stats();
        assert_eq!(s.inserts, t.len() as u64 + s.expiries + s.removes + s.evictions);
    }
}
