//! Every NF of the library, in one of four chains (5-tuple, firewalling/NAT, coarse state shared in
//! tables, synthetic), under one of the four executors, on arbitrary frames, batch after batch with
//! the clock jumping so that state expires: no panic, the batch keeps its packets, and per-NF
//! counters add up.
//!
//! Input layout: byte 0 picks the executor (bits 0-1), the chain (bits 4-5), the auxiliary table off
//! (bit 6) and prefetch off (bit 7); then records of [len: u8][gap: u8][len bytes of frame]
//! (a truncated last record takes what is left); a batch closes every 32 frames or when the gap
//! byte's top bit is set, and the gap advances the clock by `gap & 0x7f` seconds.
#![no_main]

use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::{ExecConfig, ExecKind, Executor};
use flowplane_engine::spec;
use flowplane_nf::NfContext;
use flowplane_packet::{Batch, PacketPool, PoolConfig};
use libfuzzer_sys::fuzz_target;

const CHAINS: [&str; 4] = [
    "lb -> fsc -> ratelimit -> hh -> count",
    "acl(rule=drop:udp:any:any:any:53) -> nat -> fw(allow_new=any) -> forward",
    "srcctr -> policer -> psd -> ddos -> portknock -> lb",
    "synthetic(k=3, mem=65536) -> fsc",
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, mut rest)) = data.split_first() else { return };
    let kind = ExecKind::parse(ExecKind::ALL[usize::from(pick) % ExecKind::ALL.len()]).expect("listed kind");
    let text = CHAINS[usize::from(pick >> 4) & 3];
    let chain = Chain::build(&spec::parse(text).expect("chain parses")).expect("chain builds");
    let cfg = ExecConfig {
        kind,
        prefetch: pick & 0x80 == 0,
        aux: pick & 0x40 == 0,
        flows: 4096,
        hugepages: false,
        ..Default::default()
    };
    let shared = SharedStores::new(&chain.groups, cfg.flows, cfg.default_idle_timeout_ns).expect("shared tables");
    let mut exec = Executor::new(chain, cfg, shared).expect("executor");
    let mut pool = PacketPool::new(PoolConfig { buffers: 512, ..PoolConfig::default() }).expect("pool");
    let mut batch = Batch::new(&pool);
    let mut now_ns: u64 = 1_000;

    let mut flush = |batch: &mut Batch, pool: &mut PacketPool, now_ns: u64| {
        if batch.is_empty() {
            return;
        }
        let n = batch.len();
        exec.process(batch, &NfContext { now_tsc: now_ns.wrapping_mul(3), now_ns });
        assert_eq!(batch.len(), n, "the executor must keep the batch whole");
        batch.free_all(pool).expect("own pool");
    };

    while rest.len() >= 2 {
        let (len, gap) = (usize::from(rest[0]), rest[1]);
        let take = len.min(rest.len() - 2);
        let frame = &rest[2..2 + take];
        rest = &rest[2 + take..];
        assert!(batch.push_copy(&mut pool, frame, now_ns), "batch has room and pool has buffers");
        now_ns = now_ns.saturating_add(u64::from(gap & 0x7f) * 1_000_000_000);
        if batch.len() == 32 || gap & 0x80 != 0 {
            flush(&mut batch, &mut pool, now_ns);
        }
    }
    flush(&mut batch, &mut pool, now_ns);

    // Every NF either forwards or drops what it was given.
    let results = exec.nf_results();
    assert_eq!(results.len(), text.split("->").count());
    for (name, c, _) in &results {
        assert_eq!(c.packets_in, c.packets_out + c.dropped, "{name}: {c:?}");
    }
    let report = exec.store_report();
    assert!(report.flows <= report.capacity, "{report:?}");
    let _ = (exec.export("fsc", true), exec.export("srcctr", true));
});
