//! ARP (RFC 826) for Ethernet/IPv4, the only combination seen on real
//! networks: a view ([`ArpPacket`]) and a plain [`ArpRepr`].
//!
//! [`ArpPacket::new_checked`] refuses other hardware/protocol address sizes
//! with [`WireError::Unsupported`], so the fixed-offset accessors are safe.

use std::net::Ipv4Addr;

use crate::error::{Result, WireError};
use crate::ethernet::{EtherType, MacAddr};

/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = 28;

/// Hardware type for Ethernet.
pub const HTYPE_ETHERNET: u16 = 1;

/// ARP operation code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArpOperation(pub u16);

impl ArpOperation {
    /// who-has request.
    pub const REQUEST: ArpOperation = ArpOperation(1);
    /// is-at reply.
    pub const REPLY: ArpOperation = ArpOperation(2);
}

/// A view of an Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    /// Wraps a buffer without checks; accessors may panic on a short buffer.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        ArpPacket { buffer }
    }

    /// Wraps a buffer after checking its length and address sizes.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the fixed part, then that addresses are 6 + 4 bytes and present.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < 8 {
            return Err(WireError::Truncated);
        }
        if b[4] != 6 || b[5] != 4 {
            return Err(WireError::Unsupported);
        }
        if b.len() < PACKET_LEN {
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

    /// Hardware type (1 = Ethernet).
    #[inline]
    pub fn hardware_type(&self) -> u16 {
        self.u16_at(0)
    }

    /// Protocol type (0x0800 = IPv4).
    #[inline]
    pub fn protocol_type(&self) -> EtherType {
        EtherType(self.u16_at(2))
    }

    /// Hardware address length.
    #[inline]
    pub fn hardware_len(&self) -> u8 {
        self.buffer.as_ref()[4]
    }

    /// Protocol address length.
    #[inline]
    pub fn protocol_len(&self) -> u8 {
        self.buffer.as_ref()[5]
    }

    /// Operation.
    #[inline]
    pub fn operation(&self) -> ArpOperation {
        ArpOperation(self.u16_at(6))
    }

    #[inline]
    fn mac_at(&self, i: usize) -> MacAddr {
        let b = self.buffer.as_ref();
        [b[i], b[i + 1], b[i + 2], b[i + 3], b[i + 4], b[i + 5]]
    }

    #[inline]
    fn ip_at(&self, i: usize) -> [u8; 4] {
        let b = self.buffer.as_ref();
        [b[i], b[i + 1], b[i + 2], b[i + 3]]
    }

    /// Sender hardware address.
    #[inline]
    pub fn sender_hw_addr(&self) -> MacAddr {
        self.mac_at(8)
    }

    /// Sender protocol address.
    #[inline]
    pub fn sender_proto_addr(&self) -> [u8; 4] {
        self.ip_at(14)
    }

    /// Target hardware address.
    #[inline]
    pub fn target_hw_addr(&self) -> MacAddr {
        self.mac_at(18)
    }

    /// Target protocol address.
    #[inline]
    pub fn target_proto_addr(&self) -> [u8; 4] {
        self.ip_at(24)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> ArpPacket<&'a T> {
    /// Bytes after the ARP packet (Ethernet padding).
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[PACKET_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ArpPacket<T> {
    #[inline]
    fn set_u16_at(&mut self, i: usize, v: u16) {
        self.buffer.as_mut()[i..i + 2].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the hardware type.
    #[inline]
    pub fn set_hardware_type(&mut self, v: u16) {
        self.set_u16_at(0, v)
    }

    /// Sets the protocol type.
    #[inline]
    pub fn set_protocol_type(&mut self, v: EtherType) {
        self.set_u16_at(2, v.0)
    }

    /// Sets both address lengths.
    #[inline]
    pub fn set_addr_lens(&mut self, hw: u8, proto: u8) {
        let b = self.buffer.as_mut();
        b[4] = hw;
        b[5] = proto;
    }

    /// Sets the operation.
    #[inline]
    pub fn set_operation(&mut self, op: ArpOperation) {
        self.set_u16_at(6, op.0)
    }

    /// Sets the sender hardware address.
    #[inline]
    pub fn set_sender_hw_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[8..14].copy_from_slice(&a);
    }

    /// Sets the sender protocol address.
    #[inline]
    pub fn set_sender_proto_addr(&mut self, a: [u8; 4]) {
        self.buffer.as_mut()[14..18].copy_from_slice(&a);
    }

    /// Sets the target hardware address.
    #[inline]
    pub fn set_target_hw_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[18..24].copy_from_slice(&a);
    }

    /// Sets the target protocol address.
    #[inline]
    pub fn set_target_proto_addr(&mut self, a: [u8; 4]) {
        self.buffer.as_mut()[24..28].copy_from_slice(&a);
    }

    /// Mutable bytes after the ARP packet.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[PACKET_LEN..]
    }
}

/// A parsed Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArpRepr {
    /// Operation (request, reply, or another code).
    pub operation: ArpOperation,
    /// Sender MAC.
    pub sender_hw_addr: MacAddr,
    /// Sender IPv4 address.
    pub sender_ip: Ipv4Addr,
    /// Target MAC.
    pub target_hw_addr: MacAddr,
    /// Target IPv4 address.
    pub target_ip: Ipv4Addr,
}

