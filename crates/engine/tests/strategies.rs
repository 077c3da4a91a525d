//! Every NF of the library under every multi-core strategy, through the
//! live runtime (placement check, NIC programming, steering at receive):
//! the same verdicts, counters and exports on 1 core, 2 cores and 8 virtual
//! cores as on 1 core, or a one-line refusal; NFs whose per-key order a
//! strategy does not keep are named in the report. Hand-made traces cover
//! `fw` with ICMP errors about known flows and `portknock` with interleaved
//! knockers.

use std::path::{Path, PathBuf};

use flowplane_engine::exec::ExecConfig;
use flowplane_engine::runner::{run_input, Input, Output};
use flowplane_engine::spec::parse;
use flowplane_engine::{EngineError, Report, RunConfig};
use flowplane_nf::registry::NFS;
use flowplane_nf::testutil::ipv4_frame;
use flowplane_trace::gen::{FlowDist, GenConfig, Generator, Proto};
use flowplane_trace::{PcapWriter, WriterOptions};
use serde_json::Value;

#[derive(Clone)]
enum Traffic {
    Gen(GenConfig),
    File(PathBuf),
}

fn cfg(cores: usize, scale: &str, virt: Option<usize>, export: &[&str]) -> RunConfig {
    RunConfig {
        cores,
        pin: false,
        scale: scale.to_string(),
        virtual_cores: virt,
        export: export.iter().map(|s| s.to_string()).collect(),
        exec: ExecConfig { flows: 1 << 14, hugepages: false, ..ExecConfig::default() },
        ..RunConfig::default()
    }
}

fn go(chain: &str, t: &Traffic, c: &RunConfig) -> Result<Report, EngineError> {
    let spec = parse(chain).unwrap();
    let input = match t {
        Traffic::Gen(g) => Input::Generated(Box::new(Generator::new(g.clone()).unwrap())),
        Traffic::File(p) => Input::File(p),
    };
    run_input(c, &spec, input, false, Output::Discard).map(|r| r.report)
}

/// Export rows as sorted strings, without what depends on the core that handled a flow.
fn canonical(r: &Report, nf: &str) -> Vec<String> {
    let rows = r.exports.iter().find(|(n, _)| n == nf).map(|(_, r)| r.clone()).unwrap_or_default();
    let mut v: Vec<String> = rows
        .into_iter()
        .map(|mut r| {
            if let Value::Object(m) = &mut r {
                for k in ["backend", "translated_addr", "translated_port"] {
                    m.remove(k);
                }
            }
            r.to_string()
        })
        .collect();
    v.sort();
    v
}

fn chain_of(name: &str) -> String {
    match name {
        "synthetic" => "synthetic(mem=65536)".into(),
        "hh" => "hh(k=5)".into(),
        "portknock" => "portknock(knock=1111-2222-3333, protect=22)".into(),
        "route" => {
            let p = std::env::temp_dir().join(format!("fp-strat-routes-{}.txt", std::process::id()));
            std::fs::write(&p, "10.0.0.0/8 1\n172.16.0.0/12 2\n192.168.0.0/16 3\n0.0.0.0/0 4\n").unwrap();
            format!("route(routes={})", p.display())
        }
        other => other.into(),
    }
}

/// Compares a run with the 1-core one; `Ok(false)` if refused (checked to be one line).
fn same_as_one(name: &str, chain: &str, t: &Traffic, one: &Report, c: &RunConfig) -> bool {
    let exportable = !one.exports.is_empty();
    match go(chain, t, c) {
        Err(e) => {
            let msg = e.to_string();
            assert!(matches!(e, EngineError::Config(_)), "{name} under {}: {msg}", c.scale);
            assert!(!msg.contains('\n') && msg.starts_with("--"), "one line: {msg}");
            false
        }
        Ok(r) => {
            let sc = r.scale.as_ref().unwrap();
            if sc.order_not_guaranteed.iter().any(|n| n == name) {
                // Run, and said so: no equality claimed.
                return true;
            }
            let what = format!("{name} on {} worker(s) under {}", sc.workers, c.scale);
            assert_eq!(sc.rx_ring_full, 0, "{what}");
            assert_eq!((r.packets, r.packets_out, r.dropped), (one.packets, one.packets_out, one.dropped), "{what}");
            for (a, b) in one.nfs.iter().zip(&r.nfs) {
                assert_eq!(a.counters, b.counters, "{what}: counters of {}", a.name);
            }
            if exportable {
                let (a, b) = (canonical(one, name), canonical(&r, name));
                assert_eq!(a.len(), b.len(), "{what}: export rows");
                if let Some((x, y)) = a.iter().zip(&b).find(|(x, y)| x != y) {
                    panic!("{what}: export differs: 1 core {x}, here {y}");
                }
            }
            true
        }
    }
}

