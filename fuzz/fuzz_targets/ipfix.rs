//! IPFIX messages as `flowplane ipfix read FILE` walks them (`wire::ipfix`: `Message`, `Decoder`): no
//! panic whatever the bytes; a message's length is within what is left; every data record the
//! decoder returns matches a template it learnt (one value per field, fixed lengths kept); a flow
//! or NAT record read from any template re-emits with flowplane's own template and decodes back
//! to the same record.
//!
//! Input layout: IPFIX messages one after the other (a seed: `run --ipfix file:PATH`'s output).
#![no_main]

use flowplane_wire::ipfix::{
    templates, Decoder, FlowRecord, HeaderRepr, Message, MessageBuilder, NatRecord, TEMPLATE_NAT44_SESSION, VARLEN,
};
use libfuzzer_sys::fuzz_target;

fn round_trip(emit: impl FnOnce(&mut MessageBuilder<'_>) -> bool) -> Vec<flowplane_wire::ipfix::DataRecord> {
    let mut buf = Vec::new();
    let mut b = MessageBuilder::new(&mut buf, HeaderRepr { export_time: 0, sequence: 0, domain: 9 }, 65535);
    assert!(b.template_set(&templates()));
    assert!(emit(&mut b));
    b.finish();
    Decoder::new().decode(&buf).expect("flowplane's own message decodes")
}

fuzz_target!(|data: &[u8]| {
    let mut d = Decoder::new();
    let mut at = 0;
    while at < data.len() {
        let rest = &data[at..];
        let Ok(m) = Message::new_checked(rest) else { break };
        let len = m.length() as usize;
        assert!((16..=rest.len()).contains(&len));
        if let Ok(recs) = d.decode(&rest[..len]) {
            for r in &recs {
                for (f, v) in &r.fields {
                    assert!(f.len == VARLEN || v.len() == f.len as usize);
                }
                if let Some(f) = FlowRecord::from_fields(r) {
                    let (id, l) = f.template();
                    let back = round_trip(|b| b.record(id, l, |o| f.emit(o)));
                    assert_eq!(back.len(), 1);
                    assert_eq!(FlowRecord::from_fields(&back[0]), Some(f));
                }
                if let Some(n) = NatRecord::from_fields(r) {
                    let (id, l) = n.template();
                    let back = round_trip(|b| b.record(id, l, |o| n.emit(o)));
                    let again = NatRecord::from_fields(&back[0]).expect("nat record");
                    // Fields of the other NAT template are not carried (a session's pool, an exhaustion's 5-tuple).
                    assert_eq!((again.event, again.time_ms), (n.event, n.time_ms));
                    if id == TEMPLATE_NAT44_SESSION {
                        assert_eq!((again.src, again.sport, again.post_src, again.post_sport), (n.src, n.sport, n.post_src, n.post_sport));
                    } else {
                        assert_eq!(again.pool, n.pool);
                    }
                }
            }
        }
        at += len;
    }
});
