//! `srcctr`: source-IP statistics counter (FAJITA A.1). Like `fsc`, but the
//! state is keyed by the source address alone: every 5-tuple from one source
//! shares one counter block, which under RSS lives in a table shared between
//! cores (the FAJITA scenario for the auxiliary table). Counts packets and
//! bytes (frame lengths) and first/last seen; the table is exportable
//! (`--export srcctr=sources.csv|json`). Packets pass whatever happens; the
//! report counts those without a flow key (`unparsed`) and those without
//! state because the source table was full (`table_full`) apart.

use bytemuck::{Pod, Zeroable};
use flowplane_wire::flow::FiveTuple;
use serde_json::json;

use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::Export;
use crate::stateful::{Action, Granularity, StatefulNf};
use crate::{NfContext, ParamError, Params};

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "srcctr",
    about: "source-IP statistics counter: packets, bytes, first/last seen per source IP (exportable)",
    keyed_by: KeyedBy::Fixed(Granularity::SrcIp),
    params: &[],
};

/// Builds `srcctr` and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(SrcCtr::from_params(p)?))
}

/// Per-source counters.
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct SrcCtrState {
    /// Packets.
    pub packets: u64,
    /// Bytes (frame lengths).
    pub bytes: u64,
    /// First packet, ns since the run started.
    pub first_ns: u64,
    /// Last packet (the latest clock seen: a clock running backwards does not move it back).
    pub last_ns: u64,
}

/// The source-IP statistics counter.
#[derive(Default, Debug)]
pub struct SrcCtr {
    /// Sources whose state this instance created.
    sources: u64,
    /// Packets without a flow key (non-IP, malformed).
    unparsed: u64,
    /// Packets with a key but without state: the source table was full.
    table_full: u64,
}

impl SrcCtr {
    /// `srcctr` takes no parameters.
    pub fn from_params(_p: &mut Params) -> Result<Self, ParamError> {
        Ok(SrcCtr::default())
    }
}

impl StatefulNf for SrcCtr {
    type State = SrcCtrState;

    fn name(&self) -> &'static str {
        INFO.name
    }

    fn granularity(&self) -> Granularity {
        Granularity::SrcIp
    }

    fn init(&mut self, _pkt: &Pkt<'_>, ctx: &NfContext) -> SrcCtrState {
        self.sources += 1;
        SrcCtrState { packets: 0, bytes: 0, first_ns: ctx.now_ns, last_ns: ctx.now_ns }
    }

    #[inline]
    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut SrcCtrState, ctx: &NfContext) -> Action {
        st.packets = st.packets.wrapping_add(1);
        st.bytes = st.bytes.wrapping_add(pkt.len() as u64);
        // Cores sharing this block reach it in any order: keep the earliest
        // and the latest packet time, so the result does not depend on which core created it.
        st.first_ns = st.first_ns.min(ctx.now_ns);
        st.last_ns = st.last_ns.max(ctx.now_ns);
        Action::Pass
    }

    fn on_unparsed(&mut self) -> Action {
        self.unparsed += 1;
        Action::Pass
    }

    fn on_no_state(&mut self) -> Action {
        self.table_full += 1;
        Action::Pass
    }

    fn report(&self) -> Option<serde_json::Value> {
        Some(json!({ "sources_seen": self.sources, "unparsed": self.unparsed, "table_full": self.table_full }))
    }

    fn export_kind(&self) -> Export {
        Export::State
    }

    fn export_row(&self, key: &FiveTuple, st: &SrcCtrState) -> Option<serde_json::Value> {
        Some(json!({
            "src": key.src_ip().to_string(),
            "packets": st.packets,
            "bytes": st.bytes,
            "first_ns": st.first_ns,
            "last_ns": st.last_ns,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{tcp4, udp4, Harness};
    use flowplane_wire::tcp::TcpFlags;

    #[test]
    fn flows_of_one_source_share_a_counter() {
        let mut h = Harness::new(SrcCtr::default());
        let a = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
        let b = tcp4([10, 0, 0, 1], [8, 8, 8, 8], 2000, 443, TcpFlags::SYN.bits(), 1, 0);
        let c = udp4([10, 0, 0, 2], [9, 9, 9, 9], 1000, 80);
        h.now_ns = 5;
        h.run(&a);
        h.now_ns = 7;
        h.run(&b);
        h.run(&a);
        h.run(&c);
        let s = h.state_of(&b).unwrap();
        assert_eq!(s.packets, 3);
        assert_eq!(s.bytes, 2 * a.len() as u64 + b.len() as u64);
        assert_eq!((s.first_ns, s.last_ns), (5, 7));
        assert_eq!(h.state_of(&c).unwrap().packets, 1);
        assert_eq!(h.states.len(), 2);
        assert_eq!(h.nf.report().unwrap()["sources_seen"], 2);
        let row = h.nf.export_row(&h.key_of(&a).unwrap(), &s).unwrap();
        assert_eq!(row["src"], "10.0.0.1");
        assert_eq!(row["packets"], 3);
        assert_eq!(row["bytes"], s.bytes);
    }

    #[test]
    fn clock_backwards_keeps_last_seen() {
        let mut h = Harness::new(SrcCtr::default());
        let a = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
        h.now_ns = 1_000;
        h.run(&a);
        h.now_ns = 10;
        assert_eq!(h.run(&a).1, Action::Pass);
        let s = h.state_of(&a).unwrap();
        // The span of the packets' times, whatever order they came in (cores race on shared state).
        assert_eq!((s.packets, s.first_ns, s.last_ns), (2, 10, 1_000));
    }

    #[test]
    fn malformed_and_truncated_pass_and_are_counted() {
        let mut h = Harness::new(SrcCtr::default());
        let a = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
        for cut in [0, 1, 13, 20, 33, 35] {
            assert_eq!(h.run(&a[..cut]).1, Action::Pass, "cut at {cut}");
        }
        let mut arp = a.clone();
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(h.run(&arp).1, Action::Pass);
        assert!(h.states.is_empty());
        assert_eq!(h.nf.report().unwrap()["unparsed"], 7);
    }
}
