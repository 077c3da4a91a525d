//! Build script: only does anything with the optional `dpdk` feature, where it
//! finds Debian's DPDK through pkg-config (`libdpdk`), compiles the small C
//! shim in `csrc/dpdk_shim.c` and links librte_hash and librte_eal. Without
//! the feature nothing DPDK-related is built, so machines without
//! libdpdk-dev still build the crate.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_DPDK").is_some() {
        dpdk::build();
    }
}

#[cfg(feature = "dpdk")]
mod dpdk {
    pub fn build() {
        println!("cargo:rerun-if-changed=csrc/dpdk_shim.c");
        println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
        // Only the include and search paths are taken from pkg-config: libdpdk
        // lists every DPDK library, and rte_hash's shared library pulls in what
        // it needs itself.
        let lib = match pkg_config::Config::new().atleast_version("21.11").cargo_metadata(false).probe("libdpdk") {
            Ok(lib) => lib,
            Err(e) => {
                eprintln!(
                    "error: the `dpdk` feature needs DPDK >= 21.11 found by pkg-config as `libdpdk` \
                     (Debian: apt-get install libdpdk-dev): {e}"
                );
                std::process::exit(1);
            }
        };
        let mut cc = cc::Build::new();
        cc.file("csrc/dpdk_shim.c").flag_if_supported("-msse4.2").warnings(true);
        for p in &lib.include_paths {
            cc.include(p);
        }
        for (k, v) in &lib.defines {
            cc.define(k, v.as_deref());
        }
        cc.compile("flowplane_dpdk_shim");
        for p in &lib.link_paths {
            println!("cargo:rustc-link-search=native={}", p.display());
        }
        for l in ["rte_hash", "rte_eal"] {
            println!("cargo:rustc-link-lib=dylib={l}");
        }
    }
}

#[cfg(not(feature = "dpdk"))]
mod dpdk {
    pub fn build() {}
}
