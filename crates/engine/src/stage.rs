//! The engine's face of a stateful NF: its state as a byte range of a block
//! the executor owns, and its per-packet action looped over a whole batch.
//!
//! NFs are written against [`StatefulNf`] with a typed `State` and never see
//! tables or batches of state. The registry hands each NF to the chain
//! compiler with its concrete type ([`flowplane_nf::registry::NfSink`]), which
//! boxes it as a [`StatefulStage`]: one virtual call per NF per batch, the
//! loop inside monomorphised over the NF.

use std::ops::Range;

use bytemuck::{Pod, Zeroable};
use flowplane_nf::ipfix::EndReason;
use flowplane_nf::stateful::{Action, Cursor, Granularity, IdleStamp, StatefulNf, Step};
use flowplane_nf::{Export, NfContext, NfCounters, Pkt, PktMeta};
use flowplane_packet::{Batch, Lanes, Verdict, DROP};
use flowplane_wire::flow::FiveTuple;

use crate::store::{FlowRef, FlowStore, StoreStates};

/// What a batch pass of one NF produced.
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchOutcome {
    /// Counters to add to the NF's totals.
    pub counters: NfCounters,
    /// Bit i: packet i ended its flow.
    pub end: [u64; 4],
    /// The NF ends flows and one did: it stopped after this many packets of
    /// the batch (the executor applies the end before going on).
    pub stopped_at: Option<usize>,
    /// Bit i: packet i's flow was refused on its first packet ([`Action::Refuse`]; also set in `end`).
    pub refused: [u64; 4],
}

impl BatchOutcome {
    /// Marks packet `i` as ending its flow.
    #[inline(always)]
    pub fn mark_end(&mut self, i: usize) {
        self.end[i >> 6] |= 1 << (i & 63);
    }

    /// Adds this pass's ends to a segment's `ends` and `refused` (`refused` within `ends`): a flow one stage
    /// ends outright ([`End::Flow`]) is ended even where another refused it, as run-to-completion's
    /// strongest end per packet.
    #[inline]
    pub fn merge_into(&self, ends: &mut [u64; 4], refused: &mut [u64; 4]) {
        for w in 0..4 {
            let flow = (ends[w] & !refused[w]) | (self.end[w] & !self.refused[w]);
            ends[w] |= self.end[w];
            refused[w] = (refused[w] | self.refused[w]) & !flow;
        }
    }

    /// Marks packet `i`'s flow as refused (removed as never inserted, with no stop).
    #[inline(always)]
    pub fn mark_refused(&mut self, i: usize) {
        self.mark_end(i);
        self.refused[i >> 6] |= 1 << (i & 63);
    }
}

/// Whether a packet ends its flow, by the NF's action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum End {
    /// It does not.
    No,
    /// Refused on its first packet ([`Action::Refuse`]): the entry goes as never inserted.
    Refused,
    /// Ends it ([`Action::EndFlow`], [`Action::DropEndFlow`]).
    Flow,
}

/// Packet `i` reaching an NF: counted in (packets and bytes) and true, or
/// false with nothing counted if an earlier NF dropped it.
#[inline(always)]
pub(crate) fn arrive(batch: &Batch, i: usize, c: &mut NfCounters) -> bool {
    if batch.is_dropped(i) {
        return false;
    }
    c.packets_in += 1;
    c.bytes_in += batch.lens()[i] as u64;
    true
}

/// Writes an action's verdict into `v`; returns (the packet is dropped, it
/// ends its flow). The one rule behind [`apply_action`] and the batch loop.
#[inline(always)]
fn set_verdict(v: &mut Verdict, a: Action) -> (bool, End) {
    match a {
        Action::Pass => (false, End::No),
        Action::Port(p) => {
            *v = p.min(DROP - 1);
            (false, End::No)
        }
        Action::Drop => {
            *v = DROP;
            (true, End::No)
        }
        Action::EndFlow => (false, End::Flow),
        Action::DropEndFlow => {
            *v = DROP;
            (true, End::Flow)
        }
        Action::Refuse => {
            *v = DROP;
            (true, End::Refused)
        }
    }
}

/// Applies an action to packet `i`'s verdict and counts it out or dropped;
/// returns whether it ends the flow.
#[inline(always)]
pub fn apply_action(batch: &mut Batch, i: usize, a: Action, c: &mut NfCounters) -> End {
    let (dropped, ends) = set_verdict(&mut batch.verdicts_mut()[i], a);
    if dropped {
        c.dropped += 1;
    } else {
        c.packets_out += 1;
    }
    ends
}

/// The context an NF action on packet `i` sees: the packet's own time.
#[inline(always)]
pub(crate) fn packet_ctx(batch: &Batch, i: usize, ctx: &NfContext) -> NfContext {
    NfContext { now_ns: batch.timestamps()[i], ..*ctx }
}

