//! Hostile captures never abort a run: a packet with no Ethernet form or a record cut short is counted (the report's
//! `unparsed` line and the JSON `load.unparsed` object) and the rest is replayed with exit code 0. Files that are
//! not captures at all still exit 2 (cli_errors.rs).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use flowplane_trace::{LinkType, PcapWriter, WriterOptions};

fn tmpdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flowplane-qa-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowplane")).args(args).output().expect("spawn flowplane")
}

fn run_ok(args: &[&str]) -> String {
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?} failed: {err}");
    assert!(!err.contains("panicked"), "{err}");
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// A 28-byte IPv4/UDP packet (header checksum left 0: only the version matters here).
fn ipv4(last: u8) -> Vec<u8> {
    let mut p = vec![0x45, 0, 0, 28, 0, 1, 0x40, 0, 64, 17, 0, 0, 192, 0, 2, last, 198, 51, 100, 7];
    p.extend_from_slice(&[0x9c, 0x40, 0x27, 0x0f, 0, 8, 0, 0]);
    p
}

/// Raw-IP pcap: three IPv4 packets with one IP version 3 packet between them.
fn raw_ip_with_version_3(path: &Path) {
    let mut w = PcapWriter::create(path, WriterOptions { link_type: LinkType::RawIp, ..WriterOptions::default() })
        .expect("create pcap");
    let mut bad = ipv4(9);
    bad[0] = 0x35;
    for (i, p) in [ipv4(1), bad, ipv4(2), ipv4(3)].iter().enumerate() {
        w.write_packet(i as u64 * 1000, p, p.len() as u32).expect("write packet");
    }
    w.finish().expect("finish pcap");
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

#[test]
fn unknown_ip_version_is_counted_and_the_rest_replayed() {
    let dir = tmpdir("v3");
    let path = dir.join("v3.pcap");
    raw_ip_with_version_3(&path);
    let base = ["run", "--cores", "1", "--chain", "lb -> fsc", "--input", s(&path)];
    let text = run_ok(&base);
    assert!(text.contains("loaded       3 packets"), "{text}");
    assert!(text.contains("unparsed     1 unknown IP version (not replayed)"), "{text}");
    let json = run_ok(&[&base[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(v["load"]["packets"], 3);
    assert_eq!(v["load"]["unparsed"]["unknown_ip_version"], 1);
    assert_eq!(v["load"]["unparsed"]["truncated_record"], 0);
    let stats = run_ok(&["trace", "stats", s(&path)]);
    assert!(stats.contains("unparsed           1 unknown IP version"), "{stats}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn record_cut_short_is_counted_and_the_complete_ones_replayed() {
    let dir = tmpdir("cut");
    let full = dir.join("full.pcap");
    raw_ip_with_version_3(&full);
    let bytes = std::fs::read(&full).expect("read pcap");
    let cut = dir.join("cut.pcap");
    // Inside the fourth record: three records of 16 + 28 bytes are complete.
    std::fs::write(&cut, &bytes[..24 + 3 * 44 + 20]).expect("write cut pcap");
    let text = run_ok(&["run", "--cores", "1", "--chain", "lb -> fsc", "--input", s(&cut)]);
    assert!(text.contains("loaded       2 packets"), "{text}");
    assert!(text.contains("unparsed     1 unknown IP version, 1 truncated record (not replayed)"), "{text}");
    let stats = run_ok(&["trace", "stats", s(&cut)]);
    assert!(stats.contains("stopped early      ") && stats.contains("truncated packet record at byte 156"), "{stats}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}
