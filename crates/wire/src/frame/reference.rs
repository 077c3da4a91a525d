//! Test oracle: the parsers as they were before the frame parser was made
//! one (the flow-key parser of `flow.rs`, `packet_repr::parse_frame` on the
//! header views, and `PktMeta::parse` combining them behind the IPv4 fast
//! path), kept verbatim in substance so the proptests in `tests.rs` prove
//! the one walk accepts and reports exactly what they did. A deliberate
//! change of what the parser accepts changes this oracle with it.

#![allow(dead_code)]

use std::net::Ipv4Addr;

use crate::ethernet::{self, EtherType, EthernetFrame};
use crate::flow::{FiveTuple, FiveTupleV4, FiveTupleV6, FlowError, FLAG_NON_FIRST_FRAGMENT};
use crate::gtpu::GtpuPacket;
use crate::icmp;
use crate::ipv4::{IpProtocol, Ipv4Packet};
use crate::ipv6::{self, Ipv6Packet};
use crate::tcp::TcpPacket;
use crate::udp::{self, UdpPacket};
use crate::vlan;

use super::PktMeta;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88A8;
const ETHERTYPE_QINQ_OLD: u16 = 0x9100;

const PROTO_HOPOPT: u8 = 0;
const PROTO_ICMP: u8 = 1;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_DCCP: u8 = 33;
const PROTO_ROUTING: u8 = 43;
const PROTO_FRAGMENT: u8 = 44;
const PROTO_AH: u8 = 51;
const PROTO_ICMPV6: u8 = 58;
const PROTO_DSTOPTS: u8 = 60;
const PROTO_SCTP: u8 = 132;
const PROTO_UDPLITE: u8 = 136;
const MAX_IPV6_EXT_HEADERS: usize = 8;

// ---------------------------------------------------------------------------
// The flow-key parser (old `flow::extract_five_tuple`)
// ---------------------------------------------------------------------------

/// `N` bytes at `off`, or `Truncated`. Two length checks, no panic path.
fn chunk<const N: usize>(buf: &[u8], off: usize) -> Result<&[u8; N], FlowError> {
    buf.get(off..).and_then(|s| s.first_chunk::<N>()).ok_or(FlowError::Truncated)
}

fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

/// Everything the key extractors need from one parse.
struct Parsed {
    tuple: FiveTuple,
    /// Outer VLAN ID, 0 if untagged.
    vlan: u16,
    /// Offset of the transport header.
    l4: usize,
    /// End of the IP datagram within the frame.
    end: usize,
}

fn is_vlan(ethertype: u16) -> bool {
    ethertype == ETHERTYPE_VLAN || ethertype == ETHERTYPE_QINQ || ethertype == ETHERTYPE_QINQ_OLD
}

/// Transport "ports" at `l4` of `ip` (the datagram), as the 4 wire bytes
/// (sport, dport) loaded little-endian: one 32-bit load, placed into the key
/// with shifts. Building keys from whole words (not byte stores) matters: the
/// hash reads them back as u64 and byte stores would defeat store forwarding.
fn ports(ip: &[u8], l4: usize, proto: u8) -> Result<u32, FlowError> {
    // TCP and UDP first with plain compares: a `match` over all protocols
    // compiles to a jump table, i.e. an indirect branch on every packet.
    if proto == PROTO_TCP || proto == PROTO_UDP {
        Ok(u32::from_le_bytes(*chunk::<4>(ip, l4)?))
    } else {
        other_ports(ip, l4, proto)
    }
}

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
fn tail_word(ports: u32, proto: u8, flags: u8) -> u64 {
    ports as u64 | (proto as u64) << 32 | (flags as u64) << 40
}

fn load_u64(b: &[u8; 8]) -> u64 {
    u64::from_le_bytes(*b)
}

fn parse(frame: &[u8]) -> Result<Parsed, FlowError> {
    let eth = chunk::<14>(frame, 0)?;
    match be16([eth[12], eth[13]]) {
        ETHERTYPE_IPV4 => parse_ipv4(frame, 14, 0),
        ETHERTYPE_IPV6 => parse_ipv6(frame, 14, 0),
        other => parse_tagged(frame, other),
    }
}

/// VLAN-tagged (or non-IP) frames, out of the untagged fast path.
fn parse_tagged(frame: &[u8], mut ethertype: u16) -> Result<Parsed, FlowError> {
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
        ETHERTYPE_IPV4 => parse_ipv4(frame, off, vlan),
        ETHERTYPE_IPV6 => parse_ipv6(frame, off, vlan),
        _ => Err(FlowError::NotIp),
    }
}

