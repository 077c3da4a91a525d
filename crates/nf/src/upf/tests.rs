//! Unit tests of the `upf` NF: rule compilation, uplink decapsulation,
//! downlink encapsulation, precedence, QER, URR, echo, drops by reason.

use super::rules::*;
use super::*;
use crate::testutil::{assert_ipv4_checksums, gtpu4, udp4};
use flowplane_packet::{PacketPool, PoolConfig};

const UE: [u8; 4] = [10, 45, 0, 7];
const GNB: [u8; 4] = [198, 51, 100, 10];
const N3: [u8; 4] = [192, 0, 2, 1];
const DN: [u8; 4] = [203, 0, 113, 5];

/// One session: uplink PDRs on TEID 100 (precedence 10: UDP to port 53,
/// URR 1; precedence 100: anything, QFI 9 only), downlink PDR to GNB TEID 0x55 with QFI 5.
fn spec() -> SessionSpec {
    let pdr = |id, precedence, source, teid, sdf: &[&str], far, qfi| PdrSpec {
        id,
        precedence,
        source,
        teid,
        ue_ip: true,
        qfi,
        sdf: sdf.iter().map(|s| s.to_string()).collect(),
        outer_header_removal: source == Iface::Access,
        far,
        qers: vec![],
        urrs: vec![1],
    };
    SessionSpec {
        seid: 7,
        ue_ipv4: Some(UE.into()),
        ue_ipv6: None,
        pdrs: vec![
            pdr(2, 100, Iface::Access, Some(100), &[], 1, Some(9)),
            pdr(1, 10, Iface::Access, Some(100), &["permit out 17 from 203.0.113.0/24 53 to assigned"], 1, None),
            pdr(3, 10, Iface::Core, None, &["permit out ip from any to assigned"], 2, Some(5)),
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
                ohc_teid: Some(0x55),
                ohc_addr: Some(GNB.into()),
                tos: None,
                notify_cp: false,
            },
        ],
        qers: vec![],
        urrs: vec![UrrSpec { id: 1, volume_threshold: Some(100), ..Default::default() }],
        bar: None,
    }
}

fn upf(specs: &[SessionSpec], cfg: UpfConfig) -> Upf {
    Upf::new(cfg, Arc::new(RuleSet::compile(specs).unwrap()))
}

/// Runs frames (with their times) through the UPF as one batch; returns each output (None: dropped).
fn run(u: &mut Upf, frames: &[(Vec<u8>, u64)]) -> Vec<Option<Vec<u8>>> {
    let mut pool = PacketPool::new(PoolConfig { buffers: 512, ..Default::default() }).unwrap();
    let mut b = Batch::new(&pool);
    for (f, t) in frames {
        assert!(b.push_copy(&mut pool, f, *t));
    }
    let n = b.len();
    // The batch's time is its latest packet's, as the engine gives it.
    let now_ns = frames.iter().map(|f| f.1).max().unwrap_or(0);
    u.process(&mut b, 0..n, &NfContext { now_ns, ..NfContext::default() });
    let out = (0..n).map(|i| (!b.is_dropped(i)).then(|| b.data(i).to_vec())).collect();
    b.free_all(&mut pool).unwrap();
    out
}

fn udp_payload(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
    udp4(src, dst, sport, dport)[14..].to_vec()
}

#[test]
fn uplink_decapsulates_to_the_inner_packet() {
    let mut u = upf(&[spec()], UpfConfig::default());
    let inner = udp_payload(UE, DN, 4000, 80);
    let out = run(&mut u, &[(gtpu4(GNB, N3, 100, Some(9), &inner), 0)]);
    let f = out[0].as_ref().expect("forwarded");
    assert_eq!(&f[14..], &inner[..], "the inner packet, unchanged");
    assert_eq!(&f[12..14], &[8, 0]);
    assert_ipv4_checksums(f);
    let c = u.upf_counters();
    assert_eq!((c.uplink, c.ul_forwarded, c.decapsulated), (1, 1, 1));
    let usage: Vec<_> = u.usage().collect();
    assert_eq!(usage[0].1.ul_bytes, inner.len() as u64);
}