/// A stateful NF as executors drive it: state as bytes at an offset the
/// chain compiler chose.
pub trait StatefulStage: Send {
    /// Name.
    fn name(&self) -> &'static str;
    /// Granularity.
    fn granularity(&self) -> Granularity;
    /// Bytes of state.
    fn state_size(&self) -> usize;
    /// Alignment of the state type.
    fn state_align(&self) -> usize;
    /// Idle timeout.
    fn idle_timeout_ns(&self) -> Option<u64>;
    /// Where the NF's idle stamp sits in the aggregated block (None: the
    /// block's expiry is the NF's own, or the state is not in such a block);
    /// the chain compiler sets it when it lays the block out.
    fn set_idle(&mut self, idle: Option<BlockIdle>);
    /// States this NF found idle by its block stamp and reset.
    fn idle_resets(&self) -> u64;
    /// The NF's state holds resources released by its release callback.
    fn has_release(&self) -> bool;
    /// Why the NF's state must not be evicted ([`StatefulNf::NO_EVICT`]).
    fn no_evict(&self) -> Option<&'static str>;
    /// The NF must see both directions of a connection on one core.
    fn both_directions(&self) -> bool;
    /// What the state needs on several cores.
    fn placement(&self) -> flowplane_nf::Placement;
    /// The NF may end flows (`StatefulNf::ENDS_FLOWS`).
    fn ends_flows(&self) -> bool;
    /// Runs the default action, writing the initial state into `out` (exactly `state_size` bytes).
    fn init_into(&mut self, pkt: &Pkt<'_>, ctx: &NfContext, out: &mut [u8]);
    /// SCR: the fields the NF's state transition reads (None: not SCR-aware).
    fn scr_fields(&self) -> Option<flowplane_nf::stateful::ScrFields> {
        None
    }
    /// SCR: the initial state of a key first met in a history record.
    fn scr_init_bytes(&mut self, _rec: &flowplane_nf::stateful::ScrRecord, _ctx: &NfContext, _out: &mut [u8]) {}
    /// SCR: the state transition of one history packet; false if it would be dropped.
    fn scr_transition_bytes(
        &mut self,
        _state: &mut [u8],
        _rec: &flowplane_nf::stateful::ScrRecord,
        _ctx: &NfContext,
    ) -> bool {
        true
    }
    /// SCR: digest of the NF's own state (`StatefulNf::scr_digest`).
    fn scr_digest(&self) -> u64 {
        0
    }
    /// SCR: fast-forwards this NF's replica `t` over `recs` in order,
    /// skipping entries not `alive` and clearing `alive` for those its
    /// transition would drop (monomorphised: one virtual call per batch of entries).
    fn scr_fast_forward(
        &mut self,
        _t: &mut crate::scr::ReplicaTable,
        _recs: &[flowplane_nf::stateful::ScrRecord],
        _alive: &mut [bool],
    ) {
    }
    /// SCR: this NF's share of a whole batch, in sequence order — for each
    /// planned packet, its history entries not yet applied (fast-forwarded
    /// as [`Self::scr_fast_forward`], `alive` indexed like `b.hist`), then
    /// the packet's own action with its record's time (monomorphised: one
    /// virtual call per NF per batch). Dropped packets are skipped.
    fn scr_batch(
        &mut self,
        _t: &mut crate::scr::ReplicaTable,
        _b: &crate::scr::ScrBatch<'_>,
        _alive: &mut [bool],
        _batch: &mut Batch,
        _counters: &mut NfCounters,
    ) {
    }
    /// Packet `i` through the NF, as one iteration of
    /// [`StatefulStage::process_batch`] (the run-to-completion executors'
    /// step: one virtual call per NF per packet): skips it if already
    /// dropped, counts it, runs the action on `flow`'s state at `offset`,
    /// applies the verdict. Returns whether the packet ends its flow.
    #[allow(clippy::too_many_arguments)]
    fn process_one(
        &mut self,
        batch: &mut Batch,
        i: usize,
        meta: &PktMeta,
        flow: FlowRef,
        store: &mut FlowStore,
        offset: usize,
        ctx: &NfContext,
        counters: &mut NfCounters,
    ) -> End;
    /// Runs the per-packet action on `state` (exactly `state_size` bytes).
    fn process_bytes(&mut self, pkt: &mut Pkt<'_>, state: &mut [u8], ctx: &NfContext) -> Action;
    /// The NF's action is resumable (`StatefulNf::STEPS`).
    fn steps(&self) -> bool;
    /// Its resumable action is one prefetch its hook already makes (`StatefulNf::ONE_STEP`).
    fn one_step(&self) -> bool;
    /// One step of the resumable action on `state` (exactly `state_size` bytes).
    fn step_bytes(&self, pkt: &Pkt<'_>, state: &[u8], cur: &mut Cursor) -> Step;
    /// The action resumed from `cur` (same result as `process_bytes`).
    fn finish_bytes(&mut self, pkt: &mut Pkt<'_>, state: &mut [u8], ctx: &NfContext, cur: &Cursor) -> Action;
    /// Release callback; an NF feeding IPFIX first records the flow's end (`reason`).
    fn release_bytes(&mut self, key: &FiveTuple, state: &[u8], reason: EndReason);
    /// The NF feeds the IPFIX exporter ([`StatefulNf::IPFIX`]).
    fn ipfix_on(&self) -> bool;
    /// Hands the NF its per-core IPFIX record queue.
    fn attach_ipfix(&mut self, tx: flowplane_nf::ipfix::RecordTx);
    /// Hands the NF the run's hash secret ([`StatefulNf::set_hash_secret`]).
    fn set_hash_secret(&mut self, secret: u32);
    /// A flow record for `state` without ending it (active timeout, the run's end).
    fn ipfix_flow_bytes(&mut self, key: &FiveTuple, state: &[u8], reason: EndReason);
    /// [`StatefulNf::REPL`].
    fn repl(&self) -> Result<(), &'static str>;
    /// [`StatefulNf::attach_repl`].
    fn attach_repl(&mut self, tx: flowplane_nf::repl::ReplTx);
    /// [`StatefulNf::repl_adopt`] of a received state (`bytes`, unaligned; another size is refused):
    /// the adopted state goes into `out`'s first `state_size()` bytes.
    fn repl_adopt_bytes(&mut self, key: &FiveTuple, bytes: &[u8], now_ns: u64, out: &mut [u8]) -> bool;
    /// [`StatefulNf::repl_forget`].
    fn repl_forget_bytes(&mut self, key: &FiveTuple, state: &[u8]);
    /// [`StatefulNf::repl_entry`].
    fn repl_entry_bytes(&mut self, key: &FiveTuple, state: &[u8]);
    /// Unparsed packets.
    fn on_unparsed(&mut self) -> Action;
    /// Packets with a key but no state (table full): counted by the NF, its verdict.
    fn on_no_state(&mut self) -> Action;
    /// The same with the packet and its time ([`StatefulNf::on_no_state_pkt`]).
    fn on_no_state_pkt(&mut self, pkt: &Pkt<'_>, ctx: &NfContext) -> Action;
    /// The NF fails open without state (the NF's rule, [`StatefulNf::passes_without_state`]).
    fn passes_without_state(&self) -> bool;
    /// The run's end (the NF's hook, [`StatefulNf::end_of_run`]).
    fn end_of_run(&mut self, end_ns: u64);
    /// Report.
    fn report(&self) -> Option<serde_json::Value>;
    /// Merges another core's report into `into` (the NF's merge hook).
    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value);
    /// What `--export` writes for the NF.
    fn export_kind(&self) -> Export;
    /// Export row.
    fn export_row_bytes(&self, key: &FiveTuple, state: &[u8]) -> Option<serde_json::Value>;
    /// Export row of a coarse key without a 5-tuple projection (TEID, field set).
    fn export_raw_row_bytes(&self, key: u128, state: &[u8]) -> Option<serde_json::Value>;
    /// Export rows derived from the merged report.
    fn export_report_rows(&self, merged: &serde_json::Value) -> Vec<serde_json::Value>;
    /// New run-time parameters (between two batches; the NF's hook).
    fn reconfigure(&mut self, p: &mut flowplane_nf::Params) -> Result<(), flowplane_nf::ParamError>;
    /// Time passed without a packet (the NF's hook, [`StatefulNf::tick`]).
    fn tick(&mut self, now_ns: u64);
    /// Runs the per-packet action over packets `range` of a batch.
    /// `flows[i]` names packet i's block in `store`; this NF's state sits at
    /// `offset`. The prefetch hook runs `ahead` packets in advance (0:
    /// never). End-of-flow requests are OR-ed into `out.end`.
    #[allow(clippy::too_many_arguments)]
    fn process_batch(
        &mut self,
        batch: &mut Batch,
        range: Range<usize>,
        metas: &[PktMeta],
        flows: &[FlowRef],
        store: &mut FlowStore,
        offset: usize,
        ctx: &NfContext,
        ahead: usize,
        out: &mut BatchOutcome,
    );
    /// The interleaved executor's step pass for this NF (GuNFu's scheduler,
    /// monomorphised over the NF: no virtual call per step): the packets
    /// `todo` lists run their resumable action's steps with `k` tasks in
    /// flight, visited round-robin. A visit runs a task's steps until one
    /// names a line, which is prefetched (`prefetch`) while the other tasks
    /// run, or until the action can finish; a finished task's slot takes the
    /// next packet of `todo`. `cursors[i]` records packet i's progress (every
    /// cursor of the slice is reset first); `flows[i]` names its block in
    /// `store`, this NF's state at `offset`. Steps only read.
    #[allow(clippy::too_many_arguments)]
    fn step_pass(
        &self,
        batch: &mut Batch,
        todo: &[u16],
        metas: &[PktMeta],
        flows: &[FlowRef],
        store: &FlowStore,
        offset: usize,
        k: usize,
        prefetch: bool,
        cursors: &mut [Cursor],
    );
    /// [`StatefulStage::process_batch`] with each packet's action resumed
    /// from its cursor, `cursors[i]` for packet i (`StatefulNf::finish`):
    /// the interleaved executor's finishing pass.
    #[allow(clippy::too_many_arguments)]
    fn finish_batch(
        &mut self,
        batch: &mut Batch,
        range: Range<usize>,
        metas: &[PktMeta],
        flows: &[FlowRef],
        store: &mut FlowStore,
        offset: usize,
        ctx: &NfContext,
        ahead: usize,
        cursors: &[Cursor],
        out: &mut BatchOutcome,
    );
}

/// Most tasks in flight in a step pass (`interleaved:K`'s largest K).
pub const MAX_TASKS: usize = 64;

/// Most steps of one packet's action in a step pass (a bound on a
/// misbehaving NF; its finish completes whatever the steps left).
const MAX_STEPS: u16 = 512;

/// An NF's idle stamp in the aggregated block (see [`crate::chain::IdleSlot`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIdle {
    /// Byte offset of the stamp in the block (before the NF's state).
    pub at: usize,
    /// The NF's timeout, ns.
    pub timeout_ns: u64,
}

/// A stage's block stamp and how often it reset the state.
#[derive(Clone, Copy, Debug, Default)]
pub struct StampCheck {
    slot: Option<BlockIdle>,
    resets: u64,
}

/// A [`StatefulNf`] of concrete type `T`, boxed as a [`StatefulStage`].
pub struct Typed<T>(pub T, StampCheck);

impl<T> Typed<T> {
    /// `nf` as a stage (no block stamp until the chain compiler sets one).
    pub fn new(nf: T) -> Self {
        Typed(nf, StampCheck::default())
    }
}

/// Reads the state at the front of `bytes` (blocks are 64-byte aligned and
/// offsets respect the state's alignment, so this is a plain cast).
#[inline(always)]
fn cast<S: Pod>(bytes: &[u8]) -> &S {
    bytemuck::from_bytes(&bytes[..std::mem::size_of::<S>()])
}

#[inline(always)]
fn cast_mut<S: Pod>(bytes: &mut [u8]) -> &mut S {
    bytemuck::from_bytes_mut(&mut bytes[..std::mem::size_of::<S>()])
}

/// The stamp at `at` and the `S` at `offset` (after the stamp) of a block;
/// None if they do not fit.
#[inline]
fn stamped<S: Pod>(block: &mut [u8], offset: usize, at: usize) -> Option<(&mut [u8; 8], &mut S)> {
    if at.checked_add(8)? > offset || offset.checked_add(std::mem::size_of::<S>())? > block.len() {
        return None;
    }
    let (head, tail) = block.split_at_mut(offset);
    let stamp = (&mut head[at..at + 8]).try_into().ok()?;
    Some((stamp, cast_mut::<S>(tail)))
}

impl<T: StatefulNf> StatefulStage for Typed<T> {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn granularity(&self) -> Granularity {
        self.0.granularity()
    }
    fn state_size(&self) -> usize {
        std::mem::size_of::<T::State>()
    }
    fn state_align(&self) -> usize {
        std::mem::align_of::<T::State>()
    }
    fn idle_timeout_ns(&self) -> Option<u64> {
        self.0.idle_timeout_ns()
    }
    fn set_idle(&mut self, idle: Option<BlockIdle>) {
        self.1.slot = idle;
    }
    fn idle_resets(&self) -> u64 {
        self.1.resets
    }
    fn has_release(&self) -> bool {
        T::HAS_RELEASE
    }
    fn no_evict(&self) -> Option<&'static str> {
        T::NO_EVICT
    }
    fn both_directions(&self) -> bool {
        T::BOTH_DIRECTIONS
    }
    fn placement(&self) -> flowplane_nf::Placement {
        self.0.placement()
    }
    fn ends_flows(&self) -> bool {
        T::ENDS_FLOWS
    }
    #[inline]
    fn init_into(&mut self, pkt: &Pkt<'_>, ctx: &NfContext, out: &mut [u8]) {
        let s = self.0.init(pkt, ctx);
        *cast_mut::<T::State>(out) = s;
    }
    #[inline]
    fn process_one(
        &mut self,
        batch: &mut Batch,
        i: usize,
        meta: &PktMeta,
        flow: FlowRef,
        store: &mut FlowStore,
        offset: usize,
        ctx: &NfContext,
        counters: &mut NfCounters,
    ) -> End {
        if let Some(idle) = self.1.slot {
            return self.one_stamped(batch, i, meta, flow, store, offset, idle, ctx, None, counters).unwrap_or(End::No);
        }
        // One packet: one table's checked typed access, not a view of both.
        self.one(batch, i, meta, flow, |f| store.state_mut::<T::State>(f, offset), ctx, None, counters)
            .unwrap_or(End::No)
    }
    #[inline]
    fn process_bytes(&mut self, pkt: &mut Pkt<'_>, state: &mut [u8], ctx: &NfContext) -> Action {
        self.0.process(pkt, cast_mut::<T::State>(state), ctx)
    }
    fn scr_fields(&self) -> Option<flowplane_nf::stateful::ScrFields> {
        self.0.scr_fields()
    }
    fn scr_digest(&self) -> u64 {
        self.0.scr_digest()
    }
    #[inline]
    fn scr_fast_forward(
        &mut self,
        t: &mut crate::scr::ReplicaTable,
        recs: &[flowplane_nf::stateful::ScrRecord],
        alive: &mut [bool],
    ) {
        use crate::scr::ff::fast_forward;
        use crate::scr::KeyOf;
        // One loop per key kind, the key computation inlined.
        match t.key_of {
            KeyOf::Src => fast_forward::<T, _>(&mut self.0, t, recs, alive, |r| KeyOf::Src.key(r)),
            KeyOf::Dst => fast_forward::<T, _>(&mut self.0, t, recs, alive, |r| KeyOf::Dst.key(r)),
            KeyOf::Flow => fast_forward::<T, _>(&mut self.0, t, recs, alive, |r| KeyOf::Flow.key(r)),
            KeyOf::Connection => fast_forward::<T, _>(&mut self.0, t, recs, alive, |r| KeyOf::Connection.key(r)),
        }
    }
    #[inline]
    fn scr_batch(
        &mut self,
        t: &mut crate::scr::ReplicaTable,
        b: &crate::scr::ScrBatch<'_>,
        alive: &mut [bool],
        batch: &mut Batch,
        counters: &mut NfCounters,
    ) {
        use crate::scr::ff::batch as run;
        use crate::scr::KeyOf;
        let nf = &mut self.0;
        // One loop per key kind and alive bookkeeping (one stateful NF: none).
        // Per key kind: its key and its record masks, constants in each arm.
        let fields = if T::SCR_PURE { nf.scr_fields() } else { None };
        macro_rules! arm {
            ($kind:ident, $sole:literal) => {{
                let still = fields.and_then(|f| KeyOf::$kind.still_mask(f));
                run::<T, _, $sole>(
                    nf,
                    t,
                    b,
                    alive,
                    batch,
                    counters,
                    |r| KeyOf::$kind.key(r),
                    KeyOf::$kind.mask(),
                    still,
                )
            }};
        }
        match (t.key_of, b.sole) {
            (KeyOf::Src, true) => arm!(Src, true),
            (KeyOf::Src, false) => arm!(Src, false),
            (KeyOf::Dst, true) => arm!(Dst, true),
            (KeyOf::Dst, false) => arm!(Dst, false),
            (KeyOf::Flow, true) => arm!(Flow, true),
            (KeyOf::Flow, false) => arm!(Flow, false),
            (KeyOf::Connection, true) => arm!(Connection, true),
            (KeyOf::Connection, false) => arm!(Connection, false),
        }
    }
    fn scr_init_bytes(&mut self, rec: &flowplane_nf::stateful::ScrRecord, ctx: &NfContext, out: &mut [u8]) {
        *cast_mut::<T::State>(out) = self.0.scr_init(rec, ctx);
    }
    #[inline]
    fn scr_transition_bytes(
        &mut self,
        state: &mut [u8],
        rec: &flowplane_nf::stateful::ScrRecord,
        ctx: &NfContext,
    ) -> bool {
        self.0.scr_transition(cast_mut::<T::State>(state), rec, ctx)
    }
    fn steps(&self) -> bool {
        T::STEPS
    }
    fn one_step(&self) -> bool {
        T::ONE_STEP
    }
    #[inline]
    fn step_bytes(&self, pkt: &Pkt<'_>, state: &[u8], cur: &mut Cursor) -> Step {
        if T::STEPS {
            self.0.step(pkt, cast::<T::State>(state), cur)
        } else {
            Step::Ready
        }
    }
    #[inline]
    fn finish_bytes(&mut self, pkt: &mut Pkt<'_>, state: &mut [u8], ctx: &NfContext, cur: &Cursor) -> Action {
        if T::STEPS {
            self.0.finish(pkt, cast_mut::<T::State>(state), cur, ctx)
        } else {
            self.0.process(pkt, cast_mut::<T::State>(state), ctx)
        }
    }
    fn release_bytes(&mut self, key: &FiveTuple, state: &[u8], reason: EndReason) {
        let st = cast::<T::State>(state);
        if T::IPFIX {
            self.0.ipfix_flow(key, st, reason);
        }
        // Only an eviction ends a flow for lack of resources.
        if reason == EndReason::LackOfResources {
            self.0.evict(key, st)
        } else {
            self.0.release(key, st)
        }
    }
    fn ipfix_on(&self) -> bool {
        T::IPFIX
    }
    fn attach_ipfix(&mut self, tx: flowplane_nf::ipfix::RecordTx) {
        self.0.attach_ipfix(tx)
    }
    fn set_hash_secret(&mut self, secret: u32) {
        self.0.set_hash_secret(secret)
    }
    fn ipfix_flow_bytes(&mut self, key: &FiveTuple, state: &[u8], reason: EndReason) {
        if T::IPFIX {
            self.0.ipfix_flow(key, cast::<T::State>(state), reason)
        }
    }
    fn repl(&self) -> Result<(), &'static str> {
        T::REPL
    }
    fn attach_repl(&mut self, tx: flowplane_nf::repl::ReplTx) {
        self.0.attach_repl(tx)
    }
    fn repl_adopt_bytes(&mut self, key: &FiveTuple, bytes: &[u8], now_ns: u64, out: &mut [u8]) -> bool {
        let size = std::mem::size_of::<T::State>();
        if bytes.len() != size || out.len() < size {
            return false;
        }
        let mut st: T::State = bytemuck::pod_read_unaligned(bytes);
        if !self.0.repl_adopt(key, &mut st, now_ns) {
            return false;
        }
        out[..size].copy_from_slice(bytemuck::bytes_of(&st));
        true
    }
    fn repl_forget_bytes(&mut self, key: &FiveTuple, state: &[u8]) {
        self.0.repl_forget(key, cast::<T::State>(state))
    }
    fn repl_entry_bytes(&mut self, key: &FiveTuple, state: &[u8]) {
        self.0.repl_entry(key, cast::<T::State>(state))
    }
    fn on_unparsed(&mut self) -> Action {
        self.0.on_unparsed()
    }
    fn on_no_state(&mut self) -> Action {
        self.0.on_no_state()
    }
    fn on_no_state_pkt(&mut self, pkt: &Pkt<'_>, ctx: &NfContext) -> Action {
        self.0.on_no_state_pkt(pkt, ctx)
    }
    fn passes_without_state(&self) -> bool {
        self.0.passes_without_state()
    }
    fn end_of_run(&mut self, end_ns: u64) {
        self.0.end_of_run(end_ns)
    }
    fn report(&self) -> Option<serde_json::Value> {
        self.0.report()
    }
    fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        self.0.merge_report(into, other)
    }
    fn export_kind(&self) -> Export {
        self.0.export_kind()
    }
    fn export_row_bytes(&self, key: &FiveTuple, state: &[u8]) -> Option<serde_json::Value> {
        self.0.export_row(key, cast::<T::State>(state))
    }
    fn export_raw_row_bytes(&self, key: u128, state: &[u8]) -> Option<serde_json::Value> {
        self.0.export_raw_row(key, cast::<T::State>(state))
    }
    fn export_report_rows(&self, merged: &serde_json::Value) -> Vec<serde_json::Value> {
        self.0.export_report_rows(merged)
    }
    fn reconfigure(&mut self, p: &mut flowplane_nf::Params) -> Result<(), flowplane_nf::ParamError> {
        self.0.reconfigure(p)
    }

