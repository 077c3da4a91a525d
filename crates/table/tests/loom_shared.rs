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
    // Single-threaded set-up (prefilling buckets) counts against the branch limit too.
    b.max_branches = 100_000;
    // Bounded preemptions keep each model to seconds; LOOM_MAX_PREEMPTIONS overrides.
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    let iterations = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let it = iterations.clone();
    b.check(move || {
        it.fetch_add(1, Relaxed);
        f()
    });
    let n = iterations.load(Relaxed);
    eprintln!("loom explored {n} interleavings");
    assert!(n > 1, "the model explored no concurrency");
}

/// Runs `writer` and `reader` as two spawned threads (loom's exploration is reliable when the
/// racing code runs in spawned threads rather than in the model's main thread).
fn race<W, R>(t: &Arc<Table>, writer: W, reader: R)
where
    W: FnOnce(&Table) + Send + 'static,
    R: FnOnce(&Table) + Send + 'static,
{
    let tw = t.clone();
    let tr = t.clone();
    let w = loom::thread::spawn(move || writer(&tw));
    let r = loom::thread::spawn(move || reader(&tr));
    w.join().unwrap();
    r.join().unwrap();
}

#[test]
fn reader_sees_present_key_during_insert_into_same_bucket() {
    model(|| {
        let t = Arc::new(table(4, 0));
        let ha = hash_for(&t, 0, 1, 0);
        let hb = hash_for(&t, 0, 1, 1);
        insert(&t, 1, ha);
        race(
            &t,
            move |t| {
                insert(t, 2, hb);
            },
            move |t| {
                assert!(check_hit(t, 1, ha), "present key missed during an insert");
                check_hit(t, 2, hb);
            },
        );
        assert!(check_hit(&t, 2, hb));
    });
}

#[test]
fn reader_never_misses_key_during_remove_of_neighbour() {
    model(|| {
        let t = Arc::new(table(4, 0));
        let ha = hash_for(&t, 1, 0, 0);
        let hb = hash_for(&t, 1, 0, 1);
        insert(&t, 1, ha);
        insert(&t, 2, hb);
        race(
            &t,
            move |t| assert_eq!(t.remove(&2, hb), RemoveOutcome::Removed),
            move |t| {
                assert!(check_hit(t, 1, ha));
                check_hit(t, 2, hb);
            },
        );
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
        race(
            &t,
            move |t| {
                assert_eq!(t.remove(&1, ha), RemoveOutcome::Removed);
                insert(t, 3, hc);
            },
            move |t| {
                // The old key may hit (before the remove) or miss, but its handle must
                // never yield the new key's state.
                let hd = t.lookup(&1, ha);
                if let Some(v) = t.read_state(hd, |s| s[0].load(Relaxed)) {
                    assert_eq!(v, 10, "reused entry reported for the old key");
                }
            },
        );
        assert!(!check_hit(&t, 1, ha));
        assert!(check_hit(&t, 3, hc));
    });
}

#[test]
fn reader_never_misses_key_moved_by_cuckoo_displacement() {
    model(|| {
        // 4 buckets. Hash arithmetic touches no atomics, so it is free inside the model.
        let t = Arc::new(table(28, 0));
        assert_eq!(t.bucket_count(), 4);
        // X: primary 3, alternate 0. Bucket 3 is full when X arrives, so X sits in bucket 0;
        // then a slot of bucket 3 frees up. Inserting Y (buckets 0 and 1, both full) moves X
        // from bucket 0 back to bucket 3: into the bucket a reader scans *first*, the move
        // that a reader validating each bucket on its own would miss.
        let hx = hash_for(&t, 3, 0, 0);
        let hy = hash_for(&t, 0, 1, 7);
        for i in 0..8 {
            insert(&t, 400 + i as u64, hash_for(&t, 3, 0, 1 + i));
        }
        insert(&t, 100, hx);
        assert_eq!(t.remove(&400, hash_for(&t, 3, 0, 1)), RemoveOutcome::Removed);
        for i in 0..7 {
            insert(&t, 200 + i as u64, hash_for(&t, 0, 1, i));
        }
        for i in 0..8 {
            insert(&t, 300 + i as u64, hash_for(&t, 1, 0, i));
        }
        race(
            &t,
            move |t| {
                insert(t, 999, hy);
            },
            move |t| assert!(t.lookup(&100, hx).is_some(), "key missed while being displaced"),
        );
        assert!(check_hit(&t, 100, hx));
        assert!(check_hit(&t, 999, hy));
        assert_eq!(t.len(), 24);
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
        race(
            &t,
            move |t| {
                let (b, _) = t.acquire(&7, h, 0, |_, s| s[0].store(70, Relaxed)).unwrap();
                assert_eq!(t.state(b).unwrap()[0].load(Relaxed), 70);
                t.release(b, 1);
            },
            move |t| {
                t.release(a, 1);
            },
        );
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
        let removed = Arc::new(loom::sync::atomic::AtomicBool::new(false));
        let r2 = removed.clone();
        race(
            &t,
            move |t| r2.store(t.remove(&5, h) != RemoveOutcome::NotFound, Relaxed),
            move |t| {
                let (hd, _) = t.acquire(&5, h, 0, |_, s| s[0].store(50, Relaxed)).unwrap();
                assert_eq!(t.state(hd).unwrap()[0].load(Relaxed), 50);
                t.release(hd, 1);
            },
        );
        assert!(removed.load(Relaxed));
        // Either the pinned entry was the old one (removed, freed on its release) or a
        // re-insert after the removal (still present): never a leak, never a double free.
        let present = t.lookup(&5, h).is_some();
        assert_eq!(t.len(), usize::from(present));
    });
}
