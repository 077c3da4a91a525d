//! Every executor runs the same NF code: same verdicts, same counters, same
//! exported state, on the same packets — and bad packets are counted, not fatal.

use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::{ExecConfig, ExecKind, Pipeline};
use flowplane_engine::spec::parse;
use flowplane_nf::testutil::{tcp4, udp4, udp6};
use flowplane_nf::{NfContext, NfCounters};
use flowplane_packet::{Batch, PacketPool, PoolConfig, DROP};
use std::net::Ipv6Addr;

/// Every registered executor, and the interleaved one at several task counts.
fn kinds() -> Vec<ExecKind> {
    let mut v: Vec<ExecKind> = ExecKind::all().collect();
    v.extend(["interleaved:1", "interleaved:4", "interleaved:64"].map(|s| ExecKind::parse(s).unwrap()));
    v
}

fn frames() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    // 300 flows, 5 packets each, interleaved; some TCP, some malformed.
    for round in 0..5u32 {
        for f in 0..300u32 {
            let src = [10, 0, (f >> 8) as u8, f as u8];
            if f % 7 == 0 {
                v.push(tcp4(src, [192, 168, 1, 1], 1000 + f as u16, 80, 0x10, round, 0));
            } else {
                v.push(udp4(src, [192, 168, 1, 2], 2000 + f as u16, 53));
            }
        }
        v.push(vec![0xde, 0xad]);
        v.push(vec![0u8; 60]);
    }
    v
}

/// Counters, verdicts, fsc's export, unparsed packets, entries in the executor's store(s).
type Outcome = (Vec<(String, NfCounters)>, Vec<Vec<u16>>, Option<Vec<String>>, u64, u64);

fn run(chain: &str, kind: ExecKind, aux: bool) -> Outcome {
    run_with(chain, ExecConfig { kind, aux, ..ExecConfig::default() })
}

fn run_with(chain: &str, cfg: ExecConfig) -> Outcome {
    run_frames(chain, cfg, &frames())
}

fn run_frames(chain: &str, cfg: ExecConfig, frames: &[Vec<u8>]) -> Outcome {
    let c = Chain::build(&parse(chain).unwrap()).unwrap();
    let shared = SharedStores::new(&c.groups, 4096, 3_600_000_000_000).unwrap();
    let cfg = ExecConfig { flows: 4096, hugepages: false, ..cfg };
    let mut exec = Pipeline::new(c, cfg, shared).unwrap();
    let mut pool = PacketPool::new(PoolConfig { buffers: 1024, ..Default::default() }).unwrap();
    let mut batch = Batch::new(&pool);
    let mut verdicts = Vec::new();
    for (k, chunk) in frames.chunks(32).enumerate() {
        for f in chunk {
            assert!(batch.push_copy(&mut pool, f, 0));
        }
        exec.process(&mut batch, &NfContext { now_tsc: 0, now_ns: k as u64 * 1000 });
        verdicts.push(batch.verdicts().to_vec());
        batch.free_all(&mut pool).unwrap();
    }
    let counters = exec.nf_results().into_iter().map(|(n, c, _)| (n, c)).collect();
    let export = exec.export("fsc", true).map(|rows| {
        let mut v: Vec<String> = rows.iter().map(|r| r.to_string()).collect();
        v.sort();
        v
    });
    let report = exec.store_report();
    assert_conserved(&report, &format!("{chain} under {}", cfg.kind));
    (counters, verdicts, export, report.unparsed, report.entries)
}

/// Table conservation, the contract every executor keeps: each entry inserted is still there, expired, ended by
/// an NF or evicted (summed over the context's tables: one per NF under `pernf`, where an ended flow leaves each),
/// and the live flows are the first table's entries (every later per-NF table holds a subset).
fn assert_conserved(r: &flowplane_engine::exec::StoreReport, what: &str) {
    assert_eq!(r.entries + r.expiries + r.ended + r.evictions, r.insertions, "{what}: table counters {r:?}");
    assert!(r.conserved(), "{what}: {r:?}");
    assert!(r.flows <= r.entries && r.entries <= r.capacity + r.capacity_v6, "{what}: {r:?}");
}

