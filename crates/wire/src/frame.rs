//! The frame parser: one pass over an Ethernet frame (up to two VLAN tags,
//! IPv4 with options and fragments or IPv6 with a bounded extension-header
//! walk, the transport header, GTP-U on UDP port 2152) that yields
//! [`PktMeta`], the facts executors parse once per packet and NFs read:
//! validity, the 5-tuple, L3/L4 offsets, the outer VLAN ID and the GTP-U
//! TEID. NFs reach further into a packet through the checked views it hands
//! out ([`PktMeta::tcp`] with its option iterator, [`PktMeta::icmp`] with the
//! quoted packet of an error). The flow key ([`crate::flow::extract_five_tuple`])
//! is the same walk with fewer checks. A new protocol is added here once.
//!
//! One walk, two levels of acceptance:
//! * **flow key** (`extract_five_tuple`): the headers the key needs must be
//!   in the frame: Ethernet, at most two VLAN tags, an IPv4 header with a
//!   consistent IHL and total length (the datagram may be cut by a capture)
//!   or a fixed IPv6 header and at most [`MAX_EXT_HEADERS`] extension
//!   headers (each one's first bytes), and the ports of TCP, UDP, SCTP,
//!   UDP-Lite and DCCP or the 8-byte ICMP header. Key conventions (fragments,
//!   ICMP echo, protocols without ports) are in [`crate::flow`].
//! * **meta** ([`PktMeta::valid`]): the flow key's rules, and the IP datagram
//!   whole within the frame, each IPv6 extension header whole within the
//!   payload (hop-by-hop only first, one fragment header), a whole TCP
//!   header, a UDP header whose length fits (unless fragmented), a whole ICMP
//!   header, and a valid GTP-U header on UDP port 2152 (unfragmented). One
//!   exception, kept for speed: untagged IPv4 TCP/UDP (not a later fragment)
//!   takes a fast path that checks only the headers up to the ports.
//!
//! Speed: untagged IPv4 TCP/UDP is parsed inline, written straight into the
//! caller's `PktMeta`; untagged IPv6 TCP/UDP without extension headers takes
//! a short out-of-line path; everything else the general walk. Every read is
//! checked once; malformed input gives `valid == false`, never a panic.

use crate::ethernet::EtherType;
use crate::flow::{FiveTuple, FiveTupleV4, FiveTupleV6, FlowError, FLAG_NON_FIRST_FRAGMENT};
use crate::gtpu::GtpuPacket;
use crate::icmp::IcmpView;
use crate::ipv4::IpProtocol;
use crate::ipv6::MAX_EXT_HEADERS;
use crate::tcp::TcpPacket;
use crate::udp::{UdpPacket, GTPU_PORT};

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

const ETHERTYPE_IPV4: u16 = EtherType::IPV4.0;
const ETHERTYPE_IPV6: u16 = EtherType::IPV6.0;

const PROTO_HOPOPT: u8 = IpProtocol::HOPOPT.0;
const PROTO_ICMP: u8 = IpProtocol::ICMP.0;
const PROTO_TCP: u8 = IpProtocol::TCP.0;
const PROTO_UDP: u8 = IpProtocol::UDP.0;
const PROTO_DCCP: u8 = IpProtocol::DCCP.0;
const PROTO_ROUTING: u8 = IpProtocol::IPV6_ROUTE.0;
const PROTO_FRAGMENT: u8 = IpProtocol::IPV6_FRAG.0;
const PROTO_AH: u8 = IpProtocol::AH.0;
const PROTO_ICMPV6: u8 = IpProtocol::ICMPV6.0;
const PROTO_DSTOPTS: u8 = IpProtocol::IPV6_OPTS.0;
const PROTO_SCTP: u8 = IpProtocol::SCTP.0;
const PROTO_UDPLITE: u8 = IpProtocol::UDPLITE.0;

