//! Property tests of flow-key extraction and hashing.

use std::net::{Ipv4Addr, Ipv6Addr};

use flowplane_wire::flow::{extract_five_tuple, FiveTuple, FiveTupleV4, FiveTupleV6, FlowError};
use flowplane_wire::frame::PktMeta;
use flowplane_wire::hash::{crc32c_bytes, crc32c_bytes_soft, crc32c_u64, crc32c_u64_soft, hash_key, hash_symmetric};
use flowplane_wire::hash::{hash_key64, hash_symmetric64};
use flowplane_wire::rss::{Toeplitz, SYMMETRIC_KEY};
use proptest::prelude::*;

/// Transport protocols whose ports the extractor reads.
const PORTED: [u8; 3] = [6, 17, 132];

/// Minimal frame builder: Ethernet, optional VLAN tags, IPv4/IPv6 (+ options or
/// extension headers), an 8-byte transport header with the ports, padding to 64 B.
fn build_frame(t: &FiveTuple, vlans: &[u16], ipv4_opt_words: u8, v6_ext: &[u8], pad_to: usize) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
    for v in vlans {
        f.extend_from_slice(&0x8100u16.to_be_bytes());
        f.extend_from_slice(&v.to_be_bytes());
    }
    let l4 = {
        let mut h = Vec::new();
        h.extend_from_slice(&t.src_port().to_be_bytes());
        h.extend_from_slice(&t.dst_port().to_be_bytes());
        h.extend_from_slice(&[0, 8, 0, 0]);
        h
    };
    match t {
        FiveTuple::V4(v4) => {
            f.extend_from_slice(&0x0800u16.to_be_bytes());
            let ihl = 5 + ipv4_opt_words;
            let total = (ihl as usize * 4 + l4.len()) as u16;
            f.extend_from_slice(&[0x40 | ihl, 0]);
            f.extend_from_slice(&total.to_be_bytes());
            f.extend_from_slice(&[0, 0, 0x40, 0, 64, v4.proto(), 0, 0]);
            f.extend_from_slice(&v4.src().octets());
            f.extend_from_slice(&v4.dst().octets());
            f.extend(std::iter::repeat_n(1u8, ipv4_opt_words as usize * 4));
        }
        FiveTuple::V6(v6) => {
            f.extend_from_slice(&0x86DDu16.to_be_bytes());
            // Each extension header here is 8 bytes (hdr ext len 0).
            let plen = (v6_ext.len() * 8 + l4.len()) as u16;
            f.extend_from_slice(&[0x60, 0, 0, 0]);
            f.extend_from_slice(&plen.to_be_bytes());
            f.push(*v6_ext.first().unwrap_or(&v6.proto()));
            f.push(64);
            f.extend_from_slice(&v6.src().octets());
            f.extend_from_slice(&v6.dst().octets());
            for (i, &kind) in v6_ext.iter().enumerate() {
                let next = *v6_ext.get(i + 1).unwrap_or(&v6.proto());
                if kind == 44 {
                    // Fragment header, offset 0, M=1: a first fragment.
                    f.extend_from_slice(&[next, 0, 0, 1, 0, 0, 0, 7]);
                } else {
                    f.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]);
                }
            }
        }
    }
    f.extend_from_slice(&l4);
    if f.len() < pad_to {
        f.resize(pad_to, 0);
    }
    f
}

fn arb_tuple() -> impl Strategy<Value = FiveTuple> {
    let v4 = (any::<u32>(), any::<u32>(), any::<u16>(), any::<u16>(), prop::sample::select(&PORTED[..])).prop_map(
        |(s, d, sp, dp, p)| FiveTuple::from(FiveTupleV4::new(Ipv4Addr::from(s), Ipv4Addr::from(d), sp, dp, p)),
    );
    let v6 = (any::<u128>(), any::<u128>(), any::<u16>(), any::<u16>(), prop::sample::select(&PORTED[..])).prop_map(
        |(s, d, sp, dp, p)| FiveTuple::from(FiveTupleV6::new(Ipv6Addr::from(s), Ipv6Addr::from(d), sp, dp, p)),
    );
    prop_oneof![v4, v6]
}

