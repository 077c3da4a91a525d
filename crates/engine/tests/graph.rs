//! Chain graphs in the engine: port labels and `port(...)`, a deny branch's
//! revived packets, and a graph's flow state handed over between cores
//! (every segment's entries, in sections) as a linear chain's is.

use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::{ExecConfig, ExecKind, Pipeline};
use flowplane_engine::spec::parse;
use flowplane_nf::testutil::udp4;
use flowplane_nf::NfContext;
use flowplane_packet::{Batch, PacketPool, PoolConfig, DROP};

fn pipeline(spec: &str, kind: ExecKind) -> Pipeline {
    let c = Chain::build(&parse(spec).unwrap()).unwrap();
    let shared = SharedStores::for_chain(&c, 4096, 3_600_000_000_000).unwrap();
    Pipeline::new(c, ExecConfig { kind, flows: 4096, hugepages: false, ..ExecConfig::default() }, shared).unwrap()
}

/// Runs `frames` through `p` in batches of 64; the verdicts in order.
fn run(p: &mut Pipeline, frames: &[Vec<u8>]) -> Vec<u16> {
    let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..Default::default() }).unwrap();
    let mut batch = Batch::new(&pool);
    let mut out = Vec::new();
    for chunk in frames.chunks(64) {
        for f in chunk {
            assert!(batch.push_copy(&mut pool, f, 0));
        }
        p.process(&mut batch, &NfContext { now_tsc: 0, now_ns: 1_000 });
        out.extend_from_slice(batch.verdicts());
        batch.free_all(&mut pool).unwrap();
    }
    out
}

fn frames() -> Vec<Vec<u8>> {
    (0..300u32)
        .map(|f| udp4([10, 0, 0, (f % 50) as u8], [192, 168, 1, (f % 7) as u8], 1000 + f as u16 % 9, 80))
        .collect()
}

#[test]
fn labels_route_by_verdict_and_unbranched_verdicts_stay() {
    for kind in ExecKind::all() {
        // Port labels: forward sends everything to port 3; its branch counts and sends to 5.
        let mut p = pipeline("forward(port=3) -> { 3: count -> port(5) ; allow: fsc }", kind);
        assert!(run(&mut p, &frames()).iter().all(|&v| v == 5), "{kind}");
        let names: Vec<String> = p.nf_results().into_iter().map(|r| r.0).collect();
        assert_eq!(names, ["forward", "3/count", "allow/fsc"]);
        assert_eq!(p.nf_results()[1].1.packets_in, 300);
        assert_eq!(p.nf_results()[2].1.packets_in, 0, "a port label wins over allow");
        // No deny branch: drops stay drops; allow's packets keep going to port(1).
        let mut p = pipeline("acl(rule=drop:udp:any:192.168.1.0/30) -> { allow: fsc -> port(1) }", kind);
        let v = run(&mut p, &frames());
        for (f, &x) in v.iter().enumerate() {
            assert_eq!(x, if f % 7 <= 3 { DROP } else { 1 }, "{kind} packet {f}");
        }
        // A deny branch revives: its own drops count (nested ACL drops 192.168.1.0).
        let mut p = pipeline(
            "acl(rule=drop:udp:any:192.168.1.0/30) -> { deny: acl(rule=drop:udp:any:192.168.1.0/32) -> port(2) }",
            kind,
        );
        let v = run(&mut p, &frames());
        for (f, &x) in v.iter().enumerate() {
            let want = match f % 7 {
                0 => DROP,
                1..=3 => 2,
                _ => 0,
            };
            assert_eq!(x, want, "{kind} packet {f}");
        }
    }
}

#[test]
fn a_graphs_flows_move_between_cores_with_every_segment() {
    let spec = "fsc -> acl(rule=drop:udp:any:192.168.1.0/30) -> { allow: lb -> fsc ; deny: fsc -> { allow: fsc } }";
    for kind in ExecKind::all() {
        let mut a = pipeline(spec, kind);
        // Results come in the spec's flat order, named by path.
        let names: Vec<String> = a.nf_results().into_iter().map(|r| r.0).collect();
        assert_eq!(names, parse(spec).unwrap().nf_paths());
        run(&mut a, &frames());
        let before = a.store_report();
        let rows = |p: &Pipeline, nf: &str| {
            let mut r = p.export(nf, true).unwrap_or_default();
            r.sort_by_key(|x| x.to_string());
            r
        };
        let want: Vec<_> = ["fsc", "allow/fsc", "deny/fsc", "deny/allow/fsc"].map(|n| rows(&a, n)).into();
        assert!(
            want.iter().all(|r| !r.is_empty()),
            "{kind}: every segment holds flows: {:?}",
            want.iter().map(Vec::len).collect::<Vec<_>>()
        );
        let mut data = Vec::new();
        let moved = a.export_flows(&|_| true, &mut data);
        assert_eq!(moved as u64, before.entries, "{kind}");
        assert_eq!(a.store_report().entries, 0, "{kind}");
        let mut b = pipeline(spec, kind);
        assert_eq!(b.import_flows(&data), (moved, 0), "{kind}");
        let got: Vec<_> = ["fsc", "allow/fsc", "deny/fsc", "deny/allow/fsc"].map(|n| rows(&b, n)).into();
        assert_eq!(got, want, "{kind}: each segment's state arrives in its segment");
        // A truncated hand-over imports what it can and never panics.
        let mut c = pipeline(spec, kind);
        let _ = c.import_flows(&data[..data.len() / 2]);
    }
}
