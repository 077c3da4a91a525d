//! Executors: how a compiled chain meets its state.
//!
//! An executor is one file implementing [`Executor`] over an explicit
//! [`ExecContext`] (chain, stores, shared tables, scratch arrays), composed
//! from the context's steps: lookups with add-on-miss, the coarse-state
//! path, the staged NF pass, end of flow. Parsing, expiry and results are
//! the [`Pipeline`]'s, the same for all. Adding an executor is one file plus
//! one line in [`EXECUTORS`]; the differential test
//! (`crates/engine/tests/executors.rs`) runs every registered executor.
//!
//! - `batch` (FAJITA): the batch stays whole; one bulk lookup-or-insert per
//!   batch into the aggregated table, the second line of large blocks and
//!   each NF's indirect state (prefetch hook) prefetched ahead of use.
//! - `rtc`: per-packet run-to-completion: single-key lookup, every NF, next
//!   packet; no batching of lookups, no prefetch.
//! - `pernf` (VPP's model): one table per NF, a bulk lookup per NF per batch.
//! - `microbatch` (FastClick without its batch rebuilder): one lookup per
//!   run of consecutive packets of one flow.
//! - `interleaved[:K]` (GuNFu): after the bulk match, K packet tasks in
//!   flight run the NFs' resumable actions (`StatefulNf::step`) round-robin,
//!   each switching when it names a line to fetch; then the staged pass
//!   finishes every packet in arrival order from its cursors.
//!
//! Observation (`flowplane ctl trace|capture`, [`crate::tap`]): every
//! executor calls `ExecContext::observe` right after a stage ran a range of
//! packets (stage-major executors per stage and segment, `rtc` per stage and
//! packet), so a trace or capture sees each stage's verdicts the same way
//! under every executor. The stage loops are monomorphised with and without
//! that call (`const OBS: bool`): with nothing armed, a batch pays the
//! pipeline's test of `tap` and the executor's choice of loop, nothing per
//! stage or packet.

use std::fmt;

use flowplane_nf::{NfContext, NfCounters};
use flowplane_packet::Batch;
use flowplane_table::FullPolicy;
use serde::{Serialize, Serializer};

use crate::chain::{Chain, Stage};
use crate::coarse::SharedStores;
use crate::error::EngineError;
use crate::graph::{take_graph, Arm, Graph};

mod context;
mod migrate;
pub mod repl;

pub use context::{sweep_period_ns, ExecContext, ExecStats, Scratch};

/// Declares the executor modules and lists their registry entries, in order.
macro_rules! executors {
    ($($name:ident),+ $(,)?) => {
        $(mod $name;)+
        /// Every executor, by name; the first is the default.
        pub static EXECUTORS: &[ExecutorInfo] = &[$($name::INFO),+];
    };
}

// The registry: one file per executor in this directory, named here.
executors!(batch, rtc, pernf, microbatch, interleaved);

/// One executor: runs the chain over a batch whose packets are parsed
/// (`cx.scratch.metas[..batch.len()]`), leaving verdicts in the batch and
/// state in the context's stores.
pub trait Executor: Send {
    /// Processes one batch.
    fn run(&mut self, cx: &mut ExecContext, batch: &mut Batch, ctx: &NfContext);
}

/// Where an executor keeps the 5-tuple NFs' state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateLayout {
    /// One block per flow holding every 5-tuple NF's state (FAJITA ①) and
    /// the auxiliary table's coarse handles.
    Aggregated,
    /// One table per 5-tuple NF, each with its own lookup (VPP).
    PerNf,
}

/// A registered executor.
pub struct ExecutorInfo {
    /// Name for `--exec`.
    pub name: &'static str,
    /// One line for help texts.
    pub about: &'static str,
    /// Its state layout.
    pub layout: StateLayout,
    /// Its numeric parameter (`name:N`), if it takes one.
    pub param: Option<ExecParam>,
    /// Creates one core's executor for a built context (the parameter is
    /// `cx.cfg.kind.param()`).
    pub new: fn(&ExecContext) -> Box<dyn Executor>,
}

/// An executor's numeric parameter, written `name:N` after its name.
#[derive(Clone, Copy, Debug)]
pub struct ExecParam {
    /// What it is (for help texts).
    pub what: &'static str,
    /// Value when only the name is given.
    pub default: u16,
    /// Smallest value.
    pub min: u16,
    /// Largest value.
    pub max: u16,
}

/// Which executor: a handle on a registry entry, with its parameter (0 for
/// executors without one).
#[derive(Clone, Copy)]
pub struct ExecKind(&'static ExecutorInfo, u16);

impl ExecKind {
    /// FAJITA's batched executor (the default).
    pub const BATCH: ExecKind = ExecKind(&batch::INFO, 0);

    /// The executor named `s`, with its parameter as `name:N` (`interleaved:8`).
    pub fn parse(s: &str) -> Result<ExecKind, EngineError> {
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let info = EXECUTORS.iter().find(|e| e.name == name).ok_or_else(|| EngineError::UnknownExecutor {
            name: s.to_string(),
            known: EXECUTORS
                .iter()
                .map(|e| if e.param.is_some() { format!("{}[:N]", e.name) } else { e.name.to_string() })
                .collect::<Vec<_>>()
                .join(", "),
        })?;
        let bad = |why: String| EngineError::Unsupported(format!("executor '{s}': {why}"));
        let v = match (info.param, arg) {
            (None, None) => 0,
            (None, Some(_)) => return Err(bad("takes no parameter".into())),
            (Some(p), None) => p.default,
            (Some(p), Some(a)) => match a.parse::<u16>() {
                Ok(v) if (p.min..=p.max).contains(&v) => v,
                _ => return Err(bad(format!("{} must be an integer in {}..={}", p.what, p.min, p.max))),
            },
        };
        Ok(ExecKind(info, v))
    }

    /// Every registered executor (with its default parameter).
    pub fn all() -> impl Iterator<Item = ExecKind> {
        EXECUTORS.iter().map(|e| ExecKind(e, e.param.map_or(0, |p| p.default)))
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// Its parameter (0 for executors without one).
    pub fn param(self) -> u16 {
        self.1
    }

    /// Its registry entry.
    pub fn info(self) -> &'static ExecutorInfo {
        self.0
    }
}

impl PartialEq for ExecKind {
    fn eq(&self, o: &Self) -> bool {
        self.0.name == o.0.name && self.1 == o.1
    }
}

impl Eq for ExecKind {}

impl fmt::Display for ExecKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.param {
            Some(_) => write!(f, "{}:{}", self.0.name, self.1),
            None => f.write_str(self.0.name),
        }
    }
}

