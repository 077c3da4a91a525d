//! What a stateful NF sees of a packet: its bytes, facts parsed once per
//! batch by the executor ([`PktMeta`]), and rewriting helpers that keep the
//! IPv4 header checksum and the TCP/UDP checksum valid incrementally (RFC 1624).

use std::net::Ipv4Addr;

use flowplane_wire::checksum::{update16, update32};
use flowplane_wire::flow::{extract_five_tuple, FiveTuple, FiveTupleV4};

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
}

impl PktMeta {
    /// Parses `frame` (Ethernet, up to two VLAN tags). IPv4 takes an inline
    /// fast path; IPv6 (extension headers) and oddities go through the
    /// general parser. Malformed input yields `valid == false`, never a panic.
    #[inline]
    pub fn parse(frame: &[u8]) -> PktMeta {
        let mut m = PktMeta::default();
        m.parse_into(frame);
        m
    }

    /// Parses `frame` into `self` in place. Writing the fields where they
    /// live (instead of building a value and copying it) avoids a
    /// store-forwarding stall per packet in the executor's parse loop.
    #[inline]
    pub fn parse_into(&mut self, frame: &[u8]) {
        if !parse_ipv4_fast(frame, self) {
            *self = parse_general(frame);
        }
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
    m.proto = proto;
    m.l3 = 14;
    m.l4 = l4 as u16;
    m.tuple = FiveTuple::V4(FiveTupleV4::new(src, dst, sport, dport, proto));
    true
}

fn parse_general(f: &[u8]) -> PktMeta {
    let Ok(tuple) = extract_five_tuple(f) else { return PktMeta::default() };
    let Ok(info) = flowplane_wire::packet_repr::parse_frame(f) else {
        return PktMeta::default();
    };
    PktMeta {
        valid: true,
        v6: info.ip_version == 6,
        proto: tuple.proto(),
        l3: info.l3_offset as u16,
        l4: info.l4_offset.map_or(0, |o| o as u16),
        tuple,
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

    fn fix_l4_checksum32(&mut self, old: u32, new: u32) {
        if let Some(at) = self.l4_checksum_at() {
            let c = u16::from_be_bytes([self.data[at], self.data[at + 1]]);
            let mut n = update32(c, old, new);
            if self.meta.proto == proto::UDP && n == 0 {
                n = 0xffff; // RFC 768: a computed zero is sent as all ones
            }
            self.data[at..at + 2].copy_from_slice(&n.to_be_bytes());
        }
    }

    fn fix_l4_checksum16(&mut self, old: u16, new: u16) {
        if let Some(at) = self.l4_checksum_at() {
            let c = u16::from_be_bytes([self.data[at], self.data[at + 1]]);
            let mut n = update16(c, old, new);
            if self.meta.proto == proto::UDP && n == 0 {
                n = 0xffff;
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
        self.fix_l4_checksum32(old, newv);
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
        self.fix_l4_checksum16(old, port);
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
