//! IPv6 (RFC 8200): the fixed-header view [`Ipv6Packet`] and [`Ipv6Repr`],
//! views of the generic options/routing extension header ([`Ipv6ExtHeader`])
//! and of the fragment header ([`Ipv6FragHeader`]), and the bounded
//! extension-header walker [`walk_extension_headers`] that finds the
//! upper-layer protocol.
//!
//! The walker skips hop-by-hop (0, only allowed first), routing (43),
//! destination options (60) and AH (51, with its own 4-octet length rule),
//! records a fragment header (44), and stops at ESP (50), No Next Header (59)
//! or any other protocol. It refuses chains longer than [`MAX_EXT_HEADERS`].

use std::net::Ipv6Addr;

pub use crate::ipv4::IpProtocol;

use crate::error::{Result, WireError};

/// Length of the fixed IPv6 header.
pub const HEADER_LEN: usize = 40;

/// Most extension headers [`walk_extension_headers`] will skip.
pub const MAX_EXT_HEADERS: usize = 8;

/// Length of the fragment header.
pub const FRAG_HEADER_LEN: usize = 8;

mod field {
    pub const PAYLOAD_LEN: usize = 4;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: usize = 8;
    pub const DST: usize = 24;
}

/// A view of an IPv6 packet (fixed header + payload, extension headers included in the payload).
#[derive(Debug, Clone)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Wraps a buffer without checks; accessors may panic on a short buffer.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv6Packet { buffer }
    }

    /// Wraps a buffer after validating version and payload length.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Validates: whole fixed header, version 6, payload length within the
    /// buffer (trailing padding allowed and excluded from the payload).
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if b[0] >> 4 != 6 {
            return Err(WireError::BadVersion);
        }
        if HEADER_LEN + self.payload_len() as usize > b.len() {
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
    fn word0(&self) -> u32 {
        let b = self.buffer.as_ref();
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    /// Version (6 for a checked packet).
    #[inline]
    pub fn version(&self) -> u8 {
        (self.word0() >> 28) as u8
    }

    /// Traffic class (DSCP << 2 | ECN).
    #[inline]
    pub fn traffic_class(&self) -> u8 {
        (self.word0() >> 20) as u8
    }

    /// Flow label (20 bits).
    #[inline]
    pub fn flow_label(&self) -> u32 {
        self.word0() & 0x000f_ffff
    }

    /// Payload length (extension headers included).
    #[inline]
    pub fn payload_len(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[field::PAYLOAD_LEN], b[field::PAYLOAD_LEN + 1]])
    }

    /// Next header of the fixed header.
    #[inline]
    pub fn next_header(&self) -> IpProtocol {
        IpProtocol(self.buffer.as_ref()[field::NEXT_HEADER])
    }

    /// Hop limit.
    #[inline]
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    #[inline]
    fn addr_at(&self, i: usize) -> [u8; 16] {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[i..i + 16]);
        a
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> [u8; 16] {
        self.addr_at(field::SRC)
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> [u8; 16] {
        self.addr_at(field::DST)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Ipv6Packet<&'a T> {
    /// Payload: `payload_len` bytes after the fixed header (clamped to the buffer).
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        let b = self.buffer.as_ref();
        let end = (HEADER_LEN + self.payload_len() as usize).min(b.len());
        b.get(HEADER_LEN..end).unwrap_or(&[])
    }

    /// Walks the extension headers of the payload (see [`walk_extension_headers`]).
    /// Offsets in the result are relative to the payload start.
    #[inline]
    pub fn upper_layer(&self) -> Result<Ipv6ExtInfo> {
        walk_extension_headers(self.next_header(), self.payload())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    #[inline]
    fn set_word0(&mut self, w: u32) {
        self.buffer.as_mut()[0..4].copy_from_slice(&w.to_be_bytes());
    }

    /// Sets the version nibble.
    #[inline]
    pub fn set_version(&mut self, v: u8) {
        let w = (self.word0() & 0x0fff_ffff) | (((v & 0xf) as u32) << 28);
        self.set_word0(w);
    }

    /// Sets the traffic class.
    #[inline]
    pub fn set_traffic_class(&mut self, tc: u8) {
        let w = (self.word0() & 0xf00f_ffff) | ((tc as u32) << 20);
        self.set_word0(w);
    }

    /// Sets the flow label (low 20 bits).
    #[inline]
    pub fn set_flow_label(&mut self, fl: u32) {
        let w = (self.word0() & 0xfff0_0000) | (fl & 0x000f_ffff);
        self.set_word0(w);
    }

    /// Sets the payload length.
    #[inline]
    pub fn set_payload_len(&mut self, v: u16) {
        self.buffer.as_mut()[field::PAYLOAD_LEN..field::PAYLOAD_LEN + 2].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the next header.
    #[inline]
    pub fn set_next_header(&mut self, v: IpProtocol) {
        self.buffer.as_mut()[field::NEXT_HEADER] = v.0;
    }

    /// Sets the hop limit.
    #[inline]
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = v;
    }

    /// Sets the source address (IPv6 has no header checksum; L4 checksums must be
    /// updated by the caller, e.g. with `TcpPacket::update_pseudo_addr_v6`).
    #[inline]
    pub fn set_src_addr(&mut self, a: [u8; 16]) {
        self.buffer.as_mut()[field::SRC..field::SRC + 16].copy_from_slice(&a);
    }

    /// Sets the destination address (see [`Ipv6Packet::set_src_addr`]).
    #[inline]
    pub fn set_dst_addr(&mut self, a: [u8; 16]) {
        self.buffer.as_mut()[field::DST..field::DST + 16].copy_from_slice(&a);
    }

    /// Mutable payload (clamped to the buffer).
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + self.payload_len() as usize;
        let b = self.buffer.as_mut();
        let end = end.min(b.len());
        b.get_mut(HEADER_LEN..end).unwrap_or(&mut [])
    }
}

