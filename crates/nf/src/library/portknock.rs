//! `portknock`: port-knocking firewall (state-compute replication paper,
//! Appendix C, Figure 12).
//!
//! This module owns the port-knocking NF: its knock sequence, the protected
//! port and the per-source-IP automaton (granularity `SrcIp`). The automaton
//! has the states CLOSED_1 .. CLOSED_n and OPEN for a knock sequence
//! K1 .. Kn (`knock=1111-2222-3333`, up to 8 ports). Every TCP packet of a
//! source (IPv4, and IPv6 too so the protection cannot be bypassed over v6)
//! steps its automaton with the packet's destination port, exactly as the
//! paper's `get_new_state`: in CLOSED_i a packet to Ki moves to CLOSED_i+1
//! (to OPEN after Kn); OPEN stays OPEN; any other packet, including one to
//! K1 in the middle of a sequence, goes back to CLOSED_1.
//!
//! Verdict (the paper drops everything but OPEN sources; here only the
//! protected service is guarded, as the product asks): TCP packets to the
//! `protect` port pass if the source is OPEN after the transition and are
//! dropped otherwise; all other traffic passes (knocks included). Non-first
//! TCP fragments carry no port, so they cannot be told apart from fragments
//! of the protected service: they pass only for OPEN sources and do not step
//! the automaton — unless the engine gave the fragment its first fragment's
//! key (`engine::frag`): then it follows that port (passes unless it is the
//! protected one, which stays OPEN-only). Packets without a flow key pass.
//!
//! Idle timeout (`timeout=S`; 0: the longest timeout of the other NFs keyed
//! by source IP in the chain, else the run's `--idle-timeout`): a packet of a
//! source (any protocol) that reaches this NF more than S seconds — strictly,
//! on the packet clock — after the previous packet of that source that
//! reached it finds the source at CLOSED_1 (fresh state), then steps the
//! automaton as above. So an OPEN source closes after S seconds of silence,
//! and a knock sequence with a gap over S starts over. Exactly S passes. The
//! engine enforces it at access, whichever executor, core or strategy, and
//! whether or not flows pin the source's shared entry (see
//! `StatefulNf::idle_timeout_ns`).
//!
//! Table full: an access-control NF fails closed — a packet whose source
//! found no room in the (shared) source table has no automaton, so it is
//! dropped (knocks and other traffic included: nothing about the source
//! can be kept) and counted as `table_full`, never as `unparsed`.

use bytemuck::{Pod, Zeroable};
use serde_json::json;

use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::{merge_keeping, Export};
use crate::stateful::{Action, Affinity, GlobalState, Granularity, Placement, ScrFields, ScrRecord, StatefulNf};
use crate::{NfContext, ParamError, ParamSpec, Params};
use flowplane_wire::ipv4::IpProtocol;

/// Longest knock sequence.
pub const MAX_KNOCKS: usize = 8;

const KNOCK: ParamSpec =
    ParamSpec::text("knock", "1111-2222-3333", "P1-P2-...", "knock sequence of 1..8 TCP ports (1..65535)");
const PROTECT: ParamSpec = ParamSpec::uint("protect", 22, 1, 65535, "protected TCP port").live();
const TIMEOUT: ParamSpec =
    ParamSpec::uint("timeout", 0, 0, 30 * 86_400, "idle timeout of a source's state in seconds, 0 = chain default");

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "portknock",
    about: "port-knocking firewall (SCR App. C): per source IP, the protected TCP port opens after the knock sequence",
    keyed_by: KeyedBy::Fixed(Granularity::SrcIp),
    params: &[KNOCK, PROTECT, TIMEOUT],
};

/// Builds `portknock` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(PortKnock::from_params(p)?))
}

/// Per-source automaton state: `stage` i < n is CLOSED_(i+1), n is OPEN.
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct KnockState {
    /// Knocks matched so far (== the sequence length once OPEN).
    pub stage: u32,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    knocks: u64,
    resets: u64,
    opened: u64,
    protected_passed: u64,
    protected_dropped: u64,
    fragments_dropped: u64,
    non_tcp: u64,
    unparsed: u64,
    table_full: u64,
}

/// The port-knocking firewall.
#[derive(Debug)]
pub struct PortKnock {
    knock: [u16; MAX_KNOCKS],
    n: u32,
    protect: u16,
    timeout_ns: Option<u64>,
    c: Counters,
}