/// Facts about one packet, parsed once per batch by the executor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PktMeta {
    /// The packet is IPv4/IPv6 with a usable flow key.
    pub valid: bool,
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// IP protocol (after IPv6 extension headers).
    pub proto: IpProtocol,
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

    /// Parses `frame` (Ethernet, up to two VLAN tags); see the module docs.
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

    /// The transport header and payload in `frame`: from `l4` to the end of
    /// the IP datagram its length field gives (IPv4 total length, IPv6
    /// payload length). `None` without a transport header or when the
    /// capture cut the datagram short.
    #[inline]
    pub fn l4_bytes<'a>(&self, frame: &'a [u8]) -> Option<&'a [u8]> {
        if self.l4 == 0 {
            return None;
        }
        let l3 = self.l3 as usize;
        let be16 = |at: usize| Some(u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]) as usize);
        let end = if self.v6 { l3 + 40 + be16(l3 + 4)? } else { l3 + be16(l3 + 2)? };
        frame.get(self.l4 as usize..end)
    }

    /// The TCP segment of `frame` (whose meta this is) as a checked view:
    /// header fields, options ([`TcpPacket::option_iter`]) and the payload up
    /// to the datagram's end. `None` for other protocols, or when the header
    /// is cut or its data offset is inconsistent with the IP length.
    #[inline]
    pub fn tcp<'a>(&self, frame: &'a [u8]) -> Option<TcpPacket<&'a [u8]>> {
        if self.proto != IpProtocol::TCP {
            return None;
        }
        TcpPacket::new_checked(self.l4_bytes(frame)?).ok()
    }

    /// The ICMP message of `frame` (ICMP over IPv4, ICMPv6 over IPv6) as a
    /// checked view, up to the datagram's end; an error message's quoted
    /// packet is [`IcmpView::quoted_tuple`]. `None` for other protocols or a
    /// header cut short.
    #[inline]
    pub fn icmp<'a>(&self, frame: &'a [u8]) -> Option<IcmpView<'a>> {
        let want = if self.v6 { IpProtocol::ICMPV6 } else { IpProtocol::ICMP };
        if self.proto != want {
            return None;
        }
        IcmpView::new_checked(self.l4_bytes(frame)?, self.v6).ok()
    }
}

// ---------------------------------------------------------------------------
// Fast paths
// ---------------------------------------------------------------------------

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
    if frag & 0x1fff != 0 || !matches!(proto, PROTO_TCP | PROTO_UDP) {
        return false;
    }
    let l4 = 14 + ihl;
    // The key from whole words, as the walk builds it (see `ports`).
    let addrs = load_u64(f[26..34].first_chunk().unwrap_or(&[0; 8]));
    let ports = u32::from_le_bytes([f[l4], f[l4 + 1], f[l4 + 2], f[l4 + 3]]);
    let dport = u16::from_be_bytes([f[l4 + 2], f[l4 + 3]]);
    m.valid = true;
    m.v6 = false;
    m.vlan = 0;
    m.set_teid(if proto == PROTO_UDP && dport == GTPU_PORT { f.get(l4 + 8..).and_then(gtpu_teid) } else { None });
    m.proto = IpProtocol(proto);
    m.l3 = 14;
    m.l4 = l4 as u16;
    m.tuple = FiveTuple::V4(FiveTupleV4::from_words([addrs, tail_word(ports, proto, 0)]));
    true
}

/// The 5-tuple of an untagged Ethernet + IPv4 + TCP/UDP frame (first
/// fragment or unfragmented) whose datagram holds both ports: exactly what
/// the walk returns for such a frame, without its other fields (the flow
/// key alone, for [`crate::flow::extract_five_tuple`]). `None`: use the walk.
#[inline(always)]
pub(crate) fn ipv4_tuple_fast(f: &[u8]) -> Option<FiveTuple> {
    let h = f.first_chunk::<34>()?;
    if h[12] != 0x08 || h[13] != 0x00 || h[14] >> 4 != 4 {
        return None;
    }
    let ihl = ((h[14] & 0x0f) as usize) * 4;
    let total = u16::from_be_bytes([h[16], h[17]]) as usize;
    let proto = h[23];
    // The walk's conditions: a header of at least 20 bytes, the ports inside
    // both the frame and the datagram the header states, not a later fragment.
    if ihl < 20 || total < ihl + 4 || (h[20] & 0x1f) | h[21] != 0 || !matches!(proto, PROTO_TCP | PROTO_UDP) {
        return None;
    }
    let l4 = 14 + ihl;
    let p = f.get(l4..l4 + 4)?;
    let addrs = load_u64(h[26..34].first_chunk().unwrap_or(&[0; 8]));
    let ports = u32::from_le_bytes([p[0], p[1], p[2], p[3]]);
    Some(FiveTuple::V4(FiveTupleV4::from_words([addrs, tail_word(ports, proto, 0)])))
}