    fn tick(&mut self, now_ns: u64) {
        self.0.tick(now_ns)
    }

    #[inline]
    fn process_batch(
        &mut self,
        batch: &mut Batch,
        range: Range<usize>,
        metas: &[PktMeta],
        flows: &[FlowRef],
        store: &mut FlowStore,
        offset: usize,
        ctx: &NfContext,
        ahead: usize,
        out: &mut BatchOutcome,
    ) {
        self.run_batch::<false>(batch, range, metas, flows, store, offset, ctx, ahead, &[], out)
    }

    #[inline]
    fn step_pass(
        &self,
        batch: &mut Batch,
        todo: &[u16],
        metas: &[PktMeta],
        flows: &[FlowRef],
        store: &FlowStore,
        offset: usize,
        k: usize,
        prefetch: bool,
        cursors: &mut [Cursor],
    ) {
        cursors.fill(Cursor::default());
        if !T::STEPS {
            return;
        }
        let size = std::mem::size_of::<T::State>();
        let nf = &self.0;
        // One visit of packet i's task: true when it yielded on a prefetched line.
        let mut visit = |i: usize, budget: &mut u16| -> bool {
            let (Some(meta), Some(&f), Some(cur)) = (metas.get(i), flows.get(i), cursors.get_mut(i)) else {
                return false;
            };
            let Some(b) = store.block(f).get(offset..offset + size) else { return false };
            let st = cast::<T::State>(b);
            let pkt = Pkt::new(batch.data_mut(i), meta);
            while *budget > 0 {
                *budget -= 1;
                match nf.step(&pkt, st, cur) {
                    Step::Prefetch(p) if prefetch => {
                        flowplane_packet::prefetch::addr(p);
                        return *budget > 0;
                    }
                    // Without prefetching there is nothing to wait for: go on.
                    Step::Prefetch(_) => {}
                    Step::Ready => return false,
                }
            }
            false
        };
        // (packet, steps left) of the tasks in flight, `live` of them at the front.
        let mut slots = [(0u16, 0u16); MAX_TASKS];
        let k = k.clamp(1, MAX_TASKS);
        let (mut live, mut next) = (0, 0);
        while live < k && next < todo.len() {
            let (i, mut b) = (todo[next], MAX_STEPS);
            next += 1;
            if visit(usize::from(i), &mut b) {
                slots[live] = (i, b);
                live += 1;
            }
        }
        let mut t = 0;
        while live > 0 {
            if t >= live {
                t = 0;
            }
            let (i, mut b) = slots[t];
            if visit(usize::from(i), &mut b) {
                slots[t].1 = b;
                t += 1;
                continue;
            }
            // Done: the slot takes the next packet that has a line to wait for.
            let mut refill = None;
            while refill.is_none() && next < todo.len() {
                let (j, mut bj) = (todo[next], MAX_STEPS);
                next += 1;
                if visit(usize::from(j), &mut bj) {
                    refill = Some((j, bj));
                }
            }
            match refill {
                Some(task) => {
                    slots[t] = task;
                    t += 1;
                }
                // The batch is running out: the window shrinks, in order.
                None => {
                    slots.copy_within(t + 1..live, t);
                    live -= 1;
                }
            }
        }
    }

