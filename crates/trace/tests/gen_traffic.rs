//! Generator behaviour: determinism, flow counts, distributions, order,
//! insertion rate, and per-protocol validity (TCP scripts, GTP-U).

use std::collections::HashMap;
use std::path::PathBuf;

use flowplane_trace::gen::{
    knock_transition, write_pcap, FlowDist, GenConfig, Generator, KnockState, Order, Pattern, Proto, SizeSpec,
    KNOCK_PORTS,
};
use flowplane_trace::stats::{StatsCollector, TraceStats};
use flowplane_wire::flow::extract_five_tuple as five_tuple;
use std::net::IpAddr;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flowplane-h4-gen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn stats_of(cfg: GenConfig) -> TraceStats {
    let mut g = Generator::new(cfg).expect("valid config");
    let mut c = StatsCollector::new();
    let mut buf = Vec::new();
    while let Some(ts) = g.next_frame(&mut buf) {
        c.add(ts, buf.len() as u32, &buf);
    }
    c.finish(5)
}

fn frames(cfg: GenConfig) -> Vec<Vec<u8>> {
    let mut g = Generator::new(cfg).expect("valid config");
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while g.next_frame(&mut buf).is_some() {
        out.push(buf.clone());
    }
    out
}

#[test]
fn same_seed_same_bytes_other_seed_differs() {
    let cfg =
        GenConfig { flows: 500, packets: 20_000, dist: FlowDist::Zipf(1.0), proto: Proto::Tcp, ..Default::default() };
    let (a, b, c) = (tmp("a.pcap"), tmp("b.pcap"), tmp("c.pcap"));
    let sa = write_pcap(cfg.clone(), &a).expect("write a");
    write_pcap(cfg.clone(), &b).expect("write b");
    write_pcap(GenConfig { seed: 2, ..cfg }, &c).expect("write c");
    assert_eq!(sa.packets, 20_000);
    let (fa, fb, fc) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), std::fs::read(&c).unwrap());
    assert_eq!(fa, fb, "same seed must give a byte-identical file");
    assert_ne!(fa, fc, "another seed must give another trace");
    let st = flowplane_trace::stats::trace_stats(&a, 3).expect("stats of written file");
    assert_eq!(st.packets, 20_000);
}

#[test]
fn uniform_has_exactly_the_requested_flows() {
    let s = stats_of(GenConfig { flows: 10_000, packets: 50_000, ..Default::default() });
    assert_eq!(s.flows, 10_000);
    let p = s.packets_per_flow.expect("flows");
    assert_eq!((p.p50, p.max), (5, 5));
    // IPv6 keeps the flows distinct too.
    let s6 = stats_of(GenConfig { flows: 10_000, packets: 50_000, ipv6: true, ..Default::default() });
    assert_eq!(s6.flows, 10_000);
    assert_eq!(s6.frame_size.expect("sizes").min, 64, "64-byte IPv6/UDP frames fit");
}

#[test]
fn zipf_exponent_is_recovered() {
    for a in [1.1, 0.8] {
        let s =
            stats_of(GenConfig { flows: 200_000, packets: 2_000_000, dist: FlowDist::Zipf(a), ..Default::default() });
        let z = s.zipf.expect("fit");
        assert!((z.exponent - a).abs() < 0.05, "requested {a}, measured {z:?}");
    }
}

fn packets_per_flow(cfg: GenConfig) -> Vec<u64> {
    let mut per: HashMap<_, u64> = HashMap::new();
    for f in frames(cfg) {
        *per.entry(five_tuple(&f).expect("ip")).or_default() += 1;
    }
    let mut v: Vec<u64> = per.into_values().collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v
}

#[test]
fn elephants_only_and_cdf() {
    let base = GenConfig { flows: 1000, packets: 100_000, ..Default::default() };
    let only = packets_per_flow(GenConfig { dist: FlowDist::Elephants { k: 8, share: 1.0 }, ..base.clone() });
    assert_eq!(only.len(), 8, "elephants:8:1 -> only 8 flows carry traffic");
    let most = packets_per_flow(GenConfig { dist: FlowDist::Elephants { k: 10, share: 0.9 }, ..base.clone() });
    let top10: u64 = most.iter().take(10).sum();
    assert!(most.len() > 900);
    assert!((89_000..91_000).contains(&top10), "10 elephants carry 90%: {top10}");
    // Two flow sizes, 1 and 100, equally likely: about half the flows carry ~99% of the packets.
    let cdf = flowplane_trace::gen::parse_cdf("1 0.5\n100 1.0\n").expect("cdf");
    let v = packets_per_flow(GenConfig { dist: cdf, ..base });
    let big: Vec<u64> = v.iter().copied().filter(|&c| c >= 100).collect();
    assert!((420..580).contains(&big.len()), "{}", big.len());
    assert!(big.iter().sum::<u64>() > 97_000);
}