/// Issue 29: `fsc -> nat` under `pernf` ended a flow nat dropped (pool exhausted) in both NFs' tables but counted
/// it once (512 flows + 2,440 ended of 5,392 insertions). 600 UDP flows on a 256-port pool, one packet each and
/// again: nat maps the first 256 flows and ends the rest at their first packet, every executor alike.
#[test]
fn ended_flows_are_counted_per_entry_under_every_executor() {
    let frames: Vec<Vec<u8>> = (0..2)
        .flat_map(|_| (0..600u32).map(|f| udp4([10, 0, (f >> 8) as u8, f as u8], [198, 51, 100, 1], 5000, 53)))
        .collect();
    let chain = "fsc -> nat(ports=1024-1279)";
    for kind in kinds() {
        let o = run_frames(chain, ExecConfig { kind, ..ExecConfig::default() }, &frames);
        let nat = o.0.iter().find(|(n, _)| n == "nat").unwrap().1;
        assert_eq!((nat.packets_in, nat.dropped), (1200, 2 * (600 - 256)), "{kind}");
        // Live: the 256 mapped flows, in fsc's table (and nat's own under pernf).
        let tables = if kind.name() == "pernf" { 2 } else { 1 };
        assert_eq!(o.4, 256 * tables, "{kind}");
    }
}

#[test]
fn executors_agree_on_a_five_tuple_chain() {
    five_tuple_chain("lb(backends=4) -> fsc -> ratelimit(pps=1, burst=3)");
    // Resumable NFs in the chain: the interleaved executor's task window.
    five_tuple_chain("lb(backends=4) -> fsc -> synthetic(k=3, mem=64k) -> ratelimit(pps=1, burst=3) -> acl");
    // A rule walk over many steps (acl walks 8 rules per step): flows match early, late or not at all.
    let rules: Vec<String> = (0..40u32)
        .map(|i| format!("{}:udp:any:any:{}-{}", if i % 3 == 0 { "drop" } else { "allow" }, 2000 + 7 * i, 2003 + 7 * i))
        .collect();
    five_tuple_chain(&format!("lb(backends=4) -> fsc -> ratelimit(pps=1, burst=3) -> acl(rule={})", rules.join(";")));
}

/// IPv6 flows among IPv4 ones behind an NF that drops: an NF's lookup (its own, under `pernf`, where the IPv4
/// keys are gathered once per batch and the IPv6 ones looked up key by key) never sees a packet dropped before it.
#[test]
fn executors_agree_on_ipv6_behind_a_dropping_nf() {
    let mut frames = Vec::new();
    for _round in 0..5 {
        for f in 0..200u16 {
            frames.push(if f % 4 == 1 {
                udp6(
                    Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, f),
                    Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1),
                    3000 + f,
                    53,
                )
            } else {
                udp4([10, 1, (f >> 8) as u8, f as u8], [192, 168, 1, 2], 2000 + f, 53)
            });
        }
    }
    // The ACL drops every packet of flows 0-49 (both families), so their first packet never reaches fsc.
    let chain = "ratelimit(pps=1, burst=3) -> acl(rule=drop:udp:any:any:2000-2049;drop:udp:any:any:3000-3049) -> fsc -> lb(backends=4)";
    let reference =
        run_frames(chain, ExecConfig { kind: ExecKind::parse("rtc").unwrap(), ..ExecConfig::default() }, &frames);
    // The limiter passes each flow's first three packets (no refill within the trace's 31 us): fsc sees those of
    // the 150 flows the ACL lets through, and only those have an fsc entry.
    let counters = |name: &str| reference.0.iter().find(|(n, _)| n == name).unwrap().1;
    assert_eq!((counters("ratelimit").packets_in, counters("ratelimit").dropped), (1000, 400));
    assert_eq!((counters("acl").packets_in, counters("acl").dropped), (600, 150));
    assert_eq!(counters("fsc").packets_in, 450);
    assert_eq!(reference.2.as_ref().unwrap().len(), 150, "one fsc entry per flow that reached it, IPv6 ones included");
    for kind in kinds() {
        let o = run_frames(chain, ExecConfig { kind, ..ExecConfig::default() }, &frames);
        assert_eq!((&o.0, &o.1, &o.2), (&reference.0, &reference.1, &reference.2), "{kind}");
    }
    // pernf: each NF's own table holds the flows that reached it (ratelimit and acl 200, fsc and lb 150).
    let o = run_frames(chain, ExecConfig { kind: ExecKind::parse("pernf").unwrap(), ..ExecConfig::default() }, &frames);
    assert_eq!(o.4, 200 + 200 + 150 + 150);
}

