//! Every supported link type and the hostile captures of issue 7, checked against Wireshark's tshark.
//!
//! Hand-built captures (pcap of each link type, a pcapng mixing several) hold IPv4/IPv6 packets behind every framing
//! the link type allows, plus packets with no IP in them (PPP LCP, SLARP, unknown loopback families). Our reader,
//! through `to_ethernet` and the 5-tuple extractor every NF uses, must see the same packets and the same IP addresses
//! as tshark. The hostile captures (an IP version 3 packet, a record longer than the snapshot length, a truncated
//! last record, an impossible record length) must be read as far as tshark reads them, with the rest counted rather
//! than aborting. Without tshark the tests fail, unless FLOWPLANE_SKIP_TSHARK=1.

use std::path::{Path, PathBuf};
use std::process::Command;

use flowplane_trace::stats::trace_stats;
use flowplane_trace::{to_ethernet, LinkType, TraceReader, Unparsed, UnparsedCounts};
use flowplane_wire::checksum::{combine, finish, pseudo_header_v4, pseudo_header_v6, sum};
use flowplane_wire::flow::extract_five_tuple;

/// True when tshark can run; panics (fails the test) when it cannot, unless the skip variable is set.
fn have_tshark() -> bool {
    if Command::new("tshark").arg("--version").output().map(|o| o.status.success()).unwrap_or(false) {
        return true;
    }
    if std::env::var("FLOWPLANE_SKIP_TSHARK").as_deref() == Ok("1") {
        eprintln!("tshark not found: skipped because FLOWPLANE_SKIP_TSHARK=1");
        return false;
    }
    panic!("tshark not found on PATH: install it (apt-get install tshark) or set FLOWPLANE_SKIP_TSHARK=1 to skip");
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flowplane-linktypes-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ---------------------------------------------------------------------------------------------------------------
// packets

const V4_A: [u8; 4] = [192, 0, 2, 1];
const V4_B: [u8; 4] = [198, 51, 100, 7];
const V6_A: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const V6_B: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

/// A UDP datagram (checksum from the pseudo-header sum).
fn udp(sport: u16, dport: u16, payload: &[u8], pseudo: u16) -> Vec<u8> {
    let mut s = Vec::new();
    s.extend_from_slice(&sport.to_be_bytes());
    s.extend_from_slice(&dport.to_be_bytes());
    s.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    s.extend_from_slice(&[0, 0]);
    s.extend_from_slice(payload);
    let c = match finish(combine(pseudo, sum(&s))) {
        0 => 0xffff,
        c => c,
    };
    s[6..8].copy_from_slice(&c.to_be_bytes());
    s
}

fn ipv4(src: [u8; 4], dst: [u8; 4], sport: u16, payload: &[u8]) -> Vec<u8> {
    let seg = udp(sport, 9999, payload, pseudo_header_v4(src, dst, 17, (8 + payload.len()) as u16));
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&((20 + seg.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 1, 0x40, 0, 64, 17, 0, 0]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let c = finish(sum(&ip));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(&seg);
    ip
}

fn ipv6(src: [u8; 16], dst: [u8; 16], sport: u16, payload: &[u8]) -> Vec<u8> {
    let seg = udp(sport, 9999, payload, pseudo_header_v6(src, dst, 17, (8 + payload.len()) as u32));
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&(seg.len() as u16).to_be_bytes());
    ip.extend_from_slice(&[17, 64]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    ip.extend_from_slice(&seg);
    ip
}

fn v4() -> Vec<u8> {
    ipv4(V4_A, V4_B, 40000, b"flowplane v4")
}

fn v4_back() -> Vec<u8> {
    ipv4(V4_B, V4_A, 40001, b"and back")
}

fn v6() -> Vec<u8> {
    ipv6(V6_A, V6_B, 5353, b"flowplane v6")
}

/// An IPv4 header with version nibble 3 (and otherwise valid).
fn ip_version_3() -> Vec<u8> {
    let mut p = v4();
    p[0] = 0x35;
    p
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

// ---------------------------------------------------------------------------------------------------------------
// capture files, written byte by byte so that hostile records can be made

/// A little-endian microsecond pcap with the given records: `(captured bytes, caplen field)`.
fn pcap_raw(dlt: u32, snaplen: u32, records: &[(Vec<u8>, u32)]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&snaplen.to_le_bytes());
    f.extend_from_slice(&dlt.to_le_bytes());
    for (i, (data, caplen)) in records.iter().enumerate() {
        f.extend_from_slice(&(1_700_000_000 + i as u32).to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(&caplen.to_le_bytes());
        f.extend_from_slice(&(*caplen).max(data.len() as u32).to_le_bytes());
        f.extend_from_slice(data);
    }
    f
}

fn pcap(dlt: u32, packets: &[Vec<u8>]) -> Vec<u8> {
    let recs: Vec<(Vec<u8>, u32)> = packets.iter().map(|p| (p.clone(), p.len() as u32)).collect();
    pcap_raw(dlt, 65535, &recs)
}

/// A little-endian pcapng with one interface per DLT and the packets `(interface, bytes)`.
fn pcapng(dlts: &[u16], packets: &[(u32, Vec<u8>)]) -> Vec<u8> {
    fn block(out: &mut Vec<u8>, block_type: u32, body: &[u8]) {
        let padded = body.len().next_multiple_of(4);
        let total = (12 + padded) as u32;
        out.extend_from_slice(&block_type.to_le_bytes());
        out.extend_from_slice(&total.to_le_bytes());
        out.extend_from_slice(body);
        out.resize(out.len() + padded - body.len(), 0);
        out.extend_from_slice(&total.to_le_bytes());
    }
    let mut out = Vec::new();
    let mut shb = Vec::new();
    shb.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&(-1i64).to_le_bytes());
    block(&mut out, 0x0a0d_0d0a, &shb);
    for &dlt in dlts {
        let mut idb = Vec::new();
        idb.extend_from_slice(&dlt.to_le_bytes());
        idb.extend_from_slice(&[0, 0]);
        idb.extend_from_slice(&0u32.to_le_bytes());
        block(&mut out, 1, &idb);
    }
    for (i, (ifc, data)) in packets.iter().enumerate() {
        let mut epb = Vec::new();
        epb.extend_from_slice(&ifc.to_le_bytes());
        let ts = 1_700_000_000_000_000u64 + i as u64;
        epb.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
        epb.extend_from_slice(&(ts as u32).to_le_bytes());
        epb.extend_from_slice(&(data.len() as u32).to_le_bytes());
        epb.extend_from_slice(&(data.len() as u32).to_le_bytes());
        epb.extend_from_slice(data);
        block(&mut out, 6, &epb);
    }
    out
}

// ---------------------------------------------------------------------------------------------------------------
// what each side sees

/// Per packet: captured length and (source, destination) IP when there is an IP header with addresses.
type Seen = Vec<(usize, Option<(String, String)>)>;

struct Tshark {
    rows: Seen,
    ok: bool,
    stderr: String,
}

/// tshark's packets: the first IPv4 or IPv6 header's addresses. `ok` is false when tshark gave up on the file.
fn tshark(path: &Path) -> Tshark {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(path)
        .args(["-n", "-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"])
        .args(["-e", "frame.cap_len", "-e", "ip.src", "-e", "ip.dst", "-e", "ipv6.src", "-e", "ipv6.dst"])
        .output()
        .expect("run tshark");
    let rows = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let cap = f[0].parse().unwrap();
            let ip = match (f[1], f[2], f[3], f[4]) {
                ("", "", "", "") => None,
                (s, d, "", "") => Some((s.to_owned(), d.to_owned())),
                ("", "", s, d) => Some((s.to_owned(), d.to_owned())),
                _ => panic!("both IPv4 and IPv6 in {l:?}"),
            };
            (cap, ip)
        })
        .collect();
    Tshark { rows, ok: out.status.success(), stderr: String::from_utf8_lossy(&out.stderr).into_owned() }
}

