//! Cross-checks the pcap writer (and the pcapng reader) against Wireshark's tshark/editcap.
//!
//! Hand-built UDP/TCP frames over IPv4 and IPv6 with correct checksums are written in all four pcap variants; tshark
//! must read every packet, with the timestamps we wrote and no malformed-packet or warning/error expert items while
//! checksum validation is on. editcap's pcapng output of the same files must read back identically with our reader.
//! Without tshark the tests fail, unless FLOWPLANE_SKIP_TSHARK=1.

use std::path::{Path, PathBuf};
use std::process::Command;

use flowplane_trace::{PcapWriter, TraceFormat, TraceReader, WriterOptions};
use flowplane_wire::checksum::{combine, finish, pseudo_header_v4, pseudo_header_v6, sum};

/// True when tshark can run; panics (fails the test) when it cannot, unless the skip variable is set.
fn have_tools() -> bool {
    let ok = Command::new("tshark").arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
        && Command::new("editcap").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    if ok {
        return true;
    }
    if std::env::var("FLOWPLANE_SKIP_TSHARK").as_deref() == Ok("1") {
        eprintln!("tshark/editcap not found: skipped because FLOWPLANE_SKIP_TSHARK=1");
        return false;
    }
    panic!(
        "tshark/editcap not found on PATH: install Wireshark's command-line tools (apt-get install tshark) \
         or set FLOWPLANE_SKIP_TSHARK=1 to skip this test"
    );
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flowplane-tshark-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const MAC_A: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x0b];
const V4_A: [u8; 4] = [192, 0, 2, 1];
const V4_B: [u8; 4] = [198, 51, 100, 7];
const V6_A: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const V6_B: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;