/// A parsed IPv6 fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src_addr: Ipv6Addr,
    /// Destination address.
    pub dst_addr: Ipv6Addr,
    /// Next header of the fixed header.
    pub next_header: IpProtocol,
    /// Payload length (extension headers included).
    pub payload_len: usize,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (0..2^20).
    pub flow_label: u32,
}

impl Ipv6Repr {
    /// Parses the fixed header.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Ipv6Packet<&T>) -> Result<Ipv6Repr> {
        p.check_len()?;
        Ok(Ipv6Repr {
            src_addr: Ipv6Addr::from(p.src_addr()),
            dst_addr: Ipv6Addr::from(p.dst_addr()),
            next_header: p.next_header(),
            payload_len: p.payload_len() as usize,
            hop_limit: p.hop_limit(),
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
        })
    }

    /// Bytes [`Ipv6Repr::emit`] writes: the fixed header.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the fixed header; the payload is not touched.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut Ipv6Packet<&mut T>) -> Result<()> {
        if p.buffer.as_ref().len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let len = u16::try_from(self.payload_len).map_err(|_| WireError::BadLength)?;
        if self.flow_label > 0x000f_ffff {
            return Err(WireError::Malformed);
        }
        p.set_word0((6 << 28) | ((self.traffic_class as u32) << 20) | self.flow_label);
        p.set_payload_len(len);
        p.set_next_header(self.next_header);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(self.src_addr.octets());
        p.set_dst_addr(self.dst_addr.octets());
        Ok(())
    }
}

/// A view of a hop-by-hop, routing or destination-options header: next header,
/// length in 8-octet units not counting the first 8, then data.
#[derive(Debug, Clone)]
pub struct Ipv6ExtHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6ExtHeader<T> {
    /// Wraps a buffer without checks; accessors may panic on a short buffer.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv6ExtHeader { buffer }
    }

    /// Wraps a buffer after checking it holds the whole header.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let h = Self::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// Checks the length byte and that the header fits in the buffer.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < 2 || b.len() < self.header_len() {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Next header.
    #[inline]
    pub fn next_header(&self) -> IpProtocol {
        IpProtocol(self.buffer.as_ref()[0])
    }

    /// Total length of this header in bytes ((hdr ext len + 1) * 8).
    #[inline]
    pub fn header_len(&self) -> usize {
        (self.buffer.as_ref()[1] as usize + 1) * 8
    }

    /// Option/routing data after the two fixed bytes.
    #[inline]
    pub fn data(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        b.get(2..self.header_len().min(b.len())).unwrap_or(&[])
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Ipv6ExtHeader<&'a T> {
    /// Bytes after this header.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        let b = self.buffer.as_ref();
        b.get(self.header_len()..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6ExtHeader<T> {
    /// Sets the next header.
    #[inline]
    pub fn set_next_header(&mut self, v: IpProtocol) {
        self.buffer.as_mut()[0] = v.0;
    }

    /// Sets the length byte from a byte length (multiple of 8, 8..=2048).
    #[inline]
    pub fn set_header_len(&mut self, len: usize) {
        self.buffer.as_mut()[1] = (len / 8).saturating_sub(1).min(255) as u8;
    }

    /// Mutable option/routing data.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        let b = self.buffer.as_mut();
        let end = hl.min(b.len());
        b.get_mut(2..end).unwrap_or(&mut [])
    }
}

/// A hop-by-hop / routing / destination-options header, contents not interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6ExtHeaderRepr {
    /// Next header.
    pub next_header: IpProtocol,
    /// Total length in bytes (multiple of 8, 8..=2048).
    pub header_len: usize,
}

