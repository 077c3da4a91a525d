//! The `upf` driven over PFCP on loopback, as an SMF would: heartbeat,
//! association, a session established (the UPF chooses the uplink F-TEID),
//! modified (a PDR added, the downlink FAR changed to drop) and deleted,
//! with traffic through the data path between the messages changing its
//! forwarding accordingly; a URR threshold raises a Session Report Request;
//! malformed and unknown requests get the right cause codes.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use flowplane_nf::testutil::{gtpu4, udp4};
use flowplane_nf::upf::control::{self, UpfControl};
use flowplane_nf::upf::pfcp::{self, cause, enc, ie, msg, Writer};
use flowplane_nf::upf::rules::RuleSet;
use flowplane_nf::upf::{Upf, UpfConfig};
use flowplane_nf::{Nf, NfContext};
use flowplane_packet::{Batch, PacketPool, PoolConfig};

const N3: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const UE: [u8; 4] = [10, 45, 0, 1];
const GNB: [u8; 4] = [198, 51, 100, 10];
const DN: [u8; 4] = [203, 0, 113, 5];

struct Smf {
    sock: UdpSocket,
    upf: SocketAddr,
    seq: u32,
}

/// A decoded response: header and its top-level IEs (owned).
struct Rsp {
    h: pfcp::Header,
    ies: Vec<(u16, Vec<u8>)>,
}

impl Rsp {
    fn get(&self, t: u16) -> Option<&[u8]> {
        self.ies.iter().find(|i| i.0 == t).map(|i| i.1.as_slice())
    }
    fn cause(&self) -> u8 {
        self.get(ie::CAUSE).expect("cause IE")[0]
    }
}

fn decode(b: &[u8]) -> Rsp {
    let (h, body) = pfcp::parse_header(b).expect("a PFCP message");
    let ies = pfcp::ies(body).unwrap().into_iter().map(|i| (i.ty, i.value.to_vec())).collect();
    Rsp { h, ies }
}

impl Smf {
    fn send_raw(&mut self, m: &[u8]) -> Option<Rsp> {
        self.sock.send_to(m, self.upf).unwrap();
        let mut buf = [0u8; 4096];
        loop {
            match self.sock.recv_from(&mut buf) {
                Ok((n, _)) => {
                    let r = decode(&buf[..n]);
                    if r.h.msg_type == msg::SESS_REPORT_REQ {
                        continue; // collected separately
                    }
                    return Some(r);
                }
                Err(_) => return None,
            }
        }
    }

    fn send(&mut self, w: Writer) -> Rsp {
        self.send_raw(&w.finish()).expect("a response")
    }

    fn msg(&mut self, t: u8, seid: Option<u64>) -> Writer {
        self.seq += 1;
        Writer::message(t, seid, self.seq)
    }
}

fn run(u: &mut Upf, frames: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    let mut pool = PacketPool::new(PoolConfig { buffers: 64, ..Default::default() }).unwrap();
    let mut b = Batch::new(&pool);
    for f in frames {
        assert!(b.push_copy(&mut pool, f, 0));
    }
    let n = b.len();
    u.process(&mut b, 0..n, &NfContext::default());
    let out = (0..n).map(|i| (!b.is_dropped(i)).then(|| b.data(i).to_vec())).collect();
    b.free_all(&mut pool).unwrap();
    out
}

fn create_pdr(w: &mut Writer, id: u16, prec: u32, uplink: bool, teid: Option<u32>, sdf: &str, far: u32) {
    w.group(ie::CREATE_PDR).ie(ie::PDR_ID, &id.to_be_bytes()).ie(ie::PRECEDENCE, &prec.to_be_bytes());
    w.group(ie::PDI).ie(ie::SOURCE_INTERFACE, &[if uplink { 0 } else { 1 }]);
    if uplink {
        match teid {
            Some(t) => w.ie(ie::F_TEID, &enc::fteid(t, N3)),
            None => w.ie(ie::F_TEID, &[0x05]), // CH: the UPF chooses
        };
    }
    w.ie(ie::UE_IP_ADDRESS, &enc::ue_ip_v4(UE.into())).ie(ie::SDF_FILTER, &enc::sdf(sdf)).end();
    if uplink {
        w.ie(ie::OUTER_HEADER_REMOVAL, &[0]);
    }
    w.ie(ie::FAR_ID, &far.to_be_bytes()).ie(ie::URR_ID, &1u32.to_be_bytes()).end();
}

