//! Byte templates for the generated frames: Ethernet, IPv4/IPv6, UDP, TCP and
//! GTP-U (with a PDU session container), with correct lengths and checksums.
//!
//! The generator writes every frame into a reused buffer; these helpers only
//! fill header bytes at fixed offsets, so building a frame costs a memset, a
//! few stores and two short checksums.

use flowplane_wire::checksum;

pub(crate) const ETH_LEN: usize = 14;
pub(crate) const IPV4_LEN: usize = 20;
pub(crate) const IPV6_LEN: usize = 40;
pub(crate) const UDP_LEN: usize = 8;
pub(crate) const TCP_LEN: usize = 20;
/// GTP-U header (8) + optional fields (4) + PDU session container (4).
pub(crate) const GTPU_LEN: usize = 16;
/// Frames shorter than this are padded with a zero trailer, as Ethernet requires.
pub(crate) const MIN_FRAME: usize = 60;
/// Largest frame the generator writes (jumbo).
pub(crate) const MAX_FRAME: usize = 9216;
/// UDP port of GTP-U (3GPP TS 29.281).
pub(crate) const GTPU_PORT: u16 = 2152;

pub(crate) const TCP_FIN: u8 = 0x01;
pub(crate) const TCP_SYN: u8 = 0x02;
pub(crate) const TCP_PSH: u8 = 0x08;
pub(crate) const TCP_ACK: u8 = 0x10;

const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
/// Locally administered MACs: the generator models one link.
const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// Network-layer addresses of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Addrs {
    V4 { src: [u8; 4], dst: [u8; 4] },
    V6 { src: [u8; 16], dst: [u8; 16] },
}

impl Addrs {
    pub(crate) fn swapped(self) -> Addrs {
        match self {
            Addrs::V4 { src, dst } => Addrs::V4 { src: dst, dst: src },
            Addrs::V6 { src, dst } => Addrs::V6 { src: dst, dst: src },
        }
    }

    fn ip_len(&self) -> usize {
        match self {
            Addrs::V4 { .. } => IPV4_LEN,
            Addrs::V6 { .. } => IPV6_LEN,
        }
    }
}

/// TCP header fields that vary per packet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TcpFields {
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
}

/// Header bytes before the L4 payload.
pub(crate) fn header_len(addrs: &Addrs, tcp: bool) -> usize {
    ETH_LEN + addrs.ip_len() + if tcp { TCP_LEN } else { UDP_LEN }
}

/// Header bytes before the inner UDP payload of a GTP-U frame (IPv4 outer and inner).
pub(crate) const GTPU_HEADERS: usize = ETH_LEN + IPV4_LEN + UDP_LEN + GTPU_LEN + IPV4_LEN + UDP_LEN;

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// Zeroed frame of `len` bytes (at least `MIN_FRAME`) with the payload marker.
///
/// The first 8 payload bytes carry `marker` (the packet's index in the trace)
/// so that reordering and loss can be detected downstream; the rest is zero.
fn start_frame(buf: &mut Vec<u8>, len: usize, payload_at: usize, payload_len: usize, marker: u64) {
    buf.clear();
    buf.resize(len.max(MIN_FRAME), 0);
    if payload_len >= 8 {
        buf[payload_at..payload_at + 8].copy_from_slice(&marker.to_be_bytes());
    }
}

fn put_eth(b: &mut [u8], ethertype: u16) {
    b[0..6].copy_from_slice(&DST_MAC);
    b[6..12].copy_from_slice(&SRC_MAC);
    put16(b, 12, ethertype);
}

/// IPv4 header at `at`, header checksum included.
fn put_ipv4(b: &mut [u8], at: usize, src: [u8; 4], dst: [u8; 4], proto: u8, total_len: u16, id: u16) {
    let h = &mut b[at..at + IPV4_LEN];
    h[0] = 0x45;
    h[1] = 0;
    put16(h, 2, total_len);
    put16(h, 4, id);
    put16(h, 6, 0x4000); // DF, no fragments
    h[8] = 64;
    h[9] = proto;
    put16(h, 10, 0);
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    let c = checksum::checksum(h);
    put16(h, 10, c);
}

fn put_ipv6(b: &mut [u8], at: usize, src: [u8; 16], dst: [u8; 16], next: u8, payload_len: u16) {
    let h = &mut b[at..at + IPV6_LEN];
    put32(h, 0, 0x6000_0000);
    put16(h, 4, payload_len);
    h[6] = next;
    h[7] = 64;
    h[8..24].copy_from_slice(&src);
    h[24..40].copy_from_slice(&dst);
}