impl Ipv6ExtHeaderRepr {
    /// Parses the header's framing.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Ipv6ExtHeader<&T>) -> Result<Ipv6ExtHeaderRepr> {
        h.check_len()?;
        Ok(Ipv6ExtHeaderRepr { next_header: h.next_header(), header_len: h.header_len() })
    }

    /// Bytes [`Ipv6ExtHeaderRepr::emit`] writes.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        self.header_len
    }

    /// Writes the header; the data area is zero-filled, which is valid Pad1
    /// padding for options headers.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, h: &mut Ipv6ExtHeader<&mut T>) -> Result<()> {
        if self.header_len < 8 || self.header_len > 2048 || self.header_len & 7 != 0 {
            return Err(WireError::BadHeaderLen);
        }
        let b = h.buffer.as_mut();
        if b.len() < self.header_len {
            return Err(WireError::Truncated);
        }
        b[..self.header_len].fill(0);
        h.set_next_header(self.next_header);
        h.set_header_len(self.header_len);
        Ok(())
    }
}

/// A view of the IPv6 fragment header.
#[derive(Debug, Clone)]
pub struct Ipv6FragHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6FragHeader<T> {
    /// Wraps a buffer without checks; accessors may panic on a short buffer.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv6FragHeader { buffer }
    }

    /// Wraps a buffer after checking it holds 8 bytes.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let h = Self::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// Checks the buffer holds the whole header.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < FRAG_HEADER_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    /// Returns the underlying buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Next header.
    #[inline]
    pub fn next_header(&self) -> IpProtocol {
        IpProtocol(self.buffer.as_ref()[0])
    }

    #[inline]
    fn off_word(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[2], b[3]])
    }

    /// Fragment offset in bytes.
    #[inline]
    pub fn frag_offset(&self) -> u16 {
        self.off_word() & 0xfff8
    }

    /// More-fragments flag.
    #[inline]
    pub fn more_frags(&self) -> bool {
        self.off_word() & 1 != 0
    }

    /// Identification.
    #[inline]
    pub fn ident(&self) -> u32 {
        let b = self.buffer.as_ref();
        u32::from_be_bytes([b[4], b[5], b[6], b[7]])
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Ipv6FragHeader<&'a T> {
    /// Bytes after the header.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[FRAG_HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6FragHeader<T> {
    /// Sets the next header.
    #[inline]
    pub fn set_next_header(&mut self, v: IpProtocol) {
        self.buffer.as_mut()[0] = v.0;
    }

    /// Sets offset (bytes, multiple of 8) and the M flag; clears reserved bits.
    #[inline]
    pub fn set_offset_and_more(&mut self, offset: u16, more: bool) {
        let w = (offset & 0xfff8) | more as u16;
        let b = self.buffer.as_mut();
        b[1] = 0;
        b[2..4].copy_from_slice(&w.to_be_bytes());
    }

    /// Sets the identification.
    #[inline]
    pub fn set_ident(&mut self, v: u32) {
        self.buffer.as_mut()[4..8].copy_from_slice(&v.to_be_bytes());
    }

    /// Mutable bytes after the header.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[FRAG_HEADER_LEN..]
    }
}

/// A parsed fragment header; also what the walker reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6FragRepr {
    /// Next header.
    pub next_header: IpProtocol,
    /// Fragment offset in bytes (multiple of 8).
    pub frag_offset: u16,
    /// More-fragments flag.
    pub more_frags: bool,
    /// Identification.
    pub ident: u32,
}