#[test]
fn burst_order_has_more_locality_than_random() {
    let base = GenConfig { flows: 5000, packets: 100_000, dist: FlowDist::Zipf(0.9), ..Default::default() };
    let random = stats_of(base.clone()).locality;
    let burst = stats_of(GenConfig { order: Order::Burst(16), ..base }).locality;
    assert_eq!(burst.reuse_distance_median, Some(1));
    assert!(burst.same_flow_as_previous > 0.9, "{burst:?}");
    assert!(random.reuse_distance_median.expect("reuses") > 50, "{random:?}");
    assert!(random.same_flow_as_previous < 0.05, "{random:?}");
    // Uniform random order over F flows: median reuse distance about F ln 2.
    let u = stats_of(GenConfig { flows: 1000, packets: 100_000, ..Default::default() }).locality;
    let m = u.reuse_distance_median.expect("reuses") as f64;
    assert!((500.0..1400.0).contains(&m), "{m}");
}

#[test]
fn new_flow_every_r_gives_r_packets_per_flow() {
    for r in [10u64, 100, 1000] {
        let s = stats_of(GenConfig { flows: 64, packets: 100_000, new_flow_every: Some(r), ..Default::default() });
        assert_eq!(s.flows, 100_000 / r, "R = {r}");
        assert_eq!(s.packets / s.flows, r);
    }
    // Every R-th packet is the first of its flow.
    let fr = frames(GenConfig { flows: 8, packets: 1000, new_flow_every: Some(10), ..Default::default() });
    let mut seen = std::collections::HashSet::new();
    for (i, f) in fr.iter().enumerate() {
        let new = seen.insert(five_tuple(f).expect("ip"));
        assert_eq!(new, i % 10 == 0, "packet {i}");
    }
}

fn tcp_fields(f: &[u8]) -> (u32, u32, u8, usize) {
    let l4 = 14 + 20;
    let seq = u32::from_be_bytes(f[l4 + 4..l4 + 8].try_into().unwrap());
    let ack = u32::from_be_bytes(f[l4 + 8..l4 + 12].try_into().unwrap());
    let total = u16::from_be_bytes([f[16], f[17]]) as usize;
    (seq, ack, f[l4 + 13], total - 40)
}

const SYN: u8 = 0x02;
const FIN: u8 = 0x01;
const ACK: u8 = 0x10;

#[test]
fn tcp_flows_open_with_syn_and_close_with_fin() {
    let fr = frames(GenConfig {
        flows: 300,
        packets: 20_000,
        proto: Proto::Tcp,
        dist: FlowDist::Zipf(1.0),
        size: SizeSpec::Range(64, 1500),
        ..Default::default()
    });
    let mut per: HashMap<_, Vec<(u32, u32, u8, usize)>> = HashMap::new();
    for f in &fr {
        per.entry(five_tuple(f).expect("ip")).or_default().push(tcp_fields(f));
    }
    for (k, pkts) in per {
        assert_eq!(pkts[0].2, SYN, "{k:?} opens with SYN");
        let mut next = pkts[0].0.wrapping_add(1);
        for (i, &(seq, _, flags, len)) in pkts.iter().enumerate().skip(1) {
            assert_eq!(seq, next, "contiguous sequence numbers");
            let last = i == pkts.len() - 1;
            assert_eq!(flags & FIN != 0, last, "FIN on the last packet only");
            assert_eq!(flags & SYN, 0);
            next = next.wrapping_add(len as u32 + u32::from(last));
        }
    }
}

