//! The `nat` NF's rewritten packets, checked by an independent decoder:
//! TCP and UDP conversations go through the NF in both directions, the
//! outside view (translated outbound + raw inbound) and the inside view (raw
//! outbound + translated inbound) are written to pcap files, and tshark must
//! find every IPv4/TCP/UDP checksum good and raise no expert warning.
//!
//! Needs `tshark` on the PATH; set `FLOWPLANE_SKIP_TSHARK=1` to skip when it
//! is not installed.

use std::path::Path;

use flowplane_nf::nat::{Nat, NatConfig};
use flowplane_nf::testutil::{assert_ipv4_checksums, ipv4_frame, udp4, Harness};
use flowplane_nf::Action;
use flowplane_wire::tcp::TcpFlags;

mod common;
use common::{tshark, write_pcap, TempFile};

const EXT: [u8; 4] = [203, 0, 113, 1];
const ACK: u8 = TcpFlags::ACK.bits();
const FIN: u8 = TcpFlags::FIN.bits();
const PSH: u8 = TcpFlags::PSH.bits();
const SYN: u8 = TcpFlags::SYN.bits();

/// One end of a connection: address and port.
#[derive(Clone, Copy)]
struct End([u8; 4], u16);

fn tcp(from: End, to: End, flags: u8, seq: u32, ack: u32, payload: &[u8]) -> Vec<u8> {
    let (End(src, sport), End(dst, dport)) = (from, to);
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&ack.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    t.extend_from_slice(payload);
    ipv4_frame(src, dst, 6, &t)
}

fn udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0u8; 8];
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    u.extend_from_slice(payload);
    ipv4_frame(src, dst, 17, &u)
}

fn src_port(f: &[u8]) -> u16 {
    u16::from_be_bytes([f[34], f[35]])
}

/// Both capture points of the NAT.
#[derive(Default)]
struct Views {
    outside: Vec<Vec<u8>>,
    inside: Vec<Vec<u8>>,
}

impl Views {
    fn outbound(&mut self, h: &mut Harness<Nat>, f: Vec<u8>) -> Vec<u8> {
        let (out, act) = h.run(&f);
        assert_eq!(act, Action::Pass);
        assert_eq!(&out[26..30], &EXT, "source translated");
        assert_ipv4_checksums(&out);
        self.inside.push(f);
        self.outside.push(out.clone());
        out
    }

    fn inbound(&mut self, h: &mut Harness<Nat>, f: Vec<u8>, inside: [u8; 4]) {
        let (out, act) = h.run(&f);
        assert_eq!(act, Action::Pass);
        assert_eq!(&out[30..34], &inside, "destination translated back");
        assert_ipv4_checksums(&out);
        self.outside.push(f);
        self.inside.push(out);
    }
}

/// One TCP connection through the NAT: handshake, data both ways, FIN close.
fn tcp_conversation(h: &mut Harness<Nat>, v: &mut Views, client: End, server: End, data: &[u8]) {
    let (cs, ss) = (1000u32, 777_000u32);
    let c = client.0;
    let out = v.outbound(h, tcp(client, server, SYN, cs, 0, &[]));
    let ext = End(EXT, src_port(&out));
    v.inbound(h, tcp(server, ext, SYN | ACK, ss, cs + 1, &[]), c);
    v.outbound(h, tcp(client, server, ACK, cs + 1, ss + 1, &[]));
    v.outbound(h, tcp(client, server, PSH | ACK, cs + 1, ss + 1, data));
    let cs2 = cs + 1 + data.len() as u32;
    v.inbound(h, tcp(server, ext, ACK, ss + 1, cs2, &[]), c);
    let reply: Vec<u8> = data.iter().rev().copied().collect();
    v.inbound(h, tcp(server, ext, PSH | ACK, ss + 1, cs2, &reply), c);
    let ss2 = ss + 1 + reply.len() as u32;
    v.outbound(h, tcp(client, server, ACK, cs2, ss2, &[]));
    v.outbound(h, tcp(client, server, FIN | ACK, cs2, ss2, &[]));
    v.inbound(h, tcp(server, ext, FIN | ACK, ss2, cs2 + 1, &[]), c);
    v.outbound(h, tcp(client, server, ACK, cs2 + 1, ss2 + 1, &[]));
}

