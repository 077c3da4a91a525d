//! Microsoft "Verifying the RSS hash calculation" vectors (also in the Intel
//! 82599 datasheet, section 7.1.2.8.3), the symmetric key, and the agreement of
//! the table-driven hash with the bit-by-bit reference.

use std::net::{Ipv4Addr, Ipv6Addr};

use flowplane_wire::flow::{FiveTuple, FiveTupleV4, FiveTupleV6, FLAG_NON_FIRST_FRAGMENT};
use flowplane_wire::rss::{reference_hash, Reta, Toeplitz, MAX_INPUT_LEN, MICROSOFT_KEY, SYMMETRIC_KEY};

/// (source, source port, destination, destination port, addresses-only hash, with-ports hash)
const V4: [(&str, u16, &str, u16, u32, u32); 5] = [
    ("66.9.149.187", 2794, "161.142.100.80", 1766, 0x323e_8fc2, 0x51cc_c178),
    ("199.92.111.2", 14230, "65.69.140.83", 4739, 0xd718_262a, 0xc626_b0ea),
    ("24.19.198.95", 12898, "12.22.207.184", 38024, 0xd2d0_a5de, 0x5c2b_394a),
    ("38.27.205.30", 48228, "209.142.163.6", 2217, 0x8298_9176, 0xafc7_327f),
    ("153.39.163.191", 44251, "202.188.127.2", 1303, 0x5d18_09c5, 0x10e8_28a2),
];

const V6: [(&str, u16, &str, u16, u32, u32); 3] = [
    ("3ffe:2501:200:1fff::7", 2794, "3ffe:2501:200:3::1", 1766, 0x2cc1_8cd5, 0x4020_7d3d),
    ("3ffe:501:8::260:97ff:fe40:efab", 14230, "ff02::1", 4739, 0x0f0c_461c, 0xdde5_1bbf),
    ("3ffe:1900:4545:3:200:f8ff:fe21:67cf", 44251, "fe80::200:f8ff:fe21:67cf", 38024, 0x4b61_e985, 0x02d1_feef),
];

#[test]
fn microsoft_ipv4_vectors() {
    let t = Toeplitz::new(&MICROSOFT_KEY);
    for (src, sport, dst, dport, addrs, ports) in V4 {
        let (s, d): (Ipv4Addr, Ipv4Addr) = (src.parse().unwrap(), dst.parse().unwrap());
        assert_eq!(t.hash_v4_addrs(s, d), addrs, "{src} -> {dst} addresses");
        assert_eq!(t.hash_v4(s, d, sport, dport), ports, "{src}:{sport} -> {dst}:{dport}");
        // Through the 5-tuple: TCP/UDP use ports, ICMP and non-first fragments do not.
        let tcp: FiveTuple = FiveTupleV4::new(s, d, sport, dport, 6).into();
        let udp: FiveTuple = FiveTupleV4::new(s, d, sport, dport, 17).into();
        let icmp: FiveTuple = FiveTupleV4::new(s, d, 0, 0, 1).into();
        let frag: FiveTuple = FiveTupleV4::new(s, d, 0, 0, 17).with_flags(FLAG_NON_FIRST_FRAGMENT).into();
        assert_eq!(t.hash_five_tuple(&tcp), ports);
        assert_eq!(t.hash_five_tuple(&udp), ports);
        assert_eq!(t.hash_five_tuple(&icmp), addrs);
        assert_eq!(t.hash_five_tuple(&frag), addrs);
        // The generic byte interface and the bit-by-bit reference agree.
        let mut input = [0u8; 12];
        input[..4].copy_from_slice(&s.octets());
        input[4..8].copy_from_slice(&d.octets());
        input[8..10].copy_from_slice(&sport.to_be_bytes());
        input[10..].copy_from_slice(&dport.to_be_bytes());
        assert_eq!(t.hash(&input), ports);
        assert_eq!(reference_hash(&MICROSOFT_KEY, &input), ports);
        assert_eq!(reference_hash(&MICROSOFT_KEY, &input[..8]), addrs);
    }
}

