//! Flow keys and the fast-path parser that extracts them from raw frames.
//!
//! This module owns every key kind a flow table can be indexed by:
//! [`FiveTupleV4`] (16 bytes), [`FiveTupleV6`] (40 bytes), [`FiveTuple`]
//! (either), [`SrcIpKey`], [`DstIpKey`], [`IpPairKey`], [`TeidKey`] and
//! [`CustomKey`] (a user-chosen [`FieldSet`]). Keys are stored as fixed byte
//! arrays in wire order with padding zeroed, so `Eq`, `Hash` and the table hash
//! ([`crate::hash`]) all see the same canonical bytes without `unsafe`.
//!
//! [`extract_five_tuple`] parses Ethernet (up to two VLAN tags), IPv4 (with
//! options, fragments) or IPv6 (with a bounded walk over extension headers) and
//! the transport ports, directly on the raw bytes: it does not build header
//! views, checks each read once, and never panics.
//!
//! Conventions:
//! * Non-first fragments carry no transport header: ports are 0 and
//!   [`FLAG_NON_FIRST_FRAGMENT`] is set in the key (so they never alias a real
//!   port-0 flow). First fragments are keyed like unfragmented packets.
//! * ICMP / ICMPv6 echo request and reply use the identifier as *both* ports,
//!   so a request's [`FiveTuple::reversed`] equals its reply. Other ICMP: 0.
//! * Protocols without ports (GRE, ESP, ...) have ports 0.
//! * IPv4 addresses in the 16-byte address keys are IPv4-mapped
//!   (`::ffff:a.b.c.d`); that prefix must not appear on the wire in IPv6
//!   headers (RFC 4291 §2.5.5.2), so the two families do not collide in practice.

use core::fmt;
use core::str::FromStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::hash::{hash16, hash16_64, hash40, hash40_64, HashableKey};

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

/// UDP destination port of GTP-U (3GPP TS 29.281).
pub const GTPU_PORT: u16 = 2152;

/// At most this many IPv6 extension headers are walked before giving up.
pub const MAX_IPV6_EXT_HEADERS: usize = 8;

/// Key flag: the packet is a non-first fragment, its ports are unknown (0).
pub const FLAG_NON_FIRST_FRAGMENT: u8 = 0x01;

/// Why a frame yielded no flow key. Small and `Copy`: hot paths count these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlowError {
    /// The EtherType (after VLAN tags) is neither IPv4 nor IPv6.
    NotIp,
    /// A header needed for the key extends past the end of the frame or of the
    /// IP datagram.
    Truncated,
    /// A header field is inconsistent (IP version, IHL, total length).
    BadHeader,
    /// More than two VLAN tags or more than [`MAX_IPV6_EXT_HEADERS`] IPv6
    /// extension headers.
    TooManyHeaders,
    /// Not a GTP-U (version 1) packet on UDP port 2152.
    NotGtpU,
}

impl fmt::Display for FlowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FlowError::NotIp => "not an IPv4/IPv6 frame",
            FlowError::Truncated => "frame truncated before the flow key",
            FlowError::BadHeader => "malformed IP header",
            FlowError::TooManyHeaders => "too many VLAN tags or IPv6 extension headers",
            FlowError::NotGtpU => "not a GTP-U packet",
        })
    }
}

impl std::error::Error for FlowError {}

/// Canonical ordering of two (address, port) endpoints, `true` if they must be swapped.
#[inline(always)]
fn endpoint_gt(a_addr: &[u8], a_port: [u8; 2], b_addr: &[u8], b_port: [u8; 2]) -> bool {
    match a_addr.cmp(b_addr) {
        core::cmp::Ordering::Greater => true,
        core::cmp::Ordering::Less => false,
        core::cmp::Ordering::Equal => a_port > b_port,
    }
}

// ---------------------------------------------------------------------------
// 5-tuples
// ---------------------------------------------------------------------------

/// IPv4 5-tuple, 16 bytes: src(4) dst(4) sport(2) dport(2) proto(1) flags(1) zero(2),
/// all in network byte order. The first 12 bytes are the Toeplitz RSS input.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct FiveTupleV4 {
    bytes: [u8; 16],
}

impl FiveTupleV4 {
    /// Builds a tuple (flags 0).
    pub const fn new(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, proto: u8) -> Self {
        let s = src.octets();
        let d = dst.octets();
        let sp = sport.to_be_bytes();
        let dp = dport.to_be_bytes();
        FiveTupleV4 {
            bytes: [s[0], s[1], s[2], s[3], d[0], d[1], d[2], d[3], sp[0], sp[1], dp[0], dp[1], proto, 0, 0, 0],
        }
    }

