//! State replication datagrams as a standby reads them (`wire::repl::decode`, `flowplane run
//! --replicate-listen`): no panic whatever the bytes; a datagram that decodes re-encodes to the same
//! bytes (one datagram, the header's count = its records) and decodes again to the same header and
//! records; a cut decoded datagram is refused.
//!
//! Input layout: one datagram (a seed: any UDP payload a `--replicate` run sends).
#![no_main]

use flowplane_wire::repl::{decode, encode, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut recs = Vec::new();
    let Ok(h) = decode(data, &mut recs) else { return };
    assert_eq!(usize::from(h.count), recs.len());
    let mut out = Vec::new();
    let n = encode(&h, &recs, usize::MAX, &mut out);
    assert_eq!(n, recs.len());
    assert_eq!(out, data, "a decoded datagram re-encodes to its own bytes");
    let mut again = Vec::new();
    assert_eq!(decode(&out, &mut again), Ok(h));
    assert_eq!(again, recs);
    if data.len() > HEADER_LEN {
        assert!(decode(&data[..data.len() - 1], &mut again).is_err());
    }
});
