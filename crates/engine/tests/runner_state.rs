//! End-of-run state through the runner: exports wait for every worker, and
//! coarse NFs' idle timeouts are their own.

use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::{ExecConfig, Pipeline};
use flowplane_engine::load::load_generated;
use flowplane_engine::spec::parse;
use flowplane_engine::{run, RunConfig};
use flowplane_nf::testutil::udp4;
use flowplane_nf::NfContext;
use flowplane_packet::{Batch, PacketPool, PoolConfig};
use flowplane_scale::RssDispatcher;
use flowplane_trace::gen::{GenConfig, Generator};

fn exports(cores: usize) -> (Vec<String>, u64) {
    let gen = Generator::new(GenConfig { flows: 5000, packets: 60_000, seed: 7, ..GenConfig::default() }).unwrap();
    let (trace, load) = load_generated(gen, &RssDispatcher::new(cores, false).unwrap()).unwrap();
    let cfg = RunConfig {
        cores,
        pin: false,
        export: vec!["srcctr".into()],
        exec: ExecConfig { flows: 1 << 14, hugepages: false, ..ExecConfig::default() },
        ..RunConfig::default()
    };
    let spec = parse("srcctr -> fsc").unwrap();
    let r = run(&cfg, &spec, trace, Default::default()).unwrap();
    let rows = &r.exports.iter().find(|(n, _)| n == "srcctr").unwrap().1;
    let total: u64 = rows.iter().map(|r| r["packets"].as_u64().unwrap()).sum();
    // (first/last seen follow the run's clock: compare the counts.)
    let mut v: Vec<String> = rows.iter().map(|r| format!("{} {} {}", r["src"], r["packets"], r["bytes"])).collect();
    v.sort();
    assert_eq!(total, load.packets, "{cores} core(s): every packet is in the export");
    (v, total)
}

#[test]
fn shared_state_is_exported_after_every_worker_stopped() {
    let one = exports(1);
    let two = exports(2);
    assert!(!one.0.is_empty());
    assert_eq!(one.1, two.1);
    assert_eq!(one.0.len(), two.0.len(), "2 cores export as many sources as 1 core");
    assert!(one.0 == two.0, "2 cores export what 1 core does");
}

#[test]
fn coarse_nfs_expire_on_their_own_timeout() {
    // portknock keeps per-source state shared between cores; its timeout=1 (s)
    // must rule its shared table, not the run's 30 s default.
    let c = Chain::build(&parse("portknock(timeout=1)").unwrap()).unwrap();
    assert_eq!(c.groups[0].idle_timeout_ns, Some(1_000_000_000));
    let shared = SharedStores::new(&c.groups, 4096, 30_000_000_000).unwrap();
    let cfg = ExecConfig { flows: 4096, hugepages: false, aux: false, ..ExecConfig::default() };
    let mut p = Pipeline::new(c, cfg, shared.clone()).unwrap();
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    let mut batch = Batch::new(&pool);
    let mut send = |p: &mut Pipeline, src: u8, now_ns: u64| {
        assert!(batch.push_copy(&mut pool, &udp4([10, 0, 0, src], [192, 168, 1, 1], 5000, 53), 0));
        p.process(&mut batch, &NfContext { now_tsc: 0, now_ns });
        batch.free_all(&mut pool).unwrap();
    };
    send(&mut p, 1, 0);
    assert_eq!(shared.tables[0].len(), 1);
    // 5 s later (well within the 30 s default), other traffic drives the sweep.
    for k in 0..4000u64 {
        send(&mut p, 2, 5_000_000_000 + k * 1_000_000);
    }
    assert_eq!(shared.tables[0].len(), 1, "source 1 expired after its 1 s timeout; source 2 remains");
}
