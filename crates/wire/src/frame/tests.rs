//! The one frame parser against the parsers it replaced ([`super::reference`]):
//! the same `PktMeta` for every frame and the same flow key or error, on
//! built, mutated and arbitrary frames; and the views it hands out.

use proptest::prelude::*;

use super::reference;
use super::*;
use crate::flow::extract_five_tuple;
use crate::icmp::icmpv4_type;
use crate::tcp::{TcpFlags, TcpOption};

/// Protocol numbers as the frame bytes hold them.
mod proto {
    use crate::ipv4::IpProtocol;
    pub const ICMP: u8 = IpProtocol::ICMP.0;
    pub const TCP: u8 = IpProtocol::TCP.0;
    pub const UDP: u8 = IpProtocol::UDP.0;
    pub const ICMPV6: u8 = IpProtocol::ICMPV6.0;
}

#[test]
fn meta_fits_one_cache_line() {
    assert!(std::mem::size_of::<PktMeta>() <= 64, "{}", std::mem::size_of::<PktMeta>());
}

#[test]
fn udp_port_2152_is_gtpu_only_when_it_looks_like_it() {
    let plain = v4_frame(proto::UDP, &udp(2152, 2152, &[0; 18]));
    let m = PktMeta::parse(&plain);
    assert!(m.valid, "junk on port 2152 stays plain UDP");
    assert_eq!(m.teid(), None);
    let mut g = plain.clone();
    g[42..50].copy_from_slice(&[0x30, 0xff, 0, 0, 0, 0, 0, 77]);
    let m = PktMeta::parse(&g);
    assert!(m.valid);
    assert_eq!(m.teid(), Some(77));
}

/// Parses through `parse_into` over a dirty `PktMeta` (as the executor
/// reuses slots) and checks it against the reference.
fn check(f: &[u8]) -> PktMeta {
    let mut m = PktMeta {
        valid: true,
        v6: true,
        proto: IpProtocol(99),
        l3: 7,
        l4: 9,
        vlan: 5,
        teid: 3,
        has_teid: true,
        ..PktMeta::default()
    };
    m.parse_into(f);
    assert_eq!(m, reference::meta(f), "frame {f:02x?}");
    assert_eq!(m, PktMeta::parse(f));
    assert_eq!(extract_five_tuple(f), reference::extract_five_tuple(f), "frame {f:02x?}");
    // Where both accept a frame they agree on its key (the IPv4 fast path accepts more).
    if let (true, Ok(t)) = (m.valid, extract_five_tuple(f)) {
        assert_eq!(t, m.tuple);
    }
    // The views handed out never read outside the frame and agree with the meta.
    if let Some(t) = m.tcp(f) {
        assert_eq!((t.src_port(), t.dst_port()), (m.tuple.src_port(), m.tuple.dst_port()));
        assert!(t.option_iter().count() <= 40);
    }
    if let Some(i) = m.icmp(f) {
        let _ = (i.is_error(), i.quoted_tuple(), i.echo_ident());
    }
    m
}

const SRC6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const DST6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

/// Ethernet (with `tags` 802.1Q tags) + IPv6 with `nh` and `payload`.
fn v6_frame(tags: usize, nh: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 12];
    for _ in 0..tags {
        f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
    }
    f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
    f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    f.extend_from_slice(&[nh, 64]);
    f.extend_from_slice(&SRC6);
    f.extend_from_slice(&DST6);
    f.extend_from_slice(payload);
    f
}

fn udp(sport: u16, dport: u16, body: &[u8]) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&(8 + body.len() as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(body);
    u
}

fn tcp(sport: u16, dport: u16) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[12] = 0x50;
    t[13] = TcpFlags::SYN.bits();
    t
}

