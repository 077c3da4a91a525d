//! `pernf`: VPP's model. Every 5-tuple NF has its own table and does its own
//! bulk lookup over the batch (a lookup per NF per packet), then runs over
//! the batch; coarse NFs reach their shared tables as in every executor.

use std::ops::Range;

use flowplane_nf::NfContext;
use flowplane_packet::{Batch, MAX_BATCH};

use super::context::{lookup_into, PREFETCH_AHEAD};
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
    new: |cx| Box::new(PerNf { flows: vec![[FlowRef::NONE; MAX_BATCH]; cx.stores.len()] }),
};

/// Each 5-tuple stage's flow entries for the current batch.
struct PerNf {
    flows: Vec<[FlowRef; MAX_BATCH]>,
}

impl Executor for PerNf {
    fn run(&mut self, cx: &mut ExecContext, batch: &mut Batch, ctx: &NfContext) {
        let n = batch.len();
        // Each NF looks its flows up on its own, so an end cannot be applied
        // between one NF's lookup and the next NF's: chains that end flows
        // run packet by packet to keep every end at its packet.
        let step = if cx.exact_ends() { 1 } else { n.max(1) };
        let mut start = 0;
        cx.start_batch(batch);
        while start < n {
            let end = (start + step).min(cx.window_end(batch, start, n));
            self.run_range(cx, batch, start..end, ctx);
            start = end;
        }
    }
}

impl PerNf {
    fn run_range(&mut self, cx: &mut ExecContext, batch: &mut Batch, range: Range<usize>, ctx: &NfContext) {
        let n = range.end;
        cx.pin_coarse_batch(range.clone(), ctx.now_ns);
        let ahead = if cx.cfg.prefetch && cx.cfg.prefetch_hooks { PREFETCH_AHEAD } else { 0 };
        let mut ends = [0u64; 4];
        let mut k = 0;
        for si in 0..cx.chain.stages.len() {
            if let Stage::Stateless(nf) = &mut cx.chain.stages[si] {
                nf.process(batch, range.clone(), ctx);
                continue;
            }
            if cx.chain.stages[si].is_coarse() {
                cx.run_coarse_batch(si, batch, range.clone(), ctx);
                continue;
            }
            let flows = &mut self.flows[k];
            lookup_into(cx, k, si, batch, range.clone(), flows, ctx);
            let mut out = BatchOutcome::default();
            if let Stage::Stateful { nf, counters, .. } = &mut cx.chain.stages[si] {
                let metas = &cx.scratch.metas[..n];
                let store = &mut cx.stores[k];
                nf.process_batch(batch, range.clone(), metas, &flows[..n], store, 0, ctx, ahead, &mut out);
                counters.merge(&out.counters);
            }
            for (e, o) in ends.iter_mut().zip(out.end) {
                *e |= o;
            }
            k += 1;
        }
        // A flow ends in every NF's table at once, after its packet went through the chain.
        for i in range.clone() {
            if ends[i >> 6] & (1 << (i & 63)) != 0 {
                let key = cx.scratch.metas[i].tuple;
                cx.end_flow_everywhere(&key);
            }
        }
        cx.unpin_coarse_batch(range, ctx.now_ns);
    }
}
