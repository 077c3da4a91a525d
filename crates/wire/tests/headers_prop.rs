//! Property tests for the header views: every Repr survives emit -> parse,
//! built frames parse back to the facts they were built from, incremental
//! rewrites keep checksums valid, and no parser panics on arbitrary or
//! mutated bytes.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use flowplane_wire::arp::{ArpOperation, ArpPacket, ArpRepr};
use flowplane_wire::error::WireError;
use flowplane_wire::ethernet::{EtherType, EthernetFrame, EthernetRepr};
use flowplane_wire::flow::extract_five_tuple;
use flowplane_wire::frame::PktMeta;
use flowplane_wire::gtpu::{GtpuExtensions, GtpuPacket, GtpuRepr, PduSessionInfo, PduType};
use flowplane_wire::icmp::{Icmpv4Packet, Icmpv4Repr, Icmpv6Packet, Icmpv6Repr};
use flowplane_wire::ipv4::{self, AddrField, IpProtocol, Ipv4Packet, Ipv4Repr};
use flowplane_wire::ipv6::{
    self, Ipv6ExtHeader, Ipv6ExtHeaderRepr, Ipv6FragHeader, Ipv6FragRepr, Ipv6Packet, Ipv6Repr,
};
use flowplane_wire::packet_repr::{FrameBuilder, L4Spec};
use flowplane_wire::tcp::{TcpFlags, TcpOptions, TcpPacket, TcpRepr};
use flowplane_wire::udp::{UdpPacket, UdpRepr};
use flowplane_wire::vlan::{self, VlanRepr, VlanTag};
use proptest::prelude::*;

fn v4() -> impl Strategy<Value = Ipv4Addr> {
    any::<[u8; 4]>().prop_map(Ipv4Addr::from)
}

fn v6() -> impl Strategy<Value = Ipv6Addr> {
    any::<[u8; 16]>().prop_map(Ipv6Addr::from)
}

fn ipv4_repr() -> impl Strategy<Value = Ipv4Repr> {
    (
        (v4(), v4(), any::<u8>(), 0usize..1500, any::<u8>()),
        (0u8..64, 0u8..4, any::<u16>(), any::<bool>(), any::<bool>(), 0u16..8192),
    )
        .prop_map(|((s, d, p, len, ttl), (dscp, ecn, ident, df, mf, off))| Ipv4Repr {
            src_addr: s,
            dst_addr: d,
            protocol: IpProtocol(p),
            payload_len: len,
            ttl,
            dscp,
            ecn,
            ident,
            dont_frag: df,
            more_frags: mf,
            frag_offset: off * 8,
        })
}

fn ipv6_repr() -> impl Strategy<Value = Ipv6Repr> {
    (v6(), v6(), any::<u8>(), 0usize..1500, any::<u8>(), any::<u8>(), 0u32..(1 << 20)).prop_map(
        |(s, d, nh, len, hl, tc, fl)| Ipv6Repr {
            src_addr: s,
            dst_addr: d,
            next_header: IpProtocol(nh),
            payload_len: len,
            hop_limit: hl,
            traffic_class: tc,
            flow_label: fl,
        },
    )
}

fn tcp_repr() -> impl Strategy<Value = TcpRepr> {
    (
        (any::<u16>(), any::<u16>(), any::<u32>(), any::<u32>(), any::<u8>(), any::<u16>(), any::<u16>()),
        (any::<Option<u16>>(), any::<Option<u8>>(), any::<bool>(), any::<Option<(u32, u32)>>()),
    )
        .prop_map(|((sp, dp, seq, ack, fl, win, urg), (mss, ws, sack, ts))| TcpRepr {
            src_port: sp,
            dst_port: dp,
            seq_number: seq,
            ack_number: ack,
            flags: TcpFlags(fl),
            window_len: win,
            urgent_at: urg,
            max_seg_size: mss,
            window_scale: ws,
            sack_permitted: sack,
            timestamps: ts,
        })
}

fn pdu_session() -> impl Strategy<Value = PduSessionInfo> {
    prop_oneof![
        (0u8..64).prop_map(|qfi| PduSessionInfo { pdu_type: PduType::Uplink, qfi, ppp: false, rqi: false, ppi: None }),
        (0u8..64, any::<bool>(), proptest::option::of(0u8..8)).prop_map(|(qfi, rqi, ppi)| PduSessionInfo {
            pdu_type: PduType::Downlink,
            qfi,
            ppp: ppi.is_some(),
            rqi,
            ppi,
        }),
    ]
}

