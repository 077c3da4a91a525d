//! What a stateful NF sees of a packet: its bytes, the facts the executor
//! parsed once per batch ([`PktMeta`], from `flowplane_wire`'s frame parser),
//! checked views of its TCP segment and ICMP message, and rewriting helpers
//! that keep the IPv4 header checksum and the TCP/UDP checksum valid
//! incrementally (RFC 1624).

use std::net::{Ipv4Addr, Ipv6Addr};

use flowplane_wire::checksum::{apply_delta, delta32, update16, update_bytes};
use flowplane_wire::flow::FiveTuple;
use flowplane_wire::icmp::IcmpView;
use flowplane_wire::ipv4::IpProtocol;
use flowplane_wire::tcp::{TcpFlags, TcpPacket};

pub use flowplane_wire::frame::PktMeta;

#[inline(always)]
fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// A packet handed to a stateful NF's action.
pub struct Pkt<'a> {
    data: &'a mut [u8],
    meta: &'a PktMeta,
}

impl<'a> Pkt<'a> {
    /// Wraps a packet and its parsed facts.
    #[inline(always)]
    pub fn new(data: &'a mut [u8], meta: &'a PktMeta) -> Self {
        Pkt { data, meta }
    }

    /// Frame bytes.
    #[inline(always)]
    pub fn data(&self) -> &[u8] {
        self.data
    }

    /// Mutable frame bytes (raw access: keep checksums valid yourself).
    #[inline(always)]
    pub fn data_mut(&mut self) -> &mut [u8] {
        self.data
    }

    /// Frame length.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True for a zero-length frame.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Parsed facts.
    #[inline(always)]
    pub fn meta(&self) -> &PktMeta {
        self.meta
    }

    /// The 5-tuple as received.
    #[inline(always)]
    pub fn tuple(&self) -> &FiveTuple {
        &self.meta.tuple
    }

    /// IP protocol.
    #[inline(always)]
    pub fn proto(&self) -> IpProtocol {
        self.meta.proto
    }

    /// TCP flags, if this is a TCP packet with its header present.
    #[inline]
    pub fn tcp_flags(&self) -> Option<TcpFlags> {
        if self.meta.proto != IpProtocol::TCP || self.meta.l4 == 0 {
            return None;
        }
        self.data.get(self.meta.l4 as usize + 13).map(|&f| TcpFlags(f))
    }

    /// TCP sequence and acknowledgement numbers.
    pub fn tcp_seq_ack(&self) -> Option<(u32, u32)> {
        if self.meta.proto != IpProtocol::TCP || self.meta.l4 == 0 {
            return None;
        }
        let t = self.data.get(self.meta.l4 as usize..self.meta.l4 as usize + 12)?;
        Some((u32::from_be_bytes([t[4], t[5], t[6], t[7]]), u32::from_be_bytes([t[8], t[9], t[10], t[11]])))
    }

    /// The TCP segment as `flowplane_wire`'s checked view (header fields,
    /// [`TcpPacket::option_iter`], payload up to the IP datagram's end);
    /// `None` unless TCP with a whole header inside a whole datagram.
    #[inline]
    pub fn tcp(&self) -> Option<TcpPacket<&[u8]>> {
        self.meta.tcp(self.data)
    }

