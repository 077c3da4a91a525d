//! `pernf`: VPP's model. Every 5-tuple NF has its own table and does its own
//! bulk lookup over the batch (a lookup per NF per packet), then runs over
//! the batch; coarse NFs reach their shared tables as in every executor.

use std::ops::Range;

use flowplane_nf::NfContext;
use flowplane_packet::{Batch, MAX_BATCH};

use super::context::{gather_range, lookup_into, lookup_key, PREFETCH_AHEAD};
use super::{ExecContext, Executor, ExecutorInfo, StateLayout};
use crate::chain::Stage;
use crate::stage::BatchOutcome;
use crate::store::FlowRef;

/// Registry entry.
pub(super) const INFO: ExecutorInfo = ExecutorInfo {
    name: "pernf",
    about: "VPP: a table per NF, one bulk lookup per NF per batch",
    layout: StateLayout::PerNf,
    param: None,
    new: |cx| Box::new(PerNf { flows: vec![[FlowRef::NONE; MAX_BATCH]; cx.stores.len()], ends: [0; 4], refused: [0; 4] }),
};

/// Each 5-tuple stage's flow entries for the current batch, and the packets
/// whose flows an NF ended (applied once every stage has run them).
struct PerNf {
    flows: Vec<[FlowRef; MAX_BATCH]>,
    ends: [u64; 4],
    /// Of `ends`: flows refused on their first packet.
    refused: [u64; 4],
}

impl Executor for PerNf {
    fn run(&mut self, cx: &mut ExecContext, batch: &mut Batch, ctx: &NfContext) {
        let n = batch.len();
        // Each NF looks its flows up on its own, so an end cannot be applied
        // between one NF's lookup and the next NF's: chains that end flows
        // run in segments where no flow repeats, or packet by packet where an
        // NF holding releasable resources runs before an ending one (see
        // `ExecContext::segment_end`). An NF stops right after a packet that
        // ends its flow (it may release what the next packet needs, a NAT
        // port): the stages after it stop there too, the end applies, and
        // the next segment resumes each stage where it stopped.
        let mut start = 0;
        self.ends = [0; 4];
        self.refused = [0; 4];
        cx.start_batch(batch);
        while start < n {
            let w = cx.window_end(batch, start, n);
            let end = cx.segment_end_by_key(start, w);
            start = self.run_range(cx, batch, start..end, ctx);
        }
    }
}

impl PerNf {
    /// Runs every stage over `range` from where it stopped; returns the end
    /// of what every stage has run.
    fn run_range(&mut self, cx: &mut ExecContext, batch: &mut Batch, range: Range<usize>, ctx: &NfContext) -> usize {
        // One test per segment: the loop is built with and without the observation point (`crate::tap`).
        if cx.tap.is_some() {
            self.run_range_with::<true>(cx, batch, range, ctx)
        } else {
            self.run_range_with::<false>(cx, batch, range, ctx)
        }
    }

    #[inline(always)]
    fn run_range_with<const OBS: bool>(
        &mut self,
        cx: &mut ExecContext,
        batch: &mut Batch,
        range: Range<usize>,
        ctx: &NfContext,
    ) -> usize {
        let mut frontier = range.end;
        cx.pin_coarse_batch(range.clone(), ctx.now_ns);
        let ahead = if cx.cfg.prefetch && cx.cfg.prefetch_hooks { PREFETCH_AHEAD } else { 0 };
        // The range's IPv4 keys, gathered once for every NF's own bulk lookup (a range of one packet, as chains
        // that end flows may run, takes the single-key path instead).
        let mut gathered = (range.len() > 1).then(|| gather_range(cx, batch, range.clone()));
        let mut k = 0;
        for si in 0..cx.chain.stages.len() {
            let per_flow = matches!(cx.chain.stages[si], Stage::Stateful { group: None, .. });
            let from = cx.progress[si].max(range.start);
            if from >= frontier {
                k += usize::from(per_flow);
                continue;
            }
            let todo = from..frontier;
            cx.progress[si] = frontier;
            if let Stage::Stateless(nf) = &mut cx.chain.stages[si] {
                nf.process(batch, todo.clone(), ctx);
                if OBS {
                    cx.observe(si, batch, todo);
                }
                continue;
            }
            if cx.chain.stages[si].is_coarse() {
                cx.run_coarse_batch(si, batch, todo.clone(), ctx);
                if OBS {
                    cx.observe(si, batch, todo);
                }
                continue;
            }
            let mut ran = todo.clone();
            let flows = &mut self.flows[k];
            match gathered.as_mut() {
                Some(g) => lookup_into(cx, k, si, batch, todo.clone(), flows, ctx, g),
                None => {
                    for i in todo.clone() {
                        flows[i] = lookup_key(cx, k, si, batch, i, ctx);
                    }
                }
            }
            if let Stage::Stateful { nf, counters, .. } = &mut cx.chain.stages[si] {
                let metas = &cx.scratch.metas[..frontier];
                let mut out = BatchOutcome::default();
                nf.process_batch(batch, todo, metas, &flows[..frontier], &mut cx.stores[k], 0, ctx, ahead, &mut out);
                counters.merge(&out.counters);
                out.merge_into(&mut self.ends, &mut self.refused);
                if let Some(stop) = out.stopped_at {
                    frontier = stop;
                    cx.progress[si] = stop;
                    ran.end = stop;
                }
                if OBS {
                    cx.observe(si, batch, ran);
                }
            }
            k += 1;
        }
        // A flow ends in every NF's table at once, after its packet went through the chain.
        for i in range.start..frontier {
            let bit = 1u64 << (i & 63);
            if self.ends[i >> 6] & bit != 0 {
                self.ends[i >> 6] &= !bit;
                let refused = self.refused[i >> 6] & bit != 0;
                self.refused[i >> 6] &= !bit;
                let key = cx.scratch.metas[i].tuple;
                cx.end_flow_everywhere(&key, refused);
            }
        }
        cx.unpin_coarse_batch(range, ctx.now_ns);
        frontier
    }
}
