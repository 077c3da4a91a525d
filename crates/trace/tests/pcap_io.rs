//! pcap/pcapng reader and pcap writer: round trips, hand-built pcapng files, link-type conversion, hostile input.

use std::io::{self, Read};

use flowplane_trace::{
    fuzz_read_all, to_ethernet, LinkType, PacketRef, PcapWriter, TraceError, TraceErrorKind, TraceFormat, TraceReader,
    Unparsed, UnparsedCounts, WriterOptions,
};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------------------------
// helpers

/// An owned copy of a packet, for comparisons after the reader moved on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Owned {
    ts_ns: u64,
    orig_len: u32,
    link_type: LinkType,
    data: Vec<u8>,
}

impl Owned {
    fn of(p: &PacketRef<'_>) -> Self {
        Owned { ts_ns: p.ts_ns, orig_len: p.orig_len, link_type: p.link_type, data: p.data.to_vec() }
    }
}

/// Reads everything; returns the packets, the counts of skipped records and what ended the reading early: the
/// terminating error or the reason the reader stopped before the end of the file.
fn read_counted<R: Read>(r: R) -> Result<(Vec<Owned>, UnparsedCounts, Option<String>), TraceError> {
    let mut reader = TraceReader::new(r)?;
    let mut out = Vec::new();
    loop {
        match reader.next_packet() {
            Ok(Some(p)) => out.push(Owned::of(&p)),
            Ok(None) => {
                let stopped = reader.stopped_early().map(ToString::to_string);
                // Stopping early is always counted, and only then.
                let stops =
                    reader.unparsed().get(Unparsed::TruncatedRecord) + reader.unparsed().get(Unparsed::UnreadableRest);
                assert_eq!(stops, u64::from(stopped.is_some()), "{stopped:?}");
                return Ok((out, *reader.unparsed(), stopped));
            }
            Err(e) => return Ok((out, *reader.unparsed(), Some(e.to_string()))),
        }
    }
}

/// [`read_counted`] without the counts.
fn read_all<R: Read>(r: R) -> Result<(Vec<Owned>, Option<String>), TraceError> {
    read_counted(r).map(|(p, _, e)| (p, e))
}

fn read_ok(bytes: &[u8]) -> Vec<Owned> {
    let (pkts, err) = read_all(bytes).expect("header");
    assert!(err.is_none(), "unexpected error: {}", err.unwrap());
    pkts
}

fn read_err(bytes: &[u8]) -> String {
    match read_all(bytes) {
        Err(e) => e.to_string(),
        Ok((_, Some(e))) => e.to_string(),
        Ok((p, None)) => panic!("expected an error, read {} packets", p.len()),
    }
}

fn sample_packets(n: usize) -> Vec<(u64, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let len = 14 + (i * 37) % 1500;
            let data: Vec<u8> = (0..len).map(|j| (i * 7 + j) as u8).collect();
            // Distinct sub-microsecond digits so the resolution of each variant shows.
            let ts = 1_700_000_000_000_000_000 + i as u64 * 1_234_567_891;
            (ts, data)
        })
        .collect()
}

fn write_pcap(opts: WriterOptions, pkts: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let mut w = PcapWriter::new(Vec::new(), opts).unwrap();
    for (ts, data) in pkts {
        w.write_packet(*ts, data, data.len() as u32).unwrap();
    }
    assert_eq!(w.packets_written(), pkts.len() as u64);
    w.finish().unwrap()
}

const VARIANTS: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

/// Builds pcapng blocks in either byte order.
struct Ng {
    big: bool,
    out: Vec<u8>,
}

impl Ng {
    fn new(big: bool) -> Self {
        Ng { big, out: Vec::new() }
    }
    fn u16(&self, v: u16) -> [u8; 2] {
        if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }
    fn u32(&self, v: u32) -> [u8; 4] {
        if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }
    /// Appends a block of `block_type` with `body` padded to 4 bytes.
    fn block(&mut self, block_type: u32, body: &[u8]) -> &mut Self {
        let padded = body.len().next_multiple_of(4);
        let total = (12 + padded) as u32;
        let mut b = Vec::new();
        b.extend_from_slice(&self.u32(block_type));
        b.extend_from_slice(&self.u32(total));
        b.extend_from_slice(body);
        b.resize(8 + padded, 0);
        b.extend_from_slice(&self.u32(total));
        self.out.extend_from_slice(&b);
        self
    }
    fn option(&self, code: u16, value: &[u8]) -> Vec<u8> {
        let mut o = Vec::new();
        o.extend_from_slice(&self.u16(code));
        o.extend_from_slice(&self.u16(value.len() as u16));
        o.extend_from_slice(value);
        o.resize(o.len().next_multiple_of(4), 0);
        o
    }
    fn shb(&mut self) -> &mut Self {
        let mut body = Vec::new();
        body.extend_from_slice(&self.u32(0x1a2b_3c4d));
        body.extend_from_slice(&self.u16(1));
        body.extend_from_slice(&self.u16(0));
        body.extend_from_slice(&(-1i64).to_le_bytes());
        // A comment option plus end-of-options, as real writers emit.
        body.extend_from_slice(&self.option(1, b"hand built"));
        body.extend_from_slice(&self.option(0, &[]));
        self.block(0x0a0d_0d0a, &body)
    }
    fn idb(&mut self, dlt: u16, snaplen: u32, tsresol: Option<u8>) -> &mut Self {
        let mut body = Vec::new();
        body.extend_from_slice(&self.u16(dlt));
        body.extend_from_slice(&self.u16(0));
        body.extend_from_slice(&self.u32(snaplen));
        body.extend_from_slice(&self.option(2, b"eth0"));
        if let Some(r) = tsresol {
            body.extend_from_slice(&self.option(9, &[r]));
        }
        body.extend_from_slice(&self.option(0, &[]));
        self.block(1, &body)
    }
    fn epb(&mut self, ifc: u32, ts: u64, data: &[u8], orig_len: u32) -> &mut Self {
        let mut body = Vec::new();
        body.extend_from_slice(&self.u32(ifc));
        body.extend_from_slice(&self.u32((ts >> 32) as u32));
        body.extend_from_slice(&self.u32(ts as u32));
        body.extend_from_slice(&self.u32(data.len() as u32));
        body.extend_from_slice(&self.u32(orig_len));
        body.extend_from_slice(data);
        body.resize(body.len().next_multiple_of(4), 0);
        body.extend_from_slice(&self.option(1, b"epb comment"));
        self.block(6, &body)
    }
    fn spb(&mut self, data: &[u8], orig_len: u32) -> &mut Self {
        let mut body = Vec::new();
        body.extend_from_slice(&self.u32(orig_len));
        body.extend_from_slice(data);
        self.block(3, &body)
    }
    fn bytes(&self) -> Vec<u8> {
        self.out.clone()
    }
}