#[test]
fn precedence_and_qfi_pick_the_pdr() {
    let mut u = upf(&[spec()], UpfConfig::default());
    // DNS from port 53 of the remote matches PDR 1 (precedence 10) whatever the QFI.
    let dns = udp_payload(UE, DN, 4000, 53);
    // Not DNS, QFI 8: PDR 2 wants QFI 9, so no PDR matches.
    let other = udp_payload(UE, DN, 4000, 80);
    let out = run(&mut u, &[(gtpu4(GNB, N3, 100, Some(8), &dns), 0), (gtpu4(GNB, N3, 100, Some(8), &other), 0)]);
    assert!(out[0].is_some() && out[1].is_none());
    assert_eq!(u.upf_counters().no_pdr, 1);
    let rs = RuleSet::compile(&[spec()]).unwrap();
    let s = rs.sessions[0];
    let f = Fields {
        proto: 17,
        ue: v4_128(u32::from_be_bytes(UE)),
        remote: v4_128(u32::from_be_bytes(DN)),
        ue_port: 4000,
        remote_port: 53,
    };
    assert_eq!(rs.pdrs[rs.classify(&s, true, 100, None, &f).unwrap() as usize].id, 1);
    assert_eq!(rs.classify(&s, true, 101, Some(9), &f), None, "another TEID");
    let f80 = Fields { remote_port: 80, ..f };
    assert_eq!(rs.pdrs[rs.classify(&s, true, 100, Some(9), &f80).unwrap() as usize].id, 2);
    let spoofed = Fields { ue: v4_128(1), ..f80 };
    assert_eq!(rs.classify(&s, true, 100, Some(9), &spoofed), None, "not the UE's address");
}

#[test]
fn downlink_encapsulates_with_lengths_checksums_and_qfi() {
    for udp_checksum in [false, true] {
        let mut u = upf(&[spec()], UpfConfig { udp_checksum, n3_port: Some(3), ..Default::default() });
        let mut plain = udp4(DN, UE, 80, 4000);
        let inner = plain[14..].to_vec();
        plain.extend_from_slice(&[0xee; 6]); // an Ethernet trailer is not part of the packet
        let out = run(&mut u, &[(plain, 0)]);
        let f = out[0].as_ref().expect("forwarded");
        assert_eq!(f.len(), 14 + 20 + 8 + 16 + inner.len());
        assert_eq!(&f[26..30], &N3);
        assert_eq!(&f[30..34], &GNB);
        assert_ipv4_checksums(f);
        assert_eq!(u16::from_be_bytes([f[16], f[17]]) as usize, f.len() - 14);
        assert_eq!(u16::from_be_bytes([f[38], f[39]]) as usize, f.len() - 34);
        assert_eq!(u16::from_be_bytes([f[40], f[41]]) != 0, udp_checksum);
        let g = GtpuPacket::new_checked(&f[42..]).unwrap();
        assert_eq!((g.msg_type(), g.teid(), g.qfi()), (255, 0x55, Some(5)));
        assert_eq!(g.payload(), &inner[..]);
        assert_eq!(u.upf_counters().encapsulated, 1);
    }
}

#[test]
fn drops_are_counted_by_reason_never_a_panic() {
    let mut u = upf(&[spec()], UpfConfig::default());
    let inner = udp_payload(UE, DN, 4000, 80);
    let mut bad_ver = gtpu4(GNB, N3, 100, Some(9), &inner);
    bad_ver[42] = 0x50;
    let mut short_inner = gtpu4(GNB, N3, 100, None, &inner[..10]);
    short_inner[42] = 0x30;
    let mut err_ind = gtpu4(GNB, N3, 100, None, &inner);
    err_ind[43] = 26;
    let frames = vec![
        (gtpu4(GNB, N3, 999, Some(9), &inner), 0),
        (udp4(DN, [10, 45, 0, 8], 80, 4000), 0),
        (bad_ver, 0),
        (short_inner, 0),
        (err_ind, 0),
        (vec![0u8; 20], 0),
        (gtpu4(GNB, N3, 100, Some(9), &inner)[..50].to_vec(), 0),
    ];
    let out = run(&mut u, &frames);
    // The unknown TEID is answered with a GTP-U Error Indication (type 26, TEID Data I = 999); the rest dropped.
    let ei = out[0].as_ref().expect("an Error Indication");
    assert_eq!((ei.len(), ei[43], &ei[54..59]), (66, 26, &[16, 0, 0, 3, 0xe7][..]));
    assert_ipv4_checksums(ei);
    assert!(out[1..].iter().all(Option::is_none));
    let c = u.upf_counters();
    assert_eq!(
        (c.unknown_teid, c.unknown_ue, c.malformed_gtpu, c.malformed_inner, c.unsupported_msg, c.not_ip),
        (1, 1, 2, 1, 1, 1)
    );
    assert_eq!((u.counters().dropped, c.error_indications), (6, 1));
    // Without `error_pps` the unknown TEID is only dropped.
    let mut quiet = upf(&[spec()], UpfConfig { error_pps: 0, ..UpfConfig::default() });
    assert!(run(&mut quiet, &frames[..1])[0].is_none());
    assert_eq!(quiet.upf_counters().errors_limited, 1);
    // Every truncation of an uplink frame.
    let full = gtpu4(GNB, N3, 100, Some(9), &inner);
    let cuts: Vec<_> = (0..full.len()).map(|n| (full[..n].to_vec(), 0)).collect();
    let out = run(&mut u, &cuts);
    assert!(out.iter().all(Option::is_none));
}

