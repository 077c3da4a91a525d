//! Issue 29: an export listed states idle past their NF's timeout that no sweep had removed yet (a coarse
//! NF's entry pinned by live flows, a replica's key). An export applies a lookup's idle rule at the run's
//! latest packet time: what a packet then would find idle (and start over) is not listed.

use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::Pipeline;
use flowplane_engine::exec::{ExecConfig, ExecKind};
use flowplane_engine::spec::parse;
use flowplane_nf::testutil::udp4;
use flowplane_nf::NfContext;
use flowplane_packet::{Batch, PacketPool, PoolConfig};

const S: u64 = 1_000_000_000;

#[test]
fn exports_leave_out_states_idle_past_their_timeout_at_the_last_packet() {
    // (time, source): ten sources at 1 s, three of them again at 4 s, a new one at 5 s.
    let mut sends: Vec<(u64, u8)> = (1..=10).map(|s| (S, s)).collect();
    sends.extend([(4 * S, 1), (4 * S, 2), (4 * S, 3), (5 * S, 20)]);
    // The oracle from the rule: portknock(timeout=1) keeps a source whose last packet is within 1 s of the last
    // packet (5 s); fsc's flows live for the run's 30 s.
    let last = sends.iter().map(|s| s.0).max().unwrap();
    let mut want: Vec<String> = sends
        .iter()
        .filter(|(t, s)| last - t <= S && !sends.iter().any(|(t2, s2)| s2 == s && t2 > t))
        .map(|(_, s)| format!("10.0.0.{s}"))
        .collect();
    want.sort();
    assert_eq!(want, ["10.0.0.1", "10.0.0.2", "10.0.0.20", "10.0.0.3"]);
    for kind in ExecKind::all() {
        for aux in [true, false] {
            let c = Chain::build(&parse("fsc -> portknock(knock=7001-7002,protect=22,timeout=1)").unwrap()).unwrap();
            let shared = SharedStores::new(&c.groups, 1024, 30 * S).unwrap();
            let cfg = ExecConfig { kind, flows: 1024, hugepages: false, aux, ..ExecConfig::default() };
            let mut p = Pipeline::new(c, cfg, shared).unwrap();
            let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
            let mut batch = Batch::new(&pool);
            // One batch per distinct time, as a replay delivers them.
            let mut times: Vec<u64> = sends.iter().map(|s| s.0).collect();
            times.dedup();
            for t in times {
                for (_, s) in sends.iter().filter(|x| x.0 == t) {
                    assert!(batch.push_copy(&mut pool, &udp4([10, 0, 0, *s], [198, 51, 100, 1], 4000, 53), t));
                }
                p.process(&mut batch, &NfContext { now_tsc: 0, now_ns: t });
                batch.free_all(&mut pool).unwrap();
            }
            let mut got: Vec<String> =
                p.export("portknock", true).unwrap().iter().map(|r| r["src"].as_str().unwrap().to_string()).collect();
            got.sort();
            assert_eq!(got, want, "{kind} aux={aux}");
            assert_eq!(p.export("fsc", true).unwrap().len(), 11, "{kind} aux={aux}: fsc's flows are all live");
        }
    }
}