fn eth_frame(seed: u8, len: usize) -> Vec<u8> {
    let mut f: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8)).collect();
    f[12] = 0x08;
    f[13] = 0x00;
    f
}

// ---------------------------------------------------------------------------------------------------------------
// pcap

#[test]
fn pcap_round_trip_all_four_variants() {
    let pkts = sample_packets(300);
    for (nanosecond, big_endian) in VARIANTS {
        let opts = WriterOptions { nanosecond, big_endian, ..WriterOptions::default() };
        let bytes = write_pcap(opts, &pkts);
        let magic = if nanosecond { 0xa1b2_3c4du32 } else { 0xa1b2_c3d4 };
        let expect_magic = if big_endian { magic.to_be_bytes() } else { magic.to_le_bytes() };
        assert_eq!(bytes[..4], expect_magic);

        let mut r = TraceReader::new(bytes.as_slice()).unwrap();
        assert_eq!(r.format(), TraceFormat::Pcap { nanosecond, big_endian });
        assert!(r.format().to_string().starts_with("pcap ("));
        assert_eq!(r.link_type(), Some(LinkType::Ethernet));
        assert_eq!(r.snaplen(), Some(65535));
        for (ts, data) in &pkts {
            let p = r.next_packet().unwrap().expect("packet");
            let want_ts = if nanosecond { *ts } else { ts - ts % 1000 };
            assert_eq!(p.ts_ns, want_ts);
            assert_eq!(p.data, data.as_slice());
            assert_eq!(p.orig_len, data.len() as u32);
            assert_eq!(p.link_type, LinkType::Ethernet);
        }
        assert!(r.next_packet().unwrap().is_none());
        // Fused: stays at the end.
        assert!(r.next_packet().unwrap().is_none());
        assert_eq!(r.packets_read(), pkts.len() as u64);
        assert_eq!(r.offset(), bytes.len() as u64);
    }
}

#[test]
fn pcap_round_trip_every_link_type() {
    for lt in LinkType::ALL {
        let bytes = write_pcap(WriterOptions { link_type: lt, ..Default::default() }, &sample_packets(3));
        let pkts = read_ok(&bytes);
        assert_eq!(pkts.len(), 3);
        assert!(pkts.iter().all(|p| p.link_type == lt));
    }
}

#[test]
fn writer_truncates_to_snaplen_and_keeps_orig_len() {
    let mut w = PcapWriter::new(Vec::new(), WriterOptions { snaplen: 64, ..Default::default() }).unwrap();
    let big = vec![0xab; 200];
    w.write_packet(5, &big, 200).unwrap();
    // orig_len smaller than the data is raised to the data length.
    w.write_packet(6, &big[..50], 10).unwrap();
    let bytes = w.finish().unwrap();
    let pkts = read_ok(&bytes);
    assert_eq!(pkts[0].data.len(), 64);
    assert_eq!(pkts[0].orig_len, 200);
    assert_eq!(pkts[1].data.len(), 50);
    assert_eq!(pkts[1].orig_len, 50);
}

#[test]
fn writer_rejects_bad_options_and_timestamps() {
    let e = PcapWriter::new(Vec::new(), WriterOptions { snaplen: 0, ..Default::default() }).err().unwrap();
    assert!(e.to_string().contains("snaplen"), "{e}");
    let e = PcapWriter::new(Vec::new(), WriterOptions { snaplen: 300_000, ..Default::default() }).err().unwrap();
    assert!(e.to_string().contains("snaplen"), "{e}");
    let mut w = PcapWriter::new(Vec::new(), WriterOptions::default()).unwrap();
    let e = w.write_packet(u64::MAX, &[0; 20], 20).unwrap_err();
    assert!(matches!(e.kind(), TraceErrorKind::TimestampOutOfRange(_)), "{e}");
    assert_eq!(w.packets_written(), 0);
    // The last second that fits still works.
    w.write_packet(u64::from(u32::MAX) * 1_000_000_000 + 999_999_999, &[0; 20], 20).unwrap();
    let pkts = read_ok(&w.finish().unwrap());
    assert_eq!(pkts[0].ts_ns, u64::from(u32::MAX) * 1_000_000_000 + 999_999_000);
}

