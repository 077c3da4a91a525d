//! Whole-frame parser: never panics, and every reported offset lies inside the frame.
#![no_main]

use flowplane_wire::packet_repr::parse_frame;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(info) = parse_frame(data) {
        assert!(info.l3_offset <= data.len());
        assert!(info.payload_offset <= info.end && info.end <= data.len());
        if let Some(l4) = info.l4_offset {
            assert!(info.l3_offset <= l4 && l4 <= info.payload_offset);
        }
        if let Some(g) = info.gtpu {
            assert!(g.inner_offset + g.inner_len <= info.end);
        }
    }
});
