//! The `upf`'s compiled, interned PDR classifier (`upf::cls`, reached through
//! the index slots) against the general path (`RuleSet::classify` over PDRs
//! and SDF filters) on random rule sets: several sessions sharing or not
//! sharing their PDRs' match fields, IPv4 and IPv6 UE addresses (an
//! IPv4-mapped one too), one or several local F-TEIDs, PDRs with and without
//! the UE address match, QFIs, zero to three SDF filters each (`in` and
//! `out`, protocol or `ip`, `any`, `assigned`, IPv4 and IPv6 prefixes, port
//! ranges); random IPv4 and IPv6 packets both ways. `upf_model.rs` checks the
//! NF's choice against an independent model.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use flowplane_nf::upf::rules::{ip128, FarAction, FarSpec, Fields, Hot, Iface, PdrSpec, RuleSet, SessionSpec};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Rule {
    precedence: u32,
    uplink: bool,
    teid: Option<u32>,
    ue_ip: bool,
    qfi: Option<u8>,
    sdf: Vec<String>,
}

#[derive(Clone, Debug)]
struct Ue {
    v4: bool,
    v6: bool,
    mapped6: bool,
}

fn ue4(k: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, 45, 0, 1 + k as u8)
}

fn ue6(k: u32, mapped: bool) -> Ipv6Addr {
    if mapped {
        Ipv4Addr::new(10, 46, 0, 1 + k as u8).to_ipv6_mapped()
    } else {
        Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1 + k as u16)
    }
}

fn remote_end() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("any".to_string()),
        (0u32..4, prop::sample::select(vec![0u8, 24, 30, 32])).prop_map(|(a, l)| format!("203.0.113.{}/{l}", a * 4)),
        prop::sample::select(vec![
            "2001:db8::/32",
            "2001:db8::5",
            "::/0",
            "::/8",
            "1::/16",
            "::ffff:203.0.113.0/120",
            "::ffff:203.0.113.4/126",
        ])
        .prop_map(String::from),
    ]
}

fn ue_end() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just("assigned".to_string()),
        1 => Just("any".to_string()),
        1 => prop::sample::select(vec!["10.45.0.0/16", "10.45.0.1", "10.46.0.0/24", "2001:db8:1::/64", "::ffff:10.46.0.1"])
            .prop_map(String::from),
    ]
}

fn ports() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), (0u16..8, 0u16..8).prop_map(|(a, b)| format!(" {}-{}", a.min(b), a.max(b)))]
}

fn filter() -> impl Strategy<Value = String> {
    (any::<bool>(), prop::sample::select(vec!["ip", "6", "17"]), remote_end(), ports(), ue_end(), ports()).prop_map(
        |(out, proto, remote, rp, ue, up)| {
            if out {
                format!("permit out {proto} from {remote}{rp} to {ue}{up}")
            } else {
                format!("permit in {proto} from {ue}{up} to {remote}{rp}")
            }
        },
    )
}

fn rule() -> impl Strategy<Value = Rule> {
    (
        0u32..6,
        any::<bool>(),
        prop::option::of(prop::sample::select(vec![7u32, 8])),
        prop::bool::weighted(0.8),
        prop::option::of(0u8..3),
        prop::collection::vec(filter(), 0..4),
    )
        .prop_map(|(precedence, uplink, teid, ue_ip, qfi, sdf)| Rule { precedence, uplink, teid, ue_ip, qfi, sdf })
}

fn ue() -> impl Strategy<Value = Ue> {
    prop_oneof![
        4 => Just(Ue { v4: true, v6: false, mapped6: false }),
        1 => Just(Ue { v4: false, v6: true, mapped6: false }),
        1 => Just(Ue { v4: true, v6: true, mapped6: false }),
        1 => Just(Ue { v4: true, v6: true, mapped6: true }),
    ]
}

