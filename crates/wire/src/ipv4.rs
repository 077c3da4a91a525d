//! IPv4 (RFC 791): the [`Ipv4Packet`] view with header-checksum verification
//! and incremental (RFC 1624) rewrites, the plain [`Ipv4Repr`], and
//! [`rewrite_addr`], which rewrites an address and keeps both the IP header
//! checksum and the TCP/UDP pseudo-header checksum valid (NAT, load balancers).
//!
//! This module also owns the definitions both IP families share:
//! [`IpProtocol`] numbers and the [`PseudoHeader`] trait used by the TCP, UDP
//! and ICMPv6 checksum helpers.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::checksum;
use crate::error::{Result, WireError};

/// An IP protocol / IPv6 next-header number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct IpProtocol(pub u8);

impl IpProtocol {
    /// IPv6 hop-by-hop options.
    pub const HOPOPT: IpProtocol = IpProtocol(0);
    /// ICMP for IPv4.
    pub const ICMP: IpProtocol = IpProtocol(1);
    /// IPv4-in-IP encapsulation.
    pub const IPIP: IpProtocol = IpProtocol(4);
    /// TCP.
    pub const TCP: IpProtocol = IpProtocol(6);
    /// UDP.
    pub const UDP: IpProtocol = IpProtocol(17);
    /// DCCP.
    pub const DCCP: IpProtocol = IpProtocol(33);
    /// IPv6-in-IP encapsulation.
    pub const IPV6: IpProtocol = IpProtocol(41);
    /// IPv6 routing header.
    pub const IPV6_ROUTE: IpProtocol = IpProtocol(43);
    /// IPv6 fragment header.
    pub const IPV6_FRAG: IpProtocol = IpProtocol(44);
    /// Generic routing encapsulation.
    pub const GRE: IpProtocol = IpProtocol(47);
    /// Encapsulating security payload.
    pub const ESP: IpProtocol = IpProtocol(50);
    /// Authentication header.
    pub const AH: IpProtocol = IpProtocol(51);
    /// ICMP for IPv6.
    pub const ICMPV6: IpProtocol = IpProtocol(58);
    /// IPv6 "no next header".
    pub const IPV6_NONXT: IpProtocol = IpProtocol(59);
    /// IPv6 destination options.
    pub const IPV6_OPTS: IpProtocol = IpProtocol(60);
    /// SCTP.
    pub const SCTP: IpProtocol = IpProtocol(132);
    /// UDP-Lite.
    pub const UDPLITE: IpProtocol = IpProtocol(136);
}

impl From<u8> for IpProtocol {
    fn from(v: u8) -> Self {
        IpProtocol(v)
    }
}

impl From<IpProtocol> for u8 {
    fn from(v: IpProtocol) -> Self {
        v.0
    }
}

/// An address type whose pair (source, destination) forms an L4 checksum
/// pseudo-header. Implemented for IPv4 and IPv6 addresses, as byte arrays and
/// as `std::net` types, so `fill_checksum(src, dst)` works for both families.
pub trait PseudoHeader: Copy {
    /// One's-complement sum (not complemented) of the pseudo-header for an
    /// upper-layer packet of `length` bytes.
    fn pseudo_sum(src: Self, dst: Self, protocol: IpProtocol, length: usize) -> u16;
}

impl PseudoHeader for [u8; 4] {
    #[inline]
    fn pseudo_sum(src: Self, dst: Self, protocol: IpProtocol, length: usize) -> u16 {
        // `fold` reduces modulo 0xffff, so adding the length as one integer
        // equals summing its 16-bit halves; lengths above 64 KiB stay correct.
        let acc = u32::from_be_bytes(src) as u64 + u32::from_be_bytes(dst) as u64 + protocol.0 as u64 + length as u64;
        checksum::fold(acc)
    }
}

impl PseudoHeader for [u8; 16] {
    #[inline]
    fn pseudo_sum(src: Self, dst: Self, protocol: IpProtocol, length: usize) -> u16 {
        let s = checksum::pseudo_header_v6(src, dst, protocol.0, 0);
        checksum::fold(s as u64 + length as u64)
    }
}

impl PseudoHeader for Ipv4Addr {
    #[inline]
    fn pseudo_sum(src: Self, dst: Self, protocol: IpProtocol, length: usize) -> u16 {
        <[u8; 4]>::pseudo_sum(src.octets(), dst.octets(), protocol, length)
    }
}

