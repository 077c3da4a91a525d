//! Cache lines a batched lookup touches, per table layout (issue 37): fills a table of SIZE flows, then runs
//! LOOKUPS batched lookup-hits (batches of 32 random resident keys, each hit's first state byte read, as a flow
//! counter does) — nothing else. Run it under cachegrind at two LOOKUPS counts and divide the difference in
//! D1 / LL misses by the difference in lookups: what one lookup costs in lines, without the fill.
//!
//! `cargo build --release -p flowplane-bench --example table_lines`, then
//! `valgrind --tool=cachegrind --cache-sim=yes target/release/examples/table_lines LAYOUT SIZE STATE LOOKUPS`
//! with LAYOUT `bucketed` or `inline`. Prints the layout, the table's geometry and a checksum.

use flowplane_bench::table::{bench_hash, BenchKey};
use flowplane_table::{FlowTable, FullPolicy, Handle, Layout, TableConfig, INVALID_HANDLE};
use std::hint::black_box;

const BATCH: usize = 32;

/// Flow `i`'s key (distinct for distinct `i`), computed rather than stored: the only random memory the lookups
/// touch is the table's.
fn key(i: u64) -> BenchKey {
    let addrs = (i ^ 0x5555_5555_5555_5555).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    BenchKey { addrs, rest: (addrs.rotate_left(17) & 0xFF_FFFF_FF00) | 6 }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let layout = match args.get(1).map(String::as_str) {
        Some("inline") => Layout::Inline,
        _ => Layout::Bucketed,
    };
    let (size, state, lookups) = (arg(2, 1 << 20), arg(3, 32), arg(4, 1 << 20));
    let cfg = TableConfig {
        capacity: size + size / 4,
        state_size: state,
        idle_timeout_ns: None,
        full_policy: FullPolicy::Reject,
        hugepages: true,
        layout,
    };
    let mut t = FlowTable::new(cfg).expect("table");
    let mut out = [INVALID_HANDLE as Handle; BATCH];
    let mut kb = [key(0); BATCH];
    let mut hb = [0u64; BATCH];
    for start in (0..size as u64).step_by(BATCH) {
        let n = (size as u64 - start).min(BATCH as u64) as usize;
        for j in 0..n {
            kb[j] = key(start + j as u64);
            hb[j] = bench_hash(&kb[j]);
        }
        black_box(t.lookup_or_insert_batch(&kb[..n], &hb[..n], 0, &mut out[..n], |_, s| s[0] = 1));
    }
    assert_eq!(t.len(), size);
    // Random resident keys.
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut sum = 0u64;
    for _ in 0..lookups / BATCH {
        for j in 0..BATCH {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            kb[j] = key(rng % size as u64);
            hb[j] = bench_hash(&kb[j]);
        }
        t.lookup_batch(&kb, &hb, &mut out);
        for &x in &out {
            sum += u64::from(t.state(x).first().copied().unwrap_or(0));
        }
    }
    println!(
        "layout {} size {size} state {state} entry {} B lookups {lookups} checksum {sum}",
        layout.name(),
        Layout::entry_size::<BenchKey>(state).unwrap_or(0)
    );
}
