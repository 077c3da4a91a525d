//! Model-based property test of `FixedMap`: random insert / remove / get / sweep sequences (full tables and
//! churn included) against a model written from the documented rules alone — a `std::collections::HashMap`
//! for the contents, and a plain vector of slots for the documented slot policy (lowest unused slot first,
//! freed slots last-in-first-out, the sweep walking slots in order from its cursor and wrapping at the
//! highest slot ever used). No hashing in the model.

use flowplane_table::{FibHash, FixedMap, KeyHash, TableError};
use proptest::prelude::*;
use std::collections::HashMap;

/// Few distinct hashes: long probe chains, clusters that wrap around the index, many backward shifts.
struct Weak;
impl KeyHash<u16> for Weak {
    fn hash(k: &u16) -> u32 {
        u32::from(*k % 5).wrapping_mul(0x9e37_79b9) | 0xf
    }
}

struct Strong;
impl KeyHash<u16> for Strong {
    fn hash(k: &u16) -> u32 {
        <FibHash as KeyHash<u64>>::hash(&u64::from(*k))
    }
}

#[derive(Clone, Debug)]
enum Op {
    Insert(u16, u32),
    Get(u16),
    GetMut(u16, u32),
    Remove(u16),
    RemoveAt(usize),
    /// Sweep `n` slots, removing entries whose value is `r` modulo `m`, adding 1 to the others.
    Sweep(usize, u32, u32),
}

fn op(keys: u16) -> impl Strategy<Value = Op> {
    let k = 0..keys;
    prop_oneof![
        5 => (k.clone(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
        2 => k.clone().prop_map(Op::Get),
        1 => (k.clone(), any::<u32>()).prop_map(|(k, v)| Op::GetMut(k, v)),
        3 => k.prop_map(Op::Remove),
        1 => (0usize..80).prop_map(Op::RemoveAt),
        1 => (0usize..100, 1u32..4, 0u32..4).prop_map(|(n, m, r)| Op::Sweep(n, m, r)),
    ]
}

/// The documented slot policy, on a vector.
#[derive(Default)]
struct Model {
    map: HashMap<u16, (usize, u32)>,
    slots: Vec<Option<u16>>,
    free: Vec<usize>,
    cursor: usize,
}

impl Model {
    fn remove_slot(&mut self, s: usize) -> Option<(u16, u32)> {
        let k = self.slots.get_mut(s)?.take()?;
        let (_, v) = self.map.remove(&k).unwrap();
        self.free.push(s);
        Some((k, v))
    }
}

fn run<H: KeyHash<u16>>(cap: usize, ops: Vec<Op>) {
    let mut m = FixedMap::<u16, u32, H>::new(cap).unwrap();
    let mut md = Model::default();
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Insert(k, v) => {
                let got = m.insert(k, v);
                let want = if let Some(e) = md.map.get_mut(&k) {
                    e.1 = v;
                    Ok(e.0)
                } else if md.map.len() == cap {
                    Err(TableError::Full)
                } else {
                    let s = md.free.pop().unwrap_or(md.slots.len());
                    if s == md.slots.len() {
                        md.slots.push(None);
                    }
                    md.slots[s] = Some(k);
                    md.map.insert(k, (s, v));
                    Ok(s)
                };
                assert_eq!(got, want, "step {step}: insert {k}");
            }
            Op::Get(k) => {
                assert_eq!(m.get(&k).copied(), md.map.get(&k).map(|e| e.1), "step {step}: get {k}");
                assert_eq!(m.find(&k), md.map.get(&k).map(|e| e.0), "step {step}: find {k}");
            }
            Op::GetMut(k, v) => {
                if let Some(x) = m.get_mut(&k) {
                    *x = v;
                }
                if let Some(e) = md.map.get_mut(&k) {
                    e.1 = v;
                }
            }
            Op::Remove(k) => {
                let want = md.map.get(&k).map(|e| e.0).and_then(|s| md.remove_slot(s)).map(|e| e.1);
                assert_eq!(m.remove(&k), want, "step {step}: remove {k}");
            }
            Op::RemoveAt(s) => {
                assert_eq!(m.remove_at(s), md.remove_slot(s), "step {step}: remove_at {s}");
            }
            Op::Sweep(n, md_, r) => {
                let want_removed = {
                    let hw = md.slots.len();
                    let mut removed = 0;
                    for _ in 0..n.min(hw) {
                        if md.cursor >= hw {
                            md.cursor = 0;
                        }
                        let s = md.cursor;
                        md.cursor += 1;
                        let Some(k) = md.slots[s] else { continue };
                        let v = md.map[&k].1;
                        if v % md_ == r {
                            md.remove_slot(s);
                            removed += 1;
                        } else {
                            md.map.get_mut(&k).unwrap().1 = v.wrapping_add(1);
                        }
                    }
                    removed
                };
                let got = m.sweep(n, |_, v| {
                    let keep = *v % md_ != r;
                    *v = v.wrapping_add(1);
                    keep
                });
                assert_eq!(got, want_removed, "step {step}: sweep {n}");
            }
        }
        assert_eq!(m.len(), md.map.len(), "step {step}: len");
        assert_eq!(m.is_full(), md.map.len() == cap);
    }
    // Contents and iteration: every live entry once, in slot order.
    let got: Vec<(usize, u16, u32)> = m.iter().map(|(s, k, v)| (s, *k, *v)).collect();
    let mut want: Vec<(usize, u16, u32)> = md.map.iter().map(|(k, &(s, v))| (s, *k, v)).collect();
    want.sort_unstable();
    assert_eq!(got, want);
    for (&k, &(s, v)) in &md.map {
        assert_eq!(m.get_at(s), Some((&k, &v)));
        assert_eq!(m.get(&k), Some(&v));
    }
    // Drain through a full sweep: it looks at every used slot once and removes exactly what it is asked to.
    let n = m.len();
    assert_eq!(m.sweep(usize::MAX, |_, _| false), n);
    assert!(m.is_empty() && m.iter().next().is_none());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// A small table (full often) over many keys: Full, LIFO reuse, churn.
    #[test]
    fn small_and_full(ops in prop::collection::vec(op(40), 1..400)) {
        run::<Strong>(12, ops.clone());
        run::<Weak>(12, ops);
    }

    /// A larger table, rarely full: long runs of inserts and removals with colliding hashes.
    #[test]
    fn churn(ops in prop::collection::vec(op(300), 1..600)) {
        run::<Strong>(70, ops.clone());
        run::<Weak>(70, ops);
    }
}
