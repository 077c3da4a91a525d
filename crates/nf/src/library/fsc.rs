//! `fsc`: flow statistics counter (FAJITA A.1): packets, bytes, first and
//! last seen per 5-tuple. Bytes are frame lengths (Ethernet header included,
//! no FCS); first and last seen are packet-clock ns (after the capture's
//! first packet). Its table is exportable at the end of a run
//! (`--export fsc=flows.csv|json`). A counter fails open: a packet whose flow
//! found no room (the flow table full) passes, in no row, counted as `table_full`.
//! With `--ipfix` it feeds the exporter a flow record per flow at its end
//! (idle expiry, an end requested by another NF, eviction from a full table,
//! the run's end) and at each active timeout. A TCP flow that sent a FIN or
//! RST ended (flowEndReason 3, end of flow detected): its last record says
//! so, whenever its entry goes (its closing ACKs still count in it; the
//! entry stays for `--export` and late retransmissions).

use bytemuck::{Pod, Zeroable};
use flowplane_wire::flow::FiveTuple;
use serde_json::json;

use crate::ipfix::{end_reason, tcp_end, EndReason, ExportRecord, FlowExport, RecordTx};
use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::Export;
use crate::stateful::Granularity;
use crate::stateful::{Action, Affinity, GlobalState, Placement, StatefulNf};
use crate::{NfContext, ParamError, Params};

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "fsc",
    about: "flow statistics counter: packets, bytes, first/last seen per 5-tuple (exportable)",
    keyed_by: KeyedBy::Fixed(Granularity::FiveTuple),
    params: &[],
};

/// Builds `fsc` and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(Fsc::from_params(p)?))
}

/// Per-flow counters.
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct FscState {
    /// Packets.
    pub packets: u64,
    /// Bytes (frame lengths); with `--ipfix`, bit 63 ([`FscState::ENDED`])
    /// marks a TCP flow that sent a FIN or RST (kept in this word so the
    /// state stays 32 bytes: the flow entry's first cache line). Read it
    /// with [`FscState::bytes`].
    pub bytes: u64,
    /// First packet, ns since the run started.
    pub first_ns: u64,
    /// Last packet.
    pub last_ns: u64,
}

impl FscState {
    /// The bit of `bytes` marking a flow seen to end (TCP FIN or RST).
    pub const ENDED: u64 = 1 << 63;

    /// Bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes & !Self::ENDED
    }

    /// The flow sent a TCP FIN or RST.
    pub fn ended(&self) -> bool {
        self.bytes & Self::ENDED != 0
    }
}

/// The flow statistics counter.
#[derive(Default, Debug)]
pub struct Fsc {
    flows: u64,
    table_full: u64,
    /// The IPFIX record queue (`--ipfix`).
    ipfix: Option<RecordTx>,
}

impl Fsc {
    /// `fsc` takes no parameters.
    pub fn from_params(_p: &mut Params) -> Result<Self, ParamError> {
        Ok(Fsc::default())
    }
}

impl StatefulNf for Fsc {
    type State = FscState;

