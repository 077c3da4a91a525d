//! Model-based property tests: random operation sequences on a `FlowTable` and on a `std::collections::HashMap`
//! model must agree at every step (single and batch APIs, update, removal, expiry with a moving clock), in both
//! table layouts.

use flowplane_table::{FlowTable, FullPolicy, Layout, TableConfig, INVALID_HANDLE};
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

const TIMEOUT: u64 = 100;

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Clone, Debug)]
enum Op {
    Insert(u16, u64),
    Lookup(u16),
    Update(u16, u64),
    Remove(u16),
    RemoveHandle(u16),
    LookupBatch(Vec<u16>),
    InsertBatch(Vec<u16>),
    /// Move the clock by a signed amount (backwards jumps included).
    Clock(i64),
    ExpireAll,
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0u16..300;
    prop_oneof![
        4 => (k.clone(), any::<u64>()).prop_map(|(k, v)| Op::Insert(k, v)),
        3 => k.clone().prop_map(Op::Lookup),
        2 => (k.clone(), any::<u64>()).prop_map(|(k, v)| Op::Update(k, v)),
        2 => k.clone().prop_map(Op::Remove),
        1 => k.clone().prop_map(Op::RemoveHandle),
        // Longer than one bulk chunk (BULK_LOOKUP_MAX = 64) too: every key must be processed.
        2 => prop::collection::vec(k.clone(), 0..150).prop_map(Op::LookupBatch),
        2 => prop::collection::vec(k, 0..150).prop_map(Op::InsertBatch),
        1 => (-300i64..300).prop_map(Op::Clock),
        1 => Just(Op::ExpireAll),
    ]
}

/// Idle past the timeout at `now` (a backwards clock never makes an entry idle).
fn idle(seen: u64, now: u64) -> bool {
    now > seen && now - seen > TIMEOUT
}

/// Model entry: state value (first u64 of the state) and last-seen time.
struct Model {
    map: HashMap<u16, (u64, u64)>,
}