/// The walk's flow key, out of line so the fast paths keep their registers.
#[inline(never)]
pub(crate) fn walk_tuple(f: &[u8]) -> Result<FiveTuple, FlowError> {
    walk::<false>(f).map(|w| w.tuple)
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
/// straight into `m`. It accepts only frames the general walk accepts with
/// the same result (whole TCP/UDP header inside the datagram, sane UDP
/// length, not GTP-U); anything else returns false for the general walk.
#[inline(always)]
fn parse_ipv6_fast(f: &[u8], m: &mut PktMeta) -> bool {
    let Some((h, proto)) = ipv6_fast_case(f) else { return false };
    m.valid = true;
    m.v6 = true;
    m.vlan = 0;
    m.set_teid(None);
    m.proto = IpProtocol(proto);
    m.l3 = 14;
    m.l4 = 14 + 40;
    m.tuple = FiveTuple::V6(ipv6_fast_key(h, proto));
    true
}

/// The IPv6 key of [`crate::flow::extract_five_tuple`]'s common case: the
/// frames [`parse_ipv6_fast`] takes.
#[inline(always)]
pub(crate) fn ipv6_tuple_fast(f: &[u8]) -> Option<FiveTuple> {
    let (h, proto) = ipv6_fast_case(f)?;
    Some(FiveTuple::V6(ipv6_fast_key(h, proto)))
}

/// The IPv6 fast paths' frames: the headers through the UDP header (or TCP's
/// ports), and the protocol. `None`: use the general walk.
#[inline(always)]
fn ipv6_fast_case(f: &[u8]) -> Option<(&[u8; V6_UDP_MIN], u8)> {
    // One length check up front lets every fixed-offset read below go unchecked.
    let h = f.first_chunk::<V6_UDP_MIN>()?;
    if h[12] != 0x86 || h[13] != 0xdd || h[14] >> 4 != 6 {
        return None;
    }
    let proto = h[20];
    let plen = u16::from_be_bytes([h[18], h[19]]) as usize;
    // Padding after the datagram is fine, a datagram cut short is not.
    if 14 + 40 + plen > f.len() {
        return None;
    }
    let dport = u16::from_be_bytes([h[56], h[57]]);
    if proto == PROTO_UDP {
        let ulen = u16::from_be_bytes([h[58], h[59]]) as usize;
        // GTP-U (port 2152) needs its header validated: general walk.
        if plen < 8 || ulen < 8 || ulen > plen || dport == GTPU_PORT {
            return None;
        }
    } else if proto == PROTO_TCP {
        let off = *f.get(14 + 40 + 12)?;
        let hl = ((off >> 4) as usize) * 4;
        if plen < 20 || hl < 20 || hl > plen {
            return None;
        }
    } else {
        return None;
    }
    Some((h, proto))
}

/// The key of an [`ipv6_fast_case`] frame.
#[inline(always)]
fn ipv6_fast_key(h: &[u8; V6_UDP_MIN], proto: u8) -> FiveTupleV6 {
    let a: [u64; 4] = core::array::from_fn(|i| load_u64(h[22 + 8 * i..30 + 8 * i].first_chunk().unwrap_or(&[0; 8])));
    let ports = u32::from_le_bytes([h[54], h[55], h[56], h[57]]);
    FiveTupleV6::from_words([a[0], a[1], a[2], a[3], tail_word(ports, proto, 0)])
}

/// Everything else: the general walk with the meta's checks.
#[inline(never)]
fn parse_general(f: &[u8]) -> PktMeta {
    let Ok(w) = walk::<true>(f) else { return PktMeta::default() };
    PktMeta {
        valid: true,
        v6: !w.tuple.is_ipv4(),
        proto: IpProtocol(w.tuple.proto()),
        l3: w.l3 as u16,
        l4: w.l4 as u16,
        tuple: w.tuple,
        vlan: w.vlan,
        teid: w.teid.unwrap_or(0),
        has_teid: w.teid.is_some(),
    }
}

// ---------------------------------------------------------------------------
// The general walk
// ---------------------------------------------------------------------------

/// What one walk found.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Walk {
    /// The flow key.
    pub(crate) tuple: FiveTuple,
    /// Outer VLAN ID, 0 if untagged.
    pub(crate) vlan: u16,
    /// Offset of the IP header.
    pub(crate) l3: usize,
    /// Offset of the transport header; 0 for a non-first fragment.
    pub(crate) l4: usize,
    /// GTP-U TEID (meta level only).
    pub(crate) teid: Option<u32>,
}