#[test]
fn file_round_trip_and_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("flowplane-trace-io-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rt.pcap");
    let pkts = sample_packets(50);
    let mut w = PcapWriter::create(&path, WriterOptions { nanosecond: true, ..Default::default() }).unwrap();
    for (ts, d) in &pkts {
        w.write_packet(*ts, d, d.len() as u32).unwrap();
    }
    w.finish().unwrap();
    let mut r = TraceReader::open(&path).unwrap();
    let mut n = 0;
    while let Some(p) = r.next_packet().unwrap() {
        assert_eq!(p.ts_ns, pkts[n].0);
        n += 1;
    }
    assert_eq!(n, 50);

    // Truncate the file inside the last record: the complete ones are read, the last is counted, and the reason
    // names the file and the record's offset.
    let full = std::fs::read(&path).unwrap();
    let last_len = 16 + pkts[49].1.len();
    std::fs::write(&path, &full[..full.len() - 3]).unwrap();
    let mut r = TraceReader::open(&path).unwrap();
    let mut n = 0;
    while r.next_packet().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 49);
    assert_eq!(r.unparsed().get(Unparsed::TruncatedRecord), 1);
    let want = format!("{}: truncated packet record at byte {}", path.display(), full.len() - last_len);
    assert_eq!(r.stopped_early().unwrap().to_string(), want);

    let missing = dir.join("missing.pcap");
    let e = TraceReader::open(&missing).err().unwrap();
    assert!(e.to_string().starts_with(&format!("{}: cannot open: ", missing.display())), "{e}");
    let e = PcapWriter::create(&dir.join("no/such/dir.pcap"), WriterOptions::default()).err().unwrap();
    assert!(e.to_string().contains("no/such/dir.pcap: cannot create: "), "{e}");
    assert!(!e.to_string().contains('\n'));
    std::fs::write(&path, b"").unwrap();
    let e = TraceReader::open(&path).err().unwrap();
    assert_eq!(e.to_string(), format!("{}: empty file (not a pcap or pcapng file)", path.display()));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn pcap_header(dlt: u32, snaplen: u32) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    h.extend_from_slice(&2u16.to_le_bytes());
    h.extend_from_slice(&4u16.to_le_bytes());
    h.extend_from_slice(&[0; 8]);
    h.extend_from_slice(&snaplen.to_le_bytes());
    h.extend_from_slice(&dlt.to_le_bytes());
    h
}

fn pcap_record(caplen: u32, orig: u32, data: &[u8]) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend_from_slice(&1u32.to_le_bytes());
    r.extend_from_slice(&2u32.to_le_bytes());
    r.extend_from_slice(&caplen.to_le_bytes());
    r.extend_from_slice(&orig.to_le_bytes());
    r.extend_from_slice(data);
    r
}

#[test]
fn pcap_header_errors() {
    assert_eq!(read_err(b""), "empty file (not a pcap or pcapng file)");
    assert_eq!(read_err(b"\x12\x34"), "truncated file header at byte 0");
    assert_eq!(read_err(&[0x12, 0x34, 0x56, 0x78, 0, 0, 0, 0]), "not a pcap or pcapng file (magic 0x12345678)");
    assert_eq!(read_err(&pcap_header(1, 65535)[..20]), "truncated file header at byte 0");
    assert_eq!(read_err(&pcap_header(105, 65535)), "unsupported link type 105 (IEEE 802.11)");
    assert_eq!(read_err(&pcap_header(147, 65535)), "unsupported link type 147 (user-defined)");
    let mut h = pcap_header(1, 65535);
    h[4] = 3;
    assert_eq!(read_err(&h), "unsupported pcap version 3.4");
}

#[test]
fn pcap_corrupt_records() {
    // caplen above the snaplen: read in full and counted, as Wireshark reads it.
    let mut f = pcap_header(1, 100);
    f.extend(pcap_record(60, 60, &[0; 60]));
    f.extend(pcap_record(101, 101, &[1; 101]));
    f.extend(pcap_record(60, 60, &[2; 60]));
    let mut r = TraceReader::new(f.as_slice()).unwrap();
    let mut lens = vec![];
    while let Some(p) = r.next_packet().unwrap() {
        lens.push(p.data.len());
    }
    assert_eq!(lens, [60, 101, 60]);
    assert_eq!((r.over_snaplen(), r.unparsed().total()), (1, 0));
    // caplen above 256 KiB even when the snaplen is larger (or zero): the next record cannot be found, so reading
    // stops there, after the packets before it, and says why.
    for snap in [0, u32::MAX] {
        let mut f = pcap_header(1, snap);
        f.extend(pcap_record(60, 60, &[0; 60]));
        f.extend(pcap_record(300_000, 300_000, &[]));
        f.extend(pcap_record(60, 60, &[0; 60]));
        let (pkts, counts, why) = read_counted(f.as_slice()).unwrap();
        assert_eq!((pkts.len(), counts.get(Unparsed::UnreadableRest), counts.total()), (1, 1, 1));
        assert_eq!(why.unwrap(), "corrupt record at byte 100: captured length 300000 exceeds 262144");
    }
    // A 256 KiB record is fine and grows the buffer only to fit it.
    let mut f = pcap_header(1, 262_144);
    f.extend(pcap_record(262_144, 262_144, &vec![7; 262_144]));
    f.extend(pcap_record(10, 10, &[1; 10]));
    let pkts = read_ok(&f);
    assert_eq!(pkts.len(), 2);
    assert_eq!(pkts[0].data.len(), 262_144);
}

// ---------------------------------------------------------------------------------------------------------------
// pcapng

#[test]
fn pcapng_both_byte_orders_and_tsresol() {
    for big in [false, true] {
        let f1 = eth_frame(1, 60);
        let f2 = eth_frame(2, 61);
        let f3 = eth_frame(3, 97);
        let mut ng = Ng::new(big);
        ng.shb()
            .idb(1, 65535, None) // default: microseconds
            .idb(1, 65535, Some(9)) // nanoseconds
            .idb(1, 65535, Some(3)) // milliseconds
            .idb(1, 65535, Some(0x80 | 20)) // 2^-20 s
            .idb(1, 65535, Some(12)); // picoseconds
        ng.epb(0, 1_700_000_000_123_456, &f1, 60)
            .epb(1, 1_700_000_000_123_456_789, &f2, 1514)
            .epb(2, 1_700_000_000_123, &f3, 97)
            .epb(3, 3 << 20 | 1 << 19, &f1, 60)
            .epb(4, 5_000_000_000_007_000, &f2, 61);
        let bytes = ng.bytes();
        let mut r = TraceReader::new(bytes.as_slice()).unwrap();
        assert_eq!(r.format(), TraceFormat::PcapNg);
        assert_eq!(r.link_type(), None);
        let p = r.next_packet().unwrap().unwrap();
        assert_eq!((p.ts_ns, p.orig_len, p.data), (1_700_000_000_123_456_000, 60, f1.as_slice()));
        let p = r.next_packet().unwrap().unwrap();
        assert_eq!((p.ts_ns, p.orig_len, p.data), (1_700_000_000_123_456_789, 1514, f2.as_slice()));
        let p = r.next_packet().unwrap().unwrap();
        assert_eq!((p.ts_ns, p.data), (1_700_000_000_123_000_000, f3.as_slice()));
        let p = r.next_packet().unwrap().unwrap();
        assert_eq!(p.ts_ns, 3_500_000_000);
        let p = r.next_packet().unwrap().unwrap();
        assert_eq!(p.ts_ns, 5_000_000_000_007);
        assert_eq!(p.link_type, LinkType::Ethernet);
        assert!(r.next_packet().unwrap().is_none());
    }
}

