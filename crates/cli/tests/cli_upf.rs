//! `flowplane upf sessions` and `gen --proto gtpu --upf`: the session file
//! and the trace agree — every packet of a generated UPF trace (uplink and
//! downlink, several PDRs) is classified and forwarded, under every
//! executor, and the output's downlink is GTP-U with the plan's TEIDs.

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flowplane"))
}

fn ok(args: &[&str]) -> String {
    let out = bin().args(args).output().expect("spawn flowplane");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "flowplane {args:?} failed: {err}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn generated_upf_traffic_matches_its_session_file() {
    let dir = std::env::temp_dir().join(format!("flowplane-cli-upf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (sessions, trace) = (dir.join("s.toml"), dir.join("u.pcap"));
    let (s, t) = (sessions.to_str().unwrap(), trace.to_str().unwrap());
    ok(&["upf", "sessions", "--sessions", "300", "--pdrs", "8", "-o", s]);
    ok(&["gen", "--proto", "gtpu", "--upf", "300x8:both", "--packets", "20000", "--size", "100..600", "-o", t]);
    for exec in ["batch", "rtc", "pernf", "microbatch"] {
        let chain = format!("fsc -> upf(sessions={s})");
        let out = ok(&["run", "--chain", &chain, "--input", t, "--exec", exec, "--cores", "1", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let upf = v["nfs"].as_array().unwrap().iter().find(|n| n["name"] == "upf").unwrap();
        let c = &upf["details"]["counters"];
        assert_eq!(upf["dropped"], 0, "{exec}: {c}");
        assert_eq!(c["ul_forwarded"].as_u64().unwrap() + c["dl_forwarded"].as_u64().unwrap(), 20_000, "{exec}");
        assert!(c["uplink"].as_u64().unwrap() > 9000 && c["downlink"].as_u64().unwrap() > 9000, "{c}");
    }
    let err = bin().args(["gen", "--proto", "udp", "--upf", "3x3", "-o", t]).output().unwrap();
    assert_eq!(err.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&err.stderr).contains("--upf needs --proto gtpu"));
    let err = bin().args(["upf", "sessions", "--pdrs", "65"]).output().unwrap();
    assert_eq!(err.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn generated_amf_traffic_runs_without_drops_in_every_mode() {
    let dir = std::env::temp_dir().join(format!("flowplane-cli-amf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("amf.pcap");
    let t = trace.to_str().unwrap();
    ok(&["gen", "--proto", "amf", "--flows", "5000", "--packets", "40000", "-o", t]);
    for mode in ["staged", "all", "rtc"] {
        let chain = format!("amf(ues=8192, mode={mode})");
        let out = ok(&["run", "--chain", &chain, "--input", t, "--cores", "1", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let amf = &v["nfs"][0];
        assert_eq!((amf["packets_in"].as_u64(), amf["dropped"].as_u64()), (Some(40_000), Some(0)), "{mode}: {amf}");
        let d = &amf["details"];
        for k in ["registration", "service", "pdu_session", "handover", "deregistration"] {
            assert!(d[k].as_u64().unwrap() > 1000, "{mode}: {k}: {d}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 30: `amf` keeps its UE contexts in a per-core table, so a UE's
/// messages must all reach the core that registered it. `shared` and `scr`
/// spray them (38.6% were dropped as unknown UE) and `rsspp`/`dyssect` move
/// flows away from their contexts: each is refused in one line naming amf;
/// `rss` and one core run every message.
#[test]
fn amf_is_refused_where_a_ue_cannot_stay_on_one_core() {
    let gen = "--proto amf --flows 500 --packets 4000";
    let chain = "amf(ues=1024)";
    for scale in ["shared", "scr", "rsspp", "dyssect"] {
        let out =
            bin().args(["run", "--chain", chain, "--gen", gen, "--scale", scale, "--cores", "2"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{scale}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{scale}: {err}");
        assert!(err.contains(&format!("--scale {scale}: amf keeps")) && err.contains("use rss"), "{scale}: {err}");
    }
    for (scale, cores) in [("rss", "2"), ("shared", "1")] {
        let out = ok(&["run", "--chain", chain, "--gen", gen, "--scale", scale, "--cores", cores, "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let amf = &v["nfs"][0];
        assert_eq!((amf["packets_in"].as_u64(), amf["dropped"].as_u64()), (Some(4000), Some(0)), "{scale}: {amf}");
    }
}

/// Issue 32 item 4 through the runtime (the worker's release after a batch
/// or when idle): a paced replay of 300 downlink packets numbered in their
/// payloads through `upf(pfcp=...)`; the test, as the SMF, establishes a
/// session whose downlink FAR buffers, then makes it forward. The output
/// (read by tshark) holds every packet from the first one the session saw,
/// each once, in order, encapsulated to the gNB's TEID: the held ones
/// first, then the rest; the report counts them held and released.
#[test]
fn a_paced_replay_releases_buffered_packets_in_order() {
    use flowplane_nf::upf::pfcp::{self, cause, enc, ie, msg, Writer};
    use std::net::{Ipv4Addr, UdpSocket};
    use std::time::{Duration, Instant};
    const UE: [u8; 4] = [10, 45, 0, 1];
    let dir = std::env::temp_dir().join(format!("flowplane-cli-buffer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (trace, out) = (dir.join("dl.pcap"), dir.join("out.pcap"));
    let opts = flowplane_trace::writer::WriterOptions { nanosecond: true, ..Default::default() };
    let mut w = flowplane_trace::writer::PcapWriter::create(&trace, opts).unwrap();
    for n in 1..=300u64 {
        let mut udp = vec![0u8; 8];
        udp[0..2].copy_from_slice(&33333u16.to_be_bytes());
        udp[2..4].copy_from_slice(&44444u16.to_be_bytes());
        udp.extend_from_slice(format!("seq {n:03}").as_bytes());
        let l = udp.len() as u16;
        udp[4..6].copy_from_slice(&l.to_be_bytes());
        let f = udp_frame([203, 0, 113, 5], UE, &udp);
        w.write_packet(n * 1_000_000, &f, f.len() as u32).unwrap();
    }
    w.finish().unwrap();
    let port = 19_741;
    let chain = format!("upf(pfcp=127.0.0.1:{port}, buffer=1000, gtpu_echo_ms=0)");
    let child = bin()
        .args(["run", "--chain", &chain, "--input", trace.to_str().unwrap(), "--rate", "150", "--cores", "1"])
        .args(["--output", out.to_str().unwrap(), "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let smf = UdpSocket::bind("127.0.0.1:0").unwrap();
    smf.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let upf = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut seq = 0;
    let ask = |w: Writer, want: u8| -> Option<Vec<u8>> {
        let m = w.finish();
        for _ in 0..30 {
            smf.send_to(&m, upf).unwrap();
            let mut buf = [0u8; 4096];
            while let Ok(n) = smf.recv(&mut buf) {
                let (h, _) = pfcp::parse_header(&buf[..n]).unwrap();
                if h.msg_type == want {
                    return Some(buf[..n].to_vec());
                }
            }
        }
        None
    };
    let mut next = |t: u8, seid: Option<u64>| {
        seq += 1;
        Writer::message(t, seid, seq)
    };
    let node = enc::node_id_v4(Ipv4Addr::LOCALHOST);
    let mut a = next(msg::ASSOC_SETUP_REQ, None);
    a.ie(ie::NODE_ID, &node).ie(ie::RECOVERY_TIME_STAMP, &3_900_000_000u32.to_be_bytes());
    assert!(ask(a, msg::ASSOC_SETUP_RSP).is_some(), "the run's PFCP endpoint answers");
    let far = |w: &mut Writer, action: u8| {
        w.ie(ie::FAR_ID, &2u32.to_be_bytes()).ie(ie::APPLY_ACTION, &[action]);
        w.group(ie::FORWARDING_PARAMETERS).ie(ie::DESTINATION_INTERFACE, &[0]);
        w.ie(ie::OUTER_HEADER_CREATION, &enc::ohc_gtpu_v4(0x99, Ipv4Addr::new(198, 51, 100, 10))).end();
    };
    let mut e = next(msg::SESS_EST_REQ, Some(0));
    e.ie(ie::NODE_ID, &node).ie(ie::F_SEID, &enc::fseid(0x5e, Ipv4Addr::LOCALHOST));
    e.group(ie::CREATE_PDR).ie(ie::PDR_ID, &2u16.to_be_bytes()).ie(ie::PRECEDENCE, &10u32.to_be_bytes());
    e.group(ie::PDI).ie(ie::SOURCE_INTERFACE, &[1]).ie(ie::UE_IP_ADDRESS, &enc::ue_ip_v4(UE.into())).end();
    e.ie(ie::FAR_ID, &2u32.to_be_bytes()).end();
    e.group(ie::CREATE_FAR);
    far(&mut e, 0x04);
    e.end();
    let r = ask(e, msg::SESS_EST_RSP).expect("an establishment response");
    let (_, body) = pfcp::parse_header(&r).unwrap();
    let ies = pfcp::ies(body).unwrap();
    assert_eq!(ies.iter().find(|i| i.ty == ie::CAUSE).map(|i| i.value[0]), Some(cause::ACCEPTED));
    let up = u64::from_be_bytes(ies.iter().find(|i| i.ty == ie::F_SEID).unwrap().value[1..9].try_into().unwrap());
    // About 100 packets buffered, then the FAR forwards.
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(700));
    let mut m = next(msg::SESS_MOD_REQ, Some(up));
    m.group(ie::UPDATE_FAR);
    far(&mut m, 0x02);
    m.end();
    assert!(ask(m, msg::SESS_MOD_RSP).is_some());
    assert!(t0.elapsed() < Duration::from_millis(1200), "the update came while the replay ran");
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let c = &v["nfs"][0]["details"]["counters"];
    let n = |k: &str| c[k].as_u64().unwrap();
    assert!(n("buffered") >= 50 && n("released") == n("buffered"), "{c}");
    assert_eq!((n("buffer_full"), n("buffer_expired"), n("buffer_discarded")), (0, 0, 0), "{c}");
    let args = ["-n", "-r", out.to_str().unwrap(), "-T", "fields", "-E", "separator=|", "-e", "gtp.teid"];
    let Some(rows) = tshark(&[&args[..], &["-e", "data.data"][..]].concat()) else { return };
    let seqs: Vec<u64> = rows
        .lines()
        .map(|l| {
            let (teid, data) = l.split_once('|').unwrap();
            let teid = teid.strip_prefix("0x").map_or_else(|| teid.parse().ok(), |h| u32::from_str_radix(h, 16).ok());
            assert_eq!(teid, Some(0x99), "{l}");
            let data = data.replace(':', "");
            let b: Vec<u8> =
                (0..data.len() / 2).map(|k| u8::from_str_radix(&data[2 * k..2 * k + 2], 16).unwrap()).collect();
            String::from_utf8(b).unwrap()[4..].parse().unwrap()
        })
        .collect();
    assert_eq!(seqs.last(), Some(&300), "{seqs:?}");
    let first = seqs[0];
    assert_eq!(seqs, (first..=300).collect::<Vec<_>>(), "every packet from the first held, once, in order");
    assert_eq!(seqs.len() as u64, n("dl_forwarded"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// tshark's output, or None (skipped) when tshark is not installed.
fn tshark(args: &[&str]) -> Option<String> {
    match Command::new("tshark").args(args).output() {
        Ok(o) => {
            assert!(o.status.success(), "tshark {args:?}: {}", String::from_utf8_lossy(&o.stderr));
            Some(String::from_utf8_lossy(&o.stdout).into_owned())
        }
        Err(_) => None,
    }
}

/// Ethernet + IPv4 (no options, checksum set) around a UDP datagram (checksum 0: none).
fn udp_frame(src: [u8; 4], dst: [u8; 4], udp: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 8, 0, 0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0];
    f[16..18].copy_from_slice(&((20 + udp.len()) as u16).to_be_bytes());
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    let c = flowplane_wire::checksum::checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(udp);
    f
}
