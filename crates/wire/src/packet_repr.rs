//! Whole-frame emission on top of the header Reprs: [`FrameBuilder`] emits
//! complete frames (Ethernet, VLAN tags, IPv4/IPv6, TCP/UDP/ICMP, GTP-U
//! tunnels around an inner packet) with correct lengths and checksums into a
//! caller's buffer, without allocating. Parsing frames is [`crate::frame`]'s.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::error::{Result, WireError};
use crate::ethernet::{self, EtherType, EthernetFrame, EthernetRepr, MacAddr};
use crate::gtpu::{GtpuPacket, GtpuRepr, PduSessionInfo};
use crate::icmp::{self, Icmpv4Packet, Icmpv4Repr, Icmpv6Packet, Icmpv6Repr};
use crate::ipv4::{self, IpProtocol, Ipv4Packet, Ipv4Repr};
use crate::ipv6::{self, Ipv6Packet, Ipv6Repr};
use crate::tcp::{TcpFlags, TcpPacket, TcpRepr};
use crate::udp::{self, UdpPacket, UdpRepr};
use crate::vlan::{self, VlanRepr, VlanTag};

/// Network header of a frame built by [`FrameBuilder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpSpec {
    /// IPv4 without options.
    V4 {
        /// Source.
        src: Ipv4Addr,
        /// Destination.
        dst: Ipv4Addr,
        /// TTL.
        ttl: u8,
        /// DSCP.
        dscp: u8,
        /// Identification.
        ident: u16,
        /// Don't-fragment flag.
        dont_frag: bool,
    },
    /// IPv6 without extension headers.
    V6 {
        /// Source.
        src: Ipv6Addr,
        /// Destination.
        dst: Ipv6Addr,
        /// Hop limit.
        hop_limit: u8,
        /// Traffic class.
        traffic_class: u8,
        /// Flow label.
        flow_label: u32,
    },
}

/// Transport header of a frame built by [`FrameBuilder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4Spec {
    /// UDP; `checksum: false` leaves 0 over IPv4 (IPv6 always gets a checksum).
    Udp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
        /// Compute the checksum.
        checksum: bool,
    },
    /// TCP with the header (and options) of a [`TcpRepr`].
    Tcp(TcpRepr),
    /// ICMP (v4 or v6 after the IP family) echo request or reply.
    IcmpEcho {
        /// Request (true) or reply.
        request: bool,
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
    },
    /// No transport header: the payload follows the IP header with this protocol number.
    Raw(IpProtocol),
}

/// Emits complete frames: optional Ethernet + up to two VLAN tags, IPv4 or
/// IPv6, TCP/UDP/ICMP, optionally GTP-U over the UDP header, then the
/// payload. All length fields and checksums are filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameBuilder {
    /// Ethernet (source, destination); `None` emits a bare IP packet (e.g. a T-PDU).
    pub eth: Option<(MacAddr, MacAddr)>,
    /// VLAN IDs, outermost first; two tags use the 802.1ad TPID outside.
    pub vlans: [Option<u16>; 2],
    /// Network header.
    pub ip: IpSpec,
    /// Transport header.
    pub l4: L4Spec,
    /// GTP-U header after a UDP header (ignored for other transports).
    pub gtpu: Option<GtpuRepr>,
}

/// Default source MAC of built frames (locally administered).
pub const DEFAULT_SRC_MAC: MacAddr = [0x02, 0, 0, 0, 0, 0x01];
/// Default destination MAC of built frames (locally administered).
pub const DEFAULT_DST_MAC: MacAddr = [0x02, 0, 0, 0, 0, 0x02];

impl FrameBuilder {
    /// Ethernet + IPv4 (TTL 64, DF) + UDP with checksum.
    pub fn udp_v4(src: Ipv4Addr, dst: Ipv4Addr, src_port: u16, dst_port: u16) -> Self {
        FrameBuilder {
            eth: Some((DEFAULT_SRC_MAC, DEFAULT_DST_MAC)),
            vlans: [None, None],
            ip: IpSpec::V4 { src, dst, ttl: 64, dscp: 0, ident: 0, dont_frag: true },
            l4: L4Spec::Udp { src_port, dst_port, checksum: true },
            gtpu: None,
        }
    }

