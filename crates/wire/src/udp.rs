//! UDP (RFC 768): the [`UdpPacket`] view with its length field validated
//! against the buffer, checksums over either IP family's pseudo-header
//! (0 = "no checksum" over IPv4), incremental port/address rewrites that keep
//! a 0 checksum at 0, and the plain [`UdpRepr`].

use crate::checksum;
use crate::error::{Result, WireError};
use crate::ipv4::{IpProtocol, PseudoHeader};

/// Length of the UDP header.
pub const HEADER_LEN: usize = 8;

/// The registered GTP-U port.
pub const GTPU_PORT: u16 = 2152;

/// A view of a UDP datagram.
#[derive(Debug, Clone)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wraps a buffer without checks; accessors may panic on a short buffer.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }

    /// Wraps a buffer after validating the length field.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Validates: whole header, length field >= 8 and within the buffer.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let l = self.len() as usize;
        if l < HEADER_LEN {
            return Err(WireError::BadLength);
        }
        if l > b.len() {
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

    /// Source port.
    #[inline]
    pub fn src_port(&self) -> u16 {
        self.u16_at(0)
    }

    /// Destination port.
    #[inline]
    pub fn dst_port(&self) -> u16 {
        self.u16_at(2)
    }

    /// Length field (header + payload).
    #[inline]
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u16 {
        self.u16_at(4)
    }

    /// Checksum as stored (0 = none, IPv4 only).
    #[inline]
    pub fn checksum(&self) -> u16 {
        self.u16_at(6)
    }

    /// The datagram as covered by the checksum: `len` bytes, clamped to the buffer.
    #[inline]
    fn datagram(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[..(self.len() as usize).min(b.len())]
    }

    /// Verifies the checksum with the pseudo-header of `src`/`dst`. A zero
    /// checksum field verifies (it means "not computed"; IPv6 callers that
    /// must reject it check [`UdpPacket::checksum`] themselves).
    #[inline]
    pub fn verify_checksum<A: PseudoHeader>(&self, src: A, dst: A) -> bool {
        if self.checksum() == 0 {
            return true;
        }
        let d = self.datagram();
        let ph = A::pseudo_sum(src, dst, IpProtocol::UDP, d.len());
        checksum::combine(ph, checksum::sum(d)) == 0xffff
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> UdpPacket<&'a T> {
    /// Payload: bytes 8..len (clamped to the buffer).
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        let b = self.buffer.as_ref();
        let end = (self.len() as usize).min(b.len());
        b.get(HEADER_LEN..end).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    #[inline]
    fn set_u16_at(&mut self, i: usize, v: u16) {
        self.buffer.as_mut()[i..i + 2].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the source port (checksum not updated).
    #[inline]
    pub fn set_src_port(&mut self, v: u16) {
        self.set_u16_at(0, v)
    }

    /// Sets the destination port (checksum not updated).
    #[inline]
    pub fn set_dst_port(&mut self, v: u16) {
        self.set_u16_at(2, v)
    }

    /// Sets the length field.
    #[inline]
    pub fn set_len(&mut self, v: u16) {
        self.set_u16_at(4, v)
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        self.set_u16_at(6, v)
    }

    /// Computes and stores the checksum over `len` bytes with the
    /// pseudo-header of `src`/`dst`; a computed 0 is stored as 0xffff.
    #[inline]
    pub fn fill_checksum<A: PseudoHeader>(&mut self, src: A, dst: A) {
        self.set_checksum(0);
        let d = self.datagram();
        let ph = A::pseudo_sum(src, dst, IpProtocol::UDP, d.len());
        let c = checksum::finish(checksum::combine(ph, checksum::sum(d)));
        self.set_checksum(if c == 0 { 0xffff } else { c });
    }

    /// Applies an RFC 1624 update unless the checksum is 0 (none).
    #[inline]
    fn adjust(&mut self, f: impl FnOnce(u16) -> u16) {
        let c = self.checksum();
        if c != 0 {
            let n = f(c);
            self.set_checksum(if n == 0 { 0xffff } else { n });
        }
    }

    /// Sets the source port, keeping the checksum valid (0 stays 0).
    #[inline]
    pub fn set_src_port_incremental(&mut self, v: u16) {
        let old = self.src_port();
        self.adjust(|c| checksum::update16(c, old, v));
        self.set_src_port(v);
    }

    /// Sets the destination port, keeping the checksum valid (0 stays 0).
    #[inline]
    pub fn set_dst_port_incremental(&mut self, v: u16) {
        let old = self.dst_port();
        self.adjust(|c| checksum::update16(c, old, v));
        self.set_dst_port(v);
    }

    /// Updates the checksum for an IPv4 pseudo-header address change (0 stays 0).
    #[inline]
    pub fn update_pseudo_addr_v4(&mut self, old: [u8; 4], new: [u8; 4]) {
        self.adjust(|c| checksum::update32(c, u32::from_be_bytes(old), u32::from_be_bytes(new)));
    }

    /// Updates the checksum for an IPv6 pseudo-header address change.
    #[inline]
    pub fn update_pseudo_addr_v6(&mut self, old: [u8; 16], new: [u8; 16]) {
        self.adjust(|c| checksum::update_bytes(c, &old, &new));
    }

    /// Mutable payload (8..len, clamped to the buffer).
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let l = self.len() as usize;
        let b = self.buffer.as_mut();
        let end = l.min(b.len());
        b.get_mut(HEADER_LEN..end).unwrap_or(&mut [])
    }
}

/// A parsed UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Payload length (length field minus 8).
    pub payload_len: usize,
}

