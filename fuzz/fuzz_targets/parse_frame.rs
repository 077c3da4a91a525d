//! The frame parser: never panics; every offset and view it reports lies
//! inside the frame and agrees with the flow key; a valid meta's datagram
//! views stay within it.
#![no_main]

use flowplane_wire::flow::extract_five_tuple;
use flowplane_wire::frame::PktMeta;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = extract_five_tuple(data);
    let m = PktMeta::parse(data);
    let mut dirty = PktMeta { valid: true, l3: 9, l4: 9, has_teid: true, ..PktMeta::default() };
    dirty.parse_into(data);
    assert_eq!(dirty, m, "parse_into must not depend on the previous contents");
    if !m.valid {
        return;
    }
    assert!(usize::from(m.l3) < data.len());
    assert!(usize::from(m.l4) <= data.len());
    assert!(m.l4 == 0 || m.l4 > m.l3);
    // Outside the IPv4 fast path (which skips the length checks) the flow key accepts what the meta does.
    if let Ok(t) = key {
        assert_eq!(t, m.tuple);
    }
    if let Some(seg) = m.l4_bytes(data) {
        assert!(usize::from(m.l4) + seg.len() <= data.len());
    }
    if let Some(t) = m.tcp(data) {
        assert!(t.header_len() >= 20 && t.option_iter().count() <= 40);
        assert_eq!((t.src_port(), t.dst_port()), (m.tuple.src_port(), m.tuple.dst_port()));
    }
    if let Some(i) = m.icmp(data) {
        let _ = (i.msg_type(), i.is_error(), i.quoted_tuple(), i.payload().len());
    }
});
