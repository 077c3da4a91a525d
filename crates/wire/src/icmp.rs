//! ICMPv4 (RFC 792) and ICMPv6 (RFC 4443): views over the common 8-byte
//! header (type, code, checksum, rest-of-header with echo identifier and
//! sequence number), message-type constants, checksum helpers (ICMPv4 over
//! the message alone, ICMPv6 over the IPv6 pseudo-header), and plain Reprs.
//! [`IcmpView`] reads either family alike and finds the flow an error
//! message is about (the 5-tuple of the packet it quotes).

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::checksum;
use crate::error::{Result, WireError};
use crate::flow::{FiveTuple, FiveTupleV4, FiveTupleV6};
use crate::ipv4::{IpProtocol, PseudoHeader};

/// Length of the common ICMP header (type, code, checksum, rest of header).
pub const HEADER_LEN: usize = 8;

/// ICMPv4 message types.
pub mod icmpv4_type {
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 0;
    /// Destination unreachable.
    pub const DEST_UNREACHABLE: u8 = 3;
    /// Source quench (deprecated, RFC 6633, still an error message).
    pub const SOURCE_QUENCH: u8 = 4;
    /// Redirect.
    pub const REDIRECT: u8 = 5;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 8;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 11;
    /// Parameter problem.
    pub const PARAM_PROBLEM: u8 = 12;
}

/// ICMPv6 message types.
pub mod icmpv6_type {
    /// Destination unreachable.
    pub const DEST_UNREACHABLE: u8 = 1;
    /// Packet too big.
    pub const PACKET_TOO_BIG: u8 = 2;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 3;
    /// Parameter problem.
    pub const PARAM_PROBLEM: u8 = 4;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 128;
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 129;
    /// Router solicitation.
    pub const ROUTER_SOLICIT: u8 = 133;
    /// Router advertisement.
    pub const ROUTER_ADVERT: u8 = 134;
    /// Neighbor solicitation.
    pub const NEIGHBOR_SOLICIT: u8 = 135;
    /// Neighbor advertisement.
    pub const NEIGHBOR_ADVERT: u8 = 136;
}

