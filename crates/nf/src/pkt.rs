//! What a stateful NF sees of a packet: its bytes, facts parsed once per
//! batch by the executor ([`PktMeta`]), and rewriting helpers that keep the
//! IPv4 header checksum and the TCP/UDP checksum valid incrementally (RFC 1624).

use std::net::{Ipv4Addr, Ipv6Addr};

use flowplane_wire::checksum::{update16, update32};
use flowplane_wire::flow::{FiveTuple, FiveTupleV4, FiveTupleV6, FLAG_NON_FIRST_FRAGMENT};
use flowplane_wire::packet_repr::{parse_frame, FrameInfo};

/// IP protocol numbers used by the library.
pub mod proto {
    /// ICMP.
    pub const ICMP: u8 = 1;
    /// TCP.
    pub const TCP: u8 = 6;
    /// UDP.
    pub const UDP: u8 = 17;
    /// ICMPv6.
    pub const ICMPV6: u8 = 58;
}

/// TCP flag bits.
pub mod tcp_flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
}

/// Facts about one packet, parsed once per batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PktMeta {
    /// The packet is IPv4/IPv6 with a usable flow key.
    pub valid: bool,
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// IP protocol (after IPv6 extension headers).
    pub proto: u8,
    /// Offset of the IP header.
    pub l3: u16,
    /// Offset of the TCP/UDP/ICMP header; 0 when absent (non-first fragment, unknown protocol).
    pub l4: u16,
    /// The flow's 5-tuple as received (the aggregated table's key).
    pub tuple: FiveTuple,
    /// Outer VLAN ID (0: untagged).
    pub vlan: u16,
    /// GTP-U tunnel endpoint identifier, if `has_teid` (a flag rather than
    /// an `Option` keeps the struct at one cache line).
    pub teid: u32,
    /// The packet is GTP-U on UDP port 2152 (`teid` is meaningful).
    pub has_teid: bool,
}

impl PktMeta {
    /// The GTP-U TEID, for GTP-U packets.
    #[inline(always)]
    pub fn teid(&self) -> Option<u32> {
        self.has_teid.then_some(self.teid)
    }

    /// Sets (or clears) the TEID.
    #[inline(always)]
    pub fn set_teid(&mut self, teid: Option<u32>) {
        self.has_teid = teid.is_some();
        self.teid = teid.unwrap_or(0);
    }

    /// Parses `frame` (Ethernet, up to two VLAN tags). Untagged IPv4 TCP/UDP
    /// takes an inlined fast path, untagged IPv6 TCP/UDP without extension
    /// headers a short out-of-line one; VLAN tags, extension headers,
    /// fragments and other protocols go through the general parser.
    /// Malformed input yields `valid == false`, never a panic.
    #[inline]
    pub fn parse(frame: &[u8]) -> PktMeta {
        let mut m = PktMeta::default();
        m.parse_into(frame);
        m
    }

    /// Parses `frame` into `self` in place. The IPv4 fast path writes the
    /// fields where they live (instead of building a value and copying it),
    /// which avoids a store-forwarding stall per packet in the executor's
    /// parse loop; everything else is one out-of-line call.
    #[inline]
    pub fn parse_into(&mut self, frame: &[u8]) {
        if !parse_ipv4_fast(frame, self) {
            *self = parse_not_ipv4_fast(frame);
        }
    }
}

/// Everything but the IPv4 fast path, out of line and returning by value:
/// that keeps the inlined IPv4 path as lean as before (taking `&mut self`
/// here, or inlining the IPv6 path, forces the caller's `PktMeta` into
/// memory and costs IPv4 ~6 cycles per packet in `bench parse`).
#[inline(never)]
fn parse_not_ipv4_fast(frame: &[u8]) -> PktMeta {
    let mut m = PktMeta::default();
    if parse_ipv6_fast(frame, &mut m) {
        m
    } else {
        parse_general(frame)
    }
}

