//! The `upf` NF checked by an independent decoder (tshark's GTP dissector):
//! downlink packets it encapsulates carry the FAR's peer TEID and address,
//! the QER's QFI in a PDU Session Container, the original packet inside, and
//! valid IPv4 and UDP checksums; uplink packets it decapsulates are the
//! inner packets; and each session's URR counts equal the inner IP bytes
//! tshark sums per TEID (uplink input, downlink output).
//!
//! Needs `tshark` on the PATH; set `FLOWPLANE_SKIP_TSHARK=1` to skip when it
//! is not installed.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;

use flowplane_nf::testutil::{gtpu4, ipv4_frame};
use flowplane_nf::upf::rules::{FarAction, FarSpec, Iface, PdrSpec, QerSpec, RuleSet, SessionSpec, UrrSpec};
use flowplane_nf::upf::{Upf, UpfConfig};
use flowplane_nf::{Nf, NfContext};
use flowplane_packet::{Batch, PacketPool, PoolConfig};

mod common;
use common::{tshark, write_pcap, TempFile};

const SESSIONS: u32 = 24;
const GNB: [u8; 4] = [198, 51, 100, 10];
const N3: [u8; 4] = [192, 0, 2, 1];

fn ue(k: u32) -> [u8; 4] {
    [10, 45, (k >> 8) as u8, k as u8 + 1]
}

fn session(k: u32) -> SessionSpec {
    let pdr = |id, precedence, source, sdf: Option<&str>, far| PdrSpec {
        id,
        precedence,
        source,
        teid: (source == Iface::Access).then_some(1000 + k),
        ue_ip: true,
        qfi: None,
        sdf: sdf.map(|s| vec![s.to_string()]).unwrap_or_default(),
        outer_header_removal: source == Iface::Access,
        far,
        qers: vec![1],
        urrs: vec![1],
    };
    SessionSpec {
        seid: 1 + u64::from(k),
        ue_ipv4: Some(ue(k).into()),
        ue_ipv6: None,
        pdrs: vec![
            pdr(1, 10, Iface::Access, Some("permit out 17 from any to assigned 1000-1999"), 1),
            pdr(2, 200, Iface::Access, None, 1),
            pdr(3, 10, Iface::Core, None, 2),
        ],
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
                ohc_teid: Some(0x8000_0000 | k),
                ohc_addr: Some(Ipv4Addr::from(GNB)),
                tos: None,
                notify_cp: false,
            },
        ],
        qers: vec![QerSpec { id: 1, qfi: Some((k % 63 + 1) as u8), ..Default::default() }],
        urrs: vec![UrrSpec { id: 1, volume_threshold: None, ..Default::default() }],
        bar: None,
    }
}

fn udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload: usize) -> Vec<u8> {
    let mut u = vec![0u8; 8 + payload];
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u[4..6].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
    for (i, b) in u[8..].iter_mut().enumerate() {
        *b = (i * 7 + payload) as u8;
    }
    ipv4_frame(src, dst, 17, &u)
}

/// One tshark line per packet, the fields' values split (a field present
/// in the outer and inner header gives two values).
fn fields(path: &Path, names: &[&str]) -> Option<Vec<Vec<Vec<String>>>> {
    let file = path.to_str().expect("utf-8 temp path");
    let mut args = vec![
        "-r",
        file,
        "-o",
        "ip.check_checksum:TRUE",
        "-o",
        "udp.check_checksum:TRUE",
        "-T",
        "fields",
        "-E",
        "occurrence=a",
    ];
    for n in names {
        args.extend_from_slice(&["-e", n]);
    }
    let out = tshark(&args)?;
    Some(
        out.lines()
            .map(|l| {
                l.split('\t').map(|f| f.split(',').filter(|s| !s.is_empty()).map(String::from).collect()).collect()
            })
            .collect(),
    )
}

fn temp(name: &str) -> TempFile {
    TempFile(std::env::temp_dir().join(format!("flowplane-upf-{}-{name}.pcap", std::process::id())))
}

/// Runs frames through the UPF in batches of 64; returns the survivors.
fn run(u: &mut Upf, frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut pool = PacketPool::new(PoolConfig { buffers: 256, ..Default::default() }).unwrap();
    let mut out = Vec::new();
    for chunk in frames.chunks(64) {
        let mut b = Batch::new(&pool);
        for f in chunk {
            assert!(b.push_copy(&mut pool, f, 0));
        }
        let n = b.len();
        u.process(&mut b, 0..n, &NfContext::default());
        out.extend((0..n).filter(|&i| !b.is_dropped(i)).map(|i| b.data(i).to_vec()));
        b.free_all(&mut pool).unwrap();
    }
    out
}

