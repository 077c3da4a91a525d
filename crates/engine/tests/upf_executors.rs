//! The `upf` NF under every executor: alone and behind 5-tuple NFs (which
//! make the executor own the batch), loaded from a session file, it gives
//! the same output bytes, verdicts and counters whatever the executor and
//! its own mode (staged or per packet).

use std::net::Ipv4Addr;

use flowplane_engine::chain::Chain;
use flowplane_engine::coarse::SharedStores;
use flowplane_engine::exec::{ExecConfig, ExecKind, Pipeline};
use flowplane_engine::spec::parse;
use flowplane_nf::testutil::{gtpu4, udp4};
use flowplane_nf::upf::rules::{FarAction, FarSpec, Iface, PdrSpec, SessionSpec, SessionsFile, UrrSpec};
use flowplane_nf::NfContext;
use flowplane_packet::{Batch, PacketPool, PoolConfig};

const GNB: [u8; 4] = [198, 51, 100, 10];
const N3: [u8; 4] = [192, 0, 2, 1];

fn ue(k: u32) -> [u8; 4] {
    [10, 45, 0, k as u8 + 1]
}

fn sessions_file(tag: &str) -> std::path::PathBuf {
    let sessions = (0..50u32)
        .map(|k| SessionSpec {
            seid: u64::from(k) + 1,
            ue_ipv4: Some(ue(k).into()),
            ue_ipv6: None,
            pdrs: vec![
                PdrSpec {
                    id: 1,
                    precedence: 10,
                    source: Iface::Access,
                    teid: Some(100 + k),
                    ue_ip: true,
                    qfi: None,
                    sdf: vec!["permit out 17 from any 53 to assigned".into()],
                    outer_header_removal: true,
                    far: 1,
                    qers: vec![],
                    urrs: vec![1],
                },
                PdrSpec {
                    id: 2,
                    precedence: 10,
                    source: Iface::Core,
                    teid: None,
                    ue_ip: true,
                    qfi: Some(5),
                    sdf: vec![],
                    outer_header_removal: false,
                    far: 2,
                    qers: vec![],
                    urrs: vec![1],
                },
            ],
            fars: vec![
                FarSpec {
                    id: 1,
                    action: FarAction::Forward,
                    destination: None,
                    ohc_teid: None,
                    ohc_addr: None,
                    tos: None,
                    notify_cp: false,
                },
                FarSpec {
                    id: 2,
                    action: if k % 5 == 0 { FarAction::Drop } else { FarAction::Forward },
                    destination: None,
                    ohc_teid: Some(0x1000 + k),
                    ohc_addr: Some(Ipv4Addr::from(GNB)),
                    tos: None,
                    notify_cp: false,
                },
            ],
            qers: vec![],
            urrs: vec![UrrSpec { id: 1, volume_threshold: Some(500), ..Default::default() }],
            bar: None,
        })
        .collect();
    let path = std::env::temp_dir().join(format!("flowplane-upf-exec-{tag}-{}.toml", std::process::id()));
    std::fs::write(&path, SessionsFile { sessions }.to_toml().unwrap()).unwrap();
    path
}

fn frames() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for r in 0..6u32 {
        for k in 0..60u32 {
            let inner = udp4(ue(k % 55), [203, 0, 113, 1], 4000 + r as u16, if k % 3 == 0 { 80 } else { 53 });
            v.push(gtpu4(GNB, N3, 100 + k % 55, Some(9), &inner[14..]));
            v.push(udp4([203, 0, 113, 1], ue(k % 52), 53, 4000 + r as u16));
        }
        v.push(vec![0xde, 0xad]);
        v.push(gtpu4(GNB, N3, 100, None, &[0x45, 0, 0]));
    }
    v
}

type Outcome = (Vec<Vec<u8>>, Vec<u16>, Vec<(String, u64, u64)>, serde_json::Value);