impl Ipv6FragRepr {
    /// Parses a fragment header.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Ipv6FragHeader<&T>) -> Result<Ipv6FragRepr> {
        h.check_len()?;
        Ok(Ipv6FragRepr {
            next_header: h.next_header(),
            frag_offset: h.frag_offset(),
            more_frags: h.more_frags(),
            ident: h.ident(),
        })
    }

    /// Bytes [`Ipv6FragRepr::emit`] writes.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        FRAG_HEADER_LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, h: &mut Ipv6FragHeader<&mut T>) -> Result<()> {
        h.check_len()?;
        if self.frag_offset & 7 != 0 {
            return Err(WireError::Malformed);
        }
        h.set_next_header(self.next_header);
        h.set_offset_and_more(self.frag_offset, self.more_frags);
        h.set_ident(self.ident);
        Ok(())
    }

    /// True for any fragment but the first (no upper-layer header inside).
    #[inline]
    pub const fn is_later_fragment(&self) -> bool {
        self.frag_offset != 0
    }
}

/// Result of [`walk_extension_headers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6ExtInfo {
    /// Upper-layer protocol (or ESP / No Next Header where the walk ended).
    pub protocol: IpProtocol,
    /// Offset of the upper-layer header, relative to the slice walked.
    pub offset: usize,
    /// The fragment header, if one was seen. When its offset is non-zero the
    /// walk stopped right after it: `protocol` names the fragment's payload but
    /// no upper-layer header is present.
    pub fragment: Option<Ipv6FragRepr>,
    /// Number of extension headers skipped.
    pub header_count: u8,
}

