//! `microbatch`: FastClick's model without its batch rebuilder. The batch is
//! cut into runs of consecutive packets of one flow; each run costs one
//! single-key lookup (no bulk, no prefetch), then each NF runs over the
//! whole batch.


use flowplane_nf::NfContext;
use flowplane_packet::Batch;

use super::{ExecContext, Executor, ExecutorInfo, StateLayout};

/// Registry entry.
pub(super) const INFO: ExecutorInfo = ExecutorInfo {
    name: "microbatch",
    about: "FastClick: one single-key lookup per run of same-flow packets, each NF over the batch",
    layout: StateLayout::Aggregated,
    param: None,
    new: |_| Box::new(MicroBatch),
};

struct MicroBatch;

impl Executor for MicroBatch {
    fn run(&mut self, cx: &mut ExecContext, batch: &mut Batch, ctx: &NfContext) {
        let n = batch.len();
        let mut start = 0;
        cx.start_batch(batch);
        while start < n {
            let w = cx.window_end(batch, start, n);
            cx.lookup_runs(batch, start..w, ctx);
            loop {
                let end = cx.segment_end(start, w);
                cx.pin_coarse_batch(start..end, ctx.now_ns);
                let (ended, done) = cx.run_stages(batch, start..end, ctx, false);
                cx.unpin_coarse_batch(start..end, ctx.now_ns);
                start = done;
                if ended > 0 || start == w {
                    break;
                }
            }
        }
    }
}
