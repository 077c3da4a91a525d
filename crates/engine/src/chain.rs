//! The chain compiler: from a spec to one core's NF instances, with the
//! state layout of the 5-tuple NFs aggregated into one block per flow.
//!
//! Every 5-tuple NF of the chain shares ONE table and ONE state block per
//! flow (FAJITA ①): states are packed back to back, smallest first, so the
//! first cache line covers as many NFs as possible. Stateless elements
//! (`forward`, `count`) stay batch-level stages in their chain position.
//!
//! A chain graph (`acl -> { allow: lb ; deny: count -> port(m) }`, see
//! [`crate::spec`]) compiles segment by segment: each linear segment is a
//! [`Chain`] of its own (its own aggregated block, coarse groups and, once
//! running, its own table and batched lookups), with its branches in
//! [`Chain::branches`]; [`crate::graph`] runs them. A spec without branches
//! and ports compiles to exactly the linear chain of before (no branches).

use flowplane_nf::registry::{self, NfSink};
use flowplane_nf::stateful::Granularity;
use flowplane_nf::{Export, Nf, NfCounters, Params, StatefulNf};

use crate::coarse::{GroupLayout, MAX_GROUP_WORDS};
use crate::error::EngineError;
use crate::spec::{ChainSpec, Label, PortRef};
use crate::stage::{BlockIdle, StatefulStage, Typed};

/// One stage of a compiled chain.
pub enum Stage {
    /// A batch-level element.
    Stateless(Box<dyn Nf>),
    /// A stateful NF with its state at `offset` in its block: the flow's
    /// aggregated block (`group == None`, 5-tuple NFs) or the block of a
    /// coarse group's shared entry (`group == Some(g)`).
    Stateful {
        /// The NF.
        nf: Box<dyn StatefulStage>,
        /// Byte offset of its state in the block.
        offset: usize,
        /// Coarse group, if the NF's state is keyed by something coarser than the 5-tuple.
        group: Option<usize>,
        /// Index of the NF within its coarse group (its "initialised" bit).
        member: usize,
        /// The NF's idle stamp, where its container's expiry is not its own
        /// timeout (see [`IdleSlot`]).
        idle: Option<IdleSlot>,
        /// Counters kept by the executor.
        counters: NfCounters,
    },
}

/// An NF's last-touched stamp (a `u64` packet time) in its state's block,
/// kept where the container's own expiry is not the NF's timeout: in the
/// aggregated 5-tuple block for an NF whose declared timeout is shorter than
/// the block's (the longest of the chain), and in a coarse entry for every
/// coarse NF (a flow's pin keeps the entry from expiring, and several NFs may
/// share it). On access, a stamp idle past the NF's timeout
/// (`flowplane_nf::stateful::is_idle`) makes the engine release the NF's old
/// state, zero it and run `init` — what an expiry followed by a new insert
/// would do — and every access sets it to the packet's time. Only the NF's
/// own packets touch it (not those an earlier NF dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleSlot {
    /// Byte offset of the stamp in the block (right before the NF's state).
    pub at: usize,
    /// The NF's timeout in ns (0 until the run's default is known: a coarse
    /// NF that declares none takes its group's, resolved by the executor's
    /// context).
    pub timeout_ns: u64,
    /// The NF fails closed (`passes_without_state() == false`): shared state
    /// of it is judged idle by the accessing packet's own time, not the
    /// cores' one clock (see `coarse::CoreClocks`). Fixed when compiled, so
    /// the per-packet path asks no NF.
    pub own_clock: bool,
}

impl Stage {
    /// A stateful NF as an uncompiled stage (for [`Chain::from_stages`]).
    pub fn stateful<T: StatefulNf>(nf: T) -> Stage {
        StageSink.stateful(nf)
    }

    /// True for a stateful NF keyed coarser than the 5-tuple (state in a shared table).
    #[inline]
    pub fn is_coarse(&self) -> bool {
        matches!(self, Stage::Stateful { group: Some(_), .. })
    }

    /// Bytes of the NF's per-key state (0: a stateless NF).
    pub fn state_size(&self) -> usize {
        match self {
            Stage::Stateless(_) => 0,
            Stage::Stateful { nf, .. } => nf.state_size(),
        }
    }