impl fmt::Debug for ExecKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for ExecKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Executor and state-store settings.
#[derive(Clone, Copy, Debug)]
pub struct ExecConfig {
    /// Which executor.
    pub kind: ExecKind,
    /// Software prefetch (bulk lookups, block lines, NF hooks). Off: the
    /// batch executor looks up key by key and skips every prefetch.
    pub prefetch: bool,
    /// Flows per core (IPv4 table; IPv6 gets a quarter).
    pub flows: usize,
    /// Idle timeout when no NF declares one.
    pub default_idle_timeout_ns: u64,
    /// Full-table policy.
    pub full_policy: FullPolicy,
    /// Hugepage-backed tables.
    pub hugepages: bool,
    /// Run the NFs' prefetch hooks (indirect state) ahead of their actions.
    pub prefetch_hooks: bool,
    /// FAJITA's auxiliary table: keep pinned handles to coarse (shared) state
    /// in each flow's aggregated block instead of a shared lookup per packet.
    pub aux: bool,
    /// Data packing (GuNFu): the 5-tuple NFs' states packed smallest first
    /// in the flow's block. Off (`--no-packing`): each NF's state 64 bytes
    /// after the previous one's, in chain order (see `Chain::lay_out_flow_block`).
    pub packing: bool,
    /// Redundant-match removal (GuNFu; FAJITA's aggregated state): one flow
    /// match serves every 5-tuple NF of the chain. Off (`--no-match-sharing`):
    /// one match per NF — `batch` then runs as `pernf` (the same batch-wide
    /// staging with per-NF tables); executors without a per-NF form refuse it.
    pub match_sharing: bool,
    /// The flow tables' hash secret, one per run and the same on every core (hand-overs, SCR replicas and
    /// imports place a key alike): drawn at random ([`random_hash_seed`]) so no one can compute keys that
    /// collide into one bucket offline; `--hash-seed N` fixes it for reproducible runs. Verdicts, counters
    /// and exports do not depend on it while the tables have room; when a table fills, which flows find no
    /// room (displacement paths) and which entry `--table-full evict` picks do.
    pub hash_seed: u32,
    /// Let the chain compiler store small aggregated blocks inline in the flow table
    /// ([`flowplane_table::Layout::fit`]: one random line per lookup in the common case). Off: every table uses
    /// the bucketed layout (bucket line, then entry), for measuring what the inline layout gains.
    pub inline_entries: bool,
}

/// A fresh flow-table hash secret from the OS's random source (falling back to the clock and the process
/// id where that fails: unpredictable enough for bucket placement, which is not a cryptographic use).
pub fn random_hash_seed() -> u32 {
    getrandom::u32().unwrap_or_else(|_| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let x = (t as u64 ^ (t >> 64) as u64 ^ u64::from(std::process::id()).rotate_left(32))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (x >> 32) as u32
    })
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            kind: ExecKind::BATCH,
            prefetch: true,
            flows: 1 << 20,
            default_idle_timeout_ns: 30_000_000_000,
            full_policy: FullPolicy::Reject,
            hugepages: true,
            prefetch_hooks: true,
            aux: true,
            packing: true,
            match_sharing: true,
            hash_seed: random_hash_seed(),
            inline_entries: true,
        }
    }
}

/// Table figures for the report.
///
/// Conservation, per core and summed over cores: every entry a per-flow table took is still there, expired,
/// ended, evicted or handed to another core (`entries + expiries + ended + evictions + moved_out = insertions +
/// moved_in`; over a whole run every hand-over arrives, so `moved_in = moved_out` less the refused imports).
/// [`StoreReport::conserved`] checks it.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct StoreReport {
    /// Live flows at the end: the entries of the first per-flow table (under `pernf` every later NF's table
    /// holds a subset: the flows that reached it), or the shared 5-tuple table's keys when the strategy keeps
    /// per-flow state there (`shared`: each core's table then holds handles on it).
    pub flows: u64,
    /// Entries in the per-core per-flow tables at the end (one table per 5-tuple NF under `pernf`).
    pub entries: u64,
    /// IPv4 entries the per-core tables hold (`--flows` per table): an IPv4
    /// flow past it is refused (`table_full`).
    pub capacity: u64,
    /// IPv6 entries they hold besides (each store has an IPv6 table of its own).
    pub capacity_v6: u64,
    /// Insertions (add-on-miss, and an idle entry found by a lookup and started over), not hand-overs.
    pub insertions: u64,
    /// Expired entries (swept, or found idle past their timeout by a lookup).
    pub expiries: u64,
    /// Entries removed because an NF ended their flow (FIN/RST, ...): one per per-flow table under `pernf`.
    pub ended: u64,
    /// Flows an NF refused on their first packet (nat's pool exhausted, a filtered or unmapped packet): their
    /// entry was removed as never inserted, so neither `insertions` nor `ended` counts it.
    pub refused: u64,
    /// Entries handed over to another core (`rsspp`, `dyssect` moves).
    pub moved_out: u64,
    /// Entries taken over from another core.
    pub moved_in: u64,
    /// `flows` counts a table every core shares (keep one reading when merging).
    #[serde(skip)]
    pub flows_shared: bool,
    /// Inserts refused because the table was full.
    pub table_full: u64,
    /// Entries evicted to make room.
    pub evictions: u64,
    /// Packets without a flow key (non-IP, malformed).
    pub unparsed: u64,
    /// Lookups in the shared (coarse) tables.
    pub shared_lookups: u64,
    /// Packets without a 5-tuple entry (table full) that reached coarse
    /// state by a direct shared lookup instead of skipping it.
    pub aux_fallbacks: u64,
    /// Keys in the shared (coarse) tables at the end (the run's tables, not per core).
    pub shared_keys: u64,
    /// Capacity of the shared tables.
    pub shared_capacity: u64,
    /// Shared-table insertions refused because a table was full.
    pub shared_table_full: u64,
    /// NF states found idle past their NF's own timeout by their stamp
    /// inside a live entry (an aggregated block with a longer timeout, a
    /// coarse entry) and reset in place: not table events (the entry stays).
    pub state_resets: u64,
    /// IPv4 fragments judged by the per-core fragment table ([`crate::frag`]): later fragments that
    /// followed their first fragment's flow, orphans, and those dropped (overlaps, too many).
    pub fragments: crate::frag::FragStats,
    /// Attribution (issue 33 item 4): the IPv4 sources with the most packets that found the flow table full.
    pub table_full_sources: TopSources,
}

