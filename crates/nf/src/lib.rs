//! `flowplane-nf`: the NF API and the NF library.
//!
//! An NF is a small component with a clear port contract (FastClick's
//! element model): it receives a whole [`Batch`], may rewrite packets, and
//! sets each packet's verdict (an output port, or drop). It never splits
//! the batch. Stateless elements implement [`Nf`] directly; the stateful
//! programming model (declared flow granularity and state, add-on-miss
//! default action, per-packet action) builds on the same trait.
//!
//! The NF library lives in `src/library/`, one file per NF, each named on
//! one line of the library's `nfs!` table; the [`registry`] creates NFs by
//! name from a chain spec. Each NF declares its parameters once
//! ([`ParamSpec`]); parsing and `flowplane nfs` read that declaration.
//! Frame builders and a one-NF harness for tests are in `testutil`
//! (cargo feature `testutil`).

#![forbid(unsafe_code)]

/// The complete example of docs/WRITING_AN_NF.md, compiled and tested with the crate (`crates/nf/tests/guide.rs`
/// checks the guide shows this file). Not registered: its `build` is the guide's, unused here.
#[cfg(test)]
#[allow(dead_code)]
#[path = "guide/synflood.rs"]
mod guide_synflood;
pub mod ipfix;
mod library;
pub mod maglev;
pub mod param_spec;
pub mod params;
pub mod pkt;
pub mod registry;
pub mod repl;
pub mod report;
pub mod stateful;
#[cfg(any(test, feature = "testutil"))]
pub mod testutil;
pub mod topk;

// The NF modules keep their paths: `flowplane_nf::nat::Nat`.
pub use library::*;

use flowplane_packet::{Batch, PacketPool};
use serde::Serialize;

pub use param_spec::{ParamKind, ParamSpec};
pub use params::{human_bytes, mem_available, read_text_file, ParamError, Params, MAX_FILE_BYTES};
pub use pkt::{Pkt, PktMeta};
pub use registry::{KeyedBy, NfInfo, NfSink};
pub use report::Export;
pub use stateful::{Action, Affinity, GlobalState, Granularity, Placement, StatefulNf};

/// Per-NF packet counters, reported at the end of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NfCounters {
    /// Packets that reached the NF (not already dropped upstream).
    pub packets_in: u64,
    /// Packets the NF passed on.
    pub packets_out: u64,
    /// Packets the NF dropped.
    pub dropped: u64,
    /// Bytes that reached the NF.
    pub bytes_in: u64,
}

impl NfCounters {
    /// Adds another core's counters.
    pub fn merge(&mut self, o: &NfCounters) {
        self.packets_in += o.packets_in;
        self.packets_out += o.packets_out;
        self.dropped += o.dropped;
        self.bytes_in += o.bytes_in;
    }
}

/// Context an NF action gets: the packet clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct NfContext {
    /// TSC reading when the batch was received (processing time; for
    /// measurement, not for NF semantics).
    pub now_tsc: u64,
    /// The packet's time in ns (the packet clock): a replayed capture's own
    /// timestamp after its first packet (whatever the replay speed; loops
    /// continue forward), the receive time on a live port. Not guaranteed
    /// monotonic: captures can step back; NFs saturate differences.
    pub now_ns: u64,
}

/// A network function instance, owned by one core.
pub trait Nf: Send {
    /// The NF's name as written in chain specs.
    fn name(&self) -> &'static str;

    /// Processes packets `range` of the batch in place (the executor may cut
    /// a batch into consecutive ranges; see `StatefulNf::ENDS_FLOWS`).
    /// Packets whose verdict is already `DROP` must be skipped (and not
    /// counted as input).
    fn process(&mut self, batch: &mut Batch, range: std::ops::Range<usize>, ctx: &NfContext);

    /// Packet counters so far.
    fn counters(&self) -> NfCounters;

    /// NF-specific state or results to report (JSON object), if any.
    fn report(&self) -> Option<serde_json::Value> {
        None
    }