/// Session `k`: the rules (TEIDs shifted by 10 k; with `one_teid`, every
/// F-TEID is the first), UE addresses of `ue`.
fn session(k: u32, rules: &[Rule], ue: &Ue, one_teid: bool) -> SessionSpec {
    let pdrs = rules
        .iter()
        .enumerate()
        .map(|(i, r)| PdrSpec {
            id: i as u16 + 1,
            precedence: r.precedence,
            source: if r.uplink { Iface::Access } else { Iface::Core },
            teid: r.teid.filter(|_| r.uplink).map(|t| if one_teid { 7 + 10 * k } else { t + 10 * k }),
            ue_ip: r.ue_ip,
            qfi: r.qfi,
            sdf: r.sdf.clone(),
            outer_header_removal: r.uplink,
            far: 1,
            qers: vec![],
            urrs: vec![],
        })
        .collect();
    SessionSpec {
        seid: u64::from(k) + 1,
        ue_ipv4: ue.v4.then(|| ue4(k)),
        ue_ipv6: ue.v6.then(|| ue6(k, ue.mapped6)),
        pdrs,
        fars: vec![FarSpec {
            id: 1,
            action: FarAction::Forward,
            destination: None,
            ohc_teid: None,
            ohc_addr: None,
            tos: None,
            notify_cp: false,
        }],
        qers: vec![],
        urrs: vec![],
        bar: None,
    }
}

#[derive(Clone, Debug)]
struct Packet {
    uplink: bool,
    session: u32,
    teid: u32,
    qfi: Option<u8>,
    proto: u8,
    /// 0: the UE's IPv4, 1: its IPv6, 2: another IPv4, 3: another IPv6.
    ue: u8,
    remote: u8,
    ue_port: u16,
    remote_port: u16,
}

fn packet() -> impl Strategy<Value = Packet> {
    (any::<bool>(), 0u32..3, prop::sample::select(vec![7u32, 8, 9]), prop::option::of(0u8..3)).prop_flat_map(
        |(uplink, session, teid, qfi)| {
            (prop::sample::select(vec![6u8, 17, 1]), 0u8..4, 0u8..20, 0u16..9, 0u16..9).prop_map(
                move |(proto, ue, remote, ue_port, remote_port)| Packet {
                    uplink,
                    session,
                    teid: teid + 10 * session,
                    qfi,
                    proto,
                    ue,
                    remote,
                    ue_port,
                    remote_port,
                },
            )
        },
    )
}

impl Packet {
    fn fields(&self, ue: &Ue) -> Fields {
        let k = self.session;
        let v6 = self.ue % 2 == 1;
        let ue_addr: IpAddr = match self.ue {
            0 => ue4(k).into(),
            1 => ue6(k, ue.mapped6).into(),
            2 => Ipv4Addr::new(10, 45, 0, 200).into(),
            _ => Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x99).into(),
        };
        // An IPv4 packet has IPv4 ends (an IPv4-mapped UE IPv6 address is IPv4 on the wire).
        let v4_packet = !v6 || ip128(ue_addr) >> 32 == 0xffff;
        let remote: IpAddr = match (v4_packet, self.remote) {
            (true, r) => Ipv4Addr::new(203, 0, 113, r).into(),
            (false, r) if r < 10 => Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, u16::from(r)).into(),
            (false, r) => Ipv6Addr::new(0x1, 0, 0, 0, 0, 0, 0, u16::from(r)).into(),
        };
        Fields {
            proto: self.proto,
            ue: ip128(ue_addr),
            remote: ip128(remote),
            ue_port: if self.proto == 1 { 0 } else { self.ue_port },
            remote_port: if self.proto == 1 { 0 } else { self.remote_port },
        }
    }
}