    /// The NF's name.
    pub fn name(&self) -> &'static str {
        match self {
            Stage::Stateless(n) => n.name(),
            Stage::Stateful { nf, .. } => nf.name(),
        }
    }

    /// The NF's report (this core's figures).
    pub fn report(&self) -> Option<serde_json::Value> {
        match self {
            Stage::Stateless(n) => n.report(),
            Stage::Stateful { nf, .. } => nf.report(),
        }
    }

    /// Merges another core's report of this NF into `into` (the NF's merge hook).
    pub fn merge_report(&self, into: &mut serde_json::Value, other: &serde_json::Value) {
        match self {
            Stage::Stateless(n) => n.merge_report(into, other),
            Stage::Stateful { nf, .. } => nf.merge_report(into, other),
        }
    }

    /// What `--export` writes for this NF.
    pub fn export_kind(&self) -> Export {
        match self {
            Stage::Stateless(n) => n.export_kind(),
            Stage::Stateful { nf, .. } => nf.export_kind(),
        }
    }

    /// Takes new run-time parameters (`p`: all of the NF's parameters as
    /// the chain now gives them), between two batches; the NF's state stays.
    pub fn reconfigure(&mut self, p: &mut flowplane_nf::Params) -> Result<(), flowplane_nf::ParamError> {
        match self {
            Stage::Stateless(n) => n.reconfigure(p),
            Stage::Stateful { nf, .. } => nf.reconfigure(p),
        }
    }

    /// Export rows derived from the report merged over every core ([`Export::Report`]).
    pub fn export_report_rows(&self, merged: &serde_json::Value) -> Vec<serde_json::Value> {
        match self {
            Stage::Stateless(n) => n.export_report_rows(merged),
            Stage::Stateful { nf, .. } => nf.export_report_rows(merged),
        }
    }
}

/// One core's compiled chain.
pub struct Chain {
    /// Stages in chain order.
    pub stages: Vec<Stage>,
    /// Bytes of the aggregated 5-tuple state block.
    pub state_size: usize,
    /// Longest idle timeout any 5-tuple NF asked for (None: none asked):
    /// the aggregated block's; an NF asking for less gets an [`IdleSlot`].
    /// Coarse groups' entries expire after the longest timeout of their NFs
    /// (`GroupLayout::idle_timeout_ns`), each NF by its own stamp.
    pub idle_timeout_ns: Option<u64>,
    /// Coarse groups (one per coarse granularity used), in order of first use.
    pub groups: Vec<GroupLayout>,
    /// A graph segment's branches (empty: a linear chain, or a segment
    /// ending in a port or in nothing).
    pub branches: Vec<Branch>,
    /// `port(P)`: the output port of every packet this segment passes.
    pub port: Option<u16>,
}

/// Which of the branching segment's verdicts a branch takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BranchOn {
    /// Every verdict but drop, without a port branch of its own.
    Pass,
    /// Dropped packets (revived: verdict 0 before the branch's NFs).
    Drop,
    /// Packets sent to this port.
    Port(u16),
}

/// One branch of a graph segment.
pub struct Branch {
    /// Which verdicts it takes.
    pub on: BranchOn,
    /// Its labels from the root (`deny`, `allow/1`): NFs report as `path/name`.
    pub path: String,
    /// The branch's segment (with its own branches).
    pub chain: Chain,
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a.max(1)) * a.max(1)
}

/// Turns a built NF into a stage (the registry hands it over with its type).
struct StageSink;

impl NfSink for StageSink {
    type Out = Stage;
    fn stateless(self, nf: Box<dyn Nf>) -> Stage {
        Stage::Stateless(nf)
    }
    fn stateful<T: StatefulNf>(self, nf: T) -> Stage {
        Stage::Stateful {
            nf: Box::new(Typed::new(nf)),
            offset: 0,
            group: None,
            member: 0,
            idle: None,
            counters: NfCounters::default(),
        }
    }
}

/// Most NFs that may share one coarse entry (one "initialised" bit each in word 0).
const MAX_GROUP_MEMBERS: usize = 62;