    /// From the two little-endian words of the layout (padding forced to zero).
    #[inline(always)]
    fn from_words(w: [u64; 2]) -> Self {
        let mut bytes = [0u8; 16];
        bytes[0..8].copy_from_slice(&w[0].to_le_bytes());
        bytes[8..16].copy_from_slice(&(w[1] & 0x0000_ffff_ffff_ffff).to_le_bytes());
        FiveTupleV4 { bytes }
    }

    /// Same tuple with the given flag bits (e.g. [`FLAG_NON_FIRST_FRAGMENT`]).
    pub const fn with_flags(mut self, flags: u8) -> Self {
        self.bytes[13] = flags;
        self
    }

    /// Source address.
    pub fn src(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.bytes[0], self.bytes[1], self.bytes[2], self.bytes[3])
    }
    /// Destination address.
    pub fn dst(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.bytes[4], self.bytes[5], self.bytes[6], self.bytes[7])
    }
    /// Source port (or ICMP echo identifier).
    pub fn src_port(&self) -> u16 {
        u16::from_be_bytes([self.bytes[8], self.bytes[9]])
    }
    /// Destination port (or ICMP echo identifier).
    pub fn dst_port(&self) -> u16 {
        u16::from_be_bytes([self.bytes[10], self.bytes[11]])
    }
    /// IP protocol number.
    pub fn proto(&self) -> u8 {
        self.bytes[12]
    }
    /// Flag bits (`FLAG_*`).
    pub fn flags(&self) -> u8 {
        self.bytes[13]
    }
    /// True for a non-first fragment (ports unknown, set to 0).
    pub fn is_non_first_fragment(&self) -> bool {
        self.flags() & FLAG_NON_FIRST_FRAGMENT != 0
    }
    /// The key bytes (wire order, padding zero).
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.bytes
    }

    /// The tuple of the opposite direction (addresses and ports swapped).
    #[inline]
    pub fn reversed(&self) -> Self {
        let b = &self.bytes;
        let mut r = *self;
        r.bytes[0..4].copy_from_slice(&b[4..8]);
        r.bytes[4..8].copy_from_slice(&b[0..4]);
        r.bytes[8..10].copy_from_slice(&b[10..12]);
        r.bytes[10..12].copy_from_slice(&b[8..10]);
        r
    }

    /// Direction-independent form: the endpoint (address, port) that compares
    /// lower is put first, so `t.canonical() == t.reversed().canonical()`.
    #[inline]
    pub fn canonical(&self) -> Self {
        let b = &self.bytes;
        // (addr, port) as one big-endian integer compares like the byte strings.
        let src = (u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as u64) << 16 | self.src_port() as u64;
        let dst = (u32::from_be_bytes([b[4], b[5], b[6], b[7]]) as u64) << 16 | self.dst_port() as u64;
        if src > dst {
            self.reversed()
        } else {
            *self
        }
    }
}

impl fmt::Debug for FiveTupleV4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{} -> {}:{} proto {}", self.src(), self.src_port(), self.dst(), self.dst_port(), self.proto())?;
        if self.flags() != 0 {
            write!(f, " flags {:#04x}", self.flags())?;
        }
        Ok(())
    }
}

/// IPv6 5-tuple, 40 bytes: src(16) dst(16) sport(2) dport(2) proto(1) flags(1) zero(2),
/// all in network byte order. The first 36 bytes are the Toeplitz RSS input.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FiveTupleV6 {
    bytes: [u8; 40],
}

impl Default for FiveTupleV6 {
    fn default() -> Self {
        FiveTupleV6 { bytes: [0; 40] }
    }
}

impl FiveTupleV6 {
    /// Builds a tuple (flags 0).
    pub fn new(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16, proto: u8) -> Self {
        let mut bytes = [0u8; 40];
        bytes[0..16].copy_from_slice(&src.octets());
        bytes[16..32].copy_from_slice(&dst.octets());
        bytes[32..34].copy_from_slice(&sport.to_be_bytes());
        bytes[34..36].copy_from_slice(&dport.to_be_bytes());
        bytes[36] = proto;
        FiveTupleV6 { bytes }
    }

    /// From the five little-endian words of the layout (padding forced to zero).
    #[inline(always)]
    fn from_words(w: [u64; 5]) -> Self {
        let mut bytes = [0u8; 40];
        for (dst, (i, &v)) in bytes.chunks_exact_mut(8).zip(w.iter().enumerate()) {
            let v = if i == 4 { v & 0x0000_ffff_ffff_ffff } else { v };
            dst.copy_from_slice(&v.to_le_bytes());
        }
        FiveTupleV6 { bytes }
    }

    /// Same tuple with the given flag bits.
    pub fn with_flags(mut self, flags: u8) -> Self {
        self.bytes[37] = flags;
        self
    }