/// Sources listed in [`StoreReport::table_full_sources`].
pub const TOP_SOURCES: usize = 10;

/// The IPv4 sources with the most events, most first (count 0: an empty place): a core's Space-Saving summary
/// (`flowplane_nf::topk`, counts an upper bound), summed by address over cores. Plain data, so the table figures
/// stay `Copy`; serialised as `[{"src": "a.b.c.d", "packets": n}, ...]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TopSources(pub [(u32, u64); TOP_SOURCES]);

impl TopSources {
    /// The first [`TOP_SOURCES`] of `pairs` by count (ties: lower address first); no allocation.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (u32, u64)>) -> Self {
        let mut t = TopSources::default();
        for (a, n) in pairs {
            t.offer(a, n);
        }
        t
    }

    /// Inserts `(a, n)` in order if it ranks among the first [`TOP_SOURCES`].
    fn offer(&mut self, a: u32, n: u64) {
        if n == 0 {
            return;
        }
        if let Some(p) = self.0.iter().position(|&(b, m)| m == 0 || n > m || (n == m && a < b)) {
            self.0.copy_within(p..TOP_SOURCES - 1, p + 1);
            self.0[p] = (a, n);
        }
    }

    /// The listed (source, count) pairs, most first.
    pub fn pairs(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.0.iter().copied().filter(|p| p.1 > 0)
    }

    /// Adds another core's list (summed by address).
    pub fn merge(&mut self, o: &TopSources) {
        let mut acc = [(0u32, 0u64); 2 * TOP_SOURCES];
        let mut len = 0;
        for (a, n) in self.pairs().chain(o.pairs()) {
            match acc[..len].iter_mut().find(|x| x.0 == a) {
                Some(x) => x.1 += n,
                None => {
                    acc[len] = (a, n);
                    len += 1;
                }
            }
        }
        *self = TopSources::from_pairs(acc[..len].iter().copied());
    }
}

impl Serialize for TopSources {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let rows: Vec<serde_json::Value> = self
            .pairs()
            .map(|(a, n)| serde_json::json!({ "src": std::net::Ipv4Addr::from(a).to_string(), "packets": n }))
            .collect();
        rows.serialize(s)
    }
}

impl StoreReport {
    /// The tables' counters add up (see the type's doc).
    pub fn conserved(&self) -> bool {
        self.entries + self.expiries + self.ended + self.evictions + self.moved_out == self.insertions + self.moved_in
    }

    /// Adds another core's figures.
    pub fn merge(&mut self, o: &StoreReport) {
        if o.flows_shared {
            self.flows = self.flows.max(o.flows);
            self.flows_shared = true;
        } else {
            self.flows += o.flows;
        }
        self.entries += o.entries;
        self.capacity += o.capacity;
        self.capacity_v6 += o.capacity_v6;
        self.insertions += o.insertions;
        self.refused += o.refused;
        self.expiries += o.expiries;
        self.ended += o.ended;
        self.moved_out += o.moved_out;
        self.moved_in += o.moved_in;
        self.table_full += o.table_full;
        self.evictions += o.evictions;
        self.unparsed += o.unparsed;
        self.shared_lookups += o.shared_lookups;
        self.aux_fallbacks += o.aux_fallbacks;
        self.state_resets += o.state_resets;
        self.fragments.merge(&o.fragments);
        self.table_full_sources.merge(&o.table_full_sources);
        // The shared tables are the same for every core: keep one reading.
        self.shared_keys = self.shared_keys.max(o.shared_keys);
        self.shared_capacity = self.shared_capacity.max(o.shared_capacity);
        self.shared_table_full = self.shared_table_full.max(o.shared_table_full);
    }
}

/// One core's chain with its state and executor: what a worker calls per batch.
///
/// A chain graph's pipeline is its root segment's, with the branch point in
/// `graph` (each branch a pipeline of its own, see [`crate::graph`]); for a
/// linear chain `graph` is `None` and nothing else differs. Results, exports,
/// hand-overs and parameter changes cover every segment; NF indices are the
/// spec's flat order ([`crate::spec::ChainSpec::nfs`]).
pub struct Pipeline {
    kind: ExecKind,
    cx: ExecContext,
    exec: Box<dyn Executor>,
    graph: Option<Box<Graph>>,
    /// Two sub-batches for running a traced batch cut (`run_chunked`; made at the first one).
    cuts: Vec<Box<Batch>>,
    /// An element of the root segment keeps packets to send later (`Nf::holds_packets`).
    holds: bool,
}

