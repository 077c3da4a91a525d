//! `interleaved[:K]`: GuNFu's interleaved function streams. Each packet is a
//! task that walks the chain as a resumable action cut at its memory
//! accesses: each NF's own steps (`StatefulNf::step`: a trie node, a rule
//! counter, a connection, a chase), after the second line of a large block
//! and the coarse entries the flow pins. K tasks are in flight (default 16);
//! the scheduler visits them round-robin, and a visit runs a task until it
//! names a line it needs, which is prefetched while the other tasks run
//! (GuNFu's Algorithm 1). A task that has nothing more to fetch waits to
//! *finish*; a finished task's slot takes the next packet of the batch.
//!
//! The flow-table match itself is decomposed too, in one of two ways
//! (`BULK_LOOKUP`): by default the batch is looked up first with the table's
//! bulk path, whose phases interleave the bucket and entry misses of the
//! whole batch (measured 2.5x cheaper per packet than the alternative);
//! otherwise each task walks the table itself, bucket then candidate entry
//! (`FlowTable::prefetch_bucket`, `prefetch_candidates`), as GuNFu's cuckoo
//! steps do. A chain where no NF has a resumable action has nothing to
//! interleave beyond that lookup and runs the batched pass (`FALL_BACK`).
//!
//! Finishing is in arrival order, one packet at a time, exactly as `rtc`:
//! the add-on-miss lookup or a touch of the entry found, the coarse pins,
//! each NF's `finish` resumed from the task's cursor, the end of flow. So
//! every verdict, counter, export, port allocation and flow end is the one
//! per-packet run-to-completion gives, whatever K; what runs out of order
//! are only reads (steps take `&self`) whose results `finish` validates.
//! Hence:
//! - a later packet of a flow never overtakes an earlier one: it finishes
//!   after it, and a packet whose flow already has a task in flight takes no
//!   steps of its own (it would read state its predecessor is about to change);
//! - shared (coarse) state is locked only inside a finish, never across a
//!   switch: two in-flight packets of one source cannot deadlock;
//! - nothing is allocated per packet: the task slots and their cursors are
//!   allocated once per executor and reused.
//!
//! Stateless stages (which take whole batches) cut the chain into segments
//! as in `rtc`; each segment runs its own window of tasks over the batch.

use flowplane_nf::stateful::{Action, Cursor, Step};
use flowplane_nf::{NfContext, Pkt};
use flowplane_packet::{prefetch, Batch};
use flowplane_table::FullPolicy;

use super::context::flow_hash;
use super::{ExecContext, ExecParam, Executor, ExecutorInfo, StateLayout};
use crate::chain::Stage;
use crate::coarse::aux_handle;
use crate::stage::{apply_action, packet_ctx};
use crate::store::FlowRef;

/// Look the batch up in bulk before the tasks start (false: each task
/// walks the flow table itself, bucket then entry, as GuNFu's cuckoo steps).
const BULK_LOOKUP: bool = true;

/// Most yields of one task (a bound on a misbehaving NF's steps).
const MAX_YIELDS: u16 = 512;

/// Most tasks in flight.
pub(crate) const MAX_TASKS: u16 = 64;

/// Registry entry.
pub(super) const INFO: ExecutorInfo = ExecutorInfo {
    name: "interleaved",
    about: "GuNFu: K packet tasks in flight (interleaved:K, default 16), each cut at its memory accesses; \
            round-robin with prefetch, in-order finish",
    layout: StateLayout::Aggregated,
    param: Some(ExecParam { what: "tasks in flight", default: 16, min: 1, max: MAX_TASKS }),
    new: |cx| {
        let steps = cx.chain.stages.iter().any(|s| matches!(s, Stage::Stateful { nf, group: None, .. } if nf.steps()));
        // No NF names a line to fetch: all there is to overlap are the flow
        // table's misses, which the batched pass's bulk lookup already
        // overlaps at less cost per packet than a task switch.
        if !steps && FALL_BACK {
            return (super::batch::INFO.new)(cx);
        }
        Box::new(Interleaved::new(cx.cfg.kind.param(), &cx.chain.stages))
    },
};

/// Chains without resumable actions run the batched pass (false: the task
/// window runs them too; the tests cover both through chains with and
/// without resumable NFs).
const FALL_BACK: bool = true;

/// Where a task stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The primary bucket was prefetched: look at its tags next.
    Bucket,
    /// The candidate entry was prefetched: find the flow next.
    Entry,
    /// The flow is known: run the NFs' steps from stage `Task::stage`.
    Steps,
    /// Nothing more to fetch: waiting to finish in arrival order.
    Ready,
}

