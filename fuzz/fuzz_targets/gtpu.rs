//! GTP-U view, extension chain and Repr: no panic; a parsed header re-emits to an equal Repr.
#![no_main]

use flowplane_wire::gtpu::{GtpuPacket, GtpuRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let g = GtpuPacket::new_unchecked(data);
    let _ = (g.header_len(), g.payload(), g.qfi(), g.extensions().count());
    let Ok(p) = GtpuPacket::new_checked(data) else { return };
    let r = GtpuRepr::parse(&p).expect("checked packet parses");
    let mut out = vec![0u8; r.buffer_len() + r.payload_len];
    r.emit(&mut GtpuPacket::new_unchecked(&mut out[..])).expect("buffer sized by buffer_len");
    let again = GtpuRepr::parse(&GtpuPacket::new_checked(&out[..]).expect("emitted header is valid"));
    assert_eq!(again, Ok(r));
});