fn gtpu_repr() -> impl Strategy<Value = GtpuRepr> {
    (
        any::<u8>(),
        any::<u32>(),
        any::<Option<u16>>(),
        any::<Option<u8>>(),
        proptest::option::of(pdu_session()),
        0usize..600,
    )
        .prop_map(|(mt, teid, seq, npdu, psc, len)| GtpuRepr {
            msg_type: mt,
            teid,
            seq_number: seq,
            npdu_number: npdu,
            pdu_session: psc,
            payload_len: len,
        })
}

/// Calls every accessor of every view that accepts `data`; the point is that none panics.
fn poke_all(data: &[u8]) -> usize {
    let mut n = 0usize;
    if let Ok(f) = EthernetFrame::new_checked(data) {
        n += f.payload().len() + EthernetRepr::parse(&f).is_ok() as usize;
        n += vlan::skip_vlan_tags(f.payload(), f.ethertype(), 8).map_or(0, |s| s.offset);
    }
    if let Ok(t) = VlanTag::new_checked(data) {
        n += VlanRepr::parse(&t).map_or(0, |r| r.vid as usize) + t.payload().len();
    }
    if let Ok(a) = ArpPacket::new_checked(data) {
        n += ArpRepr::parse(&a).is_ok() as usize + a.payload().len();
    }
    if let Ok(p) = Ipv4Packet::new_checked(data) {
        n += p.payload().len() + p.options().len() + p.verify_checksum() as usize;
        n += Ipv4Repr::parse(&p).is_ok() as usize + Ipv4Repr::parse_unverified(&p).is_ok() as usize;
        n += p.is_fragment() as usize + p.is_first_fragment() as usize;
        let mut copy = data.to_vec();
        let mut q = Ipv4Packet::new_unchecked(&mut copy[..]);
        n += ipv4::rewrite_addr(&mut q, AddrField::Src, [1, 2, 3, 4]).is_ok() as usize;
    }
    if let Ok(p) = Ipv6Packet::new_checked(data) {
        n += p.payload().len() + Ipv6Repr::parse(&p).is_ok() as usize;
        n += p.upper_layer().map_or(0, |i| i.offset);
    }
    for first in [0u8, 43, 44, 51, 60] {
        n += ipv6::walk_extension_headers(IpProtocol(first), data).map_or(0, |i| i.offset);
    }
    if let Ok(h) = Ipv6ExtHeader::new_checked(data) {
        n += h.data().len() + h.payload().len() + Ipv6ExtHeaderRepr::parse(&h).is_ok() as usize;
    }
    if let Ok(h) = Ipv6FragHeader::new_checked(data) {
        n += h.payload().len() + Ipv6FragRepr::parse(&h).is_ok() as usize;
    }
    if let Ok(t) = TcpPacket::new_checked(data) {
        n += t.payload().len() + t.option_iter().count() + TcpRepr::parse(&t).is_ok() as usize;
        n += t.verify_checksum([1u8; 4], [2u8; 4]) as usize + t.verify_checksum([1u8; 16], [2u8; 16]) as usize;
    }
    n += TcpOptions::new(data).count();
    if let Ok(u) = UdpPacket::new_checked(data) {
        n += u.payload().len() + UdpRepr::parse(&u).is_ok() as usize + u.verify_checksum([0u8; 4], [0u8; 4]) as usize;
    }
    if let Ok(i) = Icmpv4Packet::new_checked(data) {
        n += i.payload().len() + Icmpv4Repr::parse(&i).is_ok() as usize + i.verify_checksum() as usize;
    }
    if let Ok(i) = Icmpv6Packet::new_checked(data) {
        n += Icmpv6Repr::parse(&i).is_ok() as usize + i.verify_checksum([0; 16], [0; 16]) as usize;
    }
    let g = GtpuPacket::new_unchecked(data);
    n += g.payload().len() + g.header_len() + g.extensions().count() + g.qfi().is_some() as usize;
    if let Ok(g) = GtpuPacket::new_checked(data) {
        n += GtpuRepr::parse(&g).is_ok() as usize + g.seq_number().is_some() as usize;
    }
    n += GtpuExtensions::new(data, 0x85).count() + PduSessionInfo::parse(data).is_ok() as usize;
    let m = PktMeta::parse(data);
    n += m.l4 as usize + extract_five_tuple(data).is_ok() as usize;
    n += m.l4_bytes(data).map_or(0, <[u8]>::len) + m.tcp(data).map_or(0, |t| t.option_iter().count());
    n += m.icmp(data).and_then(|i| i.quoted_tuple()).is_some() as usize;
    n
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn ethernet_round_trip(src in any::<[u8; 6]>(), dst in any::<[u8; 6]>(), et in any::<u16>()) {
        let r = EthernetRepr { src_addr: src, dst_addr: dst, ethertype: EtherType(et) };
        let mut b = [0u8; 14];
        r.emit(&mut EthernetFrame::new_unchecked(&mut b[..])).unwrap();
        prop_assert_eq!(EthernetRepr::parse(&EthernetFrame::new_checked(&b[..]).unwrap()).unwrap(), r);
    }

    #[test]
    fn vlan_round_trip(pcp in 0u8..8, dei in any::<bool>(), vid in 0u16..4096, et in any::<u16>()) {
        let r = VlanRepr { pcp, dei, vid, ethertype: EtherType(et) };
        let mut b = [0u8; 4];
        r.emit(&mut VlanTag::new_unchecked(&mut b[..])).unwrap();
        prop_assert_eq!(VlanRepr::parse(&VlanTag::new_checked(&b[..]).unwrap()).unwrap(), r);
    }

    #[test]
    fn arp_round_trip(op in any::<u16>(), sh in any::<[u8; 6]>(), th in any::<[u8; 6]>(), si in v4(), ti in v4()) {
        let r = ArpRepr { operation: ArpOperation(op), sender_hw_addr: sh, sender_ip: si, target_hw_addr: th, target_ip: ti };
        let mut b = [0u8; 28];
        r.emit(&mut ArpPacket::new_unchecked(&mut b[..])).unwrap();
        prop_assert_eq!(ArpRepr::parse(&ArpPacket::new_checked(&b[..]).unwrap()).unwrap(), r);
    }

    #[test]
    fn ipv4_round_trip(r in ipv4_repr()) {
        let mut b = vec![0u8; r.total_len()];
        r.emit(&mut Ipv4Packet::new_unchecked(&mut b[..])).unwrap();
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        prop_assert!(p.verify_checksum());
        prop_assert_eq!(Ipv4Repr::parse(&p).unwrap(), r);
    }

    #[test]
    fn ipv6_round_trip(r in ipv6_repr()) {
        let mut b = vec![0u8; 40 + r.payload_len];
        r.emit(&mut Ipv6Packet::new_unchecked(&mut b[..])).unwrap();
        prop_assert_eq!(Ipv6Repr::parse(&Ipv6Packet::new_checked(&b[..]).unwrap()).unwrap(), r);
    }

    #[test]
    fn ipv6_ext_round_trip(nh in any::<u8>(), units in 1usize..=256, off in 0u16..8192, m in any::<bool>(), id in any::<u32>()) {
        let e = Ipv6ExtHeaderRepr { next_header: IpProtocol(nh), header_len: units * 8 };
        let mut b = vec![0u8; e.buffer_len()];
        e.emit(&mut Ipv6ExtHeader::new_unchecked(&mut b[..])).unwrap();
        prop_assert_eq!(Ipv6ExtHeaderRepr::parse(&Ipv6ExtHeader::new_checked(&b[..]).unwrap()).unwrap(), e);
        let f = Ipv6FragRepr { next_header: IpProtocol(nh), frag_offset: off * 8, more_frags: m, ident: id };
        let mut b = [0u8; 8];
        f.emit(&mut Ipv6FragHeader::new_unchecked(&mut b[..])).unwrap();
        prop_assert_eq!(Ipv6FragRepr::parse(&Ipv6FragHeader::new_checked(&b[..]).unwrap()).unwrap(), f);
    }

    #[test]
    fn tcp_round_trip(r in tcp_repr(), payload in proptest::collection::vec(any::<u8>(), 0..64), s in any::<[u8; 4]>(), d in any::<[u8; 4]>()) {
        let hl = r.buffer_len();
        let mut b = vec![0u8; hl + payload.len()];
        b[hl..].copy_from_slice(&payload);
        r.emit(&mut TcpPacket::new_unchecked(&mut b[..])).unwrap();
        let mut p = TcpPacket::new_unchecked(&mut b[..]);
        p.fill_checksum(s, d);
        let p = TcpPacket::new_checked(&b[..]).unwrap();
        prop_assert!(p.verify_checksum(s, d));
        prop_assert_eq!(p.payload(), &payload[..]);
        prop_assert_eq!(TcpRepr::parse(&p).unwrap(), r);
    }

    #[test]
    fn udp_round_trip(sp in any::<u16>(), dp in any::<u16>(), payload in proptest::collection::vec(any::<u8>(), 0..64), s in any::<[u8; 16]>(), d in any::<[u8; 16]>()) {
        let r = UdpRepr { src_port: sp, dst_port: dp, payload_len: payload.len() };
        let mut b = vec![0u8; 8 + payload.len()];
        b[8..].copy_from_slice(&payload);
        r.emit(&mut UdpPacket::new_unchecked(&mut b[..])).unwrap();
        UdpPacket::new_unchecked(&mut b[..]).fill_checksum(s, d);
        let p = UdpPacket::new_checked(&b[..]).unwrap();
        prop_assert!(p.checksum() != 0 && p.verify_checksum(s, d));
        prop_assert_eq!(UdpRepr::parse(&p).unwrap(), r);
    }

    #[test]
    fn icmp_round_trip(t in any::<u8>(), c in any::<u8>(), rest in any::<u32>(), s in any::<[u8; 16]>(), d in any::<[u8; 16]>()) {
        let r4 = Icmpv4Repr { msg_type: t, msg_code: c, rest_of_header: rest };
        let mut b = [0u8; 12];
        r4.emit(&mut Icmpv4Packet::new_unchecked(&mut b[..])).unwrap();
        Icmpv4Packet::new_unchecked(&mut b[..]).fill_checksum();
        let p = Icmpv4Packet::new_checked(&b[..]).unwrap();
        prop_assert!(p.verify_checksum());
        prop_assert_eq!(Icmpv4Repr::parse(&p).unwrap(), r4);
        let r6 = Icmpv6Repr { msg_type: t, msg_code: c, rest_of_header: rest };
        r6.emit(&mut Icmpv6Packet::new_unchecked(&mut b[..])).unwrap();
        Icmpv6Packet::new_unchecked(&mut b[..]).fill_checksum(s, d);
        let p = Icmpv6Packet::new_checked(&b[..]).unwrap();
        prop_assert!(p.verify_checksum(s, d));
        prop_assert_eq!(Icmpv6Repr::parse(&p).unwrap(), r6);
    }

    #[test]
    fn gtpu_round_trip(r in gtpu_repr()) {
        let mut b = vec![0u8; r.buffer_len() + r.payload_len];
        r.emit(&mut GtpuPacket::new_unchecked(&mut b[..])).unwrap();
        let p = GtpuPacket::new_checked(&b[..]).unwrap();
        prop_assert_eq!(p.payload().len(), r.payload_len);
        prop_assert_eq!(p.qfi(), r.pdu_session.map(|s| s.qfi));
        prop_assert_eq!(GtpuRepr::parse(&p).unwrap(), r);
    }

    #[test]
    fn built_frames_parse_back(
        v6f in any::<bool>(), tcp in any::<bool>(), sp in any::<u16>(), dp in 0u16..2000,
        vlans in any::<[Option<u16>; 2]>(), payload in proptest::collection::vec(any::<u8>(), 0..100),
        s4 in v4(), d4 in v4(), s6 in v6(), d6 in v6(),
    ) {
        let vlans = vlans.map(|v| v.map(|x| x & 0x0fff));
        let b = match (v6f, tcp) {
            (false, false) => FrameBuilder::udp_v4(s4, d4, sp, dp),
            (false, true) => FrameBuilder::tcp_v4(s4, d4, sp, dp, TcpFlags::ACK),
            (true, false) => FrameBuilder::udp_v6(s6, d6, sp, dp),
            (true, true) => FrameBuilder::tcp_v6(s6, d6, sp, dp, TcpFlags::ACK),
        }.with_vlans(vlans);
        let mut buf = [0u8; 256];
        let n = b.emit(&mut buf, &payload).unwrap();
        let m = PktMeta::parse(&buf[..n]);
        let nv = vlans.iter().flatten().count();
        prop_assert!(m.valid);
        prop_assert_eq!(m.vlan, vlans.iter().flatten().next().copied().unwrap_or(0));
        prop_assert_eq!(m.l3 as usize, 14 + 4 * nv);
        prop_assert_eq!(m.v6, v6f);
        prop_assert_eq!((m.tuple.src_port(), m.tuple.dst_port()), (sp, dp));
        let seg = m.l4_bytes(&buf[..n]).unwrap();
        prop_assert_eq!(m.l4 as usize + seg.len(), n);
        let hl = if tcp { m.tcp(&buf[..n]).unwrap().header_len() } else { 8 };
        prop_assert_eq!(m.l4 as usize + hl, b.header_len());
        let ok = match (v6f, tcp) {
            (false, false) => UdpPacket::new_checked(seg).unwrap().verify_checksum(s4, d4),
            (false, true) => TcpPacket::new_checked(seg).unwrap().verify_checksum(s4, d4),
            (true, false) => UdpPacket::new_checked(seg).unwrap().verify_checksum(s6, d6),
            (true, true) => TcpPacket::new_checked(seg).unwrap().verify_checksum(s6, d6),
        };
        prop_assert!(ok);
    }

    #[test]
    fn gtpu_frames_parse_back(teid in any::<u32>(), psc in proptest::option::of(pdu_session()), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
        let outer = FrameBuilder::udp_v6("2001:db8::a".parse().unwrap(), "2001:db8::b".parse().unwrap(), 0, 0).with_gtpu(teid, psc);
        let inner = FrameBuilder::udp_v4(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), 1, 2).without_ethernet();
        let mut buf = [0u8; 300];
        let n = outer.emit_encapsulated(&mut buf, &inner, &payload).unwrap();
        let m = PktMeta::parse(&buf[..n]);
        prop_assert_eq!(m.teid(), Some(teid));
        let u = UdpPacket::new_checked(m.l4_bytes(&buf[..n]).unwrap()).unwrap();
        let g = GtpuPacket::new_checked(u.payload()).unwrap();
        let l = g.layout().unwrap();
        prop_assert_eq!((g.teid(), l.pdu_session.map(|p| p.qfi)), (teid, psc.map(|p| p.qfi)));
        prop_assert_eq!(l.end - l.header_len, 28 + payload.len());
        let ip = Ipv4Packet::new_checked(&u.payload()[l.header_len..l.end]).unwrap();
        prop_assert!(ip.verify_checksum());
    }

    #[test]
    fn nat_rewrites_keep_checksums(tcp in any::<bool>(), zero_udp in any::<bool>(), new_src in any::<[u8; 4]>(), new_dst in any::<[u8; 4]>(), np in any::<u16>(), payload in proptest::collection::vec(any::<u8>(), 0..50)) {
        let (s, d) = (Ipv4Addr::new(192, 168, 1, 2), Ipv4Addr::new(8, 8, 8, 8));
        let mut b = if tcp { FrameBuilder::tcp_v4(s, d, 1234, 80, TcpFlags::SYN) } else { FrameBuilder::udp_v4(s, d, 1234, 53) };
        if zero_udp && !tcp {
            b.l4 = L4Spec::Udp { src_port: 1234, dst_port: 53, checksum: false };
        }
        let mut buf = [0u8; 200];
        let n = b.emit(&mut buf, &payload).unwrap();
        let mut ip = Ipv4Packet::new_checked(&mut buf[14..n]).unwrap();
        ipv4::rewrite_addr(&mut ip, AddrField::Src, new_src).unwrap();
        ipv4::rewrite_addr(&mut ip, AddrField::Dst, new_dst).unwrap();
        if tcp {
            TcpPacket::new_unchecked(ip.payload_mut()).set_src_port_incremental(np);
        } else {
            UdpPacket::new_unchecked(ip.payload_mut()).set_dst_port_incremental(np);
        }
        let ip = Ipv4Packet::new_checked(&buf[14..n]).unwrap();
        prop_assert!(ip.verify_checksum());
        if tcp {
            prop_assert!(TcpPacket::new_checked(ip.payload()).unwrap().verify_checksum(new_src, new_dst));
        } else {
            let u = UdpPacket::new_checked(ip.payload()).unwrap();
            prop_assert_eq!(u.checksum() == 0, zero_udp);
            prop_assert!(u.verify_checksum(new_src, new_dst));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        poke_all(&data);
    }

    #[test]
    fn mutated_frames_never_panic(
        kind in 0u8..4, flips in proptest::collection::vec((any::<u8>(), any::<u8>()), 1..6), cut in any::<u8>(),
    ) {
        // Start from valid frames so mutations reach deep parser states.
        let s = Ipv4Addr::new(10, 0, 0, 1);
        let d = Ipv4Addr::new(10, 0, 0, 2);
        let psc = PduSessionInfo { pdu_type: PduType::Downlink, qfi: 1, ppp: true, rqi: false, ppi: Some(2) };
        let b = match kind {
            0 => FrameBuilder::udp_v4(s, d, 1, 2).with_gtpu(7, Some(psc)),
            1 => FrameBuilder::tcp_v6("::1".parse().unwrap(), "::2".parse().unwrap(), 1, 2, TcpFlags::SYN),
            2 => FrameBuilder::udp_v4(s, d, 1, 2).with_vlans([Some(1), Some(2)]),
            _ => FrameBuilder::udp_v6("::1".parse().unwrap(), "::2".parse().unwrap(), 1, 2).with_gtpu(9, None),
        };
        let mut buf = [0u8; 160];
        let n = b.emit(&mut buf, &[0x45; 40]).unwrap();
        let mut f = buf[..n].to_vec();
        for (pos, val) in flips {
            let i = pos as usize % f.len();
            f[i] = val;
        }
        let end = f.len() - (cut as usize % 8).min(f.len());
        let r = extract_five_tuple(&f[..end]);
        if let Err(e) = r {
            prop_assert!(!e.to_string().is_empty());
        }
        poke_all(&f[..end]);
        for off in [14usize, 18, 22, 34, 42, 54, 62] {
            if off <= end {
                poke_all(&f[off..end]);
            }
        }
    }
}