impl Pipeline {
    /// Builds the context (allocating the per-core tables) and the executor;
    /// `shared` holds the coarse groups' tables (create them once per run with
    /// [`SharedStores::new`] from `chain.groups`; an empty one is fine for
    /// chains without coarse NFs).
    pub fn new(mut chain: Chain, mut cfg: ExecConfig, shared: SharedStores) -> Result<Self, EngineError> {
        let (port, branches) = take_graph(&mut chain);
        let graph = if port.is_none() && branches.is_empty() {
            None
        } else {
            Some(Box::new(Graph::new(port, branches, cfg, &shared.branches, chain.stages.len())?))
        };
        if !cfg.match_sharing && cfg.kind.info().layout == StateLayout::Aggregated {
            if cfg.kind != ExecKind::BATCH {
                return Err(EngineError::Unsupported(format!(
                    "--no-match-sharing: the {} executor has no per-NF matching (use batch or pernf)",
                    cfg.kind.name()
                )));
            }
            cfg.kind = ExecKind::parse("pernf")?;
        }
        if !cfg.packing {
            chain.lay_out_flow_block(false);
        }
        let info = cfg.kind.info();
        let cx = ExecContext::new(chain, cfg, shared, info.layout)?;
        let exec = (info.new)(&cx);
        let holds = cx.chain.stages.iter().any(|s| matches!(s, Stage::Stateless(nf) if nf.holds_packets()));
        Ok(Pipeline { kind: cfg.kind, cx, exec, graph, cuts: Vec::new(), holds })
    }

    /// The executor.
    pub fn kind(&self) -> ExecKind {
        self.kind
    }

    /// Processes one batch through the whole chain (a graph's branches too).
    pub fn process(&mut self, batch: &mut Batch, ctx: &NfContext) {
        self.process_segment(batch, ctx);
        if let Some(g) = &mut self.graph {
            g.run(batch, ctx, &mut self.cx.tap);
        }
        if let Some(t) = self.cx.tap.as_deref_mut() {
            t.finish(batch);
        }
    }

    #[inline(always)]
    fn process_segment(&mut self, batch: &mut Batch, ctx: &NfContext) {
        if self.cx.tap.is_some() {
            return self.process_observed(batch, ctx);
        }
        if !self.cx.chain.is_stateful() {
            let n = batch.len();
            for s in self.cx.chain.stages.iter_mut() {
                if let Stage::Stateless(nf) = s {
                    nf.process(batch, 0..n, ctx);
                }
            }
            return;
        }
        self.cx.parse(batch);
        self.cx.begin_batch(ctx.now_ns);
        let full = self.cx.table_full_events();
        self.exec.run(&mut self.cx, batch, ctx);
        if self.cx.table_full_events() != full {
            self.cx.attribute_table_full(batch);
        }
        self.cx.expire(ctx.now_ns);
    }

    /// [`Pipeline::process_segment`] with a trace, capture or profile armed (`crate::tap`): the batch is
    /// parsed for the trace's filter (the root segment's batch only: a branch's packets were taken at the
    /// root) and every stage's verdicts are observed; a batch holding traced packets runs cut so each
    /// NF's state is read before and after each traced packet alone.
    #[cold]
    fn process_observed(&mut self, batch: &mut Batch, ctx: &NfContext) {
        self.cx.parse(batch);
        let mut cut = false;
        if let Some(t) = self.cx.tap.as_deref_mut() {
            if t.depth() == 0 {
                t.begin(batch, &self.cx.scratch.metas[..]);
            }
            cut = t.tracing() && t.any_traced();
        }
        if !self.cx.chain.is_stateful() {
            let n = batch.len();
            for si in 0..self.cx.chain.stages.len() {
                if let Stage::Stateless(nf) = &mut self.cx.chain.stages[si] {
                    nf.process(batch, 0..n, ctx);
                }
                self.cx.observe(si, batch, 0..n);
            }
            return;
        }
        self.cx.begin_batch(ctx.now_ns);
        if cut {
            self.run_chunked(batch, ctx);
        } else {
            self.exec.run(&mut self.cx, batch, ctx);
        }
        self.cx.expire(ctx.now_ns);
    }

    /// Runs a batch holding traced packets as consecutive sub-batches, each traced packet alone in its
    /// own, reading every stage's state for its flow before its sub-batch (before the flow lookup) and
    /// after each stage (`ExecContext::observe`): the states are that packet's whatever the executor
    /// (see [`crate::tap`]). Every executor gives the result of packet-by-packet processing, so the cut
    /// changes no verdict and no state.
    #[cold]
    fn run_chunked(&mut self, batch: &mut Batch, ctx: &NfContext) {
        let n = batch.len();
        if self.cuts.len() != 2 || !self.cuts[0].same_memory(batch) {
            // Once per worker (its pool never changes): the two sub-batches.
            self.cuts = vec![batch.sibling(), batch.sibling()];
        }
        let mut lanes = [0u8; flowplane_packet::MAX_BATCH];
        let mut parts = std::mem::take(&mut self.cuts);
        let mut start = 0;
        while start < n {
            let traced = |cx: &ExecContext, i: usize| cx.tap.as_deref().is_some_and(|t| t.is_traced(i));
            let alone = traced(&self.cx, start);
            let end = if alone { start + 1 } else { (start..n).find(|&i| traced(&self.cx, i)).unwrap_or(n) };
            lanes[..n].fill(0);
            lanes[start..end].fill(1);
            if batch.split_into(&lanes[..n], &mut parts).is_err() {
                // Cannot happen (the parts are this batch's siblings, empty): run the rest whole.
                self.exec.run(&mut self.cx, batch, ctx);
                break;
            }
            let part = &mut parts[1];
            self.cx.parse(part);
            let mut tap = self.cx.tap.take();
            let entered = tap.as_deref_mut().is_some_and(|t| t.enter(0, 0, 1, &lanes[..n], part));
            if let (true, true, Some(t)) = (entered, alone, tap.as_deref_mut()) {
                let meta = self.cx.scratch.metas[0];
                for si in 0..self.cx.chain.stages.len() {
                    if let Some(mut slot) = t.state_slot(0, si, false) {
                        let had = self.cx.copy_state(si, &meta, slot.buf());
                        slot.set(had);
                    }
                }
            }
            if entered {
                self.cx.tap = tap.take();
            }
            self.exec.run(&mut self.cx, part, ctx);
            if entered {
                tap = self.cx.tap.take();
                if let Some(t) = tap.as_deref_mut() {
                    t.leave();
                }
            }
            self.cx.tap = tap;
            let joined = batch.join_from(&lanes[..n], &mut parts);
            // Executors never add or remove packets, so the parts still match their lanes.
            debug_assert!(joined.is_ok());
            start = end;
        }
        self.cuts = parts;
    }

