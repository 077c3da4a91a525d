//! Ethernet II frames: a zero-copy view ([`EthernetFrame`]), the EtherType
//! constants the rest of the stack dispatches on, and a plain [`EthernetRepr`].
//!
//! The frame check sequence is not part of the view (NICs and pcaps strip it).

use crate::error::{Result, WireError};

/// A 48-bit MAC address.
pub type MacAddr = [u8; 6];

/// The broadcast MAC address.
pub const BROADCAST_MAC: MacAddr = [0xff; 6];

/// An EtherType value (network byte order is handled by the views).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct EtherType(pub u16);

impl EtherType {
    /// Internet Protocol version 4.
    pub const IPV4: EtherType = EtherType(0x0800);
    /// Address Resolution Protocol.
    pub const ARP: EtherType = EtherType(0x0806);
    /// Internet Protocol version 6.
    pub const IPV6: EtherType = EtherType(0x86dd);
    /// IEEE 802.1Q customer VLAN tag.
    pub const VLAN: EtherType = EtherType(0x8100);
    /// IEEE 802.1ad service VLAN tag (QinQ outer tag).
    pub const QINQ: EtherType = EtherType(0x88a8);
    /// Pre-standard QinQ outer tag still emitted by some switches.
    pub const QINQ_LEGACY: EtherType = EtherType(0x9100);

    /// True for the three tag protocol identifiers that introduce a VLAN tag.
    #[inline]
    pub const fn is_vlan(self) -> bool {
        matches!(self.0, 0x8100 | 0x88a8 | 0x9100)
    }
}

impl From<u16> for EtherType {
    fn from(v: u16) -> Self {
        EtherType(v)
    }
}

impl From<EtherType> for u16 {
    fn from(v: EtherType) -> Self {
        v.0
    }
}

/// Byte ranges of the Ethernet II header.
mod field {
    use core::ops::Range;
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
}

/// Length of the Ethernet II header.
pub const HEADER_LEN: usize = 14;

/// A read/write view of an Ethernet II frame.
#[derive(Debug, Clone)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a short buffer.
    /// Prefer [`EthernetFrame::new_checked`] for untrusted input.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    /// Wraps a buffer after checking that it holds a whole header.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// Checks that accessors cannot go out of bounds.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
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

    /// Header length (constant).
    #[inline]
    pub const fn header_len() -> usize {
        HEADER_LEN
    }

    /// Destination MAC address.
    #[inline]
    pub fn dst_addr(&self) -> MacAddr {
        let b = self.buffer.as_ref();
        [b[0], b[1], b[2], b[3], b[4], b[5]]
    }

    /// Source MAC address.
    #[inline]
    pub fn src_addr(&self) -> MacAddr {
        let b = self.buffer.as_ref();
        [b[6], b[7], b[8], b[9], b[10], b[11]]
    }

    /// EtherType (or tag protocol identifier when a VLAN tag follows).
    #[inline]
    pub fn ethertype(&self) -> EtherType {
        let b = self.buffer.as_ref();
        EtherType(u16::from_be_bytes([b[field::ETHERTYPE.start], b[field::ETHERTYPE.start + 1]]))
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> EthernetFrame<&'a T> {
    /// Bytes after the header (including any VLAN tags and Ethernet padding).
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Sets the destination MAC address.
    #[inline]
    pub fn set_dst_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&addr);
    }

    /// Sets the source MAC address.
    #[inline]
    pub fn set_src_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&addr);
    }

    /// Sets the EtherType.
    #[inline]
    pub fn set_ethertype(&mut self, t: EtherType) {
        self.buffer.as_mut()[field::ETHERTYPE].copy_from_slice(&t.0.to_be_bytes());
    }

    /// Mutable bytes after the header.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// A parsed Ethernet II header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// Source MAC.
    pub src_addr: MacAddr,
    /// Destination MAC.
    pub dst_addr: MacAddr,
    /// EtherType (or first VLAN TPID).
    pub ethertype: EtherType,
}

impl EthernetRepr {
    /// Reads the header fields from a checked view.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(frame: &EthernetFrame<&T>) -> Result<EthernetRepr> {
        frame.check_len()?;
        Ok(EthernetRepr { src_addr: frame.src_addr(), dst_addr: frame.dst_addr(), ethertype: frame.ethertype() })
    }

    /// Bytes [`EthernetRepr::emit`] writes.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header; fails if the buffer is too short.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, frame: &mut EthernetFrame<&mut T>) -> Result<()> {
        frame.check_len()?;
        frame.set_dst_addr(self.dst_addr);
        frame.set_src_addr(self.src_addr);
        frame.set_ethertype(self.ethertype);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Ethernet header of the first packet of Wireshark's http.cap sample.
    const FRAME: [u8; 16] =
        [0xfe, 0xff, 0x20, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x08, 0x00, 0x45, 0x00];

    #[test]
    fn parse_known_frame() {
        let f = EthernetFrame::new_checked(&FRAME[..]).unwrap();
        assert_eq!(f.dst_addr(), [0xfe, 0xff, 0x20, 0x00, 0x01, 0x00]);
        assert_eq!(f.src_addr(), [0x00, 0x00, 0x01, 0x00, 0x00, 0x00]);
        assert_eq!(f.ethertype(), EtherType::IPV4);
        assert_eq!(f.payload(), &[0x45, 0x00]);
        let r = EthernetRepr::parse(&f).unwrap();
        let mut out = [0u8; 16];
        let mut g = EthernetFrame::new_unchecked(&mut out[..]);
        r.emit(&mut g).unwrap();
        g.payload_mut().copy_from_slice(&[0x45, 0x00]);
        assert_eq!(out, FRAME);
    }

    #[test]
    fn truncated_at_every_length() {
        for n in 0..HEADER_LEN {
            assert_eq!(EthernetFrame::new_checked(&FRAME[..n]).unwrap_err(), WireError::Truncated);
        }
        let r = EthernetRepr { src_addr: [1; 6], dst_addr: [2; 6], ethertype: EtherType::ARP };
        let mut short = [0u8; 13];
        assert_eq!(r.emit(&mut EthernetFrame::new_unchecked(&mut short[..])), Err(WireError::Truncated));
    }

    #[test]
    fn vlan_tpids() {
        assert!(EtherType::VLAN.is_vlan() && EtherType::QINQ.is_vlan() && EtherType::QINQ_LEGACY.is_vlan());
        assert!(!EtherType::IPV4.is_vlan());
    }
}