impl PseudoHeader for Ipv6Addr {
    #[inline]
    fn pseudo_sum(src: Self, dst: Self, protocol: IpProtocol, length: usize) -> u16 {
        <[u8; 16]>::pseudo_sum(src.octets(), dst.octets(), protocol, length)
    }
}

/// Length of the IPv4 header without options.
pub const HEADER_LEN: usize = 20;

/// Largest header (IHL = 15).
pub const MAX_HEADER_LEN: usize = 60;

mod field {
    pub const VER_IHL: usize = 0;
    pub const DSCP_ECN: usize = 1;
    pub const LENGTH: usize = 2;
    pub const IDENT: usize = 4;
    pub const FLG_OFF: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
}

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const OFFSET_MASK: u16 = 0x1fff;

/// A view of an IPv4 packet.
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wraps a buffer without checks; accessors may panic on a short buffer.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    /// Wraps a buffer after validating version, IHL and total length.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Validates: a whole fixed header, version 4, IHL >= 5 and within the
    /// buffer, total length >= IHL and within the buffer (trailing bytes,
    /// e.g. Ethernet padding, are allowed and excluded from the payload).
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if b[field::VER_IHL] >> 4 != 4 {
            return Err(WireError::BadVersion);
        }
        let hl = self.header_len();
        if hl < HEADER_LEN {
            return Err(WireError::BadHeaderLen);
        }
        if hl > b.len() {
            return Err(WireError::Truncated);
        }
        let total = self.total_len() as usize;
        if total < hl {
            return Err(WireError::BadLength);
        }
        if total > b.len() {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline]
    fn u16_at(&self, i: usize) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[i], b[i + 1]])
    }

    #[inline]
    fn addr_at(&self, i: usize) -> [u8; 4] {
        let b = self.buffer.as_ref();
        [b[i], b[i + 1], b[i + 2], b[i + 3]]
    }

    /// Version field (4 for a checked packet).
    #[inline]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL * 4), options included.
    #[inline]
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[field::VER_IHL] & 0x0f) as usize) * 4
    }

    /// Differentiated services code point.
    #[inline]
    pub fn dscp(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] >> 2
    }

    /// Explicit congestion notification bits.
    #[inline]
    pub fn ecn(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] & 3
    }

    /// Total length (header + payload).
    #[inline]
    pub fn total_len(&self) -> u16 {
        self.u16_at(field::LENGTH)
    }

    /// Identification.
    #[inline]
    pub fn ident(&self) -> u16 {
        self.u16_at(field::IDENT)
    }

    /// Don't-fragment flag.
    #[inline]
    pub fn dont_frag(&self) -> bool {
        self.u16_at(field::FLG_OFF) & FLAG_DF != 0
    }

    /// More-fragments flag.
    #[inline]
    pub fn more_frags(&self) -> bool {
        self.u16_at(field::FLG_OFF) & FLAG_MF != 0
    }

    /// Fragment offset in bytes (the field counts 8-byte units).
    #[inline]
    pub fn frag_offset(&self) -> u16 {
        (self.u16_at(field::FLG_OFF) & OFFSET_MASK) << 3
    }

    /// True for any fragment: MF set or a non-zero offset.
    #[inline]
    pub fn is_fragment(&self) -> bool {
        self.u16_at(field::FLG_OFF) & (FLAG_MF | OFFSET_MASK) != 0
    }

    /// True for the first fragment of a fragmented datagram (MF set, offset 0):
    /// the only fragment that carries the L4 header. False for unfragmented packets.
    #[inline]
    pub fn is_first_fragment(&self) -> bool {
        let v = self.u16_at(field::FLG_OFF);
        v & FLAG_MF != 0 && v & OFFSET_MASK == 0
    }

    /// Time to live.
    #[inline]
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    /// Protocol of the payload.
    #[inline]
    pub fn protocol(&self) -> IpProtocol {
        IpProtocol(self.buffer.as_ref()[field::PROTOCOL])
    }

    /// Header checksum as stored.
    #[inline]
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> [u8; 4] {
        self.addr_at(field::SRC)
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> [u8; 4] {
        self.addr_at(field::DST)
    }

    /// Header bytes (options included), clamped to the buffer so it never panics.
    #[inline]
    fn header_bytes(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[..self.header_len().min(b.len())]
    }

    /// Options bytes (empty when IHL = 5). Options are not interpreted.
    #[inline]
    pub fn options(&self) -> &[u8] {
        let h = self.header_bytes();
        h.get(HEADER_LEN..).unwrap_or(&[])
    }

    /// True if the header checksum verifies.
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        checksum::sum(self.header_bytes()) == 0xffff
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Ipv4Packet<&'a T> {
    /// The payload: bytes from the end of the header to `total_len`.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        let b = self.buffer.as_ref();
        let end = (self.total_len() as usize).min(b.len());
        b.get(self.header_len()..end).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    #[inline]
    fn set_u16_at(&mut self, i: usize, v: u16) {
        self.buffer.as_mut()[i..i + 2].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the version nibble.
    #[inline]
    pub fn set_version(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[field::VER_IHL];
        *b = (*b & 0x0f) | (v << 4);
    }

    /// Sets the header length in bytes (rounded down to 4, capped at 60).
    #[inline]
    pub fn set_header_len(&mut self, len: usize) {
        let ihl = (len.min(MAX_HEADER_LEN) / 4) as u8;
        let b = &mut self.buffer.as_mut()[field::VER_IHL];
        *b = (*b & 0xf0) | ihl;
    }

    /// Sets the DSCP (low 6 bits).
    #[inline]
    pub fn set_dscp(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[field::DSCP_ECN];
        *b = (*b & 3) | (v << 2);
    }

    /// Sets the ECN bits (low 2 bits).
    #[inline]
    pub fn set_ecn(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[field::DSCP_ECN];
        *b = (*b & !3) | (v & 3);
    }

    /// Sets the total length.
    #[inline]
    pub fn set_total_len(&mut self, v: u16) {
        self.set_u16_at(field::LENGTH, v)
    }

    /// Sets the identification.
    #[inline]
    pub fn set_ident(&mut self, v: u16) {
        self.set_u16_at(field::IDENT, v)
    }

    #[inline]
    fn set_flag(&mut self, mask: u16, on: bool) {
        let v = self.u16_at(field::FLG_OFF);
        self.set_u16_at(field::FLG_OFF, if on { v | mask } else { v & !mask });
    }

    /// Sets the don't-fragment flag.
    #[inline]
    pub fn set_dont_frag(&mut self, on: bool) {
        self.set_flag(FLAG_DF, on)
    }

    /// Sets the more-fragments flag.
    #[inline]
    pub fn set_more_frags(&mut self, on: bool) {
        self.set_flag(FLAG_MF, on)
    }

    /// Sets the fragment offset in bytes (must be a multiple of 8; low bits dropped).
    #[inline]
    pub fn set_frag_offset(&mut self, bytes: u16) {
        let v = self.u16_at(field::FLG_OFF);
        self.set_u16_at(field::FLG_OFF, (v & !OFFSET_MASK) | (bytes >> 3));
    }

    /// Sets the TTL.
    #[inline]
    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[field::TTL] = v;
    }

    /// Sets the protocol.
    #[inline]
    pub fn set_protocol(&mut self, v: IpProtocol) {
        self.buffer.as_mut()[field::PROTOCOL] = v.0;
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        self.set_u16_at(field::CHECKSUM, v)
    }

    /// Sets the source address (checksum not updated).
    #[inline]
    pub fn set_src_addr(&mut self, a: [u8; 4]) {
        self.buffer.as_mut()[field::SRC..field::SRC + 4].copy_from_slice(&a);
    }

    /// Sets the destination address (checksum not updated).
    #[inline]
    pub fn set_dst_addr(&mut self, a: [u8; 4]) {
        self.buffer.as_mut()[field::DST..field::DST + 4].copy_from_slice(&a);
    }

    /// Recomputes the header checksum over the whole header (options included).
    #[inline]
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum::checksum(self.header_bytes());
        self.set_checksum(c);
    }

    /// Sets the source address and updates the header checksum incrementally.
    #[inline]
    pub fn set_src_addr_incremental(&mut self, a: [u8; 4]) {
        let old = u32::from_be_bytes(self.src_addr());
        let c = checksum::update32(self.checksum(), old, u32::from_be_bytes(a));
        self.set_src_addr(a);
        self.set_checksum(c);
    }

    /// Sets the destination address and updates the header checksum incrementally.
    #[inline]
    pub fn set_dst_addr_incremental(&mut self, a: [u8; 4]) {
        let old = u32::from_be_bytes(self.dst_addr());
        let c = checksum::update32(self.checksum(), old, u32::from_be_bytes(a));
        self.set_dst_addr(a);
        self.set_checksum(c);
    }

    /// Decrements the TTL (saturating at 0) with an incremental checksum update;
    /// returns the new TTL.
    #[inline]
    pub fn decrement_ttl_incremental(&mut self) -> u8 {
        let b = self.buffer.as_ref();
        let old = u16::from_be_bytes([b[field::TTL], b[field::PROTOCOL]]);
        let ttl = self.ttl().saturating_sub(1);
        let new = ((ttl as u16) << 8) | (old & 0xff);
        let c = checksum::update16(self.checksum(), old, new);
        self.set_ttl(ttl);
        self.set_checksum(c);
        ttl
    }

    /// Mutable payload (header end to `total_len`, clamped to the buffer).
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        let total = self.total_len() as usize;
        let b = self.buffer.as_mut();
        let end = total.min(b.len());
        b.get_mut(hl..end).unwrap_or(&mut [])
    }
}