/// Writes the L3 header for `addrs` at `at` and returns the L4 pseudo-header sum.
fn put_ip(b: &mut [u8], at: usize, addrs: &Addrs, proto: u8, l4_len: usize, id: u16) -> u16 {
    match *addrs {
        Addrs::V4 { src, dst } => {
            put_ipv4(b, at, src, dst, proto, (IPV4_LEN + l4_len) as u16, id);
            checksum::pseudo_header_v4(src, dst, proto, l4_len as u16)
        }
        Addrs::V6 { src, dst } => {
            put_ipv6(b, at, src, dst, proto, l4_len as u16);
            checksum::pseudo_header_v6(src, dst, proto, l4_len as u32)
        }
    }
}

fn ethertype(addrs: &Addrs) -> u16 {
    match addrs {
        Addrs::V4 { .. } => 0x0800,
        Addrs::V6 { .. } => 0x86dd,
    }
}

/// Fills the L4 checksum at `l4 + off` over `l4..l4 + l4_len` plus the pseudo-header.
fn finish_l4(b: &mut [u8], l4: usize, l4_len: usize, off: usize, pseudo: u16, udp: bool) {
    let s = checksum::combine(pseudo, checksum::sum(&b[l4..l4 + l4_len]));
    let mut c = checksum::finish(s);
    if udp && c == 0 {
        c = 0xffff; // RFC 768: a computed zero is sent as all ones
    }
    put16(b, l4 + off, c);
}

/// Ethernet/IP/UDP frame of `frame_len` bytes (clamped to the headers' length).
pub(crate) fn udp(buf: &mut Vec<u8>, addrs: &Addrs, sport: u16, dport: u16, frame_len: usize, marker: u64) {
    let hl = header_len(addrs, false);
    let len = frame_len.clamp(hl, MAX_FRAME);
    let l3 = ETH_LEN;
    let l4 = l3 + addrs.ip_len();
    let l4_len = len - l4;
    start_frame(buf, len, hl, len - hl, marker);
    let b = buf.as_mut_slice();
    put_eth(b, ethertype(addrs));
    let pseudo = put_ip(b, l3, addrs, PROTO_UDP, l4_len, marker as u16);
    put16(b, l4, sport);
    put16(b, l4 + 2, dport);
    put16(b, l4 + 4, l4_len as u16);
    finish_l4(b, l4, l4_len, 6, pseudo, true);
}

/// Ethernet/IP/TCP frame with `payload` bytes of TCP payload.
pub(crate) fn tcp(buf: &mut Vec<u8>, addrs: &Addrs, sport: u16, dport: u16, t: TcpFields, payload: usize, marker: u64) {
    let hl = header_len(addrs, true);
    let payload = payload.min(MAX_FRAME - hl);
    let l3 = ETH_LEN;
    let l4 = l3 + addrs.ip_len();
    let l4_len = TCP_LEN + payload;
    start_frame(buf, hl + payload, hl, payload, marker);
    let b = buf.as_mut_slice();
    put_eth(b, ethertype(addrs));
    let pseudo = put_ip(b, l3, addrs, PROTO_TCP, l4_len, marker as u16);
    put16(b, l4, sport);
    put16(b, l4 + 2, dport);
    put32(b, l4 + 4, t.seq);
    put32(b, l4 + 8, t.ack);
    b[l4 + 12] = 5 << 4; // data offset: 5 words, no options
    b[l4 + 13] = t.flags;
    put16(b, l4 + 14, 64240);
    finish_l4(b, l4, l4_len, 16, pseudo, false);
}

/// AMF message types (the `amf` NF's format, `flowplane_nf::amf`).
pub(crate) const AMF_REGISTRATION: u8 = 1;
pub(crate) const AMF_SERVICE: u8 = 2;
pub(crate) const AMF_PDU_SESSION: u8 = 3;
pub(crate) const AMF_HANDOVER: u8 = 4;
pub(crate) const AMF_DEREGISTRATION: u8 = 5;
/// UDP port of AMF messages.
pub(crate) const AMF_PORT: u16 = 38412;