    fn addr_at(&self, at: usize) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.bytes[at..at + 16]);
        Ipv6Addr::from(a)
    }
    /// Source address.
    pub fn src(&self) -> Ipv6Addr {
        self.addr_at(0)
    }
    /// Destination address.
    pub fn dst(&self) -> Ipv6Addr {
        self.addr_at(16)
    }
    /// Source port (or ICMPv6 echo identifier).
    pub fn src_port(&self) -> u16 {
        u16::from_be_bytes([self.bytes[32], self.bytes[33]])
    }
    /// Destination port (or ICMPv6 echo identifier).
    pub fn dst_port(&self) -> u16 {
        u16::from_be_bytes([self.bytes[34], self.bytes[35]])
    }
    /// Transport protocol (the last next-header value).
    pub fn proto(&self) -> u8 {
        self.bytes[36]
    }
    /// Flag bits (`FLAG_*`).
    pub fn flags(&self) -> u8 {
        self.bytes[37]
    }
    /// True for a non-first fragment (ports unknown, set to 0).
    pub fn is_non_first_fragment(&self) -> bool {
        self.flags() & FLAG_NON_FIRST_FRAGMENT != 0
    }
    /// The key bytes (wire order, padding zero).
    pub fn as_bytes(&self) -> &[u8; 40] {
        &self.bytes
    }

    /// The tuple of the opposite direction.
    #[inline]
    pub fn reversed(&self) -> Self {
        let b = &self.bytes;
        let mut r = *self;
        r.bytes[0..16].copy_from_slice(&b[16..32]);
        r.bytes[16..32].copy_from_slice(&b[0..16]);
        r.bytes[32..34].copy_from_slice(&b[34..36]);
        r.bytes[34..36].copy_from_slice(&b[32..34]);
        r
    }

    /// Direction-independent form (lower endpoint first).
    #[inline]
    pub fn canonical(&self) -> Self {
        let b = &self.bytes;
        if endpoint_gt(&b[0..16], [b[32], b[33]], &b[16..32], [b[34], b[35]]) {
            self.reversed()
        } else {
            *self
        }
    }
}

impl fmt::Debug for FiveTupleV6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}]:{} -> [{}]:{} proto {}",
            self.src(),
            self.src_port(),
            self.dst(),
            self.dst_port(),
            self.proto()
        )?;
        if self.flags() != 0 {
            write!(f, " flags {:#04x}", self.flags())?;
        }
        Ok(())
    }
}

/// A 5-tuple of either family. Fixed size (48 bytes); an IPv4 key hashes only
/// its 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum FiveTuple {
    /// IPv4 flow.
    V4(FiveTupleV4),
    /// IPv6 flow.
    V6(FiveTupleV6),
}

impl Default for FiveTuple {
    fn default() -> Self {
        FiveTuple::V4(FiveTupleV4::default())
    }
}

impl From<FiveTupleV4> for FiveTuple {
    fn from(t: FiveTupleV4) -> Self {
        FiveTuple::V4(t)
    }
}

impl From<FiveTupleV6> for FiveTuple {
    fn from(t: FiveTupleV6) -> Self {
        FiveTuple::V6(t)
    }
}

impl FiveTuple {
    /// Builds a tuple from addresses of the same family; `None` if they differ.
    pub fn new(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, proto: u8) -> Option<Self> {
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Some(FiveTupleV4::new(s, d, sport, dport, proto).into()),
            (IpAddr::V6(s), IpAddr::V6(d)) => Some(FiveTupleV6::new(s, d, sport, dport, proto).into()),
            _ => None,
        }
    }
    /// True for an IPv4 tuple.
    pub fn is_ipv4(&self) -> bool {
        matches!(self, FiveTuple::V4(_))
    }
    /// Source address.
    pub fn src_ip(&self) -> IpAddr {
        match self {
            FiveTuple::V4(t) => t.src().into(),
            FiveTuple::V6(t) => t.src().into(),
        }
    }
    /// Destination address.
    pub fn dst_ip(&self) -> IpAddr {
        match self {
            FiveTuple::V4(t) => t.dst().into(),
            FiveTuple::V6(t) => t.dst().into(),
        }
    }
    /// Source port.
    pub fn src_port(&self) -> u16 {
        match self {
            FiveTuple::V4(t) => t.src_port(),
            FiveTuple::V6(t) => t.src_port(),
        }
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        match self {
            FiveTuple::V4(t) => t.dst_port(),
            FiveTuple::V6(t) => t.dst_port(),
        }
    }
    /// Transport protocol number.
    pub fn proto(&self) -> u8 {
        match self {
            FiveTuple::V4(t) => t.proto(),
            FiveTuple::V6(t) => t.proto(),
        }
    }
    /// Flag bits (`FLAG_*`).
    pub fn flags(&self) -> u8 {
        match self {
            FiveTuple::V4(t) => t.flags(),
            FiveTuple::V6(t) => t.flags(),
        }
    }
    /// True for a non-first fragment.
    pub fn is_non_first_fragment(&self) -> bool {
        self.flags() & FLAG_NON_FIRST_FRAGMENT != 0
    }
    /// Key bytes: 16 for IPv4, 40 for IPv6.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            FiveTuple::V4(t) => t.as_bytes(),
            FiveTuple::V6(t) => t.as_bytes(),
        }
    }
    /// The tuple of the opposite direction.
    #[inline]
    pub fn reversed(&self) -> Self {
        match self {
            FiveTuple::V4(t) => FiveTuple::V4(t.reversed()),
            FiveTuple::V6(t) => FiveTuple::V6(t.reversed()),
        }
    }
    /// Direction-independent form: equal for both directions of a flow.
    #[inline]
    pub fn canonical(&self) -> Self {
        match self {
            FiveTuple::V4(t) => FiveTuple::V4(t.canonical()),
            FiveTuple::V6(t) => FiveTuple::V6(t.canonical()),
        }
    }
}