impl ArpRepr {
    /// Parses an Ethernet/IPv4 ARP packet; other hardware/protocol types are `Unsupported`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &ArpPacket<&T>) -> Result<ArpRepr> {
        p.check_len()?;
        if p.hardware_type() != HTYPE_ETHERNET || p.protocol_type() != EtherType::IPV4 {
            return Err(WireError::Unsupported);
        }
        Ok(ArpRepr {
            operation: p.operation(),
            sender_hw_addr: p.sender_hw_addr(),
            sender_ip: Ipv4Addr::from(p.sender_proto_addr()),
            target_hw_addr: p.target_hw_addr(),
            target_ip: Ipv4Addr::from(p.target_proto_addr()),
        })
    }

    /// Bytes [`ArpRepr::emit`] writes.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        PACKET_LEN
    }

    /// Writes the packet; fails if the buffer is shorter than [`PACKET_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut ArpPacket<&mut T>) -> Result<()> {
        if p.buffer.as_ref().len() < PACKET_LEN {
            return Err(WireError::Truncated);
        }
        p.set_hardware_type(HTYPE_ETHERNET);
        p.set_protocol_type(EtherType::IPV4);
        p.set_addr_lens(6, 4);
        p.set_operation(self.operation);
        p.set_sender_hw_addr(self.sender_hw_addr);
        p.set_sender_proto_addr(self.sender_ip.octets());
        p.set_target_hw_addr(self.target_hw_addr);
        p.set_target_proto_addr(self.target_ip.octets());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // who-has 192.168.1.1 tell 192.168.1.100, as sent by a Linux host.
    const REQ: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0xc0, 0xa8, 0x01, 0x64,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xc0, 0xa8, 0x01, 0x01,
    ];

    #[test]
    fn parse_request() {
        let p = ArpPacket::new_checked(&REQ[..]).unwrap();
        let r = ArpRepr::parse(&p).unwrap();
        assert_eq!(r.operation, ArpOperation::REQUEST);
        assert_eq!(r.sender_hw_addr, [0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
        assert_eq!(r.sender_ip, Ipv4Addr::new(192, 168, 1, 100));
        assert_eq!(r.target_ip, Ipv4Addr::new(192, 168, 1, 1));
        let mut out = [0xaau8; 28];
        r.emit(&mut ArpPacket::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, REQ);
    }

    #[test]
    fn truncated_and_unsupported() {
        for n in 0..PACKET_LEN {
            assert!(ArpPacket::new_checked(&REQ[..n]).is_err(), "len {n}");
        }
        let mut other = REQ;
        other[4] = 8;
        assert_eq!(ArpPacket::new_checked(&other[..]).unwrap_err(), WireError::Unsupported);
        let mut ptype = REQ;
        ptype[2] = 0x86;
        let p = ArpPacket::new_checked(&ptype[..]).unwrap();
        assert_eq!(ArpRepr::parse(&p), Err(WireError::Unsupported));
    }
}