/// `weak` hashes collide heavily (few distinct buckets and tags) to exercise tag false positives and
/// displacement; with them the table may legitimately be full, which the model then mirrors.
fn run(ops: Vec<Op>, weak: bool, layout: Layout) {
    let hash = |k: u16| if weak { mix(u64::from(k % 7)) ^ (u64::from(k % 3) << 60) } else { mix(u64::from(k)) };
    let cfg = TableConfig {
        capacity: 320,
        state_size: 24,
        idle_timeout_ns: Some(TIMEOUT),
        full_policy: FullPolicy::Reject,
        hugepages: false,
        layout,
    };
    let mut t = FlowTable::<u16>::new(cfg).unwrap();
    let mut m = Model { map: HashMap::new() };
    let mut now: u64 = 1_000;
    for op in ops {
        match op {
            Op::Insert(k, v) => match t.insert(&k, hash(k), now, |s| s[..8].copy_from_slice(&v.to_le_bytes())) {
                Ok((h, new)) => {
                    // An entry idle past the timeout is renewed on lookup, as a new flow.
                    let renewed = m.map.get(&k).is_some_and(|e| idle(e.1, now));
                    assert_eq!(new, !m.map.contains_key(&k) || renewed);
                    assert_eq!(t.key(h), Some(&k));
                    if renewed {
                        m.map.remove(&k);
                    }
                    let e = m.map.entry(k).or_insert((v, now));
                    e.1 = now;
                }
                Err(_) => {
                    assert!(weak, "a well-hashed table with capacity > key space must never be full");
                    assert!(!m.map.contains_key(&k));
                }
            },
            Op::Lookup(k) => {
                let r = t.lookup(&k, hash(k));
                assert_eq!(r.is_some(), m.map.contains_key(&k));
                if let Some(h) = r {
                    assert_eq!(t.state_as::<u64>(h, 0).copied(), Some(m.map[&k].0));
                    assert_eq!(t.last_seen(h), Some(m.map[&k].1));
                }
            }
            Op::Update(k, v) => {
                if let Some(h) = t.lookup(&k, hash(k)) {
                    *t.state_as_mut::<u64>(h, 0).unwrap() = v;
                    m.map.get_mut(&k).unwrap().0 = v;
                }
            }
            Op::Remove(k) => assert_eq!(t.remove(&k, hash(k)), m.map.remove(&k).is_some()),
            Op::RemoveHandle(k) => match t.lookup(&k, hash(k)) {
                Some(h) => {
                    assert!(t.remove_handle(h));
                    assert!(!t.remove_handle(h), "double free must be refused");
                    m.map.remove(&k);
                }
                None => assert!(!m.map.contains_key(&k)),
            },
            Op::LookupBatch(keys) => {
                let hashes: Vec<u64> = keys.iter().map(|&k| hash(k)).collect();
                let mut out = vec![0u32; keys.len()];
                let hits = t.lookup_batch(&keys, &hashes, &mut out);
                assert_eq!(hits, keys.iter().filter(|k| m.map.contains_key(k)).count());
                for (i, k) in keys.iter().enumerate() {
                    let single = t.lookup(k, hashes[i]);
                    assert_eq!(out[i] != INVALID_HANDLE, m.map.contains_key(k));
                    assert_eq!(single.unwrap_or(INVALID_HANDLE), out[i], "batch and single lookups agree");
                }
            }
            Op::InsertBatch(keys) => {
                let hashes: Vec<u64> = keys.iter().map(|&k| hash(k)).collect();
                let mut out = vec![0u32; keys.len()];
                let mut inits = Vec::new();
                let r = t.lookup_or_insert_batch(&keys, &hashes, now, &mut out, |i, s| {
                    inits.push(i);
                    s[..8].copy_from_slice(&(i as u64).to_le_bytes());
                });
                let mut seen_in_batch = HashSet::new();
                let (mut hit, mut failed) = (0, 0);
                for (i, k) in keys.iter().enumerate() {
                    let renewed = !seen_in_batch.contains(k) && m.map.get(k).is_some_and(|e| idle(e.1, now));
                    let present = (m.map.contains_key(k) || seen_in_batch.contains(k)) && !renewed;
                    let inserted = inits.contains(&i);
                    if renewed {
                        assert!(inserted && out[i] != INVALID_HANDLE, "idle key {k} at {i} should be renewed");
                        assert_eq!(t.key(out[i]), Some(k));
                        m.map.insert(*k, (i as u64, now));
                        seen_in_batch.insert(*k);
                    } else if present {
                        assert!(!inserted && out[i] != INVALID_HANDLE, "key {k} at {i} should hit");
                        assert_eq!(t.key(out[i]), Some(k));
                        if let Some(e) = m.map.get_mut(k) {
                            e.1 = now;
                        }
                        hit += 1;
                    } else if inserted {
                        assert_eq!(t.key(out[i]), Some(k));
                        m.map.insert(*k, (i as u64, now));
                        seen_in_batch.insert(*k);
                    } else {
                        assert!(weak, "key {k} neither hit nor inserted");
                        assert_eq!(out[i], INVALID_HANDLE);
                        failed += 1;
                    }
                }
                assert_eq!((r.hit, r.inserted, r.failed), (hit, inits.len(), failed));
                assert_eq!(r.hit + r.inserted + r.failed, keys.len());
            }
            Op::Clock(d) => now = now.saturating_add_signed(d),
            Op::ExpireAll => {
                let mut expired = HashSet::new();
                let n = t.expire(now, usize::MAX, |_, k, _| {
                    expired.insert(*k);
                });
                let mut want = HashSet::new();
                for (k, e) in m.map.iter_mut() {
                    if e.1 > now {
                        e.1 = now; // backwards clock: idle time restarts, see expiry.rs
                    } else if now - e.1 > TIMEOUT {
                        want.insert(*k);
                    }
                }
                m.map.retain(|k, _| !want.contains(k));
                assert_eq!(expired, want);
                assert_eq!(n, want.len());
            }
        }
        assert_eq!(t.len(), m.map.len());
    }
    let mut keys: Vec<u16> = t
        .iter()
        .map(|(h, k, s)| {
            assert_eq!(u64::from_le_bytes(s[..8].try_into().unwrap()), m.map[k].0);
            assert_eq!(t.key(h), Some(k));
            *k
        })
        .collect();
    keys.sort_unstable();
    let mut want: Vec<u16> = m.map.keys().copied().collect();
    want.sort_unstable();
    assert_eq!(keys, want);
    let s = t.stats();
    assert!(s.hits <= s.lookups);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn table_matches_hashmap(ops in prop::collection::vec(op(), 1..300)) {
        run(ops, false, Layout::Bucketed);
    }

    #[test]
    fn table_matches_hashmap_with_colliding_hashes(ops in prop::collection::vec(op(), 1..300)) {
        run(ops, true, Layout::Bucketed);
    }

    #[test]
    fn inline_table_matches_hashmap(ops in prop::collection::vec(op(), 1..300)) {
        run(ops, false, Layout::Inline);
    }

    /// Colliding hashes put many keys behind few homes: long walks, holes from removals inside them.
    #[test]
    fn inline_table_matches_hashmap_with_colliding_hashes(ops in prop::collection::vec(op(), 1..300)) {
        run(ops, true, Layout::Inline);
    }
}
