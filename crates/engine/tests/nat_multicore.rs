//! Two-way `nat` on 1 and 2 cores under `rss`: each core allocates from its
//! own share of the port range and the NIC's flow-director rules steer a
//! reply (by destination port) to the core that allocated it. 500 TCP
//! connections: every connection gets its own external (address, port),
//! every reply is translated back to its inside endpoint, the 2-core run
//! translates exactly the connections the 1-core run does, and every
//! packet's checksums are valid (our checker, and tshark when installed).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use flowplane_engine::exec::ExecConfig;
use flowplane_engine::runner::{run_input, Input, Output};
use flowplane_engine::spec::parse;
use flowplane_engine::{Report, RunConfig};
use flowplane_nf::testutil::{assert_ipv4_checksums, ipv4_frame};
use flowplane_trace::{PcapWriter, TraceReader, WriterOptions};

const CONNS: u32 = 500;
const EXT: [u8; 4] = [203, 0, 113, 1];
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;

fn tcp(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, flags: u8, seq: u32, ack: u32) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&ack.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    ipv4_frame(src, dst, 6, &t)
}

fn inside(i: u32) -> ([u8; 4], u16) {
    ([10, 0, (i >> 8) as u8, i as u8], 40000 + (i % 1000) as u16)
}

fn remote(i: u32) -> [u8; 4] {
    [198, 51, 100, (i % 50) as u8]
}

struct Temp(PathBuf);

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn temp(name: &str) -> Temp {
    Temp(std::env::temp_dir().join(format!("fp-natmc-{name}-{}.pcap", std::process::id())))
}

fn write(path: &Path, frames: &[Vec<u8>]) {
    let mut w = PcapWriter::create(path, WriterOptions { nanosecond: true, ..Default::default() }).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write_packet(1_700_000_000_000_000_000 + i as u64 * 1000, f, f.len() as u32).unwrap();
    }
    w.finish().unwrap();
}

/// Runs `nat` over `input` on `cores`, returning the report and the transmitted frames.
fn run_nat(input: &Path, cores: usize) -> (Report, Vec<Vec<u8>>) {
    let out = temp(&format!("out{cores}"));
    let w = Arc::new(Mutex::new(
        PcapWriter::create(&out.0, WriterOptions { nanosecond: true, ..Default::default() }).unwrap(),
    ));
    let cfg = RunConfig {
        cores,
        pin: false,
        // One secret for both runs: the RSS key follows it (issue 33), and the two runs must steer alike.
        exec: ExecConfig { flows: 1 << 14, hugepages: false, hash_seed: 0x5eed_0001, ..ExecConfig::default() },
        ..RunConfig::default()
    };
    let r = run_input(&cfg, &parse("nat").unwrap(), Input::File(input), false, Output::Pcap(w.clone())).unwrap().report;
    Arc::try_unwrap(w).ok().unwrap().into_inner().unwrap().finish().unwrap();
    let mut rd = TraceReader::open(&out.0).unwrap();
    let mut buf = Vec::new();
    let mut frames = Vec::new();
    while let Some(p) = rd.next_frame(&mut buf).unwrap() {
        frames.push(p.data.to_vec());
    }
    verify_tshark(&out.0, frames.len());
    (r, frames)
}

fn verify_tshark(path: &Path, packets: usize) {
    let file = path.to_str().unwrap();
    let o = match Command::new("tshark")
        .args(["-r", file, "-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE"])
        .args(["-T", "fields", "-e", "ip.checksum.status", "-e", "tcp.checksum.status"])
        .output()
    {
        Ok(o) => o,
        Err(_) if std::env::var("FLOWPLANE_SKIP_TSHARK").as_deref() == Ok("1") => return,
        Err(e) => panic!("tshark (set FLOWPLANE_SKIP_TSHARK=1 to skip): {e}"),
    };
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(text.lines().count(), packets);
    for l in text.lines() {
        assert!(l.split(['\t', ',']).filter(|s| !s.is_empty()).all(|s| s == "1"), "bad checksum status {l:?}");
    }
}

fn be16(f: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([f[o], f[o + 1]])
}

fn be32(f: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([f[o], f[o + 1], f[o + 2], f[o + 3]])
}

/// Connection id -> external port, from translated SYNs (seq = id).
fn ports(frames: &[Vec<u8>]) -> HashMap<u32, u16> {
    let mut m = HashMap::new();
    for f in frames {
        assert_ipv4_checksums(f);
        if f[26..30] == EXT && f[47] == SYN {
            assert!(m.insert(be32(f, 38), be16(f, 34)).is_none(), "one SYN per connection");
        }
    }
    m
}

fn two_way(cores: usize) -> (Report, HashMap<u32, u16>) {
    let syns: Vec<Vec<u8>> = (0..CONNS)
        .map(|i| {
            let (a, p) = inside(i);
            tcp(a, p, remote(i), 80, SYN, i, 0)
        })
        .collect();
    // Phase 1: where does each connection go out? (Each core allocates in
    // its stream order, so the same outbound packets get the same ports again.)
    let t1 = temp(&format!("syn{cores}"));
    write(&t1.0, &syns);
    let (_, out1) = run_nat(&t1.0, cores);
    let ext = ports(&out1);
    assert_eq!(ext.len(), CONNS as usize, "{cores} core(s): every connection translated");
    let distinct: HashSet<u16> = ext.values().copied().collect();
    assert_eq!(distinct.len(), CONNS as usize, "{cores} core(s): no external port held by two connections");
    // Phase 2: the connections, then a SYN-ACK to each external port, then the inside ACK.
    let mut frames = syns.clone();
    for i in 0..CONNS {
        frames.push(tcp(remote(i), 80, EXT, ext[&i], SYN | ACK, 1_000_000 + i, i + 1));
    }
    for i in 0..CONNS {
        let (a, p) = inside(i);
        frames.push(tcp(a, p, remote(i), 80, ACK, i + 1, 1_000_001 + i));
    }
    let t2 = temp(&format!("two{cores}"));
    write(&t2.0, &frames);
    let (r, out2) = run_nat(&t2.0, cores);
    assert_eq!(ports(&out2), ext, "{cores} core(s): same allocation in the second run");
    // Every reply reached the core that owns its port and went back inside, to its own endpoint.
    let mut back = 0;
    for f in &out2 {
        if f[47] == SYN | ACK {
            let i = be32(f, 38) - 1_000_000;
            let (a, p) = inside(i);
            assert_eq!((&f[30..34], be16(f, 36)), (&a[..], p), "reply of connection {i}");
            back += 1;
        }
    }
    assert_eq!(back, CONNS, "{cores} core(s): every reply translated back");
    assert_eq!(r.dropped, 0, "{cores} core(s): {}", r.nfs[0].details.as_ref().unwrap());
    assert_eq!(r.packets_out, u64::from(3 * CONNS));
    (r, ext)
}

#[test]
fn two_way_nat_on_two_cores_equals_one() {
    let (_, one) = two_way(1);
    let (two, ports2) = two_way(2);
    assert_eq!(one.len(), ports2.len());
    let sc = two.scale.unwrap();
    assert!(sc.steering.iter().any(|n| n.contains("nat: ports 1024-65535 split over 2 cores")), "{:?}", sc.steering);
    // Both cores allocated, each from its own half.
    // Core 0 has ports 1024..=33279, core 1 the rest.
    let mid = 33280;
    assert!(ports2.values().any(|&p| p < mid) && ports2.values().any(|&p| p >= mid));
}