fn teid_of(f: &[u8]) -> u32 {
    u32::from_be_bytes([f[46], f[47], f[48], f[49]])
}

#[test]
fn session_lifecycle_over_pfcp_changes_forwarding() {
    let ctl = UpfControl::new(Arc::new(RuleSet::default()));
    let server = control::spawn("127.0.0.1:0", N3, &[], &ctl).unwrap();
    let mut upf = Upf::with_control(UpfConfig::default(), Arc::clone(&ctl));
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut smf = Smf { sock, upf: server.addr, seq: 0 };
    let smf_node = enc::node_id_v4(Ipv4Addr::LOCALHOST);

    // Heartbeat: a Recovery Time Stamp comes back.
    let m = smf.msg(msg::HEARTBEAT_REQ, None);
    let r = smf.send(m);
    assert_eq!(r.h.msg_type, msg::HEARTBEAT_RSP);
    assert_eq!(r.get(ie::RECOVERY_TIME_STAMP).map(<[u8]>::len), Some(4));

    let establish = |smf: &mut Smf| {
        let mut w = smf.msg(msg::SESS_EST_REQ, Some(0));
        w.ie(ie::NODE_ID, &smf_node).ie(ie::F_SEID, &enc::fseid(0xcafe, Ipv4Addr::LOCALHOST));
        create_pdr(&mut w, 1, 10, true, None, "permit out 17 from any 53 to assigned", 1);
        create_pdr(&mut w, 2, 10, false, None, "permit out ip from any to assigned", 2);
        w.group(ie::CREATE_FAR).ie(ie::FAR_ID, &1u32.to_be_bytes()).ie(ie::APPLY_ACTION, &[0x02]);
        w.group(ie::FORWARDING_PARAMETERS).ie(ie::DESTINATION_INTERFACE, &[1]).end().end();
        w.group(ie::CREATE_FAR).ie(ie::FAR_ID, &2u32.to_be_bytes()).ie(ie::APPLY_ACTION, &[0x02]);
        w.group(ie::FORWARDING_PARAMETERS).ie(ie::DESTINATION_INTERFACE, &[0]);
        w.ie(ie::OUTER_HEADER_CREATION, &enc::ohc_gtpu_v4(0x77, GNB.into())).end().end();
        w.group(ie::CREATE_URR).ie(ie::URR_ID, &1u32.to_be_bytes());
        w.ie(ie::VOLUME_THRESHOLD, &enc::total_volume(400)).end();
        smf.send(w)
    };
    // No association yet.
    assert_eq!(establish(&mut smf).cause(), cause::NO_ASSOCIATION);
    let mut m = smf.msg(msg::ASSOC_SETUP_REQ, None);
    m.ie(ie::NODE_ID, &smf_node).ie(ie::RECOVERY_TIME_STAMP, &[0, 0, 0, 1]);
    let r = smf.send(m);
    assert_eq!((r.h.msg_type, r.cause()), (msg::ASSOC_SETUP_RSP, cause::ACCEPTED));
    assert!(r.get(ie::NODE_ID).is_some() && r.get(ie::RECOVERY_TIME_STAMP).is_some());

    let r = establish(&mut smf);
    assert_eq!((r.h.msg_type, r.h.seid, r.cause()), (msg::SESS_EST_RSP, Some(0xcafe), cause::ACCEPTED));
    let up_seid = pfcp::decode_fseid(r.get(ie::F_SEID).unwrap()).unwrap();
    let created = pfcp::ies(r.get(ie::CREATED_PDR).expect("Created PDR")).unwrap();
    let teid = match pfcp::decode_fteid(created.iter().find(|i| i.ty == ie::F_TEID).unwrap().value).unwrap() {
        pfcp::FTeid::Teid(t) => t,
        pfcp::FTeid::Choose => panic!("a chosen TEID"),
    };

    let dns = gtpu4(GNB, N3.octets(), teid, Some(9), &udp4(UE, DN, 4000, 53)[14..]);
    let web = gtpu4(GNB, N3.octets(), teid, Some(9), &udp4(UE, DN, 4000, 80)[14..]);
    let down = udp4(DN, UE, 53, 4000);
    let out = run(&mut upf, &[dns.clone(), web.clone(), down.clone()]);
    assert_eq!(out[0].as_ref().map(|f| f[14..].to_vec()), Some(udp4(UE, DN, 4000, 53)[14..].to_vec()));
    assert!(out[1].is_none(), "no PDR for port 80 yet");
    assert_eq!(teid_of(out[2].as_ref().expect("encapsulated")), 0x77);

    // Modify: a PDR for port 80 on the same F-TEID, and the downlink FAR to drop.
    let mut w = smf.msg(msg::SESS_MOD_REQ, Some(up_seid));
    create_pdr(&mut w, 3, 50, true, Some(teid), "permit out 17 from any 80 to assigned", 1);
    w.group(ie::UPDATE_FAR).ie(ie::FAR_ID, &2u32.to_be_bytes()).ie(ie::APPLY_ACTION, &[0x01]).end();
    let r = smf.send(w);
    assert_eq!((r.h.seid, r.cause()), (Some(0xcafe), cause::ACCEPTED));
    let out = run(&mut upf, &[dns.clone(), web.clone(), down.clone()]);
    assert!(out[0].is_some() && out[1].is_some() && out[2].is_none());
    assert_eq!(upf.upf_counters().far_drop, 1);

    // A rejected change leaves the session as it was: FAR 9 does not exist.
    let mut w = smf.msg(msg::SESS_MOD_REQ, Some(up_seid));
    w.group(ie::UPDATE_PDR).ie(ie::PDR_ID, &1u16.to_be_bytes()).ie(ie::FAR_ID, &9u32.to_be_bytes()).end();
    assert_eq!(smf.send(w).cause(), cause::RULE_FAILURE);
    assert!(run(&mut upf, std::slice::from_ref(&dns))[0].is_some());

    // The URR (threshold 400 bytes of IP) raises reports; the endpoint sends them.
    assert!(run(&mut upf, &vec![dns.clone(); 10]).iter().all(Option::is_some));
    let (mut reports, mut buf) = (0, [0u8; 2048]);
    while let Ok((n, _)) = smf.sock.recv_from(&mut buf) {
        let r = decode(&buf[..n]);
        assert_eq!((r.h.msg_type, r.h.seid), (msg::SESS_REPORT_REQ, Some(0xcafe)));
        let ur = pfcp::ies(r.get(ie::USAGE_REPORT_SRR).unwrap()).unwrap();
        assert_eq!(ur.iter().find(|i| i.ty == ie::URR_ID).unwrap().value, &1u32.to_be_bytes());
        reports += 1;
        let mut w = Writer::message(msg::SESS_REPORT_RSP, Some(up_seid), r.h.seq);
        w.ie(ie::CAUSE, &[cause::ACCEPTED]);
        smf.sock.send_to(&w.finish(), smf.upf).unwrap();
        smf.sock.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    }
    assert!(reports >= 1, "a Session Report Request");
    smf.sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();

    // Errors: unknown session, missing mandatory IE, truncated IE, bad version, garbage.
    let m = smf.msg(msg::SESS_MOD_REQ, Some(999));
    assert_eq!(smf.send(m).cause(), cause::SESSION_NOT_FOUND);
    let mut w = smf.msg(msg::SESS_MOD_REQ, Some(up_seid));
    w.group(ie::CREATE_PDR).ie(ie::PDR_ID, &7u16.to_be_bytes()).ie(ie::PRECEDENCE, &1u32.to_be_bytes()).end();
    let r = smf.send(w);
    assert_eq!(
        (r.cause(), r.get(ie::OFFENDING_IE)),
        (cause::MANDATORY_IE_MISSING, Some(&ie::FAR_ID.to_be_bytes()[..]))
    );
    let mut m = smf.msg(msg::SESS_MOD_REQ, Some(up_seid)).finish();
    m.extend_from_slice(&[0, 1, 0, 50, 1]);
    let len = (m.len() - 4) as u16;
    m[2..4].copy_from_slice(&len.to_be_bytes());
    assert_eq!(smf.send_raw(&m).unwrap().cause(), cause::INVALID_LENGTH);
    let mut m = smf.msg(msg::HEARTBEAT_REQ, None).finish();
    m[0] = 0x40;
    assert_eq!(smf.send_raw(&m).unwrap().h.msg_type, msg::VERSION_NOT_SUPPORTED);
    smf.sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    assert!(smf.send_raw(&[1, 2, 3]).is_none(), "garbage is discarded");
    smf.sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();

    // Delete: the TEID is unknown from the next batch on.
    let m = smf.msg(msg::SESS_DEL_REQ, Some(up_seid));
    assert_eq!(smf.send(m).cause(), cause::ACCEPTED);
    assert!(run(&mut upf, &[dns])[0].is_none());
    assert_eq!(upf.upf_counters().unknown_teid, 1);
    assert!(ctl.stats.rejected.load(std::sync::atomic::Ordering::Relaxed) >= 5);
}

