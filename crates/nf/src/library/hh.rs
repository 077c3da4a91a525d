//! `hh`: heavy-hitter monitor (SCR Table 1). Every 5-tuple flow counts its
//! bytes (frame lengths) and packets in its state; the NF keeps a fixed-size top-k summary
//! (the k flows with the most bytes seen so far), touched only when a flow's
//! count exceeds the current k-th largest, so the common packet costs one
//! compare. `report()` lists the top-k; with `threshold=BYTES` flows above
//! it are flagged, and every flow that crosses it is counted.
//!
//! The summary is per NF instance (per core): under RSS sharding the cores'
//! lists are disjoint, so the run's report merges them and keeps the k
//! largest. A flow that expires keeps its summary entry; if the same 5-tuple
//! returns, its entry is updated only once the new incarnation is larger
//! (the entry records the largest incarnation). A monitor fails open: a
//! packet whose flow found no room (the flow table full) passes, uncounted in
//! any flow, counted as `table_full`.
//!
//! With `--ipfix` it feeds the exporter heavy-hitter records: flow records
//! (the IPFIX flow template, as `fsc`'s) of the flows whose bytes are above
//! `threshold` when reported — at an active timeout and at the flow's end
//! (idle expiry, eviction, the run's end) — or of every flow without a
//! threshold. A flow's bytes only grow, so once it is reported every later
//! record of it is too: its records' deltas sum to its totals.
//!
//! `--export hh=FILE` writes the report's top-k (`export=top`, default; the
//! same rows as the report, merged over cores) or every live flow with its
//! bytes and packets (`export=all`).
//!
//! Under SCR a replica also updates the summary from the history records of
//! other cores' packets, which carry an IPv6 flow's addresses folded
//! ([`flowplane_wire::scr::recorded`]): a record's tuple and the flow's own
//! name one summary entry, shown by the real addresses once a packet of the
//! flow has shown them; the merge keeps a folded row only when no core knew
//! the flow's real addresses. So every replica's summary is the one core's.

use bytemuck::{Pod, Zeroable};
use flowplane_wire::flow::FiveTuple;
use flowplane_wire::scr::{is_folded, recorded, recorded_addr};
use serde_json::{json, Value};

use crate::ipfix::{EndReason, ExportRecord, FlowExport, RecordTx};
use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::{merge_keeping, Export};
use crate::stateful::Granularity;
use crate::stateful::{Action, Affinity, GlobalState, Placement, ScrFields, ScrRecord, StatefulNf};
use crate::{NfContext, ParamError, ParamSpec, Params};

const K: ParamSpec = ParamSpec::uint("k", 10, 1, MAX_K, "flows in the top-k summary");
const THRESHOLD: ParamSpec =
    ParamSpec::uint_or_none("threshold", 1, u64::MAX, "bytes above which a flow is flagged heavy").live();
const EXPORT: ParamSpec = ParamSpec::choice(
    "export",
    "top",
    &["top", "all"],
    "--export writes the top-k flows of the report, or every live flow",
)
.live();

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "hh",
    about: "heavy-hitter monitor: bytes/packets per 5-tuple, reports the top-k flows (exportable)",
    keyed_by: KeyedBy::Fixed(Granularity::FiveTuple),
    params: &[K, THRESHOLD, EXPORT],
};

/// Builds `hh` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(Hh::from_params(p)?))
}

/// Largest summary (updates scan it linearly).
pub const MAX_K: u64 = 1024;

/// Per-flow state: its size so far, and when it was seen (the IPFIX
/// records' start and end, kept with `--ipfix` only; 32 bytes, the flow
/// entry's first cache line).
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct HhState {
    /// Bytes (frame lengths).
    pub bytes: u64,
    /// Packets.
    pub packets: u64,
    /// First packet (packet clock, ns).
    pub first_ns: u64,
    /// Last packet.
    pub last_ns: u64,
}