#[test]
fn pcapng_multiple_sections_switch_byte_order_and_reset_interfaces() {
    let mut a = Ng::new(false);
    a.shb().idb(1, 0, Some(9)).idb(113, 0, Some(9)).epb(1, 10, &[0; 16], 16);
    let mut b = Ng::new(true);
    b.shb().idb(101, 0, None).epb(0, 20, &[0x45; 20], 20).spb(&[0x60; 40], 40);
    let mut bytes = a.bytes();
    bytes.extend(b.bytes());
    let pkts = read_ok(&bytes);
    assert_eq!(pkts.len(), 3);
    assert_eq!((pkts[0].link_type, pkts[0].ts_ns), (LinkType::LinuxSll, 10));
    assert_eq!((pkts[1].link_type, pkts[1].ts_ns), (LinkType::RawIp, 20_000));
    assert_eq!((pkts[2].link_type, pkts[2].ts_ns, pkts[2].data.len()), (LinkType::RawIp, 0, 40));

    // Interface 1 of the first section does not exist in the second: that packet is counted, the next one read.
    let mut c = Ng::new(true);
    c.shb().idb(1, 0, None);
    c.epb(1, 0, &[0; 16], 16).epb(0, 0, &[0; 16], 16);
    let mut bytes = a.bytes();
    bytes.extend(c.bytes());
    let (pkts, counts, why) = read_counted(bytes.as_slice()).unwrap();
    assert_eq!((pkts.len(), counts.get(Unparsed::UnknownInterface), counts.total(), why), (2, 1, 1, None));
}

#[test]
fn pcapng_simple_packet_block_respects_snaplen() {
    let mut ng = Ng::new(false);
    ng.shb().idb(1, 64, None).spb(&eth_frame(9, 64), 1000).spb(&eth_frame(9, 30), 30);
    let pkts = read_ok(&ng.bytes());
    assert_eq!(pkts.len(), 2);
    assert_eq!((pkts[0].data.len(), pkts[0].orig_len), (64, 1000));
    // Padding bytes of the block are not part of the packet.
    assert_eq!((pkts[1].data.len(), pkts[1].orig_len), (30, 30));
}

#[test]
fn pcapng_skips_unknown_blocks_even_huge_ones() {
    let mut ng = Ng::new(false);
    ng.shb().idb(1, 0, None);
    ng.block(0x0000_0bad, &[1, 2, 3]);
    ng.epb(0, 1, &eth_frame(0, 60), 60);
    // Bigger than anything the reader buffers: skipped by streaming.
    ng.block(0x8000_0001, &vec![0x55; 3 << 20]);
    let huge_trailer = ng.out.len() - 4;
    ng.block(5, &[0; 40]); // Interface Statistics Block
    ng.epb(0, 2, &eth_frame(1, 60), 60);
    let bytes = ng.bytes();
    let mut r = TraceReader::new(bytes.as_slice()).unwrap();
    let mut n = 0;
    while r.next_packet().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 2);
    assert!(r.buffer_len() <= 256 * 1024, "buffer grew to {}", r.buffer_len());
    // The huge block's trailer is still validated: a mismatch is a corrupt block, stepped over because a sound
    // block follows (issue 35: one corrupt block hid every packet after it).
    let mut bad = bytes.clone();
    bad[huge_trailer] ^= 4;
    let (pkts, counts, why) = read_counted(bad.as_slice()).unwrap();
    assert_eq!((pkts.len(), counts.get(Unparsed::CorruptRecord), counts.total(), why), (2, 1, 1, None));
}

/// Issue 35 item 6: a pcapng block with corrupt framing hid every packet after it; now it is skipped and counted
/// when a sound block follows, and the reading ends (with the reason) only when none does.
#[test]
fn pcapng_corrupt_framing_is_skipped_when_a_sound_block_follows() {
    let mut ng = Ng::new(false);
    ng.shb().idb(1, 0, None).epb(0, 1, &eth_frame(0, 60), 60);
    let bad_off = ng.out.len();
    ng.epb(0, 2, &eth_frame(1, 60), 60);
    let bad_len = ng.out.len() - bad_off;
    ng.epb(0, 3, &eth_frame(2, 60), 60).epb(0, 4, &eth_frame(3, 61), 61);
    let good = ng.bytes();
    let ts = |p: &[Owned]| p.iter().map(|x| x.ts_ns).collect::<Vec<_>>();
    for (what, patch) in [
        ("leading length not a multiple of 4", (bad_off + 4, 102u32)),
        ("leading length below 12", (bad_off + 4, 8)),
        ("leading length pointing past the next block", (bad_off + 4, bad_len as u32 + 8)),
        ("trailing length differs", (bad_off + bad_len - 4, 200)),
    ] {
        let mut b = good.clone();
        b[patch.0..patch.0 + 4].copy_from_slice(&patch.1.to_le_bytes());
        let (pkts, counts, why) = read_counted(b.as_slice()).unwrap();
        assert_eq!(ts(&pkts), [1_000, 3_000, 4_000], "{what}");
        assert_eq!((counts.get(Unparsed::CorruptRecord), counts.total(), why), (1, 1, None), "{what}");
    }
    // Nothing sound after it: the reading ends there, with the reason.
    let mut b = good[..bad_off + bad_len].to_vec();
    b[bad_off + 4..bad_off + 8].copy_from_slice(&102u32.to_le_bytes());
    let (pkts, counts, why) = read_counted(b.as_slice()).unwrap();
    assert_eq!((pkts.len(), counts.get(Unparsed::UnreadableRest)), (1, 1));
    assert_eq!(
        why.unwrap(),
        format!("corrupt pcapng block at byte {bad_off}: block length not a multiple of 4 of at least 12")
    );
}

