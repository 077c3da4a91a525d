//! Loom model checks of the shared table's version-counter protocol.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p flowplane-table --test loom_shared --release`.
//! Each model is one writer and one lock-free reader on a tiny table whose hashes are
//! chosen by hand so that the interesting bucket states (shared bucket, full buckets,
//! a forced cuckoo move, entry reuse) happen with few operations.
#![cfg(loom)]

use flowplane_table::shared::{RemoveOutcome, SharedFlowTable, SharedHandle, SharedTableConfig};
use loom::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

type Table = SharedFlowTable<u64>;

fn table(capacity: usize, timeout: u64) -> Table {
    SharedFlowTable::new(SharedTableConfig { capacity, state_words: 1, idle_timeout_ns: timeout }).unwrap()
}

/// A hash whose primary bucket is `b1` and alternate is `b2` (found by scanning tags).
fn hash_for(t: &Table, b1: usize, b2: usize, skip: usize) -> u64 {
    let mut seen = 0;
    for tag in 1..=u64::from(u16::MAX) {
        let h = (tag << 48) | b1 as u64;
        if t.candidate_buckets(h) == (b1, b2) {
            if seen == skip {
                return h;
            }
            seen += 1;
        }
    }
    unreachable!("no tag maps bucket {b1} to {b2}")
}

fn insert(t: &Table, k: u64, h: u64) -> SharedHandle {
    let (hd, new) = t.lookup_or_insert(&k, h, 0, |k, s| s[0].store(k * 10, Relaxed)).unwrap();
    assert!(new);
    hd
}

/// The reader's check: a hit must be the key's own entry with the key's own state.
fn check_hit(t: &Table, k: u64, h: u64) -> bool {
    let hd = t.lookup(&k, h);
    if !hd.is_some() {
        return false;
    }
    if let Some(v) = t.read_state(hd, |s| s[0].load(Relaxed)) {
        assert_eq!(v, k * 10, "key {k} returned another key's state");
    }
    if let Some(key) = t.key(hd) {
        assert_eq!(key, k);
    }
    true
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

#[test]
fn reader_sees_present_key_during_insert_into_same_bucket() {
    model(|| {
        let t = Arc::new(table(4, 0));
        let (b1, b2) = (0, t.candidate_buckets(1 << 48).1);
        let ha = hash_for(&t, b1, b2, 0);
        let hb = hash_for(&t, b1, b2, 1);
        insert(&t, 1, ha);
        let w = {
            let t = t.clone();
            loom::thread::spawn(move || {
                insert(&t, 2, hb);
            })
        };
        assert!(check_hit(&t, 1, ha), "present key missed during an insert");
        check_hit(&t, 2, hb);
        w.join().unwrap();
        assert!(check_hit(&t, 2, hb));
    });
}

#[test]
fn reader_never_misses_key_during_remove_of_neighbour() {
    model(|| {
        let t = Arc::new(table(4, 0));
        let (b1, b2) = (1, t.candidate_buckets(1).1);
        let ha = hash_for(&t, b1, b2, 0);
        let hb = hash_for(&t, b1, b2, 1);
        insert(&t, 1, ha);
        insert(&t, 2, hb);
        let w = {
            let t = t.clone();
            loom::thread::spawn(move || {
                assert_eq!(t.remove(&2, hb), RemoveOutcome::Removed);
            })
        };
        assert!(check_hit(&t, 1, ha));
        check_hit(&t, 2, hb);
        w.join().unwrap();
        assert!(!check_hit(&t, 2, hb));
    });
}

#[test]
fn reused_entry_is_never_reported_for_the_old_key() {
    model(|| {
        // Capacity 1: removing A and inserting C must reuse A's entry.
        let t = Arc::new(table(1, 0));
        let ha = hash_for(&t, 0, 1, 0);
        let hc = hash_for(&t, 0, 1, 1);
        insert(&t, 1, ha);
        let w = {
            let t = t.clone();
            loom::thread::spawn(move || {
                assert_eq!(t.remove(&1, ha), RemoveOutcome::Removed);
                insert(&t, 3, hc);
            })
        };
        check_hit(&t, 1, ha);
        check_hit(&t, 3, hc);
        w.join().unwrap();
        assert!(!check_hit(&t, 1, ha));
        assert!(check_hit(&t, 3, hc));
    });
}

#[test]
fn reader_never_misses_key_moved_by_cuckoo_displacement() {
    // Built outside the model to find hashes: 4 buckets (capacity 20).
    let probe = table(20, 0);
    assert_eq!(probe.bucket_count(), 4);
    // X: primary 0, alternate 3 (empty), so the BFS moves X out of full bucket 0.
    let hx = hash_for(&probe, 0, 3, 0);
    // Fillers: 7 more in bucket 0 whose alternate is 1, 8 in bucket 1 whose alternate is 0.
    let fill0: Vec<u64> = (0..7).map(|i| hash_for(&probe, 0, 1, i)).collect();
    let fill1: Vec<u64> = (0..8).map(|i| hash_for(&probe, 1, 0, i)).collect();
    let hy = hash_for(&probe, 0, 1, 7);
    drop(probe);
    model(move || {
        let t = Arc::new(table(20, 0));
        insert(&t, 100, hx);
        for (i, &h) in fill0.iter().enumerate() {
            insert(&t, 200 + i as u64, h);
        }
        for (i, &h) in fill1.iter().enumerate() {
            insert(&t, 300 + i as u64, h);
        }
        let w = {
            let t = t.clone();
            loom::thread::spawn(move || {
                insert(&t, 999, hy);
            })
        };
        assert!(check_hit(&t, 100, hx), "key missed while being displaced");
        w.join().unwrap();
        assert!(check_hit(&t, 100, hx));
        assert!(check_hit(&t, 999, hy));
        assert_eq!(t.len(), 17);
    });
}

#[test]
fn refcount_removes_entry_only_after_last_release() {
    model(|| {
        // No timeout: the entry goes when the last pin is released.
        let t = Arc::new(table(2, 0));
        let h = hash_for(&t, 0, 1, 0);
        let (a, new) = t.acquire(&7, h, 0, |_, s| s[0].store(70, Relaxed)).unwrap();
        assert!(new);
        let w = {
            let t = t.clone();
            loom::thread::spawn(move || {
                let (b, _) = t.acquire(&7, h, 0, |_, s| s[0].store(70, Relaxed)).unwrap();
                assert_eq!(t.state(b).unwrap()[0].load(Relaxed), 70);
                t.release(b, 1);
            })
        };
        t.release(a, 1);
        w.join().unwrap();
        assert!(!t.lookup(&7, h).is_some(), "entry outlived its last reference");
        assert_eq!(t.len(), 0);
    });
}

#[test]
fn remove_racing_with_acquire_frees_exactly_once() {
    model(|| {
        let t = Arc::new(table(2, 1_000));
        let h = hash_for(&t, 0, 1, 0);
        insert(&t, 5, h);
        let w = {
            let t = t.clone();
            loom::thread::spawn(move || t.remove(&5, h))
        };
        let got = t.acquire(&5, h, 0, |_, s| s[0].store(50, Relaxed));
        let removed = w.join().unwrap();
        let (hd, _) = got.unwrap();
        assert_eq!(t.state(hd).unwrap()[0].load(Relaxed), 50);
        t.release(hd, 1);
        assert_ne!(removed, RemoveOutcome::NotFound);
        // Either the pinned entry was the old one (removed, freed on release) or a re-insert (still present).
        let present = t.lookup(&5, h).is_some();
        assert_eq!(t.len(), usize::from(present));
    });
}