/// What flowplane sees: every packet read, its IPs as the NFs' 5-tuple extractor finds them in the Ethernet form.
struct Ours {
    rows: Seen,
    unparsed: UnparsedCounts,
    stopped: Option<String>,
    over_snaplen: u64,
    link_types: Vec<LinkType>,
}

fn ours(path: &Path) -> Ours {
    let mut r = TraceReader::open(path).expect("open");
    let mut scratch = Vec::new();
    let mut rows = Vec::new();
    let mut link_types = Vec::new();
    let mut unparsed = UnparsedCounts::default();
    while let Some(p) = r.next_packet().expect("no fatal error") {
        link_types.push(p.link_type);
        let ip = match to_ethernet(&p, &mut scratch) {
            Ok(frame) => extract_five_tuple(frame).ok().map(|k| (k.src_ip().to_string(), k.dst_ip().to_string())),
            Err(e) => {
                unparsed.add(e.kind().unparsed_reason().expect("a packet-level reason"));
                None
            }
        };
        rows.push((p.data.len(), ip));
    }
    unparsed.merge(r.unparsed());
    // The convenience path agrees: the same frames, the packets with no Ethernet form counted.
    let mut again = TraceReader::open(path).unwrap();
    let mut frames = 0;
    while again.next_frame(&mut scratch).unwrap().is_some() {
        frames += 1;
    }
    let packet_level: u64 = unparsed.iter().filter(|(w, _)| w.is_packet_level()).map(|(_, n)| n).sum();
    assert_eq!(frames + packet_level as usize, rows.len());
    assert_eq!(*again.unparsed(), unparsed);
    Ours {
        rows,
        unparsed,
        stopped: r.stopped_early().map(ToString::to_string),
        over_snaplen: r.over_snaplen(),
        link_types,
    }
}