/// One packet in flight.
#[derive(Clone, Copy, Debug)]
struct Task {
    /// Packet index in the batch.
    i: usize,
    phase: Phase,
    /// Flow-table hash (first segment) or flow entry bits (later ones): same
    /// value, same flow, for the in-flight check.
    key: u64,
    /// The flow entry the steps read (`NONE`: none, the finish starts from scratch).
    flow: FlowRef,
    /// Next entry of the segment's stepping stages whose steps run.
    stage: usize,
    /// Yields left: a task that keeps naming lines past this is finished
    /// synchronously (its finish completes whatever its steps left).
    budget: u16,
}

impl Task {
    const IDLE: Task = Task { i: 0, phase: Phase::Ready, key: 0, flow: FlowRef::NONE, stage: 0, budget: 0 };
}

/// The scheduler: task slots and their cursors (one per stage), reused.
struct Interleaved {
    k: usize,
    stages: usize,
    tasks: Vec<Task>,
    /// `tasks[j].key`, contiguous: the in-flight check scans it.
    keys: Vec<u64>,
    cursors: Vec<Cursor>,
    /// The current segment's 5-tuple stages with resumable actions.
    steppers: Vec<usize>,
    /// Per stage: where its state sits in the block (offset, size).
    layout: Vec<(usize, usize)>,
}

impl Interleaved {
    fn new(k: u16, chain: &[Stage]) -> Self {
        let k = usize::from(k.clamp(1, MAX_TASKS));
        let stages = chain.len();
        let layout = chain
            .iter()
            .map(|s| match s {
                Stage::Stateful { nf, offset, .. } => (*offset, nf.state_size()),
                Stage::Stateless(_) => (0, 0),
            })
            .collect();
        Interleaved {
            k,
            stages,
            tasks: vec![Task::IDLE; k],
            keys: vec![u64::MAX; k],
            cursors: vec![Cursor::default(); k * stages.max(1)],
            steppers: Vec::with_capacity(stages),
            layout,
        }
    }
}

/// `(a + b) % k` for `a, b < k`.
#[inline(always)]
fn wrap(a: usize, b: usize, k: usize) -> usize {
    let x = a + b;
    if x >= k {
        x - k
    } else {
        x
    }
}

impl Executor for Interleaved {
    fn run(&mut self, cx: &mut ExecContext, batch: &mut Batch, ctx: &NfContext) {
        let n = batch.len();
        let stages = cx.chain.stages.len();
        debug_assert_eq!(stages, self.stages);
        let mut seg_start = 0;
        let mut looked_up = false;
        while seg_start < stages {
            if let Stage::Stateless(nf) = &mut cx.chain.stages[seg_start] {
                nf.process(batch, 0..n, ctx);
                seg_start += 1;
                continue;
            }
            let seg_end =
                (seg_start..stages).find(|&k| matches!(cx.chain.stages[k], Stage::Stateless(_))).unwrap_or(stages);
            self.steppers.clear();
            for si in seg_start..seg_end {
                if let Stage::Stateful { nf, group: None, .. } = &cx.chain.stages[si] {
                    if nf.steps() {
                        self.steppers.push(si);
                    }
                }
            }
            // The first segment looks the whole batch up at once (the table's
            // bulk path overlaps the bucket and entry misses of the batch), in
            // packet order, inserting new flows; tasks then run NF steps only.
            let bulk = BULK_LOOKUP && !looked_up;
            if bulk {
                cx.lookup_bulk(batch, 0..n, ctx, cx.cfg.prefetch);
                looked_up = true;
            }
            let mut w = Window { s: self, cx, batch, ctx, seg: (seg_start, seg_end), looked_up, retry: bulk, ended: false };
            w.run(n);
            looked_up = true;
            seg_start = seg_end;
        }
    }
}

/// One segment's pass over a batch.
struct Window<'a> {
    s: &'a mut Interleaved,
    cx: &'a mut ExecContext,
    batch: &'a mut Batch,
    ctx: &'a NfContext,
    seg: (usize, usize),
    /// The flows were looked up (`scratch.flows`) by an earlier segment or
    /// this one's bulk lookup.
    looked_up: bool,
    /// This segment's flows come from its bulk lookup: a packet left without
    /// an entry after an earlier packet ended a flow is looked up again when
    /// it finishes (its flow may be the ended one, or room was freed), as
    /// under per-packet run-to-completion.
    retry: bool,
    /// A flow ended in this segment.
    ended: bool,
}