impl UdpRepr {
    /// Parses the header (checksum not verified: it needs the addresses).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &UdpPacket<&T>) -> Result<UdpRepr> {
        p.check_len()?;
        Ok(UdpRepr { src_port: p.src_port(), dst_port: p.dst_port(), payload_len: p.len() as usize - HEADER_LEN })
    }

    /// Bytes [`UdpRepr::emit`] writes: the header.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header with checksum 0; call [`UdpPacket::fill_checksum`]
    /// once the payload is in place.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut UdpPacket<&mut T>) -> Result<()> {
        if p.buffer.as_ref().len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let len = u16::try_from(HEADER_LEN + self.payload_len).map_err(|_| WireError::BadLength)?;
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(len);
        p.set_checksum(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A DNS query for example.com from 192.168.1.100:53000 to 8.8.8.8:53, sent without a checksum.
    const SRC: [u8; 4] = [192, 168, 1, 100];
    const DST: [u8; 4] = [8, 8, 8, 8];

    fn query() -> Vec<u8> {
        let mut v = vec![0xcf, 0x08, 0x00, 0x35, 0x00, 0x00, 0x00, 0x00];
        v.extend_from_slice(&[0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00]);
        v.extend_from_slice(b"\x07example\x03com\x00\x00\x01\x00\x01");
        let l = v.len() as u16;
        v[4..6].copy_from_slice(&l.to_be_bytes());
        v
    }

    #[test]
    fn parse_and_checksum() {
        let mut v = query();
        let mut p = UdpPacket::new_checked(&mut v[..]).unwrap();
        assert_eq!(p.checksum(), 0);
        assert!(p.verify_checksum(SRC, DST));
        p.fill_checksum(SRC, DST);
        assert!(p.verify_checksum(SRC, DST));
        assert!(!p.verify_checksum(SRC, [8u8, 8, 4, 4]));
        let p = UdpPacket::new_checked(&v[..]).unwrap();
        let r = UdpRepr::parse(&p).unwrap();
        assert_eq!(r, UdpRepr { src_port: 53000, dst_port: 53, payload_len: 29 });
        assert_eq!(p.payload().len(), 29);
    }

    #[test]
    fn length_validation() {
        let v = query();
        for n in 0..v.len() {
            assert!(UdpPacket::new_checked(&v[..n]).is_err(), "len {n}");
        }
        let mut w = v.clone();
        w[4..6].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(UdpPacket::new_checked(&w[..]).unwrap_err(), WireError::BadLength);
        // Trailing bytes beyond `len` (Ethernet padding) are excluded from payload and checksum.
        let mut padded = v.clone();
        padded.extend_from_slice(&[0xee; 5]);
        let mut p = UdpPacket::new_checked(&mut padded[..]).unwrap();
        p.fill_checksum(SRC, DST);
        assert_eq!(p.payload_mut().len(), 29);
        assert!(p.verify_checksum(SRC, DST));
    }

    #[test]
    fn incremental_keeps_zero_and_valid() {
        let mut v = query();
        let mut p = UdpPacket::new_unchecked(&mut v[..]);
        p.set_dst_port_incremental(5353);
        p.update_pseudo_addr_v4(DST, [1, 1, 1, 1]);
        assert_eq!(p.checksum(), 0);
        p.fill_checksum(SRC, [1u8, 1, 1, 1]);
        p.set_src_port_incremental(1234);
        p.set_dst_port_incremental(53);
        p.update_pseudo_addr_v4([1, 1, 1, 1], DST);
        assert!(p.verify_checksum(SRC, DST));
        let s6 = [0xfd; 16];
        let d6 = [0xfe; 16];
        p.fill_checksum(s6, d6);
        p.update_pseudo_addr_v6(d6, [0x11; 16]);
        assert!(p.verify_checksum(s6, [0x11; 16]));
    }

    #[test]
    fn emit_round_trip() {
        let r = UdpRepr { src_port: 2152, dst_port: 2152, payload_len: 100 };
        let mut b = [0u8; 108];
        r.emit(&mut UdpPacket::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(UdpRepr::parse(&UdpPacket::new_checked(&b[..]).unwrap()).unwrap(), r);
        let big = UdpRepr { payload_len: 70000, ..r };
        assert_eq!(big.emit(&mut UdpPacket::new_unchecked(&mut b[..])), Err(WireError::BadLength));
    }
}
