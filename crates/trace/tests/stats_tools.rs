//! Trace statistics on files (JSON shape, non-IP counting) and the trace tools
//! (truncate, loadscale).

use std::path::PathBuf;

use flowplane_trace::gen::{write_pcap, FlowDist, GenConfig, Proto, SizeSpec};
use flowplane_trace::stats::trace_stats;
use flowplane_trace::tools::{loadscale, truncate};
use flowplane_trace::{PcapWriter, TraceReader, WriterOptions};
use flowplane_wire::checksum;
use flowplane_wire::flow::extract_five_tuple as five_tuple;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flowplane-h4-stats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn read_all(path: &std::path::Path) -> Vec<(u64, u32, Vec<u8>)> {
    let mut r = TraceReader::open(path).expect("open");
    let mut v = Vec::new();
    while let Some(p) = r.next_packet().expect("read") {
        v.push((p.ts_ns, p.orig_len, p.data.to_vec()));
    }
    v
}

#[test]
fn stats_json_has_the_documented_keys() {
    let p = tmp("keys.pcap");
    write_pcap(GenConfig { flows: 100, packets: 5000, dist: FlowDist::Zipf(1.0), ..Default::default() }, &p)
        .expect("write");
    let s = trace_stats(&p, 3).expect("stats");
    let v: serde_json::Value = serde_json::to_value(&s).expect("json");
    for key in [
        "packets",
        "bytes",
        "captured_bytes",
        "frame_size",
        "duration_ns",
        "pps",
        "flows",
        "ip_packets",
        "non_ip_packets",
        "malformed_packets",
        "unreadable_packets",
        "packets_per_flow",
        "top_flows",
        "locality",
        "zipf",
    ] {
        assert!(v.get(key).is_some(), "missing key {key}");
    }
    assert_eq!(v["packets"], 5000);
    assert_eq!(v["top_flows"].as_array().map(Vec::len), Some(3));
    for key in ["reuse_distance_median", "reuse_distance_p90", "reuses", "same_flow_as_previous"] {
        assert!(v["locality"].get(key).is_some(), "missing locality.{key}");
    }
    for key in ["p50", "p90", "p99", "p999", "max", "mean"] {
        assert!(v["packets_per_flow"].get(key).is_some(), "missing packets_per_flow.{key}");
    }
    assert!(v["zipf"]["exponent"].as_f64().is_some());
    assert_eq!(s.duration_ns, 4999 * 100, "10 Mpps spacing");
}

#[test]
fn non_ip_frames_are_counted_apart() {
    let p = tmp("nonip.pcap");
    let mut w = PcapWriter::create(&p, WriterOptions::default()).expect("create");
    let mut arp = vec![0u8; 60];
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    w.write_packet(1_000, &arp, 60).expect("write");
    w.write_packet(2_000, &[1, 2, 3], 3).expect("write");
    w.finish().expect("finish");
    let s = trace_stats(&p, 5).expect("stats");
    assert_eq!((s.packets, s.non_ip_packets, s.malformed_packets, s.flows), (2, 1, 1, 0));
    assert!(s.zipf.is_none() && s.top_flows.is_empty());
    assert!(trace_stats(&tmp("does-not-exist.pcap"), 1).is_err());
}

fn l4_checksum_ok(f: &[u8]) -> bool {
    let tl = u16::from_be_bytes([f[16], f[17]]) as usize;
    let s = [f[26], f[27], f[28], f[29]];
    let d = [f[30], f[31], f[32], f[33]];
    let pseudo = checksum::pseudo_header_v4(s, d, f[23], (tl - 20) as u16);
    checksum::combine(pseudo, checksum::sum(&f[34..14 + tl])) == 0xffff
}

#[test]
fn truncate_rewrites_lengths_or_keeps_wire_length() {
    let (src, cut, snap) = (tmp("big.pcap"), tmp("cut.pcap"), tmp("snap.pcap"));
    for proto in [Proto::Udp, Proto::Tcp] {
        let cfg = GenConfig { flows: 50, packets: 500, size: SizeSpec::Range(64, 1500), proto, ..Default::default() };
        write_pcap(cfg, &src).expect("write");
        let n = truncate(&src, &cut, 64, false).expect("truncate");
        assert_eq!((n.packets, n.skipped), (500, 0));
        let orig = read_all(&src);
        let out = read_all(&cut);
        for ((ts0, _, d0), (ts, orig_len, d)) in orig.iter().zip(&out) {
            assert_eq!(ts0, ts);
            assert_eq!(d.len(), d0.len().min(64));
            assert_eq!(*orig_len as usize, d.len());
            assert_eq!(checksum::sum(&d[14..34]), 0xffff, "IPv4 header checksum");
            let tl = u16::from_be_bytes([d[16], d[17]]) as usize;
            assert!(14 + tl <= d.len());
            assert!(l4_checksum_ok(d), "transport checksum recomputed");
            assert_eq!(five_tuple(d), five_tuple(d0));
        }
        truncate(&src, &snap, 64, true).expect("snap");
        for ((_, o0, _), (_, o, d)) in orig.iter().zip(read_all(&snap)) {
            assert_eq!(*o0, o);
            assert!(d.len() <= 64);
        }
        // Header-only captures still describe their flows.
        let (a, b) = (trace_stats(&src, 0).expect("src"), trace_stats(&snap, 0).expect("snap"));
        assert_eq!((b.flows, b.bytes), (a.flows, a.bytes), "{b:?}");
    }
    assert!(truncate(&src, &cut, 0, false).is_err());
}

#[test]
fn loadscale_multiplies_the_rate_and_keeps_packets() {
    let (src, out) = (tmp("ls-in.pcap"), tmp("ls-out.pcap"));
    let cfg =
        GenConfig { flows: 100, packets: 10_000, order: flowplane_trace::gen::Order::Burst(4), ..Default::default() };
    write_pcap(cfg, &src).expect("write");
    let n = loadscale(&src, &out, 4).expect("loadscale");
    assert_eq!(n.packets, 10_000);
    let a = trace_stats(&src, 0).expect("in");
    let b = trace_stats(&out, 0).expect("out");
    assert_eq!((a.packets, a.bytes, a.flows), (b.packets, b.bytes, b.flows));
    let (ra, rb) = (a.pps.expect("rate"), b.pps.expect("rate"));
    assert!((rb / ra - 4.0).abs() < 0.05, "rate x4: {ra} -> {rb}");
    let v = read_all(&out);
    assert!(v.windows(2).all(|w| w[0].0 <= w[1].0), "merged by timestamp");
    // The same multiset of frames.
    let mut x: Vec<Vec<u8>> = read_all(&src).into_iter().map(|p| p.2).collect();
    let mut y: Vec<Vec<u8>> = v.into_iter().map(|p| p.2).collect();
    x.sort();
    y.sort();
    assert_eq!(x, y);
    // Factor 1 is the identity.
    loadscale(&src, &out, 1).expect("k=1");
    assert_eq!(read_all(&src), read_all(&out));
    assert!(loadscale(&src, &out, 0).is_err());
}