#[inline(always)]
fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Untagged Ethernet + IPv4 + TCP/UDP (first fragment or unfragmented),
/// the common case, written straight into `m`. False: use the general parser.
#[inline(always)]
fn parse_ipv4_fast(f: &[u8], m: &mut PktMeta) -> bool {
    if f.len() < 34 || f[12] != 0x08 || f[13] != 0x00 {
        return false;
    }
    let vihl = f[14];
    let ihl = ((vihl & 0x0f) as usize) * 4;
    if vihl >> 4 != 4 || ihl < 20 || f.len() < 14 + ihl + 4 {
        return false;
    }
    let frag = u16::from_be_bytes([f[20], f[21]]);
    let proto = f[23];
    if frag & 0x1fff != 0 || !matches!(proto, proto::TCP | proto::UDP) {
        return false;
    }
    let l4 = 14 + ihl;
    let src = Ipv4Addr::new(f[26], f[27], f[28], f[29]);
    let dst = Ipv4Addr::new(f[30], f[31], f[32], f[33]);
    let sport = u16::from_be_bytes([f[l4], f[l4 + 1]]);
    let dport = u16::from_be_bytes([f[l4 + 2], f[l4 + 3]]);
    m.valid = true;
    m.v6 = false;
    m.vlan = 0;
    m.set_teid(if proto == proto::UDP && dport == flowplane_wire::flow::GTPU_PORT {
        f.get(l4 + 8..).and_then(gtpu_teid)
    } else {
        None
    });
    m.proto = proto;
    m.l3 = 14;
    m.l4 = l4 as u16;
    m.tuple = FiveTuple::V4(FiveTupleV4::new(src, dst, sport, dport, proto));
    true
}

/// The TEID of a GTP-U (version 1, protocol type GTP) header at the start of
/// `g`; `None` for anything else on port 2152, which stays plain UDP.
#[inline]
fn gtpu_teid(g: &[u8]) -> Option<u32> {
    let h = g.first_chunk::<8>()?;
    (h[0] >> 5 == 1 && h[0] & 0x10 != 0).then(|| u32::from_be_bytes([h[4], h[5], h[6], h[7]]))
}

/// Ethernet + IPv6 header + UDP header: the shortest frame the IPv6 fast path reads.
const V6_UDP_MIN: usize = 14 + 40 + 8;

/// Untagged Ethernet + IPv6 + TCP/UDP with no extension headers, written
/// straight into `m`. It accepts only frames the general parser accepts
/// with the same result (whole TCP/UDP header inside the datagram, sane UDP
/// length, not GTP-U); anything else returns false for the general parser.
#[inline(always)]
fn parse_ipv6_fast(f: &[u8], m: &mut PktMeta) -> bool {
    // One length check up front lets every fixed-offset read below go unchecked.
    let Some(h) = f.first_chunk::<V6_UDP_MIN>() else { return false };
    if h[12] != 0x86 || h[13] != 0xdd || h[14] >> 4 != 6 {
        return false;
    }
    let proto = h[20];
    let plen = u16::from_be_bytes([h[18], h[19]]) as usize;
    // Padding after the datagram is fine, a datagram cut short is not.
    if 14 + 40 + plen > f.len() {
        return false;
    }
    let dport = u16::from_be_bytes([h[56], h[57]]);
    if proto == proto::UDP {
        let ulen = u16::from_be_bytes([h[58], h[59]]) as usize;
        // GTP-U (port 2152) needs its header validated: general path.
        if plen < 8 || ulen < 8 || ulen > plen || dport == flowplane_wire::flow::GTPU_PORT {
            return false;
        }
    } else if proto == proto::TCP {
        let Some(&off) = f.get(14 + 40 + 12) else { return false };
        let hl = ((off >> 4) as usize) * 4;
        if plen < 20 || hl < 20 || hl > plen {
            return false;
        }
    } else {
        return false;
    }
    let src = Ipv6Addr::from(*h[22..38].first_chunk::<16>().unwrap_or(&[0; 16]));
    let dst = Ipv6Addr::from(*h[38..54].first_chunk::<16>().unwrap_or(&[0; 16]));
    let sport = u16::from_be_bytes([h[54], h[55]]);
    m.valid = true;
    m.v6 = true;
    m.vlan = 0;
    m.set_teid(None);
    m.proto = proto;
    m.l3 = 14;
    m.l4 = 14 + 40;
    m.tuple = FiveTuple::V6(FiveTupleV6::new(src, dst, sport, dport, proto));
    true
}

