//! Issue 33: the flow tables' hash is keyed by a per-run secret (`ExecConfig::hash_seed`, `--hash-seed`).
//! With the constant every flowplane used before, anyone could compute flows that share both candidate
//! buckets and force `table_full` on a table that is nearly empty; with a secret drawn at random, the same
//! flows spread over the table.

use std::net::Ipv4Addr;

use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::{random_hash_seed, ExecConfig, Pipeline};
use flowplane_engine::spec::parse;
use flowplane_nf::testutil::udp4;
use flowplane_nf::NfContext;
use flowplane_packet::{Batch, PacketPool, PoolConfig};
use flowplane_table::{FlowTable, Layout, TableConfig};
use flowplane_wire::flow::FiveTupleV4;
use flowplane_wire::hash::HashableKey;

/// The seed every run used before (`HASH_SEED` in `exec/context.rs`): the "leaked" secret.
const OLD_SEED: u32 = 0x9e37_79b9;
/// Capacity of the table under attack: 32 buckets of 8 slots.
const FLOWS: usize = 200;
/// Flows the attacker builds beyond the room keys sharing every candidate position get (the 16 slots of one
/// bucket pair; the 128 positions of one inline home's window).
const EXTRA: usize = 24;

/// The room of keys sharing every candidate position, by the layouts' documented rules.
fn room(layout: Layout) -> usize {
    match layout {
        Layout::Bucketed => 16,
        Layout::Inline => 128,
    }
}

fn table(layout: Layout) -> FlowTable<FiveTupleV4> {
    FlowTable::new(TableConfig { layout, ..TableConfig::new(FLOWS, 8) }).unwrap()
}

/// The i-th candidate flow: (source, destination, source port, destination port), UDP.
fn parts(i: u32) -> ([u8; 4], [u8; 4], u16, u16) {
    ((0x0a00_0000 | (i & 0xff_ffff)).to_be_bytes(), [192, 168, 1, 1], 1024 + (i >> 24) as u16, 53)
}

fn key(i: u32) -> FiveTupleV4 {
    let (s, d, sp, dp) = parts(i);
    FiveTupleV4::new(Ipv4Addr::from(s), Ipv4Addr::from(d), sp, dp, 17)
}

/// `room + EXTRA` keys that share every candidate position of a `FLOWS`-entry table of `layout` under `seed`
/// (found offline, as an attacker who knows the seed would).
fn colliding(seed: u32, layout: Layout) -> Vec<u32> {
    let t = table(layout);
    let geometry = if layout == Layout::Bucketed { 32 } else { 2 * FLOWS };
    assert_eq!(t.bucket_count(), geometry, "the table geometry the test assumes");
    let target = t.candidate_buckets(key(0).hash64(seed));
    (0..).filter(|&i| t.candidate_buckets(key(i).hash64(seed)) == target).take(room(layout) + EXTRA).collect()
}

/// Inserts `keys` into a `FLOWS`-entry table of `layout` hashed with `seed`: how many found no room.
fn refused(flows: &[u32], seed: u32, layout: Layout) -> usize {
    let mut t = table(layout);
    flows.iter().map(|&i| key(i)).filter(|k| t.insert(k, k.hash64(seed), 0, |_| {}).is_err()).count()
}

#[test]
fn keys_built_against_the_old_constant_overflow_only_under_it() {
    for layout in [Layout::Bucketed, Layout::Inline] {
        let keys = colliding(OLD_SEED, layout);
        // With the secret known, the attack works: the shared positions hold their room, the rest is refused.
        assert_eq!(refused(&keys, OLD_SEED, layout), EXTRA, "{layout:?}");
        // With secrets the attacker does not know, every key finds room.
        for _ in 0..20 {
            let seed = random_hash_seed();
            if seed != OLD_SEED {
                assert_eq!(refused(&keys, seed, layout), 0, "seed {seed:#x}, {layout:?}");
            }
        }
    }
}

/// Why the bucket takes both halves of the hash: the low half is CRC32C, affine in its seed, so keys sharing
/// a bucket by the low half alone (the placement before issue 33) share it under every seed.
#[test]
fn the_crc_half_alone_collides_under_every_seed() {
    let mask = 31u32;
    let target = key(0).hash64(OLD_SEED) as u32 & mask;
    let keys: Vec<_> = (0..).map(key).filter(|k| k.hash64(OLD_SEED) as u32 & mask == target).take(40).collect();
    for _ in 0..5 {
        let seed = random_hash_seed();
        let low: std::collections::BTreeSet<u32> = keys.iter().map(|k| k.hash64(seed) as u32 & mask).collect();
        assert_eq!(low.len(), 1, "seed {seed:#x}: the CRC half kept the collision");
        // The table's placement spreads them.
        let t = table(Layout::Bucketed);
        let b1: std::collections::BTreeSet<usize> =
            keys.iter().map(|k| t.candidate_buckets(k.hash64(seed)).0).collect();
        assert!(b1.len() >= 10, "seed {seed:#x}: 40 keys in {} primary buckets", b1.len());
        // And the inline layout's homes.
        let t = table(Layout::Inline);
        let homes: std::collections::BTreeSet<usize> =
            keys.iter().map(|k| t.candidate_buckets(k.hash64(seed)).0).collect();
        assert!(homes.len() >= 20, "seed {seed:#x}: 40 keys in {} homes", homes.len());
    }
}

/// The engine's tables use the run's secret: the flood built against the old constant fills a 200-flow
/// table's shared positions under `hash_seed = OLD_SEED` (24 flows past their room refused, counted
/// `table_full`), and under a random seed every flow gets an entry; in both layouts (`fsc`'s block is stored
/// inline unless `inline_entries` is off).
#[test]
fn the_engine_hashes_with_the_runs_secret() {
    for inline in [false, true] {
        engine_hashes_with_the_runs_secret(inline);
    }
}

fn engine_hashes_with_the_runs_secret(inline: bool) {
    let layout = if inline { Layout::Inline } else { Layout::Bucketed };
    let frames: Vec<Vec<u8>> = colliding(OLD_SEED, layout)
        .into_iter()
        .map(|i| {
            let (s, d, sp, dp) = parts(i);
            udp4(s, d, sp, dp)
        })
        .collect();
    let full = |seed: u32| {
        let c = Chain::build(&parse("fsc").unwrap()).unwrap();
        let shared = SharedStores::new(&c.groups, 64, 3_600_000_000_000).unwrap();
        let cfg = ExecConfig {
            flows: FLOWS,
            hugepages: false,
            hash_seed: seed,
            inline_entries: inline,
            ..ExecConfig::default()
        };
        let mut p = Pipeline::new(c, cfg, shared).unwrap();
        let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..Default::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        for f in &frames {
            assert!(batch.push_copy(&mut pool, f, 0));
        }
        p.process(&mut batch, &NfContext { now_tsc: 0, now_ns: 1_000 });
        batch.free_all(&mut pool).unwrap();
        p.store_report().table_full
    };
    assert_eq!(full(OLD_SEED), EXTRA as u64, "{layout:?}");
    let seed = loop {
        let s = random_hash_seed();
        if s != OLD_SEED {
            break s;
        }
    };
    assert_eq!(full(seed), 0, "seed {seed:#x}");
}