    fn name(&self) -> &'static str {
        INFO.name
    }

    /// Per-flow state whose updates commute (counters add up and first/last seen are kept as extremes): correct from any
    /// core, so `shared` may spray a flow's packets over cores (its state then
    /// lives in a shared table, updated under the entry's lock).
    fn placement(&self) -> Placement {
        Placement { affinity: Affinity::Any, global: GlobalState::None }
    }

    fn init(&mut self, _pkt: &Pkt<'_>, ctx: &NfContext) -> FscState {
        FscState { packets: 0, bytes: 0, first_ns: ctx.now_ns, last_ns: ctx.now_ns }
    }

    #[inline]
    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut FscState, ctx: &NfContext) -> Action {
        // First and last seen as the extremes, not the arrival order: under
        // the `shared` strategy a flow's packets reach its entry from several
        // cores, not in time order. (Branches, not min/max: in order, neither
        // extreme moves back, and the stores are skipped.)
        let now = ctx.now_ns;
        if st.packets == 0 {
            // Counted at the flow's first packet here, not in `init`: the
            // aggregated layout also initialises flows an upstream NF dropped.
            self.flows += 1;
            (st.first_ns, st.last_ns) = (now, now);
        } else {
            if now < st.first_ns {
                st.first_ns = now;
            }
            if now > st.last_ns {
                st.last_ns = now;
            }
        }
        st.packets += 1;
        st.bytes += pkt.len() as u64;
        // Only an exporter needs the end seen (a field test, then the flags byte of TCP packets).
        if self.ipfix.is_some() && tcp_end(pkt) {
            st.bytes |= FscState::ENDED;
        }
        Action::Pass
    }

    /// Fails open: counted as `table_full`, passed untouched.
    fn on_no_state(&mut self) -> Action {
        self.table_full += 1;
        Action::Pass
    }

    fn report(&self) -> Option<serde_json::Value> {
        Some(json!({ "flows_seen": self.flows, "table_full": self.table_full }))
    }

    fn export_kind(&self) -> Export {
        Export::State
    }

    const IPFIX: bool = true;

    fn attach_ipfix(&mut self, tx: RecordTx) {
        self.ipfix = Some(tx);
    }

    /// A flow record with the flow's totals (the exporter sends deltas).
    fn ipfix_flow(&mut self, key: &FiveTuple, st: &FscState, reason: EndReason) {
        if let (Some(tx), true) = (&mut self.ipfix, st.packets > 0) {
            let reason = end_reason(reason, st.ended());
            tx.push(ExportRecord::Flow(FlowExport::new(*key, st.packets, st.bytes(), st.first_ns, st.last_ns, reason)));
        }
    }

    fn export_row(&self, key: &FiveTuple, st: &FscState) -> Option<serde_json::Value> {
        // A block created for a flow whose packets never reached fsc (dropped upstream).
        if st.packets == 0 {
            return None;
        }
        Some(json!({
            "proto": key.proto(),
            "src": key.src_ip().to_string(),
            "dst": key.dst_ip().to_string(),
            "sport": key.src_port(),
            "dport": key.dst_port(),
            "packets": st.packets,
            "bytes": st.bytes(),
            "first_ns": st.first_ns,
            "last_ns": st.last_ns,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{udp4, Harness};

    #[test]
    fn counts_per_flow() {
        let mut h = Harness::new(Fsc::default());
        let a = udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
        let b = udp4([10, 0, 0, 2], [9, 9, 9, 9], 1000, 80);
        for _ in 0..3 {
            h.run(&a);
        }
        h.run(&b);
        assert_eq!(h.state_of(&a).unwrap().packets, 3);
        assert_eq!(h.state_of(&a).unwrap().bytes, 3 * a.len() as u64);
        assert_eq!(h.state_of(&b).unwrap().packets, 1);
        let row = h.nf.export_row(&h.key_of(&a).unwrap(), &h.state_of(&a).unwrap()).unwrap();
        assert_eq!(row["packets"], 3);
        assert_eq!(row["src"], "10.0.0.1");
        assert_eq!(row["dport"], 80);
    }

    /// Issue 34: a TCP flow that sent a FIN or RST ended (flowEndReason 3) whatever its entry went for — idle
    /// expiry, eviction, the run's end — but an active-timeout report of it stays 2; other flows keep the
    /// engine's reason; the end mark never shows in the bytes.
    #[test]
    fn tcp_fin_or_rst_makes_the_last_record_an_end_of_flow() {
        use crate::ipfix::{flows, test_queue};
        use crate::testutil::tcp4;
        let (fin, rst, ack) = (0x11, 0x04, 0x10);
        let mut h = Harness::new(Fsc::default());
        let (tx, mut rx) = test_queue();
        h.nf.attach_ipfix(tx);
        let a = tcp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80, ack, 1, 1);
        let a_fin = tcp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80, fin, 2, 1);
        let b_rst = tcp4([10, 0, 0, 2], [9, 9, 9, 9], 1000, 80, rst, 1, 0);
        let c = udp4([10, 0, 0, 3], [9, 9, 9, 9], 1000, 80);
        h.now_ns = 5;
        for f in [&a, &a_fin, &a, &b_rst, &c] {
            h.run(f);
        }
        let st = |f: &[u8]| h.state_of(f).unwrap();
        assert!(st(&a).ended() && st(&b_rst).ended() && !st(&c).ended());
        assert_eq!(st(&a).bytes(), 3 * a.len() as u64);
        let row = h.nf.export_row(&h.key_of(&a).unwrap(), &st(&a)).unwrap();
        assert_eq!(row["bytes"], 3 * a.len() as u64);
        let ends: Vec<_> = [
            (&a, EndReason::ActiveTimeout),
            (&a, EndReason::IdleTimeout),
            (&b_rst, EndReason::LackOfResources),
            (&c, EndReason::ForcedEnd),
        ]
        .into_iter()
        .map(|(f, why)| (h.key_of(f).unwrap(), st(f), why))
        .collect();
        for (k, s, why) in ends {
            h.nf.ipfix_flow(&k, &s, why);
        }
        let got: Vec<_> = flows(&mut rx).iter().map(|f| (f.packets, f.bytes, f.reason)).collect();
        let l = a.len() as u64;
        assert_eq!(
            got,
            vec![
                (3, 3 * l, EndReason::ActiveTimeout),
                (3, 3 * l, EndReason::EndOfFlow),
                (1, b_rst.len() as u64, EndReason::EndOfFlow),
                (1, c.len() as u64, EndReason::ForcedEnd),
            ]
        );
    }
}