/// Issue 35 item 6: a section header whose byte-order magic was swapped read its length in the wrong order and
/// was reported as a truncated record; the error now names the magic.
#[test]
fn pcapng_swapped_byte_order_magic_is_named() {
    for big in [false, true] {
        let mut ng = Ng::new(big);
        ng.shb().idb(1, 0, None).epb(0, 1, &eth_frame(0, 60), 60);
        let mut b = ng.bytes();
        b[8..12].reverse();
        let e = read_err(&b);
        assert!(e.contains("byte-order magic contradicts its block length"), "{e}");
        assert!(!e.contains("truncated"), "{e}");
    }
}

#[test]
fn pcapng_block_length_validation() {
    let mut ng = Ng::new(false);
    ng.shb().idb(1, 0, None);
    let epb_off = ng.out.len();
    ng.epb(0, 1, &eth_frame(0, 60), 60);
    let good = ng.bytes();
    // Trailing length mismatch.
    let mut b = good.clone();
    let last = b.len() - 4;
    b[last] ^= 4;
    assert_eq!(
        read_err(&b),
        format!("corrupt pcapng block at byte {epb_off}: trailing block length differs from leading one")
    );
    // Not a multiple of 4, and below 12.
    for bad_len in [102u32, 8, 0] {
        let mut b = good.clone();
        b[epb_off + 4..epb_off + 8].copy_from_slice(&bad_len.to_le_bytes());
        assert!(read_err(&b).contains("block length not a multiple of 4"), "{}", read_err(&b));
    }
    // Captured length overrunning the block, or beyond 256 KiB: the framing is sound, so only that block is skipped.
    for caplen in [100u32, 300_000] {
        let mut b = good.clone();
        b[epb_off + 20..epb_off + 24].copy_from_slice(&caplen.to_le_bytes());
        b.extend_from_slice(&good[epb_off..]);
        let (pkts, counts, why) = read_counted(b.as_slice()).unwrap();
        assert_eq!((pkts.len(), counts.get(Unparsed::CorruptRecord), counts.total(), why), (1, 1, 1, None));
    }
    // Bad byte-order magic, wrong version.
    let mut b = good.clone();
    b[8] = 0;
    assert!(read_err(&b).contains("bad byte-order magic"));
    let mut b = good.clone();
    b[12] = 2;
    assert_eq!(read_err(&b), "unsupported pcapng version 2.0");
    // Packet before any interface: counted; the interface defined after it serves the next packet.
    let mut ng = Ng::new(false);
    ng.shb().epb(0, 1, &[0; 4], 4).idb(1, 0, None).epb(0, 1, &[0; 4], 4);
    let (pkts, counts, why) = read_counted(ng.bytes().as_slice()).unwrap();
    assert_eq!((pkts.len(), counts.get(Unparsed::UnknownInterface), why), (1, 1, None));
    // A corrupt interface description still takes its number: its packets are counted, the next interface's read.
    let mut ng = Ng::new(false);
    ng.shb();
    ng.block(1, &[1, 0, 0, 0]); // IDB too short for its fields
    ng.idb(1, 0, None).epb(0, 1, &[0; 4], 4).epb(1, 1, &[0; 4], 4);
    let (pkts, counts, why) = read_counted(ng.bytes().as_slice()).unwrap();
    assert_eq!((pkts.len(), counts.get(Unparsed::CorruptRecord), why), (1, 2, None));
}

#[test]
fn pcapng_unsupported_link_type_named_when_used() {
    let mut ng = Ng::new(false);
    ng.shb().idb(105, 0, None).idb(1, 0, None).epb(1, 1, &[0; 14], 14).epb(0, 1, &[0; 14], 14);
    let (pkts, err) = read_all(ng.bytes().as_slice()).unwrap();
    assert_eq!(pkts.len(), 1);
    assert_eq!(err.unwrap().to_string(), "unsupported link type 105 (IEEE 802.11)");
}

// ---------------------------------------------------------------------------------------------------------------
// to_ethernet

fn ipv4_packet() -> Vec<u8> {
    let mut p = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
    p.extend_from_slice(&[0x12, 0x34, 0x00, 0x35, 0, 8, 0, 0]);
    p
}

#[test]
fn to_ethernet_raw_ip() {
    let v4 = ipv4_packet();
    let mut scratch = Vec::new();
    let pkt = PacketRef { ts_ns: 0, orig_len: 28, link_type: LinkType::RawIp, data: &v4 };
    let eth = to_ethernet(&pkt, &mut scratch).unwrap();
    assert_eq!(eth.len(), 14 + 28);
    assert_eq!(&eth[12..14], &[0x08, 0x00]);
    assert_eq!(&eth[14..], v4.as_slice());

    let mut v6 = vec![0x60; 40];
    v6[6] = 59;
    let mut scratch = Vec::new();
    let pkt = PacketRef { ts_ns: 0, orig_len: 40, link_type: LinkType::RawIp, data: &v6 };
    let eth = to_ethernet(&pkt, &mut scratch).unwrap();
    assert_eq!(&eth[12..14], &[0x86, 0xdd]);
    assert_eq!(&eth[14..], v6.as_slice());

    let mut scratch = Vec::new();
    let bad = [0x50u8; 20];
    let pkt = PacketRef { ts_ns: 0, orig_len: 20, link_type: LinkType::RawIp, data: &bad };
    assert_eq!(to_ethernet(&pkt, &mut scratch).unwrap_err().to_string(), "raw IP packet with unknown IP version 5");
    let mut scratch = Vec::new();
    let pkt = PacketRef { ts_ns: 0, orig_len: 0, link_type: LinkType::RawIp, data: &[] };
    assert!(to_ethernet(&pkt, &mut scratch).is_err());
}

