#!/usr/bin/env bash
# Before/after of the flow table's code with one harness (crates/bench/examples/table_ab.rs), over many rounds:
#   scripts/table_ab.sh OLD_TREE [ROUNDS]
# builds `table_ab` in OLD_TREE (a worktree of the older commit; the harness is copied in, so both binaries run the
# same measurement) and in this tree, runs them alternated ROUNDS times (default 5), and prints per row the median
# cycles/op of each side and new/old throughput. Medians over processes, because some rows (batch 64 at 4M entries
# on this VM) settle at one of two rates for a whole run (~40 or ~100 cycles/op) on either build.
# Env: SIZE=4194304, TABLE_AB_BATCHES=1,32,64 (passed through), TARGET_OLD=/tmp/table-ab-old-target.
#   git worktree add /tmp/old 57bd9ab && scripts/table_ab.sh /tmp/old 7
set -euo pipefail
cd "$(dirname "$0")/.."
OLD_TREE=${1:?usage: scripts/table_ab.sh OLD_TREE [ROUNDS]}
ROUNDS=${2:-5}
SIZE=${SIZE:-4194304}
TARGET_OLD=${TARGET_OLD:-/tmp/table-ab-old-target}
cp crates/bench/examples/table_ab.rs "$OLD_TREE/crates/bench/examples/table_ab.rs"
(cd "$OLD_TREE" && CARGO_TARGET_DIR="$TARGET_OLD" cargo build -q --release -p flowplane-bench --example table_ab)
cargo build -q --release -p flowplane-bench --example table_ab
old_bin="$TARGET_OLD/release/examples/table_ab"
new_bin=target/release/examples/table_ab
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$ROUNDS"); do
    "$old_bin" "$SIZE" 2>/dev/null >"$tmp/old.$r"
    "$new_bin" "$SIZE" 2>/dev/null >"$tmp/new.$r"
done
# Each line: `op batch cycles/op Mops`; a row's key is (op, batch).
python3 - "$tmp" "$ROUNDS" <<'EOF'
import statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
def rows(side):
    out = {}
    for r in range(1, rounds + 1):
        for line in open(f"{tmp}/{side}.{r}"):
            op, batch, cyc, _ = line.split()
            out.setdefault((op, int(batch)), []).append(float(cyc))
    return out
old, new = rows("old"), rows("new")
print(f"cycles/op: median of {rounds} runs each (min-max); new/old: throughput ratio of the medians")
print(f"{'row':<12}{'batch':>6}{'old':>22}{'new':>22}{'new/old':>9}")
span = lambda v: f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"
for key in old:
    o, n = statistics.median(old[key]), statistics.median(new[key])
    print(f"{key[0]:<12}{key[1]:>6}{span(old[key]):>22}{span(new[key]):>22}{o / n:>9.3f}")
EOF