/// One entry of the top-k summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TopEntry {
    /// The flow.
    pub tuple: FiveTuple,
    /// Its bytes when last updated.
    pub bytes: u64,
    /// Its packets when last updated.
    pub packets: u64,
}

/// The heavy-hitter monitor.
#[derive(Debug)]
pub struct Hh {
    /// Summary slots (capacity k, preallocated); the first `len` are used.
    top: Vec<TopEntry>,
    len: usize,
    /// Index and bytes of the smallest entry (valid when `len > 0`).
    min_at: usize,
    min_bytes: u64,
    threshold: Option<u64>,
    flows: u64,
    over_threshold: u64,
    table_full: u64,
    /// `--export` writes every live flow instead of the top-k.
    export_all: bool,
    /// The IPFIX record queue (`--ipfix`).
    ipfix: Option<RecordTx>,
}

impl Hh {
    /// `hh(k=N, threshold=BYTES, export=top|all)`; no threshold by default.
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let k = p.uint(&K)? as usize;
        let threshold = p.uint_or_none(&THRESHOLD)?;
        let export_all = p.choice(&EXPORT, [false, true])?;
        Ok(Hh { export_all, ..Hh::new(k, threshold) })
    }

    /// A monitor keeping the top `k` flows (clamped to 1..=[`MAX_K`]).
    pub fn new(k: usize, threshold: Option<u64>) -> Self {
        let k = k.clamp(1, MAX_K as usize);
        Hh {
            top: vec![TopEntry::default(); k],
            len: 0,
            min_at: 0,
            min_bytes: 0,
            threshold,
            flows: 0,
            over_threshold: 0,
            table_full: 0,
            export_all: false,
            ipfix: None,
        }
    }

    /// The summary, largest first.
    pub fn top(&self) -> Vec<TopEntry> {
        let mut v = self.top[..self.len].to_vec();
        v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.packets.cmp(&a.packets)));
        v
    }

    fn recompute_min(&mut self) {
        let (mut at, mut m) = (0, u64::MAX);
        for (i, e) in self.top[..self.len].iter().enumerate() {
            if e.bytes < m {
                at = i;
                m = e.bytes;
            }
        }
        self.min_at = at;
        self.min_bytes = if self.len == 0 { 0 } else { m };
    }

    /// Records that `tuple` now has `st`'s size; called only when it beats
    /// the k-th largest or the summary has room.
    #[cold]
    fn offer(&mut self, tuple: &FiveTuple, st: &HhState) {
        let mut entry = TopEntry { tuple: *tuple, bytes: st.bytes, packets: st.packets };
        if let Some(i) = self.top[..self.len].iter().position(|e| same_flow(&e.tuple, tuple)) {
            if st.bytes <= self.top[i].bytes {
                return;
            }
            if is_folded(tuple) {
                // An SCR record's tuple: the entry keeps the real addresses it has.
                entry.tuple = self.top[i].tuple;
            }
            self.top[i] = entry;
        } else if self.len < self.top.len() {
            self.top[self.len] = entry;
            self.len += 1;
        } else {
            self.top[self.min_at] = entry;
        }
        self.recompute_min();
    }
}

impl StatefulNf for Hh {
    type State = HhState;