#[test]
fn echo_request_gets_a_response_and_end_markers_are_consumed() {
    let mut u = upf(&[], UpfConfig { n3_port: Some(1), ..Default::default() });
    let mut req = gtpu4(GNB, N3, 0, None, &[]);
    // Echo request with a sequence number: S flag, type 1, length 4.
    req.truncate(42);
    req.extend_from_slice(&[0x32, 1, 0, 4, 0, 0, 0, 0, 0x12, 0x34, 0, 0]);
    req[16..18].copy_from_slice(&40u16.to_be_bytes());
    req[38..40].copy_from_slice(&20u16.to_be_bytes());
    req[24..26].copy_from_slice(&[0, 0]);
    let c = flowplane_wire::checksum::checksum(&req[14..34]);
    req[24..26].copy_from_slice(&c.to_be_bytes());
    let mut end = gtpu4(GNB, N3, 100, None, &[]);
    end[43] = 254;
    let out = run(&mut u, &[(req, 0), (end, 0)]);
    let r = out[0].as_ref().expect("answered");
    assert_ipv4_checksums(r);
    assert_eq!((&r[26..30], &r[30..34]), (&N3[..], &GNB[..]));
    let g = GtpuPacket::new_checked(&r[42..]).unwrap();
    assert_eq!((g.msg_type(), g.seq_number(), g.payload()), (2, Some(0x1234), &[14u8, 0][..]));
    assert!(out[1].is_none());
    assert_eq!((u.upf_counters().echo_responses, u.upf_counters().end_markers), (1, 1));
}

#[test]
fn qer_gate_and_mbr_on_the_packet_clock() {
    let mut s = spec();
    s.qers = vec![QerSpec { id: 1, gate_ul: Gate::Closed, mbr_dl_kbps: Some(8), ..Default::default() }];
    for p in &mut s.pdrs {
        p.qers = vec![1];
    }
    let mut u = upf(&[s], UpfConfig::default());
    let inner = udp_payload(UE, DN, 4000, 80);
    let out = run(&mut u, &[(gtpu4(GNB, N3, 100, Some(9), &inner), 0)]);
    assert!(out[0].is_none());
    assert_eq!(u.upf_counters().gate_closed, 1);
    // 8 kbit/s = 1,000 bytes/s, burst 3,000 bytes: 46-byte IP packets every 10 ms
    // (4,600 bytes/s offered) for 10 s pass 3,000 + 9.99 x 1,000 bytes.
    let dl = udp4(DN, UE, 80, 4000);
    let frames: Vec<_> = (0..1000u64).map(|k| (dl.clone(), k * 10_000_000)).collect();
    let mut passed = 0;
    for chunk in frames.chunks(200) {
        passed += run(&mut u, chunk).iter().filter(|o| o.is_some()).count();
    }
    let bytes = passed * 46;
    assert!((12_940..=12_990).contains(&bytes), "{bytes} bytes passed");
    assert_eq!(u.upf_counters().mbr_exceeded as usize, 1000 - passed);
}

/// Several QERs on one PDR (a flow MBR under a session AMBR): every gate must
/// be open and every MBR conform, and a packet one bucket refuses charges none.
/// Several URRs: each counts the packet.
#[test]
fn several_qers_and_urrs_per_pdr() {
    let mut s = spec();
    s.qers = vec![
        QerSpec { id: 1, mbr_dl_kbps: Some(80), ..Default::default() },
        QerSpec { id: 2, mbr_dl_kbps: Some(8), ..Default::default() },
        QerSpec { id: 3, gate_ul: Gate::Closed, ..Default::default() },
    ];
    s.urrs.push(UrrSpec { id: 2, volume_threshold: None, ..Default::default() });
    for p in &mut s.pdrs {
        (p.qers, p.urrs) = if p.source == Iface::Core { (vec![1, 2], vec![1, 2]) } else { (vec![1, 3], vec![2]) };
    }
    let rs = RuleSet::compile(std::slice::from_ref(&s)).unwrap();
    let dl = rs.pdrs.iter().find(|p| p.id == 3).unwrap();
    assert_eq!(rs.refs(&dl.qer).len(), 2);
    let mut u = upf(&[s.clone()], UpfConfig::default());
    // Uplink: QER 3's gate is closed.
    let inner = udp_payload(UE, DN, 4000, 80);
    assert!(run(&mut u, &[(gtpu4(GNB, N3, 100, Some(9), &inner), 0)])[0].is_none());
    assert_eq!(u.upf_counters().gate_closed, 1);
    // Downlink: the 8 kbit/s QER decides (as in `qer_gate_and_mbr_on_the_packet_clock`).
    let dlf = udp4(DN, UE, 80, 4000);
    let frames: Vec<_> = (0..1000u64).map(|k| (dlf.clone(), k * 10_000_000)).collect();
    let mut passed = 0;
    for chunk in frames.chunks(200) {
        passed += run(&mut u, chunk).iter().filter(|o| o.is_some()).count();
    }
    assert!((12_940..=12_990).contains(&(passed * 46)), "{passed} packets passed");
    // Both URRs counted every forwarded downlink packet.
    let usage: Vec<_> = u.usage().collect();
    assert_eq!(usage.len(), 2);
    for (_, c) in &usage {
        assert_eq!(c.dl_packets as usize, passed);
    }
    // Rule files take one ID or a list.
    let toml = toml::to_string(&SessionsFile { sessions: vec![s] }).unwrap();
    assert!(toml.contains("qers = [1, 2]"), "{toml}");
    let one = toml.replace("qers = [1, 2]", "qer = 1");
    let back: SessionsFile = toml::from_str(&one).unwrap();
    assert_eq!(back.sessions[0].pdrs.iter().find(|p| p.id == 3).unwrap().qers, vec![1]);
    // A rule listed twice is refused.
    let mut dup = spec();
    dup.urrs.push(UrrSpec { id: 2, volume_threshold: None, ..Default::default() });
    dup.pdrs[0].urrs = vec![1, 1];
    let e = RuleSet::compile(&[dup]).unwrap_err();
    assert!(e.contains("URR 1 listed twice"), "{e}");
}