#[test]
fn error_is_copy_and_displayable() {
    let e = WireError::Truncated;
    let f = e;
    assert_eq!(e, f);
    assert!(format!("{e}").contains("truncated"));
}

/// Cost of the hot-path helpers, in nanoseconds per packet (wall clock). Ignored by default
/// (timing, not correctness); run with
/// `cargo test --release -p flowplane-wire --test headers_prop -- --ignored --nocapture`.
#[test]
#[ignore]
fn hot_path_cost() {
    const N: usize = 1024;
    const ROUNDS: usize = 2000;
    let psc = PduSessionInfo { pdu_type: PduType::Uplink, qfi: 9, ppp: false, rqi: false, ppi: None };
    let mut frames = vec![[0u8; 128]; N];
    let mut lens = vec![0usize; N];
    for (i, (f, l)) in frames.iter_mut().zip(lens.iter_mut()).enumerate() {
        let s = Ipv4Addr::from(0x0a00_0000 + i as u32);
        let d = Ipv4Addr::new(192, 168, 0, 1);
        let b = match i % 4 {
            0 => FrameBuilder::udp_v4(s, d, i as u16, 53),
            1 => FrameBuilder::tcp_v4(s, d, i as u16, 80, TcpFlags::ACK),
            2 => FrameBuilder::tcp_v6(
                "2001:db8::1".parse().unwrap(),
                "2001:db8::2".parse().unwrap(),
                1,
                2,
                TcpFlags::SYN,
            ),
            _ => FrameBuilder::udp_v4(s, d, 0, 0).with_gtpu(i as u32, Some(psc)),
        };
        *l = b.emit(&mut f[..], &[0u8; 18]).unwrap();
    }
    let mut acc = 0usize;
    let t0 = Instant::now();
    for _ in 0..ROUNDS {
        for (f, &l) in frames.iter().zip(&lens) {
            acc += PktMeta::parse(std::hint::black_box(&f[..l])).l4 as usize;
        }
    }
    let parse = t0.elapsed().as_nanos() as f64 / (N * ROUNDS) as f64;
    let t0 = Instant::now();
    for r in 0..ROUNDS {
        for (f, &l) in frames.iter_mut().zip(&lens).step_by(4) {
            let mut ip = Ipv4Packet::new_unchecked(&mut f[14..l]);
            ipv4::rewrite_addr(&mut ip, AddrField::Dst, [10, 0, (r >> 8) as u8, r as u8]).unwrap();
        }
    }
    let rewrite = t0.elapsed().as_nanos() as f64 / (N / 4 * ROUNDS) as f64;
    let b = FrameBuilder::udp_v4(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), 1, 2);
    let mut buf = [0u8; 64];
    let t0 = Instant::now();
    for i in 0..N * ROUNDS / 8 {
        buf[46] = i as u8;
        acc += b.emit_headers(std::hint::black_box(&mut buf[..]), 18).unwrap();
    }
    let build = t0.elapsed().as_nanos() as f64 / (N * ROUNDS / 8) as f64;
    println!("PktMeta::parse: {parse:.1} ns/frame (mix UDPv4/TCPv4/TCPv6/GTP-U, {} frames)", N * ROUNDS);
    println!("ipv4::rewrite_addr (IP + UDP checksums): {rewrite:.1} ns/packet");
    println!("FrameBuilder::emit_headers (64-B UDPv4 frame): {build:.1} ns/frame");
    assert!(acc > 0 && parse > 0.0);
}