/// A valid establishment request, for the mutation test below.
fn establishment() -> Vec<u8> {
    let mut w = Writer::message(msg::SESS_EST_REQ, Some(0), 1);
    w.ie(ie::NODE_ID, &enc::node_id_v4(Ipv4Addr::LOCALHOST)).ie(ie::F_SEID, &enc::fseid(5, Ipv4Addr::LOCALHOST));
    create_pdr(&mut w, 1, 10, true, None, "permit out 17 from 10.0.0.0/8 1-99 to assigned 80", 1);
    create_pdr(&mut w, 2, 10, false, None, "permit out ip from any to assigned", 2);
    w.group(ie::CREATE_FAR).ie(ie::FAR_ID, &1u32.to_be_bytes()).ie(ie::APPLY_ACTION, &[0x02]).end();
    w.group(ie::CREATE_FAR).ie(ie::FAR_ID, &2u32.to_be_bytes()).ie(ie::APPLY_ACTION, &[0x02]);
    w.group(ie::FORWARDING_PARAMETERS).ie(ie::OUTER_HEADER_CREATION, &enc::ohc_gtpu_v4(9, GNB.into())).end().end();
    w.group(ie::CREATE_QER).ie(ie::QER_ID, &1u32.to_be_bytes()).ie(ie::GATE_STATUS, &[0]);
    w.ie(ie::MBR, &[0, 0, 0, 1, 0, 0, 0, 0, 2, 0]).end();
    w.group(ie::CREATE_URR).ie(ie::URR_ID, &1u32.to_be_bytes()).ie(ie::VOLUME_THRESHOLD, &enc::total_volume(9)).end();
    w.finish()
}