impl HashableKey for FiveTupleV4 {
    #[inline(always)]
    fn key_bytes(&self) -> &[u8] {
        &self.bytes
    }
    #[inline(always)]
    fn hash32(&self, seed: u32) -> u32 {
        hash16(&self.bytes, seed)
    }
    #[inline(always)]
    fn hash64(&self, seed: u32) -> u64 {
        hash16_64(&self.bytes, seed)
    }
}

impl HashableKey for FiveTupleV6 {
    #[inline(always)]
    fn key_bytes(&self) -> &[u8] {
        &self.bytes
    }
    #[inline(always)]
    fn hash32(&self, seed: u32) -> u32 {
        hash40(&self.bytes, seed)
    }
    #[inline(always)]
    fn hash64(&self, seed: u32) -> u64 {
        hash40_64(&self.bytes, seed)
    }
}

impl HashableKey for FiveTuple {
    #[inline(always)]
    fn key_bytes(&self) -> &[u8] {
        self.as_bytes()
    }
    #[inline(always)]
    fn hash32(&self, seed: u32) -> u32 {
        match self {
            FiveTuple::V4(t) => t.hash32(seed),
            FiveTuple::V6(t) => t.hash32(seed),
        }
    }
    #[inline(always)]
    fn hash64(&self, seed: u32) -> u64 {
        match self {
            FiveTuple::V4(t) => t.hash64(seed),
            FiveTuple::V6(t) => t.hash64(seed),
        }
    }
}

// ---------------------------------------------------------------------------
// Coarser keys
// ---------------------------------------------------------------------------

/// An IPv4 or IPv6 address as 16 bytes (IPv4 as `::ffff:a.b.c.d`).
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct IpKey {
    bytes: [u8; 16],
}

impl IpKey {
    /// From an IPv4 address (IPv4-mapped form).
    pub const fn from_v4(a: Ipv4Addr) -> Self {
        let o = a.octets();
        IpKey { bytes: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, o[0], o[1], o[2], o[3]] }
    }
    /// From an IPv6 address.
    pub const fn from_v6(a: Ipv6Addr) -> Self {
        IpKey { bytes: a.octets() }
    }
    /// From either family.
    pub fn from_ip(a: IpAddr) -> Self {
        match a {
            IpAddr::V4(a) => Self::from_v4(a),
            IpAddr::V6(a) => Self::from_v6(a),
        }
    }
    /// The address; IPv4-mapped keys come back as IPv4.
    pub fn to_ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.bytes);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }
    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.bytes
    }
}

impl fmt::Debug for IpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_ip())
    }
}

impl HashableKey for IpKey {
    #[inline(always)]
    fn key_bytes(&self) -> &[u8] {
        &self.bytes
    }
    #[inline(always)]
    fn hash32(&self, seed: u32) -> u32 {
        hash16(&self.bytes, seed)
    }
}

/// Source-address key (e.g. per-source counters, FAJITA's auxiliary table).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, PartialOrd, Ord)]
pub struct SrcIpKey(pub IpKey);

/// Destination-address key (e.g. a per-destination policer).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, PartialOrd, Ord)]
pub struct DstIpKey(pub IpKey);

impl SrcIpKey {
    /// Source address of `t`.
    #[inline]
    pub fn from_tuple(t: &FiveTuple) -> Self {
        SrcIpKey(match t {
            FiveTuple::V4(t) => IpKey::from_v4(t.src()),
            FiveTuple::V6(t) => IpKey::from_v6(t.src()),
        })
    }
    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }
}

impl DstIpKey {
    /// Destination address of `t`.
    #[inline]
    pub fn from_tuple(t: &FiveTuple) -> Self {
        DstIpKey(match t {
            FiveTuple::V4(t) => IpKey::from_v4(t.dst()),
            FiveTuple::V6(t) => IpKey::from_v6(t.dst()),
        })
    }
    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }
}