/// `N` bytes at `off`, or `Truncated`. Two length checks, no panic path.
#[inline(always)]
fn chunk<const N: usize>(buf: &[u8], off: usize) -> Result<&[u8; N], FlowError> {
    buf.get(off..).and_then(|s| s.first_chunk::<N>()).ok_or(FlowError::Truncated)
}

#[inline(always)]
fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

#[inline(always)]
fn is_vlan(ethertype: u16) -> bool {
    EtherType(ethertype).is_vlan()
}

/// Transport "ports" at `l4` of `ip` (the datagram), as the 4 wire bytes
/// (sport, dport) loaded little-endian: one 32-bit load, placed into the key
/// with shifts. Building keys from whole words (not byte stores) matters: the
/// hash reads them back as u64 and byte stores would defeat store forwarding.
#[inline(always)]
fn ports(ip: &[u8], l4: usize, proto: u8) -> Result<u32, FlowError> {
    // TCP and UDP first with plain compares: a `match` over all protocols
    // compiles to a jump table, i.e. an indirect branch on every packet.
    if proto == PROTO_TCP || proto == PROTO_UDP {
        Ok(u32::from_le_bytes(*chunk::<4>(ip, l4)?))
    } else {
        other_ports(ip, l4, proto)
    }
}

#[inline(never)]
fn other_ports(ip: &[u8], l4: usize, proto: u8) -> Result<u32, FlowError> {
    match proto {
        PROTO_SCTP | PROTO_UDPLITE | PROTO_DCCP => Ok(u32::from_le_bytes(*chunk::<4>(ip, l4)?)),
        PROTO_ICMP | PROTO_ICMPV6 => {
            let h = chunk::<8>(ip, l4)?;
            // Echo request/reply (ICMP 8/0, ICMPv6 128/129): identifier as both ports.
            let echo = if proto == PROTO_ICMP { h[0] == 8 || h[0] == 0 } else { h[0] == 128 || h[0] == 129 };
            Ok(if echo { u32::from_le_bytes([h[4], h[5], h[4], h[5]]) } else { 0 })
        }
        _ => Ok(0),
    }
}

/// Last key word of both tuple layouts: ports(4) proto(1) flags(1) zero(2), little-endian.
#[inline(always)]
fn tail_word(ports: u32, proto: u8, flags: u8) -> u64 {
    ports as u64 | (proto as u64) << 32 | (flags as u64) << 40
}

#[inline(always)]
fn load_u64(b: &[u8; 8]) -> u64 {
    u64::from_le_bytes(*b)
}

/// The meta's transport checks on `seg` (transport header to the end of the
/// datagram), through the header views: a whole TCP header; a UDP header and,
/// unless `fragment`, a length that fits and a valid GTP-U header on port
/// 2152 (whose TEID is returned); a whole ICMP header.
#[inline(never)]
fn check_l4(seg: &[u8], proto: u8, fragment: bool) -> Result<Option<u32>, FlowError> {
    let bad = |e: crate::error::WireError| match e {
        crate::error::WireError::Truncated => FlowError::Truncated,
        _ => FlowError::BadHeader,
    };
    match proto {
        PROTO_TCP => TcpPacket::new_checked(seg).map(|_| None).map_err(bad),
        PROTO_UDP if fragment => chunk::<8>(seg, 0).map(|_| None),
        PROTO_UDP => {
            let u = UdpPacket::new_checked(seg).map_err(bad)?;
            if u.dst_port() != GTPU_PORT {
                return Ok(None);
            }
            let g = GtpuPacket::new_checked(u.payload()).map_err(bad)?;
            Ok(Some(g.teid()))
        }
        PROTO_ICMP | PROTO_ICMPV6 => chunk::<{ crate::icmp::HEADER_LEN }>(seg, 0).map(|_| None),
        _ => Ok(None),
    }
}