    /// Merges another core's `report()` into `into` (default: numbers add,
    /// objects merge, arrays concatenate; see [`report::merge_default`]).
    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        report::merge_default(into, other)
    }

    /// What `--export` writes for this NF: [`Export::None`] (refused) or
    /// [`Export::Report`] (rows from the merged report).
    fn export_kind(&self) -> Export {
        Export::None
    }

    /// The export rows, from the report merged over every core.
    fn export_report_rows(&self, _merged: &serde_json::Value) -> Vec<serde_json::Value> {
        Vec::new()
    }

    /// True when this element changes which flow a packet belongs to
    /// (tunnel decapsulation or encapsulation, as `upf` does). The executors
    /// parse and look a packet up once, as it arrives, so a chain refuses
    /// stateful NFs after such an element: they would keep state per outer
    /// tunnel instead of per inner flow.
    fn rewrites_flow(&self) -> bool {
        false
    }

    /// What this element's own state needs on several cores, checked against
    /// the strategy as a stateful NF's [`StatefulNf::placement`] is (steered,
    /// or the chain refused). `None`: no state, or per-core figures that add
    /// up (counters); an element keeping private per-core state that later
    /// packets depend on must declare it, or a spraying strategy runs it wrong.
    fn placement(&self) -> Option<Placement> {
        None
    }

    /// Takes new values of its run-time parameters (`flowplane ctl set`,
    /// `load`) between two batches, keeping its state: `p` holds every
    /// parameter as the chain now gives it. Default: the parameters are
    /// fixed for the run.
    fn reconfigure(&mut self, _p: &mut Params) -> Result<(), ParamError> {
        Err(fixed_for_run(self.name()))
    }

    /// The element feeds the IPFIX exporter usage records (`upf`'s URRs):
    /// the engine then hands it a record queue ([`Nf::attach_ipfix`]) and
    /// tells it of the run's end ([`Nf::ipfix_end`]). Default: no.
    fn ipfix_usage_on(&self) -> bool {
        false
    }

    /// Takes this core's IPFIX record queue (`--ipfix`) and the active
    /// timeout (`--ipfix-active`: report what was counted since the last
    /// record every `active_ns` of packet time; None: only at the run's end).
    /// The element checks its timer itself: per call of [`Nf::process`]
    /// (the batch's time, `NfContext::now_ns`) and [`Nf::tick`] (an idle
    /// port), never per packet. Default: the queue is dropped.
    fn attach_ipfix(&mut self, _tx: ipfix::RecordTx, _active_ns: Option<u64>) {}

    /// The run's end (`end_ns`: its last packet time over every core): the
    /// records of what was counted since the last ones. Default: none.
    fn ipfix_end(&mut self, _end_ns: u64) {}

    /// Time passed on the packet clock without a packet (an idle live port's timer
    /// tick, about ten times a second): private timers advance to `now_ns`.
    /// Default: nothing (state judged at lookup needs no timer).
    fn tick(&mut self, _now_ns: u64) {}

    /// The element keeps packets to send later ([`Nf::release`]): `upf`'s
    /// buffering FARs. Asked once when the chain is built. Default: no.
    fn holds_packets(&self) -> bool {
        false
    }

    /// Packets the element sends now that no batch brought (buffered packets
    /// whose FAR forwards again): appended to `out` (at most `out.room()`,
    /// copies into buffers from `pool`, verdicts set), in the order they must
    /// leave. The worker calls it after the chain ran a batch — the packets
    /// leave behind that batch's own and later stages do not see them — and
    /// when its source is idle (into an empty batch, `ctx.now_ns` the source's
    /// clock). No allocation: a pool or batch without room leaves the rest for
    /// the next call. Only called when [`Nf::holds_packets`] said so.
    fn release(&mut self, _pool: &mut PacketPool, _out: &mut Batch, _ctx: &NfContext) {}
}

/// The refusal of an NF whose parameters cannot change while it runs.
pub fn fixed_for_run(nf: &str) -> ParamError {
    ParamError(format!("{nf}: its parameters are fixed for the run (a restart changes them)"))
}
