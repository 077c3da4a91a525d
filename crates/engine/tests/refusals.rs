//! Issue 33: a packet an NF refuses on its flow's first packet (`Action::Refuse`: nat's pool exhausted,
//! filtered, unmapped) inserts nothing. The run (`gen --flows 1000000 --packets 6000000 --seed 2`
//! through the default `nat`) reported 5.68M insertions and 5.61M ended flows: every refused packet inserted a
//! flow entry and ended it. Here, scaled down: 600 UDP flows on a 256-port pool, each flow's packets twice
//! in a batch (so a refused flow's second packet meets the entry its first one left in the batch's lookup).

use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::{ExecConfig, ExecKind, Pipeline};
use flowplane_engine::spec::parse;
use flowplane_nf::testutil::udp4;
use flowplane_nf::NfContext;
use flowplane_packet::{Batch, PacketPool, PoolConfig};

const FLOWS: u32 = 600;
const PORTS: u64 = 256;

/// Blocks of 16 flows, each block's flows twice in a row (32 packets: one batch below), the whole trace twice.
fn frames() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for _round in 0..2 {
        for block in 0..FLOWS.div_ceil(16) {
            for _ in 0..2 {
                for f in block * 16..(block * 16 + 16).min(FLOWS) {
                    v.push(udp4([10, 0, (f >> 8) as u8, f as u8], [198, 51, 100, 1], 5000, 53));
                }
            }
        }
    }
    v
}

#[test]
fn refused_flows_insert_nothing_under_every_executor() {
    let frames = frames();
    let refused_packets = frames.len() as u64 - 4 * PORTS;
    let mut first_verdicts = None;
    for chain in ["nat(ports=1024-1279)", "fsc -> nat(ports=1024-1279)"] {
        let mut kinds: Vec<ExecKind> = ExecKind::all().collect();
        kinds.push(ExecKind::parse("interleaved:4").unwrap());
        for kind in kinds {
            let what = format!("{chain} under {kind}");
            let c = Chain::build(&parse(chain).unwrap()).unwrap();
            let shared = SharedStores::new(&c.groups, 4096, 3_600_000_000_000).unwrap();
            let cfg = ExecConfig { kind, flows: 4096, hugepages: false, ..ExecConfig::default() };
            let mut p = Pipeline::new(c, cfg, shared).unwrap();
            let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..Default::default() }).unwrap();
            let mut batch = Batch::new(&pool);
            let mut verdicts = Vec::new();
            for (k, chunk) in frames.chunks(32).enumerate() {
                for f in chunk {
                    assert!(batch.push_copy(&mut pool, f, 0));
                }
                p.process(&mut batch, &NfContext { now_tsc: 0, now_ns: k as u64 * 1000 });
                verdicts.extend_from_slice(batch.verdicts());
                batch.free_all(&mut pool).unwrap();
            }
            let (_, nat, details) = p.nf_results().into_iter().find(|(n, _, _)| n == "nat").unwrap();
            let d = details.unwrap();
            assert_eq!(
                (d["mappings_created"].as_u64(), d["dropped_pool_exhausted"].as_u64()),
                (Some(PORTS), Some(refused_packets)),
                "{what}"
            );
            assert_eq!(nat.dropped, refused_packets, "{what}");
            // One table per stateful NF under pernf: a refused flow leaves each.
            let tables = if kind.name() == "pernf" { chain.matches("->").count() as u64 + 1 } else { 1 };
            let t = p.store_report();
            assert_eq!(
                (t.insertions, t.refused, t.ended),
                (PORTS * tables, refused_packets * tables, 0),
                "{what}: {t:?}"
            );
            assert_eq!(t.entries, PORTS * tables, "{what}");
            assert!(t.conserved(), "{what}: {t:?}");
            match &first_verdicts {
                None => first_verdicts = Some(verdicts),
                Some(v) => assert!(v == &verdicts, "{what}: verdicts differ"),
            }
        }
    }
}