impl Chain {
    /// Instantiates every NF of `spec` and lays out the aggregated state;
    /// the error names the offending NF or parameter.
    pub fn build(spec: &ChainSpec) -> Result<Chain, EngineError> {
        Chain::build_with(spec, false)
    }

    /// [`Chain::build`] with, when `shared_flows`, the 5-tuple NFs' state in
    /// a shared table too (a coarse group keyed by the 5-tuple) instead of
    /// the per-core aggregated block: the `shared` strategy, which sprays a
    /// flow's packets over every core.
    pub fn build_with(spec: &ChainSpec, shared_flows: bool) -> Result<Chain, EngineError> {
        if spec.is_graph() {
            if let Some(n) = spec.unbound_port() {
                return Err(EngineError::Config(format!(
                    "chain graph: no output port is named '{n}' (name one with --port {n}=SPEC)"
                )));
            }
            return Chain::build_segment(spec, 0, shared_flows, None);
        }
        Chain::build_linear(spec, shared_flows)
    }

    fn build_linear(spec: &ChainSpec, shared_flows: bool) -> Result<Chain, EngineError> {
        let mut stages = Vec::with_capacity(spec.nfs.len());
        for s in &spec.nfs {
            stages.push(registry::build_with(&s.name, Params::new(&s.name, s.params.clone()), StageSink)?);
        }
        Chain::from_stages(stages, shared_flows)
    }

    /// Compiles NFs already built (the registry's, or a test's own through
    /// [`Stage::stateful`]): coarse groups, the aggregated block, idle stamps.
    pub fn from_stages(mut stages: Vec<Stage>, shared_flows: bool) -> Result<Chain, EngineError> {
        for stage in &stages {
            if let Stage::Stateful { nf, .. } = stage {
                let max = if nf.granularity() == Granularity::FiveTuple { 16 } else { 8 };
                if nf.state_align() > max {
                    return Err(EngineError::StateAlign { nf: nf.name(), align: nf.state_align(), max });
                }
            }
        }
        let rewriter = stages.iter().position(|s| matches!(s, Stage::Stateless(nf) if nf.rewrites_flow()));
        if let Some(r) = rewriter {
            let after = stages[r].name();
            if let Some(Stage::Stateful { nf, .. }) = stages[r..].iter().find(|s| matches!(s, Stage::Stateful { .. })) {
                return Err(EngineError::StatefulAfterRewrite { nf: nf.name(), after });
            }
        }
        // Coarse groups: NFs of one granularity share an entry, packed in chain order.
        let mut groups: Vec<GroupLayout> = Vec::new();
        let mut group_bytes: Vec<usize> = Vec::new();
        let mut members: Vec<usize> = Vec::new();
        for st in stages.iter_mut() {
            if let Stage::Stateful { nf, offset, group, member, idle, .. } = st {
                let g = nf.granularity();
                if g == Granularity::FiveTuple && !shared_flows {
                    continue;
                }
                let gi = match groups.iter().position(|x| x.granularity == g) {
                    Some(i) => i,
                    None => {
                        groups.push(GroupLayout { granularity: g, words: 0, aux_offset: 0, idle_timeout_ns: None });
                        group_bytes.push(0);
                        members.push(0);
                        groups.len() - 1
                    }
                };
                // The NF's stamp, then its state.
                let stamp = align_up(group_bytes[gi], 8);
                *idle = Some(IdleSlot {
                    at: stamp,
                    timeout_ns: nf.idle_timeout_ns().unwrap_or(0),
                    own_clock: !nf.passes_without_state(),
                });
                let at = align_up(stamp + 8, nf.state_align());
                *offset = at;
                *group = Some(gi);
                *member = members[gi];
                members[gi] += 1;
                if let Some(t) = nf.idle_timeout_ns() {
                    let gt = &mut groups[gi].idle_timeout_ns;
                    *gt = Some(gt.map_or(t, |x| x.max(t)));
                }
                group_bytes[gi] = at + nf.state_size();
                if members[gi] > MAX_GROUP_MEMBERS {
                    return Err(EngineError::GroupMembers {
                        nf: nf.name(),
                        granularity: g.name(),
                        max: MAX_GROUP_MEMBERS,
                    });
                }
            }
        }
        for (g, bytes) in groups.iter_mut().zip(&group_bytes) {
            g.words = bytes.div_ceil(8).max(1);
            if g.words > MAX_GROUP_WORDS {
                return Err(EngineError::GroupTooLarge {
                    granularity: g.granularity.name(),
                    bytes: *bytes,
                    max: MAX_GROUP_WORDS * 8,
                });
            }
        }
        let mut chain =
            Chain { stages, state_size: 0, idle_timeout_ns: None, groups, branches: Vec::new(), port: None };
        chain.lay_out_flow_block(true);
        Ok(chain)
    }