enum L4<'a> {
    Udp { sport: u16, dport: u16, payload: &'a [u8] },
    Tcp { sport: u16, dport: u16, seq: u32, ack: u32, flags: u8, payload: &'a [u8] },
}

/// The transport segment with its checksum filled in from the pseudo-header sum.
fn l4_segment(l4: &L4<'_>, pseudo: impl Fn(u8, usize) -> u16) -> (u8, Vec<u8>) {
    let (proto, mut seg, csum_at) = match *l4 {
        L4::Udp { sport, dport, payload } => {
            let len = (8 + payload.len()) as u16;
            let mut s = Vec::new();
            s.extend_from_slice(&sport.to_be_bytes());
            s.extend_from_slice(&dport.to_be_bytes());
            s.extend_from_slice(&len.to_be_bytes());
            s.extend_from_slice(&[0, 0]);
            s.extend_from_slice(payload);
            (17u8, s, 6)
        }
        L4::Tcp { sport, dport, seq, ack, flags, payload } => {
            let mut s = Vec::new();
            s.extend_from_slice(&sport.to_be_bytes());
            s.extend_from_slice(&dport.to_be_bytes());
            s.extend_from_slice(&seq.to_be_bytes());
            s.extend_from_slice(&ack.to_be_bytes());
            s.push(5 << 4); // data offset: 20 bytes, no options
            s.push(flags);
            s.extend_from_slice(&64240u16.to_be_bytes());
            s.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
            s.extend_from_slice(payload);
            (6u8, s, 16)
        }
    };
    let mut c = finish(combine(pseudo(proto, seg.len()), sum(&seg)));
    if proto == 17 && c == 0 {
        c = 0xffff; // UDP transmits an all-zero checksum as all ones
    }
    seg[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
    (proto, seg)
}

fn eth(src: [u8; 6], dst: [u8; 6], ethertype: u16, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(body);
    f
}

fn ipv4_frame(src: [u8; 4], dst: [u8; 4], id: u16, l4: &L4<'_>) -> Vec<u8> {
    let (proto, seg) = l4_segment(l4, |p, len| pseudo_header_v4(src, dst, p, len as u16));
    let total = (20 + seg.len()) as u16;
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&id.to_be_bytes());
    ip.extend_from_slice(&[0x40, 0]); // don't fragment
    ip.extend_from_slice(&[64, proto, 0, 0]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let c = finish(sum(&ip));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(&seg);
    eth(MAC_A, MAC_B, 0x0800, &ip)
}

fn ipv6_frame(src: [u8; 16], dst: [u8; 16], l4: &L4<'_>) -> Vec<u8> {
    let (proto, seg) = l4_segment(l4, |p, len| pseudo_header_v6(src, dst, p, len as u32));
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&(seg.len() as u16).to_be_bytes());
    ip.extend_from_slice(&[proto, 64]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    ip.extend_from_slice(&seg);
    eth(MAC_A, MAC_B, 0x86dd, &ip)
}

/// A small, valid conversation: UDP both ways over v4 and v6, and a TCP handshake with data and FIN over v4.
fn frames() -> Vec<Vec<u8>> {
    let dns_like = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01";
    let data = b"hello, flowplane";
    let odd = b"odd-length payload!";
    vec![
        ipv4_frame(V4_A, V4_B, 1, &L4::Udp { sport: 40000, dport: 9999, payload: odd }),
        ipv4_frame(V4_B, V4_A, 2, &L4::Udp { sport: 9999, dport: 40000, payload: &[0u8; 0] }),
        ipv6_frame(V6_A, V6_B, &L4::Udp { sport: 5353, dport: 5353, payload: dns_like }),
        ipv4_frame(
            V4_A,
            V4_B,
            3,
            &L4::Tcp { sport: 50000, dport: 80, seq: 1000, ack: 0, flags: TCP_SYN, payload: &[] },
        ),
        ipv4_frame(
            V4_B,
            V4_A,
            4,
            &L4::Tcp { sport: 80, dport: 50000, seq: 7000, ack: 1001, flags: TCP_SYN | TCP_ACK, payload: &[] },
        ),
        ipv4_frame(
            V4_A,
            V4_B,
            5,
            &L4::Tcp { sport: 50000, dport: 80, seq: 1001, ack: 7001, flags: TCP_ACK, payload: &[] },
        ),
        ipv4_frame(
            V4_A,
            V4_B,
            6,
            &L4::Tcp { sport: 50000, dport: 80, seq: 1001, ack: 7001, flags: TCP_PSH | TCP_ACK, payload: data },
        ),
        ipv4_frame(
            V4_B,
            V4_A,
            7,
            &L4::Tcp {
                sport: 80,
                dport: 50000,
                seq: 7001,
                ack: 1001 + data.len() as u32,
                flags: TCP_ACK,
                payload: &[],
            },
        ),
        ipv4_frame(
            V4_A,
            V4_B,
            8,
            &L4::Tcp {
                sport: 50000,
                dport: 80,
                seq: 1001 + data.len() as u32,
                ack: 7001,
                flags: TCP_FIN | TCP_ACK,
                payload: &[],
            },
        ),
        ipv6_frame(V6_A, V6_B, &L4::Tcp { sport: 50001, dport: 443, seq: 1, ack: 0, flags: TCP_SYN, payload: &[] }),
        ipv6_frame(
            V6_B,
            V6_A,
            &L4::Tcp { sport: 443, dport: 50001, seq: 9, ack: 2, flags: TCP_SYN | TCP_ACK, payload: &[] },
        ),
    ]
}

/// Timestamps with distinct nanosecond digits: microsecond files must drop exactly the last three.
fn timestamps(n: usize) -> Vec<u64> {
    (0..n as u64).map(|i| 1_700_000_000_000_000_000 + i * 1_001_001_001 + 123_456_789).collect()
}

fn write_variant(path: &Path, nanosecond: bool, big_endian: bool, frames: &[Vec<u8>], ts: &[u64]) {
    let opts = WriterOptions { nanosecond, big_endian, ..WriterOptions::default() };
    let mut w = PcapWriter::create(path, opts).unwrap();
    for (f, t) in frames.iter().zip(ts) {
        w.write_packet(*t, f, f.len() as u32).unwrap();
    }
    w.finish().unwrap();
}

/// Runs tshark with checksum validation on and returns one row of fields per frame.
fn tshark_rows(path: &Path, fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(path).args(["-n", "-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE"]);
    cmd.args(["-o", "tcp.check_checksum:TRUE", "-T", "fields", "-E", "separator=/t", "-E", "occurrence=a"]);
    cmd.args(["-E", "aggregator=;"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("run tshark");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tshark failed on {}: {stderr}", path.display());
    // tshark warns about running as root on stderr; anything about the file itself is a failure.
    for line in stderr.lines() {
        assert!(line.contains("Running as user") || line.trim().is_empty(), "tshark complained: {line}");
    }
    String::from_utf8(out.stdout).unwrap().lines().map(|l| l.split('\t').map(str::to_owned).collect()).collect()
}

/// Seconds.nanoseconds as tshark prints `frame.time_epoch`.
fn epoch_text(ts_ns: u64) -> String {
    format!("{}.{:09}", ts_ns / 1_000_000_000, ts_ns % 1_000_000_000)
}

/// Expert severities at or above "warning" (Wireshark's PI_WARN = 0x00600000).
const PI_WARN: u32 = 0x0060_0000;

fn assert_clean(rows: &[Vec<String>], expected_frames: &[Vec<u8>], ts: &[u64], nanosecond: bool, what: &str) {
    assert_eq!(rows.len(), expected_frames.len(), "{what}: tshark saw a different packet count");
    for (i, row) in rows.iter().enumerate() {
        let [number, epoch, len, protocols, severities, malformed, messages] = row.as_slice() else {
            panic!("{what}: unexpected tshark row {row:?}");
        };
        assert_eq!(number, &(i + 1).to_string(), "{what}");
        let want_ts = if nanosecond { ts[i] } else { ts[i] - ts[i] % 1000 };
        assert_eq!(epoch, &epoch_text(want_ts), "{what}: frame {} timestamp", i + 1);
        assert_eq!(len, &expected_frames[i].len().to_string(), "{what}: frame {} length", i + 1);
        assert!(
            protocols.ends_with(":udp") || protocols.contains(":udp:") || protocols.ends_with(":tcp"),
            "{what}: frame {} dissected as {protocols}",
            i + 1
        );
        assert!(malformed.is_empty(), "{what}: frame {} malformed: {messages}", i + 1);
        for s in severities.split(';').filter(|s| !s.is_empty()) {
            let v = u32::from_str_radix(s.trim_start_matches("0x"), if s.starts_with("0x") { 16 } else { 10 })
                .unwrap_or_else(|_| panic!("{what}: unparsable severity {s}"));
            assert!(v < PI_WARN, "{what}: frame {} expert item of severity {s:?}: {messages}", i + 1);
        }
    }
}

const FIELDS: [&str; 7] = [
    "frame.number",
    "frame.time_epoch",
    "frame.len",
    "frame.protocols",
    "_ws.expert.severity",
    "_ws.malformed",
    "_ws.expert.message",
];

#[test]
fn tshark_reads_all_four_pcap_variants_cleanly() {
    if !have_tools() {
        return;
    }
    let dir = temp_dir("variants");
    let frames = frames();
    let ts = timestamps(frames.len());
    for (nanosecond, big_endian) in [(false, false), (false, true), (true, false), (true, true)] {
        let path = dir.join(format!(
            "v-{}-{}.pcap",
            if nanosecond { "ns" } else { "us" },
            if big_endian { "be" } else { "le" }
        ));
        write_variant(&path, nanosecond, big_endian, &frames, &ts);
        let rows = tshark_rows(&path, &FIELDS);
        assert_clean(&rows, &frames, &ts, nanosecond, &path.display().to_string());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tshark_detects_a_bad_checksum() {
    // Guards the clean-run assertions above: with a broken UDP checksum tshark must report an expert item.
    if !have_tools() {
        return;
    }
    let dir = temp_dir("badsum");
    let mut frames = frames();
    let last = frames[0].len() - 1;
    frames[0][last] ^= 0xff;
    let ts = timestamps(frames.len());
    let path = dir.join("bad.pcap");
    write_variant(&path, true, false, &frames, &ts);
    let rows = tshark_rows(&path, &FIELDS);
    assert_eq!(rows.len(), frames.len());
    let sev = &rows[0][4];
    let flagged = sev.split(';').filter(|s| !s.is_empty()).any(|s| {
        u32::from_str_radix(s.trim_start_matches("0x"), if s.starts_with("0x") { 16 } else { 10 }).unwrap_or(0)
            >= PI_WARN
    });
    assert!(flagged, "tshark did not flag the corrupted checksum: {:?}", rows[0]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn editcap_pcapng_reads_back_identically() {
    if !have_tools() {
        return;
    }
    let dir = temp_dir("pcapng");
    let frames = frames();
    let ts = timestamps(frames.len());
    for (nanosecond, big_endian) in [(false, true), (true, false)] {
        let pcap = dir.join(format!("in-{nanosecond}.pcap"));
        let ng = dir.join(format!("out-{nanosecond}.pcapng"));
        write_variant(&pcap, nanosecond, big_endian, &frames, &ts);
        let out = Command::new("editcap").args(["-F", "pcapng"]).arg(&pcap).arg(&ng).output().unwrap();
        assert!(out.status.success(), "editcap: {}", String::from_utf8_lossy(&out.stderr));

        let mut r = TraceReader::open(&ng).unwrap();
        assert_eq!(r.format(), TraceFormat::PcapNg);
        let mut n = 0;
        while let Some(p) = r.next_packet().unwrap() {
            let want_ts = if nanosecond { ts[n] } else { ts[n] - ts[n] % 1000 };
            assert_eq!(p.ts_ns, want_ts, "packet {n}");
            assert_eq!(p.data, frames[n].as_slice(), "packet {n}");
            assert_eq!(p.orig_len as usize, frames[n].len());
            n += 1;
        }
        assert_eq!(n, frames.len());
        // And tshark agrees with our reading of the pcapng file.
        let rows = tshark_rows(&ng, &FIELDS);
        assert_clean(&rows, &frames, &ts, nanosecond, &ng.display().to_string());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
