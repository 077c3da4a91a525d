//! PDR classification of the `upf` NF against an independent model on
//! random rule sets: random PDRs (precedence, local F-TEID, QFI, SDF
//! filters as flow-description text: protocol, remote and UE prefixes, port
//! ranges) and random packets; the model scans every PDR with plain IPv4
//! arithmetic and picks the lowest precedence (ties: provisioning order).
//! The packets go through the real NF (uplink GTP-U and downlink IP), whose
//! URR per PDR shows which PDR took each packet: IPv4 packets of a session
//! with one local F-TEID take the compiled classifier, the others the general path.

use std::net::Ipv4Addr;
use std::sync::Arc;

use flowplane_nf::testutil::{gtpu4, ipv4_frame};
use flowplane_nf::upf::rules::{FarAction, FarSpec, Iface, PdrSpec, RuleSet, SessionSpec, UrrSpec};
use flowplane_nf::upf::{Upf, UpfConfig};
use flowplane_nf::{Nf, NfContext};
use flowplane_packet::{Batch, PacketPool, PoolConfig};
use proptest::prelude::*;

const UE: u32 = 0x0a2d_0001;

#[derive(Clone, Debug)]
struct Filter {
    proto: Option<u8>,
    remote: (u32, u8),
    ue: Option<(u32, u8)>,
    rports: (u16, u16),
    uports: Option<(u16, u16)>,
}

#[derive(Clone, Debug)]
struct Rule {
    precedence: u32,
    uplink: bool,
    teid: Option<u32>,
    qfi: Option<u8>,
    filters: Vec<Filter>,
}

#[derive(Clone, Debug)]
struct Packet {
    uplink: bool,
    teid: u32,
    qfi: Option<u8>,
    proto: u8,
    remote: u32,
    rport: u16,
    uport: u16,
}

fn in_prefix(a: u32, (p, len): (u32, u8)) -> bool {
    len == 0 || (a >> (32 - u32::from(len))) == (p >> (32 - u32::from(len)))
}

impl Filter {
    fn text(&self) -> String {
        let proto = self.proto.map_or("ip".to_string(), |p| p.to_string());
        let ue = match self.ue {
            Some((a, l)) => format!("{}/{l}", Ipv4Addr::from(a)),
            None => "assigned".into(),
        };
        let uports = self.uports.map_or(String::new(), |(a, b)| format!(" {a}-{b}"));
        let (ra, rl) = self.remote;
        format!(
            "permit out {proto} from {}/{rl} {}-{} to {ue}{uports}",
            Ipv4Addr::from(ra),
            self.rports.0,
            self.rports.1
        )
    }

    fn matches(&self, p: &Packet) -> bool {
        self.proto.is_none_or(|x| x == p.proto)
            && in_prefix(p.remote, self.remote)
            && self.ue.is_none_or(|u| in_prefix(UE, u))
            && (self.rports.0..=self.rports.1).contains(&p.rport)
            && self.uports.is_none_or(|(a, b)| (a..=b).contains(&p.uport))
    }
}

/// The model: the index of the winning rule (`teids`: the session's local F-TEIDs).
fn model(rules: &[Rule], teids: &[u32], p: &Packet) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, r) in rules.iter().enumerate() {
        let ok = r.uplink == p.uplink
            && (!p.uplink || teids.contains(&p.teid))
            && (!p.uplink || r.teid.is_none_or(|t| t == p.teid))
            && (!p.uplink || r.qfi.is_none_or(|q| Some(q) == p.qfi))
            && (r.filters.is_empty() || r.filters.iter().any(|f| f.matches(p)));
        if ok && best.is_none_or(|b| r.precedence < rules[b].precedence) {
            best = Some(i);
        }
    }
    best
}

fn small_addr() -> impl Strategy<Value = u32> {
    // Few distinct remote addresses so prefixes hit often.
    (0u32..4, 0u32..4).prop_map(|(a, b)| 0xcb00_7100 | (a << 4) | b)
}

fn port_range() -> impl Strategy<Value = (u16, u16)> {
    (0u16..40, 0u16..40).prop_map(|(a, b)| (a.min(b), a.max(b)))
}

fn filter() -> impl Strategy<Value = Filter> {
    (
        prop::option::of(prop::sample::select(vec![6u8, 17])),
        (small_addr(), prop::sample::select(vec![0u8, 24, 28, 30, 32])),
        prop::option::of(prop::sample::select(vec![(UE, 32u8), (UE, 16), (0x0b00_0000, 8)])),
        port_range(),
        prop::option::of(port_range()),
    )
        .prop_map(|(proto, remote, ue, rports, uports)| Filter { proto, remote, ue, rports, uports })
}

fn rule() -> impl Strategy<Value = Rule> {
    (
        0u32..8,
        any::<bool>(),
        prop::option::of(prop::sample::select(vec![7u32, 8])),
        prop::option::of(0u8..3),
        prop::collection::vec(filter(), 0..3),
    )
        .prop_map(|(precedence, uplink, teid, qfi, filters)| Rule { precedence, uplink, teid, qfi, filters })
}