    fn name(&self) -> &'static str {
        INFO.name
    }

    /// Per-flow state whose updates commute (counters add up; the merged top-k keeps each flow's latest counts): correct from any
    /// core, so `shared` may spray a flow's packets over cores (its state then
    /// lives in a shared table, updated under the entry's lock).
    fn placement(&self) -> Placement {
        Placement { affinity: Affinity::Any, global: GlobalState::None }
    }

    /// A new threshold or export mode between two batches: every flow keeps
    /// its counts and the summary its entries; crossings of the new threshold
    /// are counted from now on. `k` sizes the summary: fixed for the run.
    fn reconfigure(&mut self, p: &mut Params) -> Result<(), ParamError> {
        let new = Hh::from_params(p)?;
        if new.top.len() != self.top.len() {
            return Err(ParamError(format!(
                "hh: k={} sizes the top-k summary (k={} now): a restart changes it",
                new.top.len(),
                self.top.len()
            )));
        }
        (self.threshold, self.export_all) = (new.threshold, new.export_all);
        Ok(())
    }

    fn init(&mut self, _pkt: &Pkt<'_>, _ctx: &NfContext) -> HhState {
        HhState::default()
    }

    #[inline]
    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut HhState, ctx: &NfContext) -> Action {
        // Flows are counted at their first packet that reaches hh (not at insertion, which a drop
        // upstream in the chain can precede).
        self.flows += u64::from(st.packets == 0);
        // The times are the IPFIX records' only (and `--ipfix` is refused under scr, whose history records carry
        // no time for hh: replicas' states stay equal). First and last seen as extremes (`shared` may bring a
        // flow's packets out of order).
        if self.ipfix.is_some() {
            let now = ctx.now_ns;
            if st.packets == 0 || now < st.first_ns {
                st.first_ns = now;
            }
            if now > st.last_ns {
                st.last_ns = now;
            }
        }
        let before = st.bytes;
        st.bytes = st.bytes.saturating_add(pkt.len() as u64);
        st.packets = st.packets.saturating_add(1);
        if let Some(t) = self.threshold {
            if before <= t && st.bytes > t {
                self.over_threshold += 1;
            }
        }
        if self.len < self.top.len() || st.bytes > self.min_bytes {
            self.offer(pkt.tuple(), st);
        }
        Action::Pass
    }

    fn scr_fields(&self) -> Option<ScrFields> {
        Some(ScrFields::FIVE_TUPLE.with(ScrFields::LEN))
    }

    /// The same update as `process` (the top-k too: every replica holds the
    /// whole trace's summary); flows and threshold crossings are counted for
    /// a core's own packets only.
    #[inline]
    fn scr_transition(&mut self, st: &mut HhState, rec: &ScrRecord, _ctx: &NfContext) -> bool {
        st.bytes = st.bytes.saturating_add(u64::from(rec.len));
        st.packets = st.packets.saturating_add(1);
        if self.len < self.top.len() || st.bytes > self.min_bytes {
            self.offer(&rec.tuple(), st);
        }
        true
    }

    /// Fails open: counted as `table_full`, passed untouched.
    fn on_no_state(&mut self) -> Action {
        self.table_full += 1;
        Action::Pass
    }

    fn report(&self) -> Option<serde_json::Value> {
        let mut top: Vec<_> = self
            .top()
            .iter()
            .map(|e| {
                json!({
                    "proto": e.tuple.proto(),
                    "src": e.tuple.src_ip().to_string(),
                    "dst": e.tuple.dst_ip().to_string(),
                    "sport": e.tuple.src_port(),
                    "dport": e.tuple.dst_port(),
                    "bytes": e.bytes,
                    "packets": e.packets,
                    "heavy": self.threshold.is_some_and(|t| e.bytes > t),
                })
            })
            .collect();
        top.sort_by(by_rank);
        Some(json!({
            "k": self.top.len(),
            "threshold_bytes": self.threshold,
            "flows_seen": self.flows,
            "flows_over_threshold": self.over_threshold,
            "table_full": self.table_full,
            "top": top,
        }))
    }

    /// The cores' summaries hold disjoint flows (RSS keeps a 5-tuple on one
    /// core), so the run's top-k is the k largest of their union.
    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        merge_keeping(into, other, &["k", "threshold_bytes", "top"]);
        if let (Some(Value::Array(mine)), Some(Value::Array(theirs))) = (into.get_mut("top"), other.get("top")) {
            mine.extend(theirs.iter().cloned());
            mine.sort_by(by_rank);
            // A flow whose state is shared (the `shared` strategy) can sit in
            // several cores' top-k with the counts of the packets each saw
            // last: keep its highest (latest) entry.
            let flow = |r: &Value| [&r["proto"], &r["src"], &r["dst"], &r["sport"], &r["dport"]].map(|v| v.to_string());
            let mut seen = std::collections::HashSet::new();
            mine.retain(|r| seen.insert(flow(r)));
            // Under SCR every replica lists the same flows, an IPv6 flow by its
            // record's folded tuple where the replica never saw its packets:
            // that row goes when another core's row shows the flow's addresses.
            let known: std::collections::HashSet<[String; 5]> =
                mine.iter().map(row_flow).filter(|(_, folded)| !folded).map(|(f, _)| f).collect();
            mine.retain(|r| !matches!(row_flow(r), (f, true) if known.contains(&f)));
            mine.truncate(self.top.len());
        }
    }

    fn export_kind(&self) -> Export {
        if self.export_all {
            Export::State
        } else {
            Export::Report
        }
    }

    /// `export=top`: the merged report's top-k rows.
    fn export_report_rows(&self, merged: &serde_json::Value) -> Vec<serde_json::Value> {
        merged["top"].as_array().cloned().unwrap_or_default()
    }

    const IPFIX: bool = true;

    fn attach_ipfix(&mut self, tx: RecordTx) {
        self.ipfix = Some(tx);
    }

    /// A heavy hitter's record (every flow's without a threshold), with its totals.
    fn ipfix_flow(&mut self, key: &FiveTuple, st: &HhState, reason: EndReason) {
        let heavy = st.packets > 0 && self.threshold.is_none_or(|t| st.bytes > t);
        if let (Some(tx), true) = (&mut self.ipfix, heavy) {
            tx.push(ExportRecord::Flow(FlowExport::new(*key, st.packets, st.bytes, st.first_ns, st.last_ns, reason)));
        }
    }

    fn export_row(&self, key: &FiveTuple, st: &HhState) -> Option<serde_json::Value> {
        Some(json!({
            "proto": key.proto(),
            "src": key.src_ip().to_string(),
            "dst": key.dst_ip().to_string(),
            "sport": key.src_port(),
            "dport": key.dst_port(),
            "packets": st.packets,
            "bytes": st.bytes,
        }))
    }
}

