#!/usr/bin/env bash
# The README's single-machine rows, an older build against this one, alternated (the machine is shared and noisy,
# so only same-run ratios mean anything):
#   scripts/readme_ab.sh OLD_FLOWPLANE [ROUNDS]
# runs `bench io`, `bench parse`, `bench pipeline --seconds 1` and the demo (`run --cores 1|2 --duration 2
# --warmup 1`) with each binary in turn, ROUNDS times (default 3, ~2 minutes a round), and prints per row the median
# of each side, new/old (> 1: this build is better) and every run's figure. The flow-table rows have their own
# harness: scripts/table_ab.sh. Build the older binary from a worktree, e.g.
#   git worktree add /tmp/old 57bd9ab && (cd /tmp/old && cargo build --release -p flowplane)
#   scripts/readme_ab.sh /tmp/old/target/release/flowplane 3
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:?usage: scripts/readme_ab.sh OLD_FLOWPLANE [ROUNDS]}
ROUNDS=${2:-3}
# NEW=BINARY measures that build instead of building this checkout.
if [ -z "${NEW:-}" ]; then
    cargo build -q --release -p flowplane
    NEW=target/release/flowplane
fi
# OUT=DIR keeps every run's JSON there (to pool rounds of several invocations, or look at one).
if [ -n "${OUT:-}" ]; then
    out=$OUT
    mkdir -p "$out"
else
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
fi
for r in $(seq "$ROUNDS"); do
    for side in old new; do
        b=$OLD
        [ "$side" = new ] && b=$NEW
        "$b" bench io --json >"$out/$side.$r.io.json" 2>/dev/null
        "$b" bench parse --json >"$out/$side.$r.parse.json" 2>/dev/null
        "$b" bench pipeline --seconds 1 --json >"$out/$side.$r.pl.json" 2>/dev/null
        "$b" run --cores 1 --duration 2 --warmup 1 --json >"$out/$side.$r.d1.json" 2>/dev/null
        "$b" run --cores 2 --duration 2 --warmup 1 --json >"$out/$side.$r.d2.json" 2>/dev/null
    done
done
python3 - "$out" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}  # row -> (higher is better, {side: [values]})
def add(name, side, v, higher=True):
    rows.setdefault(name, (higher, {'old': [], 'new': []}))[1][side].append(v)
def load(side, r, kind):
    try:
        return json.load(open(f'{out}/{side}.{r}.{kind}.json'))
    except (OSError, ValueError):
        return None
for r in range(1, rounds + 1):
    for side in ('old', 'new'):
        if j := load(side, r, 'io'):
            for x in j['rows']:
                add(f"io {x['chain']} (Mpps)", side, x['mpps'])
        if j := load(side, r, 'parse'):
            for x in j['rows']:
                if x['set'] == 'L1':
                    add(f"parse+hash {x['kind']} L1 (min cycles)", side, x['parse_hash']['min'], False)
                    add(f"toeplitz {x['kind']} L1 (min cycles)", side, x['toeplitz']['min'], False)
        if j := load(side, r, 'pl'):
            for x in j['rows']:
                add(f"pipeline {x['experiment']} {x['variant']} (Mpps)", side, x['mpps'])
        for c in ('d1', 'd2'):
            if j := load(side, r, c):
                add(f"demo {c[1]} core(s) (Mpps)", side, j['mpps'])
print(f"medians of {rounds} alternated runs; new/old > 1: this build is better; best: the ratio of each side's")
print("best run (on a shared machine a slow run is interference, a fast one is not)")
print(f"{'row':<56}{'old':>9}{'new':>9}{'new/old':>9}{'best':>7}   runs old | new")
worst, bests = [], []
for name, (higher, v) in rows.items():
    if not v['old'] or not v['new']:
        continue
    o, n = statistics.median(v['old']), statistics.median(v['new'])
    ratio = n / o if higher else o / n
    bo, bn = (max(v['old']), max(v['new'])) if higher else (min(v['old']), min(v['new']))
    best = bn / bo if higher else bo / bn
    worst.append((ratio, name))
    bests.append((best, name))
    runs = lambda xs: ' '.join(f'{x:.1f}' for x in xs)
    print(f"{name:<56}{o:>9.2f}{n:>9.2f}{ratio:>9.3f}{best:>7.3f}   {runs(v['old'])} | {runs(v['new'])}")
print('lowest medians: ' + ', '.join(f'{n} {r:.3f}' for r, n in sorted(worst)[:3]))
print('lowest bests: ' + ', '.join(f'{n} {r:.3f}' for r, n in sorted(bests)[:3]))
EOF
