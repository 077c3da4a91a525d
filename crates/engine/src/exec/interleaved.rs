//! `interleaved[:K]`: GuNFu's interleaved function streams. Each packet's
//! resumable action in an NF (`StatefulNf::step`: a trie node, a
//! route-table entry, a connection, a chase) is a task cut at the memory
//! accesses it names. K tasks are in flight (default 16); the scheduler
//! visits them round-robin, and a visit runs a task until it names a line
//! it needs, which is prefetched while the other tasks run; a task with
//! nothing more to fetch leaves, and its slot takes the next packet of the
//! batch (GuNFu's Algorithm 1). The scheduler runs NF by NF, monomorphised
//! over each NF (`StatefulStage::step_pass`): a step is an inlined call and
//! a packet with nothing to fetch costs a compare, not a task switch.
//!
//! A batch goes through three passes:
//! 1. the flow-table match, decomposed the table's bulk way: the bucket and
//!    entry misses of the whole batch overlap (one lookup for every 5-tuple
//!    NF, new flows inserted in packet order);
//! 2. the steps, interleaved as above, NF by NF in chain order, from each
//!    flow's block (its second line and the coarse entries it pins are
//!    prefetched for the whole batch first); steps only read, and record
//!    their progress in a cursor per packet and NF;
//! 3. the finish: the batched executor's staged pass in arrival order, each
//!    NF's `finish` resuming from the packet's cursor instead of `process`.
//!    Flow ends take effect at their packet as in `batch` (a segment stops
//!    before a repeated flow; ends are applied, the rest is looked up again).
//!
//! So verdicts, counters, exports, port allocations and flow ends are those
//! of the batched executor (hence of per-packet run-to-completion), whatever
//! K: what runs out of order are reads whose results `finish` checks against
//! what they were computed from (`Cursor::input`). A later packet of a flow
//! never overtakes an earlier one: finishing is in order, and a packet whose
//! flow already appeared in the batch takes no steps (they would read state
//! the earlier packet's finish changes). Shared (coarse) state is locked only
//! inside finishing, never across a switch, so two in-flight packets of one
//! source cannot deadlock. The task slots are an array on the step pass's
//! stack, the cursors are allocated once per executor and reused: nothing
//! is allocated per packet.
//!
//! A chain where no NF has a resumable action (or only one-step ones, see
//! `StatefulNf::ONE_STEP`, whose prefetch hook is the whole interleaving)
//! has nothing to interleave beyond the match, and runs the batched
//! executor itself.

use flowplane_nf::stateful::Cursor;
use flowplane_nf::NfContext;
use flowplane_packet::{prefetch, Batch, MAX_BATCH};

use super::context::{SeenSet, PREFETCH_AHEAD};
use super::{ExecContext, ExecParam, Executor, ExecutorInfo, StateLayout};
use crate::chain::Stage;
use crate::coarse::aux_handle;
use crate::stage::BatchOutcome;
use crate::store::FlowRef;

/// Most tasks in flight.
pub(crate) const MAX_TASKS: u16 = crate::stage::MAX_TASKS as u16;

/// Registry entry.
pub(super) const INFO: ExecutorInfo = ExecutorInfo {
    name: "interleaved",
    about: "GuNFu: K packet tasks in flight (interleaved:K, default 16) running the NFs' resumable actions; \
            round-robin with prefetch, in-order finish",
    layout: StateLayout::Aggregated,
    param: Some(ExecParam { what: "tasks in flight", default: 16, min: 1, max: MAX_TASKS }),
    new: |cx| {
        let steps = cx.chain.stages.iter().any(|s| matches!(s, Stage::Stateful { nf, group: None, .. } if nf.steps() && !nf.one_step()));
        if !steps {
            // Nothing to interleave beyond the match, which the batched
            // executor's bulk lookup already overlaps.
            return (super::batch::INFO.new)(cx);
        }
        Box::new(Interleaved::new(cx.cfg.kind.param(), &cx.chain.stages))
    },
};

/// The scheduler's reused state.
struct Interleaved {
    k: usize,
    /// The packets of the current batch that take steps.
    todo: Box<[u16; MAX_BATCH]>,
    /// The 5-tuple stages with resumable actions, in chain order.
    steppers: Vec<usize>,
    /// Stage-major cursors: `cursors[si * MAX_BATCH + i]` for packet i.
    cursors: Vec<Cursor>,
    /// Flows already seen in the current batch.
    seen: SeenSet,
    /// Per stage: packets of the current batch it has finished.
    progress: Vec<usize>,
}

