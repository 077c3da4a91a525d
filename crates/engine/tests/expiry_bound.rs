//! Idle expiry is bounded whatever the table's size: a flow idle past its
//! timeout is expired (its release callbacks run: the NAT port returns to
//! the pool) within `timeout + sweep_period_ns(timeout)` of packet time,
//! at 1K and at 4M entries, on a lightly loaded table (the case:
//! 50 packets/s, where a per-batch sweep budget never reached the flow).

use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::{sweep_period_ns, ExecConfig, ExecKind, Pipeline};
use flowplane_engine::spec::parse;
use flowplane_nf::testutil::udp4;
use flowplane_nf::NfContext;
use flowplane_packet::{Batch, PacketPool, PoolConfig, DROP};

const S: u64 = 1_000_000_000;
/// 50 packets per second.
const GAP: u64 = 20_000_000;

/// Packet time at which the idle flow was expired, and whether a new
/// connection got the port it held as soon as it was.
fn expiry_time(capacity: usize, kind: ExecKind) -> (u64, bool) {
    let server = [198, 51, 100, 7];
    let c = Chain::build(&parse("nat(ports=1024-1025, timeout=1) -> fsc").unwrap()).unwrap();
    let shared = SharedStores::new(&c.groups, 1024, 30 * S).unwrap();
    let cfg = ExecConfig { kind, flows: capacity, hugepages: false, ..ExecConfig::default() };
    let mut p = Pipeline::new(c, cfg, shared).unwrap();
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    let mut batch = Batch::new(&pool);
    let mut send = |p: &mut Pipeline, ts: u64, frame: Vec<u8>| {
        assert!(batch.push_copy(&mut pool, &frame, ts));
        p.process(&mut batch, &NfContext { now_tsc: 0, now_ns: ts });
        let v = batch.verdicts()[0];
        batch.free_all(&mut pool).unwrap();
        v
    };
    let t0 = 5 * S;
    // a takes one port, b the other and stays active; then a is idle.
    send(&mut p, t0, udp4([10, 0, 0, 1], server, 1000, 53));
    let mut t = t0;
    let mut expired_at = None;
    while t < t0 + 4 * S && expired_at.is_none() {
        t += GAP;
        assert_ne!(send(&mut p, t, udp4([10, 0, 0, 2], server, 1000, 53)), DROP);
        if p.store_report().expiries > 0 {
            expired_at = Some(t);
        }
    }
    let at = expired_at.unwrap_or_else(|| panic!("capacity {capacity}: the idle flow was never expired"));
    // Its port is free at once: a third host gets it (the pool has two ports).
    let v = send(&mut p, at + 1, udp4([10, 0, 0, 3], server, 1000, 53));
    (at - t0, v != DROP)
}

#[test]
fn idle_flows_expire_within_the_documented_bound_at_1k_and_4m_entries() {
    let bound = S + sweep_period_ns(S) + GAP;
    for capacity in [1024, 4 << 20] {
        for kind in [ExecKind::BATCH, ExecKind::parse("rtc").unwrap()] {
            let (idle, reused) = expiry_time(capacity, kind);
            assert!(idle > S, "capacity {capacity}, {kind}: expired after {idle} ns, before its timeout");
            assert!(idle <= bound, "capacity {capacity}, {kind}: expired after {idle} ns > bound {bound}");
            assert!(reused, "capacity {capacity}, {kind}: the expired flow's NAT port was not released");
        }
    }
}
