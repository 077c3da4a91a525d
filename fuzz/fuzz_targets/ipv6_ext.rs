//! IPv6 fixed header and extension-header walker: no panic, bounded, offsets in range.
#![no_main]

use flowplane_wire::ipv6::{walk_extension_headers, IpProtocol, Ipv6Packet, Ipv6Repr, MAX_EXT_HEADERS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&first, rest)) = data.split_first() {
        if let Ok(info) = walk_extension_headers(IpProtocol(first), rest) {
            assert!(info.offset <= rest.len());
            assert!(info.header_count as usize <= MAX_EXT_HEADERS);
        }
    }
    if let Ok(p) = Ipv6Packet::new_checked(data) {
        let _ = Ipv6Repr::parse(&p);
        if let Ok(info) = p.upper_layer() {
            assert!(info.offset <= p.payload().len());
        }
    }
});