fn five_tuple_chain(chain: &str) {
    let reference = run(chain, ExecKind::BATCH, true);
    // The rate limiter drops packets 4 and 5 of each flow.
    let rl = &reference.0.iter().find(|(n, _)| n == "ratelimit").unwrap().1;
    assert_eq!(rl.packets_in, 1510, "malformed frames pass through (on_unparsed) and are counted");
    assert_eq!(rl.dropped, 600);
    assert!(reference.1.iter().flatten().any(|&v| v == DROP));
    assert_eq!(reference.3, 10, "malformed frames counted");
    let fsc = reference.2.as_ref().unwrap();
    assert_eq!(fsc.len(), 300);
    for kind in kinds().into_iter().filter(|&k| k != ExecKind::BATCH) {
        let o = run(chain, kind, true);
        assert_eq!(o.0, reference.0, "{kind} counters");
        assert_eq!(o.1, reference.1, "{kind} verdicts");
        assert_eq!(o.2, reference.2, "{kind} export");
    }
    // The chain-level optimisations change the layout, never the answer.
    for kind in kinds() {
        let o = run_with(chain, ExecConfig { kind, packing: false, ..ExecConfig::default() });
        assert_eq!((&o.0, &o.1, &o.2), (&reference.0, &reference.1, &reference.2), "{kind} --no-packing");
    }
    let o = run_with(chain, ExecConfig { match_sharing: false, ..ExecConfig::default() });
    assert_eq!((&o.0, &o.1, &o.2), (&reference.0, &reference.1, &reference.2), "batch --no-match-sharing");
    let il =
        ExecConfig { kind: ExecKind::parse("interleaved:4").unwrap(), match_sharing: false, ..ExecConfig::default() };
    let c = Chain::build(&parse(chain).unwrap()).unwrap();
    let e = Pipeline::new(c, il, SharedStores::default()).err().expect("refused").to_string();
    assert!(e.contains("no per-NF matching"), "{e}");
    let no_pf = {
        let c = Chain::build(&parse(chain).unwrap()).unwrap();
        let cfg = ExecConfig { prefetch: false, flows: 4096, hugepages: false, ..ExecConfig::default() };
        let mut e = Pipeline::new(c, cfg, SharedStores::default()).unwrap();
        let mut pool = PacketPool::new(PoolConfig { buffers: 1024, ..Default::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        for (k, chunk) in frames().chunks(32).enumerate() {
            for f in chunk {
                assert!(batch.push_copy(&mut pool, f, 0));
            }
            e.process(&mut batch, &NfContext { now_tsc: 0, now_ns: k as u64 * 1000 });
            batch.free_all(&mut pool).unwrap();
        }
        e.nf_results().into_iter().map(|(n, c, _)| (n, c)).collect::<Vec<_>>()
    };
    assert_eq!(no_pf, reference.0, "prefetch off");
}

#[test]
fn full_table_is_counted_not_fatal() {
    let c = Chain::build(&parse("fsc").unwrap()).unwrap();
    // 64 entries for 300 flows.
    let cfg = ExecConfig { flows: 64, hugepages: false, ..ExecConfig::default() };
    let mut e = Pipeline::new(c, cfg, SharedStores::default()).unwrap();
    let mut pool = PacketPool::new(PoolConfig { buffers: 1024, ..Default::default() }).unwrap();
    let mut batch = Batch::new(&pool);
    for chunk in frames().chunks(32) {
        for f in chunk {
            assert!(batch.push_copy(&mut pool, f, 0));
        }
        e.process(&mut batch, &NfContext::default());
        batch.free_all(&mut pool).unwrap();
    }
    let r = e.store_report();
    assert!(r.table_full > 0, "{r:?}");
    assert!(r.flows <= r.capacity);
    assert_eq!(e.nf_results()[0].1.packets_in, 1510, "every packet still passes through");
}

#[test]
fn executors_agree_on_a_mixed_granularity_chain() {
    // Source-IP counter and destination policer keep shared (coarse) state;
    // the load balancer is per 5-tuple. With and without the auxiliary table.
    // With a resumable NF (acl) last, the interleaved executor runs its task
    // window over coarse state too (without one it runs the batched pass).
    for chain in [
        "srcctr -> policer(rate=100, burst=3, pps=true) -> lb",
        "srcctr -> policer(rate=100, burst=3, pps=true) -> lb -> acl",
    ] {
        let reference = run(chain, ExecKind::BATCH, true);
        let pol = &reference.0[1].1;
        assert_eq!(pol.packets_in, 1510);
        assert!(pol.dropped > 0, "the policer limits the two servers");
        for kind in kinds() {
            for aux in [true, false] {
                let o = run(chain, kind, aux);
                assert_eq!(o.0, reference.0, "{chain}: {kind} aux={aux} counters");
                assert_eq!(o.1, reference.1, "{chain}: {kind} aux={aux} verdicts");
            }
        }
    }
}

#[test]
fn coarse_state_is_shared_between_flows_and_exported_once() {
    let c = Chain::build(&parse("srcctr -> fsc").unwrap()).unwrap();
    assert_eq!(c.groups.len(), 1);
    let shared = SharedStores::new(&c.groups, 4096, 3_600_000_000_000).unwrap();
    let cfg = ExecConfig { flows: 4096, hugepages: false, ..ExecConfig::default() };
    let mut e = Pipeline::new(c, cfg, shared).unwrap();
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    let mut batch = Batch::new(&pool);
    // One source, 5 flows (ports), 2 packets each.
    for port in 0..10u16 {
        assert!(batch.push_copy(&mut pool, &udp4([10, 0, 0, 9], [192, 168, 1, 1], 5000 + port % 5, 53), 0));
    }
    e.process(&mut batch, &NfContext::default());
    batch.free_all(&mut pool).unwrap();
    let rows = e.export("srcctr", true).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["packets"], 10);
    assert_eq!(rows[0]["src"], "10.0.0.9");
    assert!(e.export("srcctr", false).unwrap().is_empty(), "other cores export nothing");
    assert_eq!(e.export("fsc", true).unwrap().len(), 5);
}

#[test]
fn idle_coarse_state_expires() {
    let c = Chain::build(&parse("srcctr").unwrap()).unwrap();
    // 1 s idle timeout for the shared table; no auxiliary pins (nothing else holds the entries).
    let shared = SharedStores::new(&c.groups, 4096, 1_000_000_000).unwrap();
    let cfg = ExecConfig {
        flows: 4096,
        hugepages: false,
        aux: false,
        default_idle_timeout_ns: 1_000_000_000,
        ..ExecConfig::default()
    };
    let mut e = Pipeline::new(c, cfg, shared).unwrap();
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    let mut batch = Batch::new(&pool);
    // Each packet carries its time (the packet clock, as a worker's batch does).
    let mut send = |e: &mut Pipeline, src: u8, now_ns: u64| {
        for _ in 0..8 {
            assert!(batch.push_copy(&mut pool, &udp4([10, 0, 0, src], [192, 168, 1, 1], 5000, 53), now_ns));
        }
        e.process(&mut batch, &NfContext { now_tsc: 0, now_ns });
        batch.free_all(&mut pool).unwrap();
    };
    send(&mut e, 1, 0);
    assert_eq!(e.export("srcctr", true).unwrap().len(), 1);
    // Much later, traffic from another source: the sweep removes the idle one.
    for k in 0..2000u64 {
        send(&mut e, 2, 10_000_000_000 + k * 1_000_000);
    }
    let rows = e.export("srcctr", true).unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["src"], "10.0.0.2");
}