    /// What this pipeline's tap is sized for: every stage's state size (flat order) and the frames.
    fn tap_shape(&self) -> crate::tap::TapShape {
        let state_sizes = self.stages().iter().map(|(_, s)| s.state_size()).collect();
        // Per graph level: the segment's frame and its cut's.
        crate::tap::TapShape { state_sizes, frames: 2 * (self.graph_depth() + 1) + 1 }
    }

    /// Branch points on the longest path through the graph (0: a linear chain).
    fn graph_depth(&self) -> usize {
        self.arms().iter().map(|a| 1 + a.pipe.graph_depth()).max().unwrap_or(0)
    }

    /// Segments of the graph (this one and its branches', depth first).
    pub(crate) fn segment_count(&self) -> usize {
        1 + self.arms().iter().map(|a| a.pipe.segment_count()).sum::<usize>()
    }

    /// Each segment's path (the root's is empty) and, per stage in flat order, its segment.
    fn segment_paths(&self, prefix: &str, paths: &mut Vec<String>, seg_of: &mut Vec<usize>) {
        let me = paths.len();
        paths.push(prefix.to_string());
        seg_of.extend((0..self.cx.chain.stages.len()).map(|_| me));
        for a in self.arms() {
            let p = if prefix.is_empty() { a.label.clone() } else { format!("{prefix}/{}", a.label) };
            a.pipe.segment_paths(&p, paths, seg_of);
        }
    }

    /// Takes the tap out (a branch point hands it to a branch's pipeline).
    pub(crate) fn take_tap(&mut self) -> Option<Box<crate::tap::Tap>> {
        self.cx.tap.take()
    }

    /// Puts a tap in (see [`Pipeline::take_tap`]).
    pub(crate) fn put_tap(&mut self, tap: Option<Box<crate::tap::Tap>>) {
        self.cx.tap = tap;
    }

    /// Under `--scale scr`: the chain (the replica runs its NFs) and the armed tap, if any.
    pub fn scr_parts(&mut self) -> (&mut Chain, Option<&mut crate::tap::Tap>) {
        (&mut self.cx.chain, self.cx.tap.as_deref_mut())
    }

    /// Arms (`Some`) or disarms a trace on this core: every stage, a graph's branches too.
    pub fn arm_trace(&mut self, worker: usize, arm: Option<&crate::tap::TraceArm>) {
        let shape = self.tap_shape();
        self.cx.tap = crate::tap::Tap::arm_trace(self.cx.tap.take(), worker, arm, &shape);
    }

    /// Arms (`Some`) or disarms a capture on this core (`at`: a stage in flat order, a branch's too).
    pub fn arm_capture(&mut self, worker: usize, arm: Option<&crate::tap::CaptureArm>) {
        let shape = self.tap_shape();
        self.cx.tap = crate::tap::Tap::arm_capture(self.cx.tap.take(), worker, arm, &shape);
    }

    /// Starts (from zero) or stops the per-NF profile of this core (every stage, flat order).
    pub fn arm_profile(&mut self, on: bool) {
        let shape = self.tap_shape();
        self.cx.tap = crate::tap::Tap::arm_profile(self.cx.tap.take(), on, &shape);
    }

    /// The per-NF profile so far (every stage, flat order), if one is running.
    pub fn profile(&self) -> Option<Vec<crate::tap::StageCost>> {
        crate::tap::Tap::profile(self.cx.tap.as_deref())
    }

    /// The packets traced on this core so far: per stage its verdict and its state for the packet's flow
    /// as `show flow` shows it; a graph's stages of branches the packet did not take marked
    /// [`crate::tap::NOT_TAKEN`], and the branch it took named.
    pub fn trace_records(&self) -> Vec<crate::tap::TraceRecord> {
        let stages = self.stages();
        let render = |si: usize, key: &flowplane_wire::flow::FiveTuple, b: &[u8]| {
            stages.get(si).and_then(|(_, s)| context::render_state(s, key, b))
        };
        let mut recs = crate::tap::Tap::records(self.cx.tap.as_deref(), &render);
        if self.graph.is_some() {
            let (mut paths, mut seg_of) = (Vec::new(), Vec::new());
            self.segment_paths("", &mut paths, &mut seg_of);
            for r in &mut recs {
                for (si, v) in r.stages.iter_mut().enumerate() {
                    if seg_of.get(si).is_some_and(|&k| k >= 64 || r.segments & (1 << k) == 0) {
                        *v = crate::tap::NOT_TAKEN;
                        if let Some(s) = r.state.get_mut(si) {
                            *s = None;
                        }
                    }
                }
                // Segments are numbered depth first: the deepest one entered is the last on the path.
                let last = 63 - r.segments.max(1).leading_zeros() as usize;
                r.branch = paths.get(last).cloned().unwrap_or_default();
            }
        }
        recs
    }

