//! A flood that fills the 5-tuple table must not bypass the NFs keyed by
//! source or destination: they see every packet (never fail open), under
//! every executor, with and without the auxiliary table.

use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::{ExecConfig, ExecKind, Pipeline, StateLayout};
use flowplane_engine::spec::parse;
use flowplane_nf::testutil::tcp4;
use flowplane_nf::NfContext;
use flowplane_packet::{Batch, PacketPool, PoolConfig};

/// Every registered executor, and the interleaved one at several task counts.
fn kinds() -> Vec<ExecKind> {
    let mut v: Vec<ExecKind> = ExecKind::all().collect();
    v.extend(["interleaved:1", "interleaved:4", "interleaved:64"].map(|s| ExecKind::parse(s).unwrap()));
    v
}

#[test]
fn spoofed_flood_still_meets_every_coarse_nf() {
    // 3000 SYNs from spoofed sources (each its own 5-tuple) to one victim, and
    // 300 from one attacker: far more flows than the 64-entry table holds.
    let mut frames = Vec::new();
    for k in 0..3300u32 {
        let src = if k % 11 == 0 { [192, 0, 2, 66] } else { [10, (k >> 16) as u8, (k >> 8) as u8, k as u8] };
        frames.push(tcp4(src, [198, 51, 100, 1], 1024 + (k % 50_000) as u16, 80, 0x02, k, 0));
    }
    // (acl last: the interleaved executor's task window, not its batched fallback)
    let chain = "ddos(threshold=100) -> srcctr -> psd(ports=1000) -> fsc -> acl";
    let mut reference = None;
    for kind in kinds() {
        for aux in [true, false] {
            let c = Chain::build(&parse(chain).unwrap()).unwrap();
            let shared = SharedStores::new(&c.groups, 8192, 3_600_000_000_000).unwrap();
            let cfg = ExecConfig { kind, flows: 64, hugepages: false, aux, ..ExecConfig::default() };
            let mut p = Pipeline::new(c, cfg, shared).unwrap();
            let mut pool = PacketPool::new(PoolConfig { buffers: 512, ..Default::default() }).unwrap();
            let mut batch = Batch::new(&pool);
            for chunk in frames.chunks(64) {
                for f in chunk {
                    assert!(batch.push_copy(&mut pool, f, 0));
                }
                p.process(&mut batch, &NfContext { now_tsc: 0, now_ns: 1_000 });
                batch.free_all(&mut pool).unwrap();
            }
            let r = p.store_report();
            assert!(r.table_full > 0, "{kind} aux={aux}: the 5-tuple table filled");
            if aux && kind.info().layout == StateLayout::Aggregated {
                assert!(r.aux_fallbacks > 0, "{kind}: packets without an entry took the direct path");
            }
            let res = p.nf_results();
            let ddos = res[0].1;
            assert_eq!(ddos.packets_in, 3300, "{kind} aux={aux}: ddos saw every packet");
            // The attacker's 300 SYNs: the first 100 pass, the rest are dropped.
            assert_eq!(ddos.dropped, 200, "{kind} aux={aux}");
            assert_eq!(res[1].1.packets_in, 3100, "{kind} aux={aux}: srcctr saw every packet ddos passed");
            assert_eq!(res[2].1.packets_in, 3100, "{kind} aux={aux}: psd too");
            let rows = p.export("srcctr", true).unwrap();
            let counted: u64 = rows.iter().map(|r| r["packets"].as_u64().unwrap()).sum();
            assert_eq!(counted, 3100, "{kind} aux={aux}: the per-source counts hold every packet");
            let counters: Vec<_> = res.iter().map(|(n, c, _)| (n.clone(), *c)).collect();
            match &reference {
                None => reference = Some(counters),
                Some(x) => assert_eq!(&counters, x, "{kind} aux={aux}"),
            }
        }
    }
}