macro_rules! icmp_common {
    ($packet:ident, $repr:ident, $echo_req:expr, $echo_rep:expr, $doc:literal) => {
        #[doc = concat!("A view of an ", $doc, " message.")]
        #[derive(Debug, Clone)]
        pub struct $packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $packet<T> {
            /// Wraps a buffer without checks; accessors may panic on a short buffer.
            #[inline]
            pub const fn new_unchecked(buffer: T) -> Self {
                $packet { buffer }
            }

            /// Wraps a buffer after checking it holds the 8-byte header.
            #[inline]
            pub fn new_checked(buffer: T) -> Result<Self> {
                let p = Self::new_unchecked(buffer);
                p.check_len()?;
                Ok(p)
            }

            /// Checks the buffer holds the header.
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

            #[inline]
            fn u16_at(&self, i: usize) -> u16 {
                let b = self.buffer.as_ref();
                u16::from_be_bytes([b[i], b[i + 1]])
            }

            /// Message type.
            #[inline]
            pub fn msg_type(&self) -> u8 {
                self.buffer.as_ref()[0]
            }

            /// Message code.
            #[inline]
            pub fn msg_code(&self) -> u8 {
                self.buffer.as_ref()[1]
            }

            /// Checksum as stored.
            #[inline]
            pub fn checksum(&self) -> u16 {
                self.u16_at(2)
            }

            /// The 4 rest-of-header bytes as one big-endian word.
            #[inline]
            pub fn rest_of_header(&self) -> u32 {
                let b = self.buffer.as_ref();
                u32::from_be_bytes([b[4], b[5], b[6], b[7]])
            }

            /// True for echo request and echo reply.
            #[inline]
            pub fn is_echo(&self) -> bool {
                {
                    let t = self.msg_type();
                    t == $echo_req || t == $echo_rep
                }
            }

            /// Echo identifier (meaningful for echo messages).
            #[inline]
            pub fn echo_ident(&self) -> u16 {
                self.u16_at(4)
            }

            /// Echo sequence number (meaningful for echo messages).
            #[inline]
            pub fn echo_seq_no(&self) -> u16 {
                self.u16_at(6)
            }
        }

        impl<'a, T: AsRef<[u8]> + ?Sized> $packet<&'a T> {
            /// Bytes after the 8-byte header.
            #[inline]
            pub fn payload(&self) -> &'a [u8] {
                self.buffer.as_ref().get(HEADER_LEN..).unwrap_or(&[])
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $packet<T> {
            #[inline]
            fn set_u16_at(&mut self, i: usize, v: u16) {
                self.buffer.as_mut()[i..i + 2].copy_from_slice(&v.to_be_bytes());
            }

            /// Sets the message type.
            #[inline]
            pub fn set_msg_type(&mut self, v: u8) {
                self.buffer.as_mut()[0] = v;
            }

            /// Sets the message code.
            #[inline]
            pub fn set_msg_code(&mut self, v: u8) {
                self.buffer.as_mut()[1] = v;
            }

            /// Sets the checksum field.
            #[inline]
            pub fn set_checksum(&mut self, v: u16) {
                self.set_u16_at(2, v)
            }

            /// Sets the rest-of-header word.
            #[inline]
            pub fn set_rest_of_header(&mut self, v: u32) {
                self.buffer.as_mut()[4..8].copy_from_slice(&v.to_be_bytes());
            }

            /// Sets the echo identifier.
            #[inline]
            pub fn set_echo_ident(&mut self, v: u16) {
                self.set_u16_at(4, v)
            }

            /// Sets the echo sequence number.
            #[inline]
            pub fn set_echo_seq_no(&mut self, v: u16) {
                self.set_u16_at(6, v)
            }

            /// Mutable bytes after the header.
            #[inline]
            pub fn payload_mut(&mut self) -> &mut [u8] {
                self.buffer.as_mut().get_mut(HEADER_LEN..).unwrap_or(&mut [])
            }
        }

        #[doc = concat!("A parsed ", $doc, " header (the body is the caller's).")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $repr {
            /// Message type.
            pub msg_type: u8,
            /// Message code.
            pub msg_code: u8,
            /// Rest of header (echo: identifier << 16 | sequence number).
            pub rest_of_header: u32,
        }

        impl $repr {
            /// An echo request.
            pub const fn echo_request(ident: u16, seq_no: u16) -> Self {
                $repr { msg_type: $echo_req, msg_code: 0, rest_of_header: ((ident as u32) << 16) | seq_no as u32 }
            }

            /// An echo reply.
            pub const fn echo_reply(ident: u16, seq_no: u16) -> Self {
                $repr { msg_type: $echo_rep, msg_code: 0, rest_of_header: ((ident as u32) << 16) | seq_no as u32 }
            }

            /// Parses the header (checksum verified separately).
            pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &$packet<&T>) -> Result<$repr> {
                p.check_len()?;
                Ok($repr { msg_type: p.msg_type(), msg_code: p.msg_code(), rest_of_header: p.rest_of_header() })
            }

            /// Bytes [`Self::emit`] writes: the 8-byte header.
            #[inline]
            pub const fn buffer_len(&self) -> usize {
                HEADER_LEN
            }

            /// Writes the header with checksum 0; fill the checksum once the body is in place.
            pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut $packet<&mut T>) -> Result<()> {
                p.check_len()?;
                p.set_msg_type(self.msg_type);
                p.set_msg_code(self.msg_code);
                p.set_checksum(0);
                p.set_rest_of_header(self.rest_of_header);
                Ok(())
            }
        }
    };
}

icmp_common!(Icmpv4Packet, Icmpv4Repr, icmpv4_type::ECHO_REQUEST, icmpv4_type::ECHO_REPLY, "ICMPv4");
icmp_common!(Icmpv6Packet, Icmpv6Repr, icmpv6_type::ECHO_REQUEST, icmpv6_type::ECHO_REPLY, "ICMPv6");