#[test]
fn urr_counts_and_threshold_reports() {
    let mut u = upf(&[spec()], UpfConfig::default());
    let inner = udp_payload(UE, DN, 4000, 80); // 46 bytes
    let frames: Vec<_> = (0..5).map(|k| (gtpu4(GNB, N3, 100, Some(9), &inner), k)).collect();
    run(&mut u, &frames);
    let dl = udp4(DN, UE, 80, 4000);
    run(&mut u, &[(dl, 9)]);
    let (_, usage) = u.usage().next().unwrap();
    assert_eq!((usage.ul_packets, usage.ul_bytes, usage.dl_packets, usage.dl_bytes), (5, 230, 1, 46));
    // 100-byte threshold: reports at 138 (3rd packet) and then 92 + 46 = 138 (6th).
    let r = u.take_reports();
    assert_eq!(r.len(), 2);
    assert_eq!((r[0].seid, r[0].urr_id, r[0].volume, r[0].at_ns), (7, 1, 138, 2));
    assert_eq!(u.upf_counters().usage_reports, 2);
    let rep = u.report().unwrap();
    assert_eq!(rep["usage"]["7/1"]["ul_bytes"], 230);
    let rows = u.export_report_rows(&rep);
    assert_eq!(rows[0]["seid"], 7);
}

#[test]
fn a_swapped_threshold_applies_to_the_carried_count() {
    let mut u = upf(&[spec()], UpfConfig::default());
    let inner = udp_payload(UE, DN, 4000, 80); // 46 bytes
    let frame = gtpu4(GNB, N3, 100, Some(9), &inner);
    run(&mut u, &[(frame.clone(), 0), (frame.clone(), 1)]);
    assert!(u.take_reports().is_empty(), "92 bytes < 100");
    let mut s = spec();
    s.urrs[0].volume_threshold = Some(1_000);
    u.set_rules(Arc::new(RuleSet::compile(&[s.clone()]).unwrap()));
    // The 92 bytes carried over count towards the new threshold.
    let frames: Vec<_> = (2..21).map(|k| (frame.clone(), k)).collect();
    run(&mut u, &frames);
    assert!(u.take_reports().is_empty(), "21 x 46 = 966 bytes < 1,000");
    run(&mut u, &[(frame.clone(), 21)]);
    let r = u.take_reports();
    assert_eq!((r.len(), r[0].volume), (1, 22 * 46));
    s.urrs[0].volume_threshold = None;
    u.set_rules(Arc::new(RuleSet::compile(&[s]).unwrap()));
    run(&mut u, &(21..80).map(|k| (frame.clone(), k)).collect::<Vec<_>>());
    assert!(u.take_reports().is_empty(), "no threshold, no report");
}