fn parse_ipv4(frame: &[u8], off: usize, vlan: u16) -> Result<Parsed, FlowError> {
    let ip = chunk::<20>(frame, off)?;
    let ihl = (ip[0] & 0x0f) as usize * 4;
    let total = be16([ip[2], ip[3]]) as usize;
    if ip[0] >> 4 != 4 || ihl < 20 || total < ihl {
        return Err(FlowError::BadHeader);
    }
    // Ethernet may pad short datagrams; a capture may cut long ones.
    let end = frame.len().min(off + total);
    let l4 = off + ihl;
    if l4 > end {
        return Err(FlowError::Truncated);
    }
    let proto = ip[9];
    let addrs = load_u64(ip[12..20].first_chunk().unwrap_or(&[0; 8]));
    let tail = if be16([ip[6], ip[7]]) & 0x1fff != 0 {
        tail_word(0, proto, FLAG_NON_FIRST_FRAGMENT)
    } else {
        // `end <= frame.len()`, so the slice is in range; `get` keeps it panic-free.
        let dgram = frame.get(..end).ok_or(FlowError::Truncated)?;
        tail_word(ports(dgram, l4, proto)?, proto, 0)
    };
    Ok(Parsed { tuple: FiveTuple::V4(FiveTupleV4::from_words([addrs, tail])), vlan, l4, end })
}

fn is_ipv6_ext(nh: u8) -> bool {
    matches!(nh, PROTO_HOPOPT | PROTO_ROUTING | PROTO_FRAGMENT | PROTO_AH | PROTO_DSTOPTS)
}

fn parse_ipv6(frame: &[u8], off: usize, vlan: u16) -> Result<Parsed, FlowError> {
    let ip = chunk::<40>(frame, off)?;
    if ip[0] >> 4 != 6 {
        return Err(FlowError::BadHeader);
    }
    let plen = be16([ip[4], ip[5]]) as usize;
    // Payload length 0 means a jumbogram (RFC 2675): bounded by the frame only.
    let end = if plen == 0 { frame.len() } else { frame.len().min(off + 40 + plen) };
    let dgram = frame.get(..end).ok_or(FlowError::Truncated)?;
    let a: [u64; 4] = core::array::from_fn(|i| load_u64(ip[8 + 8 * i..16 + 8 * i].first_chunk().unwrap_or(&[0; 8])));
    let mut nh = ip[6];
    let mut l4 = off + 40;
    if is_ipv6_ext(nh) {
        match walk_ipv6_ext(dgram, nh, l4)? {
            ExtWalk::Transport(n, at) => (nh, l4) = (n, at),
            ExtWalk::NonFirstFragment(n, at) => {
                let words = [a[0], a[1], a[2], a[3], tail_word(0, n, FLAG_NON_FIRST_FRAGMENT)];
                return Ok(Parsed { tuple: FiveTuple::V6(FiveTupleV6::from_words(words)), vlan, l4: at, end });
            }
        }
    }
    let words = [a[0], a[1], a[2], a[3], tail_word(ports(dgram, l4, nh)?, nh, 0)];
    Ok(Parsed { tuple: FiveTuple::V6(FiveTupleV6::from_words(words)), vlan, l4, end })
}

/// Where an IPv6 extension-header chain ends: (next header, offset).
enum ExtWalk {
    Transport(u8, usize),
    NonFirstFragment(u8, usize),
}

/// Walks at most [`MAX_IPV6_EXT_HEADERS`] extension headers (out of line: rare).
fn walk_ipv6_ext(dgram: &[u8], mut nh: u8, mut l4: usize) -> Result<ExtWalk, FlowError> {
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        match nh {
            PROTO_HOPOPT | PROTO_ROUTING | PROTO_DSTOPTS => {
                let h = chunk::<2>(dgram, l4)?;
                nh = h[0];
                l4 += (h[1] as usize + 1) * 8;
            }
            PROTO_AH => {
                let h = chunk::<2>(dgram, l4)?;
                nh = h[0];
                l4 += (h[1] as usize + 2) * 4;
            }
            PROTO_FRAGMENT => {
                let h = chunk::<8>(dgram, l4)?;
                nh = h[0];
                l4 += 8;
                if be16([h[2], h[3]]) >> 3 != 0 {
                    return Ok(ExtWalk::NonFirstFragment(nh, l4));
                }
            }
            _ => return Ok(ExtWalk::Transport(nh, l4)),
        }
    }
    if is_ipv6_ext(nh) {
        Err(FlowError::TooManyHeaders)
    } else {
        Ok(ExtWalk::Transport(nh, l4))
    }
}

/// Parses an Ethernet frame down to its 5-tuple (see the module docs for the
/// conventions on fragments, ICMP and port-less protocols).
pub(super) fn extract_five_tuple(frame: &[u8]) -> Result<FiveTuple, FlowError> {
    parse(frame).map(|p| p.tuple)
}

// ---------------------------------------------------------------------------
// The view-based whole-frame parser (old `packet_repr::parse_frame`)
// ---------------------------------------------------------------------------

/// The facts of the old `FrameInfo` that `PktMeta` used.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct FrameInfo {
    pub vlan_count: u8,
    pub vlan_ids: [u16; 2],
    pub l3_offset: usize,
    pub ip_version: u8,
    pub protocol: IpProtocol,
    pub l4_offset: Option<usize>,
    pub end: usize,
    pub is_fragment: bool,
    pub frag_offset: u16,
    pub teid: Option<u32>,
}

