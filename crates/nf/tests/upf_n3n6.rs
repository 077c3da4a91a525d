//! Issue 32 item 5: the UPF on N3 and N6 as an IP node. Frames built with
//! scapy (`pfcp/n3n6_frames.py`: a G-PDU to an unknown TEID, a GTP-U echo,
//! ARP requests, downlink packets with TTL 1 or too big for the N3 MTU,
//! uplink packets) run through one `upf` with `mac=`, next-hop MACs,
//! `ttl=decrement`, `mtu=1500`; tshark dissects what it sends: the Error
//! Indication (TEID Data I, peer address), the echo response, ARP replies,
//! ICMP Time Exceeded and Fragmentation Needed (next-hop MTU), decremented
//! TTLs with valid checksums, rewritten MACs, the outer DF cleared.

use std::net::Ipv4Addr;
use std::sync::Arc;

use flowplane_nf::upf::rules::{FarAction, FarSpec, Iface, PdrSpec, QerSpec, RuleSet, SessionSpec};
use flowplane_nf::upf::{Upf, UpfConfig};
use flowplane_nf::{Nf, NfContext};
use flowplane_packet::{Batch, PacketPool, PoolConfig};

mod common;

const UPF_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const GNB_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x0a];
const DN_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x0d];

fn session() -> SessionSpec {
    let pdr = |id, source, teid, far, qers: Vec<u32>| PdrSpec {
        id,
        precedence: 10,
        source,
        teid,
        ue_ip: true,
        qfi: None,
        sdf: Vec::new(),
        outer_header_removal: source == Iface::Access,
        far,
        qers,
        urrs: Vec::new(),
    };
    SessionSpec {
        seid: 1,
        ue_ipv4: Some(Ipv4Addr::new(10, 45, 0, 1)),
        ue_ipv6: None,
        pdrs: vec![pdr(1, Iface::Access, Some(100), 1, vec![]), pdr(2, Iface::Core, None, 2, vec![1])],
        fars: vec![
            FarSpec {
                id: 1,
                action: FarAction::Forward,
                destination: None,
                ohc_teid: None,
                ohc_addr: None,
                tos: None,
                notify_cp: false,
            },
            FarSpec {
                id: 2,
                action: FarAction::Forward,
                destination: None,
                ohc_teid: Some(0x99),
                ohc_addr: Some(Ipv4Addr::new(198, 51, 100, 10)),
                tos: None,
                notify_cp: false,
            },
        ],
        qers: vec![QerSpec { id: 1, qfi: Some(5), ..Default::default() }],
        urrs: Vec::new(),
        bar: None,
    }
}

fn python() -> String {
    for py in std::env::var("FLOWPLANE_PYTHON").into_iter().chain(["python3".into(), "/usr/bin/python3".into()]) {
        let ok = std::process::Command::new(&py).args(["-c", "import scapy.contrib.gtp"]).output();
        if ok.is_ok_and(|o| o.status.success()) {
            return py;
        }
    }
    panic!("no Python with scapy: install python3-scapy (apt-get) or set FLOWPLANE_PYTHON");
}

fn read_pcap(path: &std::path::Path) -> Vec<Vec<u8>> {
    let b = std::fs::read(path).expect("the frames' pcap");
    let (mut at, mut out) = (24, Vec::new());
    while at + 16 <= b.len() {
        let n = u32::from_le_bytes(b[at + 8..at + 12].try_into().unwrap()) as usize;
        out.push(b[at + 16..at + 16 + n].to_vec());
        at += 16 + n;
    }
    out
}

