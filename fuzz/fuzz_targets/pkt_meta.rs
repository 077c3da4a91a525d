//! What an NF sees of a packet: `PktMeta::parse` and every `Pkt` accessor and rewriter on
//! arbitrary frames, with the parsed meta and with a meta whose offsets come from the input
//! (`Pkt::new` is safe and public, so inconsistent metas must not panic either). A rewrite of a
//! valid IPv4 header keeps its header checksum valid (RFC 1624 incremental update).
#![no_main]

use std::net::Ipv4Addr;

use flowplane_nf::{Pkt, PktMeta};
use flowplane_wire::checksum::checksum;
use flowplane_wire::ipv4::IpProtocol;
use libfuzzer_sys::fuzz_target;

/// True if `frame` holds an IPv4 header at `l3` whose header checksum verifies.
fn ipv4_header_ok(frame: &[u8], l3: usize) -> Option<bool> {
    let vihl = *frame.get(l3)?;
    let ihl = usize::from(vihl & 0x0f) * 4;
    if vihl >> 4 != 4 || ihl < 20 {
        return None;
    }
    Some(checksum(frame.get(l3..l3 + ihl)?) == 0)
}

fn exercise(frame: &mut [u8], meta: &PktMeta, check: bool) {
    let before = if check && meta.valid && !meta.v6 { ipv4_header_ok(frame, usize::from(meta.l3)) } else { None };
    let mut p = Pkt::new(frame, meta);
    let _ = (p.data().len(), p.len(), p.is_empty(), p.meta().valid, p.tuple(), p.proto());
    let _ = (p.tcp_flags(), p.tcp_seq_ack(), p.ipv4_src(), p.ipv4_dst(), p.src_port(), p.dst_port());
    let _ = p.tcp().map(|t| (t.option_iter().count(), t.payload().len()));
    let _ = p.icmp().map(|i| (i.is_error(), i.quoted_tuple()));
    let src = p.ipv4_src();
    let _ = p.set_ipv4_src(Ipv4Addr::new(192, 0, 2, 1));
    let _ = p.set_ipv4_dst(Ipv4Addr::new(10, 10, 0, 7));
    let _ = p.set_src_port(40_000);
    let _ = p.set_dst_port(0xffff);
    if let Some(s) = src {
        let _ = p.set_ipv4_src(s);
    }
    let _ = (p.ipv4_src(), p.ipv4_dst(), p.src_port(), p.dst_port(), p.tcp_flags(), p.tcp_seq_ack());
    if let Some(b) = p.data_mut().first_mut() {
        *b ^= 0;
    }
    if before == Some(true) {
        let after = ipv4_header_ok(p.data(), usize::from(meta.l3));
        assert_eq!(after, Some(true), "IPv4 header checksum broken by a rewrite");
    }
}

fuzz_target!(|data: &[u8]| {
    let meta = PktMeta::parse(data);
    if meta.valid {
        assert!(usize::from(meta.l3) < data.len());
        assert!(usize::from(meta.l4) <= data.len());
    }
    let mut frame = data.to_vec();
    exercise(&mut frame, &meta, true);

    // The same frame with a meta built from its first bytes.
    if data.len() >= 6 {
        let mut forged = meta;
        forged.valid = data[0] & 1 == 1;
        forged.v6 = data[0] & 2 == 2;
        forged.proto = IpProtocol(data[1]);
        forged.l3 = u16::from_le_bytes([data[2], data[3]]);
        forged.l4 = u16::from_le_bytes([data[4], data[5]]);
        let mut frame = data.to_vec();
        exercise(&mut frame, &forged, false);
    }
});