pub(super) fn parse_frame(frame: &[u8]) -> crate::error::Result<FrameInfo> {
    use crate::error::WireError;
    let eth = EthernetFrame::new_checked(frame)?;
    let tags = vlan::skip_vlan_tags(eth.payload(), eth.ethertype(), 4)?;
    let l3 = ethernet::HEADER_LEN + tags.offset;
    let mut info = FrameInfo {
        vlan_count: tags.count,
        vlan_ids: [tags.vids[0], tags.vids[1]],
        l3_offset: l3,
        end: frame.len(),
        ..FrameInfo::default()
    };
    let l3_bytes = &frame[l3..];
    let (l4, end) = match tags.ethertype {
        EtherType::IPV4 => {
            let ip = Ipv4Packet::new_checked(l3_bytes)?;
            info.ip_version = 4;
            info.protocol = ip.protocol();
            info.is_fragment = ip.is_fragment();
            info.frag_offset = ip.frag_offset();
            (l3 + ip.header_len(), l3 + ip.total_len() as usize)
        }
        EtherType::IPV6 => {
            let ip = Ipv6Packet::new_checked(l3_bytes)?;
            let ext = ip.upper_layer()?;
            info.ip_version = 6;
            info.protocol = ext.protocol;
            if let Some(f) = ext.fragment {
                info.frag_offset = f.frag_offset;
                info.is_fragment = f.frag_offset != 0 || f.more_frags;
            }
            (l3 + ipv6::HEADER_LEN + ext.offset, l3 + ipv6::HEADER_LEN + ip.payload_len() as usize)
        }
        _ => return Ok(info),
    };
    info.end = end;
    if info.frag_offset != 0 {
        return Ok(info);
    }
    info.l4_offset = Some(l4);
    let seg = &frame[l4..end];
    match info.protocol {
        IpProtocol::TCP => {
            TcpPacket::new_checked(seg)?;
        }
        IpProtocol::UDP => {
            if seg.len() < udp::HEADER_LEN {
                return Err(WireError::Truncated);
            }
            if !info.is_fragment {
                let dgram = UdpPacket::new_checked(seg)?;
                if dgram.dst_port() == udp::GTPU_PORT {
                    let g = GtpuPacket::new_checked(dgram.payload())?;
                    g.layout()?;
                    info.teid = Some(g.teid());
                }
            }
        }
        IpProtocol::ICMP | IpProtocol::ICMPV6 if seg.len() < icmp::HEADER_LEN => return Err(WireError::Truncated),
        _ => {}
    }
    Ok(info)
}

// ---------------------------------------------------------------------------
// The old `PktMeta::parse`: IPv4 fast path, else both parsers must accept
// ---------------------------------------------------------------------------

/// The old IPv4 fast path.
fn ipv4_fast(f: &[u8]) -> Option<PktMeta> {
    if f.len() < 34 || f[12] != 0x08 || f[13] != 0x00 {
        return None;
    }
    let vihl = f[14];
    let ihl = ((vihl & 0x0f) as usize) * 4;
    if vihl >> 4 != 4 || ihl < 20 || f.len() < 14 + ihl + 4 {
        return None;
    }
    let frag = u16::from_be_bytes([f[20], f[21]]);
    let proto = f[23];
    if frag & 0x1fff != 0 || !matches!(proto, PROTO_TCP | PROTO_UDP) {
        return None;
    }
    let l4 = 14 + ihl;
    let src = Ipv4Addr::new(f[26], f[27], f[28], f[29]);
    let dst = Ipv4Addr::new(f[30], f[31], f[32], f[33]);
    let sport = u16::from_be_bytes([f[l4], f[l4 + 1]]);
    let dport = u16::from_be_bytes([f[l4 + 2], f[l4 + 3]]);
    let teid = if proto == PROTO_UDP && dport == 2152 {
        f.get(l4 + 8..)
            .and_then(|g| g.first_chunk::<8>())
            .and_then(|h| (h[0] >> 5 == 1 && h[0] & 0x10 != 0).then(|| u32::from_be_bytes([h[4], h[5], h[6], h[7]])))
    } else {
        None
    };
    Some(PktMeta {
        valid: true,
        v6: false,
        proto: IpProtocol(proto),
        l3: 14,
        l4: l4 as u16,
        tuple: FiveTuple::V4(FiveTupleV4::new(src, dst, sport, dport, proto)),
        vlan: 0,
        teid: teid.unwrap_or(0),
        has_teid: teid.is_some(),
    })
}

/// What `PktMeta::parse` returned before the frame parser was made one.
pub(super) fn meta(f: &[u8]) -> PktMeta {
    if let Some(m) = ipv4_fast(f) {
        return m;
    }
    let Ok(tuple) = extract_five_tuple(f) else { return PktMeta::default() };
    let Ok(info) = parse_frame(f) else { return PktMeta::default() };
    PktMeta {
        valid: true,
        v6: info.ip_version == 6,
        proto: IpProtocol(tuple.proto()),
        l3: info.l3_offset as u16,
        l4: info.l4_offset.map_or(0, |o| o as u16),
        tuple,
        vlan: info.vlan_ids[0],
        teid: info.teid.unwrap_or(0),
        has_teid: info.teid.is_some(),
    }
}