impl Interleaved {
    fn new(k: u16, chain: &[Stage]) -> Self {
        let k = usize::from(k.clamp(1, MAX_TASKS));
        let steppers = chain
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, Stage::Stateful { nf, group: None, .. } if nf.steps() && !nf.one_step()))
            .map(|(si, _)| si)
            .collect();
        Interleaved {
            k,
            todo: Box::new([0; MAX_BATCH]),
            steppers,
            cursors: vec![Cursor::default(); chain.len() * MAX_BATCH],
            seen: SeenSet::new(),
            progress: vec![0; chain.len()],
        }
    }
}

impl Executor for Interleaved {
    fn run(&mut self, cx: &mut ExecContext, batch: &mut Batch, ctx: &NfContext) {
        let n = batch.len();
        let prefetch = cx.cfg.prefetch;
        cx.start_batch(batch);
        // A batch whose packet time spans more than the idle timeout is
        // looked up window by window (see ExecContext::window_end); it takes
        // no steps (rare: a slow capture replayed at full speed) and each
        // action runs whole from a fresh cursor in the finishing pass.
        let w0 = cx.window_end(batch, 0, n);
        cx.lookup_bulk(batch, 0..w0, ctx, prefetch);
        if w0 == n {
            self.steps(cx, batch, n);
        } else {
            self.cursors.fill(Cursor::default());
        }
        // The finishing pass: the batched executor's loop over segments.
        self.progress.fill(0);
        let mut start = 0;
        let mut w = w0;
        let mut first = true;
        while start < n {
            if !first {
                w = cx.window_end(batch, start, n);
                cx.lookup_bulk(batch, start..w, ctx, prefetch);
            }
            first = false;
            loop {
                let end = cx.segment_end(start, w);
                cx.pin_coarse_batch(start..end, ctx.now_ns);
                let (ended, done) = self.finish(cx, batch, start..end, ctx);
                cx.unpin_coarse_batch(start..end, ctx.now_ns);
                start = done;
                // Ended flows are gone from the table: look the rest up again.
                if ended > 0 || start == w {
                    break;
                }
            }
        }
    }
}

impl Interleaved {
    /// Pass 2: the steps. The packets that take steps are those with a flow
    /// entry, not dropped, whose flow has not appeared earlier in the batch;
    /// their blocks' far lines are prefetched for the whole batch at once.
    /// Then each NF with a resumable action, in chain order, runs its step
    /// pass over them: K tasks in flight round-robin, each yielding on the
    /// line it names (`StatefulStage::step_pass`, the scheduler monomorphised
    /// over the NF, so a one-step NF costs a compare per packet, not a task
    /// switch through a virtual call).
    fn steps(&mut self, cx: &ExecContext, batch: &mut Batch, n: usize) {
        self.seen.clear();
        let mut m = 0;
        for i in 0..n {
            let flow = cx.scratch.flows[i];
            // A flow seen earlier in the batch: its state changes before this
            // packet finishes, so steps now would be wasted.
            if flow.is_some() && !batch.is_dropped(i) && self.seen.insert(flow.bits()) {
                self.todo[m] = i as u16;
                m += 1;
                if cx.cfg.prefetch {
                    prefetch_block(cx, flow);
                }
            }
        }
        let (metas, flows) = (&cx.scratch.metas[..n], &cx.scratch.flows[..n]);
        for &si in &self.steppers {
            let Stage::Stateful { nf, offset, .. } = &cx.chain.stages[si] else { continue };
            let cursors = &mut self.cursors[si * MAX_BATCH..si * MAX_BATCH + n];
            nf.step_pass(batch, &self.todo[..m], metas, flows, &cx.stores[0], *offset, self.k, cx.cfg.prefetch, cursors);
        }
    }

    /// Pass 3 over one segment: `ExecContext::run_stages` with each NF
    /// resuming from the cursors. Returns the flows ended and where every
    /// stage stopped.
    fn finish(
        &mut self,
        cx: &mut ExecContext,
        batch: &mut Batch,
        range: std::ops::Range<usize>,
        ctx: &NfContext,
    ) -> (u64, usize) {
        // One test per segment: the loop is built with and without the observation point (`crate::tap`).
        if cx.tap.is_some() {
            self.finish_with::<true>(cx, batch, range, ctx)
        } else {
            self.finish_with::<false>(cx, batch, range, ctx)
        }
    }