mod mutations {
    use super::*;
    use flowplane_nf::upf::control::Endpoint;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Bytes of a valid request overwritten, the request cut short: the
        /// endpoint answers with a cause or discards it, never panics.
        #[test]
        fn mutated_requests_get_a_cause(edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..6), cut in any::<usize>()) {
            let ctl = UpfControl::new(Arc::new(RuleSet::default()));
            let seed = flowplane_nf::upf::rules::SessionSpec { seid: 1, ..Default::default() };
            let mut ep = Endpoint::new(N3, &[seed], ctl);
            let mut m = establishment();
            for (at, b) in edits {
                let n = m.len();
                m[at % n] = b;
            }
            let n = m.len();
            m.truncate(cut % (n + 1));
            if let Some(rsp) = ep.handle(&m, SocketAddr::from(([127, 0, 0, 1], 1))) {
                let (h, body) = pfcp::parse_header(&rsp).unwrap();
                let ies = pfcp::ies(body).unwrap();
                prop_assert!(h.msg_type == msg::VERSION_NOT_SUPPORTED || h.msg_type == msg::HEARTBEAT_RSP
                    || ies.iter().any(|i| i.ty == ie::CAUSE));
            }
        }
    }

    #[test]
    fn the_unmutated_request_is_accepted() {
        let ctl = UpfControl::new(Arc::new(RuleSet::default()));
        let seed = flowplane_nf::upf::rules::SessionSpec { seid: 1, ..Default::default() };
        let mut ep = Endpoint::new(N3, &[seed], Arc::clone(&ctl));
        let r = decode(&ep.handle(&establishment(), SocketAddr::from(([127, 0, 0, 1], 1))).unwrap());
        assert_eq!(r.cause(), cause::ACCEPTED);
        assert_eq!(ep.sessions(), 2);
        assert_eq!(ctl.current().1.sessions.len(), 2, "published");
    }
}