/// An AMF message from gNB `gnb` (10.200.0.0/16) to the AMF (10.100.0.1):
/// Ethernet/IPv4/UDP with the 16-byte header (version 1, type, body length,
/// UE id, sequence) and the type's body (`a`, `b` as the NF documents);
/// `frame_len` is raised to the message's length, padding follows it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn amf(
    buf: &mut Vec<u8>,
    ue: u64,
    gnb: u32,
    t: u8,
    seq: u32,
    a: u32,
    b: u32,
    frame_len: usize,
    marker: u64,
) {
    let blen: usize = match t {
        AMF_SERVICE => 4,
        AMF_DEREGISTRATION => 1,
        _ => 8,
    };
    let hl = ETH_LEN + IPV4_LEN + UDP_LEN;
    let len = frame_len.clamp(hl + 16 + blen, MAX_FRAME);
    let l4 = ETH_LEN + IPV4_LEN;
    let l4_len = len - l4;
    start_frame(buf, len, hl, len - hl, marker);
    let bb = buf.as_mut_slice();
    put_eth(bb, 0x0800);
    let src = (0x0ac8_0000 | (gnb & 0xffff)).to_be_bytes();
    let pseudo = put_ip(bb, ETH_LEN, &Addrs::V4 { src, dst: [10, 100, 0, 1] }, PROTO_UDP, l4_len, marker as u16);
    put16(bb, l4, 9000 + (gnb % 1000) as u16);
    put16(bb, l4 + 2, AMF_PORT);
    put16(bb, l4 + 4, l4_len as u16);
    let m = l4 + UDP_LEN;
    bb[m] = 1;
    bb[m + 1] = t;
    put16(bb, m + 2, blen as u16);
    bb[m + 4..m + 12].copy_from_slice(&ue.to_be_bytes());
    put32(bb, m + 12, seq);
    let body = m + 16;
    match t {
        AMF_PDU_SESSION => {
            bb[body] = (a & 7) as u8;
            bb[body + 1] = (a >> 8) as u8;
            put16(bb, body + 2, 0);
            put32(bb, body + 4, b);
        }
        AMF_DEREGISTRATION => bb[body] = a as u8,
        AMF_SERVICE => put32(bb, body, a),
        _ => {
            put32(bb, body, a);
            put32(bb, body + 4, b);
        }
    }
    finish_l4(bb, l4, l4_len, 6, pseudo, true);
}

/// Outer and inner addressing of one GTP-U G-PDU.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GtpuFlow {
    pub gnb: [u8; 4],
    pub upf: [u8; 4],
    pub teid: u32,
    pub qfi: u8,
    pub ue: [u8; 4],
    pub server: [u8; 4],
    pub sport: u16,
    pub dport: u16,
}

