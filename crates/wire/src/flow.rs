//! Flow keys: [`FiveTupleV4`] (16 bytes), [`FiveTupleV6`] (40 bytes),
//! [`FiveTuple`] (either) and [`CustomKey`] (a user-chosen [`FieldSet`]),
//! stored as fixed byte arrays in wire order with padding zeroed, so `Eq`,
//! `Hash` and the table hash ([`crate::hash`]) all see the same canonical
//! bytes without `unsafe`; and [`extract_five_tuple`], a frame's key, which is
//! the frame parser's walk ([`crate::frame`]) at its flow-key level.
//!
//! Conventions:
//! * Non-first fragments carry no transport header: ports are 0 and
//!   [`FLAG_NON_FIRST_FRAGMENT`] is set in the key (so they never alias a real
//!   port-0 flow). First fragments are keyed like unfragmented packets.
//! * ICMP / ICMPv6 echo request and reply use the identifier as *both* ports,
//!   so a request's [`FiveTuple::reversed`] equals its reply. Other ICMP: 0.
//! * Protocols without ports (GRE, ESP, ...) have ports 0.
//! * IPv4 addresses in the 16-byte address fields of [`CustomKey`] are
//!   IPv4-mapped (`::ffff:a.b.c.d`); that prefix must not appear on the wire
//!   in IPv6 headers (RFC 4291 §2.5.5.2), so the two families do not collide
//!   in practice.

use core::fmt;
use core::str::FromStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::hash::{hash16, hash16_64, hash40, hash40_64, HashableKey};

/// UDP destination port of GTP-U (3GPP TS 29.281).
pub use crate::udp::GTPU_PORT;

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
    /// A header field is inconsistent (IP version, IHL, total length; for
    /// the executor's meta also transport and GTP-U headers).
    BadHeader,
    /// More than two VLAN tags or more than [`crate::ipv6::MAX_EXT_HEADERS`] IPv6
    /// extension headers.
    TooManyHeaders,
}

impl fmt::Display for FlowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FlowError::NotIp => "not an IPv4/IPv6 frame",
            FlowError::Truncated => "frame truncated before the flow key",
            FlowError::BadHeader => "malformed IP header",
            FlowError::TooManyHeaders => "too many VLAN tags or IPv6 extension headers",
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
    pub(crate) fn from_words(w: [u64; 2]) -> Self {
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
    pub(crate) fn from_words(w: [u64; 5]) -> Self {
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

/// An address as 16 bytes, IPv4 as `::ffff:a.b.c.d`.
fn mapped(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

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
            bytes[0..16].copy_from_slice(&mapped(tuple.src_ip()));
        }
        if fields.contains(FieldSet::DST_IP) {
            bytes[16..32].copy_from_slice(&mapped(tuple.dst_ip()));
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

/// Parses an Ethernet frame down to its 5-tuple (see the module docs for the
/// conventions on fragments, ICMP and port-less protocols, and [`crate::frame`]
/// for what the walk accepts).
#[inline]
pub fn extract_five_tuple(frame: &[u8]) -> Result<FiveTuple, FlowError> {
    // The common cases straight (untagged TCP/UDP over IPv4, or IPv6 without
    // extension headers: exactly the walk's key), the rest through the walk.
    if let Some(t) = crate::frame::ipv4_tuple_fast(frame) {
        return Ok(t);
    }
    if let Some(t) = crate::frame::ipv6_tuple_fast(frame) {
        return Ok(t);
    }
    crate::frame::walk_tuple(frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::PktMeta;

    const ETHERTYPE_IPV4: u16 = 0x0800;
    const ETHERTYPE_VLAN: u16 = 0x8100;
    const PROTO_UDP: u8 = 17;

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
    fn custom_key_from_a_gtpu_frame() {
        let mut f = ipv4_udp(0, 5);
        // Grow the datagram by a GTP-U header (flags 0x30, G-PDU, TEID 0xdeadbeef).
        f[16..18].copy_from_slice(&(20u16 + 8 + 8).to_be_bytes());
        f[38..40].copy_from_slice(&16u16.to_be_bytes());
        f.extend_from_slice(&[0x30, 0xff, 0, 0, 0xde, 0xad, 0xbe, 0xef]);
        let m = PktMeta::parse(&f);
        assert_eq!(m.teid(), Some(0xdead_beef));
        let k = CustomKey::build(FieldSet::parse("teid, dport").unwrap(), &m.tuple, m.vlan, m.teid);
        assert_eq!(k.fields(), FieldSet::TEID | FieldSet::DPORT);
        assert_eq!(&k.as_bytes()[40..44], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(&k.as_bytes()[34..36], &[0x08, 0x68]);
        assert_eq!(k.as_bytes()[..34], [0u8; 34]);
        let k = CustomKey::build(FieldSet::SRC_IP | FieldSet::VLAN, &m.tuple, 0x1005, 0);
        assert_eq!(&k.as_bytes()[..16], &Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped().octets());
        assert_eq!(&k.as_bytes()[38..40], &[0x00, 0x05]);
        assert_eq!(k.as_bytes()[16..37], [0u8; 21]);
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
        assert_eq!(core::mem::size_of::<CustomKey>(), 48);
    }

    #[test]
    fn tuple_accessors() {
        let t: FiveTuple = FiveTupleV4::new(Ipv4Addr::new(1, 2, 3, 4), Ipv4Addr::new(5, 6, 7, 8), 1, 2, 6).into();
        assert_eq!(t.src_ip(), IpAddr::V4(Ipv4Addr::new(1, 2, 3, 4)));
        assert_eq!(t.reversed().src_ip(), IpAddr::V4(Ipv4Addr::new(5, 6, 7, 8)));
        assert_eq!(format!("{t:?}"), "V4(1.2.3.4:1 -> 5.6.7.8:2 proto 6)");
        let v6 = FiveTuple::new("2001:db8::1".parse().unwrap(), "::2".parse().unwrap(), 3, 4, 17).unwrap();
        assert_eq!(v6.src_ip(), "2001:db8::1".parse::<IpAddr>().unwrap());
        assert!(FiveTuple::new("::1".parse().unwrap(), "1.1.1.1".parse().unwrap(), 3, 4, 17).is_none());
    }
}
