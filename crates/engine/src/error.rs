//! The engine's error: everything that can stop a chain from being built or
//! a run from starting, typed, with the underlying error as its source. The
//! CLI prints it as one line and exits 2.

use flowplane_io::replay::ReplayError;
use flowplane_nf::ParamError;
use flowplane_packet::PoolError;
use flowplane_scale::ScaleError;
use flowplane_table::TableError;
use flowplane_trace::TraceError;

use crate::spec::SpecError;

/// Why a chain could not be built or a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The chain spec's syntax.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A chain file (TOML) that is not a chain.
    #[error("chain file: {0}")]
    ChainFile(String),
    /// An NF name or parameter.
    #[error(transparent)]
    Nf(#[from] ParamError),
    /// A stateful NF follows an element that changes which flow a packet belongs to.
    #[error("{nf} cannot follow {after} in a chain: {after} decapsulates or encapsulates packets, and stateful NFs are keyed on the packet as it arrived (put {nf} before {after}, or run it on {after}'s output)")]
    StatefulAfterRewrite {
        /// The stateful NF.
        nf: &'static str,
        /// The rewriting element before it.
        after: &'static str,
    },
    /// An NF's state cannot be laid out.
    #[error("{nf}: state alignment {align} exceeds {max} bytes")]
    StateAlign {
        /// The NF.
        nf: &'static str,
        /// Its state's alignment.
        align: usize,
        /// The most the layout supports.
        max: usize,
    },
    /// Too many NFs share one coarse granularity.
    #[error("{nf}: more than {max} NFs share the {granularity} state")]
    GroupMembers {
        /// The NF that went over.
        nf: &'static str,
        /// The granularity.
        granularity: &'static str,
        /// The limit.
        max: usize,
    },
    /// The NFs of one coarse granularity need more state than an entry holds.
    #[error("the {granularity} NFs of this chain need {bytes} bytes of shared state (max {max})")]
    GroupTooLarge {
        /// The granularity.
        granularity: &'static str,
        /// Bytes needed.
        bytes: usize,
        /// Bytes available.
        max: usize,
    },
    /// No executor of that name.
    #[error("unknown executor '{name}' (known: {known})")]
    UnknownExecutor {
        /// The name asked for.
        name: String,
        /// The registered executors.
        known: String,
    },
    /// A setting the chain or executor cannot run with.
    #[error("{0}")]
    Unsupported(String),
    /// A run setting out of range.
    #[error("{0}")]
    Config(String),
    /// A table could not be created.
    #[error("{what}: {source}")]
    Table {
        /// Which table.
        what: &'static str,
        /// Why.
        #[source]
        source: TableError,
    },
    /// A shared (coarse-state) table could not be created.
    #[error("shared table: {0}")]
    SharedTable(#[from] flowplane_table::shared::SharedConfigError),
    /// A packet pool could not be created.
    #[error("packet pool: {0}")]
    Pool(#[from] PoolError),
    /// The dispatch (emulated NIC) stage.
    #[error(transparent)]
    Scale(#[from] ScaleError),
    /// A trace file.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// Loading frames into the replay source.
    #[error("replay: {0}")]
    Replay(#[from] ReplayError),
    /// An `--export` naming an NF that is not in the chain.
    #[error("--export {0}: no NF '{0}' in the chain")]
    ExportNotInChain(String),
    /// An `--export` of an NF that has no state to export.
    #[error("--export {0}: {0} has no state to export (its figures are in the report)")]
    ExportRefused(String),
    /// The input holds nothing to replay.
    #[error("the input holds no packet to replay")]
    EmptyInput,
    /// A worker thread could not be started.
    #[error("cannot start worker thread: {0}")]
    Thread(#[source] std::io::Error),
    /// A worker thread panicked (a bug: reported, not propagated).
    #[error("a worker thread panicked")]
    WorkerPanicked,
}
