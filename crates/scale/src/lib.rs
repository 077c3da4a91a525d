//! `flowplane-scale`: how packets are spread over cores — the emulated NIC
//! stage. Today: RSS (Toeplitz hash + indirection table), as a NIC's receive
//! side scaling does it. Shared-state, SCR sequencing, RSS++ and Dyssect
//! strategies build on the same [`Dispatch`] contract.

#![forbid(unsafe_code)]

pub mod dyssect;
pub mod error;
pub mod fragsteer;
pub mod nic_profile;
pub mod rss;
pub mod steer;
pub mod strategy;

pub use error::ScaleError;
pub use nic_profile::NicProfile;
pub use rss::RssDispatcher;

/// A dispatch strategy: which queue a frame goes to, and the flow hash the
/// "NIC" hands to software with it (as `mbuf.hash.rss` in DPDK).
pub trait Dispatch {
    /// Queue and hash for `frame`; `None` if the frame cannot be classified
    /// (not IP, malformed), in which case callers send it to queue 0 with hash 0,
    /// as a NIC's default queue does.
    fn classify(&self, frame: &[u8]) -> Option<(u16, u32)>;

    /// Number of queues.
    fn queues(&self) -> usize;
}