    /// Stages of the whole graph in flat order (what a trace and `capture --at` see).
    pub fn stage_total(&self) -> usize {
        self.stage_count()
    }

    /// The core's source is exhausted: its clocks (a graph's branches' too)
    /// no longer hold shared state's watermark.
    pub fn clock_done(&mut self) {
        self.cx.clock_done();
        if let Some(g) = &mut self.graph {
            for a in &mut g.arms {
                a.pipe.clock_done();
            }
        }
    }

    /// The run's latest packet time across cores (None: no packet).
    pub(crate) fn run_end(&self) -> Option<u64> {
        self.cx.run_end()
    }

    /// End of the run, once every core stopped: each stateful NF (a graph's
    /// branches' too) is told the run's last packet time across cores, which
    /// its report and export then judge idleness at
    /// ([`flowplane_nf::StatefulNf::end_of_run`]). Returns that time.
    pub fn end_of_run(&mut self) -> Option<u64> {
        let end = self.cx.run_end();
        if let Some(t) = end {
            self.end_at(t);
        }
        end
    }

    /// Hands every NF of the chain (a graph's branches' too) that feeds
    /// IPFIX its own record queue (`make`), and turns on the active-timeout
    /// walk when `active_ns` is set. Returns how many NFs export.
    pub fn attach_ipfix(
        &mut self,
        make: &mut dyn FnMut() -> flowplane_nf::ipfix::RecordTx,
        active_ns: Option<u64>,
    ) -> usize {
        let mut n = 0;
        let mut flows = 0;
        for s in self.cx.chain.stages.iter_mut() {
            match s {
                Stage::Stateful { nf, .. } if nf.ipfix_on() => {
                    nf.attach_ipfix(make());
                    flows += 1;
                }
                // A batch element keeps its own active timer (per call, on the batch's time).
                Stage::Stateless(nf) if nf.ipfix_usage_on() => {
                    nf.attach_ipfix(make(), active_ns);
                    n += 1;
                }
                _ => {}
            }
        }
        // The table walk only for NFs whose records come from flow entries.
        if let (Some(a), true) = (active_ns, flows > 0) {
            self.cx.set_active_timeout(a);
        }
        n += flows;
        if let Some(g) = &mut self.graph {
            for a in &mut g.arms {
                n += a.pipe.attach_ipfix(make, active_ns);
            }
        }
        n
    }

    /// A record of every live flow for the exporter (the run's end: forced
    /// end) and batch elements' last usage records; `include_shared`: also
    /// the shared tables' flows (on one core only).
    pub fn ipfix_flush(&mut self, include_shared: bool) {
        self.cx.ipfix_report_all(flowplane_nf::ipfix::EndReason::ForcedEnd, include_shared);
        // Batch elements' records of what they counted since their last (upf's usage), at the run's end.
        let end = self.run_end().unwrap_or(0);
        for s in self.cx.chain.stages.iter_mut() {
            if let Stage::Stateless(nf) = s {
                if nf.ipfix_usage_on() {
                    nf.ipfix_end(end);
                }
            }
        }
        if let Some(g) = &mut self.graph {
            for a in &mut g.arms {
                a.pipe.ipfix_flush(include_shared);
            }
        }
    }

    fn end_at(&mut self, end_ns: u64) {
        for s in self.cx.chain.stages.iter_mut() {
            if let Stage::Stateful { nf, .. } = s {
                nf.end_of_run(end_ns);
            }
        }
        if let Some(g) = &mut self.graph {
            for a in &mut g.arms {
                a.pipe.end_at(end_ns);
            }
        }
    }

    /// A batch time without packets for this segment (a branch that got none):
    /// expiry and the shared tables' clock advance as after a batch; its branches likewise.
    pub(crate) fn idle(&mut self, now_ns: u64) {
        if self.cx.chain.is_stateful() {
            self.cx.expire(now_ns);
        }
        if let Some(g) = &mut self.graph {
            for a in &mut g.arms {
                a.pipe.idle(now_ns);
            }
        }
    }

    /// A timer tick on an idle worker (see [`flowplane_io::Source::clock_ns`]): the
    /// packet clock moves to `now_ns` without a packet, so expiry sweeps, the shared
    /// tables' clock and every NF's private timers advance as after a batch at that
    /// time; its branches likewise.
    pub fn tick(&mut self, now_ns: u64) {
        for s in self.cx.chain.stages.iter_mut() {
            match s {
                Stage::Stateless(nf) => nf.tick(now_ns),
                Stage::Stateful { nf, .. } => nf.tick(now_ns),
            }
        }
        if self.cx.chain.is_stateful() {
            self.cx.expire(now_ns);
        }
        if let Some(g) = &mut self.graph {
            for a in &mut g.arms {
                a.pipe.tick(now_ns);
            }
        }
    }

    /// An element keeps packets to send later: the worker calls
    /// [`Pipeline::release`] after every batch and when idle (elements of the
    /// root segment only; a branch's elements are not asked).
    pub fn holds_packets(&self) -> bool {
        self.holds
    }

    /// Appends to `out` the packets the elements send now (see
    /// `flowplane_nf::Nf::release`), in chain order.
    pub fn release(&mut self, pool: &mut flowplane_packet::PacketPool, out: &mut Batch, ctx: &NfContext) {
        for s in self.cx.chain.stages.iter_mut() {
            if let Stage::Stateless(nf) = s {
                nf.release(pool, out, ctx);
            }
        }
    }

    /// The branches (a linear chain's pipeline has none).
    fn arms(&self) -> &[Arm] {
        self.graph.as_deref().map_or(&[], |g| &g.arms)
    }