#[test]
fn upf_output_decoded_by_tshark() {
    let specs: Vec<SessionSpec> = (0..SESSIONS).map(session).collect();
    let mut upf =
        Upf::new(UpfConfig { udp_checksum: true, ..Default::default() }, Arc::new(RuleSet::compile(&specs).unwrap()));
    let remote = [203, 0, 113, 9];
    let mut uplink = Vec::new();
    let mut downlink = Vec::new();
    for i in 0..400u32 {
        let k = (i * 7) % SESSIONS;
        let size = (i as usize * 37) % 900;
        let inner = udp(ue(k), remote, 40000 + i as u16, 900 + (i % 300) as u16, size);
        uplink.push(gtpu4(GNB, N3, 1000 + k, Some((i % 10) as u8), &inner[14..]));
        downlink.push(udp(remote, ue(k), 53, 40000 + i as u16, (size * 3) % 1400));
    }
    let decapped = run(&mut upf, &uplink);
    let encapped = run(&mut upf, &downlink);
    assert_eq!((decapped.len(), encapped.len()), (uplink.len(), downlink.len()), "{:?}", upf.upf_counters());
    let (ul_in, dl_out, ul_out) = (temp("ul-in"), temp("dl-out"), temp("ul-out"));
    write_pcap(&ul_in.0, &uplink);
    write_pcap(&dl_out.0, &encapped);
    write_pcap(&ul_out.0, &decapped);

    // Downlink: outer IPv4 to the gNB, the session's peer TEID and QFI, the original packet inside.
    let names = [
        "ip.dst",
        "gtp.teid",
        "gtp.ext_hdr.pdu_ses_con.qos_flow_id",
        "ip.checksum.status",
        "udp.checksum.status",
        "ip.len",
        "udp.srcport",
    ];
    let Some(dl) = fields(&dl_out.0, &names) else { return };
    assert_eq!(dl.len(), downlink.len());
    let mut dl_bytes: HashMap<u32, u64> = HashMap::new();
    for (i, p) in dl.iter().enumerate() {
        let k = (i as u32 * 7) % SESSIONS;
        let ue = Ipv4Addr::from(ue(k)).to_string();
        assert_eq!(p[0], vec![Ipv4Addr::from(GNB).to_string(), ue], "packet {i}: outer and inner destinations");
        let teid = u32::from_str_radix(p[1][0].trim_start_matches("0x"), 16).expect("hex TEID");
        assert_eq!(teid, 0x8000_0000 | k, "packet {i}: peer TEID");
        assert_eq!(p[2], vec![(k % 63 + 1).to_string()], "packet {i}: QFI from the QER");
        assert_eq!(p[3], vec!["1", "1"], "packet {i}: outer and inner IPv4 checksums good");
        assert_eq!(p[4], vec!["1", "1"], "packet {i}: outer and inner UDP checksums good");
        assert_eq!(p[6], vec!["2152", "53"]);
        let inner_len: u64 = p[5][1].parse().unwrap();
        assert_eq!(inner_len as usize, downlink[i].len() - 14);
        *dl_bytes.entry(teid & 0xffff).or_default() += inner_len;
    }
    // Uplink input: the inner bytes tshark sums per TEID are what each session's URR counted.
    let Some(ul) = fields(&ul_in.0, &["gtp.teid", "ip.len"]) else { return };
    let mut ul_bytes: HashMap<u32, u64> = HashMap::new();
    for p in &ul {
        let teid = u32::from_str_radix(p[0][0].trim_start_matches("0x"), 16).unwrap();
        *ul_bytes.entry(teid - 1000).or_default() += p[1][1].parse::<u64>().unwrap();
    }
    for ((seid, _), u) in upf.usage() {
        let k = (seid - 1) as u32;
        assert_eq!(u.ul_bytes, ul_bytes[&k], "session {seid}: uplink URR vs tshark");
        assert_eq!(u.dl_bytes, dl_bytes[&k], "session {seid}: downlink URR vs tshark");
    }
    // Uplink output: plain IPv4/UDP from the UEs, nothing of GTP left.
    let Some(uo) = fields(&ul_out.0, &["ip.src", "gtp.teid", "ip.checksum.status", "udp.checksum.status"]) else {
        return;
    };
    for (i, p) in uo.iter().enumerate() {
        assert_eq!(p[0], vec![Ipv4Addr::from(ue((i as u32 * 7) % SESSIONS)).to_string()]);
        assert!(p[1].is_empty(), "packet {i}: still GTP-U");
        assert_eq!((p[2].as_slice(), p[3].as_slice()), (&["1".to_string()][..], &["1".to_string()][..]));
    }
}