    /// Ethernet + IPv6 (hop limit 64) + UDP.
    pub fn udp_v6(src: Ipv6Addr, dst: Ipv6Addr, src_port: u16, dst_port: u16) -> Self {
        FrameBuilder {
            ip: IpSpec::V6 { src, dst, hop_limit: 64, traffic_class: 0, flow_label: 0 },
            ..Self::udp_v4(Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED, src_port, dst_port)
        }
    }

    /// Ethernet + IPv4 + TCP with the given flags (seq 1, ack 0, window 65535, no options).
    pub fn tcp_v4(src: Ipv4Addr, dst: Ipv4Addr, src_port: u16, dst_port: u16, flags: TcpFlags) -> Self {
        FrameBuilder { l4: L4Spec::Tcp(Self::tcp_repr(src_port, dst_port, flags)), ..Self::udp_v4(src, dst, 0, 0) }
    }

    /// Ethernet + IPv6 + TCP (see [`FrameBuilder::tcp_v4`]).
    pub fn tcp_v6(src: Ipv6Addr, dst: Ipv6Addr, src_port: u16, dst_port: u16, flags: TcpFlags) -> Self {
        FrameBuilder { l4: L4Spec::Tcp(Self::tcp_repr(src_port, dst_port, flags)), ..Self::udp_v6(src, dst, 0, 0) }
    }

    fn tcp_repr(src_port: u16, dst_port: u16, flags: TcpFlags) -> TcpRepr {
        TcpRepr {
            src_port,
            dst_port,
            seq_number: 1,
            ack_number: 0,
            flags,
            window_len: 65535,
            urgent_at: 0,
            max_seg_size: None,
            window_scale: None,
            sack_permitted: false,
            timestamps: None,
        }
    }

    /// Turns a UDP builder into a GTP-U G-PDU tunnel (both ports 2152) with
    /// an optional PDU Session Container.
    pub fn with_gtpu(mut self, teid: u32, pdu_session: Option<PduSessionInfo>) -> Self {
        self.l4 = L4Spec::Udp { src_port: udp::GTPU_PORT, dst_port: udp::GTPU_PORT, checksum: true };
        self.gtpu = Some(GtpuRepr::g_pdu(teid, pdu_session, 0));
        self
    }

    /// Sets the VLAN tags (outermost first).
    pub fn with_vlans(mut self, vlans: [Option<u16>; 2]) -> Self {
        self.vlans = vlans;
        self
    }

    /// Drops the Ethernet header (and VLANs): emits a bare IP packet.
    pub fn without_ethernet(mut self) -> Self {
        self.eth = None;
        self
    }

    fn vlan_count(&self) -> usize {
        if self.eth.is_some() {
            self.vlans.iter().flatten().count()
        } else {
            0
        }
    }

    fn l2_len(&self) -> usize {
        self.eth.map_or(0, |_| ethernet::HEADER_LEN + self.vlan_count() * vlan::TAG_LEN)
    }

    fn l3_len(&self) -> usize {
        match self.ip {
            IpSpec::V4 { .. } => ipv4::HEADER_LEN,
            IpSpec::V6 { .. } => ipv6::HEADER_LEN,
        }
    }

    fn l4_len(&self) -> usize {
        match &self.l4 {
            L4Spec::Udp { .. } => udp::HEADER_LEN + self.gtpu.map_or(0, |g| g.buffer_len()),
            L4Spec::Tcp(t) => t.buffer_len(),
            L4Spec::IcmpEcho { .. } => icmp::HEADER_LEN,
            L4Spec::Raw(_) => 0,
        }
    }

    /// Bytes of all headers; the payload goes at this offset.
    pub fn header_len(&self) -> usize {
        self.l2_len() + self.l3_len() + self.l4_len()
    }