/// Walks `frame`. `STRICT` adds the meta's checks (see the module docs) and
/// reads the TEID; without it this is the flow key's walk, whose errors
/// [`crate::flow::extract_five_tuple`] reports.
#[inline(always)]
pub(crate) fn walk<const STRICT: bool>(frame: &[u8]) -> Result<Walk, FlowError> {
    let eth = chunk::<14>(frame, 0)?;
    match be16([eth[12], eth[13]]) {
        ETHERTYPE_IPV4 => walk_ipv4::<STRICT>(frame, 14, 0),
        ETHERTYPE_IPV6 => walk_ipv6::<STRICT>(frame, 14, 0),
        other => walk_tagged::<STRICT>(frame, other),
    }
}

/// VLAN-tagged (or non-IP) frames, out of the untagged fast path.
#[inline(never)]
fn walk_tagged<const STRICT: bool>(frame: &[u8], mut ethertype: u16) -> Result<Walk, FlowError> {
    let mut off = 14;
    let mut vlan = 0;
    if is_vlan(ethertype) {
        let tag = chunk::<4>(frame, off)?;
        vlan = be16([tag[0], tag[1]]) & 0x0fff;
        ethertype = be16([tag[2], tag[3]]);
        off += 4;
        if is_vlan(ethertype) {
            let tag = chunk::<4>(frame, off)?;
            ethertype = be16([tag[2], tag[3]]);
            off += 4;
            if is_vlan(ethertype) {
                return Err(FlowError::TooManyHeaders);
            }
        }
    }
    match ethertype {
        ETHERTYPE_IPV4 => walk_ipv4::<STRICT>(frame, off, vlan),
        ETHERTYPE_IPV6 => walk_ipv6::<STRICT>(frame, off, vlan),
        _ => Err(FlowError::NotIp),
    }
}

#[inline(always)]
fn walk_ipv4<const STRICT: bool>(frame: &[u8], off: usize, vlan: u16) -> Result<Walk, FlowError> {
    let ip = chunk::<20>(frame, off)?;
    let ihl = (ip[0] & 0x0f) as usize * 4;
    let total = be16([ip[2], ip[3]]) as usize;
    if ip[0] >> 4 != 4 || ihl < 20 || total < ihl {
        return Err(FlowError::BadHeader);
    }
    // Ethernet may pad short datagrams; a capture may cut long ones (the meta refuses those).
    if STRICT && off + total > frame.len() {
        return Err(FlowError::Truncated);
    }
    let end = frame.len().min(off + total);
    let l4 = off + ihl;
    if l4 > end {
        return Err(FlowError::Truncated);
    }
    let proto = ip[9];
    let addrs = load_u64(ip[12..20].first_chunk().unwrap_or(&[0; 8]));
    let frag = be16([ip[6], ip[7]]);
    let later = frag & 0x1fff != 0;
    let (tail, teid) = if later {
        (tail_word(0, proto, FLAG_NON_FIRST_FRAGMENT), None)
    } else {
        // `end <= frame.len()`, so the slice is in range; `get` keeps it panic-free.
        let dgram = frame.get(..end).ok_or(FlowError::Truncated)?;
        let teid = if STRICT { check_l4(dgram.get(l4..).unwrap_or(&[]), proto, frag & 0x2000 != 0)? } else { None };
        (tail_word(ports(dgram, l4, proto)?, proto, 0), teid)
    };
    let tuple = FiveTuple::V4(FiveTupleV4::from_words([addrs, tail]));
    Ok(Walk { tuple, vlan, l3: off, l4: if later { 0 } else { l4 }, teid })
}

#[inline(always)]
fn is_ipv6_ext(nh: u8) -> bool {
    matches!(nh, PROTO_HOPOPT | PROTO_ROUTING | PROTO_FRAGMENT | PROTO_AH | PROTO_DSTOPTS)
}