#[test]
fn to_ethernet_sll_v1() {
    let mac = [0x00, 0x11, 0x22, 0x33, 0x44, 0x55];
    let mut sll = vec![0, 0, 0, 1, 0, 6];
    sll.extend_from_slice(&mac);
    sll.extend_from_slice(&[0, 0, 0x08, 0x00]);
    sll.extend(ipv4_packet());
    let mut scratch = Vec::new();
    let pkt = PacketRef { ts_ns: 0, orig_len: sll.len() as u32, link_type: LinkType::LinuxSll, data: &sll };
    let eth = to_ethernet(&pkt, &mut scratch).unwrap();
    assert_eq!(&eth[6..12], &mac);
    assert_eq!(&eth[12..14], &[0x08, 0x00]);
    assert_eq!(&eth[14..], ipv4_packet().as_slice());

    // Non-EtherType protocol (802.2 LLC) and short headers are errors.
    let mut llc = sll.clone();
    llc[14..16].copy_from_slice(&[0x00, 0x04]);
    let mut scratch = Vec::new();
    let pkt = PacketRef { link_type: LinkType::LinuxSll, data: &llc, ..pkt };
    assert_eq!(
        to_ethernet(&pkt, &mut scratch).unwrap_err().to_string(),
        "Linux cooked capture with non-EtherType protocol 0x0004"
    );
    let mut scratch = Vec::new();
    let pkt = PacketRef { data: &sll[..15], ..pkt };
    assert_eq!(
        to_ethernet(&pkt, &mut scratch).unwrap_err().to_string(),
        "packet too short for link type Linux cooked capture v1 (15 bytes)"
    );
}

#[test]
fn to_ethernet_sll_v2() {
    let mut sll2 = vec![0x86, 0xdd, 0, 0, 0, 0, 0, 3, 0, 1, 4, 6];
    sll2.extend_from_slice(&[0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0, 0]);
    let mut v6 = vec![0x60; 40];
    v6[6] = 59;
    sll2.extend_from_slice(&v6);
    let mut scratch = Vec::new();
    let pkt = PacketRef { ts_ns: 0, orig_len: 60, link_type: LinkType::LinuxSll2, data: &sll2 };
    let eth = to_ethernet(&pkt, &mut scratch).unwrap();
    assert_eq!(&eth[6..12], &[0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]);
    assert_eq!(&eth[12..14], &[0x86, 0xdd]);
    assert_eq!(&eth[14..], v6.as_slice());
    // An address that is not 6 bytes long gets the synthetic source MAC.
    let mut odd = sll2.clone();
    odd[11] = 0;
    let mut scratch = Vec::new();
    let pkt = PacketRef { data: &odd, ..pkt };
    let eth = to_ethernet(&pkt, &mut scratch).unwrap();
    assert_eq!(&eth[6..12], &[0x02, 0, 0, 0, 0, 0x01]);
    let mut scratch = Vec::new();
    let pkt = PacketRef { data: &sll2[..19], ..pkt };
    assert!(to_ethernet(&pkt, &mut scratch).is_err());
}

#[test]
fn to_ethernet_is_identity_for_ethernet() {
    let f = eth_frame(4, 64);
    let mut scratch = Vec::new();
    let pkt = PacketRef { ts_ns: 0, orig_len: 64, link_type: LinkType::Ethernet, data: &f };
    let eth = to_ethernet(&pkt, &mut scratch).unwrap();
    assert_eq!(eth.as_ptr(), f.as_ptr());
}

// ---------------------------------------------------------------------------------------------------------------
// streaming, truncation, hostile input

/// Hands out at most `chunk` bytes per read and fails with `Interrupted` every other call.
struct Trickle<'a> {
    data: &'a [u8],
    chunk: usize,
    interrupt: bool,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.interrupt = !self.interrupt;
        if self.interrupt {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "again"));
        }
        let n = self.chunk.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[test]
fn tiny_and_interrupted_reads_give_the_same_packets() {
    let pcap = write_pcap(WriterOptions::default(), &sample_packets(40));
    let mut ng = Ng::new(true);
    ng.shb().idb(1, 0, Some(9));
    for (ts, d) in sample_packets(40) {
        ng.epb(0, ts, &d, d.len() as u32);
    }
    for file in [pcap, ng.bytes()] {
        let whole = read_ok(&file);
        for chunk in [1, 3, 7, 4096] {
            let (pkts, err) = read_all(Trickle { data: &file, chunk, interrupt: false }).unwrap();
            assert!(err.is_none());
            assert_eq!(pkts, whole);
        }
    }
}

#[test]
fn io_errors_are_reported_with_offset() {
    struct Failing(usize);
    impl Read for Failing {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0 == 0 {
                return Err(io::Error::other("disk on fire"));
            }
            let hdr = pcap_header(1, 65535);
            let n = buf.len().min(hdr.len());
            buf[..n].copy_from_slice(&hdr[..n]);
            self.0 -= 1;
            Ok(n)
        }
    }
    let mut r = TraceReader::new(Failing(1)).unwrap();
    let e = r.next_packet().unwrap_err();
    assert_eq!(e.to_string(), "I/O error at byte 24: disk on fire");
    assert!(std::error::Error::source(&e).is_some());
    assert!(r.next_packet().unwrap().is_none());
}

