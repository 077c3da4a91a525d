//! `pernf`: VPP's model. Every 5-tuple NF has its own table and does its own
//! bulk lookup over the batch (a lookup per NF per packet), then runs over
//! the batch; coarse NFs reach their shared tables as in every executor.

use flowplane_nf::NfContext;
use flowplane_packet::{Batch, MAX_BATCH};

use super::context::{end_flows, lookup_into, PREFETCH_AHEAD};
use super::{ExecContext, Executor, ExecutorInfo, StateLayout};
use crate::chain::Stage;
use crate::stage::BatchOutcome;
use crate::store::FlowRef;

/// Registry entry.
pub(super) const INFO: ExecutorInfo = ExecutorInfo {
    name: "pernf",
    about: "VPP: a table per NF, one bulk lookup per NF per batch",
    layout: StateLayout::PerNf,
    new: |cx| Box::new(PerNf { flows: vec![[FlowRef::NONE; MAX_BATCH]; cx.stores.len()] }),
};

/// Each 5-tuple stage's flow entries for the current batch.
struct PerNf {
    flows: Vec<[FlowRef; MAX_BATCH]>,
}

impl Executor for PerNf {
    fn run(&mut self, cx: &mut ExecContext, batch: &mut Batch, ctx: &NfContext) {
        let n = batch.len();
        cx.pin_coarse_batch(n, ctx.now_ns);
        let ahead = if cx.cfg.prefetch && cx.cfg.prefetch_hooks { PREFETCH_AHEAD } else { 0 };
        let mut k = 0;
        for si in 0..cx.chain.stages.len() {
            if let Stage::Stateless(nf) = &mut cx.chain.stages[si] {
                nf.process(batch, ctx);
                continue;
            }
            if cx.chain.stages[si].is_coarse() {
                cx.run_coarse_batch(si, batch, ctx);
                continue;
            }
            let flows = &mut self.flows[k];
            lookup_into(cx, k, si, batch, flows, ctx);
            let mut out = BatchOutcome::default();
            if let Stage::Stateful { nf, counters, .. } = &mut cx.chain.stages[si] {
                let metas = &cx.scratch.metas[..n];
                nf.process_batch(batch, metas, &flows[..n], &mut cx.stores[k], 0, ctx, ahead, &mut out);
                counters.merge(&out.counters);
            }
            cx.stats.ended += end_flows(&mut cx.chain.stages, &mut cx.stores[k], Some(k), None, &flows[..n], &out.end);
            k += 1;
        }
        cx.unpin_coarse_batch(n, ctx.now_ns);
    }
}