impl<T: AsRef<[u8]>> Icmpv4Packet<T> {
    /// Verifies the checksum over the whole buffer (ICMPv4 has no pseudo-header).
    /// The buffer must end where the message ends.
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        checksum::sum(self.buffer.as_ref()) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Icmpv4Packet<T> {
    /// Computes and stores the checksum over the whole buffer.
    #[inline]
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum::checksum(self.buffer.as_ref());
        self.set_checksum(c);
    }
}

impl<T: AsRef<[u8]>> Icmpv6Packet<T> {
    /// Verifies the checksum over the whole buffer with the IPv6 pseudo-header.
    #[inline]
    pub fn verify_checksum(&self, src: [u8; 16], dst: [u8; 16]) -> bool {
        let b = self.buffer.as_ref();
        let ph = <[u8; 16]>::pseudo_sum(src, dst, IpProtocol::ICMPV6, b.len());
        checksum::combine(ph, checksum::sum(b)) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Icmpv6Packet<T> {
    /// Computes and stores the checksum with the IPv6 pseudo-header.
    #[inline]
    pub fn fill_checksum(&mut self, src: [u8; 16], dst: [u8; 16]) {
        self.set_checksum(0);
        let b = self.buffer.as_ref();
        let ph = <[u8; 16]>::pseudo_sum(src, dst, IpProtocol::ICMPV6, b.len());
        let c = checksum::finish(checksum::combine(ph, checksum::sum(b)));
        self.set_checksum(c);
    }
}

/// An ICMPv4 or ICMPv6 message, read-only; the family is the IP header's.
#[derive(Debug, Clone)]
pub enum IcmpView<'a> {
    /// ICMP over IPv4.
    V4(Icmpv4Packet<&'a [u8]>),
    /// ICMPv6.
    V6(Icmpv6Packet<&'a [u8]>),
}

impl<'a> IcmpView<'a> {
    /// Views `buf` (the message up to the end of the IP datagram) as ICMPv6 if
    /// `v6`, else ICMPv4; `Truncated` without the 8-byte header.
    #[inline]
    pub fn new_checked(buf: &'a [u8], v6: bool) -> Result<Self> {
        Ok(if v6 {
            IcmpView::V6(Icmpv6Packet::new_checked(buf)?)
        } else {
            IcmpView::V4(Icmpv4Packet::new_checked(buf)?)
        })
    }

    /// True for ICMPv6.
    #[inline]
    pub fn is_v6(&self) -> bool {
        matches!(self, IcmpView::V6(_))
    }

    /// Message type.
    #[inline]
    pub fn msg_type(&self) -> u8 {
        match self {
            IcmpView::V4(p) => p.msg_type(),
            IcmpView::V6(p) => p.msg_type(),
        }
    }

    /// Message code.
    #[inline]
    pub fn msg_code(&self) -> u8 {
        match self {
            IcmpView::V4(p) => p.msg_code(),
            IcmpView::V6(p) => p.msg_code(),
        }
    }

    /// Echo request of the message's family.
    #[inline]
    pub fn is_echo_request(&self) -> bool {
        match self {
            IcmpView::V4(p) => p.msg_type() == icmpv4_type::ECHO_REQUEST,
            IcmpView::V6(p) => p.msg_type() == icmpv6_type::ECHO_REQUEST,
        }
    }

    /// Echo reply of the message's family.
    #[inline]
    pub fn is_echo_reply(&self) -> bool {
        match self {
            IcmpView::V4(p) => p.msg_type() == icmpv4_type::ECHO_REPLY,
            IcmpView::V6(p) => p.msg_type() == icmpv6_type::ECHO_REPLY,
        }
    }

    /// Echo identifier (meaningful for echo messages).
    #[inline]
    pub fn echo_ident(&self) -> u16 {
        match self {
            IcmpView::V4(p) => p.echo_ident(),
            IcmpView::V6(p) => p.echo_ident(),
        }
    }

    /// An error message that quotes the packet it is about: ICMPv4
    /// destination unreachable, source quench, redirect, time exceeded,
    /// parameter problem; ICMPv6 types 1-4.
    #[inline]
    pub fn is_error(&self) -> bool {
        use icmpv4_type as t4;
        match self {
            IcmpView::V4(p) => matches!(
                p.msg_type(),
                t4::DEST_UNREACHABLE | t4::SOURCE_QUENCH | t4::REDIRECT | t4::TIME_EXCEEDED | t4::PARAM_PROBLEM
            ),
            IcmpView::V6(p) => (icmpv6_type::DEST_UNREACHABLE..=icmpv6_type::PARAM_PROBLEM).contains(&p.msg_type()),
        }
    }

    /// Bytes after the 8-byte header (an error's quote).
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        match self {
            IcmpView::V4(p) => p.payload(),
            IcmpView::V6(p) => p.payload(),
        }
    }

    /// The 5-tuple of the packet an error message quotes, as that packet was
    /// sent: the quoted IP header of the message's family (IPv4 with options,
    /// IPv6 fixed header; its next header is taken as the transport), then
    /// the first 4 bytes of TCP/UDP for the ports, or an ICMP/ICMPv6 echo
    /// identifier as both ports (the flow-key convention), 0 for other
    /// protocols. `None` where the quote is too short or not IP of that family.
    pub fn quoted_tuple(&self) -> Option<FiveTuple> {
        let q = self.payload();
        let ports = |at: usize, p: u8| -> Option<(u16, u16)> {
            let b = |i: usize| q.get(at + i).copied();
            match IpProtocol(p) {
                IpProtocol::TCP | IpProtocol::UDP => {
                    Some((u16::from_be_bytes([b(0)?, b(1)?]), u16::from_be_bytes([b(2)?, b(3)?])))
                }
                IpProtocol::ICMP | IpProtocol::ICMPV6 => {
                    let id = u16::from_be_bytes([b(4)?, b(5)?]);
                    Some((id, id))
                }
                _ => Some((0, 0)),
            }
        };
        if self.is_v6() {
            let h = q.first_chunk::<40>()?;
            let p = h[6];
            let src = Ipv6Addr::from(*h[8..24].first_chunk::<16>()?);
            let dst = Ipv6Addr::from(*h[24..40].first_chunk::<16>()?);
            let (sp, dp) = ports(40, p)?;
            Some(FiveTuple::V6(FiveTupleV6::new(src, dst, sp, dp, p)))
        } else {
            let h = q.first_chunk::<20>()?;
            let ihl = (h[0] & 0x0f) as usize * 4;
            if h[0] >> 4 != 4 || ihl < 20 {
                return None;
            }
            let p = h[9];
            let src = Ipv4Addr::new(h[12], h[13], h[14], h[15]);
            let dst = Ipv4Addr::new(h[16], h[17], h[18], h[19]);
            let (sp, dp) = ports(ihl, p)?;
            Some(FiveTuple::V4(FiveTupleV4::new(src, dst, sp, dp, p)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // `ping -c1 -p 61` style echo request: id 0x1234, seq 1, 8 bytes of 0x61; checksum precomputed.
    const ECHO4: [u8; 16] = [8, 0, 0x60, 0x45, 0x12, 0x34, 0x00, 0x01, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61, 0x61];

    #[test]
    fn icmpv4_echo() {
        let p = Icmpv4Packet::new_checked(&ECHO4[..]).unwrap();
        assert!(p.is_echo());
        assert_eq!((p.echo_ident(), p.echo_seq_no()), (0x1234, 1));
        assert!(p.verify_checksum());
        let r = Icmpv4Repr::parse(&p).unwrap();
        assert_eq!(r, Icmpv4Repr::echo_request(0x1234, 1));
        let mut out = ECHO4;
        out[..8].fill(0);
        let mut q = Icmpv4Packet::new_unchecked(&mut out[..]);
        r.emit(&mut q).unwrap();
        q.fill_checksum();
        assert_eq!(out, ECHO4);
        for n in 0..HEADER_LEN {
            assert_eq!(Icmpv4Packet::new_checked(&ECHO4[..n]).unwrap_err(), WireError::Truncated);
        }
    }

    #[test]
    fn icmpv6_pseudo_header_checksum() {
        let src = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let dst = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        let mut b = [0u8; 12];
        let mut p = Icmpv6Packet::new_unchecked(&mut b[..]);
        Icmpv6Repr::echo_reply(7, 9).emit(&mut p).unwrap();
        p.payload_mut().copy_from_slice(b"ping");
        p.fill_checksum(src, dst);
        assert!(p.verify_checksum(src, dst));
        assert!(!p.verify_checksum(dst, [0; 16]));
        let p = Icmpv6Packet::new_checked(&b[..]).unwrap();
        assert!(p.is_echo() && p.msg_type() == icmpv6_type::ECHO_REPLY);
        assert_eq!(Icmpv6Repr::parse(&p).unwrap(), Icmpv6Repr::echo_reply(7, 9));
        // Independent check: sum of pseudo-header + message must be 0xffff.
        let mut all = Vec::new();
        all.extend_from_slice(&src);
        all.extend_from_slice(&dst);
        all.extend_from_slice(&[0, 0, 0, 12, 0, 0, 0, 58]);
        all.extend_from_slice(&b);
        assert_eq!(checksum::sum(&all), 0xffff);
    }

    #[test]
    fn view_quotes_the_invoking_packet() {
        // Port unreachable about a UDP datagram 10.0.0.1:5353 -> 10.0.0.2:53.
        let mut m = vec![3, 3, 0, 0, 0, 0, 0, 0, 0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        m.extend_from_slice(&[0x14, 0xe9, 0, 53, 0, 8, 0, 0]);
        let v = IcmpView::new_checked(&m, false).unwrap();
        assert!(v.is_error() && !v.is_echo_request() && !v.is_v6());
        let t = v.quoted_tuple().unwrap();
        assert_eq!((t.src_port(), t.dst_port(), t.proto()), (5353, 53, 17));
        assert_eq!(t.src_ip(), std::net::IpAddr::from([10, 0, 0, 1]));
        // The quote needs the IP header and the 4 port bytes.
        for n in 8..32 {
            assert_eq!(IcmpView::new_checked(&m[..n], false).unwrap().quoted_tuple(), None, "len {n}");
        }
        // Quoted ICMP echo: the identifier is both ports.
        let mut e = m[..28].to_vec();
        e[17] = 1;
        e.extend_from_slice(&[8, 0, 0, 0, 0x12, 0x34]);
        let t = IcmpView::new_checked(&e, false).unwrap().quoted_tuple().unwrap();
        assert_eq!((t.src_port(), t.dst_port()), (0x1234, 0x1234));
        // Not IPv4 inside, or an IHL below 5.
        let mut bad = m.clone();
        bad[8] = 0x44;
        assert_eq!(IcmpView::new_checked(&bad, false).unwrap().quoted_tuple(), None);
        // ICMPv6 packet too big quoting TCP over IPv6.
        let mut m6 = vec![2, 0, 0, 0, 0, 0, 5, 0xdc, 0x60, 0, 0, 0, 0, 20, 6, 64];
        m6.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        m6.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        m6.extend_from_slice(&[0x01, 0xbb, 0x9c, 0x40]);
        let v6 = IcmpView::new_checked(&m6, true).unwrap();
        assert!(v6.is_error() && v6.is_v6() && v6.msg_type() == icmpv6_type::PACKET_TOO_BIG);
        let t = v6.quoted_tuple().unwrap();
        assert_eq!((t.src_port(), t.dst_port(), t.proto(), t.is_ipv4()), (443, 40000, 6, false));
        let echo = IcmpView::new_checked(&[128, 0, 0, 0, 0, 7, 0, 1], true).unwrap();
        assert!(echo.is_echo_request() && !echo.is_echo_reply() && !echo.is_error() && echo.echo_ident() == 7);
        assert_eq!(IcmpView::new_checked(&[0, 0, 0], false).unwrap_err(), WireError::Truncated);
    }
}
