//! `batch`: FAJITA's batched executor. The batch stays whole through the
//! chain: one bulk, prefetching lookup-or-insert per batch into the
//! aggregated table, then each NF over the whole batch with its prefetch hook
//! a few packets ahead. With `--no-prefetch` the lookups go key by key and
//! nothing is prefetched (the baseline of FAJITA's prefetch experiment).

use flowplane_nf::NfContext;
use flowplane_packet::Batch;

use super::{ExecContext, Executor, ExecutorInfo, StateLayout};

/// Registry entry.
pub(super) const INFO: ExecutorInfo = ExecutorInfo {
    name: "batch",
    about: "FAJITA: one bulk prefetching lookup per batch, aggregated state, each NF over the whole batch",
    layout: StateLayout::Aggregated,
    param: None,
    new: |_| Box::new(Batched),
};

struct Batched;

impl Executor for Batched {
    fn run(&mut self, cx: &mut ExecContext, batch: &mut Batch, ctx: &NfContext) {
        let prefetch = cx.cfg.prefetch;
        let n = batch.len();
        let mut start = 0;
        cx.start_batch(batch);
        while start < n {
            // The whole batch unless its packet time spans more than the idle timeout.
            let w = cx.window_end(batch, start, n);
            cx.lookup_bulk(batch, start..w, ctx, prefetch);
            loop {
                // One segment for chains that never end flows; see ExecContext::segment_end.
                let end = cx.segment_end(start, w);
                cx.pin_coarse_batch(start..end, ctx.now_ns);
                let (ended, done) = cx.run_stages(batch, start..end, ctx, prefetch);
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