/// Truncating a valid file anywhere gives an error, except exactly at record boundaries, where the packets read so
/// far are exactly the complete ones.
fn check_every_truncation(file: &[u8], boundaries: &[usize], header_end: usize) {
    let all = read_ok(file);
    for cut in 0..file.len() {
        let res = read_all(&file[..cut]);
        if cut < header_end {
            assert!(res.is_err(), "cut {cut}: header accepted");
            continue;
        }
        let (pkts, err) = res.unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        let complete = boundaries.iter().filter(|&&b| b <= cut).count();
        assert_eq!(pkts.as_slice(), &all[..complete.min(pkts.len())], "cut {cut}");
        if boundaries.contains(&cut) || cut == header_end {
            assert!(err.is_none(), "cut {cut} at a boundary gave {}", err.unwrap());
        } else {
            let err = err.unwrap_or_else(|| panic!("cut {cut} inside a record read cleanly"));
            assert!(err.to_string().contains("truncated"), "cut {cut}: {err}");
        }
    }
}

#[test]
fn pcap_truncated_at_every_offset() {
    let pkts = sample_packets(12);
    for (nanosecond, big_endian) in VARIANTS {
        let file = write_pcap(WriterOptions { nanosecond, big_endian, ..Default::default() }, &pkts);
        let mut boundaries = Vec::new();
        let mut at = 24;
        for (_, d) in &pkts {
            at += 16 + d.len();
            boundaries.push(at);
        }
        check_every_truncation(&file, &boundaries, 24);
    }
}

#[test]
fn pcapng_truncated_at_every_offset() {
    for big in [false, true] {
        let mut ng = Ng::new(big);
        ng.shb();
        let header_end = ng.out.len();
        // Block boundaries that do not add a packet are still clean ends; record the packet ones.
        let mut clean = vec![];
        ng.idb(1, 0, Some(6));
        clean.push(ng.out.len());
        let mut packet_ends = vec![];
        for (ts, d) in sample_packets(6) {
            ng.epb(0, ts / 1000, &d, d.len() as u32);
            packet_ends.push(ng.out.len());
        }
        ng.block(0x0bad, &[9; 10]);
        clean.push(ng.out.len());
        ng.spb(&eth_frame(1, 60), 60);
        packet_ends.push(ng.out.len());
        let file = ng.bytes();
        let all = read_ok(&file);
        assert_eq!(all.len(), 7);
        for cut in 0..file.len() {
            let res = read_all(&file[..cut]);
            if cut < header_end {
                assert!(res.is_err(), "cut {cut}");
                continue;
            }
            let (pkts, err) = res.unwrap();
            let complete = packet_ends.iter().filter(|&&b| b <= cut).count();
            assert_eq!(pkts.as_slice(), &all[..complete], "cut {cut}");
            let boundary = cut == header_end || clean.contains(&cut) || packet_ends.contains(&cut);
            assert_eq!(err.is_none(), boundary, "cut {cut}: {err:?}");
        }
    }
}

/// Generates an endless-looking pcap of `n` records without holding it in memory.
struct Generated {
    header: Vec<u8>,
    record: Vec<u8>,
    left: u64,
    pos: usize,
}

impl Read for Generated {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            if !self.header.is_empty() {
                let k = self.header.len().min(buf.len() - n);
                buf[n..n + k].copy_from_slice(&self.header[..k]);
                self.header.drain(..k);
                n += k;
                continue;
            }
            if self.left == 0 {
                break;
            }
            let k = (self.record.len() - self.pos).min(buf.len() - n);
            buf[n..n + k].copy_from_slice(&self.record[self.pos..self.pos + k]);
            self.pos += k;
            n += k;
            if self.pos == self.record.len() {
                self.pos = 0;
                self.left -= 1;
            }
        }
        Ok(n)
    }
}

#[test]
fn streaming_uses_constant_memory() {
    let count = 500_000u64;
    let g = Generated {
        header: pcap_header(1, 65535),
        record: pcap_record(1000, 1000, &[0x42; 1000]),
        left: count,
        pos: 0,
    };
    let mut r = TraceReader::new(g).unwrap();
    let mut n = 0u64;
    while let Some(p) = r.next_packet().unwrap() {
        assert_eq!(p.data.len(), 1000);
        n += 1;
    }
    assert_eq!(n, count);
    assert_eq!(r.buffer_len(), 128 * 1024);
    assert_eq!(r.offset(), 24 + count * 1016);
}

fn valid_pcap() -> Vec<u8> {
    write_pcap(WriterOptions { nanosecond: true, ..Default::default() }, &sample_packets(4))
}