fn check_all(name: &str, chain: &str, t: &Traffic) -> Vec<(String, bool)> {
    let export = [name];
    let one = go(chain, t, &cfg(1, "rss", None, &export))
        .or_else(|_| go(chain, t, &cfg(1, "rss", None, &[])))
        .unwrap_or_else(|e| panic!("{name} on one core: {e}"));
    let mut out = Vec::new();
    for scale in ["rss", "shared", "rsspp"] {
        let ex: &[&str] = if one.exports.is_empty() { &[] } else { &export };
        let two = same_as_one(name, chain, t, &one, &cfg(2, scale, None, ex));
        out.push((format!("{scale}/2"), two));
        if scale != "shared" {
            let v8 = same_as_one(name, chain, t, &one, &cfg(2, scale, Some(8), ex));
            assert_eq!(v8, two, "{name} under {scale}: 8 virtual cores accepted as 2 real ones");
        } else {
            // A projection cannot see contention: refused.
            assert!(go(chain, t, &cfg(2, scale, Some(8), &[])).is_err());
        }
    }
    out
}

#[test]
fn every_nf_is_correct_on_every_strategy_that_accepts_it() {
    let gen = Traffic::Gen(GenConfig {
        flows: 300,
        packets: 9_000,
        seed: 5,
        proto: Proto::TcpBidir,
        dist: FlowDist::Zipf(1.1),
        ..GenConfig::default()
    });
    for d in NFS {
        let res = check_all(d.name, &chain_of(d.name), &gen);
        let accepted = |s: &str| res.iter().any(|(k, ok)| k == s && *ok);
        assert!(accepted("rss/2"), "{}: rss runs every NF", d.name);
        // Per-flow state moves to shared tables under `shared`; per-core NF-global state cannot
        // (amf's UE contexts: a UE's messages must stay on the core that holds its context).
        assert_eq!(
            accepted("shared/2"),
            !["fw", "nat", "conntrack", "amf"].contains(&d.name),
            "{}: shared refuses per-core state",
            d.name
        );
        assert_eq!(
            accepted("rsspp/2"),
            !["fw", "nat", "conntrack", "amf"].contains(&d.name),
            "{}: rsspp refuses per-core state",
            d.name
        );
    }
}

fn pcap(name: &str, frames: &[Vec<u8>]) -> PathBuf {
    let p = std::env::temp_dir().join(format!("fp-strat-{name}-{}.pcap", std::process::id()));
    let mut w = PcapWriter::create(&p, WriterOptions { nanosecond: true, ..Default::default() }).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write_packet(i as u64 * 1000, f, f.len() as u32).unwrap();
    }
    w.finish().unwrap();
    p
}

fn l4(sport: u16, dport: u16, tcp_flags: Option<u8>) -> Vec<u8> {
    match tcp_flags {
        Some(fl) => {
            let mut t = vec![0u8; 20];
            t[0..2].copy_from_slice(&sport.to_be_bytes());
            t[2..4].copy_from_slice(&dport.to_be_bytes());
            t[12] = 5 << 4;
            t[13] = fl;
            t[14..16].copy_from_slice(&1024u16.to_be_bytes());
            t
        }
        None => {
            let mut u = vec![0u8; 8 + 4];
            u[0..2].copy_from_slice(&sport.to_be_bytes());
            u[2..4].copy_from_slice(&dport.to_be_bytes());
            u[4..6].copy_from_slice(&12u16.to_be_bytes());
            u
        }
    }
}