/// Which address of a packet to rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrField {
    /// The source address.
    Src,
    /// The destination address.
    Dst,
}

/// Rewrites an IPv4 address and keeps every checksum that covers it valid:
/// the IP header checksum and, when this packet carries the L4 header (not a
/// non-first fragment), the TCP or UDP checksum through its pseudo-header. A
/// UDP checksum of 0 ("none") stays 0. Other protocols' checksums do not
/// cover the address.
///
/// Validates the packet first and changes nothing on error (e.g. an L4 header
/// too short to hold its checksum field).
pub fn rewrite_addr<T: AsRef<[u8]> + AsMut<[u8]>>(
    packet: &mut Ipv4Packet<T>,
    which: AddrField,
    new: [u8; 4],
) -> Result<()> {
    packet.check_len()?;
    let old = match which {
        AddrField::Src => packet.src_addr(),
        AddrField::Dst => packet.dst_addr(),
    };
    let carries_l4 = packet.frag_offset() == 0;
    let l4_csum_at = match packet.protocol() {
        IpProtocol::TCP if carries_l4 => Some(16),
        IpProtocol::UDP if carries_l4 => Some(6),
        _ => None,
    };
    let udp = packet.protocol() == IpProtocol::UDP;
    if let Some(at) = l4_csum_at {
        let payload = packet.payload_mut();
        if payload.len() < at + 2 {
            return Err(WireError::Truncated);
        }
        let c = u16::from_be_bytes([payload[at], payload[at + 1]]);
        if !(udp && c == 0) {
            let mut n = checksum::update32(c, u32::from_be_bytes(old), u32::from_be_bytes(new));
            if udp && n == 0 {
                // RFC 768: a computed zero is sent as all ones; zero means "no checksum".
                n = 0xffff;
            }
            payload[at..at + 2].copy_from_slice(&n.to_be_bytes());
        }
    }
    match which {
        AddrField::Src => packet.set_src_addr_incremental(new),
        AddrField::Dst => packet.set_dst_addr_incremental(new),
    }
    Ok(())
}

