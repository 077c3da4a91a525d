//! IPv4 view, Repr and incremental rewrites: no panic; a rewrite never breaks a valid checksum.
#![no_main]

use flowplane_wire::ipv4::{rewrite_addr, AddrField, Ipv4Packet, Ipv4Repr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(p) = Ipv4Packet::new_checked(data) else { return };
    let _ = (p.options(), p.payload(), p.is_fragment(), p.is_first_fragment());
    let valid = p.verify_checksum();
    if let Ok(r) = Ipv4Repr::parse(&p) {
        assert_eq!(r.payload_len, p.payload().len());
    }
    let mut copy = data.to_vec();
    let mut q = Ipv4Packet::new_unchecked(&mut copy[..]);
    if rewrite_addr(&mut q, AddrField::Dst, [10, 9, 8, 7]).is_ok() {
        assert_eq!(q.dst_addr(), [10, 9, 8, 7]);
        if valid {
            assert!(q.verify_checksum());
        }
    }
});