impl PortKnock {
    /// `portknock(knock=P1-P2-..., protect=PORT, timeout=S)`.
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let ks = p.text(&KNOCK)?;
        let bad = || {
            ParamError(format!(
                "portknock: parameter 'knock={ks}' must be 1 to {MAX_KNOCKS} ports 1..65535 separated by '-'"
            ))
        };
        let mut ports = Vec::new();
        for part in ks.split('-') {
            let v: u16 = part.trim().parse().map_err(|_| bad())?;
            if v == 0 || ports.len() == MAX_KNOCKS {
                return Err(bad());
            }
            ports.push(v);
        }
        let protect = p.uint(&PROTECT)? as u16;
        if ports.contains(&protect) {
            return Err(ParamError(format!("portknock: parameter 'protect={protect}' is also a knock port")));
        }
        let timeout_s = p.uint(&TIMEOUT)?;
        let mut pk = PortKnock::new(&ports, protect).ok_or_else(bad)?;
        pk.timeout_ns = (timeout_s > 0).then(|| timeout_s * 1_000_000_000);
        Ok(pk)
    }

    /// A firewall guarding `protect` behind the knock sequence `ports`
    /// (1..=8 ports; None otherwise).
    pub fn new(ports: &[u16], protect: u16) -> Option<Self> {
        if ports.is_empty() || ports.len() > MAX_KNOCKS {
            return None;
        }
        let mut knock = [0u16; MAX_KNOCKS];
        knock[..ports.len()].copy_from_slice(ports);
        Some(PortKnock { knock, n: ports.len() as u32, protect, timeout_ns: None, c: Counters::default() })
    }

    /// The automaton's transition (the paper's `get_new_state`).
    #[inline]
    pub fn next_stage(&self, stage: u32, dport: u16) -> u32 {
        if stage >= self.n {
            self.n
        } else if self.knock.get(stage as usize) == Some(&dport) {
            stage + 1
        } else {
            0
        }
    }
}

impl StatefulNf for PortKnock {
    type State = KnockState;

