//! The UPF workload: the session file that goes with a generated UPF trace
//! (`flowplane upf sessions`, [`sessions_for`]) — built from the same plan
//! functions as the generator's `--upf` mode, so trace and rules agree.

use std::net::Ipv4Addr;

use flowplane_nf::upf::rules::{FarAction, FarSpec, Iface, PdrSpec, QerSpec, SessionSpec, SessionsFile, UrrSpec};
use flowplane_trace::gen::UpfPlan;

/// The sessions of `plan`: per session `k`, UE 10.0.0.0/8 + k + 1, uplink
/// TEID k + 1; M uplink PDRs (F-TEID, QFI, SDF of PDR j, outer-header
/// removal, FAR 1 forward to the core) and M downlink PDRs (same SDF, FAR 2
/// with outer-header creation to the session's gNB and peer TEID, QER j + 1
/// marking the PDR's QFI); every PDR counts into URR 1.
pub fn sessions_for(plan: &UpfPlan) -> SessionsFile {
    let sessions = (0..plan.sessions)
        .map(|k| {
            let mut pdrs = Vec::with_capacity(2 * plan.pdrs as usize);
            for (source, base) in [(Iface::Access, 0u16), (Iface::Core, 1000)] {
                for j in 0..plan.pdrs {
                    let ul = source == Iface::Access;
                    pdrs.push(PdrSpec {
                        id: base + j as u16 + 1,
                        precedence: UpfPlan::precedence(j),
                        source,
                        teid: ul.then(|| UpfPlan::teid(k)),
                        ue_ip: true,
                        qfi: ul.then(|| UpfPlan::qfi(j)),
                        sdf: vec![UpfPlan::sdf(j)],
                        outer_header_removal: ul,
                        far: if ul { 1 } else { 2 },
                        qer: (!ul).then_some(j + 1),
                        urr: Some(1),
                    });
                }
            }
            SessionSpec {
                seid: u64::from(k) + 1,
                ue_ipv4: Some(Ipv4Addr::from(UpfPlan::ue(k))),
                ue_ipv6: None,
                pdrs,
                fars: vec![
                    FarSpec { id: 1, action: FarAction::Forward, destination: None, ohc_teid: None, ohc_addr: None },
                    FarSpec {
                        id: 2,
                        action: FarAction::Forward,
                        destination: None,
                        ohc_teid: Some(UpfPlan::peer_teid(k)),
                        ohc_addr: Some(Ipv4Addr::from(UpfPlan::gnb(k))),
                    },
                ],
                qers: (0..plan.pdrs)
                    .map(|j| QerSpec { id: j + 1, qfi: Some(UpfPlan::qfi(j)), ..Default::default() })
                    .collect(),
                urrs: vec![UrrSpec { id: 1, volume_threshold: None }],
            }
        })
        .collect();
    SessionsFile { sessions }
}