/// `--ipfix` usage records (issue 34): what the URR counted since the previous record, once per active timeout of
/// packet time (checked per batch and per idle tick), when the URR is removed, and at the run's end; nothing when
/// nothing is new. The records sum to the URR's totals.
#[test]
fn usage_records_are_deltas_per_active_timeout_removal_and_end() {
    const S: u64 = 1_000_000_000;
    let mut u = upf(&[spec()], UpfConfig::default());
    let (tx, mut rx) = crate::ipfix::test_queue();
    u.attach_ipfix(tx, Some(S));
    let ul = gtpu4(GNB, N3, 100, Some(9), &udp_payload(UE, DN, 4000, 80)); // 46 inner bytes
    let dl = udp4(DN, UE, 80, 4000);
    let mut got = Vec::new();
    let mut take = |rx: &mut rtrb::Consumer<crate::ipfix::ExportRecord>| {
        let mut v = Vec::new();
        while let Ok(crate::ipfix::ExportRecord::Usage(r)) = rx.pop() {
            v.push((r.ul, r.dl, r.time_ns));
        }
        got.extend(v.iter().copied());
        v
    };
    // The first batch starts the timer; half a period later nothing is due.
    run(&mut u, &[(ul.clone(), S / 10), (ul.clone(), S / 10)]);
    run(&mut u, &[(ul.clone(), 6 * S / 10)]);
    assert!(take(&mut rx).is_empty());
    // 1.1 s after the start: the URR's counts so far, taken after the batch.
    run(&mut u, &[(dl.clone(), 12 * S / 10)]);
    assert_eq!(take(&mut rx), vec![((138, 3), (46, 1), 12 * S / 10)]);
    // An idle port's ticks report on time: what came since, then nothing new, nothing.
    run(&mut u, &[(ul.clone(), 15 * S / 10), (ul.clone(), 15 * S / 10)]);
    u.tick(19 * S / 10);
    assert!(take(&mut rx).is_empty(), "not a period since the last record");
    u.tick(23 * S / 10);
    assert_eq!(take(&mut rx), vec![((92, 2), (0, 0), 23 * S / 10)]);
    u.tick(40 * S / 10);
    assert!(take(&mut rx).is_empty(), "nothing new");
    // The run's end: the rest.
    run(&mut u, &[(dl.clone(), 41 * S / 10)]);
    u.ipfix_end(45 * S / 10);
    assert_eq!(take(&mut rx), vec![((0, 0), (46, 1), 45 * S / 10)]);
    u.ipfix_end(46 * S / 10);
    assert!(take(&mut rx).is_empty(), "everything was sent");
    // A URR the control plane removes sends what it counted since its last record then.
    run(&mut u, &[(ul.clone(), 47 * S / 10)]);
    u.set_rules(Arc::new(RuleSet::default()));
    assert_eq!(take(&mut rx), vec![((46, 1), (0, 0), 47 * S / 10)]);
    let (mut p, mut b) = (0, 0);
    for (ul, dl, _) in &got {
        p += ul.1 + dl.1;
        b += ul.0 + dl.0;
    }
    assert_eq!((p, b), (8, 8 * 46), "the records sum to everything counted");
}

#[test]
fn compiled_classifiers_are_shared_and_pick_the_pdr() {
    let mut a = spec();
    let mut b = spec();
    b.seid = 8;
    b.ue_ipv4 = Some([10, 45, 0, 9].into());
    for p in &mut b.pdrs {
        p.teid = p.teid.map(|_| 200);
    }
    a.seid = 7;
    let rs = RuleSet::compile(&[a, b]).unwrap();
    // Uplink (two entries, a block) and downlink (one) of session 7, shared by session 8.
    assert_eq!(rs.cls.len(), 2);
    let (sa, sb) = (rs.teids.get(100).unwrap(), rs.teids.get(200).unwrap());
    assert_eq!((sa.hot.cls, sa.hot.cls_len), (sb.hot.cls, sb.hot.cls_len));
    assert!(sa.hot.flags & Hot::FAST != 0);
    let f = Fields {
        proto: 17,
        ue: v4_128(u32::from_be_bytes(UE)),
        remote: v4_128(0xcb00_7105),
        ue_port: 4000,
        remote_port: 53,
    };
    let p = rs.classify_hot(&sa.hot, sa.ue4, true, 100, None, &f).unwrap();
    assert_eq!(rs.pdrs[p as usize].id, 1);
    // Session 8's UE is another address: its UE-address PDRs do not match session 7's UE.
    assert_eq!(rs.classify_hot(&sb.hot, sb.ue4, true, 200, None, &f), None);
    let f9 = Fields { ue: v4_128(u32::from_be_bytes([10, 45, 0, 9])), ..f };
    let p = rs.classify_hot(&sb.hot, sb.ue4, true, 200, Some(9), &f9).unwrap();
    assert_eq!(rs.pdrs[p as usize].id, 1);
    assert_eq!(rs.acts[p as usize].far, rs.pdrs[p as usize].far);
}