    /// Per-NF results: (name, counters, details); a graph's branch NFs named by
    /// their path (`deny/count`), in the spec's flat order.
    pub fn nf_results(&self) -> Vec<(String, NfCounters, Option<serde_json::Value>)> {
        let mut out = self.cx.nf_results();
        for a in self.arms() {
            out.extend(a.pipe.nf_results().into_iter().map(|(n, c, d)| (format!("{}/{n}", a.label), c, d)));
        }
        out
    }

    /// Every stage of the graph in the spec's flat order, each named by its
    /// path (`deny/count`; the root's NFs by name).
    pub fn stages(&self) -> Vec<(String, &Stage)> {
        let mut out: Vec<(String, &Stage)> = self.cx.chain.stages.iter().map(|s| (s.name().to_string(), s)).collect();
        for a in self.arms() {
            out.extend(a.pipe.stages().into_iter().map(|(n, s)| (format!("{}/{n}", a.label), s)));
        }
        out
    }

    /// Stage `i` of [`Pipeline::stages`], mutable (a run-time parameter change).
    pub fn stage_mut(&mut self, mut i: usize) -> Option<&mut Stage> {
        let here = self.cx.chain.stages.len();
        if i < here {
            return self.cx.chain.stages.get_mut(i);
        }
        i -= here;
        for a in self.graph.as_deref_mut().map_or(&mut [][..], |g| &mut g.arms[..]) {
            let n = a.pipe.stage_count();
            if i < n {
                return a.pipe.stage_mut(i);
            }
            i -= n;
        }
        None
    }

    fn stage_count(&self) -> usize {
        self.cx.chain.stages.len() + self.arms().iter().map(|a| a.pipe.stage_count()).sum::<usize>()
    }

    /// The flat index of the NF `name` names: its path (`deny/count`; a root
    /// NF's path is its name), or a name only one NF of the graph has.
    pub fn stage_index(&self, name: &str) -> Option<usize> {
        let st = self.stages();
        if let Some(i) = st.iter().position(|(p, _)| p == name) {
            return Some(i);
        }
        let mut by_name = st.iter().enumerate().filter(|(_, (_, s))| s.name() == name).map(|(i, _)| i);
        match (by_name.next(), by_name.next()) {
            (Some(i), None) => Some(i),
            _ => None,
        }
    }

    /// The segment pipeline holding flat stage `i`, and `i` within it.
    fn segment_of(&self, mut i: usize) -> Option<(&Pipeline, usize)> {
        let here = self.cx.chain.stages.len();
        if i < here {
            return Some((self, i));
        }
        i -= here;
        for a in self.arms() {
            let n = a.pipe.stage_count();
            if i < n {
                return a.pipe.segment_of(i);
            }
            i -= n;
        }
        None
    }

    /// Export rows of flat stage `i` (see [`Pipeline::export`]).
    pub fn export_at(
        &self,
        i: usize,
        include_shared: bool,
        resolve: &dyn Fn(u128) -> Option<flowplane_wire::flow::FiveTuple>,
    ) -> Option<Vec<serde_json::Value>> {
        let (p, k) = self.segment_of(i)?;
        // Rows of the k-th stage: the context finds an NF by name, so count same-named NFs before it.
        let name = p.cx.chain.stages[k].name();
        if p.cx.chain.stages[..k].iter().any(|s| s.name() == name) {
            return None;
        }
        p.cx.export_resolving(name, include_shared, resolve)
    }

    /// Backs every per-core table's memory now, before the traffic starts:
    /// tables are allocated lazily by the kernel, and a paced or live run's
    /// first packets would otherwise pay a page fault per new page touched
    /// (measured: 20-100 ms of stall with the default 1M-flow table on this
    /// VM, enough to overflow a 16K-packet receive ring at 0.5 Mpps).
    pub fn prefault(&mut self) {
        for s in &mut self.cx.stores {
            s.prefault();
        }
        if let Some(g) = &mut self.graph {
            for a in &mut g.arms {
                a.pipe.prefault();
            }
        }
    }

    /// The compiled chain, mutable (SCR runs its NFs on its own replicas).
    pub fn chain_mut(&mut self) -> &mut Chain {
        &mut self.cx.chain
    }

    /// The compiled chain (its stages' merge and export hooks).
    pub fn chain(&self) -> &Chain {
        &self.cx.chain
    }

    /// Table figures (a graph's: every segment's tables summed; `flows`
    /// the most any one segment holds, a flow having an entry in each
    /// stateful segment it reached).
    pub fn store_report(&self) -> StoreReport {
        let mut r = self.cx.store_report();
        for a in self.arms() {
            let b = a.pipe.store_report();
            let flows = r.flows.max(b.flows);
            let keys = r.shared_keys + b.shared_keys;
            let cap = r.shared_capacity + b.shared_capacity;
            let full = r.shared_table_full + b.shared_table_full;
            r.merge(&b);
            r.flows = flows;
            r.shared_keys = keys;
            r.shared_capacity = cap;
            r.shared_table_full = full;
        }
        r
    }

    /// Moves the per-flow entries whose key `pick` selects out of this
    /// core's stores into `out` (state hand-over between cores, see
    /// `exec/migrate.rs`); returns how many.
    pub fn export_flows(
        &mut self,
        pick: &dyn Fn(&flowplane_wire::flow::FiveTuple) -> bool,
        out: &mut Vec<u8>,
    ) -> usize {
        if self.graph.is_none() {
            return migrate::export_flows(&mut self.cx, pick, out);
        }
        let mut outs = [std::mem::take(out)];
        let n = self.export_framed(&|k| pick(k).then_some(0), &mut outs);
        let [o] = outs;
        *out = o;
        n
    }