/// Everything else: one pass of [`parse_frame`] validates the headers and
/// gives the offsets; the 5-tuple is then read from the frame at those
/// offsets following `extract_five_tuple`'s conventions (the result is
/// exactly what running both parsers gave: valid only if both accept).
#[inline(never)]
fn parse_general(f: &[u8]) -> PktMeta {
    let Ok(info) = parse_frame(f) else { return PktMeta::default() };
    let Some(tuple) = tuple_at(f, &info) else { return PktMeta::default() };
    PktMeta {
        valid: true,
        v6: info.ip_version == 6,
        proto: tuple.proto(),
        l3: info.l3_offset as u16,
        l4: info.l4_offset.map_or(0, |o| o as u16),
        tuple,
        vlan: info.vlan_ids[0],
        teid: info.gtpu.map_or(0, |g| g.teid),
        has_teid: info.gtpu.is_some(),
    }
}

/// The flow key of a frame [`parse_frame`] accepted, or `None` where the
/// flow-key parser refuses it although `parse_frame` does not: non-IP,
/// more than two VLAN tags, a port-carrying protocol cut before its ports.
fn tuple_at(f: &[u8], info: &FrameInfo) -> Option<FiveTuple> {
    if info.vlan_count > 2 {
        return None;
    }
    let l3 = info.l3_offset;
    let proto = info.protocol.0;
    // Only non-first fragments have a non-zero offset; they carry no ports.
    let (ports, flags) = if info.frag_offset != 0 {
        ((0, 0), FLAG_NON_FIRST_FRAGMENT)
    } else {
        // IPv6 payload length 0 (jumbogram): the flow parser bounds the datagram by the frame.
        let end = if info.ip_version == 6 && info.end == l3 + 40 { f.len() } else { info.end };
        ((flow_ports(f.get(..end)?, info.l4_offset?, proto)?), 0)
    };
    match info.ip_version {
        4 => {
            let a = f.get(l3 + 12..l3 + 20)?;
            let src = Ipv4Addr::new(a[0], a[1], a[2], a[3]);
            let dst = Ipv4Addr::new(a[4], a[5], a[6], a[7]);
            Some(FiveTuple::V4(FiveTupleV4::new(src, dst, ports.0, ports.1, proto).with_flags(flags)))
        }
        6 => {
            let a = f.get(l3 + 8..l3 + 40)?.first_chunk::<32>()?;
            let src = Ipv6Addr::from(*a.first_chunk::<16>()?);
            let dst = Ipv6Addr::from(*a.last_chunk::<16>()?);
            Some(FiveTuple::V6(FiveTupleV6::new(src, dst, ports.0, ports.1, proto).with_flags(flags)))
        }
        _ => None,
    }
}

/// The flow key's (sport, dport) for `proto` at `l4` of the datagram:
/// the first four bytes for port-carrying protocols, the identifier twice for
/// ICMP/ICMPv6 echo, zeros otherwise. `None` where those bytes are missing.
fn flow_ports(dgram: &[u8], l4: usize, proto: u8) -> Option<(u16, u16)> {
    const DCCP: u8 = 33;
    const SCTP: u8 = 132;
    const UDPLITE: u8 = 136;
    match proto {
        proto::TCP | proto::UDP | DCCP | SCTP | UDPLITE => Some((be16(dgram, l4)?, be16(dgram, l4 + 2)?)),
        proto::ICMP | proto::ICMPV6 => {
            let h = dgram.get(l4..)?.first_chunk::<8>()?;
            let echo = if proto == proto::ICMP { h[0] == 8 || h[0] == 0 } else { h[0] == 128 || h[0] == 129 };
            let id = u16::from_be_bytes([h[4], h[5]]);
            Some(if echo { (id, id) } else { (0, 0) })
        }
        _ => Some((0, 0)),
    }
}

/// A packet handed to a stateful NF's action.
pub struct Pkt<'a> {
    data: &'a mut [u8],
    meta: &'a PktMeta,
}

impl<'a> Pkt<'a> {
    /// Wraps a packet and its parsed facts.
    #[inline(always)]
    pub fn new(data: &'a mut [u8], meta: &'a PktMeta) -> Self {
        Pkt { data, meta }
    }

    /// Frame bytes.
    #[inline(always)]
    pub fn data(&self) -> &[u8] {
        self.data
    }

    /// Mutable frame bytes (raw access: keep checksums valid yourself).
    #[inline(always)]
    pub fn data_mut(&mut self) -> &mut [u8] {
        self.data
    }

