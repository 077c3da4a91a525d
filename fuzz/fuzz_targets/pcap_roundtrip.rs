//! pcap writer -> reader round trips, in memory: whatever frames, timestamps and options
//! (micro/nanosecond, byte order, snapshot length, link type) are written, the reader finds the
//! same file header, the same packets truncated to the snapshot length, the recorded original
//! lengths, and the timestamps (whole microseconds in microsecond files); timestamps a pcap
//! cannot hold (past 2106) are refused by the writer, nothing else is.
//!
//! Input layout: byte 0 = options (bit 0 nanosecond, bit 1 big-endian, bits 2-3 link type,
//! bits 4-7 snapshot length from a table); then records `[ts: u64 LE][orig_len: u32 LE]
//! [len: u16 LE][len bytes]` (a short last record takes what is left).
#![no_main]

use flowplane_trace::{LinkType, PcapWriter, TraceFormat, TraceReader, WriterOptions};
use libfuzzer_sys::fuzz_target;

const SNAPLENS: [u32; 16] = [65535, 262_144, 1, 2, 13, 14, 15, 16, 20, 54, 64, 96, 128, 1514, 9216, 65536];
const LINKS: [LinkType; 4] = [LinkType::Ethernet, LinkType::RawIp, LinkType::LinuxSll, LinkType::LinuxSll2];

struct Written<'a> {
    ts_ns: u64,
    orig_len: u32,
    data: &'a [u8],
}

fuzz_target!(|data: &[u8]| {
    let Some((&opt, mut rest)) = data.split_first() else { return };
    let opts = WriterOptions {
        nanosecond: opt & 1 != 0,
        big_endian: opt & 2 != 0,
        link_type: LINKS[usize::from(opt >> 2 & 3)],
        snaplen: SNAPLENS[usize::from(opt >> 4)],
    };
    let mut w = PcapWriter::new(Vec::new(), opts).expect("valid options");
    let mut written = Vec::new();
    while let Some((head, body)) = rest.split_first_chunk::<14>() {
        let ts_ns = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
        let orig_len = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        let len = usize::from(u16::from_le_bytes([head[12], head[13]])).min(body.len());
        let (frame, next) = body.split_at(len);
        rest = next;
        match w.write_packet(ts_ns, frame, orig_len) {
            Ok(()) => written.push(Written { ts_ns, orig_len, data: frame }),
            Err(e) => assert!(ts_ns / 1_000_000_000 > u64::from(u32::MAX), "write refused at {ts_ns} ns: {e}"),
        }
    }
    assert_eq!(w.packets_written(), written.len() as u64);
    let file = w.finish().expect("in-memory writer");

    let mut r = TraceReader::new(&file[..]).expect("the writer's header reads back");
    assert_eq!(r.format(), TraceFormat::Pcap { nanosecond: opts.nanosecond, big_endian: opts.big_endian });
    assert_eq!(r.link_type(), Some(opts.link_type));
    assert_eq!(r.snaplen(), Some(opts.snaplen));
    for (i, want) in written.iter().enumerate() {
        let got = r
            .next_packet()
            .unwrap_or_else(|e| panic!("packet {i}: {e}"))
            .unwrap_or_else(|| panic!("packet {i} missing"));
        let cap = want.data.len().min(opts.snaplen as usize);
        assert_eq!(got.data, &want.data[..cap], "packet {i}");
        assert_eq!(got.link_type, opts.link_type);
        assert_eq!(got.orig_len, want.orig_len.max(want.data.len() as u32), "packet {i}");
        let ts = if opts.nanosecond { want.ts_ns } else { want.ts_ns - want.ts_ns % 1000 };
        assert_eq!(got.ts_ns, ts, "packet {i}");
    }
    assert!(r.next_packet().expect("clean end").is_none(), "more packets than written");
});