#[test]
fn n3_and_n6_answer_route_and_signal_as_tshark_reads_them() {
    let dir = std::env::temp_dir().join(format!("flowplane-n3n6-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.pcap");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pfcp/n3n6_frames.py");
    let out = std::process::Command::new(python()).arg(&script).arg(&input).arg("100").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let frames = read_pcap(&input);
    assert_eq!(frames.len(), 12);

    let cfg = UpfConfig {
        n3_addr: Ipv4Addr::new(192, 0, 2, 1),
        n6_addr: Ipv4Addr::new(192, 0, 2, 6),
        n3_port: Some(1),
        n6_port: Some(2),
        ttl_decrement: true,
        mtu: 1500,
        mac: Some(UPF_MAC),
        gw_mac: [Some(GNB_MAC), Some(DN_MAC)],
        ..UpfConfig::default()
    };
    let mut upf = Upf::new(cfg, Arc::new(RuleSet::compile(&[session()]).unwrap()));
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    let mut b = Batch::new(&pool);
    for (k, f) in frames.iter().enumerate() {
        assert!(b.push_copy(&mut pool, f, k as u64 * 1_000));
    }
    upf.process(&mut b, 0..frames.len(), &NfContext::default());
    let fate: Vec<Option<u16>> = (0..frames.len()).map(|i| (!b.is_dropped(i)).then(|| b.verdicts()[i])).collect();
    let sent: Vec<Vec<u8>> = (0..frames.len()).filter(|&i| !b.is_dropped(i)).map(|i| b.data(i).to_vec()).collect();
    b.free_all(&mut pool).unwrap();
    let (n3, n6) = (Some(1), Some(2));
    assert_eq!(fate, vec![n3, n3, n3, n6, None, n6, n6, n3, n3, None, n6, None], "each frame's fate (verdict: port)");
    let c = upf.upf_counters();
    assert_eq!(
        (c.error_indications, c.echo_responses, c.arp_replies, c.ttl_expired, c.icmp_errors, c.too_big),
        (1, 1, 2, 3, 2, 1)
    );

    let output = common::TempFile(dir.join("out.pcap"));
    common::write_pcap(&output.0, &sent);
    let fields = [
        "eth.src",
        "eth.dst",
        "arp.opcode",
        "arp.src.hw_mac",
        "arp.src.proto_ipv4",
        "arp.dst.proto_ipv4",
        "gtp.message",
        "gtp.teid",
        "gtp.teid_data",
        "gtp.seq_number",
        "icmp.type",
        "icmp.code",
        "icmp.mtu",
        "icmp.checksum.status",
        "ip.src",
        "ip.dst",
        "ip.ttl",
        "ip.flags.df",
        "ip.len",
        "ip.checksum.status",
        "udp.dstport",
        "_ws.malformed",
    ];
    let mut args = vec!["-n", "-o", "ip.check_checksum:TRUE", "-r", output.0.to_str().unwrap(), "-T", "fields"];
    args.extend(["-E", "separator=|"]);
    for f in &fields {
        args.extend(["-e", f]);
    }
    let Some(table) = common::tshark(&args) else { return };
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(rows.len(), sent.len(), "{table}");
    let get = |r: usize, f: &str| rows[r][fields.iter().position(|x| *x == f).unwrap()];
    let (upf_mac, gnb_mac, dn_mac) = ("02:00:00:00:00:01", "02:00:00:00:00:0a", "02:00:00:00:00:0d");
    for r in 0..rows.len() {
        assert_eq!(get(r, "_ws.malformed"), "", "row {r}: {table}");
        assert!(get(r, "ip.checksum.status").split(',').all(|s| s.is_empty() || s == "1"), "row {r}: {table}");
    }
    // 0: the Error Indication (type 26) to the gNB: TEID 0, TEID Data I the unknown TEID.
    assert_eq!(
        (get(0, "gtp.message"), get(0, "gtp.teid"), get(0, "gtp.teid_data")),
        ("0x1a", "0x00000000", "0x0000dead"),
        "{table}"
    );
    assert_eq!((get(0, "ip.src"), get(0, "ip.dst"), get(0, "udp.dstport")), ("192.0.2.1", "198.51.100.10", "2152"));
    assert_eq!((get(0, "eth.src"), get(0, "eth.dst")), (upf_mac, gnb_mac));
    // 1: the echo response keeps the sequence number.
    assert_eq!((get(1, "gtp.message"), get(1, "gtp.seq_number")), ("0x02", "0x1234"), "{table}");
    // 2, 3: ARP replies from the UPF's MAC for N3 and N6.
    for (r, ip, to) in [(2, "192.0.2.1", gnb_mac), (3, "192.0.2.6", dn_mac)] {
        assert_eq!(
            (get(r, "arp.opcode"), get(r, "arp.src.hw_mac"), get(r, "arp.src.proto_ipv4"), get(r, "eth.dst")),
            ("2", upf_mac, ip, to),
            "{table}"
        );
    }
    // 4: TTL 1 downlink: Time Exceeded from the N6 address back to the sender.
    // (tshark dissects the quoted packet too: the ICMP header's IP first, then the quote's.)
    assert_eq!(
        (get(4, "icmp.type"), get(4, "icmp.code"), get(4, "ip.src"), get(4, "ip.dst"), get(4, "eth.dst")),
        ("11", "0", "192.0.2.6,203.0.113.5", "203.0.113.5,10.45.0.1", dn_mac),
        "{table}"
    );
    assert_eq!(get(4, "ip.ttl"), "64,1", "the quote is the packet as received");
    // 5: too big with DF: Fragmentation Needed, next-hop MTU 1,500 - 44.
    assert_eq!((get(5, "icmp.type"), get(5, "icmp.code"), get(5, "icmp.mtu")), ("3", "4", "1456"), "{table}");
    for r in [4, 5] {
        assert_eq!(get(r, "icmp.checksum.status"), "1", "row {r}: {table}");
    }
    // 6: too big without DF: encapsulated with the outer DF clear (1,516 bytes), TTL 63 inside.
    assert_eq!(
        (get(6, "ip.len"), get(6, "ip.flags.df"), get(6, "ip.ttl"), get(6, "eth.src"), get(6, "eth.dst")),
        ("1516,1472", "0,0", "64,63", upf_mac, gnb_mac),
        "{table}"
    );
    // 7: downlink, TTL 64 -> 63 inside the tunnel.
    assert_eq!((get(7, "ip.ttl"), get(7, "ip.flags.df")), ("64,63", "1,0"), "{table}");
    // 8: uplink decapsulated, TTL 63, to the DN's next hop.
    assert_eq!(
        (get(8, "ip.src"), get(8, "ip.ttl"), get(8, "eth.src"), get(8, "eth.dst")),
        ("10.45.0.1", "63", upf_mac, dn_mac),
        "{table}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 32 item 5, IPv6: scapy's frames (`n3n6_frames.py ... v6`) through
/// a `upf` with IPv6 addresses on N3 and N6: Neighbor Solicitations for
/// them get Neighbor Advertisements (solicited to the asker, DAD to all
/// nodes; the UPF's MAC as target link-layer address), others are dropped;
/// a downlink IPv6 packet too big for the N3 MTU gets ICMPv6 Packet Too Big
/// (MTU 1,456) and one with hop limit 1 Time Exceeded, both from the N6
/// address; tshark checks the ICMPv6 checksums and fields.
#[test]
fn ipv6_neighbors_and_icmpv6_errors_as_tshark_reads_them() {
    let dir = std::env::temp_dir().join(format!("flowplane-n3n6-v6-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.pcap");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pfcp/n3n6_frames.py");
    let out = std::process::Command::new(python()).arg(&script).arg(&input).args(["100", "v6"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let frames = read_pcap(&input);
    assert_eq!(frames.len(), 6);
    let a6 = |s: &str| s.parse::<std::net::Ipv6Addr>().unwrap();
    let cfg = UpfConfig {
        n3_port: Some(1),
        n6_port: Some(2),
        ttl_decrement: true,
        mtu: 1500,
        mac: Some(UPF_MAC),
        gw_mac: [Some(GNB_MAC), Some(DN_MAC)],
        addr6: [Some(a6("2001:db8:3::1").octets()), Some(a6("2001:db8:6::1").octets())],
        ..UpfConfig::default()
    };
    let mut s = session();
    s.ue_ipv6 = Some(a6("2001:db8:1::1"));
    let mut upf = Upf::new(cfg, Arc::new(RuleSet::compile(&[s]).unwrap()));
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    let mut b = Batch::new(&pool);
    for (k, f) in frames.iter().enumerate() {
        assert!(b.push_copy(&mut pool, f, k as u64 * 1_000));
    }
    upf.process(&mut b, 0..frames.len(), &NfContext::default());
    let fate: Vec<Option<u16>> = (0..frames.len()).map(|i| (!b.is_dropped(i)).then(|| b.verdicts()[i])).collect();
    let sent: Vec<Vec<u8>> = (0..frames.len()).filter(|&i| !b.is_dropped(i)).map(|i| b.data(i).to_vec()).collect();
    b.free_all(&mut pool).unwrap();
    let (n3, n6) = (Some(1), Some(2));
    assert_eq!(fate, vec![n3, n6, None, n6, n6, n3], "each frame's fate (verdict: port)");
    let c = upf.upf_counters();
    assert_eq!((c.nd_adverts, c.too_big, c.ttl_expired, c.icmp_errors, c.dl_forwarded), (2, 1, 1, 2, 1));

    let output = common::TempFile(dir.join("out.pcap"));
    common::write_pcap(&output.0, &sent);
    let fields = [
        "eth.src",
        "eth.dst",
        "ipv6.src",
        "ipv6.dst",
        "ipv6.hlim",
        "icmpv6.type",
        "icmpv6.code",
        "icmpv6.checksum.status",
        "icmpv6.mtu",
        "icmpv6.nd.na.flag.r",
        "icmpv6.nd.na.flag.s",
        "icmpv6.nd.na.flag.o",
        "icmpv6.nd.na.target_address",
        "icmpv6.opt.linkaddr",
        "_ws.malformed",
    ];
    let mut args = vec!["-n", "-r", output.0.to_str().unwrap(), "-T", "fields"];
    args.extend(["-E", "separator=|"]);
    for f in &fields {
        args.extend(["-e", f]);
    }
    let Some(table) = common::tshark(&args) else { return };
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(rows.len(), sent.len(), "{table}");
    let get = |r: usize, f: &str| rows[r][fields.iter().position(|x| *x == f).unwrap()];
    let (upf_mac, gnb_mac) = ("02:00:00:00:00:01", "02:00:00:00:00:0a");
    for r in 0..rows.len() {
        assert_eq!(get(r, "_ws.malformed"), "", "row {r}: {table}");
    }
    let na = |r: usize| {
        [
            get(r, "icmpv6.type"),
            get(r, "icmpv6.checksum.status"),
            get(r, "icmpv6.nd.na.flag.r"),
            get(r, "icmpv6.nd.na.flag.s"),
            get(r, "icmpv6.nd.na.flag.o"),
            get(r, "icmpv6.nd.na.target_address"),
            get(r, "icmpv6.opt.linkaddr"),
            get(r, "ipv6.src"),
            get(r, "ipv6.dst"),
            get(r, "ipv6.hlim"),
            get(r, "eth.src"),
            get(r, "eth.dst"),
        ]
    };
    assert_eq!(
        na(0),
        [
            "136",
            "1",
            "1",
            "1",
            "1",
            "2001:db8:3::1",
            upf_mac,
            "2001:db8:3::1",
            "2001:db8:3::a",
            "255",
            upf_mac,
            gnb_mac
        ],
        "{table}"
    );
    assert_eq!(
        na(1),
        [
            "136",
            "1",
            "1",
            "0",
            "1",
            "2001:db8:6::1",
            upf_mac,
            "2001:db8:6::1",
            "ff02::1",
            "255",
            upf_mac,
            "33:33:00:00:00:01"
        ],
        "{table}"
    );
    // 2: Packet Too Big with the MTU left inside the tunnel, from N6, to the sender.
    assert_eq!(
        (get(2, "icmpv6.type"), get(2, "icmpv6.code"), get(2, "icmpv6.mtu"), get(2, "icmpv6.checksum.status")),
        ("2", "0", "1456", "1"),
        "{table}"
    );
    assert!(get(2, "ipv6.src").starts_with("2001:db8:6::1,") && get(2, "ipv6.dst").starts_with("2001:db8:9::5,"));
    // 3: Time Exceeded (hop limit); 4: forwarded with hop limit 63 inside the tunnel.
    assert_eq!((get(3, "icmpv6.type"), get(3, "icmpv6.checksum.status")), ("3", "1"), "{table}");
    assert_eq!(get(4, "ipv6.hlim"), "63", "{table}");
    let _ = std::fs::remove_dir_all(&dir);
}
