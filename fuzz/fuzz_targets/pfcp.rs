//! PFCP endpoint (the UPF's N4 side): any datagram is discarded or answered
//! with a well-formed PFCP response carrying a cause (heartbeat and
//! version-not-supported responses excepted); never a panic. The endpoint
//! starts with one session and an association with the sender, so session
//! requests reach the Create/Update/Remove decoders and the rule compiler.
#![no_main]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use flowplane_nf::upf::control::{Endpoint, UpfControl};
use flowplane_nf::upf::pfcp::{self, ie, msg};
use flowplane_nf::upf::rules::{RuleSet, SessionSpec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let seed = SessionSpec { seid: 1, ue_ipv4: Some(Ipv4Addr::new(10, 0, 0, 1)), ..Default::default() };
    let ctl = UpfControl::new(Arc::new(RuleSet::default()));
    let mut ep = Endpoint::new(Ipv4Addr::new(192, 0, 2, 1), &[seed], ctl);
    let from = SocketAddr::from(([127, 0, 0, 1], 8805));
    let mut setup = pfcp::Writer::message(msg::ASSOC_SETUP_REQ, None, 0xff_ffff);
    setup.ie(ie::NODE_ID, &pfcp::enc::node_id_v4(Ipv4Addr::LOCALHOST)).ie(ie::RECOVERY_TIME_STAMP, &[0, 0, 0, 1]);
    ep.handle(&setup.finish(), from);
    // Two messages per input: the second sees the state the first left.
    let (a, b) = data.split_at(data.len() / 2);
    for m in [a, b, data] {
        let Some(rsp) = ep.handle(m, from) else { continue };
        let (h, body) = pfcp::parse_header(&rsp).expect("responses are well-formed");
        let ies = pfcp::ies(body).expect("response IEs are well-formed");
        if !matches!(h.msg_type, msg::HEARTBEAT_RSP | msg::VERSION_NOT_SUPPORTED) {
            assert!(ies.iter().any(|i| i.ty == ie::CAUSE), "a response carries a cause");
        }
    }
    let _ = ep.report_requests();
});