    /// Segment `seg` of a graph with its branches; `rewritten`: an NF of an
    /// earlier segment rewrites flows (no stateful NF may follow it).
    fn build_segment(
        spec: &ChainSpec,
        seg: usize,
        shared_flows: bool,
        rewritten: Option<&'static str>,
    ) -> Result<Chain, EngineError> {
        let mut chain = Chain::build_linear(&spec.segment_spec(seg), shared_flows)?;
        if let (Some(after), Some(nf)) = (rewritten, chain.first_stateful()) {
            return Err(EngineError::StatefulAfterRewrite { nf, after });
        }
        let rewritten = rewritten.or_else(|| {
            chain.stages.iter().find_map(|s| match s {
                Stage::Stateless(nf) if nf.rewrites_flow() => Some(nf.name()),
                _ => None,
            })
        });
        chain.port = match &spec.segments[seg].port {
            None => None,
            Some(PortRef::Num(p)) => Some(*p),
            Some(PortRef::Name(n)) => return Err(EngineError::Config(format!("chain graph: unbound port '{n}'"))),
        };
        for k in spec.children(seg) {
            let on = match &spec.segments[k].on {
                Label::Allow => BranchOn::Pass,
                Label::Deny => BranchOn::Drop,
                Label::Port(p) => BranchOn::Port(*p),
                Label::Named(n) => return Err(EngineError::Config(format!("chain graph: unbound port '{n}'"))),
            };
            // Bound names may make two labels one port.
            if chain.branches.iter().any(|b| b.on == on) {
                return Err(EngineError::Config(format!(
                    "chain graph: two branches of '{}' take the same verdict",
                    spec.segment_path(seg)
                )));
            }
            let sub = Chain::build_segment(spec, k, shared_flows, rewritten)?;
            chain.branches.push(Branch { on, path: spec.segment_path(k), chain: sub });
        }
        Ok(chain)
    }