/// Requests handled as one burst (what the endpoint's socket loop does with
/// whatever is waiting) are compiled and published once, and every change
/// of the burst is in that publication.
#[test]
fn a_burst_of_changes_is_compiled_once() {
    let ctl = UpfControl::new(Arc::new(RuleSet::default()));
    let mut ep = control::Endpoint::new(N3, &[], Arc::clone(&ctl));
    let from: SocketAddr = "127.0.0.1:8805".parse().unwrap();
    let node = enc::node_id_v4(Ipv4Addr::LOCALHOST);
    let mut seq = 0;
    let mut msg_of = |t: u8, seid: Option<u64>| {
        seq += 1;
        Writer::message(t, seid, seq)
    };
    let mut m = msg_of(msg::ASSOC_SETUP_REQ, None);
    m.ie(ie::NODE_ID, &node).ie(ie::RECOVERY_TIME_STAMP, &[0, 0, 0, 1]);
    assert_eq!(decode(&ep.handle(&m.finish(), from).unwrap()).cause(), cause::ACCEPTED);
    let published = |c: &UpfControl| c.stats.publishes.load(std::sync::atomic::Ordering::Relaxed);
    let p0 = published(&ctl);
    let mut w = msg_of(msg::SESS_EST_REQ, Some(0));
    w.ie(ie::NODE_ID, &node).ie(ie::F_SEID, &enc::fseid(0xbeef, Ipv4Addr::LOCALHOST));
    create_pdr(&mut w, 1, 10, true, Some(0x4000), "permit out 17 from any 53 to assigned", 1);
    w.group(ie::CREATE_FAR).ie(ie::FAR_ID, &1u32.to_be_bytes()).ie(ie::APPLY_ACTION, &[0x02]);
    w.group(ie::FORWARDING_PARAMETERS).ie(ie::DESTINATION_INTERFACE, &[1]).end().end();
    w.group(ie::CREATE_URR).ie(ie::URR_ID, &1u32.to_be_bytes()).end();
    let r = decode(&ep.handle_deferred(&w.finish(), from).unwrap());
    assert_eq!(r.cause(), cause::ACCEPTED);
    let up_seid = pfcp::decode_fseid(r.get(ie::F_SEID).unwrap()).unwrap();
    for k in 0..20u16 {
        let mut w = msg_of(msg::SESS_MOD_REQ, Some(up_seid));
        let sdf = format!("permit out 17 from any {} to assigned", 1000 + k);
        create_pdr(&mut w, 10 + k, 20 + u32::from(k), true, Some(0x4000), &sdf, 1);
        assert_eq!(decode(&ep.handle_deferred(&w.finish(), from).unwrap()).cause(), cause::ACCEPTED, "{k}");
    }
    assert_eq!(published(&ctl), p0, "nothing published before the burst ends");
    ep.flush();
    assert_eq!(published(&ctl), p0 + 1, "one compile for the burst");
    assert_eq!(ctl.current().1.pdrs.len(), 21, "every change of the burst is in it");
    ep.flush();
    assert_eq!(published(&ctl), p0 + 1, "nothing more to publish");
}
