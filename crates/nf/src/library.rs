//! The NF library: one file per NF in `src/library/`. The build script
//! (`crates/nf/build.rs`) declares a module for every file there and
//! registers its `NF` descriptor and `build` constructor in the
//! [`registry`](crate::registry): adding an NF is adding one file. The
//! modules are re-exported at the crate root (`flowplane_nf::nat::Nat`).

include!(concat!(env!("OUT_DIR"), "/library_mods.rs"));