    fn first_stateful(&self) -> Option<&'static str> {
        self.stages.iter().find_map(|s| match s {
            Stage::Stateful { nf, .. } => Some(nf.name()),
            Stage::Stateless(_) => None,
        })
    }

    /// Every stage of the graph, depth first (the order of the spec's `nfs`),
    /// with its segment's path (empty for the root).
    pub fn all_stages(&self) -> Vec<(&str, &Stage)> {
        let mut out = Vec::new();
        self.collect_stages("", &mut out);
        out
    }

    fn collect_stages<'a>(&'a self, path: &'a str, out: &mut Vec<(&'a str, &'a Stage)>) {
        out.extend(self.stages.iter().map(|s| (path, s)));
        for b in &self.branches {
            b.chain.collect_stages(&b.path, out);
        }
    }

    /// True for a graph segment (branches or a port).
    pub fn is_graph(&self) -> bool {
        !self.branches.is_empty() || self.port.is_some()
    }

    /// Lays out the aggregated 5-tuple block: the auxiliary table's pinned
    /// handles to coarse state first (read on every packet), then the 5-tuple
    /// NFs' states. Packed (GuNFu's data packing, the default): smallest
    /// first (stable), each at its alignment, so the first line serves as
    /// many NFs as possible. Unpacked (`--no-packing`, for measuring what
    /// packing gains): in chain order, each NF's state 64 bytes after the
    /// previous one's start, so no two NFs' states share a line's worth of bytes.
    pub fn lay_out_flow_block(&mut self, packed: bool) {
        let mut size = 8 * self.groups.len();
        for (i, g) in self.groups.iter_mut().enumerate() {
            g.aux_offset = 8 * i;
        }
        let stages = &mut self.stages;
        let mut order: Vec<usize> =
            (0..stages.len()).filter(|&i| matches!(stages[i], Stage::Stateful { group: None, .. })).collect();
        if packed {
            order.sort_by_key(|&i| match &stages[i] {
                Stage::Stateful { nf, .. } => nf.state_size(),
                Stage::Stateless(_) => 0,
            });
        }
        let timeout = order
            .iter()
            .filter_map(|&i| match &stages[i] {
                Stage::Stateful { nf, .. } => nf.idle_timeout_ns(),
                Stage::Stateless(_) => None,
            })
            .max();
        for i in order {
            if let Stage::Stateful { nf, offset, idle, .. } = &mut stages[i] {
                size = align_up(size, if packed { nf.state_align() } else { 64 });
                // A shorter timeout than the block's: the NF's stamp, then its state.
                *idle = match (nf.idle_timeout_ns(), timeout) {
                    (Some(t), Some(block)) if t < block => {
                        let at = align_up(size, 8);
                        size = align_up(at + 8, nf.state_align());
                        Some(IdleSlot { at, timeout_ns: t, own_clock: !nf.passes_without_state() })
                    }
                    _ => None,
                };
                nf.set_idle(idle.map(|s| BlockIdle { at: s.at, timeout_ns: s.timeout_ns }));
                *offset = size;
                size += nf.state_size();
            }
        }
        self.state_size = size;
        self.idle_timeout_ns = timeout;
    }

    /// The first NF (of the whole graph) that needs both directions of a connection on one core.
    pub fn needs_symmetric_rss(&self) -> Option<&'static str> {
        self.stages
            .iter()
            .find_map(|s| match s {
                Stage::Stateful { nf, .. } if nf.both_directions() => Some(nf.name()),
                _ => None,
            })
            .or_else(|| self.branches.iter().find_map(|b| b.chain.needs_symmetric_rss()))
    }

    /// True if any stage of this segment (not its branches) keeps per-flow state.
    pub fn is_stateful(&self) -> bool {
        self.stages.iter().any(|s| matches!(s, Stage::Stateful { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse;

    #[test]
    fn builds_and_reports_errors() {
        assert_eq!(Chain::build(&parse("forward -> count").unwrap()).unwrap().stages.len(), 2);
        let e = Chain::build(&parse("forward -> nope").unwrap()).err().unwrap().to_string();
        assert!(e.starts_with("unknown NF 'nope'"), "{e}");
        let e = Chain::build(&parse("forward(prot=1)").unwrap()).err().unwrap().to_string();
        assert_eq!(e, "forward: unknown parameter 'prot'");
        let e = Chain::build(&parse("forward(port=x)").unwrap()).err().unwrap().to_string();
        assert!(e.contains("'port=x'"), "{e}");
    }

    #[test]
    fn aggregates_state_smallest_first() {
        let c = Chain::build(&parse("fsc -> lb -> ratelimit").unwrap()).unwrap();
        let offs: Vec<(&str, usize)> = c
            .stages
            .iter()
            .filter_map(|s| match s {
                Stage::Stateful { nf, offset, .. } => Some((nf.name(), *offset)),
                _ => None,
            })
            .collect();
        // ratelimit (16 B) first, then fsc and lb (32 B each, in chain order).
        assert_eq!(offs, vec![("fsc", 16), ("lb", 48), ("ratelimit", 0)]);
        assert_eq!(c.state_size, 80);
    }

    #[test]
    fn unpacked_layout_gives_each_state_its_own_line_in_chain_order() {
        let mut c = Chain::build(&parse("fsc -> lb -> ratelimit").unwrap()).unwrap();
        c.lay_out_flow_block(false);
        let offs: Vec<usize> = c
            .stages
            .iter()
            .filter_map(|s| match s {
                Stage::Stateful { offset, .. } => Some(*offset),
                _ => None,
            })
            .collect();
        assert_eq!(offs, vec![0, 64, 128]);
        assert_eq!(c.state_size, 128 + 16);
        c.lay_out_flow_block(true);
        assert_eq!(c.state_size, 80);
    }
}
