#!/usr/bin/env bash
# flowplane's test command: installs what the tests need, then runs every gate
# CI runs — formatting, lints, the test suite, the loom models of the shared
# table and the packet/table unit tests under Miri. From the repository root:
#
#   scripts/test.sh            # everything
#   scripts/test.sh --quick    # fmt, clippy and the test suite only
#
# Needs Rust stable (rustup); installs tshark (and the other Debian packages below) with apt-get (as root, or through
# sudo) and the nightly Miri component with rustup when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
[[ "${1:-}" == "--quick" ]] && quick=1

step() { printf '\n== %s ==\n' "$*"; }
as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

# What the tests need from Debian, each checked first; what is missing is installed with one `apt-get update`
# and one `apt-get install` (seven separate updates cost CI about a minute).
need=()
# tshark checks the pcaps flowplane writes (crates/trace/tests, crates/cli/tests, crates/nf/tests).
command -v tshark >/dev/null 2>&1 || need+=(tshark)
# The port tests (crates/io/tests/afpacket_veth.rs, crates/cli/tests/ports_*.rs) make veth pairs and
# network namespaces with iproute2's `ip` (as root; they fail loudly without it).
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# scapy crafts the traffic of the NF model tests (crates/cli/tests/nf_models.rs, crates/cli/tests/models/)
# and of the regression captures (crates/cli/tests/captures/make_*.py); Debian's python3 has it as a package.
/usr/bin/python3 -c "import scapy" >/dev/null 2>&1 || need+=(python3 python3-scapy)
# The metrics test (crates/cli/tests/ports_live.rs) lints the text format with promtool (Debian ships it
# in the prometheus package, ~96 MB with the server) and parses the OpenMetrics format with the Python
# client's reference parser (promtool reads only the text format).
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
/usr/bin/python3 -c "import prometheus_client" >/dev/null 2>&1 || need+=(python3-prometheus-client)
# The IPFIX tests (crates/cli/tests/cli_ipfix.rs) send flow records to nfdump's collector `nfcapd` and read
# them back with `nfdump` (Debian package nfdump).
{ command -v nfcapd && command -v nfdump; } >/dev/null 2>&1 || need+=(nfdump)
# AF_XDP ports build against libxdp/libbpf found by pkg-config (crates/io/build.rs; without them
# afxdp: ports are not built in and crates/cli/tests/ports_afxdp.rs fails).
pkg-config --exists libxdp libbpf 2>/dev/null || need+=(libxdp-dev libbpf-dev pkg-config)
# Kernel steering for AF_PACKET ports: crates/io/build.rs compiles csrc/steer.bpf.c with clang
# (-target bpf); without clang it is not built in and crates/io/tests/fanout_steer.rs fails.
command -v clang >/dev/null 2>&1 || need+=(clang)
# DPDK ports (the `dpdk` feature, the full run only) on virtual devices.
[[ $quick -eq 1 ]] || pkg-config --exists libdpdk 2>/dev/null || need+=(libdpdk-dev pkg-config)
if [[ ${#need[@]} -gt 0 ]]; then
    step "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq
    as_root apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    # Where systemd runs, the prometheus and nfdump packages start their servers: the tests start their own.
    if command -v systemctl >/dev/null 2>&1; then
        as_root systemctl disable --now prometheus nfdump >/dev/null 2>&1 || true
    fi
fi
tshark --version | head -1
df -h . | tail -1   # disk: a full disk once failed CI mid-build

step "cargo fmt --check"
# The NF library files are named too (belt and braces: nfs! declares them as modules).
cargo fmt --all --check -- crates/nf/src/library/*.rs

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

step "cargo test"
cargo test --workspace --locked --no-fail-fast

[[ $quick -eq 1 ]] && exit 0

# DPDK ports (the `dpdk` feature) on virtual devices without huge pages or PCI
# (net_null, net_pcap, net_af_packet): the same code a real NIC runs.
step "DPDK ports (--features dpdk)"
# One test at a time: DPDK's af_packet PMD derives its PACKET_FANOUT group id
# from the process id, and two of these tests running at once failed once
# with EINVAL setting PACKET_FANOUT (an id collision between the concurrent
# flowplane processes in one namespace).
cargo test --locked -p flowplane --features dpdk --test ports_dpdk -- --test-threads=1

# The fuzz targets (a separate workspace, run with nightly + libFuzzer; see
# fuzz/README.md) must keep compiling, and their shared harness is tested.
step "fuzz targets type-check"
(cd fuzz && cargo check --all-targets --locked && cargo test --lib --locked)

# The shared table's version-counter protocol, model-checked with loom (a
# separate target dir: RUSTFLAGS replaces .cargo/config.toml's flags).
step "loom models of the shared table"
RUSTFLAGS="--cfg loom -C target-cpu=x86-64-v3" \
    cargo test --release --locked -p flowplane-table --test loom_shared --target-dir target/loom

# The unsafe code lives in packet and table: run their unit tests under Miri.
step "Miri: packet and table unit tests"
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal --component miri,rust-src >/dev/null 2>&1 \
        || rustup component add miri rust-src --toolchain nightly >/dev/null 2>&1 || true
fi
if cargo +nightly miri --version >/dev/null 2>&1; then
    cargo +nightly miri test --locked -p flowplane-packet -p flowplane-table --lib
else
    echo "Miri is not installable here (no nightly toolchain): skipped" >&2
fi
echo "all gates passed"
