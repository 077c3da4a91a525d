//! `rtc`: per-packet run-to-completion. Packet i is looked up (single key)
//! and runs through every NF before packet i+1 is touched; no batching of
//! lookups, no prefetch. Stateless stages (which take whole batches) cut the
//! chain into segments, each run packet by packet.

use flowplane_nf::stateful::Action;
use flowplane_nf::{NfContext, Pkt};
use flowplane_packet::Batch;

use super::{ExecContext, Executor, ExecutorInfo, StateLayout};
use crate::chain::Stage;
use crate::stage::{apply_action, packet_ctx};

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
        let n = batch.len();
        let stages = cx.chain.stages.len();
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
            for i in 0..n {
                if !looked_up {
                    cx.scratch.flows[i] = cx.lookup_one(batch, i, ctx);
                }
                let flow = cx.scratch.flows[i];
                cx.pin_coarse_packet(i, ctx.now_ns);
                let mut end = false;
                for si in seg_start..seg_end {
                    if cx.chain.stages[si].is_coarse() {
                        cx.run_coarse(si, batch, i, ctx);
                        continue;
                    }
                    let Stage::Stateful { nf, offset, counters, .. } = &mut cx.chain.stages[si] else { continue };
                    if batch.is_dropped(i) {
                        continue;
                    }
                    counters.packets_in += 1;
                    counters.bytes_in += batch.lens()[i] as u64;
                    let action = if !flow.is_some() {
                        nf.on_unparsed()
                    } else {
                        let sz = nf.state_size();
                        match cx.stores[0].block_mut(flow).get_mut(*offset..*offset + sz) {
                            Some(st) => {
                                let pctx = packet_ctx(batch, i, ctx);
                                nf.process_bytes(&mut Pkt::new(batch.data_mut(i), &cx.scratch.metas[i]), st, &pctx)
                            }
                            None => Action::Drop,
                        }
                    };
                    end |= apply_action(batch, i, action, counters);
                }
                cx.unpin_coarse_packet(i, ctx.now_ns);
                if end && flow.is_some() {
                    cx.end_flow(0, flow, ctx.now_ns, i + 1);
                }
            }
            looked_up = true;
            seg_start = seg_end;
        }
    }
}
