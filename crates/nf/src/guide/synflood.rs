//! `synflood`: SYN-flood detector. Counts TCP SYNs (without ACK) per
//! destination IP over a tumbling window; once a destination has received
//! more than `threshold` SYNs in the current window, further SYNs to it are
//! dropped (or, with `action=flag`, passed and counted) until the window ends.
//! Other packets always pass: established connections keep working.

use bytemuck::{Pod, Zeroable};
use flowplane_wire::flow::FiveTuple;
use flowplane_wire::tcp::TcpFlags;
use serde_json::json;

use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::Export;
use crate::stateful::{Action, Affinity, GlobalState, Granularity, Placement, StatefulNf};
use crate::{NfContext, ParamError, ParamSpec, Params};

const WINDOW: ParamSpec = ParamSpec::float("window", 1.0, 0.001, 86_400.0, "window in seconds");
const THRESHOLD: ParamSpec =
    ParamSpec::uint("threshold", 1000, 1, 1_000_000_000, "SYNs per destination per window before it is protected");
const ACTION: ParamSpec =
    ParamSpec::choice("action", "drop", &["drop", "flag"], "drop the excess SYNs, or pass and count them");

/// Registration: `nfs!` in `src/library.rs` finds `INFO` and `build` in every file it names.
pub const INFO: NfInfo = NfInfo {
    name: "synflood",
    about: "SYN-flood detector: SYNs per destination IP per window, excess SYNs dropped",
    keyed_by: KeyedBy::Fixed(Granularity::DstIp),
    params: &[WINDOW, THRESHOLD, ACTION],
};

/// Builds `synflood` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(SynFlood::from_params(p)?))
}

/// Per-destination state (plain data, no padding).
#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct SynFloodState {
    /// Start of the current window, ns.
    pub window_start_ns: u64,
    /// SYNs in the current window.
    pub syns: u64,
    /// Windows in which this destination went over the threshold.
    pub flagged_windows: u32,
    /// 1 while over the threshold (until the window ends).
    pub flagged: u32,
}

/// The SYN-flood detector.
#[derive(Debug)]
pub struct SynFlood {
    window_ns: u64,
    threshold: u64,
    drop: bool,
    destinations: u64,
    excess_syns: u64,
}

impl SynFlood {
    /// `synflood(window=S, threshold=N, action=drop|flag)`.
    pub fn from_params(p: &mut Params) -> Result<Self, ParamError> {
        let window = p.float(&WINDOW)?;
        let threshold = p.uint(&THRESHOLD)?;
        let drop = p.choice(&ACTION, [true, false])?;
        Ok(SynFlood { window_ns: (window * 1e9) as u64, threshold, drop, destinations: 0, excess_syns: 0 })
    }
}

impl StatefulNf for SynFlood {
    type State = SynFloodState;

    fn name(&self) -> &'static str {
        INFO.name
    }

    fn granularity(&self) -> Granularity {
        Granularity::DstIp
    }

    /// A SYN's verdict depends on the SYNs before it to its destination: they must meet on one core, in order
    /// (the runtime steers by destination, or refuses a strategy that sprays them).
    fn placement(&self) -> Placement {
        Placement { affinity: Affinity::Destination, global: GlobalState::None }
    }

    fn init(&mut self, _pkt: &Pkt<'_>, ctx: &NfContext) -> SynFloodState {
        self.destinations += 1;
        SynFloodState { window_start_ns: ctx.now_ns, ..SynFloodState::zeroed() }
    }

    #[inline]
    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut SynFloodState, ctx: &NfContext) -> Action {
        // Not TCP (None), or not a connection's first SYN: always passes.
        let Some(flags) = pkt.tcp_flags() else { return Action::Pass };
        if !flags.contains(TcpFlags::SYN) || flags.contains(TcpFlags::ACK) {
            return Action::Pass;
        }
        // The packet clock may step back a little (a capture, cores sharing this state): only a forward step ends
        // a window.
        if ctx.now_ns.saturating_sub(st.window_start_ns) >= self.window_ns {
            st.window_start_ns = ctx.now_ns;
            st.syns = 0;
            st.flagged = 0;
        }
        st.syns = st.syns.saturating_add(1);
        if st.syns <= self.threshold {
            return Action::Pass;
        }
        if st.flagged == 0 {
            st.flagged = 1;
            st.flagged_windows = st.flagged_windows.saturating_add(1);
        }
        self.excess_syns += 1;
        if self.drop {
            Action::Drop
        } else {
            Action::Pass
        }
    }

    fn report(&self) -> Option<serde_json::Value> {
        Some(json!({ "destinations_seen": self.destinations, "excess_syns": self.excess_syns }))
    }

    fn export_kind(&self) -> Export {
        Export::State
    }

    /// `key` is the destination projected to a 5-tuple: the source, ports and protocol are zero.
    fn export_row(&self, key: &FiveTuple, st: &SynFloodState) -> Option<serde_json::Value> {
        Some(json!({ "dst": key.dst_ip().to_string(), "syns": st.syns, "flagged_windows": st.flagged_windows }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{tcp4, Harness};

    const SYN: u8 = TcpFlags::SYN.0;
    const ACK: u8 = TcpFlags::ACK.0;

    fn synflood(pairs: &[(&str, &str)]) -> Result<SynFlood, ParamError> {
        let pairs = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        SynFlood::from_params(&mut Params::new("synflood", pairs))
    }

    #[test]
    fn excess_syns_to_one_destination_are_dropped_until_the_window_ends() {
        let mut h = Harness::new(synflood(&[("threshold", "2"), ("window", "0.5")]).unwrap());
        let syn = |src: u8| tcp4([10, 0, 0, src], [192, 0, 2, 1], 40000, 80, SYN, 1, 0);
        assert_eq!(h.run(&syn(1)).1, Action::Pass);
        assert_eq!(h.run(&syn(2)).1, Action::Pass);
        assert_eq!(h.run(&syn(3)).1, Action::Drop); // three sources, one victim
        let established = tcp4([10, 0, 0, 1], [192, 0, 2, 1], 40000, 80, ACK, 2, 1);
        assert_eq!(h.run(&established).1, Action::Pass); // connections keep working
        h.now_ns = 500_000_000; // the window has ended
        assert_eq!(h.run(&syn(4)).1, Action::Pass);
        assert_eq!(h.state_of(&syn(9)).unwrap().flagged_windows, 1);
        assert_eq!(h.nf.report().unwrap()["excess_syns"], 1);
    }

    #[test]
    fn bad_parameters_are_refused_and_flag_passes_the_excess() {
        for bad in [("threshold", "0"), ("window", "-1"), ("action", "block")] {
            assert!(synflood(&[bad]).is_err(), "{bad:?}");
        }
        let mut h = Harness::new(synflood(&[("threshold", "1"), ("action", "flag")]).unwrap());
        let syn = tcp4([10, 0, 0, 1], [192, 0, 2, 1], 40000, 80, SYN, 1, 0);
        assert_eq!(h.run(&syn).1, Action::Pass);
        assert_eq!(h.run(&syn).1, Action::Pass); // over the threshold: counted, not dropped
        assert_eq!(h.nf.report().unwrap()["excess_syns"], 1);
    }
}