/// Summary tuples `a` and `b` name one flow: equal, or one is an SCR
/// record's (IPv6 addresses folded) and the other's record shows the same.
/// (Two real tuples are compared exactly: distinct flows whose folds collide stay apart.)
fn same_flow(a: &FiveTuple, b: &FiveTuple) -> bool {
    a == b || (is_folded(a) != is_folded(b) && recorded(a) == recorded(b))
}

/// A top-k row's flow as SCR records show it, and whether the row shows
/// folded addresses (it came from records alone; see [`same_flow`]).
fn row_flow(r: &Value) -> ([String; 5], bool) {
    let addr = |k: &str| r[k].as_str().and_then(|a| a.parse::<std::net::IpAddr>().ok());
    let folded = |k: &str| matches!(addr(k), Some(std::net::IpAddr::V6(a)) if flowplane_wire::scr::is_folded_addr(a));
    let shown = |k: &str| addr(k).map_or_else(|| r[k].to_string(), |a| recorded_addr(a).to_string());
    (
        [shown("src"), shown("dst"), r["sport"].to_string(), r["dport"].to_string(), r["proto"].to_string()],
        folded("src") && folded("dst"),
    )
}

/// Order of top-k rows: more bytes first, then more packets, then by flow,
/// so ties rank the same however the rows arrived.
fn by_rank(a: &Value, b: &Value) -> std::cmp::Ordering {
    let n = |r: &Value, k: &str| r[k].as_u64().unwrap_or(0);
    let t = |r: &Value, k: &str| r[k].as_str().unwrap_or("").to_string();
    (n(b, "bytes"), n(b, "packets"))
        .cmp(&(n(a, "bytes"), n(a, "packets")))
        .then_with(|| (t(a, "src"), t(a, "dst")).cmp(&(t(b, "src"), t(b, "dst"))))
        .then_with(|| (n(a, "sport"), n(a, "dport"), n(a, "proto")).cmp(&(n(b, "sport"), n(b, "dport"), n(b, "proto"))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{udp4, Harness};

    fn flow(i: u16) -> Vec<u8> {
        udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000 + i, 80)
    }

    /// Issue 29: under SCR an IPv6 flow was listed twice, by its tuple and by its records' folded one.
    #[test]
    fn a_records_folded_tuple_and_the_flows_own_are_one_entry_and_one_row() {
        use flowplane_wire::flow::FiveTupleV6;
        let real: FiveTuple =
            FiveTupleV6::new("2001:db8::1".parse().unwrap(), "fd00::2".parse().unwrap(), 5, 6, 17).into();
        let other: FiveTuple =
            FiveTupleV6::new("2001:db8::9".parse().unwrap(), "fd00::2".parse().unwrap(), 5, 6, 17).into();
        let mut h = Hh::new(3, None);
        h.offer(&real, &HhState { bytes: 10, packets: 1, ..Default::default() });
        h.offer(&recorded(&real), &HhState { bytes: 20, packets: 2, ..Default::default() });
        h.offer(&recorded(&other), &HhState { bytes: 5, packets: 1, ..Default::default() });
        let top = h.top();
        assert_eq!(top.len(), 2, "{top:?}");
        assert_eq!((top[0].tuple, top[0].bytes), (real, 20), "the real addresses kept, the counts updated");
        assert_eq!(top[1].tuple, recorded(&other), "a flow seen only in records: folded");
        // Another replica saw `real` by records only and `other` by its packets: merged, one row per flow.
        let mut g = Hh::new(3, None);
        g.offer(&recorded(&real), &HhState { bytes: 20, packets: 2, ..Default::default() });
        g.offer(&other, &HhState { bytes: 5, packets: 1, ..Default::default() });
        let mut merged = h.report().unwrap();
        h.merge_report(&mut merged, &g.report().unwrap());
        let rows: Vec<String> = merged["top"].as_array().unwrap().iter().map(|r| r["src"].to_string()).collect();
        assert_eq!(rows, ["\"2001:db8::1\"", "\"2001:db8::9\""]);
    }

    #[test]
    fn keeps_the_k_largest_flows() {
        let mut h = Harness::new(Hh::new(3, None));
        // Flow i sends i+1 packets, interleaved so ranks change over time.
        for round in 0..10u16 {
            for i in 0..10u16 {
                if round <= i {
                    h.run(&flow(i));
                }
            }
        }
        let top = h.nf.top();
        let len = flow(0).len() as u64;
        let got: Vec<(u16, u64, u64)> = top.iter().map(|e| (e.tuple.src_port(), e.packets, e.bytes)).collect();
        assert_eq!(got, vec![(1009, 10, 10 * len), (1008, 9, 9 * len), (1007, 8, 8 * len)]);
        let st = h.state_of(&flow(4)).unwrap();
        assert_eq!((st.bytes, st.packets), (5 * len, 5));
        let r = h.nf.report().unwrap();
        assert_eq!(r["flows_seen"], 10);
        assert_eq!(r["top"][0]["sport"], 1009);
        assert_eq!(r["top"][0]["heavy"], false);
        assert_eq!(r["top"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn a_late_elephant_evicts_the_smallest() {
        let mut h = Harness::new(Hh::new(2, None));
        for _ in 0..5 {
            h.run(&flow(1));
        }
        for _ in 0..3 {
            h.run(&flow(2));
        }
        for _ in 0..4 {
            h.run(&flow(3));
        }
        let ports: Vec<u16> = h.nf.top().iter().map(|e| e.tuple.src_port()).collect();
        assert_eq!(ports, vec![1001, 1003]);
        for _ in 0..10 {
            h.run(&flow(2));
        }
        let top = h.nf.top();
        assert_eq!(top[0].tuple.src_port(), 1002);
        assert_eq!(top[0].packets, 13);
        assert_eq!(top[1].tuple.src_port(), 1001);
    }

    #[test]
    fn threshold_flags_and_counts_crossings() {
        let len = flow(0).len() as u64;
        let mut h = Harness::new(Hh::new(10, Some(3 * len)));
        for _ in 0..5 {
            h.run(&flow(1));
        }
        for _ in 0..3 {
            h.run(&flow(2)); // exactly the threshold: not above it
        }
        let r = h.nf.report().unwrap();
        assert_eq!(r["flows_over_threshold"], 1);
        assert_eq!(r["threshold_bytes"], 3 * len);
        assert_eq!(r["top"][0]["heavy"], true);
        assert_eq!(r["top"][1]["heavy"], false);
    }

    #[test]
    fn returning_flow_keeps_its_largest_incarnation() {
        let mut h = Harness::new(Hh::new(2, None));
        for _ in 0..4 {
            h.run(&flow(1));
        }
        // The flow expires (state removed) and comes back smaller.
        let key = h.key_of(&flow(1)).unwrap();
        h.states.remove(&key);
        h.run(&flow(1));
        let top = h.nf.top();
        assert_eq!(top.len(), 1);
        assert_eq!(top[0].packets, 4);
        for _ in 0..5 {
            h.run(&flow(1));
        }
        assert_eq!(h.nf.top()[0].packets, 6);
    }

    #[test]
    fn reports_merge_to_the_top_k_of_both_cores_and_export_it() {
        // Two cores' monitors with disjoint flows: flow i sends i+1 packets.
        let (mut a, mut b) = (Harness::new(Hh::new(3, None)), Harness::new(Hh::new(3, None)));
        for i in 0..8u16 {
            let h = if i % 3 == 0 { &mut b } else { &mut a };
            for _ in 0..=i {
                h.run(&flow(i));
            }
        }
        let mut r = a.nf.report().unwrap();
        a.nf.merge_report(&mut r, &b.nf.report().unwrap());
        let ports: Vec<u64> = r["top"].as_array().unwrap().iter().map(|e| e["sport"].as_u64().unwrap()).collect();
        assert_eq!(ports, vec![1007, 1006, 1005], "the 3 largest of both cores, largest first");
        assert_eq!((r["k"].as_u64(), r["flows_seen"].as_u64()), (Some(3), Some(8)), "k is kept, flows add up");
        // One core holding every flow reports the same top-k.
        let mut one = Harness::new(Hh::new(3, None));
        for i in 0..8u16 {
            for _ in 0..=i {
                one.run(&flow(i));
            }
        }
        assert_eq!(one.nf.report().unwrap()["top"], r["top"]);
        // export=top (default) writes those rows; export=all every flow.
        assert_eq!(a.nf.export_kind(), Export::Report);
        assert_eq!(a.nf.export_report_rows(&r), r["top"].as_array().unwrap().clone());
        let mut p = Params::new("hh", vec![("export".into(), "all".into())]);
        assert_eq!(Hh::from_params(&mut p).unwrap().export_kind(), Export::State);
        let mut p = Params::new("hh", vec![("export".into(), "some".into())]);
        assert!(Hh::from_params(&mut p).unwrap_err().0.contains("'export=some'"));
    }

    #[test]
    fn params_export_and_malformed_packets() {
        let mut p = Params::new("hh", vec![("k".into(), "0".into())]);
        assert!(Hh::from_params(&mut p).unwrap_err().0.contains("'k=0'"));
        let mut p = Params::new("hh", vec![("threshold".into(), "x".into())]);
        assert!(Hh::from_params(&mut p).unwrap_err().0.contains("'threshold=x'"));
        let mut p = Params::new("hh", vec![("k".into(), "5".into()), ("threshold".into(), "1M".into())]);
        let nf = Hh::from_params(&mut p).unwrap();
        assert_eq!(nf.threshold, Some(1_000_000));
        let mut h = Harness::new(nf);
        for len in [0usize, 12, 33] {
            assert_eq!(h.run(&vec![0u8; len]).1, Action::Pass);
        }
        assert!(h.nf.top().is_empty());
        let f = flow(7);
        h.run(&f);
        let row = h.nf.export_row(&h.key_of(&f).unwrap(), &h.state_of(&f).unwrap()).unwrap();
        assert_eq!(row["packets"], 1);
        assert_eq!(row["sport"], 1007);
        // Counters saturate instead of overflowing.
        let key = h.key_of(&f).unwrap();
        h.states.insert(key, HhState { bytes: u64::MAX - 1, packets: u64::MAX, ..Default::default() });
        h.run(&f);
        let st = h.state_of(&f).unwrap();
        assert_eq!((st.bytes, st.packets), (u64::MAX, u64::MAX));
    }

    #[test]
    fn reconfigure_keeps_counts_and_the_summary() {
        let mut h = Harness::new(Hh::new(4, None));
        let f = crate::testutil::udp4([10, 0, 0, 1], [9, 9, 9, 9], 1000, 80);
        let len = f.len() as u64;
        for _ in 0..3 {
            h.run(&f);
        }
        let params = |t: &str, k: &str| Params::new("hh", vec![("threshold".into(), t.into()), ("k".into(), k.into())]);
        h.nf.reconfigure(&mut params(&(4 * len - 1).to_string(), "4")).unwrap();
        h.run(&f);
        let st = h.state_of(&f).unwrap();
        assert_eq!((st.bytes, st.packets), (4 * len, 4), "the flow's counts survived");
        let r = h.nf.report().unwrap();
        assert_eq!(r["flows_over_threshold"], 1, "the 4th packet crossed the new threshold: {r}");
        assert_eq!((r["top"][0]["packets"].as_u64(), r["top"][0]["heavy"].as_bool()), (Some(4), Some(true)));
        assert_eq!(r["flows_seen"], 1);
        let e = h.nf.reconfigure(&mut params("1", "8")).unwrap_err();
        assert!(e.0.contains("k=8") && e.0.contains("restart"), "{e}");
        assert_eq!(h.nf.threshold, Some(4 * len - 1), "a refused change changes nothing");
    }

    /// Issue 34: with a threshold only the flows above it are reported, with their totals and the times of
    /// their first and last packets; without one every flow is.
    #[test]
    fn ipfix_reports_the_heavy_hitters_with_their_times() {
        use crate::ipfix::{flows, test_queue, EndReason};
        let len = flow(0).len() as u64;
        for (threshold, want) in
            [(Some(3 * len), vec![(1000, 4, 10, 40)]), (None, vec![(1000, 4, 10, 40), (1001, 1, 20, 20)])]
        {
            let mut h = Harness::new(Hh::new(4, threshold));
            let (tx, mut rx) = test_queue();
            h.nf.attach_ipfix(tx);
            for (t, f) in [(10, 0), (20, 1), (30, 0), (35, 0), (40, 0)] {
                h.now_ns = t;
                h.run(&flow(f));
            }
            for f in [0, 1] {
                let (k, st) = (h.key_of(&flow(f)).unwrap(), h.state_of(&flow(f)).unwrap());
                h.nf.ipfix_flow(&k, &st, EndReason::IdleTimeout);
            }
            let got: Vec<_> =
                flows(&mut rx).iter().map(|r| (r.tuple.src_port(), r.packets, r.first_ns, r.last_ns)).collect();
            assert_eq!(got, want, "threshold {threshold:?}");
        }
    }
}