#[test]
fn ipv6_udp_and_tcp_take_the_fast_path() {
    let f = v6_frame(0, proto::UDP, &udp(1000, 53, &[1, 2, 3, 4]));
    let mut m = PktMeta::default();
    assert!(parse_ipv6_fast(&f, &mut m));
    let want = FiveTupleV6::new(SRC6.into(), DST6.into(), 1000, 53, proto::UDP);
    assert_eq!((m.valid, m.v6, m.proto, m.l3, m.l4), (true, true, IpProtocol::UDP, 14, 54));
    assert_eq!(m.tuple, FiveTuple::V6(want));
    assert_eq!(check(&f), m);

    let mut f = v6_frame(0, proto::TCP, &tcp(443, 51000));
    f.extend_from_slice(&[0; 6]); // Ethernet padding after the datagram
    assert!(parse_ipv6_fast(&f, &mut m));
    assert_eq!(m.tuple, FiveTuple::V6(FiveTupleV6::new(SRC6.into(), DST6.into(), 443, 51000, proto::TCP)));
    assert_eq!(m.tcp(&f).map(|t| t.flags()), Some(TcpFlags::SYN));
    assert_eq!(check(&f), m);
}

#[test]
fn ipv6_fast_path_declines_what_needs_the_general_parser() {
    let mut m = PktMeta::default();
    let gtpu = v6_frame(0, proto::UDP, &udp(2152, 2152, &[0x30, 0xff, 0, 0, 0, 0, 0, 1]));
    let cases = [
        gtpu.clone(),
        gtpu[..gtpu.len() - 1].to_vec(),              // datagram cut short
        v6_frame(1, proto::UDP, &udp(1, 2, &[0; 8])), // VLAN tag
        v6_frame(0, 0, &[proto::UDP, 0, 1, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), // hop-by-hop
        v6_frame(0, proto::ICMPV6, &[128, 0, 0, 0, 0, 7, 0, 1]), // ICMPv6 echo
    ];
    for f in &cases {
        assert!(!parse_ipv6_fast(f, &mut m));
        check(f);
    }
    // Valid GTP-U goes through the general parser and keeps its UDP key.
    assert_eq!(check(&gtpu).tuple.dst_port(), 2152);
    // Echo identifier as both ports; ICMPv6 is valid but port-less otherwise.
    let m = check(&cases[4]);
    assert_eq!((m.valid, m.tuple.src_port(), m.tuple.dst_port(), m.l4), (true, 7, 7, 54));
    // Bad UDP length, TCP data offset below 5: invalid, as before.
    let mut bad = v6_frame(0, proto::UDP, &udp(1, 2, &[0; 4]));
    bad[58..60].copy_from_slice(&7u16.to_be_bytes());
    assert!(!check(&bad).valid);
    let mut bad = v6_frame(0, proto::TCP, &tcp(1, 2));
    bad[66] = 0x40;
    assert!(!check(&bad).valid);
}

#[test]
fn general_path_keeps_flow_key_conventions() {
    // Three VLAN tags: parse_frame accepts up to four, the flow key two.
    assert!(!check(&v6_frame(3, proto::UDP, &udp(1, 2, &[]))).valid);
    assert!(check(&v6_frame(2, proto::UDP, &udp(1, 2, &[]))).valid);
    // SCTP cut before its ports: no flow key.
    assert!(!check(&v6_frame(0, 132, &[0, 1])).valid);
    let m = check(&v6_frame(0, 132, &[0, 1, 0, 2]));
    assert_eq!((m.valid, m.tuple.src_port(), m.tuple.dst_port()), (true, 1, 2));
    // Jumbogram marker (payload length 0): the frame bounds the datagram.
    let mut j = v6_frame(0, 132, &[]);
    j.extend_from_slice(&[0, 9, 0, 10]);
    let m = check(&j);
    assert_eq!((m.valid, m.tuple.src_port()), (true, 9));
    // Non-first fragment: no ports, flagged, no L4 offset.
    let frag = [proto::UDP, 0, 0x00, 0x08, 0, 0, 0, 1, 0xaa, 0xbb, 0xcc, 0xdd];
    let m = check(&v6_frame(0, 44, &frag));
    assert_eq!((m.valid, m.l4, m.tuple.is_non_first_fragment(), m.tuple.src_port()), (true, 0, true, 0));
    // First fragment (offset 0, M set): ports after the fragment header.
    let mut first = vec![proto::UDP, 0, 0x00, 0x01, 0, 0, 0, 1];
    first.extend_from_slice(&udp(5, 6, &[])[..]);
    let m = check(&v6_frame(0, 44, &first));
    assert_eq!((m.valid, m.l4, m.tuple.src_port(), m.tuple.dst_port()), (true, 62, 5, 6));
    // Non-IP.
    let mut arp = vec![0u8; 12];
    arp.extend_from_slice(&[0x08, 0x06, 0, 1]);
    assert!(!check(&arp).valid);
    assert!(!check(&[]).valid);
}

/// Ethernet + IPv4 (no options, total length from `l4`) around `l4`.
fn v4_frame(nh: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 12];
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
    f.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 1, 0, 0, 64, nh, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend_from_slice(l4);
    f
}

