//! Why a dispatch stage could not be built.

use flowplane_wire::rss::RetaError;

/// A dispatch-stage problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScaleError {
    /// A queue count RSS cannot spread over.
    #[error("RSS needs 1..={max} queues, got {got}")]
    Queues {
        /// Queues asked for.
        got: usize,
        /// The most supported.
        max: usize,
    },
    /// An unknown or not yet available strategy.
    #[error("--scale {0}: unknown strategy (available: rss, shared, rsspp; scr and dyssect are not implemented yet)")]
    Strategy(String),
    /// The indirection table.
    #[error("RETA: {0}")]
    Reta(#[from] RetaError),
}