/// Walks IPv6 extension headers starting with next-header `first` over
/// `data` (the IPv6 payload). Bounded by [`MAX_EXT_HEADERS`]; never reads
/// outside `data`.
///
/// Errors: `Truncated` if a header does not fit, `Malformed` for a
/// hop-by-hop header that is not first or a second fragment header,
/// `TooManyHeaders` past the bound.
pub fn walk_extension_headers(first: IpProtocol, data: &[u8]) -> Result<Ipv6ExtInfo> {
    let mut info = Ipv6ExtInfo { protocol: first, offset: 0, fragment: None, header_count: 0 };
    loop {
        let len = match info.protocol {
            IpProtocol::HOPOPT | IpProtocol::IPV6_ROUTE | IpProtocol::IPV6_OPTS | IpProtocol::AH => {
                if info.protocol == IpProtocol::HOPOPT && info.header_count != 0 {
                    return Err(WireError::Malformed);
                }
                let h = data.get(info.offset..info.offset + 2).ok_or(WireError::Truncated)?;
                // AH counts 4-octet units minus 2 (RFC 4302); the others 8-octet units minus 1.
                if info.protocol == IpProtocol::AH {
                    (h[1] as usize + 2) * 4
                } else {
                    (h[1] as usize + 1) * 8
                }
            }
            IpProtocol::IPV6_FRAG => {
                if info.fragment.is_some() {
                    return Err(WireError::Malformed);
                }
                let h = data.get(info.offset..).ok_or(WireError::Truncated)?;
                let frag = Ipv6FragRepr::parse(&Ipv6FragHeader::new_checked(h)?)?;
                info.fragment = Some(frag);
                FRAG_HEADER_LEN
            }
            _ => return Ok(info),
        };
        if info.header_count as usize == MAX_EXT_HEADERS {
            return Err(WireError::TooManyHeaders);
        }
        let end = info.offset + len;
        if end > data.len() {
            return Err(WireError::Truncated);
        }
        info.protocol = IpProtocol(data[info.offset]);
        info.offset = end;
        info.header_count += 1;
        if matches!(info.fragment, Some(f) if f.is_later_fragment()) {
            return Ok(info);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(next: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0x60, 0x00, 0x00, 0x00, 0, 0, next, 64];
        v[4..6].copy_from_slice(&(payload.len() as u16).to_be_bytes());
        v.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        v.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn fixed_header_round_trip() {
        let pkt = base(17, &[0u8; 8]);
        let p = Ipv6Packet::new_checked(&pkt[..]).unwrap();
        let r = Ipv6Repr::parse(&p).unwrap();
        assert_eq!(r.next_header, IpProtocol::UDP);
        assert_eq!(r.payload_len, 8);
        assert_eq!(r.src_addr, "2001:db8::1".parse::<Ipv6Addr>().unwrap());
        let mut out = vec![0u8; 48];
        r.emit(&mut Ipv6Packet::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, pkt);
        for n in 0..pkt.len() {
            assert!(Ipv6Packet::new_checked(&pkt[..n]).is_err(), "len {n}");
        }
        let mut v4 = pkt.clone();
        v4[0] = 0x40;
        assert_eq!(Ipv6Packet::new_checked(&v4[..]).unwrap_err(), WireError::BadVersion);
    }

    #[test]
    fn walk_hbh_routing_dest_ah_to_tcp() {
        let mut pl = Vec::new();
        pl.extend_from_slice(&[43, 0, 1, 4, 0, 0, 0, 0]); // HBH -> routing, 8 bytes
        pl.extend_from_slice(&[60, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // routing -> dest, 16
        pl.extend_from_slice(&[51, 0, 1, 4, 0, 0, 0, 0]); // dest -> AH, 8
        pl.extend_from_slice(&[6, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // AH len (4+2)*4
        pl.extend_from_slice(&[0u8; 20]);
        let pkt = base(0, &pl);
        let p = Ipv6Packet::new_checked(&pkt[..]).unwrap();
        let info = p.upper_layer().unwrap();
        assert_eq!(info.protocol, IpProtocol::TCP);
        assert_eq!(info.offset, 8 + 16 + 8 + 24);
        assert_eq!(info.header_count, 4);
        assert_eq!(info.fragment, None);
        // Truncating anywhere inside the chain is an error, never a panic.
        for n in 0..56 {
            assert_eq!(walk_extension_headers(IpProtocol::HOPOPT, &pl[..n]), Err(WireError::Truncated), "len {n}");
        }
    }

    #[test]
    fn walk_fragments() {
        let first = [17, 0, 0x00, 0x01, 0xde, 0xad, 0xbe, 0xef, 0, 0];
        let info = walk_extension_headers(IpProtocol::IPV6_FRAG, &first).unwrap();
        assert_eq!(info.protocol, IpProtocol::UDP);
        assert_eq!(info.offset, 8);
        let f = info.fragment.unwrap();
        assert!(f.more_frags && f.frag_offset == 0 && f.ident == 0xdeadbeef);
        // A later fragment whose payload starts with bytes that look like another header: walk stops.
        let later = [0, 0, 0x05, 0xc8, 0, 0, 0, 1, 44, 0, 0, 0, 0, 0, 0, 0];
        let info = walk_extension_headers(IpProtocol::IPV6_FRAG, &later).unwrap();
        assert_eq!(info.protocol, IpProtocol::HOPOPT);
        assert_eq!(info.fragment.unwrap().frag_offset, 1480);
        assert_eq!(info.offset, 8);
        let twice = [44, 0, 0, 1, 0, 0, 0, 1, 17, 0, 0, 1, 0, 0, 0, 1];
        assert_eq!(walk_extension_headers(IpProtocol::IPV6_FRAG, &twice), Err(WireError::Malformed));
    }

    #[test]
    fn walk_limits_and_terminals() {
        let chain: Vec<u8> = [60u8, 0, 0, 0, 0, 0, 0, 0].repeat(20);
        assert_eq!(walk_extension_headers(IpProtocol::IPV6_OPTS, &chain), Err(WireError::TooManyHeaders));
        let hbh_late = [0u8, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(walk_extension_headers(IpProtocol::IPV6_OPTS, &hbh_late), Err(WireError::Malformed));
        let esp = walk_extension_headers(IpProtocol::ESP, &[1, 2, 3]).unwrap();
        assert_eq!((esp.protocol, esp.offset), (IpProtocol::ESP, 0));
        let nonxt = walk_extension_headers(IpProtocol::IPV6_OPTS, &[59, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!((nonxt.protocol, nonxt.offset), (IpProtocol::IPV6_NONXT, 8));
    }

    #[test]
    fn ext_and_frag_repr_round_trip() {
        let r = Ipv6ExtHeaderRepr { next_header: IpProtocol::UDP, header_len: 24 };
        let mut b = [0xffu8; 24];
        r.emit(&mut Ipv6ExtHeader::new_unchecked(&mut b[..])).unwrap();
        let h = Ipv6ExtHeader::new_checked(&b[..]).unwrap();
        assert_eq!(Ipv6ExtHeaderRepr::parse(&h).unwrap(), r);
        assert_eq!(h.data().len(), 22);
        let f = Ipv6FragRepr { next_header: IpProtocol::TCP, frag_offset: 2960, more_frags: true, ident: 7 };
        let mut b = [0u8; 8];
        f.emit(&mut Ipv6FragHeader::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(Ipv6FragRepr::parse(&Ipv6FragHeader::new_checked(&b[..]).unwrap()).unwrap(), f);
    }
}