    /// Frame length.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True for a zero-length frame.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Parsed facts.
    #[inline(always)]
    pub fn meta(&self) -> &PktMeta {
        self.meta
    }

    /// The 5-tuple as received.
    #[inline(always)]
    pub fn tuple(&self) -> &FiveTuple {
        &self.meta.tuple
    }

    /// IP protocol.
    #[inline(always)]
    pub fn proto(&self) -> u8 {
        self.meta.proto
    }

    /// TCP flags, if this is a TCP packet with its header present.
    #[inline]
    pub fn tcp_flags(&self) -> Option<u8> {
        if self.meta.proto != proto::TCP || self.meta.l4 == 0 {
            return None;
        }
        self.data.get(self.meta.l4 as usize + 13).copied()
    }

    /// TCP sequence and acknowledgement numbers.
    pub fn tcp_seq_ack(&self) -> Option<(u32, u32)> {
        if self.meta.proto != proto::TCP || self.meta.l4 == 0 {
            return None;
        }
        let t = self.data.get(self.meta.l4 as usize..self.meta.l4 as usize + 12)?;
        Some((u32::from_be_bytes([t[4], t[5], t[6], t[7]]), u32::from_be_bytes([t[8], t[9], t[10], t[11]])))
    }

    // These rewriters work from the offsets parsed once per batch instead of
    // re-validating through `flowplane_wire`'s views (`ipv4::rewrite_addr`,
    // `TcpPacket::set_*_port_incremental`): they must also handle captures cut
    // short by a snap length, where the views rightly refuse the packet.

    /// Offset of the L4 checksum field, if it is present and in use.
    fn l4_checksum_at(&self) -> Option<usize> {
        if self.meta.l4 == 0 {
            return None;
        }
        let l4 = self.meta.l4 as usize;
        let at = match self.meta.proto {
            proto::TCP => l4 + 16,
            proto::UDP => l4 + 6,
            _ => return None,
        };
        let c = be16(self.data, at)?;
        // UDP over IPv4 with checksum 0 carries none: keep it that way.
        if self.meta.proto == proto::UDP && c == 0 && !self.meta.v6 {
            return None;
        }
        Some(at)
    }

    /// Applies an incremental update `f` to the TCP/UDP checksum, if in use.
    fn fix_l4_checksum(&mut self, f: impl FnOnce(u16) -> u16) {
        if let Some(at) = self.l4_checksum_at() {
            let mut n = f(u16::from_be_bytes([self.data[at], self.data[at + 1]]));
            if self.meta.proto == proto::UDP && n == 0 {
                n = 0xffff; // RFC 768: a computed zero is sent as all ones
            }
            self.data[at..at + 2].copy_from_slice(&n.to_be_bytes());
        }
    }

    fn set_ipv4_addr(&mut self, field: usize, new: Ipv4Addr) -> bool {
        if self.meta.v6 || !self.meta.valid {
            return false;
        }
        let l3 = self.meta.l3 as usize;
        let at = l3 + field;
        let Some(cur) = self.data.get(at..at + 4) else { return false };
        let old = u32::from_be_bytes([cur[0], cur[1], cur[2], cur[3]]);
        let newv = u32::from(new);
        if old == newv {
            return true;
        }
        self.data[at..at + 4].copy_from_slice(&newv.to_be_bytes());
        let c = u16::from_be_bytes([self.data[l3 + 10], self.data[l3 + 11]]);
        self.data[l3 + 10..l3 + 12].copy_from_slice(&update32(c, old, newv).to_be_bytes());
        self.fix_l4_checksum(|c| update32(c, old, newv));
        true
    }

    /// Current IPv4 source address.
    pub fn ipv4_src(&self) -> Option<Ipv4Addr> {
        self.ipv4_addr(12)
    }

    /// Current IPv4 destination address.
    pub fn ipv4_dst(&self) -> Option<Ipv4Addr> {
        self.ipv4_addr(16)
    }