impl Window<'_> {
    fn run(&mut self, n: usize) {
        let k = self.s.k.min(n);
        if k == 0 {
            return;
        }
        let (mut head, mut live, mut next) = (0usize, 0usize, 0usize);
        while live < k && next < n {
            self.admit(live, next, head, live);
            live += 1;
            next += 1;
        }
        let mut o = 0usize;
        while live > 0 {
            let slot = wrap(head, o, k);
            if self.s.tasks[slot].phase != Phase::Ready {
                self.advance(slot);
            }
            if o == 0 && self.s.tasks[slot].phase == Phase::Ready {
                self.finish(slot);
                head = wrap(head, 1, k);
                if next < n {
                    // The freed slot takes the next packet, the youngest task.
                    self.admit(slot, next, head, live - 1);
                    next += 1;
                } else {
                    live -= 1;
                }
                continue;
            }
            o += 1;
            if o >= live {
                o = 0;
            }
        }
    }

    /// Starts packet `i` in `slot`; `older` tasks from slot `head` on are in flight.
    fn admit(&mut self, slot: usize, i: usize, head: usize, older: usize) {
        let stages = self.s.stages;
        self.s.cursors[slot * stages..(slot + 1) * stages].fill(Cursor::default());
        let mut t = Task { i, phase: Phase::Ready, key: 0, flow: FlowRef::NONE, stage: 0, budget: MAX_YIELDS };
        let pf = self.cx.cfg.prefetch;
        if self.looked_up {
            t.flow = self.cx.scratch.flows[i];
            t.key = u64::from(t.flow.bits());
            if t.flow.is_some() && !self.batch.is_dropped(i) {
                t.phase = Phase::Steps;
                if pf {
                    // (A bulk lookup just read the entry: its first line is cached.)
                    if !self.retry {
                        if let Some(b) = self.cx.stores[0].block(t.flow).first() {
                            prefetch::write(b);
                        }
                    }
                    // The block's second line and the coarse entries the flow pins.
                    self.prefetch_block(t.flow);
                }
            }
        } else {
            let meta = &self.cx.scratch.metas[i];
            if meta.valid {
                t.key = flow_hash(&meta.tuple);
                t.phase = Phase::Bucket;
                if pf {
                    self.cx.stores[0].prefetch_bucket(&meta.tuple, t.key);
                }
            }
        }
        if t.phase != Phase::Ready {
            // The flow already has a packet in flight: this one takes no steps
            // (its predecessor's finish changes what they would read).
            let k = self.s.k;
            let keys = &self.s.keys;
            let busy = if head + older <= k {
                keys[head..head + older].contains(&t.key)
            } else {
                keys[head..].contains(&t.key) || keys[..head + older - k].contains(&t.key)
            };
            if busy {
                t.phase = Phase::Ready;
                t.flow = FlowRef::NONE;
            }
        }
        self.s.keys[slot] = t.key;
        self.s.tasks[slot] = t;
        if t.phase == Phase::Steps {
            // The first step at once: its line is fetched while the other tasks run.
            self.advance(slot);
        }
    }

    /// Runs task `slot` until it names a line to fetch (prefetched, the task
    /// yields) or has nothing more to fetch.
    fn advance(&mut self, slot: usize) {
        let pf = self.cx.cfg.prefetch;
        let mut t = self.s.tasks[slot];
        loop {
            match t.phase {
                Phase::Bucket => {
                    let meta = &self.cx.scratch.metas[t.i];
                    if self.cx.stores[0].prefetch_candidates(&meta.tuple, t.key) {
                        t.phase = Phase::Entry;
                        if pf {
                            break;
                        }
                    } else {
                        // A new flow: the finish inserts it; its NFs start from scratch.
                        t.phase = Phase::Ready;
                    }
                }
                Phase::Entry => {
                    let meta = &self.cx.scratch.metas[t.i];
                    match self.cx.stores[0].find(&meta.tuple, t.key) {
                        Some(f) => {
                            t.flow = f;
                            t.phase = Phase::Steps;
                            if self.prefetch_block(f) && pf {
                                break;
                            }
                        }
                        None => t.phase = Phase::Ready,
                    }
                }
                Phase::Steps => {
                    if t.stage >= self.s.steppers.len() {
                        t.phase = Phase::Ready;
                        continue;
                    }
                    match self.step(&t, slot) {
                        Some(p) => {
                            if pf {
                                prefetch::addr(p);
                                break;
                            }
                        }
                        None => t.stage += 1,
                    }
                }
                Phase::Ready => break,
            }
        }
        t.budget = t.budget.saturating_sub(1);
        if t.budget == 0 {
            t.phase = Phase::Ready;
        }
        self.s.tasks[slot] = t;
    }

    /// Prefetches the parts of flow `f`'s block the chain reads beyond its
    /// entry's first line and the coarse entries it pins; true if any.
    fn prefetch_block(&self, f: FlowRef) -> bool {
        let cx = &*self.cx;
        let block = cx.stores[0].block(f);
        let mut any = false;
        if cx.chain.state_size > 32 {
            // The entry header (32 bytes) shares the first line with the state.
            if let Some(b) = block.get(32) {
                prefetch::write(b);
                any = true;
            }
        }
        if cx.aux_on() {
            for (g, layout) in cx.chain.groups.iter().enumerate() {
                if let Some(b) = block.get(layout.aux_offset..layout.aux_offset + 8) {
                    let h = aux_handle(b);
                    if h.is_some() {
                        cx.shared.tables[g].prefetch_state(h);
                        any = true;
                    }
                }
            }
        }
        any
    }

    /// One step of stage `t.stage` for task `t`: the line it names next, or
    /// None when the stage has nothing more to fetch.
    fn step(&mut self, t: &Task, slot: usize) -> Option<*const u8> {
        let si = self.s.steppers[t.stage];
        let Stage::Stateful { nf, group: None, .. } = &self.cx.chain.stages[si] else { return None };
        let (off, sz) = self.s.layout[si];
        let state = self.cx.stores[0].block(t.flow).get(off..off + sz)?;
        let meta = &self.cx.scratch.metas[t.i];
        let pkt = Pkt::new(self.batch.data_mut(t.i), meta);
        match nf.step_bytes(&pkt, state, &mut self.s.cursors[slot * self.s.stages + si]) {
            Step::Prefetch(p) => Some(p),
            Step::Ready => None,
        }
    }

    /// Finishes the task in `slot` (the oldest): the packet runs through the
    /// segment exactly as under `rtc`, each NF resuming from its cursor.
    fn finish(&mut self, slot: usize) {
        let t = self.s.tasks[slot];
        let (cx, batch, ctx) = (&mut *self.cx, &mut *self.batch, self.ctx);
        let i = t.i;
        if self.retry && self.ended && !cx.scratch.flows[i].is_some() {
            cx.scratch.flows[i] = cx.lookup_one(batch, i, ctx);
        }
        if !self.looked_up {
            cx.scratch.flows[i] = if t.flow.is_some() && cx.cfg.full_policy == FullPolicy::Reject {
                // The steps found the entry, and only this flow's own packets
                // (none in flight before this one) could have removed it since:
                // the lookup's hit is a touch. (Eviction could have: look up.)
                cx.stores[0].touch(t.flow, ctx.now_ns);
                t.flow
            } else {
                cx.lookup_one(batch, i, ctx)
            };
        }
        let flow = cx.scratch.flows[i];
        // The cursors describe the entry the steps read; another entry (the
        // flow was new, or ended and came back) starts from scratch.
        let resume = flow == t.flow;
        cx.pin_coarse_packet(i, ctx.now_ns);
        let mut end = false;
        let none = Cursor::default();
        for si in self.seg.0..self.seg.1 {
            if cx.chain.stages[si].is_coarse() {
                cx.run_coarse(si, batch, i, ctx);
                continue;
            }
            let Stage::Stateful { nf, counters, .. } = &mut cx.chain.stages[si] else { continue };
            if batch.is_dropped(i) {
                continue;
            }
            counters.packets_in += 1;
            counters.bytes_in += batch.lens()[i] as u64;
            let action = if !flow.is_some() {
                nf.on_unparsed()
            } else {
                let (off, sz) = self.s.layout[si];
                match cx.stores[0].block_mut(flow).get_mut(off..off + sz) {
                    Some(st) => {
                        let pctx = packet_ctx(batch, i, ctx);
                        let cur = if resume { &self.s.cursors[slot * self.s.stages + si] } else { &none };
                        nf.finish_bytes(&mut Pkt::new(batch.data_mut(i), &cx.scratch.metas[i]), st, &pctx, cur)
                    }
                    None => Action::Drop,
                }
            };
            end |= apply_action(batch, i, action, counters);
        }
        cx.unpin_coarse_packet(i, ctx.now_ns);
        if end && flow.is_some() {
            cx.end_flow(0, flow, ctx.now_ns, i + 1);
            self.ended = true;
        }
        self.s.tasks[slot].phase = Phase::Ready;
        self.s.tasks[slot].flow = FlowRef::NONE;
        self.s.tasks[slot].key = u64::MAX;
        self.s.keys[slot] = u64::MAX;
    }
}

#[cfg(test)]
mod tests {
    use super::super::ExecKind;

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
}
