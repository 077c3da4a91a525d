//! TCP view and option iterator: no panic, the iterator terminates within the area's length.
#![no_main]

use flowplane_wire::tcp::{TcpOptions, TcpPacket, TcpRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    assert!(TcpOptions::new(data).count() <= data.len());
    if let Ok(p) = TcpPacket::new_checked(data) {
        let _ = (p.payload(), p.verify_checksum([1u8; 4], [2u8; 4]));
        if let Ok(r) = TcpRepr::parse(&p) {
            let mut out = [0u8; 60];
            r.emit(&mut TcpPacket::new_unchecked(&mut out[..])).expect("header fits in 60 bytes");
            let again = TcpRepr::parse(&TcpPacket::new_checked(&out[..]).expect("emitted header is valid"));
            assert_eq!(again, Ok(r));
        }
    }
});
