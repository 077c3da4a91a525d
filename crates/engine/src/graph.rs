//! Running a chain graph: the branch points of one core's [`Pipeline`].
//!
//! A graph (`acl -> { allow: lb -> fsc ; deny: count -> port(m) }`, see
//! [`crate::spec`]) is compiled segment by segment ([`crate::chain`]): each
//! linear segment is a [`Chain`] run by a [`Pipeline`] of its own, so every
//! segment keeps the aggregated state block, its own per-core table and
//! the batched lookups of whatever executor runs (`--exec`: every executor
//! works unchanged, a segment is just a chain to it). This module owns what
//! happens after a segment's pipeline processed the batch:
//!
//! 1. `port(P)`: every packet the segment passed gets verdict `P`.
//! 2. The branch point: each packet's verdict picks its lane — the `deny`
//!    branch for a drop, the branch of its port, else the `allow` branch,
//!    else lane 0 (no branch: the packet keeps its verdict, as in a linear
//!    chain). Once per branch point and batch, the batch is split into one
//!    preallocated sub-batch per lane ([`Batch::split_into`]: VPP's
//!    `nexts[]`; buffers change owner, nothing is copied or allocated),
//!    each branch's pipeline runs over its sub-batch as over any batch,
//!    and the sub-batches are joined back in the original order
//!    ([`Batch::join_from`]). A batch that goes to one branch whole runs it
//!    without a split.
//!
//! Order: a split is stable, so the packets of one flow (one verdict of
//! the branching NF, or several: each lane keeps arrival order) reach each
//! branch in arrival order; within a branch the executor keeps per-flow order
//! as it does for any batch. A packet's final verdict is the port its last
//! segment chose (or drop).
//!
//! A `deny` branch revives its packets (verdict 0 before its NFs: NFs
//! skip dropped packets), so `deny: count -> port(m)` counts and mirrors
//! what the branching segment dropped. Its "drops" are the segment's: a
//! packet dropped by any NF of the segment before the branch point, not only
//! by its last NF (the segment runs as one batch pass; the verdict does
//! not say which NF set it). Put the branching NF first in its segment to
//! branch on its verdict alone.
//!
//! Why sub-pipelines and not one executor over a graph: each executor's
//! batch loop (bulk lookups, prefetch distance, interleaving) stays as
//! measured, a linear chain compiles to exactly the pipeline it had
//! (no graph, one `Option` test per batch), and each branch's state is
//! what the branch's chain alone would keep — which is what the graph
//! tests check against (a branch's output and state equal its chain's run
//! on the input filtered by the branch verdict).

use flowplane_nf::NfContext;
use flowplane_packet::{Batch, Verdict, DROP, MAX_BATCH};

use crate::chain::{Branch, BranchOn, Chain};
use crate::coarse::SharedStores;
use crate::error::EngineError;
use crate::exec::{ExecConfig, Pipeline};
use crate::tap::Tap;

/// Most branches at one branch point (lanes are bytes; lane 0 is "no branch").
pub const MAX_BRANCHES: usize = 254;

/// One branch: which verdicts it takes, its label, its segment's pipeline.
pub(crate) struct Arm {
    pub(crate) on: BranchOn,
    /// The branch's label (its NFs report as `label/name` within its parent's names).
    pub(crate) label: String,
    pub(crate) pipe: Pipeline,
    /// Its first stage's flat index and its segment number, relative to its parent segment's (a trace's
    /// frames, see [`crate::tap::Tap::enter`]).
    offset: usize,
    seg: usize,
}

/// A segment's port and branch point, run after the segment's own pipeline.
pub(crate) struct Graph {
    /// `port(P)` of the segment.
    port: Option<Verdict>,
    /// Branches; lane `k + 1` is `arms[k]`.
    pub(crate) arms: Vec<Arm>,
    /// Lane of the `allow` and `deny` branches (0: none).
    pass_lane: u8,
    drop_lane: u8,
    /// (port, lane) of the port branches.
    port_lanes: Vec<(Verdict, u8)>,
    /// Per packet of the current batch: its lane.
    lane: Box<[u8; MAX_BATCH]>,
    /// Packets per lane in the current batch.
    counts: Vec<u16>,
    /// One sub-batch per lane, bound to the batches' pool (made at the first split).
    parts: Vec<Box<Batch>>,
}