#[test]
fn rule_swaps_carry_state_and_change_forwarding() {
    let mut u = upf(&[spec()], UpfConfig::default());
    let inner = udp_payload(UE, DN, 4000, 80);
    let gp = gtpu4(GNB, N3, 100, Some(9), &inner);
    assert!(run(&mut u, &[(gp.clone(), 0)])[0].is_some());
    let mut s = spec();
    s.fars[0].action = FarAction::Drop;
    u.set_rules(Arc::new(RuleSet::compile(&[s.clone()]).unwrap()));
    assert!(run(&mut u, &[(gp.clone(), 1)])[0].is_none());
    assert_eq!(u.upf_counters().far_drop, 1);
    assert_eq!(u.usage().next().unwrap().1.ul_packets, 1, "the URR kept its count");
    s.fars[0].action = FarAction::Buffer;
    let mut u2 = upf(&[s], UpfConfig { buffer: 2, ..Default::default() });
    run(&mut u2, &[(gp.clone(), 0), (gp.clone(), 0), (gp, 0)]);
    assert_eq!((u2.upf_counters().buffered, u2.upf_counters().buffer_full), (2, 1));
    u.set_rules(Arc::new(RuleSet::default()));
    assert_eq!(u.usage().count(), 0);
}

#[test]
fn staged_and_rtc_agree() {
    let mut a = upf(&[spec()], UpfConfig::default());
    let mut b = upf(&[spec()], UpfConfig { staged: false, ..Default::default() });
    let inner = udp_payload(UE, DN, 4000, 53);
    let frames: Vec<_> = (0..100u32)
        .map(|k| match k % 4 {
            0 => (gtpu4(GNB, N3, 100 + k % 3, Some((k % 10) as u8), &inner), u64::from(k)),
            1 => (udp4(DN, UE, 80, k as u16), u64::from(k)),
            2 => (udp4(DN, [10, 45, 0, 1], 80, 1), u64::from(k)),
            _ => (gtpu4(GNB, N3, 100, None, &udp_payload(UE, DN, 1, k as u16)), u64::from(k)),
        })
        .collect();
    assert_eq!(run(&mut a, &frames), run(&mut b, &frames));
    assert_eq!(a.upf_counters(), b.upf_counters());
}

#[test]
fn compile_errors_name_the_rule() {
    let e = |s: SessionSpec| RuleSet::compile(&[s]).err().unwrap();
    let mut s = spec();
    s.pdrs[0].far = 9;
    assert_eq!(e(s), "session 7: PDR 2: unknown FAR");
    let mut s = spec();
    s.pdrs[1].sdf = vec!["permit out 17 from 1.2.3.4/33 to assigned".into()];
    assert!(e(s).contains("prefix length out of range"));
    assert!(RuleSet::compile(&[spec(), spec()]).err().unwrap().contains("duplicate SEID"));
    let mut s2 = spec();
    s2.seid = 8;
    s2.ue_ipv4 = Some([10, 45, 0, 9].into());
    assert!(RuleSet::compile(&[spec(), s2]).err().unwrap().contains("TEID 100 already used by session 7"));
    let mut s = spec();
    s.pdrs[2].qfi = Some(64);
    assert!(e(s).contains("QFI 64 above 63"));
}

#[test]
fn two_pdrs_per_cache_line() {
    assert_eq!(std::mem::size_of::<Pdr>(), 32);
}