    #[inline]
    fn finish_batch(
        &mut self,
        batch: &mut Batch,
        range: Range<usize>,
        metas: &[PktMeta],
        flows: &[FlowRef],
        store: &mut FlowStore,
        offset: usize,
        ctx: &NfContext,
        ahead: usize,
        cursors: &[Cursor],
        out: &mut BatchOutcome,
    ) {
        self.run_batch::<true>(batch, range, metas, flows, store, offset, ctx, ahead, cursors, out)
    }
}

impl<T: StatefulNf> Typed<T> {
    /// The batch loop: each packet's action (`process`, or `finish` from
    /// `cursors[i]` when `RESUME`), the prefetch hook `ahead` packets early.
    /// The NF's state is reached through one typed view of the store, checked
    /// once per pass, not once per packet; the batch is split once into its
    /// parts ([`Batch::lanes_mut`]). The same rule as [`Typed::one`] (skip
    /// dropped packets, count the rest in, unparsed packets to
    /// `on_unparsed`), with the counters derived once per pass: packets and
    /// bytes in from the live packets, packets out as in minus dropped.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn run_batch<const RESUME: bool>(
        &mut self,
        batch: &mut Batch,
        range: Range<usize>,
        metas: &[PktMeta],
        flows: &[FlowRef],
        store: &mut FlowStore,
        offset: usize,
        ctx: &NfContext,
        ahead: usize,
        cursors: &[Cursor],
        out: &mut BatchOutcome,
    ) {
        if let Some(idle) = self.1.slot {
            return self
                .run_batch_stamped::<RESUME>(batch, range, metas, flows, store, offset, idle, ctx, cursors, out);
        }
        let mut lanes = batch.lanes_mut();
        let n = range.end.min(lanes.len()).min(metas.len()).min(flows.len());
        let start = range.start.min(n);
        let mut states = store.states_mut::<T::State>(offset);
        // Every packet of the pass counted in; a dropped one taken back out below.
        let mut bytes_in: u64 = lanes.lens[start..n].iter().map(|&l| u64::from(l)).sum();
        let (mut skipped, mut dropped) = (0u64, 0u64);
        let mut end = n;
        // The NF sees each packet's own time.
        let mut pctx = *ctx;
        for i in start..n {
            if T::HAS_PREFETCH && ahead > 0 && i + ahead < n {
                if let Some(st) = states.get(flows[i + ahead]) {
                    self.0.prefetch(st);
                }
            }
            if lanes.verdicts[i] == DROP {
                skipped += 1;
                bytes_in -= u64::from(lanes.lens[i]);
            } else {
                let meta = &metas[i];
                let cur = if RESUME && T::STEPS { cursors.get(i) } else { None };
                let action = match states.get_v4_mut(flows[i]) {
                    Some(state) if meta.valid => {
                        pctx.now_ns = lanes.times[i];
                        self.act(&mut Pkt::new(lanes.data_mut(i), meta), state, cur, &pctx)
                    }
                    _ => self.off_v4(&mut lanes, i, meta, flows[i], &mut states, ctx, cur),
                };
                let (was_dropped, ends) = set_verdict(&mut lanes.verdicts[i], action);
                if was_dropped {
                    dropped += 1;
                }
                match ends {
                    End::No => {}
                    // Nothing held, nothing released: removed after the pass, no stop.
                    End::Refused => out.mark_refused(i),
                    End::Flow => {
                        out.mark_end(i);
                        if T::ENDS_FLOWS {
                            out.stopped_at = Some(i + 1);
                            end = i + 1;
                            break;
                        }
                    }
                }
            }
        }
        if end < n {
            // Stopped early: the packets not reached are not counted in.
            bytes_in -= lanes.lens[end..n].iter().map(|&l| u64::from(l)).sum::<u64>();
        }
        let packets_in = (end - start) as u64 - skipped;
        out.counters = NfCounters { packets_in, bytes_in, packets_out: packets_in - dropped, dropped };
    }

    /// [`Typed::run_batch`] for an NF with a block stamp: packet by packet
    /// through [`Typed::one_stamped`] (each packet's block reached through
    /// the store, its stamp checked at the packet's time, in arrival order),
    /// stopping after an end as the fast loop does. Only chains that mix
    /// timeouts in one block take it; no prefetch hooks.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn run_batch_stamped<const RESUME: bool>(
        &mut self,
        batch: &mut Batch,
        range: Range<usize>,
        metas: &[PktMeta],
        flows: &[FlowRef],
        store: &mut FlowStore,
        offset: usize,
        idle: BlockIdle,
        ctx: &NfContext,
        cursors: &[Cursor],
        out: &mut BatchOutcome,
    ) {
        let n = range.end.min(batch.len()).min(metas.len()).min(flows.len());
        let mut c = NfCounters::default();
        for i in range.start.min(n)..n {
            let cur = if RESUME && T::STEPS { cursors.get(i) } else { None };
            match self.one_stamped(batch, i, &metas[i], flows[i], store, offset, idle, ctx, cur, &mut c) {
                Some(End::Refused) => out.mark_refused(i),
                Some(End::Flow) => {
                    out.mark_end(i);
                    if T::ENDS_FLOWS {
                        out.stopped_at = Some(i + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        out.counters = c;
    }

    /// [`Typed::one`] for an NF with a block stamp: the stamp is touched at
    /// the packet's time, and a state idle past the NF's timeout is released,
    /// zeroed and initialised before the action runs (from scratch: a
    /// cursor stepped on the old state is dropped).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn one_stamped(
        &mut self,
        batch: &mut Batch,
        i: usize,
        meta: &PktMeta,
        flow: FlowRef,
        store: &mut FlowStore,
        offset: usize,
        idle: BlockIdle,
        ctx: &NfContext,
        cur: Option<&Cursor>,
        c: &mut NfCounters,
    ) -> Option<End> {
        if !arrive(batch, i, c) {
            return None;
        }
        let action = if !meta.valid {
            self.0.on_unparsed()
        } else if !flow.is_some() {
            self.0.on_no_state()
        } else {
            let pctx = packet_ctx(batch, i, ctx);
            let mut pkt = Pkt::new(batch.data_mut(i), meta);
            match stamped::<T::State>(store.block_mut(flow), offset, idle.at) {
                Some((stamp, state)) => {
                    let mut s = IdleStamp(u64::from_ne_bytes(*stamp));
                    let reset = s.touch(pctx.now_ns, idle.timeout_ns);
                    *stamp = s.0.to_ne_bytes();
                    if reset {
                        if T::IPFIX {
                            self.0.ipfix_flow(&meta.tuple, state, EndReason::IdleTimeout);
                        }
                        self.0.release(&meta.tuple, state);
                        *state = T::State::zeroed();
                        *state = self.0.init(&pkt, &pctx);
                        self.1.resets += 1;
                    }
                    self.act(&mut pkt, state, if reset { None } else { cur }, &pctx)
                }
                // A store sized for another chain: refuse rather than misread.
                None => Action::Drop,
            }
        };
        Some(apply_action(batch, i, action, c))
    }

    /// The action of a live packet off [`Typed::run_batch`]'s fast path
    /// (an IPv6 flow, no flow, an unparsed packet): kept out of line so the
    /// loop's registers serve the common case.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn off_v4(
        &mut self,
        lanes: &mut Lanes<'_>,
        i: usize,
        meta: &PktMeta,
        flow: FlowRef,
        states: &mut StoreStates<'_, T::State>,
        ctx: &NfContext,
        cur: Option<&Cursor>,
    ) -> Action {
        if !meta.valid {
            return self.0.on_unparsed();
        }
        if !flow.is_some() {
            return self.0.on_no_state();
        }
        let Some(state) = states.get_mut(flow) else {
            // A store sized for another chain: refuse rather than misread.
            return Action::Drop;
        };
        let pctx = NfContext { now_ns: lanes.times[i], ..*ctx };
        self.act(&mut Pkt::new(lanes.data_mut(i), meta), state, cur, &pctx)
    }

    /// The NF's action on a packet with its state: resumed from `cur` (the
    /// interleaved executor's steps) or run whole.
    #[inline(always)]
    fn act(&mut self, pkt: &mut Pkt<'_>, state: &mut T::State, cur: Option<&Cursor>, ctx: &NfContext) -> Action {
        match cur {
            Some(cur) => self.0.finish(pkt, state, cur, ctx),
            None => self.0.process(pkt, state, ctx),
        }
    }

    /// Packet `i` through the NF, the body of every loop over packets: skips
    /// a packet already dropped (`None`), counts it in, runs the action on
    /// its flow's state (resumed from `cur` if given), applies the verdict.
    /// `Some(end)`: whether the packet ends its flow.
    /// `state` finds the flow's state (called only for a packet with one).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn one<'s>(
        &mut self,
        batch: &mut Batch,
        i: usize,
        meta: &PktMeta,
        flow: FlowRef,
        state: impl FnOnce(FlowRef) -> Option<&'s mut T::State>,
        ctx: &NfContext,
        cur: Option<&Cursor>,
        c: &mut NfCounters,
    ) -> Option<End> {
        if !arrive(batch, i, c) {
            return None;
        }
        let action = if !meta.valid {
            self.0.on_unparsed()
        } else if !flow.is_some() {
            self.0.on_no_state()
        } else {
            match state(flow) {
                Some(state) => {
                    // The NF sees the packet's own time.
                    let pctx = packet_ctx(batch, i, ctx);
                    self.act(&mut Pkt::new(batch.data_mut(i), meta), state, cur, &pctx)
                }
                // A store sized for another chain: refuse rather than misread.
                None => Action::Drop,
            }
        };
        Some(apply_action(batch, i, action, c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowplane_nf::testutil::udp4;
    use flowplane_packet::{PacketPool, PoolConfig};
    use flowplane_table::FullPolicy;

    use crate::store::StoreConfig;

    /// A chase of `state` dependent reads: each step names the next line.
    struct Chase {
        mem: Vec<u64>,
    }

    impl StatefulNf for Chase {
        type State = u64;
        const STEPS: bool = true;
        fn name(&self) -> &'static str {
            "chase"
        }
        fn init(&mut self, _: &Pkt<'_>, _: &NfContext) -> u64 {
            0
        }
        fn process(&mut self, _: &mut Pkt<'_>, _: &mut u64, _: &NfContext) -> Action {
            Action::Pass
        }
        fn step(&self, _: &Pkt<'_>, st: &u64, cur: &mut Cursor) -> Step {
            cur.step += 1;
            if u64::from(cur.step) <= *st {
                Step::at(&self.mem[cur.step as usize * 8 % self.mem.len()])
            } else {
                Step::Ready
            }
        }
    }

    #[test]
    fn step_pass_runs_every_task_to_ready_at_any_k() {
        let mut pool = PacketPool::new(PoolConfig { buffers: 128, ..Default::default() }).unwrap();
        let mut batch = Batch::new(&pool);
        let cfg = StoreConfig {
            capacity: 1024,
            capacity_v6: 1024,
            state_size: 8,
            idle_timeout_ns: None,
            full_policy: FullPolicy::Reject,
            hugepages: false,
            inline: true,
        };
        let mut store = FlowStore::new(cfg).unwrap();
        let mut metas = vec![PktMeta::default(); 64];
        let mut flows = vec![FlowRef::NONE; 64];
        for i in 0..64u8 {
            let f = udp4([10, 0, 0, i], [192, 168, 0, 1], 1000, 80);
            assert!(batch.push_copy(&mut pool, &f, 0));
            metas[usize::from(i)].parse_into(&f);
            let steps = u64::from(i % 7) * 3 + u64::from(i == 10) * 1000;
            let t = metas[usize::from(i)].tuple;
            let (r, _) = store
                .upsert(&t, u64::from(i) * 0x9e37_79b9, 0, |u| {
                    if let flowplane_table::Upsert::New(b) = u {
                        b[..8].copy_from_slice(&steps.to_ne_bytes());
                    }
                })
                .unwrap();
            flows[usize::from(i)] = r;
        }
        // Every other packet takes steps; the others' cursors stay reset.
        let todo: Vec<u16> = (0..64).step_by(2).collect();
        let nf = Typed::new(Chase { mem: vec![0; 4096] });
        for k in [1, 2, 5, 16, 64] {
            for prefetch in [true, false] {
                let mut cursors = vec![Cursor { step: 99, ..Cursor::default() }; 64];
                nf.step_pass(&mut batch, &todo, &metas, &flows, &store, 0, k, prefetch, &mut cursors);
                for (i, c) in cursors.iter().enumerate() {
                    let want = match i {
                        _ if i % 2 == 1 => 0,
                        // A chase longer than the step bound stops at it.
                        10 => u32::from(MAX_STEPS),
                        _ => (i as u32 % 7) * 3 + 1,
                    };
                    assert_eq!(c.step, want, "k={k} prefetch={prefetch} packet {i}");
                }
            }
        }
    }
}