#[test]
fn tcp_bidir_is_a_consistent_conversation() {
    let fr = frames(GenConfig {
        flows: 200,
        packets: 20_000,
        proto: Proto::TcpBidir,
        size: SizeSpec::Range(64, 600),
        ..Default::default()
    });
    // Connection key: the unordered pair of endpoints; the SYN sender is the client.
    type End = (IpAddr, u16);
    struct Conn {
        client: End,
        next: [u32; 2],
        script: Vec<(bool, u8)>,
    }
    let mut conns: HashMap<(End, End), Conn> = HashMap::new();
    for f in &fr {
        let k = five_tuple(f).expect("ip");
        let (a, b) = ((k.src_ip(), k.src_port()), (k.dst_ip(), k.dst_port()));
        let key = if a < b { (a, b) } else { (b, a) };
        let (seq, ack, flags, len) = tcp_fields(f);
        let c = conns.entry(key).or_insert_with(|| {
            assert_eq!(flags, SYN, "a connection starts with SYN");
            Conn { client: a, next: [seq, 0], script: Vec::new() }
        });
        let from_client = a == c.client;
        let (me, peer) = if from_client { (0, 1) } else { (1, 0) };
        if flags == SYN | ACK {
            c.next[1] = seq;
        }
        assert_eq!(seq, c.next[me], "sequence number continues");
        if flags & ACK != 0 {
            assert_eq!(ack, c.next[peer], "ACK acknowledges all the peer sent");
        }
        c.next[me] = c.next[me].wrapping_add(len as u32 + u32::from(flags & (SYN | FIN) != 0));
        c.script.push((from_client, flags));
    }
    assert_eq!(conns.len(), 200);
    for c in conns.values() {
        let n = c.script.len();
        assert_eq!(n, 100, "uniform: 20000 / 200 packets");
        assert_eq!(&c.script[..3], &[(true, SYN), (false, SYN | ACK), (true, ACK)]);
        assert_eq!(&c.script[n - 3..], &[(true, FIN | ACK), (false, FIN | ACK), (true, ACK)]);
        assert!(c.script[3..n - 3].iter().any(|s| !s.0), "server sends data too");
    }
}

#[test]
fn gtpu_frames_parse_with_the_wire_crate() {
    use flowplane_wire::gtpu::GtpuPacket;
    let fr = frames(GenConfig { flows: 400, packets: 4000, proto: Proto::Gtpu, ..Default::default() });
    let mut teid_of_ue: HashMap<[u8; 4], u32> = HashMap::new();
    for f in &fr {
        assert_eq!(u16::from_be_bytes([f[36], f[37]]), 2152);
        let g = GtpuPacket::new_checked(&f[42..]).expect("valid GTP-U");
        let layout = g.layout().expect("layout");
        assert_eq!(g.msg_type(), 0xff);
        let qfi = layout.pdu_session.expect("PDU session container").qfi;
        assert!((1..=9).contains(&qfi));
        let inner = &f[42 + layout.header_len..];
        assert_eq!(inner[0], 0x45);
        assert_eq!(inner[9], 17);
        let ue = [inner[12], inner[13], inner[14], inner[15]];
        let teid = *teid_of_ue.entry(ue).or_insert(g.teid());
        assert_eq!(teid, g.teid(), "one TEID per UE");
    }
    assert_eq!(teid_of_ue.len(), 100, "four flows per UE");
}

#[test]
fn portscan_and_portknock_patterns() {
    let fr = frames(GenConfig { flows: 100, packets: 10_000, pattern: Pattern::PortScan(4), ..Default::default() });
    let syns = fr.iter().filter(|f| five_tuple(f).map(|k| k.proto()) == Ok(6)).count();
    assert!((800..1200).contains(&syns), "~10% scan probes: {syns}");
    let mut g = Generator::new(GenConfig {
        flows: 100,
        packets: 20_000,
        pattern: Pattern::PortKnock,
        pattern_share: 0.5,
        ..Default::default()
    })
    .expect("config");
    let mut buf = Vec::new();
    let mut state: HashMap<IpAddr, KnockState> = HashMap::new();
    while g.next_frame(&mut buf).is_some() {
        let k = five_tuple(&buf).expect("ip");
        if k.proto() == 6 {
            let s = state.entry(k.src_ip()).or_insert(KnockState::Closed1);
            *s = knock_transition(*s, k.dst_port(), KNOCK_PORTS);
        }
    }
    let sessions = g.knock_sessions();
    assert!(sessions.len() > 100);
    let (mut open, mut closed) = (0, 0);
    for s in sessions {
        let key = IpAddr::from(s.src);
        // Sessions still running at the end are partial; completed ones match the oracle.
        if let Some(&st) = state.get(&key) {
            if st == KnockState::Open {
                assert!(s.opens);
                open += 1;
            } else if !s.opens {
                closed += 1;
            }
        }
    }
    assert!(open > 20 && closed > 20, "both correct and incorrect knockers: {open} / {closed}");
}

#[test]
fn timestamps_follow_the_rate() {
    let mut g = Generator::new(GenConfig { packets: 3, rate_pps: 1e6, ..Default::default() }).expect("config");
    let mut buf = Vec::new();
    let ts: Vec<u64> = std::iter::from_fn(|| g.next_frame(&mut buf)).collect();
    assert_eq!(ts.len(), 3);
    assert_eq!((ts[1] - ts[0], ts[2] - ts[1]), (1000, 1000));
    assert_eq!(g.remaining(), 0);
}