impl HashableKey for SrcIpKey {
    #[inline(always)]
    fn key_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
    #[inline(always)]
    fn hash32(&self, seed: u32) -> u32 {
        hash16(self.0.as_bytes(), seed)
    }
}

impl HashableKey for DstIpKey {
    #[inline(always)]
    fn key_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
    #[inline(always)]
    fn hash32(&self, seed: u32) -> u32 {
        hash16(self.0.as_bytes(), seed)
    }
}

/// (source, destination) address pair, 32 bytes.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct IpPairKey {
    bytes: [u8; 32],
}

impl IpPairKey {
    /// From two address keys.
    pub fn new(src: IpKey, dst: IpKey) -> Self {
        let mut bytes = [0u8; 32];
        bytes[..16].copy_from_slice(src.as_bytes());
        bytes[16..].copy_from_slice(dst.as_bytes());
        IpPairKey { bytes }
    }
    /// Addresses of `t`.
    #[inline]
    pub fn from_tuple(t: &FiveTuple) -> Self {
        Self::new(SrcIpKey::from_tuple(t).0, DstIpKey::from_tuple(t).0)
    }
    fn half(&self, at: usize) -> IpKey {
        let mut b = [0u8; 16];
        b.copy_from_slice(&self.bytes[at..at + 16]);
        IpKey { bytes: b }
    }
    /// Source address.
    pub fn src(&self) -> IpKey {
        self.half(0)
    }
    /// Destination address.
    pub fn dst(&self) -> IpKey {
        self.half(16)
    }
    /// Direction-independent form (lower address first).
    pub fn canonical(&self) -> Self {
        if self.bytes[..16] > self.bytes[16..] {
            Self::new(self.dst(), self.src())
        } else {
            *self
        }
    }
    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.bytes
    }
}

impl fmt::Debug for IpPairKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} -> {:?}", self.src(), self.dst())
    }
}

impl HashableKey for IpPairKey {
    #[inline(always)]
    fn key_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// GTP-U tunnel endpoint identifier (network byte order inside).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct TeidKey {
    bytes: [u8; 4],
}

impl TeidKey {
    /// From a TEID value.
    pub const fn new(teid: u32) -> Self {
        TeidKey { bytes: teid.to_be_bytes() }
    }
    /// The TEID value.
    pub const fn teid(&self) -> u32 {
        u32::from_be_bytes(self.bytes)
    }
    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8; 4] {
        &self.bytes
    }
}

impl fmt::Debug for TeidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TeidKey({:#010x})", self.teid())
    }
}

impl HashableKey for TeidKey {
    #[inline(always)]
    fn key_bytes(&self) -> &[u8] {
        &self.bytes
    }
    #[inline(always)]
    fn hash32(&self, seed: u32) -> u32 {
        crate::hash::crc32c_u32(seed, u32::from_le_bytes(self.bytes))
    }
}

// ---------------------------------------------------------------------------
// Custom keys
// ---------------------------------------------------------------------------

/// A set of header fields forming a [`CustomKey`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct FieldSet(u8);

/// Names accepted by [`FieldSet::parse`], in bit order.
const FIELD_NAMES: [&str; 7] = ["src_ip", "dst_ip", "sport", "dport", "proto", "vlan", "teid"];

impl FieldSet {
    /// Source address.
    pub const SRC_IP: FieldSet = FieldSet(1 << 0);
    /// Destination address.
    pub const DST_IP: FieldSet = FieldSet(1 << 1);
    /// Source port.
    pub const SPORT: FieldSet = FieldSet(1 << 2);
    /// Destination port.
    pub const DPORT: FieldSet = FieldSet(1 << 3);
    /// IP protocol.
    pub const PROTO: FieldSet = FieldSet(1 << 4);
    /// Outer VLAN ID (0 when untagged).
    pub const VLAN: FieldSet = FieldSet(1 << 5);
    /// GTP-U TEID (packet must be GTP-U).
    pub const TEID: FieldSet = FieldSet(1 << 6);
    /// The classic 5-tuple.
    pub const FIVE_TUPLE: FieldSet = FieldSet(0x1f);
    /// No field.
    pub const EMPTY: FieldSet = FieldSet(0);