fn arb_ext() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(&[0u8, 43, 44, 60][..]), 0..4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let r = extract_five_tuple(&bytes);
        // Either a key or one of the typed errors; rendering it must work too.
        if let Err(e) = r {
            prop_assert!(!e.to_string().is_empty());
        }
        let _ = PktMeta::parse(&bytes);
    }

    #[test]
    fn never_panics_on_mutated_valid_frames(
        t in arb_tuple(),
        ext in arb_ext(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        // Random bytes rarely get past the EtherType; corrupting valid frames
        // exercises the IP and extension-header paths.
        let mut f = build_frame(&t, &[7], 1, &ext, 0);
        for (i, v) in flips {
            let at = i.index(f.len());
            f[at] = v;
        }
        let len = cut.index(f.len() + 1);
        let _ = extract_five_tuple(&f[..len]);
        let _ = PktMeta::parse(&f[..len]);
    }

    #[test]
    fn extracts_built_tuples(
        t in arb_tuple(),
        vlans in prop::collection::vec(0u16..4096, 0..3),
        opt in 0u8..=10,
        ext in arb_ext(),
        pad in prop::sample::select(&[0usize, 64, 128][..]),
    ) {
        let f = build_frame(&t, &vlans, opt, &ext, pad);
        prop_assert_eq!(extract_five_tuple(&f), Ok(t));
        prop_assert_eq!(extract_five_tuple(&f[..10]), Err(FlowError::Truncated));
        // The executor's parser agrees where it accepts the frame: always, except for
        // the 8-byte "TCP" header built here and a hop-by-hop header that is not first.
        let m = PktMeta::parse(&f);
        if t.proto() != 6 && !ext.iter().skip(1).any(|&k| k == 0) && ext.iter().filter(|&&k| k == 44).count() < 2 {
            prop_assert!(m.valid);
        }
        if m.valid {
            prop_assert_eq!(m.tuple, t);
            prop_assert_eq!(m.vlan, vlans.first().copied().unwrap_or(0));
        }
        // Cutting into the ports (last 8 bytes are the transport header when
        // unpadded) is reported, not misparsed.
        if pad == 0 {
            prop_assert_eq!(extract_five_tuple(&f[..f.len() - 5]), Err(FlowError::Truncated));
        }
    }

    #[test]
    fn reversed_is_an_involution(t in arb_tuple()) {
        prop_assert_eq!(t.reversed().reversed(), t);
        prop_assert_eq!(t.reversed().src_ip(), t.dst_ip());
        prop_assert_eq!(t.reversed().src_port(), t.dst_port());
    }

    #[test]
    fn canonical_is_symmetric(t in arb_tuple()) {
        prop_assert_eq!(t.canonical(), t.reversed().canonical());
        prop_assert!(t.canonical() == t || t.canonical() == t.reversed());
        prop_assert_eq!(t.canonical().canonical(), t.canonical());
    }

    #[test]
    fn symmetric_hashes_agree_both_ways(t in arb_tuple(), seed in any::<u32>()) {
        prop_assert_eq!(hash_symmetric(&t, seed), hash_symmetric(&t.reversed(), seed));
        prop_assert_eq!(hash_symmetric64(&t, seed), hash_symmetric64(&t.reversed(), seed));
        prop_assert_eq!(hash_key64(&t, seed) as u32, hash_key(&t, seed));
        let rss = Toeplitz::new(&SYMMETRIC_KEY);
        prop_assert_eq!(rss.hash_five_tuple(&t), rss.hash_five_tuple(&t.reversed()));
    }

    #[test]
    fn software_crc_equals_hardware_crc(
        words in prop::collection::vec(any::<u64>(), 1..8),
        bytes in prop::collection::vec(any::<u8>(), 0..64),
        seed in any::<u32>(),
    ) {
        // On this target crc32c_* use SSE4.2; the *_soft forms are the fallback.
        for &w in &words {
            prop_assert_eq!(crc32c_u64(seed, w), crc32c_u64_soft(seed, w));
        }
        prop_assert_eq!(crc32c_bytes(seed, &bytes), crc32c_bytes_soft(seed, &bytes));
    }
}

#[test]
fn hardware_crc_is_in_use_on_this_target() {
    // The equality property above is only meaningful if the hardware path is built.
    assert_eq!(flowplane_wire::hash::HW_CRC32C, cfg!(all(target_arch = "x86_64", target_feature = "sse4.2")));
}

#[test]
fn icmp_echo_reply_is_reversed_request() {
    let a = Ipv4Addr::new(10, 0, 0, 1);
    let b = Ipv4Addr::new(10, 0, 0, 2);
    let echo = |src: Ipv4Addr, dst: Ipv4Addr, ty: u8| {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 28, 0, 0, 0, 0, 64, 1, 0, 0]);
        f.extend_from_slice(&src.octets());
        f.extend_from_slice(&dst.octets());
        f.extend_from_slice(&[ty, 0, 0, 0, 0xab, 0xcd, 0, 1]);
        f
    };
    let req = extract_five_tuple(&echo(a, b, 8)).unwrap();
    let rep = extract_five_tuple(&echo(b, a, 0)).unwrap();
    assert_eq!((req.src_port(), req.dst_port()), (0xabcd, 0xabcd));
    assert_eq!(req.reversed(), rep);
    let unreachable = extract_five_tuple(&echo(a, b, 3)).unwrap();
    assert_eq!((unreachable.src_port(), unreachable.dst_port()), (0, 0));
}

#[test]
fn ipv6_non_first_fragment_has_no_ports() {
    let t: FiveTuple = FiveTupleV6::new(Ipv6Addr::LOCALHOST, Ipv6Addr::UNSPECIFIED, 1, 2, 17).into();
    let mut f = build_frame(&t, &[], 0, &[44], 0);
    // Fragment offset 1 (in 8-byte units) in the fragment header after the fixed header.
    let frag = 14 + 40;
    f[frag + 2..frag + 4].copy_from_slice(&(1u16 << 3).to_be_bytes());
    let got = extract_five_tuple(&f).unwrap();
    assert!(got.is_non_first_fragment());
    assert_eq!((got.src_port(), got.dst_port(), got.proto()), (0, 0, 17));
}

#[test]
fn ipv6_extension_chain_is_bounded() {
    let t: FiveTuple = FiveTupleV6::new(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST, 1, 2, 6).into();
    let f = build_frame(&t, &[], 0, &[60; 12], 0);
    assert_eq!(extract_five_tuple(&f), Err(FlowError::TooManyHeaders));
    let f = build_frame(&t, &[], 0, &[60; 8], 0);
    assert_eq!(extract_five_tuple(&f), Ok(t));
}