#[test]
fn flow_descriptions() {
    let d = Sdf::parse("permit out 17 from 198.51.100.0/24 5000-5999 to assigned 80").unwrap();
    assert_eq!((d.proto, d.remote_ports, d.ue_ports, d.ue.assigned), (17, (5000, 5999), (80, 80), true));
    assert!(d.remote.contains(v4_128(u32::from_be_bytes([198, 51, 100, 9]))));
    assert!(!d.remote.contains(v4_128(u32::from_be_bytes([198, 51, 101, 9]))));
    let d = Sdf::parse("permit in ip from any to 2001:db8::/32").unwrap();
    assert_eq!(d.proto, 0x100);
    assert!(d.remote.contains(ip128("2001:db8::1".parse().unwrap())));
    for bad in [
        "deny out ip from any to any",
        "permit out ip from any",
        "permit out 300 from any to any",
        "permit out ip from any 9-1 to any",
        "permit out ip from any to any 1 2",
    ] {
        assert!(Sdf::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn session_files_round_trip_toml_and_json() {
    let f = SessionsFile { sessions: vec![spec()] };
    let t = f.to_toml().unwrap();
    assert_eq!(SessionsFile::parse(&t).unwrap(), f);
    let j = serde_json::to_string(&f).unwrap();
    assert_eq!(SessionsFile::parse(&j).unwrap(), f);
    assert!(SessionsFile::parse("[[sessions]]\nseid = 1\nbogus = 2\n").unwrap_err().contains("bogus"));
}

#[test]
fn ipv6_ue_both_directions() {
    use crate::testutil::{assert_ipv6_checksums, udp6};
    use std::net::Ipv6Addr;
    let ue6: Ipv6Addr = "2001:db8:45::7".parse().unwrap();
    let dn6: Ipv6Addr = "2001:db8:ffff::5".parse().unwrap();
    let mut s = spec();
    s.ue_ipv6 = Some(ue6);
    s.pdrs[1].sdf = vec!["permit out 17 from 2001:db8:ffff::/48 53 to assigned".into()];
    let mut u = upf(&[s], UpfConfig::default());
    let inner = udp6(ue6, dn6, 4000, 53)[14..].to_vec();
    let up = gtpu4(GNB, N3, 100, None, &inner);
    let down = udp6(dn6, ue6, 53, 4000);
    let out = run(&mut u, &[(up, 0), (down.clone(), 0)]);
    let f = out[0].as_ref().expect("uplink IPv6 forwarded");
    assert_eq!((&f[12..14], &f[14..]), (&[0x86, 0xdd][..], &inner[..]));
    assert_ipv6_checksums(f);
    let e = out[1].as_ref().expect("downlink IPv6 encapsulated");
    assert_eq!(flowplane_wire::checksum::sum(&e[14..34]), 0xffff, "outer IPv4 header checksum");
    let g = GtpuPacket::new_checked(&e[42..]).unwrap();
    assert_eq!((g.teid(), g.payload()), (0x55, &down[14..]));
    assert_eq!(u.upf_counters().no_pdr, 0);
}

/// The uplink fast path (`upf::fast`) and the general parse give the same
/// forwarding; a batch slot that held a known session's packet holds
/// nothing of it for the next packet there (an unknown TEID stays unknown).
#[test]
fn fast_path_and_fallback_forward_alike_and_slots_do_not_leak_sessions() {
    let mut u = upf(&[spec()], UpfConfig::default());
    // The session's uplink takes the compiled classifier, where the fast path applies.
    assert_ne!(u.rules().teids.get(100).unwrap().hot.flags & Hot::FAST, 0);
    let inner = udp_payload(UE, DN, 4000, 53);
    let fast = gtpu4(GNB, N3, 100, Some(9), &inner);
    let m = PktMeta::parse(&fast);
    assert!(fast::uplink_v4(&fast, &m).is_some());
    // The S flag with a sequence number: a layout only the general parse takes.
    let mut slow = fast.clone();
    slow[42] |= 0x02;
    slow[50..52].copy_from_slice(&[0x12, 0x34]);
    assert!(fast::uplink_v4(&slow, &PktMeta::parse(&slow)).is_none());
    let out = run(&mut u, &[(fast.clone(), 0), (slow, 0)]);
    assert_eq!(&out[0].as_ref().expect("forwarded")[14..], &inner[..]);
    assert_eq!(out[0], out[1]);
    // Slot 0 found session 7 above; an unknown TEID there now is counted as such (an Error Indication).
    let out = run(&mut u, &[(gtpu4(GNB, N3, 999, Some(9), &inner), 0)]);
    assert_eq!(out[0].as_ref().map(|f| f[43]), Some(26));
    let c = u.upf_counters();
    assert_eq!((c.ul_forwarded, c.unknown_teid, c.uplink), (2, 1, 3));
    let urr: u64 = u.usage().map(|(_, x)| x.ul_packets).sum();
    assert_eq!(urr, 2);
}

/// The N4 parameters: the Node ID follows `node_id=`, else the `pfcp=` IP,
/// else the N3 address; the F-SEID address the `pfcp=` IP when it names one.
#[test]
fn n4_parameters() {
    let n3 = Ipv4Addr::new(192, 0, 2, 1);
    let params = |kv: &[(&str, &str)]| {
        Params::new("upf", kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>())
    };
    let c = n4_config(&mut params(&[]), "10.1.1.1:8805", n3).unwrap();
    assert_eq!(
        (c.node_id, c.n4, c.n3),
        (control::NodeId::V4(Ipv4Addr::new(10, 1, 1, 1)), Ipv4Addr::new(10, 1, 1, 1), n3)
    );
    let c = n4_config(&mut params(&[]), "0.0.0.0:8805", n3).unwrap();
    assert_eq!((c.node_id, c.n4), (control::NodeId::V4(n3), n3));
    let mut p = params(&[
        ("node_id", "UPF-a.Example.net"),
        ("pfcp_heartbeat_ms", "0"),
        ("pfcp_t1_ms", "200"),
        ("pfcp_n1", "5"),
        ("keep_sessions_on_restart", "true"),
        ("pfcp_rcvbuf", "65536"),
    ]);
    let c = n4_config(&mut p, "0.0.0.0:8805", n3).unwrap();
    p.finish().unwrap();
    assert_eq!(c.node_id, control::NodeId::Fqdn("upf-a.example.net".into()));
    assert_eq!(
        (c.n4, c.heartbeat, c.t1, c.n1),
        (n3, std::time::Duration::ZERO, std::time::Duration::from_millis(200), 5)
    );
    assert!(c.keep_sessions_on_restart && !c.keep_sessions_on_failure && c.rcvbuf == 65536);
    let e = n4_config(&mut params(&[("node_id", "upf_1!")]), "", n3).unwrap_err();
    assert_eq!(e.0, "upf: parameter 'node_id=upf_1!': 'upf_1!' is neither an IPv4 address nor an FQDN");
}

/// The N3/N6 parameters: MACs, N6 address, TTL, MTU, error rate; bad values are one-line errors.
#[test]
fn n3_n6_parameters() {
    let params = |kv: &[(&str, &str)]| {
        Params::new("upf", kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>())
    };
    let mut p = params(&[
        ("mac", "02:00:00:00:00:01"),
        ("n6_gw_mac", "0a:0b:0c:0d:0e:0f"),
        ("n6_addr", "192.0.2.6"),
        ("ttl", "decrement"),
        ("mtu", "1500"),
        ("error_pps", "0"),
        ("n3_addr6", "2001:db8:3::1"),
        ("buffer_total", "16"),
    ]);
    let u = Upf::from_params(&mut p).unwrap();
    p.finish().unwrap();
    let c = &u.cfg;
    assert_eq!((c.mac, c.gw_mac), (Some([2, 0, 0, 0, 0, 1]), [None, Some([10, 11, 12, 13, 14, 15])]));
    assert_eq!((c.n6_addr, c.ttl_decrement, c.mtu, c.error_pps), (Ipv4Addr::new(192, 0, 2, 6), true, 1500, 0));
    let a6: std::net::Ipv6Addr = "2001:db8:3::1".parse().unwrap();
    assert_eq!((c.addr6, c.buffer_total), ([Some(a6.octets()), None], 16));
    let u = Upf::from_params(&mut params(&[])).unwrap();
    assert_eq!((u.cfg.n6_addr, u.cfg.ttl_decrement, u.cfg.mac), (u.cfg.n3_addr, false, None));
    for (k, v) in [
        ("mac", "02:00:00:00:01"),
        ("n3_gw_mac", "zz:00:00:00:00:01"),
        ("n6_addr", "x"),
        ("ttl", "no"),
        ("n6_addr6", "192.0.2.1"),
        ("gtpu_echo_ms", "-1"),
    ] {
        let e = Upf::from_params(&mut params(&[(k, v)])).unwrap_err().to_string();
        assert!(e.contains(k) && !e.contains('\n'), "{e}");
    }
}

/// Held packets follow their FAR across rule sets (issue 32 item 4): a
/// buffering FAR keeps them, the session's total bound holds, a FAR that
/// forwards queues them in arrival order, a removed session frees every
/// slot (counted), so the store never leaks.
#[test]
fn held_packets_follow_their_far_and_are_freed_with_it() {
    let mut s = spec();
    s.fars[0].action = FarAction::Buffer;
    s.bar = Some(BarSpec { id: 1, packets: Some(3), duration_ms: None });
    let mut u = upf(&[s.clone()], UpfConfig { buffer_total: 4, ..Default::default() });
    let inner = udp_payload(UE, DN, 4000, 80);
    let frames: Vec<_> = (0..5u64).map(|k| (gtpu4(GNB, N3, 100, Some(9), &inner), k)).collect();
    run(&mut u, &frames);
    let c = u.upf_counters();
    assert_eq!((c.buffered, c.buffer_full, u.held.in_use()), (3, 2, 3), "the BAR's count");
    // Still buffering under a new rule set: kept.
    u.set_rules(Arc::new(RuleSet::compile(&[s.clone()]).unwrap()));
    assert_eq!((u.held.in_use(), u.held.queue.n, u.upf_counters().buffer_discarded), (3, 0, 0));
    // Forwarding: queued, oldest first.
    s.fars[0].action = FarAction::Forward;
    u.set_rules(Arc::new(RuleSet::compile(&[s.clone()]).unwrap()));
    assert_eq!(u.held.queue.n, 3);
    let times: Vec<u64> = std::iter::successors(Some(u.held.queue.head), |&k| {
        let n = u.held.next_of(k);
        (n != NONE).then_some(n)
    })
    .map(|k| u.held.ts[k as usize])
    .collect();
    assert_eq!(times, vec![0, 1, 2]);
    // The session removed: every slot back, counted.
    u.set_rules(Arc::new(RuleSet::default()));
    assert_eq!((u.held.in_use(), u.held.queue.n, u.upf_counters().buffer_discarded), (0, 0, 3));
}