fn ip(a: &str, b: &str) -> Option<(String, String)> {
    Some((a.to_owned(), b.to_owned()))
}

/// Writes `bytes`, checks tshark and flowplane see the same packets and IPs, and returns flowplane's view.
fn same_as_tshark(dir: &Path, name: &str, bytes: &[u8]) -> Ours {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let t = tshark(&path);
    assert!(t.ok, "tshark failed on {name}: {}", t.stderr);
    let o = ours(&path);
    assert_eq!(o.rows, t.rows, "{name}: flowplane (left) and tshark (right) differ");
    assert!(o.stopped.is_none(), "{name}: {:?}", o.stopped);
    o
}

// ---------------------------------------------------------------------------------------------------------------
// link types

#[test]
fn every_link_type_reads_the_packets_and_ips_tshark_reads() {
    if !have_tshark() {
        return;
    }
    let dir = temp_dir("all");
    let (v4, v4b, v6) = (v4(), v4_back(), v6());
    let le = |af: u32| af.to_le_bytes();
    let be = |af: u32| af.to_be_bytes();
    let eth = |et: u16, p: &[u8]| cat(&[&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1], &et.to_be_bytes(), p]);
    let sll = |et: u16, p: &[u8]| cat(&[&[0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 9, 0, 0], &et.to_be_bytes(), p]);
    let sll2 =
        |et: u16, p: &[u8]| cat(&[&et.to_be_bytes(), &[0, 0, 0, 0, 0, 2, 0, 1, 0, 6, 2, 0, 0, 0, 0, 9, 0, 0], p]);
    let a4 = ip("192.0.2.1", "198.51.100.7");
    let b4 = ip("198.51.100.7", "192.0.2.1");
    let a6 = ip("2001:db8::1", "2001:db8::2");
    /// Name, link type, packets, the IPs each must show, what is counted.
    type Case = (&'static str, LinkType, Vec<Vec<u8>>, Vec<Option<(String, String)>>, UnparsedCounts);
    let cases: Vec<Case> = vec![
        (
            "ethernet",
            LinkType::Ethernet,
            vec![eth(0x0800, &v4), eth(0x86dd, &v6), eth(0x0806, &[0; 28])],
            vec![a4.clone(), a6.clone(), None],
            UnparsedCounts::default(),
        ),
        (
            "raw",
            LinkType::RawIp,
            vec![v4.clone(), v6.clone(), v4b.clone()],
            vec![a4.clone(), a6.clone(), b4.clone()],
            UnparsedCounts::default(),
        ),
        (
            "ipv4",
            LinkType::RawIpv4,
            // Announced IPv4, version 6 inside: Wireshark reads IPv6, so do we.
            vec![v4.clone(), v6.clone()],
            vec![a4.clone(), a6.clone()],
            UnparsedCounts::default(),
        ),
        (
            "ipv6",
            LinkType::RawIpv6,
            // Announced IPv6, version 4 inside: "bogus IPv6 version" for tshark, a malformed frame for us.
            vec![v6.clone(), v4.clone()],
            vec![a6.clone(), None],
            UnparsedCounts::default(),
        ),
        (
            "sll",
            LinkType::LinuxSll,
            vec![sll(0x0800, &v4), sll(0x86dd, &v6)],
            vec![a4.clone(), a6.clone()],
            UnparsedCounts::default(),
        ),
        (
            "sll2",
            LinkType::LinuxSll2,
            vec![sll2(0x0800, &v4), sll2(0x86dd, &v6)],
            vec![a4.clone(), a6.clone()],
            UnparsedCounts::default(),
        ),
        (
            "null",
            LinkType::Null,
            vec![
                cat(&[&le(2), &v4]),
                cat(&[&be(2), &v4b]),
                cat(&[&le(24), &v6]),
                cat(&[&le(28), &v6]),
                cat(&[&be(30), &v6]),
                cat(&[&le(7), &[0xfe, 0xfe, 3, 0]]), // AF_ISO: no Ethernet form
                cat(&[&le(2), &v6]),
            ],
            vec![a4.clone(), b4.clone(), a6.clone(), a6.clone(), a6.clone(), None, a6.clone()],
            counts(&[(Unparsed::NoEthernetForm, 1)]),
        ),
        (
            "loop",
            LinkType::Loop,
            vec![
                cat(&[&be(2), &v4]),
                cat(&[&be(24), &v6]),
                cat(&[&be(28), &v6]),
                cat(&[&be(30), &v6]),
                cat(&[&le(2), &v4]), // host order is not the OpenBSD loopback's
            ],
            vec![a4.clone(), a6.clone(), a6.clone(), a6.clone(), None],
            counts(&[(Unparsed::NoEthernetForm, 1)]),
        ),
        (
            "ppp",
            LinkType::Ppp,
            vec![
                cat(&[&[0x00, 0x21], &v4]),
                cat(&[&[0x00, 0x57], &v6]),
                cat(&[&[0x21], &v4b]),
                cat(&[&[0x57], &v6]),
                cat(&[&[0xff, 0x03, 0x00, 0x21], &v4]),
                cat(&[&[0xff, 0x03, 0x00, 0x57], &v6]),
                vec![0xc0, 0x21, 0x01, 0x01, 0x00, 0x04], // LCP configure-request
            ],
            vec![a4.clone(), a6.clone(), b4.clone(), a6.clone(), a4.clone(), a6.clone(), None],
            counts(&[(Unparsed::NoEthernetForm, 1)]),
        ),
        (
            "ppp_hdlc",
            LinkType::PppHdlc,
            vec![
                cat(&[&[0xff, 0x03, 0x00, 0x21], &v4]),
                cat(&[&[0xff, 0x03, 0x00, 0x57], &v6]),
                cat(&[&[0x0f, 0x00, 0x08, 0x00], &v4b]), // Cisco framing
                cat(&[&[0x8f, 0x00, 0x86, 0xdd], &v6]),
                cat(&[&[0xff, 0x03, 0x21], &v4]),
                cat(&[&[0x00, 0x21], &v4b]), // address and control compressed away
            ],
            vec![a4.clone(), a6.clone(), b4.clone(), a6.clone(), a4.clone(), b4.clone()],
            UnparsedCounts::default(),
        ),
        (
            "chdlc",
            LinkType::CiscoHdlc,
            vec![
                cat(&[&[0x0f, 0x00, 0x08, 0x00], &v4]),
                cat(&[&[0x8f, 0x00, 0x86, 0xdd], &v6]),
                cat(&[&[0x8f, 0x00, 0x80, 0x35], &[0; 20]]), // SLARP: an EtherType, not IP
                cat(&[&[0x0f, 0x00, 0x08, 0x00], &v6]),
            ],
            vec![a4.clone(), a6.clone(), None, a6.clone()],
            UnparsedCounts::default(),
        ),
    ];
    assert_eq!(cases.len(), LinkType::ALL.len(), "a case per supported link type");
    for (name, lt, packets, ips, unparsed) in cases {
        let o = same_as_tshark(&dir, &format!("{name}.pcap"), &pcap(lt.dlt(), &packets));
        assert_eq!(o.rows.iter().map(|r| r.1.clone()).collect::<Vec<_>>(), ips, "{name}");
        assert_eq!(o.unparsed, unparsed, "{name}");
        assert!(o.link_types.iter().all(|&l| l == lt), "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn counts(list: &[(Unparsed, u64)]) -> UnparsedCounts {
    let mut c = UnparsedCounts::default();
    for &(why, n) in list {
        for _ in 0..n {
            c.add(why);
        }
    }
    c
}

#[test]
fn pcapng_interfaces_of_different_link_types() {
    if !have_tshark() {
        return;
    }
    let dir = temp_dir("ng");
    let (v4, v6) = (v4(), v6());
    let dlts = [0u16, 9, 104, 229, 108, 50];
    let packets = vec![
        (0, cat(&[&2u32.to_le_bytes(), &v4])),
        (1, cat(&[&[0x00, 0x57], &v6])),
        (2, cat(&[&[0x0f, 0x00, 0x08, 0x00], &v4])),
        (3, v6.clone()),
        (4, cat(&[&30u32.to_be_bytes(), &v6])),
        (5, cat(&[&[0xff, 0x03, 0x00, 0x21], &v4])),
        (1, vec![0xc0, 0x21, 0x01, 0x01, 0x00, 0x04]),
    ];
    let o = same_as_tshark(&dir, "mixed.pcapng", &pcapng(&dlts, &packets));
    let want = [
        LinkType::Null,
        LinkType::Ppp,
        LinkType::CiscoHdlc,
        LinkType::RawIpv6,
        LinkType::Loop,
        LinkType::PppHdlc,
        LinkType::Ppp,
    ];
    assert_eq!(o.link_types, want);
    assert_eq!(o.rows.iter().filter(|r| r.1.is_some()).count(), 6);
    assert_eq!(o.unparsed, counts(&[(Unparsed::NoEthernetForm, 1)]));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unsupported_link_types_still_get_a_clear_error() {
    for (dlt, text) in
        [(105u32, "unsupported link type 105 (IEEE 802.11)"), (147, "unsupported link type 147 (user-defined)")]
    {
        let e = TraceReader::new(pcap(dlt, &[v4()]).as_slice()).err().expect("refused");
        assert_eq!(e.to_string(), text);
    }
    // In pcapng, when a packet uses such an interface.
    let ng = pcapng(&[1, 127], &[(1, vec![0; 40])]);
    let mut r = TraceReader::new(ng.as_slice()).unwrap();
    assert_eq!(r.next_packet().unwrap_err().to_string(), "unsupported link type 127 (IEEE 802.11 radiotap)");
}

// ---------------------------------------------------------------------------------------------------------------
// hostile captures

#[test]
fn raw_ip_version_3_is_counted_and_the_rest_read() {
    if !have_tshark() {
        return;
    }
    let dir = temp_dir("v3");
    let file = pcap(101, &[v4(), ip_version_3(), v4_back(), v6()]);
    let o = same_as_tshark(&dir, "v3.pcap", &file);
    assert_eq!(o.rows.len(), 4);
    assert_eq!(o.rows.iter().filter(|r| r.1.is_some()).count(), 3);
    assert_eq!(o.unparsed, counts(&[(Unparsed::UnknownIpVersion, 1)]));
    // `trace stats` shows it.
    let s = trace_stats(&dir.join("v3.pcap"), 3).unwrap();
    assert_eq!((s.packets, s.ip_packets, s.unreadable_packets), (4, 3, 1));
    assert_eq!(s.unparsed.get(Unparsed::UnknownIpVersion), 1);
    assert!(s.to_string().contains("unparsed           1 unknown IP version\n"), "{s}");
    assert_eq!(serde_json::to_value(&s).unwrap()["unparsed"]["unknown_ip_version"], 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn record_longer_than_the_snapshot_length_is_read_in_full() {
    if !have_tshark() {
        return;
    }
    let dir = temp_dir("snap");
    let big = ipv4(V4_A, V4_B, 40002, &[0x55; 80]);
    let file = pcap_raw(101, 64, &[(v4(), v4().len() as u32), (big.clone(), big.len() as u32), (v4_back(), 36)]);
    let o = same_as_tshark(&dir, "snap.pcap", &file);
    assert_eq!(o.rows.iter().map(|r| r.0).collect::<Vec<_>>(), [v4().len(), big.len(), 36]);
    assert_eq!((o.over_snaplen, o.unparsed.total()), (1, 0));
    let s = trace_stats(&dir.join("snap.pcap"), 3).unwrap();
    assert_eq!((s.packets, s.over_snaplen_records), (3, 1));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn truncated_last_record_keeps_the_complete_ones() {
    if !have_tshark() {
        return;
    }
    let dir = temp_dir("trunc");
    let full = pcap(101, &[v4(), v6(), v4_back()]);
    // The last record is 16 + 36 bytes: cut inside its data, then inside its header.
    for cut in [5, 30, 45] {
        let bytes = &full[..full.len() - cut];
        let path = dir.join(format!("cut{cut}.pcap"));
        std::fs::write(&path, bytes).unwrap();
        let t = tshark(&path);
        assert!(!t.ok && t.stderr.contains("cut short in the middle of a packet"), "{}", t.stderr);
        let o = ours(&path);
        assert_eq!(o.rows, t.rows, "cut {cut}");
        assert_eq!(o.rows.len(), 2);
        assert_eq!(o.unparsed, counts(&[(Unparsed::TruncatedRecord, 1)]));
        let want = format!("{}: truncated packet record at byte {}", path.display(), full.len() - 16 - v4_back().len());
        assert_eq!(o.stopped.as_deref(), Some(want.as_str()));
        let s = trace_stats(&path, 3).unwrap();
        assert_eq!(s.stopped_early.as_deref(), Some(want.as_str()));
        assert!(s.to_string().contains("unparsed           1 truncated record\n"), "{s}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn impossible_record_length_ends_the_reading_where_tshark_ends_it() {
    if !have_tshark() {
        return;
    }
    let dir = temp_dir("huge");
    let file = pcap_raw(101, 0, &[(v4(), v4().len() as u32), (v6(), 300_000), (v4_back(), 36)]);
    let path = dir.join("huge.pcap");
    std::fs::write(&path, &file).unwrap();
    let t = tshark(&path);
    assert!(!t.ok && t.stderr.contains("bigger than maximum"), "{}", t.stderr);
    let o = ours(&path);
    assert_eq!(o.rows, t.rows);
    assert_eq!(o.rows.len(), 1);
    assert_eq!(o.unparsed, counts(&[(Unparsed::UnreadableRest, 1)]));
    assert_eq!(
        o.stopped.unwrap(),
        format!(
            "{}: corrupt record at byte {}: captured length 300000 exceeds 262144",
            path.display(),
            24 + 16 + v4().len()
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn files_that_are_not_captures_still_fail_at_open() {
    for (bytes, text) in [
        (&b""[..], "empty file (not a pcap or pcapng file)"),
        (b"GET / HTTP/1.1\r\n\r\n", "not a pcap or pcapng file (magic 0x47455420)"),
        (b"\xd4\xc3\xb2\xa1\x02", "truncated file header at byte 0"),
    ] {
        let e = TraceReader::new(bytes).err().expect("refused");
        assert_eq!(e.to_string(), text);
    }
}
