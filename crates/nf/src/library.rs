//! The NF library: one file per NF in `src/library/`, each exporting its
//! registration `pub const INFO: NfInfo` (name, about, keyed by, parameters)
//! and `pub fn build<S: NfSink>(p: &mut Params, sink: S) -> Result<S::Out,
//! ParamError>`, and named on one line of [`nfs!`] below — the same
//! descriptor-table style as the strategies, executors and ports. The
//! modules are re-exported at the crate root (`flowplane_nf::nat::Nat`).

use crate::registry::{NfInfo, NfSink};
use crate::{ParamError, Params};

/// Declares the library: each NF's module, its registry entry and its
/// constructor, in `flowplane nfs` order.
macro_rules! nfs {
    ($($name:ident),+ $(,)?) => {
        $(pub mod $name;)+
        /// Every NF of the library, one per file of `crates/nf/src/library/`, by file name.
        pub static NFS: &[NfInfo] = &[$($name::INFO),+];
        /// The file (module) name of each entry of [`NFS`].
        #[cfg(test)]
        pub(crate) const FILES: &[&str] = &[$(stringify!($name)),+];
        /// Builds entry `i` of [`NFS`] and hands it to `sink` (`None`: no such entry).
        pub(crate) fn build_nth<S: NfSink>(i: usize, p: &mut Params, sink: S) -> Option<Result<S::Out, ParamError>> {
            let mut at = 0;
            $(
                if i == at {
                    return Some($name::build(p, sink));
                }
                at += 1;
            )+
            let _ = at;
            None
        }
    };
}

// The registry: one file per NF in library/, named here (a test checks every file is).
nfs!(
    acl, amf, burn, conntrack, count, ddos, forward, fsc, fw, hh, keyctr, lb, nat, policer, portknock, psd, ratelimit,
    route, srcctr, synthetic, upf,
);
