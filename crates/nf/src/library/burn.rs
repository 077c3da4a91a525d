//! `burn(iters=N)`: a program of tunable compute cost for SCR's scaling
//! limit (Fig. 9): every packet runs N rounds of dependent integer
//! arithmetic on its source's one-word state, in `process` and, under
//! `--scale scr`, in the state transition of every history entry too — so
//! the replicated compute grows with N while dispatch stays the same. It
//! never drops; its only state is the per-source accumulator. A packet whose
//! source found no room (the table full) passes, counted as `table_full`.

use bytemuck::{Pod, Zeroable};
use flowplane_wire::scr::{ScrFields, ScrRecord};
use serde_json::json;

use crate::pkt::Pkt;
use crate::registry::{KeyedBy, NfInfo, NfSink};
use crate::report::merge_keeping;
use crate::stateful::{Action, Affinity, GlobalState, Granularity, Placement, StatefulNf};
use crate::{NfContext, ParamError, ParamSpec, Params};

const ITERS: ParamSpec = ParamSpec::uint("iters", 0, 0, 1_000_000, "rounds of dependent arithmetic per packet");

/// Registration (see [`crate::registry::NFS`]).
pub const INFO: NfInfo = NfInfo {
    name: "burn",
    about: "tunable compute per packet (N dependent multiply-xor rounds on a per-source word): SCR's Fig. 9 program",
    keyed_by: KeyedBy::Fixed(Granularity::SrcIp),
    params: &[ITERS],
};

/// Builds `burn` from its parameters and hands it to `sink`.
pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out, ParamError> {
    Ok(sink.stateful(Burn { iters: p.uint(&ITERS)? as u32, table_full: 0 }))
}

/// The per-source accumulator.
#[derive(Clone, Copy, Pod, Zeroable, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct BurnState {
    /// Result of the rounds so far.
    pub acc: u64,
}

/// The program.
#[derive(Debug)]
pub struct Burn {
    iters: u32,
    table_full: u64,
}

impl Burn {
    #[inline]
    fn rounds(&self, st: &mut BurnState, seed: u64) {
        let mut x = st.acc ^ seed;
        for _ in 0..self.iters {
            x = (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        }
        st.acc = x;
    }
}

impl StatefulNf for Burn {
    type State = BurnState;

    fn name(&self) -> &'static str {
        INFO.name
    }

    fn granularity(&self) -> Granularity {
        Granularity::SrcIp
    }

    fn placement(&self) -> Placement {
        Placement { affinity: Affinity::Source, global: GlobalState::None }
    }

    fn init(&mut self, _pkt: &Pkt<'_>, _ctx: &NfContext) -> BurnState {
        BurnState::default()
    }

    #[inline]
    fn process(&mut self, pkt: &mut Pkt<'_>, st: &mut BurnState, _ctx: &NfContext) -> Action {
        self.rounds(st, pkt.len() as u64);
        Action::Pass
    }

    fn scr_fields(&self) -> Option<ScrFields> {
        Some(ScrFields::SRC_IP.with(ScrFields::LEN))
    }

    #[inline]
    fn scr_transition(&mut self, st: &mut BurnState, r: &ScrRecord, _ctx: &NfContext) -> bool {
        self.rounds(st, u64::from(r.len));
        true
    }

    /// Fails open: counted as `table_full`, passed untouched.
    fn on_no_state(&mut self) -> Action {
        self.table_full += 1;
        Action::Pass
    }

    fn report(&self) -> Option<serde_json::Value> {
        Some(json!({ "iters": self.iters, "table_full": self.table_full }))
    }

    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        merge_keeping(into, other, &["iters"]);
    }
}