    /// Copies `payload` after the headers and emits them; returns the frame length.
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        let hl = self.header_len();
        buf.get_mut(hl..hl + payload.len()).ok_or(WireError::Truncated)?.copy_from_slice(payload);
        self.emit_headers(buf, payload.len())
    }

    /// Emits `inner` (a builder, usually without Ethernet) with `inner_payload`
    /// directly in this frame's payload slot, then this frame's headers around
    /// it: a GTP-U tunnel without an intermediate copy. Returns the frame length.
    pub fn emit_encapsulated(&self, buf: &mut [u8], inner: &FrameBuilder, inner_payload: &[u8]) -> Result<usize> {
        let hl = self.header_len();
        let slot = buf.get_mut(hl..).ok_or(WireError::Truncated)?;
        let inner_len = inner.emit(slot, inner_payload)?;
        self.emit_headers(buf, inner_len)
    }

    /// Emits every header for a payload of `payload_len` bytes that is already
    /// in place at [`FrameBuilder::header_len`], computing lengths and
    /// checksums over it. Returns the frame length.
    pub fn emit_headers(&self, buf: &mut [u8], payload_len: usize) -> Result<usize> {
        let l3 = self.l2_len();
        let l4 = l3 + self.l3_len();
        let total = self.header_len() + payload_len;
        let frame = buf.get_mut(..total).ok_or(WireError::Truncated)?;
        let l4_total = total - l4;
        // Transport header first: its checksum is computed after the IP header below is known.
        let protocol = match &self.l4 {
            L4Spec::Udp { src_port, dst_port, .. } => {
                let r = UdpRepr { src_port: *src_port, dst_port: *dst_port, payload_len: l4_total - udp::HEADER_LEN };
                r.emit(&mut UdpPacket::new_unchecked(&mut frame[l4..]))?;
                if let Some(g) = self.gtpu {
                    let g = GtpuRepr { payload_len, ..g };
                    g.emit(&mut GtpuPacket::new_unchecked(&mut frame[l4 + udp::HEADER_LEN..]))?;
                }
                IpProtocol::UDP
            }
            L4Spec::Tcp(t) => {
                t.emit(&mut TcpPacket::new_unchecked(&mut frame[l4..]))?;
                IpProtocol::TCP
            }
            L4Spec::IcmpEcho { request, ident, seq_no } => {
                let v6 = matches!(self.ip, IpSpec::V6 { .. });
                let rest = Icmpv4Repr::echo_request(*ident, *seq_no).rest_of_header;
                let msg_type = match (v6, request) {
                    (false, true) => icmp::icmpv4_type::ECHO_REQUEST,
                    (false, false) => icmp::icmpv4_type::ECHO_REPLY,
                    (true, true) => icmp::icmpv6_type::ECHO_REQUEST,
                    (true, false) => icmp::icmpv6_type::ECHO_REPLY,
                };
                if v6 {
                    let r = Icmpv6Repr { msg_type, msg_code: 0, rest_of_header: rest };
                    r.emit(&mut Icmpv6Packet::new_unchecked(&mut frame[l4..]))?;
                    IpProtocol::ICMPV6
                } else {
                    let r = Icmpv4Repr { msg_type, msg_code: 0, rest_of_header: rest };
                    r.emit(&mut Icmpv4Packet::new_unchecked(&mut frame[l4..]))?;
                    IpProtocol::ICMP
                }
            }
            L4Spec::Raw(p) => *p,
        };
        match self.ip {
            IpSpec::V4 { src, dst, ttl, dscp, ident, dont_frag } => {
                let r = Ipv4Repr {
                    src_addr: src,
                    dst_addr: dst,
                    protocol,
                    payload_len: l4_total,
                    ttl,
                    dscp,
                    ecn: 0,
                    ident,
                    dont_frag,
                    more_frags: false,
                    frag_offset: 0,
                };
                r.emit(&mut Ipv4Packet::new_unchecked(&mut frame[l3..]))?;
                self.fill_l4_checksum(&mut frame[l4..], src.octets(), dst.octets(), false);
            }
            IpSpec::V6 { src, dst, hop_limit, traffic_class, flow_label } => {
                let r = Ipv6Repr {
                    src_addr: src,
                    dst_addr: dst,
                    next_header: protocol,
                    payload_len: l4_total,
                    hop_limit,
                    traffic_class,
                    flow_label,
                };
                r.emit(&mut Ipv6Packet::new_unchecked(&mut frame[l3..]))?;
                self.fill_l4_checksum(&mut frame[l4..], src.octets(), dst.octets(), true);
                if let L4Spec::IcmpEcho { .. } = self.l4 {
                    Icmpv6Packet::new_unchecked(&mut frame[l4..]).fill_checksum(src.octets(), dst.octets());
                }
            }
        }
        if let Some((src, dst)) = self.eth {
            let vids = self.vlans.iter().flatten().copied();
            let n = self.vlan_count();
            let inner_type = match self.ip {
                IpSpec::V4 { .. } => EtherType::IPV4,
                IpSpec::V6 { .. } => EtherType::IPV6,
            };
            let first_type = match n {
                0 => inner_type,
                1 => EtherType::VLAN,
                _ => EtherType::QINQ,
            };
            EthernetRepr { src_addr: src, dst_addr: dst, ethertype: first_type }
                .emit(&mut EthernetFrame::new_unchecked(&mut frame[..]))?;
            for (i, vid) in vids.enumerate() {
                let next = if i + 1 == n { inner_type } else { EtherType::VLAN };
                let at = ethernet::HEADER_LEN + i * vlan::TAG_LEN;
                VlanRepr { pcp: 0, dei: false, vid, ethertype: next }
                    .emit(&mut VlanTag::new_unchecked(&mut frame[at..]))?;
            }
        }
        Ok(total)
    }

    fn fill_l4_checksum<A: ipv4::PseudoHeader>(&self, seg: &mut [u8], src: A, dst: A, v6: bool) {
        match self.l4 {
            L4Spec::Udp { checksum, .. } if checksum || v6 => UdpPacket::new_unchecked(seg).fill_checksum(src, dst),
            L4Spec::Tcp(_) => TcpPacket::new_unchecked(seg).fill_checksum(src, dst),
            L4Spec::IcmpEcho { .. } if !v6 => Icmpv4Packet::new_unchecked(seg).fill_checksum(),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::PktMeta;
    use crate::gtpu::{self, PduType};

    const A4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const B4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    fn a6() -> Ipv6Addr {
        "2001:db8::1".parse().unwrap()
    }

    fn b6() -> Ipv6Addr {
        "2001:db8::2".parse().unwrap()
    }

    // First frame of Wireshark's http.cap: Ethernet + IPv4 + TCP SYN with MSS/SACK-permitted.
    const HTTP_SYN: [u8; 62] = [
        0xfe, 0xff, 0x20, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x08, 0x00, 0x45, 0x00, 0x00, 0x30,
        0x0f, 0x41, 0x40, 0x00, 0x80, 0x06, 0x91, 0xeb, 0x91, 0xfe, 0xa0, 0xed, 0x41, 0xd0, 0xe4, 0xdf, 0x0d, 0x2c,
        0x00, 0x50, 0x38, 0xaf, 0xfe, 0x13, 0x00, 0x00, 0x00, 0x00, 0x70, 0x02, 0x22, 0x38, 0xc3, 0x0c, 0x00, 0x00,
        0x02, 0x04, 0x05, 0xb4, 0x01, 0x01, 0x04, 0x02,
    ];

    #[test]
    fn captured_syn_frame() {
        let m = PktMeta::parse(&HTTP_SYN);
        assert!(m.valid && !m.v6 && m.vlan == 0 && m.teid().is_none());
        assert_eq!((m.l3, m.l4, m.proto), (14, 34, IpProtocol::TCP));
        assert_eq!((m.tuple.src_port(), m.tuple.dst_port()), (3372, 80));
        let t = m.tcp(&HTTP_SYN).unwrap();
        assert_eq!((t.flags(), t.header_len(), t.payload().len()), (TcpFlags::SYN, 28, 0));
        // A capture cut anywhere inside the datagram hands out no TCP view.
        for n in 0..HTTP_SYN.len() {
            assert!(PktMeta::parse(&HTTP_SYN[..n]).tcp(&HTTP_SYN[..n]).is_none(), "len {n}");
        }
    }

    #[test]
    fn udp_v4_frame_round_trip() {
        let b = FrameBuilder::udp_v4(A4, B4, 1000, 53);
        let mut buf = [0u8; 128];
        let n = b.emit(&mut buf, b"hello").unwrap();
        assert_eq!(n, 14 + 20 + 8 + 5);
        let m = PktMeta::parse(&buf[..n]);
        assert_eq!((m.l4, m.tuple.src_port(), m.tuple.dst_port()), (34, 1000, 53));
        let ip = Ipv4Packet::new_checked(&buf[14..n]).unwrap();
        assert!(ip.verify_checksum());
        let u = UdpPacket::new_checked(ip.payload()).unwrap();
        assert!(u.checksum() != 0 && u.verify_checksum(A4, B4));
        assert_eq!(u.payload(), b"hello");
        // Ethernet padding after the datagram is tolerated and excluded.
        let m = PktMeta::parse(&buf[..64]);
        assert_eq!(m.l4_bytes(&buf[..64]).map(<[u8]>::len), Some(n - 34));
        assert!(matches!(b.emit(&mut buf[..46], b"hello"), Err(WireError::Truncated)));
    }

    #[test]
    fn tcp_v6_with_qinq() {
        let b = FrameBuilder::tcp_v6(a6(), b6(), 4000, 443, TcpFlags::SYN | TcpFlags::ACK)
            .with_vlans([Some(100), Some(200)]);
        let mut buf = [0u8; 200];
        let n = b.emit(&mut buf, &[7; 10]).unwrap();
        let m = PktMeta::parse(&buf[..n]);
        assert!(m.valid && m.v6);
        assert_eq!((m.vlan, m.l3, m.l4), (100, 22, 62));
        let t = m.tcp(&buf[..n]).unwrap();
        assert_eq!(t.flags(), TcpFlags::SYN | TcpFlags::ACK);
        assert_eq!(m.l4 as usize + t.header_len(), 82);
        let ip = Ipv6Packet::new_checked(&buf[22..n]).unwrap();
        let t = TcpPacket::new_checked(ip.payload()).unwrap();
        assert!(t.verify_checksum(ip.src_addr(), ip.dst_addr()));
    }

    #[test]
    fn icmp_echo_frames() {
        let mut b = FrameBuilder::udp_v4(A4, B4, 0, 0);
        b.l4 = L4Spec::IcmpEcho { request: true, ident: 9, seq_no: 3 };
        let mut buf = [0u8; 100];
        let n = b.emit(&mut buf, b"abcd").unwrap();
        let m = PktMeta::parse(&buf[..n]);
        let v = m.icmp(&buf[..n]).unwrap();
        assert!(v.is_echo_request() && v.msg_type() == icmp::icmpv4_type::ECHO_REQUEST && v.echo_ident() == 9);
        let ic = Icmpv4Packet::new_checked(&buf[34..n]).unwrap();
        assert!(ic.verify_checksum() && ic.echo_ident() == 9 && ic.echo_seq_no() == 3);
        let mut bv6 = FrameBuilder::udp_v6(a6(), b6(), 0, 0);
        bv6.l4 = L4Spec::IcmpEcho { request: false, ident: 1, seq_no: 2 };
        let n = bv6.emit(&mut buf, b"xyz").unwrap();
        let m = PktMeta::parse(&buf[..n]);
        assert!(m.icmp(&buf[..n]).is_some_and(|v| v.msg_type() == icmp::icmpv6_type::ECHO_REPLY && v.is_v6()));
        assert!(m.tcp(&buf[..n]).is_none());
        let ic = Icmpv6Packet::new_checked(&buf[54..n]).unwrap();
        assert!(ic.verify_checksum(a6().octets(), b6().octets()));
    }

    #[test]
    fn gtpu_tunnel_round_trip() {
        let psc = PduSessionInfo { pdu_type: PduType::Downlink, qfi: 5, ppp: false, rqi: true, ppi: None };
        let outer = FrameBuilder::udp_v4(Ipv4Addr::new(192, 168, 0, 1), Ipv4Addr::new(192, 168, 0, 2), 0, 0)
            .with_gtpu(0x1234_5678, Some(psc));
        let inner = FrameBuilder::tcp_v4(A4, B4, 5555, 80, TcpFlags::ACK).without_ethernet();
        let mut buf = [0u8; 256];
        let n = outer.emit_encapsulated(&mut buf, &inner, b"GET /").unwrap();
        assert_eq!(n, 14 + 20 + 8 + 16 + 20 + 20 + 5);
        let m = PktMeta::parse(&buf[..n]);
        assert_eq!(m.teid(), Some(0x1234_5678));
        let udp = UdpPacket::new_checked(m.l4_bytes(&buf[..n]).unwrap()).unwrap();
        let g = GtpuPacket::new_checked(udp.payload()).unwrap();
        let l = g.layout().unwrap();
        assert_eq!(
            (g.teid(), l.pdu_session.map(|p| p.qfi), g.msg_type()),
            (0x1234_5678, Some(5), gtpu::msg_type::G_PDU)
        );
        let inner_at = m.l4 as usize + udp::HEADER_LEN + l.header_len;
        assert_eq!((inner_at, l.end - l.header_len), (58, 45));
        let ip = Ipv4Packet::new_checked(&buf[inner_at..n]).unwrap();
        assert!(ip.verify_checksum());
        let t = TcpPacket::new_checked(ip.payload()).unwrap();
        assert!(t.verify_checksum(ip.src_addr(), ip.dst_addr()));
        assert_eq!(t.payload(), b"GET /");
        let outer_ip = Ipv4Packet::new_checked(&buf[14..n]).unwrap();
        assert!(UdpPacket::new_checked(outer_ip.payload())
            .unwrap()
            .verify_checksum(outer_ip.src_addr(), outer_ip.dst_addr()));
        for k in 0..n {
            assert!(PktMeta::parse(&buf[..k]).l4_bytes(&buf[..k]).is_none(), "len {k}");
        }
        // Junk on port 2152 stays plain UDP, with no TEID.
        let mut bad = buf;
        bad[42] = 0x50;
        let m = PktMeta::parse(&bad[..n]);
        assert!(m.valid && m.teid().is_none());
    }

    #[test]
    fn non_ip_and_fragments() {
        let mut arp = [0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(!PktMeta::parse(&arp).valid);
        // IPv4 non-first fragment: no L4 header.
        let b = FrameBuilder::udp_v4(A4, B4, 1, 2);
        let mut buf = [0u8; 100];
        let n = b.emit(&mut buf, &[0; 16]).unwrap();
        let mut ip = Ipv4Packet::new_unchecked(&mut buf[14..n]);
        ip.set_frag_offset(8);
        ip.fill_checksum();
        let m = PktMeta::parse(&buf[..n]);
        assert!(m.valid && m.l4 == 0 && m.tuple.is_non_first_fragment() && m.tuple.src_port() == 0);
        // First fragment whose UDP length exceeds the fragment: ports still read.
        let mut ip = Ipv4Packet::new_unchecked(&mut buf[14..n]);
        ip.set_frag_offset(0);
        ip.set_more_frags(true);
        ip.fill_checksum();
        let mut u = UdpPacket::new_unchecked(&mut buf[34..n]);
        u.set_len(1000);
        let m = PktMeta::parse(&buf[..n]);
        assert!(m.valid && m.tuple.src_port() == 1 && m.tuple.dst_port() == 2);
    }

    #[test]
    fn ipv6_fragment_header_in_frame() {
        let b = FrameBuilder::udp_v6(a6(), b6(), 7, 8);
        let mut buf = [0u8; 200];
        // Build a UDP/IPv6 frame, then splice a fragment header after the fixed header.
        let n = b.emit(&mut buf, &[1; 8]).unwrap();
        let mut out = [0u8; 200];
        out[..54].copy_from_slice(&buf[..54]);
        out[54..62].copy_from_slice(&[17, 0, 0x00, 0x01, 0, 0, 0, 42]);
        out[62..n + 8].copy_from_slice(&buf[54..n]);
        let mut ip = Ipv6Packet::new_unchecked(&mut out[14..]);
        ip.set_next_header(IpProtocol::IPV6_FRAG);
        ip.set_payload_len(ip.payload_len() + 8);
        let m = PktMeta::parse(&out[..n + 8]);
        assert!(m.valid && !m.tuple.is_non_first_fragment());
        assert_eq!((m.l4, m.tuple.src_port(), m.tuple.dst_port()), (62, 7, 8));
        out[57] = 0x08; // offset 8, M clear: last fragment
        let m = PktMeta::parse(&out[..n + 8]);
        assert!(m.valid && m.tuple.is_non_first_fragment() && m.l4 == 0);
        assert_eq!((m.tuple.proto(), m.tuple.src_port()), (17, 0));
    }
}