    fn ipv4_addr(&self, field: usize) -> Option<Ipv4Addr> {
        if self.meta.v6 || !self.meta.valid {
            return None;
        }
        let at = self.meta.l3 as usize + field;
        let b = self.data.get(at..at + 4)?;
        Some(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
    }

    /// Rewrites the IPv4 source address, updating both checksums. `false` if not IPv4.
    pub fn set_ipv4_src(&mut self, a: Ipv4Addr) -> bool {
        self.set_ipv4_addr(12, a)
    }

    /// Rewrites the IPv4 destination address, updating both checksums. `false` if not IPv4.
    pub fn set_ipv4_dst(&mut self, a: Ipv4Addr) -> bool {
        self.set_ipv4_addr(16, a)
    }

    fn set_port(&mut self, field: usize, port: u16) -> bool {
        if self.meta.l4 == 0 || !matches!(self.meta.proto, proto::TCP | proto::UDP) {
            return false;
        }
        let at = self.meta.l4 as usize + field;
        let Some(old) = be16(self.data, at) else { return false };
        self.data[at..at + 2].copy_from_slice(&port.to_be_bytes());
        self.fix_l4_checksum(|c| update16(c, old, port));
        true
    }

    /// Current TCP/UDP source port.
    pub fn src_port(&self) -> Option<u16> {
        if self.meta.l4 == 0 {
            return None;
        }
        be16(self.data, self.meta.l4 as usize)
    }

    /// Current TCP/UDP destination port.
    pub fn dst_port(&self) -> Option<u16> {
        if self.meta.l4 == 0 {
            return None;
        }
        be16(self.data, self.meta.l4 as usize + 2)
    }

    /// Rewrites the TCP/UDP source port, updating the checksum.
    pub fn set_src_port(&mut self, p: u16) -> bool {
        self.set_port(0, p)
    }

    /// Rewrites the TCP/UDP destination port, updating the checksum.
    pub fn set_dst_port(&mut self, p: u16) -> bool {
        self.set_port(2, p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_wire::flow::extract_five_tuple;
    use proptest::prelude::*;

    #[test]
    fn meta_fits_one_cache_line() {
        assert!(std::mem::size_of::<PktMeta>() <= 64, "{}", std::mem::size_of::<PktMeta>());
    }

    #[test]
    fn udp_port_2152_is_gtpu_only_when_it_looks_like_it() {
        let plain = crate::testutil::udp4([10, 0, 0, 1], [10, 0, 0, 2], 2152, 2152);
        let m = PktMeta::parse(&plain);
        assert!(m.valid, "junk on port 2152 stays plain UDP");
        assert_eq!(m.teid(), None);
        let mut g = plain.clone();
        g[42..50].copy_from_slice(&[0x30, 0xff, 0, 0, 0, 0, 0, 77]);
        let m = PktMeta::parse(&g);
        assert!(m.valid);
        assert_eq!(m.teid(), Some(77));
    }

    /// The parser before the IPv6 fast path: IPv4 fast path, else both
    /// general parsers (valid only if both accept). The new one must agree.
    fn reference_parse(f: &[u8]) -> PktMeta {
        let mut m = PktMeta::default();
        if parse_ipv4_fast(f, &mut m) {
            return m;
        }
        let Ok(tuple) = extract_five_tuple(f) else { return PktMeta::default() };
        let Ok(info) = parse_frame(f) else { return PktMeta::default() };
        PktMeta {
            valid: true,
            v6: info.ip_version == 6,
            proto: tuple.proto(),
            l3: info.l3_offset as u16,
            l4: info.l4_offset.map_or(0, |o| o as u16),
            tuple,
            vlan: info.vlan_ids[0],
            teid: info.gtpu.map_or(0, |g| g.teid),
            has_teid: info.gtpu.is_some(),
        }
    }

    /// Parses through `parse_into` over a dirty `PktMeta` (as the executor
    /// reuses slots) and checks it against the reference.
    fn check(f: &[u8]) -> PktMeta {
        let mut m = PktMeta {
            valid: true,
            v6: true,
            proto: 99,
            l3: 7,
            l4: 9,
            vlan: 5,
            teid: 3,
            has_teid: true,
            ..PktMeta::default()
        };
        m.parse_into(f);
        assert_eq!(m, reference_parse(f), "frame {f:02x?}");
        assert_eq!(m, PktMeta::parse(f));
        m
    }

    const SRC6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    const DST6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

    /// Ethernet (with `tags` 802.1Q tags) + IPv6 with `nh` and `payload`.
    fn v6_frame(tags: usize, nh: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        for _ in 0..tags {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        }
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
        f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        f.extend_from_slice(&[nh, 64]);
        f.extend_from_slice(&SRC6);
        f.extend_from_slice(&DST6);
        f.extend_from_slice(payload);
        f
    }

    fn udp(sport: u16, dport: u16, body: &[u8]) -> Vec<u8> {
        let mut u = Vec::new();
        u.extend_from_slice(&sport.to_be_bytes());
        u.extend_from_slice(&dport.to_be_bytes());
        u.extend_from_slice(&(8 + body.len() as u16).to_be_bytes());
        u.extend_from_slice(&[0, 0]);
        u.extend_from_slice(body);
        u
    }

    fn tcp(sport: u16, dport: u16) -> Vec<u8> {
        let mut t = vec![0u8; 20];
        t[0..2].copy_from_slice(&sport.to_be_bytes());
        t[2..4].copy_from_slice(&dport.to_be_bytes());
        t[12] = 0x50;
        t[13] = tcp_flags::SYN;
        t
    }

    #[test]
    fn ipv6_udp_and_tcp_take_the_fast_path() {
        let f = v6_frame(0, proto::UDP, &udp(1000, 53, &[1, 2, 3, 4]));
        let mut m = PktMeta::default();
        assert!(parse_ipv6_fast(&f, &mut m));
        let want = FiveTupleV6::new(SRC6.into(), DST6.into(), 1000, 53, proto::UDP);
        assert_eq!((m.valid, m.v6, m.proto, m.l3, m.l4), (true, true, proto::UDP, 14, 54));
        assert_eq!(m.tuple, FiveTuple::V6(want));
        assert_eq!(check(&f), m);

        let mut f = v6_frame(0, proto::TCP, &tcp(443, 51000));
        f.extend_from_slice(&[0; 6]); // Ethernet padding after the datagram
        assert!(parse_ipv6_fast(&f, &mut m));
        assert_eq!(m.tuple, FiveTuple::V6(FiveTupleV6::new(SRC6.into(), DST6.into(), 443, 51000, proto::TCP)));
        let mut buf = f.clone();
        assert_eq!(Pkt::new(&mut buf, &m).tcp_flags(), Some(tcp_flags::SYN));
        assert_eq!(check(&f), m);
    }

    #[test]
    fn ipv6_fast_path_declines_what_needs_the_general_parser() {
        let mut m = PktMeta::default();
        let gtpu = v6_frame(0, proto::UDP, &udp(2152, 2152, &[0x30, 0xff, 0, 0, 0, 0, 0, 1]));
        let cases = [
            gtpu.clone(),
            gtpu[..gtpu.len() - 1].to_vec(),              // datagram cut short
            v6_frame(1, proto::UDP, &udp(1, 2, &[0; 8])), // VLAN tag
            v6_frame(0, 0, &[proto::UDP, 0, 1, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), // hop-by-hop
            v6_frame(0, proto::ICMPV6, &[128, 0, 0, 0, 0, 7, 0, 1]), // ICMPv6 echo
        ];
        for f in &cases {
            assert!(!parse_ipv6_fast(f, &mut m));
            check(f);
        }
        // Valid GTP-U goes through the general parser and keeps its UDP key.
        assert_eq!(check(&gtpu).tuple.dst_port(), 2152);
        // Echo identifier as both ports; ICMPv6 is valid but port-less otherwise.
        let m = check(&cases[4]);
        assert_eq!((m.valid, m.tuple.src_port(), m.tuple.dst_port(), m.l4), (true, 7, 7, 54));
        // Bad UDP length, TCP data offset below 5: invalid, as before.
        let mut bad = v6_frame(0, proto::UDP, &udp(1, 2, &[0; 4]));
        bad[58..60].copy_from_slice(&7u16.to_be_bytes());
        assert!(!check(&bad).valid);
        let mut bad = v6_frame(0, proto::TCP, &tcp(1, 2));
        bad[66] = 0x40;
        assert!(!check(&bad).valid);
    }

    #[test]
    fn general_path_keeps_flow_key_conventions() {
        // Three VLAN tags: parse_frame accepts up to four, the flow key two.
        assert!(!check(&v6_frame(3, proto::UDP, &udp(1, 2, &[]))).valid);
        assert!(check(&v6_frame(2, proto::UDP, &udp(1, 2, &[]))).valid);
        // SCTP cut before its ports: no flow key.
        assert!(!check(&v6_frame(0, 132, &[0, 1])).valid);
        let m = check(&v6_frame(0, 132, &[0, 1, 0, 2]));
        assert_eq!((m.valid, m.tuple.src_port(), m.tuple.dst_port()), (true, 1, 2));
        // Jumbogram marker (payload length 0): the frame bounds the datagram.
        let mut j = v6_frame(0, 132, &[]);
        j.extend_from_slice(&[0, 9, 0, 10]);
        let m = check(&j);
        assert_eq!((m.valid, m.tuple.src_port()), (true, 9));
        // Non-first fragment: no ports, flagged, no L4 offset.
        let frag = [proto::UDP, 0, 0x00, 0x08, 0, 0, 0, 1, 0xaa, 0xbb, 0xcc, 0xdd];
        let m = check(&v6_frame(0, 44, &frag));
        assert_eq!((m.valid, m.l4, m.tuple.is_non_first_fragment(), m.tuple.src_port()), (true, 0, true, 0));
        // First fragment (offset 0, M set): ports after the fragment header.
        let mut first = vec![proto::UDP, 0, 0x00, 0x01, 0, 0, 0, 1];
        first.extend_from_slice(&udp(5, 6, &[])[..]);
        let m = check(&v6_frame(0, 44, &first));
        assert_eq!((m.valid, m.l4, m.tuple.src_port(), m.tuple.dst_port()), (true, 62, 5, 6));
        // Non-IP.
        let mut arp = vec![0u8; 12];
        arp.extend_from_slice(&[0x08, 0x06, 0, 1]);
        assert!(!check(&arp).valid);
        assert!(!check(&[]).valid);
    }

    /// A frame from structural choices: VLAN tags, an IPv4 or IPv6 header
    /// (options, fragments, extension headers), a transport header, with
    /// lengths consistent or not, then truncation/padding and one byte flip.
    #[allow(clippy::too_many_arguments)]
    fn build(
        tags: &[u16],
        family: u8,
        ext: &[(u8, u8, u16)],
        nh: u8,
        frag: u16,
        ihl: u8,
        l4: &[u8],
        lens: (bool, u16, bool),
        dport: u16,
        cut: Option<usize>,
        flip: Option<(usize, u8)>,
    ) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        for &t in tags {
            f.extend_from_slice(&t.to_be_bytes());
            f.extend_from_slice(&[0x20, 0x07]);
        }
        // Transport: ports first, then the rest of the random header bytes.
        let mut t = l4.to_vec();
        if t.len() >= 4 {
            t[2..4].copy_from_slice(&dport.to_be_bytes());
        }
        if matches!(nh, proto::ICMP | proto::ICMPV6) && !t.is_empty() {
            // Echo request/reply of both families, and a non-echo type.
            t[0] = [0, 8, 128, 129, 3][dport as usize % 5];
        }
        if nh == proto::UDP && t.len() >= 8 && lens.2 {
            let n = t.len() as u16;
            t[4..6].copy_from_slice(&n.to_be_bytes());
            if dport == 2152 && t.len() >= 16 {
                t[8] = 0x30;
                t[10..12].copy_from_slice(&(n - 16).to_be_bytes());
            }
        }
        if nh == proto::TCP && t.len() >= 20 && lens.2 {
            t[12] = ((t.len().min(60) / 4) as u8) << 4;
        }
        match family {
            0 => {
                f.extend_from_slice(&[0x08, 0x00]);
                let hl = ihl as usize * 4;
                let total = if lens.0 { (hl.max(20) + t.len()) as u16 } else { lens.1 };
                f.extend_from_slice(&[0x40 | ihl, 0]);
                f.extend_from_slice(&total.to_be_bytes());
                f.extend_from_slice(&[0, 1]);
                f.extend_from_slice(&frag.to_be_bytes());
                f.extend_from_slice(&[64, nh, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
                f.extend(std::iter::repeat_n(1u8, hl.saturating_sub(20)));
            }
            1 => {
                let mut chain = Vec::new();
                let mut next = nh;
                for &(kind, len, fw) in ext.iter().rev() {
                    let mut h = match kind {
                        44 => {
                            let mut h = vec![next, 0];
                            h.extend_from_slice(&fw.to_be_bytes());
                            h.extend_from_slice(&[0, 0, 0, 9]);
                            h
                        }
                        51 => {
                            let mut h = vec![next, len];
                            h.resize((len as usize + 2) * 4, 0);
                            h
                        }
                        _ => {
                            let mut h = vec![next, len];
                            h.resize((len as usize + 1) * 8, 0);
                            h
                        }
                    };
                    h.extend_from_slice(&chain);
                    chain = h;
                    next = kind;
                }
                chain.extend_from_slice(&t);
                t = chain;
                f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
                let plen = if lens.0 { t.len() as u16 } else { lens.1 };
                f.extend_from_slice(&plen.to_be_bytes());
                f.extend_from_slice(&[next, 64]);
                f.extend_from_slice(&SRC6);
                f.extend_from_slice(&DST6);
            }
            _ => f.extend_from_slice(&[0x08, 0x06]),
        }
        f.extend_from_slice(&t);
        if let Some(c) = cut {
            f.truncate(c % (f.len() + 8)); // sometimes beyond the end: no cut
        }
        if let Some((at, b)) = flip {
            if !f.is_empty() {
                let i = at % f.len();
                f[i] ^= b;
            }
        }
        f
    }

    fn nh_strategy() -> impl Strategy<Value = u8> {
        prop_oneof![
            4 => Just(proto::UDP),
            4 => Just(proto::TCP),
            1 => Just(proto::ICMP),
            1 => Just(proto::ICMPV6),
            1 => prop::sample::select(vec![33u8, 132, 136, 47, 50, 59, 0, 44]),
            1 => any::<u8>(),
        ]
    }

    fn ext_strategy() -> impl Strategy<Value = Vec<(u8, u8, u16)>> {
        let one = (
            prop::sample::select(vec![0u8, 43, 44, 51, 60]),
            0u8..3,
            prop_oneof![Just(0u16), Just(1), Just(8), Just(9), any::<u16>()],
        );
        prop_oneof![2 => Just(vec![]), 2 => prop::collection::vec(one, 0..10)]
    }

    fn frame_strategy() -> impl Strategy<Value = Vec<u8>> {
        let tags = prop_oneof![
            4 => Just(vec![]),
            1 => prop::collection::vec(prop::sample::select(vec![0x8100u16, 0x88a8, 0x9100]), 0..5),
        ];
        let head = (tags, prop_oneof![4 => Just(1u8), 3 => Just(0u8), 1 => Just(2u8)], ext_strategy(), nh_strategy());
        let ip = (
            prop_oneof![3 => Just(0u16), 1 => Just(0x2000), 1 => Just(0x4000), 1 => any::<u16>()],
            prop_oneof![4 => Just(5u8), 1 => 0u8..16],
            prop::collection::vec(any::<u8>(), 0..48),
            (prop::bool::weighted(0.8), prop_oneof![Just(0u16), any::<u16>(), 0u16..100], prop::bool::weighted(0.8)),
            prop_oneof![3 => any::<u16>(), 1 => Just(2152u16)],
        );
        let damage =
            (prop::option::weighted(0.2, any::<usize>()), prop::option::weighted(0.2, (any::<usize>(), 1u8..)));
        (head, ip, damage).prop_map(|((tags, family, ext, nh), (frag, ihl, l4, lens, dport), (cut, flip))| {
            build(&tags, family, &ext, nh, frag, ihl, &l4, lens, dport, cut, flip)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16384))]

        #[test]
        fn same_as_reference_on_built_frames(f in frame_strategy()) {
            check(&f);
        }

        #[test]
        fn same_as_reference_on_arbitrary_bytes(f in prop::collection::vec(any::<u8>(), 0..128)) {
            check(&f);
        }

        #[test]
        fn same_as_reference_on_ipv6_prefix_and_noise(nh in nh_strategy(), plen in 0u16..80, rest in prop::collection::vec(any::<u8>(), 0..80)) {
            // A valid Ethernet + IPv6 prefix so the random tail reaches the L4/ext parsing.
            let mut f = v6_frame(0, nh, &rest);
            f[18..20].copy_from_slice(&plen.to_be_bytes());
            check(&f);
        }
    }
}