fn packet() -> impl Strategy<Value = Packet> {
    (
        any::<bool>(),
        prop::sample::select(vec![7u32, 8]),
        prop::option::of(0u8..3),
        prop::sample::select(vec![6u8, 17]),
        small_addr(),
        0u16..40,
        0u16..40,
    )
        .prop_map(|(uplink, teid, qfi, proto, remote, rport, uport)| Packet {
            uplink,
            teid,
            qfi,
            proto,
            remote,
            rport,
            uport,
        })
}

fn session(rules: &[Rule], teids: &[u32]) -> SessionSpec {
    // PDRs of the lowest priority that match nothing (protocol 99) make the
    // session own `teids` whatever the random rules name.
    let mut pdrs: Vec<PdrSpec> = rules
        .iter()
        .enumerate()
        .map(|(i, r)| PdrSpec {
            id: i as u16 + 1,
            precedence: r.precedence,
            source: if r.uplink { Iface::Access } else { Iface::Core },
            teid: if r.uplink { r.teid } else { None },
            ue_ip: true,
            qfi: if r.uplink { r.qfi } else { None },
            sdf: r.filters.iter().map(Filter::text).collect(),
            outer_header_removal: r.uplink,
            far: 1,
            qers: vec![],
            urrs: vec![i as u32 + 1],
        })
        .collect();
    for (k, &teid) in teids.iter().enumerate() {
        pdrs.push(PdrSpec {
            id: 1000 + k as u16,
            precedence: 1000,
            source: Iface::Access,
            teid: Some(teid),
            ue_ip: true,
            qfi: None,
            sdf: vec!["permit out 99 from any to assigned".into()],
            outer_header_removal: true,
            far: 2,
            qers: vec![],
            urrs: vec![],
        });
    }
    SessionSpec {
        seid: 1,
        ue_ipv4: Some(Ipv4Addr::from(UE)),
        ue_ipv6: None,
        pdrs,
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
                action: FarAction::Drop,
                destination: None,
                ohc_teid: None,
                ohc_addr: None,
                tos: None,
                notify_cp: false,
            },
        ],
        qers: vec![],
        urrs: (0..rules.len())
            .map(|i| UrrSpec { id: i as u32 + 1, volume_threshold: None, ..Default::default() })
            .collect(),
        bar: None,
    }
}

fn frame(p: &Packet) -> Vec<u8> {
    let mut l4 = vec![0u8; 20];
    let (ue, remote) = (UE.to_be_bytes(), p.remote.to_be_bytes());
    if p.uplink {
        l4[0..2].copy_from_slice(&p.uport.to_be_bytes());
        l4[2..4].copy_from_slice(&p.rport.to_be_bytes());
    } else {
        l4[0..2].copy_from_slice(&p.rport.to_be_bytes());
        l4[2..4].copy_from_slice(&p.uport.to_be_bytes());
    }
    if p.proto == 6 {
        l4[12] = 5 << 4;
    } else {
        l4[4..6].copy_from_slice(&20u16.to_be_bytes());
    }
    if p.uplink {
        let inner = ipv4_frame(ue, remote, p.proto, &l4);
        gtpu4([198, 51, 100, 1], [192, 0, 2, 1], p.teid, p.qfi, &inner[14..])
    } else {
        ipv4_frame(remote, ue, p.proto, &l4)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// `one_teid`: every F-TEID is 7, so the session has one and its uplink
    /// takes the compiled classifier (`upf::cls`); with TEIDs 7 and 8, the general path.
    #[test]
    fn pdr_matching_agrees_with_the_model(
        rules in prop::collection::vec(rule(), 1..10),
        packets in prop::collection::vec(packet(), 1..40),
        one_teid in any::<bool>(),
    ) {
        let mut rules = rules;
        let teids: &[u32] = if one_teid { &[7] } else { &[7, 8] };
        if one_teid {
            for r in &mut rules {
                r.teid = r.teid.map(|_| 7);
            }
        }
        let rs = RuleSet::compile(&[session(&rules, teids)]).unwrap();
        // Unknown TEIDs dropped, not answered (Error Indications are tested in upf_n3n6.rs).
        let mut upf = Upf::new(UpfConfig { error_pps: 0, ..UpfConfig::default() }, Arc::new(rs));
        let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
        for p in &packets {
            let want = model(&rules, teids, p);
            let mut b = Batch::new(&pool);
            prop_assert!(b.push_copy(&mut pool, &frame(p), 0));
            let before: Vec<u64> = upf.usage().map(|(_, u)| u.ul_packets + u.dl_packets).collect();
            upf.process(&mut b, 0..1, &NfContext::default());
            let after: Vec<u64> = upf.usage().map(|(_, u)| u.ul_packets + u.dl_packets).collect();
            let got = before.iter().zip(&after).position(|(a, b)| a != b);
            prop_assert_eq!(got, want, "packet {:?}", p);
            prop_assert_eq!(b.is_dropped(0), want.is_none());
            b.free_all(&mut pool).unwrap();
        }
    }
}