/// Uplink G-PDU: Ethernet/IPv4/UDP 2152/GTP-U (E flag, PDU session container
/// with the QFI)/IPv4/UDP, `frame_len` bytes (clamped to the headers' length).
pub(crate) fn gtpu(buf: &mut Vec<u8>, g: &GtpuFlow, frame_len: usize, marker: u64) {
    let len = frame_len.clamp(GTPU_HEADERS, MAX_FRAME);
    let o3 = ETH_LEN;
    let o4 = o3 + IPV4_LEN;
    let gh = o4 + UDP_LEN;
    let i3 = gh + GTPU_LEN;
    let i4 = i3 + IPV4_LEN;
    start_frame(buf, len, GTPU_HEADERS, len - GTPU_HEADERS, marker);
    let b = buf.as_mut_slice();
    put_eth(b, 0x0800);
    // Inner packet first: the outer UDP checksum covers it.
    let inner_l4_len = len - i4;
    put_ipv4(b, i3, g.ue, g.server, PROTO_UDP, (IPV4_LEN + inner_l4_len) as u16, marker as u16);
    put16(b, i4, g.sport);
    put16(b, i4 + 2, g.dport);
    put16(b, i4 + 4, inner_l4_len as u16);
    let ipseudo = checksum::pseudo_header_v4(g.ue, g.server, PROTO_UDP, inner_l4_len as u16);
    finish_l4(b, i4, inner_l4_len, 6, ipseudo, true);
    // GTP-U: version 1, PT=1, E=1; G-PDU; length counts everything after the first 8 bytes.
    b[gh] = 0x34;
    b[gh + 1] = 0xff;
    put16(b, gh + 2, (len - gh - 8) as u16);
    put32(b, gh + 4, g.teid);
    put16(b, gh + 8, 0); // sequence number (unused, S=0)
    b[gh + 10] = 0; // N-PDU number
    b[gh + 11] = 0x85; // next extension: PDU session container
    b[gh + 12] = 1; // extension length in 4-byte units
    b[gh + 13] = 0x10; // PDU type 1: UL PDU session information
    b[gh + 14] = g.qfi & 0x3f;
    b[gh + 15] = 0; // no further extension
    let outer_l4_len = len - o4;
    let opseudo = put_ip(b, o3, &Addrs::V4 { src: g.gnb, dst: g.upf }, PROTO_UDP, outer_l4_len, marker as u16);
    put16(b, o4, GTPU_PORT);
    put16(b, o4 + 2, GTPU_PORT);
    put16(b, o4 + 4, outer_l4_len as u16);
    finish_l4(b, o4, outer_l4_len, 6, opseudo, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4() -> Addrs {
        Addrs::V4 { src: [10, 1, 2, 3], dst: [172, 16, 0, 9] }
    }

    fn l4_ok(frame: &[u8], l3: usize, v6: bool) -> bool {
        let (proto, l4, l4_len, pseudo) = if v6 {
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&frame[l3 + 8..l3 + 24]);
            d.copy_from_slice(&frame[l3 + 24..l3 + 40]);
            let pl = u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]) as usize;
            (frame[l3 + 6], l3 + 40, pl, checksum::pseudo_header_v6(s, d, frame[l3 + 6], pl as u32))
        } else {
            let tl = u16::from_be_bytes([frame[l3 + 2], frame[l3 + 3]]) as usize;
            let s = [frame[l3 + 12], frame[l3 + 13], frame[l3 + 14], frame[l3 + 15]];
            let d = [frame[l3 + 16], frame[l3 + 17], frame[l3 + 18], frame[l3 + 19]];
            (frame[l3 + 9], l3 + 20, tl - 20, checksum::pseudo_header_v4(s, d, frame[l3 + 9], (tl - 20) as u16))
        };
        let _ = proto;
        checksum::combine(pseudo, checksum::sum(&frame[l4..l4 + l4_len])) == 0xffff
    }

    #[test]
    fn udp_v4_lengths_and_checksums() {
        let mut b = Vec::new();
        udp(&mut b, &v4(), 1234, 80, 64, 77);
        assert_eq!(b.len(), 64);
        assert_eq!(checksum::sum(&b[14..34]), 0xffff, "ip header checksum");
        assert_eq!(u16::from_be_bytes([b[16], b[17]]), 50);
        assert_eq!(u16::from_be_bytes([b[38], b[39]]), 30);
        assert!(l4_ok(&b, 14, false));
        assert_eq!(u64::from_be_bytes(b[42..50].try_into().unwrap()), 77);
        // Too short a size is clamped to the headers (and padded to the Ethernet minimum).
        udp(&mut b, &v4(), 1, 2, 10, 0);
        assert_eq!(b.len(), MIN_FRAME);
        assert!(l4_ok(&b, 14, false));
    }

    #[test]
    fn udp_v6_and_tcp_checksums() {
        let mut b = Vec::new();
        let a6 = Addrs::V6 { src: [0xfd; 16], dst: [0xfe; 16] };
        udp(&mut b, &a6, 5, 6, 1514, 3);
        assert_eq!(b.len(), 1514);
        assert!(l4_ok(&b, 14, true));
        tcp(&mut b, &a6, 5, 6, TcpFields { seq: 1, ack: 2, flags: TCP_SYN }, 0, 3);
        assert_eq!(b.len(), 74);
        assert!(l4_ok(&b, 14, true));
        tcp(&mut b, &v4(), 5, 6, TcpFields { seq: 9, ack: 2, flags: TCP_ACK | TCP_PSH }, 100, 3);
        assert_eq!(b.len(), 154);
        assert!(l4_ok(&b, 14, false));
        tcp(&mut b, &v4(), 5, 6, TcpFields { seq: 9, ack: 2, flags: TCP_SYN }, 0, 3);
        assert_eq!(b.len(), MIN_FRAME, "padded");
        assert!(l4_ok(&b, 14, false));
    }

    #[test]
    fn gtpu_layout() {
        let g = GtpuFlow {
            gnb: [192, 168, 3, 1],
            upf: [192, 168, 255, 254],
            teid: 0xdead_beef,
            qfi: 9,
            ue: [10, 0, 0, 1],
            server: [172, 16, 1, 1],
            sport: 4000,
            dport: 443,
        };
        let mut b = Vec::new();
        gtpu(&mut b, &g, 200, 1);
        assert_eq!(b.len(), 200);
        assert_eq!(u16::from_be_bytes([b[36], b[37]]), GTPU_PORT);
        assert_eq!(u32::from_be_bytes(b[46..50].try_into().unwrap()), 0xdead_beef);
        assert_eq!(u16::from_be_bytes([b[44], b[45]]) as usize, 200 - 42 - 8);
        assert_eq!(b[53], 0x85);
        assert_eq!(b[56] & 0x3f, 9);
        assert!(l4_ok(&b, 14, false), "outer udp");
        assert!(l4_ok(&b, 58, false), "inner udp");
        assert_eq!(checksum::sum(&b[58..78]), 0xffff);
    }
}