fn valid_pcapng() -> Vec<u8> {
    let mut ng = Ng::new(false);
    ng.shb().idb(1, 0, Some(9)).idb(113, 64, Some(0x80 | 30));
    ng.epb(0, 5, &eth_frame(1, 60), 60).epb(1, 6, &[0; 40], 40).spb(&[0x45; 30], 30);
    ng.block(0x0bad, &[0; 8]);
    ng.bytes()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_and_always_end(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        fuzz_read_all(&data);
        if let Ok(mut r) = TraceReader::new(data.as_slice()) {
            // Each packet consumes at least its header, so the count is bounded by the input length.
            let mut n = 0usize;
            while let Ok(Some(_)) = r.next_packet() {
                n += 1;
                prop_assert!(n <= data.len());
            }
            prop_assert!(r.next_packet().unwrap().is_none());
        }
    }

    #[test]
    fn valid_headers_with_random_tails_never_panic(ng in any::<bool>(), tail in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let mut data = if ng { valid_pcapng()[..48].to_vec() } else { pcap_header(113, 0) };
        data.extend_from_slice(&tail);
        fuzz_read_all(&data);
        let (pkts, _) = read_all(data.as_slice()).unwrap();
        prop_assert!(pkts.len() <= tail.len() / 12 + 1);
    }

    #[test]
    fn every_link_type_with_random_records_never_panics(
        lt in prop::sample::select(LinkType::ALL.to_vec()),
        tail in proptest::collection::vec(any::<u8>(), 0..1024),
    ) {
        let mut data = pcap_header(lt.dlt(), 0);
        data.extend_from_slice(&tail);
        fuzz_read_all(&data);
    }

    #[test]
    fn to_ethernet_of_arbitrary_packets_never_panics(
        lt in prop::sample::select(LinkType::ALL.to_vec()),
        data in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let pkt = PacketRef { ts_ns: 0, orig_len: data.len() as u32, link_type: lt, data: &data };
        let mut scratch = Vec::new();
        match to_ethernet(&pkt, &mut scratch) {
            // The Ethernet form ends with a tail of the packet (the network-layer payload).
            Ok(frame) => {
                if lt == LinkType::Ethernet {
                    prop_assert_eq!(frame, data.as_slice());
                } else {
                    prop_assert!(frame.len() >= 14 && frame.len() <= 14 + data.len());
                    prop_assert!(data.ends_with(&frame[14..]));
                }
            }
            Err(e) => prop_assert!(e.kind().unparsed_reason().is_some(), "{}", e),
        }
    }

    #[test]
    fn mutated_valid_files_never_panic(
        ng in any::<bool>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut data = if ng { valid_pcapng() } else { valid_pcap() };
        for (at, v) in edits {
            let i = at.index(data.len());
            data[i] = v;
        }
        let len = data.len();
        data.truncate(len - cut.index(len / 4 + 1));
        fuzz_read_all(&data);
        if let Ok((_, Some(e))) = read_all(data.as_slice()) {
            let text = e.to_string();
            prop_assert!(!text.is_empty() && !text.contains('\n'));
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// measurement (not a correctness test): cargo test --release -p flowplane-trace --test pcap_io -- --ignored --nocapture

/// CPU time of this thread in ns (from schedstat): the machine is shared, so wall time would count other processes'
/// slices.
fn thread_cpu_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    stat.split_whitespace().next().and_then(|v| v.parse().ok()).expect("schedstat run time")
}

fn rate(what: &str, packets: u64, start_cpu_ns: u64) {
    let s = (thread_cpu_ns() - start_cpu_ns) as f64 / 1e9;
    println!(
        "{what:<40} {:>8.1} Mpps  {:>6.1} ns/packet (thread CPU time)",
        packets as f64 / s / 1e6,
        s * 1e9 / packets as f64
    );
}

#[test]
#[ignore = "measurement; run with --ignored --nocapture"]
fn measure_throughput_64b() {
    const N: u64 = 4_000_000;
    let frame = eth_frame(3, 64);
    // The first pass faults the pages in; the measured second pass writes into warm memory.
    let mut pcap = Vec::with_capacity(24 + N as usize * 80);
    for pass in 0..2 {
        pcap.clear();
        let mut w = PcapWriter::new(pcap, WriterOptions::default()).unwrap();
        let t = thread_cpu_ns();
        for i in 0..N {
            w.write_packet(i * 100, &frame, 64).unwrap();
        }
        pcap = w.finish().unwrap();
        if pass == 1 {
            rate("pcap write, 64 B, to memory", N, t);
        }
    }
    let path = std::env::temp_dir().join(format!("flowplane-measure-{}.pcap", std::process::id()));
    let mut w = PcapWriter::create(&path, WriterOptions::default()).unwrap();
    let t = thread_cpu_ns();
    for i in 0..N {
        w.write_packet(i * 100, &frame, 64).unwrap();
    }
    w.finish().unwrap();
    rate("pcap write, 64 B, to file (page cache)", N, t);

    let mut r = TraceReader::new(pcap.as_slice()).unwrap();
    let t = thread_cpu_ns();
    let mut bytes = 0u64;
    while let Some(p) = r.next_packet().unwrap() {
        bytes += p.data.len() as u64 + (p.ts_ns & 1);
    }
    rate("pcap read, 64 B, from memory", N, t);
    assert!(bytes >= N * 64);

    let mut r = TraceReader::open(&path).unwrap();
    let t = thread_cpu_ns();
    let mut n = 0u64;
    while let Some(p) = r.next_packet().unwrap() {
        n += u64::from(p.data[0] != 0xff);
    }
    rate("pcap read, 64 B, from file (page cache)", n, t);
    std::fs::remove_file(&path).unwrap();

    let mut ng = Ng::new(false);
    ng.shb().idb(1, 0, Some(9));
    let mut ngb = ng.bytes();
    let mut one = Ng::new(false);
    for i in 0..N {
        one.out.clear();
        one.epb(0, i * 100, &frame, 64);
        ngb.extend_from_slice(&one.out);
    }
    let mut r = TraceReader::new(ngb.as_slice()).unwrap();
    let t = thread_cpu_ns();
    let mut n = 0u64;
    while let Some(p) = r.next_packet().unwrap() {
        n += u64::from(p.data.len() == 64);
    }
    rate("pcapng EPB read, 64 B, from memory", n, t);
    assert_eq!(n, N);

    let raw = ipv4_packet();
    let pkt = PacketRef { ts_ns: 0, orig_len: 28, link_type: LinkType::RawIp, data: &raw };
    let mut scratch = Vec::new();
    let t = thread_cpu_ns();
    let mut acc = 0usize;
    for _ in 0..N {
        acc += to_ethernet(std::hint::black_box(&pkt), &mut scratch).unwrap().len();
    }
    rate("to_ethernet raw IPv4 (28 B)", N, t);

    // What `flowplane run` loads with: read and present as Ethernet in one call.
    let raw_pcap = {
        let mut w =
            PcapWriter::new(Vec::new(), WriterOptions { link_type: LinkType::RawIp, ..Default::default() }).unwrap();
        for i in 0..N {
            w.write_packet(i * 100, &raw, 28).unwrap();
        }
        w.finish().unwrap()
    };
    let mut r = TraceReader::new(raw_pcap.as_slice()).unwrap();
    let t = thread_cpu_ns();
    let mut n = 0u64;
    while let Some(p) = r.next_frame(&mut scratch).unwrap() {
        n += u64::from(p.data[12] == 0x08);
    }
    rate("next_frame raw IPv4 (28 B) from memory", n, t);
    assert_eq!(acc, N as usize * 42);
}