const CHECKS: [&str; 6] =
    ["-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE"];

/// Every checksum tshark verified is good (status 1 = PROTO_CHECKSUM_E_GOOD; empty = no such header)
/// and nothing is flagged at warning severity or above. Returns false if tshark was skipped.
fn verify(path: &Path, packets: usize) -> bool {
    let file = path.to_str().expect("utf-8 temp path");
    let mut args = vec!["-r", file];
    args.extend_from_slice(&CHECKS);
    args.extend_from_slice(&[
        "-T",
        "fields",
        "-e",
        "ip.checksum.status",
        "-e",
        "tcp.checksum.status",
        "-e",
        "udp.checksum.status",
    ]);
    let Some(fields) = tshark(&args) else { return false };
    let lines: Vec<&str> = fields.lines().collect();
    assert_eq!(lines.len(), packets, "one line per packet:\n{fields}");
    for (i, line) in lines.iter().enumerate() {
        let statuses: Vec<&str> = line.split(['\t', ',']).filter(|s| !s.is_empty()).collect();
        assert!(statuses.len() >= 2, "packet {}: IP and L4 checksums both checked: {line:?}", i + 1);
        assert!(statuses.iter().all(|s| *s == "1"), "packet {}: checksum status not good: {line:?}", i + 1);
    }
    let mut args = vec!["-r", file];
    args.extend_from_slice(&CHECKS);
    args.extend_from_slice(&["-Y", "_ws.expert.severity >= warning"]);
    let warnings = tshark(&args).unwrap_or_default();
    assert!(warnings.trim().is_empty(), "tshark expert warnings in {file}:\n{warnings}");
    true
}

#[test]
fn nat_output_checksums_verified_by_tshark() {
    let nat = Nat::new(NatConfig { addrs: 1, port_lo: 20000, port_hi: 29999, ..NatConfig::default() }).unwrap();
    let mut h = Harness::new(nat);
    let mut v = Views::default();
    let remote = [198, 51, 100, 7];
    tcp_conversation(&mut h, &mut v, End([10, 1, 2, 3], 40000), End(remote, 5001), b"hello, translated world");
    tcp_conversation(&mut h, &mut v, End([10, 200, 0, 9], 51515), End([192, 0, 2, 77], 7001), b"odd-length!");
    // UDP request/response pairs from many inside hosts, odd and even payload lengths.
    for i in 0..16u8 {
        let c = [10, 0, i, 10 + i];
        let payload: Vec<u8> = (0..(5 + i as usize * 3)).map(|k| (k as u8).wrapping_mul(37).wrapping_add(i)).collect();
        let out = v.outbound(&mut h, udp(c, remote, 30000 + i as u16, 6000 + i as u16, &payload));
        let e = src_port(&out);
        v.inbound(&mut h, udp(remote, EXT, 6000 + i as u16, e, &payload[..payload.len() / 2]), c);
    }
    // The testutil builder's 64-byte frames too.
    let out = v.outbound(&mut h, udp4([10, 9, 9, 9], remote, 12345, 23456));
    v.inbound(&mut h, udp4(remote, EXT, 23456, src_port(&out)), [10, 9, 9, 9]);

    let dir = std::env::temp_dir();
    let pid = std::process::id();
    let outside = TempFile(dir.join(format!("flowplane-nat-{pid}-outside.pcap")));
    let inside = TempFile(dir.join(format!("flowplane-nat-{pid}-inside.pcap")));
    write_pcap(&outside.0, &v.outside);
    write_pcap(&inside.0, &v.inside);
    if verify(&outside.0, v.outside.len()) {
        assert!(verify(&inside.0, v.inside.len()));
    }
    assert_eq!(v.outside.len(), 20 + 34);
}
