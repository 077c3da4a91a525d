//! `rtc`: per-packet run-to-completion. Packet i is looked up (single key)
//! and runs through every NF before packet i+1 is touched; no batching of
//! lookups, no prefetch. Stateless stages (which take whole batches) cut the
//! chain into segments, each run packet by packet.

use flowplane_nf::NfContext;
use flowplane_packet::Batch;

use super::{ExecContext, Executor, ExecutorInfo, StateLayout};
use crate::chain::Stage;
use crate::stage::End;

/// Registry entry.
pub(super) const INFO: ExecutorInfo = ExecutorInfo {
    name: "rtc",
    about: "run-to-completion: single-key lookup per packet, every NF on it, then the next packet",
    layout: StateLayout::Aggregated,
    param: None,
    new: |_| Box::new(Rtc),
};

struct Rtc;

impl Executor for Rtc {
    fn run(&mut self, cx: &mut ExecContext, batch: &mut Batch, ctx: &NfContext) {
        // One test per batch: the loop is built with and without the observation point (`crate::tap`).
        if cx.tap.is_some() {
            run_with::<true>(cx, batch, ctx);
        } else {
            run_with::<false>(cx, batch, ctx);
        }
    }
}

/// The run-to-completion loop; with `OBS`, the armed tap sees each packet after each stage.
#[inline(always)]
fn run_with<const OBS: bool>(cx: &mut ExecContext, batch: &mut Batch, ctx: &NfContext) {
    let n = batch.len();
    let stages = cx.chain.stages.len();
    let mut seg_start = 0;
    let mut looked_up = false;
    while seg_start < stages {
        if let Stage::Stateless(nf) = &mut cx.chain.stages[seg_start] {
            nf.process(batch, 0..n, ctx);
            if OBS {
                cx.observe(seg_start, batch, 0..n);
            }
            seg_start += 1;
            continue;
        }
        let seg_end =
            (seg_start..stages).find(|&k| matches!(cx.chain.stages[k], Stage::Stateless(_))).unwrap_or(stages);
        // Without coarse stages (the common case) the per-stage loop
        // borrows the stages and the store once per packet, not through `cx`;
        // an observed run goes through `cx` (the tap reads state after each stage).
        let coarse = OBS || !cx.chain.groups.is_empty();
        for i in 0..n {
            if !looked_up {
                cx.scratch.flows[i] = cx.lookup_one(batch, i, ctx);
            }
            let flow = cx.scratch.flows[i];
            let mut end = End::No;
            if coarse {
                cx.pin_coarse_packet(i, ctx.now_ns);
                for si in seg_start..seg_end {
                    if cx.chain.stages[si].is_coarse() {
                        cx.run_coarse(si, batch, i, ctx);
                    } else {
                        let ExecContext { chain, stores, scratch, .. } = &mut *cx;
                        if let Stage::Stateful { nf, offset, counters, .. } = &mut chain.stages[si] {
                            let meta = &scratch.metas[i];
                            end = end.max(nf.process_one(batch, i, meta, flow, &mut stores[0], *offset, ctx, counters));
                        }
                    }
                    if OBS {
                        cx.observe(si, batch, i..i + 1);
                    }
                }
                cx.unpin_coarse_packet(i, ctx.now_ns);
            } else {
                let ExecContext { chain, stores, scratch, .. } = &mut *cx;
                let (meta, store) = (&scratch.metas[i], &mut stores[0]);
                for stage in chain.stages[seg_start..seg_end].iter_mut() {
                    if let Stage::Stateful { nf, offset, counters, .. } = stage {
                        end = end.max(nf.process_one(batch, i, meta, flow, store, *offset, ctx, counters));
                    }
                }
            }
            if end != End::No && flow.is_some() {
                cx.end_flow(0, flow, ctx.now_ns, i + 1, end == End::Refused);
            }
        }
        looked_up = true;
        seg_start = seg_end;
    }
}