    /// Raw bit mask.
    pub const fn bits(self) -> u8 {
        self.0
    }
    /// From a raw bit mask; unknown bits are dropped.
    pub const fn from_bits_truncate(bits: u8) -> Self {
        FieldSet(bits & 0x7f)
    }
    /// Union.
    pub const fn union(self, other: FieldSet) -> Self {
        FieldSet(self.0 | other.0)
    }
    /// True if every field of `other` is in `self`.
    pub const fn contains(self, other: FieldSet) -> bool {
        self.0 & other.0 == other.0
    }
    /// True for the empty set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Parses a comma-separated list such as `"src_ip,dport"`. Accepted names:
    /// `src_ip dst_ip sport dport proto vlan teid` (also `src_port`, `dst_port`).
    pub fn parse(s: &str) -> Result<FieldSet, FieldSetError> {
        let mut set = FieldSet::EMPTY;
        for raw in s.split(',') {
            let name = raw.trim();
            let bit = match name {
                "src_ip" => FieldSet::SRC_IP,
                "dst_ip" => FieldSet::DST_IP,
                "sport" | "src_port" => FieldSet::SPORT,
                "dport" | "dst_port" => FieldSet::DPORT,
                "proto" => FieldSet::PROTO,
                "vlan" => FieldSet::VLAN,
                "teid" => FieldSet::TEID,
                "" => return Err(FieldSetError::Empty),
                other => return Err(FieldSetError::Unknown(other.to_string())),
            };
            set = set.union(bit);
        }
        Ok(set)
    }
}

impl core::ops::BitOr for FieldSet {
    type Output = FieldSet;
    fn bitor(self, rhs: FieldSet) -> FieldSet {
        self.union(rhs)
    }
}

impl FromStr for FieldSet {
    type Err = FieldSetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FieldSet::parse(s)
    }
}

impl fmt::Display for FieldSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (i, name) in FIELD_NAMES.iter().enumerate() {
            if self.0 & (1 << i) != 0 {
                if !first {
                    f.write_str(",")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for FieldSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FieldSet({self})")
    }
}

/// Error of [`FieldSet::parse`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldSetError {
    /// An empty list or an empty item (`"src_ip,,dport"`).
    Empty,
    /// A name that is not a known field.
    Unknown(String),
}

impl fmt::Display for FieldSetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = FIELD_NAMES.join(", ");
        match self {
            FieldSetError::Empty => write!(f, "empty flow key field in list (expected: {names})"),
            FieldSetError::Unknown(n) => write!(f, "unknown flow key field '{n}' (expected: {names})"),
        }
    }
}

impl std::error::Error for FieldSetError {}

/// A key made of the fields in a [`FieldSet`], 48 bytes; unselected fields are
/// zero and the field mask is part of the key, so different sets never alias.
///
/// Layout: src(16, IPv4-mapped) dst(16) sport(2) dport(2) proto(1) mask(1)
/// vlan(2) teid(4) zero(4).
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CustomKey {
    bytes: [u8; 48],
}

impl Default for CustomKey {
    fn default() -> Self {
        CustomKey { bytes: [0; 48] }
    }
}

impl CustomKey {
    /// Builds the key for `fields` from a parsed tuple, the outer VLAN ID
    /// (0 if untagged) and the TEID (ignored unless selected).
    pub fn build(fields: FieldSet, tuple: &FiveTuple, vlan: u16, teid: u32) -> Self {
        let mut bytes = [0u8; 48];
        if fields.contains(FieldSet::SRC_IP) {
            bytes[0..16].copy_from_slice(SrcIpKey::from_tuple(tuple).as_bytes());
        }
        if fields.contains(FieldSet::DST_IP) {
            bytes[16..32].copy_from_slice(DstIpKey::from_tuple(tuple).as_bytes());
        }
        if fields.contains(FieldSet::SPORT) {
            bytes[32..34].copy_from_slice(&tuple.src_port().to_be_bytes());
        }
        if fields.contains(FieldSet::DPORT) {
            bytes[34..36].copy_from_slice(&tuple.dst_port().to_be_bytes());
        }
        if fields.contains(FieldSet::PROTO) {
            bytes[36] = tuple.proto();
        }
        bytes[37] = fields.bits();
        if fields.contains(FieldSet::VLAN) {
            bytes[38..40].copy_from_slice(&(vlan & 0x0fff).to_be_bytes());
        }
        if fields.contains(FieldSet::TEID) {
            bytes[40..44].copy_from_slice(&teid.to_be_bytes());
        }
        CustomKey { bytes }
    }
    /// The field set this key was built for.
    pub fn fields(&self) -> FieldSet {
        FieldSet::from_bits_truncate(self.bytes[37])
    }
    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8; 48] {
        &self.bytes
    }
}

impl fmt::Debug for CustomKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CustomKey({}: ", self.fields())?;
        for b in &self.bytes[..44] {
            write!(f, "{b:02x}")?;
        }
        f.write_str(")")
    }
}

