//! Multi-threaded stress of the shared table: no lost and no phantom entries.
//!
//! Each thread owns a disjoint key range that only it inserts and removes, so it knows
//! exactly which of its keys are present; all threads also look up a stable key set
//! (inserted up front, never removed) and each other's keys. Checks, under millions of
//! mixed operations on a small, heavily loaded table (so cuckoo moves and entry reuse
//! happen constantly):
//! - a stable key is always found (never missed by a reader during moves);
//! - an owned key is found iff the owner's model says so;
//! - a hit on any key never yields another key or another key's state;
//! - pins taken and released concurrently leave every refcount at 0;
//! - at the end the table holds exactly the union of the models.

use flowplane_table::shared::{hash_key, ReleaseOutcome, SharedFlowTable, SharedHandle, SharedTableConfig};
use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

const THREADS: u64 = 4;
const STABLE: u64 = 1000;
const OWNED_PER_THREAD: u64 = 3000;
const OPS_PER_THREAD: u64 = 2_000_000;
/// A timeout that never elapses (`expire` is never called): releasing the last pin of a
/// stable key must not remove it, as it would with no timeout.
const NEVER: u64 = u64::MAX / 2;

fn value_of(k: u64) -> u64 {
    k.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

fn owned_key(tid: u64, i: u64) -> u64 {
    1_000_000 * (tid + 1) + i
}

#[test]
fn concurrent_mixed_ops_lose_nothing_and_invent_nothing() {
    // About 1000 stable + 4 x 1500 owned keys live (each owned key toggles): ~7000 of 8192 slots (85%),
    // so primary buckets overflow and cuckoo moves run concurrently with readers.
    let t = Arc::new(
        SharedFlowTable::<u64>::new(SharedTableConfig { capacity: 7400, state_words: 2, idle_timeout_ns: NEVER })
            .unwrap(),
    );
    for k in 0..STABLE {
        t.lookup_or_insert(&k, hash_key(&k), 0, |k, s| s[0].store(value_of(*k), Relaxed)).unwrap();
    }
    let handles: Vec<_> = (0..THREADS)
        .map(|tid| {
            let t = t.clone();
            std::thread::spawn(move || {
                let mut rng = 0x1234_5678u64 ^ (tid << 40);
                let mut next = || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut present: HashSet<u64> = HashSet::new();
                let mut batch_keys = [0u64; 16];
                let mut batch_hashes = [0u64; 16];
                let mut out = [SharedHandle::NONE; 16];
                for _ in 0..OPS_PER_THREAD / 16 {
                    let r = next();
                    match r % 8 {
                        0..=2 => {
                            // Insert or remove one of our own keys, 16 times.
                            for _ in 0..16 {
                                let k = owned_key(tid, next() % OWNED_PER_THREAD);
                                let h = hash_key(&k);
                                if present.contains(&k) {
                                    assert_eq!(t.remove(&k, h), flowplane_table::shared::RemoveOutcome::Removed);
                                    present.remove(&k);
                                } else {
                                    let (hd, new) = t
                                        .lookup_or_insert(&k, h, 0, |k, s| s[0].store(value_of(*k), Relaxed))
                                        .expect("table sized never to fill");
                                    assert!(new, "phantom: own key {k} present before insert");
                                    assert_eq!(t.state(hd).unwrap()[0].load(Relaxed), value_of(k));
                                    present.insert(k);
                                }
                            }
                        }
                        3 => {
                            // Pin and unpin stable keys (refcount traffic on shared entries).
                            for i in 0..16 {
                                batch_keys[i] = next() % STABLE;
                                batch_hashes[i] = hash_key(&batch_keys[i]);
                            }
                            let res = t.acquire_batch(&batch_keys, &batch_hashes, 0, &mut out, |_, _| {
                                panic!("stable key missing")
                            });
                            assert_eq!(res.hit, 16);
                            for (i, hd) in out.iter().enumerate() {
                                let s = t.state(*hd).unwrap();
                                assert_eq!(s[0].load(Relaxed), value_of(batch_keys[i]));
                                s[1].fetch_add(1, Relaxed);
                            }
                            for hd in out {
                                t.release(hd, 0);
                            }
                        }
                        _ => {
                            // Batched lookups over stable, own and other threads' keys.
                            for i in 0..16 {
                                let x = next();
                                batch_keys[i] = match x % 3 {
                                    0 => x % STABLE,
                                    1 => owned_key(tid, (x >> 8) % OWNED_PER_THREAD),
                                    _ => owned_key((x >> 4) % THREADS, (x >> 8) % OWNED_PER_THREAD),
                                };
                                batch_hashes[i] = hash_key(&batch_keys[i]);
                            }
                            t.lookup_batch(&batch_keys, &batch_hashes, &mut out);
                            for i in 0..16 {
                                let k = batch_keys[i];
                                let hd = out[i];
                                if k < STABLE {
                                    assert!(hd.is_some(), "lost stable key {k}");
                                } else if k / 1_000_000 == tid + 1 {
                                    assert_eq!(hd.is_some(), present.contains(&k), "own key {k} wrong");
                                }
                                if hd.is_some() {
                                    if let Some(v) = t.read_state(hd, |s| s[0].load(Relaxed)) {
                                        assert_eq!(v, value_of(k), "state of another key returned for {k}");
                                    }
                                    if let Some(key) = t.key(hd) {
                                        assert_eq!(key, k, "handle for {k} names another key");
                                    }
                                }
                            }
                        }
                    }
                }
                present
            })
        })
        .collect();
    let mut expected: HashSet<u64> = (0..STABLE).collect();
    for h in handles {
        expected.extend(h.join().unwrap());
    }
    assert_eq!(t.len(), expected.len());
    let mut seen = HashSet::new();
    t.for_each(|hd, k, s| {
        assert!(expected.contains(k), "phantom key {k}");
        assert_eq!(s[0].load(Relaxed), value_of(*k));
        assert_eq!(t.refcount(hd), Some(0), "leaked pin on {k}");
        assert!(seen.insert(*k), "duplicate key {k}");
    });
    assert_eq!(seen, expected);
    for k in &expected {
        assert!(t.lookup(k, hash_key(k)).is_some(), "lost key {k}");
    }
    assert_eq!(t.failed_inserts(), 0);
}

/// Pins taken and released on few coarse keys by two threads, with no timeout: every last release removes the
/// entry, racing with the other thread's acquires (which must then re-insert, never pin a dying entry). Each thread
/// knows its own pins, so at every quiet point a live entry's refcount is exactly the pins held on it.
#[test]
fn concurrent_pins_with_removal_on_last_release_stay_exact() {
    const KEYS: u32 = 16;
    let t = Arc::new(
        SharedFlowTable::<u32>::new(SharedTableConfig { capacity: 64, state_words: 2, idle_timeout_ns: 0 }).unwrap(),
    );
    let workers: Vec<_> = (0..2u64)
        .map(|tid| {
            let t = t.clone();
            std::thread::spawn(move || {
                let mut held: Vec<(u32, SharedHandle)> = Vec::new();
                let mut rng = 0x9E37_79B9u64 + tid;
                for _ in 0..200_000 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let k = (rng % u64::from(KEYS)) as u32;
                    if rng >> 40 & 1 == 0 && held.len() < 40 {
                        let (h, _) = t.acquire(&k, hash_key(&k), 0, |k, s| s[0].store(u64::from(*k), Relaxed)).unwrap();
                        let s = t.state(h).unwrap();
                        assert_eq!(s[0].load(Relaxed), u64::from(k), "pinned another key's entry");
                        s[1].fetch_add(1, Relaxed);
                        held.push((k, h));
                    } else if !held.is_empty() {
                        let (_, h) = held.swap_remove((rng >> 20) as usize % held.len());
                        assert_ne!(t.release(h, 0), ReleaseOutcome::Invalid);
                    }
                }
                held
            })
        })
        .collect();
    let held: Vec<(u32, SharedHandle)> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    let mut live = 0;
    t.for_each(|h, k, _| {
        let pins = held.iter().filter(|(x, _)| x == k).count();
        assert!(pins > 0, "key {k} has no pin but was not removed");
        assert_eq!(t.refcount(h), Some(pins as u32), "key {k}");
        live += 1;
    });
    assert_eq!(t.len(), live);
    for (_, h) in held {
        assert_ne!(t.release(h, 0), ReleaseOutcome::Invalid);
    }
    assert!(t.is_empty(), "pins leaked: {} entries left", t.len());
}