    #[inline(always)]
    fn finish_with<const OBS: bool>(
        &mut self,
        cx: &mut ExecContext,
        batch: &mut Batch,
        range: std::ops::Range<usize>,
        ctx: &NfContext,
    ) -> (u64, usize) {
        let mut frontier = range.end;
        // The NFs that take no steps still get their prefetch hooks.
        let ahead = if cx.cfg.prefetch && cx.cfg.prefetch_hooks { PREFETCH_AHEAD } else { 0 };
        let (mut ends, mut refused) = cx.pending_ends();
        for si in 0..cx.chain.stages.len() {
            let from = self.progress[si].max(range.start);
            if from >= frontier {
                continue;
            }
            let todo = from..frontier;
            self.progress[si] = frontier;
            if cx.chain.stages[si].is_coarse() {
                cx.run_coarse_batch(si, batch, todo.clone(), ctx);
                if OBS {
                    cx.observe(si, batch, todo);
                }
                continue;
            }
            let mut ran = todo.clone();
            let ExecContext { stores, chain, scratch, .. } = &mut *cx;
            match &mut chain.stages[si] {
                Stage::Stateless(nf) => nf.process(batch, todo, ctx),
                Stage::Stateful { nf, offset, counters, .. } => {
                    let mut out = BatchOutcome::default();
                    let (metas, flows) = (&scratch.metas[..frontier], &scratch.flows[..frontier]);
                    let cursors = &self.cursors[si * MAX_BATCH..si * MAX_BATCH + frontier];
                    nf.finish_batch(batch, todo, metas, flows, &mut stores[0], *offset, ctx, ahead, cursors, &mut out);
                    counters.merge(&out.counters);
                    out.merge_into(&mut ends, &mut refused);
                    if let Some(stop) = out.stopped_at {
                        frontier = stop;
                        self.progress[si] = stop;
                        ran.end = stop;
                    }
                }
            }
            if OBS {
                cx.observe(si, batch, ran);
            }
        }
        let mut ended = 0;
        for (w, &e) in ends.iter().enumerate() {
            let mut m = e;
            while m != 0 {
                let i = w * 64 + m.trailing_zeros() as usize;
                m &= m - 1;
                let flow = cx.scratch.flows[i];
                if i < frontier && flow.is_some() {
                    let before = cx.stats.ended + cx.stats.refused;
                    cx.end_flow(0, flow, ctx.now_ns, frontier, refused[w] & (1 << (i & 63)) != 0);
                    ended += cx.stats.ended + cx.stats.refused - before;
                }
            }
        }
        cx.keep_ends_past(ends, refused, frontier);
        (ended, frontier)
    }
}

/// Prefetches the parts of flow `f`'s block the chain reads beyond the
/// entry's first line (the lookup brought that one) and the coarse entries
/// the flow pins.
fn prefetch_block(cx: &ExecContext, f: FlowRef) {
    if cx.chain.state_size <= 32 && !cx.aux_on() {
        // The entry header (32 bytes) shares the first line with the state.
        return;
    }
    let block = cx.stores[0].block(f);
    if cx.chain.state_size > 32 {
        if let Some(b) = block.get(32) {
            prefetch::write(b);
        }
    }
    if cx.aux_on() {
        for (g, layout) in cx.chain.groups.iter().enumerate() {
            if let Some(b) = block.get(layout.aux_offset..layout.aux_offset + 8) {
                cx.shared.tables[g].prefetch_state(aux_handle(b));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ExecKind;
    use super::SeenSet as Seen;

    #[test]
    fn k_is_parsed_bounded_and_shown() {
        let d = ExecKind::parse("interleaved").unwrap();
        assert_eq!((d.name(), d.param(), d.to_string()), ("interleaved", 16, "interleaved:16".to_string()));
        assert_eq!(ExecKind::parse("interleaved:1").unwrap().param(), 1);
        assert_eq!(ExecKind::parse("interleaved:64").unwrap().param(), 64);
        assert!(ExecKind::parse("interleaved:16").unwrap() == d);
        assert!(ExecKind::parse("interleaved:4").unwrap() != d);
        for bad in ["interleaved:0", "interleaved:65", "interleaved:x", "interleaved:"] {
            let e = ExecKind::parse(bad).err().unwrap().to_string();
            assert!(e.contains("tasks in flight must be an integer in 1..=64") && !e.contains('\n'), "{bad}: {e}");
        }
        assert!(ExecKind::parse("batch:4").err().unwrap().to_string().contains("takes no parameter"));
        let e = ExecKind::parse("nope").err().unwrap().to_string();
        assert!(e.contains("interleaved[:N]"), "{e}");
        assert_eq!(ExecKind::parse("rtc").unwrap().to_string(), "rtc");
        assert!(ExecKind::all().any(|k| k == d), "the registry lists it with its default K");
    }

    #[test]
    fn seen_set_forgets_on_clear() {
        let mut s = Seen::new();
        s.clear();
        for id in 0..300u32 {
            assert!(s.insert(id * 7919));
        }
        assert!(!s.insert(7919) && !s.insert(0));
        s.clear();
        assert!(s.insert(7919));
    }
}