impl HashableKey for CustomKey {
    #[inline(always)]
    fn key_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

// ---------------------------------------------------------------------------
// Fast-path parser
// ---------------------------------------------------------------------------

/// `N` bytes at `off`, or `Truncated`. Two length checks, no panic path.
#[inline(always)]
fn chunk<const N: usize>(buf: &[u8], off: usize) -> Result<&[u8; N], FlowError> {
    buf.get(off..).and_then(|s| s.first_chunk::<N>()).ok_or(FlowError::Truncated)
}

#[inline(always)]
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

#[inline(always)]
fn is_vlan(ethertype: u16) -> bool {
    ethertype == ETHERTYPE_VLAN || ethertype == ETHERTYPE_QINQ || ethertype == ETHERTYPE_QINQ_OLD
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

#[inline(always)]
fn parse(frame: &[u8]) -> Result<Parsed, FlowError> {
    let eth = chunk::<14>(frame, 0)?;
    match be16([eth[12], eth[13]]) {
        ETHERTYPE_IPV4 => parse_ipv4(frame, 14, 0),
        ETHERTYPE_IPV6 => parse_ipv6(frame, 14, 0),
        other => parse_tagged(frame, other),
    }
}

/// VLAN-tagged (or non-IP) frames, out of the untagged fast path.
#[inline(never)]
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

#[inline(always)]
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

#[inline(always)]
fn is_ipv6_ext(nh: u8) -> bool {
    matches!(nh, PROTO_HOPOPT | PROTO_ROUTING | PROTO_FRAGMENT | PROTO_AH | PROTO_DSTOPTS)
}

#[inline(always)]
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
#[inline(never)]
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
#[inline]
pub fn extract_five_tuple(frame: &[u8]) -> Result<FiveTuple, FlowError> {
    parse(frame).map(|p| p.tuple)
}

/// [`extract_five_tuple`] over a batch; fills `min(frames.len(), out.len())`
/// results and returns that count.
pub fn extract_batch(frames: &[&[u8]], out: &mut [Result<FiveTuple, FlowError>]) -> usize {
    let n = frames.len().min(out.len());
    for (o, f) in out.iter_mut().zip(frames) {
        *o = extract_five_tuple(f);
    }
    n
}

/// GTP-U TEID of a frame: UDP to port 2152, GTP version 1 with PT = 1.
pub fn extract_teid(frame: &[u8]) -> Result<TeidKey, FlowError> {
    let p = parse(frame)?;
    teid_of(frame, &p)
}

fn teid_of(frame: &[u8], p: &Parsed) -> Result<TeidKey, FlowError> {
    if p.tuple.proto() != PROTO_UDP || p.tuple.is_non_first_fragment() || p.tuple.dst_port() != GTPU_PORT {
        return Err(FlowError::NotGtpU);
    }
    let dgram = frame.get(..p.end).ok_or(FlowError::Truncated)?;
    let g = chunk::<8>(dgram, p.l4 + 8)?;
    // Flags: version in bits 7..5 must be 1, protocol type bit 4 must be 1 (GTP, not GTP').
    if g[0] >> 5 != 1 || g[0] & 0x10 == 0 {
        return Err(FlowError::NotGtpU);
    }
    Ok(TeidKey { bytes: [g[4], g[5], g[6], g[7]] })
}

/// Builds the [`CustomKey`] for `fields` from a frame (the TEID is parsed only
/// if selected; then the frame must be GTP-U).
pub fn extract_custom_key(frame: &[u8], fields: FieldSet) -> Result<CustomKey, FlowError> {
    let p = parse(frame)?;
    let teid = if fields.contains(FieldSet::TEID) { teid_of(frame, &p)?.teid() } else { 0 };
    Ok(CustomKey::build(fields, &p.tuple, p.vlan, teid))
}

/// Outer VLAN ID of a frame (0 if untagged) together with its 5-tuple.
pub fn extract_five_tuple_vlan(frame: &[u8]) -> Result<(FiveTuple, u16), FlowError> {
    parse(frame).map(|p| (p.tuple, p.vlan))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eth(ethertype: u16) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ethertype.to_be_bytes());
        f
    }

