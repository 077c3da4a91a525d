//! DPDK ports (the `dpdk` feature; Debian's libdpdk-dev): virtual devices
//! without huge pages or PCI. `net_null` forwarding counts every packet;
//! `net_pcap` replays a known pcap through `nat` into a pcap tshark checks;
//! `net_af_packet` runs `forward` and `nat` between two veths as the other
//! backends do (root). Build and run: `cargo test -p flowplane --features dpdk --test ports_dpdk`.
#![cfg(feature = "dpdk")]

mod ports_common;

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_flowplane");

fn run(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().expect("spawn flowplane");
    assert!(out.status.success(), "flowplane {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn net_null_forward_counts_every_packet() {
    let r = run(&[
        "run",
        "--input",
        "dpdk:net_null0",
        "--output",
        "dpdk:net_null1",
        "--chain",
        "forward",
        "--cores",
        "1",
        "--no-pin",
        "--duration",
        "1",
        "--json",
    ]);
    let n = ports_common::json_u(&r, "packets");
    assert!(n > 100_000, "net_null delivers packets: {r}");
    assert_eq!(ports_common::json_u(&r, "packets_out"), n, "{r}");
    assert_eq!(ports_common::json_u(&r, "tx_full"), 0, "{r}");
}

#[test]
fn net_pcap_nat_in_place_rewrites_with_valid_checksums() {
    let dir = std::env::temp_dir().join(format!("fp-dpdk-pcap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (inp, out) = (dir.join("in.pcap"), dir.join("out.pcap"));
    run(&["gen", "--flows", "16", "--packets", "500", "--proto", "udp", "--seed", "9", "-o", inp.to_str().unwrap()]);
    let r = run(&[
        "run",
        "--input",
        &format!("dpdk:net_pcap0,rx_pcap={}", inp.display()),
        "--output",
        &format!("dpdk:net_pcap1,tx_pcap={}", out.display()),
        "--chain",
        "nat(external=198.51.100.9)",
        "--cores",
        "1",
        "--no-pin",
        "--duration",
        "1",
        "--json",
    ]);
    assert_eq!(ports_common::json_u(&r, "packets_out"), 500, "{r}");
    let fields = ["ip.src", "ip.dst", "udp.dstport", "data.data", "ip.checksum.status", "udp.checksum.status"];
    let sent = ports_common::tshark_rows(&inp, &fields);
    let got = ports_common::tshark_rows(&out, &fields);
    assert_eq!(got.len(), 500);
    for (i, (s, g)) in sent.iter().zip(&got).enumerate() {
        assert_eq!((&s[1], &s[2], &s[3]), (&g[1], &g[2], &g[3]), "packet {i}: order, destination, payload");
        assert_eq!(g[0], "198.51.100.9", "packet {i}: translated in place");
        assert_eq!((g[4].as_str(), g[5].as_str()), ("1", "1"), "packet {i}: checksums {g:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn net_af_packet_forward_between_veths() {
    ports_common::check_forward("dpdk_af_packet", 19_551);
}

#[test]
fn net_af_packet_nat_between_veths() {
    ports_common::check_nat("dpdk_af_packet", 19_552);
}
