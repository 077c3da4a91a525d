#!/usr/bin/env bash
# A fuzzing campaign over every target of fuzz/Cargo.toml: builds them once (cargo-fuzz with
# AddressSanitizer if installed, else the plain libFuzzer build of Cargo.toml's header), runs
# each for SECONDS (default 60), JOBS at a time (default 1), keeping corpora in fuzz/corpus/<t>
# and crashes in fuzz/artifacts/<t>/, and prints one line per target. Exits 1 if any target
# left a crash, leak, timeout or out-of-memory artifact in this run.
#
#   fuzz/run_all.sh [SECONDS] [TARGET...]        e.g.  JOBS=2 fuzz/run_all.sh 600
#   EXTRA="-max_len=8192" fuzz/run_all.sh 60 executor   (more libFuzzer flags)
set -euo pipefail

cd "$(dirname "$0")"
secs="${1:-60}"
shift $(( $# > 0 ? 1 : 0 ))
jobs="${JOBS:-1}"
triple="$(rustc +nightly -vV | sed -n 's/^host: //p')"
bin="target/$triple/release"
logs="target/campaign"
mkdir -p "$logs" corpus artifacts

if [ $# -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(awk '/^\[\[bin\]\]/ { b = 1 } b && /^name/ { gsub(/"/, "", $3); print $3; b = 0 }' Cargo.toml)
fi

if cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "building ${#targets[@]} targets with cargo-fuzz (AddressSanitizer)"
    cargo +nightly fuzz build >"$logs/build.log" 2>&1 || { cat "$logs/build.log"; exit 2; }
else
    echo "cargo-fuzz not installed (cargo install cargo-fuzz): plain libFuzzer build, no sanitizer"
    RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
        -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
        -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks" \
        cargo +nightly build --release --target "$triple" --bins >"$logs/build.log" 2>&1 || { cat "$logs/build.log"; exit 2; }
fi

run_one() {
    local t="$1"
    mkdir -p "corpus/$t" "artifacts/$t"
    # Seed inputs kept in git (seeds/<t>/) start the corpus.
    if [ -d "seeds/$t" ]; then cp -n "seeds/$t"/* "corpus/$t"/; fi
    touch "$logs/$t.start"
    # -timeout: a unit running 20 s is a hang worth reporting; every target's units take milliseconds.
    # shellcheck disable=SC2086
    "$bin/$t" "corpus/$t" -max_total_time="$secs" -timeout=20 -print_final_stats=1 \
        -artifact_prefix="artifacts/$t/" ${EXTRA:-} >"$logs/$t.log" 2>&1 || true
}

echo "running each target for $secs s, $jobs at a time; logs in fuzz/$logs/"
running=0
for t in "${targets[@]}"; do
    run_one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
    fi
done
wait

status=0
printf '%-16s %12s %9s %8s %8s  %s\n' target execs exec/s corpus rss_mb "new artifacts"
for t in "${targets[@]}"; do
    log="$logs/$t.log"
    stat_of() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
    new=$(find "artifacts/$t" -type f -newer "$logs/$t.start" 2>/dev/null | sort | tr '\n' ' ')
    corpus=$(find "corpus/$t" -type f | wc -l)
    printf '%-16s %12s %9s %8s %8s  %s\n' "$t" "$(stat_of number_of_executed_units)" "$(stat_of average_exec_per_sec)" \
        "$corpus" "$(stat_of peak_rss_mb)" "${new:-none}"
    if [ -n "$new" ] || grep -q '^==[0-9]*==ERROR\|^SUMMARY: ' "$log"; then
        status=1
    fi
done
exit "$status"