    fn ipv4_udp(frag: u16, ihl_words: u8) -> Vec<u8> {
        let mut f = eth(ETHERTYPE_IPV4);
        let opt = (ihl_words as usize - 5) * 4;
        let total = (20 + opt + 8) as u16;
        f.extend_from_slice(&[0x40 | ihl_words, 0]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&frag.to_be_bytes());
        f.extend_from_slice(&[64, PROTO_UDP, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend(std::iter::repeat_n(1u8, opt)); // NOP options
        f.extend_from_slice(&[0x12, 0x34, 0x08, 0x68, 0, 8, 0, 0]);
        f
    }

    #[test]
    fn ipv4_with_options_and_fragments() {
        let t = extract_five_tuple(&ipv4_udp(0, 7)).unwrap();
        assert_eq!((t.src_port(), t.dst_port(), t.proto(), t.flags()), (0x1234, 2152, 17, 0));
        // MF set, offset 0: first fragment keeps the ports.
        let t = extract_five_tuple(&ipv4_udp(0x2000, 5)).unwrap();
        assert_eq!((t.src_port(), t.flags()), (0x1234, 0));
        let t = extract_five_tuple(&ipv4_udp(0x0010, 5)).unwrap();
        assert_eq!((t.src_port(), t.dst_port(), t.flags()), (0, 0, FLAG_NON_FIRST_FRAGMENT));
    }

    #[test]
    fn errors() {
        assert_eq!(extract_five_tuple(&[]), Err(FlowError::Truncated));
        assert_eq!(extract_five_tuple(&eth(0x0806)), Err(FlowError::NotIp));
        let mut f = ipv4_udp(0, 5);
        f[14] = 0x45 | 0x10; // version 5
        assert_eq!(extract_five_tuple(&f), Err(FlowError::BadHeader));
        let f = ipv4_udp(0, 5);
        assert_eq!(extract_five_tuple(&f[..36]), Err(FlowError::Truncated));
        let mut f = eth(ETHERTYPE_VLAN);
        for _ in 0..3 {
            f.extend_from_slice(&[0, 1, 0x81, 0x00]);
        }
        assert_eq!(extract_five_tuple(&f), Err(FlowError::TooManyHeaders));
        assert!(!FlowError::Truncated.to_string().is_empty());
    }

    #[test]
    fn teid_and_custom() {
        let mut f = ipv4_udp(0, 5);
        // Grow the datagram by a GTP-U header (flags 0x30, G-PDU, TEID 0xdeadbeef).
        f[16..18].copy_from_slice(&(20u16 + 8 + 8).to_be_bytes());
        f.extend_from_slice(&[0x30, 0xff, 0, 0, 0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(extract_teid(&f).unwrap().teid(), 0xdead_beef);
        let k = extract_custom_key(&f, FieldSet::parse("teid, dport").unwrap()).unwrap();
        assert_eq!(k.fields(), FieldSet::TEID | FieldSet::DPORT);
        assert_eq!(&k.as_bytes()[40..44], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(&k.as_bytes()[34..36], &[0x08, 0x68]);
        assert_eq!(k.as_bytes()[..34], [0u8; 34]);
        f[42] = 0x50; // version 2
        assert_eq!(extract_teid(&f), Err(FlowError::NotGtpU));
        assert_eq!(extract_teid(&ipv4_udp(0x10, 5)), Err(FlowError::NotGtpU));
    }

    #[test]
    fn fieldset_parse() {
        assert_eq!(FieldSet::parse("src_ip,dport").unwrap(), FieldSet::SRC_IP | FieldSet::DPORT);
        assert_eq!(FieldSet::parse("src_ip,dst_ip,sport,dport,proto").unwrap(), FieldSet::FIVE_TUPLE);
        let e = FieldSet::parse("src_ip,bogus").unwrap_err();
        assert_eq!(e, FieldSetError::Unknown("bogus".into()));
        assert!(e.to_string().starts_with("unknown flow key field 'bogus'"));
        assert!(!e.to_string().contains('\n'));
        assert_eq!(FieldSet::parse(""), Err(FieldSetError::Empty));
        assert_eq!(FieldSet::FIVE_TUPLE.to_string(), "src_ip,dst_ip,sport,dport,proto");
        assert_eq!("vlan,teid".parse::<FieldSet>().unwrap().to_string(), "vlan,teid");
    }

    #[test]
    fn key_sizes() {
        assert_eq!(core::mem::size_of::<FiveTupleV4>(), 16);
        assert_eq!(core::mem::size_of::<FiveTupleV6>(), 40);
        assert_eq!(core::mem::size_of::<FiveTuple>(), 48);
        assert_eq!(core::mem::size_of::<SrcIpKey>(), 16);
        assert_eq!(core::mem::size_of::<IpPairKey>(), 32);
        assert_eq!(core::mem::size_of::<TeidKey>(), 4);
        assert_eq!(core::mem::size_of::<CustomKey>(), 48);
    }

    #[test]
    fn ip_keys() {
        let t: FiveTuple =
            FiveTupleV4::new(Ipv4Addr::new(1, 2, 3, 4), Ipv4Addr::new(5, 6, 7, 8), 1, 2, PROTO_TCP).into();
        assert_eq!(SrcIpKey::from_tuple(&t).0.to_ip(), IpAddr::V4(Ipv4Addr::new(1, 2, 3, 4)));
        assert_eq!(DstIpKey::from_tuple(&t).0.to_ip(), IpAddr::V4(Ipv4Addr::new(5, 6, 7, 8)));
        let p = IpPairKey::from_tuple(&t);
        assert_eq!(p.canonical(), IpPairKey::from_tuple(&t.reversed()).canonical());
        assert_eq!(p.src(), SrcIpKey::from_tuple(&t).0);
        let v6 = IpKey::from_ip("2001:db8::1".parse().unwrap());
        assert_eq!(v6.to_ip(), "2001:db8::1".parse::<IpAddr>().unwrap());
        assert_eq!(format!("{t:?}"), "V4(1.2.3.4:1 -> 5.6.7.8:2 proto 6)");
    }
}