#[inline(always)]
fn walk_ipv6<const STRICT: bool>(frame: &[u8], off: usize, vlan: u16) -> Result<Walk, FlowError> {
    let ip = chunk::<40>(frame, off)?;
    if ip[0] >> 4 != 6 {
        return Err(FlowError::BadHeader);
    }
    let plen = be16([ip[4], ip[5]]) as usize;
    // End of the payload as the header states it: the meta needs all of it.
    let pend = off + 40 + plen;
    if STRICT && pend > frame.len() {
        return Err(FlowError::Truncated);
    }
    // Payload length 0 means a jumbogram (RFC 2675): the key bounds it by the frame only.
    let end = if plen == 0 { frame.len() } else { frame.len().min(pend) };
    let dgram = frame.get(..end).ok_or(FlowError::Truncated)?;
    let a: [u64; 4] = core::array::from_fn(|i| load_u64(ip[8 + 8 * i..16 + 8 * i].first_chunk().unwrap_or(&[0; 8])));
    let mut nh = ip[6];
    let mut l4 = off + 40;
    let mut fragment = false;
    if is_ipv6_ext(nh) {
        match walk_ipv6_ext::<STRICT>(dgram, nh, l4, pend)? {
            ExtWalk::Transport(n, at, more) => (nh, l4, fragment) = (n, at, more),
            ExtWalk::NonFirstFragment(n) => {
                let words = [a[0], a[1], a[2], a[3], tail_word(0, n, FLAG_NON_FIRST_FRAGMENT)];
                let tuple = FiveTuple::V6(FiveTupleV6::from_words(words));
                return Ok(Walk { tuple, vlan, l3: off, l4: 0, teid: None });
            }
        }
    }
    let teid = if STRICT { check_l4(frame.get(l4..pend).unwrap_or(&[]), nh, fragment)? } else { None };
    let words = [a[0], a[1], a[2], a[3], tail_word(ports(dgram, l4, nh)?, nh, 0)];
    Ok(Walk { tuple: FiveTuple::V6(FiveTupleV6::from_words(words)), vlan, l3: off, l4, teid })
}

/// Where an IPv6 extension-header chain ends.
enum ExtWalk {
    /// (next header, its offset, a first fragment with more to come).
    Transport(u8, usize, bool),
    /// A later fragment of a datagram whose transport is the next header.
    NonFirstFragment(u8),
}

/// Walks at most [`MAX_EXT_HEADERS`] extension headers (out of line: rare).
/// `STRICT`: each header whole before `pend` (the payload's end), hop-by-hop
/// only first, one fragment header.
#[inline(never)]
fn walk_ipv6_ext<const STRICT: bool>(
    dgram: &[u8],
    mut nh: u8,
    mut l4: usize,
    pend: usize,
) -> Result<ExtWalk, FlowError> {
    let mut frag_seen = false;
    let mut more = false;
    for i in 0..MAX_EXT_HEADERS {
        match nh {
            PROTO_HOPOPT | PROTO_ROUTING | PROTO_DSTOPTS | PROTO_AH => {
                if STRICT && nh == PROTO_HOPOPT && i != 0 {
                    return Err(FlowError::BadHeader);
                }
                let h = chunk::<2>(dgram, l4)?;
                // AH counts 4-octet units minus 2 (RFC 4302); the others 8-octet units minus 1.
                let len = if nh == PROTO_AH { (h[1] as usize + 2) * 4 } else { (h[1] as usize + 1) * 8 };
                if STRICT && l4 + len > pend {
                    return Err(FlowError::Truncated);
                }
                nh = h[0];
                l4 += len;
            }
            PROTO_FRAGMENT => {
                if STRICT && frag_seen {
                    return Err(FlowError::BadHeader);
                }
                if STRICT && l4 + 8 > pend {
                    return Err(FlowError::Truncated);
                }
                let h = chunk::<8>(dgram, l4)?;
                frag_seen = true;
                more = h[3] & 1 != 0;
                nh = h[0];
                l4 += 8;
                if be16([h[2], h[3]]) >> 3 != 0 {
                    return Ok(ExtWalk::NonFirstFragment(nh));
                }
            }
            _ => return Ok(ExtWalk::Transport(nh, l4, more)),
        }
    }
    if is_ipv6_ext(nh) {
        Err(FlowError::TooManyHeaders)
    } else {
        Ok(ExtWalk::Transport(nh, l4, more))
    }
}