#[test]
fn fw_passes_icmp_errors_about_known_flows_on_two_cores() {
    // 200 UDP flows from inside, a reply each, then an ICMP port unreachable
    // from a router about each flow's first packet.
    let mut frames = Vec::new();
    for i in 0..200u32 {
        let a = [10, 0, (i >> 8) as u8, i as u8];
        let b = [198, 51, 100, (i % 200) as u8];
        let out = ipv4_frame(a, b, 17, &l4(4000 + i as u16, 53, None));
        frames.push(out.clone());
        frames.push(ipv4_frame(b, a, 17, &l4(53, 4000 + i as u16, None)));
        let mut icmp = vec![3u8, 3, 0, 0, 0, 0, 0, 0];
        icmp.extend_from_slice(&out[14..14 + 28]);
        frames.push(ipv4_frame([192, 0, 2, 254], a, 1, &icmp));
    }
    let p = pcap("fw", &frames);
    let t = Traffic::File(p.clone());
    let res = check_all("fw", "fw", &t);
    let two = go("fw", &t, &cfg(2, "rss", None, &[])).unwrap();
    let _ = std::fs::remove_file(&p);
    assert!(res.iter().any(|(k, ok)| k == "rss/2" && *ok));
    let d = two.nfs[0].details.as_ref().unwrap();
    assert_eq!(d["drops"]["icmp_unrelated"], 0, "{d}");
    assert!(two.scale.unwrap().steering.iter().any(|n| n.contains("ICMP errors with their flow")));
}

#[test]
fn portknock_with_interleaved_knockers_matches_one_core() {
    // 300 sources knock 1111-2222-3333 interleaved with each other (some
    // wrongly), each from changing source ports, then try port 22.
    let mut frames = Vec::new();
    let syn = Some(0x02);
    for step in 0..5u16 {
        for s in 0..300u32 {
            let src = [10, 1, (s >> 8) as u8, s as u8];
            let dport = match (step, s % 5) {
                (0, _) => 1111,
                (1, 0) => 4444, // a wrong knock: back to the start
                (1, _) => 2222,
                (2, _) => 3333,
                _ => 22,
            };
            frames.push(ipv4_frame(src, [192, 0, 2, 1], 6, &l4(30000 + step * 7 + (s % 13) as u16, dport, syn)));
        }
    }
    let p = pcap("pk", &frames);
    let t = Traffic::File(p.clone());
    let chain = chain_of("portknock");
    let res = check_all("portknock", &chain, &t);
    let one = go(&chain, &t, &cfg(1, "rss", None, &[])).unwrap();
    let _ = std::fs::remove_file(&p);
    assert!(res.iter().any(|(k, ok)| k == "rss/2" && *ok), "{res:?}");
    // 60 sources knocked wrongly: both their port-22 packets are dropped.
    assert_eq!(one.dropped, 120, "{}", one.nfs[0].details.as_ref().unwrap());
}

#[test]
fn conflicting_affinities_are_refused_in_one_line() {
    let gen = Traffic::Gen(GenConfig { flows: 50, packets: 500, proto: Proto::TcpBidir, ..GenConfig::default() });
    let e = go("policer -> psd", &gen, &cfg(2, "rss", None, &[])).err().unwrap().to_string();
    assert!(e.contains("policer") && e.contains("psd") && !e.contains('\n'), "{e}");
    // One core: anything goes.
    assert!(go("policer -> psd", &gen, &cfg(1, "rss", None, &[])).is_ok());
    let _ = Path::new("/");
}

/// SCR's and FAJITA's shared-state baseline: under `shared` a flow's packets
/// are sprayed over the cores and per-flow state lives in shared tables, yet
/// the final counters and exports equal `rss`'s for the counting NFs.
#[test]
fn shared_equals_rss_for_counting_nfs() {
    let gen = Traffic::Gen(GenConfig {
        flows: 2_000,
        packets: 40_000,
        seed: 9,
        dist: FlowDist::Zipf(1.1),
        ..GenConfig::default()
    });
    let chain = "srcctr -> fsc -> hh(k=8) -> ddos(threshold=500)";
    let export = ["srcctr", "fsc", "hh"];
    let rss = go(chain, &gen, &cfg(2, "rss", None, &export)).unwrap();
    let shared = go(chain, &gen, &cfg(2, "shared", None, &export)).unwrap();
    assert_eq!(shared.scale.as_ref().unwrap().order_not_guaranteed, vec!["ddos".to_string()]);
    for nf in export {
        let (a, b) = (canonical(&rss, nf), canonical(&shared, nf));
        assert!(!a.is_empty(), "{nf} exports rows");
        assert_eq!(a, b, "{nf}: shared's export equals rss's");
    }
    for (a, b) in rss.nfs.iter().zip(&shared.nfs).take(3) {
        assert_eq!(a.counters, b.counters, "{}", a.name);
    }
    // Every packet went through every NF once, none lost to the spraying.
    assert_eq!((shared.packets, shared.packets_out + shared.dropped), (40_000, 40_000));
}
