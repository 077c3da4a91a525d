//! Build script: AF_XDP support. When pkg-config finds Debian's libxdp and
//! libbpf (`apt-get install libxdp-dev libbpf-dev`), compiles the C shim in
//! `csrc/xsk_shim.c` (libxdp's ring accessors are inline functions), links
//! both libraries and sets `cfg(fp_afxdp)`; otherwise the crate builds
//! without AF_XDP and `afxdp:` ports report that they are not built in.
//! `FLOWPLANE_NO_AFXDP=1` builds without it even where the libraries exist.
//!
//! Kernel steering for AF_PACKET and AF_XDP ports: with libbpf found (as above) and
//! `clang` on the PATH (or in `$CLANG`), compiles `csrc/steer.bpf.c` with
//! `clang -O2 -g -target bpf` into `$OUT_DIR/steer.bpf.o` (embedded by
//! `src/fanout_steer.rs`) and sets `cfg(fp_fanout_steer)`; without clang the
//! feature is absent and runs that would use it take the software dispatcher.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_DPDK").is_some() {
        dpdk();
    }
    afxdp();
}

/// The `dpdk` feature: DPDK >= 21.11 by pkg-config (`libdpdk`), the ethdev shim, and the
/// libraries it calls (the vdev PMDs are loaded by the EAL as plugins).
fn dpdk() {
    println!("cargo:rerun-if-changed=csrc/dpdk_shim.c");
    let lib = match pkg_config::Config::new().atleast_version("21.11").cargo_metadata(false).probe("libdpdk") {
        Ok(lib) => lib,
        Err(e) => {
            eprintln!("error: the `dpdk` feature needs libdpdk-dev (pkg-config libdpdk): {e}");
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
    cc.compile("flowplane_dpdk_port_shim");
    for p in &lib.link_paths {
        println!("cargo:rustc-link-search=native={}", p.display());
    }
    for l in ["rte_ethdev", "rte_mbuf", "rte_mempool", "rte_eal", "rte_kvargs"] {
        println!("cargo:rustc-link-lib=dylib={l}");
    }
}

fn afxdp() {
    println!("cargo:rerun-if-changed=csrc/xsk_shim.c");
    println!("cargo:rerun-if-env-changed=FLOWPLANE_NO_AFXDP");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo::rustc-check-cfg=cfg(fp_afxdp)");
    println!("cargo::rustc-check-cfg=cfg(fp_fanout_steer)");
    if std::env::var_os("FLOWPLANE_NO_AFXDP").is_some_and(|v| v == "1") {
        return;
    }
    let probe = |name: &str| pkg_config::Config::new().cargo_metadata(false).probe(name);
    let (xdp, bpf) = match (probe("libxdp"), probe("libbpf")) {
        (Ok(x), Ok(b)) => (x, b),
        (x, b) => {
            let why = x.err().map(|e| e.to_string()).or(b.err().map(|e| e.to_string())).unwrap_or_default();
            println!(
                "cargo:warning=AF_XDP not built: libxdp/libbpf not found by pkg-config \
                 (apt-get install libxdp-dev libbpf-dev): {}",
                why.lines().next().unwrap_or("")
            );
            return;
        }
    };
    let mut cc = cc::Build::new();
    cc.file("csrc/xsk_shim.c").warnings(true);
    for p in xdp.include_paths.iter().chain(&bpf.include_paths) {
        cc.include(p);
    }
    cc.compile("flowplane_xsk_shim");
    for p in xdp.link_paths.iter().chain(&bpf.link_paths) {
        println!("cargo:rustc-link-search=native={}", p.display());
    }
    println!("cargo:rustc-link-lib=dylib=xdp");
    println!("cargo:rustc-link-lib=dylib=bpf");
    println!("cargo:rustc-cfg=fp_afxdp");
    fanout_steer(&bpf.include_paths);
}

/// The PACKET_FANOUT_EBPF steering program (needs libbpf to load it, clang to build it).
fn fanout_steer(bpf_includes: &[std::path::PathBuf]) {
    println!("cargo:rerun-if-changed=csrc/steer.bpf.c");
    println!("cargo:rerun-if-changed=csrc/steer_classify.h");
    println!("cargo:rerun-if-env-changed=CLANG");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("steer.bpf.o");
    // `-target bpf` does not search the host's multiarch directory, where <asm/types.h> lives.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let mut cmd = std::process::Command::new(&clang);
    cmd.args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"]);
    cmd.arg(format!("-I/usr/include/{arch}-linux-gnu"));
    for p in bpf_includes {
        cmd.arg(format!("-I{}", p.display()));
    }
    cmd.arg("-c").arg("csrc/steer.bpf.c").arg("-o").arg(&out);
    match cmd.output() {
        Ok(o) if o.status.success() => println!("cargo:rustc-cfg=fp_fanout_steer"),
        Ok(o) => println!(
            "cargo:warning=AF_PACKET kernel steering not built: {clang} failed on csrc/steer.bpf.c: {}",
            String::from_utf8_lossy(&o.stderr).lines().next().unwrap_or("")
        ),
        Err(e) => println!(
            "cargo:warning=AF_PACKET kernel steering not built (runs take the dispatcher): \
             {clang} not found (apt-get install clang): {e}"
        ),
    }
}