impl Graph {
    /// The graph part of a segment: `port`, and `branches` each compiled into
    /// its own pipeline (`shared`: the branches' shared tables, in order);
    /// `stages`: the segment's own stages (the branches' come after them in flat order).
    pub(crate) fn new(
        port: Option<u16>,
        branches: Vec<Branch>,
        cfg: ExecConfig,
        shared: &[SharedStores],
        stages: usize,
    ) -> Result<Graph, EngineError> {
        if branches.len() > MAX_BRANCHES {
            return Err(EngineError::Config(format!(
                "chain graph: {} branches at one branch point (at most {MAX_BRANCHES})",
                branches.len()
            )));
        }
        let mut g = Graph {
            port,
            arms: Vec::with_capacity(branches.len()),
            pass_lane: 0,
            drop_lane: 0,
            port_lanes: Vec::new(),
            lane: Box::new([0; MAX_BATCH]),
            counts: vec![0; branches.len() + 1],
            parts: Vec::new(),
        };
        let (mut offset, mut seg) = (stages, 1);
        for (k, b) in branches.into_iter().enumerate() {
            let lane = (k + 1) as u8;
            match b.on {
                BranchOn::Pass => g.pass_lane = lane,
                BranchOn::Drop => g.drop_lane = lane,
                BranchOn::Port(p) => g.port_lanes.push((p, lane)),
            }
            let sh = shared.get(k).cloned().unwrap_or_default();
            // The path's last label: names nest level by level.
            let label = b.path.rsplit('/').next().unwrap_or_default().to_string();
            let pipe = Pipeline::new(b.chain, cfg, sh)?;
            let (o, sg) = (offset, seg);
            offset += pipe.stages().len();
            seg += pipe.segment_count();
            g.arms.push(Arm { on: b.on, label, pipe, offset: o, seg: sg });
        }
        Ok(g)
    }

    #[inline]
    fn lane_of(&self, v: Verdict) -> u8 {
        if v == DROP {
            return self.drop_lane;
        }
        for &(p, l) in &self.port_lanes {
            if p == v {
                return l;
            }
        }
        self.pass_lane
    }

    /// After the segment's pipeline: its port, then its branches. `tap`: the segment's armed tap, handed
    /// to each branch's pipeline while it runs (see [`crate::tap::Tap::enter`]).
    pub(crate) fn run(&mut self, batch: &mut Batch, ctx: &NfContext, tap: &mut Option<Box<Tap>>) {
        if let Some(p) = self.port {
            for v in batch.verdicts_mut() {
                if *v != DROP {
                    *v = p;
                }
            }
        }
        if self.arms.is_empty() {
            return;
        }
        let n = batch.len();
        self.counts.fill(0);
        for (i, &v) in batch.verdicts().iter().enumerate() {
            let l = self.lane_of(v);
            self.lane[i] = l;
            self.counts[l as usize] += 1;
        }
        let whole = self.counts.iter().position(|&c| c as usize == n);
        match whole {
            // Every packet takes one lane: no split.
            Some(0) => {}
            Some(l) => run_arm(&mut self.arms[l - 1], l as u8, &self.lane[..n], batch, ctx, tap),
            None => {
                if self.parts.len() != self.counts.len() || !self.parts[0].same_memory(batch) {
                    // Once per worker (its pool never changes): the sub-batches.
                    self.parts = (0..self.counts.len()).map(|_| batch.sibling()).collect();
                }
                let mut parts = std::mem::take(&mut self.parts);
                if batch.split_into(&self.lane[..n], &mut parts).is_ok() {
                    for (l, part) in parts.iter_mut().enumerate().skip(1) {
                        if !part.is_empty() {
                            run_arm(&mut self.arms[l - 1], l as u8, &self.lane[..n], part, ctx, tap);
                        }
                    }
                    let joined = batch.join_from(&self.lane[..n], &mut parts);
                    // Executors never add or remove packets, so the parts still match their lanes.
                    debug_assert!(joined.is_ok());
                }
                self.parts = parts;
            }
        }
        // Branches that got no packet still advance their expiry on the packet clock.
        for (k, c) in self.counts.iter().enumerate().skip(1) {
            if *c == 0 {
                self.arms[k - 1].pipe.idle(ctx.now_ns);
            }
        }
    }
}

/// Runs branch `arm` (lane `lane` of `lanes`) over its sub-batch `part`, with the tap if one is armed.
fn run_arm(arm: &mut Arm, lane: u8, lanes: &[u8], part: &mut Batch, ctx: &NfContext, tap: &mut Option<Box<Tap>>) {
    if arm.on == BranchOn::Drop {
        // The deny branch takes dropped packets back in (NFs skip drops).
        part.verdicts_mut().fill(0);
    }
    if tap.as_deref_mut().is_some_and(|t| t.enter(arm.offset, arm.seg, lane, lanes, part)) {
        arm.pipe.put_tap(tap.take());
        arm.pipe.process(part, ctx);
        *tap = arm.pipe.take_tap();
        if let Some(t) = tap.as_deref_mut() {
            t.leave();
        }
    } else {
        arm.pipe.process(part, ctx);
    }
}

/// The compiled chain of a graph segment with its branches taken out (for the segment's own pipeline).
pub(crate) fn take_graph(chain: &mut Chain) -> (Option<u16>, Vec<Branch>) {
    (chain.port.take(), std::mem::take(&mut chain.branches))
}