fn run(chain: &str, kind: ExecKind) -> Outcome {
    let c = Chain::build(&parse(chain).unwrap()).unwrap();
    let shared = SharedStores::new(&c.groups, 4096, 3_600_000_000_000).unwrap();
    let cfg = ExecConfig { kind, flows: 4096, hugepages: false, ..ExecConfig::default() };
    let mut exec = Pipeline::new(c, cfg, shared).unwrap();
    let mut pool = PacketPool::new(PoolConfig { buffers: 1024, ..Default::default() }).unwrap();
    let mut batch = Batch::new(&pool);
    let (mut out, mut verdicts) = (Vec::new(), Vec::new());
    for (k, chunk) in frames().chunks(32).enumerate() {
        for f in chunk {
            assert!(batch.push_copy(&mut pool, f, k as u64 * 1000));
        }
        exec.process(&mut batch, &NfContext { now_tsc: 0, now_ns: k as u64 * 1000 });
        for i in 0..batch.len() {
            out.push(if batch.is_dropped(i) { Vec::new() } else { batch.data(i).to_vec() });
        }
        verdicts.extend_from_slice(batch.verdicts());
        batch.free_all(&mut pool).unwrap();
    }
    let results = exec.nf_results();
    let upf = results.iter().find(|r| r.0 == "upf").and_then(|r| r.2.clone()).unwrap();
    let counters = results.into_iter().map(|(n, c, _)| (n, c.packets_out, c.dropped)).collect();
    (out, verdicts, counters, upf)
}

#[test]
fn upf_agrees_under_every_executor() {
    let file = sessions_file("agree");
    let f = file.display();
    let alone = run(&format!("upf(sessions={f}, n3_port=1, n6_port=2)"), ExecKind::BATCH);
    let c = &alone.3["counters"];
    // Per round: TEIDs of k = 50..54 unknown; 18 of the 55 known send to port 80 (no PDR).
    assert_eq!(c["ul_forwarded"], 222, "{c}");
    // Per round: UEs 50, 51 unknown; sessions k % 5 == 0 drop downlink (12 packets).
    assert_eq!(c["dl_forwarded"], 276, "{c}");
    assert_eq!((c["unknown_teid"].as_u64(), c["unknown_ue"].as_u64()), (Some(30), Some(12)), "{c}");
    assert_eq!((c["no_pdr"].as_u64(), c["far_drop"].as_u64()), (Some(108), Some(72)), "{c}");
    assert_eq!((c["not_ip"].as_u64(), c["malformed_inner"].as_u64()), (Some(6), Some(6)), "{c}");
    assert!(c["usage_reports"].as_u64().unwrap() > 0);
    assert!(alone.1.contains(&1) && alone.1.contains(&2));
    let rtc_mode = run(&format!("upf(sessions={f}, n3_port=1, n6_port=2, mode=rtc)"), ExecKind::BATCH);
    assert_eq!(rtc_mode, alone, "mode=rtc");
    let chained = format!("fsc -> upf(sessions={f}, n3_port=1, n6_port=2) -> count");
    let reference = run(&chained, ExecKind::BATCH);
    assert_eq!(reference.0, alone.0, "the same bytes behind a 5-tuple NF");
    for kind in ExecKind::all() {
        assert_eq!(run(&chained, kind), reference, "{kind}");
        assert_eq!(run(&format!("upf(sessions={f}, n3_port=1, n6_port=2)"), kind), alone, "{kind}");
    }
    let _ = std::fs::remove_file(&file);
}

/// A 5-tuple NF after `upf` would key its state on the GTP-U tunnel, not on
/// the inner flows the UPF decapsulates: the chain is refused in one line.
#[test]
fn stateful_nfs_after_upf_are_refused() {
    let file = sessions_file("refused");
    let f = file.display();
    for after in ["fsc", "fw", "ddos"] {
        let spec = parse(&format!("upf(sessions={f}) -> count -> {after}")).unwrap();
        let e = Chain::build(&spec).err().expect("refused").to_string();
        assert!(e.starts_with(&format!("{after} cannot follow upf")), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
    // Stateless elements after it are fine, and stateful NFs before it.
    assert!(Chain::build(&parse(&format!("fsc -> upf(sessions={f}) -> count")).unwrap()).is_ok());
    let _ = std::fs::remove_file(&file);
}