fn check(
    sessions: usize,
    rules: &[Rule],
    ues: &[Ue],
    one_teid: bool,
    packets: &[Packet],
) -> Result<u32, TestCaseError> {
    let specs: Vec<SessionSpec> =
        (0..sessions).map(|k| session(k as u32, rules, &ues[k % ues.len()], one_teid)).collect();
    let rs = RuleSet::compile(&specs).map_err(TestCaseError::fail)?;
    let mut fast = 0;
    for p in packets {
        if p.session as usize >= sessions {
            continue;
        }
        let f = p.fields(&ues[p.session as usize % ues.len()]);
        let (want, got, hot) = if p.uplink {
            let want =
                rs.session_by_teid(p.teid).and_then(|s| rs.classify(&rs.sessions[s as usize], true, p.teid, p.qfi, &f));
            let slot = rs.teids.get(p.teid);
            let got = slot.and_then(|e| rs.classify_hot(&e.hot, e.ue4, true, p.teid, p.qfi, &f));
            (want, got, slot.map(|e| e.hot))
        } else {
            // Downlink: the UE end is the destination, which finds the session.
            let want = rs.session_by_ue(f.ue).and_then(|s| rs.classify(&rs.sessions[s as usize], false, 0, None, &f));
            let slot = rs.ues.get(f.ue);
            let got = slot.and_then(|e| rs.classify_hot(&e.hot, 0, false, 0, None, &f));
            (want, got, slot.map(|e| e.hot))
        };
        prop_assert_eq!(got, want, "packet {:?} fields {:?} hot {:?}", p, f, hot);
        if hot.is_some_and(|h| h.flags & Hot::FAST != 0) && f.ue >> 32 == 0xffff && f.remote >> 32 == 0xffff {
            fast += 1;
        }
    }
    // The sessions share their PDRs' match fields: those are compiled once.
    let blocks =
        |up: bool| rules.iter().filter(|r| r.uplink == up).map(|r| r.sdf.len().max(1)).sum::<usize>().div_ceil(8);
    prop_assert!(rs.cls.len() <= blocks(true) + blocks(false));
    Ok(fast)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn compiled_classifier_agrees_with_the_general_path(
        sessions in 1usize..4,
        rules in prop::collection::vec(rule(), 1..10),
        ues in prop::collection::vec(ue(), 1..3),
        one_teid in any::<bool>(),
        packets in prop::collection::vec(packet(), 1..60),
    ) {
        check(sessions, &rules, &ues, one_teid, &packets)?;
    }
}

/// The compiled path is taken (not only the general one) on most IPv4 packets of plain sessions.
#[test]
fn compiled_path_covers_ipv4_sessions() {
    let rules = vec![
        Rule {
            precedence: 1,
            uplink: true,
            teid: Some(7),
            ue_ip: true,
            qfi: Some(1),
            sdf: vec!["permit out 17 from 203.0.113.0/24 1-3 to assigned".into()],
        },
        Rule { precedence: 2, uplink: true, teid: Some(7), ue_ip: true, qfi: None, sdf: vec![] },
        Rule {
            precedence: 1,
            uplink: false,
            teid: None,
            ue_ip: true,
            qfi: None,
            sdf: vec!["permit out ip from any to assigned".into()],
        },
    ];
    let ue = [Ue { v4: true, v6: false, mapped6: false }];
    let packets: Vec<Packet> = (0..40)
        .map(|i| Packet {
            uplink: i % 2 == 0,
            session: i % 3,
            teid: 7 + 10 * (i % 3),
            qfi: Some((i % 3) as u8),
            proto: 17,
            ue: 0,
            remote: (i % 7) as u8,
            ue_port: 1,
            remote_port: (i % 5) as u16,
        })
        .collect();
    let rs = RuleSet::compile(&(0..3).map(|k| session(k, &rules, &ue[0], true)).collect::<Vec<_>>()).unwrap();
    // Three sessions, one uplink and one downlink classifier (a block each) between them.
    assert_eq!(rs.cls.len(), 2);
    let fast = check(3, &rules, &ue, true, &packets).unwrap();
    assert_eq!(fast, 40);
}