/// The datagram an IP fragment belongs to ([`fragment_of`]): what a fragment
/// table keys it by and where its data sits in the datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragment {
    /// IPv6 (addresses are 16 bytes) or IPv4 (the first 4 bytes of each).
    pub v6: bool,
    /// Source address.
    pub src: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
    /// Identification (IPv4: 16 bits; IPv6: the Fragment header's 32).
    pub id: u32,
    /// The datagram's transport protocol (IPv6: the Fragment header's next header).
    pub proto: u8,
    /// Offset of this fragment's data in the datagram's fragmentable part, bytes.
    pub offset: u32,
    /// Bytes of data this fragment carries (the IP payload; IPv6: after the Fragment header).
    pub len: u32,
    /// More fragments follow.
    pub more: bool,
}

impl Fragment {
    /// The fragment carrying the datagram's start (the transport header).
    pub fn is_first(&self) -> bool {
        self.offset == 0
    }
}

/// The fragment `frame` is (Ethernet, up to two VLAN tags, IPv4 with its
/// MF flag or an offset; IPv6 with a Fragment extension header, after
/// hop-by-hop, routing, destination-options or AH headers, at most
/// [`MAX_EXT_HEADERS`]), or `None`: not a fragment (an IPv6 atomic fragment,
/// offset 0 without M, is a whole datagram), not IP, or cut short. Reads
/// headers only; never panics.
pub fn fragment_of(frame: &[u8]) -> Option<Fragment> {
    let mut off = 12;
    let mut et = be16(*chunk::<2>(frame, off).ok()?);
    for _ in 0..2 {
        if !is_vlan(et) {
            break;
        }
        off += 4;
        et = be16(*chunk::<2>(frame, off).ok()?);
    }
    let l3 = off + 2;
    let ip = frame.get(l3..)?;
    let (mut src, mut dst) = ([0u8; 16], [0u8; 16]);
    match et {
        ETHERTYPE_IPV4 => {
            let h = chunk::<20>(ip, 0).ok()?;
            let frag = be16([h[6], h[7]]);
            if frag & 0x3fff == 0 || h[0] >> 4 != 4 {
                return None;
            }
            let ihl = u32::from(h[0] & 0x0f) * 4;
            src[..4].copy_from_slice(&h[12..16]);
            dst[..4].copy_from_slice(&h[16..20]);
            Some(Fragment {
                v6: false,
                src,
                dst,
                id: u32::from(be16([h[4], h[5]])),
                proto: h[9],
                offset: u32::from(frag & 0x1fff) * 8,
                len: u32::from(be16([h[2], h[3]])).saturating_sub(ihl),
                more: frag & 0x2000 != 0,
            })
        }
        ETHERTYPE_IPV6 => {
            let h = chunk::<40>(ip, 0).ok()?;
            if h[0] >> 4 != 6 {
                return None;
            }
            src.copy_from_slice(&h[8..24]);
            dst.copy_from_slice(&h[24..40]);
            let plen = u32::from(be16([h[4], h[5]]));
            let (mut nh, mut at) = (h[6], 40usize);
            for _ in 0..MAX_EXT_HEADERS {
                match nh {
                    PROTO_HOPOPT | PROTO_ROUTING | PROTO_DSTOPTS | PROTO_AH => {
                        let e = chunk::<2>(ip, at).ok()?;
                        at += if nh == PROTO_AH { (e[1] as usize + 2) * 4 } else { (e[1] as usize + 1) * 8 };
                        nh = e[0];
                    }
                    PROTO_FRAGMENT => {
                        let e = chunk::<8>(ip, at).ok()?;
                        let (offset, more) = (u32::from(be16([e[2], e[3]]) >> 3) * 8, e[3] & 1 != 0);
                        if offset == 0 && !more {
                            return None;
                        }
                        let used = (at + 8 - 40) as u32;
                        return Some(Fragment {
                            v6: true,
                            src,
                            dst,
                            id: u32::from_be_bytes([e[4], e[5], e[6], e[7]]),
                            proto: e[0],
                            offset,
                            len: plen.saturating_sub(used),
                            more,
                        });
                    }
                    _ => return None,
                }
            }
            None
        }
        _ => None,
    }
}