/// A parsed IPv4 header (options are skipped, not represented).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// Payload protocol.
    pub protocol: IpProtocol,
    /// Payload length (total length minus header length).
    pub payload_len: usize,
    /// Time to live.
    pub ttl: u8,
    /// DSCP (0..=63).
    pub dscp: u8,
    /// ECN (0..=3).
    pub ecn: u8,
    /// Identification.
    pub ident: u16,
    /// Don't-fragment flag.
    pub dont_frag: bool,
    /// More-fragments flag.
    pub more_frags: bool,
    /// Fragment offset in bytes (multiple of 8, at most 65528).
    pub frag_offset: u16,
}

impl Ipv4Repr {
    /// Parses a header and verifies its checksum.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Ipv4Packet<&T>) -> Result<Ipv4Repr> {
        p.check_len()?;
        if !p.verify_checksum() {
            return Err(WireError::BadChecksum);
        }
        Ok(Self::parse_fields(p))
    }

    /// Parses a header without verifying the checksum (e.g. when a NIC already did).
    pub fn parse_unverified<T: AsRef<[u8]> + ?Sized>(p: &Ipv4Packet<&T>) -> Result<Ipv4Repr> {
        p.check_len()?;
        Ok(Self::parse_fields(p))
    }

    fn parse_fields<T: AsRef<[u8]> + ?Sized>(p: &Ipv4Packet<&T>) -> Ipv4Repr {
        Ipv4Repr {
            src_addr: Ipv4Addr::from(p.src_addr()),
            dst_addr: Ipv4Addr::from(p.dst_addr()),
            protocol: p.protocol(),
            payload_len: p.total_len() as usize - p.header_len(),
            ttl: p.ttl(),
            dscp: p.dscp(),
            ecn: p.ecn(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            more_frags: p.more_frags(),
            frag_offset: p.frag_offset(),
        }
    }

    /// Bytes [`Ipv4Repr::emit`] writes: the header only (no options).
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Header plus payload length, as written in the total-length field.
    #[inline]
    pub const fn total_len(&self) -> usize {
        HEADER_LEN + self.payload_len
    }

    /// Writes a 20-byte header with a valid checksum. The payload is not
    /// touched; the buffer need only hold the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut Ipv4Packet<&mut T>) -> Result<()> {
        if p.buffer.as_ref().len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let total = u16::try_from(self.total_len()).map_err(|_| WireError::BadLength)?;
        if self.dscp > 63 || self.ecn > 3 || self.frag_offset & 7 != 0 {
            return Err(WireError::Malformed);
        }
        let b = p.buffer.as_mut();
        b[field::VER_IHL] = 0x45;
        b[field::DSCP_ECN] = (self.dscp << 2) | self.ecn;
        let flags = if self.dont_frag { FLAG_DF } else { 0 } | if self.more_frags { FLAG_MF } else { 0 };
        p.set_total_len(total);
        p.set_ident(self.ident);
        p.set_u16_at(field::FLG_OFF, flags | (self.frag_offset >> 3));
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src_addr.octets());
        p.set_dst_addr(self.dst_addr.octets());
        p.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // IPv4 header + TCP SYN of the first packet of Wireshark's http.cap sample
    // (145.254.160.237:3372 -> 65.208.228.223:80), checksums as captured.
    pub(crate) const SYN: [u8; 48] = [
        0x45, 0x00, 0x00, 0x30, 0x0f, 0x41, 0x40, 0x00, 0x80, 0x06, 0x91, 0xeb, 0x91, 0xfe, 0xa0, 0xed, 0x41, 0xd0,
        0xe4, 0xdf, 0x0d, 0x2c, 0x00, 0x50, 0x38, 0xaf, 0xfe, 0x13, 0x00, 0x00, 0x00, 0x00, 0x70, 0x02, 0x22, 0x38,
        0xc3, 0x0c, 0x00, 0x00, 0x02, 0x04, 0x05, 0xb4, 0x01, 0x01, 0x04, 0x02,
    ];

    #[test]
    fn parse_captured_header() {
        let p = Ipv4Packet::new_checked(&SYN[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.total_len(), 48);
        assert_eq!(p.ident(), 0x0f41);
        assert!(p.dont_frag() && !p.more_frags() && !p.is_fragment() && !p.is_first_fragment());
        assert_eq!(p.ttl(), 128);
        assert_eq!(p.protocol(), IpProtocol::TCP);
        assert_eq!(p.src_addr(), [145, 254, 160, 237]);
        assert_eq!(p.dst_addr(), [65, 208, 228, 223]);
        assert_eq!(p.payload().len(), 28);
        let r = Ipv4Repr::parse(&p).unwrap();
        let mut out = [0u8; 20];
        r.emit(&mut Ipv4Packet::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(&out[..], &SYN[..20]);
    }

    #[test]
    fn validation_errors() {
        for n in 0..48 {
            assert!(Ipv4Packet::new_checked(&SYN[..n]).is_err(), "len {n}");
        }
        let mut b = SYN;
        b[0] = 0x65;
        assert_eq!(Ipv4Packet::new_checked(&b[..]).unwrap_err(), WireError::BadVersion);
        b[0] = 0x44;
        assert_eq!(Ipv4Packet::new_checked(&b[..]).unwrap_err(), WireError::BadHeaderLen);
        b[0] = 0x4f;
        assert_eq!(Ipv4Packet::new_checked(&b[..]).unwrap_err(), WireError::Truncated);
        b[0] = 0x45;
        b[3] = 19;
        assert_eq!(Ipv4Packet::new_checked(&b[..]).unwrap_err(), WireError::BadLength);
        let mut c = SYN;
        c[11] ^= 1;
        let p = Ipv4Packet::new_checked(&c[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&p), Err(WireError::BadChecksum));
        assert!(Ipv4Repr::parse_unverified(&p).is_ok());
    }

    #[test]
    fn options_and_padding() {
        // IHL 6 with a 4-byte NOP option block, then 2 bytes payload and 3 bytes of padding.
        let mut b = [0u8; 29];
        b[0] = 0x46;
        b[3] = 26;
        b[8] = 64;
        b[9] = 17;
        b[20..24].copy_from_slice(&[1, 1, 1, 0]);
        let mut p = Ipv4Packet::new_unchecked(&mut b[..]);
        p.fill_checksum();
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(p.options(), &[1, 1, 1, 0]);
        assert_eq!(p.payload().len(), 2);
    }

    #[test]
    fn fragments() {
        let mut b = SYN;
        let mut p = Ipv4Packet::new_unchecked(&mut b[..]);
        p.set_more_frags(true);
        assert!(p.is_fragment() && p.is_first_fragment());
        p.set_frag_offset(1480);
        assert_eq!(p.frag_offset(), 1480);
        assert!(p.is_fragment() && !p.is_first_fragment());
        p.set_more_frags(false);
        assert!(p.is_fragment() && !p.is_first_fragment());
    }

    #[test]
    fn incremental_updates_match_recompute() {
        let mut b = SYN;
        let mut p = Ipv4Packet::new_unchecked(&mut b[..]);
        p.set_src_addr_incremental([10, 1, 2, 3]);
        p.set_dst_addr_incremental([192, 168, 255, 254]);
        assert_eq!(p.decrement_ttl_incremental(), 127);
        assert!(p.verify_checksum());
        let c = p.checksum();
        p.fill_checksum();
        assert!(p.verify_checksum());
        // Both forms are valid; 0x0000 and 0xffff are the only possible divergence.
        assert!(c == p.checksum() || (c ^ p.checksum()) == 0xffff);
    }

    #[test]
    fn rewrite_addr_keeps_tcp_and_ip_checksums() {
        let mut b = SYN;
        let mut p = Ipv4Packet::new_checked(&mut b[..]).unwrap();
        rewrite_addr(&mut p, AddrField::Dst, [10, 0, 0, 7]).unwrap();
        rewrite_addr(&mut p, AddrField::Src, [172, 16, 0, 1]).unwrap();
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum());
        let tcp = crate::tcp::TcpPacket::new_checked(p.payload()).unwrap();
        assert!(tcp.verify_checksum(p.src_addr(), p.dst_addr()));
        // Truncated L4: refused, and nothing changed.
        let mut short = [0u8; 30];
        short[..30].copy_from_slice(&SYN[..30]);
        short[3] = 30;
        let mut q = Ipv4Packet::new_unchecked(&mut short[..]);
        q.fill_checksum();
        let before = short;
        let mut q = Ipv4Packet::new_unchecked(&mut short[..]);
        assert_eq!(rewrite_addr(&mut q, AddrField::Src, [1, 2, 3, 4]), Err(WireError::Truncated));
        assert_eq!(short, before);
    }

    #[test]
    fn pseudo_header_trait_matches_checksum_module() {
        let a = <[u8; 4]>::pseudo_sum([10, 0, 0, 1], [10, 0, 0, 2], IpProtocol::UDP, 20);
        assert_eq!(a, checksum::pseudo_header_v4([10, 0, 0, 1], [10, 0, 0, 2], 17, 20));
        let b = <[u8; 16]>::pseudo_sum([1; 16], [2; 16], IpProtocol::TCP, 70000);
        assert_eq!(b, checksum::pseudo_header_v6([1; 16], [2; 16], 6, 70000));
        assert_eq!(
            Ipv4Addr::pseudo_sum(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), IpProtocol::UDP, 20),
            a
        );
    }
}