    /// The ICMP (IPv4) or ICMPv6 (IPv6) message as a checked view; an
    /// error's quoted packet is [`IcmpView::quoted_tuple`].
    #[inline]
    pub fn icmp(&self) -> Option<IcmpView<'_>> {
        self.meta.icmp(self.data)
    }

    // These rewriters work from the offsets parsed once per batch instead of
    // re-validating through `flowplane_wire`'s views (`ipv4::rewrite_addr`,
    // `TcpPacket::set_*_port_incremental`): they must also handle captures cut
    // short by a snap length, where the views rightly refuse the packet.

    /// Offset of the L4 checksum field, if it is present and in use.
    #[inline]
    fn l4_checksum_at(&self) -> Option<usize> {
        if self.meta.l4 == 0 {
            return None;
        }
        let l4 = self.meta.l4 as usize;
        let at = match self.meta.proto {
            IpProtocol::TCP => l4 + 16,
            IpProtocol::UDP => l4 + 6,
            _ => return None,
        };
        let c = be16(self.data, at)?;
        // UDP over IPv4 with checksum 0 carries none: keep it that way.
        if self.meta.proto == IpProtocol::UDP && c == 0 && !self.meta.v6 {
            return None;
        }
        Some(at)
    }

    /// Applies an incremental update `f` to the TCP/UDP checksum, if in use.
    #[inline]
    fn fix_l4_checksum(&mut self, f: impl FnOnce(u16) -> u16) {
        if let Some(at) = self.l4_checksum_at() {
            // One bounds check for the field (`l4_checksum_at` read it already).
            let Some(field) = self.data.get_mut(at..at + 2) else { return };
            let mut n = f(u16::from_be_bytes([field[0], field[1]]));
            if self.meta.proto == IpProtocol::UDP && n == 0 {
                n = 0xffff; // RFC 768: a computed zero is sent as all ones
            }
            field.copy_from_slice(&n.to_be_bytes());
        }
    }

    /// Rewrites the IPv4 address at `FIELD` (12: source, 16: destination)
    /// and both checksums; `false` if not IPv4. On every rewritten packet of
    /// a load balancer or NAT: one bounds check covers the header's fixed part.
    #[inline]
    fn set_ipv4_addr<const FIELD: usize>(&mut self, new: Ipv4Addr) -> bool {
        if self.meta.v6 || !self.meta.valid {
            return false;
        }
        let l3 = self.meta.l3 as usize;
        let Some(hdr) = self.data.get_mut(l3..l3 + 20) else { return false };
        let old = u32::from_be_bytes([hdr[FIELD], hdr[FIELD + 1], hdr[FIELD + 2], hdr[FIELD + 3]]);
        let newv = u32::from(new);
        if old == newv {
            return true;
        }
        hdr[FIELD..FIELD + 4].copy_from_slice(&newv.to_be_bytes());
        // The same delta updates the IPv4 header and the TCP/UDP checksum.
        let d = delta32(old, newv);
        let c = apply_delta(u16::from_be_bytes([hdr[10], hdr[11]]), d);
        hdr[10..12].copy_from_slice(&c.to_be_bytes());
        self.fix_l4_checksum(|c| apply_delta(c, d));
        true
    }

    /// Current IPv4 source address.
    pub fn ipv4_src(&self) -> Option<Ipv4Addr> {
        self.ipv4_addr(12)
    }

    /// Current IPv4 destination address.
    pub fn ipv4_dst(&self) -> Option<Ipv4Addr> {
        self.ipv4_addr(16)
    }

    fn ipv4_addr(&self, field: usize) -> Option<Ipv4Addr> {
        if self.meta.v6 || !self.meta.valid {
            return None;
        }
        let at = self.meta.l3 as usize + field;
        let b = self.data.get(at..at + 4)?;
        Some(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
    }

    /// Rewrites the IPv4 source address, updating both checksums. `false` if not IPv4.
    #[inline]
    pub fn set_ipv4_src(&mut self, a: Ipv4Addr) -> bool {
        self.set_ipv4_addr::<12>(a)
    }

    /// Rewrites the IPv4 destination address, updating both checksums. `false` if not IPv4.
    #[inline]
    pub fn set_ipv4_dst(&mut self, a: Ipv4Addr) -> bool {
        self.set_ipv4_addr::<16>(a)
    }

    /// Rewrites the IPv6 destination address, updating the TCP/UDP or
    /// ICMPv6 checksum (their pseudo-header covers it). `false` if not IPv6.
    pub fn set_ipv6_dst(&mut self, a: Ipv6Addr) -> bool {
        self.set_ipv6_addr(24, a)
    }

    /// Rewrites the IPv6 source address, updating the TCP/UDP or ICMPv6 checksum. `false` if not IPv6.
    pub fn set_ipv6_src(&mut self, a: Ipv6Addr) -> bool {
        self.set_ipv6_addr(8, a)
    }

    fn set_ipv6_addr(&mut self, field: usize, new: Ipv6Addr) -> bool {
        if !self.meta.v6 || !self.meta.valid {
            return false;
        }
        let at = self.meta.l3 as usize + field;
        let Some(cur) = self.data.get(at..at + 16) else { return false };
        let old: [u8; 16] = cur.try_into().unwrap_or([0; 16]);
        let newb = new.octets();
        if old == newb {
            return true;
        }
        self.data[at..at + 16].copy_from_slice(&newb);
        if field == 24 && self.routed_onward() {
            // The transport checksum's pseudo-header holds the final destination (RFC 8200 section 8.1),
            // which a Routing header with segments left names: this address is not in it.
            return true;
        }
        if self.meta.proto == IpProtocol::ICMPV6 && self.meta.l4 != 0 {
            let c = self.meta.l4 as usize + 2;
            if let Some(v) = be16(self.data, c) {
                self.data[c..c + 2].copy_from_slice(&update_bytes(v, &old, &newb).to_be_bytes());
            }
        } else {
            self.fix_l4_checksum(|c| update_bytes(c, &old, &newb));
        }
        true
    }

    /// An IPv6 packet whose extension headers (before the transport header) hold a Routing header with
    /// segments left: its destination address is the next hop of a source route, not the final one. Walks
    /// only when there are extension headers (the transport header past the fixed 40 bytes).
    fn routed_onward(&self) -> bool {
        let (l3, l4) = (self.meta.l3 as usize, self.meta.l4 as usize);
        if l4 <= l3 + 40 {
            return false;
        }
        let Some(ip) = self.data.get(l3..l4) else { return false };
        let (mut nh, mut at) = (ip[6], 40);
        while let Some(h) = ip.get(at..at + 4) {
            match nh {
                43 => return h[3] > 0,
                0 | 60 => at += (usize::from(h[1]) + 1) * 8,
                51 => at += (usize::from(h[1]) + 2) * 4,
                44 => at += 8,
                _ => return false,
            }
            nh = h[0];
        }
        false
    }

    fn set_port(&mut self, field: usize, port: u16) -> bool {
        if self.meta.l4 == 0 || !matches!(self.meta.proto, IpProtocol::TCP | IpProtocol::UDP) {
            return false;
        }
        let at = self.meta.l4 as usize + field;
        let Some(old) = be16(self.data, at) else { return false };
        self.data[at..at + 2].copy_from_slice(&port.to_be_bytes());
        self.fix_l4_checksum(|c| update16(c, old, port));
        true
    }

    /// Current TCP/UDP source port.
    pub fn src_port(&self) -> Option<u16> {
        if self.meta.l4 == 0 {
            return None;
        }
        be16(self.data, self.meta.l4 as usize)
    }

    /// Current TCP/UDP destination port.
    pub fn dst_port(&self) -> Option<u16> {
        if self.meta.l4 == 0 {
            return None;
        }
        be16(self.data, self.meta.l4 as usize + 2)
    }

    /// Rewrites the TCP/UDP source port, updating the checksum.
    pub fn set_src_port(&mut self, p: u16) -> bool {
        self.set_port(0, p)
    }

    /// Rewrites the TCP/UDP destination port, updating the checksum.
    pub fn set_dst_port(&mut self, p: u16) -> bool {
        self.set_port(2, p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{ipv4_frame, tcp4, udp4};

    #[test]
    fn views_and_accessors() {
        let syn = TcpFlags::SYN.bits();
        let mut f = tcp4([10, 0, 0, 1], [10, 0, 0, 2], 1000, 80, syn, 7, 0);
        let m = PktMeta::parse(&f);
        let p = Pkt::new(&mut f, &m);
        assert_eq!((p.proto(), p.tcp_flags(), p.tcp_seq_ack()), (IpProtocol::TCP, Some(TcpFlags::SYN), Some((7, 0))));
        let t = p.tcp().unwrap();
        assert_eq!((t.seq_number(), t.header_len(), t.payload().len()), (7, 20, 0));
        assert!(p.icmp().is_none());
        let mut u = udp4([10, 0, 0, 1], [10, 0, 0, 2], 1, 2);
        let m = PktMeta::parse(&u);
        let p = Pkt::new(&mut u, &m);
        assert!(p.tcp().is_none() && p.tcp_flags().is_none() && p.icmp().is_none());
        let mut e = ipv4_frame([10, 0, 0, 2], [10, 0, 0, 1], 1, &[0, 0, 0, 0, 0, 9, 0, 1]);
        let m = PktMeta::parse(&e);
        let p = Pkt::new(&mut e, &m);
        assert!(p.icmp().is_some_and(|i| i.is_echo_reply() && i.echo_ident() == 9));
    }

    /// Issue 33 (IPv6 extension headers in every NF): rewriting the destination of a packet with a Routing
    /// header keeps its UDP checksum right. Frames written by scapy (its checksum uses the final destination
    /// when segments are left, RFC 8200 8.1): with segments left the rewrite leaves the checksum alone, with
    /// none it updates it — each time the result is scapy's frame for the new destination.
    #[test]
    fn an_ipv6_destination_rewrite_behind_a_routing_header_keeps_the_checksum() {
        let hex = |s: &str| {
            (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect::<Vec<u8>>()
        };
        let head = "02000000000202000000000186dd6000000000252b40fd000000000000000000000000000005";
        let cases = [
            (
                "20010db8000000000000000000000001110200010000000020010db800000000000000000000000f0fa00035000d815f",
                "20010db8000000000000000000000099110200010000000020010db800000000000000000000000f0fa00035000d815f",
            ),
            (
                "20010db8000000000000000000000001110200000000000020010db800000000000000000000000f0fa00035000d816d",
                "20010db8000000000000000000000099110200000000000020010db800000000000000000000000f0fa00035000d80d5",
            ),
        ];
        for (before, after) in cases {
            let mut f = hex(&format!("{head}{before}68656c6c6f"));
            let m = PktMeta::parse(&f);
            assert!(m.valid && m.l4 as usize == 14 + 40 + 24, "{m:?}");
            let mut p = Pkt::new(&mut f, &m);
            assert!(p.set_ipv6_dst("2001:db8::99".parse().unwrap()));
            assert_eq!(f, hex(&format!("{head}{after}68656c6c6f")));
        }
    }

    #[test]
    fn rewrites_keep_checksums() {
        let mut f = tcp4([10, 0, 0, 1], [10, 0, 0, 2], 1000, 80, TcpFlags::ACK.bits(), 1, 1);
        let m = PktMeta::parse(&f);
        let mut p = Pkt::new(&mut f, &m);
        assert!(p.set_ipv4_src(Ipv4Addr::new(192, 0, 2, 7)) && p.set_src_port(4242));
        assert_eq!((p.ipv4_src(), p.src_port()), (Some(Ipv4Addr::new(192, 0, 2, 7)), Some(4242)));
        crate::testutil::assert_ipv4_checksums(&f);
    }

    /// Recomputes a UDP checksum from scratch (the oracle of the rewrite).
    fn udp_checksum_from_scratch(f: &[u8]) -> u16 {
        let (src, dst) = ([f[26], f[27], f[28], f[29]], [f[30], f[31], f[32], f[33]]);
        let mut seg = f[34..].to_vec();
        seg[6..8].fill(0);
        use flowplane_wire::checksum::{combine, finish, pseudo_header_v4, sum};
        match finish(combine(pseudo_header_v4(src, dst, 17, seg.len() as u16), sum(&seg))) {
            0 => 0xffff,
            c => c,
        }
    }

    #[test]
    fn a_udp_rewrite_that_sums_to_zero_sends_all_ones() {
        // Search the destinations for one whose new UDP checksum computes to
        // zero (about one in 65535), then check RFC 768's all-ones.
        let base = udp4([10, 0, 0, 1], [10, 0, 0, 2], 1000, 53);
        let hit = (0u32..1 << 20).find_map(|k| {
            let mut f = base.clone();
            let m = PktMeta::parse(&f);
            assert!(Pkt::new(&mut f, &m).set_ipv4_dst(Ipv4Addr::from(0x0a00_0000 | k)));
            (u16::from_be_bytes([f[40], f[41]]) == 0xffff).then_some(f)
        });
        let f = hit.expect("a destination whose checksum computes to zero");
        assert_eq!(udp_checksum_from_scratch(&f), 0xffff);
        crate::testutil::assert_ipv4_checksums(&f);
    }

    proptest::proptest! {
        /// Any address rewrite of TCP or UDP keeps both checksums valid, as
        /// recomputing them from scratch says (the UDP one bit for bit,
        /// including RFC 768's all-ones for a computed zero); a UDP checksum of
        /// 0 (none) stays 0.
        #[test]
        fn address_rewrites_match_a_from_scratch_checksum(
            src in proptest::prelude::any::<[u8; 4]>(),
            dst in proptest::prelude::any::<[u8; 4]>(),
            ports in proptest::prelude::any::<(u16, u16)>(),
            new in proptest::prelude::any::<[u8; 4]>(),
            tcp in proptest::prelude::any::<bool>(),
            rewrite_src in proptest::prelude::any::<bool>(),
            no_udp_checksum in proptest::prelude::any::<bool>(),
        ) {
            let mut f = if tcp {
                tcp4(src, dst, ports.0, ports.1, TcpFlags::ACK.bits(), 1, 1)
            } else {
                udp4(src, dst, ports.0, ports.1)
            };
            if !tcp && no_udp_checksum {
                f[40..42].fill(0);
            }
            let m = PktMeta::parse(&f);
            let mut p = Pkt::new(&mut f, &m);
            let a = Ipv4Addr::from(new);
            let done = if rewrite_src { p.set_ipv4_src(a) } else { p.set_ipv4_dst(a) };
            proptest::prop_assert!(done);
            proptest::prop_assert_eq!(if rewrite_src { p.ipv4_src() } else { p.ipv4_dst() }, Some(a));
            crate::testutil::assert_ipv4_checksums(&f);
            if !tcp {
                let c = u16::from_be_bytes([f[40], f[41]]);
                if no_udp_checksum {
                    proptest::prop_assert_eq!(c, 0);
                } else {
                    proptest::prop_assert_eq!(c, udp_checksum_from_scratch(&f));
                }
            }
        }
    }
}