#[test]
fn microsoft_ipv6_vectors() {
    let t = Toeplitz::new(&MICROSOFT_KEY);
    for (src, sport, dst, dport, addrs, ports) in V6 {
        let (s, d): (Ipv6Addr, Ipv6Addr) = (src.parse().unwrap(), dst.parse().unwrap());
        assert_eq!(t.hash_v6_addrs(s, d), addrs, "{src} -> {dst} addresses");
        assert_eq!(t.hash_v6(s, d, sport, dport), ports, "[{src}]:{sport} -> [{dst}]:{dport}");
        let tcp: FiveTuple = FiveTupleV6::new(s, d, sport, dport, 6).into();
        let gre: FiveTuple = FiveTupleV6::new(s, d, 0, 0, 47).into();
        assert_eq!(t.hash_five_tuple(&tcp), ports);
        assert_eq!(t.hash_five_tuple(&gre), addrs);
        let mut input = [0u8; 36];
        input[..16].copy_from_slice(&s.octets());
        input[16..32].copy_from_slice(&d.octets());
        input[32..34].copy_from_slice(&sport.to_be_bytes());
        input[34..].copy_from_slice(&dport.to_be_bytes());
        assert_eq!(reference_hash(&MICROSOFT_KEY, &input), ports);
        assert_eq!(reference_hash(&MICROSOFT_KEY, &input[..32]), addrs);
    }
}

#[test]
fn symmetric_key_is_direction_independent() {
    let t = Toeplitz::new(&SYMMETRIC_KEY);
    let ms = Toeplitz::new(&MICROSOFT_KEY);
    let mut asymmetric_seen = false;
    for (src, sport, dst, dport, _, _) in V4 {
        let (s, d): (Ipv4Addr, Ipv4Addr) = (src.parse().unwrap(), dst.parse().unwrap());
        assert_eq!(t.hash_v4(s, d, sport, dport), t.hash_v4(d, s, dport, sport));
        assert_eq!(t.hash_v4_addrs(s, d), t.hash_v4_addrs(d, s));
        let fwd: FiveTuple = FiveTupleV4::new(s, d, sport, dport, 6).into();
        assert_eq!(t.hash_five_tuple(&fwd), t.hash_five_tuple(&fwd.reversed()));
        asymmetric_seen |= ms.hash_v4(s, d, sport, dport) != ms.hash_v4(d, s, dport, sport);
    }
    for (src, sport, dst, dport, _, _) in V6 {
        let (s, d): (Ipv6Addr, Ipv6Addr) = (src.parse().unwrap(), dst.parse().unwrap());
        assert_eq!(t.hash_v6(s, d, sport, dport), t.hash_v6(d, s, dport, sport));
        assert_eq!(t.hash_v6_addrs(s, d), t.hash_v6_addrs(d, s));
    }
    // The property is the key's doing: the Microsoft key is not symmetric.
    assert!(asymmetric_seen);
}

#[test]
fn table_hash_matches_reference_on_pseudo_random_inputs() {
    let keys = [MICROSOFT_KEY, SYMMETRIC_KEY, core::array::from_fn(|i| (i as u8).wrapping_mul(151) ^ 0x3c)];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for key in &keys {
        let t = Toeplitz::new(key);
        assert_eq!(t.key(), key);
        for _ in 0..2000 {
            let mut input = [0u8; MAX_INPUT_LEN];
            for b in input.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let len = (x >> 40) as usize % (MAX_INPUT_LEN + 1);
            assert_eq!(t.hash(&input[..len]), reference_hash(key, &input[..len]));
        }
    }
}

#[test]
fn reta_spreads_microsoft_vectors_by_low_bits() {
    let t = Toeplitz::new(&MICROSOFT_KEY);
    let reta = Reta::round_robin(128, 16).unwrap();
    for (src, sport, dst, dport, _, ports) in V4 {
        let h = t.hash_v4(src.parse().unwrap(), dst.parse().unwrap(), sport, dport);
        assert_eq!(reta.queue(h), ((ports & 127) % 16) as u16);
    }
}
