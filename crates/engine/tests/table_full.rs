//! A flood that fills the 5-tuple table must not bypass the NFs keyed by
//! source or destination: they see every packet (never fail open), under
//! every executor, with and without the auxiliary table. Packets that find
//! a table full are counted once, as `table_full`, and judged by each NF's
//! stated rule.

use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::{ExecConfig, ExecKind, Pipeline, StateLayout};
use flowplane_engine::spec::parse;
use flowplane_nf::testutil::{tcp4, udp4};
use flowplane_nf::{NfContext, PktMeta};
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

/// 40 UDP flows between 20 inside sources and 20 servers (flow f from 10.0.0.(f % 20) to 198.51.100.(f % 20)),
/// three rounds: the packets in order.
fn forty_flows() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for _round in 0..3 {
        for f in 0..40u16 {
            v.push(udp4([10, 0, 0, (f % 20) as u8], [198, 51, 100, (f % 20) as u8], 2000 + f, 53));
        }
    }
    v
}

/// The oracle, from the frames alone: packets whose key (by `key`) is not among the first `cap` distinct keys
/// in arrival order — what a table of `cap` entries that never frees one must refuse, once per packet.
fn refused(frames: &[Vec<u8>], cap: usize, key: impl Fn(&PktMeta) -> String) -> u64 {
    let mut first = Vec::new();
    let mut n = 0;
    for f in frames {
        let k = key(&PktMeta::parse(f));
        if !first.contains(&k) {
            first.push(k.clone());
        }
        n += u64::from(first.iter().position(|x| *x == k).unwrap() >= cap);
    }
    n
}

/// Issue 29: table-full packets were labelled `unparsed` by keyctr, policer, psd, portknock, fw, nat (and the
/// shared table counted fewer refusals than its NFs). Under every executor, with and without the auxiliary
/// table: each NF counts exactly the packets the oracle says its table refused as `table_full` (none as
/// unparsed), the table's own figure is the same number (a packet refused once counts once), the store holds
/// exactly `--flows` IPv4 entries, and the verdict is the NF's rule: access control drops (fails closed),
/// counters and evidence-based droppers pass (fail open). Every packet here passes any NF that has state.
#[test]
fn table_full_packets_are_counted_once_as_table_full_and_judged_by_each_nfs_rule() {
    let frames = forty_flows();
    let (flows, sources) = (32, 8);
    let by_flow = refused(&frames, flows, |m| format!("{:?}", m.tuple));
    let by_source = refused(&frames, sources, |m| m.tuple.src_ip().to_string());
    let by_server = refused(&frames, sources, |m| m.tuple.dst_ip().to_string());
    assert_eq!((by_flow, by_source, by_server), (24, 72, 72), "the oracle");
    // (chain, coarse, fails closed)
    let nfs = [
        ("fsc", false, false),
        ("hh", false, false),
        ("lb", false, false),
        ("ratelimit(pps=1000000)", false, false),
        ("burn(iters=1)", true, false),
        ("acl", false, true),
        ("fw(allow_new=any)", false, true),
        ("nat", false, true),
        ("conntrack", false, true),
        ("keyctr(key=src_ip)", true, false),
        ("srcctr", true, false),
        ("ddos(threshold=1000000)", true, false),
        ("psd(ports=1000)", true, false),
        ("policer(rate=1000000000)", true, false),
        ("portknock", true, true),
    ];
    for (chain, coarse, closed) in nfs {
        for kind in kinds() {
            for aux in [true, false] {
                let what = format!("{chain} {kind} aux={aux}");
                let c = Chain::build(&parse(chain).unwrap()).unwrap();
                let shared = SharedStores::new(&c.groups, sources, 3_600_000_000_000).unwrap();
                let cfg = ExecConfig { kind, flows, hugepages: false, aux, ..ExecConfig::default() };
                let mut p = Pipeline::new(c, cfg, shared).unwrap();
                let mut pool = PacketPool::new(PoolConfig { buffers: 512, ..Default::default() }).unwrap();
                let mut batch = Batch::new(&pool);
                for chunk in frames.chunks(32) {
                    for f in chunk {
                        assert!(batch.push_copy(&mut pool, f, 0));
                    }
                    p.process(&mut batch, &NfContext { now_tsc: 0, now_ns: 1_000 });
                    batch.free_all(&mut pool).unwrap();
                }
                let t = p.store_report();
                let (name, counters, report) = p.nf_results().remove(0);
                let r = report.unwrap_or_else(|| panic!("{what}: {name} reports"));
                let get = |k: &str| r.get(k).or_else(|| r.get("drops").and_then(|d| d.get(k))).and_then(|v| v.as_u64());
                let full = get("table_full").or_else(|| get("dropped_table_full")).unwrap();
                let want = match (coarse, chain.starts_with("policer")) {
                    (false, _) => by_flow,
                    (true, false) => by_source,
                    (true, true) => by_server,
                };
                assert_eq!(full, want, "{what}: {r}");
                if coarse {
                    assert_eq!(t.shared_table_full, want, "{what}: the shared table's count: {t:?}");
                } else {
                    assert_eq!((t.capacity, t.entries, t.table_full), (flows as u64, flows as u64, want), "{what}");
                }
                for k in ["unparsed", "dropped_unparsed", "unkeyed", "missed"] {
                    assert!(get(k).unwrap_or(0) == 0, "{what}: counted as {k}: {r}");
                }
                assert_eq!(counters.packets_in, frames.len() as u64, "{what}");
                assert_eq!(counters.dropped, if closed { want } else { 0 }, "{what}: {r}");
            }
        }
    }
}