#[test]
fn tcp_view_bounds_and_options() {
    // SYN with MSS, NOP, window scale 7, SACK permitted, 4 payload bytes.
    let mut t = tcp(40000, 443);
    t[12] = 8 << 4;
    t.extend_from_slice(&[2, 4, 0x05, 0xb4, 1, 3, 3, 7, 4, 2, 0, 0]);
    t.extend_from_slice(b"data");
    let mut f = v4_frame(proto::TCP, &t);
    f.extend_from_slice(&[0; 6]); // padding: not part of the segment
    let m = PktMeta::parse(&f);
    let v = m.tcp(&f).unwrap();
    assert_eq!((v.header_len(), v.payload(), v.flags()), (32, &b"data"[..], TcpFlags::SYN));
    let ws = v.option_iter().find_map(|o| match o {
        Ok(TcpOption::WindowScale(s)) => Some(s),
        _ => None,
    });
    assert_eq!(ws, Some(7));
    assert!(m.icmp(&f).is_none());
    // IP length shorter than the data offset, or the datagram cut by the capture: no view.
    let mut short = f.clone();
    short[16..18].copy_from_slice(&(20u16 + 24).to_be_bytes());
    assert!(PktMeta::parse(&short).tcp(&short).is_none());
    let cut = &f[..f.len() - 10];
    assert!(PktMeta::parse(cut).valid && PktMeta::parse(cut).tcp(cut).is_none());
    let mut bad = f.clone();
    bad[14 + 20 + 12] = 4 << 4;
    assert!(PktMeta::parse(&bad).tcp(&bad).is_none());
}

#[test]
fn icmp_view_quotes_the_flow() {
    let quoted = v4_frame(proto::UDP, &udp(5353, 53, &[]));
    let mut err = vec![icmpv4_type::DEST_UNREACHABLE, 3, 0, 0, 0, 0, 0, 0];
    err.extend_from_slice(&quoted[14..]);
    let f = v4_frame(proto::ICMP, &err);
    let m = PktMeta::parse(&f);
    let v = m.icmp(&f).unwrap();
    assert!(v.is_error() && !v.is_v6());
    assert_eq!(v.quoted_tuple(), extract_five_tuple(&quoted).ok());
    assert!(m.tcp(&f).is_none());
    // ICMPv6 carried over IPv4 is no ICMP message of the packet's family.
    let f6 = v4_frame(proto::ICMPV6, &[128, 0, 0, 0, 0, 1, 0, 1]);
    let m6 = PktMeta::parse(&f6);
    assert!(m6.valid && m6.icmp(&f6).is_none());
}