    fn name(&self) -> &'static str {
        INFO.name
    }

    fn granularity(&self) -> Granularity {
        Granularity::SrcIp
    }

    fn placement(&self) -> Placement {
        // Verdicts depend on the order of one key's packets: all of them on one core.
        Placement { affinity: Affinity::Source, global: GlobalState::None }
    }

    fn idle_timeout_ns(&self) -> Option<u64> {
        self.timeout_ns
    }

    /// A new protected port between two batches: every source keeps its
    /// automaton (an OPEN source reaches the new port at once). The knock
    /// sequence (what each source's stage means) and the timeout (the flow
    /// table's expiry, set when the run starts) are fixed for the run.
    fn reconfigure(&mut self, p: &mut Params) -> Result<(), ParamError> {
        let new = PortKnock::from_params(p)?;
        if (new.knock, new.n) != (self.knock, self.n) {
            return Err(ParamError(
                "portknock: knock is the sequence every source's automaton is in the middle of: a restart changes it"
                    .into(),
            ));
        }
        if new.timeout_ns != self.timeout_ns {
            return Err(ParamError(
                "portknock: timeout sets the source table's expiry when the run starts: a restart changes it".into(),
            ));
        }
        self.protect = new.protect;
        Ok(())
    }

    fn init(&mut self, _pkt: &Pkt<'_>, _ctx: &NfContext) -> KnockState {
        KnockState { stage: 0 }
    }

    #[inline]
    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut KnockState, _ctx: &NfContext) -> Action {
        if pkt.proto() != IpProtocol::TCP {
            self.c.non_tcp += 1;
            return Action::Pass;
        }
        let Some(dport) = pkt.dst_port() else {
            // A later fragment the engine gave its first fragment's key (`engine::frag`) follows that
            // fragment's port without stepping the automaton.
            let t = pkt.tuple();
            if !t.is_non_first_fragment() && pkt.meta().l4 == 0 && t.dst_port() != self.protect {
                return Action::Pass;
            }
            // A fragment of the protected service, or without ports (or no header): open sources only.
            if st.stage >= self.n {
                return Action::Pass;
            }
            self.c.fragments_dropped += 1;
            return Action::Drop;
        };
        let old = st.stage.min(self.n);
        let new = self.next_stage(old, dport);
        st.stage = new;
        if new > old {
            self.c.knocks += 1;
            if new == self.n {
                self.c.opened += 1;
            }
        } else if new < old {
            self.c.resets += 1;
        }
        if dport != self.protect {
            return Action::Pass;
        }
        if new == self.n {
            self.c.protected_passed += 1;
            Action::Pass
        } else {
            self.c.protected_dropped += 1;
            Action::Drop
        }
    }

    fn scr_fields(&self) -> Option<ScrFields> {
        Some(ScrFields::SRC_IP.with(ScrFields::PORTS).with(ScrFields::PROTO))
    }

    #[inline]
    fn scr_transition(&mut self, st: &mut KnockState, rec: &ScrRecord, _ctx: &NfContext) -> bool {
        // The same control flow as `process`, with no counters and no verdict kept.
        if rec.proto != IpProtocol::TCP.0 {
            return true;
        }
        let Some(dport) = rec.dst_port() else {
            return st.stage >= self.n;
        };
        let new = self.next_stage(st.stage.min(self.n), dport);
        st.stage = new;
        dport != self.protect || new == self.n
    }

    const SCR_RUN: bool = true;

    /// The transition reads the stage, the kind byte, the protocol and the
    /// destination port (no time), and nothing else changes.
    const SCR_PURE: bool = true;

    /// An open source stays open whatever its records (from the last stage
    /// every transition leads back to it), and a source at stage 0 stays
    /// there unless a record knocks the first port (any other TCP port
    /// resets it to 0, anything else leaves it); otherwise record by
    /// record. The knock state has no time in it.
    #[inline]
    fn scr_run(&mut self, st: &mut KnockState, run: &crate::stateful::ScrRun<'_>) {
        if st.stage == self.n {
            return;
        }
        let first = self.knock[0];
        if st.stage == 0 && !run.recs.iter().any(|r| r.proto == IpProtocol::TCP.0 && r.dst_port() == Some(first)) {
            return;
        }
        for r in run.recs {
            self.scr_transition(st, r, &NfContext::default());
        }
    }

    fn on_unparsed(&mut self) -> Action {
        self.c.unparsed += 1;
        Action::Pass
    }

    /// Fails closed: a source whose automaton cannot be kept is not let in.
    fn passes_without_state(&self) -> bool {
        false
    }

    fn on_no_state(&mut self) -> Action {
        self.c.table_full += 1;
        Action::Drop
    }

    fn report(&self) -> Option<serde_json::Value> {
        let c = &self.c;
        Some(json!({
            "knock": &self.knock[..self.n as usize],
            "protect": self.protect,
            "knocks": c.knocks,
            "resets": c.resets,
            "opened": c.opened,
            "protected_passed": c.protected_passed,
            "protected_dropped": c.protected_dropped,
            "fragments_dropped": c.fragments_dropped,
            "non_tcp": c.non_tcp,
            "unparsed": c.unparsed,
            "table_full": c.table_full,
        }))
    }

    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        // Configuration echoes are the same on every core.
        merge_keeping(into, other, &["knock", "protect"]);
    }

    fn export_kind(&self) -> Export {
        Export::State
    }

    fn export_row(&self, key: &flowplane_wire::flow::FiveTuple, st: &KnockState) -> Option<serde_json::Value> {
        Some(json!({ "src": key.src_ip().to_string(), "stage": st.stage, "open": st.stage >= self.n }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stateful::ScrRun;
    const SYN: u8 = flowplane_wire::tcp::TcpFlags::SYN.bits();
    use crate::pkt::PktMeta;
    use crate::testutil::{tcp4, udp4, Harness};

    const A: [u8; 4] = [198, 51, 100, 7];
    const B: [u8; 4] = [198, 51, 100, 8];
    const SRV: [u8; 4] = [10, 0, 0, 1];

    fn to(src: [u8; 4], dport: u16) -> Vec<u8> {
        tcp4(src, SRV, 40000, dport, SYN, 1, 0)
    }

    proptest::proptest! {
        /// `scr_run` leaves the state `scr_transition` record by record
        /// leaves, from every stage (open ones included), over TCP records
        /// to knock ports, the protected port and others, UDP records and
        /// TCP records without ports.
        #[test]
        fn scr_run_equals_the_transitions_one_by_one(
            stage in proptest::prop_oneof![0u32..=3, proptest::strategy::Just(0)],
            recs in proptest::collection::vec((0usize..7, 0u8..4), 1..24),
        ) {
            let mut nf = PortKnock::new(&[1111, 2222, 3333], 22).unwrap();
            let recs: Vec<ScrRecord> = recs
                .iter()
                .map(|&(p, kind)| {
                    let dport = [1111, 2222, 3333, 22, 80, 1111, 2222][p];
                    let f = match kind {
                        0 => udp4(A, SRV, 40000, dport),
                        _ => to(A, dport),
                    };
                    let mut r = ScrRecord::from_frame(&f, &PktMeta::parse(&f));
                    if kind == 3 {
                        // A TCP record without ports (a later fragment's).
                        r = ScrRecord::from_words({
                            let mut w = r.to_words();
                            w[0] &= !(u64::from(flowplane_wire::scr::kind::PORTS) << 56);
                            w
                        });
                    }
                    r
                })
                .collect();
            let mut a = KnockState { stage };
            nf.scr_run(&mut a, &ScrRun { recs: &recs, min_ns: 0, max_ns: 0 });
            let mut b = KnockState { stage };
            for r in &recs {
                nf.scr_transition(&mut b, r, &NfContext::default());
            }
            proptest::prop_assert_eq!(a, b);
        }
    }

    fn pk() -> Harness<PortKnock> {
        Harness::new(PortKnock::new(&[1111, 2222, 3333], 22).unwrap())
    }

    fn stat(h: &Harness<PortKnock>, k: &str) -> u64 {
        h.nf.report().unwrap()[k].as_u64().unwrap()
    }

    #[test]
    fn correct_sequence_opens() {
        let mut h = pk();
        assert_eq!(h.run(&to(A, 22)).1, Action::Drop, "protected before knocking");
        for p in [1111, 2222, 3333] {
            assert_eq!(h.run(&to(A, p)).1, Action::Pass, "knocks pass");
        }
        assert_eq!(h.state_of(&to(A, 22)), Some(KnockState { stage: 3 }));
        assert_eq!(h.run(&to(A, 22)).1, Action::Pass);
        // OPEN stays OPEN whatever the source sends next.
        assert_eq!(h.run(&to(A, 80)).1, Action::Pass);
        assert_eq!(h.run(&to(A, 22)).1, Action::Pass);
        assert_eq!(stat(&h, "opened"), 1);
        assert_eq!(stat(&h, "protected_dropped"), 1);
        assert_eq!(stat(&h, "protected_passed"), 2);
    }

    #[test]
    fn wrong_order_or_interleaved_port_resets() {
        let mut h = pk();
        for p in [2222, 1111, 3333] {
            h.run(&to(A, p));
        }
        assert_eq!(h.run(&to(A, 22)).1, Action::Drop, "wrong order");
        for p in [1111, 2222, 80, 3333] {
            h.run(&to(A, p));
        }
        assert_eq!(h.run(&to(A, 22)).1, Action::Drop, "interleaved other port");
        // Paper semantics: K1 in the middle goes to CLOSED_1, not CLOSED_2.
        for p in [1111, 1111, 2222, 3333] {
            h.run(&to(A, p));
        }
        assert_eq!(h.run(&to(A, 22)).1, Action::Drop);
        assert_eq!(h.state_of(&to(A, 22)), Some(KnockState { stage: 0 }));
        // The protected port itself resets a half-done sequence.
        for p in [1111, 2222, 22, 3333] {
            h.run(&to(A, p));
        }
        assert_eq!(h.run(&to(A, 22)).1, Action::Drop);
        assert!(stat(&h, "resets") >= 4);
        assert_eq!(stat(&h, "opened"), 0);
        for p in [1111, 2222, 3333] {
            h.run(&to(A, p));
        }
        assert_eq!(h.run(&to(A, 22)).1, Action::Pass, "a clean sequence still opens");
    }

    #[test]
    fn sources_are_isolated_and_other_traffic_passes() {
        let mut h = pk();
        // A and B interleave knocks: each machine only sees its own source.
        for p in [1111, 2222, 3333] {
            h.run(&to(A, p));
            h.run(&to(B, p));
        }
        let mut h2 = pk();
        for p in [1111, 2222] {
            h2.run(&to(A, p));
        }
        h2.run(&to(B, 3333));
        assert_eq!(h2.run(&to(B, 22)).1, Action::Drop, "B did not knock K1 K2");
        assert_eq!(h2.run(&to(A, 22)).1, Action::Drop, "A's sequence was not completed by B");
        assert_eq!(h.run(&to(A, 22)).1, Action::Pass);
        assert_eq!(h.run(&to(B, 22)).1, Action::Pass);
        // Other ports and non-TCP traffic pass without knocking.
        let mut h = pk();
        assert_eq!(h.run(&to(A, 443)).1, Action::Pass);
        assert_eq!(h.run(&udp4(A, SRV, 1, 22)).1, Action::Pass);
        assert_eq!(stat(&h, "non_tcp"), 1);
    }

    #[test]
    fn malformed_truncated_and_fragments() {
        let mut h = pk();
        let f = to(A, 22);
        for n in 0..f.len() {
            let a = h.run(&f[..n]).1;
            // A frame that still yields a key and a port is guarded; nothing else panics.
            if PktMeta::parse(&f[..n]).valid {
                assert_eq!(a, Action::Drop, "len {n}");
            } else {
                assert_eq!(a, Action::Pass, "len {n}");
            }
        }
        assert!(stat(&h, "unparsed") > 0);
        let mut frag = f.clone();
        frag[20..22].copy_from_slice(&0x0010u16.to_be_bytes());
        assert_eq!(h.run(&frag).1, Action::Drop, "fragment from a closed source");
        assert_eq!(stat(&h, "fragments_dropped"), 1);
        for p in [1111, 2222, 3333] {
            h.run(&to(A, p));
        }
        assert_eq!(h.run(&frag).1, Action::Pass, "fragment from an open source");
        assert_eq!(h.state_of(&f), Some(KnockState { stage: 3 }));
        // A corrupted stage value (never produced, but state is plain data) is treated as OPEN, no panic.
        let k = h.key_of(&f).unwrap();
        h.states.insert(k, KnockState { stage: u32::MAX });
        assert_eq!(h.run(&f).1, Action::Pass);
    }

    #[test]
    fn params() {
        let mk = |pairs: &[(&str, &str)]| {
            let mut p = Params::new("portknock", pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect());
            PortKnock::from_params(&mut p)
        };
        let d = mk(&[]).unwrap();
        assert_eq!((&d.knock[..3], d.n, d.protect, d.timeout_ns), (&[1111, 2222, 3333][..], 3, 22, None));
        let k = mk(&[("knock", "7-8"), ("protect", "2200"), ("timeout", "10")]).unwrap();
        assert_eq!((k.n, k.protect, k.timeout_ns), (2, 2200, Some(10_000_000_000)));
        assert!(mk(&[("knock", "1-x")]).unwrap_err().0.contains("'knock=1-x'"));
        assert!(mk(&[("knock", "")]).is_err());
        assert!(mk(&[("knock", "0-1")]).is_err());
        assert!(mk(&[("knock", "1-2-3-4-5-6-7-8-9")]).is_err());
        assert!(mk(&[("knock", "22-23")]).unwrap_err().0.contains("'protect=22'"));
        assert!(mk(&[("protect", "70000")]).is_err());
        assert_eq!(PortKnock::new(&[5], 6).unwrap().next_stage(0, 5), 1);
    }

    #[test]
    fn reconfigure_moves_the_protected_port_and_keeps_every_automaton() {
        let mut h = pk();
        for port in [1111, 2222, 3333] {
            h.run(&to(A, port));
        }
        h.run(&to(B, 1111));
        let p = |pairs: &[(&str, &str)]| {
            Params::new("portknock", pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
        };
        h.nf.reconfigure(&mut p(&[("protect", "2200")])).unwrap();
        assert_eq!(h.state_of(&to(A, 1)).unwrap().stage, 3, "A stays OPEN");
        assert_eq!(h.state_of(&to(B, 1)).unwrap().stage, 1, "B keeps its first knock");
        assert_eq!(h.run(&to(A, 2200)).1, Action::Pass, "an OPEN source reaches the new port");
        assert_eq!(h.run(&to(B, 22)).1, Action::Pass, "the old port is no longer guarded");
        assert_eq!(h.run(&to(B, 2200)).1, Action::Drop);
        for (pairs, why) in [
            (&[("knock", "1111-2222")][..], "knock is the sequence"),
            (&[("timeout", "5")][..], "timeout sets"),
            (&[("protect", "1111")][..], "also a knock port"),
        ] {
            let e = h.nf.reconfigure(&mut p(pairs)).unwrap_err();
            assert!(e.0.contains(why), "{e}");
        }
        assert_eq!(h.nf.protect, 2200, "a refused change changes nothing");
    }
}