    /// [`Pipeline::export_flows`] for several hand-overs in one pass: an entry
    /// goes to `outs[i]` when `which` says `Some(i)`.
    pub fn export_flows_by(
        &mut self,
        which: &dyn Fn(&flowplane_wire::flow::FiveTuple) -> Option<usize>,
        outs: &mut [Vec<u8>],
    ) -> usize {
        if self.graph.is_none() {
            return migrate::export_flows_by(&mut self.cx, which, outs);
        }
        self.export_framed(which, outs)
    }

    /// A graph's hand-over: one section per segment, depth first (`len u32`, then the segment's entries).
    fn export_framed(
        &mut self,
        which: &dyn Fn(&flowplane_wire::flow::FiveTuple) -> Option<usize>,
        outs: &mut [Vec<u8>],
    ) -> usize {
        let starts: Vec<usize> = outs.iter_mut().map(section_open).collect();
        let mut n = migrate::export_flows_by(&mut self.cx, which, outs);
        for (o, &at) in outs.iter_mut().zip(&starts) {
            section_close(o, at);
        }
        if let Some(g) = &mut self.graph {
            for a in &mut g.arms {
                n += a.pipe.export_framed(which, outs);
            }
        }
        n
    }

    /// Imports entries another core's [`Pipeline::export_flows`] produced: (imported, refused).
    pub fn import_flows(&mut self, data: &[u8]) -> (usize, usize) {
        if self.graph.is_none() {
            return migrate::import_flows(&mut self.cx, data);
        }
        self.import_framed(data).0
    }

    /// [`Pipeline::import_flows`] of [`Pipeline::export_framed`]'s sections; returns what they left over.
    fn import_framed<'a>(&mut self, data: &'a [u8]) -> ((usize, usize), &'a [u8]) {
        let Some((mine, mut rest)) = section_read(data) else { return ((0, 0), &[]) };
        let (mut ok, mut refused) = migrate::import_flows(&mut self.cx, mine);
        if let Some(g) = &mut self.graph {
            for a in &mut g.arms {
                let ((o, r), left) = a.pipe.import_framed(rest);
                ok += o;
                refused += r;
                rest = left;
            }
        }
        ((ok, refused), rest)
    }

    /// Each stateful NF's state for flow `key` on this core (see [`ExecContext::flow_rows`]); a graph's
    /// branch NFs too, named by their path (`deny/fsc`).
    pub fn flow_rows(
        &self,
        key: &flowplane_wire::flow::FiveTuple,
        include_shared: bool,
    ) -> Vec<(String, serde_json::Value)> {
        let mut out = self.cx.flow_rows(key, include_shared);
        for a in self.arms() {
            out.extend(a.pipe.flow_rows(key, include_shared).into_iter().map(|(n, v)| (format!("{}/{n}", a.label), v)));
        }
        out
    }

    /// Export rows of NF `name`, if it exports state (see [`ExecContext::export`]).
    pub fn export(&self, name: &str, include_shared: bool) -> Option<Vec<serde_json::Value>> {
        self.export_resolving(name, include_shared, &|_| None)
    }

    /// Calls `f` with the key of every live flow: the entries of the first per-flow table (see
    /// [`StoreReport::flows`]).
    pub fn for_each_flow(&self, f: &mut dyn FnMut(&flowplane_wire::flow::FiveTuple)) {
        if let Some(s) = self.cx.stores.first() {
            s.for_each(|k, _| f(k));
        }
        for a in self.arms() {
            a.pipe.for_each_flow(f);
        }
    }

    /// [`Pipeline::export`], resolving coarse keys that do not carry their flow (see [`ExecContext::export_resolving`]).
    /// In a graph, `name` is an NF's path or a name only one NF has ([`Pipeline::stage_index`]).
    pub fn export_resolving(
        &self,
        name: &str,
        include_shared: bool,
        resolve: &dyn Fn(u128) -> Option<flowplane_wire::flow::FiveTuple>,
    ) -> Option<Vec<serde_json::Value>> {
        if self.graph.is_none() {
            return self.cx.export_resolving(name, include_shared, resolve);
        }
        self.export_at(self.stage_index(name)?, include_shared, resolve)
    }
}

/// Starts a hand-over section: a `u32` length patched by [`section_close`].
fn section_open(out: &mut Vec<u8>) -> usize {
    out.extend_from_slice(&[0; 4]);
    out.len()
}

fn section_close(out: &mut [u8], at: usize) {
    let len = (out.len() - at) as u32;
    out[at - 4..at].copy_from_slice(&len.to_le_bytes());
}

/// A section and what follows it (None: truncated).
fn section_read(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_le_bytes(data.get(..4)?.try_into().ok()?) as usize;
    let body = data.get(4..4 + len)?;
    Some((body, &data[4 + len..]))
}

#[cfg(test)]
mod top_sources_tests {
    use super::{TopSources, TOP_SOURCES};

    /// Two cores' lists sum by address and keep the first `TOP_SOURCES` by count (a model: a sorted map).
    #[test]
    fn merged_lists_sum_by_address_and_keep_the_heaviest() {
        let a = TopSources::from_pairs((1..=TOP_SOURCES as u32).map(|i| (i, u64::from(i) * 10)));
        let b = TopSources::from_pairs([(1, 1000), (50, 55), (2, 0)]);
        let mut m = a;
        m.merge(&b);
        let mut model: Vec<(u32, u64)> = (1..=TOP_SOURCES as u32).map(|i| (i, u64::from(i) * 10)).collect();
        model[0].1 += 1000;
        model.push((50, 55));
        model.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
        model.truncate(TOP_SOURCES);
        assert_eq!(m.pairs().collect::<Vec<_>>(), model);
        assert_eq!(serde_json::to_value(TopSources::from_pairs([(0x0a00_0001, 3)])).unwrap()[0]["src"], "10.0.0.1");
    }
}