#[test]
fn forged_metas_never_panic() {
    let f = v4_frame(proto::TCP, &tcp(1, 2));
    for l3 in [0u16, 14, 60, 200, u16::MAX] {
        for l4 in [0u16, 1, 34, 53, 60, u16::MAX] {
            for v6 in [false, true] {
                for p in [IpProtocol::TCP, IpProtocol::ICMP, IpProtocol::ICMPV6] {
                    let m = PktMeta { valid: true, v6, proto: p, l3, l4, ..PktMeta::default() };
                    let _ = (m.l4_bytes(&f), m.tcp(&f).map(|t| t.option_iter().count()));
                    let _ = m.icmp(&f).map(|i| i.quoted_tuple());
                }
            }
        }
    }
}

/// A frame from structural choices: VLAN tags, an IPv4 or IPv6 header
/// (options, fragments, extension headers), a transport header, with
/// lengths consistent or not, then truncation/padding and one byte flip.
#[allow(clippy::too_many_arguments)]
fn build(
    tags: &[u16],
    family: u8,
    ext: &[(u8, u8, u16)],
    nh: u8,
    frag: u16,
    ihl: u8,
    l4: &[u8],
    lens: (bool, u16, bool),
    dport: u16,
    cut: Option<usize>,
    flip: Option<(usize, u8)>,
) -> Vec<u8> {
    let mut f = vec![0u8; 12];
    for &t in tags {
        f.extend_from_slice(&t.to_be_bytes());
        f.extend_from_slice(&[0x20, 0x07]);
    }
    // Transport: ports first, then the rest of the random header bytes.
    let mut t = l4.to_vec();
    if t.len() >= 4 {
        t[2..4].copy_from_slice(&dport.to_be_bytes());
    }
    if matches!(nh, proto::ICMP | proto::ICMPV6) && !t.is_empty() {
        // Echo request/reply of both families, and a non-echo type.
        t[0] = [0, 8, 128, 129, 3][dport as usize % 5];
    }
    if nh == proto::UDP && t.len() >= 8 && lens.2 {
        let n = t.len() as u16;
        t[4..6].copy_from_slice(&n.to_be_bytes());
        if dport == 2152 && t.len() >= 16 {
            t[8] = 0x30;
            t[10..12].copy_from_slice(&(n - 16).to_be_bytes());
        }
    }
    if nh == proto::TCP && t.len() >= 20 && lens.2 {
        t[12] = ((t.len().min(60) / 4) as u8) << 4;
    }
    match family {
        0 => {
            f.extend_from_slice(&[0x08, 0x00]);
            let hl = ihl as usize * 4;
            let total = if lens.0 { (hl.max(20) + t.len()) as u16 } else { lens.1 };
            f.extend_from_slice(&[0x40 | ihl, 0]);
            f.extend_from_slice(&total.to_be_bytes());
            f.extend_from_slice(&[0, 1]);
            f.extend_from_slice(&frag.to_be_bytes());
            f.extend_from_slice(&[64, nh, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
            f.extend(std::iter::repeat_n(1u8, hl.saturating_sub(20)));
        }
        1 => {
            let mut chain = Vec::new();
            let mut next = nh;
            for &(kind, len, fw) in ext.iter().rev() {
                let mut h = match kind {
                    44 => {
                        let mut h = vec![next, 0];
                        h.extend_from_slice(&fw.to_be_bytes());
                        h.extend_from_slice(&[0, 0, 0, 9]);
                        h
                    }
                    51 => {
                        let mut h = vec![next, len];
                        h.resize((len as usize + 2) * 4, 0);
                        h
                    }
                    _ => {
                        let mut h = vec![next, len];
                        h.resize((len as usize + 1) * 8, 0);
                        h
                    }
                };
                h.extend_from_slice(&chain);
                chain = h;
                next = kind;
            }
            chain.extend_from_slice(&t);
            t = chain;
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
            let plen = if lens.0 { t.len() as u16 } else { lens.1 };
            f.extend_from_slice(&plen.to_be_bytes());
            f.extend_from_slice(&[next, 64]);
            f.extend_from_slice(&SRC6);
            f.extend_from_slice(&DST6);
        }
        _ => f.extend_from_slice(&[0x08, 0x06]),
    }
    f.extend_from_slice(&t);
    if let Some(c) = cut {
        f.truncate(c % (f.len() + 8)); // sometimes beyond the end: no cut
    }
    if let Some((at, b)) = flip {
        if !f.is_empty() {
            let i = at % f.len();
            f[i] ^= b;
        }
    }
    f
}

fn nh_strategy() -> impl Strategy<Value = u8> {
    prop_oneof![
        4 => Just(proto::UDP),
        4 => Just(proto::TCP),
        1 => Just(proto::ICMP),
        1 => Just(proto::ICMPV6),
        1 => prop::sample::select(vec![33u8, 132, 136, 47, 50, 59, 0, 44]),
        1 => any::<u8>(),
    ]
}

fn ext_strategy() -> impl Strategy<Value = Vec<(u8, u8, u16)>> {
    let one = (
        prop::sample::select(vec![0u8, 43, 44, 51, 60]),
        0u8..3,
        prop_oneof![Just(0u16), Just(1), Just(8), Just(9), any::<u16>()],
    );
    prop_oneof![2 => Just(vec![]), 2 => prop::collection::vec(one, 0..10)]
}

fn frame_strategy() -> impl Strategy<Value = Vec<u8>> {
    let tags = prop_oneof![
        4 => Just(vec![]),
        1 => prop::collection::vec(prop::sample::select(vec![0x8100u16, 0x88a8, 0x9100]), 0..5),
    ];
    let head = (tags, prop_oneof![4 => Just(1u8), 3 => Just(0u8), 1 => Just(2u8)], ext_strategy(), nh_strategy());
    let ip = (
        prop_oneof![3 => Just(0u16), 1 => Just(0x2000), 1 => Just(0x4000), 1 => any::<u16>()],
        prop_oneof![4 => Just(5u8), 1 => 0u8..16],
        prop::collection::vec(any::<u8>(), 0..48),
        (prop::bool::weighted(0.8), prop_oneof![Just(0u16), any::<u16>(), 0u16..100], prop::bool::weighted(0.8)),
        prop_oneof![3 => any::<u16>(), 1 => Just(2152u16)],
    );
    let damage = (prop::option::weighted(0.2, any::<usize>()), prop::option::weighted(0.2, (any::<usize>(), 1u8..)));
    (head, ip, damage).prop_map(|((tags, family, ext, nh), (frag, ihl, l4, lens, dport), (cut, flip))| {
        build(&tags, family, &ext, nh, frag, ihl, &l4, lens, dport, cut, flip)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16384))]

    #[test]
    fn same_as_reference_on_built_frames(f in frame_strategy()) {
        check(&f);
    }

    #[test]
    fn same_as_reference_on_arbitrary_bytes(f in prop::collection::vec(any::<u8>(), 0..128)) {
        check(&f);
    }

    #[test]
    fn same_as_reference_on_ipv4_prefix_and_noise(
        ihl_words in 0u8..16,
        total in 0u16..120,
        frag in prop::sample::select(vec![0u16, 0x2000, 0x4000, 0x0001, 0x1fff, 0x2001]),
        proto in prop::sample::select(vec![6u8, 17, 1, 132, 47]),
        rest in prop::collection::vec(any::<u8>(), 0..100),
    ) {
        // A valid Ethernet + IPv4 prefix whose header length, total length and
        // fragment fields vary around the fast paths' limits.
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00, 0x40 | ihl_words, 0]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&frag.to_be_bytes());
        f.extend_from_slice(&[64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend_from_slice(&rest);
        check(&f);
    }

    #[test]
    fn same_as_reference_on_ipv6_prefix_and_noise(nh in nh_strategy(), plen in 0u16..80, rest in prop::collection::vec(any::<u8>(), 0..80)) {
        // A valid Ethernet + IPv6 prefix so the random tail reaches the L4/ext parsing.
        let mut f = v6_frame(0, nh, &rest);
        f[18..20].copy_from_slice(&plen.to_be_bytes());
        check(&f);
    }
}