#[test]
fn teid_and_field_set_keys_agree_across_executors() {
    use flowplane_wire::packet_repr::FrameBuilder;
    // 6 tunnels (TEIDs) carrying 4 inner flows each, plus plain UDP that has no TEID.
    let mut frames = Vec::new();
    for round in 0..3u16 {
        for teid in 0..6u32 {
            for inner in 0..4u16 {
                let mut buf = vec![0u8; 128];
                let b = FrameBuilder::udp_v4([10, 0, 0, 1].into(), [10, 0, 1, teid as u8].into(), 2152, 2152)
                    .with_gtpu(100 + teid, None);
                let n = b.emit(&mut buf, &[0x45, 0, 0, 20, inner as u8, round as u8]).unwrap();
                buf.truncate(n);
                frames.push(buf);
            }
        }
        frames.push(udp4([10, 0, 0, 9], [10, 0, 1, 0], 7, 8));
    }
    let chain = "keyctr(key=teid) -> keyctr(key=dst_ip+dport) -> fsc";
    let mut reference = None;
    for kind in kinds() {
        for aux in [true, false] {
            let c = Chain::build(&parse(chain).unwrap()).unwrap();
            assert_eq!(c.groups.len(), 2);
            let shared = SharedStores::new(&c.groups, 4096, 3_600_000_000_000).unwrap();
            let cfg = ExecConfig { kind, flows: 4096, hugepages: false, aux, ..ExecConfig::default() };
            let mut e = Pipeline::new(c, cfg, shared).unwrap();
            let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..Default::default() }).unwrap();
            let mut batch = Batch::new(&pool);
            for chunk in frames.chunks(32) {
                for f in chunk {
                    assert!(batch.push_copy(&mut pool, f, 0));
                }
                e.process(&mut batch, &NfContext::default());
                batch.free_all(&mut pool).unwrap();
            }
            let res = e.nf_results();
            let teids = &res[0].2.as_ref().unwrap();
            assert_eq!(teids["keys_seen"], 6, "{kind} aux={aux}");
            assert_eq!(teids["unkeyed"], 3, "plain UDP has no TEID");
            // dst_ip+dport: 6 tunnel endpoints (port 2152) and the plain UDP destination.
            assert_eq!(res[1].2.as_ref().unwrap()["keys_seen"], 7, "{kind} aux={aux}");
            let counters: Vec<_> = res.iter().map(|(n, c, _)| (n.clone(), *c)).collect();
            match &reference {
                None => reference = Some(counters),
                Some(r) => assert_eq!(&counters, r, "{kind} aux={aux}"),
            }
        }
    }
}
